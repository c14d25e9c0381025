"""Failing a queue's hopeless head jobs in one batch (`rules.hopeless_batch.HopelessBatchV1`) is a shortcut
of policies v1 and v2 that is NOT the same as trying them one by one through KAI's queue order:
a queue's place depends on its head job. v2 logs record the batch and must keep replaying; v3
tries each job through the queue order."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.app.simulation import simulate
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.actions.allocate import Allocator
from kai_es.scheduling.rules.hopeless_batch import HopelessBatchV1
from kai_es.scheduling.packing import load_packer
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text

FOUND = Path(__file__).resolve().parent / "data" / "hopeless-batch.yaml"


def _records(text: str) -> list[Record]:
    log = MemoryEventLog()

    async def run() -> list[Record]:
        await simulate(load_scenario_text(text, "backlog.yaml"), log, load_packer("native"))
        return [r async for r in log.read()]

    return anyio.run(run)


def _first_binds_of_cycle(records: list[Record], cycle: int) -> list[str]:
    started = next(r.position for r in records
                   if isinstance(r.envelope.data, p.CycleStarted) and r.envelope.data.cycle == cycle)
    return [r.envelope.data.name for r in records
            if isinstance(r.envelope.data, p.BindingDecided) and r.envelope.basedon == started]


@pytest.mark.parametrize(("policy", "order"), [("kai-es/v2", ["p6", "p5", "p14"]),
                                               ("kai-es/v3", ["p6", "p5", "p8"])])
def test_a_hopeless_head_delays_its_queue_from_v3_on(policy: str, order: list[str]) -> None:
    records = _records(FOUND.read_text().replace("POLICY", policy))
    assert _first_binds_of_cycle(records, 5)[:3] == order


@st.composite
def backlogged(draw: st.DrawFn) -> str:
    """Far more pods than GPUs, queues with quotas and limits, a parent, gangs,
    non-preemptible priorities, node selectors: every way a try can end."""
    docs = [MakeNode(f"n{i}").gpus(draw(st.integers(1, 4))).cpu("8").obj() for i in range(draw(st.integers(1, 3)))]
    for d in docs:
        d["metadata"]["labels"]["nvidia.com/gpu.memory"] = "40960"
        d["metadata"]["labels"]["zone"] = f"z{draw(st.integers(0, 1))}"
    docs.append(queue("org", -1))
    leaves = ["team-a", "team-b", "team-c"]
    for name in leaves:
        quota = draw(st.sampled_from([-1, 0, 1, 3]))
        q = queue(name, quota, parent=draw(st.sampled_from([None, "org"])))
        q["spec"]["resources"]["gpu"]["limit"] = draw(st.sampled_from([-1, -1, max(quota, 2), max(quota, 4)]))
        docs.append(q)
    gangs = draw(st.integers(0, 2))
    for g in range(gangs):
        docs.append(podgroup(f"g{g}", draw(st.integers(1, 3)), draw(st.sampled_from(leaves))))
    for i in range(draw(st.integers(5, 30))):
        pod = MakePod(f"p{i}", queue=draw(st.sampled_from(leaves)))
        shape = draw(st.sampled_from(["whole", "whole", "frac", "cpu"]))
        if shape == "whole":
            pod.gpu(draw(st.integers(1, 3)))
        elif shape == "frac":
            pod.fraction("0.5")
        pod.req(cpu=draw(st.sampled_from(["500m", "2"])))
        pod.annotate("kai-es.io/submit-after", f"{draw(st.integers(0, 5))}s")
        pod.annotate("kai-es.io/run-for", f"{draw(st.integers(5, 60))}s")
        group = draw(st.integers(0, 3))
        if group < gangs:
            pod.group(f"g{group}")
        if draw(st.integers(0, 3)) == 0:
            pod.priority_class(draw(st.sampled_from(["inference", "build"])))
        obj = pod.obj()
        if draw(st.integers(0, 4)) == 0:
            obj["spec"]["nodeSelector"] = {"zone": f"z{draw(st.integers(0, 1))}"}
        docs.append(obj)
    return scenario_text(*docs, settings={"simulation": {"until": "3m", "cyclePeriod": "1s"}})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backlogged())
def test_from_v3_on_the_batch_never_runs_and_every_try_goes_through_the_queue_order(text: str) -> None:
    """Under the default (v3) policy a run with the batch made to fail loudly is the run: the
    shortcut is never taken, whatever the backlog."""
    with pytest.MonkeyPatch.context() as mp:
        def refuse(self: HopelessBatchV1, allocator: Allocator, leaf: object) -> None:
            raise AssertionError("the hopeless batch ran under a policy that does not have it")
        mp.setattr(HopelessBatchV1, "after_miss", refuse)
        _records(text)
