"""The Kafka log over TLS with SASL authentication, against a REAL broker whose only client
listener besides the plain one is SASL_SSL (PLAIN over TLS, certificates from a test CA): the log,
its snapshot store and `kai-es events` work with the URL's security options and the credentials
from the environment; a wrong password, a wrong CA and a password in the URL are one clear
line each, and the plain client cannot read the secured listener's data without TLS."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kai_es.adapters.kafka_log import KafkaEventLog
from kai_es.adapters.kafka_security import PASSWORD_ENV, USERNAME_ENV, KafkaSecurityError
from kai_es.adapters.kafka_snapshots import KafkaSnapshotStore
from kai_es.adapters.kafka_tenure import WriterTenure
from kai_es.ports import StoredSnapshot
from tests.conftest import load_tool_module
from tests.kafka.conftest import KafkaBroker, broker_mod
from tests.log_contract import collect, event

ROOT = Path(__file__).resolve().parents[2]
cp_mod = load_tool_module("kai_es_tools_k8s_controlplane", ROOT / "tools" / "k8s" / "controlplane.py")
USER, PASSWORD = "kai-es", "s3cret-pw"


class SecuredBroker:
    def __init__(self, broker: Any, tls_port: int, ca: Path, other_ca: Path) -> None:
        self.broker, self.tls_port, self.ca, self.other_ca = broker, tls_port, ca, other_ca

    def url(self, topic: str, ca: Path | None = None, extra: str = "") -> str:
        return (f"kafka://127.0.0.1:{self.tls_port}/{topic}?security_protocol=SASL_SSL"
                f"&sasl_mechanism=PLAIN&ssl_cafile={ca or self.ca}{extra}")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    certs = tmp_path_factory.mktemp("kafka-tls")
    creds = cp_mod.make_credentials(certs / "ca", hosts=("127.0.0.1",))
    other = cp_mod.make_credentials(certs / "other", hosts=("127.0.0.1",))
    keystore = certs / "broker.pem"  # Kafka's PEM keystore: the private key, then the chain
    keystore.write_bytes(creds.serving_key.read_bytes() + creds.serving_cert.read_bytes())
    ports: set[int] = set()
    while len(ports) < 3:
        ports.add(broker_mod.free_port())
    port, tls_port, controller = sorted(ports)
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            f'user_{USER}="{PASSWORD}";')
    broker = KafkaBroker(port, controller_port=controller, properties={
        "listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{tls_port},"
                     f"CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{tls_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas,
        "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
        "listener.name.sasl_ssl.ssl.keystore.location": str(keystore),
    })
    try:
        broker.start(timeout_s=180)
    except broker_mod.BrokerError as exc:
        broker.close()
        pytest.fail(f"could not start the SASL_SSL Kafka broker: {exc}", pytrace=False)
    try:
        yield SecuredBroker(broker, tls_port, creds.ca_cert, other.ca_cert)
    finally:
        broker.close()


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(USERNAME_ENV, USER)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def _cli(*args: str, password: str = PASSWORD) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, USERNAME_ENV: USER, PASSWORD_ENV: password}
    return subprocess.run([sys.executable, "-m", "kai_es", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


async def test_the_log_and_its_snapshots_work_over_sasl_ssl(secured: SecuredBroker, credentials: None,
                                                          unique_name: str) -> None:
    url = secured.url(unique_name) + f"&transactional_id={unique_name}-w"
    tenure = WriterTenure()
    log = KafkaEventLog.from_url(url, tenure=tenure)
    store = KafkaSnapshotStore.for_log(log)
    try:
        await log.claim_writer()
        await log.append([event(0), event(1)])
        await log.check_writer()
        assert [r.envelope.id for r in await collect(log)] == ["id-0", "id-1"]
        await store.save(StoredSnapshot(position=1, completed_position=2, cycle=1, logicaltime=1,
                                        digest="sha256:x", data=b"{}"))
        loaded = await store.load_latest()
        assert loaded is not None and loaded.position == 1
    finally:
        await store.close()
        await log.close()
    again = KafkaEventLog.from_url(url, tenure=tenure)  # a later session of the same process
    try:
        held = tenure.held
        await again.append([event(2)])  # its claim asked the coordinator first, over SASL_SSL
        assert held is not None and tenure.held == type(held)(held.producer_id, held.epoch + 1)
    finally:
        await again.close()
    out = _cli("events", secured.url(unique_name), "--output", "json")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count('"id-') == 3
    # an outside audit consumer (tools/audit_consumer.py) reads the same secured topic
    audit = subprocess.run([sys.executable, str(ROOT / "tools" / "audit_consumer.py"), "--bootstrap",
                            f"127.0.0.1:{secured.tls_port}", "--topic", unique_name, "--security-protocol",
                            "SASL_SSL", "--sasl-mechanism", "PLAIN", "--ssl-cafile", str(secured.ca)],
                           env={**os.environ, "KAFKA_USERNAME": USER, "KAFKA_PASSWORD": PASSWORD},
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0 and "3 events valid, 0 invalid" in audit.stderr, audit.stderr


def test_bad_credentials_and_certificates_are_one_line_each(secured: SecuredBroker, unique_name: str) -> None:
    wrong_pw = _cli("events", secured.url(unique_name), password="not-it")
    assert wrong_pw.returncode == 2 and "Traceback" not in wrong_pw.stderr, wrong_pw.stderr
    assert len(wrong_pw.stderr.strip().splitlines()) == 1 and "authentication" in wrong_pw.stderr.lower()
    wrong_ca = _cli("events", secured.url(unique_name, ca=secured.other_ca))
    assert wrong_ca.returncode == 2 and "Traceback" not in wrong_ca.stderr, wrong_ca.stderr
    assert len(wrong_ca.stderr.strip().splitlines()) == 1 and "certificate" in wrong_ca.stderr.lower()
    in_url = _cli("events", secured.url(unique_name, extra="&sasl_password=oops"))
    assert in_url.returncode == 2 and f"${PASSWORD_ENV}" in in_url.stderr and "oops" not in in_url.stderr


@pytest.mark.parametrize("query, message", [
    ("security_protocol=SASL_SSL", f"${USERNAME_ENV}"),
    ("security_protocol=TLS", "expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ("sasl_mechanism=PLAIN", "needs security_protocol SASL_SSL or SASL_PLAINTEXT"),
    ("security_protocol=SASL_SSL&sasl_mechanism=GSSAPI", "expected one of PLAIN, SCRAM-SHA-256"),
    ("ssl_cafile=/etc/passwd", "need security_protocol SSL or SASL_SSL"),
    ("security_protocol=SSL&ssl_cafile=/no/such/ca.pem", "no such readable file"),
    ("security_protocol=SSL&ssl_keyfile=/etc/hostname", "ssl_keyfile needs ssl_certfile"),
])
def test_security_options_are_checked_before_connecting(query: str, message: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(USERNAME_ENV, raising=False)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(KafkaSecurityError, match=message.replace("$", r"\$")):
        KafkaEventLog.from_url(f"kafka://127.0.0.1:1/t?{query}")
