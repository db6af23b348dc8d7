"""The grafting report (``skillgraft graft``, ``make demo``: the ``graft`` recipe with :data:`DEMO`): learn regions,
compare them, write report.md.

For one fine-tuned model (a :class:`~skillgraft.pipeline.setup.Setup`) a localizer from the registry
(default ``learned``, paper Eq. 3–4: one trajectory, a region per budget) gives regions; every graft is
scored on the test subset beside the pre-trained model, the head-only model (head mode), the fine-tuned
model, matched-size baseline localizers (top-movement, random, bias-only) and lottery-ticket-zero (the
graft applied with zeros outside γ). Writes ``grafts/<budget>/`` (graft files), ``metrics.json``,
``results.csv``, ``confidence.png``, ``reliability.png``, ``accuracy_vs_size.png`` and ``report.md``.
Regions are kept in the store, keyed by the fine-tuned model, the data and the localizer's options, so a
re-run only re-scores.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from pydantic import Field

from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram, save_figure
from skillgraft.evaluate.predict import labels_of
from skillgraft.graft.localizers import LocalizeConfig, get_localizer
from skillgraft.graft.selection import Budget, region_universe
from skillgraft.pipeline.regions import learned_regions, localizer_options
from skillgraft.pipeline.report import RunDir, write_csv
from skillgraft.pipeline.setup import Setup
from skillgraft.pipeline.variants import Variant, base_variants, compare, graft_variant, score_ft_first
from skillgraft.recipes.base import RECIPES, ExperimentSpec, recipe, run_spec
from skillgraft.spec import SEED_MAX, Spec
from skillgraft.train import FinetuneConfig

# Report names of the baseline localizers (kept from the reports in bench/RESULTS.md).
BASELINE_LABELS = {"movement": "top-movement", "random": "random", "bias": "bias-only"}
# Localizers that read θ_ft from its checkpoint files, tensor by tensor (a report using only these releases it).
READS_FILES = ("learned", "movement", "ties-trim", "random", "bias")


class ReportSpec(Spec):
    """What a grafting report compares (the localizer's own settings are its options)."""

    localizer: str = Field("learned", description="localizer of the grafts (see docs/localizers.md)")
    baselines: list[str] = Field(default_factory=lambda: ["movement", "random", "bias"],
                                 description="matched-size baseline localizers (empty: none)")
    lottery_zero: bool = Field(True, description="also score each graft with zeros outside γ (lottery ticket)")


def releases_ft(report: ReportSpec, keep=None, frontier=None) -> bool:
    """Whether the report needs θ_ft in memory only to score FT (then a lean pair releases it, docs/scale.md):
    its localizer and baselines read θ_ft from its files; keep targets and the frontier need it loaded."""
    return (report.localizer in READS_FILES and all(b in READS_FILES for b in report.baselines)
            and not (keep is not None and keep.keep) and not (frontier is not None and frontier.frontier))


def baseline_options(name: str, graftable: str, seed: int) -> dict:
    """Options of a matched-size baseline localizer: the graft's universe (and seed, for random); every
    other field is the baseline's own default."""
    if name == "bias":
        return {}
    return {"graftable": graftable, **({"seed": seed} if name == "random" else {})}


def runnable_baselines(report: ReportSpec, setup: Setup, options: Spec) -> ReportSpec:
    """``report`` without the baselines that cannot run on ``setup`` (a sharded model, generative data), each
    named in one warning; an unknown baseline name is refused. Checked before any work."""
    import warnings  # noqa: PLC0415

    keep, left = [], []
    for name in report.baselines:
        loc = get_localizer(name)  # unknown names fail here
        model = setup.pre if setup.pre is not None else setup.ft  # a lean pair: θ_pre not loaded yet (same mode)
        try:
            loc.check(model, loc.options(baseline_options(name, options.graftable, getattr(options, "seed", 0))))
            keep.append(name)
        except SkillgraftError as e:
            left.append(f"{name} ({e})")
    if left:
        warnings.warn(f"baseline(s) left out of the report: {'; '.join(left)}", stacklevel=2)
        report = report.replace(baselines=keep)
    return report


def graft_report(setup: Setup, run: RunDir, report: ReportSpec | None = None, options: Spec | dict | None = None,
                 *, progress: bool = True, keep=None, frontier=None) -> dict:
    """Learn regions for ``setup`` and compare them (see the module doc); returns the metrics.

    ``keep`` (a :class:`~skillgraft.graft.keep.KeepSpec` with targets) adds the smallest graft reaching each share
    of FT (:mod:`skillgraft.pipeline.keep`; without budgets, only those); ``frontier`` (a
    :class:`~skillgraft.pipeline.frontier.FrontierSpec` with ``frontier`` on) adds the share-vs-density frontier."""
    report = report or ReportSpec()
    options = localizer_options(report.localizer, options)
    report = runnable_baselines(report, setup, options)  # before any work
    if keep is not None and keep.keep:
        get_localizer(report.localizer).check_ranked()  # before any work
    keep_only = bool(keep is not None and keep.keep and not getattr(options, "budgets", None))
    score_ft_first(setup, release=releases_ft(report, keep, frontier), progress=progress)  # a lean pair
    regions, summary = ({}, {}) if keep_only else learned_regions(setup, run.store, report.localizer, options,
                                                                 progress=progress)
    variants: list[Variant] = base_variants(setup)
    kept: list[Variant] = []
    if keep is not None and keep.keep:
        from skillgraft.pipeline.keep import keep_variants  # noqa: PLC0415

        kept, keep_summary = keep_variants(setup, run.store, report.localizer, options, keep, progress=progress)
        variants += kept
    grafts: dict[str, tuple[Budget, Variant]] = {}
    seed, graftable = getattr(options, "seed", 0), options.graftable
    for budget, region in regions.items():
        meta = {"localizer": report.localizer, "budget": budget.key, "localize": options.to_dict(),
                "finetuned_run": str(setup.ft_dir)}
        graft = graft_variant(setup, region, budget, meta)
        variants.append(graft)
        grafts[graft.name] = (budget, graft)
        size = Budget.parse(len(region)) if len(region) else None
        for name in report.baselines:
            if size is None:
                continue
            base_opts = baseline_options(name, graftable, seed)
            try:
                base_region = get_localizer(name).region(setup.pre, setup.ft, setup.data, size, base_opts)
            except SkillgraftError:
                continue  # e.g. more coordinates than the model has biases
            variants.append(graft_variant(setup, base_region, size, name=f"{BASELINE_LABELS.get(name, name)} @ "
                                          f"{graft.name}", kind="baseline"))
        if report.lottery_zero:
            variants.append(Variant(f"lottery-ticket-zero @ {graft.name}", "lottery-zero", len(region), graft.graft,
                                    graft.budget, outside="zero"))
    rows, probs = compare(setup, variants, progress=progress)
    for name, (budget, v) in grafts.items():
        path = v.graft.save_pretrained(run.path / "grafts" / graft_folder(budget))
        row = next(r for r in rows if r["model"] == name)
        row["file_bytes"] = (path / "graft.safetensors").stat().st_size
    for v in kept:
        path = v.graft.save_pretrained(run.path / "grafts" / v.name.replace(" ", "-"))
        next(r for r in rows if r["model"] == v.name)["file_bytes"] = (path / "graft.safetensors").stat().st_size
    universe = (next(iter(regions.values())).universe_size if regions else
                sum(int(np.prod(s)) for s in region_universe(setup.pre, options.graftable).values()))
    head_only = next((v for v in variants if v.kind == "head-only"), None)
    metrics = {"task": setup.task, "k": setup.k, "seed": setup.seed, "test_n": len(setup.test),
               "graftable_parameters": universe, "total_parameters": setup.total_parameters,
               "localizer": report.localizer, "localization": summary,
               "carried_parameters": head_only.graft.carried_size if head_only else 0, "rows": rows}
    from skillgraft.pipeline.caveats import graft_caveats  # noqa: PLC0415

    metrics["caveats"] = graft_caveats(setup, rows, options.graftable)  # results that mean nothing: warned, noted
    if kept:
        from skillgraft.pipeline.keep import keep_section  # noqa: PLC0415

        metrics["keep"] = keep_section(keep_summary, rows)
    if frontier is not None and frontier.frontier:
        from skillgraft.pipeline.frontier import frontier_report  # noqa: PLC0415

        metrics["frontier"] = frontier_report(setup, run, frontier, report.localizer, options, keep,
                                              progress=progress)
    run.json("metrics.json", metrics)
    write_csv(run.file("results.csv"), rows)
    shown = [r["model"] for r in rows if r["kind"] in ("ft", "graft", "keep")]
    labels = labels_of(setup.test)
    confidence_histogram({n: probs[n] for n in shown}, run.file("confidence.png"),
                         title=f"{setup.task} test: confidence")
    reliability_diagram({n: (probs[n], labels) for n in shown}, run.file("reliability.png"),
                        title=f"{setup.task} test: reliability")
    size_plot(rows, run.file("accuracy_vs_size.png"), setup.data.task.metric)
    run.report(report_markdown(metrics))
    return metrics


def graft_folder(budget: Budget) -> str:
    """Folder name of a learned graft in a report: ``budget-0.001`` or ``round``."""
    return "round" if budget.rounding else f"budget-{budget.label}"


def size_plot(rows: list[dict], path: Path, metric: str) -> None:
    """Score vs grafted parameters per localizer, with FT / head only / pre-trained as lines."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.8))
    groups: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["params"] and r["kind"] != "ft":
            kind = r["model"].split(" @ ")[0] if " @ " in r["model"] else "learned graft"
            groups.setdefault(kind, []).append((r["params"], r["score"]))
    for kind, pts in groups.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=kind)
    for r in rows:
        if r["kind"] in ("ft", "head-only", "pre"):
            ax.axhline(r["score"], ls="--", lw=1, color={"ft": "k", "head-only": "gray"}.get(r["kind"], "r"),
                       label=r["model"])
    ax.set_xscale("log")
    ax.set_xlabel("grafted parameters")
    ax.set_ylabel(metric)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def report_markdown(metrics: dict) -> str:
    """The grafting report: one table (score, ECE, agreement with FT, parameters, file size) and plots."""
    metric = "F1" if any("f1" in r for r in metrics["rows"]) else "accuracy"
    loc = metrics["localization"]
    cfg = loc.get("config", {})
    ref = "head-only" if metrics["carried_parameters"] else "pre-trained"
    shots = f"{metrics['k']}-shot" if metrics["k"] else "all rows"  # k = 0: a user's data, every row
    lines = [f"# Grafting report — {metrics['task']}, {shots}, data seed {metrics['seed']}", "",
             f"Test examples: {metrics['test_n']}. Graftable parameters (body): {metrics['graftable_parameters']:,} "
             f"of {metrics['total_parameters']:,}. Carried task head: {metrics['carried_parameters']:,} parameters "
             "(travels whole with every graft; counted separately).", ""]
    from skillgraft.pipeline.caveats import caveat_markdown  # noqa: PLC0415

    lines += caveat_markdown(metrics.get("caveats"))
    if metrics["localizer"] == "learned" and "step_seconds" in loc:
        lines += [f"Localization: {cfg.get('steps')} steps, lr {cfg.get('lr', 0):g}, base patch "
                  f"{loc['base_size']:,} coordinates (sparsity {cfg.get('sparsity', 0):g}), "
                  f"{loc['step_seconds']:.2f} s/step, best step {loc['best_step']}.", ""]
    else:
        lines += [f"Localizer: {metrics['localizer']}.", ""]
    lines += [f"| model | params | density | {metric} | share of FT | gap closed | ECE | agreement w/ FT | file |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in metrics["rows"]:
        gap = f"{r['gap_closed']:.2f}" if "gap_closed" in r else "-"
        size = f"{r['file_bytes'] / 1024:.1f} KiB" if r.get("file_bytes") else "-"
        share = f"{r['share_of_ft']:.3f}" if "share_of_ft" in r else "-"
        lines.append(f"| {r['model']} | {r['params']:,} | {r['density']:.2e} | {r['score']:.4f} | "
                     f"{share} | {gap} | {r['ece']:.4f} | {r.get('agreement', 1.0):.3f} | {size} |")
    if any("loss" in r for r in metrics["rows"]):  # generative data (docs/generative.md)
        lines += ["", "| model | completion loss | share of FT's loss drop | token accuracy | exact match |",
                  "|---|---:|---:|---:|---:|"]
        for r in metrics["rows"]:
            rec = f"{r['loss_recovered']:.3f}" if "loss_recovered" in r else "-"
            em = f"{r['exact_match']:.4f}" if "exact_match" in r else "-"
            lines.append(f"| {r['model']} | {r['loss']:.4f} | {rec} | {r['token_accuracy']:.4f} | {em} |")
        lines += ["", "*completion loss*: mean token cross-entropy on the completion tokens (held out); *share of FT's "
                  "loss drop* = (L_pre − L) ÷ (L_pre − L_FT); *exact match*: the gold completion is the most likely of "
                  "the label completions (when completions are labels)."]
    lines += ["", f"*share of FT* = score ÷ fine-tuned score; *gap closed* = (score − {ref}) ÷ (FT − {ref}); "
              "ECE: 10 equal-width bins over the max probability (Guo et al.).", "",
              "![confidence](confidence.png)", "", "![reliability](reliability.png)", "",
              "![accuracy vs size](accuracy_vs_size.png)", ""]
    if metrics.get("keep"):
        from skillgraft.pipeline.keep import keep_markdown  # noqa: PLC0415

        lines += keep_markdown(metrics["keep"])
    if metrics.get("frontier"):
        from skillgraft.pipeline.frontier import frontier_markdown  # noqa: PLC0415

        lines += frontier_markdown(metrics["frontier"])
    return "\n".join(lines)


def mean_share(rows: list[dict]) -> float:
    """Mean share of FT over the learned grafts of a report (a one-number summary)."""
    vals = [r["share_of_ft"] for r in rows if r["kind"] == "graft" and "share_of_ft" in r]
    return float(np.mean(vals)) if vals else float("nan")


# ---------------------------------------------------------------------------------------------- as a recipe
class GraftRecipeSpec(ExperimentSpec):
    """Fine-tune a model (or find it in the store), then the grafting report (``recipe: graft``; the demo)."""

    task: str = Field("SST-2", description="task name (see `skillgraft tasks`)")
    seed: int = Field(42, ge=0, le=SEED_MAX, description="data seed")
    localize: LocalizeConfig = Field(default_factory=LocalizeConfig, description="the learned localizer's settings")
    report: ReportSpec = Field(default_factory=ReportSpec, description="what the report compares")


@recipe("graft", GraftRecipeSpec)
def graft_recipe(spec: GraftRecipeSpec, run: RunDir) -> dict:
    options = localizer_options(spec.report.localizer, spec.localize)  # refused before any fine-tuning
    t0 = time.perf_counter()
    setup = spec.setup(run, spec.task, spec.seed)
    t1 = time.perf_counter()
    metrics = graft_report(setup, run, spec.report, options, progress=spec.progress)
    t2 = time.perf_counter()
    ft = spec.finetune
    text = (run.path / "report.md").read_text()
    text += (f"\nFine-tuning: {ft.steps} {ft.optimizer.upper()} steps, lr {ft.lr:g}, batch {ft.batch_size}, "
             f"{setup.pre.pooling} pooling, {'frozen' if ft.freeze_embeddings else 'trained'} embeddings "
             f"(stored in `{setup.ft_dir.parent.name}`).\n\n"
             f"Wall time of this run: fine-tuning stage {t1 - t0:.0f} s (≈0 when stored), grafting and "
             f"evaluation {t2 - t1:.0f} s.\n")
    run.report(text)
    return metrics

# ---------------------------------------------------------------------------------------------- the demo
# The main job (``make demo``): MiniLM, SST-2 64-shot → fine-tune → grafts at 3 sizes → report. Its stages live in
# the store (``runs/cache`` by default): a second run finds the fine-tuned model and the regions there and only
# re-scores and re-writes the report, which replaces ``runs/demo`` whole when complete.
DEMO = GraftRecipeSpec(
    recipe="graft", task="SST-2", k=64, seed=42, progress=True,
    finetune=FinetuneConfig(optimizer="sgd", lr=0.1, batch_size=8, steps=400, eval_every=100),
    localize=LocalizeConfig(sparsity=1e-4, steps=50, budgets=[1e-4, 3e-4, 1e-3], eval_every=10),
)


def run_demo(out: str | os.PathLike = "runs/demo", *, seed: int = 42, data_dir: str | os.PathLike | None = None,
             cache: str | os.PathLike | None = None) -> Path:
    """Run (or resume) the demo; returns the path of ``report.md``."""
    spec = DEMO.replace(seed=seed, data_dir=data_dir)
    return run_spec(RECIPES["graft"], spec, out, cache=cache, overwrite=True) / "report.md"


# ---------------------------------------------------------------------------------------------- sweep
LEARNED_MAX = 1e-2  # learned regions beyond this size are top-movement in all but name


class SweepSpec(Spec):
    """Region sizes of a sparsity sweep (paper Figs. 2/4) and which localizers to draw."""

    levels: list[Budget] = Field(default_factory=lambda: [Budget.parse(x) for x in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)],
                                 min_length=1, description="region sizes (fractions of the graftable body)")
    learned: bool = Field(True, description="include learned grafts (one trajectory; levels ≤ 1e-2)")
    localizers: list[str] = Field(default_factory=lambda: ["movement", "random"],
                                  description="score-based localizers drawn at every level")


def sweep_report(setup: Setup, run: RunDir, sweep: SweepSpec | None = None, localize: LocalizeConfig | None = None,
                 *, progress: bool = True) -> list[dict]:
    """Test score of every localizer's region at each level; writes ``sweep.csv`` and ``sweep.png``."""
    sweep = sweep or SweepSpec()
    localize = localize or LocalizeConfig()
    levels = sorted(set(sweep.levels), key=lambda b: b.size(10**12))
    variants = [v for v in base_variants(setup) if v.kind == "ft"]
    learned = {}
    small = [lv for lv in levels if lv.fraction is not None and lv.fraction <= LEARNED_MAX]
    if sweep.learned and small:
        learned, _ = learned_regions(setup, run.store, "learned", localize.replace(budgets=small), progress=progress)
    points = []
    for level in levels:
        regions = {BASELINE_LABELS.get(n, n): get_localizer(n).region(
                       setup.pre, setup.ft, setup.data, level, baseline_options(n, localize.graftable, localize.seed))
                   for n in sweep.localizers}
        if level in learned:
            regions["learned"] = learned[level]
        for name, region in regions.items():
            variants.append(graft_variant(setup, region, level, name=f"{name} {level.label}", kind="graft"))
            points.append((name, level))
    rows, _ = compare(setup, variants, progress=progress)
    ft_score = rows[0]["score"]
    out = [{"localizer": name, "level": level.fraction if level.fraction is not None else level.label,
            "params": r["params"], "score": r["score"], "ece": r["ece"], "agreement": r["agreement"],
            "ft_score": ft_score} for (name, level), r in zip(points, rows[1:])]
    write_csv(run.file("sweep.csv"), out)
    _sweep_plot(out, ft_score, run.file("sweep.png"), setup.task)
    return out


def _sweep_plot(rows: list[dict], ft_score: float, path: Path, task: str) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name in dict.fromkeys(r["localizer"] for r in rows):
        pts = sorted((float(r["level"]), r["score"]) for r in rows if r["localizer"] == name)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
    ax.axhline(ft_score, color="k", ls="--", lw=1, label="fine-tuned")
    ax.set_xscale("log")
    ax.set_xlabel("region size (fraction of graftable parameters)")
    ax.set_ylabel("test score")
    ax.set_title(f"{task}: graft score vs sparsity")
    ax.legend(fontsize=8)
    save_figure(fig, path)
