#!/usr/bin/env bash
# session 30 call 6 (one GPU): bench conv beside PyTorch with an empty choice cache, the GPU rows
set -u
gunzip -f .device/gpukit.gz; chmod +x .device/gpukit
export PATH=/opt/torch/.venv/bin:$PATH
S=$OUT/summary.txt
say() { echo "$*" | tee -a $S; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
t0=$(date +%s%N)
env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$(mktemp -d) timeout 270 .device/gpukit bench conv --device cuda:0 --compare-pytorch --save-json $OUT/conv-cold.json > $OUT/conv-cold.txt 2> $OUT/conv-cold.err
say "bench conv --device cuda:0 --compare-pytorch (empty cache) rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
python3 - $OUT/conv-cold.json <<'PY' 2>&1 | tee -a $S
import json, sys, statistics
d = json.load(open(sys.argv[1])); rows = d.get("result", d)["rows"]
gpu = [r for r in rows if r.get("device") != "Cpu"]
rat = [r["pytorch"]["ratio"] for r in gpu if r.get("pytorch")]
bad = [r for r in gpu if r.get("status") != {"status": "ok"}]
print("not ok:", len(bad), [(r["name"], r["layout"], r["dtype"], r["status"]) for r in bad][:5])
print("GPU rows %d, with PyTorch %d, min %.3f median %.3f, below 0.95: %d" % (len(gpu), len(rat), min(rat), statistics.median(rat), sum(x < 0.95 for x in rat)))
PY
gzip -f $OUT/conv-cold.json
