"""How often PyTorch's fp16 inference picks the same class as its fp32 on random images: the
peer's figure beside `gpukit infer --onnx`'s top-1 agreement of fp16 rows with ONNX Runtime's
f32 logits. The models are scripts/export_torchvision.py's (torchvision's initialisation under a
fixed seed, batch-norm statistics measured on random images): with random weights the logits'
margins are small, so fp16 rounding flips some images' top class.

    python3 scripts/top1_fp16.py [--images N] [--batch B] NAME [NAME ...]

Per model, one JSON line: images, top-1 agreement of fp16 (channels_last, model.half()) with
fp32 (TF32 off) on the same images, the max |diff| / max |fp32| of the logits, and the
smallest and median top-1 margins of the fp32 logits (the gap between the two largest)."""
import argparse
import json

import torch
import torchvision

from pytorch_reference import seeded_classifier, set_tf32


def measure(name, images, batch, device):
    model = seeded_classifier(torch, torchvision, name).to(device)
    half = seeded_classifier(torch, torchvision, name).to(device).half()
    half = half.to(memory_format=torch.channels_last)
    set_tf32(torch, matmul=False, cudnn=False)
    gen = torch.Generator().manual_seed(1234)
    same, total, worst, margins = 0, 0, 0.0, []
    with torch.inference_mode():
        for start in range(0, images, batch):
            n = min(batch, images - start)
            x = torch.randn(n, 3, 224, 224, generator=gen).to(device)
            ref = model(x).float()
            got = half(x.half().to(memory_format=torch.channels_last)).float()
            same += (got.argmax(1) == ref.argmax(1)).sum().item()
            total += n
            worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
            top2 = ref.topk(2, dim=1).values
            margins.extend((top2[:, 0] - top2[:, 1]).tolist())
    margins.sort()
    return {
        "model": name,
        "images": total,
        "top1_agreement": same / total,
        "max_rel": worst,
        "smallest_margin": margins[0],
        "median_margin": margins[len(margins) // 2],
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="+")
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    for name in args.names:
        print(json.dumps(measure(name, args.images, args.batch, args.device)), flush=True)


if __name__ == "__main__":
    main()
