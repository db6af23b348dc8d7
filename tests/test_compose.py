"""Composition of grafts with declared overlap policies, on hand-built grafts (no model needed)."""

import pytest
import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft import Graft, Region
from skillgraft.graft.compose import compose, coverage

SHAPES = {"w": (2, 3), "b": (4,)}


def graft(indices: dict, values: dict, carried=None, fp="base") -> Graft:
    return Graft(Region(SHAPES, {k: torch.tensor(v) for k, v in indices.items()}),
                 {k: torch.tensor(v, dtype=torch.float32) for k, v in values.items()},
                 carried or {}, "toy", fp, {"name": str(indices)})


A = graft({"w": [0, 2, 4], "b": [1]}, {"w": [1.0, 2.0, 3.0], "b": [10.0]})
B = graft({"w": [2, 5], "b": [1, 3]}, {"w": [20.0, 50.0], "b": [30.0, 40.0]})
C = graft({"w": [2, 4], "b": [3]}, {"w": [200.0, 400.0], "b": [400.0]})


def values_of(g: Graft) -> dict:
    return {name: dict(zip(g.region.indices[name].tolist(), g.values[name].tolist())) for name in g.region.indices}


def test_region_algebra_used_by_multitask():
    a, b, c = A.region, B.region, C.region
    assert len(a | b) == 6 and len(a & b) == 2 and len(a - b) == 2
    assert a.overlap(b) == pytest.approx(2 / 4)  # |A∩B|/|B|
    assert b.overlap(a) == pytest.approx(2 / 4)
    assert a.overlap(c) == pytest.approx(2 / 3)
    assert c.overlap(a) == pytest.approx(2 / 4)
    owned_c = c - (a | b)  # continual: what C would train after A and B
    assert len(owned_c) == 0
    assert coverage([a, b, c]) == {1: 2, 2: 3, 3: 1}


def test_error_policy_raises_on_overlap_and_passes_disjoint():
    with pytest.raises(SkillgraftError, match="overlap on"):
        compose([A, B], "error")
    disjoint = graft({"w": [1]}, {"w": [7.0]})
    g = compose([A, disjoint])
    assert len(g.region) == 5 and values_of(g)["w"][1] == 7.0
    assert g.metadata.compose["overlapping_coordinates"] == 0


def test_first_wins():
    g = compose([A, B, C], "first")
    v = values_of(g)
    assert v["w"] == {0: 1.0, 2: 2.0, 4: 3.0, 5: 50.0}
    assert v["b"] == {1: 10.0, 3: 40.0}
    assert values_of(compose([C, B, A], "first"))["w"][2] == 200.0
    assert g.metadata.compose["overlapping_coordinates"] == 4


def test_average_is_mean_of_covering_grafts():
    v = values_of(compose([A, B, C], "average"))
    assert v["w"] == {0: 1.0, 2: pytest.approx((2 + 20 + 200) / 3), 4: pytest.approx(201.5), 5: 50.0}
    assert v["b"] == {1: 20.0, 3: 220.0}


def test_consensus_keeps_coordinates_at_least_two_agree_on():
    g = compose([A, B, C], "consensus")
    v = values_of(g)
    assert v["w"] == {2: pytest.approx(74.0), 4: pytest.approx(201.5)}
    assert v["b"] == {1: 20.0, 3: 220.0}
    assert g.metadata.compose["dropped_coordinates"] == 2
    assert values_of(compose([A, B, C], "consensus", min_agree=3))["w"] == {2: pytest.approx(74.0)}
    with pytest.raises(SkillgraftError, match="min_agree"):
        compose([A, B, C], "consensus", min_agree=4)


def test_refusals_are_clear():
    with pytest.raises(SkillgraftError, match="unknown overlap policy"):
        compose([A, B], "sum")
    with pytest.raises(SkillgraftError, match="different base models"):
        compose([A, graft({"w": [1]}, {"w": [1.0]}, fp="other")], "first")
    with pytest.raises(SkillgraftError, match="at least one"):
        compose([], "first")
    h1 = graft({"w": [1]}, {"w": [1.0]}, carried={"head.weight": torch.zeros(2)})
    h2 = graft({"w": [3]}, {"w": [1.0]}, carried={"head.weight": torch.ones(2)})
    with pytest.raises(SkillgraftError, match="carry different values"):
        compose([h1, h2], "first")
    assert torch.equal(compose([h1, h2], "first", carried="first").carried["head.weight"], torch.zeros(2))
    assert compose([h1, h2], "first", carried="drop").carried == {}


def test_composed_graft_round_trips(tmp_path):
    g = compose([A, B, C], "consensus")
    g.save_pretrained(tmp_path / "g")
    back = Graft.from_pretrained(tmp_path / "g")
    assert back.region == g.region and values_of(back) == values_of(g)
    assert back.metadata.overlap_policy == "consensus"
