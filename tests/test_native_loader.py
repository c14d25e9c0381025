"""A compiled module built from other sources than this Python side is refused with a reason."""

from __future__ import annotations

import types

import pytest

from kai_es.adapters.framing import NativeIndexer, NativeIndexerUnavailable
from kai_es.adapters.framing import import_native as import_framing
from kai_es.scheduling.packing import NativePacker, NativePackerUnavailable
from kai_es.scheduling.packing.native import ABI_VERSION as PACKER_ABI
from kai_es.scheduling.packing.native import import_native as import_packer


def _stale(real: types.ModuleType, **override: object) -> types.SimpleNamespace:
    lib = types.SimpleNamespace(**{n: getattr(real.lib, n) for n in dir(real.lib)})
    for name, value in override.items():
        setattr(lib, name, value)
    return types.SimpleNamespace(lib=lib, ffi=real.ffi)


def test_an_old_abi_version_is_refused_with_how_to_rebuild() -> None:
    with pytest.raises(NativePackerUnavailable, match=f"ABI version 1, expected {PACKER_ABI}; rebuild it .*build.py"):
        NativePacker(_stale(import_packer(), kai_pack_abi_version=lambda: 1))  # type: ignore[arg-type]
    with pytest.raises(NativeIndexerUnavailable, match="ABI version 9, expected 2"):
        NativeIndexer(_stale(import_framing(), kai_frame_abi_version=lambda: 9))  # type: ignore[arg-type]


def test_a_disagreeing_constant_is_named() -> None:
    with pytest.raises(NativePackerUnavailable, match=r"\{'KAI_PACK_MAX_SHAPES': 7\} disagree"):
        NativePacker(_stale(import_packer(), KAI_PACK_MAX_SHAPES=7))  # type: ignore[arg-type]
    with pytest.raises(NativeIndexerUnavailable, match=r"\{'KAI_FRAME_HEAD': 10\} disagree"):
        NativeIndexer(_stale(import_framing(), KAI_FRAME_HEAD=10))  # type: ignore[arg-type]
