"""Hypothesis profiles, and the real Kafka broker.

Profiles: `dev` (local default) is quick; `ci` is the thorough one `.ci/run` uses (selected by
HYPOTHESIS_PROFILE=ci, or by CI=true/1 when HYPOTHESIS_PROFILE is unset); `soak` is for a long
hunt. Tests that set their own `max_examples` keep it under every profile.

Workers: the suite runs on two processes (pytest-xdist, `-n 2` in pyproject's addopts; `-n 0`
runs it in one). A unit of work is a test module, so a module's fixtures are set up once, except
that every test under tests/k8s/ and tests/test_image.py is one unit (`K8S_UNIT`): they share the
session's control plane and image, and the real node's containerd and runc serve one process at
a time. Session fixtures are per worker: each worker that runs a Kafka test starts its broker.

Broker: one KRaft broker (tools/kafka/broker.py) is started for the whole session when a test
first asks for it, on a free port and a temp data dir, and stopped at the end. If it cannot
start, every test that asks for it FAILS with the broker's log tail: these tests never skip.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

_BROKER_PY = Path(__file__).resolve().parents[1] / "tools" / "kafka" / "broker.py"

settings.register_profile("ci", max_examples=400, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("soak", max_examples=1500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


def hypothesis_profile(environ: os._Environ[str] | dict[str, str]) -> str:
    """The profile for an environment: HYPOTHESIS_PROFILE, else `ci` on CI, else `dev`."""
    chosen = environ.get("HYPOTHESIS_PROFILE")
    if chosen:
        return chosen
    return "ci" if environ.get("CI", "").lower() in ("true", "1", "yes") else "dev"


settings.load_profile(hypothesis_profile(os.environ))


def load_tool_module(name: str, path: Path) -> ModuleType:
    """A script under tools/ as a module (loaded by path: tools/ is not a package), once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: the unit of work of the tests that share the control plane, the image and the real node
K8S_UNIT = "tests/k8s"
_WITH_THE_NODE = ("tests/k8s/", "tests/test_image.py::")


def work_unit(nodeid: str) -> str:
    """The unit of work of the test `nodeid` (relative to the repository): its module, or
    `K8S_UNIT`."""
    return K8S_UNIT if nodeid.startswith(_WITH_THE_NODE) else nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler by scope (whole units to one worker, the first unit first), with
    `work_unit` as the scope. (Its `xdist_group` markers cannot do this: under pytest 9 the group
    it writes into a worker's node id does not reach the scheduler.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByUnit(config, log)


broker_mod = load_tool_module("kai_es_tools_kafka_broker", _BROKER_PY)
#: tools/kafka/broker.py's KafkaBroker (loaded by path: tools/ is not a package).
KafkaBroker: Any = broker_mod.KafkaBroker


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[Any]:
    """The session's broker (a started tools/kafka/broker.py KafkaBroker)."""
    broker = KafkaBroker()
    try:
        broker.start(timeout_s=180)
    except broker_mod.BrokerError as e:  # BrokerStartError (includes fetch failures)
        broker.close()
        pytest.fail(f"could not start the Kafka test broker: {e}", pytrace=False)
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Any) -> str:
    return str(kafka_broker.bootstrap)


@pytest.fixture
def procs() -> Iterator[list[Any]]:
    """`kai-es` processes (tests.processes.Proc) a test starts: SIGKILLed at its end whatever
    happened."""
    started: list[Any] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.kill9()


@pytest.fixture(scope="session")
def kai_es_image(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The kai-es image built once per session from this checkout (tools/build_image.py
    `Image`, default tag), for the tests that run it (tests/test_image.py,
    tests/k8s/test_image_on_node.py). The build needs root (chroot): without it this FAILS."""
    if os.geteuid() != 0:
        pytest.fail("building the image (chroot) and running it (runc, containerd) need root")
    img = load_tool_module("kai_es_tools_build_image", Path(__file__).resolve().parents[1] / "tools" / "build_image.py")
    return img.build(tmp_path_factory.mktemp("image") / "out")
