#!/usr/bin/env bash
# Issue 36: `make test` from a fresh clone, N times in a row, as CI runs it (.ci/run: 2 workers, ../shared beside
# the clone). Each run clones HEAD of this repository into a new folder beside ../shared (so `../shared` resolves),
# builds its .venv from nothing and runs the suite; one line per run (exit code, pass/fail counts, seconds) goes to
# stdout and, with the run's tail, to bench/results/suite_determinism/run-<i>.log.
#
#     bash bench/suite_determinism.sh [N=5] [FIRST=1]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-5}
FIRST=${2:-1}  # number of the first run (to add runs to an earlier series)
OUT="$ROOT/bench/results/suite_determinism"
PARENT=$(dirname "$ROOT")
REV=$(git -C "$ROOT" rev-parse --short HEAD)
mkdir -p "$OUT"
for i in $(seq "$FIRST" $((FIRST + N - 1))); do
  dir="$PARENT/.fresh-clone-$i-$$"
  git clone -q "$ROOT" "$dir"
  start=$(date +%s)
  (cd "$dir" && ./.ci/run) > "$OUT/run-$i.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  summary=$(grep -E "[0-9]+ (passed|failed)" "$OUT/run-$i.log" | tail -1)
  echo "run $i at $REV: exit $rc, ${secs} s (setup + suite): $summary" | tee -a "$OUT/summary.txt"
  rm -rf "$dir"
done
