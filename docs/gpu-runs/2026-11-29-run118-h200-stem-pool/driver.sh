#!/usr/bin/env bash
# Run 118 (session 40) calls, from the repository root on the lent GPU machine, binaries staged
# under .device/ (gzipped, carried): .device/gpukit (main + the stem-and-pool kernel),
# .device/tests/*. The base of every A/B is the same binary with GPUKIT_NO_STEM_POOL=1.
# `bash .device/drivers.sh A`
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
tests() { # test-binary [filter] (GPU tests, each on a fresh kernel cache)
  local t=$1; shift
  timeout 300 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) .device/tests/$t "$@" --test-threads 1 --nocapture > "$OUT/t/$t-${1:-all}.log" 2>&1
  say "$t $* rc=$?: $(grep -E '^test result' "$OUT/t/$t-${1:-all}.log")"; grep -E "FAILED|panicked|failed|Error" "$OUT/t/$t-${1:-all}.log" | head -30 | tee -a "$S"
}
export PATH=/opt/torch/.venv/bin:$PATH
printf '#!/bin/sh\nexec env GPUKIT_NO_STEM_POOL=1 %s "$@"\n' "$PWD/.device/gpukit" > .device/base.sh; chmod +x .device/base.sh
case $CALL in
  # A: the stem and its max pool as one kernel (decision 184). GPU tests (the kernel against
  #    float64, both tiles; every fixture, ResNet's stem among them, against the interpreter);
  #    ResNet-50 b1/b32/b256 in turns against the same binary with the two steps apart
  #    (GPUKIT_NO_STEM_POOL=1), its profile at b256, PyTorch beside
  A) tests gpu_program stem_pool
     tests gpu_program every_fixture
     MODELS="resnet50" BATCHES=1,32,256 PROFILE_BATCHES=256 PYTORCH=1 GPUKIT_BASE=$PWD/.device/base.sh \
       OUT=$OUT/t bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/0-summary.txt >> $S
     ;;
  # B: the kernel's input double-buffered (the next tile's staged while this one computes) and
  #    its empty row tiles skipped. compute-sanitizer (memcheck, racecheck, synccheck) over the
  #    kernel's test; the GPU tests again; ResNet-50 b32/b256 in turns against call A's binary
  #    (v1); DenseNet-121 b1/b32 in turns against the steps apart; profiles of ResNet-50 at b1
  #    and b256
  B) CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
     say "compute-sanitizer: ${CS:-not found} $($CS --version 2>/dev/null | tail -1)"
     for tool in memcheck racecheck synccheck; do
       timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) $CS --tool $tool --error-exitcode 9 \
         .device/tests/gpu_program stem_pool --test-threads 1 > $OUT/t/sanitize-$tool.log 2>&1
       say "sanitize $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $OUT/t/sanitize-$tool.log | tr '\n' ' ')"
     done
     tests gpu_program stem_pool
     tests gpu_program every_fixture
     MODELS="resnet50" BATCHES=32,256 PROFILE_BATCHES="256 1" GPUKIT_BASE=$PWD/.device/v1/gpukit \
       OUT=$OUT/t/r50 bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/r50/0-summary.txt >> $S
     MODELS="densenet121" BATCHES=1,32 PROFILE_BATCHES=32 GPUKIT_BASE=$PWD/.device/base.sh \
       OUT=$OUT/t/dn bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/dn/0-summary.txt >> $S ;;
  # C: the image's conversion in the kernel too (the f32 image staged as blocks, no conversion
  #    step). compute-sanitizer over both kernel tests; GPU tests; ResNet-50 b1/b32/b256 in
  #    turns against the conversion a step apart (GPUKIT_NO_STEM_POOL=convert), profiles at b256
  #    and b1, PyTorch beside
  # D: the image staged a thread a blocked pixel, pairs of columns in 8-byte loads (call C's
  #    staging took 8 scalar loads a half pixel and was 0.8% slower at b256). As C.
  C|D) CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
     for tool in memcheck racecheck; do
       timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) $CS --tool $tool --report-api-errors no --error-exitcode 9 \
         .device/tests/gpu_program stem_ --test-threads 1 > $OUT/t/sanitize-$tool.log 2>&1
       say "sanitize $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $OUT/t/sanitize-$tool.log | tr '\n' ' ')"
     done
     tests gpu_program stem_
     tests gpu_program every_fixture
     printf '#!/bin/sh\nexec env GPUKIT_NO_STEM_POOL=convert %s "$@"\n' "$PWD/.device/gpukit" > .device/apart.sh; chmod +x .device/apart.sh
     MODELS="resnet50" BATCHES=1,32,256 PROFILE_BATCHES="256 1" PYTORCH=1 GPUKIT_BASE=$PWD/.device/apart.sh \
       OUT=$OUT/t/r50 bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/r50/0-summary.txt | tee -a $S | grep -E "best|new rc|base rc|b256|Step without|stem|convert" ;;
  # E: the landed code (the kernel as call A's, the image's conversion a step of its own):
  #    the whole GPU program suite; ResNet-50 b1/b32/b256 in turns against the two steps apart
  #    (GPUKIT_NO_STEM_POOL=1), then beside PyTorch
  E) tests gpu_program
     MODELS="resnet50" BATCHES=1,32,256 PROFILE_BATCHES=none PYTORCH=1 GPUKIT_BASE=$PWD/.device/base.sh \
       OUT=$OUT/t/r50 bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/r50/0-summary.txt | tee -a $S | grep -E "best|rc=|cuda:0|pytorch" ;;
  # F: products of few rows (classifiers at batch 1) timed on gpukit's matrix-vector kernel
  #    too. The fixtures (the "own" variants force it); ResNet-50 and MobileNetV3-L at b1 in
  #    turns against GPUKIT_NO_GEMM_MATVEC=1, the new binary's product choices traced
  F) tests gpu_program every_fixture
     printf '#!/bin/sh\nexec env GPUKIT_NO_GEMM_MATVEC=1 %s "$@"\n' "$PWD/.device/gpukit" > .device/nomv.sh; chmod +x .device/nomv.sh
     printf '#!/bin/sh\nexec env GPUKIT_TRACE=1 %s "$@"\n' "$PWD/.device/gpukit" > .device/traced.sh; chmod +x .device/traced.sh
     MODELS="resnet50 mobilenet_v3_large" BATCHES=1 PROFILE_BATCHES=none GPUKIT_BIN=$PWD/.device/traced.sh GPUKIT_BASE=$PWD/.device/nomv.sh \
       OUT=$OUT/t/mv bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/mv/0-summary.txt | tee -a $S | grep -E "rc=|cuda:0"
     mkdir -p $OUT/t/mvx && tar -C $OUT/t/mvx -xzf $OUT/t/mv/ab.tar.gz && grep -h "gemm .*x.*x" $OUT/t/mvx/ab/*-2-new.txt | cut -c1-260 | tee -a $S ;;
esac
tar -C "$OUT" -czf "$OUT/t.tar.gz" t && rm -rf "$OUT/t"
say "== done $(date -u +%FT%TZ)"
