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
from skillgraft.progress import bar as tqdm

from skillgraft.data.loading import Example
from skillgraft.evaluate.metrics import summarize


@torch.no_grad()
def evaluate_generative(scorer, examples: list[Example], *, batch_size: int = 64, reference: np.ndarray | None = None,
                        progress: bool | str = False, top: list | None = None) -> tuple[dict[str, float], np.ndarray]:
    """Metrics (see the module doc) and per-example candidate probabilities of a generative scorer; ``top`` (a
    list) is extended with each example's top next-token ids at its completion positions, from the same pass."""
    from skillgraft.models.freezing import evaluating  # noqa: PLC0415
    from skillgraft.models.placement import forward_context  # noqa: PLC0415

    # one autocast region for the set (bf16-mixed casts each weight once); every sub-module's mode given back after
    with evaluating(scorer), forward_context(scorer):
        return _evaluate_generative(scorer, examples, batch_size, reference, progress, top)


def _evaluate_generative(scorer, examples, batch_size, reference, progress, top):
    device = scorer.device
    desc = progress if isinstance(progress, str) else "evaluate"
    losses, correct, tokens = [], 0, 0
    for start in tqdm(range(0, len(examples), batch_size), desc=desc, disable=not progress, leave=False):
        batch = {k: v.to(device) for k, v in scorer.collate(examples[start:start + batch_size]).items()}
        mean_logp, c, t, rows, ids = scorer.completion_eval(batch)  # one pass: loss, hits and top tokens
        losses.append(-mean_logp.double().cpu())
        if top is not None:
            rows, ids = rows.cpu().numpy(), ids.cpu().numpy()
            top.extend(ids[rows == i] for i in range(len(mean_logp)))
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
    return metrics, probs


@torch.no_grad()
def greedy_completions(scorer, prompts: list[str], *, max_new_tokens: int = 32, batch_size: int = 16) -> list[str]:
    """Each prompt's greedy (argmax, no sampling) continuation by the scorer's model: at most ``max_new_tokens``
    tokens, up to its first EOS (left out), as text — the reference of a prompt given without a completion."""
    from skillgraft.models.freezing import evaluating  # noqa: PLC0415
    from skillgraft.models.placement import forward_context  # noqa: PLC0415

    tok, pad, eos = scorer.tokenizer, scorer.tokenizer.pad_token_id, scorer.tokenizer.eos_token_id
    room = max(1, scorer.max_length - max_new_tokens)  # the prompt's end, as the completion loss cuts it
    out = []
    with evaluating(scorer):  # the scorer's modes as they were after, also after an interruption
        for start in range(0, len(prompts), batch_size):
            ids = [scorer.prompt_ids(p)[-room:] for p in prompts[start:start + batch_size]]
            width = max(len(r) for r in ids)  # left padding: every prompt ends where generation starts
            inputs = torch.tensor([[pad] * (width - len(r)) + r for r in ids], device=scorer.device)
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids], device=scorer.device)
            with forward_context(scorer):
                new = scorer.model.generate(input_ids=inputs, attention_mask=mask, max_new_tokens=max_new_tokens,
                                            do_sample=False, num_beams=1, pad_token_id=pad, eos_token_id=eos)
            for row in new[:, width:].tolist():
                out.append(tok.decode(row[:row.index(eos)] if eos in row else row, skip_special_tokens=True))
    return out
