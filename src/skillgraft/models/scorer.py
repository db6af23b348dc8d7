"""Scorer: any Hugging Face model wrapped to return one logit per label of a task.

Modes (everything downstream sees only a Scorer):

* ``head``   — standard fine-tuning: a linear head on a pooled representation (``cls``, ``mean`` or
  ``last`` token). The head is new, so it is not part of the pre-trained model.
* ``prompt`` — masked LM with an LM-BFF template: the logits of the label words at the mask position.
  Encoders shipped without MLM-head weights score the mask's hidden state against the frozen input
  embeddings of the label words (a tied decoder), so no new parameters are introduced.
* ``causal`` — autoregressive LM: the summed log-probability of each label word's tokens after the
  template's prompt; multi-token label words are scored whole, never cut to their first token.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from skillgraft.data.loading import Example
from skillgraft.data.tasks import Task, get_task, task_from_dict
from skillgraft.errors import SkillgraftError
from skillgraft.models.loading import load_hf_model, load_tokenizer, model_reference
from skillgraft.models.templates import render, word_ids

Mode = Literal["head", "prompt", "causal"]
Pooling = Literal["cls", "mean", "last"]
SCORER_CONFIG = "scorer_config.json"
HEAD_FILE = "head.safetensors"


class Scorer(nn.Module):
    """A model + tokenizer + task that maps examples to label logits ``[batch, num_labels]``.

    Parameters are named ``model.*`` (the Hugging Face model) and, in head mode, ``head.*``.
    """

    def __init__(self, model: nn.Module, tokenizer, task: Task, mode: Mode, *, pooling: Pooling = "mean",
                 max_length: int = 128, base_model: str = "", tied_decoder: bool = False, head_seed: int = 0):
        super().__init__()
        if mode not in ("head", "prompt", "causal"):
            raise SkillgraftError(f"unknown scorer mode {mode!r}; use head, prompt or causal")
        if pooling not in ("cls", "mean", "last"):
            raise SkillgraftError(f"unknown pooling {pooling!r}; use cls, mean or last")
        self.model = model
        self.tokenizer = tokenizer
        self.task = task
        self.mode = mode
        self.pooling = pooling
        self.max_length = max_length
        self.base_model = base_model
        self.tied_decoder = tied_decoder
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        if mode == "head":
            hidden = model.get_input_embeddings().embedding_dim
            hidden = getattr(model.config, "hidden_size", hidden)
            gen = torch.Generator().manual_seed(head_seed)
            self.head = nn.Linear(hidden, task.num_labels)
            with torch.no_grad():
                bound = 1.0 / hidden ** 0.5
                self.head.weight.uniform_(-bound, bound, generator=gen)
                self.head.bias.zero_()
        else:
            self.head = None
            self.label_ids = [word_ids(tokenizer, w) for w in task.label_words]
            if mode == "prompt":
                bad = [(w, ids) for w, ids in zip(task.label_words, self.label_ids) if len(ids) != 1]
                if bad:
                    w, ids = bad[0]
                    raise SkillgraftError(
                        f"task {task.name!r}: label word {w!r} is {len(ids)} tokens for this tokenizer "
                        f"({tokenizer.convert_ids_to_tokens(ids)}); a masked LM scores one token per mask. "
                        "Register the task with single-token label words, or use causal mode."
                    )
            self.single_token = all(len(ids) == 1 for ids in self.label_ids)
            self.register_buffer("label_token_ids", torch.tensor([ids[0] for ids in self.label_ids]),
                                 persistent=False)

    # ------------------------------------------------------------------ inputs
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def collate(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """Tokenize a list of examples into a batch (with ``labels``) for :meth:`forward`."""
        if not examples:
            raise SkillgraftError("cannot build a batch from zero examples")
        labels = torch.tensor([ex.label for ex in examples])
        if self.mode == "head":
            texts = [ex.text_a for ex in examples]
            pairs = [ex.text_b for ex in examples] if self.task.kind == "pair" else None
            enc = self.tokenizer(texts, pairs, truncation=True, max_length=self.max_length, padding=True,
                                 return_tensors="pt")
            batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
            if "token_type_ids" in enc:
                batch["token_type_ids"] = enc["token_type_ids"]
            batch["labels"] = labels
            return batch
        causal = self.mode == "causal"
        template = (self.task.causal_template or self.task.template) if causal else self.task.template
        rows, positions = [], []
        for ex in examples:
            ids, pos = render(template, ex, self.tokenizer, self.max_length, causal=causal)
            rows.append(ids)
            positions.append(pos)
        if causal and not self.single_token:
            return self._collate_multi_token(rows, labels)
        ids, mask = _pad(rows, self.tokenizer.pad_token_id)
        return {"input_ids": ids, "attention_mask": mask, "score_pos": torch.tensor(positions), "labels": labels}

    def _collate_multi_token(self, rows: list[list[int]], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        seqs, targets = [], []
        for ids in rows:
            for word in self.label_ids:
                seqs.append(ids + word)
                targets.append([-100] * len(ids) + word)
        input_ids, mask = _pad(seqs, self.tokenizer.pad_token_id)
        target_ids, _ = _pad(targets, -100)
        return {"input_ids": input_ids, "attention_mask": mask, "target_ids": target_ids, "labels": labels}

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, score_pos: torch.Tensor | None = None,
                target_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        """Label logits ``[batch, num_labels]`` (``labels`` is accepted and ignored)."""
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        if self.mode == "head":
            hidden = self.model(**kwargs).last_hidden_state
            return self.head(self._pool(hidden, attention_mask))
        if self.mode == "prompt":
            if self.tied_decoder:
                hidden = self.model(**kwargs).last_hidden_state[rows, score_pos]
                words = self.model.get_input_embeddings().weight[self.label_token_ids]
                return hidden @ words.detach().T
            logits = self.model(**kwargs).logits[rows, score_pos]
            return logits[:, self.label_token_ids]
        logits = self.model(**kwargs).logits
        if target_ids is None:
            return torch.log_softmax(logits[rows, score_pos].float(), dim=-1)[:, self.label_token_ids]
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        target = target_ids[:, 1:]
        picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (target != -100)
        return picked.sum(-1).view(-1, self.task.num_labels)

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "last":
            last = mask.sum(1) - 1
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)

    # ------------------------------------------------------------------ persistence
    def scorer_config(self) -> dict:
        from dataclasses import asdict  # noqa: PLC0415

        return {"mode": self.mode, "pooling": self.pooling, "max_length": self.max_length,
                "base_model": self.base_model, "tied_decoder": self.tied_decoder,
                "task": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self.task).items()}}

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write an ordinary HF checkpoint + tokenizer, plus ``scorer_config.json`` (and the head)."""
        from safetensors.torch import save_file  # noqa: PLC0415

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        if self.head is not None:
            save_file({k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()},
                      str(directory / HEAD_FILE))
        (directory / SCORER_CONFIG).write_text(json.dumps(self.scorer_config(), indent=2))

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, *, task: Task | str | None = None,
                        dtype: torch.dtype | None = None) -> Scorer:
        """Load a Scorer saved by :meth:`save_pretrained` (a fine-tuned run's ``model/`` folder)."""
        from safetensors.torch import load_file  # noqa: PLC0415

        directory = Path(directory)
        cfg_path = directory / SCORER_CONFIG
        if not cfg_path.is_file():
            raise SkillgraftError(
                f"{directory}: no {SCORER_CONFIG}; not a skillgraft model folder (for a plain Hugging Face "
                "checkpoint use build_scorer(name_or_path, task, mode))"
            )
        try:
            cfg = json.loads(cfg_path.read_text())
            saved_task = task_from_dict(cfg["task"], str(cfg_path))
        except (json.JSONDecodeError, KeyError) as e:
            raise SkillgraftError(f"{cfg_path}: unreadable scorer config ({e})") from None
        task = get_task(task) if task is not None else saved_task
        mode = cfg["mode"]
        kind = "base" if mode == "head" or cfg.get("tied_decoder") else ("mlm" if mode == "prompt" else "causal")
        model = load_hf_model(str(directory), kind, dtype=dtype)
        tokenizer = load_tokenizer(str(directory))
        scorer = cls(model, tokenizer, task, mode, pooling=cfg["pooling"], max_length=cfg["max_length"],
                     base_model=cfg.get("base_model", ""), tied_decoder=cfg.get("tied_decoder", False))
        if mode == "head":
            head_path = directory / HEAD_FILE
            if not head_path.is_file():
                raise SkillgraftError(f"{directory}: head mode scorer but {HEAD_FILE} is missing")
            try:
                state = load_file(str(head_path))
            except Exception as e:  # noqa: BLE001 - a truncated or damaged file (safetensors' own error type)
                raise SkillgraftError(f"{head_path}: unreadable head ({str(e).splitlines()[0]})") from None
            if state["weight"].shape[0] != task.num_labels:
                raise SkillgraftError(
                    f"{head_path}: the head has {state['weight'].shape[0]} outputs but task {task.name!r} has "
                    f"{task.num_labels} labels"
                )
            scorer.head.load_state_dict(state)
        return scorer


def _pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def build_scorer(model_name: str | None, task: Task | str, mode: Mode = "head", *, pooling: Pooling | None = None,
                 max_length: int = 128, head_seed: int = 0, dtype: torch.dtype | None = None) -> Scorer:
    """A pre-trained Scorer for ``task`` from a hub name or local path (None: the bundled MiniLM)."""
    task = get_task(task)
    ref = model_reference(model_name)
    tokenizer = load_tokenizer(ref.path)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # weights missing from the checkpoint (e.g. a pooler) initialise the same every time
        model, tied = _load_for_mode(ref, mode, dtype)
    if pooling is None:
        pooling = "last" if getattr(model.config, "is_decoder", False) or mode == "causal" or \
            model.config.model_type in ("gpt2", "llama", "mistral", "qwen2", "gpt_neox") else "mean"
    return Scorer(model, tokenizer, task, mode, pooling=pooling, max_length=max_length, base_model=ref.name,
                  tied_decoder=tied, head_seed=head_seed)


def _load_for_mode(ref, mode: str, dtype):
    tied = False
    if mode == "head":
        model = load_hf_model(ref.path, "base", dtype=dtype)
    elif mode == "prompt":
        model, has_mlm_head = load_hf_model(ref.path, "mlm", dtype=dtype, with_mlm_check=True)
        if not has_mlm_head:
            warnings.warn(
                f"{ref.name}: no masked-LM head weights in the checkpoint; prompt mode scores label words by "
                "the mask's hidden state against their frozen input embeddings (tied decoder).",
                stacklevel=3,
            )
            tied = True
    elif mode == "causal":
        model = load_hf_model(ref.path, "causal", dtype=dtype)
    else:
        raise SkillgraftError(f"unknown scorer mode {mode!r}; use head, prompt or causal")
    return model, tied
