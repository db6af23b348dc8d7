"""Surgical fine-tuning: which blocks to train (FIM score, random, explicit) and FIM ranking stability.

* ``fim:top-K``    — train the K blocks with the highest FIM score on the pre-trained model (Lodha et al.);
* ``fim:bottom-K`` — the K lowest (the control);
* ``random-K``     — K blocks drawn with the data seed;
* ``0,3,5``        — explicit block indices.
The head (and whatever the fine-tuning config leaves on) always trains; every other block is frozen.

Auto-RGN and weight snapshots during training are callbacks of the training core
(:class:`skillgraft.train.callbacks.AutoRGN`, :class:`~skillgraft.train.callbacks.Snapshots`).
"""

from __future__ import annotations

import random
import re

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.fisher.fisher import FisherConfig
from skillgraft.fisher.scores import LayerScores, block_names, fim_layer_scores, rank_correlation

_SPEC = re.compile(r"^(?:fim(?P<agg>-frob)?:(?P<end>top|bottom)-(?P<k>\d+)|random-(?P<rk>\d+))$")


def parse_spec(spec: str) -> tuple[str, int, str]:
    """``fim:top-2`` → ("top", 2, "sum"); ``fim-frob:bottom-1`` → ("bottom", 1, "frobenius");
    ``random-3`` → ("random", 3, "")."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise SkillgraftError(
            f"--layers {spec!r}: expected fim:top-K, fim:bottom-K, fim-frob:top-K, random-K or indices like '0,3,5'")
    if m["rk"] is not None:
        kind, k, agg = "random", int(m["rk"]), ""
    else:
        kind, k, agg = m["end"], int(m["k"]), "frobenius" if m["agg"] else "sum"
    if k < 1:
        raise SkillgraftError(f"--layers {spec!r}: K must be ≥ 1")
    return kind, k, agg


def resolve_layer_spec(spec: str, *, task=None, model: str | None = None, mode: str = "head", k: int = 16,
                       seed: int = 42, data_dir=None, pooling: str | None = None, scorer=None,
                       examples: list[Example] | None = None, fisher: FisherConfig | None = None,
                       normalize: bool = False) -> list[int]:
    """Block indices a layer spec selects (sorted). FIM specs score the pre-trained model on the k-shot
    training examples (``fisher.n_examples`` caps N); pass ``scorer``/``examples`` to reuse loaded ones."""
    spec = str(spec).strip()
    if re.fullmatch(r"\d+(\s*,\s*\d+)*", spec):
        chosen = sorted({int(x) for x in spec.split(",")})
        n_blocks = _n_blocks(scorer, model, task, mode, pooling) if (scorer is not None or task is not None) else None
        if n_blocks is not None and chosen[-1] >= n_blocks:
            raise SkillgraftError(f"--layers {spec!r}: the model has blocks 0..{n_blocks - 1}")
        return chosen
    kind, count, agg = parse_spec(spec)
    if scorer is None:
        if task is None:
            raise SkillgraftError(f"--layers {spec!r} needs a task (and model) to resolve")
        from skillgraft.models import build_scorer  # noqa: PLC0415

        scorer = build_scorer(model, task, mode, pooling=pooling)
    n_blocks = len(block_names(scorer))
    if count > n_blocks:
        raise SkillgraftError(f"--layers {spec!r}: K={count} but the model has only {n_blocks} blocks")
    if kind == "random":
        return sorted(random.Random(seed).sample(range(n_blocks), count))
    if examples is None:
        from skillgraft.data import load_kshot  # noqa: PLC0415

        examples = load_kshot(scorer.task, k, seed, data_dir).train
    scores = fim_layer_scores(scorer, examples, aggregate=agg, normalize=normalize, config=fisher)
    return scores.top(count) if kind == "top" else scores.bottom(count)


def _n_blocks(scorer, model, task, mode, pooling) -> int:
    if scorer is None:
        from skillgraft.models import build_scorer  # noqa: PLC0415

        scorer = build_scorer(model, task, mode, pooling=pooling)
    return len(block_names(scorer))


def ranking_stability(scorers: dict[int, object], examples: list[Example], *, aggregate: str = "sum",
                      normalize: bool = False, config: FisherConfig | None = None
                      ) -> tuple[list[dict], dict[int, LayerScores]]:
    """FIM ranking on each checkpoint (``{step: scorer}``) and its Spearman/Kendall correlation with the
    first (lowest-step) checkpoint's and with the previous checkpoint's ranking."""
    if not scorers:
        raise SkillgraftError("ranking stability needs at least one checkpoint")
    scores = {s: fim_layer_scores(sc, examples, aggregate=aggregate, normalize=normalize, config=config)
              for s, sc in sorted(scorers.items())}
    steps = sorted(scores)
    rows, prev = [], None
    for s in steps:
        first = rank_correlation(scores[steps[0]], scores[s])
        row = {"step": s, "ranking": scores[s].ranking(), "top": scores[s].ranking()[0],
               "spearman_vs_first": first["spearman"], "kendall_vs_first": first["kendall"]}
        if prev is not None:
            c = rank_correlation(scores[prev], scores[s])
            row.update(spearman_vs_prev=c["spearman"], kendall_vs_prev=c["kendall"])
        rows.append(row)
        prev = s
    return rows, scores


def parse_layers(spec: str | None, **context) -> list[int] | None:
    """'0,3,5' → [0, 3, 5]; 'fim:top-2' etc. are resolved by the Fisher module."""
    if spec is None:
        return None
    if ":" in spec or spec.startswith("random"):
        return resolve_layer_spec(spec, **context)
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise SkillgraftError(f"--layers {spec!r}: expected block indices like '0,3,5' or fim:top-K") from None
