"""`kai-es cycle`: one scheduling cycle on a scenario's initial state, reported per pod.

Contract: deterministic; the output follows SCENARIOS.md ("Outcome of one cycle"): `pods` maps
`<namespace>/<name>` to status (Running | Binding | Pipelined | Releasing | Pending), node and
GPU groups, and `decisions` lists the cycle's decision envelopes as canonical JSON objects.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kai_es.events import Envelope, Record, decode, encode
from kai_es.events import payloads as p
from kai_es.events.factory import derived_id, make_envelope
from kai_es.feed import object_events
from kai_es.scheduling.config import config_event
from kai_es.scenario import Scenario
from kai_es.scheduling.config import config_digest
from kai_es import verify_mode
from kai_es.scheduling.cycle import run_cycle
from kai_es.scheduling.packing import Packer
from kai_es.state import fold


def as_records(envelopes: list[Envelope]) -> list[Record]:
    """`envelopes` as a log starting at position 0 would hold them: each round-trips through
    its canonical bytes (an envelope that cannot be encoded raises), positions dense from 0."""
    return [Record(i, decode(encode(env))) for i, env in enumerate(envelopes)]


def _initial_envelopes(scenario: Scenario) -> list[Envelope]:
    return [config_event(scenario.config, event_id=derived_id(scenario.name, -1),
                         logicaltime=scenario.start_ns),
            *object_events(scenario, scenario.initial(), scenario.start_ns)]


def initial_state(scenario: Scenario) -> Any:
    """The folded state of the scenario's initial objects (no cycle run)."""
    return fold(as_records(_initial_envelopes(scenario)))


def fairshare_report(scenario: Scenario) -> dict[str, Any]:
    """Per queue and resource: quota, limit, request, allocated and fair share (ints; GPU in
    milli-GPU, CPU in milli-CPU, memory in bytes; -1 = unlimited), divided as the scenario's
    policy version divides (`divisionUnit`: kai-es/v2 hands out GPUs over quota in whole GPUs)."""
    from kai_es.scheduling.fairshare import RESOURCES, shares_for_state
    from kai_es.scheduling.policy import policy_for

    state = initial_state(scenario)
    policy = policy_for(scenario.config.policy_version)
    rule = policy.rules.fair_share_division
    shares = shares_for_state(state, rule.gpu_unit, replacements_once=rule.replacements_once,
                              quota_granted=rule.quota_granted)
    out: dict[str, Any] = {}
    for name in sorted(state.queues):
        spec = state.queues[name].spec
        out[name] = {"parent": spec.parent or None, "priority": spec.priority, "resources": {
            resource: {"quota": shares[resource][name].quota, "limit": shares[resource][name].limit,
                       "request": shares[resource][name].request,
                       "allocated": shares[resource][name].allocated,
                       "fairShare": shares[resource][name].fair_share,
                       "overQuotaWeight": getattr(spec, resource).over_quota_weight}
            for resource in RESOURCES}}
    units = {"gpu": "milli-GPU", "cpu": "milli-CPU", "memory": "bytes"}
    division = {"gpu": policy.rules.fair_share_division.gpu_unit, "cpu": 1, "memory": 1}
    return {"units": units, "divisionUnit": division, "policyVersion": policy.version, "queues": out}


def first_cut(scenario: Scenario) -> tuple[Any, Record]:
    """The state of the scenario's initial objects folded through the first cycle's
    CycleStarted, and that record: what its first cycle runs on."""
    records = as_records([*_initial_envelopes(scenario), make_envelope(
        p.CycleStarted(cycle=1, config_digest=config_digest(scenario.config)),
        event_id=derived_id(scenario.name, -2), source="kai-es/scheduler", subject="cycle/1",
        logicaltime=scenario.start_ns, policyversion=scenario.config.policy_version)])
    return fold(records), records[-1]


def one_cycle(scenario: Scenario, packer: Packer) -> dict[str, Any]:
    state, started = first_cut(scenario)
    decisions = run_cycle(state, started, scenario.config, packer, verify=verify_mode.enabled())
    pods: dict[str, dict[str, Any]] = {}
    for key in sorted(state.pods):
        pod = state.pods[key]
        status = {"Running": "Running", "Binding": "Binding", "Releasing": "Releasing"}.get(
            pod.status, "Pending")
        if pod.spec.terminating:
            status = "Releasing"
        pods[key] = {"status": status, "node": pod.node or None, "gpuGroups": list(pod.gpu_groups)}
    for env in decisions:
        data = env.data
        if isinstance(data, (p.BindingDecided, p.PodPipelined)):
            pods[f"{data.namespace}/{data.name}"] = {
                "status": "Binding" if isinstance(data, p.BindingDecided) else "Pipelined",
                "node": data.node, "gpuGroups": list(data.gpu_groups)}
        elif isinstance(data, p.EvictionDecided):
            pods[f"{data.namespace}/{data.name}"]["status"] = "Releasing"
            if data.to_node:  # kai-es/v6: a move, one decision with both nodes
                pods[f"{data.namespace}/{data.name}"]["movesTo"] = data.to_node
        elif isinstance(data, p.CycleCompleted):
            for key in data.stuck_releasing:  # kai-es/v7: being deleted past the threshold
                pods[key]["status"] = "StuckInReleasing"
    return {"pods": pods, "decisions": [msgspec.json.decode(encode(e)) for e in decisions]}
