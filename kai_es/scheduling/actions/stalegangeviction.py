"""The stalegangeviction action (policy kai-es/v3; KAI's): a running gang below its minimum —
some pods occupying, none succeeded, fewer than its `minMember` occupying (or, by the version's
staleness rule, a leaf sub-group short of its own) — for at least its staleness grace period
(`kai_es.scheduling.rules.staleness`; negative: never) is evicted whole: every pod of it that
is Binding or Running gets an EvictionDecided naming this action and why (the staleness rule
words it).

Contract: jobs in key order; the time the gang went stale comes from the log (the reducer's
`stale_since_ns`, by the rule of the config's policy version), "now" is the cycle's; pods this
cycle's Plan already evicts, or that occupy a node the cluster does not report, are left alone;
a gang the pods placed by this cycle's earlier actions bring back to its minimum is left alone
where the staleness rule says so (`kept_by_plan`, kai-es/v10 on).
Pure: writes only the Session's Plan.
"""

from __future__ import annotations

from kai_es.events.timefmt import format_duration, rfc3339
from kai_es.scheduling.framework import ActionResult
from kai_es.scheduling.plan import Entry
from kai_es.scheduling.rules.staleness import stale_deadline_ns, staleness_grace_ns
from kai_es.scheduling.session import Session

NAME = "stalegangeviction"


class StaleGangEviction:
    def __init__(self, session: Session) -> None:
        self.session = session

    def run(self) -> ActionResult:
        session, state = self.session, self.session.state
        config = session.config
        if config is None:
            return ActionResult()
        plan, now = session.plan, session.now_ns
        staleness = session.rules.staleness
        jobs = state.jobs
        placed = {op.pod_key for op in plan.operations if isinstance(op, Entry)}
        for key in sorted(state.gangs_below_minimum):  # the jobs with stale_since_ns set
            job = jobs[key]
            deadline = stale_deadline_ns(state, config, job)
            if deadline is None or now < deadline:
                continue
            if placed and staleness.kept_by_plan(state, job, placed):
                continue
            grace = staleness_grace_ns(state, config, job)
            pods = [state.pods[k] for k in sorted(job.members)]
            running = [pod for pod in pods if pod.status in ("Binding", "Running") and pod.node in plan.node_index
                       and pod.key not in plan.evicted_pods]
            occupying = sum(1 for pod in pods if pod.status in ("Binding", "Running", "Releasing"))
            why = (f"stale gang: job {job.key} has had {occupying} of the {job.min_member} pods it needs "
                   f"running since {rfc3339(job.stale_since_ns)}, at least its staleness grace period "
                   f"({format_duration(grace)}); all its running pods are evicted")
            numbers = {"occupying": occupying, "min_member": job.min_member,
                       "stale_since_ns": job.stale_since_ns, "grace_period_ns": grace}
            why, numbers = staleness.reason(job, occupying, grace, why, numbers)
            for pod in running:
                plan.evict(pod.key, NAME, "", why, numbers)
        return ActionResult()
