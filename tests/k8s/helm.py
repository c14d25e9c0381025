"""The Helm chart in deploy/helm/kai-es as tests use it: `helm` (built once by
tools/k8s/controlplane.py; a failed build FAILS the test), rendering into objects, the kai-es
CLI's own parser for each container's args, and server-side apply to a real apiserver."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from kai_es.cli import main as kai_es_cli
from tests.k8s.conftest import ROOT, cp_mod

CHART = ROOT / "deploy" / "helm" / "kai-es"
FULL_VALUES = CHART / "ci" / "full-values.yaml"
SHARD_VALUES = CHART / "ci" / "shards-values.yaml"


def helm_binary() -> Path:
    """helm v3.22.0 from the cache, built from the Go module proxy if missing."""
    try:
        return Path(cp_mod.fetch_helm())
    except cp_mod.FetchError as e:
        pytest.fail(f"could not build helm {cp_mod.HELM_VERSION}: {e}", pytrace=False)


def helm(*args: str, home: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm with its config, cache and data kept under `home` (never the user's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_") and k != "KUBECONFIG"}
    env.update(HELM_CONFIG_HOME=str(home / "config"), HELM_CACHE_HOME=str(home / "cache"),
               HELM_DATA_HOME=str(home / "data"))
    run = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, env=env,
                         timeout=120)
    if check and run.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {run.returncode}:\n{run.stderr}{run.stdout}")
    return run


def render(home: Path, *, release: str = "kai-es", namespace: str = "kai-es",
           values: Sequence[Path] = (), sets: Mapping[str, str] | None = None,
           include_crds: bool = False) -> list[dict[str, Any]]:
    """`helm template` of the chart, as a list of objects in helm's install order."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    for v in values:
        args += ["-f", str(v)]
    for key, value in (sets or {}).items():
        args += ["--set", f"{key}={value}"]
    if include_crds:
        args.append("--include-crds")
    out = helm(*args, home=home).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objs: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(o) for o in objs if o["kind"] == kind]


def container(deploy: Mapping[str, Any]) -> dict[str, Any]:
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return dict(c)


def parse_cli_args(argv: Sequence[str]) -> click.Context:
    """Parse `kai-es ARGV` with the CLI's own click commands, options' types and checks
    included, without running the command. An unknown flag or a bad value raises
    click.UsageError / click.BadParameter."""
    group = kai_es_cli
    assert isinstance(group, click.Group)
    name, *rest = argv
    cmd = group.get_command(click.Context(group), name)
    if cmd is None:
        raise click.UsageError(f"kai-es has no command {name!r}")
    return cmd.make_context(f"kai-es {name}", list(rest))


# -- server-side apply --------------------------------------------------------------------------

#: kind -> (API path prefix, plural, namespaced)
_PATHS = {
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "Service": ("/api/v1", "services", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
}


def object_path(obj: Mapping[str, Any]) -> str:
    prefix, plural, namespaced = _PATHS[obj["kind"]]
    meta = obj["metadata"]
    ns = f"/namespaces/{meta['namespace']}" if namespaced else ""
    return f"{prefix}{ns}/{plural}/{meta['name']}"


def server_side_apply(cp: Any, obj: Mapping[str, Any], manager: str = "helm-chart-test") -> Any:
    """PATCH with application/apply-patch+yaml (what `kubectl apply --server-side` sends): the
    apiserver validates and creates or updates `obj`; returns the stored object."""
    return cp.call("PATCH", f"{object_path(obj)}?fieldManager={manager}&force=true", obj,
                   content_type="application/apply-patch+yaml", ok=(200, 201))


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())
