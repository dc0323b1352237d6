#!/usr/bin/env bash
# chunked communication call: GPU tests (gather, data-parallel), then DP variants in turns
set -u
W=$OUT/w; mkdir -p $W; S=$OUT/summary.txt
say() { echo "$*" | tee -a $S; }
export NCCL_NVLS_ENABLE=0 GPUKIT_REQUIRE_GPU=1 PATH=/opt/torch/.venv/bin:$PATH
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ';')"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for f in ${FILTERS:-gather data_parallel}; do
  timeout 200 .device/tests/gpu_train --test-threads 1 --nocapture $f > $W/tests-$f.log 2>&1
  say "gpu_train $f rc=$?: $(grep -E '^test result' $W/tests-$f.log)"
  grep -E "FAILED|panicked|failed|every rank|\.\.\. ok|Error" $W/tests-$f.log | head -16 | cut -c1-260 | tee -a $S
  done
fi
M="--gpus 2 --layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096"
row() { tag=$1; bin=$2; shift 2
  timeout 120 $bin train $M "$@" --save-json $W/$tag.json > $W/$tag.txt 2>&1
  rc=$?
  python3 - $W/$tag.json "$tag rc=$rc $*" <<'PY' | tee -a $S
import json,sys
try:
    r=json.load(open(sys.argv[1]))["result"]; d=r["data_parallel"]; pt=d.get("pytorch") or {}
    print(f"{sys.argv[2][:60]:60} eff {d['scaling_efficiency']:.3f} step {min(d['step_ms']):.3f} single {min(d['single_step_ms']):.3f} samples/s {d['samples_per_s']:.0f} chunks {d.get('comm_chunks')} exposed {d.get('exposed_comm_ms',0):.3f}"
          + (f" | DDP eff {pt.get('scaling_efficiency',0):.3f} {pt.get('samples_per_s',0):.0f} ZeRO {pt.get('zero')}" if pt else ""))
except Exception as e: print(sys.argv[2], "no result", e)
PY
}
for turn in ${TURNS:-a b}; do
  for r in ${ROWS:-old new c2 c4 c8 dp1 dp4}; do
    case $r in
      old) row $r-$turn .device/gpukit-old ;;
      new) row $r-$turn .device/gpukit ;;
      c2) row $r-$turn .device/gpukit --comm-chunks 2 ;;
      c4) row $r-$turn .device/gpukit --comm-chunks 4 ;;
      c8) row $r-$turn .device/gpukit --comm-chunks 8 ;;
      c16) row $r-$turn .device/gpukit --comm-chunks 16 ;;
      dp1) row $r-$turn .device/gpukit --no-shard-optimizer --grad-pieces 1 ;;
      dp4) row $r-$turn .device/gpukit --no-shard-optimizer --grad-pieces 1 --comm-chunks 4 ;;
      cmp4) row $r-$turn .device/gpukit --comm-chunks 4 --compare-pytorch ;;
      cmp) row $r-$turn .device/gpukit --compare-pytorch ;;
      dpold) row $r-$turn .device/gpukit-old --no-shard-optimizer --grad-pieces 1 ;;
      prof1) M1=${M#--gpus 2 }; timeout 100 .device/gpukit profile train ${M1/--epochs 4/--epochs 2} --trace $W/prof1.trace.json > $W/prof1.txt 2>&1; say "profile one GPU rc=$?"; head -14 $W/prof1.txt | tail -8 | tee -a $S ;;
      prof2) timeout 100 .device/gpukit profile train ${M/--epochs 4/--epochs 2} --trace $W/prof2.trace.json > $W/prof2.txt 2>&1; say "profile 2 GPUs rc=$?"; head -14 $W/prof2.txt | tail -8 | tee -a $S ;;
    esac
  done
done
