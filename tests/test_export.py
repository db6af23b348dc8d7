"""Export targets (PEFT SHiRA adapter, plain delta, HF checkpoint) and SHiRA import, on tiny BERT / GPT-2 / Llama.

The reading side never uses skillgraft: ``plain_*`` below import only torch, transformers, peft and
safetensors (and one test runs the reader in a fresh interpreter to prove it).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from grafts import assert_same_weights, exported_weights, make_graft
from plain import mergekit_style_merge

from skillgraft.errors import SkillgraftError
from skillgraft.export.base import human_size
from skillgraft.export import (ExportSpec, apply_entries, exact_delta, export_delta, export_graft, export_peft,
                               get_exporter, graft_from_peft, shira_entries)
from skillgraft.models import build_scorer

HF_CLASS = {"head": "AutoModel", "prompt": "AutoModelForMaskedLM", "causal": "AutoModelForCausalLM"}


# ---------------------------------------------------------------------------------------------- helpers
def linear_weights_only(name: str) -> bool:
    return name.endswith("weight") and "LayerNorm" not in name


def batch(pre, n=3):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (n, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0
    return ids, mask


def grafted_outputs(pre, graft, ids, mask):
    with graft.applied(pre), torch.no_grad():
        out = pre.model(input_ids=ids, attention_mask=mask)
        labels = pre(input_ids=ids, attention_mask=mask) if pre.mode == "head" else None
    return _main_output(out), labels


def _main_output(out):
    return out.logits if "logits" in out else out.last_hidden_state


def plain_peft(base_dir, adapter_dir, cls_name, ids, mask):
    """A user without skillgraft: base model + ``PeftModel.from_pretrained``; outputs and merged weights."""
    import peft
    import transformers

    torch.manual_seed(0)  # weights missing from the tiny checkpoint (BERT's pooler) initialise as skillgraft's do
    base = getattr(transformers, cls_name).from_pretrained(str(base_dir))
    model = peft.PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    with torch.no_grad():
        out = _main_output(model(input_ids=ids, attention_mask=mask))
    merged = model.merge_and_unload()
    return out, {k: v.detach().clone() for k, v in merged.state_dict().items()}


def plain_delta(base_dir, delta_dir, cls_name, semantics="values"):
    """A user without skillgraft: the stock safetensors reader writes the delta into the base weights."""
    import transformers
    from safetensors import safe_open

    torch.manual_seed(0)
    state = getattr(transformers, cls_name).from_pretrained(str(base_dir)).state_dict()
    with safe_open(str(delta_dir / "delta.safetensors"), "pt") as f:
        for name in {k.rsplit("::", 1)[0] for k in f.keys()}:
            w = state[name].view(-1)
            idx = f.get_tensor(f"{name}::indices").long()
            if semantics == "values":
                w[idx] = f.get_tensor(f"{name}::values")
            else:
                w[idx] += f.get_tensor(f"{name}::delta")
    return state


# ---------------------------------------------------------------------------------------------- PEFT export
def test_head_mode_linear_weights_are_pure_shira(tiny_bert, tmp_path):
    pre, graft = make_graft(tiny_bert, "head", keep=linear_weights_only)
    ids, mask = batch(pre)
    s = export_peft(graft, pre, tmp_path / "adapter", tuner="shira")
    shira, dense = s["routes"]["shira"], s["routes"]["modules_to_save"]
    assert shira["coordinates"] == graft.size and dense["coordinates"] == 0 and not dense["modules"]
    assert shira["entries"] == shira["coordinates"] + s["replace_pairs"] + shira["padding_entries"]
    assert s["inexact"] == 0 and 0 < s["replace_pairs"] < graft.size / 4  # three noisy steps shrink some weights
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "SHIRA" and cfg["r"] == shira["r"] and cfg["modules_to_save"] is None
    # every target holds exactly r·(m+n) entries (SHiRA's format)
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    for path in cfg["target_modules"]:
        w = pre.model.get_submodule(path).weight
        ij = tensors[f"base_model.model.{path}.shira_indices"]
        assert ij.dtype == torch.int16 and ij.shape == (2, cfg["r"] * sum(w.shape))
    out, merged = plain_peft(tiny_bert, tmp_path / "adapter", "AutoModel", ids, mask)
    ref, ref_labels = grafted_outputs(pre, graft, ids, mask)
    assert (out - ref).abs().max() <= 1e-6
    assert_same_weights(merged, exported_weights(pre, graft, tmp_path / "hf"))
    # the task head travels separately, clearly labelled, and completes the classifier
    from safetensors import safe_open

    head_path = tmp_path / "adapter" / "skillgraft_head.safetensors"
    with safe_open(str(head_path), "pt") as f:
        meta, weight, bias = f.metadata(), f.get_tensor("weight"), f.get_tensor("bias")
    assert meta["pooling"] == "mean" and json.loads(meta["labels"]) == list(pre.task.labels)
    m = mask.unsqueeze(-1).float()
    logits = ((out * m).sum(1) / m.sum(1)) @ weight.T + bias
    assert (logits - ref_labels).abs().max() <= 1e-6
    assert "Not a complete classifier" in (tmp_path / "adapter" / "README.md").read_text()
    assert s["routes"]["head"]["parameters"] == graft.carried_size


ROUTES = [("bert", "prompt", "modules_to_save"), ("bert", "head", "modules_to_save"),
          ("gpt2", "causal", "modules_to_save"), ("llama", "causal", "modules_to_save"),
          ("bert", "prompt", "tensors"), ("gpt2", "causal", "tensors"), ("llama", "causal", "tensors")]


@pytest.mark.parametrize("kind,mode,route", ROUTES)
def test_peft_plain_load_equals_grafted_model(tiny_models, tmp_path, kind, mode, route):
    """Every body tensor touched (weights, biases, norms): plain peft computes the grafted model.

    (BERT's pooler, unused by mean pooling and so never in a learned head-mode region, stays untouched: with
    every Linear bias grafted, it is the one nn.Linear left to carry the SHiRA adapter under modules_to_save.)
    """
    pre, graft = make_graft(tiny_models[kind], mode, keep=lambda n: "pooler" not in n)
    ids, mask = batch(pre)
    s = export_peft(graft, pre, tmp_path / "adapter", non_linear=route)
    routes = s["routes"]
    other = routes[route]
    assert routes["shira"]["coordinates"] + other["coordinates"] == graft.size
    assert other["stored_parameters"] >= other["coordinates"]
    reasons = set((other["modules"] if route == "modules_to_save" else other["tensors"]).values())
    if kind == "gpt2":  # peft's SHiRA wraps nn.Linear only: GPT-2's Conv1D weights take the other route
        assert any("Conv1D" in why for why in reasons)
        assert routes["shira"]["coordinates"] == 0 and routes["shira"]["placeholder"] == "lm_head"
    if kind == "llama":  # no biases: only the RMSNorms leave SHiRA
        assert routes["shira"]["coordinates"] > 0 and reasons == {"LlamaRMSNorm"}
    if route == "tensors" and kind == "bert":  # Linear weights stay SHiRA even with their bias grafted
        assert reasons == {"Linear bias", "LayerNorm"} and routes["modules_to_save"]["stored_parameters"] == 0
        assert other["stored_parameters"] < routes["shira"]["entries"]
    out, merged = plain_peft(tiny_models[kind], tmp_path / "adapter", HF_CLASS[mode], ids, mask)
    ref, _ = grafted_outputs(pre, graft, ids, mask)
    assert (out - ref).abs().max() <= 1e-6
    assert_same_weights(merged, exported_weights(pre, graft, tmp_path / "hf"))
    # SHiRA import round-trips: same region, same values, same head
    back = graft_from_peft(tmp_path / "adapter", pre)
    assert back.region == graft.region and back.region.shapes == graft.region.shapes
    assert s["inexact"] == 0 and all(torch.equal(back.values[n], graft.values[n]) for n in graft.values)
    assert set(back.carried) == set(graft.carried)
    assert all(torch.equal(back.carried[n], graft.carried[n]) for n in graft.carried)
    assert back.base_fingerprint == graft.base_fingerprint and back.metadata.mode == mode


def _plain_peft_three_ways(base_dir, adapter_dir, ids, mask):
    """A user with plain peft: logits enabled, inside ``disable_adapter()``, and after ``unload()``."""
    import peft
    import transformers

    torch.manual_seed(0)
    model = peft.PeftModel.from_pretrained(transformers.AutoModelForMaskedLM.from_pretrained(str(base_dir)),
                                           str(adapter_dir)).eval()
    with torch.no_grad():
        enabled = model(input_ids=ids, attention_mask=mask).logits
        with model.disable_adapter():
            disabled = model(input_ids=ids, attention_mask=mask).logits
        unloaded = model.unload()(input_ids=ids, attention_mask=mask).logits
    return enabled, disabled, unloaded


@pytest.mark.parametrize("route", [None, "modules_to_save", "tensors"])
def test_disabling_the_adapter(tiny_bert, tmp_path, route):
    """PEFT's contract (issue 80): by default, disabling the adapter gives θ_pre's logits exactly — nothing grafted
    is written into the base model; ``tensors`` (opt-in) writes its tensors into the base and says so."""
    pre, graft = make_graft(tiny_bert, "prompt", keep=lambda n: "query" in n or "LayerNorm" in n)
    ids, mask = batch(pre)
    with torch.no_grad():
        base = pre.model(input_ids=ids, attention_mask=mask).logits
    grafted, _ = grafted_outputs(pre, graft, ids, mask)
    s = export_peft(graft, pre, tmp_path / "adapter", **({"non_linear": route} if route else {}))
    enabled, disabled, unloaded = _plain_peft_three_ways(tiny_bert, tmp_path / "adapter", ids, mask)
    assert (enabled - grafted).abs().max() <= 1e-6 and not torch.equal(grafted, base)
    safe = route != "tensors"
    assert torch.equal(disabled, base) == safe and s["restores_base"]["disable_adapter"] == safe
    # peft keeps modules_to_save modules on unload(): the LayerNorms stay grafted, and the summary says so
    assert not torch.equal(unloaded, base) and not s["restores_base"]["unload"]
    lines = " ".join(text for _, text in get_exporter("peft").lines(s))
    assert ("disable_adapter() computes the base model exactly" in lines) == safe
    kept = list(s["routes"]["modules_to_save"]["modules"])  # the CLI names what unload() keeps
    if route is None:  # the size of the smaller route it would trade the contract for, as written (less the header)
        t = export_peft(graft, pre, tmp_path / "tensors", non_linear="tensors")
        header = 8 + int.from_bytes((tmp_path / "tensors" / "adapter_model.safetensors").read_bytes()[:8], "little")
        alt = s["alternative"]
        assert alt["non_linear"] == "tensors" and alt["tensors"] == len(t["routes"]["tensors"]["tensors"])
        assert alt["data_bytes"] == t["bytes"] - header and alt["bytes_about"] > alt["data_bytes"]
        assert f"about {human_size(alt['bytes_about'])}" in " ".join(x for _, x in get_exporter("peft").lines(s))
    assert (bool(kept) and f"unload() keeps {len(kept)} module(s) grafted ({kept[0]}" in lines) == safe
    assert ("do not undo them" in lines) == (not safe)
    readme = (tmp_path / "adapter" / "README.md").read_text()
    assert ("with model.disable_adapter()" in readme) == safe


@pytest.mark.parametrize("low_cpu_mem_usage", [False, True])
def test_a_graft_of_biases_and_norms_gives_the_base_back_with_plain_peft(tiny_bert, tmp_path, low_cpu_mem_usage):
    """Issue 80 item 5, read back with plain peft 0.21.2 (no skillgraft): a graft touching Linear weights, Linear
    biases (their weights untouched) and LayerNorms. Enabled: the grafted model; ``disable_adapter()``: θ_pre's logits
    exactly; a plain ``unload()`` keeps the modules_to_save copies grafted (peft's design: ``ModulesToSaveWrapper.
    unload_and_optionally_merge_module`` returns ``modules_to_save[active]`` while an adapter is active);
    ``delete_adapter("default")`` then ``unload()``: θ_pre's weights bit for bit. A grafted bias's Linear is stored
    whole: peft 0.21.2 refuses (KeyError) a modules_to_save module saved without its untouched weight."""
    import peft
    import transformers
    from safetensors.torch import load_file, save_file

    keep = (lambda n: n.endswith("attention.output.dense.bias") or "LayerNorm" in n or n.endswith("query.weight"))
    pre, graft = make_graft(tiny_bert, "prompt", keep=keep)
    ids, mask = batch(pre)
    with torch.no_grad():
        base = pre.model(input_ids=ids, attention_mask=mask).logits
    grafted, _ = grafted_outputs(pre, graft, ids, mask)
    s = export_peft(graft, pre, tmp_path / "adapter")
    ms = s["routes"]["modules_to_save"]
    assert any(m.endswith("attention.output.dense") for m in ms["modules"])
    assert s["restores_base"] == {"disable_adapter": True, "unload": False, "delete_adapter_then_unload": True}

    def load():
        torch.manual_seed(0)
        hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tiny_bert))
        return peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter"),
                                              low_cpu_mem_usage=low_cpu_mem_usage).eval()

    torch.manual_seed(0)
    before = transformers.AutoModelForMaskedLM.from_pretrained(str(tiny_bert)).state_dict()
    model = load()
    with torch.no_grad():
        enabled = model(input_ids=ids, attention_mask=mask).logits
        with model.disable_adapter():
            disabled = model(input_ids=ids, attention_mask=mask).logits
        plain = model.unload()  # peft's plain unload(): the SHiRA weights gone, the modules_to_save copies kept
        kept = plain(input_ids=ids, attention_mask=mask).logits
    assert (enabled - grafted).abs().max() <= 1e-6 and not torch.equal(grafted, base)
    assert torch.equal(disabled, base) and not torch.equal(kept, base)
    for name in graft.region.indices:
        got = plain.state_dict()[name.removeprefix("model.")].reshape(-1)[graft.region.indices[name]]
        assert torch.equal(got, graft.values[name]) == ("query" not in name), name
    model = load()
    model.delete_adapter("default")
    unloaded = model.unload()
    state = unloaded.state_dict()
    assert set(state) == set(before) and all(torch.equal(state[k], before[k]) for k in before)
    with torch.no_grad():
        assert torch.equal(unloaded(input_ids=ids, attention_mask=mask).logits, base)
    _, merged = plain_peft(tiny_bert, tmp_path / "adapter", "AutoModelForMaskedLM", ids, mask)
    assert_same_weights(merged, exported_weights(pre, graft, tmp_path / "hf"), s["inexact"])
    lines = " ".join(text for _, text in get_exporter("peft").lines(s))
    assert "model.delete_adapter('default') first, then unload() gives the base exactly" in lines
    assert 'model.delete_adapter("default"); base = model.unload()' in (tmp_path / "adapter" / "README.md").read_text()
    # the smaller adapter peft does not take: the grafted bias's Linear without its untouched weight
    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    weight = next(k for k in tensors if k.endswith("attention.output.dense.weight"))
    save_file({k: v for k, v in tensors.items() if k != weight}, str(tmp_path / "adapter" / "adapter_model.safetensors"))
    with pytest.raises(KeyError, match="dense.weight"):
        load()


@pytest.mark.parametrize("tuner", ["shira", "supertuning", "auto"])
def test_a_linear_weight_graft_keeps_peft_contract_at_its_size(tiny_bert, tmp_path, tuner):
    """Only sparse entries (Linear weights), read back with plain peft + transformers: disable_adapter() gives θ_pre's
    logits exactly, unload() gives back θ_pre's weights exactly, merge_and_unload() the grafted weights; the adapter is
    its entries at 8 bytes each plus the header (SHiRA: int16 row/column + fp32, r·(m+n) per Linear; Supertuning:
    int32 flat + fp32, int(m·n·(1 − sparsity)) per Linear), and ``auto`` writes the smaller of the two."""
    import peft
    import transformers
    from safetensors import safe_open

    pre, graft = make_graft(tiny_bert, "prompt", keep=lambda n: n.endswith("weight") and "LayerNorm" not in n
                            and "embeddings" not in n and "predictions" not in n, count=5)
    ids, mask = batch(pre)
    with torch.no_grad():
        base = pre.model(input_ids=ids, attention_mask=mask).logits
    grafted, _ = grafted_outputs(pre, graft, ids, mask)
    s = export_peft(graft, pre, tmp_path / "adapter", tuner=tuner)
    torch.manual_seed(0)
    base_model = transformers.AutoModelForMaskedLM.from_pretrained(str(tiny_bert))
    before = {k: v.clone() for k, v in base_model.state_dict().items()}
    model = peft.PeftModel.from_pretrained(base_model, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        enabled = model(input_ids=ids, attention_mask=mask).logits
        with model.disable_adapter():
            disabled = model(input_ids=ids, attention_mask=mask).logits
    assert (enabled - grafted).abs().max() <= 1e-6 and torch.equal(disabled, base) and not torch.equal(grafted, base)
    unloaded = model.unload().state_dict()
    assert set(unloaded) == set(before) and all(torch.equal(unloaded[k], before[k]) for k in before)
    _, merged = plain_peft(tiny_bert, tmp_path / "adapter", "AutoModelForMaskedLM", ids, mask)
    assert_same_weights(merged, exported_weights(pre, graft, tmp_path / "hf"))
    assert s["restores_base"] == {"disable_adapter": True, "unload": True, "delete_adapter_then_unload": True}
    assert not s["routes"]["modules_to_save"]["modules"] and not s["routes"]["tensors"]["tensors"]
    sh, cfg = s["routes"]["shira"], json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sh["coordinates"] == graft.size and s["inexact"] == 0
    path = tmp_path / "adapter" / "adapter_model.safetensors"
    header = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    assert s["bytes"] == header + 8 * sh["entries"]
    assert s["graft_bytes"] == 8 * graft.size
    with safe_open(str(path), "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
    if cfg["peft_type"] == "SHIRA":
        assert tuner != "supertuning" and {t.dtype for k, t in stored.items() if k.endswith("shira_indices")} == {
            torch.int16}
        assert all(stored[f"base_model.model.{m}.shira_indices"].shape[1] ==
                   cfg["r"] * sum(pre.model.get_submodule(m).weight.shape) for m in cfg["target_modules"])
    else:
        assert tuner != "shira" and cfg["peft_type"] == "SUPERTUNING" and cfg["sparsity"] == sh["sparsity"]
        for m in cfg["target_modules"]:  # peft allocates int(m·n·(1 − sparsity)) entries: the file holds as many
            numel = pre.model.get_submodule(m).weight.numel()
            assert stored[f"base_model.model.{m}.supertuning_indices"].shape == (int(numel * (1 - cfg["sparsity"])),)
        # graft-sized: the padding follows each Linear's size (5 coordinates each here), not its m+n
        assert s["bytes"] - header <= 2 * s["graft_bytes"]
        assert "a peft with Supertuning" in (tmp_path / "adapter" / "README.md").read_text()
    if tuner == "auto":  # the smaller of the two
        other = {"SHIRA": "supertuning", "SUPERTUNING": "shira"}[cfg["peft_type"]]
        assert s["bytes"] - header <= 8 * export_peft(graft, pre, tmp_path / "other", tuner=other)["routes"][
            "shira"]["entries"]
    back = graft_from_peft(tmp_path / "adapter", pre)  # the adapter imports as the same graft
    assert back.region == graft.region and all(torch.equal(back.values[n], graft.values[n]) for n in graft.values)


def test_the_adapter_names_the_base_as_the_user_did(tiny_bert, tmp_path, monkeypatch):
    """``base_model_name_or_path`` is the name the graft records (here a relative folder, as typed), not a path
    skillgraft resolved it to."""
    import shutil

    shutil.copytree(tiny_bert, tmp_path / "my-base")
    monkeypatch.chdir(tmp_path)
    pre, graft = make_graft("./my-base", "prompt", keep=lambda n: "query.weight" in n, count=5)
    assert graft.base_model == "./my-base"
    export_peft(graft, pre, tmp_path / "adapter")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "./my-base"


def test_tied_embeddings_go_whole_with_their_partner(tiny_bert, tmp_path):
    """BERT's MLM decoder is tied to the word embeddings: both are stored whole, and the result is exact."""
    pre, graft = make_graft(tiny_bert, "prompt", keep=lambda n: "word_embeddings" in n or "query.weight" in n,
                            graftable="body+embeddings")
    ids, mask = batch(pre)
    s = export_peft(graft, pre, tmp_path / "adapter", non_linear="modules_to_save")
    dense = s["routes"]["modules_to_save"]["modules"]
    assert "bert.embeddings.word_embeddings" in dense and "cls.predictions.decoder" in dense
    out, merged = plain_peft(tiny_bert, tmp_path / "adapter", "AutoModelForMaskedLM", ids, mask)
    ref, _ = grafted_outputs(pre, graft, ids, mask)
    assert (out - ref).abs().max() <= 1e-6
    assert_same_weights(merged, exported_weights(pre, graft, tmp_path / "hf"))


def test_unrepresentable_coordinates_are_refused_with_names(tiny_models, tmp_path):
    pre, graft = make_graft(tiny_models["bert"], "prompt")
    with pytest.raises(SkillgraftError, match=r"cannot be held by a sparse PEFT adapter .*LayerNorm") as e:
        export_peft(graft, pre, tmp_path / "a", non_linear="refuse")
    assert "Linear bias" in str(e.value) and "--non-linear modules_to_save" in str(e.value)
    pre, graft = make_graft(tiny_models["gpt2"], "causal")
    with pytest.raises(SkillgraftError, match=r"transformer\.h\.0\.attn\.c_attn \(Conv1D"):
        export_peft(graft, pre, tmp_path / "a", non_linear="refuse")
    # GPT-2's only nn.Linear is lm_head, tied to wte: a graft on wte leaves no SHiRA target at all
    pre, graft = make_graft(tiny_models["gpt2"], "causal", keep=lambda n: "wte" in n, graftable="body+embeddings")
    with pytest.raises(SkillgraftError, match="at least one nn.Linear target"):
        export_peft(graft, pre, tmp_path / "a", non_linear="modules_to_save")
    assert not (tmp_path / "a").exists()
    # BERT's MLM-head bias belongs to a container module: peft could store it whole but not merge it
    pre, graft = make_graft(tiny_models["bert"], "prompt", keep=lambda n: n.startswith("model.cls."), graftable="all")
    with pytest.raises(SkillgraftError, match=r"cls\.predictions \(BertLMPredictionHead.*merge_and_unload"):
        export_peft(graft, pre, tmp_path / "a", non_linear="modules_to_save")
    # a head-mode graft with head="refuse" names the head
    pre, graft = make_graft(tiny_models["bert"], "head", keep=linear_weights_only)
    with pytest.raises(SkillgraftError, match=r"new task head .*head\.weight"):
        export_peft(graft, pre, tmp_path / "a", head="refuse")
    with pytest.raises(SkillgraftError, match="new task head"):
        export_graft(graft, tmp_path / "a", ExportSpec(to="delta", head="refuse"), base=pre)
    assert not (tmp_path / "a").exists()
    with pytest.raises(SkillgraftError, match="non_linear"):
        export_peft(graft, pre, tmp_path / "a", non_linear="dense")


def test_wrong_base_is_refused(tiny_models, tmp_path):
    pre, graft = make_graft(tiny_models["bert"], "prompt", keep=linear_weights_only)
    other = build_scorer(str(tiny_models["bert"]), "SST-2", "prompt")
    with torch.no_grad():
        next(other.model.parameters()).add_(1.0)
    with pytest.raises(SkillgraftError, match="fingerprint"):
        export_peft(graft, other, tmp_path / "a")
    llama = build_scorer(str(tiny_models["llama"]), "SST-2", "causal")
    with pytest.raises(SkillgraftError, match="does not have"):
        export_peft(graft, llama, tmp_path / "a")


# ---------------------------------------------------------------------------------------------- delta, hf, targets
@pytest.mark.parametrize("kind,mode", [("bert", "head"), ("gpt2", "causal")])
def test_delta_with_the_stock_safetensors_reader(tiny_models, tmp_path, kind, mode):
    pre, graft = make_graft(tiny_models[kind], mode)
    s = export_delta(graft, tmp_path / "delta", base=pre)
    assert s["coordinates"] == graft.size and s["inexact"] > 0
    from safetensors import safe_open

    with safe_open(str(tmp_path / "delta" / "delta.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert all(f.get_tensor(k).dtype == torch.int32 for k in keys if k.endswith("::indices"))
        meta = json.loads(f.metadata()["skillgraft"])
    assert not any(k.startswith("model.") for k in keys)  # the base model's own tensor names
    assert meta["base_fingerprint"] == graft.base_fingerprint
    reference = exported_weights(pre, graft, tmp_path / "hf")
    assert_same_weights(plain_delta(tiny_models[kind], tmp_path / "delta", HF_CLASS[mode], "values"), reference)
    added = plain_delta(tiny_models[kind], tmp_path / "delta", HF_CLASS[mode], "delta")
    assert_same_weights(added, reference, s["inexact"])
    assert (tmp_path / "delta" / "skillgraft_head.safetensors").is_file() == (mode == "head")


def test_existing_target_is_refused_before_any_work(tiny_bert, tmp_path):
    pre, graft = make_graft(tiny_bert, "head", keep=linear_weights_only)
    for to in ("peft", "delta", "hf"):
        target = tmp_path / to
        target.mkdir()
        (target / "keep.txt").write_text("mine")
        with pytest.raises(SkillgraftError, match="already exists"):
            export_graft(graft, target, ExportSpec(to=to), base=pre)
        assert (target / "keep.txt").read_text() == "mine"
        s = export_graft(graft, target, ExportSpec(to=to, overwrite=True), base=pre)
        assert not (target / "keep.txt").exists() and s["to"] == to and s["coordinates"] == graft.size
    assert (tmp_path / "hf" / "scorer_config.json").is_file()
    assert (tmp_path / "peft" / "adapter_config.json").is_file()


def test_exact_delta_and_replace_pairs():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(10000, generator=gen)
    b = a + torch.randn(10000, generator=gen) * torch.logspace(-8, 0, 10000)
    d, missed = exact_delta(a, b)
    assert not missed.any() and torch.equal(a + d, b)
    # shrunk weights: some targets lie on a finer grid than any a + d can reach ...
    a = torch.randn(10000, generator=gen)
    b = a * torch.rand(10000, generator=gen) * 0.5
    d, missed = exact_delta(a, b)
    assert missed.sum() > 1000 and ((a + d - b).abs() <= torch.finfo(torch.float32).eps * a.abs()).all()
    # ... and two COO entries (−a, then b) at the same position reach them exactly through SHiRA's W += sparse
    w = a.view(100, 100)
    idx = torch.arange(10000)
    flat, vals = shira_entries(w, idx, b)
    assert len(flat) == 10000 + int(missed.sum())
    assert torch.equal(apply_entries(w, flat, vals).view(-1), b)


# ---------------------------------------------------------------------------------------------- import
def test_a_users_shira_adapter_imports_as_a_region(tiny_bert, tmp_path):
    import peft
    import transformers

    torch.manual_seed(0)
    base = transformers.AutoModel.from_pretrained(str(tiny_bert))
    config = peft.ShiraConfig(r=2, target_modules=["query", "value"], init_weights=False, random_seed=3)
    model = peft.get_peft_model(base, config)
    model.save_pretrained(str(tmp_path / "shira"))
    ids, mask = batch(None)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).last_hidden_state
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    g = graft_from_peft(tmp_path / "shira", pre)
    layers = [n for n in g.region.indices]
    assert len(layers) == 4 and all(len(g.region.indices[n]) == 2 * (32 + 32) for n in layers)
    assert g.metadata.peft_type == "SHIRA" and g.metadata.r == 2 and not g.carried
    assert g.region.universe_size == sum(torch.Size(s).numel() for s in g.region.shapes.values())
    got, _ = grafted_outputs(pre, g, ids, mask)
    assert (got - want).abs().max() <= 1e-6
    # compare with a learned-style graft on the same base: set algebra and IoU on one universe
    _, other = make_graft(tiny_bert, "head", keep=lambda n: "query.weight" in n, count=500)
    shared = g.region & other.region
    assert 0 < len(shared) < len(other.region)
    assert g.region.iou(other.region) == pytest.approx(len(shared) / len(g.region | other.region))
    # not a SHiRA adapter → clear refusal
    lora = peft.get_peft_model(transformers.AutoModel.from_pretrained(str(tiny_bert)),
                               peft.LoraConfig(r=2, target_modules=["query"]))
    lora.save_pretrained(str(tmp_path / "lora"))
    with pytest.raises(SkillgraftError, match="only SHiRA"):
        graft_from_peft(tmp_path / "lora", pre)
    with pytest.raises(SkillgraftError, match="not a PEFT adapter folder"):
        graft_from_peft(tmp_path, pre)


# ------------------------------------------------------------------------------------------- reader without skillgraft
READER = textwrap.dedent("""
    import sys, torch, transformers, peft
    from safetensors.torch import save_file
    base_dir, adapter_dir, out = sys.argv[1:4]
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    model = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    ids = torch.arange(5, 26).view(3, 7)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    merged = model.merge_and_unload().state_dict()
    assert not any(m.startswith("skillgraft") for m in sys.modules), "the reader imported skillgraft"
    save_file({"logits": logits.contiguous(), **{k: v.contiguous() for k, v in merged.items()}}, out)
""")


def test_fresh_interpreter_reads_the_adapter_without_skillgraft(tiny_models, tmp_path, clean_python):
    from safetensors.torch import load_file

    pre, graft = make_graft(tiny_models["llama"], "causal")
    s = export_peft(graft, pre, tmp_path / "adapter")
    assert s["routes"]["shira"]["peft_type"] == "SUPERTUNING"  # auto: the fewer bytes for this graft
    clean_python.run(READER, tiny_models["llama"], tmp_path / "adapter", tmp_path / "read.safetensors", cwd=tmp_path,
                     check=True)
    read = load_file(str(tmp_path / "read.safetensors"))
    ids = torch.arange(5, 26).view(3, 7)
    ref, _ = grafted_outputs(pre, graft, ids, torch.ones_like(ids))
    assert (read.pop("logits") - ref).abs().max() <= 1e-6
    assert_same_weights(read, exported_weights(pre, graft, tmp_path / "hf"))


# ---------------------------------------------------------------------------------------------- mergekit
MERGEKIT_YAML = """merge_method: passthrough
models:
  - model: {base}+{adapter}
dtype: float32
"""


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_mergekit_adapter_path(tiny_models, tmp_path, kind):
    """mergekit's adapter path (peft's merge, as ``ModelReference.merged`` runs it) on both Linear and Conv1D models."""
    from safetensors.torch import load_file

    pre, graft = make_graft(tiny_models[kind], "causal")
    export_peft(graft, pre, tmp_path / "adapter")
    mergekit_style_merge(tiny_models[kind], tmp_path / "adapter", tmp_path / "merged")
    reference = exported_weights(pre, graft, tmp_path / "hf")
    assert_same_weights(load_file(str(tmp_path / "merged" / "model.safetensors")), reference)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])  # gpt2: Conv1D's layout
def test_mergekit_yaml_merges_the_adapter(tiny_models, tmp_path, kind):
    """The YAML of docs/export.md through mergekit itself (``mergekit-yaml``, pinned in requirements.lock: its entry
    point forked from this worker, processes.run_console_script)."""
    from processes import run_console_script
    from safetensors.torch import load_file

    pre, graft = make_graft(tiny_models[kind], "causal")
    s = export_peft(graft, pre, tmp_path / "adapter")
    assert kind == "gpt2" or s["routes"]["shira"]["peft_type"] == "SUPERTUNING"  # auto: the fewer bytes here
    (tmp_path / "merge.yml").write_text(MERGEKIT_YAML.format(base=tiny_models[kind], adapter=tmp_path / "adapter"))
    err = tmp_path / "mergekit.stderr"
    code = run_console_script("mergekit-yaml", [tmp_path / "merge.yml", tmp_path / "mk", "--lora-merge-cache",
                                                tmp_path / "cache"], {"HF_HUB_OFFLINE": "1"}, err)
    assert code == 0, err.read_text()[-2000:]
    reference = exported_weights(pre, graft, tmp_path / "hf")
    assert_same_weights(load_file(str(tmp_path / "mk" / "model.safetensors")), reference)  # bit-equal, adapter included


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_export_and_inspect_an_adapter(tiny_bert, tmp_path):
    from typer.testing import CliRunner

    from skillgraft.cli import app

    pre, graft = make_graft(tiny_bert, "head", keep=lambda n: "pooler" not in n)
    graft.save_pretrained(tmp_path / "g")
    runner = CliRunner()
    r = runner.invoke(app, ["export", str(tmp_path / "g"), "--to", "peft", "--out", str(tmp_path / "a"),
                            "--non-linear", "modules_to_save"])
    assert r.exit_code == 0, r.output
    assert "modules_to_save" in r.output and "skillgraft_head.safetensors" in r.output
    r = runner.invoke(app, ["export", str(tmp_path / "g"), "--to", "peft", "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "already exists" in r.output
    r = runner.invoke(app, ["export", str(tmp_path / "g"), "--to", "peft", "--out", str(tmp_path / "b"),
                            "--non-linear", "refuse"])
    assert r.exit_code == 2 and "cannot be held by a sparse PEFT adapter" in r.output and not (tmp_path / "b").exists()
    r = runner.invoke(app, ["export", str(tmp_path / "g"), "--to", "delta", "--out", str(tmp_path / "d")])
    assert r.exit_code == 0 and (tmp_path / "d" / "delta.safetensors").is_file(), r.output
    r = runner.invoke(app, ["inspect", str(tmp_path / "a"), "--compare", str(tmp_path / "g"), "--out",
                            str(tmp_path / "i")])
    assert r.exit_code == 0, r.output
    assert f"{graft.size:,} grafted parameters" in r.output and "IoU 1.0000" in r.output


# ---------------------------------------------------------------------------------------------- real model
@pytest.mark.real
def test_minilm_graft_exports_and_reloads_with_plain_peft(tmp_path):
    from skillgraft.models.loading import bundled_minilm_path

    path = bundled_minilm_path()
    pre, graft = make_graft(path, "head", count=200,
                            keep=lambda n: (".layer.3." in n and linear_weights_only(n)) or ".layer.5." in n)
    ids, mask = batch(pre)
    s = export_peft(graft, pre, tmp_path / "adapter", non_linear="modules_to_save")
    routes = s["routes"]
    assert routes["shira"]["coordinates"] == 6 * 200 and routes["modules_to_save"]["coordinates"] == graft.size - 1200
    assert s["inexact"] == 0 and s["replace_pairs"] > 0
    out, merged = plain_peft(path, tmp_path / "adapter", "AutoModel", ids, mask)
    ref, _ = grafted_outputs(pre, graft, ids, mask)
    assert (out - ref).abs().max() <= 1e-6
    assert_same_weights(merged, exported_weights(pre, graft, tmp_path / "hf"))
    back = graft_from_peft(tmp_path / "adapter", pre)
    assert back.region == graft.region


def test_a_bf16_base_merges_bit_exact_with_either_tuner(tiny_models, tmp_path):
    """Supertuning's values are float32 parameters in peft and cast to the weight's dtype in its scatter-add: a bf16
    graft's deltas survive that round trip, so the merge equals the grafted bf16 weights under either tuner."""
    import peft
    import transformers

    from skillgraft.graft.graft import Graft
    from skillgraft.graft.region import Region

    pre = build_scorer(str(tiny_models["llama"]), "SST-2", "causal", dtype=torch.bfloat16)
    ft = build_scorer(str(tiny_models["llama"]), "SST-2", "causal", dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in ft.parameters():
            p.add_((torch.randn(p.shape, generator=gen) * 0.02).to(p.dtype))
    params = dict(pre.named_parameters())
    idx = {n: torch.randperm(params[n].numel(), generator=gen)[:5] for n in params if n.endswith("proj.weight")}
    graft = Graft.from_models(pre, ft, Region({n: tuple(params[n].shape) for n in idx}, idx), {"mode": "causal"})
    for tuner in ("shira", "supertuning"):
        s = export_peft(graft, pre, tmp_path / tuner, tuner=tuner)
        assert s["inexact"] == 0 and s["routes"]["shira"]["peft_type"] == tuner.upper()
        base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_models["llama"]), dtype=torch.bfloat16)
        merged = peft.PeftModel.from_pretrained(base, str(tmp_path / tuner)).merge_and_unload().state_dict()
        for n, i in graft.region.indices.items():  # (sorted)
            w = merged[n.removeprefix("model.")]
            assert w.dtype == torch.bfloat16 and torch.equal(w.reshape(-1)[i], graft.values[n].to(torch.bfloat16)), n


def test_a_peft_without_supertuning_gets_shira(tiny_bert, tmp_path, monkeypatch):
    """``pyproject`` allows older peft releases: without Supertuning ``auto`` writes SHiRA, and ``--tuner supertuning``
    is one line naming the installed version (before: an ImportError traceback)."""
    import peft

    monkeypatch.delattr(peft, "SupertuningConfig")
    pre, graft = make_graft(tiny_bert, "prompt", keep=linear_weights_only, count=5)
    assert export_peft(graft, pre, tmp_path / "a")["routes"]["shira"]["peft_type"] == "SHIRA"
    with pytest.raises(SkillgraftError, match=r"--tuner supertuning needs a peft with Supertuning .*installed: "):
        export_peft(graft, pre, tmp_path / "b", tuner="supertuning")
    assert not (tmp_path / "b").exists()
