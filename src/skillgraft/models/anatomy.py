"""Parameter anatomy: which tensors a graft may cover, which travel whole, and a base model's identity.

A Scorer's parameters are ``model.*`` (the Hugging Face model) and, in head mode, ``head.*`` (a new task head that θ_pre
does not have). Graftable tensors are those a region γ may cover; *carried* tensors are a task head θ_pre does not have,
which travels whole with every graft: ``head.*`` in head mode, and in classifier mode the tensors the scorer declares
(``scorer.carried``: the checkpoint's classification head, ``model.classifier.*`` / ``model.score.*``, and a pooler the
pre-trained checkpoint lacks). Everything that needs to know this (grafting, Fisher, training, continual learning) asks
this module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from skillgraft.errors import SkillgraftError
from skillgraft.models.freezing import param_groups

if TYPE_CHECKING:
    import torch

    from skillgraft.models.scorer import Scorer

HEAD_PREFIX = "head."


def is_carried(name: str, scorer=None) -> bool:
    """A tensor of a task head θ_pre lacks (``head.*``, or one ``scorer`` declares carried); never graftable."""
    return name.startswith(HEAD_PREFIX) or (scorer is not None and name in getattr(scorer, "carried", ()))


Graftable = Literal["body", "body+embeddings", "all", "bias"]


def graftable_names(scorer: Scorer, which: Graftable = "body") -> list[str]:
    """Names of the tensors a region may cover.

    ``body``: transformer blocks + final norms/poolers; ``body+embeddings``; ``all`` (also the LM head);
    ``bias``: biases of the body. A new classification head (``head.*``) is never graftable: it is carried.
    """
    if which not in ("body", "body+embeddings", "all", "bias"):
        raise SkillgraftError(f"graftable must be body, body+embeddings, all or bias; got {which!r}")
    groups = param_groups(scorer)
    names = []
    for name, group in groups.items():
        if is_carried(name, scorer):
            continue
        if group == "embeddings" and which not in ("body+embeddings", "all"):
            continue
        if group == "head" and which != "all":
            continue
        if which == "bias" and not name.endswith("bias"):
            continue
        names.append(name)
    return names


def carried_names(scorer: Scorer) -> list[str]:
    """Tensors of a task head θ_pre lacks (a new head, or a classifier's own head and a pooler θ_pre lacks)."""
    return [n for n, _ in scorer.named_parameters() if is_carried(n, scorer)]


FINGERPRINT_SAMPLES = 8192  # values of each tensor the fingerprint hashes (evenly strided)


def fingerprinted(scorer: Scorer) -> list[tuple[str, torch.Tensor]]:
    """The base tensors :func:`fingerprint` hashes, in its order: ``scorer.model``'s parameters, carried ones left
    out."""
    carried = getattr(scorer, "carried", ())
    return [(name, p) for name, p in scorer.model.named_parameters() if "model." + name not in carried]


def fingerprint(scorer: Scorer, samples: Mapping[str, bytes] | None = None) -> str:
    """Content fingerprint of the base model's weights (``scorer.model``; carried head tensors excluded).

    sha256 over every tensor's name, shape, dtype and up to 8192 evenly strided values: cheap on big
    models, and any real change of base weights (another checkpoint, a different seed) changes it.
    ``samples``: each tensor's sampled bytes, already read (a cache, or the checkpoint files the model was loaded
    from, give the bytes :func:`tensor_sample` would without reading the tensor's memory); the rest are read.
    """
    h = hashlib.sha256()
    for name, p in fingerprinted(scorer):
        h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|".encode())
        h.update(samples[name] if samples is not None and name in samples else tensor_sample(p))
    return h.hexdigest()[:32]


def sample_positions(numel: int) -> range:
    """The flat positions of a tensor of ``numel`` values that :func:`fingerprint` hashes."""
    step = max(1, numel // FINGERPRINT_SAMPLES)
    return range(0, numel, step)[:FINGERPRINT_SAMPLES]


def tensor_sample(p) -> bytes:
    """The bytes :func:`fingerprint` hashes for tensor ``p``: its sampled values as float32."""
    flat = p.detach().reshape(-1)
    positions = sample_positions(flat.numel())
    return flat[positions.start:positions.stop:positions.step].float().cpu().contiguous().numpy().tobytes()


def check_compatible(pre: Scorer, ft: Scorer, names: list[str] | None = None) -> None:
    """Pre-trained and fine-tuned scorers must have the same tensors with the same shapes."""
    a, b = dict(pre.named_parameters()), dict(ft.named_parameters())
    missing = sorted(set(a) ^ set(b))
    if missing:
        raise SkillgraftError(
            f"pre-trained and fine-tuned models differ in architecture: {len(missing)} tensor(s) present in only "
            f"one of them, e.g. {missing[:3]}"
        )
    for name in names or a:
        if a[name].shape != b[name].shape:
            raise SkillgraftError(f"pre-trained and fine-tuned models differ in the shape of {name!r}: "
                                  f"{tuple(a[name].shape)} vs {tuple(b[name].shape)}")
