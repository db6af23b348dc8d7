"""Parameter-efficient baselines through the ``peft`` library (LoRA, IA³), on a Scorer.

The adapter layers are injected into ``scorer.model`` in place (``peft.inject_adapter_in_model``), so
the Scorer keeps its interface (``collate`` / ``forward`` / ``head.*``) and trains with
:func:`skillgraft.train.masked.finetune_masked` (only adapter tensors + the new head move). After
training, :func:`merged_state` folds the adapters into the base weights and returns a state with the
pre-trained scorer's parameter names, so the result can be stored and applied like any weight delta.

Adapter choice: peft 0.21 has no sequential bottleneck adapter (Houlsby et al. 2019 / Pfeiffer et al.
2021); its maintained adapter-style methods are LoRA-family, IA³ and others. We use IA³ (Liu et al.,
2022: learned rescaling of keys, values and the FFN activations; peft's default targets for BERT) as the
adapter baseline.
"""

from __future__ import annotations

from typing import Literal

from skillgraft.lazy import no_grad, torch
from pydantic import Field

from skillgraft.errors import SkillgraftError
from skillgraft.spec import COUNT_MAX, FLOAT_MAX, Spec

Method = Literal["lora", "ia3"]


class AdapterConfig(Spec):
    """One peft adapter (defaults: peft's own, LoRA on query/value as in Hu et al. 2022)."""

    method: Method = Field("lora", description="lora or ia3")
    r: int = Field(8, ge=1, le=COUNT_MAX, description="LoRA rank")
    lora_alpha: float = Field(8, gt=0, le=FLOAT_MAX, description="LoRA scaling numerator (scale = alpha / r)")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    target_modules: list[str] | None = Field(None, description=(
        "module names to adapt (None: query/value for LoRA, peft's defaults for IA³)"))

    @property
    def label(self) -> str:
        return f"LoRA r={self.r}" if self.method == "lora" else "IA3"


def _peft_config(config: AdapterConfig, model):
    import peft  # noqa: PLC0415

    if config.method == "lora":
        return peft.LoraConfig(r=config.r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                               target_modules=config.target_modules or ["query", "value"])
    if config.target_modules:
        ff = [m for m in config.target_modules if "output" in m or "down" in m or "fc2" in m]
        return peft.IA3Config(target_modules=config.target_modules, feedforward_modules=ff)
    return peft.IA3Config()


def add_adapter(scorer, config: AdapterConfig) -> list[str]:
    """Inject the adapter into ``scorer.model`` in place; returns the adapter parameter names."""
    import peft  # noqa: PLC0415

    before = {n for n, _ in scorer.named_parameters()}
    try:
        peft.inject_adapter_in_model(_peft_config(config, scorer.model), scorer.model)
    except (ValueError, KeyError) as e:
        raise SkillgraftError(f"peft could not add {config.label} to {type(scorer.model).__name__}: {e}") from None
    names = [n for n, _ in scorer.named_parameters() if n not in before and ".base_layer." not in n]
    if not names:
        raise SkillgraftError(f"{config.label}: no module of {type(scorer.model).__name__} matched "
                              f"target_modules={config.target_modules}")
    return names


def adapter_parameter_count(scorer, names: list[str]) -> int:
    params = dict(scorer.named_parameters())
    return sum(params[n].numel() for n in names)


@no_grad
def merged_state(scorer) -> dict[str, torch.Tensor]:
    """The scorer's weights with every adapter merged in, under the plain (pre-injection) names."""
    from peft.tuners.tuners_utils import BaseTunerLayer  # noqa: PLC0415

    for module in scorer.modules():
        if isinstance(module, BaseTunerLayer) and not module.merged:
            module.merge()
    state = {}
    for name, p in scorer.named_parameters():
        if ".base_layer." in name:
            state[name.replace(".base_layer.", ".")] = p.detach().clone()
        elif not any(tag in name for tag in ("lora_", "ia3_")):
            state[name] = p.detach().clone()
    return state
