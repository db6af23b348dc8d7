"""Paper experiments as YAML-configured recipes (``skillgraft run recipes/<name>.yaml``).

Each recipe module registers itself with ``@recipe(name, Spec)``; importing this package registers them all.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.recipes.base import RECIPES, ExperimentSpec, Recipe, RunDir, mean_std, recipe, run_spec
from skillgraft.spec import read_yaml

for _mod in pkgutil.iter_modules(__path__):
    if _mod.name != "base":
        importlib.import_module(f"{__name__}.{_mod.name}")


def load_recipe(path: str | os.PathLike, overrides: dict | None = None) -> tuple[Recipe, ExperimentSpec]:
    """The recipe a YAML file names and its validated spec (errors name the file and the field)."""
    values = {**read_yaml(path), **(overrides or {})}
    name = values.get("recipe")
    if name is None:
        raise SkillgraftError(f"{path}: needs a top-level 'recipe:' naming one of {sorted(RECIPES)}")
    if not isinstance(name, str) or name not in RECIPES:  # a list or a mapping was an unhashable-type traceback
        raise SkillgraftError(f"{path}: unknown recipe {name!r}; known: {sorted(RECIPES)}")
    entry = RECIPES[name]
    return entry, entry.spec.build(values, where=str(path))


def run_recipe(path: str | os.PathLike, out: str | os.PathLike | None = None, *, overrides: dict | None = None,
               cache: str | os.PathLike | None = None, overwrite: bool = False) -> Path:
    """Run the recipe a YAML file describes; returns the run directory.

    Everything is checked before any work: the spec, and the output folder (an existing one is refused
    unless ``overwrite``; then it is replaced whole when the new run is complete).
    """
    entry, spec = load_recipe(path, overrides)
    return run_spec(entry, spec, Path(out) if out else Path("runs") / Path(path).stem, cache=cache,
                    overwrite=overwrite)


__all__ = ["ExperimentSpec", "RECIPES", "RunDir", "load_recipe", "mean_std", "recipe", "run_recipe"]
