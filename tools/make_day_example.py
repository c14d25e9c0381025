"""Generate examples/cluster-day.yaml: 100 nodes x 8 GPUs, four teams under two departments,
~2,000 pods over a simulated day (training gangs, elastic jobs, fractional inference, CPU jobs).

Deterministic: a fixed seed, so the committed file is reproducible:
    python tools/make_day_example.py > examples/cluster-day.yaml
"""

from __future__ import annotations

import random
import sys

import yaml

SEED = 20260101
NODES = 100
GPUS = 8


def main() -> None:
    rnd = random.Random(SEED)
    docs: list[dict] = [{
        "apiVersion": "kai-es.io/v1alpha1", "kind": "Scenario", "metadata": {"name": "cluster-day"},
        "spec": {"start": "2026-01-05T00:00:00Z",
                 "scheduler": {"placementStrategy": {"gpu": "binpack", "cpu": "binpack"},
                               "stateDigestEvery": 50},
                 "simulation": {"until": "24h", "cyclePeriod": "5s"}},
    }]
    for i in range(NODES):
        pool = "a100" if i < 40 else "h100"
        docs.append({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": f"gpu-{i:03d}",
                                  "labels": {"nvidia.com/gpu.memory": "81920" if pool == "h100" else "40960",
                                             "nvidia.com/gpu.product": pool.upper(),
                                             "topology.kubernetes.io/zone": f"rack-{i // 10}"}},
                     "status": {"allocatable": {"cpu": "128", "memory": "1024Gi",
                                                "nvidia.com/gpu": str(GPUS), "pods": "110"}}})
    queues = {"ml-research": None, "ml-product": None, "vision": "ml-research", "nlp": "ml-research",
              "serving": "ml-product", "analytics": "ml-product"}
    quotas = {"ml-research": 480, "ml-product": 320, "vision": 200, "nlp": 280, "serving": 240, "analytics": 80}
    for name, parent in queues.items():
        spec: dict = {"resources": {"gpu": {"quota": quotas[name], "limit": -1, "overQuotaWeight": 1}}}
        if parent:
            spec["parentQueue"] = parent
        docs.append({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec})
    pods = 0
    n = 0
    while pods < 2000:
        n += 1
        submit = rnd.randrange(0, 20 * 3600)
        team = rnd.choices(["vision", "nlp", "serving", "analytics"], weights=[3, 4, 3, 1])[0]
        ann = {"kai-es.io/submit-after": f"{submit}s"}
        if team == "serving":
            replicas = rnd.choice([1, 2, 4])
            ann["kai-es.io/run-for"] = f"{rnd.randrange(600, 6 * 3600)}s"
            fraction = rnd.choice(["0.25", "0.5", "0.5", "1"])
            tmpl_ann = {} if fraction == "1" else {"gpu-fraction": fraction}
            req = {"cpu": "4", "memory": "16Gi"}
            if fraction == "1":
                req["nvidia.com/gpu"] = "1"
            docs.append({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": f"svc-{n}", "labels": {"kai.scheduler/queue": team}, "annotations": ann},
                         "spec": {"replicas": replicas, "template": {
                             "metadata": {"annotations": tmpl_ann},
                             "spec": {"schedulerName": "kai-scheduler", "priorityClassName": "inference",
                                      "containers": [{"name": "server", "image": "server",
                                                      "resources": {"requests": req}}]}}}})
            pods += replicas
        elif team == "analytics":
            ann["kai-es.io/run-for"] = f"{rnd.randrange(300, 3 * 3600)}s"
            par = rnd.choice([1, 2, 4])
            docs.append({"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": f"etl-{n}", "labels": {"kai.scheduler/queue": team}, "annotations": ann},
                         "spec": {"parallelism": par, "template": {"spec": {
                             "schedulerName": "kai-scheduler",
                             "containers": [{"name": "etl", "image": "etl",
                                             "resources": {"requests": {"cpu": "16", "memory": "64Gi"}}}]}}}})
            pods += par
        else:
            ann["kai-es.io/run-for"] = f"{rnd.randrange(1800, 8 * 3600)}s"
            workers = rnd.choice([1, 1, 2, 2, 4, 8])
            gpus = rnd.choice([1, 2, 4, 8])
            docs.append({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                         "metadata": {"name": f"train-{n}", "labels": {"kai.scheduler/queue": team}, "annotations": ann},
                         "spec": {"pytorchReplicaSpecs": {
                             "Master": {"replicas": 1, "template": {"spec": {
                                 "schedulerName": "kai-scheduler",
                                 "containers": [{"name": "pytorch", "image": "trainer",
                                                 "resources": {"requests": {"cpu": "8", "memory": "64Gi",
                                                                            "nvidia.com/gpu": str(gpus)}}}]}}},
                             "Worker": {"replicas": workers, "template": {"spec": {
                                 "schedulerName": "kai-scheduler",
                                 "containers": [{"name": "pytorch", "image": "trainer",
                                                 "resources": {"requests": {"cpu": "8", "memory": "64Gi",
                                                                            "nvidia.com/gpu": str(gpus)}}}]}}}}}})
            pods += 1 + workers
    sys.stdout.write("# Generated by tools/make_day_example.py (seeded); do not edit by hand.\n")
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, width=120))


if __name__ == "__main__":
    main()
