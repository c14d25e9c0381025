"""The CRDs of deploy/crds/ refuse at admission, on the real apiserver, what kai-es's ingest
refuses anyway — so `kubectl apply` of a bad Queue, PodGroup or Topology fails with the reason —
and nothing kai-es accepts: each object below is sent to the apiserver and to
`kai_es.ingest.translate`, and the two must agree."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

from kai_es.ingest import translate as tr
from tests.k8s.conftest import K8s
from tests.k8s.helpers import raw


def _queue(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def _podgroup(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": f"pg-{uuid.uuid4().hex[:8]}"}, "spec": {"queue": "q", **spec}}


def _topology(levels: list[dict[str, Any]] | None) -> dict[str, Any]:
    spec = {} if levels is None else {"levels": levels}
    return {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
            "metadata": {"name": f"t-{uuid.uuid4().hex[:8]}"}, "spec": spec}


def gpu(**fields: Any) -> dict[str, Any]:
    return {"resources": {"gpu": fields}}


#: a Queue naming itself as parent passes kai-es's ingest but never runs a job: the cycle holds
#: its jobs with QueueLoop naming the chain (tests/test_adversarial_objects.py), as for loops no
#: single object shows; the CRD refuses this one at once
HELD_BY_THE_CYCLE = frozenset({"its own parent"})

#: (what, object, a fragment of the apiserver's refusal)
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("quota below -1", _queue("bad-quota", gpu(quota=-2)), "quota must be -1 (unlimited) or >= 0"),
    ("quota between -1 and 0", _queue("bad-quota-frac", gpu(quota=-0.5)), "quota must be -1"),
    ("limit below -1", _queue("bad-limit", gpu(limit=-3)), "limit must be -1 (unlimited) or >= 0"),
    ("a misspelled preemptibility", _podgroup({"minMember": 1, "preemptibility": "semi"}), "Unsupported value"),
    ("limit below quota", _queue("bad-limit-quota", gpu(quota=8, limit=4)), "limit must not be below quota"),
    ("limit below the default quota? no: 0", _queue("bad-limit-frac", gpu(quota=2.5, limit=2)), "limit must not be below quota"),
    ("a negative over-quota weight", _queue("bad-weight", gpu(overQuotaWeight=-1)), "overQuotaWeight"),
    ("a fractional over-quota weight", _queue("bad-weight-frac", gpu(overQuotaWeight=1.5)), "must be a whole number"),
    ("a unit-less min-runtime", _queue("bad-runtime", {"preemptMinRuntime": "600"}), "must be a duration"),
    ("a min-runtime in words", _queue("bad-runtime-words", {"reclaimMinRuntime": "ten minutes"}), "must be a duration"),
    ("a negative min-runtime", _queue("bad-runtime-neg", {"reclaimMinRuntime": "-5m"}), "must be a duration"),
    ("its own parent", _queue("selfish", {"parentQueue": "selfish"}), "cannot be its own parent"),
    ("minMember and minSubGroup", _podgroup({"minMember": 2, "minSubGroup": 1,
                                              "subGroups": [{"name": "a", "minMember": 1}]}),
     "mutually exclusive"),
    ("a sub-group's minMember and minSubGroup",
     _podgroup({"subGroups": [{"name": "a", "minMember": 1, "minSubGroup": 1},
                              {"name": "b", "parent": "a", "minMember": 1}]}),
     "a sub-group's minMember and minSubGroup are mutually exclusive"),
    ("minSubGroup above the direct sub-groups",
     _podgroup({"minSubGroup": 3, "subGroups": [{"name": "a"}, {"name": "b", "minMember": 1},
                                                {"name": "c", "parent": "a", "minMember": 1}]}),
     "exceeds the number of direct child sub-groups"),
    ("minSubGroup without sub-groups", _podgroup({"minSubGroup": 1}), "exceeds the number of direct child"),
    ("a negative minMember", _podgroup({"minMember": -1}), "minMember"),
    ("two sub-groups of one name", _podgroup({"subGroups": [{"name": "w", "minMember": 1},
                                                             {"name": "w", "minMember": 2}]}), "Duplicate value"),
    ("a unit-less preemption delay", _podgroup({"preemptionDelay": "30"}), "must be a duration"),
    ("a negative preemption delay", _podgroup({"preemptionDelay": "-1s"}), "must be a duration"),
    ("a staleness grace period in words", _podgroup({"stalenessGracePeriod": "never"}), "must be a duration"),
    ("a Topology without levels", _topology([]), "levels"),
    ("a Topology with a level twice", _topology([{"nodeLabel": "rack"}, {"nodeLabel": "rack"}]), "Duplicate value"),
]

#: objects kai-es reads, which the CRDs must accept
GOOD: list[tuple[str, dict[str, Any]]] = [
    ("unlimited", _queue("good-unlimited", gpu(quota=-1, limit=-1))),
    ("fractional quota, limit above", _queue("good-frac", gpu(quota=2.5, limit=3, overQuotaWeight=2))),
    ("a limit and the default quota", _queue("good-limit-only", gpu(limit=4))),
    ("a huge quota", _queue("good-huge", gpu(quota=1e20))),
    ("min-runtimes", _queue("good-runtime", {"preemptMinRuntime": "1h30m", "reclaimMinRuntime": "0",
                                            "parentQueue": "someone-else"})),
    ("days", _queue("good-days", {"reclaimMinRuntime": "2d"})),
    ("minSubGroup of direct sub-groups",
     _podgroup({"minSubGroup": 2, "subGroups": [{"name": "a"}, {"name": "b", "minMember": 1},
                                                {"name": "c", "parent": "a", "minMember": 1}]})),
    ("elastic sub-groups", _podgroup({"minMember": 0, "subGroups": [{"name": "w", "minMember": 0}]})),
    ("a never-stale gang", _podgroup({"minMember": 2, "stalenessGracePeriod": "-1s", "preemptionDelay": "5m"})),
    ("semi-preemptible (kai-es/v8)", _podgroup({"minMember": 2, "preemptibility": "semi-preemptible"})),
    ("a Topology", _topology([{"nodeLabel": "zone"}, {"nodeLabel": "rack"}])),
]


def _plural(obj: dict[str, Any]) -> tuple[str, str, str]:
    group, version = obj["apiVersion"].split("/")
    return group, version, {"Queue": "queues", "PodGroup": "podgroups", "Topology": "topologies"}[obj["kind"]]


async def _create(api: client.ApiClient, ns: str, obj: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    custom = client.CustomObjectsApi(api)
    group, version, plural = _plural(obj)
    obj = copy.deepcopy(obj)
    if obj["kind"] == "PodGroup":
        obj["metadata"]["namespace"] = ns
        return await raw(await custom.create_namespaced_custom_object(group, version, ns, plural, obj,
                                                                       _preload_content=False))
    obj["metadata"]["name"] = f"{obj['metadata']['name']}-{uuid.uuid4().hex[:6]}"
    if obj["kind"] == "Queue" and obj["spec"].get("parentQueue") == obj["metadata"]["name"].rsplit("-", 1)[0]:
        obj["spec"]["parentQueue"] = obj["metadata"]["name"]  # still its own parent under the unique name
    return await raw(await custom.create_cluster_custom_object(group, version, plural, obj, _preload_content=False))


def _ingest_refuses(obj: dict[str, Any]) -> bool:
    body = copy.deepcopy(obj)
    body["metadata"].setdefault("uid", "u")
    body["metadata"].setdefault("namespace", "d") if obj["kind"] == "PodGroup" else None
    try:
        tr.translate(body)
    except tr.IngestError:
        return True
    return False


@pytest.mark.parametrize(("what", "obj", "says"), BAD, ids=[b[0] for b in BAD])
async def test_the_apiserver_refuses_what_kai_es_refuses(k8s: K8s, what: str, obj: dict[str, Any], says: str) -> None:
    if what in HELD_BY_THE_CYCLE:
        assert obj["spec"]["parentQueue"] == obj["metadata"]["name"]
    else:
        assert _ingest_refuses(obj), f"{what}: kai-es's ingest accepts it, so the CRD must not refuse it"
    async with k8s.client() as api:
        status, out = await _create(api, k8s.namespace(), obj)
    assert status == 422, (what, status, out)
    assert says in out.get("message", ""), (what, out.get("message"))


@pytest.mark.parametrize(("what", "obj"), GOOD, ids=[g[0] for g in GOOD])
async def test_the_apiserver_accepts_what_kai_es_reads(k8s: K8s, what: str, obj: dict[str, Any]) -> None:
    assert not _ingest_refuses(obj), what
    async with k8s.client() as api:
        status, out = await _create(api, k8s.namespace(), obj)
    assert status == 201, (what, status, out.get("message"))
