"""Routed skills: one base model plus each task's graft and head, the task's graft applied per request.

When the task of a request is known, no merge is needed: θ_t = θ_pre + γ_t ⊙ (θ_ft,t − θ_pre) (paper Eq. 1) with
the task's own head, switched in one flat write (graft/flat.py) plus the head. ``skillgraft merge --routed`` writes the folder:

    routed/base/            θ_pre as a Hugging Face checkpoint (with its tokenizer)
    routed/skills/<task>/   each task's graft (positions, values, its head), graft_config.json + graft.safetensors
    routed/routed.json      the tasks, their labels and bytes (with ``--keep τ``: each task's keep search)
    routed/router/          which skill a text is for (:mod:`skillgraft.graft.router`; absent with --router none)

and :class:`RoutedSkills` reads it::

    skills = RoutedSkills.from_pretrained("out/routed")
    with skills.use("SST-2") as model:            # θ_pre + SST-2's graft and head; θ_pre again, bit for bit, after
        logits = model(**skills.tokenizer(texts, return_tensors="pt", padding=True)).logits
    for task, idx, model in skills.batches(tasks_of_requests):   # a mixed-task batch, grouped by task
        ...
    skills.route(texts)                            # each text's skill and the router's confidence
    skills.score(texts, skill="auto")              # classifier skills: each row's skill, label and probabilities
    skills.generate(prompts, skill="auto")         # causal skills: each prompt's skill and completion

Concurrent callers are safe (:class:`_Gate`): one skill holds the model at a time, shared by its callers.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.flat import prepare_skills
from skillgraft.graft.graft import Graft, active_graft
from skillgraft.graft.identity import _REGISTRATIONS, _watch_registrations
from skillgraft.spec import MAX_LENGTH

FORMAT = "skillgraft-routed"
FORMAT_VERSION = 1


def write_routed(folder: Path, pre, grafts: dict[str, Graft], labels: dict[str, list[str]],
                 keep: dict[str, dict] | None = None, words: dict[str, list[str]] | None = None) -> dict:
    """Write ``folder`` (inside an atomic output folder): θ_pre's model and tokenizer, each graft, routed.json
    (``keep``: each task's keep search, ``skillgraft merge --routed --keep τ``, recorded beside its graft; ``words``:
    a causal task's label words, one per label, which :meth:`RoutedSkills.score` reads after its prompts)."""
    model = pre.model
    arch = getattr(model.config, "architectures", None)
    try:
        model.save_pretrained(folder / "base")
    finally:
        model.config.architectures = arch  # save_pretrained writes the class name into the shared config
    pre.tokenizer.save_pretrained(folder / "base")
    tasks = {}
    for name, g in grafts.items():
        path = g.save_pretrained(folder / "skills" / name)
        tasks[name] = {"path": f"skills/{name}", "labels": list(labels.get(name) or []), "size": g.size,
                       "bytes": (path / "graft.safetensors").stat().st_size}
        if keep and name in keep:
            tasks[name]["keep"] = keep[name]
        if words and words.get(name):
            tasks[name]["label_words"] = [str(w) for w in words[name]]
    record = {"format": FORMAT, "format_version": FORMAT_VERSION, "base": "base", "tasks": tasks}
    (folder / "routed.json").write_text(json.dumps(record, indent=2))
    return record


def read_routed(folder: Path) -> dict:
    """``routed.json`` of ``folder``, checked before anything is loaded: a JSON object of this format naming the
    base and each task's skill folder (``path``) inside ``folder`` (:func:`skillgraft.untrusted.inside`: an absolute
    path or ``..`` out of it is refused, not loaded), with its labels a list. One line naming the file and the field."""
    from skillgraft.untrusted import read_json  # noqa: PLC0415
    from skillgraft.untrusted import inside  # noqa: PLC0415

    meta = folder / "routed.json"
    record = read_json(meta, required=("format", "base", "tasks"), what="routed skills file")
    if record["format"] != FORMAT:
        raise SkillgraftError(f"{meta}: field 'format': {record['format']!r} is not {FORMAT!r}")
    version = record.get("format_version", FORMAT_VERSION)
    if type(version) is not int or not 1 <= version <= FORMAT_VERSION:
        raise SkillgraftError(f"{meta}: field 'format_version': {version!r} is not one this skillgraft reads "
                              f"(1…{FORMAT_VERSION})")
    inside(folder, record["base"], meta, "base")
    tasks = record["tasks"]
    if not isinstance(tasks, dict) or not tasks:
        raise SkillgraftError(f"{meta}: field 'tasks' must be an object of task name → skill, got {tasks!r}"[:300])
    for name, t in tasks.items():
        if not isinstance(t, dict):
            raise SkillgraftError(f"{meta}: field 'tasks.{name}' must be an object, got {type(t).__name__}")
        inside(folder, t.get("path"), meta, f"tasks.{name}.path")
        labels = t.get("labels", [])
        if not isinstance(labels, list) or not all(isinstance(x, (str, int)) for x in labels):
            raise SkillgraftError(f"{meta}: field 'tasks.{name}.labels' must be a list of labels, got {labels!r}")
        words = t.get("label_words")
        if words is not None and (not isinstance(words, list) or len(words) != len(labels)
                                  or not all(isinstance(x, str) and x.strip() for x in words)):
            raise SkillgraftError(f"{meta}: field 'tasks.{name}.label_words' must be one word per label "
                                  f"({len(labels)}), got {words!r}"[:300])
        if t.get("keep") is not None and not isinstance(t["keep"], dict):
            raise SkillgraftError(f"{meta}: field 'tasks.{name}.keep' must be an object, got {t['keep']!r}")
    if record.get("router") is not None:
        inside(folder, record["router"], meta, "router")
    return record


def attach_router(folder: Path, router) -> dict:
    """Write ``router`` (:class:`~skillgraft.graft.router.FittedRouter`) into ``folder``/router/ and name it in
    routed.json (inside an atomic output folder)."""
    from skillgraft.graft.router import FOLDER  # noqa: PLC0415

    router.save(folder / FOLDER)
    record = read_routed(folder)
    record["router"] = FOLDER
    (folder / "routed.json").write_text(json.dumps(record, indent=2))
    return record


class _Gate:
    """Which skill the one model holds, shared by every caller of that skill (or of the base, ``None``).

    A caller of another skill waits until the model is free: the last caller of a skill reverts it (θ_pre bit-exact
    again), the first of the next applies its own. A waiting caller of another skill stops new callers of the held
    one from joining, so no skill starves. A thread already inside ``use(A)`` may enter ``use(A)`` again (it does
    not wait on itself); ``use(B)`` inside ``use(A)`` in one thread is refused in one line (it would wait forever)."""

    def __init__(self):
        import threading  # noqa: PLC0415

        self.cond = threading.Condition()
        self.local = threading.local()
        self.holders = 0          # callers inside the held skill's block
        self.current = None       # the held skill (None: the base) while holders > 0
        self.undo = None          # reverts what entering the held skill wrote
        self.waiting: dict = {}   # skill → callers waiting for it
        self.swaps = 0            # skills applied (each once per group of callers)

    def held(self) -> list:
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def acquire(self, skill, enter) -> None:
        """Wait until ``skill`` holds the model (``enter(skill)`` applies it, returning its undo)."""
        stack = self.held()
        if stack:
            if stack[-1] != skill:
                raise SkillgraftError(f"skill {skill or 'base'!r} asked for inside skill {stack[-1] or 'base'!r} in "
                                      "one thread: leave the first `use` block before entering another skill's")
            with self.cond:
                self.holders += 1
            stack.append(skill)
            return
        with self.cond:
            self.waiting[skill] = self.waiting.get(skill, 0) + 1
            try:
                while self.holders and (self.current != skill
                                        or any(n for s, n in self.waiting.items() if s != skill)):
                    self.cond.wait()
            finally:
                self.waiting[skill] -= 1
                if not self.waiting[skill]:
                    del self.waiting[skill]
            if not self.holders:
                try:
                    self.undo = enter(skill)
                except BaseException:
                    self.cond.notify_all()
                    raise
                self.current = skill
                self.swaps += skill is not None
            self.holders += 1
        stack.append(skill)

    def release(self) -> None:
        """Leave the held skill; the last caller out reverts it and lets the waiting callers in."""
        self.held().pop()
        with self.cond:
            self.holders -= 1
            if self.holders:
                return
            undo, self.undo, self.current = self.undo, None, None
            try:
                if undo is not None:
                    undo()
            finally:
                self.cond.notify_all()


class RoutedSkills:
    """A base model and named skills (grafts with their heads); :meth:`use` applies one for a block.

    Safe under concurrent callers: one skill holds the model at a time, shared by every caller of that skill;
    a caller of another skill waits until the last one leaves, and θ_pre is restored bit-exactly in between."""

    def __init__(self, model, tokenizer, skills: dict[str, Graft], labels: dict[str, list[str]] | None = None,
                 keep: dict[str, dict] | None = None, router=None, digests: dict[str, str] | None = None,
                 label_words: dict[str, list[str]] | None = None):
        import threading  # noqa: PLC0415

        self.model, self.tokenizer, self.skills = model, tokenizer, skills
        self.labels = labels or {}
        self.label_words = label_words or {}  # causal classifier skills: the word read after the prompt per label
        self.keep = keep or {}  # each task's keep search (size, shares, bound, confidence), when sized by --keep
        self.router = router    # a FittedRouter (skillgraft.graft.router), None for a folder written without one
        self.digests = digests or {}  # each skill's graft files' content digest
        self._gate = _Gate()
        self._tokenizing = threading.Lock()  # a fast tokenizer is not safe to call from two threads at once
        if getattr(tokenizer, "pad_token_id", 1) is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        self._params = None  # (registrations seen, the model's named parameters)
        self._room = prepare_skills(model, skills.values())  # one flat write per swap (graft/flat.py)

    def _named(self) -> dict:
        """The model's named parameters, walked again only when a parameter or module was registered since."""
        _watch_registrations()
        if self._params is None or self._params[0] != _REGISTRATIONS[0]:
            self._params = (_REGISTRATIONS[0], dict(self.model.named_parameters()))
        return self._params[1]

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, *, runtime=None, **model_kwargs) -> RoutedSkills:
        """Read a ``routed/`` folder written by ``skillgraft merge --routed`` (the model in eval mode), the model
        placed on ``runtime`` (a :class:`~skillgraft.models.placement.Runtime`, passed down by ``serve`` and
        ``merge --routed``; None: the active placement, if any)."""
        import transformers  # noqa: PLC0415

        folder = Path(folder)
        meta = folder / "routed.json"
        if not meta.is_file():
            raise SkillgraftError(f"{folder}: no routed.json (write one with `skillgraft merge … --routed`)")
        record = read_routed(folder)
        base = folder / record["base"]
        from skillgraft.models.vet import vet_folder  # noqa: PLC0415

        vet_folder(base)  # no code of its own, no pickle that runs code, no config that lies (models/vet.py)
        config = transformers.AutoConfig.from_pretrained(base)
        arch = (getattr(config, "architectures", None) or ["AutoModel"])[0]
        model_cls = getattr(transformers, arch, None) or transformers.AutoModel
        from skillgraft.models.placement import boundary, load_dtype, place  # noqa: PLC0415

        runtime = boundary(runtime)  # read once: the caller's, else the active one
        if load_dtype(None, runtime) is not None and "dtype" not in model_kwargs:
            model_kwargs["dtype"] = load_dtype(None, runtime)
        model = place(model_cls.from_pretrained(base, **model_kwargs).eval(), runtime)  # its device and precision
        tokenizer = transformers.AutoTokenizer.from_pretrained(base)
        skills = {name: Graft.from_pretrained(folder / t["path"]) for name, t in record["tasks"].items()}
        router = None
        if record.get("router") is not None:
            from skillgraft.graft.router import FittedRouter  # noqa: PLC0415

            router = FittedRouter.load(folder / record["router"], list(skills))
        from skillgraft.digest import file_digest  # noqa: PLC0415

        digests = {name: file_digest(sorted((folder / t["path"]).iterdir())) for name, t in record["tasks"].items()}
        return cls(model, tokenizer, skills, {name: t.get("labels") or [] for name, t in record["tasks"].items()},
                   {name: t["keep"] for name, t in record["tasks"].items() if t.get("keep")}, router, digests,
                   {name: t["label_words"] for name, t in record["tasks"].items() if t.get("label_words")})

    @property
    def tasks(self) -> list[str]:
        return list(self.skills)

    @property
    def kind(self) -> str:
        """``classifier`` (a sequence-classification head per skill), ``generative`` (a causal LM) or ``other``."""
        name = type(self.model).__name__
        return "classifier" if name.endswith("ForSequenceClassification") else \
            "generative" if name.endswith("ForCausalLM") or name.endswith("ForConditionalGeneration") else "other"

    def encode(self, texts: Sequence[str], *, pairs: Sequence[str] | None = None, max_length: int = MAX_LENGTH,
               side: str = "right") -> dict:
        """Token ids and attention mask of ``texts`` (padded on ``side``; cut to ``max_length``), thread-safe."""
        if not texts:
            raise SkillgraftError("no texts given")
        with self._tokenizing:
            was, self.tokenizer.padding_side = self.tokenizer.padding_side, side
            try:
                enc = self.tokenizer(list(texts), list(pairs) if pairs is not None else None, return_tensors="pt",
                                     padding=True, truncation=True, max_length=max_length)
            finally:
                self.tokenizer.padding_side = was
        return dict(enc)

    def decode(self, ids: Sequence[int]) -> str:
        with self._tokenizing:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def score(self, texts: Sequence[str], skill: str = "auto", **kwargs) -> list:
        """Each text's label under its skill (classifier skills, and causal skills with label words: each text is
        the prompt up to the label, the label word likeliest after it wins): ``skill="auto"`` routes each row, a
        name (or ``base``) takes them all; rows grouped by skill, one swap per group
        (:func:`skillgraft.graft.routed_calls.score`: ``pairs``, ``threshold``, ``batch_size``)."""
        from skillgraft.graft.routed_calls import score  # noqa: PLC0415

        return score(self, texts, skill, **kwargs)

    def generate(self, prompts: Sequence[str], skill: str = "auto", **kwargs) -> list:
        """Each prompt's completion under its skill (causal skills), grouped as :meth:`score`
        (:func:`skillgraft.graft.routed_calls.generate`: ``max_new_tokens``, ``temperature``, ``top_p``, ``stop``)."""
        from skillgraft.graft.routed_calls import generate  # noqa: PLC0415

        return generate(self, prompts, skill, **kwargs)

    def route(self, texts: Sequence[str], threshold: float | None = None, *,
              paired: bool | Sequence[bool] | None = None) -> list:
        """Each text's :class:`~skillgraft.graft.router.Route`: its likeliest skill and the router's probability of
        it; a row below ``threshold`` (default: the router's own) goes to the base (``skill == "base"``).
        ``paired`` (one for all rows, or per row): whether the row is a text pair (its two texts joined by a space
        in ``texts``) — routed only among the skills of its shape, when the router knows them."""
        from skillgraft.graft.router import features  # noqa: PLC0415

        if self.router is None:
            raise SkillgraftError("these routed skills have no router (written with --router none, or before "
                                  "routers existed): name a skill, or re-run `skillgraft merge --routed`")
        if threshold is not None and not 0 <= threshold <= 1:
            raise SkillgraftError(f"threshold {threshold!r} is not a probability in [0, 1]")
        if isinstance(paired, bool):
            paired = [paired] * len(texts)
        if paired is not None and len(paired) != len(texts):
            raise SkillgraftError(f"{len(texts)} texts but {len(paired)} paired flags")
        return self.router.routes(features(self, texts, self.router.layers), threshold, paired)

    @property
    def swaps(self) -> int:
        """How many times a skill was applied (once per group of callers of one skill)."""
        return self._gate.swaps

    @contextlib.contextmanager
    def use(self, task: str) -> Iterator:
        """The model with ``task``'s graft and head for the block; θ_pre restored bit-exactly after (a head with
        another number of labels is swapped in whole, and the config's labels with it). Concurrent callers of
        one task share the block; a caller of another task waits for it to end."""
        if task not in self.skills:
            raise SkillgraftError(f"no skill {task!r}; the skills are {', '.join(self.skills)}")
        self._gate.acquire(task, self._enter)
        try:
            yield self.model
        finally:
            self._gate.release()

    @contextlib.contextmanager
    def base(self) -> Iterator:
        """The model as θ_pre for the block (callers of a skill wait for it to end, as for :meth:`use`)."""
        self._gate.acquire(None, self._enter)
        try:
            yield self.model
        finally:
            self._gate.release()

    def _enter(self, task: str | None):
        """Apply ``task``'s graft, head and labels (nothing for the base); returns what reverts them."""
        if task is None:
            return None
        graft = self.skills[task]
        params = self._named()
        reshaped = []
        config = self.model.config
        saved = {k: getattr(config, k, None) for k in ("id2label", "label2id")}

        def undo():
            try:
                if _applied_here(graft, self.model):
                    graft.revert(self.model)
            finally:
                for p, data in reversed(reshaped):
                    p.data = data
                for k, v in saved.items():
                    if getattr(config, k, None) != v:  # a config's setattr validates: costly per swap
                        setattr(config, k, v)

        try:
            for name, t in graft.carried.items():
                p = params.get(name.removeprefix("model."))
                if p is not None and p.shape != t.shape:
                    reshaped.append((p, p.data))
                    room = self._room.get(name.removeprefix("model."))
                    p.data = room[:t.numel()].view(t.shape) if room is not None and room.numel() >= t.numel() \
                        else torch.empty(t.shape, dtype=p.dtype, device=p.device)
            labels = self.labels.get(task)
            if labels and config.id2label != dict(enumerate(labels)):
                config.id2label = dict(enumerate(labels))
                config.label2id = {lab: i for i, lab in enumerate(labels)}
            graft.apply(self.model)
        except BaseException:
            undo()
            raise
        return undo

    @staticmethod
    def grouped(tasks: Sequence[str]) -> dict[str, list[int]]:
        """Positions of each task's requests in a mixed batch, tasks in order of first appearance."""
        out: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            out.setdefault(t, []).append(i)
        return out

    def batches(self, tasks: Sequence[str]) -> Iterator[tuple[str, list[int], object]]:
        """``(task, positions, model)`` per task of a mixed batch, the task's skill applied while it is handled."""
        for task, idx in self.grouped(tasks).items():
            with self.use(task) as model:
                yield task, idx, model


def _applied_here(graft: Graft, model) -> bool:
    """Whether ``graft`` is the graft applied to ``model`` (a failed apply leaves none)."""
    try:
        return active_graft(graft._target(model)) is graft
    except SkillgraftError:
        return False


def switch_seconds(skills: RoutedSkills, repeats: int = 5) -> float:
    """Median seconds of one switch: entering and leaving :meth:`RoutedSkills.use` (apply + revert), every task."""
    import time  # noqa: PLC0415

    times = []
    for _ in range(repeats):
        for task in skills.tasks:
            t0 = time.perf_counter()
            with skills.use(task):
                pass
            times.append(time.perf_counter() - t0)
    return float(sorted(times)[len(times) // 2])
