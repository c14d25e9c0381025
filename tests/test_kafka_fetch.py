"""`kafka_fetch.committed_frames` on record batches made here with aiokafka's own builder (the
real broker's answers, aborted transactions and markers included, are in
tests/kafka/test_kafka_log.py): offsets trimmed to [start, end), the next offset to fetch, and a
batch whose bytes were damaged refused by its CRC."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from kai_es.adapters.kafka_fetch import FetchError, committed_frames


def batch(base: int, values: list[bytes], *, producer_id: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                        producer_id=producer_id, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1, key=None, value=value, headers=[])
    data = bytearray(builder.build())
    data[0:8] = base.to_bytes(8, "big")  # the base offset (not under the CRC), as a broker sets it
    return bytes(data)


ANSWER = batch(10, [b"a", b"b", b"c"]) + batch(13, [b"d", b"e"])


@pytest.mark.parametrize(("start", "end", "frames", "after"), [
    (10, 100, [(10, b"a"), (11, b"b"), (12, b"c"), (13, b"d"), (14, b"e")], 15),
    (11, 100, [(11, b"b"), (12, b"c"), (13, b"d"), (14, b"e")], 15),  # a batch begun before start
    (10, 12, [(10, b"a"), (11, b"b")], 13),  # stops in the first batch
    (12, 14, [(12, b"c"), (13, b"d")], 15),
    (14, 15, [(14, b"e")], 15),
])
def test_frames_between_start_and_end(start: int, end: int, frames: list[tuple[int, bytes]],
                                      after: int) -> None:
    assert committed_frames(MemoryRecords(ANSWER), None, start, end) == (frames, after)


def test_a_damaged_batch_is_refused_by_its_crc() -> None:
    damaged = bytearray(ANSWER)
    damaged[len(ANSWER) - 3] ^= 0xFF  # a byte of the last record of the second batch
    with pytest.raises(FetchError, match="record batch at offset 13 fails its CRC check"):
        committed_frames(MemoryRecords(bytes(damaged)), None, 10, 100)
    assert committed_frames(MemoryRecords(bytes(damaged)), None, 10, 100, check_crcs=False)[1] == 15
