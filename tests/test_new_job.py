"""The reducer's fast path for a pod of a job it has not seen (`handlers.jobs.new_job`, nearly
once per pod) makes exactly the job `job_for` then `refresh_job` make: the same fields, the same
indexes and marks, for any queue, priority class (observed, KAI's default, unknown), explicit
priority, preemptibility, creation time and uid. A change to either that forgets the other fails."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kai_es.events import payloads as p
from kai_es.state import ClusterState
from kai_es.state.handlers.jobs import job_for, new_job, refresh_job
from kai_es.state.model import PodState

CLASSES = st.sampled_from(["", "train", "build", "inference", "observed", "unknown-class"])
MODES = st.sampled_from(["", "preemptible", "non-preemptible", "semi-preemptible"])


def _state() -> ClusterState:
    state = ClusterState()
    state.priority_classes["observed"] = 123
    return state


def _view(state: ClusterState, key: str) -> dict[str, Any]:
    job = state.jobs[key]
    return {"job": dataclasses.asdict(job), "semi": sorted(state.semi_jobs), "stale": sorted(state.stale_jobs),
            "pending": {q: list(b) for q, b in state.pending_jobs.items()}, "victims": dict(state.victim_jobs)}


@given(queue=st.sampled_from(["", "q", "team-a"]), priority_class=CLASSES,
       priority=st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)), mode=MODES,
       created=st.integers(0, 2**63 - 1), uid=st.text(min_size=1, max_size=8), implicit=st.booleans())
def test_new_job_is_job_for_then_refresh_job(queue: str, priority_class: str, priority: int | None, mode: Any,
                                             created: int, uid: str, implicit: bool) -> None:
    spec = p.PodObserved(namespace="ns", name="pod-0", uid=uid, podgroup="pg", implicit_podgroup=implicit,
                         queue=queue, priority_class=priority_class, priority=priority, preemptibility=mode,
                         created_ns=created)
    key, member = "ns/pg", "ns/pod-0"
    slow = _state()
    job = job_for(slow, spec)
    slow.pods[member] = PodState(member, spec, job.key)
    job.members.add(member)
    refresh_job(slow, job)
    fast = _state()
    fast.pods[member] = PodState(member, spec, key)
    new_job(fast, key, spec, member)
    assert _view(fast, key) == _view(slow, key)
