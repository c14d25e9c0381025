"""tools/k8s/controlplane.py without a control plane: what a cached build is keyed by, how the
cache is filled, how object conditions are read, the real node's images and packages."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_tool_module

ROOT = Path(__file__).resolve().parents[1]
cp_mod: Any = load_tool_module("kai_es_tools_k8s_controlplane", ROOT / "tools" / "k8s" / "controlplane.py")


def _write_ok(b: Any, out_dir: Path, workdir: Path) -> None:
    (out_dir / "tool").write_text("v1\n")


def _write_other(b: Any, out_dir: Path, workdir: Path) -> None:
    (out_dir / "tool").write_text("v2\n")


def test_a_changed_recipe_changes_the_digest() -> None:
    k = cp_mod.KUBERNETES
    base = k.digest()
    assert base == k.digest()  # stable
    changed = [
        dataclasses.replace(k, version="v1.36.6"),
        dataclasses.replace(k, outputs=(*k.outputs, "kube-scheduler")),  # another package
        dataclasses.replace(k, inputs={**k.inputs, "staging_version": "v0.36.6"}),
        dataclasses.replace(k, inputs={**k.inputs, "helpers": k.inputs["helpers"][:-1]}),  # flags
        dataclasses.replace(k, build=_write_ok),  # another build function's source
    ]
    digests = [r.digest() for r in changed]
    assert base not in digests and len(set(digests)) == len(digests)
    # two functions that differ only in their source text
    assert (dataclasses.replace(k, build=_write_ok).digest()
            != dataclasses.replace(k, build=_write_other).digest())


def test_each_component_has_its_own_digest_and_helm_keeps_its_section_digest() -> None:
    recipes = [*cp_mod.CONTROL_PLANE_RECIPES, cp_mod.HELM]
    assert len({r.digest() for r in recipes}) == len(recipes)
    # helm is keyed by its marked section alone, as when it was first cached: a change to the
    # control plane's recipes leaves it valid
    assert cp_mod.HELM.digest() == cp_mod._helm_recipe_digest()
    source = (ROOT / "tools" / "k8s" / "controlplane.py").read_text()
    section = source.split("\n# HELM-RECIPE-BEGIN", 1)[1].split("\n# HELM-RECIPE-END\n", 1)[0]
    assert "def _build_helm(" in section and "_build_kubernetes" not in section


def test_the_digest_does_not_depend_on_the_hash_seed() -> None:
    """Recipe inputs hold frozensets (UNPUBLISHED_STAGING), whose order varies with the seed."""
    code = ("import sys; sys.path.insert(0, 'tools/k8s'); import controlplane as c; "
            "print(' '.join(r.digest() for r in c.CONTROL_PLANE_RECIPES))")
    outs = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(outs) == 1, outs


def test_the_cache_rebuilds_when_and_only_when_the_recipe_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAI_ES_CACHE", str(tmp_path))
    monkeypatch.setattr(cp_mod, "find_go", lambda: sys.executable)  # the build below runs no go
    calls: list[str] = []

    def build(b: Any, out_dir: Path, workdir: Path) -> None:
        calls.append(out_dir.name)
        (out_dir / "tool").write_text("built\n")
        (out_dir / "data").mkdir()
        (out_dir / "data" / "stage.yaml").write_text("x\n")

    recipe = cp_mod.Recipe("toy", "v1", ("tool", "data/stage.yaml"), build)
    assert not recipe.is_built()
    assert cp_mod._fetch_one(recipe, quiet=True) == tmp_path / "k8s" / "toy-v1" / "tool"
    assert recipe.is_built() and len(calls) == 1
    assert (recipe.dir / cp_mod.MARKER_NAME).read_text().strip() == recipe.digest()
    assert not list(recipe.dir.glob(".staging-*"))  # outputs moved in, staging removed
    cp_mod._fetch_one(recipe, quiet=True)
    assert len(calls) == 1  # complete: skipped
    changed = dataclasses.replace(recipe, inputs={"flag": "-race"})
    assert not changed.is_built()
    cp_mod._fetch_one(changed, quiet=True)
    assert len(calls) == 2 and changed.is_built() and not recipe.is_built()
    (changed.dir / "data" / "stage.yaml").unlink()  # an output gone: rebuilt
    cp_mod._fetch_one(changed, quiet=True)
    assert len(calls) == 3


def test_a_failed_build_leaves_no_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAI_ES_CACHE", str(tmp_path))
    monkeypatch.setattr(cp_mod, "find_go", lambda: sys.executable)

    def forgets_an_output(b: Any, out_dir: Path, workdir: Path) -> None:
        (out_dir / "tool").write_text("built\n")

    recipe = cp_mod.Recipe("toy", "v1", ("tool", "other"), forgets_an_output)
    with pytest.raises(cp_mod.FetchError, match="left no other"):
        cp_mod._fetch_one(recipe, quiet=True)
    assert not (recipe.dir / cp_mod.MARKER_NAME).exists() and not recipe.is_built()


@pytest.mark.parametrize("obj", [
    {}, {"status": None}, {"status": {}}, {"status": {"conditions": None}}, {"status": {"conditions": []}},
])
def test_missing_or_null_conditions_are_no_conditions(obj: dict[str, Any]) -> None:
    assert cp_mod.conditions(obj) == {}


def test_conditions_by_type() -> None:
    obj = {"status": {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                     {"type": "Established", "status": "False"}]}}
    assert cp_mod.conditions(obj) == {"NamesAccepted": "True", "Established": "False"}


def test_ci_installs_the_real_nodes_packages() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    install = script.index("apt-get install")
    for package in cp_mod.REAL_NODE_PACKAGES:
        assert f"need+=({package})" in script[:install], package


def test_the_busybox_images_are_reproducible(tmp_path: Path) -> None:
    """The archive `ctr images import` reads: the same bytes for the same busybox."""
    if not Path("/bin/busybox").exists():
        pytest.fail("no /bin/busybox: install busybox-static (.ci/run does)")
    a = cp_mod.busybox_images(tmp_path / "a.tar")
    b = cp_mod.busybox_images(tmp_path / "b.tar")
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as t:
        manifest = json.load(t.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert sorted(tag for m in manifest for tag in m["RepoTags"]) == sorted([cp_mod.BUSYBOX_IMAGE, cp_mod.PAUSE_IMAGE])


def test_the_kubernetes_recipe_is_keyed_by_each_operators_version_and_files() -> None:
    k = cp_mod.KUBERNETES
    ops = k.inputs["operators"]
    bumped = tuple(dataclasses.replace(o, version="v9.9.9") if o.name == "lws" else o for o in ops)
    more = tuple(dataclasses.replace(o, crds=(*o.crds, "x.yaml")) if o.name == "jobset" else o for o in ops)
    digests = {k.digest(), dataclasses.replace(k, inputs={**k.inputs, "operators": bumped}).digest(),
               dataclasses.replace(k, inputs={**k.inputs, "operators": more}).digest()}
    assert len(digests) == 3
    # the operators' binaries and files are outputs of the one build, KubeRay's of its own
    assert {"jobset", "lws", "mpi-operator", "trainer-controller-manager"} <= set(k.outputs)
    assert "ray-operator" not in k.outputs and cp_mod.KUBERAY_RECIPE.outputs[0] == "ray-operator"


def test_the_training_operator_builds_apart_and_runs_only_the_kinds_whose_crds_it_brings() -> None:
    """Its own module (controller-runtime v0.17 cannot join the shared build), no MPIJob v1 CRD
    (mpijobs.kubeflow.org is the MPI operator's v2beta1 here), and `--enable-scheme` for exactly
    the kinds whose CRDs are installed."""
    op, recipe = cp_mod.TRAINING_OPERATOR, cp_mod.TRAINING_OPERATOR_RECIPE
    assert op.name not in cp_mod.KUBERNETES.outputs and recipe.outputs[0] == op.name
    assert cp_mod.SEPARATE_OPERATOR_RECIPES[op.name] is recipe
    plurals = {Path(f).name.removeprefix("kubeflow.org_").removesuffix(".yaml") for f in op.crds}
    assert "mpijobs" not in plurals
    assert {s + "s" for s in cp_mod.TRAINING_OPERATOR_SCHEMES} == plurals


def test_the_training_operators_mpijob_v1_controller_runs_its_binary_with_only_that_crd_copied() -> None:
    """`training-operator-mpi`: the training-operator's binary and manager ClusterRole, only its
    module's MPIJob v1 CRD copied (a recipe that builds nothing, so the training-operator is not
    built again), `--enable-scheme=mpijob` alone; never beside the MPI operator, whose CRD has
    the same name."""
    op, recipe = cp_mod.TRAINING_OPERATOR_MPI, cp_mod.TRAINING_OPERATOR_MPI_RECIPE
    trainer = cp_mod.TRAINING_OPERATOR
    assert (op.module, op.version, op.package) == (trainer.module, trainer.version, trainer.package)
    assert cp_mod.operator_bin(op) == cp_mod.operator_bin(trainer)
    assert cp_mod.SAME_INSTALL[op.name] is trainer and op.name not in cp_mod.OPERATOR_ROLES
    assert op.crds == ("manifests/base/crds/kubeflow.org_mpijobs.yaml",) and not op.webhooks
    assert recipe.outputs == op.files() and cp_mod.SEPARATE_OPERATOR_RECIPES[op.name] is recipe
    assert cp_mod.TRAINING_OPERATOR_RUNS[op.name] == ("mpijob",)
    assert cp_mod.TRAINING_OPERATOR_RUNS[trainer.name] == cp_mod.TRAINING_OPERATOR_SCHEMES
    assert cp_mod._with_needs([op.name, trainer.name]) == [op.name, trainer.name]
    # `controlplane.py fetch` (what .ci/run calls) builds every operator, both MPIJob ones too
    assert set(cp_mod._with_needs(tuple(cp_mod.OPERATORS))) == set(cp_mod.OPERATORS)
    with pytest.raises(cp_mod.ControlPlaneError, match="both bring kubeflow.org_mpijobs.yaml"):
        cp_mod.ControlPlane(operators=("mpi-operator", op.name))


def test_knative_builds_apart_its_controller_and_webhook_with_the_files_of_the_modules_it_requires() -> None:
    """Knative Serving: its controller and webhook from one build of a module of their own
    (its Kubernetes v0.35 modules cannot join the shared build), with its own CRDs and those of
    the networking and caching modules, its install's ConfigMaps, Secret and webhook
    configurations; the controller needs the webhook (its defaults); both run under the
    install's ClusterRole; the apiserver routes to endpoints only on a control plane that runs
    them; never beside the MPI operator (both listen on :8080)."""
    recipe, ctl, hook = cp_mod.KNATIVE_RECIPE, cp_mod.KNATIVE_CONTROLLER, cp_mod.KNATIVE_WEBHOOK
    assert recipe.outputs[:2] == (hook.name, ctl.name) and ctl.name not in cp_mod.KUBERNETES.outputs
    assert all(cp_mod.SEPARATE_OPERATOR_RECIPES[op.name] is recipe for op in (ctl, hook))
    assert {cp_mod.operator_bin(op).parent for op in (ctl, hook)} == {recipe.dir}
    assert {ctl.module, hook.module} == {"knative.dev/serving"} and ctl.version == cp_mod.KNATIVE_SERVING_VERSION
    copied = {Path(f).name for f in recipe.outputs if f.startswith("knative/")}
    assert {"ingress.yaml", "serverlessservice.yaml", "image.yaml", "config-network.yaml", "deployment.yaml",
            "defaulting.yaml", "secret.yaml"} <= copied
    assert all(f"operators/{ctl.name}/{Path(c).name}" in recipe.outputs for c in ctl.crds)
    assert cp_mod._with_needs([ctl.name]) == [hook.name, ctl.name]
    assert cp_mod.OPERATOR_ROLES[ctl.name] == cp_mod.OPERATOR_ROLES[hook.name] == (
        "config/core/200-roles/clusterrole.yaml", "knative-serving-core")
    knative, plain = cp_mod.ControlPlane(operators=(ctl.name,)), cp_mod.ControlPlane()
    try:
        assert [type(p).__name__ for p in knative.operators.values()] == ["KnativeProcess"] * 2
        assert "--enable-aggregator-routing=true" in knative.extra_apiserver_flags
        assert "--enable-aggregator-routing=true" not in plain.extra_apiserver_flags
    finally:
        knative.close()
        plain.close()
    with pytest.raises(cp_mod.ControlPlaneError, match="both listen on :8080"):
        cp_mod.ControlPlane(operators=("mpi-operator", ctl.name))


def test_an_operator_brings_the_operators_it_needs_first() -> None:
    assert cp_mod._with_needs(["trainer-controller-manager", "lws"]) == ["jobset", "trainer-controller-manager", "lws"]
    with pytest.raises(cp_mod.ControlPlaneError, match="no operator"):
        cp_mod._with_needs(["volcano"])


def test_json_patch_adds_and_replaces_as_the_operators_kustomizations_do() -> None:
    doc = {"metadata": {"name": "a"}, "webhooks": [{"name": "x"}, {"name": "y"}]}
    out = cp_mod.json_patch(doc, [
        {"op": "replace", "path": "/webhooks/1", "value": {"name": "y", "objectSelector": {}}},
        {"op": "add", "path": "/webhooks/0/objectSelector", "value": {"matchLabels": {"k": "v"}}},
        {"op": "replace", "path": "/metadata/name", "value": "b"},
    ])
    assert out == {"metadata": {"name": "b"}, "webhooks": [
        {"name": "x", "objectSelector": {"matchLabels": {"k": "v"}}}, {"name": "y", "objectSelector": {}}]}
    assert doc["metadata"]["name"] == "a"  # not changed in place
    with pytest.raises(cp_mod.ControlPlaneError, match="unsupported"):
        cp_mod.json_patch(doc, [{"op": "remove", "path": "/metadata"}])
    with pytest.raises(cp_mod.ControlPlaneError, match="not there"):
        cp_mod.json_patch(doc, [{"op": "replace", "path": "/metadata/labels", "value": {}}])


def test_argo_builds_apart_with_its_crds_configmap_and_cluster_role() -> None:
    """Argo Workflows' workflow-controller: a module of its own (its Kubernetes v0.33 modules
    cannot join the shared build), the minimal CRDs of every kind whose informer it waits for
    (not argo-server's WorkflowEventBinding), its install's ConfigMap, the cluster-wide install's
    ClusterRole; run by `ArgoProcess` without leader election and without metrics servers."""
    op, recipe = cp_mod.ARGO_CONTROLLER, cp_mod.ARGO_RECIPE
    assert (op.module, op.version) == ("github.com/argoproj/argo-workflows/v4", "v4.0.5")
    assert recipe.outputs[0] == op.name and op.name not in cp_mod.KUBERNETES.outputs
    assert cp_mod.SEPARATE_OPERATOR_RECIPES[op.name] is recipe and cp_mod.operator_bin(op).parent == recipe.dir
    plurals = {Path(f).name.removeprefix("argoproj.io_").removesuffix(".yaml") for f in op.crds}
    assert plurals == {"workflows", "workflowtemplates", "clusterworkflowtemplates", "cronworkflows",
                       "workflowtasksets", "workflowtaskresults", "workflowartifactgctasks"}
    assert all("/crds/minimal/" in f for f in op.crds)
    assert set(op.files()) | {op.cached(cp_mod.ARGO_CONFIGMAP)} == set(recipe.outputs[1:])
    assert cp_mod.OPERATOR_ROLES[op.name][1] == "argo-cluster-role" and not op.webhooks
    argo = cp_mod.ControlPlane(operators=(op.name,))
    try:
        (proc,) = argo.operators.values()
        assert type(proc).__name__ == "ArgoProcess"
        assert f"--namespace={cp_mod.ARGO_NAMESPACE}" in proc.command()
        assert not any(a.startswith("--namespaced") for a in proc.command())  # every namespace
        assert proc.CONFIG == {"metricsConfig": "enabled: false\n", "telemetryConfig": "enabled: false\n"}
    finally:
        argo.close()
