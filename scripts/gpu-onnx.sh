#!/usr/bin/env bash
# On the lent GPU machine, over the binary staged in .device/:
#   bash scripts/gpu-onnx.sh
# Exports torchvision's six classifiers with torch.onnx.export (scripts/export_torchvision.py),
# then `gpukit infer --onnx` on each: gpukit's interpreter and ONNX Runtime at batch 1 (each
# output checked against ONNX Runtime's), and for resnet50 the GPU strategies at batch 1 and 32
# beside the hand-built ResNet-50 on the same engine. Writes summary.txt, the exports' list and
# every report under $OUT.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
W=$(mktemp -d)
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
mkdir -p "$OUT"; SUMMARY=$OUT/summary.txt; : >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
export PATH=/opt/torch/.venv/bin:$PATH
ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])' 2>/dev/null)
say "== gpu-onnx $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); onnxruntime: ${ORT:-not found}"
python3 scripts/export_torchvision.py "$W" 2>"$OUT/export.err" | tee "$OUT/exports.jsonl" | cut -c1-200 | tee -a "$SUMMARY"
g() {
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME="$W/cache" GPUKIT_ORT_LIB="$ORT" timeout 300 "$BIN" "$@" \
    --save-json "$OUT/$name.json" >"$OUT/$name.txt" 2>"$OUT/$name.err"
  say "$name rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms: gpukit $*"
  python3 scripts/onnx_rows.py "$OUT/$name.json" 2>/dev/null | tee -a "$SUMMARY"
}
for m in resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny; do
  [ -f "$W/$m.onnx" ] || { say "$m: not exported"; continue; }
  if [ "$m" = resnet50 ]; then
    g "onnx-$m" infer --onnx "$W/$m.onnx" --batch-sizes 1,32 --device all \
      --strategies cpu,onnxruntime,fp32,fp16-nhwc,fp16-nhwc-graph --iterations 5
    g "handbuilt-resnet50" infer --device cuda:0 --batch-sizes 1,32 \
      --strategies fp32,fp16-nhwc,fp16-nhwc-graph
  else
    g "onnx-$m" infer --onnx "$W/$m.onnx" --batch-sizes 1 --device all \
      --strategies cpu,onnxruntime,fp16-nhwc-graph --iterations 3
  fi
done
