"""A backlogged cycle fails hopeless single-pod jobs without re-ordering the queues for each
(`Allocator._drop_hopeless`); that must change no decision and no reason."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_es.adapters.memory_log import MemoryEventLog
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.actions.allocate import Allocator
from kai_es.scheduling.packing import load_packer
from kai_es.app.simulation import simulate
from tests.builders import MakeNode, MakePod, podgroup, queue, scenario_text


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


def _log(text: str) -> list[bytes]:
    log = MemoryEventLog()
    anyio.run(lambda: simulate(load_scenario_text(text, "backlog.yaml"), log, load_packer("native")))
    return log.raw_lines()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backlogged())
def test_dropping_hopeless_jobs_early_changes_no_byte_of_the_log(text: str) -> None:
    with_shortcut = _log(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Allocator, "_drop_hopeless", lambda self, leaf: None)
        one_by_one = _log(text)
    assert with_shortcut == one_by_one
