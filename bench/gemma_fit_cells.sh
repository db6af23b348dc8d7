#!/bin/bash
# Issue 74 (4): paper-schedule cells at the learned localizer's fit default, each cell's three stages one after the
# other, every stage resumable through the store:
#   1. the fp32 fine-tune (bench/gemma_paper_schedule.py --finetune-only: the grid restored from RECORDS, where they
#      hold it; a stored fine-tune is only read);
#   2. its localization in bf16-mixed with the recipe's fit-default settings (bench/fit_schedule.py: --resume, the
#      regions saved; issue 74 (6) found bf16-mixed localization within noise of fp32 and 1.6–1.9× faster here);
#   3. the cell's rows in fp32 (bench/cell_rows.py: learned beside top-|Δ| and random of the same budgets).
#
#   SKILLGRAFT_CACHE=runs/store RECORDS=bench/results/gemma46 nohup setsid nice -n 5 \
#       bench/gemma_fit_cells.sh 64-fit-rest:MRPC:42 64-fit-rest:ag_news:13 >> runs/fit-cells.log 2>&1 &
#
# A cell is RECIPE:TASK:SEED as in bench/gemma_schedule_cells.sh. Each cell writes bench/results/fit_bf16_NAME.json
# and cell_rows_NAME.json (NAME: the task in lower case without '-' or '_', then the seed, e.g. mrpc42), its
# localization state under runs/fit-resume-NAME and its regions under runs/regions-NAME-bf16; a stage whose output
# exists is skipped, so the same command, run again after a stop, goes on where it stopped. One thread per stage
# (THREADS), so two queues share this 2-core machine. FIT_ARGS (e.g. "--pseudo 128") is added to the localization
# and SUFFIX (e.g. -pseudo128) to NAME: a lever tried on a cell whose fine-tune is already stored.
set -u
cd "$(dirname "$0")/.."
: "${SKILLGRAFT_CACHE:?set SKILLGRAFT_CACHE to the store the cells resume from}"
export SKILLGRAFT_CACHE OMP_NUM_THREADS="${THREADS:-1}" MKL_NUM_THREADS="${THREADS:-1}"
PY="${PY:-.venv/bin/python}"
[ $# -gt 0 ] || { echo "usage: $0 RECIPE:TASK:SEED ... (e.g. 64-fit-rest:MRPC:42)" >&2; exit 2; }
for cell in "$@"; do
  IFS=: read -r k task seed <<< "$cell"
  if [ ! -f "bench/fidelity/gemma-schedule-$k.yaml" ] || [ -z "$task" ] || [ -z "$seed" ]; then
    echo "$cell: not RECIPE:TASK:SEED with bench/fidelity/gemma-schedule-$k.yaml present" >&2; exit 2
  fi
done
stamp() { echo "=== $(date -u) $*"; }
for cell in "$@"; do
  IFS=: read -r k task seed <<< "$cell"
  name="$(echo "$task" | tr 'A-Z' 'a-z' | tr -d '_-')$seed${SUFFIX:-}"
  fit="bench/results/fit_bf16_$name.json" rows="bench/results/cell_rows_$name.json" regions="runs/regions-$name-bf16"
  stamp "finetune $cell"
  log="$(mktemp)"
  "$PY" bench/gemma_paper_schedule.py "bench/fidelity/gemma-schedule-$k.yaml" --tasks "$task" --seeds "$seed" \
    --out runs/g46 --progress --finetune-only ${RECORDS:+--restore "$RECORDS"} 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  run="$(grep -o 'full fine-tuning [0-9]* s → .*' "$log" | tail -1 | sed 's/.* → //')"
  rm -f "$log"
  [ -n "${RECORDS:-}" ] && "$PY" bench/gemma_records.py --store "$SKILLGRAFT_CACHE" --to "$RECORDS"
  if [ "$rc" -ne 0 ] || [ ! -d "$run" ]; then stamp "finetune $cell exit $rc, no run folder"; exit "$((rc ? rc : 1))"; fi
  if [ ! -f "$fit" ]; then
    stamp "localize $cell (bf16-mixed) → $fit"
    # shellcheck disable=SC2086  # FIT_ARGS is a list of options
    "$PY" bench/fit_schedule.py --run "$run" --budgets 1e-4,5e-4,1e-3 --test-limit 1000 --precision bf16-mixed \
      --resume "runs/fit-resume-$name" --setting '{"micro_batch": 16}' --progress --save-regions "$regions" \
      ${FIT_ARGS:-} --out "$fit.part"
    rc=$?
    [ "$rc" -eq 0 ] && mv "$fit.part" "$fit"
    stamp "localize $cell exit $rc"
    [ "$rc" -eq 0 ] || exit "$rc"  # a signal's stop: the state is saved; the same command resumes
  fi
  if [ ! -f "$rows" ]; then
    stamp "rows $cell (fp32) → $rows"
    "$PY" bench/cell_rows.py "$run" "$regions/0" --test-limit 1000 --out "$rows"
    rc=$?
    stamp "rows $cell exit $rc"
    [ "$rc" -eq 0 ] || exit "$rc"
  fi
done
