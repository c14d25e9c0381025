"""`kafka_tenure.taken_over`: which coordinator answers (DescribeTransactions) mean another
instance claimed the transactional id since we held it. The states and epochs are those a
Kafka 4.1 broker gives (tests/kafka/test_kafka_log.py meets each on a real one): a claim of
an idle id bumps the epoch by one and leaves it Empty, a claim over an ongoing transaction by
two, and the coordinator's abort of a timed-out transaction by one, in PrepareAbort then
CompleteAbort."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_es.adapters.kafka_tenure import Holder, taken_over

HELD = Holder(7, 3)


@pytest.mark.parametrize(("now", "expected"), [
    (None, False),                              # the coordinator forgot the id: nobody claimed it
    (Holder(7, 3, "Empty"), False),             # still ours
    (Holder(7, 3, "Ongoing"), False),           # our own transaction, still open
    (Holder(7, 3, "PrepareCommit"), False),
    (Holder(7, 4, "CompleteAbort"), False),     # the coordinator aborted our timed-out transaction
    (Holder(7, 4, "PrepareAbort"), False),
    (Holder(7, 4, "Empty"), True),              # another instance claimed the idle id
    (Holder(7, 4, "Ongoing"), True),            # ... and is writing
    (Holder(7, 5, "Empty"), True),              # another claimed it over our open transaction
    (Holder(7, 5, "CompleteAbort"), True),      # ... and its transaction timed out since
    (Holder(8, 0, "Empty"), True),              # a new producer id (epochs ran out)
    (Holder(8, 4, "CompleteAbort"), True),
    (Holder(7, 2, "Empty"), True),              # anything we cannot explain is not ours
])
def test_taken_over(now: Holder | None, expected: bool) -> None:
    assert taken_over(HELD, now) is expected


@given(st.integers(0, 2**63 - 2), st.integers(0, 2**15 - 4), st.integers(0, 1), st.integers(-2, 3),
       st.sampled_from(["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
                        "CompleteAbort", "Dead", "PrepareEpochFence", "", "completeabort"]))
def test_only_our_identity_or_our_timeout_is_not_a_takeover(pid: int, epoch: int, other_pid: int,
                                                          moved: int, state: str) -> None:
    """Around our identity (producer ids up to Kafka's int64, epochs up to its int16): only our
    own epoch, or one more while aborting, is not a takeover."""
    ours = other_pid == 0 and (moved == 0 or (moved == 1 and state in ("PrepareAbort", "CompleteAbort")))
    now = Holder(pid + other_pid, epoch + moved, state)
    assert taken_over(Holder(pid, epoch), now) is not ours
