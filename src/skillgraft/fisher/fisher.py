"""Diagonal Fisher information of log p(y|x) through any Scorer.

    F_jj = (1/N) Σ_i Σ_y q_i(y) · (∂ log p_θ(y | x_i) / ∂θ_j)²

* ``empirical`` — q_i = δ(y_i), the true label (what FISH and surgical fine-tuning use);
* ``true``      — q_i = p_θ(· | x_i), the exact expectation over all labels under the model's softmax;
* ``sampled``   — one label per example drawn from p_θ(· | x_i) (a Monte-Carlo estimate of ``true``).

Per-example gradients are computed vectorised, chunked over examples to bound memory, by one of two paths:

* ``hooks`` — one batched forward/backward per chunk; layer hooks keep each layer's input x and output
  gradient δ, and the per-example gradients follow in closed form (Linear: δ_iᵀx_i). Covers Linear,
  Conv1D, LayerNorm, the RMS norms of the family table (models/families.py: Llama, Qwen, Gemma's (1 + w) …) and
  Embedding tensors (the whole body of BERT/RoBERTa/GPT-2/Llama/Qwen/Gemma
  models); the default (``auto``) whenever it applies;
* ``vmap`` — ``torch.func`` ``functional_call`` + ``vmap(grad(...))``, for any other model.

:func:`fisher_loop` is the plain per-example loop kept as the reference the tests compare against. The
model is in eval mode (no dropout) and each example's attention mask is used (padding never contributes).

HF attention code skips the mask when a batch has no padding (a data-dependent branch that ``vmap``
cannot take), so during the vectorised pass the model uses its eager attention with the mask always built.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Literal

from skillgraft.lazy import torch
from pydantic import Field
from skillgraft.progress import bar as tqdm

from skillgraft.data.loading import Example, text_length
from skillgraft.errors import SkillgraftError
from skillgraft.models.families import layer_kind
from skillgraft.spec import COUNT_MAX, Seed, Spec

if TYPE_CHECKING:
    from skillgraft.models.scorer import Scorer

FisherKind = Literal["empirical", "true", "sampled"]
_VMAP_ATTENTION = "skillgraft_vmap"


class FisherConfig(Spec):
    """How to estimate the diagonal Fisher."""

    kind: FisherKind = Field("empirical", description=(
        "empirical (true labels) | true (expectation over the model's labels) | sampled (one drawn label)"))
    n_examples: int | None = Field(None, ge=1, le=COUNT_MAX, description="use the first N examples (None: all)")
    chunk_size: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "examples per vectorised chunk (None: hooks 16; vmap 4 on CPU, where larger is slower, 32 on GPU)"))
    method: Literal["auto", "hooks", "vmap", "loop"] = Field("auto", description=(
        "auto (hooks when every tensor sits in a Linear/Conv1D/LayerNorm/RMSNorm/Embedding, else vmap) | "
        "hooks | vmap | loop (reference)"))
    seed: Seed = Field(0, description="seed of the labels drawn for kind=sampled")


def body_names(scorer: Scorer) -> list[str]:
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
    return sorted(chosen, key=text_length)


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


def fisher_diagonal(scorer: Scorer, examples: list[Example], config: FisherConfig | None = None, *,
                    names: list[str] | None = None, progress: bool | str = False,
                    **overrides) -> dict[str, torch.Tensor]:
    """Diagonal Fisher ``{name: tensor}`` (float32, CPU, mean over the N examples) of the named parameters.

    ``names`` defaults to every tensor of ``scorer.model``; keyword ``overrides`` set fields of
    :class:`FisherConfig` (e.g. ``kind="true"``, ``n_examples=100``, ``method="loop"``).
    """
    config = config or FisherConfig()
    if overrides:
        bad = [k for k in overrides if k not in FisherConfig.model_fields]
        if bad:
            raise SkillgraftError(f"fisher: unknown option(s) {bad}; known: {list(FisherConfig.model_fields)}")
        config = FisherConfig.build({**config.model_dump(), **overrides}, where="fisher")
    if config.method == "loop":
        return fisher_loop(scorer, examples, config, names=names, progress=progress)
    if config.method in ("auto", "hooks"):
        owners = _hook_owners(scorer, _check_names(scorer, names))
        if owners is not None:
            return _fisher_hooks(scorer, examples, config, owners, progress=progress)
        if config.method == "hooks":
            raise SkillgraftError("fisher method 'hooks' needs every tensor inside a Linear, Conv1D, LayerNorm, "
                                  "an RMSNorm of the family table or Embedding, and no tensor shared by two modules "
                                  "(tied embeddings); use method 'vmap' for the others")
    return _fisher_vmap(scorer, examples, config, names=names, progress=progress)


def fisher_traces(scorer: Scorer, examples: list[Example], config: FisherConfig | None = None, *,
                  names: list[str] | None = None, progress: bool | str = False) -> dict[str, float]:
    """``{name: Σ_j F_jj over the tensor}``: the Fisher mass of each tensor (what the ``sum`` FIM score adds up).

    With the hooks path the per-example gradients of Linear weights are never formed (see
    :func:`_accumulate_squares`); otherwise (method ``loop``/``vmap``, or a model the hooks do not cover)
    it sums :func:`fisher_diagonal`.
    """
    config = config or FisherConfig()
    if config.method in ("auto", "hooks"):
        owners = _hook_owners(scorer, _check_names(scorer, names))
        if owners is not None:
            traces = _fisher_hooks(scorer, examples, config, owners, progress=progress, trace=True)
            return {n: float(t) for n, t in traces.items()}
    return {n: float(t.double().sum()) for n, t in fisher_diagonal(scorer, examples, config, names=names,
                                                                   progress=progress).items()}


def _hook_kind(module) -> str | None:
    """Which closed form gives this module's per-example gradients (None: not hookable)."""
    if isinstance(module, torch.nn.Linear):
        return "linear"
    if isinstance(module, torch.nn.LayerNorm):
        return "layernorm"
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    kind = layer_kind(module)  # the family table: GPT-2's Conv1D, the RMS norms (y = (offset + w) ⊙ x̂)
    if kind is not None and (kind[0] == "conv1d" or _norm_eps(module) is not None):
        return kind[0]
    return None


def _norm_eps(module) -> float | None:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return float(eps) if isinstance(eps, (int, float)) else None


def _hook_owners(scorer, names: list[str]) -> dict | None:
    """``{module: {param_name: full_name}}`` when every name sits in a hookable module, else None.

    A tensor used by two modules (a tied embedding/decoder) gets one gradient from both uses, which the
    per-module closed forms cannot add up before squaring: None then too.
    """
    wanted, owners = set(names), {}
    params = dict(scorer.named_parameters())
    uses: dict[int, int] = {}
    for module in scorer.modules():
        for p in module.parameters(recurse=False):
            uses[id(p)] = uses.get(id(p), 0) + 1
    if any(uses.get(id(params[n]), 0) > 1 for n in names):
        return None
    for mod_name, module in scorer.named_modules():
        if _hook_kind(module) is not None:
            for pname, _ in module.named_parameters(recurse=False):
                full = f"{mod_name}.{pname}" if mod_name else pname
                if full in wanted:
                    owners.setdefault(module, {})[pname] = full
    covered = {full for d in owners.values() for full in d.values()}
    return owners if covered == wanted else None


def _accumulate_squares(module, x: torch.Tensor, delta: torch.Tensor, totals: dict[str, torch.Tensor], *,
                        trace: bool = False, output: torch.Tensor | None = None) -> None:
    """``totals[p] += Σ_i g_i(p)²`` for the per-example gradients g_i of one layer, from its input x and δ
    (``trace=True``: ``totals[p] += Σ_i ‖g_i(p)‖²``, a scalar per tensor).

    Linear: g_i = Σ_t δ_itᵀ x_it, one small matmul per example into a reused buffer and a fused
    square-add (on CPU this runs ~5× faster than one ``bmm`` over the chunk followed by ``pow``/``sum``,
    which streams B copies of the weight through memory); Conv1D (GPT-2): its transpose; LayerNorm /
    RMSNorm: Σ_t δ_it ⊙ x̂_it for the weight; Embedding: δ rows summed per (example, token id), so only
    the rows an example uses are touched. Biases: Σ_t δ_it. For traces of Linear/Conv1D weights the
    per-example gradient is never formed: ‖δ_iᵀ x_i‖²_F = ⟨δ_i δ_iᵀ, x_i x_iᵀ⟩ costs T²·(in + out) instead
    of T·in·out (Goodfellow, 2015), used whenever it is the cheaper of the two.
    """
    kind = _hook_kind(module)
    b = x.shape[0]
    delta = delta.reshape(b, -1, delta.shape[-1]).float()
    def add(name: str, squares: torch.Tensor) -> None:
        totals[name].add_(squares.sum() if trace else squares.sum(0))

    if "bias" in totals:
        add("bias", delta.sum(1).pow(2))
    if "weight" not in totals:
        return
    total = totals["weight"]
    if kind == "embedding":
        ids = x.reshape(b, -1)
        if output is not None and not _close_to(output, module.weight.detach()[ids].reshape(output.shape)):
            raise _NotPerExample  # a table whose output is not W[ids] (Gemma scales it by √d): vmap
        keep = ids != module.padding_idx if module.padding_idx is not None else torch.ones_like(ids, dtype=torch.bool)
        rows = torch.arange(b, device=ids.device).unsqueeze(1).expand_as(ids)[keep]
        keys, where = torch.unique(rows * module.num_embeddings + ids[keep], return_inverse=True)
        per_row = torch.zeros(len(keys), delta.shape[-1], device=delta.device).index_add_(0, where, delta[keep])
        if trace:
            total.add_(per_row.pow(2).sum())
        else:
            total.index_add_(0, keys % module.num_embeddings, per_row.pow(2))
        return
    x = x.reshape(b, -1, x.shape[-1]).float()
    if kind in ("layernorm", "rmsnorm"):
        if kind == "layernorm":
            xhat = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + module.eps)
        else:
            xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _norm_eps(module))
            if output is not None and not _is_rmsnorm(module, xhat, output):
                raise _NotPerExample  # the table's form is not this module's: vmap, exact for any module
        add("weight", (delta * xhat).sum(1).pow(2))
        return
    t, d_in, d_out = x.shape[1], x.shape[-1], delta.shape[-1]
    if trace and t * (d_in + d_out) < d_in * d_out:
        total.add_((torch.bmm(delta, delta.transpose(1, 2)) * torch.bmm(x, x.transpose(1, 2))).sum())
        return
    if trace:
        g = torch.bmm(delta.transpose(1, 2), x)
        total.add_(g.pow(2).sum())
        return
    buffer = torch.empty_like(total)
    for i in range(b):
        if kind == "linear":
            torch.mm(delta[i].T, x[i], out=buffer)
        else:  # conv1d: weight is [in, out]
            torch.mm(x[i].T, delta[i], out=buffer)
        total.addcmul_(buffer, buffer)


def _fisher_hooks(scorer, examples, config: FisherConfig, owners: dict, *, progress,
                  trace: bool = False) -> dict[str, torch.Tensor]:
    """Per-example gradients from ONE batched forward/backward per label target.

    Forward hooks keep each layer's input x and output; ``autograd.grad`` of Σ_i w_i·log p(·|x_i) with
    respect to the layer outputs gives every example's δ at once (examples do not interact), and the
    squared per-example parameter gradients follow in closed form (:func:`_accumulate_squares`).
    """
    examples = _examples(examples, config)
    device = scorer.device
    params = dict(scorer.named_parameters())
    total = {full: torch.zeros(() if trace else params[full].shape, dtype=torch.float32, device=device)
             for d in owners.values() for full in d.values()}
    per_module = {m: {pname: total[full] for pname, full in d.items()} for m, d in owners.items()}
    gen = torch.Generator().manual_seed(config.seed)
    chunk = config.chunk_size or 16
    seen: dict = {}
    rows = [0]  # examples in the current chunk
    checked: set = set()  # norms / tables whose output was checked against their closed form ((offset + w) ⊙ x̂)

    def keep(module, inputs, output):
        x = inputs[0].detach()
        if isinstance(module, torch.nn.Embedding):
            if not output.requires_grad:
                output.requires_grad_(True)  # frozen tables: the graph starts at their outputs
            if output.shape[0] == 1 and rows[0] > 1:  # position ids shared by the batch: one row per example
                x = x.expand(rows[0], *x.shape[1:])
                output = output.expand(rows[0], *output.shape[1:])
                seen[module] = (x, output)
                return output
        seen[module] = (x, output)

    handles = [m.register_forward_hook(keep) for m in owners]
    try:
        with _eval_frozen(scorer):
            for p in scorer.parameters():
                p.requires_grad_(False)
            for part, batch, labels in _chunks(scorer, examples, chunk, progress):
                if batch["input_ids"].shape[0] != len(part):  # rows are not examples (multi-token causal)
                    raise _NotPerExample
                seen.clear()
                rows[0] = len(part)
                with torch.enable_grad():
                    inputs_embeds_hook = scorer.model.get_input_embeddings().register_forward_hook(
                        lambda m, i, o: o.requires_grad_(True))
                    try:
                        logp = torch.log_softmax(scorer(**batch).float(), -1)
                    finally:
                        inputs_embeds_hook.remove()
                    weights = _targets(logp.detach().exp(), labels, config.kind, gen)  # [B, R, C]
                    mods = list(seen)
                    if any(seen[m][1].shape[0] != len(part) for m in mods):
                        raise _NotPerExample  # a layer whose rows are not the examples
                    outs = [seen[m][1] for m in mods]
                    for r in range(weights.shape[1]):
                        deltas = torch.autograd.grad((logp * weights[:, r]).sum(), outs, allow_unused=True,
                                                     retain_graph=r + 1 < weights.shape[1])
                        for m, d in zip(mods, deltas):
                            if d is not None:
                                _accumulate_squares(m, seen[m][0], d, per_module[m], trace=trace,
                                                    output=seen[m][1] if m not in checked else None)  # once
                                checked.add(m)
    except _NotPerExample:
        for h in handles:
            h.remove()
        handles = []
        diagonal = _fisher_vmap(scorer, examples, config, names=list(total), progress=progress)
        return {n: t.sum() for n, t in diagonal.items()} if trace else diagonal
    finally:
        for h in handles:
            h.remove()
    return {n: (t / len(examples)).cpu() for n, t in total.items()}


def _is_rmsnorm(module, xhat: torch.Tensor, output: torch.Tensor) -> bool:
    """Whether ``output`` is (offset + w) ⊙ x̂ with the family table's offset for this norm class (a wrong row, or a
    class computing something else, would give a wrong Fisher through the closed form)."""
    offset = layer_kind(module)[1]
    want = xhat * (offset + module.weight.detach().float())
    return _close_to(output, want.reshape(output.shape))


def _close_to(output: torch.Tensor, want: torch.Tensor) -> bool:
    """A hooked module's output equals the closed form's (within its precision)."""
    got, want = output.detach().float(), want.float()
    tol = 1e-4 if output.dtype == torch.float32 else 3e-2
    return bool(torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max().clamp(min=1.0))))


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
