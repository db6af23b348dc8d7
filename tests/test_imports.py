"""The package's import graph (top-level and function-level imports alike) has no circle where the layers forbid
one: among the data modules, and between a graft and its exports."""

from __future__ import annotations

import ast
from pathlib import Path

import skillgraft

SRC = Path(skillgraft.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module → the skillgraft modules it imports anywhere in its body (``from pkg import sub`` counts ``pkg.sub``)."""
    files = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_sees_function_level_imports():
    graph = import_graph()
    assert "skillgraft.pipeline.setup" in graph["skillgraft.cli"]  # imported inside a verb
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circle_among_data_modules():
    for comp in circles(import_graph()):
        data = sorted(m for m in comp if m.startswith("skillgraft.data."))
        assert len(data) < 2, f"data modules import each other in a circle: {sorted(comp)}"


def test_no_import_circle_between_graft_and_export():
    for comp in circles(import_graph()):
        assert not {"skillgraft.graft.graft", "skillgraft.graft.export"} <= comp, \
            f"graft/graft.py and graft/export.py import each other: {sorted(comp)}"
