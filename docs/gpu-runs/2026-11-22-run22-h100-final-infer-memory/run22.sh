#!/usr/bin/env bash
# Run 22: final engine (projection late + barrier, in place checked, per-session workspace,
# NCHW fallback engines) beside PyTorch; memory fp16 and PyTorch's memory figures.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
pack() { cp ~/.cache/gpukit/cudnn-choices-* "$W/" 2>/dev/null; mkdir -p "$OUT"; tar czf "$OUT/run22.tar.gz" -C "$W" .; }
step() { echo "[$((SECONDS-S)) s] $*"; }
$G timeout 430 $B infer --device cuda:0 --batch-sizes 1,8,32,256 --compare-pytorch --save-json $W/infer.json >$W/infer.txt 2>$W/infer.err
step "infer rc=$? FAILED rows: $(grep -c FAILED $W/infer.txt)"
pack
grep -E "best fp16|0\.[0-9]+x +│" $W/infer.txt | cut -c1-200
R=$((560-(SECONDS-S)))
if [ $R -gt 50 ]; then $G timeout $R $B memory --batch-sizes 16,32,64,128 --precision fp16 --layout nhwc --save-json $W/memory-fp16.json >$W/memory-fp16.txt 2>$W/memory-fp16.err; step "memory fp16 rc=$?"; fi
pack
R=$((585-(SECONDS-S)))
if [ $R -gt 20 ]; then timeout $R python3 .device/torch_memory.py >$W/torch-memory.json 2>$W/torch-memory.err; step "torch memory rc=$?"; fi
pack
