#!/usr/bin/env bash
# pipeline call: GPU tests, then pipeline rows
set -u
W=/tmp/w; mkdir -p $W; S=$W/0-summary.txt
say() { echo "$*" | tee -a $S; }
export GPUKIT_REQUIRE_GPU=1 PATH=/opt/torch/.venv/bin:$PATH
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tr '\n' ';')"
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
row() { # tag, args...
  tag=$1; shift; t0=$(date +%s%N)
  timeout ${T:-240} .device/gpukit train "$@" --save-json $W/$tag.json >$W/$tag.txt 2>&1
  say "$tag rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms: $*"
  grep -iE "error|FAILED|refused|Stages|Step time|Bubble|Throughput|One GPU|Peak GPU|Schedule" $W/$tag.txt | head -16 | cut -c1-400 | tee -a $S
  tar czf $OUT/w.tar.gz -C /tmp w
}
L4096=1024,4096,4096,4096,4096,4096,4096,4096,4096,16
MLP="--layers $L4096 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096"
if [ "$MEM" -gt 100000 ]; then BIG=18; else BIG=11; fi
BIGL=1024$(for i in $(seq $BIG); do printf ,16384; done),16
for r in ${ROWS:-pp32 pp16 pp16m4 pp16m16 ppmem}; do
  case $r in
    pp32) row $r --pipeline 2 $MLP --lr 1e-4 --steps 20 --precision fp32 ;;
    pp16) row $r --pipeline 2 $MLP --steps 40 --precision bf16 ;;
    pp16m4) row $r --pipeline 2 $MLP --steps 40 --precision bf16 --micro-batches 4 ;;
    pp16m16) row $r --pipeline 2 $MLP --steps 40 --precision bf16 --micro-batches 16 ;;
    ppmem) T=400 row $r --pipeline 2 --layers $BIGL --features 1024 --loss cross-entropy --samples 40960 --batch-size 4096 --steps 10 --precision bf16 --optimizer adam --lr 1e-4 --memory-fraction 0.4 ;;
    pp32sgd) row $r --pipeline 2 $MLP --optimizer sgd --lr 0.01 --momentum 0.9 --steps 20 --precision fp32 ;;
    pp16sgd) row $r --pipeline 2 $MLP --optimizer sgd --lr 0.01 --momentum 0.9 --steps 40 --precision bf16 ;;
    ppmemsgd) T=420 row $r --pipeline 2 --layers $BIGL --features 1024 --loss cross-entropy --samples 40960 --batch-size 4096 --steps 10 --precision bf16 --optimizer sgd --lr 0.01 --momentum 0.9 --memory-fraction 0.4 ;;
    one16mem) row $r --device cuda:0 --layers $BIGL --features 1024 --loss cross-entropy --samples 40960 --batch-size 4096 --steps 10 --precision bf16 --optimizer sgd --lr 0.01 --momentum 0.9 --memory-fraction 0.4 ;;
  esac
done
tar czf $OUT/w.tar.gz -C /tmp w
if [ "${SKIP_TESTS:-0}" != 1 ]; then
for t in ${TESTS:-.device/tests/gpu_train-*}; do
  n=$(basename $t | cut -d- -f1)
  timeout ${TT:-300} $t --test-threads 1 --nocapture ${FILTER:-} >$W/$n.log 2>&1
  say "$n rc=$?: $(grep -E '^test result' $W/$n.log)"
  grep -E "FAILED|panicked|failed|stages|every rank" $W/$n.log | head -12 | cut -c1-300 | tee -a $S
done
fi
tar czf $OUT/w.tar.gz -C /tmp w
