"""Readable tables at 80 columns (issue 37): ``inspect``'s region table and report.md (no Python dicts)."""

import io

from rich.console import Console

from skillgraft.cli import region_table
from skillgraft.verbs.graft import best_steps, report_markdown

TYPES = ["attn.key", "attn.key (bias)", "attn.output", "attn.output (bias)", "attn.query", "attn.query (bias)",
         "attn.value", "attn.value (bias)", "ffn.intermediate", "ffn.intermediate (bias)", "ffn.output",
         "ffn.output (bias)", "layernorm"]


def rendered(dist, width):
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False)
    for item in region_table(dist, width):
        console.print(item)
    return buf.getvalue()


def test_region_table_fits_80_columns_with_whole_headers():
    table = {f"layer {i}": {t: 1234 * (i + 1) for t in TYPES} for i in range(12)}  # a 5e-3 graft of a 12-layer BERT
    text = rendered({"module_types": TYPES, "table": table}, 80)
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    header = next(line for line in text.splitlines() if line.startswith("layer "))
    assert header.split() == ["layer", "a.key", "a.out", "a.query", "a.value", "f.in", "f.out", "norm", "bias",
                              "total"]
    assert "layer 11" in text and f"{sum(1234 * 12 for _ in TYPES):,}" in text
    narrow = rendered({"module_types": TYPES, "table": table}, 50)  # too narrow for the table: one line per layer
    assert "…" not in narrow and "layer 11: " in narrow and "a.query 14,808" in narrow


def test_report_has_no_python_dicts():
    assert best_steps({"0.0001": 40, "0.001": 60}) == "40 (budget 0.0001), 60 (budget 0.001)"
    metrics = {"task": "SST-2", "k": 16, "seed": 13, "test_n": 8, "graftable_parameters": 100,
               "total_parameters": 120, "carried_parameters": 20, "localizer": "learned",
               "localization": {"config": {"steps": 10, "lr": 1e7, "sparsity": 1e-4}, "base_size": 3,
                                "step_seconds": 0.5, "best_step": {"0.01": 4, "round": 7}},
               "rows": [{"model": "graft 0.01", "kind": "graft", "params": 1, "density": 0.01, "score": 0.5,
                         "ece": 0.1}]}
    text = report_markdown(metrics)
    assert "best step 4 (budget 0.01), 7 (budget round)" in text and "{'" not in text and "lr 1e+07" in text
