"""The family table (models/families.py, issue 47): every field has a reader, family names and classes appear only in
the table, the rows agree with transformers' classes, and the Qwen3 and Llama 3 rows run through finetune, graft,
export and merge on tiny random models."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from userland import fake_mergekit, sentiment_rows, topic_rows, train_classifier, write_rows
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.models import build_scorer
from skillgraft.models import families as fam

SRC = Path(__file__).resolve().parents[1] / "src" / "skillgraft"
TABLE = SRC / "models" / "families.py"
runner = CliRunner()


def cli(*args, obj: dict | None = None) -> str:
    r = runner.invoke(app, [str(a) for a in args], obj=obj)
    assert r.exit_code == 0, f"{r.output}\n{r.exception!r}"
    return r.output


def _sources() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for p in SRC.rglob("*.py") if p != TABLE}


# ---------------------------------------------------------------------------------------------- the table is read
def test_every_field_of_a_family_has_a_reader():
    """Each Family field is read by a function of the table that some other module of src/ imports or calls."""
    tree = ast.parse(TABLE.read_text())
    reads: dict[str, set[str]] = {f.name: set() for f in dataclasses.fields(fam.Family)}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and sub.attr in reads:
                    reads[sub.attr].add(node.name)
    used: set[str] = set()
    for module in _sources().values():
        for node in ast.walk(module):
            if isinstance(node, ast.ImportFrom) and node.module == "skillgraft.models.families":
                used |= {a.name for a in node.names}
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
    unread = [f for f, readers in reads.items() if not readers & used]
    assert not unread, f"Family fields nobody reads: {unread}"


def test_family_names_and_classes_appear_only_in_the_table():
    """No module but the table spells a family's model type or a class the table names (norms, Conv1D)."""
    names = set(fam.FAMILIES)
    for f in fam.FAMILIES.values():
        names |= set(f.norms) | ({f.conv1d} if f.conv1d else set())
    found = [f"{path.relative_to(SRC)}:{node.lineno} {node.value!r}" for path, module in _sources().items()
             for node in ast.walk(module)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]
    assert not found, f"family names outside models/families.py: {found}"


def test_rows_agree_with_transformers():
    """Each row's body prefix is its classifier class's ``base_model_prefix``; its norm and Conv1D classes exist in
    its modeling module; a decoder row has a causal-LM class."""
    import importlib

    import transformers as tf
    from transformers.models.auto import modeling_auto as auto

    for key, row in fam.FAMILIES.items():
        cls = getattr(tf, auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES[key])
        assert row.prefix == cls.base_model_prefix, key
        module = importlib.import_module(cls.__module__)
        for name in [*row.norms, *([row.conv1d] if row.conv1d else [])]:
            assert hasattr(module, name) or hasattr(importlib.import_module("transformers.pytorch_utils"), name), name
        assert not row.decoder or key in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, key


def test_decoders_without_is_decoder_are_decoders():
    """Decoder configs say ``is_decoder=False``: Qwen3 reads its row, an unlisted causal LM the DECODER default."""
    import transformers as tf

    assert fam.family(tf.Qwen3Config()).decoder and fam.default_pooling(tf.Qwen3Config(), "head") == "last"
    assert fam.family(tf.BertConfig(architectures=["WhateverForCausalLM"])) is fam.FAMILIES["bert"]
    cfg = tf.PretrainedConfig(architectures=["WhateverForCausalLM"])
    assert fam.family(cfg) is fam.DECODER and fam.default_pooling(cfg, "head") == "last"
    assert fam.family(tf.PretrainedConfig()) is fam.DEFAULT
    assert fam.tied_embeddings(tf.LlamaConfig(tie_word_embeddings=True))
    assert fam.shape_fields(tf.Qwen3Config())[-1] == "sliding_window"


@pytest.mark.parametrize("kind", ["bert", "roberta", "gpt2", "llama3", "qwen3", "gemma3"])
def test_head_names_are_what_lies_outside_the_body(tiny_models, kind):
    """The table's head modules of a sequence classifier are exactly its parameters outside ``base_model``."""
    import transformers as tf

    cfg = tf.AutoConfig.from_pretrained(tiny_models[kind], num_labels=3)
    cfg.pad_token_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    model = tf.AutoModelForSequenceClassification.from_config(cfg)
    body = {id(p) for p in model.base_model.parameters()}
    outside = {n for n, p in model.named_parameters() if id(p) not in body}
    assert outside and fam.head_names(model) == outside
    assert fam.body_prefix(model) == model.base_model_prefix


def test_gemma_norms_are_hooked_with_their_offset(tiny_models, monkeypatch):
    """Gemma's (1 + w) RMS norms get the closed-form Fisher (equal to the per-example loop); a table row with the
    wrong offset is caught by the output check and falls back to vmap."""
    import skillgraft.fisher.fisher as F
    from skillgraft.data.loading import Example
    from skillgraft.fisher.fisher import fisher_diagonal

    examples = [Example(t, y) for t, y in (("a great film", 1), ("bad plot", 0), ("fine story it is", 1))]
    scorer = build_scorer(str(tiny_models["gemma3"]), "SST-2", "head")
    names = [n for n, _ in scorer.named_parameters() if ".layers." in n]
    assert any("norm" in n for n in names)
    ref = fisher_diagonal(scorer, examples, kind="true", method="loop", names=names)
    calls = []
    real_vmap = F._fisher_vmap
    monkeypatch.setattr(F, "_fisher_vmap", lambda *a, **k: calls.append(1) or real_vmap(*a, **k))
    hooked = fisher_diagonal(scorer, examples, kind="true", method="hooks", chunk_size=3, names=names)
    assert not calls
    for n in names:
        assert torch.allclose(hooked[n], ref[n], rtol=1e-3, atol=1e-9), n
    wrong = {**fam.FAMILIES, "gemma3_text": dataclasses.replace(fam.FAMILIES["gemma3_text"],
                                                                norms={"Gemma3RMSNorm": 0.0})}
    monkeypatch.setattr(fam, "FAMILIES", wrong)
    again = fisher_diagonal(scorer, examples, kind="true", method="hooks", chunk_size=3, names=names)
    assert calls and all(torch.allclose(again[n], ref[n], rtol=1e-3, atol=1e-9) for n in names)


# ---------------------------------------------------------------------------------------------- Qwen3 and Llama 3
@pytest.mark.parametrize("kind", ["qwen3", "llama3"])
def test_new_family_runs_finetune_graft_export_merge(tiny_models, toy_data, tmp_path, kind):
    """A tiny random model of the family through each verb: finetune (causal scoring), graft (learned + a baseline,
    Fisher-free), export to PEFT, and merge two classifiers of it (their ``score`` heads carried)."""
    base = tiny_models[kind]
    run = tmp_path / "run"
    cli("finetune", "--task", "SST-2", "--k", 8, "--seed", 13, "--model", base, "--mode", "causal", "--optimizer",
        "adamw", "--lr", 1e-3, "--steps", 2, "--eval-every", 2, "--data-dir", toy_data, "--test-limit", 8, "--out", run)
    assert (run / "config.json").is_file() and build_scorer(str(base), "SST-2", "head").pooling == "last"
    report = tmp_path / "g"
    cli("graft", "--finetuned", run, "--out", report, "--budgets", "0.01", "--steps", 2, "--eval-every", 2,
        "--baselines", "movement", "--no-lottery-zero", "--data-dir", toy_data)
    rows = json.loads((report / "metrics.json").read_text())["rows"]
    assert {"fine-tuned", "graft 0.01"} <= {r["model"] for r in rows}
    cli("export", report / "grafts" / "budget-0.01", "--to", "peft", "--out", tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()

    data = {"sentiment": sentiment_rows(48, 0), "topic": topic_rows(48, 0)}
    paths = {name: (train_classifier(base, tmp_path / name, rows, steps=3),
                    write_rows(tmp_path / f"{name}.jsonl", rows)) for name, rows in data.items()}
    out = tmp_path / "merged"
    cli("merge", "--pretrained", base, "--finetuned", paths["sentiment"][0], "--finetuned", paths["topic"][0],
        "--data", paths["sentiment"][1], "--data", paths["topic"][1], "--localizer", "movement", "--budget", 0.05,
        "--mergekit", "task_arithmetic", "--scales", 0.5, "--out", out, obj={"mergekit_runner": fake_mergekit})
    summary = json.loads((out / "merge.json").read_text())
    assert summary["mode"] == "classifier" and set(summary["tasks"]) == {"sentiment", "topic"}
    assert {r["method"] for r in summary["rows"]} >= {"stitch", "mergekit task_arithmetic"}
