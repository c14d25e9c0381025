"""The config in force: ConfigApplied, and the state's flags derived from it by the policy
version's fold rules (`kai_es.state.versions`).

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.events.timefmt import parse_duration
from kai_es.state import usage
from kai_es.ingest.names import SCHEDULER_NAME
from kai_es.state.handlers.jobs import set_pending
from kai_es.state.model import ClusterState
from kai_es.state.versions import fold_rules


def derive_config_flags(state: ClusterState) -> None:
    """Set the state's flags derived from its config (`timed`, `subgroup_stale`,
    `handover_stamps`, `releases_failed_moves`, `bindings_hold`, `honours_gates`,
    `failed_binds_honour_deletion`, `name_ordered_specs`, the usage resolution and window).
    A config whose durations do not parse keeps usage off (the scheduler rejects such a config
    before it is ever applied)."""
    config = state.config
    rules = fold_rules(config.get("policyVersion"))  # the version's fold rules (`state.versions`)
    state.timed = rules.keeps_times
    state.subgroup_stale = rules.stale_subgroups
    state.handover_stamps = rules.handover_stamps
    state.releases_failed_moves = rules.releases_failed_moves
    state.bindings_hold = rules.bindings_hold
    state.honours_gates = rules.honours_gates
    state.failed_binds_honour_deletion = rules.failed_binds_honour_deletion
    if state.name_ordered_specs != rules.name_ordered_specs:
        state.name_ordered_specs = rules.name_ordered_specs
        state.hashes.complete = False  # every pod's hash was of the other form: the next digest re-hashes all
    name = config.get("schedulerName")
    state.scheduler_name = name if isinstance(name, str) and name else SCHEDULER_NAME
    fairshare = config.get("fairshare")
    resolution = window = 0
    if state.timed and isinstance(fairshare, dict) and fairshare.get("timeBased") is True:
        try:
            resolution = parse_duration(str(fairshare.get("usageResolution", "1m")))
            window = parse_duration(str(fairshare.get("windowSize", "168h")))
        except ValueError:
            resolution = window = 0
    if resolution <= 0 or window <= 0:
        resolution = window = 0
    state.usage_resolution_ns, state.usage_window_ns = resolution, window


def config_applied(state: ClusterState, env: Envelope) -> None:
    data: p.ConfigApplied = env.data
    state.config = dict(data.config)
    state.config_digest = data.config_digest
    was_kept, judged_subgroups, answered = state.usage_resolution_ns, state.subgroup_stale, state.scheduler_name
    gated, deletion = state.honours_gates, state.failed_binds_honour_deletion
    derive_config_flags(state)
    if state.scheduler_name != answered or (state.honours_gates != gated and any(
            pod.spec.scheduling_gates for pod in state.pods.values())) or (
            state.failed_binds_honour_deletion and not deletion and any(
                pod.spec.terminating and pod.pending_key is not None for pod in state.pods.values())):
        # another name: the pods pending for kai-es are those of the new one; gates honoured or
        # no longer: gated pods come out of the pending pods or go back in; deletion honoured
        # after a failed bind: a terminating pod an older version put back comes out
        for key in sorted(state.pods):
            pod = state.pods[key]
            if pod.status == "Pending":
                set_pending(state, pod, not pod.spec.terminating)
    if state.subgroup_stale != judged_subgroups and state.timed:
        # the rule changed (only a config of kai-es/v4 or later turns it on): jobs with
        # sub-groups are judged again by the new one, as of this event
        state.occupancy_changed.update(k for k, j in state.jobs.items() if j.spec is not None and j.spec.subgroups)
    if state.usage_resolution_ns and not was_kept:
        usage.start_all(state, env.logicaltime)
    elif was_kept and not state.usage_resolution_ns:
        usage.stop_all(state)
