"""Per-layer FIM scores for surgical fine-tuning (Lodha et al.).

A *layer* is one transformer block (all its tensors), found by module structure
(:func:`skillgraft.models.param_groups`), never by name prefix (``layer.1`` ≠ ``layer.10``).

    score_sum(l)       = Σ_{θ_j ∈ block l} F_jj                     (the definition: Fisher mass of the block)
    score_frobenius(l) = Σ_{tensors T ∈ block l} ‖diag F_T‖_F        (the reference code's aggregation)

optionally divided by the block's parameter count (``normalize=True``). Higher = more task-relevant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from skillgraft.lazy import torch

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.fisher.fisher import FisherConfig, fisher_diagonal, fisher_traces
from skillgraft.models.freezing import block_index, param_groups

Aggregate = Literal["sum", "frobenius"]


@dataclass
class LayerScores:
    """FIM score per block, with the settings that produced it."""

    scores: list[float]
    num_parameters: list[int]
    aggregate: str = "sum"
    normalize: bool = False
    fisher: dict = field(default_factory=dict)  # FisherConfig as a dict

    def ranking(self) -> list[int]:
        """Block indices from the highest score to the lowest (ties: lower index first)."""
        return sorted(range(len(self.scores)), key=lambda i: (-self.scores[i], i))

    def top(self, k: int) -> list[int]:
        return sorted(self.ranking()[:k])

    def bottom(self, k: int) -> list[int]:
        return sorted(self.ranking()[::-1][:k])

    def rank_of(self) -> list[int]:
        """Rank (0 = highest score) of each block."""
        order = self.ranking()
        ranks = [0] * len(order)
        for r, i in enumerate(order):
            ranks[i] = r
        return ranks

    def to_dict(self) -> dict:
        return {**asdict(self), "ranking": self.ranking()}


def block_names(scorer) -> dict[int, list[str]]:
    """Parameter names of every transformer block, by block index."""
    out: dict[int, list[str]] = {}
    for name, group in param_groups(scorer).items():
        i = block_index(group)
        if i is not None:
            out.setdefault(i, []).append(name)
    return dict(sorted(out.items()))


def aggregate_layers(fisher: dict[str, torch.Tensor | float], scorer, *, aggregate: Aggregate = "sum",
                     normalize: bool = False) -> LayerScores:
    """Aggregate a diagonal Fisher into one score per block (see the module docstring).

    For ``sum`` the values may also be per-tensor traces (floats or 0-d tensors, :func:`fisher_traces`).
    """
    if aggregate not in ("sum", "frobenius"):
        raise SkillgraftError(f"FIM aggregate must be 'sum' or 'frobenius', got {aggregate!r}")
    blocks = block_names(scorer)
    missing = [n for names in blocks.values() for n in names if n not in fisher]
    if missing:
        raise SkillgraftError(f"the Fisher does not cover block parameter(s) {missing[:3]}; compute it over them")
    params = dict(scorer.named_parameters())
    if aggregate == "frobenius" and any(torch.as_tensor(fisher[n]).numel() != params[n].numel()
                                        for names in blocks.values() for n in names):
        raise SkillgraftError("FIM aggregate 'frobenius' needs the diagonal Fisher, not per-tensor traces")
    scores, sizes = [], []
    for i in range(len(blocks)):
        tensors = [torch.as_tensor(fisher[n]).double() for n in blocks[i]]
        if aggregate == "sum":
            s = sum(float(t.sum()) for t in tensors)
        else:
            s = sum(float(t.norm()) for t in tensors)
        n = sum(params[name].numel() for name in blocks[i])
        scores.append(s / n if normalize else s)
        sizes.append(n)
    return LayerScores(scores, sizes, aggregate, normalize)


def fim_layer_scores(scorer, examples: list[Example], *, aggregate: Aggregate = "sum", normalize: bool = False,
                     config: FisherConfig | None = None, progress: bool | str = False) -> LayerScores:
    """Compute the Fisher over the block parameters of ``scorer`` and score every block.

    ``sum`` needs only each tensor's Fisher mass (:func:`fisher_traces`, cheaper than the diagonal);
    ``frobenius`` needs the diagonal.
    """
    config = config or FisherConfig()
    names = [n for names in block_names(scorer).values() for n in names]
    if aggregate == "sum":
        fisher = fisher_traces(scorer, examples, config, names=names, progress=progress)
    else:
        fisher = fisher_diagonal(scorer, examples, config, names=names, progress=progress)
    out = aggregate_layers(fisher, scorer, aggregate=aggregate, normalize=normalize)
    out.fisher = config.to_dict()
    return out


def rank_correlation(a: LayerScores | list[float], b: LayerScores | list[float]) -> dict[str, float]:
    """Spearman ρ and Kendall τ between two score vectors (the same blocks)."""
    from scipy.stats import kendalltau, spearmanr  # noqa: PLC0415

    xa = a.scores if isinstance(a, LayerScores) else list(a)
    xb = b.scores if isinstance(b, LayerScores) else list(b)
    if len(xa) != len(xb):
        raise SkillgraftError(f"rank correlation needs the same blocks: {len(xa)} vs {len(xb)} scores")
    if len(xa) < 2:
        return {"spearman": 1.0, "kendall": 1.0}
    rho = spearmanr(xa, xb).statistic
    tau = kendalltau(xa, xb).statistic
    return {"spearman": float(rho), "kendall": float(tau)}
