"""``skillgraft merge`` (issue 24): stitching several fine-tuned models of one base, beside mergekit's merges.

The fine-tuned checkpoints are trained in-test by plain transformers code (tiny BERT classifiers with different
label sets, tiny Llama SFT pairs); the merged checkpoint is read back with plain transformers only.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from userland import cli, fake_mergekit, merge_args, sft_rows, train_sft, write_rows

from skillgraft.errors import SkillgraftError
from skillgraft.graft import Graft, Region
from skillgraft.graft.merge import scaled, stitch, swapped, task_view

# The reading side: plain transformers + safetensors only, in a fresh interpreter (no skillgraft import).
READER = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer
    folder, task, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    model = AutoModelForSequenceClassification.from_pretrained(f"{folder}/tasks/{task}").eval()
    tok = AutoTokenizer.from_pretrained(f"{folder}/tasks/{task}")
    body = AutoModel.from_pretrained(f"{folder}/tasks/{task}")
    with torch.no_grad():
        logits = model(**tok(texts, return_tensors="pt", padding=True)).logits
    assert "skillgraft" not in sys.modules
    print(json.dumps({"logits": logits.tolist(), "labels": [model.config.id2label[i] for i in range(logits.shape[1])],
                      "body": {k: v.flatten()[:50].tolist() for k, v in body.state_dict().items()}}))
""")


@pytest.fixture(scope="module")
def merged(classifiers, tmp_path_factory) -> tuple[Path, str]:
    """``skillgraft merge`` of the two classifiers (mergekit stood in for by :func:`fake_mergekit`)."""
    out = tmp_path_factory.mktemp("merged") / "out"
    text = cli(*merge_args(classifiers, out, "--localizer", "movement", "--budget", "0.05", "--mergekit",
                           "ties,task_arithmetic", "--scales", "0.5,1.5", "--densities", "0.5", "--rules",
                           "average,max-delta,disjoint"), obj={"mergekit_runner": fake_mergekit})
    return out, text


def test_each_task_gets_a_merged_classifier(merged):
    """Writing ``tasks/<task>/`` reads no released θ_ft back (the bench has no way to: each θ_ft's weights are read
    from its files once, tests/test_run_floors.py::test_a_merge_resolves_each_model_once): each task's classifier is
    its θ_pre scorer holding the merged body, θ_ft's carried head and θ_ft's config and tokenizer, kept when θ_ft was
    released (the end-to-end tests below check what is written)."""
    out, _ = merged
    assert {p.name for p in (out / "tasks").iterdir()} == {"sentiment", "topic"}


def stitched_topic(classifiers, out: Path, texts: list[str]):
    """(logits of the stitched model for the topic task, computed in memory by skillgraft, and its body)."""
    from skillgraft.models import build_scorer
    from skillgraft.pipeline.opening import task_from_record

    g = {n: Graft.from_pretrained(out / "grafts" / n) for n in ("sentiment", "topic")}
    pre = build_scorer(str(classifiers["base"]), task_from_record(g["topic"].metadata.task_spec), "classifier")
    base = dict(pre.named_parameters())
    lam = json.loads((out / "merge.json").read_text())["headline"]["stitch_scale"]
    body = scaled(stitch([g["sentiment"], g["topic"]], "average", base=base), lam, base)
    with task_view(body, g["topic"]).applied(pre), torch.no_grad():
        return pre.model(**pre.tokenizer(texts, return_tensors="pt", padding=True)).logits


def written_topic(classifiers, out: Path, texts: list[str]):
    """Logits for the topic task of the merged model ``merge`` wrote (its best one-model merge on dev): the stitch
    (:func:`stitched_topic`), or a body of :func:`fake_mergekit` (θ_0 + λ Σ_t (θ_t − θ_0), θ_0 = θ_pre, or the first
    model for ``linear``) with the topic head, computed with plain transformers."""
    import transformers as tf

    s = json.loads((out / "merge.json").read_text())
    w = next(r for r in s["rows"] if r.get("written"))
    if w["method"] == "stitch":
        return stitched_topic(classifiers, out, texts)
    lam = (w.get("global") or {}).get("lambda", 1.0)
    first = classifiers["base"] if w["method"] != "mergekit linear" else classifiers["sentiment"][0]
    body = {p: tf.AutoModel.from_pretrained(p).state_dict()
            for p in (first, classifiers["sentiment"][0], classifiers["topic"][0])}
    b0 = body[first]
    merged = {k: b0[k] + lam * sum(body[p][k] - b0[k] for p in (classifiers["sentiment"][0], classifiers["topic"][0]))
              for k in b0 if "pooler" not in k}
    model = tf.AutoModelForSequenceClassification.from_pretrained(classifiers["topic"][0]).eval()
    model.base_model.load_state_dict(merged, strict=False)
    tok = tf.AutoTokenizer.from_pretrained(classifiers["topic"][0])
    with torch.no_grad():
        return model(**tok(texts, return_tensors="pt", padding=True)).logits


def test_merge_classifiers_end_to_end(classifiers, merged):
    """Localize both pairs, stitch under three rules, compare with a mergekit grid chosen on dev, write a checkpoint
    per task that plain transformers loads with the model's own class, computing the stitched model exactly."""
    out, text = merged
    assert "stitch" in text and "mergekit ties" in text
    s = json.loads((out / "merge.json").read_text())
    assert set(s["tasks"]) == {"sentiment", "topic"} and s["mode"] == "classifier"
    assert [len(t["labels"]) for t in s["tasks"].values()] == [2, 3]
    rows = {(r["method"], r["config"]): r for r in s["rows"]}
    assert {("stitch", r) for r in ("average", "max-delta", "disjoint")} <= set(rows)
    ft = rows[("fine-tuned", "each task's own model")]
    assert ft["mean_normalized"] == pytest.approx(1.0)
    assert ft["mean_accuracy"] > 0.8  # the toy tasks are learnt
    for method in ("mergekit ties", "mergekit task_arithmetic"):  # defaults + the dev-best setting reach the test
        grid = [r for r in s["rows"] if r["method"] == method]
        assert len(grid) == 3 and sum(r["chosen_on_dev"] for r in grid) == 1
        assert all(r["dev_mean_normalized"] > 0 for r in grid)
        assert all(r["on_test"] == (r["config"] == "defaults" or r["chosen_on_dev"]) for r in grid)
        best = max(grid, key=lambda r: r["dev_mean_normalized"])
        assert best["chosen_on_dev"] and best["bytes_per_task"] == ft["bytes_per_task"]
    # the stitch's λ grid (default 1, 1.5, 2, 3): every λ scored on dev, per rule λ = 1 and the dev-best on test;
    # the stitch's candidate is the average rule at its dev-best λ; the written model, the best candidate on dev
    for rule in ("average", "max-delta", "disjoint"):
        grid = [r for r in s["rows"] if r["method"] == "stitch" and r["config"].split(" ")[0] == rule]
        assert sorted(r["scale"] for r in grid) == [1.0, 1.5, 2.0, 3.0]
        best = max(grid, key=lambda r: r["dev_mean_normalized"])
        assert [r["scale"] for r in grid if r["chosen_on_dev"]] == [best["scale"]]
        assert all(r["on_test"] == (r["scale"] == 1.0 or r["chosen_on_dev"]) for r in grid)
    mine = [r for r in s["rows"] if r["method"] == "stitch" and r.get("writable")]
    assert len(mine) == 1 and mine[0]["config"].startswith("average") and mine[0]["chosen_on_dev"]
    assert s["headline"]["stitch_scale"] == mine[0]["scale"]
    assert s["headline"]["stitch_mean_normalized"] == mine[0]["mean_normalized"]
    written = [r for r in s["rows"] if r.get("written")]
    assert len(written) == 1 and written[0]["writable"]
    assert all(written[0]["dev_mean_normalized"] >= r["dev_mean_normalized"] for r in s["rows"] if r.get("writable"))
    assert s["headline"]["stitch_scale_1_mean_normalized"] == rows[("stitch", "average")]["mean_normalized"]
    # bytes per task: a graft is a few KiB, a checkpoint is the whole model
    stitch_row = rows[("stitch", "average")]
    assert 0 < stitch_row["bytes_per_task"] < 0.5 * ft["bytes_per_task"]
    assert s["headline"]["max_graft_share_of_checkpoint"] < 0.5
    report = (out / "report.md").read_text()
    assert "normalized" in report and "mergekit" in report and "body only" in report
    # where each task's test rows came from, in merge.json, report.md and on the command line (issue 80)
    for name, t in s["tasks"].items():
        assert t["evaluated_on"].startswith(f"{t['test']} rows: ") and f"{name}: {t['evaluated_on']}" in report
        assert f"{name}: evaluated on {t['evaluated_on']}" in " ".join(text.split())
    # the written checkpoints, read with plain transformers calls: each task's labels, the stitched model's logits,
    # and one body shared by every task
    import transformers as tf

    texts = ["the news said football today", "a good film", "market said"]
    model = tf.AutoModelForSequenceClassification.from_pretrained(out / "tasks" / "topic").eval()
    assert [model.config.id2label[i] for i in range(3)] == ["money", "sport", "vote"]
    tok = tf.AutoTokenizer.from_pretrained(out / "tasks" / "topic")
    with torch.no_grad():
        got = model(**tok(texts, return_tensors="pt", padding=True)).logits
    assert (got - written_topic(classifiers, out, texts)).abs().max() <= 1e-5
    bodies = [tf.AutoModel.from_pretrained(out / "tasks" / t).state_dict() for t in ("sentiment", "topic")]
    shared = [k for k in bodies[0] if "pooler" not in k]  # the pooler is each task's own here (θ_pre has none)
    assert shared and all(torch.equal(bodies[0][k], bodies[1][k]) for k in shared)
    assert (out / "README.md").read_text().count("AutoModelForSequenceClassification.from_pretrained") == 1
    assert s["headline"]["written"] in (out / "README.md").read_text() or \
        f"strength λ = {s['headline']['stitch_scale']:g}" in (out / "README.md").read_text()


def test_merged_checkpoint_reads_without_skillgraft(classifiers, merged, clean_python):
    """A fresh interpreter with transformers only (no skillgraft import) computes the merged model written."""
    out, _ = merged
    texts = ["the news said football today", "a good film", "market said"]
    r = clean_python.run(READER, out, "topic", json.dumps(texts), check=True)
    read = json.loads(r.stdout)
    assert read["labels"] == ["money", "sport", "vote"]
    assert (torch.tensor(read["logits"]) - written_topic(classifiers, out, texts)).abs().max() <= 1e-5


def test_stitch_rules_on_overlap():
    """average = mean of the claiming tasks' values; max-delta = largest |θ_ft − θ_pre|; disjoint = θ_pre."""
    shapes = {"w": (4,)}
    base = {"w": torch.tensor([0.0, 0.0, 1.0, 0.0])}
    a = Graft(Region(shapes, {"w": torch.tensor([0, 2])}), {"w": torch.tensor([1.0, 3.0])}, {"h": torch.ones(2)},
              "toy", "fp", {"task": "a"})
    b = Graft(Region(shapes, {"w": torch.tensor([2, 3])}), {"w": torch.tensor([-4.0, 5.0])}, {"h": torch.zeros(3)},
              "toy", "fp", {"task": "b"})

    def values(rule):
        g = stitch([a, b], rule, base=base)
        assert not g.carried
        return dict(zip(g.region.indices["w"].tolist(), g.values["w"].tolist()))

    assert values("average") == {0: 1.0, 2: -0.5, 3: 5.0}
    assert values("max-delta") == {0: 1.0, 2: -4.0, 3: 5.0}  # |−4 − 1| > |3 − 1|
    assert values("disjoint") == {0: 1.0, 3: 5.0}
    view = task_view(stitch([a, b], "average", base=base), b)
    assert torch.equal(view.carried["h"], torch.zeros(3)) and len(view.region) == 3
    with pytest.raises(SkillgraftError, match="needs the base model"):
        stitch([a, b], "max-delta")
    with pytest.raises(SkillgraftError, match="unknown overlap rule"):
        stitch([a, b], "mean")
    # strength λ: θ_pre + λ (v − θ_pre) on the stitch's region (sparse task arithmetic); λ = 1 is the stitch itself
    body = stitch([a, b], "average", base=base)
    assert scaled(body, 1.0, base) is body
    twice = scaled(body, 2.0, base)
    assert dict(zip(twice.region.indices["w"].tolist(), twice.values["w"].tolist())) == {0: 2.0, 2: -2.0, 3: 10.0}
    assert twice.metadata.stitch["scale"] == 2.0 and twice.metadata.stitch["rule"] == "average"
    with pytest.raises(SkillgraftError, match="scale must be > 0"):
        scaled(body, 0.0, base)


def test_swapped_restores_bit_exactly():
    m = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(RuntimeError), swapped(m, {"weight": torch.zeros(2, 3)}):
        assert torch.equal(m.weight, torch.zeros(2, 3))
        raise RuntimeError("boom")
    assert all(torch.equal(m.state_dict()[k], v) for k, v in before.items())
    with pytest.raises(SkillgraftError, match="shape"), swapped(m, {"weight": torch.zeros(3, 3)}):
        pass


def test_bad_inputs_are_one_line_before_any_weights_load(classifiers, tiny_models, tmp_path, monkeypatch):
    import skillgraft.pipeline.opening as setup_mod

    def no_loading(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(setup_mod, "from_pair", no_loading)
    c = classifiers
    out = tmp_path / "o"
    args = merge_args(c, out)
    # a model without data
    text = cli(*[a for a in args if a != c["topic"][1]][:9], "--eval-data", c["sentiment"][2], "--out", out, code=2)
    assert "2 fine-tuned models but 1 --data" in text
    # the same model twice (also under another path)
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(c["sentiment"][0], copy)
    bad = merge_args(c, out)
    bad[bad.index(str(c["topic"][0]))] = str(copy)
    assert "same model as --finetuned" in cli(*bad, code=2)
    bad[bad.index(str(copy))] = str(c["base"])
    assert "same model as the --pretrained model" in cli(*bad, code=2)
    assert "1 --eval-data: give one per model or none" in cli(*merge_args(c, out)[:-6], "--eval-data", c["topic"][2],
                                                             "--out", out, code=2)
    # a model of another architecture / shape
    bad = merge_args(c, out)
    bad[bad.index(str(c["topic"][0]))] = str(tiny_models["gpt2"])
    assert "different architectures" in cli(*bad, code=2)
    import transformers as tf

    wide = tmp_path / "wide"
    cfg = tf.AutoConfig.from_pretrained(c["base"])
    cfg.intermediate_size = 48
    tf.BertForSequenceClassification(cfg).save_pretrained(wide)
    tf.AutoTokenizer.from_pretrained(c["base"]).save_pretrained(wide)
    bad[bad.index(str(tiny_models["gpt2"]))] = str(wide)
    assert "different shapes: intermediate_size" in cli(*bad, code=2)
    # one model only, a missing data file, the output folder exists
    assert "at least two fine-tuned models" in cli("merge", "--pretrained", c["base"], "--finetuned", c["topic"][0],
                                                   "--data", c["topic"][1], "--out", out, code=2)
    bad = merge_args(c, out)
    bad[bad.index(str(c["topic"][1]))] = str(tmp_path / "nope.jsonl")
    assert "data file not found" in cli(*bad, code=2)
    out.mkdir()
    assert "already exists" in cli(*merge_args(c, out), code=2)
    assert "--rule" in cli(*merge_args(c, tmp_path / "p", "--rule", "mean"), code=2)
    assert "--stitch-scales" in cli(*merge_args(c, tmp_path / "p", "--stitch-scales", ""), code=2)  # no λ to choose
    assert "has no option steps" in cli(*merge_args(c, tmp_path / "p", "--localizer", "movement", "--steps", "3"),
                                        code=2)


def test_merge_causal_lm_sft_pairs(tiny_models, tmp_path, monkeypatch):
    """Two tiny Llama SFT models (different completion words) merge into one AutoModelForCausalLM; a per-model data
    spec (.yaml) gives each its fields; the mergekit grid runs on the whole models (no task head)."""
    base = tiny_models["llama"]
    rows_a = sft_rows(80)
    rows_b = [{"question": r["prompt"].replace("It was", "Verdict:"), "answer": {" terrible": " no", " great": " yes"}[
        r["completion"]]} for r in sft_rows(80, seed=3)]
    a = train_sft(base, tmp_path / "sft-a", rows_a, steps=25)
    b = train_sft(base, tmp_path / "sft-b", [{"prompt": r["question"], "completion": r["answer"]} for r in rows_b],
                  steps=25)
    data_a = write_rows(tmp_path / "a.jsonl", rows_a)
    write_rows(tmp_path / "b.jsonl", rows_b)
    (tmp_path / "b.yaml").write_text("data: b.jsonl\nprompt_field: question\ncompletion_field: answer\n")
    out = tmp_path / "merged"
    cli("merge", "--pretrained", base, "--finetuned", a, "--finetuned", b, "--data", data_a, "--data",
        tmp_path / "b.yaml", "--prompt-field", "prompt", "--completion-field", "completion", "--localizer", "learned",
        "--steps", "3", "--budget", "0.05", "--mergekit", "task_arithmetic", "--scales", "0.5", "--out", out,
        obj={"mergekit_runner": fake_mergekit})
    s = json.loads((out / "merge.json").read_text())
    assert s["mode"] == "generative" and set(s["tasks"]) == {"sft-a", "sft-b"}
    assert {r["config"] for r in s["rows"] if r["method"] == "mergekit task_arithmetic"} == {"defaults", "λ=0.5"}
    import transformers as tf

    merged = tf.AutoModelForCausalLM.from_pretrained(out / "model")
    g = [Graft.from_pretrained(out / "grafts" / n) for n in ("sft-a", "sft-b")]
    theta_pre = {f"model.{k}": v for k, v in tf.AutoModelForCausalLM.from_pretrained(base).named_parameters()}
    body = scaled(stitch(g, "average", base=theta_pre), s["headline"]["stitch_scale"], theta_pre)
    pre = {f"model.{k}": v for k, v in tf.AutoModelForCausalLM.from_pretrained(base).state_dict().items()}
    got = merged.state_dict()
    for name, idx in body.region.indices.items():
        assert torch.equal(got[name.removeprefix("model.")].reshape(-1)[idx], body.values[name])
    untouched = [n for n in pre if n not in body.region.indices and "embed" not in n and "lm_head" not in n]
    assert all(torch.equal(got[n.removeprefix("model.")], pre[n]) for n in untouched)


def test_grafts_instead_of_localizing(merged, tmp_path):
    """--grafts: the fine-tuned models and data each graft records are used; no localization, no mergekit."""
    first, _ = merged
    out = tmp_path / "again"
    cli("merge", "--grafts", first / "grafts" / "sentiment", "--grafts", first / "grafts" / "topic", "--mergekit", "",
        "--out", out)
    a, b = (json.loads((d / "merge.json").read_text()) for d in (first, out))
    pick = lambda s: {(r["method"], r["config"]): r["mean_accuracy"] for r in s["rows"]}  # noqa: E731
    assert pick(b)[("stitch", "average")] == pytest.approx(pick(a)[("stitch", "average")])
    assert pick(b)[("fine-tuned", "each task's own model")] == pick(a)[("fine-tuned", "each task's own model")]
    assert not [r for r in b["rows"] if r["method"].startswith("mergekit")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_mergekit_yaml_merges_the_bodies(classifiers, tiny_models, tmp_path, kind):
    """The real ``mergekit-yaml`` on what merge gives it: task_arithmetic equals θ_pre + λ Σ_t τ_t on the body
    (BERT classifiers: inside a zero-headed container of their own class; Llama: the whole causal LM)."""
    from skillgraft.models import build_scorer
    from skillgraft.merge.mergekit import body_module, body_state, mergekit_input, mergekit_yaml, run_mergekit

    if kind == "bert":
        paths = [c[0] for c in (classifiers["sentiment"], classifiers["topic"])]
        scorers = [build_scorer(str(p), task, "classifier") for p, task in zip(paths, ("SST-2", "SNLI"))]
        pre = build_scorer(str(classifiers["base"]), "SST-2", "classifier")
    else:
        a = train_sft(tiny_models["llama"], tmp_path / "a", sft_rows(40), steps=5)
        b = train_sft(tiny_models["llama"], tmp_path / "b", sft_rows(40, seed=2), steps=5)
        scorers = [build_scorer(str(p), "SST-2", "causal") for p in (a, b)]
        pre = build_scorer(str(tiny_models["llama"]), "SST-2", "causal")
    dirs = []
    for i, s in enumerate([pre, *scorers]):
        mergekit_input(s, tmp_path / f"in{i}")
        dirs.append(tmp_path / f"in{i}")
    merged = run_mergekit(mergekit_yaml("task_arithmetic", dirs[0], dirs[1:], {"weight": 1.0}, {"lambda": 0.5}),
                          tmp_path, 0)
    state = body_state(scorers[0], merged)
    ref = {n: t.detach() for n, t in body_module(pre).state_dict().items()}
    fts = [{n: t.detach() for n, t in body_module(s).state_dict().items()} for s in scorers]
    assert state and all("classifier" not in n and "score" not in n for n in state)
    for name, t in state.items():
        if "pooler" in name:  # tiny BERT has no pooler in θ_pre: it is each task's own (carried), never merged
            continue
        want = ref[name] + 0.5 * sum(f[name] - ref[name] for f in fts)
        assert torch.allclose(t, want, atol=1e-6), name
