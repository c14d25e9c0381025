"""mypy --strict over the whole package (pyproject's [tool.mypy] lists `kai_es`)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_whole_package_is_checked() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True and config["files"] == ["kai_es"]


def test_the_package_is_mypy_strict_clean() -> None:
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success" in run.stdout
