#!/usr/bin/env bash
# Stop 40's device call (prepared 2026-12-05; that session was lent no device), about 9 minutes, on whichever card the
# device lends (file names carry it). Issue 4's prefill, 4096 tokens, every row a whole forward checked against the
# float32 reference, upstream's Triton fused_moe on bf16 experts beside it:
#
#   1. T = 1: the shipped 128-row tiles against
#      - the same tiles with a ptxas register cap (PrefillConfig.max_registers): on sm_90a 2 gate/up programs per SM
#        instead of 1 (m128n64k64w8s3: 186 -> 128 registers, no spills) and 3 down programs instead of 2
#        (m128n64k64w4s3: 180 -> 164); on sm_120a the same caps spill, so these are for the H200's own number only;
#      - the byte-plane tiles (PrefillConfig.planes, moe_prefill.BYTE_PLANE_CANDIDATES): the weight bytes loaded
#        straight into the MMA operand layout, no shared-memory round trip of the dequantised tile; fewer SASS
#        instructions per K step on sm_120a, more on sm_90a (the comment above BYTE_PLANE_CANDIDATES);
#      then the fastest gate/up with the fastest down.
#   2. T = 4: the same sweep (the kernels compiled in step 1 are reused).
#   3. the sm_12x launch choices at B = 32 / 64 (188 SMs, T=1, 8K), every stage checked: since stop 40 sm_12x runs the
#      sparse MLA decode's 32-head form where the H200 takes the 64-head one (sparse_mla_decode.large_batch_form_measured)
#
# Here, before the call: `python3 tools/device_bench.py --prepare` (writes .upstream/), then `run` with carry
# [".upstream"] and the command `bash tools/device_stop40.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_TAIL_LINES=6
. tools/device_step.sh

GATE_UP="m128n64k64w8s3r128 m128n64k128w8s2p m128n64k128w8s3p m128n64k64w8s4r128"
DOWN="m128n64k64w4s3r168 m128n128k128w8s2p m128n64k64w4s4r168"
# shellcheck disable=SC2086  # the tile lists are word lists
step prefill_t1 300 python3 tools/device_moe_prefill.py --out "$OUT/r" --name "moe_prefill-$GPU_TAG-run9" --t 1 \
    --deadline-s 270 --gate-up $GATE_UP --down $DOWN
# shellcheck disable=SC2086
step prefill_t4 150 python3 tools/device_moe_prefill.py --out "$OUT/r" --name "moe_prefill-$GPU_TAG-run9b" --t 4 \
    --deadline-s 130 --gate-up $GATE_UP --down $DOWN
step sm120_dispatch 90 python3 tools/device_sm120_dispatch.py --out "$OUT/r" --name "sm120_dispatch-188-$GPU_TAG-run2" \
    --sms 188 --time-budget-s 70 -b 32 -b 64 --tp 1 --context 8192
pack stop40
