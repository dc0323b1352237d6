import json, sys
d = json.load(open(sys.argv[1]))["result"]
for r in d.get("rows") or []:
    st = r.get("status", {})
    fig = r.get("images_per_s")
    agr = r.get("agreement") or {}
    extra = f" max_rel {agr.get('max_rel'):.1e}" if agr.get("max_rel") is not None else ""
    print(f"  {r['strategy']:28} {r['device']:7} b{r['batch']:<4} {st.get('status')} {fig and round(fig, 1)} /s{extra} {st.get('why', '')[:100]}")
