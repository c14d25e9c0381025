"""The workload controllers a scenario file's owners are expanded by: each creates, from an owner
document, the objects and pods its Kubernetes controllers would create, with ownerReferences,
so that the scenario loader groups them with the informer's podgrouper
(`kai_es.ingest.podgrouper`) exactly as it would group them on a cluster. Pure.

`CONTROLLERS`: (API group, kind) -> controller; a kind of the config's no-code rules is expanded
by `rule_controller`. Every kind here is one the podgrouper's table knows (a test holds them
together); the table's default-grouper kinds that have no controller here (SeldonDeployment,
VirtualMachineInstance, DevWorkspace, ScheduledWorkflow, Tekton's runs) are grouped on a cluster
but not expanded from a scenario.
"""

from __future__ import annotations

from collections.abc import Mapping

from kai_es.controllers import core, jobset, kubeflow, lws, other, ray, serving
from kai_es.controllers.base import Context, Controller, ExpandedPod, Expansion
from kai_es.ingest.groupers.rules import GroupingRule

CONTROLLERS: Mapping[tuple[str, str], Controller] = {
    ("batch", "Job"): core.expand_job,
    ("batch", "CronJob"): core.expand_cronjob,
    ("apps", "Deployment"): core.expand_deployment,
    ("apps", "ReplicaSet"): core.expand_replicaset,
    ("apps", "StatefulSet"): core.expand_statefulset,
    **{("kubeflow.org", kind): kubeflow.expand_training_job for kind in kubeflow.REPLICA_FIELDS},
    ("kubeflow.org", "Notebook"): kubeflow.expand_notebook,
    ("trainer.kubeflow.org", "TrainJob"): kubeflow.expand_trainjob,
    ("jobset.x-k8s.io", "JobSet"): jobset.expand_jobset,
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): lws.expand_lws,
    ("ray.io", "RayCluster"): ray.expand_raycluster,
    ("ray.io", "RayJob"): ray.expand_rayjob,
    ("ray.io", "RayService"): ray.expand_rayservice,
    ("serving.knative.dev", "Service"): serving.expand_knative_service,
    ("argoproj.io", "Workflow"): other.expand_workflow,
    ("sparkoperator.k8s.io", "SparkApplication"): other.expand_sparkapplication,
}

#: objects controllers or the podgrouper read that are not workloads: a scenario may hold them
#: (Kubeflow Trainer's runtimes, for TrainJobs; the Workload API's Workloads and PodGroups, which
#: pods name in `spec.schedulingGroup`)
REFERENCE_KINDS = frozenset({("trainer.kubeflow.org", "TrainingRuntime"),
                             ("trainer.kubeflow.org", "ClusterTrainingRuntime"),
                             ("scheduling.k8s.io", "Workload"), ("scheduling.k8s.io", "PodGroup")})


def rule_controller(rule: GroupingRule) -> Controller:
    return other.rule_expander(rule)


__all__ = ["CONTROLLERS", "REFERENCE_KINDS", "Context", "Controller", "ExpandedPod", "Expansion",
           "rule_controller"]
