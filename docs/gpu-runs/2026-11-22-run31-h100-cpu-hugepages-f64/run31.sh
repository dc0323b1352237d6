#!/usr/bin/env bash
# Run 31: CPU f32 matmul against transparent huge pages (glibc's malloc asked to madvise them)
# and thread counts; GPU f64 at 4096 with the candidates' trial times, and with cuBLAS alone.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
t() { echo "[$((SECONDS-S)) s] $*"; }
ldd --version | head -1
HP="GLIBC_TUNABLES=glibc.malloc.hugetlb=1"
for v in base hp base hp; do
  if [ $v = hp ]; then E="env $HP"; else E=env; fi
  $E $G timeout 100 $B bench matmul --device cpu --dtype f32 --sizes 4096 --cpu-seconds 8 --json >$W/c-$v-$SECONDS.json 2>/dev/null
  t "gpukit cpu $v rc=$?"
done
grep AnonHugePages /proc/meminfo
for th in 12 14; do
  RAYON_NUM_THREADS=$th $G timeout 100 $B bench matmul --device cpu --dtype f32 --sizes 4096 --cpu-seconds 8 --json >$W/c-t$th.json 2>/dev/null
  t "gpukit cpu $th threads rc=$?"
done
env $HP $G timeout 200 $B bench matmul --device cpu --dtype f32 --sizes 4096,8192 --compare-pytorch --save-json $W/mm-cpu-hp.json >$W/mm-cpu-hp.txt 2>$W/mm-cpu-hp.err
t "cpu hugepages beside PyTorch rc=$?"
$G timeout 100 $B bench matmul --device cuda:0 --dtype f64 --sizes 4096 --compare-pytorch --save-json $W/f64.json >$W/f64.txt 2>$W/f64.err
t "f64 default rc=$?"
$G timeout 100 $B bench matmul --device cuda:0 --dtype f64 --sizes 4096 --lt-candidates 0 --compare-pytorch --save-json $W/f64-cublas.json >$W/f64-cublas.txt 2>$W/f64-cublas.err
t "f64 cublas only rc=$?"
$G timeout 100 $B bench matmul --device cuda:0 --dtype f64 --sizes 4096 --compare-pytorch --save-json $W/f64-b.json >$W/f64-b.txt 2>$W/f64-b.err
t "f64 default again rc=$?"
mkdir -p "$OUT"; tar czf "$OUT/run31.tar.gz" -C "$W" .
python3 - "$W" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f)); d = d.get("matmul", d)
    for r in d["rows"]:
        s = (r.get("timing") or {}).get("summary_ms") or {}
        p = r.get("pytorch") or {}
        print(os.path.basename(f), r["dtype"], r["size"], f"{s.get('median',0):.3f} p10 {s.get('p10',0):.3f} p90 {s.get('p90',0):.3f}", r.get("tflops"), r.get("backend"), "torch", p.get("rate"), p.get("ratio"), [round(x,3) for x in p.get("turn_ratios", [])])
        for c in r.get("candidates", []): print("   ", c)
PY
