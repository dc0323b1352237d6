#!/usr/bin/env bash
# Run 65: every GPU test binary and the CLI checks (scripts/gpu-test.sh tests).
OUT="$OUT" timeout 560 bash scripts/gpu-test.sh tests | tail -30
