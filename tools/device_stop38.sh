#!/usr/bin/env bash
# Stop 38's device call (2026-12-05), at most about 6 minutes:
#   1. the sm_12x launch choices (188 SMs, then 170) at full sizes, every stage checked (tools/device_sm120_dispatch.py)
#   2. issue 4's MoE grid at this commit (owed since stop 35; the kernels have not changed since run 31)
#
# Here, before the call: `python3 tools/device_moe_mxfp4.py --prepare` (writes .upstream/), then `run` with carry
# [".upstream"] and the command `bash tools/device_stop38.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-.device-out}
mkdir -p "$OUT/r"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/r/gpu.txt"

STEP_TAIL_LINES=30
. tools/device_step.sh

step sm120_dispatch_188 170 python3 tools/device_sm120_dispatch.py --out "$OUT/r" --name sm120_dispatch-188-h200-run1 \
    --sms 188 --time-budget-s 140
if [ "${MOE_GRID:-1}" = 1 ]; then  # MOE_GRID=0 on an H100: the grid's history is the H200's
    step moe_grid 150 python3 tools/device_moe_mxfp4.py --out "$OUT/r"
fi
step sm120_dispatch_170 70 python3 tools/device_sm120_dispatch.py --out "$OUT/r" --name sm120_dispatch-170-h200-run1 \
    --sms 170 --time-budget-s 45 -b 1 -b 64 --context 8192
ls -l "$OUT/r"
# at most 8 files come back from a call: everything in one archive
tar czf "$OUT/stop38.tgz" -C "$OUT" r && rm -rf "$OUT/r"
