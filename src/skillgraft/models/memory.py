"""Memory plans: what a verb will hold, per device, from a checkpoint's config and safetensors headers (no weights
loaded), against what is free (docs/scale.md, "Before any work: the memory plan").

:func:`shape_of` reads a folder's ``config.json`` and its safetensors headers (the first bytes of each file) into a
:class:`ModelShape`; the ``*_terms`` functions turn a shape and a verb's settings into :class:`Term`s (bytes each,
calibrated on the measurements in bench/RESULTS.md); :func:`free_memory` says what the device has free (the host:
``MemAvailable`` and what ``RLIMIT_AS`` leaves of the address space; CUDA: ``mem_get_info``; the environment
variable ``SKILLGRAFT_FREE_MEMORY`` stands in for both, e.g. ``20G``). A :class:`MemoryPlan` is the verdict, one
line when it does not fit. The choices (which layout, checkpointing) are the caller's (``pipeline/memory_plan.py``).
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from skillgraft.errors import SkillgraftError

GB = 1e9
FREE_ENV = "SKILLGRAFT_FREE_MEMORY"
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1}
# Activation bytes per token × hidden unit × block kept for the backward (bench/RESULTS.md, issue 12: Hugging Face
# Llama blocks in bf16; scaled with the compute dtype's size), and with checkpointing (each block's input, one
# block recomputed, the allocator's slack).
ACT_PER_BYTE, CKPT_PER_BYTE = 47, 8
SLACK = 1.10  # allocator fragmentation and what the estimate leaves out: planned totals are padded by 10 %


def _embedding(name: str) -> bool:
    return any("embed" in part or part in ("wte", "wpe", "shared") for part in name.split("."))


def _head(name: str) -> bool:
    return name.startswith("lm_head.") or ".lm_head." in name or name.startswith("output.")


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (its tensors' dtypes and shapes), read without the weights."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise SkillgraftError(f"{path}: not a safetensors file (header of {n} bytes)")
            return json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise SkillgraftError(f"{path}: unreadable safetensors header ({e})") from None


@dataclass(frozen=True)
class ModelShape:
    """What a plan needs of a checkpoint: parameter counts (all, the body, the largest body tensor), its stored
    dtype's size, and the config's hidden size, blocks and vocabulary."""

    params: int
    body: int
    largest: int
    stored_bytes: int    # bytes per parameter as stored (2: bf16/fp16)
    hidden: int
    layers: int
    vocab: int
    intermediate: int = 0
    file_bytes: int = 0  # the safetensors files' total size

    def weights(self, nbytes: int) -> int:
        return self.params * nbytes

    def as_dict(self) -> dict:
        return {"params": self.params, "body": self.body, "largest_body_tensor": self.largest,
                "stored_bytes": self.stored_bytes, "hidden": self.hidden, "layers": self.layers, "vocab": self.vocab}


def _config(folder: Path) -> dict:
    raw = json.loads((folder / "config.json").read_text())
    return raw.get("text_config") or raw


def shape_of(folder: str | os.PathLike) -> ModelShape | None:
    """The :class:`ModelShape` of a local checkpoint folder (``config.json`` + ``*.safetensors``); None when the folder
    holds neither (a hub name, ``pytorch_model.bin`` only): then no plan is made."""
    # a checkpoint folder, a skillgraft fine-tuning run (its saved scorer in model/) or a scorer folder
    for folder in (Path(folder), Path(folder) / "model", Path(folder) / "model" / "model"):
        files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
        if files and (folder / "config.json").is_file():
            break
    else:
        return None
    from skillgraft.untrusted import regular  # noqa: PLC0415

    params = body = largest = size = 0
    stored: dict[int, int] = {}
    headers = {}
    for f in files:
        regular(f, "a model checkpoint's file")  # a FIFO would block the read below, deaf to SIGTERM
        try:
            headers[f] = safetensors_header(f)
        except SkillgraftError:
            return None  # a damaged file: no plan; the loaders refuse it naming its role (models/headers.py)
    for f in files:
        size += f.stat().st_size
        for name, info in headers[f].items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            n = 1
            for d in info.get("shape", []):
                n *= int(d)
            params += n
            nbytes = DTYPE_BYTES.get(info.get("dtype"), 4)
            stored[nbytes] = stored.get(nbytes, 0) + n
            if not (_embedding(name) or _head(name)):
                body += n
                largest = max(largest, n)
    try:
        cfg = _config(folder)
    except (OSError, ValueError):
        return None
    hidden = int(cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("n_embd") or 0)
    layers = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers") or 0)
    return ModelShape(params, body, largest, max(stored, key=stored.get) if stored else 4, hidden, layers,
                      int(cfg.get("vocab_size") or 0), int(cfg.get("intermediate_size") or 4 * hidden), size)


def shape_of_model(model) -> ModelShape:
    """A :class:`ModelShape` of a model in memory (the library's ``candidates='auto'``)."""
    params = body = largest = 0
    for name, p in model.named_parameters():
        params += p.numel()
        if not (_embedding(name) or _head(name) or name.startswith("head.")):
            body += p.numel()
            largest = max(largest, p.numel())
    cfg = getattr(getattr(model, "model", model), "config", None)
    cfg = getattr(cfg, "text_config", None) or cfg
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    first = next(model.parameters())
    return ModelShape(params, body, largest, first.element_size(), hidden, int(getattr(cfg, "num_hidden_layers", 0)
                      or 0), int(getattr(cfg, "vocab_size", 0) or 0), int(getattr(cfg, "intermediate_size", 0) or 0))


# ---------------------------------------------------------------------------------------------------- terms
@dataclass(frozen=True)
class Term:
    """One thing a plan holds: its name, bytes, and how it was counted."""

    name: str
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class Work:
    """The batch a verb computes on: rows per forward and tokens per row (the longest a row may be)."""

    micro_batch: int
    tokens: int
    checkpointing: bool = False
    compute_bytes: int = 2

    @property
    def tokens_per_forward(self) -> int:
        return self.micro_batch * self.tokens


def activations(shape: ModelShape, work: Work, backward: bool = True) -> Term:
    """What a forward keeps for its backward (or, inference, the live hidden states and one block's MLP)."""
    t = work.tokens_per_forward
    if not backward:
        return Term("activations (inference)", t * (4 * shape.hidden + 2 * shape.intermediate) * work.compute_bytes,
                    f"{work.micro_batch} × {work.tokens} tokens")
    per = (CKPT_PER_BYTE if work.checkpointing else ACT_PER_BYTE) * work.compute_bytes
    note = f"{per} B × {work.micro_batch}·{work.tokens} tokens × h {shape.hidden} × {shape.layers} blocks"
    return Term("activations" + (" (checkpointed)" if work.checkpointing else ""),
                per * t * shape.hidden * shape.layers, note)


def logits(shape: ModelShape, work: Work, weight_bytes: int = 4, positions: int = 1) -> Term:
    """The vocabulary rows computed at scored positions (fp32 logits and their gradient); under bf16-mixed (fp32
    weights, bf16 compute) also the frozen output head's bf16 copy kept between forwards (models/logits.py)."""
    rows = work.micro_batch * positions * shape.vocab * 8
    if work.compute_bytes < weight_bytes:
        return Term("vocabulary rows + the head's bf16 copy", rows + shape.vocab * shape.hidden * work.compute_bytes,
                    f"V = {shape.vocab:,}; V × h {shape.hidden} × {work.compute_bytes} B")
    return Term("vocabulary rows", rows, f"V = {shape.vocab:,}")


def localization_terms(shape: ModelShape, *, weight_bytes: int, candidates: float | None, work: Work,
                       ft_resident: bool) -> list[Term]:
    """The learned localizer's terms (docs/scale.md's formula): θ_pre, θ_ft (when resident), the per-coordinate state
    (dense: S, γ held, Δ, θ_pre's snapshot, γ_base, the gradient and ∂L/∂S, the budgets' selection; candidates:
    19–25 bytes per candidate + one tensor's dense gradient and C's construction), activations and logits."""
    d = weight_bytes
    terms = [Term("θ_pre", shape.weights(d), f"{shape.params:,} × {d} B")]
    if ft_resident:
        terms.append(Term("θ_ft (in memory)", shape.weights(d), f"{shape.params:,} × {d} B"))
    if candidates is None:
        per = 21 + 2 * d
        terms.append(Term("localizer state (dense)", per * shape.body, f"{per} B × {shape.body:,} body coordinates"))
    else:
        per = 13 + 3 * d
        k = int(candidates * shape.body)
        terms.append(Term(f"localizer state (candidates c = {candidates:g})", per * k + (d + 8) * shape.largest,
                          f"{per} B × {k:,} candidates + one tensor's gradient and C's construction"))
    terms.append(activations(shape, work))
    terms.append(logits(shape, work, d))
    return terms


def finetune_terms(shape: ModelShape, *, weight_bytes: int, work: Work, adam_bytes: int = 8) -> list[Term]:
    """Full fine-tuning: weights, their gradient, Adam's two moments (fp32 unless pure bf16), activations, logits."""
    d = weight_bytes
    return [Term("weights", shape.weights(d)), Term("gradients", shape.weights(d)),
            Term("optimizer state (Adam)", shape.params * adam_bytes, f"{adam_bytes} B per parameter"),
            activations(shape, work), logits(shape, work, d)]


def fim_terms(shape: ModelShape, *, weight_bytes: int, work: Work) -> list[Term]:
    """Diagonal Fisher: weights, one gradient, the fp32 accumulator per parameter, activations, logits."""
    d = weight_bytes
    return [Term("weights", shape.weights(d)), Term("gradients", shape.weights(d)),
            Term("Fisher accumulator", shape.params * 4, "fp32 per parameter"), activations(shape, work),
            logits(shape, work, d)]


def inference_terms(shape: ModelShape, *, weight_bytes: int, work: Work, what: str = "θ_ft") -> list[Term]:
    """Scoring one model: its weights, a forward's live activations and the logits."""
    return [Term(what, shape.weights(weight_bytes)), activations(shape, work, backward=False),
            logits(shape, work, weight_bytes)]


def baseline_terms(shape: ModelShape, baselines: list[str], weight_bytes: int, lottery_backup: bool) -> list[Term]:
    """Report rows with memory of their own (docs/scale.md): random's permutation (16 B per body coordinate),
    top-movement's |Δ| (1× the body) and their selection, lottery-ticket-zero's body backup."""
    out = []
    if "random" in baselines:
        out.append(Term("random baseline", 24 * shape.body, "a permutation and ranks of the body (16 B) + selection"))
    for name in ("movement", "ties-trim"):
        if name in baselines:
            out.append(Term(f"{name} baseline", (weight_bytes + 8) * shape.body, "|Δ| over the body + selection"))
    if lottery_backup:
        out.append(Term("lottery-ticket-zero backup", weight_bytes * shape.body, "every body tensor backed up"))
    return out


# ---------------------------------------------------------------------------------------------------- free memory
def parse_bytes(text: str) -> int:
    """``20G``, ``512M``, ``1.5GB``, ``1e9`` → bytes (decimal units); one line when unreadable."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise SkillgraftError(f"{FREE_ENV}={text!r}: expected a size such as 20G or 512M")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    if m.group(3) and m.group(3).startswith("i"):
        scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2).lower()]
    try:
        return int(float(m.group(1)) * scale)
    except ValueError:
        raise SkillgraftError(f"{FREE_ENV}={text!r}: expected a size such as 20G or 512M") from None


def _meminfo(field_: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field_ + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass(frozen=True)
class Free:
    """What a device has free now, and where that figure comes from."""

    bytes: int
    source: str


def free_memory(device: str = "cpu") -> Free:
    """Free memory on ``device``: ``$SKILLGRAFT_FREE_MEMORY`` when set; the host: ``MemAvailable`` (/proc/meminfo),
    or what ``RLIMIT_AS`` leaves of this process's address space when that is less; CUDA: ``mem_get_info``."""
    given = os.environ.get(FREE_ENV)
    if given:
        return Free(parse_bytes(given), f"${FREE_ENV}")
    if str(device).startswith("cuda"):
        import torch  # noqa: PLC0415

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return Free(int(free), f"{device} mem_get_info")
    best = Free(_meminfo("MemAvailable") or 0, "MemAvailable")
    try:
        import resource  # noqa: PLC0415

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            left = max(0, soft - _vm_size())
            if not best.bytes or left < best.bytes:
                best = Free(left, f"RLIMIT_AS ({soft / GB:.1f} GB) less this process's {_vm_size() / GB:.1f} GB")
    except (ImportError, ValueError, OSError):
        pass
    return best


# ---------------------------------------------------------------------------------------------------- the plan
@dataclass
class Phase:
    """One stretch of a verb's work and what it holds at once."""

    name: str
    terms: list[Term]

    @property
    def total(self) -> int:
        return int(sum(t.bytes for t in self.terms) * SLACK)


@dataclass
class MemoryPlan:
    """A verb's memory plan: its phases (the peak is the largest), the device, what is free, the choices made."""

    verb: str
    device: str
    phases: list[Phase]
    free: Free
    choices: list[str] = field(default_factory=list)
    shape: ModelShape | None = None

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def estimate(self) -> int:
        return self.peak.total

    @property
    def fits(self) -> bool:
        return self.estimate <= self.free.bytes

    def to_dict(self) -> dict:
        return {"verb": self.verb, "device": self.device, "estimate_bytes": self.estimate,
                "free_bytes": self.free.bytes, "free_source": self.free.source, "fits": self.fits,
                "peak_phase": self.peak.name, "choices": self.choices,
                "shape": self.shape.as_dict() if self.shape else None,
                "phases": [{"name": p.name, "bytes": p.total, "terms": [
                    {"name": t.name, "bytes": t.bytes, "note": t.note} for t in p.terms]} for p in self.phases]}

    def line(self) -> str:
        return (f"memory plan ({self.device}): peak ≈ {self.estimate / GB:.1f} GB ({self.peak.name}), "
                f"{self.free.bytes / GB:.1f} GB free ({self.free.source})")

    def markdown(self) -> list[str]:
        """The plan as report.md shows it."""
        lines = ["## Memory plan", "", f"{self.line()}." + (f" {' '.join(self.choices)}" if self.choices else ""), "",
                 "| phase | term | GB | counted as |", "|---|---|---:|---|"]
        for p in self.phases:
            for t in p.terms:
                lines.append(f"| {p.name} | {t.name} | {t.bytes / GB:.2f} | {t.note} |")
            lines.append(f"| {p.name} | **total** (+{SLACK - 1:.0%} slack) | **{p.total / GB:.2f}** | |")
        return lines + [""]


def plan_dict(plan: MemoryPlan | None) -> dict | None:
    return None if plan is None else plan.to_dict()


__all__ = ["Free", "MemoryPlan", "ModelShape", "Phase", "Term", "Work", "activations", "baseline_terms",
           "finetune_terms", "fim_terms", "free_memory", "inference_terms", "localization_terms", "parse_bytes",
           "safetensors_header", "shape_of", "shape_of_model"]
