"""Fixtures for tests that need a real Apache Kafka broker.

The broker itself (`kafka_broker`, `kafka_bootstrap`) is a session fixture of tests/conftest.py,
shared with the Kubernetes tests that run kai-es over Kafka.

Every test collected under tests/kafka/ gets the ``kafka`` marker.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KafkaBroker, broker_mod

__all__ = ["KafkaBroker", "broker_mod"]  # tests import them from here
_KAFKA_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _KAFKA_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.kafka)


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
