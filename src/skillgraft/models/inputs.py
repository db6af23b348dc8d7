"""How a Scorer's examples become a batch: tokenized through the task's template (or as prompt→completion pairs),
fitted to ``max_length`` and padded (:class:`ScorerInputs`, the inputs half of
:class:`~skillgraft.models.scorer.Scorer`)."""

from __future__ import annotations

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.lazy import torch
from skillgraft.models.templates import render


class ScorerInputs:
    """A Scorer's inputs: :meth:`collate` (a batch with ``labels`` for ``forward``), :meth:`candidate_batch` and
    the token ids of prompts and completions. Reads the scorer's ``tokenizer``, ``task``, ``mode``, ``max_length``
    and, in causal and generative modes, its ``label_ids``."""

    def collate(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """Tokenize a list of examples into a batch (with ``labels``) for :meth:`forward`."""
        if not examples:
            raise SkillgraftError("cannot build a batch from zero examples")
        labels = torch.tensor([ex.label for ex in examples])
        if self.mode == "generative":
            return self._collate_generative(examples, labels)
        if self.mode in ("head", "classifier"):
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
        room = self._room_for_words() if causal and not self.single_token else self.max_length
        rendered = self.__dict__.setdefault("_rendered", {})  # each example tokenized once, not once per step
        for ex in examples:
            hit = rendered.get((template, ex, causal, room))
            if hit is None:
                try:
                    hit = render(template, ex, self.tokenizer, room, causal=causal)
                except SkillgraftError as e:
                    if room == self.max_length:
                        raise
                    raise SkillgraftError(f"{e}, once the longest label word's tokens are set aside "
                                          f"({self.max_length - room} of max_length={self.max_length})") from None
                if len(rendered) < 200_000:
                    rendered[(template, ex, causal, room)] = hit
            rows.append(hit[0])
            positions.append(hit[1])
        if causal and not self.single_token:
            return self._collate_multi_token(rows, labels)
        ids, mask = _pad(rows, self.tokenizer.pad_token_id)
        return {"input_ids": ids, "attention_mask": mask, "score_pos": torch.tensor(positions), "labels": labels}

    def _room_for_words(self) -> int:
        """Positions a causal prompt may take when the label word follows it (multi-token words): ``max_length``
        less the longest word. Before, the prompt took all of ``max_length`` and the word went past it (past the
        model's positions: an IndexError)."""
        longest = max(range(len(self.label_ids)), key=lambda i: len(self.label_ids[i]))
        room = self.max_length - len(self.label_ids[longest])
        if room < 1:
            raise SkillgraftError(
                f"task {self.task.name!r}: label word {self.task.label_words[longest][:60]!r} is "
                f"{len(self.label_ids[longest])} tokens for this tokenizer, which leaves no position for the prompt "
                f"within max_length={self.max_length}; use shorter label words or a larger --max-length")
        return room

    def completion_ids(self, completion: str) -> list[int]:
        """Token ids of a completion as the loss sees them: its tokens, then EOS (the model learns to stop)."""
        ids = self.tokenizer.encode(completion, add_special_tokens=False)
        eos = self.tokenizer.eos_token_id
        return ids + ([eos] if eos is not None else [])

    def prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of a prompt (with the tokenizer's own special tokens, e.g. Llama's BOS)."""
        return self.tokenizer(prompt)["input_ids"]

    def _fit(self, prompt: list[int], completion: list[int]) -> tuple[list[int], list[int]]:
        """Cut a (prompt, completion) pair to ``max_length``: the completion's end, then the prompt's start."""
        completion = completion[: self.max_length - 1]
        return prompt[max(0, len(prompt) - (self.max_length - len(completion))):], completion

    def _collate_generative(self, examples: list[Example], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        seqs, targets = [], []
        for ex in examples:
            if ex.text_b is None:
                raise SkillgraftError("generative scoring needs prompt→completion examples (no completion given)")
            prompt, completion = self._fit(self.prompt_ids(ex.text_a), self.completion_ids(ex.text_b))
            seqs.append(prompt + completion)
            targets.append([-100] * len(prompt) + completion)
        input_ids, mask = _pad(seqs, self.tokenizer.pad_token_id)
        target_ids, _ = _pad(targets, -100)
        return {"input_ids": input_ids, "attention_mask": mask, "target_ids": target_ids, "labels": labels}

    def candidate_batch(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """Generative mode with label-like completions: every example × every candidate completion; ``forward``
        of this batch gives ``[batch, num_labels]`` summed completion log-probabilities."""
        if not self.label_ids:
            raise SkillgraftError("these completions are open-ended (no label set): no candidates to rank")
        rows = [self.prompt_ids(ex.text_a) for ex in examples]
        width = self.max_length - max(len(c) for c in self.label_ids)
        if width < 1:
            longest = max(self.task.labels, key=lambda c: len(self.completion_ids(c)))
            raise SkillgraftError(f"completion {longest[:60]!r} is {self.max_length - width} tokens, which leaves no "
                                  f"position for the prompt within max_length={self.max_length}; use shorter "
                                  "completions or a larger --max-length")
        rows = [r[max(0, len(r) - width):] for r in rows]
        batch = self._collate_multi_token(rows, torch.tensor([ex.label for ex in examples]))
        batch["candidates"] = torch.tensor(len(self.label_ids))
        return batch

    def _collate_multi_token(self, rows: list[list[int]], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        seqs, targets = [], []
        for ids in rows:
            for word in self.label_ids:
                seqs.append(ids + word)
                targets.append([-100] * len(ids) + word)
        input_ids, mask = _pad(seqs, self.tokenizer.pad_token_id)
        target_ids, _ = _pad(targets, -100)
        return {"input_ids": input_ids, "attention_mask": mask, "target_ids": target_ids, "labels": labels}


def _pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask
