"""Workload manifests as each operator's users write them (the operators' docs as the guide), one
per kind the podgrouper knows, with the PodGroups KAI's podgrouper makes of them. Shared by
tests/test_workloads.py (the scenario loader's groups) and the informer-path comparison."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HEADER = """apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: team-a}
spec: {resources: {gpu: {quota: -1}}}
---
"""

GPU = "resources: {requests: {cpu: '1', memory: 1Gi, nvidia.com/gpu: '1'}}"


def container(name: str = "main") -> str:
    return f"[{{name: {name}, image: example/image:1, {GPU}}}]"


POD_SPEC = f"{{schedulerName: kai-scheduler, containers: {container()}}}"


@dataclass(frozen=True)
class Group:
    """An expected PodGroup: `name` is a template over the loaded objects' uids — `{Kind/name}`
    is that object's uid — and the pods it holds, with their sub-group."""

    name: str
    spec: dict[str, Any]
    pods: dict[str, str] = field(default_factory=dict)  # pod name -> sub-group ("" none)


@dataclass(frozen=True)
class Case:
    kind: str
    manifest: str
    groups: tuple[Group, ...]
    settings: dict[str, Any] | None = None  # the Scenario document's spec, if any

    def text(self) -> str:
        import yaml  # noqa: PLC0415

        head = ""
        if self.settings is not None:
            head = yaml.safe_dump({"apiVersion": "kai-es.io/v1alpha1", "kind": "Scenario",
                                   "metadata": {"name": "w"}, "spec": self.settings}) + "---\n"
        return head + HEADER + self.manifest


def spec(min_member: int | None = 1, queue: str = "team-a", priority: str = "train", **more: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"queue": queue, "priorityClassName": priority, **more}
    if min_member is not None:
        out["minMember"] = min_member
    return out


def leaf(name: str, n: int, parent: str = "", **more: Any) -> dict[str, Any]:
    return {"name": name, **({"parent": parent} if parent else {}), "minMember": n, **more}


def inner(name: str, n: int, parent: str = "", **more: Any) -> dict[str, Any]:
    return {"name": name, **({"parent": parent} if parent else {}), "minSubGroup": n, **more}


TOPOLOGY = {"topology": "cluster-topology", "requiredTopologyLevel": "example.com/rack"}

NOCODE_RULES = [
    {"group": "example.com", "kind": "TrainingRun", "plural": "trainingruns", "replicasPath": "spec.replicas",
     "minMemberPath": "spec.minAvailable", "templatePath": "spec.template"},
    {"group": "example.com", "kind": "ServingGroup", "plural": "servinggroups", "priorityClass": "inference",
     "components": [
         {"name": "router", "podSelector": {"example.com/role": "router"}, "replicasPath": "spec.router.replicas",
          "templatePath": "spec.router.template"},
         {"name": "engine", "podSelector": {"example.com/role": "engine"}, "replicasPath": "spec.engine.replicas",
          "minReplicasPath": "spec.engine.minReplicas", "templatePath": "spec.engine.template"}]},
]

CASES: tuple[Case, ...] = (
    Case("Pod", f"""apiVersion: v1
kind: Pod
metadata: {{name: solo, labels: {{kai.scheduler/queue: team-a}}}}
spec: {POD_SPEC}
""", (Group("pg-solo-{Pod/solo}", spec(), {"solo": ""}),)),
    Case("Pod (spark-submit)", f"""apiVersion: v1
kind: Pod
metadata:
  name: pi-driver
  uid: 11111111-1111-4111-8111-111111111111
  labels: {{kai.scheduler/queue: team-a, spark-app-name: pi, spark-app-selector: spark-0123, spark-role: driver}}
spec: {POD_SPEC}
---
apiVersion: v1
kind: Pod
metadata:
  name: pi-exec-1
  labels: {{kai.scheduler/queue: team-a, spark-app-name: pi, spark-app-selector: spark-0123, spark-role: executor}}
  ownerReferences: [{{apiVersion: v1, kind: Pod, name: pi-driver, uid: 11111111-1111-4111-8111-111111111111, controller: true}}]
spec: {POD_SPEC}
""", (Group("spark-0123", spec(), {"pi-driver": "", "pi-exec-1": ""}),)),
    Case("Job", f"""apiVersion: batch/v1
kind: Job
metadata:
  name: hpo
  labels: {{kai.scheduler/queue: team-a}}
  annotations: {{kai.scheduler/batch-min-member: "2"}}
spec:
  parallelism: 3
  completions: 6
  template:
    spec: {{schedulerName: kai-scheduler, restartPolicy: Never, containers: {container()}}}
""", (Group("pg-hpo-{Job/hpo}", spec(2), {"hpo-0": "", "hpo-1": "", "hpo-2": ""}),)),
    Case("CronJob", f"""apiVersion: batch/v1
kind: CronJob
metadata: {{name: nightly}}
spec:
  schedule: "0 2 * * *"
  jobTemplate:
    metadata:
      labels: {{kai.scheduler/queue: team-a}}
      annotations: {{kai.scheduler/batch-min-member: "2"}}
    spec:
      parallelism: 2
      template:
        spec: {{schedulerName: kai-scheduler, restartPolicy: OnFailure, containers: {container()}}}
""", (Group("pg-nightly-29453760-{Job/nightly-29453760}", spec(1),
            {"nightly-29453760-0": "", "nightly-29453760-1": ""}),)),
    Case("Deployment", f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec: {POD_SPEC}
""", (Group("pg-web-0-{Pod/web-0}", spec(priority="inference"), {"web-0": ""}),
      Group("pg-web-1-{Pod/web-1}", spec(priority="inference"), {"web-1": ""}))),
    Case("ReplicaSet", f"""apiVersion: apps/v1
kind: ReplicaSet
metadata: {{name: cache, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: cache}}}}
  template:
    metadata: {{labels: {{app: cache}}}}
    spec: {POD_SPEC}
""", (Group("pg-cache-{ReplicaSet/cache}", spec(), {"cache-0": "", "cache-1": ""}),)),
    Case("StatefulSet", f"""apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: shards
  labels: {{kai.scheduler/queue: team-a}}
  annotations: {{kai.scheduler/batch-min-member: "3"}}
spec:
  replicas: 3
  podManagementPolicy: Parallel
  serviceName: shards
  selector: {{matchLabels: {{app: shards}}}}
  template:
    metadata: {{labels: {{app: shards}}}}
    spec: {POD_SPEC}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: ordered
  labels: {{kai.scheduler/queue: team-a}}
  annotations: {{kai.scheduler/batch-min-member: "2"}}
spec:
  replicas: 2
  serviceName: ordered
  selector: {{matchLabels: {{app: ordered}}}}
  template:
    metadata: {{labels: {{app: ordered}}}}
    spec: {POD_SPEC}
""", (Group("pg-shards-{StatefulSet/shards}", spec(3), {"shards-0": "", "shards-1": "", "shards-2": ""}),
      Group("pg-ordered-{StatefulSet/ordered}", spec(1), {"ordered-0": "", "ordered-1": ""}))),
    Case("PyTorchJob", f"""apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: mnist, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("pytorch")}}}
    Worker:
      replicas: 3
      restartPolicy: OnFailure
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("pytorch")}}}
""", (Group("pg-mnist-{PyTorchJob/mnist}", spec(4, subGroups=[leaf("master", 1), leaf("worker", 3)]),
            {"mnist-master-0": "master", "mnist-worker-0": "worker", "mnist-worker-1": "worker",
             "mnist-worker-2": "worker"}),)),
    Case("PyTorchJob (elastic, segments)", f"""apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: tp4
  labels: {{kai.scheduler/queue: team-a}}
  annotations: {{kai.scheduler/topology: cluster-topology}}
spec:
  elasticPolicy: {{minReplicas: 5, maxReplicas: 9, rdzvBackend: c10d}}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("pytorch")}}}
    Worker:
      replicas: 8
      template:
        metadata:
          annotations:
            kai.scheduler/segment-size: "4"
            kai.scheduler/segment-topology-required-placement: example.com/rack
        spec: {{schedulerName: kai-scheduler, containers: {container("pytorch")}}}
""", (Group("pg-tp4-{PyTorchJob/tp4}", spec(5, topologyConstraint={"topology": "cluster-topology"}, subGroups=[
        leaf("master", 1), inner("worker", 2), leaf("worker-0", 4, "worker", topologyConstraint=TOPOLOGY),
        leaf("worker-1", 0, "worker", topologyConstraint=TOPOLOGY)]),
        {"tp4-master-0": "master", "tp4-worker-0": "worker-0", "tp4-worker-3": "worker-0",
         "tp4-worker-4": "worker-1", "tp4-worker-7": "worker-1"}),)),
    Case("TFJob", f"""apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {{name: dist-mnist, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  tfReplicaSpecs:
    Chief:
      replicas: 1
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("tensorflow")}}}
    PS:
      replicas: 1
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("tensorflow")}}}
    Worker:
      replicas: 2
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("tensorflow")}}}
""", (Group("pg-dist-mnist-{TFJob/dist-mnist}", spec(4),
            {"dist-mnist-chief-0": "", "dist-mnist-ps-0": "", "dist-mnist-worker-1": ""}),)),
    Case("MPIJob", f"""apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {{name: pi, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  slotsPerWorker: 1
  runPolicy: {{cleanPodPolicy: Running}}
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("mpi-launcher")}}}
    Worker:
      replicas: 2
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("mpi-worker")}}}
""", (Group("pg-pi-{MPIJob/pi}", spec(3), {"pi-launcher-0": "", "pi-worker-0": "", "pi-worker-1": ""}),)),
    Case("MPIJob (WaitForWorkersReady)", f"""apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {{name: late, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  launcherCreationPolicy: WaitForWorkersReady
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("mpi-launcher")}}}
    Worker:
      replicas: 2
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("mpi-worker")}}}
""", (Group("pg-late-{MPIJob/late}", spec(3), {"late-launcher-0": "", "late-worker-0": ""}),)),
    Case("XGBoostJob", f"""apiVersion: kubeflow.org/v1
kind: XGBoostJob
metadata: {{name: iris, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  xgbReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("xgboost")}}}
    Worker:
      replicas: 2
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("xgboost")}}}
""", (Group("pg-iris-{XGBoostJob/iris}", spec(3), {"iris-master-0": "", "iris-worker-1": ""}),)),
    Case("JAXJob", f"""apiVersion: kubeflow.org/v1
kind: JAXJob
metadata: {{name: jax-simple, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  jaxReplicaSpecs:
    Worker:
      replicas: 2
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("jax")}}}
""", (Group("pg-jax-simple-{JAXJob/jax-simple}", spec(2), {"jax-simple-worker-0": "", "jax-simple-worker-1": ""}),)),
    Case("PaddleJob", f"""apiVersion: kubeflow.org/v1
kind: PaddleJob
metadata: {{name: paddle, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  paddleReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("paddle")}}}
    Worker:
      replicas: 2
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("paddle")}}}
""", (Group("pg-paddle-{PaddleJob/paddle}", spec(1), {"paddle-master-0": "", "paddle-worker-1": ""}),)),
    Case("TrainJob", f"""apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {{name: torch-distributed}}
spec:
  mlPolicy: {{numNodes: 1, torch: {{numProcPerNode: auto}}}}
  template:
    spec:
      replicatedJobs:
      - name: node
        template:
          metadata: {{labels: {{trainer.kubeflow.org/trainjob-ancestor-step: trainer}}}}
          spec:
            template:
              spec: {{schedulerName: kai-scheduler, containers: [{{name: node, image: pytorch/pytorch}}]}}
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: fine-tune, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  runtimeRef: {{name: torch-distributed}}
  trainer:
    numNodes: 3
    resourcesPerNode: {{requests: {{cpu: '1', memory: 1Gi, nvidia.com/gpu: '1'}}}}
""", (Group("pg-fine-tune-{JobSet/fine-tune}", spec(None, minSubGroup=1, subGroups=[
        inner("node", 1), leaf("node-replica-0", 3, "node")]),
        {"fine-tune-node-0-0": "node-replica-0", "fine-tune-node-0-2": "node-replica-0"}),)),
    Case("JobSet", f"""apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {{name: sim, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  replicatedJobs:
  - name: driver
    replicas: 1
    template:
      spec:
        parallelism: 1
        template:
          spec: {{schedulerName: kai-scheduler, restartPolicy: Never, containers: {container()}}}
  - name: workers
    replicas: 2
    template:
      metadata:
        annotations: {{kai.scheduler/topology: cluster-topology, kai.scheduler/topology-required-placement: example.com/rack}}
      spec:
        parallelism: 2
        completions: 2
        template:
          spec: {{schedulerName: kai-scheduler, restartPolicy: Never, containers: {container()}}}
""", (Group("pg-sim-{JobSet/sim}", spec(None, minSubGroup=2, subGroups=[
        inner("driver", 1), leaf("driver-replica-0", 1, "driver"), inner("workers", 2),
        leaf("workers-replica-0", 2, "workers", topologyConstraint=TOPOLOGY),
        leaf("workers-replica-1", 2, "workers", topologyConstraint=TOPOLOGY)]),
        {"sim-driver-0-0": "driver-replica-0", "sim-workers-0-1": "workers-replica-0",
         "sim-workers-1-0": "workers-replica-1"}),)),
    Case("LeaderWorkerSet", f"""apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {{name: vllm, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 4
    restartPolicy: RecreateGroupOnPodRestart
    leaderTemplate:
      metadata: {{labels: {{role: leader}}}}
      spec: {{schedulerName: kai-scheduler, containers: {container("vllm-leader")}}}
    workerTemplate:
      spec: {{schedulerName: kai-scheduler, containers: {container("vllm-worker")}}}
""", (Group("pg-vllm-{LeaderWorkerSet/vllm}-group-0", spec(4, subGroups=[leaf("leader", 1), leaf("workers", 3)]),
            {"vllm-0": "leader", "vllm-0-1": "workers", "vllm-0-3": "workers"}),
      Group("pg-vllm-{LeaderWorkerSet/vllm}-group-1", spec(4, subGroups=[leaf("leader", 1), leaf("workers", 3)]),
            {"vllm-1": "leader", "vllm-1-2": "workers"}))),
    Case("LeaderWorkerSet (segments)", f"""apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {{name: lws-segmented, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 5
    subGroupPolicy: {{subGroupSize: 2, subGroupPolicyType: LeaderWorker}}
    leaderTemplate:
      spec: {{schedulerName: kai-scheduler, containers: {container("leader")}}}
    workerTemplate:
      metadata:
        annotations:
          kai.scheduler/topology: cluster-topology
          kai.scheduler/segment-topology-required-placement: example.com/rack
      spec: {{schedulerName: kai-scheduler, containers: {container("worker")}}}
""", (Group("pg-lws-segmented-{LeaderWorkerSet/lws-segmented}-group-0", spec(5, subGroups=[
        inner("segment-0", 2, topologyConstraint=TOPOLOGY), leaf("segment-1", 2, topologyConstraint=TOPOLOGY),
        leaf("leader", 1, "segment-0"), leaf("workers", 2, "segment-0")]),
        {"lws-segmented-0": "leader", "lws-segmented-0-1": "workers", "lws-segmented-0-2": "workers",
         "lws-segmented-0-3": "segment-1", "lws-segmented-0-4": "segment-1"}),)),
    Case("RayCluster", f"""apiVersion: ray.io/v1
kind: RayCluster
metadata: {{name: raycluster-kuberay, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  rayVersion: "2.41.0"
  headGroupSpec:
    rayStartParams: {{}}
    template:
      spec: {{schedulerName: kai-scheduler, containers: {container("ray-head")}}}
  workerGroupSpecs:
  - groupName: gpu-group
    replicas: 3
    minReplicas: 2
    maxReplicas: 5
    rayStartParams: {{}}
    template:
      spec: {{schedulerName: kai-scheduler, containers: {container("ray-worker")}}}
""", (Group("pg-raycluster-kuberay-{RayCluster/raycluster-kuberay}",
            spec(3, subGroups=[leaf("headgroup", 1), leaf("gpu-group", 2)]),
            {"raycluster-kuberay-head": "headgroup", "raycluster-kuberay-gpu-group-worker-0": "gpu-group",
             "raycluster-kuberay-gpu-group-worker-2": "gpu-group"}),)),
    Case("RayJob", f"""apiVersion: ray.io/v1
kind: RayJob
metadata: {{name: rayjob-sample, labels: {{kai.scheduler/queue: team-a, ray.io/priority-class-name: build}}}}
spec:
  entrypoint: python /home/ray/samples/sample_code.py
  rayClusterSpec:
    rayVersion: "2.41.0"
    headGroupSpec:
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("ray-head")}}}
    workerGroupSpecs:
    - groupName: small-group
      replicas: 2
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("ray-worker")}}}
""", (Group("pg-rayjob-sample-{RayJob/rayjob-sample}",
            spec(3, priority="build", subGroups=[leaf("headgroup", 1), leaf("small-group", 2)]),
            {"rayjob-sample-raycluster-head": "headgroup",
             "rayjob-sample-raycluster-small-group-worker-1": "small-group"}),)),
    Case("RayService", f"""apiVersion: ray.io/v1
kind: RayService
metadata: {{name: rayservice-sample, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  serveConfigV2: "applications: []"
  rayClusterConfig:
    headGroupSpec:
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("ray-head")}}}
    workerGroupSpecs:
    - groupName: small-group
      replicas: 1
      template:
        spec: {{schedulerName: kai-scheduler, containers: {container("ray-worker")}}}
""", (Group("pg-rayservice-sample-{RayService/rayservice-sample}",
            spec(2, subGroups=[leaf("headgroup", 1), leaf("small-group", 1)]),
            {"rayservice-sample-raycluster-head": "headgroup",
             "rayservice-sample-raycluster-small-group-worker-0": "small-group"}),)),
    Case("SparkApplication", """apiVersion: sparkoperator.k8s.io/v1beta2
kind: SparkApplication
metadata: {name: spark-pi, labels: {kai.scheduler/queue: team-a}}
spec:
  type: Scala
  mode: cluster
  image: spark:3.5.1
  mainClass: org.apache.spark.examples.SparkPi
  mainApplicationFile: local:///opt/spark/examples/jars/spark-examples.jar
  sparkVersion: 3.5.1
  driver: {cores: 1, memory: 512m, schedulerName: kai-scheduler, serviceAccount: spark-operator-spark}
  executor: {instances: 2, cores: 1, memory: 512m, schedulerName: kai-scheduler,
             gpu: {name: nvidia.com/gpu, quantity: 1}}
""", (Group("pg-spark-pi-{SparkApplication/spark-pi}", spec(),
            {"spark-pi-driver": "", "spark-pi-exec-1": "", "spark-pi-exec-2": ""}),)),
    Case("Workflow", f"""apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{name: steps, labels: {{kai.scheduler/queue: team-a, priorityClassName: build}}}}
spec:
  entrypoint: main
  schedulerName: kai-scheduler
  templates:
  - name: main
    steps: [[{{name: prepare, template: prepare}}], [{{name: train, template: train}}]]
  - name: prepare
    container: {{image: alpine:3.20, command: [sh, -c, "echo prepare"]}}
  - name: train
    container: {{image: example/trainer:1, {GPU}}}
""", (Group("pg-steps-prepare-{Pod/steps-prepare}", spec(priority="build"), {"steps-prepare": ""}),
      Group("pg-steps-train-{Pod/steps-train}", spec(priority="build"), {"steps-train": ""}))),
    Case("Service (Knative)", f"""apiVersion: serving.knative.dev/v1
kind: Service
metadata: {{name: hello}}
spec:
  template:
    metadata:
      labels: {{kai.scheduler/queue: team-a}}
      annotations: {{autoscaling.knative.dev/min-scale: "2"}}
    spec: {POD_SPEC}
""", (Group("pg-hello-00001-{Revision/hello-00001}", spec(2, priority="inference"),
            {"hello-00001-deployment-0": "", "hello-00001-deployment-1": ""}),)),
    Case("Notebook", f"""apiVersion: kubeflow.org/v1beta1
kind: Notebook
metadata: {{name: my-notebook, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  template:
    spec: {{schedulerName: kai-scheduler, containers: {container("my-notebook")}}}
""", (Group("pg-my-notebook-{Notebook/my-notebook}", spec(priority="build"), {"my-notebook-0": ""}),)),
    Case("TrainingRun (no-code rule)", f"""apiVersion: example.com/v1
kind: TrainingRun
metadata: {{name: run, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  replicas: 4
  minAvailable: 3
  template:
    spec: {POD_SPEC}
---
apiVersion: example.com/v1
kind: ServingGroup
metadata: {{name: llm, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  router:
    replicas: 1
    template:
      spec: {POD_SPEC}
  engine:
    replicas: 4
    minReplicas: 2
    template:
      spec: {POD_SPEC}
""", (Group("pg-run-{TrainingRun/run}", spec(3), {"run-0": "", "run-3": ""}),
      Group("pg-llm-{ServingGroup/llm}", spec(None, priority="inference", minSubGroup=2,
                                             subGroups=[leaf("router", 1), leaf("engine", 2)]),
            {"llm-router-0": "router", "llm-engine-0": "engine", "llm-engine-3": "engine"})),
         settings={"scheduler": {"grouping": NOCODE_RULES}}),
)
