#!/usr/bin/env bash
# Stop 37's device call (2026-12-05), about 4 minutes: the fixes of this stop checked on the H200.
#
#   1. wo_a A/B run 2: the fused-RoPE wo_a before stop 35's range check (c806deb) against this tree (the range check
#      kept, the one-shot program back at 128 registers on sm_90a)
#   2. fallbacks run 2, MoE only: the seam's torch fallback with the byte-table dequantisation
#   3. the decode-step bench, default grid (B 1 / 8 / 32 / 64, T 1 / 4, context 8K / 64K): the headline after the fix
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/) and
#   rm -rf .cleanhead && mkdir -p .cleanhead && git show c806deb:kernels/fp8_gemv.py > .cleanhead/before_fp8_gemv.py
# then `run` with carry [".cleanhead", ".upstream"] and the command `bash tools/device_stop37.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=3
. tools/device_step.sh

step wo_a_ab 120 python3 tools/device_wo_a_ab.py --before .cleanhead/before_fp8_gemv.py --out "$OUT/r" \
    --name wo_a_ab-h200-run2 --note "before: c806deb; after: 9e2f795 (range check kept, 128 registers on sm_90a)"
step fallbacks 120 python3 tools/device_fallbacks.py --out "$OUT/r" --name fallbacks-h200-run2 --only moe
step bench 330 python3 tools/device_bench.py --out "$OUT/r" --name bench-h200-run48
pack stop37
