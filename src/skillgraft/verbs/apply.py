"""``skillgraft apply``: a graft applied to its base model (fingerprint-checked), evaluated and/or exported as a
Hugging Face checkpoint of the user's own class."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.verbs.result import VerbResult


@dataclass
class ApplyResult(VerbResult):
    """What ``skillgraft apply`` did: the export's summary (None: no export) and the evaluation (None: skipped)."""

    private = ("exported_to",)

    graft_dir: Path
    task: str
    size: int
    density: float
    export: dict | None = None
    metrics: dict | None = None
    split: str = ""
    export_dir: Path | None = None  # where --export wrote (as given)
    exported_to: str | None = None  # the exporter that wrote it (the registry's name; not in the document)

    def line(self) -> str:
        """The evaluation line ``skillgraft apply`` prints."""
        m = self.metrics
        score = f"acc {m['accuracy']:.4f}" if "accuracy" in m else f"token accuracy {m['token_accuracy']:.4f}"
        extra = f" completion loss {m['loss']:.4f}" if "loss" in m else ""
        return (f"graft {self.graft_dir}: {self.task} {self.split} (n={m['n']}) {score} ECE {m['ece']:.4f}{extra} | "
                f"{self.size:,} params ({self.density:.2e})")


def apply(graft_dir: str | os.PathLike, *, model: str | None = None, task: str | None = None, mode: str | None = None,
          export: str | os.PathLike | None = None, overwrite: bool = False, evaluate_on: str | None = "test",
          limit: int | None = None, force: bool = False, data_dir: str | os.PathLike | None = None,
          runtime=None) -> ApplyResult:
    """Apply the graft in ``graft_dir`` to its base (``model``, default the recorded one); ``export``: write the
    grafted model there with the exporter that claims its suffix (:func:`~skillgraft.export.exporter_for`: a
    ``FILE.gguf`` is one GGUF file llama.cpp runs, for a graft on a GGUF base, as ``export --to gguf``; else a
    Hugging Face checkpoint, as ``export --to hf``) (refused before any work if it exists, unless ``overwrite``);
    ``evaluate_on``: a split (a checkpoint pair's graft: the held-out rows of the data it was learned on), or None
    to skip. ``runtime``: where the base loads and computes (None: the placement the command line activated),
    passed down."""
    from skillgraft.data import load_split  # noqa: PLC0415
    from skillgraft.export import (ExportSpec, check_export_target, export_graft, exporter_for,  # noqa: PLC0415
                                   get_exporter)
    from skillgraft.export.hf import graft_task  # noqa: PLC0415
    from skillgraft.graft import Graft  # noqa: PLC0415
    from skillgraft.graft.scoring import evaluate_graft  # noqa: PLC0415
    from skillgraft.io import check_target  # noqa: PLC0415
    from skillgraft.models import build_scorer  # noqa: PLC0415
    from skillgraft.models.placement import boundary  # noqa: PLC0415

    runtime = boundary(runtime)  # the one read of the placement the command line activated
    graft_dir = Path(graft_dir)
    if export:
        check_target(export, overwrite, {"graft": graft_dir, "--model": model, "--data-dir": data_dir})  # before work
    g = Graft.from_pretrained(graft_dir)
    spec = None
    if export:  # every input of this run: the graft's recorded base and data files too (docs/reliability.md §19)
        check_export_target(g, export, overwrite, model=model, **{"--data-dir": data_dir})
        # the exporter registry's: the one claiming the name's suffix (FILE.gguf), else the HF checkpoint
        spec = ExportSpec(to=exporter_for(export), model=model, overwrite=overwrite, force=force)
        get_exporter(spec.to).refuse(g, export, spec)  # before the model loads
    task = task or graft_task(g)
    if not task:
        raise SkillgraftError(f"{graft_dir}: the graft records no task; pass --task")
    if mode is not None and g.metadata.mode and mode != g.metadata.mode:
        raise SkillgraftError(f"--mode {mode}: the graft in {graft_dir} was learned in {g.metadata.mode} mode (its "
                              "recorded mode is used; drop --mode)")
    ft_mode = g.metadata.mode or mode or "head"  # --mode only for a graft that records none
    try:
        pre = build_scorer(model or g.base_model or None, task, ft_mode, runtime=runtime)
    except SkillgraftError as e:  # the base named in the graft's file, not by the user: say where it came from
        if model or not g.base_model or str(g.base_model) not in str(e):
            raise
        raise SkillgraftError(f"{graft_dir}/graft_config.json: its base model {g.base_model!r} cannot be loaded "
                              f"({e}); give the base with --model") from None
    result = ApplyResult(graft_dir, pre.task.name, g.size, g.region.density, export_dir=export,
                         exported_to=spec.to if spec is not None else None)
    if spec is not None:
        result.export = export_graft(g, export, spec, base=pre)
    if evaluate_on:
        recorded = g.metadata.user_data
        if recorded:  # a checkpoint pair's graft: the held-out rows of the user's data it was learned on
            from skillgraft.data.spec import UserDataSpec  # noqa: PLC0415

            spec = UserDataSpec.build(recorded, where=f"{graft_dir} metadata user_data")
            examples = spec.load(pre.task.labels if ft_mode == "classifier" else None).test[:limit]
        else:
            examples = load_split(task, evaluate_on, data_dir)[:limit]
        result.metrics, _ = evaluate_graft(pre, g, examples, force=force, progress=evaluate_on)
        result.split = "held-out" if recorded else evaluate_on
    return result
