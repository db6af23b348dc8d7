"""Files skillgraft reads never run code and never lead it outside their folder (docs/reliability.md §13, §14).

A resume state is a file in a hidden folder beside the output or in the store: anyone who can write there can plant
a pickle. It is read with ``torch.load(weights_only=True)``: the planted file is refused, named, and never run.
Paths recorded in a file skillgraft wrote (a continual state's task folders, a routed folder's skills and base)
resolve inside that folder, or the file is refused by name before anything is read or written."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

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
    folder = tmp_path / "store" / ".regions-SST-2-8-13-learned-0123456789ab.resume"
    _plant(folder / "localize-0.pt", marker)
    _plant(folder / "localize-1.rank1.1.pt", marker)  # a rank's file of a sharded save goes through the same reader
    with resume_point(folder):
        assert checkpoint("localize", {"steps": 6}).load() is None
    assert not marker.exists()
    assert "localize-0.pt: holds objects other than tensors" in capsys.readouterr().err
    from skillgraft.resume import _read

    assert _read(folder / "localize-1.rank1.1.pt")[0] is None and not marker.exists()


def test_the_bench_status_report_reads_a_planted_resume_file_without_running_it(tmp_path):
    """bench/gemma_paper_schedule.py --status reports a stopped loop's step from its saved state: read as a resume
    reads it (skillgraft.resume.saved_state), so a planted pickle counts as no saved state and never runs."""
    import sys

    from skillgraft.recipes import load_recipe
    from skillgraft.resume import checkpoint, resume_point, saved_state

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import gemma_paper_schedule as runner

    _, spec = load_recipe(Path(__file__).resolve().parents[1] / "bench" / "fidelity" / "gemma-schedule-64.yaml")
    marker, store = tmp_path / "code-ran", tmp_path / "store"
    _plant(store / f".regions-SST-2-{spec.k}-13-learned-0123456789ab.resume" / "localize-0.pt", marker)
    _plant(store / f".paper-rows-SST-2-{spec.k}-13-{spec.mode}-0123456789ab.resume" / "compare-0.pt", marker)
    out = runner.grafts_progress(store, spec, "SST-2", 13)
    assert not marker.exists()
    assert out["localize"]["step"] == 0 and out["rows"]["done"] == 0
    with resume_point(tmp_path / "real"):  # a state the loop saved reads back whole
        checkpoint("localize", {}).save({"step": 7, "step_times": [2.0, 4.0]})
    assert saved_state(tmp_path / "real" / "localize-0.pt")["step"] == 7


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


# ---------------------------------------------------------------------------------------------- paths inside files
@pytest.fixture(scope="module")
def two_task_data(tmp_path_factory):
    from tiny import write_sentiment_data

    root = tmp_path_factory.mktemp("two-tasks")
    write_sentiment_data(root, "SST-2", seed=0)
    write_sentiment_data(root, "cr", seed=1)
    return root


@pytest.fixture(scope="module")
def continual_state(tiny_bert, tiny_graft, two_task_data, tmp_path_factory):
    """A continual state folder of one task (SST-2), its region given (no store stages)."""
    from skillgraft.graft.graft import Graft

    root = tmp_path_factory.mktemp("continual")
    Graft.from_pretrained(tiny_graft).region.save(root / "region")
    r = invoke(*_continual_add(root / "state", "SST-2", tiny_bert, root / "region", two_task_data))
    assert r.exit_code == 0, r.output
    return root


def _continual_add(state, task, tiny_bert, region, data):
    return ("continual", "add", "--state", state, "--task", task, "--k", 4, "--model", tiny_bert, "--region", region,
            "--steps", 1, "--test-limit", 4, "--data-dir", data)


STATE_PATHS = {
    # id: (field of the first task entry, value)
    "owned-up-and-out": ("owned", "../x"),
    "region-up-and-out": ("region", "../../elsewhere/region"),
    "owned-absolute": ("owned", "{tmp}/planted"),
    "region-the-state-itself": ("region", "."),
}


@pytest.mark.parametrize("case", list(STATE_PATHS))
def test_a_continual_state_naming_folders_outside_itself_is_refused_before_any_work(case, continual_state, tiny_bert,
                                                                                    two_task_data, tmp_path):
    import shutil

    field, value = STATE_PATHS[case]
    value = value.replace("{tmp}", str(tmp_path))
    shutil.copytree(continual_state, tmp_path / "c")
    state, meta = tmp_path / "c" / "state", tmp_path / "c" / "state" / "continual.json"
    record = json.loads(meta.read_text())
    record["tasks"][0][field] = value
    meta.write_text(json.dumps(record))
    before = snapshot(tmp_path)
    r = invoke(*_continual_add(state, "cr", tiny_bert, tmp_path / "c" / "region", two_task_data))
    one_line(r, str(meta), f"tasks.0.{field}", repr(value), "outside")
    assert snapshot(tmp_path) == before
    one_line(invoke("continual", "show", state), str(meta), f"tasks.0.{field}")


def test_a_continual_state_whose_task_entry_is_damaged_is_one_line(continual_state, tmp_path):
    import shutil

    shutil.copytree(continual_state, tmp_path / "c")
    meta = tmp_path / "c" / "state" / "continual.json"
    record = json.loads(meta.read_text())
    for damage, says in ((lambda t: t.__setitem__(0, "SST-2"), "'tasks.0' must be a task entry"),
                         (lambda t: t[0].pop("task"), "'tasks.0.task' must be a task name"),
                         (lambda t: t[0].__setitem__("region", 7), "'tasks.0.region' must be a relative path")):
        tasks = json.loads(json.dumps(record["tasks"]))
        damage(tasks)
        meta.write_text(json.dumps({**record, "tasks": tasks}))
        one_line(invoke("continual", "show", tmp_path / "c" / "state"), str(meta), says)


@pytest.fixture(scope="module")
def routed_folder(tiny_bert, tiny_graft, tmp_path_factory):
    from skillgraft.graft.graft import Graft
    from skillgraft.graft.routed import write_routed
    from skillgraft.models.scorer import build_scorer

    folder = tmp_path_factory.mktemp("routed") / "routed"
    folder.mkdir()
    write_routed(folder, build_scorer(str(tiny_bert), "SST-2", "head"), {"SST-2": Graft.from_pretrained(tiny_graft)},
                 {"SST-2": ["0", "1"]})
    return folder


ROUTED_DAMAGE = {
    # id: (change to routed.json, culprits)
    "base-absolute": (lambda r: r.update(base="/usr/lib"), ["field 'base'", "'/usr/lib'", "outside"]),
    "base-up-and-out": (lambda r: r.update(base="../base"), ["field 'base'", "'../base'", "outside"]),
    "skill-up-and-out": (lambda r: r["tasks"]["SST-2"].update(path="../../g"), ["tasks.SST-2.path", "outside"]),
    "skill-absolute": (lambda r: r["tasks"]["SST-2"].update(path="/tmp/g"), ["tasks.SST-2.path", "outside"]),
    "not-json": ("{", ["not valid JSON"]),
    "a-list": ("[]", ["expected a JSON object, got list"]),
    "no-tasks": (lambda r: r.pop("tasks"), ["missing field(s) ['tasks']"]),
    "no-base": (lambda r: r.pop("base"), ["missing field(s) ['base']"]),
    "tasks-a-list": (lambda r: r.update(tasks=["SST-2"]), ["field 'tasks' must be an object"]),
    "skill-without-path": (lambda r: r["tasks"]["SST-2"].pop("path"), ["tasks.SST-2.path", "relative path"]),
    "labels-a-string": (lambda r: r["tasks"]["SST-2"].update(labels="0,1"), ["tasks.SST-2.labels"]),
    "label-words-too-few": (lambda r: r["tasks"]["SST-2"].update(label_words=["great"]),
                            ["tasks.SST-2.label_words", "one word per label (2)"]),
    "label-words-not-words": (lambda r: r["tasks"]["SST-2"].update(label_words=[1, " "]),
                              ["tasks.SST-2.label_words"]),
    "other-format": (lambda r: r.update(format="x"), ["field 'format'"]),
}


@pytest.mark.parametrize("case", list(ROUTED_DAMAGE))
def test_a_routed_folder_with_paths_outside_it_or_a_damaged_routed_json_is_refused_by_name(case, routed_folder,
                                                                                           tmp_path):
    import shutil

    from skillgraft.graft.routed import RoutedSkills

    change, culprits = ROUTED_DAMAGE[case]
    folder = tmp_path / "routed"
    shutil.copytree(routed_folder, folder)
    meta = folder / "routed.json"
    if isinstance(change, str):
        meta.write_text(change)
    else:
        record = json.loads(meta.read_text())
        change(record)
        meta.write_text(json.dumps(record))
    with pytest.raises(SkillgraftError) as e:
        RoutedSkills.from_pretrained(folder)
    for c in [str(meta), *culprits]:
        assert c in str(e.value), (c, str(e.value))


def test_an_intact_routed_folder_still_loads(routed_folder):
    from skillgraft.graft.routed import RoutedSkills

    assert RoutedSkills.from_pretrained(routed_folder).tasks == ["SST-2"]


@pytest.mark.parametrize("shard", ["../other/model-1.safetensors", "/etc/model-1.safetensors", 7])
def test_a_sharded_index_naming_a_file_outside_its_folder_is_refused(shard, tmp_path):
    from skillgraft.graft.localizers.machinery.source import _weight_files

    (tmp_path / "m").mkdir()
    index = tmp_path / "m" / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": "model-0.safetensors", "b.weight": shard}}))
    with pytest.raises(SkillgraftError, match="weight_map.b.weight") as e:
        _weight_files(tmp_path / "m")
    assert str(index) in str(e.value)


@pytest.mark.parametrize("budget", ["../../elsewhere", "/etc", 0.05])
def test_a_store_entry_summary_naming_folders_outside_the_entry_is_refused(budget, tmp_path):
    """A regions entry's summary.json lists its budgets, each the folder of its region inside the entry."""
    from skillgraft.pipeline.regions import _read_regions

    entry = tmp_path / "store" / "regions-x"
    entry.mkdir(parents=True)
    (entry / "summary.json").write_text(json.dumps({"budgets": [budget]}))
    with pytest.raises(SkillgraftError, match="budgets.0") as e:
        _read_regions(entry)
    assert str(entry / "summary.json") in str(e.value)


def test_a_resume_folder_planted_as_a_link_to_a_folder_outside_is_not_followed(tmp_path, capsys):
    """A `.<out>.resume` (or store entry's) that is a symbolic link: removed, nothing saved or read through it."""
    from skillgraft.resume import checkpoint, resume_point

    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "store" / ".regions-x.resume"
    folder.parent.mkdir()
    folder.symlink_to(outside)
    with resume_point(folder):
        checkpoint("localize", {"steps": 6}).save({"step": 1})
    assert os.listdir(outside) == [] and (folder / "localize-0.pt").is_file() and not folder.is_symlink()
    assert "a symbolic link where a resume folder should be" in capsys.readouterr().err


def test_a_lock_file_planted_as_a_link_is_not_followed(tmp_path):
    """A store's `.<entry>.lock` (also a continual state's, a GGUF conversion's) that is a link to a file outside:
    neither made nor opened there."""
    from skillgraft.locking import locked

    victim = tmp_path / "outside" / "victim"
    victim.parent.mkdir()
    link = tmp_path / "store" / ".entry.lock"
    link.parent.mkdir()
    link.symlink_to(victim)
    with locked(link):
        assert not link.is_symlink()
    assert not victim.exists()
