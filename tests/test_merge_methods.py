"""The merge report reads what it says of a method from the registry (issue 47): a throwaway registered method
shows up in merge.json, report.md and the grids with no edit to the report, and ``skillgraft merge`` runs with the
stitch and mergekit switched off (no merged model written; each task's graft and the comparison are)."""

from __future__ import annotations

import json

from userland import cli, fake_mergekit, merge_args

from skillgraft.merge import MERGE_METHODS, register_merge_method
from skillgraft.merge.base import MergeMethod, Scored


class Halves(MergeMethod):
    """Each task's own graft at half strength, as one grid point chosen on dev (a stand-in for a new method)."""

    summary = "each task's graft at half strength (a throwaway method)"
    grid_note = "halves: one point"
    legend = "*halves*: θ_pre + ½ γ_t ⊙ τ_t per task."

    def rows(self, bench, options, ft, work):
        from skillgraft.graft.merge import scaled

        use = bench.grafted(lambda n: scaled(bench.grafts[n], 0.5, bench.base))
        s = Scored("halves", "λ=0.5", info={"chosen_on_dev": True})
        s.dev, s.test = bench.score(use, "dev"), bench.score(use, "test")
        return [s]


def test_a_registered_method_appears_in_the_report_and_the_stitch_can_be_off(classifiers, tmp_path):  # noqa: F811
    register_merge_method("halves")(Halves)
    try:
        out = tmp_path / "m"
        cli(*merge_args(classifiers, out, "--localizer", "movement", "--budget", "0.05", "--no-stitch", "--mergekit",
                        ""), obj={"mergekit_runner": fake_mergekit})
    finally:
        MERGE_METHODS.pop("halves")
    s = json.loads((out / "merge.json").read_text())
    methods = {r["method"] for r in s["rows"]}
    assert "halves" in methods and "stitch" not in methods and not any(m.startswith("mergekit") for m in methods)
    assert s["methods"]["halves"] == Halves.summary and "stitch" not in s["methods"]
    h = s["headline"]
    assert h["written"] is None and h["best_halves"] == "halves (λ=0.5)" and h["best_halves_mean_normalized"] > 0
    assert "stitch_scale" not in h and "best_mergekit" not in h  # neither writes one model: none is written
    report = (out / "report.md").read_text()
    assert "**halves** — each task's graft at half strength" in report and "halves: one point" in report
    assert "- halves (each task's graft at half strength" in report and Halves.legend in report
    assert "no merged model is written" in report.lower()
    assert not (out / "tasks").exists() and not (out / "model").exists()
    assert {p.name for p in (out / "grafts").iterdir()} == {"sentiment", "topic"}
    assert "switched off" in (out / "README.md").read_text()
