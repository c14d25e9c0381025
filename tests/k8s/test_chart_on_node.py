"""The chart installed for real: `helm install kai-es deploy/helm/kai-es` on a control plane with
a real node (a kubelet with containerd and runc, tools/k8s/controlplane.py RealNode), with the
kai-es image built from this checkout and imported into the node's containerd (no registry).

What it proves, in order (the tests share the module's one install and run in file order):
- the chart's six pods (informer, scheduler and binder, two replicas each) are placed by the
  default kube-scheduler (built with the Kubernetes commands, `ControlPlane(real_node=True)` runs
  it) onto the real node, started by the kubelet with the chart's security context, turned Ready
  by their `/readyz` probes, and elect one leader per role (the Leases name one pod each); the
  pods reach the apiserver at the host's address (`in_cluster_env`: there is no kube-proxy here)
  with the projected ServiceAccount tokens the kubelet mounts. Both log backends, each its own
  install on its own control plane (the module's fixture is parametrized; one real node at a
  time): the embedded file log on a hostPath volume all six pods mount (`eventLog.file`), and
  Kafka (the test broker, listening on the host's address: `eventLog.url`);
- real containers scheduled by the installed kai-es run to completion on the node: a PodGroup
  gang of 4 in a Queue, a batch Job, and a fractional-GPU pod whose reservation pod (the binder's
  `--reservation-image`, a busybox image on the node) actually starts: the real node advertises
  fake `nvidia.com/gpu` capacity (its status patched, as Kubernetes documents for extended
  resources; no device plugin, so the kubelet admits it against the node's allocatable);
- `helm upgrade` to a new image tag (the same image re-tagged in containerd) rolls every pod,
  and pods submitted during the roll are all scheduled, each decided and bound exactly once (the
  log's BindingDecided and PodBound records against the pods' nodes), and the log replays exactly;
- the leading scheduler's container killed (`ctr tasks kill -s SIGKILL`): another process (the
  standby, or the killed container as the kubelet restarts it: they race) takes the Lease within
  leaseDuration (+ a retry period); a binder pod deleted: the Deployment replaces
  it; the pods submitted meanwhile are all scheduled, once each;
- a drain of the node (cordon, evict every pod: what `kubectl drain` does) meets the chart's
  PodDisruptionBudgets (kube-controller-manager's disruption controller computes them): one pod
  per role goes at a time, the other is refused while its replacement cannot start, each role
  keeps a leader throughout;
- the chart's NetworkPolicy is enforced (the real node runs kube-router's firewall): with
  `networkPolicy.from` a namespace selector, a pod of a labelled namespace reaches a scheduler
  pod's http port and one of another namespace does not, while the probes keep every pod Ready;
- `helm uninstall` leaves nothing of kai-es but what deploy/README.md says it keeps.

The times it measures (install to all Ready, upgrade, failover) are printed (`-s`) and recorded
in deploy/README.md. Needs root and the packages of .ci/run; any piece that cannot start FAILS
the module, naming it: nothing here is skipped.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
import yaml

from kai_es.app import open_log
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scheduling.packing import load_packer
from tests.conftest import KafkaBroker, broker_mod
from tests.k8s.conftest import CRD_DIR, cp_mod, started_control_plane
from tests.k8s.helm import CHART, helm
from tests.k8s.helpers import queue

T = TypeVar("T")

RELEASE = "kai-es"
NAMESPACE = "kai-es"
ROLES = ("informer", "scheduler", "binder")
REPLICAS = 2
UPGRADED_TAG_SUFFIX = "-rolled"
#: the log's directory inside the pods (the hostPath volume's mount point)
LOG_DIR_IN_POD = "/var/lib/kai-es"
RUN_AS = 10001  # the chart's podSecurityContext.runAsUser/runAsGroup
#: the real node's fake GPUs (status capacity), enough for one reservation pod
NODE_GPUS = 1
WORKLOADS = "work"  # the namespace of the workloads
#: the log backends the chart is installed with, one install each
LOGS = ("file", "kafka")


def _wait(fn: Callable[[], T | None], what: str, timeout_s: float, cp: Any, interval_s: float = 0.2) -> T:
    """Poll `fn` until it returns something other than None/False; on timeout FAIL with the
    chart's pods' state and their containers' last log lines, and the kubelet's and
    kube-scheduler's log tails."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        got = fn()
        if got is not None and got is not False:
            return got
        last = got
        time.sleep(interval_s)
    pods = cp.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    states = {x["metadata"]["name"]: (x["spec"].get("nodeName"), x["status"].get("phase"),
                                      [c.get("state") for c in x["status"].get("containerStatuses") or []])
              for x in pods}
    logs = "".join(f"--- {f.parent.parent.name}/{f.parent.name}/{f.name}:\n"
                   + "\n".join(f.read_text(errors="replace").splitlines()[-6:]) + "\n"
                   for f in sorted(cp.real_node.pod_logs.glob(f"{NAMESPACE}_*/*/*.log")))
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})\nchart pods: "
                         f"{json.dumps(states)[:3000]}\ntheir logs:\n{logs[-6000:]}\n"
                         f"kubelet log tail:\n{cp.real_node.kubelet.tail(40)}\n"
                         f"kube-scheduler log tail:\n{cp.kube_scheduler.tail(20) if cp.kube_scheduler else ''}")


@dataclass
class Install:
    """The module's control plane and the chart installed on it."""

    cp: Any
    home: Path  # helm's config/cache/data
    values: Path  # the values file of the install
    image_repo: str
    image_tag: str
    log: str  # "file" or "kafka"
    log_url: str  # the event log as this process opens it: the file on the host, or kafka://
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    timings: dict[str, float] = field(default_factory=dict)

    def helm(self, *args: str) -> str:
        return helm(*args, "--namespace", NAMESPACE, "--kubeconfig", str(self.cp.kubeconfig), home=self.home).stdout

    def pods(self, role: str | None = None) -> list[dict[str, Any]]:
        """The chart's pods (of `role`), those being deleted left out."""
        sel = f"app.kubernetes.io/instance={RELEASE}" + (f",app.kubernetes.io/component={role}" if role else "")
        items = self.cp.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={sel}")["items"]
        return [x for x in items if not x["metadata"].get("deletionTimestamp")]

    def lease_holder(self, role: str) -> str | None:
        status, lease = self.cp.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}-{role}")
        return (lease["spec"].get("holderIdentity") or None) if status == 200 else None

    def leader_pod(self, role: str) -> str | None:
        """The name of the pod whose process holds `role`'s Lease (identity `<hostname>_<id>`;
        a pod's hostname is its name)."""
        holder = self.lease_holder(role)
        names = {x["metadata"]["name"] for x in self.pods(role)}
        return next((n for n in names if holder and holder.startswith(n + "_")), None)

    def all_ready(self, image: str) -> list[dict[str, Any]] | None:
        """The chart's pods when there are exactly REPLICAS per role, every one on the real node,
        Ready and running `image`; else None."""
        pods = self.pods()
        by_role = Counter(x["metadata"]["labels"]["app.kubernetes.io/component"] for x in pods)
        if by_role != {r: REPLICAS for r in ROLES}:
            return None
        for x in pods:
            conds = {c["type"]: c["status"] for c in x["status"].get("conditions") or []}
            if conds.get("Ready") != "True" or x["spec"]["containers"][0]["image"] != image:
                return None
            assert x["spec"]["nodeName"] == self.cp.real_node.name, x["spec"].get("nodeName")
        return pods

    def leaders(self) -> dict[str, str] | None:
        got = {role: self.leader_pod(role) for role in ROLES}
        return got if all(got.values()) else None  # type: ignore[return-value]

    def records(self) -> list[Record]:
        """The whole event log as written so far (read-only: a torn last line is ignored)."""
        async def read() -> list[Record]:
            events = open_log(self.log_url, readonly=True)
            try:
                return [r async for r in events.read()]
            finally:
                await events.close()

        return anyio.run(read)


def _workload_pod(name: str, qname: str, script: str, *, annotations: dict[str, str] | None = None,
                  labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A busybox pod for kai-es (schedulerName kai-scheduler) in WORKLOADS, run once."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOADS,
                     "labels": {"kai.scheduler/queue": qname, **(labels or {})},
                     "annotations": dict(annotations or {})},
        "spec": {"schedulerName": "kai-scheduler", "restartPolicy": "Never",
                 "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": cp_mod.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                 "command": ["/bin/busybox", "sh", "-c", script],
                                 "resources": {"requests": {"cpu": "20m", "memory": "16Mi"}}}]},
    }  # fmt: skip


@pytest.fixture(scope="module")
def kafka_on_host() -> Iterator[Any]:
    """A Kafka broker the pods can reach: listening on every address, advertising the host's
    (the one the real node's pods route to). Started only for the Kafka variant."""
    host = cp_mod.host_ip()
    port, controller = cp_mod.free_port(), cp_mod.free_port()
    broker = KafkaBroker(port, controller_port=controller, properties={
        "listeners": f"PLAINTEXT://0.0.0.0:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}"})
    try:
        broker.start(timeout_s=180)
    except broker_mod.BrokerError as e:
        broker.close()
        pytest.fail(f"could not start the Kafka broker for the chart's pods: {e}", pytrace=False)
    try:
        yield f"{host}:{port}"
    finally:
        broker.close()


@pytest.fixture(scope="module", params=LOGS)
def installed(request: pytest.FixtureRequest, kai_es_image: Any,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    """A real-node control plane (with kube-scheduler; NOT what KAI installs: the chart brings
    its CRDs and the reservation namespace itself), the image imported and tagged twice, the
    node given fake GPUs, and `helm install` of the chart with the file log on a hostPath or
    with Kafka (`request.param`)."""
    log: str = request.param
    bootstrap = request.getfixturevalue("kafka_on_host") if log == "kafka" else ""
    repo, _, tag = kai_es_image.tag.rpartition(":")

    def with_image(cp: Any) -> None:
        if cp.kube_scheduler is None:
            raise cp_mod.ControlPlaneError("the real-node control plane runs no kube-scheduler")
        cp.real_node._ctr("images", "import", str(kai_es_image.archive), timeout=300)  # noqa: SLF001
        cp.real_node._ctr("images", "tag", "--force", kai_es_image.tag,  # noqa: SLF001
                          f"{repo}:{tag}{UPGRADED_TAG_SUFFIX}")
        listed = cp.real_node._ctr("images", "list", "-q").split()  # noqa: SLF001
        for ref in (kai_es_image.tag, f"{repo}:{tag}{UPGRADED_TAG_SUFFIX}", cp_mod.PAUSE_IMAGE):
            if ref not in listed:
                raise cp_mod.ControlPlaneError(f"image {ref} not in the node's containerd: {listed}")

    with started_control_plane(real_node=True, network_policy=True, prepare=with_image, timeout_s=180,
                               what="the real-node control plane with the kai-es image") as cp:
        node = cp.real_node.name
        # fake GPUs: extended resources in the node's status (the kubelet keeps what it does not
        # manage) and the GPU labels kai-es reads
        cp.call("PATCH", f"/api/v1/nodes/{node}/status",
                {"status": {"capacity": {"nvidia.com/gpu": str(NODE_GPUS)}}},
                content_type="application/merge-patch+json", ok=(200,))
        cp.call("PATCH", f"/api/v1/nodes/{node}",
                {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                                         "nvidia.com/gpu.memory": "81920"}}},
                content_type="application/merge-patch+json", ok=(200,))
        _wait(lambda: cp.call("GET", f"/api/v1/nodes/{node}")["status"].get("allocatable", {}).get("nvidia.com/gpu")
              == str(NODE_GPUS), "the node's fake GPUs in its allocatable", 30, cp)
        event_log: dict[str, Any]
        if log == "file":
            host_log_dir = cp.data_dir / "event-log"
            host_log_dir.mkdir()
            os.chown(host_log_dir, RUN_AS, RUN_AS)
            log_url = str(host_log_dir / "events.jsonl")
            event_log = {"file": {"path": f"{LOG_DIR_IN_POD}/events.jsonl",
                                  "volume": {"hostPath": {"path": str(host_log_dir), "type": "Directory"}}}}
        else:
            log_url = f"kafka://{bootstrap}/kai-es-chart-{uuid.uuid4().hex[:8]}"
            event_log = {"url": log_url}
        home = tmp_path_factory.mktemp("helm-home")
        values = home / "values.yaml"
        small = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
        values.write_text(yaml.safe_dump({
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "eventLog": event_log,
            # no kube-proxy here: the pods reach the apiserver at the host's address
            "extraEnv": cp.in_cluster_env(),
            "nodeSelector": {"kubernetes.io/hostname": node},
            "informer": {"replicas": REPLICAS, "resources": small},
            "scheduler": {"replicas": REPLICAS, "resources": small, "period": "200ms"},
            "binder": {"replicas": REPLICAS, "resources": small, "reservationImage": cp_mod.PAUSE_IMAGE},
        }))
        inst = Install(cp=cp, home=home, values=values, image_repo=repo, image_tag=tag, log=log,
                       log_url=log_url)
        t0 = time.monotonic()
        out = inst.helm("install", RELEASE, str(CHART), "--create-namespace", "-f", str(values))
        assert "kai-es places the pods whose spec.schedulerName is \"kai-scheduler\"" in out, out
        _wait(lambda: inst.all_ready(f"{repo}:{tag}"), "the chart's six pods Ready on the real node", 240, cp)
        inst.timings["install to all Ready"] = time.monotonic() - t0
        _wait(inst.leaders, "one leader per role", 60, cp)
        inst.timings["install to three leaders"] = time.monotonic() - t0
        cp.create_namespace(WORKLOADS)
        cp.call("POST", "/apis/scheduling.run.ai/v2/queues", queue(f"q-{inst.tag}"), ok=(201,))
        yield inst
        print(f"\nmeasured ({log} log): " + ", ".join(f"{k} {v:.1f}s" for k, v in inst.timings.items()))


def _phase(cp: Any, name: str, namespace: str = WORKLOADS) -> tuple[str | None, str | None]:
    status, pod = cp.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return (pod["status"].get("phase"), pod["spec"].get("nodeName")) if status == 200 else (None, None)


def _bound_once(inst: Install, names: Sequence[str]) -> None:
    """Each pod of `names` (in WORKLOADS) was bound once by kai-es, onto the node the pod names,
    per the log; no pod in the log had a binding decided while an earlier binding of it was
    unanswered or had succeeded (a binding decided again after the binder reported the first one
    failed — a slow reservation pod on a busy machine — is a retry, not a second binding), and
    none was reported bound twice; and the whole log replays exactly."""
    records = inst.records()
    pods = {n: inst.cp.call("GET", f"/api/v1/namespaces/{WORKLOADS}/pods/{n}") for n in names}
    history: dict[str, list[tuple[str, str, str]]] = {}  # pod uid -> (event, node, message)
    open_: dict[str, str] = {}  # pod uid -> its binding decision without an outcome
    for record in records:
        d = record.envelope.data
        if isinstance(d, p.BindingDecided):
            history.setdefault(d.uid, []).append(("decided", d.node, ""))
            assert d.uid not in open_, (d.name, history[d.uid])
            assert ("bound", d.node, "") not in history[d.uid][:-1], (d.name, history[d.uid])
            open_[d.uid] = record.envelope.id
        elif isinstance(d, (p.PodBound, p.PodBindFailed)) and open_.get(d.uid) == d.decision_id:
            del open_[d.uid]
            history.setdefault(d.uid, []).append(
                ("bound", d.node, "") if isinstance(d, p.PodBound) else ("failed", d.node, d.message))
    for name, pod in pods.items():
        uid, node = pod["metadata"]["uid"], pod["spec"]["nodeName"]
        bound = [n for what, n, _ in history.get(uid, []) if what == "bound"]
        assert bound == [node], (name, history.get(uid))
    for uid, events in history.items():
        assert sum(1 for what, _, _ in events if what == "bound") <= 1, (uid, events)
    result = replay(records, load_packer("native"))
    assert result.ok, result.divergence


def test_six_pods_ready_on_the_real_node_with_one_leader_per_role(installed: Install) -> None:
    inst, cp = installed, installed.cp
    pods = inst.all_ready(f"{inst.image_repo}:{inst.image_tag}")
    assert pods is not None
    leaders = inst.leaders()
    assert leaders is not None
    for x in pods:
        spec, (c,) = x["spec"], x["spec"]["containers"]
        assert spec["schedulerName"] == "default-scheduler"  # placed by kube-scheduler, not by hand
        assert spec["securityContext"]["runAsUser"] == RUN_AS and c["securityContext"]["readOnlyRootFilesystem"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        (status,) = x["status"]["containerStatuses"]
        assert status["ready"] and status["restartCount"] == 0, (x["metadata"]["name"], status)
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert (LOG_DIR_IN_POD in mounts) == (inst.log == "file"), mounts
        # with leader election every role has a Kubernetes identity: the projected token the
        # ServiceAccount admission plugin adds and the kubelet mounts
        assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts, mounts
    # the kernel's view of each container's main process: the chart's security context, applied
    tasks = {t[0]: int(t[1]) for t in (line.split() for line in cp.real_node._ctr(  # noqa: SLF001
        "tasks", "ls").splitlines()[1:]) if len(t) >= 3 and t[2] == "RUNNING"}
    for x in pods:
        cid = x["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
        status_lines = dict(line.split(":\t", 1) for line in
                            Path(f"/proc/{tasks[cid]}/status").read_text().splitlines() if ":\t" in line)
        assert status_lines["Uid"].split()[:2] == [str(RUN_AS)] * 2, status_lines["Uid"]
        assert status_lines["CapEff"] == "0000000000000000" and status_lines["NoNewPrivs"] == "1"
        assert status_lines["Seccomp"] == "2", status_lines["Seccomp"]  # RuntimeDefault: a filter
    # the log (one file on the host, or the topic), written by the leaders: the scheduler's
    # configuration and the informer's first listing of the cluster
    records = inst.records()
    assert any(isinstance(r.envelope.data, p.ConfigApplied) for r in records)
    assert any(isinstance(r.envelope.data, p.NodeObserved) and r.envelope.data.name == cp.real_node.name
               for r in records)
    assert {inst.lease_holder(r).split("_")[0] for r in ROLES} == set(leaders.values())  # type: ignore[union-attr]


def test_a_gang_a_job_and_a_fractional_gpu_pod_run_to_completion(installed: Install) -> None:
    inst, cp = installed, installed.cp
    qname, node = f"q-{inst.tag}", cp.real_node.name
    cp.call("POST", f"/apis/scheduling.run.ai/v2alpha2/namespaces/{WORKLOADS}/podgroups", {
        "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
        "metadata": {"name": "gang", "namespace": WORKLOADS},
        "spec": {"queue": qname, "minMember": 4}}, ok=(201,))
    gang = [f"gang-{i}" for i in range(4)]
    for name in gang:
        cp.call("POST", f"/api/v1/namespaces/{WORKLOADS}/pods",
                _workload_pod(name, qname, f"echo {name} on $(hostname); sleep 2",
                              annotations={"pod-group-name": "gang"}), ok=(201,))
    template = _workload_pod("x", qname, "echo batch; sleep 1")
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "batch", "namespace": WORKLOADS},
           "spec": {"completions": 3, "parallelism": 3, "backoffLimit": 0,
                    "template": {"metadata": {"labels": template["metadata"]["labels"]},
                                 "spec": template["spec"]}}}
    cp.call("POST", f"/apis/batch/v1/namespaces/{WORKLOADS}/jobs", job, ok=(201,))
    cp.call("POST", f"/api/v1/namespaces/{WORKLOADS}/pods",
            _workload_pod("half-gpu", qname, "echo half a GPU; sleep 15", annotations={"gpu-fraction": "0.5"}),
            ok=(201,))

    def reservation_running() -> dict[str, Any] | None:
        items = cp.call("GET", "/api/v1/namespaces/kai-resource-reservation/pods")["items"]
        return next((x for x in items if x["status"].get("phase") == "Running"), None)

    reservation = _wait(reservation_running, "the fractional pod's reservation pod Running", 90, cp)
    assert reservation["spec"]["nodeName"] == node
    assert reservation["spec"]["containers"][0]["image"] == cp_mod.PAUSE_IMAGE
    assert reservation["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"

    def gang_done() -> bool:
        return all(_phase(cp, n) == ("Succeeded", node) for n in gang)

    _wait(gang_done, "the gang of 4 run to completion on the real node", 120, cp)

    def job_complete() -> dict[str, Any] | None:
        got = cp.call("GET", f"/apis/batch/v1/namespaces/{WORKLOADS}/jobs/batch")
        conds = {c["type"]: c["status"] for c in got["status"].get("conditions") or []}
        assert conds.get("Failed") != "True", got["status"]
        return got if conds.get("Complete") == "True" else None

    assert _wait(job_complete, "the Job complete", 120, cp)["status"]["succeeded"] == 3
    _wait(lambda: _phase(cp, "half-gpu") == ("Succeeded", node), "the fractional pod run to completion", 90, cp)
    # the shares' reservation pod goes once no pod of its group is pending or running
    _wait(lambda: not cp.call("GET", "/api/v1/namespaces/kai-resource-reservation/pods")["items"],
          "the reservation pod released", 60, cp)
    job_pods = [x["metadata"]["name"] for x in cp.call(
        "GET", f"/api/v1/namespaces/{WORKLOADS}/pods?labelSelector=batch.kubernetes.io/job-name=batch")["items"]]
    assert len(job_pods) == 3
    for name in gang:
        (log_file,) = cp.real_node.pod_logs.glob(f"{WORKLOADS}_{name}_*/main/0.log")
        assert f"{name} on {name}" in log_file.read_text()
    _bound_once(inst, [*gang, *job_pods, "half-gpu"])
    # the gang was bound as one: every member's decision in the same cycle
    records = inst.records()
    decided = {r.envelope.data.name: r.position for r in records if isinstance(r.envelope.data, p.BindingDecided)}
    starts = [r.position for r in records if isinstance(r.envelope.data, p.CycleStarted)]
    cycles = {max(s for s in starts if s < decided[n]) for n in gang}
    assert len(cycles) == 1, cycles


def _submit(cp: Any, qname: str, names: Sequence[str]) -> None:
    for name in names:
        cp.call("POST", f"/api/v1/namespaces/{WORKLOADS}/pods",
                _workload_pod(name, qname, f"echo {name}; sleep 1"), ok=(201,))


def _all_succeeded(cp: Any, names: Sequence[str]) -> bool:
    return all(_phase(cp, n) == ("Succeeded", cp.real_node.name) for n in names)


def test_helm_upgrade_to_a_new_tag_rolls_every_pod_and_decides_each_pod_once(installed: Install) -> None:
    inst, cp = installed, installed.cp
    qname = f"q-{inst.tag}"
    before = {x["metadata"]["name"] for x in inst.pods()}
    new_image = f"{inst.image_repo}:{inst.image_tag}{UPGRADED_TAG_SUFFIX}"
    t0 = time.monotonic()
    inst.helm("upgrade", RELEASE, str(CHART), "-f", str(inst.values), "--set",
              f"image.tag={inst.image_tag}{UPGRADED_TAG_SUFFIX}")
    during = [f"roll-{i}" for i in range(6)]
    for i in range(0, len(during), 2):  # pods arriving while the Deployments roll
        _submit(cp, qname, during[i:i + 2])
        time.sleep(3)
    pods = _wait(lambda: inst.all_ready(new_image), "every pod rolled to the new tag and Ready", 300, cp)
    inst.timings["upgrade to all Ready"] = time.monotonic() - t0
    assert not before & {x["metadata"]["name"] for x in pods}  # all six replaced
    leaders = _wait(inst.leaders, "one leader per role after the upgrade", 60, cp)
    inst.timings["upgrade to three new leaders"] = time.monotonic() - t0
    assert set(leaders.values()) <= {x["metadata"]["name"] for x in pods}
    after = [f"after-roll-{i}" for i in range(2)]
    _submit(cp, qname, after)
    _wait(lambda: _all_succeeded(cp, [*during, *after]), "the pods submitted during and after the roll run", 180, cp)
    _bound_once(inst, [*during, *after])


def test_scheduler_container_killed_and_binder_pod_deleted_standbys_take_over(installed: Install) -> None:
    inst, cp = installed, installed.cp
    qname = f"q-{inst.tag}"
    values = yaml.safe_load(inst.values.read_text())
    lease_s = 15.0  # the chart's default leaderElection.leaseDuration, which the install keeps
    assert "leaderElection" not in values

    # -- SIGKILL the leading scheduler's container: another process leads within the lease ----
    # (the standby, or the killed container restarted by the kubelet in its pod: both compete
    # for the expired Lease, and either may win; the killed process's identity never comes back)
    leader = inst.leader_pod("scheduler")
    killed = inst.lease_holder("scheduler")
    assert leader is not None and killed is not None
    pod = cp.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{leader}")
    container_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    t0 = time.monotonic()
    cp.real_node._ctr("tasks", "kill", "-s", "SIGKILL", container_id)  # noqa: SLF001
    pending = [f"failover-{i}" for i in range(3)]
    _submit(cp, qname, pending)  # submitted while no scheduler leads
    took = _wait(lambda: (inst.leader_pod("scheduler") is not None and inst.lease_holder("scheduler") != killed) or None,
                 f"another scheduler than the killed {killed} to lead", lease_s + 20, cp, interval_s=0.1)
    assert took
    failover = time.monotonic() - t0
    inst.timings["scheduler failover (SIGKILL to another process leading)"] = failover
    assert failover <= lease_s + 2 * 2.0 + 3.0, failover  # the lease, two retry periods, slack
    _wait(lambda: _all_succeeded(cp, pending), "the pods submitted during the failover run", 120, cp)
    # the killed container was restarted in its pod by the kubelet, and stands by
    _wait(lambda: cp.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{leader}")["status"]
          ["containerStatuses"][0]["restartCount"] >= 1 or None, "the killed scheduler restarted", 60, cp)

    # -- delete the leading binder's pod: the Deployment replaces it, the standby leads -------
    binder = inst.leader_pod("binder")
    assert binder is not None
    t1 = time.monotonic()
    cp.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{binder}", ok=(200,))
    more = [f"binder-gone-{i}" for i in range(3)]
    _submit(cp, qname, more)
    _wait(lambda: (inst.leader_pod("binder") or binder) != binder, "another binder to lead", 60, cp, interval_s=0.1)
    inst.timings["binder handover (pod deleted to standby leading)"] = time.monotonic() - t1
    pods = _wait(lambda: inst.all_ready(f"{inst.image_repo}:{inst.image_tag}{UPGRADED_TAG_SUFFIX}"),
                 "the deleted binder pod replaced and every pod Ready", 120, cp)
    inst.timings["binder pod deleted to replacement Ready"] = time.monotonic() - t1
    assert binder not in {x["metadata"]["name"] for x in pods}
    _wait(lambda: _all_succeeded(cp, more), "the pods submitted while the binder was replaced run", 120, cp)
    _bound_once(inst, [*pending, *more])


def _evict(cp: Any, name: str) -> int:
    """The status of an eviction of the chart's pod `name` (what `kubectl drain` sends)."""
    status, _ = cp.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/eviction",
                           {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": name, "namespace": NAMESPACE}})
    return int(status)


def test_a_drain_of_the_node_takes_one_pod_per_role_at_a_time(installed: Install) -> None:
    """`kubectl drain` of the node, as it does it: cordon, then evict every pod. The chart's
    PodDisruptionBudgets (maxUnavailable 1 per role) let one pod of each role go and refuse the
    other (429) while the evicted one's replacement cannot start (the only node is cordoned), so
    every role keeps a leader. Uncordoned, the replacements start and the budgets then let the
    rest go, one per role; after it, six pods Ready, one leader per role, and pods submitted are
    scheduled once each."""
    inst, cp = installed, installed.cp
    node = cp.real_node.name
    image = f"{inst.image_repo}:{inst.image_tag}{UPGRADED_TAG_SUFFIX}"
    assert inst.all_ready(image) is not None and inst.leaders() is not None
    budgets = cp.call("GET", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets")["items"]
    assert sorted(b["metadata"]["name"] for b in budgets) == sorted(f"{RELEASE}-{r}" for r in ROLES)
    _wait(lambda: all((cp.call("GET", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/{RELEASE}-{r}")
                       ["status"].get("disruptionsAllowed") == 1) for r in ROLES) or None,
          "each budget to allow one disruption", 60, cp)

    def cordon(on: bool) -> None:
        cp.call("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": on}},
                content_type="application/merge-patch+json", ok=(200,))

    t0 = time.monotonic()
    cordon(True)
    kept: dict[str, str] = {}
    for role in ROLES:
        names = sorted(x["metadata"]["name"] for x in inst.pods(role))
        answers = {n: _evict(cp, n) for n in names}
        assert sorted(answers.values()) == [201, 429], (role, answers)  # one goes, the budget keeps one
        (kept[role],) = [n for n, s in answers.items() if s == 429]
    # the replacements wait for the node; the kept pods hold (or take) each role's Lease
    _wait(lambda: all(inst.leader_pod(r) == kept[r] for r in ROLES) or None,
          "the pods the budgets kept to lead", 15.0 + 20, cp)
    for role in ROLES:
        assert _evict(cp, kept[role]) == 429, role  # still refused: its replacement is not Ready
    cordon(False)
    _wait(lambda: inst.all_ready(image), "the replacements Ready once the node is uncordoned", 120, cp)
    # the drain goes on: the budgets now let the kept pods go too, one per role
    for role in ROLES:
        _wait(lambda: _evict(cp, kept[role]) == 201 or None, f"the kept {role} pod evicted", 60, cp)
    pods = _wait(lambda: inst.all_ready(image), "six pods Ready after the drain", 120, cp)
    assert not set(kept.values()) & {x["metadata"]["name"] for x in pods}
    _wait(inst.leaders, "one leader per role after the drain", 60, cp)
    inst.timings["drain, one pod per role at a time"] = time.monotonic() - t0
    names = [f"after-drain-{i}" for i in range(2)]
    _submit(cp, f"q-{inst.tag}", names)
    _wait(lambda: _all_succeeded(cp, names), "the pods submitted after the drain run", 120, cp)
    _bound_once(inst, names)


#: the namespace label the test's NetworkPolicy peers select
READER_LABEL = "kai-es.io/test-metrics-reader"


def _prober(cp: Any, namespace: str, target: str) -> str:
    """A busybox pod (the default scheduler's, on the real node) that tries `target`'s /healthz
    every half second, printing "ok" or "no" (refused, dropped or timed out after 2 s)."""
    name = f"probe-{uuid.uuid4().hex[:6]}"
    script = (f"while true; do if timeout 2 wget -q -O /dev/null http://{target}/healthz; then echo ok; "
              f"else echo no; fi; sleep 0.5; done")
    cp.call("POST", f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": cp.real_node.name}, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": cp_mod.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                 "command": ["/bin/busybox", "sh", "-c", script]}]}}, ok=(201,))
    return name


def _answers(cp: Any, namespace: str, pod: str) -> list[str]:
    logs = sorted(cp.real_node.pod_logs.glob(f"{namespace}_{pod}_*/main/*.log"))
    lines = [line.rsplit(" ", 1)[-1] for f in logs for line in f.read_text().splitlines()]
    return [x for x in lines if x in ("ok", "no")]


def test_the_network_policy_admits_its_peers_only_and_probes_still_pass(installed: Install) -> None:
    """kube-router's firewall (the real node's NetworkPolicy enforcement) applies the chart's
    NetworkPolicy: with `networkPolicy.from` empty anyone reaches the pods' http port; with it
    set to a namespace selector only pods of a namespace so labelled do (the others' connections
    are dropped), while the kubelet's probes (from the node) keep every pod Ready. Set back, the
    others reach it again."""
    inst, cp = installed, installed.cp
    image = inst.pods()[0]["spec"]["containers"][0]["image"]  # (the upgrade test may have rolled it)
    target = f"{inst.pods('scheduler')[0]['status']['podIP']}:8080"
    tag = uuid.uuid4().hex[:6]
    readers, others = f"np-readers-{tag}", f"np-others-{tag}"
    for ns in (readers, others):
        cp.create_namespace(ns)
    cp.call("PATCH", f"/api/v1/namespaces/{readers}", {"metadata": {"labels": {READER_LABEL: "true"}}},
            content_type="application/merge-patch+json", ok=(200,))
    probes = {ns: _prober(cp, ns, target) for ns in (readers, others)}

    def answering(readers_get: str, others_get: str, n: int = 4) -> Callable[[], bool]:
        def check() -> bool:
            a, b = (_answers(cp, ns, probes[ns])[-n:] for ns in (readers, others))
            return a == [readers_get] * n and b == [others_get] * n
        return check

    def set_peers(peers: list[dict[str, Any]]) -> None:
        inst.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set-json",
                  f"networkPolicy.from={json.dumps(peers)}", "--wait", "--timeout", "120s")
        policy = cp.call("GET", f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies/{RELEASE}")
        assert policy["spec"]["ingress"][0].get("from", []) == peers, policy["spec"]

    _wait(answering("ok", "ok"), "both namespaces' probes reaching the scheduler (from: anyone)", 90, cp)
    set_peers([{"namespaceSelector": {"matchLabels": {READER_LABEL: "true"}}}])
    _wait(answering("ok", "no"), "the readers' probes answered and the others' dropped", 90, cp)
    assert inst.all_ready(image), "a chart pod is not Ready under the restricted policy"
    set_peers([])
    _wait(answering("ok", "ok"), "both namespaces' probes reaching the scheduler again", 90, cp)
    for ns in (readers, others):
        cp.call("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202))


def test_helm_uninstall_leaves_only_what_the_readme_says_it_keeps(installed: Install) -> None:
    inst, cp = installed, installed.cp
    inst.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    _wait(lambda: not inst.pods() and not cp.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"],
          "the chart's pods gone", 90, cp)
    ours = f"app.kubernetes.io/instance={RELEASE}"
    for path in (f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets",
                 f"/api/v1/namespaces/{NAMESPACE}/configmaps?labelSelector={ours}",
                 f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts?labelSelector={ours}",
                 f"/apis/rbac.authorization.k8s.io/v1/clusterroles?labelSelector={ours}",
                 f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings?labelSelector={ours}",
                 f"/apis/rbac.authorization.k8s.io/v1/roles?labelSelector={ours}",
                 f"/apis/rbac.authorization.k8s.io/v1/rolebindings?labelSelector={ours}",
                 f"/apis/policy/v1/poddisruptionbudgets?labelSelector={ours}",
                 f"/apis/networking.k8s.io/v1/networkpolicies?labelSelector={ours}",
                 f"/api/v1/services?labelSelector={ours}", f"/api/v1/secrets?labelSelector={ours}",
                 "/api/v1/namespaces/kai-resource-reservation/pods"):
        assert cp.call("GET", path)["items"] == [], path
    # what deploy/README.md ("Uninstall") says stays: the CRDs (with the Queues and PodGroups),
    # the reservation namespace, the Leases the processes made, and the log on its volume
    for crd in sorted(CRD_DIR.glob("*.yaml")):
        name = yaml.safe_load(crd.read_text())["metadata"]["name"]
        assert cp.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")[0] == 200, name
    assert cp.request("GET", "/api/v1/namespaces/kai-resource-reservation")[0] == 200
    leases = cp.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")["items"]
    assert sorted(x["metadata"]["name"] for x in leases) == sorted(f"{RELEASE}-{r}" for r in ROLES)
    assert inst.records()  # the log stays (its file, or its Kafka topic)
    # and the node runs no container of kai-es any more (exited ones wait for the kubelet's
    # container garbage collection)
    ours_ids = {line.split()[0] for line in cp.real_node._ctr("containers", "ls").splitlines()[1:]  # noqa: SLF001
                if inst.image_repo in line}
    running = [line.split() for line in cp.real_node._ctr("tasks", "ls").splitlines()[1:]]  # noqa: SLF001
    assert not [t for t in running if t[0] in ours_ids and t[-1] == "RUNNING"], running
