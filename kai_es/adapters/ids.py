"""Id factories: random uuid4 in production; a seeded, deterministic sequence in simulation so a
simulated run's log is reproducible byte for byte."""

from __future__ import annotations

import os

from kai_es.events.factory import name_id


class RandomIds:
    def new_id(self) -> str:
        """A random uuid4 string: exactly what `str(uuid.uuid4())` makes, without the UUID
        object (a third of the cost; the informer takes one per observed event)."""
        b = bytearray(os.urandom(16))
        b[6] = (b[6] & 0x0F) | 0x40  # version 4
        b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
        h = b.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class SeededIds:
    """uuid5(seed, n) for n = 0, 1, 2, ..."""

    def __init__(self, seed: str) -> None:
        self._seed = seed
        self._n = 0

    def new_id(self) -> str:
        self._n += 1
        return name_id(f"{self._seed}#{self._n}")  # = str(uuid.uuid5(NAMESPACE, ...)), 3x cheaper
