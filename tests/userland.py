"""What a user's own code makes, for the tests to graft, merge and read back: row files, and fine-tuned checkpoints
trained by plain transformers / torch (classifiers with the data's labels, SFT pairs) — no skillgraft on that side.
Plus the CLI runners, and the merge tests' stand-in for `mergekit-yaml`."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import torch
from tiny import sentence
from typer.testing import CliRunner

from skillgraft.cli import app

runner = CliRunner()
LABELS = ("neg", "pos")
TOPICS = {"sport": ["football", "tennis", "goal"], "money": ["market", "stocks", "bank"],
          "vote": ["election", "president", "senate"]}


def cli(*args, code: int = 0, obj: dict | None = None) -> str:
    """``skillgraft ARGS`` in process; its output, or an AssertionError naming the exit code it gave instead."""
    r = runner.invoke(app, [str(a) for a in args], obj=obj)
    if r.exit_code != code:
        raise AssertionError(f"exit {r.exit_code} (wanted {code}): {r.output}\n{r.exception!r}")
    return r.output


def invoke(*args, obj: dict | None = None):
    """``skillgraft ARGS`` in process: Click's result (exit code, output, exception), whatever the exit code."""
    return runner.invoke(app, [str(a) for a in args], obj=obj)


def write_rows(path: Path, rows: list[dict]) -> Path:
    """``rows`` as .jsonl, or as .csv / .tsv with a header (by the suffix)."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if path.suffix == ".tsv" else ",")
            w.writeheader()
            w.writerows(rows)
    return path


def sentiment_rows(n: int = 120, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"text": sentence(rng, i % 2), "label": LABELS[i % 2]} for i in range(n)]


def topic_rows(n: int, seed: int) -> list[dict]:
    """Three topics (sport, money, vote), one keyword each among filler words."""
    rng = random.Random(seed)
    names = list(TOPICS)
    rows = []
    for i in range(n):
        label = names[i % 3]
        words = ["the", "news", "said", "today", rng.choice(TOPICS[label])]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": label})
    return rows


def train_classifier(base: Path, out: Path, rows: list[dict], *, steps: int = 25, lr: float = 3e-3) -> Path:
    """Plain transformers: AutoModelForSequenceClassification with the data's labels (sorted), AdamW,
    save_pretrained."""
    import transformers as tf

    labels = sorted({r["label"] for r in rows})
    tok = tf.AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None:  # a decoder without one (Llama 3): pad with the EOS
        tok.pad_token = tok.eos_token
    torch.manual_seed(1)
    model = tf.AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)},
        pad_token_id=tok.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        batch = [rows[(step * 16 + i) % len(rows)] for i in range(16)]
        enc = tok([r["text"] for r in batch], return_tensors="pt", padding=True)
        model(**enc, labels=torch.tensor([labels.index(r["label"]) for r in batch])).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


def sft_rows(n: int = 120, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": sentence(rng, i % 2) + " It was", "completion": [" terrible", " great"][i % 2]}
            for i in range(n)]


def train_sft(base: Path, out: Path, rows: list[dict], *, steps: int = 40, lr: float = 3e-3) -> Path:
    """Plain-torch SFT: token cross-entropy on the completion tokens (+ EOS) only."""
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(base)
    torch.manual_seed(1)
    model = tf.AutoModelForCausalLM.from_pretrained(base)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        seqs, targets = [], []
        for r in (rows[(step * 16 + i) % len(rows)] for i in range(16)):
            p = tok(r["prompt"])["input_ids"]
            c = tok.encode(r["completion"], add_special_tokens=False) + [tok.eos_token_id]
            seqs.append(p + c)
            targets.append([-100] * len(p) + c)
        width = max(map(len, seqs))
        ids = torch.tensor([s + [tok.eos_token_id] * (width - len(s)) for s in seqs])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def merge_args(c: dict, out: Path, *extra) -> list[str]:
    """``skillgraft merge`` of the ``classifiers`` fixture's two models (conftest), with their data."""
    args = ["merge", "--pretrained", c["base"], "--finetuned", c["sentiment"][0], "--finetuned", c["topic"][0],
            "--data", c["sentiment"][1], "--data", c["topic"][1], "--eval-data", c["sentiment"][2], "--eval-data",
            c["topic"][2], "--out", out, *extra]
    return [str(a) for a in args]


def fake_mergekit(config: str, work: Path, seed: int) -> dict:
    """Stands in for ``mergekit-yaml`` in fast tests (the real one runs in test_merge's slow test): task arithmetic,
    θ_pre + λ Σ_t (θ_t − θ_pre), read from the folders the YAML names."""
    import yaml
    from safetensors.torch import load_file

    cfg = yaml.safe_load(config)
    models = [load_file(str(Path(m["model"]) / "model.safetensors")) for m in cfg["models"]]
    base = load_file(str(Path(cfg.get("base_model", cfg["models"][0]["model"])) / "model.safetensors"))
    lam = (cfg.get("parameters") or {}).get("lambda", 1.0)
    return {k: base[k] + lam * sum(m[k] - base[k] for m in models) for k in base}
