"""Fair-share division with exact integer expectations (worked out by hand in the comments)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import derived_id, make_envelope
from kai_es.scheduling import policy
from kai_es.scheduling.fairshare import QueueInput, cluster_capacity, divide, gpu_memory_hint
from kai_es.state import ClusterState
from kai_es.state.reducer import apply

ROOT = Path(__file__).resolve().parents[1]


def q(name: str, quota: int = 0, weight: int = 1, limit: int = -1, pending: int = 0, allocated: int = 0,
      parent: str = "", priority: int = 100, created: int = 0) -> QueueInput:
    return QueueInput(name=name, uid=f"uid-{name}", parent=parent, priority=priority, created_ns=created, quota=quota,
                      over_quota_weight=weight, limit=limit, allocated=allocated, pending=pending)


def shares(capacity: int, *queues: QueueInput, unit: int = 1) -> dict[str, int]:
    return {name: s.fair_share for name, s in divide(capacity, list(queues), unit).items()}


def test_quota_first_then_weights() -> None:
    # 16 GPUs. a, b get quota 2 each; 12 left split 1:3 -> a 3, b 9; b needs only 6 -> capped,
    # the 3 it leaves go to a in a second round: a = 2 + 3 + 3 = 8.
    assert shares(16000, q("a", 2000, 1, pending=8000), q("b", 2000, 3, pending=8000, created=1)) == \
        {"a": 8000, "b": 8000}


def test_weight_zero_gets_nothing_over_quota() -> None:
    assert shares(10000, q("a", 1000, 0, pending=5000), q("b", 1000, 1, pending=9000, created=1)) == \
        {"a": 1000, "b": 9000}


def test_priority_buckets_are_served_first() -> None:
    # over quota, the priority-200 queue takes what it requests before the 100s see anything
    assert shares(10000, q("hi", 0, 1, pending=7000, priority=200), q("lo1", 0, 1, pending=9000, created=1),
                  q("lo2", 0, 1, pending=9000, created=2)) == {"hi": 7000, "lo1": 1500, "lo2": 1500}


def test_requests_below_share_release_the_rest() -> None:
    # three equal weights over 9: c asks only 1 -> gets 1, the other two split 8
    assert shares(9000, q("a", pending=9000), q("b", pending=9000, created=1), q("c", pending=1000, created=2)) == \
        {"a": 4000, "b": 4000, "c": 1000}


def test_limits_cap_the_request() -> None:
    assert shares(10000, q("a", limit=2000, pending=9000), q("b", pending=9000, created=1)) == \
        {"a": 2000, "b": 8000}


def test_leftover_units_go_by_largest_remainder_then_oldest() -> None:
    # 10 units by weights 1:1:1 -> 3 each, 1 left: equal remainders -> the oldest (b, created 0)
    assert shares(10, q("a", pending=10, created=5), q("b", pending=10, created=0),
                  q("c", pending=10, created=9)) == {"a": 3, "b": 4, "c": 3}
    # weights 2:1 over 10 -> 6.67 / 3.33 -> 6 and 3, remainders 2 and 1 -> a gets the unit
    assert shares(10, q("a", weight=2, pending=10), q("b", weight=1, pending=10)) == {"a": 7, "b": 3}


def test_unlimited_quota_deserves_its_request() -> None:
    assert shares(10000, q("a", quota=-1, pending=6000), q("b", quota=-1, pending=6000, created=1)) == \
        {"a": 5000, "b": 5000}


def test_oversubscribed_quotas_are_served_by_priority_then_proportionally() -> None:
    # quotas 6 + 6 on 8: same priority -> proportional to what they ask in quota: 4 and 4
    assert shares(8000, q("a", 6000, pending=6000), q("b", 6000, pending=6000, created=1)) == \
        {"a": 4000, "b": 4000}
    assert shares(8000, q("a", 6000, pending=6000, priority=150), q("b", 6000, pending=6000, created=1)) == \
        {"a": 6000, "b": 2000}


def test_three_level_hierarchy() -> None:
    # root 24 GPUs: org-a quota 16 (w1), org-b quota 4 (w1). org-a asks 20, org-b asks 10.
    #   step 1: org-a 16, org-b 4 (20 used, 4 left); step 2: 2 and 2 -> org-a 18, org-b 6.
    # org-a (18) -> team-x quota 10 asks 15, team-y quota 6 asks 5 (weight 2):
    #   step 1: x 10, y 5 (y asked for less than its quota); 3 left, y is satisfied -> x 13.
    # team-x (13) -> leaf-1 quota 8 asks 10 (w1), leaf-2 quota 2 asks 5 (w3):
    #   step 1: 8 and 2; 3 GPUs = 3000 milli left, by 1:3 -> 750 and 2250 milli (exact):
    #   leaf-1 8.75, leaf-2 4.25 GPUs.
    queues = [
        q("org-a", 16000, 1), q("org-b", 4000, 1, pending=10000, created=1),
        q("team-x", 10000, 1, parent="org-a"), q("team-y", 6000, 2, pending=5000, parent="org-a", created=1),
        q("leaf-1", 8000, 1, pending=10000, parent="team-x"), q("leaf-2", 2000, 3, pending=5000, parent="team-x", created=1),
    ]
    got = divide(24000, queues)
    assert {n: got[n].request for n in got} == {"org-a": 20000, "org-b": 10000, "team-x": 15000,
                                                 "team-y": 5000, "leaf-1": 10000, "leaf-2": 5000}
    assert {n: got[n].fair_share for n in got} == {"org-a": 18000, "org-b": 6000, "team-x": 13000,
                                                   "team-y": 5000, "leaf-1": 8750, "leaf-2": 4250}


def test_allocated_counts_towards_request() -> None:
    got = divide(8000, [q("a", 2000, pending=1000, allocated=3000)])
    assert got["a"].request == 4000 and got["a"].allocated == 3000 and got["a"].fair_share == 4000


@given(st.integers(0, 50_000), st.lists(st.tuples(st.integers(-1, 8000), st.integers(0, 4), st.integers(-1, 9000),
                                                st.integers(0, 20_000), st.sampled_from([100, 150])),
                                      min_size=1, max_size=6))
def test_division_never_exceeds_capacity_or_requests(capacity: int, specs: list[tuple[int, int, int, int, int]]) -> None:
    queues = [q(f"q{i}", quota, weight, limit if limit == -1 or quota == -1 else max(limit, quota),
                pending, priority=prio, created=i) for i, (quota, weight, limit, pending, prio) in enumerate(specs)]
    got = divide(capacity, queues)
    total = sum(s.fair_share for s in got.values())
    assert total <= capacity
    for s in got.values():
        assert 0 <= s.fair_share <= s.request
    # work-conserving: capacity is only left over when every queue that can still grow is full
    if total < capacity:
        for qi in queues:
            s = got[qi.name]
            in_quota = s.request if qi.quota < 0 else min(qi.quota, s.request)
            assert s.fair_share >= in_quota
            if qi.over_quota_weight > 0:
                assert s.fair_share == s.request


def test_cli_fairshare_json() -> None:
    run = subprocess.run([sys.executable, "-m", "kai_es", "fairshare", "examples/quickstart.yaml", "-o", "json"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    gpu = {name: q["resources"]["gpu"] for name, q in report["queues"].items()}
    # 16 GPUs; team-a asks 12 (quota 4), team-b asks 1 (quota 4): research (quota 8) asks 13
    assert gpu["research"] == {"quota": 8000, "limit": -1, "request": 13000, "allocated": 0,
                               "fairShare": 13000, "overQuotaWeight": 1}
    assert (gpu["team-a"]["fairShare"], gpu["team-b"]["fairShare"]) == (12000, 1000)
    assert report["queues"]["team-a"]["parent"] == "research"


# --- whole GPUs (policy kai-es/v2), KAI's rounds ------------------------------------------------


def test_whole_gpus_kai_example() -> None:
    # 11 GPUs, quotas 2 + 2, weights 1:4, both asking for everything. After quota 7 are left:
    # a's share 1.4 -> 1 (leftover .4), b's 5.6 -> 5 (leftover .6); the last GPU goes to the
    # larger leftover, b: a = 3, b = 8 (exact milli division would give 3.4 / 7.6).
    assert shares(11000, q("a", 2000, weight=1, pending=11000), q("b", 2000, weight=4, pending=11000),
                  unit=1000) == {"a": 3000, "b": 8000}
    assert shares(11000, q("a", 2000, weight=1, pending=11000), q("b", 2000, weight=4, pending=11000)) == \
        {"a": 3400, "b": 7600}


def test_whole_gpus_leftover_ties_go_to_the_oldest_then_uid() -> None:
    # 3 GPUs, no quota, equal weights: 1 each after one round... 3 queues of 1.0: no leftover.
    # 2 GPUs over 3 queues: shares .666 -> 0 each, leftovers equal: the two oldest get one each.
    got = shares(2000, q("c", 0, pending=5000, created=3), q("a", 0, pending=5000, created=2),
                 q("b", 0, pending=5000, created=1), unit=1000)
    assert got == {"a": 1000, "b": 1000, "c": 0}


def test_whole_gpus_only_a_sub_unit_remainder_is_fractional() -> None:
    # 2.5 GPUs over two equal queues: 1 each in the round (leftover .25 each), then 500 milli
    # (less than a unit) goes to the first by age.
    got = shares(2500, q("a", 0, pending=5000, created=1), q("b", 0, pending=5000, created=2), unit=1000)
    assert got == {"a": 1500, "b": 1000}


def test_whole_gpus_a_satisfied_queue_lets_another_round_run() -> None:
    # 10 GPUs, weights equal: a needs 1, b and c need 9. Round 1: 3.33 each -> a takes 1 (met
    # early), b 3, c 3; round 2 over 3 left: b 1.5 -> 1, c 1.5 -> 1; one GPU left goes to the
    # larger leftover (equal: the older, b).
    got = shares(10000, q("a", 0, pending=1000, created=1), q("b", 0, pending=9000, created=2),
                 q("c", 0, pending=9000, created=3), unit=1000)
    assert got == {"a": 1000, "b": 5000, "c": 4000}


@given(st.integers(0, 40_000), st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 4), st.integers(0, 20_000),
                                                   st.sampled_from([50, 100])), min_size=1, max_size=5))
def test_whole_gpu_division_conserves_and_never_exceeds_requests(capacity: int, specs: list[tuple[int, int, int, int]]) -> None:
    queues = [q(f"q{i}", quota, weight=w, pending=pend, priority=prio, created=i)
              for i, (quota, w, pend, prio) in enumerate(specs)]
    got = shares(capacity, *queues, unit=1000)
    assert all(0 <= got[x.name] <= x.pending for x in queues)
    assert sum(got.values()) <= capacity
    if sum(x.pending for x in queues) >= capacity and all(x.over_quota_weight > 0 for x in queues):
        assert sum(got.values()) == capacity  # nothing requested is left undivided


def test_fairshare_command_divides_whole_gpus_and_says_its_units(tmp_path: Path) -> None:
    scenario = tmp_path / "eleven.yaml"
    docs = ["apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus: {allocatable: {cpu: '64', memory: 64Gi, nvidia.com/gpu: '11'}}"]
    for name, weight in (("a", 1), ("b", 4)):
        docs.append(f"apiVersion: scheduling.run.ai/v2\nkind: Queue\nmetadata: {{name: {name}}}\n"
                    f"spec: {{resources: {{gpu: {{quota: 2, overQuotaWeight: {weight}}}}}}}")
        for i in range(11):
            docs.append(f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-{i}, labels: {{kai.scheduler/queue: {name}}}}}\n"
                        "spec: {schedulerName: kai-scheduler, containers: [{name: c, resources: {requests: {nvidia.com/gpu: '1'}}}]}")
    scenario.write_text("\n---\n".join(docs))
    run = subprocess.run([sys.executable, "-m", "kai_es", "fairshare", str(scenario), "--output", "json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["units"]["gpu"] == "milli-GPU" and report["divisionUnit"]["gpu"] == 1000
    assert report["policyVersion"] == policy.CURRENT_POLICY  # the default: whole GPUs since v2
    fair = {q: report["queues"][q]["resources"]["gpu"]["fairShare"] for q in ("a", "b")}
    assert fair == {"a": 3000, "b": 8000}


# -- the node totals a cycle reads (capacity, GPU-memory hint), kept across cycles ---------------

node_steps = st.lists(st.one_of(
    st.tuples(st.just("node"), st.integers(0, 3), st.integers(0, 16),
              st.one_of(st.integers(0, 2**20), st.integers(0, 2**63 - 1), st.integers(0, 2**128)),  # CPU: near, far, rejected
              st.one_of(st.just(0), st.integers(1, 81920))),
    st.tuples(st.just("gone"), st.integers(0, 3)),
    st.tuples(st.just("ask"),),
), max_size=30)


@given(node_steps)
def test_kept_node_totals_are_every_nodes_sums_after_any_node_changes(steps: list[tuple[Any, ...]]) -> None:
    """`cluster_capacity` and `gpu_memory_hint`, asked between node changes (added, changed in
    any field they sum, removed, re-added), are always the sums over the nodes the state has
    then, as a state that never asked before gives them."""
    state = ClusterState()
    for pos, step in enumerate([*steps, ("ask",)]):
        if step[0] == "ask":
            nodes = [state.nodes[n].spec for n in state.node_names]
            assert cluster_capacity(state) == (sum(1000 * n.gpus for n in nodes), sum(n.milli_cpu for n in nodes),
                                               sum(n.memory_bytes for n in nodes))
            assert gpu_memory_hint(state) == max((n.gpu_memory_mib for n in nodes), default=0)
            continue
        payload: p.Payload
        if step[0] == "node":
            _, i, gpus, cpu, mib = step
            payload = p.NodeObserved(name=f"node-{i}", milli_cpu=cpu, memory_bytes=2**38, gpus=gpus,
                                     gpu_memory_mib=mib)
        else:
            payload = p.NodeRemoved(name=f"node-{step[1]}")
        apply(state, Record(pos, make_envelope(payload, event_id=derived_id("totals", pos), source="kai-es/informer",
                                               subject="s", logicaltime=1_000 + pos)))
