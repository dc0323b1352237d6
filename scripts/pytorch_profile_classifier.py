"""PyTorch's fastest inference form of a torchvision classifier, profiled kernel by kernel: the
seeded model `gpukit infer --onnx --compare-pytorch --torchvision NAME` runs, fp16 channels-last,
torch.compile(mode="reduce-overhead") (inductor's kernels replayed as a CUDA graph; PyTorch's
best for every classifier measured so far), then torch.profiler over REPLAYS replays: the
kernels by GPU time, their calls and average, and the kernels' time a replay, to set beside
`gpukit profile infer --onnx NAME.onnx --batch-size BATCH --group-by op`.

    python3 scripts/pytorch_profile_classifier.py NAME BATCH [REPLAYS] [TOP]

Prints a few lines per kernel (name cut to 110 characters) on stdout; progress on stderr."""
import sys

import torch
import torchvision

from pytorch_reference import (
    as_strategy_input,
    make_runner,
    prepare_model,
    seeded_classifier,
    seeded_randn,
)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    name, batch = sys.argv[1], int(sys.argv[2])
    replays = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    if not torch.cuda.is_available():
        sys.exit("no CUDA device for PyTorch")
    base = seeded_classifier(torch, torchvision, name)
    model = prepare_model(torch, base, "cuda", torch.float16, True)
    info = {}
    with torch.inference_mode():
        x = as_strategy_input(torch, seeded_randn(torch, (batch, 3, 224, 224), "cuda", seed=batch),
                              "cuda", torch.float16, True)
        call = make_runner(torch, "compile_graph", model, x, info)
        for _ in range(10):
            call()
        torch.cuda.synchronize()
        print(f"{name} batch {batch}: compiled in {info.get('compile_s', 0):.1f} s", file=sys.stderr)
        acts = [torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(replays):
                call()
            torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        total, calls = kernels.get(e.name, (0.0, 0))
        kernels[e.name] = (total + e.time_range.elapsed_us(), calls + 1)
    per_replay = sum(t for t, _ in kernels.values()) / replays
    print(f"{name} fp16 channels-last batch {batch}, torch.compile reduce-overhead: "
          f"{per_replay:.1f} us of kernels a replay ({batch / per_replay * 1e6:.0f} img/s if "
          f"back to back), {sum(c for _, c in kernels.values()) // replays} kernels a replay")
    rows = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    for kname, (total, calls) in rows:
        print(f"{total / replays:9.1f} us/replay {100 * total / replays / per_replay:5.1f}% "
              f"{calls // replays:4d} calls {total / calls:8.1f} us avg  {kname[:110]}")


if __name__ == "__main__":
    main()
