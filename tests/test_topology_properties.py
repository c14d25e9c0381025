"""Topology-aware placement (kai-es/v5) over generated clusters, checked by an oracle that reads
only the cycle's outcome and the nodes' labels:

- after one cycle of every action (allocate, consolidation, reclaim, preempt,
  stalegangeviction), the pods of a job (or sub-group) with a required topology level that
  hold a node — running and not evicted, moved (to the node the eviction names), binding or
  pipelined — are all in one domain of that level, on nodes that have the level's labels;
- both packers decide the same;
- under kai-es/v4 the same clusters still place constrained gangs across domains sometimes
  (the property is the feature's, not the generator's).
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.packing import load_packer

LEVELS = ["topology.kubernetes.io/zone", "example.com/rack"]
MOVED = re.compile(r"^moved from node \S+ to node (\S+) instead of evicted")


def _pod(name: str, gpu: int, *, group: str = "", subgroup: str = "", queue: str = "q", node: str = "",
         priority: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "labels": {"kai.scheduler/queue": queue}}
    if group:
        meta["annotations"] = {"pod-group-name": group}
    if subgroup:
        meta["labels"]["kai.scheduler/subgroup-name"] = subgroup
    spec: dict[str, Any] = {"schedulerName": "kai-scheduler",
                            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpu)}}}]}
    if priority:
        spec["priorityClassName"] = priority
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if node:
        spec["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return pod


def _constraint(required: int | None, preferred: int | None) -> dict[str, str]:
    out = {"topology": "t"}
    if required is not None:
        out["requiredTopologyLevel"] = LEVELS[required]
    if preferred is not None:
        out["preferredTopologyLevel"] = LEVELS[preferred]
    return out


@st.composite
def clusters(draw: Any) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]], dict[str, int]]:
    """(documents without the Scenario one, node -> labels, group -> required level index)."""
    docs: list[dict[str, Any]] = [
        {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": "t"},
         "spec": {"levels": [{"nodeLabel": key} for key in LEVELS]}},
        {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"}},
        {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "other"},
         "spec": {"resources": {"gpu": {"quota": 0}}}},
    ]
    labels: dict[str, dict[str, str]] = {}
    free: dict[str, int] = {}
    for i in range(draw(st.integers(2, 7))):
        name = f"n{i}"
        node_labels: dict[str, str] = {}
        zone = draw(st.sampled_from(["a", "b", None]))
        if zone is not None:
            node_labels[LEVELS[0]] = zone
        rack = draw(st.sampled_from(["r1", "r2", None]))
        if rack is not None:
            node_labels[LEVELS[1]] = rack
        gpus = draw(st.integers(1, 4))
        labels[name], free[name] = node_labels, gpus
        docs.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels},
                     "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus)}}})
    nodes = sorted(labels)
    for i in range(draw(st.integers(0, 8))):  # running fillers: victims, obstacles, movable pods
        node = draw(st.sampled_from(nodes))
        gpus = draw(st.integers(1, 2))
        if free[node] < gpus:
            continue
        free[node] -= gpus
        docs.append(_pod(f"run-{i}", gpus, node=node, queue=draw(st.sampled_from(["q", "q", "other"])),
                         priority=draw(st.sampled_from(["train", "train", "build"]))))
    required: dict[str, int] = {}
    labelled = [n for n in nodes if len(labels[n]) == 2]
    if labelled and draw(st.booleans()):  # a constrained job already running, with elastic pods pending
        node = draw(st.sampled_from(labelled))
        if free[node]:
            free[node] -= 1
            docs.append({"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                         "metadata": {"name": "grow", "namespace": "default"},
                         "spec": {"minMember": 1, "queue": "q", "priorityClassName": "train",
                                  "topologyConstraint": _constraint(1, None)}})
            docs.append(_pod("grow-0", 1, group="grow", node=node))
            for j in range(1, draw(st.integers(2, 4))):
                docs.append(_pod(f"grow-{j}", 1, group="grow"))
            required["grow"] = 1
    for g in range(draw(st.integers(1, 3))):
        name = f"g{g}"
        req = draw(st.sampled_from([0, 1, None]))
        pref = draw(st.sampled_from([None, 1] if req is None or req == 1 else [None, 0, 1]))
        if req is None and pref is None:
            req = 1
        spec: dict[str, Any] = {"queue": draw(st.sampled_from(["q", "other"])),
                                "priorityClassName": draw(st.sampled_from(["train", "build", "inference"])),
                                "topologyConstraint": _constraint(req, pref)}
        if req is not None:
            required[name] = req
        if draw(st.booleans()):  # two sub-groups, each bound to a rack
            spec["subGroups"] = [
                {"name": sg, "minMember": draw(st.integers(1, 2)),
                 "topologyConstraint": _constraint(1, None)} for sg in ("x", "y")]
            for sg in ("x", "y"):
                required[f"{name}/{sg}"] = 1
                for j in range(draw(st.integers(1, 2))):
                    docs.append(_pod(f"{name}-{sg}-{j}", draw(st.integers(1, 2)), group=name, subgroup=sg))
            docs.insert(3, {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                            "metadata": {"name": name, "namespace": "default"}, "spec": spec})
        else:
            size = draw(st.integers(1, 4))
            spec["minMember"] = draw(st.integers(1, size))
            docs.insert(3, {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                            "metadata": {"name": name, "namespace": "default"}, "spec": spec})
            for j in range(size):
                docs.append(_pod(f"{name}-{j}", draw(st.integers(1, 2)), group=name))
    return docs, labels, required


def _run(docs: list[dict[str, Any]], policy: str, engine: str) -> dict[str, Any]:
    scenario = {"apiVersion": "kai-es.io/v1alpha1", "kind": "Scenario", "metadata": {"name": "topo"},
                "spec": {"scheduler": {"policyVersion": policy,
                                       "actions": ["allocate", "consolidation", "reclaim", "preempt",
                                                   "stalegangeviction"]}}}
    return one_cycle(load_scenario_text(yaml.safe_dump_all([scenario, *docs])), load_packer(engine))  # type: ignore[arg-type]


def _holding(outcome: dict[str, Any]) -> dict[str, str]:
    """pod name -> the node it holds after the cycle."""
    moved: dict[str, str] = {}
    for d in outcome["decisions"]:
        if d["type"] == "kai.scheduler.pod.evictiondecided":
            found = MOVED.match(d["data"].get("reason", ""))
            if found:
                moved[d["data"]["name"]] = found.group(1)
    out = {}
    for key, pod in outcome["pods"].items():
        name = key.split("/")[1]
        if name in moved:
            out[name] = moved[name]
        elif pod["status"] in ("Running", "Binding", "Pipelined") and pod["node"]:
            out[name] = pod["node"]
    return out


def _spans(outcome: dict[str, Any], labels: dict[str, dict[str, str]], required: dict[str, int]) -> list[str]:
    """The groups whose holding pods are not all in one domain of their required level."""
    holding = _holding(outcome)
    bad = []
    for group, level in sorted(required.items()):
        prefix = group.replace("/", "-") + "-"
        nodes = {node for name, node in holding.items() if name.startswith(prefix)}
        domains = {tuple(labels[n].get(key) for key in LEVELS[: level + 1]) for n in nodes}
        if len(domains) > 1 or any(None in d for d in domains):
            bad.append(f"{group}: {sorted(nodes)} in {sorted(domains, key=str)}")
    return bad


@given(clusters())
@settings(max_examples=150)
def test_no_constrained_group_spans_two_domains_of_its_required_level(case: Any) -> None:
    docs, labels, required = case
    native = _run(docs, "kai-es/v5", "native")
    assert _spans(native, labels, required) == []
    assert _run(docs, "kai-es/v5", "reference") == native


def test_the_generator_finds_spanning_gangs_without_the_feature() -> None:
    """The oracle is not vacuous: under kai-es/v4 (constraints ignored) some generated cluster
    places a constrained gang across two racks."""
    found: list[list[str]] = []

    @given(clusters())
    @settings(max_examples=300)
    def probe(case: Any) -> None:
        if not found:
            docs, labels, required = case
            spans = _spans(_run(docs, "kai-es/v4", "native"), labels, required)
            if spans:
                found.append(spans)

    probe()
    assert found
