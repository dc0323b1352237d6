#!/usr/bin/env bash
# Run 119 (session 41), from the repository root on the lent GPU machine, binaries staged under
# .device/ (gzipped, carried): .device/gpukit, .device/tests/gpu_train. `bash .device/drivers.sh CALL`
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $CALL $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tr '\n' ' ')"
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0
pp_row() {
python3 - "$1" <<'PY2' 2>&1 | tee -a "$S"
import json, sys
r = json.load(open(sys.argv[1]))["result"]; d = r.get("pipeline") or {}; one = d.get("one_gpu") or {}
print(f"  bubble {d.get('bubble', 0):.3f} (schedule {d.get('bubble_schedule', 0):.3f}, no flush {d.get('bubble_without_flush', 0):.3f}) samples/s {d.get('samples_per_s', 0):.0f} alone {[round(x, 3) for x in d.get('alone_step_ms', [])]} step {[round(x, 3) for x in d.get('step_ms', [])]} via {d.get('transfers', '')[:24]}"
      + (f" | one GPU {one.get('samples_per_s', 0):.0f} losses within {one.get('max_loss_rel_diff', 0):.1e}" if one else ""))
PY2
}
case $CALL in
  # P1: the pipeline test (NCCL and copy engines), then bf16 / fp32 pipelines in turns
  P1) timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 .device/tests/gpu_train --test-threads 1 --nocapture pipeline > $OUT/t/gpu_train.log 2>&1
     say "gpu_train pipeline rc=$?: $(grep 'test result' $OUT/t/gpu_train.log)"; grep -E 'stages|FAILED|failed|panicked|Error' $OUT/t/gpu_train.log | head -12 | tee -a "$S"
     P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
     i=0
     for v in copies:bf16:40 nccl:bf16:40 nccl:bf16:40 copies:bf16:40 copies:fp32:20 nccl:fp32:20; do
       i=$((i+1)); which=${v%%:*}; rest=${v#*:}; prec=${rest%%:*}; steps=${rest#*:}
       E=""; [ $which = nccl ] && E="GPUKIT_PIPE_NCCL=1"
       # shellcheck disable=SC2086
       timeout 150 env -u LD_LIBRARY_PATH $E .device/gpukit train $P --precision $prec --steps $steps --save-json $OUT/t/pp-$i-$which-$prec.json > $OUT/t/pp-$i-$which-$prec.txt 2>&1
       say "pp $i $which $prec rc=$?"; pp_row $OUT/t/pp-$i-$which-$prec.json
     done ;;
  # P3: the split chosen by the schedule's estimate: bf16 with 8 micro-batches (copy engines
  #     twice, NCCL once), 4 and 16 micro-batches, fp32
  P3) P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
     i=0
     for v in copies:bf16:40:8 nccl:bf16:40:8 copies:bf16:40:8 copies:bf16:40:4 copies:bf16:40:16 nccl:bf16:40:4 copies:fp32:20:8; do
       i=$((i+1)); IFS=: read -r which prec steps m <<< "$v"
       E=""; [ $which = nccl ] && E="GPUKIT_PIPE_NCCL=1"
       # shellcheck disable=SC2086
       timeout 150 env -u LD_LIBRARY_PATH $E GPUKIT_TRACE=1 .device/gpukit train $P --precision $prec --steps $steps --micro-batches $m --save-json $OUT/t/pp-$i-$which-$prec-m$m.json > $OUT/t/pp-$i-$which-$prec-m$m.txt 2> $OUT/t/pp-$i-$which-$prec-m$m.err
       say "pp $i $which $prec m$m rc=$?"; pp_row $OUT/t/pp-$i-$which-$prec-m$m.json; grep "pipeline stage" $OUT/t/pp-$i-$which-$prec-m$m.err | cut -c1-1500 | tee -a "$S" 
     done
     python3 -c "
import json,glob
for p in sorted(glob.glob('$OUT/t/pp-*.json')):
    d=json.load(open(p))['result']['pipeline']; print(p.split('/')[-1], d['layers'], [round(x,3) for x in d['layer_update_ms']], d['optimizer_ms'])
" | tee -a "$S" ;;
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
  # P2: scripts/gpu-multi.sh pipeline (PyTorch's Schedule1F1B beside, micro-batch sweep, launched
  #     stages against the threads, the model one GPU refuses under --memory-fraction 0.4)
  P2) NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1); say "nsys: ${NSYS:-none}"
     if [ -n "$NSYS" ]; then
       P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
       timeout 200 env -u LD_LIBRARY_PATH $NSYS profile -t cuda -o $OUT/t/pp-trace --force-overwrite true .device/gpukit train $P --precision bf16 --steps 40 --save-json $OUT/t/pp-trace.json > $OUT/t/pp-trace.txt 2>&1
       say "nsys pipeline rc=$?"; pp_row $OUT/t/pp-trace.json
       timeout 120 $NSYS stats -r cuda_gpu_trace -f csv -o $OUT/t/pp-trace $OUT/t/pp-trace.nsys-rep > /dev/null 2>&1; say "nsys stats rc=$?"
       gzip -f $OUT/t/pp-trace*.csv; rm -f $OUT/t/pp-trace.sqlite; gzip -f $OUT/t/pp-trace.nsys-rep
     fi
     GPUKIT_TESTS=$PWD/.device/tests OUT=$OUT/multi timeout 560 bash scripts/gpu-multi.sh pipeline > $OUT/t/multi.log 2>&1
     say "gpu-multi pipeline rc=$?"; cat $OUT/multi/summary.txt >> "$S" ;;
esac
say "== done $(date -u +%FT%TZ)"
