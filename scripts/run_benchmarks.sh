#!/usr/bin/env bash
# Runs everything gpukit measures (`gpukit all`) and writes one report. See usage below.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/run_benchmarks.sh [--quick] [OPTION...] [OUT_DIR]

Builds gpukit (release; nothing to do when it is up to date) and runs `gpukit all`, which
writes OUT_DIR/report.html (the page to open), report.md and report.json.

  OUT_DIR          the report's folder (default: gpukit-report), relative to the
                   directory this is run from; `--out DIR` says the same
  --quick          shorter benchmarks: a tour, not a measurement campaign
  --device DEVICE  which devices to run on: all, cpu, cuda:N
  -h, --help       this text

Any other option starting with - goes to `gpukit all` as it is (`gpukit all --help`).
EOF
}

die() {
    echo "error: $*" >&2
    echo "(scripts/run_benchmarks.sh --help says how to run it)" >&2
    exit 2
}

out=
set_out() {
    [ -z "$out" ] || die "one report folder only: got '$out' and '$1'"
    [ -n "$1" ] || die "the report folder is empty"
    out=$1
}

flags=()
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help)
        usage
        exit 0
        ;;
    --out)
        [ $# -ge 2 ] || die "--out needs a folder"
        set_out "$2"
        shift
        ;;
    --out=*) set_out "${1#--out=}" ;;
    # `gpukit all`'s options that take a value as the next word: that word is not the folder
    --device | --save-json | --html)
        [ $# -ge 2 ] || die "$1 needs a value"
        flags+=("$1" "$2")
        shift
        ;;
    --)
        shift
        [ $# -le 1 ] || die "one report folder only: got $*"
        [ $# -eq 0 ] || set_out "$1"
        break
        ;;
    -*) flags+=("$1") ;;
    *) set_out "$1" ;;
    esac
    shift
done
out=${out:-gpukit-report}

# No `cd`: a relative OUT_DIR (and any path in the options) stays relative to the caller's
# directory. cargo finds the workspace from the manifest path and says where the binary is, so
# CARGO_TARGET_DIR and cargo's own configuration are followed.
repo=$(cd "$(dirname "$0")/.." && pwd)
# Always built: cargo does nothing when the binary is up to date, and a stale one would measure
# old code. Its progress goes to stderr; the JSON on stdout names the executable.
echo "building gpukit (release; the first build takes a few minutes)..." >&2
bin=$(cargo build --release --bin gpukit --manifest-path "$repo/Cargo.toml" \
    --message-format=json-render-diagnostics |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -n "$bin" ] && [ -x "$bin" ] || die "cargo built no gpukit executable"
exec "$bin" all ${flags[@]+"${flags[@]}"} --out "$out"
