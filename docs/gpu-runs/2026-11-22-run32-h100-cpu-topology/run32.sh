#!/usr/bin/env bash
# Run 32: do the 16 vCPUs share physical cores? Two single-threaded matmuls at once, on CPU 0 and
# on CPU j: if j is 0's hyperthread sibling, each runs at about half speed.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=$PWD/.device/gpukit
one() { # $1: cpu -> TFLOP/s of a 1-thread f32 2048 matmul pinned there
  RAYON_NUM_THREADS=1 taskset -c $1 $G $B bench matmul --device cpu --dtype f32 --sizes 2048 --iterations 12 --json 2>/dev/null \
    | python3 -c "import json,sys; print(round(json.load(sys.stdin)['matmul']['rows'][0]['tflops'],3))"
}
echo "alone on cpu 0: $(one 0) TFLOP/s"
for j in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
  one 0 >$W/a 2>&1 & one $j >$W/b 2>&1; wait
  echo "cpu 0 with cpu $j busy: $(cat $W/a) / $(cat $W/b) TFLOP/s"
done
for set in "0-7" "0-15:2" "0-15"; do
  n=$(taskset -c $set true 2>/dev/null && python3 -c "
s='$set'; import re
a,b=s.split(':')[0].split('-'); st=int(s.split(':')[1]) if ':' in s else 1
print(len(range(int(a),int(b)+1,st)))")
  r=$(RAYON_NUM_THREADS=$n taskset -c $set $G $B bench matmul --device cpu --dtype f32 --sizes 4096 --cpu-seconds 6 --json 2>/dev/null | python3 -c "import json,sys; print(round(json.load(sys.stdin)['matmul']['rows'][0]['tflops'],3))")
  echo "$n threads on cpus $set: $r TFLOP/s at 4096"
done
