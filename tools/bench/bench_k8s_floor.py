"""The bare control plane's floor for binding pods: no scheduling at all.

On a freshly started control plane (tools/k8s/controlplane.py: etcd + kube-apiserver + KWOK on
loopback), creates `--nodes` KWOK GPU nodes, then `--pods` one-GPU pods, each bound right after
its creation through `pods/binding` to the next node round-robin, `--concurrency` at a time, from
one Python process (kubernetes-asyncio, raw JSON). A pod watch (raw lines) times the moment the
last pod is reported Running. This is the floor an end-to-end scheduling benchmark is measured
against (issue 8: kai-es within 1.5x of it).

Prints: wall time from the first create to all Running, create+bind throughput, and the CPU
seconds etcd, kube-apiserver and KWOK spent during that window (per pod). Asserts nothing.

    python3 tools/bench/bench_k8s_floor.py                        # 50 nodes, 400 pods (~10 s)
    python3 tools/bench/bench_k8s_floor.py --nodes 500 --pods 4000  # the issue's size
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kubernetes_asyncio import client  # noqa: E402

from kai_es.adapters.kubernetes.client import api_client  # noqa: E402


def _load_controlplane() -> Any:
    spec = importlib.util.spec_from_file_location("kai_es_tools_k8s_controlplane",
                                                  REPO / "tools" / "k8s" / "controlplane.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process (its threads included), from /proc."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _control_plane_cpu(cp: Any) -> dict[str, float]:
    return {"etcd": _cpu_seconds(cp.etcd.pid), "kube-apiserver": _cpu_seconds(cp.apiserver.pid),
            "kwok": _cpu_seconds(cp.kwok.pid)}


def _pod(name: str, ns: str, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None, gpus: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": dict(labels or {}),
                         "annotations": dict(annotations or {})},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{
                "name": "main", "image": "example.invalid/x:1",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(gpus)},
                              "limits": {"nvidia.com/gpu": str(gpus)}}}]}}  # fmt: skip


async def _watch_running(api: client.ApiClient, ns: str, total: int, rv: str,
                         done: asyncio.Event, stamps: dict[str, float]) -> None:
    """Stamp each pod's first Running; re-watch from the last resourceVersion when the server
    ends the stream (it drops a watcher that falls behind, as this busy client does)."""
    core = client.CoreV1Api(api)
    while True:
        resp = await core.list_namespaced_pod(ns, watch=True, resource_version=rv,
                                              allow_watch_bookmarks=True, timeout_seconds=600,
                                              _preload_content=False)
        buf = b""
        try:
            async for chunk in resp.content.iter_any():
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"watch error: {obj}")
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK" and obj.get("status", {}).get("phase") == "Running":
                        stamps.setdefault(obj["metadata"]["name"], time.monotonic())
                        if len(stamps) == total:
                            done.set()
                            return
        finally:
            resp.close()


async def _run(cp: Any, nodes: list[str], n_pods: int, concurrency: int, *, bind: bool = True,
               labels: dict[str, str] | None = None, ns: str | None = None,
               annotations: dict[str, str] | None = None, gpus: int = 1) -> dict[str, float]:
    """Create `n_pods` pods (`labels`), bound round-robin to `nodes` right after creation when
    `bind` (the floor), else left to a scheduler; time until all are Running."""
    ns = ns or f"bench-{os.getpid()}"
    cp.create_namespace(ns)
    api = await api_client(cp.kubeconfig)
    watch_api = await api_client(cp.kubeconfig)
    try:
        core = client.CoreV1Api(api)
        listing = await core.list_namespaced_pod(ns, _preload_content=False)
        rv = json.loads(await listing.read())["metadata"]["resourceVersion"]
        done, stamps = asyncio.Event(), {}
        watcher = asyncio.create_task(_watch_running(watch_api, ns, n_pods, rv, done, stamps))
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n_pods):
            queue.put_nowait(i)
        errors: list[str] = []

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                name = f"p-{i}"
                r = await core.create_namespaced_pod(ns, _pod(name, ns, labels, annotations, gpus),
                                                     _preload_content=False)
                pod = json.loads(await r.read())
                if r.status != 201:
                    errors.append(f"create {name}: {r.status}")
                    continue
                if not bind:
                    continue
                body = {"apiVersion": "v1", "kind": "Binding",
                        "metadata": {"name": name, "namespace": ns, "uid": pod["metadata"]["uid"]},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[i % len(nodes)]}}
                b = await core.create_namespaced_pod_binding(name, ns, body, _preload_content=False)  # type: ignore[arg-type]
                await b.read()
                if b.status != 201:
                    errors.append(f"bind {name}: {b.status}")

        cpu0 = _control_plane_cpu(cp)
        t0 = time.monotonic()

        async def progress() -> None:
            while True:
                await asyncio.sleep(5)
                print(f"  {time.monotonic() - t0:5.1f}s: {n_pods - queue.qsize()} created, "
                      f"{len(stamps)} Running", file=sys.stderr, flush=True)
                if watcher.done() and not done.is_set():
                    raise SystemExit(f"the pod watch ended early: {watcher.exception()!r}")

        reporter = asyncio.create_task(progress())
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        t_bound = time.monotonic()
        if errors:
            raise SystemExit(f"{len(errors)} errors, first: {errors[0]}")
        await asyncio.wait_for(asyncio.wait([asyncio.ensure_future(done.wait()), reporter],
                                            return_when=asyncio.FIRST_COMPLETED), timeout=600)
        if reporter.done():
            reporter.result()
        t_running = time.monotonic()
        watcher.cancel()
        reporter.cancel()
        cpu1 = _control_plane_cpu(cp)
        out = {"created_and_bound_s": t_bound - t0, "all_running_s": t_running - t0}
        out.update({f"cpu_{k}_s": cpu1[k] - cpu0[k] for k in cpu0})
        return out
    finally:
        await api.close()
        await watch_api.close()


def make_nodes(cp: Any, prefix: str, count: int, gpus: int,
               labels: dict[str, str] | None = None) -> list[str]:
    """`count` KWOK GPU nodes named `prefix-i`, created at once, then waited for Ready."""
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        cp.create_gpu_node(name, gpus=gpus, labels=labels, wait_ready=False)
    for name in names:
        cp.wait_node_ready(name)
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--pods", type=int, default=400)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=50)
    args = ap.parse_args()
    cpm = _load_controlplane()
    # no controller-manager: the floor is what binding costs etcd, the apiserver and KWOK (its
    # garbage collector alone would watch every pod); nothing here needs a controller
    with cpm.ControlPlane(controller_manager=False) as cp:
        print(f"control plane up in {cp.last_start_seconds:.1f}s ({cp.base_url})")
        t = time.monotonic()
        names = make_nodes(cp, "node", args.nodes, args.gpus_per_node)
        print(f"{args.nodes} KWOK nodes Ready in {time.monotonic() - t:.1f}s")
        r = asyncio.run(_run(cp, names, args.pods, args.concurrency))
    cpu = r["cpu_etcd_s"] + r["cpu_kube-apiserver_s"] + r["cpu_kwok_s"]
    print(f"{args.pods} pods created and bound in {r['created_and_bound_s']:.1f}s "
          f"({args.pods / r['created_and_bound_s']:.0f} pods/s, concurrency {args.concurrency})")
    print(f"all {args.pods} Running {r['all_running_s']:.1f}s after the first create")
    print(f"control-plane CPU: {cpu:.1f}s = {1000 * cpu / args.pods:.1f} ms/pod "
          f"(apiserver {1000 * r['cpu_kube-apiserver_s'] / args.pods:.1f}, "
          f"etcd {1000 * r['cpu_etcd_s'] / args.pods:.1f}, kwok {1000 * r['cpu_kwok_s'] / args.pods:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
