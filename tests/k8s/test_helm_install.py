"""The chart installed on a real apiserver: every object `helm template` renders (CRDs included)
is server-side applied and really created, then kai-es's three processes run with exactly the
rendered containers' args, the informer and binder authenticated AS the chart's ServiceAccount
(a TokenRequest token) and the scheduler as its own one (allowed its Lease only), over the test
Kafka broker; each leads through its Lease and answers its probes' paths. KAI-style objects (a Queue, a PodGroup gang
and a lone pod) get bound on KWOK nodes; with `pods/binding` taken out of the chart's
ClusterRole the next pod is refused loudly (a PodBindFailed naming the 403) and stays unbound,
and once the rule is back it is bound. And `helm install`, `upgrade` and `uninstall` themselves
against the same apiserver, the way an admin installs next to KAI."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.app import open_log
from kai_es.events import payloads as p
from kai_es.ingest.shards import shard_log_url
from tests.k8s.conftest import K8s, cp_mod
from tests.k8s.helm import CHART, by_kind, container, helm, object_path, render, server_side_apply
from tests.k8s.helpers import gpu_pod, queue, wait_for
from tests.processes import Proc

POOL_LABEL = "kai.scheduler/node-pool"
AUDIENCE = "https://kubernetes.default.svc"  # the test apiserver's --api-audiences


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill9()


def service_account_kubeconfig(cp: Any, ns: str, sa: str, path: Path) -> tuple[str, str]:
    """Write a kubeconfig holding a TokenRequest token of ServiceAccount ns/sa; return the
    username the apiserver authenticates it as, and the token."""
    req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
           "spec": {"audiences": [AUDIENCE], "expirationSeconds": 3600}}
    token = cp.call("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", req, ok=(201,))["status"]["token"]
    path.write_text(cp_mod._kubeconfig(cp.base_url, cp.ca_cert, cp_mod.User(f"{ns}-{sa}", token)))
    review = cp.call("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                     {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}, token=token, ok=(201,))
    return str(review["status"]["userInfo"]["username"]), token


def allowed(cp: Any, token: str, **attributes: str) -> bool:
    """The apiserver's answer to "may I?" for the identity of `token` (SelfSubjectAccessReview)."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": attributes}}
    out = cp.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review, token=token, ok=(201,))
    return bool(out["status"].get("allowed"))


def can_bind(cp: Any, token: str, ns: str) -> bool:
    return allowed(cp, token, namespace=ns, verb="create", resource="pods", subresource="binding")


def can_lease(cp: Any, token: str, ns: str) -> bool:
    return allowed(cp, token, namespace=ns, verb="update", resource="leases", group="coordination.k8s.io")


def local_args(deploy: dict[str, Any], configmaps: dict[str, dict[str, Any]], where: Path,
               http_port: int) -> list[str]:
    """The container's args as they work in its pod: each ConfigMap volume's mount path
    replaced by a local copy of that ConfigMap's data (what the kubelet would mount), and the
    container port named `http` by `http_port` (each pod has its own network; here the three
    processes share one)."""
    pod = deploy["spec"]["template"]["spec"]
    c = container(deploy)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == "http"]
    args = [f":{http_port}" if a == f":{port}" else a for a in c["args"]]
    for mount in c.get("volumeMounts", []):
        vol = volumes[mount["name"]]
        if "configMap" not in vol:
            continue
        local = where / mount["name"]
        local.mkdir(exist_ok=True)  # (the informer and the scheduler mount the same ConfigMap)
        for key, text in configmaps[vol["configMap"]["name"]]["data"].items():
            (local / key).write_text(text)
        args = [a.replace(mount["mountPath"], str(local)) for a in args]
    return args


def http_get(port: int, path: str) -> tuple[int, str] | None:
    """(status, body) of GET http://127.0.0.1:port/path; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()
    except OSError:
        return None


def http_ok(port: int, path: str) -> str | None:
    """The body of GET http://127.0.0.1:port/path if it answers 200, else None."""
    got = http_get(port, path)
    return got[1] if got is not None and got[0] == 200 else None


async def bind_failures(url: str, uid: str) -> list[p.PodBindFailed] | None:
    """The log's PodBindFailed records of pod `uid`; None while there is none."""
    events = open_log(url, readonly=True)
    try:
        found = [r.envelope.data async for r in events.read()
                 if isinstance(r.envelope.data, p.PodBindFailed) and r.envelope.data.uid == uid]
        return found or None
    finally:
        await events.close()


async def test_chart_applied_and_kai_es_binds_as_its_service_account(
        k8s: K8s, kafka_bootstrap: str, tmp_path: Path, procs: list[Proc],
        monkeypatch: pytest.MonkeyPatch) -> None:
    cp = k8s.cp
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace("kai-es")
    release = f"kai-es-{tag}"
    topic = f"kai-es-helm-{tag}"
    objs = render(tmp_path / "helm-home", release=release, namespace=ns, include_crds=True, sets={
        "eventLog.url": f"kafka://{kafka_bootstrap}/{topic}",
        "scheduler.period": "100ms",
        "binder.poll": "20ms",
        "metrics.service.enabled": "true",
    })

    # -- the whole chart, applied and stored by the apiserver ---------------------------------
    for obj in objs:
        stored = server_side_apply(cp, obj)
        assert (stored["kind"], stored["metadata"]["name"]) == (obj["kind"], obj["metadata"]["name"])
    applied = {o["kind"] for o in objs}
    assert applied == {"CustomResourceDefinition", "Namespace", "ServiceAccount", "ConfigMap", "ClusterRole",
                       "ClusterRoleBinding", "Role", "RoleBinding", "Deployment", "Service", "NetworkPolicy"}
    # the disruption budgets of roles with standbys are valid policy/v1 objects too
    standby = render(tmp_path / "helm-home", release=release, namespace=ns,
                     sets={"scheduler.replicas": "2", "binder.replicas": "2"})
    budgets = by_kind(standby, "PodDisruptionBudget")
    assert len(budgets) == 2
    for obj in budgets:
        assert server_side_apply(cp, obj)["spec"]["maxUnavailable"] == 1
    for obj in objs:  # read back: really there
        got = cp.call("GET", object_path(obj))
        assert got["metadata"]["uid"]
        if obj["kind"] == "Deployment":
            assert container(got)["args"] == container(obj)["args"]
            assert got["spec"]["replicas"] == 1

    # -- kubeconfigs that authenticate as the chart's ServiceAccounts -------------------------
    deps = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in by_kind(objs, "Deployment")}
    accounts = {role: d["spec"]["template"]["spec"]["serviceAccountName"] for role, d in deps.items()}
    sa, scheduler_sa = accounts["binder"], accounts["scheduler"]
    assert accounts["informer"] == sa and scheduler_sa != sa
    kubeconfig, scheduler_kubeconfig = tmp_path / "sa.kubeconfig", tmp_path / "scheduler-sa.kubeconfig"
    username, token = service_account_kubeconfig(cp, ns, sa, kubeconfig)
    assert username == f"system:serviceaccount:{ns}:{sa}"
    _, scheduler_token = service_account_kubeconfig(cp, ns, scheduler_sa, scheduler_kubeconfig)
    await wait_for(lambda: anyio.to_thread.run_sync(can_bind, cp, token, ns), "the chart's RBAC to take effect")
    for t in (token, scheduler_token):
        await wait_for(lambda: anyio.to_thread.run_sync(can_lease, cp, t, ns), "the leader-election Role")
    assert cp.request("GET", "/api/v1/namespaces/default/secrets", token=token)[0] == 403  # not admin
    # the scheduler's identity may hold its Lease, and read nothing of the cluster
    assert cp.request("GET", "/api/v1/pods?limit=1", token=scheduler_token)[0] == 403
    assert not can_lease(cp, scheduler_token, "default")

    # -- the processes, with the rendered args ------------------------------------------------
    configmaps = {c["metadata"]["name"]: c for c in by_kind(objs, "ConfigMap")}
    for role in ("informer", "scheduler", "binder"):
        # the pod's in-cluster config, out of cluster: its ServiceAccount's token
        monkeypatch.setenv("KUBECONFIG", str(scheduler_kubeconfig if role == "scheduler" else kubeconfig))
        port = cp_mod.free_port()
        proc = Proc(role, local_args(deps[role], configmaps, tmp_path, port), tmp_path)
        procs.append(proc)
        proc.start()
        proc.wait_ready(role)
        # what the kubelet's probes would see: both succeed once the process is ready
        c = container(deps[role])
        for probe in ("readinessProbe", "livenessProbe"):
            path = c[probe]["httpGet"]["path"]
            await wait_for(lambda: anyio.to_thread.run_sync(http_ok, port, path), f"{role}'s {probe} {path}")
        assert "kai_es_ready 1.0" in (http_ok(port, "/metrics") or "")
        # it leads: its Lease names it
        lease = cp.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{release}-{role}")
        assert lease["spec"].get("holderIdentity"), lease

    pool = {POOL_LABEL: f"pool-{tag}"}
    nodes = {k8s.gpu_node(f"h-{tag}-{i}", gpus=4, labels=pool)["metadata"]["name"] for i in range(2)}
    qname = f"q-{tag}"
    cp.call("POST", "/apis/scheduling.run.ai/v2/queues", queue(qname), ok=(201,))
    cp.call("POST", f"/apis/scheduling.run.ai/v2alpha2/namespaces/{ns}/podgroups", {
        "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": ns},
        "spec": {"queue": qname, "minMember": 2}}, ok=(201,))
    pods = [gpu_pod(f"train-{i}", ns, gpus=4, queue=qname, labels=pool,
                    annotations={"pod-group-name": "train"}) for i in range(2)]
    pods.append(gpu_pod("notebook", ns, gpus=0, queue=qname, labels=pool))
    for pod in pods:
        cp.call("POST", f"/api/v1/namespaces/{ns}/pods", pod, ok=(201,))

    def placed(name: str) -> str | None:
        got = cp.call("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        return got["spec"].get("nodeName") if got["status"].get("phase") == "Running" else None

    async def all_bound() -> dict[str, str] | None:
        where = {pod["metadata"]["name"]: placed(pod["metadata"]["name"]) for pod in pods}
        return where if all(where.values()) else None

    where = await wait_for(all_bound, "the chart's kai-es to bind the gang and the notebook", timeout_s=60)
    assert set(where.values()) <= nodes
    assert where["train-0"] != where["train-1"]  # 4 GPUs each, 4 per node

    # -- without pods/binding the binder is refused, loudly -----------------------------------
    (role,) = by_kind(objs, "ClusterRole")
    narrowed = copy.deepcopy(role)
    for rule in narrowed["rules"]:
        rule["resources"] = [r for r in rule["resources"] if r != "pods/binding"]
    narrowed["rules"] = [r for r in narrowed["rules"] if r["resources"]]
    assert narrowed["rules"] != role["rules"]
    server_side_apply(cp, narrowed)
    await wait_for(lambda: anyio.to_thread.run_sync(lambda: not can_bind(cp, token, ns)),
                   "the narrowed ClusterRole to take effect")
    late = cp.call("POST", f"/api/v1/namespaces/{ns}/pods",
                   gpu_pod("late", ns, gpus=1, queue=qname, labels=pool), ok=(201,))
    url = container(deps["binder"])["args"][2]
    failures = await wait_for(lambda: bind_failures(url, late["metadata"]["uid"]),
                              "a PodBindFailed for the pod the binder may not bind", timeout_s=30,
                              interval_s=0.2)
    # its bind back-off (1 s, then 2 s...) leaves 15 s before the binder gives up on the pod
    message = failures[0].message
    assert message.startswith("HTTP 403") and f'User "{username}" cannot create resource "pods/binding"' in message
    assert not cp.call("GET", f"/api/v1/namespaces/{ns}/pods/late")["spec"].get("nodeName")

    # -- the chart's rule back: the same pod is bound -----------------------------------------
    server_side_apply(cp, role)
    await wait_for(lambda: anyio.to_thread.run_sync(can_bind, cp, token, ns), "the chart's ClusterRole again")
    await wait_for(lambda: anyio.to_thread.run_sync(placed, "late"), "the refused pod bound once allowed",
                   timeout_s=60)
    for proc in procs:
        assert proc.alive(), proc.stderr()[-2000:]
    assert json.loads(kubeconfig.read_text())["users"][0]["user"]["token"] == token


def test_helm_install_upgrade_uninstall_next_to_kai(k8s: K8s, tmp_path: Path) -> None:
    """`helm install` itself against the real apiserver, as an admin does where KAI's CRDs and
    reservation namespace already exist (--skip-crds, reservation.createNamespace=false); an
    upgrade that changes the scheduler configuration changes only the scheduler's pod template;
    uninstall removes the release's objects and leaves the CRDs."""
    cp = k8s.cp
    ns = k8s.namespace("helm")
    release = f"kai-es-{uuid.uuid4().hex[:8]}"
    home = tmp_path / "helm-home"
    common = [str(CHART), "--namespace", ns, "--kubeconfig", str(k8s.kubeconfig), "--skip-crds",
              "--set", "reservation.createNamespace=false", "--set", "eventLog.url=kafka://kafka.data:9092/kai-es.events"]
    out = helm("install", release, *common, home=home).stdout
    assert 'kai-es places the pods whose spec.schedulerName is "kai-scheduler"' in out, out  # NOTES.txt

    def get(kind: str, name: str, namespace: str | None = None) -> Any:
        obj = {"kind": kind, "metadata": {"name": name, "namespace": namespace or ns}}
        return cp.request("GET", object_path(obj))

    deployments = {role: get("Deployment", f"{release}-{role}")[1] for role in ("informer", "scheduler", "binder")}
    assert all(d["spec"]["template"]["spec"]["containers"][0]["command"] == ["kai-es"] for d in deployments.values())
    for kind, name, namespace in (("ServiceAccount", release, ns), ("ConfigMap", f"{release}-scheduler", ns),
                                  ("ClusterRole", release, None), ("ClusterRoleBinding", release, None),
                                  ("Role", f"{release}-gpu-reservation", "kai-resource-reservation"),
                                  ("RoleBinding", f"{release}-gpu-reservation", "kai-resource-reservation"),
                                  ("ServiceAccount", f"{release}-scheduler", ns),
                                  ("Role", f"{release}-leader-election", ns),
                                  ("RoleBinding", f"{release}-leader-election", ns)):
        status, obj = get(kind, name, namespace)
        assert status == 200 and obj["metadata"]["annotations"]["meta.helm.sh/release-name"] == release, (kind, status)

    helm("upgrade", release, *common, "--set", "scheduler.config.placementStrategy.gpu=spread", home=home)
    after = {role: get("Deployment", f"{release}-{role}")[1] for role in deployments}
    assert "gpu: spread" in get("ConfigMap", f"{release}-scheduler")[1]["data"]["scheduler.yaml"]
    assert after["scheduler"]["metadata"]["generation"] == deployments["scheduler"]["metadata"]["generation"] + 1
    for role in ("informer", "binder"):
        assert after[role]["metadata"]["generation"] == deployments[role]["metadata"]["generation"]

    helm("uninstall", release, "--namespace", ns, "--kubeconfig", str(k8s.kubeconfig), home=home)
    assert get("Deployment", f"{release}-scheduler")[0] == 404
    assert get("ClusterRole", release, None)[0] == 404
    assert cp.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/queues.scheduling.run.ai")[0] == 200


def test_helm_upgrade_to_two_shards_on_the_apiserver(k8s: K8s, tmp_path: Path) -> None:
    """`helm upgrade` of an unsharded install to ci/shards-values.yaml's two shards (with the
    metrics Services), against the real apiserver: it accepts every object (each Deployment's
    selector matches its pods' labels, the Service names fit), the unsharded scheduler and
    binder are deleted, and each shard's Deployments, ConfigMap, budgets and Services are there
    with the args `helm template` renders."""
    from tests.k8s.helm import SHARD_VALUES  # noqa: PLC0415

    cp = k8s.cp
    ns = k8s.namespace("shards")
    release = f"kai-es-{uuid.uuid4().hex[:8]}"
    home = tmp_path / "helm-home"
    common = [str(CHART), "--namespace", ns, "--kubeconfig", str(k8s.kubeconfig), "--skip-crds",
              "--set", "reservation.createNamespace=false", "--set", "eventLog.url=kafka://kafka.data:9092/kai-es.events",
              "--set", "metrics.service.enabled=true"]
    helm("install", release, *common, home=home)

    def get(kind: str, name: str) -> Any:
        return cp.request("GET", object_path({"kind": kind, "metadata": {"name": name, "namespace": ns}}))

    assert get("Deployment", f"{release}-scheduler")[0] == 200
    helm("upgrade", release, *common, "-f", str(SHARD_VALUES), home=home)
    rendered = render(home, release=release, namespace=ns, values=[SHARD_VALUES],
                      sets={"reservation.createNamespace": "false", "eventLog.url": "kafka://kafka.data:9092/kai-es.events",
                            "metrics.service.enabled": "true"})
    for role in ("scheduler", "binder"):
        assert get("Deployment", f"{release}-{role}")[0] == 404
        assert get("Service", f"{release}-{role}-metrics")[0] == 404
    sharded = [o for o in rendered if "kai-es.io/shard" in o["metadata"]["labels"]]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in sharded) == sorted(
        [("Deployment", f"{release}-{r}-{s}") for r in ("scheduler", "binder") for s in ("default", "gpu")]
        + [("Service", f"{release}-{r}-{s}-metrics") for r in ("scheduler", "binder") for s in ("default", "gpu")]
        + [("ConfigMap", f"{release}-scheduler-{s}") for s in ("default", "gpu")]
        + [("PodDisruptionBudget", f"{release}-scheduler-default"), ("PodDisruptionBudget", f"{release}-scheduler-gpu"),
           ("PodDisruptionBudget", f"{release}-binder-gpu")])
    for obj in sharded:
        status, stored = get(obj["kind"], obj["metadata"]["name"])
        assert status == 200, obj["metadata"]["name"]
        assert stored["metadata"]["labels"]["kai-es.io/shard"] == obj["metadata"]["labels"]["kai-es.io/shard"]
        if obj["kind"] == "Deployment":
            assert container(stored)["args"] == container(obj)["args"]
            assert stored["spec"]["selector"] == obj["spec"]["selector"]
    informer = container(get("Deployment", f"{release}-informer")[1])["args"]
    assert "--shard" in informer and "gpu=gpu-nodes" in informer
    helm("uninstall", release, "--namespace", ns, "--kubeconfig", str(k8s.kubeconfig), home=home)
    assert get("Deployment", f"{release}-scheduler-gpu")[0] == 404


async def test_sharded_chart_processes_bind_each_pool_on_its_own_shard(
        k8s: K8s, kafka_bootstrap: str, tmp_path: Path, procs: list[Proc],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two shards rendered by the chart, applied to the apiserver, and their five processes run
    with exactly the rendered args (the informer and binders as the chart's ServiceAccount) on
    the test Kafka broker: each pool's pods are bound by its own shard onto its own nodes, each
    scheduler answers on its own port, and each shard's binds are in its own topic."""
    cp = k8s.cp
    tag = uuid.uuid4().hex[:8]
    ns = k8s.namespace("kai-es")
    release = f"kai-es-{tag}"
    base = f"kafka://{kafka_bootstrap}/kai-es-helm-{tag}"
    pools = {"a": f"pool-a-{tag}", "b": f"pool-b-{tag}"}
    values = tmp_path / "shards.yaml"
    values.write_text(json.dumps({"shards": [{"name": s, "partitionLabelValue": v} for s, v in pools.items()]}))
    objs = render(tmp_path / "helm-home", release=release, namespace=ns, values=[values], sets={
        "eventLog.url": base, "scheduler.period": "100ms", "binder.poll": "20ms",
        "reservation.createNamespace": "false"})
    for obj in objs:
        server_side_apply(cp, obj)
    deps = {d["metadata"]["name"]: d for d in by_kind(objs, "Deployment")}
    assert sorted(deps) == sorted([f"{release}-informer"] + [f"{release}-{r}-{s}" for r in ("scheduler", "binder")
                                                              for s in pools])
    configmaps = {c["metadata"]["name"]: c for c in by_kind(objs, "ConfigMap")}
    sa = deps[f"{release}-binder-a"]["spec"]["template"]["spec"]["serviceAccountName"]
    scheduler_sa = deps[f"{release}-scheduler-a"]["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig, scheduler_kubeconfig = tmp_path / "sa.kubeconfig", tmp_path / "scheduler-sa.kubeconfig"
    _, token = service_account_kubeconfig(cp, ns, sa, kubeconfig)
    service_account_kubeconfig(cp, ns, scheduler_sa, scheduler_kubeconfig)
    await wait_for(lambda: anyio.to_thread.run_sync(can_bind, cp, token, ns), "the chart's RBAC to take effect")

    ports: dict[str, int] = {}
    for name in (f"{release}-informer", *(f"{release}-{r}-{s}" for s in pools for r in ("scheduler", "binder"))):
        role = name.removeprefix(f"{release}-")
        monkeypatch.setenv("KUBECONFIG", str(scheduler_kubeconfig if role.startswith("scheduler") else kubeconfig))
        ports[role] = cp_mod.free_port()
        where = tmp_path / role
        where.mkdir()
        proc = Proc(role, local_args(deps[name], configmaps, where, ports[role]), tmp_path)
        procs.append(proc)
        proc.start()
        proc.wait_ready(role.split("-")[0])
    assert len(set(ports.values())) == len(ports)
    for role, port in ports.items():
        await wait_for(lambda: anyio.to_thread.run_sync(http_ok, port, "/readyz"), f"{role} ready on its port")

    nodes = {s: {k8s.gpu_node(f"hs-{s}-{tag}-{i}", gpus=4, labels={POOL_LABEL: v})["metadata"]["name"]
                 for i in range(2)} for s, v in pools.items()}
    for s, v in pools.items():
        body = queue(f"q-{s}-{tag}")
        body["metadata"]["labels"] = {POOL_LABEL: v}
        cp.call("POST", "/apis/scheduling.run.ai/v2/queues", body, ok=(201,))
        for i in range(3):
            cp.call("POST", f"/api/v1/namespaces/{ns}/pods",
                    gpu_pod(f"{s}-{i}", ns, gpus=2, queue=f"q-{s}-{tag}", labels={POOL_LABEL: v}), ok=(201,))

    async def placed() -> dict[str, str] | None:
        got = {f"{s}-{i}": cp.call("GET", f"/api/v1/namespaces/{ns}/pods/{s}-{i}") for s in pools for i in range(3)}
        where = {n: pod["spec"].get("nodeName") for n, pod in got.items() if pod["status"].get("phase") == "Running"}
        return where if len(where) == len(got) else None

    where = await wait_for(placed, "each shard to bind its pool's pods", timeout_s=60)
    for name, node in where.items():
        assert node in nodes[name.split("-")[0]], (name, node)
    for s in pools:
        url = shard_log_url(container(deps[f"{release}-binder-{s}"])["args"][2], s)
        events = open_log(url, readonly=True)
        try:
            bound = {r.envelope.data.name async for r in events.read() if isinstance(r.envelope.data, p.PodBound)}
        finally:
            await events.close()
        assert bound == {f"{s}-{i}" for i in range(3)}, (s, bound)
    for proc in procs:
        assert proc.alive(), proc.stderr()[-2000:]
