"""kai-es/v10: background pods (KAI's `backgroundpods` plugin, on by default; KAI pull request
#2108 and its design `docs/developer/designs/background-pods`). Running pods labelled
`kai.scheduler/background: "true"` leave the cycle's Plan before its first action and get their
place back after the last; only those whose capacity a workload took are evicted (action
`backgroundpods`). The scenarios (tests/scenarios/v10-*, written as KAI's own example sets
background pods up: a zero-quota `maintenance` queue, pods in the `train` class) hold on both
packers and fail with the rule removed; the config's selector, namespaces and switch are
honoured and validated; older versions decide as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import payloads as p
from kai_es.oneshot import fairshare_report, one_cycle
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.config import ConfigError, config_digest, config_to_dict, parse_config
from kai_es.scheduling.fairshare import QueueInput, divide
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.session import allocatable_share
from kai_es.scheduling.predicates.selector_text import Requirement, SelectorError, parse_selector, selector_holds
from kai_es.scheduling.rules.background_pods import NoBackgroundPodsV9
from kai_es.scheduling.rules.elastic_surplus import SurplusAboveMinMemberV9
from kai_es.scheduling.rules.fair_share_division import ReplacementsCountedOnce
from kai_es.scheduling.rules.queue_limits import LimitsBeforeSearchV9
from kai_es.scheduling.rules.queue_order import KaiQueueOrder
from kai_es.scheduling.rules.releasing_capacity import StuckReleasingHeld
from kai_es.scheduling.rules.staleness import SubGroupStaleness
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from tests import test_kai_rounds as rounds  # (the module: its test is not collected here again)
from tests.builders import MakeNode, MakePod, queue, scenario_text
from tests.policy_patch import without
from tests.test_cycle_scenarios import _reasons, check, expectations

SCENARIOS = Path(__file__).parent / "scenarios"
GIVE_WAY = SCENARIOS / "v10-background-pods-give-way.yaml"
TOPOLOGY = SCENARIOS / "v10-background-pods-topology.yaml"
START = '  start: "2026-01-01T12:00:00Z"\n'


def _cycle(text: str, engine: str = "native") -> dict[str, Any]:
    return one_cycle(load_scenario_text(text, "v10.yaml"), load_packer(engine))  # type: ignore[arg-type]


def _with_scheduler(text: str, scheduler: str) -> str:
    return text.replace(START, f"{START}  scheduler: {scheduler}\n", 1)


def _evictions(outcome: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["subject"].removeprefix("pod/"): d["data"] for d in outcome["decisions"]
            if d["type"] == "kai.scheduler.pod.evictiondecided"}


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_only_the_background_pod_whose_place_was_taken_is_evicted(engine: str) -> None:
    outcome = _cycle(GIVE_WAY.read_text(), engine)
    check(outcome, expectations(GIVE_WAY))
    evicted = _evictions(outcome)
    assert list(evicted) == ["maintenance/healthcheck-a"]  # node-b's was given its place back
    decision = evicted["maintenance/healthcheck-a"]
    assert decision["action"] == "backgroundpods"
    assert decision["preemptor"] == "default/big-train"
    assert "node-a" in decision["reason"] and not decision.get("to_node")  # an eviction, not a move
    pipelined = next(d["data"] for d in outcome["decisions"] if d["type"] == "kai.scheduler.pod.pipelined")
    assert pipelined["waiting_for"] == ["maintenance/healthcheck-a"]


def test_without_the_rule_the_gang_loses_its_rack_and_no_health_check_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    check(_cycle(TOPOLOGY.read_text()), expectations(TOPOLOGY))
    without(monkeypatch, "kai-es/v10", "background_pods", NoBackgroundPodsV9())
    outcome = _cycle(TOPOLOGY.read_text())
    assert {outcome["pods"][f"default/train-{i}"]["node"] for i in range(4)} == {"node2", "node3", "node6", "node7"}
    assert _evictions(outcome) == {}
    with pytest.raises(AssertionError):
        check(outcome, expectations(TOPOLOGY))


def test_v10s_fold_is_v9s() -> None:
    from kai_es.scheduling import policy

    assert policy.POLICIES["kai-es/v10"].fold == policy.POLICIES["kai-es/v9"].fold


def test_kai_es_v9_decides_the_rack_case_as_before() -> None:
    outcome = _cycle(_with_scheduler(TOPOLOGY.read_text(), "{policyVersion: kai-es/v9}"))
    assert {outcome["pods"][f"default/train-{i}"]["node"] for i in range(4)} == {"node2", "node3", "node6", "node7"}
    assert all(outcome["pods"][f"default/train-{i}"]["status"] == "Binding" for i in range(4))


def test_a_node_whose_idle_capacity_is_held_for_pipelined_pods_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """small-train's first pick, node-a, has 7 idle GPUs held for big-train (pipelined there over
    the health check): v10 places it on node-b. Without `HeldIdleSkipped` it waits the cycle out."""
    without(monkeypatch, "kai-es/v10", "releasing_capacity", StuckReleasingHeld())
    outcome = _cycle(GIVE_WAY.read_text())
    assert outcome["pods"]["default/small-train"]["status"] == "Pending"
    reasons = [d["data"]["reasons"] for d in outcome["decisions"]
               if d["type"] == "kai.scheduler.pod.unschedulable" and d["subject"] == "pod/default/small-train"]
    assert "held for pipelined pods" in reasons[0][0]["message"]


def _background(name: str, node: str, queue_name: str = "maintenance", gpus: int = 1) -> dict[str, Any]:
    return (MakePod(name, queue=queue_name).gpu(gpus).priority_class("train")
            .label("kai.scheduler/background", "true").running_on(node).obj())


def test_a_background_pod_does_not_count_in_its_queues_allocation_while_the_cycle_plans() -> None:
    """KAI: background pods "do not appear in any queue's fair-share arithmetic while the
    scheduler is planning". team-a (limit 4 GPUs) runs a 1-GPU background pod on node-a; its
    4-GPU job is within the limit once the background pod is out of the count, and binds on the
    idle node-b; the background pod, whose place nobody took, stays."""
    docs = [MakeNode("node-a").gpus(8).obj(), MakeNode("node-b").gpus(8).obj(),
            queue("team-a", gpu_quota=4) | {"spec": {"resources": {"gpu": {"quota": 4, "limit": 4}}}},
            _background("healthcheck", "node-a", queue_name="team-a"),
            MakePod("small-train").gpu(4).priority_class("train").obj()]
    outcome = _cycle(scenario_text(*docs, settings={"start": "2026-01-01T12:00:00Z"}))
    assert outcome["pods"]["default/small-train"]["status"] == "Binding"
    assert _evictions(outcome) == {}
    before = _cycle(scenario_text(*docs, settings={"start": "2026-01-01T12:00:00Z",
                                                   "scheduler": {"policyVersion": "kai-es/v9"}}))
    assert before["pods"]["default/small-train"]["status"] == "Pending"  # 1 + 4 > limit 4


def test_the_selector_namespaces_and_switch_of_the_config_are_honoured() -> None:
    def background_evictions(scheduler: str, text: str = GIVE_WAY.read_text()) -> list[str]:
        return sorted(k for k, e in _evictions(_cycle(_with_scheduler(text, scheduler))).items()
                      if e["action"] == "backgroundpods")

    assert background_evictions("{}") == ["maintenance/healthcheck-a"]
    assert background_evictions("{backgroundPods: {enabled: false}}") == []
    assert background_evictions('{backgroundPods: {labelSelector: "workload-type in (healthcheck)"}}') == []
    relabelled = GIVE_WAY.read_text().replace('kai.scheduler/background: "true"', "workload-type: healthcheck")
    assert background_evictions("{}", relabelled) == []
    assert background_evictions('{backgroundPods: {labelSelector: "workload-type in (healthcheck)"}}',
                                relabelled) == ["maintenance/healthcheck-a"]
    assert background_evictions("{backgroundPods: {namespaces: [ops]}}") == []
    assert background_evictions("{backgroundPods: {namespaces: [ops, maintenance]}}") == ["maintenance/healthcheck-a"]


def test_pods_kai_es_does_not_schedule_and_pods_already_leaving_are_not_background() -> None:
    text = GIVE_WAY.read_text()
    foreign = text.replace("  schedulerName: kai-scheduler\n  priorityClassName: train\n  terminationGracePeriodSeconds: 5\n"
                           "  nodeName: node-a", "  schedulerName: default-scheduler\n  priorityClassName: train\n"
                           "  terminationGracePeriodSeconds: 5\n  nodeName: node-a")
    assert foreign != text
    outcome = _cycle(foreign)
    assert "maintenance/healthcheck-a" not in _evictions(outcome)
    assert outcome["pods"]["maintenance/healthcheck-a"]["status"] == "Running"
    leaving = text.replace("  name: healthcheck-a\n  namespace: maintenance\n",
                           "  name: healthcheck-a\n  namespace: maintenance\n  deletionTimestamp: \"2026-01-01T11:59:59Z\"\n")
    assert leaving != text
    outcome = _cycle(leaving)
    assert "maintenance/healthcheck-a" not in _evictions(outcome)  # Releasing already: nothing to give back
    assert outcome["pods"]["default/big-train"]["status"] == "Pipelined"


def test_the_config_rejects_a_bad_selector_and_older_versions_and_keeps_old_digests() -> None:
    for bad in ("", "a in ()", "x y", "-a=b", "kai.scheduler/background=true,"):
        with pytest.raises(ConfigError, match=r"\$\.backgroundPods\.labelSelector"):
            parse_config({"backgroundPods": {"labelSelector": bad}})
    with pytest.raises(ConfigError, match=r"\$\.backgroundPods\.namespaces"):
        parse_config({"backgroundPods": {"namespaces": ["Not_A_Namespace"]}})
    with pytest.raises(ConfigError, match=r"kai-es/v10 on.*\$\.backgroundPods"):
        parse_config({"policyVersion": "kai-es/v9", "backgroundPods": {"enabled": False}})
    with pytest.raises(ConfigError, match="backgroundPods"):
        parse_config({"backgroundPods": {"labelSelector": 5}})
    v9 = parse_config({"policyVersion": "kai-es/v9"})
    assert "backgroundPods" not in config_to_dict(v9)  # a v9 config's digest is what v9 logged
    assert parse_config(config_to_dict(v9)) == v9
    custom = parse_config({"backgroundPods": {"labelSelector": "tier=ops"}})
    assert config_to_dict(custom)["backgroundPods"] == {"enabled": True, "labelSelector": "tier=ops", "namespaces": []}
    assert config_digest(parse_config(config_to_dict(custom))) == config_digest(custom)


def test_a_simulation_converges_the_big_job_runs_and_the_other_health_check_is_never_disturbed() -> None:
    text = _with_scheduler(GIVE_WAY.read_text(), "{}").replace(
        "  scheduler: {}\n", "  scheduler: {}\n  simulation: {until: 20s, cyclePeriod: 1s}\n")
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "v10-sim.yaml"), log, load_packer("native")))
    state = ClusterState()
    evicted: list[str] = []
    for record in log._records:  # noqa: SLF001 - the test reads the whole log
        apply(state, record)
        if isinstance(record.envelope.data, p.EvictionDecided):
            evicted.append(f"{record.envelope.data.namespace}/{record.envelope.data.name}")
    assert evicted == ["maintenance/healthcheck-a"]
    assert (state.pods["default/big-train"].status, state.pods["default/big-train"].node) == ("Running", "node-a")
    assert (state.pods["maintenance/healthcheck-b"].status, state.pods["maintenance/healthcheck-b"].node) == \
        ("Running", "node-b")


# -- the selector text -----------------------------------------------------------------------------

def test_selector_text_as_kubectl_reads_it() -> None:
    assert parse_selector("kai.scheduler/background=true") == (
        Requirement("kai.scheduler/background", "In", ("true",)),)
    assert parse_selector(" tier in (b, a) , !canary,env!=prod,gpu,rank>3, x == ") == (
        Requirement("tier", "In", ("a", "b")), Requirement("canary", "DoesNotExist", ()),
        Requirement("env", "NotIn", ("prod",)), Requirement("gpu", "Exists", ()),
        Requirement("rank", "Gt", ("3",)), Requirement("x", "In", ("",)))
    reqs = parse_selector("tier in (a,b),!canary,env!=prod,rank>3")
    assert selector_holds(reqs, {"tier": "a", "rank": "4"})
    assert not selector_holds(reqs, {"tier": "a", "rank": "4", "canary": ""})
    assert not selector_holds(reqs, {"tier": "a", "rank": "4", "env": "prod"})
    assert not selector_holds(reqs, {"tier": "a", "rank": "three"})
    assert not selector_holds(reqs, {"tier": "c", "rank": "4"})
    assert selector_holds(parse_selector("n<-1"), {"n": "-2"})


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab/.-_=!(), <>in\t0\u00e9")), max_size=40))
def test_any_selector_text_parses_or_is_refused_with_a_selector_error(text: str) -> None:
    try:
        reqs = parse_selector(text)
    except SelectorError as exc:
        assert str(exc)
    else:
        assert reqs and all(r.key for r in reqs)
        selector_holds(reqs, {"a": "b", "in": "0"})


PING_PONG = '''
apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {name: health-checks-on-a-full-node}
spec:
  start: "2026-01-01T12:00:00Z"
  simulation: {until: 30s, cyclePeriod: 1s}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
status: {allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: maintenance}
spec:
  resources:
    gpu: {quota: 0, overQuotaWeight: 0, limit: -1}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: team-a}
---
apiVersion: v1
kind: Pod
metadata: {name: train, labels: {kai.scheduler/queue: team-a}}
spec:
  schedulerName: kai-scheduler
  nodeName: node-a
  containers: [{name: c, resources: {requests: {nvidia.com/gpu: "6"}}}]
status: {phase: Running}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: healthcheck
  namespace: maintenance
  labels: {kai.scheduler/queue: maintenance}
spec:
  replicas: 3
  selector: {matchLabels: {app: healthcheck}}
  template:
    metadata:
      labels: {app: healthcheck, kai.scheduler/background: "true", kai.scheduler/queue: maintenance}
    spec:
      schedulerName: kai-scheduler
      priorityClassName: train
      terminationGracePeriodSeconds: 1
      containers: [{name: check, resources: {requests: {nvidia.com/gpu: "1"}}}]
'''


def test_a_pending_background_pod_never_displaces_a_running_one() -> None:
    """Three health checks of one Deployment for two free GPUs: two run, the third waits. Were
    it pipelined onto a running health check's room (as any pod may be onto capacity being
    released), that one's replacement would take its room the next cycle, and so on for ever."""
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(PING_PONG, "ping-pong.yaml"), log, load_packer("native")))
    state = ClusterState()
    for record in log._records:  # noqa: SLF001 - the test reads the whole log
        apply(state, record)
        assert not isinstance(record.envelope.data, (p.EvictionDecided, p.PodPipelined)), record.envelope.data
    checks = sorted((pod.status, pod.node) for pod in state.pods.values() if pod.spec.namespace == "maintenance")
    assert checks == [("Pending", ""), ("Running", "node-a"), ("Running", "node-a")]


# -- quotas sold over the cluster's capacity -----------------------------------------------------

OVERSOLD = SCENARIOS / "v10-quotas-sold-over-capacity.yaml"
#: the KAI integration cases (tests/test_kai_rounds.py) that v9's division decided otherwise
OVERSOLD_KAI_CASES = ("cluster is in over capacity - reclaim",
                      "q0,q1 allocated both gpu and cpu tasks, q1 has 0 deserved gpus",
                      "it will reclaim ALL from q1 as memory on the node is not enough for all")


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_quotas_that_add_up_to_more_than_the_cluster_are_granted_in_full(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(_cycle(OVERSOLD.read_text(), engine), expectations(OVERSOLD))
    report = fairshare_report(load_scenario_text(OVERSOLD.read_text(), OVERSOLD.name))["queues"]
    assert {q: report[q]["resources"]["gpu"]["fairShare"] for q in ("research", "product")} == \
        {"research": 6000, "product": 5000}  # 11 GPUs of fair share on an 8-GPU cluster, as KAI
    without(monkeypatch, "kai-es/v10", "fair_share_division", ReplacementsCountedOnce())
    outcome = _cycle(OVERSOLD.read_text(), engine)
    assert outcome["pods"]["default/serve"]["status"] == "Pending"
    assert outcome["pods"]["default/train"]["status"] == "Running"




def test_granting_quotas_in_full_changes_only_a_short_parent_and_never_the_over_quota_rest() -> None:
    def q(name: str, quota: int, priority: int = 100, parent: str = "") -> QueueInput:
        return QueueInput(name=name, uid=name, parent=parent, priority=priority, created_ns=0, quota=quota,
                          over_quota_weight=1, limit=-1, allocated=0, pending=10_000)

    short = [q("a", 6000), q("b", 5000, priority=200)]
    assert {n: s.fair_share for n, s in divide(8000, short, 1000).items()} == {"a": 3000, "b": 5000}  # by priority
    assert {n: s.fair_share for n, s in divide(8000, short, 1000, quota_granted=True).items()} == \
        {"a": 6000, "b": 5000}
    unlimited = [q("a", -1), q("b", 5000)]  # KAI: an unlimited quota deserves the whole, no more
    assert {n: s.fair_share for n, s in divide(8000, unlimited, 1000, quota_granted=True).items()} == \
        {"a": 8000, "b": 5000}
    roomy = [q("a", 2000), q("b", 3000), q("d", 1000, parent="a")]
    assert divide(16_000, roomy, 1000) == divide(16_000, roomy, 1000, quota_granted=True)


# -- a gang this cycle places back at its minimum is not stale -------------------------------------

PLACED_AGAIN = SCENARIOS / "v10-gang-placed-again-is-not-stale.yaml"
PLACED_AGAIN_KAI_CASES = ("consolidate gang job to be able to allocate pending job",
                          "Full subgroup allocate then evict")


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_gang_this_cycle_makes_whole_again_is_not_evicted_as_stale(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(_cycle(PLACED_AGAIN.read_text(), engine), expectations(PLACED_AGAIN))
    without(monkeypatch, "kai-es/v10", "staleness", SubGroupStaleness())
    outcome = _cycle(PLACED_AGAIN.read_text(), engine)
    assert outcome["pods"]["default/trainer-0"]["status"] == "Releasing"
    assert _evictions(outcome)["default/trainer-0"]["action"] == "stalegangeviction"


def test_a_gang_still_short_after_the_cycles_placements_is_evicted_as_before() -> None:
    """Only one of the two waiting pods fits: the gang stays below its minimum and is stale."""
    text = PLACED_AGAIN.read_text().replace('metadata: {name: node-b}\nstatus: {allocatable: {cpu: "64", memory: 512Gi, '
                                            'nvidia.com/gpu: "2"}}', 'metadata: {name: node-b}\nstatus: {allocatable: '
                                            '{cpu: "64", memory: 512Gi, nvidia.com/gpu: "1"}}')
    assert text != PLACED_AGAIN.read_text()
    outcome = _cycle(text)
    assert _evictions(outcome)["default/trainer-0"]["action"] == "stalegangeviction"


# -- a queue's limit judged with the victims taken ------------------------------------------------

WITHIN_LIMIT = SCENARIOS / "v10-preempt-within-queue-limit.yaml"
WITHIN_LIMIT_KAI_CASES = ("try to allocate interactive after train when over-quota",)
_TRAIN_4 = """  name: train-1
  namespace: default
  labels: {kai.scheduler/queue: research}
spec:
  schedulerName: kai-scheduler
  priorityClassName: train
  nodeName: node-a
  containers: [{name: c, resources: {requests: {nvidia.com/gpu: "4"}}}]
status: {phase: Running}
"""


def _two_trainings(build_gpus: int) -> str:
    """The scenario with two 2-GPU trainings (train-1 older) in place of the 4-GPU one."""
    text = WITHIN_LIMIT.read_text()
    two = "---\napiVersion: v1\nkind: Pod\nmetadata:\n".join(
        _TRAIN_4.replace("train-1", name).replace('nvidia.com/gpu: "4"', 'nvidia.com/gpu: "2"')
        for name in ("train-1", "train-2"))
    assert _TRAIN_4 in text
    return text.replace(_TRAIN_4, two).replace(
        'priorityClassName: build\n  containers: [{name: c, resources: {requests: {nvidia.com/gpu: "4"}}}]',
        f'priorityClassName: build\n  containers: [{{name: c, resources: {{requests: {{nvidia.com/gpu: "{build_gpus}"}}}}}}]')


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_job_at_its_queues_limit_preempts_its_own_queue_to_get_under_it(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(_cycle(WITHIN_LIMIT.read_text(), engine), expectations(WITHIN_LIMIT))
    assert _evictions(_cycle(WITHIN_LIMIT.read_text(), engine))["default/train-1"]["action"] == "preempt"
    without(monkeypatch, "kai-es/v10", "queue_limits", LimitsBeforeSearchV9())
    outcome = _cycle(WITHIN_LIMIT.read_text(), engine)
    assert outcome["pods"]["default/build-1"]["status"] == "Pending"
    assert outcome["pods"]["default/train-1"]["status"] == "Running"


def test_the_search_takes_victims_until_the_limit_holds_and_no_more() -> None:
    """Two 2-GPU trainings: a 4-GPU build job needs both gone to be under the limit of 4 (the
    idle GPUs alone would fit it); a 2-GPU one needs one, the newer (KAI's victim order)."""
    both = _cycle(_two_trainings(4))
    assert {k: v["status"] for k, v in both["pods"].items()} == {
        "default/build-1": "Binding", "default/train-1": "Releasing", "default/train-2": "Releasing"}
    one = _cycle(_two_trainings(2))
    assert {k: v["status"] for k, v in one["pods"].items()} == {
        "default/build-1": "Binding", "default/train-1": "Running", "default/train-2": "Releasing"}


def test_no_victim_of_another_queue_brings_a_job_under_its_own_queues_limit() -> None:
    """research's limit is taken by a training of its own, of the waiting training's priority;
    another runs in queue production: reclaiming it would free GPUs but not research's limit, so
    nothing is evicted and the waiting job is told the limit holds it."""
    other = _TRAIN_4.replace("train-1", "other-1").replace("kai.scheduler/queue: research",
                                                           "kai.scheduler/queue: production")
    mine = _TRAIN_4.replace("train-1", "research-run")
    text = WITHIN_LIMIT.read_text().replace(_TRAIN_4, other + "---\napiVersion: v1\nkind: Pod\nmetadata:\n" + mine)
    # the waiting job a training too: no quota to guard, and no lower priority to preempt in research
    text = text.replace("priorityClassName: build", "priorityClassName: train")
    text += "---\napiVersion: scheduling.run.ai/v2\nkind: Queue\nmetadata: {name: production}\n"
    outcome = _cycle(text)
    assert {k: v["status"] for k, v in outcome["pods"].items()} == {
        "default/build-1": "Pending", "default/other-1": "Running", "default/research-run": "Running"}
    assert not _evictions(outcome)
    reasons = _reasons(outcome, "default/build-1")
    # the limit first (said by allocate, not again); then what each action found, as KAI's
    # actions search without judging the limit first
    assert [r["code"] for r in reasons] == ["QueueLimit", "ReclaimNotPossible", "PreemptNotPossible"]
    assert "limit 4 GPU" in reasons[0]["message"] and "lower priority than 50" in reasons[2]["message"]


# -- a victim's surplus keeps each sub-group's minimum ---------------------------------------------

PER_SUBGROUP = SCENARIOS / "v10-elastic-surplus-per-subgroup.yaml"
PER_SUBGROUP_KAI_CASES = ("Elastic eviction from PodSet above minAvailable, allocate pending in same job",
                          "Nested SubGroupSets - elastic eviction from deep branch",
                          "Multiple elastic PodSets in sibling branches")


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_victims_surplus_keeps_each_subgroups_minimum(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(_cycle(PER_SUBGROUP.read_text(), engine), expectations(PER_SUBGROUP))
    without(monkeypatch, "kai-es/v10", "elastic_surplus", SurplusAboveMinMemberV9())
    outcome = _cycle(PER_SUBGROUP.read_text(), engine)
    assert outcome["pods"]["default/evaluator"]["status"] == "Releasing"  # its set left empty
    assert outcome["pods"]["default/worker-1"]["status"] == "Running"


# -- queues ordered by their share of what they may allocate ---------------------------------------

BY_ALLOCATABLE = SCENARIOS / "v10-queue-order-by-allocatable-share.yaml"
BY_ALLOCATABLE_KAI_CASES = ("1 build job pending for each queue with different share",
                            "Over provisioning with over quota, many queues to few GPUs")


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_queues_are_ordered_by_their_share_of_what_they_may_allocate(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(_cycle(BY_ALLOCATABLE.read_text(), engine), expectations(BY_ALLOCATABLE))
    without(monkeypatch, "kai-es/v10", "queue_order", KaiQueueOrder())
    outcome = _cycle(BY_ALLOCATABLE.read_text(), engine)
    assert outcome["pods"]["default/research-build"]["status"] == "Binding"  # the older queue
    assert outcome["pods"]["default/product-build"]["status"] == "Pending"


def test_the_allocatable_share_is_kais() -> None:
    """max(quota, fair share) within the limit; an unlimited quota: the limit, else the whole."""
    cap = (8000, 64_000, 2**40)
    assert allocatable_share((1000, -1, 0), (-1, -1, -1), (1000, 5000, 7), cap) == (1000, 64_000, 7)
    assert allocatable_share((2000, 4000, 10), (1500, -1, 5), (1000, 6000, 20), cap) == (1500, 6000, 5)
    assert allocatable_share((-1, -1, -1), (3000, -1, 2**200), (0, 0, 0), cap) == (3000, 64_000, 2**200)
    big = 2**128
    assert allocatable_share((big, big, big), (-1, -1, -1), (big * 2, 0, 1), cap) == (big * 2, big, big)


@pytest.mark.parametrize(("name", "rule", "old"), [
    *((name, "queue_order", KaiQueueOrder()) for name in BY_ALLOCATABLE_KAI_CASES),
    *((name, "fair_share_division", ReplacementsCountedOnce()) for name in OVERSOLD_KAI_CASES),
    *((name, "elastic_surplus", SurplusAboveMinMemberV9()) for name in PER_SUBGROUP_KAI_CASES),
    *((name, "staleness", SubGroupStaleness()) for name in PLACED_AGAIN_KAI_CASES),
    *((name, "queue_limits", LimitsBeforeSearchV9()) for name in WITHIN_LIMIT_KAI_CASES),
], ids=lambda v: v[:40] if isinstance(v, str) else type(v).__name__)
def test_kais_integration_cases_need_v10s_rules(name: str, rule: str, old: object,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The KAI cases (tests/test_kai_rounds.py) v9 decided otherwise converge under v10 and
    not with v9's rule in place of v10's."""
    case, = (c for c in rounds.CASES if name in c.kai_test)
    rounds.test_the_cycles_converge_where_kais_integration_test_expects_and_stay(case, "native")
    without(monkeypatch, "kai-es/v10", rule, old)
    with pytest.raises(AssertionError):
        rounds.test_the_cycles_converge_where_kais_integration_test_expects_and_stay(case, "native")
