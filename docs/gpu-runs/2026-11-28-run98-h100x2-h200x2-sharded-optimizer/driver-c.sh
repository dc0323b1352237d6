#!/usr/bin/env bash
# data-parallel call: the DP GPU test, then DP rows (sharded optimizer or not), then pipeline rows beside PyTorch
set -u
W=/tmp/w; mkdir -p $W; S=$W/0-summary.txt
say() { echo "$*" | tee -a $S; }
export GPUKIT_REQUIRE_GPU=1 PATH=/opt/torch/.venv/bin:$PATH
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tr '\n' ';')"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
for t in ${TESTS:-.device/tests/gpu_train-*}; do
  n=$(basename $t | cut -d- -f1)
  timeout ${TT:-300} $t --test-threads 1 --nocapture ${FILTER:-} >$W/$n.log 2>&1
  say "$n rc=$?: $(grep -E '^test result' $W/$n.log)"
  grep -E "FAILED|panicked|failed|stages|every rank" $W/$n.log | head -14 | cut -c1-300 | tee -a $S
done
fi
row() { # tag, args...
  tag=$1; shift; t0=$(date +%s%N)
  timeout ${T:-240} ${BIN:-.device/gpukit} train "$@" --save-json $W/$tag.json >$W/$tag.txt 2>&1
  say "$tag rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms: $*"
  grep -iE "error|FAILED|refused|Gradients|Optimizer|Step time|Bubble|Throughput|efficiency|One GPU|PyTorch" $W/$tag.txt | head -16 | cut -c1-400 | tee -a $S
  tar czf $OUT/w.tar.gz -C /tmp w
}
prow() { # tag, args...: profile train, Chrome trace
  tag=$1; shift; t0=$(date +%s%N)
  timeout ${T:-240} .device/gpukit profile train "$@" --trace $W/$tag.trace.json --save-json $W/$tag.json >$W/$tag.txt 2>&1
  say "$tag rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms: profile train $*"
  head -30 $W/$tag.txt | cut -c1-250 | tee -a $S
  tar czf $OUT/w.tar.gz -C /tmp w
}
M="--gpus 2 --layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096"
L4096=1024,4096,4096,4096,4096,4096,4096,4096,4096,16
MLP="--layers $L4096 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096"
for r in ${ROWS:-z4cmp dp4 z4 dpw z1 z4b dp4b z4c z1b}; do
  case $r in
    dp4|dp4b) row $r $M ;;
    dpw) row $r $M --grad-pieces 1 ;;
    z4|z4c) row $r $M --shard-optimizer ;;
    z4cmp) row $r $M --shard-optimizer --compare-pytorch ;;
    z1|z1b) row $r $M --shard-optimizer --grad-pieces 1 ;;
    z4b) row $r $M --shard-optimizer --grad-comm bf16 ;;
    ptz) prow $r $M --shard-optimizer --graph ;;
    ptd) prow $r $M --graph ;;
    zch8) NCCL_MAX_NCHANNELS=8 row $r $M --shard-optimizer ;;
    zch4) NCCL_MAX_NCHANNELS=4 row $r $M --shard-optimizer ;;
    zce) NCCL_P2P_USE_CUDA_MEMCPY=1 row $r $M --shard-optimizer ;;
    znov) row $r $M --shard-optimizer --bucket-mb 100000 --grad-pieces 1 ;;
    dnov) row $r $M --bucket-mb 100000 --grad-pieces 1 ;;
    z4old) BIN=.device/gpukit-old row $r $M --shard-optimizer ;;
    dp4old) BIN=.device/gpukit-old row $r $M ;;
    z4ng) row $r $M --shard-optimizer --no-graph ;;
    dp4ng) row $r $M --no-graph ;;
    z1ng) row $r $M --shard-optimizer --no-graph --grad-pieces 1 ;;
    z1ng2) row $r $M --shard-optimizer --no-graph --grad-pieces 1 ;;
    z1ngcmp) row $r $M --shard-optimizer --no-graph --grad-pieces 1 --compare-pytorch ;;
    dp1ng) row $r $M --no-graph --grad-pieces 1 ;;
    znovng) row $r $M --shard-optimizer --no-graph --grad-pieces 1 --bucket-mb 100000 ;;
    z1ngb) row $r $M --shard-optimizer --no-graph --grad-pieces 1 --grad-comm bf16 ;;
    z2ng) row $r $M --shard-optimizer --no-graph --grad-pieces 2 ;;
    z1ng8mb) row $r $M --shard-optimizer --no-graph --grad-pieces 1 --bucket-mb 8 ;;
    def|def2) row $r $M ;;
    defcmp) row $r $M --compare-pytorch ;;
    defg) row $r $M --graph ;;
    dmin32) NCCL_MIN_NCHANNELS=32 row $r $M ;;
    dmin24) NCCL_MIN_NCHANNELS=24 row $r $M ;;
    dmax16) NCCL_MAX_NCHANNELS=16 row $r $M ;;
    z8) row $r $M --shard-optimizer --grad-pieces 8 ;;
    pp32cmp) row $r --pipeline 2 $MLP --optimizer sgd --lr 0.01 --momentum 0.9 --steps 20 --precision fp32 --compare-pytorch ;;
    pp16cmp) row $r --pipeline 2 $MLP --optimizer sgd --lr 0.01 --momentum 0.9 --steps 40 --precision bf16 --compare-pytorch ;;
  esac
done
tar czf $OUT/w.tar.gz -C /tmp w
