"""MPIJob kubeflow.org/v1, made by the real controller that serves it: Kubeflow's training-operator
v1.8.1 running only its MPIJob scheme with its own module's MPIJob v1 CRD (the control plane's
`training-operator-mpi`; tools/k8s/controlplane.py). Its CRD has the name of the MPI operator's
v2beta1 one, so this module starts a control plane of its own without the MPI operator
(tests/k8s/test_operators.py proves v2beta1 against that).

What the operator does (pkg/controller.v1/mpi, `ReconcilePods`): for a new job it makes the
launcher's ServiceAccount, Role, RoleBinding and ConfigMap, then every worker pod and, in the same
reconcile, the launcher pod — it does not wait for the workers (v1 has no
`launcherCreationPolicy`). The launcher pod carries an init container (`kubectl-delivery`)
asking 5Gi of ephemeral-storage, so the KWOK nodes here report ephemeral-storage, as kubelets
do. kai-es groups the pods by the MPIJob (`pg-<job>-<uid>`, priority class `train`), minimum
`runPolicy.schedulingPolicy.minAvailable`, else every replica of Launcher and Worker.

As in test_operators.py: the pool is filled first so that only part of the gang fits, and not
one pod of the gang binds (each is reported `GangUnsatisfied`); freeing room binds the minimum
in one cycle (an extra beyond `minAvailable` only later); the run's log replays exactly. Both
tests fail with the MPIJob rule taken out of the podgrouper's table (its pods then fall to the
default grouper: one group of minimum 1, and they bind as they fit)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.conftest import K8s, cp_mod, operator_plane
from tests.k8s.test_operators import scenario as operators_scenario
from tests.k8s.test_operators import (
    NO_GPU,
    ONE_GPU,
    QUEUE_LABEL,
    REPLICA_TYPE,
    Run,
    binds_whole,
    binds_whole_after,
    bound,
    container,
    gang_waits,
    pod_spec,
    roles,
    running,
)

pytestmark = pytest.mark.k8s

OPERATOR = "training-operator-mpi"
#: a kubelet's usual report; the launcher's init container asks 5Gi
EPHEMERAL_STORAGE = "100Gi"


@pytest.fixture(scope="module")
def ops() -> Iterator[K8s]:
    """A control plane running the training-operator's MPIJob v1 controller (and no MPI
    operator), with KAI's CRDs and the scheduler's RBAC (deploy/rbac) bound."""
    with operator_plane((OPERATOR,), "the MPIJob v1 control plane") as plane:
        yield plane


async def scenario(ops: K8s, gpus: int, fill: int, body: Callable[[Run], Awaitable[None]]) -> None:
    """test_operators' scenario on nodes with ephemeral storage (the launcher's init container
    asks for some)."""
    await operators_scenario(ops, gpus, fill, body, ephemeral_storage=EPHEMERAL_STORAGE)


def mpi_job_v1(run: Run, name: str, workers: int, launcher: Mapping[str, Any] = NO_GPU,
               min_available: int | None = None) -> dict[str, Any]:
    """The training-operator's MPIJob v1 example (examples/mpi/tensorflow-mnist.yaml): a
    launcher running mpirun and `workers` one-GPU workers, container `mpi`; the scheduler name
    and the queue and pool labels on the pod templates, the queue label on the job (KAI's
    docs); `runPolicy.schedulingPolicy.minAvailable` if given."""
    def spec(replicas: int, resources: Mapping[str, Any]) -> dict[str, Any]:
        return {"replicas": replicas, "template": {"metadata": {"labels": run.labels()},
                                                   "spec": pod_spec(container("mpi", resources))}}
    head = spec(1, launcher)
    head["template"]["spec"]["containers"][0].update(
        command=["mpirun"], args=["-np", str(workers), "--allow-run-as-root", "python",
                                  "/horovod/examples/tensorflow2/tensorflow2_mnist.py"])
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running"}
    if min_available is not None:
        run_policy["schedulingPolicy"] = {"minAvailable": min_available}
    return {"apiVersion": "kubeflow.org/v1", "kind": "MPIJob",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: run.queue}},
            "spec": {"slotsPerWorker": 1, "runPolicy": run_policy,
                     "mpiReplicaSpecs": {"Launcher": head, "Worker": spec(workers, ONE_GPU)}}}


async def test_an_mpijob_v1_binds_its_launcher_and_workers_as_one_gang(ops: K8s) -> None:
    """No minAvailable: the minimum is every replica, the launcher (no GPU) and 2 one-GPU
    workers, all made at once by the operator. With 1 GPU free none binds; with 2 all three
    bind in one cycle, in the MPIJob's group."""
    async def body(run: Run) -> None:
        job = run.create(mpi_job_v1(run, "tensorflow-mnist", 2))
        waiting = await gang_waits(run, 3)
        assert roles(waiting) == ["launcher", "worker", "worker"]
        launcher = next(x for x in waiting if x["metadata"]["labels"][REPLICA_TYPE] == "launcher")
        assert launcher["metadata"]["name"] == "tensorflow-mnist-launcher"
        assert [c["name"] for c in launcher["spec"]["initContainers"]] == ["kubectl-delivery"]
        await run.fill(6)
        _, group, gang = await binds_whole(run, job, 3)
        assert group.min_member == 3 and not group.subgroups
        assert roles(gang) == ["launcher", "worker", "worker"]

    await scenario(ops, 8, 7, body)


async def test_an_mpijob_v1s_min_available_binds_first_and_its_extra_replica_after(ops: K8s) -> None:
    """minAvailable 3 of 4 one-GPU pods (a GPU launcher, which the operator also lists as a
    host, and 3 workers; all of one GPU, so which three form the minimum does not matter):
    with 1 GPU free none binds; with 3, three bind in one cycle and the fourth waits; with a
    fourth GPU it binds too, in a later cycle."""
    async def body(run: Run) -> None:
        job = run.create(mpi_job_v1(run, "tensorflow-mnist-min", 3, launcher=ONE_GPU, min_available=3))
        await gang_waits(run, 4)
        await run.fill(5)

        def minimum_only(got: list[dict[str, Any]]) -> bool:
            placed = [x for x in got if x["spec"].get("nodeName")]
            return len(got) == 4 and len(placed) == 3 and all(bound(x, run.nodes) for x in placed)

        got = await running(run, minimum_only, "the MPIJob's 3 minimum pods Running")
        extra = [x["metadata"]["name"] for x in got if not x["spec"].get("nodeName")]
        await run.fill(4)
        _, group, gang = await binds_whole_after(run, job, 4, extra)
        assert group.min_member == 3 and not group.subgroups and group.priority_class == "train"
        assert roles(gang) == ["launcher", "worker", "worker", "worker"]

    await scenario(ops, 8, 7, body)


def test_the_operator_runs_only_the_mpijob_v1_controller_as_its_own_user(ops: K8s) -> None:
    """The training-operator's binary, enabled for MPIJob alone, as user
    `kai-es-operator:training-operator-mpi` holding the manager ClusterRole the training-operator's
    install ships (no other permission: it made the launcher's Role and RoleBinding with it),
    never
    refused a request while the tests above ran (its log names no `forbidden`); the apiserver
    serves mpijobs.kubeflow.org at v1 only (the training-operator's CRD, not the MPI
    operator's)."""
    cp = ops.cp
    proc = cp.operators[OPERATOR]
    assert set(cp.operators) == {OPERATOR} and proc.proc.running(), proc.proc.tail()
    assert Path(os.readlink(f"/proc/{proc.proc.pid}/exe")) == cp_mod.operator_bin(cp_mod.TRAINING_OPERATOR).resolve()
    assert [a for a in proc.command() if a.startswith("--enable-scheme")] == ["--enable-scheme=mpijob"]
    crd = cp.call("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/mpijobs.kubeflow.org")
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1"]
    _, review = cp.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                           token=proc.user.token)
    info = review["status"]["userInfo"]
    assert info["username"] == f"kai-es-operator:{OPERATOR}" and "system:masters" not in info.get("groups", [])
    shipped = next(d for d in yaml.safe_load_all(cp_mod.operator_role_file("training-operator").read_text())
                   if d and d.get("kind") == "ClusterRole" and d["metadata"]["name"] == "training-operator")
    held = cp.call("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{proc.user.name}")
    assert held["rules"] == shipped["rules"]
    assert "forbidden" not in proc.proc.log_path.read_text(errors="replace").lower(), proc.proc.tail()
