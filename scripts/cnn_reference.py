#!/usr/bin/env python3
"""PyTorch's side of the CPU ResNet comparison (crates/train/tests/cnn_pytorch.rs).

Builds torchvision's resnet18 (or 34, 50) with --classes outputs from --seed, draws --steps
batches of random --size x --size images and labels, and trains on them with SGD (momentum
0.9, Nesterov, weight decay 5e-4) or --optimizer adamw and cross-entropy with label smoothing 0.1, in float32 and,
from the same start, in float64. Writes into --out:
  init.safetensors     the initial state dict (float32; num_batches_tracked int64)
  batches.safetensors  images [steps, batch, 3, size, size] float32, labels [steps, batch] int64
  final.safetensors    the float32 run's state dict after the last step
  final64.safetensors  the float64 run's
  losses.json          per-step losses of both runs and the settings
Then: GPUKIT_CNN_REFERENCE=<out> cargo test -p gpukit-train --test cnn_pytorch -- --ignored
"""
import argparse
import copy
import json
import os

import numpy as np
import torch
import torchvision


def save(path, tensors):
    """{name: tensor} as a safetensors file (little-endian, header padded to 8 bytes)."""
    codes = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        data = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for b in blobs:
            f.write(b)


def train(model, images, labels, args):
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                              weight_decay=args.weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    model.train()
    losses = []
    for x, y in zip(images, labels):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--weight-decay", type=float, default=5e-4)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    model = getattr(torchvision.models, args.model)(num_classes=args.classes)
    model64 = copy.deepcopy(model).double()
    save(os.path.join(args.out, "init.safetensors"), model.state_dict())
    g = torch.Generator().manual_seed(args.seed + 1)
    images = torch.randn(args.steps, args.batch, 3, args.size, args.size, generator=g)
    labels = torch.randint(0, args.classes, (args.steps, args.batch), generator=g)
    save(os.path.join(args.out, "batches.safetensors"), {"images": images, "labels": labels})
    losses = train(model, images, labels, args)
    losses64 = train(model64, images.double(), labels, args)
    save(os.path.join(args.out, "final.safetensors"), model.state_dict())
    save(os.path.join(args.out, "final64.safetensors"), model64.state_dict())
    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump({"model": args.model, "classes": args.classes, "size": args.size,
                   "batch": args.batch, "steps": args.steps, "optimizer": args.optimizer,
                   "lr": args.lr, "momentum": 0.9 if args.optimizer == "sgd" else 0.0,
                   "nesterov": args.optimizer == "sgd", "weight_decay": args.weight_decay, "label_smoothing": 0.1,
                   "torch": torch.__version__, "torchvision": torchvision.__version__,
                   "losses_f32": losses, "losses_f64": losses64}, f, indent=1)
    for s, (a, b) in enumerate(zip(losses, losses64)):
        print(f"step {s}: f32 {a:.8f}  f64 {b:.10f}  |f32-f64|/f64 {abs(a - b) / abs(b):.2e}")


if __name__ == "__main__":
    main()
