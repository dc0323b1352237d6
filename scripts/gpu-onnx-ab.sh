#!/usr/bin/env bash
# On the lent GPU machine, over two staged gpukit binaries: .device/gpukit ("new") and
# $GPUKIT_BASE (default .device/base/gpukit, "base"):
#   MODELS="convnext_tiny mobilenet_v3_large" BATCHES=1,32 bash scripts/gpu-onnx-ab.sh
# torchvision's classifiers exported (scripts/export_torchvision.py), each run by both binaries
# in turns (base new new base) with `infer --onnx --device cuda:0 --strategies fp16-nhwc-graph`
# (every row checked against ONNX Runtime), each binary with its own choice cache; then the
# first model's profile by op at each batch of PROFILE_BATCHES (default 1) on the new binary
# (and the base one with PROFILE_BASE=1), and, with PYTORCH=1, the first model
# beside PyTorch (`--compare-pytorch --torchvision`). Writes 0-summary.txt (first, so a call
# that returns few files brings it back) and ab.tar.gz under $OUT.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
NEW=${GPUKIT_BIN:-$PWD/.device/gpukit}
BASE=${GPUKIT_BASE:-$PWD/.device/base/gpukit}
MODELS=${MODELS:-convnext_tiny}
BATCHES=${BATCHES:-1,32}
STRATEGY=${STRATEGY:-fp16-nhwc-graph}
W=$(mktemp -d)
mkdir -p "$OUT/ab"; S=$OUT/0-summary.txt; : >>"$S"
say() { echo "$*" | tee -a "$S"; }
export PATH=/opt/torch/.venv/bin:$PATH
ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])' 2>/dev/null)
say "== gpu-onnx-ab $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); models: $MODELS"
# shellcheck disable=SC2086
(cd scripts && python3 export_torchvision.py "$W" $MODELS) 2>"$OUT/ab/export.err" | cut -c1-100 | tee -a "$S"
rows() { python3 scripts/onnx_rows.py "$1" 2>&1 | grep -v " cpu " | tee -a "$S"; }
run() { # which model name extra-args...
  local which=$1 m=$2 name=$3; shift 3
  local bin=$NEW; [ "$which" = base ] && bin=$BASE
  local t0; t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH XDG_CACHE_HOME="$W/cache-$which" GPUKIT_ORT_LIB="$ORT" timeout 300 "$bin" \
    infer --onnx "$W/$m.onnx" --device cuda:0 --batch-sizes "$BATCHES" --strategies "$STRATEGY" "$@" \
    --save-json "$OUT/ab/$name.json" >"$OUT/ab/$name.txt" 2>&1
  say "$m $which rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms $*"
  rows "$OUT/ab/$name.json"
}
for m in $MODELS; do
  [ -f "$W/$m.onnx" ] || { say "$m: not exported"; continue; }
  i=0
  for which in base new new base; do
    i=$((i + 1)); run "$which" "$m" "$m-$i-$which" --gpu-iterations 200
  done
done
first=${MODELS%% *}
# the first model's profile by op at each batch of PROFILE_BATCHES (default 1), on the new
# binary, and on the base one too with PROFILE_BASE=1
# (PROFILE_BATCHES=none: no profile)
for b in ${PROFILE_BATCHES:-1}; do
  [ "$b" = none ] && continue
  for which in new $([ "${PROFILE_BASE:-0}" = 1 ] && echo base); do
    bin=$NEW; [ "$which" = base ] && bin=$BASE
    f="$OUT/ab/profile-$first-b$b-$which.txt"
    env -u LD_LIBRARY_PATH XDG_CACHE_HOME="$W/cache-$which" timeout 120 "$bin" profile infer --onnx "$W/$first.onnx" \
      --batch-size "$b" --strategy "$STRATEGY" --group-by op --top 12 >"$f" 2>&1
    say "profile $first b$b $which rc=$?"
    grep -E "Step without|│ [a-z]" "$f" | head -16 | cut -c1-180 | tee -a "$S"
  done
done
[ "${PYTORCH:-0}" = 1 ] && run new "$first" "$first-pytorch" --compare-pytorch --torchvision "$first"
tar -C "$OUT" -czf "$OUT/ab.tar.gz" ab && rm -rf "$OUT/ab"
