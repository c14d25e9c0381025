"""A scan of a file log does not keep the file resident: the pages of the map it has read (and
indexed at open) are given back (`madvise(MADV_DONTNEED)`), so folding a 540 MB log does not add
540 MB to the reader's resident set (the what-if's and the summary's peak memory). The records
read are the same, and reading them again works (the pages fault back in from the file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kai_es.adapters.file_log import FileEventLog, frame
from kai_es.events import encode
from tests.log_contract import event

SMAPS = Path("/proc/self/smaps")


def resident_kib(path: Path) -> int:
    """This process's resident KiB of every mapping of `path` (Linux smaps)."""
    total, inside = 0, False
    for text in SMAPS.read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", text):
            inside = text.endswith(" " + str(path))
        elif inside and text.startswith("Rss:"):
            total += int(text.split()[1])
    return total


@pytest.mark.skipif(not SMAPS.exists(), reason="needs Linux /proc/self/smaps")
def test_a_scan_gives_back_the_pages_it_read(tmp_path: Path) -> None:
    path = tmp_path / "events.log"
    lines = [frame(encode(event(i))) for i in range(40_000)]
    path.write_bytes(b"".join(lines))
    size_kib = path.stat().st_size // 1024
    assert size_kib > 4_000  # several MB: far more than the pages a chunk boundary can leave
    log = FileEventLog(path, readonly=True)
    assert resident_kib(path) < size_kib // 8  # indexing at open touched every page
    first = [r.envelope for r in log.scan()]
    assert len(first) == 40_000
    assert resident_kib(path) < size_kib // 8  # and so did the scan
    assert [r.envelope for r in log.scan()] == first  # read again: the same records
