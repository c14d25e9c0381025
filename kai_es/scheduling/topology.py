"""Topology-aware placement (policy kai-es/v5; KAI's Topology API): the pods of a gang, or of a
sub-group, placed inside one network domain (a zone, a block, a rack).

Domains:
- A Topology (`ClusterState.topologies`) names node labels, widest domain first. A domain of
  level i is keyed by the values of the labels of levels 0..i: a rack lies inside its zone, so
  racks with the same name in two zones are two domains. A node without one of those labels is
  in no domain of level i (and so never used by a pod whose group is placed at that level).

Constraints (PodGroup `spec.topologyConstraint`, `spec.subGroups[].topologyConstraint`):
- A constraint holds for its group's pods: the job's, or the sub-group's own and its
  descendants', with those of them already running, binding or placed this cycle (anchors).
- Levels tried: with a preferred level, it, then each wider one up to the required level (with
  no required level: up to the widest, and then the whole cluster, unconstrained); with only a
  required level, that level.
- At a level the candidate domains are those that hold every anchor's node and whose capacity
  once releasing pods are gone covers the group's request (milli-GPU, milli-CPU, bytes). They are
  tried tightest fit first (KAI's domain bin-packing: least free milli-GPU now, then milli-CPU,
  then memory, then the domain's key); the first in which every pod of the group is placed wins,
  and each failed try is rolled back.
- A sub-group is placed inside the domain chosen for its parent; siblings in spec order, each
  group's own pods before its sub-groups. Pods of no sub-group, of an unknown one or of one whose
  parent chain loops (no path to the PodGroup) belong to the job's own group. Greedy: a sub-group that fits in no domain fails its
  parent's domain (the parent's next candidate is tried); earlier siblings are not re-placed.
- A constraint that cannot be read against its Topology (no such Topology, a level the Topology
  lacks, a required level narrower than the preferred one) places nothing: InvalidTopologyConstraint.
  A required level with no domain where the group fits: TopologyUnsatisfied, naming the level,
  how many domains there are, how many were too small, which were tried and how many nodes lack
  the label.

Verification mode (the Plan's `verify`) re-checks the domain capacities kept incrementally against
the tables on every use.

Contract: pure; reads the state and the Plan's tables, places only through the caller's
`place_flat` inside `Eligibility.restricted`, rolls its own failed tries back, and returns the
entries of a complete placement or the reasons none was found (the Plan then as at the call).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kai_es.events.payloads import PodGroupObserved, Reason
from kai_es.scheduling.plan import Announced, Entry, Plan, VerificationError
from kai_es.scheduling.predicates.eligibility import Eligibility
from kai_es.scheduling.tables import labels_of
from kai_es.state.model import OCCUPYING, ClusterState, Job, PodState

INVALID_TOPOLOGY_CONSTRAINT = "InvalidTopologyConstraint"
TOPOLOGY_UNSATISFIED = "TopologyUnsatisfied"

#: the domains of a required level a preemptor's victim search is run in, at most (a count, so
#: replay is exact): the roomiest first
MAX_PREEMPT_DOMAINS = 8

Vector = tuple[int, int, int]
DomainKey = tuple[str, ...]
#: places pods on the Plan as they come, with the masks the eligibility hands out now: the
#: entries, or None and (when `explain`) the reasons of the first pod that fits nowhere, its own
#: placements rolled back by the caller
PlaceFlat = Callable[[list[PodState], bool], tuple[list[Entry] | None, list[Reason]]]
RequestOf = Callable[[list[PodState]], Vector]


@dataclass(frozen=True, slots=True)
class Constraint:
    topology: str
    required: str
    preferred: str

    def __bool__(self) -> bool:
        return bool(self.required or self.preferred)


NONE = Constraint("", "", "")


def job_constraint(spec: PodGroupObserved | None) -> Constraint:
    if spec is None:
        return NONE
    return Constraint(spec.topology, spec.required_topology_level, spec.preferred_topology_level)


def constrained(spec: PodGroupObserved | None) -> bool:
    """Whether the PodGroup or one of its sub-groups has a topology constraint."""
    if spec is None:
        return False
    return bool(job_constraint(spec)) or any(
        sg.required_topology_level or sg.preferred_topology_level for sg in spec.subgroups)


@dataclass(slots=True)
class _Group:
    """A node of the job's constraint tree: the job (name "") or one sub-group."""

    name: str
    constraint: Constraint
    pods: list[PodState] = field(default_factory=list)
    children: list[_Group] = field(default_factory=list)
    #: sub-group names of the group and its descendants (pods labelled so belong to it)
    names: set[str] = field(default_factory=set)

    def all_pods(self) -> list[PodState]:
        out = list(self.pods)
        for child in self.children:
            out += child.all_pods()
        return out

    def describe(self) -> str:
        return "the job" if not self.name else f"sub-group {self.name}"


@dataclass(frozen=True, slots=True)
class _Levels:
    """Level indices to try, narrowest first, and whether the last is required."""

    topology: str
    labels: tuple[str, ...]
    order: tuple[int, ...]
    required: bool


class TopologyPlacer:
    """One cycle's topology domains and the placement of constrained jobs (module docstring).
    It is the Plan's listener for where each pod of the cycle was placed (anchors)."""

    def __init__(self, state: ClusterState, plan: Plan, eligibility: Eligibility) -> None:
        self.state = state
        self.plan = plan
        self.eligibility = eligibility
        self.n = len(plan.nodes)
        self._labels = labels_of(state, plan.names, plan.nodes)  # (read only)
        #: (topology, level) -> domain key -> ascending node indices
        self._domains: dict[tuple[str, int], dict[DomainKey, list[int]]] = {}
        #: (topology, level, key, id of parent restriction) -> (mask, parent kept alive)
        self._masks: dict[tuple[str, int, DomainKey, int], tuple[array[int], array[int] | None]] = {}
        #: (topology, level) -> per node, its domain key at that level (None: in no domain)
        self._key_of: dict[tuple[str, int], list[DomainKey | None]] = {}
        #: pods placed (or moved) by the Plan now -> node index
        self.placed_on: dict[str, int] = {}
        #: free capacity (now, once releasing pods are gone) per node asked about, kept up to
        #: date through `_dirty` (nodes an operation touched since); and the sums per domain of
        #: the levels asked about, moved by the same deltas: a constrained job's candidate domains
        #: cost O(domains), not a scan of every node
        self._node_free: dict[int, tuple[Vector, Vector]] = {}
        self._sums: dict[tuple[str, int], dict[DomainKey, tuple[Vector, Vector]]] = {}
        self._dirty: set[int] = set()
        #: the mask of no node (one array: masks are remembered by identity)
        self._nowhere = array("q", bytes(8 * self.n))

    # -- Plan listener ---------------------------------------------------------------------

    def on_operation(self, op: Announced, sign: int) -> None:
        if isinstance(op, Entry):
            if sign > 0:
                self.placed_on[op.pod_key] = op.node
            else:
                self.placed_on.pop(op.pod_key, None)
        if self._node_free:
            self._dirty.add(op.node)

    # -- domains ---------------------------------------------------------------------------

    def domains(self, topology: str, level: int) -> dict[DomainKey, list[int]]:
        found = self._domains.get((topology, level))
        if found is None:
            keys = self.state.topologies[topology][: level + 1]
            found = {}
            key_of: list[DomainKey | None] = []
            for i, labels in enumerate(self._labels):
                values = tuple(labels.get(k) for k in keys)
                if all(v is not None for v in values):
                    found.setdefault(values, []).append(i)  # type: ignore[arg-type]
                    key_of.append(values)  # type: ignore[arg-type]
                else:
                    key_of.append(None)
            found = {k: found[k] for k in sorted(found)}
            self._domains[(topology, level)] = found
            self._key_of[(topology, level)] = key_of
        return found

    def domain_of(self, topology: str, level: int, node: int) -> DomainKey | None:
        self.domains(topology, level)
        return self._key_of[(topology, level)][node]

    def _mask(self, topology: str, level: int, key: DomainKey, parent: array[int] | None) -> array[int]:
        """The nodes of a domain that `parent` (None: every node) allows; one array per cycle."""
        cache_key = (topology, level, key, id(parent) if parent is not None else 0)
        found = self._masks.get(cache_key)
        if found is None:
            mask = array("q", bytes(8 * self.n))
            for i in self.domains(topology, level)[key]:
                if parent is None or parent[i]:
                    mask[i] = 1
            found = self._masks[cache_key] = (mask, parent)
        return found[0]

    def _read_node(self, i: int) -> tuple[Vector, Vector]:
        out: list[Vector] = []
        for table in (self.plan.idle, self.plan.future):
            start = table.gpu_start
            out.append((sum(table.dev_free_milli[start[i]:start[i + 1]]), table.free_milli_cpu[i],
                        table.free_memory_bytes[i]))
        return out[0], out[1]

    def _settle(self) -> None:
        """Bring the remembered node and domain capacities up to the Plan's tables."""
        for i in sorted(self._dirty):
            old = self._node_free.get(i)
            if old is None:
                continue
            new = self._read_node(i)
            self._node_free[i] = new
            if new == old:
                continue
            for (topology, level), sums in self._sums.items():
                key = self._key_of[(topology, level)][i]
                if key is not None:
                    now, later = sums[key]
                    sums[key] = (_plus(now, new[0], old[0]), _plus(later, new[1], old[1]))
        self._dirty.clear()

    def _free_of(self, i: int) -> tuple[Vector, Vector]:
        found = self._node_free.get(i)
        if found is None:
            found = self._node_free[i] = self._read_node(i)
        return found

    def _free(self, nodes: list[int], allowed: array[int] | None) -> tuple[Vector, Vector]:
        """(free now, free once releasing pods are gone) summed over `nodes` that `allowed` allows."""
        self._settle()
        now: Vector = (0, 0, 0)
        later: Vector = (0, 0, 0)
        for i in nodes:
            if allowed is None or allowed[i]:
                a, b = self._free_of(i)
                now, later = _plus(now, a), _plus(later, b)
        return now, later

    def _domain_free(self, topology: str, level: int, key: DomainKey, allowed: array[int] | None
                     ) -> tuple[Vector, Vector]:
        """`_free` of one domain; without `allowed`, from the domain sums kept for the level."""
        if allowed is not None:
            return self._free(self.domains(topology, level)[key], allowed)
        self._settle()
        sums = self._sums.get((topology, level))
        if sums is None:
            sums = self._sums[(topology, level)] = {
                k: self._free(nodes, None) for k, nodes in self.domains(topology, level).items()}
        if self.plan.verify:
            fresh = [self._read_node(i) for i in self.domains(topology, level)[key]]
            if (sum(f[0][0] for f in fresh), sum(f[0][1] for f in fresh), sum(f[0][2] for f in fresh)) != sums[key][0] \
                    or (sum(f[1][0] for f in fresh), sum(f[1][1] for f in fresh),
                        sum(f[1][2] for f in fresh)) != sums[key][1]:
                raise VerificationError(f"topology domain {key} of {topology!r} level {level}: kept free capacity "
                                        f"{sums[key]} differs from the tables")
        return sums[key]

    # -- constraints -----------------------------------------------------------------------

    def levels(self, c: Constraint) -> _Levels | Reason:
        labels = self.state.topologies.get(c.topology)
        if labels is None:
            return Reason(code=INVALID_TOPOLOGY_CONSTRAINT, message=(
                f"topologyConstraint names topology {c.topology!r}, and no Topology of that name exists"))
        for field_name, level in (("requiredTopologyLevel", c.required), ("preferredTopologyLevel", c.preferred)):
            if level and level not in labels:
                return Reason(code=INVALID_TOPOLOGY_CONSTRAINT, message=(
                    f"topologyConstraint {field_name} {level!r} is not a level of topology {c.topology!r} "
                    f"(its levels, widest first: {', '.join(labels)})"))
        required = labels.index(c.required) if c.required else None
        preferred = labels.index(c.preferred) if c.preferred else None
        if required is not None and preferred is not None and preferred < required:
            return Reason(code=INVALID_TOPOLOGY_CONSTRAINT, message=(
                f"topologyConstraint requiredTopologyLevel {c.required!r} is narrower than preferredTopologyLevel "
                f"{c.preferred!r} in topology {c.topology!r} (levels, widest first: {', '.join(labels)}): "
                f"the required level bounds the domain, the preferred one narrows it"))
        first = preferred if preferred is not None else required
        assert first is not None
        last = required if required is not None else 0
        return _Levels(c.topology, tuple(labels), tuple(range(first, last - 1, -1)), required is not None)

    def _tree(self, job: Job, pods: Sequence[PodState]) -> _Group:
        spec = job.spec
        root = _Group("", job_constraint(spec))
        groups: dict[str, _Group] = {}
        if spec is not None:
            for sg in spec.subgroups:
                groups[sg.name] = _Group(sg.name, Constraint(sg.topology, sg.required_topology_level,
                                                             sg.preferred_topology_level))
            for sg in spec.subgroups:
                (groups.get(sg.parent, root) if sg.parent else root).children.append(groups[sg.name])

        def names(group: _Group) -> set[str]:
            group.names = {group.name} if group.name else set()
            for child in group.children:
                group.names |= names(child)
            return group.names

        reachable = names(root)  # sub-groups whose parents loop hang below no root: ignored
        del names  # (a recursive closure holds itself through its cell: emptied, it is freed now)
        for pod in pods:
            group = groups.get(pod.spec.subgroup)
            (group if group is not None and group.name in reachable else root).pods.append(pod)
        return root

    def _anchors(self, job: Job, group: _Group) -> list[int]:
        """Nodes of the group's pods that run or were placed in this cycle (not those evicted)."""
        plan, state = self.plan, self.state
        out: set[int] = set()
        for key in job.members:
            pod = state.pods[key]
            if group.name and pod.spec.subgroup not in group.names:
                continue
            node = self.placed_on.get(key)
            if node is not None:
                out.add(node)
            elif pod.status in OCCUPYING and key not in plan.evicted_pods and pod.node in plan.node_index:
                out.add(plan.node_index[pod.node])
        return sorted(out)

    # -- placement -------------------------------------------------------------------------

    def place(self, job: Job, pods: list[PodState], place_flat: PlaceFlat, request_of: RequestOf
              ) -> tuple[list[Entry] | None, list[Reason]]:
        """Place `pods` of `job` under its constraints (module docstring), within the
        eligibility's restriction in force: the entries, or None and the reasons."""
        return self._place_group(job, self._tree(job, pods), self.eligibility.restriction, place_flat, request_of)

    def _place_group(self, job: Job, group: _Group, parent: array[int] | None, place_flat: PlaceFlat,
                     request_of: RequestOf) -> tuple[list[Entry] | None, list[Reason]]:
        pods = group.all_pods()
        if not pods:
            return [], []
        if not group.constraint:
            return self._place_inside(job, group, parent, place_flat, request_of)
        levels = self.levels(group.constraint)
        if isinstance(levels, Reason):
            return None, [levels]
        request = request_of(pods)
        anchors = self._anchors(job, group)
        first_miss: list[Reason] | None = None
        summary: list[str] = []
        numbers: dict[str, int] = {}
        for level in levels.order:
            label = levels.labels[level]
            candidates, too_small, spanned, roomiest = self._candidates(levels.topology, level, anchors, parent,
                                                                        request)
            domains = self.domains(levels.topology, level)
            unlabelled = self.n - sum(len(v) for v in domains.values())
            tried: list[str] = []
            for key in candidates:
                mask = self._mask(levels.topology, level, key, parent)
                cp = self.plan.checkpoint()
                entries, reasons = self._place_inside(job, group, mask, place_flat, request_of,
                                                      explain=first_miss is None)
                if entries is not None:
                    return entries, []
                self.plan.rollback(cp)
                if first_miss is None:
                    first_miss = reasons
                tried.append(_show(label, key))
            numbers = {"domains": len(domains), "too_small": too_small, "tried": len(tried),
                       "unlabelled_nodes": unlabelled, "pods": len(pods)}
            summary.append(_summary(label, len(domains), too_small, tried, unlabelled, spanned, request, roomiest))
        if not levels.required:
            return self._place_inside(job, group, parent, place_flat, request_of)
        required = levels.labels[levels.order[-1]]
        message = (f"topologyConstraint of {group.describe()}: its {len(pods)} pods to place"
                   f"{' and its running ones' if anchors else ''} must share one domain of level "
                   f"{required!r} (topology {levels.topology!r}); none fits: {'; '.join(summary)}")
        return None, [Reason(code=TOPOLOGY_UNSATISFIED, message=message, numbers=numbers), *(first_miss or [])]

    def _candidates(self, topology: str, level: int, anchors: list[int], parent: array[int] | None,
                    request: Vector) -> tuple[list[DomainKey], int, bool, Vector]:
        """(domains to try in order, how many are too small, whether the anchors span more than
        one domain or lie outside every domain of the level, the largest free capacity once
        releasing pods are gone of a domain looked at)."""
        domains = self.domains(topology, level)
        keys: list[DomainKey] = list(domains)
        spanned = False
        if anchors:
            homes = {self.domain_of(topology, level, node) for node in anchors}
            if len(homes) != 1 or None in homes:
                return [], 0, True, (0, 0, 0)
            home = homes.pop()
            assert home is not None
            keys = [home]
        ranked: list[tuple[Vector, DomainKey]] = []
        too_small = 0
        roomiest: Vector = (0, 0, 0)
        for key in keys:
            nodes = domains[key]
            if parent is not None and not any(parent[i] for i in nodes):
                continue
            now, later = self._domain_free(topology, level, key, parent)
            roomiest = max(roomiest, later)
            if any(r > f for r, f in zip(request, later)):
                too_small += 1
                continue
            ranked.append((now, key))
        ranked.sort()
        return [key for _, key in ranked], too_small, spanned, roomiest

    def _place_inside(self, job: Job, group: _Group, mask: array[int] | None, place_flat: PlaceFlat,
                      request_of: RequestOf, explain: bool = True) -> tuple[list[Entry] | None, list[Reason]]:
        """The group's own pods, then each sub-group, all within `mask`."""
        entries: list[Entry] = []
        with self.eligibility.restricted(mask):
            if group.pods:
                placed, reasons = place_flat(group.pods, explain)
                if placed is None:
                    return None, reasons
                entries += placed
        for child in group.children:
            placed, reasons = self._place_group(job, child, mask, place_flat, request_of)
            if placed is None:
                return None, reasons
            entries += placed
        return entries, []

    # -- where a constrained pod may go ----------------------------------------------------

    def home(self, pod: PodState) -> array[int] | None:
        """For a running pod of a constrained job that is moved elsewhere: the nodes that keep it
        in the domain it is in at each required level of its job and sub-groups (None: it is
        free to go anywhere; an all-zero mask when its node is in no such domain)."""
        job = self.state.jobs.get(pod.job_key)
        if job is None or not constrained(job.spec) or pod.node not in self.plan.node_index:
            return None
        node = self.plan.node_index[pod.node]
        mask: array[int] | None = None
        for group in self._chain(job, pod):
            c = group.constraint
            if not c.required or c.topology not in self.state.topologies:
                continue
            labels = self.state.topologies[c.topology]
            if c.required not in labels:
                continue
            level = labels.index(c.required)
            key = self.domain_of(c.topology, level, node)
            if key is None:
                return self._nowhere
            mask = self._mask(c.topology, level, key, mask)
        return mask

    def _chain(self, job: Job, pod: PodState) -> list[_Group]:
        """The constraint groups a pod of `job` belongs to, the job first."""
        root = self._tree(job, [pod])
        out = [root]
        group = root
        while True:
            inner = next((g for g in group.children if pod.spec.subgroup in g.names), None)
            if inner is None:
                return out
            out.append(inner)
            group = inner

    def preempt_domains(self, job: Job) -> list[array[int] | None]:
        """The restrictions a preemptor's victim search runs in, in order: for a job-level
        required constraint, the domains of that level holding its anchors, roomiest first, at
        most `MAX_PREEMPT_DOMAINS`; otherwise one search without restriction ([None])."""
        c = job_constraint(job.spec)
        levels = self.levels(c) if c.required else None
        if levels is None or isinstance(levels, Reason):
            return [None]
        level = levels.order[-1]
        anchors = self._anchors(job, _Group("", c))
        domains = self.domains(levels.topology, level)
        keys = list(domains)
        if anchors:
            homes = {self.domain_of(levels.topology, level, node) for node in anchors}
            keys = [h for h in homes if h is not None] if len(homes) == 1 else []
        parent = self.eligibility.restriction
        ranked = sorted(keys, key=lambda k: (tuple(-x for x in self._domain_free(levels.topology, level, k, parent)[1]),
                                             k))
        return [self._mask(levels.topology, level, k, parent) for k in ranked[:MAX_PREEMPT_DOMAINS]]


def _plus(a: Vector, b: Vector, minus: Vector = (0, 0, 0)) -> Vector:
    return (a[0] + b[0] - minus[0], a[1] + b[1] - minus[1], a[2] + b[2] - minus[2])


def _show(label: str, key: DomainKey) -> str:
    return f"{label}={key[-1]}" if len(key) == 1 else f"{label}={key[-1]} (in {'/'.join(key[:-1])})"


def _amounts(v: Vector) -> str:
    return f"{v[0] // 1000}.{v[0] % 1000:03d} GPU, {v[1]}m CPU, {v[2] // 2**20}Mi memory".replace(".000 GPU", " GPU")


def _summary(label: str, domains: int, too_small: int, tried: list[str], unlabelled: int, spanned: bool,
             request: Vector, roomiest: Vector) -> str:
    parts = [f"level {label!r}: {domains} domain{'s' if domains != 1 else ''}"]
    if spanned:
        parts.append("its running pods are not all in one of them")
    if too_small:
        parts.append(f"{too_small} with too little free capacity (the pods need {_amounts(request)}; the "
                     f"roomiest has {_amounts(roomiest)} once releasing pods are gone)")
    if tried:
        shown = ", ".join(tried[:3]) + (f" and {len(tried) - 3} more" if len(tried) > 3 else "")
        parts.append(f"tried {shown}: the pods did not all fit")
    if unlabelled:
        parts.append(f"{unlabelled} node{'s' if unlabelled != 1 else ''} without the label")
    return ", ".join(parts)
