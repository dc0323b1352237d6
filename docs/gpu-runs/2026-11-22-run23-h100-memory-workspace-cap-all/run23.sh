#!/usr/bin/env bash
# Run 23: memory with the workspace cap, pinned host memory, memory in `gpukit all`.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
pack() { cp ~/.cache/gpukit/cudnn-choices-* "$W/" 2>/dev/null; mkdir -p "$OUT"; tar czf "$OUT/run23.tar.gz" -C "$W" .; }
step() { echo "[$((SECONDS-S)) s] $*"; }
$G GPUKIT_REQUIRE_GPU=1 timeout 150 .device/tests/gpu_engine-* --test-threads 1 >"$W/test-gpu_engine.txt" 2>&1; step "gpu_engine rc=$? $(grep '^test result' $W/test-gpu_engine.txt)"
$G timeout 120 $B memory --batch-sizes 16,32,64,128 --find-max-batch --save-json $W/memory-fp32.json >$W/memory-fp32.txt 2>$W/memory-fp32.err; step "memory fp32 rc=$?"
pack
$G timeout 120 $B memory --batch-sizes 16,32,64,128 --max-workspace 0 --save-json $W/memory-fp32-ws0.json >$W/memory-fp32-ws0.txt 2>$W/memory-fp32-ws0.err; step "memory fp32 ws0 rc=$?"
pack
$G timeout 100 $B memory --batch-sizes 128 --max-workspace 16 --save-json $W/memory-fp32-ws16.json >$W/memory-fp32-ws16.txt 2>$W/memory-fp32-ws16.err; step "memory fp32 ws16 rc=$?"
pack
timeout 60 python3 .device/torch_memory.py >$W/torch-memory.json 2>$W/torch-memory.err; step "torch memory rc=$?"
pack
$G timeout $((570-(SECONDS-S))) $B all --quick --out $W/all >$W/all.txt 2>$W/all.err; step "all --quick rc=$?"
ls $W/all; grep -n "GPU memory" $W/all/report.md | head -3
pack
for f in memory-fp32 memory-fp32-ws0 memory-fp32-ws16; do grep -E "^│ (16|32|64|128) " $W/$f.txt | awk -F'┆' '{print "'$f'", $1,$5,$7,$10}'; done
grep -A5 "Host memory" $W/memory-fp32.txt | cut -c1-150
