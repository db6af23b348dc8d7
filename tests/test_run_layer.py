"""The run layer, typed (issue 47): capabilities read from the localizer's class (the frontier learns one
trajectory per γ_base sparsity for any localizer declaring ``sparsity_trajectories``, not for a name), one
``max_length`` default, and finetune as a verb with a typed result."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers import LOCALIZERS, LocalizeConfig, register_localizer
from skillgraft.graft.localizers.machinery.base import Localizer
from skillgraft.pipeline.frontier import FrontierSpec, _families


class Trajectories(Localizer):
    """A throwaway localizer learning one trajectory per sparsity (records its calls)."""

    Options = LocalizeConfig
    summary = "a stand-in with sparsity trajectories"
    sparsity_trajectories = True
    calls: list = []

    def trajectory(self, pre, ft, data, options=None, *, ranked=False, progress=False):
        self.calls.append((options.sparsity, [b.fraction for b in options.budget_list], ranked))
        return SimpleNamespace(regions={b: f"region {b.fraction:g}" for b in options.budget_list},
                               ranking="its order" if ranked else None)


def test_the_frontier_reads_sparsity_trajectories_from_the_class():
    register_localizer("trajectories-test")(Trajectories)
    try:
        spec = FrontierSpec(frontier_levels=["1e-3", "1e-2"], frontier_sparsities=[1e-3, 1e-2], frontier_peers=[])
        member = SimpleNamespace(pre="θ_pre", ft="θ_ft")
        out, _ = _families(member, spec, "trajectories-test", LocalizeConfig(), SimpleNamespace(train=[], dev=[]),
                           False)
    finally:
        LOCALIZERS.pop("trajectories-test")
    assert out == {"trajectories-test": (None, {1e-3: "region 0.001", 1e-2: "region 0.01"}, False),
                   "trajectories-test order": ("its order", None, False)}
    assert Trajectories.calls == [(1e-3, [1e-3], True), (1e-2, [1e-2], False)]
    with pytest.raises(SkillgraftError, match="no trajectory per sparsity"):
        LOCALIZERS["movement"].trajectory(None, None, [], None)


def test_max_length_has_one_default():
    """``max_length``'s default is written once (skillgraft/spec.py's MAX_LENGTH, read through models/spec.py): no
    parameter, field or option of src/ spells a number for it."""
    import ast
    from pathlib import Path

    from skillgraft.models.spec import MAX_LENGTH, ModelSpec

    assert ModelSpec().max_length == MAX_LENGTH
    found = []
    for path in (Path(__file__).resolve().parents[1] / "src" / "skillgraft").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            pairs = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pairs += zip([x.arg for x in a.args[len(a.args) - len(a.defaults):]], a.defaults)
                pairs += [(x.arg, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                pairs.append((node.target.id, node.value))
            for name, value in pairs:
                if name == "max_length" and any(isinstance(c, ast.Constant) and isinstance(c.value, int)
                                                and not isinstance(c.value, bool) for c in ast.walk(value)
                                                if not (isinstance(c, ast.Constant) and c.value == 8)):
                    found.append(f"{path.name}:{node.lineno}")
    assert not found, f"max_length defaults spelt as numbers: {found}"


def test_finetune_is_a_verb_with_a_typed_result(tiny_bert, toy_data, tmp_path):
    """verbs/finetune.py runs what ``skillgraft finetune`` runs; an existing folder is refused before training."""
    from skillgraft.data.spec import DataSpec
    from skillgraft.models.spec import ModelSpec
    from skillgraft.train.config import FinetuneConfig
    from skillgraft.verbs.finetune import FinetuneResult, finetune

    data = DataSpec(task="SST-2", k=8, seed=13, data_dir=toy_data, test_limit=8)
    config = FinetuneConfig(optimizer="adamw", lr=1e-3, steps=2, eval_every=2)
    result = finetune(data, ModelSpec(model=str(tiny_bert)), config, out=tmp_path / "run")
    assert isinstance(result, FinetuneResult) and (result.out / "config.json").is_file()
    assert result.metrics["steps"] == 2 and result.line().startswith("SST-2 k=8 seed=13: test acc")
    with pytest.raises(SkillgraftError, match="exists"):
        finetune(data, ModelSpec(model=str(tiny_bert)), config, out=tmp_path / "run")
