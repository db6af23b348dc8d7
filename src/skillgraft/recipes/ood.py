"""Out-of-distribution recipe (paper Fig. 7, Tables 3 and 7): train on one task, evaluate zero-shot on others.

Each transfer names a source task and target tasks; a target's labels are mapped into the source's label
space by NAME (``labels: {target_label: source_label | null}``; null drops that label). A pair whose labels
cannot be mapped is refused before anything is trained. Models: pre-trained, head only, FT, learned
grafts at the configured budgets, optionally graft re-training and BitFit (Table 3). Reports ID and OOD
accuracy and ECE, mean (std) over data seeds.
"""

from __future__ import annotations

import time

from skillgraft.data import get_task
from skillgraft.data.label_map import check_label_map
from skillgraft.errors import SkillgraftError
from skillgraft.recipes import common as C
from skillgraft.recipes.base import RunDir, recipe
from skillgraft.recipes.paper_numbers import PAPER_NOTE, TABLE3_4096, TABLE7_4096, TABLE7_COLUMNS

METRICS = ["score", "accuracy", "ece", "agreement"]


def transfers_of(cfg: dict) -> list[dict]:
    """The configured transfers, validated (label maps checked by name) before any training."""
    transfers = cfg.get("transfers")
    if not transfers or not isinstance(transfers, list):
        raise SkillgraftError("recipe field 'transfers' must be a list of {source: TASK, targets: [{task, labels}]}")
    out = []
    for i, t in enumerate(transfers):
        where = f"recipe field transfers[{i}]"
        if not isinstance(t, dict) or "source" not in t or not t.get("targets"):
            raise SkillgraftError(f"{where}: needs 'source' and a non-empty 'targets' list")
        source = get_task(t["source"]).name
        targets = []
        for j, target in enumerate(t["targets"]):
            if isinstance(target, str):
                target = {"task": target}
            w = f"{where}.targets[{j}]"
            if not isinstance(target, dict) or "task" not in target:
                raise SkillgraftError(f"{w}: needs 'task'")
            check_label_map(source, target["task"], target.get("labels"), w)
            targets.append({**target, "task": get_task(target["task"]).name, "where": w})
        out.append({"source": source, "targets": targets})
    return out


def run_transfers(cfg: dict, run: RunDir, variants_fn, *, title: str, paper_lines) -> dict:
    """Shared loop of the OOD and PEFT recipes: per source × seed, every variant on ID test + OOD sets."""
    transfers = transfers_of(cfg)
    seeds = C.seeds_of(cfg)
    rows, timings = [], []
    for t in transfers:
        ood_sets = {tg["task"]: C.ood_examples(t["source"], tg, cfg, tg["where"]) for tg in t["targets"]}
        for seed in seeds:
            t0 = time.perf_counter()
            setup = C.prepare(cfg, run, t["source"], seed)
            variants = variants_fn(setup, cfg, run)
            sets = {f"{setup.task} (ID)": setup.test, **ood_sets}
            r, _ = C.evaluate_on_sets(setup, variants, sets, METRICS)
            rows += [{"source": setup.task, **x} for x in r]
            timings.append({"source": setup.task, "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
                            "n_eval": {k: len(v) for k, v in sets.items()}})
    agg = C.aggregate(rows, ["source", "model", "kind", "eval"], METRICS + ["params", "params_pct"])
    summary = C.summary_rows(agg, METRICS + ["params", "params_pct"])
    run.csv("metrics.csv", rows)
    run.csv("summary.csv", summary)
    run.report(_report(cfg, seeds, transfers, agg, timings, title, paper_lines))
    return {"rows": rows, "summary": summary, "timings": timings}


def _report(cfg, seeds, transfers, agg, timings, title, paper_lines) -> str:
    lines = [f"# {title}", "", C.sizes_line(cfg, seeds, f"OOD subsets of {cfg.get('ood_limit') or cfg.get('test_limit') or 'all'} "
                                                       "examples (seeded sample, after label mapping)"), "",
             "Score = accuracy (F1 for MRPC/QQP) in %, mean (std) over data seeds; ECE in %. Params = body "
             "parameters changed or trained, % of all model parameters (the new head is carried by every "
             "non-pre model and not counted). Label mappings (target label → source label; null = dropped):", ""]
    for t in transfers:
        for tg in t["targets"]:
            lines.append(f"- {t['source']} → {tg['task']}: `{tg.get('labels') or 'identity'}`")
    lines.append("")
    for t in transfers:
        src = t["source"]
        evals = [f"{src} (ID)"] + [tg["task"] for tg in t["targets"]]
        models = []
        for g in agg:
            if g["source"] == src and g["model"] not in models:
                models.append(g["model"])
        cell = {(g["model"], g["eval"]): g for g in agg if g["source"] == src}
        header = ["model", "params %"] + [f"{e} acc" for e in evals] + [f"{e} ECE" for e in evals]
        body = []
        for m in models:
            first = cell[(m, evals[0])]
            body.append([m, f"{first['params_pct'][0]:.4f}"] + [C.pct(cell[(m, e)]["score"]) for e in evals]
                        + [C.pct(cell[(m, e)]["ece"]) for e in evals])
        lines += [f"## Source: {src}", "", C.md_table(header, body), ""]
        ft = {e: cell[("fine-tuned", e)]["score"] for e in evals[1:] if ("fine-tuned", e) in cell}
        gains = []
        for m in models:
            if cell[(m, evals[0])]["kind"] in ("ft", "pre"):
                continue
            for e in evals[1:]:
                if e in ft and ft[e]:
                    d = [a - b for a, b in zip(cell[(m, e)]["score"], ft[e])]
                    gains.append(f"{m} → {e}: {C.pct(d)} points vs FT")
        if gains:
            lines += ["OOD difference to FT (same seeds): " + "; ".join(gains) + ".", ""]
        lines += paper_lines(src, [tg["task"] for tg in t["targets"]])
    lines += [PAPER_NOTE, "", "## Time", "", C.md_table(
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


@recipe("ood")
def ood(cfg: dict, run: RunDir) -> dict:
    from skillgraft.recipes.calibration import model_variants  # noqa: PLC0415

    return run_transfers(cfg, run, lambda s, c, r: model_variants(s, c, r, {}),
                         title="Out-of-distribution: fine-tuning vs grafting (paper Fig. 7, Tables 3, 7)",
                         paper_lines=paper_ood_lines)
