"""Why a graft claim holds or not on a run (issue 33.6): how far FT moves, where Δ lives, what θ_pre already knows.

Usage: .venv/bin/python bench/gemma_diagnostics.py SPEC [--cache DIR] [--tasks SST-2,mr] [--seeds 13,42]
       [--finetune LABEL] [--fractions 1e-4,1e-3] [--splits dev,test] [--name NAME] [--override JSON] [--threads T]

SPEC: a recipe file (`paper` or `generative`, e.g. bench/fidelity/gemma-table2-a.yaml) or a finished run folder of
one (its config.json). For every (task, seed) of it, θ_pre and θ_ft come from the store (`--cache`, else the
recipe's cache_dir, $SKILLGRAFT_CACHE or runs/cache): a fine-tuning the store lacks is one line, never trained
here. `--finetune LABEL`: one of a Fig. 5 recipe's `finetunes` instead of its `finetune`. Reported per draw:

* **how far FT moves** — ‖Δ‖₂ / ‖θ_pre‖₂ over the body (the graftable universe), per layer and per module type
  (models/families.py), and the share of Σ|Δ| held by the top `fractions` of the body's entries by |Δ|;
* **where Δ lives** — the share of those top-|Δ| entries per layer and per module type, beside the layout of the
  recipe's reference (first) localizer's regions from the regions stage when the store holds them, and their
  overlap with top-|Δ| at the same size (|learned ∩ top| / |learned|);
* **what θ_pre already knows** — θ_pre's and θ_ft's accuracy on the draw's `splits` (zero-shot for θ_pre), the
  probability mass on the label words (causal / generative: Σ_labels p(word | prompt)) and the mean margin (log p of
  the label's word minus the best other's; paper_diagnostics.py's margin).

`--override JSON` lays fields over the recipe's (e.g. another model or data root). Writes
bench/results/gemma_diagnostics[-NAME].json and .md (NAME: the recipe file's stem unless given).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from paper_diagnostics import label_logits, margins  # noqa: E402


def open_spec(path: str, override: dict):
    """(recipe name, validated spec) of a recipe file or a finished run folder."""
    from skillgraft.errors import SkillgraftError
    from skillgraft.untrusted import read_json
    from skillgraft.recipes import RECIPES, load_recipe

    p = Path(path)
    if p.is_dir():
        import skillgraft.recipes  # noqa: F401 - registers the recipes

        cfg = read_json(p / "config.json", what="recipe run config")
        if cfg.get("recipe") not in RECIPES:
            raise SkillgraftError(f"{p / 'config.json'}: not a recipe run (recipe {cfg.get('recipe')!r})")
        entry = RECIPES[cfg["recipe"]]
        spec = entry.spec.build({**cfg, **override}, where=str(p / "config.json"))
    else:
        entry, spec = load_recipe(p, override)
    if entry.name not in ("paper", "generative"):
        raise SkillgraftError(f"{path}: recipe {entry.name!r} has no grafts to diagnose (paper or generative only)")
    return entry.name, spec


def open_member(name: str, spec, store, task: str, seed: int, runtime=None):
    """θ_pre, θ_ft and the draw from the store (refused when the fine-tuning is not there). ``runtime``: the recipe's
    placement (a bf16 recipe's fine-tuning is its own store entry; both models are placed in it)."""
    from skillgraft.errors import SkillgraftError
    from skillgraft.pipeline.report import RunDir
    from skillgraft.pipeline.opening import from_run, stored_run

    if name == "generative":
        from skillgraft.recipes.generative import generative_member

        setup, _ = generative_member(spec, RunDir(Path("."), store), task, seed, {}, stored_only=True)
        return setup
    data = spec.data_spec(task, seed)
    config = spec.finetune
    if getattr(spec, "grid", None) is not None:  # the (batch, lr) chosen on dev (issue 46), read from the store
        from skillgraft.pipeline.grid import stored_choice

        choice = stored_choice(store, spec.model_spec(), data, spec.finetune, spec.grid, runtime)
        config = choice[0] if choice is not None else None
    run = stored_run(store, spec.model_spec(), data, config, runtime) if config is not None else None
    if run is None:
        raise SkillgraftError(f"the store {store.root} holds no fine-tuning of {task} (k {spec.k}, seed {seed}) with "
                              "these settings: run the recipe first")
    return from_run(run, data_dir=spec.data_dir, test_limit=spec.test_limit, runtime=runtime)


def where_of(pre):
    """name → (layer, module type) of the body's tensors: ``block:i`` (else embeddings / other) and families'
    module type."""
    from skillgraft.models.families import module_type
    from skillgraft.models.freezing import param_groups

    groups = param_groups(pre)
    return lambda n: (groups.get(n, "other").replace("block:", ""), module_type(n))


@torch.no_grad()
def movement(pre, ft, fractions: list[float]) -> tuple[dict, dict]:
    """‖Δ‖/‖θ_pre‖ per layer and module type (and overall), the top-|Δ| regions at ``fractions`` and the share of
    Σ|Δ| they hold."""
    from skillgraft.graft import get_localizer
    from skillgraft.pipeline.variants import universe

    names, where = universe(pre), where_of(pre)
    params_pre, params_ft = dict(pre.named_parameters()), dict(ft.named_parameters())
    sums: dict[tuple[str, str], list[float]] = {}
    total_abs = 0.0
    for n in names:
        delta = (params_ft[n].detach().double() - params_pre[n].detach().double())
        for key in (("layer", where(n)[0]), ("module", where(n)[1]), ("all", "body")):
            acc = sums.setdefault(key, [0.0, 0.0, 0])
            acc[0] += float(delta.pow(2).sum())
            acc[1] += float(params_pre[n].detach().double().pow(2).sum())
            acc[2] += delta.numel()
        total_abs += float(delta.abs().sum())
    regions = get_localizer("movement").regions(pre, ft, None, fractions)
    mass = {}
    for budget, region in regions.items():
        held = sum(float((params_ft[n].detach().double() - params_pre[n].detach().double()).reshape(-1)[idx.long()]
                         .abs().sum()) for n, idx in region.indices.items())
        mass[budget.label] = {"entries": len(region), "share_of_abs_delta": held / total_abs if total_abs else 0.0}
    relative = {f"{kind}:{key}": {"rel_norm": (v[0] / v[1]) ** 0.5 if v[1] else None, "params": v[2]}
                for (kind, key), v in sums.items()}
    return {"relative": relative, "top_mass": mass}, regions


def layout(region, where) -> dict:
    """Share of a region's entries per layer and per module type."""
    n = max(1, len(region))
    return {"layer": {k: v / n for k, v in sorted(region.counts_by(lambda x: where(x)[0]).items())},
            "module": {k: v / n for k, v in sorted(region.counts_by(lambda x: where(x)[1]).items())}}


def knowledge(setup, splits: list[str]) -> dict:
    """Accuracy, label-word probability mass and mean margin of θ_pre and θ_ft on the draw's ``splits``."""
    out = {}
    for model_name, scorer in (("pre-trained", setup.pre), ("fine-tuned", setup.ft)):
        for split in splits:
            examples = getattr(setup.data, split)
            if not examples:
                continue
            logits = label_logits(scorer, examples)
            labels = torch.tensor([e.label for e in examples])
            row = {"n": len(examples), "accuracy": float((logits.argmax(-1) == labels).float().mean()),
                   "margin": float(margins(logits, labels).mean())}
            if scorer.mode in ("causal", "generative"):  # log-probabilities: their mass is defined
                row["label_mass"] = float(logits.exp().sum(-1).mean())
                row["gold_prob"] = float(logits.gather(1, labels[:, None]).exp().mean())
            out[f"{model_name}:{split}"] = row
    return out


def diagnose(spec, store, setup, fractions: list[float], splits: list[str]) -> dict:
    from skillgraft.graft import get_localizer
    from skillgraft.pipeline.regions import stored_regions

    where = where_of(setup.pre)
    moved, top = movement(setup.pre, setup.ft, fractions)
    out = {"task": setup.task, "seed": setup.seed, "k": setup.k, "mode": setup.pre.mode, **moved,
           "top_layout": {b.label: layout(r, where) for b, r in top.items()}, "learned": None,
           "knowledge": knowledge(setup, splits)}
    loc = spec.localizers[0]
    found = stored_regions(setup, store, loc.name, loc.resolved(spec.budgets))
    if found is not None:
        learned = {}
        for budget, region in found[0].items():
            same = top.get(budget)
            if same is None and budget.fraction is not None:  # top-|Δ| of the learned region's size
                same = next(iter(get_localizer("movement").regions(setup.pre, setup.ft, None,
                                                                   [budget.fraction]).values()))
            learned[budget.label] = {"localizer": loc.title, "entries": len(region), **layout(region, where),
                                     "overlap_with_top": None if same is None else
                                     len(region.intersection(same)) / max(1, len(region))}
        out["learned"] = learned
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _small(x) -> str:
    """A probability in %, small ones with 2 significant digits (θ_pre's mass on label words may be tiny)."""
    return "-" if x is None else f"{100 * x:.1f}" if x >= 1e-3 else f"{100 * x:.2g}"


def markdown(results: list[dict], command: str) -> str:
    from skillgraft.pipeline.report import md_table

    lines = ["# Diagnostics: how far FT moves, where Δ lives, what θ_pre knows", "", f"`{command}`", ""]
    for r in results:
        lines += [f"## {r['task']} seed {r['seed']} (k {r['k']}, {r['mode']} mode)", ""]
        body = r["relative"]["all:body"]
        shares = ", ".join(f"{b} ({v['entries']:,} entries): {_pct(v['share_of_abs_delta'])}%"
                           for b, v in r["top_mass"].items())
        lines += [f"‖Δ‖/‖θ_pre‖ over the body ({body['params']:,} entries): {body['rel_norm']:.2e}. Share of Σ|Δ| in "
                  f"the top entries by |Δ|: {shares}.", ""]
        budgets = list(r["top_layout"])
        learned = r["learned"] or {}
        for kind in ("layer", "module"):
            keys = sorted({k.split(":", 1)[1] for k in r["relative"] if k.startswith(kind + ":")},
                          key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))
            head = [kind, "‖Δ‖/‖θ_pre‖", *(f"top-|Δ| {b} %" for b in budgets),
                    *(f"{v['localizer']} {b} %" for b, v in learned.items())]
            rows = [[k, f"{r['relative'][f'{kind}:{k}']['rel_norm']:.2e}" if r['relative'][f'{kind}:{k}']['rel_norm']
                     is not None else "-", *(_pct(r["top_layout"][b][kind].get(k, 0.0)) for b in budgets),
                     *(_pct(v[kind].get(k, 0.0)) for v in learned.values())] for k in keys]
            lines += [md_table(head, rows), ""]
        if learned:
            lines += ["Overlap of the learned region with top-|Δ| of the same size: " + ", ".join(
                f"{b}: {_pct(v['overlap_with_top'])}%" for b, v in learned.items()) + ".", ""]
        else:
            lines += ["The store holds no regions of the recipe's reference localizer for this draw.", ""]
        lines += [md_table(["model:split", "n", "accuracy %", "label-word mass %", "p(gold) %", "margin (log p)"],
                           [[k, v["n"], _pct(v["accuracy"]), _small(v.get("label_mass")), _small(v.get("gold_prob")),
                             f"{v['margin']:+.3f}"] for k, v in r["knowledge"].items()]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", help="a paper / generative recipe file, or a finished run folder of one")
    ap.add_argument("--cache", default=None, help="the store (default: the recipe's cache_dir, $SKILLGRAFT_CACHE)")
    ap.add_argument("--tasks", default=None, help="comma-separated subset of the recipe's tasks")
    ap.add_argument("--seeds", default=None, help="comma-separated subset of its data seeds")
    ap.add_argument("--finetune", default=None, help="a label of the recipe's `finetunes` (Fig. 5) instead")
    ap.add_argument("--fractions", default="1e-4,1e-3", help="top-|Δ| sizes, fractions of the body")
    ap.add_argument("--splits", default="dev,test", help="splits of the draw θ_pre / θ_ft are scored on")
    ap.add_argument("--name", default=None, help="output name: bench/results/gemma_diagnostics-NAME.{json,md}")
    ap.add_argument("--out-dir", default=str(HERE / "results"), help="folder of the outputs")
    ap.add_argument("--override", default="{}", help="JSON object of recipe fields laid over the recipe's")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    from skillgraft.data import get_task
    from skillgraft.errors import SkillgraftError
    from skillgraft.io import atomic_path
    from skillgraft.pipeline.store import Store
    from skillgraft.recipes.base import placement_of

    try:
        try:
            override = json.loads(args.override)
            fractions = [float(x) for x in args.fractions.split(",")]
        except ValueError as e:
            raise SkillgraftError(f"--override / --fractions: {e}") from None
        if not isinstance(override, dict) or not all(0 < f <= 1 for f in fractions):
            raise SkillgraftError("--override must be a JSON object and --fractions fractions in (0, 1]")
        splits = args.splits.split(",")
        if set(splits) - {"train", "dev", "test"}:
            raise SkillgraftError(f"--splits {args.splits}: use train, dev, test")
        name, spec = open_spec(args.spec, override)
        if args.finetune is not None:
            if name != "paper" or args.finetune not in spec.finetunes:
                raise SkillgraftError(f"--finetune {args.finetune}: not among the recipe's finetunes "
                                      f"{sorted(getattr(spec, 'finetunes', {}))}")
            spec = spec.replace(finetune=spec.finetune_of(args.finetune).to_dict())
        tasks = [get_task(t).name for t in (args.tasks.split(",") if args.tasks else spec.tasks)]
        known = [get_task(t).name for t in spec.tasks]
        if set(tasks) - set(known):
            raise SkillgraftError(f"--tasks {args.tasks}: not among the recipe's tasks {known}")
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
        store = Store(args.cache if args.cache is not None else spec.cache_dir)
        if args.threads:
            torch.set_num_threads(args.threads)
        results = []
        os.environ["SKILLGRAFT_CACHE"] = str(store.root)  # the bundled Gemma converted into (found in) this store
        runtime = placement_of(spec).resolve()  # the recipe's device and precision: its fine-tunings are keyed by it
        for task in tasks:
            draw_seeds = spec.seeds_of(task) if hasattr(spec, "seeds_of") else spec.seeds
            for seed in seeds or draw_seeds:
                if seed not in draw_seeds:
                    raise SkillgraftError(f"--seeds: {seed} is not a data seed of {task} in the recipe {draw_seeds}")
                t0 = time.perf_counter()
                setup = open_member(name, spec, store, task, seed, runtime)
                r = diagnose(spec, store, setup, fractions, splits)
                r["seconds"] = round(time.perf_counter() - t0, 1)
                results.append(r)
                del setup
    except SkillgraftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stem = args.name or (Path(args.spec).stem if Path(args.spec).is_file() else Path(args.spec).name)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = "bench/gemma_diagnostics.py " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {"command": command, "spec": args.spec, "recipe": name, "fractions": fractions, "draws": results}
    for suffix, text in (("json", json.dumps(payload, indent=1)), ("md", markdown(results, command))):
        with atomic_path(out / f"gemma_diagnostics-{stem}.{suffix}") as tmp:
            tmp.write_text(text + "\n")
    print(f"wrote {out / f'gemma_diagnostics-{stem}'}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
