"""The workload recorded in a log, as the input of a counterfactual run.

Contract (pure over records):
- Every input event (what the informer observed: nodes, queues, pod groups, priority classes,
  resync markers, default-scheduler pods, ...) is kept as recorded, with its time and position,
  except the observations of kai-scheduler pods, which are the scheduler's outcome.
- A kai-scheduler pod first observed Pending is an *arrival* at that time with the spec it was
  first observed with. Its run time is observed end minus observed start: the time of its
  `kai.binder.pod.bound` to the time it was next observed Succeeded or Failed (the phase is
  kept). A pod the simulated cluster recreated after an eviction (uid derived from the evicted
  pod's) is not an arrival: it is the same work, so the first incarnation that finished gives
  the run time of the whole chain. A pod that never finished in the recorded run has no run
  time (None): once started it runs to the end. A kai-scheduler pod deleted while not evicted
  is deleted at the recorded time. The PodGroup the simulated cluster made for a recreated pod
  of its own (`pg-<name>-<uid>` with the recreation's uid) is not an input either: the
  counterfactual cluster makes it when it recreates the pod.
- A kai-scheduler pod first observed already Running on a node (placed before the log began)
  arrives placed (`placed=True`): its run time counts from that first observation.
  One first observed in any other phase is an input like any other, kept as recorded.
- `initial` is the stretch of input events at the log's first time before its first cycle (the
  informer's first relist); everything later is in `inputs`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.scheduling.config import SchedulerConfig, parse_config
from kai_es.sim.cluster import recreated_uid

DEFAULT_CYCLE_PERIOD_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Input:
    """An input event replayed as recorded (`order`: its recorded position, for ties)."""

    at_ns: int
    order: int
    payload: p.Payload
    subject: str


@dataclass(frozen=True, slots=True)
class PodRun:
    """A kai-scheduler pod of the workload (see the module contract)."""

    at_ns: int
    order: int
    spec: p.PodObserved
    run_for_ns: int | None = None
    end_phase: str = "Succeeded"
    deleted_at: tuple[int, int] | None = None  # (time, recorded position)
    initial: bool = False
    placed: bool = False


@dataclass(slots=True)
class Workload:
    start_ns: int = 0
    end_ns: int = 0
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    cycle_period_ns: int = DEFAULT_CYCLE_PERIOD_NS
    #: the first relist, in recorded order; kai-scheduler arrivals in it are PodRuns (initial=True)
    initial: list[Input | PodRun] = field(default_factory=list)
    inputs: list[Input] = field(default_factory=list)
    pods: list[PodRun] = field(default_factory=list)
    #: the recorded log's length (records), for the report
    records: int = 0


def _is_input(env_type: str) -> bool:
    return not (env_type.startswith("kai.scheduler.") or env_type.startswith("kai.binder."))


def extract(records: Iterable[Record]) -> Workload:
    """The workload of a recorded log (module contract)."""
    into: list[Workload] = []
    for _ in extract_passing(records, into):
        pass
    return into[0]


def extract_passing(records: Iterable[Record], into: list[Workload]) -> Iterator[Record]:
    """Yield every record of `records` and extract the workload from them on the way (so one
    pass over a log can also feed a summary); once exhausted, the workload is appended to `into`."""
    w = Workload()
    config: SchedulerConfig | None = None
    origin: dict[str, str] = {}  # uid of a kai pod (any incarnation) -> uid of its arrival
    arrivals: dict[str, PodRun] = {}  # arrival uid -> its PodRun (updated as facts come in)
    order: list[str] = []
    recreations: dict[str, str] = {}  # uid a recreation would have -> the pod it recreates
    bound_at: dict[str, int] = {}
    evicted: set[str] = set()
    static: set[str] = set()
    last_cycle_t: int | None = None
    min_gap: int | None = None
    in_initial = True
    first = True
    for record in records:
        yield record
        env = record.envelope
        t = env.logicaltime
        data = env.data
        w.records += 1
        if first:
            w.start_ns = t
            first = False
        w.end_ns = max(w.end_ns, t)
        if isinstance(data, p.ConfigApplied):
            if config is None:
                config = parse_config(data.config)
            continue
        if isinstance(data, p.CycleStarted):
            in_initial = False
            if last_cycle_t is not None and t > last_cycle_t:
                gap = t - last_cycle_t
                min_gap = gap if min_gap is None else min(min_gap, gap)
            last_cycle_t = t
            continue
        if isinstance(data, p.PodBound):
            bound_at.setdefault(data.uid, t)
            continue
        if isinstance(data, p.PodEvicted):
            evicted.add(data.uid)
            continue
        if not _is_input(env.type):
            continue
        if in_initial and t != w.start_ns:
            in_initial = False
        ours = config.scheduler_name if config is not None else SCHEDULER_NAME
        if isinstance(data, p.PodObserved) and data.scheduler_name == ours and data.uid not in static:
            root = origin.get(data.uid)
            if root is None:
                parent = recreations.pop(data.uid, None)
                if parent is not None:
                    origin[data.uid] = origin[parent]
                    recreations[recreated_uid(data.uid)] = data.uid
                    continue
                placed = data.phase == "Running" and bool(data.node_name)
                if data.phase != "Pending" and not placed:
                    static.add(data.uid)
                else:
                    origin[data.uid] = data.uid
                    recreations[recreated_uid(data.uid)] = data.uid
                    if placed:
                        bound_at[data.uid] = t
                    run = PodRun(at_ns=t, order=record.position, spec=data, initial=in_initial, placed=placed)
                    arrivals[data.uid] = run
                    order.append(data.uid)
                    if in_initial:
                        w.initial.append(run)
                    continue
            else:
                if data.phase in ("Succeeded", "Failed") and data.uid in bound_at:
                    run = arrivals[root]
                    if run.run_for_ns is None:
                        arrivals[root] = replace(run, run_for_ns=t - bound_at[data.uid], end_phase=data.phase)
                continue
        if isinstance(data, p.PodRemoved) and data.uid in origin:
            if data.uid not in evicted:
                root = origin[data.uid]
                run = arrivals[root]
                if run.deleted_at is None:
                    arrivals[root] = replace(run, deleted_at=(t, record.position))
            continue
        if isinstance(data, p.PodGroupObserved) and data.name[-36:] in recreations:
            continue  # a recreated pod's own group: the counterfactual cluster makes it with the pod
        item = Input(at_ns=t, order=record.position, payload=data, subject=env.subject)
        (w.initial if in_initial else w.inputs).append(item)
    w.config = config or SchedulerConfig()
    w.cycle_period_ns = min_gap or DEFAULT_CYCLE_PERIOD_NS
    runs = [arrivals[uid] for uid in order]
    by_uid = {r.spec.uid: r for r in runs}
    w.initial = [by_uid[i.spec.uid] if isinstance(i, PodRun) else i for i in w.initial]
    w.pods = runs
    into.append(w)


