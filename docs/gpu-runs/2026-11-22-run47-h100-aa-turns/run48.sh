#!/usr/bin/env bash
# Run 48: A/A tests, continued: both sides in one process with their own operands (allocated A
# first, then B first), and two serve processes with B's operands allocated first.
set -u
S=$SECONDS
D=docs/gpu-runs/2026-11-22-run47-h100-aa-turns
timeout 150 python3 $D/aa_turns.py inproc
echo "[$((SECONDS-S)) s]"
timeout 150 python3 $D/aa_turns.py inproc b-first
echo "[$((SECONDS-S)) s]"
timeout 200 python3 $D/aa_turns.py remote b-first
echo "[$((SECONDS-S)) s]"
