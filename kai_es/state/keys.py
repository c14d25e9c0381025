"""The state's keys and index entries: a pod's key, an entry of a job's pending pods
(`Job.pending`) and of a queue's pending jobs (`ClusterState.pending_jobs`). Entries are
ordered as tuples, most deserving first, and end in a unique key.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from typing import NamedTuple


def pod_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


class PendingPod(NamedTuple):
    """An entry of `Job.pending`: higher task priority first, then older, then uid."""

    neg_priority: int
    created_ns: int
    uid: str
    pod_key: str


class PendingJob(NamedTuple):
    """An entry of `ClusterState.pending_jobs[queue]`: higher priority first, then older, then
    uid, then key (every entry of one index has the same `queue`)."""

    neg_priority: int
    created_ns: int
    uid: str
    queue: str
    job_key: str


def job_key_of_index(index_key: PendingJob) -> str:
    """The job key of a `pending_jobs` entry."""
    return index_key.job_key
