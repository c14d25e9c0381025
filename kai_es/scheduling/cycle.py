"""One scheduling cycle: state at the cut + the CycleStarted record + config -> decision events.

Contract (what makes replay exact):
- `run_cycle` is pure: the same state, CycleStarted record and config give the same list of
  envelopes, byte for byte. "Now" is the CycleStarted event's logical time.
- Background pods (`rules.background_pods`) leave the Plan before the first action and get
  their place back after the last where it is still free.
- It runs the config's actions in order, each looked up in the registry of the config's policy
  version (`kai_es.scheduling.policy`), all on one Session and one Plan; then the Plan's
  committed operations become events (`kai_es.scheduling.emit`).
- Every decision envelope has `basedon` = the CycleStarted position, `causationid` = its id,
  id = uuid5(CycleStarted id, ordinal), `policyversion` from the config. The list always ends
  with exactly one CycleCompleted, whose `statedigest` (every `stateDigestEvery` cycles) is
  the state digest of the config's policy version (`kai_es.scheduling.policy`).
- A pod left Pending gets a PodUnschedulable only when its reasons differ from the last ones
  announced for it, so an unchanged verdict is not repeated every cycle.
- The CycleCompleted carries what the policy's `rules.tried_order` records of the order
  allocate tried the waiting jobs in (kai-es/v13 on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.emit import SOURCE, Emitter
from kai_es.scheduling.packing import (
    CpuStrategy,
    GpuStrategy,
    Packer,
    Strategy,
    workload_from_tasks,
)
from kai_es.scheduling.plan import Entry, Eviction, Plan, task_shape
from kai_es.scheduling.policy import PolicyVersion, policy_for
from kai_es.scheduling.session import Session
from kai_es.state.keys import job_key_of_index
from kai_es.state.model import ClusterState

__all__ = ["SOURCE", "run_cycle", "strategy_of"]


def strategy_of(config: SchedulerConfig, state: ClusterState | None = None) -> Strategy:
    """The packer strategy of `config`. For `fragmentation` the expected workload is the shapes
    of the pods pending in `state` (counted; order-independent). The shared-device order is the
    policy version's rule (`kai_es.scheduling.rules.device_order`)."""
    gpu = {"binpack": GpuStrategy.BINPACK, "spread": GpuStrategy.SPREAD,
           "fragmentation": GpuStrategy.FRAGMENTATION}[config.placement_strategy.gpu]
    cpu = CpuStrategy.BINPACK if config.placement_strategy.cpu == "binpack" else CpuStrategy.SPREAD
    dev = policy_for(config.policy_version).rules.device_order.device_strategy(config)
    strategy = Strategy(gpu, cpu, dev)
    if gpu == GpuStrategy.FRAGMENTATION and state is not None:
        shapes = [task_shape(state.pods[entry.pod_key].spec)
                  for queue in sorted(state.pending_jobs) for index_key in state.pending_jobs[queue]
                  for entry in state.jobs[job_key_of_index(index_key)].pending]
        strategy = replace(strategy, workload=workload_from_tasks(shapes))
    return strategy


def run_cycle(state: ClusterState, started: Record, config: SchedulerConfig,
              packer: Packer, verify: bool = False,
              on_action: Callable[[str], None] | None = None) -> list[Envelope]:
    """The decisions of one cycle (see module docstring). `state` must be folded exactly up to
    and including `started`; it is not modified (only its derived caches and the incremental
    digest's kept hashes are brought up to date). `verify=True` runs the Plan's verification
    mode (memos and incremental tables re-checked; a disagreement raises VerificationError).
    `on_action` (the shell's timer; it sees nothing and changes nothing) is called with each
    action's name as it starts, and with "" once the last has ended."""
    cycle_payload = started.envelope.data
    if not isinstance(cycle_payload, p.CycleStarted):
        raise TypeError(f"record {started.position} is not a CycleStarted event")
    if state.position != started.position:
        raise ValueError(f"state is at position {state.position}, the cycle's cut is {started.position}")
    policy = policy_for(config.policy_version)
    emitter = Emitter(started, config.policy_version)
    plan = Plan(state, packer, strategy_of(config, state), verify=verify,
                skips_held_idle=policy.rules.releasing_capacity.skips_held_idle)
    now = started.envelope.logicaltime
    session: Session | None = None
    try:  # (closed at the end: the cycle's objects are then freed as it returns, see `Plan.close`)
        stuck = policy.rules.releasing_capacity.hold(state, plan, now, config)
        policy.rules.move_holds.reserve(state, plan, now)
        session = Session(state, plan, now, policy.rules, config)
        return _decide(state, cycle_payload, config, policy, emitter, plan, session, stuck, on_action)
    finally:
        plan.close()
        if session is not None:
            session.close()


def _decide(state: ClusterState, cycle_payload: p.CycleStarted, config: SchedulerConfig, policy: PolicyVersion,
            emitter: Emitter, plan: Plan, session: Session, stuck: list[str],
            on_action: Callable[[str], None] | None) -> list[Envelope]:
    """`run_cycle` once its Plan and Session are made."""
    background = policy.rules.background_pods.take_out(session)
    unschedulable = session.unschedulable
    for name in config.action_list:
        action = policy.actions.get(name)
        if action is None:
            continue  # kai-es/v1 accepted names it did not run; later versions reject them
        if on_action is not None:
            on_action(name)
        result = action(session)
        unschedulable.update(result.unschedulable)
        for entry in result.placed:  # a later action placed what an earlier one could not
            unschedulable.pop(entry.pod_key, None)
    if on_action is not None:
        on_action("")
    policy.rules.background_pods.give_back(session, background)
    for op in plan.operations:
        if isinstance(op, Entry):
            if op.moved_from < 0:  # a move is announced by its eviction
                emitter.placement(state, plan, op)
        elif isinstance(op, Eviction) and not op.undone:  # kai-es/v6: a victim put back stays
            emitter.eviction(state, plan, op)
    for key in sorted(unschedulable):
        emitter.unschedulable(state, key, unschedulable[key])
    every = config.state_digest_every
    digest = policy.state_digest(state) if every and cycle_payload.cycle % every == 0 else None
    return emitter.completed(cycle_payload.cycle, digest, policy.rules.stuck_record.record(stuck),
                             policy.rules.tried_order.record(session))
