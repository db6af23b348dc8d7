"""The training core: one loop for single- and multi-task runs, its callbacks, samplers and typed config."""

import functools
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.optim import optimizer as torch_optimizer

from skillgraft.data import load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.models import build_scorer
from skillgraft.train import (BestDev, Callback, FinetuneConfig, MultiTask, RegionMask, SingleTask, TrainState,
                              batch_schedule, finetune, fit)
from skillgraft.train.masked import finetune_masked
from skillgraft.train.multitask import MultiTaskScorer, finetune_region, multitask_finetune

from tiny import write_sentiment_data

SGD = FinetuneConfig(lr=0.5, steps=8, eval_every=0, weight_decay=0.1)


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-tasks")
    write_sentiment_data(root, "SST-2", seed=0)
    write_sentiment_data(root, "cr", seed=1)
    return {t: load_kshot(t, 4, 13, root, test_limit=16) for t in ("SST-2", "cr")}


def state_of(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def no_global_optimizer_hooks() -> bool:
    return not torch_optimizer._global_optimizer_pre_hooks and not torch_optimizer._global_optimizer_post_hooks


class Recorder(Callback):
    """Logs every hook call, and checks torch's process-global optimizer hooks stay empty during training."""

    def __init__(self):
        self.calls: list[tuple] = []

    def on_setup(self, state):
        self.calls.append(("setup",))

    def on_train_start(self, state):
        assert state.params and state.optimizer is not None
        self.calls.append(("start", len(state.params)))

    def on_after_backward(self, step):
        self.calls.append(("backward", step))

    def on_before_optimizer_step(self, step, optimizer):
        self.calls.append(("before", step))

    def on_after_optimizer_step(self, step):
        assert no_global_optimizer_hooks()
        self.calls.append(("after", step))

    def on_evaluate(self, step, metrics):
        self.calls.append(("evaluate", step, metrics["dev"]))

    def on_train_end(self, state):
        self.calls.append(("end",))


def hook_order(steps: int, evals: list[int]) -> list[str]:
    order = ["setup", "start"]
    for s in range(steps):
        order += ["backward", "before", "after"] + (["evaluate"] if s + 1 in evals and s + 1 < steps else [])
    return order + (["evaluate"] if steps in evals else []) + ["end"]


# ---------------------------------------------------------------------------------------------- one core
def test_single_and_multi_task_training_run_through_the_one_core(tiny_bert, two_tasks):
    d, c = two_tasks["SST-2"], two_tasks["cr"]
    cfg = FinetuneConfig(optimizer="adamw", lr=2e-3, steps=6, eval_every=3)

    rec = Recorder()
    a = build_scorer(str(tiny_bert), "SST-2", "head")
    res = finetune(a, d.train, d.dev, cfg, callbacks=[rec], progress=False)
    assert [c[0] for c in rec.calls] == hook_order(6, [3, 6])
    b = build_scorer(str(tiny_bert), "SST-2", "head")
    sampler = SingleTask(d.train, d.dev, batch_size=cfg.batch_size, steps=6, seed=cfg.seed)
    same = fit(b, sampler, cfg, [BestDev()], progress=False)
    assert all(torch.equal(p, state_of(b)[n]) for n, p in a.named_parameters())  # the wrapper is the core
    assert (res.best_step, res.best_dev, res.history) == (same.best_step, same.best_dev, same.history)

    rec = Recorder()
    data = {"SST-2": (d.train, d.dev), "cr": (c.train, c.dev)}
    mt = MultiTaskScorer.build(str(tiny_bert), ["SST-2", "cr"], "head")
    mres = multitask_finetune(mt, data, cfg, callbacks=[rec], progress=False)
    assert [c[0] for c in rec.calls] == hook_order(6, [3, 6])
    assert {"dev", "dev_ece", "dev:SST-2", "dev:cr"} <= set(mres.history[0])
    mt2 = MultiTaskScorer.build(str(tiny_bert), ["SST-2", "cr"], "head")
    fit(mt2, MultiTask(data, batch_size=cfg.batch_size, steps=6, seed=cfg.seed), cfg, [BestDev()], progress=False)
    assert all(torch.equal(p, state_of(mt2)[n]) for n, p in mt.named_parameters())


def test_no_second_training_loop_in_train():
    """Only the core calls backward / optimizer.step; the wrappers build samplers and callbacks."""
    train_dir = Path(__file__).resolve().parents[1] / "src" / "skillgraft" / "train"
    loops = {p.name for p in train_dir.glob("*.py") if re.search(r"\.backward\(|\bopt\.step\(", p.read_text())}
    assert loops == {"core.py"}
    for p in train_dir.glob("*.py"):
        assert "register_optimizer_step" not in p.read_text(), p.name
        assert "skillgraft.graft" not in p.read_text(), p.name  # train/ never imports graft/


def test_samplers_draw_todays_batches(two_tasks):
    d, c = two_tasks["SST-2"], two_tasks["cr"]
    single = list(SingleTask(d.train, None, batch_size=4, steps=5, seed=3))
    rows = batch_schedule(len(d.train), 4, 5, seed=3)
    assert [(t, ex) for t, ex in single] == [(None, [d.train[i] for i in row]) for row in rows]

    data = {"SST-2": (d.train, None), "cr": (c.train, None)}
    multi = MultiTask(data, batch_size=2, steps=12, seed=7)
    order = np.random.RandomState(7).randint(2, size=12)
    drawn = list(multi)
    assert [t for t, _ in drawn] == [["SST-2", "cr"][i] for i in order]
    assert sum(multi.task_steps.values()) == 12
    for i, name in enumerate(data):  # each task's batches: its own schedule, seed + i, in order
        rows = batch_schedule(len(data[name][0]), 2, multi.task_steps[name], 7 + i)
        assert [ex for t, ex in drawn if t == name] == [[data[name][0][j] for j in row] for row in rows]
    with pytest.raises(SkillgraftError, match="empty"):
        MultiTask({"SST-2": ([], None)}, batch_size=2, steps=1, seed=0)


# ---------------------------------------------------------------------------------------------- RegionMask
def random_indices(module, fraction: float, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randperm(p.numel(), generator=g)[: max(1, int(fraction * p.numel()))]
            for n, p in module.named_parameters() if not n.startswith("head.") and "embeddings" not in n}


@pytest.mark.parametrize("optimizer", ["sgd+momentum", "adamw"])
def test_region_mask_keeps_everything_outside_bit_exact(tiny_bert, two_tasks, monkeypatch, optimizer):
    d = two_tasks["SST-2"]
    if optimizer == "sgd+momentum":  # the config has no momentum knob: give the core's SGD one
        monkeypatch.setattr(torch.optim, "SGD", functools.partial(torch.optim.SGD, momentum=0.9))
        cfg = FinetuneConfig(optimizer="sgd", lr=0.5, steps=8, eval_every=4, weight_decay=0.1, l1=1e-3)
    else:
        cfg = FinetuneConfig(optimizer="adamw", lr=1e-2, steps=8, eval_every=4, weight_decay=0.1, l1=1e-3)
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    indices = random_indices(scorer, 0.05, seed=1)
    before = state_of(scorer)
    mask = RegionMask(indices, whole=["head.weight", "head.bias"])
    res = finetune(scorer, d.train, d.dev, cfg.replace(freeze_embeddings=False), callbacks=[mask], progress=False)
    moved = 0
    for n, p in scorer.named_parameters():
        if n.startswith("head."):
            assert not torch.equal(p, before[n])
            continue
        inside = torch.zeros(p.numel(), dtype=torch.bool)
        inside[indices.get(n, torch.zeros(0, dtype=torch.long))] = True
        inside = inside.view(p.shape)
        assert torch.equal(p[~inside], before[n][~inside]), n  # momentum, weight decay, L1: nothing outside moves
        moved += int((p[inside] != before[n][inside]).sum())
    assert moved > 0.5 * sum(len(i) for i in indices.values())
    assert res.trainable_parameters == sum(mask.trained.values())
    assert no_global_optimizer_hooks()


def test_region_mask_refuses_unknown_tensors_and_bad_positions(tiny_bert, two_tasks):
    d = two_tasks["SST-2"]
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    with pytest.raises(SkillgraftError, match="no parameters"):
        finetune(scorer, d.train, None, SGD, callbacks=[RegionMask({"model.nope": torch.tensor([0])})], progress=False)
    name, p = next((n, p) for n, p in scorer.named_parameters() if n.endswith("dense.weight"))
    with pytest.raises(SkillgraftError, match="outside"):
        finetune(scorer, d.train, None, SGD, callbacks=[RegionMask({name: torch.tensor([p.numel()])})],
                 progress=False)
    with pytest.raises(SkillgraftError, match="shape"):
        finetune(scorer, d.train, None, SGD, progress=False,
                 callbacks=[RegionMask({name: torch.tensor([0])}, shapes={name: (1, 2)})])


def test_no_process_global_optimizer_hooks_after_any_run(tiny_bert, two_tasks):
    d = two_tasks["SST-2"]
    assert no_global_optimizer_hooks()
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    region = SimpleNamespace(indices=random_indices(scorer, 0.02, seed=0), shapes=None)
    finetune_masked(scorer, d.train, d.dev, SGD, region=region, progress=False)
    assert no_global_optimizer_hooks()
    mt = MultiTaskScorer.build(str(tiny_bert), ["SST-2"], "head")
    finetune_region(mt, "SST-2", d.train, None, SimpleNamespace(indices=random_indices(mt["SST-2"], 0.02, 0),
                                                                 shapes=None), SGD, progress=False)
    assert no_global_optimizer_hooks()
    with pytest.raises(SkillgraftError):  # a failing run leaves nothing behind either
        finetune_masked(build_scorer(str(tiny_bert), "SST-2", "head"), d.train, None, SGD,
                        region=SimpleNamespace(indices={"model.nope": torch.tensor([0])}, shapes=None), progress=False)
    assert no_global_optimizer_hooks()


# ---------------------------------------------------------------------------------------------- BestDev
def test_best_dev_restores_the_best_steps_weights(tiny_bert, two_tasks):
    d = two_tasks["SST-2"]

    class Keep(Callback):  # the trained weights at every evaluation
        def on_train_start(self, state):
            self.model, self.at = state.model, {}

        def on_evaluate(self, step, metrics):
            self.at[step] = state_of(self.model)

    keep = Keep()
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    res = finetune(scorer, d.train, d.dev, FinetuneConfig(lr=1.0, steps=8, eval_every=1), callbacks=[keep],
                   progress=False)
    devs = [h["dev"] for h in res.history]
    assert [h["step"] for h in res.history] == list(range(1, 9))
    assert res.best_step == res.history[int(np.argmax(devs))]["step"] and res.best_dev == max(devs)
    assert all(torch.equal(p, keep.at[res.best_step][n]) for n, p in scorer.named_parameters())


def test_best_dev_unit_first_maximum_wins():
    w = torch.nn.Parameter(torch.zeros(3))
    state = TrainState(model=torch.nn.Module(), config=FinetuneConfig(), steps=4, accelerator=None, params=[w])
    best = BestDev()
    best.on_train_start(state)
    for step, dev in ((1, 0.5), (2, 0.9), (3, 0.9), (4, 0.7)):
        with torch.no_grad():
            w.fill_(step)
        best.on_evaluate(step, {"dev": dev})
    best.on_train_end(state)
    assert torch.equal(w, torch.full((3,), 2.0)) and (state.best_step, state.best_dev) == (2, 0.9)


# ---------------------------------------------------------------------------------------------- typed config
def test_finetune_config_is_a_typed_spec():
    cfg = FinetuneConfig()
    assert (cfg.optimizer, cfg.lr, cfg.steps, cfg.max_steps) == ("sgd", 0.1, None, 400)
    assert FinetuneConfig.build(cfg.to_dict()) == cfg
    assert cfg.replace(bias_only=True).bias_only and not cfg.bias_only
    with pytest.raises(Exception):
        cfg.lr = 1.0  # frozen
    for bad, field in (({"batch_size": 0}, "batch_size"), ({"steps": -1}, "steps"), ({"layers": [-1]}, "layers"),
                       ({"l1": -0.1}, "l1"), ({"weight_decay": -1}, "weight_decay"), ({"eval_every": -1}, "eval_every"),
                       ({"lrr": 0.1}, "lrr")):
        with pytest.raises(SkillgraftError, match=rf"recipe field 'finetune'\.{field}"):
            FinetuneConfig.build(bad, where="recipe field 'finetune'")
    assert all(f.description for f in FinetuneConfig.model_fields.values())
