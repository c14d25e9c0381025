"""Scheduling shards (KAI's `SchedulingShard`): which shard's log each cluster object goes to.

A shard is a name and a partition value. As KAI's scheduler filters its partition
(`SchedulingNodePoolParams.GetLabelSelector`), a shard owns the Nodes, Queues and PodGroups
labelled `kai.scheduler/node-pool=<value>`; the shard whose value is "" owns those without the
label. Every shard has a log of its own (`shard_log_url`), folded by its own reducer and
scheduled by its own scheduler and binder: each shard's log is a whole, ordinary kai-es log, so
replay, explain and what-if work on it unchanged. The informer is the only process that sees
every shard; `Router` (pure, deterministic: the same inputs in the same order give the same
outputs) tells it where each observation goes:

- Node, Queue, PodGroup: to the shard of their own label; no shard serves it: nowhere.
- Pod bound to an observed node (`spec.nodeName`): to that node's shard, whoever scheduled it (it
  occupies the node). Otherwise (not bound, or bound to a node not or no longer observed):
  kai-es's pods go to their PodGroup's shard once the PodGroup is observed (KAI: the PodGroup
  carries the label, the top owner's else the pod's), before that by their own label; other
  schedulers' pods go nowhere. An unbound pod of ours whose node pool no shard serves is
  rejected (`Rejected`), named with its pool, into the `home` shard. Where a pod goes depends
  only on the pod and the objects observed now, never on where it went before, so an informer
  started afresh routes everything as a long-running one does.
- PriorityClass, Topology, Namespace, ConfigMap, PersistentVolume(Claim): to every shard.
- A removal goes where its object is. When an object's shard changes (a node or queue
  relabelled, a pod bound), it is removed from the old shard's log first, then added to the new
  one's; the pods on a moved node and the unbound pods of a moved PodGroup follow. So no object
  is ever in two shards: a process that dies between the two appends leaves it in none, until
  its next relist.
- An unchanged observation going where it went last is dropped (`Route` is empty).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kai_es.events import payloads as p
from kai_es.ingest.translate import NODE_POOL_LABEL, subject_of

#: the shard whose log is the base log itself (`shard_log_url`): KAI's default shard's name
DEFAULT_SHARD = "default"
#: a shard name: a DNS label (it names a Kafka topic suffix, a file, a Deployment)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: a Kubernetes label value
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
#: kinds every shard reads
BROADCAST = (p.PriorityClassObserved, p.PriorityClassRemoved, p.TopologyObserved, p.TopologyRemoved,
             p.NamespaceObserved, p.NamespaceRemoved, p.ConfigMapObserved, p.ConfigMapRemoved,
             p.VolumeObserved, p.VolumeRemoved, p.ClaimObserved, p.ClaimRemoved)


K = TypeVar("K")


class ShardError(ValueError):
    """A shard declaration or name that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class Shard:
    name: str
    #: the `kai.scheduler/node-pool` value it owns ("": objects without the label)
    value: str


@dataclass(frozen=True, slots=True)
class ShardMap:
    """The cluster's shards (at least one; names and values each distinct)."""

    shards: tuple[Shard, ...]

    def __post_init__(self) -> None:
        if not self.shards:
            raise ShardError("no shard declared")
        for shard in self.shards:
            check_name(shard.name)
            if not _VALUE.match(shard.value):
                raise ShardError(f"shard {shard.name!r}: {shard.value!r} is not a label value "
                                 "(at most 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)")
        for attr in ("name", "value"):
            seen: set[str] = set()
            for shard in self.shards:
                key = getattr(shard, attr)
                if key in seen:
                    raise ShardError(f"two shards have the {attr} {key!r}")
                seen.add(key)

    @classmethod
    def parse(cls, specs: Sequence[str]) -> ShardMap:
        """From `NAME=VALUE` texts (`--shard gpu=gpu-nodes`; `--shard default=` owns the
        unlabelled objects)."""
        shards = []
        for spec in specs:
            name, sep, value = spec.partition("=")
            if not sep:
                raise ShardError(f"--shard {spec!r}: expected NAME=VALUE (the node-pool label value; "
                                 "empty for the unlabelled objects)")
            shards.append(Shard(name, value))
        return cls(tuple(shards))

    def of_value(self, value: str) -> Shard | None:
        for shard in self.shards:
            if shard.value == value:
                return shard
        return None

    def of_labels(self, labels: Mapping[str, str]) -> Shard | None:
        return self.of_value(labels.get(NODE_POOL_LABEL, ""))

    @property
    def home(self) -> Shard:
        """Where rejections go: the shard of unlabelled objects, else the first."""
        return self.of_value("") or self.shards[0]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.shards)


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ShardError(f"shard name {name!r}: expected a DNS label (at most 63 of a-z 0-9 -, "
                         "starting and ending alphanumeric)")
    return name


def shard_log_url(base: str, shard: str) -> str:
    """The log of `shard` when the base log is `base`: `base` itself for `default`; else
    `kafka://hosts/<topic>.<shard>` (a `transactional_id` in the query gets `.<shard>` too, so
    two shards' writers never fence each other), or the file `<stem>.<shard><suffix>` beside a
    file log (`events.jsonl` -> `events.gpu.jsonl`). `memory:` has no shards."""
    check_name(shard)
    if shard == DEFAULT_SHARD:
        return base
    if base.startswith("kafka://"):  # kafka://hosts[/topic][?query]: plain text, kept as written
        rest, qmark, query = base[len("kafka://"):].partition("?")
        hosts, _, topic = rest.partition("/")
        params = [f"{part}.{shard}" if part.startswith("transactional_id=") else part
                  for part in query.split("&")] if qmark else []
        return f"kafka://{hosts}/{topic or 'kai-es.events'}.{shard}" + (f"?{'&'.join(params)}" if qmark else "")
    if base == "memory:":
        raise ShardError("memory: is one log: a shard needs a file or a Kafka topic")
    head, sep, tail = base.rpartition("/")
    stem, dot, suffix = tail.rpartition(".")
    if not dot or not stem:
        return f"{base}.{shard}"
    return f"{head}{sep}{stem}.{shard}.{suffix}"


def shard_writer(writer: str, shard: str | None) -> str:
    """A role's Kafka transactional id in `shard` (the role's own in `default` or unsharded)."""
    return writer if shard in (None, DEFAULT_SHARD) else f"{writer}.{shard}"


@dataclass(frozen=True, slots=True)
class Rejected:
    """A pod of ours that no shard can schedule, with the reason."""

    payload: p.PodObserved
    reason: str


@dataclass(slots=True)
class Route:
    """What one observation becomes, as (shard name, payload) pairs: `sends` first, then, when
    the observation moves objects between shards, `moves` (their removals from the old shards,
    which must be durable before) `adds` (them in the new ones); and a rejection when the object
    belongs to no shard although it asks to be scheduled."""

    sends: list[tuple[str, p.Payload]] = field(default_factory=list)
    moves: list[tuple[str, p.Payload]] = field(default_factory=list)
    adds: list[tuple[str, p.Payload]] = field(default_factory=list)
    rejected: Rejected | None = None


#: the kinds whose objects belong to one shard, by Kubernetes kind (the others go to every shard)
PARTITIONED: dict[str, type[p.Payload]] = {"Node": p.NodeObserved, "Queue": p.QueueObserved,
                                           "PodGroup": p.PodGroupObserved, "Pod": p.PodObserved}
_MOVABLE = tuple(PARTITIONED.values())


def _removal(payload: p.Payload) -> p.Payload:
    if isinstance(payload, p.NodeObserved):
        return p.NodeRemoved(name=payload.name)
    if isinstance(payload, p.QueueObserved):
        return p.QueueRemoved(name=payload.name)
    if isinstance(payload, p.PodGroupObserved):
        return p.PodGroupRemoved(namespace=payload.namespace, name=payload.name)
    assert isinstance(payload, p.PodObserved)
    return p.PodRemoved(namespace=payload.namespace, name=payload.name, uid=payload.uid)


def _subject(payload: p.Payload) -> str:
    return subject_of(payload)


class Router:
    """Where each observation goes (module docstring). `ours`: the scheduler name kai-es
    answers to. Holds, per routed object, its shard and last payload; nothing else."""

    def __init__(self, shards: ShardMap, ours: str) -> None:
        self.shards = shards
        self.ours = ours
        self.where: dict[str, str] = {}
        self.last: dict[str, p.Payload] = {}
        self._pods_on_node: dict[str, set[str]] = {}
        self._pods_of_group: dict[tuple[str, str], set[str]] = {}
        self._pod_links: dict[str, tuple[str, tuple[str, str]]] = {}
        #: the node-pool label of each Queue and PodGroup routed (their payloads do not carry it)
        self._group_pools: dict[str, str] = {}

    # -- where things belong ---------------------------------------------------------------------

    def _labelled(self, labels: Mapping[str, str]) -> str | None:
        shard = self.shards.of_labels(labels)
        return shard.name if shard is not None else None

    def _pod_target(self, pod: p.PodObserved) -> str | None:
        if pod.node_name and f"node/{pod.node_name}" in self.last:
            return self.where.get(f"node/{pod.node_name}")  # the node decides, routed or not
        if pod.scheduler_name != self.ours:
            return None
        group = f"podgroup/{pod.namespace}/{pod.podgroup}"
        if group in self.last:  # the PodGroup was observed: it decides, routed or not
            return self.where.get(group)
        shard = self.shards.of_value(pod.node_pool)
        return shard.name if shard is not None else None

    # -- routing ---------------------------------------------------------------------------------

    def prune(self, kind: type[p.Payload], seen: set[str]) -> None:
        """A relist of `kind` saw only `seen`: forget the others (each shard's relist bracket
        drops them from its state, so no removal is sent)."""
        for subject in [s for s, payload in self.last.items() if type(payload) is kind and s not in seen]:
            self._unlink(subject)
            del self.last[subject]
            self.where.pop(subject, None)
            self._group_pools.pop(subject, None)

    def route(self, payload: p.Payload, labels: Mapping[str, str] | None = None, *,
              relisting: bool = False) -> Route:
        """Where `payload` (an observed or removed payload) goes; `labels`: the object's labels
        (Queue and PodGroup payloads do not carry them). `relisting`: it is part of a relist,
        so it is sent even when unchanged."""
        out = Route()
        if isinstance(payload, BROADCAST):
            out.sends = [(name, payload) for name in self.shards.names]
            return out
        subject = _subject(payload)
        if not isinstance(payload, _MOVABLE):  # a removal
            old = self.where.pop(subject, None)
            last = self.last.pop(subject, None)
            self._unlink(subject)
            self._group_pools.pop(subject, None)
            if old is not None:
                out.sends.append((old, payload))
            if last is not None:
                self._followers(last, out)
            return out
        if isinstance(payload, p.NodeObserved):
            target = self._labelled(payload.labels)
        elif isinstance(payload, (p.QueueObserved, p.PodGroupObserved)):
            target = self._labelled(labels or {})
            self._group_pools[subject] = (labels or {}).get(NODE_POOL_LABEL, "")
        else:
            assert isinstance(payload, p.PodObserved)
            target = self._pod_target(payload)
        old = self.where.get(subject)
        first = subject not in self.last
        if old == target and self.last.get(subject) == payload and not relisting:
            return out
        self.last[subject] = payload
        if target is None:
            self.where.pop(subject, None)
        else:
            self.where[subject] = target
        leads = not isinstance(payload, p.PodObserved) and (first or old != target)
        if old is not None and old != target:
            if leads:
                self._followers(payload, out)  # its pods leave first, and arrive after it
            out.moves.append((old, _removal(payload)))
            if target is not None:
                out.adds.insert(0, (target, payload))
        else:
            if target is not None:
                out.sends.append((target, payload))
            if leads:
                self._followers(payload, out)
        if isinstance(payload, p.PodObserved):
            self._link(subject, payload)
            if target is None and payload.scheduler_name == self.ours and not payload.node_name:
                out.rejected = Rejected(payload, self._no_shard(payload))
        return out

    def shard_of_subject(self, subject: str) -> str:
        """Where a rejection of `subject` goes: its shard, else `home`."""
        return self.where.get(subject, self.shards.home.name)

    def _no_shard(self, pod: p.PodObserved) -> str:
        group = f"podgroup/{pod.namespace}/{pod.podgroup}"
        served = ", ".join(repr(s.value) for s in self.shards.shards)
        if group in self.last:
            return (f"its PodGroup {pod.namespace}/{pod.podgroup} is in node pool "
                    f"{self._group_pools.get(group, '')!r} (label {NODE_POOL_LABEL}), served by no "
                    f"shard (the shards serve {served})")
        return (f"node pool {pod.node_pool!r} (label {NODE_POOL_LABEL}) is served by no shard "
                f"(the shards serve {served})")

    def _followers(self, payload: p.Payload, out: Route) -> None:
        """Re-route the pods that follow a node or PodGroup whose shard changed (or that is
        gone: then they follow nothing)."""
        if isinstance(payload, (p.NodeObserved, p.NodeRemoved)):
            pods = self._pods_on_node.get(payload.name, set())
        elif isinstance(payload, (p.PodGroupObserved, p.PodGroupRemoved)):
            pods = self._pods_of_group.get((payload.namespace, payload.name), set())
        else:
            return
        for pod_subject in sorted(pods):
            pod = self.last[pod_subject]
            assert isinstance(pod, p.PodObserved)
            new = self._pod_target(pod)
            old = self.where.get(pod_subject)
            if new == old:
                continue
            if old is not None:
                out.moves.append((old, _removal(pod)))
            if new is not None:
                out.adds.append((new, pod))
                self.where[pod_subject] = new
            else:
                self.where.pop(pod_subject, None)

    def _link(self, subject: str, pod: p.PodObserved) -> None:
        self._unlink(subject)
        group = (pod.namespace, pod.podgroup)
        self._pod_links[subject] = (pod.node_name, group)
        if pod.node_name:
            self._pods_on_node.setdefault(pod.node_name, set()).add(subject)
        self._pods_of_group.setdefault(group, set()).add(subject)

    def _unlink(self, subject: str) -> None:
        link = self._pod_links.pop(subject, None)
        if link is None:
            return
        node, group = link
        _discard(self._pods_on_node, node, subject)
        _discard(self._pods_of_group, group, subject)


def _discard(index: dict[K, set[str]], key: K, subject: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(subject)
        if not members:
            del index[key]
