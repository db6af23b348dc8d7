"""Where the learned localizer's and the graft verb's peak memory goes (issue 45): CPU accounting, not a GPU.

A ``TorchDispatchMode`` counts every tensor storage an op creates until it is freed (a weak reference to the
storage), plus the storages that exist when counting starts (θ_pre, θ_ft); the peak is the largest sum of live
bytes, and at the peak each live storage is charged to the skillgraft line that made it. What a GPU would keep on
the host is left out: θ_ft inside ``placement.offloaded`` and explicit ``.to("cpu", copy=True)`` copies (the
lending snapshot of θ_pre). Model: a tiny Gemma 3 of Gemma-3-270M's *proportions* (tied 32,768-word vocabulary,
hidden 64, 18 layers, 4 heads of 32, 1 kv head, MLP 256: the body 37 % of the weights, as in the 270M's 100M of
268M).

    PYTHONPATH=src OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/memory45.py [--part localize|verb|both]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
import weakref
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def tiny_gemma_like(directory: Path, vocab: int = 32768, layers: int = 18) -> Path:
    """A random Gemma 3 of the 270M's proportions, saved with the tests' byte-level tokenizer."""
    import transformers as tf
    from tiny import _bpe_tokenizer

    torch.manual_seed(0)
    tok = _bpe_tokenizer({"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"})
    cfg = tf.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=256, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=8, max_position_embeddings=128,
        layer_types=["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)],
        tie_word_embeddings=True, final_logit_softcapping=None, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = tf.Gemma3ForCausalLM(cfg)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def _site(stack) -> str:
    """The innermost skillgraft frame (file:line function), else the innermost frame outside torch."""
    for f in reversed(stack):
        if "/skillgraft/" in f.filename:
            return f"{f.filename.split('/skillgraft/')[-1]}:{f.lineno} {f.name}"
    for f in reversed(stack):
        if "/torch/" not in f.filename and "memory45" not in f.filename:
            return f"{f.filename.split('/')[-1]}:{f.lineno} {f.name}"
    return "torch"


class Live(TorchDispatchMode):
    """Live tensor storages by the site that created them; the peak and who held it then."""

    def __init__(self, stage=lambda: ""):
        super().__init__()
        self.live: dict[int, tuple[int, str, str]] = {}  # storage key → (bytes, site, stage)
        self.host: set[int] = set()                         # keys a GPU run keeps on the host
        self.refs: dict[int, weakref.ref] = {}
        self.now = self.peak = 0
        self.at_peak: dict = {}
        self.stage = stage
        self.stage_peak: dict[str, int] = defaultdict(int)
        self.by_stage: dict[str, dict] | None = None  # who holds each stage's peak (the verb's stages only)

    def _free(self, key):
        size = self.live.pop(key, (0,))[0]
        if key not in self.host:
            self.now -= size
        self.host.discard(key)
        self.refs.pop(key, None)

    def add(self, t: torch.Tensor, site: str, host: bool = False) -> None:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.live or st.nbytes() == 0 or t.device.type == "meta":
            return
        try:
            self.refs[key] = weakref.ref(st, lambda _, k=key: self._free(k))
        except TypeError:
            return
        self.live[key] = (st.nbytes(), site, self.stage())
        if host:
            self.host.add(key)
        else:
            self.now += st.nbytes()
            self._mark(site)

    def hide(self, tensors, hidden: bool) -> None:
        """Count ``tensors`` as on the host (hidden) or back on the device."""
        for t in tensors:
            key = t.untyped_storage().data_ptr()
            if key not in self.live:
                continue
            if hidden and key not in self.host:
                self.host.add(key)
                self.now -= self.live[key][0]
            elif not hidden and key in self.host:
                self.host.discard(key)
                self.now += self.live[key][0]
                self._mark()

    def _mark(self, site: str = ""):
        stage = self.stage() or site.split(" [")[0].split(" ")[-1]
        if self.now > self.stage_peak[stage] and self.by_stage is not None:
            by = defaultdict(int)
            for k, (size, site_, _) in self.live.items():
                if k not in self.host:
                    by[site_] += size
            self.by_stage[stage] = dict(sorted(by.items(), key=lambda kv: -kv[1]))
        self.stage_peak[stage] = max(self.stage_peak[stage], self.now)
        if self.now > self.peak:
            self.peak = self.now
            by = defaultdict(int)
            for k, (size, site, _) in self.live.items():
                if k not in self.host:
                    by[site] += size
            self.at_peak = {"stage": stage, "by_site": dict(sorted(by.items(), key=lambda kv: -kv[1]))}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if outs:
            stack = traceback.extract_stack()
            site = _site(stack)
            host = (func is torch.ops.aten._to_copy.default and kwargs.get("device") == torch.device("cpu")
                    and "lending.py" in site)
            for t in outs:
                self.add(t, f"{site} [{func.__name__}]", host)
        return out


def _sites_table(by_site: dict, weights: int, top: int = 14) -> list[dict]:
    rows = [{"site": s, "bytes": b, "x_weights": round(b / weights, 3)} for s, b in list(by_site.items())[:top]]
    rest = sum(list(by_site.values())[top:])
    if rest:
        rows.append({"site": "(the rest)", "bytes": rest, "x_weights": round(rest / weights, 3)})
    return rows


def _weights(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _offload_hook(live: Live):
    """``placement.offloaded`` as a GPU runs it: the module's storages count as on the host inside the block."""
    import contextlib

    import skillgraft.models.placement as placement

    @contextlib.contextmanager
    def offloaded(module):
        params = list(module.parameters()) if isinstance(module, torch.nn.Module) else []
        live.hide(params, True)
        try:
            yield module
        finally:
            live.hide(params, False)
    placement.offloaded = offloaded


def localize(root: Path, steps: int = 3, candidates: float | None = None, checkpointing: bool = False) -> dict:
    """The dense (or lean) learned localizer alone on the pair (θ_ft: a copy of θ_pre with its body moved)."""
    from tiny import write_sentiment_data

    from skillgraft.data import load_kshot
    from skillgraft.graft.localizers import get_localizer
    from skillgraft.models import build_scorer

    data_root = write_sentiment_data(root / "data")
    data = load_kshot("SST-2", 16, 13, data_root)
    model = root / "model"
    pre = build_scorer(str(model), "SST-2", "causal")
    ft = build_scorer(str(model), "SST-2", "causal")
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for n, p in ft.named_parameters():
            if "embed" not in n:
                p.add_(torch.randn(p.shape, generator=gen) * 1e-2)
    weights = _weights(pre)
    live = Live()
    for p in [*pre.parameters(), *ft.parameters()]:
        live.add(p, "weights θ_pre" if any(p is q for q in pre.parameters()) else "weights θ_ft")
    _offload_hook(live)
    options = {"sparsity": 0.01, "steps": steps, "budgets": [0.01], "eval_every": steps, "micro_batch": 16,
               "batch_size": 32, "gradient_checkpointing": checkpointing}
    if candidates is not None:
        options["candidates"] = candidates
    import skillgraft.graft.localizers.machinery.engine as engine

    between, step = [], engine._step

    def counted_step(*a, **k):
        step(*a, **k)
        between.append(live.now)  # what the localizer keeps alive from one step to the next
    engine._step = counted_step
    try:
        with live:
            get_localizer("learned").run(pre, ft, data, options)
    finally:
        engine._step = step
    body = sum(p.numel() * p.element_size() for n, p in pre.named_parameters() if "embed" not in n)
    return {"weights_bytes": weights, "body_bytes": body, "peak_bytes": live.peak,
            "peak_x_weights": round(live.peak / weights, 3), "between_steps_x_weights": round(max(between) / weights, 3),
            "peak_in": live.at_peak["stage"],
            "peak_by_function": {s: round(b / weights, 3) for s, b in sorted(live.stage_peak.items(),
                                                                            key=lambda kv: -kv[1])[:12]},
            "at_peak": _sites_table(live.at_peak["by_site"], weights)}


def verb(root: Path) -> dict:
    """The whole ``graft`` verb in-process (fine-tuning first, not counted), stage by stage."""
    from tiny import write_sentiment_data
    from typer.testing import CliRunner

    import skillgraft.verbs.graft as graft_verb
    from skillgraft.cli import app

    import os

    os.environ["SKILLGRAFT_CACHE"] = str(root / "store")  # a store of its own, removed with the folder
    data_root = write_sentiment_data(root / "data")
    runner = CliRunner()
    model = root / "model"

    def cli(*args):
        r = runner.invoke(app, [str(a) for a in args])
        assert r.exit_code == 0, (r.output, r.exception)

    cli("finetune", "--model", model, "--mode", "causal", "--task", "SST-2", "--k", 8, "--seed", 13, "--optimizer",
        "sgd", "--lr", 3e-3, "--steps", 2, "--eval-every", 2, "--data-dir", data_root, "--out", root / "ft",
        "--device", "cpu")
    stage = {"name": "open (load θ_pre, θ_ft)"}
    live = Live(lambda: stage["name"])
    live.by_stage = {}
    _offload_hook(live)
    names = {"score_ft_first": "FT scoring", "learned_regions": "localization", "base_variants": "base variants",
             "graft_variant": "graft + baselines", "compare": "evaluation (compare)"}
    for fn, label in names.items():
        original = getattr(graft_verb, fn)

        def wrapped(*a, _f=original, _l=label, **k):
            before, stage["name"] = stage["name"], _l
            try:
                return _f(*a, **k)
            finally:
                stage["name"] = "report" if _l == "evaluation (compare)" else before
        setattr(graft_verb, fn, wrapped)
    loc = graft_verb.get_localizer

    def get_localizer(name, _g=loc):
        found = _g(name)
        if name != "learned" and not getattr(found, "_counted", False):
            region = found.region

            def counted(*a, _r=region, **k):
                before, stage["name"] = stage["name"], "baselines (region)"
                try:
                    return _r(*a, **k)
                finally:
                    stage["name"] = before
            try:
                found.region, found._counted = counted, True
            except AttributeError:
                pass
        return found
    graft_verb.get_localizer = get_localizer
    # every storage made from here on, the loaded models included
    with live:
        cli("graft", "--pretrained", model, "--finetuned", root / "ft", "--out", root / "graft", "--budgets",
            "0.01", "--steps", 3, "--eval-every", 3, "--data-dir", data_root, "--device", "cpu")
    from skillgraft.models import build_scorer

    weights = _weights(build_scorer(str(model), "SST-2", "causal"))
    return {"weights_bytes": weights, "peak_bytes": live.peak, "peak_x_weights": round(live.peak / weights, 3),
            "peak_stage": live.at_peak["stage"],
            "stage_peaks": {s: {"bytes": b, "x_weights": round(b / weights, 3),
                                "at_peak": _sites_table(live.by_stage.get(s, {}), weights, 6)}
                            for s, b in live.stage_peak.items()},
            "at_peak": _sites_table(live.at_peak["by_site"], weights)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="both", choices=["localize", "lean", "verb", "both"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny_gemma_like(root / "model")
        if a.part in ("localize", "both"):
            out["dense"] = localize(root)
        if a.part in ("lean", "both"):
            out["lean"] = localize(root, candidates=0.01, checkpointing=True)
        if a.part in ("verb", "both"):
            out["verb"] = verb(root)
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
