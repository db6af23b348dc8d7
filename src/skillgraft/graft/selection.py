"""Budgets and the one shared selection: scores over graftable coordinates → a Region of the requested size.

A budget is a fraction f ∈ (0, 1] of the graftable universe U (k = max(1, round(f·|U|))), a count
k ≥ 1, or — for the learned localizer only — ``round``: γ rounded at 0.5 (size not fixed in advance).
Selection keeps exactly the k highest scores over all scored tensors (ties broken by position):

    γ = top-k_j s_j,        |γ| = k

Scores may cover only part of the universe (e.g. biases); a fraction still refers to the whole universe.
"""

from __future__ import annotations

import math
import numbers
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from skillgraft.lazy import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, model_serializer, model_validator

from skillgraft.errors import SkillgraftError
from skillgraft.finite import refuse_non_finite
from skillgraft.graft.region import Region, numel_of
from skillgraft.models.anatomy import Graftable, graftable_names
from skillgraft.resume import register_codec

Shapes = dict[str, tuple[int, ...]]


class Budget(BaseModel):
    """A region size: ``Budget.parse(1e-4)`` (fraction), ``Budget.parse(100)`` / ``"100"`` (count), or ROUND.

    Frozen and hashable (a dict key). Numbers in (0, 1] are fractions of the graftable coordinates;
    integers ≥ 1 (and whole numbers above 1 such as ``1e3``) are counts. It serialises to that number
    (or ``"round"``), so configs holding budgets read and write as plain numbers.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["fraction", "count", "round"]
    value: int | float | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_scalar(cls, data: Any) -> Any:
        if isinstance(data, (dict, Budget)):
            return data
        try:
            return _parse_fields(data)
        except SkillgraftError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _check(self) -> Budget:
        if self.kind == "round" and self.value is not None:
            raise ValueError("the round budget takes no value")
        if self.kind == "fraction" and not (isinstance(self.value, numbers.Real) and 0 < self.value <= 1):
            raise ValueError(f"budget fraction {self.value} is impossible: give a fraction in (0, 1]")
        if self.kind == "count" and not (isinstance(self.value, numbers.Integral) and self.value >= 1):
            raise ValueError(f"budget count {self.value} is impossible: give a whole number ≥ 1")
        return self

    @model_serializer
    def _to_scalar(self) -> int | float | str:
        return "round" if self.kind == "round" else self.value

    @classmethod
    def parse(cls, value: Budget | float | int | str) -> Budget:
        """A budget from a number, a string (``"1e-4"``, ``"100"``, ``"round"``) or a Budget."""
        if isinstance(value, Budget):
            return value
        return cls(**_parse_fields(value))

    # ------------------------------------------------------------------ reading
    @property
    def rounding(self) -> bool:
        """The learned localizer's budget: γ rounded at 0.5."""
        return self.kind == "round"

    @property
    def fraction(self) -> float | None:
        return float(self.value) if self.kind == "fraction" else None

    @property
    def count(self) -> int | None:
        return int(self.value) if self.kind == "count" else None

    @property
    def label(self) -> str:
        """Readable name for reports: ``0.001``, ``1e-05``, ``100``, ``round``."""
        if self.kind == "fraction":
            return f"{self.value:g}"
        return "round" if self.kind == "round" else str(self.value)

    @property
    def key(self) -> str:
        """Exact string form (JSON keys, folder names): ``Budget.parse(b.key) == b``."""
        if self.kind == "fraction":
            return repr(float(self.value))
        return "round" if self.kind == "round" else str(self.value)

    def size(self, universe: int) -> int:
        """Exact region size k for a universe of ``universe`` coordinates."""
        if self.kind == "round":
            raise SkillgraftError("the 'round' budget (γ rounded at 0.5) has no fixed size; only the learned "
                                  "localizer takes it")
        if self.kind == "count":
            if self.value > universe:
                raise SkillgraftError(f"budget {self.value} exceeds the {universe} graftable parameters")
            return int(self.value)
        return max(1, int(round(float(self.value) * universe)))

    def __str__(self) -> str:
        return self.label

    def __repr__(self) -> str:
        return f"Budget({self.key})"


WHAT = "a fraction in (0, 1] (1e-3 or 0.1%) or a whole number of parameters ≥ 1"


def _parse_fields(value: Any) -> dict:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("round", "rounded"):
            return {"kind": "round"}
        percent = text.endswith("%")
        try:
            value = float(Decimal(text[:-1]) / 100) if percent else int(text)
        except (ValueError, InvalidOperation):
            try:
                value = float(text)
            except ValueError:
                raise SkillgraftError(f"budget {value!r} is not a number: give {WHAT}, or 'round'") from None
        if percent and not (math.isfinite(value) and 0 < value <= 1):
            raise SkillgraftError(f"budget {text!r} is impossible: a percentage is in (0%, 100%]")
        if percent:
            return {"kind": "fraction", "value": value}
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SkillgraftError(f"budget must be a number ({WHAT}), got {value!r}")
    if isinstance(value, numbers.Integral):
        if value < 1:
            raise SkillgraftError(f"budget {value} is impossible: give {WHAT}")
        return {"kind": "count", "value": int(value)}
    value = float(value)
    if math.isfinite(value) and 0 < value <= 1:
        return {"kind": "fraction", "value": value}
    if math.isfinite(value) and value > 1 and value.is_integer():
        return {"kind": "count", "value": int(value)}
    if math.isfinite(value) and value > 1:
        raise SkillgraftError(f"budget {value:g} is impossible: above 1 it is a count of parameters, a whole number "
                              f"(a fraction is in (0, 1]: 1e-3 or 0.1%)")
    raise SkillgraftError(f"budget {value:g} is impossible: give {WHAT}")


ROUND = Budget(kind="round")


def as_list(values: Any) -> list | None:
    """One value, a list, or a comma-separated string (``"1e-4,1e-3"``) as a list; empty → None."""
    if isinstance(values, str):
        values = [v for v in values.split(",") if v.strip()]
    elif values is not None and not isinstance(values, (list, tuple)):
        values = [values]
    return list(values) if values else None


def parse_budgets(values) -> list[Budget]:
    """Budgets from a list (or one value, or a comma-separated string such as ``"1e-4,1e-3"``)."""
    return [Budget.parse(v) for v in as_list(values) or []]


# A config field holding budgets: accepts one value, a list or "1e-4,100"; serialises as plain numbers.
Budgets = Annotated[list[Budget] | None, BeforeValidator(as_list)]


def region_universe(pre, graftable: Graftable = "body") -> Shapes:
    """Shapes of the graftable tensors, in model order: the universe every region is drawn from."""
    names = set(graftable_names(pre, graftable))
    return {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}


def top_k_flat(flat: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the k largest entries of a 1-d tensor; among equal values the earliest win (NaN ranks
    highest). The one tie rule every selection — single-process, candidate-restricted, sharded — follows."""
    k = max(0, min(k, flat.numel()))
    if k == 0:
        return torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    if flat.is_floating_point() and bool(flat.isnan().any()):
        flat = torch.nan_to_num(flat, nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))
    threshold = torch.topk(flat, k, sorted=False).values.min()  # the k-th largest value
    chosen = flat > threshold
    ties = torch.nonzero(flat == threshold).view(-1)[:k - int(chosen.sum())]
    chosen[ties] = True
    return chosen


def top_k_flat_on_device(flat: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`top_k_flat` (the same entries) without reading anything back to the host: the ties taken are the
    first ones by a running count (an int32 temporary of ``flat``'s length; for a step's small candidate set)."""
    k = max(0, min(k, flat.numel()))
    if k == 0:
        return torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    if flat.is_floating_point():
        flat = torch.nan_to_num(flat, nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))
    threshold = torch.topk(flat, k, sorted=False).values.min()
    chosen = flat > threshold
    tied = flat == threshold
    return chosen | (tied & (torch.cumsum(tied, 0, dtype=torch.int32) <= k - chosen.sum()))


def top_k_masks(scores: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Boolean masks of exactly the k largest entries over all tensors (ties broken by position).

    Scores are compared in float32, or float64 when any tensor is float64 or integer (e.g. ranks).
    """
    if k <= 0:
        return {n: torch.zeros_like(s, dtype=torch.bool) for n, s in scores.items()}
    wide = any(s.dtype == torch.float64 or not s.is_floating_point() for s in scores.values())
    dtype = torch.float64 if wide else torch.float32
    flat = torch.cat([s.reshape(-1).to(dtype) for s in scores.values()])
    chosen = top_k_flat(flat, k)
    out, start = {}, 0
    for n, s in scores.items():
        out[n] = chosen[start:start + s.numel()].view(s.shape)
        start += s.numel()
    return out


def select_masks(scores: dict[str, torch.Tensor], budget: Budget | float | int | str,
                 universe: int | None = None) -> dict[str, torch.Tensor]:
    """Boolean masks of the selection: exact top-k by ``budget`` (of ``universe`` coordinates), or s > 0.5."""
    budget = Budget.parse(budget)
    if budget.rounding:
        return {n: s > 0.5 for n, s in scores.items()}
    scored = sum(s.numel() for s in scores.values())
    k = budget.size(scored if universe is None else universe)
    if k > scored:
        raise SkillgraftError(f"budget {budget} asks for {k} coordinates but only {scored} can be chosen "
                              f"(the scored tensors: {list(scores)[:3]}{' …' if len(scores) > 3 else ''})")
    return top_k_masks(scores, k)


def select(scores: dict[str, torch.Tensor], budget: Budget | float | int | str,
           shapes: Shapes | None = None) -> Region:
    """The one shared selection: the Region of the top-``budget`` scores over the universe ``shapes``.

    ``shapes`` defaults to the scored tensors; scores may cover a subset of it (unscored coordinates are
    never chosen), and a fractional budget is a fraction of the whole of ``shapes``.
    """
    shapes = {n: tuple(s.shape) for n, s in scores.items()} if shapes is None else dict(shapes)
    for n, s in scores.items():
        if n not in shapes or tuple(shapes[n]) != tuple(s.shape):
            raise SkillgraftError(f"scores for {n!r} of shape {tuple(s.shape)} do not fit the universe "
                                  f"({shapes.get(n, 'absent')})")
        refuse_non_finite(s, f"localizer scores of {n!r}", "a region cannot be chosen by them (a non-finite loss "
                                                           "or weight upstream)")
    masks = select_masks(scores, budget, sum(numel_of(s) for s in shapes.values()))
    return Region.from_masks({n: m.cpu() for n, m in masks.items()}, shapes)


def select_streamed(scored, budgets: list[Budget], shapes: Shapes) -> dict[Budget, Region]:
    """:func:`select` for each budget from scores given one tensor at a time (``scored``: ``(name, scores)`` pairs
    in universe order), without holding them: every tensor's own top-k (k of the largest budget) is merged into
    a pool of at most k candidates, ordered as :func:`top_k_flat` orders the concatenation (score descending,
    earlier position first), so each budget's region is the same as ``select`` on the dense scores. Comparisons
    are in float64, in which every float32 / bfloat16 score is exact (the order is the same).
    """
    total = sum(numel_of(s) for s in shapes.values())
    sizes = {b: b.size(total) for b in budgets}
    k = max(sizes.values())
    pool_v = torch.empty(0, dtype=torch.float64)
    pool_p = torch.empty(0, dtype=torch.long)   # global position: offset of the tensor in score order + index
    names, offsets, offset = [], [], 0
    for name, s in scored:
        if name not in shapes or tuple(shapes[name]) != tuple(s.shape):
            raise SkillgraftError(f"scores for {name!r} of shape {tuple(s.shape)} do not fit the universe "
                                  f"({shapes.get(name, 'absent')})")
        refuse_non_finite(s, f"localizer scores of {name!r}", "a region cannot be chosen by them (a non-finite loss "
                                                              "or weight upstream)")
        flat = s.reshape(-1)
        flat = flat.float() if flat.is_floating_point() and flat.dtype != torch.float64 else flat.to(torch.float64)
        mine = torch.nonzero(top_k_flat(flat, k)).view(-1) if k < flat.numel() else torch.arange(flat.numel())
        values = flat[mine].to(torch.float64).cpu()
        del s, flat
        pool_v, pool_p = torch.cat([pool_v, values]), torch.cat([pool_p, mine.cpu() + offset])
        if pool_v.numel() > 2 * k:  # keep the best k (pruned lazily: the top k of a union is the top k of its parts')
            pool_v, pool_p = _best(pool_v, pool_p, k)
        names.append(name)
        offsets.append(offset)
        offset += numel_of(shapes[name])
    if k > offset:
        raise SkillgraftError(f"budget {max(sizes, key=sizes.get)} asks for {k} coordinates but only {offset} can be "
                              f"chosen (the scored tensors: {names[:3]}{' …' if len(names) > 3 else ''})")
    ranked = torch.sort(pool_v, descending=True, stable=True).indices  # the pool (in position order), best first
    out = {}
    for budget, size in sizes.items():
        chosen = torch.sort(pool_p[ranked[:size]]).values
        bounds = torch.searchsorted(chosen, torch.tensor([*offsets, offset]))
        out[budget] = Region(dict(shapes), {n: chosen[bounds[i]:bounds[i + 1]] - offsets[i]
                                            for i, n in enumerate(names)})
    return out


def _best(values: torch.Tensor, positions: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of a pool in position order (score descending, earlier position first), in position order."""
    keep = torch.sort(values, descending=True, stable=True).indices[:k]
    keep = keep[torch.argsort(positions[keep])]
    return values[keep], positions[keep]


# a budget in a resumable state (resume.py), e.g. a dict key of the best step per budget
register_codec("__budget__", Budget, lambda b: b.model_dump(), Budget.model_validate)
