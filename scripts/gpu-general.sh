#!/usr/bin/env bash
# On the lent GPU machine, over the binaries staged in .device/ (gpukit, and test binaries such
# as gpu_program-*, infer_cli-*, gpu_cnn-* and gpu_train-* in .device/tests):
#   PART=tests|a|b|strict|top1|profile bash scripts/gpu-general.sh
# strict: fp32 rows only (judged against float64); top1: fp16's top-1 agreement on 256 images,
#   gpukit's and PyTorch's;
# tests: every test binary staged in .device/tests (the general engine's GPU tests: every
#   fixture, precision, layout, eager and graph; the CLI's GPU tests, filtered to gpu::; the
#   training crate's);
# a, b: torchvision's six classifiers exported (scripts/export_torchvision.py), each through
#   `gpukit infer --onnx` on the general engine (ONNX Runtime's outputs the reference of every
#   row) at batch 1 and 32. a: resnet50 (general and hand-built),
#   mobilenet_v3_large, efficientnet_b0; b: regnet_y_800mf, densenet121, convnext_tiny. PyTorch
#   runs the same model with the same weights beside each (`--compare-pytorch --torchvision`:
#   its counterparts of the rows, its CUDA graph and torch.compile).
# HANDBUILT=0 skips the hand-built ResNet-50 row of PART=a.
# XDG_CACHE_HOME is .device/cache, so choices planned in one call serve the next (the first
#   call's planning is cold).
set -u
OUT=${OUT:-$PWD/gpu-run-out}
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
W=$(mktemp -d)
# 0-summary.txt sorts first: the device tool returns a limited number of files, alphabetically,
# and a call that runs past its limit must still bring the summary back
mkdir -p "$OUT" .device/cache; SUMMARY=$OUT/0-summary.txt; : >>"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
export PATH=/opt/torch/.venv/bin:$PATH
ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])' 2>/dev/null)
export GPUKIT_ORT_LIB=$ORT XDG_CACHE_HOME=$PWD/.device/cache GPUKIT_BIN=$BIN GPUKIT_REQUIRE_GPU=1
say "== gpu-general PART=${PART:-a} $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); onnxruntime: ${ORT:-not found}"
g() {
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH timeout 280 "$BIN" "$@" --save-json "$OUT/$name.json" >"$OUT/$name.txt" 2>"$OUT/$name.err"
  say "$name rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms: gpukit $*"
  python3 scripts/onnx_rows.py "$OUT/$name.json" 2>/dev/null | tee -a "$SUMMARY"
}
case "${PART:-a}" in
resnet)
  (cd scripts && python3 export_torchvision.py "$W" resnet50) 2>"$OUT/export-resnet.err" | cut -c1-120 | tee -a "$SUMMARY"
  for i in 1 2; do
    g "general-resnet50-$i" infer --onnx "$W/resnet50.onnx" --batch-sizes 1,32,128 --device all \
      --strategies fp32,fp16-nhwc,fp16-nhwc-graph --iterations 3
  done
  g "handbuilt-resnet50" infer --onnx "$W/resnet50.onnx" --resnet-engine --batch-sizes 1,32,128 --device all \
    --strategies fp32,fp16-nhwc-graph --iterations 3
  ;;
profile)
  MODELS=${MODELS:-"efficientnet_b0 densenet121 convnext_tiny resnet50"}
  (cd scripts && python3 export_torchvision.py "$W" $MODELS) 2>"$OUT/export-profile.err" | cut -c1-120 | tee -a "$SUMMARY"
  for m in $MODELS; do
    for by in ${BYS:-op kernel}; do
      t0=$(date +%s%N)
      env -u LD_LIBRARY_PATH timeout 200 "$BIN" profile infer --onnx "$W/$m.onnx" --batch-size 32 \
        --strategy fp16-nhwc-graph --group-by $by --top 12 >"$OUT/profile-$m-$by.txt" 2>"$OUT/profile-$m-$by.err"
      say "profile $m by $by rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
      grep -vE "^\s*$" "$OUT/profile-$m-$by.txt" | head -40 | cut -c1-200 | tee -a "$SUMMARY"
      tail -3 "$OUT/profile-$m-$by.err" | tee -a "$SUMMARY"
    done
  done
  rm -f "$OUT"/profile-*.txt
  ;;
strict)
  # fp32 rows only, judged against float64 (and ONNX Runtime beside), no PyTorch
  MODELS=${MODELS:-resnet50}
  (cd scripts && python3 export_torchvision.py "$W" $MODELS) 2>"$OUT/export-strict.err" | cut -c1-120 | tee -a "$SUMMARY"
  for m in $MODELS; do
    g "strict-$m" infer --onnx "$W/$m.onnx" --batch-sizes 1,32 --device cuda:0 --strategies fp32
  done
  ;;
top1)
  # fp16's top-1 agreement with f32 on 256 random images: gpukit against ONNX Runtime's f32,
  # PyTorch's fp16 against its own fp32 (scripts/top1_fp16.py)
  MODELS=${MODELS:-"mobilenet_v3_large resnet50"}
  (cd scripts && python3 export_torchvision.py "$W" $MODELS) 2>"$OUT/export-top1.err" | cut -c1-120 | tee -a "$SUMMARY"
  for m in $MODELS; do
    g "top1-$m" infer --onnx "$W/$m.onnx" --batch-sizes 256 --device cuda:0 --strategies fp16-nhwc-graph --gpu-iterations 10
  done
  (cd scripts && python3 top1_fp16.py --images 256 $MODELS) 2>"$OUT/top1-pytorch.err" | tee -a "$SUMMARY"
  ;;
tests)
  for t in .device/tests/*; do
    [ -x "$t" ] || continue
    t0=$(date +%s)
    filter=""; case "$t" in *infer_cli*) filter="gpu::";; *gpu_cnn*) filter="--nocapture";; esac
    env -u LD_LIBRARY_PATH timeout 400 "$t" --test-threads 1 $filter >"$OUT/$(basename "$t").log" 2>&1
    rc=$?
    say "$(basename "$t") rc=$rc $(( $(date +%s) - t0 )) s: $(grep -E '^test result' "$OUT/$(basename "$t").log")"
    grep -E "FAILED|failed|panicked" "$OUT/$(basename "$t").log" | head -20 | cut -c1-600 | tee -a "$SUMMARY"
  done
  ;;
a|b)
  if [ "${PART:-a}" = a ]; then DEFAULT="resnet50 mobilenet_v3_large efficientnet_b0"; else DEFAULT="regnet_y_800mf densenet121 convnext_tiny"; fi
  MODELS=${MODELS:-$DEFAULT}
  (cd scripts && python3 export_torchvision.py "$W" $MODELS) 2>"$OUT/export-$PART.err" | cut -c1-200 | tee -a "$SUMMARY"
  for m in $MODELS; do
    [ -f "$W/$m.onnx" ] || { say "$m: not exported"; continue; }
    g "general-$m" infer --onnx "$W/$m.onnx" --batch-sizes 1,32 --device all \
      --strategies fp32,fp16-nhwc,fp16-nhwc-graph --iterations 3 \
      --compare-pytorch --torchvision "$m" --torchvision-weights "$W/$m.safetensors"
  done
  if [ -f "$W/resnet50.onnx" ] && [ "${HANDBUILT:-1}" = 1 ]; then
    g "handbuilt-resnet50" infer --onnx "$W/resnet50.onnx" --resnet-engine --batch-sizes 1,32 --device all \
      --strategies fp32,fp16-nhwc-graph --iterations 3
  fi
  ;;
esac
# what comes back is limited in count: the summary and the JSON reports (each error file's
# last lines go into the summary first)
for f in "$OUT"/*.err; do
  [ -s "$f" ] || continue
  echo "-- $(basename "$f"):" >>"$SUMMARY"; grep -v "planning convolutions" "$f" | tail -5 >>"$SUMMARY"
done
find "$OUT" -name '*.err' -delete
rm -f "$OUT"/*.txt.keep "$OUT"/general-*.txt "$OUT"/handbuilt-*.txt
