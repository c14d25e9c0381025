"""DescribeTransactions (Kafka 3.0+, KIP-664): who the transaction coordinator says holds a
transactional id now, for `kafka_tenure.taken_over`.

aiokafka has no DescribeTransactions request; this module defines it on aiokafka's own
protocol types (its wire schema is Kafka's ``DescribeTransactionsRequest.json`` and
``DescribeTransactionsResponse.json``, version 0), so it travels on aiokafka's connections,
with their version negotiation and security settings.
"""

from __future__ import annotations

import time
from typing import Any, Final

import anyio
from aiokafka.client import ConnectionGroup, CoordinationType  # type: ignore[import-untyped]
from aiokafka.errors import IncompatibleBrokerVersion, KafkaError  # type: ignore[import-untyped]
from aiokafka.protocol.api import Request, RequestStruct, Response  # type: ignore[import-untyped]
from aiokafka.protocol.types import (  # type: ignore[import-untyped]
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

from kai_es.adapters.kafka_tenure import Holder

#: DescribeTransactions' API key
API_KEY: Final = 65
#: error codes of a DescribeTransactions answer that this module tells apart
NO_ERROR: Final = 0
#: the coordinator is loading or moved: ask again
RETRIABLE: Final = frozenset({14, 15, 16})  # COORDINATOR_LOAD_IN_PROGRESS, _NOT_AVAILABLE, NOT_COORDINATOR
#: the coordinator has no state for the id (never used, or expired after a long idle time)
TRANSACTIONAL_ID_NOT_FOUND: Final = 105


class _DescribeTransactionsResponse_v0(Response):  # type: ignore[misc]
    API_KEY = API_KEY
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("transaction_states", CompactArray(
            ("error_code", Int16),
            ("transactional_id", CompactString("utf-8")),
            ("transaction_state", CompactString("utf-8")),
            ("transaction_timeout_ms", Int32),
            ("transaction_start_time_ms", Int64),
            ("producer_id", Int64),
            ("producer_epoch", Int16),
            ("topics", CompactArray(
                ("topic", CompactString("utf-8")),
                ("partitions", CompactArray(Int32)),
                ("tags", TaggedFields))),
            ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _DescribeTransactionsRequest_v0(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = API_KEY
    API_VERSION = 0
    RESPONSE_TYPE = _DescribeTransactionsResponse_v0
    SCHEMA = Schema(
        ("transactional_ids", CompactArray(CompactString("utf-8"))),
        ("tags", TaggedFields),
    )


class _DescribeTransactions(Request[_DescribeTransactionsRequest_v0]):  # type: ignore[misc]
    API_KEY = API_KEY

    def __init__(self, transactional_id: str) -> None:
        self._ids = [transactional_id]

    def build(self, request_struct_class: type[_DescribeTransactionsRequest_v0]) -> Any:
        return request_struct_class(self._ids, {})


class _Retry(Exception):
    """An answer worth asking again for (the coordinator is loading or moved)."""


class DescribeUnsupported(RuntimeError):
    """The brokers do not know DescribeTransactions (Kafka before 3.0)."""


class TenureUnknown(RuntimeError):
    """The coordinator could not be asked who holds the id (it is away): a claim must wait."""


async def current_holder(client: Any, transactional_id: str, *, timeout_s: float) -> Holder | None:
    """Who the transaction coordinator says holds `transactional_id`: a `Holder`, or None when
    it has no state for it. `client`: a bootstrapped `AIOKafkaClient` (the caller closes it).
    Raises `DescribeUnsupported` when the brokers do not know DescribeTransactions (Kafka
    before 3.0: nobody can be asked), `TenureUnknown` when no answer came within `timeout_s`
    or the answer was an error."""
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        try:
            return await _ask(client, transactional_id)
        except IncompatibleBrokerVersion as exc:
            raise DescribeUnsupported(str(exc)) from exc
        except (KafkaError, OSError, _Retry) as exc:
            if time.monotonic() + delay > deadline:
                raise TenureUnknown(f"the transaction coordinator of {transactional_id!r} did "
                                    f"not say who holds it: {type(exc).__name__}: {exc}") from exc
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def _ask(client: Any, transactional_id: str) -> Holder | None:
    node = await client.coordinator_lookup(CoordinationType.TRANSACTION, transactional_id)
    answer = await client.send(node, _DescribeTransactions(transactional_id),
                               group=ConnectionGroup.COORDINATION)
    states = [s for s in answer.transaction_states if s[1] == transactional_id]
    if not states:
        raise _Retry(f"no state for {transactional_id!r} in the answer")
    error, _, state, _, _, producer_id, epoch, _, _ = states[0]
    if error == TRANSACTIONAL_ID_NOT_FOUND:
        return None
    if error in RETRIABLE:
        raise _Retry(f"error code {error}")
    if error != NO_ERROR:
        raise TenureUnknown(f"the transaction coordinator of {transactional_id!r} answered "
                            f"DescribeTransactions with error code {error}")
    return Holder(int(producer_id), int(epoch), str(state))
