#!/usr/bin/env bash
# Run 116 (session 38) calls, from the repository root on the lent GPU machine, binaries staged
# under .device/ (gzipped, carried): .device/gpukit (main), .device/base/gpukit (run 115's code),
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
  # A: main's two unmeasured changes (global averages towards 1,024 blocks; the depthwise
  #    epilogue as vectors) against run 115's code, in turns; GPU tests; EfficientNet beside
  #    PyTorch; cold wall times (first run of each binary) say what planning costs
  A) GPUKIT_DW_TIMINGS=1 tests gpu_program
     grep "^dw timing\|^gap" $OUT/t/gpu_program.log | tee -a "$S"
     MODELS="efficientnet_b0 mobilenet_v3_large convnext_tiny" BATCHES=1,32 PYTORCH=1 PROFILE_BATCHES=32 \
       OUT=$OUT/t bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/0-summary.txt >> $S ;;
  # B: the fused depthwise + layer norm (.device/gpukit) against main without it
  #    (.device/base/gpukit), in turns; GPU tests with the kernels' timings; the picks
  #    (trace); ConvNeXt beside PyTorch; profiles at batch 1 and 32
  B) GPUKIT_DW_TIMINGS=1 tests gpu_program
     grep "^dw norm timing" $OUT/t/gpu_program.log | tee -a "$S"
     MODELS="convnext_tiny" BATCHES=1,32 PYTORCH=1 PROFILE_BATCHES="1 32" PROFILE_BASE=1 \
       OUT=$OUT/t bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/0-summary.txt >> $S
     W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" convnext_tiny) > /dev/null 2>&1
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c GPUKIT_TRACE=1 timeout 200 .device/gpukit infer --onnx $W/convnext_tiny.onnx \
       --device cuda:0 --batch-sizes 1,32 --strategies fp16-nhwc-graph,bf16-nhwc-graph,fp32-nhwc-graph --gpu-iterations 50 > $OUT/t/trace.txt 2>&1
     say "trace run rc=$?"; grep -E "depthwise \+ layer norm|ok |FAIL" $OUT/t/trace.txt | cut -c1-330 | tee -a "$S" ;;
  # C: B again with the fused kernel's loads in flight together and the input's blocks
  #    converted a thread a group of 8 channels
  C) GPUKIT_DW_TIMINGS=1 tests gpu_program
     grep "^dw norm timing" $OUT/t/gpu_program.log | tee -a "$S"
     MODELS="convnext_tiny" BATCHES=1,32 PYTORCH=1 PROFILE_BATCHES="1 32" \
       OUT=$OUT/t bash scripts/gpu-onnx-ab.sh > /dev/null 2>&1
     cat $OUT/t/0-summary.txt >> $S
     W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" convnext_tiny) > /dev/null 2>&1
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/c GPUKIT_TRACE=1 timeout 200 .device/gpukit infer --onnx $W/convnext_tiny.onnx \
       --device cuda:0 --batch-sizes 1,32 --strategies fp16-nhwc-graph,bf16-nhwc-graph,fp32-nhwc-graph --gpu-iterations 50 > $OUT/t/trace.txt 2>&1
     say "trace run rc=$?"; grep -E "depthwise \+ layer norm|ok |FAIL" $OUT/t/trace.txt | cut -c1-330 | tee -a "$S" ;;
  # D: the final code (main + the input's blocks a thread a group of 8 channels): GPU tests;
  #    ConvNeXt-T, EfficientNet-B0, ResNet-50 and MobileNetV3-L beside PyTorch; ConvNeXt's
  #    profile at batch 1 and 32 (the input conversion's row)
  D) tests gpu_program
     W=$(mktemp -d); (cd scripts && python3 export_torchvision.py "$W" convnext_tiny efficientnet_b0 resnet50 mobilenet_v3_large) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for b in 1 32; do
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache timeout 100 .device/gpukit profile infer --onnx $W/convnext_tiny.onnx \
         --batch-size $b --strategy fp16-nhwc-graph --group-by op --top 40 > $OUT/t/profile-convnext-b$b.txt 2>&1
       say "profile convnext b$b rc=$?: $(grep -E 'Step without' $OUT/t/profile-convnext-b$b.txt | cut -c1-110)"
       grep "convert input" $OUT/t/profile-convnext-b$b.txt | cut -c1-160 | tee -a "$S"
     done
     for m in convnext_tiny efficientnet_b0 resnet50 mobilenet_v3_large; do
       B=1,32; [ $m = resnet50 ] && B=1,32,256
       # a first run fills the choice cache, as a user's second run finds it (first runs of
       # ConvNeXt at batch 1 were ~6% slower in calls B and C)
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 100 .device/gpukit infer --onnx $W/$m.onnx \
         --device cuda:0 --batch-sizes $B --strategies fp16-nhwc-graph --gpu-iterations 20 > $OUT/t/$m-first.txt 2>&1
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/$m.onnx \
         --device cuda:0 --batch-sizes $B --strategies fp16-nhwc-graph --gpu-iterations 200 \
         --compare-pytorch --torchvision $m --save-json $OUT/t/$m-beside-pytorch.json > $OUT/t/$m-beside-pytorch.txt 2>&1
       say "$m rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$m-beside-pytorch.json | grep -v " cpu \|gpu:" | tee -a "$S"
     done ;;
esac
tar -C "$OUT" -czf "$OUT/t.tar.gz" t && rm -rf "$OUT/t"
say "== done $(date -u +%FT%TZ)"
