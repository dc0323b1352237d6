#!/usr/bin/env bash
# Run 128 (session 46), from the repository root on the lent machine, binaries staged under
# .device/ (gzipped, carried). `bash .device/drivers.sh CALL`
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done 2>/dev/null
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $CALL $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tr '\n' ' ')"
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0
T="env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1"
case $CALL in
  # F2: branch wgmma-fp8: the fp8 convolution kernels against float64 (every tile, every case),
  #     the product's rate at 4096^3, ResNet-50's convolutions at batch 256 beside cuDNN's f16
  #     and fp8; memcheck of the correctness cases
  F2) $T GPUKIT_FP8_TIMINGS=1 timeout 450 .device/tests/gpu_program_fp8 --test-threads 1 --nocapture fp8 > $OUT/t/fp8.log 2>&1
     say "fp8 rc=$?: $(grep 'test result' $OUT/t/fp8.log)"; grep -E 'fp8 (product|conv timing)|FAILED|panicked|rror|differs' $OUT/t/fp8.log | head -40 | tee -a "$S"
     grep -E 'worst difference' $OUT/t/fp8.log | awk '{print $(NF-2)}' | sort -g | tail -1 | sed 's/^/largest share of the allowed difference: /' | tee -a "$S"
     $T GPUKIT_FP8_TIMINGS=0 timeout 300 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --report-api-errors no .device/tests/gpu_program_fp8 --test-threads 1 fp8 > $OUT/t/fp8-memcheck.log 2>&1
     say "fp8 memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/t/fp8-memcheck.log | tail -1)"
     cp $OUT/t/fp8.log $OUT/ ; rm -rf $OUT/t ;;
  # F3: Nsight Compute on one launch: the fp8 kernel n128s4 on ResNet-50's 64@56 -> 256 1x1
  #     at batch 256 (its 103rd launch: 10 checks, 23 at 4096^3, 23 a shape before)
  F3) NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); NCU=${NCU:-ncu}
     $T GPUKIT_FP8_TIMINGS=1 timeout 300 $NCU --clock-control none -k ${NCU_K:-fp8_conv_n128s4} --launch-skip ${NCU_SKIP:-102} --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats .device/tests/gpu_program_fp8 --test-threads 1 --nocapture fp8 > $OUT/t/ncu.txt 2>&1
     say "ncu rc=$?"; grep -vE "^    fp8 conv Tile" $OUT/t/ncu.txt | grep -E "^  [A-Z]|^    [A-Za-z]" | head -120 >> "$S"
     cp $OUT/t/ncu.txt $OUT/ ; rm -rf $OUT/t ;;
esac
say "== done $(date -u +%FT%TZ)"
