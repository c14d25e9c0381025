"""Inter-pod affinity and anti-affinity over the pods present on nodes: those occupying a node in
the state, and those placed on the Plan earlier in this cycle (gang members included).

Contract (Kubernetes' semantics, integers only, deterministic):
- A term of pod P selects the present pods matching its label selector in its namespaces (its
  `namespaces` ∪ the namespaces matching its `namespace_selector`; both unset: P's namespace;
  an empty namespace selector: every namespace). Domains are the values of the node label
  `topology_key`; a node without that label is in no domain.
- Required affinity: every term needs a present matching pod in the node's domain that the Plan
  does not evict (a pod the Plan evicts or moves away is *leaving*: still present for
  anti-affinity until it is gone, but no reason to come), except that when no term has such a
  pod anywhere and P matches all its own terms, any node passes (the first pod of a group that
  wants to be together). A pod the Plan moves is present at both nodes, leaving the first.
- Required anti-affinity: no present pod matching the term in the node's domain; and
  symmetrically, no present pod whose own required anti-affinity term matches P in the node's
  domain.
- Preferred terms score a node by weight × matching pods in its domain (negative for
  anti-affinity), including, symmetrically, present pods' preferred terms that match P.
- Present pods are counted per term class in domain-count maps that the Plan's listener keeps
  up to date (`placed`/`unplaced`), so a pod's mask costs O(nodes in the affected domains), not
  a scan of every pod per node. The counts after any sequence of placements and rollbacks equal
  a recount from scratch (`verify` compares them; the property tests call it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kai_es.events import payloads as p
from kai_es.events.codec import canonical
from kai_es.scheduling.predicates.labels import describe, selector_matches
from kai_es.state.model import OCCUPYING, ClusterState

REQUIRED_ANTI = 0
PREFERRED = 1  # weight > 0: affinity, < 0: anti-affinity


@dataclass(slots=True)
class TermClass:
    """One term as seen from one namespace: which pods it selects, and where they are."""

    term: p.PodAffinityTerm
    own_namespace: str
    all_namespaces: bool
    namespaces: frozenset[str]
    #: domain value -> number of present matching pods
    counts: dict[str, int] = field(default_factory=dict)
    #: domain value -> pod keys of the present matching pods (for reasons)
    members: dict[str, set[str]] = field(default_factory=dict)
    #: domain value -> how many of the present matching pods the Plan evicts (leaving: they
    #: still count against anti-affinity, but satisfy no affinity)
    leaving: dict[str, int] = field(default_factory=dict)
    leaving_members: dict[str, set[str]] = field(default_factory=dict)

    def staying(self) -> dict[str, int]:
        """Per domain, the present matching pods that are not leaving (zero counts left out)."""
        if not self.leaving:
            return self.counts
        out = {d: c - self.leaving.get(d, 0) for d, c in self.counts.items()}
        return {d: c for d, c in out.items() if c > 0}

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return (self.all_namespaces or namespace in self.namespaces) and \
            selector_matches(self.term.selector, labels)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(slots=True)
class HolderClass:
    """A term carried by present pods (for the symmetric rules): where its holders are."""

    term: TermClass
    kind: int
    weight: int
    #: domain value -> number of present holders
    counts: dict[str, int] = field(default_factory=dict)
    holders: dict[str, set[str]] = field(default_factory=dict)


def _bump(counts: dict[str, int], members: dict[str, set[str]], domain: str, key: str, sign: int) -> None:
    n = counts.get(domain, 0) + sign
    if n:
        counts[domain] = n
    else:
        counts.pop(domain, None)
    group = members.setdefault(domain, set())
    if sign > 0:
        group.add(key)
    else:
        group.discard(key)
        if not group:
            del members[domain]


def _where(topology_key: str, domain: str) -> str:
    return f"on node {domain}" if topology_key == HOSTNAME_LABEL else f"in {topology_key}={domain}"


HOSTNAME_LABEL = "kubernetes.io/hostname"


class PodAffinityIndex:
    """Present pods by term class and domain for one cycle (see module docstring)."""

    def __init__(self, state: ClusterState, node_labels: Sequence[Mapping[str, str]],
                 node_names: Sequence[str], node_index: Mapping[str, int] | None = None) -> None:
        """`node_index`: name -> position in `node_names`, when the caller has it (read only)."""
        self.state = state
        self.node_labels = node_labels
        self.node_names = node_names
        self.node_index = {n: i for i, n in enumerate(node_names)} if node_index is None else node_index
        self._classes: dict[bytes, TermClass] = {}
        #: classes indexed by one (key, value) of their selector's match_labels; the rest
        self._by_label: dict[tuple[str, str], list[TermClass]] = {}
        self._unindexed: list[TermClass] = []
        self._domains: dict[str, dict[str, list[int]]] = {}
        #: pods the Plan placed (or moved): key -> (spec, node index)
        self._planned: dict[str, tuple[p.PodObserved, int]] = {}
        #: occupying pods the Plan evicts (or moves away): key -> (spec, node index)
        self._leaving: dict[str, tuple[p.PodObserved, int]] = {}
        #: the planned pods with required affinity terms (see `needed`)
        self._planned_affinity: dict[str, tuple[p.PodObserved, int]] = {}
        self._holders: dict[tuple[bytes, int, int], HolderClass] = {}
        self.holders_version = 0
        self._holders_built = False

    # -- domains ------------------------------------------------------------------------------

    def domain_nodes(self, topology_key: str) -> dict[str, list[int]]:
        """domain value -> node indices (ascending) for a topology key."""
        found = self._domains.get(topology_key)
        if found is None:
            found = {}
            for i, labels in enumerate(self.node_labels):
                value = labels.get(topology_key)
                if value is not None:
                    found.setdefault(value, []).append(i)
            self._domains[topology_key] = found
        return found

    def domain_of(self, node: int, topology_key: str) -> str | None:
        return self.node_labels[node].get(topology_key)

    # -- present pods ------------------------------------------------------------------------

    def _candidates(self, sel: p.LabelSelector | None) -> list[str] | None:
        """Pod keys that may match `sel` (from the state's label index), or None: any pod."""
        if sel is None:
            return []
        index = self.state.pods_by_label
        best: set[str] | None = None
        for key, value in sel.match_labels.items():
            found = index.get(key, {}).get(value, set())
            if best is None or len(found) < len(best):
                best = found
        for req in sel.match_expressions:
            if req.operator in ("In", "Exists"):
                values = index.get(req.key, {})
                chosen = req.values if req.operator == "In" else list(values)
                found = set().union(*(values.get(v, set()) for v in chosen)) if chosen else set()
                if best is None or len(found) < len(best):
                    best = found
        return None if best is None else sorted(best)

    # -- term classes ------------------------------------------------------------------------

    def term_class(self, term: p.PodAffinityTerm, namespace: str) -> TermClass:
        everywhere = term.namespace_selector is not None and not term.namespace_selector.match_labels \
            and not term.namespace_selector.match_expressions
        own = not term.namespaces and term.namespace_selector is None
        key = canonical(term) + b"\x00" + (namespace.encode() if own else b"")
        found = self._classes.get(key)
        if found is not None:
            return found
        if own:
            namespaces = frozenset({namespace})
        else:
            chosen = set(term.namespaces)
            if term.namespace_selector is not None and not everywhere:
                chosen |= {ns for ns, labels in sorted(self.state.namespaces.items())
                           if selector_matches(term.namespace_selector, labels)}
                # a namespace never observed still has its name label
                for pod_ns in self._pod_namespaces():
                    if pod_ns not in self.state.namespaces and selector_matches(
                            term.namespace_selector, {"kubernetes.io/metadata.name": pod_ns}):
                        chosen.add(pod_ns)
            namespaces = frozenset(chosen)
        cls = TermClass(term, namespace, everywhere, namespaces)
        # count the present pods it selects
        pods, index = self.state.pods, self.node_index
        candidates = self._candidates(term.selector)
        keys = candidates if candidates is not None else sorted(pods)
        for pod_key in keys:
            pod = pods.get(pod_key)
            if pod is None or pod.status not in OCCUPYING or pod.node not in index:
                continue
            self._count(cls, pod_key, pod.spec, index[pod.node], +1)
        for pod_key, (spec, node) in sorted(self._planned.items()):
            self._count(cls, pod_key, spec, node, +1)
        for pod_key, (spec, node) in sorted(self._leaving.items()):
            self._count(cls, pod_key, spec, node, +1, leaving=True)
        self._classes[key] = cls
        sel = term.selector
        if sel is not None and sel.match_labels:
            first = min(sel.match_labels.items())
            self._by_label.setdefault(first, []).append(cls)
        elif sel is not None:
            self._unindexed.append(cls)
        return cls

    def _pod_namespaces(self) -> list[str]:
        return sorted({pod.spec.namespace for pod in self.state.pods.values()})

    def _count(self, cls: TermClass, pod_key: str, spec: p.PodObserved, node: int, sign: int,
               *, leaving: bool = False) -> None:
        """Count the pod in `cls` (its leaving pods with `leaving`) when the term selects it."""
        if not cls.selects(spec.namespace, spec.labels):
            return
        domain = self.domain_of(node, cls.term.topology_key)
        if domain is not None:
            if leaving:
                _bump(cls.leaving, cls.leaving_members, domain, pod_key, sign)
            else:
                _bump(cls.counts, cls.members, domain, pod_key, sign)

    def _classes_for(self, labels: Mapping[str, str]) -> list[TermClass]:
        """Each class that may select a pod with `labels` once: those indexed under one of its
        label pairs, then the unindexed ones."""
        if not self._by_label:  # (no term indexed by a label: the common cluster without affinity)
            return list(self._unindexed)
        seen: set[int] = set()
        out: list[TermClass] = []
        for pair in labels.items():
            for cls in self._by_label.get(pair, ()):
                if id(cls) not in seen:
                    seen.add(id(cls))
                    out.append(cls)
        out.extend(self._unindexed)
        return out

    # -- holders (the symmetric rules) -------------------------------------------------------

    def _build_holders(self) -> None:
        self._holders_built = True
        pods, index = self.state.pods, self.node_index
        for key in sorted(self.state.affinity_pods):
            pod = pods[key]
            if pod.status in OCCUPYING and pod.node in index:
                self._hold(key, pod.spec, index[pod.node], +1)
        for key, (spec, node) in sorted(self._planned.items()):
            self._hold(key, spec, node, +1)

    def _hold(self, pod_key: str, spec: p.PodObserved, node: int, sign: int) -> None:
        items = [(t, REQUIRED_ANTI, 0) for t in spec.pod_anti_affinity]
        items += [(w.term, PREFERRED, w.weight) for w in spec.preferred_pod_affinity]
        items += [(w.term, PREFERRED, -w.weight) for w in spec.preferred_pod_anti_affinity]
        for term, kind, weight in items:
            cls = self.term_class(term, spec.namespace)
            hkey = (canonical(term) + b"\x00" + spec.namespace.encode(), kind, weight)
            holder = self._holders.get(hkey)
            if holder is None:
                holder = self._holders[hkey] = HolderClass(cls, kind, weight)
                self.holders_version += 1
            domain = self.domain_of(node, term.topology_key)
            if domain is not None:
                _bump(holder.counts, holder.holders, domain, pod_key, sign)

    def holders(self) -> list[HolderClass]:
        """The holder classes with present holders, in a fixed order."""
        if not self._holders_built:
            self._build_holders()
        if not self._holders:
            return []
        return [self._holders[k] for k in sorted(self._holders) if self._holders[k].counts]

    def has_holders(self) -> bool:
        return bool(self.holders())

    # -- plan listener -----------------------------------------------------------------------

    def placed(self, pod_key: str, spec: p.PodObserved, node: int) -> None:
        self._planned[pod_key] = (spec, node)
        if spec.pod_affinity:
            self._planned_affinity[pod_key] = (spec, node)
        self._update(pod_key, spec, node, +1)

    def unplaced(self, pod_key: str, spec: p.PodObserved, node: int) -> None:
        self._update(pod_key, spec, node, -1)
        del self._planned[pod_key]
        self._planned_affinity.pop(pod_key, None)

    def needed(self, pod_key: str) -> bool:
        """Whether a pod the Plan placed (or moved) may need `pod_key` where it is for one of its
        required affinity terms: it matches the term in the placed pod's domain. Such a pod
        must not leave in the same cycle (its leaving would break a placement just made)."""
        if not self._planned_affinity:
            return False
        for key in sorted(self._planned_affinity):
            spec, node = self._planned_affinity[key]
            for term in spec.pod_affinity:
                domain = self.domain_of(node, term.topology_key)
                if domain is not None and pod_key in self.term_class(term, spec.namespace).members.get(domain, ()):
                    return True
        return False

    def evicted(self, pod_key: str, spec: p.PodObserved, node: int, sign: int) -> None:
        """An occupying pod the Plan evicts (`sign=+1`), or the eviction's undoing (-1): it
        stays present (anti-affinity keeps counting it until it is gone) but is leaving."""
        if sign > 0:
            self._leaving[pod_key] = (spec, node)
        else:
            del self._leaving[pod_key]
        for cls in self._classes_for(spec.labels):
            self._count(cls, pod_key, spec, node, sign, leaving=True)

    def _update(self, pod_key: str, spec: p.PodObserved, node: int, sign: int) -> None:
        for cls in self._classes_for(spec.labels):
            self._count(cls, pod_key, spec, node, sign)
        if self._holders_built and (spec.pod_anti_affinity or spec.preferred_pod_affinity
                                    or spec.preferred_pod_anti_affinity):
            self._hold(pod_key, spec, node, sign)

    def verify(self) -> list[str]:
        """Differences between every class's and holder's incremental counts and a recount of
        the present pods from scratch (empty: consistent)."""
        fresh = PodAffinityIndex(self.state, self.node_labels, self.node_names)
        fresh._planned = dict(self._planned)
        fresh._leaving = dict(self._leaving)
        out = []
        for key in sorted(self._classes):
            cls = self._classes[key]
            again = fresh.term_class(cls.term, cls.own_namespace)
            if (again.counts, again.members, again.leaving) != (cls.counts, cls.members, cls.leaving):
                out.append(f"term {describe(cls.term.selector)}@{cls.term.topology_key}: "
                           f"{cls.counts} != recount {again.counts}")
        if self._holders_built:
            fresh._build_holders()
            mine = {k: (h.counts, h.holders) for k, h in self._holders.items() if h.counts}
            theirs = {k: (h.counts, h.holders) for k, h in fresh._holders.items() if h.counts}
            if mine != theirs:
                out.append("holder counts differ from a recount")
        return out

    # -- verdicts ----------------------------------------------------------------------------

    def forbidden_and_allowed(self, spec: p.PodObserved) -> tuple[set[int], list[set[int]], list[str]]:
        """(nodes forbidden by anti-affinity, allowed node sets of affinity terms — a node must
        be in each —, why: one example per violated rule)."""
        forbidden: set[int] = set()
        why: list[str] = []
        for term in spec.pod_anti_affinity:
            cls = self.term_class(term, spec.namespace)
            domains = self.domain_nodes(term.topology_key)
            for domain in sorted(cls.counts):
                forbidden.update(domains.get(domain, ()))
            if cls.counts:
                domain = min(cls.counts)
                example = min(cls.members[domain])
                why.append(f"anti:pod {example} ({describe(term.selector)}) already "
                           f"{_where(term.topology_key, domain)}")
        for holder in self.holders():
            if holder.kind != REQUIRED_ANTI or not holder.term.selects(spec.namespace, spec.labels):
                continue
            domains = self.domain_nodes(holder.term.term.topology_key)
            for domain in sorted(holder.counts):
                forbidden.update(domains.get(domain, ()))
            domain = min(holder.counts)
            example = min(holder.holders[domain])
            why.append(f"existing:pod {example} {_where(holder.term.term.topology_key, domain)} has "
                       f"anti-affinity to {describe(holder.term.term.selector)}")
        allowed: list[set[int]] = []
        if spec.pod_affinity:
            classes = [self.term_class(t, spec.namespace) for t in spec.pod_affinity]
            staying = [c.staying() for c in classes]  # a pod the Plan evicts satisfies no affinity
            if not any(staying) and all(c.selects(spec.namespace, spec.labels) for c in classes):
                return forbidden, allowed, why
            for term, counts in zip(spec.pod_affinity, staying):
                domains = self.domain_nodes(term.topology_key)
                nodes: set[int] = set()
                for domain in counts:
                    nodes.update(domains.get(domain, ()))
                allowed.append(nodes)
                if not counts:
                    why.append(f"affinity:no pod matching {describe(term.selector)} runs in any "
                               f"{term.topology_key} domain")
        return forbidden, allowed, why

    def needs_dynamic(self, spec: p.PodObserved) -> bool:
        """Whether the pod's eligibility depends on where pods are (own terms or holders')."""
        if spec.pod_affinity or spec.pod_anti_affinity:
            return True
        holders = self.holders()
        return bool(holders) and any(h.kind == REQUIRED_ANTI and h.term.selects(spec.namespace, spec.labels)
                                     for h in holders)  # (no generator made when none: every try asks)

    def preference(self, spec: p.PodObserved) -> dict[int, int]:
        """Raw inter-pod preference score per node (absent: 0)."""
        score: dict[int, int] = {}
        terms = [(w.term, w.weight) for w in spec.preferred_pod_affinity]
        terms += [(w.term, -w.weight) for w in spec.preferred_pod_anti_affinity]
        for term, weight in terms:
            cls = self.term_class(term, spec.namespace)
            domains = self.domain_nodes(term.topology_key)
            for domain, count in sorted(cls.counts.items()):
                for node in domains.get(domain, ()):
                    score[node] = score.get(node, 0) + weight * count
        for holder in self.holders():
            if holder.kind != PREFERRED or not holder.term.selects(spec.namespace, spec.labels):
                continue
            domains = self.domain_nodes(holder.term.term.topology_key)
            for domain, count in sorted(holder.counts.items()):
                for node in domains.get(domain, ()):
                    score[node] = score.get(node, 0) + holder.weight * count
        return score

    def has_preference(self, spec: p.PodObserved) -> bool:
        if spec.preferred_pod_affinity or spec.preferred_pod_anti_affinity:
            return True
        return any(h.kind == PREFERRED and h.term.selects(spec.namespace, spec.labels) for h in self.holders())
