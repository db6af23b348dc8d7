"""The layering of docs/architecture.md, read from the imports of the source (ast): a rule a refactor can break."""

import ast
from pathlib import Path

import pytest

import skillgraft

SRC = Path(skillgraft.__file__).parent
CORE = ("data", "models", "graft", "train", "fisher", "evaluate")


def imported(path: Path, source: str | None = None) -> set[str]:
    """Every module ``path`` imports (module level or inside functions), relative imports resolved."""
    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module` names the module
            names.add(base)
    return names


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def other_recipes(names: set[str]) -> list[str]:
    """The recipe modules among ``names`` other than recipes.base."""
    return sorted(n for n in names if _under(n, "skillgraft.recipes") and not _under(n, "skillgraft.recipes.base"))


@pytest.mark.parametrize("path", sorted((SRC / "recipes").glob("*.py")), ids=lambda p: p.name)
def test_recipes_import_no_other_recipe_only_base(path):
    """A recipe module imports recipes.base and the layers below, never another recipe module (shared pieces
    live in recipes/base.py or pipeline/)."""
    if path.name in ("__init__.py", "base.py"):  # the registry: imports every recipe to register it
        return
    bad = other_recipes(imported(path))
    assert not bad, f"recipes/{path.name} imports {bad}"


@pytest.mark.parametrize("layer", ["pipeline", *CORE])
def test_lower_layers_never_import_recipes_or_the_cli(layer):
    above = ("skillgraft.recipes", "skillgraft.cli", "skillgraft.clispec")
    above += ("skillgraft.pipeline",) if layer in CORE else ()
    bad = {f"{p.relative_to(SRC)}: {n}" for p in (SRC / layer).rglob("*.py") for n in imported(p)
           if any(_under(n, a) for a in above)}
    assert not bad, sorted(bad)


def test_the_rule_sees_a_cross_recipe_import():
    """The checker itself: absolute, relative and package-level imports of another recipe are seen."""
    source = ("from skillgraft.recipes.graft import learned_regions\nfrom .ood import run_transfers\n"
              "from skillgraft.recipes import multitask\nfrom skillgraft.recipes.base import recipe\n"
              "def f():\n    import skillgraft.recipes.wise\n")
    bad = other_recipes(imported(SRC / "recipes" / "probe.py", source))
    assert {"skillgraft.recipes.graft", "skillgraft.recipes.ood", "skillgraft.recipes.multitask",
            "skillgraft.recipes.wise"} <= set(bad)
    assert not any(_under(n, "skillgraft.recipes.base") for n in bad)
