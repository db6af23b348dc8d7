"""Forget-free continual learning (paper §5.2, Table 4, App. C.3): naive vs grafting continual vs single task.

Tasks arrive in order (paper: QNLI → AG News → SST-2). Three ways to learn them:

* **single-task FT** — one fine-tuned model per task (the store's fine-tuning; the reference).
* **naive continual FT** — one body fine-tuned on each task in turn (a new head per task); after the
  last task, every task is evaluated with its head on the final body (catastrophic forgetting).
* **grafting continual** — γ_t learned from the single-task model (the store's regions,
  :func:`skillgraft.pipeline.regions.learned_regions`); task t_n trains only γ_{t_n} \\ ∪_{i<n} γ_{t_i} (+ its
  head) and is inferred with ∪_{i≤n} γ_{t_i} (:class:`skillgraft.pipeline.continual.ContinualLearner`, state
  saved under ``state/`` in the run folder).

Every stage is in the store: each task's fine-tuning and region (the same entries as every other recipe's), and
each step of both continual methods (:mod:`skillgraft.pipeline.continual`), so an interrupted run resumes.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field, model_validator

from skillgraft.evaluate.predict import evaluate
from skillgraft.graft import LocalizeConfig
from skillgraft.pipeline.continual import grafting_steps, naive_steps, task_region
from skillgraft.pipeline.report import RunDir, md_table
from skillgraft.recipes.base import ExperimentSpec, OneSeedMixin, TaskNames, inherit_finetune, recipe
from skillgraft.train import FinetuneConfig

PAPER_TABLE4 = {"FT": {"QNLI": "88.0 (0.8)", "ag_news": "93.1 (0.1)", "SST-2": "92.1 (0.1)"},
                "ContinualFT": {"QNLI": "67.5 (5.3)", "ag_news": "87.6 (2.5)", "SST-2": "92.0 (0.5)"},
                "GraftingContinual": {"QNLI": "86.5 (0.7)", "ag_news": "90.8 (0.1)", "SST-2": "92.5 (0.3)"}}


class ContinualSpec(ExperimentSpec, OneSeedMixin):
    """Tasks in arrival order; the single-task fine-tuning (``finetune``) gives each task's region γ_t."""

    tasks: TaskNames = Field(default_factory=lambda: ["QNLI", "ag_news", "SST-2"], min_length=2,
                             description="tasks in arrival order (each once)")
    continual_finetune: FinetuneConfig = Field(default_factory=FinetuneConfig, description=(
        "grafting continual: training of γ_t minus earlier regions (+ the task's head); fields left out take "
        "`finetune`'s"))
    init: Literal["current", "graft"] = Field("current", description=(
        "where owned coordinates start: current (paper: the current model) | graft (the single-task graft's values)"))
    localize: LocalizeConfig = Field(default_factory=LocalizeConfig,
                                     description="γ_t from each single-task model (its first region)")

    @model_validator(mode="before")
    @classmethod
    def _inherit(cls, values):
        return inherit_finetune(values, "continual_finetune")

    @model_validator(mode="after")
    def _distinct(self) -> ContinualSpec:
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks: need distinct tasks in arrival order, got {self.tasks}")
        return self


@recipe("continual", ContinualSpec)
def continual(spec: ContinualSpec, run: RunDir) -> dict:
    t_start = time.perf_counter()
    tasks, seed, batch, progress = spec.tasks, spec.seed, spec.eval_batch_size, spec.progress
    ft_cfg, cont_cfg = spec.finetune, spec.continual_finetune
    timings: dict[str, float] = {}

    # single-task FT and each task's region γ_t (from the independent single-task run), both from the store
    t0 = time.perf_counter()
    data, single, regions, grafts, region_info = {}, {}, {}, {}, {}
    for t in tasks:
        member = spec.member(run, t, seed)
        data[t] = member.data
        single[t] = evaluate(member.ft, member.test, batch_size=batch)[0]["score"]
        regions[t], grafts[t], region_info[t] = task_region(member, run.store, spec.localize, progress=progress)
        del member
    test = {t: d.test for t, d in data.items()}
    timings["single_task_ft_and_regions"] = time.perf_counter() - t0

    # each step of both continual methods is a store entry (keyed by every step up to it): a re-run resumes
    model, draws = spec.model_spec(), [spec.data_spec(t, seed) for t in tasks]
    t0 = time.perf_counter()  # naive continual FT: one body, tasks in order, a head per task
    naive_right_after = {}
    for t, naive in zip(tasks, naive_steps(run.store, model, draws, data, ft_cfg, head_seed=cont_cfg.seed,
                                           progress=progress, runtime=run.runtime)):
        naive_right_after[t] = evaluate(naive[t], test[t], batch_size=batch)[0]["score"]
    naive_final = {t: evaluate(naive[t], test[t], batch_size=batch)[0]["score"] for t in tasks}
    del naive
    timings["naive_continual"] = time.perf_counter() - t0

    t0 = time.perf_counter()  # grafting continual
    graft_right_after, entries = {}, []
    region_key = {"finetune": ft_cfg.to_dict(), "localizer": "learned", "localize": spec.localize.to_dict()}
    for t, (learner, entry) in zip(tasks, grafting_steps(run.store, model, draws, data, regions, cont_cfg,
                                                         region_key=region_key,
                                                         init=grafts if spec.init == "graft" else None,
                                                         progress=progress, runtime=run.runtime)):
        graft_right_after[t] = learner.evaluate(t, test[t], batch_size=batch)[0]["score"]
        entries.append(entry)
    graft_final = {t: learner.evaluate(t, test[t], batch_size=batch)[0]["score"] for t in tasks}
    learner.save(run.path / "state")
    timings["grafting_continual"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    timings = {a: round(b, 1) for a, b in timings.items()}

    rows = []
    for method, scores, after in (("single-task FT", single, None),
                                  ("naive continual FT", naive_final, naive_right_after),
                                  ("grafting continual", graft_final, graft_right_after)):
        for t in tasks:
            rows.append({"method": method, "task": t, "order": tasks.index(t) + 1, "score_after_all": scores[t],
                         "score_right_after_own_task": after[t] if after else None, "n_test": len(test[t])})
    run.csv("continual.csv", rows)
    run.csv("ownership.csv", learner.ownership())
    run.report(_report(spec, rows, learner, entries, timings))
    return {"rows": rows, "ownership": learner.ownership(), "regions": region_info, "timings": timings,
            "continual_train": [e.get("train") for e in entries], "init": spec.init,
            "finetune": ft_cfg.to_dict(), "continual_finetune": cont_cfg.to_dict()}


def _report(spec: ContinualSpec, rows, learner, entries, timings) -> str:
    tasks, ft_cfg, cont_cfg = spec.tasks, spec.finetune, spec.continual_finetune
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"  # noqa: E731
    model = spec.model or "bundled all-MiniLM-L6-v2"
    by = {(r["method"], r["task"]): r for r in rows}
    methods = ["single-task FT", "naive continual FT", "grafting continual"]
    lines = ["# Forget-free continual learning (paper §5.2, Table 4)", "",
             f"Model {model} ({spec.mode} mode); tasks in arrival order {' → '.join(tasks)}; k={spec.k} per "
             f"label, data seed {spec.seed}; test: a seeded sample of {spec.test_limit or 'all'} examples per task. "
             f"Fine-tuning: {ft_cfg.optimizer} lr {ft_cfg.lr:g}, {_steps(ft_cfg)} steps per task; grafting-continual "
             f"training on the owned region: {cont_cfg.optimizer} lr {cont_cfg.lr:g}, {_steps(cont_cfg)} steps, "
             f"starting from {'the current model' if spec.init == 'current' else 'the single-task graft values'}. "
             "Score = accuracy (F1 for MRPC/QQP), in %.", "",
             "## After all tasks (Table 4)", "",
             md_table(["method", *tasks], [[m, *[pct(by[(m, t)]["score_after_all"]) for t in tasks]]
                                          for m in methods]), "",
             "Right after learning each task (the drop to the table above is forgetting):", "",
             md_table(["method", *tasks], [[m, *[pct(by[(m, t)]["score_right_after_own_task"]) for t in tasks]]
                                          for m in methods[1:]]), "",
             "Paper (RoBERTa-base, 4096-shot, prompt FT): " + "; ".join(
                 f"{m}: " + ", ".join(f"{t} {v}" for t, v in row.items()) for m, row in PAPER_TABLE4.items()) + ".", "",
             "## Who owns which coordinates", "",
             md_table(["order", "task", "size of γ_t", "owned (trained)", "shared with earlier",
                       "union used for inference", "trainable params (incl. head)"],
                      [[o["order"], o["task"], o["region_size"], o["owned"], o["region_size"] - o["owned"],
                        o["union_size"], (e.get("train") or {}).get("trainable_parameters", "-")]
                       for o, e in zip(learner.ownership(), entries)]), "",
             "The state (arrival order, regions, owned coordinates, current body and heads) is in `state/` — "
             "`state/continual.json` is human-readable; extend it with "
             "`skillgraft continual add --state <run>/state --task <TASK>`.", "",
             "## Times (seconds, this machine)", "",
             md_table(["step", "seconds"], [[a, b] for a, b in timings.items()]), ""]
    return "\n".join(lines)


def _steps(cfg: FinetuneConfig) -> str:
    return str(cfg.steps) if cfg.steps is not None else f"16·n·k (≤ {cfg.max_steps})"
