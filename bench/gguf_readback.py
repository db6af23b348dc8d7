"""Read back the GGUF files ``bench/gguf_export.py --keep DIR`` left, with gguf-py (issue 80): per file,
how much of the graft survives — counted on the tensors themselves and on the task's label log-probabilities.

    python bench/gguf_readback.py --graft GRAFT --base BASE.gguf --keep DIR [--json OUT.json]

Tensors (GGUF layout; Gemma's norms stored as 1 + w): ``exact`` grafted coordinates read back bit for bit;
``change_kept`` 1 − ‖file − graft‖ / ‖graft − base‖ over the grafted coordinates; ``share_kept`` the mean over
them of each one's share of its own change (clipped to [0, 1]); ``collateral`` ‖file − base‖ over the untouched
coordinates on the same scale. Log-probabilities (the ``.npy`` the bench saved beside each file, and its
``skillgraft-logp.npz``): ``effect_kept`` 1 − mean |lp_file − lp_graft| / mean |lp_pre − lp_graft|, agreement
with the graft's predictions, accuracy is the bench's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graft", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--keep", required=True)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import gguf

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from skillgraft.graft import Graft  # the graft file only; the GGUF files are read with gguf-py alone

    def tensors(path):
        return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}

    graft = Graft.from_pretrained(args.graft)
    base = tensors(args.base)
    keep = Path(args.keep)
    lp = np.load(keep / "skillgraft-logp.npz")
    pre_lp, graft_lp = lp["pre"], lp["graft"]
    rows = []
    for summary in sorted(keep.glob("grafted-*.json")):
        s = json.loads(summary.read_text())
        ours = tensors(summary.with_suffix(".gguf"))
        exact = total = 0
        miss2 = change2 = coll2 = share = 0.0
        for g, w in s["written"].items():
            p = w["parameter"]
            idx = graft.region.indices[p].numpy()
            val = graft.values[p].float().numpy()
            want = (val + np.float32(1)).astype(np.float32) if "norm.weight" in g else val
            got = gguf.quants.dequantize(ours[g].data, ours[g].tensor_type).reshape(-1)
            was = gguf.quants.dequantize(base[g].data, base[g].tensor_type).reshape(-1)
            idx = idx.astype(np.int64)
            other = np.ones(got.size, dtype=bool)
            other[idx] = False
            d = np.abs(want - was[idx]).astype(np.float64)
            m = np.abs(got[idx] - want).astype(np.float64)
            exact += int((got[idx] == want).sum())
            total += idx.size
            miss2 += float(m @ m)
            change2 += float(d @ d)
            coll2 += float(np.sum((got[other] - was[other]).astype(np.float64) ** 2))
            with np.errstate(divide="ignore", invalid="ignore"):
                share += float(np.where(d > 0, np.clip(1 - m / d, 0, 1), (m == 0)).sum())
        file_lp = np.load(summary.with_suffix(".npy"))
        effect = 1 - np.abs(file_lp - graft_lp).mean() / np.abs(pre_lp - graft_lp).mean()
        rows.append({"gguf_type": s["gguf_type"], "MiB": s["bytes"] / 2**20, "x_base": s["bytes"] / s["base_bytes"],
                     "exact": exact, "coordinates": total, "change_kept": 1 - (miss2 / change2) ** 0.5,
                     "share_kept": share / total, "collateral": (coll2 / change2) ** 0.5,
                     "effect_kept": float(effect),
                     "agreement_with_graft": float((file_lp.argmax(1) == graft_lp.argmax(1)).mean()),
                     "max_abs_logprob_diff_vs_graft": float(np.abs(file_lp - graft_lp).max())})
        print(json.dumps(rows[-1]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
