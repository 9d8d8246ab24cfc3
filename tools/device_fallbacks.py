#!/usr/bin/env python3
"""Device timing of the seams' torch fallbacks, beside the kernels they stand in for, at full DSv4-Flash shapes.

When one of our kernels raises inside SGLang (a Triton compile or launch error), the seam answers with a torch path
instead of stopping the server. This script says what that costs, each path checked against the float32 reference:

* **MoE** (``moe_mxfp4.moe_mxfp4_dequantised_forward`` on the repacked experts, T = 1 / 4, B = 1 / 8 / 64):
  - ``fallback_eager``: outside CUDA-graph capture it runs the experts some row chose (``torch.unique``, a host
    sync); timed on the host around whole calls, synchronised, as a server would wait for it;
  - ``fallback_graph``: inside capture (SGLang's decode graphs) it runs every expert over every row; one call per
    graph, L2 flushed before each replay;
  - ``kernel``: ``moe_mxfp4_forward``, one call per graph, L2 flushed before each replay.
* **wo_a** (``fp8_gemv.wo_a_dequantised_einsum``, upstream's bf16 inverse RoPE and bf16 einsum on a transient bf16
  copy of the FP8 weight, against ``grouped_fp8_wo_a`` with the fused RoPE; T = 1 / 4, 1 / 4 / 8 rows), both one call
  per graph after an L2 flush.

    python3 tools/device_fallbacks.py --out $OUT/r --name fallbacks-h200-run1   # on the device (~2 minutes)
    python3 tools/device_fallbacks.py --smoke                                   # CPU interpreter, tiny shapes
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

MOE_BATCHES = (1, 8, 64)
WO_A_ROWS = (1, 4, 8)
TPS = (1, 4)
EAGER_CALLS = 5  # timed eager fallback calls per point (after one untimed call)
KERNEL_REPLAYS = 20
FALLBACK_GRAPH_REPLAYS = 3  # every expert per call: tens of milliseconds each
MAX_POS = 65536
# relative error bounds against the float32 reference: bf16 activations and outputs (the kernels' own tests use
# the same order); a path above its bound is reported as failing and the script exits 1
MOE_MAX_REL_ERR = 1e-2
WO_A_MAX_REL_ERR = 1e-2


def moe_inputs(torch, moe, experts, hidden, inter, batch, device, seed):
    """Checkpoint-layout experts (random e2m1 bytes, E8M0 scales near 2^-6), their repacked copy, and a routing of
    ``batch`` tokens over distinct top-k experts."""
    gen = torch.Generator(device=device).manual_seed(seed)
    w13 = torch.randint(0, 256, (experts, 2 * inter, hidden // 2), dtype=torch.uint8, device=device, generator=gen)
    s13 = torch.randint(118, 126, (experts, 2 * inter, hidden // moe.MXFP4_GROUP), dtype=torch.uint8, device=device,
                        generator=gen)
    w2 = torch.randint(0, 256, (experts, hidden, inter // 2), dtype=torch.uint8, device=device, generator=gen)
    s2 = torch.randint(118, 126, (experts, hidden, inter // moe.MXFP4_GROUP), dtype=torch.uint8, device=device,
                       generator=gen)
    s13, s2 = s13.view(torch.float8_e8m0fnu), s2.view(torch.float8_e8m0fnu)
    w13r, s13r = w13.clone(), s13.clone()
    moe.repack_w13_(w13r, s13r)
    scores = torch.rand(batch, experts, device=device, generator=gen)
    weights, ids = scores.topk(moe.TOP_K, dim=1)
    x = (torch.randn(batch, hidden, device=device, generator=gen) * 2).to(torch.bfloat16)
    return (w13, s13, w2, s2), (w13r, s13r, w2, s2), x, weights.float(), ids.to(torch.int32)


def host_ms(torch, fn, calls: int, smoke: bool) -> tuple[float, list]:
    """Median wall milliseconds of ``calls`` synchronised calls after one untimed call (NaN in the smoke run)."""
    fn()
    if smoke:
        return float("nan"), []
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), [round(s, 3) for s in samples]


def graph_us(db, fn, replays: int, smoke: bool) -> float:
    """Microseconds of one call per CUDA graph, L2 flushed before each replay (NaN in the smoke run)."""
    if smoke:
        fn()
        return float("nan")
    return db.time_in_cuda_graph(fn, calls_per_graph=1, replays=replays, warmup=1)


def run_moe(torch, db, res, args, device, failures) -> None:
    from sglang_sm120.kernels import dsv4
    from sglang_sm120.kernels import moe_mxfp4 as moe

    experts, hidden, base_inter = ((8, 256, 256) if args.smoke
                                   else (dsv4.NUM_EXPERTS, dsv4.HIDDEN_SIZE, dsv4.MOE_INTERMEDIATE_SIZE))
    for tp in ((4,) if args.smoke else TPS):
        inter = base_inter // tp
        for batch in ((1, 3) if args.smoke else MOE_BATCHES):
            ckpt, packed, x, weights, ids = moe_inputs(torch, moe, experts, hidden, inter, batch, device,
                                                       seed=1000 * tp + batch)
            reference = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
            chosen = int(torch.unique(ids).numel())

            def kernel():
                return moe.moe_mxfp4_forward(x, *packed, weights, ids)

            def fallback(all_experts=None):
                return moe.moe_mxfp4_dequantised_forward(x, *packed, weights, ids, all_experts=all_experts)

            errors = {"kernel": db.relative_error(kernel().float(), reference),
                      "fallback_eager": db.relative_error(fallback(all_experts=False).float(), reference),
                      "fallback_graph": db.relative_error(fallback(all_experts=True).float(), reference)}
            kernel_us = graph_us(db, kernel, KERNEL_REPLAYS, args.smoke)
            eager_ms, eager_runs = host_ms(torch, lambda: fallback(all_experts=None), EAGER_CALLS, args.smoke)
            # all_experts=None: inside the capture the forward itself sees it is capturing and takes every expert
            graph_ms = graph_us(db, fallback, FALLBACK_GRAPH_REPLAYS, args.smoke) / 1e3
            for path, ms in (("kernel", kernel_us / 1e3), ("fallback_eager", eager_ms),
                             ("fallback_graph", graph_ms)):
                ok = errors[path] <= MOE_MAX_REL_ERR
                if not ok:
                    failures.append(f"moe T={tp} B={batch} {path}: rel_err {errors[path]:.3g}")
                res.add(part="moe", T=tp, rows=batch, path=path, ms=round(ms, 4),
                        vs_kernel=round(ms / (kernel_us / 1e3), 1) if kernel_us == kernel_us else float("nan"),
                        rel_err=float(f"{errors[path]:.3g}"), ok=ok,
                        note=(f"{chosen} experts chosen; runs {eager_runs} ms" if path == "fallback_eager" else
                              f"all {experts} experts" if path == "fallback_graph" else "moe_mxfp4_forward"))
            print(f"[{time.time() - args.t0:4.0f}s] moe T={tp} B={batch}: kernel {kernel_us:.1f} us, eager "
                  f"{eager_ms:.2f} ms, graph {graph_ms:.2f} ms, errors {errors}", flush=True)
            res.write(args.out)
            del ckpt, packed
            if device == "cuda":
                torch.cuda.empty_cache()


def run_wo_a(torch, db, res, args, device, failures) -> None:
    from sglang_sm120.kernels import dsv4
    from sglang_sm120.kernels import fp8_gemv

    head, rope_dim = (128, 32) if args.smoke else (dsv4.HEAD_DIM, dsv4.ROPE_DIM)
    gen = torch.Generator(device=device).manual_seed(7)
    angles = torch.rand(MAX_POS, rope_dim // 2, device=device, generator=gen) * (2 * math.pi)
    freqs = torch.view_as_real(torch.polar(torch.ones_like(angles), angles)).flatten(1)
    for tp in ((4,) if args.smoke else TPS):
        if args.smoke:
            groups, r, d = 2, 128, 256
        else:
            groups, r, d = dsv4.O_GROUPS // tp, dsv4.O_LORA_RANK, dsv4.dense_linear_shapes(tp)["wo_a"][1]
        weight = (torch.randn(groups, r, d, device=device, generator=gen) * 0.5).to(fp8_gemv.FP8_DTYPE)
        scale = torch.exp2(torch.randint(-10, -5, (groups, r // 128, d // 128), device=device, generator=gen).float())
        for rows in ((1, 3) if args.smoke else WO_A_ROWS):
            o = torch.randn(rows, groups, d, device=device, generator=gen).to(torch.bfloat16)
            positions = torch.randint(0, MAX_POS, (rows,), device=device, generator=gen)
            rope = dict(positions=positions, freqs=freqs, head_dim=head, rope_dim=rope_dim)
            reference = fp8_gemv.reference_grouped_wo_a(o, weight, scale, **rope)
            paths = {"kernel": lambda: fp8_gemv.grouped_fp8_wo_a(o, weight, scale, **rope),
                     "fallback": lambda: fp8_gemv.wo_a_dequantised_einsum(o, weight, scale, **rope)}
            kernel_us = float("nan")
            for path, fn in paths.items():
                err = db.relative_error(fn().float(), reference)
                us = graph_us(db, fn, KERNEL_REPLAYS, args.smoke)
                kernel_us = us if path == "kernel" else kernel_us
                ok = err <= WO_A_MAX_REL_ERR
                if not ok:
                    failures.append(f"wo_a T={tp} M={rows} {path}: rel_err {err:.3g}")
                res.add(part="wo_a", T=tp, rows=rows, path=path, ms=round(us / 1e3, 4),
                        vs_kernel=round(us / kernel_us, 1) if kernel_us == kernel_us else float("nan"),
                        rel_err=float(f"{err:.3g}"), ok=ok,
                        note="grouped_fp8_wo_a (fused RoPE)" if path == "kernel" else
                        "bf16 inverse RoPE + bf16 einsum on a transient bf16 weight")
                print(f"[{time.time() - args.t0:4.0f}s] wo_a T={tp} M={rows} {path}: {us:.2f} us, rel_err {err:.3g}",
                      flush=True)
            res.write(args.out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default="fallbacks-h200-run1")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter run at tiny shapes, no timing")
    parser.add_argument("--only", choices=("moe", "wo_a"), default=None)
    args = parser.parse_args()
    args.t0 = time.time()

    import torch

    from sglang_sm120.kernels.harness import devicebench as db

    if args.smoke:
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()  # the interpreter's bf16 tl.dot is wrong without it
    device = "cpu" if args.smoke else "cuda"
    res = db.BenchResult(args.name, "The seams' torch fallbacks (taken when a kernel raises) beside the kernels, "
                         "full DSv4-Flash shapes", ["part", "T", "rows", "path", "ms", "vs_kernel", "rel_err", "ok",
                                                     "note"])
    res.notes.append("kernel / fallback_graph / wo_a paths: one call per CUDA graph, L2 flushed before each replay "
                     f"(median of {KERNEL_REPLAYS} replays, {FALLBACK_GRAPH_REPLAYS} for the MoE fallback_graph); "
                     f"fallback_eager: median wall time of {EAGER_CALLS} synchronised eager calls (its torch.unique "
                     "syncs the host). rel_err: against the float32 reference of the same inputs.")
    failures: list[str] = []
    if args.only in (None, "moe"):
        run_moe(torch, db, res, args, device, failures)
    if args.only in (None, "wo_a"):
        run_wo_a(torch, db, res, args, device, failures)
    if failures:
        res.notes.append("FAILED: " + "; ".join(failures))
    res.finish(args.out, args.t0)
    if failures:
        print("FAILED:", *failures, sep="\n  ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
