#!/usr/bin/env bash
# On the lent GPU machine, over the binaries staged in .device/ (gpukit; test binaries such as
# gpu_cnn-* and train_cli-* in .device/tests):
#   bash scripts/gpu-train-cnn.sh
# The CNN training path's GPU tests (every cuDNN training call against float64, ResNet-18 against
# the CPU engines), then `gpukit train --model` beside PyTorch's training of the same
# torchvision model (scripts/pytorch_reference.py train-cnn: eager and torch.compile, resident
# data, cudnn.benchmark) at the same batch and precision. MODELS (default "resnet18 resnet50"),
# BATCH (default 256) and PRECISIONS (default "fp32 bf16"; gpukit's rows where it has them).
set -u
OUT=${OUT:-$PWD/gpu-run-out}
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
mkdir -p "$OUT"; SUMMARY=$OUT/0-summary.txt; : >>"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
export PATH=/opt/torch/.venv/bin:$PATH GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN=$BIN
say "== gpu-train-cnn $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for t in .device/tests/gpu_cnn-* .device/tests/train_cli-*; do
  [ -x "$t" ] || continue
  filter="--nocapture"; case "$t" in *train_cli*) filter="gpu::";; esac
  env -u LD_LIBRARY_PATH timeout 300 "$t" --test-threads 1 $filter >"$OUT/$(basename "$t").log" 2>&1
  rc=$?
  say "$(basename "$t") rc=$rc: $(grep -E '^test result' "$OUT/$(basename "$t").log")"
  grep -E "FAILED|panicked" "$OUT/$(basename "$t").log" | head -10 | cut -c1-400 | tee -a "$SUMMARY"
done
B=${BATCH:-256}
for m in ${MODELS:-resnet18 resnet50}; do
  for p in ${PRECISIONS:-fp32 bf16}; do
    t0=$(date +%s%N)
    env -u LD_LIBRARY_PATH timeout 240 "$BIN" train --model "$m" --device cuda:0 --batch-size "$B" \
      --steps 30 --precision "$p" --save-json "$OUT/gpukit-$m-$p.json" >"$OUT/gpukit-$m-$p.txt" 2>&1
    say "gpukit train --model $m --precision $p --batch-size $B rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    grep -iE "images/s|first|peak|error" "$OUT/gpukit-$m-$p.txt" | head -6 | cut -c1-300 | tee -a "$SUMMARY"
    timeout 400 python3 scripts/pytorch_reference.py train-cnn --model "$m" --batch-size "$B" \
      --precision "$p" --steps 30 >"$OUT/pytorch-$m-$p.json" 2>"$OUT/pytorch-$m-$p.err"
    say "pytorch train-cnn $m $p rc=$?"
    python3 - "$OUT/pytorch-$m-$p.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
d = json.load(open(sys.argv[1]))
if not d.get("ok"):
    print("  ", d.get("error")); sys.exit()
for r in d["results"]:
    if r["status"] != "ok":
        print(f"   {r['mode']:8} {r['status']} {r.get('reason', '')[:200]}"); continue
    print(f"   {r['mode']:8} {r['images_per_s']:.0f} img/s, step {r['step_ms']['median_ms']:.2f} ms, "
          f"first step {r['first_step_s']:.1f} s, peak {r['peak_allocated_bytes'] / 2**30:.2f} GiB, "
          f"losses {[round(x, 5) for x in r['losses'][:3]]}")
PY
  done
done
rm -f "$OUT"/*.err
