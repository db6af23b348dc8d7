"""The transfer loop of the OOD, PEFT and WiSE recipes: per source task × data seed, models on ID test + OOD sets.

A recipe's spec names the transfers (``TransfersMixin`` in :mod:`skillgraft.recipes.base`); the OOD sets come
from :mod:`skillgraft.pipeline.ood` (labels mapped by name), the members from the store. Writes ``metrics.csv``
(one row per source × seed × model × evaluation set), ``summary.csv`` (mean/std over seeds) and ``report.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from skillgraft.pipeline.ood import ood_examples
from skillgraft.pipeline.paper_numbers import PAPER_NOTE, TABLE3_4096, TABLE7_4096, TABLE7_COLUMNS
from skillgraft.pipeline.report import RunDir, md_table, pct, setting_line
from skillgraft.pipeline.variants import compare, rows_of

METRICS = ["score", "accuracy", "ece", "agreement"]


def transfer_members(spec, run: RunDir) -> Iterator[tuple]:
    """Per source × seed of ``spec.transfers``: ``(seed, member, sets, t0)``, ``sets`` the ID test set and
    the OOD sets by name, ``t0`` the time before the member."""
    for i, t in enumerate(spec.transfers):
        ood_sets = {tg.task: ood_examples(t.source, tg, spec.data_dir, f"transfers[{i}].targets[{j}]")
                    for j, tg in enumerate(t.targets)}
        for seed in spec.seeds:
            t0 = time.perf_counter()
            member = spec.member(run, t.source, seed)
            yield seed, member, {f"{member.task} (ID)": member.test, **ood_sets}, t0


def run_transfers(spec, run: RunDir, variants_fn: Callable, *, title: str, paper_lines: Callable) -> dict:
    """Shared loop of the OOD and PEFT recipes: per source × seed, every variant on ID test + OOD sets."""
    rows, timings = [], []
    for seed, member, sets, t0 in transfer_members(spec, run):
        variants = variants_fn(member, spec, run)
        found = []
        for set_name, examples in sets.items():
            block, _ = compare(member, variants, examples, set_name)
            found += rows_of(member, block, source=member.task, eval=set_name)
        order = {v.name: n for n, v in enumerate(variants)}
        rows += sorted(found, key=lambda r: order[r["model"]])  # stable: sets in order within a model
        timings.append({"source": member.task, "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
                        "n_eval": {k: len(v) for k, v in sets.items()}})
    columns = METRICS + ["params", "params_pct"]
    agg, summary = run.seed_tables("metrics.csv", rows, ["source", "model", "kind", "eval"], columns)
    run.report(transfers_report(spec, agg, timings, title, paper_lines))
    return {"rows": rows, "summary": summary, "timings": timings}


def transfers_report(spec, agg, timings, title, paper_lines) -> str:
    lines = [f"# {title}", "", setting_line(spec, f"OOD subsets of {spec.ood_limit or 'all'} examples (seeded "
                                                  "sample, after label mapping)"), "",
             "Score = accuracy (F1 for MRPC/QQP) in %, mean (std) over data seeds; ECE in %. Params = body "
             "parameters changed or trained, % of all model parameters (the new head is carried by every "
             "non-pre model and not counted). Label mappings (target label → source label; null = dropped):", ""]
    for t in spec.transfers:
        for tg in t.targets:
            lines.append(f"- {t.source} → {tg.task}: `{tg.labels or 'identity'}`")
    lines.append("")
    for t in spec.transfers:
        src = t.source
        evals = [f"{src} (ID)"] + [tg.task for tg in t.targets]
        models = []
        for g in agg:
            if g["source"] == src and g["model"] not in models:
                models.append(g["model"])
        cell = {(g["model"], g["eval"]): g for g in agg if g["source"] == src}
        header = ["model", "params %"] + [f"{e} acc" for e in evals] + [f"{e} ECE" for e in evals]
        body = []
        for m in models:
            first = cell[(m, evals[0])]
            body.append([m, f"{first['params_pct'][0]:.4f}"] + [pct(cell[(m, e)]["score"]) for e in evals]
                        + [pct(cell[(m, e)]["ece"]) for e in evals])
        lines += [f"## Source: {src}", "", md_table(header, body), ""]
        ft = {e: cell[("fine-tuned", e)]["score"] for e in evals[1:] if ("fine-tuned", e) in cell}
        gains = []
        for m in models:
            if cell[(m, evals[0])]["kind"] in ("ft", "pre"):
                continue
            for e in evals[1:]:
                if e in ft and ft[e]:
                    d = [a - b for a, b in zip(cell[(m, e)]["score"], ft[e])]
                    gains.append(f"{m} → {e}: {pct(d)} points vs FT")
        if gains:
            lines += ["OOD difference to FT (same seeds): " + "; ".join(gains) + ".", ""]
        lines += paper_lines(src, [tg.task for tg in t.targets])
    lines += [PAPER_NOTE, "", "## Time", "", md_table(
        ["source", "seed", "seconds (incl. cached steps)", "eval set sizes"],
        [[x["source"], x["seed"], x["seconds"], x["n_eval"]] for x in timings]), ""]
    return "\n".join(lines)


def paper_ood_lines(src: str, targets: list[str]) -> list[str]:
    out = []
    for tgt in targets:
        if (src, tgt) in TABLE3_4096:
            g, r, b = TABLE3_4096[(src, tgt)]
            out.append(f"- Table 3 (4096-shot) {src} → {tgt}: grafting {g}, graft re-training {r}, BitFit {b}.")
    cols = [i for i, (s, t) in enumerate(TABLE7_COLUMNS) if s == src and (t == src or t in targets)]
    if cols:
        out.append(f"- Table 7 (4096-shot), columns {[TABLE7_COLUMNS[i][1] for i in cols]}:")
        out += [f"  - {m}: " + ", ".join(vals[i] for i in cols) for m, vals in TABLE7_4096.items()
                if m.startswith("Grafting") or m.startswith("LoRA")]
    return (["Paper's numbers:", "", *out, ""]) if out else []
