#!/usr/bin/env bash
# Stop 39's device call (2026-12-05), about 6 minutes, on whichever card the device lends (file names carry it):
#
#   1. wo_a A/B run 3: the fused-RoPE wo_a at 11421d7 (the FP8 tensor-core item form gathers an out-of-table
#      position's freqs through the NaN poison row) against this tree (the clamped gather of the one-shot form, the
#      store making the row NaN as before). T=2 is where the rules pick that form (4 / 8 rows on 132-188 SMs); T=1 / 4
#      run the one-shot / other forms and must come out level
#   2. the decode-step bench, default grid (B 1 / 8 / 32 / 64, T 1 / 4, context 8K / 64K), on this card
#   3. issue 5's indexer grid (B 1 / 16 / 64 x 8K / 64K / 256K, and 1 x 1M, 256 x 8K) beside upstream's torch path
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/) and
#   rm -rf .cleanhead && mkdir -p .cleanhead && git show 11421d7:kernels/fp8_gemv.py > .cleanhead/before_fp8_gemv.py
# then `run` with carry [".cleanhead", ".upstream"] and the command `bash tools/device_stop39.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=4
. tools/device_step.sh

step wo_a_ab 100 python3 tools/device_wo_a_ab.py --before .cleanhead/before_fp8_gemv.py --out "$OUT/r" \
    --name "wo_a_ab-$GPU_TAG-run3" --tp 2 --tp 1 --tp 4 \
    --note "before: 11421d7; after: the FP8 item form's freqs gather clamped into the table (no poison row)"
step bench 240 python3 tools/device_bench.py --out "$OUT/r" --name "bench-$GPU_TAG-run1"
step indexer 200 python3 tools/device_indexer.py --out "$OUT/r" --name "indexer-$GPU_TAG-run1" --no-topk-only
pack stop39
