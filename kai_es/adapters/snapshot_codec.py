"""The stored form of a snapshot, shared by the file and Kafka snapshot stores: one JSON header
line, then the zlib-compressed canonical snapshot bytes.

Contract: `decode_stored(encode_stored(s)) == s`; bytes that are not such a blob raise
`SnapshotFormatError` (a ValueError) naming what is wrong.
"""

from __future__ import annotations

import zlib

import msgspec

from kai_es.ports import StoredSnapshot

STORED_FORMAT = 1


class StoredHeader(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    position: int
    completedposition: int
    cycle: int
    logicaltime: int
    digest: str
    compression: str
    size: int


class SnapshotFormatError(ValueError):
    """Stored snapshot bytes that cannot be decoded."""


def encode_stored(snap: StoredSnapshot) -> bytes:
    """One header line (JSON) + zlib-compressed snapshot bytes."""
    header = StoredHeader(format=STORED_FORMAT, position=snap.position,
                          completedposition=snap.completed_position, cycle=snap.cycle,
                          logicaltime=snap.logicaltime, digest=snap.digest, compression="zlib",
                          size=len(snap.data))
    return msgspec.json.encode(header) + b"\n" + zlib.compress(snap.data, 1)


def decode_header(head: bytes) -> StoredHeader:
    """The header line of a stored snapshot (what is known without its body)."""
    try:
        header = msgspec.json.decode(head, type=StoredHeader)
    except msgspec.DecodeError as exc:
        raise SnapshotFormatError(f"bad header: {exc}") from None
    if header.format != STORED_FORMAT or header.compression != "zlib":
        raise SnapshotFormatError(f"unsupported format {header.format}/{header.compression}")
    return header


def decode_stored(blob: bytes) -> StoredSnapshot:
    head, sep, body = blob.partition(b"\n")
    if not sep:
        raise SnapshotFormatError("no header line")
    header = decode_header(head)
    try:
        data = zlib.decompress(body)
    except zlib.error as exc:
        raise SnapshotFormatError(f"body does not decompress: {exc}") from None
    if len(data) != header.size:
        raise SnapshotFormatError(f"body is {len(data)} bytes, header says {header.size}")
    return StoredSnapshot(position=header.position, completed_position=header.completedposition,
                          cycle=header.cycle, logicaltime=header.logicaltime,
                          digest=header.digest, data=data)


__all__ = ["SnapshotFormatError", "StoredHeader", "decode_header", "decode_stored", "encode_stored"]
