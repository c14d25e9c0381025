"""The scheduler service's loop contract: input that another writer appends while a cycle runs
(after its cut, before its decisions) is seen by a next cycle — it is never lost."""

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
