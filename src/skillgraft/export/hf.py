"""``--to hf`` (and ``skillgraft apply --export``): the grafted model as an ordinary Hugging Face checkpoint of the
class the user fine-tuned with."""

from __future__ import annotations

import json
import os

from skillgraft.errors import SkillgraftError
from skillgraft.export.base import SUMMARY_FILE, ExportSpec, Exporter, check_export_target, graft_task
from skillgraft.graft.graft import Graft
from skillgraft.io import atomic_dir

__all__ = ["HF", "USER_CLASS", "export_hf", "graft_task"]

USER_CLASS = {"classifier": "AutoModelForSequenceClassification", "generative": "AutoModelForCausalLM",
              "causal": "AutoModelForCausalLM", "prompt": "AutoModelForMaskedLM", "head": None}



def export_hf(graft: Graft, base_scorer, out: str | os.PathLike, *, overwrite: bool = False,
              force: bool = False) -> dict:
    """The grafted model in the class the user fine-tuned with (``--to hf``; ``apply --export``), atomically.

    θ_pre + γ⊙Δ with the carried head is saved by plain ``save_pretrained`` with the tokenizer: a classifier
    graft loads with ``AutoModelForSequenceClassification`` (its own head, labels in ``config.id2label``), a
    causal / generative graft with ``AutoModelForCausalLM``, a prompt graft with ``AutoModelForMaskedLM``.
    No skillgraft file is needed to use it (``scorer_config.json`` lets ``skillgraft evaluate`` read it too).
    Head mode has no Hugging Face equivalent (skillgraft's own pooled Linear head): that export is the body
    plus ``head.safetensors`` and is marked **incomplete** in ``config.json`` and ``README.md``.
    """
    if not hasattr(base_scorer, "scorer_config"):
        raise SkillgraftError("--to hf needs the graft's Scorer (a registered task, or a graft of a checkpoint pair "
                              "that records its task); use --to peft or --to delta for the plain model")
    check_export_target(graft, out, overwrite, base=base_scorer)
    mode = base_scorer.mode
    user_class = None if base_scorer.tied_decoder else USER_CLASS.get(mode)
    summary = {"to": "hf", "out": str(out), "coordinates": graft.size, "carried": graft.carried_size, "mode": mode,
               "model_class": type(base_scorer.model).__name__,
               "loads_with": user_class or "skillgraft.models.Scorer.from_pretrained (incomplete as a plain model)",
               "complete": user_class is not None,
               "format": "Hugging Face checkpoint (plain save_pretrained) + tokenizer"}
    with graft.applied(base_scorer, force=force), atomic_dir(out, overwrite=overwrite) as tmp:
        base_scorer.save_pretrained(tmp)
        if user_class is None:
            cfg_path = tmp / "config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg["skillgraft_incomplete"] = ("no task head in this checkpoint: skillgraft's own head (mean-pooled "
                                            "Linear) is in head.safetensors; loading it as a classifier gives a "
                                            "random head. Use skillgraft.models.Scorer.from_pretrained")
            cfg_path.write_text(json.dumps(cfg, indent=2))
            (tmp / "README.md").write_text(
                "# Incomplete: a grafted body without its task head\n\nThis folder holds the grafted model body "
                f"({summary['model_class']}). The task head is skillgraft's own (a Linear layer on "
                f"{base_scorer.pooling}-pooled hidden states) in `head.safetensors`; no Hugging Face class holds it, "
                "so "
                "`AutoModelForSequenceClassification` would load a *random* head here. Load it with "
                "`skillgraft.models.Scorer.from_pretrained(folder)`.\n")
        (tmp / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    return summary



class HF(Exporter):
    """θ_pre + γ⊙Δ with the carried head, saved by plain ``save_pretrained`` with the tokenizer."""

    summary = "the grafted model as a Hugging Face checkpoint (the class it was fine-tuned as)"

    def export(self, graft: Graft, base, out, spec: ExportSpec) -> dict:
        return export_hf(graft, base, out, overwrite=spec.overwrite, force=spec.force)

    def applied(self, summary: dict, out) -> list[tuple[str, str]]:
        if summary["complete"]:
            return [("info", f"exported grafted model → {out} (loads with transformers.{summary['loads_with']})")]
        return [("warning", f"exported → {out}, but head mode has no Hugging Face class: the task head is in "
                            "head.safetensors (marked incomplete; load with skillgraft's Scorer.from_pretrained)")]
