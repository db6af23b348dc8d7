"""Counting host reads (what makes a GPU wait for the host), on any device: the same rules as tests/test_engine.py's
(issue 45), shared here for the fine-tuning loop's tests (issue 75); and counting the aten ops a block dispatches
(:class:`Ops`: the swap's writes, tests/test_swap_fast.py, tests/test_routed_threads.py, bench/swap_flat.py)."""

from __future__ import annotations

import collections
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostReads(TorchDispatchMode):
    """Scalar reads (item, float, bool), nonzero, boolean-mask indexing, masked_select, unique; ``tolist``/``cpu``/
    ``numpy`` are counted by :func:`count_host_reads`."""

    SYNCING = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique", "aten.unique")

    def __init__(self, reads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        boolean_index = name.startswith(("aten.index.", "aten.index_put")) and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()) or ())
        if (name.startswith(self.SYNCING) or boolean_index) and not self.exempt():
            self.reads.append(name)
        return func(*args, **(kwargs or {}))

    @staticmethod
    def exempt() -> bool:
        """Reads that are no GPU sync or not skillgraft's: Adam's step count (a CPU tensor by design, when not
        capturable) and transformers' SDPA mask check (``padding_mask.all()``; open, docs/gpu.md)."""
        outside = [f.filename for f in traceback.extract_stack()[:-2] if "/torch/" not in f.filename or
                   f.filename.endswith("/torch/optim/adam.py")]
        return outside[-1].endswith(("/torch/optim/adam.py", "/transformers/masking_utils.py"))


def count_host_reads(monkeypatch, reads):
    for method in ("tolist", "cpu", "numpy"):
        real = getattr(torch.Tensor, method)
        monkeypatch.setattr(torch.Tensor, method, lambda self, *a, _real=real, _m=method, **k:
                            reads.append(_m) or _real(self, *a, **k))


class Ops(TorchDispatchMode):
    """Counts the aten ops dispatched inside the block (``ops``: op name → count)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))
