"""WiSE-FT and WiSE-graft recipe (paper Fig. 7): ID vs OOD accuracy along weight interpolations.

WiSE-FT: θ(α) = θ_pre + α(θ_ft − θ_pre); WiSE-graft: θ(α) = θ_pre + α·γ⊙(θ_ft − θ_pre), for α on a grid
in [0, 1] (:func:`skillgraft.graft.interpolate.interpolate`). With the default ``head: carry`` the
fine-tuned head is used at every α (α = 0 is "head only"); ``head: interpolate`` interpolates it too.
Writes ``points.csv`` (every α × curve × seed), ``curves.csv`` (mean over seeds), one PNG per OOD target
with the ID-vs-OOD curves of WiSE-FT and WiSE-graft (FT and the graft are their α = 1 ends), and a report.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from skillgraft.evaluate.predict import evaluate
from skillgraft.graft.interpolate import interpolate
from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.graft.selection import Budget
from skillgraft.io import atomic_path
from skillgraft.pipeline.paper_numbers import FIG7_NLI_OPTIMA, PAPER_NOTE
from skillgraft.pipeline.regions import learned_regions
from skillgraft.pipeline.report import RunDir, md_table, setting_line
from skillgraft.pipeline.transfers import transfer_setups
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


@recipe("wise", WiseSpec)
def wise(spec: WiseSpec, run: RunDir) -> dict:
    points, timings = [], []
    for seed, setup, sets, t0 in transfer_setups(spec, run):
        regions, _ = learned_regions(setup, run.store, "learned", spec.localize, progress=spec.progress)
        curves = {"WiSE-FT": setup.ft}
        for budget, region in regions.items():
            if spec.graft_budgets is None or budget in spec.graft_budgets:
                curves[f"WiSE-{graft_label(budget)}"] = graft_variant(setup, region, budget).graft
        for curve, target in curves.items():
            for alpha in spec.alphas:
                with interpolate(setup.pre, target, alpha, head=spec.head) as scorer:
                    row = {"source": setup.task, "seed": seed, "curve": curve, "alpha": alpha}
                    for name, examples in sets.items():
                        m, _ = evaluate(scorer, examples)
                        row[f"{name}:score"], row[f"{name}:ece"] = m["score"], m["ece"]
                points.append(row)
        timings.append({"source": setup.task, "seed": seed, "seconds": round(time.perf_counter() - t0, 1)})
    curves_rows = _mean_curves(points)
    run.csv("points.csv", points)
    run.csv("curves.csv", curves_rows)
    for t in spec.transfers:
        for tg in t.targets:
            _plot(run, curves_rows, t.source, tg.task)
    run.report(_report(spec, curves_rows, timings))
    return {"points": points, "curves": curves_rows, "timings": timings}


def _mean_curves(points: list[dict]) -> list[dict]:
    keys = list(dict.fromkeys(k for p in points for k in p if k.endswith(":score") or k.endswith(":ece")))
    out: dict[tuple, dict] = {}
    for p in points:
        g = (p["source"], p["curve"], p["alpha"])
        row = out.setdefault(g, {"source": p["source"], "curve": p["curve"], "alpha": p["alpha"], "n_seeds": 0,
                                 **{k: [] for k in keys}})
        row["n_seeds"] += 1
        for k in keys:
            if k in p:
                row[k].append(p[k])
    # sources evaluate on different sets: keep only the keys a curve has values for
    return [{k: (float(np.mean(v)) if k in keys else v) for k, v in r.items() if k not in keys or v}
            for r in out.values()]


def _plot(run: RunDir, rows: list[dict], source: str, target: str) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from skillgraft.evaluate import plots  # noqa: F401, PLC0415 - selects the Agg backend

    id_key, ood_key = f"{source} (ID):score", f"{target}:score"
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    curves = [c for c in dict.fromkeys(r["curve"] for r in rows if r["source"] == source)]
    for i, curve in enumerate(curves):
        pts = sorted((r for r in rows if r["source"] == source and r["curve"] == curve), key=lambda r: r["alpha"])
        xs = [100 * r[id_key] for r in pts]
        ys = [100 * r[ood_key] for r in pts]
        style = "-o" if curve == "WiSE-FT" else "--s"
        ax.plot(xs, ys, style, ms=4, label=curve, color=f"C{i}")
        ax.plot(xs[-1:], ys[-1:], "*", ms=13, color=f"C{i}")  # α = 1: FT itself / the graft itself
    ax.plot(xs[:1], ys[:1], "kx", ms=9, label="α = 0 (head only)")
    ax.set_xlabel(f"ID accuracy: {source} (%)")
    ax.set_ylabel(f"OOD accuracy: {target} (%)")
    ax.set_title(f"{source} → {target}: WiSE-FT vs WiSE-graft\n(★ = α=1: FT / graft)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(run.file(f"wise_{source}_to_{target}.png")) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


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
        body = [[r["curve"], r["alpha"], f"{100 * r[f'{src} (ID):score']:.1f}"]
                + [f"{100 * r[f'{tg}:score']:.1f}" for tg in targets] for r in rows if r["source"] == src]
        lines += [f"## {src}", "", md_table(header, body), ""]
        for tg in targets:
            best = max((r for r in rows if r["source"] == src), key=lambda r: r[f"{src} (ID):score"] + r[f"{tg}:score"])
            lines.append(f"- best ID+OOD point → {tg}: {best['curve']} α={best['alpha']} "
                         f"({100 * best[f'{src} (ID):score']:.1f}, {100 * best[f'{tg}:score']:.1f})")
            lines += ["", f"![{src} → {tg}](wise_{src}_to_{tg}.png)", ""]
    lines += ["Paper (Fig. 7e caption, QNLI → NLI, RoBERTa-base 4096-shot): optimal (ID, OOD) point of WiSE-FT "
              f"{FIG7_NLI_OPTIMA['WiSE-FT']}, of grafting {FIG7_NLI_OPTIMA['grafting']}; Fig. 7f: WiSE-graft gets a "
              "competitive ID-OOD curve for the sentiment transfer (no numbers printed).", "", PAPER_NOTE, "",
              "## Time", "", md_table(["source", "seed", "seconds"],
                                      [[x["source"], x["seed"], x["seconds"]] for x in timings]), ""]
    return "\n".join(lines)
