#!/usr/bin/env bash
# Stop 43's device call (2026-12-06), about 6 minutes, on whichever card the device lends (file names carry it):
#
#   1. the layer variants owed since stop 42: the bench's T=4 layers at B = 16 / 32 / 64 with the shipped TMA pairs
#      decode (its T=4 8-row down tile capped at 128 registers on compute capability 9) beside `moe_pairs_cap0`
#      (uncapped, as before stop 42), interleaved in one run
#   2. the decode-step bench, default grid (B 1 / 8 / 32 / 64, T 1 / 4, context 8K / 64K), at this commit
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/), then `run` with carry
# [".upstream"] and the command `bash tools/device_stop43.sh` (VARIANTS_RUN / BENCH_RUN: the run numbers in the files'
# names).
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=6
. tools/device_step.sh

step variants 200 python3 tools/device_bench_layer_variants.py --out "$OUT/r" \
    --name "bench-variants-$GPU_TAG-run${VARIANTS_RUN:-52}" --kind swa c4 c128 --batch 16 32 64 --tp 4 \
    --variants shipped moe_pairs_cap0
step bench 300 python3 tools/device_bench.py --out "$OUT/r" --name "bench-$GPU_TAG-run${BENCH_RUN:-51}"
pack stop43
