"""kai-es end to end on a real control plane, against the bare control plane's floor, in one run.

On a freshly started control plane (tools/k8s/controlplane.py), two sets of `--nodes` KWOK GPU
nodes (node pools `floor` and `kai-es`):
1. the floor (tools/bench/bench_k8s_floor.py): `--pods` one-GPU pods created and bound
   round-robin by one Python process, no scheduling at all;
2. kai-es: `kai-es informer`, `kai-es scheduler` and `kai-es binder` as separate processes over
   a file log (started and ready before the clock starts), then `--pods` one-GPU pods of a queue
   in pool `kai-es` created the same way but not bound: kai-es schedules and binds them.
Both time the first create to the last pod reported Running (a pod watch). Prints both times,
their ratio (issue 8's target: kai-es within 1.5x of the floor) and where the CPU went: the
control plane's components and each kai-es process. Asserts nothing.

    python3 tools/bench/bench_k8s_e2e.py                          # 50 nodes, 400 pods
    python3 tools/bench/bench_k8s_e2e.py --nodes 500 --pods 4000    # the issue's size
    python3 tools/bench/bench_k8s_e2e.py --gang 512                  # one 512-pod gang, a node each

With `--gang N`: N nodes and N pods, each asking a whole node's GPUs, all of one PodGroup with
minMember N (the floor binds them one per node).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


floor = _load("kai_es_bench_k8s_floor", HERE / "bench_k8s_floor.py")
POOL = "kai.scheduler/node-pool"


def _queue(cp: Any, name: str) -> None:
    cp.call("POST", "/apis/scheduling.run.ai/v2/queues",
            {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name},
             "spec": {"resources": {"gpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}},
            ok=(201, 409))


def _start(args: list[str], stderr: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "kai_es", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=open(stderr, "wb"))


def _wait_ready(proc: subprocess.Popen[bytes], stderr: Path, word: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while f"{word} ready" not in stderr.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{word} did not start:\n{stderr.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--pods", type=int, default=400)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--period", default="100ms", help="kai-es scheduler --period")
    ap.add_argument("--gang", type=int, default=0, help="one gang of this many pods, a node each")
    args = ap.parse_args()
    gpus, annotations = 1, None
    if args.gang:
        args.nodes = args.pods = args.gang
        gpus, annotations = args.gpus_per_node, {"pod-group-name": "gang"}
    cpm = floor._load_controlplane()
    crds = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "deploy" / "crds").glob("*.yaml"))]
    # no controller-manager, as for the floor (bench_k8s_floor.py): the same control plane for both
    with cpm.ControlPlane(controller_manager=False) as cp, tempfile.TemporaryDirectory() as tmp:
        cp.install_crds(crds)
        print(f"control plane up in {cp.last_start_seconds:.1f}s ({cp.base_url})")
        floor_nodes = floor.make_nodes(cp, "floor", args.nodes, args.gpus_per_node, {POOL: "floor"})
        floor.make_nodes(cp, "kai", args.nodes, args.gpus_per_node, {POOL: "kai-es"})
        print(f"2 x {args.nodes} KWOK nodes Ready")

        base = asyncio.run(floor._run(cp, floor_nodes, args.pods, args.concurrency, ns="floor",
                                      gpus=gpus))
        print(f"floor:  all {args.pods} Running {base['all_running_s']:.1f}s after the first create")

        log = Path(tmp) / "events.jsonl"
        kube = ["--kubeconfig", str(cp.kubeconfig)]
        specs = {"informer": ["informer", "--log", str(log), *kube],
                 "scheduler": ["scheduler", "--log", str(log), "--period", args.period,
                               "--snapshot-every", "0"],
                 "binder": ["binder", "--log", str(log), *kube]}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for word, argv in specs.items():
                err = Path(tmp) / f"{word}.stderr"
                procs[word] = _start(argv, err)
                _wait_ready(procs[word], err, word)
            _queue(cp, "bench")
            cp.create_namespace("kai-es")
            if args.gang:
                cp.call("POST", "/apis/scheduling.run.ai/v2alpha2/namespaces/kai-es/podgroups",
                        {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                         "metadata": {"name": "gang", "namespace": "kai-es"},
                         "spec": {"queue": "bench", "minMember": args.gang}})
            time.sleep(1.0)
            cpu0 = {w: floor._cpu_seconds(pr.pid) for w, pr in procs.items()}
            ours = asyncio.run(floor._run(cp, [], args.pods, args.concurrency, bind=False, ns="kai-es",
                                          labels={POOL: "kai-es", "kai.scheduler/queue": "bench"},
                                          annotations=annotations, gpus=gpus))
            cpu1 = {w: floor._cpu_seconds(pr.pid) for w, pr in procs.items()}
        finally:
            for pr in procs.values():
                pr.kill()
                pr.wait()
        log_mib = log.stat().st_size / 2**20
    ratio = ours["all_running_s"] / base["all_running_s"]
    print(f"kai-es: all {args.pods} Running {ours['all_running_s']:.1f}s after the first create "
          f"(informer + file log + scheduler + binder as separate processes)")
    print(f"ratio kai-es / floor: {ratio:.2f} (target <= 1.5)")
    for name, r in (("floor", base), ("kai-es", ours)):
        cpu = r["cpu_etcd_s"] + r["cpu_kube-apiserver_s"] + r["cpu_kwok_s"]
        print(f"control-plane CPU during {name}: {cpu:.1f}s = {1000 * cpu / args.pods:.1f} ms/pod")
    ours_cpu = {w: cpu1[w] - cpu0[w] for w in cpu0}
    print("kai-es CPU: " + ", ".join(f"{w} {s:.2f}s ({1000 * s / args.pods:.2f} ms/pod)"
                                      for w, s in ours_cpu.items()) + f"; log {log_mib:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
