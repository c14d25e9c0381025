"""Reading a kubernetes-asyncio response made with `_preload_content=False` as plain JSON."""

from __future__ import annotations

import json
from typing import Any


async def read_response(resp: Any) -> tuple[int, dict[str, Any]]:
    """(status, JSON body or {}) of a `_preload_content=False` response; releases it. A body that
    is not a JSON object comes back as {"message": <its start>}."""
    try:
        raw = await resp.read()
    finally:
        resp.release()
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        doc = {"message": raw[:300].decode("utf-8", "replace")}
    return int(resp.status), doc if isinstance(doc, dict) else {"message": str(doc)[:300]}
