"""A Knative Service, made into pods by the real Knative Serving: its controller and its webhook,
built from the Go module proxy at the version in tools/k8s/controlplane.py
(KNATIVE_SERVING_VERSION) and run by a control plane of this module's own (its controller's
health probes take :8080 of every interface, as the MPI operator's do, so it never runs beside
tests/k8s/test_operators.py's; `KnativeProcess` says how both run).

The Service is written as Knative's docs write one (`serving.knative.dev/v1`, a container image
and its port, `autoscaling.knative.dev/min-scale` and `initial-scale` on the template), with
KAI's queue and node-pool labels and the scheduler name added where KAI's docs add them. The
webhook defaults it (the container's name, the traffic, the timeouts); Knative's controller makes
the Configuration, the Revision and its Deployment, at the initial scale (no Knative autoscaler
runs here: it would hold the Deployment at min-scale, which is the initial scale here);
kube-controller-manager's Deployment and ReplicaSet controllers make the pods. kai-es's informer
groups them as KAI's podgrouper does (one gang per Revision, `pg-<revision>-<uid>`, minimum the
Revision's min-scale, priority class `inference`); its scheduler places them and its binder binds
them onto KWOK GPU nodes. The Service never turns Ready (its Route has no ingress here), which the
pods do not need.

As in test_operators.py: the pool is filled first so that only part of the gang fits, and not one
pod of the gang binds (each is reported `GangUnsatisfied`); freeing room binds the gang's
minimum in one cycle (a pod beyond min-scale, when the initial scale is higher, only later);
the run's log replays exactly. Both scheduling tests fail with the Knative rule taken out of the
podgrouper's table (tried once: the pods then fall to KAI's default grouper, one group
`pg-<service>-<the Service's uid>` of minimum 1 and priority class `train`, and they bind as
they fit)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import K8s, cp_mod, operator_plane
from tests.k8s.test_operators import (
    ONE_GPU,
    QUEUE_LABEL,
    SCHEDULER,
    Run,
    assert_replays,
    bind_cycles,
    bound,
    data_in,
    gang_waits,
    groups_in,
    minimum_first,
    operator_may,
    operator_user,
    podgroup_of,
    running,
    scenario,
)

pytestmark = pytest.mark.k8s

OPERATORS = ("knative-webhook", "knative-controller")
MIN_SCALE = 3


@pytest.fixture(scope="module")
def ops() -> Iterator[K8s]:
    """A control plane running Knative Serving's webhook and controller, with KAI's CRDs and
    the scheduler's RBAC (deploy/rbac) bound."""
    with operator_plane(("knative-controller",), "the Knative control plane") as plane:
        yield plane


def knative_service(run: Run, name: str = "hello", min_scale: int = MIN_SCALE,
                    initial_scale: int = MIN_SCALE) -> dict[str, Any]:
    """Knative's "first Service" (helloworld-go: an image, its port, a TARGET variable) of
    one-GPU replicas, `min-scale` and `initial-scale` as Knative's autoscaling docs write them
    (the Revision's Deployment starts at the initial scale); KAI's queue label on the Service,
    the queue and pool labels and the scheduler name on the template."""
    return {
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: run.queue}},
        "spec": {"template": {
            "metadata": {"labels": run.labels(),
                         "annotations": {"autoscaling.knative.dev/min-scale": str(min_scale),
                                         "autoscaling.knative.dev/initial-scale": str(initial_scale)}},
            "spec": {"schedulerName": SCHEDULER, "containers": [{
                "image": "example.invalid/knative/helloworld-go:latest",
                "ports": [{"containerPort": 8080}],
                "env": [{"name": "TARGET", "value": "World"}],
                "resources": ONE_GPU}]}}},
    }  # fmt: skip


def get(ops: K8s, path: str) -> dict[str, Any]:
    status, out = ops.cp.request("GET", path)
    assert status == 200, (path, out)
    return dict(out)


def owner(obj: dict[str, Any]) -> tuple[str, str]:
    (ref,) = obj["metadata"]["ownerReferences"]
    return ref["kind"], ref["name"]


async def test_a_knative_services_revision_binds_as_one_gang_of_its_min_scale(ops: K8s) -> None:
    """Knative makes the Service's Configuration, Revision `hello-00001` and its Deployment of 3
    one-GPU pods; with 2 GPUs free none binds, with 3 all three bind in one cycle, grouped by
    the Revision (minimum 3, `inference`, the Service's queue)."""
    async def body(run: Run) -> None:
        svc = run.create(knative_service(run))
        # the webhook's defaults, as the apiserver stored them
        assert svc["spec"]["template"]["spec"]["containers"][0]["name"] == "user-container"
        assert svc["spec"]["traffic"] == [{"latestRevision": True, "percent": 100}]
        await gang_waits(run, MIN_SCALE)
        await run.fill(5)
        gang = await running(run, lambda got: len(got) == MIN_SCALE and all(bound(x, run.nodes) for x in got),
                             f"the Revision's {MIN_SCALE} pods Running")
        records = await run.records()
        data = data_in(records, run.ns)
        base = f"/apis/serving.knative.dev/v1/namespaces/{run.ns}"
        revision = get(ops, f"{base}/revisions/hello-00001")
        assert owner(revision) == ("Configuration", "hello")
        assert owner(get(ops, f"{base}/configurations/hello")) == ("Service", "hello")
        deployment = get(ops, f"/apis/apps/v1/namespaces/{run.ns}/deployments/hello-00001-deployment")
        assert owner(deployment) == ("Revision", "hello-00001") and deployment["spec"]["replicas"] == MIN_SCALE
        assert {owner(x)[0] for x in gang} == {"ReplicaSet"}
        assert {x["metadata"]["labels"]["serving.knative.dev/revision"] for x in gang} == {"hello-00001"}
        pg = f"pg-hello-00001-{revision['metadata']['uid']}"
        group = groups_in(data)[pg]
        assert group.min_member == MIN_SCALE and group.priority_class == "inference" and group.queue == run.queue
        names = {x["metadata"]["name"] for x in gang}
        assert {podgroup_of(data)[n] for n in names} == {pg}
        assert len(set(bind_cycles(records, run.ns, names).values())) == 1
        assert_replays(records)

    await scenario(ops, 8, 6, body)


async def test_a_revision_started_above_its_min_scale_binds_its_min_scale_first(ops: K8s) -> None:
    """min-scale 2, initial-scale 3: the Revision's Deployment makes 3 pods, its gang's minimum
    is 2. With 1 GPU free none binds; with 2, two bind in one cycle and the third waits; with a
    third GPU it binds too, in a later cycle."""
    async def body(run: Run) -> None:
        run.create(knative_service(run, "elastic", min_scale=2, initial_scale=3))
        _, extra = await minimum_first(run, 3, 2, "the Revision's 2 minimum pods Running")
        await run.fill(5)
        gang = await running(run, lambda got: len(got) == 3 and all(bound(x, run.nodes) for x in got),
                             "all 3 pods of the Revision Running")
        records = await run.records()
        data = data_in(records, run.ns)
        revision = get(ops, f"/apis/serving.knative.dev/v1/namespaces/{run.ns}/revisions/elastic-00001")
        pg = f"pg-elastic-00001-{revision['metadata']['uid']}"
        assert groups_in(data)[pg].min_member == 2
        names = {x["metadata"]["name"] for x in gang}
        assert {podgroup_of(data)[n] for n in names} == {pg} and len(extra) == 1
        cycles = bind_cycles(records, run.ns, names)
        assert len({cycles[n] for n in names - set(extra)}) == 1
        assert cycles[extra[0]] > max(cycles[n] for n in names - set(extra))
        assert_replays(records)

    await scenario(ops, 8, 7, body)


def test_knative_runs_as_built_at_its_pinned_version_as_its_own_users(ops: K8s) -> None:
    """The webhook and the controller are the binaries built from knative.dev/serving at the
    pinned version, running, each as its own user (never system:masters) holding only the
    ClusterRole Knative's install binds (knative-serving-core); each may do what it does here
    (the controller create Deployments, the webhook update its webhook configurations), neither
    may write RBAC or delete nodes, and neither was refused a request (its log names no
    `forbidden`). The webhook filled in its configurations' CA bundles itself."""
    cp = ops.cp
    assert set(cp.operators) == set(OPERATORS)
    for name, proc in cp.operators.items():
        op = cp_mod.OPERATORS[name]
        assert op.module == "knative.dev/serving" and op.version == cp_mod.KNATIVE_SERVING_VERSION
        assert proc.proc.running(), proc.proc.tail()
        assert Path(os.readlink(f"/proc/{proc.proc.pid}/exe")) == cp_mod.operator_bin(op).resolve()
        may = operator_may(cp, proc, operator_user(cp, name, proc))
        assert may("create", "apps", "deployments"), name
        assert may("update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", ""), name
        assert not may("create", "rbac.authorization.k8s.io", "clusterroles"), name
        assert not may("delete", "", "nodes"), name
        assert "forbidden" not in proc.proc.log_path.read_text(errors="replace").lower(), proc.proc.tail()
    hook = cp.call("GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                          "webhook.serving.knative.dev")["webhooks"][0]
    assert hook["clientConfig"]["service"]["path"] == "/defaulting"
    bundle = base64.b64decode(hook["clientConfig"]["caBundle"])
    assert bundle.startswith(b"-----BEGIN CERTIFICATE-----") and bundle != cp.creds.ca_cert.read_bytes()  # its own CA
