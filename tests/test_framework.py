"""The action framework: the Plan as a Statement (typed operations, rollback of tables *and*
queue accounting), the capacity epoch of its memos, verification mode, the emitter's
`waiting_for`, and the policy registry that configs and replay dispatch on."""

from __future__ import annotations

from array import array

from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_es.events.payloads import PodObserved
from kai_es.oneshot import initial_state
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.config import ConfigError, parse_config
from kai_es.scheduling.cycle import strategy_of
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling import plan as plan_module
from kai_es.scheduling.plan import Entry, Plan, VerificationError
from kai_es.scheduling.policy import POLICIES, RULES_V1, policy_for
from kai_es.scheduling.session import Session
from tests.builders import MakeNode, MakePod, counting_rank, queue, scenario_text

# --- the policy registry ----------------------------------------------------------------------


def test_config_rejects_an_action_its_policy_does_not_implement() -> None:
    with pytest.raises(ConfigError, match=r"consolidation, stalegangeviction are not implemented by policy "
                                          r"kai-es/v2 \(it runs: allocate, preempt, reclaim\) - at `\$.actions`"):
        parse_config({"policyVersion": "kai-es/v2",
                      "actions": ["allocate", "consolidation", "reclaim", "stalegangeviction"]})
    with pytest.raises(ConfigError, match=r"consolidation is not implemented by policy kai-es/v3 \(it runs: "
                                          r"allocate, preempt, reclaim, stalegangeviction\) - at `\$.actions`"):
        parse_config({"policyVersion": "kai-es/v3",
                      "actions": ["allocate", "consolidation", "reclaim", "stalegangeviction"]})
    # v4 implements all five
    assert parse_config({"actions": ["allocate", "consolidation", "reclaim", "stalegangeviction"]}).action_list[1] \
        == "consolidation"


def test_version_1_configs_keep_their_legacy_action_list() -> None:
    """Logs written before the registry recorded five actions under kai-es/v1: still valid."""
    cfg = parse_config({"policyVersion": "kai-es/v1",
                        "actions": ["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]})
    assert list(policy_for(cfg.policy_version).actions) == ["allocate"]


def test_unknown_policy_version_is_rejected_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown policy version 'kai-es/v99'.*kai-es/v1, kai-es/v2, kai-es/v3"):
        parse_config({"policyVersion": "kai-es/v99"})


def test_default_config_runs_exactly_what_it_lists() -> None:
    cfg = parse_config(None)
    policy = POLICIES[cfg.policy_version]
    assert set(cfg.actions) <= set(policy.actions)


# --- the Plan as a Statement -------------------------------------------------------------------


def _session(*docs: dict[str, Any], verify: bool = False) -> Session:
    scenario = load_scenario_text(scenario_text(*docs), "framework")
    state = initial_state(scenario)
    plan = Plan(state, load_packer("native"), strategy_of(scenario.config), verify=verify)
    return Session(state, plan, scenario.start_ns, RULES_V1)


def _full_node() -> list[dict[str, Any]]:
    return [MakeNode("n1").gpus(8).obj(), queue("team-a", gpu_quota=4), queue("team-b", gpu_quota=4),
            MakePod("big-a").gpu(8).running_on("n1").obj(),
            MakePod("big-b", queue="team-b").gpu(8).obj()]


def _accounting(session: Session) -> dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]]:
    return {name: (q.allocated, q.nonpreemptible) for name, q in sorted(session.queues.items())}


def _count_asks(plan: Plan, bound: str) -> list[object]:
    """The asks of the plan's bound packer `bound` (`_place_idle` or `_place_future`) from now
    on, each as its arguments, in a list that grows as they come."""
    asks: list[object] = []
    packer = getattr(plan, bound)

    def counted(*args: Any, **kwargs: Any) -> Any:
        asks.append(args)
        return packer(*args, **kwargs)

    setattr(plan, bound, counted)
    return asks


def test_whether_a_pod_fits_elsewhere_is_read_from_one_scan_until_its_nodes_fill() -> None:
    """`Plan.fits_elsewhere` (consolidation: may this pod move?) answers as the packer does on
    the mask without the pod's own node, after every placement; it scans the cluster once, then
    checks the nodes that scan found, and scans again only when none of them is left."""
    session = _session(MakeNode("n1").gpus(2).obj(), MakeNode("n2").gpus(2).obj(), MakeNode("n3").gpus(2).obj(),
                       queue("team-a"), *[MakePod(f"p{i}").gpu(1).obj() for i in range(6)])
    plan, state = session.plan, session.state
    specs = [state.pods[f"default/p{i}"].spec for i in range(6)]
    shape, mask = plan.shape(specs[0]), session.eligibility.static_mask(specs[0])
    scans: list[int] = []
    plan._rank_idle = counting_rank(plan._rank_idle, scans)

    def truth(own: int) -> bool:
        others = array("q", mask)
        others[own] = 0
        return plan.packer.place(plan.idle, shape, plan.strategy, others).placed

    for i, spec in enumerate(specs):
        for own in range(3):
            assert plan.fits_elsewhere(shape, mask, own) == truth(own), (i, own)
        plan.place(f"default/p{i}", spec, mask)
    assert len(scans) < 6 * 3  # the nodes a scan found answer the asks after it
    assert not any(plan.fits_elsewhere(shape, mask, own) for own in range(3))  # all full


def test_a_pod_placed_away_from_a_node_goes_where_the_mask_without_it_sends_it() -> None:
    """`Plan.place_idle(away_from=...)` (a moved pod's re-placement: never the node it leaves)
    places as the same mask with that node left out would, without the caller copying it."""
    docs = (MakeNode("n1").gpus(2).obj(), MakeNode("n2").gpus(4).obj(), MakeNode("n3").gpus(8).obj(),
            queue("team-a"), MakePod("p").gpu(1).obj())
    one, other = _session(*docs, verify=True), _session(*docs, verify=True)
    spec = one.state.pods["default/p"].spec
    mask = one.eligibility.static_mask(spec)
    first = one.plan.place_idle("default/p", spec, mask, fixed=True)
    assert first is not None
    one.plan.rollback(0)
    away = one.plan.place_idle("default/p", spec, mask, away_from=first.node, fixed=True)
    without = array("q", other.eligibility.static_mask(spec))
    without[first.node] = 0
    expected = other.plan.place_idle("default/p", spec, without)
    assert away is not None and expected is not None
    assert (away.node, away.devices) == (expected.node, expected.devices) and away.node != first.node
    assert list(mask) == [1, 1, 1]  # the caller's mask as it was


def test_eviction_grows_capacity_so_a_remembered_failure_is_not_reused() -> None:
    session = _session(*_full_node())
    plan, state = session.plan, session.state
    spec = state.pods["default/big-b"].spec
    mask = session.eligibility.static_mask(spec)
    entry, _ = plan.place("default/big-b", spec, mask, settled=True)
    assert entry is None and plan.known_failure(spec, mask) is not None
    plan.evict("default/big-a", action="test", preemptor="default/big-b", reason="make room")
    assert plan.known_failure(spec, mask) is None  # the epoch moved on
    entry, _ = plan.place("default/big-b", spec, mask, settled=True)
    assert entry is not None and entry.pipelined


def test_an_idle_failure_found_settled_is_not_asked_again_by_a_search_after_evictions() -> None:
    """A victim search places its preemptor after each eviction (a new epoch each time, so the
    no-fit memo is forgotten); with `explain=False` it does not ask the packer about idle
    capacity its shape was found not to fit when settled — idle capacity only shrinks during a
    cycle — and goes straight to the capacity the evictions release."""
    session = _session(*_full_node(), verify=True)
    plan, state = session.plan, session.state
    spec = state.pods["default/big-b"].spec
    mask = session.eligibility.static_mask(spec)
    idle_asks = _count_asks(plan, "_place_idle")
    first, answer = plan.place("default/big-b", spec, mask, settled=True)
    assert first is None and len(idle_asks) == 1
    plan.evict("default/big-a", action="test", preemptor="default/big-b", reason="make room")
    entry, again = plan.place("default/big-b", spec, mask, explain=False)
    assert entry is not None and entry.pipelined and again == answer
    assert len(idle_asks) == 1  # the memo answered for idle capacity
    plan.rollback(plan.checkpoint() - 1)
    entry, _ = plan.place("default/big-b", spec, mask)  # explained: asked again
    assert entry is not None and entry.pipelined and len(idle_asks) == 2


def test_a_task_that_fitted_no_releasing_capacity_is_looked_for_only_where_evictions_released_some(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Releasing capacity grows only by evictions: once a task fitted none of it, settled, the
    Plan looks for it only on the nodes with an eviction in force, not with a scan of the
    cluster, and finds the node the packer would (while they are few: here always)."""
    monkeypatch.setattr(plan_module, "AMONG_PER_SCAN", 0)
    docs = [*_full_node(), MakeNode("n2").gpus(4).obj(), MakeNode("n3").gpus(8).obj(),
            MakePod("big-c", queue="team-b").gpu(8).running_on("n3").obj()]
    session = _session(*docs, verify=True)
    plan, state = session.plan, session.state
    spec = state.pods["default/big-b"].spec
    mask = session.eligibility.static_mask(spec)
    future_asks = _count_asks(plan, "_place_future")
    assert plan.place("default/big-b", spec, mask, settled=True)[0] is None and len(future_asks) == 1
    evicted = plan.evict("default/big-c", action="test", preemptor="default/big-b", reason="make room")
    entry, _ = plan.place("default/big-b", spec, mask, explain=False)
    assert entry is not None and entry.pipelined and plan.names[entry.node] == "n3"
    assert len(future_asks) == 1  # no scan: n3 was the only node with an eviction
    plan.rollback(plan.checkpoint() - 1)
    cp = plan.checkpoint()
    assert plan.unevict(evicted)
    assert plan.place("default/big-b", spec, mask, explain=False)[0] is None  # nothing released now
    plan.rollback(cp)  # the eviction stands again
    entry, _ = plan.place("default/big-b", spec, mask, explain=False)
    assert entry is not None and plan.names[entry.node] == "n3" and len(future_asks) == 1


@pytest.mark.parametrize("skips_held_idle", [False, True])
def test_a_nominated_node_tried_first_is_checked_alone_without_a_scan(skips_held_idle: bool) -> None:
    """A pod nominated to a node (its capacity reserved by an earlier cycle) tries that node
    first, on the Plan's one-node mask: it is checked on that node alone, with the answer the
    packer would give; when the node cannot take it, the rest of its mask is scanned."""
    docs = [MakeNode("n1").gpus(8).obj(), MakeNode("n2").gpus(8).obj(), MakeNode("n3").gpus(8).obj(),
            queue("team-a"), MakePod("p").gpu(2).obj(), MakePod("q").gpu(8).obj()]
    session = _session(*docs, verify=True)
    plan, state = session.plan, session.state
    plan.skips_held_idle = skips_held_idle  # (kai-es/v10 on: `rules.releasing_capacity.HeldIdleSkipped`)
    asks = _count_asks(plan, "_place_idle")
    spec = state.pods["default/p"].spec
    mask = session.eligibility.static_mask(spec)
    levels = plan.nominated_first("n3", mask, None)
    assert levels is not None and levels[0] is plan.one_node_mask(2)  # one mask per node, kept
    entry, _ = plan.place("default/p", spec, mask, levels=levels)
    assert entry is not None and plan.names[entry.node] == "n3" and asks == []
    big = state.pods["default/q"].spec
    big_mask = session.eligibility.static_mask(big)
    entry, _ = plan.place("default/q", big, big_mask, levels=plan.nominated_first("n3", big_mask, None))
    assert entry is not None and plan.names[entry.node] == "n1" and len(asks) == 1  # n3 is short: scanned


def test_an_unsettled_idle_failure_is_not_remembered() -> None:
    """Found with a tentative placement outstanding (`settled=False`), a failure says nothing of
    the capacity the rollback will give back."""
    session = _session(*_full_node(), verify=True)
    plan, state = session.plan, session.state
    spec = state.pods["default/big-b"].spec
    mask = session.eligibility.static_mask(spec)
    plan.place("default/big-b", spec, mask)
    assert plan._idle_failed == {}
    plan.place("default/big-b", spec, mask, settled=True)
    assert list(plan._idle_failed.values()) and not next(iter(plan._idle_failed.values())).placed


@given(st.lists(st.tuples(st.sampled_from(["settled", "evict", "unevict", "checkpoint", "rollback", "search"]),
                          st.integers(0, 5)), max_size=24), st.data())
def test_a_search_placement_with_the_idle_memo_is_the_placement_without_it(steps: list[tuple[str, int]],
                                                                           data: st.DataObject) -> None:
    """Whatever the Plan did before (settled placements, evictions, rollbacks, evictions undone),
    a placement with `explain=False` puts the task where the same placement with the memos of
    settled failures (idle, and releasing capacity off the evicted nodes) forgotten does."""
    docs: list[dict[str, Any]] = [MakeNode("n1").gpus(8).obj(), MakeNode("n2").gpus(8).obj(),
                                  queue("team-a"), queue("team-b")]
    for i in range(4):
        docs.append(MakePod(f"run-{i}", queue="team-a" if i % 2 else "team-b").gpu(2 + i % 2)
                    .running_on("n1" if i < 2 else "n2").obj())
    for i, gpus in enumerate((2, 2, 2, 4)):
        docs.append(MakePod(f"pend-{i}", queue="team-b" if i % 2 else "team-a").gpu(gpus).obj())
    session = _session(*docs, verify=True)
    plan, state = session.plan, session.state
    stack = [plan.checkpoint()]
    among = data.draw(st.sampled_from([0, plan_module.AMONG_PER_SCAN]))  # the evicted nodes alone, or a scan

    def placed(key: str) -> bool:
        return any(e.pod_key == key for e in plan.entries)

    with patch.object(plan_module, "AMONG_PER_SCAN", among):
        for op, n in steps:
            key = f"default/pend-{n % 4}"
            spec = state.pods[key].spec
            mask = session.eligibility.static_mask(spec)
            if op == "checkpoint":
                stack.append(plan.checkpoint())
            elif op == "rollback" and stack:
                plan.rollback(stack.pop())
            elif op == "settled" and not placed(key):
                # settled: no placement a rollback may still undo (none since the oldest checkpoint)
                plan.place(key, spec, mask, settled=not stack or plan.checkpoint() == stack[0])
            elif op == "evict":
                victim = f"default/run-{n % 4}"
                if not any(v.pod_key == victim for v in plan.evictions):
                    plan.evict(victim, action="test", preemptor="", reason="test")
            elif op == "unevict" and plan.evictions:
                plan.unevict(plan.evictions[n % len(plan.evictions)])
            elif op == "search" and not placed(key):
                cp, kept, kept_future = plan.checkpoint(), dict(plan._idle_failed), set(plan._future_failed)
                plan._idle_failed.clear()
                plan._future_failed.clear()
                fresh, _ = plan.place(key, spec, mask, explain=False)
                plan.rollback(cp)
                plan._idle_failed.update(kept)
                plan._future_failed.update(kept_future)
                entry, _ = plan.place(key, spec, mask, explain=False)
                assert (entry and (entry.node, entry.devices, entry.pipelined)) == \
                    (fresh and (fresh.node, fresh.devices, fresh.pipelined))


def test_rollback_undoes_tables_and_queue_accounting_of_every_operation() -> None:
    session = _session(*_full_node(), MakeNode("n2").gpus(8).obj(), MakePod("small", queue="team-b").gpu(2).obj())
    plan, state = session.plan, session.state
    before = (None, [list(getattr(plan.idle, f)) for f in plan.idle.ARRAYS],
              [list(getattr(plan.future, f)) for f in plan.future.ARRAYS], _accounting(session))
    cp = plan.checkpoint()
    small = state.pods["default/small"].spec
    plan.place("default/small", small, session.eligibility.static_mask(small))
    plan.evict("default/big-a", action="test", preemptor="default/big-b", reason="make room")
    big = state.pods["default/big-b"].spec
    plan.place("default/big-b", big, session.eligibility.static_mask(big))
    assert _accounting(session) != before[3]
    assert session.queues["team-a"].allocated[0] == 0  # big-a's 8 GPUs went back with the eviction
    assert session.queues["team-b"].allocated[0] == 10_000
    plan.rollback(cp)
    after = (None, [list(getattr(plan.idle, f)) for f in plan.idle.ARRAYS],
             [list(getattr(plan.future, f)) for f in plan.future.ARRAYS], _accounting(session))
    assert after[1:] == before[1:]
    assert plan.operations == []


@given(st.lists(st.tuples(st.sampled_from(["place", "evict", "checkpoint", "rollback"]), st.integers(0, 5)),
                max_size=20))
def test_any_sequence_of_operations_and_rollbacks_returns_to_the_checkpoint(steps: list[tuple[str, int]]) -> None:
    docs: list[dict[str, Any]] = [MakeNode("n1").gpus(8).obj(), MakeNode("n2").gpus(4).obj(),
                                  queue("team-a"), queue("team-b")]
    for i in range(3):
        docs.append(MakePod(f"run-{i}", queue="team-a" if i % 2 else "team-b").gpu(2).running_on("n1" if i < 2 else "n2").obj())
    for i in range(3):
        docs.append(MakePod(f"pend-{i}", queue="team-b" if i % 2 else "team-a").gpu(1 + i).obj())
    session = _session(*docs)
    plan, state = session.plan, session.state

    def snap() -> Any:
        return ([list(getattr(plan.idle, f)) for f in plan.idle.ARRAYS],
                [list(getattr(plan.future, f)) for f in plan.future.ARRAYS], _accounting(session),
                session.eligibility.affinity.verify())

    stack = [(plan.checkpoint(), snap())]
    for op, n in steps:
        if op == "checkpoint":
            stack.append((plan.checkpoint(), snap()))
        elif op == "rollback" and stack:
            cp, saved = stack.pop()
            plan.rollback(cp)
            assert snap() == saved
        elif op == "place":
            key = f"default/pend-{n % 3}"
            if any(e.pod_key == key for e in plan.entries):
                continue
            spec = state.pods[key].spec
            plan.place(key, spec, session.eligibility.static_mask(spec), remember=False)
        elif op == "evict":
            key = f"default/run-{n % 3}"
            if any(v.pod_key == key for v in plan.evictions):
                continue
            plan.evict(key, action="test", preemptor="", reason="test")
    while stack:
        cp, saved = stack.pop()
        plan.rollback(cp)
        assert snap() == saved


# --- verification mode ---------------------------------------------------------------------------


def _big_b_failed() -> tuple[Plan, PodObserved, array[int]]:
    """A verifying plan on a full node where big-b (8 GPUs) was just placed settled and did
    not fit; its plan, spec and mask."""
    session = _session(*_full_node(), verify=True)
    spec = session.state.pods["default/big-b"].spec
    mask = session.eligibility.static_mask(spec)
    session.plan.place("default/big-b", spec, mask, settled=True)
    return session.plan, spec, mask


def test_verification_mode_catches_a_wrong_memo() -> None:
    plan, spec, mask = _big_b_failed()
    state = plan.state
    plan.verify = False
    plan.future.apply_placed(0, (0, 1, 2, 3, 4, 5, 6, 7), plan.shape(state.pods["default/big-a"].spec), -1)
    assert plan.place("default/big-b", spec, mask, settled=True)[0] is None  # the memo, unchecked
    plan.verify = True
    with pytest.raises(VerificationError, match="remembered 'does not fit'"):
        plan.place("default/big-b", spec, mask, settled=True)


def test_verification_mode_catches_a_wrong_idle_memo() -> None:
    plan, spec, mask = _big_b_failed()
    state = plan.state
    plan.evict("default/big-a", action="test", preemptor="default/big-b", reason="make room")
    plan.idle.apply_placed(0, (0, 1, 2, 3, 4, 5, 6, 7), plan.shape(state.pods["default/big-a"].spec), -1)
    with pytest.raises(VerificationError, match="fitting no idle capacity"):
        plan.place("default/big-b", spec, mask, explain=False)


def test_verification_mode_catches_a_fixed_mask_changed() -> None:
    """A mask placed with `remember=True` is handed to the packer as one that never changes (a
    run of identical pods is then known by its identity): verification mode checks that."""
    session = _session(*_full_node(), verify=True)
    plan, state = session.plan, session.state
    spec = state.pods["default/big-b"].spec
    mask = array("q", session.eligibility.static_mask(spec))
    plan.place("default/big-b", spec, mask, settled=True)
    plan.place("default/big-b", spec, mask, settled=True)  # unchanged: fine
    mask[0] ^= 1
    with pytest.raises(VerificationError, match="remember=True"):
        plan.place("default/big-b", spec, mask, settled=True)


def test_verification_mode_catches_stale_incremental_tables() -> None:
    scenario = load_scenario_text(scenario_text(*_full_node()), "framework")
    state = initial_state(scenario)
    Plan(state, load_packer("native"), strategy_of(scenario.config), verify=True)  # consistent: fine
    state.nodes["n1"].used_milli_cpu += 1000  # a change the reducer did not mark dirty
    with pytest.raises(VerificationError, match="differs from a rebuild"):
        Plan(state, load_packer("native"), strategy_of(scenario.config), verify=True)


# --- the emitter ------------------------------------------------------------------------------------


def test_pipelined_placement_waits_for_the_plans_victims() -> None:
    from kai_es.events import Record
    from kai_es.events import payloads as p
    from kai_es.events.factory import make_envelope
    from kai_es.scheduling.emit import Emitter

    session = _session(*_full_node())
    plan, state = session.plan, session.state
    plan.evict("default/big-a", action="reclaim", preemptor="default/big-b", reason="test")
    spec = state.pods["default/big-b"].spec
    entry, _ = plan.place("default/big-b", spec, session.eligibility.static_mask(spec))
    assert entry is not None
    started = Record(1, make_envelope(p.CycleStarted(cycle=1, config_digest="x"), event_id="c", source="t",
                                      subject="cycle/1", logicaltime=0))
    emitter = Emitter(started, "kai-es/v2")
    for op in plan.operations:
        if isinstance(op, Entry):
            emitter.placement(state, plan, op)
        else:
            emitter.eviction(state, plan, op)
    kinds = [type(e.data).__name__ for e in emitter.out]
    assert kinds == ["EvictionDecided", "PodPipelined"]
    assert emitter.out[1].data.waiting_for == ("default/big-a",)
    assert emitter.out[0].data.action == "reclaim"
