"""Every owner kind the podgrouper knows: a manifest as its users write it, expanded by the
scenario loader's controllers and grouped by the one podgrouper, gives KAI's PodGroups (name,
minimum, sub-groups, queue, priority class), and the informer path — the same pods through the
grouping source, owners read as the apiserver returns them — gives the same groups."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kai_es.adapters.kubernetes.grouping import PodGroupingSource
from kai_es.controllers import CONTROLLERS
from kai_es.ingest.groupers import CHAIN_ONLY, TABLE
from kai_es.ingest.translate import PODGROUP_ANNOTATION, SUBGROUP_LABEL
from kai_es.ports import ObjectChange, Relist
from kai_es.scenario import Scenario, load_scenario, load_scenario_text
from tests.workloads import CASES, Case

ROOT = Path(__file__).resolve().parents[1]
_UID = re.compile(r"\{([A-Za-z]+)/([a-z0-9.-]+)\}")


def load(case: Case) -> Scenario:
    return load_scenario_text(case.text(), "workload.yaml")


def uids(sc: Scenario) -> dict[str, str]:
    out = {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["uid"] for o in sc.owners}
    out |= {f"{o.kind}/{o.obj['metadata']['name']}": o.obj["metadata"]["uid"] for o in sc.objects}
    return out


def resolve(name: str, sc: Scenario) -> str:
    known = uids(sc)
    return _UID.sub(lambda m: known[f"{m.group(1)}/{m.group(2)}"], name)


def loaded(sc: Scenario) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    groups = {o.obj["metadata"]["name"]: o.obj for o in sc.objects if o.kind == "PodGroup"}
    pods = {o.obj["metadata"]["name"]: o.obj for o in sc.objects if o.kind == "Pod"}
    return groups, pods


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.kind)
def test_the_loader_groups_each_kind_as_kai(case: Case) -> None:
    sc = load(case)
    groups, pods = loaded(sc)
    want = {resolve(g.name, sc): g for g in case.groups}
    assert set(groups) == set(want), sorted(groups)
    for name, g in want.items():
        assert groups[name]["spec"] == g.spec, name
        for pod, subgroup in g.pods.items():
            assert pods[pod]["metadata"]["annotations"][PODGROUP_ANNOTATION] == name, pod
            assert pods[pod]["metadata"]["labels"].get(SUBGROUP_LABEL, "") == subgroup, pod


class Scripted:
    def __init__(self, initial: list[ObjectChange]) -> None:
        self.initial = initial

    async def list_objects(self) -> list[ObjectChange]:
        return list(self.initial)

    async def changes(self) -> AsyncIterator[Sequence[ObjectChange | Relist]]:
        return
        yield []  # pragma: no cover


def as_created(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as its controller created it (before the podgrouper annotated it)."""
    pod = copy.deepcopy(pod)
    pod["metadata"].get("annotations", {}).pop(PODGROUP_ANNOTATION, None)
    pod["metadata"].get("labels", {}).pop(SUBGROUP_LABEL, None)
    return pod


async def informer_groups(sc: Scenario) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The pods of `sc` through the informer's grouping source, every owner read from what the
    controllers made, as the apiserver returns it."""
    raw = [as_created(o.obj) for o in sc.objects if o.kind == "Pod"]
    stored = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in sc.owners}
    stored |= {("Pod", p["metadata"]["namespace"], p["metadata"]["name"]): p for p in raw}
    reads: list[tuple[str, str]] = []

    async def reader(api_version: str, kind: str, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        reads.append((api_version, kind))
        obj = stored.get((kind, namespace, name))
        if obj is None or obj.get("apiVersion") != api_version:
            return 404, {"reason": "NotFound", "details": {"name": name}}
        return 200, copy.deepcopy(obj)

    source = PodGroupingSource(Scripted([ObjectChange("Pod", "ADDED", p) for p in raw]), None, reader=reader,
                               rules=sc.config.grouping)
    groups: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, Any]] = {}
    for change in await source.list_objects():
        obj = dict(change.obj)
        (groups if change.kind == "PodGroup" else pods)[obj["metadata"]["name"]] = obj
    assert all((version.rpartition("/")[0], kind) in TABLE or (version.rpartition("/")[0], kind) in CHAIN_ONLY
               or kind in ("TrainingRun", "ServingGroup") for version, kind in reads)
    return groups, pods


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.kind)
async def test_the_informer_path_groups_as_the_loader(case: Case) -> None:
    sc = load(case)
    want_groups, want_pods = loaded(sc)
    got_groups, got_pods = await informer_groups(sc)
    assert set(got_groups) == set(want_groups)
    for name, group in got_groups.items():
        want = copy.deepcopy(want_groups[name])
        del want["metadata"]["uid"]  # (the loader's own, for the log)
        assert group == want, name
    for name, pod in got_pods.items():
        assert pod["metadata"].get("annotations", {}).get(PODGROUP_ANNOTATION) == \
            want_pods[name]["metadata"]["annotations"].get(PODGROUP_ANNOTATION), name
        assert pod["metadata"].get("labels", {}).get(SUBGROUP_LABEL) == \
            want_pods[name]["metadata"]["labels"].get(SUBGROUP_LABEL), name


def test_every_kind_with_a_rule_is_expanded_or_listed_as_cluster_only() -> None:
    cluster_only = {("", "Pod"), ("machinelearning.seldon.io", "SeldonDeployment"),
                    ("kubevirt.io", "VirtualMachineInstance"), ("workspace.devfile.io", "DevWorkspace"),
                    ("kubeflow.org", "ScheduledWorkflow"), ("tekton.dev", "PipelineRun"), ("tekton.dev", "TaskRun")}
    assert set(CONTROLLERS) <= set(TABLE)
    assert set(TABLE) - set(CONTROLLERS) == cluster_only
    covered = {c.kind.split(" ")[0] for c in CASES}
    assert {kind for _, kind in CONTROLLERS} - covered == set(), "a controller without a case"


EXAMPLES = sorted((ROOT / "examples").glob("workloads-*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_each_family_example_simulates_with_every_pod_run(path: Path, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "kai_es", "simulate", str(path), "--log", str(tmp_path / "e.jsonl"),
                          "--report", str(tmp_path / "r")], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert " 0 pending at end" in run.stdout, run.stdout
    sc = load_scenario(path)
    assert any(o.kind == "PodGroup" and o.obj["spec"].get("subGroups") for o in sc.objects) or \
        path.stem in ("workloads-core", "workloads-nocode", "workloads-k8s-workload-api"), \
        "a family example shows its sub-groups (the Workload API has none)"


def test_there_is_an_example_per_family() -> None:
    assert {p.stem for p in EXAMPLES} == {"workloads-core", "workloads-kubeflow", "workloads-jobset-lws",
                                          "workloads-ray-serving", "workloads-nocode", "workloads-k8s-workload-api"}
