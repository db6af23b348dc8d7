"""The keep search with models: a region scored as θ_pre + γ ⊙ Δ on the selection rows (the metric and its per-row
predictions, the bound's input), and :func:`keep_search` over a ranking's nested family (what
:meth:`Localizer.keep <skillgraft.graft.localizers.machinery.base.Localizer.keep>` runs on the localizer's order)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from skillgraft.lazy import np

from skillgraft.errors import SkillgraftError
from skillgraft.graft.ranking import Ranking
from skillgraft.graft.region import Region
from skillgraft.keep.search import KeepResult, search_keep
from skillgraft.keep.spec import KeepSpec
from skillgraft.keep.stats.agreement import agreement_outcome, open_ended, token_agreement_outcome
from skillgraft.keep.stats.bound import Outcome, as_outcome


def selection_outcome(scorer, examples, batch_size: int = 64, *, tokens: bool = False) -> Outcome:
    """``scorer``'s task metric on ``examples`` with its per-row predictions (the bound's input); ``tokens``: also
    each open-ended generative row's top next-token ids on its completion (teacher forcing, the same pass)."""
    from skillgraft.evaluate.predict import evaluate  # noqa: PLC0415

    top = [] if tokens and open_ended(scorer) else None
    metrics, probs = evaluate(scorer, examples, batch_size=batch_size, top=top)
    return dataclasses.replace(_outcome(scorer, examples, metrics, probs), tokens=top)


def _outcome(scorer, examples, metrics: dict, probs: np.ndarray) -> Outcome:
    task = scorer.task
    if probs.shape[-1] < 2 or "accuracy" not in metrics:  # open-ended token accuracy: no per-row outcome
        return Outcome(float(metrics["score"]))
    positive = task.labels.index(task.positive_label) if getattr(task, "positive_label", None) else 1
    metric = "f1" if "f1" in metrics else "accuracy"  # summarize() adds f1 only for an F1 task
    return Outcome(float(metrics["score"]), probs.argmax(-1), np.array([ex.label for ex in examples]), metric,
                   positive)


def selection_score(scorer, examples, batch_size: int = 64) -> float:
    """The task metric of ``scorer`` on ``examples`` (accuracy, F1, or token accuracy for generative data)."""
    return selection_outcome(scorer, examples, batch_size).score


def graft_outcome(pre, ft, examples, *, values: Callable | None = None, batch_size: int = 64,
                  tokens: bool = False) -> Callable[[Region], Outcome]:
    """outcome(region) = the metric and per-row predictions of θ_pre + γ⊙Δ on ``examples`` (θ_pre restored after
    each call). ``values(region)`` may replace θ_ft's values on the region (e.g. DARE's rescaled Δ); ``tokens``: as
    :func:`selection_outcome`."""
    from skillgraft.graft.graft import Graft  # noqa: PLC0415

    def outcome(region: Region) -> Outcome:
        graft = Graft.from_models(pre, ft, region)
        if values is not None:
            graft = Graft(region, values(region), graft.carried, graft.base_model, graft.base_fingerprint)
        with graft.applied(pre):
            return selection_outcome(pre, examples, batch_size, tokens=tokens)

    return outcome


def graft_scorer(pre, ft, examples, *, values: Callable | None = None, batch_size: int = 64
                 ) -> Callable[[Region], float]:
    """score(region) = the metric of θ_pre + γ⊙Δ on ``examples`` (θ_pre restored after each call)."""
    outcome = graft_outcome(pre, ft, examples, values=values, batch_size=batch_size)
    return lambda region: outcome(region).score


def keep_search(pre, ft, ranking: Ranking, selection, keep: KeepSpec | Sequence[float], *,
                score: Callable[[Region], float | Outcome] | None = None) -> list[KeepResult]:
    """Search ``ranking``'s nested family for each keep target, scored on the ``selection`` examples, at the
    spec's confidence (``score`` defaults to :func:`graft_outcome`): the share targets (``keep``) with the spec's
    bound, then the agreement targets (``keep_agreement``, label-free; open-ended generative data: keep.stats.agreement)
    on the same probes."""
    spec = keep if isinstance(keep, KeepSpec) else KeepSpec.build({"keep": list(keep)}, where="keep")
    if not spec.any:
        return []
    if not selection:
        raise SkillgraftError("a keep target needs a selection split (dev examples, distinct from the test rows)")
    if not len(ranking):
        raise SkillgraftError("the localizer ranked no coordinates: no region can keep anything")
    tokens = bool(spec.keep_agreement) and open_ended(ft)  # the token agreement of each row (keep.stats.agreement)
    if open_ended(ft):  # a generative row's target is its completion: the label field is never read
        selection = [dataclasses.replace(ex, label=0) for ex in selection]
    score = score or graft_outcome(pre, ft, selection, tokens=tokens)
    reference = selection_outcome(ft, selection, tokens=tokens)
    start = spec.keep_from.size(ranking.universe) if spec.keep_from.count is None else min(spec.keep_from.count,
                                                                                           len(ranking))
    memo: dict[int, Outcome] = {}

    def at(k: int):
        if k not in memo:
            memo[k] = score(ranking.region(k))
        return memo[k]

    common = {"start": start, "tolerance": spec.keep_tolerance, "universe": ranking.universe,
              "confidence": spec.keep_confidence}
    results = []
    if spec.keep:
        results += search_keep(at, reference, spec.keep, len(ranking), method=spec.keep_bound, **common)
    if spec.keep_agreement and reference.tokens is not None:  # open-ended generative: token agreement per row
        mine = Outcome(1.0, np.ones(len(selection)), None, "mean")
        results += search_keep(lambda k: token_agreement_outcome(as_outcome(at(k)), reference), mine,
                               spec.keep_agreement, len(ranking), kind="agreement", **common)
    elif spec.keep_agreement:
        if reference.pred is None:
            raise SkillgraftError("--keep-agreement compares the graft's predictions with FT's row by row: this data "
                                  "has no per-row prediction; use --keep")
        mine = Outcome(1.0, reference.pred, reference.pred, "accuracy")
        results += search_keep(lambda k: agreement_outcome(as_outcome(at(k)), reference), mine, spec.keep_agreement,
                               len(ranking), method="exact", kind="agreement", **common)
    for r in results:
        r.region = ranking.region(r.size if r.reached else r.best_size)
    return results

