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

The recipe's package: its spec (``spec.py``), its run (here: the rows of each (task, seed), stored) and its
report (``report.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

from skillgraft.data import get_task
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.pipeline.ood import TargetSpec, ood_examples
from skillgraft.pipeline.grid import choose, run_row
from skillgraft.pipeline.regions import learned_regions
from skillgraft.pipeline.report import RunDir
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.opening import prepare
from skillgraft.pipeline.store import data_digest
from skillgraft.pipeline.variants import Variant, base_variants, compare, graft_variant
from skillgraft.recipes.base import LocalizerRun, recipe
from skillgraft.recipes.paper.report import localizer_table, ood_section, report_markdown  # noqa: F401 - re-exported
from skillgraft.recipes.paper.spec import METRICS, PaperSpec


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
