#!/usr/bin/env bash
# session 30 call 5 (two GPUs): data-parallel MLP beside PyTorch DDP, DDP + ZeroRedundancyOptimizer
# and compiled DDP, now with each side's peak memory a GPU; then two more runs for the spread
set -u
gunzip -f .device/gpukit.gz; chmod +x .device/gpukit
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0 GPUKIT_REQUIRE_GPU=1
S=$OUT/summary.txt; W=$OUT/w; mkdir -p $W
say() { echo "$*" | tee -a $S; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ';')"
nvidia-smi topo -m | head -3 | tee -a $S
M="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096 --device cuda:0 --gpus 2"
t=$(date +%s)
timeout 400 env -u LD_LIBRARY_PATH .device/gpukit train $M --compare-pytorch --save-json $W/dp-compare.json > $W/dp-compare.txt 2> $W/dp-compare.err
say "mlp --gpus 2 --compare-pytorch rc=$? $(( $(date +%s) - t ))s"
grep -E "Step time|Throughput|Scaling efficiency|PyTorch|Peak memory|memory pool peak|weights  |optimizer state" $W/dp-compare.txt | cut -c1-330 | tee -a $S
tail -3 $W/dp-compare.err | cut -c1-200 | tee -a $S
for r in 2 3; do
  timeout 150 env -u LD_LIBRARY_PATH .device/gpukit train $M --save-json $W/dp-$r.json > $W/dp-$r.txt 2>&1
  say "mlp --gpus 2 run $r rc=$?: $(grep -E 'Step time|Scaling efficiency' $W/dp-$r.txt | cut -c1-200 | tr '\n' ' ')"
done
cd $OUT && tar czf w.tar.gz w && rm -rf w
