#!/usr/bin/env bash
# Stop 42's device call (2026-12-06), about 5 minutes, for the card the issues name: (1) issue 4's MoE grid at this
# commit (its last H200 grid is run 26b; the B=1 launches changed until run 31 and the prefill took the register caps
# at stop 41, timed on H100s only); (2) the prefill's capped pair against the uncapped pair at 4096 tokens, T = 1 / 4,
# as stop 41's run 10 did on an H100, beside upstream's Triton fused_moe in the same run.
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/), then `run` with carry
# [".upstream"] and the command `bash tools/device_stop42.sh` (MOE_RUN / PREFILL_RUN: the run numbers in the
# files' names; the first call, on an H100, wrote runs 33 / 11 before the grid took --name).
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=8
. tools/device_step.sh

step moe_grid 170 python3 tools/device_moe_mxfp4.py --out "$OUT/r" --name "moe_mxfp4-$GPU_TAG-run${MOE_RUN:-33}"
step prefill_caps_4096 240 python3 tools/device_moe_prefill.py --out "$OUT/r" \
    --name "moe_prefill-$GPU_TAG-run${PREFILL_RUN:-11}" --t 1 4 --tokens 4096 --deadline-s 200 \
    --partners m128n64k64w8s3 m128n64k64w4s3 \
    --gate-up m128n64k64w8s3r128 --down m128n64k64w4s3r168
pack stop42
