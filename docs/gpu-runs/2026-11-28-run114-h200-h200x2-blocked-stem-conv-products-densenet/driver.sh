#!/usr/bin/env bash
# Run 114 (session 36) calls N1, N2, D, F, Y, P (call 6 was an inline command, see README), from the repository root on the lent GPU machine, binaries staged
# under .device/ (gzipped, carried): .device/gpukit (branch measured), .device/base/gpukit (main),
# .device/tests/*.  `bash .device/drivers.sh N1` (the session ran it as .device/drivers.sh)
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
  say "$t $* rc=$?: $(grep -E '^test result' "$OUT/t/$t.log")"; grep -E "FAILED|panicked|^dw timing|^ln timing|split" "$OUT/t/$t.log" | head -60 | tee -a "$S"
}
export PATH=/opt/torch/.venv/bin:$PATH
case $CALL in
  # Y (next session, nvidia-h200-x2): branch pipe-inbox (.device/alt/pipe-inbox) against main
  Y) export NCCL_NVLS_ENABLE=0; A=.device/alt/pipe-inbox
     timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 $A/gpu_train --test-threads 1 --nocapture pipeline > $OUT/t/gpu_train.log 2>&1
     say "gpu_train pipeline rc=$?: $(grep 'test result' $OUT/t/gpu_train.log)"; grep -E 'stages|FAILED|failed|panicked' $OUT/t/gpu_train.log | head -8 | tee -a "$S"
     P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
     i=0
     for v in base:bf16:40 new:bf16:40 new:bf16:40 base:bf16:40 new:fp32:20 base:fp32:20; do
       i=$((i+1)); which=${v%%:*}; rest=${v#*:}; prec=${rest%%:*}; steps=${rest#*:}
       bin=$A/gpukit; [ $which = base ] && bin=.device/base/gpukit
       timeout 150 env -u LD_LIBRARY_PATH $bin train $P --precision $prec --steps $steps --save-json $OUT/t/pp-$i-$which-$prec.json > $OUT/t/pp-$i-$which-$prec.txt 2>&1
       say "pp $i $which $prec rc=$?"
       python3 - $OUT/t/pp-$i-$which-$prec.json <<'PY2' 2>&1 | tee -a "$S"
import json, sys
r = json.load(open(sys.argv[1]))["result"]; d = r.get("pipeline") or {}; one = d.get("one_gpu") or {}
print(f"  bubble {d.get('bubble', 0):.3f} (schedule {d.get('bubble_schedule', 0):.3f}) samples/s {d.get('samples_per_s', 0):.0f} alone {d.get('alone_step_ms')} step {d.get('step_ms')}"
      + (f" | one GPU {one.get('samples_per_s', 0):.0f} losses within {one.get('max_loss_rel_diff', 0):.1e}" if one else ""))
PY2
     done ;;
  # N1, N2 (session 35's, for the next): branch verify-next3 (verify-next2 + onnx-iterations
  #    + blocked stem + 1x1 as products + gpukit's convolution kernel) against main, in turns:
  #    base (main), new (defaults), nostem (GPUKIT_NO_BLOCKED_STEM=1), noown
  #    (GPUKIT_OWN_CONV=never), g1 (GPUKIT_CONV1X1_GEMM=1); N1 the GPU tests, ResNet-50 at 1, 32,
  #    256 and ConvNeXt-T; N2 MobileNetV3, EfficientNet and profiles
  N1|N2) W=$(mktemp -d)
     if [ $CALL = N1 ]; then GPUKIT_GEMM_TIMINGS=1 tests gpu_program; tests gpu_engine; MODELS="resnet50 convnext_tiny"
     else MODELS="mobilenet_v3_large efficientnet_b0"; fi
     # shellcheck disable=SC2086
     (cd scripts && python3 export_torchvision.py "$W" $MODELS) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for m in $MODELS; do
       B=1,32; [ $m = resnet50 ] && B=1,32,256
       ORDER="new nostem noown g1 base base g1 noown nostem new"; [ $m = convnext_tiny ] && ORDER="new nostem noown base base noown nostem new"
       i=0
       for which in $ORDER; do
         i=$((i+1)); bin=.device/gpukit; [ $which = base ] && bin=.device/base/gpukit
         E="GPUKIT_TRACE=1"
         case $which in nostem) E="$E GPUKIT_NO_BLOCKED_STEM=1";; noown) E="$E GPUKIT_OWN_CONV=never";; g1) E="$E GPUKIT_CONV1X1_GEMM=1";; esac
         # shellcheck disable=SC2086
         env -u LD_LIBRARY_PATH $E XDG_CACHE_HOME=$W/cache-$which GPUKIT_ORT_LIB=$ORT timeout 150 $bin infer --onnx $W/$m.onnx \
           --device cuda:0 --batch-sizes $B --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/$m-$i-$which.json > $OUT/t/$m-$i-$which.txt 2>&1
         say "$m $i $which rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$m-$i-$which.json | grep -v " cpu " | grep -v "gpu:" | tee -a "$S"
       done
       grep "trace: gemm\|trace: conv" $OUT/t/$m-1-new.txt | cut -c1-220 | head -60 > $OUT/t/$m-choices-trace.txt
       say "$m: $(grep -c 'candidate Some(0)' $OUT/t/$m-choices-trace.txt) kept the library's, $(grep -c 'candidate Some([1-9]' $OUT/t/$m-choices-trace.txt) another"
     done
     if [ $CALL = N2 ]; then for which in new noown; do E=; [ $which = noown ] && E="GPUKIT_OWN_CONV=never"
       # shellcheck disable=SC2086
       env -u LD_LIBRARY_PATH $E XDG_CACHE_HOME=$W/cache-$which timeout 120 .device/gpukit profile infer --onnx $W/mobilenet_v3_large.onnx \
         --batch-size 32 --strategy fp16-nhwc-graph --group-by op --top 14 > $OUT/t/profile-mobilenet-b32-$which.txt 2>&1
       say "profile mobilenet b32 $which rc=$?"; grep -E "Step without|Kernel time|│ [a-z]" $OUT/t/profile-mobilenet-b32-$which.txt | head -18 | cut -c1-170 | tee -a "$S"
     done; fi ;;
  # D (session 35's, for the next): DenseNet-121 beside PyTorch's best (issue 33's sixth model),
  #    fp16 NHWC graph at 1 and 32, and its fp32 / bf16 rows against float64 / ONNX Runtime
  D) W=$(mktemp -d)
     (cd scripts && python3 export_torchvision.py "$W" densenet121) > $OUT/t/exports.jsonl 2> $OUT/t/export.err
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 420 .device/gpukit infer --onnx $W/densenet121.onnx \
       --device cuda:0 --batch-sizes 1,32 --strategies fp16-nhwc-graph --gpu-iterations 300 --compare-pytorch --torchvision densenet121 \
       --save-json $OUT/t/densenet121-pytorch.json > $OUT/t/densenet121-pytorch.txt 2>&1
     say "densenet121 beside PyTorch rc=$?"; python3 scripts/onnx_rows.py $OUT/t/densenet121-pytorch.json | grep -v " cpu \|gpu:\|same model" | tee -a "$S"
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 150 .device/gpukit infer --onnx $W/densenet121.onnx \
       --device cuda:0 --batch-sizes 1,32 --strategies fp32-graph,bf16-nhwc-graph --gpu-iterations 50 \
       --save-json $OUT/t/densenet121-precisions.json > $OUT/t/densenet121-precisions.txt 2>&1
     say "densenet121 fp32/bf16 rc=$?"; python3 scripts/onnx_rows.py $OUT/t/densenet121-precisions.json | grep -v " cpu \|gpu:" | tee -a "$S" ;;
  # F (session 35's, for the next): PyTorch's own precision floors on the GPU (fp32 against
  #    float64, fp16/bf16 top-1 against fp32, ONNX Runtime's CPU f32 beside), six models
  F) W=$(mktemp -d)
     (cd scripts && python3 export_torchvision.py "$W") > /dev/null 2>&1
     timeout 500 python3 scripts/precision_floor.py --device cuda --batch 64 --onnx-dir "$W" resnet50 mobilenet_v3_large \
       efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny > $OUT/t/floor-cuda.jsonl 2> $OUT/t/floor-cuda.err
     say "precision floors rc=$?"; cat $OUT/t/floor-cuda.jsonl | tee -a "$S" ;;
  # P (session 36): 1x1 convolutions timed as cuBLASLt's products beside cuDNN and gpukit's
  #    kernel (new) against c4d1874 (base: the blocked stem's fix, own kernel timed), base
  #    with 1x1 convolutions lowered to Gemm steps (g1); the fixture test with the new variant
  P) tests gpu_program every_fixture
     W=$(mktemp -d)
     (cd scripts && python3 export_torchvision.py "$W" resnet50 efficientnet_b0 densenet121) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for m in resnet50 efficientnet_b0 densenet121; do
       B=1,32; ORDER="new base base new"
       [ $m = resnet50 ] && B=1,32,256 && ORDER="new base g1 g1 base new"
       [ $m = densenet121 ] && ORDER="new base"
       i=0
       for which in $ORDER; do
         i=$((i+1)); bin=.device/gpukit; [ $which != new ] && bin=.device/base/gpukit
         E="GPUKIT_TRACE=1"; [ $which = g1 ] && E="$E GPUKIT_CONV1X1_GEMM=1"
         # shellcheck disable=SC2086
         env -u LD_LIBRARY_PATH $E XDG_CACHE_HOME=$W/cache-$which GPUKIT_ORT_LIB=$ORT timeout 100 $bin infer --onnx $W/$m.onnx \
           --device cuda:0 --batch-sizes $B --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/$m-$i-$which.json > $OUT/t/$m-$i-$which.txt 2>&1
         say "$m $i $which rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$m-$i-$which.json | grep -v " cpu " | grep -v "gpu:" | tee -a "$S"
       done
       grep "trace: conv" $OUT/t/$m-1-new.txt | cut -c1-260 > $OUT/t/$m-choices-trace.txt
       say "$m: $(grep -c 'candidate Some(0)' $OUT/t/$m-choices-trace.txt) kept cuDNN, $(grep -c 'candidate Some([1-9]' $OUT/t/$m-choices-trace.txt) another"
       grep -i "plan\|seconds" $OUT/t/$m-1-new.txt | head -3 | tee -a "$S"
     done ;;
esac
tar -C "$OUT" -czf "$OUT/t.tar.gz" t && rm -rf "$OUT/t"
say "== done $(date -u +%FT%TZ)"
