"""One scheduling cycle: state at the cut + the CycleStarted record + config -> decision events.

Contract (what makes replay exact):
- `run_cycle` is pure: the same state, CycleStarted record and config give the same list of
  envelopes, byte for byte. "Now" is the CycleStarted event's logical time.
- Every decision envelope has `basedon` = the CycleStarted position, `causationid` = its id,
  id = uuid5(CycleStarted id, ordinal), `policyversion` from the config. The list always ends
  with exactly one CycleCompleted.
- A pod left Pending gets a PodUnschedulable only when its reasons differ from the last ones
  announced for it, so an unchanged verdict is not repeated every cycle.
"""

from __future__ import annotations

from dataclasses import replace

from kai_es.events import Envelope, Record
from kai_es.events import payloads as p
from kai_es.events.factory import derived_id, make_envelope
from kai_es.scheduling.actions.allocate import Allocator
from kai_es.scheduling.config import SchedulerConfig
from kai_es.scheduling.packing import (
    CpuStrategy,
    DeviceStrategy,
    GpuStrategy,
    Packer,
    Strategy,
    workload_from_tasks,
)
from kai_es.scheduling.plan import Plan, task_shape
from kai_es.state.model import ClusterState
from kai_es.state.reducer import job_key_of_index, reasons_fingerprint
from kai_es.state.snapshot import digest

SOURCE = "kai-es/scheduler"


def strategy_of(config: SchedulerConfig, state: ClusterState | None = None) -> Strategy:
    """The packer strategy of `config`. For `fragmentation` the expected workload is the shapes
    of the pods pending in `state` (counted; order-independent)."""
    gpu = {"binpack": GpuStrategy.BINPACK, "spread": GpuStrategy.SPREAD,
           "fragmentation": GpuStrategy.FRAGMENTATION}[config.placement_strategy.gpu]
    cpu = CpuStrategy.BINPACK if config.placement_strategy.cpu == "binpack" else CpuStrategy.SPREAD
    dev = DeviceStrategy.GPUPACK if config.gpu_sharing_order == "gpupack" else DeviceStrategy.GPUSPREAD
    strategy = Strategy(gpu, cpu, dev)
    if gpu == GpuStrategy.FRAGMENTATION and state is not None:
        shapes = [task_shape(state.pods[entry[3]].spec)
                  for queue in sorted(state.pending_jobs) for index_key in state.pending_jobs[queue]
                  for entry in state.jobs[job_key_of_index(index_key)].pending]
        strategy = replace(strategy, workload=workload_from_tasks(shapes))
    return strategy


class _Emitter:
    def __init__(self, started: Record, config: SchedulerConfig) -> None:
        self.started = started
        self.config = config
        self.out: list[Envelope] = []

    def emit(self, payload: p.Payload, subject: str, statedigest: str | None = None) -> None:
        env = self.started.envelope
        self.out.append(make_envelope(
            payload, event_id=derived_id(env.id, len(self.out)), source=SOURCE, subject=subject,
            logicaltime=env.logicaltime, causationid=env.id, correlationid=env.id,
            basedon=self.started.position, policyversion=self.config.policy_version,
            statedigest=statedigest))


def run_cycle(state: ClusterState, started: Record, config: SchedulerConfig,
              packer: Packer) -> list[Envelope]:
    """The decisions of one cycle (see module docstring). `state` must be folded exactly up to
    and including `started`; it is not modified."""
    cycle_payload = started.envelope.data
    if not isinstance(cycle_payload, p.CycleStarted):
        raise TypeError(f"record {started.position} is not a CycleStarted event")
    if state.position != started.position:
        raise ValueError(f"state is at position {state.position}, the cycle's cut is {started.position}")
    now = started.envelope.logicaltime
    emitter = _Emitter(started, config)
    plan = Plan(state, packer, strategy_of(config, state))
    counts = {"bound": 0, "pipelined": 0, "unschedulable": 0}
    if "allocate" in config.actions:
        result = Allocator(state, plan, now).run()
        for entry in result.placed:
            pod = state.pods[entry.pod_key]
            spec = pod.spec
            job = state.jobs[pod.job_key]
            node = plan.names[entry.node]
            devices = plan.local_devices(entry)
            subject = f"pod/{spec.namespace}/{spec.name}"
            if entry.pipelined:
                waiting = sorted(k for k in plan.nodes[entry.node].pods
                                 if state.pods[k].status == "Releasing")
                emitter.emit(p.PodPipelined(
                    namespace=spec.namespace, name=spec.name, uid=spec.uid, node=node,
                    podgroup=job.name, queue=job.queue, gpu_devices=devices,
                    gpu_groups=list(entry.gpu_groups), waiting_for=waiting), subject)
                counts["pipelined"] += 1
            else:
                emitter.emit(p.BindingDecided(
                    namespace=spec.namespace, name=spec.name, uid=spec.uid, node=node,
                    podgroup=job.name, queue=job.queue, gpu_devices=devices,
                    gpu_groups=list(entry.gpu_groups)), subject)
                counts["bound"] += 1
        for key in sorted(result.unschedulable):
            pod = state.pods[key]
            reasons = result.unschedulable[key]
            counts["unschedulable"] += 1
            if reasons_fingerprint(reasons) == pod.last_unschedulable:
                continue
            job = state.jobs[pod.job_key]
            emitter.emit(p.PodUnschedulable(
                namespace=pod.spec.namespace, name=pod.spec.name, uid=pod.spec.uid,
                podgroup=job.name, queue=job.queue, reasons=reasons),
                f"pod/{pod.spec.namespace}/{pod.spec.name}")
    every = config.state_digest_every
    state_digest = digest(state) if every and cycle_payload.cycle % every == 0 else None
    emitter.emit(p.CycleCompleted(
        cycle=cycle_payload.cycle, decisions=len(emitter.out), bound=counts["bound"],
        pipelined=counts["pipelined"], evicted=0, unschedulable=counts["unschedulable"]),
        f"cycle/{cycle_payload.cycle}", statedigest=state_digest)
    return emitter.out
