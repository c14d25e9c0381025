"""An Argo Workflow, made into step pods by the real Argo Workflows workflow-controller, built from
the Go module proxy at the version in tools/k8s/controlplane.py (ARGO_CONTROLLER, v4.0.5: a test
dependency only, run against this loopback control plane) and run by a control plane of this
module's own (`ArgoProcess` says how).

The Workflow is written as Argo's docs write one (`argoproj.io/v1alpha1`, an entrypoint of
`steps`, container templates) with what a KAI user adds: KAI's queue label and a priority class
label on the Workflow (KAI's podgrouper hands them down to the step pods' groups), the node-pool
label on its pods (`spec.podMetadata`) and the scheduler name (`spec.schedulerName`, for every
step pod). Its first step is a parallel group of two one-GPU training steps; its second, an
evaluation step, comes once both have succeeded.

KAI's podgrouper looks through a Workflow (its skip-top-owner grouper): each step pod is a group
of its own, as a bare pod is (`pg-<pod>-<pod uid>`, minimum 1), in the Workflow's queue and with
its priority class where the pod has none. So with one GPU free, one training step binds and the
other waits (no gang holds it back, none binds them together); freeing a second GPU binds it.
The test fails with the Argo rule's `skip` taken out of the podgrouper's table (tried once: the
Workflow then falls to KAI's default grouper, both step pods in one group `pg-<workflow>-<uid>`).

What is not shown: the evaluation step running. KWOK here only makes pods Running (the control
plane's stages have no pod-complete stage: KWOK's own completes only Jobs' pods), so no step
pod ever Succeeds and the controller never starts the second step; the test checks that it has
not (its pod does not exist while the first two run)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import K8s, cp_mod, operator_plane
from tests.k8s.helpers import wait_for
from tests.k8s.test_operators import (
    ONE_GPU,
    POOL_LABEL,
    QUEUE_LABEL,
    SCHEDULER,
    Run,
    assert_replays,
    bind_cycles,
    bound,
    data_in,
    groups_in,
    operator_may,
    operator_user,
    podgroup_of,
    running,
    scenario,
)

pytestmark = pytest.mark.k8s

OPERATORS = ("workflow-controller",)
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
PRIORITY_LABEL = "priorityClassName"


@pytest.fixture(scope="module")
def ops() -> Iterator[K8s]:
    """A control plane running Argo's workflow-controller, with KAI's CRDs and the scheduler's
    RBAC (deploy/rbac) bound."""
    with operator_plane(OPERATORS, "the Argo Workflows control plane") as plane:
        yield plane


def workflow(run: Run, name: str = "train") -> dict[str, Any]:
    """Two one-GPU training steps side by side, then an evaluation step: KAI's queue and a
    priority class on the Workflow, the pool label on its pods, kai-scheduler for every pod."""
    def step(image: str, *args: str) -> dict[str, Any]:
        return {"image": image, "command": ["python", *args], "resources": ONE_GPU}

    return {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: run.queue, PRIORITY_LABEL: "build"}},
        "spec": {
            "entrypoint": "main", "schedulerName": SCHEDULER,
            "podMetadata": {"labels": {POOL_LABEL: run.pool}},
            "templates": [
                {"name": "main", "steps": [
                    [{"name": "train-a", "template": "train", "arguments": {"parameters": [{"name": "seed", "value": "1"}]}},
                     {"name": "train-b", "template": "train", "arguments": {"parameters": [{"name": "seed", "value": "2"}]}}],
                    [{"name": "evaluate", "template": "evaluate"}]]},
                {"name": "train", "inputs": {"parameters": [{"name": "seed"}]},
                 "container": step("example.invalid/train:1", "train.py", "--seed={{inputs.parameters.seed}}")},
                {"name": "evaluate", "container": step("example.invalid/train:1", "evaluate.py")},
            ]},
    }  # fmt: skip


def get(ops: K8s, path: str) -> dict[str, Any]:
    status, out = ops.cp.request("GET", path)
    assert status == 200, (path, out)
    return dict(out)


async def test_an_argo_workflows_parallel_steps_are_each_a_group_of_one_in_the_workflows_queue(ops: K8s) -> None:
    """The controller makes one pod per training step, both at once; with 1 GPU free exactly one
    binds and the other waits; with 2 free the other binds too, in a later cycle. Each pod is
    its own PodGroup `pg-<pod>-<uid>` of minimum 1, in the Workflow's queue with its priority
    class (neither label is on the pods), owned by the Workflow as Argo makes it; the evaluation
    step has no pod yet."""
    async def body(run: Run) -> None:
        wf = run.create(workflow(run))

        def one_bound(got: list[dict[str, Any]]) -> bool:
            placed = [x for x in got if x["spec"].get("nodeName")]
            return len(got) == 2 and len(placed) == 1 and all(bound(x, run.nodes) for x in placed)

        first = await running(run, one_bound, "the Workflow's 2 step pods, one of them Running")
        (waiting,) = [x["metadata"]["name"] for x in first if not x["spec"].get("nodeName")]
        await run.fill(6)
        steps = await running(run, lambda got: len(got) == 2 and all(bound(x, run.nodes) for x in got),
                              "both training steps Running")
        records = await run.records()
        data = data_in(records, run.ns)
        uid = wf["metadata"]["uid"]
        for pod in steps:
            meta = pod["metadata"]
            assert meta["ownerReferences"] == [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                                                "name": "train", "uid": uid, "controller": True,
                                                "blockOwnerDeletion": True}], meta["ownerReferences"]
            assert meta["labels"][WORKFLOW_LABEL] == "train" and meta["labels"][POOL_LABEL] == run.pool
            assert QUEUE_LABEL not in meta["labels"] and PRIORITY_LABEL not in meta["labels"]
            assert pod["spec"]["schedulerName"] == SCHEDULER
        names = {x["metadata"]["name"] for x in steps}
        expected = {x["metadata"]["name"]: f"pg-{x['metadata']['name']}-{x['metadata']['uid']}" for x in steps}
        assert {n: podgroup_of(data)[n] for n in names} == expected
        groups = groups_in(data)
        for pg in expected.values():
            group = groups[pg]
            assert (group.min_member, group.queue, group.priority_class) == (1, run.queue, "build"), group
        cycles = bind_cycles(records, run.ns, names)
        assert cycles[waiting] > max(c for n, c in cycles.items() if n != waiting)
        # Argo's own view (once the controller has seen both pods Running): both training steps
        # Running, the evaluation step not started
        async def steps_running() -> dict[str, Any] | None:
            status = get(ops, f"/apis/argoproj.io/v1alpha1/namespaces/{run.ns}/workflows/train").get("status", {})
            by_step = {n["displayName"]: n for n in (status.get("nodes") or {}).values()}
            running_steps = {s for s in ("train-a", "train-b") if by_step.get(s, {}).get("phase") == "Running"}
            return by_step if status.get("phase") == "Running" and len(running_steps) == 2 else None

        by_step = await wait_for(steps_running, "Argo's status: both training steps Running", timeout_s=30)
        assert "evaluate" not in by_step
        assert {by_step[s]["id"] for s in ("train-a", "train-b")} == {
            x["metadata"]["annotations"]["workflows.argoproj.io/node-id"] for x in steps}
        assert_replays(records)

    await scenario(ops, 8, 7, body)


def test_argo_runs_as_built_at_its_pinned_version_as_its_own_user(ops: K8s) -> None:
    """The workflow-controller is the binary built from argo-workflows/v4 at the pinned version,
    running as its own user (never system:masters) with only the ClusterRole Argo's cluster-wide
    install binds (argo-cluster-role): it may create pods and update Workflows, it may not write
    RBAC, delete nodes or read Secrets, and it was refused no request (its log names no
    `forbidden`)."""
    cp = ops.cp
    assert set(cp.operators) == set(OPERATORS)
    (name, proc), = cp.operators.items()
    op = cp_mod.OPERATORS[name]
    assert (op.module, op.version) == ("github.com/argoproj/argo-workflows/v4", cp_mod.ARGO_WORKFLOWS_VERSION)
    assert proc.proc.running(), proc.proc.tail()
    assert Path(os.readlink(f"/proc/{proc.proc.pid}/exe")) == cp_mod.operator_bin(op).resolve()
    may = operator_may(cp, proc, operator_user(cp, name, proc))
    assert may("create", "", "pods") and may("update", "argoproj.io", "workflows")
    assert not may("create", "rbac.authorization.k8s.io", "clusterroles")
    assert not may("delete", "", "nodes", "")
    assert not may("list", "", "secrets")
    log = proc.proc.log_path.read_text(errors="replace")
    assert "forbidden" not in log.lower(), proc.proc.tail()
    assert "v4.0.5" in log  # the version it was built to report

