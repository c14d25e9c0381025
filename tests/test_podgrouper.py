"""KAI-podgrouper defaults (pure), the GPU-device rules of the pod translation, and the grouping
source's bookkeeping across relists (bare pods only: no API calls)."""

from __future__ import annotations

from typing import Any

import pytest

from kai_es.adapters.kubernetes.grouping import PodGroupingSource
from kai_es.events import payloads as p
from kai_es.ingest import podgrouper as pg
from kai_es.ingest import translate as tr
from kai_es.ports import ObjectChange, Relist
from tests.builders import MakePod, ScriptedSource


def pod(name: str = "p", uid: str = "u1", **labels: str) -> dict[str, Any]:
    make = MakePod(name, queue=None).gpu(1)
    for k, v in labels.items():
        make = make.label(k, v)
    obj = make.obj()
    obj["metadata"]["uid"] = uid
    obj["metadata"]["namespace"] = "ns"
    return obj


def owner(kind: str, api: str, name: str, uid: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "uid": uid, "namespace": "ns",
                                                          "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": spec}


def test_bare_pod_is_its_own_group_with_kai_defaults() -> None:
    g = pg.group_pod(pod(), [])
    assert g is not None
    assert g.podgroup["metadata"]["name"] == "pg-p-u1"
    assert g.podgroup["spec"] == {"minMember": 1, "queue": "default-queue", "priorityClassName": "train"}
    assert g.pod["metadata"]["annotations"]["pod-group-name"] == "pg-p-u1"
    observed = tr.translate(g.podgroup)
    assert isinstance(observed, p.PodGroupObserved) and observed.min_member == 1


def test_job_deployment_and_pytorchjob_groups() -> None:
    job = owner("Job", "batch/v1", "etl", "j1")
    job["metadata"]["annotations"] = {"kai.scheduler/batch-min-member": "3"}
    g = pg.group_pod(pod(**{"kai.scheduler/queue": "team"}), [job])
    assert g is not None and g.podgroup["metadata"]["name"] == "pg-etl-j1"
    assert g.podgroup["spec"]["minMember"] == 3 and g.podgroup["spec"]["queue"] == "team"
    assert g.podgroup["metadata"]["creationTimestamp"] == "2026-01-01T00:00:00Z"

    rs, dep = owner("ReplicaSet", "apps/v1", "web-1", "r1"), owner("Deployment", "apps/v1", "web", "d1")
    g = pg.group_pod(pod("web-1-x", "u9"), [rs, dep])
    assert g is not None and g.podgroup["metadata"]["name"] == "pg-web-1-x-u9"  # one per replica
    assert g.podgroup["spec"]["priorityClassName"] == "inference"

    job["metadata"]["annotations"]["kai.scheduler/preemption-delay"] = "30s"
    g = pg.group_pod(pod(), [job])
    assert g is not None and g.podgroup["spec"]["preemptionDelay"] == "30s"
    observed = tr.translate(g.podgroup)
    assert isinstance(observed, p.PodGroupObserved) and observed.preemption_delay_ns == 30_000_000_000

    ptj = owner("PyTorchJob", "kubeflow.org/v1", "train", "t1",
                pytorchReplicaSpecs={"Master": {"replicas": 1}, "Worker": {"replicas": 7}})
    g = pg.group_pod(pod(), [ptj])
    assert g is not None and g.podgroup["spec"]["minMember"] == 8
    ptj["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 5}}
    assert pg.group_pod(pod(), [ptj]).podgroup["spec"]["minMember"] == 5  # type: ignore[union-attr]


def test_malformed_batch_min_member_is_a_clear_rejection() -> None:
    job = owner("Job", "batch/v1", "etl", "j1")
    job["metadata"]["annotations"] = {"kai.scheduler/batch-min-member": "all"}
    with pytest.raises(tr.IngestError) as err:
        pg.group_pod(pod(), [job])
    assert "batch-min-member" in err.value.path and "'all'" in err.value.message


@pytest.mark.parametrize("replicas", [{"Worker": {"replicas": "many"}}, {"Worker": {}}, {}])
def test_malformed_pytorchjob_is_a_clear_rejection(replicas: dict[str, Any]) -> None:
    with pytest.raises(tr.IngestError) as err:
        pg.group_pod(pod(), [owner("PyTorchJob", "kubeflow.org/v1", "t", "t1", pytorchReplicaSpecs=replicas)])
    assert "pytorchReplicaSpecs" in err.value.path


def test_named_skipped_and_other_schedulers_pods_are_not_grouped() -> None:
    named = pod()
    named["metadata"]["annotations"] = {"pod-group-name": "mine"}
    skipped = pod()
    skipped["metadata"]["annotations"] = {"kai.scheduler/skip-podgrouper": "true"}
    other = pod()
    other["spec"]["schedulerName"] = "default-scheduler"
    assert [pg.group_pod(x, []) for x in (named, skipped, other)] == [None, None, None]


def test_grouping_error_and_bad_device_annotations_are_rejections() -> None:
    bad = pod()
    bad["metadata"]["annotations"] = {tr.GROUPING_ERROR_ANNOTATION: "cannot read Job ns/etl"}
    with pytest.raises(tr.IngestError, match="cannot read Job"):
        tr.translate(bad)
    for text in ("x", "1,1", "-1", "0," * 200):
        obj = pod()
        obj["metadata"]["annotations"] = {tr.GPU_DEVICES_ANNOTATION: text}
        with pytest.raises(tr.IngestError) as err:
            tr.translate(obj)
        assert tr.GPU_DEVICES_ANNOTATION in err.value.path


def test_another_schedulers_gpu_share_counts_as_whole_gpus() -> None:
    def shared(scheduler: str, **annotations: str) -> p.PodObserved:
        obj = MakePod("s").fraction("0.5").obj()
        obj["spec"]["schedulerName"] = scheduler
        obj["spec"]["nodeName"] = "n1"
        obj["metadata"]["annotations"].update(annotations)
        out = tr.translate(obj)
        assert isinstance(out, p.PodObserved)
        return out

    assert shared("default-scheduler").gpu == p.GpuRequest(whole=1)
    assert shared("kai-scheduler").gpu.fraction_milli == 500  # kai-es's own: devices inferred
    assert shared("default-scheduler", **{"kai-es.io/gpu-devices": "2"}).gpu.fraction_milli == 500
    assert "counted as 1 whole GPU" in tr.unknown_devices("default-scheduler", "n1",
                                                          p.GpuRequest(fraction_milli=500), "", [])
    assert tr.unknown_devices("kai-scheduler", "n1", p.GpuRequest(fraction_milli=500), "g", []) == ""




async def test_relists_keep_made_groups_and_drop_groups_whose_pods_vanished() -> None:
    a, b = pod("a", "ua"), pod("b", "ub")
    real = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": "real", "namespace": "ns"}, "spec": {}}
    source = PodGroupingSource(ScriptedSource([ObjectChange("Pod", "ADDED", a), ObjectChange("Pod", "ADDED", b)], [
        [Relist("PodGroup", (real,))],
        [Relist("Pod", (b,))],
    ]), api=None)  # type: ignore[arg-type]  # bare pods: no owner is read
    listed = await source.list_objects()
    assert [(c.kind, c.obj["metadata"]["name"]) for c in listed] == [  # type: ignore[index]
        ("PodGroup", "pg-a-ua"), ("Pod", "a"), ("PodGroup", "pg-b-ub"), ("Pod", "b")]
    batches = [list(b) async for b in source.changes()]
    relisted = batches[0][0]
    assert isinstance(relisted, Relist)
    assert sorted(o["metadata"]["name"] for o in relisted.objects) == ["pg-a-ua", "pg-b-ub", "real"]  # type: ignore[index]
    kinds = [(type(c).__name__, c.kind, getattr(c, "action", "")) for c in batches[1]]
    assert ("ObjectChange", "PodGroup", "DELETED") in kinds  # a's group: its pod vanished
    deleted = [c for c in batches[1] if isinstance(c, ObjectChange) and c.action == "DELETED"]
    assert [c.obj["metadata"]["name"] for c in deleted] == ["pg-a-ua"]  # type: ignore[index]


async def test_stated_devices_are_kept_and_another_schedulers_share_takes_whole_gpus() -> None:
    """The reducer accounts a bound shared-GPU pod on the device its facts state (a guess would
    take device 0, the first with room), and another scheduler's GPU share as a whole GPU."""
    from kai_es.adapters.clock import SimClock
    from kai_es.adapters.ids import SeededIds
    from kai_es.adapters.memory_log import MemoryEventLog
    from kai_es.services.informer import InformerService
    from kai_es.state import fold
    from tests.builders import MakeNode, queue

    placed = MakePod("placed").fraction("0.5").running_on("n1", devices="3").label("runai-gpu-group", "g1").obj()
    placed["metadata"]["uid"] = "u-placed"
    foreign = MakePod("foreign", queue=None).fraction("0.25").running_on("n1").obj()
    foreign["spec"]["schedulerName"] = "default-scheduler"
    foreign["metadata"]["uid"] = "u-foreign"
    initial = [ObjectChange("Queue", "ADDED", queue("team-a")), ObjectChange("Node", "ADDED", MakeNode("n1").gpus(4).obj()),
               ObjectChange("Pod", "ADDED", placed), ObjectChange("Pod", "ADDED", foreign)]
    log = MemoryEventLog()
    await InformerService(log, ScriptedSource(initial, []), SimClock(1_000), SeededIds("t")).resync()
    state = fold([r async for r in log.read()])
    assert state.pods["default/placed"].devices == (3,)
    used = state.nodes["n1"].device_used
    assert used[3] == 500 and sorted(used) == [0, 0, 500, 1000], used  # the share of another: whole


async def test_the_grouping_source_says_when_a_bound_pods_devices_are_unknown(caplog: pytest.LogCaptureFixture) -> None:
    foreign = MakePod("foreign", queue=None).fraction("0.25").running_on("n1").obj()
    foreign["spec"]["schedulerName"] = "default-scheduler"
    foreign["metadata"]["uid"] = "u-f"
    mine = MakePod("mine").gpu(2).running_on("n1").obj()
    mine["metadata"]["uid"] = "u-m"
    mine["metadata"]["annotations"]["pod-group-name"] = "g"
    source = PodGroupingSource(ScriptedSource([ObjectChange("Pod", "ADDED", foreign), ObjectChange("Pod", "ADDED", mine)],
                                        []), api=None)  # type: ignore[arg-type]
    with caplog.at_level("INFO", logger="kai_es.adapters.kubernetes.grouping"):
        await source.list_objects()
        await source.list_objects()  # said once per pod
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "default/foreign" in notes[0] and "counted as 1 whole GPU" in notes[0], notes
