#!/usr/bin/env bash
# session 29 call 3: the sharded optimizer keeps 1/N of the moments
set -u
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0 GPUKIT_REQUIRE_GPU=1
S=$OUT/summary.txt; W=$OUT/w; mkdir -p $W
say() { echo "$*" | tee -a $S; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ';')"
timeout 300 env -u LD_LIBRARY_PATH .device/tests/gpu_train --test-threads 1 --nocapture > $W/gpu_train.log 2>&1
say "gpu_train rc=$?: $(grep -E '^test result' $W/gpu_train.log)"; grep -E 'FAILED|panicked|differ' $W/gpu_train.log | head -8 | tee -a $S
grep -E "every rank made" $W/gpu_train.log | head -12 | tee -a $S
M="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096 --device cuda:0 --gpus 2"
for b in new base base new; do
  B=.device/gpukit; [ $b = base ] && B=.device/base/gpukit
  timeout 150 env -u LD_LIBRARY_PATH $B train $M --save-json $W/dp-$b.json --save $W/dp-$b.safetensors > $W/dp-$b.txt 2> $W/dp-$b.err
  say "mlp --gpus 2 $b rc=$?: $(grep -E 'Step time|Scaling efficiency|optimizer state|memory pool peak' $W/dp-$b.txt | cut -c1-180 | tr '\n' ' ')"
done
ls -la $W/*.safetensors | tee -a $S
python3 - $W/dp-new.safetensors $W/dp-base.safetensors <<'PY' 2>&1 | tee -a $S
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); base = 8 + n
    return {k: b[base + v["data_offsets"][0]: base + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}, h.get("__metadata__")
a, ma = load(sys.argv[1]); b, mb = load(sys.argv[2])
same = [k for k in a if a.get(k) == b.get(k)]
print("checkpoint tensors: %d new, %d base, %d identical bytes; differing: %s" % (len(a), len(b), len(same), sorted(set(a) ^ set(same))[:8]))
print("metadata equal:", ma == mb)
PY
cd $OUT && tar czf w.tar.gz w && rm -rf w
