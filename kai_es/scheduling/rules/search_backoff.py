"""Search back-off: whether a job whose victim searches keep failing is searched for again
every cycle (KAI #2301's complaint: the same hopeless search, cycle after cycle).

- `NoSearchBackoffV7` (kai-es/v1 to v7): every cycle searches again for every waiting job.
- `FailedSearchesBackOff` (kai-es/v8 on): a search of reclaim, preempt or consolidation that
  ran and found no room (its reason, `…NotPossible`, carries `search_failures` — the job's
  consecutive failed searches — and `retry_at_ns`) keeps the job out of those actions' searches
  until that time: 1 s after the first failure, doubling with each further one up to 60 s. While
  it waits, an action that gets as far as searching for it repeats what its last search found,
  word for word and number for number, instead of searching; its cheaper refusals (no victim,
  no node with room, a queue over its fair share) are said as before. The reasons' words do not
  change from one failure to the next ("further searches for it back off"), so the pod's
  FailedScheduling Event and condition are written once, not at each retry; the numbers (in the
  log, `kai-es explain`) say how many searches failed and when the next is. The fold keeps the
  two numbers on the job (fold rule `backs_off_searches`) and forgets them once a pod of the job
  is placed; the scheduler wakes at `retry_at_ns`.

Contract: pure functions of the folded job and the cycle's time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from kai_es.state.model import Job

FIRST_BACKOFF_NS: Final = 1_000_000_000
MAX_BACKOFF_NS: Final = 60 * 1_000_000_000


def backoff_ns(failures: int) -> int:
    """How long a job waits after its `failures`-th consecutive failed search (>= 1)."""
    if failures >= 7:  # 2**6 s already exceeds the ceiling
        return MAX_BACKOFF_NS
    return min(FIRST_BACKOFF_NS << max(0, failures - 1), MAX_BACKOFF_NS)


class SearchBackoff(Protocol):
    def waiting_until(self, job: Job, now_ns: int) -> int:
        """When `job` may be searched for again, if later than `now_ns` (else 0)."""

    def after_failure(self, job: Job, now_ns: int) -> dict[str, int]:
        """The numbers a failed search's reason carries (empty: none)."""


class NoSearchBackoffV7:
    __slots__ = ()

    def waiting_until(self, job: Job, now_ns: int) -> int:
        return 0

    def after_failure(self, job: Job, now_ns: int) -> dict[str, int]:
        return {}


class FailedSearchesBackOff:
    __slots__ = ()

    def waiting_until(self, job: Job, now_ns: int) -> int:
        return job.search_retry_ns if job.search_retry_ns > now_ns else 0

    def after_failure(self, job: Job, now_ns: int) -> dict[str, int]:
        failures = job.search_failures + 1
        return {"search_failures": failures, "retry_at_ns": now_ns + backoff_ns(failures)}
