"""Keep targets: the smallest region of one nested family reaching a share of FT's score on a selection split."""

import math

import pytest
import torch
from outcomes import outcome
from userland import invoke

from skillgraft.errors import SkillgraftError
from skillgraft.graft import Budget, LocalizeConfig, get_localizer, localize, select
from skillgraft.graft.dare import dare_graft
from skillgraft.keep.spec import KeepSpec
from skillgraft.graft.ranking import Ranking
from skillgraft.keep.scoring import graft_scorer, selection_score
from skillgraft.keep.search import search_keep
from skillgraft.graft.selection import region_universe


def test_search_finds_the_smallest_size_on_a_constructed_case():
    calls = []

    def score(k):  # a monotone family: share k/1000, FT scores 0.8
        calls.append(k)
        return 0.8 * min(1.0, k / 1000)

    r95, r99 = search_keep(score, 0.8, [0.95, 0.99], 10_000, start=1, tolerance=1e-6)
    assert (r95.reached, r95.size, r99.size) == (True, 950, 990)
    assert math.isclose(r95.share, 0.95) and r95.density == 0.095
    assert len(calls) == len(set(calls))  # every size scored once, whatever the number of targets
    assert any(p.size == 949 and p.share < 0.95 for p in r95.probes)  # the size below was tried and failed
    # a looser tolerance stops earlier, within that factor of the answer
    (r,) = search_keep(lambda k: min(1.0, k / 1000), 1.0, [0.95], 10_000, tolerance=0.1)
    assert 950 <= r.size <= 950 * 1.1 and max(p.size for p in r.probes if p.share < 0.95) * 1.1 >= r.size


def test_unreachable_target_is_reported_with_the_best_reached():
    (r,) = search_keep(lambda k: 0.5 * min(0.9, k / 100), 0.5, [0.95], 1000)
    assert not r.reached and r.size is None and r.density is None
    assert math.isclose(r.best_share, 0.9) and r.best_size == min(p.size for p in r.probes if p.share >= 0.9 - 1e-12)
    assert max(p.size for p in r.probes) == 1000  # it tried the whole universe
    assert "not reached" in r.describe() and "0.900" in r.describe()


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, "nan", "x", float("inf")])
def test_bad_keep_values_are_one_clear_line(bad):
    with pytest.raises(SkillgraftError) as e:
        KeepSpec.build({"keep": [0.9, bad]}, where="keep")
    assert "\n" not in str(e.value) and "(0, 1]" in str(e.value) or "not a number" in str(e.value)
    with pytest.raises(SkillgraftError):
        search_keep(lambda k: 1.0, 1.0, [bad], 10)


def test_ranking_is_the_shared_selection_nested():
    gen = torch.Generator().manual_seed(0)
    scores = {"a": torch.randint(0, 5, (7, 3), generator=gen).float(), "b": torch.rand(11, generator=gen)}
    shapes = {"a": (7, 3), "c": (4,), "b": (11,)}
    ranking = Ranking.from_scores(scores, shapes)
    assert len(ranking) == 32 and ranking.universe == 36
    previous = None
    for k in (1, 5, 17, 32):
        region = ranking.region(k)
        assert len(region) == k and region == select(scores, Budget.parse(k), shapes)  # same ties as select
        if previous is not None:
            assert len(previous & region) == len(previous)  # nested
        previous = region


def test_keep_on_a_localizer_scores_the_region_it_returns(pair):
    pre, ft, data = pair
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    (r,) = get_localizer("movement").keep(pre, ft, data, [0.9])
    ft_score = selection_score(ft, data.dev)
    again = graft_scorer(pre, ft, data.dev)(r.region)
    if r.reached:
        assert len(r.region) == r.size and again >= 0.9 * ft_score - 1e-9
        assert math.isclose(again / ft_score, r.share)
        assert r.region == get_localizer("movement").region(pre, ft, data, r.size)  # the movement region of that size
    else:
        assert len(r.region) == r.best_size
    assert all(torch.equal(p, before[n]) for n, p in pre.named_parameters())  # θ_pre untouched


def test_learned_keep_from_one_trajectory(pair):
    pre, ft, data = pair
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    result = localize(pre, ft, data.train, data.dev, LocalizeConfig(sparsity=0.01, steps=3, budgets=[0.01]),
                      keep=[0.8, 1.0], progress=False)
    assert result.ranking is not None and len(result.ranking) == result.ranking.universe
    low, full = result.keep
    assert [low.target, full.target] == [0.8, 1.0]
    assert all(torch.equal(p, before[n]) for n, p in pre.named_parameters())
    if low.reached and full.reached:
        assert low.size <= full.size
    assert "keep" in result.summary and result.summary["keep"][0]["probe_count"] == len(low.probes)
    # the learned order starts with γ_base (the top 1% |Δ|) unless the trajectory moved it
    base = get_localizer("movement").region(pre, ft, data, 0.01)
    assert len(result.ranking.region(len(base)) & base) >= 0.5 * len(base)
    with pytest.raises(SkillgraftError, match="selection split"):
        localize(pre, ft, data.train, None, LocalizeConfig(steps=1), keep=0.9, progress=False)


def test_ties_trim_keeps_the_same_share_of_every_tensor(pair):
    pre, ft, data = pair
    region = get_localizer("ties-trim").region(pre, ft, data, 0.1)
    shapes = region_universe(pre)
    for name, shape in shapes.items():
        n = math.prod(shape)
        got = len(region.indices.get(name, []))
        assert abs(got - 0.1 * n) <= 1 + 0.01 * n, (name, got, n)
    assert region != get_localizer("movement").region(pre, ft, data, 0.1)  # not the global top-|Δ|


def test_dare_rescales_delta_on_its_draw(pair):
    pre, ft, data = pair
    region = get_localizer("random").region(pre, ft, data, 0.25)
    graft = dare_graft(pre, ft, region)
    p_pre, p_ft = dict(pre.named_parameters()), dict(ft.named_parameters())
    scale = region.universe_size / len(region)
    name = next(iter(region.indices))
    idx = region.indices[name]
    a, b = p_pre[name].detach().reshape(-1)[idx], p_ft[name].detach().reshape(-1)[idx]
    assert torch.allclose(graft.values[name], a + (b - a) * scale, atol=1e-6)
    assert math.isclose(scale, 4.0, rel_tol=1e-3)


# ---------------------------------------------------------------------------------------------- CLI and report
@pytest.mark.parametrize("bad", ["0", "1.5", "-1", "lots"])
def test_cli_bad_keep_is_one_line_before_any_work(trained_run, tmp_path, bad):

    r = invoke("graft", "--finetuned", trained_run, "--out", tmp_path / "g", "--keep", f"0.9,{bad}")
    assert r.exit_code == 2 and "--keep" in r.output and "(0, 1]" in r.output or "not a number" in r.output
    assert len([x for x in r.output.splitlines() if x.strip()]) == 1 and "Traceback" not in r.output
    assert not (tmp_path / "g").exists()


@pytest.mark.figures("frontier.png")  # frontier.png is a drawn figure (its size); the report's others: placeholders
def test_cli_graft_keep_and_frontier(trained_run, toy_data, tmp_path):
    import csv
    import json


    out = tmp_path / "g"
    # targets the 16 dev rows can confirm (0.9 needs 29 rows FT gets right, and 1 none: refused, test_first_hour.py)
    r = invoke("graft", "--finetuned", trained_run, "--out", out, "--keep", "0.5,0.6", "--steps", 2, "--sparsity", 0.01,
               "--frontier", "--frontier-levels", "0.001,0.1", "--data-dir", toy_data)
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    names = [row["model"] for row in metrics["rows"]]
    assert "keep 0.5" in names and "keep 0.6" in names and not any(n.startswith("graft ") for n in names)  # keep only
    keep = metrics["keep"]
    assert "dev split" in keep["selection"]
    for t in keep["targets"]:
        row = next(x for x in metrics["rows"] if x["model"] == f"keep {t['target']:g}")
        assert row["params"] == (t["size"] if t["reached"] else t["best_size"])
        assert t["test_share"] == row["share_of_ft"] and t["probe_count"] >= 1
        assert (out / "grafts" / f"keep-{t['target']:g}" / "graft.safetensors").is_file()
    assert "keep 0.5:" in r.output and "selection share" in r.output
    text = (out / "report.md").read_text()
    assert "## Keep targets" in text and "## Share of FT vs density" in text
    assert (out / "frontier.png").stat().st_size > 1000
    rows = list(csv.DictReader((out / "frontier.csv").open()))
    methods = {x["method"] for x in rows}
    assert {"learned", "learned order", "top-|Δ| per tensor (TIES trim)", "top-|Δ| global (L&S dataless)",
            "DARE (reference)", "random"} == methods
    assert len(rows) == 6 * 2 and {float(x["density"]) for x in rows} == {0.001, 0.1}
    keeps = list(csv.DictReader((out / "frontier_keep.csv").open()))
    assert {x["method"] for x in keeps} == methods - {"learned"} and {float(x["target"]) for x in keeps} == {0.95, 0.99}
    assert all(x["test_share"] for x in keeps)


def test_keep_on_a_localizer_without_an_order_is_one_line(trained_run, tmp_path):

    r = invoke("graft", "--finetuned", trained_run, "--out", tmp_path / "g", "--localizer", "prune", "--keep", "0.9")
    assert r.exit_code == 2 and "no order" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "g").exists()
    # the learned localizer with a trajectory per budget (the paper's protocol) has no one order either
    r = invoke("graft", "--finetuned", trained_run, "--out", tmp_path / "g", "--per-size", "--keep", "0.9")
    assert r.exit_code == 2 and "--per-size" in r.output and "no one order" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "g").exists()


def test_ranking_in_two_tiers():
    positions = torch.arange(6)
    keys = torch.tensor([0.1, 5.0, 0.3, 9.0, 0.2, 1.0], dtype=torch.float64)
    first = torch.tensor([True, False, True, False, True, False])
    then = torch.tensor([0.0, 1.0, 0.0, 3.0, 0.0, 2.0], dtype=torch.float64)
    r = Ranking.from_keys({"a": (6,)}, positions, keys, first=first, then=then)
    assert r.order.tolist() == [2, 4, 0, 3, 5, 1]  # the first tier by keys, then the rest by `then`


def test_selection_split_holds_out_localization_rows_without_a_dev_split(pair):
    import dataclasses
    from types import SimpleNamespace

    from skillgraft.keep.selection import selection_split

    _, _, data = pair
    member = SimpleNamespace(data=dataclasses.replace(data, dev=[]), test=data.test)
    selection, rest, note = selection_split(member, 0.25)
    assert len(selection) == round(0.25 * len(data.train)) and len(selection) + len(rest.train) == len(data.train)
    assert not {id(e) for e in selection} & {id(e) for e in rest.train} and rest.dev == []
    assert "held-out" in note and selection_split(member, 0.25)[0] == selection  # seeded
    with_dev = selection_split(SimpleNamespace(data=data, test=data.test))
    assert with_dev[0] == list(data.dev) and with_dev[1] is data and "dev split" in with_dev[2]


def test_keep_on_a_checkpoint_pair_holds_out_a_selection_slice(tmp_path):
    """A user's classifier pair and data file (no dev split): the selection split is a held-out slice."""
    import json

    from userland import sentiment_rows, train_classifier, write_rows
    from tiny import build_tiny

    from skillgraft.graft import Graft

    a = build_tiny("bert", tmp_path / "a")
    b = train_classifier(a, tmp_path / "b", sentiment_rows())
    data = write_rows(tmp_path / "reviews.jsonl", sentiment_rows())
    out = tmp_path / "g"
    r = invoke("graft", "--pretrained", a, "--finetuned", b, "--data", data, "--keep", "0.9", "--localizer",
               "movement", "--baselines", "", "--keep-holdout", "0.4", "--out", out)  # 38 rows: 0.9 needs 29
    assert r.exit_code == 0, r.output
    keep = json.loads((out / "metrics.json").read_text())["keep"]
    assert "held-out slice" in keep["selection"] and keep["selection_n"] >= 1
    (t,) = keep["targets"]
    graft = Graft.from_pretrained(out / "grafts" / "keep-0.9")
    assert graft.size == (t["size"] if t["reached"] else t["best_size"]) and graft.carried
    assert graft.metadata.keep == 0.9


def test_frontier_learned_from_one_trajectory_per_sparsity(trained_run, toy_data, tmp_path):
    import csv


    out = tmp_path / "s"
    r = invoke("sweep", "--finetuned", trained_run, "--out", out, "--levels", "0.01", "--steps", 2,
               "--data-dir", toy_data,
               "--frontier", "--frontier-levels", "0.001,0.01,0.1", "--frontier-sparsities", "0.001,0.05",
               "--frontier-peers", "movement", "--frontier-keep", "0.9")
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader((out / "frontier.csv").open()))
    learned = {float(x["density"]): int(x["params"]) for x in rows if x["method"] == "learned"}
    assert learned == {0.001: 18, 0.01: 181, 0.1: 1814}  # 0.001 and 0.01 from the 1e-3 trajectory, 0.1 from 0.05
    assert "frontier top-|Δ| global (L&S dataless) keep 0.9" in r.output
    r = invoke("sweep", "--finetuned", trained_run, "--out", tmp_path / "t", "--frontier", "--frontier-sparsities", "0")
    assert r.exit_code == 2 and "--frontier-sparsities" in r.output


# ---------------------------------------------------------------------------------------------- the stated confidence
def _exact_bootstrap_quantile(graft, ft, q):
    """The q-quantile (inverted CDF) of the share over *every* one of the n^n equally likely resamples."""
    import itertools

    import numpy as np

    from skillgraft.keep.stats.bound import bootstrap_shares

    n = len(ft.pred)
    weights = np.array([np.bincount(draw, minlength=n) for draw in itertools.product(range(n), repeat=n)], float)
    return float(np.quantile(bootstrap_shares(graft, ft, weights), q, method="inverted_cdf"))


def test_bootstrap_bound_on_hand_made_cases():
    from functools import partial

    from skillgraft.keep.stats.bound import share_bound as exact

    share_bound = partial(exact, method="bootstrap")

    ft = outcome([1, 1, 1])
    # graft agrees with FT on every row: every resample's share is 1
    assert share_bound(outcome([1, 1, 1]), ft, 0.9) == 1.0
    # graft wrong on one of 3 rows FT gets right: a resample's share is (draws of the 2 good rows)/3, so
    # P(0) = 1/27, P(1/3) = 6/27, P(2/3) = 12/27, P(1) = 8/27: the 10% quantile is 1/3, the 50% one 2/3
    graft = outcome([1, 1, 0])
    assert share_bound(graft, ft, 0.9) == pytest.approx(1 / 3, abs=1e-12)
    assert share_bound(graft, ft, 0.5) == pytest.approx(2 / 3, abs=1e-12)
    assert share_bound(graft, ft, 0.7) == pytest.approx(_exact_bootstrap_quantile(graft, ft, 0.3), abs=1e-12)
    # FT right on 1 of 2 rows, graft the same: a quarter of resamples draw FT's wrong row twice (FT scores 0:
    # share counted as 0, conservative), the rest have share 1 → the 10% quantile is 0, the 30% one is 1
    same = outcome([1, 0])
    assert share_bound(same, outcome([1, 0]), 0.9) == 0.0 and share_bound(same, outcome([1, 0]), 0.7) == 1.0
    # paired: graft right where FT is wrong and wrong where FT is right, on 4 rows (exact enumeration, 256 draws;
    # the exact CDF: 0.5 → 0.148, 0.667 → 0.242, 0.75 → 0.367, 1 → 0.641, so these quantiles are 0.5, 0.75 and 1,
    # each well inside a step of the CDF, where 2,000 seeded resamples cannot land on the neighbouring value)
    graft, ft = outcome([1, 1, 1, 0]), outcome([1, 1, 0, 1])
    assert [share_bound(graft, ft, c) for c in (0.9, 0.7, 0.5)] == [0.5, 0.75, 1.0]
    for confidence in (0.9, 0.7, 0.5):
        assert share_bound(graft, ft, confidence) == pytest.approx(
            _exact_bootstrap_quantile(graft, ft, 1 - confidence), abs=1e-12)
    # F1 (a pair task's metric): the share of F1 per resample, against the exact enumeration
    labels = [1, 0, 1, 1, 0]
    graft, ft = outcome([1, 1, 0, 1, 0], labels, "f1"), outcome([1, 1, 1, 1, 0], labels, "f1")
    assert share_bound(graft, ft, 0.65) == pytest.approx(_exact_bootstrap_quantile(graft, ft, 0.35), abs=1e-12)
    assert exact(graft, ft, 0.65) == share_bound(graft, ft, 0.65)  # F1 has no exact bound: the bootstrap's


def test_exact_bound_by_hand():
    """The Clopper–Pearson bound of P(graft right | FT right), checked against the binomial tail it inverts."""
    from scipy.stats import binom

    from skillgraft.keep.stats.bound import agreement_bound, share_bound

    # no miss on the 3 rows FT gets right: P(3 of 3 | p) = p³ = 0.1 at the 90% bound → p = 0.1^(1/3), not 1
    assert share_bound(outcome([1, 1, 1]), outcome([1, 1, 1]), 0.9) == pytest.approx(0.1 ** (1 / 3), abs=1e-12)
    # 18 of FT's 20 right rows kept: the bound p solves P(X ≥ 18 | 20, p) = 0.1
    ft = outcome([1] * 20 + [0] * 5)
    graft = outcome([1] * 18 + [0] * 2 + [1] * 5)  # wins on FT's 5 wrong rows: ignored (share ≥ p)
    b = agreement_bound(graft, ft, 0.9)
    assert binom.sf(17, 20, b) == pytest.approx(0.1, abs=1e-9) and b < 18 / 20
    assert share_bound(graft, ft, 0.9) == b and graft.score / ft.score > 1  # a share above 1, a bound below 0.9
    assert agreement_bound(outcome([0, 0, 1]), outcome([1, 1, 0]), 0.9) == 0.0  # FT's right rows all missed
    # the bound never exceeds the agreement and grows with the rows at a fixed agreement
    assert [round(share_bound(outcome([1] * n), outcome([1] * n), 0.9), 4) for n in (10, 100, 1000)] == [
        round(0.1 ** (1 / n), 4) for n in (10, 100, 1000)]
    with pytest.raises(SkillgraftError, match="unknown bound method"):
        share_bound(ft, ft, 0.9, method="normal")




def test_rows_needed_by_hand():
    from skillgraft.keep.stats.bound import rows_needed

    # point 0.98, bound 0.90 on 100 rows, target 0.95: the gap 0.08 must shrink to 0.03 → ×(8/3)² rows
    assert rows_needed(0.98, 0.90, 100, 0.95) == math.ceil(100 * (0.08 / 0.03) ** 2) == 712
    assert rows_needed(0.98, 0.96, 100, 0.95) == 100            # the bound already reaches it
    assert rows_needed(0.93, 0.85, 100, 0.95) is None           # the point estimate is below: no rows confirm it
    assert rows_needed(0.98, None, None, 0.95) is None


def test_rows_needed_exact_by_hand():
    from skillgraft.keep.stats.bound import agreement_bound, rows_needed_exact

    # a graft that never misses FT's right rows: n right rows give the bound 0.1^(1/n); 0.95 needs n ≥ 45
    # (0.1^(1/44) = 0.9490, 0.1^(1/45) = 0.9501); FT is right on half the rows, so 90 selection rows
    ft, graft = outcome([1, 0] * 10), outcome([1, 0] * 10)
    assert rows_needed_exact(graft, ft, 0.95, 0.9) == 90
    big = outcome([1, 0] * 45)
    assert agreement_bound(big, big, 0.9) >= 0.95 > agreement_bound(outcome([1, 0] * 44), outcome([1, 0] * 44), 0.9)
    # the rows at hand already confirm it: their own count, never fewer
    assert rows_needed_exact(big, big, 0.95, 0.9) == 90
    # agreement 0.9 on FT's right rows: no number of rows lifts the bound to 0.95
    assert rows_needed_exact(outcome([1] * 9 + [0]), outcome([1] * 10), 0.95, 0.9) is None


def _noisy_family(n_rows=80, ft_right=64, crossing=(16, 59), truth_below=4096):
    """A family of sizes 1 … 16384 on n_rows selection rows: FT right on ``ft_right``; the graft's correct rows
    grow with the size except one lucky small size (``crossing``: size, correct rows) whose point share crosses
    0.9 by chance; sizes ≥ ``truth_below`` agree with FT."""
    import numpy as np

    ft = np.zeros(n_rows, bool)
    ft[:ft_right] = True

    def at(k):
        if k == crossing[0]:
            right = np.zeros(n_rows, bool)
            right[:crossing[1] - 1] = True
            right[-1] = True  # one row FT gets wrong
            return outcome(right)
        good = ft_right if k >= truth_below else min(ft_right - 1, int(ft_right * 0.5 + 4 * math.log2(k)))
        right = np.zeros(n_rows, bool)
        right[:good] = True
        return outcome(right)

    return at, outcome(ft)


@pytest.mark.parametrize("method", ["exact", "paired"])
def test_bound_search_does_not_stop_at_a_noisy_crossing(method):
    at, ft = _noisy_family()
    (point,) = search_keep(at, ft, [0.9], 16384, start=1, tolerance=0.01)
    assert point.size == 16 and point.confidence is None  # the old rule: the first size whose point share crosses
    (r,) = search_keep(at, ft, [0.9], 16384, start=1, tolerance=0.01, confidence=0.9, method=method)
    assert r.reached and r.size > 16 and r.confidence == 0.9 and r.rows == 80 and r.method == method
    assert r.bound >= 0.9 and r.share >= r.bound
    probed = {p.size: p for p in r.probes}
    ok = (lambda p: p.passed[0.9]) if method == "paired" else (lambda p: p.bound >= 0.9)  # noqa: E731
    assert all(ok(p) for s, p in probed.items() if s >= r.size)  # every larger probed size passes
    assert any(not ok(p) for s, p in probed.items() if s < r.size)     # and the bracket below failed
    assert 16 not in probed or not ok(probed[16])  # the lucky crossing is not taken
    # the two-stage walk: the coarse grid from the top to its first failure, then down by ≤ 1 + tolerance
    coarse = [16384 // 4 ** i for i in range(8)]
    walked = [p.size for p in r.probes]
    first_fail = next(s for s in coarse if not ok(probed[s]))
    assert walked[:coarse.index(first_fail) + 1] == coarse[:coarse.index(first_fail) + 1]
    fine = walked[coarse.index(first_fail) + 1:]
    assert fine == sorted(fine, reverse=True) and all(ok(probed[s]) for s in fine[:-1])
    assert all(a / b <= 1.01 + 1 / b for a, b in zip([first_fail * 4, *fine], fine))  # (sizes round to integers)
    assert r.point_size < r.size and r.rows_needed and r.rows_needed > 80 and "point estimate reaches" in r.note
    assert r.next_size == fine[-1] < r.size and r.next_rows and r.next_rows > 80 and "next smaller size" in r.note
    assert "lower bound" in r.describe() and f"({method})" in r.describe()
    # deterministic: the same bounds again
    (again,) = search_keep(at, ft, [0.9], 16384, start=1, tolerance=0.01, confidence=0.9, method=method)
    assert [p.to_dict() | {"seconds": 0} for p in again.probes] == [p.to_dict() | {"seconds": 0} for p in r.probes]


def test_bound_search_reports_a_selection_split_too_small():
    import numpy as np

    ft = outcome(np.arange(20) < 16)

    def at(k):  # the best region keeps 15 of FT's 16 rows: point share 0.9375 at best, the bound below 0.9
        right = np.zeros(20, bool)
        right[:min(15, 8 + k.bit_length())] = True
        return outcome(right)

    (r,) = search_keep(at, ft, [0.9], 1024, confidence=0.9)
    assert not r.reached and r.size is None and r.bound < 0.9
    assert r.point_size is not None and r.rows_needed > 20
    assert "too few" in r.note and f"{r.rows_needed:,} selection rows" in r.note and "too few" in r.describe()


def test_noisy_selection_split_no_longer_picks_a_size_below_target(pair):
    """Tiny model: on small noisy selection splits, the point search picked sizes keeping < 90% of FT on a large
    fresh sample; the bound's choice keeps ≥ 90% there (64 rows), or says the split is too small (24 rows)."""
    import random

    from tiny import sentence

    from skillgraft.data.loading import Example
    from skillgraft.keep.scoring import graft_outcome, keep_search, selection_outcome

    pre, ft, data = pair
    ranking = get_localizer("movement").ranking(pre, ft, data, None)
    rng = random.Random(7)
    truth = [Example(sentence(rng, i % 2), i % 2) for i in range(600)]
    truth_ft, truth_graft = selection_outcome(ft, truth).score, graft_outcome(pre, ft, truth)

    def point_search(selection):  # the old rule: the first size whose point share crosses 0.9
        score = graft_outcome(pre, ft, selection)
        (point,) = search_keep(lambda k: score(ranking.region(k)), selection_outcome(ft, selection), [0.9],
                               len(ranking), start=1)
        return point

    for seed in (102, 107):  # 64-row selection splits on which the point estimate crosses early
        draw = random.Random(seed)
        selection = [Example(sentence(draw, i % 2), i % 2) for i in range(64)]
        (r,) = keep_search(pre, ft, ranking, selection, [0.9])  # the default: 90% confidence
        assert r.confidence == 0.9 and r.reached and r.bound >= 0.9
        assert truth_graft(ranking.region(r.size)).score >= 0.9 * truth_ft, seed
        point = point_search(selection)
        assert point.reached and point.size < r.size
        assert truth_graft(ranking.region(point.size)).score < 0.9 * truth_ft, seed
    # 24 rows (FT right on ~20): even a graft that never misses gets the bound 0.05^(1/20) < 0.9, so no size is
    # promised; the report says how many rows would do, and the graft offered (the best bound) keeps 0.9
    draw = random.Random(101)
    selection = [Example(sentence(draw, i % 2), i % 2) for i in range(24)]
    (r,) = keep_search(pre, ft, ranking, selection, [0.9])
    assert not r.reached and "too few" in r.note and r.rows_needed and r.rows_needed > 24
    assert truth_graft(r.region).score >= 0.9 * truth_ft
    point = point_search(selection)
    assert point.reached and truth_graft(ranking.region(point.size)).score < 0.9 * truth_ft


def test_cli_keep_data_confidence_and_refusals(trained_run, toy_data, tmp_path):
    import json
    import random

    from tiny import sentence

    rng = random.Random(5)
    rows = [{"text": sentence(rng, i % 2), "label": str(i % 2)} for i in range(60)]
    keep_data = tmp_path / "selection.jsonl"
    keep_data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "g"
    r = invoke("graft", "--finetuned", trained_run, "--out", out, "--keep", "0.9", "--keep-data", keep_data,
               "--keep-confidence", "0.8", "--localizer", "movement", "--baselines", "", "--data-dir", toy_data)
    assert r.exit_code == 0, r.output
    keep = json.loads((out / "metrics.json").read_text())["keep"]
    assert "selection.jsonl (60 rows, --keep-data" in keep["selection"] and keep["selection_n"] == 60
    (t,) = keep["targets"]
    assert t["confidence"] == 0.8 and t["selection_rows"] == 60 and t["bound"] is not None
    if t["reached"]:
        assert t["bound"] >= 0.9
    assert "80% lower bound" in r.output and "lower bound" in (out / "report.md").read_text()
    # a test row in the selection file is refused, in one line
    test_row = (toy_data / "SST-2" / "test.jsonl").read_text().splitlines()[0]
    keep_data.write_text(keep_data.read_text() + test_row + "\n")
    r = invoke("graft", "--finetuned", trained_run, "--out", tmp_path / "h", "--keep", "0.9", "--keep-data", keep_data,
               "--localizer", "movement", "--baselines", "", "--data-dir", toy_data)
    assert r.exit_code != 0 and "1 of its 61 rows are test rows" in r.output
    r = invoke("graft", "--finetuned", trained_run, "--out", tmp_path / "i", "--keep", "0.9", "--keep-confidence", "1")
    assert r.exit_code == 2 and "--keep-confidence" in r.output
