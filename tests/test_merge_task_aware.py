"""Issue 35: ``skillgraft merge --refit-heads N`` (each task's head refitted on the merged body), ``--routed`` (one
base plus each task's graft and head, read by :class:`skillgraft.RoutedSkills`) and the task-aware merge methods
(TALL masks, T-Switch, EMR-Merging) against their equations, computed coordinate by coordinate on small tensors, and
end to end on two tiny classifiers — one merge run for all of them."""

from __future__ import annotations

import json
import math

import pytest
import torch
from plain import plain_graft_logits
from userland import cli, fake_mergekit, merge_args

from skillgraft.merge.refit import fit_head, head_layer, refitted
from skillgraft.merge.taskaware import Emr, Tall, TSwitch, emr, mask_bytes, tall_masks, tall_topk, trimmed, tswitch


@pytest.fixture(scope="module")
def refit_run(classifiers, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("refit") / "out"
    text = cli(*merge_args(classifiers, out, "--localizer", "movement", "--budgets", "0.05", "--mergekit",
                           "task_arithmetic", "--scales", "0.5", "--rules", "average", "--stitch-scales", "1,2",
                           "--refit-heads", "16", "--routed", "--peers", "tall,tswitch,emr", "--tall-lambdas",
                           "0.2,0.6", "--tswitch-densities", "0.1,0.4"), obj={"mergekit_runner": fake_mergekit})
    return out, text


def test_refit_rows_in_report_beside_every_method(refit_run):
    out, _ = refit_run
    s = json.loads((out / "merge.json").read_text())
    plain = {(r["method"], r["config"]) for r in s["rows"] if r.get("on_test") and not r.get("refit_heads")
             and (r.get("chosen_on_dev") or r["method"] == "graft") and r["method"] not in ("tall", "tswitch", "emr")}
    refit = {(r["method"], r["config"].removesuffix(" + refit heads")) for r in s["rows"] if r.get("refit_heads")}
    # every method's dev-chosen merged model (the stitch's, mergekit's) and each graft alone has its refitted twin
    assert plain == refit and {m for m, _ in refit} == {"graft", "stitch", "mergekit task_arithmetic"}
    assert all(r["refit_rows"] == {"sentiment": 16, "topic": 16} for r in s["rows"] if r.get("refit_heads"))
    h = s["headline"]
    assert h["refit_heads"] == 16 and h["stitch_refit_mean_normalized"] is not None
    assert h["best_mergekit_refit"].startswith("mergekit task_arithmetic")
    report = (out / "report.md").read_text()
    assert "refitted heads" in report and "16 training rows per task" in report
    # the written model and the headline's plain numbers are the merge without refit
    assert [r for r in s["rows"] if r.get("written")][0].get("refit_heads") is None


def test_refit_changes_only_the_head_layer_on_training_rows(classifiers, tmp_path):  # noqa: F811
    """Inside the refitted block only the head's last linear layer differs; after it the model is bit-exact; the
    rows used are training rows (not one test or dev row)."""
    from skillgraft.merge import Scored  # noqa: F401
    from skillgraft.merge.refit import refit_rows
    from skillgraft.verbs.merge import MergeSpec, open_member
    from skillgraft.verbs.merge_inputs import resolve_inputs

    from skillgraft.data.spec import UserDataSpec

    spec = MergeSpec()
    c = classifiers
    _, inputs = resolve_inputs(pretrained=str(c["base"]), finetuned=[str(c[t][0]) for t in ("sentiment", "topic")],
                               data=[str(c[t][1]) for t in ("sentiment", "topic")],
                               eval_data=[str(c[t][2]) for t in ("sentiment", "topic")],
                               dev_data=[], grafts=[], shared=UserDataSpec())
    member = open_member(str(c["base"]), inputs[1], spec)
    rows = refit_rows(member.data.train, 24, member.data.seed)
    key = lambda ex: (ex.text_a, ex.text_b, ex.label)  # noqa: E731
    train = [key(x) for x in member.data.train]
    assert len(rows) == 24 and all(key(r) in train for r in rows)
    held = {key(x) for x in member.test} | {key(x) for x in member.data.dev}
    assert not [r for r in rows if key(r) in held and key(r) not in train]  # only training rows are drawn
    scorer = member.ft
    before = {n: p.detach().clone() for n, p in scorer.named_parameters()}
    import contextlib

    use = refitted(lambda name: contextlib.nullcontext(scorer), lambda name: rows)
    name, _ = head_layer(scorer)
    with use("topic"):
        inside = {n: p.detach().clone() for n, p in scorer.named_parameters()}
    changed = {n for n in before if not torch.equal(before[n], inside[n])}
    assert changed and changed <= {f"model.{name}.weight", f"model.{name}.bias"}
    assert all(torch.equal(before[n], p) for n, p in scorer.named_parameters())


def test_fit_head_solves_logistic_regression():
    """On separable features the refitted head classifies every row; at l2 → ∞ it stays the initial head."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 5, generator=g)
    y = (x[:, 0] > 0).long()
    w0, b0 = torch.zeros(2, 5), torch.zeros(2)
    fit = fit_head(x, y, w0, b0, l2=1e-4)
    assert ((x @ fit["weight"].T + fit["bias"]).argmax(-1) == y).all()
    stiff = fit_head(x, y, w0, b0, l2=1e8)
    assert stiff["weight"].abs().max() < 1e-4


def test_routed_loader_applies_each_graft_exactly_and_restores_the_base(refit_run):
    import skillgraft

    out, _ = refit_run
    folder = out / "routed"
    skills = skillgraft.RoutedSkills.from_pretrained(folder)
    assert skills.tasks == ["sentiment", "topic"]
    before = {k: v.clone() for k, v in skills.model.state_dict().items()}
    labels_before = dict(skills.model.config.id2label)
    texts = ["the news said football today", "a good film", "market said"]
    enc = skills.tokenizer(texts, return_tensors="pt", padding=True)
    got = {}
    for task in skills.tasks:
        with skills.use(task) as model, torch.no_grad():
            got[task] = model(**enc).logits
            assert model.config.id2label == dict(enumerate(skills.labels[task]))
        assert torch.equal(got[task], plain_graft_logits(folder, task, texts))
        after = skills.model.state_dict()
        assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)
        assert dict(skills.model.config.id2label) == labels_before
    assert got["topic"].shape[1] == 3 and got["sentiment"].shape[1] == 2
    # a mixed batch grouped by task gives what each task's block gives
    tasks = ["topic", "sentiment", "topic"]
    assert skills.grouped(tasks) == {"topic": [0, 2], "sentiment": [1]}
    for task, idx, model in skills.batches(tasks):
        with torch.no_grad():
            sub = model(**skills.tokenizer([texts[i] for i in idx], return_tensors="pt", padding=True)).logits
        ref = plain_graft_logits(folder, task, [texts[i] for i in idx])
        assert torch.allclose(sub, ref, atol=1e-6)
    s = json.loads((out / "merge.json").read_text())
    r = s["routed"]
    assert r["switch_ms"] > 0 and set(r["tasks"]) == {"sentiment", "topic"}
    graft_row = next(x for x in s["rows"] if x["method"] == "graft" and not x.get("refit_heads"))
    assert r["mean_normalized"] == graft_row["mean_normalized"]
    assert r["bytes_per_task"] == pytest.approx(graft_row["bytes_per_task"], rel=0.01)
    assert "Routed skills" in (out / "report.md").read_text()


def test_mergekit_rows_save_the_yaml_they_ran(refit_run, classifiers):  # noqa: F811
    """Each mergekit method's dev-chosen configuration is saved as mergekit/<method>.yaml on the user's checkpoints
    (issue 35.4)."""
    import yaml

    out, text = refit_run
    s = json.loads((out / "merge.json").read_text())
    chosen = next(r for r in s["rows"] if r["method"] == "mergekit task_arithmetic" and r.get("chosen_on_dev")
                  and not r.get("refit_heads"))
    cfg = yaml.safe_load((out / "mergekit" / "task_arithmetic.yaml").read_text())
    assert cfg["merge_method"] == "task_arithmetic"
    assert [m["model"] for m in cfg["models"]] == [str(classifiers[t][0].resolve()) for t in ("sentiment", "topic")]
    assert cfg["base_model"] == str(classifiers["base"].resolve())
    assert cfg.get("parameters", {}) == chosen["global"] and cfg["models"][0]["parameters"] == chosen["parameters"]
    assert "mergekit-yaml this.yaml" in (out / "mergekit" / "task_arithmetic.yaml").read_text()


def taus(n: int = 3, p: int = 50, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, p, generator=g)
    t[:, :5] = 0.0  # untouched coordinates
    return t


def test_tall_masks_equation():
    tau = taus()
    for lam in (0.2, 0.4, 1.0):
        m = tall_masks(tau, lam)
        for t in range(3):
            for i in range(50):
                mtl = sum(float(tau[s, i]) for s in range(3))
                assert bool(m[t, i]) == (abs(float(tau[t, i])) > lam * abs(mtl - float(tau[t, i])))
    # the model: θ_t − θ_pre = m_t ⊙ τ_MTL
    idx, delta, _ = Tall().models(tau, {"lambda": 0.4})[1]
    expect = tall_masks(tau, 0.4)[1] * tau.sum(0)
    assert torch.equal(torch.zeros(50).index_put_((idx,), delta), expect)
    # at size k: the top-k of |τ_t| / |τ_MTL − τ_t|, i.e. λ_t = its k-th largest value
    mk = tall_topk(tau, 7)
    for t in range(3):
        ratio = tau[t].abs() / (tau.sum(0) - tau[t]).abs()
        lam_t = float(ratio[5:].sort(descending=True).values[6])
        assert int(mk[t].sum()) == 7 and torch.equal(mk[t], ratio >= lam_t)


def test_tswitch_equation():
    tau = taus()
    mask, alpha = tswitch(tau[0], 10)
    top = tau[0].abs().sort(descending=True).indices[:10]
    assert set(torch.nonzero(mask).reshape(-1).tolist()) == set(top.tolist())
    assert alpha == pytest.approx(math.sqrt(sum(float(tau[0, i]) ** 2 for i in top) / 10), rel=1e-6)
    idx, delta, nbytes = TSwitch().models(tau, {"k": 10})[0]
    assert torch.allclose(torch.zeros(50).index_put_((idx,), delta), alpha * mask * torch.sign(tau[0]))
    assert nbytes == mask_bytes(10, 50) + 2 + 4  # positions (or a bitmap), 10 sign bits, one scale


def test_emr_equation():
    tau = taus()
    uni, masks, scales = emr(tau)
    for i in range(50):
        col = [float(tau[t, i]) for t in range(3)]
        sigma = 1.0 if sum(col) > 0 else -1.0
        eps = max([abs(v) for v in col if v * sigma > 0], default=0.0)
        assert float(uni[i]) == pytest.approx(sigma * eps)
        for t in range(3):
            assert bool(masks[t, i]) == (col[t] * sigma * eps > 0)
    for t in range(3):
        lam = float(tau[t].abs().sum() / (masks[t] * uni.abs()).sum())
        assert float(scales[t]) == pytest.approx(lam, rel=1e-5)
        idx, delta, _ = Emr().models(tau, {})[t]
        assert torch.allclose(torch.zeros(50).index_put_((idx,), delta), scales[t] * masks[t] * uni)
    # at size k: EMR on the task vectors trimmed to their top-k |τ_t|
    tk = trimmed(tau, 8)
    assert all(int((row != 0).sum()) == 8 for row in tk)
    idx, _, _ = Emr().models(tau, {"k": 8})[0]
    assert idx.numel() <= 8


def test_solve_k_meets_the_byte_budget():
    tau = taus(p=4000)
    for method in (Tall(), TSwitch(), Emr()):
        k = method.solve_k(tau, 400.0)
        mean = sum(b for _, _, b in method.models(tau, method.sized(k))) / 3
        assert 0 < k and mean <= 400.0
        bigger = sum(b for _, _, b in method.models(tau, method.sized(int(k * 1.05) + 1))) / 3
        assert bigger > 400.0 * 0.98  # the largest k within the budget, to about 1%


def test_byte_sizes_are_the_models_bytes():
    """What solve_k bisects on (T-Switch's without a top-k) is what each method's models count, at every size up to
    past the nonzero coordinates of a task vector and at a density."""
    tau = taus(p=4000)
    tau[1, ::3] = 0  # a task vector with fewer nonzero coordinates than some k below
    for method in (Tall(), TSwitch(), Emr()):
        for params in [method.sized(k) for k in (1, 7, 500, 2666, 2667, 2700, 4000)] + [{"density": 0.3}]:
            if "density" in params and not isinstance(method, TSwitch):
                continue
            assert method.byte_sizes(tau, params) == [b for _, _, b in method.models(tau, params)], (method, params)


def test_peers_end_to_end(refit_run):
    out, _ = refit_run
    s = json.loads((out / "merge.json").read_text())
    rows = [r for r in s["rows"] if r["method"] in ("tall", "tswitch", "emr")]
    graft = next(r for r in s["rows"] if r["method"] == "graft" and not r.get("refit_heads"))
    for m in ("tall", "tswitch", "emr"):
        mine = [r for r in rows if r["method"] == m]
        assert mine[0]["config"].startswith("defaults") and mine[0]["on_test"]
        eq = [r for r in mine if r.get("equal_bytes")]
        assert len(eq) == 1 and eq[0]["on_test"] and eq[0]["bytes_per_task"] <= graft["bytes_per_task"]
        if m != "emr":  # a grid: chosen per task on dev
            chosen = [r for r in mine if r.get("chosen_on_dev")]
            assert len(chosen) == 1 and chosen[0]["on_test"]
            for task in s["tasks"]:
                assert chosen[0][f"{task}:dev"] == max(r[f"{task}:dev"] for r in mine if not r.get("equal_bytes")
                                                       and not r.get("chosen_on_dev"))
    h = s["headline"]
    assert set(h["peers_at_equal_bytes"]) == {"tall", "tswitch", "emr"}
    assert isinstance(h["graft_at_least_every_peer"], bool)
    assert "task-aware peers" in (out / "report.md").read_text()


def test_task_vectors_leave_out_tensors_no_fine_tuning_moved(tmp_path):
    """A tensor every FT left at θ_pre (Gemma's frozen 168M-entry embedding) has τ = 0: no method can select it,
    so the ``[N, P]`` task vectors (and the masks' bitmaps) cover only the tensors some FT moved."""
    from types import SimpleNamespace

    from safetensors.torch import save_file

    base = {"emb": torch.ones(6, 4), "w": torch.zeros(3, 2), "v": torch.zeros(5)}
    (tmp_path / "taskaware").mkdir()
    for i in range(2):
        moved = {"emb": base["emb"].clone(), "w": torch.full((3, 2), float(i + 1)), "v": torch.zeros(5)}
        if i == 1:
            moved["v"][2] = 0.5
        save_file(moved, str(tmp_path / "taskaware" / f"ft{i}.safetensors"))
    bench = SimpleNamespace(names=["a", "b"], base=base)
    shapes, pre, tau = Tall().vectors(bench, tmp_path)
    assert list(shapes) == ["w", "v"] and pre.numel() == tau.shape[1] == 6 + 5
    assert torch.equal(tau[1, 6:], torch.tensor([0, 0, 0.5, 0, 0])) and torch.equal(tau[0, :6], torch.ones(6))
