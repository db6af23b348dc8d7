"""The router of routed skills: which skill a text is for, read off the base model's own pooled hidden states.

``skillgraft merge --routed`` fits it on each task's training rows (the texts a request would hold: a classifier's
text, a causal task's prompt up to its label) and keeps it beside the skills::

    routed/router/router.json          kind, tasks in order, threshold, pooling, dev accuracies and routes (JSON)
    routed/router/router.safetensors   its tensors (no pickle)

A router is a registered kind (:data:`ROUTERS`, ``register_router``) over features = the mean of θ_pre's hidden
states on the text's tokens, of the last layer or of every layer (the embeddings' output and each block's, side by
side: ``layers = "all"``):

- ``centroid`` / ``centroid-layers``: cosine similarity to each task's mean feature, softmax at a fitted scale;
- ``probe`` / ``probe-layers``: multinomial logistic regression on standardized features (L-BFGS, a small L2).

``auto`` (the default) fits every kind and keeps the one that routes each task's dev rows best (ties: the first
registered), the dev accuracies of all recorded. A row's shape is evidence too: the router records which tasks read
text pairs, and a pair (or a single text) is routed only among the skills of its shape, when there are any.
:meth:`RoutedSkills.route` gives each row its likeliest skill with that probability; below the router's
``threshold`` (0 unless set: every row gets a skill) the row goes to the base model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.lazy import F, torch
from skillgraft.registry import Registry

FORMAT = "skillgraft-router"
FORMAT_VERSION = 1
FOLDER = "router"
BASE = "base"        # what a row routed to no skill is said to use
MAX_TRAIN_ROWS = 512  # training rows per task the router is fitted on (a seeded sample of more)
MAX_LENGTH = 128      # tokens of a text the features read
CONFUSED_AT = 0.1     # a task whose dev rows go to another skill at this share or more is named (name its skill)


class Router:
    """A kind of router: ``fit`` features of labelled rows into named tensors; ``logits`` of features with them."""

    name: str = ""
    summary: str = ""
    layers: str = "last"  # the features it reads: the last layer's mean, or every layer's ("all")
    shapes: dict[str, str] = {}  # each tensor's shape in terms of T (tasks) and D (features): checked on load

    def fit(self, x: torch.Tensor, y: torch.Tensor, tasks: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def logits(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


ROUTERS: Registry[Router] = Registry(Router, "router")
register_router = ROUTERS.register
CHOICES = ("auto", "none")  # beside the registered kinds: fit every kind, keep the dev-best / write no router


@register_router("centroid")
class Centroid(Router):
    summary = "nearest task centroid by cosine similarity (softmax at a fitted scale)"
    shapes = {"centroids": "TD", "scale": "1"}
    SCALES = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0)

    def fit(self, x, y, tasks):
        z = F.normalize(x, dim=-1)
        c = F.normalize(torch.stack([z[y == t].mean(0) for t in range(tasks)]), dim=-1)
        sims = z @ c.T
        scale = min(self.SCALES, key=lambda s: float(F.cross_entropy(sims * s, y)))
        return {"centroids": c.contiguous(), "scale": torch.tensor([scale])}

    def logits(self, params, x):
        return F.normalize(x, dim=-1) @ params["centroids"].T * params["scale"]


@register_router("probe")
class Probe(Router):
    summary = "linear probe: multinomial logistic regression on standardized features"
    shapes = {"mean": "D", "std": "D", "weight": "TD", "bias": "T"}
    L2 = 1e-3

    def fit(self, x, y, tasks):
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        z = (x - mean) / std
        w = torch.zeros(tasks, x.shape[1], requires_grad=True)
        b = torch.zeros(tasks, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(z @ w.T + b, y) + self.L2 * (w * w).sum() / 2
            loss.backward()
            return loss

        with torch.enable_grad():
            opt.step(closure)
        return {"mean": mean, "std": std, "weight": w.detach().contiguous(), "bias": b.detach().contiguous()}

    def logits(self, params, x):
        return ((x - params["mean"]) / params["std"]) @ params["weight"].T + params["bias"]


@register_router("centroid-layers")
class CentroidLayers(Centroid):
    summary = "nearest task centroid on every layer's mean hidden state"
    layers = "all"


@register_router("probe-layers")
class ProbeLayers(Probe):
    summary = "linear probe on every layer's mean hidden state (standardized)"
    layers = "all"


@dataclass
class Route:
    """One row's route: its skill (``base`` when no skill reaches the threshold), the router's probability of the
    likeliest skill, and that skill (even when the row went to the base)."""

    skill: str
    confidence: float
    best: str

    @property
    def to_base(self) -> bool:
        return self.skill == BASE and self.best != BASE


@dataclass
class FittedRouter:
    """A router fitted for ``tasks`` (in order): its kind's tensors, the threshold and what its fit measured."""

    kind: str
    tasks: list[str]
    params: dict[str, torch.Tensor]
    threshold: float = 0.0
    info: dict = field(default_factory=dict)
    pairs: list[bool] | None = None  # per task: whether its rows are text pairs (None: not known, no restriction)

    @property
    def layers(self) -> str:
        return ROUTERS.get(self.kind).layers

    def probs(self, x: torch.Tensor, paired: Sequence[bool] | None = None) -> torch.Tensor:
        """Each row's probability per skill; ``paired`` (per row): only the skills of the row's shape, when the
        router knows the tasks' shapes and some skill has that shape."""
        p = torch.softmax(ROUTERS.get(self.kind).logits(self.params, x.float()), dim=-1)
        if paired is None or self.pairs is None:
            return p
        shape = torch.tensor(self.pairs)
        allowed = torch.tensor([bool(r) for r in paired])[:, None] == shape[None, :]
        allowed |= ~allowed.any(-1, keepdim=True)  # no skill of the row's shape: every skill may take it
        p = p * allowed
        return p / p.sum(-1, keepdim=True).clamp_min(1e-30)

    def routes(self, x: torch.Tensor, threshold: float | None = None,
               paired: Sequence[bool] | None = None) -> list[Route]:
        threshold = self.threshold if threshold is None else threshold
        p, idx = self.probs(x, paired).max(-1)
        out = []
        for conf, i in zip(p.tolist(), idx.tolist()):
            best = self.tasks[i]
            out.append(Route(best if conf >= threshold else BASE, float(conf), best))
        return out

    def save(self, folder: Path) -> Path:
        """``folder``/router.json + router.safetensors (inside an atomic output folder)."""
        from safetensors.torch import save_file  # noqa: PLC0415

        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.params.items()}, str(folder / "router.safetensors"))
        record = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": self.kind, "tasks": self.tasks,
                  "threshold": self.threshold, "pairs": self.pairs,
                  "features": "mean of the base model's hidden states, "
                              + ("every layer's side by side" if self.layers == "all" else "the last layer's"),
                  "layers": self.layers, "max_length": MAX_LENGTH, **self.info}
        (folder / "router.json").write_text(json.dumps(record, indent=2))
        return folder

    @classmethod
    def load(cls, folder: Path, tasks: Sequence[str]) -> FittedRouter:
        """Read ``folder`` (router.json, router.safetensors), checked: this format, a registered kind, the skills'
        tasks in order, each tensor of its kind's shape; one line naming the file and the field otherwise."""
        from safetensors import SafetensorError  # noqa: PLC0415
        from safetensors.torch import load_file  # noqa: PLC0415

        from skillgraft.untrusted import read_json  # noqa: PLC0415

        meta = folder / "router.json"
        record = read_json(meta, required=("format", "kind", "tasks"), what="router file")
        if record["format"] != FORMAT:
            raise SkillgraftError(f"{meta}: field 'format': {record['format']!r} is not {FORMAT!r}")
        if record["kind"] not in ROUTERS.members:
            raise SkillgraftError(f"{meta}: field 'kind': unknown router {record['kind']!r}; known: "
                                  f"{', '.join(ROUTERS.members)}")
        if record["tasks"] != list(tasks):
            raise SkillgraftError(f"{meta}: field 'tasks': {record['tasks']!r} are not the skills {list(tasks)!r}"[:300])
        threshold = record.get("threshold", 0.0)
        if type(threshold) not in (int, float) or not 0 <= threshold <= 1:
            raise SkillgraftError(f"{meta}: field 'threshold': {threshold!r} is not a probability in [0, 1]")
        try:
            params = load_file(str(folder / "router.safetensors"))
        except (OSError, SafetensorError) as e:
            raise SkillgraftError(f"{folder / 'router.safetensors'}: cannot read the router's tensors ({e})"[:300]) \
                from None
        kind = ROUTERS.get(record["kind"])
        dims = {"T": len(tasks), "1": 1}
        for name, shape in kind.shapes.items():
            t = params.get(name)
            if t is None or t.dim() != len(shape) or not t.dtype.is_floating_point:
                raise SkillgraftError(f"{folder / 'router.safetensors'}: no floating tensor {name!r} of shape "
                                      f"{shape} (a {kind.name} router)")
            for size, letter in zip(t.shape, shape):
                if dims.setdefault(letter, size) != size:
                    raise SkillgraftError(f"{folder / 'router.safetensors'}: tensor {name!r} has shape "
                                          f"{tuple(t.shape)}, not {shape} with T = {len(tasks)} tasks and the "
                                          "other tensors' D")
        pairs = record.get("pairs")
        if pairs is not None and (not isinstance(pairs, list) or len(pairs) != len(tasks)
                                  or any(type(v) is not bool for v in pairs)):
            raise SkillgraftError(f"{meta}: field 'pairs': {pairs!r} is not one true/false per task"[:300])
        routes = record.get("dev_routes")
        if routes is not None and not (isinstance(routes, dict) and all(
                t in tasks and isinstance(row, dict) and all(k in tasks and type(n) is int and n >= 0
                                                             for k, n in row.items())
                for t, row in routes.items())):
            raise SkillgraftError(f"{meta}: field 'dev_routes': {routes!r} is not, per task, a count of dev rows per "
                                  "skill"[:300])
        info = {k: v for k, v in record.items() if k not in ("format", "format_version", "kind", "tasks",
                                                              "threshold", "pairs", "layers")}
        return cls(record["kind"], list(tasks), {k: params[k].float() for k in kind.shapes}, float(threshold), info,
                   pairs)


# ---------------------------------------------------------------------------------------------- fitting
def example_text(example, task, mode: str) -> str:
    """What a request for this row would hold: the prompt up to the label for a prompt / causal task (its
    template filled), the prompt of a generative row, a classifier's text (and its pair's, after a space)."""
    if mode in ("causal", "prompt"):
        from skillgraft.models.templates import template_text  # noqa: PLC0415

        template = (task.causal_template or task.template) if mode == "causal" else task.template
        return template_text(template, example).strip()
    if mode == "generative" or not example.text_b:
        return example.text_a
    return f"{example.text_a} {example.text_b}"


def features(skills, texts: Sequence[str], layers: str = "last", batch_size: int = 32) -> torch.Tensor:
    """Mean of the base model's hidden states over each text's tokens (float32, CPU), θ_pre held meanwhile: the
    last layer's, or (``layers="all"``) every layer's side by side, the last layer's last."""
    return pooled(skills, texts, layers, batch_size).flatten(1)


def pooled(skills, texts: Sequence[str], layers: str = "last", batch_size: int = 32) -> torch.Tensor:
    """:func:`features` as ``[rows, layers, hidden]``."""
    from skillgraft.models.placement import device_of, forward_context  # noqa: PLC0415

    out = []
    with skills.base() as model, torch.no_grad():
        device = device_of(model)
        for start in range(0, len(texts), batch_size):
            enc = skills.encode(list(texts[start:start + batch_size]), max_length=MAX_LENGTH, side="right")
            enc = {k: v.to(device) for k, v in enc.items()}
            with forward_context(model):
                states = model(**enc, output_hidden_states=True).hidden_states
            mask = enc["attention_mask"].unsqueeze(-1).float()
            states = states if layers == "all" else states[-1:]
            out.append(torch.stack([((h.float() * mask).sum(1) / mask.sum(1).clamp_min(1)).cpu() for h in states],
                                   1))
    return torch.cat(out) if out else torch.empty(0, 0, 0)


def _sample(texts: Sequence[str], n: int, seed: int) -> list[str]:
    texts = list(texts)
    return texts if len(texts) <= n else random.Random(seed).sample(texts, n)


def _by_layers(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Pooled states ``[rows, layers, hidden]`` as each kind's features: every layer's and the last one's."""
    return {"all": x.flatten(1), "last": x[:, -1]}


def fit_router(skills, train: Mapping[str, Sequence[str]], dev: Mapping[str, Sequence[str]] | None = None,
               kind: str = "auto", threshold: float = 0.0, seed: int = 0,
               pairs: Mapping[str, bool] | None = None) -> FittedRouter:
    """A router for ``skills``' tasks from each task's training texts (``MAX_TRAIN_ROWS`` at most, seeded);
    ``kind="auto"``: every registered kind, the one routing ``dev``'s texts best kept (ties: the first).
    ``pairs``: whether each task's rows are text pairs (recorded; a row is then routed among its shape's skills)."""
    if kind not in (*CHOICES, *ROUTERS.members) or kind == "none":
        raise SkillgraftError(f"unknown router {kind!r}; known: auto, none, {', '.join(ROUTERS.members)}")
    tasks = skills.tasks
    empty = [t for t in tasks if not train.get(t)]
    if empty:
        raise SkillgraftError(f"no training rows to fit the router on for task(s) {', '.join(empty)}")
    rows = {t: _sample(train[t], MAX_TRAIN_ROWS, seed) for t in tasks}
    kinds = list(ROUTERS.members) if kind == "auto" else [kind]
    layers = "all" if any(ROUTERS.get(k).layers == "all" for k in kinds) else "last"
    shapes = [bool(pairs.get(t, False)) for t in tasks] if pairs is not None else None
    xs = _by_layers(pooled(skills, [s for t in tasks for s in rows[t]], layers))
    y = torch.tensor([i for i, t in enumerate(tasks) for _ in rows[t]])
    paired = [shapes[i] for i in y.tolist()] if shapes else None
    dev = {t: list(dev.get(t) or []) for t in tasks} if dev else {t: [] for t in tasks}
    xds = _by_layers(pooled(skills, [s for t in tasks for s in dev[t]], layers)) if any(dev.values()) else None
    yd = torch.tensor([i for i, t in enumerate(tasks) for _ in dev[t]])
    paired_dev = [shapes[i] for i in yd.tolist()] if shapes else None
    fitted, accuracy, picked = {}, {}, {}
    for k in kinds:
        x = xs[ROUTERS.get(k).layers]
        fitted[k] = FittedRouter(k, list(tasks), ROUTERS.get(k).fit(x, y, len(tasks)), threshold, pairs=shapes)
        train_acc = float((fitted[k].probs(x, paired).argmax(-1) == y).float().mean())
        if xds is not None:  # each dev row's skill: the kind's dev accuracy and, for the chosen kind, its dev routes
            picked[k] = fitted[k].probs(xds[ROUTERS.get(k).layers], paired_dev).argmax(-1)
        accuracy[k] = {"train": train_acc,
                       "dev": float((picked[k] == yd).float().mean()) if xds is not None else None}
    chosen = max(kinds, key=lambda k: (accuracy[k]["dev"] if accuracy[k]["dev"] is not None else -1.0,
                                       -kinds.index(k)))
    router = fitted[chosen]
    router.info = {"chosen": "dev accuracy" if kind == "auto" and xds is not None else kind,
                   "accuracy": accuracy, "rows": {t: len(rows[t]) for t in tasks},
                   "dev_rows": {t: len(dev[t]) for t in tasks}}
    if xds is not None:
        router.info["dev_routes"] = dev_routes(tasks, yd.tolist(), picked[chosen].tolist())
    return router


def dev_routes(tasks: Sequence[str], truth: Sequence[int], picked: Sequence[int]) -> dict[str, dict[str, int]]:
    """Per task with dev rows, where the router sent them: ``{task: {skill: rows}}``, skills by count (most first)."""
    out: dict[str, dict[str, int]] = {}
    for t, p in zip(truth, picked):
        row = out.setdefault(tasks[t], {})
        row[tasks[p]] = row.get(tasks[p], 0) + 1
    return {t: dict(sorted(row.items(), key=lambda kv: (-kv[1], tasks.index(kv[0])))) for t, row in out.items()}


def confused(routes: Mapping[str, Mapping[str, int]], share: float = CONFUSED_AT) -> dict[str, dict[str, float]]:
    """The tasks whose dev rows the router sends to another skill at ``share`` or more: ``{task: {other: share}}``
    (a caller should name these skills rather than ask for ``auto``: their requests look alike)."""
    out = {}
    for task, row in routes.items():
        total = sum(row.values())
        away = {k: n / total for k, n in row.items() if k != task and total and n / total >= share}
        if away:
            out[task] = away
    return out


def member_texts(member, split: str, mode: str) -> list[str]:
    """A merge member's ``split`` rows (``train`` or ``dev``) as request texts (:func:`example_text`)."""
    return [example_text(ex, member.data.task, mode) for ex in getattr(member.data, split) or []]


def member_pairs(member, mode: str) -> bool:
    """Whether a merge member's requests are text pairs (a classifier task whose training rows have a second text)."""
    return mode not in ("causal", "prompt", "generative") and any(ex.text_b for ex in member.data.train or [])
