"""FISH vs learned vs random regions (paper Table 8) and region analyses (Figs. 9, 10, 15).

For each task × data seed × sparsity: the learned region (Eq. 3–4, exact budget by top-k of γ), a FISH
region (top Fisher on θ_pre, Sung et al.) and a random region of the *same size*; each is grafted
(θ_pre + γ⊙Δ) and scored on the test subset (score, ECE) beside the fine-tuned and head-only models
(:func:`skillgraft.pipeline.variants.compare`); IoU(FISH, learned) = |∩| / |∪|.

Region analyses: per layer × module type heatmaps of the learned (and FISH) region for several tasks
(share of each cell's parameters in the region); and tracking — one fine-tuning run with checkpoints,
a region learned on the checkpoint at ``learn_at``, grafted with the values of earlier/later checkpoints.

Fine-tuning, learned and FISH regions (the one regions cache, :func:`skillgraft.pipeline.regions.learned_regions`)
and the tracking rows (kind ``fish-tracking``) live in the store. Writes ``fish.csv`` (one row per task ×
seed × sparsity), ``summary.csv``, ``heatmap.png``, ``tracking.csv``, ``tracking.png`` and ``report.md``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from skillgraft.lazy import plt

from skillgraft.data.tasks import get_task
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.plots import save_figure
from skillgraft.evaluate.predict import evaluate
from skillgraft.evaluate.rows import Row
from skillgraft.fisher import FisherConfig
from skillgraft.graft import Budget, Graft, LocalizeConfig, Region, get_localizer, localize
from skillgraft.graft.inspect import kind_of
from skillgraft.graft.scoring import evaluate_graft
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.models import param_groups
from skillgraft.pipeline.regions import learned_regions
from skillgraft.pipeline.report import RunDir, aggregate, md_table, pct, setting_line
from skillgraft.pipeline.store import draw_key, precision_key
from skillgraft.pipeline.variants import base_variants, compare, graft_variant
from skillgraft.recipes.base import ExperimentSpec, SeedsMixin, recipe
from skillgraft.spec import COUNT_MAX, Seed, Spec
from skillgraft.train import Snapshots, finetune

METRICS = ["iou_fish_learned", "learned_score", "fish_score", "random_score", "learned_ece", "fish_ece", "random_ece"]
Fraction = Annotated[float, Field(gt=0, le=1)]


class TrackingSpec(Spec):
    """Fig. 15: one fine-tuning run with checkpoints; a region learned on one, grafted with each."""

    task: str | None = Field(None, description="task of the tracked run (null: the first of `tasks`)")
    seed: Seed | None = Field(None, description="data seed of the tracked run (null: the first of `seeds`)")
    steps: list[Annotated[int, Field(ge=1, le=COUNT_MAX)]] = Field(min_length=1, description=(
        "checkpoints (fine-tuning steps, within the run's step count) grafted with the region"))
    learn_at: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "checkpoint the region is learned on, one of `steps` "
        "(null: the middle one)"))
    sparsity: Fraction | None = Field(None, description="region size as a fraction of the graftable body "
                                                        "(null: the middle of `sparsities`)")

    @model_validator(mode="after")
    def _learn_at_is_a_step(self) -> TrackingSpec:
        if self.learn_at is not None and self.learn_at not in self.steps:
            raise ValueError(f"learn_at={self.learn_at} must be one of steps {sorted(set(self.steps))}")
        return self

    @property
    def learn_step(self) -> int:
        steps = sorted(set(self.steps))
        return self.learn_at if self.learn_at is not None else steps[len(steps) // 2]


class FishSpec(ExperimentSpec, SeedsMixin):
    """Learned vs FISH vs random regions of equal sizes; heatmaps; tracking a region across checkpoints."""

    sparsities: list[Fraction] = Field(default_factory=lambda: [1e-4, 1e-3, 1e-2], min_length=1, description=(
        "region sizes as fractions of the graftable body (the learned localizer's budgets; FISH and random "
        "regions take the learned regions' exact sizes)"))
    localize: LocalizeConfig = Field(default_factory=LocalizeConfig,
                                     description="the learned localizer (its budgets are `sparsities`)")
    fisher: FisherConfig = Field(default_factory=FisherConfig, description="the Fisher pass of the FISH regions")
    fish_head: Literal["ft", "pre"] = Field("ft", description=(
        "head θ_pre wears for the Fisher pass in head mode: ft (the task head) | pre (its own random one)"))
    heatmap_tasks: list[str] | None = Field(None, description="tasks whose regions get a heatmap (null: all; "
                                                              "empty: none)")
    heatmap_sparsity: Fraction | None = Field(None, description=(
        "the heatmaps show the regions of the nearest of `sparsities` (null: the middle one)"))
    tracking: TrackingSpec | None = Field(None, description="tracking a region across checkpoints (null: off)")

    @model_validator(mode="after")
    def _budgets_are_sparsities(self) -> FishSpec:
        if self.localize.budgets is not None:
            raise ValueError("localize.budgets: set by `sparsities` in this recipe; leave it out")
        return self


@dataclass
class GraftScore:
    """A region's graft on the test rows: its score and ECE."""

    score: float
    ece: float


@dataclass
class FishRow(Row):
    """One task × seed × sparsity of fish.csv: the learned region, FISH's and a random one of the same size, their
    sizes, overlaps with the learned region and scores."""

    task: str
    seed: int
    sparsity: float
    learned_size: int
    fish_size: int
    random_size: int
    iou_fish_learned: float
    iou_random_learned: float
    learned: GraftScore
    fish: GraftScore
    random: GraftScore

    def columns(self) -> dict:
        out = {"task": self.task, "seed": self.seed, "sparsity": self.sparsity, "learned_size": self.learned_size,
               "fish_size": self.fish_size, "random_size": self.random_size,
               "iou_fish_learned": self.iou_fish_learned, "iou_random_learned": self.iou_random_learned}
        for name in TRIO:
            scored = getattr(self, name)
            out |= {f"{name}_score": scored.score, f"{name}_ece": scored.ece}
        return out


TRIO = ("learned", "fish", "random")  # the regions a FishRow compares, in its columns' order


@recipe("fish", FishSpec)
def fish(spec: FishSpec, run: RunDir) -> dict:
    sparsities = spec.sparsities
    loc = spec.localize.replace(budgets=sparsities)
    if spec.tracking is not None:
        check_tracking(spec)  # before any work
    wanted = spec.heatmap_sparsity or sparsities[len(sparsities) // 2]
    map_sparsity = min(sparsities, key=lambda s: abs(np.log(s) - np.log(wanted)))  # the nearest level run
    map_tasks = spec.tasks if spec.heatmap_tasks is None else spec.heatmap_tasks
    rows, base_rows, regions_for_maps, timings = [], [], {}, []
    for task in spec.tasks:
        for seed in spec.seeds:
            member = spec.member(run, task, seed)
            t0 = time.perf_counter()
            learned, _ = learned_regions(member, run.store, "learned", loc, progress=spec.progress)
            t_loc = time.perf_counter() - t0
            t0 = time.perf_counter()
            sizes = [len(learned[Budget.parse(sp)]) for sp in sparsities]  # FISH regions of the learned sizes
            fish_regions, _ = learned_regions(member, run.store, "fish", {"budgets": sizes, "fisher": spec.fisher,
                                                                          "head": spec.fish_head},
                                              progress=spec.progress)
            t_fish = time.perf_counter() - t0
            variants, trios = base_variants(member), []
            n_base = len(variants)
            for sp in sparsities:
                region = learned[Budget.parse(sp)]
                n = len(region)
                trio = dict(zip(TRIO, (region, fish_regions[Budget.parse(n)],
                                       get_localizer("random").region(member.pre, member.ft, None, n, {"seed": seed}))))
                variants += [graft_variant(member, r, sp, name=f"{name} @ {sp:g}") for name, r in trio.items()]
                trios.append((sp, trio))
            scored, _ = compare(member, variants)  # one row per variant, in their order
            kinds = {r.kind: r for r in scored if r.kind in ("ft", "head-only", "pre")}
            ft, head_only = kinds["ft"], kinds.get("head-only", kinds["pre"])
            base_rows.append({"task": member.task, "seed": seed, "ft_score": ft.score, "ft_ece": ft.metrics["ece"],
                              "head_only_score": head_only.score})
            grafts = iter(scored[n_base:])  # the trios' rows, in order
            for sp, trio in trios:
                region, fish_r, rand_r = trio["learned"], trio["fish"], trio["random"]
                got = {name: GraftScore(r.score, r.metrics["ece"]) for name, r in zip(TRIO, grafts)}
                rows.append(FishRow(member.task, seed, sp, len(region), len(fish_r), len(rand_r), fish_r.iou(region),
                                    rand_r.iou(region), **got))
                if task in map_tasks and seed == spec.seeds[0] and sp == map_sparsity:
                    regions_for_maps[f"{member.task} learned"] = (member.pre, region)
                    regions_for_maps[f"{member.task} FISH"] = (member.pre, fish_r)
            timings.append({"task": member.task, "seed": seed, "localize_seconds": round(t_loc, 1),
                            "fisher_seconds": round(t_fish, 1), "finetune_seconds": round(member.inputs.ft_seconds, 1)})
    agg, summary = run.seed_tables("fish.csv", rows, ["task", "sparsity"], METRICS)
    maps = {}
    if regions_for_maps:
        maps = plot_heatmaps(regions_for_maps, run.file("heatmap.png"))
        run.json("heatmap.json", maps)
    tracking = tracking_rows(spec, run, loc) if spec.tracking is not None else []
    if tracking:
        run.csv("tracking.csv", tracking)
        plot_tracking(tracking, run.file("tracking.png"))
    run.report(report(spec, agg, base_rows, maps, tracking, timings))
    return {"rows": rows, "summary": summary, "baselines": base_rows, "tracking": tracking, "timings": timings}


# ---------------------------------------------------------------------------------------------- heatmaps
def layer_module_matrix(pre, region: Region) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """Rows: structural layers (``block:i`` from module structure, never name prefixes); columns: module
    types; returns (rows, cols, region counts, cell sizes)."""
    groups = param_groups(pre)
    cells: dict[tuple[str, str], list[int]] = {}
    for name, shape in region.shapes.items():
        g = groups.get(name, "other")
        layer = f"layer {g.split(':')[1]}" if g.startswith("block:") else g
        key = (layer, kind_of(name))
        c = cells.setdefault(key, [0, 0])
        c[0] += int(region.indices[name].numel()) if name in region.indices else 0
        c[1] += int(np.prod(shape))
    layers = sorted({k[0] for k in cells}, key=lambda s: (not s.startswith("layer"), int(s.split()[1])
                                                          if s.startswith("layer") else 0, s))
    kinds = sorted({k[1] for k in cells})
    counts = np.array([[cells.get((lay, k), [0, 0])[0] for k in kinds] for lay in layers], dtype=float)
    sizes = np.array([[cells.get((lay, k), [0, 0])[1] for k in kinds] for lay in layers], dtype=float)
    return layers, kinds, counts, sizes


def plot_heatmaps(regions: dict[str, tuple], path) -> dict:
    panels = {}
    for title, (pre, region) in regions.items():
        layers, kinds, counts, sizes = layer_module_matrix(pre, region)
        share = np.divide(counts, sizes, out=np.zeros_like(counts), where=sizes > 0)
        panels[title] = {"layers": layers, "module_types": kinds, "counts": counts.astype(int).tolist(),
                         "share": share.tolist(), "size": len(region)}
    n = len(panels)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    first = next(iter(panels.values()))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * (1.5 + 0.75 * len(first["module_types"])),
                                                  rows * (1.2 + 0.4 * len(first["layers"]))), squeeze=False)
    for ax, (title, p) in zip(axes.flat, panels.items()):
        im = ax.imshow(np.asarray(p["share"]), cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(p["module_types"])), p["module_types"], rotation=45, ha="right", fontsize=6)
        ax.set_yticks(range(len(p["layers"])), p["layers"], fontsize=6)
        ax.set_title(f"{title} (|γ|={p['size']})", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046, label="share of cell in region")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    save_figure(fig, path)
    return panels


# ---------------------------------------------------------------------------------------------- tracking
def check_tracking(spec: FishSpec) -> None:
    """The tracked checkpoints lie within the run's steps (checked before any work)."""
    task = get_task(spec.tracking.task or spec.tasks[0])
    total = spec.finetune.resolved_steps(task.num_labels, spec.k)
    if max(spec.tracking.steps) > total:
        raise SkillgraftError(f"recipe field 'tracking.steps': {sorted(set(spec.tracking.steps))} must lie in "
                              f"1..{total} (the run's steps)")


def tracking_rows(spec: FishSpec, run: RunDir, loc: LocalizeConfig) -> list[dict]:
    """Fig. 15: a region learned on one checkpoint, grafted with the values of other checkpoints."""
    tr = spec.tracking
    model = spec.model_spec()
    seed = tr.seed if tr.seed is not None else spec.seeds[0]
    data_spec = spec.data_spec(tr.task or spec.tasks[0], seed)
    config = spec.finetune.replace(eval_every=0)
    steps, learn_at = sorted(set(tr.steps)), tr.learn_step
    sparsity = tr.sparsity or sorted(spec.sparsities)[len(spec.sparsities) // 2]
    learn_cfg = loc.replace(budgets=[sparsity])
    key = {**draw_key(model, data_spec), **precision_key(run.runtime), "finetune": config.to_dict(), "steps": steps,
           "learn_at": learn_at, "localize": learn_cfg.to_dict()}

    def make(folder: Path) -> None:
        data = data_spec.load()
        total = config.resolved_steps(data.task.num_labels, data.k)
        pre = model.scorer(data.task, head_seed=config.seed).eval()
        scorer = model.scorer(data.task, head_seed=config.seed)
        snaps = Snapshots(scorer, [s for s in steps if s < total])
        finetune(scorer, data.train, None, config.replace(steps=total), k=data.k, progress=False, callbacks=[snaps])
        ckpts = {s: snaps.scorer_at(s) for s in snaps.states}
        if total in steps:
            ckpts[total] = scorer
        region = localize(pre, ckpts[learn_at], data.train, data.dev, learn_cfg, progress=False).region
        rows = []
        for s, ck in sorted(ckpts.items()):
            ft_m, _ = evaluate(ck, data.test)
            g_m, _ = evaluate_graft(pre, Graft.from_models(pre, ck, region), data.test)
            rows.append({"task": data.task.name, "seed": seed, "step": s, "learned_at": learn_at,
                         "sparsity": sparsity, "region_size": len(region), "checkpoint_score": ft_m["score"],
                         "graft_score": g_m["score"], "graft_ece": g_m["ece"]})
        write_json(folder / "rows.json", rows)

    entry = run.store.fetch("fish-tracking", key, make, label=f"{data_spec.task}-{spec.k}-{seed}")
    return read_json(entry / "rows.json")


def plot_tracking(rows: list[dict], path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    steps = [r["step"] for r in rows]
    ax.plot(steps, [100 * r["checkpoint_score"] for r in rows], "o-", label="checkpoint (fine-tuned)")
    ax.plot(steps, [100 * r["graft_score"] for r in rows], "s--",
            label=f"graft: region from step {rows[0]['learned_at']}")
    ax.axvline(rows[0]["learned_at"], color="gray", lw=0.8, ls=":")
    ax.set_xlabel("fine-tuning step of the checkpoint")
    ax.set_ylabel("test score (%)")
    ax.set_title(f"{rows[0]['task']}: tracking one region across checkpoints", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------------- report
def report(spec: FishSpec, agg: list[dict], base_rows: list[dict], maps: dict, tracking: list[dict],
           timings: list[dict]) -> str:
    fcfg = spec.fisher
    lines = ["# FISH vs learned vs random regions (Table 8) and region analyses (Figs. 9, 10, 15)", "",
             setting_line(spec, f"FISH = top {fcfg.kind} Fisher of θ_pre over "
                                            f"{fcfg.n_examples or 'all'} training examples (head: {spec.fish_head})"),
             "",
             "All three regions of a row have exactly the same size (the learned region's, an exact budget by "
             "top-k of γ). Grafted model = θ_pre + γ⊙(θ_ft − θ_pre) with the fine-tuned head; score = accuracy "
             "(F1 for MRPC/QQP) in %, mean (std) over seeds. IoU = |γ_FISH ∩ γ| / |γ_FISH ∪ γ|.", ""]
    rows = [[g["task"], f"{g['sparsity']:g}", pct(g["iou_fish_learned"], 2), pct(g["learned_score"]),
             pct(g["fish_score"]), pct(g["random_score"]), pct(g["learned_ece"]), pct(g["fish_ece"]),
             pct(g["random_ece"]), g["n_seeds"]] for g in agg]
    lines += [md_table(["task", "sparsity", "IoU FISH/learned %", "learned graft", "FISH graft", "random graft",
                        "ECE learned", "ECE FISH", "ECE random", "seeds"], rows), ""]
    base = aggregate(base_rows, ["task"], ["ft_score", "ft_ece", "head_only_score"])
    lines += ["Baselines: " + "; ".join(f"{g['task']}: fine-tuned {pct(g['ft_score'])} (ECE {pct(g['ft_ece'])}), "
                                        f"head only {pct(g['head_only_score'])}" for g in base), ""]
    if maps:
        lines += ["## Where the regions sit (Figs. 9, 10)", "",
                  "heatmap.png: share of each (layer × module type) cell's parameters inside the region. "
                  "Layers are transformer blocks found by module structure.", ""]
        for title, p in maps.items():
            counts = np.asarray(p["counts"])
            top_layer = p["layers"][int(counts.sum(1).argmax())]
            top_kind = p["module_types"][int(counts.sum(0).argmax())]
            lines.append(f"- {title}: |γ| = {p['size']}; most coordinates in {top_layer}, module type {top_kind}.")
        lines.append("")
    if tracking:
        t0 = tracking[0]
        lines += ["## Tracking a region across checkpoints (Fig. 15)", "",
                  f"{t0['task']} seed {t0['seed']}: region (sparsity {t0['sparsity']:g}, |γ| = {t0['region_size']}) "
                  f"learned on the checkpoint after {t0['learned_at']} steps, then grafted with each checkpoint's "
                  "values.", "",
                  md_table(["step", "checkpoint score %", "graft score %", "graft ECE %"],
                           [[r["step"], f"{100 * r['checkpoint_score']:.1f}", f"{100 * r['graft_score']:.1f}",
                             f"{100 * r['graft_ece']:.1f}"] for r in tracking]), ""]
    lines += ["## Time", "", md_table(["task", "seed", "fine-tuning s", "localize s", "Fisher s"],
                                       [[t["task"], t["seed"], t["finetune_seconds"], t["localize_seconds"],
                                         t["fisher_seconds"]] for t in timings]), "",
              "Seconds of this run (near 0 where the store already held the stage). "
              "Files: fish.csv, summary.csv, heatmap.png/json, tracking.csv, tracking.png."]
    return "\n".join(lines) + "\n"
