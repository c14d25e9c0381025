"""Topology ingest (the Topology CRD, PodGroup and sub-group `topologyConstraint`, the podgrouper's
annotations) and the policy switch: kai-es/v5 honours constraints, kai-es/v4 decides as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kai_es.events import payloads as p
from kai_es.ingest import podgrouper as pg
from kai_es.ingest import translate as tr
from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.packing import load_packer
from tests.builders import MakePod

SCENARIOS = Path(__file__).parent / "scenarios"


def _podgroup(constraint: Any, subgroups: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": 2, "queue": "q", "topologyConstraint": constraint}
    if subgroups is not None:
        spec["subGroups"] = subgroups
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": "default"}, "spec": spec}


def _topology(levels: Any) -> dict[str, Any]:
    return {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": "t"},
            "spec": {"levels": levels}}


def test_constraints_of_the_podgroup_and_its_subgroups_are_observed() -> None:
    rack = {"topology": "t", "requiredTopologyLevel": "rack"}
    observed = tr.translate(_podgroup({"topology": "t", "requiredTopologyLevel": "zone",
                                       "preferredTopologyLevel": "rack"},
                                      [{"name": "a", "minMember": 1, "topologyConstraint": rack},
                                       {"name": "b", "minMember": 1}]))
    assert isinstance(observed, p.PodGroupObserved)
    assert (observed.topology, observed.required_topology_level, observed.preferred_topology_level) == \
        ("t", "zone", "rack")
    a, b = observed.subgroups
    assert (a.topology, a.required_topology_level, a.preferred_topology_level) == ("t", "rack", "")
    assert (b.topology, b.required_topology_level) == ("", "")


@pytest.mark.parametrize(("obj", "path", "words"), [
    (_podgroup({"requiredTopologyLevel": "rack"}), "spec.topologyConstraint.topology", "name the Topology"),
    (_podgroup({"topology": "t", "preferredTopologyLevel": 7}),
     "spec.topologyConstraint.preferredTopologyLevel", "must be a string"),
    (_podgroup("rack"), "spec.topologyConstraint", "must be a map"),
    (_podgroup(None, [{"name": "a", "minMember": 1, "topologyConstraint": {"preferredTopologyLevel": "rack"}}]),
     "spec.subGroups[0].topologyConstraint.topology", "name the Topology"),
    (_topology([]), "spec.levels", "at least one level"),
    (_topology([{"nodeLabel": "zone"}, {"nodeLabel": "zone"}]), "spec.levels[1].nodeLabel", "already level 0"),
    (_topology([{"name": "zone"}]), "spec.levels[0].nodeLabel", "is required"),
])
def test_invalid_topology_input_is_rejected_with_the_field_and_why(obj: dict[str, Any], path: str,
                                                                   words: str) -> None:
    with pytest.raises(tr.IngestError) as caught:
        tr.translate(obj)
    assert caught.value.path == path
    assert words in caught.value.message


def test_the_podgrouper_fills_the_constraint_from_the_top_owners_annotations() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "train", "uid": "j1", "namespace": "ns", "annotations": {
               "kai.scheduler/topology": "t", "kai.scheduler/topology-required-placement": "zone",
               "kai.scheduler/topology-preferred-placement": "rack"}}, "spec": {}}
    pod = MakePod("train-0", queue="q").gpu(1).obj()
    pod["metadata"].update(uid="u1", namespace="ns")
    grouped = pg.group_pod(pod, [job])
    assert grouped is not None
    observed = tr.translate(grouped.podgroup)
    assert isinstance(observed, p.PodGroupObserved)
    assert (observed.topology, observed.required_topology_level, observed.preferred_topology_level) == \
        ("t", "zone", "rack")


def _outcome(name: str, policy: str) -> dict[str, Any]:
    text = (SCENARIOS / name).read_text().replace("policyVersion: kai-es/v5", f"policyVersion: {policy}")
    return one_cycle(load_scenario_text(text), load_packer("native"))


def test_kai_es_v4_still_ignores_the_constraint() -> None:
    """The rack-bound gang of topology-required-rack.yaml: v5 keeps it in rack r1, v4 packs it
    onto r2's small nodes and one node of r1, as before topology support."""
    def nodes(policy: str) -> list[str]:
        pods = _outcome("topology-required-rack.yaml", policy)["pods"]
        return [pods[f"default/train-{i}"]["node"] for i in range(3)]

    assert nodes("kai-es/v5") == ["a-r1-1", "a-r1-1", "a-r1-2"]
    assert nodes("kai-es/v4") == ["a-r2-1", "a-r2-2", "a-r1-1"]
    unplaced = _outcome("topology-required-unsatisfiable.yaml", "kai-es/v4")["pods"]
    assert unplaced["default/norow-0"]["status"] == "Binding"  # v4 does not read the Topology at all


def test_an_uninstalled_topology_crd_lists_as_empty_and_other_kinds_still_fail_loudly() -> None:
    """A cluster without KAI's Topology CRD answers 404: the informer gets ready with no
    Topology (and keeps watching for the CRD); a 404 of a required kind is retried instead."""
    import anyio

    from kai_es.adapters.kubernetes.source import OPTIONAL_KINDS, ApiCallError, KubernetesSource

    class Absent(KubernetesSource):
        calls = 0

        async def list_kind(self, kind: str) -> tuple[list[dict[str, Any]], str]:
            Absent.calls += 1
            raise ApiCallError(404, f"LIST {kind}: the server could not find the requested resource")

    assert "Topology" in OPTIONAL_KINDS
    source = Absent(None, kinds=("Topology",))  # type: ignore[arg-type]
    assert anyio.run(source.list_objects) == []
    assert source.resource_versions() == {"Topology": ""}

    queues = Absent(None, kinds=("Queue",), backoff_cap_s=0.01)  # type: ignore[arg-type]

    async def bounded() -> None:
        with anyio.move_on_after(0.3):
            await queues.list_objects()
            raise AssertionError("a 404 LIST of a required kind must not count as empty")

    before = Absent.calls
    anyio.run(bounded)
    assert Absent.calls - before > 1  # retried
