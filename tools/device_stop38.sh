#!/usr/bin/env bash
# Stop 38's device call (2026-12-05), about 2 minutes: issue 4's MoE grid at this commit (owed since stop 35; the
# seam's kernels have not changed since run 31, the fallback has).
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

step moe_grid 300 python3 tools/device_moe_mxfp4.py --out "$OUT/r"
ls -l "$OUT/r"
# at most 8 files come back from a call: everything in one archive
tar czf "$OUT/stop38.tgz" -C "$OUT" r && rm -rf "$OUT/r"
