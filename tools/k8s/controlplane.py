#!/usr/bin/env python3
"""A real Kubernetes control plane on 127.0.0.1: etcd + kube-apiserver + kube-controller-manager
+ KWOK fake nodes.

Used two ways:

CLI::

    python3 tools/k8s/controlplane.py fetch        # build the binaries (and helm) once into the cache
    python3 tools/k8s/controlplane.py run          # start, install deploy/crds, print
                                                   # kubeconfig=..., run until Ctrl-C
                                                   # (--no-controller-manager: without it;
                                                   # --real-node: plus a kubelet, runs a busybox pod)

Library (test fixtures)::

    from controlplane import ControlPlane    # or load this file with importlib
    with ControlPlane() as cp:               # fetches, writes certs, starts, waits for /readyz
        print(cp.base_url, cp.kubeconfig)    # "https://127.0.0.1:<port>", a kubeconfig file
        cp.create_gpu_node("gpu-0", gpus=8)  # a KWOK-managed fake node, Ready in ~0.2 s
        cp.restart_apiserver()               # same etcd, same port: open watches end, old
                                             # resourceVersions get 410 Gone afterwards
        cp.restart_controller_manager()      # SIGKILL and start again, same port
        cp.restart_etcd()                    # SIGKILL etcd, start it on the same data
        cp.restart_kwok()                    # SIGKILL KWOK, start it again (it relists)

The controller-manager (``ControlPlane(controller_manager=False)`` leaves it out) runs the
controllers in CONTROLLERS — Deployments, ReplicaSets, StatefulSets, Jobs, CronJobs, the garbage
collector, namespaces, service accounts and their tokens (not node health: KWOK fakes it) — without leader election,
its secure port on a free loopback port; it is healthy about 0.5 s after its start.

``ControlPlane(operators=("jobset", "lws", "ray-operator", "mpi-operator",
"trainer-controller-manager", "training-operator"))`` also runs those operators (OPERATORS; ``OperatorProcess`` says
how: their own CRDs and webhooks, each as a process of the control plane), after installing their
CRDs; a test module that wants them starts a control plane of its own, so others do not pay.
``operators=("training-operator-mpi",)`` runs the training-operator's MPIJob ``kubeflow.org/v1``
controller alone, with its module's MPIJob v1 CRD (TRAINING_OPERATOR_MPI), on a control plane
without the MPI operator, whose v2beta1 CRD has the same name. ``operators=("knative-controller",)``
runs Knative Serving (its controller and the webhook it needs: KNATIVE_OPERATORS, `KnativeProcess`)
with what its install creates in namespace knative-serving, the apiserver reaching the webhook
through its Service's endpoints (``--enable-aggregator-routing``). ``operators=("workflow-controller",)``
runs Argo Workflows' workflow-controller (ARGO_CONTROLLER, `ArgoProcess`), cluster-wide, with its
CRDs and its ConfigMap in namespace argo.

``ControlPlane(real_node=True)`` also runs a real node (``RealNode``): the kubelet built here with
Debian's containerd and runc (root; REAL_NODE_PACKAGES), a CNI bridge, and busybox images made
from busybox-static and imported into containerd; Ready about 2 s after the kubelet starts. Its
docstring lists what this kind of machine refuses and how each refusal is met. Such a control
plane is one pods can use as a cluster: kube-scheduler runs too (the default scheduler, for pods
such as a Helm chart's own; ``kube_scheduler=`` overrides), the apiserver listens on every
address and its certificate names the host's (pods reach it at ``in_cluster_env()``: there is no
kube-proxy for the ``kubernetes`` Service), the ServiceAccount admission plugin gives pods their
projected tokens (namespaces wait for their ``default`` ServiceAccount), and the
controller-manager also publishes ``kube-root-ca.crt`` (REAL_NODE_CONTROLLERS). With
``network_policy=True`` the node enforces NetworkPolicies: kube-router's firewall alone (no
routing, service proxy or CNI of its own; Debian's iptables and ipset), as user
``kai-es:kube-router`` with a read-only ClusterRole, its rules removed from the host's tables
when the node stops (``remove_network_policy_rules``).

Nothing here is downloaded prebuilt: the Go module proxy serves the sources and the local Go
toolchain (1.26+, ``/usr/local/go/bin`` is searched too) builds

* kube-apiserver, kube-controller-manager, kubelet and kube-scheduler v1.36.5 and the operators of
  SHARED_OPERATORS (JobSet v0.12.0, LeaderWorkerSet v0.9.0, the MPI operator v0.8.0, Kubeflow
  Trainer v2.3.0) — in ONE ``go build`` (the packages they share compile once) in a throwaway
  module that requires ``k8s.io/kubernetes`` and the operators and ``replace``-s each staging
  module kubernetes requires with the published ``v0.36.5`` module (the ``go install
  pkg@version`` shortcut is refused for modules with replace directives); the operators' CRDs and
  webhook manifests are copied from the module cache;
* KubeRay's ray-operator v1.6.2 and Kubeflow's training-operator v1.8.1 — each in a module of its
  own (KUBERAY and TRAINING_OPERATOR say why);
* Knative Serving v0.50.0's controller and webhook — by one ``go build`` in a module of their own
  (KNATIVE_SERVING_VERSION says why), with its CRDs and install files and those of the
  networking and caching modules it requires (KNATIVE_RECIPE; about 3 minutes cold on 2 cores);
* Argo Workflows v4.0.5's workflow-controller — in a module of its own (Kubernetes v0.33
  modules), with its minimal CRDs and its ConfigMap out of the module (ARGO_RECIPE; about 3
  minutes cold on 2 cores; a test dependency only: ARGO_CONTROLLER says why);
* etcd v3.6.8 — the same way (its server module replaces its sibling modules);
* kube-router v2.1.0 — ``go install`` (``fetch_kube_router``; a real node with network policy);
* KWOK v0.8.0 — ``go install``; its three "fast" stage files are copied from the module cache
  (v0.8.0 has no built-in stages).
* helm v3.22.0 — ``go install`` (not part of the control plane: ``fetch_helm``, for the chart
  tests; the CLI's ``fetch`` builds it too, so a fresh CI machine gets it).

Binaries land in ``${KAI_ES_CACHE:-~/.cache/kai-es}/k8s/<component>-<version>/`` (outside the
repo; the four Kubernetes commands and the shared operators in
``kubernetes-operators-v1.36.5/``), built into a staging directory
and moved in. A marker holding the component's recipe digest (a ``Recipe``: version, outputs,
the build function's source and every constant and helper it reads) is written last, so an
interrupted build or a changed recipe is redone and a complete one is skipped; a change to one
component's recipe rebuilds that component only. helm keeps the digest of its marked section,
as when it was first cached. The Go module and build caches are Go's own (``go env GOMODCACHE
GOCACHE``), so a second build is seconds.

Certificates use the ``cryptography`` package (a test dependency) when it is importable and
``openssl`` otherwise. Standard library for everything else.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import inspect
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: the helpers both tools share
from toolproc import free_port, pdeathsig_preexec, stop_signals_as_keyboard_interrupt, tail  # noqa: E402

KUBE_VERSION = "v1.36.5"
#: The published staging modules carry the same minor as kubernetes, with major 0.
STAGING_VERSION = "v0.36.5"
ETCD_VERSION = "v3.6.8"
KWOK_VERSION = "v0.8.0"
#: Built together from one module at KUBE_VERSION, by one `go build`.
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kubelet", "kube-scheduler")
#: Helm renders and lints the chart in deploy/helm/ (tests/k8s/test_helm_chart.py).
HELM_VERSION = "v3.22.0"
#: kube-router's network policy firewall enforces NetworkPolicies on a real node (the CNI bridge
#: plugin enforces none); v2.1.0 is the only v2 version the Go module proxy serves
KUBE_ROUTER_VERSION = "v2.1.0"

#: Staging modules kubernetes' go.mod maps to ./staging but the proxy does not serve (and
#: kube-apiserver does not need).
UNPUBLISHED_STAGING = frozenset({"k8s.io/sample-cli-plugin", "k8s.io/sample-controller"})

#: KWOK stage files (paths inside the sigs.k8s.io/kwok module) copied next to the binary.
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


@dataclass(frozen=True)
class Operator:
    """A Kubernetes operator built from the Go module proxy at a pinned version and run by the
    control plane (``ControlPlane(operators=...)``) with the CRDs of its own module."""

    name: str  # its binary's name in the component dir, and its key in OPERATORS
    module: str
    version: str
    package: str  # its main package
    #: files of the module copied next to the binary: its CRDs ...
    crds: tuple[str, ...]
    #: ... kubebuilder's webhook manifest ("": it registers none), of which the control plane
    #: registers the webhooks for the operator's own API groups (`webhook_configurations`) ...
    webhooks: str = ""
    #: ... the JSON patches its kustomization applies to them: (webhook configuration kind, file)
    #: (JobSet's and LWS's scope their pod webhooks to their own pods with an objectSelector) ...
    webhook_patches: tuple[tuple[str, str], ...] = ()
    #: ... and other objects its install creates (Kubeflow Trainer's training runtimes)
    manifests: tuple[str, ...] = ()
    #: operators whose CRDs and controllers this one needs (the trainer makes JobSets)
    needs: tuple[str, ...] = ()

    def cached(self, rel: str) -> str:
        """Where a copied module file lands, relative to the component dir."""
        return f"operators/{self.name}/{Path(rel).name}"

    def files(self) -> tuple[str, ...]:
        return tuple(self.cached(f) for f in self.module_files())

    def module_files(self) -> tuple[str, ...]:
        """Every file the build copies out of the module."""
        return (*self.crds, *((self.webhooks,) if self.webhooks else ()),
                *(f for _, f in self.webhook_patches), *self.manifests)


#: Operators built in the Kubernetes commands' module, by the same `go build` (the k8s.io
#: packages they share with kube-apiserver and the rest compile once). Minimal version selection
#: raises their k8s.io modules to the staging v0.36.5 and controller-runtime to the newest they
#: ask for (v0.24.1); each is the newest version the Go module proxy serves whose sources
#: compile that way (lws v0.10.0's zip is refused; jobset's, lws's and the MPI operator's version
#: lists are refused, explicit versions answer).
JOBSET = Operator(
    "jobset", "sigs.k8s.io/jobset", "v0.12.0", "sigs.k8s.io/jobset",
    ("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",),
    webhooks="config/components/webhook/manifests.yaml",
    webhook_patches=(("MutatingWebhookConfiguration", "config/components/webhook/patches/mutating-patch.yaml"),
                     ("ValidatingWebhookConfiguration", "config/components/webhook/patches/validating-patch.yaml")))
LWS = Operator(
    "lws", "sigs.k8s.io/lws", "v0.9.0", "sigs.k8s.io/lws/cmd",
    ("config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
     "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml"),
    webhooks="config/webhook/manifests.yaml",
    webhook_patches=(("MutatingWebhookConfiguration", "config/webhook/mutating-patch.yaml"),
                     ("ValidatingWebhookConfiguration", "config/webhook/validating-patch.yaml")))
MPI_OPERATOR = Operator(
    "mpi-operator", "github.com/kubeflow/mpi-operator", "v0.8.0",
    "github.com/kubeflow/mpi-operator/cmd/mpi-operator", ("manifests/base/kubeflow.org_mpijobs.yaml",))
TRAINER = Operator(
    "trainer-controller-manager", "github.com/kubeflow/trainer/v2", "v2.3.0",
    "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
    ("manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
     "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml",
     "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml"),
    webhooks="manifests/base/webhook/manifests.yaml",
    webhook_patches=(("MutatingWebhookConfiguration", "manifests/base/webhook/patch_mutating.yaml"),
                     ("ValidatingWebhookConfiguration", "manifests/base/webhook/patch_validating.yaml")),
    manifests=("manifests/base/runtimes/torch_distributed.yaml",), needs=("jobset",))
SHARED_OPERATORS = (JOBSET, LWS, MPI_OPERATOR, TRAINER)
#: KubeRay's newest served ray-operator (v1.6.2; v1.7.0's zip is refused) is written against
#: controller-runtime v0.22, whose webhook builder v0.24 changed (`NewWebhookManagedBy` takes
#: the object): it cannot join the shared module, so it builds in a module of its own.
KUBERAY = Operator(
    "ray-operator", "github.com/ray-project/kuberay/ray-operator", "v1.6.2",
    "github.com/ray-project/kuberay/ray-operator",
    tuple(f"config/crd/bases/ray.io_{p}.yaml" for p in ("rayclusters", "rayjobs", "rayservices", "raycronjobs")))
#: Kubeflow's training-operator (PyTorchJob, TFJob, XGBoostJob, PaddleJob; v1.8.1, the only
#: version the Go module proxy serves) is written against controller-runtime v0.17 and the
#: Kubernetes v0.29 modules: a module of its own too. It also serves MPIJob kubeflow.org/v1 and
#: MXJob; neither CRD is copied here (mpijobs.kubeflow.org is the MPI operator's v2beta1 CRD
#: beside it; TRAINING_OPERATOR_MPI runs the MPIJob v1 controller) and `OperatorProcess`
#: enables only the four schemes whose CRDs are.
TRAINING_OPERATOR = Operator(
    "training-operator", "github.com/kubeflow/training-operator", "v1.8.1",
    "github.com/kubeflow/training-operator/cmd/training-operator.v1",
    tuple(f"manifests/base/crds/kubeflow.org_{p}.yaml" for p in ("pytorchjobs", "tfjobs", "xgboostjobs", "paddlejobs")),
    webhooks="manifests/base/webhook/manifests.yaml",
    webhook_patches=(("ValidatingWebhookConfiguration", "manifests/base/webhook/patch.yaml"),))
#: The same training-operator running only its MPIJob kubeflow.org/v1 controller (the legacy MPI
#: controller), with that CRD of its module. Its CRD is named mpijobs.kubeflow.org as the MPI
#: operator's v2beta1 one is: a control plane runs one of the two (`_crds_apart`). It is
#: TRAINING_OPERATOR's binary under TRAINING_OPERATOR's manager ClusterRole (SAME_INSTALL); only
#: its CRD is copied, by a recipe of its own (TRAINING_OPERATOR_MPI_RECIPE), so the
#: training-operator is not built again. v1.8.1 registers no webhook for MPIJob.
TRAINING_OPERATOR_MPI = Operator(
    "training-operator-mpi", TRAINING_OPERATOR.module, TRAINING_OPERATOR.version, TRAINING_OPERATOR.package,
    ("manifests/base/crds/kubeflow.org_mpijobs.yaml",))
#: Knative Serving, v0.50.0: the newest version the Go module proxy serves whole (v0.51.0 requires
#: knative.dev/pkg, networking, caching and hack at pseudo-versions whose zips the proxy refuses:
#: 403, "not available"). It is written against the Kubernetes v0.35 modules, so it builds in a
#: module of its own, its controller and its webhook by one `go build` (KNATIVE_RECIPE). Two
#: operators, each a process as its install's two Deployments are: the controller (Service ->
#: Configuration -> Revision -> Deployment, the Route, ...) and the webhook, which defaults and
#: validates Knative's objects (without its defaults a Revision's container has no name and its
#: Deployment is refused) and keeps its own certificate and webhook configurations; the
#: controller needs it. Knative's autoscaler, activator and an ingress are not run: a Revision's
#: Deployment stays at the scale the controller creates it with (`autoscaling.knative.dev/
#: initial-scale`, else config-autoscaler's `initial-scale`, 1), and a Service never turns
#: Ready (its Route has no ingress). `KnativeProcess` says how they run.
KNATIVE_SERVING_VERSION = "v0.50.0"
KNATIVE_WEBHOOK = Operator("knative-webhook", "knative.dev/serving", KNATIVE_SERVING_VERSION,
                           "knative.dev/serving/cmd/webhook", ())
KNATIVE_CONTROLLER = Operator(
    "knative-controller", "knative.dev/serving", KNATIVE_SERVING_VERSION, "knative.dev/serving/cmd/controller",
    tuple(f"config/core/300-resources/{p}.yaml" for p in (
        "service", "configuration", "revision", "route", "domain-mapping", "podautoscaler", "metric")),
    needs=(KNATIVE_WEBHOOK.name,))
KNATIVE_OPERATORS = (KNATIVE_WEBHOOK, KNATIVE_CONTROLLER)
#: Files of the modules Knative Serving requires, at the versions its go.mod asks (module, file):
#: the CRDs its release ships besides its own (the serving module's copies are symlinks, which
#: module zips leave out); copied by KNATIVE_RECIPE to `knative/`.
KNATIVE_REQUIRED_CRDS = (
    ("knative.dev/networking", "config/ingress.yaml"),
    ("knative.dev/networking", "config/serverlessservice.yaml"),
    ("knative.dev/networking", "config/certificate.yaml"),
    ("knative.dev/networking", "config/domain-claim.yaml"),
    ("knative.dev/caching", "config/image.yaml"),
)
#: The objects of Knative Serving's install (config/core) the control plane creates before the
#: webhook and the controller start: their ConfigMaps (KnativeProcess.CONFIG overrides a few
#: keys), the webhook's Secret and its three webhook configurations (the webhook fills in their
#: rules and CA bundles itself). (module, file), copied by KNATIVE_RECIPE to `knative/`.
KNATIVE_INSTALL = (
    *(("knative.dev/serving", f"config/core/configmaps/{p}.yaml") for p in (
        "autoscaler", "certmanager", "defaults", "deployment", "domain", "features", "gc", "leader-election",
        "logging", "observability", "tracing")),
    ("knative.dev/networking", "config/config-network.yaml"),
    ("knative.dev/serving", "config/core/webhooks/secret.yaml"),
    ("knative.dev/serving", "config/core/webhooks/defaulting.yaml"),
    ("knative.dev/serving", "config/core/webhooks/resource-validation.yaml"),
    ("knative.dev/serving", "config/core/webhooks/configmap-validation.yaml"),
)
#: Argo Workflows' workflow-controller, v4.0.5 (`github.com/argoproj/argo-workflows/v4`; the Go
#: module proxy refuses the v3 module: 403, "not available"). A TEST DEPENDENCY ONLY: the package
#: lists here mark v4.0.5 "untested; security flaws reported", and it runs on this machine's
#: loopback apiserver only, never in kai-es's image or chart. It is written against the Kubernetes
#: v0.33 modules, so it builds in a module of its own (ARGO_RECIPE). Its CRDs are the "minimal"
#: ones its module ships (manifests/base/crds/minimal: the big Workflow, template and CronWorkflow
#: schemas left out, Argo's own workaround for kubernetes#82292; the full ones are 2.5 MB of YAML
#: each) for the kinds whose informers it waits for at start (WorkflowEventBinding is argo-server's,
#: not the controller's). `ArgoProcess` says how it runs.
ARGO_WORKFLOWS_VERSION = "v4.0.5"
ARGO_CONTROLLER = Operator(
    "workflow-controller", "github.com/argoproj/argo-workflows/v4", ARGO_WORKFLOWS_VERSION,
    "github.com/argoproj/argo-workflows/v4/cmd/workflow-controller",
    tuple(f"manifests/base/crds/minimal/argoproj.io_{p}.yaml" for p in (
        "workflows", "workflowtemplates", "clusterworkflowtemplates", "cronworkflows", "workflowtasksets",
        "workflowtaskresults", "workflowartifactgctasks")))
#: The controller's ConfigMap as its install ships it (`ArgoProcess.CONFIG` sets keys over it);
#: copied by ARGO_RECIPE next to its CRDs.
ARGO_CONFIGMAP = "manifests/base/workflow-controller/workflow-controller-configmap.yaml"
OPERATORS = {o.name: o for o in (*SHARED_OPERATORS, KUBERAY, TRAINING_OPERATOR, TRAINING_OPERATOR_MPI,
                                 *KNATIVE_OPERATORS, ARGO_CONTROLLER)}
#: Operators that run another's binary under its manager ClusterRole: name -> that operator.
SAME_INSTALL: Mapping[str, Operator] = {TRAINING_OPERATOR_MPI.name: TRAINING_OPERATOR}

#: Each operator's manager ClusterRole as its own install ships it: (file of its module, the
#: ClusterRole's name in it: the one that install binds to the operator's ServiceAccount). The
#: control plane binds its rules to the operator's own user (`OperatorProcess`), so an operator
#: runs with the permissions its install grants and no more. Copied by OPERATOR_ROLES_RECIPE, a
#: component of its own, so the roles never rebuild an operator's binaries.
OPERATOR_ROLES: Mapping[str, tuple[str, str]] = {
    JOBSET.name: ("config/components/rbac/role.yaml", "manager-role"),
    LWS.name: ("config/rbac/role.yaml", "manager-role"),
    MPI_OPERATOR.name: ("manifests/base/cluster-role.yaml", "mpi-operator"),
    TRAINER.name: ("manifests/base/rbac/role.yaml", "kubeflow-trainer-controller-manager"),
    KUBERAY.name: ("config/rbac/role.yaml", "kuberay-operator"),
    TRAINING_OPERATOR.name: ("manifests/base/rbac/role.yaml", "training-operator"),
    # both run as the install's `controller` ServiceAccount, bound to the aggregated
    # knative-serving-admin: knative-serving-core, and the activator's read-only
    # knative-serving-activator-cluster (services and endpoints), which core's rules cover
    KNATIVE_CONTROLLER.name: ("config/core/200-roles/clusterrole.yaml", "knative-serving-core"),
    KNATIVE_WEBHOOK.name: ("config/core/200-roles/clusterrole.yaml", "knative-serving-core"),
    # the cluster-wide install's; its namespaced Role argo-role (Leases, Secrets) is for leader
    # election, which `ArgoProcess` turns off
    ARGO_CONTROLLER.name: ("manifests/cluster-install-no-crds/workflow-controller-rbac/"
                           "workflow-controller-clusterrole.yaml", "argo-cluster-role"),
}

#: kube-controller-manager's --controllers: what makes user-written workloads run (Deployment ->
#: ReplicaSet -> Pods, Jobs, CronJobs, StatefulSets, finished-Job TTLs), the garbage collector
#: (ownerReferences), namespace deletion, and service accounts with their token Secrets.
#: node-lifecycle-controller is left out: KWOK stands in for the kubelets and renews its nodes'
#: Leases, but on this shared 2-core machine under a full CI run a renewal can come late (or a
#: test restarts the apiserver), and the controller then taints a fake node
#: `node.kubernetes.io/unreachable` for every later test of the session (seen in a CI dry run);
#: node health is KWOK's to fake, and no test needs the controller's verdict on it.
#: taint-eviction-controller is left out on purpose: no pod is ever evicted by a taint, so the
#: only evictions in a test are the ones kai-es decides. Left out too: disruption-controller
#: (tests/k8s/helpers.py's PodDisruptionBudgets refuse every eviction because nothing computes
#: their status), pod-garbage-collector-controller (it deletes pods bound to nodes that do not
#: exist, which tests make on purpose), root-ca-certificate-publisher-controller (a ConfigMap in
#: every namespace, which kai-es's informer would record).
CONTROLLERS = (
    "deployment-controller", "replicaset-controller", "statefulset-controller",
    "job-controller", "cronjob-controller", "ttl-after-finished-controller",
    "garbage-collector-controller", "namespace-controller",
    "serviceaccount-controller", "serviceaccount-token-controller",
)  # fmt: skip

#: Added for a control plane with a real node: the kubelet mounts every pod's projected
#: ServiceAccount token volume with the namespace's `kube-root-ca.crt` ConfigMap, which this
#: controller publishes (a pod whose ConfigMap is missing never starts); and the disruption
#: controller, which computes a PodDisruptionBudget's `disruptionsAllowed` from its pods' health,
#: so that a drain of the real node meets the chart's budgets as on a cluster (the KWOK control
#: planes leave it out: see CONTROLLERS).
REAL_NODE_CONTROLLERS = ("root-ca-certificate-publisher-controller", "disruption-controller")

#: The Workload API (KEP-4671) as Kubernetes 1.36 serves it, alpha and off by default:
#: `ControlPlane(**WORKLOAD_API)` turns on its feature gates (GenericWorkload: the API and
#: pods' spec.schedulingGroup; WorkloadWithJob: the Job controller makes a Workload and a PodGroup
#: for an Indexed Job whose completions equal its parallelism > 1) and its API version.
WORKLOAD_API: Mapping[str, Any] = {"feature_gates": {"GenericWorkload": True, "WorkloadWithJob": True},
                                   "runtime_config": ("scheduling.k8s.io/v1alpha2=true",)}

#: The node `ControlPlane(real_node=True)` registers (a kubelet; KWOK leaves it alone).
REAL_NODE_NAME = "real-node-0"

MARKER_NAME = "COMPLETE"
TOOLS_REPO = Path(__file__).resolve().parents[2]
#: The annotation KWOK is told to manage nodes by (--manage-nodes-with-annotation-selector).
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


class ControlPlaneError(RuntimeError):
    """Base class for this module's errors."""


class FetchError(ControlPlaneError):
    """A binary could not be built (no Go toolchain, no network, a build failure...)."""


class StartError(ControlPlaneError):
    """A component did not become ready; the message ends with the tail of its log."""


# --------------------------------------------------------------------------------------------
# Cache layout


def cache_root() -> Path:
    env = os.environ.get("KAI_ES_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kai-es"


def component_dir(component: str, version: str) -> Path:
    return cache_root() / "k8s" / f"{component}-{version}"


#: The component the Kubernetes commands and SHARED_OPERATORS are built into (its own directory
#: name: a checkout without the operators keeps its cached `kubernetes-<version>`).
KUBERNETES_COMPONENT = "kubernetes-operators"


def kube_bin(command: str) -> Path:
    """One of KUBE_COMMANDS, all built together into one component dir."""
    return component_dir(KUBERNETES_COMPONENT, KUBE_VERSION) / command


#: The component Knative Serving's controller and webhook are built into (KNATIVE_RECIPE).
KNATIVE_COMPONENT = "knative-serving"


def operator_dir(op: Operator) -> Path:
    """The component dir an operator's binary and files are in."""
    if op in SHARED_OPERATORS:
        return component_dir(KUBERNETES_COMPONENT, KUBE_VERSION)
    if op in KNATIVE_OPERATORS:
        return component_dir(KNATIVE_COMPONENT, op.version)
    return component_dir(op.name, op.version)


def operator_bin(op: Operator) -> Path:
    """`op`'s executable (the one of the operator whose binary it runs: SAME_INSTALL)."""
    op = SAME_INSTALL.get(op.name, op)
    return operator_dir(op) / op.name


def operator_file(op: Operator, rel: str) -> Path:
    """One of `op`'s module files (a CRD, its webhook manifest...), as cached."""
    return operator_dir(op) / op.cached(rel)


def apiserver_bin() -> Path:
    return kube_bin("kube-apiserver")


def controller_manager_bin() -> Path:
    return kube_bin("kube-controller-manager")


def kubelet_bin() -> Path:
    return kube_bin("kubelet")


def etcd_bin() -> Path:
    return component_dir("etcd", ETCD_VERSION) / "etcd"


def kube_router_bin() -> Path:
    return component_dir("kube-router", KUBE_ROUTER_VERSION) / "kube-router"


def kwok_bin() -> Path:
    return component_dir("kwok", KWOK_VERSION) / "kwok"


def helm_bin() -> Path:
    return component_dir("helm", HELM_VERSION) / "helm"


def kwok_stage_files() -> list[Path]:
    d = component_dir("kwok", KWOK_VERSION) / "stages"
    return [d / Path(p).name for p in KWOK_STAGES]


# --------------------------------------------------------------------------------------------
# Building


def find_go() -> str:
    """The `go` binary (1.26+ needed by kubernetes 1.36), from PATH or /usr/local/go/bin."""
    candidates = [shutil.which("go"), "/usr/local/go/bin/go"]
    for c in candidates:
        if c and Path(c).exists():
            out = subprocess.run([c, "version"], capture_output=True, text=True).stdout
            m = re.search(r"go(\d+)\.(\d+)", out)
            if m and (int(m.group(1)), int(m.group(2))) >= (1, 26):
                return c
    raise FetchError(
        "a Go toolchain 1.26 or newer is needed to build kube-apiserver "
        f"{KUBE_VERSION} (looked on PATH and in /usr/local/go/bin; Debian's `golang` package "
        "is too old): install Go 1.26 into /usr/local/go"
    )


class _Builder:
    """Runs go commands with a log file; raises FetchError with the log tail on failure."""

    def __init__(self, go: str, log_path: Path) -> None:
        self.go = go
        self.log_path = log_path
        self.env = dict(os.environ)
        self.env["GOTOOLCHAIN"] = "local"  # never download another toolchain
        self.env["PATH"] = f"{Path(go).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env.setdefault("GOFLAGS", "-buildvcs=false")

    def run(self, args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> str:
        full_env = dict(self.env)
        full_env.update(env or {})
        with open(self.log_path, "a") as log:
            log.write(f"--- (cd {cwd} && {' '.join(args)})\n")
            log.flush()
            t0 = time.monotonic()
            res = subprocess.run(
                list(args), cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=log, text=True
            )
            log.write(res.stdout[-4000:])
            log.write(f"--- exit {res.returncode} after {time.monotonic() - t0:.1f}s\n")
        if res.returncode != 0:
            raise FetchError(
                f"`{' '.join(args)}` exited {res.returncode} in {cwd}; "
                f"last lines of {self.log_path}:\n{tail(self.log_path, 40)}"
            )
        return res.stdout

    def download(self, module: str, cwd: Path) -> dict[str, Any]:
        out = self.run([self.go, "mod", "download", "-json", module], cwd)
        info: dict[str, Any] = json.loads(out)
        if info.get("Error"):
            raise FetchError(f"go mod download {module}: {info['Error']}")
        return info


#: A build step: (builder, an empty directory to leave the recipe's outputs in, a scratch dir).
BuildFn = Callable[[_Builder, Path, Path], None]


def _canonical(value: Any) -> Any:
    """`value` as JSON-able data whose text does not depend on set order or hash seeds; a
    function or class stands for its source text."""
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, (frozenset, set)):
        return sorted(json.dumps(_canonical(v), sort_keys=True) for v in value)
    if isinstance(value, (tuple, list)):
        return [_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if inspect.isfunction(value) or inspect.isclass(value):
        return inspect.getsource(value)
    if dataclasses.is_dataclass(value):
        return {"class": type(value).__name__,
                **{f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    raise TypeError(f"a build recipe's input must be data or a function, not {type(value).__name__}")


@dataclass(frozen=True)
class Recipe:
    """How one cached component is built, and everything its build depends on.

    The digest written to the component's marker covers the component and version, the output
    file names, the build function's source and every declared input (constants as values,
    helper functions and classes as their source). Change any of them and the next `fetch`
    rebuilds; change anything else in this file and nothing rebuilds."""

    component: str
    version: str
    #: files the build leaves, relative to the component dir (the first is "the" binary)
    outputs: tuple[str, ...]
    build: BuildFn
    #: the constants and helpers `build` reads (its own source is always included)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    #: a digest function replacing the default one (helm keeps the digest it was cached under)
    digest_override: Callable[[], str] | None = None

    @property
    def dir(self) -> Path:
        return component_dir(self.component, self.version)

    def paths(self) -> list[Path]:
        return [self.dir / o for o in self.outputs]

    def digest(self) -> str:
        if self.digest_override is not None:
            return self.digest_override()
        doc = {
            "component": self.component, "version": self.version, "outputs": list(self.outputs),
            "build": inspect.getsource(self.build), "inputs": _canonical(self.inputs),
        }  # fmt: skip
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def is_built(self) -> bool:
        try:
            ok = (self.dir / MARKER_NAME).read_text().strip() == self.digest()
        except OSError:
            return False
        return ok and all(p.exists() for p in self.paths())


def _staging_replaces(kubernetes_gomod: str) -> list[str]:
    """Modules kubernetes' go.mod maps to ./staging/... and also requires."""
    staged = set(re.findall(r"^\s*(\S+)\s+=>\s+\./staging/", kubernetes_gomod, re.M))
    required = set()
    for block in re.findall(r"^require\s*\((.*?)^\)", kubernetes_gomod, re.M | re.S):
        required.update(re.findall(r"^\s*(\S+)\s+v\S+", block, re.M))
    required.update(re.findall(r"^require\s+(\S+)\s+v\S+", kubernetes_gomod, re.M))
    return sorted((staged & required) - UNPUBLISHED_STAGING)


def _sibling_replaces(gomod: str) -> list[str]:
    """Modules a go.mod replaces with a relative path (../api etc.), i.e. sibling modules."""
    return sorted(set(re.findall(r"^\s*(\S+)\s+=>\s+\.\./", gomod, re.M)))


def _write_tools_go(workdir: Path, *packages: str) -> None:
    imports = "".join(f'\t_ "{p}"\n' for p in packages)
    (workdir / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports})\n")


def _kube_version_ldflags() -> list[str]:
    """-X flags for the version every Kubernetes command reports (`--version`, /version)."""
    major, minor = KUBE_VERSION.lstrip("v").split(".")[:2]
    build_date = "1970-01-01T00:00:00Z"  # reproducible; the commands only report it
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBE_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={build_date}",
        ]
    return flags


def _build_kubernetes(b: _Builder, out_dir: Path, workdir: Path) -> None:
    """KUBE_COMMANDS and SHARED_OPERATORS from one throwaway module and ONE `go build`, so the
    packages they share (client-go, apimachinery, apiserver, component-base...) compile once and
    link into each binary."""
    b.run([b.go, "mod", "init", "kai-es.local/build/kubernetes"], workdir)
    info = b.download(f"k8s.io/kubernetes@{KUBE_VERSION}", workdir)
    gomod = Path(info["GoMod"]).read_text()
    args = [b.go, "mod", "edit", f"-require=k8s.io/kubernetes@{KUBE_VERSION}"]
    args += [f"-require={op.module}@{op.version}" for op in SHARED_OPERATORS]
    for mod in _staging_replaces(gomod):
        args.append(f"-replace={mod}={mod}@{STAGING_VERSION}")
    b.run(args, workdir)
    packages = [f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_COMMANDS] + [op.package for op in SHARED_OPERATORS]
    _write_tools_go(workdir, *packages)
    b.run([b.go, "mod", "tidy"], workdir)
    ldflags = "-s -w " + " ".join(_kube_version_ldflags())
    # `-o DIR/` with several main packages writes one executable per package into DIR
    b.run([b.go, "build", "-trimpath", "-ldflags", ldflags, "-o", f"{out_dir}{os.sep}", *packages],
          workdir, env={"CGO_ENABLED": "0"})  # fmt: skip
    _place_operators(b, out_dir, workdir, SHARED_OPERATORS)


def _place_operators(b: _Builder, out_dir: Path, workdir: Path, operators: Sequence[Operator]) -> None:
    """Name each operator's executable after it (`go build -o DIR/` names it after its package's
    last element: lws's is `cmd`) and copy its files out of the module cache."""
    for op in operators:
        built = out_dir / Path(op.package).name
        if built.name != op.name:
            built.rename(out_dir / op.name)
        mod_dir = Path(b.download(f"{op.module}@{op.version}", workdir)["Dir"])
        for rel in op.module_files():
            dst = out_dir / op.cached(rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(mod_dir / rel, dst)
            dst.chmod(0o644)  # the module cache is read-only


def _build_kuberay(b: _Builder, out_dir: Path, workdir: Path) -> None:
    """KubeRay's operator in a module of its own (see KUBERAY), at the versions its go.mod asks."""
    b.run([b.go, "mod", "init", "kai-es.local/build/kuberay"], workdir)
    b.run([b.go, "mod", "edit", f"-require={KUBERAY.module}@{KUBERAY.version}"], workdir)
    _write_tools_go(workdir, KUBERAY.package)
    b.run([b.go, "mod", "tidy"], workdir)
    b.run([b.go, "build", "-trimpath", "-ldflags", "-s -w", "-o", f"{out_dir}{os.sep}", KUBERAY.package],
          workdir, env={"CGO_ENABLED": "0"})  # fmt: skip
    _place_operators(b, out_dir, workdir, (KUBERAY,))


def operator_role_file(name: str) -> Path:
    """The file holding operator `name`'s manager ClusterRole (OPERATOR_ROLES), as cached."""
    return OPERATOR_ROLES_RECIPE.dir / name / Path(OPERATOR_ROLES[name][0]).name


def _copy_operator_roles(b: _Builder, out_dir: Path, workdir: Path) -> None:
    """Each OPERATOR_ROLES file from its operator's module (downloaded, not built)."""
    for name, (rel, _) in sorted(OPERATOR_ROLES.items()):
        op = OPERATORS[name]
        src = Path(b.download(f"{op.module}@{op.version}", workdir)["Dir"]) / rel
        dst = out_dir / name / Path(rel).name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        dst.chmod(0o644)  # the module cache is read-only


def _build_training_operator(b: _Builder, out_dir: Path, workdir: Path) -> None:
    """Kubeflow's training-operator in a module of its own (see TRAINING_OPERATOR), at the
    versions its go.mod asks."""
    op = TRAINING_OPERATOR
    b.run([b.go, "mod", "init", "kai-es.local/build/training-operator"], workdir)
    b.run([b.go, "mod", "edit", f"-require={op.module}@{op.version}"], workdir)
    _write_tools_go(workdir, op.package)
    b.run([b.go, "mod", "tidy"], workdir)
    b.run([b.go, "build", "-trimpath", "-ldflags", "-s -w", "-o", f"{out_dir}{os.sep}", op.package],
          workdir, env={"CGO_ENABLED": "0"})  # fmt: skip
    _place_operators(b, out_dir, workdir, (op,))


def _copy_training_operator_mpi_crd(b: _Builder, out_dir: Path, workdir: Path) -> None:
    """TRAINING_OPERATOR_MPI's CRD out of the training-operator's module (downloaded, not
    built: its binary is TRAINING_OPERATOR's)."""
    op = TRAINING_OPERATOR_MPI
    mod_dir = Path(b.download(f"{op.module}@{op.version}", workdir)["Dir"])
    for rel in op.module_files():
        dst = out_dir / op.cached(rel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mod_dir / rel, dst)
        dst.chmod(0o644)  # the module cache is read-only


def knative_file(rel: str) -> Path:
    """One of KNATIVE_REQUIRED_CRDS' or KNATIVE_INSTALL's files (its path in its module), as
    cached."""
    return component_dir(KNATIVE_COMPONENT, KNATIVE_SERVING_VERSION) / "knative" / Path(rel).name


def _build_knative(b: _Builder, out_dir: Path, workdir: Path) -> None:
    """Knative Serving's controller and webhook in a module of their own (see
    KNATIVE_SERVING_VERSION), at the versions its go.mod asks, by one `go build`; then the
    files of KNATIVE_REQUIRED_CRDS and KNATIVE_INSTALL out of the module cache, each from the
    version of its module the build resolved."""
    b.run([b.go, "mod", "init", "kai-es.local/build/knative-serving"], workdir)
    b.run([b.go, "mod", "edit", f"-require={KNATIVE_CONTROLLER.module}@{KNATIVE_SERVING_VERSION}"], workdir)
    packages = [op.package for op in KNATIVE_OPERATORS]
    _write_tools_go(workdir, *packages)
    b.run([b.go, "mod", "tidy"], workdir)
    b.run([b.go, "build", "-trimpath", "-ldflags", "-s -w", "-o", f"{out_dir}{os.sep}", *packages],
          workdir, env={"CGO_ENABLED": "0"})  # fmt: skip
    _place_operators(b, out_dir, workdir, KNATIVE_OPERATORS)
    dirs: dict[str, Path] = {}
    for module, rel in (*KNATIVE_REQUIRED_CRDS, *KNATIVE_INSTALL):
        if module not in dirs:
            dirs[module] = Path(json.loads(b.run([b.go, "list", "-m", "-json", module], workdir))["Dir"])
        dst = out_dir / "knative" / Path(rel).name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dirs[module] / rel, dst)
        dst.chmod(0o644)  # the module cache is read-only


def _build_argo(b: _Builder, out_dir: Path, workdir: Path) -> None:
    """Argo Workflows' workflow-controller in a module of its own (see ARGO_CONTROLLER), at the
    versions its go.mod asks, with the version it reports (and tags its executor image with) set
    as its Makefile sets it; then its CRDs and ARGO_CONFIGMAP out of the module cache."""
    op = ARGO_CONTROLLER
    b.run([b.go, "mod", "init", "kai-es.local/build/argo-workflows"], workdir)
    b.run([b.go, "mod", "edit", f"-require={op.module}@{op.version}"], workdir)
    _write_tools_go(workdir, op.package)
    b.run([b.go, "mod", "tidy"], workdir)
    ldflags = f"-s -w -X {op.module}.version={op.version}"
    b.run([b.go, "build", "-trimpath", "-ldflags", ldflags, "-o", f"{out_dir}{os.sep}", op.package],
          workdir, env={"CGO_ENABLED": "0"})  # fmt: skip
    _place_operators(b, out_dir, workdir, (op,))
    dst = out_dir / op.cached(ARGO_CONFIGMAP)
    shutil.copyfile(Path(b.download(f"{op.module}@{op.version}", workdir)["Dir"]) / ARGO_CONFIGMAP, dst)
    dst.chmod(0o644)  # the module cache is read-only


def _build_etcd(b: _Builder, out_dir: Path, workdir: Path) -> None:
    b.run([b.go, "mod", "init", "kai-es.local/build/etcd"], workdir)
    info = b.download(f"go.etcd.io/etcd/server/v3@{ETCD_VERSION}", workdir)
    gomod = Path(info["GoMod"]).read_text()
    args = [b.go, "mod", "edit", f"-require=go.etcd.io/etcd/server/v3@{ETCD_VERSION}"]
    for mod in _sibling_replaces(gomod):
        args.append(f"-replace={mod}={mod}@{ETCD_VERSION}")
    b.run(args, workdir)
    _write_tools_go(workdir, "go.etcd.io/etcd/server/v3")
    b.run([b.go, "mod", "tidy"], workdir)
    b.run(
        [b.go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out_dir / "etcd"),
         "go.etcd.io/etcd/server/v3"],
        workdir, env={"CGO_ENABLED": "0"},
    )  # fmt: skip


def _build_kwok(b: _Builder, out_dir: Path, workdir: Path) -> None:
    b.run(
        [b.go, "install", "-trimpath", "-ldflags", "-s -w",
         f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"],
        workdir, env={"GOBIN": str(out_dir), "CGO_ENABLED": "0"},
    )  # fmt: skip
    info = b.download(f"sigs.k8s.io/kwok@{KWOK_VERSION}", workdir)
    stages = out_dir / "stages"
    stages.mkdir()
    for rel in KWOK_STAGES:
        dst = stages / Path(rel).name
        shutil.copyfile(Path(info["Dir"]) / rel, dst)
        dst.chmod(0o644)  # the module cache is read-only


def _build_kube_router(b: _Builder, out_dir: Path, workdir: Path) -> None:
    b.run(
        [b.go, "install", "-trimpath", "-ldflags", "-s -w",
         f"github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@{KUBE_ROUTER_VERSION}"],
        workdir, env={"GOBIN": str(out_dir), "CGO_ENABLED": "0"},
    )  # fmt: skip


# HELM-RECIPE-BEGIN (edits between these markers invalidate the cached helm build)


def _build_helm(b: _Builder, out: Path, workdir: Path) -> None:
    gobin = workdir / "bin"
    # helm reports its version from this variable (`helm version`, .Capabilities.HelmVersion)
    version_flag = f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"
    b.run(
        [b.go, "install", "-trimpath", "-ldflags", f"-s -w {version_flag}",
         f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"],
        workdir, env={"GOBIN": str(gobin), "CGO_ENABLED": "0"},
    )  # fmt: skip
    shutil.copy2(gobin / "helm", out)


# HELM-RECIPE-END


def _helm_recipe_digest() -> str:
    """Digest of helm's version and the lines between the HELM-RECIPE markers (each matched as
    a whole line). Kept as it was when helm was first cached, so helm builds stay valid."""
    src = Path(__file__).read_text()
    m = re.search(r"^# HELM-RECIPE-BEGIN\b[^\n]*\n(.*)^# HELM-RECIPE-END$", src, re.M | re.S)
    if m is None:
        raise FetchError("tools/k8s/controlplane.py lost its HELM-RECIPE markers")
    return hashlib.sha256(f"helm\0{HELM_VERSION}\0".encode() + m.group(1).encode()).hexdigest()


def _build_helm_into(b: _Builder, out_dir: Path, workdir: Path) -> None:
    _build_helm(b, out_dir / "helm", workdir)


#: Every inputs mapping names what its build reads besides its own source; `_Builder` (the go
#: environment: GOTOOLCHAIN, GOFLAGS) is an input of each.
KUBERNETES = Recipe(
    KUBERNETES_COMPONENT, KUBE_VERSION,
    (*KUBE_COMMANDS, *(o.name for o in SHARED_OPERATORS), *(f for o in SHARED_OPERATORS for f in o.files())),
    _build_kubernetes,
    {"builder": _Builder, "staging_version": STAGING_VERSION, "unpublished": UNPUBLISHED_STAGING,
     "operators": SHARED_OPERATORS, "operator": Operator,
     "helpers": (_staging_replaces, _write_tools_go, _kube_version_ldflags, _place_operators)},
)  # fmt: skip
KUBERAY_RECIPE = Recipe(
    KUBERAY.name, KUBERAY.version, (KUBERAY.name, *KUBERAY.files()), _build_kuberay,
    {"builder": _Builder, "operator": KUBERAY, "operator_class": Operator,
     "helpers": (_write_tools_go, _place_operators)},
)  # fmt: skip
OPERATOR_ROLES_RECIPE = Recipe(
    "operator-roles", "1", tuple(f"{n}/{Path(f).name}" for n, (f, _) in sorted(OPERATOR_ROLES.items())),
    _copy_operator_roles,
    {"roles": OPERATOR_ROLES, "operators": {n: (OPERATORS[n].module, OPERATORS[n].version) for n in OPERATOR_ROLES}},
)  # fmt: skip
TRAINING_OPERATOR_RECIPE = Recipe(
    TRAINING_OPERATOR.name, TRAINING_OPERATOR.version, (TRAINING_OPERATOR.name, *TRAINING_OPERATOR.files()),
    _build_training_operator,
    {"builder": _Builder, "operator": TRAINING_OPERATOR, "operator_class": Operator,
     "helpers": (_write_tools_go, _place_operators)},
)  # fmt: skip
TRAINING_OPERATOR_MPI_RECIPE = Recipe(
    TRAINING_OPERATOR_MPI.name, TRAINING_OPERATOR_MPI.version, TRAINING_OPERATOR_MPI.files(),
    _copy_training_operator_mpi_crd, {"operator": TRAINING_OPERATOR_MPI, "operator_class": Operator},
)  # fmt: skip
KNATIVE_RECIPE = Recipe(
    KNATIVE_COMPONENT, KNATIVE_SERVING_VERSION,
    (*(op.name for op in KNATIVE_OPERATORS), *(f for op in KNATIVE_OPERATORS for f in op.files()),
     *(f"knative/{Path(rel).name}" for _, rel in (*KNATIVE_REQUIRED_CRDS, *KNATIVE_INSTALL))),
    _build_knative,
    {"builder": _Builder, "operators": KNATIVE_OPERATORS, "operator_class": Operator,
     "required": KNATIVE_REQUIRED_CRDS, "install": KNATIVE_INSTALL,
     "helpers": (_write_tools_go, _place_operators)},
)  # fmt: skip
ARGO_RECIPE = Recipe(
    ARGO_CONTROLLER.name, ARGO_CONTROLLER.version,
    (ARGO_CONTROLLER.name, *ARGO_CONTROLLER.files(), ARGO_CONTROLLER.cached(ARGO_CONFIGMAP)), _build_argo,
    {"builder": _Builder, "operator": ARGO_CONTROLLER, "operator_class": Operator, "configmap": ARGO_CONFIGMAP,
     "helpers": (_write_tools_go, _place_operators)},
)  # fmt: skip
ETCD = Recipe(
    "etcd", ETCD_VERSION, ("etcd",), _build_etcd,
    {"builder": _Builder, "helpers": (_sibling_replaces, _write_tools_go)},
)  # fmt: skip
KWOK = Recipe(
    "kwok", KWOK_VERSION, ("kwok", *(f"stages/{Path(p).name}" for p in KWOK_STAGES)), _build_kwok,
    {"builder": _Builder, "stages": KWOK_STAGES},
)  # fmt: skip
HELM = Recipe("helm", HELM_VERSION, ("helm",), _build_helm_into, digest_override=_helm_recipe_digest)
KUBE_ROUTER = Recipe("kube-router", KUBE_ROUTER_VERSION, ("kube-router",), _build_kube_router,
                     {"builder": _Builder})
#: What the control plane runs (`fetch`); helm is separate (`fetch_helm`).
CONTROL_PLANE_RECIPES = (ETCD, KWOK, KUBERNETES)
#: Operators built apart from the control plane (`fetch_operators`), each in a module of its own.
SEPARATE_OPERATOR_RECIPES = {KUBERAY.name: KUBERAY_RECIPE, TRAINING_OPERATOR.name: TRAINING_OPERATOR_RECIPE,
                             TRAINING_OPERATOR_MPI.name: TRAINING_OPERATOR_MPI_RECIPE,
                             **{op.name: KNATIVE_RECIPE for op in KNATIVE_OPERATORS},
                             ARGO_CONTROLLER.name: ARGO_RECIPE}


def _fetch_one(recipe: Recipe, *, quiet: bool) -> Path:
    """Build `recipe` unless its marker says it is built; return its first output. The outputs
    are built into a staging dir, moved in, and the marker is written last."""
    first = recipe.paths()[0]
    if recipe.is_built():
        return first
    cdir = recipe.dir
    cdir.mkdir(parents=True, exist_ok=True)
    with open(cdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if recipe.is_built():  # another process finished meanwhile
            return first
        go = find_go()
        (cdir / MARKER_NAME).unlink(missing_ok=True)
        log_path = cdir / "build.log"
        log_path.write_text(f"building {recipe.component} {recipe.version} with {go}\n")
        t0 = time.monotonic()
        what = f"{recipe.component} {recipe.version}"
        if not quiet:
            print(f"building {what} (log: {log_path})...", file=sys.stderr)
        staging = cdir / f".staging-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            with tempfile.TemporaryDirectory(prefix=f"kai-es-build-{recipe.component}-") as tmp:
                recipe.build(_Builder(go, log_path), staging, Path(tmp))
            for rel in recipe.outputs:
                if not (staging / rel).is_file():
                    raise FetchError(f"building {what} left no {rel}; log: {log_path}")
                (cdir / rel).parent.mkdir(parents=True, exist_ok=True)
                (staging / rel).rename(cdir / rel)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        (cdir / MARKER_NAME).write_text(recipe.digest() + "\n")  # last
        if not quiet:
            print(f"built {what} in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        return first


def fetch(*, quiet: bool = True) -> dict[str, Path]:
    """Build (or find cached) etcd, KWOK, kube-apiserver, kube-controller-manager, kubelet and kube-scheduler;
    return their paths.

    Idempotent and cheap when the cache is complete; safe against concurrent callers (flock).
    """
    for recipe in CONTROL_PLANE_RECIPES:
        _fetch_one(recipe, quiet=quiet)
    return {"etcd": etcd_bin(), "kwok": kwok_bin(), **{c: kube_bin(c) for c in KUBE_COMMANDS}}


def fetch_kube_router(*, quiet: bool = True) -> Path:
    """Build (or find cached) kube-router, a real node's NetworkPolicy firewall; its path."""
    return _fetch_one(KUBE_ROUTER, quiet=quiet)


def fetch_helm(*, quiet: bool = True) -> Path:
    """Build (or find cached) helm; return its path. Same cache and locking as `fetch`."""
    return _fetch_one(HELM, quiet=quiet)


def fetch_operators(names: Sequence[str] = tuple(OPERATORS), *, quiet: bool = True) -> dict[str, Path]:
    """Build (or find cached) the operators `names` (keys of OPERATORS) and what they need;
    return their binaries. The shared ones come with the control plane's `fetch`."""
    fetch(quiet=quiet)
    if names:
        _fetch_one(OPERATOR_ROLES_RECIPE, quiet=quiet)
    out = {}
    for name in _with_needs(names):
        for key in dict.fromkeys((SAME_INSTALL.get(name, OPERATORS[name]).name, name)):
            recipe = SEPARATE_OPERATOR_RECIPES.get(key)
            if recipe is not None:
                _fetch_one(recipe, quiet=quiet)
        out[name] = operator_bin(OPERATORS[name])
    return out


def _with_needs(names: Sequence[str]) -> list[str]:
    """`names` and the operators they need, each once, needed ones first."""
    out: list[str] = []

    def add(name: str) -> None:
        if name not in OPERATORS:
            raise ControlPlaneError(f"no operator {name!r} (known: {', '.join(OPERATORS)})")
        for need in OPERATORS[name].needs:
            add(need)
        if name not in out:
            out.append(name)

    for name in names:
        add(name)
    return out


def _crds_apart(names: Sequence[str]) -> Sequence[str]:
    """`names`, if no two of them bring a CRD of the same file name (the same CRD, as
    kubeflow.org_mpijobs.yaml is for the MPI operator and TRAINING_OPERATOR_MPI): one control
    plane cannot serve both, though both may be built (`fetch`)."""
    owner: dict[str, str] = {}
    for name in names:
        for rel in OPERATORS[name].crds:
            other = owner.setdefault(Path(rel).name, name)
            if other != name:
                raise ControlPlaneError(f"operators {other!r} and {name!r} both bring {Path(rel).name}: "
                                        "run one of them per control plane")
    return names


#: Operators whose health servers listen on :8080 of every interface, a port their code fixes
#: (the MPI operator v0.8.0's; Knative's controller's, knative.dev/pkg's
#: injection.HealthCheckDefaultPort): the second of them to start on a machine exits.
FIXED_PORT_8080 = ("mpi-operator", "knative-controller")


def _ports_apart(names: Sequence[str]) -> Sequence[str]:
    """`names`, unless two of them would listen on the same fixed port (FIXED_PORT_8080)."""
    both = [n for n in names if n in FIXED_PORT_8080]
    if len(both) > 1:
        raise ControlPlaneError(f"operators {' and '.join(repr(n) for n in both)} both listen on :8080: "
                                "run one of them per control plane (and per machine at a time)")
    return names


def is_fetched() -> bool:
    return all(r.is_built() for r in CONTROL_PLANE_RECIPES)


# --------------------------------------------------------------------------------------------
# Helpers


def _child_env() -> dict[str, str]:
    """Our environment minus ETCD_* (etcd reads every ETCD_* variable as a flag)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}


# --------------------------------------------------------------------------------------------
# Certificates and credentials


@dataclass(frozen=True)
class Credentials:
    """Files the apiserver and its clients need, all inside one directory."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path  # the apiserver's
    serving_key: Path
    sa_key: Path  # service-account signing key (private)
    sa_pub: Path  # and its public half (--service-account-key-file)
    kcm_cert: Path  # kube-controller-manager's serving certificate (its /healthz), same CA
    kcm_key: Path
    webhook_cert: Path  # the operators' webhook servers' (the apiserver calls them), same CA
    webhook_key: Path


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_credentials(directory: Path, *, hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> Credentials:
    """A CA (with keyUsage, which Python's strict TLS verification demands), serving
    certificates for `hosts` (the apiserver's with the in-cluster names too, and the
    controller-manager's), and a service-account key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    creds = Credentials(
        ca_cert=directory / "ca.crt", ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt", serving_key=directory / "apiserver.key",
        sa_key=directory / "sa.key", sa_pub=directory / "sa.pub",
        kcm_cert=directory / "controller-manager.crt", kcm_key=directory / "controller-manager.key",
        webhook_cert=directory / "webhooks.crt", webhook_key=directory / "webhooks.key",
    )  # fmt: skip
    serving = [
        _Serving(creds.serving_cert, creds.serving_key, "kube-apiserver",
                 (*hosts, "kubernetes", "kubernetes.default", "kubernetes.default.svc")),
        _Serving(creds.kcm_cert, creds.kcm_key, "kube-controller-manager", tuple(hosts)),
        _Serving(creds.webhook_cert, creds.webhook_key, "kai-es-operator-webhooks", tuple(hosts)),
    ]  # fmt: skip
    try:
        import cryptography  # noqa: F401
    except ImportError:
        _credentials_openssl(creds, serving)
    else:
        _credentials_cryptography(creds, serving)
    return creds


@dataclass(frozen=True)
class _Serving:
    """One serving certificate to issue from the CA."""

    cert: Path
    key: Path
    common_name: str
    names: tuple[str, ...]  # subject alternative names: IP addresses or DNS names


def _credentials_cryptography(c: Credentials, serving: Sequence[_Serving]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=30)

    def pem_key(key: Any) -> bytes:
        return bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))  # fmt: skip

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kai-es test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    c.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_private(c.ca_key, pem_key(ca_key))
    for srv in serving:
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for n in srv.names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                sans.append(x509.DNSName(n))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, srv.common_name)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_encipherment=True, key_cert_sign=False, crl_sign=False,
                content_commitment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256())
        )  # fmt: skip
        srv.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(srv.key, pem_key(key))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(c.sa_key, pem_key(sa))
    c.sa_pub.write_bytes(sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip


def _credentials_openssl(c: Credentials, serving: Sequence[_Serving]) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise StartError("need the `cryptography` package or `openssl` to make certificates")
    d = c.ca_cert.parent

    def run(*args: str) -> None:
        res = subprocess.run([openssl, *args], cwd=d, capture_output=True, text=True)
        if res.returncode != 0:
            raise StartError(f"openssl {' '.join(args)} failed: {res.stderr.strip()}")

    run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(c.ca_key))
    run("req", "-x509", "-new", "-key", str(c.ca_key), "-days", "30", "-subj", "/CN=kai-es test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,digitalSignature,keyCertSign,cRLSign",
        "-out", str(c.ca_cert))  # fmt: skip
    for srv in serving:
        san = ",".join(
            f"IP:{n}" if re.fullmatch(r"[\d.]+|[0-9a-fA-F:]+:[0-9a-fA-F:]*", n) else f"DNS:{n}"
            for n in srv.names
        )
        run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(srv.key))
        ext = d / "serving.ext"
        ext.write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n"
        )
        run("req", "-new", "-key", str(srv.key), "-subj", f"/CN={srv.common_name}", "-out", "serving.csr")
        run("x509", "-req", "-in", "serving.csr", "-CA", str(c.ca_cert), "-CAkey", str(c.ca_key),
            "-CAcreateserial", "-days", "30", "-extfile", str(ext), "-out", str(srv.cert))  # fmt: skip
    run("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(c.sa_key))
    run("pkey", "-in", str(c.sa_key), "-pubout", "-out", str(c.sa_pub))


@dataclass(frozen=True)
class User:
    """A static bearer-token identity (--token-auth-file)."""

    name: str
    token: str
    groups: tuple[str, ...] = ()


ADMIN_USER = "kai-es-admin"
#: The least-privilege identity tests give the scheduler's RBAC role to.
SCHEDULER_USER = "kai-es-scheduler"
SCHEDULER_GROUP = "kai-es:schedulers"


def _kubeconfig(server: str, ca_cert: Path, user: User) -> str:
    """A kubeconfig (JSON is valid YAML) for one user with the CA embedded."""
    import base64

    ca = base64.b64encode(ca_cert.read_bytes()).decode()
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kai-es-test",
                      "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user.name, "user": {"token": user.token}}],
        "contexts": [{"name": user.name, "context": {"cluster": "kai-es-test", "user": user.name}}],
        "current-context": user.name,
    }  # fmt: skip
    return json.dumps(cfg, indent=2) + "\n"


# --------------------------------------------------------------------------------------------
# Processes


class _Proc:
    """One child process logging to a file (appended across restarts)."""

    def __init__(self, name: str, log_path: Path, die_with_parent: bool) -> None:
        self.name = name
        self.log_path = log_path
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None
        self.log_start = 0

    def start(self, cmd: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> None:
        self._log_fh = open(self.log_path, "ab")
        self._log_fh.write(f"--- starting: {' '.join(cmd)}\n".encode())
        self._log_fh.flush()
        self.log_start = self._log_fh.tell()
        self.proc = subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=self._log_fh, stderr=subprocess.STDOUT,
            cwd=cwd, env={**_child_env(), **(env or {})}, start_new_session=True,
            # SIGKILL, not SIGTERM: a SIGTERMed apiserver whose etcd dies at the same moment was
            # seen to hang for minutes, and nothing here needs a graceful stop
            preexec_fn=pdeathsig_preexec(signal.SIGKILL) if self.die_with_parent else None,
        )  # fmt: skip

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def terminate(self) -> None:
        """SIGTERM without waiting (stop() waits): to stop several processes at once."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> int | None:
        """SIGKILL (an unclean crash). Idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        return self.stop()

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise StartError(
                f"{self.name} exited with code {self.proc.returncode}; log tail "
                f"({self.log_path}):\n{tail(self.log_path, start=self.log_start)}"
            )

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after timeout_s. Idempotent."""
        proc, self.proc = self.proc, None
        rc = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    rc = proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
            else:
                rc = proc.returncode
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        return rc

    def tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines, start=self.log_start)


# --------------------------------------------------------------------------------------------
# A real node: kubelet + Debian's containerd and runc, CNI bridge, images made from busybox-static


#: Debian packages a real node needs (`run --real-node`, tests/k8s/test_real_node.py; .ci/run
#: installs them): the container runtime, its low-level runtime, the CNI plugins, and the
#: static busybox the images are made of (no registry is reachable).
REAL_NODE_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "busybox-static", "iptables", "ipset")
#: what kube-router's firewall calls (a real node with `network_policy`)
NETWORK_POLICY_BINARIES = {"iptables": "iptables", "ipset": "ipset"}
REAL_NODE_BINARIES = {"containerd": "containerd", "ctr": "containerd", "runc": "runc",
                      "/usr/lib/cni/bridge": "containernetworking-plugins",
                      "/usr/lib/cni/host-local": "containernetworking-plugins",
                      "/usr/lib/cni/loopback": "containernetworking-plugins",
                      "/bin/busybox": "busybox-static", "umount": "mount", "ip": "iproute2"}
CNI_BIN_DIR = Path("/usr/lib/cni")
#: made locally by `busybox_images` and imported with `ctr -n k8s.io images import`
BUSYBOX_IMAGE = "kai-es.local/busybox:1"
PAUSE_IMAGE = "kai-es.local/pause:1"  # the pod sandbox: busybox sleeping
#: the host's bridge for pod networking (CNI bridge plugin), and its pod subnet
POD_BRIDGE = "kaies0"
POD_SUBNET = "10.88.0.0/16"


def busybox_images(path: Path, busybox: Path = Path("/bin/busybox")) -> Path:
    """A docker-archive tar (what `ctr images import` reads) with BUSYBOX_IMAGE and PAUSE_IMAGE:
    one layer holding a static busybox and its applet links. Byte-identical for the same
    busybox (fixed times and owners)."""
    import io
    import tarfile

    data = busybox.read_bytes()
    if b"\x7fELF" != data[:4] or b"/lib64/ld-linux" in data[:4096]:
        raise StartError(f"{busybox} is not a static busybox ELF (install busybox-static)")

    def entry(name: str, **attrs: Any) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
        for k, v in attrs.items():
            setattr(info, k, v)
        return info

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp"):
            t.addfile(entry(d, type=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755))
        t.addfile(entry("bin/busybox", size=len(data), mode=0o755), io.BytesIO(data))
        for applet in ("sh", "sleep", "echo", "cat", "ls", "hostname"):
            t.addfile(entry(f"bin/{applet}", type=tarfile.SYMTYPE, linkname="busybox"))
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    with tarfile.open(path, "w") as out:
        def add(name: str, blob: bytes) -> None:
            out.addfile(entry(name, size=len(blob), mode=0o644), io.BytesIO(blob))

        add("layer.tar", layer_bytes)
        manifest = []
        for ref, entrypoint in ((BUSYBOX_IMAGE, ["/bin/busybox", "sh"]),
                                (PAUSE_IMAGE, ["/bin/busybox", "sleep", "2147483647"])):
            config = json.dumps({
                "architecture": "amd64", "os": "linux",
                "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            }, sort_keys=True).encode()  # fmt: skip
            name = hashlib.sha256(config).hexdigest() + ".json"
            add(name, config)
            manifest.append({"Config": name, "RepoTags": [ref], "Layers": ["layer.tar"]})
        add("manifest.json", json.dumps(manifest).encode())
    return path


def host_ip() -> str:
    """The address of the interface the default route leaves by (no packet is sent): the
    kubelet refuses a loopback node IP ("nodeIP can't be loopback address")."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only selects a route
            ip = str(s.getsockname()[0])
        except OSError as e:
            raise StartError(f"a real node needs a non-loopback IPv4 address: {e}") from e
    if ip.startswith("127."):
        raise StartError("a real node needs a non-loopback IPv4 address (the kubelet refuses loopback)")
    return ip


class RealNode:
    """A kubelet v1.36.5 with Debian's containerd and runc, registered to a ControlPlane.

    Runs as root (the kubelet manages cgroups, mounts and network namespaces). Everything it
    can be told to keep is under ``<data dir>/node``: containerd's root, state and socket, runc's
    state, the CNI config and IP allocations, the kubelet's root dir and pod logs. What it does
    to the host: the bridge POD_BRIDGE (removed by stop), cgroups under ``kubepods`` (empty ones
    removed by stop), /var/lib/kubelet/device-plugins and /var/lib/cni (paths the kubelet and
    containerd's CNI library do not take from their configuration), /run/containerd/s (shim
    sockets).

    Facts of this kind of machine, each met and handled here:
    - cgroup v1: kubelet 1.35+ refuses it unless ``failCgroupV1: false``;
    - containerd 1.6 has no CRI RuntimeConfig method: the kubelet logs it and uses
      ``cgroupDriver: cgroupfs`` from its config;
    - writing a negative value to /proc/self/oom_score_adj is refused (EACCES), even as root with
      every capability; runc's init writes -998 for every pod sandbox (the kubelet's fixed
      PodInfraOOMAdj) and dies ("can't get final child's PID from pipe: EOF"), so containerd runs
      with ``restrict_oom_score_adj = true`` (no score below containerd's own);
    - no registry: the sandbox and busybox images are made from busybox-static and imported.
    """

    def __init__(self, cp: "ControlPlane", name: str, user: User, labels: Mapping[str, str],
                 die_with_parent: bool, network_policy: bool = False) -> None:
        self.cp = cp
        self.name = name
        self.user = user
        self.labels = dict(labels)
        self.dir = cp.data_dir / "node"
        self.containerd = _Proc("containerd", cp.data_dir / "containerd.log", die_with_parent)
        self.kubelet = _Proc("kubelet", cp.data_dir / "kubelet.log", die_with_parent)
        self.kubelet_port = free_port()
        self.healthz_port = free_port()
        self.node_ip: str | None = None
        #: NetworkPolicies enforced by kube-router's firewall (`start_network_policy`), as user
        #: kai-es:kube-router with a read-only ClusterRole of what it watches
        self.network_policy = network_policy
        self.router_user = User("kai-es:kube-router", secrets.token_hex(16))
        self.kube_router = _Proc("kube-router", cp.data_dir / "kube-router.log", die_with_parent)
        self.kube_router_health_port = free_port()

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.dir / "pod-logs"

    @staticmethod
    def preflight(network_policy: bool = False) -> None:
        """Raise StartError naming what is missing (root, binaries and their packages)."""
        problems = []
        if os.geteuid() != 0:
            problems.append("the kubelet and containerd must run as root")
        missing = {pkg for binary, pkg in REAL_NODE_BINARIES.items()
                   if not (Path(binary).exists() if binary.startswith("/") else shutil.which(binary))}
        missing |= {pkg for binary, pkg in NETWORK_POLICY_BINARIES.items() if network_policy and not shutil.which(binary)}
        if missing:
            problems.append(f"missing Debian packages: apt-get install {' '.join(sorted(missing))}")
        if problems:
            raise StartError("a real node cannot start: " + "; ".join(problems))

    def _ctr(self, *args: str, timeout: float = 30.0) -> str:
        res = subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
                             capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise StartError(f"ctr {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def _write_configs(self) -> None:
        d = self.dir
        for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "runc", "opt"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        (d / "containerd.toml").write_text(f"""\
version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # negative OOM scores are refused here (see the class docstring)
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{shutil.which('runc') or 'runc'}"
        Root = "{d}/runc"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{d}/cni/net.d"
""")
        (d / "cni" / "net.d" / "10-kai-es.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "kai-es",
            "plugins": [{"type": "bridge", "bridge": POD_BRIDGE, "isGateway": True, "ipMasq": False,
                         # a default route via the bridge: pods reach the host's address (the
                         # apiserver's, ControlPlane.in_cluster_env), not only the pod subnet
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                                  "routes": [{"dst": "0.0.0.0/0"}],
                                  "dataDir": str(d / "cni" / "ipam")}}],
        }, indent=2) + "\n")  # fmt: skip
        assert self.cp.creds is not None
        (d / "kubelet.kubeconfig").write_text(_kubeconfig(self.cp.base_url, self.cp.creds.ca_cert, self.user))
        (d / "kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # cgroup v1 here; 1.35+ refuses it otherwise
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": "127.0.0.1", "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cp.creds.ca_cert)}},
            "authorization": {"mode": "Webhook"},
            "failSwapOn": False,
            "podLogsDir": str(self.pod_logs),
            # a small disk or a busy test machine must not evict the test's pods, and the images
            # made here can never be pulled again: no image garbage collection
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        }, indent=2) + "\n")  # fmt: skip

    def start(self, deadline: float) -> None:
        """containerd (socket answering), the images imported, then the kubelet; until the node
        is Ready in the apiserver."""
        self.preflight()
        self.node_ip = host_ip()
        self._write_configs()
        self.containerd.start(["containerd", "--config", str(self.dir / "containerd.toml")], cwd=self.dir)
        while True:
            self.containerd.check_alive()
            try:
                self._ctr("version", timeout=5)
                break
            except (StartError, subprocess.TimeoutExpired):
                if time.monotonic() > deadline:
                    raise StartError(f"containerd not answering; log tail:\n{self.containerd.tail()}") from None
                time.sleep(0.1)
        self._ctr("images", "import", str(busybox_images(self.dir / "images.tar")), timeout=120)
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        self.kubelet.start([
            str(kubelet_bin()), f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}", f"--root-dir={self.dir / 'kubelet'}",
            f"--cert-dir={self.dir / 'kubelet' / 'pki'}", f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}", *([f"--node-labels={labels}"] if labels else []), "-v=1",
        ], cwd=self.dir)  # fmt: skip
        while True:
            self.kubelet.check_alive()
            self.containerd.check_alive()
            status, node = self.cp.request("GET", f"/api/v1/nodes/{self.name}")
            if status == 200 and conditions(node).get("Ready") == "True":
                if self.network_policy:
                    self.start_network_policy(deadline)
                return
            if time.monotonic() > deadline:
                raise StartError(f"node {self.name} not Ready in time ({conditions(node) if status == 200 else status}); "
                                 f"kubelet log tail:\n{self.kubelet.tail()}")
            time.sleep(0.2)

    #: what kube-router reads (its install's ClusterRole, read-only; it writes nothing here)
    ROUTER_RULES = (
        {"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    )

    def start_network_policy(self, deadline: float) -> None:
        """kube-router with only its network policy firewall (no routing, no service proxy, no
        CNI: the bridge plugin keeps the pods' network): for the pods on this node it programs
        iptables and ipsets from the NetworkPolicies; bridged pod-to-pod traffic passes them
        (bridge-nf-call-iptables). Until its /healthz answers."""
        remove_network_policy_rules()  # (what a run that was killed left behind)
        name = self.router_user.name
        self.cp.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                     {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": name}, "rules": list(self.ROUTER_RULES)}, ok=(201,))
        self.cp.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                     {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                      "metadata": {"name": name},
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                      "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}]},
                     ok=(201,))
        assert self.cp.creds is not None
        kubeconfig = self.dir / "kube-router.kubeconfig"
        kubeconfig.write_text(_kubeconfig(self.cp.base_url, self.cp.creds.ca_cert, self.router_user))
        self.kube_router.start([
            str(kube_router_bin()), "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--enable-cni=false", f"--hostname-override={self.name}", f"--kubeconfig={kubeconfig}",
            f"--health-port={self.kube_router_health_port}", "--metrics-port=0", "-v=1",
        ], cwd=self.dir)  # fmt: skip
        url = f"http://127.0.0.1:{self.kube_router_health_port}/healthz"
        while True:
            self.kube_router.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise StartError(f"kube-router not healthy in time ({url}); log tail:\n{self.kube_router.tail()}")
            time.sleep(0.2)

    def terminate(self) -> None:
        self.kube_router.terminate()
        self.kubelet.terminate()

    def stop(self) -> None:
        """kube-router (then its iptables rules and ipsets removed), the kubelet, then every
        container still running (their shims outlive containerd), containerd, the kubelet's
        root-dir mount, the bridge, empty kubepods cgroups."""
        if self.network_policy:
            self.kube_router.stop(timeout_s=10)
            remove_network_policy_rules()
        self.kubelet.stop(timeout_s=10)
        if self.containerd.running():
            try:
                for task in self._ctr("tasks", "ls", "-q", timeout=10).split():
                    subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", "tasks", "kill",
                                    "-s", "SIGKILL", task], capture_output=True, timeout=10)
                    subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", "tasks", "delete",
                                    "-f", task], capture_output=True, timeout=10)
            except (StartError, subprocess.TimeoutExpired):
                pass
        self.containerd.stop(timeout_s=10)
        for mount in reversed(_mounts_under(self.dir)):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        subprocess.run(["ip", "link", "delete", POD_BRIDGE], capture_output=True)
        for cgroup in Path("/sys/fs/cgroup").glob("*/kubepods"):
            for sub in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                cgroup.rmdir()

    def processes(self) -> list[_Proc]:
        return [self.containerd, self.kubelet, *([self.kube_router] if self.network_policy else [])]


#: the filter table chains and the ipsets kube-router's firewall makes
KUBE_ROUTER_CHAINS = ("KUBE-ROUTER-", "KUBE-NWPLCY-", "KUBE-POD-FW-")
KUBE_ROUTER_IPSETS = ("KUBE-SRC-", "KUBE-DST-", "kube-router-")


def remove_network_policy_rules() -> None:
    """Take kube-router's firewall out of the host's tables: the rules of the built-in chains
    that jump to its chains, its chains, its ipsets. (Its own `--cleanup-config` reports success
    and leaves them where `iptables` is the nftables one, as on Debian, then crashes cleaning
    IPVS.) Idempotent; a table or set already gone is fine."""
    saved = subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True, timeout=30).stdout
    lines = saved.splitlines()
    ours = [line[1:].split()[0] for line in lines if line.startswith(":") and line[1:].startswith(KUBE_ROUTER_CHAINS)]
    for line in lines:
        if line.startswith("-A ") and not line.split()[1].startswith(KUBE_ROUTER_CHAINS) \
                and any(f"-j {chain}" in line for chain in ours):
            subprocess.run(["iptables", "-t", "filter", "-D", *shlex.split(line)[1:]], capture_output=True, timeout=30)
    for flag in ("-F", "-X"):
        for chain in ours:
            subprocess.run(["iptables", "-t", "filter", flag, chain], capture_output=True, timeout=30)
    sets = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, timeout=30).stdout.split()
    for name in sets:
        if name.startswith(KUBE_ROUTER_IPSETS):
            subprocess.run(["ipset", "destroy", name], capture_output=True, timeout=30)


def _mounts_under(directory: Path) -> list[str]:
    """Mount points at or under `directory`, in mount order (/proc/self/mountinfo)."""
    prefix = str(directory)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[4].replace("\\040", " ") for line in lines if len(line.split()) > 4]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


DATA_DIR_PREFIX = "kai-es-k8s-"
OWNER_FILE = "owner.pid"


def remove_stale_data_dirs(base: Path) -> list[Path]:
    """Remove temp data dirs (etcd data on /dev/shm is memory) left by a process that died
    without closing its ControlPlane: those whose owner.pid names no running process."""
    removed = []
    for d in base.glob(f"{DATA_DIR_PREFIX}*"):
        try:
            pid = int((d / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # not ours to judge (no owner file, e.g. an explicit data_dir)
        try:
            os.kill(pid, 0)
            continue  # its owner is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def conditions(obj: Mapping[str, Any]) -> dict[str, str]:
    """An object's status conditions as {type: status}. A missing or null status or conditions
    list is no conditions: a CRD's reply to its own create, and a GET right after it, carry
    ``"conditions": null`` until the apiextensions controllers have named and established it
    (the Go field has no omitempty)."""
    status = obj.get("status") or {}
    return {c["type"]: c["status"] for c in status.get("conditions") or () if c and "type" in c}


class HttpError(ControlPlaneError):
    def __init__(self, status: int, body: str, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


# --------------------------------------------------------------------------------------------
# Operators: each a process of the control plane, with its CRDs and webhooks installed


def _load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    import yaml  # pyyaml, a kai-es dependency: only the operators' manifests need it here

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def json_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """`doc` with RFC 6902 `add` and `replace` operations applied (what the operators'
    kustomizations use on their webhook manifests); any other operation raises."""
    doc = json.loads(json.dumps(doc))
    for op in ops:
        if op.get("op") not in ("add", "replace"):
            raise ControlPlaneError(f"unsupported JSON patch operation {op.get('op')!r}")
        parts = [t.replace("~1", "/").replace("~0", "~") for t in str(op["path"]).split("/")[1:]]
        if not parts:
            raise ControlPlaneError("a JSON patch of the whole document")
        parent = doc
        for t in parts[:-1]:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        last, value = parts[-1], json.loads(json.dumps(op["value"]))
        if isinstance(parent, list):
            if op["op"] == "add":
                parent.insert(len(parent) if last == "-" else int(last), value)
            else:
                parent[int(last)] = value
        else:
            if op["op"] == "replace" and last not in parent:
                raise ControlPlaneError(f"JSON patch replaces {op['path']}, which is not there")
            parent[last] = value
    return doc


def webhook_configurations(op: Operator, url_base: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    """`op`'s webhook configurations as its install makes them (its kustomization's patches
    applied), each webhook called at `url_base` + its path (the operator runs on this machine,
    not behind a Service) with `ca_bundle`, each configuration named after the operator (every
    kubebuilder project calls its own `mutating-webhook-configuration`). A webhook only for
    resources of the operator's own API groups whose CRDs it does not install (the
    training-operator's MXJob one) is left out: nothing would call it."""
    import base64

    if not op.webhooks:
        return []
    patches = {kind: [o for d in _load_yaml_documents(operator_file(op, f)) for o in
                      (d if isinstance(d, list) else [d])] for kind, f in op.webhook_patches}
    served = {(crd["spec"]["group"], crd["spec"]["names"]["plural"])
              for rel in op.crds for crd in _load_yaml_documents(operator_file(op, rel))}
    own_groups = {group for group, _ in served}

    def unserved(hook: Mapping[str, Any]) -> bool:
        targets = {(group, resource) for rule in hook.get("rules") or ()
                   for group in rule.get("apiGroups") or () for resource in rule.get("resources") or ()}
        return bool(targets) and all(g in own_groups and (g, r) not in served for g, r in targets)

    out = []
    for doc in _load_yaml_documents(operator_file(op, op.webhooks)):
        kind = doc["kind"]
        doc = json_patch(doc, patches.get(kind, []))
        doc["metadata"] = {"name": f"{op.name}-{doc['metadata']['name']}"}
        doc["webhooks"] = [hook for hook in doc.get("webhooks") or [] if not unserved(hook)]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"].get("path", "")
            hook["clientConfig"] = {"url": url_base + path, "caBundle": base64.b64encode(ca_bundle).decode()}
        out.append(doc)
    return out


def _yaml_list(raw: Any) -> list[dict[str, Any]]:
    return [raw] if isinstance(raw, dict) else list(raw or [])


class OperatorProcess:
    """One operator (an `Operator` of OPERATORS) run by a ControlPlane on 127.0.0.1.

    It talks to the apiserver through a kubeconfig of its own user (``kai-es-operator:<name>``,
    in no group) bound to the manager ClusterRole its own install ships (OPERATOR_ROLES; the
    control plane creates it as ``kai-es-operator:<name>`` and binds it, `grant_role`), so it
    can do what its install lets it do and nothing more. Leader election
    is off where a flag or its configuration offers it (the MPI operator always elects: its
    Lease is in namespace ``mpi-operator``), metrics are off, its health probes are on a free
    loopback port (the MPI operator's health server is fixed at :8080 on every interface in
    v0.8.0: one control plane with an MPI operator per machine at a time; a second one's exits,
    and its start fails with the log). Webhooks: the JobSet, LWS, Trainer and training-operator
    managers serve theirs on a free loopback port (the training-operator's on every interface: it
    takes no host) with a certificate of the control plane's CA (their own certificate
    management is off; the training-operator's cannot be, see TRAINING_OPERATOR_CERTS) and the
    control plane registers them (`webhook_configurations`), as their installs do; KubeRay
    serves none (its default: ENABLE_WEBHOOKS unset); the MPI operator has none. Ready when its
    /readyz answers 200 (the MPI operator: when it holds its Lease; the training-operator: once
    its certificates are "mounted" and "injected") and its webhooks are registered."""

    def __init__(self, cp: "ControlPlane", op: Operator, die_with_parent: bool, taken: set[int]) -> None:
        self.cp = cp
        self.op = op
        self.dir = cp.data_dir / "operators" / op.name
        self.proc = _Proc(op.name, cp.data_dir / f"{op.name}.log", die_with_parent)
        self.user = User(f"kai-es-operator:{op.name}", secrets.token_hex(16))

        def port() -> int:
            n = int(free_port())
            while n in taken:
                n = int(free_port())
            taken.add(n)
            return n

        self.probe_port, self.webhook_port, self.status_port = port(), port(), port()

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def cert_dir(self) -> Path:
        """The webhook server's tls.crt and tls.key (controller-runtime's names). TMPDIR is
        the operator's dir, so the default `$TMPDIR/k8s-webhook-server/serving-certs` (the
        trainer's and the training-operator's: they take no certDir; the training-operator sees
        its dir as /tmp) is this."""
        return self.dir / "k8s-webhook-server" / "serving-certs"

    def _write_files(self) -> None:
        creds = self.cp.creds
        assert creds is not None
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(creds.webhook_cert, self.cert_dir / "tls.crt")
        _write_private(self.cert_dir / "tls.key", creds.webhook_key.read_bytes())
        self.kubeconfig.write_text(_kubeconfig(self.cp.base_url, creds.ca_cert, self.user))
        webhook = {"port": self.webhook_port, "host": "127.0.0.1"}
        common: dict[str, Any] = {
            "leaderElection": {"leaderElect": False}, "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
            "webhook": {**webhook, "certDir": str(self.cert_dir)},
        }  # fmt: skip
        config: dict[str, Any] | None = None
        if self.op is JOBSET:
            config = {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration", **common,
                      "internalCertManagement": {"enable": False}}
        elif self.op is LWS:
            config = {"apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration", **common,
                      "internalCertManagement": {"enable": False}}
        elif self.op is TRAINER:
            config = {"apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
                      **common, "webhook": webhook, "certManagement": {"enable": False},
                      "statusServer": {"port": self.status_port}}
        if config is not None:
            (self.dir / "config.yaml").write_text(json.dumps(config, indent=2) + "\n")

    def command(self) -> list[str]:
        binary = str(operator_bin(self.op))
        if self.op.name in TRAINING_OPERATOR_RUNS:
            # its own mount namespace, its dir bound over /tmp (TRAINING_OPERATOR_CERTS); started
            # from its binary's dir (`cwd`), so a binary or data dir under /tmp is still reached
            unshare = ["unshare", "--mount", "--propagation", "private"]
            if os.geteuid() != 0:
                unshare.append("--map-root-user")  # a user namespace may mount
            return [*unshare, "--", "sh", "-c", 'mount --bind "$0" /tmp && exec "$@"', str(self.dir),
                    f"./{Path(binary).name}", "--kubeconfig=/tmp/kubeconfig",
                    *(f"--enable-scheme={s}" for s in TRAINING_OPERATOR_RUNS[self.op.name]),
                    "--metrics-bind-address=0", f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
                    f"--webhook-server-port={self.webhook_port}", "--leader-elect=false"]
        if self.op is MPI_OPERATOR:
            return [binary, f"--kubeConfig={self.kubeconfig}", f"--lock-namespace={MPI_OPERATOR_LOCK[0]}"]
        if self.op is KUBERAY:
            return [binary, "--metrics-addr=0", f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
                    "--enable-leader-election=false", "--log-stdout-encoder=console"]
        return [binary, f"--config={self.dir / 'config.yaml'}"]

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_files()
        if self.op is MPI_OPERATOR:
            self.cp.create_namespace(MPI_OPERATOR_LOCK[0])
        if self.op.name in TRAINING_OPERATOR_RUNS:
            ns, name = TRAINING_OPERATOR_CERTS
            self.cp.create_namespace(ns)
            self.cp.call("POST", f"/api/v1/namespaces/{ns}/secrets",
                         {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}}, ok=(201, 409))
            self.proc.start(self.command(), cwd=operator_bin(self.op).parent,
                            env={"KUBECONFIG": "/tmp/kubeconfig", "TMPDIR": "/tmp"})
            return
        self.proc.start(self.command(), cwd=self.dir,
                        env={"KUBECONFIG": str(self.kubeconfig), "TMPDIR": str(self.dir)})

    def ready(self) -> bool:
        self.proc.check_alive()
        if self.op is MPI_OPERATOR:
            ns, name = MPI_OPERATOR_LOCK
            status, lease = self.cp.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}")
            return status == 200 and bool((lease.get("spec") or {}).get("holderIdentity"))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/readyz", timeout=1) as r:
                return bool(r.status == 200)
        except (OSError, ValueError):
            return False

    def role(self) -> dict[str, Any]:
        """The operator's manager ClusterRole (OPERATOR_ROLES) as its install ships it, renamed
        after its user."""
        installed = SAME_INSTALL.get(self.op.name, self.op).name
        rel, name = OPERATOR_ROLES[installed]
        for doc in _load_yaml_documents(operator_role_file(installed)):
            if doc.get("kind") == "ClusterRole" and (doc.get("metadata") or {}).get("name") == name:
                return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                        "metadata": {"name": self.user.name}, "rules": doc.get("rules") or []}
        raise ControlPlaneError(f"{self.op.name}: no ClusterRole {name!r} in {rel}")

    def grant_role(self) -> None:
        """Create `role()` and bind it to the operator's user, cluster-wide (its install binds
        it to its ServiceAccount with a ClusterRoleBinding)."""
        role = self.role()
        self.cp.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role, ok=(201,))
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": self.user.name},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": self.user.name},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                 "name": self.user.name}]}  # fmt: skip
        self.cp.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding, ok=(201,))

    def register_webhooks(self) -> None:
        assert self.cp.creds is not None
        for cfg in webhook_configurations(self.op, f"https://127.0.0.1:{self.webhook_port}",
                                          self.cp.creds.ca_cert.read_bytes()):
            plural = cfg["kind"].lower() + "s"
            self.cp.call("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}", cfg, ok=(201,))

    def crds(self) -> list[dict[str, Any]]:
        """The CRDs the control plane installs for this operator before it starts: its own
        module's (`Operator.crds`)."""
        return [crd for rel in self.op.crds for crd in _load_yaml_documents(operator_file(self.op, rel))]


#: Knative Serving's system namespace: its install's, both processes' SYSTEM_NAMESPACE.
KNATIVE_NAMESPACE = "knative-serving"
#: The Service the install's webhook configurations call the webhook through (name, port name,
#: port), as its install makes it (config/core/deployments/webhook.yaml).
KNATIVE_WEBHOOK_SERVICE = ("webhook", "https-webhook", 443)
#: Reconcilers whose Leases the controller holds once it works (its leader election is always
#: on; one bucket each): Service -> Configuration -> Revision -> Deployment.
KNATIVE_RECONCILERS = ("service", "configuration", "revision")


class KnativeProcess(OperatorProcess):
    """Knative Serving's webhook or controller (KNATIVE_OPERATORS), run as its install's two
    Deployments run them, on this machine, each as its own user with the install's role.

    Both take the apiserver from --kubeconfig and the rest from the environment the Deployments
    give them: SYSTEM_NAMESPACE (knative-serving), CONFIG_LOGGING_NAME,
    CONFIG_OBSERVABILITY_NAME, POD_NAME (the operator's name, in their logs);
    the webhook also WEBHOOK_NAME and WEBHOOK_PORT. Each serves its (off) profiling endpoint on
    a free port (PROFILING_PORT: both default to 8008). Leader election is always on (Knative's
    bucketed Leases in knative-serving). The controller's health probes listen on :8080 of every
    interface, fixed in knative.dev/pkg (injection.HealthCheckDefaultPort), as the MPI operator's
    do: one such controller per machine at a time, never beside an MPI operator (the second to
    bind exits, and its start fails with its log).

    Before the webhook starts, `start` creates what the install creates for them: the namespace,
    the ConfigMaps (KNATIVE_INSTALL, with CONFIG's keys set over them), the webhook's empty
    Secret `webhook-certs`, its three webhook configurations (calling Service
    knative-serving/webhook), and that Service. The webhook itself, as on a cluster, makes its CA
    and its serving certificate for `webhook.knative-serving.svc` into the Secret and writes the
    CA bundle, rules and paths into the configurations. Nothing routes a ClusterIP here (no
    kube-proxy): the apiserver runs with --enable-aggregator-routing, so that it calls a
    Service's endpoints (as it does for aggregated APIs), and the Service has no selector but one
    EndpointSlice naming this host's address (`host_ip`: an endpoint may not be loopback) and the
    webhook's port (it listens on every interface, as in a pod).

    Ready: the webhook once each of its configurations carries its CA bundle and the apiserver
    has it default a Service (a dry run: the Revision template's container is named
    `user-container`); the controller once the Leases of KNATIVE_RECONCILERS have a holder (its
    elector's own identity, not POD_NAME; nothing else runs these reconcilers here)."""

    #: ConfigMap keys set over the install's (name -> data). No registry is reachable from here:
    #: the queue-proxy sidecar image is written by digest, and tags of images from the
    #: registries named are not resolved to digests (Knative's setting for local registries;
    #: the tests' images are example.invalid's). Pods may name their scheduler (a feature flag
    #: Knative ships off, which a cluster with KAI turns on for `kai-scheduler`).
    CONFIG: Mapping[str, Mapping[str, str]] = {
        "config-deployment": {"queue-sidecar-image": "example.invalid/knative/queue@sha256:" + "0" * 64,
                              "registries-skipping-tag-resolving": "kind.local,ko.local,dev.local,example.invalid"},
        "config-features": {"kubernetes.podspec-schedulername": "enabled"},
    }

    def _write_files(self) -> None:
        creds = self.cp.creds
        assert creds is not None
        self.kubeconfig.write_text(_kubeconfig(self.cp.base_url, creds.ca_cert, self.user))

    def command(self) -> list[str]:
        return [str(operator_bin(self.op)), f"--kubeconfig={self.kubeconfig}"]

    def env(self) -> dict[str, str]:
        env = {"KUBECONFIG": str(self.kubeconfig), "TMPDIR": str(self.dir), "SYSTEM_NAMESPACE": KNATIVE_NAMESPACE,
               "CONFIG_LOGGING_NAME": "config-logging", "CONFIG_OBSERVABILITY_NAME": "config-observability",
               "POD_NAME": self.op.name, "PROFILING_PORT": str(self.probe_port)}
        if self.op is KNATIVE_WEBHOOK:
            env.update(WEBHOOK_NAME=KNATIVE_WEBHOOK_SERVICE[0], WEBHOOK_PORT=str(self.webhook_port))
        return env

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_files()
        if self.op is KNATIVE_WEBHOOK:
            self.install()
        self.proc.start(self.command(), cwd=self.dir, env=self.env())

    def install(self) -> None:
        """The objects of Knative's install the webhook and the controller need (see the class),
        ConfigMaps first: the ConfigMap webhook refuses them until the webhook serves."""
        self.cp.create_namespace(KNATIVE_NAMESPACE)
        docs = [d for _, rel in KNATIVE_INSTALL for d in _load_yaml_documents(knative_file(rel))]
        for doc in sorted(docs, key=lambda d: d["kind"] != "ConfigMap"):
            name = doc["metadata"]["name"]
            if doc["kind"] == "ConfigMap" and name in self.CONFIG:
                doc["data"] = {**(doc.get("data") or {}), **self.CONFIG[name]}
            self.cp.create_object(doc, KNATIVE_NAMESPACE)
        name, port_name, port = KNATIVE_WEBHOOK_SERVICE
        self.cp.create_object({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": {"app": "webhook"}},
            "spec": {"ports": [{"name": port_name, "port": port, "targetPort": self.webhook_port}]},
        }, KNATIVE_NAMESPACE)  # fmt: skip
        self.cp.create_object({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-{self.op.name}", "labels": {
                "kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": "kai-es-control-plane"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [host_ip()], "conditions": {"ready": True}}],
            "ports": [{"name": port_name, "port": self.webhook_port, "protocol": "TCP"}],
        }, KNATIVE_NAMESPACE)  # fmt: skip

    def ready(self) -> bool:
        self.proc.check_alive()
        if self.op is KNATIVE_CONTROLLER:
            for reconciler in KNATIVE_RECONCILERS:
                lease = f"controller.knative.dev.serving.pkg.reconciler.{reconciler}.reconciler.00-of-01"
                status, out = self.cp.request(
                    "GET", f"/apis/coordination.k8s.io/v1/namespaces/{KNATIVE_NAMESPACE}/leases/{lease}")
                if status != 200 or not (out.get("spec") or {}).get("holderIdentity"):
                    return False
            return True
        for doc in (d for _, rel in KNATIVE_INSTALL for d in _load_yaml_documents(knative_file(rel))):
            if not doc["kind"].endswith("WebhookConfiguration"):
                continue
            status, out = self.cp.request(
                "GET", f"/apis/admissionregistration.k8s.io/v1/{doc['kind'].lower()}s/{doc['metadata']['name']}")
            hooks = out.get("webhooks") if status == 200 else None
            if not hooks or not all((h.get("clientConfig") or {}).get("caBundle") for h in hooks):
                return False
        probe = {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": "probe"},
                 "spec": {"template": {"spec": {"containers": [{"image": "example.invalid/probe:1"}]}}}}
        status, out = self.cp.request(
            "POST", f"/apis/serving.knative.dev/v1/namespaces/{KNATIVE_NAMESPACE}/services?dryRun=All", probe)
        return status == 201 and out["spec"]["template"]["spec"]["containers"][0].get("name") == "user-container"

    def register_webhooks(self) -> None:
        """Nothing: the webhook keeps the configurations `install` created."""

    def crds(self) -> list[dict[str, Any]]:
        """The controller's own CRDs and those of KNATIVE_REQUIRED_CRDS."""
        if self.op is not KNATIVE_CONTROLLER:
            return super().crds()
        return [*super().crds(), *(crd for _, rel in KNATIVE_REQUIRED_CRDS
                                   for crd in _load_yaml_documents(knative_file(rel)))]


#: The workflow-controller's namespace (its install's `argo`): its --namespace, where its ConfigMap is.
ARGO_NAMESPACE = "argo"
#: The Workflow `ArgoProcess.ready` submits (in ARGO_NAMESPACE) to see the controller work: no
#: template, so the controller fails it at once (it makes no pod); deleted once it has a phase.
ARGO_PROBE_NAME = "kai-es-ready-probe"
ARGO_PROBE: Mapping[str, Any] = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                                 "metadata": {"name": ARGO_PROBE_NAME},
                                 "spec": {"entrypoint": "none", "templates": []}}


class ArgoProcess(OperatorProcess):
    """Argo Workflows' workflow-controller (ARGO_CONTROLLER), run as its cluster-wide install's
    Deployment runs it, on this machine, as its own user with the install's ClusterRole
    (argo-cluster-role, OPERATOR_ROLES).

    It takes the apiserver from --kubeconfig, its namespace from --namespace (ARGO_NAMESPACE,
    which `start` creates with the install's ConfigMap, CONFIG's keys set over it), and watches
    every namespace (not --namespaced). Leader election is off (LEADER_ELECTION_DISABLE=true,
    the controller's own switch; its install elects with a Lease in its namespace, which its
    namespaced Role argo-role allows: not granted here). Its metrics and telemetry servers (both
    :9090 of every interface by default) are off by CONFIG. Its /healthz listens on :6060 of
    every interface, fixed in its code (cmd/workflow-controller): it is the only operator here on
    that port; a second controller on the machine logs that the port is taken and runs on (the
    controller treats it as non-fatal, and readiness does not use it). pprof stays off
    (ARGO_PPROF unset).

    Ready once the controller has given ARGO_PROBE a phase (its informers synced and its workers
    running: a Workflow is only processed after both); the probe is then deleted."""

    #: ConfigMap keys set over the install's (an empty ConfigMap): no metrics or telemetry server.
    CONFIG: Mapping[str, str] = {"metricsConfig": "enabled: false\n", "telemetryConfig": "enabled: false\n"}

    def _write_files(self) -> None:
        creds = self.cp.creds
        assert creds is not None
        self.kubeconfig.write_text(_kubeconfig(self.cp.base_url, creds.ca_cert, self.user))

    def command(self) -> list[str]:
        return [str(operator_bin(self.op)), f"--kubeconfig={self.kubeconfig}", f"--namespace={ARGO_NAMESPACE}"]

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_files()
        self.cp.create_namespace(ARGO_NAMESPACE)
        for doc in _load_yaml_documents(operator_file(self.op, ARGO_CONFIGMAP)):
            doc["data"] = {**(doc.get("data") or {}), **self.CONFIG}
            self.cp.create_object(doc, ARGO_NAMESPACE)
        self.cp.create_object(ARGO_PROBE, ARGO_NAMESPACE)
        self.proc.start(self.command(), cwd=self.dir,
                        env={"KUBECONFIG": str(self.kubeconfig), "TMPDIR": str(self.dir),
                             "LEADER_ELECTION_DISABLE": "true"})

    def ready(self) -> bool:
        self.proc.check_alive()
        path = f"/apis/argoproj.io/v1alpha1/namespaces/{ARGO_NAMESPACE}/workflows/{ARGO_PROBE_NAME}"
        status, out = self.cp.request("GET", path)
        if status != 200 or not (out.get("status") or {}).get("phase"):
            return False
        self.cp.call("DELETE", path, ok=(200, 202, 404))
        return True


#: The MPI operator's leader-election Lease (namespace, name): it always elects a leader.
MPI_OPERATOR_LOCK = ("mpi-operator", "mpi-operator")

#: The training-operator's `--enable-scheme`s: the kinds whose CRDs it brings (TRAINING_OPERATOR),
#: not MPIJob v1 (TRAINING_OPERATOR_MPI runs it, apart from the MPI operator's v2beta1) nor MXJob
#: (no KAI rule).
TRAINING_OPERATOR_SCHEMES = ("pytorchjob", "tfjob", "xgboostjob", "paddlejob")
#: Each Operator that runs the training-operator's binary -> its `--enable-scheme`s
#: (TRAINING_OPERATOR_MPI: MPIJob v1 alone).
TRAINING_OPERATOR_RUNS: Mapping[str, tuple[str, ...]] = {
    TRAINING_OPERATOR.name: TRAINING_OPERATOR_SCHEMES, TRAINING_OPERATOR_MPI.name: ("mpijob",)}
#: The Secret (namespace, name) the training-operator's certificate rotator keeps its own CA and
#: serving certificate in. v1.8.1's rotator cannot be turned off, and nothing it makes serves
#: here: it writes a CA of its own into this Secret (which must exist: its install makes it
#: empty, and so does `OperatorProcess.start`), injects it into a ValidatingWebhookConfiguration
#: named `validator.training-operator.kubeflow.org` (which is not there: the control plane
#: registers the operator's webhooks under `training-operator-validator...` with its own CA, as
#: for the others, and the rotator logs that it found none and goes on), and then waits for
#: `tls.crt` in a fixed /tmp/k8s-webhook-server/serving-certs (a kubelet's Secret mount). The
#: operator therefore runs in a mount namespace of its own with its dir bound over /tmp, where
#: `cert_dir` (the control plane's certificate, which its webhook server serves: TMPDIR=/tmp)
#: is that path; nothing is written outside the data dir.
TRAINING_OPERATOR_CERTS = ("kubeflow", "training-operator-webhook-cert")


def _process_class(op: Operator) -> type[OperatorProcess]:
    """How the control plane runs `op`."""
    if op in KNATIVE_OPERATORS:
        return KnativeProcess
    return ArgoProcess if op is ARGO_CONTROLLER else OperatorProcess


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + KWOK on 127.0.0.1, with generated
    certificates and tokens.

    ``data_dir`` (a temp dir under /dev/shm by default, removed by :meth:`close`) holds the
    credentials, kubeconfigs, the token file, each component's log and etcd's data. Ports are
    picked when the object is made and kept across restarts (:meth:`restart_apiserver`,
    :meth:`restart_controller_manager`).

    Identities: ``admin_token`` (user kai-es-admin in system:masters) and ``scheduler_token``
    (user kai-es-scheduler in group kai-es:schedulers, with no permissions until a test binds
    a role to it). Kubeconfigs: :attr:`kubeconfig` (admin), :attr:`scheduler_kubeconfig`.

    ``controller_manager`` (default on) runs kube-controller-manager with ``controllers``
    (default CONTROLLERS: the workload controllers, the garbage collector, namespaces, service
    accounts and their tokens), as user system:kube-controller-manager and each
    controller under its own service account, as a kubeadm cluster does.

    ``operators`` (keys of OPERATORS) are started last, with their CRDs, webhooks and the
    objects their installs create (`OperatorProcess`); :attr:`operators` maps each name (the
    ones they need included) to its process.

    ``real_node`` adds a kubelet (`RealNode`) and makes the control plane one pods can use:
    the apiserver on every address with the host's in its certificate (`in_cluster_env`), the
    ServiceAccount admission plugin (pods get projected tokens; `create_namespace` waits for the
    namespace's `default` ServiceAccount), the root CA publisher (REAL_NODE_CONTROLLERS), and
    ``kube_scheduler`` (default: with a real node) the default kube-scheduler, as user
    system:kube-scheduler, for the pods that name no scheduler.
    """

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        apiserver_port: int | None = None,
        die_with_parent: bool = True,
        extra_apiserver_flags: Sequence[str] = (),
        controller_manager: bool = True,
        controllers: Sequence[str] = CONTROLLERS,
        real_node: bool = False,
        real_node_labels: Mapping[str, str] | None = None,
        kube_scheduler: bool | None = None,
        operators: Sequence[str] = (),
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: Sequence[str] = (),
        network_policy: bool = False,
    ) -> None:
        operators = _ports_apart(_crds_apart(_with_needs(operators)))  # refused before anything is made
        if data_dir is None:
            base = "/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()
            remove_stale_data_dirs(Path(base))
            self.data_dir = Path(tempfile.mkdtemp(prefix=DATA_DIR_PREFIX, dir=base))
            (self.data_dir / OWNER_FILE).write_text(f"{os.getpid()}\n")
            self._owns_data_dir = True
        else:
            self.data_dir = Path(data_dir).resolve()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._owns_data_dir = False
        self.apiserver_port = apiserver_port or free_port()
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        while len({self.apiserver_port, self.etcd_port, self.etcd_peer_port}) < 3:
            self.etcd_peer_port = free_port()
        self.controller_manager_port = free_port()  # its secure port (/healthz)
        while self.controller_manager_port in {self.apiserver_port, self.etcd_port, self.etcd_peer_port}:
            self.controller_manager_port = free_port()
        self.extra_apiserver_flags = tuple(extra_apiserver_flags)
        #: --feature-gates of every Kubernetes component started here (the apiserver, the
        #: controller-manager, kube-scheduler) and the apiserver's
        #: --runtime-config (API versions off by default, e.g. WORKLOAD_API's)
        self.feature_gates = dict(feature_gates or {})
        self.runtime_config = tuple(runtime_config)
        self.controllers = tuple(controllers) if controller_manager else ()
        if real_node and self.controllers:
            self.controllers += tuple(c for c in REAL_NODE_CONTROLLERS if c not in self.controllers)
        self.admin = User(ADMIN_USER, secrets.token_hex(16), ("system:masters",))
        self.scheduler = User(SCHEDULER_USER, secrets.token_hex(16), (SCHEDULER_GROUP,))
        # the name the bootstrap RBAC policy binds ClusterRole system:kube-controller-manager to
        self.controller_manager_user = User("system:kube-controller-manager", secrets.token_hex(16))
        self.etcd = _Proc("etcd", self.data_dir / "etcd.log", die_with_parent)
        self.apiserver = _Proc("kube-apiserver", self.data_dir / "kube-apiserver.log", die_with_parent)
        self.controller_manager = _Proc(
            "kube-controller-manager", self.data_dir / "kube-controller-manager.log", die_with_parent)
        self.kwok = _Proc("kwok", self.data_dir / "kwok.log", die_with_parent)
        #: the default scheduler (pods naming no schedulerName, e.g. a Helm chart's own), run by
        #: default with a real node only: KWOK nodes' pods are the tests' and kai-es's
        self.kube_scheduler: _Proc | None = None
        self.kube_scheduler_user = User("system:kube-scheduler", secrets.token_hex(16))
        run_kube_scheduler = real_node if kube_scheduler is None else kube_scheduler
        if run_kube_scheduler:
            self.kube_scheduler = _Proc("kube-scheduler", self.data_dir / "kube-scheduler.log", die_with_parent)
        self.kube_scheduler_port = free_port()
        while self.kube_scheduler_port in {self.apiserver_port, self.etcd_port, self.etcd_peer_port,
                                           self.controller_manager_port}:
            self.kube_scheduler_port = free_port()
        #: with a real node, the address pods reach the apiserver at (the host's, see
        #: `in_cluster_env`); None otherwise
        self.pod_api_host: str | None = None
        self.last_controller_manager_seconds: float | None = None
        #: a kubelet with containerd (RealNode), as user system:node:<name> in group system:nodes,
        #: authorized by the apiserver's Node authorizer
        self.real_node: RealNode | None = None
        if real_node:
            node_user = User(f"system:node:{REAL_NODE_NAME}", secrets.token_hex(16), ("system:nodes",))
            self.real_node = RealNode(self, REAL_NODE_NAME, node_user, real_node_labels or {}, die_with_parent,
                                      network_policy=network_policy)
        #: the operators (keys of OPERATORS, and the ones they need) this control plane runs,
        #: started after KWOK (OperatorProcess), in the order they need each other
        taken = {self.apiserver_port, self.etcd_port, self.etcd_peer_port, self.controller_manager_port,
                 self.kube_scheduler_port}
        self.operators = {name: _process_class(OPERATORS[name])(self, OPERATORS[name], die_with_parent, taken)
                          for name in operators}
        if any(OPERATORS[name] in KNATIVE_OPERATORS for name in operators):
            # the apiserver calls Knative's webhook through its Service's endpoints (KnativeProcess)
            self.extra_apiserver_flags += ("--enable-aggregator-routing=true",)
        self.creds: Credentials | None = None
        self._ssl: ssl.SSLContext | None = None
        self.last_start_seconds: float | None = None

    # -- addresses and files ------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def admin_token(self) -> str:
        return self.admin.token

    @property
    def scheduler_token(self) -> str:
        return self.scheduler.token

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "admin.kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        return self.data_dir / "scheduler.kubeconfig"

    @property
    def controller_manager_kubeconfig(self) -> Path:
        return self.data_dir / "controller-manager.kubeconfig"

    @property
    def kube_scheduler_kubeconfig(self) -> Path:
        return self.data_dir / "kube-scheduler.kubeconfig"

    def in_cluster_env(self) -> list[dict[str, str]]:
        """The environment a pod on the real node needs to reach this apiserver with the
        in-cluster config: KUBERNETES_SERVICE_HOST/PORT naming the host's address (which the
        serving certificate names) instead of the `kubernetes` Service's ClusterIP, which
        nothing routes here (no kube-proxy). A container's own env wins over the kubelet's
        service variables. On a real cluster kube-proxy routes the ClusterIP: not needed."""
        if self.pod_api_host is None:
            raise ControlPlaneError("in_cluster_env: only a started control plane with a real node has one")
        return [{"name": "KUBERNETES_SERVICE_HOST", "value": self.pod_api_host},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.apiserver_port)}]

    @property
    def ca_cert(self) -> Path:
        return self.data_dir / "pki" / "ca.crt"

    def processes(self) -> list[_Proc]:
        """The components this control plane runs, in start order."""
        procs = [self.etcd, self.apiserver]
        if self.controllers:
            procs.append(self.controller_manager)
        procs.append(self.kwok)
        procs += [self.kube_scheduler] if self.kube_scheduler else []
        procs += self.real_node.processes() if self.real_node else []
        return procs + [o.proc for o in self.operators.values()]

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> "ControlPlane":
        """Fetch if needed, write credentials, start etcd, the apiserver, the controller-manager
        and KWOK; wait for etcd's /health, the apiserver's /readyz and every controller's
        health check. Raises StartError with a log tail."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        try:
            fetch_operators(tuple(self.operators)) if self.operators else fetch()
        except FetchError as e:
            raise StartError(f"could not build the control plane binaries: {e}") from e
        if self.real_node:
            RealNode.preflight(self.real_node.network_policy)  # before anything starts
            self.pod_api_host = host_ip()
            if self.real_node.network_policy:
                try:
                    fetch_kube_router()
                except FetchError as e:
                    raise StartError(f"could not build kube-router: {e}") from e
        if self.creds is None:
            hosts = ("127.0.0.1", "localhost", *([self.pod_api_host] if self.pod_api_host else []))
            self.creds = make_credentials(self.data_dir / "pki", hosts=hosts)
            tokens = self.data_dir / "tokens.csv"
            users = (self.admin, self.scheduler, self.controller_manager_user, self.kube_scheduler_user,
                     *([self.real_node.user, self.real_node.router_user] if self.real_node else []),
                     *(o.user for o in self.operators.values()))
            _write_private(tokens, "".join(  # token,user,uid[,"groups"]
                f'{u.token},{u.name},{u.name}' + (f',"{",".join(u.groups)}"' if u.groups else "") + "\n"
                for u in users).encode())  # fmt: skip
            for path, user in ((self.kubeconfig, self.admin), (self.scheduler_kubeconfig, self.scheduler),
                               (self.controller_manager_kubeconfig, self.controller_manager_user),
                               (self.kube_scheduler_kubeconfig, self.kube_scheduler_user)):
                path.write_text(_kubeconfig(self.base_url, self.creds.ca_cert, user))
        try:
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            if self.controllers:
                t_cm = time.monotonic()
                self.controller_manager.start(self.controller_manager_command(), cwd=self.data_dir)
            self._start_kwok()  # while the controller-manager builds its controllers
            if self.kube_scheduler:
                self.kube_scheduler.start(self.kube_scheduler_command(), cwd=self.data_dir)
            if self.controllers:
                self._wait_controller_manager(deadline)
                self.last_controller_manager_seconds = time.monotonic() - t_cm
            if self.kube_scheduler:
                self._wait_kube_scheduler(deadline)
            if self.real_node:
                if self.controllers:
                    self.wait_default_service_account("default", deadline)
                self.real_node.start(deadline)
            if self.operators:
                self._start_operators(deadline)
        except BaseException:
            self.stop()
            raise
        self.last_start_seconds = time.monotonic() - t0
        return self

    def _start_etcd(self, deadline: float) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self.etcd.start([
            str(etcd_bin()), "--name=kai-es", f"--data-dir={self.data_dir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=kai-es={peer}", "--unsafe-no-fsync", "--log-level=warn",
            "--quota-backend-bytes=2147483648",
        ], cwd=self.data_dir)  # fmt: skip
        while True:
            self.etcd.check_alive()
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise StartError(f"etcd not healthy in time; log tail:\n{self.etcd.tail()}")
            time.sleep(0.05)

    def apiserver_command(self) -> list[str]:
        assert self.creds is not None
        c = self.creds
        return [
            str(apiserver_bin()),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            # with a real node, pods reach it at the host's address (in_cluster_env): all addresses
            *(("--bind-address=0.0.0.0", f"--advertise-address={self.pod_api_host}") if self.pod_api_host
              else ("--bind-address=127.0.0.1", "--advertise-address=127.0.0.1")),
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.data_dir / 'pki'}",
            f"--tls-cert-file={c.serving_cert}", f"--tls-private-key-file={c.serving_key}",
            f"--client-ca-file={c.ca_cert}",
            f"--token-auth-file={self.data_dir / 'tokens.csv'}",
            # the Node authorizer lets a kubelet (system:node:<name>) read and write what its node
            # needs; only a control plane with a real node has one
            "--authorization-mode=" + ("Node,RBAC" if self.real_node else "RBAC"),
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={c.sa_pub}",
            f"--service-account-signing-key-file={c.sa_key}",
            "--api-audiences=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/16",
            # New nodes would keep their not-ready taint (no node-lifecycle controller). Pods get
            # a ServiceAccount and its projected token only with a real node (whose kubelet mounts
            # it): the ServiceAccount plugin refuses pods until their namespace's `default`
            # ServiceAccount exists, which KWOK-only tests never wait for.
            "--disable-admission-plugins=" + ("TaintNodesByCondition" if self.real_node
                                              else "ServiceAccount,TaintNodesByCondition"),
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--anonymous-auth=false",
            "-v=1",
            *self._gate_flags(),
            *((f"--runtime-config={','.join(self.runtime_config)}",) if self.runtime_config else ()),
            *self.extra_apiserver_flags,
        ]  # fmt: skip

    def _gate_flags(self) -> tuple[str, ...]:
        if not self.feature_gates:
            return ()
        return ("--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items())),)

    def _start_apiserver(self, deadline: float) -> None:
        self.apiserver.start(self.apiserver_command(), cwd=self.data_dir)
        self._wait_apiserver_ready(deadline)

    def _wait_apiserver_ready(self, deadline: float) -> None:
        while True:
            self.apiserver.check_alive()
            try:
                status, _ = self.request("GET", "/readyz", timeout=2)
                if status == 200:
                    return
            except (OSError, HttpError):
                pass
            if time.monotonic() > deadline:
                raise StartError(
                    f"kube-apiserver not ready in time ({self.base_url}/readyz); log tail:\n"
                    f"{self.apiserver.tail()}"
                )
            time.sleep(0.1)

    def controller_manager_command(self) -> list[str]:
        assert self.creds is not None
        c, kubeconfig = self.creds, self.controller_manager_kubeconfig
        return [
            str(controller_manager_bin()),
            f"--kubeconfig={kubeconfig}",
            # its /healthz and /metrics authenticate and authorize callers through the apiserver
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            # bearer tokens only: the apiserver has no front-proxy CA for it to look up in
            # kube-system/extension-apiserver-authentication (it would log an error per retry)
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1", f"--secure-port={self.controller_manager_port}",
            f"--tls-cert-file={c.kcm_cert}", f"--tls-private-key-file={c.kcm_key}",
            "--leader-elect=false",
            # each controller runs as kube-system/<controller> with its bootstrap ClusterRole
            # (system:controller:<name>); tokens come from the TokenRequest API
            "--use-service-account-credentials=true",
            # the serviceaccount-token controller signs legacy token Secrets with the key the
            # apiserver verifies them with, and puts this CA in them
            f"--service-account-private-key-file={c.sa_key}", f"--root-ca-file={c.ca_cert}",
            "--controllers=" + ",".join(self.controllers),
            "--profiling=false",
            "-v=1",
            *self._gate_flags(),
        ]  # fmt: skip

    def _wait_controller_manager(self, deadline: float) -> None:
        """Until its /healthz lists every enabled controller as ok: the checks are registered
        once all controllers are built, right before their informers and loops start."""
        url = f"https://127.0.0.1:{self.controller_manager_port}/healthz?verbose"
        missing: list[str] = list(self.controllers)
        last = ""
        while True:
            self.controller_manager.check_alive()
            _, last = self._probe(url)
            missing = [n for n in self.controllers if f"[+]{n} ok" not in last]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise StartError(
                    f"kube-controller-manager not healthy in time (waiting for {missing}; last "
                    f"/healthz: {last[-500:]!r}); log tail:\n{self.controller_manager.tail()}")
            time.sleep(0.1)

    def kube_scheduler_command(self) -> list[str]:
        """kube-scheduler as user system:kube-scheduler (the bootstrap policy's binding), its
        secure port (/healthz) on loopback with the controller-manager's certificate, no leader
        election."""
        assert self.creds is not None
        c, kubeconfig = self.creds, self.kube_scheduler_kubeconfig
        return [
            str(kube_bin("kube-scheduler")),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1", f"--secure-port={self.kube_scheduler_port}",
            f"--tls-cert-file={c.kcm_cert}", f"--tls-private-key-file={c.kcm_key}",
            "--leader-elect=false",
            "--profiling=false",
            "-v=1",
            *self._gate_flags(),
        ]  # fmt: skip

    def _wait_kube_scheduler(self, deadline: float) -> None:
        """Until kube-scheduler's /readyz answers ok (its informers synced)."""
        assert self.kube_scheduler is not None
        url = f"https://127.0.0.1:{self.kube_scheduler_port}/readyz"
        while True:
            self.kube_scheduler.check_alive()
            status, last = self._probe(url)
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise StartError(f"kube-scheduler not ready in time (last /readyz: {last!r}); log tail:\n"
                                 f"{self.kube_scheduler.tail()}")
            time.sleep(0.1)

    def _probe(self, url: str) -> tuple[int | None, str]:
        """(HTTP status, body or error) of a GET of a component's health endpoint, as admin
        (None: no answer)."""
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.admin_token}"})
        try:
            with urllib.request.urlopen(req, timeout=2, context=self.ssl_context()) as r:
                return int(r.status), r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, f"HTTP {e.code}: {e.read().decode('utf-8', 'replace')[:300]}"
        except OSError as e:
            return None, str(e)

    def wait_default_service_account(self, namespace: str, deadline: float) -> None:
        """Until the serviceaccount controller has made `namespace`'s `default` ServiceAccount
        (with the ServiceAccount admission plugin, a pod naming none is refused before)."""
        while True:
            status, _ = self.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise StartError(f"no ServiceAccount {namespace}/default in time (HTTP {status}); "
                                 f"controller-manager log tail:\n{self.controller_manager.tail()}")
            time.sleep(0.05)

    def _start_kwok(self) -> None:
        cmd = [
            str(kwok_bin()), f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=" + "=".join(KWOK_NODE_ANNOTATION),
            "--cidr=10.0.0.0/16", "--node-ip=10.0.0.1",
        ]  # fmt: skip
        cmd += [f"--config={p}" for p in kwok_stage_files()]
        self.kwok.start(cmd, cwd=self.data_dir)
        time.sleep(0.2)
        self.kwok.check_alive()

    def stop(self) -> None:
        """Stop KWOK, the controller-manager and a real node's kubelet (then its containers and
        containerd), then the apiserver (which would otherwise wait out their watches), then
        etcd. Idempotent."""
        for operator in self.operators.values():
            operator.proc.terminate()
        self.kwok.terminate()
        self.controller_manager.terminate()
        if self.kube_scheduler:
            self.kube_scheduler.terminate()
        if self.real_node:
            self.real_node.terminate()
        for operator in self.operators.values():
            operator.proc.stop(timeout_s=5)
        self.kwok.stop(timeout_s=5)
        if self.kube_scheduler:
            self.kube_scheduler.stop(timeout_s=5)
        self.controller_manager.stop(timeout_s=5)
        if self.real_node:
            self.real_node.stop()
        self.apiserver.stop(timeout_s=5)
        self.etcd.stop(timeout_s=10)

    def _start_operators(self, deadline: float) -> None:
        """Each operator's CRDs, then the operators (at once), until every one is ready; then
        their webhooks and the objects their installs create (the trainer's runtimes)."""
        self.install_crds([crd for o in self.operators.values() for crd in o.crds()],
                          timeout_s=max(1.0, deadline - time.monotonic()))
        for operator in self.operators.values():
            operator.grant_role()
            operator.start()
        waiting = list(self.operators.values())
        while waiting:
            waiting = [o for o in waiting if not o.ready()]
            if waiting and time.monotonic() > deadline:
                raise StartError("operators not ready in time: " + "; ".join(
                    f"{o.op.name} ({o.proc.log_path}):\n{o.proc.tail()}" for o in waiting))
            time.sleep(0.1)
        for operator in self.operators.values():
            operator.register_webhooks()
        for operator in self.operators.values():
            for rel in operator.op.manifests:
                for obj in _load_yaml_documents(operator_file(operator.op, rel)):
                    self.create_object(obj)

    def create_object(self, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """POST an object of a built-in kind or of a CRD installed here, by its apiVersion and
        kind (the resource name from the apiserver's discovery); retries briefly while a webhook
        the control plane just registered is not yet called (connection refused) or a new CRD
        is not yet served."""
        group_version, kind = str(obj["apiVersion"]), str(obj["kind"])
        base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        resources = self.call("GET", base)["resources"]
        res = next((r for r in resources if r["kind"] == kind and "/" not in r["name"]), None)
        if res is None:
            raise ControlPlaneError(f"{group_version} serves no {kind}")
        ns = namespace or (obj.get("metadata") or {}).get("namespace") or "default"
        path = f"{base}/namespaces/{ns}/{res['name']}" if res["namespaced"] else f"{base}/{res['name']}"
        deadline = time.monotonic() + 15
        while True:
            status, out = self.request("POST", path, obj)
            if status == 201:
                return dict(out)
            if status not in (404, 429, 500, 503) or time.monotonic() > deadline:
                raise HttpError(status, out if isinstance(out, str) else json.dumps(out), f"POST {path}")
            time.sleep(0.1)

    def restart_apiserver(self, timeout_s: float = 60.0, *, graceful: bool = False) -> float:
        """Stop and start kube-apiserver on the same port and etcd; return seconds taken.

        Open watches end (with a client-side connection error); the new apiserver's watch cache
        starts at etcd's current revision, so a watch from an older resourceVersion gets 410 Gone.
        KWOK keeps running and reconnects by itself. Not graceful by default (SIGKILL, like a
        crash): with watches open, a SIGTERM waits out the apiserver's request timeout."""
        t0 = time.monotonic()
        if graceful:
            self.apiserver.stop(timeout_s=3)
        else:
            self.apiserver.kill()
        self._start_apiserver(time.monotonic() + timeout_s)
        return time.monotonic() - t0

    def restart_etcd(self, timeout_s: float = 60.0) -> float:
        """SIGKILL etcd (a crash) and start it again on the same data dir and ports; return
        seconds until etcd is healthy and the apiserver (which keeps running, its etcd client
        reconnecting by itself) answers /readyz again. Open watches may end or stall; writes
        in the gap fail with 5xx/timeouts, as with a real etcd outage."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        self.etcd.kill()
        self._start_etcd(deadline)
        self._wait_apiserver_ready(deadline)
        return time.monotonic() - t0

    def restart_kwok(self) -> float:
        """SIGKILL KWOK and start it again; return seconds taken. It relists its nodes and pods,
        as a kubelet does when it comes back: KWOK was seen to miss a pod's deletion across an
        etcd restart (the pod stayed Terminating for good), which a kubelet's resync would not."""
        t0 = time.monotonic()
        self.kwok.kill()
        self._start_kwok()
        return time.monotonic() - t0

    def restart_controller_manager(self, timeout_s: float = 60.0) -> float:
        """SIGKILL kube-controller-manager (a crash) and start it again on the same port; return
        seconds until its controllers are healthy again. Its controllers relist everything and
        carry on from the objects' state, as after a real crash."""
        if not self.controllers:
            raise ControlPlaneError("this control plane runs no controller-manager")
        t0 = time.monotonic()
        self.controller_manager.kill()
        self.controller_manager.start(self.controller_manager_command(), cwd=self.data_dir)
        self._wait_controller_manager(time.monotonic() + timeout_s)
        return time.monotonic() - t0

    def close(self) -> None:
        """Stop everything and remove the data dir if this object created it."""
        self.stop()
        if self._owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "ControlPlane":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(
            f"--- {p.name} ({p.log_path}):\n{tail(p.log_path, lines)}"
            for p in self.processes()
        )

    # -- a small synchronous client (stdlib) for setup: CRDs, nodes ----------------------------

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.ca_cert))
        return self._ssl

    def request(
        self, method: str, path: str, body: Any = None, *, token: str | None = None,
        content_type: str = "application/json", timeout: float = 10.0,
    ) -> tuple[int, Any]:
        """One API call; returns (status, decoded JSON or text). Never raises on HTTP status."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ssl_context()) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    def call(self, method: str, path: str, body: Any = None, *, ok: Sequence[int] = (200, 201),
             **kw: Any) -> Any:
        """request(), raising HttpError unless the status is in `ok`."""
        status, out = self.request(method, path, body, **kw)
        if status not in ok:
            raise HttpError(status, out if isinstance(out, str) else json.dumps(out),
                            f"{method} {path}")
        return out

    def install_crds(self, crds: Sequence[Mapping[str, Any]], timeout_s: float = 30.0) -> None:
        """Create (or keep) each CRD and wait until Established and servable: the first
        request right after Established may get 429 or 404, so LIST until it answers 200."""
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        for crd in crds:
            self.call("POST", path, crd, ok=(201, 409))
        deadline = time.monotonic() + timeout_s
        for crd in crds:
            name = crd["metadata"]["name"]
            while True:
                conds = conditions(self.call("GET", f"{path}/{name}"))
                if conds.get("Established") == "True":
                    break
                if time.monotonic() > deadline:
                    raise StartError(f"CRD {name} not Established after {timeout_s}s: {conds}")
                time.sleep(0.05)
            spec = crd["spec"]
            version = next(v["name"] for v in spec["versions"] if v.get("served", True))
            list_path = f"/apis/{spec['group']}/{version}/{spec['names']['plural']}"
            while True:
                status, out = self.request("GET", list_path + "?limit=1")
                if status == 200:
                    break
                if status not in (404, 429, 503) or time.monotonic() > deadline:
                    raise StartError(f"CRD {name} not servable: GET {list_path}: {status} {out}")
                time.sleep(0.05)

    def create_gpu_node(
        self, name: str, *, gpus: int = 8, gpu_product: str = "NVIDIA-A100-SXM4-80GB",
        gpu_memory_mib: int = 81920, cpu: str = "64", memory: str = "512Gi", pods: int = 110,
        ephemeral_storage: str = "",
        labels: Mapping[str, str] | None = None, wait_ready: bool = True, timeout_s: float = 20.0,
    ) -> dict[str, Any]:
        """A node KWOK manages (annotation kwok.x-k8s.io/node=fake) with `gpus` nvidia.com/gpu
        and the GPU product/memory labels (and `ephemeral_storage`, as a kubelet reports it, if
        given); waits until KWOK reports it Ready."""
        capacity = {"cpu": cpu, "memory": memory, "pods": str(pods)}
        if ephemeral_storage:
            capacity["ephemeral-storage"] = ephemeral_storage
        if gpus:
            capacity["nvidia.com/gpu"] = str(gpus)
        node_labels = {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok",
            "nvidia.com/gpu.product": gpu_product, "nvidia.com/gpu.memory": str(gpu_memory_mib),
            **(labels or {}),
        }  # fmt: skip
        if not gpus:
            for k in ("nvidia.com/gpu.product", "nvidia.com/gpu.memory"):
                node_labels.pop(k, None)
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": node_labels,
                         "annotations": {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1]}},
            "spec": {},
            "status": {"capacity": capacity, "allocatable": capacity},
        }  # fmt: skip
        node: dict[str, Any] = self.call("POST", "/api/v1/nodes", body, ok=(201,))
        if wait_ready:
            node = self.wait_node_ready(name, timeout_s)
        return node

    def wait_node_ready(self, name: str, timeout_s: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            node: dict[str, Any] = self.call("GET", f"/api/v1/nodes/{name}")
            conds = conditions(node)
            if conds.get("Ready") == "True":
                return node
            self.kwok.check_alive()
            if time.monotonic() > deadline:
                raise StartError(f"node {name} not Ready after {timeout_s}s; KWOK log:\n"
                                 f"{self.kwok.tail()}")
            time.sleep(0.05)

    def create_namespace(self, name: str) -> None:
        """Create namespace `name` (existing is fine); with a real node (ServiceAccount admission
        on) and a controller-manager, also wait for its `default` ServiceAccount, so a pod can be
        created in it at once."""
        self.call("POST", "/api/v1/namespaces",
                  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                  ok=(201, 409))  # fmt: skip
        if self.real_node and self.controllers:
            self.wait_default_service_account(name, time.monotonic() + 30)

    def __repr__(self) -> str:
        state = "running" if self.apiserver.running() else "stopped"
        return f"ControlPlane({self.base_url}, {state}, data_dir={str(self.data_dir)!r})"


# --------------------------------------------------------------------------------------------
# CLI


def run_busybox_pod(cp: ControlPlane, name: str, script: str, timeout_s: float = 60.0) -> tuple[dict[str, Any], str]:
    """A BUSYBOX_IMAGE pod running `script` on the real node (bound by nodeName: no scheduler
    needed), until it ends; returns the pod and its container's log, read from the kubelet's
    pod logs directory (the apiserver cannot reach the kubelet's loopback port for logs)."""
    assert cp.real_node is not None
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": cp.real_node.name, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["/bin/busybox", "sh", "-c", script]}]}}
    cp.call("POST", "/api/v1/namespaces/default/pods", body, ok=(201,))
    deadline = time.monotonic() + timeout_s
    while True:
        pod: dict[str, Any] = cp.call("GET", f"/api/v1/namespaces/default/pods/{name}")
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            break
        if time.monotonic() > deadline:
            raise StartError(f"pod {name} still {pod['status'].get('phase')} after {timeout_s}s: "
                             f"{json.dumps(pod['status'])[:800]}\nkubelet log tail:\n{cp.real_node.kubelet.tail()}")
        time.sleep(0.2)
    logs = sorted(cp.real_node.pod_logs.glob(f"default_{name}_*/main/*.log"))
    return pod, "".join(f.read_text() for f in logs)


def _cmd_run(args: argparse.Namespace) -> int:
    cp = ControlPlane(data_dir=args.data_dir, apiserver_port=args.port,
                      controller_manager=args.controller_manager, real_node=args.real_node,
                      operators=[o for o in args.operators.split(",") if o],
                      network_policy=args.network_policy, **(WORKLOAD_API if args.workload_api else {}))
    with stop_signals_as_keyboard_interrupt():
        try:
            try:
                cp.start(timeout_s=args.timeout)
                if args.crds:
                    import yaml  # pyyaml: a kai-es dependency; only needed for --crds

                    files = sorted(Path(args.crds).glob("*.yaml"))
                    cp.install_crds([yaml.safe_load(f.read_text()) for f in files])
                    print(f"installed {len(files)} CRDs from {args.crds}", file=sys.stderr)
                for i in range(args.gpu_nodes):
                    cp.create_gpu_node(f"gpu-node-{i}", gpus=args.gpus_per_node)
            except ControlPlaneError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            cm = (f" (controller-manager healthy {cp.last_controller_manager_seconds:.1f}s after its start)"
                  if cp.last_controller_manager_seconds is not None else "")
            print(f"control plane started in {cp.last_start_seconds:.1f}s{cm}; data dir "
                  f"{cp.data_dir}", file=sys.stderr)  # fmt: skip
            if cp.real_node:
                t0 = time.monotonic()
                try:
                    pod, log = run_busybox_pod(cp, "hello", "echo hello from $(hostname) in $(cat /proc/self/cgroup | head -1)")
                except ControlPlaneError as e:
                    print(f"error: {e}", file=sys.stderr)
                    return 1
                print(f"node {cp.real_node.name} Ready ({cp.real_node.node_ip}); pod default/hello "
                      f"{pod['status']['phase']} in {time.monotonic() - t0:.1f}s, podIP "
                      f"{pod['status'].get('podIP')}, log:\n{log}", file=sys.stderr, end="")
                env = " ".join(f"{e['name']}={e['value']}" for e in cp.in_cluster_env())
                print(f"pods reach the apiserver with {env} (no kube-proxy; e.g. helm's extraEnv); "
                      f"kube-scheduler places pods naming no scheduler", file=sys.stderr)
            print(f"server={cp.base_url}", flush=True)
            print(f"kubeconfig={cp.kubeconfig}", flush=True)
            print(f"scheduler_kubeconfig={cp.scheduler_kubeconfig}", flush=True)
            while all(proc.running() for proc in cp.processes()):
                time.sleep(0.5)
            print(f"error: a component exited; logs:\n{cp.log_tails()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("stopping...", file=sys.stderr)
            return 0
        finally:
            if args.data_dir is None and not args.keep:
                cp.close()
            else:
                cp.stop()


def _cmd_fetch(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        paths = fetch(quiet=False)
        paths["helm"] = fetch_helm(quiet=False)
        paths["kube-router"] = fetch_kube_router(quiet=False)
        paths.update(fetch_operators(quiet=False))
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"control plane binaries ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    for name, path in paths.items():
        print(f"{name}={path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="build the binaries (and helm) into the cache; print their paths")
    f.set_defaults(func=_cmd_fetch)
    r = sub.add_parser("run", help="start the control plane, print kubeconfig=..., run until Ctrl-C")
    r.add_argument("--port", type=int, default=None, help="apiserver port (default: free)")
    r.add_argument("--data-dir", default=None, help="default: a temp dir removed on exit")
    r.add_argument("--keep", action="store_true", help="keep the temp data dir on exit")
    default_crds = TOOLS_REPO / "deploy" / "crds"
    r.add_argument("--crds", default=str(default_crds) if default_crds.is_dir() else "",
                   help="install the CRDs in this folder (default: the repo's deploy/crds; '' for none)")
    r.add_argument("--gpu-nodes", type=int, default=0, help="KWOK GPU nodes to create")
    r.add_argument("--gpus-per-node", type=int, default=8)
    r.add_argument("--timeout", type=float, default=60.0, help="startup timeout, seconds")
    r.add_argument("--no-controller-manager", dest="controller_manager", action="store_false",
                   help="run no kube-controller-manager (etcd, apiserver and KWOK only)")
    r.add_argument("--real-node", action="store_true",
                   help=f"also a kubelet with containerd + runc (root; Debian packages "
                        f"{', '.join(REAL_NODE_PACKAGES)}), and run a busybox pod on it")
    r.add_argument("--operators", default="",
                   help=f"comma-separated operators to run too (of: {', '.join(OPERATORS)})")
    r.add_argument("--network-policy", action="store_true",
                   help="with --real-node: enforce NetworkPolicies there (kube-router's firewall; Debian "
                        "packages iptables and ipset)")
    r.add_argument("--workload-api", action="store_true",
                   help="serve the Workload API (scheduling.k8s.io/v1alpha2; feature gates GenericWorkload and "
                        "WorkloadWithJob)")
    r.set_defaults(func=_cmd_run)
    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
