"""Localization at scale: candidate-restricted state, exact streamed/distributed top-k, FSDP2 sharding."""

import random
import threading
import types

import pytest
import torch
from localizing import Interrupt, assert_intact, digest, free_port, snapshot, trained_pair
from processes import launch_ranks

from skillgraft.data import load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.graft import Budget, LocalizeConfig, get_localizer, graftable_names, localize
from skillgraft.graft.localizers.machinery.candidates import Candidates
from skillgraft.graft.localizers.machinery.relaxations import Sigmoid
from skillgraft.graft.localizers.machinery.sharded import Group, pieces
from skillgraft.graft.localizers.machinery.source import InMemory, fine_tuned
from skillgraft.graft.localizers.machinery.topk import Collective, StreamingTopK, top_k
from skillgraft.graft.selection import top_k_flat


@pytest.fixture(scope="module")
def data(toy_data):
    return load_kshot("SST-2", 16, 13, toy_data)


@pytest.fixture(scope="module")
def bert(tiny_bert, data):
    return trained_pair(tiny_bert, "head", data)


@pytest.fixture(scope="module")
def llama_bf16(tiny_models, data, tmp_path_factory):
    """A tiny Llama in bf16, causal mode, and its fine-tuned copy also saved as a folder."""
    pre, ft = trained_pair(tiny_models["llama"], "causal", data, dtype=torch.bfloat16)
    folder = tmp_path_factory.mktemp("llama-ft") / "model"
    ft.save_pretrained(folder)
    return pre, ft, folder


def same_result(a, b):
    assert list(a.regions) == list(b.regions)
    assert [digest(r) for r in a.regions.values()] == [digest(r) for r in b.regions.values()]
    assert a.best_step == b.best_step and a.base_size == b.base_size
    # the same trajectory; the fit shares agree where the reference does (θ_ft in memory vs read from its files:
    # FT itself vs the graft of the whole universe / every candidate, docs/localizers.md)
    unfit = [[(h.step, h.budget, h.relaxation, {k: (s.acc, s.size, s.iou_prev) for k, s in h.scores.items()})
              for h in r.history] for r in (a, b)]
    assert unfit[0] == unfit[1]
    if a.reference == b.reference:
        assert a.history == b.history


# ---------------------------------------------------------------------------------------------- exact top-k
class Threads(Collective):
    """Processes simulated by threads: sums and maxima through a barrier (what all_reduce does)."""

    def __init__(self, world):
        self.world, self.barrier, self.lock, self.slots = world, threading.Barrier(world), threading.Lock(), []

    def _reduce(self, value, op):
        with self.lock:
            self.slots.append(value)
        self.barrier.wait()
        out = op(self.slots)
        self.barrier.wait()
        with self.lock:
            self.slots.clear() if self.slots else None
        self.barrier.wait()
        return out

    def sum(self, value):
        return self._reduce(value, sum)

    def max(self, value):
        return self._reduce(value, max)


def test_streamed_and_distributed_top_k_equal_the_shared_rule():
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    for trial in range(6):
        n = rng.randint(50, 3000)
        scores = torch.randint(0, 7, (n,), generator=gen).float() * (1 if trial % 2 else -0.5)  # many ties
        if trial == 3:
            scores[::5] = -0.0  # −0 ties with +0, as in a float comparison
        k = rng.randint(1, n)
        want = top_k_flat(scores, k)
        assert int(want.sum()) == k
        stream, start = StreamingTopK(k), 0  # tensors of random sizes, in position order
        while start < n:
            size = rng.randint(1, 400)
            stream.add(scores[start:start + size], start)
            start += size
        _, positions = stream.result()
        assert torch.equal(positions, torch.nonzero(want).view(-1))
        # three "processes" holding interleaved rows of the universe (as FSDP shards do per tensor)
        owner = torch.tensor([(i // 7) % 3 for i in range(n)])
        group, out = Threads(3), {}

        def rank(r, group=group, out=out, owner=owner, scores=scores, k=k):
            mine = torch.nonzero(owner == r).view(-1)
            out[r] = (mine, top_k(scores[mine], mine, k, group))

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = torch.zeros(n, dtype=torch.bool)
        for mine, mask in out.values():
            got[mine[mask]] = True
        assert torch.equal(got, want), trial


# ---------------------------------------------------------------------------------------------- candidates
def test_candidates_one_reproduces_the_dense_localizer(bert, llama_bf16, data):
    """c = 1: the same trajectory, regions and history bit for bit — fp32 BERT and a bf16 Llama (causal)."""
    pre, ft = bert
    for cfg in (LocalizeConfig(sparsity=0.01, steps=5, lr=1e9, seed=3, select_on="last"),
                LocalizeConfig(sparsity=0.01, steps=4, seed=3, budgets=[0.001, 0.005, 0.02], eval_every=2,
                               micro_batch=8)):
        dense = localize(pre, ft, data.train, data.dev, cfg, progress=False)
        same_result(dense, localize(pre, ft, data.train, data.dev, cfg.replace(candidates=1.0), progress=False))
    pre, ft, folder = llama_bf16
    cfg = LocalizeConfig(sparsity=0.01, steps=3, seed=3, budgets=[0.005, 0.02, "round"], micro_batch=8)
    dense = localize(pre, ft, data.train, data.dev, cfg, progress=False)
    assert dense.base_size > 0 and all(len(r) for r in dense.regions.values())
    same_result(dense, localize(pre, ft, data.train, data.dev, cfg.replace(candidates=1.0), progress=False))
    same_result(dense, localize(pre, folder, data.train, data.dev, cfg.replace(candidates=1.0), progress=False))
    same_result(dense, localize(pre, folder.parent, data.train, data.dev, cfg, progress=False))  # a run dir, dense


def test_candidate_state_lives_on_the_candidates_only(llama_bf16, data):
    pre, ft, folder = llama_bf16
    names = graftable_names(pre)
    cfg = LocalizeConfig(sparsity=0.01, candidates=0.05, steps=2, budgets=[0.01, 0.05, 30])
    before = snapshot(pre)
    universe = sum(p.numel() for n, p in pre.named_parameters() if n in names)
    work = Candidates(pieces(pre, names, Group()), fine_tuned(str(folder), pre, names), Group(),
                      size=Budget.parse(0.05).size(universe))
    relax = Sigmoid()
    relax.start(work, None, work.top({n: d.abs() for n, d in work.delta.items()}, int(round(0.01 * universe))), None, 0)
    assert work.size == Budget.parse(0.05).size(universe) == sum(p.numel() for p in work.pos.values())
    for n in names:
        m = work.pos[n].numel()
        assert work.pos[n].dtype == torch.int32
        assert relax.S[n].dtype == torch.float32 and relax.S[n].shape == (m,)  # fp32 S on a bf16 model
        assert work.delta[n].shape == work.original[n].shape == relax.base[n].shape == (m,)
    assert work.count(relax.base) == int(round(0.01 * universe))
    assert_intact(pre, before)  # building the state reads θ_pre only
    top_c = get_localizer("movement").region(pre, ft, None, 0.05)  # C is exactly the top-c |Δ|, same tie rule
    assert all(torch.equal(work.pos[n].to(torch.int64), top_c.indices.get(n, torch.empty(0, dtype=torch.int64)))
               for n in names)
    res = localize(pre, folder, data.train, data.dev, cfg, progress=False)
    assert res.candidate_size == len(top_c) and res.summary["candidate_size"] == len(top_c)
    for budget, region in res.regions.items():
        assert len(region) == budget.size(universe)
        assert len(region & top_c) == len(region)  # every region lies in the candidate set
    assert_intact(pre, before)


def test_candidate_set_is_the_exact_top_c_even_among_ties(bert):
    """Half the tensors did not move (|Δ| = 0 ties galore): C is still exactly the shared selection's top-c."""
    import copy  # noqa: PLC0415

    pre, ft = bert
    names = graftable_names(pre)
    half = copy.deepcopy(ft)
    with torch.no_grad():
        for n, p in half.named_parameters():
            if n in names[len(names) // 2:]:
                p.copy_(dict(pre.named_parameters())[n])
    for c in (0.05, 0.6):
        universe = sum(p.numel() for n, p in pre.named_parameters() if n in names)
        work = Candidates(pieces(pre, names, Group()), InMemory(half), Group(), size=Budget.parse(c).size(universe))
        want = get_localizer("movement").region(pre, half, None, c)
        assert all(torch.equal(work.pos[n].to(torch.int64), want.indices.get(n, torch.empty(0, dtype=torch.int64)))
                   for n in names), c


def test_gradients_are_gathered_as_each_tensor_is_ready(bert, data):
    """When a tensor's gradient is accumulated, no other graftable tensor still holds a dense gradient."""
    pre, ft = bert
    names = set(graftable_names(pre))
    params = dict(pre.named_parameters())
    seen = []

    def check(p):
        seen.append(sum(1 for n in names if params[n].grad is not None))

    handles = [params[n].register_post_accumulate_grad_hook(check) for n in names]  # runs before localize's own
    try:
        localize(pre, ft, data.train, None, LocalizeConfig(sparsity=0.01, candidates=0.1, steps=2, micro_batch=8),
                 progress=False)
    finally:
        for h in handles:
            h.remove()
    assert seen and max(seen) == 1  # only the tensor whose hook runs


@pytest.mark.parametrize("checkpointing", [False, True])
def test_interrupted_candidate_localization_restores_pre(llama_bf16, data, checkpointing):
    pre, ft, folder = llama_bf16
    before = snapshot(pre)
    hook = Interrupt(3)
    handle = pre.model.register_forward_hook(hook)
    try:
        with pytest.raises(KeyboardInterrupt):
            localize(pre, folder, data.train, data.dev, LocalizeConfig(
                sparsity=0.01, candidates=0.05, steps=5, micro_batch=8, gradient_checkpointing=checkpointing),
                progress=False)
    finally:
        handle.remove()
    assert hook.seen == 3
    assert_intact(pre, before)


def test_activation_checkpointing_changes_nothing_but_memory(llama_bf16, data):
    pre, ft, folder = llama_bf16
    cfg = LocalizeConfig(sparsity=0.01, candidates=0.05, steps=2, seed=1, budgets=[0.01, "round"], micro_batch=8)
    before = snapshot(pre)
    same_result(localize(pre, ft, data.train, data.dev, cfg, progress=False),
                localize(pre, ft, data.train, data.dev, cfg.replace(gradient_checkpointing=True), progress=False))
    assert_intact(pre, before)


def test_candidate_settings_are_checked(bert, data, tmp_path):
    with pytest.raises(SkillgraftError, match="candidates=0.001 is smaller than sparsity=0.01"):
        LocalizeConfig.build({"sparsity": 0.01, "candidates": 0.001}, where="localize")
    with pytest.raises(SkillgraftError, match="candidates=0.01 is smaller than budget 0.05"):
        LocalizeConfig.build({"sparsity": 0.001, "candidates": 0.01, "budgets": [0.001, 0.05]})
    for bad in (0, 1.5):
        with pytest.raises(SkillgraftError, match="candidates"):
            LocalizeConfig.build({"candidates": bad})
    # unset, the memory settings leave configs and store keys of dense runs as they were before they existed
    assert not {"candidates", "gradient_checkpointing"} & set(LocalizeConfig().to_dict())
    lean = LocalizeConfig(candidates=0.01, gradient_checkpointing=True)
    assert LocalizeConfig.build(lean.to_dict()) == lean and lean.key() != LocalizeConfig().key()
    pre, ft = bert
    before = snapshot(pre)
    with pytest.raises(SkillgraftError, match="candidate set holds"):  # a count larger than C
        localize(pre, ft, data.train, None, LocalizeConfig(sparsity=0.001, candidates=0.001, steps=1,
                                                           budgets=[10_000]), progress=False)
    assert_intact(pre, before)
    with pytest.raises(SkillgraftError, match="no model.safetensors"):
        localize(pre, tmp_path, data.train, None, LocalizeConfig(candidates=0.1), progress=False)


def test_in_memory_and_folder_sources_agree(llama_bf16):
    pre, ft, folder = llama_bf16
    names = graftable_names(pre)
    a, b = InMemory(ft), fine_tuned(folder, pre, names)
    for n in names[:4]:
        assert torch.equal(a.rows(n, 1, 3), b.rows(n, 1, 3)) and a.rows(n).dtype == b.rows(n).dtype


# ---------------------------------------------------------------------------------------------- FSDP2
RELAXED = {"steps": 2, "candidates": 0.05, "sparsity": 0.01, "budgets": [0.005, 0.02], "micro_batch": 4,
           "eval_every": 1, "seed": 3, "optimizer": "nsgd"}  # nsgd: its RMS is all-reduced; Adam is elementwise
SCRIPT = f"""
import sys, types, torch
from accelerate import Accelerator
from skillgraft.data import load_kshot
from skillgraft.graft import LocalizeConfig, get_localizer, localize
RELAXED = {RELAXED!r}
from skillgraft.graft.localizers.machinery import candidates as C
from skillgraft.models import build_scorer
torch.set_num_threads(1)
acc = Accelerator(cpu=True)
pre_path, ft_dir, data_dir, out, cfg = sys.argv[1:6]
data = load_kshot("SST-2", 8, 13, data_dir)
pre = build_scorer(pre_path, "SST-2", "causal")
before = {{n: p.detach().clone() for n, p in pre.named_parameters()}}
held = []
init = C.Candidates.__init__
def spy(self, *a, **k):
    init(self, *a, **k)
    held.append(sum(p.numel() for p in self.pos.values()))
C.Candidates.__init__ = spy
res = localize(pre, ft_dir, data.train[:9], data.dev, LocalizeConfig.model_validate_json(cfg), accelerator=acc,
               progress=False)
intact = all(torch.equal((p.full_tensor() if hasattr(p, "full_tensor") else p).detach(), before[n])
             for n, p in pre.named_parameters())
sharded = sum(hasattr(p, "full_tensor") for p in pre.parameters())
held_by_rank = acc.gather(torch.tensor(held)).tolist()
nine = types.SimpleNamespace(train=data.train[:9], dev=data.dev)
adam = get_localizer("learned-adam").run(pre, ft_dir, nine, RELAXED)
# another optimizer, one layout
relaxed = ({{b.key: r.indices for b, r in adam.regions.items()}}, [h.columns() for h in adam.history])
if acc.is_main_process:
    torch.save({{"regions": {{b.key: r.indices for b, r in res.regions.items()}},
                "history": [h.columns() for h in res.history],
                "intact": intact, "sharded": sharded, "held": held_by_rank, "candidates": res.candidate_size,
                "relaxed": relaxed}}, out)
torch.distributed.barrier()  # neither rank leaves while the other still talks to gloo (else: SIGABRT at exit);
# not acc.wait_for_everyone(): Accelerate passes device_ids=[rank] even to gloo, and rank 1 has no cuda:1 on a
# one-GPU machine
acc.end_training()       # destroys the process group
"""


def test_two_process_fsdp2_localization_matches_one(tiny_models, data, toy_data, tmp_path):
    """`accelerate launch` with configs/fsdp2-cpu.yaml (2 CPU processes, gloo): each rank keeps its shards'
    candidates only, budgets by the distributed top-k; the regions equal the single-process ones. 9 training
    and 25 scoring examples: one rank runs a weighted-0 forward to stay in step; checkpointing on."""
    from pathlib import Path  # noqa: PLC0415

    small = load_kshot("SST-2", 8, 13, toy_data)
    pre, ft = trained_pair(tiny_models["llama"], "causal", small, steps=20)
    ft.save_pretrained(tmp_path / "ft")
    cfg = LocalizeConfig(sparsity=0.01, candidates=0.05, steps=3, seed=3, budgets=[0.005, 0.02, "round"], micro_batch=4,
                         gradient_checkpointing=True)
    one = localize(pre, tmp_path / "ft", small.train[:9], small.dev, cfg, progress=False)
    script = tmp_path / "fsdp.py"
    script.write_text(SCRIPT)
    config = Path(__file__).resolve().parents[1] / "configs" / "fsdp2-cpu.yaml"
    r = launch_ranks(["--config_file", config, "--main_process_port", free_port()], script,  # ranks forked
                     [tiny_models["llama"], tmp_path / "ft", toy_data, tmp_path / "two.pt", cfg.model_dump_json()],
                     {"OMP_NUM_THREADS": "1"}, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    two = torch.load(tmp_path / "two.pt")
    assert two["intact"] and two["sharded"] == len(list(pre.model.parameters()))  # every base tensor sharded
    assert sum(two["held"]) == two["candidates"] == one.candidate_size and max(two["held"]) < one.candidate_size
    assert two["history"] == [h.columns() for h in one.history]
    for budget, region in one.regions.items():
        got = two["regions"][budget.key]
        assert set(got) == set(region.indices) and all(torch.equal(got[n], region.indices[n]) for n in got), budget
    nine = types.SimpleNamespace(train=small.train[:9], dev=small.dev)
    regions, history = two["relaxed"]  # learned-adam (nsgd) sharded = one process
    alone = get_localizer("learned-adam").run(pre, tmp_path / "ft", nine, RELAXED)
    assert history == [h.columns() for h in alone.history] and regions.keys() == {b.key for b in alone.regions}
    for budget, region in alone.regions.items():
        got = regions[budget.key]
        assert set(got) == set(region.indices) and all(torch.equal(got[n], region.indices[n]) for n in got)
