"""Run 47: A/A tests of bench matmul's turn-taking, with PyTorch on both sides.

mode local: side A is torch in this process, side B a `pytorch_reference.py serve` process,
            as gpukit (in-process) against PyTorch (served) in `bench matmul --compare-pytorch`.
mode remote: both sides are serve processes.
mode inproc: both sides are torch in this process, each with its own operands (allocated A
            first, or B first with the argument b-first).
Same schedule as gpukit: B's untimed opening turn, then 5 ABBA rounds, turns of at least
100 ms (10 repetitions or more). Prints the median of the per-round time ratios A/B and the
rounds; with identical sides, anything far from 1.00 is the method's own offset."""
import json, math, statistics, subprocess, sys, time
import torch

SCRIPT = "scripts/pytorch_reference.py"
DT = {"f64": torch.float64, "bf16": torch.bfloat16, "tf32": torch.float32, "f16": torch.float16}

class Remote:
    def __init__(self):
        self.p = subprocess.Popen([sys.executable, SCRIPT, "serve", "--device", "cuda"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self.p.stdout.readline())["ready"]
    def block(self, dtype, n, warmup, reps):
        req = {"op": "matmul", "device": "cuda:0", "dtype": dtype, "size": n, "init": "normal",
               "warmup": warmup, "iterations": reps, "budget_s": 1e9}
        self.p.stdin.write(json.dumps(req) + "\n"); self.p.stdin.flush()
        r = json.loads(self.p.stdout.readline())
        assert r["ok"], r
        return r["times_ms"]
    def close(self):
        self.p.stdin.close(); self.p.wait()

class Local:
    def __init__(self):
        self.key = None
    def block(self, dtype, n, warmup, reps):
        if self.key != (dtype, n):
            self.ops = None; torch.cuda.empty_cache()
            dt = DT[dtype]
            self.ops = (torch.randn(n, n, device="cuda", dtype=dt), torch.randn(n, n, device="cuda", dtype=dt),
                        torch.empty(n, n, device="cuda", dtype=dt))
            self.key = (dtype, n)
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        a, b, c = self.ops
        for _ in range(warmup):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for s, e in ev:
            s.record(); torch.matmul(a, b, out=c); e.record()
        torch.cuda.synchronize()
        torch.backends.cuda.matmul.allow_tf32 = False
        return [s.elapsed_time(e) for s, e in ev]
    def close(self):
        pass

def turns(a, b, dtype, n, rounds=5, b_first=False, b_opens=False):
    # per-repetition time from a short probe, then turns of at least 100 ms; b_first: B's
    # operands are allocated before A's
    if b_first:
        b.block(dtype, n, 0, 1)
    t = statistics.median(a.block(dtype, n, 2, 5))
    reps = max(10, min(2000, math.ceil(100.0 / t)))
    b.block(dtype, n, 5, reps)  # B's untimed opening turn
    if SOAK_S > 0:  # untimed turns of both until SOAK_S has passed (run 53)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < SOAK_S:
            a.block(dtype, n, 5, reps)
            b.block(dtype, n, 5, reps)
    ratios = []
    for r in range(rounds):
        order = [a, b] if (r % 2 == 0) != b_opens else [b, a]
        got = {}
        for side in order:
            got[id(side)] = statistics.median(side.block(dtype, n, 5 if r == 0 else 2, reps))
        ratios.append(got[id(a)] / got[id(b)])
    return reps, ratios

mode = sys.argv[1]
b_first = len(sys.argv) > 2 and sys.argv[2] == "b-first"
# run 53: "soak" as the second argument adds 1.5 s of untimed turns; the served side rotates
# over the operand sets pytorch_reference.py now keeps (at least 4 on a GPU)
SOAK_S = 1.5 if len(sys.argv) > 2 and sys.argv[2] == "soak" else 0.0
# run 54: "ba" as the third argument lets B open the timed rounds (BAAB...); a fourth gives the
# number of rounds (default 5); only f64 and bf16 at 8192 then
B_OPENS = len(sys.argv) > 3 and sys.argv[3] == "ba"
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 5
shapes = (("f64", 4096), ("f64", 8192), ("tf32", 8192), ("bf16", 8192))
if len(sys.argv) > 3:
    shapes = (("f64", 8192), ("bf16", 8192))
if mode.startswith("inproc"):
    shapes = shapes[1:]
for attempt in ((1, 2, 3) if SOAK_S else (1, 2)):
    a = Local() if mode in ("local", "inproc") else Remote()
    b = Local() if mode == "inproc" else Remote()
    for dtype, n in shapes:
        reps, ratios = turns(a, b, dtype, n, rounds=ROUNDS, b_first=b_first, b_opens=B_OPENS)
        print(f"{mode}{' b-first' if b_first else ''}{' soak' if SOAK_S else ''}{' B opens' if B_OPENS else ''} {ROUNDS} rounds, {attempt} {dtype} {n} reps {reps}: A/B time median {statistics.median(ratios):.3f} rounds "
              + " ".join(f"{x:.3f}" for x in ratios), flush=True)
    a.close(); b.close()
