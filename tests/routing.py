"""Routed folders made directly (no merge run): a base and a few skills, each a graft of random coordinates of a
noisy copy, written by :func:`skillgraft.graft.routed.write_routed` — the routing, threading and serving tests'
inputs."""

from __future__ import annotations

import json
import random

import torch

from skillgraft.graft import Graft, Region, graftable_names
from skillgraft.models import build_scorer

# (skill name, registered task): the classifiers' labels differ (2 and 4), so a switch swaps the head's shape too
CLASSIFIER_SKILLS = (("sentiment", "SST-2"), ("topic", "ag_news"))
CAUSAL_SKILLS = (("sentiment", "SST-2"), ("topic", "ag_news"))


def write_routed_folder(base, out, mode: str = "classifier", skills=CLASSIFIER_SKILLS, *, count: int = 400,
                        scale: float = 0.3, seed: int = 0, words: bool = False):
    """``out`` as ``merge --routed`` writes it, from the tiny model ``base``: each skill a graft of ``count``
    random coordinates per body tensor of a copy moved by ``scale`` (large enough that skills answer differently);
    ``words``: causal skills keep their task's labels and label words, as ``merge --routed --mode causal``."""
    from skillgraft.graft.routed import write_routed

    pre = build_scorer(str(base), skills[0][1], mode)
    gen = torch.Generator().manual_seed(seed)
    grafts, labels = {}, {}
    for name, task in skills:
        ft = build_scorer(str(base), task, mode)
        with torch.no_grad():
            for p in ft.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * scale)
        params = dict(pre.named_parameters())
        shapes = {n: tuple(params[n].shape) for n in graftable_names(pre, "body")}
        idx = {n: torch.randperm(params[n].numel(), generator=gen)[:min(count, params[n].numel())] for n in shapes}
        grafts[name] = Graft.from_models(pre, ft, Region(shapes, idx), {"task": task, "mode": mode})
        labels[name] = list(ft.task.labels) if mode == "classifier" or words else []
    write_routed(out, pre, grafts, labels,
                 words={name: list(build_scorer(str(base), task, mode).task.label_words) for name, task in skills}
                 if words else None)
    return out


WORDS = {"sentiment": ["great", "terrible", "lovely", "awful", "fine", "boring"],
         "topic": ["football", "election", "market", "science", "league", "senate"]}


def skill_rows(n: int, seed: int = 0) -> dict[str, list[str]]:
    """Per skill, ``n`` texts whose words tell the skill apart (what a router must learn)."""
    rng = random.Random(seed)
    return {name: [" ".join(rng.choice(words) for _ in range(5)) for _ in range(n)] for name, words in WORDS.items()}


def write_jsonl(path, texts: list[str], labels: list[str]):
    path.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in zip(texts, labels)))
    return path
