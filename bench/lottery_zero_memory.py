"""Resident memory of two lean-pair mechanisms, measured in fresh processes (moved here from the unit tests,
where a peak-RSS threshold failed under two pytest workers: the allocator reuses pages already resident).

Usage: .venv/bin/python bench/lottery_zero_memory.py [--reps 5]

* ``lottery-zero``: applying a graft with zeros outside γ to a 64 MiB body (16 linear maps of 1M fp32 values),
  with θ_pre's values kept in memory (the old whole-body backup) vs restored from θ_pre's safetensors files.
  Reported: the peak RSS above the process's baseline while the graft is applied (VmHWM, reset through
  /proc/self/clear_refs), ÷ the body's bytes.
* ``heap``: three 24 MiB tensors written and freed, with glibc's dynamic mmap threshold (default) vs the
  threshold fixed by ``skillgraft.heap.return_large_blocks`` (what ``skillgraft graft`` sets): RSS left above
  the baseline after the frees.

Each measurement runs in a process of its own, ``--reps`` times; writes bench/results/lottery_zero_memory.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

LOTTERY = r"""
import gc, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import torch
from safetensors.torch import save_file
from skillgraft.graft import Graft, Region

def rss(field):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(field + ":"))

class Body(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(16)])
    def forward(self, x):
        return self.model(x)

torch.manual_seed(0)
body = Body().eval()
tmp = Path(tempfile.mkdtemp())
save_file({k: v.contiguous() for k, v in body.model.state_dict().items()}, tmp / "model.safetensors")
shapes = {n: tuple(p.shape) for n, p in body.named_parameters()}
gen = torch.Generator().manual_seed(1)
region = Region(shapes, {n: torch.randperm(1 << 20, generator=gen)[:1000] for n in list(shapes)[::3]})
graft = Graft(region, {n: torch.randn(len(i), generator=gen) for n, i in region.indices.items()})
gc.collect()
open("/proc/self/clear_refs", "w").write("5")
base = rss("VmRSS")
with graft.applied(body, outside="zero", force=True, pre_files=tmp if sys.argv[1] == "files" else None):
    peak = rss("VmHWM") - base
print(peak / (16 << 22))
"""

HEAP = r"""
import sys
sys.path.insert(0, sys.argv[2])
import torch
from skillgraft.heap import return_large_blocks
rss = lambda: next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")) * 1024
if sys.argv[1] == "fixed":
    return_large_blocks()
base = rss()
for _ in range(3):
    t = torch.ones(6 << 20)
    del t
print((rss() - base) / 2**20)
"""


def measure(code: str, how: str) -> float:
    out = subprocess.run([sys.executable, "-c", code, how, str(HERE.parent / "src")], capture_output=True,
                         text=True, check=True).stdout
    return float(out.split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "lottery_zero_memory.json"))
    args = ap.parse_args()
    results = {"command": " ".join(["bench/lottery_zero_memory.py", *sys.argv[1:]])}
    for name, code, ways, unit in (("lottery-zero", LOTTERY, ("memory", "files"), "peak ÷ body bytes"),
                                   ("heap", HEAP, ("default", "fixed"), "MiB resident after frees")):
        results[name] = {"unit": unit}
        for how in ways:
            runs = [measure(code, how) for _ in range(args.reps)]
            results[name][how] = {"median": statistics.median(runs), "min": min(runs), "max": max(runs)}
            print(f"{name:13s} {how:8s} median {statistics.median(runs):7.3f}  "
                  f"[{min(runs):.3f}, {max(runs):.3f}]  ({unit})", flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
