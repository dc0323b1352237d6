#!/usr/bin/env bash
# The seven calls of run 112 (session 33), each run on the lent H200 from the repository root
# with binaries staged under .device/ (gzipped, carried): `bash drivers.sh A` ... `G`. Staging:
# .device/gpukit (the branch measured), .device/base/gpukit (main at the time), .device/alt/*
# (call D), .device/tests/{gpu_program,gpu_engine}.
set -u
CALL=${1:?A..G}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
tests() { # test-binary... (GPU tests, each on a fresh kernel cache)
  for t in "$@"; do
    timeout 170 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) .device/tests/$t --test-threads 1 --nocapture > "$OUT/t/$t.log" 2>&1
    say "$t rc=$?: $(grep -E '^test result' "$OUT/t/$t.log")"; grep -E "FAILED|panicked|^dw timing" "$OUT/t/$t.log" | head -20 | tee -a "$S"
  done
}
case $CALL in
  # A: tile-loads + gemm-timed (one timed call a candidate) + compile-graphs merged, against 8b74500
  A) tests gpu_program gpu_engine
     GPUKIT_TRACE=1 MODELS="convnext_tiny mobilenet_v3_large efficientnet_b0" PYTORCH=1 bash scripts/gpu-onnx-ab.sh ;;
  # B: dw-norm (fused depthwise + layer norm; gemm candidates timed in graph replays), against dec03fd
  B) tests gpu_program gpu_engine
     GPUKIT_TRACE=1 MODELS="convnext_tiny" PYTORCH=1 PROFILE_BATCHES="1 32" PROFILE_BASE=1 bash scripts/gpu-onnx-ab.sh ;;
  # C: dw-block (4x4 output blocks a thread at larger batches), against dec03fd
  C) tests gpu_program gpu_engine
     GPUKIT_TRACE=1 MODELS="convnext_tiny mobilenet_v3_large efficientnet_b0" PYTORCH=1 PROFILE_BATCHES="32" PROFILE_BASE=1 bash scripts/gpu-onnx-ab.sh ;;
  # D: gemm-timed against dec03fd in turns (base gemm gemm base base gemm, --gpu-iterations 300);
  #    Nsight Compute (--clock-control none, sections SpeedOfLight, Occupancy, LaunchStats,
  #    WarpStateStats, kernels matching depthwise|dw_norm|layer_norm, 23 launches) over
  #    `infer --onnx convnext_tiny.onnx --batch-sizes {32,1} --strategies fp16-nhwc
  #    --gpu-iterations 2` for main, dw-block and dw-norm
  D) W=$(mktemp -d); export PATH=/opt/torch/.venv/bin:$PATH
     (cd scripts && python3 export_torchvision.py "$W" convnext_tiny) > /dev/null
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     bin() { case $1 in base) echo .device/base/gpukit;; *) echo .device/alt/$1;; esac; }
     i=0
     for which in base gemm-timed gemm-timed base base gemm-timed; do
       i=$((i+1))
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-$which GPUKIT_ORT_LIB=$ORT timeout 120 $(bin $which) infer --onnx $W/convnext_tiny.onnx \
         --device cuda:0 --batch-sizes 1,32 --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/ab-$i-$which.json > $OUT/t/ab-$i-$which.txt 2>&1
       say "ab $i $which rc=$?"; python3 scripts/onnx_rows.py $OUT/t/ab-$i-$which.json | grep -v " cpu " | tee -a "$S"
     done
     for which in base block dw-norm; do for batch in 32 1; do
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-ncu-$which GPUKIT_ORT_LIB=$ORT timeout 150 ncu --clock-control none \
         -k regex:'depthwise|dw_norm|layer_norm' --launch-count 23 --section SpeedOfLight --section Occupancy \
         --section LaunchStats --section WarpStateStats $(bin $which) infer --onnx $W/convnext_tiny.onnx --device cuda:0 \
         --batch-sizes $batch --strategies fp16-nhwc --gpu-iterations 2 > $OUT/t/ncu-$which-b$batch.txt 2>&1
       say "ncu $which b$batch rc=$?"
     done; done ;;
  # E: ln-regs (layer norm of many rows over more lanes), against main with gemm timing
  E) tests gpu_program
     MODELS="convnext_tiny" PYTORCH=1 PROFILE_BATCHES="1 32" PROFILE_BASE=1 bash scripts/gpu-onnx-ab.sh ;;
  # F: dw-variants' gpu_program with the depthwise kernels timed; a scratch build choosing rows of
  #    8 outputs for 7x7 filters (new) against main (base)
  F) GPUKIT_DW_TIMINGS=1 tests gpu_program
     MODELS="convnext_tiny" PROFILE_BATCHES="32" bash scripts/gpu-onnx-ab.sh ;;
  # G: the depthwise timings again, the tiled kernel at batch 32 too
  G) GPUKIT_DW_TIMINGS=1 timeout 120 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) \
       .device/tests/gpu_program depthwise_variants_agree --test-threads 1 --nocapture > $OUT/gpu_program.log 2>&1
     say "rc=$?"; grep -E "dw timing|test result|FAILED|panicked" $OUT/gpu_program.log | tee -a "$S" ;;
esac
tar -C "$OUT" -czf "$OUT/t.tar.gz" t && rm -rf "$OUT/t"
say "== done $(date -u +%FT%TZ)"
