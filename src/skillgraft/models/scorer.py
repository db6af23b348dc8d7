"""Scorer: any Hugging Face model wrapped to return one logit per label of a task.

Modes (everything downstream sees only a Scorer):

* ``head``   — standard fine-tuning: a linear head on a pooled representation (``cls``, ``mean`` or
  ``last`` token). The head is new, so it is not part of the pre-trained model.
* ``prompt`` — masked LM with an LM-BFF template: the logits of the label words at the mask position.
  Encoders shipped without MLM-head weights score the mask's hidden state against the frozen input
  embeddings of the label words (a tied decoder), so no new parameters are introduced.
* ``causal`` — autoregressive LM: the summed log-probability of each label word's tokens after the
  template's prompt; multi-token label words are scored whole, never cut to their first token.
* ``classifier`` — a user's ``AutoModelForSequenceClassification`` checkpoint scored with its own head
  (``model.classifier.*`` / ``model.score.*``; labels from ``config.id2label`` or declared). On the
  pre-trained side that head (and a pooler the checkpoint lacks) does not exist: it is *carried*.
* ``generative`` — a causal LM fine-tuned on prompt→completion pairs. A batch holds the gold completion
  tokens; ``forward`` gives each example's mean completion-token log-probability and :meth:`Scorer.loss`
  the token cross-entropy on completion tokens only (docs/generative.md).

Every kind has :meth:`Scorer.loss` (the training / localization objective) and :meth:`Scorer.hits` (what
"accuracy" means while a localizer picks its best step: correct labels, or correct next completion tokens).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Literal

from skillgraft.lazy import F, nn, no_grad, torch
from skillgraft.data.tasks import Task, get_task, task_from_dict
from skillgraft.errors import SkillgraftError
from skillgraft.models.loading import ModelRef, OpenedModel, Weights, load, load_hf_model
from skillgraft.models.inputs import ScorerInputs
from skillgraft.models.logits import head_logits
from skillgraft.models.templates import word_ids
from skillgraft.spec import MAX_LENGTH

Mode = Literal["head", "prompt", "causal", "classifier", "generative"]
MODES = ("head", "prompt", "causal", "classifier", "generative")
Pooling = Literal["cls", "mean", "last"]
SCORER_CONFIG = "scorer_config.json"
HEAD_FILE = "head.safetensors"


class Scorer(ScorerInputs, nn.Module):
    """A model + tokenizer + task that maps examples to label logits ``[batch, num_labels]``.

    Parameters are named ``model.*`` (the Hugging Face model) and, in head mode, ``head.*``. ``carried``
    names the tensors of ``model.*`` that are a task head the pre-trained model does not have (classifier
    mode: the checkpoint's classification head and a pooler missing from θ_pre); they travel whole. Its inputs
    (``collate``, ``candidate_batch``) are :class:`~skillgraft.models.inputs.ScorerInputs`'s.
    """

    def __init__(self, model: nn.Module, tokenizer, task: Task, mode: Mode, *, pooling: Pooling = "mean",
                 max_length: int = MAX_LENGTH, base_model: str = "", tied_decoder: bool = False, head_seed: int = 0,
                 carried=(), runtime=None, ref: ModelRef | None = None):
        super().__init__()
        if mode not in MODES:
            raise SkillgraftError(f"unknown scorer mode {mode!r}; use {', '.join(MODES)}")
        if pooling not in ("cls", "mean", "last"):
            raise SkillgraftError(f"unknown pooling {pooling!r}; use cls, mean or last")
        limit = position_limit(model)
        if limit is not None and max_length > limit:
            raise SkillgraftError(f"--max-length {max_length} is more than the {limit} positions "
                                  f"{base_model or type(model).__name__} has learned; give at most {limit}")
        self.model = model
        self.tokenizer = tokenizer
        self.task = task
        self.mode = mode
        self.pooling = pooling
        self.max_length = max_length
        self.base_model = base_model
        self.ref = ref  # the model reference it was loaded from (None: a saved model folder), passed down
        self.tied_decoder = tied_decoder
        self.carried = frozenset(carried)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        if mode == "classifier":
            self.head = None
            n = getattr(model.config, "num_labels", None)
            if n != task.num_labels:
                raise SkillgraftError(f"{base_model or 'model'}: the classification head has {n} outputs but the "
                                      f"data has {task.num_labels} labels {list(task.labels)}")
        elif mode == "generative":
            self.head = None
            self.label_ids = [self.completion_ids(c) for c in task.labels]  # candidate completions (may be none)
        elif mode == "head":
            hidden = model.get_input_embeddings().embedding_dim
            hidden = getattr(model.config, "hidden_size", hidden)
            gen = torch.Generator().manual_seed(head_seed)
            self.head = nn.Linear(hidden, task.num_labels)  # drawn in fp32 on the CPU: the same head everywhere
            with torch.no_grad():
                bound = 1.0 / hidden ** 0.5
                self.head.weight.uniform_(-bound, bound, generator=gen)
                self.head.bias.zero_()
            body = next(model.parameters(), None)
            if body is not None:  # the body's device and dtype (a bf16 checkpoint: a bf16 head)
                self.head.to(device=body.device, dtype=body.dtype)
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
            if mode == "causal" and not self.single_token:
                self._room_for_words()  # refused before any work: words that leave the prompt no position
            self.register_buffer("label_token_ids", torch.tensor([ids[0] for ids in self.label_ids]),
                                 persistent=False)
        from skillgraft.models.placement import place  # noqa: PLC0415

        place(self, runtime)  # the run's device and precision (models/placement.py); a no-op outside a placed run

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, score_pos: torch.Tensor | None = None,
                target_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Label logits ``[batch, num_labels]`` (``labels`` is accepted and ignored).

        Generative mode: each example's mean log-probability of its completion tokens ``[batch]`` (a
        :meth:`candidate_batch` gives ``[batch, num_labels]`` summed log-probabilities instead). Under
        ``bf16-mixed`` the pass runs in bf16 autocast (models/placement.py ``forward_context``).
        """
        from skillgraft.models.placement import forward_context  # noqa: PLC0415

        with forward_context(self):
            return self._forward(input_ids, attention_mask, score_pos, target_ids, token_type_ids, candidates)

    def _forward(self, input_ids, attention_mask, score_pos, target_ids, token_type_ids, candidates):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        if self.mode == "classifier":
            return self.model(**kwargs).logits
        if self.mode == "generative":
            logp, valid = self._token_logp(kwargs, target_ids)
            if candidates is not None:
                return logp.sum(-1).view(-1, int(candidates))
            return logp.sum(-1) / valid.sum(-1).clamp(min=1)
        if self.mode == "head":
            hidden = self.model(**kwargs).last_hidden_state
            pooled = self._pool(hidden, attention_mask)
            return self.head(pooled.to(self.head.weight.dtype))
        if self.mode == "prompt":
            if self.tied_decoder:
                hidden = self.model(**kwargs).last_hidden_state[rows, score_pos]
                words = self.model.get_input_embeddings().weight[self.label_token_ids]
                return hidden @ words.detach().T
            return head_logits(self.model, kwargs, rows, score_pos)[:, self.label_token_ids]
        if target_ids is None:  # causal, one token per label word: the position before it
            logits = head_logits(self.model, kwargs, rows, score_pos)
            return torch.log_softmax(logits.float(), dim=-1)[:, self.label_token_ids]
        return self._word_logp(kwargs, target_ids).view(-1, self.task.num_labels)

    def _word_logp(self, kwargs: dict, target_ids: torch.Tensor) -> torch.Tensor:
        """Σ log p of each row's label-word tokens ``[rows]``: the head reads only the L positions from the one
        before the word's first token (L = the longest label word; its tokens are contiguous), a static shape
        that ``vmap`` (per-example Fisher) can batch."""
        target = target_ids[:, 1:]
        valid = target != -100
        width = max(len(ids) for ids in self.label_ids)
        start = valid.int().argmax(-1, keepdim=True)  # first target position of each row
        cols = start + torch.arange(width, device=target.device)
        inside = cols < target.shape[1]
        cols = cols.clamp(max=target.shape[1] - 1)
        rows = torch.arange(target.shape[0], device=target.device).unsqueeze(1)
        logp = torch.log_softmax(head_logits(self.model, kwargs, rows, cols).float(), dim=-1)
        words = target.gather(1, cols)
        keep = inside & (words != -100)
        picked = logp.gather(-1, words.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep
        return picked.sum(-1)

    def _completion_logits(self, kwargs: dict, target_ids: torch.Tensor):
        """Logits ``[N, vocab]`` at the N completion positions only (where ``target_ids[:, 1:]`` ≠ -100), with
        their (row, column) and their target tokens."""
        target = target_ids[:, 1:]
        rows, cols = (target != -100).nonzero(as_tuple=True)
        return head_logits(self.model, kwargs, rows, cols), rows, cols, target[rows, cols]

    def _token_logp(self, kwargs: dict, target_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log p of every target token given the tokens before it (0 where the target is -100), and the mask;
        the head runs only at completion positions."""
        return self._logp_of(*self._completion_logits(kwargs, target_ids), target_ids)

    def completion_eval(self, batch: dict[str, torch.Tensor]
                        ) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]:
        """Generative mode, one forward pass for all: each example's mean completion log-probability ``[batch]``
        (as :meth:`forward`), the teacher-forced (correct, count) of :meth:`hits`, and the (row, top token id) at
        every completion position, in order (the model's most likely next token given the prompt and the
        completion's tokens before it; no sampling)."""
        from skillgraft.models.placement import forward_context  # noqa: PLC0415

        kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with forward_context(self):
            logits, rows, cols, words = self._completion_logits(kwargs, batch["target_ids"])
        logp, valid = self._logp_of(logits, rows, cols, words, batch["target_ids"])
        top = logits.argmax(-1)
        return logp.sum(-1) / valid.sum(-1).clamp(min=1), (top == words).sum(), len(words), rows, top

    @staticmethod
    def _logp_of(logits, rows, cols, words, target_ids) -> tuple[torch.Tensor, torch.Tensor]:
        nll = F.cross_entropy(logits.float(), words, reduction="none")
        target = target_ids[:, 1:]
        logp = torch.zeros(target.shape, dtype=nll.dtype, device=nll.device).index_put((rows, cols), -nll)
        return logp, target != -100

    def loss(self, batch: dict[str, torch.Tensor], reduction: Literal["mean", "sum"] = "mean") -> torch.Tensor:
        """The objective on a :meth:`collate` batch: cross-entropy of the labels; generative mode: each
        example's mean token cross-entropy on its completion tokens only (then averaged or summed)."""
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        if self.mode == "generative":
            per_example = -self(**inputs)
            return per_example.sum() if reduction == "sum" else per_example.mean()
        return F.cross_entropy(self(**inputs).float(), batch["labels"], reduction=reduction)

    @no_grad
    def hits(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """(correct, count) on a :meth:`collate` batch: labels predicted right; generative mode: completion
        tokens that are the model's most likely next token (teacher forcing)."""
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        if self.mode == "generative":
            from skillgraft.models.placement import forward_context  # noqa: PLC0415

            kwargs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
            with forward_context(self):
                logits, _, _, words = self._completion_logits(kwargs, inputs["target_ids"])
            return (logits.argmax(-1) == words).sum(), len(words)
        labels = batch["labels"]
        return (self(**inputs).argmax(-1) == labels).sum(), len(labels)

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
                "base_model": self.base_model, "tied_decoder": self.tied_decoder, "carried": sorted(self.carried),
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
                        dtype: torch.dtype | None = None, runtime=None) -> Scorer:
        """Load a Scorer saved by :meth:`save_pretrained` (a fine-tuned run's ``model/`` folder)."""
        from safetensors.torch import load_file  # noqa: PLC0415

        directory = Path(directory)
        cfg_path = directory / SCORER_CONFIG
        if not cfg_path.is_file():
            raise SkillgraftError(
                f"{directory}: no {SCORER_CONFIG}; not a skillgraft model folder (for a plain Hugging Face "
                "checkpoint use build_scorer(name_or_path, task, mode))"
            )
        cfg = _read_scorer_config(cfg_path)
        task = get_task(task) if task is not None else task_from_config(cfg["task"], str(cfg_path))
        mode = cfg["mode"]
        kind = "base" if mode == "head" or cfg.get("tied_decoder") else LOADS[mode]
        ref = ModelRef(str(directory), str(directory))  # a saved model folder: nothing to resolve
        loaded = load(ref, kind, labels=task.labels, dtype=dtype, runtime=runtime)  # one entry: tokenizer, weights
        scorer = cls(loaded.model, loaded.tokenizer, task, mode, pooling=cfg["pooling"], max_length=cfg["max_length"],
                     base_model=cfg.get("base_model", ""), tied_decoder=cfg.get("tied_decoder", False),
                     carried=cfg.get("carried", ()), runtime=runtime)
        if mode == "head":
            head_path = directory / HEAD_FILE
            if not head_path.is_file():
                raise SkillgraftError(f"{directory}: head mode scorer but {HEAD_FILE} is missing")
            from skillgraft.models.headers import check_safetensors  # noqa: PLC0415

            check_safetensors(head_path)  # its header bounded before safetensors reads it (models/headers.py)
            try:
                state = load_file(str(head_path))
            except Exception as e:  # noqa: BLE001 - a truncated or damaged file (safetensors' own error type)
                raise SkillgraftError(f"{head_path}: unreadable head ({str(e).splitlines()[0]})") from None
            if set(state) != {"weight", "bias"} or state["weight"].dim() != 2:
                raise SkillgraftError(f"{head_path}: expected tensors 'weight' [labels, hidden] and 'bias', got "
                                      f"{ {k: list(v.shape) for k, v in state.items()} }")
            if state["weight"].shape[0] != task.num_labels:
                raise SkillgraftError(
                    f"{head_path}: the head has {state['weight'].shape[0]} outputs but task {task.name!r} has "
                    f"{task.num_labels} labels"
                )
            scorer.head.load_state_dict(state)
        return scorer


def task_from_config(spec: dict, source: str) -> Task:
    """The task a scorer config records (a registered-style task, or a generative one)."""
    if isinstance(spec, dict) and spec.get("kind") == "generative":
        from skillgraft.data.user import GenerativeTask  # noqa: PLC0415

        return GenerativeTask.from_dict(spec)
    return task_from_dict(spec, source)


def _read_scorer_config(path: Path) -> dict:
    """``scorer_config.json``: a JSON object with a known mode and pooling and an integer max_length."""
    from skillgraft.untrusted import read_json  # noqa: PLC0415

    cfg = read_json(path, required=("task", "mode", "pooling", "max_length"), what="scorer config")
    if cfg["mode"] not in MODES or cfg["pooling"] not in ("cls", "mean", "last"):
        raise SkillgraftError(f"{path}: unreadable scorer config (mode {cfg['mode']!r}, pooling {cfg['pooling']!r}; "
                              f"expected one of {', '.join(MODES)} and cls, mean or last)")
    n = cfg["max_length"]
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 2**31 - 1:
        raise SkillgraftError(f"{path}: field 'max_length' must be a positive integer, got {n!r}")
    if not isinstance(cfg["task"], dict):
        raise SkillgraftError(f"{path}: field 'task' must be an object, got {type(cfg['task']).__name__}")
    return cfg


def position_limit(model: nn.Module) -> int | None:
    """How many tokens a model with learned absolute position embeddings (BERT's ``position_embeddings``,
    GPT-2's ``wpe``; RoBERTa's offset by its padding index) can take; None for rotary / relative positions."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and name.rpartition(".")[2] in ("position_embeddings", "wpe"):
            offset = module.padding_idx + 1 if module.padding_idx is not None else 0
            return module.num_embeddings - offset
    return None


def build_scorer(model_name: str | ModelRef | OpenedModel | None, task: Task | str, mode: Mode = "head", *,
                 pooling: Pooling | None = None, max_length: int = MAX_LENGTH, head_seed: int = 0,
                 dtype: torch.dtype | None = None, runtime=None, tensors=None) -> Scorer:
    """A Scorer for ``task`` from a hub name or local path (None: the bundled MiniLM), a model reference a run
    resolved once (:class:`~skillgraft.models.loading.ModelRef`), or a model the run opened once
    (:class:`~skillgraft.models.loading.OpenedModel`: a checkpoint pair's, its tokenizer compared before any weights
    load; its weights loaded here, as the rest of that opening; ``tensors``, with an opened model: a classifier's
    weights already in memory, which it is built on instead of reading its files: :class:`~skillgraft.models.loading.Weights`).

    ``classifier`` mode loads ``AutoModelForSequenceClassification`` with one output per task label (a
    checkpoint without that head gets a new one, carried); ``generative`` loads ``AutoModelForCausalLM``.
    ``runtime``: the run's placement, passed down from its verb (None: the active one, if any).
    """
    task = get_task(task)
    if mode not in LOADS:
        raise SkillgraftError(f"unknown scorer mode {mode!r}; use {', '.join(MODES)}")
    with torch.random.fork_rng(devices=[]):  # CPU only: models load there first
        torch.manual_seed(0)  # weights missing from the checkpoint (e.g. a pooler) initialise the same every time
        want = Weights(LOADS[mode], tuple(task.labels), mode == "prompt", dtype, runtime, tensors=tensors)
        # resolved, its tokenizer and weights: one entry into models/loading.py (or the rest of the model's opening)
        loaded = model_name.weights(want) if isinstance(model_name, OpenedModel) else load(
            model_name, want.kind, labels=want.labels, mlm_check=want.mlm_check, dtype=dtype, runtime=runtime)
    if loaded.tied_decoder:
        _tied_warning(loaded.ref.name, 3)  # at build_scorer's caller
    if pooling is None:
        from skillgraft.models.families import default_pooling  # noqa: PLC0415

        pooling = default_pooling(loaded.model.config, mode)  # the one table of model-family quirks
    return Scorer(loaded.model, loaded.tokenizer, task, mode, pooling=pooling, max_length=max_length,
                  base_model=loaded.ref.name, tied_decoder=loaded.tied_decoder, head_seed=head_seed,
                  carried=["model." + n for n in loaded.carried], runtime=runtime, ref=loaded.ref)


LOADS = {"head": "base", "prompt": "mlm", "causal": "causal", "generative": "causal", "classifier": "classifier"}


def _tied_warning(name: str, stacklevel: int) -> None:
    """Said once where a masked LM without MLM-head weights is scored through its tied input embeddings."""
    warnings.warn(
        f"{name}: no masked-LM head weights in the checkpoint; prompt mode scores label words by "
        "the mask's hidden state against their frozen input embeddings (tied decoder).",
        stacklevel=stacklevel,
    )


def load_for_mode(ref, mode: str, dtype, runtime=None):
    """The bare model of ``mode`` from a reference, weights only (an exporter's base; no tokenizer): ``(model,
    tied_decoder)``."""
    tied = False
    if mode == "head":
        model = load_hf_model(ref.path, "base", dtype=dtype, runtime=runtime)
    elif mode == "prompt":
        model, has_mlm_head = load_hf_model(ref.path, "mlm", dtype=dtype, with_mlm_check=True, runtime=runtime)
        if not has_mlm_head:
            _tied_warning(ref.name, 4)  # at the caller of load_for_mode's caller
            tied = True
    elif mode in ("causal", "generative"):
        model = load_hf_model(ref.path, "causal", dtype=dtype, runtime=runtime)
    else:
        raise SkillgraftError(f"unknown scorer mode {mode!r}; use {', '.join(MODES)}")
    return model, tied


def batch_loss(scorer, batch: dict[str, torch.Tensor], reduction: Literal["mean", "sum"] = "mean") -> torch.Tensor:
    """``scorer.loss(batch)`` when the scorer has one, else cross-entropy of its logits and ``batch['labels']``
    (any module mapping a batch to label logits, e.g. a joint multi-task scorer)."""
    if hasattr(scorer, "loss"):
        return scorer.loss(batch, reduction=reduction)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return F.cross_entropy(scorer(**inputs).float(), batch["labels"], reduction=reduction)


@no_grad
def batch_hits(scorer, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """``scorer.hits(batch)`` when the scorer has one, else (argmax == labels).sum() and the batch size."""
    if hasattr(scorer, "hits"):
        return scorer.hits(batch)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return (scorer(**inputs).argmax(-1) == batch["labels"]).sum(), len(batch["labels"])
