#!/usr/bin/env bash
# On the lent GPU machine: one build against another, in one call and in both orders, for a
# change that must not move any figure (a restructuring). Binaries: $GPUKIT_A (default
# .device/base/gpukit) and $GPUKIT_B (default .device/gpukit), each with its own choice cache
# (warmed by an untimed first run). Figures: infer ResNet-50 fp16 NHWC eager and graph at batch
# 32, bench matmul bf16/f16 4096, train of the 4096-wide MLP in bf16, order A B B A.
#   bash scripts/gpu-ab.sh [ab|tests|quick]...   (default: tests ab)
# tests: B's GPU test binaries (GPUKIT_REQUIRE_GPU=1); quick: B's `all --quick`, cold. (Cold
# `bench conv` runs one after the other: scripts/gpu-conv-cold.sh.)
# Writes summary.txt and ab.tar.gz under $OUT; prints the summary.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
W=$(mktemp -d)
A=${GPUKIT_A:-$PWD/.device/base/gpukit}
B=${GPUKIT_B:-$PWD/.device/gpukit}
TESTS=${GPUKIT_TESTS:-$PWD/.device/tests}
SUMMARY=$OUT/summary.txt
mkdir -p "$OUT"; : >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
export PATH=/opt/torch/.venv/bin:$PATH
# run BIN CACHE NAME ARGS...: one gpukit run with its own cache folder; prints its figures
run() {
  local bin=$1 cache=$2 name=$3; shift 3
  mkdir -p "$W/cache-$cache"
  local t0; t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH XDG_CACHE_HOME="$W/cache-$cache" \
    timeout 400 "$bin" "$@" --save-json "$W/$name.json" >"$W/$name.txt" 2>"$W/$name.err"
  local rc=$?
  say "$name rc=$rc wall $(ms_since "$t0") ms: $*"
  python3 - "$W/$name.json" <<'PY' 2>/dev/null | tee -a "$SUMMARY"
import json, sys
d = json.load(open(sys.argv[1]))
r = d["result"]
if d.get("failure"):
    print("  FAILURE:", d["failure"])
for x in r.get("rows") or []:
    if x.get("images_per_s"):
        print(f"  {x['strategy']:18} batch {x['batch']:4} {x['images_per_s']:10.1f} img/s")
    elif x.get("tflops") and x.get("device") != "cpu":
        print(f"  matmul {x['dtype']:5} {x['size']:5} {x['tflops']:8.1f} TFLOP/s")
if "epochs" in r and r.get("epochs"):
    e = [x for x in r["epochs"][1:]] or r["epochs"]
    sps = [x["samples_per_s"] for x in e if x.get("samples_per_s")]
    if sps:
        print(f"  train {r.get('precision')} median {sorted(sps)[len(sps)//2]:.0f} samples/s over {len(sps)} epochs")
PY
}
pack() { tar -C "$W" --exclude='cache-*' -czf "$OUT/ab.tar.gz" . ; }
say "== gpu-ab $* $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
MODES=${*:-tests ab}
INF="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc,fp16-nhwc-graph --gpu-iterations 200"
MM="bench matmul --device cuda:0 --sizes 4096 --dtype bf16,f16 --iterations 50"
TR="train --device cuda:0 --layers 4096,4096,4096,1 --samples 4096 --features 4096 --batch-size 4096 --lr 1e-5 --epochs 20 --precision bf16"
for mode in $MODES; do
  case $mode in
  tests)
    for b in "$TESTS"/*; do
      [ -x "$b" ] || continue
      n=$(basename "$b")
      t0=$(date +%s%N)
      env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH XDG_CACHE_HOME="$W/cache-tests" GPUKIT_REQUIRE_GPU=1 \
        GPUKIT_BIN="$B" INSTA_WORKSPACE_ROOT="$PWD" timeout 300 "$b" >"$W/test-$n.txt" 2>&1
      say "test $n rc=$? in $(ms_since "$t0") ms: $(grep -E '^test result' "$W/test-$n.txt" | tail -1)"
      grep -E "^test .* FAILED|panicked" "$W/test-$n.txt" | head -5 | tee -a "$SUMMARY"
    done
    pack ;;
  ab)
    # first runs plan (cold); they warm each side's cache
    # shellcheck disable=SC2086
    run "$B" b b-cold $INF
    # shellcheck disable=SC2086
    run "$A" a a-cold $INF
    for side in A B B A; do
      bin=$A; [ $side = B ] && bin=$B
      c=$(echo $side | tr AB ab)
      # shellcheck disable=SC2086
      run "$bin" "$c" "$side-infer-$RANDOM" $INF
      # shellcheck disable=SC2086
      run "$bin" "$c" "$side-matmul-$RANDOM" $MM
      # shellcheck disable=SC2086
      run "$bin" "$c" "$side-train-$RANDOM" $TR
    done
    pack ;;
  quick)
    run "$B" quick all-quick-cold all --quick --out "$W/all-quick"
    python3 - "$W/all-quick/report.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
d = json.load(open(sys.argv[1]))
print("  verdict:", d.get("failure") or "every row passed")
d = d.get("result", d)
print("  all --quick sections:", ", ".join(f"{n} {s:.1f} s" for n, s in d.get("seconds", [])), f"total {d.get('total_seconds', 0):.1f} s")
PY
    pack ;;
  esac
done
cat "$SUMMARY" >/dev/null
