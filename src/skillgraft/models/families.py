"""One table of model-family quirks: what skillgraft must know about an architecture beyond its Hugging Face class.

Adding a family is one :class:`Family` line in :data:`FAMILIES` (keyed by ``config.model_type``); a model type not
listed gets :data:`DEFAULT` (an encoder) or, for a decoder (a config saying ``is_decoder``, or a checkpoint saved as
``…ForCausalLM`` / ``…LMHeadModel``), :data:`DECODER`. Every field has a reader (``tests/test_families.py`` fails on
one nobody reads, and on a family's name or class written outside this module):

* ``decoder`` — the Scorer's default pooling (:func:`default_pooling`: the last token for decoders);
* ``head`` / ``pooler`` / ``prefix`` — a sequence classifier's own head (carried whole), the pooler θ_pre may lack
  (:func:`head_names`, :func:`is_pooler`: ``models/loading.load_classifier``) and the body's attribute
  (:func:`body_prefix`: mergekit's merged bodies, PEFT's ``modules_to_save``);
* ``norms`` — RMS-norm classes with their scale offset, y = (offset + w) ⊙ x / rms(x) (Gemma stores 1 + w), and
  ``conv1d`` — a Linear stored transposed (GPT-2): the Fisher's per-example closed forms (:func:`layer_kind`,
  ``fisher/fisher.py``; the offset is checked against the module's output before a norm is hooked) and the SHiRA
  export's reasons (``export/shira.py``);
* ``tied_embeddings`` — the LM head shares the input embeddings unless the config says otherwise
  (:func:`tied_embeddings`: a converted GGUF model is re-tied, ``models/gguf.py``);
* ``sliding_window`` — the config field of a sliding attention window, compared across a checkpoint pair with the
  shape fields (:func:`shape_fields`, ``models/pair.check_pair``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    """The quirks of one architecture family."""

    decoder: bool = False                        # causal attention: head mode pools the last token, not the mean
    tied_embeddings: bool = False                # lm_head shares the input embeddings (when the config is silent)
    pooler: str | None = None                    # the body's pooler module, which a classifier may add (carried)
    head: tuple[str, ...] = ("classifier",)      # the sequence-classification head's module paths (carried)
    conv1d: str | None = None                    # class name of a Linear stored transposed (not a PEFT SHiRA target)
    norms: dict[str, float] = field(default_factory=dict)  # RMS-norm class → scale offset (y = (offset + w) ⊙ x̂)
    sliding_window: str | None = None            # the config field of a sliding attention window, if any
    prefix: str = ""                             # base_model_prefix: the body's attribute in a …For… class


DEFAULT = Family()
DECODER = Family(decoder=True, head=("score",))

FAMILIES: dict[str, Family] = {
    "bert": Family(pooler="pooler", tied_embeddings=True, prefix="bert"),
    "roberta": Family(pooler="pooler", tied_embeddings=True, head=("classifier.dense", "classifier.out_proj"),
                      prefix="roberta"),
    "deberta-v2": Family(pooler="pooler", head=("pooler", "classifier"), prefix="deberta"),
    "distilbert": Family(head=("pre_classifier", "classifier"), prefix="distilbert"),
    "t5": Family(head=("classification_head",), norms={"T5LayerNorm": 0.0}, prefix="transformer"),
    "gpt2": Family(decoder=True, tied_embeddings=True, head=("score",), conv1d="Conv1D", prefix="transformer"),
    "gpt_neox": Family(decoder=True, head=("score",), prefix="gpt_neox"),
    # Llama 1–3 share model_type "llama" (Llama 3.2's small models tie their embeddings: their config says so)
    "llama": Family(decoder=True, head=("score",), norms={"LlamaRMSNorm": 0.0}, prefix="model"),
    "mistral": Family(decoder=True, head=("score",), norms={"MistralRMSNorm": 0.0}, sliding_window="sliding_window",
                      prefix="model"),
    "qwen2": Family(decoder=True, head=("score",), norms={"Qwen2RMSNorm": 0.0}, sliding_window="sliding_window",
                    prefix="model"),
    # Qwen3: Qwen2 plus RMS norms on each head's queries and keys (q_norm / k_norm)
    "qwen3": Family(decoder=True, head=("score",), norms={"Qwen3RMSNorm": 0.0}, sliding_window="sliding_window",
                    prefix="model"),
    # Gemma 3 (text): 5 sliding-window : 1 full-attention layers, tied 262k-token embeddings, (1 + w) RMS norms
    # (llama.cpp stores 1 + w in GGUF files), an optional final logit soft-cap applied after the LM head (the head
    # runs only at scored positions: models/logits.py, which applies it there too)
    "gemma3_text": Family(decoder=True, tied_embeddings=True, head=("score",), norms={"Gemma3RMSNorm": 1.0},
                          sliding_window="sliding_window", prefix="model"),
}

# Config fields that fix a checkpoint's tensor shapes (BERT, GPT-2 and Llama spellings): a pair must agree on them.
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "max_position_embeddings",
                "n_positions", "type_vocab_size", "embedding_size", "head_dim")

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

_CAUSAL_CLASSES = ("ForCausalLM", "LMHeadModel")


def family(config) -> Family:
    """The family of a Hugging Face config (or model: its ``config``)."""
    config = getattr(config, "config", config)
    known = FAMILIES.get(getattr(config, "model_type", None))
    if known is not None:
        return known
    causal = any(str(a).endswith(_CAUSAL_CLASSES) for a in getattr(config, "architectures", None) or ())
    return DECODER if getattr(config, "is_decoder", False) or causal else DEFAULT


def default_pooling(config, mode: str) -> str:
    """Head mode's pooling: the last token for decoders (and causal scoring), the mean otherwise."""
    return "last" if mode == "causal" or family(config).decoder else "mean"


def tied_embeddings(config) -> bool:
    """Whether the LM head shares the input embeddings: the config's ``tie_word_embeddings``, else the family's."""
    config = getattr(config, "config", config)
    tied = getattr(config, "tie_word_embeddings", None)
    return family(config).tied_embeddings if tied is None else bool(tied)


def shape_fields(config) -> tuple[str, ...]:
    """The config fields two checkpoints of one pair must agree on: the shapes and, if any, the sliding window."""
    window = family(config).sliding_window
    return SHAPE_FIELDS + ((window,) if window else ())


def body_prefix(model) -> str:
    """The attribute holding the body in a ``…For…`` model (``bert``, ``model``, ``transformer`` …)."""
    return family(model).prefix or getattr(model, "base_model_prefix", "")


def head_names(model) -> set[str]:
    """The parameters of a sequence classifier's own head (carried whole, never grafted): those under the family's
    head modules; for a family not in the table, every parameter outside the body (``base_model``)."""
    fam = family(model)
    named = [n for n, _ in model.named_parameters()]
    if fam is not DEFAULT and fam is not DECODER:
        return {n for n in named if any(n.startswith(h + ".") for h in fam.head)}
    base = getattr(model, "base_model", model)
    if base is model:
        return set()
    body = {id(p) for p in base.parameters()}
    return {n for n, p in model.named_parameters() if id(p) not in body}


def is_pooler(model, name: str) -> bool:
    """Whether parameter ``name`` is the family's pooler (a classifier adds one its base checkpoint may lack)."""
    fam = family(model)
    pooler = fam.pooler if fam is not DEFAULT else "pooler"
    return pooler is not None and f".{pooler}." in f".{name}"


def layer_kind(module) -> tuple[str, float] | None:
    """Which closed form gives a family-specific module's per-example gradients: ``("conv1d", 0.0)`` for a
    transposed Linear, ``("rmsnorm", offset)`` for an RMS norm y = (offset + w) ⊙ x̂; None for other classes."""
    name = type(module).__name__
    for fam in FAMILIES.values():
        if name == fam.conv1d:
            return "conv1d", 0.0
        if name in fam.norms:
            return "rmsnorm", fam.norms[name]
    return None


def module_type(name: str) -> str:
    """Coarse module type of a parameter name (``attn.value``, ``ffn.intermediate``, ``layernorm`` …)."""
    for pattern, kind in MODULE_TYPES:
        if re.search(pattern, name):
            return kind
    return "other"
