"""Running a (changed) recorded workload through the production scheduler and binder.

Contract: deterministic — the same workload, seed and packer give a byte-identical log. The run
starts at the recorded start and lasts until the recorded end (or `until_ns` after the start),
with a cycle every `workload.cycle_period_ns` when there is work, exactly as `kai-es simulate`
runs a scenario (`kai_es.app.simulation.drive`).
"""

from __future__ import annotations

from collections.abc import Callable

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.ports import EventLog
from kai_es.scheduling.packing import Packer
from kai_es.app.simulation import Progress, SimResult, drive
from kai_es.state import ClusterState
from kai_es.whatif.cluster import PayloadInformer, RecordedCluster
from kai_es.whatif.workload import Input, Workload


async def run_workload(workload: Workload, events: EventLog, packer: Packer, *, seed: str,
                       until_ns: int | None = None, progress: Progress | None = None,
                       state: ClusterState | None = None, on_fold: Callable[[Record], None] | None = None
                       ) -> SimResult:
    """Play `workload` into `events` (empty) and return the run's counts. The scheduler folds
    into `state` and calls `on_fold` after every record (see `kai_es.app.simulation.drive`)."""
    clock = SimClock(workload.start_ns)
    initial_nodes = {i.payload.name for i in workload.initial
                     if isinstance(i, Input) and isinstance(i.payload, p.NodeObserved)}
    cluster = RecordedCluster(workload, initial_nodes)
    ids = SeededIds(f"whatif/{seed}")
    initial = [i.payload if isinstance(i, Input) else i.spec for i in workload.initial]
    informer = PayloadInformer(events, cluster, clock, ids, initial)
    limit = until_ns if until_ns is not None else workload.end_ns - workload.start_ns
    return await drive(events, cluster, cluster, informer, workload.config, packer, clock, ids,
                       period_ns=workload.cycle_period_ns, until_ns=limit, progress=progress,
                       state=state, on_fold=on_fold)
