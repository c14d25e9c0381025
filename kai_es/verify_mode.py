"""Verification mode, read from the environment by the shell and handed to the pure core.

`KAI_ES_VERIFY=1` makes every cycle re-check what it remembered or maintained incrementally
(the Plan's no-fit memo against the packer, the pack tables against a rebuild); a disagreement
raises `kai_es.scheduling.plan.VerificationError`. Decisions are the same either way; it only
costs time. CI runs the whole test suite with it (`.ci/run`).
"""

from __future__ import annotations

import os


def enabled() -> bool:
    return os.environ.get("KAI_ES_VERIFY", "") == "1"
