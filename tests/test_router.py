"""Issue 78 items 1–2: the router stored with routed skills (fitted on each task's rows from the base model's own
pooled hidden states, read back with plain safetensors + JSON), routing with a confidence and a base fallback, and
scoring / generation through RoutedSkills with ``skill="auto"`` or a name — mixed batches grouped by skill (one swap
per group), θ_pre bit-exact after."""

from __future__ import annotations

import json

import pytest
import torch
from routing import CAUSAL_SKILLS, skill_rows, write_routed_folder

from skillgraft.errors import SkillgraftError


def _fitted(folder, kind="auto"):
    from skillgraft.graft.routed import RoutedSkills, attach_router
    from skillgraft.graft.router import fit_router

    skills = RoutedSkills.from_pretrained(folder)
    attach_router(folder, fit_router(skills, skill_rows(40, 0), skill_rows(16, 1), kind))
    return RoutedSkills.from_pretrained(folder)


@pytest.fixture(scope="module")
def classifier_folder(tiny_models, tmp_path_factory):
    folder = write_routed_folder(tiny_models["bert"], tmp_path_factory.mktemp("router") / "routed")
    _fitted(folder)
    return folder


@pytest.fixture(scope="module")
def causal_skills(tiny_models, tmp_path_factory):
    folder = write_routed_folder(tiny_models["llama"], tmp_path_factory.mktemp("router-causal") / "routed",
                                 "causal", CAUSAL_SKILLS, count=2000, scale=1.0)
    return _fitted(folder, "centroid")


def test_router_is_plain_files_routes_held_out_rows_and_says_its_confidence(classifier_folder):
    from safetensors.torch import load_file

    from skillgraft.graft.routed import RoutedSkills

    record = json.loads((classifier_folder / "routed.json").read_text())
    meta = json.loads((classifier_folder / record["router"] / "router.json").read_text())
    tensors = load_file(str(classifier_folder / "router" / "router.safetensors"))
    from skillgraft.graft.router import ROUTERS

    assert meta["tasks"] == ["sentiment", "topic"] and meta["kind"] in ROUTERS.members
    assert set(meta["accuracy"]) == {"centroid", "probe", "centroid-layers", "probe-layers"}  # auto: all on dev
    chosen = meta["accuracy"][meta["kind"]]["dev"]
    assert chosen == max(a["dev"] for a in meta["accuracy"].values())
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert not list(classifier_folder.rglob("*.pkl")) and not list(classifier_folder.rglob("*.bin"))
    skills = RoutedSkills.from_pretrained(classifier_folder)
    test = skill_rows(30, 7)
    routes = skills.route(test["sentiment"] + test["topic"])
    truth = ["sentiment"] * 30 + ["topic"] * 30
    assert sum(r.skill == t for r, t in zip(routes, truth)) >= 54  # ≥ 90 % on held-out rows
    assert all(0.5 <= r.confidence <= 1 and not r.to_base for r in routes)
    base = skills.route(test["topic"][:3], threshold=1.0)  # nothing reaches certainty: every row to the base
    assert [r.skill for r in base] == ["base"] * 3 and all(r.to_base and r.best == "topic" for r in base)


def test_a_folder_without_a_router_still_loads_and_says_so_in_one_line(tiny_models, tmp_path):
    from skillgraft.graft.routed import RoutedSkills

    folder = write_routed_folder(tiny_models["bert"], tmp_path / "routed")  # as merge --routed wrote it before
    skills = RoutedSkills.from_pretrained(folder)
    assert skills.router is None
    with pytest.raises(SkillgraftError, match="no router"):
        skills.route(["a good film"])
    assert skills.score(["a good film"], skill="topic")[0].skill == "topic"  # a named skill needs no router


def test_a_damaged_router_is_one_line_naming_the_file(classifier_folder, tmp_path):
    import shutil

    from skillgraft.graft.routed import RoutedSkills

    folder = tmp_path / "routed"
    shutil.copytree(classifier_folder, folder)
    meta = folder / "router" / "router.json"
    record = json.loads(meta.read_text())
    meta.write_text(json.dumps({**record, "tasks": ["topic", "sentiment"]}))
    with pytest.raises(SkillgraftError, match="router.json: field 'tasks'"):
        RoutedSkills.from_pretrained(folder)
    meta.write_text(json.dumps({**record, "kind": "pickle"}))
    with pytest.raises(SkillgraftError, match="unknown router 'pickle'"):
        RoutedSkills.from_pretrained(folder)
    assert record["dev_routes"]  # what serve's /v1/models reads: a damaged one is refused on reading, not served
    for bad in ([1, 2], {"sentiment": {"topic": -1}}, {"sentiment": {"elsewhere": 3}}, {"nobody": {}}):
        meta.write_text(json.dumps({**record, "dev_routes": bad}))
        with pytest.raises(SkillgraftError, match="router.json: field 'dev_routes'"):
            RoutedSkills.from_pretrained(folder)
    meta.write_text(json.dumps(record))
    (folder / "router" / "router.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(SkillgraftError, match="router.safetensors"):
        RoutedSkills.from_pretrained(folder)


def test_mixed_batch_scored_one_swap_per_skill_each_row_as_its_skill_alone(classifier_folder):
    from skillgraft.graft.routed import RoutedSkills

    skills = RoutedSkills.from_pretrained(classifier_folder)
    before = {k: v.clone() for k, v in skills.model.state_dict().items()}
    test = skill_rows(4, 3)
    texts = [t for pair in zip(test["sentiment"], test["topic"]) for t in pair]  # interleaved skills
    swaps = skills.swaps
    rows = skills.score(texts, skill="auto")
    assert skills.swaps - swaps == 2  # one swap per skill group, not per row
    assert [r.skill for r in rows] == ["sentiment", "topic"] * 4
    for text, row in zip(texts, rows):
        alone = skills.score([text], skill=row.skill)[0]
        assert row.label == alone.label and row.digest == alone.digest == skills.digests[row.skill]
        assert set(row.probabilities) == set(skills.labels[row.skill])
        assert all(abs(row.probabilities[k] - alone.probabilities[k]) < 1e-5 for k in row.probabilities)
        assert row.confidence is not None and alone.confidence is None
    low = skills.score(texts[:2], skill="auto", threshold=1.0)
    assert [(r.skill, r.label, r.probabilities) for r in low] == [("base", None, {})] * 2
    after = skills.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(SkillgraftError, match="no skill 'nope'"):
        skills.score(texts, skill="nope")
    with pytest.raises(SkillgraftError, match="not causal LMs"):
        skills.generate(texts, skill="topic")


def test_generation_routed_and_grouped_matches_each_skill_on_its_own_rows(causal_skills):
    skills = causal_skills
    before = {k: v.clone() for k, v in skills.model.state_dict().items()}
    test = skill_rows(3, 5)
    prompts = [t for pair in zip(test["sentiment"], test["topic"]) for t in pair]
    out = skills.generate(prompts, skill="auto", max_new_tokens=6)
    assert {g.skill for g in out} <= {"sentiment", "topic"} and len({g.skill for g in out}) == 2
    for name in ("sentiment", "topic"):
        mine = [p for p, g in zip(prompts, out) if g.skill == name]
        alone = skills.generate(mine, skill=name, max_new_tokens=6)
        assert [g.text for g in alone] == [g.text for p, g in zip(prompts, out) if g.skill == name]
        assert all(g.digest == skills.digests[name] and g.completion_tokens <= 6 for g in alone)
    texts = {name: skills.generate(prompts[:2], skill=name, max_new_tokens=6) for name in ("sentiment", "topic",
                                                                                        "base")}
    assert len({tuple(g.text for g in v) for v in texts.values()}) > 1  # the skills change what is generated
    assert all(g.finish_reason in ("stop", "length") for g in out)
    after = skills.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(SkillgraftError, match="not classifiers"):
        skills.score(prompts, skill="topic")


def test_every_layer_router_stores_its_width_and_routes_each_row_with_a_confidence(tiny_models, tmp_path):
    """probe-layers reads the mean of every layer's hidden states (embeddings included): its tensors are that wide,
    router.json says so, and a reloaded router routes each held-out row with its probability (threshold → base)."""
    from safetensors.torch import load_file

    from skillgraft.graft.routed import RoutedSkills

    folder = write_routed_folder(tiny_models["bert"], tmp_path / "routed")
    skills = _fitted(folder, "probe-layers")
    meta = json.loads((folder / "router" / "router.json").read_text())
    assert meta["kind"] == "probe-layers" and meta["layers"] == "all"
    config = skills.model.config
    width = (config.num_hidden_layers + 1) * config.hidden_size
    assert load_file(str(folder / "router" / "router.safetensors"))["weight"].shape == (2, width)
    assert skills.router.layers == "all"
    test = skill_rows(20, 7)
    routes = skills.route(test["sentiment"] + test["topic"])
    truth = ["sentiment"] * 20 + ["topic"] * 20
    assert sum(r.skill == t for r, t in zip(routes, truth)) >= 36
    assert all(0.5 <= r.confidence <= 1 for r in routes)
    assert [r.skill for r in skills.route(test["topic"][:2], threshold=1.0)] == ["base", "base"]
    again = RoutedSkills.from_pretrained(folder).route(test["topic"][:4])
    assert [(r.skill, round(r.confidence, 5)) for r in again] == [(r.skill, round(r.confidence, 5))
                                                                  for r in routes[20:24]]


def test_a_text_pair_is_routed_among_the_pair_skills_and_a_single_text_among_the_others(tiny_models, tmp_path):
    """The router records which tasks read text pairs: a row's shape decides between skills of different shapes
    (a pair that reads like sentiment still goes to the pair skill, with the confidence renormalized), the
    words decide within a shape; a router without the record (written before) routes every row by its words."""
    from skillgraft.graft.routed import RoutedSkills, attach_router
    from skillgraft.graft.router import fit_router

    folder = write_routed_folder(tiny_models["bert"], tmp_path / "routed")
    skills = RoutedSkills.from_pretrained(folder)
    attach_router(folder, fit_router(skills, skill_rows(40, 0), skill_rows(16, 1), "centroid",
                                     pairs={"sentiment": False, "topic": True}))
    meta = json.loads((folder / "router" / "router.json").read_text())
    assert meta["pairs"] == [False, True]
    skills = RoutedSkills.from_pretrained(folder)
    sentiment = skill_rows(6, 9)["sentiment"]
    assert [r.skill for r in skills.route(sentiment)] == ["sentiment"] * 6  # shape not said: words decide
    as_pairs = skills.route(sentiment, paired=True)
    assert [r.skill for r in as_pairs] == ["topic"] * 6 and all(r.confidence == 1.0 for r in as_pairs)
    mixed = skills.route(sentiment[:2], paired=[True, False])
    assert [r.skill for r in mixed] == ["topic", "sentiment"]
    scored = skills.score(sentiment[:3], "auto", pairs=sentiment[3:])  # a pair request: only the pair skill
    assert [r.skill for r in scored] == ["topic"] * 3
    with pytest.raises(SkillgraftError, match="2 texts but 3 paired flags"):
        skills.route(sentiment[:2], paired=[True, False, True])
    record = json.loads((folder / "router" / "router.json").read_text())
    (folder / "router" / "router.json").write_text(json.dumps({**record, "pairs": [True]}))
    with pytest.raises(SkillgraftError, match="router.json: field 'pairs'"):
        RoutedSkills.from_pretrained(folder)
    del record["pairs"]  # as written before the field existed: no restriction
    (folder / "router" / "router.json").write_text(json.dumps(record))
    old = RoutedSkills.from_pretrained(folder)
    assert old.router.pairs is None
    assert [r.skill for r in old.route(sentiment, paired=True)] == ["sentiment"] * 6


TEMPLATE = "*cls**sent_0*_It_was*mask*."  # SST-2's causal template


def _reference_logp(skills, model, text: str, word: str) -> float:
    """Σ log p of ``word``'s tokens after ``text`` in TEMPLATE as the causal scorer renders it (models/templates.py
    ``render``): one unpadded sequence, the full logits (plain transformers)."""
    from skillgraft.data.loading import Example
    from skillgraft.models.templates import render, word_ids

    ids, _ = render(TEMPLATE, Example(text, 0), skills.tokenizer, 128, causal=True)
    w = word_ids(skills.tokenizer, word)
    logp = torch.log_softmax(model(input_ids=torch.tensor([ids + w])).logits[0].float(), -1)
    return sum(float(logp[len(ids) - 1 + j, t]) for j, t in enumerate(w))


def test_causal_skills_with_label_words_score_each_prompt_routed_and_grouped(tiny_models, tmp_path):
    """merge --routed --mode causal keeps each task's label words: score reads them after each prompt (Σ log p of
    the word's tokens, padded batches equal to one unpadded sequence each, tokenized as the causal scorer renders
    the template), auto's mixed batch gives each row what
    its skill gives it alone, θ_pre bit-exact after; pairs and skills without words are refused in one line."""
    from skillgraft.graft.routed import RoutedSkills
    from skillgraft.graft.routed_calls import word_logp

    folder = write_routed_folder(tiny_models["llama"], tmp_path / "routed", "causal", CAUSAL_SKILLS, count=2000,
                                 scale=1.0, words=True)
    record = json.loads((folder / "routed.json").read_text())
    assert record["tasks"]["sentiment"]["label_words"] == ["terrible", "great"]
    skills = _fitted(folder, "centroid")
    assert skills.label_words["topic"] == record["tasks"]["topic"]["label_words"]
    before = {k: v.clone() for k, v in skills.model.state_dict().items()}
    from skillgraft.data.loading import Example
    from skillgraft.models.templates import template_text

    test = skill_rows(4, 5)
    texts = [t for pair in zip(test["sentiment"], test["topic"]) for t in pair]
    prompts = [template_text(TEMPLATE, Example(t, 0)).strip() for t in texts]  # as the router reads a request
    alone = {name: skills.score(prompts, skill=name) for name in ("sentiment", "topic")}
    for name, rows in alone.items():
        words = skills.label_words[name]
        assert all(r.label in record["tasks"][name]["labels"] and r.skill == name for r in rows)
        with skills.use(name) as model, torch.no_grad():
            for text, row in zip(texts, rows):
                ref = torch.softmax(torch.tensor([_reference_logp(skills, model, text, w) for w in words]), -1)
                assert torch.allclose(torch.tensor(list(row.probabilities.values())), ref, atol=1e-5)
    # one word of several tokens (a forward per label) against the reference too
    from skillgraft.models.templates import word_ids

    assert len(word_ids(skills.tokenizer, "great")) == 1 and len(word_ids(skills.tokenizer, "zebrafish")) > 1
    with skills.use("sentiment") as model, torch.no_grad():
        got = word_logp(skills, model, prompts[:3], ["great", "zebrafish"], 64)
        ref = [[_reference_logp(skills, model, t, w) for w in ("great", "zebrafish")] for t in texts[:3]]
        assert torch.allclose(got, torch.tensor(ref), atol=1e-4)
    assert len({tuple(r.label for r in rows) for rows in alone.values()}) > 1 or \
        alone["sentiment"][0].probabilities != alone["topic"][0].probabilities
    auto = skills.score(prompts, skill="auto")
    assert len({r.skill for r in auto}) == 2
    for i, row in enumerate(auto):
        assert row.label == alone[row.skill][i].label and row.digest == skills.digests[row.skill]
    after = skills.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(SkillgraftError, match="not text pairs"):
        skills.score(prompts[:2], skill="topic", pairs=prompts[:2])


def test_dev_routes_name_the_tasks_whose_requests_look_alike(tiny_models, tmp_path):
    """fit_router records where each task's dev rows went; two tasks asked of the same texts (no router can tell
    them apart) are flagged by ``confused`` and named in the merge report's line, distinct ones are not."""
    from skillgraft.graft.routed import RoutedSkills
    from skillgraft.graft.router import confused, dev_routes, fit_router
    from skillgraft.verbs.merge_report import router_lines

    assert dev_routes(["a", "b"], [0, 0, 0, 1], [0, 1, 1, 1]) == {"a": {"b": 2, "a": 1}, "b": {"b": 1}}
    assert confused({"a": {"a": 9, "b": 1}, "b": {"b": 10}}) == {"a": {"b": 0.1}}  # 10 %: at the threshold
    assert confused({"a": {"a": 91, "b": 9}}) == {}
    skills = RoutedSkills.from_pretrained(write_routed_folder(tiny_models["bert"], tmp_path / "routed"))
    apart = fit_router(skills, skill_rows(40, 0), skill_rows(16, 1), "centroid")
    assert confused(apart.info["dev_routes"]) == {}  # held-out rows of distinct words: each to its own skill
    same = skill_rows(40, 0)["sentiment"]
    dev = skill_rows(16, 1)["sentiment"]
    alike = fit_router(skills, {"sentiment": same, "topic": same}, {"sentiment": dev, "topic": dev}, "centroid")
    routes = alike.info["dev_routes"]
    assert all(sum(r.values()) == 16 for r in routes.values())
    # one text, one route: each dev text went to the same skill for both tasks, so one task lost all of them
    assert routes["sentiment"] == {k: routes["topic"][k] for k in routes["sentiment"]}
    flagged = confused(routes)
    assert flagged and all(set(v) <= {"sentiment", "topic"} - {t} for t, v in flagged.items())
    lines = router_lines({"kind": "centroid", **alike.info})
    task = next(iter(flagged))
    assert any(f"of {task}'s dev rows to" in line and f'`skill="{task}"`' in line for line in lines)
    assert len(router_lines({"kind": "centroid", **apart.info})) == 1  # only the router's own line
