#!/usr/bin/env bash
# Run 120 (session 41; run 119's driver holds the pipeline calls), from the repository root on the lent GPU machine, binaries staged under
# .device/ (gzipped, carried): .device/gpukit, .device/tests/gpu_train. `bash .device/drivers.sh CALL`
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $CALL $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tr '\n' ' ')"
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0
case $CALL in
  # I1 (one H200): ResNet-50 fp16 batch 1 with gpukit's convolution kernel timed beside each cuDNN
  #     plan (GPUKIT_OWN_CONV=timed-own GPUKIT_TRACE=1): the per-shape figures for issue 34's b1
  I1) W=$(mktemp -d); ls /usr/local/cuda/bin | tr '\n' ' ' | tee -a "$S"; echo | tee -a "$S"
     (cd scripts && python3 export_torchvision.py "$W" resnet50) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for v in own:timed-own base:; do
       which=${v%%:*}; own=${v#*:}
       E="GPUKIT_TRACE=1"; [ -n "$own" ] && E="$E GPUKIT_OWN_CONV=$own"
       # shellcheck disable=SC2086
       env -u LD_LIBRARY_PATH $E XDG_CACHE_HOME=$W/cache-$which GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes 1 --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/r50-b1-$which.json > $OUT/t/r50-b1-$which.txt 2>&1
       say "resnet50 b1 $which rc=$?"; python3 scripts/onnx_rows.py $OUT/t/r50-b1-$which.json | grep -v " cpu " | tee -a "$S"
     done ;;
  # K1 (one H200): gpukit's small product / convolution kernel with 4 stages and atomic sums:
  #     the GPU tests, racecheck/memcheck on its two tests, ResNet-50 b1 with it timed beside cuDNN
  K1) t=.device/tests/gpu_program
     timeout 300 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) $t --test-threads 1 --nocapture > $OUT/t/gpu_program.log 2>&1
     say "gpu_program rc=$?: $(grep -E '^test result' $OUT/t/gpu_program.log)"; grep -E "FAILED|panicked|failed" $OUT/t/gpu_program.log | head -20 | tee -a "$S"
     for tool in racecheck memcheck; do
       X=""; [ $tool = memcheck ] && X="--report-api-errors no"
       # shellcheck disable=SC2086
       timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 /usr/local/cuda/bin/compute-sanitizer --tool $tool $X $t --test-threads 1 small > $OUT/t/sanitize-$tool.log 2>&1
       say "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $OUT/t/sanitize-$tool.log | tr '\n' ' ')"
     done
     W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     env -u LD_LIBRARY_PATH GPUKIT_TRACE=1 GPUKIT_OWN_CONV=timed-own XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes 1 --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/r50-b1-own.json > $OUT/t/r50-b1-own.txt 2>&1
     say "resnet50 b1 timed-own rc=$?"; python3 scripts/onnx_rows.py $OUT/t/r50-b1-own.json | grep -v " cpu " | tee -a "$S"
     grep "cuDNN's plan, gpukit's" $OUT/t/r50-b1-own.txt | sed 's/ConvGeometry { //; s/dilation: \[1, 1\] }//' | cut -c1-260 | tee -a "$S" ;;
  # K2: as K1 with the sums added as pairs (red.global.add.v2.f32) and 1/4, 1/2 and all of the
  #     blocks' piece counts timed: the kernel's two GPU tests, memcheck, ResNet-50 b1
  K2) t=.device/tests/gpu_program
     timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) $t --test-threads 1 --nocapture small > $OUT/t/gpu_program.log 2>&1
     say "gpu_program small rc=$?: $(grep -E '^test result' $OUT/t/gpu_program.log)"; grep -E "FAILED|panicked|failed" $OUT/t/gpu_program.log | head -20 | tee -a "$S"
     timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --report-api-errors no $t --test-threads 1 small > $OUT/t/sanitize-memcheck.log 2>&1
     say "compute-sanitizer memcheck rc=$?: $(grep -E 'ERROR SUMMARY|test result' $OUT/t/sanitize-memcheck.log | tr '\n' ' ')"
     W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     env -u LD_LIBRARY_PATH GPUKIT_TRACE=1 GPUKIT_OWN_CONV=timed-own XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes 1 --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/r50-b1-own.json > $OUT/t/r50-b1-own.txt 2>&1
     say "resnet50 b1 timed-own rc=$?"; python3 scripts/onnx_rows.py $OUT/t/r50-b1-own.json | grep -v " cpu " | tee -a "$S"
     grep "cuDNN's plan, gpukit's" $OUT/t/r50-b1-own.txt | sed 's/ConvGeometry { //; s/dilation: \[1, 1\] }//; s/then [0-9] of cuBLASLt.s (fused [a-z]*)//' | cut -c1-260 | tee -a "$S" ;;
  # N1: ncu on gpukit's conv_small kernels while ResNet-50 b1 times them (the floor near 10 us)
  N1) W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     env -u LD_LIBRARY_PATH GPUKIT_OWN_CONV=timed-own XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 400 /usr/local/cuda/bin/ncu --kernel-name regex:conv_small_f16 --launch-count 300 \
         --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --csv .device/gpukit infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes 1 --strategies fp16-nhwc-graph --gpu-iterations 50 > $OUT/t/ncu.csv 2> $OUT/t/ncu.err
     say "ncu rc=$? $(wc -l < $OUT/t/ncu.csv) lines"; tail -3 $OUT/t/ncu.err | tee -a "$S"
     gzip -f $OUT/t/ncu.csv ;;
  # N2: ncu's warp stall reasons (raw page) on conv_small while ResNet-50 b1 times it
  N2) W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     env -u LD_LIBRARY_PATH GPUKIT_OWN_CONV=timed-own XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 400 /usr/local/cuda/bin/ncu --kernel-name regex:conv_small_f16 --launch-skip 150 --launch-count 80 \
         --cache-control none --clock-control none --section WarpStateStats --section SourceCounters --page raw --csv .device/gpukit infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes 1 --strategies fp16-nhwc-graph --gpu-iterations 50 > $OUT/t/ncu2.csv 2> $OUT/t/ncu2.err
     say "ncu rc=$? $(wc -l < $OUT/t/ncu2.csv) lines"; tail -2 $OUT/t/ncu2.err | tee -a "$S"
     gzip -f $OUT/t/ncu2.csv ;;
  # K3: K2 with the loaders' addresses advanced instead of recomputed (193 instructions a step
  #     of K instead of 255 in conv_small's loop): the kernel's tests, memcheck, ResNet-50 b1
  K3) bash .device/drivers.sh K2 ;;
esac
say "== done $(date -u +%FT%TZ)"
