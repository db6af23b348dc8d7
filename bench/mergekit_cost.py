"""What `skillgraft merge`'s mergekit comparison costs (issue 82): the four methods at mergekit's defaults merged in one
mergekit process (MergekitWorker), against one merge in a process of its own (the former mergekit-yaml per grid
point), in CPU seconds of the child processes (load-independent) and wall seconds.

    python bench/mergekit_cost.py --base MINILM --finetuned A --finetuned B --work /tmp/mk
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    from skillgraft.merge.mergekit import (MergekitOptions, MergekitWorker, mergekit_configs, mergekit_input,
                                           mergekit_yaml, run_mergekit)
    from skillgraft.models import build_scorer

    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--finetuned", action="append", required=True)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    dirs = []
    for i, path in enumerate([args.base, *args.finetuned]):
        folder = args.work / f"m{i}"
        if not folder.exists():
            mergekit_input(build_scorer(str(path), "SST-2", "classifier"), folder)
        dirs.append(folder)
    configs = mergekit_configs(MergekitOptions())
    c0, t0 = cpu(), time.time()
    worker = MergekitWorker()
    for method, _, params, global_params in configs:
        worker(mergekit_yaml(method, dirs[0], dirs[1:], params, global_params), args.work, 0)
    worker.close()
    c1, t1 = cpu(), time.time()
    method, _, params, global_params = configs[1]
    run_mergekit(mergekit_yaml(method, dirs[0], dirs[1:], params, global_params), args.work, 0)
    c2, t2 = cpu(), time.time()
    print(json.dumps({"merges_in_one_process": len(configs), "cpu_s": round(c1 - c0, 1), "wall_s": round(t1 - t0, 1),
                      "one_merge_own_process_cpu_s": round(c2 - c1, 1), "wall_s_own": round(t2 - t1, 1)}))


if __name__ == "__main__":
    main()
