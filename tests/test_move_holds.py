"""kai-es/v8 holds the room a consolidation move made for the moved pod's replacement: in the
simulator (which recreates an evicted pod at once, as its ReplicaSet would) the replacement is
nominated to the node the move found and lands there before a pod that arrived meanwhile; a
replacement that has not arrived yet keeps its room held until it does or the hold expires;
kai-es/v7 lets the newcomer take it. The fold keeps holds in the state, its snapshot and digest,
for moves decided under v8 only, and drops them when they expire."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import anyio
import pytest

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.replay import replay
from kai_es.scenario import load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.config import config_event, parse_config
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.rules.move_holds import NoMoveHoldsV7
from kai_es.state import ClusterState, invariants
from kai_es.state.incremental_digest import incremental_digest, recomputed_digest
from kai_es.state.model import MOVE_HOLD_NS
from kai_es.state.reducer import apply
from tests.policy_patch import without
from tests.builders import MakeNode, MakePod, queue, scenario_text

SEC = 10**9
OWNER = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d4f", "uid": "rs-1", "controller": True}]


def _scenario(version: str | None, recreate: bool, until: str = "20s") -> str:
    """n1 runs a, c and d (3 of its 4 GPUs), n2 runs web (a ReplicaSet's pod); big needs a whole
    4-GPU node, so consolidation moves web to n1's last GPU and pipelines big onto n2. greedy
    (another queue, one GPU, going first in queue order) arrives a second later and would fit
    just the GPU web was moved to."""
    docs: list[dict[str, Any]] = [MakeNode("n1").gpus(4).obj(), MakeNode("n2").gpus(4).obj(), queue("q"),
                                  queue("q2")]
    for name, node in (("a", "n1"), ("c", "n1"), ("d", "n1")):
        docs.append(MakePod(name, queue="q").gpu(1).priority_class("train").running_on(node).obj())
    web = MakePod("web", queue="q").gpu(1).priority_class("train").running_on("n2").obj()
    web["metadata"]["ownerReferences"] = copy.deepcopy(OWNER)
    if not recreate:
        web["metadata"]["annotations"]["kai-es.io/recreate"] = "false"
    docs.append(web)
    docs.append(MakePod("big", queue="q").gpu(4).priority_class("train").obj())
    docs.append(MakePod("greedy", queue="q2").gpu(1).priority_class("train")
                .annotate("kai-es.io/submit-after", "1s").obj())
    scheduler: dict[str, Any] = {} if version is None else {"policyVersion": version}
    return scenario_text(*docs, settings={"scheduler": scheduler,
                                          "simulation": {"until": until, "cyclePeriod": "1s"}})


def _run(text: str) -> tuple[list[Envelope], MemoryEventLog]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "holds.yaml"), log, load_packer("native")))
    return [r.envelope for r in log._records], log  # noqa: SLF001 - the test reads the whole log


def _bound(envelopes: list[Envelope]) -> dict[str, tuple[str, int]]:
    """Pod name -> (node, time) of its BindingDecided."""
    return {e.data.name: (e.data.node, e.logicaltime) for e in envelopes if isinstance(e.data, p.BindingDecided)}


def _move_time(envelopes: list[Envelope]) -> int:
    (t,) = [e.logicaltime for e in envelopes if isinstance(e.data, p.EvictionDecided) and e.data.to_node]
    return t


def test_the_replacement_of_a_moved_pod_lands_where_the_move_found_room() -> None:
    envelopes, log = _run(_scenario(None, recreate=True))
    bound = _bound(envelopes)
    assert bound["web-r1"][0] == "n1", bound
    assert "greedy" not in bound, bound  # n1 is full with web's replacement; n2 is big's
    assert replay(log._records, load_packer("native")).ok  # noqa: SLF001


def test_under_v7_a_pod_that_arrived_meanwhile_takes_the_room() -> None:
    bound = _bound(_run(_scenario("kai-es/v7", recreate=True))[0])
    assert bound["greedy"][0] == "n1", bound
    assert "web-r1" not in bound, bound


def test_the_room_is_held_until_the_replacement_comes_or_the_hold_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    """web's replacement never comes (kai-es.io/recreate: false): greedy waits for the hold to
    expire, then takes the GPU. With the scheduler's rule removed it takes it at once."""
    text = _scenario(None, recreate=False, until="200s")
    envelopes, log = _run(text)
    bound = _bound(envelopes)
    moved = _move_time(envelopes)
    assert bound["greedy"][0] == "n1" and bound["greedy"][1] > moved + MOVE_HOLD_NS, (bound, moved)
    assert replay(log._records, load_packer("native")).ok  # noqa: SLF001
    without(monkeypatch, "kai-es/v8", "move_holds", NoMoveHoldsV7())
    without(monkeypatch, "kai-es/v11", "move_holds", NoMoveHoldsV7())  # (v11's class extends v8's)
    envelopes = _run(text)[0]
    assert _bound(envelopes)["greedy"][1] < _move_time(envelopes) + 5 * SEC


# -- the fold ----------------------------------------------------------------------------------


class _Fold:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.position = 0
        self.feed(None, 0)

    def feed(self, payload: p.Payload | None, t: int, version: str = "kai-es/v8") -> None:
        if payload is None:
            env = config_event(parse_config({"policyVersion": version}), event_id="c", logicaltime=t)
        else:
            env = make_envelope(payload, event_id=str(uuid.uuid4()), source="test", subject="x", logicaltime=t,
                                policyversion=version if isinstance(payload, p.EvictionDecided) else None)
        apply(self.state, Record(self.position, env))
        self.position += 1
        assert not invariants.check(self.state), invariants.check(self.state)
        assert incremental_digest(self.state) == recomputed_digest(self.state)

    def pod(self, name: str, t: int, node: str = "", gpus: int = 1, owner: bool = True) -> None:
        ref = p.OwnerRef(kind="ReplicaSet", name="web-5d4f", uid="rs-1") if owner else None
        self.feed(p.PodObserved(namespace="d", name=name, uid=f"u-{name}", queue="q", podgroup=f"pg-{name}",
                                node_name=node, phase="Running" if node else "Pending", gpu=p.GpuRequest(whole=gpus),
                                owner=ref), t)

    def move(self, name: str, t: int, version: str = "kai-es/v8") -> None:
        self.feed(p.EvictionDecided(namespace="d", name=name, uid=f"u-{name}", node="n2", podgroup=f"pg-{name}",
                                    queue="q", action="consolidation", preemptor="d/big", reason="moved", to_node="n1"),
                  t, version)


def _fold() -> _Fold:
    f = _Fold()
    f.feed(p.QueueObserved(name="q"), 0)
    for n in ("n1", "n2"):
        f.feed(p.NodeObserved(name=n, gpus=4, milli_cpu=64_000, memory_bytes=2**40), 0)
    f.pod("web", 0, node="n2")
    return f


def test_a_move_holds_room_for_a_pod_of_its_owner_with_its_requests() -> None:
    f = _fold()
    f.move("web", SEC)
    assert [h.node for h in f.state.move_holds["d/ReplicaSet/web-5d4f"]] == ["n1"]
    f.pod("other", 2 * SEC, gpus=2)  # same owner, other requests: not the replacement
    assert f.state.pods["d/other"].nominated_node == ""
    f.pod("web-x", 3 * SEC)
    assert f.state.pods["d/web-x"].nominated_node == "n1"
    assert f.state.move_holds == {}


def test_a_hold_expires_and_older_versions_hold_nothing() -> None:
    f = _fold()
    f.move("web", SEC)
    f.feed(p.CycleStarted(cycle=1, config_digest=""), SEC + MOVE_HOLD_NS + 1)
    assert f.state.move_holds == {}
    f.pod("web-x", SEC + MOVE_HOLD_NS + 2)
    assert f.state.pods["d/web-x"].nominated_node == ""
    g = _fold()
    g.move("web", SEC, version="kai-es/v7")
    assert g.state.move_holds == {}


def test_a_pod_without_an_owner_has_no_replacement_to_wait_for() -> None:
    f = _Fold()
    f.feed(p.NodeObserved(name="n2", gpus=4, milli_cpu=64_000, memory_bytes=2**40), 0)
    f.pod("bare", 0, node="n2", owner=False)
    f.move("bare", SEC)
    assert f.state.move_holds == {}
