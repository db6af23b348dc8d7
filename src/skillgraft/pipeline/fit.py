"""The fit section of a graft report (issue 74): did each learned region fit what it was asked to fit, and carry it?

    fit share = region's score on the selection rows ÷ FT's there        carry = (test score ÷ FT's) ÷ fit share

One line per budget — the region's and FT's score on the selection rows, the fit share, the test share and carry,
where the trajectory stopped and whether it was still rising — and one more where a graft keeps little of FT's gain
(it says so plainly, with what would: a larger budget, a keep target, or the fit schedule). The same lines go to
report.md, the command line and ``metrics.json`` / ``--json`` (``metrics["fit"]``); the trajectory of the fit share
per budget is ``fit.png``.
"""

from __future__ import annotations

from pathlib import Path

from skillgraft.graft.selection import Budget

LITTLE_GAIN = 0.25  # a graft closing less of the gap between its reference and FT "keeps little of FT's gain"


def _label(key: str) -> str:
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
                        "stopped_at": stop["step"] if stop else f.get("last_step"), "why": stop["why"] if stop else None}
        lines.append(_line(key, budgets[key], summary.get("reference") or {}, fitting))
        if gap is not None and gap < LITTLE_GAIN:
            lines.append(f"  The {_label(key)} graft keeps little of FT's gain (gap closed {gap:.2f}, fit share "
                         f"{share:.2f}): no region of this size that keeps the skill was found. A larger budget or a "
                         "keep target (--keep 0.9 finds the size that keeps 90 %) may"
                         + ("." if fitting else ", or --schedule fit."))
    return {"budgets": budgets, "reference": summary.get("reference"), "lines": lines}


def _line(key: str, b: dict, reference: dict, fitting: bool) -> str:
    """One budget's fit line; ``fitting``: the trajectory ran the fit schedule (then only its cap, --steps, is
    left to raise)."""
    of = "" if reference.get("of") in (None, "fine-tuned") else f" ({reference['of']})"
    if b.get("share") is None:
        head = f"Fit at {_label(key)}: region {b['region']:.3f} on the selection rows (no FT score there)"
    else:
        head = (f"Fit at {_label(key)}: region {b['region']:.3f} vs FT{of} {b['ft']:.3f} on the {b['rows']} selection "
                f"rows → fit share {b['share']:.3f}")
    tail = ""
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
    from skillgraft.evaluate.plots import save_figure  # noqa: PLC0415
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
