"""Scoring and generation through :class:`~skillgraft.graft.routed.RoutedSkills`: each row's skill named or routed
(``skill="auto"``), a mixed batch grouped by skill — one swap per group, θ_pre restored bit-exactly between
groups (``RoutedSkills.use``) — and each result naming the skill it used and its graft's digest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from skillgraft.errors import SkillgraftError
from skillgraft.graft.router import BASE
from skillgraft.lazy import torch
from skillgraft.spec import MAX_LENGTH

AUTO = "auto"


@dataclass
class ScoredRow:
    """A classifier row: the skill used, its label and each label's probability (none on the base, which has no
    task head of its own); ``confidence``: the router's, when routed."""

    skill: str
    label: str | None
    probabilities: dict[str, float] = field(default_factory=dict)
    digest: str | None = None
    confidence: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Generated:
    """A completion: the skill used, the text, why it ended (``stop``: end of text or a stop string; ``length``),
    its token counts; ``confidence``: the router's, when routed."""

    skill: str
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    digest: str | None = None
    confidence: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def assign(skills, texts: Sequence[str], skill: str = AUTO, threshold: float | None = None,
           paired: bool | None = None) -> list[tuple[str, float | None]]:
    """Each row's (skill, router confidence): ``auto`` routes each text (``paired``: text pairs, routed among the
    pair skills); a skill's name (or ``base``) takes every row. An unknown name is one line listing the known ones."""
    if skill == AUTO:
        return [(r.skill, r.confidence) for r in skills.route(texts, threshold, paired=paired)]
    if skill != BASE and skill not in skills.skills:
        raise SkillgraftError(f"no skill {skill!r}; the skills are {', '.join(skills.skills)} (or auto, base)")
    return [(skill, None)] * len(texts)


def grouped(names: Sequence[str]) -> dict[str, list[int]]:
    """Positions of each skill's rows, skills in order of first appearance."""
    out: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        out.setdefault(n, []).append(i)
    return out


def holding(skills, name: str):
    """The block holding ``name``'s skill (the base for ``base``)."""
    return skills.base() if name == BASE else skills.use(name)


def _limit(model, want: int) -> int:
    n = getattr(model.config, "max_position_embeddings", None)
    return min(want, n) if isinstance(n, int) and n > 0 else want


def score(skills, texts: Sequence[str], skill: str = AUTO, *, pairs: Sequence[str] | None = None,
          threshold: float | None = None, batch_size: int = 32, max_length: int = MAX_LENGTH) -> list[ScoredRow]:
    """Each text's label under its skill (classifier skills; ``pairs``: a second text per row). Causal skills with
    label words (``merge --routed --mode causal``): each text is the prompt up to the label, each label scored by
    the summed log-probability of its word's tokens after it (:func:`word_logp`; a prompt longer than
    ``max_length`` loses its start, never the end the word follows)."""
    from skillgraft.models.placement import device_of, forward_context  # noqa: PLC0415

    texts = list(texts)
    causal = skills.kind == "generative"
    if not (skills.kind == "classifier" or causal and any(_words(skills, n) for n in skills.skills)):
        raise SkillgraftError(f"these skills are {skills.kind} models without label words, not classifiers: use "
                              "generate (the completions routes)")
    if pairs is not None and (causal or len(pairs) != len(texts)):
        raise SkillgraftError("causal skills read one prompt per row, not text pairs" if causal else
                              f"{len(texts)} texts but {len(pairs)} pairs")
    routed = assign(skills, texts if pairs is None else [f"{a} {b}" for a, b in zip(texts, pairs)], skill,
                    threshold, pairs is not None)
    out: list[ScoredRow | None] = [None] * len(texts)
    for name, idx in grouped([s for s, _ in routed]).items():
        if name == BASE:
            for i in idx:
                out[i] = ScoredRow(BASE, None, {}, None, routed[i][1])
            continue
        if causal and not _words(skills, name):
            raise SkillgraftError(f"skill {name!r} has no label words, not a classifier: use generate")
        with skills.use(name) as model, torch.no_grad():
            device = device_of(model)
            labels = [str(x) for x in skills.labels.get(name) or []] or (_words(skills, name) if causal else
                                                                          [str(model.config.id2label[i])
                                                                           for i in range(model.config.num_labels)])
            for start in range(0, len(idx), batch_size):
                part = idx[start:start + batch_size]
                if causal:
                    probs = torch.softmax(word_logp(skills, model, [texts[i] for i in part], _words(skills, name),
                                                    _limit(model, max_length)), -1)
                else:
                    enc = skills.encode([texts[i] for i in part], pairs=[pairs[i] for i in part] if pairs else None,
                                        max_length=_limit(model, max_length))
                    with forward_context(model):
                        probs = torch.softmax(model(**{k: v.to(device) for k, v in enc.items()}).logits.float(), -1)
                for i, p in zip(part, probs.cpu().tolist()):
                    best = max(range(len(p)), key=p.__getitem__)
                    out[i] = ScoredRow(name, labels[best] if best < len(labels) else str(best),
                                       {labels[j] if j < len(labels) else str(j): v for j, v in enumerate(p)},
                                       skills.digests.get(name), routed[i][1])
    return out  # type: ignore[return-value]


def _words(skills, name: str) -> list[str]:
    """A causal skill's label words (the labels themselves when none were recorded apart)."""
    return [str(w) for w in skills.label_words.get(name) or skills.labels.get(name) or []]


def word_logp(skills, model, prompts: Sequence[str], words: Sequence[str], max_length: int) -> torch.Tensor:
    """``[rows, labels]``: Σ log p of each label word's tokens (after a space, :func:`word_ids`) following each
    prompt, under ``model`` as held; one forward when every word is one token, else one per label. A prompt is
    tokenized as the causal scorer renders it (models/templates.py ``render``: BOS only where the tokenizer's
    ``add_bos_token`` says so), cut from the left to fit."""
    from skillgraft.models.logits import head_logits  # noqa: PLC0415
    from skillgraft.models.placement import device_of, forward_context  # noqa: PLC0415
    from skillgraft.models.templates import word_ids  # noqa: PLC0415

    tok = skills.tokenizer
    ids = [word_ids(tok, w) for w in words]
    bos = [tok.bos_token_id] if getattr(tok, "add_bos_token", False) and tok.bos_token_id is not None else []
    room = max_length - max(len(i) for i in ids) - len(bos)
    if room < 1:
        raise SkillgraftError(f"label words {list(words)} leave no room for a prompt in {max_length} tokens")
    with skills._tokenizing:
        body = tok(list(prompts), add_special_tokens=False)["input_ids"]
    heads = [bos + b[-room:] for b in body]
    if not all(heads):
        raise SkillgraftError("an empty prompt: a causal skill scores the word after a prompt")
    device = device_of(model)
    lengths = torch.tensor([len(h) for h in heads])
    single = all(len(i) == 1 for i in ids)
    out = []
    for word in [[]] if single else ids:  # each prompt's tokens, then the word's, right-padded
        seq = torch.full((len(heads), int(lengths.max()) + len(word)), tok.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros_like(seq)
        for r, h in enumerate(heads):
            seq[r, :len(h) + len(word)] = torch.tensor(h + word)
            mask[r, :len(h) + len(word)] = 1
        cols = lengths.unsqueeze(1) - 1 + torch.arange(max(len(word), 1))  # the positions that predict the word
        with forward_context(model):
            logits = head_logits(model, {"input_ids": seq.to(device), "attention_mask": mask.to(device)},
                                 torch.arange(len(heads)).unsqueeze(1).to(device), cols.to(device))
        logp = torch.log_softmax(logits.float(), -1).cpu()
        if single:
            return logp[:, 0, [i[0] for i in ids]]
        out.append(logp.gather(-1, torch.tensor(word).expand(len(heads), -1).unsqueeze(-1)).squeeze(-1).sum(-1))
    return torch.stack(out, 1)


def generate(skills, prompts: Sequence[str], skill: str = AUTO, *, max_new_tokens: int = 32,
             temperature: float = 0.0, top_p: float = 1.0, stop: Sequence[str] | None = None,
             threshold: float | None = None, batch_size: int = 8) -> list[Generated]:
    """Each prompt's completion under its skill (causal skills): greedy at ``temperature`` 0, else sampled; cut at
    the first ``stop`` string."""
    from skillgraft.models.placement import device_of  # noqa: PLC0415

    prompts = list(prompts)
    if skills.kind != "generative":
        raise SkillgraftError(f"these skills are {skills.kind} models, not causal LMs: use score (the scoring "
                              "route)")
    if max_new_tokens < 1:
        raise SkillgraftError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    routed = assign(skills, prompts, skill, threshold)
    out: list[Generated | None] = [None] * len(prompts)
    eos = skills.tokenizer.eos_token_id
    pad = skills.tokenizer.pad_token_id
    for name, idx in grouped([s for s, _ in routed]).items():
        with holding(skills, name) as model, torch.no_grad():
            device = device_of(model)
            room = _limit(model, 1 << 20) - max_new_tokens
            if room < 1:
                raise SkillgraftError(f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's "
                                      f"{_limit(model, 1 << 20)} positions")
            for start in range(0, len(idx), batch_size):
                part = idx[start:start + batch_size]
                enc = skills.encode([prompts[i] for i in part], max_length=min(room, 4096), side="left")
                kwargs = {"max_new_tokens": max_new_tokens, "pad_token_id": pad, "do_sample": temperature > 0}
                if temperature > 0:
                    kwargs.update(temperature=temperature, top_p=top_p)
                else:
                    kwargs.update(temperature=None, top_p=None, top_k=None)
                seqs = model.generate(**{k: v.to(device) for k, v in enc.items()}, **kwargs).cpu()
                width = enc["input_ids"].shape[1]
                for i, row, mask in zip(part, seqs[:, width:].tolist(), enc["attention_mask"].tolist()):
                    ended = eos is not None and eos in row
                    ids = row[:row.index(eos)] if ended else row
                    text = skills.decode(ids)
                    cut = min((text.find(s) for s in stop or () if s and s in text), default=-1)
                    if cut >= 0:
                        text, ended = text[:cut], True
                    out[i] = Generated(name, text, "stop" if ended else "length", int(sum(mask)), len(ids),
                                       skills.digests.get(name), routed[i][1])
    return out  # type: ignore[return-value]
