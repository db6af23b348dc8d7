"""Run every benchmark in turn (``make bench``); each records its figures under bench/results/ and prints a
table to paste into bench/RESULTS.md. Long: the real-model benchmarks take tens of minutes on 2 CPU cores.

Usage: .venv/bin/python bench/run_all.py [--only NAME,NAME] [--skip NAME,NAME]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = sorted(p.stem for p in HERE.glob("*.py") if p.stem != "run_all")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", default="", help=f"comma-separated subset of {BENCHES}")
    ap.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    args = ap.parse_args()
    only = [b for b in args.only.split(",") if b]
    skip = {b for b in args.skip.split(",") if b}
    unknown = [b for b in [*only, *skip] if b not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {BENCHES}", file=sys.stderr)
        return 2
    failed = []
    for name in only or BENCHES:
        if name in skip:
            continue
        print(f"\n=== bench/{name}.py", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(HERE / f"{name}.py")])
        print(f"=== bench/{name}.py: exit {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
