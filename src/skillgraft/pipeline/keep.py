"""Keep targets in a grafting report (``skillgraft graft --keep 0.95,0.99``): the smallest graft keeping each share.

The selection split is a user's ``--keep-data`` file, else the data's dev split (a k-shot draw: the next K per label),
else a seeded held-out slice of the localization rows (the localizer then learns on the rest); the report's test rows
are never used to choose (a ``--keep-data`` row that is also a test row is refused). A size counts as reaching a target
when the lower confidence bound of its share (``--keep-confidence``) does. The search (:mod:`skillgraft.graft.keep`)
runs on the chosen localizer's nested family; the found regions are stored (keyed by the member, the localizer and its
options, the targets and the split) and scored on the test rows beside every other variant.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from skillgraft.lazy import np

from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.rows import Row
from skillgraft.graft.bound import KEEP_BOUND, bound_prose
from skillgraft.graft.keep import LEARNED_ORDER, KeepResult, KeepSpec
from skillgraft.graft.localizers import get_localizer
from skillgraft.graft.region import Region
from skillgraft.graft.selection import Budget
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.variants import Variant, graft_variant
from skillgraft.spec import Spec
from skillgraft.untrusted import inside


@dataclass
class KeepTarget(Row):
    """One keep target's search as a report writes it (:meth:`KeepResult.to_dict`'s columns); ``test_score`` and
    ``test_share`` are columns once the report's rows scored it (``tested``), ``selection`` once a routed merge
    names its split."""

    target: float
    reached: bool
    size: int | None
    density: float | None
    selection_share: float | None
    confidence: float | None
    bound: float | None
    selection_rows: int | None
    point_size: int | None
    rows_needed: int | None
    note: str
    best_size: int
    best_share: float
    universe: int
    probes: list
    probe_count: int
    search_seconds: float
    kind: str = "share"
    bound_method: str | None = None
    next_size: int | None = None
    next_rows: int | None = None
    test_score: float | None = None
    test_share: float | None = None
    tested: bool = False            # not a column: whether test_score / test_share are
    selection: str | None = None    # a routed merge's selection split (a column when set)

    @classmethod
    def of(cls, r: KeepResult) -> KeepTarget:
        return cls.from_columns(r.to_dict())

    @classmethod
    def from_columns(cls, c) -> KeepTarget:
        """The row of written (or stored) columns."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "tested"]
        return cls(**{n: c[n] for n in names if n in c}, tested="test_score" in c)

    def columns(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)[:_SEARCHED]}
        if self.tested:
            out |= {"test_score": self.test_score, "test_share": self.test_share}
        if self.selection is not None:
            out["selection"] = self.selection
        return out

    @property
    def label(self) -> str:
        return keep_label(self.target, self.kind)

    @property
    def shown_size(self) -> int:
        """The size found, or the best probed one when the target is not reached."""
        return self.size if self.reached else self.best_size


_SEARCHED = 21  # KeepTarget's fields that are KeepResult.to_dict's columns (target … next_rows)


@dataclass
class KeepSummary(Row):
    """A keep search's summary (the store's summary.json, metrics.json's ``keep``): the selection split, its rows,
    the confidence, the seconds it took and one :class:`KeepTarget` per target."""

    selection: str
    selection_n: int
    confidence: float | None
    seconds: float
    targets: list[KeepTarget] = field(default_factory=list)

    @classmethod
    def from_columns(cls, c) -> KeepSummary:
        return cls(c["selection"], c["selection_n"], c["confidence"], c["seconds"],
                   [KeepTarget.from_columns(t) for t in c["targets"]])

    def columns(self) -> dict:
        return {"selection": self.selection, "selection_n": self.selection_n, "confidence": self.confidence,
                "seconds": self.seconds, "targets": self.targets}


def selection_split(member: Member, keep: KeepSpec | float = 0.2) -> tuple[list, object, str]:
    """(selection examples, the data the localizer learns on, a note saying which) for keep searches.

    ``keep``: the keep spec (its ``keep_data`` file, else its ``keep_holdout``), or a hold-out fraction."""
    spec = keep if isinstance(keep, KeepSpec) else KeepSpec(keep_holdout=keep)
    data = member.data
    if spec.keep_data is not None:
        user = member.inputs.graft_metadata.user_data or {}  # a pair's generative data: its prompt, completion fields
        fields = (user.get("prompt_field") or "prompt", user.get("completion_field") or "completion")
        selection = read_keep_data(spec.keep_data, data.task, member.test, labels=bool(spec.keep), fields=fields)
        bare = sum(ex.text_b is None for ex in selection if data.task.kind == "generative")
        greedy = (f"; {bare} prompts without a completion take FT's greedy one (at most {spec.keep_new_tokens} new "
                  "tokens) as the reference" if bare else "")
        note = (f"{spec.keep_data} ({len(selection)} rows, --keep-data; none of them a test row{greedy}); the "
                "localizer learned on all its rows")
        return selection, data, note
    if data.dev:
        note = f"the dev split ({len(data.dev)} rows, distinct from the {len(member.test)} test rows)"
        return list(data.dev), data, note
    rows = list(data.train)
    n = max(1, round(spec.keep_holdout * len(rows)))
    if len(rows) - n < 1:
        raise SkillgraftError(f"a keep target needs a selection split: the data has no dev split and only {len(rows)} "
                              "localization row(s) to hold some out from (pass --keep-data)")
    order = np.random.RandomState(0).permutation(len(rows))
    selection = [rows[i] for i in sorted(order[:n])]
    rest = [rows[i] for i in sorted(order[n:])]
    note = (f"a seeded held-out slice of {n} of the {len(rows)} localization rows (no dev split); the localizer "
            f"learned on the other {len(rest)}")
    return selection, dataclasses.replace(data, train=rest, dev=[]), note


def read_keep_data(path: Path, task, test: list, labels: bool = True,
                   fields: tuple[str, str] = ("prompt", "completion")) -> list:
    """The rows of a ``--keep-data`` file (the task's layout); refused if empty or sharing a test row. ``labels``
    False (only ``--keep-agreement`` targets): a ``.jsonl`` file's rows may leave ``label`` out (their labels are
    never read: agreement compares the graft with FT's predictions). Generative data: rows of a prompt and
    optionally a completion (``fields``); a prompt alone (``text_b`` None, FT's greedy completion to come:
    :func:`with_completions`) only without ``labels``."""
    from skillgraft.data.loading import Example, checked_text, read_file  # noqa: PLC0415
    from skillgraft.data.sources import jsonl_rows  # noqa: PLC0415

    from skillgraft.untrusted import no_such, regular  # noqa: PLC0415

    path = Path(path)
    regular(path, "a --keep-data file")  # a FIFO or device was "no such file"
    if not path.is_file():
        raise no_such(path, "--keep-data file")
    if task.kind == "generative":
        rows = _prompt_rows(path, task, labels, fields)
    elif not labels and path.suffix == ".jsonl":
        raw = jsonl_rows(path)
        if raw and all("label" not in r for _, r in raw):
            pair = "text_a" in raw[0][1]
            # each text checked as the labelled reader checks it (a missing field or a non-string, the line named)
            rows = [Example(checked_text(r.get("text_a"), where, "text_a"), 0,
                            checked_text(r.get("text_b"), where, "text_b")) if pair
                    else Example(checked_text(r.get("text"), where, "text"), 0) for where, r in raw]
        else:
            rows = read_file(task, path)
    else:
        rows = read_file(task, path)
    if not rows:
        raise SkillgraftError(f"--keep-data {path}: no rows")
    key = (lambda ex: ex.text_a) if task.kind == "generative" else (lambda ex: (ex.text_a, ex.text_b))  # a prompt
    tested = {key(ex) for ex in test}
    shared = sum(key(ex) in tested for ex in rows)
    if shared:
        raise SkillgraftError(f"--keep-data {path}: {shared} of its {len(rows)} rows are test rows; a keep target "
                              "is chosen on rows the report does not score")
    return rows


def _prompt_rows(path: Path, task, labels: bool, fields: tuple[str, str]) -> list:
    """A generative ``--keep-data`` file's rows: each prompt, and its completion or None (:func:`read_keep_data`)."""
    from skillgraft.data.loading import Example  # noqa: PLC0415
    from skillgraft.data.user import read_prompts  # noqa: PLC0415

    rows = []
    for where, prompt, completion in read_prompts(path, *fields):
        if labels and completion is None:
            raise SkillgraftError(f"{where}: field {fields[1]!r} is missing: --keep (a share of FT's score) needs each "
                                  "row's completion; give it, or ask only --keep-agreement (then FT's greedy "
                                  "completion of a prompt is its reference)")
        if labels and task.labels and completion not in task.labels:
            raise SkillgraftError(f"{where}: completion {completion[:60]!r} is not one of the task's completions "
                                  f"{list(task.labels)[:6]}")
        rows.append(Example(prompt, task.labels.index(completion) if completion in task.labels else 0, completion))
    return rows


def with_completions(ft, rows: list, new_tokens: int) -> list:
    """``rows`` with each missing completion (a generative ``--keep-data`` prompt alone) replaced by FT's greedy
    completion of at most ``new_tokens`` tokens: the reference its agreement is teacher-forced on."""
    bare = [i for i, ex in enumerate(rows) if ex.text_b is None]
    if not bare or getattr(ft, "mode", None) != "generative":
        return rows
    from skillgraft.evaluate.generative import greedy_completions  # noqa: PLC0415

    rows = list(rows)
    for i, text in zip(bare, greedy_completions(ft, [rows[i].text_a for i in bare], max_new_tokens=new_tokens)):
        rows[i] = dataclasses.replace(rows[i], text_b=text)
    return rows


def rows_to_confirm(target: float, confidence: float) -> int | None:
    """The fewest selection rows FT must get right before accuracy's exact bound can confirm ``target`` for any
    graft: one right on all n of them has the lower bound ((1 − confidence)/2)^(1/n) (the search's per-stage level,
    :func:`~skillgraft.graft.bound.agreement_bound`). None: no number of rows confirms it (τ = 1)."""
    if target >= 1:
        return None
    return max(1, math.ceil(math.log((1 - confidence) / 2) / math.log(target) - 1e-9))


def check_keep_rows(keep: KeepSpec, task, rows: int, where: str, *, right: int | None = None,
                    more: str = "--keep-data FILE") -> None:
    """Refuse keep targets the selection rows cannot confirm, whatever the graft (accuracy's exact bound, and the
    betting bound of open-ended generative agreement targets; F1's bootstrap and open-ended scores are not checked):
    before any work with ``rows`` (FT right on all of them at best), and again with ``right``, the rows FT gets right,
    once FT is scored. Else a keep target that nothing can reach is written as a "graft" of the best size probed — up to
    every parameter (issue 50)."""
    open_ended = getattr(task, "kind", "") == "generative" and not task.labels
    if keep.keep_agreement and right is None and open_ended:
        _check_token_agreement_rows(keep, rows, where)
    elif keep.keep_agreement and right is None:  # agreement per row: the same exact bound as --keep's, FT's labels unread
        _check_row_agreement_rows(keep, rows, where, more)
    if not keep.keep or getattr(task, "kind", "") == "generative" or getattr(task, "metric", "accuracy") != "accuracy":
        return
    if right is not None and getattr(keep, "keep_bound", "exact") != "exact":
        return  # once FT is scored, the paired bound also counts the graft's wins on FT's wrong rows: no fixed count
    # before FT is scored (FT right on every row at best) a graft can at best agree with FT: both bounds are then
    # Clopper-Pearson's, so the same count is needed whichever bound runs
    conf = keep.keep_confidence
    for target in keep.keep:
        need = rows_to_confirm(target, conf)
        if need is None:
            raise SkillgraftError(f"--keep {target:g}: a share of 1 can never be confirmed by a lower confidence "
                                  "bound on finitely many rows (accuracy's exact bound); ask for less, e.g. 0.99")
        have = rows if right is None else right
        if have >= need:
            continue
        what = (f"the selection split ({where}) has {rows} rows" if right is None else
                f"FT is right on only {right} of the {rows} rows of the selection split ({where})")
        enough = need if right is None else math.ceil(need * rows / max(right, 1))
        raise SkillgraftError(
            f"--keep {target:g} cannot be confirmed: {what}, and at --keep-confidence {conf:g} even a graft agreeing "
            f"with FT on every row FT gets right needs {need} such rows; give {more} with about {enough} labelled "
            "rows (or more), a lower --keep-confidence, or a lower target")


def rows_to_confirm_mean(target: float, confidence: float) -> int | None:
    """The fewest selection rows on which the betting bound (open-ended generative agreement) can confirm
    ``target`` at the search's per-stage level, even for a graft agreeing with FT on every completion token. None:
    no number of rows confirms it (τ = 1)."""
    from skillgraft.graft.bound import rows_needed_betting  # noqa: PLC0415

    return None if target >= 1 else rows_needed_betting(np.ones(1), target, 1 - (1 - confidence) / 2)


def _check_row_agreement_rows(keep: KeepSpec, rows: int, where: str, more: str) -> None:
    """``--keep-agreement`` targets on rows (a label or a completion each): the checks ``--keep`` has — a target of 1
    never confirmed, and enough selection rows for the exact bound even if the graft agrees with FT on all of them
    (before: a one-row selection file was taken, and a target of 1 answered with a density-1.0 "graft")."""
    _check_agreement_rows(keep, rows, where, rows_to_confirm, "row", f"give {more} with about {{need}} rows (or more; "
                          "their labels are not read)")


def _check_token_agreement_rows(keep: KeepSpec, rows: int, where: str) -> None:
    _check_agreement_rows(keep, rows, where, rows_to_confirm_mean, "completion token", "rows (the betting bound); give "
                          "more rows (a dev split or a larger --keep-holdout)", needs_rows=True)


def _check_agreement_rows(keep: KeepSpec, rows: int, where: str, rows_needed, unit: str, more: str, *,
                          needs_rows: bool = False) -> None:
    """Each ``--keep-agreement`` target: confirmable at all (not 1), and with enough selection rows (``rows_needed``:
    the exact bound per row, or the betting bound per completion token) even if the graft agrees everywhere."""
    conf = keep.keep_confidence
    for target in keep.keep_agreement:
        need = rows_needed(target, conf)
        if need is None:
            raise SkillgraftError(f"--keep-agreement {target:g}: an agreement of 1 can never be confirmed by a lower "
                                  "confidence bound on finitely many rows; ask for less, e.g. 0.99")
        if rows < need:
            fix = more.replace("{need}", str(need))
            raise SkillgraftError(
                f"--keep-agreement {target:g} cannot be confirmed: the selection split ({where}) has {rows} rows, and "
                f"at --keep-confidence {conf:g} even a graft agreeing with FT on every {unit} needs {need}"
                f"{' ' if needs_rows else '; '}{fix}, a lower --keep-confidence, or a lower target")


def keep_identity(keep: KeepSpec) -> dict:
    """The keep spec's part of a store key: its settings, the bound's method, and the --keep-data file's content."""
    out = {"keep": keep.to_dict(), "bound": KEEP_BOUND}
    if keep.keep_data is not None and Path(keep.keep_data).is_file():
        out["keep_data"] = hashlib.sha256(Path(keep.keep_data).read_bytes()).hexdigest()
    return out


def keep_label(target: float, kind: str = "share") -> str:
    return f"keep {target:g}" if kind == "share" else f"keep-agreement {target:g}"


def target_key(t: KeepTarget) -> str:
    """A stored target's file name part: ``0.95``, or ``agreement-0.95`` for an agreement target."""
    return repr(t.target) if t.kind == "share" else f"agreement-{t.target!r}"


def keep_results(member: Member, store, localizer: str, options: Spec, keep: KeepSpec, *,
                 progress: bool = False) -> tuple[dict[str, Region], KeepSummary]:
    """Regions found for each keep target and the search's summary (stored: a re-run only re-scores)."""
    loc = get_localizer(localizer)
    options = loc.options(options)
    key = {"setup": member.identity(), "localizer": localizer, "options": options.to_dict(), **keep_identity(keep),
           "learned_order": LEARNED_ORDER}
    holder: dict = {}

    def make(folder: Path) -> None:
        from skillgraft.graft.keep import selection_outcome  # noqa: PLC0415

        selection, data, note = selection_split(member, keep)
        check_keep_rows(keep, member.data.task, len(selection), note.split(" (")[0])
        selection = with_completions(member.ft, selection, keep.keep_new_tokens)
        ft = selection_outcome(member.ft, selection)
        if ft.pred is not None:  # FT's right rows are what the exact bound counts
            check_keep_rows(keep, member.data.task, len(selection), note.split(" (")[0],
                            right=int((ft.pred == ft.labels).sum()))
        t0 = time.perf_counter()
        results = loc.keep(member.pre, member.ft, data, keep, options, selection=selection, progress=progress)
        summary = KeepSummary(note, len(selection), keep.keep_confidence, time.perf_counter() - t0,
                              [KeepTarget.of(r) for r in results])
        for r in results:
            r.region.save(folder / f"keep-{r.key}")
        write_json(folder / "summary.json", summary)
        holder["regions"] = {r.key: r.region for r in results}

    entry = store.fetch("keep", key, make, label=f"{member.task}-{member.k}-{member.seed}-{localizer}-keep")
    path = entry / "summary.json"
    summary = read_json(path, required=("targets",), what="stored keep summary")
    if not isinstance(summary["targets"], list) or not all(isinstance(t, dict) and type(t.get("target")) in (int, float)
                                                           for t in summary["targets"]):
        raise SkillgraftError(f"{path}: field 'targets' must be a list of keep results, each with its 'target' share")
    summary = KeepSummary.from_columns(summary)
    regions = holder.get("regions") or {target_key(t): Region.load(inside(entry, f"keep-{target_key(t)}", path,
                                                                          f"targets.{i}.target"))
                                        for i, t in enumerate(summary.targets)}
    return regions, summary


def keep_variants(member: Member, store, localizer: str, options: Spec, keep: KeepSpec, *,
                  progress: bool = False) -> tuple[list[Variant], KeepSummary]:
    """One graft variant per keep target (named ``keep 0.95``), and the search's summary."""
    regions, summary = keep_results(member, store, localizer, options, keep, progress=progress)
    variants = []
    for t in summary.targets:
        region = regions[target_key(t)]
        meta = {"localizer": localizer, "keep": t.target, "keep_kind": t.kind, "selection": summary.selection}
        variants.append(graft_variant(member, region, Budget.parse(max(1, len(region))), meta, name=t.label,
                                      kind="keep"))
    return variants, summary


def keep_section(summary: KeepSummary, rows: list) -> KeepSummary:
    """The keep summary with each target's test score and share of FT (from the report's rows)."""
    by_name = {r.model: r for r in rows}
    targets = []
    for t in summary.targets:
        row = by_name.get(t.label)
        targets.append(dataclasses.replace(t, tested=True, test_score=row.score if row else None,
                                           test_share=row.share_of_ft if row else None))
    return dataclasses.replace(summary, targets=targets)


def keep_line(t: KeepTarget | dict) -> str:
    """One console line (rich markup) for a keep target of :func:`keep_section` (or its written columns, as a
    routed merge's summary holds them): size, shares, bound, cost, note."""
    from rich.markup import escape  # noqa: PLC0415

    t = t if isinstance(t, KeepTarget) else KeepTarget.from_columns(t)
    size = t.shown_size
    head = (f"{t.label}: {size:,} params ({size / t.universe:.2e})" if t.reached else
            f"{t.label}: [yellow]not reached[/] by any size; best {t.best_share:.3f} at {size:,}")
    method = f", {t.bound_method} bound" if t.bound_method else ""
    bound = ("" if t.bound is None else
             f", {t.confidence:.0%} lower bound {t.bound:.3f} on {t.selection_rows} rows{method}")
    agree = t.kind == "agreement"
    test = ("" if t.test_share is None or agree else f", test share {t.test_share:.3f}")
    note = f"\n  {escape(t.note)}" if t.note else ""
    what = "agreement with FT" if agree else "selection share"
    return (f"{head}, {what} {t.selection_share or t.best_share:.3f}{bound}{test} "
            f"| {t.probe_count} probes, {t.search_seconds:.0f} s{note}")


def keep_markdown(section: KeepSummary) -> list[str]:
    """Report lines: per target the size found, its selection share, bound and test share, and what the search cost."""
    conf = section.confidence
    lines = ["", "## Keep targets", "",
             f"Selection split: {section.selection}. Each target's region is the smallest probed size of the "
             "localizer's nested family whose share of FT's selection score reaches the target "
             + (f"{bound_prose(conf)}." if conf is not None else
                "(point estimate; galloping ×4, then bisection on a log scale)."), "",
             "| target | reached | size | density | selection share | lower bound | test share | point-estimate size "
             "| probes | search s |",
             "|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for t in section.targets:
        size = t.shown_size
        sel = t.selection_share if t.reached else t.best_share
        test = "-" if t.test_share is None else f"{t.test_share:.3f}"
        bound = "-" if t.bound is None else f"{t.bound:.3f}"
        point = "-" if t.point_size is None else f"{t.point_size:,}"
        reached = "yes" if t.reached else "**no** (best reached shown)"
        name = f"{t.target:g}" if t.kind == "share" else f"agreement {t.target:g}"
        lines.append(f"| {name} | {reached} | {size:,} | {size / t.universe:.2e} | {sel:.3f} | {bound} | "
                     f"{test} | {point} | {t.probe_count} | {t.search_seconds:.0f} |")
        if t.note:
            notes.append(f"- {t.label}: {t.note}.")
    methods = sorted({t.bound_method for t in section.targets if t.bound_method})
    if methods:
        from skillgraft.graft.bound import BOUND_NAMES  # noqa: PLC0415

        notes.insert(0, "- Bound: " + "; ".join(f"`{m}` — {BOUND_NAMES[m]}" for m in methods) + ".")
    return lines + ([""] + notes if notes else [])


def keep_graft(member: Member, store, localizer: str, options: Spec, keep: KeepSpec, meta: dict | None = None, *,
               progress: bool = False) -> tuple[object, KeepTarget]:
    """The graft of ``keep``'s one target (``skillgraft merge --routed --keep τ``): the region :func:`keep_results`
    finds on the same selection split as ``skillgraft graft --keep`` (the member's dev rows, never its test rows),
    θ_pre + γ ⊙ (θ_ft − θ_pre) on it, and that target's search result (with the selection note). Needs θ_ft
    loaded."""
    from skillgraft.graft.graft import Graft  # noqa: PLC0415

    regions, summary = keep_results(member, store, localizer, options, keep, progress=progress)
    (target,) = summary.targets
    region = regions[target_key(target)]
    meta = {"task": member.task, "mode": member.pre.mode, "localizer": localizer, "keep": target.target,
            "keep_confidence": summary.confidence, **(meta or {})}
    return Graft.from_models(member.pre, member.ft, region, meta), dataclasses.replace(target,
                                                                                     selection=summary.selection)
