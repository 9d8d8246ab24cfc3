#!/usr/bin/env bash
# The device measurements owed at stop 38, in one call of at most about 6 minutes (the steps' limits), so that a
# session with little device time spends it on one start. Ran at stop 39 (2026-12-05 16:46 UTC) on an H100:
# benchmarks/sm120_dispatch-188-h100-run1.*, -170-h100-run1.*, moe_mxfp4-h100-run32.*. Each step has its own time
# limit and writes under $OUT/r; a step that fails or runs out of time does not stop the next. (What this script ran
# before, stop 37's owed runs, is in its git history and in benchmarks/.)
#
#   1. the sm_12x launch choices at full sizes, every stage checked (tools/device_sm120_dispatch.py): 188 SMs (RTX PRO
#      6000) over B 1 / 8 / 64, T 1 / 4, 8K / 64K; then 170 SMs (RTX 5090) at B 1 / 64, 8K
#   2. issue 4's MoE grid at this commit (its last full run is run 26b; the decode kernels changed until run 31).
#      MOE_GRID=0 skips it. Its files are named by the card (moe_mxfp4-h100.* on an H100)
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/), then `run` with carry
# [".upstream"] and the command `bash tools/device_pending.sh`. The results come back as one archive, pending.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=30
. tools/device_step.sh

step sm120_dispatch_188 130 python3 tools/device_sm120_dispatch.py --out "$OUT/r" --name sm120_dispatch-188-$GPU_TAG-run1 \
    --sms 188 --time-budget-s 100
step sm120_dispatch_170 50 python3 tools/device_sm120_dispatch.py --out "$OUT/r" --name sm120_dispatch-170-$GPU_TAG-run1 \
    --sms 170 --time-budget-s 25 -b 1 -b 64 --context 8192
if [ "${MOE_GRID:-1}" = 1 ]; then
    step moe_grid 150 python3 tools/device_moe_mxfp4.py --out "$OUT/r"
fi
pack pending
