"""The CloudEvents 1.0 envelope and the log record that pairs it with its position.

Contract: `logicaltime` (int nanoseconds since the Unix epoch) is the only time the core reads;
`time` is the same instant rendered for humans. Optional extensions are omitted when unset, so
canonical bytes do not depend on how an absent field was spelled.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kai_es.events.payloads import Payload


class Envelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False,
               forbid_unknown_fields=True, tag_field="type"):
    """Base of the per-type envelope classes (`kai_es.events.registry.ENVELOPE_OF`).

    The CloudEvents `type` is the msgspec tag of the concrete class, so one decode pass picks
    the payload type; read it as `env.type`. Construct envelopes with
    `kai_es.events.factory.make_envelope`, never directly.
    """

    # (in the order of their JSON keys, which canonical bytes sort: msgspec matches each key to a
    # field by scanning on from the last one matched, so this order finds each at once)
    basedon: int | None = None
    causationid: str | None = None
    correlationid: str | None = None
    data: Any
    datacontenttype: str
    id: str
    logicaltime: int
    policyversion: str | None = None
    schemaversion: int
    source: str
    specversion: str
    statedigest: str | None = None
    subject: str
    time: str

    @property
    def type(self) -> str:
        tag: str = self.__struct_config__.tag  # type: ignore[assignment]
        return tag

    @property
    def payload(self) -> Payload:
        """The typed payload (after decoding, `data` always holds a Payload)."""
        assert isinstance(self.data, Payload)
        return self.data


class Record(msgspec.Struct, frozen=True, gc=False):
    """An envelope at its log position. Positions increase strictly; they need not be dense.
    (A msgspec Struct rather than a frozen dataclass: one is built per record read, and this
    is five times cheaper to construct.)"""

    position: int
    envelope: Envelope
