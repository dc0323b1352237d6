#!/usr/bin/env bash
# Runs on the lent GPU machine from the project root, over binaries staged by
# ../shared/tools/stage-for-device.sh into .device/ (no Rust toolchain is needed there):
#   bash scripts/gpu-test.sh
# Writes logs and JSON under $OUT (default: ./gpu-run-out) and prints a short summary last.
# LD_LIBRARY_PATH is removed for every gpukit process: gpukit must find CUDA by itself.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
mkdir -p "$OUT"
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
TESTS=${GPUKIT_TESTS:-$PWD/.device/tests}
LOG=$OUT/gpu-test.log
SUMMARY=$OUT/summary.txt
: >"$LOG"; : >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }

say "== gpu-test $(date -u +%FT%TZ) on $(hostname)"
say "ambient LD_LIBRARY_PATH (removed for gpukit): ${LD_LIBRARY_PATH:-<unset>}"
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.free,compute_cap,clocks.max.sm,clocks.max.mem,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,power.draw,power.limit,temperature.gpu,utilization.gpu,driver_version --format=csv >"$OUT/nvidia-smi.txt" 2>&1
nvidia-smi >>"$OUT/nvidia-smi.txt" 2>&1
cat "$OUT/nvidia-smi.txt" | head -3 | tee -a "$SUMMARY"

# 1. check, human and JSON, with no help from the environment
clean "$BIN" check >"$OUT/check.txt" 2>&1; say "check rc=$?"
clean "$BIN" check --json --library-versions >"$OUT/check.json" 2>>"$LOG"; say "check --json rc=$?"

# 1b. gpukit's figures against nvidia-smi's, field by field
python3 - "$OUT/check.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, subprocess, sys
r = json.load(open(sys.argv[1]))
fields = "index,name,uuid,pci.bus_id,memory.total,compute_cap,clocks.max.sm,clocks.max.mem,pcie.link.gen.max,pcie.link.width.max,power.limit,driver_version"
rows = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.strip().splitlines()
bad = 0
for g, row in zip(r["gpus"], rows):
    s = [x.strip() for x in row.split(",")]
    nv = g["nvml"] or {}
    pairs = [("name", g["name"], s[1]), ("uuid", g["uuid"], s[2]), ("pci bus id", g["pci_bus_id"], s[3]),
             ("memory total MiB", str(nv.get("memory_total_bytes", 0) >> 20), s[4]),
             ("compute capability", "%d.%d" % tuple(g["compute_capability"]), s[5]),
             ("max SM clock MHz", str(g["max_sm_clock_mhz"]), s[6]), ("max memory clock MHz", str(g["max_memory_clock_mhz"]), s[7]),
             ("PCIe gen max", str(nv.get("pcie_gen_max")), s[8]), ("PCIe width max", str(nv.get("pcie_width_max")), s[9]),
             ("power limit W", "%.2f" % nv.get("power_limit_w", 0), "%.2f" % float(s[10])), ("driver", r["driver"]["version"], s[11])]
    for name, ours, theirs in pairs:
        ok = ours == theirs; bad += not ok
        print(f"  {'agree ' if ok else 'DIFFER'} {name:22} gpukit={ours!s:42} nvidia-smi={theirs}")
print(f"nvidia-smi comparison: {'all fields agree' if bad == 0 else str(bad) + ' field(s) differ'}")
PY
clean GPUKIT_TRACE=1 "$BIN" check >/dev/null 2>>"$LOG"
echo "start-up phases (GPUKIT_TRACE=1, second run):" | tee -a "$SUMMARY"
clean GPUKIT_TRACE=1 "$BIN" check 2>&1 >/dev/null | tee -a "$SUMMARY"
echo "start-up phases of check --quick:" | tee -a "$SUMMARY"
clean GPUKIT_TRACE=1 "$BIN" check --quick 2>&1 >/dev/null | tee -a "$SUMMARY"
python3 - <<'PY' 2>&1 | tee -a "$SUMMARY"
import ctypes, time
t = time.perf_counter(); lib = ctypes.CDLL("libcuda.so.1"); t1 = time.perf_counter(); rc = lib.cuInit(0); t2 = time.perf_counter()
print(f"floor: cuInit alone from python ctypes: {1e3*(t2-t1):.1f} ms (rc={rc}); dlopen libcuda {1e3*(t1-t):.1f} ms")
PY
if [ -x "$PWD/.device/gpukit-cuda12" ]; then
  clean "$PWD/.device/gpukit-cuda12" check >"$OUT/check-cuda12-build.txt" 2>&1
  say "CUDA 12 build: check rc=$? ($(grep -c MISSING "$OUT/check-cuda12-build.txt") libraries reported missing; see check-cuda12-build.txt)"
fi

# 2. start-to-exit time of check (20 runs) against importing torch (3 runs)
python3 - "$BIN" <<'PY' 2>&1 | tee -a "$SUMMARY"
import os, subprocess, sys, time, statistics
env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "GPUKIT_CUDA_PATH")}
def wall(cmd, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True); ts.append(time.perf_counter() - t)
    return ts
g = wall([sys.argv[1], "check"], 20); gj = wall([sys.argv[1], "check", "--json"], 20)
gq = wall([sys.argv[1], "check", "--quick"], 20)
t = wall([sys.executable, "-c", "import torch; torch.cuda.is_available(); torch.cuda.get_device_properties(0)"], 3)
print(f"gpukit check: median {statistics.median(g)*1e3:.1f} ms, min {min(g)*1e3:.1f}, max {max(g)*1e3:.1f} (20 runs)")
print(f"gpukit check --json: median {statistics.median(gj)*1e3:.1f} ms (20 runs)")
print(f"gpukit check --quick: median {statistics.median(gq)*1e3:.1f} ms, min {min(gq)*1e3:.1f}, max {max(gq)*1e3:.1f} (20 runs)")
print(f"python3 import torch + get_device_properties: median {statistics.median(t)*1e3:.0f} ms (3 runs)")
PY

# 3. bad input
clean "$BIN" check --device cuda:9 >>"$LOG" 2>&1; say "check --device cuda:9 rc=$? (want 2)"
env -u LD_LIBRARY_PATH GPUKIT_CUDA_PATH=/nowhere "$BIN" check --json >/dev/null 2>>"$LOG"; say "GPUKIT_CUDA_PATH=/nowhere rc=$? (want 0 + warning)"
clean "$BIN" check --frobnicate >>"$LOG" 2>&1; say "check --frobnicate rc=$? (want 2)"

# 4. every test binary, GPU tests required to run
fails=0
for t in "$TESTS"/*; do
  [ -x "$t" ] || continue
  echo "== $(basename "$t")" >>"$LOG"
  clean GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN="$BIN" "$t" >>"$LOG" 2>&1
  rc=$?; [ $rc -eq 0 ] || fails=$((fails+1))
  say "test $(basename "$t"): rc=$rc $(grep -E '^test result' "$LOG" | tail -1)"
done

# 5. the main job
start=$(date +%s%N)
clean "$BIN" all --out "$OUT/report" >>"$LOG" 2>&1; rc=$?
say "all rc=$rc in $(( ($(date +%s%N) - start) / 1000000 )) ms"
cp "$OUT/report/report.json" "$OUT/report.json" 2>/dev/null; cp "$OUT/report/report.md" "$OUT/report.md" 2>/dev/null; rm -rf "$OUT/report"

say "== failing test binaries: $fails"
cat "$OUT/check.txt"
echo; cat "$SUMMARY"
