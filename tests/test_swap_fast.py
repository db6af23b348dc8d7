"""A repeated graft swap on one model: the prepared writes only (issue 45), bit-exact, and never on a changed base."""

import pytest
import torch
from hostreads import Ops

import skillgraft.graft.identity as identity_module
from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.graft.identity import cached_fingerprint, forget_fingerprint
from skillgraft.graft.region import Region
from skillgraft.models.anatomy import fingerprint




def prepared(graft, model) -> None:
    """Apply and revert twice: the first swap prepares the flat write, the second takes it (what the counts test)."""
    for _ in range(2):
        with graft.applied(model):
            pass

class Tiny(torch.nn.Module):
    def __init__(self, device="cpu"):
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.nn.LayerNorm(4))
        self.head = torch.nn.Linear(4, 2)
        self.carried = {"head.weight"}
        self.to(device)


def graft_on(m, carried=True):
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters() if n.startswith("model.")}
    idx = {"model.0.weight": [1, 5, 9, 33], "model.1.bias": [0, 2], "model.2.weight": [3]}
    g = torch.Generator().manual_seed(1)
    values = {n: torch.randn(len(i), generator=g) for n, i in idx.items()}
    extra = {"head.weight": torch.randn(2, 4, generator=g)} if carried else {}
    return Graft(Region(shapes, idx), values, extra, base_fingerprint=cached_fingerprint(m))


def state(m):
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def same(m, s):
    return all(torch.equal(p, s[n]) for n, p in m.named_parameters())


def test_a_repeated_swap_is_one_write_per_flat_buffer_and_bit_exact():
    m = Tiny()
    a = graft_on(m)
    before = state(m)
    with a.applied(m):  # the first swap checks, backs up, lays the touched tensors out in one buffer and prepares
        first = state(m)
    for _ in range(2):
        with Ops() as on:
            a.apply(m)
        with Ops() as off:
            a.revert(m)
        # 3 region tensors in one flat buffer: one put_ each way, plus one copy_ for the carried head
        assert dict(on.ops) == dict(off.ops) == {"aten.put_.default": 1, "aten.copy_.default": 1}
        assert same(m, before)
    a.apply(m)
    assert same(m, first)
    params = dict(m.named_parameters())
    for name, idx in a.region.indices.items():
        assert torch.equal(params[name].detach().view(-1)[idx], a.values[name])
    a.revert(m)
    assert same(m, before)
    assert identity_module.known_fingerprint(m) == fingerprint(m)  # the cache still names the base, without a recount


def test_fast_swaps_keep_the_fingerprint_cache_valid_without_recomputing(monkeypatch):
    m = Tiny()
    a = graft_on(m)
    calls = []
    real = identity_module.fingerprint
    monkeypatch.setattr(identity_module, "fingerprint", lambda s, *x: calls.append(1) or real(s, *x))
    for _ in range(4):
        with a.applied(m):
            pass
    assert cached_fingerprint(m) == real(m) and calls == []
    with a.applied(m):
        assert cached_fingerprint(m) != a.base_fingerprint and len(calls) == 1  # the grafted weights, counted
    assert cached_fingerprint(m) == a.base_fingerprint


@pytest.mark.parametrize("change", ["in_place", "replaced", "data", "graft_values"])
def test_a_prepared_swap_is_not_used_on_a_changed_base_or_graft(change):
    m = Tiny()
    a = graft_on(m)
    with a.applied(m):
        pass
    with a.applied(m):
        pass
    lin = m.model[1]
    if change == "in_place":
        with torch.no_grad():
            lin.weight.add_(1.0)  # an untouched tensor
    elif change == "replaced":
        lin.weight = torch.nn.Parameter(lin.weight.detach() + 1.0)
    elif change == "data":
        lin.weight.data = lin.weight.detach() + 1.0
    else:
        with torch.no_grad():
            a.values["model.1.bias"].add_(1.0)
    if change != "graft_values":
        with pytest.raises(SkillgraftError, match="fingerprint"):
            a.apply(m)
        return
    before = state(m)
    with a.applied(m):
        assert torch.equal(m.model[1].bias.detach()[[0, 2]], a.values["model.1.bias"])  # the new values
    assert same(m, before)


def test_a_write_while_applied_is_not_blessed_as_the_base():
    m = Tiny()
    a = graft_on(m)
    prepared(a, m)
    a.apply(m)
    with torch.no_grad():
        m.model[1].weight.add_(1.0)  # someone else writes while the graft is applied
    a.revert(m)
    with pytest.raises(SkillgraftError, match="fingerprint"):
        a.apply(m)
    forget_fingerprint(m)


class Mixed(torch.nn.Module):
    """bf16 linears, an fp32 norm, and an output layer tied to the embedding (one Parameter, two owners)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        emb = torch.nn.Embedding(16, 8)
        out = torch.nn.Linear(8, 16, bias=False)
        out.weight = emb.weight
        self.model = torch.nn.ModuleDict({"emb": emb, "lin": torch.nn.Linear(8, 8).to(torch.bfloat16),
                                          "lin2": torch.nn.Linear(8, 8).to(torch.bfloat16),
                                          "norm": torch.nn.LayerNorm(8), "out": out})
        self.carried = set()


def mixed_graft(m, names):
    params = dict(m.named_parameters())
    shapes = {n: tuple(p.shape) for n, p in params.items()}
    g = torch.Generator().manual_seed(2)
    idx = {n: torch.randperm(params[n].numel(), generator=g)[:3].sort().values for n in names}
    values = {n: torch.randn(3, generator=g).to(params[n].dtype) for n in names}
    return Graft(Region(shapes, idx), values, base_fingerprint=cached_fingerprint(m))


def test_a_mixed_precision_model_with_tied_weights_swaps_in_one_write_per_dtype_bit_exactly():
    m = Mixed()
    a = mixed_graft(m, ["model.emb.weight", "model.lin.weight", "model.lin2.bias", "model.norm.weight"])
    before = state(m)
    prepared(a, m)
    with Ops() as on:
        a.apply(m)
    assert dict(on.ops) == {"aten.put_.default": 2}  # one bf16 buffer, one fp32 buffer
    assert m.model["out"].weight is m.model["emb"].weight  # still tied: the same Parameter, now a view
    emb = m.model["emb"].weight.detach().view(-1)
    assert torch.equal(emb[a.region.indices["model.emb.weight"]], a.values["model.emb.weight"])
    assert m.model["lin"].weight.dtype == torch.bfloat16 and m.model["norm"].weight.dtype == torch.float32
    with Ops() as off:
        a.revert(m)
    assert dict(off.ops) == {"aten.put_.default": 2}
    assert same(m, before)


def test_a_flat_write_raises_the_written_parameters_versions_as_a_write_through_them_would():
    m = Tiny()
    a = graft_on(m, carried=False)
    prepared(a, m)
    w, untouched = m.model[0].weight, m.model[1].weight
    v, u = w._version, untouched._version
    a.apply(m)
    assert w._version == v + 1 and untouched._version == u
    a.revert(m)
    assert w._version == v + 2


def test_autograd_sees_a_flat_write_to_a_tensor_saved_for_backward():
    m = Tiny()
    a = graft_on(m, carried=False)
    prepared(a, m)
    x = torch.randn(3, 8, requires_grad=True)
    out = m.model[0](x).sum()  # saves model.0.weight for the input's gradient
    a.apply(m)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()
    a.revert(m)


def test_a_bf16_model_swaps_in_one_write_each_way_bit_exactly():
    m = Tiny().to(torch.bfloat16)
    a = graft_on(m)  # fp32 values: written in the model's dtype
    before = state(m)
    prepared(a, m)
    with Ops() as on:
        a.apply(m)
    assert dict(on.ops) == {"aten.put_.default": 1, "aten.copy_.default": 1}
    w = m.model[0].weight.detach().view(-1)[a.region.indices["model.0.weight"]]
    assert w.dtype == torch.bfloat16 and torch.equal(w, a.values["model.0.weight"].to(torch.bfloat16))
    with Ops() as off:
        a.revert(m)
    assert dict(off.ops) == {"aten.put_.default": 1, "aten.copy_.default": 1}
    assert same(m, before)


def test_a_parameter_sharing_its_storage_is_written_on_its_own():
    m = Tiny()
    m.model[1].bias.data = m.model[0].bias.detach()[:4]  # two Parameters over one storage: not laid out
    a = graft_on(m, carried=False)
    before = state(m)
    prepared(a, m)
    with Ops() as on:
        a.apply(m)
    assert dict(on.ops) == {"aten.put_.default": 2}  # the two other tensors' buffer, then the shared one
    assert torch.equal(m.model[0].bias.detach()[[0, 2]], a.values["model.1.bias"])  # the view wrote through
    a.revert(m)
    assert same(m, before)


def test_two_grafts_share_one_layout_and_a_moved_model_is_laid_out_again():
    m = Tiny()
    a = graft_on(m, carried=False)
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters() if n.startswith("model.")}
    b = Graft(Region(shapes, {"model.1.weight": [0, 7, 30], "model.0.weight": [2]}),
              {"model.1.weight": torch.ones(3), "model.0.weight": torch.zeros(1)},
              base_fingerprint=cached_fingerprint(m))
    before = state(m)
    for g in (a, b, a, b, a, b):  # b's layout holds a's tensors too: a is prepared again once, on it
        with g.applied(m):
            pass
    for g in (a, b):
        with Ops() as c:
            g.apply(m)
            g.revert(m)
        assert dict(c.ops) == {"aten.put_.default": 2}
        assert same(m, before)
    m.model[0].weight.data = m.model[0].weight.detach().clone()  # out of the layout (as .to() would do)
    old = m.model.__dict__["_skillgraft_flat"]  # the body's layout
    for g in (a, b):
        g.apply(m)
        assert torch.equal(m.model[0].weight.detach().view(-1)[g.region.indices["model.0.weight"]],
                           g.values["model.0.weight"])
        g.revert(m)
        assert same(m, before)
    assert m.model.__dict__["_skillgraft_flat"] is not old  # laid out again; the old buffer is not kept


def test_a_laid_out_model_saves_and_reads_back_with_safetensors(tmp_path):
    from safetensors.torch import load_file, save_file

    m = Tiny()
    a = graft_on(m)
    prepared(a, m)
    save_file({n: p.detach() for n, p in m.named_parameters()}, tmp_path / "m.safetensors")
    back = load_file(tmp_path / "m.safetensors")
    assert back.keys() == state(m).keys() and all(torch.equal(back[n], p) for n, p in state(m).items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_graph_swap_writes_what_the_eager_swap_writes(monkeypatch):
    monkeypatch.setenv("SKILLGRAFT_SWAP_GRAPHS", "1")
    m = Tiny("cuda")
    a = graft_on(m)
    before = state(m)
    with a.applied(m):
        first = state(m)
    assert a.__dict__["_swap"].graph is not None
    with Ops() as c:
        a.apply(m)
    assert not c.ops  # one graph replay, no aten op
    assert same(m, first)
    version = m.model[0].weight._version
    a.revert(m)
    assert same(m, before) and m.model[0].weight._version > version
