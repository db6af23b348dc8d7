"""Files skillgraft reads never run code and never lead it outside their folder (docs/reliability.md §13, §14).

A resume state is a file in a hidden folder beside the output or in the store: anyone who can write there can plant
a pickle. It is read with ``torch.load(weights_only=True)``: the planted file is refused, named, and never run.
Paths recorded in a file skillgraft wrote (a continual state's task folders, a routed folder's skills and base)
resolve inside that folder, or the file is refused by name before anything is read or written."""

from __future__ import annotations

import json
import os
import pickle

import pytest
from badinputs import invoke, one_line, snapshot

from skillgraft.errors import SkillgraftError


class _Planted:
    """A pickle that makes a folder when it is unpickled (code running from a file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _plant(path, marker):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"fingerprint": "x", "step": 3, "payload": _Planted(marker)}))


def _finetune_args(tiny_bert, toy_data, out):
    return ("finetune", "--task", "SST-2", "--k", 8, "--seed", 13, "--model", tiny_bert, "--lr", 1e-3, "--steps", 2,
            "--eval-every", 2, "--data-dir", toy_data, "--test-limit", 8, "--out", out)


def test_a_pickle_planted_in_a_run_resume_folder_is_refused_and_never_runs(tiny_bert, toy_data, tmp_path):
    marker = tmp_path / "code-ran"
    _plant(tmp_path / ".run.resume" / "finetune-0.pt", marker)
    r = invoke(*_finetune_args(tiny_bert, toy_data, tmp_path / "run"))
    assert r.exit_code == 0, r.output
    assert not marker.exists()  # the file's code never ran
    line = next(x for x in r.output.splitlines() if "finetune-0.pt" in x)
    assert "refused" in line and "the loop starts over" in line
    assert (tmp_path / "run" / "metrics.json").is_file() and not (tmp_path / ".run.resume").exists()


def test_a_pickle_planted_in_a_store_resume_folder_is_refused_and_never_runs(tmp_path, capsys):
    from skillgraft.resume import checkpoint, resume_point

    marker = tmp_path / "code-ran"
    folder = tmp_path / "store" / ".regions-SST-2-8-13-learned-0123.resume"
    _plant(folder / "localize-0.pt", marker)
    _plant(folder / "localize-1.rank1.1.pt", marker)  # a rank's file of a sharded save goes through the same reader
    with resume_point(folder):
        assert checkpoint("localize", {"steps": 6}).load() is None
    assert not marker.exists()
    assert "localize-0.pt: holds objects other than tensors" in capsys.readouterr().err
    from skillgraft.resume import _read

    assert _read(folder / "localize-1.rank1.1.pt")[0] is None and not marker.exists()


def test_a_saved_state_with_arrays_budgets_and_regions_reads_back_without_pickle(tmp_path):
    """What a localization saves (a NumPy RandomState, budgets as keys, regions) reads back with weights_only."""
    import numpy as np
    import torch

    from skillgraft.graft.region import Region
    from skillgraft.graft.selection import Budget
    from skillgraft.resume import checkpoint, resume_point

    rng = np.random.RandomState(7)
    region = Region({"w": (4, 3)}, {"w": torch.tensor([1, 5, 7])})
    state = {"rng": rng.get_state(), "best": {Budget.parse(0.05): (0.5, 3, region), Budget.parse(10): (0.1, 1, None)},
             "mean": np.float32(0.25), "history": [{"step": 1, "acc": 0.5}]}
    with resume_point(tmp_path / "r"):
        checkpoint("localize", {}).save(state)
    with resume_point(tmp_path / "r"):
        back = checkpoint("localize", {}).load()
    assert back["rng"][0] == state["rng"][0] and np.array_equal(back["rng"][1], state["rng"][1])
    assert back["best"][Budget.parse(10)] == (0.1, 1, None)
    acc, step, r = back["best"][Budget.parse(0.05)]
    assert (acc, step, r.shapes) == (0.5, 3, region.shapes) and torch.equal(r.indices["w"], region.indices["w"])
    assert back["mean"] == np.float32(0.25) and back["mean"].dtype == np.float32
    assert back["history"] == state["history"]
