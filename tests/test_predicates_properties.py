"""Properties of the placement predicates over generated clusters, checked by an oracle written
independently of `kai_es.scheduling.predicates` (plain loops over the final placement):

- no cycle ever places a pod on a node that violates its required node affinity or
  nodeSelector, a required pod affinity or anti-affinity (its own or a present pod's), a host
  port, or a scalar resource;
- arbitrary valid affinity specs (any operator, keys nodes lack, namespaces, namespace
  selectors, weights, topology keys) never make an exception escape a cycle, on either packer.
"""

from __future__ import annotations

from array import array
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.packing import load_packer

ZONES = ["a", "b"]
MODELS = ["H100", "A100"]
APPS = ["web", "db", "cache"]
TOPOLOGY_KEYS = ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "rack"]

# --- generators ------------------------------------------------------------------------------

label_values = st.sampled_from(["web", "db", "cache", "H100", "A100", "a", "b", "1", "7", "x"])
label_keys = st.sampled_from(["app", "tier", "nvidia.com/gpu.product", "topology.kubernetes.io/zone",
                              "rack", "missing"])


@st.composite
def node_requirement(draw: Any) -> dict[str, Any]:
    op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]))
    key = draw(label_keys)
    if op in ("In", "NotIn"):
        return {"key": key, "operator": op, "values": draw(st.lists(label_values, min_size=1, max_size=3))}
    if op in ("Gt", "Lt"):
        return {"key": key, "operator": op, "values": [str(draw(st.integers(-2, 9)))]}
    return {"key": key, "operator": op}


@st.composite
def label_selector(draw: Any) -> dict[str, Any]:
    sel: dict[str, Any] = {}
    if draw(st.booleans()):
        sel["matchLabels"] = {"app": draw(st.sampled_from(APPS))}
    if draw(st.booleans()):
        op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
        req: dict[str, Any] = {"key": draw(st.sampled_from(["app", "tier"])), "operator": op}
        if op in ("In", "NotIn"):
            req["values"] = draw(st.lists(st.sampled_from(APPS + ["front"]), min_size=1, max_size=2))
        sel["matchExpressions"] = [req]
    return sel


@st.composite
def pod_term(draw: Any) -> dict[str, Any]:
    term: dict[str, Any] = {"labelSelector": draw(label_selector()),
                            "topologyKey": draw(st.sampled_from(TOPOLOGY_KEYS))}
    choice = draw(st.integers(0, 3))
    if choice == 1:
        term["namespaces"] = draw(st.lists(st.sampled_from(["default", "other"]), min_size=1, max_size=2))
    elif choice == 2:
        term["namespaceSelector"] = {}
    elif choice == 3:
        term["namespaceSelector"] = {"matchLabels": {"team": draw(st.sampled_from(["x", "y"]))}}
    return term


@st.composite
def affinity(draw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        out["nodeAffinity"] = {}
        if draw(st.booleans()):
            out["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
                {"matchExpressions": draw(st.lists(node_requirement(), min_size=1, max_size=2))}
                for _ in range(draw(st.integers(1, 2)))]}
        if draw(st.booleans()):
            out["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": draw(st.integers(1, 100)),
                 "preference": {"matchExpressions": [draw(node_requirement())]}}]
    for kind in ("podAffinity", "podAntiAffinity"):
        if draw(st.integers(0, 2)) == 0:
            block: dict[str, Any] = {}
            if draw(st.booleans()):
                block["requiredDuringSchedulingIgnoredDuringExecution"] = [draw(pod_term())]
            if draw(st.booleans()):
                block["preferredDuringSchedulingIgnoredDuringExecution"] = [
                    {"weight": draw(st.integers(1, 100)), "podAffinityTerm": draw(pod_term())}]
            out[kind] = block
    return out


@st.composite
def pod(draw: Any, name: str, running_on: str | None) -> dict[str, Any]:
    labels = {"kai.scheduler/queue": "q", "app": draw(st.sampled_from(APPS))}
    if draw(st.booleans()):
        labels["tier"] = draw(st.sampled_from(["front", "back"]))
    requests: dict[str, str] = {"cpu": str(draw(st.integers(0, 4))), "nvidia.com/gpu": str(draw(st.integers(0, 4)))}
    if draw(st.integers(0, 3)) == 0:
        requests["example.com/rdma"] = str(draw(st.integers(1, 3)))
    container: dict[str, Any] = {"name": "c", "resources": {"requests": requests}}
    if draw(st.integers(0, 3)) == 0:
        container["ports"] = [{"containerPort": 80, "hostPort": draw(st.sampled_from([8080, 9090])),
                               "protocol": draw(st.sampled_from(["TCP", "UDP"]))}]
    spec: dict[str, Any] = {"schedulerName": "kai-scheduler", "containers": [container]}
    aff = draw(affinity())
    if aff:
        spec["affinity"] = aff
    if draw(st.integers(0, 4)) == 0:
        spec["nodeSelector"] = {"topology.kubernetes.io/zone": draw(st.sampled_from(ZONES))}
    namespace = draw(st.sampled_from(["default", "default", "other"]))
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": namespace, "labels": labels},
                           "spec": spec}
    if running_on:
        spec["nodeName"] = running_on
        obj["status"] = {"phase": "Running"}
    return obj


@st.composite
def cluster(draw: Any) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    names = [f"n{i}" for i in range(draw(st.integers(1, 5)))]
    for name in names:
        labels = {"topology.kubernetes.io/zone": draw(st.sampled_from(ZONES)),
                  "nvidia.com/gpu.product": draw(st.sampled_from(MODELS)), "rack": str(draw(st.integers(0, 9)))}
        alloc = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8"}
        if draw(st.booleans()):
            alloc["example.com/rdma"] = str(draw(st.integers(0, 4)))
        docs.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                     "status": {"allocatable": alloc}})
    docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other", "labels": {"team": "x"}}})
    docs.append({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"}})
    # running pods are placed by the oracle-clean rule "at most one per node", so the start is legal
    running = draw(st.lists(st.sampled_from(names), max_size=len(names), unique=True))
    for i, node in enumerate(running):
        obj = draw(pod(f"run-{i}", node))
        obj["spec"]["containers"][0].pop("ports", None)
        obj["spec"]["containers"][0]["resources"]["requests"].pop("example.com/rdma", None)
        obj["spec"].get("affinity", {}).pop("podAffinity", None)
        obj["spec"].get("affinity", {}).pop("nodeAffinity", None)
        obj["spec"].pop("nodeSelector", None)
        docs.append(obj)
    for i in range(draw(st.integers(1, 8))):
        docs.append(draw(pod(f"p-{i}", None)))
    return docs


# --- the oracle -------------------------------------------------------------------------------


def _label_req(req: dict[str, Any], labels: dict[str, str]) -> bool:
    op, key, values = req["operator"], req["key"], req.get("values", [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    try:
        have, want = int(labels[key]), int(values[0])
    except (KeyError, ValueError):
        return False
    return have > want if op == "Gt" else have < want


def _selects(sel: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if sel is None:
        return False
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    return all(_label_req(r, labels) for r in sel.get("matchExpressions") or [])


def _term_namespaces(term: dict[str, Any], own: str, ns_labels: dict[str, dict[str, str]]) -> set[str] | None:
    """None: every namespace."""
    if "namespaceSelector" in term:
        sel = term["namespaceSelector"]
        if not sel:
            return None
        chosen = {n for n, labels in ns_labels.items() if _selects(sel, labels)}
        return chosen | set(term.get("namespaces") or [])
    return set(term.get("namespaces") or []) or {own}


def check_placement(docs: list[dict[str, Any]], outcome: dict[str, Any]) -> None:
    nodes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Node"}
    ns_labels = {"default": {"kubernetes.io/metadata.name": "default"},
                 "other": {"team": "x", "kubernetes.io/metadata.name": "other"}}
    pods = {f"{d['metadata']['namespace']}/{d['metadata']['name']}": d for d in docs if d["kind"] == "Pod"}
    where = {k: v["node"] for k, v in outcome["pods"].items()
             if v["status"] in ("Running", "Binding", "Pipelined", "Releasing") and v["node"]}

    def node_labels(name: str) -> dict[str, str]:
        return {**nodes[name]["metadata"]["labels"], "kubernetes.io/hostname": name}

    def same_domain(a: str, b: str, key: str) -> bool:
        la, lb = node_labels(a), node_labels(b)
        return key in la and key in lb and la[key] == lb[key]

    used_ports: dict[str, list[tuple[int, str]]] = {}
    rdma: dict[str, int] = {}
    for key, node in where.items():
        spec = pods[key]["spec"]
        container = spec["containers"][0]
        for port in container.get("ports", []):
            entry = (port["hostPort"], port.get("protocol", "TCP"))
            assert entry not in used_ports.setdefault(node, []), f"host port {entry} twice on {node}"
            used_ports[node].append(entry)
        rdma[node] = rdma.get(node, 0) + int(container["resources"]["requests"].get("example.com/rdma", 0))
    for node, amount in rdma.items():
        have = int(nodes[node]["status"]["allocatable"].get("example.com/rdma", 0))
        assert amount <= have, f"{node}: {amount} example.com/rdma placed, {have} allocatable"
    for key, node in where.items():
        if outcome["pods"][key]["status"] in ("Running", "Releasing"):
            # placed before the cycle (Releasing: evicted or moved by it, still on its node until
            # gone, so still present for anti-affinity and ports, but no reason to come for
            # affinity: `_present_before`): the oracle judges the cycle's placements
            continue
        spec, labels, ns = pods[key]["spec"], node_labels(node), pods[key]["metadata"]["namespace"]
        for k, v in (spec.get("nodeSelector") or {}).items():
            assert labels.get(k) == v, f"{key} on {node} violates nodeSelector"
        required = (spec.get("affinity", {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution")
        if required:
            assert any(all(_label_req(r, labels) for r in t["matchExpressions"])
                       for t in required["nodeSelectorTerms"]), f"{key} on {node} violates node affinity"
        others = [(k, n) for k, n in where.items() if k != key]
        anti = (spec.get("affinity", {}).get("podAntiAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or []
        for term in anti:
            namespaces = _term_namespaces(term, ns, ns_labels)
            for other, onode in others:
                o = pods[other]
                if (namespaces is None or o["metadata"]["namespace"] in namespaces) and \
                        _selects(term["labelSelector"], o["metadata"]["labels"]):
                    assert not same_domain(node, onode, term["topologyKey"]), \
                        f"{key} on {node} and {other} on {onode} violate {key}'s anti-affinity"
        for other, onode in others:  # symmetric: the others' anti-affinity against this pod
            o = pods[other]
            for term in (o["spec"].get("affinity", {}).get("podAntiAffinity") or {}).get(
                    "requiredDuringSchedulingIgnoredDuringExecution") or []:
                namespaces = _term_namespaces(term, o["metadata"]["namespace"], ns_labels)
                if (namespaces is None or ns in namespaces) and _selects(term["labelSelector"], pods[key]["metadata"]["labels"]):
                    assert not same_domain(node, onode, term["topologyKey"]), \
                        f"{key} on {node} violates the anti-affinity of {other} on {onode}"
        aff = (spec.get("affinity", {}).get("podAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or []
        before = _present_before(key, outcome)
        matches = []
        for term in aff:
            namespaces = _term_namespaces(term, ns, ns_labels)
            matches.append([where[other] for other in before
                            if (namespaces is None or pods[other]["metadata"]["namespace"] in namespaces)
                            and _selects(term["labelSelector"], pods[other]["metadata"]["labels"])])
        if aff and not any(matches):
            # Kubernetes' exception for the first pod of a group: nothing matched anywhere when it
            # was placed, and it matches all its own terms
            assert all(_selects(t["labelSelector"], pods[key]["metadata"]["labels"]) and
                       ((_term_namespaces(t, ns, ns_labels) is None) or ns in _term_namespaces(t, ns, ns_labels))
                       for t in aff), f"{key} placed with unmet pod affinity"
            continue
        for term, matching in zip(aff, matches):
            assert any(same_domain(node, m, term["topologyKey"]) for m in matching), \
                f"{key} on {node} violates pod affinity {term}"


def _present_before(key: str, outcome: dict[str, Any]) -> list[str]:
    """Pods on nodes when `key` was placed, that may satisfy its affinity: those running at the
    start and not evicted (or moved away) by the cycle, then the cycle's placements in decision
    order up to it."""
    running = [k for k, v in outcome["pods"].items() if v["status"] == "Running" and v["node"]]
    order = [d["subject"].split("/", 1)[1] for d in outcome["decisions"]
             if d["type"] in ("kai.scheduler.pod.bindingdecided", "kai.scheduler.pod.pipelined")]
    return running + order[:order.index(key)]


# --- the properties ---------------------------------------------------------------------------


def _run(docs: list[dict[str, Any]], engine: str) -> dict[str, Any]:
    text = yaml.safe_dump_all(docs)
    return one_cycle(load_scenario_text(text, "generated"), load_packer(engine))  # type: ignore[arg-type]


@given(cluster())
def test_no_cycle_places_a_pod_against_a_required_rule(docs: list[dict[str, Any]]) -> None:
    outcome = _run(docs, "native")
    check_placement(docs, outcome)


@given(cluster(), st.sampled_from(["native", "reference"]))
def test_arbitrary_valid_affinity_never_breaks_a_cycle_and_packers_agree(docs: list[dict[str, Any]],
                                                                         engine: str) -> None:
    outcome = _run(docs, engine)
    assert outcome["decisions"][-1]["type"] == "kai.scheduler.cycle.completed"
    for pod_key, got in outcome["pods"].items():
        if got["status"] == "Pending" and not pod_key.split("/")[1].startswith("run-"):
            assert any(d["type"] == "kai.scheduler.pod.unschedulable" and d["subject"] == f"pod/{pod_key}"
                       for d in outcome["decisions"]), f"{pod_key} pending without a reason"
    assert _run(docs, "reference" if engine == "native" else "native") == outcome


@given(cluster(), st.lists(st.tuples(st.integers(0, 7), st.integers(0, 4), st.booleans()), max_size=12))
def test_affinity_counts_follow_placements_and_rollbacks_exactly(
        docs: list[dict[str, Any]], steps: list[tuple[int, int, bool]]) -> None:
    """Tentative placements and rollbacks on a Plan (through its listener) leave every
    inter-pod term count equal to a recount from scratch."""
    from kai_es.oneshot import initial_state
    from kai_es.scheduling.cycle import strategy_of
    from kai_es.scheduling.plan import Plan
    from kai_es.scheduling.policy import RULES_V1
    from kai_es.scheduling.session import Session

    scenario = load_scenario_text(yaml.safe_dump_all(docs), "generated")
    state = initial_state(scenario)
    plan = Plan(state, load_packer("native"), strategy_of(scenario.config))
    eligibility = Session(state, plan, 0, RULES_V1).eligibility
    pending = [k for k in sorted(state.pods) if state.pods[k].status == "Pending"]
    checkpoints = []
    for pod_index, node, rollback in steps:
        if rollback and checkpoints:
            plan.rollback(checkpoints.pop())
        elif pending and plan.nodes:
            key = pending[pod_index % len(pending)]
            if any(e.pod_key == key for e in plan.entries):
                continue
            spec = state.pods[key].spec
            checkpoints.append(plan.checkpoint())
            # build the pod's classes and holders first, so every later step must keep them right
            eligibility.mask(spec)
            eligibility.levels(spec, eligibility.static_mask(spec))
            mask = array("q", [0] * len(plan.nodes))
            mask[node % len(plan.nodes)] = 1
            plan.place(key, spec, mask, remember=False)
        assert eligibility.affinity.verify() == []
