"""How close PyTorch's own reduced-precision forms of a torchvision classifier come to exact
results: the floor an engine's accuracy targets are set against.

For each model (pytorch_reference.py's seeded weights, the ones scripts/export_torchvision.py
exports) and fresh standard-normal inputs, prints one JSON line with, per form:
  - fp32 (TF32 off) against float64 (the model in float64 on the CPU, the exact reference):
    max |y - y64| / max |y64|, as `gpukit infer --onnx` judges its fp32 rows;
  - fp16 / bf16 (the model and input cast, channels-last on CUDA) against fp32: the same
    relative difference, and top-1 agreement;
  - ONNX Runtime's CPU f32 on DIR/NAME.onnx (when onnxruntime imports and the file is there)
    against float64, and against PyTorch's fp32;
  - the median top-1 margin of float64's logits over their max |logit|: how far apart the two
    best classes are on these inputs, the room a reduced format has before top-1 changes.

    python3 scripts/precision_floor.py [--device cpu|cuda] [--batch 64] [--onnx-dir DIR] NAME ...

NAME: any torchvision classifier pytorch_reference.py builds (resnet50, mobilenet_v3_large, ...).
"""
import argparse
import copy
import json
import os
import sys
import time

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_reference import seeded_classifier, set_tf32  # noqa: E402


def rel(y, ref):
    """max |y - ref| / max |ref|, in float64."""
    return float((y.double() - ref).abs().max() / ref.abs().max())


def agree(y, ref):
    return float((y.argmax(1) == ref.argmax(1)).double().mean())


def run_form(model, x, device, dtype, channels_last):
    """The logits of a copy of `model` in `dtype` on `device` (the model itself is left as it
    is: a cast back from fp16 would leave its weights rounded for the forms after)."""
    m = copy.deepcopy(model).to(device=device, dtype=dtype)
    xi = x.to(device=device, dtype=dtype)
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
        xi = xi.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        y = m(xi).double().cpu()
    del m
    return y


def ort_logits(path, x):
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed"
    if not os.path.exists(path):
        return None, f"{path} is not there"
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return torch.from_numpy(session.run(None, {name: x.numpy()})[0]).double(), None


def measure(name, args):
    started = time.time()
    model = seeded_classifier(torch, torchvision, name)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size)
    set_tf32(torch, matmul=False, cudnn=False)
    y64 = run_form(model, x, "cpu", torch.float64, False)
    y32 = run_form(model, x, args.device, torch.float32, False)
    top2 = y64.topk(2, 1).values
    margins = (top2[:, 0] - top2[:, 1]) / y64.abs().amax(1)
    out = {
        "model": name,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "batch": args.batch,
        "fp32_vs_float64": rel(y32, y64),
        "fp32_top1_vs_float64": agree(y32, y64),
        "median_top1_margin": float(margins.median()),
    }
    for label, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        y = run_form(model, x, args.device, dtype, args.device == "cuda")
        out[f"{label}_vs_fp32"] = rel(y, y32)
        out[f"{label}_top1_vs_fp32"] = agree(y, y32)
    if args.onnx_dir:
        yo, why = ort_logits(os.path.join(args.onnx_dir, f"{name}.onnx"), x)
        if yo is None:
            out["onnxruntime"] = why
        else:
            out["onnxruntime_vs_float64"] = rel(yo, y64)
            out["onnxruntime_vs_pytorch_fp32"] = rel(yo, y32)
    out["seconds"] = round(time.time() - started, 1)
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--onnx-dir", help="where NAME.onnx is (scripts/export_torchvision.py's OUT_DIR)")
    p.add_argument("names", nargs="+")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: PyTorch sees no CUDA device")
    for name in args.names:
        measure(name, args)


if __name__ == "__main__":
    main()
