"""Queue order: which queue's candidate job goes next (level by level down the queue tree; the
Session compares the keys of sibling queues, smallest first). One rule per released order.

`QueueOrderV1` (kai-es/v1), first difference decides:
  1. queues not over their fair share in every resource before those that are;
  2. queues that stay within quota with the candidate job before those that would not;
  3. higher queue priority;
  4. smaller dominant-resource share including the candidate job (DRF: max over resources of
     (allocated + candidate) / fair share, as an integer in units of 1e-12);
  5. older queue, then name.
`KaiQueueOrder` (kai-es/v2 on, KAI's): 1-3 as v1, then
  4. a queue that would use a resource in which its fair share is zero goes after one that
     would not;
  5. smaller dominant-resource share including the candidate job;
  6. smaller dominant-resource share without the candidate job;
  7. a queue whose fair share is smaller in at least one resource and larger in none goes
     first (`FairShareOrder`);
  8. older queue, then name.

`AllocatableShareOrder` (kai-es/v10 on, KAI's `GetDominantResourceShare`): as `KaiQueueOrder`,
  but keys 4-7 measure a queue against its allocatable share (`QueueNode.allocatable`: max of
  quota and fair share within the limit) rather than its fair share: a queue of quota 2 holding
  1 GPU stands at 1/2 even when the cluster's one GPU gives it a fair share of 1 (KAI's "1
  build job pending for each queue with different share" case). A resource whose allocatable
  share is zero and that the queue would use ranks it after every other (INFINITE, then more
  use later).

Contract: `key(queue, request)` is a pure function of the queue's tentative accounting (its
allocation, fair share, quota, priority, age, name) and the candidate's request; every key
ends in the queue's unique name.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kai_es.scheduling.session import QueueNode
    from kai_es.state.quantities import Vector

#: DRF shares are compared as floor(used * SHARE_SCALE / fair share): integers, exact to 1e-12
SHARE_SCALE = 10**12
INFINITE = 10**40


class QueueOrder(Protocol):
    def key(self, q: QueueNode, request: Vector) -> tuple[object, ...]:
        """The order key of queue `q` with a candidate job requesting `request`."""


class FairShareOrder:
    """KAI's tie-break on fair shares: a queue whose fair share is smaller in at least one
    resource and not larger in any goes first. Two shares neither of which is smaller that way
    compare equal, so the order falls through to the next key (creation time)."""

    __slots__ = ("fair",)

    def __init__(self, fair: Vector) -> None:
        self.fair = fair

    def __lt__(self, other: FairShareOrder) -> bool:
        a, b = self.fair, other.fair
        return a != b and a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2]

    def __eq__(self, other: object) -> bool:
        # neither is smaller (a hot path of queue ordering: comparisons written out)
        if not isinstance(other, FairShareOrder):
            return False
        a, b = self.fair, other.fair
        if a == b:
            return True
        return not (a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2]) and \
            not (b[0] <= a[0] and b[1] <= a[1] and b[2] <= a[2])

    def __hash__(self) -> int:
        return 0


@lru_cache(maxsize=4096)
def fair_share_order(fair: Vector) -> FairShareOrder:
    """The `FairShareOrder` of `fair`, one object per vector: keys of queues with equal shares
    then hold the same object, which a tuple comparison finds equal by identity without calling
    `__eq__` (queue ordering compares such keys ~10 times a pick). Identity changes no order:
    equal vectors compare equal either way."""
    return FairShareOrder(fair)


def _over(q: QueueNode, request: Vector) -> tuple[bool, bool]:
    """Keys 1 and 2, which every released order starts with: (over its fair share in every
    resource, over quota with the candidate)."""
    allocated, fair, quota = q.allocated, q.fair, q.quota
    over_all = allocated[0] > fair[0] and allocated[1] > fair[1] and allocated[2] > fair[2]
    for r in (0, 1, 2):
        if request[r] > 0 and 0 <= quota[r] < allocated[r] + request[r]:
            return over_all, True
    return over_all, False


def _drf(allocated: Vector, request: Vector, base: Vector, grows: bool) -> tuple[bool, int, int]:
    """(whether the queue would use a resource whose `base` is zero, its dominant share with the
    candidate, without it), shares as floor(used * SHARE_SCALE / base); a zero base counts
    INFINITE, plus the amount used when `grows` (KAI's allocated x 1000: more use, later).
    Keys are cached per queue by the Session, so this costs a call per try."""
    zero = False
    share = share_without = 0
    for r in (0, 1, 2):
        used, have, b = allocated[r] + request[r], allocated[r], base[r]
        if used > 0:
            if b > 0:
                s = used * SHARE_SCALE // b
            else:
                zero = True
                s = INFINITE + used if grows else INFINITE
            if s > share:
                share = s
        if have > 0:
            s = have * SHARE_SCALE // b if b > 0 else (INFINITE + have if grows else INFINITE)
            if s > share_without:
                share_without = s
    return zero, share, share_without


class QueueOrderV1:
    """kai-es/v1's order (see module docstring)."""

    __slots__ = ()

    def key(self, q: QueueNode, request: Vector) -> tuple[object, ...]:
        over_all, over_quota = _over(q, request)
        share = _drf(q.allocated, request, q.fair, False)[1]
        return (over_all, over_quota, -q.priority, share, q.created_ns, q.name)


class KaiQueueOrder:
    """KAI's order, kai-es/v2 on (see module docstring)."""

    __slots__ = ()

    def key(self, q: QueueNode, request: Vector) -> tuple[object, ...]:
        over_all, over_quota = _over(q, request)
        zero_fair, share, share_without = _drf(q.allocated, request, q.fair, False)
        return (over_all, over_quota, -q.priority, zero_fair, share, share_without, fair_share_order(q.fair),
                q.created_ns, q.name)


class AllocatableShareOrder:
    """KAI's order over allocatable shares, kai-es/v10 on (see module docstring)."""

    __slots__ = ()

    def key(self, q: QueueNode, request: Vector) -> tuple[object, ...]:
        over_all, over_quota = _over(q, request)
        zero, share, share_without = _drf(q.allocated, request, q.allocatable, True)
        return (over_all, over_quota, -q.priority, zero, share, share_without, fair_share_order(q.allocatable),
                q.created_ns, q.name)
