"""cffi out-of-line API-mode builder for ``kai_es._native._framing``.

The declarations handed to ``cdef()`` are the block between the
``/* CDEF-BEGIN */`` and ``/* CDEF-END */`` markers of ``csrc/framing.h``, so the
header is the single source of truth for the ABI.

Used by ``setup.py`` (``cffi_modules=["kai_es/_native/build_framing.py:ffibuilder"]``);
``python3 kai_es/_native/build_framing.py`` also builds the module in place.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
HEADER = CSRC / "framing.h"
SOURCE = CSRC / "framing.c"

_CDEF_RE = re.compile(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", re.S)


def read_cdef(header: Path = HEADER) -> str:
    """Return the cffi-parsable declarations of ``framing.h``."""
    match = _CDEF_RE.search(header.read_text(encoding="utf-8"))
    if match is None:
        raise RuntimeError(f"{header}: CDEF-BEGIN/CDEF-END markers not found")
    return match.group(1)


def _rel(path: Path) -> str:
    # setuptools wants sources relative to the setup.py directory (the cwd
    # during a build); fall back to absolute paths when built from elsewhere.
    try:
        return os.path.relpath(path, os.getcwd())
    except ValueError:  # pragma: no cover - different drive on Windows
        return str(path)


ffibuilder = FFI()
ffibuilder.cdef(read_cdef())
ffibuilder.set_source(
    "kai_es._native._framing",
    '#include "framing.h"\n',
    sources=[_rel(SOURCE)],
    include_dirs=[_rel(CSRC)],
    depends=[_rel(HEADER)],
    extra_compile_args=["-O2", "-std=c99"],
)

if __name__ == "__main__":  # pragma: no cover - manual build helper
    os.chdir(ROOT)
    ffibuilder.compile(tmpdir=str(ROOT), verbose=True)
