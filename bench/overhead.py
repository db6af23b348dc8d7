"""skillgraft's loops beside plain eager PyTorch on the same tiny random decoder, rows and optimizer (issue 75).

Usage: .venv/bin/python bench/overhead.py [--steps 60] [--repeats 3] [--hidden 64] [--layers 2] [--compile]

A tiny random Llama (built in-process, a byte-level BPE tokenizer; causal label-word scoring of a toy SST-2, 32
rows), one thread, batch 8:

* **fine-tuning**: ``skillgraft.train.fit`` (SGD lr 0.1, weight decay 1e-4, clip 1.0: the default recipe) timed
  step to step by a callback, against a plain loop over the same batches (tokenized once, before the clock) on a
  copy of the same model and trainable set: forward of the body, the LM head at the scored positions only (what
  skillgraft computes), log-softmax over the label words, cross-entropy, backward, clip, SGD, zero_grad;
* **localization**: the dense ``learned`` localizer's step (``engine._step``: θ = θ_pre + γ ⊙ Δ written, forward,
  backward, ∂L/∂S, S updated) against the same arithmetic written as a plain loop over the same rows.

Each figure is the median step time over ``--steps`` steps (the first 5 left out), the run ``--repeats`` times;
the ratio skillgraft / plain is printed per repeat and as the median. Times are the process's CPU time
(``time.process_time``, one thread): on a machine shared with other jobs, wall time mostly measures the wait for a
core. The machine is shared: read medians.

``--compile``: also skillgraft's fine-tuning and localizer with their ``compile`` option (``--compile``: the decoder
stack compiled by inductor, models/compiled.py), and both plain loops with their loss function compiled, each beside its
eager run in the same repeat. The steady-state step is the median after the warm-up, as above; the compile is the
rest: a variant's CPU time over all its steps minus steps × its median, and the graphs dynamo made, printed
separately. Inductor compiles in this process (``TORCHINDUCTOR_COMPILE_THREADS=1``, so ``process_time`` counts it);
each variant's first repeat compiles cold (a fresh cache folder, inductor's in-memory caches cleared), its later ones
(after ``torch._dynamo.reset()``, the in-memory caches cleared again) read that folder, as a second run of the same
command does.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))

if "--compile" in sys.argv:  # before torch is imported: inductor reads these once
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # compiled in this process: process_time counts it

import torch  # noqa: E402

WARMUP = 5
COMPILES: dict[str, list[tuple[float, int]]] = {}  # variant -> (compile CPU s, graphs made) per repeat
CACHES: dict[str, str] = {}  # variant -> its inductor cache folder


def build(root: Path, hidden: int, layers: int):
    """(pre scorer, ft scorer, data): a tiny random Llama in causal mode and a randomly moved copy."""
    import transformers as tf
    from tiny import _bpe_tokenizer, write_sentiment_data

    from skillgraft.data import load_kshot
    from skillgraft.models import build_scorer

    torch.manual_seed(0)
    tok = _bpe_tokenizer({"bos": "<s>", "eos": "</s>", "unk": "<unk>"})
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=128, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    tf.LlamaForCausalLM(cfg).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    data = load_kshot("SST-2", 16, 13, write_sentiment_data(root / "data"))
    pre = build_scorer(str(root / "model"), "SST-2", "causal")
    ft = build_scorer(str(root / "model"), "SST-2", "causal")
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in ft.model.model.layers.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-2)
    return pre, ft, data


class Clock:
    """A training callback that stamps the end of every optimizer step."""

    def __init__(self):
        self.stamps: list[float] = []
        self.names: list[str] = []

    def on_train_start(self, state):
        self.stamps.append(time.process_time())  # the first step's start (a compile happens in it)
        ids = {id(p) for p in state.params}
        self.names = [n for n, p in state.model.named_parameters() if id(p) in ids]

    def on_after_optimizer_step(self, step):
        self.stamps.append(time.process_time())


def median_step(stamps: list[float], name: str | None = None) -> float:
    """The median gap after the warm-up (ms); with ``name``, what the steps took beyond it is kept as its compile."""
    return median_of([b - a for a, b in zip(stamps, stamps[1:])], name)


def median_of(times: list[float], name: str | None = None) -> float:
    median = statistics.median(times[WARMUP:])
    if name is not None:
        from torch._dynamo.utils import counters

        COMPILES.setdefault(name, []).append((sum(times) - len(times) * median, counters["stats"]["unique_graphs"]))
        torch._dynamo.reset()  # the next repeat compiles again (from the on-disk cache), not from this process's
        counters.clear()
    return median * 1e3


@contextlib.contextmanager
def inductor_cache(name: str | None):
    """``name``'s own inductor cache: fresh (cold) the first time, the same folder (warm on disk) afterwards."""
    if name is None:
        yield
        return
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    from torch._inductor.utils import clear_caches

    clear_caches()
    folder = CACHES.setdefault(name, tempfile.mkdtemp(prefix="overhead-inductor-"))
    with temporary_cache_dir(folder):
        yield


def skillgraft_finetune(scorer, data, steps: int, **config) -> tuple[float, list[str], list]:
    from skillgraft.train import FinetuneConfig, SingleTask, fit

    cfg = FinetuneConfig(batch_size=8, steps=steps, eval_every=0, **config)
    sampler = SingleTask(data.train, None, batch_size=8, steps=steps, seed=cfg.seed)
    clock = Clock()
    name = "fine-tuning: skillgraft --compile" if cfg.compile else None
    with inductor_cache(name):
        fit(scorer, sampler, cfg, [clock], progress=False)
    batches = [ex for _, ex in SingleTask(data.train, None, batch_size=8, steps=steps, seed=cfg.seed)]
    return median_step(clock.stamps, name), clock.names, batches


def plain_finetune(scorer, names: list[str], batches, compiled: bool = False) -> float:
    """The same steps as a plain eager loop: batches tokenized before the clock, the same math per step."""
    model = copy.deepcopy(scorer.model).train()
    params = dict(model.named_parameters())
    for n, p in params.items():
        p.requires_grad_(f"model.{n}" in names)
    trainable = [params[n.removeprefix("model.")] for n in names]
    words = scorer.label_token_ids
    opt = torch.optim.SGD(trainable, lr=0.1, weight_decay=1e-4)
    ready = []
    for examples in batches:
        b = scorer.collate(examples)
        ready.append((b["input_ids"], b["attention_mask"], b["score_pos"], b["labels"]))
    body, head = model.model, model.lm_head

    def loss_of(ids, mask, pos, labels):
        hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = head(hidden[torch.arange(ids.shape[0]), pos])
        logp = torch.log_softmax(logits.float(), -1)[:, words]
        return torch.nn.functional.cross_entropy(logp, labels)

    if compiled:
        loss_of = torch.compile(loss_of)
    name = "fine-tuning: plain compiled" if compiled else None
    stamps = [time.process_time()]
    with inductor_cache(name):
        for ids, mask, pos, labels in ready:
            loss_of(ids, mask, pos, labels).backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            stamps.append(time.process_time())
    return median_step(stamps, name)


def skillgraft_localize(pre, ft, data, steps: int, compiled: bool = False) -> float:
    """The dense learned localizer's step; ``compiled``: its ``compile`` option (``--compile``)."""
    import skillgraft.graft.localizers.machinery.engine as engine
    from skillgraft.graft.localizers import get_localizer

    real, times = engine._step, []

    def timed(*args):
        t0 = time.process_time()
        real(*args)
        times.append(time.process_time() - t0)

    name = "localization: skillgraft --compile" if compiled else None
    engine._step = timed
    try:
        with inductor_cache(name):
            get_localizer("learned").run(pre, ft, data, {"steps": steps, "eval_every": steps, "batch_size": 8,
                                                         "micro_batch": 8, "sparsity": 0.01, "budgets": [0.005],
                                                         "select_on": "last", "schedule": "fixed",  # every step
                                                         "compile": compiled})
    finally:
        engine._step = real
    return median_of(times, name)


def plain_localize(pre, ft, data, steps: int, compiled: bool = False) -> float:
    """The dense sigmoid localization step as a plain loop: θ = θ_pre + γ ⊙ Δ, forward, backward, S −= lr·∂L/∂S."""
    from skillgraft.models.anatomy import graftable_names

    model = copy.deepcopy(pre.model).eval()
    params = dict(model.named_parameters())
    names = [n.removeprefix("model.") for n in graftable_names(pre, "body")]
    for p in model.parameters():
        p.requires_grad_(False)
    theta = [params[n] for n in names]
    for p in theta:
        p.requires_grad_(True)
    ft_params = dict(ft.model.named_parameters())
    base = [p.detach().clone() for p in theta]
    delta = [ft_params[n].detach() - b for n, b in zip(names, base)]
    gen = torch.Generator().manual_seed(0)
    S = [torch.rand(p.shape, generator=gen) for p in theta]
    words, lr, bias = pre.label_token_ids, 1e7, 10.0
    rows = data.train
    order = torch.randperm(len(rows), generator=gen)
    ready = []
    for step in range(steps):
        idx = [int(order[(step * 8 + i) % len(rows)]) for i in range(8)]
        b = pre.collate([rows[i] for i in idx])
        ready.append((b["input_ids"], b["attention_mask"], b["score_pos"], b["labels"]))
    body, head = model.model, model.lm_head

    def loss_of(ids, mask, pos, labels):
        hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = head(hidden[torch.arange(ids.shape[0]), pos])
        logp = torch.log_softmax(logits.float(), -1)[:, words]
        return torch.nn.functional.cross_entropy(logp, labels, reduction="sum") / 8

    if compiled:
        loss_of = torch.compile(loss_of)
    times = []
    name = "localization: plain compiled" if compiled else None
    with inductor_cache(name):
        for ids, mask, pos, labels in ready:
            t0 = time.process_time()
            with torch.no_grad():
                gammas = [torch.sigmoid(s - bias) for s in S]
                for p, b0, d, g in zip(theta, base, delta, gammas):
                    p.copy_(torch.addcmul(b0, g, d))
            loss_of(ids, mask, pos, labels).backward()
            with torch.no_grad():
                for p, d, g, s in zip(theta, delta, gammas, S):
                    s.sub_(lr * p.grad * d * g * (1 - g))
                    p.grad = None
            times.append(time.process_time() - t0)
    return median_of(times, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="also each loop compiled (see above)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        pre, ft, data = build(Path(tmp), args.hidden, args.layers)
        for r in range(args.repeats):
            sg, names, batches = skillgraft_finetune(copy.deepcopy(pre), data, args.steps)
            plain = plain_finetune(pre, names, batches)
            got = {"fine-tuning: skillgraft": sg, "fine-tuning: plain eager": plain}
            if args.compile:
                got["fine-tuning: skillgraft --compile"] = skillgraft_finetune(
                    copy.deepcopy(pre), data, args.steps, compile=True)[0]
                got["fine-tuning: plain compiled"] = plain_finetune(pre, names, batches, compiled=True)
            got["localization: skillgraft"] = skillgraft_localize(pre, ft, data, args.steps)
            got["localization: plain eager"] = plain_localize(pre, ft, data, args.steps)
            if args.compile:
                got["localization: skillgraft --compile"] = skillgraft_localize(pre, ft, data, args.steps, True)
                got["localization: plain compiled"] = plain_localize(pre, ft, data, args.steps, True)
            for k, v in got.items():
                rows.setdefault(k, []).append(v)
            print(f"repeat {r + 1}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in got.items()), flush=True)
    print(f"\n{'step (median of repeats)':42s} {'ms':>8s}   per-repeat")
    for k, v in rows.items():
        print(f"{k:42s} {statistics.median(v):8.2f}   {' '.join(f'{x:.2f}' for x in v)}")
    for what in ("fine-tuning", "localization"):
        ratios = [a / b for a, b in zip(rows[f"{what}: skillgraft"], rows[f"{what}: plain eager"])]
        print(f"{what}: skillgraft / plain eager = {statistics.median(ratios):.2f}× "
              f"(per repeat {' '.join(f'{x:.2f}' for x in ratios)})")
    for k, base in (("fine-tuning: skillgraft --compile", "fine-tuning: skillgraft"),
                    ("fine-tuning: plain compiled", "fine-tuning: plain eager"),
                    ("localization: skillgraft --compile", "localization: skillgraft"),
                    ("localization: plain compiled", "localization: plain eager")):
        if k in rows:
            ratios = [a / b for a, b in zip(rows[k], rows[base])]
            print(f"{k} / {base.split(': ')[1]} = {statistics.median(ratios):.2f}× "
                  f"(per repeat {' '.join(f'{x:.2f}' for x in ratios)})")
    for k, runs in COMPILES.items():
        print(f"{k}: compile CPU s (first repeat cold, then cache warm) {' '.join(f'{c:.1f}' for c, _ in runs)}; "
              f"graphs {' '.join(str(g) for _, g in runs)}")


if __name__ == "__main__":
    main()
