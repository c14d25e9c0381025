"""Canonical bytes: sorted keys, stable across decode/encode, readable errors, upcasting."""

from __future__ import annotations

import json
import re
import uuid

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_es.events import DecodeError, decode, encode
from kai_es.events import payloads as p
from kai_es.events.factory import DerivedIds, derived_id, make_envelope
from kai_es.events.timefmt import format_duration, format_span, parse_duration, parse_rfc3339, rfc3339
from kai_es.events import upcast as up


def _env(payload: p.Payload, **kw: object) -> object:
    return make_envelope(payload, event_id="e-1", source="test", subject="pod/default/a",
                         logicaltime=1_767_225_600_123_000_000, **kw)  # type: ignore[arg-type]


def test_canonical_bytes_sort_keys_and_round_trip() -> None:
    env = _env(p.BindingDecided(namespace="default", name="a", uid="u", node="n1", podgroup="g",
                                queue="q", gpu_devices=(3, 1)), basedon=7)
    raw = encode(env)  # type: ignore[arg-type]
    obj = json.loads(raw)
    assert list(obj) == sorted(obj)
    assert list(obj["data"]) == sorted(obj["data"])
    assert b" " not in raw  # compact
    assert obj["time"] == "2026-01-01T00:00:00.123Z"
    again = decode(raw)
    assert again == env
    assert encode(again) == raw


def test_unset_extensions_are_omitted() -> None:
    raw = encode(_env(p.NodeRemoved(name="n")))  # type: ignore[arg-type]
    assert b"basedon" not in raw and b"statedigest" not in raw


def test_floats_are_rejected_in_quantities() -> None:
    env = json.loads(encode(_env(p.NodeObserved(name="n", milli_cpu=1000, memory_bytes=1))))  # type: ignore[arg-type]
    env["data"]["milli_cpu"] = 1000.5
    with pytest.raises(DecodeError, match="milli_cpu"):
        decode(json.dumps(env).encode())


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda e: e.update(type="kai.nope"), "unknown event type"),
    (lambda e: e.pop("logicaltime"), "logicaltime"),
    (lambda e: e.update(specversion="0.3"), "specversion"),
    (lambda e: e["data"].update(extra=1), "extra"),
    (lambda e: e.update(schemaversion=99), "newer"),
])
def test_malformed_events_give_readable_errors(mutate, needle) -> None:  # type: ignore[no-untyped-def]
    env = json.loads(encode(_env(p.NodeRemoved(name="n"))))  # type: ignore[arg-type]
    mutate(env)
    with pytest.raises(DecodeError, match=needle):
        decode(json.dumps(env).encode())


def test_not_json_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode(b"{not json")


def test_no_body_is_a_decode_error_that_says_so() -> None:
    """A Kafka record without a value reaches the codec as None: refused like any record that
    is not an event, never a TypeError."""
    with pytest.raises(DecodeError, match="^record has no value$"):
        decode(None)
    with pytest.raises(DecodeError, match="not a kai-es envelope"):
        decode(memoryview(b""))


def _pretend_v2_is_current(monkeypatch: pytest.MonkeyPatch, event_type: str) -> None:
    from kai_es.events import registry

    monkeypatch.setitem(registry.SCHEMA_VERSIONS, event_type, 2)
    monkeypatch.setitem(registry.DIRECT_VERSIONS, registry.ENVELOPE_CLASSES[event_type], frozenset({2}))


def test_upcaster_chain_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    # pretend v2 is current and v1 of node.removed spelled the field 'node'

    _pretend_v2_is_current(monkeypatch, "kai.cluster.node.removed")
    monkeypatch.setitem(up.UPCASTERS, ("kai.cluster.node.removed", 1), lambda f: {"name": f["node"]})
    env = json.loads(encode(_env(p.NodeRemoved(name="n"))))  # type: ignore[arg-type]
    env["data"] = {"node": "old-name"}
    out = decode(json.dumps(env).encode())
    assert out.data == p.NodeRemoved(name="old-name")
    assert out.schemaversion == 2


def test_missing_upcaster_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_v2_is_current(monkeypatch, "kai.cluster.node.removed")
    env = encode(_env(p.NodeRemoved(name="n")))  # type: ignore[arg-type]
    with pytest.raises(up.UpcastError, match="no upcaster"):
        decode(env)


def test_derived_ids_are_stable_and_distinct() -> None:
    assert derived_id("c", 0) == derived_id("c", 0)
    assert derived_id("c", 0) != derived_id("c", 1) != derived_id("d", 1)


def test_time_helpers() -> None:
    ns = parse_rfc3339("2026-01-01T01:02:03.5+01:00")
    assert rfc3339(ns) == "2026-01-01T00:02:03.5Z"
    assert parse_duration("1h30m") == 5_400_000_000_000
    assert parse_duration("250ms") == 250_000_000
    assert format_duration(5_400_000_000_000) == "1h30m"
    with pytest.raises(ValueError, match="duration"):
        parse_duration("5 minutes")


def test_spans_for_people_are_rounded_but_reasons_keep_their_exact_durations() -> None:
    assert format_span(536_057_820) == "536ms"
    assert format_span(235_600_000_000) == "3m56s"
    assert format_span(-1_499_999) == "-1ms"
    assert format_span(999_700_000) == "1s"
    assert format_duration(536_057_820) == "536057820ns"  # what a logged reason said stays said


def test_payload_structs_reject_unknown_fields() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"name": "n", "bogus": 1}, p.NodeRemoved)


@given(cause=st.text(max_size=80), ordinal=st.integers(0, 2**128))
def test_derived_ids_are_rfc4122_uuid5_of_cause_and_ordinal(cause: str, ordinal: int) -> None:
    expected = uuid.uuid5(uuid.UUID("6f1c3e0a-9d2b-5c7e-8a41-2b6d0f9e7c13"), f"{cause}/{ordinal}")
    assert derived_id(cause, ordinal) == str(expected)
    # a cycle's series of ids (the prefix hashed once) is the same function
    ids = DerivedIds(cause)
    assert ids(ordinal) == str(expected)
    assert [ids(n) for n in range(3)] == [derived_id(cause, n) for n in range(3)]


def test_version_1_pod_observed_decodes_as_version_2_and_keeps_its_bytes() -> None:
    """Pod observations written before schema version 2 (no labels, affinities, ports, ...)
    decode directly, keep `schemaversion: 1`, and re-encode to the recorded bytes, so old logs
    replay byte for byte."""
    v1 = (b'{"data":{"name":"a","namespace":"default",'
          b'"podgroup":"pg","uid":"u1"},"datacontenttype":"application/json","id":"i","logicaltime":5,'
          b'"schemaversion":1,"source":"s","specversion":"1.0","subject":"pod/default/a",'
          b'"time":"1970-01-01T00:00:00.000000005Z","type":"kai.cluster.pod.observed"}')
    env = decode(v1)
    assert env.schemaversion == 1
    assert isinstance(env.data, p.PodObserved) and env.data.labels == {} and env.data.host_ports == ()
    assert encode(env) == v1
    new = _env(p.PodObserved(namespace="default", name="a", uid="u1", podgroup="pg", labels={"app": "x"}))
    assert new.schemaversion == 3  # the current version (v3 adds start time and time annotations)
    assert decode(encode(new)).data == new.data


def test_a_future_schema_version_is_refused() -> None:
    env = json.loads(encode(_env(p.PodRemoved(namespace="d", name="n"))))  # type: ignore[arg-type]
    env["schemaversion"] = 7
    with pytest.raises(DecodeError, match="newer than this build"):
        decode(json.dumps(env).encode())


def test_version_1_bind_failed_decodes_as_version_2_not_final_and_keeps_its_bytes() -> None:
    """PodBindFailed v2 only adds `final`: a v1 record is a non-final failure, byte for byte."""
    v1 = (b'{"data":{"decision_id":"d","message":"no","name":"a","namespace":"default","node":"n",'
          b'"uid":"u1"},"datacontenttype":"application/json","id":"i","logicaltime":5,'
          b'"schemaversion":1,"source":"s","specversion":"1.0","subject":"pod/default/a",'
          b'"time":"1970-01-01T00:00:00.000000005Z","type":"kai.binder.pod.bindfailed"}')
    env = decode(v1)
    assert env.schemaversion == 1 and isinstance(env.data, p.PodBindFailed) and env.data.final is False
    assert encode(env) == v1
    final = _env(p.PodBindFailed(namespace="default", name="a", uid="u1", node="n", decision_id="d",
                                 message="no", final=True))
    assert final.schemaversion == 2 and decode(encode(final)).data == final.data


def _golden_bodies() -> list[bytes]:
    from pathlib import Path

    from kai_es.adapters.file_log import FileEventLog

    golden = Path(__file__).parent / "golden"
    bodies: list[bytes] = []
    for path in sorted(golden.glob("*.events.jsonl")) + sorted((golden / "history").glob("*.events.jsonl")):
        bodies += [body for _, body in FileEventLog(path, readonly=True).scan_raw()]
    return bodies


def _outcome(data: bytes) -> object:
    try:
        return decode(data)
    except DecodeError as exc:
        return ("DecodeError", str(exc))


def _union_outcome(data: bytes, monkeypatch: pytest.MonkeyPatch) -> object:
    """What decode gives without its fast path (the tagged union's decoder)."""
    from kai_es.events import codec

    with monkeypatch.context() as m:
        m.setattr(codec, "_BY_SUFFIX", {})
        return _outcome(data)


def test_decode_by_the_tail_type_equals_the_union_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """decode's fast path (the class read from the tail) gives what the tagged union's decoder
    gives, on every golden record, older schema versions included, from bytes and from a
    memoryview, and on bodies whose tail names another type, a second type, or no data."""
    bodies = _golden_bodies()
    assert len(bodies) > 1000
    kinds = set()
    for body in bodies:
        env = decode(body)
        kinds.add(type(env.data))
        union = _union_outcome(body, monkeypatch)
        assert env == union and type(env) is type(union)
        assert decode(memoryview(body)) == env
    assert len(kinds) >= 8
    bound = encode(_env(p.PodBound(namespace="d", name="a", uid="u", node="n", decision_id="x")))  # type: ignore[arg-type]
    variants = [
        bound.replace(b'"kai.binder.pod.bound"}', b'"kai.binder.pod.evicted"}'),  # wrong tail type
        bound[:-1] + b',"type":"kai.binder.pod.evicted"}',  # a second type, another one
        bound[:-1] + b',"type":"kai.binder.pod.bound"}',  # the same type twice
        bound.replace(b'"data":{', b'"data":{"type":"kai.binder.pod.bound",'),  # a type in data
        b'{"type":"kai.binder.pod.bound"}',
        b'{"x":1,"type":"kai.binder.pod.bound"}',
        bound.replace(b'"logicaltime":', b'"logicaltime":"').replace(b',"schemaversion', b'","schemaversion'),
        bound.replace(b'"schemaversion":1', b'"schemaversion":7'),
        bound.replace(b'"specversion":"1.0"', b'"specversion":"0.3"'),
        # no type at all, the last field's value ending as the tail would: the class's own
        # decoder takes an object without its tag, so the whole tail must be there
        re.sub(rb'"time":"[^"]*","type":"kai.binder.pod.bound"}', b'"time":"x,kai.binder.pod.bound"}', bound),
    ]
    outcomes = [_outcome(body) for body in variants]
    assert outcomes == [_union_outcome(body, monkeypatch) for body in variants]
    assert sum(isinstance(o, tuple) for o in outcomes) == len(variants) - 2  # refused, but for a valid
    # PodEvicted (the first) and a repeated key of the same value (the third: msgspec keeps the last)
