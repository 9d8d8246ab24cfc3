# Sourced by the tools/device_*.sh calls: `step NAME SECONDS COMMAND...` runs COMMAND under its own time limit with
# its output in $OUT/r/NAME.log, prints its exit status and the log's last lines; a step that fails or runs out of
# time does not stop the next.
step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
    timeout "$limit" "$@" > "$OUT/r/$name.log" 2>&1
    echo "== $name rc=$? $(date -u +%H:%M:%S)"
    tail -"${STEP_TAIL_LINES:-5}" "$OUT/r/$name.log"
}
