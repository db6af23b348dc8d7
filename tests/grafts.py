"""Grafts made directly, without localization (random coordinates of a noisy copy), and the exact comparison of
what is written for others with the grafted model's own weights (the export tests' reference)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from skillgraft.graft import Graft, Region, graftable_names
from skillgraft.models import build_scorer


def make_graft(path, mode, *, keep=lambda name: True, count=40, graftable="body", seed=0):
    """(pre, graft): a base scorer and a graft of ``count`` random coordinates per kept tensor of a "fine-tuned"
    copy (three noisy steps: as after real training, some θ_ft are no single fp32 addition away from θ_pre)."""
    pre = build_scorer(str(path), "SST-2", mode)
    ft = build_scorer(str(path), "SST-2", mode)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ft.parameters():
            for _ in range(3):
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    params = dict(pre.named_parameters())
    shapes = {n: tuple(params[n].shape) for n in graftable_names(pre, graftable)}
    idx = {n: torch.randperm(params[n].numel(), generator=gen)[:count] for n in shapes if keep(n)}
    return pre, Graft.from_models(pre, ft, Region(shapes, idx), {"task": "SST-2", "mode": mode})


def exported_weights(pre, graft, folder):
    """What ``skillgraft apply --export`` writes: the HF weights of the grafted model."""
    graft.export(pre, folder)
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(merged: dict, reference: dict, inexact: int = 0):
    """Bit-equal, except exactly ``inexact`` coordinates that no fp32 addition reaches (each within an ulp)."""
    assert set(reference) <= set(merged)
    differ = 0
    for k, ref in reference.items():
        diff = (merged[k].float() - ref.float()).abs()
        differ += int((diff > 0).sum())
        assert diff.max() <= torch.finfo(torch.float32).eps * max(1.0, float(ref.abs().max())), k
    assert differ == inexact, f"{differ} coordinates differ from the exported checkpoint, expected {inexact}"
