"""No ping-pong: with allocate, reclaim and preempt on (and, under policy kai-es/v4's defaults,
consolidation and stale gang eviction too), random stable workloads (pods that run until
evicted, recreated when evicted, as a Job controller would) reach a fixed point in the
simulator — after convergence further cycles evict nothing — and queues never reclaim back and
forth from each other."""

from __future__ import annotations

import re
from typing import Any

import anyio
import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import payloads as p
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.packing import load_packer
from kai_es.app.simulation import simulate
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text

SETTINGS = {"scheduler": {"actions": ["allocate", "reclaim", "preempt"]},
            "simulation": {"until": "90s", "cyclePeriod": "1s"}}
#: policy kai-es/v4's default actions: allocate, consolidation, reclaim, preempt, stalegangeviction
V4_DEFAULTS = {"scheduler": {}, "simulation": SETTINGS["simulation"]}


@st.composite
def workload(draw: Any, settings_: dict[str, Any] = SETTINGS) -> str:
    docs: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        docs.append(MakeNode(f"n{i}").gpus(draw(st.sampled_from([2, 4, 8]))).obj())
    queues = [f"q{i}" for i in range(draw(st.integers(2, 3)))]
    equal = draw(st.booleans())  # half the cases: every queue alike (quota and weight)
    quota, weight = draw(st.integers(0, 4)), draw(st.integers(1, 3))
    for name in queues:
        q = queue(name, gpu_quota=quota if equal else draw(st.integers(0, 4)))
        q["spec"]["resources"]["gpu"]["overQuotaWeight"] = weight if equal else draw(st.integers(1, 3))
        docs.append(q)
    capacity = sum(int(d["status"]["allocatable"]["nvidia.com/gpu"]) for d in docs if d["kind"] == "Node")
    # one queue fills the cluster first; the others arrive later and must take back their share
    for i in range(capacity + draw(st.integers(0, 3))):
        docs.append(MakePod(f"hog{i}", queue="q0").gpu(1).priority_class("train").obj())
    for i in range(draw(st.integers(1, 10))):
        pod = MakePod(f"p{i}", queue=draw(st.sampled_from(queues))).gpu(draw(st.integers(1, 2)))
        pod = pod.priority_class(draw(st.sampled_from(["train", "train", "build"])))
        pod = pod.annotate("kai-es.io/submit-after", f"{draw(st.integers(1, 20))}s")
        docs.append(pod.obj())
    return scenario_text(*docs, settings=settings_)


@st.composite
def fragmented_workload(draw: Any) -> str:
    """Nodes filled with single-GPU pods of which some finish early, leaving free GPUs scattered
    over the nodes; then jobs bigger than any node's free GPUs arrive: what consolidation is for."""
    docs: list[dict[str, Any]] = []
    nodes = draw(st.integers(2, 4))
    sizes = [draw(st.sampled_from([4, 8])) for _ in range(nodes)]
    for i, gpus in enumerate(sizes):
        docs.append(MakeNode(f"n{i}").gpus(gpus).obj())
    queues = [f"q{i}" for i in range(draw(st.integers(1, 3)))]
    for name in queues:
        docs.append(queue(name, gpu_quota=draw(st.integers(0, 4))))
    # up to two running gangs (minMember 2 or 3) whose pods may sit on different nodes: a
    # consolidation may move some of them, and the gang must come back whole, never stale
    gangs = [(f"g{g}", draw(st.sampled_from(queues)), draw(st.integers(2, 3))) for g in range(draw(st.integers(0, 2)))]
    for name, queue_name, size in gangs:
        docs.append(podgroup(name, size, queue_name))
    members = [name for name, _, size in gangs for _ in range(size)]
    k = 0
    for i, gpus in enumerate(sizes):
        for _ in range(gpus):
            left = sum(sizes) - k  # slots left, this one included: every member gets one
            gang = members.pop(0) if members and (len(members) >= left or draw(st.booleans())) else None
            queue_name = next(q for n, q, _ in gangs if n == gang) if gang else draw(st.sampled_from(queues))
            pod = MakePod(f"r{k}", queue=queue_name).gpu(1).priority_class("train")
            if gang:
                pod = pod.group(gang)
            elif draw(st.integers(0, 2)) == 0:  # about a third finish early, leaving holes
                pod = pod.annotate("kai-es.io/run-for", f"{draw(st.integers(1, 5))}s")
            docs.append(pod.obj())
            k += 1
    for i in range(draw(st.integers(1, 6))):
        pod = MakePod(f"p{i}", queue=draw(st.sampled_from(queues))).gpu(draw(st.integers(2, 4)))
        pod = pod.priority_class(draw(st.sampled_from(["train", "train", "build"])))
        pod = pod.annotate("kai-es.io/submit-after", f"{draw(st.integers(6, 20))}s")
        docs.append(pod.obj())
    return scenario_text(*docs, settings=V4_DEFAULTS)


def _run(text: str) -> list[Any]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "pingpong.yaml"), log, load_packer("native")))
    return [r.envelope for r in log._records]  # noqa: SLF001 - the test reads the whole log


@settings(max_examples=150, deadline=None)
@given(workload())
def test_reclaim_and_preempt_converge_and_never_go_back_and_forth(text: str) -> None:
    _converges_and_never_goes_back_and_forth(text)


@settings(max_examples=100, deadline=None)
@given(st.one_of(workload(V4_DEFAULTS), fragmented_workload()))
def test_every_action_of_v4_converges_and_never_goes_back_and_forth(text: str) -> None:
    _converges_and_never_goes_back_and_forth(text)


def _converges_and_never_goes_back_and_forth(text: str, reversals: int = 0) -> None:
    """`reversals`: how often reclaim between two queues of the same quota and weight may change
    direction (0: never; a gang taken whole can leave its queue below its fair share, and it
    takes back once — a second reversal is a ping-pong)."""
    envelopes = _run(text)
    evictions = [(e.logicaltime, e.data) for e in envelopes if isinstance(e.data, p.EvictionDecided)]
    stale = [d for _, d in evictions if d.action == "stalegangeviction"]
    assert not stale, f"a gang went stale: {[(d.name, d.reason) for d in stale]}"
    event(f"reclaims: {sum(1 for _, d in evictions if d.action == 'reclaim') > 0}, "
          f"preemptions: {sum(1 for _, d in evictions if d.action == 'preempt') > 0}, "
          f"moves: {sum(1 for _, d in evictions if d.action == 'consolidation') > 0}")
    start = min(e.logicaltime for e in envelopes)
    # the last arrival is at 20 s; after 30 s more of cycles, nothing is evicted any more
    late = [data for t, data in evictions if t > start + 50 * 10**9]
    assert max(e.logicaltime for e in envelopes) <= start + 90 * 10**9
    assert late == [], f"still evicting near the end: {[(d.name, d.action, d.reason) for d in late]}"
    # two queues with the same quota and weight never reclaim back and forth
    params = {d["metadata"]["name"]: (d["spec"]["resources"]["gpu"]["quota"],
                                      d["spec"]["resources"]["gpu"]["overQuotaWeight"])
              for d in yaml.safe_load_all(text) if d and d.get("kind") == "Queue"}
    # ...unless the workload changed in between (a pod arrived or ended: the fair shares moved,
    # and an over-quota GPU split evenly may go to the other queue; a pod recreated after an
    # eviction is not a change of the workload)
    first_seen: dict[str, int] = {}
    ended: set[int] = set()
    for e in envelopes:
        if isinstance(e.data, p.PodObserved):
            first_seen.setdefault(e.data.name, e.logicaltime)
            if e.data.phase in ("Succeeded", "Failed"):
                ended.add(e.logicaltime)
    workload_changes = ended | {t for name, t in first_seen.items() if not re.search(r"-r\d+$", name)}
    last: dict[frozenset[str], tuple[tuple[str, str], int]] = {}
    changes: dict[frozenset[str], int] = {}
    for t, data in evictions:
        if data.action != "reclaim":
            continue
        way = (_reclaimer(data), data.queue)
        pair = frozenset(way)
        if params[way[0]] != params[way[1]]:
            continue
        if pair in last and last[pair][0] != way \
                and not any(last[pair][1] < at <= t for at in workload_changes):
            changes[pair] = changes.get(pair, 0) + 1
        last[pair] = (way, t)
    assert all(n <= reversals for n in changes.values()), changes
    # every eviction is for a preemptor the same cycle places, and no pod is placed twice in it
    placed: dict[int | None, list[str]] = {}
    for e in envelopes:
        if isinstance(e.data, (p.BindingDecided, p.PodPipelined)):
            placed.setdefault(e.basedon, []).append(f"{e.data.namespace}/{e.data.name}")
    assert all(len(pods) == len(set(pods)) for pods in placed.values()), placed
    pods_of_job = {}
    for e in envelopes:
        if isinstance(e.data, (p.BindingDecided, p.PodPipelined)):
            pods_of_job.setdefault((e.basedon, f"{e.data.namespace}/{e.data.podgroup}"), True)
    for e in envelopes:
        if isinstance(e.data, p.EvictionDecided) and e.data.action in ("reclaim", "preempt", "consolidation"):
            preemptor = e.data.preemptor
            assert preemptor in placed.get(e.basedon, ()) or (e.basedon, preemptor) in pods_of_job, \
                f"{e.data.name} evicted for {preemptor}, which cycle {e.basedon} did not place"


def _reclaimer(data: p.EvictionDecided) -> str:
    return data.reason.split("of queue ", 1)[1].split(" ", 1)[0]
