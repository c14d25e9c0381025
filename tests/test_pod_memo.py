"""PodMemo (kai_es/ingest/pod_memo.py) answers exactly what translate.translate answers, for every
watch event of a pod: bound, started, resized in place, relabelled, broken, of another
scheduler sharing a GPU."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from kai_es.ingest import translate as tr
from kai_es.ingest.pod_memo import PodMemo, key_of
from tests.builders import MakePod

Obj = dict[str, Any]


def _outcome(fn: Callable[[Obj], object], obj: Obj) -> object:
    try:
        return fn(obj)
    except tr.IngestError as exc:
        return ("error", exc.path, exc.message)


def _step(obj: Obj, rv: int, change: Callable[[Obj], None]) -> Obj:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(rv)
    out["metadata"]["managedFields"] = [{"manager": f"m{rv}"}]
    change(out)
    return out


def _bind(node: str) -> Callable[[Obj], None]:
    return lambda o: o["spec"].__setitem__("nodeName", node)


def _status(**fields: Any) -> Callable[[Obj], None]:
    return lambda o: o.setdefault("status", {}).update(fields)


def _resized(cpu: str, allocated: str | None = None, infeasible: bool = False) -> Callable[[Obj], None]:
    def change(o: Obj) -> None:
        name = o["spec"]["containers"][0]["name"]
        cs: dict[str, Any] = {"name": name, "ready": True, "resources": {"requests": {"cpu": cpu}}}
        if allocated is not None:
            cs["allocatedResources"] = {"cpu": allocated}
        status = o.setdefault("status", {})
        status["containerStatuses"] = [cs]
        if infeasible:
            status["conditions"] = [{"type": "Ready", "status": "True"},
                                    {"type": "PodResizePending", "reason": "Infeasible"}]
    return change


def _label(k: str, v: str) -> Callable[[Obj], None]:
    return lambda o: o["metadata"].setdefault("labels", {}).__setitem__(k, v)


def _lives() -> list[tuple[Obj, list[Callable[[Obj], None]]]]:
    """Pods and the changes their watch events make, one after the other."""
    mine = MakePod("mine").gpu(1).req(cpu="2").obj()
    shared = MakePod("shared").fraction("0.5").obj()
    foreign = MakePod("foreign", queue=None).fraction("0.25").obj()
    foreign["spec"]["schedulerName"] = "default-scheduler"
    foreign_whole = MakePod("foreign-whole", queue=None).gpu(2).obj()
    foreign_whole["spec"]["schedulerName"] = "default-scheduler"
    running = [_bind("n1"), _status(phase="Pending", conditions=[{"type": "PodScheduled", "status": "True"}]),
               _status(phase="Running", startTime="2026-01-01T00:00:05Z",
                       containerStatuses=[{"name": "main", "ready": True, "state": {"running": {}}}]),
               _status(conditions=[{"type": "Ready", "status": "True"}])]
    lives = [(mine, [*running, _resized("3"), _resized("3", allocated="4"), _resized("1", "4", infeasible=True),
                     _resized("1"), _label("kai.scheduler/queue", "team-b"),
                     _status(phase="Sleeping"), _status(phase="Running"), _status(startTime="yesterday"),
                     _status(startTime="2026-01-01T00:00:09Z"), _bind("n2"),
                     _status(phase="Succeeded"), lambda o: o["metadata"].__setitem__(
                         "deletionTimestamp", "2026-01-01T00:01:00Z")]),
             (shared, [*running, lambda o: o["metadata"]["annotations"].__setitem__("gpu-fraction", "0.25")]),
             (foreign, [*running, _bind("n2"), _bind(""), _bind("n3"), _label("runai-gpu-group", "g")]),
             (foreign_whole, [*running, _bind("n2")])]
    for obj, _ in lives:
        obj["metadata"].update(uid=f"u-{obj['metadata']['name']}", resourceVersion="1",
                               creationTimestamp="2026-01-01T00:00:00Z")
        obj["spec"]["containers"][0].setdefault("name", "main")
    return lives


@pytest.mark.parametrize("life", range(4))
def test_every_event_of_a_pod_translates_as_without_the_memo(life: int) -> None:
    obj, changes = _lives()[life]
    memo = PodMemo()
    seen = [obj]
    for rv, change in enumerate(changes, start=2):
        seen.append(_step(seen[-1], rv, change))
    for event in seen:
        assert _outcome(memo.translate, event) == _outcome(tr.translate, event), event
    assert memo.hits >= 2  # status changes did reuse the pod's translation


def test_the_key_leaves_out_only_node_phase_start_and_what_the_server_rewrites() -> None:
    obj = _lives()[0][0]
    key = key_of(obj, "kai-scheduler")
    for change in (_bind("n1"), _status(phase="Running", startTime="2026-01-01T00:00:05Z"),
                   _status(conditions=[{"type": "Ready", "status": "True"}]),
                   _status(containerStatuses=[{"name": "main", "ready": False}])):
        assert key_of(_step(obj, 7, change), "kai-scheduler") == key
    for change in (_resized("3"), _label("a", "b"), lambda o: o["spec"].__setitem__("priority", 5),
                   _status(conditions=[{"type": "PodResizePending", "reason": "Deferred"}])):
        assert key_of(_step(obj, 7, change), "kai-scheduler") != key
    assert key_of(obj, "another-scheduler") != key


def test_deleted_and_relisted_pods_leave_the_memo() -> None:
    memo = PodMemo(max_pods=2)
    pods = [MakePod(f"p{i}").gpu(1).obj() for i in range(3)]
    for o in pods:
        memo.translate(o)
    assert len(memo) == 2  # the oldest went first
    memo.forget("default", "p2")
    assert len(memo) == 1


@pytest.mark.parametrize("hostile", [
    lambda o: o.__setitem__("status", "Running"),
    lambda o: o.__setitem__("status", {"containerStatuses": {"main": {}}, "phase": "Running"}),
    lambda o: o["status"].__setitem__("conditions", "Ready"),
    lambda o: o["status"].__setitem__("containerStatuses", [7, {"name": 3, "resources": {}}]),
    lambda o: o["status"].__setitem__("containerStatuses", [{"name": "main", "resources": "lots"}]),
    lambda o: o["status"].__setitem__("phase", ["Running"]),
    lambda o: o["status"].__setitem__("startTime", 12),
    lambda o: o["spec"].__setitem__("nodeName", 5),
    lambda o: o.__setitem__("spec", ["containers"]),
    lambda o: o["metadata"].__setitem__("labels", {"a": {"b": 1}}),
    lambda o: o.__setitem__("metadata", "p"),
])
def test_what_the_cluster_should_not_send_is_refused_as_without_the_memo(hostile: Callable[[Obj], None]) -> None:
    """Bad input never gets past the memo or breaks it: each event of a life with a broken one
    in the middle translates (or is refused) as without the memo."""
    obj = _lives()[0][0]
    memo = PodMemo()
    events = [obj, _step(obj, 2, _bind("n1")),
              _step(obj, 3, lambda o: (_bind("n1")(o), _status(phase="Running")(o), hostile(o))),
              _step(obj, 4, lambda o: (_bind("n1")(o), _status(phase="Running")(o)))]
    for event in events:
        assert _outcome(memo.translate, event) == _outcome(tr.translate, event)
