#!/usr/bin/env bash
# Runs on the lent GPU machine from the project root, over binaries staged by
# ../shared/tools/stage-for-device.sh into .device/ (no Rust toolchain is needed there):
#   bash scripts/gpu-test.sh [tests|bench|sanitize|train|monitor|guard|all]      (default: all)
# tests: every test binary with GPUKIT_REQUIRE_GPU=1, check (against nvidia-smi), its start-up
#        time, bad input; bench: bench matmul/bandwidth/conv beside PyTorch, then `gpukit all`;
# train (not part of all): the training engine's GPU tests, the 4096-wide MLP beside PyTorch,
#        activation checkpointing's memory; monitor (not part of all): beside nvidia-smi, a
#        command's footprint, /metrics scraped 1,000 times, a frame of the live view;
# guard (not part of all): requests larger than the host or GPU refused before allocating, and
#        the test binaries of the training, engine, profile and bad-input paths;
# sanitize (not part of all: slow): compute-sanitizer memcheck over every command's GPU rows at
#        small sizes, racecheck and synccheck over the inference engine; any error fails.
# Writes under $OUT (default ./gpu-run-out): summary.txt, the main outputs, and gpu-run.tar.gz
# with everything; prints the summary last. LD_LIBRARY_PATH is removed for every gpukit
# process: gpukit must find CUDA by itself.
set -u
MODE=${1:-all}
OUT=${OUT:-$PWD/gpu-run-out}
W=$OUT/work
mkdir -p "$W"
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
TESTS=${GPUKIT_TESTS:-$PWD/.device/tests}
LOG=$W/gpu-test.log
SUMMARY=$OUT/summary.txt
: >"$LOG"; : >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

say "== gpu-test $MODE $(date -u +%FT%TZ) on $(hostname)"
say "ambient LD_LIBRARY_PATH (removed for gpukit): ${LD_LIBRARY_PATH:-<unset>}"
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.free,compute_cap,clocks.max.sm,clocks.max.mem,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,power.draw,power.limit,temperature.gpu,utilization.gpu,driver_version --format=csv >"$W/nvidia-smi.txt" 2>&1
nvidia-smi >>"$W/nvidia-smi.txt" 2>&1
head -2 "$W/nvidia-smi.txt" | tee -a "$SUMMARY"
lscpu 2>/dev/null | grep -E 'Model name|^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|L3' | tee -a "$SUMMARY"

if [ "$MODE" = tests ] || [ "$MODE" = all ]; then
  clean "$BIN" check >"$W/check.txt" 2>&1; say "check rc=$?"
  clean "$BIN" check --json --library-versions >"$W/check.json" 2>>"$LOG"; say "check --json rc=$?"
  # gpukit's figures against nvidia-smi's, field by field
  python3 - "$W/check.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, subprocess, sys
r = json.load(open(sys.argv[1]))["result"]
fields = "index,name,uuid,pci.bus_id,memory.total,compute_cap,clocks.max.sm,clocks.max.mem,pcie.link.gen.max,pcie.link.width.max,power.limit,driver_version"
rows = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.strip().splitlines()
bad = 0
for g, row in zip(r["gpus"], rows):
    s = [x.strip() for x in row.split(",")]
    nv = g["nvml"] or {}
    pairs = [("name", g["name"], s[1]), ("uuid", g["uuid"], s[2]), ("pci bus id", g["pci_bus_id"], s[3]),
             ("memory total MiB", str((g["memory_board_bytes"] or 0) >> 20), s[4]),
             ("compute capability", "%d.%d" % tuple(g["compute_capability"]), s[5]),
             ("max SM clock MHz", str(g["max_sm_clock_mhz"]), s[6]), ("max memory clock MHz", str(g["max_memory_clock_mhz"]), s[7]),
             ("PCIe gen max", str(nv.get("pcie_gen_max")), s[8]), ("PCIe width max", str(nv.get("pcie_width_max")), s[9]),
             ("power limit W", "%.2f" % nv.get("power_limit_w", 0), "%.2f" % float(s[10])), ("driver", r["driver"]["version"], s[11])]
    for name, ours, theirs in pairs:
        ok = ours == theirs; bad += not ok
        print(f"  {'agree ' if ok else 'DIFFER'} {name:22} gpukit={ours!s:42} nvidia-smi={theirs}")
print(f"nvidia-smi comparison: {'all fields agree' if bad == 0 else str(bad) + ' field(s) differ'}")
for l in r["libraries"]:
    print(f"  library {l['name']:12} {'found' if l['found'] else 'MISSING':8} {l['version'] or '-':12} {l['path'] or l['install']}")
PY
  echo "start-up phases (GPUKIT_TRACE=1):" | tee -a "$SUMMARY"
  clean GPUKIT_TRACE=1 "$BIN" check >/dev/null 2>>"$LOG"
  clean GPUKIT_TRACE=1 "$BIN" check 2>&1 >/dev/null | tee -a "$SUMMARY"
  echo "start-up phases of check --quick:" | tee -a "$SUMMARY"
  clean GPUKIT_TRACE=1 "$BIN" check --quick 2>&1 >/dev/null | tee -a "$SUMMARY"
  python3 - "$BIN" <<'PY' 2>&1 | tee -a "$SUMMARY"
import os, subprocess, sys, time, statistics
env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "GPUKIT_CUDA_PATH")}
def wall(cmd, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True); ts.append(time.perf_counter() - t)
    return ts
def report(label):
    for args in (["check"], ["check", "--json"], ["check", "--quick"]):
        g = wall([sys.argv[1]] + args, 20)
        print(f"{label}: gpukit {' '.join(args)}: start to exit median {statistics.median(g)*1e3:.1f} ms, min {min(g)*1e3:.1f}, max {max(g)*1e3:.1f} (20 runs)")
# 1. nothing else holds CUDA (the common case for a user who just runs check)
report("no other CUDA process")
# 2. the floor: cuInit alone, in a fresh process
floor = "import ctypes,time; l=ctypes.CDLL('libcuda.so.1'); t=time.perf_counter(); rc=l.cuInit(0); print(f'{1e3*(time.perf_counter()-t):.1f} ms (rc={rc})')"
print("floor: cuInit alone in a fresh python3 process:", subprocess.run([sys.executable, "-c", floor], capture_output=True, text=True).stdout.strip())
# 3. another process keeps CUDA initialised (a training job, a notebook): cuInit is then cheap
holder = subprocess.Popen([sys.executable, "-c", "import ctypes,time; ctypes.CDLL('libcuda.so.1').cuInit(0); print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
holder.stdout.readline()
report("while another process holds CUDA initialised")
holder.kill()
t = wall([sys.executable, "-c", "import torch; torch.cuda.is_available(); torch.cuda.get_device_properties(0)"], 3)
print(f"python3 -c 'import torch; ...get_device_properties(0)': median {statistics.median(t)*1e3:.0f} ms (3 runs)")
PY
  if [ -x "$PWD/.device/gpukit-cuda12" ]; then
    clean "$PWD/.device/gpukit-cuda12" check >"$W/check-cuda12-build.txt" 2>&1
    say "CUDA 12 build: check rc=$? ($(grep -c MISSING "$W/check-cuda12-build.txt") libraries reported missing: no .so.12 here)"
  fi
  clean "$BIN" check --device cuda:9 >>"$LOG" 2>&1; say "check --device cuda:9 rc=$? (want 2)"
  env -u LD_LIBRARY_PATH GPUKIT_CUDA_PATH=/nowhere "$BIN" check --json >/dev/null 2>>"$LOG"; say "GPUKIT_CUDA_PATH=/nowhere rc=$? (want 0 + warning)"
  clean "$BIN" check --frobnicate >>"$LOG" 2>&1; say "check --frobnicate rc=$? (want 2)"
  clean "$BIN" bench matmul --sizes 0 >>"$LOG" 2>&1; say "bench matmul --sizes 0 rc=$? (want 2)"
  clean "$BIN" bench matmul --matrix-size 150000 --dtype f32 --device cuda:0 >"$W/too-big.txt" 2>&1; say "bench matmul --matrix-size 150000 (270 GB) rc=$? (want 1: nothing measured, the row skipped): $(grep -o 'skipped: [^│]*' "$W/too-big.txt" | head -1)"
  fails=0
  for t in "$TESTS"/*; do
    [ -x "$t" ] || continue
    echo "== $(basename "$t")" >>"$LOG"
    # INSTA_WORKSPACE_ROOT: the snapshot tests find their files in this copy of the tree
    clean GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN="$BIN" INSTA_WORKSPACE_ROOT="$PWD" "$t" >>"$LOG" 2>&1
    rc=$?; [ $rc -eq 0 ] || fails=$((fails+1))
    say "test $(basename "$t"): rc=$rc $(grep -E '^test result' "$LOG" | tail -1)"
  done
  say "== failing test binaries: $fails"
fi

if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  run_bench() { # name, args...
    local name=$1; shift
    local t0; t0=$(date +%s%N)
    clean timeout 400 "$BIN" "$@" --save-json "$W/$name.json" >"$W/$name.txt" 2>>"$LOG"
    local rc=$?
    say "$name rc=$rc in $(ms_since "$t0") ms: gpukit $*"
  }
  run_bench matmul-gpu bench matmul --device cuda:0 --compare-pytorch
  run_bench matmul-cpu bench matmul --device cpu --sizes 1024,4096 --dtype f32,f64,f16 --compare-pytorch
  run_bench bandwidth bench bandwidth --compare-pytorch
  run_bench conv bench conv --compare-pytorch
  run_bench train-regression train --device cuda:0 --preset seed-regression --steps 200 --epochs 13 --compare-pytorch
  run_bench train-classification train --device cuda:0 --preset seed-classification --epochs 200 --compare-pytorch
  t0=$(date +%s%N)
  clean timeout 600 "$BIN" all --out "$W/report" >>"$LOG" 2>&1
  say "all rc=$? in $(ms_since "$t0") ms"
  cp "$W/report/report.md" "$W/all-report.md" 2>/dev/null; cp "$W/report/report.json" "$W/all-report.json" 2>/dev/null
  rm -rf "$W/report"
  for f in matmul-gpu matmul-cpu bandwidth conv train-regression train-classification; do echo; cat "$W/$f.txt"; done | tee -a "$SUMMARY" >/dev/null
fi

if [ "$MODE" = guard ]; then
  # the resource guard on the GPU machine: requests larger than the host or the GPU refused
  # before allocating (wall time and message), then the test binaries whose GPU paths changed
  refuse() { # label, gpukit args...
    local label=$1; shift
    local t0; t0=$(date +%s%N)
    clean timeout 120 "$BIN" "$@" >"$W/refuse-$label.txt" 2>&1
    local rc=$?
    say "refuse $label: rc=$rc in $(ms_since "$t0") ms: gpukit $*"
    grep -E '^error' "$W/refuse-$label.txt" | cut -c1-400 | tee -a "$SUMMARY"
  }
  refuse huge-train train --device cuda:0 --layers 100000,100000,100000,1 --samples 100000 --features 100000
  refuse gpu-only train --device cuda:0 --precision bf16 --optimizer sgd --layers 1024,130000,130000,1 --samples 4096 --features 1024
  refuse profile-cpu profile infer --device cpu --batch-size 100000
  refuse matmul-iterations bench matmul --device cuda:0 --iterations 99999999999
  for name in train_cli gpu_train gpu_engine bad_input profile_cli; do
    t=$(ls "$TESTS"/"$name"-* 2>/dev/null | head -1)
    [ -n "$t" ] || { say "test $name: not staged"; continue; }
    clean GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN="$BIN" INSTA_WORKSPACE_ROOT="$PWD" timeout 200 "$t" --test-threads 1 >"$W/test-$name.txt" 2>&1
    say "test $name: rc=$? $(grep -E '^test result' "$W/test-$name.txt" | tail -1)"
    grep -E "^test .*(ok|FAILED|ignored)$" "$W/test-$name.txt" | tee -a "$SUMMARY" >/dev/null
  done
  grep -hE "^[0-9.]+ s: error" "$W"/test-train_cli.txt | tee -a "$SUMMARY"
fi

if [ "$MODE" = train ]; then
  # the GPU training engine: its tests (checkpointing's bit-for-bit test included), the 4096-wide
  # MLP beside PyTorch, and activation checkpointing's memory on a 9-layer model
  t=$(ls "$TESTS"/gpu_train-* 2>/dev/null | head -1)
  if [ -n "$t" ]; then clean GPUKIT_REQUIRE_GPU=1 timeout 120 "$t" --test-threads 1 >"$W/gpu_train.txt" 2>&1; say "gpu_train rc=$? $(grep -E '^test result' "$W/gpu_train.txt")"; grep -E "^test " "$W/gpu_train.txt" | tee -a "$SUMMARY"; fi
  M="--device cuda:0 --layers 4096,4096,4096,1 --samples 4096 --features 4096 --batch-size 4096 --lr 1e-5 --epochs 20"
  for p in fp32 fp16 bf16; do clean timeout 120 "$BIN" train $M --precision $p --compare-pytorch --save-json "$W/mlp-$p.json" >"$W/mlp-$p.txt" 2>>"$LOG"; say "mlp4096 $p rc=$?"; done
  D="--device cuda:0 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,1 --samples 4096 --features 1024 --batch-size 4096 --epochs 4 --precision bf16 --lr 1e-5"
  clean timeout 60 "$BIN" train $D --save-json "$W/deep.json" >"$W/deep.txt" 2>>"$LOG"; say "deep, all kept rc=$?"
  clean timeout 60 "$BIN" train $D --checkpoint-activations --save-json "$W/deep-ckpt.json" >"$W/deep-ckpt.txt" 2>>"$LOG"; say "deep, checkpointed rc=$?"
fi

if [ "$MODE" = monitor ]; then
  # monitor beside nvidia-smi (the same moments, field by field, and the CPU time of each), a
  # command's footprint at the power cap, /metrics scraped 1,000 times, a frame of the live view
  F=timestamp,index,name,uuid,pci.bus_id,utilization.gpu,utilization.memory,memory.used,memory.total,temperature.gpu,power.draw,power.draw.instant,power.limit,clocks.sm,clocks.mem,clocks_throttle_reasons.active,ecc.errors.uncorrected.volatile.total
  # a load for both to see: a matmul loop in the background
  clean "$BIN" bench matmul --sizes 8192 --dtype bf16 --device cuda:0 --iterations 3000 >/dev/null 2>&1 & LOAD=$!
  sleep 2
  /usr/bin/time -f "%U %S" -o "$W/smi-time.txt" timeout -s INT 5.05 nvidia-smi --query-gpu=$F --format=csv,nounits -lms 100 >"$W/smi.csv" 2>>"$LOG" &
  /usr/bin/time -f "%U %S" -o "$W/monitor-time.txt" env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$BIN" monitor --csv - --interval-ms 100 --count 50 >"$W/monitor.csv" 2>>"$LOG"
  say "monitor csv rc=$? lines $(wc -l <"$W/monitor.csv")"
  wait %2 2>/dev/null; wait $LOAD
  # gpukit's cost split: the start (NVML opened) against the samples
  /usr/bin/time -f "%U %S" -o "$W/monitor1-time.txt" env -u LD_LIBRARY_PATH "$BIN" monitor --csv - --count 1 >/dev/null 2>>"$LOG"
  /usr/bin/time -f "%U %S" -o "$W/monitor201-time.txt" env -u LD_LIBRARY_PATH "$BIN" monitor --csv - --count 201 --interval-ms 5 >/dev/null 2>>"$LOG"
  /usr/bin/time -f "%U %S" -o "$W/jsonl201-time.txt" env -u LD_LIBRARY_PATH "$BIN" monitor --jsonl - --count 201 --interval-ms 5 >/dev/null 2>>"$LOG"
  /usr/bin/time -f "%U %S" -o "$W/smi1-time.txt" nvidia-smi --query-gpu=$F --format=csv,nounits >/dev/null 2>>"$LOG"
  say "CPU s (user system): gpukit --csv 1 sample $(cat "$W/monitor1-time.txt"), 201 samples $(cat "$W/monitor201-time.txt"); --jsonl (processes included) 201 samples $(cat "$W/jsonl201-time.txt"); nvidia-smi 1 query $(cat "$W/smi1-time.txt")"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import csv, statistics, sys
w = sys.argv[1]
def rows(path):
    with open(path) as f:
        r = list(csv.reader(f, skipinitialspace=True))
    head = [h.split(" [")[0].strip() for h in r[0]]
    print(f"  header of {path.split('/')[-1]}: {', '.join(r[0])}")
    return [dict(zip(head, x)) for x in r[1:] if len(x) == len(head)]
smi, gk = rows(w + "/smi.csv"), rows(w + "/monitor.csv")
def cpu(path, n):
    u, s = map(float, open(path).read().split()[-2:])
    return (u + s), (u + s) / max(n, 1) * 1e3
cs, cg = cpu(w + "/smi-time.txt", len(smi)), cpu(w + "/monitor-time.txt", len(gk))
print(f"samples: nvidia-smi {len(smi)}, gpukit {len(gk)}; CPU time: nvidia-smi {cs[0]:.3f} s ({cs[1]:.2f} ms a sample), gpukit {cg[0]:.3f} s ({cg[1]:.2f} ms a sample)")
for f in ["name", "uuid", "pci.bus_id", "memory.total", "power.limit", "clocks.current.memory"]:
    a, b = {x[f] for x in smi}, {x[f] for x in gk}
    print(f"  {'agree ' if a == b else 'DIFFER'} {f:22} nvidia-smi={sorted(a)} gpukit={sorted(b)}")
for f in ["utilization.gpu", "utilization.memory", "memory.used", "temperature.gpu", "power.draw", "power.draw.instant", "clocks.current.sm"]:
    def nums(rs):
        v = []
        for x in rs:
            try: v.append(float(x[f]))
            except (KeyError, ValueError): pass
        return v
    a, b = nums(smi), nums(gk)
    if a and b:
        ma, mb = statistics.mean(a), statistics.mean(b)
        print(f"  {f:22} mean nvidia-smi {ma:10.2f} gpukit {mb:10.2f} (diff {abs(ma - mb) / max(abs(ma), 1e-9) * 100:.1f}%), median {statistics.median(a):.2f} / {statistics.median(b):.2f}")
    else:
        print(f"  {f:22} nvidia-smi {len(a)} values, gpukit {len(b)}")
PY
  clean timeout 120 "$BIN" monitor --interval-ms 50 -- "$BIN" bench matmul --sizes 8192 --dtype bf16 --device cuda:0 --iterations 4000 >"$W/footprint.txt" 2>&1; say "monitor -- bench matmul (4000 iterations) rc=$?"
  grep -A4 "GPUs while it ran" "$W/footprint.txt" | tail -1 | tee -a "$SUMMARY"
  clean "$BIN" monitor --prometheus 127.0.0.1:9400 --interval-ms 200 --duration 40 2>"$W/prom.err" & PROM=$!
  sleep 2
  grep VmRSS /proc/$PROM/status | tee -a "$SUMMARY"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import sys, urllib.request
texts = [urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=5).read().decode() for _ in range(1000)]
open(sys.argv[1] + "/metrics.txt", "w").write(texts[-1])
names = sorted({l.split("{")[0] for l in texts[-1].splitlines() if l and not l.startswith("#")})
print("1000 scrapes ok;", len(names), "metric names:", " ".join(names))
try:
    from prometheus_client.parser import text_string_to_metric_families as p
    print("prometheus_client parsed", len(list(p(texts[-1]))), "families")
except ImportError:
    print("prometheus_client not installed here: not parsed")
PY
  grep VmRSS /proc/$PROM/status | tee -a "$SUMMARY"
  clean "$BIN" monitor --prometheus 127.0.0.1:9400 --count 1 >>"$LOG" 2>&1; say "a second exporter on the same port rc=$? (want 2: cannot bind)"
  wait $PROM; say "prometheus rc=$?"
  clean "$BIN" monitor --interval-ms 0 >>"$LOG" 2>&1; say "monitor --interval-ms 0 rc=$? (want 2)"
  clean "$BIN" monitor --csv /proc/nope/x.csv --count 1 >>"$LOG" 2>&1; say "monitor --csv /proc/nope rc=$? (want 2)"
  clean "$BIN" monitor -- gpukit-no-such-command >>"$LOG" 2>&1; say "monitor -- missing command rc=$? (want 127)"
  clean timeout 6 script -q -c "stty cols 160 rows 45; $BIN monitor --interval-ms 500" "$W/live.typescript" >/dev/null 2>&1
  say "live view: $(wc -c <"$W/live.typescript") bytes of terminal output; $(grep -ac 'H100' "$W/live.typescript") chunk(s) naming the GPU"
fi

if [ "$MODE" = sanitize ]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$CS" ]; then
    say "sanitize: compute-sanitizer not found (install the CUDA toolkit's compute-sanitizer)"; exit 1
  fi
  say "sanitize with $CS ($("$CS" --version | tail -1))"
  # SANITIZE_ONLY: a regular expression over "tool name" picks some runs (all by default);
  # SANITIZE_TIMEOUT: seconds per sanitized run; SANITIZE_JOBS: runs side by side
  # Every run is done once without the sanitizer first: that fills gpukit's plan cache, so the
  # sanitized run executes the chosen kernels instead of timing every candidate under the tool
  # (hours). The sanitized runs then go side by side, as they are bound by the tool's CPU work.
  # Their outputs are appended, whole, to $OUT/sanitize.log as each ends (a run cut short by a
  # time limit still leaves the others), with one verdict line each in summary.txt.
  jobs=$W/sanitize-jobs.txt; : >"$jobs"
  job() { echo "$*" | grep -E -- "^(${SANITIZE_ONLY:-.*})" >>"$jobs"; } # tool name gpukit-args...
  small="--device cuda:0"
  job memcheck matmul bench matmul $small --sizes 256,257 --iterations 2
  job memcheck bandwidth bench bandwidth --sizes 4096,1M --iterations 2
  job memcheck conv-f32-tf32 bench conv $small --batch 2 --iterations 2 --dtype f32,tf32
  job memcheck conv-f16-bf16 bench conv $small --batch 2 --iterations 2 --dtype f16,bf16
  for st in fp32 fp32-graph tf32 tf32-nhwc tf32-nhwc-graph fp16 fp16-graph fp16-nhwc fp16-nhwc-graph bf16-nhwc bf16-nhwc-graph fp16-nhwc-graph-one-at-a-time; do
    job memcheck "infer-$st" infer $small --strategies "$st" --batch-sizes 1,2 --image-size 64 --gpu-iterations 2
  done
  job memcheck memory memory --device cuda:0 --batch-sizes 2 --image-size 64
  # racecheck and synccheck are far slower than memcheck: batch 1 at 32x32, one pass
  for tool in racecheck synccheck; do
    for st in fp16-nhwc fp16-nhwc-graph fp32; do
      job "$tool" "infer-$st" infer $small --strategies "$st" --batch-sizes 1 --image-size 32 --gpu-iterations 1
    done
  done
  say "sanitize: $(wc -l <"$jobs") runs; warming the plan cache"
  # shellcheck disable=SC2034
  sort -u -k3 "$jobs" | while read -r tool name args; do
    # shellcheck disable=SC2086
    clean timeout 300 "$BIN" $args </dev/null >"$W/warm-$name.txt" 2>&1 || say "warm-up $name rc=$? (see sanitize.log)"
  done
  cat "$W"/warm-*.txt >"$OUT/sanitize-warm-up.log" 2>/dev/null
  # leftovers of a run cut short must not hold the GPU after this script
  trap 'pkill -f "$CS" 2>/dev/null; pkill -f "$BIN" 2>/dev/null' EXIT
  one() { # tool name gpukit-args...
    local tool=$1 name=$2; shift 2
    local extra=()
    # cuDNN's kernels use more cuda::barrier objects than synccheck tracks by default; past
    # that the tool fails the kernel itself
    [ "$tool" = synccheck ] && extra=(--num-cuda-barriers 64)
    # gpukit asks the driver for one parameter past each kernel's last (cuFuncGetParamInfo's
    # "invalid value" is how a kernel with more parameters than its source declares is caught):
    # a returned error gpukit expects, which memcheck would count as one of its errors
    [ "$tool" = memcheck ] && extra=(--report-api-errors no)
    local t0; t0=$(date +%s)
    clean timeout --kill-after=10 "${SANITIZE_TIMEOUT:-500}" "$CS" --tool "$tool" "${extra[@]}" --error-exitcode 99 --print-limit 20 "$BIN" "$@" >"$W/san-$tool-$name.txt" 2>&1
    local rc=$?
    local errors; errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$W/san-$tool-$name.txt" | tail -1)
    local line="sanitize $tool $name rc=$rc ${errors:-no summary} in $(( $(date +%s) - t0 )) s"
    { echo "===== $line: gpukit $*"; cat "$W/san-$tool-$name.txt"; } | flock "$OUT/sanitize.log" tee -a "$OUT/sanitize.log" >/dev/null
    echo "$line" | flock "$SUMMARY" tee -a "$SUMMARY"
  }
  export -f one clean; export CS W BIN OUT SUMMARY
  t0=$(date +%s%N)
  # shellcheck disable=SC2016
  xargs -P "${SANITIZE_JOBS:-8}" -L 1 bash -c 'one "$@"' _ <"$jobs"
  say "sanitizer runs took $(ms_since "$t0") ms"
  # a run passes when the tool found 0 errors and gpukit itself exited 0
  ok=$(grep -cE '^sanitize .* rc=0 ERROR SUMMARY: 0 ' "$SUMMARY")
  say "== sanitizer runs: $ok of $(wc -l <"$jobs") passed"
  [ "$ok" -eq "$(wc -l <"$jobs")" ] || say "== some sanitizer runs failed or did not finish (see sanitize.log)"
fi

tar -C "$W" -czf "$OUT/gpu-run.tar.gz" . && rm -rf "$W"
echo; cat "$SUMMARY"
