#!/usr/bin/env python3
"""Device run of ``sglang-sm120 bench`` (the DSv4-Flash decode-step benchmark) from a plain checkout.

    python3 tools/device_bench.py --prepare       # here, where SGLang is installed: upstream code -> .upstream/
    python3 tools/device_bench.py --out $OUT      # on the device (carry .upstream): full grid, timed
    python3 tools/device_bench.py --smoke         # here: CPU interpreter, tiny grid, upstream from .upstream/

``--prepare`` reuses each kernel's device script (indexer, wo_a, sparse MLA, MoE tables) and adds the
Triton kernels the bench launches itself (``upstream_ops.write_triton_bundle``). Extra arguments
are passed to ``sglang-sm120 bench`` (e.g. ``--time-budget-s 330``, ``-b 1 -b 64``).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()


def prepare() -> None:
    import device_fp8_gemv
    import device_indexer
    import device_moe_mxfp4
    import device_sparse_mla_decode
    import upstream

    from sglang_sm120.bench import upstream_ops

    device_indexer.prepare()  # fp8_paged_mqa_logits_torch_sm120
    device_fp8_gemv.prepare()  # _apply_wo_a_bf16_matmul
    device_sparse_mla_decode.prepare()  # flash_mla_sm120_triton.py
    device_moe_mxfp4.prepare()  # upstream's tuned H200 fused-MoE tables (the kernel comes with the bundle)
    print("wrote", upstream_ops.write_triton_bundle(str(upstream.UPSTREAM_DIR)))
    missing = [f for f in (*upstream_ops.UPSTREAM_FILES.values(), upstream_ops.MOE_TABLES_FILE)
               if not (upstream.UPSTREAM_DIR / f).exists()]
    if missing:
        raise SystemExit(f"--prepare did not write {missing}")


def main(argv: list[str]) -> int:
    if "--prepare" in argv:
        prepare()
        return 0
    from sglang_sm120.bench.cli import add_bench_parser
    import argparse

    parser = argparse.ArgumentParser(prog="device_bench")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    out = os.environ.get("OUT", "bench-results")
    rest = [a for a in argv if a != "--smoke"]
    if "--smoke" in argv:
        base = ["bench", "--device", "cpu", "--upstream", "files", "-b", "2", "--tp", "1", "--out", out,
                "--name", "bench-smoke"]
    else:
        base = ["bench", "--device", "cuda", "--upstream", "files", "--name", "bench-h200", "--out", out]
    args = parser.parse_args(base + rest)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
