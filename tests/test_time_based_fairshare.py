"""Time-based fair share (policy kai-es/v3, `fairshare.timeBased`): usage folded exactly from the
log, KAI's over-quota weights max(W' + k(W' - U), 0), and the multi-day example in which the
queue that used less in the past gets more."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import pytest

from kai_es.adapters.file_log import FileEventLog
from kai_es.events import Record
from kai_es.events import payloads as p
from kai_es.events.factory import make_envelope
from kai_es.explain import explain_queue
from kai_es.scenario import load_scenario
from kai_es.scheduling.config import ConfigError, config_digest, config_to_dict, parse_config
from kai_es.scheduling.fairshare import QueueInput, divide, round_weights
from kai_es.scheduling.packing import load_packer
from kai_es.scheduling.usage import ONE, decay_weight, queue_usage
from kai_es.app.simulation import simulate
from kai_es.state import ClusterState, fold
from kai_es.state.incremental_digest import incremental_digest, snapshot_digest
from kai_es.state.reducer import apply
from kai_es.state.snapshot import load_snapshot, restore, snapshot, snapshot_bytes

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "time-based-fairshare.yaml"
HOUR = 3600 * 10**9


def _q(name: str, weight: int = 1) -> QueueInput:
    return QueueInput(name=name, uid=name, parent="", priority=100, created_ns=0, quota=0,
                      over_quota_weight=weight, limit=-1)


def test_round_weights_follow_kais_formula_exactly() -> None:
    queues = [_q("a"), _q("b"), _q("c", 2)]
    usage = {"a": Fraction(1, 2), "b": Fraction(0), "c": Fraction(1, 4)}
    weights = round_weights(queues, usage, 1)
    # W' = 1/4, 1/4, 1/2; P = max(W' + (W' - U), 0) = 0, 1/2, 3/4
    assert weights["a"] == 0 and Fraction(weights["b"], weights["c"]) == Fraction(2, 3)
    assert round_weights(queues, None, 1) == {"a": 1, "b": 1, "c": 2}  # off: the weights themselves
    assert round_weights(queues, {}, 3) == {"a": 1, "b": 1, "c": 2}  # no usage: P = W' (scaled)


def test_division_by_usage_in_whole_gpus() -> None:
    queues = [QueueInput(name=n, uid=n, parent="", priority=100, created_ns=0, quota=0, over_quota_weight=1,
                         limit=-1, pending=12_000) for n in ("heavy", "light", "idle")]
    usage = {"heavy": Fraction(2, 3), "light": Fraction(1, 3), "idle": Fraction(0)}
    shares = divide(12_000, queues, 1000, usage, 1)
    assert [shares[n].fair_share for n in ("heavy", "light", "idle")] == [0, 4000, 8000]
    plain = divide(12_000, queues, 1000)
    assert [plain[n].fair_share for n in ("heavy", "light", "idle")] == [4000, 4000, 4000]


def test_decay_weight_is_an_exact_integer_power_of_a_half() -> None:
    assert decay_weight(0, 7) == ONE
    assert decay_weight(3, 1) == ONE >> 3
    half = decay_weight(1, 2)  # 2^-1/2
    assert abs(half * half // ONE - (ONE >> 1)) <= 2  # squared: 1/2 within a few units in the last place
    ws = [decay_weight(k, 5) for k in range(12)]
    assert ws == sorted(ws, reverse=True) and len(set(ws)) == len(ws)


def _config(time_based: bool = True, policy: str = "kai-es/v3") -> p.ConfigApplied:
    cfg = parse_config({"policyVersion": policy, "fairshare": {
        "timeBased": time_based, "windowSize": "4h", "usageResolution": "1h", "halfLifePeriod": "1h"}})
    return p.ConfigApplied(config_digest="x", config=config_to_dict(cfg))


def _records(*items: tuple[int, p.Payload]) -> list[Record]:
    out = []
    for i, (t, data) in enumerate(items):
        env = make_envelope(data, event_id=f"e{i}", source="test", subject="s", logicaltime=t)
        out.append(Record(position=i, envelope=env))
    return out


T0 = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z, a whole hour


def _usage_log(time_based: bool = True, policy: str = "kai-es/v3") -> list[Record]:
    node = p.NodeObserved(name="n1", milli_cpu=64_000, memory_bytes=2**36, gpus=4)
    pod = p.PodObserved(namespace="d", name="a", uid="a", queue="qa", podgroup="pa", phase="Running",
                        node_name="n1", gpu=p.GpuRequest(whole=2))
    return _records(
        (T0, _config(time_based, policy)), (T0, node), (T0, p.QueueObserved(name="qa")),
        (T0, p.QueueObserved(name="qb")),
        (T0 + HOUR // 2, pod),  # qa holds 2 of 4 GPUs from 00:30
        (T0 + 3 * HOUR // 2, p.PodObserved(namespace="d", name="a", uid="a", queue="qa", podgroup="pa",
                                           phase="Succeeded", node_name="n1", gpu=p.GpuRequest(whole=2))),
    )


def test_usage_is_folded_exactly_into_buckets() -> None:
    state = fold(_usage_log())
    qa = state.queues["qa"]
    bucket = T0 // HOUR
    # 00:30-01:00 and 01:00-01:30, 2000 milli-GPU each half hour
    assert qa.usage[bucket][0] == 2000 * HOUR // 2 and qa.usage[bucket + 1][0] == 2000 * HOUR // 2
    # the capacity is accrued lazily, at node changes (none since 00:00): counted as if accrued
    assert not state.capacity_usage and state.capacity_since_ns == T0
    cfg = parse_config({"policyVersion": "kai-es/v3", "fairshare": {
        "timeBased": True, "windowSize": "4h", "usageResolution": "1h", "halfLifePeriod": "1h"}})
    u = queue_usage(state, cfg, T0 + 2 * HOUR)  # buckets 00:00 (weight 1/2) and 01:00 (weight 1) counted
    w_old = decay_weight(HOUR, HOUR)
    expected = Fraction(w_old * 2000 * HOUR // 2 + ONE * 2000 * HOUR // 2, (w_old + ONE) * 4000 * HOUR)
    assert u["qa"][0] == expected and u["qb"][0] == 0


def test_usage_survives_a_snapshot_and_is_part_of_the_digest() -> None:
    state = fold(_usage_log())
    snap = load_snapshot(snapshot_bytes(state))
    again = restore(snap)
    assert snapshot_bytes(again) == snapshot_bytes(state)
    assert snapshot_digest(snap) == incremental_digest(state) == incremental_digest(again)
    other = fold(_usage_log()[:-1])  # a different history gives a different digest
    assert incremental_digest(other) != incremental_digest(state)


@pytest.mark.parametrize("time_based, policy", [(False, "kai-es/v3"), (True, "kai-es/v2")])
def test_usage_is_kept_only_when_turned_on_under_v3(time_based: bool, policy: str) -> None:
    state = fold(_usage_log(time_based, policy))
    assert not state.queues["qa"].usage and not state.capacity_usage
    assert state.queues["qa"].usage_since_ns == 0


def _day2_gpu_hours(path: Path, start_ns: int) -> dict[str, Fraction]:
    """GPU-hours each queue held over day 2 ([24h, 48h) after `start_ns`), folded from the log."""
    async def read() -> list[Record]:
        return [r async for r in FileEventLog(path).read()]

    lo, hi = start_ns + 24 * HOUR, start_ns + 48 * HOUR
    state = ClusterState()
    held: dict[str, int] = {}
    last = lo

    def advance(to: int) -> None:
        nonlocal last
        to = min(max(to, lo), hi)
        if to > last:
            for name, q in state.queues.items():
                held[name] = held.get(name, 0) + q.allocated_milli_gpu * (to - last)
            last = to

    for record in anyio.run(read):
        advance(record.envelope.logicaltime)
        apply(state, record)
    advance(hi)
    return {name: Fraction(v, 1000 * HOUR) for name, v in sorted(held.items())}


def _run(path: Path, time_based: bool, k: str = "1") -> dict[str, Fraction]:
    text = EXAMPLE.read_text()
    if not time_based:
        text = text.replace("timeBased: true", "timeBased: false")
    assert "kValue: 1," in text
    text = text.replace("kValue: 1,", f"kValue: {k},")
    scenario_path = path.with_suffix(".yaml")
    scenario_path.write_text(text)
    scenario = load_scenario(scenario_path)
    log = path.with_suffix(".jsonl")
    anyio.run(lambda: simulate(scenario, FileEventLog(log), load_packer("native")))
    return _day2_gpu_hours(log, scenario.start_ns)


def test_the_queue_that_used_less_in_the_past_gets_more(tmp_path: Path) -> None:
    with_history = _run(tmp_path / "on", True)
    without = _run(tmp_path / "off", False)
    # without history the alike queues split day 2 evenly
    assert without["heavy"] == without["light"] == without["idle"] == 96
    # with it, less used on day 1 means more on day 2 (idle used nothing, light 4 GPUs, heavy 8)
    assert with_history["idle"] > with_history["light"] > with_history["heavy"]
    assert with_history["idle"] > without["idle"] and with_history["heavy"] < without["heavy"]
    assert sum(with_history.values()) == sum(without.values()) == 12 * 24  # the cluster stays full
    # `kai-es explain --queue` shows the division the cycles ran: at the start of day 2 the queue
    # that used nothing has the largest fair share, the one that used 8 GPUs none over its quota
    async def read() -> list[Record]:
        return [r async for r in FileEventLog(tmp_path / "on.jsonl").read()]

    records = anyio.run(read)
    day2 = {name: next(run["numbers"]["gpu"]["fairShare"] for run in explain_queue(records, name)["runs"]
                       if run["from"]["logicaltime"] >= load_scenario(EXAMPLE).start_ns + 24 * HOUR)
            for name in ("heavy", "light", "idle")}
    assert day2 == {"heavy": 0, "light": 4000, "idle": 8000}
    # and the run replays byte for byte: U is recomputed from the log alone
    replay = subprocess.run([sys.executable, "-m", "kai_es", "replay", str(tmp_path / "on.jsonl")],
                            capture_output=True, text=True)
    assert replay.returncode == 0, replay.stdout + replay.stderr


def test_config_keys_added_later_stay_out_of_logged_configs() -> None:
    plain: dict[str, Any] = config_to_dict(parse_config({}))
    assert "timeBased" not in plain["fairshare"] and "usageResolution" not in plain["fairshare"]
    assert "reclaimResolveMethod" not in plain["minRuntime"]
    queue: dict[str, Any] = config_to_dict(parse_config({"minRuntime": {"reclaimResolveMethod": "queue"}}))
    assert queue["minRuntime"]["reclaimResolveMethod"] == "queue" and config_to_dict(parse_config(queue)) == queue
    on: dict[str, Any] = config_to_dict(parse_config({"fairshare": {"timeBased": True}}))
    assert on["fairshare"]["timeBased"] is True
    assert config_to_dict(parse_config(on)) == on


def test_a_fractional_k_splits_between_k0_and_k1(tmp_path: Path) -> None:
    k0, half, k1 = (_run(tmp_path / name, True, k) for name, k in (("k0", "0"), ("half", "0.5"), ("k1", "1")))
    assert k0["heavy"] == k0["light"] == k0["idle"] == 96  # k 0: usage weighs nothing
    # k 1/2 moves day 2 towards the queue that used less, strictly less far than k 1
    assert k1["heavy"] < half["heavy"] < k0["heavy"] and k0["idle"] < half["idle"] < k1["idle"]
    assert sum(half.values()) == 12 * 24
    # the logged config holds k as its decimal text (no float in the log), and the run replays
    # byte for byte: the re-parsed config has the same digest and k, so the same decisions
    async def read() -> list[Record]:
        return [r async for r in FileEventLog(tmp_path / "half.jsonl").read()]

    applied = [r.envelope.data for r in anyio.run(read) if isinstance(r.envelope.data, p.ConfigApplied)]
    assert applied and applied[0].config["fairshare"]["kValue"] == "0.5"
    assert parse_config(applied[0].config).fairshare.k == Fraction(1, 2)
    assert config_digest(parse_config(applied[0].config)) == applied[0].config_digest
    replay = subprocess.run([sys.executable, "-m", "kai_es", "replay", str(tmp_path / "half.jsonl")],
                            capture_output=True, text=True)
    assert replay.returncode == 0 and "byte for byte" in replay.stdout, replay.stdout + replay.stderr


def test_round_weights_with_a_fractional_k_are_exact() -> None:
    queues = [_q("a"), _q("b")]
    usage = {"a": Fraction(3, 4), "b": Fraction(1, 4)}
    # W' = 1/2 each; P = 1/2 + 1/2 (1/2 - U) = 3/8 and 5/8
    weights = round_weights(queues, usage, Fraction(1, 2))
    assert Fraction(weights["a"], weights["b"]) == Fraction(3, 5)
    # 0.1 is one tenth, not the binary float nearest to it
    k = parse_config({"fairshare": {"kValue": 0.1}}).fairshare.k
    assert k == Fraction(1, 10)
    weights = round_weights(queues, usage, k)  # P = 1/2 -+ 1/40: 19/40 and 21/40
    assert Fraction(weights["a"], weights["b"]) == Fraction(19, 21)


@pytest.mark.parametrize("spelling", [0.5, "0.5", "0.50", 0.50])
def test_every_spelling_of_a_fractional_k_has_one_config(spelling: object) -> None:
    cfg = parse_config({"fairshare": {"kValue": spelling}})
    assert cfg.fairshare.k == Fraction(1, 2)
    logged: dict[str, Any] = config_to_dict(cfg)
    assert logged["fairshare"]["kValue"] == "0.5"
    assert config_to_dict(parse_config(logged)) == logged


def test_an_integer_k_is_logged_as_before() -> None:
    # a whole k stays an int in the logged config, however written: 1, 1.0 and "1.0" are the
    # default's own config and digest (existing configs and logs are unchanged)
    default = parse_config({})
    plain: dict[str, Any] = config_to_dict(default)
    assert plain["fairshare"]["kValue"] == 1 and type(plain["fairshare"]["kValue"]) is int
    for spelling in (1, 1.0, "1.0", "1"):
        cfg = parse_config({"fairshare": {"kValue": spelling}})
        assert config_to_dict(cfg) == plain and config_digest(cfg) == config_digest(default)
    three: dict[str, Any] = config_to_dict(parse_config({"fairshare": {"kValue": 3}}))
    assert three["fairshare"]["kValue"] == 3 and type(three["fairshare"]["kValue"]) is int


@pytest.mark.parametrize("value, says", [
    (float("nan"), "finite"), (float("inf"), "finite"), (-0.5, ">= 0"), (-1, ">= 0"),
    (0.1234567, "at most 6 decimals"), ("0.1234567", "at most 6 decimals"), ("abc", "not a decimal number"),
    ("1e3", "not a decimal number"), ("-0.5", "not a decimal number"), (True, "Expected"), (None, "Expected"),
])
def test_bad_k_values_are_refused_naming_the_field(value: object, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"fairshare": {"kValue": value}})
    assert "$.fairshare.kValue" in str(err.value) and says in str(err.value), str(err.value)
