"""Folded state: model, reducer, snapshot/digest and invariants (pure; no I/O)."""

from kai_es.state.model import ClusterState, Job, NodeState, PodState, QueueState
from kai_es.state.reducer import apply, fold
from kai_es.state.snapshot import digest, restore, snapshot, snapshot_bytes

__all__ = ["ClusterState", "Job", "NodeState", "PodState", "QueueState", "apply", "digest", "fold",
           "restore", "snapshot", "snapshot_bytes"]
