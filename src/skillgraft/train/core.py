"""The training core: one loop on Hugging Face Accelerate (one CPU, one GPU, or ``accelerate launch`` many).

nanoGPT style, top to bottom: the sampler gives each step's task and global batch; each process takes its
shard; loss = cross-entropy on the task scorer's label logits (a generative scorer: the mean over examples of each
example's completion-token cross-entropy, docs/generative.md) (+ λ‖θ−θ_pre‖₁ when ``config.l1`` > 0; a
non-finite loss on any process stops the run with one line, :func:`~skillgraft.finite.check_loss`);
backward, clip, optimizer step; every ``eval_every`` steps (and at the end) the dev sets are scored.
Everything else — keeping the best dev weights, region masks, Auto-RGN, snapshots — is a callback
(:mod:`skillgraft.train.callbacks`). The model is a Scorer (with a :class:`SingleTask` sampler) or a
``MultiTaskScorer`` (with a :class:`MultiTask` sampler).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from skillgraft.lazy import np
from skillgraft.lazy import nn, no_grad, torch
from skillgraft.progress import bar as tqdm

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.predict import evaluate
from skillgraft.finite import FirstNonFinite, refuse_non_finite
from skillgraft.models.compiled import compiled
from skillgraft.models.freezing import freeze
from skillgraft.train.config import FinetuneConfig


@dataclass
class TrainState:
    """What callbacks see: the model being trained (unwrapped), its trainable parameters and optimizer."""

    model: nn.Module
    config: FinetuneConfig
    steps: int
    accelerator: object
    params: list[nn.Parameter] = field(default_factory=list)
    optimizer: object = None
    trainable_parameters: int = 0      # coordinates that may move (a RegionMask lowers it)
    history: list[dict] = field(default_factory=list)
    best_step: int | None = None       # set by BestDev when it restores a checkpoint
    best_dev: float | None = None


@dataclass
class TrainResult:
    """What one training run returns: the trained model, steps, best dev step and score, history, time."""
    model: nn.Module
    steps: int
    best_step: int                     # the step whose weights the model holds (``steps`` without BestDev)
    best_dev: float | None             # its dev score (mean over tasks)
    history: list[dict]                # {"step", "dev", "dev_ece"[, "dev:<task>" …]} per evaluation
    seconds: float                     # training only (dev evaluations excluded)
    examples_per_second: float
    trainable_parameters: int
    task_steps: dict[str, int]         # how many steps each task was drawn

    @property
    def scorer(self) -> nn.Module:
        return self.model


def view_of(model, task: str | None):
    """The Scorer of ``task`` (``None``: the model itself)."""
    return model if task is None else model.view(task)


def freeze_unused(scorer, examples: list[Example]) -> list[str]:
    """Freeze parameters the scorer's output does not depend on (e.g. BERT's pooler under mean pooling).

    Found by one probe backward pass; keeps DDP and weight decay from touching parameters that never
    receive a gradient. Returns the names frozen.
    """
    batch = scorer.collate(examples)
    batch.pop("labels")
    batch = {k: v.to(scorer.device) for k, v in batch.items()}
    scorer.zero_grad(set_to_none=True)
    scorer(**batch).float().sum().backward()
    unused = []
    for name, p in scorer.named_parameters():
        if p.requires_grad and p.grad is None:
            p.requires_grad_(False)
            unused.append(name)
    scorer.zero_grad(set_to_none=True)
    return unused


def trainable_parameters(model, sampler, config: FinetuneConfig, state: TrainState, callbacks) -> list[nn.Parameter]:
    """Freezing rules on each task's scorer, then callbacks' ``on_setup`` (region masks), then a probe
    that drops parameters without gradient; the parameters left, each once, in scorer order."""
    for p in model.parameters():
        p.requires_grad_(False)
    views = [view_of(model, t) for t in sampler.data]
    for view in views:
        freeze(view, embeddings=config.freeze_embeddings, head=config.freeze_head, bias_only=config.bias_only,
               layers=config.layers)
    emit(callbacks, "on_setup", state)
    for view, (train, _) in zip(views, sampler.data.values()):
        freeze_unused(view, train[: min(2, len(train))])
    params, seen = [], set()
    for view in views:
        for p in view.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    if not params:
        raise SkillgraftError("no trainable parameters left after freezing")
    return params


def objective(scorer, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The training loss of one batch's forward output: cross-entropy of label logits; a generative scorer's
    output is each example's mean completion-token log-probability, so its loss is −mean (Scorer.loss)."""
    if getattr(scorer, "mode", None) == "generative":
        return -out.float().mean()
    return torch.nn.functional.cross_entropy(out.float(), labels)


def emit(callbacks, hook: str, *args) -> None:
    for cb in callbacks:
        fn = getattr(cb, hook, None)
        if fn is not None:
            fn(*args)


def dev_metrics(model, sampler, step: int, batch_size: int) -> dict | None:
    """Dev score of every task that has a dev set: ``{"step", "dev", "dev_ece"}`` (means over tasks) and,
    for named tasks, ``"dev:<task>"``; None without dev data."""
    scores, eces = {}, []
    for task, (_, dev) in sampler.data.items():
        if dev:
            metrics, _ = evaluate(view_of(model, task), dev, batch_size=batch_size)
            scores[task] = metrics["score"]
            eces.append(metrics["ece"])
    if not scores:
        return None
    return {"step": step, "dev": float(np.mean(list(scores.values()))), "dev_ece": float(np.mean(eces)),
            **{f"dev:{t}": s for t, s in scores.items() if t is not None}}


def _plan(desc: str, sampler, config: FinetuneConfig, steps: int, world: int):
    """Say the fine-tuning's plan before step 1 (:mod:`skillgraft.eta`: rows, steps, dev scoring) and return what
    says its estimated time once a warm batch is timed (a :class:`~skillgraft.eta.WarmTimer`: the second)."""
    from skillgraft.eta import WarmTimer, estimate_line, forward_equivalents, plan_line, say  # noqa: PLC0415

    rows = sum(len(train or []) for train, _ in sampler.data.values())
    dev = sum(len(d or []) for _, d in sampler.data.values())
    evals = (len(range(config.eval_every, steps, config.eval_every)) if config.eval_every else 0) + 1 if dev else 0
    what = (desc or "finetune").split(" (")[0]
    say(plan_line(what, rows=rows, steps=steps, batch=config.batch_size, scored=evals, score_rows=dev))
    scoring = forward_equivalents(evals * dev, config.batch_size)  # the dev forwards, in training batches
    return WarmTimer(lambda seconds: say(estimate_line(what, seconds, steps, scoring=scoring)))


def _checkpoint(config: FinetuneConfig, sampler, callbacks, params, model, accelerator):
    """The fine-tuning's checkpoint in the store stage being written; None outside one, with a callback whose state
    is not saved (Auto-RGN, snapshots: such runs start over), or on a model Accelerate sharded (FSDP2 on GPUs).
    Several processes (replicas) each save their own state, rank 0 the manifest last (skillgraft.resume)."""
    from skillgraft.resume import checkpoint  # noqa: PLC0415

    stateless = ("RegionMask",)  # its masks and θ_pre values are set again at train start
    if any(not hasattr(cb, "state") and type(cb).__name__ not in stateless for cb in callbacks):
        return None
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return None
    return checkpoint("finetune", {"config": config.to_dict(), "steps": sampler.steps,
                                   "tasks": {str(t): [len(tr), len(dev or [])]
                                             for t, (tr, dev) in sampler.data.items()},
                                   "params": [list(p.shape) for p in params],
                                   "callbacks": [type(cb).__name__ for cb in callbacks]},
                      world=accelerator.num_processes, rank=accelerator.process_index, device=accelerator.device)


def _state(done: int, loss_ema, eval_seconds: float, seconds: float, params, opt, state: TrainState, callbacks,
           accelerator) -> dict:
    """Everything the steps after ``done`` depend on: weights, optimizer moments, the random generators (dropout),
    the history, the callbacks' own state."""
    return {"step": done, "loss_ema": loss_ema, "eval_seconds": eval_seconds, "seconds": seconds,
            "params": [p.detach().to("cpu", copy=True) for p in params], "optimizer": opt.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if _on_cuda(params) else None,
            "history": list(state.history),
            "callbacks": [cb.state() if hasattr(cb, "state") else None for cb in callbacks]}


def _fused(params) -> dict:
    """One fused kernel per optimizer step (fewer launches: fine-tuning on a GPU is host-bound, bench/RESULTS.md),
    which can also skip a step on the device (``found_inf``: a non-finite loss); on the CPU too (fused SGD there
    is bit for bit the default's). Floating-point parameters on one CPU or CUDA device only."""
    devices = {p.device.type for p in params}
    ok = params and len(devices) == 1 and devices <= {"cpu", "cuda"} and all(
        p.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64) for p in params)
    return {"fused": True} if ok else {}


def _on_cuda(params) -> bool:
    """Whether the run is on a GPU (then its CUDA generators are part of its state; a CPU run never touches CUDA)."""
    return any(p.device.type == "cuda" for p in params)


@no_grad
def _resume(saved: dict, params, opt, state: TrainState, callbacks, accelerator) -> None:
    for p, value in zip(params, saved["params"]):
        p.copy_(value.to(p.device, p.dtype))
    opt.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["torch_rng"])
    if saved["cuda_rng"] is not None and _on_cuda(params):
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    state.history[:] = saved["history"]
    for cb, cb_state in zip(callbacks, saved["callbacks"]):
        if cb_state is not None:
            cb.load_state(cb_state)



@dataclass
class _Loop:
    """What every step of one run uses (:func:`_step`)."""

    wrapped: nn.Module
    raw: nn.Module
    params: list
    anchors: list | None
    opt: object
    config: FinetuneConfig
    callbacks: tuple
    accelerator: object
    guard: FirstNonFinite
    rows: dict
    direct: bool = False  # Accelerate's backward, clipping and step would only add host work (:func:`_direct`)


def _step(loop: _Loop, task, examples, loss_ema, step: int):
    """One update, with no host synchronisation: the batch is an index into the run's rows on the device, the loss
    and its EMA stay there, a non-finite loss skips the update on the device (read at the loop's next read point,
    which stops the run naming this step: :class:`~skillgraft.finite.FirstNonFinite`). Returns the loss's EMA."""
    acc, config, params = loop.accelerator, loop.config, loop.params
    view = view_of(loop.raw, task)
    rows = loop.rows.get(task)
    if rows is not None and rows.covers(examples):
        batch = rows.take(examples)
    else:
        batch = {k: v.to(acc.device, non_blocking=True) for k, v in view.collate(examples).items()}
    labels = batch.pop("labels")
    out = loop.wrapped(**batch) if task is None else loop.wrapped(task, **batch)
    loss = objective(view, out, labels)
    shared = acc.reduce(loss.detach(), reduction="mean") if acc.num_processes > 1 else loss.detach()
    finite = loop.guard.see(shared, step)  # every process sees the same (reduced) loss: all skip alike
    loss.backward() if loop.direct else acc.backward(loss)
    if loop.anchors is not None:
        _l1_gradients(params, loop.anchors, config.l1)
    emit(loop.callbacks, "on_after_backward", step - 1)
    if config.max_grad_norm:
        if loop.direct:
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        else:
            acc.clip_grad_norm_(params, config.max_grad_norm)
    emit(loop.callbacks, "on_before_optimizer_step", step - 1, loop.opt)
    _gate(loop.opt, params, finite)
    opt = getattr(loop.opt, "optimizer", loop.opt) if loop.direct else loop.opt
    opt.step()
    opt.zero_grad(set_to_none=True)
    emit(loop.callbacks, "on_after_optimizer_step", step - 1)
    value = shared.float()
    return value if loss_ema is None else loss_ema * 0.9 + value * 0.1


def _direct(accelerator) -> bool:
    """Whether the step may call torch itself: no gradient scaler, accumulation, FSDP, DeepSpeed or XLA, where
    Accelerate's backward, ``clip_grad_norm_`` and optimizer step are torch's plus per-step host work (its optimizer
    step looks for an optional package on disk twice per call)."""
    from accelerate.utils import DistributedType  # noqa: PLC0415

    return (accelerator.scaler is None and accelerator.gradient_accumulation_steps == 1
            and accelerator.distributed_type in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU))


@no_grad
def _l1_gradients(params, anchors, l1: float) -> None:
    """Add ∂(λ‖θ − θ_pre‖₁)/∂θ = λ·sign(θ − θ_pre) to the gradients (after backward, vectorised: the same values
    autograd gave when the penalty was part of the loss)."""
    signs = torch._foreach_sign(torch._foreach_sub([p.detach() for p in params], anchors))
    torch._foreach_mul_(signs, l1)
    present = [(p.grad, s) for p, s in zip(params, signs) if p.grad is not None]
    for p, s in zip(params, signs):
        if p.grad is None:  # a tensor this step's loss does not reach (another task's head): the penalty alone
            p.grad = s
    if present:
        torch._foreach_add_([g for g, _ in present], [s for _, s in present])


def _gate(opt, params, finite) -> None:
    """A non-finite loss moves nothing, decided on the device: a fused optimizer skips its step on ``found_inf`` (as
    GradScaler's does); another one gets zero gradients. The param groups decide, not the defaults: a run resumed
    from a checkpoint of an unfused optimizer steps unfused (its loaded groups say so), bit for bit as it began."""
    inner = getattr(opt, "optimizer", opt)
    if all(group.get("fused") for group in inner.param_groups):
        inner.found_inf = (~finite).float()
        return
    grads = [p.grad for p in params if p.grad is not None]
    for g in grads:
        g.copy_(torch.where(finite, g, 0.0))


def fit(model, sampler, config: FinetuneConfig, callbacks=(), *, accelerator=None, progress: bool = True,
        desc: str = "train") -> TrainResult:
    """Train ``model`` in place on ``sampler``'s batches; afterwards it is in eval mode with every
    ``requires_grad`` off. Callbacks (:mod:`skillgraft.train.callbacks`) run at the documented points."""
    from accelerate import DistributedDataParallelKwargs  # noqa: PLC0415

    from skillgraft.models.placement import accelerator_for  # noqa: PLC0415

    multi = any(t is not None for t in sampler.data)
    # the run stays where the model is (placed when it was loaded): masks, anchors and batches follow it
    accelerator = accelerator or accelerator_for(
        model, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=multi)])
    world, rank = accelerator.num_processes, accelerator.process_index
    if config.batch_size % world:
        raise SkillgraftError(f"batch_size {config.batch_size} must be divisible by the {world} processes")
    steps = sampler.steps
    state = TrainState(model, config, steps, accelerator)
    params = trainable_parameters(model, sampler, config, state, callbacks)
    torch.manual_seed(config.seed)
    if config.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay, **_fused(params))
    else:
        opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, **_fused(params))
    anchors = [p.detach().clone() for p in params] if config.l1 > 0 else None
    wrapped, opt = accelerator.prepare(model, opt)
    raw = accelerator.unwrap_model(wrapped)
    state.model, state.params, state.optimizer = raw, params, opt
    state.trainable_parameters = sum(p.numel() for p in params)
    emit(callbacks, "on_train_start", state)

    eval_seconds = 0.0

    def dev_score(step: int) -> None:
        nonlocal eval_seconds
        t0 = time.perf_counter()
        metrics = dev_metrics(raw, sampler, step, config.eval_batch_size)
        eval_seconds += time.perf_counter() - t0
        if metrics is not None:
            state.history.append(metrics)
            emit(callbacks, "on_evaluate", step, metrics)

    start = time.perf_counter()
    saved = _checkpoint(config, sampler, callbacks, params, raw, accelerator)
    resumed = saved.load() if saved is not None else None
    done, loss_ema = 0, None
    if resumed is not None:  # the same command, stopped: go on from the last saved step (skillgraft.resume)
        done, loss_ema, eval_seconds = resumed["step"], resumed["loss_ema"], resumed["eval_seconds"]
        loss_ema = None if loss_ema is None else torch.tensor(loss_ema, device=accelerator.device)
        _resume(resumed, params, opt, state, callbacks, accelerator)
        start -= resumed["seconds"]
    wrapped.train()
    batches = iter(sampler)
    for _ in range(done):  # the batches of the steps done before the stop: drawn (a seeded schedule), not run
        next(batches)
    timed = _plan(desc, sampler, config, steps, world) if progress and accelerator.is_main_process and not done \
        else None
    bar = tqdm(batches, total=steps, desc=desc, disable=not (progress and accelerator.is_main_process),
               initial=done)
    from skillgraft.models.rows import Tokenized  # noqa: PLC0415

    rows = {t: Tokenized.of(view_of(raw, t), train, accelerator.device) for t, (train, _) in sampler.data.items()}
    guard = FirstNonFinite(accelerator.device)
    loop = _Loop(wrapped, raw, params, anchors, opt, config, callbacks, accelerator, guard, rows, _direct(accelerator))
    with compiled(raw, config.compile):  # the body compiled for the steps; eager again after them, also on an error
        for step, (task, examples) in enumerate(bar, start=done):
            t0 = time.perf_counter()
            loss_ema = _step(loop, task, examples[rank::world], loss_ema, step + 1)
            if timed is not None:  # the first steps timed (synchronised): the run's estimated time from the second
                if accelerator.device.type == "cuda":
                    torch.cuda.synchronize(accelerator.device)
                if timed(time.perf_counter() - t0):
                    timed = None
            evaluated = config.eval_every and (step + 1) % config.eval_every == 0 and step + 1 < steps
            if evaluated:
                guard.check("fine-tuning")  # the loss is read where the loop reads anyway, never inside a step
                dev_score(step + 1)
                wrapped.train()
            if not bar.disable and (evaluated or step % 10 == 0):
                guard.check("fine-tuning")
                bar.set_postfix(loss=f"{float(loss_ema):.3f}",
                                dev=f"{state.history[-1]['dev']:.3f}" if state.history else "-")
            if saved is not None and step + 1 < steps and saved.due():
                guard.check("fine-tuning")
                saved.save(_state(step + 1, float(loss_ema), eval_seconds, time.perf_counter() - start, params, opt,
                                  state, callbacks, accelerator))
        guard.check("fine-tuning")
    seconds = time.perf_counter() - start - eval_seconds
    for p in params:  # the last step's update is checked by no later loss
        refuse_non_finite(p, f"fine-tuning stopped after step {steps}: a trained weight",
                          "nothing was stored. Lower the learning rate (--lr)")
    dev_score(steps)
    emit(callbacks, "on_train_end", state)
    raw.eval()
    for p in raw.parameters():
        p.requires_grad_(False)
    if state.best_step is None:  # no BestDev: the model holds the last step's weights
        state.best_step = steps
        state.best_dev = state.history[-1]["dev"] if state.history and state.history[-1]["step"] == steps else None
    return TrainResult(raw, steps, state.best_step, state.best_dev, state.history, seconds,
                       steps * config.batch_size / max(seconds, 1e-9), state.trainable_parameters,
                       dict(sampler.task_steps))
