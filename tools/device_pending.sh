#!/usr/bin/env bash
# The device measurements still owed since stop 35 (2026-12-05), in one call of at most 9.5 minutes (the steps' limits), so that a session
# with little device time spends it on one start. Each step has its own time limit and writes under $OUT/r; a step
# that fails or runs out of time does not stop the next.
#
#   1. wo_a A/B: the fused-RoPE wo_a before (c806deb) and after stop 35's range check on positions
#   2. the read ceiling: a pure streaming read of each GEMV weight's and the MoE B=1 experts' bytes, beside the GEMV
#   3. indexer run 24: overlap program counts at B = 16..48 x 256K (catalog forms, not shipped)
#   4. the seams' torch fallbacks (MoE and wo_a) beside the kernels
#
# Here, before the call (the device copy of the tree has no git history):
#   rm -rf .cleanhead && mkdir -p .cleanhead && cp -r kernels sglang_sm120 tools pyproject.toml .cleanhead/ \
#     && git show c806deb:kernels/fp8_gemv.py > .cleanhead/before_fp8_gemv.py
# then `run` with carry [".cleanhead"] and the command `bash .cleanhead/tools/device_pending.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-.device-out}
mkdir -p "$OUT/r"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/r/gpu.txt"

. tools/device_step.sh

if [ -f before_fp8_gemv.py ]; then
    step wo_a_ab 120 python3 tools/device_wo_a_ab.py --before before_fp8_gemv.py --out "$OUT/r" \
        --name wo_a_ab-h200-run1 --note "before: c806deb; after: stop 35's range check on positions (4ec84e6)"
else
    echo "== wo_a_ab skipped: before_fp8_gemv.py is missing (see this script's header)"
fi
step read_ceiling 150 python3 tools/device_read_ceiling.py --out "$OUT/r" --name read_ceiling-h200-run1
step indexer 150 python3 tools/device_indexer.py --out "$OUT/r" --name indexer-h200-run24 --skip-upstream \
    --no-topk-only --shapes 32x262144,16x262144,24x262144,48x262144 \
    --forms hist_pmax,hist_pmax_ov2048,hist_pmax_ov2048_lean,hist_pmax_ov1024_lean,hist_pmax_ov4096_lean
step fallbacks 150 python3 tools/device_fallbacks.py --out "$OUT/r" --name fallbacks-h200-run1
ls -l "$OUT/r"
