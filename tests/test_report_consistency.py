"""A grafting report agrees with itself and with the README (issue 80, item 6): the figure the README names first
comes before the table; the figures' descriptions say what the plots draw; each figure (parameter counts, the time
per localization step) has one source."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from skillgraft.cli import app


def test_the_report_says_each_figure_once_and_in_the_readmes_order(ft_run, toy_data, tmp_path):
    out = tmp_path / "g"
    r = CliRunner().invoke(app, [str(a) for a in ("graft", "--finetuned", ft_run, "--data-dir", toy_data,
                                                  "--budgets", "1e-2", "--steps", 3, "--baselines", "",
                                                  "--schedule", "fixed",
                                                  "--no-lottery-zero", "--out", out)])
    assert r.exit_code == 0, r.output
    report = (out / "report.md").read_text()
    metrics = json.loads((out / "metrics.json").read_text())
    # README: "its first figure is each graft's share …; then the reliability diagram, and the table"
    assert report.index("![share of FT vs size]") < report.index("![reliability]") < report.index("| model |")
    # the reliability figure is one bar panel per model (evaluate/plots.py): so says its description
    assert "one panel per model" in report and "one curve per model" not in report
    # parameters: one count, split — all = the base model's + the carried head's
    whole, base, head = (int(x.replace(",", "")) for x in re.search(
        r"Parameters: ([\d,]+) = ([\d,]+) in the base model \+ ([\d,]+) in the carried task head", report).groups())
    assert whole == base + head and head == metrics["carried_parameters"] and base == metrics["total_parameters"]
    assert f"graftable (the body): {metrics['graftable_parameters']:,} of the base model's" in report
    # the time per step: the localization's wall time over its steps (what a progress bar counts), the median beside
    loc = metrics["localization"]
    per = re.search(r"([\d.]+) s/step overall \((\d+) s for (\d+) steps, scoring included; a step alone ([\d.]+) s",
                    report)
    assert per, report
    assert per.group(1) == f"{loc['seconds'] / 3:.2f}" and per.group(3) == "3"
    assert per.group(4) == f"{loc['step_seconds']:.2f}"
