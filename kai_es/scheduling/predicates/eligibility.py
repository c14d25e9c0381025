"""Per-cycle eligibility: the predicates of `kai_es.scheduling.predicates` combined into the
packer's 0/1 node mask, the preference levels that rank nodes, and the reasons a pod fits
nowhere.

Contract:
- `mask(spec)` is (mask, dynamic). A static mask depends only on the pod's node-level
  constraints and is shared by every pod with the same `static_key` (one per-node evaluation per
  distinct constraint per cycle); it never changes during the cycle, so a failure on it may be
  remembered. A dynamic mask (host ports, scalar resources, inter-pod affinity) is built for
  this call from the static one in O(nodes affected) and must not be remembered.
- The instance is the Plan's listener: `placed`/`unplaced` keep every dynamic tracker equal to
  "state + the Plan's current entries", through checkpoints and rollbacks.
- `levels(spec, mask)` is None when nothing ranks the eligible nodes, else the masks of the
  eligible nodes by descending preference score (preferred node affinity normalised to 0..100
  over the eligible nodes, plus inter-pod preference normalised likewise, as Kubernetes does),
  which the Plan tries in order before its packing strategy breaks ties.
- `restricted(nodes)` (kai-es/v5's topology domains) narrows every mask handed out inside the
  `with` block to `nodes` (a 0/1 array that lives for the cycle): a restricted static mask is
  interned per (static mask, restriction), so it too may be remembered.
- The per-node evaluation of a static key's cordon, taints, node pool, nodeSelector and required
  node affinity (`legacy_allows`) reads only node specs, so its mask is kept across cycles in
  `state.caches` while the node set and specs stay the same (`state.node_set_version`), for up
  to `KEPT_LEGACY` keys; with `verify`, each kept one is checked against a fresh evaluation.
- Pure: reads the state; writes only its own trackers (and the kept masks, derived data).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Final

from kai_es.events import payloads as p
from kai_es.events.codec import canonical
from kai_es.events.payloads import Reason
from kai_es.scheduling.plan import Announced, Entry, VerificationError
from kai_es.scheduling.predicates import host_ports, node_affinity, pod_affinity, resources, taints, volumes
from kai_es.scheduling.tables import index_of, labels_of
from kai_es.state.model import ClusterState, NodeState

POD_AFFINITY_UNMET = "PodAffinityUnmet"
POD_ANTI_AFFINITY_CONFLICT = "PodAntiAffinityConflict"
EXISTING_POD_ANTI_AFFINITY = "ExistingPodAntiAffinityConflict"

StaticKey = tuple[object, ...]

_KEPT = "eligibility.legacy"
#: static keys whose legacy masks are kept across cycles (each mask is 8 bytes per node: 160 KiB
#: at 20,000 nodes); past it the kept ones are dropped and kept again as they come
KEPT_LEGACY = 64


class _KeptLegacy:
    """The legacy masks of a node list (the tables' names, while `node_set_version` holds)."""

    __slots__ = ("names", "version", "masks")

    def __init__(self, names: Sequence[str], version: int) -> None:
        self.names, self.version = names, version
        self.masks: dict[StaticKey, array[int]] = {}


def static_key(spec: p.PodObserved, volume_names: tuple[str, ...] = ()) -> StaticKey:
    """Pods with equal keys get equal static masks."""
    return (tuple(sorted(spec.node_selector.items())), tuple(spec.tolerations),
            canonical(spec.affinity_terms) if spec.affinity_terms else b"", spec.node_pool,
            volume_names, tuple(sorted(spec.scalar_requests.items())))


def node_constrained(spec: p.PodObserved) -> bool:
    """Whether `spec` has any of what `static_key` reads (nodeSelector, tolerations, required
    node affinity, node pool, claims, extended resources); if not, its key is `PLAIN_KEY`."""
    return bool(spec.node_selector or spec.tolerations or spec.affinity_terms or spec.node_pool
                or spec.claims or spec.scalar_requests)


#: `static_key` of a pod that is not `node_constrained` (then the key needs no building)
PLAIN_KEY: Final[StaticKey] = static_key(p.PodObserved(namespace="", name="", uid="", podgroup=""))


def legacy_allows(node: p.NodeObserved, spec: p.PodObserved) -> bool:
    """Stage 1: cordon, taints, node pool, nodeSelector, required node affinity."""
    return taints.node_accepts(node, spec) and node_affinity.selector_allows(spec.node_selector, node) \
        and node_affinity.required_allows(spec.affinity_terms, node)


class Eligibility:
    def __init__(self, state: ClusterState, names: Sequence[str], nodes: Sequence[NodeState],
                 leaving: bool = False) -> None:
        #: a pod the Plan evicts satisfies no pod affinity (`rules.leaving_pods.EvictedPodsLeave`)
        self.leaving = leaving
        self.state = state
        self.names = names
        self.nodes = nodes
        self.n = len(nodes)
        self.node_index = index_of(state, names)  # (the tables' when `names` is theirs: read only)
        self._static: dict[StaticKey, array[int]] = {}
        self._keys: dict[int, StaticKey] = {}
        self._legacy: dict[StaticKey, array[int]] = {}
        kept = state.caches.get(_KEPT)
        if not isinstance(kept, _KeptLegacy) or kept.names is not names or kept.version != state.node_set_version:
            kept = _KeptLegacy(names, state.node_set_version)
            state.caches[_KEPT] = kept
        self._kept = kept.masks
        #: check every kept legacy mask against a fresh evaluation (verification mode)
        self.verify = False
        self._volume_terms: dict[str, list[tuple[str, str, tuple[p.NodeSelectorTerm, ...]]]] = {}
        self.affinity = pod_affinity.PodAffinityIndex(state, labels_of(state, names, nodes), names, self.node_index)
        self._scalars: resources.ScalarFree | None = None
        self._ports: host_ports.PortsInUse | None = None
        self._zeros = array("q", bytes(8 * self.n))
        #: the nodes every mask is narrowed to (None: all), see `restricted`
        self.restriction: array[int] | None = None
        #: (id of static mask, id of restriction) -> (narrowed mask, the two it came from: kept
        #: alive so that their ids stay theirs)
        self._narrowed: dict[tuple[int, int], tuple[array[int], array[int], array[int]]] = {}

    # -- trackers ----------------------------------------------------------------------------

    @property
    def scalars(self) -> resources.ScalarFree:
        if self._scalars is None:
            self._scalars = resources.ScalarFree(self.nodes)
            for key, (spec, node) in sorted(self.affinity._planned.items()):
                self._scalars.apply(spec, node, +1)
        return self._scalars

    @property
    def ports(self) -> host_ports.PortsInUse:
        if self._ports is None:
            self._ports = host_ports.PortsInUse(self.state, self.node_index)
            for key, (spec, node) in sorted(self.affinity._planned.items()):
                self._ports.apply(key, spec, node, +1)
        return self._ports

    def on_operation(self, op: Announced, sign: int) -> None:
        """Plan listener. A pod the plan evicts still holds its node until it is gone, so only
        placements move the trackers (conservative for pipelining); with `leaving` (kai-es/v4)
        an eviction marks the pod leaving for pod affinity (it is no reason to come,
        `PodAffinityIndex.evicted`)."""
        if isinstance(op, Entry):
            if sign > 0:
                self.placed(op.pod_key, op.node)
            else:
                self.unplaced(op.pod_key, op.node)
        elif self.leaving:
            self.affinity.evicted(op.pod_key, self.state.pods[op.pod_key].spec, op.node, sign)

    def placed(self, pod_key: str, node: int) -> None:
        spec = self.state.pods[pod_key].spec
        self.affinity.placed(pod_key, spec, node)
        if self._scalars is not None and spec.scalar_requests:
            self._scalars.apply(spec, node, +1)
        if self._ports is not None and spec.host_ports:
            self._ports.apply(pod_key, spec, node, +1)

    def unplaced(self, pod_key: str, node: int) -> None:
        spec = self.state.pods[pod_key].spec
        self.affinity.unplaced(pod_key, spec, node)
        if self._scalars is not None and spec.scalar_requests:
            self._scalars.apply(spec, node, -1)
        if self._ports is not None and spec.host_ports:
            self._ports.apply(pod_key, spec, node, -1)

    # -- pod-level ---------------------------------------------------------------------------

    def pod_problem(self, spec: p.PodObserved) -> Reason | None:
        if not spec.claims and not spec.config_maps:
            return None
        return volumes.pod_problem(self.state, spec)

    def _volumes_of(self, spec: p.PodObserved) -> list[tuple[str, str, tuple[p.NodeSelectorTerm, ...]]]:
        if not spec.claims:
            return []
        key = f"{spec.namespace}/{spec.name}"
        found = self._volume_terms.get(key)
        if found is None:
            found = self._volume_terms[key] = volumes.volume_terms(self.state, spec)
        return found

    # -- masks -------------------------------------------------------------------------------

    def _key(self, spec: p.PodObserved) -> StaticKey:
        if not node_constrained(spec):
            return PLAIN_KEY  # (most pods: nothing to build, nothing to keep)
        # by identity: a spec object lives in the state for the whole cycle and never changes
        key = self._keys.get(id(spec))
        if key is None:
            key = self._keys[id(spec)] = static_key(spec, tuple(v[0] for v in self._volumes_of(spec)))
        return key

    @contextmanager
    def restricted(self, nodes: array[int] | None) -> Iterator[None]:
        """Within the block, masks allow only nodes set in `nodes` (None: no restriction, also
        lifting an outer one); the restriction in force before is restored after."""
        outer = self.restriction
        self.restriction = nodes
        try:
            yield
        finally:
            self.restriction = outer

    def _narrow(self, mask: array[int], nodes: array[int]) -> array[int]:
        key = (id(mask), id(nodes))
        found = self._narrowed.get(key)
        if found is None:
            narrowed = array("q", self._zeros)
            for i in range(self.n):
                if mask[i] and nodes[i]:
                    narrowed[i] = 1
            found = self._narrowed[key] = (narrowed, mask, nodes)
        return found[0]

    def static_mask(self, spec: p.PodObserved) -> array[int]:
        key = self._key(spec)
        mask = self._static.get(key)
        if mask is None:
            mask = self._build_static(key, spec)
        if self.restriction is not None:
            return self._narrow(mask, self.restriction)
        return mask

    def _build_static(self, key: StaticKey, spec: p.PodObserved) -> array[int]:
        legacy = self._kept.get(key)
        if legacy is None:
            legacy = self._legacy_of(spec)
            if len(self._kept) >= KEPT_LEGACY:
                self._kept.clear()
            self._kept[key] = legacy
        elif self.verify and legacy != self._legacy_of(spec):
            raise VerificationError(f"the legacy node mask kept across cycles for {key} is not a fresh one")
        self._legacy[key] = legacy
        mask = legacy
        vols = self._volumes_of(spec)
        if vols or spec.scalar_requests:
            mask = array("q", legacy)
            for i, n in enumerate(self.nodes):
                if mask[i] and not self._node_level(n.spec, spec, vols):
                    mask[i] = 0
        self._static[key] = mask
        return mask

    def _legacy_of(self, spec: p.PodObserved) -> array[int]:
        return array("q", [1 if legacy_allows(n.spec, spec) else 0 for n in self.nodes])

    @staticmethod
    def _node_level(node: p.NodeObserved, spec: p.PodObserved,
                    vols: list[tuple[str, str, tuple[p.NodeSelectorTerm, ...]]]) -> bool:
        return all(node_affinity.required_allows(terms, node) for _, _, terms in vols) and \
            resources.capacity_allows(node, spec)

    def is_dynamic(self, spec: p.PodObserved) -> bool:
        if spec.host_ports or spec.scalar_requests or spec.pod_affinity or spec.pod_anti_affinity:
            return True
        return self.affinity.needs_dynamic(spec)

    def mask(self, spec: p.PodObserved) -> tuple[array[int], bool]:
        base = self.static_mask(spec)
        if not self.is_dynamic(spec):
            return base, False
        forbidden: set[int] = set()
        if spec.scalar_requests:
            forbidden |= self.scalars.excluded(spec)
        if spec.host_ports:
            forbidden |= self.ports.excluded(spec)[0]
        anti, allowed, _ = self.affinity.forbidden_and_allowed(spec)
        forbidden |= anti
        mask = array("q", base)
        for i in forbidden:
            mask[i] = 0
        for nodes in allowed:
            narrowed = array("q", self._zeros)
            for i in nodes:
                narrowed[i] = mask[i]
            mask = narrowed
        return mask, True

    # -- preferences -------------------------------------------------------------------------

    def levels(self, spec: p.PodObserved, mask: array[int]) -> list[array[int]] | None:
        has_node = bool(spec.preferred_affinity)
        has_pod = self.affinity.has_preference(spec)
        if not has_node and not has_pod:
            return None
        eligible = [i for i in range(self.n) if mask[i]]
        if len(eligible) < 2:
            return None
        total = {i: 0 for i in eligible}
        if has_node:
            raw = {i: node_affinity.preferred_score(spec.preferred_affinity, self.nodes[i].spec) for i in eligible}
            top = max(raw.values())
            if top > 0:
                for i in eligible:
                    total[i] += raw[i] * 100 // top
        if has_pod:
            scores = self.affinity.preference(spec)
            raw = {i: scores.get(i, 0) for i in eligible}
            lo, hi = min(raw.values()), max(raw.values())
            if hi > lo:
                for i in eligible:
                    total[i] += (raw[i] - lo) * 100 // (hi - lo)
        values = sorted(set(total.values()), reverse=True)
        if len(values) < 2:
            return None
        out = []
        for value in values:
            level = array("q", self._zeros)
            for i in eligible:
                if total[i] == value:
                    level[i] = 1
            out.append(level)
        return out

    # -- reasons -----------------------------------------------------------------------------

    def explain(self, spec: p.PodObserved) -> tuple[int, list[tuple[str, str, int]], list[Reason]]:
        """Why nodes were excluded: (nodes excluded by stage 1, later stages as
        (numbers key, phrase, nodes), detail reasons with an example each). Each node is counted
        under the first stage that excludes it."""
        self.static_mask(spec)
        key = self._key(spec)
        legacy = self._legacy[key]
        alive = {i for i in range(self.n) if legacy[i]}
        stage1 = self.n - len(alive)
        extra: list[tuple[str, str, int]] = []
        details: list[Reason] = []

        def stage(numbers_key: str, phrase: str, excluded: set[int], code: str = "", message: str = "") -> None:
            hit = alive & excluded
            if hit:
                alive.difference_update(hit)
                extra.append((numbers_key, phrase, len(hit)))
                if code:
                    details.append(Reason(code=code, message=message, numbers={"nodes": len(hit)}))

        for name, claim, terms in self._volumes_of(spec):
            bad = {i for i in alive if not node_affinity.required_allows(terms, self.nodes[i].spec)}
            stage("volume_node_affinity", "outside a bound volume's node affinity", bad,
                  volumes.VOLUME_NODE_AFFINITY,
                  f"PersistentVolume {name} (claim {claim}) may only be used on nodes matching its node affinity")
        for resource, amount in sorted(spec.scalar_requests.items()):
            bad = {i for i in alive if self.nodes[i].spec.scalar_resources.get(resource, 0) < amount}
            bad |= {i for i, free in self.scalars.free.get(resource, {}).items() if free < amount}
            stage(f"insufficient_{resource}", f"insufficient {resource}", bad, resources.INSUFFICIENT_RESOURCE,
                  f"requested {amount} {resource}; the most any node has free is {self.scalars.most_free(resource)}")
        if spec.host_ports:
            bad, example = self.ports.excluded(spec)
            stage("host_port_conflict", "host port in use", bad, host_ports.HOST_PORT_CONFLICT, example)
        anti, allowed, why = self.affinity.forbidden_and_allowed(spec)
        outside: set[int] = set()
        for nodes in allowed:
            outside |= set(range(self.n)) - nodes
        affinity_why = [w.split(":", 1)[1] for w in why if w.startswith("affinity:")]
        stage("pod_affinity_unmet", "pod affinity unmet", outside, POD_AFFINITY_UNMET,
              affinity_why[0] if affinity_why else "no node's topology domain holds the pods this pod must be near")
        own = [w.split(":", 1)[1] for w in why if w.startswith("anti:")]
        theirs = [w.split(":", 1)[1] for w in why if w.startswith("existing:")]
        own_nodes: set[int] = set()
        for term in spec.pod_anti_affinity:
            cls = self.affinity.term_class(term, spec.namespace)
            domains = self.affinity.domain_nodes(term.topology_key)
            for domain in cls.counts:
                own_nodes.update(domains.get(domain, ()))
        stage("pod_anti_affinity_conflict", "pod anti-affinity conflict", own_nodes, POD_ANTI_AFFINITY_CONFLICT,
              own[0] if own else "")
        stage("existing_pod_anti_affinity", "anti-affinity of pods already there", anti - own_nodes,
              EXISTING_POD_ANTI_AFFINITY, theirs[0] if theirs else "")
        return stage1, extra, details
