"""Run 44: does a pinned 1 GiB copy go faster split over 2 or 4 streams (more copy engines)?"""
import torch

N = 1 << 30
host = torch.empty(N, dtype=torch.uint8).pin_memory()
host.random_(0, 256)
dev = torch.empty(N, dtype=torch.uint8, device="cuda")
back = torch.empty(N, dtype=torch.uint8).pin_memory()

def timed(fn, reps=8):
    fn(); torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    out.sort()
    return out[len(out) // 2]

def split(dst, src, k):
    streams = [torch.cuda.Stream() for _ in range(k)]
    cur = torch.cuda.current_stream()
    def go():
        piece = N // k
        for i, st in enumerate(streams):
            st.wait_stream(cur)
            with torch.cuda.stream(st):
                dst[i * piece:(i + 1) * piece].copy_(src[i * piece:(i + 1) * piece], non_blocking=True)
        for st in streams:
            cur.wait_stream(st)
    return go

for rnd in range(2):
    for k in (1, 2, 4):
        ms = timed(split(dev, host, k))
        print(f"round {rnd} h2d pinned 1 GiB in {k} piece(s): {N / ms / 1e6:.1f} GB/s")
        ms = timed(split(back, dev, k))
        print(f"round {rnd} d2h pinned 1 GiB in {k} piece(s): {N / ms / 1e6:.1f} GB/s")
assert torch.equal(back, host)
print("copies verified")
