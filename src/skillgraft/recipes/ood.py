"""Out-of-distribution recipe (paper Fig. 7, Tables 3 and 7): train on one task, evaluate zero-shot on others.

Each transfer names a source task and target tasks; a target's labels are mapped into the source's label
space by NAME (``labels: {target_label: source_label | null}``; null drops that label). A pair whose labels
cannot be mapped is refused when the recipe is validated, before any work. Models: pre-trained, head only,
FT, learned grafts at the configured budgets, optionally graft re-training and BitFit (Table 3). Reports ID
and OOD accuracy and ECE, mean (std) over data seeds; OOD sets come from :mod:`skillgraft.pipeline.ood`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from pydantic import Field, field_validator, model_validator

from skillgraft.errors import SkillgraftError
from skillgraft.pipeline.ood import TransferSpec, ood_examples, with_limits
from skillgraft.pipeline.report import RunDir, aggregate, md_table, pct, summary_rows
from skillgraft.pipeline.variants import compare
from skillgraft.recipes.base import ExperimentSpec, recipe
from skillgraft.recipes.calibration import GraftVariantsMixin, model_variants, rows_of, setting_line
from skillgraft.recipes.paper_numbers import PAPER_NOTE, TABLE3_4096, TABLE7_4096, TABLE7_COLUMNS
from skillgraft.spec import COUNT_MAX, Seed, Spec

METRICS = ["score", "accuracy", "ece", "agreement"]


class TransfersMixin(Spec):
    """Source → OOD target transfers, each over data seeds (label maps checked before any work)."""

    seeds: list[Seed] = Field(default_factory=lambda: [13], min_length=1,
                             description="data seeds → mean (std); the paper uses [13, 21, 42, 87, 100]")
    ood_limit: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "each OOD set: seeded sample of N examples after label mapping (not given: test_limit; null: all); a "
        "target's own `limit` wins"))
    transfers: list[TransferSpec] = Field(min_length=1, description=(
        "[{source: TASK, targets: [{task, labels: {target label: source label | null}}]}]; a bare target "
        "name means identical label names"))

    @field_validator("seeds", mode="before")
    @classmethod
    def _one_seed(cls, v):
        return [v] if isinstance(v, int) else v

    @model_validator(mode="before")
    @classmethod
    def _limits(cls, values):
        """``ood_limit`` defaults to ``test_limit``; each target's ``limit`` to ``ood_limit``."""
        if not isinstance(values, dict):
            return values
        limit = values.get("ood_limit", values.get("test_limit"))
        transfers = with_limits(values.get("transfers"), limit)
        return {**values, "ood_limit": limit, **({"transfers": transfers} if transfers is not None else {})}

    @model_validator(mode="after")
    def _mappable(self):
        for i, transfer in enumerate(self.transfers):
            try:
                transfer.check(f"transfers[{i}]")
            except SkillgraftError as e:
                raise ValueError(str(e)) from None
        return self


class OodSpec(ExperimentSpec, GraftVariantsMixin, TransfersMixin):  # last base validates first: label maps
    """Grafts vs FT out of distribution (paper Fig. 7, Tables 3, 7)."""


def transfer_setups(spec, run: RunDir) -> Iterator[tuple]:
    """Per source × seed of ``spec.transfers``: ``(seed, setup, sets, t0)``, ``sets`` the ID test set and
    the OOD sets by name, ``t0`` the time before the setup."""
    for i, t in enumerate(spec.transfers):
        ood_sets = {tg.task: ood_examples(t.source, tg, spec.data_dir, f"transfers[{i}].targets[{j}]")
                    for j, tg in enumerate(t.targets)}
        for seed in spec.seeds:
            t0 = time.perf_counter()
            setup = spec.setup(run, t.source, seed)
            yield seed, setup, {f"{setup.task} (ID)": setup.test, **ood_sets}, t0


def run_transfers(spec, run: RunDir, variants_fn: Callable, *, title: str, paper_lines: Callable) -> dict:
    """Shared loop of the OOD and PEFT recipes: per source × seed, every variant on ID test + OOD sets."""
    rows, timings = [], []
    for seed, setup, sets, t0 in transfer_setups(spec, run):
        variants = variants_fn(setup, spec, run)
        found = []
        for set_name, examples in sets.items():
            block, _ = compare(setup, variants, examples, set_name)
            found += rows_of(setup, block, source=setup.task, eval=set_name)
        order = {v.name: n for n, v in enumerate(variants)}
        rows += sorted(found, key=lambda r: order[r["model"]])  # stable: sets in order within a model
        timings.append({"source": setup.task, "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
                        "n_eval": {k: len(v) for k, v in sets.items()}})
    columns = METRICS + ["params", "params_pct"]
    agg = aggregate(rows, ["source", "model", "kind", "eval"], columns)
    summary = summary_rows(agg, columns)
    run.csv("metrics.csv", rows)
    run.csv("summary.csv", summary)
    run.report(_report(spec, agg, timings, title, paper_lines))
    return {"rows": rows, "summary": summary, "timings": timings}


def _report(spec, agg, timings, title, paper_lines) -> str:
    lines = [f"# {title}", "", setting_line(spec, f"OOD subsets of {spec.ood_limit or 'all'} examples (seeded "
                                                  "sample, after label mapping)"), "",
             "Score = accuracy (F1 for MRPC/QQP) in %, mean (std) over data seeds; ECE in %. Params = body "
             "parameters changed or trained, % of all model parameters (the new head is carried by every "
             "non-pre model and not counted). Label mappings (target label → source label; null = dropped):", ""]
    for t in spec.transfers:
        for tg in t.targets:
            lines.append(f"- {t.source} → {tg.task}: `{tg.labels or 'identity'}`")
    lines.append("")
    for t in spec.transfers:
        src = t.source
        evals = [f"{src} (ID)"] + [tg.task for tg in t.targets]
        models = []
        for g in agg:
            if g["source"] == src and g["model"] not in models:
                models.append(g["model"])
        cell = {(g["model"], g["eval"]): g for g in agg if g["source"] == src}
        header = ["model", "params %"] + [f"{e} acc" for e in evals] + [f"{e} ECE" for e in evals]
        body = []
        for m in models:
            first = cell[(m, evals[0])]
            body.append([m, f"{first['params_pct'][0]:.4f}"] + [pct(cell[(m, e)]["score"]) for e in evals]
                        + [pct(cell[(m, e)]["ece"]) for e in evals])
        lines += [f"## Source: {src}", "", md_table(header, body), ""]
        ft = {e: cell[("fine-tuned", e)]["score"] for e in evals[1:] if ("fine-tuned", e) in cell}
        gains = []
        for m in models:
            if cell[(m, evals[0])]["kind"] in ("ft", "pre"):
                continue
            for e in evals[1:]:
                if e in ft and ft[e]:
                    d = [a - b for a, b in zip(cell[(m, e)]["score"], ft[e])]
                    gains.append(f"{m} → {e}: {pct(d)} points vs FT")
        if gains:
            lines += ["OOD difference to FT (same seeds): " + "; ".join(gains) + ".", ""]
        lines += paper_lines(src, [tg.task for tg in t.targets])
    lines += [PAPER_NOTE, "", "## Time", "", md_table(
        ["source", "seed", "seconds (incl. cached steps)", "eval set sizes"],
        [[x["source"], x["seed"], x["seconds"], x["n_eval"]] for x in timings]), ""]
    return "\n".join(lines)


def paper_ood_lines(src: str, targets: list[str]) -> list[str]:
    out = []
    for tgt in targets:
        if (src, tgt) in TABLE3_4096:
            g, r, b = TABLE3_4096[(src, tgt)]
            out.append(f"- Table 3 (4096-shot) {src} → {tgt}: grafting {g}, graft re-training {r}, BitFit {b}.")
    cols = [i for i, (s, t) in enumerate(TABLE7_COLUMNS) if s == src and (t == src or t in targets)]
    if cols:
        out.append(f"- Table 7 (4096-shot), columns {[TABLE7_COLUMNS[i][1] for i in cols]}:")
        out += [f"  - {m}: " + ", ".join(vals[i] for i in cols) for m, vals in TABLE7_4096.items()
                if m.startswith("Grafting") or m.startswith("LoRA")]
    return (["Paper's numbers:", "", *out, ""]) if out else []


@recipe("ood", OodSpec)
def ood(spec: OodSpec, run: RunDir) -> dict:
    return run_transfers(spec, run, lambda setup, spec, run: model_variants(setup, spec, run)[0],
                         title="Out-of-distribution: fine-tuning vs grafting (paper Fig. 7, Tables 3, 7)",
                         paper_lines=paper_ood_lines)
