"""The one writer of run outputs: the run folder, CSV tables, Markdown tables, mean (std) over seeds."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skillgraft.lazy import np

from skillgraft.evaluate.rows import Row
from skillgraft.io import atomic_path, write_json


class RunDir:
    """The folder a run writes into (a temporary sibling until the run finished), with small writers."""

    def __init__(self, path: str | os.PathLike, store=None, runtime=None):
        self.path = Path(path)
        self.store = store
        self.runtime = runtime  # where the run computes (models/placement.py: a Runtime), passed by its verb

    def file(self, name: str) -> Path:
        """Path of ``name`` inside the run folder (its parent folders created)."""
        p = self.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def json(self, name: str, obj) -> Path:
        """Write ``obj`` as JSON into the run folder (atomic)."""
        return write_json(self.file(name), obj)

    def csv(self, name: str, rows: list[Mapping]) -> Path:
        """Write rows as CSV into the run folder (atomic)."""
        return write_csv(self.file(name), rows)

    def seed_tables(self, name: str, rows: list[dict], keys: list[str], metrics: list[str]) -> tuple[list[dict],
                                                                                                list[dict]]:
        """Write ``rows`` (one per data seed) to ``name`` and their mean/std over seeds, grouped by ``keys``, to
        ``summary.csv``; returns the groups (:func:`aggregate`, what a report's tables are built from) and the
        summary rows."""
        agg = aggregate(rows, keys, metrics)
        summary = summary_rows(agg, metrics)
        self.csv(name, rows)
        self.csv("summary.csv", summary)
        return agg, summary

    def report(self, markdown: str, name: str = "report.md") -> Path:
        """Write the Markdown report into the run folder (atomic), ending with where it ran (device, precision: the
        run's ``runtime``)."""
        runtime = self.runtime
        if runtime is not None and "Ran on " not in markdown:
            markdown = markdown.rstrip("\n") + f"\n\nRan on {runtime.describe()}.\n"
        with atomic_path(self.file(name)) as tmp:
            tmp.write_text(markdown)
        return self.path / name


def write_csv(path: str | os.PathLike, rows: list[Mapping]) -> Path:
    """Rows (dicts, or :class:`~skillgraft.pipeline.variants.ResultRow`) as CSV (columns: union of keys in first-seen
    order; floats to 6 significant digits)."""
    rows = [r.columns() if isinstance(r, Row) else dict(r) for r in rows]
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return Path(path)


def md_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub Markdown table."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(str(h)) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def setting_line(spec, extra: str = "") -> str:
    """One sentence of a recipe's report header: model, mode, k, data seeds, test subset (+ ``extra``)."""
    model = spec.model or "bundled all-MiniLM-L6-v2"
    return (f"Model {model} ({spec.mode} mode), k={spec.k} per label, data seeds {spec.seeds}, test subset "
            f"{spec.test_limit or 'full'} examples (seeded sample)" + (f", {extra}" if extra else "") + ".")


def mean_std(values: list[float]) -> str:
    """``mean (std)`` over seeds, as the paper's tables print it."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if not arr.size:
        return "-"
    return f"{arr.mean():.4f} ({arr.std():.4f})" if arr.size > 1 else f"{arr.mean():.4f}"


def pct(values: list[float] | float | None, digits: int = 1) -> str:
    """Percent ``mean (std)`` over seeds (std only when there are ≥ 2 values)."""
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


@dataclass(frozen=True)
class TaskRows:
    """One task's groups of :func:`aggregate` addressed by what they are: a baseline (FT, pre-trained, head only) by its
    model name, a graft by its (localizer, budget label) columns (grouped by them)."""

    models: dict[str, dict]
    grafts: dict[tuple[str, str], dict]

    @classmethod
    def of(cls, groups: Iterable[dict]) -> TaskRows:
        groups = list(groups)
        return cls({g["model"]: g for g in groups if not g.get("localizer")},
                   {(g["localizer"], g["budget"]): g for g in groups if g.get("localizer")})

    def graft(self, localizer: str, budget: str) -> dict | None:
        """The graft of ``localizer`` (its title) at ``budget`` (its label), or None when it was not run."""
        return self.grafts.get((localizer, budget))


@dataclass(frozen=True)
class MeanStd:
    """One metric over the seeds of a group (None: no seed has it)."""

    mean: float | None
    std: float | None


@dataclass
class SeedSummary(Row):
    """One group of :func:`aggregate` over seeds: its group's keys, how many seeds, each metric's :class:`MeanStd`; its
    columns (``summary.csv``) name them ``<metric>_mean`` / ``<metric>_std`` (only :meth:`columns` spells them)."""

    group: dict[str, Any]  # the grouping keys' values
    n_seeds: int
    stats: dict[str, MeanStd] = field(default_factory=dict)

    def columns(self) -> dict[str, Any]:
        out = {**self.group, "n_seeds": self.n_seeds}
        for m, v in self.stats.items():
            out[m + "_mean"], out[m + "_std"] = v.mean, v.std
        return out


def summary_rows(agg: list[dict], metrics: list[str]) -> list[SeedSummary]:
    """Aggregated rows as typed :class:`SeedSummary` rows (read as their CSV / JSON columns)."""
    out = []
    for g in agg:
        stats = {}
        for m in metrics:
            vals = np.asarray(g[m], dtype=float)
            stats[m] = MeanStd(float(vals.mean()) if vals.size else None, float(vals.std()) if vals.size else None)
        group = {k: v for k, v in g.items() if k not in metrics and k != "n_seeds"}
        out.append(SeedSummary(group, g["n_seeds"], stats))
    return out
