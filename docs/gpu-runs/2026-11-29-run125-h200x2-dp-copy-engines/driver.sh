#!/usr/bin/env bash
# Run 125 (session 44), from the repository root on the lent 2-GPU machine, binaries staged under
# .device/ (gzipped, carried): .device/gpukit, .device/tests/gpu_train (branch dp-exchange, which
# holds main's engine). `bash .device/drivers.sh CALL`
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $CALL $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tr '\n' ' ')"
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0
pp_row() {
python3 - "$1" <<'PY2' 2>&1 | tee -a "$S"
import json, sys
r = json.load(open(sys.argv[1]))["result"]; d = r.get("pipeline") or {}; one = d.get("one_gpu") or {}
print(f"  bubble {d.get('bubble', 0):.3f} (schedule {d.get('bubble_schedule', 0):.3f}, no flush {d.get('bubble_without_flush', 0):.3f}) samples/s {d.get('samples_per_s', 0):.0f} alone {[round(x, 3) for x in d.get('alone_step_ms', [])]} step {[round(x, 3) for x in d.get('step_ms', [])]} via {d.get('transfers', '')[:24]}"
      + (f" | one GPU {one.get('samples_per_s', 0):.0f} losses within {one.get('max_loss_rel_diff', 0):.1e}" if one else ""))
PY2
}
case $CALL in
  # X1: scripts/gpu-multi.sh exchange (the data-parallel GPU test with its exchange cases, the
  #     4096-wide MLP with and without the exchange in turns, DDP beside, under launch), then
  #     the pipeline's split chosen by the schedule (decision 187): bf16 8 micro-batches (copy
  #     engines twice, NCCL once), 4 and 16, fp32
  X1) GPUKIT_TESTS=$PWD/.device/tests OUT=$OUT/multi timeout 330 bash scripts/gpu-multi.sh exchange > $OUT/t/multi.log 2>&1
     say "gpu-multi exchange rc=$?"; cat $OUT/multi/summary.txt >> "$S"
     P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
     i=0
     for v in copies:bf16:40:8 nccl:bf16:40:8 copies:bf16:40:8 copies:bf16:40:4 copies:bf16:40:16 copies:fp32:20:8; do
       i=$((i+1)); IFS=: read -r which prec steps m <<< "$v"
       E=""; [ $which = nccl ] && E="GPUKIT_PIPE_NCCL=1"
       # shellcheck disable=SC2086
       timeout 100 env -u LD_LIBRARY_PATH $E .device/gpukit train $P --precision $prec --steps $steps --micro-batches $m --save-json $OUT/t/pp-$i-$which-$prec-m$m.json > $OUT/t/pp-$i-$which-$prec-m$m.txt 2>&1
       say "pp $i $which $prec m$m rc=$?"; pp_row $OUT/t/pp-$i-$which-$prec-m$m.json
     done
     python3 -c "
import json,glob
for p in sorted(glob.glob('$OUT/t/pp-*.json')):
    d=json.load(open(p))['result']['pipeline']; print(p.split('/')[-1], d['layers'], [round(x,3) for x in d['layer_update_ms']], d['optimizer_ms'])
" 2>&1 | tee -a "$S"
     rm -rf $OUT/multi/work/*.err; tar czf $OUT/multi-work.tgz -C $OUT/multi work; rm -rf $OUT/multi/work ;;
  # B1 (one H200): branch block-kernel's gpu_program (small products and convolutions, the grid
  #     barrier, the bottleneck block as one persistent kernel against three launches; memcheck
  #     and racecheck on the changed convolution kernel and the block) and branch wgmma-fp8's
  #     fp8 product against float64 (memcheck too)
  B1) T="env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1"
     CS=/usr/local/cuda/bin/compute-sanitizer
     $T timeout 120 .device/tests/gpu_program_fp8 --test-threads 1 --nocapture fp8 > $OUT/t/fp8.log 2>&1
     say "fp8 rc=$?: $(grep 'test result' $OUT/t/fp8.log)"; grep -E 'fp8 |FAILED|panicked|Error|error' $OUT/t/fp8.log | head -12 | tee -a "$S"
     $T timeout 150 $CS --tool memcheck .device/tests/gpu_program_fp8 --test-threads 1 fp8 > $OUT/t/fp8-memcheck.log 2>&1
     say "fp8 memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/t/fp8-memcheck.log | tail -1)"
     for f in grid_barrier bottleneck_block small conv_small; do
       $T timeout 150 .device/tests/gpu_program_block --test-threads 1 --nocapture $f > $OUT/t/block-$f.log 2>&1
       say "block $f rc=$?: $(grep 'test result' $OUT/t/block-$f.log)"; grep -vE '^running|^$|^test result|\.\.\. ok$' $OUT/t/block-$f.log | head -30 | tee -a "$S"
     done
     for tool in memcheck racecheck; do for f in conv_small bottleneck_block; do
       $T timeout 200 $CS --tool $tool .device/tests/gpu_program_block --test-threads 1 $f > $OUT/t/block-$tool-$f.log 2>&1
       say "block $tool $f rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/t/block-$tool-$f.log | tail -1)"
     done; done ;;
  # X2: the exchange through the copy engines: scripts/gpu-multi.sh exchange (GPU test with its
  #     exchange cases, default vs exchange in turns, DDP beside, the launcher falling back),
  #     then `profile train --gpus 2 --trace` of each for the step's timeline
  X2|X3|X4) GPUKIT_TESTS=$PWD/.device/tests OUT=$OUT/multi timeout 330 bash scripts/gpu-multi.sh exchange > $OUT/t/multi.log 2>&1
     say "gpu-multi exchange rc=$?"; cat $OUT/multi/summary.txt >> "$S"
     M="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096"
     [ $CALL = X4 ] || for v in default exchange; do
       E="GPUKIT_DP_EXCHANGE=1"; [ $v = default ] && E="GPUKIT_DP_EXCHANGE=0"
       # shellcheck disable=SC2086
       timeout 150 env -u LD_LIBRARY_PATH $E NCCL_NVLS_ENABLE=0 .device/gpukit profile train --gpus 2 $M --trace $OUT/t/trace-$v.json --save-json $OUT/t/prof-$v.json > $OUT/t/prof-$v.txt 2>&1
       say "profile $v rc=$? $(ls -la $OUT/t/trace-$v.json 2>/dev/null | awk '{print $5}') bytes"
     done
     tar czf $OUT/traces.tgz -C $OUT/t trace-default.json trace-exchange.json prof-default.txt prof-exchange.txt prof-default.json prof-exchange.json 2>/dev/null
     rm -rf $OUT/multi/work $OUT/t/trace-*.json $OUT/t/prof-* ;;
  # X5: the input-gradient epilogue chosen by timing (decision 197): the whole gpu_train suite,
  #     the 4096-wide MLP on one GPU against the previous build in turns (bf16, fp32; PyTorch
  #     beside once each), the data-parallel turns again (copy engines vs NCCL), and the
  #     pipeline at 8 micro-batches
  X5) T="env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1"
     $T timeout 200 .device/tests/gpu_train --test-threads 1 > $OUT/t/gpu_train.log 2>&1
     say "gpu_train rc=$?: $(grep 'test result' $OUT/t/gpu_train.log)"; grep -E 'FAILED|failed|panicked' $OUT/t/gpu_train.log | head -8 | tee -a "$S"
     M="--device cuda:0 --layers 4096,4096,4096,1 --samples 4096 --features 4096 --batch-size 4096 --lr 1e-5 --epochs 20"
     GPUKIT_TRACE=1 timeout 60 env -u LD_LIBRARY_PATH .device/gpukit train $M --precision bf16 > $OUT/t/trace-choice.txt 2>&1
     grep -E "input gradient on|epilogues" $OUT/t/trace-choice.txt | head -8 | tee -a "$S"
     i=0
     for v in new:bf16:c base:bf16:c new:bf16: base:bf16: new:fp32:c base:fp32: ; do
       i=$((i+1)); IFS=: read -r which prec cmp <<< "$v"
       B=.device/gpukit; [ $which = base ] && B=.device/gpukit-base
       C=""; [ "$cmp" = c ] && C="--compare-pytorch"
       # shellcheck disable=SC2086
       timeout 150 env -u LD_LIBRARY_PATH $B train $M --precision $prec $C --save-json $OUT/t/mlp-$i-$which-$prec.json > $OUT/t/mlp-$i-$which-$prec.txt 2>&1
       say "mlp $i $which $prec rc=$? $(python3 -c "
import json,sys
r=json.load(open('$OUT/t/mlp-$i-$which-$prec.json'))['result']
import statistics as st
g=r.get('gpu') or {}; pt=r.get('pytorch') or {}
ms=sorted(e.get('ms', 0) for e in r['epochs'])
print('epoch ms median', round(st.median(ms[1:] or ms), 4), 'min', round(ms[0], 4), 'fused', g.get('fused_epilogues'),
      ('| pytorch loop s %.5f gpukit loop s %.5f max rel diff %.1e' % (pt['seconds_median'], pt['gpukit_seconds_median'], pt['max_relative_difference'])) if pt else '')
" 2>&1 | tail -1)"
       grep -E "Epilogues|PyTorch|step" $OUT/t/mlp-$i-$which-$prec.txt | head -4 | cut -c1-300 >> $OUT/t/mlp-lines.txt
     done
     GPUKIT_TESTS=/nonexistent OUT=$OUT/multi timeout 250 bash scripts/gpu-multi.sh exchange > $OUT/t/multi.log 2>&1
     say "gpu-multi exchange rc=$?"; sed -n '/^ex-/,$p' $OUT/multi/summary.txt >> "$S"
     P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
     for i in 1 2; do
       timeout 100 env -u LD_LIBRARY_PATH .device/gpukit train $P --precision bf16 --steps 40 --micro-batches 8 --save-json $OUT/t/pp-$i.json > $OUT/t/pp-$i.txt 2>&1
       say "pp $i rc=$?"; pp_row $OUT/t/pp-$i.json
     done
     tar czf $OUT/x5.tgz -C $OUT/t . ; rm -rf $OUT/t $OUT/multi/work ;;
esac
say "== done $(date -u +%FT%TZ)"
