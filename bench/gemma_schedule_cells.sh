#!/bin/bash
# Issue 46: a queue of paper-schedule cells, run one after the other by bench/gemma_paper_schedule.py — each cell's
# fine-tuning pass (dev grid, full schedule, zero-shot), then its grafts pass (localization, rows, OOD rows).
#
#   SKILLGRAFT_CACHE=STORE nohup setsid bench/gemma_schedule_cells.sh 64:SST-2:13 64-rest:QNLI:13 1024:SST-2:13 \
#       >> runs/cells.log 2>&1 &
#
# A cell is RECIPE:TASK:SEED, RECIPE the suffix of bench/fidelity/gemma-schedule-RECIPE.yaml (64, 64-rest, 1024).
# Every stage is a store entry and the long loops save their state every 3 minutes, so the same command, run again
# after a stop (a session's end, SIGTERM), goes on where it stopped; a finished cell's passes only read the store.
# One thread per queue (OMP_NUM_THREADS=1): two queues share this 2-core machine without their OpenMP threads
# waiting on each other. The log gets a line per stage and one every 5 minutes of a long one (`--progress` into a
# file); `--status` (see bench/RESULTS.md) reads where each cell stands without training.
# Environment: SKILLGRAFT_CACHE (the store; required), SKILLGRAFT_DATA (the data root), PY (default: .venv/bin/python
# of this checkout), OUT (the per-cell run folders; default runs/g46), RECORDS (if set: after each pass, the store's
# scores are copied there by bench/gemma_records.py — commit that folder: a new machine starts with an empty store,
# and each fine-tuning pass first restores from it what it holds whole: the grid's screened points, the zero-shot scores),
# PRECISION (if set, e.g. bf16-mixed: every stage of every cell runs in it, laid over the recipe's `precision`; its
# store entries are apart from fp32's — issue 74 (6) found bf16-mixed within noise of fp32 on QNLI/13, RESULTS).
set -u
cd "$(dirname "$0")/.."
: "${SKILLGRAFT_CACHE:?set SKILLGRAFT_CACHE to the store the cells resume from}"
export SKILLGRAFT_CACHE OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
PY="${PY:-.venv/bin/python}"
OUT="${OUT:-runs/g46}"
[ $# -gt 0 ] || { echo "usage: $0 RECIPE:TASK:SEED ... (e.g. 64:SST-2:13 1024:SST-2:13)" >&2; exit 2; }
for cell in "$@"; do
  IFS=: read -r k task seed <<< "$cell"
  recipe="bench/fidelity/gemma-schedule-$k.yaml"
  if [ ! -f "$recipe" ] || [ -z "$task" ] || [ -z "$seed" ]; then
    echo "$cell: not RECIPE:TASK:SEED with $recipe present" >&2; exit 2
  fi
done
for cell in "$@"; do
  IFS=: read -r k task seed <<< "$cell"
  for pass in finetune grafts; do
    extra=(); [ "$pass" = finetune ] && extra=(--finetune-only)
    [ -n "${PRECISION:-}" ] && extra+=(--override "{\"precision\": \"$PRECISION\"}")
    # a new machine's empty store gets back what the records hold whole (grid screens, zero-shot scores)
    [ "$pass" = finetune ] && [ -n "${RECORDS:-}" ] && extra+=(--restore "$RECORDS")
    echo "=== $(date -u) $pass K=$k $task seed $seed"
    "$PY" bench/gemma_paper_schedule.py "bench/fidelity/gemma-schedule-$k.yaml" --tasks "$task" --seeds "$seed" \
      --out "$OUT" --progress "${extra[@]}"
    rc=$?
    echo "=== $(date -u) $pass K=$k $task seed $seed exit $rc"
    if [ -n "${RECORDS:-}" ]; then "$PY" bench/gemma_records.py --store "$SKILLGRAFT_CACHE" --to "$RECORDS"; fi
    if [ $rc -ge 128 ]; then exit $rc; fi  # stopped by a signal: the queue stops too (rerun it to resume)
  done
done
