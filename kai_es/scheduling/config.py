"""The scheduler's configuration: the same keys in its config file and in a Scenario's
`spec.scheduler`. Validated by msgspec (unknown keys and bad values are errors that name the
field); durations are Kubernetes-style strings, converted to int ns by the accessors.

What depends on the policy version (which versions exist, which actions a config of one may
list, which it runs when it lists none) is checked by the registry, `policy.config_actions`.

Contract: `config_digest(cfg)` is the sha256 of the canonical JSON of the fully defaulted config,
so two spellings of the same configuration have one digest.
"""

from __future__ import annotations

import hashlib
import math
import re
from fractions import Fraction
from typing import Any, Literal

import msgspec

from kai_es.events import Envelope
from kai_es.events import payloads as p
from kai_es.events.codec import canonical
from kai_es.events.factory import make_envelope
from kai_es.events.timefmt import parse_duration, parse_signed_duration
from kai_es.ingest.bounds import MAX_DURATION_NS
from kai_es.ingest.groupers import CHAIN_ONLY, TABLE
from kai_es.ingest.groupers.rules import GroupingRule
from kai_es.ingest.names import SCHEDULER_NAME, scheduler_name_problem
from kai_es.scheduling.policy import (CURRENT_POLICY, ActionName, config_actions, has_background_pods,
                                     honours_queue_depth, reclaims_by_queue_priority)
from kai_es.scheduling.predicates.selector_text import SelectorError, parse_selector
from kai_es.scheduling.rules.background_pods import DEFAULT_SELECTOR as DEFAULT_BACKGROUND_SELECTOR

class _Cfg(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    pass


class PlacementStrategy(_Cfg, kw_only=True, frozen=True):
    gpu: Literal["binpack", "spread", "fragmentation"] = "binpack"
    cpu: Literal["binpack", "spread"] = "binpack"


class MinRuntime(_Cfg, kw_only=True, frozen=True):
    """KAI's minruntime plugin arguments: the defaults for queues that set no min-runtime, and
    how a reclaim victim's min-runtime is resolved (`kai_es.scheduling.rules.min_runtime`): "lca" from the
    victim's side just below the lowest common ancestor of the two queues, "queue" from the
    victim's own leaf queue."""

    preempt_min_runtime: str = "0s"
    reclaim_min_runtime: str = "0s"
    reclaim_resolve_method: Literal["lca", "queue"] = "lca"


class Fairshare(_Cfg, kw_only=True, frozen=True):
    """Time-based fair share (policy kai-es/v3 on; off unless `timeBased`): the over-quota split
    weighs each queue by max(W + k(W - U), 0), U its decayed usage over the last `windowSize`
    as a share of the cluster's capacity, counted in buckets of `usageResolution`; usage that
    is `halfLifePeriod` old counts half (0s: no decay).

    `kValue` is a number >= 0 with at most `MAX_K_DECIMALS` decimals (YAML `0.5`, or the text
    "0.5"); the validated config holds it exactly: an int when it is whole (`1.0` is `1`), else
    its shortest decimal text ("0.5"), so the logged config carries no float and every spelling
    of one value has one digest. `k` is that value as an exact Fraction."""

    k_value: int | float | str = 1
    window_size: str = "168h"
    half_life_period: str = "0s"
    time_based: bool = False
    usage_resolution: str = "1m"

    @property
    def k(self) -> Fraction:
        """`kValue` exactly (from its decimal text, never through a binary float)."""
        return Fraction(canonical_k_value(self.k_value))


class BackgroundPods(_Cfg, kw_only=True, frozen=True):
    """KAI's `backgroundpods` plugin arguments (policy kai-es/v10 on:
    `rules.background_pods.BackgroundPodsGiveWay`): the pods that match `labelSelector` (label
    selector text, as `kubectl get -l` takes it) in `namespaces` (empty: every namespace) are
    background pods; `enabled: false` turns the rule off. Unlike KAI, which disables the plugin
    on a selector it cannot parse, a bad or empty selector is a config error naming the field."""

    enabled: bool = True
    label_selector: str = DEFAULT_BACKGROUND_SELECTOR
    namespaces: list[str] = []


_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")
#: the most decimals a `fairshare.kValue` may have
MAX_K_DECIMALS = 6


def canonical_k_value(value: int | float | str) -> int | str:
    """`value` (a config's kValue) as the validated config holds it: an int when whole, else
    its shortest decimal text. Raises ValueError saying what is wrong (not a decimal number,
    NaN or infinite, negative, more than MAX_K_DECIMALS decimals)."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must be >= 0")
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, not {value!r}")
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        raise ValueError(f"not a decimal number >= 0 (like 0.5): {value!r}")
    # a float from YAML: its shortest repr is the decimal text the user wrote
    exact = Fraction(repr(value) if isinstance(value, float) else value)
    if exact < 0:
        raise ValueError(f"must be >= 0, not {value!r}")
    scale = 10 ** MAX_K_DECIMALS
    if scale % exact.denominator:
        raise ValueError(f"at most {MAX_K_DECIMALS} decimals, not {value!r}")
    if exact.denominator == 1:
        return int(exact)
    whole, part = divmod(exact.numerator * (scale // exact.denominator), scale)
    return f"{whole}.{part:0{MAX_K_DECIMALS}d}".rstrip("0")


def duration_ns(text: str) -> int:
    """A duration of a validated config, in ns (negative allowed: a staleness grace period)."""
    return parse_signed_duration(text)


#: the largest `queueDepthPerAction` value (a Kubernetes list holds far fewer objects)
MAX_QUEUE_DEPTH = 1_000_000_000


class SchedulerConfig(_Cfg, kw_only=True, frozen=True):
    #: None (not given): the policy version's default actions (`PolicyVersion.default_actions`); the
    #: validated config always holds the list
    actions: list[ActionName] | None = None
    placement_strategy: PlacementStrategy = PlacementStrategy()
    gpu_sharing_order: Literal["gpupack", "gpuspread"] = "gpupack"
    min_runtime: MinRuntime = MinRuntime()
    default_staleness_grace_period: str = "60s"
    fairshare: Fairshare = Fairshare()
    #: a released version of `kai_es.scheduling.policy` (an unknown one is an error)
    policy_version: str = CURRENT_POLICY
    state_digest_every: int = 1
    #: consolidation moves at most this many jobs per cycle (-1: no limit; 0: off), KAI's
    #: `--max-consolidation-preemptees`
    max_consolidation_preemptees: int = 16
    #: no-code grouping rules for owner kinds the podgrouper's table does not know (read by the
    #: informer and the scenario loader, not by the cycle): `kai_es.ingest.groupers.rules`
    grouping: list[GroupingRule] = []
    #: the scheduler name kai-es answers to (KAI's `--scheduler-name`): it schedules the pods
    #: whose `spec.schedulerName` is this and leaves every other pod to its own scheduler, so
    #: kai-es can run beside a KAI that keeps `kai-scheduler`. Read by the informer and the
    #: scenario loader as well as the reducer (the config in force is in the log, so replay knows it)
    scheduler_name: str = SCHEDULER_NAME
    #: a Running pod being deleted for longer than this (since its `deletionTimestamp`) is stuck
    #: releasing: its capacity is not pipelined onto (KAI's `--stuck-in-releasing-threshold`;
    #: read by kai-es/v7's `rules.releasing_capacity.StuckReleasingHeld`)
    stuck_in_releasing_threshold: str = "2m"
    #: reclaim may also take in-quota resources of a queue of strictly lower priority than the
    #: reclaiming one, which stays within its deserved quota (KAI's proportion argument
    #: `queuePriorityInQuotaReclaim`, off by default; policy kai-es/v8 on:
    #: `rules.reclaim_victims.QueuePriorityInQuota`)
    queue_priority_in_quota_reclaim: bool = False
    #: which running pods are background pods, whose capacity counts as free while a cycle
    #: plans (KAI's `backgroundpods` plugin; policy kai-es/v10 on)
    background_pods: BackgroundPods = BackgroundPods()
    #: action -> how many of each queue's waiting jobs it considers, the first in KAI's job order
    #: (KAI's `queueDepthPerAction`; each key one of the config's actions; policy kai-es/v13 on:
    #: `rules.queue_depth`)
    queue_depth_per_action: dict[ActionName, int] = {}

    @property
    def action_list(self) -> list[ActionName]:
        """The actions to run, in order (the policy's defaults when the config lists none)."""
        assert self.actions is not None, "set by __post_init__"
        return self.actions

    def __post_init__(self) -> None:
        for name, value in (
            ("minRuntime.preemptMinRuntime", self.min_runtime.preempt_min_runtime),
            ("minRuntime.reclaimMinRuntime", self.min_runtime.reclaim_min_runtime),
            ("defaultStalenessGracePeriod", self.default_staleness_grace_period),
            ("fairshare.windowSize", self.fairshare.window_size),
            ("fairshare.halfLifePeriod", self.fairshare.half_life_period),
            ("fairshare.usageResolution", self.fairshare.usage_resolution),
            ("stuckInReleasingThreshold", self.stuck_in_releasing_threshold),
        ):
            try:
                # a negative staleness grace period means "never evict stale" (as KAI)
                ns = (parse_signed_duration if name == "defaultStalenessGracePeriod" else parse_duration)(value)
            except ValueError as exc:
                raise msgspec.ValidationError(f"{exc} - at `$.{name}`") from None
            if abs(ns) > MAX_DURATION_NS:
                raise msgspec.ValidationError(f"longer than 100 years - at `$.{name}`")
        if parse_duration(self.fairshare.usage_resolution) <= 0:
            raise msgspec.ValidationError("must be positive - at `$.fairshare.usageResolution`")
        if self.fairshare.time_based and parse_duration(self.fairshare.window_size) <= 0:
            raise msgspec.ValidationError("must be positive with timeBased - at `$.fairshare.windowSize`")
        try:
            k_value = canonical_k_value(self.fairshare.k_value)
        except ValueError as exc:
            raise msgspec.ValidationError(f"{exc} - at `$.fairshare.kValue`") from None
        if not isinstance(self.fairshare.k_value, int):  # (an int is kept as it is)
            msgspec.structs.force_setattr(self.fairshare, "k_value", k_value)
        if self.max_consolidation_preemptees < -1:
            raise msgspec.ValidationError("must be >= -1 (-1: no limit) - at `$.maxConsolidationPreemptees`")
        kinds = [(r.group, r.kind) for r in self.grouping]
        for group, kind in kinds:
            if kinds.count((group, kind)) > 1:
                raise msgspec.ValidationError(f"two rules for {group}/{kind} - at `$.grouping`")
            if (group, kind) in TABLE or (group, kind) in CHAIN_ONLY:
                raise msgspec.ValidationError(f"{group}/{kind} has a built-in grouping rule - at `$.grouping`")
        problem = scheduler_name_problem(self.scheduler_name)
        if problem:
            raise msgspec.ValidationError(f"{problem} - at `$.schedulerName`")
        if self.state_digest_every < 0:
            raise msgspec.ValidationError("must be >= 0 - at `$.stateDigestEvery`")
        # what depends on the policy version is the registry's to check and default
        actions = config_actions(self.policy_version, self.actions)
        if self.queue_priority_in_quota_reclaim and not reclaims_by_queue_priority(self.policy_version):
            raise msgspec.ValidationError(f"policy {self.policy_version} has no in-quota reclaim by queue "
                                          "priority (kai-es/v8 on) - at `$.queuePriorityInQuotaReclaim`")
        try:
            parse_selector(self.background_pods.label_selector)
        except SelectorError as exc:
            raise msgspec.ValidationError(f"{exc} - at `$.backgroundPods.labelSelector`") from None
        for namespace in self.background_pods.namespaces:
            if not namespace or len(namespace) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace):
                raise msgspec.ValidationError(f"{namespace!r} is not a namespace name - at `$.backgroundPods.namespaces`")
        if self.background_pods != BackgroundPods() and not has_background_pods(self.policy_version):
            raise msgspec.ValidationError(f"policy {self.policy_version} has no background pods (kai-es/v10 on) "
                                          "- at `$.backgroundPods`")
        for action, depth in sorted(self.queue_depth_per_action.items()):
            where = f"`$.queueDepthPerAction.{action}`"
            if isinstance(depth, bool) or not 1 <= depth <= MAX_QUEUE_DEPTH:
                raise msgspec.ValidationError(f"must be a whole number from 1 to {MAX_QUEUE_DEPTH}, not {depth!r} "
                                              f"- at {where}")
            if action not in actions:
                raise msgspec.ValidationError(f"the actions are {', '.join(actions)}: {action} is not one of them "
                                              f"- at {where}")
        if self.queue_depth_per_action and not honours_queue_depth(self.policy_version):
            raise msgspec.ValidationError(f"policy {self.policy_version} has no queue depth (kai-es/v13 on) "
                                          "- at `$.queueDepthPerAction`")
        if actions is not self.actions:
            msgspec.structs.force_setattr(self, "actions", actions)


class ConfigError(ValueError):
    """A configuration that does not validate; the message names the field."""


def config_or_default(raw: Any) -> SchedulerConfig:
    """The config `raw` (a folded state's config in force), or all defaults when it does not
    validate: what a reader of any log assumes where the scheduler itself would refuse."""
    try:
        return parse_config(raw)
    except ConfigError:
        return parse_config({})


def parse_config(raw: Any) -> SchedulerConfig:
    """A validated SchedulerConfig from a plain mapping (None gives all defaults)."""
    try:
        return msgspec.convert(raw or {}, SchedulerConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"scheduler config: {exc}") from None


#: keys added after configs were first logged, left out of the config's JSON while at their
#: default, so that a logged config parses back to the same JSON (and digest)
_OMITTED_AT_DEFAULT: dict[tuple[str, str], object] = {
    ("fairshare", "timeBased"): False,
    ("fairshare", "usageResolution"): "1m",
    ("minRuntime", "reclaimResolveMethod"): "lca",
    ("", "maxConsolidationPreemptees"): 16,
    ("", "grouping"): [],
    ("", "schedulerName"): SCHEDULER_NAME,
    ("", "stuckInReleasingThreshold"): "2m",
    ("", "queuePriorityInQuotaReclaim"): False,
    ("", "backgroundPods"): {"enabled": True, "labelSelector": DEFAULT_BACKGROUND_SELECTOR, "namespaces": []},
    ("", "queueDepthPerAction"): {},
}


def config_to_dict(cfg: SchedulerConfig) -> dict[str, object]:
    """The fully defaulted config as a plain JSON object (camelCase keys), but for the keys
    added later (`_OMITTED_AT_DEFAULT`), which appear only when set otherwise."""
    out: dict[str, object] = msgspec.to_builtins(cfg)
    for (section, key), default in _OMITTED_AT_DEFAULT.items():
        part = out.get(section) if section else out  # "": a top-level key
        if isinstance(part, dict) and part.get(key) == default:
            del part[key]
    return out


def config_digest(cfg: SchedulerConfig) -> str:
    return "sha256:" + hashlib.sha256(canonical(config_to_dict(cfg))).hexdigest()


def config_event(config: SchedulerConfig, *, event_id: str, logicaltime: int,
                 source: str = "kai-es/scheduler") -> Envelope:
    """The ConfigApplied event announcing `config` (its digest, its canonical form)."""
    return make_envelope(
        p.ConfigApplied(config_digest=config_digest(config), config=config_to_dict(config)),
        event_id=event_id, source=source, subject="config/scheduler", logicaltime=logicaltime,
        policyversion=config.policy_version)
