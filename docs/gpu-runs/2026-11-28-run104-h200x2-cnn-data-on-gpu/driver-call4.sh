#!/usr/bin/env bash
# session 29 call 4: ResNet-50 training on fresh batches (a data set of many batches): batches
# gathered one step ahead on a thread of their own, on every core (new) against base
set -u
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0 GPUKIT_REQUIRE_GPU=1
S=$OUT/summary.txt; W=$OUT/w; mkdir -p $W
say() { echo "$*" | tee -a $S; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ';') $(nproc) cores"
C="--model resnet50 --precision bf16 --batch-size 256 --steps 24"
row() { grep -E "Images/s|Each GPU alone|Data-parallel  |Scaling eff|PyTorch|compile|eager|graph" $1 | cut -c1-200 | tr -s ' ' | tr '\n' ' '; }
for b in new base; do
  B=.device/gpukit; [ $b = base ] && B=.device/base/gpukit
  timeout 200 env -u LD_LIBRARY_PATH $B train $C --samples 4096 --device cuda:0 --save-json $W/one-fresh-$b.json > $W/one-fresh-$b.txt 2>&1
  say "one GPU, 4096 images $b rc=$?: $(row $W/one-fresh-$b.txt)"
done
for b in new base; do
  B=.device/gpukit; [ $b = base ] && B=.device/base/gpukit
  timeout 200 env -u LD_LIBRARY_PATH $B train $C --samples 8192 --device cuda:0 --gpus 2 --save-json $W/dp-fresh-$b.json > $W/dp-fresh-$b.txt 2>&1
  say "2 GPUs, 8192 images $b rc=$?: $(row $W/dp-fresh-$b.txt)"
done
timeout 300 env -u LD_LIBRARY_PATH .device/gpukit train $C --samples 4096 --device cuda:0 --compare-pytorch --save-json $W/one-fresh-cmp.json > $W/one-fresh-cmp.txt 2>&1
say "one GPU, 4096 images, --compare-pytorch rc=$?"
sed -n '/PyTorch/,$p' $W/one-fresh-cmp.txt | cut -c1-220 | head -30 | tee -a $S
cd $OUT && tar czf w.tar.gz w && rm -rf w
