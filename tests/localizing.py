"""What the localizer tests share: tiny (θ_pre, θ_ft) pairs trained by plain torch loops written here (so a region
depends only on the localizer code, never on skillgraft.train), a region's digest, and the checks that a
localization, finished or interrupted, gives the model back exactly as it found it."""

from __future__ import annotations

import hashlib
import socket

import torch

from skillgraft.data import load_kshot
from skillgraft.models import build_scorer


def adamw_pair(tiny_bert, toy_data):
    """(pre, ft, data): the tiny BERT in head mode and a copy trained by 40 steps of plain AdamW with dropout on, on
    the toy SST-2's 16-shot draw; the pair the reference regions were recorded on."""
    data = load_kshot("SST-2", 16, 13, toy_data)
    return (*trained_pair(tiny_bert, "head", data, steps=40, dropout=True), data)


def load_pair(tiny_bert, toy_data, saved):
    """:func:`adamw_pair` read back from ``saved``: ft's trained state, the gradients it was left holding and the
    global RNG state its training left."""
    data = load_kshot("SST-2", 16, 13, toy_data)
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    ft = build_scorer(str(tiny_bert), "SST-2", "head", head_seed=1)
    stored = torch.load(saved)
    ft.load_state_dict(stored["state"])
    for n, p in ft.named_parameters():
        p.grad = stored["grads"].get(n)
    torch.set_rng_state(stored["rng"])
    return pre, ft.eval(), data


def trained_pair(path, mode, data, dtype=None, steps=20, dropout=False):
    """(pre, ft) of any tiny model: ``ft`` moved by ``steps`` plain AdamW steps of 8 rows (embeddings frozen; the
    whole scorer in train mode with ``dropout``, else as it loaded), returned in eval mode."""
    pre = build_scorer(str(path), "SST-2", mode, dtype=dtype)
    ft = build_scorer(str(path), "SST-2", mode, dtype=dtype, head_seed=1)
    torch.manual_seed(0)
    opt = torch.optim.AdamW([p for n, p in ft.named_parameters() if "embed" not in n], lr=1e-3)
    if dropout:
        ft.train()
    for step in range(steps):
        batch = ft.collate([data.train[(step * 8 + i) % len(data.train)] for i in range(8)])
        labels = batch.pop("labels")
        torch.nn.functional.cross_entropy(ft(**batch).float(), labels).backward()
        opt.step()
        opt.zero_grad()
    return pre, ft.eval()


def digest(region) -> str:
    """16 hex digits of a region's tensor names and indices: equal digests, equal regions."""
    h = hashlib.sha256()
    for n in sorted(region.indices):
        h.update(n.encode())
        h.update(region.indices[n].to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:16]


def snapshot(model):
    """Everything a localization may touch and must give back: values, ``requires_grad``, train/eval modes and
    gradient checkpointing of every module."""
    return ({n: p.detach().clone() for n, p in model.named_parameters()},
            {n: p.requires_grad for n, p in model.named_parameters()}, [m.training for m in model.modules()],
            [(m.__dict__.get("gradient_checkpointing"), "_gradient_checkpointing_func" in m.__dict__)
             for m in model.modules()])


def assert_intact(model, snap):
    """``model`` is as :func:`snapshot` found it, bit for bit, and holds no gradient."""
    values, flags, modes, checkpointing = snap
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), values[n]), n
        assert p.requires_grad == flags[n], n
        assert p.grad is None, n
    assert [m.training for m in model.modules()] == modes
    assert [(m.__dict__.get("gradient_checkpointing"), "_gradient_checkpointing_func" in m.__dict__)
            for m in model.modules()] == checkpointing


class Interrupt:
    """A forward hook that presses Ctrl-C on the n-th forward pass with gradients on (a training step);
    ``grad_only=False`` counts every pass."""

    def __init__(self, n: int, grad_only: bool = True):
        self.n, self.seen, self.grad_only = n, 0, grad_only

    def __call__(self, module, inputs, output):
        if self.grad_only and not torch.is_grad_enabled():
            return
        self.seen += 1
        if self.seen == self.n:
            raise KeyboardInterrupt


def free_port() -> int:
    """A port nobody listens on now, for a process group's rendezvous (a fixed one can still be in TIME_WAIT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
