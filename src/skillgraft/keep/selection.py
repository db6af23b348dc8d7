"""The rows a keep target is chosen on: a user's ``--keep-data`` file, else the data's dev split (a k-shot draw: the
next K per label), else a seeded held-out slice of the localization rows (the localizer then learns on the rest);
never the report's test rows (a ``--keep-data`` row that is also a test row is refused). And, before any work, the
targets those rows can never confirm, whatever the graft (issue 50)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from skillgraft.lazy import np

from skillgraft.errors import SkillgraftError
from skillgraft.keep.spec import KeepSpec
from skillgraft.keep.stats.bound import rows_needed_betting


def selection_split(member, keep: KeepSpec | float = 0.2) -> tuple[list, object, str]:
    """(selection examples, the data the localizer learns on, a note saying which) for keep searches on ``member``
    (a :class:`~skillgraft.pipeline.member.Member`).

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
    :func:`~skillgraft.keep.stats.bound.agreement_bound`). None: no number of rows confirms it (τ = 1)."""
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
