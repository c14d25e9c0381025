"""The informer's podgrouper cache (kai_es/adapters/kubernetes/group_cache.py): a pod is grouped
again only when something the podgrouper reads changed, and the informer appends exactly the
events it appends without the cache."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.kubernetes import group_cache as gc
from kai_es.adapters.kubernetes.grouping import PodGroupingSource
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events.codec import encode
from kai_es.ingest import podgrouper as pg
from kai_es.ports import ObjectChange, Relist
from tests.builders import MakePod, ScriptedSource

Change = ObjectChange | Relist


def _pod(name: str, uid: str, *, owner: dict[str, Any] | None = None, rv: str = "1", **labels: str) -> dict[str, Any]:
    make = MakePod(name, queue=None).gpu(1)
    for k, v in labels.items():
        make = make.label(k, v)
    obj = make.obj()
    obj["metadata"].update(uid=uid, namespace="ns", resourceVersion=rv,
                           managedFields=[{"manager": "kubectl", "operation": "Update"}])
    obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    if owner is not None:
        obj["metadata"]["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                               "name": owner["metadata"]["name"],
                                               "uid": owner["metadata"]["uid"], "controller": True}]
    return obj


def _job(rv: str, min_member: str, queue: str = "team") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "etl", "uid": "j1", "namespace": "ns", "resourceVersion": rv,
                         "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"kai.scheduler/queue": queue},
                         "annotations": {"kai.scheduler/batch-min-member": min_member}},
            "spec": {"parallelism": 4}}


def _bound(obj: dict[str, Any], node: str, rv: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["spec"]["nodeName"] = node
    out["metadata"]["resourceVersion"] = rv
    return out


def _running(obj: dict[str, Any], rv: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["status"] = {"phase": "Running", "startTime": "2026-01-01T00:01:00Z",
                     "conditions": [{"type": "Ready", "status": "True"}]}
    out["metadata"]["resourceVersion"] = rv
    out["metadata"]["managedFields"] = [{"manager": "kubelet", "operation": "Update", "subresource": "status"}]
    return out


# -- what the podgrouper reads -----------------------------------------------------------------

def _corpus() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    job = _job("7", "2")
    bare = _pod("bare", "u1", **{"kai.scheduler/queue": "q", "kai.scheduler/node-pool": "pool-a"})
    bare["metadata"]["annotations"]["kai.scheduler/preemption-delay"] = "30s"
    return [(bare, []), (_pod("owned", "u2", owner=job), [job]),
            (_pod("named", "u3"), [])]


@pytest.mark.parametrize("case", range(3))
def test_the_podgrouper_never_reads_what_the_cache_key_leaves_out(case: int) -> None:
    """Status, resourceVersion and managedFields (and, for a pod without owners, its node)
    change nothing the podgrouper answers: `inputs` may leave them out."""
    obj, chain = _corpus()[case]
    if case == 2:
        obj["metadata"]["annotations"]["pod-group-name"] = "mine"
    before = pg.group_pod(obj, chain)
    changed = _running(obj, "99")
    if not chain:
        changed = _bound(changed, "node-9", "100")
    after = pg.group_pod(changed, chain)
    if before is None or after is None:
        assert before is None and after is None
        return
    assert after.podgroup == before.podgroup and after.subgroup == before.subgroup
    assert after.pod["metadata"]["annotations"] == before.pod["metadata"]["annotations"]
    assert after.pod["metadata"]["labels"] == before.pod["metadata"]["labels"]
    assert gc.inputs(obj, chain, {}, 0) == gc.inputs(changed, chain, {}, 0)


def test_the_cache_key_holds_what_the_podgrouper_reads() -> None:
    job = _job("7", "2")
    obj = _pod("owned", "u2", owner=job)
    key = gc.inputs(obj, [job], {}, 0)
    relabelled = copy.deepcopy(obj)
    relabelled["metadata"]["labels"]["kai.scheduler/queue"] = "other"
    assert gc.inputs(relabelled, [job], {}, 0) != key
    assert gc.inputs(_bound(obj, "n1", "2"), [job], {}, 0) != key  # an owned pod: its node may matter (LWS)
    assert gc.inputs(obj, [_job("8", "2")], {}, 0) != key  # the owner was written
    assert gc.inputs(obj, [job], {}, 1) != key  # the live-pod index changed
    assert gc.inputs(obj, [job], {("RayCluster", "c"): _job("9", "1")}, 0) != key
    typed = copy.deepcopy(obj)
    typed["spec"]["priority"] = True  # `true` is not `1`, though Python says they are equal
    obj["spec"]["priority"] = 1
    assert gc.inputs(typed, [job], {}, 0) != gc.inputs(obj, [job], {}, 0)
    assert gc.inputs({"metadata": {"name": object()}}, [], {}, 0) is None  # not JSON: not cached


# -- the grouping source with and without the cache ----------------------------------------------

class _Owners:
    """A Reader whose Job can be rewritten between batches."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.reads = 0

    async def __call__(self, api_version: str, kind: str, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        self.reads += 1
        if kind == "Job" and name == self.job["metadata"]["name"]:
            return 200, copy.deepcopy(self.job)
        return 404, {"message": "not found", "details": {"name": name}}


def _script() -> tuple[list[ObjectChange], list[list[Change]], list[dict[str, Any]]]:
    """A cluster's watch: bare pods bound and running, relabelled, deleted; pods of a Job that
    is rewritten (its queue and minimum change) while its pods run; a relist. Also returns the
    Job's versions, to be swapped into the reader before the batch of the same index."""
    v1, v2 = _job("10", "2", queue="team"), _job("20", "3", queue="team-b")
    a, b = _pod("a", "ua", **{"kai.scheduler/queue": "q"}), _pod("b", "ub")
    w1, w2 = _pod("w1", "uw1", owner=v1), _pod("w2", "uw2", owner=v1)
    relabelled = _running(_bound(a, "n1", "3"), "4")
    relabelled["metadata"]["labels"]["kai.scheduler/queue"] = "q2"
    batches: list[list[Change]] = [
        [ObjectChange("Pod", "ADDED", w1)],
        [ObjectChange("Pod", "MODIFIED", _bound(a, "n1", "2")), ObjectChange("Pod", "MODIFIED", _bound(w1, "n1", "5"))],
        [ObjectChange("Pod", "MODIFIED", _running(_bound(a, "n1", "2"), "3")),
         ObjectChange("Pod", "MODIFIED", _running(_bound(w1, "n1", "5"), "6"))],
        # the Job is rewritten; a new pod of it reads it afresh (ADDED), the running one is
        # then changed (status only): its inputs changed (the owner), so it is grouped again
        [ObjectChange("Pod", "ADDED", w2)],
        [ObjectChange("Pod", "MODIFIED", _running(_running(_bound(w1, "n1", "5"), "6"), "7"))],
        [ObjectChange("Pod", "MODIFIED", relabelled), ObjectChange("Pod", "DELETED", b)],
        [Relist("Pod", (relabelled, w2))],
        [ObjectChange("Pod", "MODIFIED", _running(relabelled, "9"))],
    ]
    jobs = [v1, v1, v1, v2, v2, v2, v2, v2]
    return [ObjectChange("Pod", "ADDED", a), ObjectChange("Pod", "ADDED", b)], batches, jobs


class _Swapping(ScriptedSource):
    def __init__(self, initial: list[ObjectChange], batches: list[list[Change]], jobs: list[dict[str, Any]],
                 reader: _Owners) -> None:
        super().__init__(initial, batches)
        self.jobs = jobs
        self.reader = reader

    async def changes(self):  # type: ignore[no-untyped-def]
        for batch, job in zip(self.batches, self.jobs, strict=True):
            self.reader.job = job
            yield batch


async def _run(cache: bool) -> tuple[list[list[Change]], list[bytes], PodGroupingSource]:
    initial, batches, jobs = _script()
    reader = _Owners(jobs[0])
    source = PodGroupingSource(_Swapping(initial, batches, jobs, reader), None, reader=reader,
                               owner_ttl_s=0.0, cache_groups=cache)
    shaped: list[list[Change]] = [list(await source.list_objects())]
    shaped += [list(b) async for b in source.changes()]
    # the informer over the same watch: the appended events, byte for byte
    log = MemoryEventLog()
    reader2 = _Owners(jobs[0])
    from kai_es.services.informer import InformerService  # noqa: PLC0415
    informer = InformerService(log, PodGroupingSource(_Swapping(initial, batches, jobs, reader2), None,
                                                      reader=reader2, owner_ttl_s=0.0, cache_groups=cache),
                               SimClock(1_000), SeededIds("t"), memo_pods=cache)
    await informer.run()
    return shaped, [encode(r.envelope) for r in [r async for r in log.read()]], source


async def test_the_informer_appends_the_same_events_with_and_without_the_cache() -> None:
    """The podgrouper's cache and the pods' translation memo (kai_es/ingest/pod_memo.py) on,
    then off: the same changes, the same log."""
    plain_shaped, plain_log, _ = await _run(cache=False)
    cached_shaped, cached_log, source = await _run(cache=True)
    assert cached_shaped == plain_shaped
    assert cached_log == plain_log
    assert source.group_cache is not None and source.group_cache.hits >= 3  # it did skip the podgrouper
    assert len(source.group_cache) == 2  # a relisted pod set: only the live pods keep an entry


async def test_a_running_pod_follows_its_rewritten_owner() -> None:
    """w1 runs while its Job is rewritten (queue team -> team-b, minimum 2 -> 3): its next
    change regroups it (the cache's key holds the owner's version)."""
    shaped, _, _ = await _run(cache=True)
    groups = [c.obj for batch in shaped for c in batch
              if isinstance(c, ObjectChange) and c.kind == "PodGroup" and c.obj["metadata"]["name"] == "pg-etl-j1"]
    assert [(g["spec"]["queue"], g["spec"]["minMember"]) for g in groups] == [("team", 2), ("team-b", 3)]  # type: ignore[index]
    # the pod passed on after the rewrite: still in the Job's group, with its new status
    w1 = [c.obj for c in shaped[5] if isinstance(c, ObjectChange) and c.kind == "Pod"]
    assert w1 and w1[0]["metadata"]["annotations"]["pod-group-name"] == "pg-etl-j1"  # type: ignore[index]
    assert w1[0]["status"]["phase"] == "Running"  # type: ignore[index]


def test_the_cache_answers_only_for_equal_inputs() -> None:
    cache = gc.GroupCache()
    cache.put(("ns", "a"), b"k1", gc.Answer({"metadata": {"name": "g"}}, "sg"))
    assert cache.get(("ns", "a"), b"k2") is gc.MISS
    assert cache.get(("ns", "a"), b"k1") == gc.Answer({"metadata": {"name": "g"}}, "sg")
    cache.drop(("ns", "a"))
    assert cache.get(("ns", "a"), b"k1") is gc.MISS
    cache.put(("ns", "a"), b"k", gc.Answer(None))
    cache.put(("ns", "b"), b"k", gc.Answer(None))
    cache.keep_only([("ns", "b")])
    assert len(cache) == 1 and cache.get(("ns", "b"), b"k") == gc.Answer(None)


@pytest.mark.parametrize("hostile", [
    lambda o: o["metadata"].__setitem__("labels", ["kai.scheduler/queue"]),
    lambda o: o["metadata"].__setitem__("annotations", "pod-group-name"),
    lambda o: o["metadata"].__setitem__("ownerReferences", [{"kind": "Job"}]),
    lambda o: o.__setitem__("spec", None),
    lambda o: o["metadata"].__setitem__("name", 7),
])
async def test_a_broken_change_is_handled_as_without_the_cache(hostile: Any) -> None:
    """A change the podgrouper refuses (or that is no pod of ours) in the middle of a pod's
    life comes out as without the cache, and so does the next, sound one."""
    obj = _pod("a", "ua")
    broken = _running(obj, "3")
    hostile(broken)
    batches: list[list[Change]] = [[ObjectChange("Pod", "MODIFIED", _bound(obj, "n1", "2"))],
                                   [ObjectChange("Pod", "MODIFIED", broken)],
                                   [ObjectChange("Pod", "MODIFIED", _running(_bound(obj, "n1", "2"), "4"))]]
    outs = []
    for cache in (False, True):
        source = PodGroupingSource(ScriptedSource([ObjectChange("Pod", "ADDED", obj)], batches), None,
                                   cache_groups=cache)
        outs.append([list(await source.list_objects())] + [list(b) async for b in source.changes()])
    assert outs[0] == outs[1]
