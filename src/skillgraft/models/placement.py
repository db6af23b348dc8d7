"""Placement: the one owner of where models run (``device``) and in which number format (``precision``).

    --device     auto (a GPU when one is visible, else the CPU) | cpu | cuda | cuda:N
    --precision  fp32        weights and compute in float32 (a bf16 checkpoint is upcast: exact)
                 bf16        weights, optimizer state and compute in bfloat16 (half the memory; an update
                             smaller than |w|/256 is lost in the rounding)
                 bf16-mixed  bf16 compute (autocast), fp32 weights and optimizer state: a small step accumulates
                 auto        bf16-mixed where the hardware computes bf16 natively (CUDA sm80+; a CPU with
                             avx512_bf16 or AMX), fp32 elsewhere (:func:`native_bf16`); reports and store keys
                             name the precision it resolved to
    --deterministic          deterministic kernels on a GPU (a run repeats bit for bit there; slower: NaN-filled
                             allocations, the math attention kernel in differentiated passes); CPU runs repeat
                             bit for bit without it

A verb activates its placement once (:func:`using`; the command line's ``--device`` / ``--precision``, a
``--config`` file or a recipe's ``device:`` / ``precision:``). Every model loaded while it is active is placed
when it is built (:meth:`Runtime.place`: the loaders read :func:`active`), and from then on everything runs
where the model is: batches, masks, anchors, candidate sets and indices follow the parameters
(:func:`device_of`), and a library call on a model the caller placed runs where the caller put it. Random draws
are taken on a CPU generator and then moved, so one seed gives the same region on either device.

Accelerate keeps its state per process (one device, one mixed-precision setting); :func:`accelerator_for`
gives an ``Accelerator`` on a model's own device, resetting that state between single-process runs on
different devices. Mixed precision is the Scorer's own autocast (:func:`forward_context`), not Accelerate's,
so evaluation, fine-tuning and localization compute alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from skillgraft.errors import SkillgraftError
from skillgraft.lazy import torch
from skillgraft.spec import OMITTED_AT_DEFAULT, Spec

Precision = Literal["fp32", "bf16", "bf16-mixed", "auto"]
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class Placement(Spec):
    """Where the models of one run live and in which precision they compute (resolved by :meth:`resolve`)."""

    device: str = Field("auto", description="where models run: auto (a GPU when one is visible, else the CPU) | cpu | "
                                            "cuda | cuda:N")
    precision: Precision = Field("fp32", description="fp32 | bf16 (weights and compute) | bf16-mixed (bf16 compute, "
                                                     "fp32 weights and optimizer state) | auto (bf16-mixed where the "
                                                     "hardware computes bf16 natively, else fp32)")
    deterministic: bool = Field(False, json_schema_extra=OMITTED_AT_DEFAULT, description=(
        "deterministic kernels on a GPU: a run repeats bit for bit there (slower; CPU runs repeat without it)"))

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        v = str(v).strip().lower()
        if not _DEVICE.match(v):
            raise ValueError("expected auto, cpu, cuda or cuda:N")
        return v

    def resolve(self) -> Runtime:
        """The torch device and dtype this placement means on this machine; a GPU asked for and not visible is one
        line. Under ``accelerate launch`` (``LOCAL_RANK`` set) ``auto``/``cuda`` is the process's own GPU."""
        want = self.device
        cuda = torch.cuda.is_available()
        forked = cuda and torch.cuda._is_in_bad_fork()  # a child forked after its parent started CUDA: none here
        if want == "auto":
            want = "cuda" if cuda and not forked else "cpu"
        if want.startswith("cuda"):
            if not cuda:
                raise SkillgraftError(f"--device {self.device}: no CUDA device is visible on this machine "
                                      "(use --device cpu or auto)")
            if forked:
                raise SkillgraftError(f"--device {self.device}: this process was forked after its parent started "
                                      "CUDA, which cannot start again in it (start it with spawn, or use --device cpu)")
            index = int(want.split(":")[1]) if ":" in want else int(os.environ.get("LOCAL_RANK", "0") or 0)
            if index >= torch.cuda.device_count():
                raise SkillgraftError(f"--device {self.device}: this machine has {torch.cuda.device_count()} "
                                      "CUDA device(s)")
            device = torch.device("cuda", index)
        else:
            device = torch.device("cpu")
        precision = self.precision
        if precision == "auto":
            precision = "bf16-mixed" if native_bf16(device) else "fp32"
        return Runtime(device, precision, self.deterministic, auto=self.precision == "auto")


def native_bf16(device) -> bool:
    """Whether ``device`` computes bf16 natively: a CUDA GPU of compute capability 8.0 or later, or a CPU whose flags
    (``/proc/cpuinfo``) include ``avx512_bf16`` or ``amx_bf16``."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"})


def _cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


@dataclass(frozen=True)
class Runtime:
    """A resolved placement: a torch device and a precision."""

    device: torch.device
    precision: str = "fp32"
    deterministic: bool = False
    auto: bool = False  # the precision was chosen by ``auto``

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype: bf16 only in pure ``bf16``; ``bf16-mixed`` keeps fp32 weights."""
        return torch.bfloat16 if self.precision == "bf16" else torch.float32

    def place(self, module):
        """Move ``module`` to this device and cast its floating-point parameters and buffers to :attr:`dtype`
        (in place; a no-op when it is already there); a Scorer also learns its precision (its autocast)."""
        module.to(device=self.device, dtype=self.dtype)
        with contextlib.suppress(AttributeError):
            module.precision = self.precision
        return module

    def describe(self) -> str:
        """``cuda:0 (NVIDIA H200), bf16-mixed`` / ``cpu, fp32``: what every report names."""
        return f"{describe_device(self.device)}, {self.precision}" + (" (auto)" if self.auto else "")

    def as_dict(self) -> dict:
        return {"device": str(self.device), "device_name": describe_device(self.device), "precision": self.precision,
                **({"precision_asked": "auto"} if self.auto else {}),
                **({"deterministic": True} if self.deterministic else {})}


def describe_device(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


_ACTIVE: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar("skillgraft_placement", default=None)


def active() -> Runtime | None:
    """The placement of the run in progress (None outside one: models load as transformers loads them and stay
    where the caller puts them)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(placement: Placement | Runtime | None) -> Iterator[Runtime | None]:
    """Activate ``placement`` for the block (a verb's whole run); None leaves the current one."""
    if placement is None:
        yield active()
        return
    runtime = placement.resolve() if isinstance(placement, Placement) else placement
    determined = torch.are_deterministic_algorithms_enabled()
    if runtime.device.type == "cuda":
        torch.cuda.set_device(runtime.device)
        if runtime.deterministic:
            deterministic()
    token = _ACTIVE.set(runtime)
    try:
        yield runtime
    finally:
        _ACTIVE.reset(token)
        if runtime.device.type == "cuda" and not determined:
            torch.use_deterministic_algorithms(False)


def deterministic() -> None:
    """Deterministic kernels on a GPU (an embedding's backward, index_add: sorted instead of atomic adds), so a run
    repeats bit for bit and a resumed run equals an uninterrupted one there too (docs/gpu.md); an op with no
    deterministic kernel runs as it is (no error, no warning line). Opt-in (``--deterministic``): by default a GPU
    run uses the fast kernels (flash / memory-efficient attention backwards, no NaN fill of new allocations)."""
    import warnings  # noqa: PLC0415

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts in this process
    warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")
    torch.use_deterministic_algorithms(True, warn_only=True)


def load_dtype(dtype=None, runtime: Runtime | None = None):
    """The dtype a loader passes to ``from_pretrained``: the one asked for, else the run's ``runtime`` (passed down
    from the verb), else the active placement's (None outside a placement: the checkpoint's own)."""
    if dtype is not None:
        return dtype
    runtime = runtime if runtime is not None else active()
    return runtime.dtype if runtime is not None else None


def place(module, runtime: Runtime | None = None):
    """Place a freshly loaded model under the run's ``runtime`` (passed down from the verb), else the active
    placement (a no-op outside one)."""
    runtime = runtime if runtime is not None else active()
    return runtime.place(module) if runtime is not None else module


def boundary(runtime: Runtime | None = None) -> Runtime | None:
    """A verb's placement, read once where the verb starts: the one its caller passed, else the one the command line
    activated (:func:`using`); below the verb it is passed down explicitly (loaders, the Workbench, store keys)."""
    return runtime if runtime is not None else active()


def device_of(module) -> torch.device:
    """Where ``module``'s parameters are (the CPU for a module without any)."""
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


def precision_of(module) -> str:
    """A model's precision: what its placement set, else read from its parameters (bf16 weights: ``bf16``)."""
    set_ = getattr(module, "precision", None)
    if isinstance(set_, str):
        return set_
    for p in module.parameters():
        return "bf16" if p.dtype == torch.bfloat16 else "fp32"
    return "fp32"


def attention_backends(device, differentiated: bool = False) -> list | None:
    """The attention kernels (``scaled_dot_product_attention``) a forward pass on ``device`` may use; ``None``
    (PyTorch's own choice) off CUDA. On CUDA never cuDNN's, which builds an execution graph for each new (batch,
    length) shape, paid again for every padded length a task's batches take (bf16 evaluation on an H200 ran at 101
    rows/s against 1,449 in fp32, whose kernel needs no build; bench/RESULTS.md). A pass that will be
    ``differentiated`` while deterministic kernels are on (a CUDA placement, :func:`deterministic`) gets the math
    kernel alone: the flash and memory-efficient backwards add with atomics unless determinism is strict, which
    would break "a run repeats bit for bit"; it costs memory quadratic in the length, which the short prompts of
    classification tasks do not feel."""
    if torch.device(device).type != "cuda":
        return None
    from torch.nn.attention import SDPBackend  # noqa: PLC0415

    if differentiated and torch.are_deterministic_algorithms_enabled():
        return [SDPBackend.MATH]
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def recompute_contexts() -> tuple:
    """``context_fn`` for ``torch.utils.checkpoint``: a block recomputed in the backward pass (outside any forward
    context) runs with the attention kernels its forward pass had, so it computes the same thing the same way."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    flags = {SDPBackend.FLASH_ATTENTION: torch.backends.cuda.flash_sdp_enabled(),
             SDPBackend.EFFICIENT_ATTENTION: torch.backends.cuda.mem_efficient_sdp_enabled(),
             SDPBackend.MATH: torch.backends.cuda.math_sdp_enabled(),
             SDPBackend.CUDNN_ATTENTION: torch.backends.cuda.cudnn_sdp_enabled()}
    return contextlib.nullcontext(), sdpa_kernel([b for b, on in flags.items() if on])


@contextlib.contextmanager
def forward_context(module) -> Iterator[None]:
    """The context of every forward pass of ``module``: bf16 autocast on its device under ``bf16-mixed``, and on
    CUDA the attention kernels of :func:`attention_backends` (differentiated: grad mode is on); nothing on a CPU in
    fp32 or bf16."""
    device = device_of(module)
    with contextlib.ExitStack() as stack:
        backends = attention_backends(device, differentiated=torch.is_grad_enabled())
        if backends is not None:
            from torch.nn.attention import sdpa_kernel  # noqa: PLC0415

            stack.enter_context(sdpa_kernel(backends))
        if precision_of(module) == "bf16-mixed":
            stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
        yield


def to_device(batch: dict, device) -> dict:
    """A collated batch on ``device`` (non-blocking from pinned memory is not worth it for token ids)."""
    return {k: v.to(device) for k, v in batch.items()}


def describe_module(module) -> str:
    """``cuda:0 (NVIDIA H200), bf16-mixed``: where a model runs, as reports name it."""
    return f"{describe_device(device_of(module))}, {precision_of(module)}"


@contextlib.contextmanager
def offloaded(module):
    """``module`` on the CPU for the block, back on its accelerator after (in place: the same Parameter objects):
    what a block reads only once (θ_ft while a graft is learned: its Δ is taken at the start) does not hold
    accelerator memory meanwhile. A module already on the CPU (or None) is left as it is."""
    if module is None or not isinstance(module, torch.nn.Module) or device_of(module).type == "cpu":
        yield module
        return
    home = device_of(module)
    module.to("cpu")
    if home.type == "cuda":
        torch.cuda.empty_cache()
    try:
        yield module
    finally:
        module.to(home)


def accelerator_for(module, **kwargs):
    """An ``accelerate.Accelerator`` on ``module``'s device. Accelerate's state is per process; in a single process
    (no launcher) a state left on another device by an earlier run is reset first, so a CPU run and a GPU run can
    follow each other in one process (the test suite, a notebook)."""
    from accelerate import Accelerator  # noqa: PLC0415
    from accelerate.state import AcceleratorState, PartialState  # noqa: PLC0415

    on_cpu = device_of(module).type == "cpu"
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    if not launched and PartialState._shared_state:
        state = PartialState()
        if (state.device.type == "cpu") != on_cpu or (not on_cpu and state.device != device_of(module)):
            AcceleratorState._reset_state(reset_partial_state=True)
    if not on_cpu and not launched:
        torch.cuda.set_device(device_of(module))
    return Accelerator(cpu=on_cpu, **kwargs)


__all__ = ["Placement", "Precision", "Runtime", "accelerator_for", "active", "attention_backends", "boundary",
           "describe_device", "describe_module", "device_of", "forward_context", "load_dtype", "native_bf16", "offloaded",
           "place", "precision_of", "recompute_contexts", "to_device", "using"]
