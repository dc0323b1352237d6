#!/usr/bin/env bash
# Run 57: bench bandwidth beside PyTorch taking turns (both orders, 6 blocks a side per copy),
# default sizes 4 KiB-1 GiB, twice.
set -u
W=$(mktemp -d); S=$SECONDS
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
for i in 1 2; do
  $G timeout 280 $B bench bandwidth --device cuda:0 --compare-pytorch --save-json $W/bw-$i.json >$W/bw-$i.txt 2>$W/bw-$i.err
  echo "[$((SECONDS-S)) s] bandwidth $i rc=$?"
done
mkdir -p "$OUT"; tar czf "$OUT/run57.tar.gz" -C "$W" .
for i in 1 2; do grep -E "1 GiB|PyTorch|turns" $W/bw-$i.txt; tail -3 $W/bw-$i.err; done
