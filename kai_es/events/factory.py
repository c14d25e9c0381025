"""Building envelopes: observed events get ids from an IdFactory; derived events get uuid5 ids.

Contract: `derived_id(cause_id, ordinal)` is a pure function, so re-running a cycle on the same
log yields the same ids and therefore the same bytes.
"""

from __future__ import annotations

import uuid
from typing import Final

from kai_es.events.envelope import Envelope
from kai_es.events.payloads import Payload
from kai_es.events.registry import CURRENT_SCHEMA_VERSION, ENVELOPE_OF
from kai_es.events.timefmt import rfc3339

NAMESPACE: Final = uuid.UUID("6f1c3e0a-9d2b-5c7e-8a41-2b6d0f9e7c13")


def derived_id(cause_id: str, ordinal: int) -> str:
    """Deterministic id of the `ordinal`-th event derived from the event `cause_id`."""
    return str(uuid.uuid5(NAMESPACE, f"{cause_id}/{ordinal}"))


def make_envelope(
    payload: Payload,
    *,
    event_id: str,
    source: str,
    subject: str,
    logicaltime: int,
    causationid: str | None = None,
    correlationid: str | None = None,
    basedon: int | None = None,
    policyversion: str | None = None,
    statedigest: str | None = None,
) -> Envelope:
    """An envelope for `payload`; `time` is rendered from `logicaltime`, never from a clock."""
    return ENVELOPE_OF[type(payload)](
        specversion="1.0",
        id=event_id,
        source=source,
        subject=subject,
        time=rfc3339(logicaltime),
        datacontenttype="application/json",
        schemaversion=CURRENT_SCHEMA_VERSION,
        logicaltime=logicaltime,
        causationid=causationid,
        correlationid=correlationid,
        basedon=basedon,
        policyversion=policyversion,
        statedigest=statedigest,
        data=payload,
    )
