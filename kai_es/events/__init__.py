"""Events: the envelope, the payload types and their canonical codec.

Public surface: `Envelope`, `Record`, the payload structs in `payloads`, `encode`/`decode`,
`EVENT_TYPES` (type name -> payload class) and `CURRENT_SCHEMA_VERSION`.
"""

from kai_es.events.codec import (
    DecodeError,
    decode,
    encode,
    encode_payload,
)
from kai_es.events.envelope import Envelope, Record
from kai_es.events.registry import CURRENT_SCHEMA_VERSION, EVENT_TYPES, TYPE_OF, type_name

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "EVENT_TYPES",
    "TYPE_OF",
    "DecodeError",
    "Envelope",
    "Record",
    "decode",
    "encode",
    "encode_payload",
    "type_name",
]
