"""The scheduler service's loop contract: input that another writer appends while a cycle runs
(after its cut, before its decisions) is seen by a next cycle — it is never lost; and a
back-off that ends with nothing new logged is work."""

from __future__ import annotations

from collections.abc import Sequence

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.victims import EVICTION_REFUSED_BACKOFF_NS
from kai_es.services.scheduler import SchedulerService

from kai_es.ingest.translate import subject_of
from kai_es.scenario import load_scenario_text
from tests.builders import MakeNode, MakePod, queue, scenario_text


class _ConcurrentWriterLog(MemoryEventLog):
    """Appends `late` right after the scheduler's CycleStarted, as an informer writing at the
    same time would: those events sit between the cycle's cut and its decisions."""

    def __init__(self, late: list[Envelope]) -> None:
        super().__init__()
        self.late = late

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        positions = await super().append(events)
        if self.late and any(isinstance(e.data, p.CycleStarted) for e in events):
            late, self.late = self.late, []
            await super().append(late)
        return positions


def _env(payload: p.Payload, subject: str, i: int) -> Envelope:
    return make_envelope(payload, event_id=f"e-{i}", source="test", subject=subject, logicaltime=10)  # type: ignore[arg-type]


async def test_input_appended_during_a_cycle_makes_the_next_cycle_run() -> None:
    sc = load_scenario_text(scenario_text(MakeNode("n").obj(), queue("team-a"), MakePod("early").gpu(1).obj(),
                                          MakePod("late").gpu(1).obj()))
    envs = [_env(o.payload, subject_of(o.payload), i) for i, o in enumerate(sc.objects)]
    late = [e for e in envs if e.subject == "pod/default/late"]
    log = _ConcurrentWriterLog(late)
    await log.append([e for e in envs if e not in late])
    sched = SchedulerService(log, SchedulerConfig(), load_packer("reference"), SimClock(10), SeededIds("t"))
    await sched.start()
    first = await sched.run_cycle_once()
    assert "default/late" in sched.state.pods  # folded after the cycle...
    assert not any(getattr(e.data, "name", "") == "late" for e in first)  # ...not decided in it
    assert sched.has_work()  # so a next cycle is due
    second = await sched.run_cycle_once()
    assert any(isinstance(e.data, p.BindingDecided) and e.data.name == "late" for e in second)
    assert not sched.has_work()


async def test_a_preemptor_is_tried_again_when_its_victims_eviction_back_off_ends() -> None:
    """A victim whose eviction failed is no victim for EVICTION_REFUSED_BACKOFF_NS (kai-es/v3
    on). When that ends with nothing new logged, the scheduler has work again: the preemptor it
    could not place is tried, and the victim evicted. (Found on the real stack: evictions
    refused with 403 while a restarted apiserver's RBAC cache filled left an urgent pod pending
    for good on an idle cluster.)"""
    sc = load_scenario_text(scenario_text(
        MakeNode("n").gpus(1).obj(), queue("team-a", gpu_quota=1),
        MakePod("victim").gpu(1).running_on("n").obj(), MakePod("urgent").gpu(1).priority_class("build").obj()))
    log = MemoryEventLog()
    await log.append([_env(o.payload, subject_of(o.payload), i) for i, o in enumerate(sc.objects)])
    clock = SimClock(10)
    sched = SchedulerService(log, SchedulerConfig(), load_packer("reference"), clock, SeededIds("t"))
    await sched.start()
    [evict] = [e for e in await sched.run_cycle_once() if isinstance(e.data, p.EvictionDecided)]
    assert evict.data.name == "victim" and evict.data.action == "preempt"
    refused_at = 20
    await log.append([make_envelope(p.PodEvictionFailed(
        namespace="default", name="victim", uid=evict.data.uid, node="n", decision_id=evict.id,
        message="HTTP 403: forbidden"), event_id="refused", source="test", subject="pod/default/victim",
        logicaltime=refused_at)])
    clock.advance_to(30)
    await sched.catch_up()
    assert sched.has_work()  # the outcome
    second = await sched.run_cycle_once()
    assert not any(isinstance(e.data, p.EvictionDecided) for e in second)  # the victim is backed off
    assert any(isinstance(e.data, p.PodUnschedulable) and e.data.name == "urgent" for e in second)
    assert not sched.has_work()
    ends = refused_at + EVICTION_REFUSED_BACKOFF_NS
    assert sched.next_backoff_ns() == ends
    clock.advance_to(ends - 1)
    assert not sched.has_work()
    clock.advance_to(ends)
    assert sched.has_work()
    third = await sched.run_cycle_once()
    assert [e.data.name for e in third if isinstance(e.data, p.EvictionDecided)] == ["victim"]
