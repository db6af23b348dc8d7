"""A real graft on a GGUF base exported as GGUF (issue 51): the precision rule measured.

Usage (after `make gemma`; llama.cpp figures need llama-cpp-python, `make test-gguf` installs it):

    SKILLGRAFT_CACHE=runs/cache OMP_NUM_THREADS=1 .venv/bin/python bench/gguf_export.py \
        --graft runs/gemma-graft/grafts/budget-0.001 --k 16 --seed 13 --test-limit 200 \
        --types exact,BF16,F16,Q8_0,Q4_0 --out bench/results/gguf_export

For each ``--gguf-type`` the graft is exported (`export_graft(..., ExportSpec(to="gguf", gguf_type=T))`, the
CLI's code path), the file is read back by transformers' own GGUF loader into a Scorer, and its label
log-probabilities on the task's test rows (the graft report's seeded sample) are compared with the graft applied in
skillgraft; with llama_cpp importable, llama.cpp scores the same token ids from the same file. The base file itself
is scored the same way (the pre-trained row, and llama.cpp's own numerical distance from transformers on an
unchanged file). Writes ``<out>/gguf_export.json`` and prints a markdown table; each file is deleted after it is
scored unless ``--keep DIR`` (then it is moved there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))  # llamacpp.py: llama.cpp's label log-probabilities


def _read_into(reader, path: Path) -> None:
    """The weights transformers' GGUF loader reads from ``path``, loaded into the Scorer ``reader``."""
    import torch
    import transformers

    from skillgraft.lazy import quiet_transformers

    hf_logging, level = quiet_transformers()
    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(level)
    missing, unexpected = reader.model.load_state_dict(hf.state_dict(), strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    del hf


def _row(name, lp, labels, reference=None, graft_lp=None):
    import numpy as np

    pred = lp.argmax(1)
    row = {"model": name, "accuracy": float((pred == labels).mean())}
    if graft_lp is not None:
        row["agreement_with_graft"] = float((pred == graft_lp.argmax(1)).mean())
        row["max_abs_logprob_diff_vs_graft"] = float(np.abs(lp - graft_lp).max())
    if reference is not None:
        row["max_abs_logprob_diff_vs_transformers"] = float(np.abs(lp - reference).max())
        row["agreement_with_transformers"] = float((pred == reference.argmax(1)).mean())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graft", required=True)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--test-limit", type=int, default=200)
    ap.add_argument("--types", default="exact,BF16,F16,Q8_0,Q4_0")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default=str(HERE / "results" / "gguf_export"))
    ap.add_argument("--keep", default=None, help="move the exported files (and their summaries) here instead of "
                                                 "deleting them; a later run given the same --keep reuses them")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp even when llama_cpp imports")
    args = ap.parse_args()

    import numpy as np
    import torch

    from llamacpp import llama_logprobs, scorer_logprobs
    from skillgraft.data.sampling import load_kshot
    from skillgraft.export import ExportSpec, export_graft
    from skillgraft.export.gguf import base_gguf_file
    from skillgraft.graft import Graft
    from skillgraft.models import build_scorer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    llama = not args.no_llama
    if llama:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            llama = False
            print("llama_cpp not importable: transformers rows only", file=sys.stderr)
    graft = Graft.from_pretrained(args.graft)
    task = graft.metadata.task
    pre = build_scorer(graft.base_model, task, graft.metadata.mode or "causal")
    reader = build_scorer(graft.base_model, task, graft.metadata.mode or "causal")
    examples = load_kshot(task, args.k, args.seed, args.data_dir, test_limit=args.test_limit).test
    labels = np.array([ex.label for ex in examples])
    t0 = time.perf_counter()
    saved = Path(args.keep) / "skillgraft-logp.npz" if args.keep else None
    if saved is not None and saved.is_file():  # a later run (llama.cpp rows): the same rows, scored before
        pre_lp, graft_lp = np.load(saved)["pre"], np.load(saved)["graft"]
    else:
        pre_lp = scorer_logprobs(pre, examples)
        with graft.applied(pre):
            graft_lp = scorer_logprobs(pre, examples)
        if saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            np.savez(saved, pre=pre_lp, graft=graft_lp)
    print(f"skillgraft: pre {np.mean(pre_lp.argmax(1) == labels):.4f} graft {np.mean(graft_lp.argmax(1) == labels):.4f}"
          f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    rows = [{**_row("pre-trained (skillgraft)", pre_lp, labels), "where": "skillgraft"},
            {**_row("graft (skillgraft)", graft_lp, labels, graft_lp=graft_lp), "where": "skillgraft"}]
    with base_gguf_file(graft.base_model) as base_file:
        base_bytes = base_file.stat().st_size
        if llama:
            t = time.perf_counter()
            lp = llama_logprobs(base_file, pre, examples)
            rows.append({**_row("base file (llama.cpp)", lp, labels, reference=pre_lp), "where": "llama.cpp",
                         "bytes": base_bytes, "seconds": time.perf_counter() - t})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gguf-export-", dir=out))
    try:
        for kind in args.types.split(","):
            file = work / f"grafted-{kind}.gguf"
            kept = Path(args.keep) / file.name if args.keep else None
            if kept is not None and kept.is_file() and kept.with_suffix(".json").is_file():
                file, s = kept, json.loads(kept.with_suffix(".json").read_text())
                seconds = s["export_seconds"]
            else:
                t = time.perf_counter()
                s = export_graft(graft, file, ExportSpec(to="gguf", gguf_type=kind), base=pre)
                seconds = s["export_seconds"] = time.perf_counter() - t
            kinds: dict[str, int] = {}
            for w in s["written"].values():
                key = f"{w['from']}→{w['to']}"
                kinds[key] = kinds.get(key, 0) + 1
            meta = {"gguf_type": kind, "bytes": s["bytes"], "size_ratio": s["size_ratio"], "kept": s["kept"],
                    "change_kept": s.get("change_kept"), "share_kept": s.get("share_kept"),
                    "collateral": s.get("collateral"),
                    "coordinates": s["coordinates"], "touched": s["touched"], "tensors": s["tensors"],
                    "types": kinds, "export_seconds": seconds}
            logp = kept.with_suffix(".npy") if kept is not None else None
            if logp is not None and logp.is_file():
                tf_lp = np.load(logp)
            else:
                _read_into(reader, file)
                tf_lp = scorer_logprobs(reader, examples)
                if logp is not None:
                    logp.parent.mkdir(parents=True, exist_ok=True)
                    np.save(logp, tf_lp)
            rows.append({**_row(f"grafted file {kind} (transformers)", tf_lp, labels, graft_lp=graft_lp),
                         "where": "transformers", **meta})
            if llama:
                t = time.perf_counter()
                lp = llama_logprobs(file, reader, examples)
                rows.append({**_row(f"grafted file {kind} (llama.cpp)", lp, labels, reference=tf_lp,
                                    graft_lp=graft_lp), "where": "llama.cpp", **meta,
                             "seconds": time.perf_counter() - t})
            print(json.dumps(rows[-1]), file=sys.stderr)
            if kept is not None and file != kept:
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(file), kept)
                kept.with_suffix(".json").write_text(json.dumps(s, indent=2))
            elif kept is None:
                file.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"graft": str(args.graft), "base_model": graft.base_model, "base_bytes": base_bytes, "task": task,
           "k": args.k, "seed": args.seed, "test_rows": len(examples), "graft_size": graft.size,
           "graft_density": graft.region.density, "threads": torch.get_num_threads(), "rows": rows}
    (out / "gguf_export.json").write_text(json.dumps(doc, indent=2) + "\n")
    print("| model | touched tensors written as | grafted coordinates kept | file | × base | accuracy | "
          "agreement with the graft | max abs Δ log p vs graft | vs transformers (same file) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        types = ", ".join(f"{k} ×{n}" for k, n in r.get("types", {}).items()) or "–"
        kept = f"{r['kept']:,} / {r['coordinates']:,}" if "kept" in r else "–"
        size = f"{r['bytes'] / 2**20:.1f} MiB" if "bytes" in r else "–"
        ratio = f"{r['size_ratio']:.2f}" if "size_ratio" in r else "–"

        def f(key, fmt="{:.4f}"):
            return fmt.format(r[key]) if key in r else "–"
        print(f"| {r['model']} | {types} | {kept} | {size} | {ratio} | {f('accuracy')} | "
              f"{f('agreement_with_graft')} | {f('max_abs_logprob_diff_vs_graft', '{:.2e}')} | "
              f"{f('max_abs_logprob_diff_vs_transformers', '{:.2e}')} |")


if __name__ == "__main__":
    main()
