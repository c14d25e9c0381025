"""Fair-share division of cluster capacity among a queue hierarchy, per resource, in integers.

The rules (KAI's, stated exactly so they can be checked by hand):
- A queue's *request* is allocated + pending, capped by its limit (-1: no limit). A parent's
  request is the sum of its children's requests, capped by its own limit.
- Level by level, a parent's fair share (the cluster's capacity at the root) is divided among its
  children:
  1. Each child first gets min(quota, request) (quota -1: its whole request). If the parent
     cannot cover all of these, they are served by descending queue priority, and within a
     priority proportionally to what they asked for in this step — or, with `quota_granted`
     (policy kai-es/v10 on, KAI's `setDeservedResource`), every child gets it anyway: quotas
     that add up to more than the parent's share are granted in full, and the fair shares then
     add up to more than there is (nothing remains for step 2); an unlimited quota (-1) then
     deserves at most the parent's whole share.
  2. What remains goes to priority buckets in descending order; within a bucket, in rounds by
     over-quota weight: each unsatisfied child with weight > 0 gets remaining * weight // total
     weight. A child offered more than it still needs gets exactly what it needs, and another
     round divides the rest. Weight 0 gets nothing over quota.
  3. Units left by integer division go one at a time to the children with the largest division
     remainder, then the oldest queue, then by name.
- A child never gets more than its request; what nobody requests stays undivided.

Division in whole units (`unit` > 1; policy kai-es/v2 divides GPUs in whole GPUs, unit 1000
milli-GPU, as KAI does): steps 2-3 become KAI's. In every over-quota round each child gets the
floor of its weighted share in whole units (or all it still needs, when that is less); rounds
repeat while some child's need was met with room to spare. Only when every priority bucket has
had its rounds, the amount left goes, bucket by bucket, one unit at a time — at most one per
child, never beyond its need — to the children with the largest fraction of a unit left over
in their last round, then the oldest, then uid, then name; an amount smaller than one unit is
handed out as it is. (`unit` 1 is the exact integer division above, kai-es/v1's.)

Time-based fair share (policy kai-es/v3 with `fairshare.timeBased`; KAI's formula): in every
over-quota round a child's weight is not its over-quota weight W but P = max(W' + k(W' - U), 0),
W' = W / (sum of the weights of the children still open in the round), U the queue's decayed
historical usage as a share of the cluster's capacity (`kai_es.scheduling.usage`), k the
config's `kValue` (an exact rational: an integer or a decimal like 0.5). P is an exact rational; the round divides by P scaled to integers (times the
least common multiple of the denominators), so nothing is rounded beyond the division itself.
When every open child's P is 0 the bucket's rounds end (the rest stays undivided there).

Contract: pure; integers only (milli-GPU, milli-CPU, bytes; weights exact rationals scaled to
integers); deterministic order everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import lcm
from typing import TYPE_CHECKING

import msgspec

from kai_es.state.keys import job_key_of_index
from kai_es.state.quantities import gpu_memory_milli

RESOURCES: tuple[str, ...] = ("gpu", "cpu", "memory")
#: a queue's historical usage share per resource, in RESOURCES order
Usage = tuple[Fraction, Fraction, Fraction]


@dataclass(frozen=True, slots=True)
class TimeBased:
    """Time-based fair share's inputs: each queue's usage share, and k."""

    usage: Mapping[str, Usage]
    k: Fraction | int


def round_weights(open_: Sequence[QueueInput], usage: Mapping[str, Fraction] | None,
                  k: Fraction | int) -> dict[str, int]:
    """The integer weights of one over-quota round: the over-quota weights, or (time-based) each
    child's P = max(W' + k(W' - U), 0) scaled by the common denominator (see module docstring)."""
    if usage is None:
        return {q.name: q.over_quota_weight for q in open_}
    total = sum(q.over_quota_weight for q in open_)
    if total <= 0:
        return {q.name: 0 for q in open_}
    portions = {}
    for q in open_:
        w = Fraction(q.over_quota_weight, total)
        portions[q.name] = max(w + k * (w - usage.get(q.name, Fraction(0))), Fraction(0))
    scale = lcm(*(p.denominator for p in portions.values()))
    return {name: int(p * scale) for name, p in portions.items()}


class QueueInput(msgspec.Struct, frozen=True, gc=False):
    """One queue's inputs for one resource. (msgspec Structs here: a cycle builds these and the
    shares for every queue and resource, and a Struct is several times cheaper to construct
    than a dataclass.)"""

    name: str
    uid: str
    parent: str
    priority: int
    created_ns: int
    quota: int
    over_quota_weight: int
    limit: int
    allocated: int = 0
    pending: int = 0


class QueueShare(msgspec.Struct):
    """One queue's outcome for one resource."""

    name: str
    quota: int
    limit: int
    request: int
    allocated: int
    fair_share: int = 0
    children: list[str] = msgspec.field(default_factory=list)


def _cap(value: int, limit: int) -> int:
    return value if limit < 0 else min(value, limit)


def _sort_key(q: QueueInput) -> tuple[int, int, str]:
    return (-q.priority, q.created_ns, q.name)


def parent_loops(parents: Mapping[str, str]) -> dict[str, list[str]]:
    """Queues whose `parentQueue` chain never reaches a root (it runs into a loop, or names
    the queue itself), each with the chain that shows it (`[a, b, a]`). A parent that is not a
    queue counts as the root. Deterministic: chains are followed in name order."""
    out: dict[str, list[str]] = {}
    for name in sorted(parents):
        chain = [name]
        seen = {name}
        current = parents.get(name, "")
        while current and current in parents:
            chain.append(current)
            if current in seen or current in out:
                out[name] = chain if current in seen else chain + out[current][out[current].index(current) + 1:]
                break
            seen.add(current)
            current = parents[current]
    return out


def divide(capacity: int, queues: Sequence[QueueInput], unit: int = 1,
           usage: Mapping[str, Fraction] | None = None, k: Fraction | int = 0,
           quota_granted: bool = False) -> dict[str, QueueShare]:
    """Fair share of every queue (see module docstring). Unknown parents count as the root;
    queues whose parent chain loops (`parent_loops`) are left out of the division: fair share
    0. `usage` (queue -> usage share of this resource) turns time-based fair share on."""
    by_name = {q.name: q for q in queues}
    loops = parent_loops({q.name: q.parent for q in queues})
    children: dict[str, list[QueueInput]] = {}
    for q in sorted(queues, key=_sort_key):
        if q.name in loops:
            continue
        parent = q.parent if q.parent in by_name else ""
        children.setdefault(parent, []).append(q)
    out: dict[str, QueueShare] = {}

    def request_of(q: QueueInput) -> int:
        kids = children.get(q.name)
        if kids:
            own = sum(request_of(k) for k in kids)
            alloc = sum(out[k.name].allocated for k in kids)
        else:
            own = q.allocated + q.pending
            alloc = q.allocated
        out[q.name] = QueueShare(name=q.name, quota=q.quota, limit=q.limit, request=_cap(own, q.limit),
                                 allocated=alloc, children=[k.name for k in kids or []])
        return out[q.name].request

    for top in children.get("", []):
        request_of(top)

    def assign(parent_share: int, kids: list[QueueInput]) -> None:
        claims = [(kid, out[kid.name].request) for kid in kids]
        shares = split(parent_share, claims, usage, k, quota_granted) if unit <= 1 else \
            split_whole(parent_share, claims, unit, usage, k, quota_granted)
        for kid in kids:
            out[kid.name].fair_share = shares[kid.name]
            if children.get(kid.name):
                assign(shares[kid.name], children[kid.name])

    assign(capacity, children.get("", []))
    del request_of, assign  # (recursive closures hold themselves through their cells: emptied, they are freed now)
    for name in sorted(loops):
        q = by_name[name]
        out[name] = QueueShare(name=name, quota=q.quota, limit=q.limit, request=0, allocated=q.allocated)
    return out


def split(amount: int, claims: Sequence[tuple[QueueInput, int]],
          usage: Mapping[str, Fraction] | None = None, k: Fraction | int = 0,
          quota_granted: bool = False) -> dict[str, int]:
    """Divide `amount` among siblings, each (queue, request), by steps 1-3 of the rules."""
    need = {q.name: r for q, r in claims}
    given = _within_quota(amount, claims, quota_granted)
    remaining = amount - sum(given.values())
    # step 2 and 3: over quota, by priority bucket, in weighted rounds
    for bucket in _buckets(q for q, _ in claims):
        if remaining <= 0:
            break
        open_ = [q for q in bucket if q.over_quota_weight > 0 and given[q.name] < need[q.name]]
        while open_ and remaining > 0:
            wanted = {q.name: need[q.name] - given[q.name] for q in open_}
            weights = round_weights(open_, usage, k)
            if not any(weights.values()):
                break
            portions = _proportional(remaining, [(q, weights[q.name]) for q in open_], wanted)
            for q in open_:
                given[q.name] += portions[q.name]
                remaining -= portions[q.name]
            still_open = [q for q in open_ if given[q.name] < need[q.name]]
            if len(still_open) == len(open_) or not still_open:
                break  # nobody was capped: the division is final
            open_ = still_open
    return given


def split_whole(amount: int, claims: Sequence[tuple[QueueInput, int]], unit: int,
                usage: Mapping[str, Fraction] | None = None, k: Fraction | int = 0,
                quota_granted: bool = False) -> dict[str, int]:
    """`split` with the over-quota steps in whole units of `unit` (see module docstring)."""
    need = {q.name: r for q, r in claims}
    given = _within_quota(amount, claims, quota_granted)
    remaining = amount - sum(given.values())
    #: per bucket, each unsatisfied child's leftover of its last round, as a fraction
    #: (numerator, denominator) of the round's amount
    leftovers: list[dict[str, tuple[int, int]]] = []
    for bucket in _buckets(q for q, _ in claims):
        left: dict[str, tuple[int, int]] = {}
        open_ = [q for q in bucket if q.over_quota_weight > 0 and given[q.name] < need[q.name]]
        while open_ and remaining > 0:
            weights = round_weights(open_, usage, k)
            total = sum(weights.values())
            if total <= 0:
                break
            round_amount = remaining
            satisfied_early = False
            for q in open_:
                share_num = round_amount * weights[q.name]  # the exact share is share_num / total
                wanted = need[q.name] - given[q.name]
                if wanted * total <= share_num:
                    give = wanted
                    left.pop(q.name, None)
                    satisfied_early = satisfied_early or wanted * total < share_num
                else:
                    give = share_num // (total * unit) * unit
                    rest = share_num - give * total
                    if rest > 0:
                        left[q.name] = (rest, total)
                given[q.name] += give
                remaining -= give
            open_ = [q for q in open_ if given[q.name] < need[q.name]]
            if not satisfied_early:
                break
        leftovers.append(left)
    by_name = {q.name: q for q, _ in claims}
    for left in leftovers:
        # largest leftover first: compare a/b > c/d as a*d > c*b, exactly
        order = sorted(left, key=lambda n: (_Frac(*left[n]), by_name[n].created_ns, by_name[n].uid, n))
        for name in order:
            if remaining <= 0:
                break
            give = min(unit, remaining, need[name] - given[name])
            if give > 0:
                given[name] += give
                remaining -= give
    return given


@dataclass(frozen=True, slots=True)
class _Frac:
    """A fraction ordered from the largest down (for sorting leftovers)."""

    num: int
    den: int

    def __lt__(self, other: _Frac) -> bool:
        return self.num * other.den > other.num * self.den


def _within_quota(amount: int, claims: Sequence[tuple[QueueInput, int]],
                  quota_granted: bool = False) -> dict[str, int]:
    """Step 1 of the rules: min(quota, request) each, by priority, proportionally when short
    (`quota_granted`: in full, however short)."""
    given = {q.name: 0 for q, _ in claims}
    in_quota = {q.name: (r if q.quota < 0 else min(q.quota, r)) for q, r in claims}
    if quota_granted:  # an unlimited quota deserves the parent's whole share, no more
        return {q.name: (min(amount, r) if q.quota < 0 else in_quota[q.name]) for q, r in claims}
    remaining = amount
    for bucket in _buckets(q for q, _ in claims):
        asked = sum(in_quota[q.name] for q in bucket)
        if asked <= remaining:
            for q in bucket:
                given[q.name] = in_quota[q.name]
            remaining -= asked
        else:
            open_ = [q for q in bucket if in_quota[q.name] > 0]
            while open_ and remaining > 0:
                wanted = {q.name: in_quota[q.name] - given[q.name] for q in open_}
                portions = _proportional(remaining, [(q, in_quota[q.name]) for q in open_], wanted)
                for q in open_:
                    given[q.name] += portions[q.name]
                    remaining -= portions[q.name]
                still_open = [q for q in open_ if given[q.name] < in_quota[q.name]]
                if len(still_open) == len(open_) or not still_open:
                    break
                open_ = still_open
    return given


def _buckets(queues: Iterable[QueueInput]) -> list[list[QueueInput]]:
    ordered = sorted(queues, key=_sort_key)
    out: list[list[QueueInput]] = []
    for q in ordered:
        if out and out[-1][0].priority == q.priority:
            out[-1].append(q)
        else:
            out.append([q])
    return out


def _proportional(amount: int, weighted: Sequence[tuple[QueueInput, int]],
                  caps: Mapping[str, int]) -> dict[str, int]:
    """`amount` split by weight, each capped; remainders one unit at a time by largest
    remainder, then oldest, then name. Caps that bind leave their excess undistributed (the
    caller runs another round)."""
    total = sum(w for _, w in weighted)
    out = {q.name: 0 for q, _ in weighted}
    if total <= 0 or amount <= 0:
        return out
    rema: list[tuple[int, int, str]] = []
    handed = 0
    capped = False
    for q, w in weighted:
        share, rem = divmod(amount * w, total)
        if share >= caps[q.name]:
            out[q.name] = caps[q.name]
            capped = True
        else:
            out[q.name] = share
            rema.append((-rem, q.created_ns, q.name))
        handed += out[q.name]
    if capped:
        return out  # another round will redistribute the excess exactly
    leftover = amount - handed
    for _, _, name in sorted(rema):
        if leftover <= 0:
            break
        if out[name] < caps[name]:
            out[name] += 1
            leftover -= 1
    return out


def pod_request(spec: "PodObserved", gpu_memory_mib_hint: int) -> tuple[int, int, int]:
    """What a pending pod will add to its queue: (milli-GPU, milli-CPU, bytes). A gpu-memory
    request is counted against the largest GPU in the cluster (`gpu_memory_mib_hint`), since
    its device is not known before placement."""
    g = spec.gpu
    if g.whole:
        gpu = 1000 * g.whole
    elif g.fraction_milli:
        gpu = g.fraction_milli * max(1, g.fraction_devices)
    elif g.gpu_memory_mib:
        gpu = gpu_memory_milli(g.gpu_memory_mib, gpu_memory_mib_hint) * max(1, g.fraction_devices)
    else:
        gpu = 0
    return (gpu, spec.requests.milli_cpu, spec.requests.memory_bytes)


def pending_request(state: "ClusterState", gpu_memory_mib_hint: int,
                    replacements_once: bool = False) -> dict[str, tuple[int, int, int]]:
    """Per leaf queue: the total (milli-GPU, milli-CPU, bytes) its pending pods ask for. With
    `replacements_once` (kai-es/v6 on), a job's pending pods that replace its Releasing ones
    are not asked for twice: per job and resource, what its Releasing pods still hold (counted
    as allocated) is taken off its pending request, down to 0 — so a queue's request, and its
    fair share, do not swell while a victim leaves and its replacement waits."""
    out: dict[str, tuple[int, int, int]] = {}
    pods = state.pods
    for name in sorted(state.pending_jobs):
        gpu = cpu = mem = 0
        for index_key in state.pending_jobs[name]:
            job = state.jobs[job_key_of_index(index_key)]
            jg = jc = jm = 0
            for entry in job.pending:
                g, c, m = pod_request(pods[entry.pod_key].spec, gpu_memory_mib_hint)
                jg, jc, jm = jg + g, jc + c, jm + m
            if replacements_once and job.occupying:
                for key in job.members:
                    pod = pods[key]
                    if pod.status == "Releasing":
                        jg -= pod.milli_gpu
                        jc -= pod.spec.requests.milli_cpu
                        jm -= pod.spec.requests.memory_bytes
                jg, jc, jm = max(0, jg), max(0, jc), max(0, jm)
            gpu, cpu, mem = gpu + jg, cpu + jc, mem + jm
        out[name] = (gpu, cpu, mem)
    return out


#: `state.caches` key of `_node_totals`
_TOTALS_KEY = "scheduling.fairshare.node_totals"


def _node_totals(state: "ClusterState") -> tuple[tuple[int, int, int], int]:
    """(every node's allocatable summed, the largest node's GPU memory in MiB), kept in
    `state.caches` while the node set and specs stay the same (`state.node_set_version`, which
    every node added, removed or changed bumps): two passes over every node a cycle, otherwise."""
    kept = state.caches.get(_TOTALS_KEY)
    version = state.node_set_version
    if isinstance(kept, tuple) and kept[0] == version:
        return kept[1], kept[2]
    nodes = [state.nodes[n] for n in state.node_names]
    capacity = (sum(1000 * n.spec.gpus for n in nodes), sum(n.spec.milli_cpu for n in nodes),
                sum(n.spec.memory_bytes for n in nodes))
    hint = max((n.spec.gpu_memory_mib for n in nodes), default=0)
    state.caches[_TOTALS_KEY] = (version, capacity, hint)
    return capacity, hint


def cluster_capacity(state: "ClusterState") -> tuple[int, int, int]:
    """Every node's allocatable summed: (milli-GPU, milli-CPU, memory bytes)."""
    return _node_totals(state)[0]


def gpu_memory_hint(state: "ClusterState") -> int:
    """The largest node's GPU memory (MiB; 0 without nodes): what a GPU-memory request is
    counted against as a share of a device (`pod_request`)."""
    return _node_totals(state)[1]


def shares_for_state(state: "ClusterState", gpu_unit: int = 1, time_based: TimeBased | None = None,
                     replacements_once: bool = False, quota_granted: bool = False
                     ) -> dict[str, dict[str, QueueShare]]:
    """resource -> queue -> its share, for the cluster and queues in `state` (capacity = every
    node's allocatable; allocated = Binding, Running and Releasing pods; pending = Pending pods).
    GPUs are divided in units of `gpu_unit` milli-GPU over quota (1: exactly; 1000: whole GPUs);
    `time_based` weighs the over-quota rounds by historical usage; `replacements_once`: see
    `pending_request`; `quota_granted`: step 1 of `divide`."""
    capacity, hint = _node_totals(state)
    pending = pending_request(state, hint, replacements_once)
    out: dict[str, dict[str, QueueShare]] = {}
    for r, resource in enumerate(RESOURCES):
        inputs = []
        for name in sorted(state.queues):
            q = state.queues[name]
            spec = q.spec
            res = getattr(spec, resource)
            inputs.append(QueueInput(
                name=name, uid=spec.uid, parent=spec.parent, priority=spec.priority, created_ns=spec.created_ns,
                quota=res.quota, over_quota_weight=res.over_quota_weight, limit=res.limit,
                allocated=(q.allocated_milli_gpu, q.allocated_milli_cpu, q.allocated_memory_bytes)[r],
                pending=pending.get(name, (0, 0, 0))[r]))
        usage = None if time_based is None else {name: u[r] for name, u in time_based.usage.items()}
        out[resource] = divide(capacity[r], inputs, gpu_unit if resource == "gpu" else 1, usage,
                               time_based.k if time_based is not None else 0, quota_granted)
    return out


if TYPE_CHECKING:
    from kai_es.events.payloads import PodObserved
    from kai_es.state.model import ClusterState
