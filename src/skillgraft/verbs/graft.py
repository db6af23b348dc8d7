"""``skillgraft graft``: learn regions for one fine-tuned model, compare them, write report.md (also the ``graft``
recipe and ``make demo``).

:func:`graft` is the verb (typed inputs in, a :class:`GraftResult` out): it decides once whether ``--finetuned`` is
a skillgraft run or a checkpoint pair, opens the :class:`~skillgraft.pipeline.member.Member` and writes the report
folder atomically; :func:`graft_report` is the report itself, on a :class:`~skillgraft.pipeline.workbench.Workbench`
of that one member.

For one fine-tuned model (a :class:`~skillgraft.pipeline.member.Member`) a localizer from the registry
(default ``learned``, paper Eq. 3–4: one trajectory, a region per budget) gives regions; every graft is
scored on the test subset beside the pre-trained model, the head-only model (head mode), the fine-tuned
model, matched-size baseline localizers (top-movement, random, bias-only) and lottery-ticket-zero (the
graft applied with zeros outside γ). Writes ``grafts/<budget>/`` (graft files), ``metrics.json``,
``results.csv``, ``share_vs_size.png``, ``reliability.png`` (the two report.md shows first, described),
``confidence.png``, ``accuracy_vs_size.png`` and ``report.md``.
Regions are kept in the store, keyed by the fine-tuned model, the data and the localizer's options, so a
re-run only re-scores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from skillgraft.lazy import np
from pydantic import Field

from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.plots import confidence_histogram, panel_margins, reliability_diagram, save_figure
from skillgraft.evaluate.predict import labels_of
from skillgraft.data.spec import DataSpec, UserDataSpec
from skillgraft.graft.localizers import LOCALIZERS, get_localizer
from skillgraft.graft.selection import Budget, region_universe
from skillgraft.pipeline.regions import learned_regions, localizer_options
from skillgraft.pipeline.report import RunDir, write_csv
from skillgraft.pipeline.member import Member, PreState
from skillgraft.pipeline.workbench import Workbench
from skillgraft.pipeline.variants import (ResultRow, Variant, base_variants, compare, graft_variant,
                                          score_ft_first)
from skillgraft.spec import Spec
from skillgraft.verbs import converts_into_store
from skillgraft.models.spec import MAX_LENGTH

# Report names of the baseline localizers (kept from the reports in bench/RESULTS.md).
BASELINE_LABELS = {"movement": "top-movement", "random": "random", "bias": "bias-only"}


class ReportSpec(Spec):
    """What a grafting report compares (the localizer's own settings are its options)."""

    localizer: str = Field("learned", description="localizer of the grafts (see docs/localizers.md)")
    baselines: list[str] = Field(default_factory=lambda: ["movement", "random", "bias"],
                                 description="matched-size baseline localizers (empty: none)")
    lottery_zero: bool = Field(True, description="also score each graft with zeros outside γ (lottery ticket)")


def releases_ft(report: ReportSpec, keep=None, frontier=None) -> bool:
    """Whether the report needs θ_ft in memory only to score FT (then a lean pair releases it, docs/scale.md):
    its localizer and baselines read θ_ft from its files (``Localizer.reads_files``); keep targets and the frontier
    need it loaded."""
    reads = [get_localizer(n).reads_files if n in LOCALIZERS else False for n in [report.localizer, *report.baselines]]
    return (all(reads)
            and not (keep is not None and keep.any) and not (frontier is not None and frontier.frontier))


def baseline_options(name: str, graftable: str, seed: int) -> dict:
    """Options of a matched-size baseline localizer: the graft's universe (and seed, for random); every
    other field is the baseline's own default."""
    if name == "bias":
        return {}
    return {"graftable": graftable, **({"seed": seed} if name == "random" else {})}


def runnable_baselines(report: ReportSpec, member: Member, options: Spec) -> ReportSpec:
    """``report`` without the baselines that cannot run on ``member`` (a sharded model, generative data), each
    named in one warning; an unknown baseline name is refused. Checked before any work."""
    import warnings  # noqa: PLC0415

    keep, left = [], []
    for name in report.baselines:
        loc = get_localizer(name)  # unknown names fail here
        model = member.ft if member.pre_state == PreState.DEFERRED else member.pre  # a lean pair: same mode
        try:
            loc.check(model, loc.options(baseline_options(name, options.graftable, getattr(options, "seed", 0))))
            keep.append(name)
        except SkillgraftError as e:
            left.append(f"{name} ({e})")
    if left:
        warnings.warn(f"baseline(s) left out of the report: {'; '.join(left)}", stacklevel=2)
        report = report.replace(baselines=keep)
    return report


def graft_report(member: Member, run: RunDir, report: ReportSpec | None = None, options: Spec | dict | None = None,
                 *, progress: bool = True, keep=None, frontier=None, notes=None, memory=None) -> dict:
    """Learn regions for ``member`` and compare them (see the module doc); returns the metrics.

    ``keep`` (a :class:`~skillgraft.graft.keep.KeepSpec` with targets) adds the smallest graft reaching each share
    of FT (:mod:`skillgraft.pipeline.keep`; without budgets, only those); ``frontier`` (a
    :class:`~skillgraft.pipeline.frontier.FrontierSpec` with ``frontier`` on) adds the share-vs-density frontier;
    ``notes``: lines appended to report.md, or a function giving them once the work is done (the models and data
    of a pair: θ_pre of a lean pair loads during the work); ``memory``: the verb's memory plan (report.md, --json)."""
    report = report or ReportSpec()
    options = localizer_options(report.localizer, options)
    report = runnable_baselines(report, member, options)  # before any work
    if keep is not None and keep.any:
        from skillgraft.pipeline.keep import check_keep_rows, selection_split  # noqa: PLC0415

        get_localizer(report.localizer).check_ranked(options)  # before any work (a --keep-data file's fault too)
        selection, _, note = selection_split(member, keep)
        check_keep_rows(keep, member.data.task, len(selection), note.split(" (")[0])
    keep_only = bool(keep is not None and keep.any and not getattr(options, "budgets", None))
    bench = Workbench.of(member, run.runtime)  # θ_pre and one fine-tuned model: merge's path with N = 1
    score_ft_first(bench, bench.names[0], release=releases_ft(report, keep, frontier), progress=progress)  # lean
    regions, summary = ({}, {}) if keep_only else learned_regions(member, run.store, report.localizer, options,
                                                                 progress=progress)
    variants: list[Variant] = base_variants(member)
    kept: list[Variant] = []
    if keep is not None and keep.any:
        from skillgraft.pipeline.keep import keep_variants  # noqa: PLC0415

        kept, keep_summary = keep_variants(member, run.store, report.localizer, options, keep, progress=progress)
        variants += kept
    grafts: dict[str, tuple[Budget, Variant]] = {}
    seed, graftable = getattr(options, "seed", 0), options.graftable
    for budget, region in regions.items():
        meta = {"localizer": report.localizer, "budget": budget.key, "localize": options.to_dict(),
                "finetuned_run": str(member.inputs.ft_dir)}
        graft = graft_variant(member, region, budget, meta)
        variants.append(graft)
        grafts[graft.name] = (budget, graft)
        size = Budget.parse(len(region)) if len(region) else None
        for name in report.baselines:
            if size is None:
                continue
            base_opts = baseline_options(name, graftable, seed)
            try:
                base_region = get_localizer(name).region(member.pre, member.ft, member.data, size, base_opts)
            except SkillgraftError:
                continue  # e.g. more coordinates than the model has biases
            variants.append(graft_variant(member, base_region, size, name=f"{BASELINE_LABELS.get(name, name)} @ "
                                          f"{graft.name}", kind="baseline"))
        if report.lottery_zero:
            variants.append(Variant(f"lottery-ticket-zero @ {graft.name}", "lottery-zero", len(region), graft.graft,
                                    graft.budget, outside="zero"))
    rows, probs = compare(member, variants, progress=progress)
    for name, (budget, v) in grafts.items():
        path = v.graft.save_pretrained(run.path / "grafts" / graft_folder(budget))
        next(r for r in rows if r.model == name).file_bytes = (path / "graft.safetensors").stat().st_size
    for v in kept:
        path = v.graft.save_pretrained(run.path / "grafts" / v.name.replace(" ", "-"))
        next(r for r in rows if r.model == v.name).file_bytes = (path / "graft.safetensors").stat().st_size
    universe = (next(iter(regions.values())).universe_size if regions else
                sum(int(np.prod(s)) for s in region_universe(member.pre, options.graftable).values()))
    head_only = next((v for v in variants if v.kind == "head-only"), None)
    from skillgraft.pipeline.caveats import evaluation_source, graft_caveats  # noqa: PLC0415

    metrics = {"task": member.task, "k": member.k, "seed": member.seed, "test_n": len(member.test),
               "evaluated_on": evaluation_source(member),
               "graftable_parameters": universe, "total_parameters": member.total_parameters,
               "all_parameters": sum(p.numel() for p in member.pre.parameters()),  # + the carried head (one count)
               "localizer": report.localizer, "localization": summary,
               "carried_parameters": head_only.graft.carried_size if head_only else 0, "rows": rows,
               "placement": placement_record(member.pre)}
    metrics["caveats"] = graft_caveats(member, rows, options.graftable)  # results that mean nothing: warned, noted
    from skillgraft.pipeline.fit import fit_plot, fit_section  # noqa: PLC0415

    by_budget = {budget.key: next(r for r in rows if r.model == name) for name, (budget, _) in grafts.items()}
    fit = fit_section(summary, by_budget)  # did each learned region fit its selection rows, and carry that to test
    if fit is not None:
        metrics["fit"] = fit
        fit_plot(summary.get("history") or [], summary.get("reference"), run.file("fit.png"))
    if memory is not None:
        metrics["memory_plan"] = memory.to_dict()
    if kept:
        from skillgraft.pipeline.keep import keep_section  # noqa: PLC0415

        metrics["keep"] = keep_section(keep_summary, rows)
    if frontier is not None and frontier.frontier:
        from skillgraft.pipeline.frontier import frontier_report  # noqa: PLC0415

        metrics["frontier"] = frontier_report(member, run, frontier, report.localizer, options, keep,
                                              progress=progress)
    columns = [r.columns() for r in rows]  # the typed rows as their CSV/JSON columns, written here
    run.json("metrics.json", {**metrics, "rows": columns})
    write_csv(run.file("results.csv"), columns)
    shown = [r["model"] for r in rows if r["kind"] in ("ft", "graft", "keep")]
    labels = labels_of(member.test)
    confidence_histogram({n: probs[n] for n in shown}, run.file("confidence.png"),
                         title=f"{member.task} test: confidence")
    reliability_diagram({n: (probs[n], labels) for n in shown}, run.file("reliability.png"),
                        title=f"{member.task} test: reliability")
    size_plot(rows, run.file("accuracy_vs_size.png"), member.data.task.metric)
    share_plot(rows, run.file("share_vs_size.png"))
    notes = notes() if callable(notes) else notes
    planned = "\n".join(["", *memory.markdown()]) if memory is not None else ""
    run.report(report_markdown(metrics) + ("\n".join(notes) + "\n" if notes else "") + planned)
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
    # the reference lines (black, gray, brown) and the localizers (the rest of tab10) never share a colour
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:pink", "tab:olive", "tab:cyan"]
    for i, (kind, pts) in enumerate(groups.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=kind, color=colours[i % len(colours)])
    for r in rows:
        if r["kind"] in ("ft", "head-only", "pre"):
            ax.axhline(r["score"], ls={"pre": ":"}.get(r["kind"], "--"), lw=1,
                       color={"ft": "k", "head-only": "gray"}.get(r["kind"], "tab:brown"), label=r["model"])
    ax.set_xscale("log")
    ax.set_xlabel("grafted parameters")
    ax.set_ylabel(metric)
    ax.legend(fontsize=7)
    panel_margins(fig)
    save_figure(fig, path, layout=False)


# share_vs_size.png: the learned grafts against the two closed-form regions a reader compares them with first
SHARE_CURVES = {"graft": ("learned", "tab:blue", "o-"), "keep": ("keep targets", "tab:purple", "D"),
                "top-movement": ("top-|Δ| (same size)", "tab:orange", "s--"),
                "random": ("random (same size)", "tab:green", "^:")}


def share_plot(rows: list[dict], path: Path) -> None:
    """Share of FT vs grafted parameters: learned grafts (and keep targets), top-|Δ| and random regions of the same
    sizes; FT at 1 and head only / pre-trained as lines (what report.md shows first)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.8))
    curves: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if not r["params"] or r.get("share_of_ft") is None or r["kind"] == "ft":
            continue
        kind = r["model"].split(" @ ")[0] if " @ " in r["model"] else r["kind"]
        if kind in SHARE_CURVES:
            curves.setdefault(kind, []).append((r["params"], r["share_of_ft"]))
    for kind, pts in curves.items():
        label, colour, style = SHARE_CURVES[kind]
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, color=colour)
    ax.axhline(1.0, ls="--", lw=1, color="k", label="fine-tuned (1)")
    for r in rows:
        if r["kind"] in ("head-only", "pre") and r.get("share_of_ft") is not None:
            ax.axhline(r["share_of_ft"], ls=":", lw=1, color="gray" if r["kind"] == "head-only" else "tab:brown",
                       label=r["model"])
    ax.set_xscale("log")
    ax.set_xlabel("grafted parameters (log)")
    ax.set_ylabel("share of FT's score")
    ax.legend(fontsize=7)
    panel_margins(fig)
    save_figure(fig, path, layout=False)


def figures_markdown(ref: str) -> list[str]:
    """report.md's figures, the two to look at first described: what each shows and how to read it."""
    return ["## Look first", "",
            "![share of FT vs size](share_vs_size.png)", "",
            "**Share of FT vs size** (`share_vs_size.png`): each graft's score as a share of the fine-tuned model's "
            "(y; 1 = as good as FT) against its size in grafted parameters (x, log). Blue: the learned grafts; "
            "orange: the top-|Δ| region of the same size (the coordinates that moved most in fine-tuning); green: a "
            "random region of the same size; dotted: head only / pre-trained. The skill is localized where blue "
            "stands above orange and green at small sizes: the learned region finds it where |Δ| and chance do "
            f"not. Sizes where blue reaches 1 keep all of FT's skill (the table's *gap closed* is from {ref}).", "",
            "![reliability](reliability.png)", "",
            "**Reliability diagram of FT vs the grafts** (`reliability.png`): one panel per model, its accuracy in "
            "each of 10 confidence bins (bars) against the diagonal (dashed: perfect calibration). A graft whose "
            "bars match FT's panel keeps FT's calibration as well as its accuracy; bars below the diagonal are "
            "over-confident, above under-confident (the panel's ECE, as the table's, sums the gaps).", "",
            "More figures: [confidence histogram](confidence.png) (how sure each model is on the test rows), "
            "[score vs size per localizer](accuracy_vs_size.png) (every baseline's raw score).", ""]


def best_steps(best) -> str:
    """``{"0.0001": 40, "0.001": 60}`` as a reader writes it: ``40 (budget 1e-4), 60 (budget 1e-3)``."""
    if not isinstance(best, dict):
        return str(best)

    def label(key) -> str:
        try:
            return f"{float(key):g}"
        except (TypeError, ValueError):
            return str(key)

    return ", ".join(f"{step} (budget {label(key)})" for key, step in best.items()) or "-"


def placement_record(model) -> dict:
    """Where the run computed (models/placement.py): device, its name, precision — every report names them."""
    from skillgraft.models.placement import describe_module, device_of, precision_of  # noqa: PLC0415

    return {"device": str(device_of(model)), "precision": precision_of(model), "described": describe_module(model)}


def parameters_line(metrics: dict) -> str:
    """The model's parameters, counted once and split: all of them = the base model's + the carried task head's;
    the graftable body is part of the base model's (issue 80: the report said 22,713,216, a finetune 22,713,986)."""
    carried = metrics["carried_parameters"]
    whole = metrics.get("all_parameters") or metrics["total_parameters"] + carried
    split = (f" = {metrics['total_parameters']:,} in the base model + {carried:,} in the carried task head (travels "
             "whole with every graft; counted separately)") if carried else \
        " (the base model's; no carried task head: the model scores with its own LM head)"
    return (f"Parameters: {whole:,}{split}; graftable (the body): {metrics['graftable_parameters']:,} of the base "
            "model's.")


def step_rate(loc: dict) -> str:
    """The localization's time per step, from one source: its wall time (scoring included, as the progress bar
    counts it) over its steps, with the median step alone beside it."""
    steps = (loc.get("config") or {}).get("steps") or 0
    trajectories = max(1, len(loc.get("budgets") or []) if (loc.get("config") or {}).get("per_size") else 1)
    taken = sum(s["step"] for s in loc["stopped"]) if loc.get("stopped") else steps * trajectories  # a fit schedule
    if loc.get("seconds") and taken:  # may stop a trajectory early: the steps it took
        per = loc["seconds"] / taken
        return (f"{per:.2f} s/step overall ({loc['seconds']:.0f} s for {taken} steps, scoring "
                f"included; a step alone {loc['step_seconds']:.2f} s, median)")
    return f"{loc['step_seconds']:.2f} s/step (median, scoring excluded)"


def report_markdown(metrics: dict) -> str:
    """The grafting report: one table (score, ECE, agreement with FT, parameters, file size) and plots."""
    metric = "F1" if any("f1" in r for r in metrics["rows"]) else "accuracy"
    loc = metrics["localization"]
    cfg = loc.get("config", {})
    ref = "head-only" if metrics["carried_parameters"] else "pre-trained"
    shots = f"{metrics['k']}-shot" if metrics["k"] else "all rows"  # k = 0: a user's data, every row
    lines = [f"# Grafting report — {metrics['task']}, {shots}, data seed {metrics['seed']}", "",
             f"Evaluated on {metrics.get('evaluated_on') or str(metrics['test_n']) + ' test rows'}. "
             + parameters_line(metrics), ""]
    from skillgraft.pipeline.caveats import caveat_markdown  # noqa: PLC0415

    lines += caveat_markdown(metrics.get("caveats"))
    if metrics["localizer"] == "learned" and "step_seconds" in loc:
        base = ("of each budget's own size (per_size)" if "base_size" not in loc else
                f"{loc['base_size']:,} coordinates (sparsity {cfg.get('sparsity', 0):g})")
        from skillgraft.graft.localizers.fit import ScheduleOptions  # noqa: PLC0415

        fit_default = ScheduleOptions()  # a field at its default is left out of the stored config
        schedule = (f"until fit share {cfg.get('fit_target', fit_default.fit_target):g} or "
                    f"{cfg.get('patience', fit_default.patience)} steps without "
                    f"gain, at most {cfg.get('steps')} steps" if cfg.get("schedule") == "fit" else
                    f"{cfg.get('steps')} steps")
        lines += [f"Localization: {schedule}, lr {cfg.get('lr', 0):g}, base patch {base}, "
                  f"{step_rate(loc)}, best step {best_steps(loc['best_step'])}.", ""]
    else:
        lines += [f"Localizer: {metrics['localizer']}.", ""]
    lines += figures_markdown(ref)  # the figures first, then the table (as the README says)
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
              "ECE: 10 equal-width bins over the max probability (Guo et al.).", ""]
    if metrics.get("fit"):
        from skillgraft.pipeline.fit import fit_markdown  # noqa: PLC0415

        lines += fit_markdown(metrics["fit"])
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


# ---------------------------------------------------------------------------------------------- the verb
@dataclass
class GraftResult:
    """What ``skillgraft graft`` wrote: the report folder, its metrics and how the data and labels were read."""

    out: Path
    metrics: dict
    data_note: str = ""
    labels_note: str = ""

    @property
    def rows(self) -> list[ResultRow]:
        """The report's typed rows (FT, the grafts, the baselines…; ``columns()``: results.csv's)."""
        return self.metrics["rows"]


@dataclass
class GraftInputs:
    """Where the models and data of ``skillgraft graft`` come from (the command line's own options)."""

    finetuned: str | Path  # as given: ./x stays a folder (a Path would make it the Hub id x)
    pretrained: str | None = None
    mode: str | None = None
    task: str | None = None
    max_length: int = MAX_LENGTH
    data: DataSpec = field(default_factory=DataSpec)          # only data_dir is read (a run: its own task data)
    user: UserDataSpec = field(default_factory=UserDataSpec)  # a pair's own data files


def is_run(inputs: GraftInputs) -> bool:
    """Whether ``--finetuned`` is a skillgraft run directory (else a Hugging Face checkpoint pair)."""
    from skillgraft.pipeline.opening import is_run_dir  # noqa: PLC0415

    f = inputs.finetuned
    return is_run_dir(f) or (inputs.pretrained is None and not (Path(f) / "config.json").is_file())


def default_out(inputs: GraftInputs) -> Path:
    """``<run>/graft`` for a run, ``runs/graft-<checkpoint name>`` for a pair."""
    f = Path(inputs.finetuned)
    return f / "graft" if is_run(inputs) else Path("runs") / f"graft-{f.name or 'model'}"


def check_inputs(inputs: GraftInputs) -> None:
    """One line, before any work, for inputs that name no data or two kinds of it."""
    f, user = inputs.finetuned, inputs.user
    if is_run(inputs):
        if user.data is not None or inputs.task is not None:
            raise SkillgraftError(f"--finetuned {f} is a skillgraft run: it grafts on its own task data "
                                  "(drop --data/--task, or give a Hugging Face checkpoint with --pretrained)")
        return
    if inputs.pretrained is None:
        raise SkillgraftError(f"--finetuned {f} is a Hugging Face checkpoint: give --pretrained, the "
                              "checkpoint it was fine-tuned from")
    if user.data is None and inputs.task is None:
        raise SkillgraftError("a checkpoint pair needs data: --data FILE (with its field names) or --task NAME")
    if user.data is not None and inputs.task is not None:
        raise SkillgraftError("give --data FILE or --task NAME, not both")


def open_member(inputs: GraftInputs, *, lean: bool = False, runtime=None) -> Member:
    """The Member of a run directory or of a checkpoint pair (``lean``: θ_ft scored, released, then read from files),
    its models placed on ``runtime``."""
    from skillgraft.pipeline.opening import from_pair, from_run  # noqa: PLC0415

    user, data = inputs.user, inputs.data
    if is_run(inputs):
        return from_run(inputs.finetuned, data_dir=data.data_dir, test_limit=user.test_limit,
                        pretrained=inputs.pretrained, runtime=runtime)
    spec = user if user.data is not None else DataSpec.build(
        {"task": inputs.task, **({"k": user.k} if user.k else {}), "seed": user.seed, "data_dir": data.data_dir,
         "test_limit": user.test_limit}, where="--task")  # a registered task: DataSpec's own k unless --k
    return from_pair(inputs.pretrained, str(inputs.finetuned), spec, mode=inputs.mode, max_length=inputs.max_length,
                     data_dir=data.data_dir, lean=lean, runtime=runtime)


def finetuned_name(member: Member) -> str:
    """The fine-tuned model as the user named it: its run folder (a skillgraft run's scorer carries its base's name,
    ``gemma-3-270m``), else the checkpoint."""
    ft_dir = member.inputs.ft_dir
    if ft_dir is not None and str(member.ft.base_model) == str(member.pre.base_model):
        return str(ft_dir)
    return str(member.ft.base_model)


def models_and_data(member: Member) -> list[str]:
    """The report's "Models and data" section of a checkpoint pair, or of any run whose base was converted from a
    GGUF file (which it names, quantization included; empty otherwise)."""
    from skillgraft.models.loading import base_model_note  # noqa: PLC0415

    inputs = member.inputs
    converted = base_model_note(inputs.pre_ref or member.pre.base_model)  # e.g. dequantized from a GGUF file
    if not (inputs.labels_note or inputs.graft_metadata.to_dict() or converted):
        return []
    lines = ["", "## Models and data", "",
             f"- pre-trained: `{member.pre.base_model}`; fine-tuned: `{finetuned_name(member)}`; scored as "
             f"`{member.pre.mode}`"]
    if converted:
        lines.append(f"- `{member.pre.base_model}`: {converted}")
    if inputs.data_files:
        more = ", …" if len(inputs.data_files) > 6 else ""
        shown = ", ".join(f"`{f}`" for f in inputs.data_files[:6]) + more
        lines.append(f"- data: {inputs.data_note or shown}; {len(member.data.train)} examples to localize on, "
                     f"{len(member.test)} held out" + (f" (files: {shown})" if inputs.data_note else ""))
    if inputs.labels_note:
        lines.append(f"- labels: {inputs.labels_note}")
    return lines


def plan_graft(inputs: GraftInputs, report: ReportSpec, options: Spec, lean: bool, runtime=None):
    """The memory plan of this graft (``pipeline/memory_plan.py``): (report, options, plan) with its choices made.
    When it does not fit only because of report rows the user did not ask for (the default random / top-movement
    baselines, lottery-ticket-zero's body backup), those rows are left out, in one warning."""
    import warnings  # noqa: PLC0415

    from skillgraft.models.memory import shape_of  # noqa: PLC0415
    from skillgraft.pipeline.memory_plan import plan_localization  # noqa: PLC0415

    pre_files = inputs.pretrained is not None and shape_of(inputs.pretrained) is not None

    def plan(rep: ReportSpec):
        return plan_localization("graft", inputs.finetuned, options, localizer=rep.localizer, baselines=rep.baselines,
                                 lottery_backup=rep.lottery_zero and not pre_files, lean=lean,
                                 max_length=inputs.max_length, runtime=runtime)
    try:
        return (report, *plan(report))
    except SkillgraftError as refused:
        given = report.model_fields_set
        light = {**({} if "baselines" in given else {"baselines": [b for b in report.baselines if b == "bias"]}),
                 **({} if "lottery_zero" in given or pre_files else {"lottery_zero": False})}
        lighter = report.replace(**light)
        left = [b for b in report.baselines if b not in lighter.baselines] + \
            (["lottery-ticket-zero"] if report.lottery_zero and not lighter.lottery_zero else [])
        if not left:
            raise
        try:
            options, memory = plan(lighter)
        except SkillgraftError as still:  # what would fit without those rows too
            raise SkillgraftError(f"{still} (the default report's {', '.join(left)} left out)") from refused
    line = f"left out of the report for memory: {', '.join(left)} (their rows hold per-coordinate state)"
    warnings.warn(f"memory plan: {line}", stacklevel=2)
    memory.choices.append(line[0].upper() + line[1:] + ".")
    return lighter, options, memory


@converts_into_store
def graft(inputs: GraftInputs, *, report: ReportSpec | None = None, localize: Spec | dict | None = None,
          keep=None, frontier=None, out: str | os.PathLike | None = None, overwrite: bool = False,
          cache: str | os.PathLike | None = None, runtime=None) -> GraftResult:
    """``skillgraft graft``: learn grafts for ``inputs`` and write the report folder ``out`` (atomically).

    ``localize``: the options of ``report.localizer`` set by the caller (its own defaults for the rest); every
    refusal (unknown option, no data, an existing ``out``) comes before any model loads. ``runtime``: where it
    computes (a :class:`~skillgraft.models.placement.Runtime`; None: the one the command line activated), passed
    down to everything below (the loaders, the Workbench, the report)."""
    from skillgraft.io import atomic_dir, check_target  # noqa: PLC0415
    from skillgraft.models.placement import boundary  # noqa: PLC0415
    from skillgraft.pipeline import Store  # noqa: PLC0415

    runtime = boundary(runtime)  # the one read of the placement the command line activated

    report = report or ReportSpec()
    options = localizer_options(report.localizer, localize)
    check_inputs(inputs)
    apart = {"--cache": Store(cache).root, "--finetuned": inputs.finetuned, "--pretrained": inputs.pretrained,
             "--data": inputs.user.data, "--eval-data": inputs.user.eval_data,
             "--data-dir": inputs.data.data_dir}  # what the command reads or fills: never inside --out
    out = check_target(Path(out) if out is not None else default_out(inputs), overwrite, apart)  # before any work
    lean = not is_run(inputs) and releases_ft(report, keep, frontier)
    report, options, memory = plan_graft(inputs, report, options, lean, runtime)  # before any work: fits, or one line
    member = open_member(inputs, lean=lean, runtime=runtime)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        run = RunDir(tmp, Store(cache), runtime=runtime)
        metrics = graft_report(member, run, report, options, keep=keep, frontier=frontier,
                               notes=lambda: models_and_data(member), memory=memory)
    return GraftResult(out, metrics, member.inputs.data_note, member.inputs.labels_note)
