#!/usr/bin/env python3
"""PyTorch's side of `gpukit lessons --compare-pytorch`: the CUDA-101 notebook's own code.

gpukit runs this script on the user's GPU and prints PyTorch's figures beside its own, lesson
by lesson. Each lesson runs the notebook's functions as written (lesson 1's bad version is
`x = torch.randn(size, size); x = x.cuda()`, and so on), plus the optimisation guide's stream,
synchronisation and CUDA-graph patterns, all timed by one method that gpukit shares.
Whatever happens, stdout carries exactly ONE JSON object; progress goes to stderr.

Usage:
  pytorch_lessons.py [--lessons 0,1,2,3,4,5,6,7,8,streams,sync,graphs] [--device cuda:0]
                     [--samples 15] [--min-sample-ms 2]

  --lessons        a comma-separated list (default: all of them; "all" also means all).
                   Lesson 0 always runs first, before anything else touches CUDA.
  --device         cuda or cuda:N
  --samples        timed samples a case (each ends with one synchronize)
  --min-sample-ms  calls are batched so that one sample lasts at least this long

Timing (time_case): call the case at least 3 times and until 50 ms have passed (at most 200
calls), synchronize; time 1 call + synchronize and take k = clamp(ceil(min_sample_ms / that),
1, 1000) calls a sample; then each sample is k calls ended by one torch.cuda.synchronize(),
timed by time.perf_counter(), and its per-call time is the sample's time / k. This is the
notebook's benchmark_operation repeated to give a spread. Where a case reports "peak_mib" it is
torch.cuda.max_memory_allocated() during the timing less memory_allocated() before it.

Output:
  success: {"ok": true, "torch": str, "cuda": str, "cudnn": int|null, "device": "cuda:N",
            "device_name": str, "samples": int, "min_sample_ms": float, "method": str,
            "lessons": {id: lesson}}
     lesson: {"error": "<one line>"} when the lesson raised, else
             {"cases": {name: case}, ...fields of that lesson...}
     case:   {"median_ms", "p10_ms", "p90_ms" (linearly interpolated), "samples": [per-call ms],
              "calls_per_sample", ["peak_mib"]}
     "0":       no cases; "device_used_before_mib", "allocated_before_mib",
                "allocated_after_mib", "allocated_after_bytes", "reserved_after_mib",
                "device_used_after_mib", "context_mib", "query", "matched_by"
     "1":       host-then-copy, on-device (1024 x 1024 f32)
     "2":       <dt>-notebook, <dt>-matmul for f64, f32, tf32, f16, bf16 (2048 x 2048);
                "bytes_1000x1000"
     "3":       round-trip, on-device; "agree", "round_trip_value", "on_device_value"
     "4":       separate, batched, separate-matmul, batched-matmul
     "5":       allocating, in-place (each with "peak_mib")
     "6":       <n>-notebook, <n>-matmul for n in 1023, 1024, 1025, 1536, 2048 (f16)
     "7":       transposed-sum, contiguous-then-sum, transpose-copy, add-contiguous,
                add-transposed; "is_contiguous"
     "8":       notebook, or step (with "notebook_error") when the cell as written raises;
                "top" (torch.profiler's 5 ops with the most device time) or "profiler_error"
     "streams": "two-streams", "copy-compute": {"serial_ms", "concurrent_ms",
                "intervals_ms": [[begin, end], [begin, end]], "overlap_ms"};
                "pipeline": {"serial_ms", "pipelined_ms", "intervals_ms" (a chunk each),
                "overlap_ms", "stage_ms": {"h2d", "compute", "d2h"}, "agree"}; all from CUDA
                events, the median of 5 repeats (by the overlapped total) after 2 warm-ups
     "sync":    unsynchronized, synchronized, events (one call a sample, 1 matmul 4096^2 f32)
     "graphs":  eager, graph (200 x x.add_(1.0), launched one by one or replayed as one CUDA
                graph); "agree", "replays", "expected_value"
  failure: {"ok": false, "error": "<one line>"}; exit 2 for bad arguments (an unknown lesson, a
           device that is not cuda[:N] or that does not exist), 1 when torch cannot be imported
           or sees no CUDA device.
"""
import argparse
import contextlib
import gc
import json
import math
import os
import re
import subprocess
import sys
import time

EXIT_RUNTIME, EXIT_USAGE = 1, 2
MIB = float(1 << 20)
LESSONS = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "streams", "sync", "graphs")
DEVICE_RE = re.compile(r"^cuda(?::(\d+))?$")

# time_case: warm-up at least WARMUP_CALLS calls and WARMUP_MS, never more than WARMUP_MAX calls;
# at most MAX_CALLS calls in one sample (the same constants as gpukit's lessons/timing.rs)
WARMUP_CALLS, WARMUP_MS, WARMUP_MAX, MAX_CALLS = 3, 50.0, 200, 1000
METHOD = ("time_case: the case is called at least 3 times and until 50 ms have passed (at most "
          "200 calls) and synchronized; one call + synchronize sets k = clamp(ceil(min_sample_ms "
          "/ that), 1, 1000); each sample is k calls ended by one torch.cuda.synchronize(), timed "
          "with time.perf_counter(), per-call ms = sample / k (the notebook's benchmark_operation, "
          "repeated for a spread)")

# the streams lesson: untimed repeats, then the median of the timed ones
STREAM_WARMUPS, STREAM_REPEATS = 2, 5
NOTEBOOK_DTYPES = ("f64", "f32", "tf32", "f16", "bf16")
TENSOR_CORE_SIZES = (1023, 1024, 1025, 1536, 2048)
GRAPH_OPS, GRAPH_CHECK_REPLAYS = 200, 3


class UsageError(Exception):
    """Bad command-line arguments (exit code 2)."""


class JsonArgumentParser(argparse.ArgumentParser):
    """ArgumentParser that raises instead of printing usage and exiting."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")

    def print_help(self, file=None):  # keep stdout for the JSON document
        super().print_help(file or sys.stderr)


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def build_parser():
    p = JsonArgumentParser(prog="pytorch_lessons.py",
                           description="The CUDA-101 notebook's lessons in PyTorch, timed as gpukit times them.")
    p.add_argument("--lessons", default=",".join(LESSONS),
                   help=f"comma-separated lesson ids out of {','.join(LESSONS)} (default: all)")
    p.add_argument("--device", default="cuda:0", help="cuda or cuda:N (default cuda:0)")
    p.add_argument("--samples", type=positive_int, default=15, help="timed samples a case (default 15)")
    p.add_argument("--min-sample-ms", type=positive_float, default=2.0,
                   help="shortest sample in ms; calls are batched to reach it (default 2)")
    return p


def parse_lessons(text):
    """The lesson ids asked for, each once, in the order given; "all" means every lesson."""
    wanted = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        for lesson in (LESSONS if item == "all" else (item,)):
            if lesson not in LESSONS:
                raise UsageError(f"unknown lesson {lesson!r}; lessons are {', '.join(LESSONS)}")
            if lesson not in wanted:
                wanted.append(lesson)
    if not wanted:
        raise UsageError("--lessons names no lesson")
    return wanted


def parse_device(text):
    """The CUDA device index of cuda or cuda:N."""
    m = DEVICE_RE.match(text.strip())
    if not m:
        raise UsageError(f"bad device {text!r}; expected cuda or cuda:N")
    return int(m.group(1) or 0)


def log(message):
    print(f"[pytorch_lessons] {message}", file=sys.stderr, flush=True)


def one_line(exc):
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def json_safe(value):
    """The value with every NaN or infinity replaced by null (strict JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# --- timing ---------------------------------------------------------------------------------------

def percentile(sorted_values, pct):
    """Linearly interpolated percentile (numpy's default) of a sorted list."""
    pos = (len(sorted_values) - 1) * pct / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(per_call_ms, calls_per_sample):
    s = sorted(per_call_ms)
    return {"median_ms": percentile(s, 50), "p10_ms": percentile(s, 10), "p90_ms": percentile(s, 90),
            "samples": list(per_call_ms), "calls_per_sample": calls_per_sample}


def calls_per_sample(one_call_ms, min_sample_ms):
    """Calls a sample so that it lasts at least min_sample_ms, from one call's time."""
    if not (math.isfinite(one_call_ms) and one_call_ms > 0):
        return MAX_CALLS
    return max(1, min(MAX_CALLS, math.ceil(min_sample_ms / one_call_ms)))


class Bench:
    """The device and the timing settings every lesson shares."""

    def __init__(self, torch, index, samples, min_sample_ms):
        self.torch = torch
        self.index = index
        self.device = torch.device("cuda", index)
        self.samples = samples
        self.min_sample_ms = min_sample_ms

    def sync(self):
        self.torch.cuda.synchronize(self.device)

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def mark(self, stream):
        """A timing event recorded on `stream` now."""
        e = self.event()
        e.record(stream)
        return e

    def time_case(self, fn):
        """Warm-up, calibration of the calls a sample, then `samples` samples (see METHOD)."""
        start, n = time.perf_counter(), 0
        while n < WARMUP_CALLS or ((time.perf_counter() - start) * 1e3 < WARMUP_MS and n < WARMUP_MAX):
            fn()
            n += 1
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        k = calls_per_sample((time.perf_counter() - t0) * 1e3, self.min_sample_ms)
        per_call = []
        for _ in range(self.samples):
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            self.sync()
            per_call.append((time.perf_counter() - t0) * 1e3 / k)
        return summarize(per_call, k)

    def time_case_with_peak(self, fn):
        """time_case plus "peak_mib": the most memory allocated during it beyond what was before."""
        cuda = self.torch.cuda
        self.sync()
        cuda.empty_cache()
        before = cuda.memory_allocated(self.device)
        cuda.reset_peak_memory_stats(self.device)
        result = self.time_case(fn)
        result["peak_mib"] = (cuda.max_memory_allocated(self.device) - before) / MIB
        return result


@contextlib.contextmanager
def tf32_matmul(torch, allowed):
    """torch.backends.cuda.matmul.allow_tf32 = allowed inside, the previous setting after."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


# --- lesson 0: memory before and after the CUDA context ------------------------------------------

def gpu_memory_rows():
    """Every GPU's memory in use (MiB) by NVML, else nvidia-smi: (rows, query) or (None, None).
    Neither creates a CUDA context."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            rows = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                bus = pynvml.nvmlDeviceGetPciInfo(h).busId
                try:  # version 2 leaves out the driver's reservation, as nvidia-smi does
                    info = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
                except Exception:  # an older pynvml or driver
                    info = pynvml.nvmlDeviceGetMemoryInfo(h)
                rows.append({"index": i,
                             "uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                             "pci": bus.decode() if isinstance(bus, bytes) else str(bus),
                             "used_mib": info.used / MIB})
            return rows, "NVML (pynvml)"
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,memory.used",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        rows = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 4:
                rows.append({"index": int(parts[0]), "uuid": parts[1], "pci": parts[2],
                             "used_mib": float(parts[3])})
        if rows:
            return rows, "nvidia-smi"
    except Exception:
        pass
    return None, None


def parse_pci(text):
    """(domain, bus, device) of a PCI address such as 00000000:04:00.0, or None."""
    m = re.match(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)", text or "")
    return tuple(int(g, 16) for g in m.groups()) if m else None


def bare_uuid(text):
    text = str(text).strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def find_gpu_row(rows, torch, index):
    """The NVML / nvidia-smi row of torch's cuda:index (whose numbering may differ from theirs):
    (row, how it was matched) or (None, None)."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        for r in rows:
            if bare_uuid(r["uuid"]) == bare_uuid(uuid):
                return r, "uuid"
    pci = (getattr(props, "pci_domain_id", None), getattr(props, "pci_bus_id", None),
           getattr(props, "pci_device_id", None))
    if None not in pci:
        for r in rows:
            if parse_pci(r["pci"]) == pci:
                return r, "pci"
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible):
        entry = visible[index]
        for r in rows:
            if (entry.isdigit() and r["index"] == int(entry)) or (
                    not entry.isdigit() and bare_uuid(r["uuid"]).startswith(bare_uuid(entry))):
                return r, "CUDA_VISIBLE_DEVICES"
        return None, None
    for r in rows:
        if r["index"] == index:
            return r, "index"
    return None, None


def lesson_0(torch, index):
    """The notebook's lesson 0, run before anything else in this process touches CUDA, between
    two readings of the device's memory in use (the CUDA context is what they differ by)."""
    device = torch.device("cuda", index)
    rows_before, query = gpu_memory_rows()
    out = {}
    # the notebook's cell, as written (with the device named)
    torch.cuda.empty_cache()
    try:
        torch.cuda.reset_peak_memory_stats(device)
    except RuntimeError as exc:  # some versions refuse it before CUDA is initialised
        out["reset_peak_error"] = one_line(exc)
    baseline = torch.cuda.memory_allocated(device)
    minimal_tensor = torch.ones((1, 1), device=device)
    after = torch.cuda.memory_allocated(device)
    torch.cuda.synchronize(device)
    reserved = torch.cuda.memory_reserved(device)
    rows_after = gpu_memory_rows()[0] if rows_before is not None else None
    used_before = used_after = matched_by = None
    if rows_before is not None and rows_after is not None:
        row_before, matched_by = find_gpu_row(rows_before, torch, index)
        row_after, _ = find_gpu_row(rows_after, torch, index)
        if row_before is not None and row_after is not None:
            used_before, used_after = row_before["used_mib"], row_after["used_mib"]
    del minimal_tensor
    out.update({
        "device_used_before_mib": used_before,
        "allocated_before_mib": baseline / MIB,
        "allocated_after_mib": after / MIB,
        "allocated_after_bytes": after,
        "reserved_after_mib": reserved / MIB,
        "device_used_after_mib": used_after,
        "context_mib": used_after - used_before if used_before is not None and used_after is not None else None,
        "query": query if used_before is not None else None,
        "matched_by": matched_by,
    })
    return out


# --- lessons 1 to 8: the notebook's functions -----------------------------------------------------

def lesson_1(b):
    torch, device, size = b.torch, b.device, 1024

    def bad_tensor_creation():
        x = torch.randn(size, size)  # created on the CPU
        x = x.cuda(device)           # then copied to the GPU
        return x

    def good_tensor_creation():
        x = torch.randn(size, size, device=device)
        return x

    return {"cases": {"host-then-copy": b.time_case(bad_tensor_creation),
                      "on-device": b.time_case(good_tensor_creation)}}


def lesson_2(b):
    torch, device, size = b.torch, b.device, 2048
    dtypes = {"f64": torch.float64, "f32": torch.float32, "tf32": torch.float32,
              "f16": torch.float16, "bf16": torch.bfloat16}
    cases = {}
    for name in NOTEBOOK_DTYPES:
        dtype = dtypes[name]

        def matmul_notebook(dtype=dtype):  # the notebook's matmul_float64/32/16
            A = torch.randn(size, size, dtype=dtype, device=device)
            B = torch.randn(size, size, dtype=dtype, device=device)
            return torch.mm(A, B)

        with tf32_matmul(torch, name == "tf32"):
            A = torch.randn(size, size, dtype=dtype, device=device)
            B = torch.randn(size, size, dtype=dtype, device=device)
            cases[f"{name}-notebook"] = b.time_case(matmul_notebook)
            cases[f"{name}-matmul"] = b.time_case(lambda A=A, B=B: torch.mm(A, B))
            del A, B
    # the notebook's memory comparison: element_size() * numel() of a 1000 x 1000 tensor
    sizes = {}
    for name in NOTEBOOK_DTYPES:
        t = torch.randn(1000, 1000, dtype=dtypes[name], device=device)
        sizes[name] = t.element_size() * t.numel()
    return {"cases": cases, "bytes_1000x1000": sizes}


def lesson_3(b):
    torch, device = b.torch, b.device
    x = torch.randn(1000, 1000, device=device)

    def bad_cpu_gpu_pattern():
        x_cpu = x.cpu().numpy()                               # GPU -> CPU
        result_cpu = x_cpu.sum()                              # CPU operation
        result_gpu = torch.tensor(result_cpu, device=device)  # CPU -> GPU
        return result_gpu

    def good_gpu_pattern():
        result = x.sum()
        return result

    cases = {"round-trip": b.time_case(bad_cpu_gpu_pattern), "on-device": b.time_case(good_gpu_pattern)}
    bad, good = float(bad_cpu_gpu_pattern()), float(good_gpu_pattern())
    # relative 1e-3, of the sum or of its typical size (sqrt(n) for n standard normals), whichever
    # is larger, so that a sum that happens to lie near zero still compares
    scale = max(abs(good), math.sqrt(x.numel()))
    return {"cases": cases, "agree": abs(bad - good) <= 1e-3 * scale,
            "round_trip_value": bad, "on_device_value": good}


def lesson_4(b):
    torch, device = b.torch, b.device

    def bad_sequential_processing():
        samples = [torch.randn(256, 256, device=device) for _ in range(32)]
        results = []
        for sample in samples:
            result = torch.mm(sample, sample.T)
            results.append(result)
        return torch.stack(results)

    def good_batch_processing():
        batch = torch.randn(32, 256, 256, device=device)
        result = torch.bmm(batch, batch.transpose(-2, -1))
        return result

    with tf32_matmul(torch, False):
        samples = [torch.randn(256, 256, device=device) for _ in range(32)]
        batch = torch.stack(samples)
        cases = {
            "separate": b.time_case(bad_sequential_processing),
            "batched": b.time_case(good_batch_processing),
            "separate-matmul": b.time_case(lambda: torch.stack([torch.mm(s, s.T) for s in samples])),
            "batched-matmul": b.time_case(lambda: torch.bmm(batch, batch.transpose(-2, -1))),
        }
    return {"cases": cases}


def lesson_5(b):
    torch, device, size = b.torch, b.device, (2048, 2048)

    def bad_memory_allocation():
        x = torch.randn(*size, device=device)
        y = torch.randn(*size, device=device)
        z = x + y
        w = z * 2
        return w

    def good_inplace_operations():
        x = torch.randn(*size, device=device)
        y = torch.randn(*size, device=device)
        x.add_(y)
        x.mul_(2)
        return x

    return {"cases": {"allocating": b.time_case_with_peak(bad_memory_allocation),
                      "in-place": b.time_case_with_peak(good_inplace_operations)}}


def lesson_6(b):
    torch, device = b.torch, b.device
    cases = {}
    for size in TENSOR_CORE_SIZES:
        def matmul_test(size=size):
            A = torch.randn(size, size, dtype=torch.float16, device=device)
            B = torch.randn(size, size, dtype=torch.float16, device=device)
            return torch.mm(A, B)

        A = torch.randn(size, size, dtype=torch.float16, device=device)
        B = torch.randn(size, size, dtype=torch.float16, device=device)
        cases[f"{size}-notebook"] = b.time_case(matmul_test)
        cases[f"{size}-matmul"] = b.time_case(lambda A=A, B=B: torch.mm(A, B))
        del A, B
    return {"cases": cases}


def lesson_7(b):
    torch, device = b.torch, b.device
    x = torch.randn(4096, 4096, device=device)
    y = torch.randn(4096, 4096, device=device)

    def bad_memory_pattern():
        x_t = x.T
        return torch.sum(x_t, dim=0)

    def good_memory_pattern():
        x_t = x.T.contiguous()
        return torch.sum(x_t, dim=0)

    cases = {
        "transposed-sum": b.time_case(bad_memory_pattern),
        "contiguous-then-sum": b.time_case(good_memory_pattern),
        "transpose-copy": b.time_case(lambda: x.T.contiguous()),
        "add-contiguous": b.time_case(lambda: x + y),
        "add-transposed": b.time_case(lambda: x + x.T),
    }
    return {"cases": cases, "is_contiguous": {"x": x.is_contiguous(), "x.T": x.T.is_contiguous(),
                                              "x.T.contiguous()": x.T.contiguous().is_contiguous()}}


def profiler_top(torch, run, calls=10, rows=5):
    """torch.profiler over `calls` calls of run (the notebook's settings): the `rows` ops with the
    most device time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    averages = list(prof.key_averages())

    def device_us(avg):
        if hasattr(avg, "device_time_total"):
            return float(avg.device_time_total or 0.0)
        return float(getattr(avg, "cuda_time_total", 0.0) or 0.0)

    averages.sort(key=device_us, reverse=True)
    return [{"name": a.key, "calls": int(a.count), "device_total_us": device_us(a),
             "cpu_total_us": float(a.cpu_time_total)} for a in averages[:rows]]


def lesson_8(b):
    torch, device = b.torch, b.device

    def example_neural_network():  # the notebook's, as written
        x = torch.randn(1024, 512, device=device)
        W1 = torch.randn(512, 256, device=device)
        W2 = torch.randn(256, 10, device=device)
        h1 = torch.mm(x, W1)
        h1 = torch.relu(h1)
        output = torch.mm(h1, W2)
        loss = torch.sum(output ** 2)
        loss.backward()
        return loss

    def training_step():  # the same network with weights that take gradients
        x = torch.randn(1024, 512, device=device)
        W1 = torch.randn(512, 256, device=device, requires_grad=True)
        W2 = torch.randn(256, 10, device=device, requires_grad=True)
        h1 = torch.mm(x, W1)
        h1 = torch.relu(h1)
        output = torch.mm(h1, W2)
        loss = torch.sum(output ** 2)
        loss.backward()
        return loss

    out = {"cases": {}}
    try:
        example_neural_network()
        working, name = example_neural_network, "notebook"
    except Exception as exc:
        out["notebook_error"] = " ".join(str(exc).split()) or type(exc).__name__
        working, name = training_step, "step"
    out["cases"][name] = b.time_case(working)
    try:
        out["top"] = profiler_top(torch, working)
    except Exception as exc:
        out["profiler_error"] = one_line(exc)
    return out


# --- the guide's patterns: streams, synchronisation, CUDA graphs ----------------------------------

def overlap_time(spans):
    """Time covered by at least two of the (begin, end) spans."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    depth, last, total = 0, 0.0, 0.0
    for t, d in points:
        if depth >= 2:
            total += t - last
        depth += d
        last = t
    return total


def median_repeat(run, overlapped_key):
    """The median (by `overlapped_key`) of STREAM_REPEATS runs after STREAM_WARMUPS untimed ones."""
    for _ in range(STREAM_WARMUPS):
        run()
    results = sorted((run() for _ in range(STREAM_REPEATS)), key=lambda r: r[overlapped_key])
    return results[STREAM_REPEATS // 2]


def two_way(b, cur, streams, work):
    """work[0]() and work[1](): one after the other on `cur`, then each on its own stream after one
    start mark; one repeat's figures, all from CUDA events."""
    a = b.mark(cur)
    for w in work:
        w()
    z = b.mark(cur)
    z.synchronize()
    serial = a.elapsed_time(z)
    start = b.mark(cur)
    spans = []
    for s, w in zip(streams, work):
        s.wait_event(start)
        with b.torch.cuda.stream(s):
            begin = b.mark(s)
            w()
            end = b.mark(s)
        spans.append((begin, end))
    for _, end in spans:
        cur.wait_event(end)
    b.sync()
    intervals = [[start.elapsed_time(bg), start.elapsed_time(en)] for bg, en in spans]
    return {"serial_ms": serial, "concurrent_ms": max(e for _, e in intervals), "intervals_ms": intervals,
            "overlap_ms": max(0.0, min(e for _, e in intervals) - max(s for s, _ in intervals))}


def chain(torch, a, w, times):
    """A function doing `times` successive products a = torch.mm(a, w)."""
    def run():
        x = a
        for _ in range(times):
            x = torch.mm(x, w)
        return x
    return run


def lesson_streams(b):
    torch, device = b.torch, b.device
    cur = torch.cuda.current_stream(device)
    s1, s2, s3 = (torch.cuda.Stream(device) for _ in range(3))
    out = {"cases": {}}
    with tf32_matmul(torch, False):
        # 1. two independent chains of 16 products of 512 x 512
        n = 512
        a1, a2 = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        w1, w2 = torch.randn(n, n, device=device) * 0.04, torch.randn(n, n, device=device) * 0.04
        work = (chain(torch, a1, w1, 16), chain(torch, a2, w2, 16))
        b.sync()
        out["two-streams"] = median_repeat(lambda: two_way(b, cur, (s1, s2), work), "concurrent_ms")
        del a1, a2, w1, w2, work

        # 2. a 64 MiB copy from pinned memory (copy stream) beside 8 products of 4096 x 4096
        host = torch.randn(16 << 20).pin_memory()
        dst = torch.empty(16 << 20, device=device)
        big = 4096
        ka = torch.randn(big, big, device=device)
        kw = torch.randn(big, big, device=device) * 0.01
        work = (lambda: dst.copy_(host, non_blocking=True), chain(torch, ka, kw, 8))
        b.sync()
        out["copy-compute"] = median_repeat(lambda: two_way(b, cur, (s1, s2), work), "concurrent_ms")
        del host, dst, ka, kw, work

    # 3. pipeline: 8 chunks of 8 MiB, each copied in, computed on (10 x mul_, add_), copied out
    out["pipeline"] = pipeline(b, cur, (s1, s2, s3))
    return out


def pipeline(b, cur, streams, chunks=8, chunk_bytes=8 << 20, passes=10):
    torch, device = b.torch, b.device
    elems = chunk_bytes // 4
    src = torch.rand(chunks, elems).pin_memory()
    dst = torch.zeros(chunks, elems).pin_memory()
    work = [torch.empty(elems, device=device) for _ in range(chunks)]

    def run_chunk(i, stream, marks=None):
        c = work[i]
        if marks is not None:
            marks.append(b.mark(stream))
        c.copy_(src[i], non_blocking=True)
        if marks is not None:
            marks.append(b.mark(stream))
        for _ in range(passes):
            c.mul_(1.0001).add_(0.5)
        if marks is not None:
            marks.append(b.mark(stream))
        dst[i].copy_(c, non_blocking=True)
        if marks is not None:
            marks.append(b.mark(stream))

    agree = [True]

    def repeat():
        # serial: every chunk on the current stream, stage by stage
        a = b.mark(cur)
        marks = []
        for i in range(chunks):
            m = []
            run_chunk(i, cur, m)
            marks.append(m)
        z = b.mark(cur)
        z.synchronize()
        serial = a.elapsed_time(z)
        stage = {"h2d": 0.0, "compute": 0.0, "d2h": 0.0}
        for m in marks:
            stage["h2d"] += m[0].elapsed_time(m[1])
            stage["compute"] += m[1].elapsed_time(m[2])
            stage["d2h"] += m[2].elapsed_time(m[3])
        serial_out = dst.clone()
        dst.zero_()  # so that a chunk the pipelined run fails to write shows
        # pipelined: chunk i on stream i % 3, each stream's chunks in order
        start = b.mark(cur)
        for s in streams:
            s.wait_event(start)
        spans = []
        for i in range(chunks):
            s = streams[i % len(streams)]
            with torch.cuda.stream(s):
                begin = b.mark(s)
                run_chunk(i, s)
                spans.append((begin, b.mark(s)))
        for s in streams:
            cur.wait_stream(s)
        b.sync()
        intervals = [[start.elapsed_time(bg), start.elapsed_time(en)] for bg, en in spans]
        agree[0] = agree[0] and bool(torch.equal(serial_out, dst))
        return {"serial_ms": serial, "pipelined_ms": max(e for _, e in intervals), "intervals_ms": intervals,
                "overlap_ms": overlap_time(intervals), "stage_ms": stage}

    b.sync()
    result = median_repeat(repeat, "pipelined_ms")
    result["agree"] = agree[0]
    return result


def lesson_sync(b):
    torch, device = b.torch, b.device
    per_case = {"unsynchronized": [], "synchronized": [], "events": []}
    with tf32_matmul(torch, False):
        a = torch.randn(4096, 4096, device=device)
        for _ in range(3):
            c = a @ a
        b.sync()
        for _ in range(b.samples):
            t0 = time.perf_counter()
            c = a @ a
            t1 = time.perf_counter()  # no synchronize: the launch, the wrong number
            per_case["unsynchronized"].append((t1 - t0) * 1e3)
            b.sync()

            t0 = time.perf_counter()
            c = a @ a
            torch.cuda.synchronize(device)
            t1 = time.perf_counter()
            per_case["synchronized"].append((t1 - t0) * 1e3)
            b.sync()

            start, end = b.event(), b.event()
            start.record()
            c = a @ a
            end.record()
            end.synchronize()
            per_case["events"].append(start.elapsed_time(end))
            b.sync()
        del c
    return {"cases": {name: summarize(ms, 1) for name, ms in per_case.items()}}


def lesson_graphs(b):
    torch, device = b.torch, b.device
    x = torch.zeros(1024, device=device)

    def step():
        for _ in range(GRAPH_OPS):
            x.add_(1.0)

    cases = {"eager": b.time_case(step)}
    # warm up on a side stream before capturing, as PyTorch's CUDA-graph docs ask
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    cases["graph"] = b.time_case(graph.replay)
    # from zero, each replay adds GRAPH_OPS to every element
    x.zero_()
    for _ in range(GRAPH_CHECK_REPLAYS):
        graph.replay()
    b.sync()
    expected = float(GRAPH_CHECK_REPLAYS * GRAPH_OPS)
    agree = bool(torch.all(x == expected).item())
    return {"cases": cases, "agree": agree, "replays": GRAPH_CHECK_REPLAYS, "expected_value": expected}


LESSON_RUNNERS = {"1": lesson_1, "2": lesson_2, "3": lesson_3, "4": lesson_4, "5": lesson_5, "6": lesson_6,
                  "7": lesson_7, "8": lesson_8, "streams": lesson_streams, "sync": lesson_sync,
                  "graphs": lesson_graphs}


# --- driver ---------------------------------------------------------------------------------------

def describe(lesson_id, result):
    """A short progress line: each case's median."""
    if "error" in result:
        return f"lesson {lesson_id}: failed: {result['error']}"
    if lesson_id == "0":
        return (f"lesson 0: memory_allocated {result['allocated_after_bytes']} bytes after torch.ones((1, 1)); "
                f"the context took {result['context_mib']} MiB (by {result['query']})")
    parts = [f"{name} {case['median_ms']:.4g} ms" for name, case in result.get("cases", {}).items()]
    for name, r in result.items():  # the streams lesson's serial / overlapped pairs
        if isinstance(r, dict) and "serial_ms" in r:
            overlapped = r.get("concurrent_ms", r.get("pipelined_ms"))
            parts.append(f"{name} {r['serial_ms']:.4g} ms serial, {overlapped:.4g} ms overlapped")
    return f"lesson {lesson_id}: " + (", ".join(parts) if parts else "done")


def release(torch, device):
    gc.collect()
    try:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    except Exception as exc:  # a sticky CUDA error: later lessons will report it themselves
        log(f"cleaning up failed: {one_line(exc)}")


def run(torch, wanted, index, args):
    lessons = {}
    if "0" in wanted:  # first: the device's memory is read before this process has a CUDA context
        log("lesson 0")
        try:
            lessons["0"] = lesson_0(torch, index)
        except Exception as exc:
            lessons["0"] = {"error": one_line(exc)}
        log(describe("0", lessons["0"]))
    if not torch.cuda.is_available():
        return {"ok": False, "error": f"PyTorch {torch.__version__} sees no CUDA device "
                                      f"(torch.version.cuda={torch.version.cuda})"}, EXIT_RUNTIME
    count = torch.cuda.device_count()
    if index >= count:
        return {"ok": False, "error": f"bad device cuda:{index}: PyTorch sees {count} CUDA device(s)"}, EXIT_USAGE
    torch.cuda.set_device(index)
    b = Bench(torch, index, args.samples, args.min_sample_ms)
    device_name = torch.cuda.get_device_name(index)
    log(f"{device_name}, PyTorch {torch.__version__} (CUDA {torch.version.cuda}); "
        f"{args.samples} samples of at least {args.min_sample_ms} ms a case")
    for lesson_id in wanted:
        if lesson_id == "0":
            continue
        log(f"lesson {lesson_id}")
        torch.manual_seed(0)
        t0 = time.perf_counter()
        try:
            lessons[lesson_id] = LESSON_RUNNERS[lesson_id](b)
        except Exception as exc:
            lessons[lesson_id] = {"error": one_line(exc)}
        release(torch, b.device)
        log(f"{describe(lesson_id, lessons[lesson_id])} ({time.perf_counter() - t0:.1f} s)")
    return {"ok": True, "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "device": f"cuda:{index}", "device_name": device_name,
            "samples": args.samples, "min_sample_ms": args.min_sample_ms, "method": METHOD,
            "lessons": lessons}, 0


def main(argv=None):
    """Run the lessons; return (JSON document, exit code)."""
    try:
        args = build_parser().parse_args(argv)
        wanted = parse_lessons(args.lessons)
        index = parse_device(args.device)
    except UsageError as exc:
        return {"ok": False, "error": f"bad arguments: {exc}"}, EXIT_USAGE
    try:
        import torch
    except ImportError as exc:
        return {"ok": False,
                "error": f"PyTorch is not installed ({exc}); install it with 'pip install torch'"}, EXIT_RUNTIME
    except Exception as exc:  # a broken install, e.g. a missing shared library
        return {"ok": False, "error": f"importing torch failed ({one_line(exc)})"}, EXIT_RUNTIME
    try:
        return run(torch, wanted, index, args)
    except KeyboardInterrupt:
        return {"ok": False, "error": "interrupted"}, EXIT_RUNTIME
    except Exception as exc:
        return {"ok": False, "error": f"the lessons failed: {one_line(exc)}"}, EXIT_RUNTIME


if __name__ == "__main__":
    # Anything printed while the lessons run (by Python or by native libraries, the profiler's
    # included) goes to stderr, so that stdout carries nothing but the final JSON document.
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        document, code = main()
    except SystemExit as exc:  # only --help gets here
        document, code = None, exc.code
    finally:
        sys.stdout.flush()
        sys.stdout = real_stdout
        os.dup2(json_fd, 1)
        os.close(json_fd)
    if document is not None:
        print(json.dumps(json_safe(document)), flush=True)
    sys.exit(code)
