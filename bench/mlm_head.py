"""Give MiniLM a masked-LM head, fitted on unlabeled text with the body frozen, and test prompt mode with it.

Usage: .venv/bin/python bench/mlm_head.py [--out runs/minilm-mlm] [--sentences 30000] [--epochs 4]

all-MiniLM-L6-v2 ships without MLM-head weights, so skillgraft's prompt mode scores label words against the
frozen input embeddings (a tied decoder) and starts at chance. Issue 14 named that as the likely reason the
paper's near-lossless 1e-4 grafts do not reproduce on MiniLM. This benchmark tests it: it fits BERT's
``cls.predictions`` head (dense + GELU + LayerNorm, decoder tied to the frozen input embeddings, a vocabulary
bias; 0.18M parameters) by masked-token prediction on the frozen body's last hidden states, and saves a plain
``BertForMaskedLM`` checkpoint (body = MiniLM's, bit for bit) that every skillgraft verb loads by path:
``bench/paper/paper-mlm.yaml`` runs the paper's Table 2 setting on it.

The text is the train splits of tasks outside the sentiment / subjectivity family (ag_news, QNLI, SNLI, MNLI,
QQP, RTE, MRPC, trec; texts only, no labels, no test split), so no evaluated sentence or label is seen.
15% of each sentence's tokens are replaced by [MASK]. Prints held-out masked-token accuracy, then zero-shot
prompt accuracy (LM-BFF templates) on SST-2, mr and cr (128 train + dev examples of seed 13, and the 500-example
test subsets); writes bench/results/mlm_head.json.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CORPUS = ["ag_news", "QNLI", "SNLI", "MNLI", "QQP", "RTE", "MRPC", "trec"]


def corpus(data_root: Path, n: int, seed: int) -> list[str]:
    """Up to ``n`` distinct texts from the CORPUS tasks' train splits, shuffled."""
    texts = []
    for task in CORPUS:
        with open(data_root / task / "train.jsonl", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                texts += [row[k] for k in ("text", "text_a", "text_b") if row.get(k)]
    texts = list(dict.fromkeys(texts))
    random.Random(seed).shuffle(texts)
    return texts[:n]


@torch.no_grad()
def masked_states(model, tok, texts: list[str], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen body's last hidden state at each masked position, and the token that was there."""
    gen = torch.Generator().manual_seed(seed)
    states, targets = [], []
    for start in range(0, len(texts), 64):
        enc = tok(texts[start:start + 64], truncation=True, max_length=64, padding=True, return_tensors="pt")
        ids = enc["input_ids"].clone()
        special = torch.isin(ids, torch.tensor([tok.cls_token_id, tok.sep_token_id, tok.pad_token_id]))
        pick = (torch.rand(ids.shape, generator=gen) < 0.15) & ~special
        targets.append(ids[pick])
        ids[pick] = tok.mask_token_id
        states.append(model.bert(input_ids=ids, attention_mask=enc["attention_mask"]).last_hidden_state[pick])
    return torch.cat(states), torch.cat(targets)


def fit(head, states, targets, epochs: int, n_val: int = 5000) -> list[dict]:
    """AdamW on the head's own tensors (the tied decoder weight, i.e. the input embeddings, stays frozen)."""
    params = [head.transform.dense.weight, head.transform.dense.bias, head.transform.LayerNorm.weight,
              head.transform.LayerNorm.bias, head.bias]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
    val_x, val_y, x, y = states[:n_val], targets[:n_val], states[n_val:], targets[n_val:]

    @torch.no_grad()
    def held_out() -> dict:
        logits = head(val_x)
        return {"loss": round(float(torch.nn.functional.cross_entropy(logits, val_y)), 4),
                "top1": round(float((logits.argmax(-1) == val_y).float().mean()), 4)}

    history = [{"epoch": 0, **held_out()}]
    for epoch in range(1, epochs + 1):
        for batch in torch.randperm(len(y)).split(512):
            loss = torch.nn.functional.cross_entropy(head(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        history.append({"epoch": epoch, **held_out()})
        print(f"  epoch {epoch}: held-out masked tokens {history[-1]}", flush=True)
    for p in params:
        p.requires_grad_(False)
    return history


def zero_shot(path: str) -> dict:
    from skillgraft.data import load_kshot
    from skillgraft.models import build_scorer

    out = {}
    for task in ("SST-2", "mr", "cr"):
        data = load_kshot(task, 64, 13, test_limit=500)
        row = {}
        for kind, source in (("tied decoder", None), ("fitted MLM head", path)):
            scorer = build_scorer(source, data.task, "prompt")
            row[kind] = {split: accuracy(scorer, examples)
                         for split, examples in (("train+dev", data.train + data.dev), ("test", data.test))}
        out[task] = row
        print(f"  {task}: {row}", flush=True)
    return out


@torch.no_grad()
def accuracy(scorer, examples) -> float:
    hits = 0
    for start in range(0, len(examples), 64):
        batch = scorer.collate(examples[start:start + 64])
        labels = batch.pop("labels")
        hits += int((scorer(**batch).argmax(-1) == labels).sum())
    return round(hits / len(examples), 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/minilm-mlm", help="checkpoint folder to write (refused if it exists)")
    ap.add_argument("--sentences", type=int, default=30000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args()
    from transformers import AutoTokenizer, BertForMaskedLM
    from transformers.utils import logging as hf_logging

    from skillgraft.data.loading import resolve_data_dir
    from skillgraft.io import atomic_dir
    from skillgraft.models.loading import bundled_minilm_path

    torch.manual_seed(args.seed)
    source = str(bundled_minilm_path())
    tok = AutoTokenizer.from_pretrained(source)
    hf_logging.set_verbosity_error()  # the head is missing from the checkpoint: that is the point
    model = BertForMaskedLM.from_pretrained(source).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    t0 = time.perf_counter()
    texts = corpus(resolve_data_dir(None, "SST-2"), args.sentences, args.seed)
    states, targets = masked_states(model, tok, texts, args.seed)
    body_seconds = time.perf_counter() - t0
    print(f"{len(texts)} sentences, {len(targets)} masked tokens ({body_seconds:.0f} s through the frozen body)")
    history = fit(model.cls.predictions, states, targets, args.epochs)
    with atomic_dir(args.out, overwrite=args.overwrite) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    print(f"wrote {args.out}; zero-shot prompt accuracy (seed 13 draw):")
    result = {"sentences": len(texts), "masked_tokens": len(targets), "corpus": CORPUS, "history": history,
              "seconds": round(time.perf_counter() - t0, 1), "zero_shot": zero_shot(args.out), "checkpoint": args.out}
    path = HERE / "results" / "mlm_head.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
