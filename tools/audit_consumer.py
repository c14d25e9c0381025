"""An example audit consumer of the kai-es event log on Kafka: it reads the topic the way the
consumer contract (README, "Audit: the consumer contract") says to, and validates every event
against its published JSON Schema (`schemas/<type>.v<schemaversion>.json`).

    python3 tools/audit_consumer.py --bootstrap 127.0.0.1:9092 --topic kai-es.events
    python3 tools/audit_consumer.py ... --from 1200 --follow --print    # resume, keep reading
    python3 tools/audit_consumer.py ... --security-protocol SASL_SSL --sasl-mechanism SCRAM-SHA-512 \
        --ssl-cafile ca.pem       # credentials from $KAFKA_USERNAME and $KAFKA_PASSWORD

It is written as a team outside kai-es would write it: only aiokafka and jsonschema, no kai_es
import. What it does:
- one partition, manual assignment, no consumer group, `isolation_level="read_committed"`:
  records of aborted or still-open transactions are never delivered, so every event seen is one
  the scheduler or binder committed;
- starts at `--from` (a Kafka offset = the kai-es position; default 0) and, without `--follow`,
  stops at the last stable offset as of its start;
- checks what the contract guarantees: positions strictly increase, no event id repeats, every
  record is a JSON object whose (type, schemaversion) has a schema, and it validates;
- `--print` writes each valid event as one NDJSON line `{"position": P, "event": {...}}`;
- ends with one summary line on stderr, including `next position: N` — the `--from` that resumes
  exactly after the last record read (store it with your own output to get exactly-once).
Exit status: 0 all valid, 1 some record invalid (each is named on stderr with its position),
2 bad usage or the broker unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]
from jsonschema import Draft202012Validator

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def load_validators(directory: Path) -> dict[tuple[str, int], Draft202012Validator]:
    """(type, schema version) -> validator, from `<type>.v<version>.json` files."""
    out = {}
    for path in sorted(directory.glob("*.v*.json")):
        name, _, version = path.name[:-len(".json")].rpartition(".v")
        schema = json.loads(path.read_text())
        Draft202012Validator.check_schema(schema)
        out[(name, int(version))] = Draft202012Validator(schema)
    return out


@dataclass
class Tally:
    valid: int = 0
    invalid: list[str] = field(default_factory=list)
    first: int | None = None
    next_position: int = 0
    ids: set[str] = field(default_factory=set)


def check(value: bytes | None, offset: int, validators: dict[tuple[str, int], Draft202012Validator],
          tally: Tally) -> dict[str, Any] | None:
    """The event of one record if it is valid; otherwise None, with the problem in `tally`."""
    try:
        event = json.loads(value or b"")
    except ValueError as exc:
        tally.invalid.append(f"position {offset}: not JSON ({exc})")
        return None
    if not isinstance(event, dict):
        tally.invalid.append(f"position {offset}: not a JSON object")
        return None
    key = (event.get("type"), event.get("schemaversion"))
    validator = validators.get(key)  # type: ignore[arg-type]
    if validator is None:
        tally.invalid.append(f"position {offset}: no schema for type {key[0]!r} version {key[1]!r}")
        return None
    errors = sorted(validator.iter_errors(event), key=lambda e: list(e.absolute_path))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(event)"
        tally.invalid.append(f"position {offset}: {key[0]} v{key[1]} at {where}: {errors[0].message}")
        return None
    if event["id"] in tally.ids:
        tally.invalid.append(f"position {offset}: event id {event['id']} seen before")
        return None
    tally.ids.add(event["id"])
    return event


def security(protocol: str, mechanism: str | None, cafile: str | None) -> dict[str, Any]:
    """aiokafka's connection options: TLS verified against `cafile` (default: the system's CAs),
    SASL credentials from $KAFKA_USERNAME and $KAFKA_PASSWORD."""
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = ssl.create_default_context(cafile=cafile)
    if protocol.startswith("SASL_"):
        options.update(sasl_mechanism=mechanism or "PLAIN", sasl_plain_username=os.environ.get("KAFKA_USERNAME"),
                       sasl_plain_password=os.environ.get("KAFKA_PASSWORD"))
    return options


async def consume(bootstrap: str, topic: str, start: int, *, follow: bool, limit: int | None, show: bool,
                  validators: dict[tuple[str, int], Draft202012Validator],
                  connection: dict[str, Any] | None = None) -> Tally:
    tally = Tally(next_position=start)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                isolation_level="read_committed", auto_offset_reset="earliest",
                                **(connection or {}))
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        if topic not in await consumer.topics():
            raise KafkaError(f"no such topic {topic!r}")
        consumer.assign([tp])
        end = None if follow else (await consumer.end_offsets([tp]))[tp]  # the last stable offset
        if end is not None and start >= end:
            return tally
        consumer.seek(tp, start)
        last = start - 1
        while True:
            batches = await consumer.getmany(tp, timeout_ms=500)
            for msg in batches.get(tp, ()):
                if msg.offset <= last:
                    tally.invalid.append(f"position {msg.offset}: positions went back (after {last})")
                last = msg.offset
                tally.first = msg.offset if tally.first is None else tally.first
                tally.next_position = msg.offset + 1
                event = check(msg.value, msg.offset, validators, tally)
                if event is not None:
                    tally.valid += 1
                    if show:
                        sys.stdout.write(json.dumps({"position": msg.offset, "event": event}, sort_keys=True,
                                                    separators=(",", ":")) + "\n")
                        sys.stdout.flush()
                if limit is not None and tally.valid + len(tally.invalid) >= limit:
                    return tally
            if end is not None and await consumer.position(tp) >= end:
                # past the last stable offset: transaction markers included, nothing left
                tally.next_position = max(tally.next_position, end)
                return tally
    finally:
        await consumer.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="host:port of a broker")
    parser.add_argument("--topic", default="kai-es.events")
    parser.add_argument("--from", dest="start", type=int, default=0, help="first position (Kafka offset)")
    parser.add_argument("--follow", action="store_true", help="keep reading new events until interrupted")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many records")
    parser.add_argument("--print", dest="show", action="store_true", help="write valid events as NDJSON")
    parser.add_argument("--schemas", type=Path, default=SCHEMAS, help="directory of the JSON Schemas")
    parser.add_argument("--security-protocol", default="PLAINTEXT",
                        choices=["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"])
    parser.add_argument("--sasl-mechanism", choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], default=None)
    parser.add_argument("--ssl-cafile", default=None, help="CA bundle that verifies the brokers")
    args = parser.parse_args()
    if args.start < 0:
        parser.error("--from must be >= 0")
    validators = load_validators(args.schemas)
    if not validators:
        print(f"error: no schemas in {args.schemas}", file=sys.stderr)
        return 2
    try:
        connection = security(args.security_protocol, args.sasl_mechanism, args.ssl_cafile)
        tally = asyncio.run(consume(args.bootstrap, args.topic, args.start, follow=args.follow,
                                    limit=args.limit, show=args.show, validators=validators,
                                    connection=connection))
    except (KafkaError, ssl.SSLError, OSError) as exc:
        print(f"error: {args.bootstrap}/{args.topic}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    for problem in tally.invalid:
        print(f"invalid: {problem}", file=sys.stderr)
    span = "" if tally.first is None else f" (positions {tally.first}..{tally.next_position - 1})"
    print(f"{tally.valid} events valid, {len(tally.invalid)} invalid{span}; next position: {tally.next_position}",
          file=sys.stderr)
    return 1 if tally.invalid else 0


if __name__ == "__main__":
    sys.exit(main())
