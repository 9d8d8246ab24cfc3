#!/usr/bin/env bash
# CI as `.ci/run` runs it, on a clean clone of HEAD in a temporary folder, then the clone is removed.
#
#   tools/ci_local.sh [LOG]     # LOG defaults to /tmp/sglang-sm120-ci-<commit>.log; exit status is CI's
#
# The clone's .venv (SGLang 0.5.23 and its CUDA wheels) takes about 11 GB. Clones left behind in /tmp filled this
# workplace's disk once (stop 37: CI's own install then failed with "No space left on device"), so the clone goes
# whatever the outcome; only the log stays.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repo" rev-parse --short HEAD)
log=${1:-/tmp/sglang-sm120-ci-$commit.log}
clone=$(mktemp -d /tmp/sglang-sm120-ci-XXXXXX)
trap 'rm -rf "$clone"' EXIT
git clone -q "$repo" "$clone/repo" || exit 1
echo "CI on $commit in $clone/repo, log $log ($(date -u +%H:%M:%S) UTC)"
start=$(date +%s)
(cd "$clone/repo" && bash .ci/run) > "$log" 2>&1
status=$?
echo "CI on $commit: exit $status after $(( $(date +%s) - start )) s; $(tail -1 "$log")"
exit $status
