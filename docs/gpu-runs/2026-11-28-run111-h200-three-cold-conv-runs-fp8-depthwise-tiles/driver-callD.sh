#!/usr/bin/env bash
# session 32 call 4 (one H200): depthwise_tile (new) against next without it (base): its GPU
# test against float64; ConvNeXt-T, MobileNetV3-L, EfficientNet-B0 fp16-nhwc-graph at batch 1
# and 32 in turns (base new new base); ConvNeXt-T beside PyTorch (new); its b1 profile
set -u
for f in .device/gpukit.gz .device/base/gpukit.gz .device/tests/*.gz; do gunzip -f $f; done
chmod +x .device/gpukit .device/base/gpukit .device/tests/*
S=$OUT/0-summary.txt; mkdir -p $OUT/r
say() { echo "$*" | tee -a $S; }
T0=$(date +%s); left() { echo $(( 360 - ($(date +%s) - T0) )); }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
timeout 100 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 XDG_CACHE_HOME=$(mktemp -d) .device/tests/gpu_program --test-threads 1 > $OUT/r/gpu_program.log 2>&1
say "gpu_program rc=$?: $(grep -E '^test result' $OUT/r/gpu_program.log)"; grep -E "FAILED|panicked|e-0|e+0" $OUT/r/gpu_program.log | head -12 | tee -a $S
export PATH=/opt/torch/.venv/bin:$PATH
W=$(mktemp -d)
(cd scripts && python3 export_torchvision.py "$W" convnext_tiny mobilenet_v3_large efficientnet_b0) 2> $OUT/r/export.err | cut -c1-100 | tee -a $S
ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])' 2>/dev/null)
run() { # bin-name model args...
  local b=$1 m=$2; shift 2; local bin=.device/gpukit; [ $b = base ] && bin=.device/base/gpukit
  local t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-$b GPUKIT_ORT_LIB=$ORT timeout 150 $bin infer --onnx $W/$m.onnx --device cuda:0 "$@" --save-json $OUT/r/$m-$b.json > $OUT/r/$m-$b.txt 2>&1
  say "$m $b rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms: $*"
  python3 .device/rows.py $OUT/r/$m-$b.json 2>&1 | grep -v " cpu " | tee -a $S
}
for mo in "convnext_tiny base new new base" "mobilenet_v3_large new base" "efficientnet_b0 base new"; do
  set -- $mo; m=$1; shift
  for b in "$@"; do
    [ $(left) -gt 120 ] && run $b $m --batch-sizes 1,32 --strategies fp16-nhwc-graph --gpu-iterations 200
  done
done
say "left $(left) s"
[ $(left) -gt 60 ] && env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-new timeout $(( $(left) - 5 )) .device/gpukit profile infer --onnx $W/convnext_tiny.onnx --batch-size 1 --strategy fp16-nhwc-graph --group-by op --top 12 > $OUT/r/profile-b1.txt 2>&1
grep -E "Step without|depthwise|layer norm" $OUT/r/profile-b1.txt | cut -c1-200 | tee -a $S
[ $(left) -gt 150 ] && run new convnext_tiny --batch-sizes 1,32 --strategies fp16-nhwc-graph --compare-pytorch --torchvision convnext_tiny
say "done, left $(left) s"
cd $OUT && tar czf r.tar.gz r && rm -rf r
