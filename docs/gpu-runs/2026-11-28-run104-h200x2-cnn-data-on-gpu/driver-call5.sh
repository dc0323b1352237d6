#!/usr/bin/env bash
# session 29 call 5: a convolutional network's data set kept on the GPU, each batch gathered there
set -u
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0 GPUKIT_REQUIRE_GPU=1
S=$OUT/summary.txt; W=$OUT/w; mkdir -p $W
say() { echo "$*" | tee -a $S; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ';') $(nproc) cores"
for t in gpu_cnn_modes gpu_cnn_resnet; do
  timeout 240 env -u LD_LIBRARY_PATH .device/tests/$t --test-threads 1 --nocapture > $W/$t.log 2>&1
  say "$t rc=$?: $(grep -E '^test result' $W/$t.log)"; grep -E 'FAILED|panicked|differ' $W/$t.log | head -5 | tee -a $S
done
grep -E "update [0-9]: kept" $W/gpu_cnn_modes.log | head -12 | tee -a $S
C="--model resnet50 --precision bf16 --batch-size 256 --steps 24"
row() { grep -E "Images/s|Batches from|Set-up|Each GPU alone|Data-parallel  |Scaling eff|Peak GPU" $1 | cut -c1-230 | tr -s ' ' | tr '\n' ' '; }
for b in new base; do
  B=.device/gpukit; [ $b = base ] && B=.device/base/gpukit
  timeout 200 env -u LD_LIBRARY_PATH $B train $C --samples 4096 --device cuda:0 --save-json $W/one-fresh-$b.json --save-losses $W/one-fresh-$b.csv > $W/one-fresh-$b.txt 2>&1
  say "one GPU, 4096 images $b rc=$?: $(row $W/one-fresh-$b.txt)"
done
for b in new base; do
  B=.device/gpukit; [ $b = base ] && B=.device/base/gpukit
  timeout 200 env -u LD_LIBRARY_PATH $B train $C --samples 8192 --device cuda:0 --gpus 2 --save-json $W/dp-fresh-$b.json --save-losses $W/dp-fresh-$b.csv > $W/dp-fresh-$b.txt 2>&1
  say "2 GPUs, 8192 images $b rc=$?: $(row $W/dp-fresh-$b.txt)"
done
python3 - $W <<'PY' 2>&1 | tee -a $S
import csv, sys, os
w = sys.argv[1]
def l(n): return [float(r["loss"]) for r in csv.DictReader(open(os.path.join(w, n)))]
for k in ("one-fresh", "dp-fresh"):
    a, b = l(k + "-new.csv"), l(k + "-base.csv")
    print("%s: new vs base losses, %d updates, first %.9f / %.9f, worst relative %.2e" % (k, len(a), a[0], b[0], max(abs(x - y) / abs(y) for x, y in zip(a, b))))
PY
timeout 300 env -u LD_LIBRARY_PATH .device/gpukit train $C --samples 4096 --device cuda:0 --compare-pytorch --save-json $W/one-fresh-cmp.json > $W/one-fresh-cmp.txt 2>&1
say "one GPU, 4096 images, --compare-pytorch rc=$?"
sed -n '/PyTorch beside/,/PyTorch.s fastest/p' $W/one-fresh-cmp.txt | cut -c1-200 | tee -a $S
cd $OUT && tar czf w.tar.gz w && rm -rf w
