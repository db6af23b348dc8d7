"""The README's --keep example says what it needs (issue 80, item 7): the selection rows each target needs, as the
refusal computes them, and the example's targets run on a registered task's 64-shot dev split."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from skillgraft.errors import SkillgraftError
from skillgraft.keep.spec import KeepSpec
from skillgraft.keep.selection import check_keep_rows, rows_to_confirm

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_readme_states_the_rows_each_keep_target_needs():
    row = next(line for line in README.splitlines() if line.startswith("| `skillgraft graft … --keep"))
    example = re.search(r"--keep ([\d.,]+)", row).group(1)
    stated = re.search(r"at least (\d+) for 0\.9, (\d+) for 0\.95, (\d+) for 0\.99 at the default "
                       r"`--keep-confidence 0\.9`", row)
    assert stated, row
    assert [int(x) for x in stated.groups()] == [rows_to_confirm(t, 0.9) for t in (0.9, 0.95, 0.99)]
    task = SimpleNamespace(kind="single", metric="accuracy")
    keep = KeepSpec(keep=[float(x) for x in example.split(",")])
    check_keep_rows(keep, task, 128, "dev split")  # the example runs on a 64-shot registered task's dev split
    with pytest.raises(SkillgraftError, match="needs 29 such rows"):  # … and is refused on 20 held-out rows
        check_keep_rows(keep, task, 20, "a held-out slice")
