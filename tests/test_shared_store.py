"""Shared stores and crashes (docs/reliability.md §17): runs sharing one store compute each entry once and both
finish with the solo result; a verb that reads its output before writing it (``continual add``) rolls back an
interrupted replacement before reading, so a kill at the swap point loses nothing."""

from __future__ import annotations

import json
import shutil
import threading

import pytest
from badinputs import invoke
from processes import start_main

from skillgraft.pipeline.store import Store


def test_two_runs_filling_one_store_entry_compute_it_once_and_both_get_it(tmp_path):
    """A second fetch of an entry being computed waits for it (before: it computed it too, and the first to finish
    deleted the other's resume folder, which then died saving its state there)."""
    from skillgraft.resume import checkpoint

    store, key = Store(tmp_path / "store"), {"x": 1}
    started, go, calls, results, errors = threading.Event(), threading.Event(), [], {}, []

    def make(folder, who):
        calls.append(who)
        started.set()
        go.wait(10)
        saved = checkpoint("localize", {"steps": 2})  # a long loop saves its state in the entry's resume folder
        saved.save({"step": 1})
        (folder / "result.txt").write_text(f"computed by {who}")

    def run(who):
        try:
            results[who] = store.fetch("regions", key, lambda folder: make(folder, who), "t")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting for the entry, not computing it
    go.set()
    first.join(10)
    second.join(10)
    assert not errors, errors
    assert calls == ["first"] and results["first"] == results["second"]
    assert (results["second"] / "result.txt").read_text() == "computed by first"
    assert sorted(p.name for p in store.root.iterdir()) == [results["first"].name]  # no lock, no resume left


def test_newest_finds_an_entry_by_kind_and_label_whatever_its_key(tmp_path):
    """Store.newest: the finished entry (key.json written) of a kind and label, the resume folder of one being computed
    with finished=False, neither for a longer label sharing the prefix (the progress reports' one way to find them)."""
    import os

    from skillgraft.resume import checkpoint

    store = Store(tmp_path)
    assert store.newest("regions", "SST-2-64-13-learned") is None
    old = store.fetch("regions", {"x": 1}, lambda f: None, "SST-2-64-13-learned")
    new = store.fetch("regions", {"x": 2}, lambda f: None, "SST-2-64-13-learned")
    os.utime(old, (1, 1))
    store.fetch("regions", {"x": 3}, lambda f: None, "SST-2-64-13-learned-more")  # a longer label
    store.fetch("paper-rows", {"x": 1}, lambda f: None, "SST-2-64-13-learned")  # another kind
    assert store.entries("regions", "SST-2-64-13-learned") == [old, new]  # oldest first; not the longer label's
    assert store.newest("regions", "SST-2-64-13-learned") == new
    assert store.newest("regions", "SST-2-64-13-learned", finished=False) is None

    def stop(folder):  # a loop that saved its state, then was stopped
        checkpoint("localize", {}).save({"step": 1})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.fetch("regions", {"x": 4}, stop, "SST-2-64-42-learned")
    assert store.newest("regions", "SST-2-64-42-learned") is None  # no half entry taken for a finished one
    resume = store.newest("regions", "SST-2-64-42-learned", finished=False)
    assert resume == store.resume_path("regions", {"x": 4}, "SST-2-64-42-learned")
    assert (resume / "localize-0.pt").is_file()


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(tmp_path):
    """``kill -9`` releases the lock (the kernel drops it): the lock file it leaves is taken and deleted."""
    store = Store(tmp_path / "store")
    path = store.path("regions", {"x": 1}, "t")
    store.root.mkdir()
    (store.root / f".{path.name}.lock").write_text("")  # what a killed holder leaves
    got = store.fetch("regions", {"x": 1}, lambda folder: (folder / "r").write_text("ok"), "t")
    assert (got / "r").read_text() == "ok" and sorted(p.name for p in store.root.iterdir()) == [path.name]


def test_two_graft_commands_on_one_store_at_once_both_finish_with_the_solo_result(ft_run, toy_data, tmp_path,
                                                                                   monkeypatch):
    """Two processes: the same `skillgraft graft` on one --cache at once, saving state after every step."""
    from badinputs import graft_args

    monkeypatch.setenv("SKILLGRAFT_CHECKPOINT_SECONDS", "0")
    r = invoke(*graft_args(ft_run, toy_data, tmp_path / "solo", tmp_path / "solo-store", "--steps", 6))
    assert r.exit_code == 0, r.output
    children = [start_main(graft_args(ft_run, toy_data, tmp_path / f"g{i}", tmp_path / "store", "--steps", 6),
                           tmp_path / f"err{i}.txt") for i in (1, 2)]
    for i, child in zip((1, 2), children):
        err = (tmp_path / f"err{i}.txt")
        assert child.wait() == 0, err.read_text()[-2000:]
        assert "Traceback" not in err.read_text()
    reference = (tmp_path / "solo" / "grafts" / "budget-0.05" / "graft.safetensors").read_bytes()
    for i in (1, 2):
        assert (tmp_path / f"g{i}" / "grafts" / "budget-0.05" / "graft.safetensors").read_bytes() == reference
    assert not [p.name for p in (tmp_path / "store").iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------------------------------------- crash, then rerun
@pytest.fixture(scope="module")
def one_task_state(tiny_bert, tiny_graft, tmp_path_factory):
    from tiny import write_sentiment_data

    from skillgraft.graft.graft import Graft

    root = tmp_path_factory.mktemp("continual-crash")
    write_sentiment_data(root / "data", "SST-2", seed=0)
    write_sentiment_data(root / "data", "cr", seed=1)
    Graft.from_pretrained(tiny_graft).region.save(root / "region")
    assert invoke(*_add(root, root / "state", "SST-2", tiny_bert)).exit_code == 0
    return root


def _add(root, state, task, tiny_bert):
    return ("continual", "add", "--state", state, "--task", task, "--k", 4, "--model", tiny_bert, "--region",
            root / "region", "--steps", 1, "--test-limit", 4, "--data-dir", root / "data")


def _tasks(state):
    return [e["task"] for e in json.loads((state / "continual.json").read_text())["tasks"]]


def test_continual_add_killed_at_the_swap_point_then_rerun_loses_no_task(one_task_state, tiny_bert, tmp_path):
    """``kill -9`` of `continual add` between moving the old state aside and putting the new one in place, then
    the same command: the old state is rolled back before it is read (before: read as absent, task 1 lost)."""
    root = one_task_state
    shutil.copytree(root / "state", tmp_path / "state")
    child = start_main(_add(root, tmp_path / "state", "cr", tiny_bert), tmp_path / "err.txt",
                       {"SKILLGRAFT_CRASH_AT": "dir-swapped:state"})
    assert child.wait() == -9, (tmp_path / "err.txt").read_text()[-2000:]  # killed at the swap point
    assert not (tmp_path / "state").exists() and (tmp_path / ".state.old").is_dir()
    r = invoke(*_add(root, tmp_path / "state", "cr", tiny_bert))  # the same command again
    assert r.exit_code == 0, r.output
    assert _tasks(tmp_path / "state") == ["SST-2", "cr"]
    assert not (tmp_path / ".state.old").exists()


def test_continual_show_after_a_kill_at_the_swap_point_shows_the_old_state(one_task_state, tmp_path):
    shutil.copytree(one_task_state / "state", tmp_path / ".state.old")  # what the kill leaves
    r = invoke("continual", "show", tmp_path / "state")
    assert r.exit_code == 0, r.output
    assert _tasks(tmp_path / "state") == ["SST-2"]


def test_two_continual_adds_on_one_state_at_once_keep_both_tasks(one_task_state, tiny_bert, tmp_path):
    """Both read the state and the last to finish replaced it: one task was lost. Now the second waits for the
    first and adds its task to the state the first wrote."""
    from tiny import write_sentiment_data

    root = one_task_state
    shutil.copytree(root / "state", tmp_path / "state")
    shutil.copytree(root / "data", tmp_path / "data")
    write_sentiment_data(tmp_path / "data", "mr", seed=2)
    args = [[*_add(root, tmp_path / "state", t, tiny_bert)] for t in ("cr", "mr")]
    for a in args:
        a[a.index("--data-dir") + 1] = tmp_path / "data"
    children = [start_main(a, tmp_path / f"err-{i}.txt") for i, a in enumerate(args)]
    for i, child in enumerate(children):
        assert child.wait() == 0, (tmp_path / f"err-{i}.txt").read_text()[-2000:]
    tasks = _tasks(tmp_path / "state")
    assert tasks[0] == "SST-2" and sorted(tasks[1:]) == ["cr", "mr"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
