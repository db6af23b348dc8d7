"""Multi-task skill regions (paper §5.1, Fig. 8, App. C.2 Figs. 11–12).

1. Fine-tune one body on all tasks together (a batch from a random task each step) and, for reference,
   each task alone (the store's single-task fine-tuning); test scores of both.
2. For each γ_base sparsity (0 = the paper's Fig. 8; 1e-5, 1e-4 = Figs. 11–12) and task i, learn γ_i on
   L_i with θ_pre = the pre-trained body and θ_ft = the multi-task body (task i's MT head carried).
3. Matrices (CSV + heatmap): overlap O[i, j] = |γ_i ∩ γ_j| / |γ_j|; relative gain
   Rel[i, j] = (P_{γ_i, j} − P_{0, j}) / (P_{1, j} − P_{0, j}) (Eq. 5), P_0 = pre-trained body with task
   j's MT head, P_1 = the MT model.
4. Unions γ_G of task groups and their relative gains on every task; "purified" unions: a few localizer
   steps from γ_base = γ_G on the joint loss Σ_{i∈G} L_i.

The multi-task model (kind ``multitask``) and the task regions (the one regions cache,
:func:`skillgraft.pipeline.regions.learned_regions`) live in the store, keyed by the resolved specs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from skillgraft.evaluate.plots import save_figure
from skillgraft.evaluate.predict import evaluate
from skillgraft.graft import Graft, LocalizeConfig, Region, localize
from skillgraft.graft.scoring import evaluate_graft
from skillgraft.graft.selection import region_universe
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.pipeline.report import RunDir, md_table
from skillgraft.pipeline.member import Member, MemberInputs
from skillgraft.pipeline.regions import learned_regions
from skillgraft.pipeline.store import data_digest, model_digest, precision_key
from skillgraft.recipes.base import ExperimentSpec, OneSeedMixin, TaskNames, inherit_finetune, recipe
from skillgraft.spec import COUNT_MAX, Spec
from skillgraft.train import FinetuneConfig
from skillgraft.train.multitask import JointScorer, MultiTaskScorer, multitask_finetune, tag


class PurifySpec(Spec):
    """Localizer steps from γ_base = γ_G on the joint loss Σ_{i∈G} L_i (paper: 10)."""

    steps: int = Field(10, ge=0, le=COUNT_MAX, description="localizer steps from γ_base = γ_G (paper: 10)")
    select_on: Literal["train+dev", "train", "last"] = Field(
        "last", description="which step's region is kept (last: the region after the last step)")


class MultitaskSpec(ExperimentSpec, OneSeedMixin):
    """Tasks on one body; their regions' overlap and relative gains; unions of groups and their purification."""

    tasks: TaskNames = Field(default_factory=lambda: ["SST-2", "cr", "ag_news", "QNLI"], min_length=2,
                             description="tasks fine-tuned together on one body (each once)")
    multitask: FinetuneConfig = Field(default_factory=FinetuneConfig, description=(
        "the multi-task run (a batch from a random task each step; best mean dev kept); fields left out take "
        "`finetune`'s, except steps"))
    localize: LocalizeConfig = Field(default_factory=LocalizeConfig, description=(
        "the task regions γ_i (sparsity is set per γ_base by `bases`: leave it out)"))
    bases: list[Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=lambda: [0.0], min_length=1, description=(
        "γ_base sparsities: 0 (Fig. 8), 1e-5 (Fig. 11), 1e-4 (Fig. 12); unions use the first"))
    groups: list[TaskNames] = Field(default_factory=list, description=(
        "task groups G (each a list of `tasks`): the union γ_G and its purification are scored on every task"))
    purify: PurifySpec = Field(default_factory=PurifySpec, description="purification of each union γ_G")

    @model_validator(mode="before")
    @classmethod
    def _inherit(cls, values):
        return inherit_finetune(values, "multitask", drop=("steps",))

    @model_validator(mode="after")
    def _check(self) -> MultitaskSpec:
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks: each task once, got {self.tasks}")
        for g in self.groups:
            missing = [t for t in g if t not in self.tasks]
            if not g or missing:
                raise ValueError(f"groups: group {g} must name tasks of `tasks` (not there: {missing})")
        if self.localize.sparsity != LocalizeConfig.model_fields["sparsity"].default:
            raise ValueError("localize.sparsity: set per γ_base by `bases` in this recipe; leave it out")
        return self


def heatmap(matrix: np.ndarray, rows: list[str], cols: list[str], path, *, title: str, vmin=None, vmax=None,
            fmt: str = "{:.2f}", xlabel: str = "", ylabel: str = ""):
    """A labelled heatmap PNG with the value printed in each cell (NaN cells blank)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(cols), 1.0 + 0.7 * len(rows)))
    im = ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = matrix[i, j]
            if np.isfinite(v):
                ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7,
                        color="white" if (vmax is not None and v < (vmin or 0) + 0.5 * ((vmax or 1) - (vmin or 0)))
                        else "black")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.046)
    return save_figure(fig, path)


def relative_gain(p_graft: float, p0: float, p1: float) -> float:
    """Rel_{γ,t} = (P_{γ,t} − P_{0,t}) / (P_{1,t} − P_{0,t}) (paper Eq. 5); NaN when P_1 = P_0."""
    return (p_graft - p0) / (p1 - p0) if abs(p1 - p0) > 1e-12 else float("nan")


class _Context:
    """Everything the steps share: the data, the MT model (and its store entry), a pre-trained MT model."""

    def __init__(self, spec: MultitaskSpec, data: dict):
        self.spec, self.tasks, self.data = spec, spec.tasks, data
        self.batch = spec.eval_batch_size

    def test(self, task: str):
        return self.data[task].test

    def score_graft(self, region: Region, task: str) -> float:
        graft = Graft.from_models(self.pre[task], self.mt[task], region)
        return evaluate_graft(self.pre[task], graft, self.test(task), batch_size=self.batch)[0]["score"]

    def member(self, task: str) -> Member:
        """Task ``task``'s view of the MT model beside the pre-trained body, as a Member (regions cache key)."""
        inputs = MemberInputs(self.data[task], self.mt_entry, None,
                              data_root=str(self.spec.data_dir) if self.spec.data_dir else None)
        return Member(task, inputs, self.mt[task], self.pre[task])


def train_multitask(spec: MultitaskSpec, run: RunDir, data: dict) -> tuple[MultiTaskScorer, dict, Path]:
    """The multi-task model of ``spec`` (trained once, then from the store), its training info, its entry."""
    cfg, model = spec.multitask, spec.model_spec()
    key = {"model": model.to_dict(), "model_digest": model_digest(model.model),
           "data": [{"task": t, "k": spec.k, "seed": spec.seed, "digest": data_digest(t, spec.data_dir)}
                    for t in spec.tasks],
           "multitask": cfg.to_dict(), **precision_key(run.runtime)}
    holder: dict = {}

    def make(folder: Path) -> None:
        mt = MultiTaskScorer.build(model.model, spec.tasks, model.mode, pooling=model.pooling,
                                   max_length=model.max_length, head_seed=cfg.seed)
        res = multitask_finetune(mt, {t: (d.train, d.dev) for t, d in data.items()}, cfg, progress=spec.progress)
        mt.save_pretrained(folder / "model")
        write_json(folder / "info.json", {"steps": res.steps, "best_step": res.best_step, "best_dev": res.best_dev,
                                          "task_steps": res.task_steps, "seconds": round(res.seconds, 1),
                                          "history": res.history})
        holder["mt"] = mt

    entry = run.store.fetch("multitask", key, make, label=f"{'+'.join(spec.tasks)}-{spec.k}-{spec.seed}")
    mt = holder.get("mt") or MultiTaskScorer.from_pretrained(entry / "model")
    return mt, read_json(entry / "info.json"), entry


def task_regions(ctx: _Context, run: RunDir, base: float) -> tuple[dict[str, Region], dict]:
    """γ_i per task for one γ_base sparsity (the store's regions of each task's view of the MT model)."""
    loc = ctx.spec.localize.replace(sparsity=float(base))
    out, info = {}, {}
    for t in ctx.tasks:
        found, summary = learned_regions(ctx.member(t), run.store, "learned", loc, progress=ctx.spec.progress)
        out[t] = next(iter(found.values()))
        moved = [r for r in summary.get("history", []) if any(k.endswith(":iou_prev") for k in r)]
        last = moved[-1] if moved else {}
        info[t] = {"size": len(out[t]), "base_size": summary.get("base_size"), "seconds": round(summary["seconds"], 1),
                   "steps": summary.get("config", {}).get("steps"), "last_scored_step": last.get("step"),
                   # IoU of the last scored region with the one scored before it: ≈ 1 once the region stops moving
                   "iou_prev": next((v for k, v in last.items() if k.endswith(":iou_prev")), None)}
    return out, info


@recipe("multitask", MultitaskSpec)
def multitask(spec: MultitaskSpec, run: RunDir) -> dict:
    t_start = time.perf_counter()
    tasks = spec.tasks
    timings: dict[str, float] = {}

    # 1. single-task FT (the store's) and multi-task FT
    t0 = time.perf_counter()
    single, data = {}, {}
    for t in tasks:
        member = spec.member(run, t, spec.seed)
        data[t] = member.data
        single[t] = evaluate(member.ft, member.test, batch_size=spec.eval_batch_size)[0]["score"]
        del member
    ctx = _Context(spec, data)
    timings["single_task_ft_and_eval"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ctx.mt, mt_info, ctx.mt_entry = train_multitask(spec, run, data)
    timings["multitask_ft"] = time.perf_counter() - t0
    ctx.pre = MultiTaskScorer.build(spec.model, tasks, spec.mode, pooling=spec.pooling, max_length=spec.max_length)
    for m in (ctx.mt, ctx.pre):
        m.eval()
    universe = region_universe(ctx.pre[tasks[0]])
    p1 = {t: evaluate(ctx.mt[t], ctx.test(t), batch_size=ctx.batch)[0]["score"] for t in tasks}
    p0 = {t: ctx.score_graft(Region.empty(universe), t) for t in tasks}
    acc_rows = [{"task": t, "single_task_ft": single[t], "multitask_ft": p1[t], "pre_with_mt_head": p0[t],
                 "n_test": len(ctx.test(t))} for t in tasks]
    run.csv("accuracy.csv", acc_rows)

    # 2–3. task regions per γ_base, overlap and relative-gain matrices
    bases = spec.bases
    matrix_rows, region_rows, per_base = [], [], {}
    for base in bases:
        t0 = time.perf_counter()
        regions, info = task_regions(ctx, run, base)
        overlap = np.array([[regions[i].overlap(regions[j]) for j in tasks] for i in tasks])
        rel = np.full((len(tasks), len(tasks)), np.nan)
        score = np.full((len(tasks), len(tasks)), np.nan)
        for a, i in enumerate(tasks):
            for b, j in enumerate(tasks):
                score[a, b] = ctx.score_graft(regions[i], j)
                rel[a, b] = relative_gain(score[a, b], p0[j], p1[j])
                matrix_rows.append({"base": base, "region": i, "task": j, "overlap": overlap[a, b],
                                    "score": score[a, b], "relative_gain": rel[a, b]})
        for t in tasks:
            region_rows.append({"base": base, "task": t, "size": len(regions[t]), "density": regions[t].density,
                                "info_base_size": info[t]["base_size"], "info_seconds": info[t]["seconds"],
                                "steps": info[t]["steps"], "iou_with_previous_scored": info[t]["iou_prev"]})
        tag_ = f"{base:g}"
        heatmap(overlap, tasks, tasks, run.file(f"overlap_base-{tag_}.png"), vmin=0, vmax=1,
                title=f"overlap |γ_i ∩ γ_j| / |γ_j| (γ_base={tag_})", ylabel="γ_i (row)", xlabel="γ_j (column)")
        heatmap(rel, tasks, tasks, run.file(f"relative_gain_base-{tag_}.png"), vmin=0, vmax=1,
                title=f"Rel of graft γ_i on task j (γ_base={tag_})", ylabel="region of task i", xlabel="task j")
        per_base[base] = {"regions": regions, "overlap": overlap, "rel": rel, "score": score}
        timings[f"regions_and_matrices_base_{tag_}"] = time.perf_counter() - t0
    run.csv("matrices.csv", matrix_rows)
    run.csv("regions.csv", region_rows)

    # 4. unions of task groups (regions of the first γ_base) and purification on the joint loss
    t0 = time.perf_counter()
    groups = spec.groups
    # "last" keeps the final region: score it once at the end, not after every step (a joint train set is large)
    purify_cfg = spec.localize.replace(steps=spec.purify.steps, select_on=spec.purify.select_on,
                                       eval_every=max(1, spec.purify.steps) if spec.purify.select_on == "last" else 1)
    regions0 = per_base[bases[0]]["regions"]
    union_rows = []
    union_rel, pure_rel = [], []
    for g in groups:
        union = regions0[g[0]]
        for t in g[1:]:
            union = union | regions0[t]
        joint_pre, joint_mt = JointScorer(ctx.pre, g), JointScorer(ctx.mt, g)
        train = [ex for t in g for ex in tag(t, ctx.data[t].train)]
        dev = [ex for t in g for ex in tag(t, ctx.data[t].dev)]
        pure = localize(joint_pre, joint_mt, train, dev, purify_cfg, base=union, progress=spec.progress).region
        row_u, row_p = [], []
        for j in tasks:
            su, sp = ctx.score_graft(union, j), ctx.score_graft(pure, j)
            ru, rp = relative_gain(su, p0[j], p1[j]), relative_gain(sp, p0[j], p1[j])
            row_u.append(ru)
            row_p.append(rp)
            union_rows.append({"group": "+".join(g), "task": j, "in_group": j in g, "union_size": len(union),
                               "purified_size": len(pure), "union_score": su, "union_relative_gain": ru,
                               "purified_score": sp, "purified_relative_gain": rp})
        union_rel.append(row_u)
        pure_rel.append(row_p)
    labels = ["+".join(g) for g in groups]
    if groups:
        heatmap(np.array(union_rel), labels, tasks, run.file("union_relative_gain.png"), vmin=0, vmax=1,
                title=f"Rel of union γ_G on task j (γ_base={bases[0]:g})", ylabel="group G", xlabel="task j")
        heatmap(np.array(pure_rel), labels, tasks, run.file("purified_relative_gain.png"), vmin=0, vmax=1,
                title=f"Rel after {purify_cfg.steps} joint-loss steps from γ_G", ylabel="group G", xlabel="task j")
        run.csv("unions.csv", union_rows)
    timings["unions_and_purification"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    timings = {k: round(v, 1) for k, v in timings.items()}
    run.report(_report(spec, acc_rows, per_base, union_rows, mt_info, purify_cfg, timings, region_rows))
    return {"accuracy": acc_rows, "matrices": matrix_rows, "unions": union_rows, "regions": region_rows,
            "multitask": {k: v for k, v in mt_info.items() if k != "history"}, "timings": timings}


def _report(spec: MultitaskSpec, acc_rows, per_base, union_rows, mt_info, purify_cfg, timings, region_rows) -> str:
    tasks, bases, groups = spec.tasks, spec.bases, spec.groups
    model = spec.model or "bundled all-MiniLM-L6-v2"
    pct = lambda v: "-" if v is None or not np.isfinite(v) else f"{100 * v:.1f}"  # noqa: E731
    kept = "the region after the last step" if purify_cfg.select_on == "last" else \
        f"the step with the best {purify_cfg.select_on} accuracy"
    lines = ["# Multi-task skill regions (paper §5.1, Fig. 8; App. C.2 Figs. 11–12)", "",
             f"Model {model} ({spec.mode} mode); tasks {', '.join(tasks)}; k={spec.k} per label, data seed "
             f"{spec.seed}; test: a seeded sample of {spec.test_limit or 'all'} examples per task. Multi-task FT: "
             f"{mt_info['steps']} steps, a batch from a random task each step ({mt_info['task_steps']}), best mean dev "
             f"at step {mt_info['best_step']}. Score = accuracy (F1 for MRPC/QQP), in %.", "",
             "The paper's setting is RoBERTa-base, 8 tasks, 4096-shot; this is a small-scale reproduction — compare "
             "patterns (diagonal vs off-diagonal), not absolute values.", "",
             "## Accuracy: single-task FT vs multi-task FT", "",
             md_table(["task", "single-task FT", "multi-task FT (P_1)", "pre-trained body + MT head (P_0)", "n test"],
                      [[r["task"], pct(r["single_task_ft"]), pct(r["multitask_ft"]), pct(r["pre_with_mt_head"]),
                        r["n_test"]] for r in acc_rows]), ""]
    for base in bases:
        tag_ = f"{base:g}"
        pb = per_base[base]
        rows = {r["task"]: r for r in region_rows if r["base"] == base}
        still = ", ".join(f"{t} {rows[t]['iou_with_previous_scored']:.3f}" for t in tasks
                          if rows[t].get("iou_with_previous_scored") is not None)
        lines += [f"## Task regions with γ_base = {'0' if base == 0 else f'top-{tag_} movement'}", "",
                  "Region sizes: " + ", ".join(f"{t} {rows[t]['size']}" for t in tasks) + f" (after "
                  f"{rows[tasks[0]]['steps']} localizer steps).", "",
                  *([f"Does the region still move? IoU of the final region with the one scored "
                     f"{spec.localize.eval_every} steps before: {still} (1 = stopped changing).", ""] if still else []),
                  "Overlap |γ_i ∩ γ_j| / |γ_j| (row i, column j):", "",
                  md_table(["γ_i \\ γ_j", *tasks], [[i, *[f"{v:.3f}" for v in pb["overlap"][a]]]
                                                    for a, i in enumerate(tasks)]), "",
                  f"![overlap](overlap_base-{tag_}.png)", "",
                  "Relative gain Rel (Eq. 5) of grafting γ_i (row) evaluated on task j (column); 1 = the MT model's "
                  "gain over P_0, 0 = none:", "",
                  md_table(["γ_i \\ task j", *tasks], [[i, *[f"{v:.2f}" for v in pb["rel"][a]]]
                                                       for a, i in enumerate(tasks)]), "",
                  f"![relative gain](relative_gain_base-{tag_}.png)", ""]
    if groups:
        def cell(g, t):
            r = next(r for r in union_rows if r["group"] == "+".join(g) and r["task"] == t)
            star = "*" if r["in_group"] else ""
            return f"{r['union_relative_gain']:.2f} → {r['purified_relative_gain']:.2f}{star}"

        def size(g, what):
            return next(r[what] for r in union_rows if r["group"] == "+".join(g))

        lines += [f"## Unions of task regions (γ_base = {bases[0]:g}) and purification", "",
                  f"γ_G = ∪_(i∈G) γ_i; 'purified' = {purify_cfg.steps} localizer steps from γ_base = γ_G on the joint "
                  f"loss Σ_(i∈G) L_i (lr {purify_cfg.lr:g}, {kept}). Relative gain on each task (* = task in G):", "",
                  md_table(["group G", "size of γ_G", "size purified", *tasks],
                           [["+".join(g), size(g, "union_size"), size(g, "purified_size"), *[cell(g, t) for t in tasks]]
                            for g in groups]), "",
                  "Cells: union → purified.", "",
                  "![union](union_relative_gain.png)", "", "![purified](purified_relative_gain.png)", ""]
    lines += ["## Times (seconds, this machine)", "",
              md_table(["step", "seconds"], [[k, v] for k, v in timings.items()]), "",
              "Rel is undefined (blank) where the MT model does not beat P_0 on a task. Stages found in the store take "
              "~0 s. Files: accuracy.csv, matrices.csv (long: base, region, task, overlap, score, relative_gain), "
              "regions.csv, unions.csv.", ""]
    return "\n".join(lines)
