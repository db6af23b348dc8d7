"""Non-finite values (NaN, ±Inf) are refused where they enter, named by file and position, never stored.

A NaN in a graft's values poisons every model it is applied to and every checkpoint exported from it, and
nothing downstream notices (an argmax of NaN logits is still a label). So each reader of weights from
outside (graft files, PEFT adapters, heads, checkpoints to graft) checks them on load, each writer checks
what it is about to store, and the training loops stop at the first non-finite loss.
"""

from __future__ import annotations

import math

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError


def first_non_finite(t: torch.Tensor, chunk: int = 1 << 22) -> tuple[int, float, int] | None:
    """(flat position, value, count) of the first non-finite value of ``t``; None when all are finite.

    Checked ``chunk`` values at a time: the temporaries are a few MB, never tensor-sized (a checkpoint's
    embedding matrix is checked without a copy of its size)."""
    if not (t.dtype.is_floating_point or t.dtype.is_complex) or not t.numel():
        return None
    flat = t.detach().reshape(-1)
    first, count = None, 0
    for start in range(0, flat.numel(), chunk):
        part = flat[start:start + chunk]
        finite = torch.isfinite(part)
        if bool(finite.all()):
            continue
        bad = ~finite
        count += int(bad.sum())
        if first is None:
            first = start + int(torch.nonzero(bad)[0, 0])
    if first is None:
        return None
    return first, float(flat[first]), count


def refuse_non_finite(t: torch.Tensor, what: str, why: str = "non-finite values are refused") -> None:
    """Raise a one-line :class:`SkillgraftError` naming ``what[position]`` and the value if ``t`` holds one."""
    found = first_non_finite(t)
    if found is not None:
        i, value, count = found
        more = f" ({count} non-finite values in all)" if count > 1 else ""
        raise SkillgraftError(f"{what}[{i}] is {value}{more}; {why}")


def refuse_non_finite_model(model: torch.nn.Module, where: str,
                            why: str = "a model with non-finite weights cannot be grafted (its fine-tuning "
                                       "diverged, or the file is damaged)") -> None:
    """Every parameter of ``model`` must be finite (a checkpoint read from outside: one pass over its weights)."""
    from skillgraft.heap import release_freed_memory  # noqa: PLC0415

    for name, p in model.named_parameters():
        refuse_non_finite(p, f"{where}: tensor {name!r}", why)
    release_freed_memory()  # the chunks' temporaries (tens of MB glibc would otherwise keep resident)


def check_loss(loss: torch.Tensor | float, what: str, step: int) -> float:
    """The loss as a float; a non-finite one stops ``what`` with one line (nothing of the run is stored)."""
    value = float(loss)
    if not math.isfinite(value):
        raise SkillgraftError(f"{what} stopped at step {step}: the loss is {value}; nothing was stored. Lower the "
                              "learning rate (--lr), or check the model and data for non-finite values")
    return value


class FirstNonFinite:
    """The first step whose loss is not finite, and that loss, kept on the device: a loop sees each step's loss
    without reading it (:meth:`see` gives the finiteness as a 0-d bool there, to gate the update) and :meth:`check`
    reads the record once, at the loop's read points (log, eval, save, end), stopping the run naming that step as a
    per-step check would."""

    def __init__(self, device):
        self.record = torch.zeros(2, device=device)  # (step, loss); step 0: none yet

    def see(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        loss = torch.as_tensor(loss, device=self.record.device).float()
        finite = torch.isfinite(loss)
        first = (self.record[0] == 0) & ~finite
        self.record.copy_(torch.where(first, torch.stack([torch.full_like(loss, float(step)), loss]), self.record))
        return finite

    def check(self, what: str) -> None:
        step, value = self.record.tolist()
        if step:
            check_loss(value, what, int(step))
