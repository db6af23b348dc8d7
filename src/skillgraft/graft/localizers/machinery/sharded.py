"""Which part of each graftable tensor this process holds, and the collectives sharded localization uses.

One process (or several replicating the model, as with DDP) holds every tensor whole. Under FSDP2
(``torch.distributed.fsdp.fully_shard``: parameters become DTensors sharded along dim 0, ``torch.chunk``
style) each process holds rows [start, stop) of every tensor, i.e. the flat slice [first, first + n) of
it, and keeps S, Δ, θ_pre and the candidates of those rows only. Localization runs sharded when θ_pre is
already ``fully_shard``-ed, or under ``accelerate launch`` with an FSDP version-2 config (e.g.
``configs/fsdp2-cpu.yaml``), in which case :func:`shard` wraps each transformer block and the scorer.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers.machinery.topk import Collective


def is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor" or hasattr(t, "_local_tensor")


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is already ``fully_shard``-ed (any parameter is a DTensor)."""
    return any(is_dtensor(p) for p in model.parameters())


def fsdp_requested(accelerator) -> bool:
    """Launched with an FSDP2 config (``accelerate launch --config_file configs/fsdp2-cpu.yaml``)."""
    if accelerator.num_processes < 2:
        return False
    if str(accelerator.distributed_type).endswith("FSDP"):
        return True
    # On CPU Accelerate reports MULTI_CPU, but the launcher still exports the FSDP settings
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and os.environ.get("FSDP_VERSION") == "2"


def fsdp_launched() -> bool:
    """Launched on several processes with an FSDP config (read from the launcher's environment, no Accelerator)."""
    return (int(os.environ.get("WORLD_SIZE", "1")) > 1
            and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true")


def shard(scorer: torch.nn.Module, accelerator) -> None:
    """``fully_shard`` each transformer block of ``scorer.model`` (its ``_no_split_modules``), then the model.

    A new task head (``scorer.head``, small and carried whole by every graft) stays replicated.
    """
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    if os.environ.get("FSDP_VERSION", "2") != "2" and str(accelerator.distributed_type).endswith("FSDP"):
        raise SkillgraftError("sharded localization needs FSDP version 2 (fsdp_version: 2 in the accelerate config)")
    model = getattr(scorer, "model", scorer)
    blocks = set(getattr(model, "_no_split_modules", None) or [])
    mesh = init_device_mesh(accelerator.device.type, (accelerator.num_processes,))
    reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() != "false"
    scorer.to(accelerator.device)
    for module in list(model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)


def sum_gradients(model: torch.nn.Module) -> None:
    """Make every FSDP module *sum* its reduce-scattered gradients (the loss is already a sum over ranks)."""
    from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM / AVG


def reshard(model: torch.nn.Module) -> None:
    """Free every all-gathered parameter, so the next forward gathers the (edited) shards afresh.

    A backward pass reshards by itself; a no-grad forward may leave the root's parameters gathered.
    """
    from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


class Group(Collective):
    """The processes of one localization: ``world``, ``rank``, and whether tensors are sharded among them."""

    def __init__(self, world: int = 1, rank: int = 0, sharded: bool = False, device: str | torch.device = "cpu"):
        self.world, self.rank, self.sharded, self.device = world, rank, sharded, torch.device(device)

    def _reduce(self, value: int, op) -> int:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(t, op=op)
        return int(t[0])

    def sum(self, value: int) -> int:
        return self._reduce(value, torch.distributed.ReduceOp.SUM)

    def max(self, value: int) -> int:
        return self._reduce(value, torch.distributed.ReduceOp.MAX)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce (sum) ``tensor`` in place."""
        if self.world > 1:
            torch.distributed.all_reduce(tensor)
        return tensor

    def gather(self, obj) -> list:
        """Every process's ``obj``, in rank order."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    @property
    def topk(self) -> Group | None:
        """The collective a top-k over sharded coordinates needs (None: every process sees every coordinate)."""
        return self if self.sharded and self.world > 1 else None


@dataclass
class Piece:
    """The rows [start, stop) of graftable tensor ``name`` that this process holds: flat [first, first + numel)."""

    name: str
    param: torch.nn.Parameter
    shape: tuple[int, ...]
    start: int
    stop: int
    first: int
    numel: int

    def values(self) -> torch.Tensor:
        """The held values, flat; a view that writes through to the parameter (use under no_grad)."""
        local = self.param.to_local() if is_dtensor(self.param) else self.param
        return local.detach().view(-1)

    def grad(self) -> torch.Tensor | None:
        g = self.param.grad
        if g is None:
            return None
        return (g.to_local() if is_dtensor(g) else g).reshape(-1)


def pieces(model: torch.nn.Module, names: list[str], group: Group) -> dict[str, Piece]:
    """This process's Piece of each of ``names`` (whole tensors unless the model is sharded)."""
    params = dict(model.named_parameters())
    out = {}
    for n in names:
        p = params[n]
        shape = tuple(p.shape)
        numel = math.prod(shape)
        if not is_dtensor(p):
            if not p.is_contiguous():
                raise SkillgraftError(f"parameter {n!r} is not contiguous; localization edits it in place")
            out[n] = Piece(n, p, shape, 0, shape[0] if shape else 1, 0, numel)
            continue
        placements = list(p.placements)
        if len(placements) != 1 or getattr(placements[0], "dim", None) != 0 or not placements[0].is_shard():
            raise SkillgraftError(f"parameter {n!r} is sharded as {placements}; sharded localization supports "
                                  "fully_shard's default dim-0 sharding on a 1-d mesh")
        local = p.to_local()
        rows = shape[0]
        chunk = -(-rows // group.world)
        start = min(group.rank * chunk, rows)
        stop = min(start + chunk, rows)
        if local.shape[0] != stop - start or not local.is_contiguous():
            raise SkillgraftError(f"parameter {n!r}: unexpected local shard {tuple(local.shape)} of {shape} on rank "
                                  f"{group.rank}")
        inner = numel // rows if rows else 0
        out[n] = Piece(n, p, shape, start, stop, start * inner, (stop - start) * inner)
    return out
