#!/usr/bin/env bash
# Run 28: bench matmul with PyTorch taking turns on every row (ABBA blocks), tiled CPU matmul,
# and bench bandwidth beside PyTorch (device->device rows that fit in L2 marked).
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
t() { echo "[$((SECONDS-S)) s] $*"; }
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 200 >$W/smi.csv 2>&1 &
SMI=$!
$G timeout 200 $B bench matmul --device cuda:0 --sizes 4096,8192 --compare-pytorch --save-json $W/mm-gpu.json >$W/mm-gpu.txt 2>$W/mm-gpu.err
t "gpu matmul rc=$?"
GPUKIT_MM_TRIAL=5,10,3 $G timeout 200 $B bench matmul --device cuda:0 --sizes 8192 --dtype f16,bf16 --lt-candidates 16 --compare-pytorch --save-json $W/mm-gpu-trial.json >$W/mm-gpu-trial.txt 2>$W/mm-gpu-trial.err
t "gpu matmul long trial rc=$?"
$G timeout 200 $B bench matmul --device cuda:0 --sizes 8192 --dtype f16,bf16 --iterations 200 --compare-pytorch --save-json $W/mm-gpu-200.json >$W/mm-gpu-200.txt 2>$W/mm-gpu-200.err
t "gpu matmul 200 rc=$?"
$G timeout 200 $B bench bandwidth --compare-pytorch --save-json $W/bw.json >$W/bw.txt 2>$W/bw.err
t "bandwidth rc=$?"
kill $SMI
$G timeout 300 $B bench matmul --device cpu --sizes 2048,4096,8192 --dtype f32,f64,f16 --compare-pytorch --save-json $W/mm-cpu.json >$W/mm-cpu.txt 2>$W/mm-cpu.err
t "cpu matmul rc=$?"
GPUKIT_PIN_THREADS=1 $G timeout 200 $B bench matmul --device cpu --sizes 4096 --dtype f32 --compare-pytorch --save-json $W/mm-cpu-pin.json >$W/mm-cpu-pin.txt 2>$W/mm-cpu-pin.err
t "cpu matmul pinned rc=$?"
mkdir -p "$OUT"; tar czf "$OUT/run28.tar.gz" -C "$W" .
for f in mm-gpu mm-gpu-trial mm-gpu-200 mm-cpu mm-cpu-pin; do
  echo "== $f"; grep -E "^│ (cuda|cpu)" $W/$f.txt | awk -F'│|┆' '{print $2,$3,$4,$5,$6,$9,$(NF-3),$(NF-2),$(NF-1)}' | sed 's/  */ /g'
  tail -3 $W/$f.txt | grep -v "^└"; tail -2 $W/$f.err
done
echo "== bw"; grep -E "^│" $W/bw.txt | sed 's/  */ /g' | cut -c1-220; tail -4 $W/bw.txt
