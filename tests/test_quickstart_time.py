"""The quickstart's stated time has one source (issue 80, item 3): the README's figures are bench/RESULTS.md's
measurement, which names the machine and its load."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_quickstart_says_what_was_measured_and_where():
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quickstart"):readme.index("- `make demo`")]
    assert "about a minute on an idle 2-core machine" in quick.splitlines()[0]
    said = re.findall(r"(\d+) s \+ (\d+) s", quick)
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    section = results[results.index("## The quickstart's wall time"):]
    for finetune, graft in said:  # each figure the README states is a measured row there, with its machine
        row = next(line for line in section.splitlines() if f"**{finetune} s** | **{graft} s**" in line)
        assert "2-core" in row and ("load" in row or "idle" in row), row
    assert len(said) == 2 and "load average" in " ".join(quick.split()) and "idle" in quick
