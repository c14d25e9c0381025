"""What a what-if changes, and applying it to a recorded workload (pure).

Three ways to say it, applied in this order:
- `--config FILE`: a scheduler config (YAML, the keys of a Scenario's `spec.scheduler`) that
  replaces the recorded one.
- `--scenario-patch FILE`: a scenario file. Its Nodes and Queues are added, or replace the
  recorded object of the same name everywhere in the log; a Node annotated
  `kai-es.io/whatif: remove` is removed instead; a Scenario document's `spec.scheduler` replaces
  the config and its `spec.simulation.cyclePeriod` the cycle period. Anything else is an error.
- `--set KEY=VALUE` (repeatable; VALUE is YAML): `scheduler.<camelCase.path>` (e.g.
  `scheduler.placementStrategy.gpu=spread`, `scheduler.actions=[allocate,reclaim,preempt]`),
  `queue.<name>.<gpu|cpu|memory>.<quota|limit|overQuotaWeight>` in the Queue's own units (GPUs,
  millicores, MB — as in a Queue object), `queue.<name>.priority`, `nodes.remove=<name>[,<name>…]`,
  `cyclePeriod=<duration>`.

Contract: a change that names something the log does not hold (a queue, a node) or a key that
does not exist is a `ChangeError` naming it; nothing is silently ignored.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import yaml

from kai_es.events import payloads as p
from kai_es.events.timefmt import parse_duration
from kai_es.ingest import translate as tr
from kai_es.scenario import ScenarioError, load_scenario_text, parse_documents, read_text_file
from kai_es.scheduling.config import ConfigError, SchedulerConfig, config_to_dict, parse_config
from kai_es.whatif.workload import Input, PodRun, Workload

REMOVE_ANNOTATION = "kai-es.io/whatif"
_QUEUE_FIELDS = {"quota": "quota", "limit": "limit", "overQuotaWeight": "over_quota_weight"}


class ChangeError(ValueError):
    """A change that cannot be applied; the message names it."""


@dataclass(slots=True)
class Changes:
    config: dict[str, Any] | None = None  # replaces the recorded config (camelCase mapping)
    config_sets: list[tuple[list[str], Any]] = field(default_factory=list)
    queue_sets: dict[str, dict[str, Any]] = field(default_factory=dict)  # queue -> field -> value
    queues: dict[str, p.QueueObserved] = field(default_factory=dict)
    nodes: dict[str, p.NodeObserved] = field(default_factory=dict)
    remove_nodes: list[str] = field(default_factory=list)
    cycle_period_ns: int | None = None
    #: the changes as given, in order (for the report and the run's id seed)
    described: list[str] = field(default_factory=list)


def parse_set(changes: Changes, item: str) -> None:
    """Add one `KEY=VALUE` to `changes` (module docstring)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ChangeError(f"--set {item!r}: expected KEY=VALUE")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError as exc:
        raise ChangeError(f"--set {key}: the value is not YAML ({exc})") from None
    parts = key.split(".")
    changes.described.append(f"set {key}={text}")
    if parts[0] == "scheduler" and len(parts) >= 2:
        changes.config_sets.append((parts[1:], value))
    elif parts[0] == "queue" and len(parts) == 3 and parts[2] == "priority":
        try:
            priority = tr.int_field(value, "priority")
        except tr.IngestError as exc:
            raise ChangeError(f"--set {key}: {exc.message}") from None
        if not isinstance(value, int):
            raise ChangeError(f"--set {key}: the priority must be an integer, got {text!r}")
        changes.queue_sets.setdefault(parts[1], {})["priority"] = priority
    elif (parts[0] == "queue" and len(parts) == 4 and parts[2] in ("gpu", "cpu", "memory")
          and parts[3] in _QUEUE_FIELDS):
        changes.queue_sets.setdefault(parts[1], {})[f"{parts[2]}.{parts[3]}"] = value
    elif key == "nodes.remove":
        names = value if isinstance(value, list) else str(value).split(",")
        if not all(isinstance(n, (str, int)) and not isinstance(n, bool) for n in names):
            raise ChangeError(f"--set {key}: node names, comma-separated or a list, got {text!r}")
        changes.remove_nodes += [str(n).strip() for n in names if str(n).strip()]
    elif key == "cyclePeriod":
        changes.cycle_period_ns = _period(str(value), f"--set {key}")
    else:
        raise ChangeError(f"--set {key}: unknown key (expected scheduler.<path>, queue.<name>.priority, "
                          "queue.<name>.<gpu|cpu|memory>.<quota|limit|overQuotaWeight>, nodes.remove "
                          "or cyclePeriod)")


def _period(text: str, where: str) -> int:
    try:
        period = parse_duration(text)
    except ValueError as exc:
        raise ChangeError(f"{where}: {exc}") from None
    if period <= 0:
        raise ChangeError(f"{where}: must be positive")
    return period


def read_config(changes: Changes, path: str) -> None:
    """`--config FILE`: a scheduler config replacing the recorded one."""
    try:
        docs = parse_documents(read_text_file(path, "a scheduler config is YAML text"))
    except ScenarioError as exc:
        raise ChangeError(f"--config {exc}") from None
    except yaml.YAMLError as exc:
        raise ChangeError(f"--config {path}: not YAML ({exc})") from None
    if len(docs) > 1:
        raise ChangeError(f"--config {path}: one YAML document expected, found {len(docs)}")
    raw = docs[0] if docs else None
    if raw is not None and not isinstance(raw, dict):
        raise ChangeError(f"--config {path}: must be a map of scheduler settings")
    try:
        parse_config(raw)
    except ConfigError as exc:
        raise ChangeError(f"--config {path}: {exc}") from None
    changes.config = raw or {}
    changes.described.append(f"config {path}")


def read_patch(changes: Changes, path: str) -> None:
    """`--scenario-patch FILE` (module docstring)."""
    try:
        text = read_text_file(path, "a scenario patch is YAML text")
    except ScenarioError as exc:
        raise ChangeError(f"--scenario-patch {exc}") from None
    try:
        scenario = load_scenario_text(text, path)
        docs = parse_documents(text)
    except (ScenarioError, yaml.YAMLError) as exc:
        raise ChangeError(f"--scenario-patch {path}: {exc}") from None
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "Scenario":
            spec = doc.get("spec") or {}
            if "scheduler" in spec:
                changes.config = dict(spec["scheduler"] or {})
            if "cyclePeriod" in (spec.get("simulation") or {}):
                changes.cycle_period_ns = scenario.simulation.cycle_period_ns
    for obj in scenario.objects:
        payload = obj.payload
        annotations = (obj.obj.get("metadata") or {}).get("annotations") or {}
        if isinstance(payload, p.NodeObserved):
            if annotations.get(REMOVE_ANNOTATION) == "remove":
                changes.remove_nodes.append(payload.name)
            else:
                changes.nodes[payload.name] = payload
        elif isinstance(payload, p.QueueObserved):
            changes.queues[payload.name] = payload
        else:
            raise ChangeError(f"--scenario-patch {path}: document {obj.doc_index + 1} is a {obj.kind}: "
                              "a patch may add, replace or remove Nodes and add or replace Queues only")
    changes.described.append(f"scenario-patch {path}")


def apply_changes(workload: Workload, changes: Changes) -> Workload:
    """A new workload with `changes` applied (module contract); `workload` is not modified."""
    config = _config(workload.config, changes)
    queue_names = {i.payload.name for i in _inputs(workload) if isinstance(i.payload, p.QueueObserved)}
    node_names = {i.payload.name for i in _inputs(workload) if isinstance(i.payload, p.NodeObserved)}
    for name in sorted(changes.queue_sets):
        if name not in queue_names and name not in changes.queues:
            raise ChangeError(f"--set queue.{name}: the log has no queue {name!r} "
                              f"(it has: {', '.join(sorted(queue_names)) or 'none'})")
    for name in changes.remove_nodes:
        if name not in node_names:
            raise ChangeError(f"nodes.remove: the log has no node {name!r}")
    removed = set(changes.remove_nodes)

    def change(item: Input) -> Input | None:
        data = item.payload
        if isinstance(data, (p.NodeObserved, p.NodeRemoved)) and data.name in removed:
            return None
        if isinstance(data, p.NodeObserved) and data.name in changes.nodes:
            return replace(item, payload=changes.nodes[data.name])
        if isinstance(data, p.QueueObserved):
            queue = changes.queues.get(data.name, data)
            queue = _queue_set(queue, changes.queue_sets.get(data.name, {}))
            return replace(item, payload=queue)
        return item

    initial: list[Input | PodRun] = []
    for item in workload.initial:
        if isinstance(item, PodRun):
            initial.append(item)
            continue
        new = change(item)
        if new is not None:
            initial.append(new)
    t0 = workload.start_ns
    added = [Input(at_ns=t0, order=-1, payload=n, subject=f"node/{n.name}")
             for name, n in sorted(changes.nodes.items()) if name not in node_names]
    added += [Input(at_ns=t0, order=-1, payload=_queue_set(q, changes.queue_sets.get(name, {})),
                    subject=f"queue/{name}") for name, q in sorted(changes.queues.items()) if name not in queue_names]
    last_node = max((i for i, x in enumerate(initial) if isinstance(x, Input)
                     and isinstance(x.payload, (p.NodeObserved, p.QueueObserved))), default=len(initial) - 1)
    initial[last_node + 1:last_node + 1] = added
    inputs = [new for new in (change(i) for i in workload.inputs) if new is not None]
    return Workload(start_ns=workload.start_ns, end_ns=workload.end_ns, config=config,
                    cycle_period_ns=changes.cycle_period_ns or workload.cycle_period_ns,
                    initial=initial, inputs=inputs, pods=workload.pods, records=workload.records)


def _inputs(workload: Workload) -> list[Input]:
    return [i for i in workload.initial if isinstance(i, Input)] + workload.inputs


def _config(recorded: SchedulerConfig, changes: Changes) -> SchedulerConfig:
    raw: dict[str, Any] = copy.deepcopy(changes.config) if changes.config is not None else config_to_dict(recorded)
    for path, value in changes.config_sets:
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ChangeError(f"--set scheduler.{'.'.join(path)}: {part} is not a map")
            node = child
        node[path[-1]] = value
    try:
        return parse_config(raw)
    except ConfigError as exc:
        raise ChangeError(f"the changed {exc}") from None


def _queue_set(queue: p.QueueObserved, sets: dict[str, Any]) -> p.QueueObserved:
    for key, value in sorted(sets.items()):
        if key == "priority":
            queue = msgspec.structs.replace(queue, priority=value)
            continue
        resource, fld = key.split(".")
        raw = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": queue.name},
               "spec": {"resources": {resource: {fld: value}}}}
        try:
            amount = getattr(getattr(tr.queue(raw), resource), _QUEUE_FIELDS[fld])
        except tr.IngestError as exc:
            raise ChangeError(f"--set queue.{queue.name}.{key}: {exc.message}") from None
        res = msgspec.structs.replace(getattr(queue, resource), **{_QUEUE_FIELDS[fld]: amount})
        queue = msgspec.structs.replace(queue, **{resource: res})
    try:
        tr.check_queue(queue)  # the same cross-field rules as a Queue the informer reads
    except tr.IngestError as exc:
        edited = ", ".join(f"queue.{queue.name}.{k}" for k in sorted(sets))
        raise ChangeError(f"--set {edited}: queue {queue.name!r} would break a Queue's rule: "
                          f"{exc.path}: {exc.message}") from None
    return queue
