"""The scheduler name kai-es answers to (config `schedulerName`, KAI's `--scheduler-name`): only
its pods are pending for kai-es, grouped and translated as kai-es's; the name is in the logged
config, so replay knows it; a config that changes it re-indexes the pending pods; a bad name is
refused with the field's path; the default leaves every older config (and digest) unchanged.
The scenario tests/scenarios/scheduler-name-beside-kai.yaml (run by test_cycle_scenarios on both
packers) shows kai-es beside a KAI that keeps `kai-scheduler`."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.ingest import podgrouper as pg
from kai_es.ingest import translate as tr
from kai_es.oneshot import one_cycle
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.config import ConfigError, config_event, config_to_dict, parse_config
from kai_es.scheduling.packing import load_packer
from kai_es.state import ClusterState, invariants
from kai_es.state.reducer import apply

SEC = 10**9


@pytest.mark.parametrize("name", ["", "Kai-ES", "kai_es", "-kai", "kai-", "a" * 254, "kai es", "kai..es"])
def test_a_name_no_pod_can_carry_is_refused_with_its_field(name: str) -> None:
    with pytest.raises(ConfigError, match=r"\$\.schedulerName"):
        parse_config({"schedulerName": name})


@pytest.mark.parametrize("name", [7, None, ["kai-es"], {"a": 1}])
def test_a_name_of_the_wrong_type_is_refused(name: Any) -> None:
    with pytest.raises(ConfigError, match="schedulerName"):
        parse_config({"schedulerName": name})


def test_the_default_name_is_not_written_so_older_configs_keep_their_digest() -> None:
    assert "schedulerName" not in config_to_dict(parse_config({}))
    assert config_to_dict(parse_config({"schedulerName": "kai-es.example.com"}))["schedulerName"] == "kai-es.example.com"


def _pod(name: str, scheduler: str, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": scheduler,
                            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "namespace": "d", "uid": f"u-{name}", "labels": {"kai.scheduler/queue": "q"}}}


def test_only_pods_of_the_name_are_grouped_by_the_podgrouper() -> None:
    assert pg.needs_group(_pod("a", "kai-es"), ours="kai-es")
    assert not pg.needs_group(_pod("a", "kai-scheduler"), ours="kai-es")
    assert pg.group_pod(_pod("a", "kai-scheduler"), [], ours="kai-es") is None
    assert pg.group_pod(_pod("a", "kai-es"), [], ours="kai-es") is not None


def test_a_gpu_share_another_scheduler_bound_counts_whole_whatever_kai_es_is_called() -> None:
    share = _pod("s", "kai-scheduler", node="n")
    share["spec"]["containers"][0]["resources"] = {}
    share["metadata"]["annotations"] = {"gpu-fraction": "0.5"}
    assert tr.pod(share).gpu.fraction_milli == 500  # kai-es is kai-scheduler: its own share
    assert tr.pod(share, ours="kai-es").gpu.whole == 1  # KAI's: which device is unknown


class _Fold:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.position = 0

    def feed(self, env: Any) -> None:
        apply(self.state, Record(self.position, env))
        self.position += 1
        assert not invariants.check(self.state), invariants.check(self.state)

    def config(self, raw: dict[str, Any]) -> None:
        self.feed(config_event(parse_config(raw), event_id=str(uuid.uuid4()), logicaltime=SEC))

    def observe(self, payload: p.Payload) -> None:
        self.feed(make_envelope(payload, event_id=str(uuid.uuid4()), source="t", subject="x", logicaltime=SEC))

    def pending(self) -> list[str]:
        return sorted(k for k, pod in self.state.pods.items() if pod.pending_key is not None)


def test_a_config_with_another_name_re_indexes_the_pending_pods() -> None:
    f = _Fold()
    f.config({})
    f.observe(p.QueueObserved(name="q"))
    for name, scheduler in (("mine", "kai-es"), ("kais", "kai-scheduler"), ("other", "default-scheduler")):
        f.observe(tr.pod(_pod(name, scheduler)))
    assert f.pending() == ["d/kais"]
    f.config({"schedulerName": "kai-es"})
    assert f.pending() == ["d/mine"]
    assert sorted(f.state.pending_jobs) == ["q"] and len(f.state.pending_jobs["q"]) == 1
    f.config({})
    assert f.pending() == ["d/kais"]


SCENARIO = """
apiVersion: kai-es.io/v1alpha1
kind: Scenario
metadata: {name: s}
spec:
  scheduler: {schedulerName: NAME}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: q}
---
apiVersion: v1
kind: Pod
metadata: {name: a, labels: {kai.scheduler/queue: q}}
spec: {schedulerName: kai-es, containers: [{name: c, resources: {requests: {nvidia.com/gpu: "1"}}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, labels: {kai.scheduler/queue: q}}
spec: {schedulerName: kai-scheduler, containers: [{name: c, resources: {requests: {nvidia.com/gpu: "1"}}}]}
"""


@pytest.mark.parametrize(("name", "bound", "waiting"), [("kai-es", "a", "b"), ("kai-scheduler", "b", "a")])
def test_a_simulation_places_the_pods_of_the_configured_name_only(name: str, bound: str, waiting: str) -> None:
    outcome = one_cycle(load_scenario_text(SCENARIO.replace("NAME", name), "s.yaml"), load_packer("reference"))
    pods = outcome["pods"]
    assert pods[f"default/{bound}"]["status"] == "Binding"
    assert pods[f"default/{waiting}"]["status"] == "Pending"
    assert not [d for d in outcome["decisions"] if d["subject"] == f"pod/default/{waiting}"]
