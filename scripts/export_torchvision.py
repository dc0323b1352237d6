"""Exports torchvision classifiers to ONNX as a user would (torch.onnx.export, opset 17, a
dynamic batch), with random weights from a fixed seed and batch norm statistics measured on
random inputs (as a trained model's are measured on data), for `gpukit infer --onnx`. The
weights are pytorch_reference.py's seeded ones (`seeded_classifier`), so
`gpukit infer --onnx OUT_DIR/NAME.onnx --compare-pytorch --torchvision NAME` runs the same
model in PyTorch; the state dict is written beside the model too (NAME.safetensors) for
`--torchvision-weights`, which does not depend on the PyTorch version rebuilding the same
weights.

    python3 scripts/export_torchvision.py OUT_DIR [NAME ...]

NAME: resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny
(default: all six; any of pytorch_reference.py's TORCHVISION_CLASSIFIERS). Prints one JSON
line per model: files, nodes, operators, seconds."""
import json
import sys
import time

import torch
import torchvision

from pytorch_reference import (
    seeded_classifier,
    write_safetensors,
)

NAMES = [
    "resnet50",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "regnet_y_800mf",
    "densenet121",
    "convnext_tiny",
]


def export(name, out_dir):
    model = seeded_classifier(torch, torchvision, name)
    x = torch.randn(1, 3, 224, 224)
    path = f"{out_dir}/{name}.onnx"
    weights = f"{out_dir}/{name}.safetensors"
    started = time.time()
    kwargs = dict(
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
    )
    try:
        torch.onnx.export(model, (x,), path, dynamo=False, **kwargs)
    except TypeError:
        torch.onnx.export(model, (x,), path, **kwargs)
    write_safetensors(torch, weights, model.state_dict())
    info = {"model": name, "file": path, "weights": weights, "seconds": round(time.time() - started, 2)}
    try:
        import onnx

        m = onnx.load(path)
        info["nodes"] = len(m.graph.node)
        info["operators"] = sorted({n.op_type for n in m.graph.node})
    except ImportError:
        pass
    print(json.dumps(info), flush=True)


def main():
    out_dir = sys.argv[1]
    for name in sys.argv[2:] or NAMES:
        export(name, out_dir)


if __name__ == "__main__":
    main()
