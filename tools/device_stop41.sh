#!/usr/bin/env bash
# Stop 41's device call (2026-12-05), about 2 minutes: the prefill's register caps as the default on compute
# capability 9 (moe_prefill.WARPGROUP_MMA_REGISTER_CAPS, chosen from run 9's sweeps), timed as the forward now picks
# them, beside the uncapped pair and upstream's Triton fused_moe in the same run; then the same question for the
# 64-row class (2048 tokens), where ptxas gives the gate/up tile 218 registers (2 programs of 4 warps per SM; 162 at
# a cap of 168, 3 fit, no spills) and the down tile 110 (4 programs; 96 at a cap of 96, 5 fit, no spills).
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/), then `run` with carry
# [".upstream"] and the command `bash tools/device_stop41.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=6
. tools/device_step.sh

# Steps to run (default the first call's two); the second call, after the first's results: `bash
# tools/device_stop41.sh 1024`, the 32-row class's down tile capped at 80 registers (90 uncapped, 5 programs of 4 warps
# per SM; 6 at 80, no spills on sm_90a; the class's gate/up tile, 126 registers, spills at any cap that fits a fifth).
STEPS=${*:-4096 2048}
want() { [[ " $STEPS " == *" $1 "* ]]; }

want 4096 && step prefill_4096 240 python3 tools/device_moe_prefill.py --out "$OUT/r" \
    --name "moe_prefill-$GPU_TAG-run10" --t 1 4 --tokens 4096 --deadline-s 200 \
    --partners m128n64k64w8s3 m128n64k64w4s3 \
    --gate-up m128n64k64w8s3 m128n64k64w8s4r128 --down m128n64k64w4s3r168 m128n64k64w4s4r168
want 2048 && step prefill_2048 240 python3 tools/device_moe_prefill.py --out "$OUT/r" \
    --name "moe_prefill-$GPU_TAG-run10b" --t 1 4 --tokens 2048 --deadline-s 200 --partners m64n64k64w4s3 m64n64k64w4s3 \
    --gate-up m64n64k64w4s3r168 --down m64n64k64w4s3r96
want 1024 && step prefill_1024 240 python3 tools/device_moe_prefill.py --out "$OUT/r" \
    --name "moe_prefill-$GPU_TAG-run10c" --t 1 4 --tokens 1024 --deadline-s 200 --partners m32n64k64w4s3 m32n64k64w4s3 \
    --gate-up --down m32n64k64w4s3r80
# The fourth call, `bash tools/device_stop41.sh t28`: the caps at T = 2 and 8 (per-rank I 1024 / 256; then not yet
# applied there, so the default rows are the uncapped pair): each cap alone and both together (runs 10d / 10e).
want t28 && step prefill_t28_4096 150 python3 tools/device_moe_prefill.py --out "$OUT/r" \
    --name "moe_prefill-$GPU_TAG-run10d" --t 2 8 --tokens 4096 --deadline-s 120 \
    --partners m128n64k64w8s3 m128n64k64w4s3 --gate-up m128n64k64w8s3r128 --down m128n64k64w4s3r168
want t28 && step prefill_t28_2048 150 python3 tools/device_moe_prefill.py --out "$OUT/r" \
    --name "moe_prefill-$GPU_TAG-run10e" --t 2 8 --tokens 2048 --deadline-s 120 \
    --partners m64n64k64w4s3 m64n64k64w4s3 --gate-up m64n64k64w4s3r168 --down m64n64k64w4s3r96
pack "stop41-${STEPS// /-}"
