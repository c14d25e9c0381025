"""The table of owner kinds KAI's podgrouper knows: (API group, kind) -> the rule that groups its
pods, the API versions KAI registers it under, its resource name (what the informer GETs), and
how the rule reads the owner chain. One rule set per family: `core` (Kubernetes' own), `kubeflow`,
`jobset`, `lws`, `ray`, `serving` (Knative); `rules` turns the config's no-code rules into rules.

Dispatch, as KAI's plugin hub: the top owner's (group, kind, version) picks the rule; a version
KAI does not register, or a kind not in the table, gets the default grouper — or a no-code rule
from the config for that (group, kind). A `skip` kind (Argo Workflow, Kubeflow Trainer's
TrainJob) is looked through: the owner below it (or the pod) is grouped by its own rule, with the
skipped owner's labels and annotations added where it has none of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kai_es.ingest.groupers import core, jobset, kubeflow, lws, ray, serving
from kai_es.ingest.groupers.base import Decision, Obj, Rule, Source, api_group, api_version, default, meta
from kai_es.ingest.groupers.rules import GroupingRule, rule_grouper


@dataclass(frozen=True)
class Workload:
    group: str
    kind: str
    plural: str
    rule: Rule
    #: the versions KAI's table registers the kind under (another version: the default grouper)
    versions: frozenset[str]
    #: KAI groups the kind with its default grouper itself, which reads the whole owner chain
    #: for priority class, preemptibility and time annotations (other rules read the top owner)
    whole_chain: bool = False
    #: looked through to the owner below (KAI's skip-top-owner grouper)
    skip: bool = False
    #: objects of the top owner's API group the rule reads besides the chain: (kind, name)
    related: Callable[[Obj], list[tuple[str, str]]] | None = None
    #: how the README's table describes it
    summary: str = ""


def _skip(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
    raise AssertionError("a skipped kind is looked through, never grouped by itself")  # pragma: no cover


def _w(group: str, kind: str, plural: str, rule: Rule, *versions: str, **kw: object) -> Workload:
    return Workload(group, kind, plural, rule, frozenset(versions), **kw)  # type: ignore[arg-type]


_DEFAULT_KINDS = [  # KAI's table hands these to its default grouper
    ("apps", "ReplicaSet", "replicasets", ("v1",)),
    ("machinelearning.seldon.io", "SeldonDeployment", "seldondeployments", ("v1", "v1alpha2")),
    ("kubevirt.io", "VirtualMachineInstance", "virtualmachineinstances", ("v1",)),
    ("workspace.devfile.io", "DevWorkspace", "devworkspaces", ("v1alpha2",)),
    ("kubeflow.org", "ScheduledWorkflow", "scheduledworkflows", ("v1alpha1",)),
    ("tekton.dev", "PipelineRun", "pipelineruns", ("v1",)),
    ("tekton.dev", "TaskRun", "taskruns", ("v1",)),
]

WORKLOADS: tuple[Workload, ...] = (
    _w("", "Pod", "pods", core.pod_rule, "v1"),
    _w("batch", "Job", "jobs", core.job_rule, "v1"),
    _w("batch", "CronJob", "cronjobs", core.cronjob_rule, "v1"),
    _w("apps", "Deployment", "deployments", core.deployment_rule, "v1"),
    _w("apps", "StatefulSet", "statefulsets", core.statefulset_rule, "v1", whole_chain=True),
    *(_w(g, k, p, core.default_rule, *v, whole_chain=True) for g, k, p, v in _DEFAULT_KINDS),
    _w("kubeflow.org", "PyTorchJob", "pytorchjobs", kubeflow.pytorchjob_rule, "v1"),
    _w("kubeflow.org", "TFJob", "tfjobs", kubeflow.tfjob_rule, "v1"),
    _w("kubeflow.org", "XGBoostJob", "xgboostjobs", kubeflow.xgboostjob_rule, "v1"),
    _w("kubeflow.org", "JAXJob", "jaxjobs", kubeflow.jaxjob_rule, "v1"),
    _w("kubeflow.org", "MPIJob", "mpijobs", kubeflow.mpijob_rule, "v1", "v2beta1"),
    _w("kubeflow.org", "Notebook", "notebooks", kubeflow.notebook_rule, "v1beta1"),
    # not in KAI's table (its default grouper): listed so that the informer reads them
    _w("kubeflow.org", "PaddleJob", "paddlejobs", core.default_rule, whole_chain=True),
    _w("sparkoperator.k8s.io", "SparkApplication", "sparkapplications", core.default_rule, whole_chain=True),
    _w("trainer.kubeflow.org", "TrainJob", "trainjobs", _skip, "v1alpha1", skip=True),
    _w("jobset.x-k8s.io", "JobSet", "jobsets", jobset.jobset_rule, "v1alpha2"),
    _w("leaderworkerset.x-k8s.io", "LeaderWorkerSet", "leaderworkersets", lws.lws_rule, "v1"),
    _w("ray.io", "RayCluster", "rayclusters", ray.raycluster_rule, "v1", "v1alpha1"),
    _w("ray.io", "RayJob", "rayjobs", ray.rayjob_rule, "v1", "v1alpha1", related=ray.rayjob_related),
    _w("ray.io", "RayService", "rayservices", ray.rayservice_rule, "v1", "v1alpha1",
       related=ray.rayservice_related),
    _w("argoproj.io", "Workflow", "workflows", _skip, "v1alpha1", skip=True),
    _w("serving.knative.dev", "Service", "services", serving.knative_rule, "v1"),
)

#: (group, kind) -> its entry
TABLE: Mapping[tuple[str, str], Workload] = {(w.group, w.kind): w for w in WORKLOADS}
#: owners read on the way up the chain although no rule groups by them: (group, kind) -> plural
CHAIN_ONLY: Mapping[tuple[str, str], str] = {
    ("serving.knative.dev", "Revision"): "revisions",
    ("serving.knative.dev", "Configuration"): "configurations",
}
#: pod labels the caller's PodIndex must index (an MPIJob's launcher is looked up by them)
INDEXED_LABELS = frozenset({kubeflow.JOB_NAME_LABEL, kubeflow.JOB_ROLE_LABEL})


def kind_of(obj: Obj) -> tuple[str, str]:
    return api_group(obj), str(obj.get("kind") or "")


def workload_of(obj: Obj) -> Workload | None:
    """The table's entry for `obj`'s kind, if KAI registers it under `obj`'s version."""
    entry = TABLE.get(kind_of(obj))
    if entry is None or (entry.versions and api_version(obj) not in entry.versions):
        return None
    return entry


def _look_through(skipped: Obj, below: Obj) -> dict[str, object]:
    """`below` with the labels and annotations of `skipped` it does not set itself."""
    m = dict(meta(below))
    for part in ("labels", "annotations"):
        mine, theirs = m.get(part), meta(skipped).get(part)
        merged = dict(theirs) if isinstance(theirs, Mapping) else {}
        if isinstance(mine, Mapping):
            merged.update(mine)
        m[part] = merged
    return {**below, "metadata": m}


def decide(src: Source, rules: Mapping[tuple[str, str], GroupingRule]) -> Decision:
    """The Decision for `src.pod` (see the module docstring)."""
    return _decide(src, src.owners[-1] if src.owners else src.pod, src.owners, rules)


def _decide(src: Source, top: Obj, chain: tuple[Obj, ...], rules: Mapping[tuple[str, str], GroupingRule]) -> Decision:
    # no owner: the pod (as listed, it may carry no apiVersion or kind) is its own top owner
    entry = workload_of(top) if chain else TABLE[("", "Pod")]
    if entry is None:
        rule = rules.get(kind_of(top))
        lookup = chain or (top,)
        if rule is not None:
            return rule_grouper(rule)(src, top, lookup)
        return default(top, src.pod, lookup)
    if entry.skip:
        below = chain[-2] if len(chain) >= 2 else src.pod
        merged = _look_through(top, below)
        rest = chain[:-1]
        return _decide(src, merged, (*rest[:-1], merged) if rest else (), {})
    return entry.rule(src, top, (chain or (top,)) if entry.whole_chain else (top,))


__all__ = ["CHAIN_ONLY", "INDEXED_LABELS", "TABLE", "WORKLOADS", "GroupingRule", "Workload", "decide",
           "kind_of", "workload_of"]
