"""The functional core imports no clock, randomness, concurrency, network, Kafka or Kubernetes,
nothing of the shell, and calls nothing that reads a clock or depends on the process.

Imports: the import-linter contracts in pyproject.toml (`lint-imports`). Calls: `tests/core_calls.py`.
Each check is also run on a copy of the package with a planted violation, and must fail there
naming it: a check that cannot fail proves nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core_calls import core_files, violations

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kai_es"


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the `kai_es` package found first on the path from `cwd` (no cache)."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--no-cache", "--no-logo"], cwd=cwd, env=env,
                          capture_output=True, text=True)


def _copy_with(tmp_path: Path, relpath: str, source: str) -> Path:
    """A copy of the package (and its contracts) with `source` written at kai_es/`relpath`."""
    shutil.copytree(PACKAGE, tmp_path / "kai_es", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "kai_es" / relpath).write_text(source)
    return tmp_path


def test_import_contracts_are_kept() -> None:
    run = _lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "9 kept, 0 broken" in run.stdout


PLANTED_IMPORTS = [
    # (file, source, contract broken, the line import-linter must name)
    ("state/planted.py", "from ..adapters import clock\n", "The core imports nothing of the shell",
     "kai_es.state.planted -> kai_es.adapters.clock (l.1)"),
    ("scheduling/planted.py", "from kai_es.sim import cluster\n", "The core imports nothing of the shell",
     "kai_es.scheduling.planted -> kai_es.sim.cluster (l.1)"),
    ("ingest/planted.py", "import time\n", "The core has no clock", "kai_es.ingest.planted -> time (l.1)"),
    ("events/planted.py", "\nimport asyncio\n", "The core has no clock", "kai_es.events.planted -> asyncio (l.2)"),
    ("state/planted.py", "from aiokafka import AIOKafkaProducer\n", "The core has no clock",
     "kai_es.state.planted -> aiokafka (l.1)"),
    ("state/planted.py", "import kubernetes\n", "The core has no clock", "kai_es.state.planted -> kubernetes (l.1)"),
    ("events/planted.py", "from ..scheduling import config\n", "The core is layered",
     "kai_es.events.planted -> kai_es.scheduling.config (l.1)"),
    # the shell: one composition root, no back-edges
    ("services/planted.py", "from kai_es.adapters.memory_log import MemoryEventLog\n",
     "Services see only ports", "kai_es.services.planted -> kai_es.adapters.memory_log (l.1)"),
    ("services/planted.py", "from ..sim import cluster\n", "Services see only ports",
     "kai_es.services.planted -> kai_es.sim.cluster (l.1)"),
    ("services/planted.py", "from kai_es.scenario import load_scenario\n", "Services see only ports",
     "kai_es.services.planted -> kai_es.scenario (l.1)"),
    ("adapters/planted.py", "from kai_es.services import binder\n", "Adapters and the simulated cluster",
     "kai_es.adapters.planted -> kai_es.services.binder (l.1)"),
    ("sim/planted.py", "from kai_es import app\n", "Adapters and the simulated cluster",
     "kai_es.sim.planted -> kai_es.app (l.1)"),
    ("app/planted.py", "from kai_es import cli\n", "The command line is on top",
     "kai_es.app.planted -> kai_es.cli (l.1)"),
    ("cli_services.py", "from kai_es.cli import main\n", "The command line is on top",
     "kai_es.cli_services -> kai_es.cli (l.1)"),
    ("report.py", "from kai_es.cli_common import UserError\n", "Only the command line imports its parts",
     "kai_es.report -> kai_es.cli_common (l.1)"),
    # the web view's pages are pure: the server and the clock are the shell's
    ("visibility/planted.py", "from kai_es.serve import http\n", "The web view's pages and fold are pure",
     "kai_es.visibility.planted -> kai_es.serve.http (l.1)"),
    ("visibility/planted.py", "import time\n", "The web view's pages and fold are pure",
     "kai_es.visibility.planted -> time (l.1)"),
    # the scheduling package has no cycle: the registry imports the rules, so a rule may not
    # import the config (which validates through the registry) at run time
    ("scheduling/rules/__init__.py", "from kai_es.scheduling.config import SchedulerConfig\n",
     "The scheduling and state packages have no import cycle", "No cycles are allowed in kai_es.scheduling."),
    # the reducer's handlers import each other in one direction
    ("state/handlers/seen.py", "from kai_es.state.handlers.pods import drop_pod\n",
     "The scheduling and state packages have no import cycle", "No cycles are allowed in kai_es.state.handlers."),
]


@pytest.mark.parametrize(("relpath", "source", "contract", "line"), PLANTED_IMPORTS,
                         ids=[f"{r}:{s.strip()}" for r, s, _, _ in PLANTED_IMPORTS])
def test_each_import_contract_fails_on_a_planted_violation(tmp_path: Path, relpath: str, source: str,
                                                           contract: str, line: str) -> None:
    run = _lint_imports(_copy_with(tmp_path, relpath, source))
    assert run.returncode == 1, run.stdout + run.stderr
    broken = run.stdout.split("Broken contracts", 1)[1]
    assert contract in broken and line in broken, run.stdout


def test_the_contracts_read_the_copy_not_the_installed_package(tmp_path: Path) -> None:
    # a planted module that imports nothing breaks nothing: the failures above are the violations'
    run = _lint_imports(_copy_with(tmp_path, "state/planted.py", "X = 1\n"))
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_banned_call_in_the_core() -> None:
    assert len(core_files(PACKAGE)) > 15
    assert [str(v) for v in violations(PACKAGE)] == []


PLANTED_CALLS = [
    ("import time as t\nx = t.monotonic()\n", ["imports time", "calls time.monotonic()"]),
    ("from time import time_ns\nx = time_ns()\n", ["imports time", "calls time.time_ns()"]),
    ("from datetime import datetime\nx = datetime.now()\n", ["calls datetime.datetime.now() (a clock)"]),
    ("import datetime\nx = datetime.date.today()\n", ["calls datetime.date.today() (a clock)"]),
    ("import uuid\nx = uuid.uuid4()\n", ["calls uuid.uuid4()"]),
    ("from random import choice\nx = choice([1, 2])\n", ["imports random", "calls random.choice()"]),
    ("x = hash('a')\n", ["calls hash()"]),
    ("x = open('f').read()\n", ["calls open()"]),
    ("x = sorted([object()], key=id)\n", ["orders by id() in sorted()"]),
    ("xs = [object()]\nxs.sort(key=lambda o: (1, id(o)))\n", ["orders by id() in sort()"]),
    ("from .. import adapters\n", ["imports kai_es.adapters (outside the core)"]),
    ("from ..services.binder import BinderService\n", ["imports kai_es.services.binder (outside the core)"]),
]


@pytest.mark.parametrize(("source", "expected"), PLANTED_CALLS, ids=[s.split("\n")[-2] for s, _ in PLANTED_CALLS])
def test_the_call_ban_fails_on_a_planted_violation(tmp_path: Path, source: str, expected: list[str]) -> None:
    copy = _copy_with(tmp_path, "scheduling/planted.py", source)
    found = [str(v) for v in violations(copy / "kai_es")]
    assert found == [f"scheduling/planted.py:{i + 1 if len(expected) > 1 else source.count(chr(10))}: {what}"
                     for i, what in enumerate(expected)], found


def test_id_as_a_cache_key_is_allowed(tmp_path: Path) -> None:
    copy = _copy_with(tmp_path, "scheduling/planted.py", "cache = {}\nx = object()\ncache[id(x)] = x\n")
    assert violations(copy / "kai_es") == []
