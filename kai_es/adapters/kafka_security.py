"""How kai-es authenticates to Kafka and encrypts the connection: TLS and SASL.

A `kafka://` URL names them in its query, every client of the log (producers, consumers, admin,
the snapshot store) uses them, and secrets never travel in the URL (it appears in process
lists, pod specs and logs):

    kafka://broker:9093/kai-es.events?security_protocol=SASL_SSL&sasl_mechanism=SCRAM-SHA-512
        &ssl_cafile=/etc/kafka/ca.pem

- ``security_protocol``: ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``.
- ``sasl_mechanism`` (SASL only): ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``; the user
  name and password come from the environment, ``KAI_ES_KAFKA_SASL_USERNAME`` and
  ``KAI_ES_KAFKA_SASL_PASSWORD`` (a Kubernetes Secret as env vars). A URL with
  ``sasl_password`` is refused.
- ``ssl_cafile`` (TLS): the CA bundle that verifies the brokers (default: the system's);
  ``ssl_certfile`` and ``ssl_keyfile``: a client certificate, for brokers that require mutual
  TLS. Brokers' host names are always checked against their certificates.

Anything missing or contradictory (SASL options without SASL, an unknown mechanism, a file that
cannot be read, SASL without credentials) is a `KafkaSecurityError` naming what to fix, raised
when the URL is parsed, before any connection.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kai_es.ports import SetupError

PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
USERNAME_ENV: Final = "KAI_ES_KAFKA_SASL_USERNAME"
PASSWORD_ENV: Final = "KAI_ES_KAFKA_SASL_PASSWORD"
OPTIONS: Final = ("security_protocol", "sasl_mechanism", "ssl_cafile", "ssl_certfile", "ssl_keyfile")


class KafkaSecurityError(SetupError):
    """The URL's security options cannot be used; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    def __repr__(self) -> str:  # never the password
        return (f"KafkaSecurity(protocol={self.protocol!r}, mechanism={self.mechanism!r}, "
                f"username={self.username!r}, cafile={self.cafile!r}, certfile={self.certfile!r})")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for every aiokafka client (producer, consumer, admin)."""
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            context = ssl.create_default_context(cafile=self.cafile)
            if self.certfile is not None:
                context.load_cert_chain(self.certfile, self.keyfile)
            kwargs["ssl_context"] = context
        if self.mechanism is not None:
            kwargs.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                          sasl_plain_password=self.password)
        return kwargs


PLAINTEXT: Final = KafkaSecurity()


def security_from_query(query: Mapping[str, str], env: Mapping[str, str] | None = None) -> KafkaSecurity:
    """The security of a URL's query options (`OPTIONS`; the caller removes them from the
    query it checks for unknown options), credentials from `env` (default: os.environ)."""
    env = os.environ if env is None else env
    if "sasl_password" in query or "sasl_plain_password" in query:
        raise KafkaSecurityError(f"a Kafka password does not belong in the URL (it shows in process lists "
                                 f"and logs): set ${PASSWORD_ENV} instead")
    protocol = (query.get("security_protocol") or "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise KafkaSecurityError(f"security_protocol={query['security_protocol']!r}: expected one of "
                                 f"{', '.join(PROTOCOLS)}")
    sasl = protocol.startswith("SASL_")
    mechanism = query.get("sasl_mechanism")
    if mechanism is not None and not sasl:
        raise KafkaSecurityError(f"sasl_mechanism needs security_protocol SASL_SSL or SASL_PLAINTEXT "
                                 f"(it is {protocol})")
    username = password = None
    if sasl:
        mechanism = (mechanism or "PLAIN").upper()
        if mechanism not in MECHANISMS:
            raise KafkaSecurityError(f"sasl_mechanism={query['sasl_mechanism']!r}: expected one of "
                                     f"{', '.join(MECHANISMS)}")
        username, password = env.get(USERNAME_ENV), env.get(PASSWORD_ENV)
        if not username or password is None:
            raise KafkaSecurityError(f"security_protocol={protocol} needs the user name and password in "
                                     f"${USERNAME_ENV} and ${PASSWORD_ENV}")
    files = {name: query.get(name) or None for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile")}
    given = [name for name, path in files.items() if path is not None]
    if given and protocol not in ("SSL", "SASL_SSL"):
        raise KafkaSecurityError(f"{', '.join(given)} need security_protocol SSL or SASL_SSL (it is {protocol})")
    if files["ssl_keyfile"] is not None and files["ssl_certfile"] is None:
        raise KafkaSecurityError("ssl_keyfile needs ssl_certfile (the client certificate it belongs to)")
    for name in given:
        path = files[name]
        assert path is not None
        if not os.access(path, os.R_OK):
            raise KafkaSecurityError(f"{name}={path}: no such readable file")
    security = KafkaSecurity(protocol, mechanism, username, password, files["ssl_cafile"],
                             files["ssl_certfile"], files["ssl_keyfile"])
    if security.tls:
        try:
            security.client_kwargs()  # a CA or certificate file that is not one fails here, once
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise KafkaSecurityError(f"TLS files ({', '.join(given) or 'system CAs'}): {exc}") from None
    return security
