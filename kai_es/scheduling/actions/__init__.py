"""The scheduling actions: allocate, consolidation, reclaim, preempt, stalegangeviction. Each is
a function of the Session that composes the policy version's rules (`kai_es.scheduling.rules`)
and returns an action result; the registry (`kai_es.scheduling.policy`) says which a version
runs."""
