"""Compiled extensions of kai-es (built by cffi from ``csrc/``).

``kai_es._native._packer`` and ``kai_es._native._framing`` are produced by
``kai_es/_native/build.py``
(``pip install -e . --no-build-isolation`` or ``python3 setup.py build_ext --inplace``).
This package never imports them eagerly: ``kai_es.scheduling.packing.load_packer``
imports the packer, and raises a clear error if it has not been built;
``kai_es.adapters.framing.load_indexer`` imports the line indexer of the file event
log, and falls back to its pure-Python twin (with a warning in the log) if it has not.
"""

from __future__ import annotations



import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

BUILD_HINT = "build it with `pip install -e . --no-build-isolation` or `python3 kai_es/_native/build.py`"


def load(name: str, *, what: str, abi_function: str, abi_version: int, constants: Mapping[str, int],
         error: type[Exception], module: ModuleType | None = None, advice: str = "") -> ModuleType:
    """`module`, else the extension module `name` imported, once its ABI version
    (`lib.<abi_function>()`) and its `constants` (C name -> the value the Python side assumes)
    match; otherwise `error`, naming what differs and how to rebuild (plus `advice`)."""
    hint = BUILD_HINT + (f"; {advice}" if advice else "")
    if module is None:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise error(f"{what} {name} is not available ({exc}); {hint}") from exc
    lib: Any = module.lib
    version = int(getattr(lib, abi_function)())
    if version != abi_version:
        raise error(f"{name} has ABI version {version}, expected {abi_version}; rebuild it ({hint})")
    wrong = {c: int(getattr(lib, c)) for c, value in constants.items() if int(getattr(lib, c)) != value}
    if wrong:
        expected = {c: constants[c] for c in wrong}
        raise error(f"{name} constants {wrong} disagree with the Python side's {expected}; rebuild it ({hint})")
    return module
