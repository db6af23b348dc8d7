"""``skillgraft export --to gguf`` / ``apply --export FILE.gguf`` (issue 51): a graft on a tiny Q8_0 GGUF written
back as one GGUF file and read with readers that are not skillgraft's — gguf-py's ``GGUFReader`` (every metadata
key and every untouched tensor's bytes equal the base file's) and transformers' own GGUF loader (every grafted value
equal to the grafted model's, logits equal to the grafted model's). Refusals before any work, one line each.
The real gemma-3-270m round trip through llama.cpp is the opt-in ``make test-gguf`` (tests/test_real_gguf.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.export import ExportSpec, export_graft
from skillgraft.export.gguf import GRAFT_KEY

runner = CliRunner()
IDS = torch.tensor([[2, 5, 8, 9, 31, 32, 7, 8, 9, 10, 11, 40, 41, 33]])


def cli(*args, code: int = 0) -> str:
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, f"exit {r.exit_code} (wanted {code}): {r.output}\n{r.exception!r}"
    return r.output


@pytest.fixture(scope="module")
def grafted(tmp_path_factory):
    """A tiny Q8_0 GGUF, a graft on it saved to a folder, exported once by the CLI."""
    from tiny import tiny_gguf_graft

    root = tmp_path_factory.mktemp("gguf-export")
    path, graft, pre = tiny_gguf_graft(root / "base")
    graft.save_pretrained(root / "graft")
    out = cli("export", root / "graft", "--to", "gguf", "--out", root / "grafted.gguf", "--json")
    return {"base": path, "graft": graft, "pre": pre, "dir": root / "graft", "out": root / "grafted.gguf",
            "summary": json.loads(out[out.index("{"):]), "root": root}


def _reader(path):
    import gguf

    return gguf.GGUFReader(str(path))


def _hf(path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()


def test_every_key_and_untouched_tensor_is_the_base_files_byte_for_byte(grafted):
    base, ours = _reader(grafted["base"]), _reader(grafted["out"])
    for name, field in base.fields.items():
        if name in ("GGUF.kv_count",):
            continue
        assert name in ours.fields, name
        assert ours.fields[name].contents() == field.contents(), name  # tokenizer, config: unchanged
    assert ours.fields["GGUF.kv_count"].contents() == base.fields["GGUF.kv_count"].contents() + 1
    record = json.loads(ours.fields[GRAFT_KEY].contents())
    assert record["coordinates"] == grafted["graft"].size and record["kept"] == grafted["graft"].size
    assert [t.name for t in ours.tensors] == [t.name for t in base.tensors]
    touched = set(record["tensors"])
    assert touched and len(touched) < len(base.tensors)
    for a, b in zip(base.tensors, ours.tensors):
        if a.name in touched:
            assert b.tensor_type.name == "F32", a.name  # Q8_0 matrices and F32 norms: F32 keeps the graft
            continue
        assert b.tensor_type == a.tensor_type and bytes(np.asarray(b.data).data) == bytes(np.asarray(a.data).data)
    s = grafted["summary"]
    assert s["to"] == "gguf" and s["exact"] and s["touched"] == len(touched)
    assert set(s["changed_type"].values()) == {"Q8_0 → F32"}
    assert s["bytes"] == grafted["out"].stat().st_size and s["size_ratio"] == pytest.approx(
        s["bytes"] / grafted["base"].stat().st_size)


def test_transformers_reads_the_grafted_model(grafted):
    """Every grafted value as the grafted model holds it (Gemma's norms: the 1 + w it computes with, bit for bit),
    every other parameter θ_pre's, and the logits the grafted model's."""
    pre, graft = grafted["pre"], grafted["graft"]
    theirs = _hf(grafted["out"])
    state = theirs.state_dict()
    with graft.applied(pre), torch.no_grad():
        want = {n.removeprefix("model."): p.detach().clone() for n, p in pre.named_parameters()}
        logits = pre.model(IDS).logits
    touched = {n.removeprefix("model.") for n in graft.region.indices}
    for name, w in want.items():
        got = state[name]
        if "norm" in name:  # stored as 1 + w: the model computes with exactly that
            assert torch.equal(1 + got.float(), 1 + w.float()), name
        else:
            assert torch.equal(got, w), name
        if name in touched:
            idx = graft.region.indices["model." + name]
            assert torch.equal(1 + got.reshape(-1)[idx], 1 + graft.values["model." + name]) if "norm" in name else \
                torch.equal(got.reshape(-1)[idx], graft.values["model." + name]), name
    with torch.no_grad():
        got = theirs(IDS).logits
        base = _hf(grafted["base"])(IDS).logits
    diff = (got - logits).abs().max().item()
    assert diff <= 1e-6, diff
    assert (base - logits).abs().max().item() > 100 * max(diff, 1e-9)  # the graft shows, far above that


def test_apply_export_writes_the_same_file(grafted, tmp_path):
    out = tmp_path / "applied.gguf"
    text = cli("apply", grafted["dir"], "--export", out, "--evaluate-on", "")
    assert "GGUF" in text and "changed type" in text
    assert out.read_bytes() == grafted["out"].read_bytes()


def test_requantized_touched_tensors_lose_the_graft(grafted, tmp_path):
    """--gguf-type Q8_0 re-quantizes the touched matrices (what a converter would do): the file is smaller and
    llama.cpp-readable, and the summary counts the grafted coordinates it lost."""
    out = tmp_path / "q8.gguf"
    s = export_graft(grafted["graft"], out, ExportSpec(to="gguf", gguf_type="Q8_0"), base=grafted["pre"])
    assert not s["exact"] and s["kept"] < s["coordinates"]
    types = {t.name: t.tensor_type.name for t in _reader(out).tensors}
    assert {types[g] for g, w in s["written"].items() if "norm" not in g} == {"Q8_0"}
    assert {types[g] for g, w in s["written"].items() if "norm" in g} == {"F32"}
    assert s["bytes"] < grafted["summary"]["bytes"]
    _hf(out)  # transformers reads it


@pytest.mark.parametrize("base, values, written", [
    (None, None, "F32"),  # an F32 base keeps F32: no type changes
    ("F16", torch.float16, "F16"),  # grafted values F16 holds: F16 kept
    ("F16", None, "F32"),  # float32 values F16 cannot hold: F32
    ("BF16", torch.bfloat16, "BF16"),  # a bf16 fine-tune of a bf16 base: BF16 kept
])
def test_the_precision_rule(base, values, written, tmp_path):
    """The narrowest type that holds the grafted tensor bit for bit: its own float type, BF16, else F32; the
    norms (F32 in the file) stay F32."""
    from tiny import tiny_gguf_graft

    path, graft, pre = tiny_gguf_graft(tmp_path / "base", quantize=base, values_dtype=values)
    s = export_graft(graft, tmp_path / "out.gguf", ExportSpec(to="gguf"), base=pre)
    assert s["exact"] and s["kept"] == graft.size
    assert {w["to"] for g, w in s["written"].items() if "norm" not in g} == {written}
    assert {w["to"] for g, w in s["written"].items() if "norm" in g} == {"F32"}
    assert (not s["changed_type"]) == (written == (base or "F32"))


def test_the_smallest_exact_type_is_chosen(tmp_path):
    """Issue 80: a touched tensor is written at the smallest type that holds it bit for bit, not F32 by default. A
    graft whose values lie on the Q8_0 block grid of a Q8_0 base (each grafted coordinate −θ_pre: the same scale,
    the negated quant) keeps Q8_0 — the file is the base's size — and the plain gguf package reads every grafted
    value back exactly; the norms (F32 in the file) stay F32."""
    import gguf

    from skillgraft.export.base import human_size
    from skillgraft.graft import Graft
    from tiny import tiny_gguf_graft

    path, g, pre = tiny_gguf_graft(tmp_path / "base")
    params = dict(pre.named_parameters())
    values = {n: (-params[n].detach().reshape(-1)[i] if "norm" not in n else v) for (n, i), v in
              zip(g.region.indices.items(), g.values.values())}
    on_grid = Graft(g.region, values, {}, g.base_model, g.base_fingerprint, g.metadata)
    s = export_graft(on_grid, tmp_path / "out.gguf", ExportSpec(to="gguf"), base=pre)
    assert s["exact"] and s["kept"] == on_grid.size
    assert {w["to"] for n, w in s["written"].items() if "norm" not in n} == {"Q8_0"}
    assert {w["to"] for n, w in s["written"].items() if "norm" in n} == {"F32"}
    assert s["bytes"] <= s["base_bytes"] + 4096  # the base's size (+ the skillgraft.graft key)
    reader = _reader(tmp_path / "out.gguf")
    got = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    base = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in _reader(path).tensors}
    for name, w in s["written"].items():
        if "norm" in name:
            continue
        diff = got[name] != base[name]
        assert int(diff.sum()) == w["coordinates"], name  # exactly the grafted coordinates changed …
        assert np.array_equal(got[name][diff], -base[name][diff]), name  # … to the grafted values, exactly
    assert human_size(s["bytes"]).endswith("KiB") and human_size(564865 * 1024) == "551.6 MiB"


def _k_blocks(qtype, n=6, seed=0):
    """``n`` blocks of a K-quant type (gguf-py cannot quantize them): random quants and sub-block scales, sane f16
    block scales where the type keeps them (Q4_K/Q5_K: d, dmin first; Q6_K: d last)."""
    import gguf

    rng = np.random.default_rng(seed)
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    if qtype.name == "Q6_K":
        blocks[:, -2:] = np.full((n, 1), 1e-3, dtype=np.float16).view(np.uint8)
    else:
        blocks[:, :4] = np.full((n, 2), [1e-2, 5e-3], dtype=np.float16).view(np.uint8)
    return blocks


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_grafted_values_move_inside_the_base_blocks(kind):
    """Issue 80: a grafted coordinate is set to its own block's nearest level by changing only its own quant bits —
    read back with plain gguf-py's dequantizer, every other value of the tensor is the base's bit for bit, a value
    the block can hold is hit exactly, and no grafted value ends farther from its target than the base's. K-quants
    (which gguf-py cannot quantize) included."""
    import gguf

    from skillgraft.export.gguf_blocks import rerounded, value_bits

    qtype = getattr(gguf.GGMLQuantizationType, kind)
    per_block = gguf.GGML_QUANT_SIZES[qtype][0]
    if kind.endswith("_K"):
        data = _k_blocks(qtype)
    else:
        data = gguf.quants.quantize(np.random.default_rng(1).standard_normal((6, per_block)).astype(np.float32), qtype)
    base = gguf.quants.dequantize(data, qtype).reshape(-1)
    rng = np.random.default_rng(2)
    flat = np.sort(rng.choice(base.size, 24, replace=False))
    target = (base[flat] + rng.normal(0, np.abs(base).mean() + 1e-3, flat.size)).astype(np.float32)
    # the first target is another level of its own block: the base value with one of its own bits flipped
    bits = value_bits(data, qtype)
    probe = np.array(data, copy=True).reshape(-1, data.shape[-1] if data.ndim > 1 else data.size)
    probe = probe.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])
    b = bits[flat[0] % per_block][0]
    probe[flat[0] // per_block, b // 8] ^= np.uint8(1 << (b % 8))
    target[0] = gguf.quants.dequantize(probe, qtype).reshape(-1)[flat[0]]
    out, values = rerounded(data, qtype, flat, target)
    back = gguf.quants.dequantize(out, qtype).reshape(-1)
    others = np.ones(base.size, dtype=bool)
    others[flat] = False
    assert np.array_equal(back[others].view(np.uint32), base[others].view(np.uint32))
    assert np.array_equal(back[flat], values) and back[flat[0]] == target[0]
    assert (np.abs(back[flat] - target) <= np.abs(base[flat] - target)).all()
    assert (back[flat] != base[flat]).sum() >= flat.size // 3  # many moved towards their targets


def test_base_type_keeps_the_base_file_size(grafted, tmp_path):
    """``--gguf-type base``: every tensor keeps the base's type (the file the base's size); read back with plain
    gguf-py, every untouched value of a touched tensor is the base's bit for bit and each grafted value its block's
    level nearest the graft's; the summary's measured check (the share of the graft's change kept) is what the
    read-back values give, and the CLI says it in one line — a warning under 90 %."""
    import gguf

    from skillgraft.export import get_exporter
    from skillgraft.export.gguf import KEPT_WARN

    graft, pre = grafted["graft"], grafted["pre"]
    out = tmp_path / "base.gguf"
    s = export_graft(graft, out, ExportSpec(to="gguf", gguf_type="base"), base=pre)
    ours, base = _reader(out), _reader(grafted["base"])
    assert [t.tensor_type for t in ours.tensors] == [t.tensor_type for t in base.tensors] and not s["changed_type"]
    assert s["bytes"] <= s["base_bytes"] + 4096
    want = {n.removeprefix("model."): v for n, v in graft.values.items()}
    to_gguf = {w["parameter"].removeprefix("model."): g for g, w in s["written"].items()}
    got_t = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1) for t in ours.tensors}
    base_t = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1) for t in base.tensors}
    missed = change = share = 0.0
    for name, g in to_gguf.items():
        idx = graft.region.indices["model." + name].numpy()
        target = want[name].float().numpy() + (1 if "norm" in g else 0)  # Gemma's norms: stored as 1 + w
        got, was = got_t[g], base_t[g]
        others = np.ones(got.size, dtype=bool)
        others[idx] = False
        assert np.array_equal(got[others], was[others]), g
        assert (np.abs(got[idx] - target) <= np.abs(was[idx] - target) + 1e-7).all(), g
        missed += float(np.sum((got[idx] - target).astype(np.float64) ** 2))
        change += float(np.sum((target - was[idx]).astype(np.float64) ** 2))
        moved = np.abs(target - was[idx]).astype(np.float64)
        share += float(np.clip(1 - np.abs(got[idx] - target) / moved, 0, 1).sum())  # noise: every coordinate moved
    assert s["change_kept"] == pytest.approx(1 - (missed / change) ** 0.5, abs=1e-4) and s["collateral"] == 0
    assert 0 < s["change_kept"] < 1 and s["share_kept"] == pytest.approx(share / graft.size, abs=1e-4)
    line = [(lvl, x) for lvl, x in get_exporter("gguf").lines(s) if "of the graft's change" in x]
    assert len(line) == 1 and (line[0][0] == "warning") == (min(s["change_kept"], s["share_kept"]) < KEPT_WARN)
    assert f"{s['change_kept']:.1%}" in line[0][1] and "MiB" not in line[0][1]
    _hf(out)  # transformers reads it


def test_a_graft_below_the_blocks_resolution_is_warned_of(grafted, tmp_path):
    """A graft far below the base blocks' resolution keeps ~none of its change in the base's type: one warning line."""
    from skillgraft.export import get_exporter
    from skillgraft.graft import Graft

    g, pre = grafted["graft"], grafted["pre"]
    params = dict(pre.named_parameters())
    small = {n: params[n].detach().reshape(-1)[i] * (1 + 2 ** -20) for n, i in g.region.indices.items()}
    tiny = Graft(g.region, small, {}, g.base_model, g.base_fingerprint, g.metadata)
    s = export_graft(tiny, tmp_path / "small.gguf", ExportSpec(to="gguf", gguf_type="base"), base=pre)
    warned = [x for lvl, x in get_exporter("gguf").lines(s) if lvl == "warning"]
    assert s["change_kept"] < 0.9 and len(warned) == 1 and "under 90%" in warned[0]


# ---------------------------------------------------------------------------------------------- refusals
def _one_line(text: str, message: str) -> None:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("skillgraft: converting")
             and "de-quantizing" not in ln]  # a base model converted on first use says so on stderr
    assert message in text, text
    assert "Traceback" not in text and len(lines) <= 2, lines


def test_refusals_are_one_line_before_any_work(grafted, tiny_models, tmp_path):
    from tiny import write_tiny_gguf

    g = grafted["dir"]
    out = tmp_path / "x.gguf"
    out.write_bytes(b"keep me")
    _one_line(cli("export", g, "--to", "gguf", "--out", out, code=2), "already exists")
    assert out.read_bytes() == b"keep me"
    out = tmp_path / "new.gguf"
    _one_line(cli("export", g, "--to", "gguf", "--out", tmp_path / "folder", code=2), "FILE.gguf")
    _one_line(cli("export", g, "--to", "gguf", "--gguf-type", "Q9_9", "--out", out, code=2),
              "unknown quantization type 'Q9_9'")
    # a base that is not the graft's: the same architecture, other values
    (tmp_path / "other").mkdir()
    other, _ = write_tiny_gguf(tmp_path / "other" / "other.gguf", quantize=None)
    _one_line(cli("export", g, "--to", "gguf", "--model", other, "--out", out, code=2), "fingerprint")
    # a tensor of a type gguf-py does not know
    data = bytearray(grafted["base"].read_bytes())
    at = data.find(b"blk.5.ffn_up.weight") + len(b"blk.5.ffn_up.weight")
    at += 4 + 8 * int.from_bytes(data[at:at + 4], "little")  # past n_dims and the dims: the type id
    data[at:at + 4] = (99).to_bytes(4, "little")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "odd.gguf").write_bytes(bytes(data))
    _one_line(cli("export", g, "--to", "gguf", "--model", tmp_path / "odd" / "odd.gguf", "--out", out, code=2),
              "unknown quantization type")
    # a graft on a Hugging Face model: the route there, in one line
    hf_graft = type(grafted["graft"])(grafted["graft"].region, grafted["graft"].values, {}, str(tiny_models["gemma3"]),
                                      "0" * 16, grafted["graft"].metadata)
    hf_graft.save_pretrained(tmp_path / "hf-graft")
    _one_line(cli("export", tmp_path / "hf-graft", "--to", "gguf", "--out", out, code=2), "--to hf")
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))
