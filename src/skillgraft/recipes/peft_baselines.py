"""Parameter-efficient baselines at matched size (paper Tables 6, 7): grafts vs BitFit, LoRA and IA³.

Every method starts from θ_pre with the same new head and trains with its own usual optimizer settings
(AdamW); LoRA (ranks from ``lora_ranks``) and IA³ come from the ``peft`` library (peft has no sequential
bottleneck adapter — Houlsby/Pfeiffer — so IA³ is the adapter baseline; see
:mod:`skillgraft.train.adapters`). Trained baselines are stored as weight deltas
(:mod:`skillgraft.pipeline.trained`). Grafts are learned on the SGD fine-tuned model at budgets chosen to
bracket those parameter counts. Evaluated like the OOD recipe: ID test + mapped OOD sets, accuracy and ECE.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.pipeline.paper_numbers import TABLE6_4096
from skillgraft.pipeline.regions import learned_grafts
from skillgraft.pipeline.report import RunDir
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.trained import (IA3_FINETUNE, LORA_FINETUNE, BitFitSpec, adapter_variant, bitfit_variant,
                                         with_defaults)
from skillgraft.pipeline.transfers import paper_ood_lines, run_transfers
from skillgraft.pipeline.variants import Variant
from skillgraft.recipes.base import ExperimentSpec, TransfersMixin, recipe, switch
from skillgraft.spec import COUNT_MAX
from skillgraft.train import FinetuneConfig
from skillgraft.train.adapters import AdapterConfig

DEFAULT_LORA_R = AdapterConfig.model_fields["r"].default


class PeftSpec(ExperimentSpec, TransfersMixin):
    """Grafts vs BitFit, LoRA and IA³ at matched size (paper Tables 6, 7)."""

    localize: LocalizeConfig = Field(default_factory=LocalizeConfig, description=(
        "the learned localizer's settings; `budgets` gives one region per budget from one localization"))
    bitfit: BitFitSpec | None = Field(default_factory=BitFitSpec, description="BitFit (null or false: off)")
    lora_ranks: list[Annotated[int, Field(ge=1, le=COUNT_MAX)]] = Field(default_factory=lambda: [1, 2, 8], description=(
        "one LoRA baseline per rank (empty: none)"))
    lora: AdapterConfig = Field(default_factory=AdapterConfig, description=(
        "LoRA settings (target_modules, lora_alpha, lora_dropout); the ranks are `lora_ranks`"))
    lora_finetune: FinetuneConfig = Field(default_factory=lambda: FinetuneConfig(**LORA_FINETUNE), description=(
        "LoRA training; fields not given: AdamW, lr 5e-4, 400 steps, eval every 100, no weight decay"))
    ia3: bool = Field(True, description="an IA³ baseline (peft's default targets)")
    ia3_finetune: FinetuneConfig = Field(default_factory=lambda: FinetuneConfig(**IA3_FINETUNE), description=(
        "IA³ training; fields not given: AdamW, lr 3e-3, 400 steps, eval every 100, no weight decay"))

    @field_validator("bitfit", mode="before")
    @classmethod
    def _switch(cls, v):
        return switch(v)

    @field_validator("lora_finetune", mode="before")
    @classmethod
    def _lora_defaults(cls, v):
        return with_defaults(LORA_FINETUNE, v)

    @field_validator("ia3_finetune", mode="before")
    @classmethod
    def _ia3_defaults(cls, v):
        return with_defaults(IA3_FINETUNE, v)

    @model_validator(mode="after")
    def _lora_only(self):
        if self.lora.method != "lora":
            raise ValueError("lora.method: must be lora (IA³ is the `ia3` field)")
        if self.lora.r != DEFAULT_LORA_R:
            raise ValueError("lora.r: the LoRA ranks are `lora_ranks`; leave lora.r unset")
        return self


def peft_variants(member: Member, spec: PeftSpec, run: RunDir) -> list[Variant]:
    variants, _, _ = learned_grafts(member, run.store, spec.localize, progress=spec.progress)
    if spec.bitfit:
        variants.append(bitfit_variant(member, run.store, spec.bitfit.finetune))
    for r in spec.lora_ranks:
        variants.append(adapter_variant(member, run.store, spec.lora.replace(r=r), spec.lora_finetune))
    if spec.ia3:
        variants.append(adapter_variant(member, run.store, AdapterConfig(method="ia3"), spec.ia3_finetune))
    return variants


def paper_lines(src: str, targets: list[str]) -> list[str]:
    out = paper_ood_lines(src, targets)
    rows = [f"  - {m}: acc {v[src][0]}, ECE {v[src][1]}" for m, v in TABLE6_4096.items() if src in v]
    if rows:
        out += [f"- Table 6 (4096-shot) {src} accuracy / ECE:", *rows, ""]
    return out


@recipe("peft-baselines", PeftSpec)
def peft_baselines(spec: PeftSpec, run: RunDir) -> dict:
    return run_transfers(spec, run, peft_variants,
                         title="Parameter-efficient baselines vs grafting at matched size (paper Tables 6, 7)",
                         paper_lines=paper_lines)
