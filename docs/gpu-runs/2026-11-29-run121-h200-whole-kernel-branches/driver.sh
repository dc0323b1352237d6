#!/usr/bin/env bash
# Run 121 (session 42), from the repository root on the lent GPU machine, binaries staged under
# .device/ (gzipped, carried): .device/gpukit, .device/tests/gpu_program. `bash .device/drivers.sh CALL`
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $CALL $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tr '\n' ' ')"
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0
setup() {
  W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50) > /dev/null 2>&1
  ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
}
# ResNet-50 fp16 b1 with GPUKIT_OWN_CONV=$2 (empty: default), label $1: rates and the traced timings
r50() {
  E="GPUKIT_TRACE=1"; [ -n "$2" ] && E="$E GPUKIT_OWN_CONV=$2"
  # shellcheck disable=SC2086
  env -u LD_LIBRARY_PATH $E XDG_CACHE_HOME=$W/cache-$1 GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/resnet50.onnx \
    --device cuda:0 --batch-sizes ${3:-1} --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/r50-$1.json > $OUT/t/r50-$1.txt 2>&1
  say "resnet50 $1 rc=$?"; python3 scripts/onnx_rows.py $OUT/t/r50-$1.json | grep -v " cpu " | tee -a "$S"
  grep "cuDNN's plan, gpukit's" $OUT/t/r50-$1.txt | sed 's/ConvGeometry { //; s/dilation: \[1, 1\] }//; s/then [0-9] of cuBLASLt.s (fused [a-z]*)//' | cut -c1-330 | tee -a "$S"
}
case $CALL in
  # W1 (one H200): gpukit's convolution kernel with whole pieces (conv_whole): its GPU tests
  #     against float64, memcheck and racecheck, then ResNet-50 b1 with the kernel timed beside
  #     each cuDNN plan (per-shape timings) and by default
  W1) t=.device/tests/gpu_program
     timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) $t --test-threads 1 --nocapture small > $OUT/t/gpu_program.log 2>&1
     say "gpu_program small rc=$?: $(grep -E '^test result' $OUT/t/gpu_program.log)"; grep -E "FAILED|panicked|failed|Error" $OUT/t/gpu_program.log | head -20 | tee -a "$S"
     for tool in memcheck racecheck; do
       X=""; [ $tool = memcheck ] && X="--report-api-errors no"
       # shellcheck disable=SC2086
       timeout 150 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 /usr/local/cuda/bin/compute-sanitizer --tool $tool $X $t --test-threads 1 conv_small > $OUT/t/sanitize-$tool.log 2>&1
       say "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $OUT/t/sanitize-$tool.log | tr '\n' ' ')"
     done
     setup; r50 own timed-own; r50 base "" ;;
  # W2: W1 after the epilogues' loads were batched ahead of their stores and the pieces' fence
  #     became one acquire-release count (both kernels): tests, memcheck, ResNet-50 b1
  W2) t=.device/tests/gpu_program
     timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) $t --test-threads 1 --nocapture small > $OUT/t/gpu_program.log 2>&1
     say "gpu_program small rc=$?: $(grep -E '^test result' $OUT/t/gpu_program.log)"; grep -E "FAILED|panicked|failed|Error" $OUT/t/gpu_program.log | head -20 | tee -a "$S"
     timeout 150 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --report-api-errors no $t --test-threads 1 small > $OUT/t/sanitize-memcheck.log 2>&1
     say "compute-sanitizer memcheck rc=$?: $(grep -E 'ERROR SUMMARY|test result' $OUT/t/sanitize-memcheck.log | tr '\n' ' ')"
     setup; r50 own timed-own; r50 base "" ;;
  # N3: ncu on conv_whole (and conv_small) while ResNet-50 b1 times them: each launch's own
  #     duration beside the graph-timed figure, occupancy and where the warps wait
  N3) setup
     env -u LD_LIBRARY_PATH GPUKIT_OWN_CONV=timed-own XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 500 /usr/local/cuda/bin/ncu --kernel-name regex:'conv_(whole|small)_f16' --launch-count 700 \
         --cache-control none --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --csv .device/gpukit infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes 1 --strategies fp16-nhwc-graph --gpu-iterations 20 > $OUT/t/ncu3.csv 2> $OUT/t/ncu3.err
     say "ncu rc=$? $(wc -l < $OUT/t/ncu3.csv) lines"; tail -3 $OUT/t/ncu3.err | tee -a "$S"
     gzip -f $OUT/t/ncu3.csv ;;
  # B1: branches in the CUDA graph (decision 190) and gpukit's whole-piece kernel timed by
  #     default: all GPU program tests (replays from a poisoned arena), then ResNet-50 fp16
  #     in turns: A = previous default (timed-products, no branches), B = whole pieces timed,
  #     no branches, C = the new default; batch 1 (A B C C B A) and 32 (A C C A)
  B1) t=.device/tests/gpu_program
     timeout 300 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) $t --test-threads 1 > $OUT/t/gpu_program.log 2>&1
     say "gpu_program rc=$?: $(grep -E '^test result' $OUT/t/gpu_program.log)"; grep -E "FAILED|panicked|failed|Error" $OUT/t/gpu_program.log | head -20 | tee -a "$S"
     setup
     ab() { # label batch env...
       l=$1; b=$2; shift 2
       env -u LD_LIBRARY_PATH "$@" XDG_CACHE_HOME=$W/cache-$l GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes $b --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/ab-$l-b$b-$(date +%s%N).json > $OUT/t/ab-$l-b$b.txt 2>&1
       say "b$b $l rc=$? $(python3 scripts/onnx_rows.py $(ls -t $OUT/t/ab-$l-b$b-*.json | head -1) | grep -v ' cpu ' | head -1)"
     }
     A="GPUKIT_OWN_CONV=timed-products GPUKIT_NO_BRANCHES=1"; B="GPUKIT_NO_BRANCHES=1"; C="GPUKIT_TRACE=0"
     for v in A B C C B A; do eval "ab $v 1 \$$v"; done
     for v in A C C A; do eval "ab $v 32 \$$v"; done
     grep -h "gpu:" $OUT/t/ab-C-b1.txt $OUT/t/ab-C-b32.txt | cut -c1-400 | tee -a "$S"
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-C timeout 120 .device/gpukit profile infer --onnx $W/resnet50.onnx --batch-size 1 --strategy fp16-nhwc-graph --group-by op --top 14 > $OUT/t/profile-b1.txt 2>&1
     say "profile b1 rc=$?"; grep -E "Step without|Graph:|│ [a-z]" $OUT/t/profile-b1.txt | head -20 | cut -c1-200 | tee -a "$S" ;;
  # B2: whole pieces that fill the multiprocessors once (kc up to 320): the kernel's tests and
  #     memcheck, ResNet-50 b1's per-shape timings (timed-own), A/C in turns at b1 and b256,
  #     then beside PyTorch (same weights, --compare-pytorch) at 1, 32, 256
  B2) t=.device/tests/gpu_program
     timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) $t --test-threads 1 small > $OUT/t/gpu_program.log 2>&1
     say "gpu_program small rc=$?: $(grep -E '^test result' $OUT/t/gpu_program.log)"; grep -E "FAILED|panicked|failed|Error" $OUT/t/gpu_program.log | head -20 | tee -a "$S"
     timeout 150 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --report-api-errors no $t --test-threads 1 small > $OUT/t/sanitize-memcheck.log 2>&1
     say "compute-sanitizer memcheck rc=$?: $(grep -E 'ERROR SUMMARY|test result' $OUT/t/sanitize-memcheck.log | tr '\n' ' ')"
     setup; r50 own timed-own
     ab() { # label batch env...
       l=$1; b=$2; shift 2
       env -u LD_LIBRARY_PATH "$@" XDG_CACHE_HOME=$W/cache-$l GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes $b --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/ab-$l-b$b-$(date +%s%N).json > $OUT/t/ab-$l-b$b.txt 2>&1
       say "b$b $l rc=$? $(python3 scripts/onnx_rows.py $(ls -t $OUT/t/ab-$l-b$b-*.json | head -1) | grep -v ' cpu ' | head -1)"
     }
     A="GPUKIT_OWN_CONV=timed-products GPUKIT_NO_BRANCHES=1"; C="GPUKIT_TRACE=0"
     for v in A C C A; do eval "ab $v 1 \$$v"; done
     for v in A C; do eval "ab $v 256 \$$v"; done
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-C GPUKIT_ORT_LIB=$ORT timeout 400 .device/gpukit infer --onnx $W/resnet50.onnx --device cuda:0 --batch-sizes 1,32,256 \
       --strategies fp16-nhwc-graph --compare-pytorch --torchvision resnet50 --save-json $OUT/t/beside-pytorch.json > $OUT/t/beside-pytorch.txt 2>&1
     say "beside pytorch rc=$?"; grep -E "b1 |b32 |b256 |pytorch|torch" $OUT/t/beside-pytorch.txt | head -30 | cut -c1-200 | tee -a "$S"
     (cd $OUT/t && tar czf ../b2.tar.gz . && cd .. && rm -rf t) ;;
  # B3: the pass with branches timed against the pass in step order at capture (default);
  #     GPU program tests (branches forced on, replays from a poisoned arena); ResNet-50 b256
  #     and b32 in turns, branches off vs default (A C C A C A), the b1/b256 traces of the
  #     capture's timing; racecheck on the convolution kernel's test
  B3) t=.device/tests/gpu_program
     timeout 300 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) $t --test-threads 1 > $OUT/t/gpu_program.log 2>&1
     say "gpu_program rc=$?: $(grep -E '^test result' $OUT/t/gpu_program.log)"; grep -E "FAILED|panicked|failed|Error" $OUT/t/gpu_program.log | head -20 | tee -a "$S"
     setup
     ab() { # label batch env...
       l=$1; b=$2; shift 2
       env -u LD_LIBRARY_PATH "$@" XDG_CACHE_HOME=$W/cache-$l GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes $b --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/ab-$l-b$b-$(date +%s%N).json > $OUT/t/ab-$l-b$b-$(date +%s%N).txt 2>&1
       say "b$b $l rc=$? $(python3 scripts/onnx_rows.py $(ls -t $OUT/t/ab-$l-b$b-*.json | head -1) | grep -v ' cpu ' | head -1)"
       grep -h "branches beside" $(ls -t $OUT/t/ab-$l-b$b-*.txt | head -1) | cut -c1-200 | tee -a "$S"
     }
     A="GPUKIT_BRANCHES=off"; C="GPUKIT_TRACE=1"
     for v in A C C A C A; do eval "ab $v 256 \$$v"; done
     for v in A C C A; do eval "ab $v 32 \$$v"; done
     ab C 1 GPUKIT_TRACE=1
     timeout 150 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 /usr/local/cuda/bin/compute-sanitizer --tool racecheck $t --test-threads 1 conv_small > $OUT/t/sanitize-racecheck.log 2>&1
     say "compute-sanitizer racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|test result' $OUT/t/sanitize-racecheck.log | tr '\n' ' ')"
     (cd $OUT/t && tar czf ../b3.tar.gz . && cd .. && rm -rf t) ;;
esac
say "== done $(date -u +%FT%TZ)"
