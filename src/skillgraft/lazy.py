"""Heavy libraries (torch, numpy, matplotlib) imported on first use: ``skillgraft --help`` never imports them
(issue 37).

The command line builds every verb's options from typed specs that live beside the code using torch; a module
that writes ``from skillgraft.lazy import torch`` instead of ``import torch`` can be imported (its specs read,
its functions defined) without torch: ``torch`` is a stand-in that imports the real module at its first
attribute access (``torch.zeros``, ``torch.Tensor``) and from then on forwards to it. Nothing enters
``sys.modules`` until then, so ``tests/test_cli_help.py`` can check that ``skillgraft graft --help`` imports no
torch. A module-level use (a base class ``nn.Module``, a decorator ``@torch.no_grad()``) imports it at once:
such a module stays off the help's import path.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any


class LazyModule:
    """A stand-in for module ``name``, imported at its first attribute access."""

    __slots__ = ("_name", "_module", "_before")

    def __init__(self, name: str, before=None) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)
        object.__setattr__(self, "_before", before)  # run once before the import (e.g. choose a backend)

    def _load(self) -> ModuleType:
        module = object.__getattribute__(self, "_module")
        if module is None:
            before = object.__getattribute__(self, "_before")
            if before is not None:
                before()
            module = importlib.import_module(object.__getattribute__(self, "_name"))
            object.__setattr__(self, "_module", module)
        return module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._load(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:  # e.g. a test patching torch.cuda.is_available
        setattr(self._load(), attr, value)

    def __dir__(self) -> list[str]:
        return dir(self._load())

    def __repr__(self) -> str:
        module = object.__getattribute__(self, "_module")
        return repr(module) if module is not None else f"<lazy module {object.__getattribute__(self, '_name')!r}>"


def _agg() -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only: no display needed


if TYPE_CHECKING:  # type checkers and editors see the real modules
    import numpy as np
    import torch
    from matplotlib import pyplot as plt
    from torch import nn
    from torch.nn import functional as F
else:
    np = LazyModule("numpy")
    torch = LazyModule("torch")
    nn = LazyModule("torch.nn")
    F = LazyModule("torch.nn.functional")
    plt = LazyModule("matplotlib.pyplot", before=_agg)

__all__ = ["F", "LazyModule", "lazy_exports", "nn", "no_grad", "np", "plt", "quiet_transformers", "torch"]


def lazy_exports(package: str, exports: dict[str, str]):
    """A package's ``__getattr__`` (PEP 562) that imports each re-exported name's module on first use:
    ``from skillgraft.models import Scorer`` still works, while ``import skillgraft.models.spec`` no longer runs
    every sibling module (and their torch) first. ``exports``: name → the module defining it."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__


def quiet_transformers():
    """transformers imported with its logging set to errors only and its progress bars off; (its logging, the
    level before) so a caller can restore it."""
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    from transformers import dynamic_module_utils  # noqa: PLC0415

    # never ask "run the custom code? [y/N]" on stdin (a script piping `yes` would run a model folder's code):
    # models/vet.py refuses such folders first; this makes any other path refuse instead of prompting
    dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return hf_logging, level


def no_grad(fn):
    """``@torch.no_grad()`` for a plain function or method, importing torch only when it is called."""
    import functools  # noqa: PLC0415

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper
