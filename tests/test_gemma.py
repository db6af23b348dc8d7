"""Gemma 3 and GGUF checkpoints (models/gguf.py) on tiny models: a random Gemma3ForCausalLM (sliding-window and
full-attention layers, tied embeddings) through finetune → graft → apply/export → PEFT → swap → merge, read back
with plain transformers / peft; a tiny GGUF written with the ``gguf`` package loads through the same path as the
real Gemma-3-270M; bad GGUF input is one line before any work. The real model runs in bench/ and in
tests/test_real_gemma.py (opt-in)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.data import load_split
from skillgraft.errors import SkillgraftError
from skillgraft.graft import Graft
from skillgraft.models import build_scorer, gguf
from skillgraft.models.loading import model_reference

runner = CliRunner()


def cli(*args, code: int = 0) -> str:
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, f"exit {r.exit_code} (wanted {code}): {r.output}\n{r.exception!r}"
    return r.output


@pytest.fixture(scope="module")
def gemma_run(tiny_models, toy_data, tmp_path_factory):
    """A tiny Gemma 3 fine-tuned in causal prompt mode by the CLI, and its graft report."""
    root = tmp_path_factory.mktemp("gemma")
    cli("finetune", "--model", tiny_models["gemma3"], "--mode", "causal", "--task", "SST-2", "--k", 8, "--seed", 13,
        "--optimizer", "adamw", "--lr", 3e-3, "--steps", 12, "--eval-every", 6, "--data-dir", toy_data,
        "--out", root / "ft")
    cli("graft", "--pretrained", tiny_models["gemma3"], "--finetuned", root / "ft", "--out", root / "graft",
        "--budgets", "0.01", "--steps", 4, "--eval-every", 2, "--data-dir", toy_data)
    return root


def test_gemma_finetune_and_graft_report(gemma_run):
    metrics = json.loads((gemma_run / "graft" / "metrics.json").read_text())
    models = {row["model"] for row in metrics["rows"]}
    assert {"pre-trained", "fine-tuned", "graft 0.01"} <= models
    ft = next(r for r in metrics["rows"] if r["kind"] == "ft")
    assert ft["density"] == pytest.approx(1.0)  # the body; frozen `embed_tokens` (and the tied head) not counted
    graft = Graft.from_pretrained(gemma_run / "graft" / "grafts" / "budget-0.01")
    assert graft.metadata.mode == "causal" and graft.size > 0
    assert all("embed_tokens" not in n and "lm_head" not in n for n in graft.region.indices)  # body only (tied)


def test_pretrained_must_be_the_runs_base(gemma_run, tiny_models, toy_data):
    out = cli("graft", "--pretrained", tiny_models["llama"], "--finetuned", gemma_run / "ft", "--out",
              gemma_run / "nope", "--data-dir", toy_data, code=2)
    assert "is not the model the run" in out and not (gemma_run / "nope").exists()


def _grafted(gemma_run, tiny_models):
    graft = Graft.from_pretrained(gemma_run / "graft" / "grafts" / "budget-0.01")
    scorer = build_scorer(str(tiny_models["gemma3"]), "SST-2", "causal")
    return graft, scorer


IDS = torch.arange(5, 29).view(3, 8)


def test_exported_checkpoint_reads_with_plain_transformers(gemma_run, tiny_models, tmp_path):
    import transformers

    graft, scorer = _grafted(gemma_run, tiny_models)
    graft.export(scorer, tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.tie_word_embeddings
    with torch.no_grad(), graft.applied(scorer):
        want = scorer.model(input_ids=IDS).logits
    with torch.no_grad():
        got = model(input_ids=IDS).logits
    assert torch.allclose(got, want, atol=1e-5)


def test_peft_adapter_reads_with_plain_peft(gemma_run, tiny_models, tmp_path):
    """The Gemma adapter through plain transformers + peft only (tied embedding included); a fresh interpreter
    without skillgraft reads an adapter in test_export.py::test_fresh_interpreter_reads_the_adapter_without_..."""
    import peft
    import transformers

    graft, scorer = _grafted(gemma_run, tiny_models)
    cli("export", gemma_run / "graft" / "grafts" / "budget-0.01", "--to", "peft", "--out", tmp_path / "adapter")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_models["gemma3"])
    model = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        read = model(input_ids=IDS).logits
        with model.disable_adapter():
            bare = model(input_ids=IDS).logits
        with graft.applied(scorer):
            want = scorer.model(input_ids=IDS).logits
    assert torch.allclose(read, want, atol=1e-5) and not torch.allclose(bare, want, atol=1e-5)


def test_skill_swap_on_gemma_restores_bit_exactly(gemma_run, tiny_models):
    """Apply one graft, switch to another, revert: every tensor (tied embedding included) is θ_pre's again."""
    graft, scorer = _grafted(gemma_run, tiny_models)
    gen = torch.Generator().manual_seed(0)
    other = dataclasses.replace(graft, values={n: v + torch.randn(v.shape, generator=gen)
                                               for n, v in graft.values.items()})
    before = {n: p.detach().clone() for n, p in scorer.named_parameters()}
    with torch.no_grad():
        outs = []
        for g in (graft, other, graft):
            with g.applied(scorer):
                outs.append(scorer.model(input_ids=IDS).logits)
    assert torch.equal(outs[0], outs[2]) and not torch.equal(outs[0], outs[1])
    assert all(torch.equal(p, before[n]) for n, p in scorer.named_parameters())
    assert scorer.model.lm_head.weight is scorer.model.model.embed_tokens.weight  # still tied


def test_merge_two_gemma_fine_tunes(gemma_run, tiny_models, toy_data, tmp_path):
    """skillgraft merge of two causal-mode Gemma fine-tunes (stitch only) reads back as a plain Gemma3ForCausalLM."""
    import transformers

    cli("finetune", "--model", tiny_models["gemma3"], "--mode", "causal", "--task", "SST-2", "--k", 8, "--seed", 21,
        "--optimizer", "adamw", "--lr", 3e-3, "--steps", 8, "--eval-every", 4, "--data-dir", toy_data,
        "--out", tmp_path / "ft2")
    data = toy_data / "SST-2" / "train.jsonl"
    out = tmp_path / "merged"
    cli("merge", "--pretrained", tiny_models["gemma3"], "--finetuned", gemma_run / "ft" / "model", "--finetuned",
        tmp_path / "ft2" / "model", "--data", data, "--data", data, "--mode", "causal", "--localizer", "movement",
        "--budgets", "0.02", "--mergekit", "", "--stitch-scales", "1.0", "--out", out)
    summary = json.loads((out / "merge.json").read_text())
    assert summary["mode"] == "causal" and summary["rows"]
    merged = transformers.AutoModelForCausalLM.from_pretrained(out / "model")
    assert type(merged).__name__ == "Gemma3ForCausalLM"
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()


# ---------------------------------------------------------------------------------------------- GGUF
@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp("gguf")
    (root / "f32").mkdir()
    (root / "q8").mkdir()
    f32, reference = write_tiny_gguf(root / "f32" / "tiny-f32.gguf", quantize=None)
    q8, _ = write_tiny_gguf(root / "q8" / "tiny-q8.gguf", quantize="Q8_0")
    return {"f32": f32, "q8": q8, "reference": reference}


def test_a_gguf_file_converts_once_into_a_plain_folder(tiny_gguf, capfd):
    import transformers

    ref = model_reference(str(tiny_gguf["f32"]))
    first = capfd.readouterr().err
    assert "converting" in first and ref.name == str(tiny_gguf["f32"])
    again = model_reference(str(tiny_gguf["f32"]))
    assert again.path == ref.path and "converting" not in capfd.readouterr().err  # content-keyed, kept
    model = transformers.AutoModelForCausalLM.from_pretrained(ref.path).eval()  # a plain folder, no GGUF needed
    assert getattr(model.config, "quantization_config", None) is None
    with torch.no_grad():
        ids = torch.tensor([[2, 5, 8, 9, 31, 32, 7, 8, 9, 10, 11]])
        assert torch.allclose(model(ids).logits, tiny_gguf["reference"](ids).logits, atol=1e-5)
    assert "converted to float32" in gguf.describe(ref.path)
    source = json.loads((Path(ref.path) / gguf.SOURCE_FILE).read_text())
    assert source["architecture"] == "gemma3" and not source["quantized"]


def test_a_quantized_gguf_is_named_as_such_and_used_dequantized(tiny_gguf, toy_data):
    import transformers

    ref = model_reference(str(tiny_gguf["q8"]))
    note = gguf.describe(ref.path)
    assert "Q8_0" in note and "dequantized" in note
    ours = transformers.AutoModelForCausalLM.from_pretrained(ref.path).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tiny_gguf["q8"].parent,
                                                              gguf_file=tiny_gguf["q8"].name).eval()
    for (n, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert torch.equal(a, b), n  # the dequantized weights, exactly as transformers reads the file
    scorer = build_scorer(str(tiny_gguf["q8"]), "SST-2", "causal")  # the same path as --model FILE.gguf
    assert scorer.base_model == str(tiny_gguf["q8"])
    assert scorer(**scorer.collate(load_split("SST-2", "test", toy_data)[:4])).shape == (4, 2)


def test_a_graft_report_of_a_gguf_pair_names_the_quantization(tiny_gguf, toy_data, tmp_path):
    cli("finetune", "--model", tiny_gguf["q8"], "--mode", "causal", "--task", "SST-2", "--k", 8, "--seed", 13,
        "--optimizer", "adamw", "--lr", 3e-3, "--steps", 4, "--eval-every", 2, "--data-dir", toy_data,
        "--out", tmp_path / "ft")
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["model"] == str(tiny_gguf["q8"])
    cli("graft", "--pretrained", tiny_gguf["q8"], "--finetuned", tmp_path / "ft" / "model", "--task", "SST-2",
        "--k", 8, "--mode", "causal", "--out", tmp_path / "g", "--budgets", "0.01", "--steps", 2, "--eval-every", 1,
        "--data-dir", toy_data, "--cache", tmp_path / "own-store")
    report = (tmp_path / "g" / "report.md").read_text()
    assert "from GGUF Q8_0" in report and "dequantized" in report
    # converted into the command's own --cache (beside its stages), not only into $SKILLGRAFT_CACHE
    assert [p.name.startswith("gguf-tiny-q8") for p in (tmp_path / "own-store").glob("gguf-*")] == [True]
    assert gguf.store_root() == Path(os.environ["SKILLGRAFT_CACHE"])  # for the command's duration only
    # its PEFT adapter names the base as the user did (the GGUF file, not a folder in the store, issue 80); the
    # dequantized folder plain transformers loads is in the summary and the README's load line
    cli("export", tmp_path / "g" / "grafts" / "budget-0.01", "--to", "peft", "--out", tmp_path / "adapter")
    base = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str(tiny_gguf["q8"])
    folder = json.loads((tmp_path / "adapter" / "skillgraft_export.json").read_text())["loads_from"]
    assert folder == str(Path(model_reference(str(tiny_gguf["q8"])).path).resolve())
    assert f"from_pretrained({folder!r})" in (tmp_path / "adapter" / "README.md").read_text()
    # (in this process; test_peft_adapter_reads_with_plain_peft compares a Gemma adapter's logits, and test_export.py
    # reads an adapter in a fresh interpreter without skillgraft)
    import peft
    import transformers

    m = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(folder),
                                       str(tmp_path / "adapter"))
    assert type(m.base_model.model).__name__ == "Gemma3ForCausalLM"


def _bad(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_bad_gguf_files_are_one_line_before_any_work(tiny_gguf, toy_data, tmp_path):
    whole = tiny_gguf["q8"].read_bytes()
    cases = {
        "truncated": (_bad(tmp_path, "cut.gguf", whole[: len(whole) * 2 // 3]), "truncated"),
        "header only": (_bad(tmp_path, "head.gguf", whole[:40]), "truncated or damaged"),
        "not gguf": (_bad(tmp_path, "text.gguf", b"hello world, not a model"), "not a GGUF file"),
        "missing": (tmp_path / "absent.gguf", "not found"),
    }
    from tiny import write_tiny_gguf

    (tmp_path / "arch").mkdir()
    cases["architecture"] = (write_tiny_gguf(tmp_path / "arch" / "fancy.gguf", architecture="fancynet")[0],
                             "architecture 'fancynet'")
    for what, (path, message) in cases.items():
        out = tmp_path / f"run-{what.replace(' ', '-')}"
        text = cli("finetune", "--model", path, "--mode", "causal", "--task", "SST-2", "--k", 8, "--data-dir",
                   toy_data, "--out", out, code=2)
        assert message in text, (what, text)
        assert "Traceback" not in text and len(text.strip().splitlines()) <= 2, (what, text)
        assert not out.exists(), what
    assert not list(gguf.store_root().glob("gguf-cut-*")) and not list(gguf.store_root().glob("*.tmp-*"))


def test_missing_extra_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, gguf.GEMMA_PACKAGE, None)  # import fails as if not installed
    with pytest.raises(SkillgraftError, match=r"make gemma"):
        model_reference("gemma-3-270m")
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(SkillgraftError, match=r"needs the gguf package; install the extra: make gemma"):
        gguf.inspect_gguf(_bad(tmp_path, "x.gguf", b"GGUF" + bytes(60)))


def test_a_gguf_whose_tensors_share_their_data_is_refused_naming_both(tiny_gguf, toy_data, tmp_path):
    """Two tensors of one shape and type pointing at the same bytes read without error as wrong weights."""
    import shutil

    import gguf as gguf_package

    path = tmp_path / "shared.gguf"
    shutil.copy(tiny_gguf["f32"], path)
    reader = gguf_package.GGUFReader(str(path), "r+")
    norms = [t for t in reader.tensors if t.name.endswith("attn_norm.weight")]
    a, b = norms[0], norms[1]
    b.field.parts[-1][0] = a.field.parts[-1][0]  # b's data offset := a's
    reader.data.flush()
    del reader
    out = tmp_path / "run"
    text = cli("finetune", "--model", path, "--mode", "causal", "--task", "SST-2", "--k", 8, "--data-dir", toy_data,
               "--out", out, code=2)
    assert str(path) in text and f"'{a.name}'" in text and f"'{b.name}'" in text and "overlaps" in text, text
    assert "Traceback" not in text and not out.exists()
    assert not list(gguf.store_root().glob("gguf-shared-*"))
