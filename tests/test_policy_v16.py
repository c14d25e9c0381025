"""Policy kai-es/v16: v15's rules and decisions, its state digest hashing a pod's spec with the
fields in name order (the order `PodObserved` declares them in since v16, cheaper to decode).
Logs written under v15 keep their digests (tests/golden/history holds v15's goldens, replayed
byte for byte by tests/test_simulation.py); this file holds v16 to the same decisions and to
a digest that a restored snapshot and a mid-log switch of version both agree with."""

from __future__ import annotations

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ingest.translate import subject_of
from kai_es.oneshot import _initial_envelopes
from kai_es.scenario import load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import load_packer
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from kai_es.state.snapshot import restore, snapshot
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text
from tests.policy_checks import assert_one_fold_rule_added


def _manifests(version: str) -> str:
    """Two 8-GPU nodes, one tainted; team-a with a quota; a 2-pod gang, a half-GPU pod, a pod
    pinned by nodeSelector and toleration, and one asking for GPU memory: every field that the
    reorder moved is set in some pod."""
    return scenario_text(
        MakeNode("n1").gpus(8).gpu_memory(40960).obj(),
        MakeNode("n2").gpus(8).gpu_memory(40960).label("kubernetes.io/hostname", "n2").taint("dedicated").obj(), queue("team-a", gpu_quota=8),
        podgroup("gang", 2),
        MakePod("w0").gpu(2).group("gang").obj(), MakePod("w1").gpu(2).group("gang").obj(),
        MakePod("half").fraction("0.5").priority_class("inference").obj(),
        MakePod("pinned").gpu(1).node_selector(**{"kubernetes.io/hostname": "n2"}).tolerate("dedicated").obj(),
        MakePod("mem").gpu_memory(20000).req(cpu="3500m", memory="12Gi").obj(),
        settings={"start": "2026-01-01T12:00:00Z", "scheduler": {"policyVersion": version}})


def _fold(version: str, switch_to: str | None = None) -> tuple[ClusterState, list[Envelope]]:
    """The scenario folded as the scheduler folds its log, one cycle run and its decisions folded;
    with `switch_to`, a config naming that version applied after the cycle."""
    sc = load_scenario_text(_manifests(version))
    state = ClusterState()
    for env in _initial_envelopes(sc):
        apply(state, Record(state.position + 1, env))
    started = make_envelope(p.CycleStarted(cycle=1, config_digest="c"), event_id="c1", source="kai-es/scheduler",
                            subject="cycle/1", logicaltime=sc.start_ns + 1, policyversion=version)
    apply(state, Record(state.position + 1, started))
    decisions = run_cycle(state, Record(state.position, started), sc.config, load_packer("native"))
    for env in decisions:
        apply(state, Record(state.position + 1, env))
    if switch_to is not None:
        policy.state_digest(version, state)  # (as the scheduler digests each cycle's state: every pod hashed)
        config = p.ConfigApplied(config={"policyVersion": switch_to}, config_digest=switch_to)
        apply(state, Record(state.position + 1, make_envelope(config, event_id="switch", source="test",
                                                             subject=subject_of(config),
                                                             logicaltime=sc.start_ns + 2)))
    return state, decisions


def _placed(decisions: list[Envelope]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {e.data.name: (e.data.node, tuple(e.data.gpu_devices)) for e in decisions
            if isinstance(e.data, p.BindingDecided)}


def test_v16_is_the_default_and_differs_from_v15_in_this_fold_rule_only() -> None:
    assert policy.CURRENT_POLICY == "kai-es/v16"
    assert_one_fold_rule_added("kai-es/v15", "kai-es/v16", "name_ordered_specs")


def test_the_same_manifests_give_the_same_decisions_and_another_digest() -> None:
    old, old_decisions = _fold("kai-es/v15")
    new, new_decisions = _fold("kai-es/v16")
    assert _placed(new_decisions) == _placed(old_decisions)
    assert set(_placed(new_decisions)) == {"w0", "w1", "half", "pinned", "mem"}
    assert [type(e.data) for e in new_decisions] == [type(e.data) for e in old_decisions]
    digest_old, digest_new = policy.state_digest("kai-es/v15", old), policy.state_digest("kai-es/v16", new)
    assert digest_old != digest_new  # the pods hash in another field order
    # each version's digest is the one a scheduler restarted from a snapshot computes
    assert policy.state_digest("kai-es/v15", restore(snapshot(old))) == digest_old
    assert policy.state_digest("kai-es/v16", restore(snapshot(new))) == digest_new
    assert policy.POLICIES["kai-es/v16"].snapshot_digest(snapshot(new)) == digest_new
    assert policy.POLICIES["kai-es/v15"].snapshot_digest(snapshot(old)) == digest_old


def test_a_config_switching_version_mid_log_rehashes_every_pod() -> None:
    """A log whose config moves from v15 to v16 (an upgrade) digests, after the switch, as a log
    written under v16 all along; and back."""
    switched, _ = _fold("kai-es/v15", switch_to="kai-es/v16")
    along, _ = _fold("kai-es/v16", switch_to="kai-es/v16")
    assert policy.state_digest("kai-es/v16", switched) == policy.state_digest("kai-es/v16", along)
    back, _ = _fold("kai-es/v16", switch_to="kai-es/v15")
    old, _ = _fold("kai-es/v15", switch_to="kai-es/v15")
    assert policy.state_digest("kai-es/v15", back) == policy.state_digest("kai-es/v15", old)
