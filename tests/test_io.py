"""skillgraft.io: no verb deletes or replaces what it was not told to (concurrent writers, outputs that hold their
own inputs or store); docs/reliability.md §2."""

from __future__ import annotations

import os
import shutil

import pytest
from badinputs import graft_args, invoke, one_line, refused, snapshot

import skillgraft.io as sio
from skillgraft import renames
from skillgraft.errors import SkillgraftError
from skillgraft.io import TargetExists, atomic_dir, check_apart, rename_noreplace
from skillgraft.pipeline.store import Store


# ---------------------------------------------------------------------------------------------- atomic_dir
@pytest.mark.parametrize("what", ["folder with a file", "empty folder", "file"])
def test_atomic_dir_never_replaces_a_target_that_appeared_meanwhile(what, tmp_path):
    target = tmp_path / "out"
    with pytest.raises(TargetExists, match="appeared while this command ran"):
        with atomic_dir(target) as tmp:
            (tmp / "ours.txt").write_text("ours")
            if what == "file":  # another writer finishes first
                target.write_text("theirs")
            else:
                target.mkdir()
                if what == "folder with a file":
                    (target / "theirs.txt").write_text("theirs")
    if what == "file":
        assert target.read_text() == "theirs"
    else:
        assert sorted(p.name for p in target.iterdir()) == (["theirs.txt"] if what == "folder with a file" else [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary sibling left


def test_atomic_dir_with_overwrite_still_replaces(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target, overwrite=True) as tmp:
        (tmp / "ours.txt").write_text("ours")
        target.mkdir()
        (target / "theirs.txt").write_text("theirs")
    assert sorted(p.name for p in target.iterdir()) == ["ours.txt"]


@pytest.mark.parametrize("native", [True, False])
def test_rename_noreplace(native, tmp_path, monkeypatch):
    if not native:  # a system without renameat2: the check-then-rename fallback
        monkeypatch.setattr(renames, "_renameat2_fn", None)
    src, dst = tmp_path / "a", tmp_path / "b"
    src.mkdir()
    dst.mkdir()  # an empty folder: a plain rename(2) would replace it
    with pytest.raises(FileExistsError):
        rename_noreplace(src, dst)
    assert src.is_dir() and dst.is_dir()
    dst.rmdir()
    rename_noreplace(src, dst)
    assert dst.is_dir() and not src.exists()


def test_store_keeps_an_entry_another_process_finished_first(tmp_path):
    store = Store(tmp_path / "store")
    key = {"x": 1}

    def make(folder):  # a concurrent process puts the same entry in place while this one computes it
        (folder / "value.txt").write_text("mine")
        theirs = store.path("k", key)
        theirs.mkdir(parents=True)
        (theirs / "value.txt").write_text("theirs")
        (theirs / "key.json").write_text("{}")

    path = store.fetch("k", key, make)
    assert (path / "value.txt").read_text() == "theirs"
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [path.name]


def test_two_concurrent_exports_the_second_fails_and_the_first_survives(tiny_graft, tiny_bert, toy_data,  # noqa: F811
                                                                        tmp_path, monkeypatch):
    """Two `apply --export DIR` at once: the first finishes (and the user adds a file to DIR) while the second
    writes; the second must not replace DIR (before: it did, exit 0, the user's file deleted)."""
    target, first = tmp_path / "exp", tmp_path / "first"
    r = invoke("apply", tiny_graft, "--model", tiny_bert, "--export", first, "--evaluate-on", "")
    assert r.exit_code == 0, r.output
    (first / "notes.txt").write_text("mine")
    before = snapshot(first)

    def first_finishes(point, path):  # while the second command writes, the first one's DIR appears
        if point == "dir-written" and path.name == "exp" and first.exists():
            first.rename(target)

    monkeypatch.setattr(sio, "crash_point", first_finishes)
    r = invoke("apply", tiny_graft, "--model", tiny_bert, "--export", target, "--evaluate-on", "")
    one_line(r, str(target), "appeared while this command ran")
    assert snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]


# ---------------------------------------------------------------------------------------------- nested targets
def test_check_apart(tmp_path):
    out = tmp_path / "x"
    check_apart(out, {"--cache": tmp_path / "store", "--data": tmp_path / "missing/inside/x", "--model": None})
    with pytest.raises(SkillgraftError, match=r"--cache .*/x/store is inside the output folder"):
        check_apart(out, {"--cache": out / "store"})  # a store not made yet
    (out / "run").mkdir(parents=True)
    with pytest.raises(SkillgraftError, match=r"--finetuned .*/run is inside the output folder"):
        check_apart(out, {"--finetuned": out / "sub" / ".." / "run"})
    with pytest.raises(SkillgraftError, match="is the output folder .* itself"):
        check_apart(out, {"--finetuned": out})
    link = tmp_path / "link"
    link.symlink_to(out / "run")
    with pytest.raises(SkillgraftError, match="inside the output folder"):
        check_apart(out, {"--finetuned": link})  # through a link
    check_apart(out / "run" / "graft", {"--finetuned": out / "run"})  # an output inside an input is fine


def test_graft_refuses_a_store_inside_its_output(ft_run, toy_data, tmp_path):  # noqa: F811
    """`graft --cache X/store --out X` exited 0 and deleted the store it had filled."""
    out = tmp_path / "x"
    refused(tmp_path, graft_args(ft_run, toy_data, out, out / "store"), "--cache", "inside the output folder", out)


def test_graft_overwrite_refuses_an_output_that_holds_its_input(ft_run, toy_data, tmp_path):  # noqa: F811
    outer = ft_run.parent
    line = one_line(invoke(*graft_args(ft_run, toy_data, outer, tmp_path / "store", "--overwrite")),
                    "--finetuned", "inside the output folder")
    assert str(ft_run) in line and (ft_run / "config.json").is_file()


def test_sweep_refuses_the_default_store_inside_its_output(ft_run, toy_data, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SKILLGRAFT_CACHE", str(tmp_path / "runs" / "cache"))
    refused(tmp_path, ("sweep", "--finetuned", ft_run, "--out", tmp_path / "runs", "--data-dir", toy_data),
            "--cache", "inside the output folder")


def test_export_refuses_to_replace_the_graft_it_reads(tiny_graft, tiny_bert, tmp_path):  # noqa: F811
    before = snapshot(tiny_graft)
    one_line(invoke("export", tiny_graft, "--model", tiny_bert, "--out", tiny_graft, "--overwrite"),
             "graft", "is the output folder", "itself")
    one_line(invoke("apply", tiny_graft, "--model", tiny_bert, "--export", tiny_graft.parent, "--overwrite",
                    "--evaluate-on", ""), "graft", "inside the output folder")
    assert snapshot(tiny_graft) == before


def test_finetune_refuses_its_data_inside_its_output(tiny_bert, toy_data, tmp_path):
    data = tmp_path / "x" / "data"
    shutil.copytree(toy_data, data)
    refused(tmp_path, ("finetune", "--task", "SST-2", "--k", 8, "--model", tiny_bert, "--data-dir", data,
                       "--out", tmp_path / "x", "--overwrite", "--steps", 1), "--data-dir", "inside the output")


def test_run_recipe_refuses_its_store_inside_its_output(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"recipe: graft\ncache_dir: {tmp_path / 'out' / 'cache'}\n")
    refused(tmp_path, ("run", recipe, "--out", tmp_path / "out"), "--cache", "inside the output folder")


def test_continual_refuses_its_store_inside_the_state(toy_data, tmp_path):
    refused(tmp_path, ("continual", "add", "--state", tmp_path / "st", "--task", "SST-2", "--data-dir", toy_data,
                       "--cache", tmp_path / "st" / "cache"), "--cache", "inside the output folder")


def test_merge_refuses_its_store_inside_its_output(tmp_path):
    from skillgraft.verbs.merge_inputs import ModelInput, merge_inputs

    with pytest.raises(SkillgraftError, match="--cache .* inside the output folder"):
        sio.check_target(tmp_path / "m", False, merge_inputs("pre", [ModelInput("a"), ModelInput("b")],
                                                             Store(tmp_path / "m" / "cache")))
    data = tmp_path / "m" / "d.jsonl"
    data.parent.mkdir()
    data.write_text("")
    from skillgraft.data.spec import UserDataSpec

    with pytest.raises(SkillgraftError, match="--data 2 .* inside the output folder"):
        sio.check_target(tmp_path / "m", True, merge_inputs("pre", [ModelInput("a"),
                                                                    ModelInput("b", UserDataSpec(data=data))]))
    assert os.path.isfile(data)


# ---------------------------------------------------------------------------------------------- paths named right
def test_path_problem_says_what_is_wrong(tmp_path):
    from skillgraft.io import path_problem

    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    (tmp_path / "dangling").symlink_to("nowhere")
    (tmp_path / "f").write_text("x")
    assert path_problem(tmp_path / "f") is None and path_problem(tmp_path, "folder") is None
    assert path_problem(tmp_path / "missing") == "not found"
    assert "symbolic link loop" in path_problem(tmp_path / "loop1")
    assert "broken symbolic link (to nowhere" in path_problem(tmp_path / "dangling")
    assert path_problem(tmp_path) == "a folder, not a file"
    assert path_problem(tmp_path / "f", "folder") == "a file, not a folder"
    assert "a folder on its path is a file" in path_problem(tmp_path / "f" / "x")


@pytest.mark.parametrize("args, culprits", [
    (["run", "{d}"], ["{d}: a folder, not a file"]),
    (["run", "{loop}"], ["{loop}: a symbolic link loop"]),
    (["tasks", "--task-file", "{d}"], ["{d}: a folder, not a file", "task file"]),
    (["tasks", "--task-file", "{loop}"], ["{loop}: a symbolic link loop"]),
    (["evaluate", "{tiny_bert}", "--mode", "prompt", "--data", "{loop}"], ["{loop}: a symbolic link loop", "data file"]),
    (["graft", "--finetuned", "{loop}", "--out", "{tmp}/g"], ["{loop}: a symbolic link loop", "fine-tuning run"]),
    (["graft", "--finetuned", "{loop}"], ["{loop} is a symbolic link loop"]),
])
def test_folders_and_link_loops_are_not_called_not_found(args, culprits, tiny_bert, tmp_path):
    work, links = tmp_path / "w", tmp_path / "l"  # the loop outside the folder compared byte for byte
    (work / "d").mkdir(parents=True)
    links.mkdir()
    (links / "loop1").symlink_to("loop2")
    (links / "loop2").symlink_to("loop1")
    names = {"d": work / "d", "loop": links / "loop1", "tiny_bert": tiny_bert, "tmp": work}
    line = refused(work, [a.format(**names) for a in args], *[c.format(**names) for c in culprits])
    assert "not found" not in line


@pytest.mark.parametrize("out", [".", ".."])
def test_overwrite_of_the_current_folder_or_one_holding_it_is_refused_before_any_work(out, tmp_path, monkeypatch):
    """`graft --out .. --overwrite` ran to the end and then failed `.. → ....old: device or resource busy`."""
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    with pytest.raises(SkillgraftError, match="is the current folder or holds it"):
        sio.check_target(out, overwrite=True)
    sio.check_target(tmp_path / "other", overwrite=True)
