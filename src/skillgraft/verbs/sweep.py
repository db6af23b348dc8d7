"""``skillgraft sweep``: test score vs region size for learned, top-movement and random regions (paper Figs. 2/4).

Writes ``sweep.csv`` and ``sweep.png`` (and, with ``--frontier``, the share-vs-density frontier)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from skillgraft.data.spec import DataSpec
from skillgraft.evaluate.plots import save_figure
from skillgraft.evaluate.rows import Row
from skillgraft.graft.localizers import LocalizeConfig, get_localizer
from skillgraft.graft.selection import Budget
from skillgraft.pipeline.regions import learned_regions
from skillgraft.pipeline.report import RunDir, write_csv
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.variants import base_variants, compare, graft_variant
from skillgraft.spec import Spec
from skillgraft.verbs import converts_into_store
from skillgraft.verbs.result import VerbResult
from skillgraft.verbs.graft import BASELINE_LABELS, baseline_options

if TYPE_CHECKING:
    from skillgraft.pipeline.frontier import FrontierResult

LEARNED_MAX = 1e-2  # learned regions beyond this size are top-movement in all but name


class SweepSpec(Spec):
    """Region sizes of a sparsity sweep (paper Figs. 2/4) and which localizers to draw."""

    levels: list[Budget] = Field(default_factory=lambda: [Budget.parse(x) for x in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)],
                                 min_length=1, description="region sizes (fractions of the graftable body)")
    learned: bool = Field(True, description="include learned grafts (one trajectory; levels ≤ 1e-2)")
    localizers: list[str] = Field(default_factory=lambda: ["movement", "random"],
                                  description="score-based localizers drawn at every level")


@dataclass
class SweepRow(Row):
    """One (localizer, level) point of a sweep, read as its sweep.csv / ``--json`` columns."""

    localizer: str
    level: float | str  # the level's fraction, or its label (a count)
    params: int
    score: float
    ece: float
    agreement: float
    ft_score: float

    def columns(self) -> dict:
        return {"localizer": self.localizer, "level": self.level, "params": self.params, "score": self.score,
                "ece": self.ece, "agreement": self.agreement, "ft_score": self.ft_score}


def sweep_report(member: Member, run: RunDir, sweep: SweepSpec | None = None, localize: LocalizeConfig | None = None,
                 *, progress: bool = True) -> list[SweepRow]:
    """Test score of every localizer's region at each level; writes ``sweep.csv`` and ``sweep.png``."""
    sweep = sweep or SweepSpec()
    localize = localize or LocalizeConfig()
    levels = sorted(set(sweep.levels), key=lambda b: b.size(10**12))
    variants = [v for v in base_variants(member) if v.kind == "ft"]
    learned = {}
    small = [lv for lv in levels if lv.fraction is not None and lv.fraction <= LEARNED_MAX]
    if sweep.learned and small:
        learned, _ = learned_regions(member, run.store, "learned", localize.replace(budgets=small), progress=progress)
    points = []
    for level in levels:
        regions = {BASELINE_LABELS.get(n, n): get_localizer(n).region(
                       member.pre, member.ft, member.data, level,
                       baseline_options(n, localize.graftable, localize.seed))
                   for n in sweep.localizers}
        if level in learned:
            regions["learned"] = learned[level]
        for name, region in regions.items():
            variants.append(graft_variant(member, region, level, name=f"{name} {level.label}", kind="graft"))
            points.append((name, level))
    rows, _ = compare(member, variants, progress=progress)
    ft_score = rows[0].score
    out = [SweepRow(name, level.fraction if level.fraction is not None else level.label, r.params, r.score,
                    r.metrics["ece"], r.metrics["agreement"], ft_score) for (name, level), r in zip(points, rows[1:])]
    write_csv(run.file("sweep.csv"), out)
    _sweep_plot(out, ft_score, run.file("sweep.png"), member.task)
    return out


def _sweep_plot(rows: list[SweepRow], ft_score: float, path: Path, task: str) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name in dict.fromkeys(r.localizer for r in rows):
        pts = sorted((float(r.level), r.score) for r in rows if r.localizer == name)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
    ax.axhline(ft_score, color="k", ls="--", lw=1, label="fine-tuned")
    ax.set_xscale("log")
    ax.set_xlabel("region size (fraction of graftable parameters)")
    ax.set_ylabel("test score")
    ax.set_title(f"{task}: graft score vs sparsity")
    ax.legend(fontsize=8)
    save_figure(fig, path)


@dataclass
class SweepResult(VerbResult):
    """What ``skillgraft sweep`` wrote: its folder, one row per (localizer, level), the frontier if asked."""

    out: Path
    rows: list[SweepRow]
    frontier: FrontierResult | None = None  # with --frontier
    memory: object = None  # the memory plan (skillgraft.models.memory.MemoryPlan), when one was made

    def document(self) -> dict:
        """The folder, the rows and (with --frontier) the frontier."""
        return {"out": self.out, "rows": self.rows, **({"frontier": self.frontier} if self.frontier else {})}


@converts_into_store
def sweep(finetuned: str | os.PathLike, spec: SweepSpec | None = None, localize: LocalizeConfig | None = None, *,
          data: DataSpec | None = None, frontier=None, out: str | os.PathLike | None = None, overwrite: bool = False,
          cache: str | os.PathLike | None = None, runtime=None) -> SweepResult:
    """``skillgraft sweep``: the sweep of the run ``finetuned`` into ``out`` (default ``<finetuned>/sweep``), on
    ``runtime`` (None: the placement the command line activated), passed down."""
    from skillgraft.io import atomic_dir, check_target  # noqa: PLC0415
    from skillgraft.models.placement import boundary  # noqa: PLC0415
    from skillgraft.pipeline import Store  # noqa: PLC0415
    from skillgraft.pipeline.opening import from_run  # noqa: PLC0415

    runtime = boundary(runtime)
    data = data or DataSpec()
    out = check_target(Path(out) if out is not None else Path(finetuned) / "sweep", overwrite,
                       {"--cache": Store(cache).root, "--finetuned": finetuned, "--data-dir": data.data_dir})
    from skillgraft.pipeline.memory_plan import plan_localization  # noqa: PLC0415

    spec = spec or SweepSpec()  # the plan, before any work: fits (candidates auto resolved), or one line
    localize, memory = plan_localization("sweep", finetuned, localize or LocalizeConfig(), baselines=spec.localizers,
                                         lean=False, runtime=runtime)
    member = from_run(finetuned, data_dir=data.data_dir, test_limit=data.test_limit, runtime=runtime)
    found = None
    with atomic_dir(out, overwrite=overwrite) as tmp:
        run = RunDir(tmp, Store(cache), runtime=runtime)
        rows = sweep_report(member, run, spec, localize)
        if frontier is not None and frontier.frontier:
            from skillgraft.pipeline.frontier import frontier_report  # noqa: PLC0415

            found = frontier_report(member, run, frontier, "learned", localize)
    return SweepResult(out, rows, found, memory)
