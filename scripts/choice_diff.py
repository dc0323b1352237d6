#!/usr/bin/env python3
"""Where two of gpukit's cuDNN choice caches chose differently (a fast search's cache against an
exhaustive one's, as scripts/gpu-planning.sh leaves them): each convolution and operation whose
choice differs, with both choices. Usage: choice_diff.py DIR_A DIR_B (each an XDG_CACHE_HOME or a
folder under it; every cudnn-choices-v*.json found below it is read)."""
import glob
import json
import os
import sys


def load(root):
    entries = {}
    for path in sorted(glob.glob(os.path.join(root, "**", "cudnn-choices-v*.json"), recursive=True)):
        with open(path) as f:
            for e in json.load(f):
                entries[json.dumps(e["key"], sort_keys=True)] = (e["choice"], e.get("search"))
    return entries


def name(key):
    k = json.loads(key)
    try:
        c = k["conv"]
        s = c["shape"]
        return (f"{s['n']}x{s['c']}x{s['h']}x{s['w']}:{s['k']}x{s['r']}x{s['s']}:s{s['stride']}p{s['pad']}"
                f" {c.get('layout')} {c.get('dtype')} {json.dumps(k.get('op'))}")
    except (KeyError, TypeError):
        return key  # a key of another form: as stored


def choice(c):
    return " ".join(f"{k}={v}" for k, v in c.items())


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = load(sys.argv[1]), load(sys.argv[2])
    if not a or not b:
        sys.exit(f"no choices found under {sys.argv[1] if not a else sys.argv[2]}")
    common = sorted(set(a) & set(b))
    differ = [k for k in common if a[k][0] != b[k][0]]
    print(f"choices: {len(a)} and {len(b)}, {len(common)} in both, {len(differ)} differ")
    for k in differ:
        print(f"  {name(k)}: {choice(a[k][0])} ({a[k][1]}) | {choice(b[k][0])} ({b[k][1]})")


if __name__ == "__main__":
    main()
