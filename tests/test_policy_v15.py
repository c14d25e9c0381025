"""kai-es/v15: a pod deleted while its bind was in flight is not pending again when the bind
fails (fold rule `failed_binds_honour_deletion`), as a terminating pod is not pending in every
other way and as a state restored from a snapshot has it. KAI's `getTaskStatus` (pod_info.go)
reads a Pending pod with a deletionTimestamp as Releasing before it looks at its BindRequest:
never pending again. v14 put it back: it was decided again
after its back-off (the API server refuses to bind a pod being deleted, so the binder failed
again), and a checkpoint taken then restored to another state than the fold's.

Written as a KAI user meets it: a one-GPU training pod is decided, the user deletes it before
the binder's Binding lands (the informer sees its deletionTimestamp), the Binding is refused."""

from __future__ import annotations

import msgspec

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ingest.translate import subject_of
from kai_es.oneshot import _initial_envelopes
from kai_es.scenario import Scenario, load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import load_packer
from kai_es.state import ClusterState
from kai_es.state.invariants import check
from kai_es.state.model import BIND_BACKOFF_BASE_NS
from kai_es.state.reducer import apply
from kai_es.state.snapshot import restore, snapshot
from tests.builders import MakeNode, MakePod, queue, scenario_text
from tests.policy_checks import assert_one_fold_rule_added


def _scenario(version: str) -> Scenario:
    return load_scenario_text(scenario_text(
        MakeNode("n1").gpus(8).obj(), queue("team-a"), MakePod("train").gpu(1).obj(),
        settings={"start": "2026-01-01T12:00:00Z", "scheduler": {"policyVersion": version}}))


class _Cluster:
    """The scenario's state, folded as the scheduler folds its log, with cycles run on it."""

    def __init__(self, version: str) -> None:
        self.sc = _scenario(version)
        self.state = ClusterState()
        self.t = self.sc.start_ns
        self.cycles = 0
        for env in _initial_envelopes(self.sc):
            self.fold(env)

    def fold(self, env: Envelope) -> None:
        apply(self.state, Record(self.state.position + 1, env))

    def observe(self, payload: p.Payload, dt: int = 1) -> None:
        self.t += dt
        self.fold(make_envelope(payload, event_id=f"e-{self.t}", source="test", subject=subject_of(payload),
                                logicaltime=self.t))

    def cycle(self, dt: int = 1) -> list[Envelope]:
        self.t += dt
        self.cycles += 1
        started = make_envelope(p.CycleStarted(cycle=self.cycles, config_digest="c"), event_id=f"c{self.cycles}",
                                source="kai-es/scheduler", subject=f"cycle/{self.cycles}", logicaltime=self.t,
                                policyversion=self.sc.config.policy_version)
        self.fold(started)
        decisions = run_cycle(self.state, Record(self.state.position, started), self.sc.config, load_packer("native"))
        for env in decisions:
            self.fold(env)
        return decisions


def _deleted_during_bind(version: str, then_cycle: bool = True) -> tuple[_Cluster, list[Envelope]]:
    """Decide the pod, delete it before the Binding lands, the Binding refused; then (unless
    not `then_cycle`) a cycle after the bind back-off. The cluster and that cycle's decisions."""
    cluster = _Cluster(version)
    (bind,) = [e for e in cluster.cycle() if isinstance(e.data, p.BindingDecided)]
    assert bind.data.name == "train"
    # kubectl delete pod train: the informer's next observation of it carries its deletionTimestamp
    spec = cluster.state.pods["default/train"].spec
    cluster.observe(msgspec.structs.replace(spec, terminating=True, deletion_ns=cluster.t + 1))
    cluster.observe(p.PodBindFailed(namespace="default", name="train", uid=bind.data.uid, node="n1",
                                    decision_id=bind.id, message='pods "train" is being deleted'))
    return cluster, cluster.cycle(dt=2 * BIND_BACKOFF_BASE_NS) if then_cycle else []


def test_a_pod_deleted_while_its_bind_was_in_flight_is_not_decided_again() -> None:
    cluster, again = _deleted_during_bind("kai-es/v15")
    pod = cluster.state.pods["default/train"]
    assert pod.status == "Pending" and pod.spec.terminating and pod.pending_key is None
    assert not cluster.state.pending_jobs
    assert not [e for e in again if isinstance(e.data, p.BindingDecided)]
    assert check(cluster.state, strict=False) == []
    # a scheduler restarted from a snapshot taken now sees the same state
    assert policy.state_digest("kai-es/v15", restore(snapshot(cluster.state))) == \
        policy.state_digest("kai-es/v15", cluster.state)


def test_v14_decided_it_again_and_its_snapshot_restored_another_state() -> None:
    cluster, again = _deleted_during_bind("kai-es/v14")
    assert [e.data.name for e in again if isinstance(e.data, p.BindingDecided)] == ["train"]
    cluster, _ = _deleted_during_bind("kai-es/v14", then_cycle=False)
    assert cluster.state.pods["default/train"].pending_key is not None
    assert policy.state_digest("kai-es/v14", restore(snapshot(cluster.state))) != \
        policy.state_digest("kai-es/v14", cluster.state)


def test_a_config_of_v15_takes_a_pod_v14_put_back_out_of_the_pending_pods() -> None:
    cluster, _ = _deleted_during_bind("kai-es/v14", then_cycle=False)
    assert cluster.state.pods["default/train"].pending_key is not None
    cluster.observe(p.ConfigApplied(config={"policyVersion": "kai-es/v15"}, config_digest="v15"))
    assert cluster.state.pods["default/train"].pending_key is None and not cluster.state.pending_jobs
    assert check(cluster.state, strict=False) == []


def test_v15_differs_from_v14_in_this_fold_rule_only_and_later_versions_keep_it() -> None:
    assert_one_fold_rule_added("kai-es/v14", "kai-es/v15", "failed_binds_honour_deletion")
