"""Parameter-efficient baselines at matched size (paper Tables 6, 7): grafts vs BitFit, LoRA and IA³.

Every method starts from θ_pre with the same new head and trains with its own usual optimizer settings
(AdamW); LoRA (ranks from ``lora_ranks``) and IA³ come from the ``peft`` library (peft has no sequential
bottleneck adapter — Houlsby/Pfeiffer — so IA³ is the adapter baseline; see
:mod:`skillgraft.train.adapters`). Grafts are learned on the SGD fine-tuned model at budgets chosen to
bracket those parameter counts. Evaluated like the OOD recipe: ID test + mapped OOD sets, accuracy and ECE.
"""

from __future__ import annotations

from skillgraft.errors import SkillgraftError
from skillgraft.recipes import common as C
from skillgraft.recipes.base import RunDir, recipe
from skillgraft.recipes.ood import paper_ood_lines, run_transfers
from skillgraft.recipes.paper_numbers import TABLE6_4096
from skillgraft.train.adapters import AdapterConfig


def peft_variants(setup: C.Setup, cfg: dict, run: RunDir) -> list[C.Variant]:
    loc = C.localize_config(cfg)
    regions, summary = C.learned_regions(setup, loc, run.cache, progress=bool(cfg.get("progress", False)))
    variants = C.base_variants(setup) + C.graft_variants(setup, regions, summary)
    if cfg.get("bitfit", True):
        spec = (cfg["bitfit"] if isinstance(cfg.get("bitfit"), dict) else {}).get("finetune")
        variants.append(C.bitfit_variant(setup, C.dataclass_from(C.FinetuneConfig, spec, "recipe field 'bitfit'",
                                                                 C.BITFIT_DEFAULTS), run.cache))
    ranks = cfg.get("lora_ranks", [1, 2, 8])
    if not isinstance(ranks, list) or not all(isinstance(r, int) and r >= 1 for r in ranks):
        raise SkillgraftError(f"recipe field 'lora_ranks' must be a list of integers ≥ 1, got {ranks!r}")
    lora_ft = C.dataclass_from(C.FinetuneConfig, cfg.get("lora_finetune"), "recipe field 'lora_finetune'",
                               C.ADAPTER_DEFAULTS)
    for r in ranks:
        adapter = C.dataclass_from(AdapterConfig, {**(cfg.get("lora") or {}), "method": "lora", "r": r},
                                   "recipe field 'lora'")
        variants.append(C.adapter_variant(setup, adapter, lora_ft, run.cache))
    if cfg.get("ia3", True):
        ia3_ft = C.dataclass_from(C.FinetuneConfig, cfg.get("ia3_finetune"), "recipe field 'ia3_finetune'",
                                  {**C.ADAPTER_DEFAULTS, "lr": 3e-3})
        variants.append(C.adapter_variant(setup, AdapterConfig(method="ia3"), ia3_ft, run.cache))
    return variants


def paper_lines(src: str, targets: list[str]) -> list[str]:
    out = paper_ood_lines(src, targets)
    rows = [f"  - {m}: acc {v[src][0]}, ECE {v[src][1]}" for m, v in TABLE6_4096.items() if src in v]
    if rows:
        out += [f"- Table 6 (4096-shot) {src} accuracy / ECE:", *rows, ""]
    return out


@recipe("peft-baselines")
def peft_baselines(cfg: dict, run: RunDir) -> dict:
    return run_transfers(cfg, run, peft_variants,
                         title="Parameter-efficient baselines vs grafting at matched size (paper Tables 6, 7)",
                         paper_lines=paper_lines)
