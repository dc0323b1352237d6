"""Run 44: the matrix products PyTorch runs for bench matmul's rows, a few of each, for ncu to name."""
import sys
import torch

def run(dtype_name, n, reps=6):
    tf32 = dtype_name == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    dt = {"f64": torch.float64, "f32": torch.float32, "tf32": torch.float32,
          "bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
    a = torch.randn(n, n, device="cuda", dtype=dt)
    b = torch.randn(n, n, device="cuda", dtype=dt)
    c = torch.empty(n, n, device="cuda", dtype=dt)
    for _ in range(reps):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()

print("preferred blas:", torch.backends.cuda.preferred_blas_library(), file=sys.stderr)
for spec in sys.argv[1:]:
    d, n = spec.split(":")
    run(d, int(n))
