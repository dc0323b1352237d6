#!/usr/bin/env bash
# GPU run 68: the training engine's first GPU run (tests, presets and the 4096-wide MLP beside
# PyTorch), the A/B of run 58's binary against this tree (issue 12), and bench conv's last row
# with the cuBLASLt/cuDNN trace (issue 20). From the project root on the device machine.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O/w"; W=$O/w
B=$PWD/.device/gpukit; OLD=$PWD/.device/gpukit-run58
export GPUKIT_REQUIRE_GPU=1
S=$O/summary.txt; : >"$S"
say() { echo "$*" | tee -a "$S"; }
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee -a "$S"
t=$(ls .device/tests/gpu_train-* | head -1)
clean timeout 300 "$t" >"$W/gpu_train.txt" 2>&1; say "gpu_train tests rc=$?"; grep -E "^test |test result" "$W/gpu_train.txt" | tee -a "$S"
tr() { local name=$1; shift; local t0; t0=$(date +%s%N)
  clean timeout 300 "$B" train "$@" --json >"$W/$name.json" 2>"$W/$name.err"
  say "train $name rc=$? $(( ($(date +%s%N) - t0) / 1000000 )) ms: $*"; }
tr reg200 --device cuda:0 --preset seed-regression --epochs 13 --steps 200 --compare-pytorch
tr cls200 --device cuda:0 --preset seed-classification --epochs 200 --compare-pytorch
tr reg48 --device cuda:0 --preset seed-regression --compare-pytorch
tr reg48-graph --device cuda:0 --preset seed-regression --graph --compare-pytorch
tr cls5-graph --device cuda:0 --preset seed-classification --graph --compare-pytorch
tr reg48-cpu --device cpu --preset seed-regression --compare-pytorch
for l in plain pinned prefetch; do tr "reg48-$l" --device cuda:0 --preset seed-regression --loader $l; done
for p in tf32 fp16 bf16; do tr "reg-$p" --device cuda:0 --preset seed-regression --precision $p --compare-pytorch; done
for p in fp32 fp16 bf16; do
  tr "mlp4096-$p" --device cuda:0 --layers 4096,4096,4096,1 --samples 4096 --features 4096 --batch-size 4096 --epochs 20 --precision $p --compare-pytorch
  tr "mlp4096-$p-graph" --device cuda:0 --layers 4096,4096,4096,1 --samples 4096 --features 4096 --batch-size 4096 --epochs 20 --precision $p --graph
done
clean GPUKIT_TRACE=1 timeout 120 "$B" train --device cuda:0 --layers 4096,4096,4096,1 --samples 4096 --features 4096 --batch-size 4096 --epochs 2 --precision bf16 >"$W/mlp-trace.txt" 2>&1
python3 - "$W" <<'PY' | tee -a "$S"
import json, glob, os, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try: d = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    r = d.get("result") or {}; p = r.get("pytorch") or {}; g = r.get("gpu") or {}
    steps = len(r.get("step_losses") or []) or 1
    line = f"{os.path.basename(f)[:-5]:22} {r.get('precision')} loader={g.get('loader')} graph={g.get('graph')} fused={g.get('fused_epilogues')} steps={steps} loop={r.get('seconds',0)*1e3:.3f} ms"
    if p:
        line += f" | gpukit med {p['gpukit_seconds_median']*1e3:.3f} ms ({p['gpukit_seconds_median']*1e3/steps:.3f}/step) torch {p['seconds_median']*1e3:.3f} ms ({p['seconds_median']*1e3/steps:.3f}/step) ratio {p['gpukit_seconds_median']/p['seconds_median']:.3f} early {p['early_difference']:.2e} final {p['final_difference']:.2e} max {p['max_relative_difference']:.2e} peak gpukit {p.get('gpukit_peak_bytes')} torch {p.get('peak_bytes')}"
    if g: line += f" skipped={g.get('skipped_updates')} scaler={g.get('scaler')} setup={g.get('setup_seconds',0)*1e3:.1f} ms"
    if d.get("failure"): line += f" FAILURE: {d['failure']}"
    print(line)
PY
# issue 12: run 58's binary and this tree's, in turns on one GPU
for i in 1 2; do
  for v in old new; do bin=$B; [ $v = old ] && bin=$OLD
    clean timeout 200 "$bin" bench matmul --dtype bf16,f64 --sizes 4096,8192 --device cuda:0 --json >"$W/ab-matmul-$v-$i.json" 2>"$W/ab-matmul-$v-$i.err"; say "ab matmul $v $i rc=$?"
    clean timeout 200 "$bin" infer --strategies tf32,tf32-graph --batch-sizes 32 --device cuda:0 --json >"$W/ab-infer-$v-$i.json" 2>"$W/ab-infer-$v-$i.err"; say "ab infer $v $i rc=$?"
  done
done
# issue 20: the conv rows with the plan trace
clean GPUKIT_TRACE=1 timeout 300 "$B" bench conv --dtype bf16 --layout nchw --device cuda:0 --compare-pytorch --json >"$W/conv-bf16-nchw.json" 2>"$W/conv-bf16-nchw.err"; say "conv bf16 nchw rc=$?"
tar -C "$W" -czf "$O/run68.tar.gz" . && rm -rf "$W"
