"""Checkpoint pairs (θ_pre, θ_ft) as a user has them: how to score them, and whether they form a pair at all.

``pair_mode`` reads the fine-tuned checkpoint's class (…ForSequenceClassification → classifier, …ForCausalLM →
causal or generative, …ForMaskedLM → prompt); ``check_pair`` refuses, before any weights load, two checkpoints
of different architectures, shapes or tokenizer vocabularies (each model opened once: the tokenizers it compares
are the ones the models then load with). Used by ``skillgraft graft`` / ``evaluate`` on a pair (pipeline.opening.from_pair) and by
anything else that takes checkpoint pairs.
"""

from __future__ import annotations

import os
from pathlib import Path

from skillgraft.errors import SkillgraftError

PAIR_MODES = ("classifier", "prompt", "causal", "generative", "head")


def pair_mode(finetuned: str, generative_data: bool, mode: str | None = None, *, ref=None) -> str:
    """How to score θ_ft: ``mode`` when given, else from what the checkpoint was saved as (``ref``: its
    :class:`~skillgraft.models.loading.ModelRef`, when the run resolved it already)."""
    if mode is not None:
        if mode not in PAIR_MODES:
            raise SkillgraftError(f"--mode {mode!r}: use one of {', '.join(PAIR_MODES)}")
        return mode
    kind = checkpoint_kind(_path(finetuned, ref))
    if kind == "classifier":
        return "classifier"
    if kind == "causal":
        return "generative" if generative_data else "causal"
    if kind == "mlm":
        return "prompt"
    if generative_data:
        return "generative"
    raise SkillgraftError(f"{finetuned}: cannot tell how to score this checkpoint (config.json architectures: "
                          f"{kind or 'none'}); pass --mode classifier | prompt | causal | generative")


def _path(name: str, ref=None) -> str:
    """The folder of a model: its reference's, when the run resolved it already (else resolved here)."""
    if ref is not None:
        return ref.path
    from skillgraft.models.loading import model_reference  # noqa: PLC0415

    return model_reference(name).path


def checkpoint_kind(path: str) -> str | None:
    """What a local checkpoint was saved as, from ``config.json``'s ``architectures``: ``classifier``
    (…ForSequenceClassification), ``mlm`` (…ForMaskedLM), ``causal`` (…ForCausalLM / LMHeadModel), ``base``,
    or None (no local config / no architectures recorded)."""
    import json  # noqa: PLC0415

    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    try:
        archs = json.loads(cfg.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return None
    for arch in archs:
        if arch.endswith("ForSequenceClassification"):
            return "classifier"
        if arch.endswith("ForMaskedLM"):
            return "mlm"
        if arch.endswith(("ForCausalLM", "LMHeadModel")):
            return "causal"
    return "base" if archs else None


def check_pair(pretrained: str, finetuned: str, *, opened) -> None:
    """Refuse, before loading any weights, a pair whose architectures, shapes or tokenizers differ; ``opened``: the
    two models (:class:`~skillgraft.models.loading.OpenedModel`, θ_pre's and θ_ft's, each opened once by the run),
    whose tokenizers it compares — the ones their weights then load beside."""
    from skillgraft.models.families import shape_fields  # noqa: PLC0415

    refs = [o.ref for o in opened]
    configs_read = [read_config(ref.path, f"{role} model {ref.name!r}")
                    for ref, role in zip(refs, ("pre-trained (--pretrained)", "fine-tuned (--finetuned)"))]
    configs = [c.to_dict() for c in configs_read]
    from skillgraft.models.vet import check_weight_files  # noqa: PLC0415

    for ref, role in zip(refs, ("pre-trained model (--pretrained)", "fine-tuned model (--finetuned)")):
        check_weight_files(ref.path, role)  # before any weights load: the damaged file and its role named
    a, b = configs
    if a.get("model_type") != b.get("model_type"):
        raise SkillgraftError(f"different architectures: {refs[0].name} is {a.get('model_type')!r}, {refs[1].name} is "
                              f"{b.get('model_type')!r}; a graft needs θ_ft fine-tuned from θ_pre")
    fields = shape_fields(configs_read[0])  # the family table: shapes and a sliding attention window
    for key in fields:
        if a.get(key) != b.get(key):
            raise SkillgraftError(f"different shapes: {key} is {a.get(key)} in {refs[0].name} but {b.get(key)} in "
                                  f"{refs[1].name}; a graft needs θ_ft fine-tuned from θ_pre")
    share_tokenizer(refs, a.get("vocab_size"), b.get("vocab_size"))
    ta, tb = (o.tokenizer() for o in opened)
    va, vb = ta.get_vocab(), tb.get_vocab()
    if va != vb:
        diff = sorted(set(va.items()) ^ set(vb.items()))
        raise SkillgraftError(f"different tokenizers: the vocabularies of {refs[0].name} ({len(va)} tokens) and "
                              f"{refs[1].name} ({len(vb)} tokens) differ in {len(diff)} entries, e.g. {diff[:2]}")
    if same_weights(refs[0].path, refs[1].path):
        raise SkillgraftError(f"--finetuned {finetuned} holds the same weights as --pretrained {pretrained} (identical "
                              "weight files): fine-tuning changed nothing, so there is nothing to graft; give the "
                              "fine-tuned checkpoint as --finetuned")


def same_weights(a: str, b: str) -> bool:
    """Whether two local checkpoint folders hold byte-identical weight files (the same names, the same bytes): read
    side by side in blocks, stopping at the first difference (a fine-tuned copy differs early); False for hub ids."""
    def files(folder: str) -> list[Path]:
        p = Path(folder)
        return (sorted(p.glob("*.safetensors")) or sorted(p.glob("*.bin"))) if p.is_dir() else []

    fa, fb = files(a), files(b)
    if not fa or [f.name for f in fa] != [f.name for f in fb]:
        return False
    if any(x.stat().st_size != y.stat().st_size for x, y in zip(fa, fb)):
        return False
    for x, y in zip(fa, fb):
        if os.path.samefile(x, y):
            continue
        with open(x, "rb") as ha, open(y, "rb") as hb:
            while True:
                block = ha.read(1 << 22)
                if block != hb.read(1 << 22):
                    return False
                if not block:
                    break
    return True


def share_tokenizer(refs, size_a, size_b) -> None:
    """A model of the pair saved without tokenizer files uses the other's tokenizer when their vocabulary sizes
    agree (said once on stderr); else one line saying which tokenizer is missing."""
    import warnings  # noqa: PLC0415

    from skillgraft.models.loading import borrow_tokenizer  # noqa: PLC0415
    from skillgraft.models.vet import lacks_tokenizer  # noqa: PLC0415

    lacking = [lacks_tokenizer(r.path) for r in refs]
    if all(lacking):
        raise SkillgraftError(f"neither {refs[0].name} nor {refs[1].name} has tokenizer files (tokenizer.json, "
                              "vocab.txt, …): save the tokenizer beside the model (tokenizer.save_pretrained)")
    for i, role in ((0, "pre-trained"), (1, "fine-tuned")):
        if not lacking[i]:
            continue
        other = refs[1 - i]
        if size_a != size_b or size_a is None:
            raise SkillgraftError(f"the {role} model {refs[i].name} has no tokenizer files (tokenizer.json, "
                                  f"vocab.txt, …) and its vocabulary size ({(size_a, size_b)[i]}) differs from "
                                  f"{other.name}'s ({(size_a, size_b)[1 - i]}): save its tokenizer beside it "
                                  "(tokenizer.save_pretrained)")
        borrow_tokenizer(refs[i].path, other.path)
        warnings.warn(f"the {role} model {refs[i].name} has no tokenizer files: using {other.name}'s tokenizer "
                      f"(the same vocabulary size, {size_a})", stacklevel=2)


def model_labels(finetuned: str, *, ref=None) -> tuple[str, ...] | None:
    """The label names of a fine-tuned checkpoint's config (``id2label`` in logit order)."""
    cfg = read_config(_path(finetuned, ref), f"model {finetuned!r}")
    try:
        return tuple(str(cfg.id2label[i]) for i in range(cfg.num_labels))
    except (KeyError, TypeError, AttributeError):
        raise SkillgraftError(f"{finetuned}/config.json: 'id2label' does not name each of its {cfg.num_labels} "
                              f"labels 0…{cfg.num_labels - 1} (got {getattr(cfg, 'id2label', None)!r})") from None


def read_config(path: str, who: str):
    """A checkpoint's ``AutoConfig``; one line naming ``who`` and the fault when transformers cannot read it (no
    ``model_type``, not JSON, an unknown architecture) — it raises a plain ValueError, which was a traceback."""
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from transformers import AutoConfig  # noqa: PLC0415

    from skillgraft.untrusted import TOO_DEEP, read_text, unique_keys  # noqa: PLC0415

    from skillgraft.models.vet import vet_folder  # noqa: PLC0415

    file = Path(path) / "config.json"
    if file.is_file():  # a local folder: name the file and field at fault
        try:
            raw = json.loads(read_text(file), object_pairs_hook=unique_keys)
        except json.JSONDecodeError as e:
            raise SkillgraftError(f"{file}: not valid JSON ({e.msg} at line {e.lineno})") from None
        except ValueError as e:  # a key given twice
            raise SkillgraftError(f"{file}: {e}") from None
        except RecursionError:
            raise SkillgraftError(f"{file}: {TOO_DEEP}") from None
        if not isinstance(raw, dict):
            raise SkillgraftError(f"{file}: expected a JSON object, got {type(raw).__name__}")
        vet_folder(path, who)  # no code of its own, no pickle that runs code, no config that lies (models/vet.py)
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        if file.is_file() and "model_type" in first:
            raise SkillgraftError(f"{file}: no 'model_type' field, so transformers cannot tell the architecture of "
                                  f"{who} (add it, e.g. \"model_type\": \"bert\")") from None
        raise SkillgraftError(f"{who}: no readable config ({first})") from None


def torch_fork(seed: int):
    """A forked RNG seeded with ``seed`` (weights missing from a checkpoint initialise the same every time)."""
    import contextlib  # noqa: PLC0415

    import torch  # noqa: PLC0415

    @contextlib.contextmanager
    def forked():
        with torch.random.fork_rng(devices=[]):  # CPU only: models load there first
            torch.manual_seed(seed)
            yield

    return forked()
