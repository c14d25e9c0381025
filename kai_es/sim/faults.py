"""The faults of a deterministic simulation run, drawn from one seed.

A `FaultPlan` is the only source of randomness of a run (`kai_es.app.dst`): every fault is a
roll of its `random.Random(seed)`, made in the order the run reaches the points where a fault
may happen, so the same seed, mix and scenario give the same faults at the same places — and,
the services being deterministic, the same log byte for byte.

Rates are per mille (integers, as every quantity here): a rate of 20 makes the fault happen at
one in fifty of the points where it can.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar, get_args

#: Every fault the run can inject, by where it happens:
#: - crash: a process dies at an await point of a port it calls (a log append — before or after
#:   the records are visible —, a read after some records, an apiserver call before or after it
#:   took effect, a snapshot or progress save); it restarts after a pause, from its durable state.
#: - pause: the scheduler stops past its lease (SIGSTOP); a standby takes over, claims the log's
#:   writer identity and leads; the old one wakes later, fenced.
#: - duplicate_outcomes: the log keeps a binder append twice (a producer retry without
#:   idempotence); delay_outcomes: the binder's append waits a few steps while others write.
#: - lose_watch: the informer's watch drops a change, then fails with 410 Gone and relists the kind.
#: - api_conflict, api_throttled, api_error, api_timeout: the apiserver answers a bind or an
#:   eviction with 409, 429, 500 or no answer (a timeout after it applied the request, half of
#:   the time), as `KubernetesActuator` reports each (see `kai_es.sim.faulty.FaultyActuator`).
#: - refuse_eviction: a PodDisruptionBudget refuses an eviction (retryable 429).
#: - delete_node: the node a bind is going to is deleted just before the bind.
#: - delete_pod: the pod a bind or an eviction is for is deleted just before it.
#: - torn_append: on the file log only (a run over the memory log never rolls it), a process dies
#:   in the middle of an append's write: any prefix of its bytes is in the file, whole lines of it
#:   too, and the rest never comes.
FaultKind = Literal["crash", "pause", "duplicate_outcomes", "delay_outcomes", "lose_watch",
                    "api_conflict", "api_throttled", "api_error", "api_timeout", "refuse_eviction",
                    "delete_node", "delete_pod", "torn_append"]
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)

#: the mix `tools/dst.py` and the tests start from: every fault, rare enough that runs progress
DEFAULT_MIX: Mapping[FaultKind, int] = {
    "crash": 15, "pause": 4, "duplicate_outcomes": 40, "delay_outcomes": 60, "lose_watch": 40,
    "api_conflict": 15, "api_throttled": 20, "api_error": 20, "api_timeout": 20,
    "refuse_eviction": 60, "delete_node": 4, "delete_pod": 8, "torn_append": 15,
}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FaultMix:
    """Per-mille rate of each fault kind (absent: 0). Rates must be 0..1000."""

    rates: Mapping[FaultKind, int] = field(default_factory=lambda: dict(DEFAULT_MIX))

    def __post_init__(self) -> None:
        for kind, rate in self.rates.items():
            if kind not in FAULT_KINDS:
                raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(FAULT_KINDS)})")
            if not isinstance(rate, int) or isinstance(rate, bool) or not 0 <= rate <= 1000:
                raise ValueError(f"fault rate of {kind} must be an integer per mille in 0..1000, got {rate!r}")

    def rate(self, kind: FaultKind) -> int:
        return self.rates.get(kind, 0)

    @classmethod
    def parse(cls, text: str) -> FaultMix:
        """`kind=rate,kind=rate` over the default mix; `none` for no fault, `default` for it."""
        rates: dict[FaultKind, int] = dict(DEFAULT_MIX)
        for part in (s.strip() for s in text.split(",")):
            if not part or part == "default":
                continue
            if part == "none":
                rates = {}
                continue
            kind, sep, value = part.partition("=")
            if not sep or not value.strip().isdigit():
                raise ValueError(f"fault mix entry {part!r} is not kind=rate (rate per mille)")
            if kind.strip() not in FAULT_KINDS:
                raise ValueError(f"unknown fault kind {kind.strip()!r} (known: {', '.join(FAULT_KINDS)})")
            rates[kind.strip()] = int(value)  # type: ignore[index]
        return cls(rates)


class Crash(BaseException):
    """A simulated process death: raised at an await point, caught only by the run's driver (a
    BaseException, so no `except Exception` in a service mistakes it for an error to handle)."""

    def __init__(self, role: str, where: str) -> None:
        super().__init__(f"{role} crashed at {where}")
        self.role, self.where = role, where


class FaultPlan:
    """The run's seeded rolls, and a count of the faults injected by kind (and where)."""

    def __init__(self, seed: int, mix: FaultMix, *, enabled: bool = True) -> None:
        self.seed = seed
        self.mix = mix
        self.rng = random.Random(seed)
        #: faults are injected only while enabled (the run turns them off to settle at the end)
        self.enabled = enabled
        self.injected: Counter[str] = Counter()

    def roll(self, kind: FaultKind, where: str = "") -> bool:
        """True (and counted) when fault `kind` happens at this point."""
        rate = self.mix.rate(kind)
        if not self.enabled or rate <= 0:
            return False
        if self.rng.randrange(1000) >= rate:
            return False
        self.injected[kind] += 1
        if where:
            self.injected[f"{kind}@{where}"] += 1
        return True

    def crash_point(self, role: str, where: str) -> None:
        """Raise `Crash` here when a crash is rolled."""
        if self.roll("crash", f"{role}.{where}"):
            raise Crash(role, where)

    def coin(self) -> bool:
        return self.rng.randrange(2) == 0

    def between(self, low: int, high: int) -> int:
        """An integer in [low, high] (inclusive)."""
        return self.rng.randint(low, high)

    def choice(self, items: Sequence[T]) -> T:
        return items[self.rng.randrange(len(items))]

    def shuffled(self, items: Sequence[T]) -> list[T]:
        out = list(items)
        self.rng.shuffle(out)
        return out
