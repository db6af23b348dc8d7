"""The paper's own setting (Table 2), measured: prompt-based SGD fine-tuning, grafts at three sizes, beside the paper.

For each task and data seed: fine-tune with LM-BFF templates and label words (prompt mode, no new head; from
the store), learn regions with every configured localizer at ``budgets`` (the one regions cache,
:func:`skillgraft.pipeline.regions.learned_regions`), and score pre-trained, FT and every graft on the test subset
(:func:`skillgraft.pipeline.variants.compare`): accuracy (F1 for MRPC/QQP), ECE, agreement with FT, share of FT
and gap closed — from the pre-trained model in prompt mode (there is no head-only model), from head only in head
mode. The rows of each (task, seed) are stored too, so an interrupted run resumes where it stopped.

Besides Table 2 (whose ECE columns are Table 1's calibration question in the 64-shot setting):

- **Table 7 / Table 3 (OOD)**: for each (task, seed) whose task is the source of an ``ood`` transfer, the same
  models are scored zero-shot on each target's test set, its labels mapped into the source's
  (:mod:`skillgraft.pipeline.ood`); stored per target as "paper-ood-rows" entries beside "paper-rows".
- **Fig. 5 (optimizers)**: each of ``finetunes`` (FinetuneConfig fields laid over ``finetune``) fine-tunes
  ``finetune_tasks`` again, grafted by the reference localizer at every budget; its rows carry a ``finetune``
  column. Table 2 uses only ``finetune``.

- **The paper's fine-tuning choice (App. A)**: with ``grid``, each (task, seed)'s batch size and lr are chosen on dev
  (:mod:`skillgraft.pipeline.grid`: every point a store stage, the best dev score, ties to the first point; a
  screened grid then runs the chosen point on ``finetune``'s full schedule, e.g. 16·n·k steps); the grid's rows go
  to ``grid.csv`` and the report, and Table 2 grafts from the chosen fine-tuning.

Neither OOD nor Fig. 5 changes the store keys of the fine-tunings, regions or rows of Table 2. Writes ``metrics.csv``,
``summary.csv``, ``localizers.csv`` (mean share of FT per localizer × budget), ``ood.csv``, ``finetunes.csv``,
``grid.csv`` and
``report.md`` (Table 2 side by side with the paper's numbers, the localizer comparison, Table 7, Fig. 5 and the
wall time of every stage).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from skillgraft.data import get_task
from skillgraft.errors import SkillgraftError
from skillgraft.graft.selection import Budget
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.pipeline.ood import TargetSpec, TransferSpec, ood_examples, with_limits
from skillgraft.pipeline.paper_numbers import (PAPER_NOTE, TABLE2_64, TABLE3_4096, TABLE7_4096, TABLE7_COLUMNS,
                                              TABLE9_GPT2_64)
from skillgraft.pipeline.grid import GridSpec, choose, run_row
from skillgraft.pipeline.regions import learned_regions
from skillgraft.pipeline.report import RunDir, TaskRows, aggregate, md_table, pct
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.opening import prepare
from skillgraft.pipeline.store import data_digest
from skillgraft.pipeline.variants import Variant, base_variants, compare, graft_variant
from skillgraft.recipes.base import (ExperimentSpec, LocalizerRun, SeedsMixin, check_localizer_runs, recipe,
                                     size_budgets)
from skillgraft.spec import COUNT_MAX, Seed, Spec
from skillgraft.train import FinetuneConfig

SINGLE = ["SST-2", "sst-5", "mr", "cr", "mpqa", "subj", "trec", "ag_news"]
PAIRS = ["RTE", "MRPC", "QNLI", "SNLI", "MNLI", "QQP"]
# What the shared data's test split is where it is not LM-BFF's (data/MANIFEST.md).
STAND_INS = {"QQP": "no test split in the shared data: each draw is tested on the rows of the 9,999-example train "
                    "subset outside its own train + dev examples (LM-BFF: GLUE dev)",
             "MNLI": "TextFooler's 1,000-example tokenised sample of dev_matched (LM-BFF: all of dev_matched)",
             "ag_news": "full test; train pool is a 5,000-example sample of 120k",
             "QNLI": "GLUE dev (complete); train pool is a 9,999-example subset",
             "SNLI": "official test (complete); train pool is a 9,999-example subset"}
STAND_IN_TESTS = {"MNLI", "QQP"}  # marked † in Table 2: their test set is not LM-BFF's at all
MOONSHOT_TASKS = ["SST-2", "mr", "cr"]
METRICS = ["score", "accuracy", "ece", "agreement", "share_of_ft", "gap_closed"]
# The paper's OOD transfers (Tables 3 and 7), label maps as in recipes/ood.yaml (target label → source label).
# NLI: the paper's "MNLI (0/1)" keeps contradiction and entailment only (footnote 2).
_NLI_01 = {"entailment": "entailment", "contradiction": "not_entailment", "neutral": None}
_SAME01 = {"0": "0", "1": "1"}
PAPER_TRANSFERS = [
    {"source": "SST-2", "targets": [{"task": "imdb", "labels": {"neg": "0", "pos": "1"}},
                                    {"task": "yelp_polarity", "labels": _SAME01}]},
    {"source": "mpqa", "targets": [{"task": "SST-2", "labels": _SAME01}, {"task": "yelp_polarity", "labels": _SAME01}]},
    {"source": "QNLI", "targets": [{"task": "MNLI", "labels": _NLI_01}, {"task": "SNLI", "labels": _NLI_01}]},
]


class PaperSpec(ExperimentSpec, SeedsMixin):
    """Paper Table 2 (64-shot, prompt-based SGD FT, grafts ≤ 0.01%) on the configured model, beside the paper."""

    mode: Literal["head", "prompt", "causal"] = Field("prompt", description=(
        "scorer: prompt (the paper's: LM-BFF template + label words at the mask) | head | causal"))
    tasks: list[str] = Field(default_factory=lambda: SINGLE + PAIRS, min_length=1, description="tasks to run")
    seeds: list[Seed] = Field(default_factory=lambda: [13, 21, 42], min_length=1,
                             description="data seeds → mean (std); the paper uses [13, 21, 42, 87, 100]")
    task_seeds: dict[str, list[Seed]] = Field(default_factory=lambda: {t: [13] for t in PAIRS}, description=(
        "seeds of particular tasks instead of `seeds` (default: one seed for the sentence-pair tasks)"))
    budgets: list[Budget] = Field(default_factory=lambda: [Budget.parse(x) for x in (1e-5, 1e-4, 1e-3)],
                                  min_length=1, description="graft sizes, fractions of the body (or counts)")
    localizers: list[LocalizerRun] = Field(
        default_factory=lambda: [LocalizerRun(name="learned", label="paper (learned)",
                                              options={"steps": 50, "eval_every": 10})],
        min_length=1, description="localizers compared at every budget; the first is the reference (the paper's)")
    ood: list[TransferSpec] = Field(default_factory=lambda: [TransferSpec.build(t) for t in PAPER_TRANSFERS],
                                    description=(
        "Table 7 / Table 3 OOD sets: [{source, targets: [{task, labels: {target label: source label | null}}]}] "
        "(default: SST-2 → imdb, yelp_polarity; mpqa → SST-2, yelp_polarity; QNLI → MNLI, SNLI (0/1)); a "
        "transfer runs when its source is among `tasks`, on Table 2's models ([]: none)"))
    ood_limit: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "each OOD set: seeded sample of N examples after label mapping (not given: test_limit; null: all); a "
        "target's own `limit` wins"))
    ood_localizers: list[str] | None = Field(None, description=(
        "labels of the localizers whose grafts are scored on the OOD sets, beside the pre-trained and fine-tuned "
        "models (null: every localizer; the paper's Table 3 / Fig. 7 compare FT with its learned grafts)"))
    finetunes: dict[str, dict] = Field(default_factory=dict, description=(
        "Fig. 5: label → FinetuneConfig fields laid over `finetune` (an `optimizer` change without `lr` takes that "
        "optimizer's default lr), each fine-tuned on `finetune_tasks` and grafted by the reference localizer at "
        "every budget; one equal to `finetune` is Table 2's fine-tuning ({}: none)"))
    finetune_tasks: list[str] = Field(default_factory=lambda: ["SST-2"], min_length=1, description=(
        "tasks the `finetunes` run on (seeds as for Table 2)"))
    grid: GridSpec | None = Field(None, description=(
        "choose each (task, seed)'s batch size and lr on dev from this grid (the paper's: {batch_sizes: [2, 4, 8], "
        "lrs: [1e-2, 5e-3, 1e-3]}), each point a store stage; `finetune` gives the other settings (null: "
        "`finetune` as it is)"))

    @model_validator(mode="before")
    @classmethod
    def _ood_limits(cls, values):
        """``ood_limit`` defaults to ``test_limit``; each OOD target's ``limit`` to ``ood_limit``."""
        if not isinstance(values, dict):
            return values
        limit = values.get("ood_limit", values.get("test_limit", cls.model_fields["test_limit"].default))
        return {**values, "ood_limit": limit, "ood": with_limits(values.get("ood", PAPER_TRANSFERS), limit)}

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, v):
        return size_budgets(v)

    @model_validator(mode="after")
    def _check(self):
        check_localizer_runs(self.localizers, self.options_of)
        for t in list(self.tasks) + list(self.task_seeds) + list(self.finetune_tasks):
            try:
                get_task(t)
            except SkillgraftError as e:
                raise ValueError(str(e)) from None
        titles = [loc.title for loc in self.localizers]
        for label in self.ood_localizers or []:
            if label not in titles:
                raise ValueError(f"ood_localizers: {label!r} is not the label of a localizer (labels: {titles})")
        for i, transfer in enumerate(self.ood):
            try:
                transfer.check(f"ood[{i}]")
            except SkillgraftError as e:
                raise ValueError(str(e)) from None
        for label in self.finetunes:
            try:
                self.finetune_of(label)
            except SkillgraftError as e:
                raise ValueError(str(e)) from None
        return self

    def finetune_of(self, label: str) -> FinetuneConfig:
        """``finetunes[label]`` laid over ``finetune``; an optimizer change without ``lr`` takes its default lr."""
        base, over = self.finetune.to_dict(), self.finetunes[label]
        if not isinstance(over, dict):
            raise SkillgraftError(f"finetunes.{label}: expected FinetuneConfig fields, got {over!r}")
        if over.get("optimizer", base["optimizer"]) != base["optimizer"] and "lr" not in over:
            base.pop("lr")
        return FinetuneConfig.build({**base, **over}, where=f"finetunes.{label}")

    def localizers_ood(self) -> list[LocalizerRun]:
        """The localizers whose grafts are scored out of distribution (``ood_localizers``; None: all)."""
        wanted = self.ood_localizers
        return list(self.localizers) if wanted is None else [loc for loc in self.localizers if loc.title in wanted]

    def ood_of(self, task: str) -> list[tuple[int, TransferSpec]]:
        """The (index, transfer) pairs whose source is ``task``."""
        return [(i, t) for i, t in enumerate(self.ood) if t.source == get_task(task).name]

    def options_of(self, loc: LocalizerRun) -> Spec:
        """The localizer's validated options with this recipe's budgets (or the subset it names)."""
        return loc.resolved(self.budgets)

    def seeds_of(self, task: str) -> list[int]:
        return self.task_seeds.get(task) or self.task_seeds.get(get_task(task).name) or self.seeds


def rows_key(spec: PaperSpec, member: Member, localizers: list[LocalizerRun]) -> dict:
    """Store key of one (task, seed)'s rows: the member, the budgets, the localizers' resolved options."""
    return {"setup": member.identity(), "budgets": [b.key for b in spec.budgets],
            "localizers": [{"name": loc.name, "label": loc.title, "options": spec.options_of(loc).to_dict()}
                           for loc in localizers]}


def _variants(spec: PaperSpec, member: Member, run: RunDir, localizers: list[LocalizerRun], timing: dict
              ) -> list[Variant]:
    """Pre-trained (+ head only), FT and every localizer's graft at every budget (regions from the store)."""
    variants = base_variants(member)
    for loc in localizers:
        t0 = time.perf_counter()
        regions, summary = learned_regions(member, run.store, loc.name, spec.options_of(loc), progress=spec.progress)
        timing[f"regions {loc.title}"] = round(time.perf_counter() - t0, 1)
        timing[f"regions {loc.title} (computed)"] = round(summary.get("seconds", 0.0), 1)
        for budget in (b for b in spec.budgets if b in regions):
            variants.append(graft_variant(member, regions[budget], budget, {"localizer": loc.name},
                                          name=f"{loc.title} {budget.label}"))
            variants[-1].info = {"localizer": loc.title, "budget": budget.label,
                                 "best_step": (summary.get("best_step") or {}).get(budget.key)}
    return variants


def _label(member: Member) -> str:
    return f"{member.task}-{member.k}-{member.seed}-{member.pre.mode}"


def draw_rows(spec: PaperSpec, member: Member, run: RunDir, timing: dict,
              localizers: list[LocalizerRun] | None = None) -> list[dict]:
    """Rows of one (task, seed): pre-trained (+ head only), FT and every localizer's graft at every budget.

    Regions come from the regions cache; the rows themselves are stored too (keyed by the member, the
    localizers' resolved options and the budgets), so a re-run reads them back. ``localizers``: a subset of
    the spec's (default: all of them).
    """
    localizers = spec.localizers if localizers is None else localizers
    holder: dict = {}

    def make(folder: Path) -> None:
        variants = _variants(spec, member, run, localizers, timing)
        t0 = time.perf_counter()
        rows, _ = compare(member, variants, progress=spec.progress)
        timing["evaluation"] = round(time.perf_counter() - t0, 1)
        info = {v.name: v.info for v in variants}
        rows = [{"task": member.task, "seed": member.seed, **r, **info.get(r["model"], {})} for r in rows]
        write_json(folder / "rows.json", {"rows": rows, "timing": timing})
        holder["rows"] = rows

    entry = run.store.fetch("paper-rows", rows_key(spec, member, localizers), make, label=_label(member))
    if "rows" in holder:
        return holder["rows"]
    stored = read_json(entry / "rows.json", required=("rows",), what="stored paper rows")
    timing.update({f"{k} (stored run)": v for k, v in (stored.get("timing") or {}).items()
                   if k not in ("task", "seed")})
    return stored["rows"]


def ood_rows(spec: PaperSpec, member: Member, run: RunDir, source: str, target: TargetSpec, examples: list
             ) -> list[dict]:
    """Table 2's models of one (task, seed) on one OOD set (the grafts of ``ood_localizers``' localizers); stored as
    "paper-ood-rows" (key: those rows' key + the transfer, its limit and the target's data digest), beside and
    independent of "paper-rows"."""
    localizers = spec.localizers_ood()
    key = {**rows_key(spec, member, localizers),
           "ood": {"source": source, "target": target.to_dict(), "data": data_digest(target.task, spec.data_dir)}}
    holder: dict = {}

    def make(folder: Path) -> None:
        variants = _variants(spec, member, run, localizers, {})
        block, _ = compare(member, variants, examples, target.task, progress=spec.progress)
        info = {v.name: v.info for v in variants}
        holder["rows"] = [{"task": member.task, "seed": member.seed, "source": source, "eval": target.task, **r,
                           **info.get(r["model"], {})} for r in block]
        write_json(folder / "rows.json", {"rows": holder["rows"]})

    entry = run.store.fetch("paper-ood-rows", key, make, label=f"{_label(member)}-{target.task}")
    return holder.get("rows") or read_json(entry / "rows.json", required=("rows",), what="stored OOD rows")["rows"]


def _timed_member(spec: PaperSpec, run: RunDir, task: str, seed: int, title: str, grids: list | None = None
                 ) -> tuple[Member, dict, float]:
    """The member (fine-tuned or from the store), its timing row and the start time. With a ``grid``, the
    (batch, lr) chosen on dev first (each point a store stage; its rows appended to ``grids``)."""
    t0 = time.perf_counter()
    timing = {"task": title, "seed": seed}
    if spec.grid is None:
        member = spec.member(run, task, seed)
    else:
        data, go = spec.data_spec(task, seed), {"progress": spec.progress, "runtime": run.runtime}
        config, points = choose(run.store, spec.model_spec(), data, spec.finetune, spec.grid, **go)
        timing["grid"] = round(time.perf_counter() - t0, 1)
        timing["grid (computed)"] = round(sum(p["train_seconds"] or 0.0 for p in points), 1)
        if grids is not None:
            grids += points
        member = prepare(run.store, spec.model_spec(), data, config, **go)
    timing["fine-tuning"] = round(time.perf_counter() - t0 - timing.get("grid", 0.0), 1)
    ft_metrics = member.inputs.ft_dir / "metrics.json"
    if ft_metrics.is_file():
        timing["fine-tuning (computed)"] = read_json(ft_metrics).get("train_seconds")
    return member, timing, t0


@recipe("paper", PaperSpec)
def paper(spec: PaperSpec, run: RunDir) -> dict:
    # OOD sets first: a missing or unmappable one stops the run before any work
    ood_sets = {(i, j): ood_examples(t.source, tg, spec.data_dir, f"ood[{i}].targets[{j}]")
                for task in spec.tasks for i, t in spec.ood_of(task) for j, tg in enumerate(t.targets)}
    rows, oods, tuned, timings, grids = [], [], [], [], []
    for task in spec.tasks:
        for seed in spec.seeds_of(task):
            member, timing, t0 = _timed_member(spec, run, task, seed, get_task(task).name, grids)
            if spec.grid is not None and spec.grid.steps is not None:  # screened: the full-schedule run too
                grids.append(_chosen_row(member))
            rows += draw_rows(spec, member, run, timing)
            for i, t in spec.ood_of(task):
                for j, tg in enumerate(t.targets):
                    t1 = time.perf_counter()
                    oods += ood_rows(spec, member, run, t.source, tg, ood_sets[(i, j)])
                    timing[f"OOD {tg.task}"] = round(time.perf_counter() - t1, 1)
            timing["total"] = round(time.perf_counter() - t0, 1)
            timings.append(timing)
    ref = spec.localizers[0]
    for label in spec.finetunes:
        config = spec.finetune_of(label)
        main = config == spec.finetune
        for task in spec.finetune_tasks:
            for seed in spec.seeds_of(task):
                name = get_task(task).name
                found = [r for r in rows if r["task"] == name and r["seed"] == seed] if main else []
                if not found:
                    other = spec if main else spec.replace(finetune=config.to_dict(), grid=None)
                    member, timing, t0 = _timed_member(other, run, task, seed, f"{name} ({label})")
                    found = draw_rows(spec, member, run, timing, None if main else [ref])
                    timing["total"] = round(time.perf_counter() - t0, 1)
                    timings.append(timing)
                tuned += [{"finetune": label, "optimizer": config.optimizer, "lr": config.lr, "l1": config.l1, **r}
                          for r in found if r.get("localizer") in (None, ref.title)]
    agg, _ = run.seed_tables("metrics.csv", rows, ["task", "model", "kind", "localizer", "budget"],
                             METRICS + ["params"])
    table = localizer_table(spec, rows)
    run.csv("localizers.csv", table)
    if oods:
        run.csv("ood.csv", oods)
    if tuned:
        run.csv("finetunes.csv", tuned)
    if grids:
        run.csv("grid.csv", [{**g, "dev_history": " ".join(f"{x:.4f}" for x in g["dev_history"] if x is not None)}
                             for g in grids])
    run.report(report_markdown(spec, agg, table, timings, rows=rows, ood=oods, tuned=tuned, grids=grids))
    return {"rows": rows, "localizers": table, "timings": timings, "ood_rows": oods, "finetune_rows": tuned,
            "grid_rows": grids}


def _chosen_row(member: Member) -> dict:
    """The fine-tuning Table 2 uses after a screened grid (the chosen point on the full schedule), as a grid row."""
    config = member.inputs.finetune_config
    return {**run_row(member.inputs.ft_dir, config.batch_size, config.lr, screen=False, test_rows=len(member.test)),
            "chosen": "used"}


def _per_task_means(rows: list[dict], model: str, column: str) -> dict[str, float]:
    """{task: mean over seeds} of ``column`` for rows of ``model``."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["model"] == model and r.get(column) is not None:
            out.setdefault(r["task"], []).append(r[column])
    return {t: float(np.mean(v)) for t, v in out.items()}


def localizer_table(spec: PaperSpec, rows: list[dict]) -> list[dict]:
    """Per localizer × budget: mean share of FT over tasks (each the mean over its seeds), on the moonshot tasks,
    its difference to the reference (the first localizer) in points, and the mean gap closed."""
    ref = spec.localizers[0].title
    out = []
    for budget in spec.budgets:
        ref_share = _per_task_means(rows, f"{ref} {budget.label}", "share_of_ft")
        for loc in spec.localizers:
            name = f"{loc.title} {budget.label}"
            share = _per_task_means(rows, name, "share_of_ft")
            gap = _per_task_means(rows, name, "gap_closed")
            if not share:
                continue
            moon = [share[t] for t in (get_task(x).name for x in MOONSHOT_TASKS) if t in share]
            both = [t for t in share if t in ref_share]
            out.append({"localizer": loc.title, "budget": budget.label, "tasks": len(share),
                        "params": next(r["params"] for r in rows if r["model"] == name),
                        "share_of_ft": float(np.mean(list(share.values()))),
                        "share_moonshot_tasks": float(np.mean(moon)) if moon else None,
                        "vs_reference_points": 100 * float(np.mean([share[t] - ref_share[t] for t in both]))
                        if both else None,
                        "gap_closed": float(np.mean(list(gap.values()))) if gap else None})
    return out


def report_markdown(spec: PaperSpec, agg: list[dict], table: list[dict], timings: list[dict], *,
                    rows: list[dict] = (), ood: list[dict] = (), tuned: list[dict] = (), grids: list[dict] = ()
                    ) -> str:
    ref = _gap_reference(spec)
    small = [b for b in spec.budgets if b.fraction is not None and b.fraction <= 1e-4]  # the paper's ≤ 0.01%
    main = max(small, key=lambda b: b.fraction) if small else spec.budgets[0]
    first = spec.localizers[0].title
    model = spec.model or "bundled all-MiniLM-L6-v2"
    lines = ["# The paper's Table 2 setting, measured", "",
             f"Model {model}, {spec.mode} mode, {spec.finetune.optimizer.upper()} fine-tuning "
             f"({_schedule(spec)}), k={spec.k} per label, "
             "test subset "
             f"{spec.test_limit or 'full'} (seeded sample), grafts at {', '.join(b.label for b in spec.budgets)} of "
             f"the body. Score = accuracy (F1 for MRPC/QQP), ECE with 10 equal-width bins, in %; mean (std) over "
             f"data seeds. Share of FT = score ÷ FT score; gap closed = (score − {ref}) ÷ (FT − {ref}).", "",
             f"## Table 2 side by side (graft: {first} at {main.label})", "",
             "Paper: RoBERTa-base, 5 seeds, graft ≤ 0.01%. Paper share = graft ÷ FT of its printed means.", ""]
    head = ["task", "seeds", "FT", "FT ECE", "pre-trained", "graft", "graft ECE", "share of FT", "gap closed",
            "agreement", "paper FT", "paper FT ECE", "paper graft", "paper graft ECE", "paper share"]
    body = []
    for name, cell in task_cells(spec, agg):
        ft, pre, graft = cell.models["fine-tuned"], cell.models.get("pre-trained"), cell.graft(first, main.label)
        paper = TABLE2_64.get(name)
        pshare = (f"{100 * float(paper[2].split()[0]) / float(paper[0].split()[0]):.1f}" if paper else "-")
        body.append([name + (" †" if name in STAND_IN_TESTS else ""), ft["n_seeds"],
                     pct(ft["score"]), pct(ft["ece"]), pct(pre["score"]) if pre else "-",
                     pct(graft["score"]) if graft else "-", pct(graft["ece"]) if graft else "-",
                     pct(graft["share_of_ft"]) if graft else "-", pct(graft["gap_closed"]) if graft else "-",
                     pct(graft["agreement"]) if graft else "-", *(paper or ("-",) * 4), pshare])
    lines += [md_table(head, body), ""]
    lines += gpt2_section(spec, agg) + grid_section(spec, grids)
    notes = [f"- {t}: {STAND_INS[t]}" for t in (get_task(x).name for x in spec.tasks) if t in STAND_INS]
    if notes:
        lines += ["Test sets (where not LM-BFF's; † = a stand-in):", "", *notes, ""]
    lines += ["## Localizers at equal size", "",
              f"Mean share of FT over tasks (each task: mean over its seeds); 'vs {first}' = difference in points of "
              f"share of FT on the same tasks. Moonshot: ≥ 95% of FT at ≤ 1e-4 on {', '.join(MOONSHOT_TASKS)}.", "",
              md_table(["localizer", "budget", "params", "tasks", "share of FT", f"on {'/'.join(MOONSHOT_TASKS)}",
                        f"vs {first} (points)", "gap closed"],
                       [[t["localizer"], t["budget"], t["params"], t["tasks"], pct(t["share_of_ft"]),
                         pct(t["share_moonshot_tasks"]), "-" if t["vs_reference_points"] is None else
                         f"{t['vs_reference_points']:+.1f}", pct(t["gap_closed"])] for t in table]), ""]
    lines += ["## Every model, per task", ""]
    for task in spec.tasks:
        name = get_task(task).name
        group = [g for g in agg if g["task"] == name]
        if group:
            lines += [f"### {name}", "", md_table(
                ["model", "params", "score", "ECE", "agreement w/ FT", "share of FT", "gap closed"],
                [[g["model"], int(g["params"][0]) if g["params"] else 0, pct(g["score"]), pct(g["ece"]),
                  pct(g["agreement"]), pct(g["share_of_ft"]), pct(g["gap_closed"])] for g in group]), ""]
    lines += ood_section(spec, list(rows), list(ood)) + optimizer_section(spec, list(tuned))
    stages = list(dict.fromkeys(k for t in timings for k in t if k not in ("task", "seed")))
    lines += [PAPER_NOTE, "", "## Wall time (seconds)", "",
              "'(computed)' = the time the stage took when it was computed (it may come from the store now); "
              "'(stored run)' = the stage times of the run that stored the rows.", "",
              md_table(["task", "seed", *stages], [[t["task"], t["seed"], *(t.get(s, "-") for s in stages)]
                                                   for t in timings]), ""]
    return "\n".join(lines)


def _schedule(spec: PaperSpec) -> str:
    """The fine-tuning line of the report's header."""
    f = spec.finetune
    steps = f.steps or ("16·n·k" + (f" ≤ {f.max_steps}" if f.max_steps else ""))
    if spec.grid is None:
        return f"lr {f.lr:g}, batch {f.batch_size}, {steps} steps"
    g = spec.grid
    screen = f", each screened on {g.steps} steps" if g.steps else ""
    return (f"batch × lr chosen on dev from {g.batch_sizes} × {[float(x) for x in g.lrs]}{screen}; {steps} steps, "
            f"best dev checkpoint (dev every {f.eval_every} steps)")


def task_cells(spec: PaperSpec, agg: list[dict]):
    """``(task name, its aggregated rows)`` (a :class:`TaskRows`) of each task of the spec that has a fine-tuned row."""
    for task in spec.tasks:
        name = get_task(task).name
        cell = TaskRows.of(g for g in agg if g["task"] == name)
        if "fine-tuned" in cell.models:
            yield name, cell


def gpt2_section(spec: PaperSpec, agg: list[dict]) -> list[str]:
    """In causal mode: FT and the reference graft beside the paper's GPT-2 small (Table 9, 64-shot)."""
    if spec.mode != "causal":
        return []
    first = spec.localizers[0].title
    budgets = [b for b in spec.budgets if b.fraction is not None and b.fraction <= 5e-4]
    body = []
    for name, cell in task_cells(spec, agg):
        ft, pre = cell.models["fine-tuned"], cell.models.get("pre-trained")
        grafts = [cell.graft(first, b.label) for b in budgets]
        paper = TABLE9_GPT2_64.get(name)
        gain = 100 * (np.mean(ft["score"]) - np.mean(pre["score"])) if pre else None
        gap = 100 * np.mean(ft["score"]) - float(paper[0].split()[0]) if paper else None
        body.append([name, ft["n_seeds"], pct(pre["score"]) if pre else "-", pct(ft["score"]), pct(ft["ece"]),
                     "-" if gain is None else f"{gain:+.1f}", *(paper[:2] if paper else ("-", "-")),
                     "-" if gap is None else f"{gap:+.1f}",
                     *(pct(g["share_of_ft"]) if g else "-" for g in grafts), paper[2] if paper else "-"])
    if not body:
        return []
    return ["## Beside the paper's decoder (Table 9: GPT-2 small, 64-shot)", "",
            "FT − pre-trained and FT − paper FT in points (of the means over seeds); share of FT of the reference "
            "graft at each size ≤ 5e-4 (Table 9's grafts: ≤ 0.05 %).", "",
            md_table(["task", "seeds", "pre-trained", "FT", "FT ECE", "FT − pre-trained", "paper FT", "paper FT ECE",
                      "FT − paper FT", *(f"share of FT {b.label}" for b in budgets), "paper graft"], body), ""]


def grid_section(spec: PaperSpec, grids: list[dict]) -> list[str]:
    """The dev grid of every (task, seed): each point's best dev score, the chosen one and the run Table 2 uses."""
    if not grids:
        return []
    g = spec.grid
    lines = ["## Fine-tuning grid (chosen on dev)", "",
             f"Each point: SGD at (batch, lr) for {f'{g.steps} steps (a screen)' if g.steps else 'the full schedule'}"
             f", dev evaluated every "
             f"{g.eval_every if g.steps and g.eval_every is not None else spec.finetune.eval_every}"
             " steps; best dev score (accuracy, F1 for MRPC/QQP) and its step, the dev curve. Chosen: the best dev "
             "score, ties to the first point. "
             + ("'used' = the chosen (batch, lr) on the full schedule, the fine-tuning Table 2 grafts from. "
                if g.steps else "") + "Test scores are shown only (on the test rows given), never used.", ""]
    body = [[r["task"], r["seed"], r["batch_size"], f"{r['lr']:g}", r["steps"], pct(r["best_dev"]), r["best_step"],
             " ".join(f"{100 * x:.1f}" for x in r["dev_history"] if x is not None), pct(r["test_score"]),
             r["test_rows"], r["train_seconds"], {True: "chosen", False: "", "used": "used"}[r["chosen"]]]
            for r in grids]
    return lines + [md_table(["task", "seed", "batch", "lr", "steps", "best dev", "at step", "dev curve", "test",
                              "test rows", "train s", ""], body), ""]


def _gap_reference(spec: PaperSpec) -> str:
    return "head only" if spec.mode == "head" else "pre-trained"


def _paper_model(g: dict, reference: str) -> str | None:
    """The paper's Table 7 row beside one of our models: FT, or the reference localizer's graft at 0.01% etc."""
    if g["kind"] == "ft":
        return "Grafting 100% (FT)"
    fraction = Budget.parse(g["budget"]).fraction if g.get("localizer") == reference and g.get("budget") else None
    return f"Grafting {100 * fraction:g}%" if fraction is not None else None


def ood_section(spec: PaperSpec, rows: list[dict], ood: list[dict]) -> list[str]:
    """Table 7 (and Table 3): per source, ID and OOD score and ECE of every model, the paper's beside them."""
    if not ood:
        return []
    ref = spec.localizers[0].title
    targets: dict[str, list[str]] = {}
    for r in ood:
        targets.setdefault(r["source"], [])
        if r["eval"] not in targets[r["source"]]:
            targets[r["source"]].append(r["eval"])
    lines = ["## Table 7 (and Table 3): out of distribution", "",
             "Table 2's models of each source task, scored zero-shot on other tasks' test sets ("
             + (f"seeded subsets of up to {spec.ood_limit} examples" if spec.ood_limit else "every example")
             + " after label mapping; the rows scored are under each table) beside the source's own test subset (ID). "
             "Score (accuracy) and ECE in %, mean (std) over data seeds. Label maps, target label → source label "
             "(null: dropped):", ""]
    lines += [f"- {t.source} → {tg.task}: `{tg.labels or 'identity'}`" for t in spec.ood if t.source in targets
              for tg in t.targets]
    lines += ["", f"Paper: Table 7 (mpqa and QNLI sources) and Table 3 (SST-2 source) are **4096-shot** RoBERTa-base "
              f"accuracies (ours: {spec.k}-shot, the Table 2 setting); its 'Grafting 0.01%' / '0.1%' / '1%' rows "
              f"stand beside our {ref} grafts at 0.0001 / 0.001 / 0.01, 'Grafting 100% (FT)' beside FT.", ""]
    combined = [{**r, "source": r["task"], "eval": f"{r['task']} (ID)"} for r in rows if r["task"] in targets] + ood
    agg = aggregate(combined, ["source", "model", "kind", "localizer", "budget", "eval"], ["score", "ece"])
    for src, tgts in targets.items():
        evals = [f"{src} (ID)", *tgts]
        cell = {(g["model"], g["eval"]): g for g in agg if g["source"] == src}
        models = list(dict.fromkeys(g["model"] for g in agg if g["source"] == src))
        cols = [i for i, (s, t) in enumerate(TABLE7_COLUMNS) if s == src and (t == src or t in tgts)]
        body = []
        for m in models:
            first = next(cell[(m, e)] for e in evals if (m, e) in cell)
            paper = TABLE7_4096.get(_paper_model(first, ref) or "")
            body.append([m, first["n_seeds"], *(pct(cell[(m, e)]["score"]) if (m, e) in cell else "-" for e in evals),
                         *(pct(cell[(m, e)]["ece"]) if (m, e) in cell else "-" for e in evals),
                         *((paper[i] if paper else "-") for i in cols)])
        head = ["model", "seeds", *(f"{e} acc" for e in evals), *(f"{e} ECE" for e in evals),
                *(f"paper {TABLE7_COLUMNS[i][1]}{' (ID)' if TABLE7_COLUMNS[i][1] == src else ''}" for i in cols)]
        scored = {e: sorted({r["n"] for r in combined if r["source"] == src and r["eval"] == e and "n" in r})
                  for e in evals}
        lines += [f"### Source: {src}", "", md_table(head, body), "",
                  "Rows scored (per data seed): " + ", ".join(f"{e} {' / '.join(map(str, n))}" for e, n in
                                                              scored.items() if n) + ".", ""]
        table3 = ["- {} → {}: grafting {}, graft re-training {}, BitFit {}.".format(src, t, *TABLE3_4096[(src, t)])
                  for t in tgts if (src, t) in TABLE3_4096]
        if table3:
            lines += ["Paper's Table 3 (4096-shot OOD accuracy):", "", *table3, ""]
    return lines


def optimizer_section(spec: PaperSpec, tuned: list[dict]) -> list[str]:
    """Fig. 5: per task and fine-tuning, FT's score and the reference graft's share of FT at every budget."""
    if not tuned:
        return []
    ref, budgets = spec.localizers[0].title, [b.label for b in spec.budgets]
    agg = aggregate(tuned, ["task", "finetune", "model", "kind", "localizer", "budget"],
                    ["score", "ece", "share_of_ft", "gap_closed"])
    lines = ["## Fig. 5: the fine-tuning optimizer", "",
             f"Each fine-tuning of `finetunes`, on {', '.join(dict.fromkeys(r['task'] for r in tuned))} with Table "
             f"2's data seeds, grafted by {ref} at every budget. FT = that fine-tuning's test score; share of FT = "
             f"graft ÷ that FT; gap closed from {_gap_reference(spec)}. In %, mean (std) over data seeds.", "",
             "Paper (Fig. 5, RoBERTa-base, a figure without printed numbers): models fine-tuned with AdamW localize "
             "worse than SGD ones (a graft of the same size keeps less of FT's accuracy), and an L1 penalty on the "
             "movement θ − θ_pre during AdamW fine-tuning makes them localize again.", ""]
    body = []
    for task in dict.fromkeys(g["task"] for g in agg):
        for label in spec.finetunes:
            cell = TaskRows.of(g for g in agg if g["task"] == task and g["finetune"] == label)
            if "fine-tuned" not in cell.models:
                continue
            ft, conf = cell.models["fine-tuned"], spec.finetune_of(label)
            grafts = [cell.graft(ref, b) for b in budgets]
            settings = (f"{conf.optimizer} lr {conf.lr:g}" + (f", L1 λ {conf.l1:g}" if conf.l1 else "")
                        + (" (Table 2's)" if conf == spec.finetune else ""))
            body.append([task, label, settings, ft["n_seeds"], pct(ft["score"]), pct(ft["ece"]),
                         *(pct(g["share_of_ft"]) if g else "-" for g in grafts),
                         *(pct(g["gap_closed"]) if g else "-" for g in grafts)])
    head = ["task", "fine-tuning", "settings", "seeds", "FT", "FT ECE", *(f"share of FT {b}" for b in budgets),
            *(f"gap closed {b}" for b in budgets)]
    return lines + [md_table(head, body), ""]
