"""Hypothesis profiles. `dev` (local default) is quick; `ci` is the thorough one `.ci/run` uses
(selected by HYPOTHESIS_PROFILE=ci, or by CI=true/1 when HYPOTHESIS_PROFILE is unset); `soak`
is for a long hunt. Tests that set their own `max_examples` keep it under every profile."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=400, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("soak", max_examples=1500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


def hypothesis_profile(environ: os._Environ[str] | dict[str, str]) -> str:
    """The profile for an environment: HYPOTHESIS_PROFILE, else `ci` on CI, else `dev`."""
    chosen = environ.get("HYPOTHESIS_PROFILE")
    if chosen:
        return chosen
    return "ci" if environ.get("CI", "").lower() in ("true", "1", "yes") else "dev"


settings.load_profile(hypothesis_profile(os.environ))
