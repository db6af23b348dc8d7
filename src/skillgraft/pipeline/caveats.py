"""Results that mean nothing, said so: one warning line each and a note in the report (docs/reliability.md §11).

* the fine-tuned model scores at or below chance on the held-out rows: *share of FT*, *gap closed* and a merge's
  *normalized* accuracy divide by noise (issue 36: "share of FT 1.050", "normalized 2.857");
* the fine-tuned model scores perfectly on its evaluation rows: it has most likely seen them (issue 80: rows held
  out of the --data it was fine-tuned on gave "mean acc 1.0000");
* the evaluation rows hold one label only: accuracy then measures agreement with that one class;
* most of the fine-tuning change lies outside the graftable body (the embeddings, say): no graft of the body can
  keep it, and FT's row counts parameters no region is drawn from (its density was 5.57e+01, unflagged; now
  capped at 1: FT is dense);
* a merge whose λ and grids are chosen on few dev rows per task (3, say): the choice is mostly noise.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable, Mapping

# a fine-tuned score this close above chance is chance (a few test rows move it by more)
CHANCE_MARGIN = 1e-9
FEW_DEV_ROWS = 30  # a merge's choices (λ, grids) on fewer dev rows per task are said to be noise
OUTSIDE_SHARE = 0.5  # warn when more than this share of ‖θ_ft − θ_pre‖² lies outside the graftable body


def chance_level(labels: Iterable[int], num_labels: int) -> tuple[float, str]:
    """The accuracy a model reaches without learning: the larger of 1/L and the majority label's share of
    ``labels`` (always predicting it), with words saying which."""
    counts = Counter(labels)
    n = sum(counts.values())
    uniform = 1.0 / num_labels if num_labels else 0.0
    majority = max(counts.values()) / n if n else 0.0
    if majority > uniform + CHANCE_MARGIN:
        return majority, f"the majority label's share of the test rows, {majority:.3f}"
    return uniform, f"1/{num_labels} = {uniform:.3f}"


def below_chance(accuracy: float | None, labels: list[int], num_labels: int, who: str, derived: str) -> str | None:
    """The caveat for a fine-tuned ``accuracy`` at or below chance on ``labels``, or None."""
    if accuracy is None or num_labels < 2 or not labels:
        return None
    level, words = chance_level(labels, num_labels)
    if accuracy > level + CHANCE_MARGIN:
        return None
    return (f"{who} scores {accuracy:.3f} on the held-out rows, at or below chance ({words}): it learned nothing "
            f"measurable there, so {derived} divide by noise and mean nothing")


def evaluation_source(member) -> str:
    """Where a member's evaluation rows came from, in words: said by every report, its JSON and the command line
    (issue 80: a fraction of --data held out silently made a fine-tune trained on that file score 1.000)."""
    n = len(member.test)
    note = getattr(getattr(member, "inputs", None), "data_note", "") or ""
    if "evaluated on " in note:
        return f"{n} rows: {note.split('evaluated on ', 1)[1]}"
    task = getattr(member, "task", None) or member.data.task.name
    return f"{n} rows of the {task} test split (registered task: rows no k-shot draw takes)"


def perfect_ft(score: float | None, source: str, who: str) -> str | None:
    """The caveat for a fine-tuned model scoring perfectly on its evaluation rows, or None: it has most likely seen
    them (held-out rows of the file it was trained on), and every share of FT then measures memorised rows."""
    if score is None or score < 1.0:
        return None
    held = " held out" in source
    return (f"{who} scores {score:.3f} on its evaluation rows ({source}): a perfect score usually means it was "
            "trained on them" + (" (the rows held out of --data are rows of the file it was fine-tuned on, if it "
                                 "was)" if held else "")
            + "; give --eval-data with rows it never saw, or its shares of FT measure memorised rows")


def one_label(labels: list[int], names: tuple[str, ...] | list[str], where: str) -> str | None:
    """The caveat for evaluation rows that all hold one label, or None."""
    distinct = set(labels)
    if len(labels) < 2 or len(distinct) != 1:
        return None
    (only,) = distinct
    name = names[only] if 0 <= only < len(names) else only
    return (f"{where}: all {len(labels)} evaluation rows hold one label ({name!r}): accuracy only measures "
            "agreement with that class, and ECE and agreement say little; evaluate on rows of every label")


def outside_body(member, graftable: str = "body") -> str | None:
    """The caveat when most of θ_ft − θ_pre (squared L2 mass, the body's tensors; carried heads left out) lies
    in tensors outside the graftable universe, or None. One pass over the tensors, rows at a time."""
    import math  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from skillgraft.graft.localizers.machinery.source import fine_tuned  # noqa: PLC0415
    from skillgraft.models.anatomy import graftable_names, is_carried  # noqa: PLC0415

    pre = member.pre
    if pre is None:
        return None
    params = {n: p for n, p in pre.named_parameters() if not is_carried(n, pre)}
    inside = set(graftable_names(pre, graftable))
    source = fine_tuned(member.ft, pre, list(params))
    # a lean pair's θ_pre is memory-mapped and must stay unread where the work never reads it (its embedding's
    # unused rows): its values come from its files here, as its fingerprint does
    files = member.inputs.pre_files if member.released else None
    pre_source = fine_tuned(files, pre, list(params)) if files is not None else None
    mass: dict[str, float] = {}
    with torch.no_grad():
        for name, p in params.items():
            shape = tuple(source.shape(name))
            row = math.prod(shape[1:]) if shape else 1
            step = max(1, (1 << 22) // max(1, row))  # about 4M values at a time: no tensor-sized copy
            total = 0.0
            for start in range(0, shape[0] if shape else 1, step):
                block = (source.rows(name, start, start + step) if shape else source.rows(name)).reshape(-1)
                if pre_source is not None:
                    ref = (pre_source.rows(name, start, start + step) if shape else pre_source.rows(name)).reshape(-1)
                else:
                    ref = p.detach().reshape(-1)[start * row:start * row + block.numel()]
                total += float(((block.to(ref.device, torch.float64) - ref.double()) ** 2).sum())
            mass[name] = total
    whole = sum(mass.values())
    outside = {n: m for n, m in mass.items() if n not in inside}
    share = sum(outside.values()) / whole if whole > 0 else 0.0
    if share <= OUTSIDE_SHARE:
        return None
    top = max(outside, key=outside.get)
    return (f"{share:.0%} of the fine-tuning change (‖θ_ft − θ_pre‖²) lies outside the graftable body ({graftable}), "
            f"most in {top}: no graft of the body can keep it, and the fine-tuned row's parameter count includes "
            "parameters no region is drawn from")


def warned(caveats: Iterable[str | None]) -> list[str]:
    """The caveats that apply, each also one warning line (the CLI prints ``warning: …``)."""
    out = [c for c in caveats if c]
    for c in out:
        warnings.warn(c, stacklevel=2)
    return out


def graft_caveats(member, rows: list[Mapping], graftable: str = "body") -> list[str]:
    """The caveats of a grafting report (warned once each)."""
    ft = next((r for r in rows if r["kind"] == "ft"), None)
    labels = [e.label for e in member.test]
    task = member.data.task
    num_labels = getattr(task, "num_labels", 0) or 0
    accuracy = (ft.get("accuracy") if ft is not None else None) if num_labels else None
    return warned([
        below_chance(accuracy, labels, num_labels, "the fine-tuned model", "share of FT and gap closed"),
        perfect_ft(ft.get("score") if ft is not None and num_labels else None, evaluation_source(member),
                   "the fine-tuned model"),
        one_label(labels, tuple(task.labels), f"{task.name} test") if num_labels else None,
        outside_body(member, graftable),
    ])


def caveat_markdown(caveats: list[str] | None) -> list[str]:
    """The report's note: a section listing the caveats (nothing when there are none)."""
    if not caveats:
        return []
    return ["## Caveats: results that may mean nothing", "", *[f"- **warning:** {c}" for c in caveats], ""]


def few_dev_rows(members: Mapping) -> str | None:
    """The caveat when a merge chooses λ and its grids on fewer than :data:`FEW_DEV_ROWS` dev rows of a task (one
    row then moves that task's dev accuracy by more than 3 points), or None."""
    dev = {name: len(getattr(member.data, "dev", None) or []) for name, member in members.items()
           if getattr(member.data, "dev", None) is not None}
    few = {name: n for name, n in dev.items() if n < FEW_DEV_ROWS}
    if not few:
        return None
    shown = ", ".join(f"{n}: {k}" for n, k in few.items())
    return (f"the stitch's λ and mergekit's grids are chosen on few dev rows ({shown}): one row moves a task's dev "
            f"accuracy by 1/{min(few.values())}, so these choices are mostly noise; give --dev-data with more rows "
            f"(≥ {FEW_DEV_ROWS} per task) or a larger --dev-fraction")


def merge_caveats(members: Mapping, ft_test: Mapping[str, float]) -> list[str]:
    """The caveats of a merge (warned once each): per task, its own fine-tuned model at or below chance (each
    method's *normalized* accuracy divides by it) and test rows of one label; choices made on few dev rows."""
    out: list[str | None] = [few_dev_rows(members)]
    for name, member in members.items():
        task = member.data.task
        num_labels = getattr(task, "num_labels", 0) or 0
        if not num_labels:
            continue
        labels = [e.label for e in member.test]
        accuracy = ft_test.get(name) if getattr(task, "metric", "accuracy") == "accuracy" else None
        out += [below_chance(accuracy, labels, num_labels, f"task {name}: its fine-tuned model",
                             "every method's normalized accuracy on it and the means"),
                perfect_ft(ft_test.get(name), evaluation_source(member), f"task {name}: its fine-tuned model"),
                one_label(labels, tuple(task.labels), f"task {name} test")]
    return warned(out)
