"""The settings of one fine-tuning run: a typed spec, the one place their defaults and ranges live."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from skillgraft.spec import COUNT_MAX, FLOAT_MAX, OMITTED_AT_DEFAULT, Seed, Spec


DEFAULT_LR = {"sgd": 0.1, "adamw": 2e-5}


class FinetuneConfig(Spec):
    """Settings of one fine-tuning run (defaults: the paper's SGD recipe, tuned for MiniLM)."""

    optimizer: Literal["sgd", "adamw"] = Field("sgd", description="sgd (paper default) or adamw")
    lr: float | None = Field(None, gt=0, le=FLOAT_MAX, description=(
        "learning rate (default: 0.1 for SGD, the MiniLM SST-2 sweep in bench/RESULTS.md; 2e-5 for AdamW)"))
    batch_size: int = Field(8, ge=1, le=COUNT_MAX, description="examples per step (split over processes)")
    weight_decay: float = Field(1e-4, ge=0, le=FLOAT_MAX, description="weight decay")
    max_grad_norm: float | None = Field(1.0, gt=0, le=FLOAT_MAX, description=(
        "gradient clipping by global norm (None: off)"))
    steps: int | None = Field(None, ge=0, le=COUNT_MAX, description=(
        "training steps (None: 16·n·k capped at max_steps)"))
    max_steps: int | None = Field(400, ge=1, le=COUNT_MAX, description="cap on the default step count (None: no cap)")
    eval_every: int = Field(100, ge=0, le=COUNT_MAX, description=(
        "dev evaluation interval in steps (0: only at the end)"))
    l1: float = Field(0.0, ge=0, le=FLOAT_MAX, description="λ of the L1 penalty λ‖θ−θ_pre‖₁ on movement")
    freeze_embeddings: bool = Field(True, description="freeze the embeddings (paper default)")
    freeze_head: bool = Field(False, description="freeze the head (the LM head in prompt mode)")
    bias_only: bool = Field(False, description="train only biases (BitFit)")
    layers: list[Annotated[int, Field(ge=0, le=COUNT_MAX)]] | None = Field(
        None, description="train only these transformer blocks, 0-based (+ the head); None: all")
    seed: Seed = Field(0, description="model seed (batch order, head init)")
    eval_batch_size: int = Field(64, ge=1, le=COUNT_MAX, description="batch size of dev evaluation")
    compile: bool = Field(False, json_schema_extra=OMITTED_AT_DEFAULT, description=(
        "torch.compile the transformer body for the training steps (equal to eager within rounding; pays a compile "
        "at the start and at new batch shapes: for long runs)"))

    @model_validator(mode="after")
    def _default_lr(self) -> FinetuneConfig:
        if self.lr is None:  # the one place the per-optimizer default lives
            object.__setattr__(self, "lr", DEFAULT_LR[self.optimizer])
        return self

    def resolved_steps(self, num_labels: int, k: int) -> int:
        """``steps``, or the LM-BFF rule 16·n·min(k, 512) capped at ``max_steps``."""
        if self.steps is not None:
            return self.steps
        steps = 16 * num_labels * min(k, 512)
        return min(steps, self.max_steps) if self.max_steps else steps
