#!/usr/bin/env python3
"""Makes a torchvision ResNet whose activations pass fp16's range, for checking that
`gpukit infer --input` fails the fp16 rows and names the layer where the overflow begins.

  fp16_overflow_check.py make --out DIR [--model resnet101] [--target 1e6] [--batch 2]
      Builds torchvision's ResNet (random weights, seed 0) with its batch-norm statistics and
      affine parameters randomised (running_mean ~ 0.1 N(0,1), running_var ~ U(0.5, 1.5),
      weight ~ g U(0.5, 1.5), bias ~ 0.1 N(0,1)), choosing the gain g by bisection so that the
      largest activation of a float64 forward pass on a torch.randn batch is near --target.
      Writes DIR/weights.safetensors (float32 state_dict), DIR/input.safetensors ("input") and
      DIR/reference.json: the float64 pass's largest activation, the first modules (in
      execution order) whose output leaves fp16's range, and PyTorch's own fp16 result.
  fp16_overflow_check.py compare --out DIR --logits FILE
      Compares every "logits*" tensor that gpukit saved with the float64 logits: relative
      error (max |a-b| / max |b|) and top-1 agreement, one line each.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_reference import read_safetensors, write_safetensors  # noqa: E402

FP16_MAX = 65504.0


def build(torch, torchvision, name, gain):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(0.1 * torch.randn(c, generator=g))
            m.running_var.copy_(0.5 + torch.rand(c, generator=g))
            m.weight.data.copy_(gain * (0.5 + torch.rand(c, generator=g)))
            m.bias.data.copy_(0.1 * torch.randn(c, generator=g))
    return model.eval()


def trace(torch, model, x):
    """Runs model on x; returns the logits and (module name, max |output|) in execution order."""
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o, n=n: seen.append((n, float(o.abs().max()))))
             for n, m in model.named_modules() if n]
    with torch.no_grad():
        y = model(x)
    for h in hooks:
        h.remove()
    return y, seen


def make(args):
    import torch
    import torchvision
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(2)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size)

    def largest(gain):
        model = build(torch, torchvision, args.model, gain).double().to(dev)
        _, seen = trace(torch, model, x.double().to(dev))
        return max(v for _, v in seen)

    lo, hi = 0.25, 4.0
    for _ in range(12):
        mid = (lo * hi) ** 0.5
        if largest(mid) < args.target:
            lo = mid
        else:
            hi = mid
    gain = lo
    model = build(torch, torchvision, args.model, gain)
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(torch, os.path.join(args.out, "weights.safetensors"), model.state_dict())
    write_safetensors(torch, os.path.join(args.out, "input.safetensors"), {"input": x})
    y64, seen = trace(torch, model.double().to(dev), x.double().to(dev))
    over = [(n, v) for n, v in seen if v > FP16_MAX]
    with torch.no_grad():
        y16 = build(torch, torchvision, args.model, gain).half().to(dev)(x.half().to(dev)).double()
    finite = bool(torch.isfinite(y16).all())
    err16 = float((y16 - y64).abs().max() / y64.abs().max()) if finite else None
    ref = {
        "model": args.model, "gain": gain, "batch": args.batch, "image_size": args.image_size,
        "largest_activation": max(v for _, v in seen),
        "first_over_fp16": over[:5],
        "logits_f64": y64.cpu().tolist(),
        "pytorch_fp16": {"finite": finite, "relative_error": err16,
                         "top1_agreement": float((y16.argmax(1) == y64.argmax(1)).double().mean())},
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f)
    print(json.dumps({k: v for k, v in ref.items() if k != "logits_f64"}, indent=1))


def compare(args):
    import torch
    ref = json.load(open(os.path.join(args.out, "reference.json")))
    want = torch.tensor(ref["logits_f64"], dtype=torch.float64)
    for name, t in sorted(read_safetensors(torch, args.logits, "logits file").items()):
        t = t.double()
        if not torch.isfinite(t).all():
            print(f"{name:24} not finite ({int((~torch.isfinite(t)).sum())} of {t.numel()} values)")
            continue
        rel = float((t - want).abs().max() / want.abs().max())
        top1 = float((t.argmax(1) == want.argmax(1)).double().mean())
        print(f"{name:24} relative error {rel:.2e}  top-1 agreement {top1:.0%}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--model", default="resnet101")
    m.add_argument("--target", type=float, default=1e6)
    m.add_argument("--batch", type=int, default=2)
    m.add_argument("--image-size", type=int, default=224)
    c = sub.add_parser("compare")
    c.add_argument("--out", required=True)
    c.add_argument("--logits", required=True)
    args = p.parse_args()
    make(args) if args.cmd == "make" else compare(args)


if __name__ == "__main__":
    main()
