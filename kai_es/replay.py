"""Replay: re-fold a log and re-run every recorded cycle, comparing decisions byte for byte.

Contract:
- For every CycleStarted at position P, the state folded exactly up to P and the configuration
  in force (the last ConfigApplied before P, or an override for "what if") are given to the pure
  `run_cycle` (a config in force that does not validate, e.g. names an unknown policy version,
  is a divergence at that cycle); its output must equal, in canonical bytes and order, the recorded events whose
  `basedon` is P (which include CycleCompleted and its state digest).
- The first difference stops the replay and is reported: the cycle, its position, the index of
  the decision, the position of the record where it was found, and both versions. A cycle whose
  decisions never reached the log (the scheduler died between CycleStarted and the decisions) is
  counted as abandoned, not as a divergence.
- With a config override, decisions are not compared; the re-run decisions are returned so a
  caller can compare outcomes ("what if").
- A `Share` restricts which cycles are re-run (those starting in [start, stop)); the rest are
  only folded. A shared replay stops reading once it is past `stop` and its own cycles are all
  complete. Shares that cover a log between them find, together, exactly what one unshared
  replay finds (see `merge`): this is how `kai_es.replay_parallel` splits a replay over cores.
- A share may resume from a state folded exactly to its `start` (a checkpoint: a CycleStarted
  position) instead of folding the log from 0; it then reads from `start`, and checks the binder
  outcomes that name decisions made before `start` at its end, against those decisions as
  `lookup` finds them in the log. A record based on a cycle before `start` stops it with
  `needs_prefix` set: only a share that folded the prefix can judge it. The share before it
  gets `stop_digest`, the state digest recorded at that cut: it folds through `stop` and, if
  its state's digest differs, re-runs that cycle itself, so a divergence there is found as one
  process finds it.
- `replay_frames` reads canonical bodies instead of decoded records: a body equal to the next
  decision the replay expects is not decoded again (the replay's own envelope is folded), which
  changes nothing but speed, since equal canonical bytes mean equal events.
- A binder outcome (PodBound, PodBindFailed, PodEvicted, PodEvictionFailed) must perform a decision recorded
  earlier in the log (its `decision_id`), of the matching kind, for the same pod (namespace,
  name, uid) and node, at a logical time no earlier than the decision's. An outcome that does
  not is impossible for a correct binder (a pod or node that never existed, time running back),
  however valid its CRC: the replay stops there with a Divergence of cycle -1 naming the record.
- The result says how far it got: `last_position` (the last record read) and `abandoned_at`
  (the CycleStarted positions of abandoned cycles), so a caller can tell a log that ends inside
  a cycle from one that does not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from kai_es.events import DecodeError, Envelope, Record, decode, encode
from kai_es.events import payloads as p
from kai_es.scheduling.config import ConfigError, SchedulerConfig, config_digest, parse_config
from kai_es import verify_mode
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import Packer
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from kai_es.scheduling.policy import state_digest

#: where a divergence found only when the log ended is said to be found
AT_END = 2**62


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first difference: cycle number and CycleStarted position, the decision's index within
    that cycle, what is wrong, both encodings, and where in the log it showed."""

    cycle: int
    position: int
    index: int
    message: str
    expected: bytes | None = None
    recorded: bytes | None = None
    found_at: int = AT_END  # position of the record that revealed it (AT_END: the end of the log)


@dataclass(frozen=True, slots=True)
class Share:
    """The cycles a replay re-runs: those whose CycleStarted position is in [start, stop)."""

    start: int = 0
    stop: int | None = None
    #: the state digest the log records for the cycle at `stop` (the next share resumes there
    #: from a checkpoint): this share folds through `stop` and re-runs that cycle too unless
    #: its state there has that digest
    stop_digest: str | None = None

    def owns(self, position: int) -> bool:
        return position >= self.start and (self.stop is None or position < self.stop)


@dataclass(slots=True)
class ReplayResult:
    records: int = 0
    cycles: int = 0
    decisions: int = 0
    abandoned: int = 0
    divergence: Divergence | None = None
    rerun: dict[int, list[Envelope]] = field(default_factory=dict)
    state: ClusterState = field(default_factory=ClusterState)
    #: the position of the last record read (-1: none)
    last_position: int = -1
    #: CycleStarted positions of the abandoned cycles, in log order
    abandoned_at: list[int] = field(default_factory=list)
    #: digest of the state after the last record read, as the policy version in force computes it
    state_digest: str = ""
    #: a share resumed from a checkpoint met a record it cannot judge without the log before
    #: its start (module docstring): its result says nothing, the share must fold from 0
    needs_prefix: bool = False
    #: shares that started from a checkpoint (`merge` adds them up)
    resumed: int = 0

    @property
    def ok(self) -> bool:
        return self.divergence is None


#: the decisions binder outcomes perform (what `lookup` finds for `_Replayer.resolve`)
DECISIONS = (p.BindingDecided, p.EvictionDecided)
_OUTCOMES = (p.PodBound, p.PodBindFailed, p.PodEvicted, p.PodEvictionFailed)
_DECIDED_BY = {p.PodBound: p.BindingDecided, p.PodBindFailed: p.BindingDecided, p.PodEvicted: p.EvictionDecided,
               p.PodEvictionFailed: p.EvictionDecided}


class _Decided(NamedTuple):
    """What a binder outcome must agree with: its decision's kind, pod, node and time."""

    kind: type
    namespace: str
    name: str
    uid: str
    node: str
    logicaltime: int


def _decided(env: Envelope) -> _Decided:
    """What the outcomes of the decision `env` must agree with. (Built by tuple.__new__, without
    the NamedTuple's Python-level __new__: one per decision a replay folds.)"""
    data = env.data
    return tuple.__new__(_Decided, (type(data), data.namespace, data.name, data.uid, data.node, env.logicaltime))


def _impossible_outcome(decided: dict[str, _Decided], record: Record) -> str | None:
    """Why the binder outcome `record` cannot be the outcome of a decision in `decided`, or None."""
    env = record.envelope
    data = env.data
    assert isinstance(data, _OUTCOMES)
    decision = decided.get(data.decision_id)
    ours = (data.namespace, data.name, data.uid, data.node)
    kind = _DECIDED_BY[type(data)]
    if decision is not None and decision.kind is kind and decision[1:5] == ours and \
            env.logicaltime >= decision.logicaltime:
        return None  # (the common case: no message built)
    what = f"{type(data).__name__} of pod {data.namespace}/{data.name} on node {data.node!r}"
    if decision is None:
        return f"{what} names decision {data.decision_id!r}, which is not in the log before it"
    if decision.kind is not kind:
        return f"{what} names decision {data.decision_id!r}, which is a {decision.kind.__name__}"
    theirs = decision[1:5]
    if ours != theirs:
        fields = ("namespace", "name", "uid", "node")
        diff = ", ".join(f"{f} {a!r} (decision: {b!r})" for f, a, b in zip(fields, ours, theirs) if a != b)
        return f"{what} does not match its decision {data.decision_id!r}: {diff}"
    return (f"{what}: logical time runs back, {env.logicaltime} is before its decision's "
            f"{decision.logicaltime}")


def _policy_version_of(state: ClusterState) -> str:
    """The policy version of the config in force (the default one if it does not validate)."""
    try:
        return parse_config(state.config).policy_version
    except ConfigError:
        return parse_config({}).policy_version


class _Replayer:
    """The replay loop's state; `step` folds one record and returns False to stop."""

    def __init__(self, packer: Packer, override: SchedulerConfig | None, share: Share,
                 progress: Callable[[int], None] | None) -> None:
        self.packer = packer
        self.override = override
        self.share = share
        self.progress = progress
        self.result = ReplayResult()
        self.state = self.result.state
        # own cycles still expecting decisions: position -> (envelope, canonical bytes) queue
        self.expected: dict[int, deque[tuple[Envelope, bytes]]] = {}
        self.planned: dict[int, int] = {}
        self.cycle_of: dict[int, int] = {}
        self.foreign: set[int] = set()  # other shares' cycles that have not completed
        self.closed: set[int] = set()  # cycles whose CycleCompleted has been folded
        # the last position this share must read even with no cycle of its own still open
        # (with `stop_digest`: the cut at `stop` too, whose digest it checks)
        self.last_alone = AT_END if share.stop is None else share.stop - (share.stop_digest is None)
        # binder decisions folded so far, by event id (what their outcomes must agree with)
        self.decided: dict[str, _Decided] = {}
        # resumed from a checkpoint at this position: outcomes naming decisions not folded here
        # wait for `resolve` (they name decisions before it, or none)
        self.resumed_at: int | None = None
        self.unresolved: list[Record] = []

    def resume(self, state: ClusterState, record: Record) -> bool:
        """Start from `state`, folded exactly through `record`, this share's first CycleStarted
        (at `share.start`), and re-run that cycle; False to stop (with `needs_prefix` when
        `record` is no CycleStarted there, or `state` not folded to it)."""
        data = record.envelope.data
        if record.position != self.share.start or state.position != record.position or \
                not isinstance(data, p.CycleStarted):
            self.result.needs_prefix = True
            return False
        self.state = self.result.state = state
        self.result.records = state.records
        self.result.resumed = 1
        self.resumed_at = record.position
        return self.cycle(record, data)

    def resolve(self, lookup: Callable[[set[str]], dict[str, Record]]) -> None:
        """Check the outcomes left for the end (`resumed_at`) against their decisions, which
        `lookup` finds by id before this share's start (decision records only, the last of each
        id, as `decided` would hold them): the first impossible one is this share's
        divergence unless it found an earlier one."""
        if not self.unresolved:
            return
        found = lookup({r.envelope.data.decision_id for r in self.unresolved})
        decided = {id_: _decided(r.envelope) for id_, r in found.items()}
        known = self.result.divergence
        for record in self.unresolved:
            if known is not None and record.position >= known.found_at:
                break
            why = _impossible_outcome(decided, record)
            if why is not None:
                self.result.divergence = Divergence(cycle=-1, position=record.position, index=0,
                                                    found_at=record.position, message=why,
                                                    recorded=encode(record.envelope))
                break
        self.unresolved.clear()

    def impossible(self, record: Record) -> bool:
        """Check a binder outcome against its decision; True (and the divergence set) if it
        is impossible."""
        decided = self.decided
        if self.resumed_at is not None and record.envelope.data.decision_id not in decided:
            self.unresolved.append(record)  # (decided before the checkpoint, or never: `resolve`)
            return False
        why = _impossible_outcome(decided, record)
        if why is None:
            return False
        self._diverge(Divergence(cycle=-1, position=record.position, index=0, found_at=record.position,
                                 message=why, recorded=encode(record.envelope)))
        return True

    def _diverge(self, div: Divergence) -> bool:
        self.result.divergence = div
        return False

    def match(self, body: bytes | memoryview | None) -> tuple[int, Envelope] | None:
        """(cycle position, envelope) when `body` is the next decision some own cycle expects
        (None, a Kafka record without a value, is none)."""
        for based, queue in self.expected.items():
            if queue and queue[0][1] == body:
                return based, queue[0][0]
        return None

    def step_matched(self, position: int, based: int, env: Envelope) -> bool:
        """Fold a record known (by its bytes) to be cycle `based`'s next expected decision."""
        queue = self.expected[based]
        queue.popleft()
        self.result.decisions += 1
        if not queue and isinstance(env.data, p.CycleCompleted):
            del self.expected[based]
            self.closed.add(based)
        return self._fold(Record(position, env))

    def step(self, record: Record) -> bool:
        env = record.envelope
        based = env.basedon
        if based is not None and self.override is None and env.type.startswith("kai.scheduler."):
            queue = self.expected.get(based)
            if queue is None:
                if self.resumed_at is not None and based < self.resumed_at:
                    self.result.needs_prefix = True  # (its cycle is before the checkpoint)
                    return False
                if based in self.foreign:  # its owner compares it
                    if isinstance(env.data, p.CycleCompleted):
                        self.foreign.discard(based)
                        self.closed.add(based)
                    return self._fold(record)
                why = ("whose cycle had already completed" if based in self.closed
                       else "which is not a cycle start")
                return self._diverge(Divergence(
                    cycle=-1, position=based, index=0, found_at=record.position,
                    message=f"record {record.position} claims to be based on position {based}, {why}",
                    recorded=encode(env)))
            got = encode(env)
            if not queue or queue[0][1] != got:
                return self._diverge(Divergence(
                    cycle=self.cycle_of[based], position=based,
                    index=self.planned[based] - len(queue), found_at=record.position,
                    message=("the log holds a decision the replay did not make" if not queue
                             else "decision differs"),
                    expected=queue[0][1] if queue else None, recorded=got))
            queue.popleft()
            self.result.decisions += 1
            if not queue and isinstance(env.data, p.CycleCompleted):
                del self.expected[based]
                self.closed.add(based)
        return self._fold(record)

    def _fold(self, record: Record) -> bool:
        state = self.state
        env = record.envelope
        data = env.data
        kind = type(data)
        if kind in _OUTCOMES and self.impossible(record):
            return False
        if kind in DECISIONS:
            self.decided[env.id] = _decided(env)
        apply(state, record)
        result = self.result
        result.records += 1
        if self.progress is not None and result.records % 65536 == 0:
            self.progress(result.records)
        if isinstance(data, p.CycleStarted):
            return self.cycle(record, data)
        return record.position < self.last_alone or bool(self.expected)

    def cycle(self, record: Record, data: p.CycleStarted) -> bool:
        """After folding a CycleStarted: re-run it if it is this share's; False to stop."""
        position = record.position
        share = self.share
        if not share.owns(position) and not (position == share.stop and share.stop_digest is not None
                                             and self._differs_at_stop()):
            self.foreign.add(position)
            return position < self.last_alone or bool(self.expected)
        config = self.override
        if config is None:
            try:
                config = parse_config(self.state.config)
            except ConfigError as exc:
                return self._diverge(Divergence(
                    cycle=data.cycle, position=position, index=0, found_at=position,
                    message=f"the log's config in force does not validate: {exc}"))
            if data.config_digest != config_digest(config):
                return self._diverge(Divergence(
                    cycle=data.cycle, position=position, index=0, found_at=position,
                    message=f"cycle ran with config {data.config_digest}, but the log's config "
                            f"in force is {config_digest(config)}"))
        decisions = run_cycle(self.state, record, config, self.packer, verify=verify_mode.enabled())
        self.result.cycles += 1
        self.cycle_of[position] = data.cycle
        if self.override is not None:
            self.result.rerun[position] = decisions
        else:
            self.expected[position] = deque((d, encode(d)) for d in decisions)
            self.planned[position] = len(decisions)
        return True

    def _differs_at_stop(self) -> bool:
        """Whether the state, folded through `share.stop`, lacks the digest the log records
        there (the next share resumed from a state that has it)."""
        return state_digest(_policy_version_of(self.state), self.state) != self.share.stop_digest

    def finish(self, *, at_end: bool) -> ReplayResult:
        result = self.result
        if result.divergence is None and at_end:
            for pos, queue in list(self.expected.items()):
                if queue and len(queue) == self.planned[pos]:
                    result.abandoned += 1  # no decision of it reached the log: the scheduler died mid-cycle
                    result.abandoned_at.append(pos)
                elif queue:
                    result.divergence = Divergence(
                        cycle=self.cycle_of[pos], position=pos, index=self.planned[pos] - len(queue),
                        message=f"the log ends with {len(queue)} decision(s) of this cycle missing",
                        expected=queue[0][1])
                    break
        result.state_digest = state_digest(_policy_version_of(self.state), self.state)
        return result


class IncrementalReplay:
    """`replay` fed one record at a time, for a check that runs beside the writers (a
    deterministic simulation run checks its log after every step). `state` is the state after the
    last record fed; `feed` returns False once a divergence is found (then `divergence` says it)."""

    def __init__(self, packer: Packer) -> None:
        self._replayer = _Replayer(packer, None, Share(), None)

    @property
    def state(self) -> ClusterState:
        return self._replayer.state

    @property
    def divergence(self) -> Divergence | None:
        return self._replayer.result.divergence

    def feed(self, record: Record) -> bool:
        if self._replayer.result.divergence is not None:
            return False
        self._replayer.result.last_position = record.position
        return self._replayer.step(record) or self._replayer.result.divergence is None

    def finish(self) -> ReplayResult:
        """The result as `replay` gives it for the records fed (the log's end reached)."""
        return self._replayer.finish(at_end=True)


def replay(records: Iterable[Record], packer: Packer, *, override: SchedulerConfig | None = None,
           progress: Callable[[int], None] | None = None, share: Share = Share()) -> ReplayResult:
    """Replay decoded `records` (see module docstring)."""
    replayer = _Replayer(packer, override, share, progress)
    result = replayer.result
    for record in records:
        result.last_position = record.position
        if not replayer.step(record):
            return replayer.finish(at_end=False)
    return replayer.finish(at_end=True)


def replay_frames(frames: Iterable[tuple[int, bytes | memoryview | None]], packer: Packer, *,
                  progress: Callable[[int], None] | None = None,
                  share: Share = Share(), resume: ClusterState | None = None,
                  lookup: Callable[[set[str]], dict[str, Record]] | None = None,
                  undecodable: Callable[[int, bytes | memoryview | None, str], None] | None = None
                  ) -> ReplayResult:
    """Replay (position, canonical body) frames, decoding only what is not an expected decision.
    A body that does not decode (or is None) raises DecodeError naming its position, or, with
    `undecodable`, is given to it with the reason and skipped, as a Kafka log's readers skip it
    (the scheduler folded the log without it). With `resume` (a state folded exactly through
    `share.start`), `frames` start at `share.start` and `lookup` finds decisions before it by id
    (module docstring)."""
    replayer = _Replayer(packer, None, share, progress)
    frames = iter(frames)
    if resume is not None:
        if lookup is None:
            raise ValueError("a resumed replay needs a lookup of the decisions before its start")
        for position, body in frames:
            try:
                env = decode(body)
            except DecodeError as exc:
                _not_decoded(position, body, exc, undecodable)
                continue
            going = replayer.resume(resume, Record(position, env))
            replayer.result.last_position = position
            if not going:
                return _finished(replayer, lookup, at_end=False)
            break
    expected, state, result = replayer.expected, replayer.state, replayer.result
    match, step, step_matched = replayer.match, replayer.step, replayer.step_matched
    last_alone = replayer.last_alone
    position = result.last_position
    for position, body in frames:
        if expected:
            hit = match(body)
            if hit is not None:
                if not step_matched(position, hit[0], hit[1]):
                    result.last_position = position
                    return _finished(replayer, lookup, at_end=False)
                continue
        try:
            env = decode(body)
        except DecodeError as exc:
            _not_decoded(position, body, exc, undecodable)
            continue
        if env.basedon is None:
            # the common case (observations, outcomes), inlined: `step` minus what cannot apply
            record = Record(position, env)
            kind = type(env.data)
            if kind in _OUTCOMES and replayer.impossible(record):
                result.last_position = position
                return _finished(replayer, lookup, at_end=False)
            apply(state, record)
            result.records += 1
            if progress is not None and not result.records & 0xFFFF:
                progress(result.records)
            if kind is p.CycleStarted:
                going = replayer.cycle(record, env.data)
            else:
                going = position < last_alone or bool(expected)
        else:
            going = step(Record(position, env))
        if not going:
            result.last_position = position
            return _finished(replayer, lookup, at_end=False)
    result.last_position = position
    return _finished(replayer, lookup, at_end=True)


def _not_decoded(position: int, body: bytes | memoryview | None, exc: DecodeError,
                 undecodable: Callable[[int, bytes | memoryview | None, str], None] | None) -> None:
    """`body`, the record at `position`, did not decode (`exc`): a DecodeError naming the
    position, or, with `undecodable`, given to it with the reason (the caller skips it)."""
    if undecodable is None:
        raise DecodeError(f"record at position {position}: {exc}") from None
    undecodable(position, body, str(exc))


def _finished(replayer: _Replayer, lookup: Callable[[set[str]], dict[str, Record]] | None, *,
              at_end: bool) -> ReplayResult:
    if lookup is not None and not replayer.result.needs_prefix:
        replayer.resolve(lookup)
    return replayer.finish(at_end=at_end)


def merge(parts: Sequence[ReplayResult]) -> ReplayResult:
    """One verdict from the results of shares that cover a log in order (the last one reads to
    the end): the earliest divergence wins, counts add up, the state is the last share's."""
    merged = ReplayResult()
    found = [r.divergence for r in parts if r.divergence is not None]
    if found:
        merged.divergence = min(found, key=lambda d: d.found_at)
    for r in parts:
        merged.cycles += r.cycles
        merged.decisions += r.decisions
        merged.abandoned += r.abandoned
        merged.resumed += r.resumed
        merged.abandoned_at.extend(r.abandoned_at)
        merged.records = max(merged.records, r.records)
        merged.last_position = max(merged.last_position, r.last_position)
    merged.abandoned_at.sort()
    if parts:
        merged.state = parts[-1].state
        merged.state_digest = parts[-1].state_digest
    return merged


def describe(div: Divergence) -> str:
    """A readable, multi-line account of a divergence."""
    if div.cycle < 0:  # not a decision of a cycle: a record that cannot be where it is
        lines = [f"DIVERGED: impossible record at position {div.found_at}: {div.message}"]
    else:
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
