"""Summarises a `gpukit bench conv --compare-pytorch --save-json` report: the GPU rows, how many
have PyTorch's figure beside them, the lowest and median ratio, and the rows under 0.95x.

    python3 scripts/conv_parity.py REPORT.json
"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
rows = d.get("result", d)["rows"]
gpu = [r for r in rows if r.get("device") != "Cpu"]
bad = [r for r in gpu if r.get("status") != {"status": "ok"}]
print("not ok:", len(bad), [(r["name"], r["layout"], r["dtype"], r["status"]) for r in bad][:5])
rated = [r for r in gpu if r.get("pytorch")]
rat = [r["pytorch"]["ratio"] for r in rated]
if not rat:
    sys.exit("no GPU row has PyTorch's figure")
print("GPU rows %d, with PyTorch %d, min %.3f median %.3f, below 0.95: %d" % (
    len(gpu), len(rat), min(rat), statistics.median(rat), sum(x < 0.95 for x in rat)))
for r in sorted(rated, key=lambda r: r["pytorch"]["ratio"])[:3]:
    print("  lowest: %s %s %s %.3f" % (r["name"], r["layout"], r["dtype"], r["pytorch"]["ratio"]))
