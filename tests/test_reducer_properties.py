"""Properties of the fold: any split, any snapshot point, same digest; invariants always hold;
the incremental digest always equals its recomputation from scratch."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_es.events import Record, decode, encode
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.scheduling.policy import CURRENT_POLICY
from kai_es.state import ClusterState, digest, fold, restore, snapshot
from kai_es.state import reducer
from kai_es.state.incremental_digest import STALE_SETS, incremental_digest, recomputed_digest
from kai_es.state.invariants import check
from kai_es.state.snapshot import load_snapshot, snapshot_bytes

NODES = ["n0", "n1", "n2"]
PODS = ["p0", "p1", "p2", "p3"]
QUEUES = ["q0", "q1", "parent"]
GROUPS = ["g0", "g1"]

gpu_requests = st.one_of(
    st.just(p.GpuRequest()),
    st.builds(lambda n: p.GpuRequest(whole=n), st.integers(1, 3)),
    st.builds(lambda f, d: p.GpuRequest(fraction_milli=f, fraction_devices=d),
              st.sampled_from([250, 500, 700]), st.integers(1, 2)),
    st.builds(lambda m: p.GpuRequest(gpu_memory_mib=m), st.sampled_from([4096, 20000])),
)


@st.composite
def node_observed(draw: st.DrawFn) -> p.Payload:
    return p.NodeObserved(name=draw(st.sampled_from(NODES)), milli_cpu=draw(st.sampled_from([4000, 16000])),
                          memory_bytes=2**34, gpus=draw(st.integers(0, 4)), max_pods=draw(st.integers(1, 8)),
                          gpu_memory_mib=draw(st.sampled_from([0, 40960])),
                          unschedulable=draw(st.booleans()))


@st.composite
def pod_observed(draw: st.DrawFn) -> p.Payload:
    name = draw(st.sampled_from(PODS))
    running = draw(st.booleans())
    implicit = draw(st.booleans())
    return p.PodObserved(
        namespace="default", name=name, uid=f"{name}-u{draw(st.sampled_from([0, 0, 0, 1]))}",
        scheduler_name=draw(st.sampled_from(["kai-scheduler", "kai-scheduler", "default-scheduler"])),
        phase=draw(st.sampled_from(["Running", "Succeeded"])) if running else draw(st.sampled_from(["Pending", "Failed"])),
        node_name=draw(st.sampled_from(NODES)) if running else "",
        terminating=draw(st.booleans()) and draw(st.booleans()),
        queue=draw(st.sampled_from(QUEUES + [""])),
        podgroup=f"pg-{name}" if implicit else draw(st.sampled_from(GROUPS)),
        implicit_podgroup=implicit, priority_class=draw(st.sampled_from(["", "train", "inference", "custom"])),
        requests=p.PodResources(milli_cpu=draw(st.sampled_from([0, 1000, 3000])), memory_bytes=2**30),
        gpu=draw(gpu_requests), gpu_group=draw(st.sampled_from(["", "grp-a"])),
        task_priority=draw(st.integers(0, 2)), created_ns=draw(st.integers(0, 5)))


def _pod_ref(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(st.sampled_from(PODS))
    return name, f"{name}-u{draw(st.sampled_from([0, 0, 0, 1]))}"


@st.composite
def decision(draw: st.DrawFn) -> p.Payload:
    name, uid = _pod_ref(draw)
    kind = draw(st.sampled_from(["bind", "bound", "failed", "final", "evict", "evicted", "evictfailed", "unsched",
                                 "pipelined"]))
    node = draw(st.sampled_from(NODES))
    devices = draw(st.lists(st.integers(0, 3), max_size=3, unique=True))
    common = dict(namespace="default", name=name, uid=uid)
    if kind == "bind":
        return p.BindingDecided(**common, node=node, podgroup="g", queue="q0", gpu_devices=tuple(devices))
    if kind == "bound":
        return p.PodBound(**common, node=node, decision_id="d", gpu_devices=tuple(devices))
    if kind == "failed":
        return p.PodBindFailed(**common, node=node, decision_id="d", message="no")
    if kind == "final":
        return p.PodBindFailed(**common, node=node, decision_id="d", message="never", final=True)
    if kind == "evict":
        return p.EvictionDecided(**common, node=node, podgroup="g", queue="q0", action="reclaim", reason="r")
    if kind == "evicted":
        return p.PodEvicted(**common, node=node, decision_id="d")
    if kind == "evictfailed":  # names the pod's eviction decision when the record before decided it
        return p.PodEvictionFailed(**common, node=node, decision_id=f"e{draw(st.integers(0, 80))}",
                                   message="refused", retryable=draw(st.booleans()))
    if kind == "pipelined":
        return p.PodPipelined(**common, node=node, podgroup="g", queue="q0")
    return p.PodUnschedulable(**common, podgroup="g", queue="q0",
                              reasons=(p.Reason(code="X", message="m", numbers={"n": draw(st.integers(0, 3))}),))


DECISIONS = (p.BindingDecided, p.PodBound, p.PodBindFailed, p.EvictionDecided, p.PodEvicted, p.PodEvictionFailed,
             p.PodPipelined, p.PodUnschedulable)


@st.composite
def other(draw: st.DrawFn) -> p.Payload:
    kind = draw(st.sampled_from(["queue", "queue-rm", "pg", "pg-rm", "pc", "pc-rm", "node-rm", "pod-rm",
                                 "resync", "resync-done", "topo"]))
    if kind == "queue":
        name = draw(st.sampled_from(QUEUES))
        return p.QueueObserved(name=name, parent="" if name == "parent" else draw(st.sampled_from(["", "parent"])),
                               gpu=p.QueueResource(quota=draw(st.sampled_from([-1, 0, 2000]))))
    if kind == "queue-rm":
        return p.QueueRemoved(name=draw(st.sampled_from(QUEUES)))
    if kind == "pg":
        return p.PodGroupObserved(namespace="default", name=draw(st.sampled_from(GROUPS)),
                                  queue=draw(st.sampled_from(QUEUES)), min_member=draw(st.integers(0, 3)),
                                  priority_class=draw(st.sampled_from(["", "build"])), created_ns=draw(st.integers(0, 3)))
    if kind == "pg-rm":
        return p.PodGroupRemoved(namespace="default", name=draw(st.sampled_from(GROUPS)))
    if kind == "pc":
        return p.PriorityClassObserved(name=draw(st.sampled_from(["custom", "train"])), value=draw(st.integers(0, 200)))
    if kind == "pc-rm":
        return p.PriorityClassRemoved(name=draw(st.sampled_from(["custom", "train"])))
    if kind == "node-rm":
        return p.NodeRemoved(name=draw(st.sampled_from(NODES)))
    if kind == "pod-rm":
        name, uid = _pod_ref(draw)
        return p.PodRemoved(namespace="default", name=name, uid=draw(st.sampled_from([uid, ""])))
    if kind == "topo":
        return p.TopologyObserved(name="t", levels=("zone",))
    k = draw(st.sampled_from(["Node", "Pod", "Queue", "PodGroup", "PriorityClass"]))
    return p.ResyncStarted(kind=k) if kind == "resync" else p.ResyncCompleted(kind=k)


@st.composite
def _events(draw: st.DrawFn) -> list[p.Payload]:
    """The current policy's config or v15's (the same fold, its digest hashing pod specs in the
    order before v16: `kai_es.state.legacy_spec_form`), a cluster (nodes, queues), then a random
    mix weighted towards pod life cycles, where the config may switch to the other of the two.
    (A log written before a version folds by that version's rules, which golden logs pin; a
    state of an older version can break an invariant a newer one fixed: under kai-es/v14 a pod
    deleted while its bind was in flight became pending again when the bind failed, which no
    state restored from a snapshot has.)"""
    versions = draw(st.permutations([CURRENT_POLICY, "kai-es/v15"]))
    setup: list[p.Payload] = [p.ConfigApplied(config_digest="properties", config={"policyVersion": versions[0]})]
    setup += [
        p.NodeObserved(name=n, milli_cpu=16000, memory_bytes=2**36, gpus=draw(st.integers(1, 4)),
                       max_pods=8, gpu_memory_mib=40960) for n in NODES]
    setup += [p.QueueObserved(name=q, parent="" if q == "parent" else "parent") for q in QUEUES]
    rest = draw(st.lists(st.one_of(node_observed(), pod_observed(), pod_observed(), pod_observed(),
                                   decision(), decision(), decision(), other()),
                         min_size=1, max_size=60))
    # a decision drawn on its own names a pod that exists and waits only by chance: about half
    # of them are made about the pod last observed Pending (its name and uid), as a scheduler's are
    out: list[p.Payload] = []
    waiting: tuple[str, str] | None = None
    for payload in rest:
        if isinstance(payload, p.PodObserved) and payload.phase == "Pending":
            waiting = (payload.name, payload.uid)
        elif waiting is not None and isinstance(payload, DECISIONS) and draw(st.booleans()):
            payload = msgspec.structs.replace(payload, name=waiting[0], uid=waiting[1])
        out.append(payload)
    switch = draw(st.none() | st.integers(0, len(out)))
    if switch is not None:  # every pod's hash changes form: the next digest re-hashes them all
        out.insert(switch, p.ConfigApplied(config_digest="switched", config={"policyVersion": versions[1]}))
    return setup + out


events = _events()


def records(payloads: list[p.Payload]) -> list[Record]:
    out = []
    for i, payload in enumerate(payloads):
        version = VERSIONED.get(id(payload))
        if version is None and isinstance(payload, p.PodPipelined) and payload.node == NODES[-1]:
            version = "kai-es/v14"  # (decided under a version whose pipelining nominates the pod)
        env = make_envelope(payload, event_id=f"e{i}", source="t", subject="s", logicaltime=10 * i,
                            policyversion=version)
        out.append(Record(i * 2 + 1, decode(encode(env))))  # sparse positions, like Kafka
    return out


@given(events, st.data())
def test_fold_in_any_split_gives_the_same_digest(payloads: list[p.Payload], data: st.DataObject) -> None:
    recs = records(payloads)
    whole = digest(fold(recs))
    cut = data.draw(st.integers(0, len(recs)))
    state = fold(recs[:cut])
    fold(recs[cut:], state)
    assert digest(state) == whole


@given(events, st.data())
def test_fold_from_a_snapshot_gives_the_same_digest(payloads: list[p.Payload], data: st.DataObject) -> None:
    recs = records(payloads)
    whole = digest(fold(recs))
    cut = data.draw(st.integers(0, len(recs)))
    prefix = fold(recs[:cut])
    restored = restore(load_snapshot(snapshot_bytes(prefix)))
    assert digest(restored) == digest(prefix)
    fold(recs[cut:], restored)
    assert digest(restored) == whole


@given(events)
def test_restoring_a_snapshot_at_every_cut_then_folding_the_rest_gives_the_same_digest(
        payloads: list[p.Payload]) -> None:
    """The snapshot carries everything the fold needs: at every cut, a state restored from the
    snapshot bytes of the prefix's state and folded over the rest ends at the one-fold digest.
    (A snapshot that dropped an index, a counter or a pending decision diverges at some cut.)"""
    recs = records(payloads)
    whole = digest(fold(recs))
    state = ClusterState()
    for cut in range(len(recs) + 1):
        restored = restore(load_snapshot(snapshot_bytes(state)))
        assert digest(restored) == digest(state), f"snapshot at cut {cut} does not restore the state"
        fold(recs[cut:], restored)
        assert digest(restored) == whole, f"restored at cut {cut}, folding the rest diverges"
        if cut < len(recs):
            fold([recs[cut]], state)


@given(events)
def test_invariants_hold_for_any_event_sequence(payloads: list[p.Payload]) -> None:
    # observed reality may over-commit (another scheduler did it); consistency must always hold
    state = ClusterState()
    for record in records(payloads):
        fold([record], state)
        assert check(state, strict=False) == []


@given(events)
def test_snapshot_is_canonical(payloads: list[p.Payload]) -> None:
    state = fold(records(payloads))
    assert snapshot(restore(snapshot(state))) == snapshot(state)


def test_digest_changes_with_content() -> None:
    recs = records([p.NodeObserved(name="n0", milli_cpu=1000, memory_bytes=1, gpus=1)])
    a = digest(fold(recs))
    b = digest(fold(records([p.NodeObserved(name="n0", milli_cpu=2000, memory_bytes=1, gpus=1)])))
    assert a != b and a.startswith("sha256:")


def test_out_of_order_positions_are_refused() -> None:
    recs = records([p.NodeRemoved(name="a"), p.NodeRemoved(name="b")])
    state = fold(recs)
    with pytest.raises(ValueError, match="not after"):
        fold(recs[:1], state)


# --- the incremental digest (policy kai-es/v2) -------------------------------------------------


def first_digest_mismatch(payloads: list[p.Payload]) -> int | None:
    """Fold `payloads` one by one; the index of the first event after which the incremental
    digest differs from its recomputation from scratch (None: never)."""
    state = ClusterState()
    for i, record in enumerate(records(payloads)):
        fold([record], state)
        if incremental_digest(state) != recomputed_digest(state):
            return i
    return None


@given(events)
def test_incremental_digest_equals_a_recomputation_after_every_event(payloads: list[p.Payload]) -> None:
    assert first_digest_mismatch(payloads) is None


@given(events, st.data())
def test_incremental_digest_of_a_restored_state_equals_a_full_fold(payloads: list[p.Payload],
                                                                     data: st.DataObject) -> None:
    recs = records(payloads)
    whole = fold(recs)
    cut = data.draw(st.integers(0, len(recs)))
    prefix = fold(recs[:cut])
    restored = restore(load_snapshot(snapshot_bytes(prefix)))
    assert incremental_digest(restored) == incremental_digest(prefix) == recomputed_digest(prefix)
    fold(recs[cut:], restored)
    assert incremental_digest(restored) == incremental_digest(whole) == recomputed_digest(whole)


@given(events, events)
def test_different_states_have_different_incremental_digests(a: list[p.Payload], b: list[p.Payload]) -> None:
    sa, sb = fold(records(a)), fold(records(b))
    same = snapshot_bytes(sa) == snapshot_bytes(sb)
    assert (incremental_digest(sa) == incremental_digest(sb)) == same


def test_different_states_have_different_incremental_digests_for_one_field() -> None:
    def state(cpu: int, unschedulable: str) -> ClusterState:
        pod = p.PodObserved(namespace="default", name="p0", uid="u", podgroup="g", queue="q0")
        return fold(records([p.NodeObserved(name="n0", milli_cpu=cpu, memory_bytes=1, gpus=1), pod,
                             p.PodUnschedulable(namespace="default", name="p0", uid="u", podgroup="g",
                                                queue="q0", reasons=(p.Reason(code=unschedulable, message=""),))]))

    digests = {incremental_digest(state(cpu, code)) for cpu in (1000, 2000) for code in ("A", "B")}
    assert len(digests) == 4 and all(d.startswith("mset-sha256:") for d in digests)


def _pod(name: str, **kw: object) -> p.PodObserved:
    values = {"namespace": "default", "name": name, "uid": f"{name}-u", "podgroup": "g", "queue": "q0", **kw}
    return p.PodObserved(**values)  # type: ignore[arg-type]


def _ref(name: str, uid: str = "") -> dict[str, str]:
    return {"namespace": "default", "name": name, "uid": uid or f"{name}-u"}


def _resync(kind: str, *observed: p.Payload) -> list[p.Payload]:
    return [p.ResyncStarted(kind=kind), *observed, p.ResyncCompleted(kind=kind)]


#: every handler, each on a path where it changes something (so every kind of entity changes)
SCRIPT: list[p.Payload] = [
    p.NodeObserved(name="n0", milli_cpu=16000, memory_bytes=2**36, gpus=2, gpu_memory_mib=40960),
    p.QueueObserved(name="parent"),
    p.QueueObserved(name="q0", parent="parent"),
    p.PriorityClassObserved(name="custom", value=7),
    p.TopologyObserved(name="t", levels=("zone",)),
    p.ResyncStarted(kind="Pod"),
    _pod("p0", priority_class="custom", gpu=p.GpuRequest(whole=1)),
    _pod("p1", gpu=p.GpuRequest(fraction_milli=500), gpu_group="grp"),
    p.BindingDecided(**_ref("p1"), node="n0", podgroup="g", queue="q0", gpu_devices=(1,), gpu_groups=("grp",)),
    p.PodUnschedulable(**_ref("p0"), podgroup="g", queue="q0", reasons=(p.Reason(code="X", message="m"),)),
    p.PodPipelined(**_ref("p0"), node="n0", podgroup="g", queue="q0"),
    p.PodBound(**_ref("p1"), node="n0", decision_id="d", gpu_devices=(1,)),
    _pod("p2", phase="Running", node_name="n1", gpu=p.GpuRequest(whole=1)),
    p.NodeObserved(name="n1", milli_cpu=16000, memory_bytes=2**36, gpus=1),
    p.QueueObserved(name="q1", parent="parent"),
    _pod("p3", phase="Running", node_name="n1", queue="q1", podgroup="pg-p3", implicit_podgroup=True),
    p.QueueRemoved(name="q1"),
    p.QueueObserved(name="q1", parent="parent"),
    p.EvictionDecided(**_ref("p2"), node="n1", podgroup="g", queue="q0", action="reclaim", reason="r"),
    p.PodEvicted(**_ref("p1"), node="n0", decision_id="d"),
    _pod("p2", phase="Succeeded", node_name="n1", gpu=p.GpuRequest(whole=1)),
    p.PodGroupObserved(namespace="default", name="g", queue="q0", min_member=2, priority_class="build"),
    _pod("p0", priority_class="custom", gpu=p.GpuRequest(whole=1), task_priority=2),
    _pod("p0", priority_class="custom", gpu=p.GpuRequest(whole=2)),
    p.BindingDecided(**_ref("p0"), node="n0", podgroup="g", queue="q0", gpu_devices=(0,)),
    p.PodBindFailed(**_ref("p0"), node="n0", decision_id="d", message="no"),
    p.PodGroupRemoved(namespace="default", name="g"),
    p.PriorityClassObserved(name="custom", value=9),
    p.PriorityClassRemoved(name="custom"),
    p.NodeObserved(name="n0", milli_cpu=16000, memory_bytes=2**36, gpus=4, gpu_memory_mib=40960),
    p.NodeObserved(name="n0", milli_cpu=16000, memory_bytes=2**36, gpus=4, gpu_memory_mib=40960,
                   unschedulable=True),
    p.NodeRemoved(name="n1"),
    p.PodRemoved(**_ref("p3")),
    p.TopologyRemoved(name="t"),
    _pod("p1", phase="Running", node_name="n0", terminating=True, gpu=p.GpuRequest(fraction_milli=500),
         gpu_group="grp"),
    _pod("p0", uid="p0-v2"),
    p.ResyncCompleted(kind="Pod"),
    *_resync("Node", p.NodeObserved(name="n0", milli_cpu=8000, memory_bytes=2**36, gpus=1)),
    p.PodGroupObserved(namespace="default", name="g2", queue="q0"),
    *_resync("PodGroup"),
    p.PriorityClassObserved(name="x", value=1),
    *_resync("PriorityClass"),
    p.TopologyObserved(name="t2", levels=("rack",)),
    *_resync("Topology"),
    *_resync("Queue", p.QueueObserved(name="q0")),
    p.ObjectRejected(kind="Pod", reason="bad"),
    p.ConfigApplied(config_digest="sha256:0", config={"a": 1}),
    p.CycleStarted(cycle=1, config_digest="sha256:0"),
    p.CycleCompleted(cycle=1, decisions=0),
    _pod("p5", phase="Failed"),
    p.PodRemoved(**_ref("nobody")),
    # paths where one mark alone records the change
    p.QueueObserved(name="q1"),
    _pod("p6", podgroup="g3"),
    _pod("p7", podgroup="g3"),
    _pod("p7", podgroup="g3", task_priority=5),  # only the job's pending order changes
    _pod("p8", podgroup="g3", scheduler_name="other"),  # a member that is never pending here
    _pod("p8", podgroup="g3", scheduler_name="other", phase="Running", node_name="n0"),  # occupying
    p.PodGroupObserved(namespace="default", name="g3", queue="q0", min_member=1),  # the spec only
    p.PodGroupObserved(namespace="default", name="g3", queue="q0", min_member=3),
    p.PodGroupRemoved(namespace="default", name="g3"),
    p.PodGroupObserved(namespace="default", name="g3", queue="q0", min_member=1),
    *_resync("PodGroup"),
    _pod("p9", podgroup="pg-p9", implicit_podgroup=True),
    _pod("p9", podgroup="pg-p9", implicit_podgroup=True, queue="q1"),  # the job's queue only
    p.PodRemoved(**_ref("p9")),  # a pending pod
    p.NodeObserved(name="n2", milli_cpu=16000, memory_bytes=2**36, gpus=2),
    _pod("p10", podgroup="pg-p10", implicit_podgroup=True, phase="Running", node_name="n2",
         gpu=p.GpuRequest(whole=1)),
    p.NodeRemoved(name="n2"),  # p10 keeps its devices but no longer their milli-GPU
    _pod("p11", podgroup="pg-p11", implicit_podgroup=True),
    p.BindingDecided(**_ref("p11"), node="n0", podgroup="pg-p11", queue="q0"),
    p.PodBindFailed(**_ref("p11"), node="n0", decision_id="d", message="no"),
    _pod("p11", podgroup="pg-p11", implicit_podgroup=True, phase="Running", node_name="n0"),
    p.PodBound(**_ref("p11"), node="n0", decision_id="d"),  # clears the bind failures only
    _pod("p13", podgroup="g4"),
    _pod("p90", podgroup="g4", scheduler_name="other"),
    _pod("p90", podgroup="g3", scheduler_name="other"),  # moves job: both jobs' members only
    p.PodRemoved(**_ref("p90")),  # leaves g3: its members only
    p.NamespaceObserved(name="default", labels={"team": "a"}),
    p.NamespaceObserved(name="other"),
    p.NamespaceRemoved(name="other"),
    p.ClaimObserved(namespace="default", name="c0"),
    p.ClaimObserved(namespace="default", name="c0", phase="Bound", volume="v0"),
    p.ClaimObserved(namespace="default", name="c1"),
    p.ClaimRemoved(namespace="default", name="c1"),
    p.VolumeObserved(name="v0"),
    p.VolumeObserved(name="v1"),
    p.VolumeRemoved(name="v1"),
    p.ConfigMapObserved(namespace="default", name="cm0"),
    p.ConfigMapObserved(namespace="default", name="cm1"),
    p.ConfigMapRemoved(namespace="default", name="cm1"),
    *_resync("Namespace"),
    *_resync("PersistentVolumeClaim"),
    *_resync("PersistentVolume"),
    *_resync("ConfigMap"),
]
_EVICTION = len(SCRIPT)  # `records` gives the event at index i the id f"e{i}"
SCRIPT += [
    p.EvictionDecided(**_ref("p11"), node="n0", podgroup="pg-p11", queue="q0", action="reclaim", reason="r"),
    p.PodEvictionFailed(**_ref("p11"), node="n0", decision_id=f"e{_EVICTION}", message="no"),  # Running again
    _pod("p14", podgroup="pg-p14", implicit_podgroup=True),
    p.BindingDecided(**_ref("p14"), node="n0", podgroup="pg-p14", queue="q0"),
    p.PodBindFailed(**_ref("p14"), node="n0", decision_id="d", message="no", final=True),
    _pod("p14", podgroup="pg-p14", implicit_podgroup=True, task_priority=1),  # clears the final verdict
]
_OWNER = p.OwnerRef(kind="ReplicaSet", name="rs", uid="rs-u")
_MOVE = p.EvictionDecided(**_ref("p15"), node="n0", podgroup="pg-p15", queue="q0", action="consolidation",
                          reason="moved", to_node="n1")
#: decisions `records` stamps with a policy version (id -> version): a move under kai-es/v8 holds
#: room for the moved pod's replacement (`ClusterState.move_holds`)
VERSIONED: dict[int, str] = {id(_MOVE): "kai-es/v8"}
SCRIPT += [
    _pod("p15", podgroup="pg-p15", implicit_podgroup=True, node_name="n0", phase="Running", owner=_OWNER),
    _MOVE,  # a hold for rs's next pod
    _pod("p16", podgroup="pg-p16", implicit_podgroup=True, owner=_OWNER),  # takes it: nominated to n1
    _MOVE,  # p15 is Releasing already: ignored
]


def _dropping(kind: str) -> Callable[[], None]:
    """A reducer that forgets to mark entities of `kind` (a planted bug); returns the undo."""
    originals = dict(reducer.HANDLERS)

    def wrap(handler: reducer.Handler) -> reducer.Handler:
        def forgetful(state: ClusterState, env: object) -> None:
            handler(state, env)  # type: ignore[arg-type]
            getattr(state, kind).clear()
        return forgetful

    for t, handler in originals.items():
        reducer.HANDLERS[t] = wrap(handler)  # type: ignore[index]
    return lambda: reducer.HANDLERS.update(originals)


def test_every_handler_keeps_the_incremental_digest_exact() -> None:
    assert first_digest_mismatch(SCRIPT) is None


@pytest.mark.parametrize("kind", STALE_SETS)
def test_a_forgotten_mark_is_caught(kind: str) -> None:
    undo = _dropping(kind)
    try:
        assert first_digest_mismatch(SCRIPT) is not None
    finally:
        undo()


def test_a_forgotten_mark_in_one_handler_is_caught() -> None:
    """The planted bug is narrow: only PodUnschedulable forgets its pod (event 9 of the script)."""
    original = reducer.HANDLERS[p.PodUnschedulable]

    def forgetful(state: ClusterState, env: object) -> None:
        original(state, env)  # type: ignore[arg-type]
        state.stale_pods.clear()

    reducer.HANDLERS[p.PodUnschedulable] = forgetful
    try:
        assert first_digest_mismatch(SCRIPT) == 9
    finally:
        reducer.HANDLERS[p.PodUnschedulable] = original


def test_marks_of_removed_pods_do_not_pile_up_without_a_digest() -> None:
    """A fold that never asks for the incremental digest (a kai-es/v1 log) keeps the stale sets
    bounded by the live state, and the digest is still right when finally asked."""
    churn: list[p.Payload] = []
    for i in range(6000):
        churn += [_pod(f"c{i}", podgroup=f"pg-c{i}", implicit_podgroup=True), p.PodRemoved(**_ref(f"c{i}"))]
    state = fold(records([p.QueueObserved(name="q0"), *churn, _pod("last")]))
    assert len(state.stale_pods) + len(state.stale_jobs) <= 2 * 4096
    assert incremental_digest(state) == recomputed_digest(state)


def test_the_nominated_pod_index_follows_every_way_a_nomination_comes_and_goes() -> None:
    """`ClusterState.nominated` (the pods allocate tries first) equals the pods with a nominated
    node after every record: nominated by a pipelining decision of a nominating version and by
    a move hold (the script's kai-es/v8 move), cleared by binding, by removal, by a pod's finish
    and by a new incarnation; restored from a snapshot alike (`invariants.check`)."""
    nominating = [
        p.QueueObserved(name="q0"),
        _pod("na", podgroup="pg-na", implicit_podgroup=True),
        p.PodPipelined(**_ref("na"), node="n2", podgroup="pg-na", queue="q0"),  # nominated
        _pod("nb", podgroup="pg-nb", implicit_podgroup=True),
        p.PodPipelined(**_ref("nb"), node="n2", podgroup="pg-nb", queue="q0"),
        p.PodRemoved(**_ref("nb")),  # gone with its nomination
        _pod("nc", podgroup="pg-nc", implicit_podgroup=True),
        p.PodPipelined(**_ref("nc"), node="n2", podgroup="pg-nc", queue="q0"),
        _pod("nc", uid="nc-u2", podgroup="pg-nc", implicit_podgroup=True),  # a new incarnation: not nominated
        _pod("nd", podgroup="pg-nd", implicit_podgroup=True),
        p.PodPipelined(**_ref("nd"), node="n2", podgroup="pg-nd", queue="q0"),
        _pod("nd", podgroup="pg-nd", implicit_podgroup=True, phase="Failed"),  # finished
        _pod("na", podgroup="pg-na", implicit_podgroup=True, node_name="n2", phase="Running"),  # bound
    ]
    state = ClusterState()
    seen: set[str] = set()
    for record in records([*SCRIPT, *nominating]):
        fold([record], state)
        assert check(state, strict=False) == []
        seen |= state.nominated
    assert {"default/na", "default/nb", "default/nc", "default/nd", "default/p16"} <= seen
    assert state.nominated == {"default/p16"}  # (still waiting for the room held for it)
