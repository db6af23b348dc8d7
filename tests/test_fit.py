"""Issue 74: every learned localization measures its fit — each region's score on the selection rows ÷ FT's there —
and a ``fit`` schedule stops a trajectory by it (target reached, or no gain for ``patience`` steps), within ``steps``."""

import json

import pytest
from localizing import assert_intact, digest, snapshot

from skillgraft.errors import SkillgraftError
from skillgraft.graft import get_localizer
from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.graft.localizers.machinery.base import BudgetScore, ScoredStep
from skillgraft.graft.localizers.machinery.batches import accuracy
from skillgraft.graft.localizers.machinery.fit import Schedule, rising
from skillgraft.graft.selection import Budget

FAST = {"sparsity": 0.01, "steps": 6, "seed": 3, "budgets": [0.005, 0.02], "micro_batch": 8, "lr": 1e9,
        "schedule": "fixed", "eval_every": 1}


@pytest.fixture(scope="module")
def fast_run(pair):
    """(the learned localizer's FAST run on the pair, the model's attributes before it and after it): one run read
    by the tests below that only look at it."""
    pre, ft, data = pair
    attributes = set(pre.__dict__)
    res = get_localizer("learned").run(pre, ft, data, FAST)
    return res, attributes, set(pre.__dict__)


def test_the_fit_share_is_the_regions_score_over_fts_on_the_selection_rows(pair, fast_run):
    pre, ft, data = pair
    res, attributes, after = fast_run
    assert after == attributes  # the run's tokenized rows are the run's own (RunRows), not the model's
    select = list(data.train) + list(data.dev)  # select_on train+dev (the default)
    ft_score = accuracy(ft, select)
    assert res.reference == {"score": ft_score, "of": "fine-tuned"}
    for budget, fit in res.fit.items():
        b = Budget.parse(budget)
        assert fit["ft"] == ft_score and fit["rows"] == len(select)
        assert fit["region"] == res.best_score[b] and fit["share"] == pytest.approx(res.best_score[b] / ft_score)
        assert fit["last_step"] == FAST["steps"]
    summary = res.summary
    assert summary["fit"] == res.fit and summary["reference"] == res.reference
    assert summary["stopped"] == [{"budget": None, "step": FAST["steps"], "why": f"the step cap ({FAST['steps']})"}]


def test_from_files_the_fit_is_measured_against_the_whole_universe_graft_and_nothing_else_changes(pair, fast_run,
                                                                                                tmp_path):
    pre, ft, data = pair
    ft.save_pretrained(tmp_path / "ft")
    before = snapshot(pre)
    loaded, _, _ = fast_run  # θ_ft in memory
    lazy = get_localizer("learned").run(pre, str(tmp_path / "ft"), data, FAST)  # θ_ft read from its files
    assert_intact(pre, before)  # θ_pre + Δ was held for the reference, and given back bit for bit
    assert {b: digest(r) for b, r in lazy.regions.items()} == {b: digest(r) for b, r in loaded.regions.items()}
    assert lazy.best_score == loaded.best_score
    assert lazy.reference["of"] == "graft of the whole universe"
    whole = get_localizer("movement").region(pre, ft, data, 1.0)  # every graftable coordinate, the FT head lent
    from skillgraft.graft import Graft  # noqa: PLC0415

    with Graft.from_models(pre, ft, whole, {}).applied(pre):
        assert lazy.reference["score"] == accuracy(pre, list(data.train) + list(data.dev))
    cand = get_localizer("learned").run(pre, str(tmp_path / "ft"), data, {**FAST, "candidates": 0.1})
    assert cand.reference["of"] == "graft of every candidate"
    assert_intact(pre, before)


def test_a_fit_schedule_stops_when_the_target_is_reached_and_says_why(pair):
    pre, ft, data = pair
    res = get_localizer("learned").run(pre, ft, data, {**FAST, "schedule": "fit", "fit_target": 0.01})
    assert res.stopped == [{"budget": None, "step": 0, "why": "fit share ≥ 0.01 at step 0"}]
    assert res.step_times == [] and res.best_step == {Budget.parse(b): 0 for b in ("0.005", "0.02")}


def test_a_fit_schedule_stops_when_no_budget_improves_for_patience_steps(pair):
    pre, ft, data = pair
    slow = {**FAST, "steps": 12, "lr": 1e7}  # 1e-2 gains at steps 1-3 and 7; 5e-3 never leaves step 0
    fixed = get_localizer("learned").run(pre, ft, data, slow)
    fit = get_localizer("learned").run(pre, ft, data, {**slow, "schedule": "fit", "patience": 3})
    last = fit.stopped[0]["step"]
    best = max(fit.best_step.values())
    assert last == best + 3 < 12 and "no budget improved for 3 steps" in fit.stopped[0]["why"]
    assert len(fit.step_times) == last
    # the same trajectory as the fixed schedule's up to where it stopped
    assert [h.columns() for h in fit.history] == [h.columns() for h in fixed.history][:last + 1]


def test_a_fit_schedule_stops_a_trajectory_whose_regions_never_leave_their_start(pair):
    """Issue 82: on an AdamW fine-tune's small Δ, S does not leave its start (every scored region the same, its score
    too); the trajectory stops after ``still`` steps with the regions it would have kept anyway, and says why. A region
    that changes keeps the trajectory going."""
    pre, ft, data = pair
    idle = {**FAST, "steps": 12, "lr": 1.0, "schedule": "fit"}  # S moves by ~1e-12: no region changes
    full = get_localizer("learned").run(pre, ft, data, {**idle, "still": 0})
    cut = get_localizer("learned").run(pre, ft, data, {**idle, "still": 4})
    assert cut.stopped == [{"budget": None, "step": 4, "why": "no region changed at all in 4 steps from its start "
                                                             "(step 4)"}]
    assert full.stopped[0]["step"] == 12 and len(cut.step_times) == 4
    assert [h.columns() for h in cut.history] == [h.columns() for h in full.history][:5]
    assert {b: digest(r) for b, r in cut.regions.items()} == {b: digest(r) for b, r in full.regions.items()}
    moving = get_localizer("learned").run(pre, ft, data, {**FAST, "steps": 12, "lr": 1e9, "schedule": "fit",
                                                          "still": 2, "patience": 50})
    ious = [v for h in moving.history for k, v in h.columns().items() if k.endswith(":iou_prev")]
    assert min(ious) < 1 and not moving.stopped[0]["why"].startswith("no region changed"), moving.stopped


def test_the_schedule_enters_the_learned_localizers_key_and_reads_back_as_itself():
    """fit is the learned localizer's default since issue 74: both schedules are written (a fit run is never found
    under a fixed run's key, and a stored fixed config does not read back as fit); fit_target and patience only
    with fit. The relaxed localizers keep fixed as their default and their stored keys."""
    from skillgraft.graft.localizers.relaxed import RelaxedOptions

    fixed = LocalizeConfig(schedule="fixed").to_dict()
    assert fixed["schedule"] == "fixed" and fixed["steps"] == 100 and not {"fit_target", "patience", "still"} & set(fixed)
    assert LocalizeConfig(schedule="fixed", patience=7).to_dict() == fixed  # moot while fixed
    default = LocalizeConfig()
    assert default.schedule == "fit" and default.steps == 150 and default.eval_every == 5  # the cap
    fit = default.to_dict()
    assert fit["schedule"] == "fit" and "fit_target" not in fit  # at its default: left out
    assert fit["still"] == 10  # written: it changed where fit runs stop (issue 82), so their keys changed
    for cfg in (fixed, fit):
        assert LocalizeConfig.build(cfg).to_dict() == cfg  # a stored config reads back as itself
    assert LocalizeConfig(schedule="fit", steps=100).key() != LocalizeConfig(schedule="fixed", steps=100).key()
    assert LocalizeConfig(fit_target=0.95).to_dict()["fit_target"] == 0.95
    assert "schedule" not in RelaxedOptions().to_dict() and RelaxedOptions(schedule="fit").to_dict()["schedule"] == "fit"


def test_still_rising_means_the_best_came_in_the_last_fifth_and_beat_everything_before():
    b = Budget.parse("1e-4")
    label = b.label

    def hist(scores):
        return [ScoredStep(step, None, {}, {label: BudgetScore(acc, 1)}) for step, acc in scores]

    assert rising(hist([(0, 0.5), (50, 0.6), (90, 0.62), (100, 0.7)]), b)
    assert not rising(hist([(0, 0.5), (50, 0.7), (90, 0.62), (100, 0.7)]), b)  # tied, not beaten
    assert not rising(hist([(0, 0.5), (50, 0.8), (100, 0.7)]), b)
    assert not rising(hist([(0, 0.5)]), b)


def test_schedule_stop_reads_only_the_history():
    b = Budget.parse("0.01")

    def hist(scores):
        return [ScoredStep(step, None, {}, {b.label: BudgetScore(acc, 1)}) for step, acc in scores]

    s = Schedule("fit", target=0.9, patience=5)
    assert s.stop(hist([(0, 0.5), (1, 0.6)]), [b], 1.0, 1) is None
    assert s.stop(hist([(0, 0.5), (1, 0.95)]), [b], 1.0, 1) == "fit share ≥ 0.9 at step 1"
    assert s.stop(hist([(0, 0.5), (1, 0.6)] + [(i, 0.6) for i in range(2, 7)]), [b], 1.0, 6) is not None
    assert Schedule("fixed").stop(hist([(0, 1.0)]), [b], 1.0, 0) is None
    s = Schedule("fit", target=0.9, patience=50, still=4)
    assert s.stop(hist([(0, 0.5), (3, 0.5)]), [b], 1.0, 3, unchanged_since=0) is None
    assert s.stop(hist([(0, 0.5), (4, 0.5)]), [b], 1.0, 4, unchanged_since=0).startswith("no region changed")
    assert s.stop(hist([(0, 0.5), (4, 0.5)]), [b], 1.0, 4, unchanged_since=None) is None  # one changed


def test_every_graft_report_says_how_each_region_fits_and_carries(trained_run, toy_data, tmp_path):
    from userland import invoke  # noqa: PLC0415

    out = tmp_path / "g"
    r = invoke("graft", "--finetuned", trained_run, "--out", out, "--budgets", "0.001,0.01", "--steps", 30,
               "--schedule", "fit", "--patience", 3, "--baselines", "random", "--no-lottery-zero",
               "--data-dir", toy_data)
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    fit = metrics["fit"]
    rows = {row["model"]: row for row in metrics["rows"]}
    for key in ("0.001", "0.01"):
        b = fit["budgets"][key]
        assert b["share"] == pytest.approx(b["region"] / b["ft"])
        assert b["test_share"] == rows[f"graft {key}"]["share_of_ft"]
        assert b["carry"] == pytest.approx(b["test_share"] / b["share"])
        assert b["stopped_at"] < 30 and "no budget improved for 3 steps" in b["why"]
        assert set(b["apart"]) == {"train", "dev"} and f"dev rows {b['apart']['dev']['region']:.3f}" in " ".join(
            fit["lines"])
    report = (out / "report.md").read_text()
    assert (out / "fit.png").is_file() and "![fit share per scored step](fit.png)" in report
    assert "until fit share 0.99 or 3 steps without gain, at most 30 steps" in report
    for line in fit["lines"]:
        assert line.strip() in report and line.strip() in " ".join(r.output.split())


@pytest.mark.parametrize("candidates", [None, 0.1])
def test_init_movement_starts_every_budgets_region_at_the_top_delta_of_its_size(pair, candidates):
    """init=movement (S₀ = |Δ| ÷ max |Δ|): at step 0 each budget's region is the movement localizer's region of
    that size — the paper's per-size start from one trajectory — where the default U[0,1) start reads γ_base plus
    a random draw for every budget larger than γ_base."""
    pre, ft, data = pair
    options = {**FAST, "steps": 0, "budgets": [0.01, 0.03, 0.08], "candidates": candidates}
    top = {b: get_localizer("movement").region(pre, ft, data, b) for b in (0.01, 0.03, 0.08)}
    moved = get_localizer("learned").run(pre, ft, data, {**options, "init": "movement"})
    assert {b.fraction: digest(r) for b, r in moved.regions.items()} == {b: digest(r) for b, r in top.items()}
    uniform = get_localizer("learned").run(pre, ft, data, options)
    assert digest(uniform.regions[Budget.parse("0.01")]) == digest(top[0.01])  # γ_base itself
    assert digest(uniform.regions[Budget.parse("0.08")]) != digest(top[0.08])  # γ_base + a random draw
    assert "init" not in LocalizeConfig().to_dict() and LocalizeConfig(init="movement").to_dict()["init"] == "movement"


def test_a_still_rising_line_names_the_lever_its_schedule_leaves():
    """Under the fit schedule only the cap is left to raise; under fixed, the fit schedule too."""
    from skillgraft.verbs.graft_output import fit_section

    fit = {"0.001": {"ft": 0.9, "region": 0.8, "share": 0.8 / 0.9, "rows": 10, "last_step": 50, "rising": True}}
    stopped = [{"budget": None, "step": 50, "why": "the step cap (50)"}]
    for schedule, lever in (("fit", "a higher cap (--steps) would fit more"),
                            ("fixed", "more steps (--steps, or --schedule fit) would fit more")):
        summary = {"fit": fit, "stopped": stopped, "reference": {"score": 0.9, "of": "fine-tuned"},
                   "config": {"schedule": schedule}}
        line = fit_section(summary, {})["lines"][0]
        assert line.endswith(f"stopped at step 50: the step cap (50), still rising: {lever}."), line


@pytest.mark.parametrize("name", ["learned", "straight-through"])
def test_step_rows_train_dev_takes_each_steps_gradient_from_the_dev_rows_too(pair, name):
    """step_rows=train+dev (issue 74, lever 1): each step's gradient comes from every selection row, as if the dev rows
    were training rows; the default (train) is the paper's and stays out of configs and store keys."""
    from types import SimpleNamespace  # noqa: PLC0415

    pre, ft, data = pair
    options = {**FAST, "select_on": "last", "lr": 1e9 if name == "learned" else 1.0}
    if name != "learned":
        options = {k: v for k, v in options.items() if k not in ("sparsity", "lr")} | {"optimizer": "nsgd"}
    both = get_localizer(name).run(pre, ft, data, {**options, "step_rows": "train+dev"})
    merged = SimpleNamespace(train=list(data.train) + list(data.dev), dev=list(data.dev))
    as_train = get_localizer(name).run(pre, ft, merged, options)  # the dev rows handed in as training rows
    train_only = get_localizer(name).run(pre, ft, data, options)
    assert {b: digest(r) for b, r in both.regions.items()} == {b: digest(r) for b, r in as_train.regions.items()}
    assert {b: digest(r) for b, r in both.regions.items()} != {b: digest(r) for b, r in train_only.regions.items()}
    assert both.config["step_rows"] == "train+dev" and "step_rows" not in train_only.config
    with pytest.raises(SkillgraftError, match="step_rows 'train\\+dev' needs dev examples"):
        get_localizer(name).run(pre, ft, list(data.train), {**options, "step_rows": "train+dev"})


def test_the_fit_is_also_measured_on_the_training_rows_and_the_dev_rows_apart(pair, fast_run):
    """The selection rows' halves: FT and each region scored on the training rows and on the dev rows apart, their
    row-weighted mean the fit's own region score (nothing measured twice differently)."""
    from skillgraft.evaluate.predict import predict_probs  # noqa: PLC0415
    from skillgraft.graft import Graft  # noqa: PLC0415

    pre, ft, data = pair
    res, _, _ = fast_run
    train, dev = list(data.train), list(data.dev)
    for budget, region in res.regions.items():
        apart = res.fit[budget.key]["apart"]
        assert apart["train"]["ft"] == accuracy(ft, train) and apart["dev"]["ft"] == accuracy(ft, dev)
        with Graft.from_models(pre, ft, region, {}).applied(pre):
            assert apart["train"]["region"] == accuracy(pre, train) and apart["dev"]["region"] == accuracy(pre, dev)
            mine = predict_probs(pre, dev).argmax(-1)
        assert apart["dev"]["agreement"] == float((mine == predict_probs(ft, dev).argmax(-1)).mean())
        assert "agreement" not in apart["train"]
        mean = sum(apart[k]["region"] * apart[k]["rows"] for k in apart) / (len(train) + len(dev))
        assert (apart["train"]["rows"], apart["dev"]["rows"]) == (len(train), len(dev))
        assert mean == pytest.approx(res.fit[budget.key]["region"])
    assert "apart" not in get_localizer("learned").run(pre, ft, data, {**FAST, "select_on": "train"}).fit["0.005"]


def test_a_fit_gap_on_the_rows_ft_memorized_is_said_in_one_line():
    """The MiniLM demo cell's 1e-4 numbers: FT fits its 128 training rows 1.000 and the dev rows 0.836; the region
    0.867 and 0.828 (0.99 of FT on dev) — the line says the gap is memorization; a region short on dev gets none."""
    from skillgraft.verbs.graft_output import fit_section

    def section(dev_region):
        apart = {"train": {"region": 0.867, "ft": 1.0, "rows": 128}, "dev": {"region": dev_region, "ft": 0.836,
                                                                             "rows": 128}}
        region = (0.867 + dev_region) / 2
        fit = {"0.0001": {"ft": 0.918, "region": region, "share": region / 0.918, "rows": 256, "last_step": 50,
                          "rising": False, "apart": apart}}
        summary = {"fit": fit, "stopped": [], "reference": {"score": 0.918, "of": "fine-tuned"},
                   "config": {"schedule": "fit"}}
        return fit_section(summary, {})["lines"]

    lines = section(0.828)
    assert "; dev rows 0.828 vs FT 0.836, train rows 0.867 vs FT 1.000" in lines[0]
    assert lines[1] == ("  On the 128 dev rows the region keeps 0.99 of FT; the rest of the gap is on the 128 training "
                        "rows, which FT fits 1.000 (memorized) and the region 0.867: not a skill the region lacks on "
                        "held-out rows.")
    assert len(section(0.75)) == 1  # 0.90 of FT on dev: the gap is not only memorization


def test_a_region_that_fits_its_training_rows_but_not_the_dev_rows_is_said_in_one_line():
    """Gemma QNLI/13's 1e-4 numbers at step 73: the region 0.953 of the training rows (FT 1.000) and 0.539 of the dev
    rows (FT 0.633, 0.85 of it) — the line names the lever; at 0.91 of FT on dev no line."""
    from skillgraft.verbs.graft_output import fit_section

    def section(train_region, dev_region):
        apart = {"train": {"region": train_region, "ft": 1.0, "rows": 128},
                 "dev": {"region": dev_region, "ft": 0.633, "rows": 128}}
        region = (train_region + dev_region) / 2
        fit = {"0.0001": {"ft": 0.8165, "region": region, "share": region / 0.8165, "rows": 256, "last_step": 73,
                          "rising": False, "apart": apart}}
        return fit_section({"fit": fit, "stopped": [], "reference": {"score": 0.8165, "of": "fine-tuned"},
                            "config": {"schedule": "fit"}}, {})["lines"]

    lines = section(0.953, 0.539)
    assert lines[1] == ("  The region keeps 0.95 of FT on the 128 training rows its gradient comes from and 0.85 on the "
                        "128 dev rows: it fits the rows it is stepped on more than it carries. Rows FT was not trained "
                        "on in each step (--step-rows train+dev, or more training rows) are the lever to try.")
    assert len(section(0.953, 0.576)) == 1  # 0.91 of FT on the dev rows
    assert len(section(0.9, 0.539)) == 1    # 0.90 of FT on the training rows: not fitted there either


def test_a_region_at_ft_s_accuracy_on_dev_but_not_its_answers_is_said_in_one_line():
    """Gemma MRPC/13's 1e-4 numbers (bench/RESULTS.md): FT right on 0.586 of the 128 dev pairs, the region on 0.570
    (0.97 of FT) yet giving FT's answer on only 0.625 of them — the line says the score matches, not the behaviour;
    at agreement 0.85, or at 0.85 of FT's accuracy, no such line."""
    from skillgraft.verbs.graft_output import fit_section

    def section(dev_region, agreement):
        apart = {"train": {"region": 0.813, "ft": 0.875, "rows": 128},
                 "dev": {"region": dev_region, "ft": 0.586, "rows": 128, "agreement": agreement}}
        region = (0.813 + dev_region) / 2
        fit = {"0.0001": {"ft": 0.7305, "region": region, "share": region / 0.7305, "rows": 256, "last_step": 150,
                          "rising": True, "apart": apart}}
        return fit_section({"fit": fit, "stopped": [], "reference": {"score": 0.7305, "of": "fine-tuned"},
                            "config": {"schedule": "fit"}}, {})["lines"]

    lines = section(0.570, 0.625)
    assert "; dev rows 0.570 vs FT 0.586 (agreement 0.62), train rows 0.813 vs FT 0.875" in lines[0]
    assert lines[1:] == ["  On the 128 dev rows the region scores 0.97 of FT's accuracy but gives FT's answer on only "
                         "0.62 of them (FT is right on 0.586): it matches FT's score there, not its behaviour, and the "
                         "agreement is what carries to test."]
    assert len(section(0.570, 0.85)) == 1
    assert len(section(0.498, 0.625)) == 1  # 0.85 of FT's accuracy: short of FT anyway, said by the fit share


def test_scoring_gives_back_every_sub_module_s_own_mode(pair):
    """predict_probs on a scorer whose top is in train mode and whose body is in eval mode (a Scorer just built on a
    from_pretrained body) leaves both as they were: ``train(was)`` would switch the body's dropout on."""
    from skillgraft.evaluate.predict import predict_probs  # noqa: PLC0415

    pre, _, data = pair
    before = [(m, m.training) for m in pre.modules()]
    pre.train()
    pre.model.eval()
    mixed = [m.training for m in pre.modules()]
    assert len(set(mixed)) == 2
    try:
        predict_probs(pre, list(data.dev)[:4])
        assert [m.training for m in pre.modules()] == mixed
    finally:
        for m, was in before:
            m.training = was


def test_fit_to_ft_steps_and_selects_toward_ft_s_own_answers(pair, fast_run):
    """fit_to 'ft': every training and dev row carries FT's answer, so FT's score on the selection rows is 1 (it agrees
    with itself, where on the gold labels it is not), and each budget's fit is its region's agreement with FT; the
    model is given back intact and the gold run's store key is unchanged (the option is left out at its default)."""
    from skillgraft.evaluate.predict import predict_probs  # noqa: PLC0415
    from skillgraft.graft import Graft  # noqa: PLC0415

    pre, ft, data = pair
    gold, _, _ = fast_run
    assert gold.reference["score"] < 1
    before = snapshot(pre)
    res = get_localizer("learned").run(pre, ft, data, {**FAST, "fit_to": "ft"})
    assert_intact(pre, before)
    assert res.reference == {"score": 1.0, "of": "its own answers"}
    select = list(data.train) + list(data.dev)
    answers = predict_probs(ft, select).argmax(-1)
    for budget, region in res.regions.items():
        with Graft.from_models(pre, ft, region, {}).applied(pre):
            agreement = float((predict_probs(pre, select).argmax(-1) == answers).mean())
        assert res.fit[budget.key]["region"] == pytest.approx(agreement)
    assert res.config["fit_to"] == "ft" and "fit_to" not in gold.config


def test_fit_to_ft_is_refused_in_one_line_without_ft_loaded(pair, tmp_path):
    pre, ft, data = pair
    ft.save_pretrained(tmp_path / "ft")
    with pytest.raises(SkillgraftError, match="fit_to 'ft' labels the rows by the fine-tuned model's answers: pass it "
                                              "loaded, not as a folder"):
        get_localizer("learned").run(pre, str(tmp_path / "ft"), data, {**FAST, "fit_to": "ft"})
