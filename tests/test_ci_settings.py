"""CI runs hypothesis with the thorough profile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import hypothesis_profile

ROOT = Path(__file__).resolve().parents[1]


def test_profile_selection() -> None:
    assert hypothesis_profile({"CI": "true"}) == "ci"
    assert hypothesis_profile({"CI": "false"}) == "dev"
    assert hypothesis_profile({}) == "dev"
    assert hypothesis_profile({"CI": "true", "HYPOTHESIS_PROFILE": "soak"}) == "soak"


def test_ci_script_selects_the_thorough_profile_before_the_tests() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert script.index("export HYPOTHESIS_PROFILE=ci") < script.index("python3 -m pytest")


def test_the_ci_profile_runs_more_examples_than_the_local_one() -> None:
    code = ("import tests.conftest\nfrom hypothesis import settings\n"
            "print(settings.get_profile('ci').max_examples, settings.get_profile('dev').max_examples,"
            " settings.default.max_examples)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "HYPOTHESIS_PROFILE": "ci"})
    ci, dev, loaded = map(int, run.stdout.split())
    assert ci >= 200 and ci > dev and loaded == ci
