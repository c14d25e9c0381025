"""The call bans of the functional core, checked on the syntax tree (import-linter checks imports).

`violations(package_dir)` lists every call in the core packages of the `kai_es` package at
`package_dir` that reads a clock, draws randomness, does I/O, or orders by something that is not
a function of the data:

- any call into `time`, `random` or `secrets`; `uuid.uuid1`/`uuid.uuid4`; `os.*`;
- any `.now()`, `.utcnow()`, `.today()` (e.g. `datetime.now()`), whatever the receiver;
- the builtins `hash()` (salted per process for strings), `open()`, `print()`, `input()`;
- `id()` anywhere in the `key` of `sorted`/`min`/`max`/`.sort`/`heapq.*` (addresses differ
  between runs); `id()` as a cache key is allowed;
- an import, relative ones included, of a `kai_es` module outside the core (import-linter
  reports these too; the double check keeps this scan honest about what it resolves).

Names are resolved through the file's imports, so `import time as t; t.monotonic()` and
`from random import choice; choice(x)` are caught. A call through a variable that holds such a
function is not: that is what import-linter's ban on importing these modules is for.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

CORE = ("events", "state", "scheduling", "ingest", "controllers")
SHELL_OK = {"kai_es"} | {f"kai_es.{c}" for c in CORE}
#: the one door from the core to compiled code (see pyproject's import-linter contracts)
ALLOWED_IMPORTS = {("scheduling/packing/native.py", "kai_es._native")}
BANNED_MODULES = {"time", "random", "secrets", "os"}
BANNED_FUNCTIONS = {"uuid.uuid1", "uuid.uuid4"}
BANNED_METHODS = {"now", "utcnow", "today"}
BANNED_BUILTINS = {"hash", "open", "print", "input"}
ORDERING = {"sorted", "min", "max", "sort", "heapq.nsmallest", "heapq.nlargest", "heapq.merge"}


@dataclass(frozen=True, slots=True)
class Violation:
    path: str  # relative to the package directory
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _module_name(package_dir: Path, path: Path) -> str:
    rel = path.relative_to(package_dir.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom reads from (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, *([node.module] if node.module else [])])


class _Scan(ast.NodeVisitor):
    def __init__(self, rel: str, module: str, is_package: bool) -> None:
        self.rel = rel
        self.module = module
        self.is_package = is_package
        self.aliases: dict[str, str] = {}  # local name -> dotted origin
        self.found: list[Violation] = []

    def flag(self, node: ast.AST, what: str) -> None:
        self.found.append(Violation(self.rel, getattr(node, "lineno", 0), what))

    def _imported(self, node: ast.AST, name: str) -> None:
        top = name.split(".")[0]
        if top in BANNED_MODULES:
            self.flag(node, f"imports {name}")
        if top == "kai_es" and (name not in SHELL_OK and ".".join(name.split(".")[:2]) not in SHELL_OK) \
                and (self.rel, name) not in ALLOWED_IMPORTS:
            self.flag(node, f"imports {name} (outside the core)")

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            self._imported(node, a.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _absolute(self.module, self.is_package, node)
        self._imported(node, base)
        for a in node.names:
            full = f"{base}.{a.name}" if base else a.name
            self.aliases[a.asname or a.name] = full
            if base.split(".")[0] == "kai_es" and base in SHELL_OK:
                self._imported(node, full)  # `from kai_es import adapters`, `from .. import sim`

    def _dotted(self, fn: ast.expr) -> str:
        attrs: list[str] = []
        while isinstance(fn, ast.Attribute):
            attrs.append(fn.attr)
            fn = fn.value
        if not isinstance(fn, ast.Name):
            return ".".join(["?", *reversed(attrs)])
        head = self.aliases.get(fn.id, f"builtins.{fn.id}")
        return ".".join([head, *reversed(attrs)])

    def visit_Call(self, node: ast.Call) -> None:
        name = self._dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        if name.split(".")[0] in BANNED_MODULES:
            self.flag(node, f"calls {name}()")
        elif name in BANNED_FUNCTIONS:
            self.flag(node, f"calls {name}()")
        elif last in BANNED_METHODS and isinstance(node.func, ast.Attribute):
            self.flag(node, f"calls {name}() (a clock)")
        elif name.startswith("builtins.") and last in BANNED_BUILTINS:
            self.flag(node, f"calls {last}()")
        if name.removeprefix("builtins.") in ORDERING or (isinstance(node.func, ast.Attribute) and last == "sort"):
            for kw in node.keywords:
                if kw.arg == "key" and self._uses_id(kw.value):
                    self.flag(node, f"orders by id() in {last}()")
        self.generic_visit(node)

    def _uses_id(self, tree: ast.expr) -> bool:
        for sub in ast.walk(tree):
            if isinstance(sub, ast.Name) and sub.id == "id" and "id" not in self.aliases:
                return True
        return False


def core_files(package_dir: Path) -> list[Path]:
    return sorted(f for pkg in CORE for f in (package_dir / pkg).rglob("*.py"))


def violations(package_dir: Path) -> list[Violation]:
    """Every banned call or import in the core of the `kai_es` package at `package_dir`."""
    found: list[Violation] = []
    for path in core_files(package_dir):
        rel = str(path.relative_to(package_dir))
        scan = _Scan(rel, _module_name(package_dir, path), path.name == "__init__.py")
        scan.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        found.extend(scan.found)
    return found
