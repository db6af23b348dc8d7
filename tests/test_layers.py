"""The layering of docs/architecture.md, read from the imports of the source (ast): a rule a refactor can break."""

import ast
from pathlib import Path

import pytest

import skillgraft

SRC = Path(skillgraft.__file__).parent
CORE = ("data", "models", "graft", "keep", "train", "fisher", "evaluate", "export", "merge")


def imports(path: Path, source: str | None = None, *, top_level: bool = False) -> list[tuple[str, list[str]]]:
    """Each import statement of ``path`` (module level or inside functions; ``top_level``: module level only, what
    importing the module runs), relative imports resolved: ``(module, [])`` for ``import module``, ``(base,
    [name, …])`` for ``from base import name, …``."""
    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    out = []
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    for node in tree.body if top_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.append((base, [a.name for a in node.names]))
    return out


def imported(path: Path, source: str | None = None, *, top_level: bool = False) -> set[str]:
    """Every module ``path`` imports, or may: ``from pkg import x`` names both ``pkg`` and ``pkg.x``."""
    names = set()
    for base, froms in imports(path, source, top_level=top_level):
        names.add(base)
        names.update(f"{base}.{n}" for n in froms)
    return names


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def other_recipes(names: set[str]) -> list[str]:
    """The recipe modules among ``names`` other than recipes.base."""
    return sorted(n for n in names if _under(n, "skillgraft.recipes") and not _under(n, "skillgraft.recipes.base"))


def own_package(path: Path) -> str | None:
    """The recipe package a module of ``recipes/<name>/`` belongs to (``skillgraft.recipes.<name>``); None for a
    recipe that is one module."""
    parts = path.relative_to(SRC / "recipes").parts
    return f"skillgraft.recipes.{parts[0]}" if len(parts) > 1 else None


@pytest.mark.parametrize("path", sorted((SRC / "recipes").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(SRC / "recipes")))
def test_recipes_import_no_other_recipe_only_base(path):
    """A recipe module imports recipes.base and the layers below, never another recipe module (shared pieces
    live in recipes/base.py or pipeline/); a recipe that is a package (recipes/paper/: its spec, run and report)
    imports its own modules too."""
    if path.relative_to(SRC / "recipes").as_posix() in ("__init__.py", "base.py"):  # the registry imports them all
        return
    own = own_package(path)
    bad = [n for n in other_recipes(imported(path)) if own is None or not _under(n, own)]
    assert not bad, f"recipes/{path.relative_to(SRC / 'recipes')} imports {bad}"


@pytest.mark.parametrize("layer", ["verbs", "pipeline", *CORE])
def test_lower_layers_never_import_recipes_or_the_cli(layer):
    """cli → recipes → verbs → pipeline → cores: nothing imports a layer above it."""
    above = ("skillgraft.recipes", "skillgraft.cli")
    above += ("skillgraft.verbs",) if layer != "verbs" else ()
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
    assert own_package(SRC / "recipes" / "paper" / "report.py") == "skillgraft.recipes.paper"
    assert own_package(SRC / "recipes" / "probe.py") is None


# ---------------------------------------------------------------------------------------------- import circles
def import_graph() -> dict[str, set[str]]:
    """module → the skillgraft modules it imports anywhere in its body (``from pkg import sub`` counts ``pkg.sub``)."""
    files = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        edges = set()
        for base, froms in imports(path):
            subs = {f"{base}.{n}" for n in froms} & files.keys()
            edges |= subs  # `from pkg import module` imports the module (pkg is its parent, imported anyway) …
            if not froms or len(subs) < len(froms):  # … `from pkg import name` reads pkg/__init__.py's name
                edges.add(base)
        graph[name] = {n for n in edges if n in files and n != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while (w := stack.pop()) != v:
                comp.add(w)
            if comp:
                out.append(comp | {v})

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_function_level_imports_and_circles():
    assert "skillgraft.verbs.graft" in import_graph()["skillgraft.cli.graft"]  # imported inside a verb
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circle():
    """No two modules import each other, directly or around a loop, at module level or inside a function (an
    import inside a function dodges the error, not the tangle): each module sits below what it imports."""
    found = [sorted(c) for c in circles(import_graph())]
    assert not found, f"import circles: {found}"


def test_the_graph_tells_a_submodule_from_a_package_name():
    """``from pkg import submodule`` is an edge to the submodule only; ``from pkg import NAME`` one to pkg."""
    graph = import_graph()
    assert "skillgraft.graft.localizers.machinery.engine" in graph["skillgraft.graft.localizers.learned"]
    assert "skillgraft.graft.localizers" not in graph["skillgraft.graft.localizers.learned"]
    assert "skillgraft.export" in graph["skillgraft.verbs.export"]


def test_no_import_circle_among_data_modules():
    """data/ modules import each other top-level and acyclically (no import inside a function to dodge a circle)."""
    for comp in circles(import_graph()):
        data = sorted(m for m in comp if m.startswith("skillgraft.data."))
        assert len(data) < 2, f"data modules import each other in a circle: {sorted(comp)}"


def test_no_import_circle_between_graft_and_export():
    for comp in circles(import_graph()):
        assert not {"skillgraft.graft.graft", "skillgraft.export"} <= comp, \
            f"graft/graft.py and export/ import each other: {sorted(comp)}"


def test_no_test_module_imports_another():
    """What several test modules share lives in helper modules (docs/architecture.md, Tests): importing a test module
    runs its module-level code and re-registers its fixtures in the importer, where they silently shadow conftest's."""
    tests = Path(__file__).parent
    offenders = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}:{node.lineno} imports {n}" for n in names
                          if (tests / f"{n.split('.')[0]}.py").is_file() and n.startswith("test_")]
    assert not offenders, offenders


# the package's entry points (they start the CLI) and its face (lazy re-exports of the public API)
ENTRIES = ("__init__.py", "__main__.py", "entry.py")
LAYERS = ("cli", "recipes", "verbs", "pipeline", *CORE)


def climbs_from_the_root() -> list[str]:
    """Imports by a root utility (io.py, resume.py, … : docs/architecture.md) of a layer: arrows back up."""
    return sorted(f"{p.name}: {n}" for p in SRC.glob("*.py") if p.name not in ENTRIES for n in imported(p)
                  if any(_under(n, f"skillgraft.{layer}") for layer in LAYERS))


def test_no_arrow_back_up_from_the_root_utilities():
    """The root utilities import no layer, not even inside a function: resume.py decodes graft's budgets and regions
    through codecs graft registers into it (issue 79: the last arrow back up)."""
    assert climbs_from_the_root() == []


# what keep's statistics may import of skillgraft: root modules that import nothing of skillgraft themselves
STATS_MAY_IMPORT = ("skillgraft.errors", "skillgraft.lazy", "skillgraft.keep.stats")


def test_keep_statistics_import_nothing_of_skillgraft_above_errors():
    """keep/stats/ (the bounds: NumPy and SciPy) is a low floor: it imports its own modules, skillgraft.errors and
    skillgraft.lazy (NumPy at first use) only, so the statistics can be read, tested and reused without a model, a
    localizer or a store (issue 79)."""
    stats = sorted((SRC / "keep" / "stats").rglob("*.py"))
    assert stats, "keep/stats/ is missing"
    bad = sorted(f"{p.relative_to(SRC)}: {n}" for p in stats for n in imported(p)
                 if _under(n, "skillgraft") and n != "skillgraft" and not any(_under(n, m) for m in STATS_MAY_IMPORT))
    assert bad == [], bad
    for root in ("errors", "lazy"):  # and those two import nothing of skillgraft
        assert not [n for n in imported(SRC / f"{root}.py") if _under(n, "skillgraft") and n != "skillgraft"], root


def test_no_module_above_500_lines():
    """One concept per module: a module past 500 lines holds two (issue 34; 600 until issue 79)."""
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, long


def test_the_walk_of_a_run_counts_calls_that_climb_back():
    """bench/graft_walk.py's counter (docs/architecture.md records a graft run's walk): a call from a lower layer's
    file into a higher one's is a climb; calls down or within a file are not."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("graft_walk", Path(__file__).parents[1] / "bench" / "graft_walk.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls = [(None, "verbs/graft.py", "graft"), ("verbs/graft.py", "pipeline/opening.py", "from_run"),
             ("models/anatomy.py", "graft/graft.py", "sample"), ("io.py", "pipeline/variants.py", "__getitem__"),
             ("io.py", "pipeline/variants.py", "__iter__"), ("pipeline/opening.py", "pipeline/opening.py", "task")]
    w = module.walk(calls)
    assert (w["files"], w["folders"], w["climbs"], w["climbing_edges"]) == (4, 3, 3, 2)
    # keep beside graft; its statistics a floor below the data (a higher rank is a lower floor)
    assert module.layer("keep/search.py") == module.layer("graft/graft.py") < module.layer("data/spec.py") \
        < module.layer("keep/stats/bound.py") < module.layer("io.py")
    assert w["edges"][("io.py", "pipeline/variants.py")] == 2


def test_no_module_imports_matplotlib_at_import_time():
    """matplotlib (≈ 2 s to import; its backend chosen by skillgraft.lazy: Agg) is imported where a figure is made:
    no module of the package imports it at module level (what `skillgraft run` and every process that imports
    skillgraft.recipes would otherwise pay before any work)."""
    eager = [str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py"))
             if any(_under(m, "matplotlib") for m in imported(p, top_level=True))]
    assert eager == [], eager
