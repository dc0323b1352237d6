#!/usr/bin/env bash
# On the lent GPU machine, over the binaries staged in .device/ (../shared/tools/stage-for-device.sh):
#   bash scripts/gpu-stress.sh
# `gpukit stress` and `bench matmul --search` on the GPU(s), about 5-6 minutes on one H100:
#   1. the stress GPU tests (GPUKIT_REQUIRE_GPU=1): the kernels against the host's patterns
#      (gpu_ops), then a short run that must check every result and the planted fault that must
#      fail GPU 0 (cli);
#   2. `stress --level 1`, timed: must exit 0 within 60 s;
#   3. the planted faults (GPUKIT_STRESS_PLANT_FAULT, for tests only), matmul then memory: each
#      must exit 1 naming cuda:0;
#   4. `bench matmul --search --dtype bf16`: the best shape and rate (the H100 target: 780 TFLOP/s
#      or more), kept in the cache folder; then `--dtype fp8` (compute capability 8.9 and newer;
#      mamf-finder's published H100 fp8 best: 1,402.6 TFLOP/s), kept beside it, after the fp8
#      GPU test (cuBLASLt's fp8 candidates against float64, gpu_ops gpu::fp8);
#   5. `stress --level 2 --duration 90`: whether sw_power_cap was seen, and the rates against the
#      searched ceiling just kept;
#   6. with two GPUs or more, `stress --duration 20`: the peer copies and the NCCL all-reduce
#      (with one, that the output says they did not run).
# Writes summary.txt and every output under $OUT; prints the summary as it goes. LD_LIBRARY_PATH
# is removed for every gpukit process: gpukit must find CUDA by itself.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
TESTS=${GPUKIT_TESTS:-$PWD/.device/tests}
W=$(mktemp -d)
mkdir -p "$OUT"; SUMMARY=$OUT/summary.txt; : >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# one cache for the whole script: the search's ceiling is read by the level-2 run
g() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH XDG_CACHE_HOME="$W/cache" "$@"; }
FAILS=0
check() { if [ "$1" = ok ]; then say "  OK   $2"; else say "  FAIL $2"; FAILS=$((FAILS + 1)); fi; }

say "== gpu-stress $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv,noheader | tr '\n' ';')"

# 1. the GPU tests: the kernels (gpu_ops), then the command (cli)
for t in "$TESTS"/gpu_ops-* "$TESTS"/cli-*; do
  [ -x "$t" ] || continue
  name=$(basename "$t"); name=${name%%-*}
  t0=$(date +%s%N)
  g env GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN="$BIN" timeout 240 "$t" gpu::stress >"$OUT/tests-stress-$name.txt" 2>&1
  rc=$?
  say "stress GPU tests rc=$rc wall $(ms_since "$t0") ms ($(basename "$t") gpu::stress)"
  grep -E "^test |test result" "$OUT/tests-stress-$name.txt" | tee -a "$SUMMARY"
  [ $rc = 0 ] && check ok "$name GPU tests" || check fail "$name GPU tests (see tests-stress-$name.txt)"
done

# 2. level 1, timed
t0=$(date +%s%N)
g timeout 300 "$BIN" stress --level 1 --save-json "$OUT/stress-level1.json" >"$OUT/stress-level1.txt" 2>"$OUT/stress-level1.err"
rc=$?; ms=$(ms_since "$t0")
say "stress --level 1 rc=$rc wall $ms ms"
[ $rc = 0 ] && check ok "level 1 passes" || check fail "level 1 passes: $(tail -1 "$OUT/stress-level1.err")"
[ "$ms" -le 60000 ] && check ok "level 1 within 60 s" || check fail "level 1 within 60 s"

summarise() {
  python3 - "$1" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
d = json.load(open(sys.argv[1]))
r = d["result"]
print(f"  ok={d['ok']} elapsed {r['elapsed_s']:.1f} s; failure: {d['failure']}")
for g in r["gpus"]:
    v = g["verdict"]
    print(f"  cuda:{g['ordinal']} {g['name']}: {v['verdict']} {[x for x in v.get('reasons', [])]} warnings {v['warnings']}")
    for m in g["matmul"]:
        print(f"    matmul {m['dtype']}: {m['tflops'] and round(m['tflops'], 1)} TFLOP/s "
              f"(min {m['tflops_min'] and round(m['tflops_min'], 1)}), {m['products']} products, "
              f"{m['repeat_words_differing']} words differing, % datasheet {m['pct_of_peak'] and round(m['pct_of_peak'])}, "
              f"% searched {m['pct_of_achievable'] and round(m['pct_of_achievable'])}, error {m['error']} skipped {m['skipped']}")
    mem = g["memory"] or {}
    passes = sum(p["passes"] for p in mem.get("passes", []))
    print(f"    memory: {mem.get('tested_bytes', 0) / 2**30:.1f} GiB of {mem.get('free_bytes', 0) / 2**30:.1f} free, "
          f"{passes} passes, {sum(p['words_wrong'] for p in mem.get('passes', []))} wrong, error {mem.get('error')} shortfall {mem.get('shortfall')}")
    for c in g["copies"]:
        print(f"    copy {c['direction']}: {c['gbs'] and round(c['gbs'], 1)} GB/s ({c['pct_of_link'] and round(c['pct_of_link'])}% of link), verified {c['verified']}, error {c['error']}")
    w = g["watched"]
    print(f"    nvml: {w['samples']} readings, max {w['max_temperature_c']} C, max {w['max_power_w']} W of {w['power_limit_w']}, "
          f"SM {w['sm_clock_min_mhz']}-{w['sm_clock_max_mhz']} MHz, throttle {[(t['name'], round(t['share'], 2)) for t in w['throttle_seen']]}, "
          f"xid {w['xid_events']} (unreadable: {w['xid_unreadable']}), unreadable: {w['unreadable']}")
    print(f"    health before {g['health_before']}")
    print(f"    health after  {g['health_after']}")
PY
}
[ -s "$OUT/stress-level1.json" ] && summarise "$OUT/stress-level1.json"

# 3. the planted faults: exit 1 naming cuda:0
for fault in matmul memory; do
  t0=$(date +%s%N)
  g env GPUKIT_STRESS_PLANT_FAULT="$fault:0" timeout 120 "$BIN" stress --duration 10 \
    >"$OUT/stress-planted-$fault.txt" 2>"$OUT/stress-planted-$fault.err"
  rc=$?
  say "planted $fault:0 rc=$rc wall $(ms_since "$t0") ms: $(grep -m1 '^error' "$OUT/stress-planted-$fault.err" | cut -c1-220)"
  if [ $rc = 1 ] && grep -q "cuda:0 failed: wrong result in $fault" "$OUT/stress-planted-$fault.err"; then
    check ok "planted $fault fault fails cuda:0"
  else
    check fail "planted $fault fault fails cuda:0"
  fi
done

# 4. the search
t0=$(date +%s%N)
g timeout 400 "$BIN" bench matmul --search --dtype bf16 --save-json "$OUT/search.json" >"$OUT/search.txt" 2>"$OUT/search.err"
rc=$?
say "bench matmul --search --dtype bf16 rc=$rc wall $(ms_since "$t0") ms"
[ $rc = 0 ] && check ok "search ran, every shape checked" || check fail "search: $(tail -1 "$OUT/search.err")"
python3 - "$OUT/search.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
r = json.load(open(sys.argv[1]))["result"]
for d in r["dtypes"]:
    b = d["best"] or {}
    print(f"  {d['dtype']}: best {b.get('tflops') and round(b['tflops'], 1)} TFLOP/s at {b.get('m')}x{b.get('n')}x{b.get('k')}; "
          f"median {d['median_tflops'] and round(d['median_tflops'], 1)} (p10 {d['p10_tflops'] and round(d['p10_tflops'], 1)}, "
          f"p90 {d['p90_tflops'] and round(d['p90_tflops'], 1)}) over {d['shapes_measured']} shapes; "
          f"H100 target 780: {'met' if (b.get('tflops') or 0) >= 780 else 'NOT met'}")
for row in r["rows"]:
    st = row["status"]
    print(f"    {row['dtype']} {row['m']}x{row['n']}x{row['k']}: {row['tflops'] and round(row['tflops'], 1)} {st['status']} {st.get('why', '')[:100]} {row['backend']}")
print(f"  kept in: {r['kept_in']}; not kept: {r['not_kept']}")
PY

# 4b. fp8: the GPU test (ignored, with the reason, below compute capability 8.9), then the search
for t in "$TESTS"/gpu_ops-*; do
  [ -x "$t" ] || continue
  g env GPUKIT_REQUIRE_GPU=1 timeout 120 "$t" gpu::fp8 >"$OUT/tests-fp8.txt" 2>&1
  rc=$?
  say "fp8 GPU test rc=$rc ($(basename "$t") gpu::fp8)"
  grep -E "^test |fp8 cuBLASLt|ignored:|test result" "$OUT/tests-fp8.txt" | tee -a "$SUMMARY"
  [ $rc = 0 ] && check ok "fp8 GPU test" || check fail "fp8 GPU test (see tests-fp8.txt)"
done
t0=$(date +%s%N)
g timeout 400 "$BIN" bench matmul --search --dtype fp8 --save-json "$OUT/search-fp8.json" >"$OUT/search-fp8.txt" 2>"$OUT/search-fp8.err"
rc=$?
say "bench matmul --search --dtype fp8 rc=$rc wall $(ms_since "$t0") ms"
if [ $rc = 0 ]; then
  check ok "fp8 search ran, every shape checked"
elif grep -q "needs compute capability 8.9" "$OUT/search-fp8.err"; then
  say "  SKIP fp8 search: this GPU has no fp8 (below compute capability 8.9); not a pass"
else
  check fail "fp8 search: $(tail -1 "$OUT/search-fp8.err")"
fi
python3 - "$OUT/search-fp8.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
r = json.load(open(sys.argv[1]))["result"]
MAMF_H100_FP8 = 1402.6  # mamf-finder's published H100 SXM fp8 best (TFLOP/s)
for d in r["dtypes"]:
    b = d["best"] or {}
    t = b.get("tflops")
    print(f"  {d['dtype']}: best {t and round(t, 1)} TFLOP/s at {b.get('m')}x{b.get('n')}x{b.get('k')} "
          f"({t and d['peak_tflops'] and round(100 * t / d['peak_tflops'])}% of the datasheet's {d['peak_tflops']}); "
          f"median {d['median_tflops'] and round(d['median_tflops'], 1)} over {d['shapes_measured']} shapes; "
          f"mamf-finder's H100 fp8 {MAMF_H100_FP8}: {t and round(100 * t / MAMF_H100_FP8)}%")
for row in r["rows"]:
    st = row["status"]
    v = row.get("verification") or {}
    print(f"    {row['dtype']} {row['m']}x{row['n']}x{row['k']}: {row['tflops'] and round(row['tflops'], 1)} {st['status']} "
          f"{st.get('why', '')[:120]} err {v.get('rel_err')} tol {v.get('tolerance')} {row['backend']}")
print(f"  kept in: {r['kept_in']}; not kept: {r['not_kept']}")
PY

# 5. level 2, shortened: the power cap held, rates against the searched ceiling
t0=$(date +%s%N)
g timeout 300 "$BIN" stress --level 2 --duration 90 --save-json "$OUT/stress-level2.json" >"$OUT/stress-level2.txt" 2>"$OUT/stress-level2.err"
rc=$?
say "stress --level 2 --duration 90 rc=$rc wall $(ms_since "$t0") ms"
[ $rc = 0 ] && check ok "level 2 (90 s) passes" || check fail "level 2 (90 s): $(tail -1 "$OUT/stress-level2.err")"
[ -s "$OUT/stress-level2.json" ] && summarise "$OUT/stress-level2.json"
python3 - "$OUT/stress-level2.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
for g in json.load(open(sys.argv[1]))["result"]["gpus"]:
    seen = {t["name"]: t["share"] for t in g["watched"]["throttle_seen"]}
    cap = seen.get("sw_power_cap")
    print(f"  cuda:{g['ordinal']}: sw_power_cap {'seen in %.0f%% of readings' % (100 * cap) if cap else 'not seen'}")
PY
# 6. with two GPUs or more: the tests between them (peer copies, the NCCL all-reduce)
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
if [ "$NGPU" -ge 2 ]; then
  t0=$(date +%s%N)
  g timeout 300 "$BIN" stress --duration 20 --save-json "$OUT/stress-multi.json" >"$OUT/stress-multi.txt" 2>"$OUT/stress-multi.err"
  rc=$?
  say "stress --duration 20 on $NGPU GPUs rc=$rc wall $(ms_since "$t0") ms"
  [ $rc = 0 ] && check ok "$NGPU GPUs pass, between them too" || check fail "$NGPU GPUs: $(tail -1 "$OUT/stress-multi.err")"
  python3 - "$OUT/stress-multi.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
r = json.load(open(sys.argv[1]))["result"]
m = r.get("multi_gpu") or {}
for c in m.get("peer_copies", []):
    print(f"  copy cuda:{c['from']} -> cuda:{c['to']} {c['link']}: {c['gbs'] and round(c['gbs'], 1)} GB/s ({c['pct_of_link'] and round(c['pct_of_link'])}%), verified {c['verified']}, peer access {c['peer_access']}, error {c['error']}")
a = m.get("all_reduce")
if a: print(f"  all-reduce {a['gpus']}: wrong {a['wrong']} over {a['rounds']} rounds, busbw {a['busbw_gbs'] and round(a['busbw_gbs'], 1)} GB/s, error {a['error']}")
print(f"  not run: {r.get('multi_gpu_not_run')}")
PY
else
  say "one GPU: the tests between GPUs are not exercised here (the output says they did not run)"
  grep -q "not run (not passed): one GPU tested" "$OUT/stress-level1.txt" && check ok "one GPU: says the tests between GPUs did not run" || check fail "one GPU: the not-run line"
fi
say "== gpu-stress done: $FAILS check(s) failed"
rm -rf "$W"
