"""Room held for a moved pod's replacement (policy kai-es/v8, fold rule `holds_moves`).

A consolidation move is an eviction with a destination (EvictionDecided `to_node`): the pod is
evicted and its controller creates another in its place. The room the move found on `to_node`
is held for that pod (`ClusterState.move_holds`, keyed by the moved pod's owner):
- a move decided under a version whose fold rules hold moves adds a hold (a pod without an
  owner has no replacement to wait for: none);
- a new Pending, unbound pod of that owner with the same requests takes the first live hold
  (decision order) and is nominated to its node (`PodState.nominated_node`), where allocate
  places nominated pods before anyone else;
- a hold is live for `MOVE_HOLD_NS` after its decision; cycles drop the expired ones;
- (kai-es/v11 on) a failed eviction of the moved pod drops its holds (`release_holds`).
The scheduler keeps the live holds' room used until they are taken
(`rules.move_holds.HoldMovedRoom`).

Part of the reducer (`kai_es.state.reducer`, whose contract holds for every handler here)."""

from __future__ import annotations

from kai_es.events import payloads as p
from kai_es.state.model import ClusterState, MoveHold, PodState


def owner_key(namespace: str, owner: p.OwnerRef) -> str:
    return f"{namespace}/{owner.kind}/{owner.name}"


def add_hold(state: ClusterState, pod: PodState, node: str, now_ns: int) -> None:
    """Hold room on `node` for the replacement of `pod`, moved there at `now_ns`."""
    spec = pod.spec
    if spec.owner is None:
        return
    key = owner_key(spec.namespace, spec.owner)
    hold = MoveHold(pod=pod.key, node=node, requests=spec.requests, gpu=spec.gpu,
                    scalar_requests=spec.scalar_requests, decided_ns=now_ns)
    state.move_holds.setdefault(key, []).append(hold)
    state.stale_move_holds.add(key)


def claim_hold(state: ClusterState, pod: PodState, now_ns: int) -> None:
    """A new pod: when it is Pending, unbound, and its owner has a live hold for its requests,
    it takes that hold and is nominated to its node."""
    spec = pod.spec
    if spec.owner is None or spec.phase != "Pending" or spec.node_name or spec.terminating:
        return
    key = owner_key(spec.namespace, spec.owner)
    holds = state.move_holds.get(key)
    if not holds:
        return
    for i, hold in enumerate(holds):
        if hold.live(now_ns) and hold.requests == spec.requests and hold.gpu == spec.gpu \
                and hold.scalar_requests == spec.scalar_requests:
            pod.nominated_node = hold.node
            state.nominated.add(pod.key)
            del holds[i]
            if not holds:
                del state.move_holds[key]
            state.stale_move_holds.add(key)
            return


def release_holds(state: ClusterState, pod: PodState) -> None:
    """The eviction of `pod` failed (it runs where it was): the holds its moves made wait for a
    replacement that will not come; drop them (kai-es/v11 on: fold rule
    `releases_failed_moves`). A move decided again holds its room anew."""
    spec = pod.spec
    if spec.owner is None:
        return
    key = owner_key(spec.namespace, spec.owner)
    holds = state.move_holds.get(key)
    if not holds:
        return
    _keep(state, key, [h for h in holds if h.pod != pod.key])


def drop_expired(state: ClusterState, now_ns: int) -> None:
    """Forget the holds no longer live at `now_ns`."""
    for key in sorted(state.move_holds):
        _keep(state, key, [h for h in state.move_holds[key] if h.live(now_ns)])


def _keep(state: ClusterState, key: str, kept: list[MoveHold]) -> None:
    """Owner `key`'s holds become `kept` (a sublist of them); a change marks them for the digest."""
    if len(kept) != len(state.move_holds[key]):
        state.stale_move_holds.add(key)
        if kept:
            state.move_holds[key] = kept
        else:
            del state.move_holds[key]
