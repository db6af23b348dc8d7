"""skillgraft.resume with several processes (issue 36): a two-process (gloo) sharded localization and a two-process
fine-tuning, one rank SIGKILLed while it writes its state, resume on the same command to the uninterrupted run's
result bit for bit; a save cut short (manifest or a rank's file missing), another world size or other settings are
not resumed from (one line each) and the loop starts over."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from localizing import free_port, trained_pair
from processes import launch_ranks

from skillgraft.data import load_kshot
from skillgraft.graft import LocalizeConfig, localize
from skillgraft.resume import resume_point

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "fsdp2-cpu.yaml"
COUNTING = """
import sys, torch
from accelerate import Accelerator
torch.set_num_threads(1)
acc = Accelerator(cpu=True)
calls = []
def counting(module):  # the steps a loop runs: its loss checks (the localization engine: its steps)
    if hasattr(module, "_step"):
        real_step = module._step
        def step(*args):
            calls.append(args[-1])
            return real_step(*args)
        module._step = step
        return
    real = module.check_loss
    def check(total, what, step):
        calls.append(step)
        return real(total, what, step)
    module.check_loss = check
def done(out, result):
    if acc.is_main_process:
        torch.save(result, out)
"""
LOCALIZE = COUNTING + """
import contextlib
import skillgraft.graft.localizers.machinery.engine as engine
from skillgraft.data import load_kshot
from skillgraft.graft import LocalizeConfig, localize
from skillgraft.models import build_scorer
from skillgraft.resume import resume_point
pre_path, ft_dir, data_dir, work, cfg, mode = sys.argv[1:7]
data = load_kshot("SST-2", 8, 13, data_dir)
pre = build_scorer(pre_path, "SST-2", "causal")
counting(engine)
def run(folder, config):
    calls.clear()
    with resume_point(folder) if folder else contextlib.nullcontext():
        res = localize(pre, ft_dir, data.train[:9], data.dev, config, accelerator=acc, progress=False)
    return {"regions": {b.key: r.indices for b, r in res.regions.items()},
            "history": [h.columns() for h in res.history], "steps": list(calls)}
cfg = LocalizeConfig.model_validate_json(cfg)
if mode == "first":  # the uninterrupted run, then one whose rank 1 is killed writing its third save
    done(f"{work}/ref.pt", run(None, cfg))
    run(f"{work}/b", cfg)
else:
    other = cfg.model_copy(update={"steps": cfg.steps + 1})
    done(f"{work}/again.pt", {x: run(f"{work}/{x}", other if x == "e" else cfg) for x in "bcde"})
torch.distributed.barrier()  # not acc.wait_for_everyone(): it passes device_ids=[rank] even to gloo (no cuda:1)
acc.end_training()
"""
FINETUNE = COUNTING + """
import os
import skillgraft.train.core as core
from skillgraft.data import DataSpec
from skillgraft.models import ModelSpec
from skillgraft.train import FinetuneConfig
from skillgraft.train.run import run_finetune
model, data_dir, work, mode = sys.argv[1:5]
counting(core)
def run(out):
    calls.clear()
    run_finetune(DataSpec(task="SST-2", k=8, seed=13, data_dir=data_dir, test_limit=8), out,
                 model=ModelSpec(model=model), accelerator=acc, progress=False,
                 finetune=FinetuneConfig(optimizer="adamw", lr=1e-3, steps=8, eval_every=2, batch_size=8))
    return list(calls)
if mode == "first":  # the uninterrupted run (saving too), then one whose rank 1 is killed writing its fifth save
    run(f"{work}/ref")
    os.environ["SKILLGRAFT_CRASH_AT"] = "file-written:finetune-0.rank1.5.pt"
    run(f"{work}/run")
else:
    done(f"{work}/again.pt", run(f"{work}/run"))
torch.distributed.barrier()  # not acc.wait_for_everyone(): it passes device_ids=[rank] even to gloo (no cuda:1)
acc.end_training()
"""


def _launch(script: Path, *args, crash: str | None = None):
    """`accelerate launch --config_file configs/fsdp2-cpu.yaml SCRIPT ARGS`, its two ranks forked from this worker
    (processes.launch_ranks: Accelerate's own environment for them; no interpreter start per rank)."""
    env = {"SKILLGRAFT_CHECKPOINT_SECONDS": "0", "OMP_NUM_THREADS": "1",
           # rank 1 SIGKILLs itself, its file not yet in place
           "SKILLGRAFT_CRASH_AT": f"file-written:{crash}" if crash else None}
    return launch_ranks(["--config_file", CONFIG, "--main_process_port", free_port()], script, list(args), env,
                        script.parent)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x.keys() == y.keys() and all(torch.equal(x[n], y[n]) for n in x)
                                        for x, y in ((a[k], b[k]) for k in a))


def test_two_process_sharded_localization_resumes_bit_for_bit(tiny_models, toy_data, tmp_path, capfd):
    small = load_kshot("SST-2", 8, 13, toy_data)
    pre, ft = trained_pair(tiny_models["llama"], "causal", small, steps=5)
    ft.save_pretrained(tmp_path / "ft")
    cfg = LocalizeConfig(sparsity=0.01, candidates=0.05, steps=4, seed=3, budgets=[0.005, 0.02], micro_batch=4)
    script = tmp_path / "localize.py"
    script.write_text(LOCALIZE)
    args = (tiny_models["llama"], tmp_path / "ft", toy_data, tmp_path, cfg.model_dump_json())
    r = _launch(script, *args, "first", crash="localize-0.rank1.3.pt")
    assert r.returncode != 0 and (tmp_path / "ref.pt").is_file(), r.stderr[-3000:]
    ref = torch.load(tmp_path / "ref.pt")
    assert ref["steps"] == [1, 2, 3, 4]
    b = tmp_path / "b"  # saves 1 and 2 complete (the manifest names 2); rank 1's third cut short (rank 0's may be
    assert json.loads((b / "localize-0.json").read_text())["serial"] == 2  # written: it was stopped meanwhile)
    assert {p.name for p in b.glob("*.pt")} - {"localize-0.rank0.3.pt"} == {"localize-0.rank0.2.pt",
                                                                           "localize-0.rank1.2.pt"}
    for x in "cde":
        shutil.copytree(b, tmp_path / x)
    (tmp_path / "c" / "localize-0.json").unlink()        # no manifest: the save is not known complete
    (tmp_path / "d" / "localize-0.rank1.2.pt").unlink()  # a rank's file missing
    r = _launch(script, *args, "again")
    assert r.returncode == 0, r.stderr[-3000:]
    again = torch.load(tmp_path / "again.pt")
    assert again["b"]["steps"] == [3, 4]  # every rank went on from save 2
    for x in "bcd":
        assert again[x]["history"] == ref["history"] and _same(again[x]["regions"], ref["regions"]), x
    assert again["c"]["steps"] == again["d"]["steps"] == [1, 2, 3, 4] and again["e"]["steps"] == [1, 2, 3, 4, 5]
    said = [line for line in r.stderr.splitlines() if "not resuming from it" in line]
    assert said == [f"{tmp_path / 'd' / 'localize-0.rank1.2.pt'}: missing or damaged; not resuming from it, the "
                    "loop starts over",
                    f"{tmp_path / 'e' / 'localize-0.json'}: saved with other settings; not resuming from it, the "
                    "loop starts over"], r.stderr[-3000:]
    # one process finds the two processes' state: it starts over (one line) to the same regions
    capfd.readouterr()
    with resume_point(b):
        one = localize(pre, tmp_path / "ft", small.train[:9], small.dev, cfg, progress=False)
    assert capfd.readouterr().err.splitlines()[-1] == (f"{b / 'localize-0.json'}: saved by 2 processes, this run "
                                                      "has 1; not resuming from it, the loop starts over")
    assert [h.columns() for h in one.history] == ref["history"]
    assert _same({k.key: v.indices for k, v in one.regions.items()}, ref["regions"])


def test_two_process_finetuning_resumes_bit_for_bit(tiny_bert, toy_data, tmp_path):
    script = tmp_path / "finetune.py"
    script.write_text(FINETUNE)
    r = _launch(script, tiny_bert, toy_data, tmp_path, "first")
    assert r.returncode != 0 and (tmp_path / "ref" / "metrics.json").is_file(), r.stderr[-3000:]
    saved = tmp_path / ".run.resume"
    assert not (tmp_path / "run").exists() and json.loads((saved / "finetune-0.json").read_text())["step"] == 4
    r = _launch(script, tiny_bert, toy_data, tmp_path, "again")
    assert r.returncode == 0, r.stderr[-3000:]
    assert torch.load(tmp_path / "again.pt") == [5, 6, 7, 8]  # steps 1–4 were saved by both ranks: only the rest ran
    assert not saved.exists()

    def files(run):
        metrics = json.loads((run / "metrics.json").read_text())
        for k in ("train_seconds", "train_examples_per_second", "eval_examples_per_second"):
            metrics.pop(k)
        return {p.name: p.read_bytes() for p in (run / "model").iterdir() if p.suffix == ".safetensors"}, metrics

    assert files(tmp_path / "run") == files(tmp_path / "ref")
