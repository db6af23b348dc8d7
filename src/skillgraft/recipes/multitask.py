"""Multi-task skill regions (paper §5.1, Fig. 8, App. C.2 Figs. 11–12).

1. Fine-tune one body on all tasks together (a batch from a random task each step) and, for reference,
   each task alone (cached); test scores of both.
2. For each γ_base sparsity (0 = the paper's Fig. 8; 1e-5, 1e-4 = Figs. 11–12) and task i, learn γ_i on
   L_i with θ_pre = the pre-trained body and θ_ft = the multi-task body (task i's MT head carried).
3. Matrices (CSV + heatmap): overlap O[i, j] = |γ_i ∩ γ_j| / |γ_j|; relative gain
   Rel[i, j] = (P_{γ_i, j} − P_{0, j}) / (P_{1, j} − P_{0, j}) (Eq. 5), P_0 = pre-trained body with task
   j's MT head, P_1 = the MT model.
4. Unions γ_G of task groups and their relative gains on every task; "purified" unions: a few localizer
   steps from γ_base = γ_G on the joint loss Σ_{i∈G} L_i.
"""

from __future__ import annotations

import time

import numpy as np

from skillgraft.data import get_task, load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.predict import evaluate
from skillgraft.graft import Graft, LocalizeConfig, Region, localize
from skillgraft.graft.selection import region_universe
from skillgraft.graft.scoring import evaluate_graft
from skillgraft.io import read_json, write_json
from skillgraft.recipes import common as C
from skillgraft.recipes.base import RunDir, cached_finetune, config_hash, load_finetuned, recipe
from skillgraft.train.multitask import JointScorer, MultiTaskScorer, multitask_finetune, tag

MT_DEFAULTS = {"lr": 0.01, "eval_every": 100}


def heatmap(matrix: np.ndarray, rows: list[str], cols: list[str], path, *, title: str, vmin=None, vmax=None,
            fmt: str = "{:.2f}", xlabel: str = "", ylabel: str = ""):
    """A labelled heatmap PNG with the value printed in each cell (NaN cells blank)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from skillgraft.io import atomic_path  # noqa: PLC0415

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
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path


def relative_gain(p_graft: float, p0: float, p1: float) -> float:
    """Rel_{γ,t} = (P_{γ,t} − P_{0,t}) / (P_{1,t} − P_{0,t}) (paper Eq. 5); NaN when P_1 = P_0."""
    return (p_graft - p0) / (p1 - p0) if abs(p1 - p0) > 1e-12 else float("nan")


class _Context:
    """Everything shared by the steps: data, the MT model, a pre-trained MT model, P_0/P_1 per task."""

    def __init__(self, cfg: dict, run: RunDir):
        self.cfg, self.run = cfg, run
        self.tasks = [get_task(t).name for t in (cfg.get("tasks") or [])]
        if len(self.tasks) < 2:
            raise SkillgraftError("recipe field 'tasks': the multitask recipe needs at least two tasks")
        self.k, self.seed = int(cfg.get("k", 16)), int(cfg.get("seed", 13))
        self.data = {t: load_kshot(t, self.k, self.seed, cfg.get("data_dir")) for t in self.tasks}
        self.test = {t: C.sample(d.test, cfg.get("test_limit"), seed=0) for t, d in self.data.items()}
        self.batch = int(cfg.get("eval_batch_size", 64))
        self.scores: dict[tuple, float] = {}

    def score_graft(self, region: Region, task: str) -> float:
        graft = Graft.from_models(self.pre[task], self.mt[task], region)
        return evaluate_graft(self.pre[task], graft, self.test[task], batch_size=self.batch)[0]["score"]


def _train_multitask(ctx: _Context) -> tuple[MultiTaskScorer, dict]:
    cfg = ctx.cfg
    mt_cfg = C.dataclass_from(C.FinetuneConfig, cfg.get("multitask"), "recipe field 'multitask'",
                              {**MT_DEFAULTS, **{k: v for k, v in (cfg.get("finetune") or {}).items() if k != "steps"}})
    key = {"tasks": ctx.tasks, "k": ctx.k, "seed": ctx.seed, "model": cfg.get("model"), "mode": cfg.get("mode", "head"),
           "pooling": cfg.get("pooling"), "max_length": cfg.get("max_length", 128), "config": mt_cfg.to_dict(),
           "data_dir": str(cfg.get("data_dir"))}
    folder = ctx.run.cache / f"mt-{'+'.join(ctx.tasks)}-{ctx.k}-{ctx.seed}-{config_hash(key)}"
    if (folder / "info.json").is_file():
        return MultiTaskScorer.from_pretrained(folder / "model"), read_json(folder / "info.json")
    mt = MultiTaskScorer.build(cfg.get("model"), ctx.tasks, cfg.get("mode", "head"), pooling=cfg.get("pooling"),
                               max_length=int(cfg.get("max_length", 128)), head_seed=mt_cfg.seed)
    res = multitask_finetune(mt, {t: (d.train, d.dev) for t, d in ctx.data.items()}, mt_cfg,
                             progress=bool(cfg.get("progress", False)))
    info = {"steps": res.steps, "best_step": res.best_step, "best_dev": res.best_dev, "task_steps": res.task_steps,
            "seconds": round(res.seconds, 1), "history": res.history, "key": key}
    mt.save_pretrained(folder / "model")
    write_json(folder / "info.json", info)
    return mt, info


def _regions(ctx: _Context, base: float, loc: LocalizeConfig, mt_info: dict) -> tuple[dict[str, Region], dict]:
    """γ_i per task for one γ_base sparsity (cached by the MT model and the localizer config)."""
    loc = loc.replace(sparsity=float(base))
    out, info = {}, {}
    for t in ctx.tasks:
        key = {"mt": mt_info["key"], "task": t, "localize": loc.to_dict()}
        folder = ctx.run.cache / f"mtregion-{t}-{config_hash(key)}"
        if (folder / "summary.json").is_file():
            out[t], info[t] = Region.load(folder / "region"), read_json(folder / "summary.json")
            continue
        t0 = time.perf_counter()
        d = ctx.data[t]
        res = localize(ctx.pre[t], ctx.mt[t], d.train, d.dev, loc, progress=bool(ctx.cfg.get("progress", False)))
        out[t] = res.region
        info[t] = {"size": len(res.region), "base_size": res.base_size, "best_step": res.summary["best_step"],
                   "best_score": res.summary["best_score"], "seconds": round(time.perf_counter() - t0, 1)}
        res.region.save(folder / "region")
        write_json(folder / "summary.json", info[t])
    return out, info


@recipe("multitask")
def multitask(cfg: dict, run: RunDir) -> dict:
    t_start = time.perf_counter()
    ctx = _Context(cfg, run)
    tasks = ctx.tasks
    timings: dict[str, float] = {}

    # 1. single-task FT (cached) and multi-task FT
    t0 = time.perf_counter()
    ft_cfg = C.finetune_config(cfg)
    single = {}
    for t in tasks:
        ft_dir = cached_finetune(t, ctx.k, ctx.seed, cache=run.cache, model=cfg.get("model"),
                                 mode=cfg.get("mode", "head"), pooling=cfg.get("pooling"), config=ft_cfg,
                                 data_dir=cfg.get("data_dir"), max_length=int(cfg.get("max_length", 128)),
                                 test_limit=cfg.get("test_limit"), progress=bool(cfg.get("progress", False)))
        ft, _, _ = load_finetuned(ft_dir)
        single[t] = evaluate(ft, ctx.test[t], batch_size=ctx.batch)[0]["score"]
        del ft
    timings["single_task_ft_and_eval"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ctx.mt, mt_info = _train_multitask(ctx)
    timings["multitask_ft"] = time.perf_counter() - t0
    ctx.pre = MultiTaskScorer.build(cfg.get("model"), tasks, cfg.get("mode", "head"), pooling=cfg.get("pooling"),
                                    max_length=int(cfg.get("max_length", 128)))
    for m in (ctx.mt, ctx.pre):
        m.eval()
    universe = region_universe(ctx.pre[tasks[0]])
    p1 = {t: evaluate(ctx.mt[t], ctx.test[t], batch_size=ctx.batch)[0]["score"] for t in tasks}
    p0 = {t: ctx.score_graft(Region.empty(universe), t) for t in tasks}
    acc_rows = [{"task": t, "single_task_ft": single[t], "multitask_ft": p1[t], "pre_with_mt_head": p0[t],
                 "n_test": len(ctx.test[t])} for t in tasks]
    run.csv("accuracy.csv", acc_rows)

    # 2–3. task regions per γ_base, overlap and relative-gain matrices
    loc = C.localize_config(cfg)
    bases = [float(b) for b in cfg.get("bases", [0.0])]
    matrix_rows, region_rows, per_base = [], [], {}
    for base in bases:
        t0 = time.perf_counter()
        regions, info = _regions(ctx, base, loc, mt_info)
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
            region_rows.append({"base": base, "task": t, "size": len(regions[t]),
                                "density": regions[t].density, **{f"info_{k}": v for k, v in info[t].items()
                                                                  if k in ("base_size", "seconds")}})
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
    groups = [[get_task(t).name for t in g] for g in (cfg.get("groups") or [])]
    for g in groups:
        missing = [t for t in g if t not in tasks]
        if missing or len(g) < 1:
            raise SkillgraftError(f"recipe field 'groups': group {g} names tasks not in 'tasks' ({missing})")
    purify = cfg.get("purify") or {}
    purify_cfg = loc.replace(steps=int(purify.get("steps", 10)), eval_every=1,
                             select_on=purify.get("select_on", "last"))
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
        res = localize(joint_pre, joint_mt, train, dev, purify_cfg, base=union,
                       progress=bool(cfg.get("progress", False)))
        pure = res.region
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
    run.report(_report(cfg, ctx, acc_rows, bases, per_base, groups, union_rows, mt_info, purify_cfg, timings,
                       region_rows))
    return {"accuracy": acc_rows, "matrices": matrix_rows, "unions": union_rows, "regions": region_rows,
            "multitask": {k: v for k, v in mt_info.items() if k != "history"}, "timings": timings}


def _report(cfg, ctx, acc_rows, bases, per_base, groups, union_rows, mt_info, purify_cfg, timings, region_rows) -> str:
    tasks = ctx.tasks
    model = cfg.get("model") or "bundled all-MiniLM-L6-v2"
    pct = lambda v: "-" if v is None or not np.isfinite(v) else f"{100 * v:.1f}"  # noqa: E731
    lines = ["# Multi-task skill regions (paper §5.1, Fig. 8; App. C.2 Figs. 11–12)", "",
             f"Model {model} ({cfg.get('mode', 'head')} mode); tasks {', '.join(tasks)}; k={ctx.k} per label, data seed "
             f"{ctx.seed}; test: a seeded sample of {cfg.get('test_limit') or 'all'} examples per task. Multi-task FT: "
             f"{mt_info['steps']} steps, a batch from a random task each step ({mt_info['task_steps']}), best mean dev "
             f"at step {mt_info['best_step']}. Score = accuracy (F1 for MRPC/QQP), in %.", "",
             "The paper's setting is RoBERTa-base, 8 tasks, 4096-shot; this is a small-scale reproduction — compare "
             "patterns (diagonal vs off-diagonal), not absolute values.", "",
             "## Accuracy: single-task FT vs multi-task FT", "",
             C.md_table(["task", "single-task FT", "multi-task FT (P_1)", "pre-trained body + MT head (P_0)", "n test"],
                        [[r["task"], pct(r["single_task_ft"]), pct(r["multitask_ft"]), pct(r["pre_with_mt_head"]),
                          r["n_test"]] for r in acc_rows]), ""]
    for base in bases:
        tag_ = f"{base:g}"
        pb = per_base[base]
        sizes = {r["task"]: r["size"] for r in region_rows if r["base"] == base}
        lines += [f"## Task regions with γ_base = {'0' if base == 0 else f'top-{tag_} movement'}", "",
                  "Region sizes: " + ", ".join(f"{t} {sizes[t]}" for t in tasks) + ".", "",
                  "Overlap |γ_i ∩ γ_j| / |γ_j| (row i, column j):", "",
                  C.md_table(["γ_i \\ γ_j", *tasks], [[i, *[f"{v:.3f}" for v in pb["overlap"][a]]]
                                                      for a, i in enumerate(tasks)]), "",
                  f"![overlap](overlap_base-{tag_}.png)", "",
                  "Relative gain Rel (Eq. 5) of grafting γ_i (row) evaluated on task j (column); 1 = the MT model's "
                  "gain over P_0, 0 = none:", "",
                  C.md_table(["γ_i \\ task j", *tasks], [[i, *[f"{v:.2f}" for v in pb["rel"][a]]]
                                                         for a, i in enumerate(tasks)]), "",
                  f"![relative gain](relative_gain_base-{tag_}.png)", ""]
    if groups:
        lines += [f"## Unions of task regions (γ_base = {bases[0]:g}) and purification", "",
                  f"γ_G = ∪_(i∈G) γ_i; 'purified' = {purify_cfg.steps} localizer steps from γ_base = γ_G on the joint "
                  f"loss Σ_(i∈G) L_i (lr {purify_cfg.lr:g}, region after the last step). Relative gain on each task "
                  "(* = task in G):", "",
                  C.md_table(["group G", "size of γ_G", "size purified", *tasks],
                             [[("+".join(g)), next(r["union_size"] for r in union_rows if r["group"] == "+".join(g)),
                               next(r["purified_size"] for r in union_rows if r["group"] == "+".join(g)),
                               *[(lambda r: f"{r['union_relative_gain']:.2f} → {r['purified_relative_gain']:.2f}"
                                  + ("*" if r["in_group"] else ""))(
                                   next(r for r in union_rows if r["group"] == "+".join(g) and r["task"] == t))
                                 for t in tasks]] for g in groups]), "",
                  "Cells: union → purified.", "",
                  "![union](union_relative_gain.png)", "", "![purified](purified_relative_gain.png)", ""]
    lines += ["## Times (seconds, this machine)", "",
              C.md_table(["step", "seconds"], [[k, v] for k, v in timings.items()]), "",
              "Rel is undefined (blank) where the MT model does not beat P_0 on a task. Files: accuracy.csv, "
              "matrices.csv (long: base, region, task, overlap, score, relative_gain), regions.csv, unions.csv.", ""]
    return "\n".join(lines)
