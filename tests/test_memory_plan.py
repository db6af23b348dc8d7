"""The memory plan (issue 76): made from config + safetensors headers before any work; under a fake memory limit
a graft that does not fit dense takes the lean path by itself (and says so), one that fits in no way is refused in
one line naming the estimate, what is free and the options that would fit; the dense store key is unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.models.memory import free_memory, parse_bytes, shape_of
from skillgraft.pipeline.memory_plan import plan_localization

ARGS = ["--task", "SST-2", "--k", "16", "--budgets", "0.05", "--steps", "1", "--baselines", "", "--no-lottery-zero"]


@pytest.fixture(scope="module")
def llama_pair(moved_llama) -> tuple[Path, Path]:
    """(A, B): the tiny Llama and a copy whose body moved (conftest's ``moved_llama``)."""
    return moved_llama


def test_shape_from_headers_matches_the_model(llama_pair):
    import transformers as tf

    a, _ = llama_pair
    shape = shape_of(a)
    model = tf.AutoModelForCausalLM.from_pretrained(a)
    params = dict(model.named_parameters())
    assert shape.params == sum(p.numel() for p in model.state_dict().values() if p.is_floating_point()) or \
        shape.params == sum(p.numel() for p in params.values())
    body = sum(p.numel() for n, p in params.items() if "embed" not in n and "lm_head" not in n)
    assert shape.body == body
    assert shape.hidden == model.config.hidden_size and shape.layers == model.config.num_hidden_layers
    assert shape_of(Path(a) / "missing") is None


def test_fake_limit_parses_and_host_reads_proc(monkeypatch):
    assert parse_bytes("20G") == 20 * 10**9 and parse_bytes("1GiB") == 2**30 and parse_bytes("512M") == 512 * 10**6
    with pytest.raises(SkillgraftError, match="SKILLGRAFT_FREE_MEMORY"):
        parse_bytes("lots")
    monkeypatch.delenv("SKILLGRAFT_FREE_MEMORY", raising=False)
    assert free_memory().bytes > 0
    monkeypatch.setenv("SKILLGRAFT_FREE_MEMORY", "3M")
    assert free_memory().bytes == 3 * 10**6


def _dense_need(folder) -> int:
    _, plan = plan_localization("graft", folder, LocalizeConfig(), lean=True, max_length=32)
    return plan.estimate


def test_auto_resolves_before_the_key_dense_when_it_fits(llama_pair, monkeypatch):
    _, b = llama_pair
    monkeypatch.setenv("SKILLGRAFT_FREE_MEMORY", "100G")
    dense = LocalizeConfig()
    opts, plan = plan_localization("graft", b, dense.replace(candidates="auto"), lean=True)
    assert opts.candidates is None and plan.fits and not plan.choices
    assert opts.key() == dense.key() and "candidates" not in opts.to_dict()  # existing dense runs keep their key
    opts, _ = plan_localization("graft", b, dense, lean=True)
    assert opts == dense


def test_lean_chosen_where_dense_does_not_fit(llama_pair, monkeypatch):
    _, b = llama_pair
    need = _dense_need(b)
    monkeypatch.setenv("SKILLGRAFT_FREE_MEMORY", str(int(need * 0.9)))
    with pytest.warns(UserWarning, match="memory plan: --candidates"):
        opts, plan = plan_localization("graft", b, LocalizeConfig(budgets=[0.05]), lean=True, max_length=32)
    assert opts.candidates == 0.05  # at least every fractional budget
    assert plan.fits and plan.estimate < need and plan.choices
    with pytest.warns(UserWarning, match="--candidates auto"):
        opts, _ = plan_localization("graft", b, LocalizeConfig(candidates="auto"), lean=True, max_length=32)
    assert opts.candidates == 0.01
    # a user's explicit dense choice (candidates=1) is kept, and refused in one line when it cannot fit
    with pytest.raises(SkillgraftError, match=r"needs ≈ .* GB at its peak .* GB free .*would fit: `--candidates 0.01"):
        plan_localization("graft", b, LocalizeConfig(candidates=1.0), lean=True, max_length=32)


def test_nothing_fits_is_one_line_before_any_work(llama_pair, toy_data, tmp_path, monkeypatch):
    import skillgraft.models.loading as loading

    a, b = llama_pair
    loads = []
    monkeypatch.setattr(loading, "complete_model", lambda *x, **k: loads.append(x))
    monkeypatch.setenv("SKILLGRAFT_FREE_MEMORY", "1K")
    out = tmp_path / "r"
    r = CliRunner().invoke(app, ["graft", "--pretrained", str(a), "--finetuned", str(b), "--data-dir", str(toy_data),
                                 *ARGS, "--out", str(out)])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert "not enough memory" in line and "GB free ($SKILLGRAFT_FREE_MEMORY)" in line and "\n" not in line
    assert "--precision bf16" in line
    assert not loads and not out.exists()


def test_auto_lean_graft_runs_and_reports_its_plan(llama_pair, toy_data, tmp_path, monkeypatch):
    a, b = llama_pair
    need = _dense_need(b)
    monkeypatch.setenv("SKILLGRAFT_FREE_MEMORY", str(int(need * 0.9)))
    out = tmp_path / "r"
    r = CliRunner().invoke(app, ["graft", "--pretrained", str(a), "--finetuned", str(b), "--data-dir", str(toy_data),
                                 *ARGS, "--max-length", "32", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    plan = metrics["memory_plan"]
    assert plan["fits"] and plan["choices"] and plan["choices"][0].startswith("--candidates (default) → 0.05")
    assert metrics["localization"]["config"]["candidates"] == 0.05
    assert "## Memory plan" in (out / "report.md").read_text()


def test_rlimit_as_is_what_is_free(llama_pair, toy_data, tmp_path, monkeypatch):
    """In a child process under RLIMIT_AS (ulimit -v), the plan reads the address space left and refuses the graft."""
    from processes import fork_call, must_spawn

    a, b = llama_pair
    script = textwrap.dedent(f"""
        import os, resource, sys
        import torch, transformers
        from typer.testing import CliRunner
        from skillgraft.cli import app
        from skillgraft.models.memory import free_memory
        import skillgraft.verbs.graft, skillgraft.pipeline.memory_plan, skillgraft.pipeline.opening
        CliRunner().invoke(app, ["graft", "--help"])  # the command's imports, before the limit
        vm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:")][0]
        resource.setrlimit(resource.RLIMIT_AS, (vm + 4 * 2**20, resource.RLIM_INFINITY))
        free = free_memory()
        print("FREE", free.bytes, free.source)
        r = CliRunner().invoke(app, ["graft", "--pretrained", {str(a)!r}, "--finetuned", {str(b)!r},
                                     "--data-dir", {str(toy_data)!r}, *{ARGS!r}, "--out", {str(tmp_path / 'r')!r}])
        print("EXIT", r.exit_code, repr(r.exception))
        print(r.output)
    """)
    monkeypatch.delenv("SKILLGRAFT_FREE_MEMORY", raising=False)
    if must_spawn():
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        said, err = done.stdout, done.stderr
    else:  # forked from this worker: the imports are there already (the script's are no-ops), no interpreter start
        out, err_file = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        fork_call(lambda: exec(script, {}), err_file, stdout_file=out).wait()
        said, err = out.read_text(), err_file.read_text()
    assert "FREE" in said, err[-2000:]
    free_line = next(l for l in said.splitlines() if l.startswith("FREE"))
    assert "RLIMIT_AS" in free_line and int(free_line.split()[1]) <= 4 * 2**20
    assert "EXIT 2" in said and "not enough memory" in said, said[-2000:]
    assert not (tmp_path / "r").exists()


def test_default_rows_that_do_not_fit_are_left_out_in_one_warning(llama_pair, toy_data, tmp_path, monkeypatch):
    """The default report's random / top-movement baselines hold per-coordinate scores: where they alone do not fit
    they are left out (said once, and in the plan); baselines the user asked for are refused instead."""
    a, b = llama_pair
    lean = LocalizeConfig(candidates=0.05, budgets=[0.05], steps=1, micro_batch=1)
    _, light = plan_localization("graft", b, lean, lean=True, max_length=8)
    _, heavy = plan_localization("graft", b, lean, baselines=["movement", "random", "bias"], lean=True, max_length=8)
    assert heavy.estimate > light.estimate
    monkeypatch.setenv("SKILLGRAFT_FREE_MEMORY", str((light.estimate + heavy.estimate) // 2))
    args = ["graft", "--pretrained", str(a), "--finetuned", str(b), "--data-dir", str(toy_data), "--task", "SST-2",
            "--k", "16", "--budgets", "0.05", "--candidates", "0.05", "--steps", "1", "--micro-batch", "1",
            "--max-length", "8"]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert not any(row["model"].startswith(("random", "top-movement")) for row in metrics["rows"])
    assert any("eft out of the report for memory: movement, random" in c for c in metrics["memory_plan"]["choices"])
    r = CliRunner().invoke(app, [*args, "--baselines", "random", "--out", str(tmp_path / "s")])
    assert r.exit_code == 2 and "not enough memory" in r.output and not (tmp_path / "s").exists()


@pytest.mark.parametrize("verb", ["finetune", "fim", "sweep"])
def test_other_verbs_refuse_in_one_line_before_any_work(verb, tiny_bert, trained_run, toy_data, tmp_path,
                                                        monkeypatch):
    """finetune and fim plan weights, gradients, optimizer or Fisher state and activations; sweep the localizer and
    its baselines: under a fake 1 KB limit each is one line, exit 2, nothing written."""
    monkeypatch.setenv("SKILLGRAFT_FREE_MEMORY", "1K")
    out = tmp_path / "out"
    data = ["--task", "SST-2", "--k", "16", "--data-dir", str(toy_data)]
    args = {"finetune": ["finetune", *data, "--model", str(tiny_bert), "--steps", "1", "--out", str(out)],
            "fim": ["fim", *data, "--model", str(tiny_bert), "--out", str(out)],
            "sweep": ["sweep", "--finetuned", str(trained_run), "--data-dir", str(toy_data), "--out", str(out)]}[verb]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert f"not enough memory: this {verb} needs" in r.output and "GB free ($SKILLGRAFT_FREE_MEMORY)" in r.output
    assert not out.exists()
    monkeypatch.setenv("SKILLGRAFT_MEMORY_PLAN", "off")  # the plan can be switched off: the same command runs
    if verb != "sweep":
        assert CliRunner().invoke(app, args).exit_code == 0


@pytest.mark.parametrize("free", ["100G", "1K"])
def test_library_auto_is_dense_or_lean_by_the_free_memory(pair, monkeypatch, free):
    from skillgraft.graft.localizers import localize

    pre, ft, data = pair
    monkeypatch.setenv("SKILLGRAFT_FREE_MEMORY", free)
    result = localize(pre, ft, data.train, data.dev, LocalizeConfig(candidates="auto", steps=1), progress=False)
    assert result.config.get("candidates") == (None if free == "100G" else 0.01)  # resolved: a number or dense
    assert (result.candidate_size is None) == (free == "100G")


def test_bf16_mixed_plans_the_heads_kept_bf16_copy(llama_pair):
    """Under bf16-mixed (fp32 weights, bf16 compute) the frozen output head's bf16 copy that models/logits.py keeps
    between forwards is in the plan's vocabulary term — V × h × 2 bytes more than fp32 with bf16 compute would
    hold — and not under fp32 or bf16 (whose head is already bf16)."""
    from skillgraft.models.memory import Work, inference_terms, localization_terms

    shape = shape_of(llama_pair[0])
    head = shape.vocab * shape.hidden * 2
    for terms in (lambda d, a: inference_terms(shape, weight_bytes=d, work=Work(4, 32, False, a)),
                  lambda d, a: localization_terms(shape, weight_bytes=d, candidates=None, work=Work(4, 32, False, a),
                                                  ft_resident=True)):
        vocab = {p: next(t for t in terms(d, a) if t.name.startswith("vocabulary rows"))
                 for p, (d, a) in {"fp32": (4, 4), "bf16": (2, 2), "bf16-mixed": (4, 2)}.items()}
        assert vocab["bf16-mixed"].bytes - vocab["fp32"].bytes == head
        assert vocab["bf16"].bytes == vocab["fp32"].bytes and "bf16 copy" in vocab["bf16-mixed"].name
