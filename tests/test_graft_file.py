"""The graft file trusts nothing: every damaged or inconsistent graft folder is one SkillgraftError naming the
file and the field or position at fault (and exit 2 without a traceback in the CLI)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.graft.graft_file import CONFIG_FILE, FORMAT_VERSION, WEIGHTS_FILE
from skillgraft.graft.region import Region
from skillgraft.models import build_scorer
from skillgraft.models.anatomy import graftable_names

REQUIRED = ["format", "format_version", "base_model", "size", "shapes", "carried"]


@pytest.fixture(scope="module")
def models(tiny_bert):
    """(pre, ft): a tiny BERT and a perturbed copy with another head (no training needed)."""
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    ft = build_scorer(str(tiny_bert), "SST-2", "head", head_seed=1)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in ft.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    return pre, ft


@pytest.fixture(scope="module")
def saved(models, tmp_path_factory):
    """A valid graft folder over three tensors (packed layout) and its graft."""
    pre, ft = models
    names = graftable_names(pre)
    shapes = {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}
    region = Region(shapes, {names[0]: [0, 3, 5, 17], names[2]: [1, 2], names[-1]: [0, shapes[names[-1]][0] - 1]})
    graft = Graft.from_models(pre, ft, region, {"task": "SST-2", "mode": "head"})
    folder = tmp_path_factory.mktemp("graft-file") / "g"
    graft.save_pretrained(folder)
    return folder, graft


@pytest.fixture
def copy(saved, tmp_path):
    folder = tmp_path / "g"
    shutil.copytree(saved[0], folder)
    return folder


def edit_config(folder, change):
    path = folder / CONFIG_FILE
    cfg = json.loads(path.read_text())
    change(cfg)
    path.write_text(json.dumps(cfg))


def edit_tensors(folder, change, rehash=True):
    """Rewrite graft.safetensors with ``change(tensors)`` applied; update the checksum so later checks are reached."""
    path = folder / WEIGHTS_FILE
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))
    if rehash:
        edit_config(folder, lambda c: c.update(weights_sha256=hashlib.sha256(path.read_bytes()).hexdigest()))


def refused(folder, *fragments):
    """Loading ``folder`` fails with one line naming the file and every fragment (regexes)."""
    with pytest.raises(SkillgraftError) as info:
        Graft.from_pretrained(folder)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(folder) in msg and (CONFIG_FILE in msg or WEIGHTS_FILE in msg), msg
    for f in fragments:
        assert re.search(f, msg), (f, msg)
    return msg


def test_round_trip_is_exact(saved):
    folder, graft = saved
    back = Graft.from_pretrained(folder)
    assert back.region == graft.region and back.source == folder
    assert all(torch.equal(back.values[n], graft.values[n]) for n in graft.values)
    assert all(torch.equal(back.carried[n], graft.carried[n]) for n in graft.carried)
    cfg = json.loads((folder / CONFIG_FILE).read_text())
    assert cfg["carried_shapes"] == {"head.weight": [2, 32], "head.bias": [2]}
    assert cfg["weights_sha256"] == hashlib.sha256((folder / WEIGHTS_FILE).read_bytes()).hexdigest()


def test_truncated_weights(copy):
    path = copy / WEIGHTS_FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    refused(copy, WEIGHTS_FILE, "truncated or corrupted")
    path.write_bytes(data[:5])
    refused(copy, WEIGHTS_FILE, "truncated or corrupted")


@pytest.mark.parametrize("where", ["header", "data", "last"])
def test_flipped_byte(copy, where):
    path = copy / WEIGHTS_FILE
    data = bytearray(path.read_bytes())
    header = int.from_bytes(data[:8], "little") + 8
    i = {"header": 20, "data": header + 3, "last": len(data) - 1}[where]
    data[i] ^= 0x40
    path.write_bytes(bytes(data))
    refused(copy, WEIGHTS_FILE, "(weights_sha256|truncated or corrupted)")


def test_flipped_index_byte_without_checksum_is_still_caught(copy):
    edit_config(copy, lambda c: c.pop("weights_sha256"))
    path = copy / WEIGHTS_FILE
    data = bytearray(path.read_bytes())
    header = int.from_bytes(data[:8], "little") + 8
    offsets = json.loads(data[8:header])["indices"]["data_offsets"]
    data[header + offsets[0] + 4 * 2 + 3] ^= 0x40  # most significant byte of the third int32 position
    path.write_bytes(bytes(data))
    refused(copy, r"'indices'\[2\] = \d+ is out of range")


@pytest.mark.parametrize("field", REQUIRED)
def test_each_required_field_removed(copy, field):
    edit_config(copy, lambda c: c.pop(field))
    refused(copy, CONFIG_FILE, f"'{field}'")


def test_bad_config_values(copy):
    edit_config(copy, lambda c: c.update(size=-1))
    refused(copy, "'size'", "greater than or equal to 0")
    edit_config(copy, lambda c: c.update(size=3, shapes={"x": [2, "a"]}))
    refused(copy, r"'shapes\.x\.1'")
    edit_config(copy, lambda c: c.update(shapes={}, size=0))
    refused(copy, "'graftable_parameters'")


def test_unknown_field_and_bad_json(copy):
    edit_config(copy, lambda c: c.update(colour="blue"))
    refused(copy, "'colour'", "unknown field")
    (copy / CONFIG_FILE).write_text("{not json")
    refused(copy, CONFIG_FILE, "not valid JSON")


def test_format_version_too_new(copy):
    edit_config(copy, lambda c: c.update(format_version=FORMAT_VERSION + 1))
    refused(copy, "'format_version'", "newer than this skillgraft")
    edit_config(copy, lambda c: c.update(format_version=1, format="something.else"))
    refused(copy, "'format'", "not a skillgraft graft")


def test_indices_shuffled(copy):
    edit_tensors(copy, lambda t: t.update(indices=t["indices"][[1, 0, *range(2, t["indices"].numel())]].contiguous()))
    refused(copy, WEIGHTS_FILE, r"'indices'\[1\]", "sorted and unique", "out of order")


def test_indices_duplicated(copy):
    def dup(t):
        idx = t["indices"].clone()
        idx[2] = idx[1]
        t["indices"] = idx

    edit_tensors(copy, dup)
    refused(copy, r"'indices'\[2\]", "duplicated")


def test_indices_out_of_range_first_and_last(copy, saved):
    universe = saved[1].region.universe_size

    def first(t):
        idx = t["indices"].clone()
        idx[0] = -1
        t["indices"] = idx

    def last(t):
        idx = t["indices"].clone()
        idx[-1] = universe
        t["indices"] = idx

    edit_tensors(copy, first)
    refused(copy, r"'indices'\[0\] = -1 is out of range")
    shutil.rmtree(copy)
    shutil.copytree(saved[0], copy)
    edit_tensors(copy, last)
    n = saved[1].size
    refused(copy, rf"'indices'\[{n - 1}\] = {universe} is out of range \[0, {universe}\)")


def test_value_count_differs_from_size(copy, saved):
    n = saved[1].size
    edit_config(copy, lambda c: c.update(size=n - 1, density=(n - 1) / saved[1].region.universe_size))
    refused(copy, WEIGHTS_FILE, f"holds {n} positions", f"declares {n - 1}")


def test_value_count_differs_from_index_count(copy):
    edit_tensors(copy, lambda t: t.update(values=t["values"][:-1].contiguous()))
    refused(copy, "'indices' has", "values tensor has")


def test_wrong_dtypes(copy, saved):
    edit_tensors(copy, lambda t: t.update(indices=t["indices"].float()))
    refused(copy, "'indices'", "dtype torch.float32")
    shutil.rmtree(copy)
    shutil.copytree(saved[0], copy)
    edit_tensors(copy, lambda t: t.update(values=t["values"].to(torch.int32)))
    refused(copy, "'values'", "dtype torch.int32", "floating point")


def test_wrong_carried_shape(copy, saved):
    edit_tensors(copy, lambda t: t.update({"carried::head.weight": torch.zeros(3, 32)}))
    refused(copy, "'head.weight'", r"shape \[3, 32\]", r"declares \[2, 32\]")


def test_carried_missing_or_undeclared(copy, saved):
    edit_tensors(copy, lambda t: t.pop("carried::head.bias"))
    refused(copy, "'head.bias'", "missing")
    shutil.rmtree(copy)
    shutil.copytree(saved[0], copy)
    edit_tensors(copy, lambda t: t.update({"carried::head.extra": torch.zeros(2)}))
    refused(copy, "head.extra", "not declared")


def test_per_tensor_layout_is_validated_too(models, tmp_path):
    pre, ft = models
    names = graftable_names(pre)
    shapes = {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}
    g = Graft.from_models(pre, ft, Region(shapes, {names[0]: [1, 4], names[1]: [0]}))
    g.values[names[1]] = g.values[names[1]].double()  # mixed dtypes: per-tensor entries
    g.save_pretrained(tmp_path / "g")
    back = Graft.from_pretrained(tmp_path / "g")
    assert back.region == g.region and back.values[names[1]].dtype == torch.float64

    def swap(t):
        idx = t[f"{names[0]}::indices"]
        t[f"{names[0]}::indices"] = idx.flip(0).contiguous()

    edit_tensors(tmp_path / "g", swap)
    refused(tmp_path / "g", rf"'{re.escape(names[0])}::indices'\[1\]", "out of order")


def test_missing_fingerprint_is_refused_unless_forced(copy, models):
    pre, _ = models
    edit_config(copy, lambda c: c.pop("base_fingerprint"))
    g = Graft.from_pretrained(copy)  # loading is fine: the check belongs to apply
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    with pytest.raises(SkillgraftError) as info:
        g.apply(pre)
    assert str(copy) in str(info.value) and "base_fingerprint" in str(info.value) and "force" in str(info.value)
    assert all(torch.equal(p, before[n]) for n, p in pre.named_parameters())
    with g.applied(pre, force=True):
        pass
    assert all(torch.equal(p, before[n]) for n, p in pre.named_parameters())


# ---------------------------------------------------------------------------------------------- CLI
runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def damaged(saved, tmp_path):
    """(name, folder, culprit) for a few kinds of damage."""
    out = []
    for name, fn in [
        ("truncated", lambda f: (f / WEIGHTS_FILE).write_bytes((f / WEIGHTS_FILE).read_bytes()[:100])),
        ("no-shapes", lambda f: edit_config(f, lambda c: c.pop("shapes"))),
        ("too-new", lambda f: edit_config(f, lambda c: c.update(format_version=FORMAT_VERSION + 1))),
        ("dup", lambda f: edit_tensors(f, lambda t: t.update(indices=t["indices"][[0, 0, *range(2, len(t["indices"]))]]
                                                            .contiguous()))),
    ]:
        folder = tmp_path / name
        shutil.copytree(saved[0], folder)
        fn(folder)
        out.append((name, folder))
    return out


def test_cli_inspect_and_apply_exit_2_without_traceback(saved, tmp_path, tiny_bert, toy_data):
    for name, folder in damaged(saved, tmp_path):
        for args in (("inspect", folder), ("apply", folder, "--model", tiny_bert, "--evaluate-on", "",
                                           "--data-dir", toy_data)):
            r = cli(*args)
            flat = r.output.replace("\n", "")
            assert r.exit_code == 2, (name, args[0], r.output)
            assert "Traceback" not in r.output and str(folder) in flat, (name, r.output)


def test_cli_apply_without_fingerprint_needs_force(saved, tmp_path, tiny_bert, toy_data):
    folder = tmp_path / "g"
    shutil.copytree(saved[0], folder)
    edit_config(folder, lambda c: c.pop("base_fingerprint"))
    args = ("apply", folder, "--model", tiny_bert, "--evaluate-on", "test", "--limit", 8, "--data-dir", toy_data)
    r = cli(*args)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "base_fingerprint" in r.output and "--force" in r.output
    r = cli(*args, "--force")
    assert r.exit_code == 0, r.output
    assert "acc" in r.output
