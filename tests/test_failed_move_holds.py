"""kai-es/v11 (fold rule `releases_failed_moves`): a consolidation move whose eviction the
cluster refused holds no room for a replacement that will not come: the fold drops its holds. Found on the real
stack (tests/k8s/test_faults_evicting.py): a move's eviction refused while a restarted
apiserver's RBAC cache filled kept the move's destination held for the whole two-minute hold, so
the same move, tried again once its victim's eviction back-off ended, found no room, and the
2-GPU pod it was for waited out the hold.

In the simulator: n1 runs a, c and d (3 of its 4 GPUs), n2 runs web (a ReplicaSet's pod that
refuses its first eviction, as a transient 403 does); big needs a whole node, so consolidation
moves web to n1's last GPU and pipelines big onto n2; the eviction fails, and web is no victim
for the 60 s of its eviction back-off. (That a move that succeeds keeps its room held for the replacement is
tests/test_move_holds.py's, run under the default version.)"""

from __future__ import annotations

import copy
from typing import Any

import anyio
import pytest

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.replay import replay
from kai_es.scenario import load_scenario_text
from kai_es.scheduling import policy
from kai_es.scheduling.packing import load_packer
from kai_es.state import versions
from kai_es.state.model import MOVE_HOLD_NS
from tests.builders import MakeNode, MakePod, queue, scenario_text

SEC = 10**9
OWNER = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d4f", "uid": "rs-1", "controller": True}]


def _scenario(version: str | None, pinned: bool = False) -> str:
    docs: list[dict[str, Any]] = [MakeNode("n1").gpus(4).obj(), MakeNode("n2").gpus(4).obj(), queue("q"),
                                  queue("q2")]
    for name in ("a", "c", "d"):
        pod = MakePod(name, queue="q").gpu(1).priority_class("train").running_on("n1")
        if pinned:  # no victims: only web can move
            pod = pod.label("kai.scheduler/preemptibility", "non-preemptible")
        docs.append(pod.obj())
    web = MakePod("web", queue="q").gpu(1).priority_class("train").running_on("n2") \
        .annotate("kai-es.io/refuse-eviction", "once").obj()
    web["metadata"]["ownerReferences"] = copy.deepcopy(OWNER)
    docs.append(web)
    docs.append(MakePod("big", queue="q").gpu(4).priority_class("train").obj())
    scheduler: dict[str, Any] = {} if version is None else {"policyVersion": version}
    return scenario_text(*docs, settings={"scheduler": scheduler,
                                          "simulation": {"until": "200s", "cyclePeriod": "1s"}})


def _run(text: str) -> tuple[list[Envelope], MemoryEventLog]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "failed-move.yaml"), log, load_packer("native")))
    return [r.envelope for r in log._records], log  # noqa: SLF001 - the test reads the whole log


def _failed_move(envelopes: list[Envelope]) -> int:
    """The time the cluster refused the move's eviction (exactly one move decided, then refused)."""
    moves = [e for e in envelopes if isinstance(e.data, p.EvictionDecided) and e.data.to_node]
    assert moves and moves[0].data.name == "web" and moves[0].data.to_node == "n1", moves
    failed = [e for e in envelopes if isinstance(e.data, p.PodEvictionFailed) and e.data.decision_id == moves[0].id]
    assert len(failed) == 1, failed
    return failed[0].logicaltime


def _big_bound(envelopes: list[Envelope]) -> int:
    """When big was placed (pipelined onto the room the second move makes, or bound)."""
    return min(e.logicaltime for e in envelopes
               if isinstance(e.data, (p.BindingDecided, p.PodPipelined)) and e.data.name == "big"
               and e.logicaltime > _failed_move(envelopes))


def test_v11s_fold_releases_failed_moves() -> None:
    assert policy.POLICIES["kai-es/v11"].fold.releases_failed_moves
    assert policy.POLICIES[policy.CURRENT_POLICY].fold.releases_failed_moves
    assert not any(policy.POLICIES[f"kai-es/v{n}"].fold.releases_failed_moves for n in range(1, 11))


def test_a_refused_move_holds_nothing_and_big_gets_room_at_once() -> None:
    """With web no victim for its back-off and nothing held on n1, consolidation makes room on
    n1 instead: a, c and d move to n2 (v10 could not: web's hold kept one of n1's GPUs)."""
    envelopes, log = _run(_scenario(None))
    failed = _failed_move(envelopes)
    at = _big_bound(envelopes)
    assert at - failed < 5 * SEC, (at - failed) / SEC
    later = sorted((m.data.name, m.data.to_node) for m in envelopes
                   if isinstance(m.data, p.EvictionDecided) and m.data.to_node and m.logicaltime > failed)
    assert later == [("a", "n2"), ("c", "n2"), ("d", "n2")], later
    result = replay(log._records, load_packer("native"))  # noqa: SLF001
    assert result.ok, result.divergence


def test_v10_held_the_refused_moves_room_for_the_whole_hold() -> None:
    envelopes, _ = _run(_scenario("kai-es/v10"))
    moved = next(e.logicaltime for e in envelopes if isinstance(e.data, p.EvictionDecided) and e.data.to_node)
    assert _big_bound(envelopes) - moved > MOVE_HOLD_NS, (_big_bound(envelopes) - moved) / SEC


def test_without_the_rule_v11_holds_it_too(monkeypatch: pytest.MonkeyPatch) -> None:
    for version, rules in list(versions.FOLD_RULES.items()):  # v11 and every version after it
        if rules.releases_failed_moves:
            monkeypatch.setitem(versions.FOLD_RULES, version, versions.FOLD_RULES["kai-es/v10"])  # type: ignore[index]
    envelopes, _ = _run(_scenario(None))
    moved = next(e.logicaltime for e in envelopes if isinstance(e.data, p.EvictionDecided) and e.data.to_node)
    assert _big_bound(envelopes) - moved > MOVE_HOLD_NS


def test_a_move_made_again_after_a_failed_one_is_claimed_by_its_replacement() -> None:
    """web alone can make room for big (a, c and d do not move: non-preemptible); its first
    eviction fails, the move is made again after web's eviction back-off, and web's replacement
    lands on the room that move holds (v10: it claimed the first, stale hold while the second
    kept the room, and waited out that hold)."""
    envelopes, log = _run(_scenario(None, pinned=True))
    failed = _failed_move(envelopes)
    bound = {e.data.name: (e.data.node, e.logicaltime) for e in envelopes if isinstance(e.data, p.BindingDecided)}
    assert bound["web-r1"][0] == "n1" and bound["web-r1"][1] - failed < 90 * SEC, (bound, failed)
    assert replay(log._records, load_packer("native")).ok  # noqa: SLF001
