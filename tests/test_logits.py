"""LM-head logits only where they are scored (models/logits.py): every language-model scorer gives what the full
``[batch, seq, vocab]`` computation gives (values and gradients, ≤ 1e-5), while its head sees only the scored
positions."""

import pytest
import torch
from torch.nn import functional as F

from skillgraft.data import Example, register_task, task_from_dict
from skillgraft.data.user import GenerativeTask
from skillgraft.models import build_scorer
from skillgraft.models.logits import head_logits, output_head

EXAMPLES = [Example("the movie was great", 1), Example("a terrible plot", 0), Example("it is a good film", 1)]
PAIRS = [Example("Say yes:", 0, "yes it is"), Example("Name a film", 1, "the good movie"),
         Example("?", 1, "no")]
CAUSAL_KINDS = ["gpt2", "llama", "gemma3"]


def _multi_token_task():
    return register_task(task_from_dict({"name": "multi-logits", "kind": "single", "labels": ["0", "1"],
                                         "label_words": ["dreadfulness", "great"],
                                         "template": "*cls**sent_0*_It_was*mask*.*sep+*"}), overwrite=True)


def _full(scorer, batch):
    """The reference: the model's logits at every position."""
    return scorer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def reference(scorer, batch):
    """What the scorers computed before (full logits, then indexed)."""
    logits = _full(scorer, batch)
    rows = torch.arange(logits.shape[0])
    if scorer.mode == "prompt":
        return logits[rows, batch["score_pos"]][:, scorer.label_token_ids]
    if scorer.mode == "causal" and "target_ids" not in batch:
        return torch.log_softmax(logits[rows, batch["score_pos"]].float(), -1)[:, scorer.label_token_ids]
    target = batch["target_ids"][:, 1:]
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (target != -100)
    if scorer.mode == "causal":
        return picked.sum(-1).view(-1, scorer.task.num_labels)
    if "candidates" in batch:
        return picked.sum(-1).view(-1, int(batch["candidates"]))
    return picked.sum(-1) / (target != -100).sum(-1).clamp(min=1)


def _head_shapes(scorer):
    shapes = []
    handle = output_head(scorer.model).register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    return shapes, handle


def _compare(scorer, batch, scored: int):
    """Values and gradients of the new path equal the reference's; the head's output is [scored, vocab]."""
    shapes, handle = _head_shapes(scorer)
    try:
        scorer.zero_grad()
        ours = scorer(**{k: v for k, v in batch.items() if k != "labels"})
        ours.float().pow(2).sum().backward()
    finally:
        handle.remove()
    grads = {n: p.grad.clone() for n, p in scorer.named_parameters() if p.grad is not None}
    scorer.zero_grad()
    ref = reference(scorer, batch)
    ref.float().pow(2).sum().backward()
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref, atol=1e-5), (ours - ref).abs().max()
    vocab = scorer.model.config.vocab_size
    assert shapes and all(s[-1] == vocab and len(s) <= 3 for s in shapes)
    assert sum(torch.Size(s[:-1]).numel() for s in shapes) == scored  # no [batch, seq, vocab] tensor
    for n, p in scorer.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[n], p.grad, atol=1e-5, rtol=1e-4), n


@pytest.mark.parametrize("kind", CAUSAL_KINDS)
def test_causal_single_token_labels_read_one_position_per_example(tiny_models, kind):
    scorer = build_scorer(str(tiny_models[kind]), "SST-2", "causal")
    assert scorer.single_token
    batch = scorer.collate(EXAMPLES)
    _compare(scorer, batch, scored=len(EXAMPLES))


@pytest.mark.parametrize("kind", CAUSAL_KINDS)
def test_causal_multi_token_label_words_read_only_their_positions(tiny_models, kind):
    scorer = build_scorer(str(tiny_models[kind]), _multi_token_task(), "causal")
    assert not scorer.single_token
    batch = scorer.collate(EXAMPLES)
    width = max(len(w) for w in scorer.label_ids)
    _compare(scorer, batch, scored=batch["input_ids"].shape[0] * width)  # rows × the longest word
    assert batch["input_ids"].shape[1] > width + 2  # (fewer positions than the sequence)


@pytest.mark.parametrize("kind", CAUSAL_KINDS)
def test_generative_loss_hits_and_candidates_read_only_completion_positions(tiny_models, kind):
    scorer = build_scorer(str(tiny_models[kind]), GenerativeTask.make("g", ("yes it is", "no")), "generative")
    batch = scorer.collate(PAIRS)
    completion = int((batch["target_ids"][:, 1:] != -100).sum())
    _compare(scorer, batch, scored=completion)
    with torch.no_grad():  # hits: the model's most likely next token at each completion position
        logits = _full(scorer, batch)[:, :-1]
        target = batch["target_ids"][:, 1:]
        expect = ((logits.argmax(-1) == target) & (target != -100)).sum()
        hits, count = scorer.hits(batch)
    assert (int(hits), count) == (int(expect), completion)
    candidates = scorer.candidate_batch(PAIRS)
    _compare(scorer, candidates, scored=int((candidates["target_ids"][:, 1:] != -100).sum()))
    loss = scorer.loss(batch)
    nll = F.cross_entropy(_full(scorer, batch)[:, :-1].float().transpose(1, 2), target, ignore_index=-100,
                          reduction="none")
    assert torch.allclose(loss, (nll.sum(-1) / (target != -100).sum(-1)).mean(), atol=1e-5)
    with torch.no_grad():  # evaluation's single pass gives the forward's mean log-probabilities and the hits
        mean_logp, one_pass_hits, one_pass_count, rows, top = scorer.completion_eval(batch)
        assert torch.equal(mean_logp, scorer(**{k: v for k, v in batch.items() if k != "labels"}))
    assert (int(one_pass_hits), one_pass_count) == (int(expect), completion)
    valid = target != -100  # the same pass's top tokens: the full forward's argmax at each completion position
    assert torch.equal(rows, valid.nonzero()[:, 0]) and torch.equal(top, logits.argmax(-1)[valid])


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_prompt_mode_reads_the_mask_position_only(tiny_models, kind):
    scorer = build_scorer(str(tiny_models[kind]), "SST-2", "prompt")
    assert not scorer.tied_decoder
    _compare(scorer, scorer.collate(EXAMPLES), scored=len(EXAMPLES))


def test_softcapped_head_is_applied_after_the_gather(tiny_models):
    """Gemma's final logit soft-cap (tanh(z / c)·c) runs on the gathered logits: the tiny Gemma keeps one."""
    scorer = build_scorer(str(tiny_models["gemma3"]), "SST-2", "causal")
    assert scorer.model.config.final_logit_softcapping
    batch = scorer.collate(EXAMPLES)
    rows, pos = torch.arange(len(EXAMPLES)), batch["score_pos"]
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        got = head_logits(scorer.model, inputs, rows, pos)
        full = _full(scorer, batch)[rows, pos]
    assert got.abs().max() <= scorer.model.config.final_logit_softcapping
    assert torch.allclose(got, full, atol=1e-6)


def test_a_model_without_an_output_module_falls_back_to_the_full_forward():
    class NoHead(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return type("Out", (), {"logits": torch.arange(24.0).view(2, 3, 4)})()

    got = head_logits(NoHead(), {"input_ids": None, "attention_mask": None}, torch.tensor([0, 1]), torch.tensor([2, 0]))
    assert output_head(NoHead()) is None and got.tolist() == [[8, 9, 10, 11], [12, 13, 14, 15]]


def test_fisher_of_multi_token_causal_words_matches_the_reference_loop(tiny_models):
    """Per-example Fisher (vmap: the head's positions are a static shape) equals the one-example loop."""
    from skillgraft.fisher.fisher import FisherConfig, fisher_diagonal, fisher_loop

    scorer = build_scorer(str(tiny_models["gemma3"]), _multi_token_task(), "causal")
    names = [n for n, _ in scorer.named_parameters() if "layers.1." in n and n.endswith("weight")][:3]
    config = FisherConfig(method="vmap", n_examples=3, kind="empirical")
    fast = fisher_diagonal(scorer, EXAMPLES, config, names=names)
    slow = fisher_loop(scorer, EXAMPLES, config, names=names)
    for n in names:
        assert torch.allclose(fast[n], slow[n], atol=1e-6, rtol=1e-3), n


def test_a_frozen_head_under_bf16_autocast_is_cast_once_and_gives_autocasts_bits(tiny_models):
    """bf16-mixed: the frozen tied head's bf16 cast is kept between forwards (autocast would redo it every call)
    and recast when the weight changes in place; the logits are bit for bit autocast's own, and the head's class
    forward is back after each call."""
    from skillgraft.models import logits as L

    scorer = build_scorer(str(tiny_models["gemma3"]), "SST-2", "causal")
    head = output_head(scorer.model)
    head.weight.requires_grad_(False)
    batch = scorer.collate(EXAMPLES)
    rows, pos = torch.arange(len(EXAMPLES)), batch["score_pos"]
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    def both():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            ours = head_logits(scorer.model, inputs, rows, pos)
            plain = scorer.model(**inputs).logits[rows, pos]  # autocast casting the head itself
        return ours, plain

    ours, plain = both()
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, plain)
    kept = L._BF16_HEADS[head.weight][1]
    assert kept.dtype == torch.bfloat16 and "forward" not in head.__dict__
    ours, plain = both()
    assert L._BF16_HEADS[head.weight][1] is kept and torch.equal(ours, plain)  # not cast again
    with torch.no_grad():
        head.weight.mul_(1.5)  # a write in place (as a graft's swap): the version counter moves
    ours, plain = both()
    assert L._BF16_HEADS[head.weight][1] is not kept and torch.equal(ours, plain)
    with torch.no_grad():
        fp32 = head_logits(scorer.model, inputs, rows, pos)
    assert fp32.dtype == torch.float32  # without autocast the head runs as it is
    head.weight.requires_grad_(True)  # a head that trains: autocast's own path, nothing kept for it
    L._BF16_HEADS.clear()
    both()
    assert head.weight not in L._BF16_HEADS
