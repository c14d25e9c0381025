"""Replay: re-fold a log and re-run every recorded cycle, comparing decisions byte for byte.

Contract:
- For every CycleStarted at position P, the state folded exactly up to P and the configuration
  in force (the last ConfigApplied before P, or an override for "what if") are given to the pure
  `run_cycle`; its output must equal, in canonical bytes and order, the recorded events whose
  `basedon` is P (which include CycleCompleted and its state digest).
- The first difference stops the replay and is reported: the cycle, its position, the index of
  the decision, and both versions. A cycle whose decisions never reached the log (the scheduler
  died between CycleStarted and the decisions) is counted as abandoned, not as a divergence.
- With a config override, decisions are not compared; the re-run decisions are returned so a
  caller can compare outcomes ("what if").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from kai_es.events import Envelope, Record, encode
from kai_es.events import payloads as p
from kai_es.scheduling.config import ConfigError, SchedulerConfig, config_digest, parse_config
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import Packer
from kai_es.state import ClusterState
from kai_es.state.reducer import apply


@dataclass(frozen=True, slots=True)
class Divergence:
    cycle: int
    position: int
    index: int
    message: str
    expected: bytes | None = None
    recorded: bytes | None = None


@dataclass(slots=True)
class ReplayResult:
    records: int = 0
    cycles: int = 0
    decisions: int = 0
    abandoned: int = 0
    divergence: Divergence | None = None
    rerun: dict[int, list[Envelope]] = field(default_factory=dict)
    state: ClusterState = field(default_factory=ClusterState)

    @property
    def ok(self) -> bool:
        return self.divergence is None


def _config_of(state: ClusterState) -> SchedulerConfig:
    try:
        return parse_config(state.config)
    except ConfigError:
        return parse_config({})


def replay(records: Iterable[Record], packer: Packer, *, override: SchedulerConfig | None = None,
           progress: Callable[[int], None] | None = None) -> ReplayResult:
    """Replay `records` (see module docstring)."""
    result = ReplayResult()
    state = result.state
    expected: dict[int, deque[Envelope]] = {}
    cycle_of: dict[int, int] = {}
    planned: dict[int, int] = {}
    for record in records:
        env = record.envelope
        based = env.basedon
        if based is not None and env.type.startswith("kai.scheduler.") and override is None:
            queue = expected.get(based)
            if queue is None:
                result.divergence = Divergence(
                    cycle=-1, position=based, index=0,
                    message=f"record {record.position} claims to be based on position {based}, "
                            f"which is not a cycle start", recorded=encode(env))
                return result
            want = queue.popleft() if queue else None
            got = encode(env)
            if want is None or encode(want) != got:
                result.divergence = Divergence(
                    cycle=cycle_of[based], position=based,
                    index=result.decisions, message=(
                        "the log holds a decision the replay did not make" if want is None
                        else "decision differs"),
                    expected=encode(want) if want is not None else None, recorded=got)
                return result
            result.decisions += 1
            if not queue and isinstance(env.data, p.CycleCompleted):
                del expected[based]
        apply(state, record)
        result.records += 1
        if progress is not None and result.records % 65536 == 0:
            progress(result.records)
        if isinstance(env.data, p.CycleStarted):
            config = override or _config_of(state)
            if override is None and env.data.config_digest != config_digest(config):
                result.divergence = Divergence(
                    cycle=env.data.cycle, position=record.position, index=0,
                    message=f"cycle ran with config {env.data.config_digest}, but the log's config "
                            f"in force is {config_digest(config)}")
                return result
            decisions = run_cycle(state, record, config, packer)
            result.cycles += 1
            cycle_of[record.position] = env.data.cycle
            if override is not None:
                result.rerun[record.position] = decisions
            else:
                expected[record.position] = deque(decisions)
                planned[record.position] = len(decisions)
    for pos, queue in list(expected.items()):
        if queue and len(queue) == planned[pos]:
            result.abandoned += 1  # no decision of it reached the log: the scheduler died mid-cycle
        elif queue:
            result.divergence = Divergence(
                cycle=cycle_of[pos], position=pos, index=result.decisions,
                message=f"the log ends with {len(queue)} decision(s) of this cycle missing",
                expected=encode(queue[0]))
            break
    return result


def describe(div: Divergence) -> str:
    """A readable, multi-line account of a divergence."""
    lines = [f"DIVERGED at cycle {div.cycle} (CycleStarted at position {div.position}), "
             f"decision #{div.index}: {div.message}"]
    if div.expected is not None or div.recorded is not None:
        exp = msgspec.json.decode(div.expected) if div.expected else None
        rec = msgspec.json.decode(div.recorded) if div.recorded else None
        if isinstance(exp, dict) and isinstance(rec, dict):
            for key in sorted(set(exp) | set(rec)):
                if key == "data" and isinstance(exp.get("data"), dict) and isinstance(rec.get("data"), dict):
                    for dk in sorted(set(exp["data"]) | set(rec["data"])):
                        if exp["data"].get(dk) != rec["data"].get(dk):
                            lines.append(f"  data.{dk}: replay={exp['data'].get(dk)!r} log={rec['data'].get(dk)!r}")
                elif exp.get(key) != rec.get(key):
                    lines.append(f"  {key}: replay={exp.get(key)!r} log={rec.get(key)!r}")
        else:
            lines.append(f"  replay: {div.expected!r}")
            lines.append(f"  log:    {div.recorded!r}")
    return "\n".join(lines)
