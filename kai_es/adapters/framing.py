"""Indexing the lines of the file event log: a C fast path and its pure-Python twin.

A line of the log is `<8 hex digits: CRC-32 of BODY>\\t<BODY>\\n`, which ends a batch, or
`<8 hex digits: CRC-32 of "+" BODY>+<BODY>\\n`, which another line of the same batch follows
(`kai_es.adapters.file_log`: one append is one batch). Indexing a buffer of such lines means:
walk them from a start offset, record where each valid line of a WHOLE batch begins, and stop at
the first line that is not valid, saying why (`Reason`) and where it ends, so the caller can tell
a torn last batch from corruption in the middle. The lines of a batch that has not ended are
never handed out: a buffer that ends inside a batch ends NOT_TERMINATED at the batch's start (a
torn append, or another writer's append in progress), and an invalid line inside a batch stops
the scan at the batch's start (the batch is not whole, so none of it counts).

Two indexers give identical answers:

* `NativeIndexer` -- `kai_frame_index` of `csrc/framing.c` through cffi (`kai_es._native._framing`);
* `PythonIndexer` -- the pure-Python twin and executable specification (`index_frames_py`).

`load_indexer()` picks one. The file log's default, `kind="auto"`, is the native indexer and
falls back to the twin (with a warning in the log) only when the extension is not built, or
was built from other sources (ABI mismatch); `kind="native"` raises `NativeIndexerUnavailable`
instead, and a test fails if the native indexer is not the one in use.
"""

from __future__ import annotations

import enum
import functools
import logging
import mmap
import re
import sys
import zlib
from array import array
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Protocol

from kai_es._native import load

__all__ = [
    "ABI_VERSION",
    "CRC_OF_PLUS",
    "ENDS",
    "GOES_ON",
    "HEAD",
    "MIN_LINE",
    "NATIVE_MODULE",
    "Buffer",
    "FrameScan",
    "IndexerKind",
    "LineIndexer",
    "NativeIndexer",
    "NativeIndexerUnavailable",
    "PythonIndexer",
    "Reason",
    "check_frames_py",
    "default_indexer",
    "import_native",
    "index_frames_py",
    "line_reason",
    "load_indexer",
]

log = logging.getLogger(__name__)

NATIVE_MODULE = "kai_es._native._framing"
ABI_VERSION = 2

HEAD = 9  # 8 hex digits and the separator: a tab (the batch ends) or "+" (it goes on)
MIN_LINE = 10  # the head and the newline: an empty body
_INT64_MAX = (1 << 63) - 1
_CHUNK = 1 << 16  # offsets handed back by one native call
ENDS = 0x09  # b"\\t": the line ends its batch
GOES_ON = 0x2B  # b"+": the batch goes on
CRC_OF_PLUS = zlib.crc32(b"+")  # where the CRC of a "+" line starts from

Buffer = bytes | bytearray | mmap.mmap
"""What the indexers read: anything with `find` (the twin needs it) and the buffer protocol."""


class Reason(enum.IntEnum):
    """Why a line is not valid (the values are `enum kai_frame_reason` of `csrc/framing.h`)."""

    OK = 0
    NOT_TERMINATED = 1
    NO_FRAME = 2
    BAD_HEX = 3
    CRC_MISMATCH = 4

    @property
    def message(self) -> str:
        return _MESSAGES[self]


_MESSAGES = {
    Reason.OK: "ok",
    Reason.NOT_TERMINATED: "the last append is not complete (write was cut short)",
    Reason.NO_FRAME: "line has no CRC frame",
    Reason.BAD_HEX: "CRC field is not hexadecimal",
    Reason.CRC_MISMATCH: "CRC mismatch",
}


@dataclass(frozen=True, slots=True)
class FrameScan:
    """Where an index call stopped; byte offsets are absolute (`base` added)."""

    count: int  # valid lines of whole batches appended to the offsets
    stop: int  # the end of those lines: where the first invalid line, or the batch holding it, starts
    line_end: int  # reason != OK: the end of that invalid line (past its newline, or the buffer's end)
    reason: Reason  # OK: the buffer is exhausted (stop == its end) or `cap` lines were read

    # A buffer that ends inside a batch (its last valid line is a "+" line) is NOT_TERMINATED with
    # `stop` at the batch's start and `line_end` at the buffer's end. `cap` counts lines read, so a
    # call that hits it mid-batch returns fewer lines (stop at the batch's start); a batch longer
    # than `cap` is never handed out: give a larger cap (None: no limit).


class NativeIndexerUnavailable(ImportError):
    """The compiled module `kai_es._native._framing` is not built or does not match."""


class LineIndexer(Protocol):
    """Appends the start of every valid line of the whole batches of `buf[start:]` to `offsets`,
    as `base + index` (see `FrameScan`)."""

    @property
    def kind(self) -> str: ...

    def index(self, buf: Buffer, offsets: array[int], *, start: int = 0, base: int = 0,
              cap: int | None = None) -> FrameScan:
        """At most `cap` lines (None: no limit); raises ValueError/TypeError for bad arguments."""
        ...

    def check(self, buf: Buffer, starts: array[int]) -> int:
        """The first i whose line [starts[i], starts[i + 1]) of `buf` no longer looks like a
        verified line (see `check_frames_py`), or len(starts) - 1 if none."""
        ...


def _check_offsets(name: str, offsets: array[int]) -> None:
    if not isinstance(offsets, array) or offsets.typecode != "q":
        raise TypeError(f"{name} must be array('q'), got {type(offsets).__name__}")


def _check_args(buf: Buffer, offsets: array[int], start: int, base: int, cap: int | None) -> None:
    # These checks are what keep the C code inside its buffers: make them before the boundary.
    _check_offsets("offsets", offsets)
    if not 0 <= start <= len(buf):
        raise ValueError(f"start {start} is outside the buffer (0..{len(buf)})")
    if base < 0 or base > _INT64_MAX - (len(buf) - start):
        raise ValueError(f"base {base} is negative or overflows int64 at the buffer's end")
    if cap is not None and cap < 0:
        raise ValueError(f"cap {cap} is negative")


# ----------------------------------------------------------------------------- the twin

_HEX8 = re.compile(rb"[0-9a-fA-F]{8}")


def line_reason(line: bytes) -> Reason:
    """Why one line (with its newline) is not a valid frame; OK if it is. Its batch is not
    looked at: a valid "+" line is OK alone."""
    if not line.endswith(b"\n"):
        return Reason.NOT_TERMINATED
    with memoryview(line) as view:
        return _line_reason(line, view, 0, len(line))


def _line_reason(buf: Buffer, view: memoryview, start: int, end: int) -> Reason:
    """Why the terminated line buf[start:end] (its last byte is the newline) is not valid."""
    if end - start < MIN_LINE:
        return Reason.NO_FRAME
    separator = buf[start + HEAD - 1]
    if separator == ENDS:
        seed = 0
    elif separator == GOES_ON:
        seed = CRC_OF_PLUS
    else:
        return Reason.NO_FRAME
    digits = buf[start:start + HEAD - 1]
    if _HEX8.fullmatch(digits) is None:
        return Reason.BAD_HEX
    if zlib.crc32(view[start + HEAD:end - 1], seed) != int(digits, 16):
        return Reason.CRC_MISMATCH
    return Reason.OK


def _whole_batches(offsets: array[int], first: int, read: int, committed: int, committed_end: int,
                   scan: FrameScan, exhausted: bool) -> FrameScan:
    """`scan` (of `read` lines appended to `offsets` from index `first`) cut back to its whole
    batches: the first `committed` lines, which end at `committed_end`; `exhausted`: the scan
    stopped at the buffer's end with reason OK."""
    if committed == read:
        return scan
    del offsets[first + committed:]
    if scan.reason is not Reason.OK:
        return FrameScan(committed, committed_end, scan.line_end, scan.reason)
    if exhausted:  # the buffer ends inside a batch
        return FrameScan(committed, committed_end, scan.stop, Reason.NOT_TERMINATED)
    return FrameScan(committed, committed_end, committed_end, Reason.OK)  # `cap` hit mid-batch


def index_frames_py(buf: Buffer, offsets: array[int], *, start: int = 0, base: int = 0,
                    cap: int | None = None) -> FrameScan:
    """The executable specification of `kai_frame_index` (`csrc/framing.h`) on `buf[start:]`.

    Same as the C function called with `(buf + start, len(buf) - start, base + start, ...)`,
    except that it appends to `offsets` rather than writing into a caller's array."""
    _check_args(buf, offsets, start, base, cap)
    limit = sys.maxsize if cap is None else cap
    length = len(buf)
    first = len(offsets)
    pos = start
    count = committed = 0
    committed_end = base + start
    scan: FrameScan | None = None
    with memoryview(buf) as view:
        while pos < length and count < limit:
            newline = buf.find(b"\n", pos)
            if newline < 0:
                scan = FrameScan(count, base + pos, base + length, Reason.NOT_TERMINATED)
                break
            end = newline + 1
            reason = _line_reason(buf, view, pos, end)
            if reason is not Reason.OK:
                scan = FrameScan(count, base + pos, base + end, reason)
                break
            offsets.append(base + pos)
            count += 1
            if buf[pos + HEAD - 1] == ENDS:
                committed, committed_end = count, base + end
            pos = end
    if scan is None:
        scan = FrameScan(count, base + pos, base + pos, Reason.OK)
    return _whole_batches(offsets, first, count, committed, committed_end, scan, pos == length)


def check_frames_py(buf: Buffer, starts: array[int]) -> int:
    """The executable specification of `kai_frame_check`: the first i whose line
    [starts[i], starts[i + 1]) is not inside `buf`, is shorter than MIN_LINE, or has no tab or
    "+" at byte 8 or no newline at its end; len(starts) - 1 if none. The CRC is not recomputed."""
    _check_offsets("starts", starts)
    length = len(buf)
    n = max(0, len(starts) - 1)
    for i in range(n):
        s, e = starts[i], starts[i + 1]
        if s < 0 or e > length or e - s < MIN_LINE or buf[s + HEAD - 1] not in (ENDS, GOES_ON) \
                or buf[e - 1] != 0x0A:
            return i
    return n


class PythonIndexer:
    """`index_frames_py` and `check_frames_py` behind the `LineIndexer` protocol."""

    __slots__ = ()

    @property
    def kind(self) -> str:
        return "python"

    def index(self, buf: Buffer, offsets: array[int], *, start: int = 0, base: int = 0,
              cap: int | None = None) -> FrameScan:
        return index_frames_py(buf, offsets, start=start, base=base, cap=cap)

    def check(self, buf: Buffer, starts: array[int]) -> int:
        return check_frames_py(buf, starts)


# ----------------------------------------------------------------------------- the C fast path

def import_native(module: ModuleType | None = None) -> ModuleType:
    """`kai_es._native._framing` (or `module`), checked against this side's ABI version and
    constants, or raise `NativeIndexerUnavailable`."""
    return load(NATIVE_MODULE, what="native line indexer", abi_function="kai_frame_abi_version",
                abi_version=ABI_VERSION, error=NativeIndexerUnavailable, module=module,
                constants={"KAI_FRAME_HEAD": HEAD, "KAI_FRAME_MIN_LINE": MIN_LINE,
                           **{f"KAI_FRAME_{r.name}": r.value for r in Reason}})


class NativeIndexer:
    """Indexing through the compiled `kai_frame_index`."""

    __slots__ = ("_module", "_ffi", "_lib")

    def __init__(self, module: ModuleType | None = None) -> None:
        mod = import_native(module)
        self._module = mod
        self._ffi: Any = mod.ffi
        self._lib: Any = mod.lib

    @property
    def kind(self) -> str:
        return "native"

    @property
    def module(self) -> ModuleType:
        """The loaded extension module (`kai_es._native._framing`)."""
        return self._module

    def crc32(self, data: bytes, crc: int = 0, *, tables_only: bool = False) -> int:
        """zlib.crc32 computed by `kai_frame_crc32` (or `kai_frame_crc32_tables`), for tests."""
        fn = self._lib.kai_frame_crc32_tables if tables_only else self._lib.kai_frame_crc32
        return int(fn(crc, data, len(data)))

    def index(self, buf: Buffer, offsets: array[int], *, start: int = 0, base: int = 0,
              cap: int | None = None) -> FrameScan:
        _check_args(buf, offsets, start, base, cap)
        limit = sys.maxsize if cap is None else cap
        length = len(buf)
        if start == length or limit == 0:
            return FrameScan(0, base + start, base + start, Reason.OK)
        ffi, lib = self._ffi, self._lib
        chunk = min(_CHUNK, limit, (length - start) // MIN_LINE + 1)
        out = ffi.new("int64_t[]", chunk)
        stop = ffi.new("kai_frame_stop *")
        first = len(offsets)
        count = committed = 0
        committed_end = base + start
        pos = start
        # The buffer stays exported (an mmap cannot be closed) until the C calls are done; the
        # GIL is released during each call.
        with ffi.from_buffer("unsigned char[]", buf) as p:
            while True:
                n = int(lib.kai_frame_index(p + pos, length - pos, base + pos, out, min(chunk, limit - count), stop))
                if n < 0:  # the arguments were checked above: this is a bug
                    raise ValueError(f"kai_frame_index rejected its arguments (code {n})")
                offsets.frombytes(ffi.buffer(out, 8 * n))
                if stop.committed > 0:
                    committed, committed_end = count + int(stop.committed), int(stop.committed_end)
                count += n
                pos = int(stop.offset) - base
                if stop.reason != Reason.OK or pos == length or count == limit:
                    break
        scan = FrameScan(count, int(stop.offset), int(stop.line_end), Reason(stop.reason))
        return _whole_batches(offsets, first, count, committed, committed_end, scan, pos == length)

    def check(self, buf: Buffer, starts: array[int]) -> int:
        _check_offsets("starts", starts)
        n = len(starts) - 1
        if n <= 0:
            return 0
        ffi = self._ffi
        with ffi.from_buffer("unsigned char[]", buf) as p, ffi.from_buffer("int64_t[]", starts) as q:
            found = int(self._lib.kai_frame_check(p, len(buf), q, n))
        if found < 0:  # the arguments were checked above: this is a bug
            raise ValueError(f"kai_frame_check rejected its arguments (code {found})")
        return found


# ----------------------------------------------------------------------------- choosing one

IndexerKind = Literal["auto", "native", "python"]


def load_indexer(kind: IndexerKind = "auto") -> LineIndexer:
    """`"native"`: `NativeIndexer`, or raise `NativeIndexerUnavailable`. `"python"`: the twin.
    `"auto"`: the native indexer if it is built, else the twin with a warning in the log."""
    if kind == "native":
        return NativeIndexer()
    if kind == "python":
        return PythonIndexer()
    if kind == "auto":
        try:
            return NativeIndexer()
        except NativeIndexerUnavailable as exc:
            log.warning("%s; the file event log indexes with the pure-Python twin (several times slower)", exc)
            return PythonIndexer()
    raise ValueError(f"unknown indexer kind {kind!r}: expected 'auto', 'native' or 'python'")


@functools.cache
def default_indexer() -> LineIndexer:
    """`load_indexer("auto")`, loaded (and warned about) once per process."""
    return load_indexer("auto")
