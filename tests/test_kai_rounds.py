"""Multi-round parity with KAI's own integration tests (KAI v0.17,
`pkg/scheduler/actions/integration_tests/`): the scheduler's cycles with the cluster moving between
them converge to the placement KAI's tests expect, and stay there.

KAI's integration harness runs every action (allocate, consolidation, reclaim, preempt,
stalegangeviction) for a number of rounds (`RoundsUntilMatch`, 2 by default); between rounds an
evicted (Releasing) or pipelined task turns Pending again, a binding one Running. It then checks
each job's node and status, and runs 5 more rounds checking the same each time (no loop of
evictions and allocations). Here the same topologies are written as a KAI user writes them —
Nodes, Queues (`quota` = the test's deserved GPUs; `overQuotaWeight` 0, the harness's unset
weight), PodGroups of one pod, Pods in the default PriorityClasses, running ones with their node —
and run through `kai-es simulate` under the default policy: the simulator recreates an evicted pod
in its PodGroup (as KAI's harness turns it Pending again) and starts bound pods. After the
simulated time, each job's pod is where KAI's test expects it; the last 10 cycles evict and bind
nothing.

Each case names the KAI test it comes from. Only the topologies and expected results are taken
(data); the harness is kai-es's simulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import payloads as p
from kai_es.events.envelope import Record
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.packing import load_packer
from kai_es.state import ClusterState
from kai_es.state.reducer import apply
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text

SEC = 1_000_000_000
#: simulated time: cycles every second; the last STABLE_S of it must evict and bind nothing
UNTIL_S, STABLE_S = 30, 10


@dataclass(frozen=True)
class Job:
    name: str
    gpus: int
    queue: str
    node: str = ""  # running there at the start ("": pending)
    priority_class: str = "train"


@dataclass(frozen=True)
class Case:
    kai_test: str  # KAI's test file and the test's Name
    nodes: dict[str, int]  # node -> GPUs
    queues: dict[str, int]  # queue -> deserved GPUs
    jobs: tuple[Job, ...]
    expected: dict[str, str]  # job -> the node it runs on at the end ("": Pending)


CASES = (
    Case("consolidation_and_reclaim/consolidation_and_reclaim_test.go: 4 jobs of queue0 - 3 running 1 pending "
         "will consolidate, 1 pending job from queue1 - reclaim",
         {"node0": 4, "node1": 4}, {"queue0": 4, "queue1": 4},
         (Job("running-job0", 2, "queue0", "node0"), Job("running-job1", 2, "queue0", "node1"),
          Job("running-job2", 1, "queue0", "node1"), Job("pending-job0", 3, "queue0"),
          Job("pending-job1", 4, "queue1")),
         {"running-job0": "node0", "running-job1": "node0", "running-job2": "", "pending-job0": "",
          "pending-job1": "node1"}),
    Case("consolidation/consolidation_test.go: 1 train job of 1 GPU running on node0, 1 train job of 1 GPU "
         "running on node 0, 1 pending job of 2 GPUs - consolidate",
         {"node0": 2, "node1": 2}, {"queue0": 1},
         (Job("running-job0", 1, "queue0", "node0"), Job("running-job1", 1, "queue0", "node1"),
          Job("pending-job0", 2, "queue0")),
         {"running-job0": "node0", "running-job1": "node0", "pending-job0": "node1"}),
    Case("consolidation/consolidation_test.go: 1 build job of 1 GPU running on node0, 1 build job of 1 GPU "
         "running on node 0, 1 pending job of 2 GPUs - don't consolidate",
         {"node0": 2, "node1": 2}, {"queue0": 1},
         (Job("running-job0", 1, "queue0", "node0", "build"), Job("running-job1", 1, "queue0", "node1", "build"),
          Job("pending-job0", 2, "queue0")),
         {"running-job0": "node0", "running-job1": "node1", "pending-job0": ""}),
)


def manifests(case: Case) -> str:
    docs: list[dict[str, Any]] = [MakeNode(n).gpus(g).obj() for n, g in case.nodes.items()]
    for name, deserved in case.queues.items():
        q = queue(name, gpu_quota=deserved)
        q["spec"]["resources"]["gpu"]["overQuotaWeight"] = 0
        docs.append(q)
    for job in case.jobs:
        docs.append(podgroup(job.name, 1, job.queue, priorityClassName=job.priority_class))
        pod = MakePod(f"{job.name}-0", queue=job.queue).gpu(job.gpus).group(job.name).priority_class(job.priority_class)
        docs.append((pod.running_on(job.node) if job.node else pod).obj())
    return scenario_text(*docs, settings={"simulation": {"until": f"{UNTIL_S}s", "cyclePeriod": "1s"}})


def run(text: str) -> list[Record]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "kai-rounds.yaml"), log, load_packer("native")))
    return list(log._records)  # noqa: SLF001 - the test reads the whole log


def placement(records: list[Record]) -> dict[str, list[tuple[str, str]]]:
    """Each PodGroup's pods at the end as (status, node), from the folded log."""
    state = ClusterState()
    for record in records:
        apply(state, record)
    out: dict[str, list[tuple[str, str]]] = {}
    for pod in state.pods.values():
        out.setdefault(pod.spec.podgroup, []).append((pod.status, pod.node))
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.kai_test.split(": ", 1)[1][:60] for c in CASES])
def test_the_cycles_converge_where_kais_integration_test_expects_and_stay(case: Case) -> None:
    records = run(manifests(case))
    got = placement(records)
    for job, node in case.expected.items():
        (status, at), = got[job]  # one pod per job: an evicted one was recreated, not doubled
        if node:
            assert (status, at) == ("Running", node), (job, got[job], case.kai_test)
        else:
            assert status == "Pending" and not at, (job, got[job], case.kai_test)
    start = min(r.envelope.logicaltime for r in records)
    late = [(r.envelope.data.name, type(r.envelope.data).__name__) for r in records
            if r.envelope.logicaltime > start + (UNTIL_S - STABLE_S) * SEC
            and isinstance(r.envelope.data, (p.EvictionDecided, p.BindingDecided, p.PodPipelined))]
    assert late == [], f"still moving in the last {STABLE_S} cycles: {late}"
