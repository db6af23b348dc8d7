"""Out-of-distribution recipe (paper Fig. 7, Tables 3 and 7): train on one task, evaluate zero-shot on others.

Each transfer names a source task and target tasks; a target's labels are mapped into the source's label
space by NAME (``labels: {target_label: source_label | null}``; null drops that label). A pair whose labels
cannot be mapped is refused when the recipe is validated, before any work. Models: pre-trained, head only,
FT, learned grafts at the configured budgets, optionally graft re-training and BitFit (Table 3). Reports ID
and OOD accuracy and ECE, mean (std) over data seeds; OOD sets come from :mod:`skillgraft.pipeline.ood`,
the loop and report from :mod:`skillgraft.pipeline.transfers`.
"""

from __future__ import annotations

from skillgraft.pipeline.regions import model_variants
from skillgraft.pipeline.report import RunDir
from skillgraft.pipeline.transfers import paper_ood_lines, run_transfers
from skillgraft.recipes.base import ExperimentSpec, GraftVariantsMixin, TransfersMixin, recipe


class OodSpec(ExperimentSpec, GraftVariantsMixin, TransfersMixin):  # last base validates first: label maps
    """Grafts vs FT out of distribution (paper Fig. 7, Tables 3, 7)."""


@recipe("ood", OodSpec)
def ood(spec: OodSpec, run: RunDir) -> dict:
    return run_transfers(spec, run, lambda member, spec, run: model_variants(member, spec, run)[0],
                         title="Out-of-distribution: fine-tuning vs grafting (paper Fig. 7, Tables 3, 7)",
                         paper_lines=paper_ood_lines)
