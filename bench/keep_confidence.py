"""Issue 38 and 48 figures: does a `--keep τ` size chosen on the selection split keep τ of FT on the test rows?

For each MiniLM fine-tune (tasks × data seeds × two fine-tunings) the nested family of top-|Δ| over the whole body
(the ``movement`` localizer, Localize-and-Stitch's dataless mask; a score-based family, no learned trajectory) is
searched on the selection split — the dev split, the next K per label after the k-shot draw, never a test row —
with the same probes (one memo of graft outcomes per size):

* ``point`` — the old search: gallop ×4 from ``--keep-from``, stop at the first size whose point share ≥ τ, bisect;
* ``exact c`` — today's search at confidence c (default 0.9): the Clopper–Pearson bound of the graft's agreement on
  FT's right rows (a lower bound of the share) must reach τ, in the two-stage fixed-sequence walk (the coarse grid
  from the top, then down by ≤ 1 + tolerance; each stage at 1 − (1 − c)/2);
* ``paired c`` — issue 48's default: the exact paired test of acc(graft) − τ·acc(FT) ≥ 0 (the graft's wins on FT's
  wrong rows count; keep/stats/bound.py), decided at each target in the same walk;
* ``agreement c`` — ``--keep-agreement`` (label-free): the Clopper–Pearson bound of the graft's agreement with FT's
  predictions, judged on test by the test agreement with FT (``test_agreement``);
* ``bootstrap-v2 c`` — in JSONs made before it (rows named ``bound c``): the first version, the paired-bootstrap
  bound with bisection below the coarse grid. A JSON without ``paired`` rows gets the ``paired`` and ``agreement``
  rows added (the same test rows), and each model's probed predictions go to an .npz beside its JSON;
* each again on a seeded ``--subset`` of the selection rows (default 64: a split as small as the issue's 80 rows),
  the rows named in the rule (``point (64 rows)``).

Each chosen size is then scored on a seeded subset of the task's test set (``--test-limit``), and the report is, per
τ (0.9, 0.95, 0.99) and fine-tuning: how often the test share is ≥ τ under each rule, and the size cost (the
bound's size over the point search's).

Fine-tunings (both found in, or added to, the store: ``SKILLGRAFT_CACHE`` or ./runs/cache):

* ``head`` — skillgraft's head mode as ``make demo`` fine-tunes SST-2 (SGD lr 0.1, 400 steps of 8; the demo's config
  with ``eval_every`` 400 so that only the end is evaluated);
* ``gemma`` — the Gemma-3-270M Table 2 fine-tunes already in the store (causal prompt mode, K = 16 per label, SGD;
  tasks SST-2, mr, mpqa, ag_news, seeds 13 and 42), with 64 selection rows per label from the rest of the training
  pool: ``--modes gemma --tasks SST-2,mr,mpqa,ag_news --seeds 13,42 --test-limit 200``;
* ``gemma-schedule`` — issue 46's paper-schedule Gemma-3-270M fine-tune of (task, seed) in the store (K = 64 per label,
  2,048 steps, chosen on dev: bench/fidelity/gemma-schedule-64.yaml), with 64 selection rows per label from the rest
  of the training pool: ``SKILLGRAFT_CACHE=<its store> … --modes gemma-schedule --tasks SST-2 --seeds 13
  --test-limit 200``;
* ``adamw`` — bench/open_world.py's ``finetune_minilm``: plain transformers ``AutoModelForSequenceClassification``,
  AdamW lr 1e-4, 80 steps of 16, grafted as a checkpoint pair in ``classifier`` mode (its head carried).

Resumable: one JSON per (fine-tuning, task, seed) under ``--out``; a finished one is skipped, and the fine-tunings are
store entries. ``--summary`` only re-reads the JSONs and prints the tables.

    flock /work/heavy.lock .venv/bin/python bench/keep_confidence.py [--tasks SST-2,mr,cr,subj,mpqa]
        [--seeds 13,21,42] [--modes head,adamw] [--k 64] [--test-limit 500] [--confidence 0.9]
        [--out bench/results/keep_confidence]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
TARGETS = (0.9, 0.95, 0.99)


def head_setup(store, task: str, seed: int, k: int, test_limit: int):
    from skillgraft.pipeline.opening import finetuned_run, from_run
    from skillgraft.recipes.graft import DEMO

    finetune = DEMO.finetune.replace(eval_every=400)
    ft_dir, seconds = finetuned_run(store, DEMO.model_spec(), DEMO.data_spec(task, seed, k=k), finetune,
                                    progress=False)
    return from_run(ft_dir, test_limit=test_limit), seconds


def adamw_setup(store, task: str, seed: int, k: int, test_limit: int, lr: float = 1e-4, steps: int = 80):
    from open_world import finetune_minilm

    from skillgraft.data import load_kshot
    from skillgraft.data.spec import DataSpec
    from skillgraft.models.loading import bundled_minilm_path
    from skillgraft.pipeline.opening import from_pair
    from skillgraft.pipeline.store import data_digest

    data = DataSpec(task=task, k=k, seed=seed)
    key = {"bench": "open_world.finetune_minilm", "lr": lr, "steps": steps, "l1": 0.0, "data": data.to_dict(),
           "data_digest": data_digest(task)}
    t0 = time.perf_counter()

    def make(folder: Path) -> None:
        rows = [{"text": e.text_a, "label": e.label} for e in load_kshot(task, k, seed).train]
        finetune_minilm(bundled_minilm_path(), rows, folder / "model", lr=lr, steps=steps, l1=0.0)

    entry = store.fetch("ft-hf", key, make, label=f"{task}-{k}-{seed}-adamw")
    seconds = time.perf_counter() - t0
    setup = from_pair("all-MiniLM-L6-v2", str(entry / "model"), data.replace(test_limit=test_limit), mode="classifier")
    return setup, seconds


def gemma_setup(store, task: str, seed: int, k: int, test_limit: int, selection_per_label: int = 64):
    """A Gemma-3-270M Table 2 fine-tune from the store (causal prompt mode, K = 16, SGD; bench/fidelity/
    gemma-table2-*.yaml; never fine-tuned here), with a selection split of ``selection_per_label`` rows per label
    from the rest of the task's training pool (seeded; the k-shot dev split is only 16 per label)."""
    import dataclasses

    from merge_gemma import find_ft, held_out

    from skillgraft.pipeline.opening import from_run

    setup = from_run(find_ft(Path(store.root), task, k, seed).parent, test_limit=test_limit)
    dev = held_out(setup.ft.task, setup.data.train, selection_per_label, seed)
    setup.inputs = dataclasses.replace(setup.inputs, data=dataclasses.replace(setup.data, dev=dev))
    return setup, 0.0


def gemma_schedule_setup(store, task: str, seed: int, k: int, test_limit: int, selection_per_label: int = 64):
    """Issue 46's paper-schedule Gemma-3-270M fine-tune of (task, seed) from the store: the K = 64 entry fine-tuned
    for the full schedule (2,048 steps, ``steps`` None in its key; the grid's screening points are shorter), never fine-tuned here; a selection
    split of ``selection_per_label`` rows per label from the rest of the task's training pool (seeded)."""
    import dataclasses

    from merge_gemma import held_out

    from skillgraft.pipeline.opening import from_run

    found = []
    for key_file in sorted(Path(store.root).glob(f"ft-{task}-64-{seed}-causal-*/key.json")):
        key = json.loads(key_file.read_text())
        # the schedule's own length (16·n·k steps) is steps None; the grid's screening points name theirs
        if key.get("model", {}).get("model") == "gemma-3-270m" and key.get("finetune", {}).get("steps") is None:
            found.append(key_file.parent / "run")
    if len(found) != 1:
        raise SystemExit(f"{store.root}: {len(found)} paper-schedule Gemma fine-tunes of {task}/{seed} (want one): "
                         "run bench/gemma_paper_schedule.py --finetune-only first")
    setup = from_run(found[0], test_limit=test_limit)
    dev = held_out(setup.ft.task, setup.data.train, selection_per_label, seed)
    setup.inputs = dataclasses.replace(setup.inputs, data=dataclasses.replace(setup.data, dev=dev))
    return setup, 0.0


def measure(setup, confidences: list[float], keep_from: float, tolerance: float, subset: int = 0,
            point: bool = True, bounds: tuple[str, ...] = ("exact", "paired"), agreement: bool = True,
            npz: Path | None = None) -> dict:
    """Every rule on the same memo of graft outcomes (one scoring per size): ``point``; ``<bound> c`` for each bound
    (exact: Clopper–Pearson on FT's right rows; paired: issue 48's exact paired test) and confidence; ``agreement
    c`` (label-free, ``--keep-agreement``: agreement with FT's predictions, judged on test by the test agreement);
    each also on a seeded ``subset`` of the selection rows. ``npz``: the per-row predictions of every size scored
    (selection; test where a rule chose it), for later reading."""
    import dataclasses

    import numpy as np

    from skillgraft.keep.stats.bound import Outcome
    from skillgraft.keep.stats.agreement import agreement_outcome
    from skillgraft.keep.scoring import graft_outcome, selection_outcome
    from skillgraft.keep.search import search_keep
    from skillgraft.graft.localizers import get_localizer

    data = setup.data
    selection, test = list(data.dev), list(setup.test)
    t0 = time.perf_counter()
    ranking = get_localizer("movement").ranking(setup.pre, setup.ft, data, None)
    score = graft_outcome(setup.pre, setup.ft, selection)
    memo: dict[int, object] = {}

    def at(k: int):
        if k not in memo:
            memo[k] = score(ranking.region(k))
        return memo[k]

    ref = selection_outcome(setup.ft, selection)
    start = max(1, round(keep_from * ranking.universe))
    searches = {}
    # the full selection split, and (``subset``) a seeded part of it: a smaller split, as the 80 rows
    views = [("", None)] + ([(f" ({subset} rows)", np.sort(np.random.RandomState(0).permutation(len(selection))
                                                          [:subset]))] if 0 < subset < len(selection) else [])
    common = {"start": start, "tolerance": tolerance, "universe": ranking.universe}
    for suffix, rows in views:
        def part(o, rows=rows):
            if rows is None:
                return o
            sub = dataclasses.replace(o, pred=o.pred[rows], labels=o.labels[rows])
            return dataclasses.replace(sub, score=float((sub.pred == sub.labels).mean()))

        view, ref_view = (lambda k, part=part: part(at(k))), part(ref)
        if point:
            searches["point" + suffix] = search_keep(view, ref_view, TARGETS, len(ranking), **common)
        for c in confidences:
            for bound in bounds:
                t1 = time.perf_counter()
                searches[f"{bound} {c:g}{suffix}"] = search_keep(view, ref_view, TARGETS, len(ranking), confidence=c,
                                                                  method=bound, **common)
                print(f"  {bound} {c:g}{suffix}: {time.perf_counter() - t1:.0f} s", flush=True)
            if agreement:
                mine = Outcome(1.0, ref_view.pred, ref_view.pred, "accuracy")
                searches[f"agreement {c:g}{suffix}"] = search_keep(
                    lambda k, view=view, ref_view=ref_view: agreement_outcome(view(k), ref_view), mine, TARGETS,
                    len(ranking), confidence=c, method="exact", kind="agreement", **common)
    search_seconds = time.perf_counter() - t0
    ft_out = selection_outcome(setup.ft, test)
    ft_test = ft_out.score
    test_graft = graft_outcome(setup.pre, setup.ft, test)
    tested: dict[int, object] = {}
    rows = []
    for rule, results in searches.items():
        for r in results:
            size = r.size if r.reached else r.best_size
            if size not in tested:
                tested[size] = test_graft(ranking.region(size))
            got = tested[size]
            agree = float((got.pred == ft_out.pred).mean())
            rows.append({"rule": rule, "target": r.target, "reached": r.reached, "size": size,
                         "density": size / ranking.universe, "selection_share": r.share if r.reached else r.best_share,
                         "bound": r.bound, "point_size": r.point_size, "rows_needed": r.rows_needed,
                         "next_size": r.next_size, "next_rows": r.next_rows, "method": r.method, "kind": r.kind,
                         "test_score": got.score, "test_share": got.score / ft_test, "test_agreement": agree,
                         "probes": len(r.probes)})
    if npz is not None:
        sizes = sorted(memo)
        tsizes = sorted(tested)
        np.savez_compressed(npz, sizes=np.array(sizes), sel_pred=np.stack([memo[k].pred for k in sizes]),
                            sel_labels=ref.labels, ft_sel_pred=ref.pred, test_sizes=np.array(tsizes),
                            test_pred=np.stack([tested[k].pred for k in tsizes]), test_labels=ft_out.labels,
                            ft_test_pred=ft_out.pred, universe=ranking.universe)
    return {"ft_selection": ref.score, "ft_test": ft_test, "selection_rows": len(selection), "test_rows": len(test),
            "universe": ranking.universe, "probes_scored": len(memo), "search_seconds": search_seconds,
            "seconds": time.perf_counter() - t0, "rows": rows}


def summarize(out: Path) -> str:
    """Markdown tables over every finished JSON: coverage and size cost per fine-tuning, rule and target.

    ``reached``: searches whose rule was met on the selection split; an unreached one is counted with the size it
    offers (the best selection share, or the best bound), the graft `--keep` would write."""
    import math

    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "summary.json"]
    lines = [f"{len(results)} fine-tuned models: " + ", ".join(sorted(f"{r['mode']} {r['task']}/{r['seed']}"
                                                                    for r in results)), ""]
    lines += ["| fine-tuning | rule | τ | n | reached | test share ≥ τ | mean test share | min test share | median density | "
              "size ÷ point size (geo. mean) | median density ÷ point's |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode in sorted({r["mode"] for r in results}):
        mine = [r for r in results if r["mode"] == mode]
        for r in mine:  # v2's "bound" rows: the paired bootstrap with bisection (issue 38's first rule)
            for row in r["rows"]:
                row["rule"] = row["rule"].replace("bound ", "bootstrap-v2 ")
        rules = list(dict.fromkeys(row["rule"] for r in mine for row in r["rows"]))
        for tau in TARGETS:
            for rule in rules:
                got = [(row, r) for r in mine for row in r["rows"] if row["rule"] == rule and row["target"] == tau]
                if not got:
                    continue
                shares = [row["test_agreement"] if row.get("kind") == "agreement" else row["test_share"]
                          for row, _ in got]
                ok = sum(s >= tau - 1e-12 for s in shares)
                dens = sorted(row["density"] for row, _ in got)
                ratios = []
                suffix = rule[rule.index(" ("):] if " (" in rule else ""
                for row, r in got:
                    point = next(x for x in r["rows"] if x["rule"] == "point" + suffix and x["target"] == tau)
                    ratios.append(math.log(row["size"] / point["size"]))
                reached = sum(row["reached"] for row, _ in got)
                pdens = sorted(x["density"] for _, r in got for x in r["rows"]
                               if x["rule"] == "point" + suffix and x["target"] == tau)
                med, pmed = dens[len(dens) // 2], pdens[len(pdens) // 2]
                lines.append(f"| {mode} | {rule} | {tau:g} | {len(got)} | {reached} | {ok}/{len(got)} ({ok / len(got):.0%}) | "
                             f"{sum(shares) / len(shares):.3f} | {min(shares):.3f} | {med:.2e} | "
                             f"{math.exp(sum(ratios) / len(ratios)):.2f} | {med / pmed:.1f} |")
    return "\n".join(lines + ["", pooled(results)])


POOLS = {"MiniLM": ("head", "adamw"), "Gemma": ("gemma", "gemma-schedule")}


def pooled(results: list[dict]) -> str:
    """Every search of a model family pooled over tasks, seeds and τ (issue 48's "≥ 90 % of all searches and every
    search it promised"): per rule, the searches, those whose test share (agreement: test agreement) reached τ, those
    that reached τ on the selection split (a promise, for a bound) and how many of those held on test."""
    lines = ["| models | rule | searches | kept τ on test | at τ ≤ 0.95 | promised (reached on selection) | "
             "kept when promised |", "|---|---|---:|---:|---:|---:|---:|"]
    pools = {**POOLS, "all": tuple(m for ms in POOLS.values() for m in ms)}
    for name, modes in pools.items():
        rows = [row for r in results if r["mode"] in modes for row in r["rows"] if " (" not in row["rule"]]
        for rule in dict.fromkeys(row["rule"] for row in rows):
            mine = [row for row in rows if row["rule"] == rule]
            kept = [(row["test_agreement"] if row.get("kind") == "agreement" else row["test_share"])
                    >= row["target"] - 1e-12 for row in mine]
            low = [k for k, row in zip(kept, mine) if row["target"] <= 0.95]
            held = [k for k, row in zip(kept, mine) if row["reached"]]
            lines.append(f"| {name} | {rule} | {len(mine)} | {sum(kept)} ({sum(kept) / len(mine):.0%}) | "
                         f"{sum(low)}/{len(low)} | {len(held)} | {sum(held)}/{len(held)} |")
    return "\n".join(lines)


def feasibility(out: Path, confidence: float = 0.9) -> str:
    """Could any test have promised τ at 3× the point search's size? Per model (with an .npz) and τ: at the largest
    size probed at most 3× the point size, the normal-approximation z of the paired statistic, Z̄/(s/√n) with
    Z = 1[graft right] − τ·1[FT right] — the CLT z-test, the most a test of this mean can hope for (it is not exact:
    no rule of the tool uses it) — against its critical value at each stage's risk (1 − c)/2.

    Last column: the same z for prediction-powered inference (Angelopoulos et al., Science 2023) with unlimited
    unlabelled rows, E[Z] = (agreement − τ) + E[R], R = Z − (1[graft = FT] − τ): agreement known exactly, only the
    rectifier R estimated on the n labelled rows. If it is not above the CLT z, no amount of unlabelled data helps."""
    import math

    import numpy as np
    from scipy.stats import norm

    crit = norm.ppf(1 - (1 - confidence) / 2)
    lines = ["| model | τ | point size | probed size ≤ 3× point | its selection share | CLT z | passes z ≥ "
             f"{crit:.3f} | rows for z to pass | PPI z, unlabelled rows ∞ |", "|---|---:|---:|---:|---:|---:|:---:|---:|---:|"]
    for path in sorted(out.glob("*.json")):
        npz = path.with_suffix(".npz")
        if path.name == "summary.json" or not npz.exists():
            continue
        r, d = json.loads(path.read_text()), np.load(npz)
        sizes, sel, labels, ft = d["sizes"], d["sel_pred"], d["sel_labels"], d["ft_sel_pred"]
        f = (ft == labels).astype(float)
        for tau in TARGETS:
            point = next(x for x in r["rows"] if x["rule"] == "point" and x["target"] == tau)
            ok = [i for i, k in enumerate(sizes) if k <= 3 * point["size"]]
            i = max(ok, key=lambda i: sizes[i])
            g = (sel[i] == labels).astype(float)
            z = g - tau * f
            sd = z.std(ddof=1)
            stat = z.mean() / (sd / math.sqrt(len(z))) if sd > 0 else math.inf * np.sign(z.mean())
            agree = (sel[i] == ft).astype(float)
            rect = z - (agree - tau)  # the rectifier: only it needs labels
            rsd = rect.std(ddof=1)
            ppi = (agree.mean() - tau + rect.mean()) / (rsd / math.sqrt(len(z))) if rsd > 0 else math.nan
            lines.append(f"| {r['mode']} {r['task']}/{r['seed']} | {tau:g} | {point['size']:,} | {int(sizes[i]):,} | "
                         f"{g.sum() / f.sum():.3f} | {stat:.2f} | {'yes' if stat >= crit else 'no'} | "
                         + (f"{math.ceil(len(z) * (crit / stat) ** 2):,} |" if 0 < stat < math.inf else "- |")
                         + f" {ppi:.2f} |")
    return "\n".join(lines)


def walks(out: Path, keep_from: float = 1e-6, navigation: float = 0.2) -> str:
    """Other fixed-sequence walks, replayed on each search's stored selection outcomes (the .npz: every size it
    probed, per row), at the paired test, τ = 0.9 / 0.95, confidence 0.9 — median over models of size ÷ point size:

    * ``current`` — two stages at (1 − c)/2 each, the fine walk bounded below by the first coarse failure;
    * ``split`` — the coarse walk only navigates, at ``navigation``·(1 − c), and the fine walk, at the rest of the
      risk, goes on below the coarse failure until its own first failure (valid: on a fine grid aligned with the
      coarse one, the fine walk's first size below the threshold is the same whatever the coarse walk did);
    * ``single`` — one walk down every size from the top at 1 − c (valid, most probes).

    An estimate, not a search: only sizes some search probed are walked (the fine sizes below a coarse failure
    were probed by other targets or not at all)."""
    import math
    import statistics

    import numpy as np

    from skillgraft.keep.stats.bound import Outcome, paired_test
    from skillgraft.keep.search import coarse_grid

    risk, rows = 0.1, {}
    for path in sorted(out.glob("*.npz")):
        r, d = json.loads(path.with_suffix(".json").read_text()), np.load(path)
        y, sizes, universe = d["sel_labels"], d["sizes"], int(d["universe"])
        ft = Outcome(float((d["ft_sel_pred"] == y).mean()), d["ft_sel_pred"], y)
        outcome = [Outcome(float((p == y).mean()), p, y) for p in d["sel_pred"]]
        coarse = set(coarse_grid(max(1, round(keep_from * universe)), universe))  # as measure()'s searches
        down = sorted(range(len(sizes)), key=lambda i: -sizes[i])
        for tau in (0.9, 0.95):
            passes = lambda i, level: paired_test(outcome[i], ft, tau, 1 - level)  # noqa: E731

            def walk(levels, bounded):
                first, size, lo = levels[0], None, None
                for i in (i for i in down if int(sizes[i]) in coarse):
                    if not passes(i, first):
                        lo = int(sizes[i])
                        break
                    size = int(sizes[i])
                if size is None or len(levels) == 1:
                    return size or universe
                for i in down:
                    if sizes[i] >= size:
                        continue
                    if (bounded and lo is not None and sizes[i] <= lo) or not passes(i, levels[1]):
                        break
                    size = int(sizes[i])
                return size

            def single():
                size = None
                for i in down:
                    if not passes(i, risk):
                        break
                    size = int(sizes[i])
                return size or universe

            point = next(x for x in r["rows"] if x["rule"] == "point" and x["target"] == tau)["size"]
            rows[(r["mode"], tau, path.stem)] = {
                "point": point, "current": walk((risk / 2, risk / 2), True),
                "split": walk((navigation * risk, (1 - navigation) * risk), False), "single": single()}
    lines = ["| fine-tuning | τ | models | current | split | single | split ÷ current (geo. mean) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for mode in sorted({m for m, _, _ in rows}):
        for tau in (0.9, 0.95):
            got = [v for (m, t, _), v in rows.items() if m == mode and t == tau]
            med = {w: statistics.median(v[w] / v["point"] for v in got) for w in ("current", "split", "single")}
            geo = math.exp(sum(math.log(v["split"] / v["current"]) for v in got) / len(got))
            lines.append(f"| {mode} | {tau:g} | {len(got)} | {med['current']:.1f}× | {med['split']:.1f}× | "
                         f"{med['single']:.1f}× | {geo:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="SST-2,mr,cr,subj,mpqa")
    ap.add_argument("--seeds", default="13,21,42")
    ap.add_argument("--modes", default="head,adamw")
    ap.add_argument("--k", type=int, default=64, help="k-shot per label (the dev split: the next k per label)")
    ap.add_argument("--test-limit", type=int, default=500)
    ap.add_argument("--confidence", default="0.9", help="confidences of the bound (comma-separated)")
    ap.add_argument("--subset", type=int, default=64, help="also search on a seeded part of the selection split of "
                    "this many rows (0: no)")
    ap.add_argument("--keep-from", type=float, default=1e-6)
    ap.add_argument("--tolerance", type=float, default=0.1)
    ap.add_argument("--out", type=Path, default=Path("bench") / "results" / "keep_confidence")
    ap.add_argument("--summary", action="store_true", help="only print the tables of the finished runs")
    ap.add_argument("--walks", action="store_true", help="only replay other fixed-sequence walks on the finished "
                    "runs' stored outcomes (minutes: one exact test per size, target and level)")
    ap.add_argument("--selection-per-label", type=int, default=0,
                    help="MiniLM modes: choose on this many rows per label from the rest of the training pool "
                         "instead of the dev split (0: the dev split); e.g. 500 with --out …_large")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.walks:
        print(walks(args.out, args.keep_from))
        return
    if args.summary:
        print(summarize(args.out))
        print()
        print(feasibility(args.out))
        return

    import torch

    from skillgraft.pipeline import Store

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    store = Store()
    confidences = [float(x) for x in args.confidence.split(",")]
    for seed in [int(s) for s in args.seeds.split(",")]:  # seeds outermost: every task at one seed first
        for task in args.tasks.split(","):
            for mode in args.modes.split(","):
                path = args.out / f"{mode}-{task}-{seed}.json"
                old = json.loads(path.read_text()) if path.exists() else None
                if old and any(row["rule"].startswith("paired") for row in old["rows"]):
                    continue
                t0 = time.perf_counter()
                make = {"head": head_setup, "adamw": adamw_setup, "gemma": gemma_setup,
                        "gemma-schedule": gemma_schedule_setup}[mode]
                k = {"gemma": 16, "gemma-schedule": 64}.get(mode, args.k)  # the Gemma fine-tunes' own draws
                setup, ft_seconds = make(store, task, seed, k, args.test_limit if old is None else old["test_rows"])
                if args.selection_per_label and not mode.startswith("gemma"):  # a larger selection split, same origin as gemma's
                    import dataclasses

                    from merge_gemma import held_out

                    dev = held_out(setup.ft.task, setup.data.train, args.selection_per_label, seed)
                    setup.inputs = dataclasses.replace(setup.inputs, data=dataclasses.replace(setup.data, dev=dev))
                got = measure(setup, confidences, args.keep_from, args.tolerance, args.subset, point=old is None,
                              bounds=("exact", "paired") if old is None else ("paired",), agreement=True,
                              npz=path.with_suffix(".npz"))
                if old is None:
                    result = {"mode": mode, "task": task, "seed": seed, "k": k, "fine_tune_seconds": ft_seconds,
                              "confidences": confidences, "family": "movement (top-|Δ| global)", **got}
                    result["total_seconds"] = time.perf_counter() - t0
                else:  # a JSON of the v2 rules (point, bootstrap): the exact rule's rows added beside them
                    if abs(got["ft_test"] - old["ft_test"]) > 1e-9 or got["test_rows"] != old["test_rows"]:
                        raise SystemExit(f"{path}: FT's test score {got['ft_test']} differs from the stored "
                                         f"{old['ft_test']}: not the same test rows")
                    result = {**old, "rows": old["rows"] + got["rows"],
                              "exact_seconds": time.perf_counter() - t0, "exact_probes_scored": got["probes_scored"]}
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(result, indent=1, default=float))
                tmp.replace(path)
                short = {(row["rule"], row["target"]): f"{row['density']:.1e}/{row['test_share']:.3f}"
                         for row in result["rows"]}
                print(f"{mode} {task} {seed}: {result['total_seconds']:.0f} s, {short}", flush=True)
                del setup
    print(summarize(args.out))


if __name__ == "__main__":
    main()
