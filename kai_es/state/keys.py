"""The state's keys: a pod's key, and the job key in a `pending_jobs` index entry.

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations




def pod_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def job_key_of_index(index_key: tuple[int, int, str, str]) -> str:
    """The job key stored in a `pending_jobs` entry."""
    return index_key[3].split("\x00", 1)[1]
