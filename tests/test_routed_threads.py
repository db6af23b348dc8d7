"""Issue 77.3: RoutedSkills under concurrent callers. Each caller sees exactly its skill (or the base) or waits;
θ_pre is restored bit-exactly; no raw KeyError / TypeError from a swap racing another."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from routing import write_routed_folder

from skillgraft.errors import SkillgraftError


@pytest.fixture(scope="module")
def skills(tiny_models, tmp_path_factory):
    from skillgraft.graft.routed import RoutedSkills

    folder = write_routed_folder(tiny_models["bert"], tmp_path_factory.mktemp("routed-threads") / "routed")
    return RoutedSkills.from_pretrained(folder)


def _logits(skills, name, enc):
    with (skills.base() if name is None else skills.use(name)) as model, torch.no_grad():
        return model(**enc).logits.clone()


def test_a_thousand_mixed_swaps_from_threads_match_single_threaded_results_bit_exactly(skills):
    enc = skills.tokenizer(["a good film", "the market fell today", "bad plot"], return_tensors="pt", padding=True)
    before = {k: v.clone() for k, v in skills.model.state_dict().items()}
    labels = dict(skills.model.config.id2label)
    names = [None, *skills.tasks]
    want = {n: _logits(skills, n, enc) for n in names}
    assert not torch.equal(want["sentiment"][:, :2], want[None][:, :2])  # the skills answer differently
    assert want["topic"].shape[-1] == 4 and want["sentiment"].shape[-1] == 2
    rng = random.Random(0)
    jobs = [rng.choice(names) for _ in range(1000)]
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda n: (n, _logits(skills, n, enc)), jobs))
    wrong = [n for n, out in got if out.shape != want[n].shape or not torch.equal(out, want[n])]
    assert not wrong, f"{len(wrong)} of 1000 calls saw another skill's weights: {wrong[:5]}"
    after = skills.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert skills.model.config.id2label == labels


def test_a_failing_caller_lets_the_others_go_on_and_leaves_the_base_intact(skills):
    enc = skills.tokenizer(["a good film"], return_tensors="pt")
    before = {k: v.clone() for k, v in skills.model.state_dict().items()}
    want = _logits(skills, "topic", enc)

    def job(i):
        if i % 5 == 0:
            try:
                with skills.use("sentiment"):
                    raise RuntimeError("a caller's own error")
            except RuntimeError:
                return None
        return _logits(skills, "topic", enc)

    with ThreadPoolExecutor(4) as pool:
        outs = [o for o in pool.map(job, range(100)) if o is not None]
    assert len(outs) == 80 and all(torch.equal(o, want) for o in outs)
    assert all(torch.equal(v, skills.model.state_dict()[k]) for k, v in before.items())


def test_another_skill_inside_a_skill_in_one_thread_is_one_line_not_a_deadlock(skills):
    with skills.use("sentiment"):
        with skills.use("sentiment") as model:  # the same skill again: fine
            assert model is skills.model
        with pytest.raises(SkillgraftError, match="inside skill 'sentiment'"):
            with skills.use("topic"):
                pass
    with skills.use("topic"):  # the gate is free again
        pass


def test_a_switch_is_one_flat_write_each_way_plus_the_head(skills):
    """Issue 75.7: after a first switch prepares it, entering and leaving a skill writes the touched body coordinates
    in one put_ each way (the region tensors are views of one flat buffer) and copies each carried head tensor; a
    head of another shape is a view at the same address (metadata ops only), so the prepared swap stays valid."""
    from hostreads import Ops

    before = {k: v.clone() for k, v in skills.model.state_dict().items()}
    for _ in range(2):
        for task in skills.tasks:
            with skills.use(task):
                pass
    views = {"aten.detach.default", "aten.slice.Tensor", "aten.view.default"}  # no kernel: the head's new shape
    for task in skills.tasks:
        with Ops() as c:
            with skills.use(task):
                pass
        writes = {k: v for k, v in c.ops.items() if k not in views}
        assert writes == {"aten.put_.default": 2, "aten.copy_.default": 2 * len(skills.skills[task].carried)}, task
    after = skills.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
