#!/usr/bin/env python3
"""Registers, spills and shared memory of the shipped AOT configs in this tree against another commit's, per arch.

Why: on the H200 a program that crosses a register boundary loses a program per SM, and a one-wave grid becomes
two. Stop 35's range check on wo_a's positions took the fused-RoPE one-shot program from 128 to 137 registers on
sm_90a under the device's Triton 3.6 and H200 A/B run 1 measured it 1.32-1.41x slower; nothing on this machine had
flagged it, because the AOT check looks at sm_120a / sm_121a only and CI's Triton is another version. Run this before
a device call, with the device's Triton on the path when it differs from this machine's:

    python3 tools/aot_register_diff.py --before c806deb --only fp8_gemv --arch 90
    PYTHONPATH=/path/to/triton-3.6/site-packages python3 tools/aot_register_diff.py --before HEAD~3 --arch 90 120

Each tree is imported in its own process (``git worktree`` for the other commit); configs present in one tree only
are listed as such. Exit 0 always: it reports, the reader judges.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent

# run in a child process with the tree's root as argv[1]: prints one JSON line per (config, arch)
_CHILD = r'''
import json, pathlib, sys
repo, only, archs = pathlib.Path(sys.argv[1]), sys.argv[2], [int(a) for a in sys.argv[3].split(",")]
sys.path.insert(0, sys.argv[4])  # this checkout's tools/
from _repo_imports import map_kernels
map_kernels(repo)
from sglang_sm120.kernels import aot_registry
from sglang_sm120.kernels.harness import aot
for cfg in aot_registry.all_configs():
    if only not in cfg.name:
        continue
    for arch in archs:
        r = aot.compile_config(cfg, arch)
        print(json.dumps({"config": cfg.name, "arch": arch, "ok": r.ok, "registers": r.registers,
                          "spills": max(r.spill_store_bytes, 0) + max(r.spill_load_bytes, 0),
                          "shared": r.shared_bytes, "error": r.error[:200]}), flush=True)
'''


def compile_tree(root: pathlib.Path, only: str, archs: list[int]) -> dict:
    argv = [str(root), only, ",".join(map(str, archs)), str(REPO / "tools")]
    out = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True,
                         cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise SystemExit(f"compiling {root} failed:\n{out.stderr[-2000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {(r["config"], r["arch"]): r for r in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit to compare against (any git revision)")
    parser.add_argument("--only", default="", help="configs whose name contains this")
    parser.add_argument("--arch", type=int, nargs="+", default=[90], help="SM arches (90 = the H200's sm_90a)")
    parser.add_argument("--all", action="store_true", help="list every config, not only the ones that differ")
    args = parser.parse_args()
    if any(a < 90 for a in args.arch):
        parser.error("--arch: 90 or above (the kernels need TMA-era features)")
    import triton

    print(f"Triton {triton.__version__}; arches {args.arch}; configs matching {args.only!r}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        worktree = pathlib.Path(tmp) / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(worktree), args.before],
                       check=True)
        try:
            before = compile_tree(worktree, args.only, args.arch)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)
    after = compile_tree(REPO, args.only, args.arch)
    changed = 0
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        name = f"{key[0]} sm_{key[1]}a"
        if b is None or a is None:
            print(f"{name}: only {'after' if b is None else 'before'}")
            changed += 1
            continue
        fields = ("registers", "spills", "shared", "ok")
        if args.all or any(b[f] != a[f] for f in fields):
            diff = ", ".join(f"{f} {b[f]} -> {a[f]}" if b[f] != a[f] else f"{f} {a[f]}" for f in fields)
            print(f"{name}: {diff}")
            changed += any(b[f] != a[f] for f in fields)
    print(f"{changed} of {len(set(before) | set(after))} (config, arch) pairs differ")
    return 0


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # compiling, not interpreting
    sys.exit(main())
