"""Forget-free continual learning (paper §5.2, Table 4, App. C.3): naive vs grafting continual vs single task.

Tasks arrive in order (paper: QNLI → AG News → SST-2). Three ways to learn them:

* **single-task FT** — one fine-tuned model per task (cached; the reference).
* **naive continual FT** — one body fine-tuned on each task in turn (a new head per task); after the
  last task, every task is evaluated with its head on the final body (catastrophic forgetting).
* **grafting continual** — γ_t learned from the single-task model (localize); task t_n trains only
  γ_{t_n} \\ ∪_{i<n} γ_{t_i} (+ its head) and is inferred with ∪_{i≤n} γ_{t_i}
  (:class:`skillgraft.continual.ContinualLearner`, state saved under ``state/`` in the run folder).
"""

from __future__ import annotations

import time

from skillgraft.continual import ContinualLearner
from skillgraft.data import get_task, load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.predict import evaluate
from skillgraft.graft import Graft
from skillgraft.recipes import common as C
from skillgraft.recipes.base import RunDir, cached_finetune, load_finetuned, recipe
from skillgraft.train.multitask import MultiTaskScorer, multitask_finetune

PAPER_TABLE4 = {"FT": {"QNLI": "88.0 (0.8)", "ag_news": "93.1 (0.1)", "SST-2": "92.1 (0.1)"},
                "ContinualFT": {"QNLI": "67.5 (5.3)", "ag_news": "87.6 (2.5)", "SST-2": "92.0 (0.5)"},
                "GraftingContinual": {"QNLI": "86.5 (0.7)", "ag_news": "90.8 (0.1)", "SST-2": "92.5 (0.3)"}}


@recipe("continual")
def continual(cfg: dict, run: RunDir) -> dict:
    t_start = time.perf_counter()
    tasks = [get_task(t).name for t in (cfg.get("tasks") or ["QNLI", "ag_news", "SST-2"])]
    if len(set(tasks)) != len(tasks) or len(tasks) < 2:
        raise SkillgraftError(f"recipe field 'tasks': need ≥ 2 distinct tasks in arrival order, got {tasks}")
    k, seed = int(cfg.get("k", 16)), int(cfg.get("seed", 13))
    model, mode = cfg.get("model"), cfg.get("mode", "head")
    progress = bool(cfg.get("progress", False))
    batch = int(cfg.get("eval_batch_size", 64))
    data = {t: load_kshot(t, k, seed, cfg.get("data_dir")) for t in tasks}
    test = {t: C.sample(d.test, cfg.get("test_limit"), seed=0) for t, d in data.items()}
    ft_cfg = C.finetune_config(cfg)
    cont_cfg = C.dataclass_from(C.FinetuneConfig, cfg.get("continual_finetune"), "recipe field 'continual_finetune'",
                                {**C.FT_DEFAULTS, **(cfg.get("finetune") or {})})
    loc = C.localize_config(cfg)
    init = cfg.get("init", "current")
    if init not in ("current", "graft"):
        raise SkillgraftError(f"recipe field 'init': 'current' (paper) or 'graft', got {init!r}")
    timings: dict[str, float] = {}

    # single-task FT and each task's region γ_t (from the independent single-task run)
    t0 = time.perf_counter()
    single, regions, grafts, region_info = {}, {}, {}, {}
    for t in tasks:
        ft_dir = cached_finetune(t, k, seed, cache=run.cache, model=model, mode=mode, pooling=cfg.get("pooling"),
                                 config=ft_cfg, data_dir=cfg.get("data_dir"), test_limit=cfg.get("test_limit"),
                                 max_length=int(cfg.get("max_length", 128)), progress=progress)
        ft, pre, _ = load_finetuned(ft_dir)
        single[t] = evaluate(ft, test[t], batch_size=batch)[0]["score"]
        setup = C.Setup(t, k, seed, ft_dir, ft, pre, data[t], test[t], cfg.get("data_dir"))
        found, summary = C.learned_regions(setup, loc, run.cache, progress=progress)
        regions[t] = next(iter(found.values()))
        grafts[t] = Graft.from_models(pre, ft, regions[t], {"task": t})
        region_info[t] = {"size": len(regions[t]), "localize_seconds": summary.get("seconds")}
    timings["single_task_ft_and_regions"] = time.perf_counter() - t0

    # naive continual FT: one body, tasks in order, a head per task
    t0 = time.perf_counter()
    naive = MultiTaskScorer.build(model, tasks[:1], mode, pooling=cfg.get("pooling"),
                                  max_length=int(cfg.get("max_length", 128)), head_seed=cont_cfg.seed)
    naive_right_after = {}
    for n, t in enumerate(tasks):
        if n:
            naive.add_task(t, head_seed=cont_cfg.seed)
        multitask_finetune(naive, {t: (data[t].train, data[t].dev)}, ft_cfg, progress=progress)
        naive_right_after[t] = evaluate(naive[t], test[t], batch_size=batch)[0]["score"]
    naive_final = {t: evaluate(naive[t], test[t], batch_size=batch)[0]["score"] for t in tasks}
    del naive
    timings["naive_continual"] = time.perf_counter() - t0

    # grafting continual
    t0 = time.perf_counter()
    learner = ContinualLearner.create(model, mode, pooling=cfg.get("pooling"), max_length=int(cfg.get("max_length", 128)))
    graft_right_after, entries = {}, []
    for t in tasks:
        entry = learner.add_task(t, regions[t], data[t].train, data[t].dev, cont_cfg,
                                 init=grafts[t] if init == "graft" else None, progress=progress,
                                 info={"k": k, "seed": seed})
        graft_right_after[t] = learner.evaluate(t, test[t], batch_size=batch)[0]["score"]
        entries.append(entry)
    graft_final = {t: learner.evaluate(t, test[t], batch_size=batch)[0]["score"] for t in tasks}
    learner.save(run.path / "state")
    timings["grafting_continual"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    timings = {a: round(b, 1) for a, b in timings.items()}

    rows = []
    for method, scores, after in (("single-task FT", single, None), ("naive continual FT", naive_final, naive_right_after),
                                  ("grafting continual", graft_final, graft_right_after)):
        for t in tasks:
            rows.append({"method": method, "task": t, "order": tasks.index(t) + 1, "score_after_all": scores[t],
                         "score_right_after_own_task": after[t] if after else None, "n_test": len(test[t])})
    run.csv("continual.csv", rows)
    run.csv("ownership.csv", learner.ownership())
    run.report(_report(cfg, tasks, k, seed, rows, learner, region_info, entries, timings, ft_cfg, cont_cfg, init))
    return {"rows": rows, "ownership": learner.ownership(), "regions": region_info, "timings": timings,
            "continual_train": [e.get("train") for e in entries], "init": init,
            "finetune": ft_cfg.to_dict(), "continual_finetune": cont_cfg.to_dict()}


def _report(cfg, tasks, k, seed, rows, learner, region_info, entries, timings, ft_cfg, cont_cfg, init) -> str:
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"  # noqa: E731
    model = cfg.get("model") or "bundled all-MiniLM-L6-v2"
    by = {(r["method"], r["task"]): r for r in rows}
    methods = ["single-task FT", "naive continual FT", "grafting continual"]
    lines = ["# Forget-free continual learning (paper §5.2, Table 4)", "",
             f"Model {model} ({cfg.get('mode', 'head')} mode); tasks in arrival order {' → '.join(tasks)}; k={k} per "
             f"label, data seed {seed}; test: a seeded sample of {cfg.get('test_limit') or 'all'} examples per task. "
             f"Fine-tuning: {ft_cfg.optimizer} lr {ft_cfg.lr:g}, {ft_cfg.steps} steps per task; grafting-continual "
             f"training on the owned region: {cont_cfg.optimizer} lr {cont_cfg.lr:g}, {cont_cfg.steps} steps, "
             f"starting from {'the current model' if init == 'current' else 'the single-task graft values'}. "
             "Score = accuracy (F1 for MRPC/QQP), in %.", "",
             "## After all tasks (Table 4)", "",
             C.md_table(["method", *tasks], [[m, *[pct(by[(m, t)]["score_after_all"]) for t in tasks]]
                                            for m in methods]), "",
             "Right after learning each task (the drop to the table above is forgetting):", "",
             C.md_table(["method", *tasks], [[m, *[pct(by[(m, t)]["score_right_after_own_task"]) for t in tasks]]
                                            for m in methods[1:]]), "",
             "Paper (RoBERTa-base, 4096-shot, prompt FT): " + "; ".join(
                 f"{m}: " + ", ".join(f"{t} {v}" for t, v in row.items()) for m, row in PAPER_TABLE4.items()) + ".", "",
             "## Who owns which coordinates", "",
             C.md_table(["order", "task", "size of γ_t", "owned (trained)", "shared with earlier", "union used for inference",
                         "trainable params (incl. head)"],
                        [[o["order"], o["task"], o["region_size"], o["owned"], o["region_size"] - o["owned"],
                          o["union_size"], (e.get("train") or {}).get("trainable_parameters", "-")]
                         for o, e in zip(learner.ownership(), entries)]), "",
             "The state (arrival order, regions, owned coordinates, current body and heads) is in `state/` — "
             "`state/continual.json` is human-readable; extend it with "
             "`skillgraft continual add --state <run>/state --task <TASK>`.", "",
             "## Times (seconds, this machine)", "",
             C.md_table(["step", "seconds"], [[a, b] for a, b in timings.items()]), ""]
    return "\n".join(lines)
