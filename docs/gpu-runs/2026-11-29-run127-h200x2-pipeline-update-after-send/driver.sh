#!/usr/bin/env bash
# Run 127 (session 45), from the repository root on the lent 2-GPU machine, binaries staged under
# .device/ (gzipped, carried): .device/gpukit + .device/tests/gpu_train (main 93de479),
# .device/gpukit-gather + .device/tests-gather/gpu_train (branch dp-gather-copies rebased on it).
# `bash .device/drivers.sh CALL`
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done 2>/dev/null
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $CALL $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tr '\n' ' ')"
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0
T="env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1"
pp_row() {
python3 - "$1" <<'PY2' 2>&1 | tee -a "$S"
import json, sys
r = json.load(open(sys.argv[1]))["result"]; d = r.get("pipeline") or {}; one = d.get("one_gpu") or {}
print(f"  layers {d.get('layers')} bubble {d.get('bubble', 0):.3f} (schedule {d.get('bubble_schedule', 0):.3f}, no flush {d.get('bubble_without_flush', 0):.3f}) samples/s {d.get('samples_per_s', 0):.0f} alone {[round(x, 3) for x in d.get('alone_step_ms', [])]} step {[round(x, 3) for x in d.get('step_ms', [])]} via {d.get('transfers', '')[:24]}"
      + (f" | one GPU {one.get('samples_per_s', 0):.0f} losses within {one.get('max_loss_rel_diff', 0):.1e}" if one else ""))
PY2
}
case $CALL in
  # X1: main's build: the data-parallel GPU test (the moved exchange code), then
  #     scripts/gpu-multi.sh split (pipeline GPU test; gpukit's split, 5,4, 4,5 in turns, traced)
  X1) $T timeout 150 .device/tests/gpu_train --test-threads 1 --nocapture data_parallel > $OUT/t/dp-main.log 2>&1
     say "main data_parallel rc=$?: $(grep 'test result' $OUT/t/dp-main.log)"; grep -E 'every rank|FAILED|failed|panicked' $OUT/t/dp-main.log | head -14 | tee -a "$S"
     GPUKIT_TESTS=$PWD/.device/tests OUT=$OUT/multi timeout 380 bash scripts/gpu-multi.sh split > $OUT/t/multi.log 2>&1
     say "gpu-multi split rc=$?"; cat $OUT/multi/summary.txt >> "$S"
     tar czf $OUT/split-work.tgz -C $OUT/multi work; rm -rf $OUT/multi/work ;;
  # X2: branch dp-gather-copies: its data-parallel GPU test, then the 4096-wide MLP with main's
  #     build and the branch's in turns (DDP and compiled DDP beside once, main's build)
  X2) $T timeout 150 .device/tests-gather/gpu_train --test-threads 1 --nocapture data_parallel > $OUT/t/dp-gather.log 2>&1
     say "gather data_parallel rc=$?: $(grep 'test result' $OUT/t/dp-gather.log)"; grep -E 'every rank|FAILED|failed|panicked' $OUT/t/dp-gather.log | head -14 | tee -a "$S"
     M="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096"
     timeout 200 env -u LD_LIBRARY_PATH .device/gpukit train --gpus 2 $M --compare-pytorch --save-json $OUT/t/g-0-main-pytorch.json > $OUT/t/g-0-main-pytorch.txt 2>&1
     say "main + PyTorch rc=$?"
     i=0
     for v in main gather gather main main gather gather main; do
       i=$((i+1)); B=.device/gpukit; [ $v = gather ] && B=.device/gpukit-gather
       # shellcheck disable=SC2086
       timeout 120 env -u LD_LIBRARY_PATH $B train --gpus 2 $M --save-json $OUT/t/g-$i-$v.json > $OUT/t/g-$i-$v.txt 2>&1
       say "$v turn $i rc=$?"
     done
     python3 - $OUT/t <<'PY' 2>&1 | tee -a "$S"
import json, sys, os, glob
for p in sorted(glob.glob(os.path.join(sys.argv[1], "g-*.json"))):
    r = json.load(open(p))["result"]; d = r.get("data_parallel") or {}; pt = d.get("pytorch") or {}
    print(f"{os.path.basename(p):22} eff {d.get('scaling_efficiency', 0):.3f} step {d.get('step_ms')} single {d.get('single_step_ms')} "
          f"samples/s {d.get('samples_per_s', 0):.0f} pool peak {(r.get('memory') or {}).get('pool_peak', 0)/2**20:.0f} MiB exposed {d.get('exposed_comm_ms', 0):.3f} ms"
          + (f" | DDP eff {pt.get('scaling_efficiency', 0):.3f} samples/s {pt.get('samples_per_s', 0):.0f}; compiled DDP {(pt.get('compiled') or {}).get('samples_per_s', 0):.0f}" if pt else ""))
    print("   losses", [round(x, 6) for x in r["step_losses"][:3]], "...", [round(x, 6) for x in r["step_losses"][-2:]])
PY
     tar czf $OUT/gather.tgz -C $OUT/t . ; rm -rf $OUT/t ;;
  # X3: the pipeline's update after its last send, its input gradient sent before the first
  #     layer's weight gradient (new build) against main's (old) in turns, bf16 8 micro-batches,
  #     gpukit's split, traced; NCCL's transfers, 4 and 16 micro-batches, fp32 once each; then X2
  X3) $T timeout 120 .device/tests/gpu_train --test-threads 1 --nocapture pipeline > $OUT/t/pp-test.log 2>&1
     say "pipeline test rc=$?: $(grep 'test result' $OUT/t/pp-test.log)"; grep -E 'FAILED|failed|panicked|within' $OUT/t/pp-test.log | head -12 | tee -a "$S"
     P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
     i=0
     for v in new:bf16:40:8 old:bf16:40:8 new:bf16:40:8 old:bf16:40:8 new:bf16:40:8 newnccl:bf16:40:8 oldnccl:bf16:40:8 new:bf16:40:4 new:bf16:40:16 new:fp32:20:8; do
       i=$((i+1)); IFS=: read -r which prec steps m <<< "$v"
       E=""; case $which in *nccl) E="GPUKIT_PIPE_NCCL=1";; esac
       B=.device/gpukit; case $which in old*) B=.device/gpukit-old;; esac
       # shellcheck disable=SC2086
       timeout 100 env -u LD_LIBRARY_PATH GPUKIT_TRACE=1 $E $B train $P --precision $prec --steps $steps --micro-batches $m --save-json $OUT/t/pp-$i-$which-$prec-m$m.json > $OUT/t/pp-$i-$which-$prec-m$m.txt 2>&1
       say "pp $i $which $prec m$m rc=$?"; pp_row $OUT/t/pp-$i-$which-$prec-m$m.json
       grep -h "pipeline stage" $OUT/t/pp-$i-$which-$prec-m$m.txt | cut -c1-900 >> $OUT/t/pp-traces.txt
     done
     tar czf $OUT/pp.tgz -C $OUT/t . ; rm -rf $OUT/t; mkdir -p $OUT/t
     bash .device/drivers.sh X2 ;;
  # X4: scripts/gpu-multi.sh pipeline on main's build with the pipeline change (the GPU test;
  #     fp32 and bf16 beside PyTorch's Schedule1F1B; 4 and 16 micro-batches; under launch; the
  #     model that does not fit one GPU at --memory-fraction 0.4)
  X4) GPUKIT_TESTS=$PWD/.device/tests OUT=$OUT/multi timeout 560 bash scripts/gpu-multi.sh pipeline > $OUT/t/multi.log 2>&1
     say "gpu-multi pipeline rc=$?"; cat $OUT/multi/summary.txt >> "$S"
     rm -f $OUT/multi/work/*.csv; tar czf $OUT/pipeline-work.tgz -C $OUT/multi work; rm -rf $OUT/multi/work ;;
  # X5: the data-parallel GPU test three times each on main's and dp-gather-copies' builds (the
  #     margins of every case printed), then branch wgmma-fp8's fp8 product against float64 with
  #     its rate at 4096^3 beside cuBLASLt's fp8 (bench matmul), and memcheck
  X5) for i in 1 2 3; do for v in main gather; do
       D=.device/tests; [ $v = gather ] && D=.device/tests-gather
       $T timeout 100 $D/gpu_train --test-threads 1 --nocapture data_parallel > $OUT/t/dp-$v-$i.log 2>&1
       say "$v data_parallel $i rc=$?: $(grep 'test result' $OUT/t/dp-$v-$i.log)"
       grep -E 'every rank|FAILED|panicked|differ' $OUT/t/dp-$v-$i.log | sed -E 's/^test [^ ]+ \.\.\. //' | sed -E 's/(first-layer pieces [0-9]+ averaged in [a-z0-9]+).*(2 GPUs)/\1 \2/' | cut -c1-260 | tee -a "$S"
     done; done
     CS=/usr/local/cuda/bin/compute-sanitizer
     $T timeout 120 .device/tests/gpu_program_fp8 --test-threads 1 --nocapture fp8 > $OUT/t/fp8.log 2>&1
     say "fp8 rc=$?: $(grep 'test result' $OUT/t/fp8.log)"; grep -E 'fp8|FAILED|panicked|rror' $OUT/t/fp8.log | head -12 | tee -a "$S"
     timeout 120 env -u LD_LIBRARY_PATH .device/gpukit bench matmul --dtype fp8 --sizes 4096 > $OUT/t/bench-fp8.txt 2>&1
     say "bench matmul fp8 rc=$?"; tail -12 $OUT/t/bench-fp8.txt | tee -a "$S"
     $T timeout 200 $CS --tool memcheck --report-api-errors no .device/tests/gpu_program_fp8 --test-threads 1 fp8 > $OUT/t/fp8-memcheck.log 2>&1
     say "fp8 memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/t/fp8-memcheck.log | tail -1)"
     tar czf $OUT/x5.tgz -C $OUT/t . ; rm -rf $OUT/t ;;
  # X6: the data-parallel GPU test six times on each build with GPUKIT_TRACE=1 and a watchdog
  #     (a run past 40 s: GPU use, each thread's state and CPU time, its kernel wait channel,
  #     gdb's stacks where gdb exists), the pipeline test three times (margins), the pipeline
  #     bf16 m8 twice (the race fix's cost)
  X6) say "gdb: $(command -v gdb || echo none) eu-stack: $(command -v eu-stack || echo none)"
     watch_run() { # name, seconds, command...
       local name=$1 secs=$2; shift 2
       "$@" > $OUT/t/$name.log 2>&1 & local pid=$! t=0
       while kill -0 $pid 2>/dev/null && [ $t -lt $secs ]; do sleep 1; t=$((t+1)); done
       if kill -0 $pid 2>/dev/null; then
         say "$name HUNG after ${secs}s: $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader | tr '\n' ' ')"
         local p; for p in $pid $(pgrep -P $pid); do
           for tk in /proc/$p/task/*; do echo "$p $(basename $tk) $(cat $tk/comm) state $(awk '{print $3, "utime", $14, "stime", $15}' $tk/stat) wchan $(cat $tk/wchan 2>/dev/null)"; done
         done > $OUT/t/$name-threads.txt 2>&1
         sleep 2; for p in $pid $(pgrep -P $pid); do for tk in /proc/$p/task/*; do echo "$p $(basename $tk) $(awk '{print "utime", $14}' $tk/stat)"; done; done >> $OUT/t/$name-threads.txt 2>&1
         command -v gdb >/dev/null && for p in $pid $(pgrep -P $pid); do timeout 60 gdb -p $p -batch -ex "thread apply all bt 25" > $OUT/t/$name-gdb-$p.txt 2>&1; done
         kill -9 $pid $(pgrep -P $pid) 2>/dev/null; wait $pid 2>/dev/null
         grep -E "waits for|trace: data-parallel" $OUT/t/$name.log | head -8 | tee -a "$S"
         return 124
       fi
       wait $pid
     }
     for i in 1 2 3 4 5 6; do for v in main gather; do
       D=.device/tests; [ $v = gather ] && D=.device/tests-gather
       watch_run dp-$v-$i 40 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 GPUKIT_TRACE=1 $D/gpu_train --test-threads 1 --nocapture data_parallel
       say "$v data_parallel $i rc=$?: $(grep 'test result' $OUT/t/dp-$v-$i.log)"
       grep -E 'every rank|FAILED|panicked|differ' $OUT/t/dp-$v-$i.log | grep -E 'averaged in bf16|FAILED|panicked|differ' | sed -E 's/^test [^ ]+ \.\.\. //' | sed -E 's/(first-layer pieces [0-9]+ averaged in [a-z0-9]+).*(2 GPUs)/\1 \2/' | cut -c1-260 | tee -a "$S"
     done; done
     for i in 1 2 3; do
       watch_run pp-test-$i 40 env -u LD_LIBRARY_PATH GPUKIT_REQUIRE_GPU=1 .device/tests/gpu_train --test-threads 1 --nocapture pipeline
       say "pipeline test $i rc=$?: $(grep 'test result' $OUT/t/pp-test-$i.log)"; grep -E 'bf16|FAILED|differ' $OUT/t/pp-test-$i.log | sed -E 's/^test [^ ]+ \.\.\. //' | cut -c1-220 | tee -a "$S"
     done
     P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
     for i in 1 2; do
       timeout 100 env -u LD_LIBRARY_PATH GPUKIT_TRACE=1 .device/gpukit train $P --precision bf16 --steps 40 --micro-batches 8 --save-json $OUT/t/pp-$i.json > $OUT/t/pp-$i.txt 2>&1
       say "pp $i rc=$?"; pp_row $OUT/t/pp-$i.json; grep -h "pipeline stage" $OUT/t/pp-$i.txt | cut -c1-300 | tee -a "$S"
     done
     tar czf $OUT/x6.tgz -C $OUT/t . ; rm -rf $OUT/t ;;
  # X7: main with dp-gather-copies merged (the final build): the data-parallel and pipeline
  #     GPU tests, the 4096-wide MLP beside DDP and compiled DDP, then in turns the default
  #     against GPUKIT_DP_EXCHANGE=0 (NCCL); the pipeline bf16 8 micro-batches beside PyTorch's
  #     Schedule1F1B
  X7) $T timeout 60 .device/tests/gpu_train --test-threads 1 --nocapture data_parallel > $OUT/t/dp-test.log 2>&1
     say "data_parallel rc=$?: $(grep 'test result' $OUT/t/dp-test.log)"; grep -E 'every rank|FAILED|panicked|differ' $OUT/t/dp-test.log | sed -E 's/^test [^ ]+ \.\.\. //' | cut -c1-330 | tee -a "$S"
     $T timeout 60 .device/tests/gpu_train --test-threads 1 --nocapture pipeline > $OUT/t/pp-test.log 2>&1
     say "pipeline rc=$?: $(grep 'test result' $OUT/t/pp-test.log)"; grep -E 'updates|FAILED|differ' $OUT/t/pp-test.log | sed -E 's/^test [^ ]+ \.\.\. //' | cut -c1-220 | tee -a "$S"
     M="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096"
     timeout 200 env -u LD_LIBRARY_PATH .device/gpukit train --gpus 2 $M --compare-pytorch --save-json $OUT/t/g-0-default-pytorch.json > $OUT/t/g-0-default-pytorch.txt 2>&1
     say "default + PyTorch rc=$?"
     i=0
     for v in default nccl default nccl default; do
       i=$((i+1)); E=""; [ $v = nccl ] && E="GPUKIT_DP_EXCHANGE=0"
       # shellcheck disable=SC2086
       timeout 120 env -u LD_LIBRARY_PATH $E .device/gpukit train --gpus 2 $M --save-json $OUT/t/g-$i-$v.json > $OUT/t/g-$i-$v.txt 2>&1
       say "$v turn $i rc=$?"
     done
     python3 - $OUT/t <<'PY' 2>&1 | tee -a "$S"
import json, sys, os, glob
for p in sorted(glob.glob(os.path.join(sys.argv[1], "g-*.json"))):
    r = json.load(open(p))["result"]; d = r.get("data_parallel") or {}; pt = d.get("pytorch") or {}
    print(f"{os.path.basename(p):24} eff {d.get('scaling_efficiency', 0):.3f} step {[round(x, 4) for x in d.get('step_ms')]} single {[round(x, 4) for x in d.get('single_step_ms')]} "
          f"samples/s {d.get('samples_per_s', 0):.0f} copies {d.get('first_layer_exchanged')}/{d.get('weights_gathered_by_copies')} exposed {d.get('exposed_comm_ms', 0):.3f} ms"
          + (f" | DDP eff {pt.get('scaling_efficiency', 0):.3f} samples/s {pt.get('samples_per_s', 0):.0f}; compiled DDP {(pt.get('compiled') or {}).get('samples_per_s', 0):.0f} eff {(pt.get('compiled') or {}).get('scaling_efficiency', 0):.3f}; ZeRO {pt.get('zero') and 'yes'}" if pt else ""))
    print("   losses", [round(x, 6) for x in r["step_losses"][:3]], "...", [round(x, 6) for x in r["step_losses"][-2:]])
PY
     grep -h -E "MiB|Optimizer" $OUT/t/g-0-default-pytorch.txt | cut -c1-260 | head -12 | tee -a "$S"
     P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
     timeout 200 env -u LD_LIBRARY_PATH .device/gpukit train $P --precision bf16 --steps 40 --micro-batches 8 --compare-pytorch --save-json $OUT/t/pp-bf16.json > $OUT/t/pp-bf16.txt 2>&1
     say "pp bf16 m8 + PyTorch rc=$?"; pp_row $OUT/t/pp-bf16.json
     python3 -c "
import json; d=json.load(open('$OUT/t/pp-bf16.json'))['result']['pipeline']; pt=d.get('pytorch') or {}
print('  PyTorch', {k: v for k, v in pt.items() if not isinstance(v, (list, dict))})" 2>&1 | tee -a "$S"
     tar czf $OUT/x7.tgz -C $OUT/t . ; rm -rf $OUT/t ;;
  # X8: the final build's whole gpu_train suite (one GPU and two; the cases now under a 120 s
  #     watchdog each), then the data-parallel test three times more with GPUKIT_TRACE=1
  X8) $T timeout 190 .device/tests/gpu_train --test-threads 1 > $OUT/t/gpu_train.log 2>&1
     say "gpu_train rc=$?: $(grep 'test result' $OUT/t/gpu_train.log)"; grep -E '^test |FAILED|failed|panicked|still running' $OUT/t/gpu_train.log | head -20 | tee -a "$S"
     for i in 1 2; do
       $T GPUKIT_TRACE=1 timeout 30 .device/tests/gpu_train --test-threads 1 --nocapture data_parallel > $OUT/t/dp-$i.log 2>&1
       say "data_parallel $i rc=$?: $(grep 'test result' $OUT/t/dp-$i.log)"; grep -E 'FAILED|panicked|still running|waits for' $OUT/t/dp-$i.log | head -5 | tee -a "$S"
     done
     tar czf $OUT/x8.tgz -C $OUT/t . ; rm -rf $OUT/t ;;
esac
say "== done $(date -u +%FT%TZ)"
