"""``skillgraft merge``: several fine-tuned models of one base → one model, stitched from their localized regions,
beside mergekit's dense merges of the same checkpoints (report.md).

1. Inputs are checked before any weights load (:func:`check_inputs`): one data source per model, no model twice,
   one architecture, shapes and vocabulary (the pre-trained model's), one scoring mode.
2. Each pair (θ_pre, θ_ft,t) is localized by a registered localizer at ``budget`` (regions kept in the store),
   or a given graft is used; the grafts are stitched (:mod:`skillgraft.graft.merge`) under each measured rule.
3. mergekit's ``linear``, ``task_arithmetic``, ``ties`` and ``dare_ties`` run through ``mergekit-yaml`` on the
   same checkpoints: documented defaults (weight 1, every other parameter mergekit's default) and a grid of λ /
   density chosen on dev rows. Heads of tasks with different label sets cannot be merged, so every method merges
   the *body* (all but the task head) and each task runs on it with its own fine-tuned head.
4. Every model is scored per task on dev and test rows: accuracy, normalized accuracy (÷ the task's own
   fine-tuned model), their means, and bytes stored per task.

Output folder: ``tasks/<task>/`` (classifiers: a complete checkpoint per task, the merged body and the task's
own head; ``AutoModelForSequenceClassification.from_pretrained``) or ``model/`` (causal / masked LMs: one merged
model), ``grafts/<task>/`` (each task's graft: the skill as stored), ``README.md``, ``report.md``,
``merge.json``, ``results.csv``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator

from skillgraft.data.spec import UserDataSpec
from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.graft.merge import RULES, scaled, stitch, swapped, task_view
from skillgraft.graft.selection import Budget
from skillgraft.io import atomic_dir, check_target
from skillgraft.pipeline.report import md_table, write_csv
from skillgraft.pipeline.setup import Setup
from skillgraft.spec import Spec

METHODS = ("linear", "task_arithmetic", "ties", "dare_ties")
Rule = Literal["average", "max-delta", "disjoint", "consensus", "first"]


class MergeSpec(Spec):
    """Settings of ``skillgraft merge`` (the localizer's own settings are its options)."""

    budget: Budget = Field(Budget.parse(5e-3), description="region size per task: a fraction of the graftable "
                                                          "parameters in (0, 1] or a count")
    localizer: str = Field("learned", description="localizer of each task's region (docs/localizers.md)")
    rule: Rule = Field("average", description="overlap rule of the written model: average (Localize-and-Stitch), "
                                              "max-delta (largest |θ_ft − θ_pre| wins), disjoint (contested "
                                              "coordinates stay θ_pre), consensus, first")
    rules: list[Rule] = Field(default_factory=lambda: ["average", "max-delta", "disjoint"],
                              description="overlap rules the report measures")
    mergekit: list[Literal["linear", "task_arithmetic", "ties", "dare_ties"]] = Field(
        default_factory=lambda: list(METHODS), description="mergekit methods to compare (empty: none)")
    stitch_scales: list[float] = Field(default_factory=lambda: [1.0, 1.5, 2.0, 3.0],
                                       description="λ grid of the stitch, θ_pre + λ Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t (sparse "
                                                   "task arithmetic; 1 = Localize-and-Stitch): chosen on dev rows per "
                                                   "rule, the written model takes its rule's dev-best λ")
    scales: list[float] = Field(default_factory=lambda: [0.3, 0.5, 1.0, 1.5],
                                description="λ grid of task_arithmetic, ties and dare_ties (chosen on dev rows)")
    densities: list[float] = Field(default_factory=lambda: [0.1, 0.2, 0.5],
                                   description="density grid of ties and dare_ties (chosen on dev rows)")
    dev_fraction: float = Field(0.2, gt=0, lt=1, description="share of a model's --data rows held out as dev rows "
                                                             "(grid choice) when no --dev-data is given")
    dev_limit: int | None = Field(200, ge=1, description="dev rows per task scored for the grid (seeded sample)")
    mode: str | None = Field(None, description="how to score the models: classifier | prompt | causal | generative "
                                               "(default: from the fine-tuned checkpoints' class)")
    max_length: int = Field(128, ge=8, description="max tokens per example")
    random_seed: int = Field(0, description="seed of mergekit's random pruning (dare_ties)")

    @field_validator("scales", "densities", "stitch_scales")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(x <= 0 for x in v):
            raise ValueError(f"values must be > 0, got {v}")
        return v

    @field_validator("stitch_scales")
    @classmethod
    def _not_empty(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("give at least one λ (1 = Localize-and-Stitch as published)")
        return v

    @field_validator("densities")
    @classmethod
    def _at_most_one(cls, v: list[float]) -> list[float]:
        if any(x > 1 for x in v):
            raise ValueError(f"densities are fractions in (0, 1], got {v}")
        return v


@dataclass
class ModelInput:
    """One fine-tuned model to merge, with the data it is localized and scored on."""

    finetuned: str
    data: UserDataSpec | None = None
    dev_data: Path | None = None
    graft: Path | None = None
    name: str = ""


# ---------------------------------------------------------------------------------------------- inputs
def resolve_inputs(*, pretrained: str | None, finetuned: list[str], data: list[str], eval_data: list[str],
                   dev_data: list[str], grafts: list[str], shared: UserDataSpec) -> tuple[str, list[ModelInput]]:
    """The models to merge from the CLI lists (one per model, in the same order); one line on any mismatch.

    A ``--data`` entry ending in ``.yaml``/``.yml`` is a data spec (``UserDataSpec`` fields: data, eval_data,
    text_field, text_pair_field, labels, …; paths relative to the file) over the shared options.
    """
    from skillgraft.spec import read_yaml  # noqa: PLC0415

    records = [_graft_record(g) for g in grafts]
    if grafts and finetuned and len(finetuned) != len(grafts):
        raise SkillgraftError(f"{len(grafts)} --grafts but {len(finetuned)} --finetuned models: give one per graft, "
                              "in the same order, or none (each graft's recorded fine-tuned model)")
    if grafts and not finetuned:
        finetuned = [r.get("finetuned") or _missing(g, "finetuned") for g, r in zip(grafts, records)]
        pretrained = pretrained or records[0].get("pretrained") or _missing(grafts[0], "pretrained")
    n = len(finetuned)
    if n < 2:
        raise SkillgraftError(f"merging needs at least two fine-tuned models (--finetuned, once per model); got {n}")
    if pretrained is None:
        raise SkillgraftError("--pretrained is required: the checkpoint every --finetuned model was fine-tuned from")
    if not data and grafts and all(r.get("user_data") for r in records):
        specs = [UserDataSpec.build(r["user_data"], where=f"{g} metadata user_data") for g, r in zip(grafts, records)]
    else:
        if len(data) != n:
            raise SkillgraftError(f"{n} fine-tuned models but {len(data)} --data: give one --data per model, in the "
                                  "same order (a model without data cannot be localized or scored)")
        specs = []
        for d in data:
            if str(d).endswith((".yaml", ".yml")):
                values = read_yaml(d)
                root = Path(d).parent
                for key in ("data", "eval_data"):
                    if values.get(key) and not Path(values[key]).is_absolute() and (root / values[key]).exists():
                        values[key] = str(root / values[key])
                specs.append(UserDataSpec.build({**shared.model_dump(exclude={"data", "eval_data"}), **values},
                                                where=str(d)))
            else:
                specs.append(shared.replace(data=d))
    for option, values in (("--eval-data", eval_data), ("--dev-data", dev_data)):
        if values and len(values) != n:
            raise SkillgraftError(f"{n} fine-tuned models but {len(values)} {option}: give one per model or none")
    if eval_data:
        specs = [s.replace(eval_data=e) for s, e in zip(specs, eval_data)]
    for i, s in enumerate(specs):
        if s.data is None:
            raise SkillgraftError(f"model {i + 1} ({finetuned[i]}): no --data")
        for p in (s.data, s.eval_data, dev_data[i] if dev_data else None):
            if p is not None and Path(p).suffix.lower() in (".jsonl", ".json", ".csv", ".tsv") and not Path(p).exists():
                raise SkillgraftError(f"model {i + 1} ({finetuned[i]}): data file not found: {p}")
    names = task_names(finetuned)
    return pretrained, [ModelInput(str(f), s, Path(dev_data[i]) if dev_data else None,
                                   Path(grafts[i]) if grafts else None, names[i])
                        for i, (f, s) in enumerate(zip(finetuned, specs))]


def _graft_record(path: str) -> dict:
    from skillgraft.graft.graft_file import CONFIG_FILE  # noqa: PLC0415
    from skillgraft.io import read_json  # noqa: PLC0415

    cfg = Path(path) / CONFIG_FILE
    if not cfg.is_file():
        raise SkillgraftError(f"--grafts {path}: not a graft folder (no {CONFIG_FILE})")
    meta = read_json(cfg, what="graft config").get("metadata") or {}
    return {**meta, "base_fingerprint": read_json(cfg, what="graft config").get("base_fingerprint")}


def _missing(graft: str, what: str):
    raise SkillgraftError(f"--grafts {graft} records no {what} model; pass --{what}")


def task_names(finetuned: list[str]) -> list[str]:
    """One name per model: its folder name, made unique (``-2``, ``-3``) where two share one."""
    base = [Path(str(f).rstrip("/")).name or "model" for f in finetuned]
    out, seen = [], {}
    for b in base:
        seen[b] = seen.get(b, 0) + 1
        out.append(b if base.count(b) == 1 else f"{b}-{seen[b]}")
    return out


def weight_files(path: str) -> list[Path]:
    """The weight files of a checkpoint folder (safetensors, else pickled .bin), for sizes and identity."""
    from skillgraft.models.loading import model_reference  # noqa: PLC0415

    folder = Path(model_reference(path).path)
    if not folder.is_dir():
        return []
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    return files or sorted((folder / "model").glob("*.safetensors"))


def check_inputs(pretrained: str, inputs: list[ModelInput], spec: MergeSpec) -> str:
    """Refuse, before any weights load, what cannot be merged; returns the scoring mode they share."""
    from skillgraft.models.loading import model_reference  # noqa: PLC0415
    from skillgraft.models.pair import check_pair, pair_mode  # noqa: PLC0415
    from skillgraft.pipeline.setup import is_run_dir  # noqa: PLC0415
    from skillgraft.pipeline.store import file_digest  # noqa: PLC0415

    try:
        model_reference(pretrained)
    except SkillgraftError as e:
        raise SkillgraftError(f"--pretrained: {e}") from None
    seen: dict[str, str] = {}
    base_files = weight_files(pretrained)
    if base_files:
        seen[file_digest(base_files)] = f"the --pretrained model {pretrained}"
    modes = {}
    for m in inputs:
        try:
            ref = model_reference(m.finetuned)
        except SkillgraftError as e:
            raise SkillgraftError(f"--finetuned: {e}") from None
        if is_run_dir(m.finetuned):
            raise SkillgraftError(f"--finetuned {m.finetuned} is a skillgraft run directory; merge takes Hugging Face "
                                  "checkpoints (export the run's model/ folder, or pass it directly)")
        files = weight_files(m.finetuned)
        key = file_digest(files) if files else os.path.realpath(ref.path)
        if key in seen:
            raise SkillgraftError(f"--finetuned {m.finetuned} is the same model as {seen[key]} (identical weights): "
                                  "give each fine-tuned model once")
        seen[key] = f"--finetuned {m.finetuned}"
        check_pair(pretrained, m.finetuned)  # architecture, shapes, vocabulary
        modes[m.finetuned] = pair_mode(m.finetuned, m.data.generative, spec.mode)
    if len(set(modes.values())) > 1:
        shown = ", ".join(f"{k} → {v}" for k, v in modes.items())
        raise SkillgraftError(f"the models are scored differently ({shown}); merge models of one kind, or set --mode")
    prints = {_graft_record(str(m.graft)).get("base_fingerprint") for m in inputs if m.graft is not None}
    if len(prints - {None}) > 1:
        raise SkillgraftError(f"the --grafts were learned on different base models (fingerprints {sorted(prints - {None})})")
    return next(iter(modes.values()))


# ---------------------------------------------------------------------------------------------- setups and grafts
def open_setup(pretrained: str, m: ModelInput, spec: MergeSpec) -> Setup:
    """θ_pre, θ_ft and the rows of one model: train (localize), dev (grid choice), test (report)."""
    from skillgraft.data.sampling import eval_subset  # noqa: PLC0415
    from skillgraft.pipeline.setup import from_pair  # noqa: PLC0415

    setup = from_pair(pretrained, m.finetuned, m.data, mode=spec.mode, max_length=spec.max_length)
    data = setup.data
    train = data.train
    if m.dev_data is not None:
        labels = tuple(data.task.labels) or None
        dev_spec = m.data.replace(data=m.dev_data, eval_data=m.dev_data, k=None, test_limit=None,
                                  labels=list(labels) if labels and setup.pre.mode == "generative" else m.data.labels)
        dev = dev_spec.load(labels if setup.pre.mode == "classifier" else None).test
        setup.data_files = [*(setup.data_files or []), m.dev_data]
    else:
        order = np.random.RandomState(data.seed).permutation(len(train))
        n_dev = int(round(spec.dev_fraction * len(train)))
        if n_dev < 1 or n_dev >= len(train):
            raise SkillgraftError(f"{m.name}: {len(train)} row(s) of --data cannot give both localization and dev "
                                  "rows; give --dev-data")
        held = set(order[:n_dev].tolist())
        dev = [ex for i, ex in enumerate(train) if i in held]
        train = [ex for i, ex in enumerate(train) if i not in held]
    setup.data = dataclasses.replace(data, train=train, dev=eval_subset(dev, spec.dev_limit))
    setup.graft_metadata = setup.graft_metadata.updated(merge_task=m.name)
    return setup


def task_graft(setup: Setup, m: ModelInput, spec: MergeSpec, options: Spec, store) -> Graft:
    """The task's graft: the given one, or its region localized at ``spec.budget`` by ``spec.localizer`` with
    ``options`` (its own options spec; from the store when done)."""
    from skillgraft.pipeline.regions import learned_regions  # noqa: PLC0415

    if m.graft is not None:
        g = Graft.from_pretrained(m.graft)
        g.metadata = g.metadata.updated(merge_task=m.name)
        return g
    if "sparsity" in type(options).model_fields and "sparsity" not in options.model_fields_set and \
            spec.budget.fraction:
        options = options.replace(sparsity=spec.budget.fraction)  # γ_base of the budget's size (L&S's init)
    options = options.replace(budgets=[spec.budget])
    regions, _ = learned_regions(setup, store, spec.localizer, options)
    region = regions.get(spec.budget) or next(iter(regions.values()))
    meta = {"task": setup.task, "mode": setup.pre.mode, "localizer": spec.localizer, "budget": spec.budget.key,
            **setup.graft_metadata.to_dict()}
    return Graft.from_models(setup.pre, setup.ft, region, meta)


def body_module(scorer):
    """What every method merges: the model without its task head (``base_model``) when it has one, else all."""
    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415

    return scorer.model.base_model if carried_names(scorer) else scorer.model


# ---------------------------------------------------------------------------------------------- mergekit
def mergekit_configs(spec: MergeSpec) -> list[tuple[str, str, dict, dict]]:
    """(method, label, per-model parameters, global parameters): each method's defaults, then the grid."""
    out = []
    for method in spec.mergekit:
        out.append((method, "defaults", {"weight": 1.0}, {}))
        if method == "task_arithmetic":
            out += [(method, f"λ={s:g}", {"weight": 1.0}, {"lambda": s}) for s in spec.scales if s != 1.0]
        elif method in ("ties", "dare_ties"):
            out += [(method, f"density={d:g} λ={s:g}", {"weight": 1.0, "density": d}, {"lambda": s})
                    for d in spec.densities for s in spec.scales]
    return out


def mergekit_yaml(method: str, base: Path, models: list[Path], params: dict, global_params: dict) -> str:
    """A mergekit-yaml config (absolute paths); ``linear`` has no base model."""
    import yaml  # noqa: PLC0415

    cfg = {"merge_method": method, "models": [{"model": str(p.resolve()), "parameters": dict(params)} for p in models],
           "dtype": "float32"}
    if method != "linear":
        cfg["base_model"] = str(base.resolve())
    if global_params:
        cfg["parameters"] = global_params
    return yaml.safe_dump(cfg, sort_keys=False)


def run_mergekit(config: str, work: Path, seed: int) -> dict:
    """Run ``mergekit-yaml`` on ``config``; the merged tensors (the output folder is removed)."""
    from safetensors.torch import load_file  # noqa: PLC0415

    exe = Path(sys.executable).with_name("mergekit-yaml")
    if not exe.is_file():
        found = shutil.which("mergekit-yaml")
        if not found:
            raise SkillgraftError("mergekit-yaml not found (mergekit is pinned in requirements.lock: run `make setup`), "
                                  "or pass --mergekit ''")
        exe = Path(found)
    (work / "merge.yml").write_text(config)
    out = work / "merged"
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([str(exe), str(work / "merge.yml"), str(out), "--no-copy-tokenizer", "--no-write-model-card",
                        "--random-seed", str(seed), "--quiet"], capture_output=True, text=True)
    if r.returncode:
        lines = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
        raise SkillgraftError(f"mergekit-yaml failed: {lines[-1] if lines else r.returncode}")
    state: dict = {}
    for f in sorted(out.glob("*.safetensors")):
        state.update(load_file(str(f)))
    shutil.rmtree(out, ignore_errors=True)
    return state


def mergekit_input(scorer, folder: Path) -> None:
    """Write what mergekit merges for ``scorer``: the whole model, or (a model with a task head) its body inside
    a two-output classifier of the model's own class whose head is all zeros — the same in every input, so it
    merges to itself and is dropped. (A body saved alone as ``BertModel`` crashes mergekit 0.1.5's planner on
    its optional aliased ``position_ids``; its ``…ForSequenceClassification`` definitions work.)"""
    import copy  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415
    from skillgraft.models.pair import torch_fork  # noqa: PLC0415

    model = scorer.model
    if not carried_names(scorer):
        arch = model.config.architectures
        try:
            model.save_pretrained(folder)
        finally:
            model.config.architectures = arch  # save_pretrained writes the class name into the shared config
        return
    cfg = copy.deepcopy(model.config)
    cfg.num_labels, cfg.problem_type = 2, None
    with torch_fork(0):
        container = type(model)(cfg)
    container.base_model.load_state_dict(body_module(scorer).state_dict())
    body = {id(p) for p in container.base_model.parameters()}
    with torch.no_grad():
        for p in container.parameters():
            if id(p) not in body:
                p.zero_()
    container.save_pretrained(folder)


def body_state(scorer, merged: dict) -> dict:
    """The merged tensors for :func:`body_module` of ``scorer`` (read from :func:`mergekit_input`'s layout), less
    its carried head tensors (a pooler only the fine-tuned checkpoints have stays each task's own, as in the
    stitch). Every other parameter of the body must be merged."""
    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415

    module = body_module(scorer)
    carried_list = carried_names(scorer)
    if carried_list:
        prefix = scorer.model.base_model_prefix + "."
        merged = {n[len(prefix):]: t for n, t in merged.items() if n.startswith(prefix)}
    own = module.state_dict()
    params = dict(scorer.named_parameters())
    carried = {id(params[n]) for n in carried_list}
    body = [n for n, p in module.named_parameters() if id(p) not in carried]
    missing = [n for n in body if n not in merged]
    if missing:
        raise SkillgraftError(f"the merged model lacks {len(missing)} tensor(s) of the body, e.g. {missing[:3]}")
    skip = {n for n, p in module.named_parameters() if id(p) in carried}
    return {n: t for n, t in merged.items() if n in own and n not in skip}


# ---------------------------------------------------------------------------------------------- scoring
@dataclass
class Scored:
    """One merged model (a method and its settings) scored per task."""

    method: str
    config: str
    dev: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def normalized(self, ft: Scored, split: str = "test") -> dict[str, float]:
        mine, ref = getattr(self, split), getattr(ft, split)
        return {t: (mine[t] / ref[t] if ref.get(t) else float("nan")) for t in mine}

    def mean_normalized(self, ft: Scored, split: str = "test") -> float:
        vals = list(self.normalized(ft, split).values())
        return float(np.mean(vals)) if vals else float("nan")


def score(scorer, examples) -> float:
    from skillgraft.evaluate.predict import evaluate  # noqa: PLC0415

    return float(evaluate(scorer, examples)[0]["score"])


def score_tasks(setups: dict[str, Setup], use, split: str) -> dict[str, float]:
    """``use(name, setup)`` is a context manager yielding the scorer of a task; its score on ``split`` rows."""
    out = {}
    for name, setup in setups.items():
        rows = setup.data.dev if split == "dev" else setup.test
        with use(name, setup) as scorer:
            out[name] = score(scorer, rows)
    return out


# ---------------------------------------------------------------------------------------------- the merge
def merge_inputs(pretrained: str, inputs: list[ModelInput], store=None) -> dict:
    """The paths a merge reads or fills (none may lie inside its --out)."""
    from skillgraft.pipeline.store import Store  # noqa: PLC0415

    paths = {"--cache": (store or Store()).root, "--pretrained": pretrained}
    for i, m in enumerate(inputs, 1):
        data = m.data or UserDataSpec()
        paths |= {f"--finetuned {i}": m.finetuned, f"--data {i}": data.data, f"--eval-data {i}": data.eval_data,
                  f"--dev-data {i}": m.dev_data, f"--grafts {i}": m.graft}
    return paths


def merge_models(pretrained: str, inputs: list[ModelInput], spec: MergeSpec, localize: Spec | dict | None,
                 out: str | os.PathLike, *, store=None, overwrite: bool = False, progress: bool = False) -> dict:
    """Merge ``inputs`` (fine-tuned from ``pretrained``) into ``out``; see the module doc. Returns merge.json.

    ``localize``: the options of ``spec.localizer`` set by the caller (its own spec or a dict; the rest are
    the localizer's own defaults).
    """
    import contextlib  # noqa: PLC0415

    from skillgraft.pipeline.store import Store  # noqa: PLC0415
    from skillgraft.pipeline.regions import localizer_options  # noqa: PLC0415

    out = check_target(out, overwrite, merge_inputs(pretrained, inputs, store))
    localize = localizer_options(spec.localizer, localize)  # an unknown name or option fails before any work
    mode = check_inputs(pretrained, inputs, spec)
    store = store or Store()
    t0 = time.perf_counter()
    setups = {m.name: open_setup(pretrained, m, spec) for m in inputs}
    grafts = {m.name: task_graft(setups[m.name], m, spec, localize, store) for m in inputs}
    t_loc = time.perf_counter() - t0
    first = next(iter(setups.values()))
    base = {n: p for n, p in first.pre.named_parameters()}  # θ_pre (max-delta); every setup's pre is the same θ_pre
    bodies = {rule: stitch(list(grafts.values()), rule, base=base) for rule in dict.fromkeys([spec.rule, *spec.rules])}

    @contextlib.contextmanager
    def finetuned(name, setup):
        yield setup.ft

    def both(use) -> tuple[dict, dict]:
        return score_tasks(setups, use, "dev"), score_tasks(setups, use, "test")

    results: list[Scored] = []
    ft = Scored("fine-tuned", "each task's own model", *both(finetuned))
    results.append(ft)
    results.append(Scored("graft", f"each task's own graft ({spec.budget.label})",
                          *both(grafted(lambda name: grafts[name]))))
    for rule, body in bodies.items():
        stitched, best = stitch_grid(setups, grafts, rule, body, spec.stitch_scales, base, ft)
        results += stitched
        if rule == spec.rule:
            written = best  # the written model: --rule at its dev-best λ
            next(s for s in stitched if s.info.get("chosen_on_dev")).info["written"] = True
    mk_seconds = 0.0
    if spec.mergekit:
        t1 = time.perf_counter()
        results += run_mergekit_grid(setups, spec, ft)
        mk_seconds = time.perf_counter() - t1
    summary = summarize(results, ft, setups, grafts, spec, mode, pretrained)
    summary["seconds"] = {"localize_and_load": t_loc, "mergekit": mk_seconds, "total": time.perf_counter() - t0}
    with atomic_dir(out, overwrite=overwrite) as tmp:
        write_outputs(tmp, setups, grafts, written, spec, mode)
        (tmp / "merge.json").write_text(json.dumps(summary, indent=2, default=float))
        write_csv(tmp / "results.csv", summary["rows"])
        (tmp / "report.md").write_text(report_markdown(summary))
        (tmp / "README.md").write_text(readme(summary, mode))
    return summary


def grafted(graft_of):
    """``use`` for :func:`score_tasks`: each task's θ_pre with the graft ``graft_of(name)`` applied (reverted after)."""
    import contextlib  # noqa: PLC0415

    @contextlib.contextmanager
    def use(name, setup):
        with graft_of(name).applied(setup.pre):
            yield setup.pre
    return use


def stitch_grid(setups: dict[str, Setup], grafts: dict[str, Graft], rule: str, body: Graft, scales: list[float],
                base: dict, ft: Scored) -> tuple[list[Scored], Graft]:
    """The stitch under ``rule`` at every λ of ``scales`` scored on dev; λ = 1 (Localize-and-Stitch) and the
    dev-best λ also on test (the rows of the report; the dev-best is marked ``chosen_on_dev``). Returns the rows
    and the stitch at the dev-best λ."""
    info = {k: body.metadata.stitch[k] for k in ("size", "overlapping_coordinates", "dropped_coordinates")}
    rows, bodies = [], {}
    for lam in dict.fromkeys([1.0, *scales]):
        bodies[lam] = scaled(body, lam, base)
        use = grafted(lambda name, b=bodies[lam]: task_view(b, grafts[name]))
        s = Scored("stitch", rule if lam == 1 else f"{rule} λ={lam:g}", info={**info, "scale": lam})
        s.dev = score_tasks(setups, use, "dev")
        rows.append((s, use))
    best = max((s for s, _ in rows if s.info["scale"] in scales), key=lambda s: s.mean_normalized(ft, "dev"))
    best.info["chosen_on_dev"] = True
    for s, use in rows:
        if s.info["scale"] == 1 or s is best:
            s.test = score_tasks(setups, use, "test")
    return [s for s, _ in rows], bodies[best.info["scale"]]


def run_mergekit_grid(setups: dict[str, Setup], spec: MergeSpec, ft: Scored) -> list[Scored]:
    """Every mergekit config scored on dev; per method its defaults and its dev-best config also on test."""
    names = list(setups)
    first = setups[names[0]]
    scored: list[Scored] = []
    with tempfile.TemporaryDirectory(prefix="skillgraft-merge-") as work:
        work = Path(work)
        body_dirs = []
        for label, scorer in [("base", first.pre), *[(f"ft{i}", setups[n].ft) for i, n in enumerate(names)]]:
            mergekit_input(scorer, work / label)
            body_dirs.append(work / label)
        states: dict[tuple[str, str], dict] = {}
        for method, label, params, global_params in mergekit_configs(spec):
            s = Scored(f"mergekit {method}", label, info={"parameters": params, "global": global_params})
            try:
                merged = run_mergekit(mergekit_yaml(method, body_dirs[0], body_dirs[1:], params, global_params),
                                      work, spec.random_seed)
            except SkillgraftError as e:
                s.info["error"] = str(e)
                scored.append(s)
                continue

            s.dev = score_tasks(setups, on_body(merged), "dev")
            states[(method, label)] = merged
            scored.append(s)
            for key in [k for k in states if k[0] == method]:  # keep only what may still be scored on test
                if key[1] != "defaults" and key != _best(scored, method, ft):
                    del states[key]
        for method in spec.mergekit:
            best = _best(scored, method, ft)
            for s in scored:
                if s.method == f"mergekit {method}" and (s.config == "defaults" or (method, s.config) == best) \
                        and (method, s.config) in states:
                    s.test = score_tasks(setups, on_body(states[(method, s.config)]), "test")
                    s.info["chosen_on_dev"] = (method, s.config) == best
    return scored


def on_body(merged: dict):
    """``use`` for :func:`score_tasks`: each task's fine-tuned model with the merged body swapped in."""
    import contextlib  # noqa: PLC0415

    @contextlib.contextmanager
    def use(name, setup):
        with swapped(body_module(setup.ft), body_state(setup.ft, merged)):
            yield setup.ft
    return use


def _best(scored: list[Scored], method: str, ft: Scored) -> tuple[str, str] | None:
    mine = [s for s in scored if s.method == f"mergekit {method}" and s.dev]
    if not mine:
        return None
    best = max(mine, key=lambda s: s.mean_normalized(ft, "dev"))
    return method, best.config


# ---------------------------------------------------------------------------------------------- outputs
def summarize(results: list[Scored], ft: Scored, setups: dict[str, Setup], grafts: dict[str, Graft],
              spec: MergeSpec, mode: str, pretrained: str) -> dict:
    """merge.json: settings, per-task rows, the chosen configurations and the headline comparison."""
    names = list(setups)
    ckpt = {n: sum(f.stat().st_size for f in weight_files(str(setups[n].ft_dir))) for n in names}
    graft_bytes = {n: graft_file_bytes(grafts[n]) for n in names}
    rows = []
    for s in results:
        if not s.test and not s.dev:
            rows.append({"method": s.method, "config": s.config, "error": s.info.get("error", "")})
            continue
        stitched = s.method in ("stitch", "graft")
        stored = {n: (graft_bytes[n] if stitched else ckpt[n]) for n in names}
        row = {"method": s.method, "config": s.config, "on_test": bool(s.test),
               "chosen_on_dev": bool(s.info.get("chosen_on_dev")),
               "dev_mean_normalized": s.mean_normalized(ft, "dev") if s.dev else None,
               "mean_accuracy": float(np.mean(list(s.test.values()))) if s.test else None,
               "mean_normalized": s.mean_normalized(ft) if s.test else None,
               "bytes_per_task": float(np.mean(list(stored.values()))), **s.info}
        for n in names:
            row[f"{n}:dev"] = s.dev.get(n)
            row[f"{n}:test"] = s.test.get(n)
            row[f"{n}:normalized"] = s.normalized(ft).get(n) if s.test else None
            row[f"{n}:bytes"] = stored[n]
        rows.append(row)
    stitch_rows = [r for r in rows if r["method"] == "stitch" and r.get("on_test")]
    written = next(r for r in stitch_rows if r.get("written"))
    plain = next(r for r in stitch_rows if r["config"] == spec.rule)  # λ = 1: Localize-and-Stitch as published
    dev_rule = max(stitch_rows, key=lambda r: r["dev_mean_normalized"])
    mk = [r for r in rows if r["method"].startswith("mergekit") and r.get("on_test") and r.get("chosen_on_dev")]
    best_mk = max(mk, key=lambda r: r["mean_normalized"]) if mk else None
    checkpoint_bytes = float(np.mean(list(ckpt.values())))
    headline = {"stitch_rule": spec.rule, "stitch_scale": written["scale"],
                "stitch_mean_normalized": written["mean_normalized"],
                "stitch_scale_1_mean_normalized": plain["mean_normalized"],
                "stitch_rule_chosen_on_dev": dev_rule["config"],
                "stitch_dev_rule_mean_normalized": dev_rule["mean_normalized"],
                "best_mergekit": f"{best_mk['method']} ({best_mk['config']})" if best_mk else None,
                "best_mergekit_mean_normalized": best_mk["mean_normalized"] if best_mk else None,
                "checkpoint_bytes": checkpoint_bytes,
                "max_graft_bytes": max(graft_bytes.values()),
                "max_graft_share_of_checkpoint": max(graft_bytes[n] / ckpt[n] for n in names if ckpt[n]) if
                any(ckpt.values()) else None}
    if best_mk:
        headline["stitch_at_least_best_mergekit"] = written["mean_normalized"] >= best_mk["mean_normalized"]
    tasks = {}
    for n in names:
        st = setups[n]
        tasks[n] = {"finetuned": st.ft.base_model, "task": st.task, "labels": list(st.data.task.labels),
                    "train": len(st.data.train), "dev": len(st.data.dev), "test": len(st.test),
                    "data": st.data_note, "graft_size": grafts[n].size, "graft_bytes": graft_bytes[n],
                    "checkpoint_bytes": ckpt[n]}
    from skillgraft.pipeline.caveats import merge_caveats  # noqa: PLC0415

    return {"pretrained": pretrained, "mode": mode, "settings": spec.to_dict(), "tasks": tasks, "rows": rows,
            "headline": headline, "caveats": merge_caveats(setups, ft.test)}


def graft_file_bytes(graft: Graft) -> int:
    """Bytes of the graft as stored (graft.safetensors: positions, values, the carried head)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = graft.save_pretrained(Path(tmp) / "g")
        return (path / "graft.safetensors").stat().st_size


def write_outputs(folder: Path, setups: dict[str, Setup], grafts: dict[str, Graft], body: Graft, spec: MergeSpec,
                  mode: str) -> None:
    """The merged model (``tasks/<task>/`` or ``model/``) and each task's graft (``grafts/<task>/``)."""
    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415

    for name, g in grafts.items():
        g.save_pretrained(folder / "grafts" / name)
    first = next(iter(setups.values()))
    if not carried_names(first.pre):  # one merged model serves every task
        with body.applied(first.pre):
            first.pre.model.save_pretrained(folder / "model")
        first.pre.tokenizer.save_pretrained(folder / "model")
        return
    for name, setup in setups.items():
        # the stitched body (θ_pre outside the union) written into the task's own fine-tuned classifier
        with task_view(body, grafts[name]).applied(setup.pre):
            state = {n: t.detach().clone() for n, t in body_module(setup.pre).state_dict().items()}
        module = body_module(setup.ft)
        with swapped(module, state):
            setup.ft.model.save_pretrained(folder / "tasks" / name)
        setup.ft.tokenizer.save_pretrained(folder / "tasks" / name)


def _fmt(x, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "-"
    return f"{100 * x:.1f}" if pct else f"{x:.4f}"


def report_markdown(s: dict) -> str:
    """report.md: per-task accuracy and normalized accuracy of every method, means, bytes per task."""
    names = list(s["tasks"])
    h = s["headline"]
    cfg = s["settings"]
    lines = [f"# Merging {len(names)} fine-tuned models of `{s['pretrained']}`", "",
             f"Scored as `{s['mode']}`. Each task's region: localizer `{cfg['localizer']}` at budget {cfg['budget']} "
             "of the graftable parameters; the stitched model resolves overlaps by "
             f"`{cfg['rule']}` at strength λ = {h['stitch_scale']:g} (chosen on dev; written to this folder).", "",
             "**Every method merges the body only** (all but the task heads): heads of tasks with different label "
             "sets cannot be merged, so each task runs on the merged body with its own fine-tuned head — for "
             "skillgraft's stitch and for every mergekit method alike.", "",
             "| task | fine-tuned checkpoint | labels | localize rows | dev rows | test rows | graft | graft bytes | "
             "checkpoint bytes | share |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, t in s["tasks"].items():
        share = t["graft_bytes"] / t["checkpoint_bytes"] if t["checkpoint_bytes"] else float("nan")
        lines.append(f"| {n} | `{t['finetuned']}` | {len(t['labels'])} | {t['train']} | {t['dev']} | {t['test']} | "
                     f"{t['graft_size']:,} | {t['graft_bytes']:,} | {t['checkpoint_bytes']:,} | {100 * share:.2f}% |")
    from skillgraft.pipeline.caveats import caveat_markdown  # noqa: PLC0415

    lines += ["", *caveat_markdown(s.get("caveats"))]
    lines += ["", "## Test accuracy (normalized = merged ÷ the task's own fine-tuned model)", ""]
    header = ["method", "settings", *[f"{n} acc" for n in names], *[f"{n} norm" for n in names], "mean acc",
              "mean norm", "dev mean norm", "bytes / task"]
    table = []
    for r in s["rows"]:
        if not r.get("on_test"):
            continue
        mark = " (chosen on dev)" if r.get("chosen_on_dev") else ""
        table.append([r["method"], r["config"] + mark, *[_fmt(r[f"{n}:test"]) for n in names],
                      *[_fmt(r[f"{n}:normalized"]) for n in names], _fmt(r["mean_accuracy"]),
                      _fmt(r["mean_normalized"]), _fmt(r["dev_mean_normalized"]), f"{r['bytes_per_task']:,.0f}"])
    lines += md_table(header, table).splitlines()
    grid = [r for r in s["rows"] if r["method"].startswith("mergekit") or r["method"] == "stitch"]
    if grid:
        lines += ["", "## Grids (chosen on dev rows only; mergekit: λ = `lambda`, weight 1 per model; stitch: λ of "
                  "θ_pre + λ Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t)", "",
                  "| method | settings | dev mean norm | on test |", "|---|---|---:|---|"]
        for r in grid:
            if r.get("error"):
                lines.append(f"| {r['method']} | {r['config']} | failed: {r['error']} | - |")
            else:
                lines.append(f"| {r['method']} | {r['config']} | {_fmt(r['dev_mean_normalized'])} | "
                             f"{'yes' if r.get('on_test') else 'no'} |")
    lines += ["", "## Headline", "",
              f"- stitch (`{h['stitch_rule']}`, λ = {h['stitch_scale']:g} chosen on dev; written to this folder): "
              f"mean normalized accuracy {_fmt(h['stitch_mean_normalized'])} (at λ = 1, Localize-and-Stitch as "
              f"published: {_fmt(h['stitch_scale_1_mean_normalized'])}); the rule and λ best on dev are "
              f"`{h['stitch_rule_chosen_on_dev']}` ({_fmt(h['stitch_dev_rule_mean_normalized'])})"]
    if h.get("best_mergekit"):
        lines.append(f"- best mergekit method (its settings chosen on dev, best of the methods on test): "
                     f"{h['best_mergekit']}: {_fmt(h['best_mergekit_mean_normalized'])}")
    if h.get("max_graft_share_of_checkpoint") is not None:
        lines.append(f"- largest stored skill: {h['max_graft_bytes']:,} bytes = "
                     f"{100 * h['max_graft_share_of_checkpoint']:.2f}% of its checkpoint's weight bytes")
    lines += ["", "Overlap rules: *average* — θ_pre + Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t (Localize-and-Stitch, Eq. 4: the mean "
              "of the claiming tasks' values; `λ=…` rows scale that sum, as task arithmetic's λ does); "
              "*max-delta* — the task with the largest |τ_t| at the coordinate wins; "
              "*disjoint* — contested coordinates stay θ_pre. mergekit: `linear` = mean of the fine-tuned bodies; "
              "`task_arithmetic` = θ_pre + λ Σ_t τ_t; `ties` = trim to the top-density |τ|, elect signs, mean of the "
              "agreeing values, × λ; `dare_ties` = random drop to density with rescaling, sign election, sum × λ. "
              "*defaults*: weight 1 per model and mergekit's own defaults (λ 1, density 1).",
              "", "*bytes / task*: what must be kept per task to rebuild the merged model — a graft file (positions, "
              "values, the task's head) for the stitch; the whole fine-tuned checkpoint (its dense task vector) for "
              "mergekit's methods and single-task models.", ""]
    return "\n".join(lines)


def readme(s: dict, mode: str) -> str:
    """README.md of the output folder: the layout and how to load it with plain transformers."""
    names = list(s["tasks"])
    if mode == "classifier":
        return f"""# A merged model: one body, one head per task

Merged by `skillgraft merge` (rule `{s['settings']['rule']}`, strength λ = {s['headline']['stitch_scale']:g}) from
{len(names)} classifiers fine-tuned from `{s['pretrained']}`.

- `tasks/<task>/` — a complete Hugging Face checkpoint per task ({', '.join(f'`{n}`' for n in names)}): the merged
  body (bit-identical in every folder) and that task's own classification head, with its labels in
  `config.json` (`id2label`) and its tokenizer.
- `grafts/<task>/` — each task's skill as skillgraft stores it (positions + values + head); the body above is
  their stitch under the rule, scaled by λ (`skillgraft.graft.merge.stitch`, then `scaled`).
- `report.md`, `merge.json`, `results.csv` — the comparison with mergekit's methods.

Load with plain transformers (no skillgraft needed):

```python
from transformers import AutoModelForSequenceClassification, AutoTokenizer
model = AutoModelForSequenceClassification.from_pretrained("tasks/{names[0]}")
tok = AutoTokenizer.from_pretrained("tasks/{names[0]}")
logits = model(**tok(["some text"], return_tensors="pt")).logits
label = model.config.id2label[int(logits.argmax(-1))]
```

`AutoModel.from_pretrained("tasks/<any task>")` gives the shared merged body alone.
"""
    return f"""# A merged model

Merged by `skillgraft merge` (rule `{s['settings']['rule']}`, strength λ = {s['headline']['stitch_scale']:g}) from
{len(names)} models fine-tuned from `{s['pretrained']}` ({', '.join(f'`{n}`' for n in names)}); the tasks share
every tensor, so `model/` serves all of them.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer   # AutoModelForMaskedLM for masked LMs
model = AutoModelForCausalLM.from_pretrained("model")
tok = AutoTokenizer.from_pretrained("model")
```

`grafts/<task>/` holds each task's skill as skillgraft stores it (`model/` is their stitch under the rule, scaled by
λ); `report.md` compares with mergekit's methods.
"""
