"""Bad inputs and faults: each gets a one-line error naming the culprit, before any work, and nothing that
existed before is touched (docs/reliability.md lists the guarantees)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.graft import Graft, Region, graftable_names
from skillgraft.models import build_scorer

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tiny_graft(tiny_bert, tmp_path_factory):
    """A small graft on the tiny BERT (task SST-2, head mode), saved to a folder."""
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    ft = build_scorer(str(tiny_bert), "SST-2", "head", head_seed=1)
    names = graftable_names(pre)
    region = Region({n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}, {names[0]: [0, 3, 5]})
    folder = tmp_path_factory.mktemp("graft") / "g"
    Graft.from_models(pre, ft, region, {"task": "SST-2", "mode": "head"}).save_pretrained(folder)
    return folder


def test_export_never_deletes_an_existing_folder(tiny_graft, tiny_bert, toy_data, tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "precious.txt").write_text("keep me")
    r = invoke("apply", tiny_graft, "--model", tiny_bert, "--export", target, "--evaluate-on", "",
               "--data-dir", toy_data)
    assert r.exit_code == 2, r.output
    assert "already exists" in r.output and str(target) in r.output.replace("\n", "")
    assert "Traceback" not in r.output
    assert (target / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in target.iterdir()) == ["precious.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mine")]  # no partial sibling left behind
    # with --overwrite the folder is replaced whole by a complete checkpoint
    r = invoke("apply", tiny_graft, "--model", tiny_bert, "--export", target, "--evaluate-on", "", "--overwrite",
               "--data-dir", toy_data)
    assert r.exit_code == 0, r.output
    assert (target / "config.json").is_file() and not (target / "precious.txt").exists()


def test_library_export_refuses_existing_folder(tiny_graft, tiny_bert, tmp_path):
    from skillgraft.errors import SkillgraftError

    target = tmp_path / "out"
    target.mkdir()
    (target / "other.bin").write_bytes(b"\x00\x01")
    g = Graft.from_pretrained(tiny_graft)
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    with pytest.raises(SkillgraftError, match="already exists"):
        g.export(pre, target)
    assert (target / "other.bin").read_bytes() == b"\x00\x01"
    assert all((p == before[n]).all() for n, p in pre.named_parameters())  # model untouched after the refusal
