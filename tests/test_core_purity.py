"""The functional core imports no clock, randomness, concurrency, network, Kafka or Kubernetes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "kai_es"
CORE = ["events", "state", "scheduling", "ingest"]
FORBIDDEN = {"time", "datetime_now", "random", "secrets", "asyncio", "anyio", "trio", "socket",
             "threading", "multiprocessing", "subprocess", "aiokafka", "kafka", "kubernetes",
             "kubernetes_asyncio", "urllib", "http", "requests", "httpx", "os", "uuid4"}
# modules the core may import although their names look risky, with the reason
ALLOWED = {
    "datetime": "timefmt converts logical ns to RFC 3339 arithmetically (never datetime.now)",
    "uuid": "uuid5 for derived ids (never uuid1/uuid4)",
}
# per-file exceptions, each with its reason
ALLOWED_IN: dict[str, dict[str, str]] = {
    "scheduling/packing/native.py": {
        "kai_es._native": "the shared loader that imports the compiled packer and checks its ABI; "
                          "the packer itself is pure computation",
    },
}
BANNED_CALLS = {"now", "utcnow", "today", "time", "time_ns", "monotonic", "perf_counter",
                "uuid1", "uuid4", "random", "urandom", "getenv"}


def _core_files() -> list[Path]:
    return sorted(f for pkg in CORE for f in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_module_imports_no_io(path: Path) -> None:
    tree = ast.parse(path.read_text())
    allowed_here = ALLOWED_IN.get(str(path.relative_to(ROOT)), {})
    bad = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top in FORBIDDEN and top not in ALLOWED and top not in allowed_here:
                bad.append(name)
            if (top == "kai_es" and name.split(".")[1] not in CORE + ["ports"] and name != "kai_es"
                    and name not in allowed_here):
                bad.append(f"{name} (outside the core)")
        if isinstance(node, ast.Call):
            fn = node.func
            attr = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if attr in BANNED_CALLS:
                bad.append(f"call {attr}() at line {node.lineno}")
    assert bad == [], f"{path.relative_to(ROOT)} reaches outside the pure core: {bad}"


def test_the_scan_finds_core_files() -> None:
    assert len(_core_files()) > 15


def test_the_scan_would_catch_a_clock(tmp_path: Path) -> None:
    sneaky = tmp_path / "x.py"
    sneaky.write_text("import time\nfrom kai_es.sim import cluster\nx = time.time_ns()\n")
    tree = ast.parse(sneaky.read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert imports and calls  # the walker sees both shapes it checks
