#!/usr/bin/env bash
# Runs on a lent machine with several GPUs, from the project root, over binaries staged into
# .device/ (see scripts/gpu-test.sh):
#   bash scripts/gpu-multi.sh [bench|train|overlap|exchange|cnn|cnn-accumulate|pipeline|split|faults|all]     (default: all)
# bench: the cuda crate's GPU tests (NCCL collectives against float64, peer copies), then
#        `bench nccl` in one process beside torch.distributed, the same sweep through
#        `gpukit launch`, through torchrun and as CUDA graphs, NCCL's socket transport (shared
#        memory and peer-to-peer off, standing in for two machines), NCCL_ALGO / NCCL_PROTO
#        choices, and `bench p2p` beside PyTorch.
# train: the training engine's GPU tests (data-parallel against one GPU on the combined batch
#        included), then the 4096-wide MLP in bf16, batch 4096 a GPU, data-parallel on every GPU
#        (threads of one process, beside PyTorch DDP; through `gpukit launch`; one bucket only).
# overlap: data-parallel's choices for hiding communication, in turns: the optimizer sharded (the
#        default) or every gradient averaged, the first layer's weight gradient whole or in 4
#        pieces each reduced when done, op-by-op launches or CUDA graphs, f32 or bf16 gradients
#        (the data-parallel GPU test first, PyTorch DDP and DDP with ZeroRedundancyOptimizer
#        once beside).
# exchange: the data-parallel GPU test, then the 4096-wide MLP with the gradients carried by the
#        copy engines (the default for threads of one process) against NCCL's reduce-scatter
#        (GPUKIT_DP_EXCHANGE=0) in turns, PyTorch's DDP modes once beside, and under
#        `gpukit launch` (processes: NCCL).
# cnn: ResNet-50 bf16 data-parallel as threads of one process and under `gpukit launch` (one
#        process a rank), their per-update losses compared; beside PyTorch's DDP modes (with
#        their peak memory); then on 4096 images a GPU.
# cnn-accumulate: ResNet-18 fp32 data-parallel with accumulation against one GPU accumulating
#        as many micro-batches over the same images (per-update losses within 1e-4).
# pipeline: the pipeline GPU test, then `train --pipeline 2` of the 1024-4096x8-16 MLP at batch 4096
#        (SGD: fp32 and bf16, beside PyTorch's Schedule1F1B; a micro-batch sweep; fp32 again as
#        one process a stage under `gpukit launch`, its losses against the threads'), and a
#        16384-wide model one GPU refuses under --memory-fraction 0.4 (sized from the GPU's memory).
# split: the pipeline GPU test, then the same model in bf16 at 8 micro-batches with gpukit's split
#        and with --pipeline-split 5,4 and 4,5, in turns, each under GPUKIT_TRACE=1 (each
#        stage's last update, operation by operation, with the gaps between).
# faults: a rank killed mid-run, a wrong WORLD_SIZE, a missing MASTER_ADDR, an occupied port, a
#        rank that never arrives: every surviving process must exit non-zero with a message
#        within the timeout.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0): the lent machines share their GPUs' host.
set -u
MODE=${1:-all}
OUT=${OUT:-$PWD/gpu-run-out}
W=$OUT/work
mkdir -p "$W"
BIN=${GPUKIT_BIN:-$PWD/.device/gpukit}
TESTS=${GPUKIT_TESTS:-$PWD/.device/tests}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
say() { echo "$*" | tee -a "$SUMMARY"; }
clean() { env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH "$@"; }
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)

say "== gpu-multi $MODE $(date -u +%FT%TZ) on $(hostname): $NGPU GPUs"
nvidia-smi topo -m >"$W/topo.txt" 2>&1; cat "$W/topo.txt" | tee -a "$SUMMARY"
nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv | tee -a "$SUMMARY"
python3 -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count())' 2>&1 | tee -a "$SUMMARY"

if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  if [ -x "$TESTS/gpu" ]; then
    clean env GPUKIT_REQUIRE_GPU=1 "$TESTS/gpu" >"$W/cuda-gpu-tests.txt" 2>&1
    say "cuda crate GPU tests rc=$? ($(grep -c '\.\.\. ok' "$W/cuda-gpu-tests.txt") ok): $(grep 'test result' "$W/cuda-gpu-tests.txt")"
    grep -E 'FAILED|panicked|Error' "$W/cuda-gpu-tests.txt" | head -5 | tee -a "$SUMMARY"
  fi
  if [ -x "$TESTS/cli" ]; then
    for f in a_rank_without_peers launch_starts bench_bad_input; do
      clean env GPUKIT_REQUIRE_GPU=1 GPUKIT_BIN="$BIN" "$TESTS/cli" "$f" >>"$W/cli-tests.txt" 2>&1
      say "cli test $f rc=$?"
    done
  fi
  t=$(date +%s)
  clean "$BIN" bench nccl --gpus "$NGPU" --compare-pytorch --save-json "$W/nccl-one.json" >"$W/nccl-one.txt" 2>"$W/nccl-one.err"
  say "bench nccl one process (all ops, f32, 8B-1G, both places) + PyTorch rc=$? $(( $(date +%s) - t ))s"
  clean "$BIN" bench nccl --gpus "$NGPU" --ops all_reduce,all_gather,reduce_scatter --dtype bf16 --place out --save-json "$W/nccl-bf16.json" >"$W/nccl-bf16.txt" 2>&1
  say "bench nccl bf16 rc=$?"
  AR="--ops all_reduce --place out --min-bytes 8 --max-bytes 1G"
  clean "$BIN" bench nccl --gpus "$NGPU" $AR --save-json "$W/ar-one-b.json" >"$W/ar-one-b.txt" 2>&1
  say "all_reduce one process (A/A second run) rc=$?"
  clean "$BIN" launch --nproc-per-node "$NGPU" -- "$BIN" bench nccl $AR --save-json "$W/ar-launch.json" >"$W/ar-launch.txt" 2>"$W/ar-launch.err"
  say "all_reduce via gpukit launch rc=$?"
  clean torchrun --standalone --nproc-per-node "$NGPU" --no-python "$BIN" bench nccl $AR --save-json "$W/ar-torchrun.json" >"$W/ar-torchrun.txt" 2>"$W/ar-torchrun.err"
  say "all_reduce via torchrun rc=$?"
  # torchrun sets OMP_NUM_THREADS=1 for its children: the one difference from gpukit launch
  clean env OMP_NUM_THREADS=8 torchrun --standalone --nproc-per-node "$NGPU" --no-python "$BIN" bench nccl $AR --save-json "$W/ar-torchrun-omp8.json" >/dev/null 2>&1
  say "all_reduce via torchrun, OMP_NUM_THREADS=8 rc=$?"
  clean env OMP_NUM_THREADS=1 "$BIN" launch --nproc-per-node "$NGPU" -- "$BIN" bench nccl $AR --save-json "$W/ar-launch-omp1.json" >/dev/null 2>&1
  say "all_reduce via gpukit launch, OMP_NUM_THREADS=1 rc=$?"
  clean "$BIN" bench nccl --gpus "$NGPU" $AR --graph --save-json "$W/ar-graph.json" >"$W/ar-graph.txt" 2>&1
  say "all_reduce as CUDA graphs rc=$?"
  clean env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "$BIN" launch --nproc-per-node "$NGPU" -- "$BIN" bench nccl --ops all_reduce,all_gather --place out --max-bytes 256M --save-json "$W/socket.json" >"$W/socket.txt" 2>"$W/socket.err"
  say "socket transport (P2P and SHM off) via gpukit launch rc=$?"
  for algo in Ring Tree; do
    for proto in Simple LL LL128; do
      clean env NCCL_ALGO=$algo NCCL_PROTO=$proto "$BIN" bench nccl --gpus "$NGPU" --ops all_reduce --place out --min-bytes 8 --max-bytes 1G --step-factor 8 --save-json "$W/ar-$algo-$proto.json" >/dev/null 2>"$W/ar-$algo-$proto.err"
      say "all_reduce NCCL_ALGO=$algo NCCL_PROTO=$proto rc=$?"
    done
  done
  clean "$BIN" bench p2p --compare-pytorch --save-json "$W/p2p.json" >"$W/p2p.txt" 2>&1
  say "bench p2p + PyTorch rc=$?"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys, os
w = sys.argv[1]
def rows(name):
    p = os.path.join(w, name)
    if not os.path.exists(p):
        return {}
    d = json.load(open(p))
    return {(r["op"], r["dtype"], r["bytes"]): r for r in d["result"]["rows"]}
one = rows("nccl-one.json")
runs = {n: rows(f) for n, f in [("one", "nccl-one.json"), ("one-b", "ar-one-b.json"), ("launch", "ar-launch.json"),
        ("torchrun", "ar-torchrun.json"), ("graph", "ar-graph.json"), ("tr-omp8", "ar-torchrun-omp8.json"),
        ("la-omp1", "ar-launch-omp1.json")]}
want = {8: None, 1 << 20: 21.0, 512 << 10: 31.6, 8 << 20: 168, 16 << 20: 218, 32 << 20: 233, 128 << 20: 282, 512 << 20: 310, 1 << 30: 328}
print("all_reduce f32 out of place, busbw GB/s (time us at 8 B):")
names = ["one", "one-b", "launch", "torchrun", "graph", "tr-omp8", "la-omp1"]
print("%10s" % "size" + "".join("%9s" % n for n in names) + "%9s %9s" % ("torch", "ours/torch"))
for b in [8, 1 << 10, 64 << 10, 512 << 10, 1 << 20, 8 << 20, 16 << 20, 32 << 20, 128 << 20, 512 << 20, 1 << 30]:
    cells = []
    for n in names:
        r = runs[n].get(("all_reduce", "f32", b))
        f = r and r.get("out_of_place")
        cells.append("-" if not f else ("%.1fus" % f["time_us"] if b == 8 else "%.1f" % f["busbw_gbs"]))
    r = one.get(("all_reduce", "f32", b)); p = r and r.get("pytorch")
    cells.append("-" if not p else ("%.1fus" % (p["median_ms"] * 1e3) if b == 8 else "%.1f" % p["rate"]))
    cells.append("-" if not p else "%.2f" % p["ratio"])
    print("%10d" % b + "".join("%9s" % c for c in cells))
for op in ["all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall"]:
    for b in [512 << 10, 1 << 20, 32 << 20, 512 << 20, 1 << 30]:
        r = one.get((op, "f32", b))
        if r and r.get("out_of_place"):
            p = r.get("pytorch")
            print(f"  {op:15} {b:>11} busbw {r['out_of_place']['busbw_gbs']:7.1f} in-place {(r.get('in_place') or {}).get('busbw_gbs', 0):7.1f} torch {p['rate'] if p else 0:7.1f} ratio {p['ratio'] if p else 0:5.2f}")
wrong = sum((f or {}).get("wrong", 0) for d in runs.values() for r in d.values() for f in [r.get("out_of_place"), r.get("in_place")])
print("total #wrong over every run:", wrong)
PY
  tail -3 "$W/ar-launch.err" "$W/ar-torchrun.err" "$W/socket.err" 2>/dev/null | tee -a "$SUMMARY"
fi

if [ "$MODE" = train ] || [ "$MODE" = all ]; then
  if [ -x "$TESTS/gpu_train" ]; then
    clean env GPUKIT_REQUIRE_GPU=1 "$TESTS/gpu_train" --test-threads 1 >"$W/train-gpu-tests.txt" 2>&1
    say "training engine GPU tests rc=$?: $(grep 'test result' "$W/train-gpu-tests.txt")"
    grep -E 'every rank|FAILED|failed|panicked' "$W/train-gpu-tests.txt" | head -8 | tee -a "$SUMMARY"
  fi
  M0="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16"
  M="$M0 --batch-size 4096"
  clean "$BIN" train --gpus "$NGPU" $M --compare-pytorch --save-json "$W/dp-threads.json" >"$W/dp-threads.txt" 2>"$W/dp-threads.err"
  say "train data-parallel, threads + PyTorch DDP rc=$?"
  clean "$BIN" train --gpus "$NGPU" $M --save-json "$W/dp-threads-b.json" >/dev/null 2>&1
  say "train data-parallel, threads (A/A) rc=$?"
  clean "$BIN" launch --nproc-per-node "$NGPU" -- "$BIN" train $M --save-json "$W/dp-launch.json" >"$W/dp-launch.txt" 2>"$W/dp-launch.err"
  say "train data-parallel via gpukit launch rc=$?"
  clean "$BIN" train --gpus "$NGPU" $M --bucket-mb 100000 --save-json "$W/dp-onebucket.json" >/dev/null 2>&1
  say "train data-parallel, one bucket (no overlap) rc=$?"
  clean "$BIN" train --gpus "$NGPU" $M --bucket-mb 8 --save-json "$W/dp-8mb.json" >/dev/null 2>&1
  say "train data-parallel, 8 MiB buckets rc=$?"
  clean env NCCL_MAX_NCHANNELS=8 "$BIN" train --gpus "$NGPU" $M --save-json "$W/dp-8ch.json" >/dev/null 2>&1
  say "train data-parallel, NCCL_MAX_NCHANNELS=8 rc=$?"
  clean "$BIN" train --device cuda:0 $M0 --batch-size $((4096 * NGPU)) --save-json "$W/one-combined.json" >/dev/null 2>&1
  say "train one GPU on the combined batch rc=$?"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys, os
w = sys.argv[1]
for f in ["dp-threads.json", "dp-threads-b.json", "dp-launch.json", "dp-onebucket.json", "dp-8mb.json", "dp-8ch.json"]:
    p = os.path.join(w, f)
    if not os.path.exists(p):
        print(f, "missing"); continue
    r = json.load(open(p))["result"]; d = r.get("data_parallel") or {}
    pt = d.get("pytorch") or {}
    print(f"{f:20} eff {d.get('scaling_efficiency', 0):.3f} step {d.get('step_ms')} single {d.get('single_step_ms')} "
          f"samples/s {d.get('samples_per_s', 0):.0f} buckets {d.get('buckets')} exposed {d.get('exposed_comm_ms', 0):.3f} ms"
          + (f" | DDP eff {pt.get('scaling_efficiency', 0):.3f} samples/s {pt.get('samples_per_s', 0):.0f} single {pt.get('single_samples_per_s', 0):.0f}" if pt else ""))
    print("   losses", [round(x, 6) for x in r["step_losses"][:4]], "...", [round(x, 6) for x in r["step_losses"][-2:]])
p = os.path.join(w, "one-combined.json")
if os.path.exists(p):
    r = json.load(open(p))["result"]
    print("one GPU, combined batch: losses", [round(x, 6) for x in r["step_losses"][:4]], "...", [round(x, 6) for x in r["step_losses"][-2:]])
PY
  tail -3 "$W/dp-threads.err" "$W/dp-launch.err" | tee -a "$SUMMARY"
fi

if [ "$MODE" = cnn ]; then
  # ResNet-50 bf16, 256 a GPU, data-parallel as threads of one process and as one process a
  # rank under `gpukit launch` (the same losses: the same data, order and weights)
  C="--model resnet50 --precision bf16 --batch-size 256 --steps 30"
  clean "$BIN" train $C --device cuda:0 --gpus "$NGPU" --save-json "$W/cnn-threads.json" --save-losses "$W/cnn-threads.csv" >"$W/cnn-threads.txt" 2>"$W/cnn-threads.err"
  say "train --model resnet50 --gpus $NGPU (threads) rc=$?"
  clean timeout 300 "$BIN" launch --nproc-per-node "$NGPU" -- "$BIN" train $C --save-json "$W/cnn-launch.json" --save-losses "$W/cnn-launch.csv" >"$W/cnn-launch.txt" 2>"$W/cnn-launch.err"
  say "train --model resnet50 under gpukit launch ($NGPU processes) rc=$?"
  grep -hE "Scaling efficiency|Images|Step time|Update" "$W/cnn-threads.txt" "$W/cnn-launch.txt" | cut -c1-200 | tee -a "$SUMMARY"
  # beside PyTorch's DDP modes (eager, compiled), each with its peak memory a GPU
  clean "$BIN" train $C --device cuda:0 --gpus "$NGPU" --compare-pytorch --save-json "$W/cnn-compare.json" >"$W/cnn-compare.txt" 2>"$W/cnn-compare.err"
  say "train --model resnet50 --gpus $NGPU --compare-pytorch rc=$?"
  grep -hE "PyTorch|Scaling efficiency|peak" "$W/cnn-compare.txt" | cut -c1-260 | tee -a "$SUMMARY"
  # a data set of many batches (each GPU keeps it and gathers every batch there)
  clean "$BIN" train $C --samples $((4096 * NGPU)) --device cuda:0 --gpus "$NGPU" --save-json "$W/cnn-many.json" >"$W/cnn-many.txt" 2>"$W/cnn-many.err"
  say "train --model resnet50 --gpus $NGPU, $((4096 * NGPU)) images rc=$?"
  grep -hE "Scaling efficiency|Images/s|Batches from" "$W/cnn-many.txt" | cut -c1-200 | tee -a "$SUMMARY"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import csv, sys, os
w = sys.argv[1]
def losses(n):
    p = os.path.join(w, n)
    return [float(r["loss"]) for r in csv.DictReader(open(p))] if os.path.exists(p) else []
a, b = losses("cnn-threads.csv"), losses("cnn-launch.csv")
if a and len(a) == len(b):
    print("threads vs launch: %d updates, losses within %.1e relative" % (len(a), max(abs(x - y) / abs(x) for x, y in zip(a, b))))
else:
    print("threads vs launch: %d against %d updates" % (len(a), len(b)))
PY
fi

if [ "$MODE" = cnn-accumulate ]; then
  # data-parallel accumulation: 2 ranks x 2 micro-batches of 32 against one GPU accumulating
  # 4 micro-batches of 32 over the same images (batch norm is per micro-batch either way, so
  # the updates are the same up to the order of the sums): fp32 losses within 1e-4. The one-GPU
  # run twice gives the floor (cuDNN's f32 algorithms need not sum in one order).
  C="--model resnet18 --image-size 64 --classes 10 --precision fp32 --samples 512 --steps 4 --lr 0.001 --device cuda:0 --batch-size 32"
  clean "$BIN" train $C --gpus 2 --accumulate 2 --save-json "$W/acc-dp.json" --save-losses "$W/acc-dp.csv" >"$W/acc-dp.txt" 2>"$W/acc-dp.err"
  say "train resnet18 --gpus 2 --accumulate 2 rc=$?"
  for i in 1 2; do
    clean "$BIN" train $C --accumulate 4 --save-json "$W/acc-one$i.json" --save-losses "$W/acc-one$i.csv" >"$W/acc-one$i.txt" 2>"$W/acc-one$i.err"
    say "train resnet18 --accumulate 4 (one GPU, run $i) rc=$?"
  done
  C1="${C/--device cuda:0 /}"
  clean timeout 300 "$BIN" launch --nproc-per-node 2 -- "$BIN" train $C1 --accumulate 2 --save-json "$W/acc-launch.json" --save-losses "$W/acc-launch.csv" >"$W/acc-launch.txt" 2>"$W/acc-launch.err"
  say "train resnet18 --accumulate 2 under gpukit launch (2 processes) rc=$?"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import csv, sys, os
w = sys.argv[1]
def losses(n):
    p = os.path.join(w, n)
    return [float(r["loss"]) for r in csv.DictReader(open(p))] if os.path.exists(p) else []
b = losses("acc-one1.csv")
for name in ("acc-one2.csv", "acc-dp.csv", "acc-launch.csv"):
    a = losses(name)
    worst = max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=float("nan"))
    ok = len(a) == len(b) == 4 and worst < 1e-4
    print("%s vs one GPU: %d / %d updates, losses within %.1e: %s" % (name, len(a), len(b), worst, "ok" if ok else "FAILED"))
    print("   ", ["%.7f" % x for x in a], "one GPU", ["%.7f" % x for x in b])
PY
fi

if [ "$MODE" = overlap ]; then
  # issue 36's choices, measured in turns on the same machine: the first layer's weight
  # gradient whole (one bucket of it) or in pieces each averaged when done, and bf16 averaging
  if [ -x "$TESTS/gpu_train" ]; then
    clean env GPUKIT_REQUIRE_GPU=1 "$TESTS/gpu_train" --test-threads 1 data_parallel >"$W/train-dp-test.txt" 2>&1
    say "data-parallel GPU test rc=$?: $(grep 'test result' "$W/train-dp-test.txt")"
    grep -E 'every rank|FAILED|failed|panicked' "$W/train-dp-test.txt" | head -8 | tee -a "$SUMMARY"
  fi
  M0="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16"
  M="$M0 --batch-size 4096"
  clean "$BIN" train --gpus "$NGPU" $M --compare-pytorch --save-json "$W/ov-default-ddp.json" >"$W/ov-default-ddp.txt" 2>"$W/ov-default-ddp.err"
  say "default (optimizer sharded) + PyTorch DDP and DDP with ZeroRedundancyOptimizer rc=$?"
  # cuda:0's whole data-parallel run recorded, its communication stream's kernels beside the
  # products (a timeline of what overlaps)
  clean timeout 180 "$BIN" profile train --gpus "$NGPU" ${M0/--epochs 4/--epochs 2} --batch-size 4096 --trace "$W/dp-profile.trace.json" --save-json "$W/dp-profile.json" >"$W/dp-profile.txt" 2>"$W/dp-profile.err"
  say "profile train --gpus $NGPU rc=$?"
  head -40 "$W/dp-profile.txt" | cut -c1-200 | tee -a "$SUMMARY"
  for turn in a b; do
    for v in "zero:" "zero-sms8:--comm-sms 8" "zero-sms16:--comm-sms 16" "zero-sms24:--comm-sms 24" "zero-sms32:--comm-sms 32" "zero-p4:--grad-pieces 4" "zero-graph:--graph" "zero-bf16:--grad-comm bf16" "dp-whole:--no-shard-optimizer --grad-pieces 1" "dp-p4:--no-shard-optimizer --grad-pieces 4" "dp-p4-graph:--no-shard-optimizer --grad-pieces 4 --graph"; do
      name=${v%%:*}; flags=${v#*:}
      clean timeout 120 "$BIN" train --gpus "$NGPU" $M $flags --save-json "$W/ov-$name-$turn.json" >/dev/null 2>"$W/ov-$name-$turn.err"
      say "$name ($flags) turn $turn rc=$?"
    done
  done
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys, os, glob
w = sys.argv[1]
for p in sorted(glob.glob(os.path.join(w, "ov-*.json"))):
    r = json.load(open(p))["result"]; d = r.get("data_parallel") or {}
    pt = d.get("pytorch") or {}
    print(f"{os.path.basename(p):22} eff {d.get('scaling_efficiency', 0):.3f} step {d.get('step_ms')} single {d.get('single_step_ms')} "
          f"samples/s {d.get('samples_per_s', 0):.0f} pieces {d.get('grad_pieces')} comm {d.get('grad_comm')} sharded {d.get('sharded_optimizer')} exposed {d.get('exposed_comm_ms', 0):.3f} ms"
          + (f" | DDP eff {pt.get('scaling_efficiency', 0):.3f} samples/s {pt.get('samples_per_s', 0):.0f} ZeRO {pt.get('zero')}" if pt else ""))
    print("   losses", [round(x, 6) for x in r["step_losses"][:3]], "...", [round(x, 6) for x in r["step_losses"][-2:]])
PY
fi

if [ "$MODE" = exchange ]; then
  # the gradients carried by the copy engines (the default) against NCCL's reduce-scatter
  # (GPUKIT_DP_EXCHANGE=0), in turns; the data-parallel GPU test (its exchange cases) first
  if [ -x "$TESTS/gpu_train" ]; then
    clean env GPUKIT_REQUIRE_GPU=1 "$TESTS/gpu_train" --test-threads 1 --nocapture data_parallel >"$W/train-dp-test.txt" 2>&1
    say "data-parallel GPU test rc=$?: $(grep 'test result' "$W/train-dp-test.txt")"
    grep -E 'every rank|FAILED|failed|panicked' "$W/train-dp-test.txt" | head -12 | tee -a "$SUMMARY"
  fi
  M="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096"
  clean "$BIN" train --gpus "$NGPU" $M --compare-pytorch --save-json "$W/ex-0-exchange-pytorch.json" >"$W/ex-0-exchange-pytorch.txt" 2>"$W/ex-0-exchange-pytorch.err"
  say "default (copy engines) + PyTorch rc=$?"
  i=0
  for v in nccl exchange exchange nccl nccl exchange; do
    i=$((i + 1)); E=""; [ "$v" = nccl ] && E="GPUKIT_DP_EXCHANGE=0"
    # shellcheck disable=SC2086
    clean env $E timeout 120 "$BIN" train --gpus "$NGPU" $M --save-json "$W/ex-$i-$v.json" >"$W/ex-$i-$v.txt" 2>"$W/ex-$i-$v.err"
    say "$v turn $i rc=$?"
  done
  clean timeout 200 "$BIN" launch --nproc-per-node "$NGPU" -- "$BIN" train $M --save-json "$W/ex-launch.json" >"$W/ex-launch.txt" 2>"$W/ex-launch.err"
  say "under gpukit launch (NCCL) rc=$?"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys, os, glob
w = sys.argv[1]
for p in sorted(glob.glob(os.path.join(w, "ex-*.json"))):
    r = json.load(open(p))["result"]; d = r.get("data_parallel") or {}
    pt = d.get("pytorch") or {}
    print(f"{os.path.basename(p):24} eff {d.get('scaling_efficiency', 0):.3f} step {d.get('step_ms')} single {d.get('single_step_ms')} "
          f"samples/s {d.get('samples_per_s', 0):.0f} pieces {d.get('grad_pieces')} copy engines {d.get('first_layer_exchanged')} exposed {d.get('exposed_comm_ms', 0):.3f} ms"
          + (f" | DDP eff {pt.get('scaling_efficiency', 0):.3f} samples/s {pt.get('samples_per_s', 0):.0f}; compiled DDP {(pt.get('compiled') or {}).get('samples_per_s', 0):.0f}" if pt else ""))
    print("   losses", [round(x, 6) for x in r["step_losses"][:3]], "...", [round(x, 6) for x in r["step_losses"][-2:]])
PY
fi

if [ "$MODE" = pipeline ]; then
  if [ -x "$TESTS/gpu_train" ]; then
    clean env GPUKIT_REQUIRE_GPU=1 "$TESTS/gpu_train" --test-threads 1 --nocapture pipeline >"$W/pipeline-test.txt" 2>&1
    say "pipeline GPU test rc=$?: $(grep 'test result' "$W/pipeline-test.txt")"
    grep -E 'stages|FAILED|failed|panicked' "$W/pipeline-test.txt" | head -8 | tee -a "$SUMMARY"
  fi
  P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9"
  for v in "fp32:--precision fp32 --steps 20 --compare-pytorch" "bf16:--precision bf16 --steps 40 --compare-pytorch" "bf16m4:--precision bf16 --steps 40 --micro-batches 4" "bf16m16:--precision bf16 --steps 40 --micro-batches 16"; do
    name=${v%%:*}; flags=${v#*:}
    clean "$BIN" train $P $flags --save-json "$W/pp-$name.json" >"$W/pp-$name.txt" 2>"$W/pp-$name.err"
    say "pipeline $name ($flags) rc=$?"
  done
  # the same fp32 pipeline as one process a stage under `gpukit launch`: the same losses
  clean timeout 300 "$BIN" launch --nproc-per-node 2 -- "$BIN" train $P --precision fp32 --steps 20 --save-json "$W/pp-launch.json" --save-losses "$W/pp-launch.csv" >"$W/pp-launch.txt" 2>"$W/pp-launch.err"
  say "pipeline fp32 under gpukit launch (2 processes) rc=$?"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys, os
w = sys.argv[1]
try:
    a = json.load(open(os.path.join(w, "pp-fp32.json")))["result"]["step_losses"]
    b = json.load(open(os.path.join(w, "pp-launch.json")))["result"]["step_losses"]
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    print("pipeline threads vs launch: %d / %d updates, losses within %.1e: %s" % (len(a), len(b), worst, "ok" if len(a) == len(b) and worst <= 1e-5 else "FAILED"))
except Exception as e:
    print("pipeline threads vs launch: no comparison (%s)" % e)
PY
  # one GPU's 0.4 must be too little for the whole model and enough for each half
  MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  BIG=$(( MIB > 100000 ? 18 : 11 ))
  L=1024$(for i in $(seq $BIG); do printf ,16384; done),16
  clean "$BIN" train --pipeline 2 --layers "$L" --features 1024 --loss cross-entropy --samples 40960 --batch-size 4096 --steps 10 --precision bf16 --optimizer sgd --lr 0.01 --momentum 0.9 --memory-fraction 0.4 --save-json "$W/pp-memory.json" >"$W/pp-memory.txt" 2>"$W/pp-memory.err"
  say "pipeline of a model one GPU refuses under --memory-fraction 0.4 ($BIG layers of 16384) rc=$?"
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys, os, glob
w = sys.argv[1]
for p in sorted(glob.glob(os.path.join(w, "pp-*.json"))):
    r = json.load(open(p))["result"]; d = r.get("pipeline") or {}
    one, pt = d.get("one_gpu") or {}, d.get("pytorch") or {}
    print(f"{os.path.basename(p):16} bubble {d.get('bubble', 0):.3f} (schedule {d.get('bubble_schedule', 0):.3f}) "
          f"steps {d.get('step_ms')} alone {d.get('alone_step_ms')} samples/s {d.get('samples_per_s', 0):.0f}"
          + (f" | one GPU {one.get('samples_per_s', 0):.0f} losses within {one.get('max_loss_rel_diff', 0):.1e}" if one else "")
          + (f" | PyTorch {pt.get('samples_per_s', 0):.0f}" if pt else "")
          + (f" | one GPU refused under the fraction" if d.get("one_gpu_refused") else ""))
PY
fi

if [ "$MODE" = split ]; then
  if [ -x "$TESTS/gpu_train" ]; then
    clean env GPUKIT_REQUIRE_GPU=1 "$TESTS/gpu_train" --test-threads 1 --nocapture pipeline >"$W/pipeline-test.txt" 2>&1
    say "pipeline GPU test rc=$?: $(grep 'test result' "$W/pipeline-test.txt")"
  fi
  P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9 --precision bf16 --steps 40 --micro-batches 8"
  i=0
  for v in auto 5,4 4,5 auto 4,5 5,4; do
    i=$((i + 1)); S=""; [ "$v" != auto ] && S="--pipeline-split $v"
    # shellcheck disable=SC2086
    clean env GPUKIT_TRACE=1 timeout 100 "$BIN" train $P $S --save-json "$W/split-$i.json" >"$W/split-$i.txt" 2>"$W/split-$i.err"
    say "split $v turn $i rc=$?"
    grep -h "pipeline stage" "$W/split-$i.txt" "$W/split-$i.err" | cut -c1-600 | tee -a "$SUMMARY"
  done
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys, os, glob
w = sys.argv[1]
for p in sorted(glob.glob(os.path.join(w, "split-*.json"))):
    d = json.load(open(p))["result"].get("pipeline") or {}
    print(f"{os.path.basename(p):14} layers {d.get('layers')} given {d.get('split_given')} bubble {d.get('bubble', 0):.3f} "
          f"(schedule {d.get('bubble_schedule', 0):.3f}) samples/s {d.get('samples_per_s', 0):.0f} alone {d.get('alone_step_ms')} steps {d.get('step_ms')}")
PY
fi

if [ "$MODE" = faults ] || [ "$MODE" = all ]; then
  # a rank killed mid-run: its peer must exit with a message within the timeout
  t=$(date +%s)
  clean "$BIN" launch --nproc-per-node 2 --timeout 20 -- "$BIN" bench nccl --ops all_reduce --iterations 6000 --repeats 1 --place out --min-bytes 1G --max-bytes 1G --timeout 10 >"$W/kill.txt" 2>&1 &
  LP=$!
  sleep 10
  victim=$(pgrep -f "bench nccl --ops all_reduce --iterations 6000" | while read p; do grep -qz '^RANK=1$' /proc/$p/environ 2>/dev/null && echo $p; done | head -1)
  say "killing rank 1 (pid ${victim:-none}) mid-run"
  [ -n "$victim" ] && kill -9 "$victim"
  wait $LP; rc=$?
  say "rank killed: launch rc=$rc after $(( $(date +%s) - t ))s; messages: $(grep -E 'error|rank' "$W/kill.txt" | tail -3 | tr '\n' ' ')"
  # a wrong WORLD_SIZE between two hand-started ranks
  P=29611
  clean env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P "$BIN" bench nccl --ops all_reduce --max-bytes 1M --timeout 10 >"$W/ws0.txt" 2>&1 &
  A=$!
  clean env RANK=1 WORLD_SIZE=3 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P "$BIN" bench nccl --ops all_reduce --max-bytes 1M --timeout 10 >"$W/ws1.txt" 2>&1
  r1=$?; wait $A; r0=$?
  say "wrong WORLD_SIZE: rc $r0/$r1: $(tail -1 "$W/ws0.txt") | $(tail -1 "$W/ws1.txt")"
  # a missing MASTER_ADDR (torchrun's variables without it)
  clean env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_PORT=$P "$BIN" bench nccl --max-bytes 1M >"$W/noaddr.txt" 2>&1
  say "missing MASTER_ADDR: rc=$? $(tail -1 "$W/noaddr.txt")"
  # an occupied port
  python3 -c 'import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 29612)); s.listen(); time.sleep(30)' &
  H=$!; sleep 1
  t=$(date +%s)
  clean "$BIN" launch --nproc-per-node 2 --master-port 29612 --timeout 10 -- "$BIN" bench nccl --max-bytes 1M --timeout 10 >"$W/port.txt" 2>&1
  say "occupied port: rc=$? after $(( $(date +%s) - t ))s: $(grep -m2 error "$W/port.txt" | tr '\n' ' ')"
  kill $H 2>/dev/null
  # a rank that never arrives
  t=$(date +%s)
  clean env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29613 "$BIN" bench nccl --max-bytes 1M --timeout 5 >"$W/absent.txt" 2>&1
  say "rank 1 never started: rc=$? after $(( $(date +%s) - t ))s: $(tail -1 "$W/absent.txt")"
fi
cp "$SUMMARY" "$OUT/summary-copy.txt" 2>/dev/null
tar -czf "$OUT/gpu-run.tar.gz" -C "$OUT" work 2>/dev/null
rm -rf "$W"
cat "$SUMMARY"
