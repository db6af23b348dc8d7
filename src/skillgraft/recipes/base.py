"""Recipes: paper experiments configured by a YAML file and run by ``skillgraft run FILE.yaml``.

A recipe is a function ``fn(cfg: dict, run: RunDir) -> dict`` registered with ``@recipe("name")``.
The YAML names it (``recipe: calibration``) and holds its settings. ``run_recipe`` resolves the config,
builds the run directory atomically (it appears only when the recipe finished), and writes
``config.json`` (resolved) and ``metrics.json`` (what the function returned). Recipes write CSVs, PNGs
and ``report.md`` through :class:`RunDir`. Finished fine-tuning runs are cached across recipes
(:func:`cached_finetune`), so a re-run reuses them.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import yaml

from skillgraft.errors import SkillgraftError
from skillgraft.io import atomic_dir, atomic_path, config_hash, write_json
from skillgraft.train.run import load_finetuned  # noqa: F401 - re-exported for recipes

RECIPES: dict[str, Callable] = {}
DEFAULT_CACHE = Path("runs") / "cache"


def recipe(name: str):
    """Register a recipe function under ``name``."""

    def wrap(fn):
        RECIPES[name] = fn
        return fn

    return wrap


class RunDir:
    """The (temporary, until success) folder a recipe writes into, with small helpers."""

    def __init__(self, path: Path, cache: Path):
        self.path = path
        self.cache = cache

    def file(self, name: str) -> Path:
        p = self.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def json(self, name: str, obj) -> Path:
        return write_json(self.file(name), obj)

    def csv(self, name: str, rows: list[dict]) -> Path:
        """Write a list of dicts as CSV (columns: union of keys, first-seen order)."""
        cols: list[str] = []
        for r in rows:
            cols.extend(k for k in r if k not in cols)
        with atomic_path(self.file(name)) as tmp, tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            for r in rows:
                w.writerow({k: _fmt(v) for k, v in r.items()})
        return self.path / name

    def report(self, markdown: str, name: str = "report.md") -> Path:
        with atomic_path(self.file(name)) as tmp:
            tmp.write_text(markdown)
        return self.path / name


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def load_recipe_config(path: str | os.PathLike, overrides: dict | None = None) -> dict:
    path = Path(path)
    if not path.is_file():
        raise SkillgraftError(f"recipe file not found: {path}")
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SkillgraftError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(cfg, dict) or "recipe" not in cfg:
        raise SkillgraftError(f"{path}: needs a top-level 'recipe:' naming one of {sorted(RECIPES)}")
    cfg.update(overrides or {})
    return cfg


def run_recipe(path: str | os.PathLike, out: str | os.PathLike | None = None, *, overrides: dict | None = None,
               cache: str | os.PathLike | None = None, overwrite: bool = True) -> Path:
    """Run the recipe a YAML file describes; returns the run directory."""
    import skillgraft.recipes  # noqa: F401, PLC0415 - registers the built-in recipes

    cfg = load_recipe_config(path, overrides)
    name = cfg["recipe"]
    if name not in RECIPES:
        raise SkillgraftError(f"{path}: unknown recipe {name!r}; known: {sorted(RECIPES)}")
    out = Path(out) if out else Path("runs") / Path(path).stem
    cache = Path(cache) if cache else Path(cfg.get("cache_dir", DEFAULT_CACHE))
    with atomic_dir(out, overwrite=overwrite) as tmp:
        run = RunDir(tmp, cache)
        write_json(tmp / "config.json", cfg)
        metrics = RECIPES[name](cfg, run) or {}
        write_json(tmp / "metrics.json", metrics)
    return out




def cached_finetune(task: str, k: int, seed: int, *, cache: str | os.PathLike = DEFAULT_CACHE, model: str | None = None,
                    mode: str = "head", pooling: str | None = None, config=None, data_dir: str | None = None,
                    max_length: int = 128, test_limit: int | None = None, progress: bool = True) -> Path:
    """A fine-tuned run directory for these settings, trained once and reused afterwards."""
    from skillgraft.train import FinetuneConfig, run_finetune  # noqa: PLC0415

    config = config or FinetuneConfig()
    key = {"task": task, "k": k, "seed": seed, "model": model, "mode": mode, "pooling": pooling,
           "config": asdict(config), "max_length": max_length, "test_limit": test_limit}
    out = Path(cache) / f"ft-{task}-{k}-{seed}-{mode}-{config_hash(key)}"
    if (out / "metrics.json").is_file():
        return out
    run_finetune(task, k, seed, out, model=model, mode=mode, pooling=pooling, config=config, data_dir=data_dir,
                 max_length=max_length, test_limit=test_limit, overwrite=True, progress=progress)
    return out


def mean_std(values: list[float]) -> str:
    """``mean (std)`` over seeds, as the paper's tables print it."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if not arr.size:
        return "-"
    return f"{arr.mean():.4f} ({arr.std():.4f})" if arr.size > 1 else f"{arr.mean():.4f}"
