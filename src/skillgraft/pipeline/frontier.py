"""The share-vs-size frontier: share of FT against density for a localizer and closed-form peers at equal density.

For one fine-tuned model (a :class:`~skillgraft.pipeline.member.Member`) and densities d (default 1e-5 … 1e-1 of
the graftable body), each method's graft θ_pre + γ_d ⊙ Δ is scored on the test rows:

* the report's localizer — for ``learned`` (paper Eq. 3–4) one trajectory gives two curves: ``learned`` (the
  best-step region per density, as ``--budgets`` gives) and ``learned order`` (the top-k of the learned order
  at the last step — the rounded γ by drift, then |Δ| — the nested family a keep target searches);
* ``ties-trim`` — top-|Δ| within each tensor (TIES's trim as mergekit and PEFT apply it);
* ``movement`` — top-|Δ| over the whole body: Localize-and-Stitch's dataless mask (its Algorithm 1:
  γ = 1 where |τ| is in the top-k of |τ|; with one model its stitching step changes nothing);
* ``dare`` — θ_pre + m ⊙ Δ/(1 − p), m a uniform draw of d·|U| coordinates (a reference: not a subset of Δ);
* ``random`` — a uniform region of the same size.

For each method with a nested family, the density needed for each of ``frontier_keep`` (95% and 99% of FT)
is searched on the selection split (:mod:`skillgraft.keep.selection`) with the keep search's confidence (a lower
bound of the share must reach the target: :mod:`skillgraft.keep.search`), and the region found is scored on the test
rows too. Writes ``frontier.csv``, ``frontier_keep.csv`` and ``frontier.png``; the whole result is a
store entry, so a re-run only re-plots.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field, field_validator

from skillgraft.evaluate.plots import save_figure
from skillgraft.evaluate.rows import Row
from skillgraft.graft.dare import dare_graft, dare_values
from skillgraft.keep.stats.bound import bound_prose
from skillgraft.keep.spec import LEARNED_ORDER, KeepSpec, check_share
from skillgraft.keep.scoring import graft_outcome, keep_search
from skillgraft.graft.localizers import get_localizer
from skillgraft.graft.selection import Budget, as_list, region_universe
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.pipeline.report import RunDir, write_csv
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.variants import Variant, base_variants, compare, graft_variant
from skillgraft.keep.report import KeepTarget
from skillgraft.keep.run import keep_identity
from skillgraft.keep.selection import selection_split
from skillgraft.spec import Spec

PEER_LABELS = {"ties-trim": "top-|Δ| per tensor (TIES trim)", "movement": "top-|Δ| global (L&S dataless)",
               "dare": "DARE (reference)", "random": "random"}
CLOSED_FORM = set(PEER_LABELS)


class FrontierSpec(Spec):
    """Which densities and peers the frontier draws, and which shares' required density it searches."""

    frontier: bool = Field(False, description=(
        "also draw the share-of-FT vs density frontier against closed-form peers (frontier.csv, frontier.png)"))
    frontier_levels: list[Budget] = Field(
        default_factory=lambda: [Budget.parse(x) for x in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)], min_length=1,
        description="frontier densities (fractions of the graftable body)")
    frontier_peers: list[str] = Field(default_factory=lambda: ["ties-trim", "movement", "dare", "random"],
                                      description=("closed-form peers at equal density: ties-trim, movement "
                                                   "(L&S dataless), dare, random, or any score-based localizer"))
    frontier_keep: list[float] = Field(default_factory=lambda: [0.95, 0.99], description=(
        "shares of FT whose required density is searched for each method on the selection split"))
    frontier_sparsities: list[float] | None = Field(None, description=(
        "learned: the γ_base sizes of its trajectories, one trajectory each; each density takes its region from the "
        "trajectory of the largest sparsity ≤ it (the paper learns each size from its own γ_base); the learned order "
        "is the first trajectory's. Default: one trajectory at the localizer's own sparsity"))

    @field_validator("frontier_sparsities", mode="after")
    @classmethod
    def _sparsities(cls, values):
        if values is None:
            return None
        if not values or any(not 0 < v <= 1 for v in values):
            raise ValueError("sparsities are fractions in (0, 1]")
        return sorted(set(values))

    @field_validator("frontier_keep", mode="before")
    @classmethod
    def _shares(cls, value):
        try:
            return [check_share(v) for v in as_list(value) or []]
        except Exception as e:  # noqa: BLE001 - one line, whatever was wrong
            raise ValueError(str(e)) from None

    @field_validator("frontier_levels", mode="after")
    @classmethod
    def _fractions(cls, levels):
        if any(b.fraction is None for b in levels):
            raise ValueError("frontier densities are fractions in (0, 1]")
        return sorted(dict.fromkeys(levels), key=lambda b: b.fraction)


@dataclass
class FrontierRow(Row):
    """One method at one density, scored on the test rows (a frontier.csv row)."""

    method: str
    density: float
    params: int
    score: float
    share_of_ft: float
    gap_closed: float | None = None

    def columns(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class FrontierKeep(KeepTarget):
    """One method's keep search (a frontier_keep.csv row): the method, the search's columns, its probes as
    (size, share) pairs, and the test score and share of the region found."""

    method: str = ""

    def columns(self) -> dict:
        c = super().columns()
        probes = c.pop("probes")
        tested = {k: c.pop(k) for k in ("test_score", "test_share") if k in c}
        return {"method": self.method, **c, "probes": probes, **tested}


@dataclass
class Ahead(Row):
    """At one density: the best learned share, the best closed-form peer's, and whether learned leads."""

    density: float
    learned: str
    learned_share: float
    best_peer: str
    peer_share: float
    ahead: bool

    def columns(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class FrontierResult(Row):
    """The frontier of one fine-tuned model (the store's frontier.json; metrics.json's and ``--json``'s
    ``frontier``): its setting, the rows per method and density, the keep searches, and learned vs the peers."""

    task: str
    ft_score: float
    reference_scores: dict[str, float]  # {variant kind ("pre", "head-only"): test score}
    test_n: int
    selection: str
    selection_n: int
    confidence: float | None
    universe: int
    localizer: str
    localizer_seconds: float
    keep_seconds: float
    rows: list[FrontierRow] = field(default_factory=list)
    keep: list[FrontierKeep] = field(default_factory=list)
    ahead: list[Ahead] = field(default_factory=list)

    @classmethod
    def from_columns(cls, c: dict) -> FrontierResult:
        """The result of stored (written) columns."""
        plain = {f.name: c[f.name] for f in dataclasses.fields(cls) if f.name not in ("rows", "keep", "ahead")}
        return cls(**plain, rows=[FrontierRow(**r) for r in c["rows"]],
                   keep=[FrontierKeep.from_columns(k) for k in c["keep"]], ahead=[Ahead(**a) for a in c["ahead"]])

    def columns(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


_STORED = tuple(f.name for f in dataclasses.fields(FrontierResult))


def frontier_report(member: Member, run: RunDir, spec: FrontierSpec | None = None, localizer: str = "learned",
                    options: Spec | dict | None = None, keep: KeepSpec | None = None, *,
                    progress: bool = False) -> FrontierResult:
    """Score every method at every density and search each one's density for the keep shares (module doc)."""
    spec = spec or FrontierSpec()
    keep = (keep or KeepSpec()).replace(keep=spec.frontier_keep or None)
    loc = get_localizer(localizer)
    options = loc.options(options)
    for name in spec.frontier_peers:
        if name != "dare":
            get_localizer(name)  # unknown names fail before any work
    key = {"setup": member.identity(), "localizer": localizer, "options": options.to_dict(), "frontier": spec.to_dict(),
           **keep_identity(keep), "learned_order": LEARNED_ORDER}

    def make(folder: Path) -> None:
        write_json(folder / "frontier.json", _measure(member, spec, localizer, options, keep, progress))

    entry = run.store.fetch("frontier", key, make, label=f"{member.task}-{member.k}-{member.seed}-{localizer}")
    result = FrontierResult.from_columns(read_json(entry / "frontier.json", required=_STORED, what="stored frontier"))
    write_csv(run.file("frontier.csv"), result.rows)
    write_csv(run.file("frontier_keep.csv"), result.keep)
    frontier_plot(result, run.file("frontier.png"), member.task)
    return result


def _families(member: Member, spec: FrontierSpec, localizer: str, options: Spec, data, progress: bool):
    """{method: (ranking or None, {density: region} or None, dare?)} and the localizer's seconds."""
    out: dict[str, tuple] = {}
    t0 = time.perf_counter()
    loc = get_localizer(localizer)
    if loc.sparsity_trajectories:  # its capability (learned): one trajectory per γ_base sparsity
        base = loc.options(options.to_dict())
        sparsities = spec.frontier_sparsities or [base.sparsity]
        regions, order = {}, None
        for i, s in enumerate(sparsities):  # each density: the trajectory of the largest sparsity ≤ it
            mine = [b for b in spec.frontier_levels
                    if max([x for x in sparsities if x <= b.fraction] or [sparsities[0]]) == s]
            if not mine and i:
                continue
            cfg = base.replace(sparsity=s, budgets=[b.key for b in mine] or [spec.frontier_levels[0].key])
            result = loc.trajectory(member.pre, member.ft, data, cfg, ranked=i == 0, progress=progress)
            regions |= {b.fraction: r for b, r in result.regions.items() if b in mine}
            order = order or result.ranking
        out[localizer] = (None, regions, False)
        out[f"{localizer} order"] = (order, None, False)
    elif get_localizer(localizer).ranked:
        out[localizer] = (get_localizer(localizer).ranking(member.pre, member.ft, data, options, progress=progress),
                          None, False)
    else:  # one trajectory per budget: its regions at each density, no keep search
        found = get_localizer(localizer).regions(member.pre, member.ft, data, spec.frontier_levels, options,
                                                 progress=progress)
        out[localizer] = (None, {b.fraction: r for b, r in found.items()}, False)
    seconds = time.perf_counter() - t0
    seed = getattr(options, "seed", 0)
    for name in spec.frontier_peers:
        peer = "random" if name == "dare" else name
        opts = {"graftable": options.graftable} | ({"seed": seed} if peer == "random" else {})
        ranking = get_localizer(peer).ranking(member.pre, member.ft, data, opts)
        out[PEER_LABELS.get(name, name)] = (ranking, None, name == "dare")
    return out, seconds


def _measure(member: Member, spec: FrontierSpec, localizer: str, options: Spec, keep: KeepSpec,
             progress: bool) -> FrontierResult:
    selection, data, note = selection_split(member, keep)
    families, loc_seconds = _families(member, spec, localizer, options, data, progress)
    universe = region_universe(member.pre, options.graftable)
    size = sum(math.prod(s) for s in universe.values())
    variants: list[Variant] = [v for v in base_variants(member) if v.kind in ("ft", "pre", "head-only")]
    points = []
    for method, (ranking, regions, dare) in families.items():
        for level in spec.frontier_levels:
            region = regions[level.fraction] if regions is not None else ranking.region(level.size(size))
            name = f"{method} @ {level.label}"
            variants.append(_variant(member, region, level, name, dare))
            points.append((method, level.fraction, name))
    keeps, t0 = [], time.perf_counter()
    for method, (ranking, _, dare) in families.items():
        if ranking is None or not keep.keep:
            continue
        score = graft_outcome(member.pre, member.ft, selection, values=dare_values(member.pre, member.ft, size) if dare
                              else None, tokens=bool(keep.keep_agreement))
        for r in keep_search(member.pre, member.ft, ranking, selection, keep, score=score):
            name = f"{method} keep {r.target:g}"
            variants.append(_variant(member, r.region, Budget.parse(max(1, len(r.region))), name, dare))
            found = FrontierKeep.from_columns({**r.to_dict(), "method": method})
            keeps.append((name, dataclasses.replace(found, probes=[[p.size, round(p.share, 4)] for p in r.probes])))
    keep_seconds = time.perf_counter() - t0
    rows, _ = compare(member, variants, progress=progress)
    by_name = {r.model: r for r in rows}
    ft = next(r for r in rows if r.kind == "ft")
    ref = {r.kind: r.score for r in rows if r.kind in ("pre", "head-only")}
    out_rows = [FrontierRow(method, density, by_name[name].params, by_name[name].score, by_name[name].share_of_ft,
                            by_name[name].gap_closed) for method, density, name in points]
    tested = [dataclasses.replace(k, tested=True, test_score=by_name[name].score,
                                  test_share=by_name[name].share_of_ft) for name, k in keeps]
    return FrontierResult(member.task, ft.score, ref, len(member.test), note, len(selection), keep.keep_confidence,
                          size, localizer, loc_seconds, keep_seconds, out_rows, tested, ahead(out_rows))


def _variant(member: Member, region, level: Budget, name: str, dare: bool) -> Variant:
    if dare:
        return Variant(name, "dare", len(region), dare_graft(member.pre, member.ft, region), level.fraction)
    return graft_variant(member, region, level, name=name, kind="graft")


def ahead(rows: list[FrontierRow], upto: float = 1e-2) -> list[Ahead]:
    """Per density ≤ ``upto``: the best learned share, the best closed-form peer's, and whether learned leads."""
    out = []
    for d in sorted({r.density for r in rows if r.density <= upto * (1 + 1e-9)}):
        at = [r for r in rows if r.density == d]
        mine = [r for r in at if not _closed_form(r.method)]
        peers = [r for r in at if _closed_form(r.method)]
        if not mine or not peers:
            continue
        best, peer = max(mine, key=lambda r: r.share_of_ft), max(peers, key=lambda r: r.share_of_ft)
        out.append(Ahead(d, best.method, best.share_of_ft, peer.method, peer.share_of_ft,
                         best.share_of_ft > peer.share_of_ft))
    return out


def _closed_form(method: str) -> bool:
    return method in PEER_LABELS.values()


def frontier_plot(result: FrontierResult, path: Path, task: str) -> None:
    """Share of FT vs density, one line per method, the keep shares as dotted lines."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for method in dict.fromkeys(r.method for r in result.rows):
        pts = sorted((r.density, r.share_of_ft) for r in result.rows if r.method == method)
        style = "--" if _closed_form(method) else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=method)
    for share in sorted({k.target for k in result.keep}):
        ax.axhline(share, color="gray", ls=":", lw=1)
    ax.axhline(1.0, color="k", lw=1, label="fine-tuned")
    ax.set_xscale("log")
    ax.set_xlabel("density (fraction of the graftable body)")
    ax.set_ylabel("share of FT (test)")
    ax.set_title(f"{task}: share of FT vs density")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def frontier_markdown(result: FrontierResult) -> list[str]:
    """Report lines: the frontier table, learned vs the best peer at each density ≤ 1e-2, and the keep densities."""
    levels = sorted({r.density for r in result.rows})
    lines = ["", "## Share of FT vs density", "",
             f"Test rows: {result.test_n} (FT {result.ft_score:.4f}). Selection split for the keep densities: "
             f"{result.selection}.", "",
             "| method | " + " | ".join(f"{d:g}" for d in levels) + " |", "|---|" + "---:|" * len(levels)]
    for method in dict.fromkeys(r.method for r in result.rows):
        share = {r.density: r.share_of_ft for r in result.rows if r.method == method}
        cells = " | ".join(f"{share[d]:.3f}" if d in share else "-" for d in levels)
        lines.append(f"| {_cell(method)} | {cells} |")
    if result.ahead:
        lines += ["", "| density | best learned | share | best closed-form peer | share | learned ahead |",
                  "|---:|---|---:|---|---:|:---:|"]
        for a in result.ahead:
            lines.append(f"| {a.density:g} | {_cell(a.learned)} | {a.learned_share:.3f} | "
                         f"{_cell(a.best_peer)} | {a.peer_share:.3f} | {'yes' if a.ahead else '**no**'} |")
    if result.keep:
        conf = result.confidence
        how = (f"the smallest density reaching the target {bound_prose(conf)}" if conf is not None
               else "the point estimate")
        lines += ["", f"Density needed for each share of FT (searched on the selection split: {how}; the test share of "
                  "the region found beside it):", "", "| method | target | density needed | selection share | "
                  "lower bound | test share | point-estimate density | probes |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for k in result.keep:
            need = f"{k.density:.2e}" if k.reached else f"not reached (best {k.best_share:.3f})"
            sel = f"{k.selection_share:.3f}" if k.reached else "-"
            bound = "-" if k.bound is None else f"{k.bound:.3f}"
            point = "-" if k.point_size is None else f"{k.point_size / k.universe:.2e}"
            lines.append(f"| {_cell(k.method)} | {k.target:g} | {need} | {sel} | {bound} | {k.test_share:.3f} | "
                         f"{point} | {k.probe_count} |")
    lines += ["", "![frontier](frontier.png)", ""]
    return lines
