#!/usr/bin/env bash
# The two commands that set everything up on a fresh machine:
#   tools/dev.sh main   - the main job: `sglang-sm120 doctor`, then `sglang-sm120 bench` (on a machine
#                         without a GPU: reduced DSv4-Flash layers under the Triton interpreter, both
#                         paths checked against the float32 reference, nothing timed)
#   tools/dev.sh test   - the whole test suite (extra arguments go to pytest)
# Both create .venv (override with SGLANG_SM120_VENV) with SGLang 0.5.23 and this package
# installed from ci/constraints-cpu.txt, so installs are reproducible; reruns reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGLANG_SM120_VENV:-.venv}
PYTHON=${PYTHON:-python3}

setup() {
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    local stamp
    stamp="$VENV/.sglang-sm120-$(cat pyproject.toml ci/constraints-cpu.txt | sha256sum | cut -c1-16)"
    if [ ! -f "$stamp" ]; then
        echo "== installing SGLang 0.5.23 and sglang-sm120[test,pd] into $VENV (a few minutes the first time)"
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c ci/constraints-cpu.txt -e ".[test,pd]"
        touch "$stamp"
    fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    main)
        setup
        "$VENV/bin/sglang-sm120" doctor
        "$VENV/bin/sglang-sm120" bench "$@"
        ;;
    test)
        setup
        # pytest's own executable (not `python -m pytest`) keeps the repo root off sys.path;
        # --durations lists the slowest tests, so a CI log shows where the 90-minute budget goes
        "$VENV/bin/pytest" -q --durations=25 "$@"
        ;;
    *)
        echo "usage: tools/dev.sh main|test [args]" >&2
        exit 2
        ;;
esac
