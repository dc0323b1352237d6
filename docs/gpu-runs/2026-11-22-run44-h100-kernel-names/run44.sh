#!/usr/bin/env bash
# Run 44: name the kernels behind gpukit's and PyTorch's f64 4096 and tf32 8192 products (ncu,
# clocks left alone), and try a pinned 1 GiB copy split over streams.
set -u
S=$SECONDS
D=docs/gpu-runs/2026-11-22-run44-h100-kernel-names
G="env -u LD_LIBRARY_PATH -u GPUKIT_CUDA_PATH"
B=.device/gpukit
NCU="ncu --clock-control none --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,sm__cycles_elapsed.avg.per_second --csv --page raw"
which ncu; ncu --version | tail -1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv
for spec in "f64 4096" "tf32 8192" "f64 8192" "f32 8192"; do
  set -- $spec
  echo "== gpukit $1 $2, cuBLAS only"
  timeout 120 $G $NCU $B bench matmul --device cuda:0 --dtype $1 --sizes $2 --iterations 5 --lt-candidates 0 > $OUT/ncu-gpukit-$1-$2-cublas.csv 2> $OUT/gpukit-$1-$2-cublas.err
  echo "rc $?"; tail -3 $OUT/gpukit-$1-$2-cublas.err
  echo "== gpukit $1 $2, with cuBLASLt candidates"
  timeout 180 $G $NCU $B bench matmul --device cuda:0 --dtype $1 --sizes $2 --iterations 5 > $OUT/ncu-gpukit-$1-$2-lt.csv 2> $OUT/gpukit-$1-$2-lt.err
  echo "rc $?"; grep -i "cublas\|heuristic" $OUT/ncu-gpukit-$1-$2-lt.csv | head -0
done
echo "== torch"
timeout 180 $NCU python3 $D/torch_kernels.py f64:4096 tf32:8192 f64:8192 f32:8192 > $OUT/ncu-torch.csv 2> $OUT/torch.err
echo "rc $?"; tail -3 $OUT/torch.err
echo "== cuBLAS API log, torch f64 4096"
CUBLAS_LOGINFO_DBG=1 CUBLAS_LOGDEST_DBG=stderr timeout 60 python3 $D/torch_kernels.py f64:4096 tf32:8192 2>&1 | grep -v "^\s*$" | head -60 > $OUT/cublaslog-torch.txt
echo "== cuBLAS API log, gpukit f64 4096"
CUBLAS_LOGINFO_DBG=1 CUBLAS_LOGDEST_DBG=stderr timeout 60 $G $B bench matmul --device cuda:0 --dtype f64 --sizes 4096 --iterations 2 --lt-candidates 0 2>&1 | head -80 > $OUT/cublaslog-gpukit.txt
echo "== pinned split"
timeout 120 python3 $D/pinned_split.py
echo "[$((SECONDS-S)) s]"
