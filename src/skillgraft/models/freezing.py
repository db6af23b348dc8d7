"""Where parameters sit (blocks, embeddings, head), which ones train, and a model's train/eval mode held for a while.

Blocks are found by module structure — the longest ``nn.ModuleList`` of same-typed modules — never by
name prefixes (``layer.1`` is not a prefix match for ``layer.10`` here).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from skillgraft.lazy import nn

from skillgraft.errors import SkillgraftError


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block, and every sub-module's own mode given back after it, also on an
    error: ``model.train(was)`` would set every sub-module to the top's mode, and a scorer may hold a body in eval
    mode under a top in train mode (a Scorer just built: transformers' ``from_pretrained`` returns its model in eval
    mode, the new top module is in train mode; ``train(True)`` after a scoring switched the body's dropout on)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, was in modes:
            m.training = was


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of ``model``, in order (BERT, RoBERTa, GPT-2, Llama, …)."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best):
            kinds = {type(m) for m in module}
            if len(kinds) == 1:
                best = list(module)
    if not best:
        raise SkillgraftError(f"{type(model).__name__}: found no repeated transformer blocks")
    return best


def param_groups(scorer: nn.Module) -> dict[str, str]:
    """Map each parameter name of a Scorer to ``block:<i>``, ``embeddings``, ``head`` or ``other``.

    ``head`` is the classification head (head mode) or the LM output head (``lm_head``/MLM head, when it
    is not tied to the input embeddings); ``other`` holds final norms and poolers.
    """
    model = scorer.model if hasattr(scorer, "model") else scorer
    owner: dict[int, str] = {}
    for i, block in enumerate(transformer_blocks(model)):
        for p in block.parameters():
            owner[id(p)] = f"block:{i}"
    emb = model.get_input_embeddings()
    blocks_ids = set(owner)
    for module in model.modules():
        params = list(module.parameters())
        if isinstance(module, nn.Embedding) or (
            any(isinstance(m, nn.Embedding) for m in module.children())
            and not any(id(p) in blocks_ids for p in params)
            and module is not model
        ):
            for p in params:
                owner.setdefault(id(p), "embeddings")
    owner.setdefault(id(emb.weight), "embeddings")
    base = getattr(model, "base_model", model)
    base_ids = {id(p) for p in base.parameters()}
    head_ids = {id(p) for p in model.parameters()} - base_ids if base is not model else set()
    groups = {}
    for name, p in scorer.named_parameters():
        if name.startswith("head."):
            groups[name] = "head"
        elif id(p) in owner:
            groups[name] = owner[id(p)]
        elif id(p) in head_ids:
            groups[name] = "head"
        else:
            groups[name] = "other"
    return groups


def block_index(group: str) -> int | None:
    return int(group.split(":")[1]) if group.startswith("block:") else None


def freeze(scorer: nn.Module, *, embeddings: bool = False, head: bool = False, bias_only: bool = False,
           layers: list[int] | None = None) -> dict[str, bool]:
    """Set ``requires_grad`` by the rules and return ``{name: trainable}``.

    Args:
        embeddings: freeze the embeddings (the paper's default for SGD fine-tuning).
        head: freeze the head (LM head in prompt mode; never useful for a new classification head).
        bias_only: train only bias terms (BitFit).
        layers: train only these blocks (plus the head and what ``embeddings``/``head`` leave on).
    """
    groups = param_groups(scorer)
    n_blocks = 1 + max((block_index(g) for g in groups.values() if g.startswith("block:")), default=-1)
    if layers is not None:
        bad = [i for i in layers if not 0 <= i < n_blocks]
        if bad:
            raise SkillgraftError(f"layers {bad} out of range: the model has blocks 0..{n_blocks - 1}")
    trainable = {}
    for name, p in scorer.named_parameters():
        g = groups[name]
        on = True
        if embeddings and g == "embeddings":
            on = False
        if head and g == "head":
            on = False
        if layers is not None and g != "head" and block_index(g) not in layers:
            on = False
        if bias_only and not name.endswith("bias") and g != "head":
            on = False
        p.requires_grad_(on)
        trainable[name] = on
    return trainable
