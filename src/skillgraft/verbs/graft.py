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
from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram
from skillgraft.evaluate.predict import labels_of
from skillgraft.data.spec import DataSpec, UserDataSpec
from skillgraft.graft.localizers import LOCALIZERS, get_localizer
from skillgraft.graft.selection import Budget, region_universe
from skillgraft.pipeline.regions import learned_regions, resolve_once
from skillgraft.pipeline.report import RunDir, write_csv
from skillgraft.pipeline.member import Member, PreState
from skillgraft.pipeline.workbench import Workbench
from skillgraft.pipeline.variants import Variant, base_variants, compare, graft_variant, score_ft_first
from skillgraft.spec import Spec
from skillgraft.verbs import converts_into_store
from skillgraft.verbs.graft_output import (BASELINE_LABELS, GraftReport, GraftResult, baseline_label, best_steps,
                                           fit_plot, fit_section, mean_share, parameters_line, report_markdown,
                                           share_plot, size_plot)
from skillgraft.models.spec import MAX_LENGTH

__all__ = ["BASELINE_LABELS", "GraftInputs", "GraftReport", "GraftResult", "ReportSpec", "best_steps", "graft",
           "graft_report", "mean_share", "parameters_line", "report_markdown", "share_plot", "size_plot"]


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


def graft_report(member: Member, run: RunDir, report: ReportSpec | None = None, options: Spec | None = None,
                 *, progress: bool = True, keep=None, frontier=None, notes=None, memory=None) -> GraftReport:
    """Learn regions for ``member`` and compare them (see the module doc); returns the typed report (metrics.json).

    ``options``: the localizer's own options, resolved once by the caller
    (:func:`~skillgraft.pipeline.regions.localizer_options`; None: its defaults);
    ``keep`` (a :class:`~skillgraft.keep.spec.KeepSpec` with targets) adds the smallest graft reaching each share
    of FT (:mod:`skillgraft.keep.run`; without budgets, only those); ``frontier`` (a
    :class:`~skillgraft.pipeline.frontier.FrontierSpec` with ``frontier`` on) adds the share-vs-density frontier;
    ``notes``: lines appended to report.md, or a function giving them once the work is done (the models and data
    of a pair: θ_pre of a lean pair loads during the work); ``memory``: the verb's memory plan (report.md, --json)."""
    report = report or ReportSpec()
    options = resolved(report.localizer, options)
    report = runnable_baselines(report, member, options)  # before any work
    if keep is not None and keep.any:
        from skillgraft.keep.selection import check_keep_rows, selection_split  # noqa: PLC0415

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
    grafts: dict[str, tuple[Budget, Variant]] = {}  # by budget key
    seed, graftable = getattr(options, "seed", 0), options.graftable
    for budget, region in regions.items():
        meta = {"localizer": report.localizer, "budget": budget.key, "localize": options.to_dict(),
                "finetuned_run": str(member.inputs.ft_dir)}
        graft = graft_variant(member, region, budget, meta, localizer=report.localizer, budget_key=budget.key)
        variants.append(graft)
        grafts[budget.key] = (budget, graft)
        size = Budget.parse(len(region)) if len(region) else None
        for name in report.baselines:
            if size is None:
                continue
            base_opts = baseline_options(name, graftable, seed)
            try:
                base_region = get_localizer(name).region(member.pre, member.ft, member.data, size, base_opts)
            except SkillgraftError:
                continue  # e.g. more coordinates than the model has biases
            variants.append(graft_variant(member, base_region, size, name=f"{baseline_label(name)} @ {graft.name}",
                                          kind="baseline", localizer=name, budget_key=budget.key))
        if report.lottery_zero:
            variants.append(Variant(f"lottery-ticket-zero @ {graft.name}", "lottery-zero", len(region), graft.graft,
                                    graft.budget, outside="zero", localizer=report.localizer, budget_key=budget.key))
    rows, probs = compare(member, variants, progress=progress)
    learned = {r.budget: r for r in rows if r.kind == "graft"}  # by their typed budget, not their names
    for budget, v in grafts.values():
        path = v.graft.save_pretrained(run.path / "grafts" / graft_folder(budget))
        learned[budget.key].file_bytes = (path / "graft.safetensors").stat().st_size
    for v in kept:
        path = v.graft.save_pretrained(run.path / "grafts" / v.name.replace(" ", "-"))
        next(r for r in rows if r.model == v.name).file_bytes = (path / "graft.safetensors").stat().st_size
    universe = (next(iter(regions.values())).universe_size if regions else
                sum(int(np.prod(s)) for s in region_universe(member.pre, options.graftable).values()))
    head_only = next((v for v in variants if v.kind == "head-only"), None)
    from skillgraft.pipeline.caveats import evaluation_source, graft_caveats  # noqa: PLC0415

    metrics = GraftReport(
        task=member.task, k=member.k, seed=member.seed, test_n=len(member.test), evaluated_on=evaluation_source(member),
        graftable_parameters=universe, total_parameters=member.total_parameters,
        all_parameters=sum(p.numel() for p in member.pre.parameters()),  # + the carried head (one count)
        localizer=report.localizer, localization=summary,
        carried_parameters=head_only.graft.carried_size if head_only else 0, rows=rows,
        placement=placement_record(member.pre),
        caveats=graft_caveats(member, rows, options.graftable))  # results that mean nothing: warned, noted
    metrics.fit = fit_section(summary, learned)  # did each learned region fit its selection rows, carry to test
    if metrics.fit is not None:
        fit_plot(summary.get("history") or [], summary.get("reference"), run.file("fit.png"))
    if memory is not None:
        metrics.memory_plan = memory.to_dict()
    if kept:
        from skillgraft.keep.report import keep_section  # noqa: PLC0415

        metrics.keep = keep_section(keep_summary, rows)
    if frontier is not None and frontier.frontier:
        from skillgraft.pipeline.frontier import frontier_report  # noqa: PLC0415

        metrics.frontier = frontier_report(member, run, frontier, report.localizer, options, keep, progress=progress)
    columns = [r.columns() for r in rows]  # the typed rows as their CSV/JSON columns, written here
    run.json("metrics.json", {**metrics.to_dict(), "rows": columns})
    write_csv(run.file("results.csv"), columns)
    shown = [r.model for r in rows if r.kind in ("ft", "graft", "keep")]
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


def resolved(localizer: str, options: Spec | None) -> Spec:
    """``options`` as resolved once by the run's entry (the verb, a recipe): the localizer's own Options (None: its
    defaults); anything else was not resolved and is refused (validated once per run, issue 79)."""
    loc = get_localizer(localizer)
    if options is None:
        return loc.options(None)
    if not isinstance(options, loc.Options):
        raise SkillgraftError(f"localizer {localizer!r} takes its resolved {loc.Options.__name__} here (got "
                              f"{type(options).__name__}): resolve it once with pipeline.regions.localizer_options")
    return options


def graft_folder(budget: Budget) -> str:
    """Folder name of a learned graft in a report: ``budget-0.001`` or ``round``."""
    return "round" if budget.rounding else f"budget-{budget.label}"


def placement_record(model) -> dict:
    """Where the run computed (models/placement.py): device, its name, precision — every report names them."""
    from skillgraft.models.placement import describe_module, device_of, precision_of  # noqa: PLC0415

    return {"device": str(device_of(model)), "precision": precision_of(model), "described": describe_module(model)}


# ---------------------------------------------------------------------------------------------- the verb
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
    from skillgraft.models.gguf import describe  # noqa: PLC0415
    from skillgraft.models.loading import base_model_note  # noqa: PLC0415

    inputs = member.inputs
    ref = inputs.pre_ref or getattr(member.pre, "ref", None)  # θ_pre's reference, handed down from its load
    # e.g. dequantized from a GGUF file (a recipe's bare θ_pre with no reference: its name resolved again)
    converted = describe(ref.path) if ref is not None else base_model_note(member.pre.base_model)
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
    options = resolve_once(report.localizer, localize)
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
