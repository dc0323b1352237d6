#!/usr/bin/env bash
# session 30 call 1: three branches merged (zero-master, pipeline-launch, issue31-next) on two GPUs
set -u
export PATH=/opt/torch/.venv/bin:$PATH NCCL_NVLS_ENABLE=0 GPUKIT_REQUIRE_GPU=1
S=$OUT/summary.txt; W=$OUT/w; mkdir -p $W
say() { echo "$*" | tee -a $S; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ';')"
t=$(date +%s)
timeout 300 env -u LD_LIBRARY_PATH .device/tests/gpu_train --test-threads 1 --nocapture > $W/gpu_train.log 2>&1
say "gpu_train rc=$? $(( $(date +%s) - t ))s: $(grep -E '^test result' $W/gpu_train.log)"; grep -E 'FAILED|panicked|differ' $W/gpu_train.log | head -8 | tee -a $S
grep -E "every rank made|stages" $W/gpu_train.log | head -14 | cut -c1-220 | tee -a $S
M="--layers 4096,4096,4096,1 --features 4096 --samples 65536 --epochs 4 --lr 1e-5 --precision bf16 --batch-size 4096 --device cuda:0 --gpus 2"
for b in new base base new; do
  B=.device/gpukit; [ $b = base ] && B=.device/base/gpukit
  timeout 150 env -u LD_LIBRARY_PATH $B train $M --save-json $W/dp-$b.json --save $W/dp-$b.safetensors > $W/dp-$b.txt 2> $W/dp-$b.err
  say "mlp --gpus 2 $b rc=$?: $(grep -E 'Step time|Scaling efficiency|weights|optimizer state|memory pool peak' $W/dp-$b.txt | cut -c1-180 | tr '\n' ' ')"
done
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
P="--pipeline 2 --layers 1024,4096,4096,4096,4096,4096,4096,4096,4096,16 --features 1024 --loss cross-entropy --samples 81920 --batch-size 4096 --optimizer sgd --lr 0.01 --momentum 0.9 --precision fp32 --steps 20"
t=$(date +%s)
timeout 200 env -u LD_LIBRARY_PATH .device/gpukit train $P --save-json $W/pp-threads.json > $W/pp-threads.txt 2> $W/pp-threads.err
say "pipeline fp32 threads rc=$? $(( $(date +%s) - t ))s"
t=$(date +%s)
timeout 300 env -u LD_LIBRARY_PATH .device/gpukit launch --nproc-per-node 2 -- .device/gpukit train $P --save-json $W/pp-launch.json > $W/pp-launch.txt 2> $W/pp-launch.err
say "pipeline fp32 under gpukit launch rc=$? $(( $(date +%s) - t ))s"; tail -3 $W/pp-launch.err | cut -c1-200 | tee -a $S
grep -iE "bubble|losses|one GPU|Samples" $W/pp-launch.txt | head -8 | cut -c1-200 | tee -a $S
python3 - "$W" <<'PY' 2>&1 | tee -a "$S"
import json, sys, os
w = sys.argv[1]
try:
    a = json.load(open(os.path.join(w, "pp-threads.json")))["result"]["step_losses"]
    b = json.load(open(os.path.join(w, "pp-launch.json")))["result"]["step_losses"]
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    print("pipeline threads vs launch: %d / %d updates, losses within %.1e: %s" % (len(a), len(b), worst, "ok" if len(a) == len(b) and worst <= 1e-5 else "FAILED"))
except Exception as e:
    print("pipeline threads vs launch: no comparison (%s)" % e)
PY
# a stage killed mid-run under the launcher
t=$(date +%s)
timeout 120 env -u LD_LIBRARY_PATH .device/gpukit launch --nproc-per-node 2 --timeout 20 -- .device/gpukit train ${P/--steps 20/--steps 5000} > $W/pp-kill.txt 2>&1 &
LP=$!
sleep 20
victim=$(pgrep -f "train --pipeline 2" | while read p; do grep -qz '^RANK=1$' /proc/$p/environ 2>/dev/null && echo $p; done | head -1)
say "killing stage 1 (pid ${victim:-none})"; [ -n "$victim" ] && kill -9 "$victim"
wait $LP; say "stage killed: launch rc=$? after $(( $(date +%s) - t ))s: $(grep -iE 'error|rank' $W/pp-kill.txt | tail -3 | cut -c1-200 | tr '\n' ' ')"
pgrep -fa "gpukit" | head -3 | tee -a $S
cd $OUT && tar czf w.tar.gz w && rm -rf w
