"""Diagonal Fisher information of log p(y|x) through any Scorer.

    F_jj = (1/N) Σ_i Σ_y q_i(y) · (∂ log p_θ(y | x_i) / ∂θ_j)²

* ``empirical`` — q_i = δ(y_i), the true label (what FISH and surgical fine-tuning use);
* ``true``      — q_i = p_θ(· | x_i), the exact expectation over all labels under the model's softmax;
* ``sampled``   — one label per example drawn from p_θ(· | x_i) (a Monte-Carlo estimate of ``true``).

Per-example gradients are computed vectorised with ``torch.func`` (``functional_call`` +
``vmap(grad(...))``), chunked over examples to bound memory; :func:`fisher_loop` is the plain per-example
loop kept as the reference the tests compare against. The model is in eval mode (no dropout) and each
example's attention mask is used (padding never contributes).

HF attention code skips the mask when a batch has no padding (a data-dependent branch that ``vmap``
cannot take), so during the vectorised pass the model uses its eager attention with the mask always built.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from tqdm.auto import tqdm

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError

FisherKind = Literal["empirical", "true", "sampled"]
KINDS = ("empirical", "true", "sampled")
_VMAP_ATTENTION = "skillgraft_vmap"


@dataclass
class FisherConfig:
    """How to estimate the diagonal Fisher."""

    kind: FisherKind = field(default="empirical", metadata={
        "help": "empirical (true labels) | true (expectation over the model's labels) | sampled (one drawn label)"})
    n_examples: int | None = field(default=None, metadata={"help": "use the first N examples (None: all)"})
    chunk_size: int | None = field(default=None, metadata={
        "help": "per-example gradients held at once (None: 4 on CPU, where larger chunks are slower, 32 on GPU)"})
    method: Literal["auto", "hooks", "vmap", "loop"] = field(default="vmap", metadata={
        "help": "auto (hooks when every tensor sits in a Linear/LayerNorm/Conv1D, else vmap) | hooks | vmap | "
                "loop (reference)"})
    seed: int = field(default=0, metadata={"help": "seed of the labels drawn for kind=sampled"})

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise SkillgraftError(f"fisher kind must be one of {KINDS}, got {self.kind!r}")
        if self.method not in ("auto", "hooks", "vmap", "loop"):
            raise SkillgraftError(f"fisher method must be auto, hooks, vmap or loop, got {self.method!r}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise SkillgraftError(f"fisher chunk_size must be ≥ 1, got {self.chunk_size}")
        if self.n_examples is not None and self.n_examples < 1:
            raise SkillgraftError(f"fisher n_examples must be ≥ 1 (or None for all), got {self.n_examples}")


def body_names(scorer) -> list[str]:
    """Default Fisher parameters: every tensor of ``scorer.model`` (the pre-trained network)."""
    return [n for n, _ in scorer.named_parameters() if n.startswith("model.")]


def _check_names(scorer, names: list[str] | None) -> list[str]:
    names = body_names(scorer) if names is None else list(names)
    known = dict(scorer.named_parameters())
    bad = [n for n in names if n not in known]
    if bad:
        raise SkillgraftError(f"fisher: unknown parameter name(s) {bad[:3]} (names look like {next(iter(known))!r})")
    if not names:
        raise SkillgraftError("fisher: no parameters selected")
    return names


def _targets(probs: torch.Tensor, labels: torch.Tensor, kind: str, gen: torch.Generator) -> torch.Tensor:
    """Weights ``[B, R, C]`` such that F_i = Σ_r (∇ (w_r · log p))²: one-hot rows, scaled by √p for ``true``."""
    b, c = probs.shape
    if kind == "empirical":
        return torch.nn.functional.one_hot(labels, c).to(probs.dtype).unsqueeze(1)
    if kind == "sampled":
        drawn = torch.multinomial(probs.cpu(), 1, generator=gen).reshape(-1).to(probs.device)
        return torch.nn.functional.one_hot(drawn, c).to(probs.dtype).unsqueeze(1)
    eye = torch.eye(c, dtype=probs.dtype, device=probs.device)
    return eye.unsqueeze(0) * probs.sqrt().unsqueeze(-1)  # [B, C(targets), C]: √p_c e_c


def _examples(examples: list[Example], config: FisherConfig) -> list[Example]:
    if not examples:
        raise SkillgraftError("fisher: no examples given")
    chosen = examples[: config.n_examples] if config.n_examples else list(examples)
    # length-sorted (stable) so that chunks carry little padding; the Fisher is a sum, order-free
    return sorted(chosen, key=lambda ex: len(ex.text_a) + len(ex.text_b or ""))


@contextlib.contextmanager
def _eval_frozen(scorer):
    """Eval mode and the original ``requires_grad`` flags restored afterwards."""
    modes = [(m, m.training) for m in scorer.modules()]
    flags = {n: p.requires_grad for n, p in scorer.named_parameters()}
    scorer.eval()
    try:
        yield
    finally:
        for n, p in scorer.named_parameters():
            p.requires_grad_(flags[n])
        for m, training in modes:  # every module exactly as it was (not scorer.train(), which recurses)
            m.training = training


@contextlib.contextmanager
def vmap_attention(model):
    """Inside the block, attention always builds the padding mask (a vmap-safe path).

    Uses the model's own eager attention (plain matmuls, which vmap batches) when its module has one,
    else SDPA (which vmap runs per example on CPU).
    """
    import sys  # noqa: PLC0415

    try:
        from transformers import AttentionInterface, AttentionMaskInterface  # noqa: PLC0415
        from transformers.masking_utils import eager_mask, sdpa_mask  # noqa: PLC0415
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: PLC0415
    except ImportError:  # pragma: no cover - very old transformers
        yield
        return
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        yield
        return
    eager = getattr(sys.modules.get(type(model).__module__), "eager_attention_forward", None)
    build = eager_mask if eager is not None else sdpa_mask

    def mask(*args, **kwargs):
        kwargs["allow_is_causal_skip"] = False
        kwargs["allow_is_bidirectional_skip"] = False
        return build(*args, **kwargs)

    name = f"{_VMAP_ATTENTION}_{config.model_type}" if eager is not None else _VMAP_ATTENTION
    AttentionInterface.register(name, eager if eager is not None else ALL_ATTENTION_FUNCTIONS["sdpa"])
    AttentionMaskInterface.register(name, mask)
    old = config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(old)


def fisher_diagonal(scorer, examples: list[Example], config: FisherConfig | None = None, *,
                    names: list[str] | None = None, progress: bool | str = False, **overrides) -> dict[str, torch.Tensor]:
    """Diagonal Fisher ``{name: tensor}`` (float32, CPU, mean over the N examples) of the named parameters.

    ``names`` defaults to every tensor of ``scorer.model``; keyword ``overrides`` set fields of
    :class:`FisherConfig` (e.g. ``kind="true"``, ``n_examples=100``, ``method="loop"``).
    """
    config = config or FisherConfig()
    if overrides:
        bad = [k for k in overrides if k not in FisherConfig.__dataclass_fields__]
        if bad:
            raise SkillgraftError(f"fisher: unknown option(s) {bad}; known: {list(FisherConfig.__dataclass_fields__)}")
        config = FisherConfig(**{**config.__dict__, **overrides})
    config.validate()
    if config.method == "loop":
        return fisher_loop(scorer, examples, config, names=names, progress=progress)
    if config.method in ("auto", "hooks"):
        owners = _hook_owners(scorer, _check_names(scorer, names))
        if owners is not None:
            return _fisher_hooks(scorer, examples, config, owners, progress=progress)
        if config.method == "hooks":
            raise SkillgraftError("fisher method 'hooks' needs every tensor inside a Linear, LayerNorm or Conv1D; "
                                  "use vmap for the others (e.g. embeddings, RMSNorm)")
    return _fisher_vmap(scorer, examples, config, names=names, progress=progress)


def _hook_owners(scorer, names: list[str]) -> dict | None:
    """``{module: {param_name: full_name}}`` when every name is a Linear/LayerNorm/Conv1D tensor, else None."""
    wanted, owners = set(names), {}
    for mod_name, module in scorer.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) or type(module).__name__ == "Conv1D":
            for pname, _ in module.named_parameters(recurse=False):
                full = f"{mod_name}.{pname}" if mod_name else pname
                if full in wanted:
                    owners.setdefault(module, {})[pname] = full
    covered = {full for d in owners.values() for full in d.values()}
    return owners if covered == wanted else None


def _per_example_grads(module, x: torch.Tensor, delta: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example gradients ``[B, *param.shape]`` of a layer from its input x and output gradient δ.

    Linear: G_i = Σ_t δ_itᵀ x_it (one batched matmul); Conv1D (GPT-2): its transpose; LayerNorm:
    Σ_t δ_it ⊙ x̂_it for the weight, Σ_t δ_it for the bias.
    """
    b = x.shape[0]
    x = x.reshape(b, -1, x.shape[-1]).float()
    delta = delta.reshape(b, -1, delta.shape[-1]).float()
    out = {"bias": delta.sum(1)}
    if isinstance(module, torch.nn.LayerNorm):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        out["weight"] = (delta * (x - mean) / torch.sqrt(var + module.eps)).sum(1)
    elif isinstance(module, torch.nn.Linear):
        out["weight"] = torch.bmm(delta.transpose(1, 2), x)
    else:  # Conv1D: weight is [in, out]
        out["weight"] = torch.bmm(x.transpose(1, 2), delta)
    return out


def _fisher_hooks(scorer, examples, config: FisherConfig, owners: dict, *, progress) -> dict[str, torch.Tensor]:
    """Per-example gradients from ONE batched forward/backward per label target.

    Forward hooks keep each layer's input x and output; ``autograd.grad`` of Σ_i w_i·log p(·|x_i) with
    respect to the layer outputs gives every example's δ at once (examples do not interact), and the
    per-example parameter gradients follow in closed form (:func:`_per_example_grads`).
    """
    examples = _examples(examples, config)
    device = scorer.device
    params = dict(scorer.named_parameters())
    total = {full: torch.zeros(params[full].shape, dtype=torch.float32, device=device)
             for d in owners.values() for full in d.values()}
    gen = torch.Generator().manual_seed(config.seed)
    chunk = config.chunk_size or 16
    seen: dict = {}

    def keep(module, inputs, output):
        seen[module] = (inputs[0].detach(), output)

    handles = [m.register_forward_hook(keep) for m in owners]
    try:
        with _eval_frozen(scorer):
            for p in scorer.parameters():
                p.requires_grad_(False)
            for part, batch, labels in _chunks(scorer, examples, chunk, progress):
                if batch["input_ids"].shape[0] != len(part):  # rows are not examples (multi-token causal)
                    raise _NotPerExample
                seen.clear()
                with torch.enable_grad():
                    inputs_embeds_hook = scorer.model.get_input_embeddings().register_forward_hook(
                        lambda m, i, o: o.requires_grad_(True))
                    try:
                        logp = torch.log_softmax(scorer(**batch).float(), -1)
                    finally:
                        inputs_embeds_hook.remove()
                    weights = _targets(logp.detach().exp(), labels, config.kind, gen)  # [B, R, C]
                    mods = list(seen)
                    outs = [seen[m][1] for m in mods]
                    for r in range(weights.shape[1]):
                        deltas = torch.autograd.grad((logp * weights[:, r]).sum(), outs, allow_unused=True,
                                                     retain_graph=r + 1 < weights.shape[1])
                        for m, d in zip(mods, deltas):
                            if d is None:
                                continue
                            grads = _per_example_grads(m, seen[m][0], d)
                            for pname, full in owners[m].items():
                                total[full] += grads[pname].pow(2).sum(0)
    except _NotPerExample:
        for h in handles:
            h.remove()
        handles = []
        return _fisher_vmap(scorer, examples, config, names=list(total), progress=progress)
    finally:
        for h in handles:
            h.remove()
    return {n: (t / len(examples)).cpu() for n, t in total.items()}


class _NotPerExample(Exception):
    """The scorer's batch rows are not one per example; per-example hooks do not apply."""


def _chunks(scorer, examples: list[Example], chunk: int, progress):
    """Batches of ``chunk`` examples on the scorer's device: yields (examples, batch without labels, labels)."""
    bar = tqdm(range(0, len(examples), chunk), desc=progress if isinstance(progress, str) else "fisher",
               disable=not progress, leave=False)
    for start in bar:
        part = examples[start:start + chunk]
        batch = {k: v.to(scorer.device) for k, v in scorer.collate(part).items()}
        yield part, batch, batch.pop("labels")


def _fisher_vmap(scorer, examples, config: FisherConfig, *, names, progress) -> dict[str, torch.Tensor]:
    from torch.func import functional_call, grad, vmap  # noqa: PLC0415

    names = _check_names(scorer, names)
    examples = _examples(examples, config)
    device = scorer.device
    all_params = dict(scorer.named_parameters())
    params = {n: all_params[n].detach() for n in names}
    total = {n: torch.zeros(p.shape, dtype=torch.float32, device=device) for n, p in params.items()}
    gen = torch.Generator().manual_seed(config.seed)
    per_example_targets = scorer.task.num_labels if config.kind == "true" else 1
    chunk_size = config.chunk_size or (4 if device.type == "cpu" else 32)
    chunk = max(1, chunk_size // per_example_targets)

    def log_lik(p, batch, weights):
        """w · log p(·|x) for ONE example (its tensors carry their own leading row dimension)."""
        logits = functional_call(scorer, p, args=(), kwargs=batch)
        return (torch.log_softmax(logits.float(), -1)[0] * weights).sum()

    # outer vmap: examples; inner vmap: label targets of one example (one forward, R backwards)
    per_target = vmap(grad(log_lik), in_dims=(None, None, 0))
    per_example = vmap(per_target, in_dims=(None, 0, 0))
    with _eval_frozen(scorer), torch.no_grad():
        for p in scorer.parameters():
            p.requires_grad_(False)
        for part, batch, labels in _chunks(scorer, examples, chunk, progress):
            if config.kind == "empirical":  # no forward needed to pick the targets
                probs = torch.ones(len(part), scorer.task.num_labels, device=device)
            else:
                probs = torch.softmax(scorer(**batch).float(), -1)
            weights = _targets(probs, labels, config.kind, gen)
            b = len(part)
            rows = {k: v.reshape(b, v.shape[0] // b, *v.shape[1:]) for k, v in batch.items()}
            with vmap_attention(scorer.model):
                grads = per_example(params, rows, weights)
            for n, g in grads.items():
                total[n] += g.float().pow(2).sum(dim=(0, 1))
            del grads
    return {n: (t / len(examples)).cpu() for n, t in total.items()}


def fisher_loop(scorer, examples: list[Example], config: FisherConfig | None = None, *,
                names: list[str] | None = None, progress: bool | str = False) -> dict[str, torch.Tensor]:
    """Reference: one example at a time (no padding), one ``autograd.grad`` per label target."""
    config = config or FisherConfig(method="loop")
    config.validate()
    names = _check_names(scorer, names)
    examples = _examples(examples, config)
    device = scorer.device
    all_params = dict(scorer.named_parameters())
    params = [all_params[n] for n in names]
    total = {n: torch.zeros(all_params[n].shape, dtype=torch.float32, device=device) for n in names}
    gen = torch.Generator().manual_seed(config.seed)
    with _eval_frozen(scorer):
        for p in scorer.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        for ex in tqdm(examples, desc="fisher (loop)", disable=not progress, leave=False):
            batch = {k: v.to(device) for k, v in scorer.collate([ex]).items()}
            labels = batch.pop("labels")
            logp = torch.log_softmax(scorer(**batch).float(), -1)
            weights = _targets(logp.detach().exp(), labels, config.kind, gen)[0]
            for r, w in enumerate(weights):
                gs = torch.autograd.grad((logp[0] * w).sum(), params, retain_graph=r + 1 < len(weights),
                                         allow_unused=True)
                for n, g in zip(names, gs):
                    if g is not None:
                        total[n] += g.float().pow(2)
    return {n: (t / len(examples)).cpu() for n, t in total.items()}


def fisher_total(fisher: dict[str, torch.Tensor]) -> float:
    """Σ_j F_jj (the trace of the diagonal Fisher)."""
    return float(sum(t.double().sum() for t in fisher.values()))


def per_example_memory(scorer, names: list[str] | None = None) -> int:
    """Bytes one example's per-parameter gradient takes (to pick ``chunk_size`` for big models)."""
    names = _check_names(scorer, names)
    params = dict(scorer.named_parameters())
    return sum(params[n].numel() * 4 for n in names)


def suggest_chunk_size(scorer, names: list[str] | None = None, budget_bytes: float = 2e9) -> int:
    """Largest chunk whose per-example gradients fit in ``budget_bytes`` (at least 1)."""
    return max(1, int(math.floor(budget_bytes / max(1, per_example_memory(scorer, names)))))
