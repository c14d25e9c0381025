"""The PodGroup condition the binder's StatusWriter writes leads with the job's place in its
queue and in the cluster (`#n of m in queue q, #k of l in the cluster: <verdict>`), computed from the state it folds, as
`kai-es explain --queue` computes it; a change of place alone is written again only after
`position_interval_s`, and not at all while the place stays the same. (Against a real apiserver,
with kubectl's `-o wide` column: tests/k8s/test_status.py.)"""

from __future__ import annotations

import time
from typing import Any

from kai_es.adapters.kubernetes.status import StatusWriter
from kai_es.events import Record
from kai_es.explain import explain_queue
from tests.builders import MakePod
from tests.test_positions import _run


def _writer(records: list[Record], **kw: Any) -> StatusWriter:
    writer = StatusWriter(object(), scheduled_events=False, **kw)  # type: ignore[arg-type]  # never sends
    for record in records:
        writer.observe(record)
    return writer


def _conditions(writer: StatusWriter) -> dict[str, str]:
    return {key[2]: w.body["status"]["schedulingConditions"][0]["message"]
            for key, w in writer._pending.items() if key[0] == "podgroup" and w.body["status"]["schedulingConditions"]}  # noqa: SLF001


def _pods() -> list[MakePod]:
    return [MakePod("z-old").gpu(2).priority_class("train"), MakePod("build-now").gpu(2).priority_class("build"),
            MakePod("a-new").gpu(2).priority_class("train"), MakePod("m-build").gpu(2).priority_class("build")]


def test_each_waiting_group_is_told_its_place_as_explain_lists_it() -> None:
    records = _run(*_pods(), gpus=2)
    waiting = explain_queue(records, "team-a")["pending"]
    assert len(waiting) == 3
    conditions = _conditions(_writer(records))
    for w in waiting:
        group = next(g for g in conditions if w["pods"][0].split("/")[1] in g)
        head, verdict = conditions[group].split(": ", 1)
        assert head == (f"#{w['position']} of {w['of']} in queue team-a, "
                        f"#{w['inCluster']} of {w['clusterOf']} in the cluster"), conditions[group]
        assert verdict == w["reasons"][0]["message"] or verdict.startswith(w["reasons"][0]["message"])


def test_without_the_whole_fold_the_condition_has_no_place() -> None:
    records = _run(*_pods(), gpus=2)
    conditions = _conditions(_writer(records, queue_status=False))
    assert conditions and not any(m.startswith("#") for m in conditions.values()), conditions


def test_a_change_of_place_alone_waits_for_the_interval_and_an_unchanged_place_writes_nothing() -> None:
    records = _run(*_pods(), gpus=2)
    writer = _writer(records, position_interval_s=3600.0)
    writer._pending.clear()  # noqa: SLF001 - as if flushed
    writer._position_writes()  # noqa: SLF001 - what flush does before sending
    assert _conditions(writer) == {}  # nothing moved: no write
    group = next(g for g in writer._group_verdict)  # noqa: SLF001
    verdict = writer._group_verdict[group]  # noqa: SLF001
    assert verdict.place is not None
    real = verdict.place
    verdict.place = (real[0] + 5, real[1] + 5, real[2], real[3] + 5, real[4] + 5)  # as if it stood further back
    verdict.written_at = time.monotonic()  # just written: inside the interval
    writer._position_writes()  # noqa: SLF001
    assert _conditions(writer) == {}
    verdict.written_at = time.monotonic() - 7200  # long ago
    writer._group_condition[group] = "stale"  # noqa: SLF001 - what was written then
    writer._position_writes()  # noqa: SLF001
    assert list(_conditions(writer)) == [group[1]]
    assert _conditions(writer)[group[1]].startswith(
        f"#{real[0]} of {real[1]} in queue team-a, #{real[3]} of {real[4]} in the cluster: ")
