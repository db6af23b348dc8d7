"""A long run's plan and estimated time before its work (issue 80, skillgraft.eta): the localizer and fine-tuning
say their rows, steps and scoring before step 1, and their estimated time from the timed second micro-batch (the
first warms up)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.eta import WarmTimer, duration, estimate_line, estimate_seconds, forward_equivalents, plan_line


def test_the_plan_and_the_estimate_in_words():
    assert [duration(s) for s in (4.26, 43, 430, 4080)] == ["4.3 s", "43 s", "7 min 10 s", "1 h 08 min"]
    assert estimate_seconds(2.0, 100, 30) == 2.0 * 130 and estimate_seconds(2.0, 100, scoring_seconds=50) == 250
    assert forward_equivalents(64, 16) == 64 / 16 / 3  # a forward ≈ a third of a forward + backward
    assert plan_line("localize", rows=64, steps=100, batch=16, micro_batches=2, scored=11, score_rows=32) == \
        "localize: 100 steps of 16 of 64 rows (2 micro-batches each), scored 11 times on 32 rows"
    assert estimate_line("localize", 40.8, 100) == ("localize: about 1 h 08 min (estimated: second micro-batch 40.80 s "
                                                    "× 100 training micro-batches)")
    assert estimate_line("localize", 9.7, 10, scoring_seconds=10 * 44.1, scorings=10) == (
        "localize: about 8 min 58 s (estimated: second micro-batch 9.70 s × 10 training micro-batches + 10 more "
        "scorings at 44.1 s, the first one's time)")


def test_the_estimate_is_timed_on_the_second_micro_batch_not_the_first():
    """The first micro-batch pays the run's one-time work (Gemma-3-270M fine-tuning, 2-core CPU: 2.60 s against
    1.2–1.3 s for every later step): the estimate is said once, from the second; a run of one says none."""
    said = []
    timer = WarmTimer(said.append)
    assert [timer(s) for s in (2.6, 1.25)] == [False, True] and said == [1.25] and not timer.waiting
    lone = WarmTimer(said.append)
    assert lone(2.6) is False and lone.waiting and said == [1.25]


def test_finetune_and_graft_say_their_plan_before_step_1(tiny_bert, toy_data, tmp_path):
    runner = CliRunner()
    ft = runner.invoke(app, [str(a) for a in ("finetune", "--model", tiny_bert, "--task", "SST-2", "--k", 8,
                                              "--steps", 6, "--eval-every", 3, "--data-dir", toy_data,
                                              "--out", tmp_path / "ft")])
    assert ft.exit_code == 0, ft.output
    plan = re.search(r"finetune SST-2: 6 steps of (\d+) of 16 rows \(1 micro-batch each\), scored 2 times on 16 "
                     r"rows", ft.output)
    estimate = re.search(r"finetune SST-2: about [\d.]+ s \(estimated: second micro-batch [\d.]+ s × 6 training "
                         r"micro-batches \+ scoring \(forwards: 1\.3 micro-batch equivalents\)\)", ft.output)
    assert plan and estimate and plan.start() < estimate.start(), ft.output
    g = runner.invoke(app, [str(a) for a in ("graft", "--finetuned", tmp_path / "ft", "--budgets", "0.01",
                                             "--steps", 4, "--eval-every", 2, "--baselines", "",
                                             "--schedule", "fixed",
                                             "--no-lottery-zero", "--data-dir", toy_data, "--out", tmp_path / "g")])
    assert g.exit_code == 0, g.output
    plan = g.output.find("localize: 4 steps of 16 of 16 rows (1 micro-batch each), scored 3 times on 32 rows")
    estimate = g.output.find("localize: about ")
    assert 0 <= plan < estimate, g.output
    # the localizer scores before step 1: its estimate takes that scoring's time for the two to come
    assert re.search(r"× 4 training micro-batches \+ 2 more scorings at [\d.]+ s, the first one's time\)", g.output)


def test_a_fit_schedules_estimate_is_an_upper_bound_that_says_why(trained_run, toy_data, tmp_path):
    """The fit schedule (the learned localizer's default) may stop long before its cap: its estimate says "at most"
    and what stops it sooner, not "about" the cap's time."""
    assert estimate_line("localize", 2.0, 10, cap="it stops sooner") == (
        "localize: at most 20 s (estimated: second micro-batch 2.00 s × 10 training micro-batches); it stops sooner")
    g = CliRunner().invoke(app, [str(a) for a in ("graft", "--finetuned", trained_run, "--budgets", "0.01",
                                                  "--steps", 4, "--eval-every", 2, "--baselines", "",
                                                  "--no-lottery-zero", "--data-dir", toy_data, "--out", tmp_path / "g")])
    assert g.exit_code == 0, g.output
    assert re.search(r"localize: at most [\d.]+ s \(estimated: .*\); the fit schedule stops sooner once every region "
                     r"fits, none gains for 50 steps or none moves in 10", g.output), g.output
    assert "localize: about" not in g.output
