"""The ``sglang-sm120`` console script: ``doctor``, ``aot-check``, ``pd plan|launch``, ``bench``."""

from __future__ import annotations

import argparse
import json
import os
import sys


def _doctor(args) -> int:
    from .doctor import run

    return run()


MIN_AOT_ARCH = 90


def _aot_check(args) -> int:
    from .kernels.aot_registry import all_configs
    from .kernels.harness.aot import check_configs
    from .kernels.harness.interpreter import interpreter_enabled

    if interpreter_enabled():
        print("aot-check compiles for real GPUs and cannot run with TRITON_INTERPRET set; unset it", file=sys.stderr)
        return 2

    too_old = [a for a in args.arch or () if a < MIN_AOT_ARCH]
    if too_old:  # the kernels use e4m3, TMA and programmatic dependent launch: sm_90 and newer
        print(f"aot-check: --arch {too_old[0]}: the kernels need compute capability {MIN_AOT_ARCH} or newer "
              "(e4m3, TMA, programmatic dependent launch); 120 / 121 are the targets, 90 the H200 the timings ran on",
              file=sys.stderr)
        return 2
    if args.json:  # find out now, not after every config has compiled
        folder = os.path.dirname(os.path.abspath(args.json))
        if os.path.isdir(args.json) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            print(f"aot-check: --json {args.json}: cannot write a file there", file=sys.stderr)
            return 2
    configs = [c for c in all_configs() if not args.only or any(s in c.name for s in args.only)]
    if not configs:
        print("no AOT config matches", args.only, file=sys.stderr)
        return 2
    archs = args.arch or None
    print(f"AOT check: {len(configs)} configs x archs {archs or 'sm_120a, sm_121a'} (no GPU needed)")
    results = check_configs(configs, archs, log=print)
    failed = [r for _c, r, problems in results if problems]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if args.json:
        rows = [{**{k: v for k, v in vars(r).items()}, "problems": p, "tensor_core_opcodes": r.tensor_core_opcodes,
                 "wide_loads": r.wide_loads} for _c, r, p in results]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-sm120", description="DeepSeek-V4-Flash on sm_120 for SGLang")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="check the install, GPUs, versions and what the plugin would do")
    doctor.set_defaults(func=_doctor)
    aot = sub.add_parser("aot-check", help="compile every shipped Triton config for sm_120a/sm_121a and check it")
    aot.add_argument("--arch", type=int, action="append", help="compute capability (default: 120 and 121)")
    aot.add_argument("--only", action="append", help="only configs whose name contains this (repeatable)")
    aot.add_argument("--json", help="also write the reports to this JSON file")
    aot.set_defaults(func=_aot_check)
    try:
        from .pd.cli import add_pd_parser
    except ImportError:
        pass
    else:
        add_pd_parser(sub)
    try:
        from .bench.cli import add_bench_parser
    except ImportError:
        pass
    else:
        add_bench_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
