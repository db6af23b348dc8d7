"""A new user's first hour, second round, part two (issue 82): merge writes its best model on dev and runs the
mergekit grid only when asked; names the user gave; reading verbs leave their inputs alone; a rerun says why;
one progress format; report details."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from userland import cli, fake_mergekit, merge_args


def counting(calls: list):
    """:func:`fake_mergekit` that logs each YAML it is given."""
    def run(config, work, seed):
        calls.append(config)
        return fake_mergekit(config, work, seed)
    return run


def test_merge_writes_its_best_one_model_merge_on_dev_and_the_grid_is_opt_in(classifiers, tmp_path):
    """With a stitch far too weak (λ = 0.02 on a tiny region), mergekit's task arithmetic is the better merge on dev:
    merge writes it (not the stitch), its report's first line says so and why, and the checkpoints hold its body.
    With defaults, each mergekit method runs once (4 runs, not the 31-point grid)."""
    calls: list[str] = []
    out = tmp_path / "m"
    text = cli(*merge_args(classifiers, out, "--localizer", "movement", "--budgets", "0.001", "--stitch-scales",
                           "0.02", "--rules", "average"), obj={"mergekit_runner": counting(calls)})
    assert len(calls) == 4  # linear, task_arithmetic, ties, dare_ties at mergekit's defaults: no grid by default
    s = json.loads((out / "merge.json").read_text())
    writable = [r for r in s["rows"] if r.get("writable")]
    written = [r for r in s["rows"] if r.get("written")]
    assert len(written) == 1 and {r["method"] for r in writable} >= {"stitch", "mergekit task_arithmetic"}
    assert all(written[0]["dev_mean_normalized"] >= r["dev_mean_normalized"] for r in writable)
    assert written[0]["method"].startswith("mergekit")
    assert s["headline"]["written"] == f"{written[0]['method']} ({written[0]['config']})"
    assert s["headline"]["stitch_written"] is False
    assert f"written: {s['headline']['written']} — best mean normalized dev score" in text
    report = (out / "report.md").read_text().splitlines()
    first = next(line for line in report[1:] if line.strip())
    assert first.startswith(f"**Written to this folder: {s['headline']['written']}**") and "dev" in first
    assert "not written" in "\n".join(report)  # the stitch's headline bullet says it was not the one written
    # the checkpoint written holds that merge's body: the fake task arithmetic θ_pre + Σ τ_t, with the task's head
    import transformers as tf
    from safetensors.torch import load_file

    def body(path):
        model = tf.AutoModel.from_pretrained(path)
        return {k: v for k, v in model.state_dict().items() if "pooler" not in k}

    pre, fts = body(classifiers["base"]), [body(classifiers[t][0]) for t in ("sentiment", "topic")]
    got = body(out / "tasks" / "topic")
    if written[0]["method"] == "mergekit task_arithmetic":
        for k in pre:
            assert torch.allclose(got[k], pre[k] + sum(f[k] - pre[k] for f in fts), atol=1e-5), k
    head = load_file(str(Path(classifiers["topic"][0]) / "model.safetensors"))
    model = tf.AutoModelForSequenceClassification.from_pretrained(out / "tasks" / "topic")
    assert torch.equal(model.classifier.weight, head["classifier.weight"])
    assert "mergekit" in (out / "README.md").read_text().split("\n\n")[1]


def test_the_mergekit_grid_runs_when_asked():
    """--mergekit-grid (or a --scales / --densities grid) asks for the 31 runs of the documented grid."""
    from skillgraft.merge.mergekit import MergekitOptions, mergekit_configs

    assert MergekitOptions().runs() == 4 and not MergekitOptions().grid
    assert MergekitOptions(mergekit_grid=True).runs() == 31
    assert MergekitOptions(scales=[0.5]).runs() == 1 + 2 + 4 + 4  # ties / dare_ties: the default density grid × λ
    assert [c[1] for c in mergekit_configs(MergekitOptions(mergekit=["ties"], densities=[0.5], scales=[2.0]))] == \
        ["defaults", "density=0.5 λ=2"]


# ---------------------------------------------------------------- 5. one progress format, whatever the entry point
API_PROGRESS = """
import sys
from skillgraft.data.loading import Example
from skillgraft.evaluate.predict import predict_probs
from skillgraft.models import build_scorer
scorer = build_scorer(sys.argv[1], "SST-2", "head")
predict_probs(scorer, [Example(f"text {i}", i % 2) for i in range(40)], batch_size=2, progress="predict")
assert "skillgraft.cli" not in " ".join(sys.modules)
"""


def test_the_python_api_logs_one_line_per_phase_as_the_cli_does(tiny_bert, tmp_path, clean_python):
    """A library call with a progress bar, in a fresh interpreter that never imported the CLI, with stderr a file:
    one line for the phase, no carriage-return refresh per batch (before: the CLI alone installed the line mode)."""
    text = clean_python.run(API_PROGRESS, tiny_bert, check=True).stderr
    lines = [x for x in text.splitlines() if x.startswith("predict")]
    assert "\r" not in text and len(lines) == 1 and "20/20" in lines[0], text


# ---------------------------------------------------------------- 2. the names the user gave
def test_tasks_and_skills_are_named_after_what_the_user_passed(tmp_path, monkeypatch):
    """``sst2/train.jsonl`` is task ``sst2`` (was ``train``); merging ``sst2/ft`` and ``subj/ft`` gives skills
    ``sst2`` / ``subj`` (were ``ft-1`` / ``ft-2``); a split affix or a hub configuration names it too."""
    from userland import sentiment_rows, write_rows

    from skillgraft.data.spec import UserDataSpec
    from skillgraft.data.user import passed_name
    from skillgraft.verbs.merge_inputs import task_names

    monkeypatch.chdir(tmp_path)
    for d in ("sst2", "subj"):
        (tmp_path / d / "ft").mkdir(parents=True)
        write_rows(tmp_path / d / "train.jsonl", sentiment_rows(20, 0))
    assert UserDataSpec.build({"data": "sst2/train.jsonl"}).load().task.name == "sst2"
    assert task_names(["sst2/ft", "subj/ft"]) == ["sst2", "subj"]
    assert task_names(["runs/a/ft", "runs/b/ft"], ["sst2/train.jsonl", "subj/train.jsonl"]) == ["sst2", "subj"]
    assert task_names(["./my-clf", "other/checkpoint-500"]) == ["my-clf", "other"]
    assert [passed_name(p) for p in ("sst2_train.jsonl", "data/SST-2/dev.csv", "stanfordnlp/sst2")] == \
        ["sst2", "SST-2", "sst2"]
    assert passed_name("nyu-mll/glue", "sst2") == "sst2" and passed_name("someone/reviews", "default") == "reviews"


def test_evaluate_names_the_task_and_the_split_of_the_rows(tiny_classifier, tmp_path, monkeypatch):
    """``evaluate CLF --data sst2/test.jsonl``: task ``sst2``, split ``test`` (was task ``test``, split ``data``)."""
    from userland import sentiment_rows, write_rows

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sst2").mkdir()
    rows = [{**r, "label": {"neg": "bad", "pos": "good"}[r["label"]]} for r in sentiment_rows(12, 1)]
    write_rows(tmp_path / "sst2" / "test.jsonl", rows)
    out = cli("evaluate", tiny_classifier, "--data", "sst2/test.jsonl", "--json")
    got, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])
    assert (got["task"], got["split"]) == ("sst2", "test"), got


# ---------------------------------------------------------------- 3. reading verbs leave their inputs alone
def _snapshot(*folders) -> dict:
    """Every file under ``folders`` with its size and modification time (links followed)."""
    import os

    out = {}
    for folder in folders:
        for root, _, files in os.walk(folder, followlinks=True):
            for f in files:
                st = os.stat(os.path.join(root, f))
                out[os.path.join(root, f)] = (st.st_size, st.st_mtime_ns)
    return out


def test_reading_verbs_write_nothing_into_their_inputs(tiny_graft, tiny_bert, toy_data, tmp_path, monkeypatch):
    """inspect (before: distribution.png + .json into the graft folder), apply without --export and export leave the graft, the base model and the data as they were; inspect writes only where --out says."""
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tiny_graft, tiny_bert, toy_data)
    out = cli("inspect", tiny_graft)
    assert "grafted parameters" in out and "distribution.png" not in out
    cli("inspect", tiny_graft, "--out", tmp_path / "dist")
    assert {p.name for p in (tmp_path / "dist").iterdir()} == {"distribution.json", "distribution.png"}
    cli("apply", tiny_graft, "--model", tiny_bert, "--data-dir", toy_data)
    cli("export", tiny_graft, "--model", tiny_bert, "--to", "delta", "--out", tmp_path / "delta")
    assert _snapshot(tiny_graft, tiny_bert, toy_data) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["delta", "dist"]  # and nothing beside what was asked


# ---------------------------------------------------------------- 6. report details
def test_report_details_carried_head_run_folder_and_routed_share():
    """No "Carried task head: 0 parameters (travels whole…)"; a run's fine-tuned model named by its run folder (a
    Gemma run's scorer carries its base's name, gemma-3-270m); routed --keep grafts with their share of a
    checkpoint."""
    from types import SimpleNamespace as NS

    from skillgraft.verbs.graft import finetuned_name, parameters_line
    from skillgraft.verbs.merge_report import routed_keep_markdown

    line = parameters_line({"carried_parameters": 0, "total_parameters": 100, "graftable_parameters": 90})
    assert "0 parameters" not in line and "no carried task head" in line
    line = parameters_line({"carried_parameters": 1538, "total_parameters": 100, "graftable_parameters": 90})
    assert "+ 1,538 in the carried task head (travels whole" in line
    run = NS(inputs=NS(ft_dir=Path("runs/gemma-sst2")), ft=NS(base_model="gemma-3-270m"),
             pre=NS(base_model="gemma-3-270m"))
    assert finetuned_name(run) == "runs/gemma-sst2"
    pair = NS(inputs=NS(ft_dir=Path("/x/my-clf")), ft=NS(base_model="./my-clf"), pre=NS(base_model="base"))
    assert finetuned_name(pair) == "./my-clf"
    keep = {"size": 10, "universe": 1000, "reached": True, "selection_share": 0.95, "bound": 0.91,
            "selection_rows": 64, "test_share": 0.93, "bytes": 9_970_000}
    lines = routed_keep_markdown({"keep": {"sst2": keep}, "keep_target": 0.9, "keep_confidence": 0.9},
                                 {"sst2": {"checkpoint_bytes": 90_900_000}})
    row = next(line for line in lines if line.startswith("| sst2 |"))
    assert "share of checkpoint" in lines[lines.index(row) - 2] and row.endswith("| 10.97% |")


# ---------------------------------------------------------------- 4. work redone says why; what does not matter reruns nothing
def test_a_localization_reruns_only_for_what_it_reads_and_says_why(trained_run, toy_data, tmp_path, capsys):
    """The regions key holds the rows a localizer reads: other test rows rerun nothing (before: the test row count
    and the data files' digest were in it); other dev rows rerun the learned localizer (select_on=train+dev) with
    one line saying so, and never top-|Δ| (which reads no dev row)."""
    import dataclasses

    from skillgraft.pipeline.opening import from_run
    from skillgraft.pipeline.regions import learned_regions, localizer_options
    from skillgraft.pipeline.store import Store

    store = Store(tmp_path / "store")
    member = from_run(trained_run, data_dir=toy_data)
    learned = localizer_options("learned", {"budgets": [1e-2], "steps": 1})
    movement = localizer_options("movement", {"budgets": [1e-2]})

    def regions(m, loc, opts):
        learned_regions(m, store, loc, opts)
        return len(store.entries("regions", f"{m.task}-{m.k}-{m.seed}-{loc}")), capsys.readouterr().err

    assert regions(member, "learned", learned)[0] == 1
    assert regions(member, "movement", movement)[0] == 1
    fewer_test = dataclasses.replace(member.inputs, data=dataclasses.replace(member.data, test=member.data.test[:3]))
    member.inputs, kept = fewer_test, member.inputs
    member._identity = None
    assert regions(member, "learned", learned) == (1, "")  # test rows: not read by a localization
    member.inputs = dataclasses.replace(kept, data=dataclasses.replace(kept.data, dev=kept.data.dev[:-2]))
    member._identity = None
    n, err = regions(member, "learned", learned)
    assert n == 2 and err.strip() == "regions recomputed: dev rows changed and select_on=train+dev"
    assert regions(member, "movement", movement) == (1, "")  # top-|Δ| reads no dev row


@pytest.mark.slow
def test_one_mergekit_process_serves_every_merge_of_a_run(classifiers, tmp_path):
    """The real mergekit, imported once: two merges in one worker process (before: one mergekit-yaml process, and
    its ≈ 8 s of imports, per grid point), each task arithmetic exactly θ_pre + λ Σ_t τ_t on the body."""
    from skillgraft.merge.mergekit import MergekitWorker, body_module, mergekit_input, mergekit_yaml
    from skillgraft.models import build_scorer

    scorers = [build_scorer(str(p), "SST-2", "classifier") for p in
               (classifiers["base"], classifiers["sentiment"][0], classifiers["topic"][0])]
    dirs = []
    for i, s in enumerate(scorers):
        dirs.append(tmp_path / f"m{i}")
        mergekit_input(s, dirs[-1])
    worker = MergekitWorker()
    try:
        states, pids = [], []
        for lam in (0.5, 1.0):
            states.append(worker(mergekit_yaml("task_arithmetic", dirs[0], dirs[1:], {"weight": 1.0},
                                               {"lambda": lam}), tmp_path, 0))
            pids.append(worker.proc.pid)
    finally:
        worker.close()
    assert pids[0] == pids[1] and worker.proc is None
    body = [dict(body_module(s).named_parameters()) for s in scorers]
    name = next(n for n in body[0] if "query.weight" in n)
    key = next(k for k in states[0] if k.endswith(name))
    for lam, state in zip((0.5, 1.0), states):
        want = body[0][name] + lam * ((body[1][name] - body[0][name]) + (body[2][name] - body[0][name]))
        assert torch.allclose(state[key], want.detach(), atol=1e-5)
