"""Regenerate the golden logs in tests/golden/ (run after an intended change of decisions):

    python tools/make_golden.py

- quickstart.events.jsonl: `kai-es simulate examples/quickstart.yaml` with the native packer.
- quickstart.altered.events.jsonl: the same log with one decision changed on purpose (the second
  pod's node), re-framed with a valid CRC, so that only replay — not the file format — can
  notice. `kai-es replay` must reject it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"


def main() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    log = GOLDEN / "quickstart.events.jsonl"
    subprocess.run([sys.executable, "-m", "kai_es", "simulate", "examples/quickstart.yaml", "--log", str(log),
                    "--report", str(ROOT / "out" / "golden-report"), "--packer", "native"],
                   cwd=ROOT, check=True, capture_output=True)
    lines = log.read_bytes().splitlines(keepends=True)
    out = []
    changed = False
    binds = 0
    for line in lines:
        body = line[9:-1]
        event = json.loads(body)
        if event["type"] == "kai.scheduler.pod.bindingdecided" and not changed:
            binds += 1
            if binds == 3:
                event["data"]["node"] = "node-b" if event["data"]["node"] == "node-a" else "node-a"
                body = json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
                changed = True
        out.append(b"%08x\t%s\n" % (zlib.crc32(body), body))
    assert changed
    (GOLDEN / "quickstart.altered.events.jsonl").write_bytes(b"".join(out))
    print(f"wrote {log.relative_to(ROOT)} ({len(lines)} records) and the altered copy")


if __name__ == "__main__":
    main()
