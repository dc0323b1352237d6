#!/usr/bin/env bash
# Run 66: compute-sanitizer over every GPU path (scripts/gpu-test.sh sanitize).
SANITIZE_TIMEOUT=420 OUT="$OUT" timeout 580 bash scripts/gpu-test.sh sanitize | tail -40
