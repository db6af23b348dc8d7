"""A small real-model subset: the bundled MiniLM on ../shared/data. The structure check runs in `make test`; the
30-step fine-tune and its graft (≈ 15 s on 2 cores) run under SKILLGRAFT_SLOW=1 (`make demo` fine-tunes and grafts
the same MiniLM on real SST-2 end to end)."""

import pytest
import torch

from skillgraft.data import load_kshot
from skillgraft.evaluate import evaluate
from skillgraft.graft import Graft, fingerprint, get_localizer
from skillgraft.models import build_scorer, param_groups
from skillgraft.train import FinetuneConfig, finetune

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def sst2(shared_data):
    data = load_kshot("SST-2", 16, 13, shared_data)
    return data.train, data.test[:200]


@pytest.fixture(scope="module")
def tuned(sst2):
    train, _ = sst2
    torch.manual_seed(0)
    ft = build_scorer(None, "SST-2", "head")
    finetune(ft, train, None, FinetuneConfig(lr=0.05, steps=30, batch_size=8, eval_every=0), progress=False)
    return ft


def test_minilm_structure():
    scorer = build_scorer(None, "SST-2", "head")
    groups = param_groups(scorer)
    assert sum(p.numel() for p in scorer.model.parameters()) == pytest.approx(22.7e6, rel=0.01)
    assert len({g for g in groups.values() if g.startswith("block:")}) == 6
    assert scorer.pooling == "mean"


@pytest.mark.slow
def test_thirty_steps_beat_chance(tuned, sst2):
    """30 SGD steps on 32 SST-2 examples beat chance on 200 held-out test sentences."""
    _, test = sst2
    metrics, _ = evaluate(tuned, test)
    assert metrics["accuracy"] > 0.6


@pytest.mark.slow
def test_graft_on_minilm_keeps_head_and_reverts(tuned, sst2):
    _, test = sst2
    pre = build_scorer(None, "SST-2", "head")
    fp = fingerprint(pre)
    graft = Graft.from_models(pre, tuned, get_localizer("movement").region(pre, tuned, None, 1e-3))
    assert graft.carried_size == 384 * 2 + 2
    full, _ = evaluate(tuned, test[:64])
    graft.apply(pre)
    grafted, _ = evaluate(pre, test[:64])
    graft.revert(pre)
    assert fingerprint(pre) == fp
    assert grafted["accuracy"] > 0.5 and full["accuracy"] > 0.5
