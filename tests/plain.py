"""Reading skillgraft's graft files the way a user's own code would: safetensors + the JSON config, no skillgraft."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def write_graft_in(params: dict[str, torch.Tensor], folder: Path) -> dict[str, torch.Tensor]:
    """Write the graft in ``folder`` (graft.safetensors: packed flat ``indices`` over the tensors of
    graft_config.json's ``shapes``, in order, and their ``values``) into ``params`` (names without ``model.``);
    returns the graft's other tensors (``carried::…`` heads)."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "graft_config.json").read_text())
    tensors = load_file(str(folder / "graft.safetensors"))
    flat, start = tensors["indices"].long(), 0
    with torch.no_grad():
        for name, shape in cfg["shapes"].items():
            n = int(torch.Size(shape).numel())
            sel = (flat >= start) & (flat < start + n)
            params[name.removeprefix("model.")].view(-1)[flat[sel] - start] = tensors["values"][sel]
            start += n
    return {k: v for k, v in tensors.items() if k not in ("indices", "values")}
