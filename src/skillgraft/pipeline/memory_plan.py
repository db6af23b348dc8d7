"""The memory plan of a verb, made before any work (docs/scale.md): the estimate per phase from the checkpoint's
config and safetensors headers (:mod:`skillgraft.models.memory`), the choices it makes (``--candidates auto``, and
the lean path by default when the dense localizer would not fit), and the one line that refuses a run that fits in
no way it was asked for, naming the options that would fit.

The choices resolve the localizer's options *before* any store key is made: ``candidates='auto'`` becomes a
number (or None: dense), so a dense run that fits keeps its key, and a lean one is keyed by its own ``c``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

from skillgraft.errors import SkillgraftError
from skillgraft.models.memory import (GB, MemoryPlan, ModelShape, Phase, Term, Work, baseline_terms, fim_terms,
                                      finetune_terms, free_memory, inference_terms, localization_terms, shape_of)
from skillgraft.spec import MAX_LENGTH, Spec

LEAN_C = 1e-2  # the candidate fraction the plan picks (at least sparsity and every fractional budget)
PLAN_ENV = "SKILLGRAFT_MEMORY_PLAN"  # "off": no plan (the run goes ahead as asked)


def _runtime(rt=None) -> tuple[str, int, int]:
    """(device, bytes per weight, bytes per activation value) of the run's placement ``rt`` (passed down from its
    verb; None: the active one), fp32 on the CPU without one."""
    if rt is None:
        from skillgraft.models.placement import active  # noqa: PLC0415

        rt = active()
    device = "cpu" if rt is None else str(rt.device)
    precision = "fp32" if rt is None else rt.precision
    return device, 2 if precision == "bf16" else 4, 2 if precision in ("bf16", "bf16-mixed") else 4


def _lean_c(options: Spec) -> float:
    fractions = [b.fraction for b in getattr(options, "budgets", None) or [] if getattr(b, "fraction", None)]
    return max([LEAN_C, getattr(options, "sparsity", 0.0), *fractions])


def graft_phases(shape: ModelShape, options: Spec, *, localizer: str, baselines: list[str], lottery_backup: bool,
                 lean: bool, tokens: int, weight_bytes: int, compute_bytes: int) -> list[Phase]:
    """``skillgraft graft``'s phases: FT scored (θ_ft alone on a lean pair), the localization, the report's rows."""
    work = Work(getattr(options, "micro_batch", 64), tokens, bool(getattr(options, "gradient_checkpointing", False)),
                compute_bytes)
    d = weight_bytes
    pre_term = inference_terms(shape, weight_bytes=d, work=work, what="θ_pre")[0]
    ft_term = inference_terms(shape, weight_bytes=d, work=work, what="θ_ft")[0]
    scoring = inference_terms(shape, weight_bytes=d, work=work)
    phases = [Phase("FT scored", scoring if lean else [pre_term, *scoring])]
    if d > shape.stored_bytes:  # a bf16 checkpoint upcast to fp32: its stored copy is read beside the fp32 one
        upcast = Term("stored copy while upcasting", shape.params * shape.stored_bytes,
                      f"{shape.params:,} × {shape.stored_bytes} B (measured at 1B: load peak 6.24 GB = 4.14 + 2.07)")
        phases[0].terms.append(upcast)
        phases.append(Phase("θ_pre loaded", [pre_term, upcast, *([] if lean else [ft_term])]))
    if "candidates" in type(options).model_fields:
        c = options.candidates
        phases.append(Phase("localization", localization_terms(
            shape, weight_bytes=d, candidates=None if c in (None, 1.0) else float(c), work=work, ft_resident=not lean)))
    else:  # a score-based localizer: its score over the body, as the baselines'
        phases.append(Phase("localization", [pre_term, *([] if lean else [ft_term]),
                                             *baseline_terms(shape, [localizer], d, False)]))
    rows = [pre_term, *([] if lean else [ft_term]), *scoring[1:],
            *baseline_terms(shape, baselines, d, lottery_backup)]
    phases.append(Phase("report rows", rows))
    return phases


def plan_localization(verb: str, folder: str | os.PathLike | None, options: Spec, *, localizer: str = "learned",
                      baselines: list[str] = (), lottery_backup: bool = False, lean: bool = True,
                      max_length: int = MAX_LENGTH, shape: ModelShape | None = None,
                      runtime=None) -> tuple[Spec, MemoryPlan | None]:
    """The plan of a verb that localizes (graft, sweep, merge), and ``options`` with its choices made.

    ``candidates='auto'`` (and, when the user set no ``candidates``, a dense run that would not fit) takes the lean
    path: c = max(10⁻², sparsity, the fractional budgets), then gradient checkpointing when that is still too much
    (unless set). When nothing asked for fits, one line names the estimate, what is free and the options that would
    fit. No plan (None) for a checkpoint without local safetensors, or with ``$SKILLGRAFT_MEMORY_PLAN=off``: then
    ``auto`` is dense."""
    shape = shape or (shape_of(folder) if folder is not None else None)
    fields = type(options).model_fields
    has_c = "candidates" in fields
    if shape is None or os.environ.get(PLAN_ENV, "").lower() == "off":
        if has_c and options.candidates == "auto":
            options = options.replace(candidates=None)
        return options, None
    device, d, act = _runtime(runtime)
    free = free_memory(device)

    def make(opts: Spec) -> MemoryPlan:
        return MemoryPlan(verb, device, graft_phases(shape, opts, localizer=localizer, baselines=list(baselines),
                                                     lottery_backup=lottery_backup, lean=lean, tokens=max_length,
                                                     weight_bytes=d, compute_bytes=act), free, shape=shape)

    given = options.given() if hasattr(options, "given") else {}
    choices = []
    if has_c and (options.candidates == "auto" or ("candidates" not in given and options.candidates is None)):
        asked_auto = options.candidates == "auto"
        dense = options.replace(candidates=None)
        if make(dense).fits:
            options = dense
        else:
            c = _lean_c(options)
            lean_opts = options.replace(candidates=c)
            why = f"the dense localizer needs ≈ {make(dense).estimate / GB:.1f} GB, {free.bytes / GB:.1f} GB free"
            if not make(lean_opts).fits and "gradient_checkpointing" in fields and "gradient_checkpointing" not in given:
                lean_opts = lean_opts.replace(gradient_checkpointing=True)
                choices.append(f"--candidates {'auto' if asked_auto else '(default)'} → {c:g} with "
                               f"--gradient-checkpointing ({why}).")
            else:
                choices.append(f"--candidates {'auto' if asked_auto else '(default)'} → {c:g} ({why}).")
            options = lean_opts
    plan = make(options)
    plan.choices = choices
    if not plan.fits:
        raise SkillgraftError(refusal(plan, options, make, baselines=list(baselines), lottery_backup=lottery_backup,
                                      weight_bytes=d))
    for line in choices:
        warnings.warn(f"memory plan: {line}", stacklevel=2)
    return options, plan


def refusal(plan: MemoryPlan, options: Spec, make: Callable[[Spec], MemoryPlan], *, baselines: list[str],
            lottery_backup: bool, weight_bytes: int) -> str:
    """One line: the estimate, what is free, and the options (alone or together) whose plan fits."""
    fields = type(options).model_fields
    tries: list[tuple[str, Spec]] = []
    if "candidates" in fields and options.candidates in (None, 1.0):
        tries.append((f"--candidates {_lean_c(options):g}", options.replace(candidates=_lean_c(options))))
    if "gradient_checkpointing" in fields and not options.gradient_checkpointing:
        base = tries[-1] if tries else ("", options)
        tries.append(((base[0] + " --gradient-checkpointing").strip(), base[1].replace(gradient_checkpointing=True)))
    if "micro_batch" in fields:
        base = tries[-1] if tries else ("", options)
        mb = base[1].micro_batch
        while mb > 1:
            mb = max(1, mb // 2)
            if make(base[1].replace(micro_batch=mb)).fits:
                tries.append(((base[0] + f" --micro-batch {mb}").strip(), base[1].replace(micro_batch=mb)))
                break
    fit = [f"`{flags}` (≈ {make(opts).estimate / GB:.1f} GB)" for flags, opts in tries if make(opts).fits]
    extra = []
    if weight_bytes == 4:
        extra.append("--precision bf16 (half the weights)")
    if any(b in ("random", "movement", "ties-trim") for b in baselines) or lottery_backup:
        extra.append("--baselines '' --no-lottery-zero (their rows hold per-coordinate scores)")
    options_text = "; ".join(fit) if fit else "no --candidates / --gradient-checkpointing / --micro-batch setting"
    more = f"; also: {', '.join(extra)}" if extra else ""
    return (f"not enough memory: this {plan.verb} needs ≈ {plan.estimate / GB:.1f} GB at its peak ({plan.peak.name}) "
            f"on {plan.device}, {plan.free.bytes / GB:.1f} GB free ({plan.free.source}); would fit: {options_text}"
            f"{more} (or {PLAN_ENV}=off to run anyway)")


def plan_training(verb: str, folder: str | os.PathLike | None, *, micro_batch: int, max_length: int,
                  fisher: bool = False, runtime=None) -> MemoryPlan | None:
    """The plan of finetune (weights, gradients, Adam, activations) or fim (weights, one gradient, the Fisher
    accumulator); one line when it does not fit. None without a local safetensors checkpoint."""
    shape = shape_of(folder) if folder is not None else None
    if shape is None or os.environ.get(PLAN_ENV, "").lower() == "off":
        return None
    device, d, act = _runtime(runtime)
    work = Work(micro_batch, max_length, False, act)
    terms = (fim_terms(shape, weight_bytes=d, work=work) if fisher else
             finetune_terms(shape, weight_bytes=d, work=work, adam_bytes=2 * d))
    plan = MemoryPlan(verb, device, [Phase("training" if not fisher else "Fisher", terms)], free_memory(device),
                      shape=shape)
    if not plan.fits:
        smaller = [mb for mb in (micro_batch // 2, micro_batch // 4, 1) if mb >= 1 and mb < micro_batch]
        fit = []
        for mb in smaller:
            p = MemoryPlan(verb, device, [Phase("x", (fim_terms if fisher else finetune_terms)(
                shape, weight_bytes=d, work=Work(mb, max_length, False, act),
                **({} if fisher else {"adam_bytes": 2 * d})))], plan.free)
            if p.fits:
                fit.append(f"--micro-batch {mb} (≈ {p.estimate / GB:.1f} GB)")
                break
        if d == 4:
            fit.append("--precision bf16")
        raise SkillgraftError(f"not enough memory: this {verb} needs ≈ {plan.estimate / GB:.1f} GB on {device}, "
                              f"{plan.free.bytes / GB:.1f} GB free ({plan.free.source}); would fit: "
                              f"{'; '.join(fit) or 'nothing here'} (or {PLAN_ENV}=off to run anyway)")
    return plan


__all__ = ["LEAN_C", "PLAN_ENV", "graft_phases", "plan_localization", "plan_training", "refusal"]
