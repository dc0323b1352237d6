#!/usr/bin/env bash
# Run 117 (session 39) calls, from the repository root on the lent GPU machine, binaries staged
# under .device/ (gzipped, carried): .device/gpukit (main), .device/base/gpukit (26d7c6d),
# .device/tests/*.  `bash .device/drivers.sh A`
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
tests() { # test-binary [filter] (GPU tests, each on a fresh kernel cache)
  local t=$1; shift
  timeout 300 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) .device/tests/$t "$@" --test-threads 1 --nocapture > "$OUT/t/$t.log" 2>&1
  say "$t $* rc=$?: $(grep -E '^test result' "$OUT/t/$t.log")"; grep -E "FAILED|panicked" "$OUT/t/$t.log" | head -30 | tee -a "$S"
}
export PATH=/opt/torch/.venv/bin:$PATH
case $CALL in
  # A: session 38's staged changes. GPU tests (the blocked stem's conversion on every fixture;
  #    the shared-memory depthwise kernel against float64, with every depthwise kernel's
  #    timings); ResNet-50 b32/b256 in turns, main against 26d7c6d (the conversion without a
  #    division a value); ConvNeXt-T in turns with GPUKIT_DW_SMEM=1 against without (main);
  #    ResNet-50's fp32 rows as they are (speed, distance from float64) for what comes next
  A) GPUKIT_DW_TIMINGS=1 tests gpu_program
     grep -o "dw timing.*" $OUT/t/gpu_program.log | tee -a "$S"
     MODELS="resnet50" BATCHES=32,256 PROFILE_BATCHES=256 OUT=$OUT/t bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     printf '#!/bin/sh\nexec env GPUKIT_DW_SMEM=1 %s "$@"\n' "$PWD/.device/gpukit" > .device/smem.sh; chmod +x .device/smem.sh
     MODELS="convnext_tiny" BATCHES=1,32 PROFILE_BATCHES=32 GPUKIT_BIN=$PWD/.device/smem.sh GPUKIT_BASE=$PWD/.device/gpukit \
       OUT=$OUT/t bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/0-summary.txt >> $S
     W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/resnet50.onnx \
       --device cuda:0 --batch-sizes 1,32 --strategies fp32-nhwc-graph,fp32-nchw-graph,tf32-nhwc-graph --gpu-iterations 50 \
       --save-json $OUT/t/resnet50-fp32.json > $OUT/t/resnet50-fp32.txt 2>&1
     say "resnet50 fp32 rc=$?"; python3 scripts/onnx_rows.py $OUT/t/resnet50-fp32.json | grep -v " cpu " | tee -a "$S" ;;
  # B: f32 convolutions summed in f64 (decision 183). GPU tests (the kernels against float64
  #    output by output; every fixture with f64 sums against the float64 interpreter, beside
  #    cuDNN's sums; the fixtures' f32 rows now take the default); ResNet-50's fp32 rows with
  #    early (default) and all; the f32 step's time off / early / all (profile, b32, both
  #    layouts); the other five models' fp32 rows early and off; PyTorch's own GPU fp16/bf16
  #    agreement with its fp32 on random inputs (the 16-bit bar's floor)
  B) tests gpu_program
     grep -o "exact sums:.*" $OUT/t/gpu_program.log | tee -a "$S"
     W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     inf() { # model mode batches strategies
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c GPUKIT_EXACT_SUMS=$2 GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/$1.onnx \
         --device cuda:0 --batch-sizes $3 --strategies $4 --gpu-iterations 100 --save-json $OUT/t/$1-$2.json > $OUT/t/$1-$2.txt 2>&1
       say "$1 exact=$2 rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$1-$2.json | grep -v " cpu \|gpu:" | tee -a "$S"
       grep -o "f64 sums[^;]*" $OUT/t/$1-$2.txt | sort | uniq -c | head -3 | tee -a "$S"
     }
     inf resnet50 early 1,32 fp32-nhwc-graph,fp32-graph
     inf resnet50 all 1,32 fp32-nhwc-graph,fp32-graph
     for mode in off early all; do for st in fp32-nhwc-graph fp32-graph; do
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c GPUKIT_EXACT_SUMS=$mode timeout 100 .device/gpukit profile infer --onnx $W/resnet50.onnx \
         --batch-size 32 --strategy $st --group-by op --top 8 > $OUT/t/profile-r50-$mode-$st.txt 2>&1
       say "profile resnet50 b32 $st exact=$mode rc=$?: $(grep -E 'Step without' $OUT/t/profile-r50-$mode-$st.txt | cut -c1-100)"
       grep "f64 sums" $OUT/t/profile-r50-$mode-$st.txt | cut -c1-150 | head -4 | tee -a "$S"
     done; done
     for m in mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny; do
       inf $m early 32 fp32-nhwc-graph; inf $m off 32 fp32-nhwc-graph
     done
     timeout 150 python3 scripts/precision_floor.py --device cuda --batch 64 --onnx-dir $W resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny > $OUT/t/floor-cuda.jsonl 2>$OUT/t/floor.err
     say "precision floor rc=$?"; cat $OUT/t/floor-cuda.jsonl | cut -c1-400 | tee -a "$S" ;;
  # C: the per-step choice (GPUKIT_EXACT_SUMS default: timed, f64 sums kept within 1.25x of
  #    cuDNN's plan). GPU tests; the six models' fp32 rows (both layouts, b1 and b32) with the
  #    choices traced; ResNet-50's profile at b32 (its f32 check now against float64)
  C) tests gpu_program
     grep -o "exact sums:.*" $OUT/t/gpu_program.log | tee -a "$S"
     W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for m in resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny; do
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c GPUKIT_TRACE=1 GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/$m.onnx \
         --device cuda:0 --batch-sizes 1,32 --strategies fp32-nhwc-graph,fp32-graph --gpu-iterations 100 --save-json $OUT/t/$m-timed.json > $OUT/t/$m-timed.txt 2>&1
       say "$m timed rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$m-timed.json | grep -v " cpu \|gpu:" | tee -a "$S"
       python3 -c "
import json,sys
d=json.load(open('$OUT/t/$m-timed.json'))['result']
for r in d['rows']:
    if r['device']!='cpu': print('   ', r['strategy'], 'b%d'%r['batch'], 'from float64', '%.1e'%r['float64']['max_rel'], 'ORT', '%.1e'%r['float64']['onnxruntime_max_rel'])
" | tee -a "$S"
       say "   choices: $(grep -c 'f64 sums$' $OUT/t/$m-timed.txt) f64 sums, $(grep -c ': cuDNN$' $OUT/t/$m-timed.txt) cuDNN (distinct shapes, all four rows)"
     done
     grep "f32 conv" $OUT/t/resnet50-timed.txt | cut -c1-200 | head -60 > $OUT/t/resnet50-choices.txt
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c timeout 100 .device/gpukit profile infer --onnx $W/resnet50.onnx \
       --batch-size 32 --strategy fp32-nhwc-graph --group-by op --top 10 > $OUT/t/profile-r50-timed.txt 2>&1
     say "profile resnet50 b32 fp32-nhwc-graph rc=$?: $(grep -E 'Step without' $OUT/t/profile-r50-timed.txt | cut -c1-100)"
     grep -E "│ [a-z]" $OUT/t/profile-r50-timed.txt | cut -c1-170 | head -12 | tee -a "$S" ;;
  # D: which default: every convolution summed in f64 (all) against the timed choice with a
  #    margin of 2 (timed:2), the six models' fp32 rows; ResNet-50 fp16 beside PyTorch at
  #    b1/b32/b256 on the final code (the stem's conversion of decision 181)
  D) W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for m in resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny; do
       for mode in timed:2 all; do
         [ $m = resnet50 ] && [ $mode = all ] && continue
         f=$OUT/t/$m-${mode%%:*}.json
         env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c GPUKIT_TRACE=1 GPUKIT_EXACT_SUMS=$mode GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/$m.onnx \
           --device cuda:0 --batch-sizes 1,32 --strategies fp32-nhwc-graph,fp32-graph --gpu-iterations 100 --save-json $f > ${f%.json}.txt 2>&1
         say "$m $mode rc=$?; choices: $(grep -c 'f64 sums$' ${f%.json}.txt) f64 sums, $(grep -c ': cuDNN$' ${f%.json}.txt) cuDNN"
         python3 -c "
import json
d=json.load(open('$f'))['result']
for r in d['rows']:
    if r['device']!='cpu': print('   ', r['strategy'], 'b%d'%r['batch'], r['status']['status'], r.get('images_per_s') and round(r['images_per_s']), '/s from float64', '%.1e'%r['float64']['max_rel'], 'ORT', '%.1e'%r['float64']['onnxruntime_max_rel'])
" | tee -a "$S"
       done
     done
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c16 GPUKIT_ORT_LIB=$ORT timeout 100 .device/gpukit infer --onnx $W/resnet50.onnx \
       --device cuda:0 --batch-sizes 1,32,256 --strategies fp16-nhwc-graph --gpu-iterations 20 > $OUT/t/r50-first.txt 2>&1
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c16 GPUKIT_ORT_LIB=$ORT timeout 240 .device/gpukit infer --onnx $W/resnet50.onnx \
       --device cuda:0 --batch-sizes 1,32,256 --strategies fp16-nhwc-graph --gpu-iterations 200 \
       --compare-pytorch --torchvision resnet50 --save-json $OUT/t/resnet50-beside-pytorch.json > $OUT/t/resnet50-beside-pytorch.txt 2>&1
     say "resnet50 beside pytorch rc=$?"; python3 scripts/onnx_rows.py $OUT/t/resnet50-beside-pytorch.json | grep -v " cpu \|gpu:" | tee -a "$S" ;;
  # E: the final default (timed within 1.25x, then the earliest convolutions left on cuDNN
  #    moved to f64 sums until the outputs on a random input are within 4e-6 of all-f64):
  #    GPU tests; the six models' fp32 rows, both layouts, b1 and b32, choices traced
  E) tests gpu_program
     grep -o "exact sums:.*" $OUT/t/gpu_program.log | head -3 | tee -a "$S"
     W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for m in resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny; do
       f=$OUT/t/$m-final.json
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c GPUKIT_TRACE=1 GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/$m.onnx \
         --device cuda:0 --batch-sizes 1,32 --strategies fp32-nhwc-graph,fp32-graph --gpu-iterations 100 --save-json $f > ${f%.json}.txt 2>&1
       say "$m final rc=$?; choices: $(grep -c 'f64 sums$' ${f%.json}.txt) f64 sums, $(grep -c ': cuDNN$' ${f%.json}.txt) cuDNN"
       grep -o "f32 sums: the timed.*" ${f%.json}.txt | tee -a "$S"
       python3 -c "
import json
d=json.load(open('$f'))['result']
for r in d['rows']:
    if r['device']!='cpu': print('   ', r['strategy'], 'b%d'%r['batch'], r['status']['status'], r.get('images_per_s') and round(r['images_per_s']), '/s from float64', '%.1e'%r['float64']['max_rel'], 'ORT', '%.1e'%r['float64']['onnxruntime_max_rel'])
" | tee -a "$S"
     done ;;
esac
tar -C "$OUT" -czf "$OUT/t.tar.gz" t && rm -rf "$OUT/t"
say "== done $(date -u +%FT%TZ)"
