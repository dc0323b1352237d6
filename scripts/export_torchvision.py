"""Exports torchvision classifiers to ONNX as a user would (torch.onnx.export, opset 17, a
dynamic batch), with random weights from a fixed seed and batch norm statistics measured on
random inputs (as a trained model's are measured on data), for `gpukit infer --onnx`.

    python3 scripts/export_torchvision.py OUT_DIR [NAME ...]

NAME: resnet50 mobilenet_v3_large efficientnet_b0 regnet_y_800mf densenet121 convnext_tiny
(default: all six). Prints one JSON line per model: file, nodes, operators, seconds."""
import json
import sys
import time

import torch
import torchvision

NAMES = [
    "resnet50",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "regnet_y_800mf",
    "densenet121",
    "convnext_tiny",
]


def calibrate(model, batches=4):
    """Running batch norm statistics set to the mean and variance of random inputs' activations
    (cumulative over `batches` batches of 16), layer by layer as the forward pass computes them."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(16, 3, 224, 224))


def export(name, out_dir):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    # batch norm statistics from data, as a trained model has them: with a fresh init's
    # (mean 0, variance 1) some models' activations shrink layer by layer until the logits are
    # near 1e-9, below what fp16 represents; a trained model's are of order one
    calibrate(model)
    model = model.eval()
    x = torch.randn(1, 3, 224, 224)
    path = f"{out_dir}/{name}.onnx"
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
    info = {"model": name, "file": path, "seconds": round(time.time() - started, 2)}
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
