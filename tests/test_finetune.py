import json
import shutil

import numpy as np
import pytest
import torch

from skillgraft.data import DataSpec, load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate import evaluate
from skillgraft.models import Scorer, build_scorer
from skillgraft.models.spec import ModelSpec
from skillgraft.train import FinetuneConfig, batch_schedule, finetune, run_finetune
from skillgraft.train.run import RunConfig, read_run_config


def test_batch_schedule_deterministic_epochs():
    s = batch_schedule(10, 4, 5, seed=3)
    assert s.shape == (5, 4)
    assert sorted(s.reshape(-1)[:10].tolist()) == list(range(10))  # first epoch is a permutation
    assert np.array_equal(s, batch_schedule(10, 4, 5, seed=3))


def test_default_steps_rule():
    assert FinetuneConfig(max_steps=None).resolved_steps(2, 16) == 512
    assert FinetuneConfig(max_steps=None).resolved_steps(2, 1000) == 16 * 2 * 512
    assert FinetuneConfig().resolved_steps(2, 64) == 400


def test_finetune_learns_toy_task(tiny_bert, toy_data):
    data = load_kshot("SST-2", 16, 13, toy_data)
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    before, _ = evaluate(scorer, data.test)
    res = finetune(scorer, data.train, data.dev, FinetuneConfig(optimizer="adamw", lr=1e-3, steps=60,
                                                                eval_every=20, freeze_embeddings=False), progress=False)
    after, _ = evaluate(res.scorer, data.test)
    assert after["accuracy"] >= 0.8 > before["accuracy"]
    assert res.best_step in (20, 40, 60) and res.history


def test_l1_penalty_limits_movement(tiny_bert, toy_data):
    data = load_kshot("SST-2", 8, 13, toy_data)
    moved = []
    for l1 in (0.0, 0.05):
        scorer = build_scorer(str(tiny_bert), "SST-2", "head")
        start = {n: p.detach().clone() for n, p in scorer.model.named_parameters()}
        cfg = FinetuneConfig(optimizer="adamw", lr=1e-3, steps=30, eval_every=0, l1=l1)
        finetune(scorer, data.train, None, cfg, progress=False)
        moved.append(sum((p - start[n]).abs().sum().item() for n, p in scorer.model.named_parameters()))
    assert moved[1] < 0.5 * moved[0]


def test_frozen_embeddings_do_not_move(tiny_bert, toy_data):
    data = load_kshot("SST-2", 8, 13, toy_data)
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    emb = scorer.model.get_input_embeddings().weight.detach().clone()
    finetune(scorer, data.train, None, FinetuneConfig(steps=5, eval_every=0), progress=False)
    assert torch.equal(emb, scorer.model.get_input_embeddings().weight)


def test_bad_config_errors():
    with pytest.raises(SkillgraftError, match="optimizer"):
        FinetuneConfig.build({"optimizer": "adam"})
    with pytest.raises(SkillgraftError, match="lr"):
        FinetuneConfig.build({"lr": 0})


def test_run_directory_complete_and_atomic(tiny_bert, toy_data, tmp_path, capfd):
    out = tmp_path / "run"
    data = DataSpec(task="SST-2", k=8, seed=13, data_dir=toy_data)
    model = ModelSpec(model=str(tiny_bert))
    config = FinetuneConfig(steps=10, eval_every=5)
    capfd.readouterr()
    m = run_finetune(data, out, model=model, finetune=config, progress=False)
    assert "it/s]" not in capfd.readouterr().err  # progress=False: no bar, the test set's included (a chain's log)
    names = {p.name for p in out.iterdir()}
    assert {"model", "config.json", "metrics.json", "test_probs.csv", "confidence.png", "reliability.png"} <= names
    assert out.stat().st_mode & 0o055 and (out / "metrics.json").stat().st_mode & 0o044  # readable, not 0700/0600
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["test"]["accuracy"] == m["test"]["accuracy"] and "ece" in saved["test"]
    assert Scorer.from_pretrained(out / "model").task.name == "SST-2"
    # config.json: the same fields in the same order as before it was a spec, read back as a RunConfig
    raw = json.loads((out / "config.json").read_text())
    assert list(raw) == ["skillgraft_version", "task", "k", "seed", "model", "mode", "pooling", "max_length",
                         "data_dir", "test_limit", "finetune", "num_processes"]
    assert raw["data_dir"] == str(toy_data) and raw["finetune"] == config.to_dict()
    cfg = read_run_config(out)
    assert isinstance(cfg, RunConfig) and cfg.finetune == config and (cfg.k, cfg.seed) == (8, 13)
    assert cfg.model_spec == model.replace(model=raw["model"], pooling="mean")
    with pytest.raises(SkillgraftError, match="already exists"):
        run_finetune(data, out, model=model, finetune=FinetuneConfig(steps=1), progress=False)
    # a failing run leaves nothing behind
    with pytest.raises(SkillgraftError):
        run_finetune(data.replace(k=500), tmp_path / "bad", model=model, progress=False)
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad*"))


def test_a_run_on_a_part_of_dev_records_it_and_reopens_on_the_same_rows(tiny_bert, toy_data, tmp_path):
    from skillgraft.pipeline.opening import from_run

    data = DataSpec(task="SST-2", k=8, seed=13, data_dir=toy_data, dev_limit=6)
    m = run_finetune(data, tmp_path / "run", model=ModelSpec(model=str(tiny_bert)),
                     finetune=FinetuneConfig(steps=2, eval_every=1), progress=False)
    raw = json.loads((tmp_path / "run" / "config.json").read_text())
    assert raw["dev_limit"] == 6 and read_run_config(tmp_path / "run").dev_limit == 6
    member = from_run(tmp_path / "run")
    assert member.data.dev == data.load().dev and len(member.data.dev) == 6
    assert m["best_dev"] is not None


@pytest.mark.parametrize("change, culprits", [
    (lambda c: c.pop("seed"), ["'seed'", "Field required"]),
    (lambda c: c.update(pooling="max"), ["'pooling'", "'max'"]),
    (lambda c: c["finetune"].update(lr=-1), ["'finetune.lr'", "-1"]),
    (lambda c: c.update(colour="red"), ["'colour'", "unknown field"]),
])
def test_run_config_read_as_a_spec_names_file_and_field(tmp_path, change, culprits):
    """A run's config.json that does not fit :class:`RunConfig` is one error naming the file and the field."""
    good = {"skillgraft_version": "0.1.0", "task": "SST-2", "k": 8, "seed": 13, "model": "m", "mode": "head",
            "pooling": "mean", "max_length": 128, "data_dir": None, "test_limit": None,
            "finetune": FinetuneConfig().to_dict(), "num_processes": 1}
    (tmp_path / "config.json").write_text(json.dumps(good))
    assert read_run_config(tmp_path).model_spec == ModelSpec(model="m", pooling="mean")
    change(good)
    (tmp_path / "config.json").write_text(json.dumps(good))
    with pytest.raises(SkillgraftError) as e:
        read_run_config(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: field ") and all(c in str(e.value) for c in culprits)


SCRIPT = """
import json, sys, torch
from accelerate import Accelerator
from skillgraft.data import DataSpec, load_kshot
from skillgraft.models import build_scorer
from skillgraft.train import FinetuneConfig, finetune
acc = Accelerator(cpu=True)
data = load_kshot("SST-2", 8, 13, sys.argv[2])
scorer = build_scorer(sys.argv[1], "SST-2", "head")
config = FinetuneConfig(lr=0.1, steps=6, batch_size=8, eval_every=0, max_grad_norm=None)
res = finetune(scorer, data.train, None, config, accelerator=acc, progress=False)
if acc.is_main_process:
    torch.save({"world": acc.num_processes, "weights": {n: p.detach() for n, p in res.scorer.named_parameters()}},
               sys.argv[3])
acc.wait_for_everyone()
acc.end_training()
"""


def test_two_process_accelerate_matches_one(tiny_bert, toy_data, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on the CPU (gloo) gives the same weights as one process
    (atol 1e-5): each process takes its half of every global batch and DDP averages the gradients. The ranks are
    forked from this worker (processes.launch_ranks: Accelerate's own environment for each). Two things this needs
    that the test once missed: `--cpu` makes Accelerate's launcher run ONE process whatever --num_processes says
    (the test compared one process with itself; the script now reports its world size), and dropout draws other masks
    for a half batch than for the whole one, so the model here has none."""
    from localizing import free_port
    from processes import launch_ranks

    model = tmp_path / "no-dropout"
    shutil.copytree(tiny_bert, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0,
                                                   "attention_probs_dropout_prob": 0.0}))
    script = tmp_path / "ddp.py"
    script.write_text(SCRIPT)
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    flags = ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    for launcher, out, world in ((["--cpu", "--num_processes", 1], one, 1),
                                 (["--multi_gpu", "--num_processes", 2, "--main_process_port", free_port()], two, 2)):
        r = launch_ranks([*flags, *launcher], script, [model, toy_data, out], {"OMP_NUM_THREADS": "1"}, tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert torch.load(out)["world"] == world
    a, b = torch.load(one)["weights"], torch.load(two)["weights"]
    start = {n: p for n, p in build_scorer(str(model), "SST-2", "head").named_parameters()}
    assert any(not torch.equal(a[n], start[n]) for n in a)  # it trained
    for n in a:
        assert torch.allclose(a[n], b[n], atol=1e-5), n
