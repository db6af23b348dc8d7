"""Typed artefacts keep their bytes: report rows write the same CSV / JSON as the dicts they replaced, and the
store's keys of resolved specs give the same digests as the entries already on disk."""

from __future__ import annotations

import json

from skillgraft.data.spec import DataSpec
from skillgraft.models.spec import ModelSpec
from skillgraft.pipeline import opening as pipeline_setup
from skillgraft.pipeline import store as pipeline_store
from skillgraft.pipeline.report import write_csv
from skillgraft.pipeline.store import Store
from skillgraft.pipeline.variants import ResultRow, derive
from skillgraft.train import FinetuneConfig


def _rows(metrics: list[tuple[str, str, int, dict]]) -> list[ResultRow]:
    return [ResultRow(name, kind, params, dict(m)) for name, kind, params, m in metrics]


CLASSIFICATION = [  # evaluate()'s metrics in its order (f1 task; FT's agreement appended last)
    ("fine-tuned", "ft", 1000, {"accuracy": 0.9, "ece": 0.05, "n": 400, "mean_confidence": 0.91, "f1": 0.88,
                                "score": 0.88, "agreement": 1.0}),
    ("pre-trained", "pre", 0, {"accuracy": 0.5, "ece": 0.2, "n": 400, "mean_confidence": 0.6, "f1": 0.4,
                               "score": 0.4, "agreement": 0.52}),
    ("head only", "head-only", 0, {"accuracy": 0.6, "ece": 0.15, "n": 400, "mean_confidence": 0.7, "f1": 0.55,
                                   "score": 0.55, "agreement": 0.61}),
    ("graft 0.01", "graft", 10, {"accuracy": 0.85, "ece": 0.07, "n": 400, "mean_confidence": 0.8123456789,
                                 "f1": 0.8, "score": 0.8, "agreement": 0.93}),
]
GENERATIVE = [
    ("fine-tuned", "ft", 1000, {"loss": 1.25, "exact_match": 0.4, "score": 0.4, "agreement": 1.0}),
    ("pre-trained", "pre", 0, {"loss": 3.5, "exact_match": 0.1, "score": 0.1, "agreement": 0.2}),
    ("graft 0.01", "graft", 12, {"loss": 2.0, "exact_match": 0.3, "score": 0.3, "agreement": 0.5}),
]
# What write_csv wrote for these rows when they were dicts (derive() of the code before ResultRow).
CLASSIFICATION_CSV = """\
model,kind,params,accuracy,ece,n,mean_confidence,f1,score,agreement,density,share_of_ft,gap_closed,file_bytes
fine-tuned,ft,1000,0.9,0.05,400,0.91,0.88,0.88,1,0.5,1,1,
pre-trained,pre,0,0.5,0.2,400,0.6,0.4,0.4,0.52,0,0.454545,-0.454545,
head only,head-only,0,0.6,0.15,400,0.7,0.55,0.55,0.61,0,0.625,0,
graft 0.01,graft,10,0.85,0.07,400,0.812346,0.8,0.8,0.93,0.005,0.909091,0.757576,123
"""
GENERATIVE_CSV = """\
model,kind,params,loss,exact_match,score,agreement,density,share_of_ft,gap_closed,loss_recovered
fine-tuned,ft,1000,1.25,0.4,0.4,1,0.5,1,1,1
pre-trained,pre,0,3.5,0.1,0.1,0.2,0,0.25,0,0
graft 0.01,graft,12,2,0.3,0.3,0.5,0.006,0.75,0.666667,0.666667
"""
WITHOUT_FT_CSV = """\
model,kind,params,accuracy,ece,n,mean_confidence,f1,score,agreement,density
pre-trained,pre,0,0.5,0.2,400,0.6,0.4,0.4,0.52,0
head only,head-only,0,0.6,0.15,400,0.7,0.55,0.55,0.61,0
graft 0.01,graft,10,0.85,0.07,400,0.812346,0.8,0.8,0.93,0
"""


def _crlf(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode()  # the csv module's line ends


def test_result_rows_write_the_same_csv_bytes(tmp_path):
    rows = derive(_rows(CLASSIFICATION), universe_size=2000)
    rows[3].file_bytes = 123  # a saved graft's bytes, set after the comparison (a typed field)
    assert write_csv(tmp_path / "a.csv", rows).read_bytes() == _crlf(CLASSIFICATION_CSV)
    generative = derive(_rows(GENERATIVE), universe_size=2000)
    assert write_csv(tmp_path / "g.csv", generative).read_bytes() == _crlf(GENERATIVE_CSV)
    without_ft = derive(_rows(CLASSIFICATION[1:]), universe_size=0)
    assert write_csv(tmp_path / "n.csv", without_ft).read_bytes() == _crlf(WITHOUT_FT_CSV)


def test_result_rows_are_typed_and_read_as_their_columns(tmp_path):
    from skillgraft.io import write_json

    rows = derive(_rows(CLASSIFICATION), universe_size=2000)
    graft = rows[3]
    assert (graft.score, graft.density, graft.share_of_ft, graft.loss_recovered) == (0.8, 0.005, 0.8 / 0.88, None)
    assert graft["score"] == 0.8 and graft["gap_closed"] == graft.gap_closed and "loss_recovered" not in graft
    assert graft.get("file_bytes") is None and list(graft)[:4] == ["model", "kind", "params", "accuracy"]
    # JSON (metrics.json's "rows"): the same objects, keys in the same order, as the dicts they replaced
    written = json.loads(write_json(tmp_path / "m.json", {"rows": rows}).read_text())["rows"]
    assert written == [dict(r) for r in rows] and list(written[0]) == list(rows[0].columns())
    assert written[1] == {"model": "pre-trained", "kind": "pre", "params": 0, **CLASSIFICATION[1][3],
                          "density": 0.0, "share_of_ft": 0.4 / 0.88, "gap_closed": (0.4 - 0.55) / (0.88 - 0.55)}


def test_store_key_of_a_finetuning_run_is_unchanged(monkeypatch, tmp_path):
    """The key of resolved specs hashes to the digest of an entry written before the specs were typed
    (``ft-SST-2-64-42-head-a6b7f06e3f2d`` in the shared store: MiniLM, SST-2 k=64 seed 42, 400 SGD steps)."""
    monkeypatch.setattr(pipeline_store, "model_digest", lambda model: "4663cd7f326c1415")
    monkeypatch.setattr(pipeline_store, "data_digest", lambda task, data_dir=None: "cbcfd0532b41ed7e")
    key = pipeline_setup.finetune_key(ModelSpec(), DataSpec(task="SST-2", k=64, seed=42), FinetuneConfig(steps=400))
    assert Store(tmp_path).path("ft", key, label="SST-2-64-42-head").name == "ft-SST-2-64-42-head-a6b7f06e3f2d"
    assert Store(tmp_path).path("ft", key).name == "ft-a6b7f06e3f2d"


# graft_config.json "metadata" of grafts written before it was typed (a checkpoint pair's graft in a merge, and a
# composition of it with a registered-task graft), with the weights those writers stored.
TASK_SPEC = {"name": "reviews", "kind": "single", "labels": ["bad", "good"], "label_words": ["bad", "good"],
             "template": "*cls**sent_0*_It_was*mask*.*sep+*", "causal_template": None, "metric": "accuracy",
             "folder": None, "positive_label": None, "has_train": True, "test_from_train": False}
PAIR_META = {"task": "reviews", "mode": "classifier", "k": 0, "seed": 42, "pretrained": "A", "finetuned": "B",
             "task_spec": TASK_SPEC,
             "user_data": {"data": "reviews.jsonl", "text_field": "review", "label_field": "stars", "seed": 42},
             "localizer": "learned", "budget": "0.01", "merge_task": "reviews"}
COMPOSED_META = {"composed_of": [PAIR_META, {"task": "SST-2", "mode": "head", "k": 64, "seed": 13, "keep": 0.9}],
                 "overlap_policy": "average",
                 "compose": {"policy": "average", "grafts": 2, "sizes": [3, 2], "size": 4, "overlapping_coordinates": 1,
                             "dropped_coordinates": 0, "carried_conflicts": ["head.weight"], "carried_policy": "first"}}
_HEADER = ("+AAAAAAAAAB7Il9fbWV0YWRhdGFfXyI6eyJmb3JtYXQiOiJza2lsbGdyYWZ0LmdyYWZ0In0sImNhcnJpZWQ6OmhlYWQud2VpZ2h0Ijp7ImR0"
           "eXBlIjoiRjMyIiwic2hhcGUiOlsyLDNdLCJkYXRhX29mZnNldHMiOlswLDI0XX0sInZhbHVlcyI6eyJkdHlwZSI6IkYzMiIsInNoYXBlIjpb")
OLD_GRAFTS = {  # name: (size, metadata, sha256 and base64 of graft.safetensors)
    "pair": (3, PAIR_META, "e9c4ecb768c5ccd29bd2503e281ea40ec34abc837317a05c29e064b8ffd6e8f7",
             _HEADER + "M10sImRhdGFfb2Zmc2V0cyI6WzI0LDM2XX0sImluZGljZXMiOnsiZHR5cGUiOiJJMzIiLCJzaGFwZSI6WzNdLCJkYXRhX29mZnNl"
             "dHMiOlszNiw0OF19fSAgICAgILaEET+h0Yq/LQWzv3qDzj7liFY/RCE4v1w/xT9QPJa+SXELwAEAAAAHAAAADAAAAA=="),
    "composed": (4, COMPOSED_META, "ad7f9d628f92b4afe227de4c9b1d1877580188a04f7640773791b6bdf6506972",
                 _HEADER + "NF0sImRhdGFfb2Zmc2V0cyI6WzI0LDQwXX0sImluZGljZXMiOnsiZHR5cGUiOiJJMzIiLCJzaGFwZSI6WzRdLCJkYXRh"
                 "X29mZnNldHMiOls0MCw1Nl19fSAgICAgILaEET+h0Yq/LQWzv3qDzj7liFY/RCE4v1w/xT+uX7K+GL0Yv0lxC8ABAAAABwAAAAsAAAA"
                 "MAAAA"),
}


def _write_old_graft(folder, size: int, metadata: dict, sha: str, weights: str) -> dict:
    """A graft folder byte for byte as the writer before typed metadata wrote it (json.dumps(config, indent=2))."""
    import base64

    config = {"format": "skillgraft.graft", "format_version": 1, "base_model": "tiny-base",
              "base_fingerprint": "ffffffffffffffff", "size": size, "density": size / 17, "graftable_parameters": 17,
              "carried_parameters": 6, "carried": ["head.weight"], "carried_shapes": {"head.weight": [2, 3]},
              "shapes": {"a.weight": [4, 3], "b.bias": [5]}, "metadata": metadata, "weights_sha256": sha}
    folder.mkdir()
    (folder / "graft.safetensors").write_bytes(base64.b64decode(weights))
    (folder / "graft_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def test_graft_files_written_before_typed_metadata_read_and_round_trip(tmp_path):
    from skillgraft.graft import Graft
    from skillgraft.graft.graft_file import GraftMetadata

    for name, (size, metadata, sha, weights) in OLD_GRAFTS.items():
        old = _write_old_graft(tmp_path / name, size, metadata, sha, weights)
        g = Graft.from_pretrained(tmp_path / name)
        assert isinstance(g.metadata, GraftMetadata) and g.size == size and g.metadata.to_dict() == metadata
        g.save_pretrained(tmp_path / f"{name}-again")
        again = json.loads((tmp_path / f"{name}-again" / "graft_config.json").read_text())
        assert again == old  # the same file, field for field (metadata as written, no keys added)
    pair = Graft.from_pretrained(tmp_path / "pair").metadata
    assert (pair.task, pair.mode, pair.k, pair.seed, pair.merge_task) == ("reviews", "classifier", 0, 42, "reviews")
    assert pair.task_spec == TASK_SPEC and pair.user_data["label_field"] == "stars" and pair.localizer == "learned"
    composed = Graft.from_pretrained(tmp_path / "composed").metadata
    assert composed.task is None and composed.compose["overlapping_coordinates"] == 1
    assert composed.composed_of[1] == {"task": "SST-2", "mode": "head", "k": 64, "seed": 13, "keep": 0.9}


def test_bad_graft_metadata_names_the_file_and_field(tmp_path):
    from skillgraft.errors import SkillgraftError
    from skillgraft.graft import Graft

    size, metadata, sha, weights = OLD_GRAFTS["pair"]
    _write_old_graft(tmp_path / "g", size, {**metadata, "k": "all"}, sha, weights)
    try:
        Graft.from_pretrained(tmp_path / "g")
    except SkillgraftError as e:
        assert str(e).startswith(f"{tmp_path / 'g' / 'graft_config.json'}: field 'metadata.k'") and "'all'" in str(e)
    else:
        raise AssertionError("a graft whose metadata.k is not a number was read")


def test_seed_summary_rows_are_typed_and_write_the_same_summary(tmp_path):
    """seed_tables' summary rows are typed (keys, n_seeds, a MeanStd per metric); summary.csv and their JSON keep
    the columns the dicts had (``<metric>_mean`` / ``_std`` spelt only by ``columns()``)."""
    from skillgraft.io import write_json
    from skillgraft.pipeline.report import MeanStd, RunDir, SeedSummary

    rows = [{"task": "SST-2", "model": "graft", "seed": 13, "score": 0.8, "ece": 0.1},
            {"task": "SST-2", "model": "graft", "seed": 21, "score": 0.9, "ece": None},
            {"task": "cr", "model": "ft", "seed": 13, "score": 0.7}]
    _, summary = RunDir(tmp_path).seed_tables("r.csv", rows, ["task", "model"], ["score", "ece"])
    assert (tmp_path / "summary.csv").read_text() == ("task,model,n_seeds,score_mean,score_std,ece_mean,ece_std\n"
                                                      "SST-2,graft,2,0.85,0.05,0.1,0\ncr,ft,1,0.7,0,,\n")
    first = summary[0]
    assert isinstance(first, SeedSummary) and first.group == {"task": "SST-2", "model": "graft"}
    assert first.n_seeds == 2 and first.stats["ece"] == MeanStd(0.1, 0.0)
    assert summary[1].stats["ece"] == MeanStd(None, None) and summary[1]["ece_mean"] is None
    back = json.loads(write_json(tmp_path / "s.json", summary).read_text())
    assert list(back[0]) == ["task", "model", "n_seeds", "score_mean", "score_std", "ece_mean", "ece_std"]
    assert back[0]["score_mean"] == 0.8500000000000001 and back[1]["score_std"] == 0.0


def test_scored_steps_are_typed_and_keep_their_columns():
    """The engine's log: a ScoredStep per scored step, its JSON columns those of the dicts it replaced (step, budget,
    the relaxation's fields, then ``<label>:acc`` / ``:size`` / ``:iou_prev``), read back as the same step."""
    from skillgraft.graft.localizers.machinery.base import BudgetScore, Localization, ScoredStep

    first = ScoredStep(0, None, {"temperature": 0.5}, {"0.01": BudgetScore(0.5, 10), "round": BudgetScore(0.25, 3)})
    later = ScoredStep(2, "0.01", {}, {"0.01": BudgetScore(0.75, 12, 0.8)})
    assert list(first.columns().items()) == [("step", 0), ("temperature", 0.5), ("0.01:acc", 0.5),
                                             ("0.01:size", 10), ("round:acc", 0.25), ("round:size", 3)]
    assert list(later.columns()) == ["step", "budget", "0.01:acc", "0.01:size", "0.01:iou_prev"]
    assert later["0.01:iou_prev"] == 0.8 and first.scores["round"].size == 3
    for step in (first, later):
        assert ScoredStep.from_columns(step.columns(), ["0.01", "round"]) == step
    summary = Localization({}, history=[first, later], step_seconds=0.1).summary
    assert summary["history"] == [first.columns(), later.columns()]
    assert json.loads(json.dumps(summary["history"]))[1]["0.01:iou_prev"] == 0.8


def test_wise_points_are_typed_and_keep_their_columns():
    """WiSE's points and curves: a SetScore per evaluation set, written as the former ``<set>:score`` / ``:ece``
    columns; a curve keeps only the sets its source was evaluated on, in the order first seen."""
    from skillgraft.recipes.wise import SetScore, WisePoint, _mean_curves

    a = WisePoint("SST-2", "WiSE-FT", 0.5, 13, sets={"SST-2 (ID)": SetScore(0.8, 0.1), "imdb": SetScore(0.6, 0.2)})
    b = WisePoint("SST-2", "WiSE-FT", 0.5, 21, sets={"SST-2 (ID)": SetScore(0.9, 0.3), "imdb": SetScore(0.7, 0.4)})
    c = WisePoint("mpqa", "WiSE-FT", 0.5, 13, sets={"mpqa (ID)": SetScore(0.5, 0.5)})
    assert list(a.columns()) == ["source", "seed", "curve", "alpha", "SST-2 (ID):score", "SST-2 (ID):ece",
                                 "imdb:score", "imdb:ece"]
    mean, other = _mean_curves([a, b, c])
    assert list(mean.columns()) == ["source", "curve", "alpha", "n_seeds", "SST-2 (ID):score", "SST-2 (ID):ece",
                                    "imdb:score", "imdb:ece"]
    assert mean.n_seeds == 2 and mean["imdb:ece"] == 0.30000000000000004 and mean.sets["SST-2 (ID)"].score == 0.8500000000000001
    assert list(other.sets) == ["mpqa (ID)"] and other.seed is None


def test_keep_frontier_sweep_and_inspect_rows_write_their_columns(tmp_path):
    """The typed keep / frontier / sweep / inspect rows write the columns of the dicts they replaced."""
    from skillgraft.graft.inspect import Comparison, Distribution
    from skillgraft.keep.search import KeepResult, Probe
    from skillgraft.io import write_json
    from skillgraft.pipeline.frontier import FrontierResult
    from skillgraft.keep.report import KeepSummary, KeepTarget
    from skillgraft.verbs.sweep import SweepRow

    found = KeepResult(0.9, True, 10, 0.95, 12, 0.97, 1000, [Probe(10, 0.8, 0.95, 0.5)], note="n", method="exact")
    target = KeepTarget.of(found)
    assert dict(target) == found.to_dict() and target.shown_size == 10 and target.label == "keep 0.9"
    summary = {"selection": "dev", "selection_n": 16, "confidence": 0.9, "seconds": 1.5,
               "targets": [{**found.to_dict(), "test_score": 0.7, "test_share": 0.8}]}
    assert json.loads(write_json(tmp_path / "k.json", KeepSummary.from_columns(summary)).read_text()) == summary
    keep = {"method": "m", **{k: v for k, v in found.to_dict().items() if k != "probes"}, "probes": [[10, 0.95]],
            "test_score": 0.7, "test_share": 0.8}
    stored = {"task": "SST-2", "ft_score": 0.9, "reference_scores": {"pre": 0.5}, "test_n": 8, "selection": "dev",
              "selection_n": 16, "confidence": 0.9, "universe": 1000, "localizer": "learned",
              "localizer_seconds": 1.0, "keep_seconds": 2.0,
              "rows": [{"method": "learned", "density": 0.01, "params": 10, "score": 0.8, "share_of_ft": 0.9,
                        "gap_closed": None}], "keep": [keep],
              "ahead": [{"density": 0.01, "learned": "learned", "learned_share": 0.9, "best_peer": "random",
                         "peer_share": 0.5, "ahead": True}]}
    result = FrontierResult.from_columns(stored)
    assert result.keep[0].method == "m" and result.keep[0].test_share == 0.8 and result.ahead[0].ahead
    text = write_json(tmp_path / "f.json", result).read_text()
    assert text == json.dumps(stored, indent=2) + "\n"
    row = SweepRow("random", 0.01, 10, 0.8, 0.1, 0.9, 0.88)
    assert list(row) == ["localizer", "level", "params", "score", "ece", "agreement", "ft_score"]
    assert write_csv(tmp_path / "s.csv", [row]).read_bytes() == _crlf(
        "localizer,level,params,score,ece,agreement,ft_score\nrandom,0.01,10,0.8,0.1,0.9,0.88\n")
    dist = Distribution(3, ["query"], {"layer 0": {"query": 3}}, {"layer 0": {"query": 64}})
    assert json.loads(json.dumps(dict(dist))) == {"size": 3, "module_types": ["query"],
                                                  "table": {"layer 0": {"query": 3}},
                                                  "universe": {"layer 0": {"query": 64}}}
    assert list(Comparison(1, 0.5, 0.25, 0.2)) == ["shared", "overlap", "overlap_of_self", "iou"]


def test_fish_rows_write_the_columns_of_the_dicts_they_replaced(tmp_path):
    from skillgraft.pipeline.report import aggregate
    from skillgraft.recipes.fish import METRICS, FishRow, GraftScore

    row = FishRow("SST-2", 13, 1e-4, 10, 10, 10, 0.5, 0.01, GraftScore(0.8, 0.1), GraftScore(0.7, 0.2),
                  GraftScore(0.5, 0.3))
    assert write_csv(tmp_path / "f.csv", [row]).read_bytes() == _crlf(
        "task,seed,sparsity,learned_size,fish_size,random_size,iou_fish_learned,iou_random_learned,learned_score,"
        "learned_ece,fish_score,fish_ece,random_score,random_ece\nSST-2,13,0.0001,10,10,10,0.5,0.01,0.8,0.1,0.7,0.2,"
        "0.5,0.3\n")
    (group,) = aggregate([row, row], ["task", "sparsity"], METRICS)
    assert group["fish_score"] == [0.7, 0.7] and group["random_ece"] == [0.3, 0.3] and group["n_seeds"] == 2


def test_fields_added_later_stay_out_of_dumps_at_their_default_also_where_a_spec_leaves_out_more():
    """OMITTED_AT_DEFAULT (stored runs keep their keys) and a subclass's own `_left_out` work together: one
    serializer, so a spec that leaves out moot fields cannot silently drop the marker's rule."""
    from pydantic import Field

    from skillgraft.spec import OMITTED_AT_DEFAULT, Spec

    class Old(Spec):
        steps: int = 3
        newer: int | None = Field(None, json_schema_extra=OMITTED_AT_DEFAULT)
        moot: int = 0

    class Conditional(Old):
        def _left_out(self) -> set[str]:
            return super()._left_out() | ({"moot"} if self.steps == 3 else set())

    assert Old().to_dict() == {"steps": 3, "moot": 0} and Old(newer=5).to_dict()["newer"] == 5
    assert Conditional().to_dict() == {"steps": 3} and Old().key() != Conditional().key()
    assert Conditional(newer=5, steps=4).to_dict() == {"steps": 4, "newer": 5, "moot": 0}
