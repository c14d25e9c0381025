"""No-code grouping rules (KAI's Karta idea, in kai-es's own form): an owner kind the table does not
know is described as data — where its replica counts are, which pods make up which component —
in the scheduler config's `grouping` list, and grouped from that. Pure.

```yaml
grouping:
- group: example.com          # the owner kind's API group and kind (not one the table knows)
  kind: TrainingRun
  plural: trainingruns         # its resource name (the informer GETs it; RBAC: get on it)
  replicasPath: spec.replicas           # a single gang: how many pods (scenarios expand them)
  minMemberPath: spec.minAvailable      # its minimum (default: replicasPath's value, else 1)
  templatePath: spec.template           # the pod template (scenarios only)
  priorityClass: train                  # the kind's default priority class
- group: example.com
  kind: ServingGroup
  plural: servinggroups
  components:                  # one sub-group per component (KAI's Karta `podGroup.subGroups`)
  - name: router
    podSelector: {example.com/role: router}   # labels the controller sets on its pods
    replicasPath: spec.router.replicas
    minReplicasPath: spec.router.minReplicas  # the sub-group's minimum (default: replicas)
    templatePath: spec.router.template
  - {name: engine, podSelector: {example.com/role: engine}, replicasPath: spec.engine.replicas,
     templatePath: spec.engine.template}
```
A path is dotted field names, each optionally indexed (`spec.roles[0].replicas`). Without
components the PodGroup is `pg-<owner>-<uid>` with that minimum; with components it needs every
component (`minSubGroup` = their number, as Karta's), each sub-group its replicas (or min
replicas), and a pod joins the first component whose selector its labels match. Queue,
preemptibility, time and topology annotations are read as for every kind.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from kai_es.ingest.groupers.base import (
    TRAIN,
    Decision,
    Obj,
    Rule,
    Source,
    SubGroup,
    checked_sum,
    count,
    default,
    dig,
    labels,
)

_PART = re.compile(r"^([A-Za-z0-9_-]+)((?:\[[0-9]{1,6}\])*)$")
_INDEX = re.compile(r"\[([0-9]+)\]")


def parse_path(path: str) -> tuple[str | int, ...]:
    """`spec.roles[0].replicas` as ("spec", "roles", 0, "replicas"); ValueError if malformed."""
    out: list[str | int] = []
    if not path or len(path) > 500:
        raise ValueError(f"not a field path: {path[:100]!r}")
    for part in path.split("."):
        m = _PART.match(part)
        if m is None:
            raise ValueError(f"not a field path: {path!r} (dotted names, each optionally indexed like roles[0])")
        out.append(m.group(1))
        out += [int(i) for i in _INDEX.findall(m.group(2))]
    return tuple(out)


class _Rule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    pass


class Component(_Rule, frozen=True, kw_only=True):
    name: str
    pod_selector: dict[str, str]
    replicas_path: str
    min_replicas_path: str = ""
    template_path: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.pod_selector:
            raise msgspec.ValidationError("a component needs a name and a podSelector")
        _check_paths(self.replicas_path, self.min_replicas_path, self.template_path)


class GroupingRule(_Rule, frozen=True, kw_only=True):
    group: str
    kind: str
    plural: str
    replicas_path: str = ""
    min_member_path: str = ""
    template_path: str = ""
    priority_class: str = TRAIN
    components: list[Component] = []

    def __post_init__(self) -> None:
        if not self.group or not self.kind or not self.plural:
            raise msgspec.ValidationError("a grouping rule needs the owner's group, kind and plural")
        _check_paths(self.replicas_path, self.min_member_path, self.template_path)
        if self.components and (self.replicas_path or self.min_member_path or self.template_path):
            raise msgspec.ValidationError(f"{self.kind}: components exclude replicasPath, minMemberPath "
                                          "and templatePath (each component has its own)")
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise msgspec.ValidationError(f"{self.kind}: component names must differ")


def _check_paths(*paths: str) -> None:
    for path in paths:
        if path:
            try:
                parse_path(path)
            except ValueError as exc:
                raise msgspec.ValidationError(str(exc)) from None


def value_at(obj: Obj, path: str) -> Any:
    return dig(obj, *parse_path(path)) if path else None


def _count_at(top: Obj, path: str, *, default_: int | None) -> int:
    return count(top, value_at(top, path), path, default=default_)


def rule_grouper(rule: GroupingRule) -> Rule:
    """The grouping rule a GroupingRule describes."""

    def group(src: Source, top: Obj, lookup: tuple[Obj, ...]) -> Decision:
        decision = default(top, src.pod, lookup, rule.priority_class)
        if not rule.components:
            minimum = 1
            if rule.min_member_path and value_at(top, rule.min_member_path) is not None:
                minimum = _count_at(top, rule.min_member_path, default_=None)
            elif rule.replicas_path:
                minimum = _count_at(top, rule.replicas_path, default_=1)
            return decision.with_(min_member=minimum)
        subgroups = []
        pod_labels = labels(src.pod)
        pod_subgroup = ""
        for component in rule.components:
            minimum = _count_at(top, component.replicas_path, default_=None)
            if component.min_replicas_path and value_at(top, component.min_replicas_path) is not None:
                minimum = _count_at(top, component.min_replicas_path, default_=None)
            subgroups.append(SubGroup(component.name, min_member=minimum))
            if not pod_subgroup and all(pod_labels.get(k) == v for k, v in component.pod_selector.items()):
                pod_subgroup = component.name
        checked_sum(top, [sg.min_member or 0 for sg in subgroups], "components")
        return decision.with_(min_member=None, min_subgroup=len(subgroups), subgroups=tuple(subgroups),
                              pod_subgroup=pod_subgroup)

    return group
