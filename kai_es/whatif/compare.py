"""The recorded run and the counterfactual side by side (pure over two summaries).

Contract:
- Every number is an integer (ns, milli-GPU, permille); a wait that does not exist is None.
- A job's wait is from its first pod's arrival to its first pod's bind; a job that never started
  waited until the end of the run (`censored: true`, a lower bound). Jobs are compared by key
  (namespace/pod group), so a pod recreated after an eviction is the same job.
- "Changed most" orders jobs by |counterfactual wait - recorded wait|, largest first, then key.
- The decision digest is the sha256 of every scheduler and binder event in log order, as canonical
  JSON of its type, subject, logical time, cut (`basedon`), policy version and payload, without
  event ids, decision ids and state digests (those derive from event ids, which a re-run draws
  afresh): two runs with equal digests made the same decisions at the same cuts and times.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.codec import canonical
from kai_es.events.registry import TYPE_OF
from kai_es.report import JobOutcome, Summary

_DECISION_PREFIXES = ("kai.scheduler.", "kai.binder.")
#: binder outcomes name the decision they perform by its event id
_WITH_DECISION_ID = (p.PodBound, p.PodBindFailed, p.PodEvicted, p.PodEvictionFailed)
#: payload class -> its event type, for the scheduler's and binder's events but the config
#: (payload classes have no subclasses: one lookup by `type(data)` per record)
_DIGESTED: dict[type[p.Payload], str] = {
    cls: name for cls, name in TYPE_OF.items()
    if name.startswith(_DECISION_PREFIXES) and cls is not p.ConfigApplied}


class DecisionDigest:
    """Accumulates `decision_digest` over records passed through `tee`, and counts them."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.decisions = 0
        self.records = 0

    def add(self, record: Record) -> None:
        self.records += 1
        env = record.envelope
        data = env.data
        kind = _DIGESTED.get(type(data))
        if kind is not None:
            if isinstance(data, _WITH_DECISION_ID):
                data = msgspec.structs.replace(data, decision_id="")
            self._h.update(canonical([kind, env.subject, env.logicaltime, env.basedon, env.policyversion]))
            self._h.update(canonical(data))
            self._h.update(b"\n")
            self.decisions += 1

    def tee(self, records: Iterable[Record]) -> Iterator[Record]:
        for record in records:
            self.add(record)
            yield record

    def facts(self) -> RunFacts:
        return RunFacts(digest="sha256:" + self._h.hexdigest(), decisions=self.decisions, records=self.records)


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What `DecisionDigest` found in one run's log."""

    digest: str
    decisions: int
    records: int


def _job_wait(job: JobOutcome, end_ns: int) -> tuple[int, bool]:
    if job.started_ns is not None:
        return job.started_ns - job.arrived_ns, False
    return end_ns - job.arrived_ns, True


def _queue(s: Summary, name: str) -> dict[str, Any]:
    q = s.queues.get(name)
    if q is None:
        return {"scheduled": 0, "waitP50Ns": None, "waitP95Ns": None, "waitMaxNs": None,
                "waitsCensored": 0, "pendingAtEnd": 0, "gpuMilliNs": 0, "evictions": 0}
    return {"scheduled": q.scheduled, "waitP50Ns": q.percentile_ns(50), "waitP95Ns": q.percentile_ns(95),
            "waitMaxNs": q.max_wait_ns, "waitsCensored": q.censored, "pendingAtEnd": q.pending_at_end,
            "gpuMilliNs": q.gpu_milli_ns, "evictions": q.evictions}


def _run(s: Summary, facts: RunFacts) -> dict[str, Any]:
    span = max(1, s.end_ns - s.start_ns)
    f = s.fragmentation
    return {"records": facts.records, "decisions": facts.decisions, "decisionDigest": facts.digest,
            "cycles": s.cycles, "podsSeen": s.pods_seen, "podsScheduled": s.pods_scheduled,
            "pendingAtEnd": s.pending_at_end, "gpuUtilizationPermille": s.utilization_permille,
            "evictions": s.evictions, "strandedGpuMilliNs": s.stranded_milli_ns,
            "fairShareErrorMeanMilliGpu": s.fair_error_milli_ns // span,
            "fragmentationAtEnd": {"idleMilliGpu": f.idle_milli, "strandedMilliGpu": f.stranded_milli,
                                   "cause": f.cause() or None}}


def compare(recorded: Summary, rec: RunFacts, counterfactual: Summary, cf: RunFacts, *, changes: list[str],
            configs: tuple[str, str], top: int = 10,
            rerun: tuple[Summary, RunFacts] | None = None) -> dict[str, Any]:
    """The comparison document (`kai-es whatif --output json`).

    `rerun`: the recorded workload re-run under the recorded settings. When it did not make the
    recorded decisions (a log whose timing was a live cluster's, not the simulator's), the
    counterfactual is compared with it instead of with the record, so that what differs is what
    the changes did, not the timing the simulator cannot reproduce: `comparedWith` says which
    ("recorded" or "rerun"), per-queue entries and `runs` carry both, and each changed job's
    reference fields are named after it (`recordedWaitNs` or `rerunWaitNs`, ...)."""
    use_rerun = rerun is not None and rerun[1].digest != rec.digest
    base_name = "rerun" if use_rerun else "recorded"
    base = rerun[0] if use_rerun and rerun is not None else recorded
    queues = sorted(set(recorded.queues) | set(counterfactual.queues) | set(base.queues))
    jobs = []
    for key in sorted(set(base.jobs) | set(counterfactual.jobs)):
        a, b = base.jobs.get(key), counterfactual.jobs.get(key)
        if a is None or b is None:
            continue
        wa, ca = _job_wait(a, base.end_ns)
        wb, cb = _job_wait(b, counterfactual.end_ns)
        jobs.append((-abs(wb - wa), key, a.queue, wa, ca, wb, cb, a.evictions, b.evictions))
    jobs.sort()
    changed = [{"job": key, "queue": queue, f"{base_name}WaitNs": wa, f"{base_name}Censored": ca,
                "counterfactualWaitNs": wb, "counterfactualCensored": cb, "deltaNs": wb - wa,
                f"{base_name}Evictions": ea, "counterfactualEvictions": eb}
               for _, key, queue, wa, ca, wb, cb, ea, eb in jobs[:top] if wb != wa or ea != eb]
    runs = {"recorded": _run(recorded, rec), "counterfactual": _run(counterfactual, cf)}
    if rerun is not None:
        runs["rerun"] = _run(*rerun)

    def queue_entry(q: str) -> dict[str, Any]:
        source = recorded.queues.get(q) or base.queues.get(q) or counterfactual.queues[q]
        entry = {"parent": source.parent or None, "recorded": _queue(recorded, q),
                 "counterfactual": _queue(counterfactual, q)}
        if rerun is not None:
            entry["rerun"] = _queue(rerun[0], q)
        return entry

    return {
        "changes": changes,
        "config": {"recorded": configs[0], "counterfactual": configs[1]},
        "identicalDecisions": rec.digest == cf.digest,
        "comparedWith": base_name,
        "span": {"startNs": recorded.start_ns, "endNs": recorded.end_ns},
        "runs": runs,
        "queues": {q: queue_entry(q) for q in queues},
        "jobsChangedMost": changed,
        "waitCounting": "per pod from first observed to first bound; a pod never bound counts its wait to "
                        "the end of the run (censored), included in the percentiles",
    }
