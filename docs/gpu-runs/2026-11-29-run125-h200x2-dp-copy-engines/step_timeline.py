import json, sys
d=json.load(open(sys.argv[1])); ev=d['traceEvents'] if isinstance(d,dict) else d
X=[e for e in ev if e.get('ph')=='X' and e.get('pid')==2 and e.get('tid') in (0,1000)]
X.sort(key=lambda e:e['ts'])
starts=[e['ts'] for e in X if e['tid']==0 and e['name'].startswith('gather_rows_bf16')]
k=int(sys.argv[2]) if len(sys.argv)>2 else 8
t0,t1=starts[k],starts[k+1]
print('step', k, 'length', round(t1-t0,1),'us')
for e in X:
    if t0<=e['ts']<t1+30:
        print(f"{'W' if e['tid']==0 else '   C'} {e['ts']-t0:8.1f} {e['dur']:7.1f} {e['ts']+e['dur']-t0:8.1f} {e['name'][:70]}")
