"""``--to gguf`` (and ``skillgraft apply --export FILE.gguf``): a graft on a GGUF base written back as one GGUF file
that llama.cpp (and Ollama, LM Studio, transformers' ``gguf_file=``) loads, with the graft intact.

    export_gguf(graft, base, "grafted.gguf")            # base: the graft's Scorer (loaded from the GGUF file)

Every metadata key of the base file is copied unchanged (tokenizer included; one key is added,
``skillgraft.graft``: where the file came from), and so is every tensor the graft does not touch, byte for byte in
the base's own encoding (Q4_K, Q6_K, Q8_0, …). A tensor the graft touches is written as θ_pre + γ⊙Δ — the base
file's own dequantized values outside the region, θ_ft's on it — at a precision that holds every one of those values
exactly (**the precision rule**, docs/export.md): the smallest type whose read-back equals the tensor bit for bit —

* the base's own blocks (Q4_K, Q6_K, Q8_0, …: every byte the base's but the grafted values' own quant bits,
  :mod:`skillgraft.export.gguf_blocks`) when every grafted value is a level of its block;
* else BF16 or F16 for a matrix whose values all lie on that grid (or the norm's own float type);
* else F32.

A fine-tuned Δ is mostly far below the resolution of Q4_K, Q8_0 or F16 (Gemma's is ~1e-6 of the weights' norm), so
on a quantized base the exact file usually holds the touched tensors as F32. ``--gguf-type base`` keeps the base's
types and size instead, each grafted value rounded to its block's nearest level (untouched values bit for bit);
``F16``, ``BF16``, ``Q8_0``, ``Q4_0`` re-quantize the touched matrices (norms stay F32, as llama.cpp computes them).
Each non-exact file's summary measures what survives — ``change_kept``, 1 − ‖written − grafted‖ / ‖grafted − θ_pre‖
over the grafted coordinates, and ``collateral``, how far the untouched values moved on that scale — and the CLI
warns in one line under :data:`KEPT_WARN`.

Tensor names and layouts are transformers' reading of the file in reverse: ``get_gguf_hf_weights_map`` names the
GGUF tensor of each parameter, and the architecture's tensor processor is inverted (llama's q/k row permutation,
Gemma's norms stored as 1 + w). Each touched tensor is checked twice before anything is written: the base file's
tensor read as transformers reads it equals θ_pre of the model the graft was applied to, and the tensor to be written,
read back the same way, gives the grafted values. For Gemma's norms the model computes with 1 + w, so the stored
value is fl(1 + w_grafted): bit for bit what the grafted model computes with (the w transformers reads back may differ
from w_grafted in its last bits, as it does for the base file's own norms).

Refused before any work, one line each: a graft whose base is a Hugging Face model (``--to hf``, then llama.cpp's
``convert_hf_to_gguf.py``), a base file that is not the graft's (fingerprint), a tensor type gguf-py does not know
or cannot dequantize, an architecture whose tensor layout is not inverted here, a carried task head (llama.cpp has
no place for it), an output that exists.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from skillgraft.errors import SkillgraftError
from skillgraft.export.base import ExportSpec, Exporter, _as_scorer, _check_base, check_export_target, human_size
from skillgraft.export.gguf_blocks import rerounded
from skillgraft.graft.graft import Graft
from skillgraft.io import atomic_path

GRAFT_KEY = "skillgraft.graft"
FLOATS = ("F32", "F16", "BF16")
# what --gguf-type may name: exact (the precision rule) or a type gguf-py writes
GGUF_TYPES = ("exact", "base", "F32", "BF16", "F16", "Q8_0", "Q4_0")
# --gguf-type base/…: a warning when the file keeps less than this share of the grafted change (1 − ‖missed‖/‖change‖)
KEPT_WARN = 0.9
HF_ROUTE = ("export it with --to hf and convert that folder with llama.cpp's convert_hf_to_gguf.py "
            "(the graft's tensors are then written at the converter's --outtype: use f32 to keep them)")


# ---------------------------------------------------------------------------------------------- the base file
@contextlib.contextmanager
def base_gguf_file(name: str) -> Iterator[Path]:
    """The GGUF file a graft's base model ``name`` was read from: a ``.gguf`` path, a folder holding one,
    ``gemma-3-270m`` (reassembled from its chunk packages into a temporary folder for the block's duration, sha256
    checked), or a folder skillgraft converted from a GGUF file that still exists. A Hugging Face model is refused."""
    from skillgraft.models import gguf as g  # noqa: PLC0415

    name = str(name or "")
    if name.lower() in g.GEMMA_ALIASES:
        try:
            package = __import__(g.GEMMA_PACKAGE)
        except ImportError:
            raise SkillgraftError(f"--to gguf on {g.GEMMA_NAME} needs its chunk packages; {g.EXTRA_HINT}") from None
        work = Path(tempfile.mkdtemp(prefix=".skillgraft-gguf-"))
        try:
            try:
                yield package.assemble(work / package.MODEL_NAME, overwrite=True)
            except (OSError, ValueError) as e:
                raise SkillgraftError(f"{g.GEMMA_NAME}: the chunk packages do not reassemble into the published "
                                      f"file ({e}); reinstall them: make gemma") from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    path = Path(name)
    if g.is_gguf(name):
        if not path.is_file():
            raise SkillgraftError(f"{path}: the graft's base GGUF file is not there; name it with --model FILE.gguf")
        yield path
        return
    if path.is_dir():
        found = None if (path / "config.json").is_file() else g.gguf_in_folder(path)
        if found is not None:
            yield found
            return
        source = path / g.SOURCE_FILE
        if source.is_file():
            info = json.loads(source.read_text())
            file = Path(info.get("file", ""))
            if file.is_file() and g._sha256(file) == info.get("sha256"):
                yield file
                return
            raise SkillgraftError(f"{path} was converted from the GGUF file {file}, which is no longer there (or "
                                  "has changed); name it with --model FILE.gguf")
    raise SkillgraftError(f"--to gguf writes a graft whose base is a GGUF file; this graft's base {name or '?'} is a "
                          f"Hugging Face model: {HF_ROUTE}")


def _read(path: Path):
    """gguf-py's reader on ``path`` and what the file is (architecture, quantization), read once per file content
    in a process (a 262k-token vocabulary takes gguf-py many seconds to parse). A file gguf-py cannot read gets
    skillgraft's one-line diagnosis (models/gguf.py); an unknown tensor type is said as such."""
    st = path.stat()
    return _read_cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read_cached(path: str, size: int, mtime_ns: int):
    from skillgraft.models.gguf import _require_gguf_package, open_reader  # noqa: PLC0415

    gguf = _require_gguf_package(f"--to gguf ({path})")
    reader = open_reader(path)  # its header walked and bounded first (models/headers.py): one line on damage
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise SkillgraftError(f"{path}: truncated GGUF file: tensor {t.name!r} ends at byte "
                                  f"{t.data_offset + t.n_bytes:,} of a {size:,}-byte file")

    def field(name, default=None):
        f = reader.fields.get(name)
        return f.contents() if f is not None else default

    arch = field("general.architecture")
    if not arch:
        raise SkillgraftError(f"{path}: GGUF file without general.architecture; not a model file")
    try:
        ftype = field("general.file_type")
        quant = gguf.LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_") if ftype is not None else None
    except ValueError:
        quant = None
    kinds = [t.tensor_type.name for t in reader.tensors]
    info = {"architecture": arch, "quantization": quant or max(set(kinds), key=kinds.count, default="?"),
            "heads": field(f"{arch}.attention.head_count"), "kv_heads": field(f"{arch}.attention.head_count_kv")}
    return reader, info


def _version(gguf) -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("gguf")
    except PackageNotFoundError:
        return getattr(gguf, "__version__", "?")


# ---------------------------------------------------------------------------------------------- layouts
class _Layout:
    """transformers' reading of one architecture's tensors (``TENSOR_PROCESSORS``), and its inverse."""

    def __init__(self, arch: str, info: dict):
        from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, Gemma2TensorProcessor,  # noqa
                                                              LlamaTensorProcessor, NemotronTensorProcessor,
                                                              TensorProcessor)

        cls = TENSOR_PROCESSORS.get(arch, TensorProcessor)
        kinds = {TensorProcessor: "plain", LlamaTensorProcessor: "qk-permuted", Gemma2TensorProcessor: "offset-norm",
                 NemotronTensorProcessor: "offset-norm"}
        if cls not in kinds:
            raise SkillgraftError(f"--to gguf does not write {arch!r} GGUF files yet (transformers reads their tensors "
                                  f"with {cls.__name__}, not inverted here); {HF_ROUTE}")
        self.kind = kinds[cls]
        # what transformers' config of the file gives the processors (only llama's reads it: the head counts)
        self.config = {"num_attention_heads": info.get("heads"), "num_key_value_heads": info.get("kv_heads")}
        if self.kind == "qk-permuted" and any(isinstance(v, (list, tuple)) for v in self.config.values()):
            raise SkillgraftError(f"--to gguf: this {arch!r} file gives per-layer head counts "
                                  f"({self.config}); not inverted here. {HF_ROUTE}")
        self.processor = cls(config=self.config)

    def offset(self, gguf_name: str) -> bool:
        """Stored as 1 + w and computed with as 1 + w (Gemma's, Nemotron's norms)."""
        return self.kind == "offset-norm" and "norm.weight" in gguf_name

    def read(self, a, gguf_name: str):
        """The parameter transformers makes of the dequantized GGUF array ``a``."""
        return self.processor.process(weights=a.copy(), name=gguf_name).weights

    def arrange(self, w, gguf_name: str):
        """The positions of parameter ``w`` (any dtype) in the GGUF tensor's layout: llama's q/k rows permuted as
        llama.cpp's converter does (transformers undoes it on reading), the identity otherwise."""
        if self.kind == "qk-permuted" and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
            heads = self.config.get("num_attention_heads")
            kv = self.config.get("num_key_value_heads")
            if None in (heads, kv):
                return w.copy()
            n = kv if ".attn_k." in gguf_name and kv != heads else heads
            return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape).copy()
        return w.copy()

    def write(self, w, gguf_name: str):
        """The GGUF array that :meth:`read` turns into ``w`` (float32); an offset norm's 1 + w is rounded once, to
        the value the model computes with."""
        import numpy as np  # noqa: PLC0415

        a = self.arrange(np.asarray(w, dtype=np.float32), gguf_name)
        return (a + np.float32(1)).astype(np.float32) if self.offset(gguf_name) else a


def _encode(a, qtype):
    """``a`` (float32, GGUF layout) as ``qtype``: the array to write and what it reads back as."""
    import gguf  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    data = gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), qtype)
    back = gguf.quants.dequantize(data, qtype).reshape(a.shape)
    return data, back


def _fits(shape, qtype) -> bool:
    import gguf  # noqa: PLC0415

    return len(shape) >= 2 and shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0


# bits per weight of the types the exact rule tries (gguf-py quantizes them), smallest first
_BITS = {"Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "Q8_0": 8.5, "BF16": 16, "F16": 16, "F32": 32}


def _exact_candidates(src, shape) -> list:
    """The float types that may hold a touched tensor bit for bit when the base's own blocks cannot
    (:func:`~skillgraft.export.gguf_blocks.rerounded` is tried first), smallest first; F32, which always does, is
    appended by the caller: BF16 and F16 for a matrix, the base's own float type for a norm (which llama.cpp computes
    in F32 otherwise). Another quantized type is not tried: the untouched values, on the base type's grid, almost
    never lie on its grid."""
    import gguf  # noqa: PLC0415

    q = gguf.GGMLQuantizationType
    kinds = [q.BF16, q.F16] if len(shape) >= 2 else []
    if src.name in FLOATS and src not in kinds:
        kinds.append(src)
    return sorted(kinds, key=lambda k: _BITS[k.name])


# ---------------------------------------------------------------------------------------------- the plan
def _plan(graft: Graft, reader, layout: _Layout, hf_model, gguf_type: str) -> dict[str, dict]:
    """Which GGUF tensor each graft tensor is, checked: present, readable, of a type gguf-py dequantizes."""
    import gguf  # noqa: PLC0415
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map  # noqa: PLC0415

    to_gguf = {hf: name for name, hf in get_gguf_hf_weights_map(hf_model, layout.processor).items()}
    tensors = {t.name: t for t in reader.tensors}
    readable = {q for q in gguf.GGMLQuantizationType if q.name in FLOATS} | set(gguf.quants._type_traits)
    plan = {}
    for name, idx in graft.region.indices.items():
        hf = name[len("model."):] if name.startswith("model.") else name
        g = to_gguf.get(hf)
        if g is None or g not in tensors:
            tied = " (tied to another tensor the file stores; graft that one)" if g is not None else ""
            raise SkillgraftError(f"graft tensor {name!r} has no tensor in the base GGUF file{tied}; "
                                  f"{HF_ROUTE}")
        t = tensors[g]
        if t.tensor_type not in readable:
            raise SkillgraftError(f"{g} is stored as {t.tensor_type.name}, a quantization type gguf "
                                  f"{_version(gguf)} cannot read back: the graft cannot be written into it")
        plan[name] = {"gguf": g, "hf": hf, "tensor": t, "coordinates": int(idx.numel())}
    return plan


def _write_tensor(entry: dict, graft: Graft, name: str, theta_pre, layout: _Layout, gguf_type: str) -> dict:
    """The grafted tensor in GGUF layout, encoded: the base file's values outside the region (bit for bit, as
    dequantized), the grafted ones on it; what type it was and is, and how many grafted coordinates the file holds
    exactly as the grafted model computes with them (``kept``)."""
    import gguf  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    t, g = entry["tensor"], entry["gguf"]
    a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    pre = layout.read(a, g)
    want = theta_pre.detach().cpu()
    if tuple(pre.shape) != tuple(want.shape) or not torch.equal(torch.from_numpy(pre).to(want.dtype), want):
        what = f"shape {pre.shape} vs {tuple(want.shape)}" if tuple(pre.shape) != tuple(want.shape) else "values"
        raise SkillgraftError(f"{g} of the base GGUF file does not read back as the model's {name} ({what} differ): "
                              "not the file this model was loaded from")
    idx = graft.region.indices[name].cpu().numpy()
    target = pre.astype(np.float32).reshape(-1).copy()
    target[idx] = graft.values[name].detach().float().cpu().numpy().reshape(-1)
    hit = np.zeros(target.size, dtype=bool)
    hit[idx] = True
    hit = layout.arrange(hit.reshape(pre.shape), g)
    intended = layout.write(target.reshape(pre.shape), g)  # what the grafted model computes with, in GGUF layout
    grafted = np.where(hit, intended, a).astype(np.float32)
    src = t.tensor_type
    data = back = None
    if gguf_type in ("exact", "base") and src.name not in FLOATS:  # the base's own blocks, only grafted values moved
        flat = np.flatnonzero(hit)
        edit = rerounded(t.data, src, flat, intended.reshape(-1)[flat])
        if edit is not None and (gguf_type == "base" or np.array_equal(edit[1], intended.reshape(-1)[flat])):
            data, kind = edit[0], src
            back = gguf.quants.dequantize(data, src).astype(np.float32).reshape(grafted.shape)
    if data is None:
        if gguf_type == "exact":  # the precision rule: the smallest type that holds the grafted tensor bit for bit
            kinds = _exact_candidates(src, grafted.shape)
        elif gguf_type == "base":  # a float base tensor keeps its type; a block type without per-value bits: F32
            kinds = [src] if src.name in FLOATS else []
        else:
            kind = getattr(gguf.GGMLQuantizationType, gguf_type)
            kinds = [kind] if _fits(grafted.shape, kind) or (kind.name in FLOATS and grafted.ndim >= 2) else []
        kinds.append(gguf.GGMLQuantizationType.F32)
        for kind in kinds:
            data, back = _encode(grafted, kind)
            if gguf_type != "exact" or np.array_equal(back, grafted):
                break
        if kind == gguf.GGMLQuantizationType.F32 and not np.array_equal(back, grafted):
            raise SkillgraftError(f"{g}: the grafted tensor does not read back as written (internal error)")
    kept = int(np.sum(back[hit] == intended[hit]))
    moved = (intended[hit] - a[hit]).astype(np.float64)
    miss = np.abs((back[hit] - intended[hit]).astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):  # each coordinate's share of its own change kept, in [0, 1]
        share = np.where(moved != 0, np.clip(1 - miss / np.abs(moved), 0, 1), (miss == 0).astype(np.float64))
    return {"gguf": g, "parameter": name, "from": src.name, "to": kind.name, "coordinates": entry["coordinates"],
            "kept": kept, "data": data, "qtype": kind,
            # the measured check: the grafted change missed, and the untouched values moved, in squared sums
            "change2": float(moved @ moved), "share": float(share.sum()), "missed2": float(np.sum((back[hit] - intended[hit]).astype(np.float64) ** 2)),
            "collateral2": float(np.sum((back[~hit] - a[~hit]).astype(np.float64) ** 2))}


# ---------------------------------------------------------------------------------------------- the export
def export_gguf(graft: Graft, base, out: str | os.PathLike, *, model: str | None = None, gguf_type: str = "exact",
                overwrite: bool = False, force: bool = False) -> dict:
    """Write the grafted model as one GGUF file ``out`` (see the module's docstring); returns its summary.

    ``base`` is the graft's Scorer (or plain HF model) loaded from the GGUF file — checked against the graft's
    fingerprint unless ``force`` — and ``model`` names that file (default: the graft's recorded base)."""
    check_gguf_export(graft, out, model, gguf_type, overwrite)
    scorer = _as_scorer(base)
    params = _check_base(graft, scorer, force)
    hf_model = scorer.model
    with base_gguf_file(model or graft.base_model) as path:
        reader, info = _read(path)
        if reader.endianess.name != sys.byteorder.upper():
            raise SkillgraftError(f"{path}: a {reader.endianess.name.lower()}-endian GGUF file; convert it to this "
                                  "machine's byte order first (gguf-py's gguf_convert_endian)")
        layout = _Layout(info["architecture"], info)
        plan = _plan(graft, reader, layout, hf_model, gguf_type)
        written = {e["gguf"]: _write_tensor(e, graft, name, params[name], layout, gguf_type)
                   for name, e in plan.items()}
        summary = _summary(graft, path, out, info, reader, written, gguf_type, force)
        summary["base"] = str(model or graft.base_model)
        _write(reader, info["architecture"], out, written, summary, overwrite)
        summary["bytes"] = Path(out).stat().st_size
        summary["size_ratio"] = summary["bytes"] / summary["base_bytes"]
    return summary


def check_gguf_export(graft: Graft, out, model: str | None, gguf_type: str = "exact", overwrite: bool = False) -> None:
    """The refusals that need no model, before any work: the output, a carried head, the base not a GGUF file,
    an unknown type."""
    if not str(out).lower().endswith(".gguf"):
        raise SkillgraftError(f"--to gguf writes one file: name it FILE.gguf (got {out})")
    check_export_target(graft, out, overwrite, model=model)
    if graft.carried:
        raise SkillgraftError(f"this graft carries a task head the base model lacks "
                              f"({', '.join(sorted(graft.carried))}); a GGUF file for llama.cpp has no place for it: "
                              "use --to hf or --to delta")
    if gguf_type not in GGUF_TYPES:
        raise SkillgraftError(f"unknown quantization type {gguf_type!r} for the grafted tensors; known: "
                              f"{', '.join(GGUF_TYPES)}")
    name = model or graft.base_model
    from skillgraft.models import gguf as g  # noqa: PLC0415

    if str(name or "").lower() in g.GEMMA_ALIASES:
        return  # the bundled file: checked by its sha256 when it is reassembled
    with base_gguf_file(name) as path:  # an HF model refused in one line
        _read(path)  # an unknown tensor type, a damaged file: one line


def _summary(graft, path, out, info, reader, written, gguf_type, force) -> dict:
    changed = {g: f"{w['from']} → {w['to']}" for g, w in written.items() if w["from"] != w["to"]}
    kept = sum(w["kept"] for w in written.values())
    change2 = sum(w["change2"] for w in written.values())
    missed = (sum(w["missed2"] for w in written.values()) / change2) ** 0.5 if change2 else 0.0
    collateral = (sum(w["collateral2"] for w in written.values()) / change2) ** 0.5 if change2 else 0.0
    return {"to": "gguf", "out": str(out), "base_file": str(path), "base_bytes": path.stat().st_size,
            "base_quantization": info["quantization"], "architecture": info["architecture"],
            "coordinates": graft.size, "kept": kept, "exact": kept == graft.size, "gguf_type": gguf_type,
            # the measured check: share of the grafted change (‖θ_graft − θ_pre‖ on the region) the file keeps, and
            # how far the untouched values moved, relative to that change
            "change_kept": 1.0 - missed, "collateral": collateral,
            # … and per coordinate: the mean over grafted coordinates of the share of its own change kept
            "share_kept": sum(w["share"] for w in written.values()) / max(1, graft.size),
            "tensors": len(reader.tensors), "touched": len(written), "copied": len(reader.tensors) - len(written),
            "changed_type": changed, "forced": bool(force),
            "written": {g: {k: w[k] for k in ("parameter", "from", "to", "coordinates", "kept")}
                        for g, w in written.items()},
            "format": "GGUF (llama.cpp): base tensors and metadata copied unchanged, grafted tensors re-encoded"}


def _write(reader, arch: str, out, written: dict, summary: dict, overwrite: bool = False) -> None:
    """The base file's fields and tensors, the grafted ones replaced, through a temporary file renamed into place
    (gguf-py's writer, as its gguf_new_metadata script copies a file) — without ``overwrite`` by the no-replace rename
    every writer uses (a second export to one path refused, not replacing the first)."""
    import gguf  # noqa: PLC0415

    with atomic_path(out, replace=overwrite) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
        alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
        if alignment is not None:
            writer.data_alignment = alignment.contents()
        for field in reader.fields.values():
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF.") or \
                    field.name == GRAFT_KEY:
                continue
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
        record = {k: summary[k] for k in ("coordinates", "kept", "gguf_type", "base_quantization")}
        record.update({"base_file_sha256": _sha(Path(summary["base_file"])), "tensors": {
            g: {"from": w["from"], "to": w["to"], "coordinates": w["coordinates"]} for g, w in written.items()}})
        writer.add_string(GRAFT_KEY, json.dumps(record, separators=(",", ":")))
        for t in reader.tensors:
            w = written.get(t.name)
            data, qtype = (w["data"], w["qtype"]) if w else (t.data, t.tensor_type)
            writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in reader.tensors:
            w = written.get(t.name)
            writer.write_tensor_data(w["data"] if w else t.data)
        writer.close()


def _sha(path: Path) -> str:
    from skillgraft.models.gguf import _sha256  # noqa: PLC0415

    return _sha256(path)


class GGUF(Exporter):
    """θ_pre + γ⊙Δ as one GGUF file: the base file copied, the grafted tensors written at a precision that keeps
    them (docs/export.md)."""

    summary = "one GGUF file llama.cpp runs: the base GGUF copied, grafted tensors at a precision that keeps them"
    container = "GGUF file"
    base_kind = "gguf"
    writes = "file"
    suffix = ".gguf"

    def refuse(self, graft: Graft, out, spec: ExportSpec) -> None:
        check_gguf_export(graft, out, spec.model, spec.gguf_type, spec.overwrite)

    def export(self, graft: Graft, base, out, spec: ExportSpec) -> dict:
        return export_gguf(graft, base, out, model=spec.model, gguf_type=spec.gguf_type, overwrite=spec.overwrite,
                           force=spec.force)

    def applied(self, summary: dict, out) -> list[tuple[str, str]]:
        return [*self.lines(summary), ("info", f"exported grafted model → {out} (GGUF: llama.cpp, or transformers' "
                                               "gguf_file=)")]

    def lines(self, summary: dict) -> list[tuple[str, str]]:
        out = []
        changed = summary["changed_type"]
        if changed:
            kinds: dict[str, int] = {}
            for v in changed.values():
                kinds[v] = kinds.get(v, 0) + 1
            out.append(("info", f"{len(changed)} of the {summary['touched']} grafted tensors changed type: "
                                + ", ".join(f"{k} ×{n}" for k, n in sorted(kinds.items()))))
        same = summary["touched"] - len(changed)
        if same:
            out.append(("info", f"{same} grafted tensor(s) kept their type"))
        out.append(("info", f"{summary['copied']} of {summary['tensors']} tensors and every metadata key copied from "
                            f"{summary['base']} unchanged"))
        out.append(("info", f"{human_size(summary['bytes'])} = {summary['size_ratio']:.3f} × the base file "
                            f"({human_size(summary['base_bytes'])}, {summary['base_quantization']})"))
        if not summary["exact"]:
            low = min(summary["change_kept"], summary["share_kept"])
            level = "warning" if low < KEPT_WARN else "info"
            out.append((level, f"--gguf-type {summary['gguf_type']}: the file keeps {summary['change_kept']:.1%} of "
                               f"the graft's change, a grafted coordinate {summary['share_kept']:.1%} of its own on "
                               f"average ({summary['kept']:,} of {summary['coordinates']:,} exactly; untouched values "
                               f"moved {summary['collateral']:.2f} × the change)"
                               f"{' — under ' + format(KEPT_WARN, '.0%') if level == 'warning' else ''}; "
                               "--gguf-type exact keeps it all"))
        return out
