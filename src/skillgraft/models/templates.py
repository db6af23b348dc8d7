"""Rendering LM-BFF templates into token ids, never truncating the mask or the template away."""

from __future__ import annotations

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError


def _special(tokenizer, *names: str) -> int | None:
    for name in names:
        value = getattr(tokenizer, f"{name}_token_id", None)
        if value is not None:
            return value
    return None


def _sentence(part: str, example: Example) -> str | None:
    """Text of a sentence slot (``sent_0``, ``+sentl_1``, ``sent-_0`` …) or None for other parts."""
    body = part.lstrip("+")
    if not body.startswith("sent"):
        return None
    index = body.rsplit("_", 1)[-1]
    if index not in ("0", "1"):
        raise SkillgraftError(f"template slot {part!r}: sentence index must be 0 or 1")
    text = example.text_a if index == "0" else (example.text_b or "")
    modifier = body[len("sent"):-len("_" + index)]
    if "-" in modifier:
        text = text[:-1]
    if "l" in modifier and text:
        text = text[0].lower() + text[1:]
    if "u" in modifier and text:
        text = text[0].upper() + text[1:]
    if part.startswith("+"):
        text = " " + text
    return text


def template_text(template: str, example: Example) -> str:
    """The text of an LM-BFF template filled with ``example``, up to its ``*mask*`` (a causal prompt as a string:
    special-token slots are left to the tokenizer, ``_`` is a space). ``*cls**sent_0*_It_was*mask*.`` → ``'… It
    was'``."""
    out = []
    for part in (p for p in template.split("*") if p):
        if part == "mask":
            return "".join(out)
        if part in ("cls", "sep", "sep+"):
            continue
        text = _sentence(part, example)
        out.append(part.replace("_", " ") if text is None else text)
    raise SkillgraftError(f"template {template!r} has no *mask*")


def word_ids(tokenizer, word: str) -> list[int]:
    """Token ids of a label word as it follows other text (leading space), without stray space tokens."""
    ids = tokenizer.encode(" " + word, add_special_tokens=False)
    while len(ids) > 1 and not tokenizer.decode(ids[:1]).strip():
        ids = ids[1:]
    if not ids:
        raise SkillgraftError(f"label word {word!r} encodes to no tokens")
    return ids


def render(template: str, example: Example, tokenizer, max_length: int, *, causal: bool = False
           ) -> tuple[list[int], int]:
    """Token ids of ``template`` filled with ``example`` and the index of the mask slot.

    For ``causal=True`` the sequence stops right before ``*mask*`` (the label word is predicted next) and
    the returned index is the last prompt token. Sentences are cut longest-first so that the whole
    sequence fits ``max_length`` while every template token and the mask survive.
    """
    parts = [p for p in template.split("*") if p]
    pieces: list[list[int] | str] = []  # token ids, or the marker "mask"
    sentence_slots: list[int] = []
    for part in parts:
        if part == "mask":
            if causal:
                break
            mask = _special(tokenizer, "mask")
            if mask is None:
                raise SkillgraftError("prompt mode needs a tokenizer with a mask token (use causal mode for LMs)")
            pieces.append([mask])
            pieces.append("mask")
        elif part == "cls":
            tok = _special(tokenizer, "bos") if causal else _special(tokenizer, "cls", "bos")
            if causal and not getattr(tokenizer, "add_bos_token", False):
                tok = None
            if tok is not None:
                pieces.append([tok])
        elif part in ("sep", "sep+"):
            tok = _special(tokenizer, "sep", "eos")
            if tok is not None:
                pieces.append([tok])
        else:
            text = _sentence(part, example)
            if text is None:
                text = part.replace("_", " ")
            else:
                sentence_slots.append(len(pieces))
            pieces.append(tokenizer.encode(text, add_special_tokens=False) if text else [])
    if causal and "mask" not in parts:
        raise SkillgraftError(f"template {template!r} has no *mask*")
    fixed = sum(len(p) for i, p in enumerate(pieces) if i not in sentence_slots and p != "mask")
    budget = max_length - fixed
    if budget < len(sentence_slots):
        raise SkillgraftError(
            f"max_length={max_length} is too short for the template {template!r} ({fixed} template tokens)"
        )
    lengths = {i: len(pieces[i]) for i in sentence_slots}
    while sum(lengths.values()) > budget:
        longest = max(lengths, key=lambda i: lengths[i])
        excess = sum(lengths.values()) - budget
        second = max([v for i, v in lengths.items() if i != longest], default=0)
        lengths[longest] -= max(1, min(excess, lengths[longest] - second))
    ids: list[int] = []
    mask_index = -1
    for i, piece in enumerate(pieces):
        if piece == "mask":
            mask_index = len(ids) - 1
            continue
        ids.extend(piece[: lengths[i]] if i in lengths else piece)
    if causal:
        mask_index = len(ids) - 1
    return ids, mask_index
