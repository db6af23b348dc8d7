"""Label-free agreement of a graft with FT on open-ended generative data (``--keep-agreement``; docs/keep.md).

Per row, A_i = the share of its completion positions where the graft's top (greedy) next token, given the prompt
and the gold completion's tokens before it (teacher forcing), is FT's. A_i ∈ [0, 1] is a function of the row, so
i.i.d. rows give i.i.d. A_i whatever the dependence between a row's tokens; the keep search bounds their mean with
the betting test of :func:`skillgraft.keep.stats.bound.betting_test`, never a bound treating tokens as independent.
"""

from __future__ import annotations

from collections.abc import Sequence

from skillgraft.errors import SkillgraftError
from skillgraft.keep.stats.bound import Outcome
from skillgraft.lazy import np  # numpy, imported at first use (not on --help's path)


def open_ended(scorer) -> bool:
    """Whether ``scorer`` scores open-ended generative data (completions not a closed set: no per-row prediction)."""
    return getattr(scorer, "mode", None) == "generative" and scorer.task.num_labels < 2


def agreement_outcome(graft: Outcome, ft: Outcome) -> Outcome:
    """The graft's agreement with FT's predictions as an accuracy (FT's predictions as the labels; no label read)."""
    agree = float((graft.pred == ft.pred).mean())
    return Outcome(agree, graft.pred, ft.pred, "accuracy")


def token_agreement(graft: Sequence, ft: Sequence) -> np.ndarray:
    """Per row, the share of its completion positions where the graft's top next token is FT's (teacher forcing;
    a row with no completion token agrees vacuously: 1)."""
    if len(graft) != len(ft):
        raise SkillgraftError(f"graft and FT were scored on different rows ({len(graft)} vs {len(ft)})")
    out = np.ones(len(ft))
    for i, (g, f) in enumerate(zip(graft, ft)):
        if len(g) != len(f):
            raise SkillgraftError(f"row {i}: graft and FT scored {len(g)} and {len(f)} completion tokens")
        if len(f):
            out[i] = float((np.asarray(g) == np.asarray(f)).mean())
    return out


def token_agreement_outcome(graft: Outcome, ft: Outcome) -> Outcome:
    """The graft's mean per-row share of completion tokens agreeing with FT's top tokens, as an Outcome of metric
    ``mean`` (the per-row shares as ``pred``; the betting bound's input). No label is read."""
    if graft.tokens is None or ft.tokens is None:
        raise SkillgraftError("--keep-agreement on open-ended generative data needs each row's top completion tokens "
                              "of every size scored (graft_outcome(..., tokens=True))")
    shares = token_agreement(graft.tokens, ft.tokens)
    return Outcome(float(shares.mean()), shares, None, "mean")
