"""Bad graft files, PEFT adapters, region folders and continual states (graft/, export/ readers); non-finite values.

Every case runs the CLI in-process and asserts: exit code 2, no traceback, one ``error:`` line naming the file /
field / option / value at fault (or click's usage error naming the option), and that the folder holding the
inputs and the output is byte for byte as it was (docs/reliability.md; helpers: tests/badinputs.py)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from skillgraft.graft import Graft
from badinputs import edit_json, edit_tensors, graft_args, invoke, refused, truncate


# ---------------------------------------------------------------------------------------------- graft files
def _graft_config(change):
    return edit_json("graft_config.json", change)


def _graft_tensors(change):
    """Rewrite graft.safetensors with ``change`` applied and its checksum updated (so the deeper check is hit)."""
    def edit(folder):
        path = folder / "graft.safetensors"
        tensors = load_file(str(path))
        change(tensors)
        save_file(tensors, str(path))
        _graft_config(lambda c: c.update(weights_sha256=hashlib.sha256(path.read_bytes()).hexdigest()))(folder)
    return edit


def _flip(folder):
    path = folder / "graft.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


def _duplicate(t):
    idx = t["indices"].clone()
    idx[2] = idx[1]
    t["indices"] = idx


GRAFT_CASES = {
    # id: (damage to a copy of a good graft folder, verb, culprits)
    "truncated": (truncate("graft.safetensors", 100), "apply", ["graft.safetensors", "truncated or corrupted"]),
    "bit-flipped": (_flip, "inspect", ["graft.safetensors"]),
    "shapes-removed": (_graft_config(lambda c: c.pop("shapes")), "export", ["graft_config.json", "'shapes'"]),
    "size-removed": (_graft_config(lambda c: c.pop("size")), "apply", ["graft_config.json", "'size'"]),
    "config-not-json": (lambda f: (f / "graft_config.json").write_text("{"), "inspect",
                        ["graft_config.json", "not valid JSON"]),
    "weights-missing": (lambda f: (f / "graft.safetensors").unlink(), "apply", ["not a graft folder"]),
    "indices-shuffled": (_graft_tensors(lambda t: t.update(indices=t["indices"][[1, 0, 2, 3, 4, 5]].contiguous())),
                         "apply", ["graft.safetensors", "'indices'[1]", "sorted and unique"]),
    "indices-duplicated": (_graft_tensors(_duplicate), "inspect", ["'indices'[2]", "duplicated"]),
    "size-mismatch": (_graft_config(lambda c: c.update(size=5, density=c["density"] * 5 / c["size"])), "apply",
                      ["holds 6 positions", "declares 5"]),
    "fingerprint-removed": (_graft_config(lambda c: c.pop("base_fingerprint")), "apply", ["base_fingerprint",
                                                                                          "--force"]),
    "fingerprint-removed-export": (_graft_config(lambda c: c.pop("base_fingerprint")), "export",
                                   ["base_fingerprint", "--force"]),
    # non-finite values with a matching checksum (a buggy writer, another tool): refused, never applied
    "values-nan": (_graft_tensors(lambda t: t["values"].__setitem__(4, float("nan"))), "apply",
                   ["graft.safetensors", "'values'[4] is nan", "coordinate 1 of", "finite"]),
    "values-inf": (_graft_tensors(lambda t: t["values"].__setitem__(0, float("inf"))), "export",
                   ["graft.safetensors", "'values'[0] is inf", "coordinate 0 of"]),
    "values-minus-inf": (_graft_tensors(lambda t: t["values"].__setitem__(5, float("-inf"))), "inspect",
                         ["graft.safetensors", "'values'[5] is -inf"]),
    "carried-nan": (_graft_tensors(lambda t: t["carried::head.weight"].view(-1).__setitem__(7, float("nan"))),
                    "apply", ["graft.safetensors", "carried tensor 'head.weight'[7] is nan"]),
}


@pytest.mark.parametrize("case", list(GRAFT_CASES))
def test_bad_graft_file(case, tiny_graft, tiny_bert, toy_data, tmp_path):
    damage, verb, culprits = GRAFT_CASES[case]
    folder = tmp_path / "g"
    shutil.copytree(tiny_graft, folder)
    damage(folder)
    args = {"apply": ["apply", folder, "--model", tiny_bert, "--data-dir", toy_data, "--export", tmp_path / "x"],
            "inspect": ["inspect", folder],
            "export": ["export", folder, "--model", tiny_bert, "--to", "delta", "--out", tmp_path / "x"]}[verb]
    line = refused(tmp_path, args, *culprits)
    assert str(folder) in line


def test_missing_fingerprint_is_accepted_with_force(tiny_graft, tiny_bert, toy_data, tmp_path):
    folder = tmp_path / "g"
    shutil.copytree(tiny_graft, folder)
    _graft_config(lambda c: c.pop("base_fingerprint"))(folder)
    r = invoke("apply", folder, "--model", tiny_bert, "--data-dir", toy_data, "--limit", 4, "--force")
    assert r.exit_code == 0, r.output


def test_graft_with_nan_is_never_exported(tiny_graft, tiny_bert, toy_data, tmp_path):
    """The issue's case: a NaN in graft.safetensors with a matching weights_sha256. `apply --export` is refused
    before any model is written; `Graft.from_pretrained` refuses it too (nothing to apply)."""
    from skillgraft.errors import SkillgraftError

    folder = tmp_path / "g"
    shutil.copytree(tiny_graft, folder)
    _graft_tensors(lambda t: t["values"].__setitem__(2, float("nan")))(folder)
    refused(tmp_path, ["apply", folder, "--model", tiny_bert, "--data-dir", toy_data, "--export", tmp_path / "x",
                       "--force"], "'values'[2] is nan")
    with pytest.raises(SkillgraftError, match=r"graft\.safetensors: tensor 'values'\[2\] is nan"):
        Graft.from_pretrained(folder)


def test_a_graft_with_non_finite_values_is_never_written(tiny_graft, tmp_path):
    from skillgraft.errors import SkillgraftError

    g = Graft.from_pretrained(tiny_graft)
    name = next(iter(g.values))
    g.values[name][1] = float("nan")
    with pytest.raises(SkillgraftError, match=r"tensor 'values'\[1\] is nan"):
        g.save_pretrained(tmp_path / "g")
    assert list(tmp_path.iterdir()) == []


def _first_float(position, value):
    """Set ``position`` of the first floating-point tensor (by name) to ``value``."""
    def edit(tensors):
        key = next(k for k, t in sorted(tensors.items()) if t.is_floating_point())
        tensors[key].view(-1)[position] = value
    return edit


ADAPTER_CASES = {
    # id: (damage to a copy of a SHiRA adapter exported from the tiny graft, culprits)
    "weights-nan": (edit_tensors("adapter_model.safetensors", _first_float(1, float("nan"))),
                    ["adapter_model.safetensors", "[1] is nan"]),
    "weights-inf": (edit_tensors("adapter_model.safetensors", _first_float(0, float("inf"))),
                    ["adapter_model.safetensors", "[0] is inf"]),
    "head-nan": (edit_tensors("skillgraft_head.safetensors", _first_float(1, float("nan"))),
                 ["skillgraft_head.safetensors", "[1] is nan"]),
    "weights-truncated": (truncate("adapter_model.safetensors", 50), ["adapter_model.safetensors", "truncated"]),
}


@pytest.mark.parametrize("case", list(ADAPTER_CASES))
def test_bad_peft_adapter(case, tiny_adapter, tiny_bert, tmp_path):
    """An imported PEFT adapter (`inspect ADAPTER`, `--compare ADAPTER`) holding NaN / ±Inf, or truncated."""
    damage, culprits = ADAPTER_CASES[case]
    folder = tmp_path / "a"
    shutil.copytree(tiny_adapter, folder)
    damage(folder)
    refused(tmp_path, ["inspect", folder, "--model", tiny_bert, "--out", tmp_path / "i"], str(folder), *culprits)


def test_fim_of_a_model_with_an_inf_weight_is_refused(tiny_bert, toy_data, tmp_path):
    model = tmp_path / "bert"
    shutil.copytree(tiny_bert, model)
    edit_tensors("model.safetensors", lambda t: t[sorted(t)[2]].view(-1).__setitem__(4, float("-inf")),
                  metadata={"format": "pt"})(model)
    refused(tmp_path, ["fim", "--task", "SST-2", "--k", 4, "--model", model, "--n", 4, "--data-dir", toy_data,
                       "--out", tmp_path / "f"], str(model), "[4] is -inf", "Fisher scores would be meaningless")


def test_fine_tuning_whose_loss_turns_non_finite_stops(tiny_bert, toy_data, tmp_path):
    """SGD at lr 1e30 sends the weights to ±Inf after one step: one line naming the step, no run directory."""
    refused(tmp_path, ["finetune", "--task", "SST-2", "--k", 4, "--model", tiny_bert, "--steps", 4, "--lr", 1e30,
                       "--test-limit", 4, "--data-dir", toy_data, "--out", tmp_path / "run"],
            "fine-tuning stopped at step 2", "the loss is nan", "--lr")


def test_a_checkpoint_with_nan_weights_is_refused_before_grafting(ft_run, toy_data, tmp_path):
    """A run whose model holds a NaN (a diverged fine-tuning saved by an older version, a damaged file)."""
    run = tmp_path / "run"
    shutil.copytree(ft_run, run)
    path = run / "model" / "model.safetensors"
    tensors = load_file(str(path))
    key = sorted(k for k in tensors if k.endswith("attention.self.query.weight"))[0]
    tensors[key].view(-1)[5] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})
    line = refused(tmp_path, graft_args(run, toy_data, tmp_path / "g", tmp_path / "store"), f"{run}/model",
                   "[5] is nan", "cannot be grafted")
    assert "query.weight" in line


@pytest.mark.parametrize("localizer", ["learned", "straight-through"])
def test_localization_whose_loss_turns_non_finite_stores_nothing(localizer, ft_run, toy_data, tmp_path, monkeypatch):
    """A loss that turns NaN mid-localization (injected at its second step) stops it with one line; no region
    reaches the store, no report folder."""
    from skillgraft.graft.localizers.machinery import engine

    calls = {"n": 0}

    def poisoned(loss):
        calls["n"] += 1
        return loss * float("nan") if calls["n"] > 1 else loss

    real_batch_loss = engine.batch_loss  # every learned localizer's loss (one engine)
    monkeypatch.setattr(engine, "batch_loss", lambda *a, **k: poisoned(real_batch_loss(*a, **k)))
    store = tmp_path / "store"
    store.mkdir()  # stays empty: no regions entry
    fixed = ["--schedule", "fixed"] if localizer == "learned" else []  # a tiny pair's start already fits
    refused(tmp_path, [*graft_args(ft_run, toy_data, tmp_path / "g", store), "--localizer", localizer, *fixed],
            "localization stopped at step 2", "the loss is nan")

# ------------------------------------------------------------------------------------------- region and state folders
def _region_tensors(change):
    return edit_tensors("region.safetensors", lambda t: change(t[sorted(t)[0]]))


REGION_CASES = {
    # id: (damage to a region folder (`continual add --region DIR`), culprits)
    "json-broken": (lambda d: (d / "region.json").write_text("{"), ["region.json", "not valid JSON"]),
    "json-a-list": (lambda d: (d / "region.json").write_text("[]"), ["region.json", "expected a JSON object"]),
    "no-shapes": (edit_json("region.json", lambda m: m.pop("shapes")), ["region.json", "'shapes'"]),
    "weights-truncated": (truncate("region.safetensors", 30), ["region.safetensors", "truncated or corrupted"]),
    "weights-missing": (lambda d: (d / "region.safetensors").unlink(), ["no region.safetensors"]),
    "index-out-of-range": (_region_tensors(lambda t: t.__setitem__(0, 10**9)),
                           ["region.safetensors", "[0] = 1000000000 is out of range"]),
    "index-negative": (_region_tensors(lambda t: t.__setitem__(0, -5)), ["region.safetensors", "[0] = -5"]),
    "float-indices": (edit_tensors("region.safetensors", lambda t: t.update({k: v.float() for k, v in t.items()})),
                      ["region.safetensors", "dtype torch.float32", "int32 or int64"]),
    "size-mismatch": (edit_json("region.json", lambda m: m.update(size=m["size"] + 1)),
                      ["region.safetensors", "'size' declares"]),
}


@pytest.mark.parametrize("case", list(REGION_CASES))
def test_bad_region_folder(case, tiny_graft, tiny_bert, toy_data, tmp_path):
    damage, culprits = REGION_CASES[case]
    folder = tmp_path / "region"
    Graft.from_pretrained(tiny_graft).region.save(folder)
    damage(folder)
    refused(tmp_path, ["continual", "add", "--state", tmp_path / "state", "--task", "SST-2", "--k", 4, "--model",
                       tiny_bert, "--region", folder, "--steps", 1, "--test-limit", 4, "--data-dir", toy_data],
            str(folder), *culprits)


@pytest.mark.parametrize("content, says", [("[]", "expected a JSON object, got list"),
                                           ('{"format": "skillgraft.continual"}', "missing field(s) ['tasks']")])
def test_bad_continual_state(content, says, tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "continual.json").write_text(content)
    refused(tmp_path, ["continual", "show", tmp_path / "state"], str(tmp_path / "state" / "continual.json"), says)


def _header(change):
    """Rewrite the adapter's ``skillgraft`` safetensors header with ``change`` applied (a dict, or raw text)."""
    def edit(folder):
        from safetensors import safe_open

        path = folder / "adapter_model.safetensors"
        with safe_open(str(path), "pt") as f:
            header = dict(f.metadata())
        tensors = load_file(str(path))
        meta = json.loads(header["skillgraft"])
        header["skillgraft"] = change(meta) if callable(change) else change
        if not isinstance(header["skillgraft"], str):
            header["skillgraft"] = json.dumps(header["skillgraft"])
        save_file(tensors, str(path), metadata=header)
    return edit


def _first_layer(meta):
    return next(iter(meta["shira_entries"]))


HEADER_CASES = {
    # id: (change to the header, culprits)
    "not-json": (_header("{not json"), ["'skillgraft' header is not valid JSON"]),
    "a-list": (_header(lambda m: [m]), ["must be a JSON object", "list"]),
    "entries-a-list": (_header(lambda m: {**m, "shira_entries": [3]}), ["'shira_entries' must be an object"]),
    "entry-count-negative": (_header(lambda m: {**m, "shira_entries": {_first_layer(m): -2}}),
                             ["shira_entries.", "whole number ≥ 0", "-2"]),
    "entry-count-a-string": (_header(lambda m: {**m, "shira_entries": {_first_layer(m): "4"}}),
                             ["shira_entries.", "whole number"]),
    "entry-count-too-large": (_header(lambda m: {**m, "shira_entries": {_first_layer(m): 10**6}}),
                              ["shira_entries.", "1000000 is more than the"]),
    "shapes-a-string": (_header(lambda m: {**m, "shapes": "32x32"}), ["'shapes' must be an object"]),
    "metadata-a-list": (_header(lambda m: {**m, "metadata": []}), ["'metadata' must be an object"]),
    "mode-a-number": (_header(lambda m: {**m, "mode": 3}), ["'mode' must be text"]),
}


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_an_adapter_with_a_malformed_skillgraft_header_is_refused_naming_the_field(case, tiny_adapter, tiny_bert,
                                                                                   tmp_path):
    damage, culprits = HEADER_CASES[case]
    folder = tmp_path / "a"
    shutil.copytree(tiny_adapter, folder)
    damage(folder)
    refused(tmp_path, ["inspect", folder, "--model", tiny_bert, "--out", tmp_path / "i"],
            str(folder / "adapter_model.safetensors"), *culprits)


def test_a_graft_whose_recorded_base_cannot_be_found_names_its_file(tiny_graft, toy_data, tmp_path):
    """`apply G` without --model loads the base graft_config.json names; `../../x` was `model checkpoint not found:
    ../../x`, naming neither the file nor the field, nor --model."""
    folder = tmp_path / "g"
    shutil.copytree(tiny_graft, folder)
    _graft_config(lambda c: c.update(base_model="../../x"))(folder)
    refused(tmp_path, ["apply", folder, "--data-dir", toy_data, "--limit", 4], str(folder / "graft_config.json"),
            "'../../x'", "--model")
