#!/usr/bin/env python3
"""Row-by-row ratio of this run's `gpukit all` figures to run 58's (matmul TFLOP/s, bandwidth
GB/s, infer images/s). Run from this folder: python3 compare_with_run58.py [-v].
bench conv is left out: it was rewritten between the two runs (other rows, other names)."""
import gzip, json, statistics, sys
old = json.load(open("../2026-11-22-run58-h100-final-all/out/all/report.json"))
new = json.load(gzip.open("out/report.json.gz"))["result"]
specs = {
    "matmul": (lambda r: (r["device"], r["dtype"], r["size"]), lambda r: r.get("tflops")),
    "bandwidth": (lambda r: (r["kind"], r["bytes"]), lambda r: r.get("gbs")),
    "infer": (lambda r: (r["strategy"], r["device"], r["batch"]), lambda r: r.get("images_per_s")),
}
for k, (key, value) in specs.items():
    a = {json.dumps(key(r)): value(r) for r in old[k]["rows"] if value(r)}
    b = {json.dumps(key(r)): value(r) for r in new[k]["rows"] if value(r)}
    ratios = sorted((b[x] / a[x], x) for x in a if x in b)
    rs = [r for r, _ in ratios]
    within = sum(1 for r in rs if 0.95 <= r <= 1.05)
    print(f"{k}: {len(rs)} rows in both; now/run58 median {statistics.median(rs):.3f}, "
          f"{within} within 5%, min {rs[0]:.3f} {ratios[0][1]}, max {rs[-1]:.3f} {ratios[-1][1]}")
    if "-v" in sys.argv:
        for r, x in ratios:
            print(f"   {r:.3f} {x} {a[x]:.4g} -> {b[x]:.4g}")
