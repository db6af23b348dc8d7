"""The outputs of ``skillgraft merge``: merge.json's rows and headline (:func:`summarize`), the merged model and each
task's graft (:func:`write_outputs`), report.md and README.md."""

from __future__ import annotations

from pathlib import Path

from skillgraft.lazy import np

from skillgraft.graft.graft import Graft
from skillgraft.graft.bound import bound_prose
from skillgraft.graft.merge import swapped, task_view
from skillgraft.merge.base import MergeRow, Scored, graft_file_bytes
from skillgraft.merge.mergekit import body_module
from skillgraft.pipeline.report import md_table
from skillgraft.verbs.merge_inputs import weight_files


def summarize(results: list[Scored], ft: Scored, setups: dict, grafts: dict[str, Graft],
              spec, mode: str, pretrained: str) -> dict:
    """merge.json: settings, per-task rows (typed :class:`~skillgraft.merge.base.MergeRow`; ``merge.json`` holds
    their columns), the chosen configurations and the headline comparison."""
    names = list(setups)
    ckpt = {n: sum(f.stat().st_size for f in weight_files(str(setups[n].ft_dir))) for n in names}
    graft_bytes = {n: graft_file_bytes(grafts[n]) for n in names}
    rows = [MergeRow.of(s, ft, graft_bytes if s.method in ("stitch", "graft") else ckpt) for s in results]
    plain_rows = [r for r in rows if not r.info.get("refit_heads")]
    stitch_rows = [r for r in plain_rows if r.method == "stitch" and r.on_test]
    written = next(r for r in stitch_rows if r.info.get("written"))
    plain = next(r for r in stitch_rows if r.config == spec.rule)  # λ = 1: Localize-and-Stitch as published
    dev_rule = max(stitch_rows, key=lambda r: r.mean_normalized("dev"))
    mk = [r for r in plain_rows if r.method.startswith("mergekit") and r.on_test and r.chosen_on_dev]
    best_mk = max(mk, key=lambda r: r.mean_normalized()) if mk else None
    checkpoint_bytes = float(np.mean(list(ckpt.values())))
    headline = {"stitch_rule": spec.rule, "stitch_scale": written.info["scale"],
                "stitch_mean_normalized": written.mean_normalized(),
                "stitch_scale_1_mean_normalized": plain.mean_normalized(),
                "stitch_rule_chosen_on_dev": dev_rule.config,
                "stitch_dev_rule_mean_normalized": dev_rule.mean_normalized(),
                "best_mergekit": f"{best_mk.method} ({best_mk.config})" if best_mk else None,
                "best_mergekit_mean_normalized": best_mk.mean_normalized() if best_mk else None,
                "checkpoint_bytes": checkpoint_bytes,
                "max_graft_bytes": max(graft_bytes.values()),
                "max_graft_share_of_checkpoint": max(graft_bytes[n] / ckpt[n] for n in names if ckpt[n]) if
                any(ckpt.values()) else None}
    if best_mk:
        headline["stitch_at_least_best_mergekit"] = written.mean_normalized() >= best_mk.mean_normalized()
    headline.update(refit_headline(rows, written))
    headline.update(peers_headline(plain_rows))
    tasks = {}
    for n in names:
        st = setups[n]
        tasks[n] = {"finetuned": st.ft.base_model, "task": st.task, "labels": list(st.data.task.labels),
                    "train": len(st.data.train), "dev": len(st.data.dev), "test": len(st.test),
                    "data": st.data_note, "graft_size": grafts[n].size, "graft_bytes": graft_bytes[n],
                    "checkpoint_bytes": ckpt[n]}
    from skillgraft.pipeline.caveats import merge_caveats  # noqa: PLC0415

    return {"pretrained": pretrained, "mode": mode, "settings": spec.to_dict(), "tasks": tasks, "rows": rows,
            "headline": headline, "caveats": merge_caveats(setups, ft.test)}


def peers_headline(rows: list[dict]) -> dict:
    """The task-aware peers (--peers) at the grafts' bytes per task beside each task's graft alone (routed)."""
    peers = {r["method"]: r for r in rows if r.get("equal_bytes") and r.get("on_test")}
    graft = next((r for r in rows if r["method"] == "graft" and r.get("on_test")), None)
    if not peers or graft is None:
        return {}
    return {"peers_at_equal_bytes": {m: r["mean_normalized"] for m, r in peers.items()},
            "peers_bytes_per_task": {m: r["bytes_per_task"] for m, r in peers.items()},
            "graft_at_least_every_peer": all(graft["mean_normalized"] >= r["mean_normalized"]
                                             for r in peers.values())}


def refit_headline(rows: list[dict], written: dict) -> dict:
    """With --refit-heads: the written stitch and the best dev-chosen mergekit method, each with refitted heads."""
    refit = [r for r in rows if r.get("refit_heads") and r.get("on_test")]
    if not refit:
        return {}
    stitch = next((r for r in refit if r["method"] == "stitch" and r["config"] == f"{written['config']} + refit heads"),
                  None)
    mk = [r for r in refit if r["method"].startswith("mergekit") and r.get("chosen_on_dev")]
    best = max(mk, key=lambda r: r["mean_normalized"]) if mk else None
    out = {"refit_heads": refit[0]["refit_heads"],
           "stitch_refit_mean_normalized": stitch["mean_normalized"] if stitch else None,
           "best_mergekit_refit": f"{best['method']} ({best['config']})" if best else None,
           "best_mergekit_refit_mean_normalized": best["mean_normalized"] if best else None}
    if stitch and best:
        out["stitch_refit_at_least_best_mergekit_refit"] = stitch["mean_normalized"] >= best["mean_normalized"]
    return out


def write_outputs(folder: Path, bench, body: Graft) -> None:
    """The merged model (``tasks/<task>/`` or ``model/``) and each task's graft (``grafts/<task>/``); a released
    fine-tuned classifier is read back from its files, one at a time (:meth:`Workbench.finetuned`)."""
    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415

    for name, g in bench.grafts.items():
        g.save_pretrained(folder / "grafts" / name)
    pre = bench.pre
    if not carried_names(pre):  # one merged model serves every task
        with body.applied(pre):
            pre.model.save_pretrained(folder / "model")
        pre.tokenizer.save_pretrained(folder / "model")
        return
    for name, setup in bench.members.items():
        # the stitched body (θ_pre outside the union) written into the task's own fine-tuned classifier
        with task_view(body, bench.grafts[name]).applied(setup.pre):
            state = {n: t.detach().clone() for n, t in body_module(setup.pre).state_dict().items()}
        with bench.finetuned(name) as ft, swapped(body_module(ft), state):
            ft.model.save_pretrained(folder / "tasks" / name)
            ft.tokenizer.save_pretrained(folder / "tasks" / name)
        del state


def _fmt(x, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "-"
    return f"{100 * x:.1f}" if pct else f"{x:.4f}"


def report_markdown(s: dict) -> str:
    """report.md: per-task accuracy and normalized accuracy of every method, means, bytes per task (``s``: the
    summary with its typed rows, :func:`summarize`)."""
    names = list(s["tasks"])
    h = s["headline"]
    cfg = s["settings"]
    lines = [f"# Merging {len(names)} fine-tuned models of `{s['pretrained']}`", "",
             f"Scored as `{s['mode']}`. Each task's region: localizer `{cfg['localizer']}` at budget {cfg['budget']} "
             "of the graftable parameters; the stitched model resolves overlaps by "
             f"`{cfg['rule']}` at strength λ = {h['stitch_scale']:g} (chosen on dev; written to this folder).", "",
             "**Every method merges the body only** (all but the task heads): heads of tasks with different label "
             "sets cannot be merged, so each task runs on the merged body with its own fine-tuned head — for "
             "skillgraft's stitch and for every mergekit method alike.", "",
             "| task | fine-tuned checkpoint | labels | localize rows | dev rows | test rows | graft | graft bytes | "
             "checkpoint bytes | share |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, t in s["tasks"].items():
        share = t["graft_bytes"] / t["checkpoint_bytes"] if t["checkpoint_bytes"] else float("nan")
        lines.append(f"| {n} | `{t['finetuned']}` | {len(t['labels'])} | {t['train']} | {t['dev']} | {t['test']} | "
                     f"{t['graft_size']:,} | {t['graft_bytes']:,} | {t['checkpoint_bytes']:,} | {100 * share:.2f}% |")
    from skillgraft.pipeline.caveats import caveat_markdown  # noqa: PLC0415

    lines += ["", *caveat_markdown(s.get("caveats"))]
    lines += ["", "## Test accuracy (normalized = merged ÷ the task's own fine-tuned model)", ""]
    header = ["method", "settings", *[f"{n} acc" for n in names], *[f"{n} norm" for n in names], "mean acc",
              "mean norm", "dev mean norm", "bytes / task"]
    table = []
    rows: list[MergeRow] = s["rows"]
    for r in rows:
        if not r.on_test:
            continue
        mark = " (chosen on dev)" if r.chosen_on_dev else ""
        table.append([r.method, r.config + mark, *[_fmt(r.tasks[n].test) for n in names],
                      *[_fmt(r.tasks[n].normalized()) for n in names], _fmt(r.mean_accuracy),
                      _fmt(r.mean_normalized()), _fmt(r.mean_normalized("dev")), f"{r.bytes_per_task:,.0f}"])
    lines += md_table(header, table).splitlines()
    grid = [r for r in rows if r.method.startswith("mergekit") or r.method == "stitch"]
    if grid:
        lines += ["", "## Grids (chosen on dev rows only; mergekit: λ = `lambda`, weight 1 per model; stitch: λ of "
                  "θ_pre + λ Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t)", "",
                  "| method | settings | dev mean norm | on test |", "|---|---|---:|---|"]
        for r in grid:
            if r.error:
                lines.append(f"| {r.method} | {r.config} | failed: {r.error} | - |")
            else:
                lines.append(f"| {r.method} | {r.config} | {_fmt(r.mean_normalized('dev'))} | "
                             f"{'yes' if r.on_test else 'no'} |")
    lines += refit_markdown(s)
    lines += routed_markdown(s)
    lines += ["", "## Headline", "",
              f"- stitch (`{h['stitch_rule']}`, λ = {h['stitch_scale']:g} chosen on dev; written to this folder): "
              f"mean normalized accuracy {_fmt(h['stitch_mean_normalized'])} (at λ = 1, Localize-and-Stitch as "
              f"published: {_fmt(h['stitch_scale_1_mean_normalized'])}); the rule and λ best on dev are "
              f"`{h['stitch_rule_chosen_on_dev']}` ({_fmt(h['stitch_dev_rule_mean_normalized'])})"]
    if h.get("best_mergekit"):
        lines.append(f"- best mergekit method (its settings chosen on dev, best of the methods on test): "
                     f"{h['best_mergekit']}: {_fmt(h['best_mergekit_mean_normalized'])}")
    if h.get("refit_heads"):
        lines.append(f"- with heads refitted on {h['refit_heads']} rows per task: stitch "
                     f"{_fmt(h['stitch_refit_mean_normalized'])}, best mergekit method {h['best_mergekit_refit']}: "
                     f"{_fmt(h['best_mergekit_refit_mean_normalized'])}")
    if h.get("peers_at_equal_bytes"):
        graft = next(r["mean_normalized"] for r in s["rows"] if r["method"] == "graft")
        lines.append("- task-aware peers at the grafts' bytes per task: " + ", ".join(
            f"{m} {_fmt(v)} ({h['peers_bytes_per_task'][m]:,.0f} bytes)" for m, v in h["peers_at_equal_bytes"].items())
            + f"; each task's graft alone ({'at --budgets' if (s.get('routed') or {}).get('keep') else 'routed'}): "
            f"{_fmt(graft)}")
    if h.get("max_graft_share_of_checkpoint") is not None:
        lines.append(f"- largest stored skill: {h['max_graft_bytes']:,} bytes = "
                     f"{100 * h['max_graft_share_of_checkpoint']:.2f}% of its checkpoint's weight bytes")
    lines += ["", "Overlap rules: *average* — θ_pre + Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t (Localize-and-Stitch, Eq. 4: the mean "
              "of the claiming tasks' values; `λ=…` rows scale that sum, as task arithmetic's λ does); "
              "*max-delta* — the task with the largest |τ_t| at the coordinate wins; "
              "*disjoint* — contested coordinates stay θ_pre. mergekit: `linear` = mean of the fine-tuned bodies; "
              "`task_arithmetic` = θ_pre + λ Σ_t τ_t; `ties` = trim to the top-density |τ|, elect signs, mean of the "
              "agreeing values, × λ; `dare_ties` = random drop to density with rescaling, sign election, sum × λ. "
              "*defaults*: weight 1 per model and mergekit's own defaults (λ 1, density 1).",
              "", "*bytes / task*: what must be kept per task to rebuild the merged model — a graft file (positions, "
              "values, the task's head) for the stitch; the whole fine-tuned checkpoint (its dense task vector) for "
              "mergekit's methods and single-task models.", ""]
    return "\n".join(lines)


def refit_markdown(s: dict) -> list[str]:
    """Every test-scored method with and without refitted heads (--refit-heads)."""
    refit = {(r["method"], r["config"].removesuffix(" + refit heads")): r for r in s["rows"]
             if r.get("refit_heads") and r.get("on_test")}
    if not refit:
        return []
    n = next(iter(refit.values()))["refit_heads"]
    lines = ["", f"## With each task's head refitted ({n} training rows per task, on the merged body)", "",
             "Only the last linear layer of each task's head is refitted (L-BFGS, cross-entropy, pulled toward the "
             "fine-tuned head); the rows are training rows, never test or dev rows.", "",
             "| method | settings | mean norm | mean norm, refitted heads | change |", "|---|---|---:|---:|---:|"]
    for r in s["rows"]:
        k = (r["method"], r["config"])
        if r.get("refit_heads") or not r.get("on_test") or k not in refit:
            continue
        a, b = r["mean_normalized"], refit[k]["mean_normalized"]
        mark = " (chosen on dev)" if r.get("chosen_on_dev") else ""
        lines.append(f"| {r['method']} | {r['config']}{mark} | {_fmt(a)} | {_fmt(b)} | {b - a:+.4f} |")
    return lines


def routed_markdown(s: dict) -> list[str]:
    """--routed: the routed skills' accuracy, bytes per task and switch time."""
    r = s.get("routed")
    if not r:
        return []
    share = f" ({100 * r['share_of_checkpoint']:.2f}% of a checkpoint)" if r.get("share_of_checkpoint") else ""
    row = "the `routed` row" if r.get("keep") else "the `graft` row"
    lines = ["", "## Routed skills (`routed/`: one base, each task's graft and head, applied per request)", "",
             f"- mean normalized accuracy {_fmt(r.get('mean_normalized'))} (each task's graft alone: {row})"
             + (f"; with refitted heads {_fmt(r['mean_normalized_refit'])}" if "mean_normalized_refit" in r else ""),
             f"- bytes per task {r['bytes_per_task']:,.0f}{share}",
             f"- switch time {r['switch_ms']:.2f} ms (median of apply + revert through `RoutedSkills.use`)", "",
             "```python", "from skillgraft import RoutedSkills",
             "skills = RoutedSkills.from_pretrained(\"routed\")",
             f"with skills.use(\"{next(iter(s['tasks']))}\") as model:",
             "    logits = model(**skills.tokenizer(texts, return_tensors=\"pt\", padding=True)).logits", "```"]
    return lines + routed_keep_markdown(r)


def routed_keep_markdown(r: dict) -> list[str]:
    """--routed --keep τ: per task the size found, its selection share and lower bound, the test share, bytes."""
    keep = r.get("keep")
    if not keep:
        return []
    conf = r["keep_confidence"]
    lines = ["", f"### Each routed graft sized by `--keep {r['keep_target']:g}` at {conf:.0%} confidence", "",
             f"Each task's graft is the smallest probed size of the localizer's nested family whose share of its "
             f"fine-tuned model's score on the task's dev rows (the selection split; never a test row) reaches "
             f"{r['keep_target']:g} {bound_prose(conf)}, as `skillgraft graft --keep`. *test share*: test score ÷ "
             "the task's fine-tuned test score.",
             "", "| task | reached | size | density | selection share | lower bound | selection rows | test share | "
             "point-estimate size | bytes |", "|---|:---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for n, t in keep.items():
        size = t["size"] if t["reached"] else t["best_size"]
        sel = t["selection_share"] if t["reached"] else t["best_share"]
        reached = "yes" if t["reached"] else "**no** (best reached shown)"
        point = "-" if t.get("point_size") is None else f"{t['point_size']:,}"
        lines.append(f"| {n} | {reached} | {size:,} | {size / t['universe']:.2e} | {_fmt(sel)} | "
                     f"{_fmt(t.get('bound'))} | {t.get('selection_rows') or '-'} | {_fmt(t.get('test_share'))} | "
                     f"{point} | {t['bytes']:,} |")
        if t.get("note"):
            notes.append(f"- {n}: {t['note']}.")
    return lines + ([""] + notes if notes else [])


def readme(s: dict, mode: str) -> str:
    """README.md of the output folder: the layout and how to load it with plain transformers."""
    names = list(s["tasks"])
    if mode == "classifier":
        return f"""# A merged model: one body, one head per task

Merged by `skillgraft merge` (rule `{s['settings']['rule']}`, strength λ = {s['headline']['stitch_scale']:g}) from
{len(names)} classifiers fine-tuned from `{s['pretrained']}`.

- `tasks/<task>/` — a complete Hugging Face checkpoint per task ({', '.join(f'`{n}`' for n in names)}): the merged
  body (bit-identical in every folder) and that task's own classification head, with its labels in
  `config.json` (`id2label`) and its tokenizer.
- `grafts/<task>/` — each task's skill as skillgraft stores it (positions + values + head); the body above is
  their stitch under the rule, scaled by λ (`skillgraft.graft.merge.stitch`, then `scaled`).
- `report.md`, `merge.json`, `results.csv` — the comparison with mergekit's methods.

Load with plain transformers (no skillgraft needed):

```python
from transformers import AutoModelForSequenceClassification, AutoTokenizer
model = AutoModelForSequenceClassification.from_pretrained("tasks/{names[0]}")
tok = AutoTokenizer.from_pretrained("tasks/{names[0]}")
logits = model(**tok(["some text"], return_tensors="pt")).logits
label = model.config.id2label[int(logits.argmax(-1))]
```

`AutoModel.from_pretrained("tasks/<any task>")` gives the shared merged body alone.
"""
    return f"""# A merged model

Merged by `skillgraft merge` (rule `{s['settings']['rule']}`, strength λ = {s['headline']['stitch_scale']:g}) from
{len(names)} models fine-tuned from `{s['pretrained']}` ({', '.join(f'`{n}`' for n in names)}); the tasks share
every tensor, so `model/` serves all of them.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer   # AutoModelForMaskedLM for masked LMs
model = AutoModelForCausalLM.from_pretrained("model")
tok = AutoTokenizer.from_pretrained("model")
```

`grafts/<task>/` holds each task's skill as skillgraft stores it (`model/` is their stitch under the rule, scaled by
λ); `report.md` compares with mergekit's methods.
"""
