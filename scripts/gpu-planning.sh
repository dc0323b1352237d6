#!/usr/bin/env bash
# On the lent GPU machine, over binaries staged by ../shared/tools/stage-for-device.sh:
#   bash scripts/gpu-planning.sh [first|check|tests|second]
# How long planning takes and what it picks. first: PyTorch's first iteration with
# cudnn.benchmark; gpukit's first infer with an empty choice cache under the fast search, the
# same again warm, then under the exhaustive search; the images/s of both choices (fast,
# exhaustive, exhaustive, fast, on warm caches, at batch 1, 32 and 256); `all --quick` cold; the
# planning GPU tests. check: the fast search cold, warm and at batch 256 against the exhaustive
# one, `all --quick` cold. tests: the GPU tests of planning and the engine, then check.
# second: `bench conv --compare-pytorch` cold, then `all` cold (WITH_ALL=1).
# TEST_BINARIES (tests): which test binaries run; ONLY_TESTS=1: tests without check;
# SKIP_256=1 (check): no batch-256 comparison.
# Each cache is its own XDG_CACHE_HOME under a temporary folder, so "cold" is empty. Writes
# summary.txt and planning.tar.gz under $OUT; prints the summary.
set -u
MODE=${1:-first}
OUT=${OUT:-$PWD/gpu-run-out}
W=$(mktemp -d)
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
TESTS=${GPUKIT_TESTS:-$PWD/.device/tests}
SUMMARY=$OUT/summary.txt
mkdir -p "$OUT"; : >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# gpukit with its own cache folder: run CACHE NAME ARGS...
run() {
  local cache=$1 name=$2; shift 2
  mkdir -p "$W/cache-$cache"
  local t0; t0=$(date +%s%N)
  env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH XDG_CACHE_HOME="$W/cache-$cache" GPUKIT_TRACE=1 \
    timeout 400 "$BIN" "$@" --save-json "$W/$name.json" >"$W/$name.txt" 2>"$W/$name.err"
  local rc=$?
  say "$name rc=$rc wall $(ms_since "$t0") ms: gpukit $*"
  python3 - "$W/$name.json" <<'PY' 2>/dev/null | tee -a "$SUMMARY"
import json, sys
d = json.load(open(sys.argv[1]))["result"]
for p in d.get("planning") or []:
    print(f"  planning {p['what']:22} {p['search']:10} measured {p['measured']:3} cached {p['cached']:3} candidates {p['candidates_timed']:4} {p['seconds']:.2f} s")
for r in d.get("rows") or []:
    if r.get("images_per_s"):
        print(f"  {r['strategy']:18} batch {r['batch']:4} {r['images_per_s']:10.1f} img/s")
PY
}
pack() { tar -C "$W" -czf "$OUT/planning.tar.gz" . ; }

say "== gpu-planning $MODE $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
export PATH=/opt/torch/.venv/bin:$PATH

if [ "$MODE" = first ]; then
  for i in 1 2; do
    say "pytorch first iteration $i: $(python3 scripts/pytorch_first_iteration.py --batch 32 --dtype fp16 --layout nhwc 2>&1 | tail -1)"
  done
  one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
  # shellcheck disable=SC2086
  run fast fast-cold $one
  # shellcheck disable=SC2086
  run fast fast-warm $one
  # shellcheck disable=SC2086
  run exh exh-cold $one --planning exhaustive
  pack
  three="infer --device cuda:0 --batch-sizes 1,32,256 --strategies fp16-nhwc-graph --gpu-iterations 300"
  # shellcheck disable=SC2086
  run fast fast-three-cold $three
  # shellcheck disable=SC2086
  run exh exh-three-cold $three --planning exhaustive
  # both caches warm now: each side's choices timed in both orders
  for order in fast exh exh fast; do
    # shellcheck disable=SC2086
    run "$order" "ab-$order-$RANDOM" $three $([ "$order" = exh ] && echo --planning exhaustive)
  done
  pack
  run quick all-quick-cold all --quick --out "$W/all-quick"
  pack
  for t in gpu_ops gpu_engine; do
    b=$(ls "$TESTS"/"$t"-* 2>/dev/null | head -1)
    [ -n "$b" ] || continue
    t0=$(date +%s%N)
    env -u LD_LIBRARY_PATH XDG_CACHE_HOME="$W/cache-tests" GPUKIT_REQUIRE_GPU=1 timeout 300 "$b" --test-threads 1 >"$W/test-$t.txt" 2>&1
    say "test $t rc=$? in $(ms_since "$t0") ms: $(grep -E '^test result' "$W/test-$t.txt")"
  done
fi

if [ "$MODE" = tests ]; then
  for t in ${TEST_BINARIES:-gpu gpu_ops gpu_engine}; do
    b=$(ls "$TESTS"/"$t"-* 2>/dev/null | head -1)
    [ -n "$b" ] || continue
    t0=$(date +%s%N)
    # the command-line tests run the staged binary (GPUKIT_BIN)
    env -u LD_LIBRARY_PATH XDG_CACHE_HOME="$W/cache-tests" GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN="$BIN" \
      INSTA_WORKSPACE_ROOT="$PWD" timeout 300 "$b" --test-threads 1 >"$W/test-$t.txt" 2>&1
    say "test $t rc=$? in $(ms_since "$t0") ms: $(grep -E '^test result' "$W/test-$t.txt")"
    grep -E "FAILED|failed|panicked" "$W/test-$t.txt" | head -5 | tee -a "$SUMMARY"
  done
  [ "${ONLY_TESTS:-0}" = 1 ] && { pack; exit 0; }
  MODE=check
fi

if [ "$MODE" = check ]; then
  say "pytorch first iteration: $(python3 scripts/pytorch_first_iteration.py --batch 32 --dtype fp16 --layout nhwc 2>&1 | tail -1)"
  one="infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc --gpu-iterations 20"
  # shellcheck disable=SC2086
  run fast fast-cold $one
  # shellcheck disable=SC2086
  run fast fast-warm $one
  grep -E "planning .* convolutions:|finalized ahead|infer cpu|verification|batch-1|timing" "$W/fast-cold.err" | tail -12 | tee -a "$SUMMARY"
  grep -E "trace: +[0-9.]+ ms  infer" "$W/fast-warm.err" | tail -12 | tee -a "$SUMMARY"
  # shellcheck disable=SC2086
  run exh exh-cold $one --planning exhaustive
  for order in fast exh exh fast; do
    # shellcheck disable=SC2086
    run "$order" "ab32-$order-$RANDOM" infer --device cuda:0 --batch-sizes 32 --strategies fp16-nhwc-graph --gpu-iterations 300 $([ "$order" = exh ] && echo --planning exhaustive)
  done
  # which convolutions the two searches chose differently (where the fast choice's images/s go)
  python3 scripts/choice_diff.py "$W/cache-fast" "$W/cache-exh" 2>&1 | head -30 | tee -a "$SUMMARY"
  big="infer --device cuda:0 --batch-sizes 256 --strategies fp16-nhwc-graph --gpu-iterations 200"
  if [ "${SKIP_256:-0}" != 1 ]; then
  # shellcheck disable=SC2086
  run fast fast-256-cold $big
  # shellcheck disable=SC2086
  run exh exh-256-cold $big --planning exhaustive
  for order in fast exh exh fast; do
    # shellcheck disable=SC2086
    run "$order" "ab256-$order-$RANDOM" $big $([ "$order" = exh ] && echo --planning exhaustive)
  done
  fi
  pack
  run quick all-quick-cold all --quick --out "$W/all-quick"
  python3 - "$W/all-quick/report.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
d = json.load(open(sys.argv[1]))
d = d.get("result", d)
print("  all --quick sections:", ", ".join(f"{n} {s:.1f} s" for n, s in d.get("seconds", [])))
PY
  pack
  [ "${WITH_SECOND:-0}" = 1 ] && MODE=second
fi

if [ "$MODE" = second ]; then
  run conv conv-cold bench conv --compare-pytorch
  python3 - "$W/conv-cold.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
d = json.load(open(sys.argv[1]))["result"]
rows = [r for r in d["rows"] if r.get("pytorch") and r["pytorch"].get("ratio")]
low = sorted(rows, key=lambda r: r["pytorch"]["ratio"])[:8]
print(f"  conv rows with a PyTorch ratio: {len(rows)}; under 0.95x: {sum(r['pytorch']['ratio'] < 0.95 for r in rows)}")
for r in low:
    print(f"    {r['name']:36} {r['layout']} {r['dtype']:5} {r['pytorch']['ratio']:.3f}x  {r.get('engine')}")
print("  planning:", d.get("planning"))
PY
  pack
  [ "${WITH_ALL:-0}" = 1 ] && run all all-cold all --out "$W/all"
fi
pack
echo; cat "$SUMMARY"
