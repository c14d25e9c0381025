"""Id factories: random uuid4 in production; a seeded, deterministic sequence in simulation so a
simulated run's log is reproducible byte for byte."""

from __future__ import annotations

import uuid

from kai_es.events.factory import name_id


class RandomIds:
    def new_id(self) -> str:
        return str(uuid.uuid4())


class SeededIds:
    """uuid5(seed, n) for n = 0, 1, 2, ..."""

    def __init__(self, seed: str) -> None:
        self._seed = seed
        self._n = 0

    def new_id(self) -> str:
        self._n += 1
        return name_id(f"{self._seed}#{self._n}")  # = str(uuid.uuid5(NAMESPACE, ...)), 3x cheaper
