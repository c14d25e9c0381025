"""Reclaim's victim rules: whether a pending job may reclaim at all, which queues' jobs it may take
from, and whether a victim may be taken — each policy version's judge of a reclaim
(`judge(session)`, one per action run: it may keep caches for the action).

Both compare the two queues at the level just below their lowest common ancestor (queues without
a common parent: their roots), the *sides*.

- `DominantShareReclaimV5` (kai-es/v2 to v5), judged on the accounting *after* each eviction:
  - the reclaiming job's queue, and each of its ancestors below that level, stays within its
    fair share with the job (a non-preemptible job: within its quota too);
  - a victim is a preemptible job of another queue that frees a resource the reclaiming job
    needs; its side must stay at or above its deserved quota in every such resource, and either
    stay at or above its fair share in one of them, or the reclaiming side only takes what it
    is owed (it stays within its deserved quota) from a side above its own;
  - the reclaiming side must not end up more saturated, relative to its fair share (dominant
    share), than the side it takes from.
  A queue with quota 2 that holds 1 GPU can so never take its second back from a queue of quota
  0 (the victim's side would end below its fair share), and a large victim far above its fair
  share is protected by its queue's quota.
- `KaiReclaimStrategies` (kai-es/v6 on), KAI's proportion plugin:
  - may start: the job's leaf queue stays within its fair share in every resource with the
    job's request added (a non-preemptible job: within quota too, `Session.limits`);
  - a queue's jobs are candidates when, on the accounting now, the reclaiming side would exceed
    its deserved quota with the job and the victim's side is above its *allocatable* share
    (max(quota, fair share), capped by its limit) in some resource; or when the reclaiming side
    stays within its deserved quota and the victim's side is above its quota in a requested
    resource (or at it in every one);
  - each victim, *before* it is taken (its side's allocation still counting it and every victim
    taken before it uncounted), passes one of KAI's two strategies: maintain fair share (its side
    is above its allocatable share in some resource), or guarantee deserved quota (the
    reclaiming side stays within its deserved quota with the job, and the victim's side is above
    its quota in some resource);
  - the saturation bound — for each resource the job requests or a victim frees, the reclaiming
    side may end above 1 relative to its fair share only while staying *below* the victim side's
    ratio; a side whose fair share is zero in the resource is not compared — checked for each
    victim as it is taken, and once the search placed the job and its victims were re-placed
    (`rules.replacement`) for the scenario whole, on the victims still evicted (a moved victim
    is not counted, as KAI's allowConsolidatingReclaim, on by default).
  An elastic victim offers its surplus pods one at a time and its gang as one victim, as KAI
  splits a victim's tasks.
- `QueuePriorityInQuota` (kai-es/v8 on): `KaiReclaimStrategies`, and with the config's
  `queuePriorityInQuotaReclaim` (KAI's proportion argument, off by default) a third strategy:
  a victim whose side has a strictly lower queue priority than the reclaiming side is taken,
  in quota or not, while the reclaiming side stays within its deserved quota with the job (its
  queues are candidates on the same terms). The saturation bound still holds.
- `FinalVictimsReclaim` (kai-es/v9 on): `QueuePriorityInQuota`, but the strategies and the
  saturation bound judge only the victims still evicted once the job is placed and the victims
  re-placed, each on its side's allocation as the search began with the victims before it
  uncounted (KAI's reclaim validator; a moved victim is none, allowConsolidatingReclaim). The
  search takes any victim of a candidate queue that frees what the job needs.

Contract: pure; integers only (ratios compared by cross-multiplication); reads the Session's
accounting, writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import msgspec

from kai_es.scheduling.fairshare import RESOURCES
from kai_es.scheduling.plan import Entry, Eviction
from kai_es.scheduling.session import format_quantity
from kai_es.state.quantities import Vector

if TYPE_CHECKING:
    from kai_es.scheduling.session import QueueNode, Session
    from kai_es.scheduling.victims import Unit
    from kai_es.state.model import Job

RESOURCE_NAMES = ("GPU", "CPU", "memory")


class ReclaimJudge(Protocol):
    def may_start(self, leaf: QueueNode, job: Job, request: Vector) -> bool:
        """Whether `job` of `leaf`, requesting `request` now, may reclaim at all."""

    def why_not(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        """Why `may_start` refused (the rule and its numbers)."""

    def victim_buckets(self, leaf: QueueNode, job: Job, request: Vector) -> list[tuple[str, int]]:
        """The (queue, priority) buckets of `state.victim_jobs` whose jobs the job may take pods
        from, judged on the accounting now (a bucket left out holds no unit `admit` takes)."""

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        """Whether a unit may be taken, on the accounting when it is offered."""

    def settle(self, leaf: QueueNode, job: Job, request: Vector, start: int) -> tuple[str, dict[str, int]] | None:
        """The whole scenario (the Plan's operations after checkpoint `start`, the job placed and
        its victims re-placed): None when it stands, else why not."""


class ReclaimVictims(Protocol):
    #: whether the config's `queuePriorityInQuotaReclaim` is honoured (else a config setting it
    #: is refused)
    @property
    def honours_queue_priority(self) -> bool: ...

    def judge(self, session: Session) -> ReclaimJudge:
        """The judge for one run of the reclaim action."""


def dominant_share(allocated: Vector, fair: Vector) -> tuple[int, int]:
    """max over resources of allocated / fair, as an exact fraction (numerator, denominator);
    a resource used with zero fair share is infinitely saturated (1, 0)."""
    best = (0, 1)
    for used, share in zip(allocated, fair):
        if used <= 0:
            continue
        if share <= 0:
            return (1, 0)
        if used * best[1] > best[0] * share:
            best = (used, share)
    return best


def at_most(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """a <= b for fractions (x, 0) meaning infinity."""
    if a[1] == 0:
        return b[1] == 0
    if b[1] == 0:
        return True
    return a[0] * b[1] <= b[0] * a[1]


def sides(a: QueueNode, b: QueueNode) -> tuple[tuple[QueueNode, ...], QueueNode, QueueNode] | None:
    """(a's chain below the lowest common ancestor, a's side, b's side), or None when b is in
    a's own chain (the same queue or an ancestor: nothing to reclaim from). Queues without a
    common ancestor: their roots are the sides. (Called for every pair of a reclaimer's and a
    victim's queue: written out, by identity.)"""
    a_chain = a.chain
    k = len(a_chain)  # where the lowest common ancestor is in a's chain (none: past its end)
    b_side: QueueNode | None = b.chain[-1]
    previous: QueueNode | None = None
    for q in b.chain:
        found = -1
        for i, x in enumerate(a_chain):
            if x is q:
                found = i
                break
        if found >= 0:
            k, b_side = found, previous
            break
        previous = q
    if k == 0 or b_side is None or any(x is b_side for x in a_chain):
        return None
    return a_chain[:k], a_chain[k - 1], b_side


def _could_yield(victim: QueueNode) -> bool:
    """Some side of `victim` (itself or an ancestor) could lose preemptible usage under the
    victim-side rules of `admit`, whoever the reclaimer."""
    held = [r for r in (0, 1, 2) if victim.allocated[r] - victim.nonpreemptible[r] > 0]
    for side in victim.chain:
        if any(side.quota[r] < 0 or side.allocated[r] > side.quota[r] for r in held) and \
                any(side.allocated[r] > side.fair[r] or 0 <= side.quota[r] < side.allocated[r] for r in held):
            return True
    return False


def _open_sides(leaf: QueueNode, job: Job, request: Vector, victim: QueueNode, bound: bool
                ) -> tuple[QueueNode, QueueNode] | None:
    """(the reclaimer's side, the victim's side) when `leaf` may reclaim from `victim`'s side at
    all: they differ, and the reclaimer's queues below their common ancestor stay within fair
    share with the job (`_chain_within`); else None."""
    found = sides(leaf, victim)
    if found is None:
        return None
    chain, mine, theirs = found
    return (mine, theirs) if _chain_within(chain, request, bound) else None


def _side_may_yield(mine: QueueNode, theirs: QueueNode, request: Vector, held: list[int],
                    mine_now: tuple[bool, tuple[int, int]] | None = None) -> bool:
    """Whether `admit` could take any unit from side `theirs` for `mine`'s job now or later in
    its search, for units that free only resources in `held` (resources the job requests and
    the victim queue holds preemptibly): each victim-side rule for a unit freeing at least one
    unit of one of them (evictions only lower the victim side's accounting, which makes each
    rule stricter). `mine_now`: `_mine_now(mine, request)`, when the caller has it."""
    if not any(theirs.quota[r] < 0 or theirs.allocated[r] > theirs.quota[r] for r in held):
        return False
    owed, gained_share = mine_now or _mine_now(mine, request)
    keeps_fair = any(theirs.allocated[r] > theirs.fair[r] for r in held)
    if not (keeps_fair or (owed and any(0 <= theirs.quota[r] < theirs.allocated[r] for r in held))):
        return False
    return at_most(gained_share, dominant_share(theirs.allocated, theirs.fair))


def _mine_now(mine: QueueNode, request: Vector) -> tuple[bool, tuple[int, int]]:
    """What the victim-side rules need of the reclaiming side: whether it stays within its
    deserved quota with the job, and its dominant share with the job."""
    return _owed(mine, request), dominant_share(_plus(mine.allocated, request), mine.fair)


def _chain_within(chain: tuple[QueueNode, ...], request: Vector, bound: bool) -> bool:
    """The reclaiming side's queues below the common ancestor stay within their fair share with
    the job's `request` (`bound`, `Session.quota_bound`: within quota too)."""
    for q in chain:
        for r in (0, 1, 2):
            if request[r] <= 0:
                continue
            if q.allocated[r] + request[r] > q.fair[r]:
                return False
            if bound and 0 <= q.quota[r] < q.nonpreemptible[r] + request[r]:
                return False
    return True


def _owed(mine: QueueNode, request: Vector) -> bool:
    """The reclaiming side stays within its deserved quota with the job."""
    return all(request[r] <= 0 or mine.quota[r] < 0 or mine.allocated[r] + request[r] <= mine.quota[r]
               for r in (0, 1, 2))


def _plus(a: Vector, b: Vector) -> Vector:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])



def _q(r: int, amount: int) -> str:
    return format_quantity(RESOURCES[r], amount)


def _why_over_fair(leaf: QueueNode, request: Vector, every_resource: bool = False) -> tuple[str, dict[str, int]]:
    """Why `leaf` may not reclaim for `request`: the first resource (requested ones only, or
    with `every_resource` all of them) in which it would exceed its fair share."""
    for r, name in enumerate(RESOURCE_NAMES):
        if (every_resource or request[r] > 0) and leaf.allocated[r] + request[r] > leaf.fair[r]:
            return (f"queue {leaf.name} would exceed its fair share in {name}: "
                    f"{_q(r, leaf.allocated[r] + request[r])} > {_q(r, leaf.fair[r])}",
                    {"allocated": leaf.allocated[r], "requested": request[r], "fair_share": leaf.fair[r]})
    return f"queue {leaf.name} may not reclaim", {}


class DominantShareReclaimV5:
    __slots__ = ()
    honours_queue_priority = False

    def judge(self, session: Session) -> ReclaimJudge:
        return _DominantShareJudge(session)


class _DominantShareJudge:
    def __init__(self, session: Session) -> None:
        self.session = session
        self._yielding_at = -1
        #: id of a queue -> the leaves below it (itself included) holding victims that some
        #: reclaimer could take from (`_could_yield`), by name
        self._yielding_under: dict[int, list[QueueNode]] = {}

    def may_start(self, leaf: QueueNode, job: Job, request: Vector) -> bool:
        # within fair share at the leaf at least (the full chain is checked per victim)
        return all(request[r] <= 0 or leaf.allocated[r] + request[r] <= leaf.fair[r] for r in (0, 1, 2))

    def why_not(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        return _why_over_fair(leaf, request)

    def settle(self, leaf: QueueNode, job: Job, request: Vector, start: int) -> tuple[str, dict[str, int]] | None:
        return None

    def victim_buckets(self, leaf: QueueNode, job: Job, request: Vector) -> list[tuple[str, int]]:
        """Walks the reclaimer's chain: at each level, the other children of the level's parent
        (at the top, the other roots) are the sides it may take from; a side's rules are checked
        once for the side (every requested resource counted as held: a necessary condition for
        each leaf below it), then exactly for each of its leaves holding victims."""
        under = self._under()
        requested = [r for r in (0, 1, 2) if request[r] > 0]
        names: list[str] = []
        chain = leaf.chain
        for depth, mine in enumerate(chain):
            siblings = mine.parent.children if mine.parent is not None else self.session.roots
            sides = [(side, under[id(side)]) for side in siblings if side is not mine and id(side) in under]
            if not sides or not _chain_within(chain[:depth + 1], request, self.session.quota_bound(job)):
                continue
            mine_now = _mine_now(mine, request)
            for side, leaves in sides:
                if not _side_may_yield(mine, side, request, requested, mine_now):
                    continue
                for victim in leaves:
                    held = [r for r in requested if victim.allocated[r] - victim.nonpreemptible[r] > 0]
                    if _side_may_yield(mine, side, request, held, mine_now):
                        names.append(victim.name)
        found = self.session.state.victim_jobs
        return [(name, priority) for name in sorted(names) for priority in sorted(found[name])]

    def _under(self) -> dict[int, list[QueueNode]]:
        """`_yielding_under`, recomputed when the Plan has changed."""
        length = len(self.session.plan.operations)
        if self._yielding_at != length:
            queues = self.session.queues
            self._yielding_at = length
            under: dict[int, list[QueueNode]] = {}
            for name in sorted(self.session.state.victim_jobs):
                victim = queues.get(name)
                if victim is not None and not victim.children and _could_yield(victim):
                    for q in victim.chain:
                        under.setdefault(id(q), []).append(victim)
            self._yielding_under = under
        return self._yielding_under

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        queues = self.session.queues
        bound = self.session.quota_bound(job)

        def admit(unit: Unit) -> bool:
            sides = _open_sides(leaf, job, request, queues[unit.job.queue], bound)
            if sides is None:
                return False
            mine, theirs = sides
            lost = unit.request
            after: Vector = (theirs.allocated[0] - lost[0], theirs.allocated[1] - lost[1],
                             theirs.allocated[2] - lost[2])
            moving = [r for r in (0, 1, 2) if lost[r] > 0 and request[r] > 0]
            if not moving:
                return False  # the victim frees nothing the reclaimer needs
            # in-quota resources are never reclaimed
            if any(theirs.quota[r] >= 0 and after[r] < theirs.quota[r] for r in moving):
                return False
            # the victim side stays at or above its fair share in a resource being reclaimed ...
            keeps_fair = any(after[r] >= theirs.fair[r] for r in moving)
            # ... or the reclaimer only takes what it is owed (within its deserved quota)
            owed = _owed(mine, request) and any(theirs.quota[r] >= 0 and after[r] > theirs.quota[r] for r in moving)
            if not (keeps_fair or owed):
                return False
            return at_most(dominant_share(_plus(mine.allocated, request), mine.fair), dominant_share(after, theirs.fair))

        return admit


# -- kai-es/v6: KAI's strategies --------------------------------------------------------------


def allocatable(q: QueueNode, r: int) -> int:
    """KAI's allocatable share of `q` in resource `r`: max(quota, fair share), capped by the
    limit; a queue without quota (-1) may have up to its limit (-1: unlimited, returned as -1)."""
    if q.quota[r] < 0:
        return q.limit[r]
    share = max(q.quota[r], q.fair[r])
    return min(share, q.limit[r]) if q.limit[r] >= 0 else share


def above_allocatable(q: QueueNode, allocated: Vector) -> bool:
    """KAI's maintain-fair-share test: `allocated` exceeds `q`'s allocatable share in some
    resource."""
    for r in (0, 1, 2):
        bound = allocatable(q, r)
        if bound >= 0 and allocated[r] > bound:
            return True
    return False


def within_quota(q: QueueNode, allocated: Vector) -> bool:
    """`allocated` stays within `q`'s deserved quota in every resource (-1: no quota, no bound)."""
    return all(q.quota[r] < 0 or allocated[r] <= q.quota[r] for r in (0, 1, 2))


def above_quota(q: QueueNode, allocated: Vector) -> bool:
    """`allocated` exceeds `q`'s deserved quota in some resource."""
    return any(q.quota[r] >= 0 and allocated[r] > q.quota[r] for r in (0, 1, 2))


def strategy_allows(mine: QueueNode, theirs: QueueNode, with_job: Vector, remaining: Vector) -> bool:
    """KAI's two reclaim strategies for one victim of side `theirs`, whose allocation is
    `remaining` with the victim still counted, for the reclaiming side `mine` whose allocation
    with the job is `with_job`: maintain fair share, or guarantee deserved quota."""
    return above_allocatable(theirs, remaining) or (within_quota(mine, with_job) and above_quota(theirs, remaining))


def _ratio_above(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """a >= b for ratios (used, share), share 0 meaning infinity when used > 0 (0 otherwise)."""
    (au, af), (bu, bf) = a, b
    a_inf, b_inf = af == 0 and au > 0, bf == 0 and bu > 0
    if a_inf:
        return True
    if b_inf:
        return False
    an, ad = (au, af) if af else (0, 1)
    bn, bd = (bu, bf) if bf else (0, 1)
    return an * bd >= bn * ad


def saturation_refusal(mine: QueueNode, theirs: QueueNode, involved: set[int], mine_allocated: Vector,
                       theirs_allocated: Vector) -> tuple[str, dict[str, int]] | None:
    """KAI's saturation bound between the reclaiming side (allocated `mine_allocated`, the job
    counted) and a victim side (`theirs_allocated`, its victims uncounted), over the `involved`
    resources: None when it holds, else why not."""
    for r in sorted(involved):
        share = theirs.fair[r]
        used = mine_allocated[r]
        over = used > mine.fair[r]  # ratio above 1 (a zero fair share used at all: infinite)
        if over and share > 0 and _ratio_above((used, mine.fair[r]), (theirs_allocated[r], share)):
            return (f"queue {mine.name} would end above its fair share in {RESOURCE_NAMES[r]} "
                    f"({_q(r, used)} > {_q(r, mine.fair[r])}) and not below queue {theirs.name}'s saturation "
                    f"({_q(r, theirs_allocated[r])} of {_q(r, share)})",
                    {"reclaimer_allocated": used, "reclaimer_fair_share": mine.fair[r],
                     "victim_allocated": theirs_allocated[r], "victim_fair_share": share})
    return None


def final_victims(session: Session, start: int) -> list[str]:
    """The pods the Plan's operations after checkpoint `start` still evict, in order: not
    undone, and not moved (re-placed elsewhere: `Entry.moved_from`)."""
    ops = session.plan.operations[start:]
    moved = {op.pod_key for op in ops if isinstance(op, Entry) and op.moved_from >= 0}
    return [op.pod_key for op in ops if isinstance(op, Eviction) and not op.undone and op.pod_key not in moved]


def _minus(a: Vector, b: Vector) -> Vector:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


class KaiReclaimStrategies:
    __slots__ = ()
    honours_queue_priority = False

    def judge(self, session: Session) -> ReclaimJudge:
        return _KaiJudge(session)


class QueuePriorityInQuota(KaiReclaimStrategies):
    __slots__ = ()
    honours_queue_priority = True

    def judge(self, session: Session) -> ReclaimJudge:
        config = session.config
        return _KaiJudge(session, by_priority=config is not None and config.queue_priority_in_quota_reclaim)


def by_queue_priority(mine: QueueNode, theirs: QueueNode, with_job: Vector) -> bool:
    """The in-quota reclaim by queue priority: side `theirs` has a strictly lower priority than
    the reclaiming side `mine`, which stays within its deserved quota with the job (`with_job`)."""
    return theirs.priority < mine.priority and within_quota(mine, with_job)


class _KaiJudge:
    def __init__(self, session: Session, by_priority: bool = False) -> None:
        self.session = session
        #: `queuePriorityInQuotaReclaim` in force (`QueuePriorityInQuota`)
        self.by_priority = by_priority
        #: `victim_buckets` answers by (leaf, request, every queue's allocation then)
        self._buckets: dict[tuple[str, Vector, tuple[Vector, ...]], list[tuple[str, int]]] = {}
        #: (reclaimer's side, victim's side) by (id of leaf, id of victim queue): the session's
        #: queue tree does not change during the action
        self._sides: dict[tuple[int, int], tuple[QueueNode, QueueNode] | None] = {}

    def may_start(self, leaf: QueueNode, job: Job, request: Vector) -> bool:
        return all(leaf.allocated[r] + request[r] <= leaf.fair[r] for r in (0, 1, 2))

    def why_not(self, leaf: QueueNode, job: Job, request: Vector) -> tuple[str, dict[str, int]]:
        return _why_over_fair(leaf, request, every_resource=True)

    def _candidate_side(self, mine: QueueNode, theirs: QueueNode, request: Vector) -> bool:
        """KAI's victim filter, by the victim's queue, on the accounting now: a function of the
        two sides below the queues' common ancestor (`sides`) and the request."""
        if self.by_priority and by_queue_priority(mine, theirs, _plus(mine.allocated, request)):
            return True
        if not within_quota(mine, _plus(mine.allocated, request)):
            return above_allocatable(theirs, theirs.allocated)
        under = False
        for r in (0, 1, 2):
            if request[r] <= 0 or theirs.quota[r] < 0:
                continue
            if theirs.allocated[r] > theirs.quota[r]:
                return True
            if theirs.allocated[r] < theirs.quota[r]:
                under = True
        return not under

    def victim_buckets(self, leaf: QueueNode, job: Job, request: Vector) -> list[tuple[str, int]]:
        """The (queue, priority) buckets of `state.victim_jobs` whose queue passes KAI's victim
        filter (`_candidate_side`) for `request` of `leaf`. A function of the leaf, the request
        and the queues' allocations (the rest is fixed for the cycle), so kept by those: the
        many waiting jobs of a queue that ask alike (a cycle's failed reclaims, each rolled back)
        share one answer while no allocation moved. The filter is judged once for each pair of
        sides (the victim queues below one side share it)."""
        queues, found = self.session.queues, self.session.state.victim_jobs
        key = (leaf.name, request, tuple(q.allocated for q in queues.values()))
        kept = self._buckets.get(key)
        if kept is not None:
            return list(kept)
        out: list[tuple[str, int]] = []
        judged: dict[tuple[int, int], bool] = {}
        for name in sorted(found):
            victim = queues.get(name)
            if victim is None or victim.children or victim is leaf:
                continue
            pair = self._pair(leaf, victim)
            if pair is None:
                continue
            side_key = (id(pair[0]), id(pair[1]))
            passes = judged.get(side_key)
            if passes is None:
                passes = judged[side_key] = self._candidate_side(pair[0], pair[1], request)
            if passes:
                out.extend((name, priority) for priority in sorted(found[name]))
        if len(self._buckets) >= 4096:
            self._buckets.clear()
        self._buckets[key] = out
        return list(out)

    def _pair(self, leaf: QueueNode, victim: QueueNode) -> tuple[QueueNode, QueueNode] | None:
        """(the reclaimer's side, the victim's side) of `sides`, kept for the action."""
        key = (id(leaf), id(victim))
        known = self._sides
        if key in known:
            return known[key]
        both = sides(leaf, victim)
        pair = known[key] = None if both is None else (both[1], both[2])
        return pair

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        queues = self.session.queues
        mine_with_job: dict[int, Vector] = {}

        def admit(unit: Unit) -> bool:
            found = self._pair(leaf, queues[unit.job.queue])
            if found is None:
                return False
            mine, theirs = found
            lost = unit.request
            if not any(lost[r] > 0 and request[r] > 0 for r in (0, 1, 2)):
                return False  # the victim frees nothing the reclaimer needs
            with_job = mine_with_job.get(id(mine))
            if with_job is None:
                with_job = mine_with_job[id(mine)] = _plus(mine.allocated, request)
            if not strategy_allows(mine, theirs, with_job, theirs.allocated) and \
                    not (self.by_priority and by_queue_priority(mine, theirs, with_job)):
                return False
            # the saturation bound with this victim taken (victims only lower the victim side:
            # a victim that breaks it here breaks it in every scenario that holds it)
            involved = {r for r in (0, 1, 2) if lost[r] > 0 or request[r] > 0}
            return saturation_refusal(mine, theirs, involved, with_job, _minus(theirs.allocated, lost)) is None

        return admit

    def settle(self, leaf: QueueNode, job: Job, request: Vector, start: int) -> tuple[str, dict[str, int]] | None:
        """The scenario whole: the saturation bound per victim side, over every resource its
        victims still evicted free or the job requests. (The strategies need no second look:
        `admit` judged each victim on its side's allocation with the victims before it taken; the
        victims that stand are a subsequence of those, so each side's allocation before each of
        them is at least what it was then, and both strategies only get easier with more.)"""
        return self._saturation(leaf, request, final_victims(self.session, start))

    def _saturation(self, leaf: QueueNode, request: Vector, victims: list[str]) -> tuple[str, dict[str, int]] | None:
        """The saturation bound per side of the pods `victims`, over every resource they free
        or the job requests."""
        session = self.session
        state, queues = session.state, session.queues
        involved: dict[int, tuple[QueueNode, QueueNode, set[int]]] = {}
        requested = {r for r in (0, 1, 2) if request[r] > 0}
        for key in victims:
            pod = state.pods[key]
            queue = state.jobs[pod.job_key].queue
            pair = self._pair(leaf, queues[queue])
            if pair is None:
                return f"queue {queue} is no queue {leaf.name} may reclaim from", {}
            mine, theirs = pair
            entry = involved.get(id(theirs))
            if entry is None:
                entry = involved[id(theirs)] = (mine, theirs, set(requested))
            freed = entry[2]
            if pod.milli_gpu > 0:
                freed.add(0)
            if pod.spec.requests.milli_cpu > 0:
                freed.add(1)
            if pod.spec.requests.memory_bytes > 0:
                freed.add(2)
        for mine, theirs, resources in involved.values():
            why = saturation_refusal(mine, theirs, resources, mine.allocated, theirs.allocated)
            if why is not None:
                return why
        return None


class FinalVictimsReclaim(QueuePriorityInQuota):
    """kai-es/v9 on: `QueuePriorityInQuota`'s rules, but KAI's strategies and saturation bound
    judge the scenario's *final* victims only, once the job is placed and the victims that fit
    again are re-placed (KAI's reclaim validator runs after the simulation, on the queues as
    they were when the job's search began, and with allowConsolidatingReclaim, its default, a
    re-placed victim is no victim). A victim whose side would not pass the strategies may so be
    taken while the search looks for room, and stays where it runs or moves: v6–v8 refused it
    then, and a queue at its fair share could not lend a job the room a move would make."""

    __slots__ = ()

    def judge(self, session: Session) -> ReclaimJudge:
        config = session.config
        return _FinalVictimsJudge(session, by_priority=config is not None and config.queue_priority_in_quota_reclaim)


class _FinalVictimsJudge(_KaiJudge):
    def __init__(self, session: Session, by_priority: bool = False) -> None:
        super().__init__(session, by_priority)
        #: the units the current search took, in the order taken
        self.taken: list[Unit] = []
        #: each side's allocation (by id) and the reclaiming side's with the job, as the search began
        self.before: dict[int, Vector] = {}

    def admit(self, leaf: QueueNode, job: Job, request: Vector) -> Callable[[Unit], bool]:
        queues = self.session.queues
        self.taken, self.before = [], {}

        def admit(unit: Unit) -> bool:
            found = sides(leaf, queues[unit.job.queue])
            if found is None:
                return False
            lost = unit.request
            if not any(lost[r] > 0 and request[r] > 0 for r in (0, 1, 2)):
                return False  # the victim frees nothing the reclaimer needs
            _, mine, theirs = found
            # the accounting before this search's first eviction on either side
            self.before.setdefault(id(mine), _plus(mine.allocated, request))
            self.before.setdefault(id(theirs), theirs.allocated)
            self.taken.append(unit)
            return True

        return admit

    def settle(self, leaf: QueueNode, job: Job, request: Vector, start: int) -> tuple[str, dict[str, int]] | None:
        """KAI's validator on the victims still evicted: each, in the order taken, passes a
        strategy on its side's allocation with it still counted (the victims before it
        uncounted, from the allocation when the search began); then the saturation bound
        (`_KaiJudge.settle`) on the accounting with the job placed."""
        session = self.session
        victims = final_victims(session, start)
        evicted = set(victims)
        queues = session.queues
        remaining: dict[int, Vector] = {}
        for unit in self.taken:
            pods = tuple(pod for pod in unit.pods if pod.key in evicted)
            if not pods:
                continue  # put back where it runs, or moved: no victim
            found = sides(leaf, queues[unit.job.queue])
            assert found is not None, "admit took a unit of a queue it may not reclaim from"
            _, mine, theirs = found
            with_job = self.before[id(mine)]
            left = remaining.get(id(theirs), self.before[id(theirs)])
            if not strategy_allows(mine, theirs, with_job, left) and \
                    not (self.by_priority and by_queue_priority(mine, theirs, with_job)):
                return (f"queue {theirs.name} is not above its fair share or quota with job {unit.job.key} "
                        f"still counted ({_q(0, left[0])} GPU, quota {_q(0, theirs.quota[0])}, fair share "
                        f"{_q(0, theirs.fair[0])}): its pods may not be reclaimed for queue {mine.name}",
                        {"allocated_milli_gpu": left[0], "quota_milli_gpu": theirs.quota[0],
                         "fair_share_milli_gpu": theirs.fair[0]})
            remaining[id(theirs)] = _minus(left, msgspec.structs.replace(unit, pods=pods).request)
        return self._saturation(leaf, request, victims)
