"""Issue 46: the grafting paper at its own fine-tuning schedule on Gemma-3-270M, one (task, seed) cell at a time.

Usage (needs `make gemma`; bench/gemma_schedule_cells.sh queues cells, one thread per queue, two queues on 2 cores):
    SKILLGRAFT_CACHE=STORE OMP_NUM_THREADS=2 nice -n 10 .venv/bin/python bench/gemma_paper_schedule.py \
        bench/fidelity/gemma-schedule-64.yaml --tasks SST-2,mr,mpqa --seeds 13 [--finetune-only]

For each (task, seed), in order: the recipe's dev grid (each point a store stage), the chosen point's fine-tuning
on the full 16·n·k schedule, then (unless --finetune-only) `skillgraft run` of the recipe narrowed to that cell
(grafts by learned / top-|Δ| / random, scored rows) into runs/<recipe>-<task>-<seed>. Every stage is a store entry
(the fine-tunings resume step by step), so the same command, run again, resumes where it stopped. Prints the wall
time of every stage; the recipe's report.md has the per-stage table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from skillgraft.models.placement import active  # the recipe's placement, activated in main and passed down

HERE = Path(__file__).resolve().parent


def read_json(path, what=""):
    from skillgraft.untrusted import read_json as read

    return read(path, what=what)


def stamp(msg: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", help="a paper-recipe YAML with a `grid` (bench/fidelity/gemma-schedule-64.yaml)")
    ap.add_argument("--tasks", default=None, help="comma-separated tasks (default: the recipe's)")
    ap.add_argument("--seeds", default=None, help="comma-separated data seeds (default: the recipe's)")
    ap.add_argument("--finetune-only", action="store_true", help=(
        "stop after each cell's fine-tuning and the pre-trained model's zero-shot score on the same test and dev rows "
        "(a store entry; FT − zero-shot is issue 46's first check)"))
    ap.add_argument("--out", default="runs", help="folder of the per-cell run folders")
    ap.add_argument("--override", default=None, help="JSON of recipe fields laid over the file's (tests)")
    ap.add_argument("--progress", action="store_true", help=(
        "progress bars for every stage (on stderr; into a log file: a line per stage, and one every 5 minutes)"))
    ap.add_argument("--status", default=None, metavar="JSON", help=(
        "train nothing: read each cell's stages from the store (grid points, the chosen run, a stopped fine-tuning's "
        "saved step and time left, the learned localization's step and pace, the rows and OOD rows scored), print a "
        "line per cell and write them all to JSON"))
    ap.add_argument("--restore", default=None, metavar="RECORDS", help=(
        "first put back into the store what a cell's records (bench/gemma_records.py's folder) hold whole: its "
        "screened grid points (scores only: their weights were dropped) and its zero-shot scores — a new machine "
        "then skips them; an entry the store has, or whose record's key is not the stage's, is left as it is; and "
        "each cell's fine-tuning, once done or found, is set beside its record's test score and checkpoint"))
    args = ap.parse_args(argv)

    from skillgraft.models.gguf import in_store
    from skillgraft.models.placement import using
    from skillgraft.pipeline.store import Store
    from skillgraft.recipes import load_recipe
    from skillgraft.recipes.base import placement_of
    from skillgraft.signals import Interrupted, handle_signals

    if args.progress:
        from skillgraft.cli.output import progress_lines

        progress_lines()
    over = {**(json.loads(args.override) if args.override else {}), **({"progress": True} if args.progress else {})}
    entry, spec = load_recipe(args.recipe, over)
    if getattr(spec, "grid", None) is None:
        print(f"{args.recipe}: no `grid` in the recipe", file=sys.stderr)
        return 2
    tasks = args.tasks.split(",") if args.tasks else list(spec.tasks)
    store = Store(spec.cache_dir)
    # the recipe's device and precision: every stage below (grid, FT, zero-shot, grafts) runs there, and a bf16 stage
    # is keyed as one (the store keys take the precision passed to them; so do --restore's and --status's)
    placement = placement_of(spec)
    if argv is None:  # a process of its own: SIGTERM / SIGHUP unwind like Ctrl-C (no temporary folder or lock left)
        handle_signals()
    try:
        with in_store(store.root), using(placement):  # a GGUF model converts into this store, as in `skillgraft run`
            if args.restore:
                restore(spec, store, tasks, args)
            if args.status:
                return status(spec, store, tasks, args)
            return cells(entry, spec, store, tasks, args)
    except Interrupted as e:  # one line, not a traceback: the stage's last save (≤ 3 min old) is where it goes on
        stamp(f"stopped by {e}: the same command resumes each stage from its last save in {store.root}")
        return 128 + e.signum


def cells(entry, spec, store, tasks: list[str], args) -> int:
    from skillgraft.pipeline.grid import choose
    from skillgraft.pipeline.opening import finetuned_run
    from skillgraft.recipes.base import run_spec

    for task in tasks:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else spec.seeds_of(task)
        for seed in seeds:
            t0 = time.perf_counter()
            data = spec.data_spec(task, seed)
            chosen, rows = choose(store, spec.model_spec(), data, spec.finetune, spec.grid, progress=spec.progress,
                                  log=stamp, runtime=active())
            t1 = time.perf_counter()
            stamp(f"{task} seed {seed}: grid {t1 - t0:.0f} s; chosen batch {chosen.batch_size}, lr {chosen.lr:g}")
            run_dir, _ = finetuned_run(store, spec.model_spec(), data, chosen, progress=spec.progress,
                                       runtime=active())
            t2 = time.perf_counter()
            stamp(f"{task} seed {seed}: full fine-tuning {t2 - t1:.0f} s → {run_dir}")
            if args.restore:
                said = against_record(Path(args.restore), run_dir)
                if said:
                    stamp(f"{task} seed {seed}: {said}")
            if args.finetune_only:
                zs = zero_shot(spec, store, data)
                ft = read_json(run_dir / "metrics.json", what="fine-tuning metrics")
                stamp(f"{task} seed {seed}: zero-shot test {zs['test']['score']:.4f} (dev {zs['dev']['score']:.4f}); "
                      f"FT test {ft['test']['score']:.4f} (best dev {ft['best_dev']:.4f} at step {ft['best_step']}); "
                      f"{time.perf_counter() - t2:.0f} s")
                continue
            cell = spec.replace(tasks=[task], seeds=[seed], task_seeds={})
            out = Path(args.out) / f"{Path(args.recipe).stem}-{task}-{seed}"
            run_spec(entry, cell, out, overwrite=True)
            stamp(f"{task} seed {seed}: grafts and rows {time.perf_counter() - t2:.0f} s → {out}/report.md")
    return 0


def against_record(records: Path, run_dir: Path) -> str | None:
    """A fine-tuning checked against its record (issue 74: re-fine-tuned where the store is gone): the record of the
    same store key (``records/<entry>/run/metrics.json``, bench/gemma_records.py's folder) beside this run's test
    score and chosen checkpoint, in one line; None without a record. Another machine or thread count repeats a
    fine-tuning's computation, not its last bits: over thousands of SGD steps the runs part, and the dev split may
    then choose another checkpoint, so the line says how far apart the two are (two proportions' z)."""
    import math

    record = records / run_dir.parent.name / "run" / "metrics.json"
    if not record.is_file():
        return None
    old = read_json(record, what="a record")
    new = read_json(run_dir / "metrics.json", what="fine-tuning metrics")
    a, b = new["test"]["score"], old["test"]["score"]
    n, m = new["test"].get("n"), old["test"].get("n")
    here = f"FT test {a:.4g} (best dev {new['best_dev']:.4g} at step {new['best_step']:,})"
    if (a, new["best_step"], new["best_dev"]) == (b, old["best_step"], old["best_dev"]):
        return f"{here}: its record's, exactly ({record.parent.parent})"
    z = ""
    if n and m and new["test"].get("accuracy") == a:  # a proportion: the difference's z, pooled
        p = (a * n + b * m) / (n + m)
        if 0 < p < 1:
            z = f", z {(a - b) / math.sqrt(p * (1 - p) * (1 / n + 1 / m)):+.1f} ({n:,} / {m:,} rows)"
    return (f"{here} against its record's {b:.4g} ({old['best_dev']:.4g} at step {old['best_step']:,}): "
            f"{100 * (a - b):+.1f} points{z} — not the recorded fine-tuning (a re-run: another machine, thread count or "
            f"version of the code repeats its computation, not its last bits), so this cell's shares are of this FT "
            f"({record.parent.parent})")


def zero_shot_stage(spec, data) -> tuple[str, dict, str]:
    """The store's (kind, key, label) of a draw's zero-shot scores: keyed by the model and the draw."""
    from skillgraft.pipeline.store import draw_key, precision_key

    # bf16 scores are another entry, as its fine-tuning is
    return ("zero-shot", {**draw_key(spec.model_spec(), data), **precision_key(active())},
            f"{data.task}-{data.k}-{data.seed}-{spec.mode}")


def zero_shot(spec, store, data) -> dict:
    """The pre-trained model's metrics on the draw's test and dev rows (causal prompt mode: the label words after
    the template, no training), stored as a "zero-shot" entry keyed by the model and the draw."""
    from skillgraft.evaluate.predict import evaluate
    from skillgraft.io import write_json

    def make(folder: Path) -> None:
        few = data.load()
        scorer = spec.model_spec().scorer(few.task, head_seed=spec.finetune.seed)
        t0 = time.perf_counter()
        out = {split: evaluate(scorer, rows, progress=spec.progress)[0] for split, rows in
               (("test", few.test), ("dev", few.dev))}
        write_json(folder / "metrics.json", {**out, "seconds": round(time.perf_counter() - t0, 1)})

    kind, key, label = zero_shot_stage(spec, data)
    entry = store.fetch(kind, key, make, label=label)
    return read_json(entry / "metrics.json", what="zero-shot metrics")


def restore(spec, store, tasks: list[str], args) -> list[Path]:
    """Put back into ``store`` the stages of each cell that its records (``args.restore``, the folder
    bench/gemma_records.py fills) hold whole: the screened grid points (a store keeps only their scores: the weights
    were dropped once the grid chose) and the zero-shot scores. A record is used only where its ``key.json`` is the
    stage's key; a screen as long as the schedule (a grid point that is a fine-tuning, weights kept) is never put back,
    nor is any entry the store has. The scores are the machine's that ran them: the fine-tuning that follows runs
    here (another CPU repeats a stage's computation, not its last bits). Returns the entries put back."""
    from skillgraft.pipeline.grid import dropped_note
    from skillgraft.pipeline.opening import ft_stage
    from skillgraft.pipeline.store import KEY_FILE
    from skillgraft.train.run import WEIGHTS_DROPPED

    records, done = Path(args.restore), []

    def put(kind: str, key: dict, label: str, files: list[str], note: tuple[str, str] | None = None) -> None:
        name = store.path(kind, key, label).name
        src = records / name
        if store.get(kind, key, label) is not None or not all((src / f).is_file() for f in (KEY_FILE, *files)):
            return
        if read_json(src / KEY_FILE, what="a record's key") != json.loads(json.dumps({"kind": kind, **key},
                                                                                     default=str)):
            stamp(f"{src}: its key.json is not this stage's key; not restored")
            return
        for f in (f for f in files if f.endswith(".json")):
            read_json(src / f, what="a record")  # a damaged record: one line naming it, before anything is written

        def make(folder: Path) -> None:
            for f in files:
                (folder / f).parent.mkdir(parents=True, exist_ok=True)
                (folder / f).write_bytes((src / f).read_bytes())
            if note is not None:
                (folder / note[0]).write_text(note[1] + "\n", encoding="utf-8")

        done.append(store.fetch(kind, key, make, label=label))

    for task in tasks:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else spec.seeds_of(task)
        for seed in seeds:
            data = spec.data_spec(task, seed)
            if spec.grid.steps is not None:  # a screened grid: its points are scores only (an unscreened one is FT)
                for b, lr in spec.grid.points():
                    config, point = spec.grid.point_config(spec.finetune, b, lr), spec.grid.point_data(data)
                    stage = ft_stage(spec.model_spec(), point, config, active())
                    if stage == ft_stage(spec.model_spec(), data, spec.grid.full_config(spec.finetune, b, lr),
                                         active()):
                        continue  # a screen as long as the schedule: the point is a fine-tuning, its weights kept
                    files = [f"run/{f}" for f in ("config.json", "metrics.json", "test_probs.csv")]
                    note = dropped_note(config) + " (restored from the records)"
                    put(*stage, files, (f"run/{WEIGHTS_DROPPED}", note))
            put(*zero_shot_stage(spec, data), ["metrics.json"])
    stamp(f"restored from {records}: {len(done)} entr{'y' if len(done) == 1 else 'ies'}"
          + "".join(f"\n  {p.name}" for p in done))
    return done


def status(spec, store, tasks: list[str], args) -> int:
    """Each cell's stages as the store holds them: done (dev, test, seconds), stopped (the saved state's step) or not
    started, and the zero-shot scores."""
    from skillgraft.data.tasks import get_task
    from skillgraft.pipeline.grid import pick
    from skillgraft.pipeline.opening import ft_stage, stored_run
    from skillgraft.resume import saved_state

    def saved_step(data, config) -> dict | None:
        saved = saved_state(store.resume_path(*ft_stage(spec.model_spec(), data, config, active())) / "run" /
                            "finetune-0.pt")
        if saved is None:
            return None
        steps = config.resolved_steps(len(get_task(data.task).labels), data.k)
        return {"step": saved["step"], "steps": steps, "train_seconds": round(saved["seconds"], 1),
                "dev": [(h["step"], round(h["dev"], 4)) for h in saved.get("history", [])],
                # the time left at its pace so far
                "eta_seconds": round((steps - saved["step"]) * saved["seconds"] / max(saved["step"], 1))}

    out = []
    for task in tasks:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else spec.seeds_of(task)
        for seed in seeds:
            data, cell = spec.data_spec(task, seed), {"task": task, "seed": seed, "points": []}
            for b, lr in spec.grid.points():
                config = spec.grid.point_config(spec.finetune, b, lr)
                run = stored_run(store, spec.model_spec(), spec.grid.point_data(data), config, active())
                row = spec.grid.point_row(run, data, b, lr) if run else {"batch_size": b, "lr": lr, "done": False,
                          "saved": saved_step(spec.grid.point_data(data), config)}
                cell["points"].append(row)
            done = [r for r in cell["points"] if "best_dev" in r]
            if len(done) == len(cell["points"]):
                chosen = pick(spec.finetune, done)
                run = stored_run(store, spec.model_spec(), data, chosen, active())
                cell["chosen"] = {"batch_size": chosen.batch_size, "lr": chosen.lr, "done": run is not None}
                if run is not None:
                    m = json.loads((run / "metrics.json").read_text())
                    cell["chosen"].update(best_dev=m["best_dev"], best_step=m["best_step"], steps=m["steps"],
                                          test=m["test"], train_seconds=m["train_seconds"],
                                          dev_history=m.get("history"))
                else:
                    cell["chosen"]["saved"] = saved_step(data, chosen)
            zs = store.get(*zero_shot_stage(spec, data))
            if zs is not None:
                cell["zero_shot"] = json.loads((zs / "metrics.json").read_text())
            ft_done = bool(cell.get("chosen", {}).get("done"))  # no graft of this precision before its FT
            cell["grafts"] = grafts_progress(store.root, spec, task, seed, ft_done)
            out.append(cell)
            print(status_line(cell))
    Path(args.status).write_text(json.dumps({"recipe": args.recipe, "cells": out}, indent=1, default=str) + "\n")
    return 0


def status_line(cell: dict) -> str:
    """One line per cell for the terminal (the JSON file has everything): grid, fine-tuning, zero-shot, grafts."""
    def minutes(seconds) -> str:
        return f"~{round(seconds / 60)} min left" if seconds is not None else "time left unknown"

    done = [p for p in cell["points"] if "best_dev" in p]
    parts = [f"{cell['task']}/{cell['seed']}: grid {len(done)}/{len(cell['points'])}"]
    stopped = next((p["saved"] for p in cell["points"] if p.get("saved")), None)
    if stopped:
        parts[-1] += f" (a point at step {stopped['step']}/{stopped['steps']})"
    chosen = cell.get("chosen")
    if chosen is not None and chosen["done"]:
        parts.append(f"FT lr {chosen['lr']:g}: test {chosen['test']['score']:.4f}, best dev {chosen['best_dev']:.4f} "
                     f"at step {chosen['best_step']}")
    elif chosen is not None:
        saved = chosen.get("saved")
        parts.append(f"FT lr {chosen['lr']:g}: " + ("not started" if not saved else
                     f"step {saved['step']}/{saved['steps']}, {minutes(saved.get('eta_seconds'))}"))
    if cell.get("zero_shot"):
        parts.append(f"zero-shot {cell['zero_shot']['test']['score']:.4f}")
    grafts = cell.get("grafts") or {}
    loc = grafts.get("localize") or {}
    if loc.get("done"):
        parts.append(f"localized ({loc.get('seconds_per_step')} s a step)")
    elif "step" in loc:
        parts.append(f"localizing step {loc['step']}/{loc['of']} ({loc['seconds_per_step']} s a step, "
                     f"{minutes(loc.get('eta_seconds'))})")
    if grafts.get("rows"):
        parts.append(f"rows {grafts['rows']['done']}/{grafts['rows']['of']}")
    for target, ood in (grafts.get("ood") or {}).items():
        parts.append(f"OOD {target} {ood['done']}/{ood['of']}")
    return "; ".join(parts)


def grafts_progress(root: Path, spec, task: str, seed: int, ft_done: bool = True) -> dict:
    """A cell's grafts stage as the store's folders show it (the newest of each, by the entries' labels): the learned
    localization done (its best steps, seconds a step) or stopped at a saved step (with the time left at its pace),
    and the test rows scored of the recipe's pre-trained + FT + localizers × budgets; then, per OOD set of the task,
    the models scored of pre-trained + FT + `ood_localizers` × budgets. Only entries of the run's precision count (a
    bf16 cell's and an fp32 cell's share their labels: their keys tell them apart); nothing is counted before the
    cell's fine-tuning is done (``ft_done``), since a stopped graft's resume folder has no key to tell."""
    from skillgraft.pipeline.store import KEY_FILE, Store, precision_key
    from skillgraft.resume import saved_state

    store, mine = Store(root), precision_key(active()).get("precision")

    def newest(kind: str, label: str, *, finished: bool = True) -> Path | None:  # of this run's precision
        if not ft_done:
            return None
        if not finished:
            return store.newest(kind, label, finished=False)
        found = [e for e in store.entries(kind, label)
                 if json.loads((e / KEY_FILE).read_text()).get("setup", {}).get("precision") == mine]
        return found[-1] if found else None

    cell = f"{task}-{spec.k}-{seed}"
    learned = next((loc for loc in spec.localizers if loc.name == "learned"), None)
    steps = spec.options_of(learned).steps if learned else None  # the recipe's resolved options, not a copy
    def models(localizers) -> int:  # pre-trained (+ head only in head mode: pipeline.variants.base_variants), FT,
        return 2 + (spec.mode == "head") + len(localizers) * len(spec.budgets)  # each localizer at each budget

    out: dict = {"localize": {"done": False}, "rows": {"done": 0, "of": models(spec.localizers)}}
    if (done := newest("regions", f"{cell}-learned")) is not None:
        summary = json.loads((done / "summary.json").read_text())
        out["localize"] = {"done": True, "best_step": summary.get("best_step"),
                           "seconds_per_step": round(summary.get("step_seconds", 0.0), 1)}
    elif (state := newest("regions", f"{cell}-learned", finished=False)) is not None:
        saved = saved_state(state / "localize-0.pt") or {"step": 0, "step_times": []}  # unreadable: as not started
        pace = sum(saved["step_times"]) / max(len(saved["step_times"]), 1)
        out["localize"] = {"done": False, "step": saved["step"], "of": steps,
                           "seconds_per_step": round(pace, 1),
                           "eta_seconds": round((steps - saved["step"]) * pace) if steps else None}
    def scored(kind: str, label: str) -> int:  # a finished entry's rows, else a stopped comparison's saved rows
        if (done := newest(kind, label)) is not None:
            return len(json.loads((done / "rows.json").read_text())["rows"])
        if (state := newest(kind, label, finished=False)) is not None:
            return len((saved_state(state / "compare-0.pt") or {}).get("done", []))
        return 0

    out["rows"]["done"] = scored("paper-rows", f"{cell}-{spec.mode}")
    for _, transfer in spec.ood_of(task):
        for target in transfer.targets:
            out.setdefault("ood", {})[target.task] = {
                "done": scored("paper-ood-rows", f"{cell}-{spec.mode}-{target.task}"),
                "of": models(spec.localizers_ood())}
    return out


if __name__ == "__main__":
    from skillgraft.errors import SkillgraftError

    try:
        sys.exit(main())
    except SkillgraftError as e:  # bad input (a recipe field, a device, a record): one line, never a traceback
        sys.exit(f"{Path(sys.argv[0]).name}: {e}")
