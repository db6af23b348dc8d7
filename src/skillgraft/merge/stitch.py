"""The stitch (Localize-and-Stitch, :mod:`skillgraft.graft.merge`) as a merge method: every overlap rule of
``--rules`` at every strength λ of ``--stitch-scales`` scored on dev; λ = 1 and the dev-best λ also on test; its
candidate for the written model (``info["writable"]``) is ``--rule`` at its dev-best λ (written when it is the best
one-model merge on dev)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from skillgraft.graft.merge import RULES, scaled, stitch, task_view
from skillgraft.merge.base import Bench, MergeMethod, MergeRow, Scored, best_row, fmt
from skillgraft.spec import Spec

Rule = Literal[RULES]


class StitchOptions(Spec):
    """The stitch's options (fields of ``skillgraft merge``)."""

    stitch: bool = Field(True, description="stitch the grafts and write the stitched model (off: the other methods "
                                           "only, each task's graft and the report; no merged model is written)")
    rule: Rule = Field("average", description="overlap rule of the stitched model (written when it is the best "
                                              "one-model merge on dev): average (Localize-and-Stitch), "
                                              "max-delta (largest |θ_ft − θ_pre| wins), disjoint (contested "
                                              "coordinates stay θ_pre), consensus, first")
    rules: list[Rule] = Field(default_factory=lambda: ["average", "max-delta", "disjoint"],
                              description="overlap rules the report measures")
    stitch_scales: list[float] = Field(default_factory=lambda: [1.0, 1.5, 2.0, 3.0],
                                       description="λ grid of the stitch, θ_pre + λ Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t (sparse "
                                                   "task arithmetic; 1 = Localize-and-Stitch): chosen on dev rows per "
                                                   "rule, the stitched model takes its rule's dev-best λ")

    @field_validator("stitch_scales")
    @classmethod
    def _positive_not_empty(cls, v: list[float]) -> list[float]:
        if any(x <= 0 for x in v):
            raise ValueError(f"values must be > 0, got {v}")
        if not v:
            raise ValueError("give at least one λ (1 = Localize-and-Stitch as published)")
        return v


class Stitch(MergeMethod):
    """θ_pre + λ Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t under each overlap rule; each task keeps its own head."""

    summary = "the grafts' regions stitched under an overlap rule, at a strength λ chosen on dev"
    Options = StitchOptions
    stores = "graft"
    grid_note = "stitch: λ of θ_pre + λ Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t"
    legend = ("Overlap rules: *average* — θ_pre + Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t (Localize-and-Stitch, Eq. 4: the mean "
              "of the claiming tasks' values; `λ=…` rows scale that sum, as task arithmetic's λ does); "
              "*max-delta* — the task with the largest |τ_t| at the coordinate wins; "
              "*disjoint* — contested coordinates stay θ_pre.")

    def active(self, options: StitchOptions) -> bool:
        return options.stitch

    def headline(self, rows: list[MergeRow], options: StitchOptions) -> dict:
        """The written stitch (--rule at its dev-best λ), the same rule at λ = 1, the rule best on dev; with refitted
        heads, the written stitch refitted; beside mergekit's best, when it ran."""
        mine = [r for r in rows if r.source == self.name and r.on_test]
        written = next(r for r in mine if r.info.get("writable") and not r.refit)
        plain = next(r for r in mine if r.config == options.rule and not r.refit)  # λ = 1: as published
        dev_rule = max((r for r in mine if not r.refit), key=lambda r: r.mean_normalized("dev"))
        out = {"stitch_rule": options.rule, "stitch_scale": written.info["scale"],
               "stitch_written": bool(written.info.get("written")),
               "stitch_mean_normalized": written.mean_normalized(),
               "stitch_scale_1_mean_normalized": plain.mean_normalized(),
               "stitch_rule_chosen_on_dev": dev_rule.config,
               "stitch_dev_rule_mean_normalized": dev_rule.mean_normalized()}
        mergekit = best_row([r for r in rows if r.source == "mergekit"])
        if mergekit is not None:
            out["stitch_at_least_best_mergekit"] = written.mean_normalized() >= mergekit.mean_normalized()
        if any(r.refit for r in rows):
            refit = next((r for r in mine if r.refit and r.config == f"{written.config} + refit heads"), None)
            out["stitch_refit_mean_normalized"] = refit.mean_normalized() if refit else None
            best = best_row([r for r in rows if r.source == "mergekit"], refit=True)
            if refit is not None and best is not None:
                out["stitch_refit_at_least_best_mergekit_refit"] = refit.mean_normalized() >= best.mean_normalized()
        return out

    def headline_lines(self, h: dict) -> list[str]:
        where = "written to this folder" if h.get("stitch_written") else "not written: another merge was better on dev"
        lines = [f"- stitch (`{h['stitch_rule']}`, λ = {h['stitch_scale']:g} chosen on dev; {where}): "
                 f"mean normalized accuracy {fmt(h['stitch_mean_normalized'])} (at λ = 1, Localize-and-Stitch as "
                 f"published: {fmt(h['stitch_scale_1_mean_normalized'])}); the rule and λ best on dev are "
                 f"`{h['stitch_rule_chosen_on_dev']}` ({fmt(h['stitch_dev_rule_mean_normalized'])})"]
        if h.get("refit_heads"):
            lines.append(f"- with heads refitted on {h['refit_heads']} rows per task: stitch "
                         f"{fmt(h.get('stitch_refit_mean_normalized'))}")
        return lines

    def rows(self, bench: Bench, options: StitchOptions, ft: Scored, work: Path) -> list[Scored]:
        grafts = [bench.grafts[n] for n in bench.names]
        out = []
        for rule in dict.fromkeys([options.rule, *options.rules]):
            body = stitch(grafts, rule, base=bench.base)
            rows = self.grid(bench, rule, body, options.stitch_scales, ft)
            if rule == options.rule:  # its candidate for the written model: --rule at its dev-best λ
                next(s for s in rows if s.info.get("chosen_on_dev")).info["writable"] = True
            out += rows
        return out

    def grid(self, bench: Bench, rule: str, body, scales: list[float], ft: Scored) -> list[Scored]:
        """The stitch under ``rule`` at every λ of ``scales`` scored on dev; λ = 1 (Localize-and-Stitch) and the
        dev-best λ also on test (the dev-best is marked ``chosen_on_dev``; ``Scored.body`` is its stitch)."""
        info = {k: body.metadata.stitch[k] for k in ("size", "overlapping_coordinates", "dropped_coordinates")}
        rows = []
        for lam in dict.fromkeys([1.0, *scales]):
            b = scaled(body, lam, bench.base)
            use = bench.grafted(lambda name, b=b: task_view(b, bench.grafts[name]))
            s = Scored("stitch", rule if lam == 1 else f"{rule} λ={lam:g}", info={**info, "scale": lam}, body=b)
            s.dev = bench.score(use, "dev")
            rows.append((s, use))
        best = max((s for s, _ in rows if s.info["scale"] in scales), key=lambda s: s.mean_normalized(ft, "dev"))
        best.info["chosen_on_dev"] = True
        for s, use in rows:
            if s.info["scale"] == 1 or s is best:
                s.test = bench.score(use, "test")
                s.reuse = lambda use=use: use
            elif s is not best:
                s.body = None  # only the reported stitches are kept
        return [s for s, _ in rows]
