"""The paper recipe's report: Table 2 beside the paper's numbers, the localizers at equal size
(``localizers.csv``), Table 9 in causal mode, the fine-tuning grid, Tables 7 and 3 (OOD), Fig. 5 (optimizers) and
the wall time of every stage."""

from __future__ import annotations

import numpy as np

from skillgraft.data import get_task
from skillgraft.graft.selection import Budget
from skillgraft.pipeline.paper_numbers import (PAPER_NOTE, TABLE2_64, TABLE3_4096, TABLE7_4096, TABLE7_COLUMNS,
                                              TABLE9_GPT2_64)
from skillgraft.pipeline.report import TaskRows, aggregate, md_table, pct
from skillgraft.recipes.paper.spec import MOONSHOT_TASKS, STAND_IN_TESTS, STAND_INS, PaperSpec


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
