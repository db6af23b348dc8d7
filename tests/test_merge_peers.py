"""Issue 35: the task-aware merge methods (TALL masks, T-Switch, EMR-Merging) against their equations, computed
coordinate by coordinate on small tensors, and end to end on two tiny classifiers (``skillgraft merge --peers``)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_merge import classifiers, cli, merge_args  # noqa: F401  (fixture)

from skillgraft.merge.taskaware import Emr, Tall, TSwitch, emr, mask_bytes, tall_masks, tall_topk, trimmed, tswitch


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


@pytest.fixture(scope="module")
def peers_run(classifiers, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("peers") / "out"
    cli(*merge_args(classifiers, out, "--localizer", "movement", "--budgets", "0.05", "--mergekit", "",
                    "--rules", "average", "--stitch-scales", "1", "--peers", "tall,tswitch,emr",
                    "--tall-lambdas", "0.2,0.6", "--tswitch-densities", "0.1,0.4"))
    return out


def test_peers_end_to_end(peers_run):
    s = json.loads((peers_run / "merge.json").read_text())
    rows = [r for r in s["rows"] if r["method"] in ("tall", "tswitch", "emr")]
    graft = next(r for r in s["rows"] if r["method"] == "graft")
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
    assert "task-aware peers" in (peers_run / "report.md").read_text()
