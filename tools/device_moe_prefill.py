#!/usr/bin/env python3
"""Device run for the MoE prefill grouped GEMM (kernels/moe_prefill.py, issue 4's prefill target), full shapes.

    python3 tools/device_moe_prefill.py --out $OUT [--name N] [--deadline-s 200] [--t 1 2 4 8] [--tokens 512 1024 4096]
                                        [--decode-pairs]
                                                                        # device (carry .upstream for upstream)
    python3 tools/device_moe_prefill.py --smoke                         # CPU interpreter, tiny shapes

At T = 1 and 4 (per-rank I = 2048 / 512), 4096 prefill tokens, 256 experts, H = 4096, top-6 (24576 routed rows):
the bf16 matmul rate (8192^3) and the copy bandwidth of this run; the old path (``moe_mxfp4_forward``, whose
tl.dot_scaled prefill tiles run above DECODE_MAX_ROWS); ``moe_mxfp4_prefill_forward`` with its default tiles;
upstream SGLang's Triton ``fused_moe_kernel`` on the experts dequantised to bf16 (loader and glue of
tools/device_moe_mxfp4.py, when ``.upstream`` is there); then a sweep of gate/up tiles (with one fixed down tile)
and of down tiles (with one fixed gate/up tile), and the pair of the fastest of each. Every row is a whole
forward, checked against the float32 reference (``reference_moe_mxfp4``) and timed in a CUDA graph.
Rows are written after each one, so a timeout keeps what was measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    import os

    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# device_moe_mxfp4 (layer/routing makers, upstream loader and glue) runs ensure_kernels_importable() on import;
# a second call fails on the device, where sglang_sm120 is the stand-in module it creates
import device_moe_mxfp4 as dm  # noqa: E402
import torch  # noqa: E402

from sglang_sm120.kernels import moe_mxfp4 as moe  # noqa: E402
from sglang_sm120.kernels import moe_prefill as mp  # noqa: E402
from sglang_sm120.kernels.dsv4 import HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, NUM_EXPERTS, SWIGLU_LIMIT, TOP_K  # noqa: E402

P = mp.PrefillConfig
# the tl.dot_scaled GEMM pair that ran every prefill before moe_prefill (moe_mxfp4_forward's default above
# DECODE_MAX_ROWS until PREFILL_DEFAULT_WHERE took it over)
OLD_PATH = "old path (moe_mxfp4_forward, tl.dot_scaled)"
SEAM_DEFAULT = "forward default (moe_mxfp4_forward as the seam calls it)"
DECODE_PAIRS = "decode pairs (moe_mxfp4_forward, upcast='pairs', the decode's largest-batch tiles)"
# round 21: the 16-row down tile beside the B = 256 tiles' 8-row one (an expert gets ~9-12 rows at 1800-3072 routed rows)
DECODE_PAIRS_DOWN16 = "decode pairs, down 16 rows per pass"
DECODE_TLDOT = "decode tl.dot (moe_mxfp4_forward's default up to DECODE_MAX_ROWS before round 21)"
DECODE_PAIRS_ROWS = 256 * TOP_K  # the largest batch the issue times the decode at (B = 256)
# gate/up tiles, each with DOWN_PARTNER; down tiles, each with GATE_UP_PARTNER. Every tile here compiles for
# sm_120a within 101376 B of shared memory and without spills (the AOT check). Run 1b also measured tl.dot_scaled
# upcasts, the expert-slot-fastest grid and multiply-placed nibble pairs; they lost and were removed.
DOWN_PARTNER = mp.DEFAULT_DOWN
GATE_UP_PARTNER = mp.DEFAULT_GATE_UP
GATE_UP_SWEEP = [  # most telling first: a deadline cuts the tail
    P(128, 64, 64, 8, 4),
    P(64, 64, 64, 4, 3),
]
DOWN_SWEEP = [
    P(128, 128, 64, 8, 3),
    P(128, 128, 64, 8, 4),
    P(64, 128, 64, 4, 3),
]


def parse_label(label: str) -> mp.PrefillConfig:
    """A tile from its ``PrefillConfig.label()``: ``m128n64k64w8s3``, ``...r128`` with a register cap, ``...p`` on
    byte planes."""
    import re

    m = re.fullmatch(r"m(\d+)n(\d+)k(\d+)w(\d+)s(\d+)(?:r(\d+))?(p?)", label)
    if not m:
        raise SystemExit(f"not a tile label: {label}")
    *sizes, cap, planes = m.groups(default="0")
    return P(*(int(g) for g in sizes), max_registers=int(cap), planes=planes == "p")


SMOKE_GATE_UP = [P(32, 32, 64, 4, 2)]
SMOKE_DOWN = [P(32, 64, 64, 4, 2)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default=None, help="result file name (default moe_prefill-<card>, e.g. -h200)")
    parser.add_argument("--gate-up", nargs="*", help="gate/up tile labels to sweep instead of GATE_UP_SWEEP")
    parser.add_argument("--down", nargs="*", help="down tile labels to sweep instead of DOWN_SWEEP")
    parser.add_argument("--partners", nargs=2, metavar=("GATE_UP", "DOWN"),
                        help="the fixed gate/up tile of the down sweep and the fixed down tile of the gate/up sweep")
    parser.add_argument("--t", type=int, nargs="*", help="tensor-parallel sizes (default 1 4)")
    parser.add_argument("--tokens", type=int, nargs="*",
                        help="prefill token counts (default 4096); the sweeps and upstream run at the largest only")
    parser.add_argument("--decode-pairs", action="store_true",
                        help="also time the forward as the seam calls it, up to DECODE_MAX_ROWS the tl.dot decode "
                             "(the default there before round 21) and, up to PAIRS_MAX_ROWS routed rows, the pairs "
                             "decode with the tiles the decode uses at B = 256 (and with a 16-row down tile): where the "
                             "decode path should hand over to the grouped GEMM")
    parser.add_argument("--pairs-max-rows", type=int, default=None,
                        help="experiment: with --decode-pairs, raise the pairs decode's row limit "
                             "(moe_mxfp4.PAIRS_MAX_ROWS: its routing sorts in one program) to this many routed rows")
    parser.add_argument("--deadline-s", type=float, default=200.0,
                        help="start no sweep row after this many seconds (the rows before it are kept)")
    args = parser.parse_args()
    from sglang_sm120.kernels.harness.devicebench import (
        BenchResult, bf16_matmul_tflops, copy_bandwidth_gbs, gpu_tag, relative_error, time_in_cuda_graph)

    t_start = time.time()
    if args.pairs_max_rows:
        moe.PAIRS_MAX_ROWS = args.pairs_max_rows  # pairs_launches' limit; the default dispatch table stays as built
    if args.smoke:
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()
        device, num_experts, hidden, token_counts, base_inter = "cpu", 8, 256, (48,), 256
        tps, gu_sweep, dn_sweep = (2,), SMOKE_GATE_UP, SMOKE_DOWN
        down_partner = gate_up_partner = P(16, 32, 64, 4, 2)
    else:
        device, num_experts, hidden, token_counts, base_inter = ("cuda", NUM_EXPERTS, HIDDEN_SIZE, (4096,),
                                                                 MOE_INTERMEDIATE_SIZE)
        tps, gu_sweep, dn_sweep = (1, 4), GATE_UP_SWEEP, DOWN_SWEEP
        down_partner, gate_up_partner = DOWN_PARTNER, GATE_UP_PARTNER
        if args.gate_up is not None:
            gu_sweep = [parse_label(label) for label in args.gate_up]
        if args.down is not None:
            dn_sweep = [parse_label(label) for label in args.down]
        if args.partners:
            gate_up_partner, down_partner = (parse_label(label) for label in args.partners)
        if args.t:
            tps = tuple(args.t)
        if args.tokens:
            token_counts = tuple(sorted(args.tokens))

    def timed(fn) -> float:
        if args.smoke:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
        return time_in_cuda_graph(fn, calls_per_graph=3, replays=5, warmup=1)

    copy_gbs = 0.0 if args.smoke else copy_bandwidth_gbs()
    mm_tflops = 0.0 if args.smoke else bf16_matmul_tflops()
    card = gpu_tag()
    result = BenchResult(name=args.name or f"moe_prefill-{card}",
                         title=f"MoE prefill grouped GEMM (MXFP4 experts, 4096 tokens), {card.upper()}",
                         columns=["T", "tokens", "path", "gate_up", "down", "us", "TFLOP/s", "%bf16mm", "vs_old",
                                  "rel_err"])
    result.extra.update({"copy bandwidth (GB/s, read+write)": round(copy_gbs, 1),
                         "bf16 matmul (TFLOP/s, 8192^3)": round(mm_tflops, 1)})
    print(f"copy {copy_gbs:.1f} GB/s, bf16 mm {mm_tflops:.1f} TFLOP/s", flush=True)

    kernel_mod = tables = None
    try:
        import json

        import triton
        import upstream

        kernel_mod = upstream.load(dm.UPSTREAM_KERNEL)
        for name in ("write_zeros_to_output", "fused_moe_kernel"):  # extract_functions keeps no decorators
            if not isinstance(getattr(kernel_mod, name), triton.runtime.JITFunction):
                setattr(kernel_mod, name, triton.jit(getattr(kernel_mod, name)))
        tables = json.loads((upstream.UPSTREAM_DIR / dm.UPSTREAM_CONFIGS).read_text())
    except Exception as exc:  # no .upstream: the run goes on without that baseline
        result.notes.append(f"upstream baseline not loaded: {type(exc).__name__}: {str(exc)[:200]}")

    for tp, tokens in [(tp, tokens) for tp in tps for tokens in token_counts]:
        largest = tokens == token_counts[-1]
        inter = base_inter // tp
        layer = dm.make_layer(num_experts, hidden, inter, device, seed=100 * tp)
        ckpt = [t.clone() for t in layer]
        moe.repack_w13_(layer[0], layer[1])
        x, weights, ids = dm.make_routing(tokens, num_experts, hidden, device, seed=7 + tp)
        ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
        flops = 2 * tokens * TOP_K * (2 * inter * hidden + hidden * inter)
        times = {}

        def record(path, fn, gu="", dn=""):
            try:
                err = relative_error(fn(), ref)
                us = timed(fn)
            except Exception as exc:  # one failing candidate must not lose the run
                result.notes.append(f"T={tp} {path} {gu} {dn}: {type(exc).__name__}: {str(exc)[:300]}")
                print("FAILED", tp, path, gu, dn, exc, flush=True)
                return None
            tflops = flops / (us * 1e-6) / 1e12
            times[(path, gu, dn)] = us
            old = times.get((OLD_PATH, "", ""))
            result.add(T=tp, tokens=tokens, path=path, gate_up=gu, down=dn, us=us, rel_err=err, vs_old=(old / us) if old else 1.0,
                       **{"TFLOP/s": tflops, "%bf16mm": 100 * tflops / mm_tflops if mm_tflops else 0.0})
            print(f"T={tp} tokens={tokens} {path} {gu} {dn}: {us:.1f} us {tflops:.1f} TFLOP/s err {err:.3g} "
                  f"[{time.time() - t_start:.0f} s]", flush=True)
            result.extra["wall seconds"] = round(time.time() - t_start, 1)
            result.write(args.out)
            return us

        def ours(cfg):
            return lambda: mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, SWIGLU_LIMIT, config=cfg)

        record(OLD_PATH, lambda: moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT, upcast="dot_scaled"))
        if args.decode_pairs:
            rows = tokens * TOP_K
            seam = moe.default_upcast(rows, inter)
            seam_tiles = moe.pairs_configs(rows, inter, device=device) if seam == moe.PAIRS else ("", "")
            record(f"{SEAM_DEFAULT}: {seam}", lambda: moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT),
                   *(tile.label() if tile else "" for tile in seam_tiles))
            if rows <= moe.DECODE_MAX_ROWS:
                up = moe.default_gemm_upcast(rows, inter)
                record(f"{DECODE_TLDOT}: {up}",
                       lambda: moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT, upcast=up))
            pairs_tiles = moe.pairs_configs(min(rows, DECODE_PAIRS_ROWS), inter)
            down16 = (pairs_tiles[0], dataclasses.replace(pairs_tiles[1], block_m=16))
            if rows <= moe.PAIRS_MAX_ROWS:  # the pairs decode's routing sorts in one program
                for path, tiles in ((DECODE_PAIRS, pairs_tiles), (DECODE_PAIRS_DOWN16, down16)):
                    if tiles == seam_tiles or (path == DECODE_PAIRS_DOWN16 and tiles == pairs_tiles):
                        continue  # the same forward as a row above
                    record(path, lambda tiles=tiles: moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT,
                                                                           upcast="pairs", configs=tiles),
                           *(tile.label() for tile in tiles))
        gu0, dn0 = mp.prefill_configs(tokens * TOP_K, inter, device)
        record("new default", ours(None), gu0.label(), dn0.label())
        if kernel_mod is not None and largest:
            w13_bf16 = dm.dequant_all_bf16(ckpt[0], ckpt[1])
            w2_bf16 = dm.dequant_all_bf16(ckpt[2], ckpt[3])
            record("upstream triton (bf16 experts)",
                   lambda: dm.upstream_fused_experts(kernel_mod, tables, x, w13_bf16, w2_bf16, weights, ids,
                                                     SWIGLU_LIMIT))
            del w13_bf16, w2_bf16
        deadline = args.deadline_s * (0.75 if tp == tps[0] and len(tps) > 1 else 1.0)
        gu_cands, dn_cands = (gu_sweep, dn_sweep) if largest else ((), ())
        best_gu, best_dn = {}, {}
        if ("new default", gu0.label(), dn0.label()) in times:  # the default is in both sweeps
            best_gu[gu0] = best_dn[dn0] = times[("new default", gu0.label(), dn0.label())]
        for cand in gu_cands:
            if time.time() - t_start > deadline:
                result.notes.append(f"T={tp}: gate/up sweep stopped at the deadline before {cand.label()}")
                break
            if (cand, down_partner) == (gu0, dn0):  # the default row above
                continue
            us = record("sweep gate/up", ours((cand, down_partner)), cand.label(), down_partner.label())
            if us is not None:
                best_gu[cand] = us
        for cand in dn_cands:
            if time.time() - t_start > deadline:
                result.notes.append(f"T={tp}: down sweep stopped at the deadline before {cand.label()}")
                break
            if (gate_up_partner, cand) == (gu0, dn0):
                continue
            us = record("sweep down", ours((gate_up_partner, cand)), gate_up_partner.label(), cand.label())
            if us is not None:
                best_dn[cand] = us
        if best_gu and best_dn:
            g, d = min(best_gu, key=best_gu.get), min(best_dn, key=best_dn.get)
            if (g, d) != (gu0, dn0) and time.time() - t_start < deadline + 20:
                record("fastest of each sweep", ours((g, d)), g.label(), d.label())
        del layer, ckpt
        if device == "cuda":
            torch.cuda.empty_cache()

    result.notes.append("every row is a whole forward (routing, [x pair copy], gate/up, down, top-k sum) timed in a "
                        "CUDA graph (3 calls per graph, median of 5 replays) and checked against reference_moe_mxfp4")
    result.notes.append("tile labels: m block_m (routed rows, the MMA's N side), n block_n (output columns; gate/up: "
                        "SwiGLU columns = 2n weight rows, the MMA's M side), k block_k, w warps, s stages")
    result.finish(args.out, t_start)


if __name__ == "__main__":
    main()
