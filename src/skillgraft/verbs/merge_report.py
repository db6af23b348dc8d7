"""The outputs of ``skillgraft merge``: merge.json's rows and headline (:func:`summarize`), the merged model and each
task's graft (:func:`write_outputs`), report.md and README.md."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from pathlib import Path

from skillgraft.lazy import np

from skillgraft.graft.graft import Graft
from skillgraft.keep.stats.bound import bound_prose
from skillgraft.graft.merge import swapped
from skillgraft.merge.base import MergeMethod, MergeRow, Scored, fmt as _fmt, graft_file_bytes
from skillgraft.merge.mergekit import body_module
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.report import md_table
from skillgraft.spec import Spec
from skillgraft.verbs.merge_inputs import weight_files
from skillgraft.verbs.result import VerbResult


@dataclasses.dataclass
class RoutedKeep:
    """One task's keep-sized routed graft (``merge --routed --keep``): its keep search (the columns routed.json's
    summary holds), the graft's bytes and those of the task's checkpoint (None: not known)."""

    task: str
    columns: Mapping
    bytes: int | None
    checkpoint_bytes: int | None

    def line(self) -> str:
        """What the command line prints of it (rich markup): :func:`~skillgraft.keep.report.keep_line`, and the
        graft's size against the checkpoint's."""
        from skillgraft.keep.report import KeepTarget, keep_line  # noqa: PLC0415

        b, ckpt = self.bytes, self.checkpoint_bytes
        share = f" ({b / 2**20:.2f} MiB, {100 * b / ckpt:.2f}% of its checkpoint)" if ckpt and b else ""
        return f"{keep_line(KeepTarget.from_columns(self.columns))}{share}"


@dataclasses.dataclass
class MergeResult(VerbResult):
    """What ``skillgraft merge`` wrote: the folder, its typed rows, and merge.json (``record``: the rows as their
    columns; with the folder and report.md, what ``--json`` prints)."""

    out: Path
    rows: list[MergeRow]
    record: dict

    @property
    def mode(self) -> str:
        return self.record["mode"]

    @property
    def headline(self) -> dict:
        return self.record["headline"]

    @property
    def evaluated_on(self) -> dict[str, str]:
        """Where each task's test rows came from (issue 80), by task."""
        return {name: t.get("evaluated_on", "?") for name, t in self.record["tasks"].items()}

    @property
    def written(self) -> str | None:
        """The merged model written (None: only the grafts and the comparison) and :attr:`written_why`."""
        return self.headline.get("written")

    @property
    def written_why(self) -> str:
        return self.headline.get("written_why") or ""

    @property
    def model_folder(self) -> Path | None:
        """Where the merged model is: ``tasks/<task>`` (a classifier's, one per task) or ``model``; None: none."""
        return self.out / ("tasks/<task>" if self.mode == "classifier" else "model") if self.written else None

    @property
    def routed_keep(self) -> list[RoutedKeep]:
        """``--routed --keep``: each task's keep-sized routed graft, in task order (none without them)."""
        tasks = self.record.get("tasks") or {}
        return [RoutedKeep(name, t, t.get("bytes"), (tasks.get(name) or {}).get("checkpoint_bytes"))
                for name, t in ((self.record.get("routed") or {}).get("keep") or {}).items()]

    def to_dict(self) -> dict:
        """merge.json's content."""
        return self.record

    def document(self) -> dict:
        return {"out": self.out, "report": self.out / "report.md", **self.record}


def summarize(results: list[Scored], ft: Scored, members: Mapping[str, Member], grafts: dict[str, Graft],
              spec, mode: str, pretrained: str, methods: list[tuple[MergeMethod, Spec]]) -> dict:
    """merge.json: settings, per-task rows (typed :class:`~skillgraft.merge.base.MergeRow`; ``merge.json`` holds
    their columns), the chosen configurations and the headline comparison: each method that ran (``methods``, with
    its options) gives its own entries (:meth:`MergeMethod.headline`)."""
    names = list(members)
    ckpt = {n: sum(f.stat().st_size for f in weight_files(str(members[n].inputs.ft_dir), members[n].inputs.ft_ref))
            for n in names}
    graft_bytes = {n: graft_file_bytes(grafts[n]) for n in names}
    rows = [MergeRow.of(s, ft, graft_bytes if s.stores == "graft" else ckpt) for s in results]
    plain_rows = [r for r in rows if not r.refit]
    written = next((r for r in plain_rows if r.info.get("written")), None)
    headline = {"written": f"{written.method} ({written.config})" if written else None,
                "checkpoint_bytes": float(np.mean(list(ckpt.values()))),
                "max_graft_bytes": max(graft_bytes.values()),
                "max_graft_share_of_checkpoint": max(graft_bytes[n] / ckpt[n] for n in names if ckpt[n]) if
                any(ckpt.values()) else None}
    refit = [r for r in rows if r.refit and r.on_test]
    if refit:
        headline["refit_heads"] = refit[0].info["refit_heads"]
    for method, options in methods:
        headline.update(method.headline(rows, options))
    headline.update(peers_headline(plain_rows))
    from skillgraft.pipeline.caveats import evaluation_source  # noqa: PLC0415

    tasks = {}
    for n in names:
        member = members[n]
        tasks[n] = {"finetuned": member.ft.base_model, "task": member.task, "labels": list(member.data.task.labels),
                    "train": len(member.data.train), "dev": len(member.data.dev), "test": len(member.test),
                    "data": member.inputs.data_note, "evaluated_on": evaluation_source(member),
                    "graft_size": grafts[n].size, "graft_bytes": graft_bytes[n],
                    "checkpoint_bytes": ckpt[n]}
    from skillgraft.pipeline.caveats import merge_caveats  # noqa: PLC0415

    return {"pretrained": pretrained, "mode": mode, "settings": spec.to_dict(), "tasks": tasks, "rows": rows,
            "headline": headline, "caveats": merge_caveats(members, ft.test),
            "methods": {m.name: m.summary for m, _ in methods}}


def peers_headline(rows: list[MergeRow]) -> dict:
    """The task-aware peers (--peers) at the grafts' bytes per task beside each task's graft alone (routed)."""
    peers = {r.method: r for r in rows if r.info.get("equal_bytes") and r.on_test}
    graft = next((r for r in rows if r.method == "graft" and r.on_test), None)
    if not peers or graft is None:
        return {}
    return {"peers_at_equal_bytes": {m: r.mean_normalized() for m, r in peers.items()},
            "peers_bytes_per_task": {m: r.bytes_per_task for m, r in peers.items()},
            "graft_at_least_every_peer": all(graft.mean_normalized() >= r.mean_normalized() for r in peers.values())}


def write_grafts(folder: Path, bench) -> None:
    """Each task's graft (``grafts/<task>/``)."""
    for name, g in bench.grafts.items():
        g.save_pretrained(folder / "grafts" / name)


def write_outputs(folder: Path, bench, use) -> None:
    """The merged model (``tasks/<task>/`` or ``model/``) and each task's graft (``grafts/<task>/``); ``use``: each
    task's scorer on the merged body (the written row's :attr:`Scored.reuse`: the stitch, or a mergekit body with
    the task's own head). A classifier is the task's θ_pre scorer (θ_ft's class) holding the merged body, θ_ft's
    carried head (:attr:`Workbench.heads`) and θ_ft's config and tokenizer, kept when θ_ft was released
    (:class:`~skillgraft.pipeline.member.FineTunedFiles`): nothing is read back."""
    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415

    write_grafts(folder, bench)
    pre = bench.pre
    if not carried_names(pre):  # one merged model serves every task
        with use(next(iter(bench.members))) as merged:
            merged.model.save_pretrained(folder / "model")
        pre.tokenizer.save_pretrained(folder / "model")
        return
    for name, member in bench.members.items():
        # the merged body written into the task's own fine-tuned classifier
        with use(name) as merged:
            state = {n: t.detach().clone() for n, t in body_module(merged).state_dict().items()}
        pre, ft = member.pre, member.ft  # θ_ft released: its FineTunedFiles keep its config and tokenizer
        config = ft.config if member.released else ft.model.config
        with swapped(pre, bench.heads[name]), swapped(body_module(pre), state), _config(pre.model, config):
            pre.model.save_pretrained(folder / "tasks" / name)
        ft.tokenizer.save_pretrained(folder / "tasks" / name)
        del state


@contextlib.contextmanager
def _config(model, config):
    """``model`` with ``config`` for the block (a classifier written with its fine-tuned model's config)."""
    was, model.config = model.config, config
    try:
        yield model
    finally:
        model.config = was


def report_markdown(s: dict, methods: list[MergeMethod]) -> str:
    """report.md: per-task accuracy and normalized accuracy of every method, means, bytes per task (``s``: the
    summary with its typed rows, :func:`summarize`; ``methods``: the merge methods that ran, which say what the
    report tells of them: their summary, grid, headline and legend)."""
    names = list(s["tasks"])
    h = s["headline"]
    cfg = s["settings"]
    first = (f"**Written to this folder: {h['written']}** — {h.get('written_why') or 'chosen on dev'}; chosen on "
             "dev rows only." if h.get("written") else
             f"**No merged model is written** ({h.get('written_why') or 'no method that writes one ran'}).")
    lines = [f"# Merging {len(names)} fine-tuned models of `{s['pretrained']}`", "", first, "",
             f"Scored as `{s['mode']}`. Each task's region: localizer `{cfg['localizer']}` at budget {cfg['budget']} "
             f"of the graftable parameters.", "",
             "Methods: " + "; ".join(f"**{m.name}** — {m.summary}" for m in methods) + ".", "",
             "**Every method merges the body only** (all but the task heads): heads of tasks with different label "
             "sets cannot be merged, so each task runs on the merged body with its own fine-tuned head — for "
             "every method alike.", "",
             "| task | fine-tuned checkpoint | labels | localize rows | dev rows | test rows | graft | graft bytes | "
             "checkpoint bytes | share |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, t in s["tasks"].items():
        share = t["graft_bytes"] / t["checkpoint_bytes"] if t["checkpoint_bytes"] else float("nan")
        lines.append(f"| {n} | `{t['finetuned']}` | {len(t['labels'])} | {t['train']} | {t['dev']} | {t['test']} | "
                     f"{t['graft_size']:,} | {t['graft_bytes']:,} | {t['checkpoint_bytes']:,} | {100 * share:.2f}% |")
    lines += ["", "Evaluated on: " + "; ".join(f"{n}: {t['evaluated_on']}" for n, t in s["tasks"].items()
                                             if t.get("evaluated_on")) + "."]
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
    grids = {m.name: m.grid_note for m in methods if m.grid_note}
    grid = [r for r in rows if r.source in grids]
    if grid:
        ran = dict.fromkeys(r.source for r in grid)
        lines += ["", f"## Grids (chosen on dev rows only; {'; '.join(grids[n] for n in ran)})", "",
                  "| method | settings | dev mean norm | on test |", "|---|---|---:|---|"]
        for r in grid:
            if r.error:
                lines.append(f"| {r.method} | {r.config} | failed: {r.error} | - |")
            else:
                lines.append(f"| {r.method} | {r.config} | {_fmt(r.mean_normalized('dev'))} | "
                             f"{'yes' if r.on_test else 'no'} |")
    lines += refit_markdown(s)
    lines += routed_markdown(s)
    lines += ["", "## Headline", ""]
    for m in methods:
        lines += m.headline_lines(h)
    if h.get("peers_at_equal_bytes"):
        graft = next(r.mean_normalized() for r in s["rows"] if r.method == "graft" and not r.refit)
        lines.append("- task-aware peers at the grafts' bytes per task: " + ", ".join(
            f"{m} {_fmt(v)} ({h['peers_bytes_per_task'][m]:,.0f} bytes)" for m, v in h["peers_at_equal_bytes"].items())
            + f"; each task's graft alone ({'at --budgets' if (s.get('routed') or {}).get('keep') else 'routed'}): "
            f"{_fmt(graft)}")
    if h.get("max_graft_share_of_checkpoint") is not None:
        lines.append(f"- largest stored skill: {h['max_graft_bytes']:,} bytes = "
                     f"{100 * h['max_graft_share_of_checkpoint']:.2f}% of its checkpoint's weight bytes")
    legends = [m.legend for m in methods if m.legend]
    stores = {"graft": [m.name for m in methods if m.stores == "graft"],
              "checkpoint": [m.name for m in methods if m.stores != "graft"]}
    grafts, checkpoints = ", ".join(["each task's graft", *stores["graft"]]), ", ".join(stores["checkpoint"])
    lines += ["", " ".join(legends), "", "*bytes / task*: what must be kept per task to rebuild the merged model — a "
              f"graft file (positions, values, the task's head) for {grafts}; the whole fine-tuned checkpoint (its "
              f"dense task vector) for {checkpoints + ', ' if checkpoints else ''}single-task models (unless a row "
              "says its own bytes).", ""]
    return "\n".join(lines)


def refit_markdown(s: dict) -> list[str]:
    """Every test-scored method with and without refitted heads (--refit-heads)."""
    refit = {(r.method, r.config.removesuffix(" + refit heads")): r for r in s["rows"] if r.refit and r.on_test}
    if not refit:
        return []
    n = next(iter(refit.values())).info["refit_heads"]
    lines = ["", f"## With each task's head refitted ({n} training rows per task, on the merged body)", "",
             "Only the last linear layer of each task's head is refitted (L-BFGS, cross-entropy, pulled toward the "
             "fine-tuned head); the rows are training rows, never test or dev rows.", "",
             "| method | settings | mean norm | mean norm, refitted heads | change |", "|---|---|---:|---:|---:|"]
    for r in s["rows"]:
        k = (r.method, r.config)
        if r.refit or not r.on_test or k not in refit:
            continue
        a, b = r.mean_normalized(), refit[k].mean_normalized()
        mark = " (chosen on dev)" if r.chosen_on_dev else ""
        lines.append(f"| {r.method} | {r.config}{mark} | {_fmt(a)} | {_fmt(b)} | {b - a:+.4f} |")
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
             f"- switch time {r['switch_ms']:.2f} ms (median of apply + revert through `RoutedSkills.use`)",
             *router_lines(r.get("router")), "",
             "```python", "from skillgraft import RoutedSkills",
             "skills = RoutedSkills.from_pretrained(\"routed\")",
             f"with skills.use(\"{next(iter(s['tasks']))}\") as model:",
             "    logits = model(**skills.tokenizer(texts, return_tensors=\"pt\", padding=True)).logits", "```"]
    return lines + routed_keep_markdown(r, s["tasks"])


def router_lines(router: dict | None) -> list[str]:
    """The stored router (`skill="auto"`): its kind, how it routed the dev rows, and each task whose dev rows it sends
    elsewhere at 10 % or more — those requests look like another task's, so name their skill."""
    if not router:
        return []
    from skillgraft.graft.router import confused  # noqa: PLC0415

    dev = (router.get("accuracy") or {}).get(router["kind"], {}).get("dev")
    lines = [f"- router `{router['kind']}` for `skill=\"auto\"`"
             + (f": {100 * dev:.1f} % of the dev rows to their own task's skill" if dev is not None else
                " (no dev rows: not measured)")]
    for task, away in confused(router.get("dev_routes") or {}).items():
        (first, share), *rest = away.items()
        where = "".join(f", {100 * v:.0f} % to {k}" for k, v in rest)
        lines.append(f"- the router sends {100 * share:.0f} % of {task}'s dev rows to {first}{where}: their requests "
                     "look alike, so unless these skills answer the same question of a text, name the skill "
                     f"(`skill=\"{task}\"`; `model` in `skillgraft serve`)")
    return lines


def checkpoint_share(nbytes: float, task: dict) -> str:
    """A routed graft's bytes as a share of its task's fine-tuned checkpoint's weight bytes (``-`` when unknown)."""
    ckpt = task.get("checkpoint_bytes")
    return f"{100 * nbytes / ckpt:.2f}%" if ckpt else "-"


def routed_keep_markdown(r: dict, tasks: dict | None = None) -> list[str]:
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
             "point-estimate size | bytes | share of checkpoint |",
             "|---|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for n, t in keep.items():
        size = t["size"] if t["reached"] else t["best_size"]
        sel = t["selection_share"] if t["reached"] else t["best_share"]
        reached = "yes" if t["reached"] else "**no** (best reached shown)"
        point = "-" if t.get("point_size") is None else f"{t['point_size']:,}"
        lines.append(f"| {n} | {reached} | {size:,} | {size / t['universe']:.2e} | {_fmt(sel)} | "
                     f"{_fmt(t.get('bound'))} | {t.get('selection_rows') or '-'} | {_fmt(t.get('test_share'))} | "
                     f"{point} | {t['bytes']:,} | {checkpoint_share(t['bytes'], (tasks or {}).get(n, {}))} |")
        if t.get("note"):
            notes.append(f"- {n}: {t['note']}.")
    return lines + ([""] + notes if notes else [])


def readme(s: dict, mode: str) -> str:
    """README.md of the output folder: the layout and how to load it with plain transformers."""
    names = list(s["tasks"])
    if not s["headline"].get("written"):
        listed = ", ".join(f"`{n}`" for n in names)
        return f"""# Grafts of {len(names)} fine-tuned models, compared by merge method

`skillgraft merge` localized each of {len(names)} models fine-tuned from `{s['pretrained']}` ({listed}) and
compared the merge methods that ran ({', '.join(s['methods']) or 'none'}); none of them writes a merged model
(the stitch was switched off). `grafts/<task>/` holds each task's skill as skillgraft stores it (load it with
`skillgraft apply`); `report.md`, `merge.json` and `results.csv` hold the comparison.
"""
    h = s["headline"]
    if h["written"].startswith("stitch"):
        how = (f"`skillgraft merge` (the stitch: rule `{s['settings']['rule']}`, strength λ = {h['stitch_scale']:g}; "
               "the best one-model merge on dev)")
        body = "the written model (under the rule, scaled by λ: `skillgraft.graft.merge.stitch`, then `scaled`)"
    else:
        how = f"`skillgraft merge` ({h['written']}: the best one-model merge on dev; {h.get('written_why', '')})"
        body = f"not the written model, which is {h['written']}"
    if mode == "classifier":
        return f"""# A merged model: one body, one head per task

Merged by {how} from
{len(names)} classifiers fine-tuned from `{s['pretrained']}`.

- `tasks/<task>/` — a complete Hugging Face checkpoint per task ({', '.join(f'`{n}`' for n in names)}): the merged
  body (bit-identical in every folder) and that task's own classification head, with its labels in
  `config.json` (`id2label`) and its tokenizer.
- `grafts/<task>/` — each task's skill as skillgraft stores it (positions + values + head); their stitch is
  {body}.
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

Merged by {how} from
{len(names)} models fine-tuned from `{s['pretrained']}` ({', '.join(f'`{n}`' for n in names)}); the tasks share
every tensor, so `model/` serves all of them.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer   # AutoModelForMaskedLM for masked LMs
model = AutoModelForCausalLM.from_pretrained("model")
tok = AutoTokenizer.from_pretrained("model")
```

`grafts/<task>/` holds each task's skill as skillgraft stores it (their stitch is {body}); `report.md` compares
with mergekit's methods.
"""
