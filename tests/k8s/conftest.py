"""Fixtures for tests that need a real Kubernetes control plane (kube-apiserver + etcd +
kube-controller-manager + KWOK).

One control plane (tools/k8s/controlplane.py) is started for the whole session on loopback
ports, with its data under /dev/shm, and KAI's CRDs (deploy/crds/) are installed once. If it
cannot start (including a failed build of its binaries), every test that asks for it FAILS with
the components' log tails: these tests are never skipped.

Every test collected under tests/k8s/ gets the ``k8s`` marker.
"""

from __future__ import annotations

import contextlib
import gc
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import load_tool_module

ROOT = Path(__file__).resolve().parents[2]
_CONTROLPLANE_PY = ROOT / "tools" / "k8s" / "controlplane.py"
CRD_DIR = ROOT / "deploy" / "crds"
CLUSTER_ROLE = ROOT / "deploy" / "rbac" / "clusterrole.yaml"
RESERVATION_ROLE = ROOT / "deploy" / "rbac" / "reservation-role.yaml"
LEADER_ROLE = ROOT / "deploy" / "rbac" / "leader-election-role.yaml"
_K8S_DIR = Path(__file__).resolve().parent


cp_mod = load_tool_module("kai_es_tools_k8s_controlplane", _CONTROLPLANE_PY)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _K8S_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.k8s)


def load_crds() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]


def install_kai(cp: Any) -> None:
    """What a KAI install puts in a cluster before kai-es runs: the CRDs, and the namespace of
    GPU reservation pods (deploy/rbac/reservation-role.yaml)."""
    cp.install_crds(load_crds())
    cp.create_namespace(yaml.safe_load(RESERVATION_ROLE.read_text())["metadata"]["namespace"])


@dataclass
class K8s:
    """The session's control plane, as tests use it."""

    cp: Any  # tools/k8s/controlplane.py ControlPlane
    kubeconfig: Path
    scheduler_kubeconfig: Path
    admin_token: str
    scheduler_token: str
    base_url: str
    _nodes: list[str] = field(default_factory=list)

    def namespace(self, prefix: str = "t") -> str:
        """A fresh namespace (unique: tests never share one)."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.cp.create_namespace(name)
        return name

    def gpu_node(self, name: str | None = None, **kw: Any) -> dict[str, Any]:
        """A Ready KWOK GPU node (see ControlPlane.create_gpu_node); unique name by default."""
        name = name or f"gpu-{uuid.uuid4().hex[:10]}"
        node: dict[str, Any] = self.cp.create_gpu_node(name, **kw)
        self._nodes.append(name)
        return node

    @contextlib.asynccontextmanager
    async def client(self, kubeconfig: Path | None = None) -> AsyncIterator[Any]:
        """A kubernetes-asyncio ApiClient (admin unless another kubeconfig is given)."""
        from kai_es.adapters.kubernetes.client import api_client

        c = await api_client(kubeconfig or self.kubeconfig)
        try:
            yield c
        finally:
            await c.close()


@contextlib.contextmanager
def started_control_plane(*, prepare: Callable[[Any], None] | None = None,
                          what: str = "the Kubernetes test control plane", timeout_s: float = 120,
                          **options: Any) -> Iterator[Any]:
    """A started control plane (ControlPlane(**options)) made ready by `prepare` (default: what
    KAI installs, `install_kai`), closed after; if it cannot start or `prepare` raises a
    ControlPlaneError, the test FAILS naming `what`, with the components' log tails."""
    cp = cp_mod.ControlPlane(**options)
    try:
        cp.start(timeout_s=timeout_s)
        (prepare or install_kai)(cp)
    except cp_mod.ControlPlaneError as e:
        tails = cp.log_tails()
        cp.close()
        pytest.fail(f"could not start {what}: {e}\n{tails}", pytrace=False)
    try:
        yield cp
    finally:
        cp.close()


def k8s_of(cp: Any) -> K8s:
    """The tests' handle on started control plane `cp`."""
    return K8s(cp=cp, kubeconfig=cp.kubeconfig, scheduler_kubeconfig=cp.scheduler_kubeconfig,
               admin_token=cp.admin_token, scheduler_token=cp.scheduler_token, base_url=cp.base_url)


@contextlib.contextmanager
def operator_plane(operators: tuple[str, ...], what: str = "the Kubernetes test control plane") -> Iterator[K8s]:
    """A control plane running `operators` (`started_control_plane`), with KAI's CRDs and the
    scheduler's RBAC (deploy/rbac) bound."""
    with started_control_plane(operators=operators, what=what) as cp:
        grant_scheduler_roles(cp)
        yield k8s_of(cp)


@pytest.fixture(scope="session")
def k8s() -> Iterator[K8s]:
    """The session's control plane with KAI's CRDs installed. At its end, no node may carry a
    taint: none of the tests taints one, and the controller-manager runs no node-lifecycle
    controller (controlplane.CONTROLLERS: KWOK fakes node health)."""
    with started_control_plane() as cp:
        yield k8s_of(cp)
        tainted = {n["metadata"]["name"]: n["spec"]["taints"] for n in cp.call("GET", "/api/v1/nodes")["items"]
                   if n["spec"].get("taints")}
        if tainted:
            pytest.fail(f"nodes were tainted during the session: {tainted}\n{cp.log_tails()}", pytrace=False)


@pytest.fixture(scope="session")
def scheduler_kubeconfig(k8s: K8s) -> Path:
    """A kubeconfig for the least-privilege identity (user kai-es-scheduler), bound to the
    ClusterRole in deploy/rbac/clusterrole.yaml and nothing else; waits until the authorizer
    has the binding."""
    grant_scheduler_roles(k8s.cp)
    return Path(k8s.scheduler_kubeconfig)


def grant_scheduler_roles(cp: Any) -> None:
    """Bind the scheduler's identity to deploy/rbac's roles (the ClusterRole, the reservation
    namespace's and the leader-election namespace's Roles) on control plane `cp`, and wait
    until the authorizer has the bindings."""
    role = yaml.safe_load(CLUSTER_ROLE.read_text())
    cp.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role, ok=(201, 409))
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "kai-es-test-scheduler"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role["metadata"]["name"]},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": cp.scheduler.groups[0]}],
    }  # fmt: skip
    cp.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding,
            ok=(201, 409))
    ns_role = yaml.safe_load(RESERVATION_ROLE.read_text())
    ns = ns_role["metadata"]["namespace"]
    cp.create_namespace(ns)
    cp.call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", ns_role, ok=(201, 409))
    cp.call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "kai-es-test-scheduler", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ns_role["metadata"]["name"]},
        "subjects": binding["subjects"]}, ok=(201, 409))
    leader_role = yaml.safe_load(LEADER_ROLE.read_text())
    leader_ns = leader_role["metadata"]["namespace"]
    cp.create_namespace(leader_ns)
    cp.call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{leader_ns}/roles", leader_role,
            ok=(201, 409))
    cp.call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{leader_ns}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "kai-es-test-scheduler", "namespace": leader_ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": leader_role["metadata"]["name"]},
        "subjects": binding["subjects"]}, ok=(201, 409))
    deadline = time.monotonic() + 15
    while cp.request("GET", "/api/v1/pods?limit=1", token=cp.scheduler_token)[0] != 200 or cp.request(
            "GET", f"/api/v1/namespaces/{ns}/pods?limit=1", token=cp.scheduler_token)[0] != 200 or cp.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{leader_ns}/leases/authz-probe",
            token=cp.scheduler_token)[0] != 404:  # allowed to get, and there is none
        if time.monotonic() > deadline:
            pytest.fail("the scheduler's ClusterRoleBinding never took effect", pytrace=False)
        time.sleep(0.05)


#: KWOK crashes of the session's control plane found before a test, each restarted (printed in
#: the terminal summary): KWOK v0.8.0 was seen to die of a data race of its own right after a
#: restart ("fatal error: concurrent map writes" in easycel, while two controllers build their
#: stages' CEL environments at once), and every later test of the session then failed on it
KWOK_RESTARTS: list[str] = []


@pytest.fixture(autouse=True)
def _kwok_alive(request: pytest.FixtureRequest) -> None:
    """Before a test on the session's control plane: a KWOK that exited since is restarted (it
    keeps no state: it relists its nodes and pods), and said so in the summary. The test during
    which it died has failed already, on its own."""
    if "k8s" not in request.fixturenames:
        return
    cp = request.getfixturevalue("k8s").cp
    if cp.kwok.running():
        return
    KWOK_RESTARTS.append(f"before {request.node.nodeid}: KWOK had exited; log tail:\n{cp.kwok.tail()}")
    cp.restart_kwok()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in KWOK_RESTARTS:
        terminalreporter.write_line(f"KWOK restarted {line}", yellow=True)


@pytest.fixture(autouse=True)
def _collect_garbage_after_test() -> Iterator[None]:
    """Finalize leftovers right after each test, so a leaked socket or stream is reported (as a
    ResourceWarning, an error here) on the test that leaked it rather than at random later."""
    yield
    gc.collect()
