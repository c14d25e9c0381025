"""Whether another instance claimed a Kafka transactional id since this process last held it.

A writer claims its role with InitProducerId, and on Kafka the last claim wins: it fences
every older producer of that transactional id. A process whose producer failed for some other
reason (a broker away, an answer its client does not understand) makes a new producer, and
that claim would fence an instance that took over meanwhile — which then stops, leaving the
role to the instance that should have stopped. So before a claim that follows one of its own,
`KafkaEventLog` asks the transaction coordinator who holds the id now
(`kafka_describe.current_holder`) and compares it with what its last producer held
(`taken_over`). Pure: no I/O, no aiokafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: the coordinator's states in which an epoch one above ours is its own abort of our timed-out
#: transaction (it bumps the epoch as it aborts), not another producer's claim
ABORTING: Final = frozenset({"PrepareAbort", "CompleteAbort"})


@dataclass(frozen=True, slots=True)
class Holder:
    """A producer identity of one transactional id: as a producer held it, or as the
    coordinator holds it now (`state`: the coordinator's transaction state, "" for ours)."""

    producer_id: int
    epoch: int
    state: str = ""


@dataclass(slots=True)
class WriterTenure:
    """What this process's writer last held of a transactional id (`held`, None before its
    first claim). One object lives as long as the process's role, across the logs its
    restarted sessions open, so a later session's claim is checked against it."""

    held: Holder | None = None


def taken_over(held: Holder, now: Holder | None) -> bool:
    """Whether the coordinator's `now` shows a claim by another producer since we held
    `held`. Not a claim: no state at all (the id expired), our own identity, or our epoch plus
    one while the coordinator aborts (or has aborted) our transaction that timed out. Any other
    producer id or epoch is: InitProducerId (another instance's) is the only other thing that
    moves them."""
    if now is None:
        return False
    if now.producer_id != held.producer_id:
        return True
    if now.epoch == held.epoch:
        return False
    return not (now.epoch == held.epoch + 1 and now.state in ABORTING)
