#!/usr/bin/env python3
"""PyTorch reference figures for gpukit's benchmarks.

gpukit runs this script as a subprocess and prints PyTorch's numbers beside its
own.  Whatever happens, stdout carries exactly ONE JSON object; progress and
warnings go to stderr.

Usage:
  pytorch_reference.py matmul [--sizes 1000,4096] [--dtypes f32,tf32,f16,bf16,f64]
                              [--iterations 50] [--warmup 10] [--device cuda|cpu]
                              [--threads N] [--init normal|uniform]
  pytorch_reference.py serve [--device cuda|cpu] [--threads N]
      reads one JSON request a line on stdin ({"op": "matmul", "dtype": "f16", "size": 8192,
      "iterations": 10, "warmup": 2, "init": "normal", "budget_s": 10}) and answers each with
      one JSON line ({"ok": true, "times_ms": [...]}) after a first {"ok": true, "ready": true}
      line; gpukit alternates its own timed blocks with these so both see the same clocks.
      Other ops: "copy" (a bench_bandwidth copy) and "conv" ({"op": "conv", "shape":
      "32x64x56x56:64x3x3:s1p1", "dtype": "f16", "layout": "nhwc"}: conv2d with
      cudnn.benchmark on, as `conv --benchmark-cudnn` runs it)
  pytorch_reference.py bandwidth [--sizes-bytes 4096,1048576,268435456]
                                 [--iterations 20] [--warmup 3]
  pytorch_reference.py conv [--shapes "1x64x56x56:64x3x3:s1p1,..."]
                            [--dtypes f32,tf32,f16,bf16] [--layouts nchw,nhwc]
                            [--iterations 50] [--warmup 10] [--benchmark-cudnn]
                            [--device cuda|cpu] [--threads N]

  pytorch_reference.py infer [--model NAME] [--weights FILE.safetensors] [--check-only]
                             [--batch-sizes 1,8,16,32] [--image-size 224]
                             [--iterations 50] [--warmup 10] [--strategies S,...]
                             [--benchmark-cudnn] [--input FILE.safetensors]
                             [--save-output FILE.safetensors] [--device cuda|cpu] [--threads N]

  pytorch_reference.py train --data D.safetensors --init W.safetensors --order O.safetensors
                             --config C.json [--repeats 5] [--device cuda|cpu] [--threads N]

  pytorch_reference.py nccl [--nproc N] [--ops all_reduce,all_gather,reduce_scatter,broadcast,reduce,alltoall]
                            [--dtype f32,bf16,f16] [--redop sum,max,min] [--min-bytes 8] [--max-bytes 1G]
                            [--step-factor 2] [--iterations 20] [--warmup 5] [--in-place]
                            [--timeout-s 120]
  pytorch_reference.py ddp --config C.json [--nproc N] [--batch-per-gpu B] [--steps 50]
                           [--warmup 10] [--bucket-mb 25] [--timeout-s 120]

  Conv shapes are NxCxHxW:KxRxS:s<stride>p<pad> (input, filter, stride/padding).

  train runs gpukit's training loop as idiomatic PyTorch: nn.Sequential(Linear, ReLU, ...,
  Linear) loaded from --init (names 0.weight, 0.bias, 2.weight, ...), the data of --data
  (x F32 [n, f]; y F32 [n] or [n, w] for MSE, I64 [n] for cross-entropy) in a DataLoader
  (TensorDataset, pin_memory on cuda) whose batch sampler yields --order's sample order
  ("order" I64 [epochs, n]: epoch e's order), torch.optim's SGD/Adam/AdamW, MSELoss or
  CrossEntropyLoss, the loss divided by `accumulate` and an optimizer step every `accumulate`
  batches and at each epoch's end, stopping after `max_steps` steps. --config is gpukit's
  TrainConfig as JSON (widths, loss, optimizer {kind, lr, momentum, weight_decay},
  batch_size, epochs, accumulate, max_steps) plus "precision" (fp32, tf32, fp16: autocast and
  GradScaler, bf16: autocast) and "resident" (cuda: the data moved to the GPU once and each
  batch indexed there, instead of the DataLoader). The loop runs --repeats times from the same
  weights; the result has the first run's per-step losses (each step's mean batch loss, read
  once at the end), every run's seconds (the loop only; cuda: synchronized) and, on cuda, the
  first run's peak of allocated memory (torch.cuda.max_memory_allocated, data included).

  nccl times torch.distributed's collectives as NVIDIA's nccl-tests does, in N ranks (default:
  every GPU, one each) started by torch.multiprocessing.spawn on a free port of 127.0.0.1.
  Sizes run from --min-bytes, times --step-factor, up to --max-bytes (K, M, G: powers of 1024);
  counts, the "bytes" (nccl-tests' size: the larger of a rank's send and receive buffers) and
  "count" (nccl-tests' count: the count given to the collective, per rank for all_gather,
  reduce_scatter and alltoall, whose buffers are rounded down to a multiple of the rank count
  as gpukit's sweep does; nccl-tests since 2024 also aligns each rank's part to 16 bytes)
  follow nccl-tests, and so do algbw = bytes / time (GB/s, 1e9) and busbw = algbw * 2(n-1)/n
  (all_reduce), (n-1)/n (all_gather, reduce_scatter, alltoall), 1 (broadcast, reduce; root 0).
  Each row: --warmup calls, a synchronize, --iterations calls back to back between two CUDA
  events; time_us = elapsed / iterations, averaged over the ranks. Then one more call on inputs
  of small integers whose results are exact in every dtype, checked on the host: "wrong" is the
  count of mismatching elements summed over the ranks (reduce: the root's output; in-place
  alltoall: null, unchecked, as nccl-tests). torch.distributed's all_reduce, broadcast and reduce
  take one tensor, so their rows always run in place ("in_place": true). A rank that fails, or
  no progress for --timeout-s (+30 s), stops every rank: {"ok": false, "error": ...}.

  ddp measures DistributedDataParallel scaling of gpukit's MLP (the train subcommand's layers,
  optimizer, loss and precision, from --config; "accumulate", epochs and data are not used) on
  synthetic data resident on each GPU: optimizer steps (forward, backward, step) of batch B timed
  with CUDA events, first on one GPU without DDP, then on N ranks under DDP (bucket_cap_mb,
  gradient_as_bucket_view); the DDP step is the slowest rank's; scaling efficiency =
  N-rank samples/s / (N * one-GPU samples/s).

  train-cnn trains torchvision's resnet18/34/50 (--classes outputs) on the GPU as a careful
  PyTorch user does: data resident on the GPU (--data: "images" [N,3,H,W] float32 and "labels"
  [N] int64, else 2 x --batch-size random images and labels from --seed), cudnn.benchmark,
  autocast with channels_last for bf16/fp16 (GradScaler for fp16), SGD (--momentum,
  --nesterov, --weight-decay) or AdamW with foreach updates, cross-entropy with
  --label-smoothing. Each mode of --modes (eager; compile: torch.compile(model), default mode;
  compile_fused: with the fused optimizer; compile_graphs: mode="reduce-overhead", fused)
  starts from the same weights (--init, a torchvision state dict as .safetensors, else
  torchvision's initialisation under torch.manual_seed(--seed)); the first update's time,
  compilation included, is first_step_s; then --warmup untimed updates and --steps updates
  timed by CUDA events. Rows: {"mode", "status", "reason" (failed only), "model", "batch",
  "image_size", "precision", "first_step_s", "step_ms" {median_ms, p10_ms, p90_ms, count},
  "images_per_s", "peak_allocated_bytes", "losses" (the first --loss-steps updates')}.
  --checkpoint runs each residual block under torch.utils.checkpoint (use_reentrant=False), as
  a PyTorch user trades compute for memory (its recomputation moves the batch-norm running
  statistics a second time; the training losses are not affected).

  infer times a torchvision image classifier: --model is one of TORCHVISION_CLASSIFIERS
  (default resnet50).  Its weights: --weights, a safetensors state_dict (float32;
  `*.num_batches_tracked` may be present or not; any other missing or unexpected key is an
  error), loaded into torchvision's class (a ResNet into the same architecture built here
  with torchvision's module names when torchvision does not import); or, without --weights,
  "seeded": torchvision's own initialisation under torch.manual_seed(0) and batch norm
  statistics measured on 4 batches of 16 random 224x224 images, as
  scripts/export_torchvision.py makes them (seeded_classifier; needs torchvision).
  "structure" counts, in one forward of one image on the CPU, the convolution calls
  (F.conv1d/2d/3d) and linear calls (F.linear): an ONNX export of the model has as many
  Conv nodes and Gemm/MatMul nodes on constant weights.  --check-only builds the model and
  reports its structure (and the logits on --input) without timing anything ("results": []).
  Strategies (default: all):
    eager_fp32           fp32, NCHW, TF32 off for cuBLAS and cuDNN
    eager_tf32           fp32, NCHW, TF32 on
    eager_fp16           model.half(), NCHW
    channels_last_fp16   model.half(), model and input channels_last
    channels_last_bf16   bfloat16, channels_last
    cuda_graph_fp16      channels_last fp16 captured in a torch.cuda.CUDAGraph, replayed
    compile_fp16         torch.compile(channels_last fp16 model), default mode, static
                         shapes, compiled afresh per batch size; compile_s = first call
    compile_graph_fp16   the same with mode="reduce-overhead": inductor's kernels replayed
                         as CUDA graphs (PyTorch's fastest inference short of TensorRT);
                         compile_s = the calls until the graph is recorded
  On the cpu only eager_fp32 runs (other rows: "skipped").  Each row times the forward
  on a seeded torch.randn input already on the device.  --input names a safetensors
  file with a float32 tensor "input" [n,3,H,W]; every strategy that ran then also runs
  on it, and "outputs" compares its logits with eager fp32 (TF32 off).  --save-output
  (needs --input) writes "logits" (eager fp32) and "logits_<strategy>" for the other
  strategies that ran, float32 [n, classes], atomically.  Safetensors files are read
  and written here without the safetensors package (F32, F16, BF16, F64, I64).

Output:
  success: {"ok": true, "command": ..., "torch_version": ..., "cuda_available": bool,
            "device_name": str|null, "cudnn_version": int|null, "results": [row, ...]}
           infer adds "model", "model_source" ("torchvision" or "pytorch_reference.py"),
           "torchvision": str|null, "weights": "seeded"|path, "device", "image_size",
           "cudnn_benchmark": bool, "parameters": int, "structure": {"conv": int,
           "linear": int, "parameters": int, "output_shape": [1, classes]},
           "outputs": null|{...}; its rows are
           {"strategy", "batch", "status": "ok"|"skipped"|"failed", "reason" (not ok only),
            "median_ms", "p10_ms", "p90_ms", "count", "images_per_s",
            "peak_allocated_bytes", "peak_reserved_bytes" (cuda: peaks since a reset at
            the start of the row, model weights included; cpu: null),
            "compile_s" (compiled rows only)}; figures are null where not measured.
           nccl: {"ok": true, "command": "nccl", "torch_version", "nccl_version": "2.28.9",
            "device_name", "backend": "nccl", "world_size", "in_place", "iterations", "warmup",
            "results": [{"op", "dtype", "redop" (null for all_gather, broadcast, alltoall),
            "in_place", "bytes", "count", "time_us", "algbw_gbs", "busbw_gbs", "wrong"}, ...] in
            op, dtype, redop, size order, "skipped": [{"op", "dtype", "redop", "reason"}]}
           ddp: {"ok": true, "command": "ddp", "torch_version", "device_name", "backend",
            "world_size", "batch_per_gpu", "precision", "optimizer", "widths", "steps", "warmup",
            "bucket_mb", "single": {"step_ms": {median_ms, p10_ms, p90_ms, count},
            "samples_per_s"}, "ddp": {"step_ms": {...} (the slowest rank's), "samples_per_s",
            "per_rank_step_ms": [median_ms of each rank], "peak_allocated_bytes" (the largest
            rank's torch.cuda.max_memory_allocated over its run; null off the GPU)},
            "scaling_efficiency", with --zero
            also "ddp_zero": {the same as "ddp", with its "scaling_efficiency"}, with --compiled
            also "ddp_compiled": {"single": {one GPU compiled}, the same as "ddp", its
            "scaling_efficiency" against the compiled one GPU}}
  failure: {"ok": false, "error": "<one line>"}; exit 1 (runtime: torch missing,
           no CUDA, out of memory, unreadable weights, ...) or 2 (bad arguments).

GPU timings use one pair of CUDA events around each timed iteration, read after a
single synchronize.  CPU timings use time.perf_counter and stop early so that one
row takes about CPU_ROW_BUDGET_S seconds at most (at least one timed iteration).
"""
import argparse
import copy
import ctypes
import gc
import importlib
import json
import math
import os
import re
import socket
import sys
import tempfile
import time
from copy import deepcopy

EXIT_RUNTIME, EXIT_USAGE = 1, 2
MIB = 1 << 20
L2_FLUSH_BYTES = 2 * 64 * MIB  # rotate inputs until their total exceeds this
CPU_ROW_BUDGET_S = 10.0
DTYPES = {"f32": "float32", "tf32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}
CONV_SHAPE_RE = re.compile(r"^(\d+)x(\d+)x(\d+)x(\d+):(\d+)x(\d+)x(\d+):s(\d+)p(\d+)$")
# ResNet name -> (block kind, blocks per stage), as torchvision builds them.
RESNETS = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet34": ("basic", (3, 4, 6, 3)),
           "resnet50": ("bottleneck", (3, 4, 6, 3)), "resnet101": ("bottleneck", (3, 4, 23, 3)),
           "resnet152": ("bottleneck", (3, 8, 36, 3))}
# torchvision's image classifiers (torchvision.models.list_models(module=torchvision.models)),
# the names infer --model takes; gpukit's `--torchvision` takes the same list
TORCHVISION_CLASSIFIERS = (
    "alexnet", "convnext_base", "convnext_large", "convnext_small", "convnext_tiny",
    "densenet121", "densenet161", "densenet169", "densenet201",
    "efficientnet_b0", "efficientnet_b1", "efficientnet_b2", "efficientnet_b3", "efficientnet_b4",
    "efficientnet_b5", "efficientnet_b6", "efficientnet_b7",
    "efficientnet_v2_l", "efficientnet_v2_m", "efficientnet_v2_s",
    "googlenet", "inception_v3", "maxvit_t",
    "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3",
    "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small",
    "regnet_x_16gf", "regnet_x_1_6gf", "regnet_x_32gf", "regnet_x_3_2gf", "regnet_x_400mf",
    "regnet_x_800mf", "regnet_x_8gf", "regnet_y_128gf", "regnet_y_16gf", "regnet_y_1_6gf",
    "regnet_y_32gf", "regnet_y_3_2gf", "regnet_y_400mf", "regnet_y_800mf", "regnet_y_8gf",
    "resnet101", "resnet152", "resnet18", "resnet34", "resnet50",
    "resnext101_32x8d", "resnext101_64x4d", "resnext50_32x4d",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
    "squeezenet1_0", "squeezenet1_1",
    "swin_b", "swin_s", "swin_t", "swin_v2_b", "swin_v2_s", "swin_v2_t",
    "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn",
    "vit_b_16", "vit_b_32", "vit_h_14", "vit_l_16", "vit_l_32",
    "wide_resnet101_2", "wide_resnet50_2",
)
SEED = 0  # the seeded weights: torchvision's initialisation under torch.manual_seed(SEED)
# batch norm statistics of the seeded weights: measured on this many batches of random images
CALIBRATION_BATCHES, CALIBRATION_BATCH, CALIBRATION_IMAGE = 4, 16, 224
# train-cnn: the models and how each mode runs the training step
CNN_TRAIN_MODELS = ("resnet18", "resnet34", "resnet50")
# eager64: float64 weights and images (a reference); compile_fused: torch.compile with the fused
# (single-kernel) optimizer; compile_graphs: mode="reduce-overhead" (CUDA graphs) with it
CNN_TRAIN_MODES = ("eager", "compile", "compile_fused", "compile_graphs", "eager64")

# infer strategy -> (torch dtype name, channels_last, TF32 allowed, how it runs: eager|graph|compile)
INFER_STRATEGIES = {
    "eager_fp32": ("float32", False, False, "eager"),
    "eager_tf32": ("float32", False, True, "eager"),
    "eager_fp16": ("float16", False, False, "eager"),
    "channels_last_fp16": ("float16", True, False, "eager"),
    "channels_last_bf16": ("bfloat16", True, False, "eager"),
    "cuda_graph_fp16": ("float16", True, False, "graph"),
    "compile_fp16": ("float16", True, False, "compile"),
    "compile_graph_fp16": ("float16", True, False, "compile_graph"),
}
# torch.compile's mode for each compiled kind, and the calls its first result takes: a
# "reduce-overhead" module warms up, then records its CUDA graph, then replays it
COMPILE_MODES = {"compile": ("default", 1), "compile_graph": ("reduce-overhead", 3)}
CUDA_GRAPH_WARMUP_CALLS = 3  # forwards on a side stream before capture
# safetensors dtype code -> (torch dtype name, bytes per element); little-endian data
SAFETENSORS_DTYPES = {"F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
                      "F64": ("float64", 8), "I64": ("int64", 8)}
# nccl: the collectives in nccl-tests' names (torch's call in nccl_call), their element types
# (torch dtype name, bytes per element) and reduction operators
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall")
NCCL_DTYPES = {"f32": ("float32", 4), "bf16": ("bfloat16", 2), "f16": ("float16", 2)}
NCCL_REDOPS = ("sum", "max", "min")
NCCL_OPS_WITH_REDOP = ("all_reduce", "reduce_scatter", "reduce")
# torch.distributed's all_reduce, broadcast and reduce take one tensor: they always run in place
NCCL_ALWAYS_IN_PLACE = ("all_reduce", "broadcast", "reduce")
NCCL_ROOT = 0
# the data the result check sends: element i of rank r is ((i * 7 + r * 13) % 17) - 8, small
# integers whose sums over up to 32 ranks are exact in bf16 (and f16, f32)
PATTERN_PERIOD = 17
BYTE_SIZE_RE = re.compile(r"^(\d+)([kmg]?)$", re.IGNORECASE)


class UsageError(Exception):
    """Bad command-line arguments (exit code 2)."""


class JsonArgumentParser(argparse.ArgumentParser):
    """ArgumentParser that raises instead of printing usage and exiting."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")

    def print_help(self, file=None):  # keep stdout for the JSON document
        super().print_help(file or sys.stderr)


def csv_of(convert):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        return [convert(s) for s in items]
    return parse


def int_at_least(lowest):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be >= {lowest}: {text!r}")
        return value
    return parse


positive_int, non_negative_int = int_at_least(1), int_at_least(0)


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def choice_of(*names):
    def parse(text):
        if text not in names:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(names)}")
        return text
    return parse


def conv_shape(text):
    m = CONV_SHAPE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad conv shape {text!r}; expected NxCxHxW:KxRxS:s<stride>p<pad>")
    n, c, h, w, k, r, s, stride, pad = map(int, m.groups())
    if min(n, c, h, w, k, r, s, stride) < 1:
        raise argparse.ArgumentTypeError(f"conv shape {text!r} has a zero dimension or stride")
    p, q = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
    if p < 1 or q < 1:
        raise argparse.ArgumentTypeError(f"conv shape {text!r} gives an empty output")
    return {"text": text, "n": n, "c": c, "h": h, "w": w, "k": k, "r": r, "s": s,
            "stride": stride, "pad": pad, "flops": 2 * n * k * p * q * c * r * s}


def byte_size(text):
    """A byte count, optionally with K, M or G (powers of 1024): 8, 512K, 1G."""
    m = BYTE_SIZE_RE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"bad byte size {text!r}; expected digits with an optional K, M or G")
    value = int(m.group(1)) * 1024 ** " kmg".index(m.group(2).lower() or " ")
    if value < 1:
        raise argparse.ArgumentTypeError(f"byte size must be >= 1: {text!r}")
    return value


def add_cnn_recipe(p):
    """train-cnn's and ddp-cnn's training recipe: precision, optimizer, loss and checkpointing."""
    p.add_argument("--precision", type=choice_of("fp32", "tf32", "bf16", "fp16"), default="bf16")
    p.add_argument("--optimizer", type=choice_of("sgd", "adamw"), default="sgd")
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=5e-5)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing: each residual block under torch.utils.checkpoint")


def build_parser():
    parser = JsonArgumentParser(prog="pytorch_reference.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def timing_args(p, iterations, warmup):
        p.add_argument("--iterations", type=positive_int, default=iterations)
        p.add_argument("--warmup", type=non_negative_int, default=warmup)

    m = sub.add_parser("matmul", help="square torch.matmul(A, B, out=C)")
    m.add_argument("--sizes", type=csv_of(positive_int), default=[1000, 4096])
    m.add_argument("--dtypes", type=csv_of(choice_of(*DTYPES)), default=list(DTYPES))
    m.add_argument("--device", type=choice_of("cuda", "cpu"), default="cuda")
    m.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all)")
    m.add_argument("--init", type=choice_of("normal", "uniform"), default="normal",
                   help="input distribution: torch.randn, or uniform in [-1, 1)")
    timing_args(m, 50, 10)

    v = sub.add_parser("serve", help="answer timed-block requests, one JSON line each")
    v.add_argument("--device", type=choice_of("cuda", "cpu"), default="cuda")
    v.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all)")

    b = sub.add_parser("bandwidth", help="host<->device and device->device copies")
    b.add_argument("--sizes-bytes", type=csv_of(positive_int), default=[4096, MIB, 256 * MIB])
    timing_args(b, 20, 3)

    q = sub.add_parser("p2p", help="copies between every pair of GPUs (tensor.copy_ across devices)")
    q.add_argument("--bytes", type=positive_int, default=256 * MIB)
    q.add_argument("--iterations", type=positive_int, default=10, help="copies per timed sample")
    q.add_argument("--repeats", type=positive_int, default=10, help="timed samples")

    c = sub.add_parser("conv", help="torch.nn.functional.conv2d")
    c.add_argument("--shapes", type=csv_of(conv_shape),
                   default=[conv_shape("1x64x56x56:64x3x3:s1p1"), conv_shape("32x256x56x56:64x1x1:s1p0")])
    c.add_argument("--dtypes", type=csv_of(choice_of("f32", "tf32", "f16", "bf16")), default=["f32", "tf32", "f16"])
    c.add_argument("--layouts", type=csv_of(choice_of("nchw", "nhwc")), default=["nchw", "nhwc"])
    c.add_argument("--benchmark-cudnn", action="store_true", help="set torch.backends.cudnn.benchmark")
    c.add_argument("--device", type=choice_of("cuda", "cpu"), default="cuda")
    c.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all)")
    timing_args(c, 50, 10)

    t = sub.add_parser("train", help="an MLP training loop as idiomatic PyTorch")
    t.add_argument("--data", required=True)
    t.add_argument("--init", required=True)
    t.add_argument("--order", required=True)
    t.add_argument("--config", required=True, help="gpukit's TrainConfig as a JSON file")
    t.add_argument("--repeats", type=positive_int, default=5)
    t.add_argument("--device", type=choice_of("cuda", "cpu"), default="cuda")
    t.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all)")

    r = sub.add_parser("train-cnn", help="torchvision's ResNet trained on synthetic data on the GPU")
    r.add_argument("--model", type=choice_of(*CNN_TRAIN_MODELS), default="resnet50")
    r.add_argument("--classes", type=positive_int, default=1000)
    r.add_argument("--image-size", type=positive_int, default=224)
    r.add_argument("--batch-size", type=positive_int, default=256)
    r.add_argument("--samples", type=positive_int, default=None,
                   help="images generated (default twice the batch); as many as the batch trains "
                        "on that one batch every update, as gpukit does with such a data file")
    r.add_argument("--steps", type=positive_int, default=30, help="timed updates, after --warmup")
    r.add_argument("--warmup", type=non_negative_int, default=5)
    r.add_argument("--loss-steps", type=non_negative_int, default=20,
                   help="updates whose losses are reported (the first ones, from --init)")
    add_cnn_recipe(r)
    r.add_argument("--seed", type=non_negative_int, default=0)
    r.add_argument("--init", default=None, help="a torchvision state dict as .safetensors")
    r.add_argument("--data", default=None,
                   help='.safetensors with "images" (or "x") [N,3,H,W] and "labels" (or "y") [N] int64')
    r.add_argument("--order", default=None,
                   help='.safetensors "order" int64 [updates, batch]: the images of each update '
                        "(gpukit's --compare-pytorch writes it); else consecutive batches")
    r.add_argument("--write-init", default=None,
                   help="write the initial state dict here (.safetensors) for gpukit's --init")
    r.add_argument("--write-data", default=None,
                   help='write the images and labels trained on here (.safetensors, "x" and "y") '
                        "for gpukit's --data")
    r.add_argument("--modes", type=csv_of(choice_of(*CNN_TRAIN_MODES)), default=["eager", "compile"])
    r.add_argument("--device", type=choice_of("cuda"), default="cuda")

    i = sub.add_parser("infer", help="inference of a torchvision classifier")
    i.add_argument("--model", type=choice_of(*TORCHVISION_CLASSIFIERS), default="resnet50")
    i.add_argument("--weights", default=None,
                   help="torchvision state_dict as .safetensors (default: seeded, see infer above)")
    i.add_argument("--check-only", action="store_true",
                   help="build the model and report its structure (and logits on --input); time nothing")
    i.add_argument("--batch-sizes", type=csv_of(positive_int), default=[1, 8, 16, 32])
    i.add_argument("--image-size", type=positive_int, default=224)
    i.add_argument("--strategies", type=csv_of(choice_of(*INFER_STRATEGIES)), default=list(INFER_STRATEGIES))
    i.add_argument("--benchmark-cudnn", action="store_true", help="set torch.backends.cudnn.benchmark")
    i.add_argument("--input", default=None, help='.safetensors with a float32 "input" [n,3,H,W]')
    i.add_argument("--save-output", default=None, help="write the logits on --input here (.safetensors)")
    i.add_argument("--device", type=choice_of("cuda", "cpu"), default="cuda")
    i.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all)")
    timing_args(i, 50, 10)

    n = sub.add_parser("nccl", help="torch.distributed collectives, measured as nccl-tests measures them")
    n.add_argument("--nproc", type=positive_int, default=None, help="ranks, one GPU each (default: all GPUs)")
    n.add_argument("--ops", type=csv_of(choice_of(*NCCL_OPS)), default=list(NCCL_OPS))
    n.add_argument("--dtype", type=csv_of(choice_of(*NCCL_DTYPES)), default=["f32"])
    n.add_argument("--redop", type=csv_of(choice_of(*NCCL_REDOPS)), default=["sum"])
    n.add_argument("--min-bytes", type=byte_size, default=8, help="smallest size (K, M, G: powers of 1024)")
    n.add_argument("--max-bytes", type=byte_size, default=1 << 30, help="largest size (default 1G)")
    n.add_argument("--step-factor", type=int_at_least(2), default=2)
    n.add_argument("--in-place", action="store_true", help="in-place buffers (default: out of place)")
    n.add_argument("--timeout-s", type=positive_int, default=120,
                   help="process group timeout; ranks that make no progress this long are stopped")
    n.add_argument("--backend", type=choice_of("nccl", "gloo"), default="nccl", help=argparse.SUPPRESS)
    timing_args(n, 20, 5)

    d = sub.add_parser("ddp", help="DistributedDataParallel scaling of gpukit's training MLP")
    d.add_argument("--config", required=True, help="gpukit's TrainConfig as a JSON file")
    d.add_argument("--nproc", type=positive_int, default=None, help="ranks, one GPU each (default: all GPUs)")
    d.add_argument("--batch-per-gpu", type=positive_int, default=None, help="default: the config's batch_size")
    d.add_argument("--steps", type=positive_int, default=50)
    d.add_argument("--warmup", type=non_negative_int, default=10)
    d.add_argument("--bucket-mb", type=positive_float, default=25.0, help="DDP's bucket_cap_mb")
    d.add_argument("--zero", action="store_true",
                   help="also DDP with the optimizer sharded (torch.distributed.optim.ZeroRedundancyOptimizer)")
    d.add_argument("--compiled", action="store_true",
                   help="also torch.compile of the model with the fused optimizer, one GPU and DDP")
    d.add_argument("--timeout-s", type=positive_int, default=120,
                   help="process group timeout; ranks that make no progress this long are stopped")
    d.add_argument("--backend", type=choice_of("nccl", "gloo"), default="nccl", help=argparse.SUPPRESS)
    q2 = sub.add_parser("pipeline", help="torch.distributed.pipelining's 1F1B schedule on gpukit's training MLP")
    q2.add_argument("--config", required=True, help="gpukit's TrainConfig as a JSON file (with its precision)")
    q2.add_argument("--spans", required=True, type=csv_of(str),
                    help="each stage's layers as FIRST:END (gpukit's split), one a GPU")
    q2.add_argument("--micro-batches", type=positive_int, required=True)
    q2.add_argument("--batch", type=positive_int, required=True, help="rows an update (all micro-batches)")
    q2.add_argument("--steps", type=positive_int, default=20)
    q2.add_argument("--warmup", type=non_negative_int, default=5)
    q2.add_argument("--timeout-s", type=positive_int, default=120,
                    help="process group timeout; ranks that make no progress this long are stopped")
    q2.add_argument("--backend", type=choice_of("nccl", "gloo"), default="nccl", help=argparse.SUPPRESS)
    e = sub.add_parser("ddp-cnn", help="DistributedDataParallel scaling of torchvision's ResNet training")
    e.add_argument("--model", type=choice_of(*CNN_TRAIN_MODELS), default="resnet50")
    e.add_argument("--classes", type=positive_int, default=1000)
    e.add_argument("--image-size", type=positive_int, default=224)
    e.add_argument("--nproc", type=positive_int, default=None, help="ranks, one GPU each (default: all GPUs)")
    e.add_argument("--batch-per-gpu", type=positive_int, default=256)
    add_cnn_recipe(e)
    e.add_argument("--modes", type=csv_of(choice_of("ddp", "ddp_compile", "ddp_compile_fused")),
                   default=["ddp", "ddp_compile", "ddp_compile_fused"],
                   help="ddp: eager DDP; ddp_compile: torch.compile of the DDP model (its optimizer "
                        "splits the graph at the buckets); ddp_compile_fused: with the fused optimizer")
    e.add_argument("--steps", type=positive_int, default=30)
    e.add_argument("--warmup", type=non_negative_int, default=5)
    e.add_argument("--bucket-mb", type=positive_float, default=25.0, help="DDP's bucket_cap_mb")
    e.add_argument("--grad-comm", type=choice_of("f32", "bf16"), default="f32",
                   help="bf16: DDP's bf16_compress_hook (each averaged gradient rounded to bf16)")
    e.add_argument("--timeout-s", type=positive_int, default=300,
                   help="process group timeout; ranks that make no progress this long are stopped")
    e.add_argument("--backend", type=choice_of("nccl", "gloo"), default="nccl", help=argparse.SUPPRESS)
    return parser


def check_args(args):
    """Checks that argparse cannot express; raises UsageError."""
    if args.command == "infer":
        if args.save_output and not args.input:
            raise UsageError("pytorch_reference.py infer: --save-output needs --input")
        args.batch_sizes = list(dict.fromkeys(args.batch_sizes))
        args.strategies = list(dict.fromkeys(args.strategies))
    if args.command == "nccl":
        if args.min_bytes > args.max_bytes:
            raise UsageError(f"pytorch_reference.py nccl: --min-bytes {args.min_bytes} is above "
                             f"--max-bytes {args.max_bytes}")
        args.ops, args.dtype, args.redop = (list(dict.fromkeys(v)) for v in (args.ops, args.dtype, args.redop))
    return args


def log(message):
    print(f"[pytorch_reference] {message}", file=sys.stderr, flush=True)


def percentile(sorted_values, pct):
    """Linearly interpolated percentile (numpy's default) of a sorted list."""
    pos = (len(sorted_values) - 1) * pct / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(times_ms):
    values = sorted(times_ms)
    return {"median_ms": percentile(values, 50), "p10_ms": percentile(values, 10),
            "p90_ms": percentile(values, 90), "count": len(values)}


def rate(amount, median_ms, unit):
    """amount per second in `unit` (1e12 = tera, 1e9 = giga); None for a zero time."""
    return amount / (median_ms / 1e3) / unit if median_ms > 0 else None


def time_cuda(torch, step, iterations, warmup):
    """Run step(i) warmup + iterations times; return per-iteration times (ms) from CUDA events."""
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iterations)]
    for i, (start, end) in enumerate(events):
        start.record()
        step(warmup + i)
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def time_cuda_chained(torch, step, iterations, warmup):
    """Like time_cuda, with one event between consecutive steps (as gpukit times its own): the
    steps queue back to back, so a step's time is the GPU's, not the host's gap before it."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iterations + 1)]
    events[0].record()
    for i in range(iterations):
        step()
        events[i + 1].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(events, events[1:])]


def time_cpu(step, iterations, warmup, budget_s=CPU_ROW_BUDGET_S):
    """Like time_cuda, with perf_counter; stops early so the whole row fits in budget_s."""
    row_start = time.perf_counter()
    for i in range(warmup):
        step(i)
        if time.perf_counter() - row_start > budget_s / 4:
            break
    times_ms = []
    for i in range(iterations):
        t0 = time.perf_counter()
        step(warmup + i)
        t1 = time.perf_counter()
        times_ms.append((t1 - t0) * 1e3)
        if (t1 - row_start) + (t1 - t0) > budget_s:  # the next one would overrun
            break
    if len(times_ms) < iterations:
        log(f"cpu time budget reached: {len(times_ms)} of {iterations} timed iterations")
    return times_ms


def time_step(torch, device, step, iterations, warmup):
    if device == "cuda":
        return time_cuda(torch, step, iterations, warmup)
    return time_cpu(step, iterations, warmup)


def has_setting(obj, name):
    """hasattr for torch.backends objects, whose __getattr__ raised AssertionError before torch 2.0."""
    try:
        getattr(obj, name)
        return True
    except (AttributeError, AssertionError):
        return False


def set_tf32(torch, matmul=None, cudnn=None):
    """Allow or forbid TF32 for cuBLAS matmuls / cuDNN convolutions (newer API where present)."""
    new_api = has_setting(torch.backends.cuda.matmul, "fp32_precision")
    if matmul is not None:
        if new_api:
            torch.backends.cuda.matmul.fp32_precision = "tf32" if matmul else "ieee"
        else:
            torch.backends.cuda.matmul.allow_tf32 = matmul
    if cudnn is not None:
        if new_api and hasattr(torch.backends.cudnn, "conv"):
            torch.backends.cudnn.conv.fp32_precision = "tf32" if cudnn else "ieee"
        else:
            torch.backends.cudnn.allow_tf32 = cudnn


def release(torch, device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# Operand sets a matmul row rotates over at least, as gpukit does (MIN_SETS in its matmul.rs):
# where one allocation sits moved a power-capped f64 8192 product by 1-8% (gpukit's run 49).
MIN_MATMUL_SETS = 4


def matmul_operands(torch, n, dtype, device, init):
    """(A, B, C) sets of random n x n operands, enough of them that together they exceed
    L2_FLUSH_BYTES (so rotating through them measures memory, not cache), and at least
    MIN_MATMUL_SETS on a GPU, within half its free memory (CPU rows keep the first rule only)."""
    triple_bytes = 3 * n * n * torch.empty((), dtype=dtype).element_size()
    sets = L2_FLUSH_BYTES // triple_bytes + 1 if triple_bytes < L2_FLUSH_BYTES else 1
    if str(device).startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        sets = max(1, min(max(sets, MIN_MATMUL_SETS), free // 2 // triple_bytes))

    def draw():
        if init == "uniform":
            return torch.rand(n, n, device=device, dtype=dtype) * 2 - 1
        return torch.randn(n, n, device=device, dtype=dtype)

    return [(draw(), draw(), torch.empty(n, n, device=device, dtype=dtype)) for _ in range(sets)]


def bench_matmul(torch, args):
    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, DTYPES[dtype_name])
        set_tf32(torch, matmul=(dtype_name == "tf32"))
        for n in args.sizes:
            operands = matmul_operands(torch, n, dtype, args.device, args.init)
            sets = len(operands)
            log(f"matmul {dtype_name} {n}x{n} on {args.device} ({sets} operand set(s))")

            def step(i):
                a, b, c = operands[i % sets]
                torch.matmul(a, b, out=c)

            stats = summarize(time_step(torch, args.device, step, args.iterations, args.warmup))
            rows.append({"dtype": dtype_name, "size": n, "device": args.device, **stats,
                         "tflops": rate(2 * n ** 3, stats["median_ms"], 1e12)})
            del operands, step
            release(torch, args.device)
    set_tf32(torch, matmul=False)
    return rows


# Where `serve` writes its answers: the real stdout, saved by __main__ before stdout is pointed
# at stderr.
REPLY_FD = 1


def reply(obj):
    os.write(REPLY_FD, (json.dumps(obj) + "\n").encode())


def serve(torch, args, ready):
    """Answers timing requests (one JSON line each) from stdin until it closes: "matmul" times
    torch.matmul on square operands, "copy" one of bench_bandwidth's copies. The buffers of the
    last request are kept, so alternating blocks time the same ones."""
    reply({"ok": True, "ready": True, **ready})
    state = {"key": None}
    answered = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "matmul":
                times = serve_matmul(torch, args, req, state)
            elif op == "copy":
                times = serve_copy(torch, req, state)
            elif op == "conv":
                times = serve_conv(torch, req, state)
            else:
                raise ValueError(f"unknown op {op!r}")
            reply({"ok": True, "times_ms": times})
            answered += 1
        except Exception as exc:  # one bad request is answered, not fatal
            reply({"ok": False, "error": one_line(exc)})
    return answered


def keep_buffers(torch, state, key, device, build):
    """The buffers for `key`, built by `build()` after the previous ones are released."""
    if state["key"] != key:
        state.clear()
        state["key"] = None
        release(torch, device)
        state["buffers"] = build()
        state["key"] = key
    return state["buffers"]


def serve_matmul(torch, args, req, state):
    dtype_name, n = req["dtype"], int(req["size"])
    device = req.get("device", args.device)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dtype = getattr(torch, DTYPES[dtype_name])
    init = req.get("init", "normal")
    operands = keep_buffers(torch, state, ("matmul", dtype_name, n, init, device), device,
                            lambda: matmul_operands(torch, n, dtype, device, init))
    sets = len(operands)

    def step(i):
        a, b, c = operands[i % sets]
        torch.matmul(a, b, out=c)

    iterations, warmup = int(req.get("iterations", 10)), int(req.get("warmup", 2))
    set_tf32(torch, matmul=(dtype_name == "tf32"))
    try:
        if device.startswith("cuda"):
            return time_cuda(torch, step, iterations, warmup)
        return time_cpu(step, iterations, warmup, float(req.get("budget_s", CPU_ROW_BUDGET_S)))
    finally:
        set_tf32(torch, matmul=False)


def serve_conv(torch, req, state):
    """One block of torch.nn.functional.conv2d on the shape, dtype and layout asked for, with
    cudnn.benchmark on (its first call, in the untimed opening turn, chooses the algorithm).
    With "graph": k above 0, each timed repetition replays a CUDA graph of k convolutions and
    its time over k is the sample: the GPU's time, not Python's launch rate."""
    shape = conv_shape(req["shape"])
    dtype_name, layout = req["dtype"], req["layout"]
    if dtype_name not in ("f32", "tf32", "f16", "bf16") or layout not in ("nchw", "nhwc"):
        raise ValueError(f"conv of {dtype_name} {layout} is not served")
    dtype = getattr(torch, DTYPES[dtype_name])
    per_graph = int(req.get("graph", 0))
    torch.backends.cudnn.benchmark = True

    def build():
        fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        x = torch.randn(shape["n"], shape["c"], shape["h"], shape["w"], device="cuda", dtype=dtype)
        w = torch.randn(shape["k"], shape["c"], shape["r"], shape["s"], device="cuda", dtype=dtype)
        return {"x": x.to(memory_format=fmt), "w": w.to(memory_format=fmt), "graphs": {}}

    buffers = keep_buffers(torch, state, ("conv", req["shape"], dtype_name, layout), "cuda", build)
    x, w = buffers["x"], buffers["w"]

    def conv():
        return torch.nn.functional.conv2d(x, w, stride=shape["stride"], padding=shape["pad"])

    iterations, warmup = int(req.get("iterations", 10)), int(req.get("warmup", 2))
    set_tf32(torch, cudnn=(dtype_name == "tf32"))
    try:
        if per_graph <= 0:
            return time_cuda(torch, lambda _i: conv(), iterations, warmup)
        graph = buffers["graphs"].get(per_graph)
        if graph is None:
            # cudnn.benchmark chooses in these calls, outside the capture (on a side stream,
            # as torch's documentation asks)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    conv()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(per_graph):
                    conv()
            buffers["graphs"][per_graph] = graph
        times = time_cuda_chained(torch, graph.replay, iterations, warmup)
        return [t / per_graph for t in times]
    finally:
        set_tf32(torch, cudnn=False)


def serve_copy(torch, req, state):
    """One block of a bench_bandwidth copy; the destination is checked against its source after
    every block (a copy that did not arrive is an error, not a time)."""
    kind, nbytes = req["kind"], int(req["bytes"])
    cases = keep_buffers(torch, state, ("copy", nbytes), "cuda", lambda: copy_cases(torch, nbytes))
    if kind not in cases:
        raise ValueError(f"unknown copy kind {kind!r}")
    make_dst, copy, expected = cases[kind]
    dsts = state.setdefault("dst", {})
    if kind not in dsts:
        dsts.clear()  # one destination at a time: 1 GiB ones add up
        dsts[kind] = make_dst()
    dst = dsts[kind]
    times = time_cuda(torch, lambda _i: copy(dst), int(req.get("iterations", 10)), int(req.get("warmup", 2)))
    torch.cuda.synchronize()
    if not torch.equal(dst, expected.to(dst.device)):
        raise ValueError(f"PyTorch's {kind} copy of {nbytes} bytes did not match its source")
    return times


def copy_cases(torch, nbytes):
    """kind -> (make a zeroed destination, copy function, tensor the destination must equal),
    over fresh random sources of `nbytes`."""
    host_src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    pinned_src = host_src.pin_memory()
    dev_src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    return {
        "h2d_pageable": (lambda: torch.zeros(nbytes, dtype=torch.uint8, device="cuda"),
                         lambda dst: dst.copy_(host_src), host_src),
        "h2d_pinned": (lambda: torch.zeros(nbytes, dtype=torch.uint8, device="cuda"),
                       lambda dst: dst.copy_(pinned_src, non_blocking=True), host_src),
        "d2h_pinned": (lambda: torch.zeros(nbytes, dtype=torch.uint8).pin_memory(),
                       lambda dst: dst.copy_(dev_src, non_blocking=True), dev_src),
        "d2h_pageable": (lambda: torch.zeros(nbytes, dtype=torch.uint8),
                         lambda dst: dst.copy_(dev_src), dev_src),
        "d2d": (lambda: torch.zeros(nbytes, dtype=torch.uint8, device="cuda"),
                lambda dst: dst.copy_(dev_src), dev_src),
    }


def bench_bandwidth(torch, args):
    rows = []
    for nbytes in args.sizes_bytes:
        log(f"bandwidth {nbytes} bytes")
        kinds = copy_cases(torch, nbytes)
        for kind, (make_dst, copy, expected) in kinds.items():
            dst = make_dst()
            stats = summarize(time_cuda(torch, lambda _i: copy(dst), args.iterations, args.warmup))
            torch.cuda.synchronize()
            verified = torch.equal(dst, expected.to(dst.device))
            if not verified:
                log(f"VERIFICATION FAILED: {kind} {nbytes} bytes")
            row = {"kind": kind, "bytes": nbytes, **stats, "gbs": rate(nbytes, stats["median_ms"], 1e9)}
            if kind == "d2d":
                row["gbs_read_write"] = rate(2 * nbytes, stats["median_ms"], 1e9)
            row["verified"] = verified
            rows.append(row)
            del dst
        del kinds
        release(torch, "cuda")
    return rows


def bench_p2p(torch, args):
    """dst.copy_(src) from each GPU to each other one: the source's stream, events around
    `iterations` copies per sample, as gpukit's `bench p2p` times cuMemcpyPeerAsync."""
    n = torch.cuda.device_count()
    if n < 2:
        raise RuntimeError(f"p2p needs two or more GPUs; torch sees {n}")
    rows = []
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            log(f"p2p cuda:{a} -> cuda:{b}")
            src = torch.randint(0, 256, (args.bytes,), dtype=torch.uint8, device=f"cuda:{a}")
            dst = torch.empty(args.bytes, dtype=torch.uint8, device=f"cuda:{b}")
            with torch.cuda.device(a):
                def block(_i):
                    for _ in range(args.iterations):
                        dst.copy_(src, non_blocking=True)
                times = time_cuda(torch, block, args.repeats, 1)
                torch.cuda.synchronize(a)
                torch.cuda.synchronize(b)
            verified = torch.equal(dst.cpu(), src.cpu())
            per_copy = [t / args.iterations for t in times]
            stats = summarize(per_copy)
            rows.append({"src": a, "dst": b, "bytes": args.bytes, **stats,
                         "gbs": rate(args.bytes, stats["median_ms"], 1e9),
                         "peer_access": bool(torch.cuda.can_device_access_peer(a, b)),
                         "verified": verified})
            del src, dst
            release(torch, "cuda")
    return rows


def bench_conv(torch, args):
    conv2d = torch.nn.functional.conv2d
    torch.backends.cudnn.benchmark = args.benchmark_cudnn
    rows = []
    for shape in args.shapes:
        for dtype_name in args.dtypes:
            dtype = getattr(torch, DTYPES[dtype_name])
            set_tf32(torch, cudnn=(dtype_name == "tf32"))
            for layout in args.layouts:
                log(f"conv {shape['text']} {dtype_name} {layout} on {args.device}")
                fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
                x = torch.randn(shape["n"], shape["c"], shape["h"], shape["w"], device=args.device, dtype=dtype)
                w = torch.randn(shape["k"], shape["c"], shape["r"], shape["s"], device=args.device, dtype=dtype)
                x, w = x.to(memory_format=fmt), w.to(memory_format=fmt)

                def step(_i):
                    conv2d(x, w, stride=shape["stride"], padding=shape["pad"])

                stats = summarize(time_step(torch, args.device, step, args.iterations, args.warmup))
                rows.append({"dtype": dtype_name, "layout": layout, "shape": shape["text"],
                             "device": args.device, **stats,
                             "tflops": rate(shape["flops"], stats["median_ms"], 1e12)})
                del x, w, step
                release(torch, args.device)
    set_tf32(torch, cudnn=False)
    return rows


class CompileFailed(Exception):
    """torch.compile could not compile the model (its rows are skipped, not failed)."""


def read_safetensors(torch, path, what="file"):
    """Read a .safetensors file into {name: CPU tensor}; a bad file raises a one-line RuntimeError."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors I/O here assumes a little-endian host")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise RuntimeError(f"cannot read {what} {path}: {exc.strerror or exc}") from None

    def bad(why):
        return RuntimeError(f"{what} {path} is not a valid safetensors file: {why}")

    def is_int(value):
        return isinstance(value, int) and not isinstance(value, bool)

    if len(data) < 8:
        raise bad(f"{len(data)} bytes, fewer than the 8-byte header length")
    header_len = int.from_bytes(data[:8], "little")
    if header_len > len(data) - 8:
        raise bad(f"header length {header_len} exceeds the {len(data) - 8} bytes after it")
    try:
        header = json.loads(data[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"header is not JSON ({one_line(exc)})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    start, size, view = 8 + header_len, len(data) - 8 - header_len, memoryview(data)
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise bad(f"entry {name!r} is not an object")
        code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if code not in SAFETENSORS_DTYPES:
            raise RuntimeError(f"{what} {path}: tensor {name!r} has dtype {code!r}; "
                               f"only {', '.join(SAFETENSORS_DTYPES)} are supported")
        if not (isinstance(shape, list) and all(is_int(d) and d >= 0 for d in shape)):
            raise bad(f"tensor {name!r} has a bad shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(is_int, offsets))
                and 0 <= offsets[0] <= offsets[1] <= size):
            raise bad(f"tensor {name!r} has data_offsets {offsets!r} outside the {size}-byte data section")
        dtype_name, itemsize = SAFETENSORS_DTYPES[code]
        nbytes = math.prod(shape) * itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise bad(f"tensor {name!r} ({code} {shape}) needs {nbytes} bytes but its data_offsets "
                      f"span {offsets[1] - offsets[0]}")
        dtype = getattr(torch, dtype_name)
        if nbytes == 0:  # torch.frombuffer refuses an empty buffer
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            raw = bytearray(view[start + offsets[0]:start + offsets[1]])
            tensors[name] = torch.frombuffer(raw, dtype=dtype).reshape(shape)
    return tensors


def write_safetensors(torch, path, tensors):
    """Write {name: tensor} to path as safetensors, atomically (temp file beside it, os.replace)."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors I/O here assumes a little-endian host")
    codes = {getattr(torch, dtype_name): code for code, (dtype_name, _) in SAFETENSORS_DTYPES.items()}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, tensor in tensors.items():
        t = tensor.detach().to("cpu").contiguous()
        if t.dtype not in codes:
            raise RuntimeError(f"cannot write tensor {name!r} of dtype {t.dtype} to {path}")
        nbytes = t.numel() * t.element_size()
        blobs.append(ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b"")
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the data section starts 8-byte aligned
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
        with os.fdopen(fd, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for blob in blobs:
                f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def own_resnet(torch, name, num_classes):
    """torchvision's ResNet (v1.5: stride on the 3x3 conv) built here, with its module names."""
    nn = torch.nn
    kind, depths = RESNETS[name]

    def conv(cin, cout, k, stride=1):
        return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, cin, width, stride, downsample):
            super().__init__()
            self.conv1 = conv(cin, width, 3, stride)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = conv(width, width, 3)
            self.bn2 = nn.BatchNorm2d(width)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            out += identity
            return self.relu(out)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, width, stride, downsample):
            super().__init__()
            self.conv1 = conv(cin, width, 1)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = conv(width, width, 3, stride)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = conv(width, width * self.expansion, 1)
            self.bn3 = nn.BatchNorm2d(width * self.expansion)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            out += identity
            return self.relu(out)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            block = BasicBlock if kind == "basic" else Bottleneck
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            cin = 64
            for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), depths), start=1):
                layers = []
                for index in range(blocks):
                    stride = 2 if stage > 1 and index == 0 else 1
                    cout = width * block.expansion
                    downsample = None
                    if stride != 1 or cin != cout:
                        downsample = nn.Sequential(conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))
                    layers.append(block(cin, width, stride, downsample))
                    cin = cout
                setattr(self, f"layer{stage}", nn.Sequential(*layers))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet()


def check_state_dict(model, state, what, name):
    """Raise unless state has exactly model's keys (num_batches_tracked optional) with its shapes."""
    expected = model.state_dict()
    optional = lambda key: key.endswith(".num_batches_tracked")  # noqa: E731
    missing = [k for k in expected if k not in state and not optional(k)]
    unexpected = [k for k in state if k not in expected]

    def listing(keys):
        return ", ".join(keys[:5]) + (f", ... ({len(keys)} in all)" if len(keys) > 5 else "")

    problems = ([f"missing keys: {listing(missing)}"] if missing else []) + \
               ([f"unexpected keys: {listing(unexpected)}"] if unexpected else [])
    if problems:
        raise RuntimeError(f"{what} do not match torchvision's {name} state_dict; {'; '.join(problems)}")
    for key, tensor in state.items():
        if not optional(key) and not tensor.is_floating_point():
            raise RuntimeError(f"{what}: tensor {key!r} is {tensor.dtype}, not floating point")
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise RuntimeError(f"{what}: tensor {key!r} has shape {list(tensor.shape)}; "
                               f"{name} expects {list(expected[key].shape)}")


def load_resnet(torch, name, state, path):
    """Build `name` for state (a torchvision state_dict) and load it; return (model, source, torchvision version)."""
    fc = state.get("fc.weight")
    if fc is None or fc.dim() != 2:
        raise RuntimeError(f"weights file {path} has no 2-D fc.weight; expected a torchvision ResNet state_dict")
    num_classes = int(fc.shape[0])
    try:
        import torchvision
        constructor, source, version = getattr(torchvision.models, name), "torchvision", torchvision.__version__
    except Exception as exc:  # missing, or broken (e.g. built for another torch)
        log(f"torchvision unavailable ({one_line(exc)}); building {name} in this script")
        constructor, source, version = None, "pytorch_reference.py", None
    if constructor is None:
        model = own_resnet(torch, name, num_classes)
    else:
        try:
            model = constructor(weights=None, num_classes=num_classes)
        except TypeError:  # torchvision before 0.13
            model = constructor(pretrained=False, num_classes=num_classes)
    check_state_dict(model, state, f"weights in {path}", name)
    model.load_state_dict(state, strict=False)  # only num_batches_tracked may be absent (checked above)
    model.requires_grad_(False)
    return model.eval(), source, version


def import_torchvision(name, needed_for):
    """torchvision, with model `name`; else a RuntimeError naming what to install."""
    try:
        import torchvision
    except Exception as exc:  # missing, or broken (e.g. built for another torch)
        raise RuntimeError(f"{needed_for} needs torchvision ({one_line(exc)}); "
                           "install it with 'pip install torchvision'") from None
    if not hasattr(torchvision.models, name):
        raise RuntimeError(f"torchvision {torchvision.__version__} has no model {name}; "
                           "a newer one may: 'pip install -U torchvision'")
    return torchvision


def calibrate(torch, model, batches=CALIBRATION_BATCHES):
    """Running batch norm statistics set to the mean and variance of random inputs' activations
    (cumulative over `batches` batches), layer by layer as the forward pass computes them."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(CALIBRATION_BATCH, 3, CALIBRATION_IMAGE, CALIBRATION_IMAGE))


def seeded_classifier(torch, torchvision, name):
    """torchvision's `name` with its own initialisation under torch.manual_seed(SEED) and batch
    norm statistics measured on random images, in eval mode on the CPU: what
    scripts/export_torchvision.py exports. With a fresh init's statistics (mean 0, variance 1)
    some models' activations shrink layer by layer until the logits are near 1e-9, below what
    fp16 represents; a trained model's are of order one."""
    torch.manual_seed(SEED)
    model = getattr(torchvision.models, name)(weights=None)
    calibrate(torch, model)
    return model.eval()


def load_classifier(torch, torchvision, name, state, path):
    """torchvision's `name` for state (its classes read from the last linear layer's weight), loaded."""
    constructor = getattr(torchvision.models, name)
    model = constructor(weights=None)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    head = state.get(f"{linears[-1][0]}.weight") if linears else None
    if head is not None and head.dim() == 2 and head.shape[0] != linears[-1][1].out_features:
        model = constructor(weights=None, num_classes=int(head.shape[0]))
    check_state_dict(model, state, f"weights in {path}", name)
    model.load_state_dict(state, strict=False)  # only num_batches_tracked may be absent (checked above)
    return model.eval()


def build_model(torch, args):
    """infer's model on the CPU in eval mode: (model, where its class came from, torchvision's
    version or None, its weights: "seeded" or the file)."""
    if args.weights is None:
        tv = import_torchvision(args.model, "a seeded model (torchvision's own initialisation)")
        model, source, version = seeded_classifier(torch, tv, args.model), "torchvision", tv.__version__
    else:
        state = read_safetensors(torch, args.weights, "weights file")
        if args.model in RESNETS:  # builds without torchvision too
            model, source, version = load_resnet(torch, args.model, state, args.weights)
        else:
            tv = import_torchvision(args.model, args.model)
            model = load_classifier(torch, tv, args.model, state, args.weights)
            source, version = "torchvision", tv.__version__
    model.requires_grad_(False)
    return model, source, version, args.weights or "seeded"


def structure(torch, model, image_size):
    """What the model computes with, counted in one forward of one image on the CPU: calls of
    F.conv1d/2d/3d and of F.linear, its parameters and the output's shape. torch.onnx.export
    traces the same calls, writing one Conv node per convolution and one Gemm or MatMul on
    constant weights per linear call, so an export of the model has the same counts. The
    functions are counted rather than the modules because some models call them on a module's
    weights (Swin's attention) or inside one call (MultiheadAttention's in and out projections,
    counted with its fast path off, which tracing does not take either)."""
    F = torch.nn.functional
    counts = {"conv": 0, "linear": 0}
    kinds = {"conv1d": "conv", "conv2d": "conv", "conv3d": "conv", "linear": "linear"}
    originals = {name: getattr(F, name) for name in kinds}

    def counting(name):
        def call(*args, **kwargs):
            counts[kinds[name]] += 1
            return originals[name](*args, **kwargs)
        return call

    mha = getattr(torch.backends, "mha", None)
    fast_path = mha.get_fastpath_enabled() if mha else None
    try:
        for name in kinds:
            setattr(F, name, counting(name))
        if mha:
            mha.set_fastpath_enabled(False)
        with torch.inference_mode():
            out = model(torch.zeros(1, 3, image_size, image_size))
    finally:
        for name, original in originals.items():
            setattr(F, name, original)
        if mha:
            mha.set_fastpath_enabled(fast_path)
    return {**counts, "parameters": sum(p.numel() for p in model.parameters()),
            "output_shape": list(getattr(out, "shape", []))}


def read_input(torch, path):
    tensors = read_safetensors(torch, path, "input file")
    x = tensors.get("input")
    if x is None:
        raise RuntimeError(f"input file {path} has no tensor named 'input' (it has: {', '.join(tensors) or 'none'})")
    if x.dim() != 4 or x.shape[1] != 3 or x.numel() == 0:
        raise RuntimeError(f"input file {path}: 'input' is {list(x.shape)}; expected [n,3,H,W], none of them 0")
    if not x.is_floating_point():
        raise RuntimeError(f"input file {path}: 'input' is {x.dtype}; expected float32")
    return x.float()


def prepare_model(torch, base, device, dtype, channels_last):
    model = deepcopy(base).to(device=device, dtype=dtype)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model.eval()


def as_strategy_input(torch, x, device, dtype, channels_last):
    x = x.to(device=device, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x.contiguous()


def is_oom(torch, exc):
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in str(exc).lower()


def make_runner(torch, kind, model, x, info):
    """Return call(): one forward of model on x, returning the output.

    graph: warms up on a side stream, captures one forward in a CUDAGraph; call() replays it.
    compile, compile_graph: compiles afresh for x's shape (compile_graph with mode="reduce-overhead",
    its CUDA graph recorded by the third call); the time to that point goes to info["compile_s"].
    """
    if kind == "eager":
        return lambda: model(x)
    if kind == "graph":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(CUDA_GRAPH_WARMUP_CALLS):
                model(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(x)

        def replay():
            graph.replay()
            return static_out
        return replay
    if not hasattr(torch, "compile"):
        raise CompileFailed(f"torch {torch.__version__} has no torch.compile")
    try:
        importlib.import_module("torch._dynamo").reset()
        mode, first_calls = COMPILE_MODES[kind]
        compiled = torch.compile(model, mode=mode, dynamic=False)
        t0 = time.perf_counter()
        for _ in range(first_calls):
            compiled(x)
        if x.is_cuda:
            torch.cuda.synchronize()
        info["compile_s"] = time.perf_counter() - t0
    except Exception as exc:
        if is_oom(torch, exc):
            raise
        raise CompileFailed(f"torch.compile failed: {one_line(exc)}") from None
    return lambda: compiled(x)


def infer_row(name, batch, status="ok", reason=None, stats=None, peaks=(None, None), compile_s=None):
    row = {"strategy": name, "batch": batch, "status": status}
    if status != "ok":
        row["reason"] = reason
    for key in ("median_ms", "p10_ms", "p90_ms", "count"):
        row[key] = stats[key] if stats else None
    row["images_per_s"] = rate(batch, stats["median_ms"], 1) if stats else None
    row["peak_allocated_bytes"], row["peak_reserved_bytes"] = peaks
    if INFER_STRATEGIES[name][3] in COMPILE_MODES:
        row["compile_s"] = compile_s
    return row


def cleanup(torch, device):
    """Drop garbage and cached GPU memory; a broken CUDA context only gets logged here."""
    gc.collect()
    try:
        release(torch, device)
    except Exception as exc:
        log(f"releasing GPU memory failed: {one_line(exc)}")


def bench_strategy(torch, args, base, name, inp):
    """Return (rows, logits on inp or None, why there are none or None) for one strategy."""
    dtype_name, channels_last, tf32, kind = INFER_STRATEGIES[name]
    dtype, cuda = getattr(torch, dtype_name), args.device == "cuda"
    if not cuda and name != "eager_fp32":
        return [infer_row(name, b, "skipped", "only eager_fp32 runs on the cpu") for b in args.batch_sizes], None, None
    set_tf32(torch, matmul=tf32, cudnn=tf32)
    model = None
    try:
        model = prepare_model(torch, base, args.device, dtype, channels_last)
    except Exception as exc:
        reason = f"preparing the model on {args.device} failed: {one_line(exc)}"
    if model is None:
        log(f"infer {name}: {reason}")
        return [infer_row(name, b, "failed", reason) for b in args.batch_sizes], None, reason

    rows, skip_reason = [], None
    for batch in args.batch_sizes:
        if skip_reason is not None:
            rows.append(infer_row(name, batch, "skipped", skip_reason))
            continue
        log(f"infer {args.model} {name} batch {batch} on {args.device}")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        info, stats, status, reason = {}, None, "ok", None
        try:
            with torch.inference_mode():
                x = as_strategy_input(torch, seeded_randn(torch, (batch, 3, args.image_size, args.image_size),
                                                          args.device, seed=batch),
                                      args.device, dtype, channels_last)
                call = make_runner(torch, kind, model, x, info)
                times = time_step(torch, args.device, lambda _i: call(), args.iterations, args.warmup)
            stats = summarize(times)
        except CompileFailed as exc:
            status, reason = "skipped", str(exc)
            skip_reason = reason
        except Exception as exc:  # out of memory above all: the row fails, the others go on
            status, reason = "failed", one_line(exc)
        x = call = None
        peaks = (None, None)
        if cuda and status != "skipped":
            peaks = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
        rows.append(infer_row(name, batch, status, reason, stats, peaks, info.get("compile_s")))
        if reason:
            log(f"infer {name} batch {batch} {status}: {reason}")
        cleanup(torch, args.device)

    logits = logits_error = None
    if inp is not None and any(row["status"] == "ok" for row in rows):
        try:
            with torch.inference_mode():
                x = as_strategy_input(torch, inp, args.device, dtype, channels_last)
                logits = make_runner(torch, kind, model, x, {})().float().cpu()
        except Exception as exc:
            logits_error = one_line(exc)
            log(f"infer {name} on the input failed: {logits_error}")
    return rows, logits, logits_error


def seeded_randn(torch, shape, device, seed):
    """float32 torch.randn on device from a fixed seed, so that every strategy sees the same values."""
    torch.manual_seed(seed)
    return torch.randn(*shape, device=device)


def finite_or_none(value):
    return value if math.isfinite(value) else None


def read_train_config(path):
    """gpukit's TrainConfig (plus "precision" and "resident") from a JSON file."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read the training config {path}: {one_line(exc)}") from None


def mlp_layers(torch, widths):
    """gpukit's MLP as nn.Sequential's layers: Linear, ReLU, ..., Linear (names 0, 2, 4, ...)."""
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return layers


def optimizer_spec(torch, opt_cfg):
    """torch.optim's SGD, Adam or AdamW class and its arguments from gpukit's OptimizerConfig."""
    kind, lr, wd = opt_cfg["kind"], opt_cfg["lr"], opt_cfg["weight_decay"]
    if kind == "sgd":
        return torch.optim.SGD, {"lr": lr, "momentum": opt_cfg["momentum"], "weight_decay": wd}
    if kind == "adam":
        return torch.optim.Adam, {"lr": lr, "weight_decay": wd}
    return torch.optim.AdamW, {"lr": lr, "weight_decay": wd}


def make_optimizer(torch, params, opt_cfg, fused=False):
    """torch.optim's SGD, Adam or AdamW from gpukit's OptimizerConfig (fused: the one-kernel
    CUDA implementation)."""
    cls, kwargs = optimizer_spec(torch, opt_cfg)
    return cls(params, **kwargs, **({"fused": True} if fused else {}))


def make_loss(torch, loss_name):
    return torch.nn.CrossEntropyLoss() if loss_name == "cross-entropy" else torch.nn.MSELoss()


def bench_train(torch, args):
    """gpukit's training loop in idiomatic PyTorch (see the usage text); returns (rows, extra)."""
    cfg = read_train_config(args.config)
    device = torch.device(args.device)
    data = read_safetensors(torch, args.data, "data file")
    init = read_safetensors(torch, args.init, "initial weights file")
    order = read_safetensors(torch, args.order, "order file")["order"]
    widths, loss_name = cfg["widths"], cfg["loss"]
    opt_cfg, precision = cfg["optimizer"], cfg.get("precision", "fp32")
    x = data["x"].float()
    y = data["y"].long() if loss_name == "cross-entropy" else data["y"].float()
    if loss_name == "mse" and y.dim() == 1:
        y = y.unsqueeze(1)
    layers = mlp_layers(torch, widths)
    batch, accumulate = cfg["batch_size"], cfg["accumulate"]
    max_steps = cfg.get("max_steps")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)

    class OrderSampler(torch.utils.data.Sampler):
        """Every epoch's batches in gpukit's order: consecutive chunks of that epoch's order."""

        def __init__(self):
            self.batches = [order[e][i:i + batch].tolist()
                            for e in range(order.shape[0]) for i in range(0, order.shape[1], batch)]

        def __iter__(self):
            return iter(self.batches)

        def __len__(self):
            return len(self.batches)

    n = x.shape[0]
    per_epoch = (n + batch - 1) // batch
    resident = bool(cfg.get("resident")) and device.type == "cuda"
    if resident:
        # what a careful engineer does when the data fits: on the GPU once, batches indexed there
        x_dev, y_dev = x.to(device), y.to(device)
        order_dev = order.to(device=device, dtype=torch.long)

        def batches():
            for e in range(order_dev.shape[0]):
                for i in range(0, order_dev.shape[1], batch):
                    idx = order_dev[e, i:i + batch]
                    yield x_dev[idx], y_dev[idx]
    else:
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_sampler=OrderSampler(),
                                             pin_memory=device.type == "cuda")

        def batches():
            for xb, yb in loader:
                yield xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)

    def one_run(count_skips=False):
        model = torch.nn.Sequential(*layers).to(device)
        model.load_state_dict({k: v.float() for k, v in init.items()})
        opt = make_optimizer(torch, model.parameters(), opt_cfg)
        loss_fn = make_loss(torch, loss_name)
        scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        losses, micro, steps, skipped = [], [], 0, 0
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b, (xb, yb) in enumerate(batches()):
            if max_steps is not None and steps >= max_steps:
                break
            with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                loss = loss_fn(model(xb), yb)
            micro.append(loss.detach().float())
            scaler.scale(loss / accumulate).backward()
            if len(micro) == accumulate or (b + 1) % per_epoch == 0:
                before = scaler.get_scale() if count_skips and scaler.is_enabled() else None
                scaler.step(opt)
                scaler.update()
                if before is not None and scaler.get_scale() < before:
                    skipped += 1  # the scale fell: this step's gradients overflowed, the step was skipped
                opt.zero_grad(set_to_none=True)
                losses.append(torch.stack(micro).mean())
                micro, steps = [], steps + 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        return [float(v) for v in torch.stack(losses).tolist()] if losses else [], seconds, skipped

    peak = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    # the first run is the compared one: it counts the steps GradScaler skipped (reading the
    # scale syncs, so the later, timed-alike runs do not)
    step_losses, first_s, skipped = one_run(count_skips=True)
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
    seconds = [first_s] + [one_run()[1] for _ in range(args.repeats - 1)]
    return [{"step_losses": step_losses, "seconds": seconds, "peak_bytes": peak,
             "skipped_steps": skipped if precision == "fp16" else None}], \
        {"precision": precision, "resident": resident}


def checkpoint_blocks(torch, model):
    """Each residual block of a torchvision ResNet run under torch.utils.checkpoint: its maps
    dropped after the forward and recomputed in the backward (the parameters and their order
    are unchanged)."""
    import torch.utils.checkpoint as ckpt

    class Checkpointed(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return ckpt.checkpoint(self.block, x, use_reentrant=False)

    for name in ("layer1", "layer2", "layer3", "layer4"):
        layer = getattr(model, name)
        for i in range(len(layer)):
            layer[i] = Checkpointed(layer[i])


def bench_train_cnn(torch, args):
    """torchvision's ResNet trained as a careful PyTorch user trains it: data resident on the GPU,
    cudnn.benchmark, channels_last for 16-bit autocast (GradScaler for fp16), SGD (momentum,
    Nesterov, weight decay) or AdamW with foreach updates, cross-entropy with label smoothing.
    Each mode ("eager"; "compile": torch.compile of the model, default mode; "compile_fused": with
    the fused optimizer; "compile_graphs": mode="reduce-overhead", CUDA graphs, fused) starts from the same
    weights: --warmup untimed updates after the first (whose time, compilation included, is
    first_step_s), then --steps updates each timed by CUDA events. The losses of the first
    --loss-steps updates (from the initial weights) are reported for comparison with gpukit's."""
    import torchvision
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    set_tf32(torch, matmul=args.precision == "tf32", cudnn=args.precision == "tf32")
    torch.manual_seed(args.seed)
    base = torchvision.models.__dict__[args.model](num_classes=args.classes)
    if args.init:
        state = read_safetensors(torch, args.init, "initial weights file")
        missing = [k for k in base.state_dict() if k not in state and not k.endswith("num_batches_tracked")]
        unexpected = [k for k in state if k not in base.state_dict()]
        if missing or unexpected:
            raise RuntimeError(f"{args.init} is not {args.model}'s state dict: missing {missing[:3]}, "
                               f"unexpected {unexpected[:3]}")
        base.load_state_dict({k: v for k, v in state.items()}, strict=False)
    init = {k: v.clone() for k, v in base.state_dict().items()}
    size, batch = args.image_size, args.batch_size
    if args.data:
        data = read_safetensors(torch, args.data, "data file")
        names = ("images", "labels") if "images" in data else ("x", "y")
        if any(n not in data for n in names):
            raise RuntimeError(f"{args.data} holds {sorted(data)}: want images and labels (or x and y)")
        images, labels = data[names[0]].float(), data[names[1]].long()
        if images.dim() != 4 or images.shape[1] != 3 or images.shape[0] < batch:
            raise RuntimeError(f"images of shape {list(images.shape)}: want [N >= {batch}, 3, H, W]")
        size = images.shape[2]
    else:
        g = torch.Generator().manual_seed(args.seed)
        if args.samples is not None and args.samples < batch:
            raise RuntimeError(f"--samples {args.samples} is fewer than one batch of {batch}")
        images = torch.randn(args.samples or 2 * batch, 3, size, size, generator=g)
        labels = torch.randint(0, args.classes, (images.shape[0],), generator=g)
    if args.write_init:
        write_safetensors(torch, args.write_init, init)
    if args.write_data:
        write_safetensors(torch, args.write_data, {"x": images, "y": labels})
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    fmt = torch.channels_last if half is not None else torch.contiguous_format
    images = images.to(device).contiguous(memory_format=fmt)
    labels = labels.to(device)
    count = images.shape[0] // batch
    order = None
    if args.order:
        order = read_safetensors(torch, args.order, "order file")["order"].long()
        if order.dim() != 2 or order.shape[1] != batch or order.numel() == 0 \
                or int(order.min()) < 0 or int(order.max()) >= images.shape[0]:
            raise RuntimeError(f"order of shape {list(order.shape)}: want [updates, {batch}] indices "
                               f"below {images.shape[0]}")
        order = order.to(device)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)

    def one_mode(mode):
        wide = mode == "eager64"  # every value float64, no autocast: the reference for fp32 losses
        if wide and half is not None:
            raise RuntimeError("eager64 is the float64 reference of fp32 training (--precision fp32)")
        model = copy.deepcopy(base).to(device).to(memory_format=fmt)
        model.load_state_dict(init)
        if wide:
            model = model.double()
        if args.checkpoint:
            checkpoint_blocks(torch, model)
        model.train()
        fused = mode in ("compile_fused", "compile_graphs")
        how = {"fused": True} if fused else {"foreach": True}
        if args.optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                  nesterov=args.nesterov, weight_decay=args.weight_decay, **how)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, **how)
        scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")
        graphs = mode == "compile_graphs"
        if mode.startswith("compile"):
            run = torch.compile(model, mode="reduce-overhead" if graphs else "default")
        else:
            run = model

        def step(i):
            j = i % count
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            if order is not None:
                idx = order[i % order.shape[0]]
                xb = images.index_select(0, idx).contiguous(memory_format=fmt)
                yb = labels.index_select(0, idx)
            else:
                xb, yb = images[j * batch:(j + 1) * batch], labels[j * batch:(j + 1) * batch]
            if wide:
                xb = xb.double()
            with torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None):
                loss = loss_fn(run(xb), yb)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            # a copy: a CUDA graph's output is overwritten by its next replay
            return loss.detach().clone() if wide else loss.detach().float().clone()

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        losses = [step(0)]
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        done = 1
        while done < 1 + args.warmup:
            losses.append(step(done))
            done += 1
        times = []
        for _ in range(args.steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            losses.append(step(done))
            end.record()
            times.append((start, end))
            done += 1
        torch.cuda.synchronize()
        ms = [s.elapsed_time(e) for s, e in times]
        timing = summarize(ms)
        row = {"mode": mode, "status": "ok", "model": args.model, "batch": batch, "image_size": size,
               "precision": args.precision, "first_step_s": first_s, "step_ms": timing,
               "images_per_s": rate(batch, timing["median_ms"], 1.0),
               "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
               "losses": [float(v) for v in losses[:args.loss_steps]]}  # float() of a float64 keeps it
        del run, model, opt
        return row

    rows = []
    for mode in args.modes:
        try:
            rows.append(one_mode(mode))
        except Exception as exc:  # one mode failing (a compiler missing, out of memory) is its row
            rows.append({"mode": mode, "status": "failed", "reason": one_line(exc)})
        if mode.startswith("compile") and "torch._dynamo" in sys.modules:
            sys.modules["torch._dynamo"].reset()
        cleanup(torch, args.device)
    return rows, {"model": args.model, "torchvision": torchvision.__version__,
                  "optimizer": args.optimizer, "lr": args.lr, "label_smoothing": args.label_smoothing}


def bench_infer(torch, args):
    """Return (rows, extra top-level fields).  Models are built and converted outside
    inference mode (their parameters stay ordinary tensors, which torch.compile and CUDA
    graphs handle best); every forward, capture and compilation runs under
    torch.inference_mode()."""
    torch.backends.cudnn.benchmark = args.benchmark_cudnn
    base, source, tv_version, weights = build_model(torch, args)
    shape = structure(torch, base, args.image_size)
    log(f"{args.model} from {source}, {weights} weights: {shape['parameters']} parameters, "
        f"{shape['conv']} convolution and {shape['linear']} linear calls, output {shape['output_shape']}")

    inp, outputs, saved = None, None, {}
    if args.input:
        inp = read_input(torch, args.input)
        if args.save_output and not os.path.isdir(os.path.dirname(os.path.abspath(args.save_output))):
            raise RuntimeError(f"cannot write {args.save_output}: its directory does not exist")
        log(f"reference logits: eager fp32 (TF32 off) on {args.input} {list(inp.shape)}")
        set_tf32(torch, matmul=False, cudnn=False)
        model = prepare_model(torch, base, args.device, torch.float32, False)
        with torch.inference_mode():
            saved["logits"] = model(inp.to(args.device)).float().cpu()
        del model
        cleanup(torch, args.device)
        outputs = {"input": args.input, "input_shape": list(inp.shape), "saved": None, "tensors": [],
                   "max_abs_diff": {}, "top1_agreement": {}, "errors": {}}

    rows = []
    for name in [] if args.check_only else args.strategies:
        # eager_fp32's logits on the input are the reference itself
        strategy_rows, logits, logits_error = bench_strategy(
            torch, args, base, name, inp if name != "eager_fp32" else None)
        rows.extend(strategy_rows)
        if INFER_STRATEGIES[name][3] in COMPILE_MODES and "torch._dynamo" in sys.modules:
            sys.modules["torch._dynamo"].reset()  # drop compiled code and its hold on the model
        cleanup(torch, args.device)
        if outputs is None:
            continue
        if logits is not None:
            reference = saved["logits"]
            saved[f"logits_{name}"] = logits
            outputs["max_abs_diff"][name] = finite_or_none((logits - reference).abs().max().item())
            outputs["top1_agreement"][name] = (logits.argmax(1) == reference.argmax(1)).float().mean().item()
        elif logits_error is not None:
            outputs["errors"][name] = logits_error
    set_tf32(torch, matmul=False, cudnn=False)

    if outputs is not None:
        outputs["tensors"] = list(saved)
        if args.save_output:
            write_safetensors(torch, args.save_output, saved)
            outputs["saved"] = args.save_output
            log(f"wrote {', '.join(saved)} to {args.save_output}")
    extra = {"model": args.model, "model_source": source, "torchvision": tv_version, "weights": weights,
             "device": args.device, "image_size": args.image_size,
             "cudnn_benchmark": bool(torch.backends.cudnn.benchmark), "parameters": shape["parameters"],
             "structure": shape, "outputs": outputs}
    return rows, extra


# ---------------------------------------------------------------------------------------------
# nccl and ddp: ranks started with torch.multiprocessing.spawn, one GPU each.
#
# Pure functions first (sizes, counts, bandwidth factors, expected results: nccl-tests' rules),
# testable without torch.

def nccl_sizes(min_bytes, max_bytes, step_factor):
    """nccl-tests' sizes: min_bytes, times step_factor, ..., while at most max_bytes."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= step_factor
    return sizes


def nccl_counts(op, size, word, nranks):
    """nccl-tests' getCollByteCount for `size` bytes of `word`-byte elements among nranks ranks:
    {"send": elements in a rank's send buffer, "recv": in its receive buffer, "param": the count
    given to the collective (nccl-tests' "count" column)}. Where the buffer is split among the
    ranks, each rank's part is size/word/nranks rounded down, so the buffer divides by nranks (as
    gpukit's own sweep counts; nccl-tests since December 2024 also rounds that part down to a
    multiple of 16 bytes, which differs only where it is not one already: small sizes and rank
    counts that are not powers of two)."""
    count = size // word
    if op in ("all_reduce", "broadcast", "reduce"):
        return {"send": count, "recv": count, "param": count}
    base = count // nranks
    if op == "all_gather":
        return {"send": base, "recv": base * nranks, "param": base}
    if op == "reduce_scatter":
        return {"send": base * nranks, "recv": base, "param": base}
    if op == "alltoall":
        return {"send": base * nranks, "recv": base * nranks, "param": base}
    raise ValueError(f"unknown collective {op!r}")


def nccl_row_bytes(counts, word):
    """nccl-tests' "size" column: the larger of a rank's send and receive buffers, in bytes."""
    return max(counts["send"], counts["recv"]) * word


def nccl_bus_factor(op, nranks):
    """busbw / algbw, as nccl-tests' *GetBw."""
    if op == "all_reduce":
        return 2 * (nranks - 1) / nranks
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        return (nranks - 1) / nranks
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def nccl_bandwidths(op, nbytes, time_us, nranks):
    """(algbw, busbw) in GB/s (1e9 bytes) for a row of nbytes (nccl_row_bytes) taking time_us."""
    if not time_us > 0:
        return None, None
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * nccl_bus_factor(op, nranks)


def pattern_value(i, rank):
    """Element i of rank `rank`'s input in the result check: an integer in [-8, 8]."""
    return ((i * 7 + rank * 13) % PATTERN_PERIOD) - 8


def nccl_input_period(rank):
    """One period of a rank's check input: element i is nccl_input_period(rank)[i % 17]."""
    return [float(pattern_value(k, rank)) for k in range(PATTERN_PERIOD)]


def reduce_values(redop, values):
    return float({"sum": sum, "max": max, "min": min}[redop](values))


def nccl_expected_segments(op, redop, nranks, rank, param, in_place, root=NCCL_ROOT):
    """What rank `rank`'s output holds after `op` on the check inputs (nccl_input_period), as
    segments [(start, length, period)]: output[start + j] == period[j % 17] (exact integers, in
    float64). param is nccl_counts' "param". None where nccl-tests checks nothing: reduce on
    a rank other than the root, in-place alltoall."""
    c, per = param, PATTERN_PERIOD
    if op == "all_reduce" or (op == "reduce" and rank == root):
        return [(0, c, [reduce_values(redop, [pattern_value(k, q) for q in range(nranks)])
                        for k in range(per)])]
    if op == "reduce":
        return None
    if op == "broadcast":
        return [(0, c, nccl_input_period(root))]
    if op == "all_gather":
        return [(q * c, c, nccl_input_period(q)) for q in range(nranks)]
    if op == "reduce_scatter":
        return [(0, c, [reduce_values(redop, [pattern_value(rank * c + k, q) for q in range(nranks)])
                        for k in range(per)])]
    if op == "alltoall":
        if in_place:
            return None
        return [(q * c, c, [float(pattern_value(rank * c + k, q)) for k in range(per)]) for q in range(nranks)]
    raise ValueError(f"unknown collective {op!r}")


def expand_segments(segments, length):
    """The expected output as a list (None where unchecked): for tests of nccl_expected_segments."""
    out = [None] * length
    for start, n, period in segments or []:
        for j in range(n):
            out[start + j] = period[j % len(period)]
    return out


def nccl_version_string(torch):
    """torch.cuda.nccl.version() as "2.28.9"; None where torch has no NCCL."""
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    if isinstance(v, (tuple, list)):
        return ".".join(str(p) for p in v[:3])
    v = int(v)  # NCCL_VERSION_CODE: major*10000 + minor*100 + patch from 2.9, major*1000 + ... before
    major, rest = (v // 10000, v % 10000) if v >= 10000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


# --- ranks --------------------------------------------------------------------------------------

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def heartbeat(workdir):
    """Tell the parent this rank made progress (the parent stops ranks that go quiet)."""
    path = os.path.join(workdir, "heartbeat")
    with open(path, "a"):
        pass
    os.utime(path)


def write_json_atomic(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def init_group(dist, backend, rank, world, port, timeout_s, device):
    """init_process_group on 127.0.0.1:port, with device_id where this torch takes it (NCCL)."""
    import datetime
    import inspect
    kwargs = {"backend": backend, "init_method": f"tcp://127.0.0.1:{port}", "rank": rank,
              "world_size": world, "timeout": datetime.timedelta(seconds=timeout_s)}
    if device is not None and "device_id" in inspect.signature(dist.init_process_group).parameters:
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)


def rank_errors(workdir):
    """[(rank, message)] that workers wrote, earliest first (the first is the likely cause)."""
    found = []
    for name in os.listdir(workdir):
        if name.startswith("error.") and name[6:].isdigit():
            path = os.path.join(workdir, name)
            try:
                with open(path) as f:
                    found.append((os.path.getmtime(path), int(name[6:]), f.read().strip()))
            except OSError:
                pass
    return [(rank, message) for _, rank, message in sorted(found)]


def run_ranks(torch, fn, nprocs, fn_args, workdir, timeout_s, what):
    """fn(rank, *fn_args) in nprocs processes started by torch.multiprocessing.spawn. Returns once
    all exited cleanly; raises RuntimeError (one line) when one failed, or when none touched the
    heartbeat file for timeout_s + 30 s (the process group's own timeout, timeout_s, normally
    fires first). Ranks still running are killed on the way out."""
    import torch.multiprocessing as tmp
    limit = timeout_s + 30
    started = time.time()
    ctx = tmp.spawn(fn, args=fn_args, nprocs=nprocs, join=False)
    try:
        while True:
            try:
                if ctx.join(timeout=1.0):
                    return
            except Exception as exc:  # ProcessRaisedException, ProcessExitedException
                errors = rank_errors(workdir)
                if errors:
                    rank, message = errors[0]
                    more = f" (and {len(errors) - 1} other rank(s) failed)" if len(errors) > 1 else ""
                    raise RuntimeError(f"{what}: rank {rank}: {message}{more}") from None
                lines = [line for line in str(exc).strip().splitlines() if line.strip()]
                raise RuntimeError(f"{what}: {lines[-1].strip() if lines else type(exc).__name__}") from None
            beat = os.path.join(workdir, "heartbeat")
            last = max(started, os.path.getmtime(beat) if os.path.exists(beat) else started)
            if time.time() - last > limit:
                raise RuntimeError(f"{what}: no rank made progress for {limit} s (--timeout-s {timeout_s}); "
                                   f"the {nprocs} rank(s) were stopped")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
        for p in ctx.processes:
            p.join(10)


def worker_failed(workdir, rank, exc):
    """Record a worker's failure for the parent (rank_errors) and its traceback on stderr."""
    import traceback
    traceback.print_exc()
    try:
        with open(os.path.join(workdir, f"error.{rank}"), "w") as f:
            f.write(one_line(exc) if isinstance(exc, Exception) else type(exc).__name__)
    except OSError:
        pass


def check_distributed(torch, backend, nproc, what):
    """Refuse (RuntimeError) what cannot run here; returns the number of ranks."""
    import torch.distributed as dist
    if not dist.is_available():
        raise RuntimeError(f"torch {torch.__version__} was built without torch.distributed")
    if backend == "gloo":
        if not dist.is_gloo_available():
            raise RuntimeError(f"torch {torch.__version__} has no gloo backend")
        return nproc or 2
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs CUDA GPUs but torch {torch.__version__} sees none "
                           f"(torch.version.cuda={torch.version.cuda})")
    if not dist.is_nccl_available():
        raise RuntimeError(f"torch {torch.__version__} has no NCCL backend")
    gpus = torch.cuda.device_count()
    nproc = nproc or gpus
    if nproc > gpus:
        raise RuntimeError(f"--nproc {nproc} asks for more ranks than the {gpus} GPU(s) torch sees (one GPU a rank)")
    return nproc


def rank_device(torch, backend, rank):
    if backend == "gloo":
        return torch.device("cpu")
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    return device


def device_label(torch, device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


# --- nccl -----------------------------------------------------------------------------------------

def tiled(torch, period, n, dtype, device):
    """n elements repeating `period` (float64 values cast to dtype) on device."""
    p = torch.tensor(period, dtype=torch.float64).to(dtype).to(device)
    return p.repeat(n // len(period) + 1)[:n]


def nccl_buffers(torch, op, counts, rank, in_place, dtype, device):
    """(input, output) for one row; in place, one is a view of the other as nccl-tests lays them out
    (all_gather: the input is the rank's slice of the output; reduce_scatter: the output is the
    rank's slice of the input; alltoall: the same buffer). all_reduce, broadcast and reduce take
    one tensor in torch.distributed: input is output."""
    c = counts["param"]
    if op in NCCL_ALWAYS_IN_PLACE:
        buf = torch.empty(c, dtype=dtype, device=device)
        return buf, buf
    if op == "all_gather":
        out = torch.empty(counts["recv"], dtype=dtype, device=device)
        return (out[rank * c:(rank + 1) * c] if in_place else torch.empty(c, dtype=dtype, device=device)), out
    if op == "reduce_scatter":
        inp = torch.empty(counts["send"], dtype=dtype, device=device)
        return inp, (inp[rank * c:(rank + 1) * c] if in_place else torch.empty(c, dtype=dtype, device=device))
    inp = torch.empty(counts["send"], dtype=dtype, device=device)  # alltoall
    return inp, (inp if in_place else torch.empty(counts["recv"], dtype=dtype, device=device))


def nccl_call(dist, op, redop, inp, out):
    """The torch.distributed call for op (synchronous: async_op=False)."""
    rop = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(redop)
    if op == "all_reduce":
        return lambda: dist.all_reduce(out, op=rop)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, inp)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(out, inp, op=rop)
    if op == "broadcast":
        return lambda: dist.broadcast(out, src=NCCL_ROOT)
    if op == "reduce":
        return lambda: dist.reduce(out, dst=NCCL_ROOT, op=rop)
    if op == "alltoall":
        return lambda: dist.all_to_all_single(out, inp)
    raise ValueError(f"unknown collective {op!r}")


def time_collective(torch, call, iterations, warmup, cuda):
    """warmup untimed calls, synchronize, then `iterations` calls back to back between two CUDA
    events (CPU: perf_counter); returns their total in ms."""
    for _ in range(warmup):
        call()
    if not cuda:
        t0 = time.perf_counter()
        for _ in range(iterations):
            call()
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def nccl_check(torch, op, redop, world, rank, counts, in_place, inp, out, call, device):
    """nccl-tests' #wrong on this rank: fill the inputs with the check pattern (outputs with NaN,
    which matches nothing), run op once, compare the output on the host with the expected values;
    None where nothing is checked."""
    out.fill_(float("nan"))
    inp.copy_(tiled(torch, nccl_input_period(rank), inp.numel(), inp.dtype, device))
    call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    segments = nccl_expected_segments(op, redop, world, rank, counts["param"], in_place)
    if segments is None:
        return None
    host = out.cpu()
    wrong = 0
    for start, length, period in segments:
        expected = tiled(torch, period, length, host.dtype, "cpu")
        wrong += int((host[start:start + length] != expected).sum().item())
    return wrong


def nccl_row(torch, dist, opts, op, dname, redop, size, rank, world, device):
    """One row: time, average over the ranks, check. None where the count is 0."""
    dtype_name, word = NCCL_DTYPES[dname]
    counts = nccl_counts(op, size, word, world)
    if counts["param"] == 0:
        return None
    in_place = opts["in_place"] or op in NCCL_ALWAYS_IN_PLACE
    cuda = device.type == "cuda"
    inp, out = nccl_buffers(torch, op, counts, rank, in_place, getattr(torch, dtype_name), device)
    inp.zero_()
    out.zero_()
    call = nccl_call(dist, op, redop, inp, out)
    total_ms = time_collective(torch, call, opts["iterations"], opts["warmup"], cuda)
    t = torch.tensor([total_ms / opts["iterations"] * 1e3], dtype=torch.float64, device=device)
    dist.all_reduce(t)  # nccl-tests' default: the time averaged over the ranks
    time_us = t.item() / world
    wrong = nccl_check(torch, op, redop, world, rank, counts, in_place, inp, out, call, device)
    # every rank makes the same choice here (in-place alltoall, reduce's non-root ranks: 0)
    checked = op != "alltoall" or not in_place
    w = torch.tensor([wrong or 0], dtype=torch.int64, device=device)
    dist.all_reduce(w)
    nbytes = nccl_row_bytes(counts, word)
    algbw, busbw = nccl_bandwidths(op, nbytes, time_us, world)
    return {"op": op, "dtype": dname, "redop": redop, "in_place": in_place, "bytes": nbytes,
            "count": counts["param"], "time_us": time_us, "algbw_gbs": algbw, "busbw_gbs": busbw,
            "wrong": int(w.item()) if checked else None}


def nccl_sweep(torch, dist, opts, rank, world, device, workdir):
    """Rows in op, dtype, redop, size order; ops the backend refuses (gloo) go to `skipped`."""
    rows, skipped = [], []
    sizes = nccl_sizes(opts["min_bytes"], opts["max_bytes"], opts["step_factor"])
    for op in opts["ops"]:
        for dname in opts["dtype"]:
            redops = opts["redop"] if op in NCCL_OPS_WITH_REDOP else [None]
            for redop in redops:
                if rank == 0:
                    log(f"nccl {op} {dname}{' ' + redop if redop else ''}: {len(sizes)} size(s) "
                        f"{sizes[0]}..{sizes[-1]} bytes on {world} rank(s)")
                for size in sizes:
                    try:
                        row = nccl_row(torch, dist, opts, op, dname, redop, size, rank, world, device)
                    except Exception as exc:
                        if opts["backend"] == "nccl":
                            raise
                        # a test backend without this collective refuses it on every rank alike
                        skipped.append({"op": op, "dtype": dname, "redop": redop, "reason": one_line(exc)})
                        if rank == 0:
                            log(f"nccl {op} {dname}: skipped ({one_line(exc)})")
                        break
                    if row is not None:
                        rows.append(row)
                    heartbeat(workdir)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows, skipped


def _nccl_worker(rank, world, port, opts, workdir):
    import torch
    import torch.distributed as dist
    try:
        device = rank_device(torch, opts["backend"], rank)
        init_group(dist, opts["backend"], rank, world, port, opts["timeout_s"],
                   device if device.type == "cuda" else None)
        heartbeat(workdir)
        rows, skipped = nccl_sweep(torch, dist, opts, rank, world, device, workdir)
        if rank == 0:
            write_json_atomic(os.path.join(workdir, "result.json"), {
                "torch_version": torch.__version__, "nccl_version": nccl_version_string(torch),
                "device_name": device_label(torch, device), "results": rows, "skipped": skipped})
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:
        worker_failed(workdir, rank, exc)
        raise


def bench_nccl(torch, args):
    world = check_distributed(torch, args.backend, args.nproc, "nccl")
    opts = {k: getattr(args, k) for k in ("ops", "dtype", "redop", "min_bytes", "max_bytes", "step_factor",
                                          "iterations", "warmup", "in_place", "timeout_s", "backend")}
    log(f"nccl: {world} rank(s), backend {args.backend}, {'in place' if args.in_place else 'out of place'}")
    with tempfile.TemporaryDirectory(prefix="pytorch_reference_nccl_") as workdir:
        run_ranks(torch, _nccl_worker, world, (world, free_port(), opts, workdir), workdir,
                  args.timeout_s, f"nccl ({args.backend}, {world} ranks)")
        with open(os.path.join(workdir, "result.json")) as f:
            doc = json.load(f)
    return {"ok": True, "command": "nccl", "torch_version": doc["torch_version"],
            "nccl_version": doc["nccl_version"], "device_name": doc["device_name"], "backend": args.backend,
            "world_size": world, "in_place": args.in_place, "iterations": args.iterations,
            "warmup": args.warmup, "results": doc["results"], "skipped": doc["skipped"]}


# --- ddp ------------------------------------------------------------------------------------------

TRAIN_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def check_ddp_config(cfg, path):
    """The TrainConfig fields ddp uses, checked before any rank starts (RuntimeError)."""
    def bad(why):
        raise RuntimeError(f"training config {path}: {why}")

    if not isinstance(cfg, dict):
        bad("not a JSON object")
    widths = cfg.get("widths")
    if not (isinstance(widths, list) and len(widths) >= 2
            and all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths)):
        bad(f"widths must be a list of at least 2 positive integers, not {widths!r}")
    if cfg.get("loss") not in ("mse", "cross-entropy"):
        bad(f"loss must be mse or cross-entropy, not {cfg.get('loss')!r}")
    opt = cfg.get("optimizer")
    if not isinstance(opt, dict) or opt.get("kind") not in ("sgd", "adam", "adamw"):
        bad(f"optimizer.kind must be sgd, adam or adamw, not {opt!r}")
    for key in ("lr", "weight_decay") + (("momentum",) if opt["kind"] == "sgd" else ()):
        if not isinstance(opt.get(key), (int, float)) or isinstance(opt.get(key), bool):
            bad(f"optimizer.{key} must be a number")
    if cfg.get("precision", "fp32") not in TRAIN_PRECISIONS:
        bad(f"precision must be one of {', '.join(TRAIN_PRECISIONS)}, not {cfg.get('precision')!r}")


def ddp_measure(torch, opts, rank, device, dist):
    """Step times (ms) of gpukit's MLP on synthetic data resident on `device`: forward, backward,
    optimizer step, with the train subcommand's precision handling; DDP-wrapped when dist is given."""
    cfg, batch = opts["config"], opts["batch"]
    widths, precision = cfg["widths"], cfg.get("precision", "fp32")
    compiled = opts["mode"].endswith("compiled")  # torch.compile with the fused optimizer
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(*mlp_layers(torch, widths)).to(device)
    if dist is not None:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=opts["bucket_mb"], gradient_as_bucket_view=True)
    if opts["mode"] == "ddp_zero":  # the optimizer sharded over the ranks (ZeRO stage 1)
        from torch.distributed.optim import ZeroRedundancyOptimizer
        cls, kwargs = optimizer_spec(torch, cfg["optimizer"])
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **kwargs)
    else:
        opt = make_optimizer(torch, model.parameters(), cfg["optimizer"], fused=compiled)
    run = torch.compile(model) if compiled else model
    loss_fn = make_loss(torch, cfg["loss"])
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    gen = torch.Generator(device=device)
    gen.manual_seed(1 + rank)  # each rank its own batch
    x = torch.randn(batch, widths[0], device=device, generator=gen)
    if cfg["loss"] == "cross-entropy":
        y = torch.randint(0, widths[-1], (batch,), device=device, generator=gen)
    else:
        y = torch.randn(batch, widths[-1], device=device, generator=gen)

    def step():
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = loss_fn(run(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    if device.type == "cuda":
        return time_cuda_chained(torch, step, opts["steps"], opts["warmup"])
    return time_cpu(lambda _i: step(), opts["steps"], opts["warmup"])


def ddp_cnn_measure(torch, opts, rank, device, dist):
    """Update times (ms) of torchvision's ResNet as train-cnn trains it (cudnn.benchmark,
    channels_last autocast for 16-bit, GradScaler for fp16, SGD or AdamW with foreach updates)
    on random images resident on `device` (each rank its own): DDP-wrapped when dist is given,
    torch.compile'd in the compile modes, with the fused optimizer in ddp_compile_fused."""
    import torchvision
    c, batch = opts["cnn"], opts["batch"]
    torch.backends.cudnn.benchmark = True
    set_tf32(torch, matmul=c["precision"] == "tf32", cudnn=c["precision"] == "tf32")
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(c["precision"])
    fmt = torch.channels_last if half is not None else torch.contiguous_format
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = torchvision.models.__dict__[c["model"]](num_classes=c["classes"])
    model = model.to(device).to(memory_format=fmt)
    if c["checkpoint"]:
        checkpoint_blocks(torch, model)
    model.train()
    if dist is not None:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index], bucket_cap_mb=opts["bucket_mb"], gradient_as_bucket_view=True)
        if c["grad_comm"] == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    how = {"fused": True} if opts["mode"].endswith("fused") else {"foreach": True}
    if c["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=c["lr"], momentum=c["momentum"], nesterov=c["nesterov"],
                              weight_decay=c["weight_decay"], **how)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=c["lr"], weight_decay=c["weight_decay"], **how)
    run = torch.compile(model) if "compile" in opts["mode"] else model
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=c["label_smoothing"])
    scaler = torch.amp.GradScaler("cuda", enabled=c["precision"] == "fp16")
    gen = torch.Generator(device=device)
    gen.manual_seed(1 + rank)  # each rank its own batch
    size = c["image_size"]
    x = torch.randn(batch, 3, size, size, device=device, generator=gen).contiguous(memory_format=fmt)
    y = torch.randint(0, c["classes"], (batch,), device=device, generator=gen)

    def step():
        with torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None):
            loss = loss_fn(run(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    return time_cuda_chained(torch, step, opts["steps"], opts["warmup"])


def every_rank_summary(torch, dist, summary, world, device):
    """Every rank's timing summary (median, p10, p90, count) and peak of allocated memory (None
    off the GPU), in rank order, gathered as one tensor (all_gather_object would need numpy)."""
    keys = ("median_ms", "p10_ms", "p90_ms", "count", "peak_allocated_bytes")
    row = [float(summary[k]) for k in keys[:4]] + [float(summary.get(keys[4]) or -1)]
    mine = torch.tensor(row, dtype=torch.float64, device=device)
    every = torch.empty(world * len(keys), dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(every, mine)
    values = every.view(world, len(keys)).tolist()
    return [{**dict(zip(keys[:3], v[:3])), "count": int(v[3]),
             "peak_allocated_bytes": int(v[4]) if v[4] >= 0 else None} for v in values]


def _ddp_worker(rank, world, port, opts, workdir):
    import torch
    dist = None
    try:
        device = rank_device(torch, opts["backend"], rank)
        if opts["mode"].startswith("ddp"):
            import torch.distributed as dist
            init_group(dist, opts["backend"], rank, world, port, opts["timeout_s"],
                       device if device.type == "cuda" else None)
        heartbeat(workdir)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        measure = ddp_cnn_measure if "cnn" in opts else ddp_measure
        summary = summarize(measure(torch, opts, rank, device, dist))
        if device.type == "cuda":
            # the whole run's peak: model, gradients, optimizer state, activations, its batch
            summary["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
        heartbeat(workdir)
        summaries = [summary]
        if dist is not None:
            summaries = every_rank_summary(torch, dist, summary, world, device)
        if rank == 0:
            write_json_atomic(os.path.join(workdir, "result.json"), {
                "torch_version": torch.__version__, "device_name": device_label(torch, device),
                "per_rank": summaries})
        if dist is not None:
            dist.barrier()
            dist.destroy_process_group()
    except BaseException as exc:
        worker_failed(workdir, rank, exc)
        raise


def ranks_together(per_rank, world, batch, single_sps):
    """One mode's ranks trained together: the slowest rank's step (the update is as slow as the
    slowest rank), the world's samples/s, each rank's median and the scaling efficiency against
    one GPU's samples/s."""
    slowest = max(per_rank, key=lambda s: s["median_ms"])
    sps = rate(world * batch, slowest["median_ms"], 1)
    peaks = [s["peak_allocated_bytes"] for s in per_rank if s.get("peak_allocated_bytes") is not None]
    return {"step_ms": slowest, "samples_per_s": sps,
            "peak_allocated_bytes": max(peaks) if peaks else None,
            "per_rank_step_ms": [s["median_ms"] for s in per_rank],
            "scaling_efficiency": sps / (world * single_sps) if single_sps and sps else None}


def bench_ddp(torch, args):
    cfg = read_train_config(args.config)
    check_ddp_config(cfg, args.config)
    batch = args.batch_per_gpu
    if batch is None:
        batch = cfg.get("batch_size")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise RuntimeError(f"training config {args.config}: no positive batch_size (or give --batch-per-gpu)")
    world = check_distributed(torch, args.backend, args.nproc, "ddp")
    precision = cfg.get("precision", "fp32")
    opts = {"config": cfg, "batch": batch, "steps": args.steps, "warmup": args.warmup,
            "bucket_mb": args.bucket_mb, "backend": args.backend, "timeout_s": args.timeout_s}
    found = {}
    modes = [("single", 1), ("ddp", world)] + ([("ddp_zero", world)] if args.zero else []) \
        + ([("single_compiled", 1), ("ddp_compiled", world)] if args.compiled else [])
    for mode, ranks in modes:
        log(f"ddp: {mode} ({ranks} rank(s), batch {batch} each, {precision}, {args.steps} steps after "
            f"{args.warmup} warm-up)")
        with tempfile.TemporaryDirectory(prefix=f"pytorch_reference_{mode}_") as workdir:
            run_ranks(torch, _ddp_worker, ranks, (ranks, free_port(), {**opts, "mode": mode}, workdir), workdir,
                      args.timeout_s, f"ddp {mode} ({args.backend}, {ranks} rank(s))")
            with open(os.path.join(workdir, "result.json")) as f:
                found[mode] = json.load(f)
    single = found["single"]["per_rank"][0]
    single_sps = rate(batch, single["median_ms"], 1)
    ddp = ranks_together(found["ddp"]["per_rank"], world, batch, single_sps)
    zero = {"ddp_zero": ranks_together(found["ddp_zero"]["per_rank"], world, batch, single_sps)} \
        if "ddp_zero" in found else {}
    if "ddp_compiled" in found:
        alone = found["single_compiled"]["per_rank"][0]
        alone_sps = rate(batch, alone["median_ms"], 1)
        zero["ddp_compiled"] = {"single": {"step_ms": alone, "samples_per_s": alone_sps},
                                **ranks_together(found["ddp_compiled"]["per_rank"], world, batch, alone_sps)}
    return {"ok": True, "command": "ddp", "torch_version": found["ddp"]["torch_version"],
            "device_name": found["ddp"]["device_name"], "backend": args.backend, "world_size": world,
            "batch_per_gpu": batch, "precision": precision, "optimizer": cfg["optimizer"]["kind"],
            "widths": cfg["widths"], "steps": args.steps, "warmup": args.warmup, "bucket_mb": args.bucket_mb,
            "single": {"step_ms": single, "samples_per_s": single_sps},
            "ddp": ddp, "scaling_efficiency": ddp["scaling_efficiency"], **zero}


def bench_ddp_cnn(torch, args):
    """For each of --modes: one GPU alone, then --nproc ranks under DDP, each --batch-per-gpu
    images; the DDP update is the slowest rank's; scaling efficiency = DDP images/s / (N x one
    GPU's)."""
    world = check_distributed(torch, args.backend, args.nproc, "ddp-cnn")
    batch = args.batch_per_gpu
    cnn = {"model": args.model, "classes": args.classes, "image_size": args.image_size,
           "precision": args.precision, "optimizer": args.optimizer, "lr": args.lr,
           "momentum": args.momentum, "nesterov": args.nesterov, "weight_decay": args.weight_decay,
           "label_smoothing": args.label_smoothing, "checkpoint": args.checkpoint,
           "grad_comm": args.grad_comm}
    opts = {"cnn": cnn, "batch": batch, "steps": args.steps, "warmup": args.warmup,
            "bucket_mb": args.bucket_mb, "backend": args.backend, "timeout_s": args.timeout_s}
    rows, version, device_name = [], torch.__version__, None
    for mode in args.modes:
        found = {}
        try:
            for how, ranks in (("single", 1), (mode, world)):
                tag = "single" if how == "single" else "ddp"
                log(f"ddp-cnn {mode}: {tag} ({ranks} rank(s), batch {batch} each, {args.precision})")
                run_mode = mode.replace("ddp", "alone") if how == "single" else mode
                with tempfile.TemporaryDirectory(prefix=f"pytorch_reference_{tag}_") as workdir:
                    run_ranks(torch, _ddp_worker, ranks,
                              (ranks, free_port(), {**opts, "mode": run_mode}, workdir), workdir,
                              args.timeout_s, f"ddp-cnn {run_mode} ({args.backend}, {ranks} rank(s))")
                    with open(os.path.join(workdir, "result.json")) as f:
                        found[tag] = json.load(f)
        except Exception as exc:  # one mode failing (a compiler missing, memory) is its row
            rows.append({"mode": mode, "status": "failed", "reason": one_line(exc)})
            continue
        version, device_name = found["ddp"]["torch_version"], found["ddp"]["device_name"]
        single = found["single"]["per_rank"][0]
        slowest = max(found["ddp"]["per_rank"], key=lambda s: s["median_ms"])
        single_ips = rate(batch, single["median_ms"], 1)
        ddp_ips = rate(world * batch, slowest["median_ms"], 1)
        peaks = [s["peak_allocated_bytes"] for s in found["ddp"]["per_rank"]
                 if s.get("peak_allocated_bytes") is not None]
        rows.append({"mode": mode, "status": "ok", "single": {"step_ms": single, "images_per_s": single_ips},
                     "ddp": {"step_ms": slowest, "images_per_s": ddp_ips,
                             "peak_allocated_bytes": max(peaks) if peaks else None},
                     "scaling_efficiency": ddp_ips / (world * single_ips) if single_ips and ddp_ips else None})
    return {"ok": True, "command": "ddp-cnn", "torch_version": version, "device_name": device_name,
            "world_size": world, "batch_per_gpu": batch, "model": args.model, "precision": args.precision,
            "results": rows}


# --- pipeline -------------------------------------------------------------------------------------


def parse_spans(spans, layers):
    """[(first, end), ...] from FIRST:END strings: consecutive, covering every layer once."""
    out = []
    for text in spans:
        try:
            a, b = (int(v) for v in text.split(":"))
        except ValueError:
            raise RuntimeError(f"--spans: {text!r} is not FIRST:END")
        out.append((a, b))
    if not out or out[0][0] != 0 or out[-1][1] != layers or any(
            a >= b or (i and out[i - 1][1] != a) for i, (a, b) in enumerate(out)):
        raise RuntimeError(f"--spans {spans}: not consecutive runs covering layers 0..{layers}")
    return out


def pipeline_measure(torch, opts, rank, device, dist):
    """Update times (ms) of this rank's stage of gpukit's MLP under torch.distributed.pipelining's
    Schedule1F1B: the stage's Linear (and ReLU) layers, autocast for 16-bit, the update after
    every batch of --micro-batches micro-batches; the last stage's losses are kept."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    cfg, batch, micro = opts["config"], opts["batch"], opts["micro"]
    widths, precision = cfg["widths"], cfg.get("precision", "fp32")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    first, end = opts["spans"][rank]
    world, last = len(opts["spans"]), len(widths) - 1
    torch.manual_seed(0)
    layers = []
    for i in range(first, end):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 1 < last:
            layers.append(torch.nn.ReLU())
    body = torch.nn.Sequential(*layers).to(device)

    class Stage(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                return self.inner(x)

    module = Stage(body)
    stage = PipelineStage(module, rank, world, device)
    loss_fn = make_loss(torch, cfg["loss"])
    schedule = Schedule1F1B(stage, micro, loss_fn=lambda out, y: loss_fn(out.float(), y))
    opt = make_optimizer(torch, module.parameters(), cfg["optimizer"])
    gen = torch.Generator(device=device)
    gen.manual_seed(1)
    x = torch.randn(batch, widths[0], device=device, generator=gen)
    if cfg["loss"] == "cross-entropy":
        y = torch.randint(0, widths[-1], (batch,), device=device, generator=gen)
    else:
        y = torch.randn(batch, widths[-1], device=device, generator=gen)
    losses = []

    def step():
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            out = []
            schedule.step(target=y, losses=out)
            losses.append(float(sum(l.item() for l in out) / max(len(out), 1)))
        else:
            schedule.step()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = time_cuda_chained(torch, step, opts["steps"], opts["warmup"])
    opts["losses"] = losses
    return times


def _pipeline_worker(rank, world, port, opts, workdir):
    import torch
    import torch.distributed as dist
    try:
        device = rank_device(torch, opts["backend"], rank)
        init_group(dist, opts["backend"], rank, world, port, opts["timeout_s"], device)
        heartbeat(workdir)
        summary = summarize(pipeline_measure(torch, opts, rank, device, dist))
        heartbeat(workdir)
        summaries = every_rank_summary(torch, dist, summary, world, device)
        if rank == world - 1:
            write_json_atomic(os.path.join(workdir, "result.json"), {
                "torch_version": torch.__version__, "device_name": device_label(torch, device),
                "per_rank": summaries, "last_losses": opts.get("losses", [])})
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:
        worker_failed(workdir, rank, exc)
        raise


def bench_pipeline(torch, args):
    cfg = read_train_config(args.config)
    check_ddp_config(cfg, args.config)
    spans = parse_spans(args.spans, len(cfg["widths"]) - 1)
    world = check_distributed(torch, args.backend, len(spans), "pipeline")
    if args.micro_batches > args.batch:
        raise RuntimeError(f"--micro-batches {args.micro_batches} is more than --batch {args.batch}")
    opts = {"config": cfg, "batch": args.batch, "micro": args.micro_batches, "spans": spans,
            "steps": args.steps, "warmup": args.warmup, "backend": args.backend,
            "timeout_s": args.timeout_s}
    log(f"pipeline: {world} stages {spans}, batch {args.batch} in {args.micro_batches} micro-batches, "
        f"{cfg.get('precision', 'fp32')}, {args.steps} updates after {args.warmup} warm-up")
    with tempfile.TemporaryDirectory(prefix="pytorch_reference_pipeline_") as workdir:
        run_ranks(torch, _pipeline_worker, world, (world, free_port(), opts, workdir), workdir,
                  args.timeout_s, f"pipeline ({args.backend}, {world} stages)")
        with open(os.path.join(workdir, "result.json")) as f:
            doc = json.load(f)
    slowest = max(doc["per_rank"], key=lambda r: r["median_ms"])
    return {"ok": True, "command": "pipeline", "torch_version": doc["torch_version"],
            "device_name": doc["device_name"], "stages": world, "spans": spans,
            "micro_batches": args.micro_batches, "batch": args.batch,
            "precision": cfg.get("precision", "fp32"), "widths": cfg["widths"],
            "steps": args.steps, "warmup": args.warmup,
            "step_ms": slowest, "per_rank_step_ms": [r["median_ms"] for r in doc["per_rank"]],
            "samples_per_s": rate(args.batch, slowest["median_ms"], 1),
            "losses": doc["last_losses"]}


def cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "cpu"


def run(torch, args):
    if args.command == "nccl":  # ranks in processes of their own: no GPU is touched here
        return bench_nccl(torch, args)
    if args.command == "ddp":
        return bench_ddp(torch, args)
    if args.command == "ddp-cnn":
        return bench_ddp_cnn(torch, args)
    if args.command == "pipeline":
        return bench_pipeline(torch, args)
    device = getattr(args, "device", "cuda")
    cuda_ok = torch.cuda.is_available()
    if device == "cuda" and not cuda_ok:
        raise RuntimeError(f"CUDA was asked for but torch {torch.__version__} sees no usable GPU "
                           f"(torch.version.cuda={torch.version.cuda}); use --device cpu or a CUDA build of torch")
    if device == "cpu" or getattr(args, "threads", None):
        torch.set_num_threads(args.threads or os.cpu_count() or 1)
        log(f"cpu threads: {torch.get_num_threads()}")
    extra = {}
    if args.command == "serve":
        ready = {"torch_version": torch.__version__,
                 "device_name": torch.cuda.get_device_name(0) if device == "cuda" else cpu_name(),
                 "threads": torch.get_num_threads()}
        with torch.inference_mode():
            answered = serve(torch, args, ready)
        return {"ok": True, "command": "serve", "torch_version": torch.__version__, "results": [],
                "answered": answered}
    if args.command == "infer":  # builds its models outside inference mode, runs them inside it
        results, extra = bench_infer(torch, args)
    elif args.command == "train":
        results, extra = bench_train(torch, args)
    elif args.command == "train-cnn":
        results, extra = bench_train_cnn(torch, args)
    else:
        bench = {"matmul": bench_matmul, "bandwidth": bench_bandwidth, "conv": bench_conv,
                 "p2p": bench_p2p}[args.command]
        with torch.inference_mode():
            results = bench(torch, args)
    return {"ok": True, "command": args.command, "torch_version": torch.__version__,
            "cuda_available": cuda_ok,
            "device_name": torch.cuda.get_device_name(0) if device == "cuda" else cpu_name(),
            "cudnn_version": torch.backends.cudnn.version() if cuda_ok else None,
            **extra, "results": results}


def one_line(exc):
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def main(argv=None):
    """Run the benchmark; return (JSON document, exit code)."""
    try:
        args = check_args(build_parser().parse_args(argv))
    except UsageError as exc:
        return {"ok": False, "error": f"bad arguments: {exc}"}, EXIT_USAGE
    try:
        import torch
    except ImportError as exc:
        return {"ok": False, "error": f"PyTorch is not installed ({exc}); install it with 'pip install torch'"}, EXIT_RUNTIME
    except Exception as exc:  # a broken install, e.g. a missing shared library
        return {"ok": False, "error": f"importing torch failed ({one_line(exc)}); reinstall it with 'pip install torch'"}, EXIT_RUNTIME
    try:
        return run(torch, args), 0
    except KeyboardInterrupt:
        return {"ok": False, "error": "interrupted"}, EXIT_RUNTIME
    except Exception as exc:
        return {"ok": False, "error": f"{args.command} benchmark failed: {one_line(exc)}"}, EXIT_RUNTIME


if __name__ == "__main__":
    # Anything printed while benchmarking (by Python or by native libraries) goes to
    # stderr, so that stdout carries nothing but the final JSON document.
    sys.stdout.flush()
    json_fd = os.dup(1)
    REPLY_FD = json_fd
    os.dup2(2, 1)
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        document, code = main()
    except SystemExit as exc:  # only --help gets here
        document, code = None, exc.code
    finally:
        sys.stdout = real_stdout
        os.dup2(json_fd, 1)
        os.close(json_fd)
    if document is not None:
        print(json.dumps(document), flush=True)
    sys.exit(code)
