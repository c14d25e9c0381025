"""Deterministic simulation soak: run many seeds of `kai_es.app.dst` and report what they found.

    python3 tools/dst.py --seeds 1000                 # seeds 0..999, the default fault mix
    python3 tools/dst.py --seeds 200 --start 5000 --mix crash=60,lose_watch=100
    python3 tools/dst.py --seeds 1 --start 14 -v      # one seed again, with its violations in full
    python3 tools/dst.py --seeds 200 --file-log runs/ # over the file log, torn appends included

Each seed is a whole run: its own workload (`kai_es.sim.workload`), its own faults, every
invariant checked after every step, a settle phase and a replay from scratch. A failing seed is
printed with the command that reproduces it (the same seed and mix give the same log, byte for
byte). With `--file-log DIR` each seed runs over a new file log, DIR/seed-N.log (the
`torn_append` fault needs a file); a passing seed's log is removed, a failing one's is kept for
`kai-es replay`/`explain`. Exit status 1 when any seed failed. The summary says how many seeds, steps, cycles and
faults (by kind) the soak covered and how fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kai_es.app.dst import DstSettings, run_seed  # noqa: E402
from kai_es.scheduling.packing import load_packer  # noqa: E402
from kai_es.sim.faults import FAULT_KINDS, FaultMix  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (default 100)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--mix", default="default",
                        help=f"fault rates per mille over the default mix, kind=rate,... or 'none' "
                             f"(kinds: {', '.join(FAULT_KINDS)})")
    parser.add_argument("--packer", choices=("native", "reference"), default="native")
    parser.add_argument("--horizon", type=int, default=90, help="seconds of simulated time with faults")
    parser.add_argument("--file-log", type=Path, metavar="DIR",
                        help="run each seed over a new file log DIR/seed-N.log (kept when it fails)")
    parser.add_argument("-v", "--verbose", action="store_true", help="every violation of a failing seed")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.start < 0 or args.horizon < 1:
        parser.error("--seeds and --horizon must be positive, --start not negative")
    try:
        mix = FaultMix.parse(args.mix)
    except ValueError as exc:
        parser.error(str(exc))
    logging.disable(logging.WARNING)  # the services' warnings about injected faults are expected
    packer = load_packer(args.packer)
    settings = DstSettings(horizon_ns=args.horizon * 1_000_000_000)
    faults: Counter[str] = Counter()
    failed: list[int] = []
    steps = cycles = 0
    t0 = time.monotonic()
    if args.file_log is not None:
        args.file_log.mkdir(parents=True, exist_ok=True)
    for seed in range(args.start, args.start + args.seeds):
        log_path = None if args.file_log is None else args.file_log / f"seed-{seed}.log"
        if log_path is not None and log_path.exists():
            parser.error(f"{log_path} exists: remove it or choose another --file-log directory")
        report = anyio.run(lambda: run_seed(seed, packer, mix=mix, settings=settings,  # noqa: B023
                                            log_path=log_path))  # noqa: B023
        if log_path is not None and report.ok:
            log_path.unlink()
        steps += report.steps
        cycles += report.cycles
        faults.update({k: v for k, v in report.faults.items() if "@" not in k})
        if not report.ok:
            failed.append(seed)
            print(f"seed {seed}: {len(report.violations)} violation(s); first: {report.violations[0]}")
            for line in report.violations[1:] if args.verbose else ():
                print(f"    {line}")
            file_log = "" if args.file_log is None else f" --file-log {args.file_log}"
            if log_path is not None:
                print(f"    its log: {log_path}")
            print(f"    reproduce: python3 tools/dst.py --seeds 1 --start {seed} --mix {args.mix} "
                  f"--packer {args.packer} --horizon {args.horizon}{file_log} -v")
    took = time.monotonic() - t0
    print(f"{args.seeds} seeds ({args.start}..{args.start + args.seeds - 1}) in {took:.1f} s "
          f"({args.seeds / took * 3600:.0f} seeds/hour): {steps} steps, {cycles} cycles, "
          f"{sum(faults.values())} faults injected")
    print("faults: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))
    print(f"failed seeds: {failed if failed else 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
