"""Label log-probabilities of a causal-mode Scorer's task computed by llama.cpp (llama-cpp-python) on a GGUF file,
from the Scorer's own token ids (so both sides read the same tokens): the reader of ``make test-gguf`` and
bench/gguf_export.py. Needs ``llama_cpp`` (``make test-gguf`` installs it)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def scorer_logprobs(scorer, examples, batch_size: int = 32) -> np.ndarray:
    """``[n, labels]``: what the Scorer computes (causal mode: the log-probability of each label word)."""
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            out.append(scorer(**scorer.collate(examples[i:i + batch_size])).float().cpu().numpy())
    return np.concatenate(out)


def llama_logprobs(path: str | os.PathLike, scorer, examples, *, threads: int | None = None) -> np.ndarray:
    """``[n, labels]``: the same log-probabilities computed by llama.cpp on the GGUF file ``path``."""
    from llama_cpp import Llama

    batch = scorer.collate(examples)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    single = "score_pos" in batch  # one token per label word: only the logits before it are needed
    llm = Llama(model_path=str(Path(path)), n_ctx=int(ids.shape[1]) + 8, n_batch=512, logits_all=not single,
                verbose=False, n_threads=threads or int(os.environ.get("OMP_NUM_THREADS", "1")), seed=0)
    rows = []
    for r in range(ids.shape[0]):
        tokens = ids[r, : int(mask[r].sum())].tolist()
        llm.reset()
        if single:  # the prompt up to the scored position; llama.cpp computes the last position's logits only
            llm.eval(tokens[: int(batch["score_pos"][r]) + 1])
            last = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
            rows.append(_log_softmax(last)[scorer.label_token_ids.tolist()])
            continue
        llm.eval(tokens)
        scores = np.asarray(llm.scores[: len(tokens)])
        target = batch["target_ids"][r, 1: len(tokens)].tolist()  # multi-token label words: Σ log p of the
        rows.append(sum(_log_softmax(scores[j])[t] for j, t in enumerate(target) if t != -100))  # word's tokens
    out = np.asarray(rows, dtype=np.float64)
    del llm
    return out if single else out.reshape(len(examples), -1)
