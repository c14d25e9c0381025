"""The replay's check of a binder outcome against the decision it names (`replay._impossible_outcome`),
each way it can fail and the way it passes, as a binder writes outcomes: the agreeing case is
checked first, without the message, so each failing field must still be found."""

from __future__ import annotations

import pytest

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.replay import _decided, _impossible_outcome

T = 1_700_000_000_000_000_000


def _env(payload: p.Payload, event_id: str, t: int = T) -> Envelope:
    return make_envelope(payload, event_id=event_id, source="kai-es/test", subject="pod/default/train-0",
                         logicaltime=t)


BIND = _env(p.BindingDecided(namespace="default", name="train-0", uid="u-0", node="node-1", podgroup="pg",
                             queue="team-a", gpu_devices=(0,)), "d-bind")
EVICT = _env(p.EvictionDecided(namespace="default", name="train-0", uid="u-0", node="node-1", podgroup="pg",
                               queue="team-a", action="reclaim", reason="r"), "d-evict")
DECIDED = {"d-bind": _decided(BIND), "d-evict": _decided(EVICT)}


def _bound(t: int = T, **changes: str) -> Record:
    fields = {"namespace": "default", "name": "train-0", "uid": "u-0", "node": "node-1", "decision_id": "d-bind",
              **changes}
    return Record(7, _env(p.PodBound(**fields), "o-1", t))


def test_an_outcome_that_agrees_with_its_decision_passes() -> None:
    assert _impossible_outcome(DECIDED, _bound()) is None
    assert _impossible_outcome(DECIDED, _bound(T + 1)) is None


@pytest.mark.parametrize(("outcome", "needle"), [
    (_bound(decision_id="d-none"), "names decision 'd-none', which is not in the log before it"),
    (_bound(decision_id="d-evict"), "names decision 'd-evict', which is a EvictionDecided"),
    (_bound(namespace="other"), "namespace 'other' (decision: 'default')"),
    (_bound(name="train-9"), "name 'train-9' (decision: 'train-0')"),
    (_bound(uid="u-9"), "uid 'u-9' (decision: 'u-0')"),
    (_bound(node="node-2"), "node 'node-2' (decision: 'node-1')"),
    (_bound(T - 1), f"logical time runs back, {T - 1} is before its decision's {T}"),
])
def test_each_impossible_outcome_is_named(outcome: Record, needle: str) -> None:
    why = _impossible_outcome(DECIDED, outcome)
    assert why is not None and needle in why and why.startswith("PodBound of pod ")
