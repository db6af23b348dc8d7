"""Mapping one task's labels into another's label space by label NAME (for zero-shot OOD evaluation).

A mapping is declared per target label: ``{target_label: source_label}``, or ``None`` to drop the target
label's examples (e.g. QNLI → MNLI as entailment vs not: ``{entailment: entailment, contradiction:
not_entailment, neutral: not_entailment}``, or the paper's "MNLI (0/1)" with ``neutral: null``). Every target
label must be declared, every name must exist, and at least two source labels must be reached;
otherwise the pair cannot be mapped and is refused with a SkillgraftError.
"""

from __future__ import annotations

from skillgraft.data.loading import Example
from skillgraft.data.tasks import Task, get_task
from skillgraft.errors import SkillgraftError


def check_label_map(source: Task | str, target: Task | str, mapping: dict | None, where: str = "label map"
                    ) -> dict[str, str | None]:
    """Validate ``mapping`` (target label name → source label name or None); returns it with str keys.

    ``mapping=None`` is accepted only when both tasks have identical label names (identity mapping).
    """
    source, target = get_task(source), get_task(target)
    if mapping is None:
        if tuple(source.labels) != tuple(target.labels):
            raise SkillgraftError(
                f"{where}: {source.name} → {target.name}: the label names differ ({list(source.labels)} vs "
                f"{list(target.labels)}); declare a mapping of every {target.name} label to a {source.name} label")
        return {lab: lab for lab in target.labels}
    if not isinstance(mapping, dict):
        raise SkillgraftError(f"{where}: the label mapping must be a dict of {target.name} label → {source.name} "
                              f"label, got {type(mapping).__name__}")
    clean = {str(k): (None if v is None else str(v)) for k, v in mapping.items()}
    unknown = [k for k in clean if k not in target.labels]
    if unknown:
        raise SkillgraftError(f"{where}: {unknown} are not labels of {target.name} (its labels: {list(target.labels)})")
    missing = [lab for lab in target.labels if lab not in clean]
    if missing:
        raise SkillgraftError(f"{where}: {target.name} label(s) {missing} are not mapped; map each to a "
                              f"{source.name} label ({list(source.labels)}) or to null to drop it")
    bad = sorted({v for v in clean.values() if v is not None and v not in source.labels})
    if bad:
        raise SkillgraftError(f"{where}: {bad} are not labels of {source.name} (its labels: {list(source.labels)})")
    reached = {v for v in clean.values() if v is not None}
    if len(reached) < 2:
        raise SkillgraftError(f"{where}: {source.name} → {target.name} reaches only {sorted(reached)} of "
                              f"{source.name}'s labels; a zero-shot evaluation needs at least two")
    return clean


def map_examples(source: Task | str, target: Task | str, examples: list[Example], mapping: dict | None,
                 where: str = "label map") -> list[Example]:
    """``examples`` of ``target`` relabelled into ``source``'s label indices (dropped labels removed)."""
    source, target = get_task(source), get_task(target)
    if source.kind != target.kind:
        raise SkillgraftError(f"{where}: {source.name} is a {source.kind} task but {target.name} is a {target.kind} "
                              "task; their inputs cannot be transferred")
    clean = check_label_map(source, target, mapping, where)
    out = []
    for ex in examples:
        name = clean[target.labels[ex.label]]
        if name is not None:
            out.append(Example(ex.text_a, source.labels.index(name), ex.text_b))
    if not out:
        raise SkillgraftError(f"{where}: no {target.name} examples are left after mapping")
    return out
