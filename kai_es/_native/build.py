"""cffi out-of-line API-mode builders for ``kai_es._native._packer`` (``packer_ffi``) and
``kai_es._native._framing`` (``framing_ffi``).

Each module's declarations handed to ``cdef()`` are the block between the ``/* CDEF-BEGIN */``
and ``/* CDEF-END */`` markers of its header in ``csrc/``, so the header is the single source of
truth for its ABI.

Used by ``setup.py`` (``cffi_modules=["kai_es/_native/build.py:packer_ffi", ...]``);
``python3 kai_es/_native/build.py`` also builds both modules in place.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"

_CDEF_RE = re.compile(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", re.S)


def read_cdef(header: Path) -> str:
    """Return the cffi-parsable declarations of `header`."""
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


def builder(name: str) -> FFI:
    """The builder of ``kai_es._native._<name>`` from ``csrc/<name>.h`` and ``csrc/<name>.c``."""
    header, source = CSRC / f"{name}.h", CSRC / f"{name}.c"
    ffi = FFI()
    ffi.cdef(read_cdef(header))
    ffi.set_source(
        f"kai_es._native._{name}",
        f'#include "{name}.h"\n',
        sources=[_rel(source)],
        include_dirs=[_rel(CSRC)],
        depends=[_rel(header)],
        extra_compile_args=["-O2", "-std=c99"],
    )
    return ffi


packer_ffi = builder("packer")
framing_ffi = builder("framing")

if __name__ == "__main__":  # pragma: no cover - manual build helper
    os.chdir(ROOT)
    for ffi in (packer_ffi, framing_ffi):
        ffi.compile(tmpdir=str(ROOT), verbose=True)
