"""What a keep search is asked (``--keep``, ``--keep-agreement`` and the options shaping the search): a typed
:class:`KeepSpec` whose fields the CLI turns into options, and the one check of a keep share."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from skillgraft.errors import SkillgraftError
from skillgraft.graft.selection import Budget, as_list
from skillgraft.spec import TOLERANCE_MIN, ReadablePath, Spec, Tolerance

# The learned localizer's order (part of store keys: a change of it re-computes stored keep searches).
# 2: the rounded γ by drift, then the rest by |Δ|; 1 (never released): every coordinate by drift.
LEARNED_ORDER = 2


def check_share(value) -> float:
    """A keep share in (0, 1] (a number, or a string such as ``"0.95"``); one clear line otherwise."""
    try:
        share = float(value)
    except (TypeError, ValueError):
        raise SkillgraftError(f"keep target {value!r} is not a number: give a share of FT's score in (0, 1], "
                              "e.g. 0.95") from None
    if isinstance(value, bool) or not math.isfinite(share) or not 0 < share <= 1:
        raise SkillgraftError(f"keep target {value!r} is impossible: give a share of FT's score in (0, 1], e.g. 0.95")
    return share


class KeepSpec(Spec):
    """Keep targets: ask for a share of FT's score, get the smallest region reaching it (see module doc)."""

    keep: list[float] | None = Field(None, description=(
        "shares of FT's score to keep, in (0, 1] (several allowed: 0.95,0.99): the smallest region of the localizer "
        "reaching each on a selection split (the data's dev split, else a held-out slice of the localization rows)"))
    keep_tolerance: Tolerance = Field(0.1, description=(
        "keep search: stop when the smallest size reaching the target and the largest probed below it differ by "
        f"less than this factor, in [{TOLERANCE_MIN:g}, 1] (a finer one probes ~ln 4 / tolerance sizes per step)"))
    keep_from: Budget = Field(Budget.parse(1e-6), description=(
        "keep search: the first (smallest) size probed, a fraction of the graftable parameters or a count"))
    keep_holdout: float = Field(0.2, gt=0, lt=1, description=(
        "keep search on data without a dev split: the fraction of the localization rows held out as the selection "
        "split (the localizer learns on the rest)"))
    keep_confidence: float = Field(0.9, ge=0.5, lt=1, description=(
        "keep search: the confidence of the promise; a size reaches a target only when the lower confidence bound "
        "of its share of FT on the selection rows reaches it (exact for accuracy; docs/keep.md)"))
    keep_data: ReadablePath | None = Field(None, description=(
        "keep search: a file of labelled examples (.jsonl/.tsv/.csv, the task's layout; generative: prompt and "
        "completion) to choose the size on, instead of the dev split or a held-out slice; never the test rows "
        "(with only --keep-agreement targets labels, and completions, may be left out)"))
    keep_new_tokens: int = Field(32, ge=1, le=4096, description=(
        "keep search on generative --keep-data prompts without a completion: FT's greedy completion of at most "
        "this many new tokens is the reference the graft's top tokens are compared on (teacher forcing)"))
    keep_bound: Literal["paired", "exact"] = Field("paired", description=(
        "keep search, accuracy: the lower bound a size must pass: 'paired' (an exact test of "
        "acc(graft) − τ·acc(FT) ≥ 0 on the paired rows, counting the graft's wins on FT's wrong rows) or 'exact' "
        "(Clopper–Pearson on how often the graft is right where FT is right; issue 38's); docs/keep.md"))
    keep_agreement: list[float] | None = Field(None, description=(
        "label-free keep targets, in (0, 1]: the smallest region whose predictions agree with FT's on at least this "
        "share of rows (the Clopper–Pearson bound at --keep-confidence; open-ended generative data: the mean per-row "
        "share of completion tokens whose top prediction is FT's, a betting bound), on the selection rows, whose "
        "labels are not read"))

    @field_validator("keep", "keep_agreement", mode="before")
    @classmethod
    def _shares(cls, value):
        values = as_list(value)
        if values is None:
            return None
        try:
            return list(dict.fromkeys(check_share(v) for v in values))
        except SkillgraftError as e:
            raise ValueError(str(e)) from None

    def refuse_options_without_targets(self, *, frontier: bool = False) -> None:
        """Refuse, before any work, keep options given without a target (the CLI's ``--keep-data`` or
        ``--keep-confidence`` alone): they shape a search that never runs, and were silently ignored. With
        ``frontier`` (``--frontier``, whose own keep search takes them) they are used."""
        given = [] if frontier else sorted(self.model_fields_set & {"keep_tolerance", "keep_from", "keep_holdout",
                                                                    "keep_confidence", "keep_data", "keep_new_tokens"})
        if not self.any and given:  # --keep-agreement alone starts a search too
            names = ", ".join(f"--{n.replace('_', '-')}" for n in given)
            raise SkillgraftError(f"{names} {'shapes' if len(given) == 1 else 'shape'} a keep search, which only "
                                  "--keep or --keep-agreement starts: give --keep (a share of FT's score, e.g. "
                                  "--keep 0.95) or leave "
                                  f"{'it' if len(given) == 1 else 'them'} out")

    @field_validator("keep_from", mode="before")
    @classmethod
    def _budget(cls, value):
        try:
            budget = Budget.parse(value)
        except SkillgraftError as e:
            raise ValueError(str(e)) from None
        if budget.rounding:
            raise ValueError("keep_from must be a fraction or a count, not 'round'")
        return budget

    @property
    def any(self) -> bool:
        """Whether any keep target (of FT's score, or of agreement with FT) is asked for."""
        return bool(self.keep) or bool(self.keep_agreement)
