"""Running a Scorer over examples: label probabilities in eval mode, batched, with a progress bar."""

from __future__ import annotations

from typing import TYPE_CHECKING

from skillgraft.lazy import np
from skillgraft.lazy import no_grad, torch
from skillgraft.progress import bar as tqdm

from skillgraft.data.loading import Example, text_length
from skillgraft.evaluate.metrics import summarize
from skillgraft.models.freezing import evaluating
from skillgraft.models.placement import forward_context

if TYPE_CHECKING:
    from skillgraft.models.scorer import Scorer


@no_grad
def predict_probs(scorer: Scorer, examples: list[Example], *, batch_size: int = 64, progress: bool | str = False
                  ) -> np.ndarray:
    """Softmax over the label logits for every example, ``[n, num_labels]`` (float64)."""
    device = scorer.device
    order = np.argsort([text_length(ex) for ex in examples])  # length-sorted batches
    out = np.zeros((len(examples), scorer.task.num_labels))
    desc = progress if isinstance(progress, str) else "predict"
    # one forward context around every batch: under bf16-mixed, autocast's bf16 copies of the weights are made
    # once for the whole set, not once per batch (the weights cannot change in between: nothing here writes them)
    with evaluating(scorer), forward_context(scorer):
        for start in tqdm(range(0, len(examples), batch_size), desc=desc, disable=not progress, leave=False):
            idx = order[start:start + batch_size]
            batch = scorer.collate([examples[i] for i in idx])
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = scorer(**batch).float()
            out[idx] = torch.softmax(logits, -1).cpu().double().numpy()
    return out


def labels_of(examples: list[Example]) -> np.ndarray:
    """Gold label indices of ``examples`` as an int array."""
    return np.array([ex.label for ex in examples])


def evaluate(scorer: Scorer, examples: list[Example], *, batch_size: int = 64, reference: np.ndarray | None = None,
             progress: bool | str = False, top: list | None = None) -> tuple[dict[str, float], np.ndarray]:
    """Metrics (accuracy/F1, ECE, agreement with ``reference``) and the probabilities; ``top``: a generative
    scorer's top completion tokens per example, from the same pass (:func:`evaluate_generative`)."""
    if getattr(scorer, "mode", None) == "generative":  # completion loss, token accuracy, exact match
        from skillgraft.evaluate.generative import evaluate_generative  # noqa: PLC0415

        return evaluate_generative(scorer, examples, batch_size=batch_size, reference=reference, progress=progress,
                                   top=top)
    probs = predict_probs(scorer, examples, batch_size=batch_size, progress=progress)
    task = scorer.task
    positive = task.labels.index(task.positive_label) if task.positive_label else 1
    return summarize(probs, labels_of(examples), metric=task.metric, positive=positive, reference=reference), probs
