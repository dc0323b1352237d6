#!/usr/bin/env bash
# session 29 call 2: the three branches merged (cnn-launch, cnn-dp-accumulate, mlp-input-grad)
set -u
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0 GPUKIT_REQUIRE_GPU=1
S=$OUT/summary.txt; W=$OUT/w; mkdir -p $W
say() { echo "$*" | tee -a $S; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ';')"
timeout 300 env -u LD_LIBRARY_PATH GPUKIT_TRACE=1 .device/tests/gpu_train --test-threads 1 > $W/gpu_train.log 2>&1
say "gpu_train rc=$?: $(grep -E '^test result' $W/gpu_train.log)"; grep -E 'FAILED|panicked' $W/gpu_train.log | head -5 | tee -a $S
OUT=$OUT/acc timeout 200 bash scripts/gpu-multi.sh cnn-accumulate > /dev/null 2>&1; grep -v '^GPU\|^ *GPU\|Legend\|^ *X\|SYS\|NODE\|PHB\|PXB\|PIX\|NV#\|^$' $OUT/acc/summary.txt | tail -14 | tee -a $S
# MLP one GPU: base (main) and new (input gradients timed), A B B A
M="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096 --device cuda:0"
for b in new base base new; do
  B=.device/gpukit; [ $b = base ] && B=.device/base/gpukit
  timeout 120 env -u LD_LIBRARY_PATH GPUKIT_TRACE=1 $B train $M --save-json $W/mlp-$b.json > $W/mlp-$b.txt 2> $W/mlp-$b.err
  say "mlp one GPU $b rc=$?: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["result"]; print("samples/s by epoch", [round(e["samples_per_s"]) for e in r["epochs"]])' $W/mlp-$b.json 2>&1) $(grep -E 'Epilogues' $W/mlp-$b.txt | cut -c1-400)"
done
grep -iE "input grad|epilogues Fusion" $W/mlp-new.err $W/gpu_train.log | head -12 | tee -a $S
for b in new base base new; do
  B=.device/gpukit; [ $b = base ] && B=.device/base/gpukit
  timeout 150 env -u LD_LIBRARY_PATH $B train ${M/--device cuda:0/--device cuda:0 --gpus 2} --save-json $W/dp-$b.json > $W/dp-$b.txt 2> $W/dp-$b.err
  say "mlp --gpus 2 $b rc=$?: $(grep -E 'Step time|Scaling efficiency|Throughput' $W/dp-$b.txt | cut -c1-180 | tr '\n' ' ')"
done
OUT=$OUT/cnn timeout 400 bash scripts/gpu-multi.sh cnn > /dev/null 2>&1; tail -8 $OUT/cnn/summary.txt | tee -a $S
cd $OUT && tar czf w.tar.gz w && rm -rf w
