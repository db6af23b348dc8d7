"""One table of model-family quirks: what skillgraft must know about an architecture beyond its Hugging Face class.

Adding a family is one :class:`Family` line in :data:`FAMILIES` (keyed by ``config.model_type``); a model type not
listed gets :data:`DEFAULT` (an encoder) or, for a decoder config, :data:`DECODER`. Read by: the Scorer (default
pooling), region inspection (module types by parameter-name spelling), exports (hub ids, Conv1D and tied weights
that PEFT's SHiRA cannot hold), pairs and merges (a classifier's own head and a pooler θ_pre may lack: carried).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Family:
    """The quirks of one architecture family."""

    pooling: Literal["mean", "last"] = "mean"   # head mode's default pooling: decoders read the last token
    decoder: bool = False                       # causal attention (a prompt is scored after, not at, a mask)
    tied_embeddings: bool = False               # lm_head shares the input embeddings by default (one tensor)
    pooler: bool = False                        # a classifier adds a pooler the base checkpoint may lack (carried)
    head: tuple[str, ...] = ("classifier",)     # the sequence-classification head's module names (carried)
    conv1d: bool = False                        # Linear maps stored as transposed Conv1D (not a PEFT SHiRA target)
    sliding_window: str | None = None           # the config field of a sliding attention window, if any
    prefix: str = ""                            # base_model_prefix: the body's attribute in a …For… class


DEFAULT = Family()
DECODER = Family(pooling="last", decoder=True, head=("score",))

FAMILIES: dict[str, Family] = {
    "bert": Family(pooler=True, tied_embeddings=True, prefix="bert"),
    "roberta": Family(pooler=True, tied_embeddings=True, head=("classifier.dense", "classifier.out_proj"),
                      prefix="roberta"),
    "deberta-v2": Family(pooler=True, head=("pooler", "classifier"), prefix="deberta"),
    "distilbert": Family(head=("pre_classifier", "classifier"), prefix="distilbert"),
    "gpt2": Family(pooling="last", decoder=True, tied_embeddings=True, head=("score",), conv1d=True,
                   prefix="transformer"),
    "gpt_neox": Family(pooling="last", decoder=True, head=("score",), prefix="gpt_neox"),
    "llama": Family(pooling="last", decoder=True, head=("score",), prefix="model"),
    "mistral": Family(pooling="last", decoder=True, head=("score",), sliding_window="sliding_window",
                      prefix="model"),
    "qwen2": Family(pooling="last", decoder=True, head=("score",), sliding_window="sliding_window",
                    prefix="model"),
    # Gemma 3 (text): 5 sliding-window : 1 full-attention layers, tied 262k-token embeddings, (1 + w) RMS norms
    # (llama.cpp stores 1 + w in GGUF files), an optional final logit soft-cap applied after the LM head (the head
    # runs only at scored positions: models/logits.py, which applies it there too)
    "gemma3_text": Family(pooling="last", decoder=True, tied_embeddings=True, head=("score",),
                          sliding_window="sliding_window", prefix="model"),
}

# Module types by parameter-name pattern (BERT/RoBERTa, GPT-2, Llama spellings). Order matters.
MODULE_TYPES: list[tuple[str, str]] = [
    (r"(LayerNorm|layer_norm|layernorm|ln_\d|ln_f|norm)\b", "layernorm"),
    (r"(attention\.self\.query|q_proj)\b", "attn.query"),
    (r"(attention\.self\.key|k_proj)\b", "attn.key"),
    (r"(attention\.self\.value|v_proj)\b", "attn.value"),
    (r"attn\.c_attn\b", "attn.qkv"),
    (r"(attention\.output\.dense|o_proj|attn\.c_proj)\b", "attn.output"),
    (r"(intermediate\.dense|gate_proj|up_proj|mlp\.c_fc)\b", "ffn.intermediate"),
    (r"(output\.dense|down_proj|mlp\.c_proj)\b", "ffn.output"),
    (r"(embeddings|wte|wpe|embed_tokens)", "embeddings"),
    (r"^head\.|lm_head|cls\.predictions", "head"),
]

# Short names some checkpoints record for themselves, and the hub ids users load them by (exports name the latter).
HUB_IDS = {"all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2"}


def family(config) -> Family:
    """The family of a Hugging Face config (or model: its ``config``)."""
    config = getattr(config, "config", config)
    known = FAMILIES.get(getattr(config, "model_type", None))
    if known is not None:
        return known
    return DECODER if getattr(config, "is_decoder", False) else DEFAULT


def default_pooling(config, mode: str) -> str:
    """Head mode's pooling: the last token for decoders (and causal scoring), the mean otherwise."""
    return "last" if mode == "causal" or getattr(config, "is_decoder", False) or family(config).decoder else "mean"


def module_type(name: str) -> str:
    """Coarse module type of a parameter name (``attn.value``, ``ffn.intermediate``, ``layernorm`` …)."""
    for pattern, kind in MODULE_TYPES:
        if re.search(pattern, name):
            return kind
    return "other"
