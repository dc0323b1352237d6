#!/usr/bin/env bash
# Run 64: torchvision ResNet-101 whose activations pass fp16's range through infer --input,
# a bf16 NCHW conv row's candidates on both sides, then every GPU test (gpu-test.sh tests).
set -u
OUT=${OUT:-$PWD/run64-out}
G=.device/gpukit
clean() { env -u LD_LIBRARY_PATH "$@"; }
mkdir -p "$OUT/r101"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee "$OUT/device.txt"
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cudnn", torch.backends.cudnn.version())' | tee -a "$OUT/device.txt"

echo "== 1. ResNet-101 with weights that overflow fp16"
t0=$(date +%s)
timeout 200 python3 scripts/fp16_overflow_check.py make --out "$OUT/r101" --model resnet101 >"$OUT/r101/make.txt" 2>&1
echo "make rc=$? in $(( $(date +%s) - t0 )) s"; cat "$OUT/r101/make.txt" | tail -30
t0=$(date +%s)
clean timeout 300 $G infer --model-name resnet101 --weights "$OUT/r101/weights.safetensors" \
  --input "$OUT/r101/input.safetensors" --save-output "$OUT/r101/logits.safetensors" --device all \
  --strategies cpu,fp32,tf32,fp16,bf16,fp16-nhwc,bf16-nhwc --save-json "$OUT/r101/infer.json" \
  >"$OUT/r101/infer.txt" 2>&1
echo "infer rc=$? (want 1) in $(( $(date +%s) - t0 )) s"; cat "$OUT/r101/infer.txt"
python3 scripts/fp16_overflow_check.py compare --out "$OUT/r101" --logits "$OUT/r101/logits.safetensors" 2>&1 | tee "$OUT/r101/compare.txt"
rm -f "$OUT/r101/weights.safetensors" "$OUT/r101/input.safetensors"
gzip -f "$OUT/r101/infer.json"

echo "== 2. the bf16 NCHW 1x1 1024->256 @14 row: gpukit's candidates, PyTorch's plan and kernels"
clean GPUKIT_TRACE=1 GPUKIT_REPLAN=1 timeout 200 $G bench conv --dtype bf16 --layout nchw --device cuda:0 --compare-pytorch \
  >"$OUT/conv-bf16-nchw.txt" 2>"$OUT/conv-bf16-nchw-trace.txt"
echo "bench conv bf16 nchw rc=$?"; grep -E "1024 *-> *256|1024→256|BEHIND" "$OUT/conv-bf16-nchw.txt" | head
grep -E "c: 1024, h: 14, w: 14, k: 256" "$OUT/conv-bf16-nchw-trace.txt" | head -60
TORCH_CUDNN_V8_API_DEBUG=1 CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE="$OUT/torch-frontend.log" timeout 120 python3 - <<'PY' 2>&1 | tail -40
import torch
from torch.profiler import profile, ProfilerActivity
torch.backends.cudnn.benchmark = True
x = torch.randn(32, 1024, 14, 14, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, 1024, 1, 1, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    y = torch.nn.functional.conv2d(x, w)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(20):
        y = torch.nn.functional.conv2d(x, w)
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=140))
PY
gzip -f "$OUT/torch-frontend.log" 2>/dev/null; gzip -f "$OUT/conv-bf16-nchw-trace.txt"

