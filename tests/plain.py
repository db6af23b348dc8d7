"""Reading what skillgraft writes the way a user's own code would — safetensors, transformers, peft and the JSON
config, never skillgraft: a graft's packed values written into a checkpoint, a routed merge's task logits, mergekit's
adapter merge."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def write_graft_in(params: dict[str, torch.Tensor], folder: Path) -> dict[str, torch.Tensor]:
    """Write the graft in ``folder`` (graft.safetensors: packed flat ``indices`` over the tensors of
    graft_config.json's ``shapes``, in order, and their ``values``) into ``params`` (names without ``model.``);
    returns the graft's other tensors (``carried::…`` heads)."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "graft_config.json").read_text())
    tensors = load_file(str(folder / "graft.safetensors"))
    flat, start = tensors["indices"].long(), 0
    with torch.no_grad():
        for name, shape in cfg["shapes"].items():
            n = int(torch.Size(shape).numel())
            sel = (flat >= start) & (flat < start + n)
            params[name.removeprefix("model.")].view(-1)[flat[sel] - start] = tensors["values"][sel]
            start += n
    return {k: v for k, v in tensors.items() if k not in ("indices", "values")}


def plain_graft_logits(folder: Path, task: str, texts: list[str]) -> torch.Tensor:
    """A routed merge folder's graft of ``task`` applied with plain transformers + safetensors: θ_pre's checkpoint with
    the graft's packed positions and values written in and its head loaded."""
    import transformers as tf
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "skills" / task / "graft.safetensors"))
    heads = {k.removeprefix("carried::model."): v for k, v in tensors.items() if k.startswith("carried::")}
    labels = heads["classifier.weight"].shape[0]
    model = tf.AutoModelForSequenceClassification.from_pretrained(folder / "base", num_labels=labels,
                                                                  ignore_mismatched_sizes=True).eval()
    params = dict(model.named_parameters())
    write_graft_in(params, folder / "skills" / task)
    with torch.no_grad():
        for name, t in heads.items():
            params[name].copy_(t)
    tok = tf.AutoTokenizer.from_pretrained(folder / "base")
    with torch.no_grad():
        return model(**tok(texts, return_tensors="pt", padding=True)).logits


def mergekit_style_merge(base_dir, adapter_dir, out_dir):
    """What mergekit does with ``model: BASE+ADAPTER`` (mergekit.common.ModelReference.merged, 0.1.5): the base
    loaded by its config's architecture, ``PeftModel.from_pretrained``, ``merge_and_unload``, safetensors save."""
    import peft
    import transformers

    arch = transformers.AutoConfig.from_pretrained(str(base_dir)).architectures[0]
    model = getattr(transformers, arch).from_pretrained(str(base_dir), low_cpu_mem_usage=True)
    model = peft.PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
    model.merge_and_unload().save_pretrained(str(out_dir), safe_serialization=True)
