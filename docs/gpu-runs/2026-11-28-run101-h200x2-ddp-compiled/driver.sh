#!/usr/bin/env bash
set -u
S=$OUT/summary.txt; W=$OUT/w; mkdir -p $W
say() { echo "$*" | tee -a $S; }
export NCCL_NVLS_ENABLE=0 GPUKIT_REQUIRE_GPU=1 PATH=/opt/torch/.venv/bin:$PATH
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ';')"
timeout 120 env -u LD_LIBRARY_PATH .device/tests/gpu_train --test-threads 1 --nocapture data_parallel > $W/dp-test.log 2>&1
say "data-parallel GPU test rc=$?: $(grep -E '^test result' $W/dp-test.log)"
M="--gpus 2 --layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096"
for i in 1 2; do
  timeout 300 env -u LD_LIBRARY_PATH .device/gpukit train $M --compare-pytorch --save-json $W/cmp$i.json > $W/cmp$i.txt 2>&1
  say "train --gpus 2 --compare-pytorch ($i) rc=$?"
  grep -E "Scaling efficiency|Throughput|PyTorch|Step time|Optimizer" $W/cmp$i.txt | cut -c1-260 | tee -a $S
done
