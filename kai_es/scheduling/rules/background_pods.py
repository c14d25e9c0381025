"""Background pods: whether the capacity of running maintenance pods (health checks,
diagnostics, monitoring agents) counts as free when a cycle plans, and which of them are
evicted when a workload is placed over them.

- `NoBackgroundPodsV9` (kai-es/v1 to v9): a background pod is a pod like any other.
- `BackgroundPodsGiveWay` (kai-es/v10 on; KAI's `backgroundpods` plugin, on by default — KAI
  pull request #2108 and its design `docs/developer/designs/background-pods`): the pods that
  match the config's `backgroundPods.labelSelector` (default `kai.scheduler/background=true`)
  and namespaces, that kai-es schedules (`spec.schedulerName`) and that hold a node (Running or
  Binding), are evicted on the cycle's Plan as it opens, before any action. Their capacity is
  then capacity being released: a workload that fits idle capacity is placed there as usual
  (a node without background pods is still preferred), one that needs their room is pipelined
  onto it, and their queues' allocation no longer counts them (fair shares are divided as the
  cycle found the cluster, as KAI's proportion plugin opens before the background one). As the
  cycle closes, every one of them is offered its own place back, node by node in name order and
  on a node by namespace and name: one whose devices and resources are still free once released
  stays and is not disturbed (the eviction is undone); only the rest are evicted for real, with
  action `backgroundpods`, naming the first pod placed on their node as the preemptor. A
  background pod is never moved to another node. A pending background pod is placed on idle
  capacity only, never pipelined: it would take the room of another background pod, whose
  replacement would take its room the next cycle, and so on for ever (seen with a Deployment of
  health checks on a full node; KAI's pull request has no such guard).

  Predicates need no second look when a pod is given its place back: a pod the Plan evicts still
  holds its node for host ports, scalar resources and inter-pod anti-affinity while the cycle
  plans (`predicates.eligibility`), so nothing placed over it can conflict with it — the price,
  as in KAI's first design, is that a workload with anti-affinity to a background pod does not
  see its node as free. Devices are exact: a background pod stays only on the very devices it
  holds.

Contract: pure; `take_out` runs on a Session before its first action and changes only its Plan
(through which the Session's accounting follows), `give_back` after the last action.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

from kai_es.scheduling.plan import Entry, Eviction
from kai_es.scheduling.predicates.selector_text import Requirement, parse_selector, selector_holds

if TYPE_CHECKING:
    from kai_es.scheduling.session import Session
    from kai_es.state.model import ClusterState

#: the action a background pod's eviction is announced with (KAI's plugin name)
ACTION = "backgroundpods"
#: KAI's default selector
DEFAULT_SELECTOR = "kai.scheduler/background=true"


class BackgroundPods(Protocol):
    def take_out(self, session: Session) -> list[Eviction]:
        """Evict the cycle's background pods on the Session's Plan; their evictions."""

    def give_back(self, session: Session, evicted: list[Eviction]) -> None:
        """Give every pod of `evicted` (from `take_out`) its place back where it still fits."""


class NoBackgroundPodsV9:
    __slots__ = ()

    def take_out(self, session: Session) -> list[Eviction]:
        return []

    def give_back(self, session: Session, evicted: list[Eviction]) -> None:
        return None


@lru_cache(maxsize=16)
def _requirements(text: str) -> tuple[Requirement, ...]:
    return parse_selector(text)  # (a config's selector was parsed when it was validated)


def _candidates(state: ClusterState, requirements: tuple[Requirement, ...]) -> list[str]:
    """Keys of the pods that may match, sorted: from the label index when a requirement needs
    its label present (the pods without it cannot match), else every pod."""
    index = state.pods_by_label
    for key, operator, values in requirements:
        if operator in ("NotIn", "DoesNotExist"):
            continue
        by_value = index.get(key, {})
        found: set[str] = set()
        for value, pods in by_value.items():
            if operator != "In" or value in values:
                found |= pods
        return sorted(found)
    return sorted(state.pods)


def background_pods(state: ClusterState, text: str, namespaces: list[str]) -> tuple[list[str], list[str]]:
    """Keys of the background pods kai-es schedules: those that hold a node (Running or
    Binding), which `BackgroundPodsGiveWay` takes out for a cycle, by (namespace, name); and
    those Pending, sorted."""
    requirements = _requirements(text)
    allowed = frozenset(namespaces)
    running: list[str] = []
    pending: list[str] = []
    pods, name = state.pods, state.scheduler_name
    for key in _candidates(state, requirements):
        pod = pods[key]
        spec = pod.spec
        if spec.scheduler_name != name or (allowed and spec.namespace not in allowed):
            continue
        if not selector_holds(requirements, spec.labels):
            continue
        if pod.status in ("Running", "Binding") and pod.node in state.nodes:
            running.append(key)
        elif pod.status == "Pending":
            pending.append(key)
    return sorted(running, key=lambda k: (pods[k].spec.namespace, pods[k].spec.name)), pending


class BackgroundPodsGiveWay:
    __slots__ = ()

    def take_out(self, session: Session) -> list[Eviction]:
        config = session.config
        if config is None or not config.background_pods.enabled:
            return []
        settings = config.background_pods
        plan = session.plan
        running, pending = background_pods(session.state, settings.label_selector, settings.namespaces)
        plan.idle_only = frozenset(pending)
        return [plan.evict(key, ACTION, "", "background pod: its capacity counts as free while the cycle plans")
                for key in running]

    def give_back(self, session: Session, evicted: list[Eviction]) -> None:
        if not evicted:
            return
        plan = session.plan
        arrivals: dict[int, str] = {}
        for op in plan.operations:
            if isinstance(op, Entry):
                arrivals.setdefault(op.node, op.pod_key)
        pods = session.state.pods
        for op in sorted(evicted, key=lambda e: (plan.names[e.node], pods[e.pod_key].spec.namespace,
                                                  pods[e.pod_key].spec.name)):
            if plan.unevict(op):  # its place is still free once released: it stays
                continue
            op.preemptor = arrivals.get(op.node, "")
            op.reason = (f"background pod: evicted to make room for a workload on node {plan.names[op.node]} "
                         f"(first placed there: {op.preemptor})")
