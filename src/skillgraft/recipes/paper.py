"""The paper's own setting (Table 2), measured: prompt-based SGD fine-tuning, grafts at three sizes, beside the paper.

For each task and data seed: fine-tune with LM-BFF templates and label words (prompt mode, no new head; from
the store), learn regions with every configured localizer at ``budgets`` (the one regions cache,
:func:`skillgraft.recipes.graft.learned_regions`), and score pre-trained, FT and every graft on the test subset
(:func:`skillgraft.pipeline.variants.compare`): accuracy (F1 for MRPC/QQP), ECE, agreement with FT, share of FT
and gap closed — from the pre-trained model in prompt mode (there is no head-only model), from head only in head
mode. The rows of each (task, seed) are stored too, so an interrupted run resumes where it stopped. Writes
``metrics.csv``, ``summary.csv``, ``localizers.csv`` (mean share of FT per localizer × budget) and ``report.md``
(Table 2 side by side with the paper's numbers, the localizer comparison and the wall time of every stage).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from skillgraft.data import get_task
from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers import get_localizer
from skillgraft.graft.selection import Budget
from skillgraft.io import read_json, write_json
from skillgraft.pipeline.report import RunDir, aggregate, md_table, pct, summary_rows
from skillgraft.pipeline.setup import Setup
from skillgraft.pipeline.variants import base_variants, compare, graft_variant
from skillgraft.recipes.base import ExperimentSpec, SeedsMixin, recipe
from skillgraft.recipes.graft import learned_regions
from skillgraft.recipes.paper_numbers import PAPER_NOTE, TABLE2_64
from skillgraft.spec import Spec

SINGLE = ["SST-2", "sst-5", "mr", "cr", "mpqa", "subj", "trec", "ag_news"]
PAIRS = ["RTE", "MRPC", "QNLI", "SNLI", "MNLI"]
# What the shared data's test split is where it is not LM-BFF's (data/MANIFEST.md); QQP has no test split.
STAND_INS = {"MNLI": "TextFooler's 1,000-example tokenised sample of dev_matched (LM-BFF: all of dev_matched)",
             "ag_news": "full test; train pool is a 5,000-example sample of 120k",
             "QNLI": "GLUE dev (complete); train pool is a 9,999-example subset",
             "SNLI": "official test (complete); train pool is a 9,999-example subset"}
MOONSHOT_TASKS = ["SST-2", "mr", "cr"]
METRICS = ["score", "accuracy", "ece", "agreement", "share_of_ft", "gap_closed"]


class LocalizerRun(Spec):
    """One localizer of the comparison: a registered name, its options and the label of its rows."""

    name: str = Field(description="registered localizer (docs/localizers.md)")
    label: str | None = Field(None, description="row label (default: the name)")
    options: dict = Field(default_factory=dict, description=(
        "the localizer's options; `budgets` here picks a subset of the recipe's `budgets` (default: all of them)"))

    @property
    def title(self) -> str:
        return self.label or self.name


class PaperSpec(ExperimentSpec, SeedsMixin):
    """Paper Table 2 (64-shot, prompt-based SGD FT, grafts ≤ 0.01%) on the configured model, beside the paper."""

    mode: Literal["head", "prompt", "causal"] = Field("prompt", description=(
        "scorer: prompt (the paper's: LM-BFF template + label words at the mask) | head | causal"))
    tasks: list[str] = Field(default_factory=lambda: SINGLE + PAIRS, min_length=1, description="tasks to run")
    seeds: list[int] = Field(default_factory=lambda: [13, 21, 42], min_length=1,
                             description="data seeds → mean (std); the paper uses [13, 21, 42, 87, 100]")
    task_seeds: dict[str, list[int]] = Field(default_factory=lambda: {t: [13] for t in PAIRS}, description=(
        "seeds of particular tasks instead of `seeds` (default: one seed for the sentence-pair tasks)"))
    budgets: list[Budget] = Field(default_factory=lambda: [Budget.parse(x) for x in (1e-5, 1e-4, 1e-3)],
                                  min_length=1, description="graft sizes, fractions of the body (or counts)")
    localizers: list[LocalizerRun] = Field(
        default_factory=lambda: [LocalizerRun(name="learned", label="paper (learned)",
                                              options={"steps": 50, "eval_every": 10})],
        min_length=1, description="localizers compared at every budget; the first is the reference (the paper's)")

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, v):
        out = [Budget.parse(b) for b in ([v] if isinstance(v, (int, float, str)) else v)]
        if any(b.rounding for b in out):
            raise ValueError("budgets must be sizes (fractions or counts); 'round' has no size to compare at")
        return out

    @model_validator(mode="after")
    def _check(self):
        titles = [loc.title for loc in self.localizers]
        if len(set(titles)) != len(titles):
            raise ValueError(f"localizers: two share a label ({titles}); give each a `label`")
        for i, loc in enumerate(self.localizers):
            try:
                self.options_of(loc)
            except SkillgraftError as e:
                raise ValueError(f"localizers[{i}] ({loc.name}): {e}") from None
        for t in list(self.tasks) + list(self.task_seeds):
            try:
                get_task(t)
            except SkillgraftError as e:
                raise ValueError(str(e)) from None
        return self

    def options_of(self, loc: LocalizerRun) -> Spec:
        """The localizer's validated options with this recipe's budgets (or the subset it names)."""
        mine = loc.options.get("budgets")
        budgets = self.budgets if mine is None else [Budget.parse(b) for b in mine]
        if any(b not in self.budgets for b in budgets):
            raise SkillgraftError(f"options.budgets {[b.label for b in budgets]} must be among the recipe's budgets "
                                  f"{[b.label for b in self.budgets]}")
        return get_localizer(loc.name).options({**loc.options, "budgets": [b.key for b in budgets]})

    def seeds_of(self, task: str) -> list[int]:
        return self.task_seeds.get(task) or self.task_seeds.get(get_task(task).name) or self.seeds


def draw_rows(spec: PaperSpec, setup: Setup, run: RunDir, timing: dict) -> list[dict]:
    """Rows of one (task, seed): pre-trained (+ head only), FT and every localizer's graft at every budget.

    Regions come from the regions cache; the rows themselves are stored too (keyed by the setup, the
    localizers' resolved options and the budgets), so a re-run reads them back.
    """
    options = [(loc, spec.options_of(loc)) for loc in spec.localizers]
    key = {"setup": setup.identity(), "budgets": [b.key for b in spec.budgets],
           "localizers": [{"name": loc.name, "label": loc.title, "options": o.to_dict()} for loc, o in options]}
    holder: dict = {}

    def make(folder: Path) -> None:
        variants = base_variants(setup)
        for loc, opts in options:
            t0 = time.perf_counter()
            regions, summary = learned_regions(setup, run.store, loc.name, opts, progress=spec.progress)
            timing[f"regions {loc.title}"] = round(time.perf_counter() - t0, 1)
            timing[f"regions {loc.title} (computed)"] = round(summary.get("seconds", 0.0), 1)
            for budget in (b for b in spec.budgets if b in regions):
                variants.append(graft_variant(setup, regions[budget], budget, {"localizer": loc.name},
                                              name=f"{loc.title} {budget.label}"))
                variants[-1].info = {"localizer": loc.title, "budget": budget.label,
                                     "best_step": (summary.get("best_step") or {}).get(budget.key)}
        t0 = time.perf_counter()
        rows, _ = compare(setup, variants, progress=spec.progress)
        timing["evaluation"] = round(time.perf_counter() - t0, 1)
        info = {v.name: v.info for v in variants}
        rows = [{"task": setup.task, "seed": setup.seed, **r, **info.get(r["model"], {})} for r in rows]
        write_json(folder / "rows.json", {"rows": rows, "timing": timing})
        holder["rows"] = rows

    entry = run.store.fetch("paper-rows", key, make, label=f"{setup.task}-{setup.k}-{setup.seed}-{setup.pre.mode}")
    if "rows" in holder:
        return holder["rows"]
    stored = read_json(entry / "rows.json", required=("rows",), what="stored paper rows")
    timing.update({f"{k} (stored run)": v for k, v in (stored.get("timing") or {}).items()
                   if k not in ("task", "seed")})
    return stored["rows"]


@recipe("paper", PaperSpec)
def paper(spec: PaperSpec, run: RunDir) -> dict:
    rows, timings = [], []
    for task in spec.tasks:
        for seed in spec.seeds_of(task):
            t0 = time.perf_counter()
            setup = spec.setup(run, task, seed)
            timing = {"task": setup.task, "seed": seed, "fine-tuning": round(time.perf_counter() - t0, 1)}
            ft_metrics = setup.ft_dir / "metrics.json"
            if ft_metrics.is_file():
                timing["fine-tuning (computed)"] = read_json(ft_metrics).get("train_seconds")
            rows += draw_rows(spec, setup, run, timing)
            timing["total"] = round(time.perf_counter() - t0, 1)
            timings.append(timing)
    agg = aggregate(rows, ["task", "model", "kind", "localizer", "budget"], METRICS + ["params"])
    table = localizer_table(spec, rows)
    run.csv("metrics.csv", rows)
    run.csv("summary.csv", summary_rows(agg, METRICS + ["params"]))
    run.csv("localizers.csv", table)
    run.report(report_markdown(spec, agg, table, timings))
    return {"rows": rows, "localizers": table, "timings": timings}


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


def report_markdown(spec: PaperSpec, agg: list[dict], table: list[dict], timings: list[dict]) -> str:
    ref = "head only" if spec.mode == "head" else "pre-trained"
    small = [b for b in spec.budgets if b.fraction is not None and b.fraction <= 1e-4]  # the paper's ≤ 0.01%
    main = max(small, key=lambda b: b.fraction) if small else spec.budgets[0]
    first = spec.localizers[0].title
    model = spec.model or "bundled all-MiniLM-L6-v2"
    lines = ["# The paper's Table 2 setting, measured", "",
             f"Model {model}, {spec.mode} mode, {spec.finetune.optimizer.upper()} fine-tuning "
             f"(lr {spec.finetune.lr:g}, "
             f"{spec.finetune.steps or f'16·n·k ≤ {spec.finetune.max_steps}'} steps), k={spec.k} per label, "
             "test subset "
             f"{spec.test_limit or 'full'} (seeded sample), grafts at {', '.join(b.label for b in spec.budgets)} of "
             f"the body. Score = accuracy (F1 for MRPC/QQP), ECE with 10 equal-width bins, in %; mean (std) over "
             f"data seeds. Share of FT = score ÷ FT score; gap closed = (score − {ref}) ÷ (FT − {ref}).", "",
             f"## Table 2 side by side (graft: {first} at {main.label})", "",
             "Paper: RoBERTa-base, 5 seeds, graft ≤ 0.01%. Paper share = graft ÷ FT of its printed means.", ""]
    head = ["task", "seeds", "FT", "FT ECE", "pre-trained", "graft", "graft ECE", "share of FT", "gap closed",
            "agreement", "paper FT", "paper FT ECE", "paper graft", "paper graft ECE", "paper share"]
    body = []
    for task in spec.tasks:
        name = get_task(task).name
        cell = {g["model"]: g for g in agg if g["task"] == name}
        if "fine-tuned" not in cell:
            continue
        ft, pre, graft = cell["fine-tuned"], cell.get("pre-trained"), cell.get(f"{first} {main.label}")
        paper = TABLE2_64.get(name)
        pshare = (f"{100 * float(paper[2].split()[0]) / float(paper[0].split()[0]):.1f}" if paper else "-")
        body.append([name + (" †" if STAND_INS.get(name, "").startswith("TextFooler") else ""), ft["n_seeds"],
                     pct(ft["score"]), pct(ft["ece"]), pct(pre["score"]) if pre else "-",
                     pct(graft["score"]) if graft else "-", pct(graft["ece"]) if graft else "-",
                     pct(graft["share_of_ft"]) if graft else "-", pct(graft["gap_closed"]) if graft else "-",
                     pct(graft["agreement"]) if graft else "-", *(paper or ("-",) * 4), pshare])
    lines += [md_table(head, body), ""]
    notes = [f"- {t}: {STAND_INS[t]}" for t in (get_task(x).name for x in spec.tasks) if t in STAND_INS]
    if "QQP" not in [get_task(x).name for x in spec.tasks]:
        notes.append("- QQP: not run — the shared data has no QQP test split (data/MANIFEST.md).")
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
    stages = list(dict.fromkeys(k for t in timings for k in t if k not in ("task", "seed")))
    lines += [PAPER_NOTE, "", "## Wall time (seconds)", "",
              "'(computed)' = the time the stage took when it was computed (it may come from the store now); "
              "'(stored run)' = the stage times of the run that stored the rows.", "",
              md_table(["task", "seed", *stages], [[t["task"], t["seed"], *(t.get(s, "-") for s in stages)]
                                                   for t in timings]), ""]
    return "\n".join(lines)
