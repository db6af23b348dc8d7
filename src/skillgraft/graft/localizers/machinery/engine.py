"""The one engine of the learned localizers (paper Eq. 3–4): min over a mask m of L(θ_pre + m ⊙ Δ), Δ = θ_ft − θ_pre.

    θ(m) = θ_pre + m ⊙ Δ        ∂L/∂m = ∂L/∂θ ⊙ Δ        region = top-k of the relaxation's scores (or γ > 0.5)

What varies is a strategy each:

* the **relaxation** (:mod:`.relaxations`): how m is parametrised and scored — sigmoid (the paper's γ),
  straight-through, hard-concrete, the prune schedule;
* the **optimizer** on its parameters (:mod:`.optimizers`): sgd (the paper's), adam, nsgd;
* the **layout** (:mod:`.layouts`, :mod:`.candidates`): dense, candidate-restricted, or sharded under FSDP2;

and every scorer kind works, generative data included: the loss is the scorer's own (``batch_loss``: label
cross-entropy, or the completion tokens' for generative data) and a region's score its hits (``batch_hits``:
accuracy, or completion-token accuracy).

The engine owns everything else, once: lending θ_pre the fine-tuned task head, sharding, the step loop over
seeded mini-batches of micro-batches (lock-stepped across processes), the non-finite-loss stop before a
parameter moves, scoring each budget's region every ``eval_every`` steps on the selection split with a history
(accuracy, size, IoU with the last scored region), keeping the best step per budget, and restoring θ_pre bit-
exactly (weights, head, flags, grads, modes) in a ``finally`` — also on Ctrl-C.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from skillgraft.lazy import np
from skillgraft.lazy import torch
from skillgraft.progress import bar as tqdm

from skillgraft.data.loading import Example
from skillgraft.finite import FirstNonFinite
from skillgraft.graft.localizers.machinery.base import BudgetScore, Localization, ScoredStep
from skillgraft.graft.localizers.machinery.batches import RunRows, accuracy_on, batch_loss, by_length, micro_batches
from skillgraft.graft.localizers.machinery.candidates import Candidates
from skillgraft.graft.localizers.machinery.checkpointing import activation_checkpointing
from skillgraft.graft.localizers.machinery.fit import Schedule, fit_summary
from skillgraft.graft.localizers.machinery.layouts import Dense, Layout
from skillgraft.graft.localizers.machinery.lending import preserved
from skillgraft.graft.localizers.machinery.optimizers import Optimizer
from skillgraft.graft.localizers.machinery.relaxations import Relaxation
from skillgraft.graft.localizers.machinery.sharded import (Group, fsdp_requested, is_sharded, pieces, shard,
                                                           sum_gradients)
from skillgraft.graft.localizers.machinery.source import fine_tuned
from skillgraft.graft.region import Region
from skillgraft.graft.selection import Budget
from skillgraft.models.anatomy import carried_names, graftable_names
from skillgraft.models.compiled import compiled


@dataclass
class Plan:
    """One engine run: the strategies and the loop's settings (the localizers build it from their options)."""

    relaxation: Callable[[], Relaxation]   # a fresh relaxation per trajectory
    optimizer: str
    lr: float
    steps: int
    budgets: list[Budget]
    batch_size: int = 1024
    micro_batch: int = 64
    eval_every: int = 1
    last: bool = False                     # keep the last scored step (no selection)
    seed: int = 0
    graftable: str = "body"
    candidates: Callable[[int], int | None] | None = None  # |C| from |U| (None: dense when the relaxation allows)
    chosen: Region | None = None           # C itself (a Region chosen by another score)
    base: Region | None = None             # γ_base itself
    base_size: Callable[[int], int] | None = None  # |γ_base| from |U| (the top of the base score)
    base_per_budget: bool = False          # a trajectory per budget, γ_base the top of the budget's own size
    scores: dict[str, torch.Tensor] | None = None  # the base score per graftable coordinate (default |Δ|)
    gradient_checkpointing: bool = False
    compile: bool = False                  # torch.compile the transformer body for the run (models/compiled.py)
    config: dict = field(default_factory=dict)
    schedule: Schedule = field(default_factory=Schedule)  # when a trajectory stops (fixed steps, or by its fit)

    def one_budget_each(self, relax: Relaxation | None = None) -> bool:
        """Whether each budget has a trajectory of its own (the relaxation's top-k, or base_per_budget's γ_base)."""
        return (relax or self.relaxation()).per_budget or self.base_per_budget


def run(pre, ft, train: list[Example], select: list[Example], plan: Plan, *, accelerator=None,
        progress: bool = False, ranked: bool = False) -> Localization:
    """Learn the regions of ``plan.budgets`` (see the module doc); ``pre`` is the working model, restored on return.

    ``ft`` is the fine-tuned scorer or the folder it was saved to (read lazily). Under ``accelerate launch`` with
    an FSDP2 config, or with a ``fully_shard``-ed ``pre``, each process works on its own shards (``pre`` stays
    sharded afterwards; its values are restored). ``ranked``: also return the learned order (sigmoid only).
    """
    from skillgraft.models.placement import accelerator_for  # noqa: PLC0415

    accelerator = accelerator or accelerator_for(pre)  # θ_pre's own device: it is not moved
    names = graftable_names(pre, plan.graftable)
    carried = carried_names(pre)
    source = fine_tuned(ft, pre, names + [n for n in carried if n not in names])
    sharded = is_sharded(pre) or fsdp_requested(accelerator)
    group = Group(accelerator.num_processes, accelerator.process_index, sharded, accelerator.device)
    lean = sharded or plan.relaxation().absolute or plan.candidates is not None or plan.chosen is not None
    reference = None  # FT's own score on the selection rows: the fit share's denominator
    if select and not sharded and isinstance(ft, torch.nn.Module):
        reference = {"score": _own_accuracy(ft, select, plan.micro_batch), "of": "fine-tuned"}
    if sharded:
        if not is_sharded(pre):
            shard(pre, accelerator)
        sum_gradients(pre)
    from skillgraft.models.placement import offloaded  # noqa: PLC0415

    # θ_ft in memory on an accelerator is read once (the lent head, Δ): it waits on the CPU meanwhile (docs/gpu.md)
    with offloaded(ft if not sharded else None), preserved(pre, carried if lean else names + carried):
        return _optimise(pre, source, names, carried, train, select, plan, accelerator, group, progress, lean,
                         ranked, reference)


def _own_accuracy(ft, select: list[Example], micro_batch: int) -> float:
    """The fine-tuned model's accuracy on the selection rows, where it is (its train/eval mode kept)."""
    from skillgraft.models.freezing import evaluating  # noqa: PLC0415
    from skillgraft.models.placement import accelerator_for  # noqa: PLC0415

    with evaluating(ft):
        return accuracy_on(ft, select, micro_batch, accelerator_for(ft))


def _optimise(pre, source, names, carried, train, select, plan, accelerator, group, progress, lean, ranked,
              reference=None):
    """Build the layout on ``pre`` (whose flags, modes and head the caller restores), run the trajectories."""
    if not group.sharded:
        pre.to(accelerator.device)
    pre.eval()
    for p in pre.parameters():
        p.grad = None
    with torch.no_grad():  # lend θ_pre the fine-tuned task head
        for n, part in pieces(pre, carried, group).items():
            part.values().copy_(source.rows(n, part.start, part.stop).reshape(-1))
    for p in pre.parameters():
        p.requires_grad_(False)
    if lean:
        universe = sum(math.prod(p.shape) for n, p in pre.named_parameters() if n in set(names))  # global shapes
        size = plan.candidates(universe) if plan.candidates is not None else None
        layout: Layout = Candidates(pieces(pre, names, group), source, group, size=size, chosen=plan.chosen,
                                    base=plan.base)
    else:
        layout = Dense(pre, source, names, group)
        if plan.base is not None:
            layout.masks_of(plan.base)  # refused before any step when it does not fit
    checkpointing = plan.gradient_checkpointing or (
        group.sharded and os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true")
    try:
        with activation_checkpointing(pre, checkpointing), compiled(pre, plan.compile):
            if reference is None and select:  # θ_ft is read from files: θ_pre + Δ on every held coordinate
                with layout.full():
                    acc = accuracy_on(pre, select, plan.micro_batch, accelerator, group.sharded and group.world > 1)
                reference = {"score": acc, "of": "graft of every candidate" if layout.size is not None
                             else "graft of the whole universe"}
            return _trajectories(pre, layout, train, select, plan, accelerator, group, progress, ranked, reference)
    finally:
        layout.close()
        layout.restore()


def _trajectories(pre, layout: Layout, train, select, plan: Plan, accelerator, group, progress, ranked, reference):
    train = RunRows(train)  # tokenized at the first step, for every trajectory of this run (and gone with it)
    per_budget = plan.one_budget_each()
    score = None  # the base score at the layout's coordinates, where γ_base or the relaxation's start needs it
    if per_budget or (plan.base is None and plan.base_size is not None):
        score = {n: d.abs() for n, d in layout.delta.items()} if plan.scores is None else layout.gather(plan.scores)
    base = None  # the shared γ_base; with base_per_budget only a 'round' budget reads it (the others take their own)
    if plan.base is not None:
        base = layout.masks_of(plan.base)
    elif plan.base_size is not None and not (plan.base_per_budget and not any(b.rounding for b in plan.budgets)):
        base = layout.top(score, plan.base_size(layout.universe))
    base_size = None if base is None else layout.count(base)
    if not per_budget:
        score = None
    layout.watch()
    history: list[ScoredStep] = []
    step_times: list[float] = []
    best: dict[Budget, tuple[float, int, Region | None]] = {}
    relax = None
    stops: list[dict] = []  # each trajectory's last step and why it stopped there
    groups = [[b] for b in plan.budgets] if per_budget else [plan.budgets]
    saved = _checkpoint(plan, layout, group, accelerator, len(train), len(select))
    state = saved.load() if saved is not None else None
    earlier = 0.0  # what the stopped runs spent (their first step to their last save): a stage's time is the sum
    if state is not None:  # the same command, stopped: resume from the last saved step (skillgraft.resume)
        labels = [b.label for b in plan.budgets]
        history[:] = [ScoredStep.from_columns(h, labels) for h in state["history"]]
        step_times[:] = state["step_times"]
        best |= state["best_before"]
        earlier = state.get("seconds", 0.0)  # states saved before it was kept: unknown, counted as 0
        stops[:] = state.get("stops", [])
    started = time.perf_counter()
    for i, budgets in enumerate(groups):
        if state is not None and i < state["group"]:
            continue  # a trajectory finished before the stop: its best regions came back with the state
        relax = plan.relaxation()
        k = budgets[0].size(layout.universe) if relax.per_budget else None
        own = base  # the paper's protocol (base_per_budget): γ_base is the top-|budget| of the base score
        if plan.base_per_budget and not budgets[0].rounding:  # 'round' keeps the plan's γ_base
            own = layout.top(score, budgets[0].size(layout.universe))
        params = relax.start(layout, score, own, k, plan.seed)
        if relax.recomputable and isinstance(layout, Dense):  # γ is dropped between steps (docs/gpu.md)
            layout.recompute = lambda r=relax: r.mask(0)
        here = state if state is not None and i == state["group"] else None
        best |= _trajectory(pre, layout, relax, Optimizer(plan.optimizer, plan.lr, params, group), budgets, train,
                            select, plan, accelerator, group, progress, history, step_times,
                            saved=saved, resumed=here, where={"group": i, "best_before": dict(best), "stops": stops},
                            elapsed=lambda: earlier + time.perf_counter() - started,
                            reference=reference["score"] if reference else None, stops=stops)
    result = Localization({b: best[b][2] for b in plan.budgets}, {b: best[b][1] for b in plan.budgets},
                          {b: best[b][0] for b in plan.budgets}, history, base_size,
                          float(np.median(step_times)) if step_times else 0.0, plan.config, layout.size, step_times,
                          resumed_seconds=earlier)
    result.reference = reference
    result.fit = fit_summary(history, result.best_score, reference, len(select))
    result.stopped = stops
    if ranked:
        result.ranking = relax.ranking(plan.seed)
    return result


def _checkpoint(plan: Plan, layout: Layout, group: Group, accelerator, n_train: int, n_select: int):
    """The localization's checkpoint in the store stage being written (None: not in one). With several processes
    each saves its own state (its shards' S, moments and working weights) and rank 0 the manifest last."""
    from skillgraft.resume import checkpoint  # noqa: PLC0415

    relax = plan.relaxation()
    return checkpoint("localize", {
        "relaxation": [type(relax).__name__, relax.name], "optimizer": plan.optimizer, "lr": plan.lr,
        "steps": plan.steps, "budgets": [str(b) for b in plan.budgets], "batch": [plan.batch_size, plan.micro_batch],
        "eval_every": plan.eval_every, "last": plan.last, "seed": plan.seed, "graftable": plan.graftable,
        "config": plan.config, "universe": layout.universe, "size": layout.size, "rows": [n_train, n_select]},
        world=accelerator.num_processes, rank=accelerator.process_index, device=accelerator.device)


def _trajectory(pre, layout: Layout, relax: Relaxation, optimizer: Optimizer, budgets: list[Budget], train, select,
                plan: Plan, accelerator, group: Group, progress, history: list[ScoredStep], step_times: list[float], *,
                elapsed: Callable[[], float], saved=None, resumed: dict | None = None,
                where: dict | None = None, reference: float | None = None, stops: list | None = None) -> dict:
    """One optimisation of the relaxation's parameters; every ``eval_every`` steps each budget's region is scored.

    ``saved`` (a :class:`skillgraft.resume.Checkpoint`): the state after a step is saved there when due;
    ``resumed``: such a state, to go on from (bit for bit what the uninterrupted run does next); ``elapsed()``: the
    localization's seconds so far, earlier stopped runs included (kept in the saved state). ``reference``: FT's score
    on the selection rows (each scored region's fit share is its score ÷ this); ``plan.schedule`` may end the
    trajectory before ``plan.steps`` by its fit (the step and the reason appended to ``stops``)."""
    world, rank = accelerator.num_processes, accelerator.process_index
    batch_n = min(plan.batch_size, len(train))
    rng = np.random.RandomState(plan.seed)
    best: dict[Budget, tuple[float, int, Region | None]] = {b: (-1.0, 0, None) for b in budgets}
    previous: dict[Budget, Region] = {}
    still = {"since": None, "moved": False}  # the first scored step, and whether a region changed after it

    def save(step: int) -> None:
        from skillgraft.resume import cpu  # noqa: PLC0415

        saved.save({**(where or {}), "step": step, "seconds": elapsed(), "rng": rng.get_state(),
                    "best": best, "previous": previous, "still": still, "history": [h.columns() for h in history],
                    "step_times": step_times, "params": cpu(optimizer.params),
                    "adam": optimizer.adam.state_dict() if optimizer.adam is not None else None,
                    "relaxation": relax.state(), "layout": layout.state()})

    def resume(state: dict) -> int:
        with torch.no_grad():
            for p, value in zip(optimizer.params, state["params"]):
                p.copy_(value.to(p.device))
        if optimizer.adam is not None:
            optimizer.adam.load_state_dict(state["adam"])
        relax.load_state(state["relaxation"], state["step"])
        layout.load_state(state["layout"])
        rng.set_state(state["rng"])
        best.update(state["best"])
        previous.update(state["previous"])
        still.update(state.get("still", {"moved": True}))  # a state saved before it was kept: as if one moved
        return state["step"]
    lockstep = group.sharded and world > 1  # every process runs every forward (FSDP gathers in each)
    collated: dict = {}  # the selection rows' micro-batches, collated at the first scoring (accuracy_on)

    def score(step: int) -> None:
        row = ScoredStep(step, budgets[0].label if plan.one_budget_each(relax) else None, relax.row())
        for b in budgets:
            masks = layout.select(relax.scores(), b)
            acc = 0.0
            if select:
                held = layout.hold_choice(masks, relax.absolute)
                acc = accuracy_on(pre, select, plan.micro_batch, accelerator, lockstep, collated)
                layout.release(held, relax.absolute)
                del held
                layout.forget()
            region = layout.region(masks)
            # how much the region still moves: IoU with the last scored step's region
            iou = region.iou(previous[b]) if b in previous else None
            still["moved"] = still["moved"] or iou not in (None, 1.0)  # 1.0 exactly: the same coordinates
            iou = round(iou, 6) if iou is not None else None
            fit = round(acc / reference, 6) if reference else None
            row.scores[b.label] = BudgetScore(acc, layout.count(masks), iou, fit)
            previous[b] = region
            if plan.last or acc > best[b][0]:
                best[b] = (acc, step, region)
        history.append(row)
        if still["since"] is None:
            still["since"] = step

    def scored(step: int) -> bool:
        return step >= relax.first and (step % plan.eval_every == 0 or step in (relax.first, plan.steps))

    label = f"localize ({relax.name} {budgets[0].label})" if relax.per_budget else "localize"
    timed = None
    if progress and accelerator.is_main_process and resumed is None and not (where or {}).get("group"):
        timed = _plan(plan, relax, budgets, train, select, batch_n, world, scored, label)  # said before step 1
    if resumed is not None:
        done = resume(resumed)
    else:
        done = 0
        layout.write(relax.mask(0), relax.absolute)
        layout.forget()
        if scored(0):
            t0 = time.perf_counter()
            score(0)
            if timed is not None:
                timed.estimate.scoring = time.perf_counter() - t0
    why, last = f"the step cap ({plan.steps})", done
    stop = plan.schedule.stop(history, budgets, reference, done) if done == 0 and scored(0) else None
    unchanged = lambda: None if still["moved"] else still["since"]  # noqa: E731
    if stop is not None:  # the start already fits: no step is taken
        why = stop
    bar = tqdm(range(done + 1, plan.steps + 1) if stop is None else [], desc=label, initial=done, total=plan.steps,
               disable=not (progress and accelerator.is_main_process) or stop is not None)
    guard = _FirstNonFinite(accelerator.device)
    try:
        for step in bar:
            t0 = time.perf_counter()
            order = rng.permutation(len(train))[:batch_n] if batch_n < len(train) else np.arange(len(train))
            _step(pre, layout, relax, optimizer, train, by_length(train, order[rank::world]), plan.micro_batch, batch_n,
                  math.ceil(len(order) / world) if lockstep else None, accelerator.device, group, guard, step,
                  *([timed] if timed is not None else []))  # the second micro-batch's time, for the estimate
            if timed is not None and not timed.waiting:
                timed = None  # said: no more micro-batch is timed
            step_times.append(time.perf_counter() - t0)
            if scored(step) or step == plan.steps:
                guard.check()  # the loss is read here, where the loop reads anyway, never inside a step
            if scored(step):
                score(step)
                shown = history[-1].scores
                bar.set_postfix({b.label: f"{shown[b.label].acc:.3f}/{shown[b.label].size}" for b in budgets})
            last = step
            stop = plan.schedule.stop(history, budgets, reference, step, unchanged()) if scored(step) else None
            if stop is not None:
                why = stop
                break
            if saved is not None and step < plan.steps and saved.due():
                guard.check()
                save(step)
                layout.forget()
    finally:
        bar.close()
    if stops is not None:
        stops.append({"budget": budgets[0].label if plan.one_budget_each(relax) else None, "step": last,
                      "why": why})
    return best


def _step(pre, layout: Layout, relax: Relaxation, optimizer: Optimizer, train, mine: np.ndarray, micro_batch: int,
          batch_n: int, lockstep: int | None, device, group: Group, guard: _FirstNonFinite, step: int,
          timed: Callable[[float], bool] | None = None) -> None:
    """One update of z and the mask it writes, with no host synchronisation (batches go to the device
    ``non_blocking``; the loss stays there, its finiteness gating the update: :class:`_FirstNonFinite`).
    ``timed``: given the seconds of each micro-batch until it has said the run's time estimate (a
    :class:`~skillgraft.eta.WarmTimer`, synchronised for each: the first two micro-batches of the run)."""
    total = None
    for chunk, weight in micro_batches(mine, micro_batch, lockstep):
        t0 = time.perf_counter()
        batch = train.batch(pre, chunk, device)  # an index into the run's rows tokenized once (RunRows)
        loss = batch_loss(pre, batch, reduction="sum") / batch_n  # cross-entropy (generative: completion tokens)
        (loss if weight == 1 else loss * weight).backward()
        part = loss.detach() if weight == 1 else loss.detach() * weight
        total = part if total is None else total + part
        if timed is not None:
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)
            if timed(time.perf_counter() - t0):
                timed = None
    finite = guard.see(group.sum_(total), step)
    if not relax.fused(layout, optimizer, finite):  # in place where it can (the dense sigmoid's with sgd)
        layout.current  # noqa: B018 - the held mask, recomputed (if dropped) before its parameters move
        optimizer.step(relax.grad(layout.grads()), finite)  # a non-finite loss moves nothing: a NaN is never stored
        layout.write(relax.mask(step), relax.absolute)
    layout.forget()  # between steps (the backward's peak) only what cannot be recomputed stays


def _plan(plan: Plan, relax: Relaxation, budgets: list[Budget], train, select, batch_n: int, world: int, scored,
          label: str):
    """Say the localization's plan before step 1 (:mod:`skillgraft.eta`) and return what says its estimated time
    once its second micro-batch is timed (an :class:`~skillgraft.eta.Estimate` in a
    :class:`~skillgraft.eta.WarmTimer`; with the first scoring's time, when it scores at step 0)."""
    from skillgraft.eta import Estimate, WarmTimer, plan_line, say  # noqa: PLC0415

    trajectories = len(plan.budgets) if plan.one_budget_each(relax) else 1
    per_step = math.ceil(math.ceil(batch_n / world) / plan.micro_batch)
    times = sum(1 for s in range(plan.steps + 1) if scored(s)) if select else 0
    what = label.split(" (")[0]
    say(plan_line(what, rows=len(train), steps=plan.steps, batch=batch_n, micro_batches=per_step, scored=times,
                  score_rows=len(select or []), trajectories=trajectories))
    rows = math.ceil(batch_n / world) / per_step  # rows of a training micro-batch
    cap = ""
    if plan.schedule.kind == "fit":  # the time of every step to the cap; the schedule usually stops sooner
        cap = (f"the fit schedule stops sooner once every region fits, none gains for {plan.schedule.patience} steps"
               + (f" or none moves in {plan.schedule.still}" if plan.schedule.still else ""))
    return WarmTimer(Estimate(what, trajectories * plan.steps * per_step, trajectories * times,
                              len(budgets) * math.ceil(len(select or []) / world), rows, cap))


class _FirstNonFinite(FirstNonFinite):
    """:class:`skillgraft.finite.FirstNonFinite` of the localization (its :meth:`check` names it)."""

    def check(self, what: str = "localization") -> None:
        super().check(what)


__all__ = ["Optimizer", "Plan", "run"]
