"""PyTorch's figures for torchvision classifiers, to set beside `gpukit infer --onnx` on the
same models: eager and CUDA-graph replay, fp16 channels_last (autocast off: the model is cast),
random weights from the same seed as scripts/export_torchvision.py, CUDA events, after warm-up.

    python3 scripts/torchvision_peer.py BATCH[,BATCH...] [NAME ...]

Prints one JSON line per model and batch: images/s eager and graph, and the first iteration's
seconds. torch.compile is not run here (tens of seconds a model)."""
import json
import sys
import time

import torch
import torchvision

from pytorch_reference import calibrate

NAMES = ["resnet50", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_800mf",
         "densenet121", "convnext_tiny"]


def timed(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    batches = [int(b) for b in sys.argv[1].split(",")]
    names = sys.argv[2:] or NAMES
    torch.backends.cudnn.benchmark = True
    for name in names:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None)
        calibrate(torch, model)
        model = model.eval().cuda().half()
        model = model.to(memory_format=torch.channels_last)
        for n in batches:
            x = torch.randn(n, 3, 224, 224, device="cuda").half().contiguous(
                memory_format=torch.channels_last)
            with torch.inference_mode():
                t0 = time.time()
                model(x)
                torch.cuda.synchronize()
                first = time.time() - t0
                for _ in range(5):
                    model(x)
                iters = 50 if n <= 32 else 20
                eager = timed(lambda: model(x), iters)
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        model(x)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    model(x)
                for _ in range(5):
                    g.replay()
                graph = timed(g.replay, iters)
            print(json.dumps({"model": name, "batch": n, "dtype": "fp16-channels_last",
                              "eager_img_s": round(n / eager * 1e3, 1),
                              "graph_img_s": round(n / graph * 1e3, 1),
                              "first_iteration_s": round(first, 3)}), flush=True)


if __name__ == "__main__":
    main()
