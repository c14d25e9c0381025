"""The informer's per-kind relist: a `Relist(kind, objects)` from the source becomes
ResyncStarted(kind), every object, ResyncCompleted(kind) in one append, so objects of that kind
that vanished leave the folded state, and other kinds are untouched."""

from __future__ import annotations


from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.ports import ObjectChange, Relist
from kai_es.services.informer import InformerService
from kai_es.state import fold
from tests.builders import MakeNode, MakePod, ScriptedSource, queue




def _pod(name: str) -> dict[str, object]:
    obj = MakePod(name).gpu(1).obj()
    obj["metadata"]["uid"] = f"uid-{name}"  # type: ignore[index]
    return obj


async def _run(source: ScriptedSource) -> MemoryEventLog:
    log = MemoryEventLog()
    informer = InformerService(log, source, SimClock(1_000), SeededIds("t"))
    await informer.resync()
    await informer.follow()
    return log


async def test_relist_of_one_kind_drops_vanished_objects_of_that_kind_only() -> None:
    node = MakeNode("n1").gpus(8).obj()
    initial = [ObjectChange("Queue", "ADDED", queue("team-a")),
               ObjectChange("Node", "ADDED", node),
               ObjectChange("Pod", "ADDED", _pod("a")), ObjectChange("Pod", "ADDED", _pod("b"))]
    # b was deleted while the watch was down: the Pod relist no longer has it.
    relist = Relist("Pod", (_pod("a"), _pod("c")))
    log = await _run(ScriptedSource(initial, [[relist]]))
    records = [r async for r in log.read()]
    state = fold(records)
    assert sorted(state.pods) == ["default/a", "default/c"]
    assert sorted(state.nodes) == ["n1"] and sorted(state.queues) == ["team-a"]

    tail = [r.envelope.data for r in records[-4:]]
    assert isinstance(tail[0], p.ResyncStarted) and tail[0].kind == "Pod"
    assert [type(d).__name__ for d in tail[1:3]] == ["PodObserved", "PodObserved"]
    assert isinstance(tail[3], p.ResyncCompleted) and tail[3].kind == "Pod"
    # no other kind was bracketed after the initial resync
    kinds_after = [d.kind for d in tail if isinstance(d, (p.ResyncStarted, p.ResyncCompleted))]
    assert kinds_after == ["Pod", "Pod"]


async def test_relist_emits_unchanged_objects_too() -> None:
    """An unchanged object is normally dropped (same payload as last emitted); inside a relist
    it must be emitted, or the reducer would take it for gone."""
    initial = [ObjectChange("Queue", "ADDED", queue("team-a")), ObjectChange("Pod", "ADDED", _pod("a"))]
    batches: list[list[ObjectChange | Relist]] = [
        [ObjectChange("Pod", "MODIFIED", _pod("a"))],  # unchanged: dropped
        [Relist("Pod", (_pod("a"),))],  # unchanged but relisted: kept
    ]
    log = await _run(ScriptedSource(initial, batches))
    records = [r async for r in log.read()]
    observed_a = [r for r in records if isinstance(r.envelope.data, p.PodObserved)]
    assert len(observed_a) == 2
    assert sorted(fold(records).pods) == ["default/a"]
