#!/usr/bin/env bash
# session 32 call 3 (one H200): all --quick cold; fp8 convolutions at batch 32 and 256 beside
# f16 and cuBLASLt's fp8 product; ConvNeXt-T's profile at batch 1 and 32
set -u
bash .device/unpack.sh
S=$OUT/0-summary.txt; mkdir -p $OUT
say() { echo "$*" | tee -a $S; }
T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
OUT=$OUT/quick timeout 120 bash scripts/gpu-timeline.sh quick > /dev/null 2>&1
head -5 $OUT/quick/summary.txt | tee -a $S
export PATH=/opt/torch/.venv/bin:$PATH
W=$(mktemp -d)
(cd scripts && python3 export_torchvision.py "$W" convnext_tiny) 2> $OUT/export.err | cut -c1-160 | tee -a $S
for b in 1 32; do for by in op kernel; do
  t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache timeout 120 .device/gpukit profile infer --onnx $W/convnext_tiny.onnx --batch-size $b \
    --strategy fp16-nhwc-graph --group-by $by --top 25 > $OUT/profile-convnext-b$b-$by.txt 2> $OUT/profile-convnext-b$b-$by.err
  say "profile convnext b$b by $by rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done; done
say "left $(left) s"
env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$(mktemp -d) timeout $(( $(left) - 10 )) .device/tests/gpu_ops --nocapture fp8 > $OUT/fp8.txt 2>&1
say "fp8 rc=$?"
grep -E "^fp8|^test |test result" $OUT/fp8.txt | cut -c1-400 | tee -a $S
say "done, left $(left) s"
