"""Semi-preemptible jobs: `kai.scheduler/preemptibility: semi-preemptible` (a pod's or owner's
label, or the PodGroup's `spec.preemptibility`), after KAI's semi-preemptible design
(docs/developer/designs/semi-preemptible in KAI's repository): a job non-preemptible up to its
minimum shape and preemptible above it.

- `SemiAsPreemptibleV7` (kai-es/v1 to v7): such a job is a preemptible job (KAI up to v0.17
  knows two modes; no log written by those versions has the value).
- `CoreKeptInQuota` (kai-es/v8 on): the job's *core* — the pods it needs to stay at its minimum
  shape — is non-preemptible: counted in its queues' non-preemptible allocation, placed only
  within their quotas, and no victim of reclaim, preempt or consolidation; the pods above it
  are preemptible extras, placed over quota like any preemptible pod (limits hold for all) and
  taken one at a time, in the version's victim order (`rules.victim_order`). A stale gang
  (below its minimum) is still evicted whole by stalegangeviction.

The minimum shape is the job's `minMember` and each leaf sub-group's own `minMember`: a pod
is an extra when the job keeps at least `minMember` occupying pods and its leaf sub-group at
least that sub-group's `minMember` without it (`kai_es.scheduling.gang.surplus`, below the
Session and the victim search, which use it). Whole sub-groups above a
`minSubGroup` are not extras here, unlike the design's tree-level elasticity: KAI's staleness
(`IsStale`, kai-es's `rules.staleness`) calls a gang with any leaf sub-group below its
`minMember` stale, so taking one whole would have the gang evicted as stale; they count in the
core. A job whose total pods equal its minimum is non-preemptible; one with `minMember: 0` and
no sub-group minima is preemptible.

Contract: pure.
"""

from __future__ import annotations

from typing import Protocol


class SemiPreemptible(Protocol):
    #: whether a semi-preemptible job's core is kept (False: it is a plain preemptible job)
    @property
    def keeps_core(self) -> bool: ...


class SemiAsPreemptibleV7:
    __slots__ = ()
    keeps_core = False


class CoreKeptInQuota:
    __slots__ = ()
    keeps_core = True
