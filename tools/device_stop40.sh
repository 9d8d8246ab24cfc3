#!/usr/bin/env bash
# Stop 40's device call (2026-12-05), about 6 minutes, on whichever card the device lends (file names carry it):
#
#   1. issue 4's prefill (4096 tokens, T = 1 / 4): the shipped 128-row tiles against the same tiles with a ptxas
#      register cap (PrefillConfig.max_registers), which on sm_90a fits 2 gate/up programs per SM instead of 1
#      (m128n64k64w8s3: 186 -> 128 registers, no spills) and 3 down programs instead of 2 (m128n64k64w4s3: 180 -> 164),
#      and the 8-warp down tile (126 registers uncapped); upstream's Triton fused_moe on bf16 experts beside them.
#      On sm_120a the same caps spill (the mma.sync accumulators live in registers), so nothing here is for sm_12x.
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/), then `run` with carry
# [".upstream"] and the command `bash tools/device_stop40.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=6
. tools/device_step.sh

step prefill 560 python3 tools/device_moe_prefill.py --out "$OUT/r" --name "moe_prefill-$GPU_TAG-run9" --t 1 4 \
    --deadline-s 440 \
    --gate-up m128n64k64w8s3r128 m128n64k64w8s4r128 m128n64k64w8s2r128 m128n32k64w4s3r168 \
    --down m128n64k64w4s3r168 m128n64k64w4s4r168 m128n64k64w8s3
pack stop40
