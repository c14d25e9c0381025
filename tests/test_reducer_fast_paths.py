"""The reducer's shortcuts and the facts they rely on.

- `refresh_job` scans a job's members for occupying pods only when `job.occupying` says there
  are some, so `job.occupying` must always count exactly the members that occupy.
- Re-observing a pod builds its job key only when its namespace or podgroup changed, so
  `pod.job_key` must always be the key of `pod.spec`'s namespace and podgroup.
- An observation that changes nothing about a pod's job, shape or placement (its phase, say)
  touches neither the node nor the indexes.
"""

from __future__ import annotations

from hypothesis import given

from kai_es.events import payloads as p
from kai_es.state import ClusterState, fold
from kai_es.state.model import OCCUPYING
from kai_es.state.reducer import pod_key
from tests.test_reducer_properties import events, records


def _occupying_members(state: ClusterState, job_key: str) -> int:
    return sum(1 for m in state.jobs[job_key].members if state.pods[m].status in OCCUPYING)


@given(events)
def test_the_facts_the_shortcuts_rely_on_hold_after_every_event(payloads: list[p.Payload]) -> None:
    state = ClusterState()
    for record in records(payloads):
        fold([record], state)
        for key, job in state.jobs.items():
            assert job.occupying == _occupying_members(state, key), key
        for key, pod in state.pods.items():
            assert pod.job_key == pod_key(pod.spec.namespace, pod.spec.podgroup), key


NODE = p.NodeObserved(name="n0", milli_cpu=16000, memory_bytes=2**36, gpus=4, gpu_memory_mib=40960)


def _pod(**changes: object) -> p.PodObserved:
    fields: dict[str, object] = dict(namespace="default", name="p0", uid="u0", queue="q0", podgroup="g0",
                                     requests=p.PodResources(milli_cpu=1000, memory_bytes=2**30),
                                     gpu=p.GpuRequest(whole=1), created_ns=1)
    fields.update(changes)
    return p.PodObserved(**fields)  # type: ignore[arg-type]


def _running(**changes: object) -> list[p.Payload]:
    pod = _pod(**changes)
    return [NODE, p.QueueObserved(name="q0"), p.QueueObserved(name="q1"), pod,
            p.BindingDecided(namespace=pod.namespace, name=pod.name, uid="u0", node="n0",
                             podgroup=pod.podgroup, queue="q0", gpu_devices=(2,)),
            p.PodBound(namespace=pod.namespace, name=pod.name, uid="u0", node="n0", decision_id="d",
                       gpu_devices=(2,))]


def test_a_phase_only_observation_leaves_node_and_indexes_alone() -> None:
    recs = records(_running() + [_pod(phase="Running", node_name="n0", gpu_devices=(2,))] * 2)
    state = fold(recs[:-1])
    state.dirty_nodes.clear()
    fold(recs[-1:], state)
    assert state.dirty_nodes == set()  # not re-seated: its node's usage was not touched
    assert state.pods["default/p0"].status == "Running" and state.pods["default/p0"].devices == (2,)
    assert state.nodes["n0"].device_used == [0, 0, 1000, 0]
    assert state.pending_jobs == {} and state.jobs["default/g0"].occupying == 1


def test_the_same_job_key_from_another_split_of_namespace_and_podgroup_is_no_move() -> None:
    # "a" + "b/g" and "a/b" + "g" name the same job: the pod stays put, as it always did
    first = dict(namespace="a", name="b/p0", podgroup="b/g")
    recs = records(_running(**first) + [_pod(namespace="a/b", name="p0", podgroup="g", phase="Running",
                                             node_name="n0", gpu_devices=(2,))])
    state = fold(recs[:-1])
    state.dirty_nodes.clear()
    fold(recs[-1:], state)
    pod = state.pods["a/b/p0"]
    assert pod.job_key == "a/b/g" and pod.spec.namespace == "a/b"
    assert state.dirty_nodes == set()
    assert list(state.jobs) == ["a/b/g"] and state.jobs["a/b/g"].members == {"a/b/p0"}


def test_a_job_moving_queue_moves_the_usage_of_its_occupying_members_only() -> None:
    group = p.PodGroupObserved(namespace="default", name="g0", queue="q0")
    waiting = _pod(name="p1", uid="u1")
    moved = p.PodGroupObserved(namespace="default", name="g0", queue="q1")
    state = fold(records([group] + _running() + [waiting, moved]))
    assert state.jobs["default/g0"].occupying == 1
    q0, q1 = state.queues["q0"], state.queues["q1"]
    assert (q0.allocated_milli_cpu, q0.allocated_milli_gpu) == (0, 0)
    assert (q1.allocated_milli_cpu, q1.allocated_milli_gpu) == (1000, 1000)
    assert [(key.queue, key.job_key) for key in state.pending_jobs["q1"]] == [("q1", "default/g0")]
    assert "q0" not in state.pending_jobs
