"""PyTorch's time to a first result for ResNet-50 inference with cudnn.benchmark on: importing torch
and torchvision, building the model on the GPU, and the first forward pass (in which cuDNN's
candidates for every convolution are timed), then the second pass (already planned), the same
work gpukit's planning does. Prints one JSON line.

    python3 scripts/pytorch_first_iteration.py [--batch 32] [--dtype fp16] [--layout nhwc]
"""
import argparse
import json
import time

t_start = time.perf_counter()
import torch  # noqa: E402
import torchvision  # noqa: E402

t_import = time.perf_counter()
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--dtype", choices=["fp32", "tf32", "fp16", "bf16"], default="fp16")
p.add_argument("--layout", choices=["nchw", "nhwc"], default="nhwc")
a = p.parse_args()
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = a.dtype == "tf32"
torch.backends.cuda.matmul.allow_tf32 = a.dtype == "tf32"
dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
fmt = torch.channels_last if a.layout == "nhwc" else torch.contiguous_format
model = torchvision.models.resnet50().cuda().to(dtype).to(memory_format=fmt).eval()
x = torch.randn(a.batch, 3, 224, 224, device="cuda").to(dtype).to(memory_format=fmt)
torch.cuda.synchronize()
t_built = time.perf_counter()
with torch.no_grad():
    model(x)
torch.cuda.synchronize()
t_first = time.perf_counter()
with torch.no_grad():
    model(x)
torch.cuda.synchronize()
t_second = time.perf_counter()
print(json.dumps({
    "torch": torch.__version__, "batch": a.batch, "dtype": a.dtype, "layout": a.layout,
    "import_s": t_import - t_start, "build_s": t_built - t_import,
    "first_iteration_s": t_first - t_built, "second_iteration_s": t_second - t_first,
    "to_first_result_s": t_first - t_start,
}))
