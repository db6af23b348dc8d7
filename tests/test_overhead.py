"""Issue 75: what a fine-tuning or localization step costs beyond the plain loop's work, counted exactly (no timings: those are in
bench/overhead.py and bench/RESULTS.md) — host reads per step (none between the loop's reads) and aten ops per step
(no more than a plain eager loop's plus a small constant)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from skillgraft.data import load_kshot
from skillgraft.models import build_scorer
from skillgraft.train import AutoRGN, FinetuneConfig, RegionMask, SingleTask, fit

from hostreads import HostReads, count_host_reads

EXTRA_OPS = 40  # aten ops a skillgraft step may add to the plain loop's (the loss's EMA, the on-device NaN gate)


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def decoder(tiny_models, toy_data):
    data = load_kshot("SST-2", 16, 13, toy_data)
    return str(tiny_models["llama"]), data


def scorer_of(path):
    return build_scorer(path, "SST-2", "causal")


def callbacks_of(kind, scorer):
    if kind == "region":
        names = [n for n, _ in scorer.named_parameters() if ".layers." in n]
        params = dict(scorer.named_parameters())
        return [RegionMask({n: torch.arange(0, params[n].numel(), 3) for n in names})]
    if kind == "auto-rgn":
        return [AutoRGN()]
    return []


def reads_of(path, data, steps: int, kind: str, monkeypatch, **config) -> list[str]:
    """Host reads of a whole ``fit`` (no dev set, no progress bar, no checkpoint: its only read points are the
    start and the end)."""
    scorer = scorer_of(path)
    cfg = FinetuneConfig(batch_size=8, steps=steps, eval_every=0, **config)
    reads: list[str] = []
    with pytest.MonkeyPatch.context() as mp, HostReads(reads):
        count_host_reads(mp, reads)
        fit(scorer, SingleTask(data.train, None, batch_size=8, steps=steps, seed=0), cfg,
            callbacks_of(kind, scorer), progress=False)
    return reads


@pytest.mark.parametrize("kind, config", [("plain", {}), ("plain", {"l1": 1e-3, "optimizer": "adamw"}),
                                          ("region", {"l1": 1e-3}), ("auto-rgn", {})])
def test_a_finetuning_step_reads_nothing_from_the_device(decoder, monkeypatch, kind, config):
    """The reads of a run do not grow with its steps: the loss, its EMA and the non-finite check stay on the
    device between the loop's read points (log, eval, save, end)."""
    path, data = decoder
    short = reads_of(path, data, 3, kind, monkeypatch, **config)
    long = reads_of(path, data, 9, kind, monkeypatch, **config)
    assert len(long) - len(short) == 0, sorted(set(long) - set(short)) or long[len(short):][:10]


def plain_ops_per_step(path, data, names: list[str], steps: int = 4) -> float:
    """aten ops of one step of a plain eager loop: the same model, trainable set, rows and optimizer."""
    scorer = scorer_of(path).train()
    params = dict(scorer.named_parameters())
    for n, p in params.items():
        p.requires_grad_(n in names)
    trainable = [params[n] for n in names]
    opt = torch.optim.SGD(trainable, lr=0.1, weight_decay=1e-4)
    batches = [scorer.collate(data.train[i * 8:(i + 1) * 8]) for i in range(steps)]
    counter = Ops()
    with counter:
        for batch in batches:
            labels = batch.pop("labels")
            torch.nn.functional.cross_entropy(scorer(**batch), labels).backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return len(counter.ops) / steps


def skillgraft_ops(path, data, steps: int) -> tuple[int, list[str]]:
    scorer = scorer_of(path)
    trained: list[str] = []

    class Names:
        def on_train_start(self, state):
            ids = {id(p) for p in state.params}
            trained.extend(n for n, p in state.model.named_parameters() if id(p) in ids)

    counter = Ops()
    with counter:
        fit(scorer, SingleTask(data.train, None, batch_size=8, steps=steps, seed=0),
            FinetuneConfig(batch_size=8, steps=steps, eval_every=0), [Names()], progress=False)
    return len(counter.ops), trained


def test_a_finetuning_step_runs_no_more_aten_ops_than_a_plain_loop_plus_a_few(decoder):
    path, data = decoder
    short, names = skillgraft_ops(path, data, 3)
    long, _ = skillgraft_ops(path, data, 7)
    per_step = (long - short) / 4
    plain = plain_ops_per_step(path, data, names)
    assert per_step <= plain + EXTRA_OPS, (per_step, plain)


@pytest.mark.parametrize("kind, mode", [("bert", "head"), ("bert", "prompt"), ("llama", "causal"),
                                        ("gpt2", "causal"), ("bert", "classifier")])
def test_a_batch_cut_from_the_tokenized_rows_is_the_collated_batch(tiny_models, toy_data, kind, mode):
    from skillgraft.models.rows import Tokenized

    data = load_kshot("SST-2", 16, 13, toy_data)
    scorer = build_scorer(str(tiny_models[kind]), "SST-2", mode)
    rows = Tokenized.of(scorer, data.train, "cpu")
    assert rows is not None
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        picked = [data.train[int(i)] for i in torch.randint(len(data.train), (8,), generator=gen)]
        want, got = scorer.collate(picked), rows.take(picked)
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
        # laid out as collate's too: a compiled body guards on strides (a cut view was a new graph per width)
        assert all(got[k].stride() == want[k].stride() for k in want), {k: got[k].stride() for k in want}


def test_a_non_finite_loss_moves_nothing_and_stops_the_run_at_its_next_read(decoder, monkeypatch):
    import skillgraft.train.core as core
    from skillgraft.errors import SkillgraftError

    path, data = decoder
    moved, real, calls = [], core.objective, iter(range(100))
    monkeypatch.setattr(core, "objective", lambda *a: real(*a) * (float("nan") if next(calls) == 1 else 1.0))

    class Watch:
        def on_train_start(self, state):
            self.params = state.params

        def on_before_optimizer_step(self, step, optimizer):
            self.before = [p.detach().clone() for p in self.params]

        def on_after_optimizer_step(self, step):
            moved.append(any(not torch.equal(a, p) for a, p in zip(self.before, self.params)))

    for optimizer in ("sgd", "adamw"):
        moved.clear()
        calls = iter(range(100))
        with pytest.raises(SkillgraftError, match="fine-tuning stopped at step 2: the loss is nan"):
            fit(scorer_of(path), SingleTask(data.train, None, batch_size=8, steps=4, seed=0),
                FinetuneConfig(batch_size=8, steps=4, eval_every=0, optimizer=optimizer), [Watch()], progress=False)
        assert moved == [True, False, True, True]  # step 2 moved nothing; the run stopped at its next read (the end)


def test_compile_compiles_the_decoder_stack_for_the_run_and_is_kept_out_of_keys_at_its_default(decoder, monkeypatch):
    """``compile``: the transformer body (a causal LM's decoder stack: its head runs outside, hooked) is compiled in
    place for the steps and runs eagerly again after them; the field is left out of stored specs at its default.
    (The compile itself is checked against eager in the slow test below: minutes on a small CPU.)"""
    path, data = decoder
    assert "compile" not in FinetuneConfig().to_dict() and FinetuneConfig(compile=True).to_dict()["compile"] is True
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(self) or setattr(
        self, "_compiled_call_impl", self._call_impl))
    scorer = scorer_of(path)
    fit(scorer, SingleTask(data.train, None, batch_size=8, steps=2, seed=0),
        FinetuneConfig(batch_size=8, steps=2, eval_every=0, compile=True), progress=False)
    assert compiled == [scorer.model.model] and scorer.model.model._compiled_call_impl is None


@pytest.mark.slow  # inductor's first compile of even a 2-layer decoder takes minutes on a 2-core CI machine
def test_a_compiled_run_equals_the_eager_one_within_rounding(decoder):
    path, data = decoder
    weights = {}
    for compile_ in (False, True):
        scorer = scorer_of(path)
        fit(scorer, SingleTask(data.train, None, batch_size=8, steps=4, seed=0),
            FinetuneConfig(batch_size=8, steps=4, eval_every=0, compile=compile_), progress=False)
        weights[compile_] = {n: p.detach().clone() for n, p in scorer.named_parameters()}
    for n, w in weights[False].items():
        torch.testing.assert_close(weights[True][n], w, rtol=1e-5, atol=1e-6)  # measured: 1.5e-8 at most


def test_batches_of_multi_token_words_and_of_completions_are_cut_as_collated(tiny_models, toy_data):
    """A causal scorer of multi-token label words has one row per (example, word); a generative scorer's batch has
    completion targets padded with -100: both cut from the tokenized rows as ``collate`` builds them."""
    from skillgraft.data.loading import Example
    from skillgraft.data.tasks import register_task, task_from_dict
    from skillgraft.data.user import GenerativeTask
    from skillgraft.models.rows import Tokenized

    data = load_kshot("SST-2", 16, 13, toy_data)
    multi = register_task(task_from_dict({"name": "multi-overhead", "kind": "single", "labels": ["0", "1"],
                                          "label_words": ["dreadfulness", "great"],
                                          "template": "*cls**sent_0*_It_was*mask*.*sep+*"}), overwrite=True)
    pairs = [Example(f"review {i}: the film was" + " very" * (i % 5), 0, [" bad", " good movie"][i % 2])
             for i in range(24)]
    cases = [(build_scorer(str(tiny_models["llama"]), multi, "causal"), data.train),
             (build_scorer(str(tiny_models["llama"]), GenerativeTask.make("g-overhead"), "generative"), pairs)]
    for scorer, rows in cases:
        cut = Tokenized.of(scorer, rows, "cpu")
        assert cut is not None and cut.repeat == (2 if scorer.mode == "causal" else 1)
        for start in (0, 5, 13):
            picked = rows[start:start + 8]
            want, got = scorer.collate(picked), cut.take(picked)
            assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), scorer.mode
            assert torch.equal(cut.take(rows=range(start, start + 8))["input_ids"], want["input_ids"])


def test_rows_a_batch_cannot_be_cut_from_are_collated_per_step(decoder, monkeypatch):
    """Left padding (cutting columns would not give collate's batch) and a train set too large to hold tokenized:
    no rows, and the run collates each step's batch as before."""
    from skillgraft.models.rows import Tokenized

    path, data = decoder
    scorer = scorer_of(path)
    scorer.tokenizer.padding_side = "left"
    head = build_scorer(path, "SST-2", "head")
    head.tokenizer.padding_side = "left"
    assert Tokenized.of(head, data.train, "cpu") is None
    monkeypatch.setattr(Tokenized, "LIMIT", 1000)
    assert Tokenized.of(scorer, data.train, "cpu") is None
    fit(scorer, SingleTask(data.train, None, batch_size=8, steps=2, seed=0),
        FinetuneConfig(batch_size=8, steps=2, eval_every=0), progress=False)


def test_a_sharded_checkpoint_agrees_on_its_timing_without_a_collective_every_step(tmp_path, monkeypatch):
    """Rank 0's clock decides when a multi-process loop saves; the ranks broadcast it only when it may have run out
    (rank 0 says how many steps fit in the time left), not at every step (a broadcast and a read per step)."""
    import torch.distributed as dist

    import skillgraft.resume as resume

    now = [0.0]
    monkeypatch.setattr(resume.time, "monotonic", lambda: now[0])
    monkeypatch.setenv("SKILLGRAFT_CHECKPOINT_SECONDS", "10")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        casts = []
        real = dist.broadcast
        monkeypatch.setattr(dist, "broadcast", lambda *a, **k: casts.append(1) or real(*a, **k))
        point = resume.Sharded(tmp_path / "loop.pt", "f", world=1, rank=0, device="cpu")
        due_at = []
        for step in range(1, 31):
            now[0] += 1.0  # a step takes one second
            if point.due():
                due_at.append(step)
                point.last, point.saved_at = now[0], point.calls  # what a save sets (without writing)
        assert due_at == [10, 20, 30]  # every 10 s, as a broadcast at every step would have said
        assert len(casts) == 6  # twice per interval instead of ten times
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_a_fused_optimizer_resumed_from_an_unfused_ones_state_steps_as_that_one(kind):
    """A checkpoint written before steps were fused holds param groups that say ``fused: None``; the resumed run
    steps as they say (it crashed in SGD's unfused path with found_inf set) and moves exactly as the unfused one."""
    from skillgraft.train.core import _gate

    make = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[kind]
    torch.manual_seed(0)
    start = torch.randn(5)
    moved = []
    for fused in (False, True):
        p = torch.nn.Parameter(start.clone())
        old = make([torch.nn.Parameter(start.clone())], lr=0.1)
        old.param_groups[0]["params"][0].grad = torch.ones(5)
        old.step()
        opt = make([p], lr=0.1, fused=True) if fused else make([p], lr=0.1)
        opt.load_state_dict(old.state_dict())
        p.grad = torch.full((5,), 2.0)
        _gate(opt, [p], torch.tensor(True))
        opt.step()
        moved.append(p.detach().clone())
    assert torch.equal(moved[0], moved[1])
    assert not torch.equal(moved[1], start)


def localization_pair(path, data):
    """(pre, ft): the tiny decoder and a copy of it moved at random (a fine-tune's Δ on every body tensor)."""
    pre, ft = scorer_of(path), scorer_of(path)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ft.model.model.layers.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-2)
    return pre, ft


def plain_localization_ops_per_step(pre, ft, data, steps: int = 4) -> float:
    """aten ops of one dense sigmoid localization step as a plain loop (bench/overhead.py's): θ = θ_pre + γ ⊙ Δ
    written, forward, backward, S −= lr·∂L/∂S — on the same model and rows."""
    from skillgraft.models.anatomy import graftable_names

    names = graftable_names(pre, "body")
    params, moved = dict(pre.named_parameters()), dict(ft.named_parameters())
    for p in params.values():
        p.requires_grad_(False)
    theta = [params[n].requires_grad_(True) for n in names]
    base = [p.detach().clone() for p in theta]
    delta = [moved[n].detach() - b for n, b in zip(names, base)]
    S = [torch.rand(p.shape) for p in theta]
    batches = [pre.collate(data.train[i * 8:(i + 1) * 8]) for i in range(steps)]
    counter = Ops()
    with counter:
        for batch in batches:
            labels = batch.pop("labels")
            with torch.no_grad():
                gammas = [torch.sigmoid(s - 10.0) for s in S]
                for p, b0, d, g in zip(theta, base, delta, gammas):
                    p.copy_(torch.addcmul(b0, g, d))
            (torch.nn.functional.cross_entropy(pre(**batch), labels, reduction="sum") / 8).backward()
            with torch.no_grad():
                for p, d, g, s in zip(theta, delta, gammas, S):
                    s.sub_(1e7 * p.grad * d * g * (1 - g))
                    p.grad = None
    return len(counter.ops) / steps


def localization_ops_per_step(pre, ft, data, monkeypatch) -> float:
    """aten ops of each step of the dense ``learned`` localizer (engine._step: the batch, forward, backward, the
    update of S and the mask written), the median over its steps."""
    import statistics

    import skillgraft.graft.localizers.machinery.engine as engine
    from skillgraft.graft import get_localizer

    real, counts = engine._step, []

    def counted(*args):
        counter = Ops()
        with counter:
            real(*args)
        counts.append(len(counter.ops))

    monkeypatch.setattr(engine, "_step", counted)
    get_localizer("learned").run(pre, ft, data, {"steps": 6, "eval_every": 6, "batch_size": 8, "micro_batch": 8,
                                                 "sparsity": 0.01, "budgets": [0.005], "select_on": "last"})
    return statistics.median(counts[1:])  # the first step also tokenizes the run's rows


def test_a_localization_step_runs_no_more_aten_ops_than_a_plain_loop_plus_a_few(decoder, monkeypatch):
    """The dense sigmoid step fused (ops per chunk of tensors, not per tensor): 593 aten ops a step on this model
    against the plain loop's 712 (1,036 before the fusion)."""
    path, data = decoder
    pre, ft = localization_pair(path, data)
    per_step = localization_ops_per_step(pre, ft, data, monkeypatch)
    plain = plain_localization_ops_per_step(*localization_pair(path, data), data)
    assert per_step <= plain + EXTRA_OPS, (per_step, plain)
