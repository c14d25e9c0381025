"""kai-es/v8, semi-preemptible jobs (KAI's semi-preemptible design) and victim gangs re-placed
whole: each scenario
(tests/scenarios/v8-*, written as a KAI user writes a PodGroup or labels pods) holds on both
packers and fails with the rule removed; the job's minimum shape (`rules.semi_preemptible.surplus`)
is kept by every action on random clusters; the Session's non-preemptible accounting follows
the Plan through placements, evictions and rollbacks; the value is ingested from a label or the
PodGroup and refused when misspelled; older versions decide as before."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import payloads as p
from kai_es.ingest import translate as tr
from kai_es.oneshot import one_cycle
from kai_es.replay import replay
from kai_es.scenario import load_scenario, load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.replacement import ReplaceVictims
from kai_es.scheduling.gang import surplus
from kai_es.scheduling.rules.semi_preemptible import SemiAsPreemptibleV7
from kai_es.state.model import Job, PodState
from tests.policy_patch import without
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text
from tests.test_cycle_scenarios import check, expectations
from tests.test_reclaim_convergence import _converges_and_never_goes_back_and_forth

SCENARIOS = Path(__file__).parent / "scenarios"
IN_QUOTA = SCENARIOS / "v8-semi-preemptible-core-in-quota.yaml"
NOT_RECLAIMED = SCENARIOS / "v8-semi-preemptible-core-not-reclaimed.yaml"
WHOLE_GANG = SCENARIOS / "v8-victim-gang-replaced-whole.yaml"


def _cycle(path: Path, engine: str = "native", text: str | None = None) -> dict[str, Any]:
    scenario = load_scenario(path) if text is None else load_scenario_text(text, path.name)
    return one_cycle(scenario, load_packer(engine))  # type: ignore[arg-type]


def _under(path: Path, version: str) -> str:
    text = path.read_text()
    if "scheduler: {actions: [allocate, reclaim]}" in text:
        return text.replace("scheduler: {actions: [allocate, reclaim]}",
                            f"scheduler: {{actions: [allocate, reclaim], policyVersion: {version}}}")
    scenario = ("apiVersion: kai-es.io/v1alpha1\nkind: Scenario\nmetadata: {name: x}\n"
                f"spec: {{scheduler: {{policyVersion: {version}}}}}\n---\n")
    return scenario + text.split("\napiVersion: ", 1)[0].split("# expect:")[0] + "apiVersion: " + \
        text.split("\napiVersion: ", 1)[1]


@pytest.mark.parametrize(("path", "field", "old"), [
    (IN_QUOTA, "semi_preemptible", SemiAsPreemptibleV7()),
    (NOT_RECLAIMED, "semi_preemptible", SemiAsPreemptibleV7()),
    (WHOLE_GANG, "replacement", ReplaceVictims()),
], ids=lambda v: v.stem if isinstance(v, Path) else "")
@pytest.mark.parametrize("engine", ["native", "reference"])
def test_each_scenario_needs_its_rule(path: Path, field: str, old: Any, engine: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    check(_cycle(path, engine), expectations(path))
    without(monkeypatch, "kai-es/v8", field, old)
    with pytest.raises(AssertionError):
        check(_cycle(path, engine), expectations(path))


def test_under_v7_a_semi_preemptible_job_is_a_preemptible_one() -> None:
    pods = _cycle(IN_QUOTA, text=_under(IN_QUOTA, "kai-es/v7"))["pods"]
    assert all(pods[f"default/batch-{i}"]["status"] == "Binding" for i in range(3))
    pods = _cycle(NOT_RECLAIMED, text=_under(NOT_RECLAIMED, "kai-es/v7"))["pods"]
    assert all(pods[f"default/serve-{i}"]["status"] == "Releasing" for i in range(4))
    assert all(pods[f"default/train-{i}"]["status"] == "Pipelined" for i in range(6))


def test_preempt_takes_the_extras_of_a_lower_priority_job_never_its_core() -> None:
    """Queue q: serve (train priority, semi-preemptible, minMember 2) runs 4 one-GPU pods on a
    4-GPU node; urgent (build priority) needs 2 GPUs, then big (build) 2 more: the two extras
    make room for urgent, and serve's core is not taken for big (under kai-es/v7 it is)."""
    docs: list[dict[str, Any]] = [MakeNode("n").gpus(4).obj(), queue("q"),
                                  podgroup("serve", 2, "q", preemptibility="semi-preemptible")]
    for i in range(4):
        docs.append(MakePod(f"serve-{i}", queue="q").gpu(1).priority_class("train").group("serve")
                    .running_on("n").obj())
    docs[-4]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    docs.append(MakePod("urgent", queue="q").gpu(2).priority_class("build").obj())
    docs.append(MakePod("big", queue="q").gpu(2).priority_class("build").obj())
    text = scenario_text(*docs, settings={"scheduler": {"actions": ["allocate", "preempt"]}})
    pods = one_cycle(load_scenario_text(text, "preempt.yaml"), load_packer("native"))["pods"]
    statuses = sorted(pods[f"default/serve-{i}"]["status"] for i in range(4))
    assert statuses == ["Releasing", "Releasing", "Running", "Running"], pods
    assert pods["default/urgent"]["status"] == "Pipelined"
    assert pods["default/big"]["status"] == "Pending"


# -- the minimum shape -------------------------------------------------------------------------


def _job(min_member: int, leaves: dict[str, int]) -> Job:
    subgroups = [p.SubGroup(name=name, min_member=m) for name, m in leaves.items()]
    spec = p.PodGroupObserved(namespace="d", name="j", queue="q", min_member=min_member,
                              preemptibility="semi-preemptible", subgroups=tuple(subgroups))
    return Job(key="d/j", namespace="d", name="j", spec=spec, implicit=False, semi=True)


def _pod(i: int, subgroup: str) -> PodState:
    spec = p.PodObserved(namespace="d", name=f"p{i}", uid=f"u{i}", queue="q", podgroup="j", subgroup=subgroup)
    return PodState(key=f"d/p{i}", spec=spec, job_key="d/j")


def test_a_pod_that_would_break_its_sub_group_is_kept_and_later_ones_still_go() -> None:
    job = _job(2, {"a": 2, "b": 1})
    pods = [_pod(0, "a"), _pod(1, "a"), _pod(2, "b"), _pod(3, "b"), _pod(4, "b")]
    # a's two are its minimum: skipped; b may lose two of three; the job keeps 3 >= 2
    assert [x.key for x in surplus(job, pods, pods)] == ["d/p2", "d/p3"]
    assert surplus(_job(5, {}), pods, pods) == []
    assert [x.key for x in surplus(_job(0, {}), pods, pods)] == [x.key for x in pods]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_surplus_keeps_the_minimum_shape_and_is_as_large_as_the_order_allows(data: st.DataObject) -> None:
    leaves = {name: data.draw(st.integers(0, 4)) for name in data.draw(st.sets(st.sampled_from("abc")))}
    labels = [*leaves, "", "unknown"]
    occupying = [_pod(i, data.draw(st.sampled_from(labels))) for i in range(data.draw(st.integers(0, 12)))]
    ordered = data.draw(st.permutations(occupying))[: data.draw(st.integers(0, len(occupying)))]
    job = _job(data.draw(st.integers(0, 14)), leaves)
    out = surplus(job, ordered, occupying)
    assert [x.key for x in out] == [x.key for x in ordered if x in out]  # in the given order

    def keeps(gone: list[PodState]) -> bool:
        kept = [x for x in occupying if x not in gone]
        return len(kept) >= job.min_member and all(
            sum(1 for x in kept if x.spec.subgroup == name) >= m for name, m in leaves.items())

    counts = {name: sum(1 for x in occupying if x.spec.subgroup == name) for name in leaves}
    if len(occupying) >= job.min_member and all(counts[n] >= m for n, m in leaves.items()):
        assert keeps(out)
    # greedy in the order given: no pod left out could also go
    assert not any(keeps([*out, x]) for x in ordered if x not in out and ordered.index(x) > 0
                   and len(occupying) - len(out) > job.min_member)


# -- every action keeps the core, on random clusters ---------------------------------------------


@st.composite
def semi_cluster(draw: Any) -> tuple[str, dict[str, tuple[str, int]], dict[str, int]]:
    """Nodes full of running semi-preemptible jobs (one-GPU pods) and plain ones, and pending
    jobs of every kind that want their room: (the scenario, semi job -> (queue, minMember),
    queue -> GPU quota)."""
    docs: list[dict[str, Any]] = []
    sizes = [draw(st.sampled_from([2, 4, 8])) for _ in range(draw(st.integers(1, 3)))]
    for i, gpus in enumerate(sizes):
        docs.append(MakeNode(f"n{i}").gpus(gpus).obj())
    quotas = {f"q{i}": draw(st.integers(0, 6)) for i in range(draw(st.integers(1, 3)))}
    docs += [queue(name, gpu_quota=quota) for name, quota in quotas.items()]
    semi: dict[str, tuple[str, int]] = {}
    slots = [f"n{i}" for i, gpus in enumerate(sizes) for _ in range(gpus)]
    k = 0
    for j in range(draw(st.integers(1, 3))):
        if not slots:
            break
        name, q = f"s{j}", draw(st.sampled_from(sorted(quotas)))
        size = draw(st.integers(1, min(5, len(slots))))
        m = draw(st.integers(0, size))
        semi[name] = (q, m)
        docs.append(podgroup(name, m, q, preemptibility="semi-preemptible"))
        for _ in range(size):
            docs.append(MakePod(f"{name}-{k}", queue=q).gpu(1).group(name).running_on(slots.pop(0))
                        .priority_class(draw(st.sampled_from(["train", "inference"]))).obj())
            k += 1
    for i in range(draw(st.integers(1, 6))):
        q = draw(st.sampled_from(sorted(quotas)))
        pod = MakePod(f"p{i}", queue=q).gpu(draw(st.integers(1, 4)))
        pod = pod.priority_class(draw(st.sampled_from(["train", "build", "inference"])))
        if draw(st.booleans()):
            name = f"g{i}"
            docs.append(podgroup(name, 1, q, preemptibility=draw(st.sampled_from(
                ["preemptible", "non-preemptible", "semi-preemptible"]))))
            pod = pod.group(name)
        docs.append(pod.obj())
    return scenario_text(*docs, settings={"scheduler": {}}), semi, quotas


@settings(max_examples=150, deadline=None)
@given(semi_cluster())
def test_no_action_takes_a_semi_preemptible_job_below_its_minimum(
        drawn: tuple[str, dict[str, tuple[str, int]], dict[str, int]]) -> None:
    text, semi, _ = drawn
    outcome = one_cycle(load_scenario_text(text, "semi.yaml"), load_packer("native"))
    by_job: dict[str, list[str]] = {}
    for key, pod in outcome["pods"].items():
        by_job.setdefault(key.split("/")[1].rsplit("-", 1)[0], []).append(pod["status"])
    stale = {d["data"]["podgroup"] for d in outcome["decisions"]
             if d["type"] == "kai.scheduler.pod.evictiondecided" and d["data"]["action"] == "stalegangeviction"}
    for name, (_, m) in semi.items():
        if name in stale:
            continue
        running = sum(1 for s in by_job[name] if s == "Running")
        assert running >= min(m, len(by_job[name])), (name, m, by_job[name], outcome["decisions"])


@settings(max_examples=60, deadline=None)
@given(semi_cluster())
def test_a_placed_core_fits_its_queue_s_quota(drawn: tuple[str, dict[str, tuple[str, int]], dict[str, int]]) -> None:
    """Jobs arriving semi-preemptible (one-GPU pods, flat) place their minimum within their
    queue's quota, counting what the non-preemptible and the other cores there hold."""
    text, _, quotas = drawn
    rng = random.Random(len(text))
    docs = [MakeNode("big").gpus(16).obj(), *[queue(q, gpu_quota=v) for q, v in quotas.items()]]
    arrivals: dict[str, tuple[str, int, int]] = {}
    for j in range(rng.randint(1, 5)):
        q, size = rng.choice(sorted(quotas)), rng.randint(1, 4)
        m = rng.randint(0, size)
        arrivals[f"a{j}"] = (q, m, size)
        docs.append(podgroup(f"a{j}", m, q, preemptibility="semi-preemptible"))
        for i in range(size):
            docs.append(MakePod(f"a{j}-{i}", queue=q).gpu(1).group(f"a{j}").priority_class("train").obj())
    outcome = one_cycle(load_scenario_text(scenario_text(*docs, settings={"scheduler": {}}), "q.yaml"),
                        load_packer("native"))
    core: dict[str, int] = {}
    for name, (q, m, size) in arrivals.items():
        placed = sum(1 for i in range(size) if outcome["pods"][f"default/{name}-{i}"]["status"] == "Binding")
        assert placed == 0 or placed >= m, (name, placed, m)  # a gang: its minimum or nothing
        core[q] = core.get(q, 0) + min(placed, m)
    for q, held in core.items():
        assert held <= quotas[q], (q, held, quotas[q], arrivals)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
@example(3559188)  # a gang reclaimed whole while its extra pod was placed on its own freed room: a loop
@example(9508791)  # a gang taken whole: its queue takes back once
def test_semi_preemptible_workloads_converge_and_replay(seed: int) -> None:
    """Multi-cycle: elastic gangs, semi-preemptible or not, beside single pods reach a fixed
    point (no evictions after convergence, no ping-pong, no gang left stale, every eviction's
    preemptor placed in its cycle) and the run replays byte for byte."""
    rng = random.Random(seed)
    docs: list[dict[str, Any]] = [MakeNode(f"n{i}").gpus(rng.choice([2, 4, 8])).obj() for i in range(rng.randint(1, 3))]
    queues = [f"q{i}" for i in range(rng.randint(2, 3))]
    docs += [queue(q, gpu_quota=rng.randint(0, 4)) for q in queues]
    for j in range(rng.randint(1, 3)):
        q, size = rng.choice(queues), rng.randint(2, 5)
        # elastic gangs, semi-preemptible or preemptible (kai-es/v8 re-places a victim gang whole)
        mode = rng.choice(["semi-preemptible", "preemptible"])
        docs.append(podgroup(f"s{j}", rng.randint(1, size), q, preemptibility=mode))
        for i in range(size):
            docs.append(MakePod(f"s{j}-{i}", queue=q).gpu(1).group(f"s{j}").priority_class("train").obj())
    for i in range(rng.randint(1, 8)):
        pod = MakePod(f"p{i}", queue=rng.choice(queues)).gpu(rng.randint(1, 2))
        pod = pod.priority_class(rng.choice(["train", "train", "build"]))
        docs.append(pod.annotate("kai-es.io/submit-after", f"{rng.randint(1, 20)}s").obj())
    text = scenario_text(*docs, settings={"scheduler": {}, "simulation": {"until": "90s", "cyclePeriod": "1s"}})
    # a gang victim is taken whole: it may leave its queue below its fair share, which then
    # takes back once (as KAI would); more changes of direction would be a ping-pong
    _converges_and_never_goes_back_and_forth(text, reversals=1)
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "semi.yaml"), log, load_packer("native")))
    assert replay(log._records, load_packer("native")).ok  # noqa: SLF001 - the whole log


# -- ingest ------------------------------------------------------------------------------------


def _pod_obj(**labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "x", "namespace": "d", "uid": "u", "labels": {"kai.scheduler/queue": "q", **labels}},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c"}]}}


def test_the_label_and_the_podgroup_field_are_read_and_a_misspelling_is_refused_naming_it() -> None:
    assert tr.pod(_pod_obj(**{"kai.scheduler/preemptibility": "semi-preemptible"})).preemptibility == \
        "semi-preemptible"
    with pytest.raises(tr.IngestError, match=r"preemptibility.*semi-preemptible, got 'semi'"):
        tr.pod(_pod_obj(**{"kai.scheduler/preemptibility": "semi"}))
    group: dict[str, Any] = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
             "metadata": {"name": "g", "namespace": "d", "uid": "u"},
             "spec": {"queue": "q", "minMember": 2, "preemptibility": "semi-preemptible"}}
    assert tr.podgroup(group).preemptibility == "semi-preemptible"
    group["spec"]["preemptibility"] = "Semi-Preemptible"
    with pytest.raises(tr.IngestError, match="spec.preemptibility"):
        tr.podgroup(group)
