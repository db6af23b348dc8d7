"""bench/gemma_summary.py's per-cell verdicts (issue 46), on rows shaped as the store's paper-rows entries hold them:
FT − zero-shot with its z, the shares of FT (marked as saying nothing where FT is not told apart from zero-shot),
learned vs top-|Δ| vs random, and the budgets where the learned graft's ECE is below FT's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import gemma_fit_diagnosis as fit
import gemma_records as records
import gemma_summary as summary


def cell(task: str, n: int, ft: float, zs: float, grafts: dict) -> list[dict]:
    rows = [{"task": task, "seed": 13, "model": "pre-trained", "kind": "pre", "score": zs, "n": n, "ece": 0.05},
            {"task": task, "seed": 13, "model": "fine-tuned", "kind": "ft", "score": ft, "n": n, "ece": 0.20}]
    for (label, budget), (score, ece) in grafts.items():
        rows.append({"task": task, "seed": 13, "model": f"{label} {budget}", "kind": "graft", "score": score, "n": n,
                     "ece": ece, "localizer": label, "budget": budget, "share_of_ft": score / ft})
    return rows


def test_verdicts_per_cell():
    L, T, R = summary.LEARNED, summary.TOP, summary.RANDOM
    rows = cell("SST-2", 872, 0.80, 0.56, {(L, "0.0001"): (0.76, 0.10), (T, "0.0001"): (0.70, 0.3),
                                           (R, "0.0001"): (0.56, 0.05), (L, "0.0005"): (0.78, 0.25),
                                           (T, "0.0005"): (0.775, 0.2), (R, "0.0005"): (0.565, 0.05)})
    rows += cell("RTE", 277, 0.52, 0.50, {(L, "0.0001"): (0.51, 0.1), (T, "0.0001"): (0.5, 0.1),
                                          (R, "0.0001"): (0.5, 0.1)})
    lines = summary.verdicts(rows, 64).splitlines()
    assert "FT − ZS (z)" in lines[0]
    rte, sst = lines[2].split(" | "), lines[3].split(" | ")
    assert sst[:6] == ["| SST-2", "13", "0.8000", "0.5600", "+24.0 (z 11.1)", "-5.0"]
    assert sst[6:8] == ["95.0 % (0.0001)", "97.5 % (0.0005)"]
    assert sst[8] == "0.0001 L≫T≫R; 0.0005 L≈T≫R" and sst[9] == "0.0001 |"
    assert rte[4] == "+2.0 (z 0.5)" and rte[5] == "+0.2"  # the paper's GPT-2 RTE FT is 51.8
    assert rte[6] == "98.1 % (0.0001) (FT ≈ ZS: says nothing)"


def test_points_round_half_away_from_zero():
    assert summary.points(0.7025 - 0.532) == "+17.1" and summary.points(0.532 - 0.7025) == "-17.1"


def test_ood_verdicts_per_cell():
    """FT and each learned graft on an OOD set, with the graft's difference from FT and the budgets where it is ≥ FT;
    top-|Δ| rows (when scored) do not enter the learned column."""
    L, T = summary.LEARNED, summary.TOP
    rows = [{**r, "source": "mpqa", "eval": "SST-2"} for r in cell(
        "mpqa", 872, 0.60, 0.50, {(L, "0.0001"): (0.66, 0.1), (L, "1e-05"): (0.55, 0.1), (T, "0.0001"): (0.9, 0.1)})]
    lines = summary.ood_verdicts(rows).splitlines()
    assert lines[0].startswith("| source → target | seed | rows | zero-shot | FT |") and len(lines) == 3
    row = lines[2].split(" | ")
    assert row[:5] == ["| mpqa → SST-2", "13", "872", "0.5000", "0.6000"]
    assert row[5] == "1e-05: 0.5500 (-5.0, z -2.1); 0.0001: 0.6600 (+6.0, z 2.6)"
    assert row[6] == "0.0001 |"


def test_records_keep_what_was_measured_and_summary_reads_them(tmp_path):
    """bench/gemma_records.py copies the JSON and CSV of finished scoring entries, never weights or plots, unfinished
    entries, other kinds or resume states; gemma_summary reads the copy as it reads the store; a re-run writes only
    what changed."""
    import json
    store, to = tmp_path / "store", tmp_path / "records"
    key = {"setup": {"mode": "causal", "pretrained": "d", "data": {"k": 64}}, "localizers": ["a", "b"]}
    rows = {"rows": [{"task": "RTE", "seed": 13, "model": "fine-tuned", "accuracy": 0.6, "mean_confidence": 0.9}]}
    files = {"paper-rows-RTE-abc/key.json": key, "paper-rows-RTE-abc/rows.json": rows,
             "ft-RTE-def/key.json": {"kind": "ft"}, "ft-RTE-def/metrics.json": {"history": [1, 2]},
             "ft-RTE-def/model/config.json": {"big": 0},  # a model folder's config: JSON, but part of the weights
             "ft-RTE-0ff/metrics.json": {"unfinished": 1},  # no key.json: still being written
             "keep-x-1/key.json": {}, "keep-x-1/rows.json": {}}  # a kind that is not a paper-schedule score
    for rel, obj in files.items():
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / rel).write_text(json.dumps(obj))
    (store / "ft-RTE-def/model/model.safetensors").write_bytes(b"\0" * 64)
    (store / "ft-RTE-def/test_probs.csv").write_text("label,p1\n1,0.9\n")
    (store / "ft-RTE-def/reliability.png").write_bytes(b"\x89PNG")
    (store / ".ft-RTE-0ff.resume").mkdir()
    (store / ".ft-RTE-0ff.resume/state.json").write_text("{}")
    (store / "paper-rows-RTE-abc/huge.json").write_text("[" + "0," * 400 + "0]")

    copied, skipped = records.keep(store, to, max_bytes=400)
    got = sorted(str(p.relative_to(to)) for p in to.rglob("*") if p.is_file())
    assert got == ["ft-RTE-def/key.json", "ft-RTE-def/metrics.json", "ft-RTE-def/test_probs.csv",
                   "paper-rows-RTE-abc/key.json", "paper-rows-RTE-abc/rows.json"]
    assert sorted(map(str, copied)) == got and [str(r) for r, _ in skipped] == ["paper-rows-RTE-abc/huge.json"]
    found = summary.entries(to, "paper-rows", "d", 64)
    assert [r["model"] for _, rs in found for r in rs] == ["fine-tuned"]
    assert found[0][1][0]["over_confidence"] == 0.9 - 0.6
    assert records.keep(store, to, max_bytes=400)[0] == []  # nothing changed: nothing written
    (store / "ft-RTE-def/metrics.json").write_text("{}")
    assert [str(r) for r in records.keep(store, to, max_bytes=400)[0]] == ["ft-RTE-def/metrics.json"]
    assert records.main(["--store", str(store), "--to", str(store / "x")]) == 2  # never into the store itself


def test_mean_table_gives_the_tasks_own_score_beside_accuracy():
    """MRPC's score is F1 (what share_of_ft is of): the per-task table shows it beside accuracy, not accuracy alone."""
    rows = [{"task": "MRPC", "seed": s, "model": "fine-tuned", "score": f1, "accuracy": acc, "share_of_ft": 1.0}
            for s, f1, acc in ((13, 0.70, 0.62), (42, 0.80, 0.66))]
    (row,) = summary.table(rows, ("task",))
    assert row["score"] == 0.75 and row["accuracy"] == 0.64
    head, _, line = summary.markdown([row], ("task",)).splitlines()
    assert head.startswith("| task | model | seeds | score | accuracy |") and "| 0.750 | 0.640 |" in line


def test_fit_diagnosis_reads_the_full_fine_tuning_and_divides_by_ft(tmp_path):
    """bench/gemma_fit_diagnosis.py: of a cell's fine-tunings it reads the full schedule's (not a 256-step grid point,
    not an unfinished or weightless entry); a region's fit share is its selection accuracy over FT's on those rows,
    its carry the test share over the fit share; a budget without a scored row has no test share."""
    import json

    def ft(name: str, steps: int, *, key: bool = True, model: bool = True) -> None:
        run = tmp_path / name / "run"
        (run / "model").mkdir(parents=True) if model else run.mkdir(parents=True)
        (run / "metrics.json").write_text(json.dumps({"task": "QNLI", "seed": 13, "steps": steps}))
        if key:
            (tmp_path / name / "key.json").write_text("{}")

    ft("ft-QNLI-64-13-causal-aaa", 256)
    ft("ft-QNLI-64-13-causal-bbb", 2048)
    ft("ft-QNLI-64-13-causal-ccc", 2048, key=False)  # unfinished
    ft("ft-QNLI-64-42-causal-ddd", 2048, model=False)  # scores kept, weights not
    assert fit.full_finetunes(tmp_path) == [tmp_path / "ft-QNLI-64-13-causal-bbb" / "run"]
    ft("ft-QNLI-1024-13-causal-eee", 16384)  # the K = 1,024 cell: only with --k 1024
    assert fit.full_finetunes(tmp_path, 1024) == [tmp_path / "ft-QNLI-1024-13-causal-eee" / "run"]
    assert fit.full_finetunes(tmp_path) == [tmp_path / "ft-QNLI-64-13-causal-bbb" / "run"]
    wide, narrow = "regions-QNLI-64-13-learned-" + "a" * 12, "regions-QNLI-64-13-learned-" + "b" * 12  # store names
    for name, sparsity in ((wide, 5e-4), (narrow, 1e-4)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "key.json").write_text(json.dumps({"options": {"sparsity": sparsity}}))
    assert fit.one(tmp_path, "QNLI", 13, "regions") == tmp_path / narrow  # not the 5e-4 run
    assert fit.one(tmp_path, "QNLI", 13, "regions", k=1024) is None
    table = {"fine-tuned": {"accuracy": 0.6}, "paper (learned) 0.0001": {"accuracy": 0.54}}
    rows = fit.budget_rows({"0.0001": 0.72, "0.001": 0.8}, table, ft_fit=0.8)
    assert abs(rows["0.0001"]["fit_share"] - 0.9) < 1e-12 and abs(rows["0.0001"]["test_share"] - 0.9) < 1e-12
    assert abs(rows["0.0001"]["carry"] - 1.0) < 1e-12
    assert rows["0.001"]["fit_share"] == 1.0 and rows["0.001"]["test_share"] is None and rows["0.001"]["carry"] is None
