"""The run summary's observer dispatches on the payload's type (`type(data) is C`, one lookup per
record) instead of a chain of isinstance calls, and skips the queue bookkeeping when no
allocation or capacity changed (the reducer counts allocation changes and names the queue of
the last: one change, one queue looked at). It must give exactly the summary the isinstance
chain gave: the reference below is that observer as it was, and both run over every golden log
(pending pods, unschedulable verdicts, evictions, node and queue changes) and a log with nodes
removed and queues added mid-run, in verification mode (each skip checked against every
queue). The per-cycle fragmentation sample is checked against the contract written out."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from kai_es.app import open_log
from kai_es.cli_common import records as log_records
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.fragmentation import _need, analyse, pending_pods
from kai_es.report import (_ALLOCATION_TYPES, JobOutcome, QueueSummary, Summary, _accrue, _fair_error, _leaves,
                           _roll_up, _sample_fair, summarize)
from kai_es.state import ClusterState
from kai_es.state.reducer import apply, pod_key

GOLDEN = Path(__file__).parent / "golden"
LOGS = sorted(str(path.relative_to(GOLDEN)) for path in [*GOLDEN.glob("*.events.jsonl"),
                                                          *GOLDEN.glob("history/*.events.jsonl")])


def reference_summary(records: list[Record], end_ns: int | None = None) -> Summary:
    """The observer before the type dispatch (isinstance checks in this order), over a fold."""
    state = ClusterState()
    s = Summary()
    first_seen: dict[str, int] = {}
    scheduled: set[str] = set()
    alloc: dict[str, int] = {}
    capacity = 0
    last_t: int | None = None
    fair: dict[str, tuple[int, int]] = {}
    leaves: set[str] = set()
    stranded = 0
    last_reasons: dict[str, tuple[str, ...]] = {}
    unaccrued = 0
    queue_names: list[str] = []
    for record in records:
        apply(state, record)
        env = record.envelope
        t = env.logicaltime
        if last_t is None:
            s.start_ns = last_t = t
        if t > last_t:
            unaccrued += t - last_t
            last_t = t
        data = env.data
        if isinstance(data, p.CycleStarted):
            if unaccrued:
                _accrue(s, unaccrued, capacity, alloc, _fair_error(alloc, fair, leaves), stranded)
                unaccrued = 0
            s.cycles += 1
            leaves = _leaves(state)
            _sample_fair(s, state, t, fair)
            now_stranded = analyse(state, shapes=False).stranded_milli
            if now_stranded != stranded or not s.stranded:
                s.stranded.append((t, now_stranded))
                stranded = now_stranded
        elif isinstance(data, p.PodUnschedulable):
            last_reasons[data.uid] = tuple(sorted({r.code for r in data.reasons}))
        elif isinstance(data, p.PodEvicted):
            s.evictions += 1
            pod = state.pods.get(pod_key(data.namespace, data.name))
            if pod is not None and pod.job_key in state.jobs:
                queue = state.jobs[pod.job_key].queue
                s.queues.setdefault(queue, QueueSummary(queue)).evictions += 1
                if pod.job_key in s.jobs:
                    s.jobs[pod.job_key].evictions += 1
        if isinstance(data, p.PodObserved):
            uid = data.uid
            if uid not in first_seen and data.scheduler_name == state.scheduler_name:
                first_seen[uid] = t
                s.pods_seen += 1
                pod = state.pods.get(pod_key(data.namespace, data.name))
                if pod is not None and pod.job_key in state.jobs:
                    job = s.jobs.get(pod.job_key)
                    if job is None:
                        job = s.jobs[pod.job_key] = JobOutcome(queue=state.jobs[pod.job_key].queue, arrived_ns=t)
                    job.pods += 1
                    if data.node_name and job.started_ns is None:
                        job.started_ns = t
        if isinstance(data, p.PodBound) and data.uid not in scheduled and data.uid in first_seen:
            scheduled.add(data.uid)
            pod = state.pods.get(pod_key(data.namespace, data.name))
            queue = state.jobs[pod.job_key].queue if pod is not None and pod.job_key in state.jobs else ""
            qs = s.queues.setdefault(queue, QueueSummary(queue))
            qs.scheduled += 1
            qs.waits_ns.append(t - first_seen[data.uid])
            s.pods_scheduled += 1
            if pod is not None and pod.job_key in s.jobs and s.jobs[pod.job_key].started_ns is None:
                s.jobs[pod.job_key].started_ns = t
        if isinstance(data, _ALLOCATION_TYPES):
            new_capacity = (sum(state.nodes[n].spec.gpus for n in state.node_names) * 1000
                            if isinstance(data, (p.NodeObserved, p.NodeRemoved)) else capacity)
            if len(queue_names) != len(state.queues) or isinstance(data, (p.QueueObserved, p.QueueRemoved)):
                queue_names = sorted(state.queues)
            changed = [(name, milli) for name in queue_names
                       if alloc.get(name, 0) != (milli := state.queues[name].allocated_milli_gpu)
                       or name not in s.queues]
            if unaccrued and (new_capacity != capacity or any(alloc.get(name, 0) != milli for name, milli in changed)):
                _accrue(s, unaccrued, capacity, alloc, _fair_error(alloc, fair, leaves), stranded)
                unaccrued = 0
            if new_capacity != capacity:
                capacity = new_capacity
                if s.capacity and s.capacity[-1][0] == t:
                    s.capacity.pop()
                s.capacity.append((t, capacity))
            for name, milli in changed:
                s.queues.setdefault(name, QueueSummary(name))
                if alloc.get(name) != milli:
                    s.timeline.append((t, name, milli))
                alloc[name] = milli
    if last_t is not None and end_ns is not None and end_ns > last_t:
        unaccrued += end_ns - last_t
        last_t = end_ns
    if unaccrued:
        _accrue(s, unaccrued, capacity, alloc, _fair_error(alloc, fair, leaves), stranded)
    s.end_ns = last_t or 0
    for key in sorted(state.pods):
        pod = state.pods[key]
        if pod.status == "Pending" and pod.spec.scheduler_name == state.scheduler_name:
            s.pending_at_end += 1
            queue = state.jobs[pod.job_key].queue if pod.job_key in state.jobs else ""
            qs = s.queues.setdefault(queue, QueueSummary(queue))
            qs.pending_at_end += 1
            seen = first_seen.get(pod.spec.uid)
            if seen is not None and pod.spec.uid not in scheduled:
                qs.waits_ns.append(s.end_ns - seen)
                qs.censored += 1
            for code in last_reasons.get(pod.spec.uid, ("(no verdict yet)",)):
                s.pending_reasons[code] = s.pending_reasons.get(code, 0) + 1
    s.fragmentation = analyse(state)
    _roll_up(s, state)
    return s


def golden(name: str) -> list[Record]:
    return list(log_records(open_log(str(GOLDEN / name), readonly=True)))


def test_the_golden_logs_have_what_the_observer_handles() -> None:
    kinds = {type(r.envelope.data) for name in LOGS for r in golden(name)}
    assert {p.CycleStarted, p.PodUnschedulable, p.PodEvicted, p.PodObserved, p.PodBound, p.NodeObserved,
            p.QueueObserved, p.BindingDecided, p.PodRemoved, p.EvictionDecided} <= kinds


@pytest.mark.parametrize("name", LOGS)
def test_the_summary_is_the_isinstance_observers(name: str) -> None:
    records = golden(name)
    end = records[-1].envelope.logicaltime + 3_600_000_000_000
    for end_ns in (None, end):
        assert summarize(records, end_ns=end_ns, verify=True) == reference_summary(records, end_ns)


def altered(records: list[Record]) -> Iterator[Record]:
    """`records` with, after the first cycle, every node but the first removed and a queue
    added (capacity and queue changes in the middle of a run), then the same nodes back."""
    nodes = [r.envelope for r in records if isinstance(r.envelope.data, p.NodeObserved)]
    queue = next(r.envelope for r in records if isinstance(r.envelope.data, p.QueueObserved))
    position, done = 0, False
    for record in records:
        yield Record(position, record.envelope)
        position += 1
        if not done and isinstance(record.envelope.data, p.CycleCompleted):
            done = True
            t = record.envelope.logicaltime
            extra = [msgspec.structs.replace(env, data=p.NodeRemoved(name=env.data.name), logicaltime=t)
                     for env in nodes[1:] if isinstance(env.data, p.NodeObserved)]
            extra.append(msgspec.structs.replace(queue, data=msgspec.structs.replace(queue.data, name="extra-q"),
                                                 logicaltime=t))
            extra += [msgspec.structs.replace(env, logicaltime=t + 1) for env in nodes[1:]]
            for env in extra:
                yield Record(position, env)
                position += 1


@pytest.mark.parametrize("name", ["quickstart.events.jsonl", "consolidation.events.jsonl"])
def test_the_summary_is_the_isinstance_observers_when_nodes_and_queues_change(name: str) -> None:
    records = list(altered(golden(name)))
    assert any(isinstance(r.envelope.data, p.NodeRemoved) for r in records)
    assert summarize(records, verify=True) == reference_summary(records)


def _cuts(records: list[Record]) -> Iterator[ClusterState]:
    """The state folded up to each CycleStarted of `records` (the observer's sample points)."""
    state = ClusterState()
    for record in records:
        apply(state, record)
        if isinstance(record.envelope.data, p.CycleStarted):
            yield state


def _stranded_and_fitting(state: ClusterState) -> tuple[int, int]:
    """(stranded milli-GPU, pending GPU pods whose job's at-once need fits the free GPUs), from
    `kai_es.fragmentation`'s contract written out with counters."""
    nodes = [state.nodes[n] for n in state.node_names]
    hint = max((n.spec.gpu_memory_mib for n in nodes), default=0)
    free = {n.spec.name: [1000 - u for u in n.device_used[:n.spec.gpus]] + [1000] * (n.spec.gpus - len(n.device_used))
            for n in nodes}
    open_nodes = [n.spec.name for n in nodes if not n.spec.unschedulable]

    def fits_on(need: tuple[int, int], devices: list[int]) -> bool:
        return devices.count(1000) >= need[0] if need[0] else any(f >= need[1] for f in devices)

    def slots(need: tuple[int, int]) -> int:
        if need[0]:
            return sum(free[n].count(1000) // need[0] for n in open_nodes)
        return sum(f // need[1] for n in open_nodes for f in free[n])

    by_job: dict[str, list[tuple[int, int]]] = {}
    for pod in pending_pods(state):
        need = _need(pod, None, hint)
        if need != (0, 0):
            by_job.setdefault(pod.job_key, []).append(need)
    if not by_job:
        return 0, 0
    placeable: set[tuple[int, int]] = set()
    fitting = 0
    for key, needs in by_job.items():
        job = state.jobs[key]
        at_once = Counter(needs[:max(1, min(len(needs), job.min_member - job.occupying))])
        if all(slots(need) >= count for need, count in at_once.items()):
            placeable |= set(at_once)
            fitting += len(needs)
    cordoned = sum(sum(free[n.spec.name]) for n in nodes if n.spec.unschedulable)
    unusable = sum(sum(free[n]) for n in open_nodes if not any(fits_on(need, free[n]) for need in placeable))
    return cordoned + unusable, fitting


def test_the_per_cycle_sample_is_the_full_analysis_without_its_shapes() -> None:
    """`analyse(shapes=False)`, which the observer runs at every cycle, counts single pods and
    gangs as the contract says (stranded GPUs, fitting pods) and as the full analysis does:
    every field but the shapes is equal at every cut of every golden log, including cuts where a
    shape has exactly one slot and gangs whose at-once need does not fit."""
    one_slot = gang_blocked = 0
    for name in LOGS:
        for state in _cuts(golden(name)):
            full = analyse(state)
            sample = analyse(state, shapes=False)
            assert sample == dataclasses.replace(full, shapes=[]), name
            assert (sample.stranded_milli, sample.fitting_gpu_pods) == _stranded_and_fitting(state), name
            one_slot += any(s.slots == 1 for s in full.shapes)
            gang_blocked += any(s.min_gang > 1 and s.fitting < s.pods for s in full.shapes)
    assert one_slot and gang_blocked  # (the cases the sample's shortcut and its general path decide)


def test_verification_catches_an_allocation_change_the_reducer_did_not_count() -> None:
    """In verification mode the observer checks every skip against all queues: a queue's
    allocation changed behind the reducer's back (as a reducer that forgot to count it would
    leave it) is a VerificationError, not a silently wrong summary."""
    from kai_es.report import SummaryObserver
    from kai_es.scheduling.plan import VerificationError

    records = golden("quickstart.events.jsonl")
    state = ClusterState()
    observer = SummaryObserver(state, verify=True)
    for record in records:
        apply(state, record)
        observer.observe(record)
    queue = sorted(state.queues)[0]
    state.queues[queue].allocated_milli_gpu += 1000  # not counted in `allocation_changes`
    last = records[-1]
    with pytest.raises(VerificationError, match="did not count"):
        observer.observe(Record(last.position + 1, msgspec.structs.replace(last.envelope, data=p.PodBound(
            namespace="x", name="y", uid="z", node="n", decision_id="d"))))
