# Sourced by the tools/device_*.sh calls, from the repository root. On sourcing: $OUT (default .device-out) gets the
# results folder $OUT/r and the GPU's name, driver and clocks in $OUT/r/gpu.txt, and $GPU_TAG the card for file names.
#   step NAME SECONDS COMMAND...  runs COMMAND under its own time limit with its output in $OUT/r/NAME.log, prints its
#                                 exit status and the log's last $STEP_TAIL_LINES lines; a step that fails or runs
#                                 out of time does not stop the next
#   pack NAME                     lists $OUT/r and moves it into one archive, $OUT/NAME.tgz: at most 8 files come
#                                 back from a call (a call cut short returns $OUT/r as it stands)
OUT=${OUT:-.device-out}
mkdir -p "$OUT/r"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/r/gpu.txt"
# the card in result files' names (h200, h100), by devicebench.gpu_tag's rule (the model number in the GPU's name,
# lower case; 'gpu' without one): the device may lend an H100 for an H200
GPU_TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE '\b[A-Z]+[0-9]{2,4}\b' | head -1 |
          tr A-Z a-z)
GPU_TAG=${GPU_TAG:-gpu}

step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
    timeout "$limit" "$@" > "$OUT/r/$name.log" 2>&1
    echo "== $name rc=$? $(date -u +%H:%M:%S)"
    tail -"${STEP_TAIL_LINES:-5}" "$OUT/r/$name.log"
}

pack() {
    ls -l "$OUT/r"
    tar czf "$OUT/$1.tgz" -C "$OUT" r && rm -rf "$OUT/r"
}
