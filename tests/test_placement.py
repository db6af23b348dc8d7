"""Device and precision (models/placement.py): every verb on tiny bf16 checkpoints, bf16-mixed accumulating what
bf16 weights lose, a graft crossing fp32 ↔ bf16, draws on a CPU generator, and reports that name their placement.

On a CPU machine these run on the CPU; the tests marked ``cuda`` run where a GPU is visible (``make test-gpu``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny import sentence
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.errors import SkillgraftError
from skillgraft.models.placement import Placement, Runtime, device_of, using

runner = CliRunner()
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cli(*args, code: int = 0) -> str:
    r = runner.invoke(app, [str(a) for a in args])
    if r.exit_code != code:
        raise AssertionError(f"exit {r.exit_code} (wanted {code}): {r.output}\n{r.exception!r}")
    return r.output


def save_bf16(model, tokenizer, out: Path) -> Path:
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def stored_dtypes(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {str(f.get_slice(k).get_dtype()) for k in f.keys()}


@pytest.fixture(scope="module")
def bf16_models(tiny_models, tmp_path_factory):
    """bf16 checkpoints as the Hub ships them (transformers 5 loads them in bf16): the tiny BERT and Llama, a BERT
    sequence classifier pair and a Llama pair (B = A moved well past bf16's resolution)."""
    import transformers as tf

    root = tmp_path_factory.mktemp("bf16")
    out = {}
    for kind, cls in (("bert", tf.AutoModel), ("llama", tf.AutoModelForCausalLM)):
        tok = tf.AutoTokenizer.from_pretrained(tiny_models[kind])
        out[kind] = save_bf16(cls.from_pretrained(tiny_models[kind]), tok, root / kind)
        torch.manual_seed(0)
        if kind == "bert":
            a = tf.AutoModelForSequenceClassification.from_pretrained(
                tiny_models[kind], num_labels=2, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
        else:
            a = tf.AutoModelForCausalLM.from_pretrained(tiny_models[kind])
        save_bf16(a, tok, root / f"{kind}-a")
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in a.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen).to(p.dtype))
        out[f"{kind}-pair"] = (root / f"{kind}-a", save_bf16(a, tok, root / f"{kind}-b"))
    return out


def test_a_placement_is_checked_by_name():
    with pytest.raises(SkillgraftError, match="device"):
        Placement.build({"device": "tpu"})
    with pytest.raises(SkillgraftError, match="precision"):
        Placement.build({"precision": "fp16"})
    assert Placement(device="CPU").resolve() == Runtime(torch.device("cpu"), "fp32")
    if not torch.cuda.is_available():
        with pytest.raises(SkillgraftError, match="no CUDA device is visible"):
            Placement(device="cuda").resolve()
    assert Placement(precision="bf16").resolve().dtype == torch.bfloat16
    assert Placement(precision="bf16-mixed").resolve().dtype == torch.float32  # fp32 master weights


def test_a_bf16_checkpoint_in_head_mode_finetunes_in_every_precision(bf16_models, toy_data, tmp_path):
    """The fp32 head on bf16 features crashed ('mat1 and mat2 must have the same dtype'); now the head takes the
    body's dtype, and fp32 upcasts the checkpoint exactly."""
    for precision, stored in (("fp32", {"F32"}), ("bf16", {"BF16"}), ("bf16-mixed", {"F32"})):
        out = tmp_path / precision
        text = cli("finetune", "--model", bf16_models["bert"], "--task", "SST-2", "--k", 4, "--steps", 2,
                   "--eval-every", 0, "--data-dir", toy_data, "--test-limit", 8, "--device", "cpu",
                   "--precision", precision, "--out", out)
        assert "test acc" in text
        assert stored_dtypes(out / "model") == stored  # the weights as the run held them


def test_every_verb_runs_on_a_bf16_head_model_and_names_its_placement(bf16_models, toy_data, tmp_path):
    run = tmp_path / "ft"
    cli("finetune", "--model", bf16_models["bert"], "--task", "SST-2", "--k", 8, "--steps", 4, "--lr", 1e-2,
        "--eval-every", 0, "--data-dir", toy_data, "--test-limit", 8, "--precision", "bf16", "--out", run)
    out = tmp_path / "g"
    r = runner.invoke(app, [str(a) for a in ("graft", "--finetuned", run, "--budgets", "0.01", "--steps", 2,
                                             "--eval-every", 1, "--data-dir", toy_data, "--test-limit", 8,
                                             "--precision", "bf16", "--out", out, "--json")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert doc["placement"]["precision"] == "bf16" and doc["placement"]["device"] == str(device_of_auto())
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["placement"]["precision"] == "bf16"
    assert f"Ran on {Placement(precision='bf16').resolve().describe()}." in (out / "report.md").read_text()
    graft = next((out / "grafts").iterdir())
    assert "acc" in cli("apply", graft, "--data-dir", toy_data, "--limit", 8, "--precision", "bf16")
    cli("export", graft, "--to", "peft", "--out", tmp_path / "peft", "--precision", "bf16")
    assert (tmp_path / "peft" / "adapter_config.json").is_file()


def device_of_auto() -> torch.device:
    return Placement().resolve().device


def test_a_bf16_causal_model_finetunes_and_grafts(bf16_models, toy_data, tmp_path):
    run = tmp_path / "ft"
    cli("finetune", "--model", bf16_models["llama"], "--mode", "causal", "--task", "SST-2", "--k", 4, "--steps", 2,
        "--eval-every", 0, "--data-dir", toy_data, "--test-limit", 8, "--precision", "bf16-mixed", "--out", run)
    cli("graft", "--finetuned", run, "--budgets", "0.01", "--steps", 2, "--baselines", "", "--no-lottery-zero",
        "--data-dir", toy_data, "--test-limit", 8, "--precision", "bf16-mixed", "--out", tmp_path / "g")
    assert json.loads((tmp_path / "g" / "metrics.json").read_text())["placement"]["precision"] == "bf16-mixed"


def test_bf16_classifier_and_generative_pairs_graft(bf16_models, tmp_path):
    import random

    rng = random.Random(0)
    rows = [{"text": sentence(rng, i % 2), "label": ("neg", "pos")[i % 2]} for i in range(24)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = bf16_models["bert-pair"]
    cli("graft", "--pretrained", a, "--finetuned", b, "--data", data, "--budgets", "0.01", "--steps", 2,
        "--baselines", "", "--no-lottery-zero", "--precision", "bf16", "--out", tmp_path / "clf")
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"prompt": r["text"], "completion": " " + r["label"]}) + "\n" for r in rows))
    a, b = bf16_models["llama-pair"]
    cli("graft", "--pretrained", a, "--finetuned", b, "--data", sft, "--prompt-field", "prompt", "--completion-field",
        "completion", "--budgets", "0.01", "--steps", 2, "--baselines", "", "--no-lottery-zero", "--precision", "bf16",
        "--out", tmp_path / "gen")
    for name in ("clf", "gen"):
        assert json.loads((tmp_path / name / "metrics.json").read_text())["placement"]["precision"] == "bf16"


def _sgd_drift(tiny_bert, toy_data, precision: str) -> tuple[float, torch.dtype]:
    """The share of the body's coordinates an SGD run of steps below bf16's resolution moves, and the dtype."""
    from skillgraft.data.spec import DataSpec
    from skillgraft.models.spec import ModelSpec
    from skillgraft.train import FinetuneConfig
    from skillgraft.train.run import train

    few = DataSpec(task="SST-2", k=8, seed=13, data_dir=toy_data).load()
    with using(Placement(device="cpu", precision=precision)):
        scorer = ModelSpec(model=str(tiny_bert)).scorer(few.task)
        before = {n: p.detach().float().clone() for n, p in scorer.model.named_parameters()}
        cfg = FinetuneConfig(optimizer="sgd", lr=1e-4, steps=8, batch_size=8, eval_every=0, weight_decay=0.0,
                             freeze_embeddings=True)
        train(scorer, few.train, few.dev, cfg, k=8, progress=False)
    changed = sum(int((p.detach().float() != before[n]).sum()) for n, p in scorer.model.named_parameters()
                  if n.startswith("encoder"))
    total = sum(p.numel() for n, p in scorer.model.named_parameters() if n.startswith("encoder"))
    return changed / total, next(scorer.model.parameters()).dtype


def test_bf16_mixed_accumulates_steps_that_bf16_weights_round_away(tiny_bert, toy_data):
    """lr 1e-4 × a gradient of ~1e-2 is ~1e-6, far below |w|/256: pure bf16 drops every such update, bf16-mixed keeps
    fp32 master weights, so the same steps move them."""
    lost, dtype = _sgd_drift(tiny_bert, toy_data, "bf16")
    kept, master = _sgd_drift(tiny_bert, toy_data, "bf16-mixed")
    assert dtype == torch.bfloat16 and master == torch.float32
    assert kept > 0.5               # nearly every body coordinate took the small steps
    assert lost < kept / 10         # in bf16 only weights near 0 (a fine ulp) moved: the rest rounded each step away


def test_bf16_mixed_computes_in_bf16_and_fp32_does_not(tiny_bert):
    from skillgraft.models import build_scorer

    seen = {}
    for precision in ("fp32", "bf16-mixed"):
        with using(Placement(device="cpu", precision=precision)):
            scorer = build_scorer(str(tiny_bert), "SST-2", "head")
        layer = next(m for m in scorer.model.modules() if isinstance(m, torch.nn.Linear))
        hook = layer.register_forward_hook(lambda m, a, o, p=precision: seen.__setitem__(p, o.dtype))
        batch = scorer.collate(scorer_examples())
        batch.pop("labels")
        assert scorer(**batch).dtype in (torch.float32, torch.bfloat16)
        hook.remove()
        assert next(scorer.parameters()).dtype == torch.float32
    assert seen == {"fp32": torch.float32, "bf16-mixed": torch.bfloat16}


def test_forward_passes_on_cuda_leave_out_cudnn_attention_and_cpu_ones_choose_freely(tiny_bert):
    """cuDNN's attention builds a graph per new (batch, length) shape: on CUDA the forward context leaves it out
    (and keeps a kernel every mask and dtype can use), and a differentiated pass under deterministic kernels gets
    the math kernel alone; on a CPU PyTorch chooses as it always does."""
    from torch.nn.attention import SDPBackend

    from skillgraft.models import build_scorer
    from skillgraft.models.placement import attention_backends, forward_context

    on_cuda = attention_backends("cuda:0")
    assert SDPBackend.CUDNN_ATTENTION not in on_cuda and SDPBackend.MATH in on_cuda
    assert attention_backends("cpu") is None and attention_backends("cpu", differentiated=True) is None
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # what a CUDA placement turns on
    try:  # a backward through flash or memory-efficient attention adds with atomics: only math repeats bit for bit
        assert attention_backends("cuda", differentiated=True) == [SDPBackend.MATH]
        assert attention_backends("cuda", differentiated=False) == on_cuda
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    for precision, dtype in (("fp32", None), ("bf16-mixed", torch.bfloat16)):
        with using(Placement(device="cpu", precision=precision)):
            scorer = build_scorer(str(tiny_bert), "SST-2", "head")
        with forward_context(scorer):
            assert torch.is_autocast_enabled("cpu") == (dtype is not None)
            if dtype is not None:
                assert torch.get_autocast_dtype("cpu") == dtype
        assert not torch.is_autocast_enabled("cpu")


def test_a_checkpointed_block_is_recomputed_with_the_attention_kernels_of_its_forward_pass():
    """The backward pass runs outside the forward context: the recomputation re-enters its kernel choice."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from skillgraft.models.placement import recompute_contexts

    with sdpa_kernel([SDPBackend.MATH]):
        forward, recompute = recompute_contexts()
    assert torch.backends.cuda.flash_sdp_enabled()  # back to PyTorch's defaults after the forward
    with forward:
        assert torch.backends.cuda.flash_sdp_enabled()
    with recompute:
        assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
        assert not torch.backends.cuda.mem_efficient_sdp_enabled() and not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()


def test_bf16_mixed_evaluation_casts_each_weight_once_per_set_not_per_batch(tiny_bert):
    """autocast keeps its bf16 copies of the weights while its region lasts: one region around every batch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from skillgraft.evaluate.predict import predict_probs
    from skillgraft.models import build_scorer

    with using(Placement(device="cpu", precision="bf16-mixed")):
        scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    weights = {p.data_ptr() for p in scorer.parameters() if p.dim() == 2 and p.requires_grad}

    class WeightCasts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in weights:
                self.count += 1
            return func(*args, **(kwargs or {}))

    counts = {}
    for batch_size in (4, 1):  # one batch, then four
        with WeightCasts() as casts:
            probs = predict_probs(scorer, [*scorer_examples()] * 2, batch_size=batch_size)
        counts[batch_size] = casts.count
        assert probs.shape == (4, 2)
    assert counts[1] == counts[4] > 0


def scorer_examples():
    from skillgraft.data.loading import Example

    return [Example("the movie was great", 1), Example("a dull film", 0)]


def _pair(tiny_bert, seed: int = 1):
    from skillgraft.models import build_scorer

    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    ft = build_scorer(str(tiny_bert), "SST-2", "head", head_seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ft.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return pre, ft


def test_a_graft_learned_in_fp32_applies_to_its_base_in_bf16_and_back(tiny_bert):
    from skillgraft.graft import Graft
    from skillgraft.graft.region import Region
    from skillgraft.models.anatomy import graftable_names

    pre, ft = _pair(tiny_bert)
    names = graftable_names(pre)
    shapes = {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}
    region = Region(shapes, {names[0]: [0, 3, 5, 17], names[3]: [1, 2]})
    graft = Graft.from_models(pre, ft, region)
    assert graft.base_dtype == "torch.float32" and graft.base_rounded
    low = Runtime(torch.device("cpu"), "bf16").place(pre)
    before = {n: p.detach().clone() for n, p in low.named_parameters()}
    with pytest.warns(UserWarning, match="learned on .* in fp32; applied to the same base in bf16"):
        graft.apply(low)
    params = dict(low.named_parameters())
    want = dict(ft.named_parameters())[names[0]].detach().reshape(-1)[[0, 3, 5, 17]].to(torch.bfloat16)
    assert torch.equal(params[names[0]].detach().reshape(-1)[[0, 3, 5, 17]], want)  # θ_ft's values, rounded once
    graft.revert(low)
    assert all(torch.equal(p, before[n]) for n, p in low.named_parameters())  # bit-exact
    # a graft learned on the bf16 base applies to that base upcast to fp32 (a bf16 checkpoint loaded in fp32)
    back = Graft.from_models(low, Runtime(torch.device("cpu"), "bf16").place(ft), region)
    high = Runtime(torch.device("cpu"), "fp32").place(low)
    with pytest.warns(UserWarning, match="in bf16; applied to the same base in fp32"):
        with back.applied(high):
            pass
    other, _ = _pair(tiny_bert, seed=2)
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(0.1)
    with pytest.raises(SkillgraftError, match="fingerprint"):
        graft.apply(Runtime(torch.device("cpu"), "bf16").place(other))  # a different base is still refused


def test_random_draws_are_taken_on_a_cpu_generator(tiny_bert):
    """One seed, one region on any device: the hard-concrete gates and the random baseline draw on the CPU."""
    from skillgraft.graft.localizers.machinery.relaxations import HardConcrete

    relax = HardConcrete()

    class Layout:  # the two things start() reads of a layout
        delta = {"w": torch.ones(50)}

        def flat(self, d):
            return torch.cat([v.reshape(-1) for v in d.values()])

        def split(self, flat):
            return {"w": flat}

    relax.start(Layout(), {"w": torch.arange(50.0)}, None, 5, seed=3)
    assert relax.gen.device.type == "cpu"
    first = relax.mask(1)["w"]
    relax.start(Layout(), {"w": torch.arange(50.0)}, None, 5, seed=3)
    assert torch.equal(relax.mask(1)["w"], first)


def test_a_model_placed_on_the_cpu_stays_there_whatever_is_visible(tiny_bert, toy_data):
    """Library calls run where the caller put the model (a GPU being visible does not move it)."""
    moved, _ = _sgd_drift(tiny_bert, toy_data, "fp32")
    assert moved > 0
    from skillgraft.models import build_scorer

    with using(Placement(device="cpu")):
        scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    from skillgraft.graft.localizers.machinery.batches import accuracy

    accuracy(scorer, [*scorer_examples()] * 2, micro_batch=2)
    assert device_of(scorer).type == "cpu" and scorer.head.weight.device.type == "cpu"


@cuda
def test_a_verb_on_cuda_places_the_model_there_and_reverts_swaps_bit_exactly(tiny_bert, toy_data, tmp_path):
    from skillgraft.graft import Graft
    from skillgraft.models import build_scorer

    run = tmp_path / "ft"
    cli("finetune", "--model", tiny_bert, "--task", "SST-2", "--k", 8, "--steps", 4, "--eval-every", 0,
        "--data-dir", toy_data, "--test-limit", 8, "--device", "cuda", "--out", run)
    out = tmp_path / "g"
    cli("graft", "--finetuned", run, "--budgets", "0.01", "--steps", 2, "--data-dir", toy_data, "--test-limit", 8,
        "--device", "cuda", "--out", out)
    assert json.loads((out / "metrics.json").read_text())["placement"]["device"].startswith("cuda")
    graft = Graft.from_pretrained(next((out / "grafts").iterdir()))
    with using(Placement(device="cuda")):
        pre = build_scorer(str(tiny_bert), "SST-2", "head")
    assert device_of(pre).type == "cuda"
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    for _ in range(3):
        with graft.applied(pre):
            pass
    assert all(torch.equal(p, before[n]) for n, p in pre.named_parameters())


def test_auto_precision_is_bf16_mixed_where_the_hardware_computes_bf16_and_says_so(tmp_path, monkeypatch):
    """Issue 75: ``--precision auto`` reads the CPU's flags (/proc/cpuinfo) or the GPU's compute capability; the
    resolved precision is what the store keys and the reports carry, the report adding "(auto)"."""
    import skillgraft.models.placement as placement

    read = placement._cpu_flags
    for flags, want in (("fpu avx2 avx512f", "fp32"), ("fpu avx512f avx512_bf16", "bf16-mixed"),
                        ("fpu amx_tile amx_bf16", "bf16-mixed")):
        info = tmp_path / f"cpuinfo-{want}-{len(flags)}"
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
        monkeypatch.setattr(placement, "_cpu_flags", lambda path=str(info): read(path))
        runtime = Placement(device="cpu", precision="auto").resolve()
        assert runtime.precision == want and runtime.auto and runtime.dtype == torch.float32
        assert runtime.describe() == f"cpu, {want} (auto)"
        assert runtime.as_dict()["precision"] == want and runtime.as_dict()["precision_asked"] == "auto"
    monkeypatch.setattr(placement, "_cpu_flags", lambda path="": set())
    assert Placement(device="cpu", precision="auto").resolve().precision == "fp32"
    assert read(str(tmp_path / "missing")) == set()  # no /proc: no native bf16 claimed
    with using(Placement(device="cpu", precision="fp32")) as runtime:  # asked for by name: no "(auto)"
        assert runtime.describe() == "cpu, fp32"


def test_determinism_is_opt_in_and_kept_out_of_the_spec_at_its_default():
    """Issue 75: by default a placement leaves torch's kernel choice alone (on a GPU: fast attention backwards, no
    NaN-filled allocations); ``deterministic`` turns the deterministic kernels on for a CUDA run. Specs and store keys
    written before the field existed are unchanged."""
    assert "deterministic" not in Placement().to_dict()
    assert Placement(deterministic=True).to_dict()["deterministic"] is True
    assert Placement(deterministic=True).resolve().deterministic
    before = torch.are_deterministic_algorithms_enabled()
    with using(Placement(device="cpu")):
        assert torch.are_deterministic_algorithms_enabled() == before
    if torch.cuda.is_available():
        with using(Placement(device="cuda")):
            assert not torch.are_deterministic_algorithms_enabled()
        with using(Placement(device="cuda", deterministic=True)):
            assert torch.are_deterministic_algorithms_enabled()
        assert torch.are_deterministic_algorithms_enabled() == before
