"""Pieces shared by the recipes: fine-tune-or-load, learned regions at several budgets (cached),
trained baselines stored as weight deltas (cached), variants to evaluate, seeds → mean (std), tables.

Everything expensive is cached under ``run.cache`` by a hash of what determines it, so re-running a
recipe (or another recipe on the same fine-tuned model) reuses fine-tuned models, learned regions and
trained baselines:

* ``ft-…``        — :func:`cached_finetune` (fine-tuned model run directory);
* ``regions-…``   — learned regions of one fine-tuned model for one :class:`LocalizeConfig`;
* ``trained-…``   — a baseline trained from θ_pre (graft re-training, BitFit, LoRA, IA³), stored as a
  :class:`Graft` of the coordinates it changed (+ its new head), so it is applied like a graft.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from skillgraft.data.loading import Example, load_split
from skillgraft.data.sampling import FewShotData, load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.predict import evaluate
from skillgraft.graft import Graft, LocalizeConfig, Region, localize
from skillgraft.models.anatomy import fingerprint, is_carried
from skillgraft.graft.selection import Budget, region_universe
from skillgraft.io import read_json, write_json
from skillgraft.recipes.base import RunDir, cached_finetune, config_hash, load_finetuned
from skillgraft.spec import Spec
from skillgraft.train import FinetuneConfig

# Fine-tuning defaults of the recipes (head mode on MiniLM: SGD lr 0.01, 400 steps reach ~80% on SST-2 64-shot)
FT_DEFAULTS = {"lr": 0.01, "steps": 400, "eval_every": 100}


# ---------------------------------------------------------------------------------------------- configs
def dataclass_from(cls, spec: dict | None, where: str, defaults: dict | None = None):
    """Build a config dataclass from a YAML dict; unknown keys are a clear error naming ``where``."""
    spec = {**(defaults or {}), **(spec or {})}
    if isinstance(cls, type) and issubclass(cls, Spec):  # typed specs validate themselves
        return cls.build(spec, where=where)
    if not isinstance(spec, dict):
        raise SkillgraftError(f"{where}: expected a mapping, got {type(spec).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise SkillgraftError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    try:
        obj = cls(**spec)
    except TypeError as e:
        raise SkillgraftError(f"{where}: {e}") from None
    if hasattr(obj, "validate"):
        obj.validate()
    return obj


def finetune_config(cfg: dict, key: str = "finetune", defaults: dict | None = None) -> FinetuneConfig:
    spec = cfg.get(key) or {}
    if not isinstance(spec, dict):
        raise SkillgraftError(f"recipe field {key!r}: expected a mapping of settings, got {type(spec).__name__}")
    return FinetuneConfig.build({**(FT_DEFAULTS if defaults is None else defaults), **spec}, where=f"recipe field {key!r}")


def localize_config(cfg: dict, key: str = "localize") -> LocalizeConfig:
    return LocalizeConfig.build(cfg.get(key), where=f"recipe field {key!r}")


def seeds_of(cfg: dict) -> list[int]:
    seeds = cfg.get("seeds", [13])
    if isinstance(seeds, int):
        seeds = [seeds]
    if not seeds or not all(isinstance(s, int) for s in seeds):
        raise SkillgraftError(f"recipe field 'seeds' must be a non-empty list of integers, got {seeds!r}")
    return list(seeds)


def sample(examples: list[Example], n: int | None, seed: int = 0) -> list[Example]:
    """A seeded random subset of ``n`` examples (all when n is None). Test files may be sorted by label,
    so a first-N cut would be one-sided; this is not."""
    if n is None or n >= len(examples):
        return list(examples)
    rng = random.Random(seed)
    idx = sorted(rng.sample(range(len(examples)), n))
    return [examples[i] for i in idx]


# ---------------------------------------------------------------------------------------------- setups
@dataclass
class Setup:
    """One fine-tuned model: task, k-shot draw, θ_ft and θ_pre scorers, the test subset, FT's test probs."""

    task: str
    k: int
    seed: int
    ft_dir: Path
    ft: torch.nn.Module
    pre: torch.nn.Module
    data: FewShotData
    test: list[Example]
    data_dir: str | None
    ft_seconds: float = 0.0
    probs: dict[str, np.ndarray] = field(default_factory=dict)  # FT probabilities per evaluation set

    @property
    def total_parameters(self) -> int:
        """Parameters of the pre-trained model (``scorer.model``): the denominator of a sparsity in %."""
        return sum(p.numel() for p in self.pre.model.parameters())


def prepare(cfg: dict, run: RunDir, task: str, seed: int, *, k: int | None = None) -> Setup:
    """Fine-tune (or load from the cache) ``task`` at k-shot ``seed``; load θ_pre beside it."""
    k = int(k or cfg.get("k", 16))
    data_dir = cfg.get("data_dir")
    ft_cfg = finetune_config(cfg)
    t0 = time.perf_counter()
    ft_dir = cached_finetune(task, k, seed, cache=run.cache, model=cfg.get("model"), mode=cfg.get("mode", "head"),
                             pooling=cfg.get("pooling"), config=ft_cfg, data_dir=data_dir,
                             max_length=int(cfg.get("max_length", 128)), test_limit=cfg.get("test_limit"),
                             progress=bool(cfg.get("progress", False)))
    seconds = time.perf_counter() - t0
    ft, pre, _ = load_finetuned(ft_dir)
    ft.eval()
    pre.eval()
    data = load_kshot(task, k, seed, data_dir)
    test = sample(data.test, cfg.get("test_limit"), seed=0)
    return Setup(data.task.name, k, seed, ft_dir, ft, pre, data, test, data_dir, seconds)


def learned_regions(setup: Setup, loc: LocalizeConfig, cache: Path, *, progress: bool = False
                    ) -> tuple[dict[Budget, Region], dict]:
    """Learned regions (one per budget, or ``round``) of a setup's fine-tuned model, cached by config hash."""
    key = {"ft": setup.ft_dir.name, "localize": loc.to_dict()}
    folder = Path(cache) / f"regions-{setup.task}-{setup.k}-{setup.seed}-{config_hash(key)}"
    if (folder / "summary.json").is_file():
        summary = read_json(folder / "summary.json")
        return {Budget.parse(name.removeprefix("budget=")): Region.load(folder / sub)  # "budget=…": older caches
                for name, sub in summary["folders"].items()}, summary
    t0 = time.perf_counter()
    result = localize(setup.pre, setup.ft, setup.data.train, setup.data.dev, loc, progress=progress)
    seconds = time.perf_counter() - t0
    subs = {b.key: b.key for b in result.regions}
    for b, region in result.regions.items():
        region.save(folder / b.key)
    found = result.summary
    summary = {"key": key, "folders": subs, "best_step": found["best_step"], "best_score": found["best_score"],
               "sizes": {b.key: len(r) for b, r in result.regions.items()}, "base_size": result.base_size,
               "step_seconds": result.step_seconds, "seconds": seconds, "history": result.history}
    write_json(folder / "summary.json", summary)
    return result.regions, summary


def delta_graft(pre, state: dict[str, torch.Tensor], metadata: dict | None = None) -> Graft:
    """A Graft holding exactly the coordinates where ``state`` differs from ``pre`` (+ its new head).

    Any model trained from θ_pre that keeps θ_pre's tensor names (re-trained region, BitFit, a merged
    adapter) becomes a graft: applying it to θ_pre reproduces the trained model.
    """
    params = dict(pre.named_parameters())
    shapes, indices, values, carried = {}, {}, {}, {}
    for name, t in state.items():
        if name not in params:
            raise SkillgraftError(f"trained state has tensor {name!r} that the pre-trained model lacks")
        if is_carried(name):
            carried[name] = t.detach().cpu().clone()
            continue
        base = params[name].detach()
        changed = torch.nonzero((t.to(base.device) != base).reshape(-1)).reshape(-1).cpu()
        if changed.numel():
            shapes[name] = tuple(base.shape)
            indices[name] = changed
            values[name] = t.detach().reshape(-1)[changed.to(t.device)].cpu().clone()
    return Graft(Region(shapes, indices), values, carried, getattr(pre, "base_model", ""), fingerprint(pre),
                 dict(metadata or {}))


def cached_trained(setup: Setup, kind: str, spec: dict, cache: Path, train_fn: Callable[[], tuple[dict, dict]]
                   ) -> tuple[Graft, dict]:
    """A baseline trained from θ_pre (``train_fn() -> (state, info)``), stored as a delta graft, cached."""
    key = {"ft": setup.ft_dir.name, "kind": kind, "spec": spec}
    folder = Path(cache) / f"trained-{kind}-{setup.task}-{setup.k}-{setup.seed}-{config_hash(key)}"
    if (folder / "info.json").is_file():
        return Graft.from_pretrained(folder / "graft"), read_json(folder / "info.json")
    t0 = time.perf_counter()
    state, info = train_fn()
    info = {**info, "seconds": round(time.perf_counter() - t0, 2), "key": key}
    graft = delta_graft(setup.pre, state, {"kind": kind, **spec})
    graft.save_pretrained(folder / "graft", overwrite=True)  # a leftover of an interrupted run
    write_json(folder / "info.json", info)
    return graft, info


def fresh_pre(setup: Setup):
    """A new copy of the pre-trained scorer (same head initialisation) to train baselines in."""
    import copy  # noqa: PLC0415

    scorer = copy.deepcopy(setup.pre)
    for p in scorer.parameters():
        p.requires_grad_(True)
    return scorer


# ---------------------------------------------------------------------------------------------- variants
@dataclass
class Variant:
    """A model to evaluate: the FT scorer itself, or θ_pre with a graft (learned, trained or empty) applied."""

    name: str
    kind: str                      # pre | head-only | ft | graft | retrain | bitfit | lora | ia3 | ...
    params: int                    # body parameters it changes/trains (the new head not counted)
    graft: Graft | None = None
    budget: float | None = None
    info: dict = field(default_factory=dict)

    @contextlib.contextmanager
    def use(self, setup: Setup) -> Iterator:
        if self.kind == "ft":
            yield setup.ft
        elif self.kind == "pre":
            yield setup.pre
        else:
            with self.graft.applied(setup.pre) as model:
                yield model


def base_variants(setup: Setup) -> list[Variant]:
    """The baselines every graft report shows: pre-trained, head only (head mode), fine-tuned."""
    out = [Variant("pre-trained", "pre", 0)]
    if setup.pre.mode == "head":
        empty = Region.empty(region_universe(setup.pre))
        out.append(Variant("head only", "head-only", 0, Graft.from_models(setup.pre, setup.ft, empty)))
    body = sum(p.numel() for n, p in setup.ft.named_parameters()
               if not is_carried(n) and not _frozen_by_ft(setup, n))
    out.append(Variant("fine-tuned", "ft", body))
    return out


def _frozen_by_ft(setup: Setup, name: str) -> bool:
    return "embeddings" in name and finetune_config_of(setup).freeze_embeddings


def finetune_config_of(setup: Setup) -> FinetuneConfig:
    cfg = read_json(setup.ft_dir / "config.json")["finetune"]
    return FinetuneConfig.build(cfg, where=f"{setup.ft_dir / 'config.json'} finetune")


def graft_variants(setup: Setup, regions: dict[Budget, Region], summary: dict | None = None) -> list[Variant]:
    out = []
    for key, region in regions.items():
        budget = None if key.rounding else key.value
        label = f"graft {key.label}" if budget is not None else "graft (rounded)"
        meta = {"task": setup.task, "k": setup.k, "seed": setup.seed, "region": key.key}
        out.append(Variant(label, "graft", len(region), Graft.from_models(setup.pre, setup.ft, region, meta), budget,
                           {"best_step": (summary or {}).get("best_step", {}).get(key.key)}))
    return out


def evaluate_variant(setup: Setup, variant: Variant, examples: list[Example], set_name: str,
                     batch_size: int = 64) -> tuple[dict, np.ndarray]:
    """Metrics of a variant on ``examples`` (agreement with FT on the same set when FT was run first)."""
    with variant.use(setup) as scorer:
        metrics, probs = evaluate(scorer, examples, batch_size=batch_size, reference=setup.probs.get(set_name))
    if variant.kind == "ft":
        setup.probs[set_name] = probs
        metrics["agreement"] = 1.0
    return metrics, probs


def variant_row(setup: Setup, variant: Variant) -> dict:
    return {"task": setup.task, "k": setup.k, "seed": setup.seed, "model": variant.name, "kind": variant.kind,
            "params": variant.params, "params_pct": 100.0 * variant.params / setup.total_parameters}


# ---------------------------------------------------------------------------------------------- OOD sets
def ood_examples(source: str, target: dict, cfg: dict, where: str) -> list[Example]:
    """A target task's test examples mapped into ``source``'s label space (``target``: {task, labels})."""
    from skillgraft.data.label_map import map_examples  # noqa: PLC0415

    if not isinstance(target, dict) or "task" not in target:
        raise SkillgraftError(f"{where}: each OOD target needs 'task' (and 'labels': target label → source label)")
    raw = load_split(target["task"], target.get("split", "test"), cfg.get("data_dir"))
    mapped = map_examples(source, target["task"], raw, target.get("labels"), where)
    return sample(mapped, target.get("limit", cfg.get("ood_limit", cfg.get("test_limit"))), seed=0)


# ---------------------------------------------------------------------------------------------- tables
def pct(values: list[float] | float | None, digits: int = 1) -> str:
    """Percent ``mean (std)`` over seeds as the paper prints it (std only when there are ≥ 2 values)."""
    if values is None:
        return "-"
    if not isinstance(values, (list, tuple, np.ndarray)):
        values = [values]
    arr = np.asarray([v for v in values if v is not None and not np.isnan(v)], dtype=float) * 100
    if not arr.size:
        return "-"
    return f"{arr.mean():.{digits}f} ({arr.std():.{digits}f})" if arr.size > 1 else f"{arr.mean():.{digits}f}"


def aggregate(rows: list[dict], keys: list[str], metrics: list[str]) -> list[dict]:
    """Group ``rows`` by ``keys`` (first-seen order); each metric becomes a list over the group (seeds)."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        g = tuple(r.get(k) for k in keys)
        if g not in groups:
            groups[g] = {k: r.get(k) for k in keys} | {m: [] for m in metrics} | {"n_seeds": 0}
        groups[g]["n_seeds"] += 1
        for m in metrics:
            if r.get(m) is not None:
                groups[g][m].append(r[m])
    return list(groups.values())


def summary_rows(agg: list[dict], metrics: list[str]) -> list[dict]:
    """Aggregated rows with ``<metric>_mean`` / ``<metric>_std`` (for CSV / JSON)."""
    out = []
    for g in agg:
        row = {k: v for k, v in g.items() if k not in metrics}
        for m in metrics:
            vals = np.asarray(g[m], dtype=float)
            row[f"{m}_mean"] = float(vals.mean()) if vals.size else None
            row[f"{m}_std"] = float(vals.std()) if vals.size else None
        out.append(row)
    return out


def md_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub Markdown table."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def sizes_line(cfg: dict, seeds: list[int], extra: str = "") -> str:
    model = cfg.get("model") or "bundled all-MiniLM-L6-v2"
    return (f"Model {model} ({cfg.get('mode', 'head')} mode), k={cfg.get('k', 16)} per label, data seeds {seeds}, "
            f"test subset {cfg.get('test_limit') or 'full'} examples (seeded sample)" + (f", {extra}" if extra else "")
            + ".")


# ---------------------------------------------------------------------------------------------- trained baselines
BITFIT_DEFAULTS = {"optimizer": "adamw", "lr": 1e-3, "steps": 400, "eval_every": 100, "weight_decay": 0.0}
ADAPTER_DEFAULTS = {"optimizer": "adamw", "lr": 5e-4, "steps": 400, "eval_every": 100, "weight_decay": 0.0}


def retrain_variant(setup: Setup, region: Region, config: FinetuneConfig, cache: Path, *, label: str,
                    budget: float | None = None) -> Variant:
    """Graft re-training (Table 1): from θ_pre, train only ``region`` (+ a new head)."""
    from skillgraft.train.masked import finetune_masked  # noqa: PLC0415

    def train():
        scorer = fresh_pre(setup)
        res = finetune_masked(scorer, setup.data.train, setup.data.dev, config, region=region, k=setup.k,
                              progress=False)
        return ({n: p.detach() for n, p in scorer.named_parameters()},
                {"trainable": res.trainable_parameters, "best_dev": res.best_dev, "steps": res.steps})

    spec = {"region_size": len(region), "region_hash": _region_hash(region), "finetune": config.to_dict()}
    graft, info = cached_trained(setup, "retrain", spec, cache, train)
    return Variant(label, "retrain", len(region), graft, budget, info)


def bitfit_variant(setup: Setup, config: FinetuneConfig, cache: Path) -> Variant:
    """BitFit (Ben Zaken et al., 2022): from θ_pre, train only the biases (+ the new head)."""
    from skillgraft.train import finetune  # noqa: PLC0415

    config = config.replace(bias_only=True)

    def train():
        scorer = fresh_pre(setup)
        res = finetune(scorer, setup.data.train, setup.data.dev, config, k=setup.k, progress=False)
        body = res.trainable_parameters - sum(p.numel() for n, p in scorer.named_parameters() if is_carried(n))
        return ({n: p.detach() for n, p in scorer.named_parameters()},
                {"trainable": body, "best_dev": res.best_dev, "steps": res.steps})

    graft, info = cached_trained(setup, "bitfit", {"finetune": config.to_dict()}, cache, train)
    return Variant("BitFit", "bitfit", int(info["trainable"]), graft, None, info)


def adapter_variant(setup: Setup, adapter, config: FinetuneConfig, cache: Path) -> Variant:
    """A peft adapter (LoRA / IA³) trained from θ_pre with the new head, merged and stored as a delta."""
    from skillgraft.train.adapters import adapter_parameter_count, add_adapter, merged_state  # noqa: PLC0415
    from skillgraft.train.masked import finetune_masked  # noqa: PLC0415

    def train():
        scorer = fresh_pre(setup)
        names = set(add_adapter(scorer, adapter))
        count = adapter_parameter_count(scorer, list(names))
        res = finetune_masked(scorer, setup.data.train, setup.data.dev, config, trainable=names.__contains__,
                              k=setup.k, progress=False)
        return merged_state(scorer), {"trainable": count, "best_dev": res.best_dev, "steps": res.steps}

    spec = {"adapter": asdict(adapter), "finetune": config.to_dict()}
    graft, info = cached_trained(setup, adapter.method, spec, cache, train)
    return Variant(adapter.label, adapter.method, int(info["trainable"]), graft, None, info)


def _region_hash(region: Region) -> str:
    import hashlib  # noqa: PLC0415

    h = hashlib.sha256()
    for name in sorted(region.indices):
        h.update(name.encode())
        h.update(region.indices[name].numpy().tobytes())
    return h.hexdigest()[:16]


def evaluate_on_sets(setup: Setup, variants: list[Variant], sets: dict[str, list[Example]],
                     metrics: list[str]) -> tuple[list[dict], dict[str, dict[str, np.ndarray]]]:
    """Every variant on every evaluation set (FT first, the agreement reference); rows + probabilities."""
    rows, probs = [], {}
    for v in sorted(variants, key=lambda v: v.kind != "ft"):
        for set_name, examples in sets.items():
            m, p = evaluate_variant(setup, v, examples, set_name)
            probs.setdefault(v.name, {})[set_name] = p
            rows.append({**variant_row(setup, v), "eval": set_name, **{k: m.get(k) for k in metrics}, "n": m["n"]})
    order = {v.name: i for i, v in enumerate(variants)}
    rows.sort(key=lambda r: order[r["model"]])
    return rows, probs
