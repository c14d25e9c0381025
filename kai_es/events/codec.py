"""Canonical bytes of envelopes: sorted keys, compact separators, UTF-8, no floats.

Contract:
- `encode(env)` is a pure function of the envelope's content; equal envelopes give equal bytes.
- `decode(b)` returns an Envelope whose `data` is the typed payload of the *current* schema
  version, upcasting older versions; any malformed input raises `DecodeError` with a reason a
  person can read (never a bare msgspec or KeyError).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from kai_es.events.envelope import Envelope
from kai_es.events.payloads import Payload
from kai_es.events.registry import CURRENT_SCHEMA_VERSION, EVENT_TYPES
from kai_es.events.upcast import upcast


class DecodeError(ValueError):
    """A record that is not a valid kai-es event; the message says why."""


class _RawEnvelope(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    specversion: str
    id: str
    type: str
    source: str
    subject: str
    time: str
    datacontenttype: str = "application/json"
    schemaversion: int
    logicaltime: int
    causationid: str | None = None
    correlationid: str | None = None
    basedon: int | None = None
    policyversion: str | None = None
    statedigest: str | None = None
    data: msgspec.Raw


_ENCODER: Final = msgspec.json.Encoder(order="sorted")
_RAW_DECODER: Final = msgspec.json.Decoder(_RawEnvelope)
_PAYLOAD_DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    name: msgspec.json.Decoder(cls) for name, cls in EVENT_TYPES.items()
}
_DICT_DECODER: Final = msgspec.json.Decoder(dict[str, Any])


def encode(envelope: Envelope) -> bytes:
    """Canonical JSON bytes of an envelope."""
    return _ENCODER.encode(envelope)


def encode_payload(payload: Payload) -> bytes:
    """Canonical JSON bytes of a payload alone (used for digests)."""
    return _ENCODER.encode(payload)


def canonical(obj: object) -> bytes:
    """Canonical JSON bytes of any msgspec-encodable object."""
    return _ENCODER.encode(obj)


def decode(data: bytes) -> Envelope:
    """Decode one canonical event. Raises DecodeError naming what is wrong."""
    try:
        raw = _RAW_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"not a kai-es envelope: {exc}") from None
    if raw.specversion != "1.0":
        raise DecodeError(f"unsupported CloudEvents specversion {raw.specversion!r}")
    payload_decoder = _PAYLOAD_DECODERS.get(raw.type)
    if payload_decoder is None:
        raise DecodeError(f"unknown event type {raw.type!r}")
    try:
        if raw.schemaversion == CURRENT_SCHEMA_VERSION:
            payload = payload_decoder.decode(raw.data)
        elif 0 < raw.schemaversion < CURRENT_SCHEMA_VERSION:
            fields = upcast(raw.type, raw.schemaversion, _DICT_DECODER.decode(raw.data))
            payload = msgspec.convert(fields, EVENT_TYPES[raw.type])
        else:
            raise DecodeError(
                f"{raw.type}: schema version {raw.schemaversion} is newer than this build "
                f"understands ({CURRENT_SCHEMA_VERSION})"
            )
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(f"{raw.type} payload invalid: {exc}") from None
    return Envelope(
        specversion=raw.specversion,
        id=raw.id,
        type=raw.type,
        source=raw.source,
        subject=raw.subject,
        time=raw.time,
        datacontenttype=raw.datacontenttype,
        schemaversion=CURRENT_SCHEMA_VERSION,
        logicaltime=raw.logicaltime,
        causationid=raw.causationid,
        correlationid=raw.correlationid,
        basedon=raw.basedon,
        policyversion=raw.policyversion,
        statedigest=raw.statedigest,
        data=payload,
    )


def decode_envelope_bytes(data: bytes) -> Envelope:
    """Alias of `decode`, named for call sites that read raw log lines."""
    return decode(data)
