"""What a model folder may do to us: checked once per folder content before transformers reads any of it
(docs/reliability.md §19). Called wherever a model is opened (``models/loading.py``: :func:`model_reference`, the
loaders and the tokenizer; ``models/pair.read_config``), so every verb gets it.

* **no code from the folder**: a ``config.json`` / ``tokenizer_config.json`` with ``auto_map`` (classes in the
  folder's own ``.py`` files), or a ``model_type`` transformers does not implement, is refused — transformers would
  otherwise ask "run the custom code? [y/N]" on stdin, and a script piping ``yes`` would run it;
* **no pickle that runs code**: a folder whose weights are only pickles (``pytorch_model.bin``, ``*.pt``) has each
  read with weights-only loading under torch's floor (``untrusted.torch_load``); one that holds anything else is
  refused, never advising ``weights_only=False``;
* **no config that lies**: the fields that size a model are whole numbers in range (a string hidden size, 0 heads),
  ``id2label`` / ``label2id`` objects, token ids inside the vocabulary — and agree with the weights (the layer count,
  the vocabulary's rows): a config of 1 layer over weights of 2 was scored as the smaller model, a ``vocab_size`` of
  2³¹ over 30,522 rows allocated 256 GB;
* **tokenizer files of their shape**: ``tokenizer_config.json`` / ``special_tokens_map.json`` fields of their types
  (a class name, tokens as text), ``tokenizer.json`` an object with a ``model``, nested no deeper than a tokenizer is;
* **weight files that open** (:func:`check_weight_files`: a damaged safetensors file named with its role, before any
  weights load) and whether a folder has tokenizer files at all (:func:`lacks_tokenizer`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from skillgraft.errors import SkillgraftError

# What a tokenizer is saved as (any one of them); a folder with none has no tokenizer of its own.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "spm.model")
CODE_CONFIGS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                "feature_extractor_config.json", "image_processor_config.json", "video_preprocessor_config.json")
PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
COUNT_MAX = 2**31 - 1
# config fields that size a model: whole numbers ≥ 1 (None allowed where transformers derives a default)
SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
         "max_position_embeddings", "n_embd", "n_head", "n_layer", "n_positions", "n_ctx", "d_model", "num_heads",
         "num_layers", "d_ff", "d_kv", "num_labels", "embedding_size", "num_decoder_layers")
SIZES_OR_NONE = ("num_key_value_heads", "head_dim", "n_inner", "sliding_window")
COUNTS = ("type_vocab_size",)  # whole numbers ≥ 0
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id")
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")
EMBEDDINGS = ("word_embeddings.weight", "embed_tokens.weight", "wte.weight", "shared.weight", "embed_in.weight")
_LAYER = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# a tokenizer.json up to this size is parsed here for its shape (the attacks are small; a large vocabulary — Gemma's is
# 33 MB — is left to the tokenizers library, whose errors load_tokenizer turns into one line naming the folder)
TOKENIZER_PARSE_MAX = 4 << 20
_VETTED: dict[tuple, None] = {}


def _signature(folder: Path) -> tuple:
    """What the checks read: each file's name, size and modification time."""
    out = []
    for f in sorted(folder.iterdir()):
        if f.suffix in (".json", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".py"):
            try:
                st = f.stat()
            except OSError:
                continue
            out.append((f.name, st.st_size, st.st_mtime_ns))
    return (str(folder.resolve()), tuple(out))


def vet_folder(path: str | os.PathLike, who: str | None = None) -> None:
    """Refuse a local model folder that would run its own code, hold a pickle that runs code, or whose config or
    tokenizer files lie (module docstring): one line naming the file and the field, before transformers reads it.
    A hub name (no local folder) is left to :func:`model_reference`; checked once per folder content."""
    if not str(path) or not Path(path).is_dir():
        return
    from transformers import dynamic_module_utils  # noqa: PLC0415

    dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0  # transformers refuses instead of asking on stdin (lazy.py too)
    folder = Path(path)
    key = _signature(folder)
    if key in _VETTED:
        return
    role = f"{who}: " if who else ""
    try:
        _no_code(folder)
        config = _config(folder)
        headers = _weights(folder)
        if config is not None:
            _sizes(folder / "config.json", config)
            _agrees(folder / "config.json", config, headers or {})
        _tokenizer_files(folder)
    except SkillgraftError as e:
        raise SkillgraftError(f"{role}{e}") from None
    if headers is not None:  # (a damaged weight file: refused by check_weight_files, naming its role)
        _VETTED[key] = None


def _json(path: Path):
    from skillgraft.untrusted import read_json  # noqa: PLC0415

    return read_json(path)


def _no_code(folder: Path) -> None:
    code = sorted(f.name for f in folder.glob("*.py"))
    held = f" (the folder holds {', '.join(code[:3])}{' …' if len(code) > 3 else ''})" if code else ""
    for name in CODE_CONFIGS:
        file = folder / name
        if not file.is_file():
            continue
        obj = _json(file)
        if isinstance(obj, dict):
            for field in ("auto_map", "custom_pipelines"):
                if field in obj:
                    raise SkillgraftError(
                        f"{file}: field {field!r} maps this model's classes to Python code of its own{held}; "
                        "skillgraft never runs code from a model folder (no trust_remote_code): refused before "
                        "anything was loaded")
    config = folder / "config.json"
    if config.is_file():
        obj = _json(config)
        kind = obj.get("model_type") if isinstance(obj, dict) else None
        if isinstance(kind, str) and kind:
            from transformers import CONFIG_MAPPING, __version__  # noqa: PLC0415

            if kind not in CONFIG_MAPPING:
                raise SkillgraftError(f"{config}: field 'model_type' = {kind!r} is no architecture transformers "
                                      f"{__version__} implements{held}; skillgraft never runs code from a model "
                                      "folder: refused before anything was loaded")


def _config(folder: Path) -> dict | None:
    file = folder / "config.json"
    if not file.is_file():
        return None
    obj = _json(file)
    if not isinstance(obj, dict):
        raise SkillgraftError(f"{file}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _sizes(file: Path, cfg: dict) -> None:
    """The fields that size a model, of their types and ranges; label maps and token ids of theirs."""
    def bad(field, want):
        raise SkillgraftError(f"{file}: field {field!r} must be {want}, got {cfg[field]!r}"[:400])

    for field in ("model_type", "tokenizer_class"):
        if field in cfg and cfg[field] is not None and not isinstance(cfg[field], str):
            bad(field, "text")
    if "architectures" in cfg and cfg["architectures"] is not None and not (
            isinstance(cfg["architectures"], list) and all(isinstance(a, str) for a in cfg["architectures"])):
        bad("architectures", "a list of class names")
    for field in (*SIZES, *SIZES_OR_NONE):
        if field not in cfg or (cfg[field] is None and field in SIZES_OR_NONE):
            continue
        if not _whole(cfg[field]) or not 1 <= cfg[field] <= COUNT_MAX:
            bad(field, f"a whole number from 1 to {COUNT_MAX:,}")
    for field in COUNTS:
        if field in cfg and (not _whole(cfg[field]) or not 0 <= cfg[field] <= COUNT_MAX):
            bad(field, f"a whole number from 0 to {COUNT_MAX:,}")
    hidden, heads = cfg.get("hidden_size", cfg.get("n_embd")), cfg.get("num_attention_heads", cfg.get("n_head"))
    if _whole(hidden) and _whole(heads) and cfg.get("head_dim") is None and hidden % heads:
        field = "hidden_size" if "hidden_size" in cfg else "n_embd"
        raise SkillgraftError(f"{file}: field {field!r} = {hidden} is not a multiple of the {heads} attention heads "
                              "(and no 'head_dim' is given)")
    vocab = cfg.get("vocab_size")
    for field in TOKEN_IDS:
        value = cfg.get(field)
        ids = value if isinstance(value, list) else [value]
        if value is not None and not all(_whole(i) and (not _whole(vocab) or i < vocab) for i in ids):
            bad(field, f"a token id (a whole number{f' below the vocabulary size {vocab:,}' if _whole(vocab) else ''})"
                       " or null")
    id2label, label2id = cfg.get("id2label"), cfg.get("label2id")
    if id2label is not None and not (isinstance(id2label, dict) and all(
            re.fullmatch(r"\d+", str(k)) for k in id2label) and all(isinstance(v, (str, int)) for v in id2label.values())):
        bad("id2label", "an object from label indices (\"0\", \"1\", …) to label names")
    if label2id is not None and not (isinstance(label2id, dict) and all(_whole(v) for v in label2id.values())):
        bad("label2id", "an object from label names to label indices")
    for field in ("tie_word_embeddings", "is_decoder", "is_encoder_decoder"):
        if field in cfg and not isinstance(cfg[field], bool):
            bad(field, "true or false")


def _weights(folder: Path) -> dict[str, list[int]] | None:
    """The shapes the folder's weights hold (safetensors headers, bounded first), after refusing pickles that would
    run code; {} for a folder without safetensors, None when a header is damaged (``check_weight_files``
    refuses it where the model loads, naming the file's role)."""
    from skillgraft.models.headers import check_safetensors  # noqa: PLC0415

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        _pickles(folder)
        return {}
    shapes: dict[str, list[int]] = {}
    for f in files:
        try:
            header = check_safetensors(f)
        except SkillgraftError:
            return None
        shapes.update({name: t["shape"] for name, t in header.items() if name != "__metadata__"})
    return shapes


def _pickles(folder: Path) -> None:
    """Each pickle of a folder with no safetensors weights read weights-only (untrusted.torch_load, under torch's
    floor): one that holds anything but tensors, numbers and text is refused, never run."""
    from skillgraft.untrusted import PICKLE_REFUSED, refused_pickle, torch_load  # noqa: PLC0415

    for pattern in PICKLES:
        for f in sorted(folder.glob(pattern)):
            if f.name == "training_args.bin":
                continue  # transformers' Trainer's record, never read as weights
            if not _regular(f):
                raise SkillgraftError(f"{f}: not a regular file (a device, socket or pipe); expected a weight file")
            try:
                torch_load(f, mmap=True)
            except SkillgraftError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure of the unpickler: the file is not read
                if refused_pickle(e):
                    raise SkillgraftError(f"{f}: a pickle that {PICKLE_REFUSED}; save the model as safetensors "
                                          "(save_pretrained's default) from code you trust") from None
                if "mmap" not in str(e):
                    raise SkillgraftError(f"{f}: not a readable weights file ({(str(e).splitlines() or [''])[0]})"
                                          ) from None
                try:  # the legacy (non-zip) format cannot be memory-mapped
                    torch_load(f)
                except Exception as e2:  # noqa: BLE001
                    why = PICKLE_REFUSED if refused_pickle(e2) else "is not a readable weights file"
                    raise SkillgraftError(f"{f}: a pickle that {why}") from None


def _regular(path: Path) -> bool:
    import stat  # noqa: PLC0415

    return stat.S_ISREG(path.stat().st_mode)


def _agrees(file: Path, cfg: dict, shapes: dict[str, list[int]]) -> None:
    """The config's layer count and vocabulary size against the weights' tensors."""
    if not shapes:
        return
    layers = {int(m.group(1)) for name in shapes if (m := _LAYER.search(name))}
    field = next((f for f in LAYER_FIELDS if _whole(cfg.get(f))), None)
    if layers and field is not None and cfg[field] != len(layers) and not cfg.get("is_encoder_decoder"):
        raise SkillgraftError(f"{file}: field {field!r} = {cfg[field]}, but the weights hold {len(layers)} layers "
                              f"({min(layers)}–{max(layers)}): this config does not describe these weights (the "
                              f"model would be built with {cfg[field]} and scored as another model); refused")
    vocab = cfg.get("vocab_size")
    embedding = next((n for n in sorted(shapes) if n.endswith(EMBEDDINGS) and len(shapes[n]) == 2), None)
    if _whole(vocab) and embedding is not None and shapes[embedding][0] != vocab:
        raise SkillgraftError(f"{file}: field 'vocab_size' = {vocab:,}, but the weights' {embedding} has "
                              f"{shapes[embedding][0]:,} rows: this config does not describe these weights; refused")


def _token_ok(value) -> bool:
    return value is None or isinstance(value, str) or (isinstance(value, dict) and isinstance(value.get("content"), str))


def _tokenizer_files(folder: Path) -> None:
    from skillgraft.untrusted import TOO_DEEP, read_text  # noqa: PLC0415

    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = folder / name
        if not file.is_file():
            continue
        obj = _json(file)
        if not isinstance(obj, dict):
            raise SkillgraftError(f"{file}: expected a JSON object, got {type(obj).__name__}")
        if obj.get("tokenizer_class") is not None and not isinstance(obj["tokenizer_class"], str):
            raise SkillgraftError(f"{file}: field 'tokenizer_class' must be a class name (text), got "
                                  f"{obj['tokenizer_class']!r}"[:400])
        for field in SPECIAL_TOKENS:
            if field in obj and not _token_ok(obj[field]):
                raise SkillgraftError(f"{file}: field {field!r} must be a token (text, or an object with "
                                      f"'content'), got {obj[field]!r}"[:400])
        if "model_max_length" in obj and not isinstance(obj["model_max_length"], (int, float)):
            raise SkillgraftError(f"{file}: field 'model_max_length' must be a number, got "
                                  f"{obj['model_max_length']!r}"[:400])
        if "added_tokens_decoder" in obj and not isinstance(obj["added_tokens_decoder"], dict):
            raise SkillgraftError(f"{file}: field 'added_tokens_decoder' must be an object, got "
                                  f"{type(obj['added_tokens_decoder']).__name__}")
    file = folder / "tokenizer.json"
    if file.is_file() and file.stat().st_size <= TOKENIZER_PARSE_MAX:
        try:
            obj = json.loads(read_text(file))  # the C parser: a 262k-token vocabulary in a fraction of a second
        except RecursionError:
            raise SkillgraftError(f"{file}: {TOO_DEEP}") from None
        except ValueError as e:
            raise SkillgraftError(f"{file}: not valid JSON ({str(e).splitlines()[0]})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
            got = type(obj.get("model")).__name__ if isinstance(obj, dict) else type(obj).__name__
            raise SkillgraftError(f"{file}: field 'model' must be an object (a tokenizer's model), got {got}")
        for field, kinds in (("added_tokens", list), ("normalizer", dict), ("pre_tokenizer", dict),
                             ("post_processor", dict), ("decoder", dict)):
            if obj.get(field) is not None and not isinstance(obj[field], kinds):
                raise SkillgraftError(f"{file}: field {field!r} must be {'a list' if kinds is list else 'an object'}"
                                      f" or null, got {type(obj[field]).__name__}")
        vocab = obj["model"].get("vocab")
        if vocab is not None and not isinstance(vocab, (dict, list)):
            raise SkillgraftError(f"{file}: field 'model.vocab' must be an object or a list, got "
                                  f"{type(vocab).__name__}")


def lacks_tokenizer(path: str) -> bool:
    """Whether ``path`` is a local folder holding no tokenizer files (a model saved without its tokenizer)."""
    folder = Path(path)
    return folder.is_dir() and not any((folder / f).is_file() for f in TOKENIZER_FILES)


def check_weight_files(folder: str | os.PathLike, who: str | None = None) -> None:
    """Refuse a local checkpoint folder whose safetensors files do not open (a header that claims more bytes than
    the file holds, 1 TiB say; tensors whose data offsets overlap or leave the file; a truncated file): one line
    naming the file and, with ``who`` (``"fine-tuned model (--finetuned)"``), its role — safetensors' own message
    names neither. Only the headers are read (the data is mapped, not loaded); a hub name is left alone."""
    from skillgraft.untrusted import regular_tree  # noqa: PLC0415

    folder = Path(folder)
    if not folder.is_dir():
        return
    regular_tree(folder, "a model checkpoint's file")  # a FIFO as a weight file blocked in open(), deaf to SIGTERM
    from safetensors import safe_open  # noqa: PLC0415

    from skillgraft.models.headers import check_safetensors  # noqa: PLC0415

    from skillgraft.heap import require_room  # noqa: PLC0415

    role = f"{who} " if who else ""
    files = sorted(folder.glob("*.safetensors"))
    require_room(sum(f.stat().st_size for f in files), f"the {role}weights in {folder}")  # ulimit -v: one line now
    for f in files:
        check_safetensors(f, who)  # the header walked and bounded first (models/headers.py)
        try:
            with safe_open(str(f), "pt") as opened:
                opened.keys()
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - safetensors' own error types, on a header found sound above
            reason = (str(e).splitlines() or [type(e).__name__])[0]
            if "allocat" in reason.lower() or "memory" in reason.lower():  # a memory limit, not a damaged file
                raise MemoryError(f"{role}{f}: {reason}") from None
            raise SkillgraftError(f"{role}{f}: safetensors cannot open it ({reason})") from None
