#!/usr/bin/env python3
"""Summarises a `gpukit infer --onnx ... --save-json FILE` report, a line a row: each row's
strategy, device, batch, status, images/s and agreement with ONNX Runtime; with
--compare-pytorch, PyTorch's GPU rows and the best fp16 of each side. Usage: onnx_rows.py FILE"""
import json
import sys

d = json.load(open(sys.argv[1]))["result"]
for r in d.get("rows") or []:
    st = r.get("status", {})
    fig = r.get("images_per_s")
    agr = r.get("agreement") or {}
    extra = f" max_rel {agr.get('max_rel'):.1e} top1 {agr.get('top1')}" if agr.get("max_rel") is not None else ""
    why = st.get("why", "")[:200]
    print(f"  {r['strategy']:20} {r['device']:7} b{r['batch']:<4} {st.get('status'):8} {fig and round(fig, 1)} /s{extra} {why}")
if d.get("gpu_engine"):
    print("  gpu:", d["gpu_engine"][:300])
pt = d.get("pytorch") or {}
for r in pt.get("rows") or []:
    if r.get("device") == "cuda":
        extra = f" compile {r['compile_s']:.0f} s" if r.get("compile_s") else ""
        print(f"  pytorch {r['strategy']:20} b{r['batch']:<4} {r['status']:8} "
              f"{r.get('images_per_s') and round(r['images_per_s'], 1)} /s{extra} {(r.get('reason') or '')[:120]}")
for b in pt.get("best_fp16") or []:
    print(f"  best fp16 b{b['batch']}: gpukit {b['gpukit_strategy']} {b['gpukit_images_per_s']:.0f} / "
          f"PyTorch {b['pytorch_strategy']} {b['pytorch_images_per_s']:.0f} = {b['ratio']:.2f}x")
if pt.get("same_model"):
    print("  same model:", json.dumps(pt["same_model"])[:300])
