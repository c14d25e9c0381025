"""Properties of the fold: any split, any snapshot point, same digest; invariants always hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kai_es.events import Record, decode, encode
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.state import ClusterState, digest, fold, restore, snapshot
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
        return p.BindingDecided(**common, node=node, podgroup="g", queue="q0", gpu_devices=devices)
    if kind == "bound":
        return p.PodBound(**common, node=node, decision_id="d", gpu_devices=devices)
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
                              reasons=[p.Reason(code="X", message="m", numbers={"n": draw(st.integers(0, 3))})])


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
        return p.TopologyObserved(name="t", levels=["zone"])
    k = draw(st.sampled_from(["Node", "Pod", "Queue", "PodGroup", "PriorityClass"]))
    return p.ResyncStarted(kind=k) if kind == "resync" else p.ResyncCompleted(kind=k)


@st.composite
def _events(draw: st.DrawFn) -> list[p.Payload]:
    """A cluster (nodes, queues) first, then a random mix weighted towards pod life cycles."""
    setup: list[p.Payload] = [
        p.NodeObserved(name=n, milli_cpu=16000, memory_bytes=2**36, gpus=draw(st.integers(1, 4)),
                       max_pods=8, gpu_memory_mib=40960) for n in NODES]
    setup += [p.QueueObserved(name=q, parent="" if q == "parent" else "parent") for q in QUEUES]
    rest = draw(st.lists(st.one_of(node_observed(), pod_observed(), pod_observed(), pod_observed(),
                                   decision(), decision(), decision(), other()),
                         min_size=1, max_size=60))
    return setup + rest


events = _events()


def records(payloads: list[p.Payload]) -> list[Record]:
    out = []
    for i, payload in enumerate(payloads):
        env = make_envelope(payload, event_id=f"e{i}", source="t", subject="s", logicaltime=10 * i)
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
    import pytest

    with pytest.raises(ValueError, match="not after"):
        fold(recs[:1], state)
