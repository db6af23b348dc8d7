"""ModelSpec: which pre-trained model, scored how (head / prompt / causal)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from skillgraft.spec import COUNT_MAX, MAX_LENGTH, Spec

Mode = Literal["head", "prompt", "causal"]
Pooling = Literal["cls", "mean", "last"]
MaxLength = Annotated[int, Field(ge=8, le=COUNT_MAX)]


class ModelSpec(Spec):
    """A Hugging Face model by hub name or local path, wrapped as a Scorer of one mode."""

    model: str | None = Field(None, description="hub name or local path (default: bundled all-MiniLM-L6-v2)")
    mode: Mode = Field("head", description="scorer: head | prompt | causal")
    pooling: Pooling | None = Field(None, description=(
        "head pooling: cls | mean | last (default: mean; last for decoder LMs)"))
    max_length: MaxLength = Field(MAX_LENGTH, description="max tokens per example")

    def scorer(self, task, *, head_seed: int = 0, dtype=None, ref=None, runtime=None):
        """A pre-trained Scorer of this spec for ``task`` (a new head initialised from ``head_seed``); ``ref``: the
        model's :class:`~skillgraft.models.loading.ModelRef` when the run resolved it already."""
        from skillgraft.models.scorer import build_scorer  # noqa: PLC0415

        return build_scorer(ref or self.model, task, self.mode, pooling=self.pooling, max_length=self.max_length,
                            head_seed=head_seed, dtype=dtype, runtime=runtime)
