"""Scheduling shards: the informer routes each observation to the log of the shard that owns it
(`kai_es.ingest.shards`), written as a KAI user labels things: nodes, queues and workloads with
`kai.scheduler/node-pool`, the default shard owning the unlabelled ones."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_es.adapters.clock import SimClock
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.ingest.shards import Router, ShardError, ShardMap, shard_log_url, shard_writer
from kai_es.ports import ObjectChange, Relist
from kai_es.services.informer import InformerService
from kai_es.state import ClusterState, fold
from tests.builders import MakeNode, MakePod, ScriptedSource, podgroup, queue

POOL = "kai.scheduler/node-pool"
SHARDS = ShardMap.parse(["default=", "gpu=gpu-nodes"])


class Journal:
    """Every append to any shard's log, in the order they happened."""

    def __init__(self) -> None:
        self.appends: list[tuple[str, list[p.Payload]]] = []


class JournalLog(MemoryEventLog):
    def __init__(self, name: str, journal: Journal) -> None:
        super().__init__()
        self.name, self.journal = name, journal

    async def append(self, events: Sequence[Envelope]) -> list[int]:
        self.journal.appends.append((self.name, [e.data for e in events]))
        return await super().append(events)




def node(name: str, pool: str | None = None) -> dict[str, Any]:
    made = MakeNode(name).gpus(8)
    return (made.label(POOL, pool) if pool is not None else made).obj()


def pod(name: str, pool: str | None = None, *, on: str | None = None, group: str | None = None,
        scheduler: str | None = None) -> dict[str, Any]:
    made = MakePod(name).gpu(1)
    if pool is not None:
        made = made.label(POOL, pool)
    if on is not None:
        made = made.running_on(on)
    if group is not None:
        made = made.group(group)
    obj = made.obj()
    obj["metadata"]["uid"] = f"uid-{name}"
    if scheduler is not None:
        obj["spec"]["schedulerName"] = scheduler
    return obj


def labelled(obj: dict[str, Any], pool: str | None) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    labels = out["metadata"].setdefault("labels", {})
    labels.pop(POOL, None)
    if pool is not None:
        labels[POOL] = pool
    return out


def add(kind: str, obj: dict[str, Any]) -> ObjectChange:
    return ObjectChange(kind, "ADDED", obj)


def mod(kind: str, obj: dict[str, Any]) -> ObjectChange:
    return ObjectChange(kind, "MODIFIED", obj)


async def run(initial: list[ObjectChange], batches: list[list[ObjectChange | Relist]] | None = None,
              shards: ShardMap = SHARDS) -> tuple[dict[str, ClusterState], dict[str, list[p.Payload]], Journal]:
    journal = Journal()
    logs = {name: JournalLog(name, journal) for name in shards.names}
    informer = InformerService(logs, ScriptedSource(initial, batches or []), SimClock(1_000), SeededIds("t"),
                               shards=shards)
    await informer.resync()
    await informer.follow()
    states, payloads = {}, {}
    for name, log in logs.items():
        records = [r async for r in log.read()]
        states[name] = fold(records)
        payloads[name] = [r.envelope.data for r in records]
    return states, payloads, journal


# -- declarations ---------------------------------------------------------------------------------

def test_a_shard_is_declared_as_name_equals_node_pool_value() -> None:
    shards = ShardMap.parse(["default=", "gpu=gpu-nodes"])
    assert shards.names == ("default", "gpu") and shards.home.name == "default"
    assert shards.of_labels({POOL: "gpu-nodes"}).name == "gpu"  # type: ignore[union-attr]
    assert shards.of_labels({}).name == "default"  # type: ignore[union-attr]
    assert shards.of_labels({POOL: "cpu"}) is None
    assert ShardMap.parse(["a=x", "b=y"]).home.name == "a"  # no unlabelled shard: the first


@pytest.mark.parametrize(("specs", "message"), [
    ([], "no shard"),
    (["gpu"], "expected NAME=VALUE"),
    (["GPU=x"], "DNS label"),
    (["a" * 64 + "=x"], "DNS label"),
    (["-a=x"], "DNS label"),
    (["a.b=x"], "DNS label"),
    (["a=x", "a=y"], "two shards have the name 'a'"),
    (["a=x", "b=x"], "two shards have the value 'x'"),
    (["a=-x"], "not a label value"),
    (["a=" + "x" * 64], "not a label value"),
    (["a=x y"], "not a label value"),
])
def test_a_wrong_declaration_is_refused_naming_it(specs: list[str], message: str) -> None:
    with pytest.raises(ShardError, match=message):
        ShardMap.parse(specs)


def test_each_shard_has_its_own_log_and_writer_ids() -> None:
    base = "kafka://b1:9092,b2:9092/kai-es.events?transactional_id=kai-es-scheduler.kai-es.events&create=false"
    assert shard_log_url(base, "default") == base
    assert shard_log_url(base, "gpu") == ("kafka://b1:9092,b2:9092/kai-es.events.gpu?"
                                          "transactional_id=kai-es-scheduler.kai-es.events.gpu&create=false")
    assert shard_log_url("kafka://b:9092", "gpu") == "kafka://b:9092/kai-es.events.gpu"
    assert shard_log_url("/var/lib/kai-es/events.jsonl", "gpu") == "/var/lib/kai-es/events.gpu.jsonl"
    assert shard_log_url("/var/lib/kai-es/events", "gpu") == "/var/lib/kai-es/events.gpu"
    assert shard_log_url("events.jsonl", "gpu") == "events.gpu.jsonl"
    assert shard_log_url("/a.b/events", "gpu") == "/a.b/events.gpu"
    with pytest.raises(ShardError, match="memory"):
        shard_log_url("memory:", "gpu")
    with pytest.raises(ShardError, match="DNS label"):
        shard_log_url("/x/events.jsonl", "../etc")
    assert shard_writer("kai-es-scheduler", None) == shard_writer("kai-es-scheduler", "default") == "kai-es-scheduler"
    assert shard_writer("kai-es-scheduler", "gpu") == "kai-es-scheduler.gpu"


# -- routing --------------------------------------------------------------------------------------

async def test_objects_go_to_the_shard_of_their_node_pool_label() -> None:
    initial = [
        add("Queue", queue("team-a")), add("Queue", labelled(queue("team-g"), "gpu-nodes")),
        add("Node", node("n-a")), add("Node", node("n-g", "gpu-nodes")), add("Node", node("n-cpu", "cpu")),
        add("Pod", pod("pending-a")), add("Pod", pod("pending-g", "gpu-nodes")),
        add("Pod", pod("system-g", on="n-g", scheduler="default-scheduler")),  # occupies n-g
        add("Pod", pod("system-cpu", on="n-cpu", scheduler="default-scheduler")),  # no shard: nowhere
        add("Pod", pod("other-pending", "gpu-nodes", scheduler="default-scheduler")),  # not ours: nowhere
        add("PriorityClass", {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                              "metadata": {"name": "train"}, "value": 50}),
    ]
    states, payloads, _ = await run(initial)
    a, g = states["default"], states["gpu"]
    assert sorted(a.node_names) == ["n-a"] and sorted(g.node_names) == ["n-g"]
    assert sorted(a.queues) == ["team-a"] and sorted(g.queues) == ["team-g"]
    assert sorted(a.pods) == ["default/pending-a"]
    assert sorted(g.pods) == ["default/pending-g", "default/system-g"]
    assert sorted(a.priority_classes) == sorted(g.priority_classes) == ["train"]
    # every shard's log brackets every kind, as an unsharded relist does
    for name in SHARDS.names:
        started = [d.kind for d in payloads[name] if isinstance(d, p.ResyncStarted)]
        assert started == ["PriorityClass", "Queue", "Topology", "Namespace", "ConfigMap", "PersistentVolume",
                           "PersistentVolumeClaim", "Node", "PodGroup", "Pod"]


async def test_a_pod_asking_for_a_pool_no_shard_serves_is_rejected_naming_the_pool() -> None:
    states, payloads, _ = await run([add("Pod", pod("lost", "cpu"))])
    assert not states["default"].pods and not states["gpu"].pods
    rejected = [d for d in payloads["default"] if isinstance(d, p.ObjectRejected)]
    assert [(r.kind, r.name, r.path) for r in rejected] == [("Pod", "lost", f"metadata.labels[{POOL}]")]
    assert "'cpu'" in rejected[0].reason and "served by no shard" in rejected[0].reason
    assert not [d for d in payloads["gpu"] if isinstance(d, p.ObjectRejected)]


async def test_a_pod_of_a_podgroup_no_shard_serves_is_rejected_naming_the_groups_pool() -> None:
    initial = [add("PodGroup", labelled(podgroup("pg", 1), "cpu")), add("Pod", pod("w", "gpu-nodes", group="pg"))]
    states, payloads, _ = await run(initial)
    assert not states["gpu"].pods and not states["default"].pods
    [rejected] = [d for d in payloads["default"] if isinstance(d, p.ObjectRejected)]
    assert "PodGroup default/pg is in node pool 'cpu'" in rejected.reason, rejected.reason


async def test_a_pod_follows_its_podgroups_label_not_its_own() -> None:
    """KAI's shard reads the PodGroup's label (the top owner's, else the pod's)."""
    group = labelled(podgroup("pg", 2), "gpu-nodes")
    initial = [add("PodGroup", group), add("Pod", pod("w0", group="pg")), add("Pod", pod("w1", "other", group="pg"))]
    states, _, _ = await run(initial)
    assert sorted(states["gpu"].pods) == ["default/w0", "default/w1"] and not states["default"].pods
    assert sorted(k for k, j in states["gpu"].jobs.items() if j.spec is not None) == ["default/pg"]


async def test_a_relabelled_node_leaves_its_old_shard_before_it_joins_the_new_one_with_its_pods() -> None:
    initial = [add("Node", node("n1", "gpu-nodes")), add("Pod", pod("running", "gpu-nodes", on="n1"))]
    states, _, journal = await run(initial, [[mod("Node", node("n1"))]])
    assert sorted(states["default"].node_names) == ["n1"] and sorted(states["default"].pods) == ["default/running"]
    assert not states["gpu"].node_names and not states["gpu"].pods
    moves = journal.appends[-2:]
    assert moves[0][0] == "gpu" and {type(d).__name__ for d in moves[0][1]} == {"NodeRemoved", "PodRemoved"}
    assert moves[1][0] == "default" and [type(d).__name__ for d in moves[1][1]] == ["NodeObserved", "PodObserved"]


async def test_a_relabelled_podgroup_takes_its_pending_pods_not_its_running_ones() -> None:
    group = podgroup("pg", 1)
    initial = [add("Node", node("n-a")), add("PodGroup", group), add("Pod", pod("pending", group="pg")),
               add("Pod", pod("running", group="pg", on="n-a"))]
    states, _, _ = await run(initial, [[mod("PodGroup", labelled(group, "gpu-nodes"))]])
    assert sorted(states["gpu"].pods) == ["default/pending"]
    assert sorted(states["default"].pods) == ["default/running"]


async def test_a_deletion_goes_only_where_the_object_is() -> None:
    initial = [add("Node", node("n-g", "gpu-nodes")), add("Pod", pod("p", "gpu-nodes"))]
    gone = ObjectChange("Pod", "DELETED", pod("p", "gpu-nodes"))
    _, payloads, journal = await run(initial, [[gone]])
    assert journal.appends[-1] == ("gpu", [p.PodRemoved(namespace="default", name="p", uid="uid-p")])
    assert not [d for d in payloads["default"] if isinstance(d, p.PodRemoved)]


async def test_an_unchanged_observation_is_dropped_and_a_queue_relabel_moves_the_queue() -> None:
    q = queue("team")
    initial = [add("Queue", q)]
    states, _, journal = await run(initial, [[mod("Queue", q)], [mod("Queue", labelled(q, "gpu-nodes"))]])
    assert len(journal.appends) == 2 + 2  # the relists of both shards, then the move's two appends
    assert sorted(states["gpu"].queues) == ["team"] and not states["default"].queues


async def test_a_node_relisted_into_another_shard_leaves_the_old_one_by_its_relist() -> None:
    initial = [add("Node", node("n1", "gpu-nodes")), add("Pod", pod("running", "gpu-nodes", on="n1"))]
    states, _, _ = await run(initial, [[Relist("Node", (node("n1"),))]])
    assert sorted(states["default"].node_names) == ["n1"] and not states["gpu"].node_names
    assert sorted(states["default"].pods) == ["default/running"] and not states["gpu"].pods


async def test_an_untranslatable_object_is_rejected_in_the_shard_where_it_is() -> None:
    bad = pod("p", "gpu-nodes")
    bad["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "-1"
    _, payloads, _ = await run([add("Pod", pod("p", "gpu-nodes"))], [[mod("Pod", bad)]])
    assert [d.name for d in payloads["gpu"] if isinstance(d, p.ObjectRejected)] == ["p"]
    assert not [d for d in payloads["default"] if isinstance(d, p.ObjectRejected)]


# -- the property: shards partition the cluster, whatever happens ----------------------------------

POOLS = st.sampled_from([None, "gpu-nodes", "cpu", "x" * 63])
NODES = ("n0", "n1", "n2")
PODS = ("p0", "p1", "p2", "p3")
GROUPS = ("g0", "g1")


@st.composite
def histories(draw: st.DrawFn) -> list[ObjectChange | Relist]:
    out: list[ObjectChange | Relist] = []
    for _ in range(draw(st.integers(1, 25))):
        what = draw(st.sampled_from(["node", "pod", "group", "delete-pod", "delete-node", "relist-nodes"]))
        if what == "node":
            out.append(mod("Node", node(draw(st.sampled_from(NODES)), draw(POOLS))))
        elif what == "group":
            out.append(mod("PodGroup", labelled(podgroup(draw(st.sampled_from(GROUPS)), 1), draw(POOLS))))
        elif what == "pod":
            on = draw(st.sampled_from([None, *NODES]))
            out.append(mod("Pod", pod(draw(st.sampled_from(PODS)), draw(POOLS), on=on,
                                      group=draw(st.sampled_from([None, *GROUPS])),
                                      scheduler=draw(st.sampled_from([None, "default-scheduler"])))))
        elif what == "delete-pod":
            out.append(ObjectChange("Pod", "DELETED", pod(draw(st.sampled_from(PODS)))))
        elif what == "delete-node":
            out.append(ObjectChange("Node", "DELETED", node(draw(st.sampled_from(NODES)))))
        else:
            pools = draw(st.lists(POOLS, min_size=len(NODES), max_size=len(NODES)))
            out.append(Relist("Node", tuple(node(n, pool) for n, pool in zip(NODES, pools, strict=True))))
    return out


def _name(obj: Any) -> str:
    return str(obj["metadata"]["name"])


def _live(history: list[ObjectChange | Relist]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The objects that exist after `history`, by subject."""
    live: dict[str, tuple[str, dict[str, Any]]] = {}
    for change in history:
        if isinstance(change, Relist):
            for subject in [s for s, (kind, _) in live.items() if kind == change.kind]:
                del live[subject]
            for obj in change.objects:
                live[f"{change.kind.lower()}/{_name(obj)}"] = (change.kind, obj)
            continue
        subject = f"{change.kind.lower()}/{_name(change.obj)}"
        if change.action == "DELETED":
            live.pop(subject, None)
        else:
            live[subject] = (change.kind, change.obj)
    return live


@settings(max_examples=150, deadline=None)
@given(histories())
async def test_shards_partition_the_cluster_and_agree_with_a_fresh_informer(history: list[ObjectChange | Relist]) -> None:
    states, _, _ = await run([], [[c] for c in history])
    # never an object in two shards
    for attr in ("node_names", "pods"):
        seen: list[str] = [key for state in states.values() for key in getattr(state, attr)]
        assert len(seen) == len(set(seen)), attr
    # and the same partition as an informer started now, on what exists now
    live = _live(history)
    order = {"Node": 0, "PodGroup": 1, "Pod": 2}
    fresh, _, _ = await run([add(kind, obj) for kind, obj in sorted(live.values(), key=lambda ko: order[ko[0]])])
    for name in SHARDS.names:
        assert sorted(states[name].node_names) == sorted(fresh[name].node_names), name
        assert sorted(states[name].pods) == sorted(fresh[name].pods), name


def test_the_router_alone_is_deterministic() -> None:
    router_a, router_b = Router(SHARDS, "kai-scheduler"), Router(SHARDS, "kai-scheduler")
    payload = p.NodeObserved(name="n", labels={POOL: "gpu-nodes"}, milli_cpu=1, memory_bytes=1)
    assert router_a.route(payload).sends == router_b.route(payload).sends == [("gpu", payload)]
    assert router_a.route(payload).sends == []  # unchanged
