#!/usr/bin/env bash
# Run 27: why CPU f32 matmul stops near 1 TFLOP/s (threads, pinning, topology) and what moves
# GPU f16/bf16 at 8192 (input distribution, candidate trials), gpukit and PyTorch alternated.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
t() { echo "[$((SECONDS-S)) s] $*"; }
{ lscpu; cat /sys/kernel/mm/transparent_hugepage/enabled; cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list;
  grep -m1 flags /proc/cpuinfo; nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null; } >$W/cpu-info.txt 2>&1
grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|L1d|L2|L3|MHz" $W/cpu-info.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100 >$W/smi.csv 2>&1 &
SMI=$!
# --- GPU: alternate gpukit and PyTorch, normal then uniform inputs
for round in 1 2; do
  for init in normal uniform; do
    $G timeout 120 $B bench matmul --device cuda:0 --dtype f16,bf16 --sizes 8192 --init $init --json >$W/g-$init-$round.json 2>$W/g-$init-$round.err
    t "gpukit $init $round rc=$?"
    timeout 120 python3 scripts/pytorch_reference.py matmul --device cuda --dtypes f16,bf16 --sizes 8192 --iterations 50 --init $init >$W/p-$init-$round.json 2>$W/p-$init-$round.err
    t "torch $init $round rc=$?"
  done
done
# candidate trials: 24 candidates, 3 rounds of 10 after 5 warm-up
GPUKIT_MM_TRIAL=5,10,3 $G timeout 120 $B bench matmul --device cuda:0 --dtype f16,bf16 --sizes 8192 --lt-candidates 24 --json >$W/g-trial.json 2>$W/g-trial.err
t "gpukit trial rc=$?"
$G timeout 120 $B bench matmul --device cuda:0 --dtype f16,bf16 --sizes 4096,8192 --iterations 200 --json >$W/g-200.json 2>$W/g-200.err
t "gpukit 200 rc=$?"
timeout 120 python3 scripts/pytorch_reference.py matmul --device cuda --dtypes f16,bf16 --sizes 4096,8192 --iterations 200 >$W/p-200.json 2>$W/p-200.err
t "torch 200 rc=$?"
$G timeout 120 $B bench bandwidth --sizes 4K,16M,1G --json >$W/bw.json 2>$W/bw.err
$G timeout 120 $B bench bandwidth --sizes 4K,16M,1G >$W/bw.txt 2>>$W/bw.err
t "bandwidth rc=$?"
kill $SMI
# --- CPU: threads and pinning, gpukit against PyTorch
for th in 1 8 16; do
  sz=2048,4096; [ $th = 1 ] && sz=1024,2048
  RAYON_NUM_THREADS=$th $G timeout 100 $B bench matmul --device cpu --dtype f32 --sizes $sz --cpu-seconds 6 --json >$W/c-$th.json 2>$W/c-$th.err
  t "gpukit cpu $th rc=$?"
  timeout 100 python3 scripts/pytorch_reference.py matmul --device cpu --dtypes f32 --sizes $sz --iterations 20 --threads $th >$W/pc-$th.json 2>$W/pc-$th.err
  t "torch cpu $th rc=$?"
done
GPUKIT_PIN_THREADS=1 $G timeout 100 $B bench matmul --device cpu --dtype f32 --sizes 2048,4096 --cpu-seconds 6 --json >$W/c-pin.json 2>$W/c-pin.err
t "gpukit cpu pinned rc=$?"
RAYON_NUM_THREADS=15 $G timeout 100 $B bench matmul --device cpu --dtype f32 --sizes 4096 --cpu-seconds 6 --json >$W/c-15.json 2>$W/c-15.err
t "gpukit cpu 15 rc=$?"
python3 - >$W/torch-config.txt 2>&1 <<'PY'
import torch, time
print(torch.__config__.show()); print("threads", torch.get_num_threads())
x = torch.empty(1 << 28); x.fill_(1.0); y = torch.empty_like(x)
for _ in range(2): y.copy_(x)
t0 = time.perf_counter(); n = 5
for _ in range(n): y.copy_(x)
dt = (time.perf_counter() - t0) / n
print(f"host copy 1 GiB: {2 * x.numel() * 4 / dt / 1e9:.1f} GB/s read+write ({torch.get_num_threads()} threads)")
torch.set_num_threads(1)
t0 = time.perf_counter()
for _ in range(3): y.copy_(x)
print(f"host copy 1 GiB, 1 thread: {2 * x.numel() * 4 / ((time.perf_counter() - t0) / 3) / 1e9:.1f} GB/s")
PY
t "torch config"
mkdir -p "$OUT"; tar czf "$OUT/run27.tar.gz" -C "$W" .
tail -3 $W/torch-config.txt
python3 - "$W" <<'PY'
import json, sys, glob, os
w = sys.argv[1]
for f in sorted(glob.glob(w + "/*.json")):
    try: d = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    rows = d.get("rows") or d.get("results") or (d.get("matmul") or {}).get("rows") or []
    for r in rows:
        if "median_ms" in r:
            print(os.path.basename(f), r.get("device"), r.get("dtype"), r.get("size"), f"{r['median_ms']:.3f} ms p10 {r.get('p10_ms',0):.3f} p90 {r.get('p90_ms',0):.3f} {r.get('tflops')}")
        elif r.get("timing"):
            s = r["timing"]["summary_ms"]
            print(os.path.basename(f), r.get("device"), r.get("dtype"), r.get("size"), f"{s['median']:.3f} ms p10 {s.get('p10',0):.3f} p90 {s.get('p90',0):.3f} {r.get('tflops')} {r.get('backend')}")
        elif "status" in r: print(os.path.basename(f), r.get("dtype"), r.get("size"), r.get("status"))
PY
