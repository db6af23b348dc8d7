"""Tiny randomly initialised models (BERT, RoBERTa, GPT-2, Llama) and a tiny task dataset, built in-test."""

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


def write_sentiment_data(root: Path, folder: str = "SST-2", n_train: int = 200, n_test: int = 80, seed: int = 0) -> Path:
    """A learnable toy sentiment task in the JSONL layout: label '1' iff a positive word occurs."""
    rng = random.Random(seed)
    (root / folder).mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        with open(root / folder / f"{split}.jsonl", "w") as f:
            for i in range(n):
                y = i % 2
                f.write(json.dumps({"text": sentence(rng, y), "label": str(y)}) + "\n")
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
    """Save a tiny random ``kind`` ∈ {bert, roberta, gpt2, llama} model + tokenizer in ``directory``."""
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
    else:
        raise ValueError(kind)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
