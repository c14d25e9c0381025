"""Line indexing of the file event log: known answers, native == twin, CRC == zlib, loader."""

from __future__ import annotations

import functools
import logging
import random
import zlib
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_es.adapters import framing
from kai_es.adapters.framing import (
    FrameScan,
    LineIndexer,
    NativeIndexer,
    NativeIndexerUnavailable,
    PythonIndexer,
    Reason,
    check_frames_py,
    default_indexer,
    load_indexer,
)
from kai_es.adapters.file_log import FileEventLog, frame


@functools.cache
def _native() -> NativeIndexer:
    return NativeIndexer()  # created lazily: without the extension only the native tests fail


_TWIN = PythonIndexer()


@pytest.fixture(params=["native", "python"])
def indexer(request: pytest.FixtureRequest) -> LineIndexer:
    return load_indexer(request.param)


def index(ix: LineIndexer, buf: bytes, *, start: int = 0, base: int = 0, cap: int | None = None) -> tuple[list[int], FrameScan]:
    out = array("q")
    scan = ix.index(buf, out, start=start, base=base, cap=cap)
    assert scan.count == len(out)
    return out.tolist(), scan


# ----------------------------------------------------------------------------- the native module


def test_native_module_is_loaded() -> None:
    """Fails when the extension is not built: the file log must really index in C."""
    import kai_es._native._framing as compiled

    ix = load_indexer("native")
    assert isinstance(ix, NativeIndexer)
    assert ix.module is compiled
    assert compiled.lib.kai_frame_abi_version() == framing.ABI_VERSION
    assert default_indexer().kind == "native"
    assert load_indexer().kind == "native"


def test_file_log_indexes_with_the_native_module_by_default(tmp_path: Path) -> None:
    log = FileEventLog(tmp_path / "e.log")
    assert log._indexer.kind == "native"


def test_missing_native_module_falls_back_to_the_twin_loudly(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(framing, "NATIVE_MODULE", "kai_es._native._no_such_module")
    with pytest.raises(NativeIndexerUnavailable, match="kai_es/_native/build.py"):
        load_indexer("native")
    with caplog.at_level(logging.WARNING, logger="kai_es.adapters.framing"):
        assert isinstance(load_indexer("auto"), PythonIndexer)
    assert any("pure-Python twin" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError):
        load_indexer("fastest")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- CRC-32 == zlib


def test_crc32_known_answers() -> None:
    for tables_only in (False, True):
        assert _native().crc32(b"", tables_only=tables_only) == 0
        assert _native().crc32(b"123456789", tables_only=tables_only) == 0xCBF43926
        assert _native().crc32(bytes(range(256)), tables_only=tables_only) == zlib.crc32(bytes(range(256)))


def test_crc32_agrees_with_zlib_on_every_length_and_alignment() -> None:
    rng = random.Random(7)
    blob = rng.randbytes(5000)
    for n in [*range(0, 300), 511, 512, 513, 1000, 4096, 4999]:
        for skew in (0, 1, 3, 7):
            data = blob[skew:skew + n]
            seed = rng.getrandbits(32)
            assert _native().crc32(data, seed) == zlib.crc32(data, seed), (n, skew)
            assert _native().crc32(data, seed, tables_only=True) == zlib.crc32(data, seed), (n, skew)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600), seed=st.integers(0, 2**32 - 1))
def test_crc32_property(data: bytes, seed: int) -> None:
    assert _native().crc32(data, seed) == zlib.crc32(data, seed)
    assert _native().crc32(data, seed, tables_only=True) == zlib.crc32(data, seed)


# ----------------------------------------------------------------------------- known answers

A = frame(b'{"a":1}')
B = frame(b'{"bb":22}')
EMPTY_BODY = frame(b"")


def test_valid_lines(indexer: LineIndexer) -> None:
    buf = A + B + EMPTY_BODY
    assert index(indexer, buf) == ([0, len(A), len(A + B)], FrameScan(3, len(buf), len(buf), Reason.OK))
    assert index(indexer, buf, base=1000) == (
        [1000, 1000 + len(A), 1000 + len(A + B)], FrameScan(3, 1000 + len(buf), 1000 + len(buf), Reason.OK))
    assert index(indexer, buf, start=len(A), base=7) == (
        [7 + len(A), 7 + len(A + B)], FrameScan(2, 7 + len(buf), 7 + len(buf), Reason.OK))


def test_empty_buffer_and_start_at_the_end(indexer: LineIndexer) -> None:
    assert index(indexer, b"") == ([], FrameScan(0, 0, 0, Reason.OK))
    assert index(indexer, A, start=len(A), base=5) == ([], FrameScan(0, 5 + len(A), 5 + len(A), Reason.OK))


def test_upper_case_hex_is_accepted(indexer: LineIndexer) -> None:
    body = b'{"x":"upper"}'
    line = b"%08X\t%s\n" % (zlib.crc32(body), body)
    assert any(c in b"ABCDEF" for c in line[:8])
    assert index(indexer, line) == ([0], FrameScan(1, len(line), len(line), Reason.OK))


def test_cap_stops_early_and_resumes(indexer: LineIndexer) -> None:
    buf = A + B + A
    assert index(indexer, buf, cap=2) == ([0, len(A)], FrameScan(2, len(A + B), len(A + B), Reason.OK))
    assert index(indexer, buf, cap=0) == ([], FrameScan(0, 0, 0, Reason.OK))
    assert index(indexer, buf, start=len(A + B), cap=2) == ([len(A + B)], FrameScan(1, len(buf), len(buf), Reason.OK))


@pytest.mark.parametrize(("bad", "reason"), [
    (A[:-1], Reason.NOT_TERMINATED),  # torn: the newline is missing
    (A[:5], Reason.NOT_TERMINATED),
    (b"0000\n", Reason.NO_FRAME),  # too short
    (b"\n", Reason.NO_FRAME),
    (b"00000000\n", Reason.NO_FRAME),  # 9 bytes: no room for the tab
    (A[:8] + b" " + A[9:], Reason.NO_FRAME),  # no tab at byte 8
    (b"0000000g" + A[8:], Reason.BAD_HEX),
    (b" 1234567" + A[8:], Reason.BAD_HEX),  # int(..., 16) would accept these three
    (b"+1234567" + A[8:], Reason.BAD_HEX),
    (b"0x123456" + A[8:], Reason.BAD_HEX),
    (A[:10] + b"?" + A[11:], Reason.CRC_MISMATCH),
    (b"00000001\t\n", Reason.CRC_MISMATCH),  # an empty body: its CRC is 0
])
def test_each_reason(indexer: LineIndexer, bad: bytes, reason: Reason) -> None:
    buf = A + bad
    end = len(buf)
    assert index(indexer, buf) == ([0], FrameScan(1, len(A), end, reason))
    # in the middle: line_end is the end of the bad line, not of the buffer
    if reason is not Reason.NOT_TERMINATED:
        assert index(indexer, buf + B) == ([0], FrameScan(1, len(A), end, reason))
    assert reason.message


def test_bad_arguments_are_rejected_before_the_boundary(indexer: LineIndexer) -> None:
    with pytest.raises(TypeError):
        indexer.index(A, array("i"))
    with pytest.raises(TypeError):
        indexer.index(A, [])  # type: ignore[arg-type]
    for kwargs in ({"start": -1}, {"start": len(A) + 1}, {"base": -1}, {"cap": -1}, {"base": 2**63 - 2}):
        with pytest.raises(ValueError):
            indexer.index(A, array("q"), **kwargs)
    with pytest.raises(TypeError):
        indexer.check(A, array("i", [0, len(A)]))


P1 = frame(b'{"p":1}', more=True)
P2 = frame(b'{"pp":2}', more=True)


def test_plus_lines_known_answers() -> None:
    body = b'{"p":1}'
    assert P1 == b"%08x+%s\n" % (zlib.crc32(b"+" + body), body)
    assert frame(body) == b"%08x\t%s\n" % (zlib.crc32(body), body)
    assert P1[:8] != frame(body)[:8]  # a tab line turned into a "+" line (or back) does not verify


def test_whole_batches_only(indexer: LineIndexer) -> None:
    batch = P1 + P2 + A
    assert index(indexer, batch) == ([0, len(P1), len(P1 + P2)], FrameScan(3, len(batch), len(batch), Reason.OK))
    # the buffer ends inside a batch: nothing of it, NOT_TERMINATED from the batch's start
    assert index(indexer, P1 + P2) == ([], FrameScan(0, 0, len(P1 + P2), Reason.NOT_TERMINATED))
    buf = B + P1 + P2
    assert index(indexer, buf) == ([0], FrameScan(1, len(B), len(buf), Reason.NOT_TERMINATED))
    buf = B + P1 + P2[:-3]  # and with its last line cut short too
    assert index(indexer, buf) == ([0], FrameScan(1, len(B), len(buf), Reason.NOT_TERMINATED))
    # a bad line inside a batch: the scan stops at the batch's start, line_end past the bad line
    bad = bytearray(P2)
    bad[12] ^= 1
    buf = B + P1 + bytes(bad) + A
    assert index(indexer, buf) == ([0], FrameScan(1, len(B), len(B + P1 + P2), Reason.CRC_MISMATCH))
    swapped = P2[:8] + b"\t" + P2[9:]  # the separator flipped: the CRC no longer matches
    assert index(indexer, B + swapped + A) == ([0], FrameScan(1, len(B), len(B + P2), Reason.CRC_MISMATCH))
    # cap counts lines read: hit mid-batch, the batch is left for the next call
    buf = B + P1 + P2 + A
    assert index(indexer, buf, cap=2) == ([0], FrameScan(1, len(B), len(B), Reason.OK))
    assert index(indexer, buf, cap=1) == ([0], FrameScan(1, len(B), len(B), Reason.OK))
    assert index(indexer, buf, start=len(B), cap=2) == ([], FrameScan(0, len(B), len(B), Reason.OK))
    assert index(indexer, buf, start=len(B), cap=3, base=10) == (
        [10 + len(B), 10 + len(B + P1), 10 + len(B + P1 + P2)], FrameScan(3, 10 + len(buf), 10 + len(buf), Reason.OK))
    assert indexer.check(buf, array("q", [0, len(B), len(B + P1), len(B + P1 + P2), len(buf)])) == 4


def test_batches_longer_than_a_native_chunk() -> None:
    plus, end = frame(b"", more=True), frame(b"")
    n = 2 * framing._CHUNK + 17
    whole = end + plus * n + end
    native, twin = index(_native(), whole), index(_TWIN, whole)
    assert native == twin
    assert native[1] == FrameScan(n + 2, len(whole), len(whole), Reason.OK)
    torn = end + plus * n
    native, twin = index(_native(), torn), index(_TWIN, torn)
    assert native == twin == ([0], FrameScan(1, len(end), len(torn), Reason.NOT_TERMINATED))
    for cap in (framing._CHUNK + 3, n + 1, n + 2):
        assert index(_native(), whole, cap=cap) == index(_TWIN, whole, cap=cap)
    assert index(_TWIN, whole, cap=n + 1)[1] == FrameScan(1, len(end), len(end), Reason.OK)


def test_native_chunks_agree_past_the_chunk_size() -> None:
    line = frame(b"")
    n = 2 * framing._CHUNK + 17
    buf = line * n + line[:4]
    native, twin = index(_native(), buf), index(_TWIN, buf)
    assert native == twin
    assert native[1] == FrameScan(n, n * len(line), len(buf), Reason.NOT_TERMINATED)
    assert index(_native(), buf, cap=framing._CHUNK + 3) == index(_TWIN, buf, cap=framing._CHUNK + 3)


def test_check_known_answers(indexer: LineIndexer) -> None:
    buf = A + B
    assert indexer.check(buf, array("q", [0, len(A), len(buf)])) == 2
    assert indexer.check(buf, array("q", [0])) == 0
    assert indexer.check(buf, array("q")) == 0
    assert indexer.check(buf, array("q", [0, len(A) + 1, len(buf)])) == 0  # no newline before len(A) + 1
    assert indexer.check(buf, array("q", [0, len(A), len(buf) + 1])) == 1  # past the buffer
    assert indexer.check(buf, array("q", [1, len(A)])) == 0  # no tab or "+" at byte 8
    assert indexer.check(buf, array("q", [-5, len(A)])) == 0
    assert indexer.check(buf, array("q", [len(A), 0])) == 0  # backwards
    assert indexer.check(buf, array("q", [0, len(A), -(2**63)])) == 1


# ----------------------------------------------------------------------------- native == twin


@st.composite
def framed_buffers(draw: st.DrawFn) -> bytes:
    """Valid lines of batches with now and then a damaged one, and maybe a torn tail."""
    bodies = st.binary(max_size=90).map(lambda b: b.replace(b"\n", b" "))
    parts: list[bytes] = []
    for body in draw(st.lists(bodies, max_size=8)):
        line = bytearray(frame(body, more=draw(st.booleans())))
        kind = draw(st.sampled_from(["ok"] * 6 + ["flip", "hex", "tab", "short", "upper", "newline", "swap"]))
        if kind == "flip":  # any byte of the line, the frame or the newline included
            i = draw(st.integers(0, len(line) - 1))
            line[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "hex":
            line[draw(st.integers(0, 7))] = draw(st.sampled_from(b"gxG -+_\t\n\x00\xff"))
        elif kind == "tab":
            line[8] = draw(st.sampled_from(b" x\n0-"))
        elif kind == "swap":  # "+" for a tab or the other way round, the CRC left as it was
            line[8] = 0x2B if line[8] == 0x09 else 0x09
        elif kind == "short":
            line = bytearray(line[:draw(st.integers(0, 9))] + b"\n")
        elif kind == "upper":
            line[:8] = line[:8].upper()
        elif kind == "newline":  # an extra newline cuts the line in two
            line.insert(draw(st.integers(0, len(line) - 1)), 0x0A)
        parts.append(bytes(line))
    if draw(st.booleans()):
        tail = frame(draw(bodies), more=draw(st.booleans()))
        parts.append(tail[:draw(st.integers(0, len(tail) - 1))])
    return b"".join(parts)


any_buffers = st.one_of(framed_buffers(), framed_buffers(), st.binary(max_size=200))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(buf=any_buffers, data=st.data())
def test_native_agrees_with_twin(buf: bytes, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(buf)))
    base = data.draw(st.sampled_from([0, 1, 4096, 2**40]))
    cap = data.draw(st.sampled_from([None, 0, 1, 2, 3, 5]))
    expected = index(_TWIN, buf, start=start, base=base, cap=cap)
    assert index(_native(), buf, start=start, base=base, cap=cap) == expected
    offsets, scan = expected
    # what the answer means, checked from the outside
    assert scan.stop <= scan.line_end <= base + len(buf)
    ends = [*offsets[1:], scan.stop]
    for s, e in zip(offsets, ends):
        line = buf[s - base:e - base]
        assert line.endswith(b"\n") and line[8:9] in (b"\t", b"+")
        assert int(line[:8], 16) == zlib.crc32(line[9:-1], 0 if line[8:9] == b"\t" else zlib.crc32(b"+"))
    if offsets:  # only whole batches: the last line handed out ends one
        assert buf[scan.stop - base - 1:scan.stop - base] == b"\n" and buf[offsets[-1] - base + 8] == 0x09
    # between stop and the bad line (or the buffer's end) lie only "+" lines that verify
    rest = buf[scan.stop - base:scan.line_end - base]
    pending = [ln + b"\n" for ln in rest.split(b"\n")[:-1]]  # its terminated lines
    if scan.reason not in (Reason.OK, Reason.NOT_TERMINATED):
        pending = pending[:-1]  # the bad line itself
    for ln in pending:
        assert ln[8:9] == b"+" and int(ln[:8], 16) == zlib.crc32(ln[9:-1], zlib.crc32(b"+"))
    if scan.reason is Reason.OK:
        assert scan.line_end == scan.stop
        assert scan.stop == base + len(buf) or (cap is not None and scan.count <= cap)
    # the lines just indexed pass the re-check, in C and in Python
    starts = array("q", [o - base for o in offsets] + [scan.stop - base])
    assert _native().check(buf, starts) == check_frames_py(buf, starts) == len(offsets)


@settings(max_examples=300, deadline=None)
@given(buf=any_buffers, starts=st.lists(st.integers(-3, 260) | st.sampled_from([-(2**63), 2**63 - 1]), max_size=6))
def test_native_check_agrees_with_twin_on_any_starts(buf: bytes, starts: list[int]) -> None:
    a = array("q", starts)
    assert _native().check(buf, a) == check_frames_py(buf, a)


def test_c_rejects_invalid_arguments() -> None:
    import kai_es._native._framing as compiled

    ffi, lib = compiled.ffi, compiled.lib
    stop = ffi.new("kai_frame_stop *")
    out = ffi.new("int64_t[]", 4)
    assert lib.kai_frame_index(A, len(A), 0, out, 4, stop) == 1
    assert lib.kai_frame_index(ffi.NULL, 5, 0, out, 4, stop) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_index(A, -1, 0, out, 4, stop) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_index(A, len(A), -1, out, 4, stop) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_index(A, len(A), 2**63 - 2, out, 4, stop) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_index(A, len(A), 0, ffi.NULL, 4, stop) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_index(A, len(A), 0, out, -1, stop) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_index(A, len(A), 0, out, 4, ffi.NULL) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_index(ffi.NULL, 0, 0, ffi.NULL, 0, stop) == 0
    starts = ffi.new("int64_t[]", [0, len(A)])
    assert lib.kai_frame_check(A, len(A), starts, 1) == 1
    assert lib.kai_frame_check(A, len(A), ffi.NULL, 1) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_check(A, -1, starts, 1) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_check(A, len(A), starts, -1) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_check(ffi.NULL, 3, starts, 1) == lib.KAI_FRAME_EINVAL
    assert lib.kai_frame_crc32(5, ffi.NULL, 3) == 5
    assert lib.kai_frame_crc32(5, A, -1) == 5
