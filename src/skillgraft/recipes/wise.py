"""WiSE-FT and WiSE-graft recipe (paper Fig. 7): ID vs OOD accuracy along weight interpolations.

WiSE-FT: θ(α) = θ_pre + α(θ_ft − θ_pre); WiSE-graft: θ(α) = θ_pre + α·γ⊙(θ_ft − θ_pre), for α on a grid
in [0, 1] (:func:`skillgraft.graft.interpolate.interpolate`). With the default ``head: carry`` the
fine-tuned head is used at every α (α = 0 is "head only"); ``head: interpolate`` interpolates it too.
Writes ``points.csv`` (every α × curve × seed), ``curves.csv`` (mean over seeds), one PNG per OOD target
with the ID-vs-OOD curves of WiSE-FT and WiSE-graft (FT and the graft are their α = 1 ends), and a report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from skillgraft.evaluate.predict import evaluate
from skillgraft.evaluate.rows import Row
from skillgraft.graft.interpolate import interpolate
from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.graft.selection import Budget
from skillgraft.pipeline.paper_numbers import FIG7_NLI_OPTIMA, PAPER_NOTE
from skillgraft.pipeline.regions import learned_regions
from skillgraft.pipeline.report import RunDir, md_table, setting_line
from skillgraft.pipeline.transfers import transfer_members
from skillgraft.pipeline.variants import graft_label, graft_variant
from skillgraft.recipes.base import ExperimentSpec, TransfersMixin, recipe


class WiseSpec(ExperimentSpec, TransfersMixin):
    """WiSE-FT vs WiSE-graft along α (paper Fig. 7)."""

    localize: LocalizeConfig = Field(default_factory=LocalizeConfig, description=(
        "the learned localizer's settings; `budgets` gives one region per budget from one localization"))
    alphas: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0], min_length=1,
        description="interpolation weights α in [0, 1] (sorted, repeats dropped)")
    head: Literal["carry", "interpolate"] = Field("carry", description=(
        "carry: the fine-tuned head at every α (α = 0 is head only) | interpolate: the head too"))
    graft_budgets: list[Budget] | None = Field(None, min_length=1, description=(
        "which learned regions (of localize.budgets) get a WiSE-graft curve (null: every one)"))

    @field_validator("alphas")
    @classmethod
    def _sorted(cls, v: list[float]) -> list[float]:
        return sorted(set(v))

    @model_validator(mode="after")
    def _budgets_are_learned(self):
        learned = self.localize.budget_list
        missing = [b.label for b in self.graft_budgets or [] if b not in learned]
        if missing:
            raise ValueError(f"graft_budgets: {missing} are not among localize.budgets {[b.label for b in learned]}")
        return self


@dataclass(frozen=True)
class SetScore:
    """A model's score and ECE on one evaluation set (the source's own, ``<source> (ID)``, or an OOD target)."""

    score: float
    ece: float


@dataclass
class WisePoint(Row):
    """One α of one curve (WiSE-FT or a WiSE-graft) on one source and seed, or their mean over seeds (``n_seeds``
    set; ``seed`` None); columns ``<set>:score`` / ``<set>:ece`` per evaluation set (spelt only by :meth:`columns`)."""

    source: str
    curve: str
    alpha: float
    seed: int | None = None
    n_seeds: int | None = None
    sets: dict[str, SetScore] = field(default_factory=dict)

    def columns(self) -> dict[str, Any]:
        head = {"source": self.source}
        head |= {"seed": self.seed} if self.seed is not None else {}
        head |= {"curve": self.curve, "alpha": self.alpha}
        head |= {"n_seeds": self.n_seeds} if self.n_seeds is not None else {}
        for name, m in self.sets.items():
            head[name + ":score"], head[name + ":ece"] = m.score, m.ece
        return head


@recipe("wise", WiseSpec)
def wise(spec: WiseSpec, run: RunDir) -> dict:
    points, timings = [], []
    for seed, member, sets, t0 in transfer_members(spec, run):
        regions, _ = learned_regions(member, run.store, "learned", spec.localize, progress=spec.progress)
        curves = {"WiSE-FT": member.ft}
        for budget, region in regions.items():
            if spec.graft_budgets is None or budget in spec.graft_budgets:
                curves[f"WiSE-{graft_label(budget)}"] = graft_variant(member, region, budget).graft
        for curve, target in curves.items():
            for alpha in spec.alphas:
                with interpolate(member.pre, target, alpha, head=spec.head) as scorer:
                    row = WisePoint(member.task, curve, alpha, seed)
                    for name, examples in sets.items():
                        m, _ = evaluate(scorer, examples)
                        row.sets[name] = SetScore(m["score"], m["ece"])
                points.append(row)
        timings.append({"source": member.task, "seed": seed, "seconds": round(time.perf_counter() - t0, 1)})
    curves_rows = _mean_curves(points)
    run.csv("points.csv", points)
    run.csv("curves.csv", curves_rows)
    for t in spec.transfers:
        for tg in t.targets:
            _plot(run, curves_rows, t.source, tg.task)
    run.report(_report(spec, curves_rows, timings))
    return {"points": points, "curves": curves_rows, "timings": timings}


def _mean_curves(points: list[WisePoint]) -> list[WisePoint]:
    """Each (source, curve, α) over seeds: the mean score and ECE on each set it was evaluated on (sources evaluate
    on different sets), the sets in the order first seen."""
    order = list(dict.fromkeys(name for p in points for name in p.sets))
    groups: dict[tuple, list[WisePoint]] = {}
    for p in points:
        groups.setdefault((p.source, p.curve, p.alpha), []).append(p)
    out = []
    for (source, curve, alpha), group in groups.items():
        sets = {}
        for name in order:
            have = [p.sets[name] for p in group if name in p.sets]
            if have:
                sets[name] = SetScore(float(np.mean([m.score for m in have])), float(np.mean([m.ece for m in have])))
        out.append(WisePoint(source, curve, alpha, n_seeds=len(group), sets=sets))
    return out


def _plot(run: RunDir, rows: list[WisePoint], source: str, target: str) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from skillgraft.evaluate import plots  # noqa: PLC0415 - selects the Agg backend

    id_set = f"{source} (ID)"
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    curves = [c for c in dict.fromkeys(r.curve for r in rows if r.source == source)]
    for i, curve in enumerate(curves):
        pts = sorted((r for r in rows if r.source == source and r.curve == curve), key=lambda r: r.alpha)
        xs = [100 * r.sets[id_set].score for r in pts]
        ys = [100 * r.sets[target].score for r in pts]
        style = "-o" if curve == "WiSE-FT" else "--s"
        ax.plot(xs, ys, style, ms=4, label=curve, color=f"C{i}")
        ax.plot(xs[-1:], ys[-1:], "*", ms=13, color=f"C{i}")  # α = 1: FT itself / the graft itself
    ax.plot(xs[:1], ys[:1], "kx", ms=9, label="α = 0 (head only)")
    ax.set_xlabel(f"ID accuracy: {source} (%)")
    ax.set_ylabel(f"OOD accuracy: {target} (%)")
    ax.set_title(f"{source} → {target}: WiSE-FT vs WiSE-graft\n(★ = α=1: FT / graft)", fontsize=9)
    ax.legend(fontsize=7)
    plots.save_figure(fig, run.file(f"wise_{source}_to_{target}.png"))


def _report(spec: WiseSpec, rows, timings) -> str:
    lines = ["# WiSE-FT vs WiSE-graft: ID vs OOD along interpolations (paper Fig. 7)", "",
             setting_line(spec, f"α grid {spec.alphas}, head policy '{spec.head}'"), "",
             "WiSE-FT: θ_pre + α(θ_ft − θ_pre). WiSE-graft: θ_pre + α·γ⊙(θ_ft − θ_pre). Accuracy in %, mean over "
             "data seeds (per-seed points in points.csv). With head policy 'carry' the fine-tuned head is used at "
             "every α, so α = 0 is the head-only model.", ""]
    for t in spec.transfers:
        src = t.source
        targets = [tg.task for tg in t.targets]
        header = ["curve", "α", f"{src} (ID)"] + targets
        mine = [r for r in rows if r.source == src]
        body = [[r.curve, r.alpha, f"{100 * r.sets[src + ' (ID)'].score:.1f}"]
                + [f"{100 * r.sets[tg].score:.1f}" for tg in targets] for r in mine]
        lines += [f"## {src}", "", md_table(header, body), ""]
        for tg in targets:
            best = max(mine, key=lambda r: r.sets[src + " (ID)"].score + r.sets[tg].score)
            lines.append(f"- best ID+OOD point → {tg}: {best.curve} α={best.alpha} "
                         f"({100 * best.sets[src + ' (ID)'].score:.1f}, {100 * best.sets[tg].score:.1f})")
            lines += ["", f"![{src} → {tg}](wise_{src}_to_{tg}.png)", ""]
    lines += ["Paper (Fig. 7e caption, QNLI → NLI, RoBERTa-base 4096-shot): optimal (ID, OOD) point of WiSE-FT "
              f"{FIG7_NLI_OPTIMA['WiSE-FT']}, of grafting {FIG7_NLI_OPTIMA['grafting']}; Fig. 7f: WiSE-graft gets a "
              "competitive ID-OOD curve for the sentiment transfer (no numbers printed).", "", PAPER_NOTE, "",
              "## Time", "", md_table(["source", "seed", "seconds"],
                                      [[x["source"], x["seed"], x["seconds"]] for x in timings]), ""]
    return "\n".join(lines)
