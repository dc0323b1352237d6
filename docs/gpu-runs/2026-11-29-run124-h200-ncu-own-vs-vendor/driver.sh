#!/usr/bin/env bash
# Run 124 (session 43), from the repository root on the lent H200: `bash .device/drivers.sh S1`.
# Binaries under .device/ (gzipped, carried): .device/gpukit (main) and .device/gpukit-diag
# (a diagnostic build, not landed: GPUKIT_OWN_CONV=always takes gpukit's whole-piece kernel of
# 16 warps in its last such cut at every convolution).
set -u
CALL=${1:?call}
for f in $(find .device -name '*.gz'); do gunzip -f "$f"; done
chmod -R +x .device
S=$OUT/0-summary.txt; mkdir -p "$OUT/t"
say() { echo "$*" | tee -a "$S"; }
say "== $CALL $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tr '\n' ' ')"
export PATH=/opt/torch/.venv/bin:$PATH
W=$(mktemp -d)
ORT=$(python3 -c 'import onnxruntime, os, glob; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))[0])' 2>/dev/null)
NCU=/usr/local/cuda/bin/ncu
case $CALL in
  # S1: ncu on ResNet-50 b1's eager pass, kernel by kernel: cuDNN / cuBLASLt as the engine
  #     planned them (plans cached by a first run, so no timing launches), then gpukit's
  #     whole-piece kernel at every convolution (the diagnostic build); durations, stall
  #     reasons and, for gpukit's kernel, the SASS with its stall samples
  S1) (cd scripts && python3 export_torchvision.py "$W" resnet50) > $OUT/t/export.log 2>&1
     run() { # label bin env...
       local l=$1 b=$2; shift 2
       env -u LD_LIBRARY_PATH "$@" XDG_CACHE_HOME=$W/cache-$l GPUKIT_ORT_LIB=$ORT timeout 200 $b infer --onnx $W/resnet50.onnx \
         --device cuda:0 --batch-sizes 1 --strategies fp16-nhwc-graph --gpu-iterations 50 --save-json $OUT/t/$l.json > $OUT/t/$l.txt 2>&1
       say "$l rc=$? $(python3 scripts/onnx_rows.py $OUT/t/$l.json | grep -v ' cpu ' | head -1)"
     }
     run vendor .device/gpukit GPUKIT_OWN_CONV=timed-products GPUKIT_BRANCHES=off
     run own .device/gpukit-diag GPUKIT_OWN_CONV=always GPUKIT_BRANCHES=off
     prof() { # label bin regex count env...
       local l=$1 b=$2 re=$3 n=$4 set=$5; shift 5
       # shellcheck disable=SC2086
       env -u LD_LIBRARY_PATH "$@" XDG_CACHE_HOME=$W/cache-$l GPUKIT_ORT_LIB=$ORT timeout 220 $NCU --kernel-name "regex:$re" --launch-count $n \
         $set --import-source no -o $OUT/t/ncu-$l $b infer --onnx $W/resnet50.onnx --device cuda:0 --batch-sizes 1 \
         --strategies fp16-nhwc-graph --gpu-iterations 2 > $OUT/t/ncu-$l.log 2>&1
       say "ncu $l rc=$? $(grep -c '==PROF==' $OUT/t/ncu-$l.log) prof lines"; tail -2 $OUT/t/ncu-$l.log | tee -a "$S"
       $NCU -i $OUT/t/ncu-$l.ncu-rep --page raw --csv --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__cycles_active.avg,smsp__average_warp_latency_per_inst_issued.ratio,smsp__issue_active.avg.per_cycle_active > $OUT/t/ncu-$l-raw.csv 2>&1
       $NCU -i $OUT/t/ncu-$l.ncu-rep --page details --csv > $OUT/t/ncu-$l-details.csv 2>&1
     }
     prof vendor .device/gpukit '.' 400 "--section SpeedOfLight --section LaunchStats --section WarpStateStats --section Occupancy" GPUKIT_OWN_CONV=timed-products GPUKIT_BRANCHES=off
     prof own .device/gpukit-diag 'conv_whole' 53 "--set full" GPUKIT_OWN_CONV=always GPUKIT_BRANCHES=off
     $NCU -i $OUT/t/ncu-own.ncu-rep --page source --csv --print-source sass > $OUT/t/ncu-own-sass.csv 2>&1
     say "sass rc=$? $(wc -l < $OUT/t/ncu-own-sass.csv) lines"
     for l in vendor own; do
       python3 - $OUT/t/ncu-$l-raw.csv <<'PY' | tee -a "$S"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = rows[0]; data = rows[2:]
ix = {k: h.index(k) for k in h}
for r in data:
    try:
        print(f"{r[ix['Kernel Name']][:60]:60} grid {r[ix['launch__grid_size']]:>5} block {r[ix['launch__block_size']]:>4} regs {r[ix['launch__registers_per_thread']]:>3} dur {float(r[ix['gpu__time_duration.sum']])/1e3:6.2f} us active {r[ix['sm__cycles_active.avg']]:>8} cpi {r[ix['smsp__average_warp_latency_per_inst_issued.ratio']]:>6}")
    except Exception as e:
        print("row?", e, r[:6])
PY
     done
     ls -la $OUT/t/*.ncu-rep | tee -a "$S"; rm -f $OUT/t/*.ncu-rep; gzip -f $OUT/t/*.csv
     (cd $OUT && tar czf t.tar.gz t && rm -rf t) ;;
  P2) (cd scripts && python3 export_torchvision.py "$W" resnet50) > $OUT/t/export.log 2>&1
     for b in base k1 rolled; do
       bin=.device/gpukit-$b; [ $b = rolled ] && bin=.device/gpukit
       env -u LD_LIBRARY_PATH XDG_CACHE_HOME=$W/cache-$b timeout 150 $bin profile infer --onnx $W/resnet50.onnx --batch-size 1 --strategy fp16-nhwc-graph --group-by op --top 12 > $OUT/t/profile-$b.txt 2>&1
       say "profile $b rc=$?"; grep -E "Step without|gpukit\)|cuDNN\) 1x256x14" $OUT/t/profile-$b.txt | cut -c1-170 | tee -a "$S"
     done
     (cd $OUT && tar czf p.tar.gz t && rm -rf t) ;;
esac
say "== done $(date -u +%FT%TZ)"
# K1 / K2 (the lean kernel, then with its loops kept rolled): from the repository root,
#   GPUKIT_BASE_BIN=$PWD/.device/gpukit-base BASE_ENV=GPUKIT_TRACE=0 bash scripts/gpu-own-conv.sh resnet50 1,32
# and for K2, before it, `bash .device/drivers.sh P2` (below): ResNet-50 b1's profile (its graph
# in step order) with each binary, for the kernels' times inside the pass.
