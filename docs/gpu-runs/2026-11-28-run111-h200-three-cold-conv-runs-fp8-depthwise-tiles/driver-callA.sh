#!/usr/bin/env bash
# session 32 call 1 (one H200): next (main + confirm-long + fp8-conv): the fp8 GPU tests, then
# two cold bench conv runs beside PyTorch (traced). .device/unpack.sh gunzips the staged binaries.
set -u
bash .device/unpack.sh
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
export PATH=/opt/torch/.venv/bin:$PATH
env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$(mktemp -d) timeout 100 .device/tests/gpu_ops --include-ignored --nocapture fp8 > $OUT/fp8.txt 2>&1
echo "fp8 rc=$? $(( $(date +%s)-t0 )) s" | tee -a $OUT/fp8.txt
tail -40 $OUT/fp8.txt
GPUKIT_TRACE=1 bash scripts/gpu-conv-cold.sh 2
echo "total $(( $(date +%s)-t0 )) s"
