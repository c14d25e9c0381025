"""CI runs hypothesis with the thorough profile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import K8S_UNIT, hypothesis_profile, work_unit

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


def test_the_workers_units_keep_the_node_tests_together_and_modules_whole() -> None:
    """The Kubernetes tests and the image's share one worker (one control plane, one real node's
    containerd at a time); any other module is one unit (its fixtures set up once)."""
    for nodeid in ("tests/k8s/test_status.py::test_a", "tests/k8s/test_real_node.py::test_b[x::y]",
                   "tests/test_image.py::test_two_builds_give_the_same_digest"):
        assert work_unit(nodeid) == K8S_UNIT, nodeid
    assert work_unit("tests/kafka/test_faults.py::test_binder_killed_repeatedly") == "tests/kafka/test_faults.py"
    assert work_unit("tests/test_cli.py::test_help[a::b]") == "tests/test_cli.py"
    assert work_unit("tests/test_image_tools.py::test_x") == "tests/test_image_tools.py"
    # the setting that makes the suite use them
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'addopts = "-ra --strict-markers -n 2"' in pyproject

