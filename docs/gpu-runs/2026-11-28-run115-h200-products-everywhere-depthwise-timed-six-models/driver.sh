#!/usr/bin/env bash
# Run 115 (session 37) calls, from the repository root on the lent GPU machine, binaries staged
# under .device/ (gzipped, carried): .device/gpukit (branch measured), .device/base/gpukit (main),
# .device/tests/*.  `bash .device/drivers.sh Q`
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
W=$(mktemp -d)
ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
infer() { # tag binary env batches model [extra args...]
  local tag=$1 bin=$2 e=$3 b=$4 m=$5; shift 5
  # shellcheck disable=SC2086
  env -u LD_LIBRARY_PATH $e XDG_CACHE_HOME=$W/cache-${tag%%-*} GPUKIT_ORT_LIB=$ORT timeout 400 $bin infer --onnx $W/$m.onnx \
    --device cuda:0 --batch-sizes $b --strategies ${STRATS:-fp16-nhwc-graph} --gpu-iterations ${ITERS:-300} --save-json $OUT/t/$m-$tag.json "$@" > $OUT/t/$m-$tag.txt 2>&1
  say "$m $tag rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$m-$tag.json | grep -v " cpu \|gpu:" | tee -a "$S"
}
prof() { # tag binary env model batch
  local tag=$1 bin=$2 e=$3 m=$4 b=$5
  # shellcheck disable=SC2086
  env -u LD_LIBRARY_PATH $e XDG_CACHE_HOME=$W/cache-$tag timeout 150 $bin profile infer --onnx $W/$m.onnx \
    --batch-size $b --strategy fp16-nhwc-graph --group-by op --top 45 > $OUT/t/profile-$m-b$b-$tag.txt 2>&1
  say "profile $m b$b $tag rc=$?"; grep -E "Step without|Kernel time" $OUT/t/profile-$m-b$b-$tag.txt | cut -c1-120 | tee -a "$S"
}
case $CALL in
  # Q: GPU program tests on main's unmeasured refactors; product offered at every 1x1 (new)
  #    against main (base) and main with 1x1 lowered to Gemm (g1), in turns; new beside
  #    PyTorch; profiles of the three models below 1.3x, gpukit's and PyTorch's
  Q) tests gpu_program
     (cd scripts && python3 export_torchvision.py "$W" resnet50 efficientnet_b0 mobilenet_v3_large regnet_y_800mf) > /dev/null 2>&1
     i=0
     for which in new base g1 g1 base new; do
       i=$((i+1)); bin=.device/gpukit; [ $which = base ] && bin=.device/base/gpukit
       E="GPUKIT_TRACE=1"; [ $which = g1 ] && E="$E GPUKIT_CONV1X1_GEMM=1"
       infer $which-$i $bin "$E" 1,32,256 resnet50
     done
     grep "trace: conv" $OUT/t/resnet50-new-1.txt | cut -c1-260 > $OUT/t/resnet50-choices-trace.txt
     say "resnet50: $(grep -c 'candidate Some(0)' $OUT/t/resnet50-choices-trace.txt) kept cuDNN, $(grep -c 'candidate Some([1-9]' $OUT/t/resnet50-choices-trace.txt) another"
     i=0
     for which in new base base new; do
       i=$((i+1)); bin=.device/gpukit; [ $which = base ] && bin=.device/base/gpukit
       infer $which-$i $bin "" 1,32 efficientnet_b0
     done
     infer new-pt .device/gpukit "" 1,32,256 resnet50 --compare-pytorch --torchvision resnet50 ;;
  # R: profiles of the three models below 1.3x, gpukit's and PyTorch's, Nsight Compute on
  #    MobileNet's depthwise kernels and global averages
  R) (cd scripts && python3 export_torchvision.py "$W" resnet50 efficientnet_b0 mobilenet_v3_large regnet_y_800mf) > /dev/null 2>&1
     for m in mobilenet_v3_large efficientnet_b0 regnet_y_800mf; do prof new .device/gpukit "" $m 32; done
     prof new .device/gpukit "" resnet50 256; prof g1 .device/gpukit GPUKIT_CONV1X1_GEMM=1 resnet50 256
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-ncu GPUKIT_ORT_LIB=$ORT timeout 240 ncu --clock-control none \
       -k regex:'depthwise|gap_cl' --launch-count 20 --section SpeedOfLight --section Occupancy --section LaunchStats \
       --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis .device/gpukit infer \
       --onnx $W/mobilenet_v3_large.onnx --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 2 \
       > $OUT/t/ncu-mobilenet-b32.txt 2>&1
     say "ncu mobilenet b32 rc=$?"
     for m in mobilenet_v3_large efficientnet_b0; do
       timeout 200 python3 scripts/pytorch_profile_classifier.py $m 32 20 40 > $OUT/t/pytorch-profile-$m-b32.txt 2>$OUT/t/pytorch-profile-$m.err
       say "pytorch profile $m rc=$?: $(head -1 $OUT/t/pytorch-profile-$m-b32.txt)"
     done ;;
  # S: branch dw-next (.device/dev: depthwise kernels timed per shape, stride-2 row and fixed
  #    kernels, global averages with blocks enough) against verify-next4 (.device/gpukit), in turns
  S) GPUKIT_DW_TIMINGS=1 tests gpu_program
     grep "^dw timing" $OUT/t/gpu_program.log | tee -a "$S"
     (cd scripts && python3 export_torchvision.py "$W" mobilenet_v3_large efficientnet_b0 regnet_y_800mf convnext_tiny) > /dev/null 2>&1
     for m in mobilenet_v3_large efficientnet_b0 regnet_y_800mf convnext_tiny; do
       ORDER="dev base base dev"; [ $m = regnet_y_800mf -o $m = convnext_tiny ] && ORDER="dev base"
       i=0
       for which in $ORDER; do
         i=$((i+1)); bin=.device/gpukit; [ $which = dev ] && bin=.device/dev/gpukit
         infer $which-$i $bin GPUKIT_TRACE=1 1,32 $m
       done
       grep "trace: depthwise" $OUT/t/$m-dev-1.txt | cut -c1-400 > $OUT/t/$m-dw-choices.txt
       say "$m: $(grep -c 'kept None' $OUT/t/$m-dw-choices.txt) depthwise shapes kept the rule's kernel, $(grep -c 'kept Some' $OUT/t/$m-dw-choices.txt) another"
     done
     prof dev .device/dev/gpukit "" mobilenet_v3_large 32
     prof dev .device/dev/gpukit "" efficientnet_b0 32 ;;
  # T: dw-next with cheaper Sigmoid / SiLU / HardSwish (.device/dev2) against dw-next (.device/dev)
  #    in turns; dev2's fp32 and bf16 rows against ONNX Runtime
  T) tests gpu_program
     (cd scripts && python3 export_torchvision.py "$W" mobilenet_v3_large efficientnet_b0) > /dev/null 2>&1
     for m in mobilenet_v3_large efficientnet_b0; do
       i=0
       for which in dev2 dev dev dev2; do
         i=$((i+1)); bin=.device/$which/gpukit
         infer $which-$i $bin "" 1,32 $m
       done
       STRATS=fp32-graph,bf16-nhwc-graph ITERS=50 infer dev2-precisions .device/dev2/gpukit "" 1,32 $m
     done
     prof dev2 .device/dev2/gpukit "" efficientnet_b0 32 ;;
  # U: the final binary beside PyTorch's best (torch.compile + CUDA graphs, CUDA graph, compile)
  U) (cd scripts && python3 export_torchvision.py "$W" ${MODELS:-mobilenet_v3_large efficientnet_b0 regnet_y_800mf}) > /dev/null 2>&1
     for m in ${MODELS:-mobilenet_v3_large efficientnet_b0 regnet_y_800mf}; do
       infer final-pt .device/${BIN:-dev2}/gpukit "" 1,32 $m --compare-pytorch --torchvision $m
     done ;;
esac
tar -C "$OUT" -czf "$OUT/t.tar.gz" t && rm -rf "$OUT/t"
say "== done $(date -u +%FT%TZ)"
