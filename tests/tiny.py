"""Tiny randomly initialised models (BERT, RoBERTa, GPT-2, Llama, Llama 3, Qwen3, Gemma 3) and a tiny task dataset,
built in-test; a tiny Gemma 3 written as a GGUF file with the ``gguf`` package."""

from __future__ import annotations

import json
import random
from pathlib import Path

POSITIVE = ["great", "good", "wonderful", "fine", "lovely", "superb"]
NEGATIVE = ["terrible", "bad", "awful", "poor", "boring", "dull"]
FILLER = ["the", "movie", "was", "really", "a", "film", "plot", "acting", "story", "quite", "it", "is", "this"]


def sentence(rng: random.Random, label: int) -> str:
    words = rng.sample(FILLER, 4) + [rng.choice(POSITIVE if label else NEGATIVE)]
    rng.shuffle(words)
    return " ".join(words)


def write_sentiment_data(root: Path, folder: str = "SST-2", n_train: int = 200, n_test: int = 80,
                         seed: int = 0) -> Path:
    """A learnable toy sentiment task in the JSONL layout: label '1' iff a positive word occurs."""
    rng = random.Random(seed)
    (root / folder).mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        with open(root / folder / f"{split}.jsonl", "w") as f:
            for i in range(n):
                y = i % 2
                f.write(json.dumps({"text": sentence(rng, y), "label": str(y)}) + "\n")
    return root


TOPICS = {"1": ["world", "film"], "2": ["plot", "acting"], "3": ["good", "fine"], "4": ["bad", "poor"]}


def write_topic_data(root: Path, folder: str = "ag_news", n_train: int = 120, n_test: int = 40,
                     seed: int = 0) -> Path:
    """A learnable toy 4-topic task (labels '1'..'4', as ag_news): the topic's words occur in its sentences."""
    rng = random.Random(seed)
    (root / folder).mkdir(parents=True, exist_ok=True)
    labels = sorted(TOPICS)
    for split, n in (("train", n_train), ("test", n_test)):
        with open(root / folder / f"{split}.jsonl", "w") as f:
            for i in range(n):
                y = labels[i % len(labels)]
                words = rng.sample(FILLER, 3) + [rng.choice(TOPICS[y])]
                rng.shuffle(words)
                f.write(json.dumps({"text": " ".join(words), "label": y}) + "\n")
    return root


def write_pair_data(root: Path, folder: str = "RTE", n_train: int = 80, n_test: int = 24, seed: int = 0,
                    three_way: bool = False, labels: tuple[str, str] = ("not_entailment", "entailment")) -> Path:
    """A learnable toy entailment task in the JSONL layout (``text_a``, ``text_b``, labels ``entailment`` /
    ``not_entailment``, as RTE and QNLI): entailment iff the second sentence's sentiment word has the first's polarity.
    ``three_way``: MNLI / SNLI's labels instead (``entailment`` / ``contradiction``, every third row ``neutral``).
    ``labels``: the (no, yes) label names, e.g. MRPC's ``("0", "1")``."""
    rng = random.Random(seed)
    (root / folder).mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        with open(root / folder / f"{split}.jsonl", "w") as f:
            for i in range(n):
                a, same = rng.randrange(2), i % 2
                label = labels[1] if same else ("contradiction" if three_way else labels[0])
                if three_way and i % 3 == 2:
                    label = "neutral"
                row = {"text_a": sentence(rng, a), "text_b": sentence(rng, a if same else 1 - a), "label": label}
                f.write(json.dumps(row) + "\n")
    return root


def _bpe_tokenizer(special: dict[str, str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [" ".join(POSITIVE + NEGATIVE + FILLER)] * 50 + [
        " It was great . terrible . Yes No Maybe subjective objective World Sports Business Tech"] * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(special.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **{f"{k}_token": v for k, v in special.items()})


def build_tiny(kind: str, directory: Path, *, layers: int = 2, mlm_head: bool = True) -> Path:
    """Save a tiny random ``kind`` ∈ {bert, roberta, gpt2, llama, llama3, qwen3, gemma3} model + tokenizer in
    ``directory``."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "bert":
        from skillgraft.models.loading import bundled_minilm_path

        tok = tf.BertTokenizerFast.from_pretrained(str(bundled_minilm_path()))
        cfg = tf.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=128)
        model = tf.BertForMaskedLM(cfg) if mlm_head else tf.BertModel(cfg)
    elif kind == "roberta":
        tok = _bpe_tokenizer({"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>", "mask": "<mask>",
                              "cls": "<s>", "sep": "</s>"})
        cfg = tf.RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=130, pad_token_id=tok.pad_token_id,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        model = tf.RobertaForMaskedLM(cfg)
    elif kind == "gpt2":
        tok = _bpe_tokenizer({"bos": "<|endoftext|>", "eos": "<|endoftext|>", "unk": "<|endoftext|>"})
        cfg = tf.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=layers, n_head=2, n_positions=128,
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        model = tf.GPT2LMHeadModel(cfg)
    elif kind == "llama":
        tok = _bpe_tokenizer({"bos": "<s>", "eos": "</s>", "unk": "<unk>"})
        cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        model = tf.LlamaForCausalLM(cfg)
    elif kind == "llama3":  # Llama 3's shape: grouped-query attention, llama3 rope scaling, tied embeddings (3.2)
        tok = _bpe_tokenizer({"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "unk": "<unk>"})
        cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64},
                             tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        model = tf.LlamaForCausalLM(cfg)
    elif kind == "qwen3":  # Qwen3: per-head RMS norms on queries and keys
        tok = _bpe_tokenizer({"eos": "<|endoftext|>", "pad": "<|endoftext|>", "unk": "<unk>"})
        cfg = tf.Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                             tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        model = tf.Qwen3ForCausalLM(cfg)
    elif kind == "gemma3":
        model, tok = tiny_gemma3(layers=max(layers, 3))
    else:
        raise ValueError(kind)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def tiny_gemma3(layers: int = 3, *, softcap: float | None = 30.0, vocab_size: int | None = None,
                gguf_like: bool = False):
    """Gemma 3's architecture shrunk (Gemma3ForCausalLM: sliding-window and full-attention layers, tied embeddings,
    one key/value head, (1 + w) RMS norms; a final logit soft-cap, which the 270M model leaves off, so the
    head-only-where-scored path is checked through it) and a byte-level BPE tokenizer. ``gguf_like``: the values
    a GGUF file does not record, as transformers fills them in (Gemma 3's 5:1 sliding/full pattern, one rope base,
    query scale 256)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    tok = _bpe_tokenizer({"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"})
    cfg = tf.Gemma3TextConfig(
        vocab_size=vocab_size or len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=256 if gguf_like else 16,
        sliding_window=4, max_position_embeddings=128,
        layer_types=None if gguf_like else ["sliding_attention" if (i + 1) % 3 else "full_attention"
                                             for i in range(layers)],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}} if gguf_like else None,
        tie_word_embeddings=True, final_logit_softcapping=softcap,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = tf.Gemma3ForCausalLM(cfg)
    with torch.no_grad():  # Gemma's norms start at w = 0 (scale 1 + w): give them values a GGUF round trip can see
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.1)
    return model.eval(), tok


GGUF_WORDS = ["the", "movie", "was", "great", "terrible", "good", "bad", "it", "a", "plot", "film", "is"]


def write_tiny_gguf(path: Path, *, quantize: str | None = "Q8_0", layers: int = 6, architecture: str = "gemma3"):
    """A tiny random Gemma 3 written as llama.cpp writes one (``gguf.GGUFWriter``: llama.cpp tensor names, norms
    stored as 1 + w, a sentencepiece-style vocabulary), ``quantize`` applied to the 2-D weights whose rows fit
    its blocks (the rest F32). Returns (path, the fp32 model written)."""
    import gguf
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, get_gguf_hf_weights_map

    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "\u2581"] + [chr(c) for c in range(97, 123)] + \
        ["\u2581" + w for w in GGUF_WORDS] + [".", ","]
    model, _ = tiny_gemma3(layers=layers, softcap=None, vocab_size=len(tokens), gguf_like=True)
    cfg = model.config
    processor = TENSOR_PROCESSORS["gemma3"](config=cfg)
    names = {hf: g for g, hf in get_gguf_hf_weights_map(model, processor).items()}
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny gemma 3")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([3, 3, 3, 2] + [1] * (len(tokens) - 4))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    kind = getattr(gguf.GGMLQuantizationType, quantize) if quantize else None
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to the embedding
        data = tensor.float().numpy()
        if "norm.weight" in name:
            data = data + 1  # llama.cpp stores Gemma's RMS norm scale as 1 + w
        data = np.ascontiguousarray(data)
        if kind is not None and data.ndim == 2 and data.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0] == 0:
            writer.add_tensor(names[name], gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(names[name], data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, model


def write_imdb_test(root: Path, scratch: Path, *, seed: int, **kw) -> None:
    """An 'imdb' test set under ``root`` with the source's labels named neg/pos (as the paper's OOD set); the toy
    sentiment rows are written to ``scratch`` first."""
    import json  # noqa: PLC0415

    other = write_sentiment_data(scratch, folder="imdb", seed=seed, **kw)
    (root / "imdb").mkdir()
    with open(other / "imdb" / "test.jsonl") as f, open(root / "imdb" / "test.jsonl", "w") as out:
        for line in f:
            row = json.loads(line)
            out.write(json.dumps({**row, "label": "pos" if row["label"] == "1" else "neg"}) + "\n")


def tiny_gguf_graft(root: Path, *, quantize: str | None = "Q8_0", count: int = 6, values_dtype=None):
    """A tiny Q8_0 GGUF (:func:`write_tiny_gguf`) and a causal-mode graft on it (task SST-2): ``count`` random
    coordinates of the first two blocks' matrices and norms, θ_ft = θ_pre + small noise (rounded to
    ``values_dtype``, e.g. torch.bfloat16, when given). The other blocks' tensors stay untouched. Returns (the GGUF
    path, the graft, the base Scorer)."""
    import torch

    from skillgraft.graft import Graft, Region, graftable_names
    from skillgraft.models import build_scorer

    root.mkdir(parents=True, exist_ok=True)
    path, _ = write_tiny_gguf(root / f"tiny-{(quantize or 'f32').lower()}.gguf", quantize=quantize)
    pre = build_scorer(str(path), "SST-2", "causal")
    ft = build_scorer(str(path), "SST-2", "causal")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
            if values_dtype is not None:
                p.copy_(p.to(values_dtype))
    params = dict(pre.named_parameters())
    names = graftable_names(pre, "body")
    shapes = {n: tuple(params[n].shape) for n in names}
    touched = [n for n in names if ".layers.0." in n or ".layers.1." in n]
    idx = {n: torch.randperm(params[n].numel(), generator=gen)[:count] for n in touched}
    return path, Graft.from_models(pre, ft, Region(shapes, idx), {"task": "SST-2", "mode": "causal"}), pre
