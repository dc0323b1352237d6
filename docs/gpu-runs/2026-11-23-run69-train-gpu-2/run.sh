#!/usr/bin/env bash
# GPU run 69: the training engine after run 68's fixes (per-layer epilogue fusion, the bias-
# gradient kernel, tests one at a time, graphs on by default with resident data), fp16 overflow,
# accumulation's memory, `gpukit all` with report.html, and issue 12's infer A/B with traces.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O/w"; W=$O/w
B=$PWD/.device/gpukit; OLD=$PWD/.device/gpukit-run58
export GPUKIT_REQUIRE_GPU=1
S=$O/summary.txt; : >"$S"
say() { echo "$*" | tee -a "$S"; }
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee -a "$S"
for t in gpu_train train_cli; do f=$(ls .device/tests/$t-* | head -1)
  clean timeout 300 "$f" >"$W/test-$t.txt" 2>&1; say "$t tests rc=$?"; grep -E "^test |test result|^----|failed|differ" "$W/test-$t.txt" | head -20 | tee -a "$S"; done
tr() { local name=$1; shift; local t0; t0=$(date +%s%N)
  clean timeout 300 "$B" train "$@" --json >"$W/$name.json" 2>"$W/$name.err"
  say "train $name rc=$? $(( ($(date +%s%N) - t0) / 1000000 )) ms: $*"; }
M="--device cuda:0 --layers 4096,4096,4096,1 --samples 4096 --features 4096 --batch-size 4096 --lr 1e-5"
for p in fp32 fp16 bf16; do tr "mlp4096-$p" $M --epochs 20 --precision $p --compare-pytorch; done
tr mlp4096-bf16-accumulate4 --device cuda:0 --layers 4096,4096,4096,1 --samples 4096 --features 4096 --batch-size 1024 --accumulate 4 --lr 1e-5 --epochs 3 --precision bf16
clean GPUKIT_TRACE=1 timeout 60 "$B" train $M --epochs 2 --precision bf16 2>&1 | grep -E "epilogue|products" >"$W/mlp-epilogues.txt"
clean GPUKIT_TRACE=1 timeout 60 "$B" train $M --epochs 2 --precision fp16 2>&1 | grep -E "epilogue|products" >>"$W/mlp-epilogues.txt"
cat "$W/mlp-epilogues.txt" | tee -a "$S"
python3 - <<'PY'
import random
random.seed(1)
with open("/tmp/big.csv", "w") as f:
    f.write(",".join(f"x{i}" for i in range(16)) + ",y\n")
    for _ in range(1024):
        xs = [random.gauss(0, 1) for _ in range(16)]
        f.write(",".join(f"{v:.5f}" for v in xs) + f",{100 + 10 * random.gauss(0, 1):.4f}\n")
PY
tr fp16-overflow --device cuda:0 --data /tmp/big.csv --layers 16,64,1 --epochs 20 --lr 0.05 --precision fp16 --compare-pytorch
tr fp32-bigtargets --device cuda:0 --data /tmp/big.csv --layers 16,64,1 --epochs 20 --lr 0.05 --precision fp32
tr reg48 --device cuda:0 --preset seed-regression --compare-pytorch
tr reg48-nograph --device cuda:0 --preset seed-regression --no-graph
tr cls5 --device cuda:0 --preset seed-classification --compare-pytorch
clean timeout 100 "$B" train --device cuda:0 --layers 4096,4096,4096,1 --samples 4096 --features 4096 --batch-size 4096 --lr 1e-5 --epochs 3 --precision bf16 >"$W/mlp-table.txt" 2>&1
python3 - "$W" <<'PY' | tee -a "$S"
import json, glob, os, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try: d = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    r = d.get("result") or {}; p = r.get("pytorch") or {}; g = r.get("gpu") or {}; m = r.get("memory") or {}
    steps = len(r.get("step_losses") or []) or 1
    line = f"{os.path.basename(f)[:-5]:24} {r.get('precision')} graph={g.get('graph')} fused={g.get('fused_epilogues')} steps={steps} loop={r.get('seconds',0)*1e3:.3f} ms last={(r.get('step_losses') or [0])[-1]:.5g} act={m.get('activations')} peak={m.get('pool_peak')}"
    if p:
        line += f" | gpukit {p['gpukit_seconds_median']*1e3:.3f} ms ({p['gpukit_seconds_median']*1e3/steps:.3f}/step) torch {p['seconds_median']*1e3:.3f} ms ({p['seconds_median']*1e3/steps:.3f}/step) ratio {p['gpukit_seconds_median']/p['seconds_median']:.3f} early {p['early_difference']:.2e} final {p['final_difference']:.2e} peak gpukit {p.get('gpukit_peak_bytes')} torch {p.get('peak_bytes')} skipped {p.get('skipped_updates')}"
    if g: line += f" skipped={g.get('skipped_updates')} scaler={g.get('scaler')}"
    if d.get("failure"): line += f" FAILURE: {d['failure']}"
    print(line)
PY
# issue 12: infer tf32 batch 32, both binaries, with the plan trace, twice more
for i in 3 4; do for v in old new; do bin=$B; [ $v = old ] && bin=$OLD
  clean GPUKIT_TRACE=1 timeout 200 "$bin" infer --strategies tf32,tf32-graph --batch-sizes 32 --device cuda:0 --json >"$W/ab-infer-$v-$i.json" 2>"$W/ab-infer-$v-$i.err"; say "ab infer $v $i rc=$?"; done; done
# issue 18: report.html from `gpukit all` on this GPU
t0=$(date +%s); clean timeout 330 "$B" all --out "$O/all" >"$W/all.txt" 2>&1; say "all rc=$? in $(( $(date +%s) - t0 )) s"; ls "$O/all" | tee -a "$S"
tar -C "$W" -czf "$O/run69.tar.gz" . && rm -rf "$W"
