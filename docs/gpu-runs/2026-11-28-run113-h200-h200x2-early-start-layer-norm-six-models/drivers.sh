#!/usr/bin/env bash
# Run 113 (session 34) calls, from the repository root on the lent GPU machine, binaries staged
# under .device/ (gzipped, carried): .device/gpukit (branch measured), .device/base/gpukit (main),
# .device/tests/*.  `bash .device/drivers.sh H`
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
tests() { # test-binary [filter] (GPU tests, each on a fresh kernel cache)
  local t=$1; shift
  timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) .device/tests/$t "$@" --test-threads 1 --nocapture > "$OUT/t/$t.log" 2>&1
  say "$t $* rc=$?: $(grep -E '^test result' "$OUT/t/$t.log")"; grep -E "FAILED|panicked|^dw timing|^ln timing|split" "$OUT/t/$t.log" | head -60 | tee -a "$S"
}
export PATH=/opt/torch/.venv/bin:$PATH
resnet_ab() { # ResNet-50 builtin engine, base new new base
  local W; W=$(mktemp -d); local i=0
  for which in base new new base; do
    i=$((i+1)); bin=.device/gpukit; [ $which = base ] && bin=.device/base/gpukit
    env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-$which timeout 200 $bin infer --device cuda:0 --batch-sizes 1,32,256 \
      --strategies fp16-nhwc-graph --gpu-iterations 200 --save-json $OUT/t/r50-$i-$which.json > $OUT/t/r50-$i-$which.txt 2>&1
    say "r50 $i $which rc=$?"; python3 - $OUT/t/r50-$i-$which.json <<'PY' | tee -a "$S"
import json, sys
d = json.load(open(sys.argv[1])); r = d["result"]
if d.get("failure"): print("  FAILURE:", d["failure"])
for x in r.get("rows") or []:
    if x.get("images_per_s") and x.get("device") != "cpu": print(f"  {x['strategy']:18} batch {x['batch']:4} {x['images_per_s']:10.1f} img/s")
PY
  done
}
case $CALL in
  H) tests gpu_ops lt_
     tests gpu
     GPUKIT_DW_TIMINGS=1 GPUKIT_LN_TIMINGS=1 tests gpu_program
     tests gpu_engine
     GPUKIT_TRACE=1 MODELS="convnext_tiny" PYTORCH=1 PROFILE_BATCHES="1 32" bash scripts/gpu-onnx-ab.sh
     resnet_ab ;;
  X) T=$(mktemp -d); export NCCL_NVLS_ENABLE=0
     timeout 200 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 .device/tests/gpu_train --test-threads 1 --nocapture pipeline > $OUT/t/gpu_train.log 2>&1
     say "gpu_train pipeline rc=$?: $(grep 'test result' $OUT/t/gpu_train.log)"; grep -E 'stages|FAILED|failed|panicked' $OUT/t/gpu_train.log | head -8 | tee -a "$S"
     P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
     i=0
     for v in base:bf16:40 new:bf16:40 new:bf16:40 base:bf16:40 new:fp32:20 base:fp32:20; do
       i=$((i+1)); which=${v%%:*}; rest=${v#*:}; prec=${rest%%:*}; steps=${rest#*:}
       bin=.device/gpukit; [ $which = base ] && bin=.device/base/gpukit
       timeout 150 env -u LD_LIBRARY_PATH $bin train $P --precision $prec --steps $steps --save-json $OUT/t/pp-$i-$which-$prec.json > $OUT/t/pp-$i-$which-$prec.txt 2>&1
       say "pp $i $which $prec rc=$?"
       python3 - $OUT/t/pp-$i-$which-$prec.json <<'PY2' 2>&1 | tee -a "$S"
import json, sys
r = json.load(open(sys.argv[1]))["result"]; d = r.get("pipeline") or {}; one = d.get("one_gpu") or {}
print(f"  bubble {d.get('bubble', 0):.3f} (schedule {d.get('bubble_schedule', 0):.3f}) samples/s {d.get('samples_per_s', 0):.0f}"
      + (f" | one GPU {one.get('samples_per_s', 0):.0f} losses within {one.get('max_loss_rel_diff', 0):.1e}" if one else ""))
PY2
     done ;;
  # I: early start (programmatic dependent launch) for depthwise + layer norm, with the layer
  #    norm's late loads from 1,024 rows: new, new with GPUKIT_NO_EARLY_START=1 ("off"), main
  #    ("base"), in turns, three models, 300 iterations
  I) GPUKIT_DW_TIMINGS=1 tests gpu_program
     tests gpu_engine
     W=$(mktemp -d)
     (cd scripts && python3 export_torchvision.py "$W" convnext_tiny mobilenet_v3_large efficientnet_b0) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for m in convnext_tiny mobilenet_v3_large efficientnet_b0; do
       i=0
       for which in base new off new off base; do
         i=$((i+1)); bin=.device/gpukit; [ $which = base ] && bin=.device/base/gpukit
         off=0; [ $which = off ] && off=1
         env -u LD_LIBRARY_PATH GPUKIT_NO_EARLY_START=$off XDG_CACHE_HOME=$W/cache-$which GPUKIT_ORT_LIB=$ORT timeout 150 $bin infer --onnx $W/$m.onnx \
           --device cuda:0 --batch-sizes 1,32 --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/$m-$i-$which.json > $OUT/t/$m-$i-$which.txt 2>&1
         say "$m $i $which rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$m-$i-$which.json | grep -v " cpu " | grep -v "gpu:" | tee -a "$S"
       done
     done
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-new timeout 120 .device/gpukit profile infer --onnx $W/convnext_tiny.onnx \
       --batch-size 1 --strategy fp16-nhwc-graph --group-by op --top 12 > $OUT/t/profile-b1-new.txt 2>&1
     say "profile b1 new rc=$?"; grep -E "Step without|Kernel time|GPU idle|│ [a-z]" $OUT/t/profile-b1-new.txt | head -18 | cut -c1-180 | tee -a "$S" ;;
  # J, K: the six models on the final code beside PyTorch (eager, CUDA graph, torch.compile,
  #    torch.compile with CUDA graphs) at batch 1 and 32, fp16 NHWC graph, and the fp32 and bf16
  #    rows against ONNX Runtime; J also the depthwise timings and ConvNeXt-T's profiles
  J|K) W=$(mktemp -d)
     MODELS="convnext_tiny resnet50 mobilenet_v3_large"; [ $CALL = K ] && MODELS="efficientnet_b0 regnet_y_800mf densenet121"
     [ $CALL = J ] && GPUKIT_DW_TIMINGS=1 tests gpu_program
     # shellcheck disable=SC2086
     (cd scripts && python3 export_torchvision.py "$W" $MODELS) > $OUT/t/exports.jsonl 2> $OUT/t/export.err
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for m in $MODELS; do
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 200 .device/gpukit infer --onnx $W/$m.onnx \
         --device cuda:0 --batch-sizes 1,32 --strategies fp16-nhwc-graph --gpu-iterations 300 --compare-pytorch --torchvision $m \
         --save-json $OUT/t/$m-pytorch.json > $OUT/t/$m-pytorch.txt 2>&1
       say "$m beside PyTorch rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$m-pytorch.json | grep -v " cpu \|gpu:\|same model" | tee -a "$S"
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache GPUKIT_ORT_LIB=$ORT timeout 150 .device/gpukit infer --onnx $W/$m.onnx \
         --device cuda:0 --batch-sizes 1,32 --strategies fp32-graph,bf16-nhwc-graph --gpu-iterations 50 \
         --save-json $OUT/t/$m-precisions.json > $OUT/t/$m-precisions.txt 2>&1
       say "$m fp32/bf16 rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$m-precisions.json | grep -v " cpu \|gpu:" | tee -a "$S"
     done
     if [ $CALL = J ]; then for b in 1 32; do
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache timeout 120 .device/gpukit profile infer --onnx $W/convnext_tiny.onnx \
         --batch-size $b --strategy fp16-nhwc-graph --group-by op --top 14 > $OUT/t/profile-convnext-b$b.txt 2>&1
       say "profile convnext b$b rc=$?"; grep -E "Step without|Kernel time|GPU idle|│ [a-z]" $OUT/t/profile-convnext-b$b.txt | head -20 | cut -c1-180 | tee -a "$S"
     done; fi ;;
  # L (next session): verify-next2 (early start for every engine kernel + gpukit's small
  #    products) against main: GPU tests, then four models in turns, the gemm choices traced
  L) GPUKIT_GEMM_TIMINGS=1 tests gpu_program
     tests gpu_engine
     W=$(mktemp -d)
     (cd scripts && python3 export_torchvision.py "$W" convnext_tiny mobilenet_v3_large efficientnet_b0 regnet_y_800mf) > /dev/null 2>&1
     ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])')
     for m in convnext_tiny mobilenet_v3_large efficientnet_b0 regnet_y_800mf; do
       i=0
       for which in base new new base; do
         i=$((i+1)); bin=.device/gpukit; [ $which = base ] && bin=.device/base/gpukit
         env -u LD_LIBRARY_PATH GPUKIT_TRACE=1 XDG_CACHE_HOME=$W/cache-$which GPUKIT_ORT_LIB=$ORT timeout 150 $bin infer --onnx $W/$m.onnx \
           --device cuda:0 --batch-sizes 1,32 --strategies fp16-nhwc-graph --gpu-iterations 300 --save-json $OUT/t/$m-$i-$which.json > $OUT/t/$m-$i-$which.txt 2>&1
         say "$m $i $which rc=$?"; python3 scripts/onnx_rows.py $OUT/t/$m-$i-$which.json | grep -v " cpu " | grep -v "gpu:" | tee -a "$S"
       done
       grep "trace: gemm" $OUT/t/$m-2-new.txt | cut -c1-200 | tee -a "$S"
     done
     env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-new timeout 120 .device/gpukit profile infer --onnx $W/convnext_tiny.onnx \
       --batch-size 1 --strategy fp16-nhwc-graph --group-by op --top 14 > $OUT/t/profile-b1-new.txt 2>&1
     say "profile b1 new rc=$?"; grep -E "Step without|Kernel time|GPU idle|│ [a-z]" $OUT/t/profile-b1-new.txt | head -20 | cut -c1-180 | tee -a "$S" ;;
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
  # M (next session): where the b32 time goes, gpukit (profile by op) and PyTorch's
  #    torch.compile + CUDA graphs (kernels by time), for the four models behind 1.3x
  M) W=$(mktemp -d)
     (cd scripts && python3 export_torchvision.py "$W" mobilenet_v3_large efficientnet_b0 regnet_y_800mf resnet50) > /dev/null 2>&1
     for m in mobilenet_v3_large efficientnet_b0 regnet_y_800mf resnet50; do
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache timeout 150 .device/gpukit profile infer --onnx $W/$m.onnx \
         --batch-size 32 --strategy fp16-nhwc-graph --group-by op --top 15 > $OUT/t/profile-$m-b32.txt 2>&1
       say "gpukit profile $m b32 rc=$?"; grep -E "Step without|Kernel time|│ [a-z]" $OUT/t/profile-$m-b32.txt | head -18 | cut -c1-170 | tee -a "$S"
       timeout 200 python3 scripts/pytorch_profile_classifier.py $m 32 20 18 > $OUT/t/pytorch-profile-$m-b32.txt 2>&1
       say "pytorch profile $m b32 rc=$?"; head -19 $OUT/t/pytorch-profile-$m-b32.txt | cut -c1-170 | tee -a "$S"
     done ;;
esac
tar -C "$OUT" -czf "$OUT/t.tar.gz" t && rm -rf "$OUT/t"
say "== done $(date -u +%FT%TZ)"
