"""Issue 35 on a causal LM (the Gemma routed comparison, bench/merge_gemma.py, in miniature): two "fine-tunes" of a
tiny Gemma-3 given as user data with their own ``--template`` and label words, merged with ``--mode causal
--routed`` (named by ``--names``); each routed skill, read back with plain transformers + safetensors, is θ_pre
with the graft's positions written in (no head: the label words are read off the tied LM head)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from userland import cli


def _finetune_like(base, out, seed: int):
    """θ_pre with a seeded nudge on a few body tensors, saved as a user's checkpoint (no training needed here)."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(base)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "mlp" in name or "norm" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out)
    tf.AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def _rows(path, words, n, seed):
    rng = random.Random(seed)
    path.write_text("".join(json.dumps({"text": f"row {rng.randint(0, 99)} says {w}", "label": w}) + "\n"
                            for w in (words[i % len(words)] for i in range(n))))


@pytest.fixture(scope="module")
def causal_run(tiny_models, tmp_path_factory):
    return _causal_merge(tiny_models["gemma3"], tmp_path_factory.mktemp("causal-routed"))


def _causal_merge(base, root, *extra):
    specs = {"sentiment": (["terrible", "great"], "{text} It was {label}."),
             "topic": (["World", "Sports"], "{text} Topic: {label}")}
    args = ["merge", "--pretrained", base, "--out", root / "out", "--mode", "causal", "--localizer", "movement",
            "--budgets", "0.02", "--mergekit", "", "--rules", "average", "--stitch-scales", "1", "--routed"]
    for i, (task, (words, template)) in enumerate(specs.items()):
        _rows(root / f"{task}.jsonl", words, 24, i)
        _rows(root / f"{task}-test.jsonl", words, 12, 10 + i)
        _rows(root / f"{task}-dev.jsonl", words, 12, 20 + i)
        (root / f"{task}.yaml").write_text(f"data: {task}.jsonl\neval_data: {task}-test.jsonl\n"
                                           f"template: '{template}'\nlabels: {words}\n")
        args += ["--finetuned", _finetune_like(base, root / f"ft-{i}" / "model", seed=i), "--names", task,
                 "--data", root / f"{task}.yaml", "--dev-data", root / f"{task}-dev.jsonl"]
    cli(*args, *extra)
    return root / "out", base


def test_routed_merge_fits_a_router_on_the_prompts_and_router_none_skips_it(causal_run, tmp_path):
    """Issue 78: merge --routed writes routed/router/ (fitted on each task's prompts as its template renders them,
    every kind measured on the dev rows; prompts are no text pairs) and names it in routed.json; --router none
    writes none."""
    import skillgraft

    out, base = causal_run
    s = json.loads((out / "merge.json").read_text())
    router = s["routed"]["router"]
    from skillgraft.graft.router import ROUTERS

    assert router["kind"] in ROUTERS.members and set(router["accuracy"]) == set(ROUTERS.members)  # every kind
    assert json.loads((out / "routed" / "router" / "router.json").read_text())["pairs"] == [False, False]
    assert router["rows"] == {"sentiment": 24, "topic": 24} and router["dev_rows"] == {"sentiment": 12, "topic": 12}
    assert json.loads((out / "routed" / "routed.json").read_text())["router"] == "router"
    routes = router["dev_routes"]  # where each task's 12 dev rows went, the report's line from the same record
    assert set(routes) == {"sentiment", "topic"} and all(sum(r.values()) == 12 for r in routes.values())
    own = (routes["sentiment"].get("sentiment", 0) + routes["topic"].get("topic", 0)) / 24
    assert own == pytest.approx(router["accuracy"][router["kind"]]["dev"])
    assert f"- router `{router['kind']}` for `skill=\"auto\"`: {100 * own:.1f} % of the dev rows" \
        in (out / "report.md").read_text()
    skills = skillgraft.RoutedSkills.from_pretrained(out / "routed")
    routes = skills.route(["row 5 says great It was", "row 7 says Sports Topic:"])
    assert all(r.skill in ("sentiment", "topic") and 0 < r.confidence <= 1 for r in routes)
    none, _ = _causal_merge(base, tmp_path, "--router", "none")
    assert not (none / "routed" / "router").exists() and "router" not in json.loads(
        (none / "routed" / "routed.json").read_text())
    assert "router" not in json.loads((none / "merge.json").read_text())["routed"]


def test_causal_routed_skill_is_pre_plus_graft_read_back_plainly(causal_run):
    import transformers as tf
    from plain import write_graft_in

    import skillgraft

    out, base = causal_run
    s = json.loads((out / "merge.json").read_text())
    assert s["mode"] == "causal" and set(s["routed"]["tasks"]) == {"sentiment", "topic"}
    skills = skillgraft.RoutedSkills.from_pretrained(out / "routed")
    ids = torch.tensor([[2, 10, 11, 12, 13, 14]])
    before = {k: v.clone() for k, v in skills.model.state_dict().items()}
    for task in ("sentiment", "topic"):
        folder = out / "routed" / "skills" / task
        plain = tf.AutoModelForCausalLM.from_pretrained(out / "routed" / "base").eval()
        assert not write_graft_in(dict(plain.named_parameters()), folder)  # no task head in causal mode
        with torch.no_grad():
            want = plain(input_ids=ids).logits
            with skills.use(task) as model:
                got = model(input_ids=ids).logits
        assert torch.allclose(got, want, atol=1e-5)
        assert not torch.allclose(want, tf.AutoModelForCausalLM.from_pretrained(base)(input_ids=ids).logits)
        after = skills.model.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_bad_template_in_a_model_data_spec_is_refused_naming_the_file(tiny_models, tmp_path):
    from badinputs import refused

    base = tiny_models["gemma3"]
    _rows(tmp_path / "a.jsonl", ["no", "yes"], 8, 0)
    (tmp_path / "a.yaml").write_text("data: a.jsonl\ntemplate: '{label} {text}'\n")
    refused(tmp_path, ["merge", "--pretrained", base, "--finetuned", base, "--finetuned", base, "--data",
                       tmp_path / "a.yaml", "--data", tmp_path / "a.jsonl", "--mode", "causal", "--out",
                       tmp_path / "out"], "a.yaml", "template", "{label} must come after")


@pytest.mark.parametrize(("names", "needle"), [
    (["a"], "2 fine-tuned models but 1 --names"),
    (["a", "a"], "--names 'a' is given twice"),
    (["a", "b/c"], "--names 'b/c': a name is letters"),
])
def test_bad_names_are_refused_in_one_line_before_any_weights_load(tiny_models, tmp_path, names, needle):
    from badinputs import refused

    base = tiny_models["gemma3"]
    _rows(tmp_path / "a.jsonl", ["no", "yes"], 8, 0)
    args = ["merge", "--pretrained", base, "--finetuned", base, "--finetuned", base, "--data", tmp_path / "a.jsonl",
            "--data", tmp_path / "a.jsonl", "--mode", "causal", "--out", tmp_path / "out"]
    refused(tmp_path, args + [x for n in names for x in ("--names", n)], needle)


def test_causal_routed_skills_score_their_test_prompts_as_the_merge_scored_them(causal_run):
    """Issue 78 on causal skills: routed.json keeps each task's label words, and RoutedSkills.score on a task's test
    prompts (its template up to the label, as the router reads them) gives the accuracy merge.json's graft row
    measured; auto on all tasks' prompts mixed routes and answers each row."""
    import skillgraft

    out, _ = causal_run
    s = json.loads((out / "merge.json").read_text())
    record = json.loads((out / "routed" / "routed.json").read_text())
    assert record["tasks"]["sentiment"]["label_words"] == ["terrible", "great"]
    assert record["tasks"]["topic"]["label_words"] == ["World", "Sports"]
    skills = skillgraft.RoutedSkills.from_pretrained(out / "routed")
    graft = next(r for r in s["rows"] if r["method"] == "graft" and r.get("sentiment:test") is not None)
    root = out.parent
    templates = {"sentiment": "{text} It was {label}.", "topic": "{text} Topic: {label}"}
    mixed, truth = [], []
    for task, template in templates.items():
        rows = [json.loads(line) for line in (root / f"{task}-test.jsonl").read_text().splitlines()]
        prompts = [template.split("{label}")[0].replace("{text}", r["text"]).strip() for r in rows]
        got = skills.score(prompts, skill=task)
        assert sum(g.label == r["label"] for g, r in zip(got, rows)) / len(rows) == pytest.approx(
            graft[f"{task}:test"], abs=1e-9)
        mixed += prompts
        truth += [r["label"] for r in rows]
    auto = skills.score(mixed, skill="auto")
    assert all(a.skill in templates and a.label in record["tasks"][a.skill]["labels"] for a in auto)
