"""KAI's queue order under policy kai-es/v2, key by key (`rules.queue_order.KaiQueueOrder`), and
kai-es/v1's order (`QueueOrderV1`) kept for logs written under it."""

from __future__ import annotations

from kai_es.scheduling.rules.queue_order import FairShareOrder, KaiQueueOrder, QueueOrderV1
from kai_es.scheduling.session import QueueNode


def _queue(name: str, fair: tuple[int, int, int], allocated: tuple[int, int, int] = (0, 0, 0),
           created: int = 0, priority: int = 100) -> QueueNode:
    return QueueNode(name=name, parent=None, priority=priority, created_ns=created, quota=(-1, -1, -1),
                     limit=(-1, -1, -1), allocated=allocated, fair=fair)


def _key(q: QueueNode, request: tuple[int, int, int], kai: bool = True) -> tuple[object, ...]:
    return (KaiQueueOrder() if kai else QueueOrderV1()).key(q, request)


def test_a_queue_that_would_use_a_resource_with_zero_fair_share_goes_later() -> None:
    # both at share 0 in GPU terms; b's fair share in CPU is zero and the job asks for CPU
    a = _queue("a", fair=(4000, 8000, 2**30), created=2)
    b = _queue("b", fair=(4000, 0, 2**30), created=1)
    job = (1000, 0, 0)
    assert _key(a, job) < _key(b, (1000, 1000, 0))
    # v1: no such rule; the DRF share (infinite for b) decides the same here, but the creation
    # time decides when both shares are equal
    assert _key(b, job, kai=False) < _key(a, job, kai=False)


def test_dominant_share_without_the_candidate_breaks_a_tie_with_it() -> None:
    # with the job both reach 2/4 of their GPU fair share; without it a holds 1/4, b 0/4
    a = _queue("a", fair=(4000, 0, 0), allocated=(1000, 0, 0), created=1)
    b = _queue("b", fair=(4000, 0, 0), allocated=(0, 0, 0), created=2)
    assert _key(b, (2000, 0, 0)) < _key(a, (1000, 0, 0))  # b goes first under KAI's order
    assert _key(a, (1000, 0, 0), kai=False) < _key(b, (2000, 0, 0), kai=False)  # v1: older a


def test_a_smaller_fair_share_goes_first_when_shares_tie() -> None:
    small = _queue("small", fair=(2000, 4000, 0), created=2)
    large = _queue("large", fair=(2000, 8000, 0), created=1)
    job = (0, 0, 0)
    assert _key(small, job) < _key(large, job)
    assert _key(large, job, kai=False) < _key(small, job, kai=False)


def test_incomparable_fair_shares_fall_through_to_creation_time() -> None:
    assert FairShareOrder((1, 5, 0)) == FairShareOrder((5, 1, 0))
    assert not FairShareOrder((1, 5, 0)) < FairShareOrder((5, 1, 0))
    assert FairShareOrder((1, 1, 0)) < FairShareOrder((1, 2, 0))
    older = _queue("older", fair=(1000, 5000, 0), created=1)
    newer = _queue("newer", fair=(5000, 1000, 0), created=2)
    assert _key(older, (0, 0, 0)) < _key(newer, (0, 0, 0))


def test_keys_of_queues_with_equal_fair_shares_hold_one_tie_breaker() -> None:
    """Equal fair shares give the keys one `FairShareOrder` object, so comparing them calls no
    `__eq__` (what the Session's pick does ~10 times a placement); the order is unchanged: the
    creation time decides, then the name."""
    a = _queue("a", fair=(4000, 8000, 2**30), created=2)
    b = _queue("b", fair=(4000, 8000, 2**30), created=1)
    c = _queue("c", fair=(4000, 8000, 2**30), created=1)
    keys = [_key(q, (1000, 0, 0)) for q in (a, b, c)]
    assert keys[0][6] is keys[1][6] is keys[2][6]
    assert sorted(keys) == [keys[1], keys[2], keys[0]]
