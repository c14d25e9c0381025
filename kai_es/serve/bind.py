"""Which address `kai-es serve` may listen on.

Contract: `serve_address(text, allow_remote)` parses ``HOST:PORT`` (``[::1]:PORT`` for IPv6;
port 0 picks a free one) and returns (host, port); it raises `BindRefused` for text that is not
that, and for a host that is not a loopback address (``localhost``, 127.0.0.0/8, ``::1``) unless
`allow_remote`: the pages show every name and decision in the log to whoever can reach them.
"""

from __future__ import annotations

import ipaddress

from kai_es.ports import SetupError

DEFAULT_BIND = "127.0.0.1:8090"


class BindRefused(SetupError):
    """The --bind address is malformed, or not loopback without --allow-remote."""


def serve_address(text: str, allow_remote: bool) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise BindRefused(f"--bind {text!r}: expected HOST:PORT (e.g. {DEFAULT_BIND}, or [::1]:8090)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not allow_remote and not is_loopback(host):
        raise BindRefused(f"--bind {text!r}: {host} is not a loopback address, and the pages show every name and "
                          "decision in the log to whoever can reach them; give --allow-remote to serve there anyway")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: where it resolves is not known here
