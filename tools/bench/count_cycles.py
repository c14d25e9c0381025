"""Machine-independent cost of the steady benchmark's cycles: instructions and cache misses
counted by valgrind's callgrind, for comparing two commits on a machine whose speed drifts.

    python tools/bench/count_cycles.py [--skip 2] [--max-instructions M] [bench_steady_cycle.py's options]
    python tools/bench/count_cycles.py --bench cycle [bench_cycle.py's options]
    python tools/bench/count_cycles.py --count upkeep [--skip 2] [bench_steady_cycle.py's options]
    python tools/bench/count_cycles.py --bench fold [--events 50000] [--max-instructions M]

Runs `bench_steady_cycle.py` (same options; `--restart` included) under
`valgrind --tool=callgrind --cache-sim=yes` with counting off, and turns it on only inside
`run_cycle` after the first `--skip` cycles (the first, which hashes every entity, and one more),
so the build, the fold between cycles and the first cycles are not counted. Prints the
instructions, first-level data-cache misses and last-level misses of the counted cycles, each
per cycle, and the exact instruction total. With PYTHONHASHSEED fixed, two runs of one commit in
one directory give the same instruction count to within 0.01% (another working directory can move
it by about 0.06%); wall-clock time on a shared machine varies by ±10%. Needs valgrind (Debian:
`apt-get install valgrind`); a cycle runs about 50x slower under it (the issue #21 shape, five
cycles: about 2.5 minutes). With `--max-instructions M` it exits 1, saying so, when a counted
cycle takes more than M million instructions on average: a regression guard that, unlike a
timed one, does not depend on the machine's load (the count moves by under 0.01% between runs).
`--bench cycle` counts `bench_cycle.py`'s one allocate cycle instead (10,000 one-GPU pods on 5,000
nodes by default; `--skip` defaults to 0 there): the Python around each placement.
`--count upkeep` counts, instead of the cycles, the steady benchmark's upkeep before each
(`kai_es.scheduling.upkeep.keep_up`: the digest's hashes, the node tables, the kept bounds --
what the scheduler does while it waits for the next cycle), per upkeep, as a cycle is counted.
`--bench fold` counts one decode + apply of `bench_fold.py`'s log (`--events`, default 50,000;
generated first, outside valgrind, when missing) from memory with the GC paused -- the fold the
300,000 events/s target is about -- and prints it per event too: with `--max-instructions` (M
for the whole fold) the fold's regression guard, which a slow or busy machine does not move.
"""

from __future__ import annotations

import gc
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
_INNER = "KAI_ES_COUNT_CYCLES_INNER"
#: `--bench` -> the benchmark module whose calls are counted (its `run_cycle`, but for `fold`)
BENCHES = {"steady": "bench_steady_cycle", "cycle": "bench_cycle", "fold": "bench_fold"}
#: `--bench fold`: the log's size unless `--events` says (bench_fold.py's quick one)
FOLD_EVENTS = 50_000


#: `--count` -> the benchmark's function whose calls are counted
COUNTED = {"cycle": "run_cycle", "upkeep": "keep_up", "fold": "fold_bodies"}


def _inner(skip: int, name: str, function: str) -> None:
    """Inside valgrind: the benchmark, with counting switched on around each counted call of
    its `function`."""
    sys.path.insert(0, str(HERE))
    bench = importlib.import_module(name)

    target: Callable[..., object] = getattr(bench, function)
    calls = [0]
    me = str(os.getpid())

    def counted(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        on = calls[0] > skip
        if on:
            subprocess.run(["callgrind_control", "-i", "on", me], capture_output=True, check=True)
        try:
            return target(*args, **kwargs)
        finally:
            if on:
                subprocess.run(["callgrind_control", "-i", "off", me], capture_output=True, check=True)

    setattr(bench, function, counted)
    if name == "bench_fold":
        _fold_main(bench, sys.argv[1:])
    else:
        getattr(bench, "main")()
    print(f"counted cycles: {max(0, calls[0] - skip)}")


def _fold_main(bench: ModuleType, args: list[str]) -> None:
    """`--bench fold` inside valgrind: the log's bodies read (not counted; the log was made by
    `main`, outside valgrind), then one `fold_bodies` of them with the GC paused, as the fold
    the target is about runs."""
    from kai_es.adapters.file_log import FileEventLog

    bodies = [body for _, body in FileEventLog(bench.log_path(_events(args)), readonly=True).scan_raw()]
    gc.disable()
    bench.fold_bodies(bodies)
    print(f"events folded: {len(bodies)}")


def _events(args: list[str]) -> int:
    return int(args[args.index("--events") + 1]) if "--events" in args else FOLD_EVENTS


def main() -> None:
    args = sys.argv[1:]
    which = "steady"
    if "--bench" in args:
        at = args.index("--bench")
        which = args[at + 1] if at + 1 < len(args) else ""
        if which not in BENCHES:
            sys.exit(f"count_cycles: --bench is one of {', '.join(sorted(BENCHES))}")
        del args[at:at + 2]
    name = BENCHES[which]
    count = "fold" if which == "fold" else "cycle"
    if "--count" in args:
        at = args.index("--count")
        count = args[at + 1] if at + 1 < len(args) else ""
        if (count == "fold") != (which == "fold") or count not in COUNTED or (count == "upkeep" and which != "steady"):
            sys.exit("count_cycles: --count is cycle, or upkeep (of the steady benchmark)")
        del args[at:at + 2]
    skip = 2 if name == "bench_steady_cycle" else 0
    if "--skip" in args:
        at = args.index("--skip")
        skip = int(args[at + 1])
        del args[at:at + 2]
    most: float | None = None
    if "--max-instructions" in args:
        at = args.index("--max-instructions")
        most = float(args[at + 1])
        del args[at:at + 2]
    if os.environ.get(_INNER):
        sys.argv = [str(HERE / f"{name}.py"), *args]
        _inner(skip, name, COUNTED[count])
        return
    if which == "fold":  # the log is generated here, not under valgrind (cycles run to make it)
        sys.path.insert(0, str(HERE))
        importlib.import_module("bench_fold").ensure_log(_events(args))
    out_file = Path("/tmp") / f"kai-es-callgrind.{os.getpid()}.out"
    env = {**os.environ, _INNER: "1", "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    try:
        run = subprocess.run(["valgrind", "--tool=callgrind", "--cache-sim=yes", "--instr-atstart=no",
                              f"--callgrind-out-file={out_file}", sys.executable, __file__, "--skip", str(skip),
                              "--bench", which, "--count", count, *args], env=env, capture_output=True, text=True)
    except FileNotFoundError:
        sys.exit("count_cycles: valgrind is not installed (Debian: apt-get install valgrind)")
    finally:
        out_file.unlink(missing_ok=True)
    print(run.stdout, end="")
    print("(the times above ran under valgrind: compare the counts below, not them)")
    counted = re.search(r"counted cycles: (\d+)", run.stdout)
    numbers = {name: int(value.replace(",", "")) for name, value in
               re.findall(r"==\d+== (I +refs|D1 +misses|LL +misses): +([\d,]+)", run.stderr)}
    if run.returncode != 0 or counted is None or len(numbers) != 3 or int(counted.group(1)) == 0:
        sys.stderr.write(run.stderr[-4000:])
        sys.exit(f"count_cycles: the benchmark under valgrind failed (exit {run.returncode})")
    cycles = int(counted.group(1))
    ir, d1, ll = (numbers[k] for k in sorted(numbers, key=lambda k: ("I", "D", "L").index(k[0])))
    print(f"per counted {count} ({cycles}): {ir / cycles / 1e6:,.1f} M instructions, "
          f"{d1 / cycles / 1e6:,.2f} M L1 data misses, {ll / cycles / 1e6:,.3f} M last-level misses")
    print(f"instructions counted: {ir:,} in {cycles} {count}s")  # exact, for comparing two runs
    folded = re.search(r"events folded: (\d+)", run.stdout)
    if folded is not None:
        print(f"per event folded ({int(folded.group(1)):,}): {ir / cycles / int(folded.group(1)):,.0f} instructions")
    if most is not None and ir / cycles / 1e6 > most:
        sys.exit(f"count_cycles: REGRESSION: {ir / cycles / 1e6:,.1f} M instructions a cycle, above the "
                 f"--max-instructions {most:,.1f} M")


if __name__ == "__main__":
    main()
