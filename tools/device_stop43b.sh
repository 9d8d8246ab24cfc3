#!/usr/bin/env bash
# Stop 43's second device call (2026-12-06), about 4 minutes, on whichever card the device lends (file names carry
# it): the dense GEMVs of at most 8 MiB (every linear at T = 4 / 8, two at T=2) at 4 and 8 rows, the one-chunk rows
# form and the bf16 tile with PDL beside default_config's form (`tools/device_fp8_gemv.py --run43-sweep`).
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/), then `run` with carry
# [".upstream"] and the command `bash tools/device_stop43b.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=40
. tools/device_step.sh

step gemv_run43 330 env FP8_GEMV_BUDGET_S=270 python3 tools/device_fp8_gemv.py --run43-sweep --out "$OUT/r" \
    --name "fp8_gemv-$GPU_TAG-run43"
pack stop43b
