#!/usr/bin/env python3
"""How far f32 frameworks are from float64 on a torchvision model: the floor under any fp32
tolerance set against another framework's f32 outputs.

    python3 scripts/fp32_floor.py MODEL.onnx NAME WEIGHTS.safetensors [BATCH]

MODEL.onnx and WEIGHTS.safetensors as scripts/export_torchvision.py writes them. On one random
batch: PyTorch in float64 (the reference), ONNX Runtime's CPU provider on the file in f32, and
PyTorch in f32; each distance is max |diff| / max |reference|, as gpukit's `agreement` measures
it. Needs torch, torchvision, onnxruntime and numpy."""
import sys

import numpy as np
import onnxruntime
import torch
import torchvision

from pytorch_reference import load_classifier, read_safetensors


def main():
    path, name, weights = sys.argv[1:4]
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    model = load_classifier(torch, torchvision, name, read_safetensors(torch, weights), weights)
    torch.manual_seed(1)
    x = torch.randn(batch, 3, 224, 224)
    with torch.no_grad():
        truth = model.double()(x.double()).numpy()
        torch32 = model.float()(x).double().numpy()
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x.numpy()}
    ort32 = session.run(None, feed)[0].astype(np.float64)

    def rel(a, b):
        return float(np.abs(a - b).max() / np.abs(b).max())

    print(f"{name} batch {batch}: max |logit| {np.abs(truth).max():.3f}")
    print(f"  ONNX Runtime f32 vs float64: {rel(ort32, truth):.2e}")
    print(f"  PyTorch f32 vs float64:      {rel(torch32, truth):.2e}")
    print(f"  ONNX Runtime f32 vs PyTorch f32: {rel(ort32, torch32):.2e}")


if __name__ == "__main__":
    main()
