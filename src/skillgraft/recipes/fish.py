"""FISH vs learned vs random regions (paper Table 8) and region analyses (Figs. 9, 10, 15).

For each task × data seed × sparsity: the learned region (Eq. 3–4, exact budget by top-k of γ), a FISH
region (top Fisher on θ_pre, Sung et al.) and a random region of the *same size*; each is grafted
(θ_pre + γ⊙Δ) and scored on the test subset (score, ECE); IoU(FISH, learned) = |∩| / |∪|.

Region analyses: per layer × module type heatmaps of the learned (and FISH) region for several tasks
(share of each cell's parameters in the region); and tracking — one fine-tuning run with checkpoints,
a region learned on the checkpoint at ``learn_at``, grafted with the values of earlier/later checkpoints.

Writes ``fish.csv`` (one row per task × seed × sparsity), ``summary.csv``, ``heatmap.png``,
``tracking.csv``, ``tracking.png`` and ``report.md``.
"""

from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from skillgraft.data import load_kshot  # noqa: E402
from skillgraft.errors import SkillgraftError  # noqa: E402
from skillgraft.evaluate.plots import save_figure  # noqa: E402
from skillgraft.evaluate.predict import evaluate  # noqa: E402
from skillgraft.graft import Budget, Graft, Region, get_localizer, localize  # noqa: E402
from skillgraft.graft.inspect import kind_of  # noqa: E402
from skillgraft.graft.scoring import evaluate_graft  # noqa: E402
from skillgraft.models import build_scorer, param_groups  # noqa: E402
from skillgraft.recipes import common as C  # noqa: E402
from skillgraft.recipes.base import RunDir, recipe  # noqa: E402
from skillgraft.recipes.surgical import fisher_config  # noqa: E402
from skillgraft.train import Snapshots, finetune  # noqa: E402

METRICS = ["iou_fish_learned", "learned_score", "fish_score", "random_score", "learned_ece", "fish_ece", "random_ece"]


def sparsities_of(cfg: dict) -> list[float]:
    sp = [float(s) for s in cfg.get("sparsities", [1e-4, 1e-3, 1e-2])]
    if not sp or not all(0 < s <= 1 for s in sp):
        raise SkillgraftError(f"recipe field 'sparsities': fractions of the graftable body in (0, 1], got {sp}")
    return sp


@recipe("fish")
def fish(cfg: dict, run: RunDir) -> dict:
    tasks = cfg.get("tasks") or ["SST-2"]
    seeds = C.seeds_of(cfg)
    sparsities = sparsities_of(cfg)
    fcfg = fisher_config(cfg)
    loc = C.localize_config({"localize": {**(cfg.get("localize") or {}), "budgets": sparsities}})
    head_source = cfg.get("fish_head", "ft")
    if head_source not in ("ft", "pre"):
        raise SkillgraftError(f"recipe field 'fish_head' must be 'ft' or 'pre', got {head_source!r}")
    wanted = float(cfg.get("heatmap_sparsity", sparsities[len(sparsities) // 2]))
    map_sparsity = min(sparsities, key=lambda s: abs(np.log(s) - np.log(wanted)))  # the nearest level run
    rows, base_rows, regions_for_maps, timings = [], [], {}, []
    for task in tasks:
        for seed in seeds:
            setup = C.prepare(cfg, run, task, seed)
            t0 = time.perf_counter()
            learned, summary = C.learned_regions(setup, loc, run.cache, progress=bool(cfg.get("progress", False)))
            t_loc = time.perf_counter() - t0
            t0 = time.perf_counter()
            sizes = [len(learned[Budget.parse(sp)]) for sp in sparsities]  # FISH regions of the learned sizes
            fish = get_localizer("fish").regions(setup.pre, setup.ft, setup.data, sizes,
                                                 {"fisher": fcfg, "head": head_source})
            t_fish = time.perf_counter() - t0
            ft_m, _ = evaluate(setup.ft, setup.test)
            head_only = Graft.from_models(setup.pre, setup.ft, Region.empty(_universe(setup.pre, learned)))
            ho_m, _ = evaluate_graft(setup.pre, head_only, setup.test)
            base_rows.append({"task": setup.task, "seed": seed, "ft_score": ft_m["score"], "ft_ece": ft_m["ece"],
                              "head_only_score": ho_m["score"]})
            for sp in sparsities:
                region = learned[Budget.parse(sp)]
                n = len(region)
                fish_r = fish[Budget.parse(n)]
                rand_r = get_localizer("random").region(setup.pre, setup.ft, None, n, {"seed": seed})
                row = {"task": setup.task, "seed": seed, "sparsity": sp, "learned_size": n, "fish_size": len(fish_r),
                       "random_size": len(rand_r), "iou_fish_learned": fish_r.iou(region),
                       "iou_random_learned": rand_r.iou(region)}
                for name, r in (("learned", region), ("fish", fish_r), ("random", rand_r)):
                    m, _ = evaluate_graft(setup.pre, Graft.from_models(setup.pre, setup.ft, r), setup.test)
                    row[f"{name}_score"], row[f"{name}_ece"] = m["score"], m["ece"]
                rows.append(row)
                if task in (cfg.get("heatmap_tasks") or tasks) and seed == seeds[0] and sp == map_sparsity:
                    regions_for_maps[f"{setup.task} learned"] = (setup.pre, region)
                    regions_for_maps[f"{setup.task} FISH"] = (setup.pre, fish_r)
            timings.append({"task": setup.task, "seed": seed, "localize_seconds": round(t_loc, 1),
                            "fisher_seconds": round(t_fish, 1), "finetune_seconds": round(setup.ft_seconds, 1)})
    agg = C.aggregate(rows, ["task", "sparsity"], METRICS)
    summary_rows = C.summary_rows(agg, METRICS)
    run.csv("fish.csv", rows)
    run.csv("summary.csv", summary_rows)
    maps = {}
    if regions_for_maps:
        maps = plot_heatmaps(regions_for_maps, run.file("heatmap.png"))
        run.json("heatmap.json", maps)
    tracking = tracking_rows(cfg, run, loc) if cfg.get("tracking") else []
    if tracking:
        run.csv("tracking.csv", tracking)
        plot_tracking(tracking, run.file("tracking.png"))
    run.report(report(cfg, seeds, agg, base_rows, maps, tracking, timings))
    return {"rows": rows, "summary": summary_rows, "baselines": base_rows, "tracking": tracking, "timings": timings}


def _universe(pre, regions: dict[str, Region]) -> dict:
    return next(iter(regions.values())).shapes


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
def tracking_rows(cfg: dict, run: RunDir, loc) -> list[dict]:
    """Fig. 15: a region learned on one checkpoint, grafted with the values of other checkpoints."""
    spec = cfg["tracking"]
    if not isinstance(spec, dict) or "steps" not in spec:
        raise SkillgraftError("recipe field 'tracking': needs 'steps' (checkpoints) and optionally task, seed, "
                              "learn_at, sparsity")
    task = spec.get("task", (cfg.get("tasks") or ["SST-2"])[0])
    seed = int(spec.get("seed", C.seeds_of(cfg)[0]))
    k = int(cfg.get("k", 16))
    ft_cfg = C.finetune_config(cfg)
    data = load_kshot(task, k, seed, cfg.get("data_dir"))
    test = C.sample(data.test, cfg.get("test_limit"), seed=0)
    config = ft_cfg.replace(eval_every=0)
    total = config.resolved_steps(data.task.num_labels, k)
    steps = sorted({int(s) for s in spec["steps"]})
    learn_at = int(spec.get("learn_at", steps[len(steps) // 2]))
    if learn_at not in steps or steps[-1] > total or steps[0] < 1:
        raise SkillgraftError(f"recipe field 'tracking': steps {steps} must lie in 1..{total} (the run's steps) "
                              f"and include learn_at={learn_at}")
    build = dict(mode=cfg.get("mode", "head"), pooling=cfg.get("pooling"),
                 max_length=int(cfg.get("max_length", 128)), head_seed=ft_cfg.seed)
    pre = build_scorer(cfg.get("model"), data.task, **build).eval()
    scorer = build_scorer(cfg.get("model"), data.task, **build)
    snaps = Snapshots(scorer, [s for s in steps if s < total])
    config = config.replace(steps=total)
    finetune(scorer, data.train, None, config, k=k, progress=False, callbacks=[snaps])
    ckpts = {s: snaps.scorer_at(s) for s in snaps.states}
    if total in steps:
        ckpts[total] = scorer
    sparsity = float(spec.get("sparsity", sorted(b.fraction for b in loc.budgets)[len(loc.budgets) // 2]))
    learn_cfg = loc.replace(budgets=[sparsity])
    region = localize(pre, ckpts[learn_at], data.train, data.dev, learn_cfg, progress=False).region
    rows = []
    for s, ck in sorted(ckpts.items()):
        ft_m, _ = evaluate(ck, test)
        g_m, _ = evaluate_graft(pre, Graft.from_models(pre, ck, region), test)
        rows.append({"task": data.task.name, "seed": seed, "step": s, "learned_at": learn_at, "sparsity": sparsity,
                     "region_size": len(region), "checkpoint_score": ft_m["score"], "graft_score": g_m["score"],
                     "graft_ece": g_m["ece"]})
    return rows


def plot_tracking(rows: list[dict], path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    steps = [r["step"] for r in rows]
    ax.plot(steps, [100 * r["checkpoint_score"] for r in rows], "o-", label="checkpoint (fine-tuned)")
    ax.plot(steps, [100 * r["graft_score"] for r in rows], "s--", label=f"graft: region from step {rows[0]['learned_at']}")
    ax.axvline(rows[0]["learned_at"], color="gray", lw=0.8, ls=":")
    ax.set_xlabel("fine-tuning step of the checkpoint")
    ax.set_ylabel("test score (%)")
    ax.set_title(f"{rows[0]['task']}: tracking one region across checkpoints", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------------- report
def report(cfg: dict, seeds: list[int], agg: list[dict], base_rows: list[dict], maps: dict, tracking: list[dict],
           timings: list[dict]) -> str:
    fcfg = fisher_config(cfg)
    lines = ["# FISH vs learned vs random regions (Table 8) and region analyses (Figs. 9, 10, 15)", "",
             C.sizes_line(cfg, seeds, f"FISH = top {fcfg.kind} Fisher of θ_pre over "
                                      f"{fcfg.n_examples or 'all'} training examples "
                                      f"(head: {cfg.get('fish_head', 'ft')})"), "",
             "All three regions of a row have exactly the same size (the learned region's, an exact budget by "
             "top-k of γ). Grafted model = θ_pre + γ⊙(θ_ft − θ_pre) with the fine-tuned head; score = accuracy "
             "(F1 for MRPC/QQP) in %, mean (std) over seeds. IoU = |γ_FISH ∩ γ| / |γ_FISH ∪ γ|.", ""]
    rows = [[g["task"], f"{g['sparsity']:g}", C.pct(g["iou_fish_learned"], 2), C.pct(g["learned_score"]),
             C.pct(g["fish_score"]), C.pct(g["random_score"]), C.pct(g["learned_ece"]), C.pct(g["fish_ece"]),
             C.pct(g["random_ece"]), g["n_seeds"]] for g in agg]
    lines += [C.md_table(["task", "sparsity", "IoU FISH/learned %", "learned graft", "FISH graft", "random graft",
                          "ECE learned", "ECE FISH", "ECE random", "seeds"], rows), ""]
    base = C.aggregate(base_rows, ["task"], ["ft_score", "ft_ece", "head_only_score"])
    lines += ["Baselines: " + "; ".join(f"{g['task']}: fine-tuned {C.pct(g['ft_score'])} (ECE {C.pct(g['ft_ece'])}), "
                                        f"head only {C.pct(g['head_only_score'])}" for g in base), ""]
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
                  C.md_table(["step", "checkpoint score %", "graft score %", "graft ECE %"],
                             [[r["step"], f"{100 * r['checkpoint_score']:.1f}", f"{100 * r['graft_score']:.1f}",
                               f"{100 * r['graft_ece']:.1f}"] for r in tracking]), ""]
    lines += ["## Time", "", C.md_table(["task", "seed", "fine-tuning s", "localize s", "Fisher s"],
                                         [[t["task"], t["seed"], t["finetune_seconds"], t["localize_seconds"],
                                           t["fisher_seconds"]] for t in timings]), "",
              "Files: fish.csv, summary.csv, heatmap.png/json, tracking.csv, tracking.png."]
    return "\n".join(lines) + "\n"
