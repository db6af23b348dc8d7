"""What a grafting report shows: its typed result (:class:`GraftReport`, metrics.json's keys in order, and
:class:`GraftResult`, the verb's), report.md's text and its figures, its fit section among them (:func:`fit_section`).
``verbs/graft.py`` runs the report; this module only reads its typed rows (a row's localizer and budget are fields:
its display name is never parsed back)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skillgraft.lazy import np

from skillgraft.evaluate.plots import panel_margins, save_figure
from skillgraft.export.base import human_size
from skillgraft.graft.selection import Budget
from skillgraft.pipeline.variants import ResultRow
from skillgraft.verbs.result import VerbResult

# Report names of the baseline localizers (kept from the reports in bench/RESULTS.md).
BASELINE_LABELS = {"movement": "top-movement", "random": "random", "bias": "bias-only"}


def baseline_label(localizer: str) -> str:
    """A matched-size baseline localizer's name in reports (``movement`` → ``top-movement``)."""
    return BASELINE_LABELS.get(localizer, localizer)


def matched_label(row: ResultRow) -> str | None:
    """The curve of a row matched to a learned graft's size (a baseline localizer, lottery-ticket-zero), from its
    typed identity; None for every other row."""
    if row.kind == "baseline":
        return baseline_label(row.localizer)
    if row.kind == "lottery-zero":
        return "lottery-ticket-zero"
    return None


@dataclass
class GraftReport(Mapping):
    """One grafting report, typed: metrics.json's keys in its order (the optional sections only when made), read
    as that mapping (``report["rows"]``) by report.md's text and the JSON writers."""

    task: str
    k: int
    seed: int
    test_n: int
    evaluated_on: str
    graftable_parameters: int
    total_parameters: int
    all_parameters: int
    localizer: str
    localization: dict
    carried_parameters: int
    rows: list[ResultRow]
    placement: dict
    caveats: list = field(default_factory=list)
    fit: dict | None = None          # did each learned region fit its selection rows (fit_section)
    memory_plan: dict | None = None  # the verb's memory plan
    keep: Any = None                 # keep targets (pipeline/keep.py's summary), with --keep
    frontier: Any = None             # the share-vs-density frontier (pipeline/frontier.py), with --frontier

    OPTIONAL = ("fit", "memory_plan", "keep", "frontier")  # present only when made

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in self.OPTIONAL}
        out.update({k: getattr(self, k) for k in self.OPTIONAL if getattr(self, k) is not None})
        return out

    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def __iter__(self):
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    @property
    def fit_lines(self) -> list[str]:
        """The fit section's lines the command line prints."""
        return (self.fit or {}).get("lines", [])

    def by_budget(self) -> dict[str, ResultRow]:
        """The learned grafts' rows by budget key."""
        return {r.budget: r for r in self.rows if r.kind == "graft"}


@dataclass
class GraftResult(VerbResult):
    """What ``skillgraft graft`` wrote: the report folder, its typed report and how the data and labels were read."""

    out: Path
    report: GraftReport
    data_note: str = ""
    labels_note: str = ""

    @property
    def rows(self) -> list[ResultRow]:
        """The report's typed rows (FT, the grafts, the baselines…; ``columns()``: results.csv's)."""
        return self.report.rows

    @property
    def metrics(self) -> GraftReport:
        """The report (metrics.json's content, typed)."""
        return self.report

    def shown(self) -> list[ResultRow]:
        """The rows the command line prints: FT, the learned grafts and the keep targets."""
        return [r for r in self.rows if r.kind in ("graft", "ft", "keep")]

    def document(self) -> dict:
        return {"out": self.out, "report": self.out / "report.md", "data_note": self.data_note,
                "labels_note": self.labels_note, **self.report.to_dict()}


def size_plot(rows: list[ResultRow], path: Path, metric: str) -> None:
    """Score vs grafted parameters per localizer, with FT / head only / pre-trained as lines."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.8))
    groups: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["params"] and r["kind"] != "ft":
            groups.setdefault(matched_label(r) or "learned graft", []).append((r["params"], r["score"]))
    # the reference lines (black, gray, brown) and the localizers (the rest of tab10) never share a colour
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:pink", "tab:olive", "tab:cyan"]
    for i, (kind, pts) in enumerate(groups.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=kind, color=colours[i % len(colours)])
    for r in rows:
        if r["kind"] in ("ft", "head-only", "pre"):
            ax.axhline(r["score"], ls={"pre": ":"}.get(r["kind"], "--"), lw=1,
                       color={"ft": "k", "head-only": "gray"}.get(r["kind"], "tab:brown"), label=r["model"])
    ax.set_xscale("log")
    ax.set_xlabel("grafted parameters")
    ax.set_ylabel(metric)
    ax.legend(fontsize=7)
    panel_margins(fig)
    save_figure(fig, path, layout=False)


# share_vs_size.png: the learned grafts against the two closed-form regions a reader compares them with first
SHARE_CURVES = {"graft": ("learned", "tab:blue", "o-"), "keep": ("keep targets", "tab:purple", "D"),
                "top-movement": ("top-|Δ| (same size)", "tab:orange", "s--"),
                "random": ("random (same size)", "tab:green", "^:")}


def share_plot(rows: list[ResultRow], path: Path) -> None:
    """Share of FT vs grafted parameters: learned grafts (and keep targets), top-|Δ| and random regions of the same
    sizes; FT at 1 and head only / pre-trained as lines (what report.md shows first)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.8))
    curves: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if not r["params"] or r.get("share_of_ft") is None or r["kind"] == "ft":
            continue
        kind = matched_label(r) or r["kind"]
        if kind in SHARE_CURVES:
            curves.setdefault(kind, []).append((r["params"], r["share_of_ft"]))
    for kind, pts in curves.items():
        label, colour, style = SHARE_CURVES[kind]
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, color=colour)
    ax.axhline(1.0, ls="--", lw=1, color="k", label="fine-tuned (1)")
    for r in rows:
        if r["kind"] in ("head-only", "pre") and r.get("share_of_ft") is not None:
            ax.axhline(r["share_of_ft"], ls=":", lw=1, color="gray" if r["kind"] == "head-only" else "tab:brown",
                       label=r["model"])
    ax.set_xscale("log")
    ax.set_xlabel("grafted parameters (log)")
    ax.set_ylabel("share of FT's score")
    ax.legend(fontsize=7)
    panel_margins(fig)
    save_figure(fig, path, layout=False)


def figures_markdown(ref: str) -> list[str]:
    """report.md's figures, the two to look at first described: what each shows and how to read it."""
    return ["## Look first", "",
            "![share of FT vs size](share_vs_size.png)", "",
            "**Share of FT vs size** (`share_vs_size.png`): each graft's score as a share of the fine-tuned model's "
            "(y; 1 = as good as FT) against its size in grafted parameters (x, log). Blue: the learned grafts; "
            "orange: the top-|Δ| region of the same size (the coordinates that moved most in fine-tuning); green: a "
            "random region of the same size; dotted: head only / pre-trained. The skill is localized where blue "
            "stands above orange and green at small sizes: the learned region finds it where |Δ| and chance do "
            f"not. Sizes where blue reaches 1 keep all of FT's skill (the table's *gap closed* is from {ref}).", "",
            "![reliability](reliability.png)", "",
            "**Reliability diagram of FT vs the grafts** (`reliability.png`): one panel per model, its accuracy in "
            "each of 10 confidence bins (bars) against the diagonal (dashed: perfect calibration). A graft whose "
            "bars match FT's panel keeps FT's calibration as well as its accuracy; bars below the diagonal are "
            "over-confident, above under-confident (the panel's ECE, as the table's, sums the gaps).", "",
            "More figures: [confidence histogram](confidence.png) (how sure each model is on the test rows), "
            "[score vs size per localizer](accuracy_vs_size.png) (every baseline's raw score).", ""]


def best_steps(best) -> str:
    """``{"0.0001": 40, "0.001": 60}`` as a reader writes it: ``40 (budget 1e-4), 60 (budget 1e-3)``."""
    if not isinstance(best, dict):
        return str(best)

    def label(key) -> str:
        try:
            return f"{float(key):g}"
        except (TypeError, ValueError):
            return str(key)

    return ", ".join(f"{step} (budget {label(key)})" for key, step in best.items()) or "-"


def parameters_line(metrics: dict) -> str:
    """The model's parameters, counted once and split: all of them = the base model's + the carried task head's;
    the graftable body is part of the base model's (issue 80: the report said 22,713,216, a finetune 22,713,986)."""
    carried = metrics["carried_parameters"]
    whole = metrics.get("all_parameters") or metrics["total_parameters"] + carried
    split = (f" = {metrics['total_parameters']:,} in the base model + {carried:,} in the carried task head (travels "
             "whole with every graft; counted separately)") if carried else \
        " (the base model's; no carried task head: the model scores with its own LM head)"
    return (f"Parameters: {whole:,}{split}; graftable (the body): {metrics['graftable_parameters']:,} of the base "
            "model's.")


def step_rate(loc: dict) -> str:
    """The localization's time per step, from one source: its wall time (scoring included, as the progress bar
    counts it) over its steps, with the median step alone beside it."""
    steps = (loc.get("config") or {}).get("steps") or 0
    trajectories = max(1, len(loc.get("budgets") or []) if (loc.get("config") or {}).get("per_size") else 1)
    taken = sum(s["step"] for s in loc["stopped"]) if loc.get("stopped") else steps * trajectories  # a fit schedule
    if loc.get("seconds") and taken:  # may stop a trajectory early: the steps it took
        per = loc["seconds"] / taken
        return (f"{per:.2f} s/step overall ({loc['seconds']:.0f} s for {taken} steps, scoring "
                f"included; a step alone {loc['step_seconds']:.2f} s, median)")
    return f"{loc['step_seconds']:.2f} s/step (median, scoring excluded)"


def report_markdown(metrics: dict) -> str:
    """The grafting report: one table (score, ECE, agreement with FT, parameters, file size) and plots."""
    metric = "F1" if any("f1" in r for r in metrics["rows"]) else "accuracy"
    loc = metrics["localization"]
    cfg = loc.get("config", {})
    ref = "head-only" if metrics["carried_parameters"] else "pre-trained"
    shots = f"{metrics['k']}-shot" if metrics["k"] else "all rows"  # k = 0: a user's data, every row
    lines = [f"# Grafting report — {metrics['task']}, {shots}, data seed {metrics['seed']}", "",
             f"Evaluated on {metrics.get('evaluated_on') or str(metrics['test_n']) + ' test rows'}. "
             + parameters_line(metrics), ""]
    from skillgraft.pipeline.caveats import caveat_markdown  # noqa: PLC0415

    lines += caveat_markdown(metrics.get("caveats"))
    if metrics["localizer"] == "learned" and "step_seconds" in loc:
        base = ("of each budget's own size (per_size)" if "base_size" not in loc else
                f"{loc['base_size']:,} coordinates (sparsity {cfg.get('sparsity', 0):g})")
        from skillgraft.graft.localizers.machinery.fit import ScheduleOptions  # noqa: PLC0415

        fit_default = ScheduleOptions()  # a field at its default is left out of the stored config
        schedule = (f"until fit share {cfg.get('fit_target', fit_default.fit_target):g} or "
                    f"{cfg.get('patience', fit_default.patience)} steps without "
                    f"gain, at most {cfg.get('steps')} steps" if cfg.get("schedule") == "fit" else
                    f"{cfg.get('steps')} steps")
        lines += [f"Localization: {schedule}, lr {cfg.get('lr', 0):g}, base patch {base}, "
                  f"{step_rate(loc)}, best step {best_steps(loc['best_step'])}.", ""]
    else:
        lines += [f"Localizer: {metrics['localizer']}.", ""]
    lines += figures_markdown(ref)  # the figures first, then the table (as the README says)
    lines += [f"| model | params | density | {metric} | share of FT | gap closed | ECE | agreement w/ FT | file |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in metrics["rows"]:
        gap = f"{r['gap_closed']:.2f}" if "gap_closed" in r else "-"
        size = human_size(r["file_bytes"]) if r.get("file_bytes") else "-"
        share = f"{r['share_of_ft']:.3f}" if "share_of_ft" in r else "-"
        lines.append(f"| {r['model']} | {r['params']:,} | {r['density']:.2e} | {r['score']:.4f} | "
                     f"{share} | {gap} | {r['ece']:.4f} | {r.get('agreement', 1.0):.3f} | {size} |")
    if any("loss" in r for r in metrics["rows"]):  # generative data (docs/generative.md)
        lines += ["", "| model | completion loss | share of FT's loss drop | token accuracy | exact match |",
                  "|---|---:|---:|---:|---:|"]
        for r in metrics["rows"]:
            rec = f"{r['loss_recovered']:.3f}" if "loss_recovered" in r else "-"
            em = f"{r['exact_match']:.4f}" if "exact_match" in r else "-"
            lines.append(f"| {r['model']} | {r['loss']:.4f} | {rec} | {r['token_accuracy']:.4f} | {em} |")
        lines += ["", "*completion loss*: mean token cross-entropy on the completion tokens (held out); *share of FT's "
                  "loss drop* = (L_pre − L) ÷ (L_pre − L_FT); *exact match*: the gold completion is the most likely of "
                  "the label completions (when completions are labels)."]
    lines += ["", f"*share of FT* = score ÷ fine-tuned score; *gap closed* = (score − {ref}) ÷ (FT − {ref}); "
              "ECE: 10 equal-width bins over the max probability (Guo et al.).", ""]
    if metrics.get("fit"):
        lines += fit_markdown(metrics["fit"])
    if metrics.get("keep"):
        from skillgraft.keep.report import keep_markdown  # noqa: PLC0415

        lines += keep_markdown(metrics["keep"])
    if metrics.get("frontier"):
        from skillgraft.pipeline.frontier import frontier_markdown  # noqa: PLC0415

        lines += frontier_markdown(metrics["frontier"])
    return "\n".join(lines)


def mean_share(rows: list[dict]) -> float:
    """Mean share of FT over the learned grafts of a report (a one-number summary)."""
    vals = [r["share_of_ft"] for r in rows if r["kind"] == "graft" and "share_of_ft" in r]
    return float(np.mean(vals)) if vals else float("nan")


# ------------------------------------------------------------------------------------------------ the fit section
# (issue 74) did each learned region fit what it was asked to fit, and carry it?
#
#     fit share = region's score on the selection rows ÷ FT's there        carry = (test score ÷ FT's) ÷ fit share
#
# One line per budget — the region's and FT's score on the selection rows, the fit share, the test share and carry,
# where the trajectory stopped and whether it was still rising — and one more where a graft keeps little of FT's gain
# (it says so plainly, with what would: a larger budget, a keep target, or the fit schedule). The same lines go to
# report.md, the command line and ``metrics.json`` / ``--json`` (``metrics["fit"]``); the trajectory of the fit
# share per budget is ``fit.png``.
LITTLE_GAIN = 0.25  # a graft closing less of the gap between its reference and FT "keeps little of FT's gain"
# The selection rows' halves apart (``apart``: the training rows FT was fine-tuned on, the dev rows it was not): a fit
# share short of the target while the region keeps ≥ HELD_FIT of FT on the dev rows and FT fits ≥ MEMORIZED of its
# own training rows is FT's memorization of them, said in one line.
HELD_FIT, MEMORIZED = 0.98, 0.99
# ... and the other way round: the region at ≥ STEPPED_FIT of FT on the training rows its gradient comes from, short of
# CARRIED on the dev rows — it fits what it is stepped on more than it carries (Gemma QNLI/13, bench/RESULTS.md)
STEPPED_FIT, CARRIED = 0.95, 0.9
# ... and a region at ≥ CARRIED of FT's accuracy on the dev rows that gives FT's answer on fewer than AGREES of them:
# it matches FT's score there, not its behaviour (Gemma MRPC/13: 0.97 of FT's accuracy, agreement 0.63, test 0.63)
AGREES = 0.8


def _budget_label(key: str) -> str:
    try:
        return f"{float(key):g}"
    except ValueError:
        return key


def fit_section(summary: dict, rows: dict[str, object]) -> dict | None:
    """``summary``: a learned localization's (its ``fit``, ``stopped``, ``reference``); ``rows``: each budget key's
    graft row (a :class:`~skillgraft.pipeline.variants.ResultRow`, or None). None when the localizer measured no
    fit (a score-based localizer, or a summary stored before fits were measured)."""
    fit = summary.get("fit")
    if not fit:
        return None
    stopped = summary.get("stopped") or []
    fitting = (summary.get("config") or {}).get("schedule") == "fit"
    budgets, lines = {}, []
    for key, f in fit.items():
        row = rows.get(key)
        test_share = getattr(row, "share_of_ft", None) if row is not None else None
        gap = getattr(row, "gap_closed", None) if row is not None else None
        share = f.get("share")
        carry = test_share / share if test_share is not None and share else None
        stop = next((s for s in stopped if s.get("budget") in (None, Budget.parse(key).label)), None)
        budgets[key] = {**f, "test_share": test_share, "gap_closed": gap, "carry": carry,
                        "stopped_at": stop["step"] if stop else f.get("last_step"),
                        "why": stop["why"] if stop else None}
        lines.append(_fit_line(key, budgets[key], summary.get("reference") or {}, fitting))
        for said in (_halves_line(budgets[key]), _agreement_line(budgets[key])):
            if said:
                lines.append(said)
        if gap is not None and gap < LITTLE_GAIN:
            lines.append(f"  The {_budget_label(key)} graft keeps little of FT's gain (gap closed {gap:.2f}, fit "
                         f"share {share:.2f}): no region of this size that keeps the skill was found. A larger budget or a "
                         "keep target (--keep 0.9 finds the size that keeps 90 %) may"
                         + ("." if fitting else ", or --schedule fit."))
    return {"budgets": budgets, "reference": summary.get("reference"), "lines": lines}


def _halves_line(b: dict) -> str | None:
    """The line for a fit gap that lies on the training rows FT memorized, or on the dev rows while the region fits
    the training rows (None: neither)."""
    apart = b.get("apart") or {}
    train, dev = apart.get("train"), apart.get("dev")
    if not (train and dev and train["ft"] and dev["ft"]) or b.get("share") is None or b["share"] >= HELD_FIT:
        return None
    if train["region"] / train["ft"] >= STEPPED_FIT and dev["region"] / dev["ft"] < CARRIED:
        return (f"  The region keeps {train['region'] / train['ft']:.2f} of FT on the {train['rows']} training rows its "
                f"gradient comes from and {dev['region'] / dev['ft']:.2f} on the {dev['rows']} dev rows: it fits the rows "
                "it is stepped on more than it carries. Rows FT was not trained on in each step (--step-rows "
                "train+dev, or more training rows) are the lever to try.")
    if dev["region"] / dev["ft"] < HELD_FIT or train["ft"] < MEMORIZED:
        return None
    return (f"  On the {dev['rows']} dev rows the region keeps {dev['region'] / dev['ft']:.2f} of FT; the rest of the gap "
            f"is on the {train['rows']} training rows, which FT fits {train['ft']:.3f} (memorized) and the region "
            f"{train['region']:.3f}: not a skill the region lacks on held-out rows.")


def _agreement_line(b: dict) -> str | None:
    """The line for a region that keeps FT's accuracy on the dev rows but not its answers (None: it agrees, or no
    agreement was measured)."""
    dev = (b.get("apart") or {}).get("dev") or {}
    agreement = dev.get("agreement")
    if agreement is None or not dev.get("ft") or dev["region"] / dev["ft"] < CARRIED or agreement >= AGREES:
        return None
    return (f"  On the {dev['rows']} dev rows the region scores {dev['region'] / dev['ft']:.2f} of FT's accuracy but "
            f"gives FT's answer on only {agreement:.2f} of them (FT is right on {dev['ft']:.3f}): it matches FT's "
            "score there, not its behaviour, and the agreement is what carries to test.")


def _fit_line(key: str, b: dict, reference: dict, fitting: bool) -> str:
    """One budget's fit line; ``fitting``: the trajectory ran the fit schedule (then only its cap, --steps, is
    left to raise)."""
    of = "" if reference.get("of") in (None, "fine-tuned") else f" ({reference['of']})"
    if b.get("share") is None:
        head = f"Fit at {_budget_label(key)}: region {b['region']:.3f} on the selection rows (no FT score there)"
    else:
        head = (f"Fit at {_budget_label(key)}: region {b['region']:.3f} vs FT{of} {b['ft']:.3f} on the {b['rows']} "
                f"selection rows → fit share {b['share']:.3f}")
    tail = ""
    apart = b.get("apart") or {}
    if all(apart.get(k, {}).get("ft") for k in ("dev", "train")):
        tail += "; " + ", ".join(f"{k} rows {apart[k]['region']:.3f} vs FT {apart[k]['ft']:.3f}"
                                 + (f" (agreement {apart[k]['agreement']:.2f})" if "agreement" in apart[k] else "")
                                 for k in ("dev", "train"))
    if b.get("test_share") is not None:
        tail += f"; test {b['test_share']:.3f} of FT"
        if b.get("carry") is not None:
            tail += f", carry {b['carry']:.2f}"
    where = f"; stopped at step {b['stopped_at']}" + (f": {b['why']}" if b.get("why") else "")
    if b.get("rising"):
        where += (", still rising: a higher cap (--steps) would fit more" if fitting else
                  ", still rising: more steps (--steps, or --schedule fit) would fit more")
    return head + tail + where + "."


def fit_markdown(section: dict | None) -> list[str]:
    """The section's lines for report.md (a bullet each), and the figure."""
    if not section:
        return []
    return ["**Fit** (*fit share* = the region's score ÷ FT's on the rows the region was chosen on; *carry* = share "
            "of FT on test ÷ fit share):", "", *[f"- {line.strip()}" for line in section["lines"]], "",
            "![fit share per scored step](fit.png)", ""]


def fit_plot(history: list[dict], reference: dict | None, path: Path) -> None:
    """Each budget's fit share (or score, without a reference) at every scored step of its trajectory."""
    if not history:
        return
    from skillgraft.lazy import plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = sorted({k.rsplit(":", 1)[0] for h in history for k in h if k.endswith(":acc")})
    ft = (reference or {}).get("score")
    for label in labels:
        pts = [(h["step"], h[label + ":acc"] / ft if ft else h[label + ":acc"]) for h in history
               if label + ":acc" in h and h.get("budget") in (None, label)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label)
    if ft:
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("localization step")
    ax.set_ylabel("fit share (region ÷ FT, selection rows)" if ft else "score on the selection rows")
    ax.legend(title="budget", fontsize=8)
    save_figure(fig, path)
