#!/usr/bin/env python3
"""Device run: the bf16 GEMV (kernels/bf16_gemv.py) on DSv4-Flash's replicated bf16 projections beside
upstream SGLang 0.5.23's calls for them, in the same run, each in CUDA graphs over rotated weight copies.

    python3 tools/device_bf16_gemv.py --out $OUT               # on the device (no upstream code needed)
    TRITON_INTERPRET=1 python3 tools/device_bf16_gemv.py --smoke --out DIR   # CPU: the logic, reduced N, K

Upstream's calls, as sglang 0.5.23 makes them (sglang/kernels/ops/gemm/bf16_fp32.py and
srt/layers/attention/dsv4/{compressor,indexer}.py): the compressors' ``linear_bf16_fp32`` is
``torch.mm(x, W.t(), out_dtype=torch.float32)`` (cuBLAS) unless an opt-in HPC-Ops / DeepGEMM algorithm is
set; ``weights_proj`` is an unquantised ``ReplicatedLinear``, ``F.linear`` in bf16 (cuBLAS).
Every variant is checked against the float32 reference before it is timed. Rows: 1, 2, 4, 8 (the GEMV's range)
and 16 (upstream only past it: where the seam hands back).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

ROWS = (1, 2, 4, 8)
UPSTREAM_ONLY_ROWS = (16,)
ROTATE_BYTES = 256 * 2**20  # weight copies per graph: together past the H200's 60 MB L2 (and any sm_12x L2)
F32_TOL = 1e-5
BF16_TOL = 2 ** -8


def variants(g, m, n, k, sms, pdl):
    """The default tile, and the same with other weight rows per program and pipeline depths; the SM-sharing tile
    where it differs."""
    base = g.default_config(m, n, k, sms, pdl=pdl)
    out = {"default": base}
    for stages in (1, 3):
        out[f"st{stages}"] = dataclasses.replace(base, num_stages=stages)
    for block_n in (base.block_n * 2, base.block_n // 2):
        if 1 <= block_n <= 8:
            out[f"n{block_n}"] = g.tile(base.block_m, block_n, k, pdl)
    if base.block_k < min(g.MAX_BLOCK_K, k):  # the longer K step (one-row forms: spills on sm_120a, not on sm_90)
        out["k2x"] = dataclasses.replace(base, block_k=2 * base.block_k)
    if base.num_warps != g.NUM_WARPS:  # the one-row 8-warp tile on 4 warps (spills on sm_120a, not on sm_90)
        out["w4"] = dataclasses.replace(base, num_warps=g.NUM_WARPS)
    if pdl:
        out["nopdl"] = dataclasses.replace(base, pdl=False)
    if base.w_before_wait:  # round 31's one-step form: the looping tile it replaced (the weight after the wait)
        out["loop"] = g.tile(base.block_m, base.block_n, k, pdl, w_before_wait=False)
    shared = g.default_config(m, n, k, sms, pdl=pdl, share_sms=True)
    if shared != base:  # the SM-sharing tile (SHARING_BLOCK_N), timed alone here (it ships for the layer)
        out["share"] = shared
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default="bf16_gemv-h200-run1")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter: N <= 64, K = 256, nothing timed")
    parser.add_argument("--rows", type=int, nargs="+", default=None,
                        help="row counts to run (default: 1 2 4 8, and 16 for upstream only)")
    parser.add_argument("--router-gate", action="store_true",
                        help="also the router gate [256, 4096] (fp32 out; the bench's stand-in in both paths; "
                             "SGLang's own tiny_gemm_bf16 does not run here, torch.mm stands in for the upstream row)")
    args = parser.parse_args()
    t_start = time.time()

    import torch

    from sglang_sm120.kernels import bf16_gemv as g
    from sglang_sm120.kernels.dsv4 import BF16_LINEAR_SHAPES, ROUTER_GATE_SHAPE
    from sglang_sm120.kernels.harness.devicebench import (BenchResult, copy_bandwidth_gbs, relative_error,
                                                          time_rotating_calls)
    from sglang_sm120.kernels.pdl import pdl_supported

    device = torch.device("cpu" if args.smoke else "cuda")
    dry = args.smoke
    sms = g.sm_count(device)
    pdl = g.USE_PDL and pdl_supported(device)
    copy = float("nan") if dry else copy_bandwidth_gbs()
    result = BenchResult(
        name=args.name, title="bf16 GEMV on DSv4-Flash's replicated bf16 projections vs upstream's cuBLAS calls",
        columns=["linear", "N", "K", "M", "MB", "path", "config", "us", "pct_copy", "vs_upstream", "rel_err"])
    result.extra.update({"copy_bandwidth_GBps": round(copy, 1), "sms": sms, "pdl": pdl,
                         "timing": "one CUDA graph calling rotated weight copies (>= 256 MiB in all), after an L2 "
                                   "flush; us per call"})
    gen = torch.Generator().manual_seed(0)
    shapes = dict(BF16_LINEAR_SHAPES, **({"router_gate": ROUTER_GATE_SHAPE} if args.router_gate else {}))
    row_counts = tuple(args.rows) if args.rows else (*ROWS, *UPSTREAM_ONLY_ROWS)
    for name, (n, k) in shapes.items():
        if dry:
            n, k = min(n, 64), 256
        out_dtype = torch.bfloat16 if name == "weights_proj" else torch.float32
        copies = 1 if dry else max(2, -(-ROTATE_BYTES // (n * k * 2)))
        weights = [(0.02 * torch.randn(n, k, generator=gen)).to(torch.bfloat16).to(device) for _ in range(copies)]
        mb = n * k * 2 / 1e6
        for m in row_counts:
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device)
            ref = g.reference_bf16_linear(x, weights[0])

            def upstream_call(w):
                if out_dtype == torch.float32:
                    return lambda: torch.mm(x, w.t(), out_dtype=torch.float32)
                return lambda: torch.nn.functional.linear(x, w)
            ups_us = float("nan")
            if not dry:
                ups_err = relative_error(upstream_call(weights[0])(), ref)
                ups_us = time_rotating_calls([upstream_call(w) for w in weights])
                result.add(linear=name, N=n, K=k, M=m, MB=round(mb, 2), path="upstream",
                           config="torch.mm out fp32" if out_dtype == torch.float32 else "F.linear bf16",
                           us=ups_us, pct_copy=round(100 * 2 * n * k / (ups_us * 1e-6) / 1e9 / copy, 1),
                           rel_err=ups_err)
            if m > g.MAX_ROWS:
                continue
            for label, cfg in variants(g, m, n, k, sms, pdl).items():
                def ours(w, cfg=cfg):
                    return lambda: g.bf16_linear(x, w, out_dtype=out_dtype, config=cfg)
                err = relative_error(ours(weights[0])(), ref)
                tol = F32_TOL if out_dtype == torch.float32 else BF16_TOL
                if not err < tol:
                    print(f"FAILED check {name} M={m} {label}: rel_err {err:.3g}", file=sys.stderr)
                    result.add(linear=name, N=n, K=k, M=m, MB=round(mb, 2), path=f"ours:{label}", config=cfg.name,
                               rel_err=err)
                    continue
                us = time_rotating_calls([ours(w) for w in weights], dry_run=dry)
                result.add(linear=name, N=n, K=k, M=m, MB=round(mb, 2), path=f"ours:{label}", config=cfg.name,
                           us=us, pct_copy=round(100 * 2 * n * k / (us * 1e-6) / 1e9 / copy, 1) if not dry else None,
                           vs_upstream=round(ups_us / us, 3) if not dry else None, rel_err=err)
            print(f"[{time.time() - t_start:6.1f}s] {name} M={m} done", flush=True)
    result.notes.append("pct_copy: weight bytes / time over the eager copy bandwidth of this run (read + write).")
    result.notes.append("ours:default is what the seam runs; the other ours rows are tile variants of it.")
    result.finish(args.out, t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
