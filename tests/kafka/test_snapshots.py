"""Snapshots: the scheduler writes one at a cycle cut to `<topic>.snapshots` (compacted), a new
scheduler restores it and folds only the tail, and a snapshot that fails either check — (a) its
restored state's digest equals its stored digest, (b) that digest equals the statedigest the log
recorded on the cycle's CycleCompleted — is rejected with a warning naming its position. The
digest is the one of the policy version the cycle ran under (the current one: incremental)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from kai_es.adapters.clock import SimClock
from kai_es.adapters.file_log import FileEventLog
from kai_es.adapters.file_snapshots import FileSnapshotStore
from kai_es.adapters.ids import SeededIds
from kai_es.adapters.kafka_log import KafkaEventLog
from kai_es.adapters.kafka_snapshots import KafkaSnapshotStore
from kai_es.scenario import load_scenario
from kai_es.scheduling.packing import load_packer
from kai_es.services.scheduler import SchedulerService
from kai_es.scheduling.policy import CURRENT_POLICY, policy_for
from kai_es.ports import StoredSnapshot
from kai_es.app.simulation import simulate
from kai_es.state.incremental_digest import incremental_digest
from kai_es.state.reducer import fold
from kai_es.state.snapshot import digest, load_snapshot, restore, snapshot_bytes
from tests.kafka.procs import workload_scenario

PACKER = load_packer("native")


async def _populate(events: Any, tmp: Path) -> Any:
    scenario = load_scenario(str(workload_scenario(tmp / "small.yaml", pods=60, nodes=2,
                                                   spread_s=120, run_for_s=60)))
    await simulate(scenario, events, PACKER, until_ns=90 * 10**9)
    return scenario


async def _scheduler(events: Any, store: Any, scenario: Any, every: int = 1) -> SchedulerService:
    return SchedulerService(events, scenario.config, PACKER, SimClock(scenario.start_ns + 10**12),
                            SeededIds("t"), snapshots=store, snapshot_every=every)


async def _full_digest(events: Any) -> str:
    """The full digest and the incremental one of the state folded from the whole log."""
    state = fold([r async for r in events.read(0)])
    return f"{digest(state)} {incremental_digest(state)}"


def _digests(state: Any) -> str:
    return f"{digest(state)} {incremental_digest(state)}"


async def _write_snapshot_then_restore(events: Any, store: Any, tmp: Path) -> dict[str, Any]:
    scenario = await _populate(events, tmp)
    first = await _scheduler(events, store, scenario)
    await first.start()
    await first.run_cycle_once()
    assert first.snapshots_written == 1
    saved = await store.load_latest()
    assert saved is not None
    # more log after the snapshot (the tail), without a newer snapshot
    first.snapshot_every = 0
    await first.run_cycle_once()
    second = await _scheduler(events, store, scenario)
    await second.start()
    return {"saved": saved, "second": second, "full": await _full_digest(events),
            "scenario": scenario}


def test_kafka_snapshot_restores_and_folds_tail(kafka_bootstrap: str, unique_name: str,
                                                tmp_path: Path) -> None:
    async def go() -> None:
        events = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=f"s-{unique_name}")
        store = KafkaSnapshotStore.for_log(events)
        try:
            out = await _write_snapshot_then_restore(events, store, tmp_path)
            saved: StoredSnapshot = out["saved"]
            second: SchedulerService = out["second"]
            assert second.snapshot_restored == saved.position
            assert second.state.position > saved.position  # the tail was folded
            assert _digests(second.state) == out["full"]
            assert out["scenario"].config.policy_version == CURRENT_POLICY
            assert saved.digest.startswith("mset-sha256:")
            assert policy_for(CURRENT_POLICY).snapshot_digest(load_snapshot(saved.data)) == saved.digest
        finally:
            await store.close()
            await events.close()

    anyio.run(go)


def _tamper(saved: StoredSnapshot, *, fix_digest: bool) -> StoredSnapshot:
    """Change one fact (a node's CPU) in the snapshot; optionally make its stored digest agree
    with the tampered content, so only check (b) can catch it."""
    snap = load_snapshot(saved.data)
    raw = msgspec.to_builtins(snap)
    raw["nodes"][0]["spec"]["milli_cpu"] += 1000
    data = msgspec.json.encode(raw)
    state = restore(load_snapshot(data))
    data = snapshot_bytes(state)
    return StoredSnapshot(position=saved.position, completed_position=saved.completed_position,
                          cycle=saved.cycle, logicaltime=saved.logicaltime,
                          digest=incremental_digest(state) if fix_digest else saved.digest, data=data)


@pytest.mark.parametrize("fix_digest", [False, True], ids=["own-digest", "log-digest"])
def test_kafka_bad_snapshot_is_rejected(kafka_bootstrap: str, unique_name: str, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture, fix_digest: bool) -> None:
    caplog.set_level(logging.WARNING, logger="kai_es.services.snapshotting")

    async def go() -> None:
        events = KafkaEventLog(kafka_bootstrap, unique_name, transactional_id=f"s-{unique_name}")
        store = KafkaSnapshotStore.for_log(events)
        try:
            scenario = await _populate(events, tmp_path)
            first = await _scheduler(events, store, scenario)
            await first.start()
            await first.run_cycle_once()
            saved = await store.load_latest()
            assert saved is not None
            await store.save(_tamper(saved, fix_digest=fix_digest))
            second = await _scheduler(events, store, scenario)
            await second.start()
            assert second.snapshot_restored is None
            assert _digests(second.state) == await _full_digest(events)
            text = caplog.text
            assert f"snapshot at position {saved.position}" in text and "rejected" in text
            if fix_digest:
                assert "the log recorded" in text
            else:
                assert "restored state digest" in text
        finally:
            await store.close()
            await events.close()

    anyio.run(go)


def test_file_snapshot_store(tmp_path: Path) -> None:
    async def go() -> None:
        events = FileEventLog(tmp_path / "log.jsonl")
        store = FileSnapshotStore.for_log(tmp_path / "log.jsonl")
        try:
            out = await _write_snapshot_then_restore(events, store, tmp_path)
            assert out["second"].snapshot_restored == out["saved"].position
            assert _digests(out["second"].state) == out["full"]
        finally:
            await events.close()

    anyio.run(go)
