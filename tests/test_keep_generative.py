"""Issue 48: ``--keep-agreement`` on open-ended generative data — per row, the share of completion positions whose top
(greedy, teacher-forced) next token is FT's; the betting bound of the mean of those per-row shares (docs/keep.md)."""

import json
import math

import numpy as np
import pytest
import torch

from skillgraft.data.loading import Example
from skillgraft.keep.stats.bound import Outcome, betting_bound, betting_test, rows_needed_betting
from skillgraft.keep.stats.agreement import token_agreement
from skillgraft.keep.spec import KeepSpec
from skillgraft.graft.ranking import Ranking
from skillgraft.keep.scoring import graft_outcome, keep_search, selection_outcome
from skillgraft.keep.search import search_keep


@pytest.fixture(scope="module")
def gen_pair(tmp_path_factory):
    """(pre, ft, rows, folders): a tiny random Llama as an open-ended prompt→completion scorer and a copy whose
    weights are perturbed (the "fine-tuned" model), both saved."""
    from tiny import build_tiny

    from skillgraft.data.user import GenerativeTask
    from skillgraft.models import build_scorer
    from skillgraft.models.anatomy import graftable_names

    root = tmp_path_factory.mktemp("gen-keep")
    a = build_tiny("llama", root / "pre", layers=1)
    task = GenerativeTask.make("g")  # no closed set of completions: open-ended
    pre = build_scorer(str(a), task, "generative")
    ft = build_scorer(str(a), task, "generative")
    gen = torch.Generator().manual_seed(0)
    params = dict(ft.named_parameters())
    with torch.no_grad():
        for name in graftable_names(ft):  # the universe a graft covers
            p = params[name]
            p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.std().clamp(min=1e-3))
    b = root / "ft"
    ft.model.save_pretrained(b)
    ft.tokenizer.save_pretrained(b)
    rows = [Example(f"item {i}: the film was", 0, f" fine number {i}") for i in range(40)]
    return pre, ft.eval(), rows, (a, b)


def _ranking(pre, ft) -> Ranking:
    from skillgraft.models.anatomy import graftable_names

    names = graftable_names(pre)
    pre_p, ft_p = dict(pre.named_parameters()), dict(ft.named_parameters())
    return Ranking.from_scores({n: (ft_p[n] - pre_p[n]).abs().detach() for n in names})


def test_a_graft_equal_to_ft_agrees_on_every_token_and_is_promised(gen_pair):
    pre, ft, rows, _ = gen_pair
    ranking = _ranking(pre, ft)
    spec = KeepSpec(keep_agreement=[0.8], keep_from=len(ranking))  # probe only the whole region
    (r,) = keep_search(pre, ft, ranking, rows, spec)
    assert r.kind == "agreement" and r.method == "betting"
    assert r.reached and r.size == len(ranking) and r.share == 1.0 and r.bound >= 0.8
    (probe,) = r.probes
    assert np.array_equal(probe.outcome.pred, np.ones(len(rows)))  # every row: every completion token agrees


def test_token_agreement_reads_no_label_and_only_the_completion_text(gen_pair):
    pre, ft, rows, _ = gen_pair
    ranking = _ranking(pre, ft)
    garbage = [Example(ex.text_a, "not a label!", ex.text_b) for ex in rows[:24]]  # would break anything reading it
    spec = KeepSpec(keep_agreement=[0.5], keep_from=len(ranking) // 64, keep_confidence=0.8)
    got = [keep_search(pre, ft, ranking, sel, spec)[0] for sel in (rows[:24], garbage)]
    assert [p.to_dict() | {"seconds": 0} for p in got[0].probes] == [p.to_dict() | {"seconds": 0}
                                                                     for p in got[1].probes]
    assert (got[0].size, got[0].bound, got[0].next_size) == (got[1].size, got[1].bound, got[1].next_size)
    assert len(got[0].probes) > 1 and 0 < min(p.share for p in got[0].probes) < 1  # sizes do disagree with FT
    tokens = selection_outcome(ft, rows[:2], tokens=True).tokens
    assert [len(t) for t in tokens] == [len(ft.completion_ids(ex.text_b)) for ex in rows[:2]]  # + EOS


def _two_passes(scorer, rows, batch_size):
    """The search's old per-probe scoring: one pass for the score, a second for the top completion tokens."""
    out = selection_outcome(scorer, rows, batch_size)
    out.tokens = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = scorer.collate(rows[start:start + batch_size])
            kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
            logits, at, _, _ = scorer._completion_logits(kwargs, batch["target_ids"])
            out.tokens += [logits.argmax(-1)[at == i].numpy() for i in range(len(batch["input_ids"]))]
    return out


def _counting(scorer) -> list:
    """Count the forward passes of ``scorer``'s model (a list, one entry per call)."""
    calls, forward = [], scorer.model.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    scorer.model.forward = counted
    return calls


def test_one_forward_pass_per_batch_per_probe_with_the_two_pass_values(gen_pair):
    """Each probe scores a batch once for both its completion score and its top tokens, and gives exactly what the
    old two passes (score, then top tokens) gave."""
    from skillgraft.graft.graft import Graft

    pre, ft, rows, _ = gen_pair
    ranking, sel, batch = _ranking(pre, ft), rows[:24], 8  # 3 batches per probe
    spec = KeepSpec(keep_agreement=[0.5], keep_from=len(ranking) // 64, keep_confidence=0.8)

    def old(region):
        with Graft.from_models(pre, ft, region).applied(pre):
            return _two_passes(pre, sel, batch)

    pre_calls, ft_calls = _counting(pre), _counting(ft)
    try:
        (one,) = keep_search(pre, ft, ranking, sel, spec, score=graft_outcome(pre, ft, sel, tokens=True,
                                                                              batch_size=batch))
        assert len(pre_calls) == 3 * len(one.probes) and len(ft_calls) == 1  # FT's reference: one batch of 24
        del pre_calls[:]
        (two,) = keep_search(pre, ft, ranking, sel, spec, score=old)
        assert len(pre_calls) == 2 * 3 * len(two.probes)
    finally:
        del pre.model.forward, ft.model.forward
    assert len(one.probes) > 1 and [p.to_dict() | {"seconds": 0} for p in one.probes] == [
        p.to_dict() | {"seconds": 0} for p in two.probes]
    assert (one.size, one.bound, one.next_size) == (two.size, two.bound, two.next_size)
    for p in one.probes:
        with Graft.from_models(pre, ft, ranking.region(p.size)).applied(pre):
            new, ref = selection_outcome(pre, sel, batch, tokens=True), _two_passes(pre, sel, batch)
        assert new.score == ref.score and all(np.array_equal(a, b) for a, b in zip(new.tokens, ref.tokens, strict=True))
    ref, new = _two_passes(ft, sel, batch), selection_outcome(ft, sel, batch, tokens=True)
    assert all(np.array_equal(a, b) for a, b in zip(new.tokens, ref.tokens, strict=True))


def test_token_agreement_per_row():
    shares = token_agreement([np.array([1, 2, 3, 4]), np.array([5]), np.array([], int)],
                             [np.array([1, 2, 0, 4]), np.array([6]), np.array([], int)])
    assert list(shares) == [0.75, 0.0, 1.0]
    with pytest.raises(Exception, match="row 0"):
        token_agreement([np.array([1, 2])], [np.array([1])])


# ------------------------------------------------------------------ the bound's validity (pure numpy)
def _clustered(rng, n: int, mean: float, kind: int, tokens: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """(per-row shares, every token's agree flag) of n rows whose expected share is exactly ``mean``: the tokens of
    a row share its agreement rate p_i (clusters); 0: all-or-nothing rows (p_i ∈ {0, 1}); 1: p_i ~ Beta, mean
    ``mean``; 2: every row at p_i = mean (tokens independent)."""
    if kind == 0:
        p = (rng.random(n) < mean).astype(float)
    elif kind == 1:
        p = rng.beta(2 * mean / (1 - mean), 2.0, n)
    else:
        p = np.full(n, mean)
    flags = rng.random((n, tokens)) < p[:, None]
    return flags.mean(1), flags


NULL_KINDS = [0, 1, 2]


@pytest.mark.parametrize("kind", NULL_KINDS)
@pytest.mark.parametrize("tau", [0.8, 0.95])
def test_the_betting_test_keeps_its_risk_on_the_null_boundary(kind, tau):
    """Rows whose mean share is exactly τ: the test promises ≥ τ at most 1 − c of the time (+ 3 standard errors)."""
    rng = np.random.default_rng(100 * kind + int(tau * 100))
    confidence, draws = 0.9, 400
    slack = 3 * math.sqrt((1 - confidence) * confidence / draws)
    rate = np.mean([betting_test(_clustered(rng, 80, tau, kind)[0], tau, confidence) for _ in range(draws)])
    assert rate <= 1 - confidence + slack, (kind, tau, rate)


def test_a_token_level_clopper_pearson_bound_would_break_that_check():
    """The check above can fail: Clopper–Pearson on the pooled tokens (as if independent) promises too often on
    all-or-nothing rows at the same boundary, while the betting test on the rows does not."""
    from scipy.stats import beta

    rng = np.random.default_rng(5)
    tau, confidence, draws = 0.9, 0.9, 400
    naive = betting = 0
    for _ in range(draws):
        shares, flags = _clustered(rng, 80, tau, 0)
        x, m = int(flags.sum()), flags.size
        naive += x > 0 and beta.ppf(1 - confidence, x, m - x + 1) >= tau
        betting += betting_test(shares, tau, confidence)
    assert naive / draws > 1 - confidence + 3 * math.sqrt(0.09 / draws) >= betting / draws


def test_the_betting_bound_covers_the_mean_and_matches_the_test():
    rng = np.random.default_rng(11)
    mean, draws = 0.9, 300
    bounds = [betting_bound(_clustered(rng, 60, mean, 1)[0], 0.9) for _ in range(draws)]
    assert np.mean(np.array(bounds) > mean) <= 0.1 + 3 * math.sqrt(0.09 / draws)
    shares = _clustered(rng, 60, mean, 1)[0]
    lower = betting_bound(shares, 0.9)
    assert 0 < lower < shares.mean()
    assert betting_test(shares, lower - 1e-3, 0.9) and not betting_test(shares, lower + 1e-3, 0.9)


def test_rows_needed_betting():
    shares = np.array([1.0] * 18 + [0.5, 0.75])  # mean 0.9625: not confirmed at 0.9 on 20 rows
    assert not betting_test(shares, 0.9, 0.95)
    need = rows_needed_betting(shares, 0.9, 0.95)
    assert need is not None and need > 20 and betting_test(np.resize(shares, need), 0.9, 0.95)
    assert rows_needed_betting(np.ones(60), 0.9, 0.95) == 60  # already confirmed: the rows at hand
    assert rows_needed_betting(np.full(60, 0.85), 0.9, 0.95) is None  # mean below the target: no rows would


def test_search_with_per_row_means_reports_the_betting_bound_and_the_next_smaller_size():
    n = 120

    def at(k: int) -> Outcome:  # agreement grows with the size: all-or-nothing rows at rate a(k)
        a = min(1.0, 0.5 + 0.5 * math.log2(max(k, 1)) / 14)
        shares = (np.random.default_rng(k).random(n) < a).astype(float)
        return Outcome(float(shares.mean()), shares, None, "mean")

    mine = Outcome(1.0, np.ones(n), None, "mean")
    (r,) = search_keep(at, mine, [0.9], 2 ** 16, confidence=0.9, kind="agreement")
    assert r.reached and r.method == "betting" and r.bound >= 0.9
    assert betting_test(at(r.size).pred, 0.9, 0.95)  # each stage at 1 − (1 − 0.9)/2
    assert r.next_size is not None and r.next_size < r.size and "next smaller size probed" in r.note
    assert not betting_test(at(r.next_size).pred, 0.9, 0.95)
    assert "keep-agreement 0.9" in r.describe() and "(betting)" in r.describe()


def test_cli_graft_keep_agreement_on_a_generative_pair(gen_pair, tmp_path):
    from typer.testing import CliRunner

    from skillgraft.cli import app

    _, _, _, (a, b) = gen_pair
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"item {i}: the film was", "completion": f" fine number {i}"}) + "\n"
                            for i in range(100)))
    out = tmp_path / "report"
    args = ["graft", "--pretrained", a, "--finetuned", b, "--data", data, "--prompt-field", "prompt",
            "--completion-field", "completion", "--localizer", "movement", "--keep-agreement", "0.9",
            "--keep-confidence", "0.8", "--keep-holdout", "0.5", "--baselines", "", "--no-lottery-zero", "--out", out]
    r = CliRunner().invoke(app, [str(x) for x in args])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "keep-agreement 0.9:" in r.output and "agreement with FT" in r.output and "betting bound" in r.output
    (t,) = json.loads((out / "metrics.json").read_text())["keep"]["targets"]
    assert t["kind"] == "agreement" and t["bound_method"] == "betting" and t["selection_rows"] == 40
    assert t["reached"] and t["bound"] >= 0.9 and t["next_size"] < t["size"] and t["next_rows"] > 40
    assert "next smaller size probed" in r.output
    assert "betting" in (out / "report.md").read_text()


def _sft(path, fields=("prompt", "completion"), n: int = 100):
    path.write_text("".join(json.dumps(dict(zip(fields, (f"item {i}: the film was", f" fine number {i}")))) + "\n"
                            for i in range(n)))
    return path


def _graft_args(folders, data, out, *extra, fields=("prompt", "completion")):
    a, b = folders
    return ["graft", "--pretrained", a, "--finetuned", b, "--data", data, "--prompt-field", fields[0],
            "--completion-field", fields[1], "--localizer", "movement", "--baselines", "", "--no-lottery-zero",
            "--out", out, *extra]


def _plain_agreement(a, b, region, prompts, new_tokens: int = 32) -> np.ndarray:
    """Per prompt, recomputed with plain torch: FT's greedy completion (at most ``new_tokens``, cut at EOS, as
    text), then the share of its positions (tokens + EOS) where θ_pre + γ⊙(θ_ft − θ_pre)'s top next token is
    FT's."""
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(b)
    ft, graft = (tf.AutoModelForCausalLM.from_pretrained(p).eval() for p in (b, a))
    theta, delta_from = graft.state_dict(), ft.state_dict()
    with torch.no_grad():
        for name, idx in region.indices.items():  # the graft's names are the scorer's: "model." + the HF name
            hf = name.removeprefix("model.")
            theta[hf].view(-1)[idx] = delta_from[hf].view(-1)[idx]
    eos, shares = tok.eos_token_id, []
    with torch.no_grad():
        for prompt in prompts:
            ids, new = tok(prompt)["input_ids"], []
            for _ in range(new_tokens):
                nxt = int(ft(torch.tensor([ids + new])).logits[0, -1].argmax())
                if nxt == eos:
                    break
                new.append(nxt)
            completion = tok.encode(tok.decode(new, skip_special_tokens=True), add_special_tokens=False) + [eos]
            seq = torch.tensor([ids + completion])
            at = slice(len(ids) - 1, seq.shape[1] - 1)  # the positions predicting each completion token
            shares.append(float((graft(seq).logits[0, at].argmax(-1) == ft(seq).logits[0, at].argmax(-1))
                                .float().mean()))
    return np.array(shares)


def test_cli_keep_agreement_on_the_users_own_prompts(gen_pair, tmp_path):
    """--keep-data with prompts alone (in --prompt-field's field): FT's greedy completion is each one's reference; the
    chosen graft's agreement on them, recomputed with plain torch, is at least the bound the report promises."""
    from skillgraft.graft.graft import Graft

    from badinputs import invoke

    prompts = [f"note {i}: the story is" for i in range(60)]
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(json.dumps({"question": p}) + "\n" for p in prompts))
    out, fields = tmp_path / "report", ("question", "answer")
    r = invoke(*_graft_args(gen_pair[3], _sft(tmp_path / "sft.jsonl", fields), out, "--keep-agreement", "0.9",
                            "--keep-data", mine, fields=fields))
    assert r.exit_code == 0, (r.output, r.exception)
    keep = json.loads((out / "metrics.json").read_text())["keep"]
    assert keep["selection"].startswith(f"{mine} (60 rows, --keep-data") and keep["selection_n"] == 60
    assert "60 prompts without a completion take FT's greedy one (at most 32 new tokens)" in keep["selection"]
    (t,) = keep["targets"]
    assert t["kind"] == "agreement" and t["bound_method"] == "betting" and t["reached"] and t["bound"] >= 0.9
    assert "betting bound" in r.output and "greedy" in (out / "report.md").read_text()
    region = Graft.from_pretrained(out / "grafts" / "keep-agreement-0.9").region
    assert len(region) == t["size"] < t["universe"]
    shares = _plain_agreement(*gen_pair[3], region, prompts)
    assert shares.mean() == pytest.approx(t["selection_share"], abs=1e-9) and shares.mean() >= t["bound"] >= 0.9


BAD_PROMPTS = {  # id: (the file's bytes, what the one line names)
    "prompt-missing": (b'{"prompt": "a story"}\n{"question": "a story"}\n', ["mine.jsonl:2", "'prompt'",
                                                                             "--prompt-field"]),
    "empty": (b"\n\n", ["mine.jsonl", "no rows"]),
    "not-utf8": ('{"prompt": "café"}\n'.encode("latin-1"), ["mine.jsonl:1", "not UTF-8", "0xe9"]),
    "prompt-not-text": (b'{"prompt": ["a", "story"]}\n', ["mine.jsonl:1", "'prompt'", "list"]),
}


@pytest.mark.parametrize("case", list(BAD_PROMPTS))
def test_bad_prompt_files_are_one_line_before_any_work(gen_pair, tmp_path, case):
    from badinputs import refused

    content, culprits = BAD_PROMPTS[case]
    (tmp_path / "mine.jsonl").write_bytes(content)
    refused(tmp_path, _graft_args(gen_pair[3], _sft(tmp_path / "sft.jsonl"), tmp_path / "out", "--keep-agreement",
                                  "0.9", "--keep-data", tmp_path / "mine.jsonl"), *culprits)


def test_keep_needs_completions_and_refuses_prompts_alone(gen_pair, tmp_path):
    from badinputs import refused

    (tmp_path / "mine.jsonl").write_text("".join(json.dumps({"prompt": f"note {i}"}) + "\n" for i in range(60)))
    line = refused(tmp_path, _graft_args(gen_pair[3], _sft(tmp_path / "sft.jsonl"), tmp_path / "out", "--keep", "0.9",
                                         "--keep-agreement", "0.9", "--keep-data", tmp_path / "mine.jsonl"),
                   "mine.jsonl:1", "'completion'", "--keep", "--keep-agreement")
    assert "greedy" in line


def test_too_few_selection_rows_for_token_agreement_are_refused_before_any_work():
    from skillgraft.data.user import GenerativeTask
    from skillgraft.errors import SkillgraftError
    from skillgraft.keep.selection import check_keep_rows, rows_to_confirm_mean

    task, spec = GenerativeTask.make("g"), KeepSpec(keep_agreement=[0.9], keep_confidence=0.8)
    need = rows_to_confirm_mean(0.9, 0.8)
    assert betting_test(np.ones(need), 0.9, 0.9) and not betting_test(np.ones(need - 1), 0.9, 0.9)
    check_keep_rows(spec, task, need, "the dev split")
    with pytest.raises(SkillgraftError, match=f"--keep-agreement 0.9 cannot be confirmed.*{need - 1} rows.*needs {need}"):
        check_keep_rows(spec, task, need - 1, "the dev split")
    with pytest.raises(SkillgraftError, match="agreement of 1 can never be confirmed"):
        check_keep_rows(KeepSpec(keep_agreement=[1.0]), task, 10_000, "the dev split")
    # a closed set: agreement per row, with --keep's exact bound (issue 77: 3 rows were accepted)
    from skillgraft.keep.selection import rows_to_confirm

    closed, per_row = GenerativeTask.make("g", (" yes", " no")), rows_to_confirm(0.9, 0.8)
    check_keep_rows(spec, closed, per_row, "the dev split")
    with pytest.raises(SkillgraftError, match=f"--keep-agreement 0.9 cannot be confirmed.*needs {per_row}"):
        check_keep_rows(spec, closed, per_row - 1, "the dev split")
