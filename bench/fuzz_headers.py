"""Fuzz the GGUF and safetensors reading paths longer than `make test` does (issue 77; models/headers.py).

    PYTHONPATH=src python bench/fuzz_headers.py [--examples 5000]

The targets, seeds and strategies are tests/fuzzing.py's (tests/test_headers_fuzz.py runs 60 examples each): a small
valid file damaged — fields overwritten with huge values, bytes flipped, spans repeated or cut, truncated — plus the
public crash shapes. Every input must end in a load or one SkillgraftError line within a second (hypothesis'
deadline); any other exception fails the run with the input that caused it. Prints how the inputs ended and the
slowest one (figures: bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))

from fuzzing import (damaged, gguf_crash_shapes, gguf_target, safetensors_crash_shapes,  # noqa: E402
                     safetensors_target, small_gguf, small_safetensors)
from hypothesis import HealthCheck, given, settings  # noqa: E402

from skillgraft.errors import SkillgraftError  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="hypothesis examples per reader")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fuzz-headers-"))
    valid = {"gguf": small_gguf(root / "v.gguf"), "safetensors": small_safetensors()}
    for kind in ("gguf", "safetensors"):
        path = root / ("f.gguf" if kind == "gguf" else "model.safetensors")
        target = gguf_target if kind == "gguf" else safetensors_target
        arg = path if kind == "gguf" else root
        seen = {"load": 0, "one line": 0, "slowest": 0.0}

        def once(data: bytes) -> None:
            path.write_bytes(data)
            start = time.perf_counter()
            try:
                target(arg)
                seen["load"] += 1
            except SkillgraftError as e:
                assert "\n" not in str(e)
                seen["one line"] += 1
            seen["slowest"] = max(seen["slowest"], time.perf_counter() - start)

        shapes = (gguf_crash_shapes if kind == "gguf" else safetensors_crash_shapes)(valid[kind])
        for data in shapes.values():
            once(data)
        run = settings(max_examples=args.examples, deadline=1000, database=None,
                       suppress_health_check=list(HealthCheck))(given(damaged(valid[kind]))(once))
        start = time.perf_counter()
        run()
        total = seen["load"] + seen["one line"]
        print(f"{kind}: {total:,} inputs ({len(shapes)} crash shapes + fuzzed) in {time.perf_counter() - start:.1f} s: "
              f"{seen['load']:,} loaded, {seen['one line']:,} one line, none else; slowest {seen['slowest'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
