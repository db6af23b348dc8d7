"""Paper experiments as YAML-configured recipes (``skillgraft run recipes/<name>.yaml``).

Each recipe module registers itself with ``@recipe(name, Spec)``; importing this package registers them all.
"""

import importlib
import pkgutil

from skillgraft.recipes.base import RECIPES, RunDir, mean_std, recipe, run_recipe

for _mod in pkgutil.iter_modules(__path__):
    if _mod.name != "base":
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["RECIPES", "RunDir", "mean_std", "recipe", "run_recipe"]
