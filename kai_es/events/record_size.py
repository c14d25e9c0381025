"""How much of a list of keys one event may carry: a log record must stay under what the log
accepts (Kafka's default `max.message.bytes` is 1 MB), however large the cluster.

Contract: `keys_head(keys, budget)` is the longest head of `keys` whose JSON encodings (one
separator each) take at most `budget` bytes. Pure; any strings.
"""

from __future__ import annotations

import msgspec

#: JSON bytes one character may take at most (a control character is written `\\u00XX`)
_WIDEST: int = 6


def keys_head(keys: list[str], budget: int) -> list[str]:
    """The longest head of `keys` that fits `budget` bytes as JSON (module docstring)."""
    if (sum(len(key) for key in keys) + len(keys)) * _WIDEST <= budget:
        return keys  # (fits even if every character took the widest form: nothing to measure)
    total = 0
    encode = msgspec.json.encode
    for i, key in enumerate(keys):
        total += len(encode(key)) + 1
        if total > budget:
            return keys[:i]
    return keys
