#!/usr/bin/env bash
# Stop 43's third device call (2026-12-06), about 5 minutes, on whichever card the device lends (file names carry it):
#   1. the <= 8 MiB GEMVs at 4 / 8 rows again (`device_fp8_gemv.py --run43-sweep`), now with run 43's 4-row one-chunk
#      tiles as the default and the form before them (`before_run43`) beside it
#   2. the bench's layers at T = 4 / 8, B = 4 / 8 with the 4-row tiles (shipped) against `oc4_off` (the form before)
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/), then `run` with carry
# [".upstream"] and the command `bash tools/device_stop43c.sh` (GEMV_RUN / VARIANTS_RUN name the files).
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=30
. tools/device_step.sh

step gemv_run43b 240 env FP8_GEMV_BUDGET_S=200 python3 tools/device_fp8_gemv.py --run43-sweep --out "$OUT/r" \
    --name "fp8_gemv-$GPU_TAG-run${GEMV_RUN:-43b}"
step variants 240 python3 tools/device_bench_layer_variants.py --out "$OUT/r" \
    --name "bench-variants-$GPU_TAG-run${VARIANTS_RUN:-53}" --kind swa c4 c128 --batch 4 8 --tp 4 8 \
    --variants shipped oc4_off
pack stop43c
