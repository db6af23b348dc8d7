"""Typed artefacts keep their bytes: report rows write the same CSV / JSON as the dicts they replaced, and the
store's keys of resolved specs give the same digests as the entries already on disk."""

from __future__ import annotations

import json

from skillgraft.data.spec import DataSpec
from skillgraft.models.spec import ModelSpec
from skillgraft.pipeline import setup as pipeline_setup
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
    rows[3]["file_bytes"] = 123  # a column a recipe adds after the comparison
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
    monkeypatch.setattr(pipeline_setup, "model_digest", lambda model: "4663cd7f326c1415")
    monkeypatch.setattr(pipeline_setup, "data_digest", lambda task, data_dir=None: "cbcfd0532b41ed7e")
    key = pipeline_setup.finetune_key(ModelSpec(), DataSpec(task="SST-2", k=64, seed=42), FinetuneConfig(steps=400))
    assert Store(tmp_path).path("ft", key, label="SST-2-64-42-head").name == "ft-SST-2-64-42-head-a6b7f06e3f2d"
    assert Store(tmp_path).path("ft", key).name == "ft-a6b7f06e3f2d"
