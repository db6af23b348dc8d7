"""What a run writes, where, and what it reads from paths (docs/reliability.md §19; issues 77 and 81): no output
replaces an input of its own run, the GGUF writer commits without replacing, a write that fails without a reason is
named, files that are no regular file are refused before they are opened, a killed conversion's leftovers are swept,
searches finish, an empty ``SKILLGRAFT_CACHE`` is unset, one precision rule for every exporter, an identical pair is
nothing to graft."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from badinputs import invoke, one_line, snapshot

from skillgraft.errors import SkillgraftError


@contextlib.contextmanager
def unblocked(*fifos: Path, after: float = 20.0):
    """If a reader still blocks on a FIFO ``after`` seconds in (the guard failed), open its other end, again and again,
    from another process (the blocked reader may hold the GIL: safetensors' open), so the test fails, not hangs."""
    opens = " ".join(f": > '{f}';" for f in fifos)
    helper = subprocess.Popen(["sh", "-c", f"sleep {after}; while true; do {opens} sleep 0.2; done"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        helper.kill()
        helper.wait()


def _graft_on(tiny_graft: Path, base: str, where: Path) -> Path:
    """A copy of the tiny graft that records ``base`` as the base it was learned on."""
    shutil.copytree(tiny_graft, where)
    cfg = json.loads((where / "graft_config.json").read_text())
    cfg["base_model"] = base
    (where / "graft_config.json").write_text(json.dumps(cfg))
    return where


# ---------------------------------------------------------------------------------------------- own inputs
@pytest.mark.parametrize("verb", ["export-hf", "export-delta", "apply-export"])
def test_an_export_never_replaces_the_grafts_recorded_base(verb, tiny_graft, tiny_bert, tmp_path):
    """`export --to hf --out BASE --overwrite` (no --model: the recorded base is read) replaced the base, and the graft
    could never be applied again; refused before any work whatever the exporter."""
    base = tmp_path / "base"
    shutil.copytree(tiny_bert, base)
    graft = _graft_on(tiny_graft, str(base), tmp_path / "g")
    args = {"export-hf": ["export", graft, "--to", "hf", "--out", base],
            "export-delta": ["export", graft, "--to", "delta", "--out", base],
            "apply-export": ["apply", graft, "--export", base, "--evaluate-on", ""]}[verb]
    before = snapshot(tmp_path)
    line = one_line(invoke(*args, "--overwrite"), str(base), "graft_config.json base_model", "itself")
    assert "never replaces an input" in line
    assert snapshot(tmp_path) == before


def test_a_gguf_export_never_replaces_its_base_file_nor_a_hard_link_to_it(tiny_graft, tmp_path):
    """The GGUF case (issue 77): `export --to gguf --out BASE.gguf --overwrite` onto the graft's recorded base file,
    exit 0 and the base gone; also under another name (a hard link) and as `apply --export`."""
    base = tmp_path / "base.gguf"
    base.write_bytes(b"GGUF not read: refused before")
    os.link(base, tmp_path / "alias.gguf")
    graft = _graft_on(tiny_graft, str(base), tmp_path / "g")
    before = snapshot(tmp_path)
    for args in (["export", graft, "--to", "gguf", "--out", base], ["export", graft, "--to", "gguf", "--out",
                 tmp_path / "alias.gguf"], ["apply", graft, "--export", base, "--evaluate-on", ""]):
        one_line(invoke(*args, "--overwrite"), "graft_config.json base_model", "is the output file")
    assert snapshot(tmp_path) == before


def test_apply_export_never_replaces_a_data_file_it_reads(tiny_graft, tiny_bert, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "x", "label": "1"}\n')
    graft = _graft_on(tiny_graft, str(tiny_bert), tmp_path / "g")
    cfg = json.loads((graft / "graft_config.json").read_text())
    cfg["metadata"]["user_data"] = {"data": str(rows)}
    (graft / "graft_config.json").write_text(json.dumps(cfg))
    one_line(invoke("apply", graft, "--export", rows, "--overwrite"), str(rows), "recorded --data", "itself")
    assert rows.read_text() == '{"text": "x", "label": "1"}\n'


def test_a_file_written_without_replace_refuses_one_that_appeared_meanwhile(tmp_path):
    """The GGUF writer's commit (atomic_path(replace=False)): two exports to one path both "succeeded", the second
    silently replacing the first; now the second is refused and the first left as it is."""
    from skillgraft.io import TargetExists, atomic_path

    out = tmp_path / "m.gguf"
    with pytest.raises(TargetExists, match="appeared while this command ran"):
        with atomic_path(out, replace=False) as tmp:
            tmp.write_text("second")
            out.write_text("first")  # another export finished meanwhile
    assert out.read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]
    with atomic_path(out, replace=True) as tmp:  # --overwrite
        tmp.write_text("second")
    assert out.read_text() == "second"


@pytest.fixture(scope="module")
def gguf_graft(tmp_path_factory):
    from tiny import tiny_gguf_graft

    root = tmp_path_factory.mktemp("gguf")
    path, graft, pre = tiny_gguf_graft(root / "base")
    graft.save_pretrained(root / "graft")
    return {"base": path, "graft": graft, "pre": pre, "dir": root / "graft"}


def test_the_gguf_writer_commits_without_replacing(gguf_graft, tmp_path):
    from skillgraft.export.gguf import export_gguf
    from skillgraft.io import TargetExists, atomic_path

    out = tmp_path / "m.gguf"
    real = atomic_path

    @contextlib.contextmanager
    def racing(path, **kw):  # another export puts its file in place while this one writes
        with real(path, **kw) as tmp:
            yield tmp
            Path(path).write_bytes(b"the first export")

    import skillgraft.export.gguf as g
    g.atomic_path, saved = racing, g.atomic_path
    try:
        with pytest.raises(TargetExists):
            export_gguf(gguf_graft["graft"], gguf_graft["pre"], out)
    finally:
        g.atomic_path = saved
    assert out.read_bytes() == b"the first export" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_a_file_size_limit_during_a_gguf_export_is_one_line_naming_the_file(gguf_graft, tmp_path):
    """RLIMIT_FSIZE (a full disk's twin) in a forked CLI: `[Errno None] None: None -> None` before (numpy's tofile
    loses errno); now the file and the cause, exit 2, nothing half-written."""
    from processes import start_main

    from skillgraft.models.loading import model_reference

    model_reference(str(gguf_graft["base"]))  # converted into this test's store first: the child only reads it
    out = tmp_path / "out" / "m.gguf"
    out.parent.mkdir()
    err = tmp_path / "err.txt"
    child = start_main(["export", gguf_graft["dir"], "--to", "gguf", "--out", out], err, rlimit_fsize=40_000)
    assert child.wait() == 2, err.read_text()
    text = err.read_text()
    lines = [x for x in text.splitlines() if x.startswith("error:")]
    assert lines == [f"error: {out}: file too large (the file-size limit, ulimit -f, is 40,000 bytes)"], text
    assert "Traceback" not in text and os.listdir(out.parent) == []


# ---------------------------------------------------------------------------------------------- special files
def test_the_guard_refuses_what_is_no_regular_file_before_opening_it(tmp_path):
    from skillgraft.untrusted import regular, regular_tree

    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    os.symlink("/dev/urandom", tmp_path / "m" / "model.safetensors")
    with unblocked(tmp_path / "pipe"):
        with pytest.raises(SkillgraftError, match=r"pipe: a named pipe, FIFO, not a regular file; refused before"):
            regular(tmp_path / "pipe")
    with pytest.raises(SkillgraftError, match=r"model.safetensors \(a link to /dev/urandom\): a character device"):
        regular_tree(tmp_path / "m")
    assert regular(tmp_path / "m" / "config.json") and regular(tmp_path / "missing")  # the caller says "not found"


@pytest.mark.parametrize("how", ["fifo-weights-finetuned", "urandom-weights-pretrained", "fifo-tokenizer"])
def test_a_model_folder_holding_a_fifo_or_device_is_refused_naming_the_file(how, tiny_classifier, tiny_bert, tmp_path):
    """A FIFO as a weight file blocked in open(), deaf to SIGTERM; a link to /dev/urandom gave "no such device"
    naming no file."""
    shutil.copytree(tiny_classifier, tmp_path / "ft")
    shutil.copytree(tiny_bert, tmp_path / "pre")
    folder, name = {"fifo-weights-finetuned": ("ft", "model.safetensors"),
                    "urandom-weights-pretrained": ("pre", "model.safetensors"),
                    "fifo-tokenizer": ("ft", "tokenizer.json")}[how]
    bad = tmp_path / folder / name
    bad.unlink(missing_ok=True)
    os.symlink("/dev/urandom", bad) if "urandom" in how else os.mkfifo(bad)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"text": f"film {i}", "label": ["bad", "good"][i % 2]})
                                              + "\n" for i in range(12)))
    with unblocked(bad):
        r = invoke("graft", "--finetuned", tmp_path / "ft", "--pretrained", tmp_path / "pre", "--data",
                   tmp_path / "r.jsonl", "--out", tmp_path / "g")
    one_line(r, str(bad), "not a regular file", "refused before opening it")
    assert not (tmp_path / "g").exists()


def test_a_dataset_folder_whose_arrow_file_is_a_fifo_is_refused(tmp_path):
    from skillgraft.data.spec import UserDataSpec

    ds = tmp_path / "ds"
    (ds / "train").mkdir(parents=True)
    (ds / "dataset_dict.json").write_text('{"splits": ["train"]}')
    os.mkfifo(ds / "train" / "data-00000-of-00001.arrow")
    with unblocked(ds / "train" / "data-00000-of-00001.arrow"):
        with pytest.raises(SkillgraftError, match=r"data-00000-of-00001.arrow: a named pipe, FIFO, not a regular"):
            UserDataSpec.build({"data": str(ds)}).load()


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_keep_data_that_is_a_fifo_or_a_device_is_refused_before_any_work(special, ft_run, toy_data, tmp_path):
    """Was "no such file" (and only once the search started)."""
    path = tmp_path / "sel.jsonl"
    if special == "fifo":
        os.mkfifo(path)
    else:
        path = Path(special)
    with unblocked(path) if special == "fifo" else contextlib.nullcontext():
        r = invoke("graft", "--finetuned", ft_run, "--out", tmp_path / "g", "--data-dir", toy_data, "--keep", 0.9,
                   "--keep-data", path)
    one_line(r, "--keep-data", str(path), "not a regular file")
    assert not (tmp_path / "g").exists()


# ---------------------------------------------------------------------------------------------- leftovers
def test_a_killed_gguf_conversion_is_swept_and_a_running_ones_is_kept(tmp_path, monkeypatch):
    """`kill -9` inside a conversion left `gguf-….tmp-<pid>` in the store for good; the next conversion sweeps what
    dead processes left (either naming), never a live process's work in progress."""
    from skillgraft.models import gguf

    store = tmp_path / "store"
    store.mkdir()
    live = subprocess.Popen(["sleep", "60"])
    try:
        dead = [f"gguf-tiny-0123456789abcdef.tmp-{2**22 + 7}", f".gguf-tiny-0123456789abcdef.{2**22 + 7}-x1.tmp",
                f".assemble-{2**22 + 7}"]
        kept = f"gguf-other-0123456789abcdef.tmp-{live.pid}"
        for name in [*dead, kept]:
            (store / name).mkdir()
            (store / name / "model.safetensors").write_bytes(b"half")
        monkeypatch.setattr(gguf, "_convert", lambda path, out: (out / "model.safetensors").write_bytes(b"whole"))
        gguf._materialize(tmp_path / "m.gguf", store / "gguf-tiny-0123456789abcdef", {"quantized": False,
                          "quantization": "F32", "architecture": "gemma3", "tensors": 1}, "0" * 64, "m.gguf")
        assert sorted(p.name for p in store.iterdir()) == sorted(["gguf-tiny-0123456789abcdef", kept])
    finally:
        live.kill()
        live.wait()


# ---------------------------------------------------------------------------------------------- searches
def test_a_keep_tolerance_that_cannot_finish_is_refused_naming_the_range(ft_run, toy_data, tmp_path):
    """`--keep-tolerance 1e-20` was taken and searched past a minute (the walk's ratio rounded to 1: it never
    ended)."""
    r = invoke("graft", "--finetuned", ft_run, "--out", tmp_path / "g", "--data-dir", toy_data, "--keep", 0.9,
               "--keep-tolerance", 1e-20)
    one_line(r, "--keep-tolerance", "[0.01, 1]", "1e-20")
    from skillgraft.keep.stats.bound import Outcome  # noqa: F401 - the library refuses it too, at once
    from skillgraft.keep.search import search_keep

    with pytest.raises(SkillgraftError, match=r"tolerance 1e-20"):
        search_keep(lambda k: 1.0, 1.0, [0.9], 1000, tolerance=1e-20, confidence=0.9)


# ---------------------------------------------------------------------------------------------- environment
def test_an_empty_skillgraft_cache_is_unset(monkeypatch):
    """`SKILLGRAFT_CACHE=` wrote store entries into the current folder; empty now means unset (runs/cache), for the
    store and for GGUF conversions alike."""
    from skillgraft.models.gguf import store_root
    from skillgraft.pipeline.store import Store

    for value in ("", "  "):
        monkeypatch.setenv("SKILLGRAFT_CACHE", value)
        assert Store().root == Path("runs") / "cache" == store_root()


# ---------------------------------------------------------------------------------------------- precision
@pytest.mark.parametrize("to", ["peft", "delta", "hf", "apply"])
def test_every_exporter_takes_an_fp32_graft_on_its_base_in_bf16_with_one_warning(to, tiny_graft, tiny_bert, tmp_path):
    """PEFT / delta / GGUF refused it blaming "a different base" while `apply --export` and `--to hf` accepted it
    with a warning: one rule (Graft.apply's) for all."""
    out = tmp_path / "e"
    args = (["apply", tiny_graft, "--model", tiny_bert, "--export", out, "--evaluate-on", ""] if to == "apply"
            else ["export", tiny_graft, "--model", tiny_bert, "--to", to, "--out", out])
    import warnings

    with warnings.catch_warnings(record=True) as said:  # the CLI prints each as one `warning:` line
        warnings.simplefilter("always")
        r = invoke(*args, "--precision", "bf16")
    assert r.exit_code == 0, r.output
    assert len([w for w in said if "in fp32; applied to the same base in bf16" in str(w.message)]) == 1, said
    assert out.is_dir()


def test_the_gguf_exporter_takes_an_fp32_graft_on_its_base_in_bf16(gguf_graft, tmp_path):
    import torch

    from skillgraft.export.gguf import export_gguf

    from skillgraft.models import build_scorer

    bf16 = build_scorer(str(gguf_graft["base"]), "SST-2", "causal").to(torch.bfloat16)
    with pytest.warns(UserWarning, match="applied to the same base in bf16"):
        summary = export_gguf(gguf_graft["graft"], bf16, tmp_path / "m.gguf", model=str(gguf_graft["base"]))
    assert summary["exact"] and (tmp_path / "m.gguf").is_file()


# ---------------------------------------------------------------------------------------------- identity
def test_a_finetuned_model_identical_to_the_pretrained_is_nothing_to_graft(tiny_classifier, tmp_path):
    """Was a "graft" at rc 0 without a word (merge refuses such a model)."""
    shutil.copytree(tiny_classifier, tmp_path / "copy")
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"text": f"film {i}", "label": ["bad", "good"][i % 2]})
                                              + "\n" for i in range(12)))
    r = invoke("graft", "--finetuned", tmp_path / "copy", "--pretrained", tiny_classifier, "--data",
               tmp_path / "r.jsonl", "--out", tmp_path / "g")
    one_line(r, "same weights as --pretrained", "nothing to graft")
    assert not (tmp_path / "g").exists()
