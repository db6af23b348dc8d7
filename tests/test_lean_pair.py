"""The CLI's checkpoint-pair path is as lean as the library's (issue 22 item 7): FT is scored first and
released, θ_pre loads only then, and localization, baselines and grafts read θ_ft from its files; the
report is the same as with both models in memory."""

from __future__ import annotations

import csv
import dataclasses
import gc
import weakref
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.data.spec import DataSpec
from skillgraft.graft import Graft
from skillgraft.graft.graft_file import GraftMetadata
from skillgraft.pipeline import RunDir, Store
from skillgraft.pipeline.member import FineTunedFiles
from skillgraft.pipeline.opening import from_pair
from skillgraft.pipeline.regions import localizer_options
from skillgraft.verbs.graft import ReportSpec, graft_report

OPTIONS = {"candidates": 0.2, "budgets": [1e-2, 5e-2], "steps": 3, "batch_size": 16}


@pytest.fixture(scope="module")
def llama_pair(tiny_models, tmp_path_factory) -> tuple[Path, Path]:
    """(A, B): the tiny Llama and a copy whose body moved (heavy-tailed noise), both saved by plain transformers."""
    import transformers as tf

    a = tiny_models["llama"]
    b = tmp_path_factory.mktemp("lean") / "ft"
    model = tf.AutoModelForCausalLM.from_pretrained(a)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layers" in name or name.endswith("norm.weight"):
                p.add_(0.05 * torch.randn(p.shape, generator=gen) * torch.rand(p.shape, generator=gen) ** 4)
    model.save_pretrained(b)
    tf.AutoTokenizer.from_pretrained(a).save_pretrained(b)
    return a, b


def report(a: Path, b: Path, data_dir: Path, out: Path, *, lean: bool, options: dict = OPTIONS):
    spec = DataSpec.build({"task": "SST-2", "k": 16, "seed": 42, "data_dir": str(data_dir)}, where="test")
    member = from_pair(str(a), str(b), spec, data_dir=data_dir, lean=lean)
    metrics = graft_report(member, RunDir(out, Store(out / "store")), ReportSpec(),
                           localizer_options("learned", options), progress=False)
    return member, metrics


@pytest.mark.parametrize("options", [OPTIONS, {**OPTIONS, "candidates": None}], ids=["candidates", "dense"])
def test_lean_pair_report_equals_the_report_with_both_models_loaded(llama_pair, toy_data, tmp_path, options):
    a, b = llama_pair
    today, m0 = report(a, b, toy_data, tmp_path / "today", lean=False, options=options)
    lean, m1 = report(a, b, toy_data, tmp_path / "lean", lean=True, options=options)
    assert not today.released and isinstance(lean.ft, FineTunedFiles) and lean.ft.path == b
    assert lean.identity() == today.identity()  # the same store keys
    assert m1["rows"] == m0["rows"]  # every row, every number (FT, pre, grafts, baselines, lottery-zero)
    assert {r["kind"] for r in m1["rows"]} >= {"ft", "pre", "graft", "baseline", "lottery-zero"}
    read = [list(csv.reader((tmp_path / d / "results.csv").open())) for d in ("today", "lean")]
    assert read[0] == read[1]
    folders = sorted(p.name for p in (tmp_path / "today" / "grafts").iterdir())
    assert folders == sorted(p.name for p in (tmp_path / "lean" / "grafts").iterdir()) and folders
    for name in folders:
        g0, g1 = (Graft.from_pretrained(tmp_path / d / "grafts" / name) for d in ("today", "lean"))
        assert g0.region == g1.region and g0.values.keys() == g1.values.keys()
        assert all(torch.equal(g0.values[n], g1.values[n]) and g0.values[n].dtype == g1.values[n].dtype
                   for n in g0.values)
        # the pair's typed metadata (Member.inputs.graft_metadata, a GraftMetadata) is what each graft records
        assert isinstance(lean.inputs.graft_metadata, GraftMetadata)
        assert g1.metadata.pretrained == str(a) and g1.metadata.finetuned == lean.inputs.graft_metadata.finetuned
        assert g1.metadata.task_spec == lean.inputs.graft_metadata.task_spec
        assert g1.metadata.task_spec["name"] == "SST-2"


def test_a_bf16_mixed_localization_is_another_store_entry_and_fp32_keys_stay(llama_pair, toy_data, tmp_path):
    """The regions (and every row) learned under bf16-mixed are keyed apart from fp32's, as the fine-tuning is
    (pipeline/opening.finetune_key): a bf16 run never reuses, or is reused as, an fp32 entry. fp32's identity has
    no precision field, so the keys a store already holds are unchanged. A lean member (θ_pre deferred) knows its
    precision from θ_ft, which it opens with."""
    from skillgraft.models.placement import Placement
    from skillgraft.pipeline.regions import _regions_key, say_why

    a, b = llama_pair
    spec = DataSpec.build({"task": "SST-2", "k": 16, "seed": 42, "data_dir": str(toy_data)}, where="test")
    mixed_runtime = Placement.build({"precision": "bf16-mixed"}).resolve()
    fp32 = from_pair(str(a), str(b), spec, data_dir=toy_data)
    mixed = from_pair(str(a), str(b), spec, data_dir=toy_data, runtime=mixed_runtime)
    assert fp32.precision == "fp32" and mixed.precision == "bf16-mixed"
    assert "precision" not in fp32.identity()
    assert mixed.identity() == {**fp32.identity(), "precision": "bf16-mixed"}
    options = localizer_options("learned", OPTIONS)
    assert _regions_key(mixed, "learned", options)[0]["setup"]["precision"] == "bf16-mixed"
    assert _regions_key(mixed, "learned", options)[0] != _regions_key(fp32, "learned", options)[0]
    store = Store(tmp_path)  # an fp32 localization stored: the bf16-mixed one reruns and says why
    key, label = _regions_key(fp32, "learned", options)
    store.fetch("regions", key, lambda folder: None, label=label)
    assert say_why(store, _regions_key(mixed, "learned", options)[0], label, options) == (
        "regions recomputed: the precision changed")
    lean = from_pair(str(a), str(b), spec, data_dir=toy_data, lean=True, runtime=mixed_runtime)
    assert lean.pre is None and lean.precision == "bf16-mixed"


def test_cli_pair_never_holds_both_models_and_localizes_without_theta_ft(llama_pair, toy_data, tmp_path, monkeypatch):
    """Weak references to every model the pair loads: θ_ft is gone before θ_pre loads, and when localization
    starts (it reads θ_ft from B's files); the report still has FT's row."""
    import skillgraft.graft.localizers.learned as learned
    import skillgraft.models.loading as loading

    a, b = llama_pair
    loaded: list[tuple[str, weakref.ref]] = []
    seen: dict[str, list] = {"pre-trained": [], "localize": []}
    real_complete, real_localize = loading.complete_model, learned.localize

    def alive_ft() -> bool:
        gc.collect()
        return any(ref() is not None for role, ref in loaded if role == "fine-tuned")

    def complete(path, role, runtime=None):
        if role == "pre-trained":
            seen["pre-trained"].append(alive_ft())
        model = real_complete(path, role, runtime)
        loaded.append((role, weakref.ref(model)))
        return model

    def localize(pre, ft, *args, **kwargs):
        seen["localize"].append((alive_ft(), type(ft).__name__))
        return real_localize(pre, ft, *args, **kwargs)

    monkeypatch.setattr(loading, "complete_model", complete)
    monkeypatch.setattr(learned, "localize", localize)
    import skillgraft.heap as heap

    fixed: list[bool] = []
    monkeypatch.setattr(heap, "return_large_blocks", lambda: fixed.append(True))  # not in pytest's process
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["graft", "--pretrained", str(a), "--finetuned", str(b), "--task", "SST-2",
                                      "--data-dir", str(toy_data), "--k", "16", "--candidates", "0.2", "--budgets",
                                      "0.05", "--steps", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert seen["pre-trained"] == [False]                      # θ_pre loaded once, after θ_ft was released
    assert seen["localize"] == [(False, "FineTunedFiles")]     # localization reads θ_ft from its files
    assert fixed == [True]  # the command returns freed tensor-sized blocks to the OS (test_freed_large_blocks_…)
    assert "fine-tuned" in (out / "report.md").read_text() and f"fine-tuned: `{b}`" in (out / "report.md").read_text()


def test_lean_pair_needs_safetensors_that_read_back(llama_pair, toy_data, tmp_path, monkeypatch):
    """A checkpoint without safetensors (pytorch_model.bin) cannot be read lazily: both models load at once
    (A checked before any work) and the report is made as before; a B whose safetensors do not read back to
    the loaded values is never released."""
    import transformers as tf

    a, b = llama_pair
    bin_ft = tmp_path / "bin-ft"
    model = tf.AutoModelForCausalLM.from_pretrained(b)
    model.config.save_pretrained(bin_ft)
    torch.save(model.state_dict(), bin_ft / "pytorch_model.bin")
    tf.AutoTokenizer.from_pretrained(b).save_pretrained(bin_ft)
    member, metrics = report(a, bin_ft, toy_data, tmp_path / "r", lean=True)
    assert not member.released and member.pre is not None
    _, loaded = report(a, b, toy_data, tmp_path / "both", lean=False)
    import skillgraft.pipeline.workbench as workbench_module  # the Workbench decides a release (graft: N = 1)

    monkeypatch.setattr(workbench_module, "readable_as", lambda model, folder: False)
    unreadable, again = report(a, b, toy_data, tmp_path / "unreadable", lean=True)
    assert not unreadable.released and unreadable.pre is not None
    assert again["rows"] == loaded["rows"]
    drop = lambda rows: [{k: v for k, v in r.items() if k != "file_bytes"} for r in rows]  # noqa: E731 (paths differ)
    assert drop(metrics["rows"]) == drop(loaded["rows"])


def test_readable_as_compares_every_value_slice_by_slice(llama_pair):
    import transformers as tf

    from skillgraft.pipeline.opening import readable_as

    _, b = llama_pair
    model = torch.nn.Module()  # a scorer's naming: model.<the checkpoint's names>
    model.model = tf.AutoModelForCausalLM.from_pretrained(b)
    assert readable_as(model, b, chunk=16) and readable_as(model, b)
    weight = model.model.model.layers[1].mlp.down_proj.weight
    kept = weight[-1, -1].item()
    with torch.no_grad():
        weight[-1, -1] += 1e-3  # one value, in the last slice
    assert not readable_as(model, b, chunk=16) and not readable_as(model, b)
    with torch.no_grad():
        weight[-1, -1] = kept
    assert readable_as(model, b, chunk=16)
    assert not readable_as(model.to(torch.float64), b)  # another dtype than the files'


def test_lean_pair_refuses_a_non_finite_theta_pre_before_any_work(llama_pair, toy_data, tmp_path, monkeypatch):
    """θ_pre is loaded only after FT is scored on a lean pair, but a NaN in its files is still refused first:
    its safetensors are read slice by slice before θ_ft loads."""
    import shutil

    from safetensors.torch import load_file, save_file

    from skillgraft.errors import SkillgraftError
    from skillgraft.pipeline import opening as setup_module

    a, b = llama_pair
    bad = tmp_path / "pre"
    shutil.copytree(a, bad)
    (weights,) = bad.glob("*.safetensors")
    tensors = load_file(weights)
    name = next(n for n in tensors if "layers.0" in n and tensors[n].dim() == 2)
    tensors[name][1, 2] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt"})
    loaded = []
    import skillgraft.models.loading as loading

    monkeypatch.setattr(loading, "complete_model", lambda *a, **k: loaded.append(a) or 1 / 0)
    spec = DataSpec.build({"task": "SST-2", "k": 16, "seed": 42, "data_dir": str(toy_data)}, where="test")
    with pytest.raises(SkillgraftError, match=rf"--pretrained .*tensor '(model\.)?{name}' from row 0\[\d+\] is nan"):
        from_pair(str(bad), str(b), spec, data_dir=toy_data, lean=True)
    assert loaded == []  # refused before either model loaded


# ---------------------------------------------------------------------------------------- lottery-ticket-zero
class _Body(torch.nn.Module):
    """A scorer's naming (``model.<the file's names>``): 16 linear maps of 1M fp32 values = 64 MiB."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(16)])

    def forward(self, x):
        return self.model(x)


def _body_and_files(tmp_path):
    from safetensors.torch import save_file

    from skillgraft.graft import Region

    torch.manual_seed(0)
    body = _Body().eval()
    (tmp_path / "pre").mkdir()
    save_file({k: v.contiguous() for k, v in body.model.state_dict().items()}, tmp_path / "pre" / "model.safetensors")
    shapes = {n: tuple(p.shape) for n, p in body.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    region = Region(shapes, {n: torch.randperm(1 << 20, generator=gen)[:1000] for n in list(shapes)[::3]})
    values = {n: torch.randn(len(i), generator=gen) for n, i in region.indices.items()}
    return body, Graft(region, values), tmp_path / "pre"


def test_lottery_zero_restores_theta_pre_from_its_files_not_a_backup_in_memory(tmp_path):
    """With θ_pre's files, applying a graft with zeros outside γ keeps no copy of the body: the tensors held while
    it is applied are counted exactly (0 bytes with the files, the whole 64 MiB body without them). The outputs
    are the same; the model is restored bit-exactly. (The process's peak RSS, which depends on the allocator and
    on whatever else runs, is measured in bench/lottery_zero_memory.py, not here.)"""
    from skillgraft.graft.graft import _APPLIED

    body, graft, files = _body_and_files(tmp_path)
    before = {n: p.detach().clone() for n, p in body.named_parameters()}
    x = torch.randn(4, 1024)
    body_bytes = sum(t.numel() * 4 for t in before.values())
    held, outputs = {}, {}
    for how, pre_files in (("memory", None), ("files", files)):
        with graft.applied(body, outside="zero", force=True, pre_files=pre_files):
            held[how] = sum(old.numel() * old.element_size() for _, _, old in body.model.__dict__[_APPLIED].saved
                            if isinstance(old, torch.Tensor))
            outputs[how] = body(x)
        assert all(torch.equal(p, before[n]) for n, p in body.named_parameters())
    assert held == {"memory": body_bytes, "files": 0}  # every tensor is restored from the files
    assert torch.equal(outputs["memory"], outputs["files"])


def test_lottery_zero_keeps_in_memory_what_the_files_do_not_hold(tmp_path):
    """A tensor that differs from θ_pre's files (one value) is backed up in memory; an exception in the block
    restores everything bit-exactly; a folder without safetensors is refused before any write."""
    from skillgraft.errors import SkillgraftError
    from skillgraft.graft.graft import _APPLIED

    body, graft, files = _body_and_files(tmp_path)
    changed = body.model[3].weight
    with torch.no_grad():
        changed[0, 0] += 1.0
    before = {n: p.detach().clone() for n, p in body.named_parameters()}
    with pytest.raises(RuntimeError, match="boom"):
        with graft.applied(body, outside="zero", force=True, pre_files=files):
            backed = [p for p, _, old in body.model.__dict__[_APPLIED].saved if isinstance(old, torch.Tensor)]
            assert len(backed) == 1 and backed[0] is changed and (changed != 0).sum() <= 1000
            raise RuntimeError("boom")
    assert all(torch.equal(p, before[n]) for n, p in body.named_parameters())
    with pytest.raises(SkillgraftError, match="pre_files"):
        graft.apply(body, outside="zero", force=True, pre_files=tmp_path)
    assert all(torch.equal(p, before[n]) for n, p in body.named_parameters())


def test_lottery_zero_row_of_a_pair_is_the_row_computed_with_the_backup_in_memory(llama_pair, toy_data, tmp_path):
    """The report's lottery-ticket-zero rows restore θ_pre from A's files; every row equals the rows computed with
    the old whole-body backup in memory (``pre_files`` dropped)."""
    a, b = llama_pair
    spec = DataSpec.build({"task": "SST-2", "k": 16, "seed": 42, "data_dir": str(toy_data)}, where="test")
    rows = []
    for files in (True, False):
        member = from_pair(str(a), str(b), spec, data_dir=toy_data, lean=True)
        assert member.inputs.pre_files == a
        if not files:
            member.inputs = dataclasses.replace(member.inputs, pre_files=None)
        out = tmp_path / str(files)
        m = graft_report(member, RunDir(out, Store(tmp_path / "store")), ReportSpec(baselines=[]),
                         localizer_options("learned", OPTIONS), progress=False)
        assert any(r["kind"] == "lottery-zero" for r in m["rows"])
        rows.append([{k: v for k, v in r.items() if k != "file_bytes"} for r in m["rows"]])
    assert rows[0] == rows[1]


def test_non_finite_check_reads_a_tensor_in_chunks_and_names_the_first_value():
    """A checkpoint's weights are checked a few MB at a time (no tensor-sized temporaries: a lean pair's peak
    would otherwise grow by twice its embedding matrix in bools); position, value and count are those of the
    whole tensor, whatever the chunk."""
    from skillgraft.finite import first_non_finite

    t = torch.randn(10, 100)
    assert first_non_finite(t, chunk=7) is None
    flat = t.view(-1)
    flat[13], flat[500], flat[999] = float("nan"), float("inf"), -float("inf")
    for chunk in (1, 7, 100, 1000, 1 << 22):
        pos, value, count = first_non_finite(t, chunk=chunk)
        assert (pos, count) == (13, 3) and value != value  # noqa: PLR0124 (nan)
    flat[13] = 0.0
    assert first_non_finite(t, chunk=7)[:2] == (500, float("inf"))


# ---------------------------------------------------------------------------------------- θ_pre's pages
def _present(t: torch.Tensor) -> float:
    """The share of ``t``'s memory pages mapped in this process (/proc/self/pagemap, bit 63)."""
    import struct

    page = 4096
    first, last = t.data_ptr() // page, (t.data_ptr() + t.numel() * t.element_size() - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = struct.unpack(f"{last - first + 1}Q", f.read(8 * (last - first + 1)))
    return sum(e >> 63 for e in entries) / len(entries)


@pytest.fixture(scope="module")
def wide_vocab_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(A, B): a tiny Llama whose embedding matrix has 16,384 rows (2 MiB, of which the toy data use < 400) and a
    copy whose body moved, both saved by plain transformers."""
    import sys

    import transformers as tf

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny import _bpe_tokenizer

    root = tmp_path_factory.mktemp("wide")
    tok = _bpe_tokenizer({"bos": "<s>", "eos": "</s>", "unk": "<unk>"})
    cfg = tf.LlamaConfig(vocab_size=16384, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg)
    for folder in (root / "pre", root / "ft"):
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "layers" in name:
                    p.add_(0.05 * torch.randn(p.shape) * torch.rand(p.shape) ** 4)
    return root / "pre", root / "ft"


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="needs Linux /proc/self/pagemap")
def test_lean_pair_leaves_the_unused_rows_of_theta_pres_embedding_unread(wide_vocab_pair, toy_data, tmp_path):
    """θ_pre is memory-mapped from A's files: a page the work never reads is never resident. After the whole lean
    report (store keys, localization, grafts and their base fingerprint, scoring), most of θ_pre's embedding matrix
    (rows of tokens the data never use) is still unread: its fingerprint came from A's files, it was not checked
    for non-finite values a second time, and a fingerprint recomputed after localization re-read only the tensors
    localization wrote. Each of these used to map the whole matrix (a 165M Llama: +94 MiB, 0.15× a forward pass)."""
    from skillgraft.graft.identity import cached_fingerprint
    from skillgraft.models.anatomy import fingerprint
    from skillgraft.models.loading import complete_model

    a, b = wide_vocab_pair
    fresh = complete_model(str(a), "pre-trained")
    if _present(fresh.model.embed_tokens.weight) > 0.5:
        pytest.skip("this transformers version does not memory-map the weights it loads")
    del fresh
    member, metrics = report(a, b, toy_data, tmp_path / "r", lean=True, options={**OPTIONS, "budgets": [1e-2]})
    assert member.released and any(r["kind"] == "graft" for r in metrics["rows"])
    embedding = member.pre.model.model.embed_tokens.weight
    assert _present(embedding) < 0.25, "θ_pre's embedding matrix was read whole"
    assert cached_fingerprint(member.pre) == fingerprint(member.pre)  # the files' samples are the model's
    assert _present(embedding) > 0.9  # (the measurement sees a whole read)


def test_fingerprint_from_files_is_the_models_and_reads_memory_only_where_the_files_differ(llama_pair, monkeypatch):
    import transformers as tf

    import skillgraft.graft.identity as identity_module
    from skillgraft.models.anatomy import fingerprint

    a, _ = llama_pair
    pre = torch.nn.Module()  # a scorer's naming: model.<the checkpoint's names>
    pre.model = tf.AutoModelForCausalLM.from_pretrained(a)
    read = []
    real = identity_module.tensor_sample
    monkeypatch.setattr(identity_module, "tensor_sample", lambda p: read.append(p) or real(p))
    assert identity_module.fingerprint_from_files(pre, a) == fingerprint(pre) and read == []
    weight = pre.model.model.layers[0].mlp.up_proj.weight
    with torch.no_grad():
        weight.add_(1.0)  # written in place: only this tensor is sampled again, from memory
    assert identity_module.cached_fingerprint(pre) == fingerprint(pre) and [id(p) for p in read] == [id(weight)]
    read.clear()  # the files' first value of that tensor differs from the model's: it is sampled from memory
    assert identity_module.fingerprint_from_files(pre, a) == fingerprint(pre) and [id(p) for p in read] == [id(weight)]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_freed_large_blocks_go_back_to_the_os_once_the_command_fixes_the_threshold():
    """glibc raises its mmap threshold to each large block freed, so the next blocks of that size come from the heap
    and stay mapped after they are freed (at 165M: 745–850 MB peaks for a 709 MB localization).
    ``return_large_blocks`` (what ``skillgraft graft`` sets) fixes it: each freed 24 MiB tensor's pages are unmapped
    at once. Read exactly from /proc/self/maps (is the freed block's address still mapped?), not from the RSS of a
    shared machine (bench/lottery_zero_memory.py measures that). Separate processes (one forked from the other
    before any block is freed): the setting is process-wide."""
    import subprocess
    import sys

    code = """import os, torch
from skillgraft.heap import return_large_blocks
def mapped(address):
    for line in open("/proc/self/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= address < hi:
            return True
    return False
def run(how):
    fixed = return_large_blocks() if how == "fixed" else False
    still = []
    for _ in range(3):
        t = torch.ones(6 << 20)  # 24 MiB, written
        address = t.data_ptr()
        del t
        still.append(mapped(address))
    print(how, fixed, *still, flush=True)
pid = os.fork()  # two processes from one interpreter start, before any block is freed: the child fixes the setting
if pid == 0:
    run("fixed")
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
run("default")"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    kept, fixed = {}, None
    for line in out.splitlines():
        how, said, *kept[how] = line.split()
        fixed = said if how == "fixed" else fixed
    assert set(kept) == {"default", "fixed"}, out
    if fixed != "True":
        pytest.skip("not glibc")
    assert kept["default"][1:] == ["True", "True"]  # the threshold rose: later blocks stay mapped once freed ...
    assert kept["fixed"] == ["False"] * 3  # ... and with it fixed every freed block is returned
