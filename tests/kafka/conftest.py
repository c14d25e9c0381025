"""Fixtures for tests that need a real Apache Kafka broker.

One KRaft broker (tools/kafka/broker.py) is started for the whole session, on a free port and
a temp data dir, and stopped at the end. If it cannot start, every test that asks for it FAILS
with the broker's log tail: these tests are never skipped.

Every test collected under tests/kafka/ gets the ``kafka`` marker.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_BROKER_PY = Path(__file__).resolve().parents[2] / "tools" / "kafka" / "broker.py"
_KAFKA_DIR = Path(__file__).resolve().parent


def _load_broker_module() -> ModuleType:
    name = "kai_es_tools_kafka_broker"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _BROKER_PY)
    assert spec is not None and spec.loader is not None, _BROKER_PY
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


broker_mod = _load_broker_module()
#: tools/kafka/broker.py's KafkaBroker (loaded by path: tools/ is not a package).
KafkaBroker: Any = broker_mod.KafkaBroker


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _KAFKA_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.kafka)


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
def unique_name(request: pytest.FixtureRequest) -> str:
    """A topic/group/transactional-id stem unique to this test (and this run)."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def _collect_garbage_after_test() -> Iterator[None]:
    """Finalize leftovers (e.g. aiokafka futures holding an unretrieved exception) right after
    each test instead of at a random later allocation. On CPython 3.11.7 a Future.__del__ that
    runs during ast.parse (pytest's assertion rewriting at import) can raise
    "SystemError: AST constructor recursion depth mismatch" and crash the pytest session.
    """
    yield
    gc.collect()
