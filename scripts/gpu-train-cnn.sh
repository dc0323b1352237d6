#!/usr/bin/env bash
# On the lent GPU machine, over the binaries staged in .device/ (gpukit; test binaries such as
# gpu_cnn-*, gpu_cnn_resnet-*, gpu_cnn_modes-* and train_cli-* in .device/tests):
#   bash scripts/gpu-train-cnn.sh
# The CNN training path's GPU tests (every cuDNN training call against float64, ResNet-18 against
# the CPU engines), then `gpukit train --model` beside PyTorch's training of the same
# torchvision model (scripts/pytorch_reference.py train-cnn: eager and torch.compile, resident
# data, cudnn.benchmark) at the same batch and precision. MODELS (default "resnet18 resnet50"),
# BATCH (default 256) and PRECISIONS (default "fp32 bf16"; gpukit's rows where it has them).
# PT_MODES: PyTorch's modes (default eager,compile,compile_fused,compile_graphs); GK_FLAGS:
# gpukit's variants, ";"-separated flag sets (default one run with no extra flags, e.g.
# ";--no-graph" runs both); SKIP_TESTS=1, SKIP_CMP=1 and SKIP_PT=1 skip the tests, the loss
# comparison and PyTorch's timed rows.
set -u
OUT=${OUT:-$PWD/gpu-run-out}
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
mkdir -p "$OUT"; SUMMARY=$OUT/0-summary.txt; : >>"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
export PATH=/opt/torch/.venv/bin:$PATH GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN=$BIN
say "== gpu-train-cnn $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
[ "${SKIP_TESTS:-0}" = 1 ] || for t in .device/tests/gpu_cnn-* .device/tests/gpu_cnn_resnet-* .device/tests/gpu_cnn_modes-* .device/tests/train_cli-*; do
  [ -x "$t" ] || continue
  filter="--nocapture"; case "$t" in *train_cli*) filter="gpu::";; esac
  env -u LD_LIBRARY_PATH timeout 300 "$t" --test-threads 1 $filter >"$OUT/$(basename "$t").log" 2>&1
  rc=$?
  say "$(basename "$t") rc=$rc: $(grep -E '^test result' "$OUT/$(basename "$t").log")"
  grep -E "FAILED|panicked" "$OUT/$(basename "$t").log" | head -10 | cut -c1-400 | tee -a "$SUMMARY"
done
# Per-update losses from the same torchvision init and images: PyTorch eager writes both files
# (one batch of CMP_BATCH images, trained on every update) and gpukit reads them.
CM=${CMP_MODEL:-resnet50}; CB=${CMP_BATCH:-32}
HYPER="--lr ${CMP_LR:-0.1} --momentum 0.9 --weight-decay 1e-4 --label-smoothing 0.1"
[ "${SKIP_CMP:-0}" = 1 ] || for p in ${CMP_PRECISIONS:-fp32 bf16}; do
  timeout 300 python3 scripts/pytorch_reference.py train-cnn --model "$CM" --batch-size "$CB" \
    --samples "$CB" --precision "$p" --warmup 19 --steps 1 --loss-steps 20 $HYPER \
    --modes "$([ "$p" = fp32 ] && echo eager,eager64 || echo eager)" \
    --write-init "$OUT/cmp-init.safetensors" --write-data "$OUT/cmp-data.safetensors" \
    >"$OUT/cmp-pytorch-$CM-$p.json" 2>"$OUT/cmp-pytorch-$CM-$p.err"
  say "compare $CM $p b$CB: pytorch rc=$?"
  env -u LD_LIBRARY_PATH timeout 240 "$BIN" train --model "$CM" --device cuda:0 --batch-size "$CB" \
    --steps 20 --precision "$p" --init "$OUT/cmp-init.safetensors" --data "$OUT/cmp-data.safetensors" \
    $HYPER --save-json "$OUT/cmp-gpukit-$CM-$p.json" >"$OUT/cmp-gpukit-$CM-$p.txt" 2>&1
  say "compare $CM $p b$CB: gpukit rc=$?"
  python3 - "$OUT/cmp-pytorch-$CM-$p.json" "$OUT/cmp-gpukit-$CM-$p.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
try:
    t = json.load(open(sys.argv[1])); g = json.load(open(sys.argv[2]))
    runs = {r["mode"]: r["losses"] for r in t["results"] if r.get("status") == "ok"}
    runs["gpukit"] = [u["loss"] for u in g["result"]["updates"]]
except Exception as e:
    print("   compare: no losses:", repr(e)[:300]); sys.exit()
for m, l in runs.items():
    print(f"   {m:8}", [round(x, 6) for x in l[:20]])
def dist(a, b):
    n = min(len(a), len(b), 20)
    d = [abs(x - y) for x, y in zip(a[:n], b[:n])]
    first = next((i + 1 for i, v in enumerate(d) if v > 1e-4), None)
    return f"max {max(d):.3g} at update {d.index(max(d)) + 1}, first above 1e-4: {first}"
for a, b in [("gpukit", "eager"), ("gpukit", "eager64"), ("eager", "eager64")]:
    if a in runs and b in runs:
        print(f"   |{a} - {b}|: {dist(runs[a], runs[b])}")
PY
done
rm -f "$OUT"/cmp-*.safetensors
B=${BATCH:-256}
for m in ${MODELS:-resnet18 resnet50}; do
  for p in ${PRECISIONS:-fp32 bf16}; do
    IFS=';' read -ra variants <<<"${GK_FLAGS:-}"; [ ${#variants[@]} -eq 0 ] && variants=("")
    for v in "${variants[@]}"; do
      tag=$m-$p$(echo "$v" | tr -d ' -'); t0=$(date +%s%N)
      env -u LD_LIBRARY_PATH timeout 240 "$BIN" train --model "$m" --device cuda:0 --batch-size "$B" \
        --steps 30 --precision "$p" $v --save-json "$OUT/gpukit-$tag.json" >"$OUT/gpukit-$tag.txt" 2>&1
      say "gpukit train --model $m --precision $p --batch-size $B $v rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
      grep -iE "images/s|first|peak|launched|error" "$OUT/gpukit-$tag.txt" | head -8 | cut -c1-400 | tee -a "$SUMMARY"
    done
    [ "${SKIP_PT:-0}" = 1 ] && continue
    timeout 480 python3 scripts/pytorch_reference.py train-cnn --model "$m" --batch-size "$B" \
      --precision "$p" --steps 30 --modes "${PT_MODES:-eager,compile,compile_fused,compile_graphs}" \
      >"$OUT/pytorch-$m-$p.json" 2>"$OUT/pytorch-$m-$p.err"
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
