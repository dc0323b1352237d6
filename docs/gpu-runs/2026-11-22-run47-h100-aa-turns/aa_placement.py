"""Run 49: is the A/A offset of run 48 in the numbers or in where the operands sit?

Both sides are torch in this process, in turns as bench matmul takes them (B's untimed opening
turn, 5 ABBA rounds, turns of at least 100 ms).
  copy: B multiplies exact copies of A's operands (same values, other memory).
  redraw: B multiplies fresh random operands (other values, other memory), as in run 48.
  rot4: each side rotates over 4 operand sets of its own, drawn and allocated separately."""
import math, statistics, sys
import torch

DT = {"f64": torch.float64, "bf16": torch.bfloat16}

def draw(n, dt, k):
    return [(torch.randn(n, n, device="cuda", dtype=dt), torch.randn(n, n, device="cuda", dtype=dt),
             torch.empty(n, n, device="cuda", dtype=dt)) for _ in range(k)]

def block(sets, warmup, reps):
    for i in range(warmup):
        a, b, c = sets[i % len(sets)]; torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (s, e) in enumerate(ev):
        a, b, c = sets[i % len(sets)]
        s.record(); torch.matmul(a, b, out=c); e.record()
    torch.cuda.synchronize()
    return statistics.median(x.elapsed_time(y) for x, y in ev)

def turns(A, B, rounds=5):
    t = block(A, 2, 5)
    reps = max(10, min(2000, math.ceil(100.0 / t)))
    reps = math.ceil(reps / len(A)) * len(A)
    block(B, 5, reps)
    out = []
    for r in range(rounds):
        got = {}
        for name, s in ((("A", A), ("B", B)) if r % 2 == 0 else (("B", B), ("A", A))):
            got[name] = block(s, 5 if r == 0 else 2, reps)
        out.append(got["A"] / got["B"])
    return reps, out

for mode in sys.argv[1:]:
    for dtype, n in (("f64", 8192), ("bf16", 8192)):
        for attempt in (1, 2, 3):
            dt = DT[dtype]
            k = 4 if mode == "rot4" else 1
            A = draw(n, dt, k)
            if mode == "copy":
                B = [(a.clone(), b.clone(), torch.empty_like(c)) for a, b, c in A]
            else:
                B = draw(n, dt, k)
            reps, r = turns(A, B)
            print(f"{mode} {dtype} {n} attempt {attempt} reps {reps}: A/B {statistics.median(r):.3f} rounds "
                  + " ".join(f"{x:.3f}" for x in r), flush=True)
            del A, B
            torch.cuda.empty_cache()
