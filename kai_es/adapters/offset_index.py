"""Where each line of the file event log starts, in memory that does not grow with the log.

A long-running process on the file log (the scheduler, the binder) reads forward from its
position, but the log keeps growing: an offset per line (8 bytes an event) was the only memory
of such a process that grew with the pods it handled (tools/bench/bench_memory_process.py).
`OffsetIndex` keeps the offsets of the newest lines (at least `dense_lines`, a read of them is
a slice) and, for older ones, a mark at a batch's first line every `mark_every` lines or more;
reading older lines indexes the stretch between two marks again (`LineIndexer.index`, CRC
checked), which costs about what verifying it at open did.

Contract:
- `dense` holds the offsets of positions [dense_from, count), `dense[0]` (if any) is the first
  line of a batch; callers (the file log) append to it, the indexer included, and call
  `compact` when `needs_compaction`.
- Marks are at batch starts, so the lines between two marks (or a mark and `dense_from`) are
  whole batches and an index of them with `cap` = their count returns all of them.
- `starts(m, pos, stop)` gives the offsets of [pos, stop) and the end of line stop - 1, as the
  file log's reads need them; a stretch that no longer indexes as it did (the file changed
  after it was verified) raises `IndexChanged` with the first position that does not.
"""

from __future__ import annotations

import bisect
from array import array

from kai_es.adapters.framing import ENDS, HEAD, Buffer, LineIndexer

__all__ = ["DENSE_LINES", "MARK_EVERY", "IndexChanged", "OffsetIndex"]

#: the newest lines whose offsets are kept (at least; up to twice as many between compactions)
DENSE_LINES = 1 << 16
#: the fewest lines between two marks of the older lines
MARK_EVERY = 1024


class IndexChanged(Exception):
    """A stretch of older lines no longer indexes as it did when it was verified."""

    def __init__(self, position: int) -> None:
        super().__init__(f"the lines from position {position} changed after they were verified")
        self.position = position


class OffsetIndex:
    __slots__ = ("_indexer", "dense_lines", "mark_every", "dense", "dense_from", "_mark_pos", "_mark_byte")

    def __init__(self, indexer: LineIndexer, *, dense_lines: int = DENSE_LINES, mark_every: int = MARK_EVERY) -> None:
        if dense_lines < 1 or mark_every < 1:
            raise ValueError("dense_lines and mark_every must be positive")
        self._indexer = indexer
        self.dense_lines = dense_lines
        self.mark_every = mark_every
        self.dense: array[int] = array("q")
        self.dense_from = 0
        self._mark_pos: array[int] = array("q")
        self._mark_byte: array[int] = array("q")

    @property
    def count(self) -> int:
        """The number of lines indexed."""
        return self.dense_from + len(self.dense)

    @property
    def needs_compaction(self) -> bool:
        return len(self.dense) > 2 * self.dense_lines

    def memory_bytes(self) -> int:
        """What the offsets and marks take (8 bytes each), for tests and benchmarks."""
        return 8 * (len(self.dense) + len(self._mark_pos) + len(self._mark_byte))

    def compact(self, m: Buffer) -> None:
        """Keep the offsets of the newest `dense_lines` lines or a few more (from a batch start),
        leaving marks for the older ones. `m` maps the file from byte 0 over the dense lines."""
        dense = self.dense
        cut = len(dense) - self.dense_lines
        while cut > 0 and m[dense[cut - 1] + HEAD - 1] != ENDS:  # back to a batch's first line
            cut -= 1
        if cut <= 0:
            return  # one batch holds the whole window: keep it
        # the first mark: `mark_every` lines past the last one (a batch start at or after it), so
        # marks stay that far apart across compactions too, not one more at each compaction's start
        i = max(0, self._mark_pos[-1] + self.mark_every - self.dense_from) if self._mark_pos else 0
        while 0 < i < cut and m[dense[i - 1] + HEAD - 1] != ENDS:
            i += 1
        while i < cut:
            self._mark_pos.append(self.dense_from + i)
            self._mark_byte.append(dense[i])
            i += self.mark_every
            while i < cut and m[dense[i - 1] + HEAD - 1] != ENDS:
                i += 1
        self.dense = dense[cut:]
        self.dense_from += cut

    def byte_of(self, position: int, end: int) -> int:
        """The offset of `position` if it is a mark, `dense_from` or later; `end` (the end of
        the indexed lines) for `count`."""
        if position >= self.count:
            return end
        if position >= self.dense_from:
            return self.dense[position - self.dense_from]
        j = bisect.bisect_left(self._mark_pos, position)
        assert j < len(self._mark_pos) and self._mark_pos[j] == position, position
        return self._mark_byte[j]

    def first_line_past(self, size: int) -> int:
        """The position of the first indexed line that does not end within `size` bytes (at a
        mark's precision for older lines)."""
        if self.dense and size >= self.dense[0]:
            return self.dense_from + max(0, bisect.bisect_right(self.dense, size) - 1)
        j = bisect.bisect_right(self._mark_byte, size) - 1
        return 0 if j < 0 else self._mark_pos[j]

    def segment_end(self, position: int) -> int:
        """The position where the stretch holding older line `position` ends: the next mark,
        or `dense_from`."""
        j = bisect.bisect_right(self._mark_pos, position)
        return self._mark_pos[j] if j < len(self._mark_pos) else self.dense_from

    def extent(self, stop: int, end: int) -> int:
        """How far into the file `starts(m, pos, stop, end)` reads: the end of line stop - 1, or
        of the older stretch holding it (0 < stop <= count)."""
        last = stop - 1
        if last >= self.dense_from:
            return self.dense[stop - self.dense_from] if stop < self.count else end
        return self.byte_of(self.segment_end(last), end)

    def starts(self, m: Buffer, pos: int, stop: int, end: int) -> array[int]:
        """The offsets of lines [pos, stop) and the end of line stop - 1 (stop - pos + 1
        entries); 0 <= pos < stop <= count, `end` is the end of the indexed lines and `m` maps
        the file from byte 0 up to the end of line stop - 1 (older stretches are read up to
        their end)."""
        out: array[int] = array("q")
        p = pos
        last = end
        while p < min(stop, self.dense_from):
            j = bisect.bisect_right(self._mark_pos, p) - 1
            seg_pos, seg_end = self._mark_pos[j], self.segment_end(p)
            seg_stop = self.byte_of(seg_end, end)
            found: array[int] = array("q")
            scan = self._indexer.index(m, found, start=self._mark_byte[j], cap=seg_end - seg_pos)
            if scan.count != seg_end - seg_pos or scan.stop != seg_stop:
                raise IndexChanged(seg_pos + scan.count)
            hi = min(stop, seg_end)
            out.extend(found[p - seg_pos:hi - seg_pos])
            last = found[hi - seg_pos] if hi < seg_end else seg_stop
            p = hi
        if p < stop:
            out.extend(self.dense[p - self.dense_from:stop - self.dense_from])
            last = self.dense[stop - self.dense_from] if stop < self.count else end
        out.append(last)
        return out
