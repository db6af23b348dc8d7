"""Evaluating a generative (prompt → completion) scorer: completion loss, token accuracy, exact match.

* ``loss`` — the mean over examples of each example's mean token cross-entropy on its completion tokens
  (the prompt is context, never a target; the completion ends with EOS). The localization objective is
  the same quantity (docs/generative.md).
* ``token_accuracy`` — completion tokens that are the model's most likely next token (teacher forcing).
* ``exact_match`` — where completions are labels (a small closed set): the gold completion is the most
  likely of the candidate completions (summed log-probabilities); ``probs`` are the softmax over the
  candidates, so ECE and agreement are defined as for classification. Open-ended completions: ``score``
  is the token accuracy and ``probs`` a single column.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from skillgraft.data.loading import Example
from skillgraft.evaluate.metrics import summarize


@torch.no_grad()
def evaluate_generative(scorer, examples: list[Example], *, batch_size: int = 64, reference: np.ndarray | None = None,
                        progress: bool | str = False) -> tuple[dict[str, float], np.ndarray]:
    """Metrics (see the module doc) and per-example candidate probabilities of a generative scorer."""
    was_training = scorer.training
    scorer.eval()
    device = scorer.device
    desc = progress if isinstance(progress, str) else "evaluate"
    losses, correct, tokens = [], 0, 0
    for start in tqdm(range(0, len(examples), batch_size), desc=desc, disable=not progress, leave=False):
        batch = {k: v.to(device) for k, v in scorer.collate(examples[start:start + batch_size]).items()}
        mean_logp, c, t = scorer.completion_eval(batch)  # one pass: the loss and the teacher-forced hits
        losses.append(-mean_logp.double().cpu())
        correct, tokens = correct + int(c), tokens + t
    loss = float(torch.cat(losses).mean())
    token_accuracy = correct / max(1, tokens)
    labels = np.array([ex.label for ex in examples])
    if scorer.task.num_labels >= 2:
        n_cand = scorer.task.num_labels
        step = max(1, batch_size // n_cand)
        probs = np.zeros((len(examples), n_cand))
        for start in range(0, len(examples), step):
            batch = {k: v.to(device) for k, v in scorer.candidate_batch(examples[start:start + step]).items()}
            logits = scorer(**{k: v for k, v in batch.items() if k != "labels"}).float()
            probs[start:start + step] = torch.softmax(logits, -1).cpu().double().numpy()
        metrics = summarize(probs, labels, reference=reference)
        metrics["exact_match"] = metrics["accuracy"]
    else:
        probs = np.ones((len(examples), 1))
        metrics = {"n": len(examples), "score": token_accuracy, "ece": float("nan"), "mean_confidence": float("nan")}
        if reference is not None:
            metrics["agreement"] = float("nan")
    metrics.update({"loss": loss, "token_accuracy": token_accuracy})
    scorer.train(was_training)
    return metrics, probs


@torch.no_grad()
def top_tokens(scorer, examples: list[Example], *, batch_size: int = 64) -> list[np.ndarray]:
    """Per example, the scorer's top (greedy) next-token id at each of its completion positions, given the prompt
    and the gold completion's tokens before it (teacher forcing: one pass, no sampling). Labels are not read."""
    import dataclasses  # noqa: PLC0415

    was_training = scorer.training
    scorer.eval()
    device = scorer.device
    rows_in = [dataclasses.replace(ex, label=0) for ex in examples]  # the completion is the target, not the label
    out: list[np.ndarray] = []
    for start in range(0, len(rows_in), batch_size):
        chunk = rows_in[start:start + batch_size]
        batch = {k: v.to(device) for k, v in scorer.collate(chunk).items()}
        rows, top = scorer.completion_top(batch)
        rows, top = rows.cpu().numpy(), top.cpu().numpy()
        out.extend(top[rows == i] for i in range(len(chunk)))
    scorer.train(was_training)
    return out
