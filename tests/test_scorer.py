import pytest
import torch

from skillgraft.data import Example, get_task, register_task, task_from_dict
from skillgraft.errors import SkillgraftError
from skillgraft.models import Scorer, build_scorer, freeze, param_groups, transformer_blocks
from skillgraft.models.templates import render

SST2 = get_task("SST-2")
EXAMPLES = [Example("the movie was great", 1), Example("a terrible plot", 0), Example(" ", 1)]
PAIRS = [Example("A man sleeps.", 1, "Someone rests."), Example("It rains.", 0, "The sun shines brightly.")]


@pytest.mark.parametrize("kind,mode", [("bert", "head"), ("bert", "prompt"), ("roberta", "head"),
                                       ("roberta", "prompt"), ("gpt2", "head"), ("gpt2", "causal"),
                                       ("llama", "head"), ("llama", "causal")])
def test_every_mode_gives_one_logit_per_label(tiny_models, kind, mode):
    scorer = build_scorer(str(tiny_models[kind]), "SST-2", mode)
    batch = scorer.collate(EXAMPLES)
    logits = scorer(**batch)
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()
    logits.sum().backward()  # differentiable through the whole model
    assert any(p.grad is not None for p in scorer.model.parameters())
    pair = build_scorer(str(tiny_models[kind]), "RTE", mode)
    assert pair(**pair.collate(PAIRS)).shape == (2, 2)


def test_prompt_mode_reads_mask_position(tiny_models):
    scorer = build_scorer(str(tiny_models["bert"]), "SST-2", "prompt")
    batch = scorer.collate(EXAMPLES[:1])
    ids = batch["input_ids"][0]
    assert ids[batch["score_pos"][0]] == scorer.tokenizer.mask_token_id
    tokens = scorer.tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "it" in tokens


def test_tied_decoder_fallback_warns(tiny_models, tmp_path):
    from tiny import build_tiny

    path = build_tiny("bert", tmp_path / "nohead", mlm_head=False)
    with pytest.warns(UserWarning, match="tied decoder"):
        scorer = build_scorer(str(path), "SST-2", "prompt")
    assert scorer.tied_decoder
    before = {n for n, _ in scorer.named_parameters()}
    assert all(n.startswith("model.") for n in before)  # no new parameters
    assert scorer(**scorer.collate(EXAMPLES)).shape == (3, 2)


def test_truncation_keeps_mask_and_template(tiny_models):
    scorer = build_scorer(str(tiny_models["bert"]), "SST-2", "prompt", max_length=16)
    long = Example("word " * 200, 1)
    batch = scorer.collate([long])
    ids = batch["input_ids"][0]
    assert len(ids) == 16
    assert ids[batch["score_pos"][0]] == scorer.tokenizer.mask_token_id
    assert ids[-1] == scorer.tokenizer.sep_token_id
    rte = build_scorer(str(tiny_models["roberta"]), "RTE", "prompt", max_length=24)
    ids, pos = render(get_task("RTE").template, Example("a " * 50, 0, "b " * 80), rte.tokenizer, 24)
    assert len(ids) == 24 and ids[pos] == rte.tokenizer.mask_token_id


def test_causal_multi_token_label_words_scored_whole(tiny_models):
    task = register_task(task_from_dict({"name": "multi", "kind": "single", "labels": ["0", "1"],
                                         "label_words": ["dreadfulness", "great"],
                                         "template": "*cls**sent_0*_It_was*mask*.*sep+*"}), overwrite=True)
    scorer = build_scorer(str(tiny_models["gpt2"]), task, "causal")
    assert len(scorer.label_ids[0]) > 1 and not scorer.single_token
    batch = scorer.collate(EXAMPLES[:2])
    logits = scorer(**batch)
    # the multi-token score is the sum of the log-probs of every token of the word, computed by hand
    ids = scorer.collate(EXAMPLES[:1])
    prompt = ids["input_ids"][0][: (ids["target_ids"][0] == -100).sum()].tolist()
    seq = torch.tensor([prompt + scorer.label_ids[0]])
    with torch.no_grad():
        logp = torch.log_softmax(scorer.model(seq).logits[0].float(), -1)
        expect = sum(logp[len(prompt) - 1 + j, t] for j, t in enumerate(scorer.label_ids[0]))
    assert torch.allclose(logits[0, 0].detach(), expect, atol=1e-4)
    with pytest.raises(SkillgraftError, match="tokens for this tokenizer"):
        build_scorer(str(tiny_models["roberta"]), task, "prompt")


def test_causal_single_token_matches_next_token_logprob(tiny_models):
    scorer = build_scorer(str(tiny_models["llama"]), "SST-2", "causal")
    assert scorer.single_token
    batch = scorer.collate(EXAMPLES[:1])
    n = int(batch["attention_mask"][0].sum())
    with torch.no_grad():
        out = scorer(**batch)
        ref = torch.log_softmax(scorer.model(batch["input_ids"][:, :n]).logits[0, -1], -1)[scorer.label_token_ids]
    assert torch.allclose(out[0], ref, atol=1e-5)


def test_blocks_found_by_structure_not_name(tmp_path):
    from tiny import build_tiny

    path = build_tiny("bert", tmp_path / "deep", layers=12)
    scorer = build_scorer(str(path), "SST-2", "head")
    assert len(transformer_blocks(scorer.model)) == 12
    trainable = freeze(scorer, layers=[1])
    on = {n for n, v in trainable.items() if v}
    assert any(".layer.1." in n for n in on)
    assert not any(".layer.10." in n or ".layer.11." in n for n in on)
    assert {"head.weight", "head.bias"} <= on


def test_freezing_rules(tiny_models):
    scorer = build_scorer(str(tiny_models["roberta"]), "SST-2", "prompt")
    groups = param_groups(scorer)
    assert {"embeddings", "head", "block:0", "block:1"} <= set(groups.values())
    t = freeze(scorer, embeddings=True, head=True)
    assert not any(t[n] for n, g in groups.items() if g in ("embeddings", "head"))
    t = freeze(scorer, bias_only=True)
    assert all(n.endswith("bias") for n, on in t.items() if on and groups[n] != "head")
    with pytest.raises(SkillgraftError, match="out of range"):
        freeze(scorer, layers=[5])


def test_scorer_save_load_roundtrip(tiny_models, tmp_path):
    scorer = build_scorer(str(tiny_models["bert"]), "SST-2", "head", head_seed=3)
    scorer.save_pretrained(tmp_path / "m")
    again = Scorer.from_pretrained(tmp_path / "m")
    batch = scorer.collate(EXAMPLES)
    assert torch.equal(scorer(**batch), again(**batch))
    with pytest.raises(SkillgraftError, match="not a skillgraft model folder"):
        Scorer.from_pretrained(tmp_path)


def test_missing_checkpoint_is_clear(tmp_path):
    with pytest.raises(SkillgraftError, match="not found"):
        build_scorer(str(tmp_path / "nope" / "model"), "SST-2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SkillgraftError, match="no config.json"):
        build_scorer(str(tmp_path / "empty"), "SST-2")


# ------------------------------------------------------------------------------------------ tokenizer loading
def test_a_tokenizer_is_parsed_once_per_content_and_each_caller_owns_its_copy(tiny_models, tmp_path, monkeypatch):
    """Loading the same tokenizer files again (the same folder, or a fine-tuned copy beside its own weights) reuses
    the first parse; each caller may set its pad token without reaching the others; other bytes parse anew."""
    import shutil

    from transformers import AutoTokenizer

    from skillgraft.models import loading

    parsed = []
    real = AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda path, *a, **k: parsed.append(path) or real(path))
    monkeypatch.setattr(loading, "_LOADED", type(loading._LOADED)())
    src = tmp_path / "pre"
    shutil.copytree(tiny_models["gpt2"], src)
    copy_ = tmp_path / "ft"
    shutil.copytree(src, copy_)
    a, b, c = (loading.load_tokenizer(str(p)) for p in (src, src, copy_))
    assert parsed == [str(src)]
    assert (a.name_or_path, c.name_or_path) == (str(src), str(copy_))
    assert b.pad_token is None
    b.pad_token = b.eos_token  # as the scorer does for a causal model
    b.padding_side = "left"
    assert (a.pad_token, a.padding_side, c.pad_token) == (None, "right", None)
    texts = ["the movie was great", "bad"]
    plain = real(str(src))  # what transformers alone gives, set up the same way
    plain.pad_token, plain.padding_side = plain.eos_token, "left"
    assert b(texts, padding=True)["input_ids"] == plain(texts, padding=True)["input_ids"]
    assert a(texts)["input_ids"] == plain(texts)["input_ids"]
    (copy_ / "tokenizer_config.json").write_text((src / "tokenizer_config.json").read_text().replace(
        '"model_max_length"', '"padding_side": "left", "model_max_length"', 1))
    assert loading.load_tokenizer(str(copy_)).padding_side == "left" and parsed == [str(src), str(copy_)]
