#!/usr/bin/env python3
"""PyTorch reference figures for gpukit's benchmarks.

gpukit runs this script as a subprocess and prints PyTorch's numbers beside its
own.  Whatever happens, stdout carries exactly ONE JSON object; progress and
warnings go to stderr.

Usage:
  pytorch_reference.py matmul [--sizes 1000,4096] [--dtypes f32,tf32,f16,bf16,f64]
                              [--iterations 50] [--warmup 10] [--device cuda|cpu]
                              [--threads N]
  pytorch_reference.py bandwidth [--sizes-bytes 4096,1048576,268435456]
                                 [--iterations 20] [--warmup 3]
  pytorch_reference.py conv [--shapes "1x64x56x56:64x3x3:s1p1,..."]
                            [--dtypes f32,tf32,f16,bf16] [--layouts nchw,nhwc]
                            [--iterations 50] [--warmup 10] [--benchmark-cudnn]
                            [--device cuda|cpu] [--threads N]

  Conv shapes are NxCxHxW:KxRxS:s<stride>p<pad> (input, filter, stride/padding).

Output:
  success: {"ok": true, "command": ..., "torch_version": ..., "cuda_available": bool,
            "device_name": str|null, "cudnn_version": int|null, "results": [row, ...]}
  failure: {"ok": false, "error": "<one line>"}; exit 1 (runtime: torch missing,
           no CUDA, out of memory, ...) or 2 (bad arguments).

GPU timings use one pair of CUDA events around each timed iteration, read after a
single synchronize.  CPU timings use time.perf_counter and stop early so that one
row takes about CPU_ROW_BUDGET_S seconds at most (at least one timed iteration).
"""
import argparse
import json
import math
import os
import re
import sys
import time

EXIT_RUNTIME, EXIT_USAGE = 1, 2
MIB = 1 << 20
L2_FLUSH_BYTES = 2 * 64 * MIB  # rotate inputs until their total exceeds this
CPU_ROW_BUDGET_S = 10.0
DTYPES = {"f32": "float32", "tf32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}
CONV_SHAPE_RE = re.compile(r"^(\d+)x(\d+)x(\d+)x(\d+):(\d+)x(\d+)x(\d+):s(\d+)p(\d+)$")


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
    timing_args(m, 50, 10)

    b = sub.add_parser("bandwidth", help="host<->device and device->device copies")
    b.add_argument("--sizes-bytes", type=csv_of(positive_int), default=[4096, MIB, 256 * MIB])
    timing_args(b, 20, 3)

    c = sub.add_parser("conv", help="torch.nn.functional.conv2d")
    c.add_argument("--shapes", type=csv_of(conv_shape),
                   default=[conv_shape("1x64x56x56:64x3x3:s1p1"), conv_shape("32x256x56x56:64x1x1:s1p0")])
    c.add_argument("--dtypes", type=csv_of(choice_of("f32", "tf32", "f16", "bf16")), default=["f32", "tf32", "f16"])
    c.add_argument("--layouts", type=csv_of(choice_of("nchw", "nhwc")), default=["nchw", "nhwc"])
    c.add_argument("--benchmark-cudnn", action="store_true", help="set torch.backends.cudnn.benchmark")
    c.add_argument("--device", type=choice_of("cuda", "cpu"), default="cuda")
    c.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all)")
    timing_args(c, 50, 10)
    return parser


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


def set_tf32(torch, matmul=None, cudnn=None):
    """Allow or forbid TF32 for cuBLAS matmuls / cuDNN convolutions (newer API where present)."""
    new_api = hasattr(torch.backends.cuda.matmul, "fp32_precision")
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
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def bench_matmul(torch, args):
    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, DTYPES[dtype_name])
        set_tf32(torch, matmul=(dtype_name == "tf32"))
        for n in args.sizes:
            triple_bytes = 3 * n * n * torch.empty((), dtype=dtype).element_size()
            sets = L2_FLUSH_BYTES // triple_bytes + 1 if triple_bytes < L2_FLUSH_BYTES else 1
            log(f"matmul {dtype_name} {n}x{n} on {args.device} ({sets} operand set(s))")
            operands = [(torch.randn(n, n, device=args.device, dtype=dtype),
                         torch.randn(n, n, device=args.device, dtype=dtype),
                         torch.empty(n, n, device=args.device, dtype=dtype)) for _ in range(sets)]

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


def bench_bandwidth(torch, args):
    rows = []
    for nbytes in args.sizes_bytes:
        log(f"bandwidth {nbytes} bytes")
        host_src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
        pinned_src = host_src.pin_memory()
        dev_src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
        # kind -> (make a zeroed destination, copy function, tensor the destination must equal)
        kinds = {
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
        del host_src, pinned_src, dev_src, kinds
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
    device = getattr(args, "device", "cuda")
    cuda_ok = torch.cuda.is_available()
    if device == "cuda" and not cuda_ok:
        raise RuntimeError(f"CUDA was asked for but torch {torch.__version__} sees no usable GPU "
                           f"(torch.version.cuda={torch.version.cuda}); use --device cpu or a CUDA build of torch")
    if device == "cpu":
        torch.set_num_threads(args.threads or os.cpu_count() or 1)
        log(f"cpu threads: {torch.get_num_threads()}")
    bench = {"matmul": bench_matmul, "bandwidth": bench_bandwidth, "conv": bench_conv}[args.command]
    with torch.inference_mode():
        results = bench(torch, args)
    return {"ok": True, "command": args.command, "torch_version": torch.__version__,
            "cuda_available": cuda_ok,
            "device_name": torch.cuda.get_device_name(0) if device == "cuda" else cpu_name(),
            "cudnn_version": torch.backends.cudnn.version() if cuda_ok else None,
            "results": results}


def one_line(exc):
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def main(argv=None):
    """Run the benchmark; return (JSON document, exit code)."""
    try:
        args = build_parser().parse_args(argv)
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
