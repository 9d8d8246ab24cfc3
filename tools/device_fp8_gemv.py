#!/usr/bin/env python3
"""Device check and timing of the block-FP8 GEMV (``sglang_sm120.kernels.fp8_gemv``) at full DSv4 shapes.

For each of the seven dense FP8 linears (``dsv4.dense_linear_shapes(T)``, T in 1, 2, 4, 8; the
replicated wqkv_a / indexer wq_b once) and each row count M in 1, 2, 4, 8, 16, in one run:

* checks every launch form against the float32 reference (relative error);
* times the previous default launch form (``old_default_config`` below: 1-row FMA form at M=1,
  16-row tensor-core tiles above), the rows form (``GemvConfig(rows_form=True)``: up to 8 rows share
  each dequantised weight chunk on CUDA cores) in a handful of variants, the current
  ``default_config``, a bf16 matmul on the dequantised weight and the fastest FP8 matmul torch
  offers here (GEMM only, activation pre-quantised) plus upstream's quant kernel + that GEMM; for
  wo_a, upstream's ``_apply_wo_a_bf16_matmul`` (bf16 einsum, extracted by ``--prepare``) and the
  fused-inverse-RoPE forms;
* measures the eager copy bandwidth of the same run (``copy_bandwidth_gbs``).

L2: each CUDA graph makes one call per distinct weight copy, with enough copies that they total
more than ROTATE_BYTES (200 MiB, four times the H200's 50 MB L2), so every call streams its weight
from HBM (only the small activation stays in L2, as it would in a decode step). ``--smoke`` runs
the logic on the CPU under the Triton interpreter at tiny shapes (no timing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

UPSTREAM_FILE = "dsv4_wo_a.py"
UPSTREAM_QUANT_FILE = "fp8_group_quant.py"
ROWS = (1, 2, 4, 8, 16)
TPS = (1, 2, 4, 8)
ROTATE_BYTES = 200 * 2**20  # distinct weight copies per graph: > 4x the 50 MB L2, every call from HBM
RUN_NAME = "fp8_gemv-h200-run3"
DOT_RUN_NAME = "fp8_gemv-h200-run4-dot"  # --dot-sweep: tensor-core form variants at 4..16 rows
XB_RUN_NAME = "fp8_gemv-h200-run5"  # --xb-sweep: x_broadcast rows variants vs the run-3 defaults
XB_ROWS, XB_TPS = (1, 2, 4, 8), (1, 4)
Q8_RUN_NAME = "fp8_gemv-h200-run6"  # --q8-sweep: FP8 tensor-core form (split activation) vs the defaults
Q8J_RUN_NAME = "fp8_gemv-h200-run6b"  # --q8j-sweep: joined split, stages, unroll, 128-col tiles
Q8_ROWS, Q8_TPS = (1, 2, 4, 8, 16), (1, 4, 2, 8)
CHAIN_RUN_NAME = "fp8_gemv-h200-run7-chain"  # --chain-final: chained FP8 MMAs vs the defaults
CHAIN_ROWS, CHAIN_LINEARS = (1, 2, 4, 8), ("wo_a", "wq_b", "wo_b")  # at T=1
PDL_RUN_NAME = "fp8_gemv-h200-run8-pdl"  # --pdl-sweep: programmatic dependent launch on vs off
PDL_MIXED_ROWS = (1, 8)  # T=1: each GEMV followed by a plain (non-PDL) torch kernel
PDL2_RUN_NAME = "fp8_gemv-h200-run9-pdl"  # --pdl2-sweep: run 8's PDL defaults, late trigger, 2-row prefetch
PDL2_MIXED_ROWS = (1, 2, 8)  # every T
TMA_RUN_NAME = "fp8_gemv-h200-run11-tma"  # --tma-sweep: the weight stream by TMA beside the defaults, T=1
TMA_ROWS = {"wo_a": (1, 2, 4, 8), "wq_b": (1, 2, 4, 8), "wo_b": (1, 2, 4, 8), "shared_down": (1, 2, 8),
            "wqkv_a": (1, 2, 8)}
# --tma2-sweep (run 11b): run 11's leads -- 64-column FMA tiles by TMA at 1 row, the FP8 tile by TMA with the fused
# inverse RoPE on wo_a at every T -- and the M=4 points run 11 missed; (linear, T) -> rows
TMA2_RUN_NAME = "fp8_gemv-h200-run11b-tma"
TMA2_POINTS = {("wo_a", 1): (1, 2, 3, 4, 8), ("wo_a", 2): (1, 2, 4, 8), ("wo_a", 4): (1, 2, 4, 8),
               ("wo_a", 8): (1, 2, 4, 8), ("wo_b", 1): (1, 4), ("wq_b", 1): (1, 4), ("shared_gate_up", 1): (1,),
               ("shared_down", 1): (1,), ("wqkv_a", 1): (1,)}
# --run12-sweep (run 12): wo_a T=1 at 2..8 rows (target <= 12 us) and wo_b T=1 (the same 32 MiB, K >= 4096 shapes):
# the FP8 tile with fewer / longer programs (split-K), deeper TMA pipelines and the L2 prefetch, and the CUDA-core
# forms of the winning 1-row tile (64 columns by TMA, its K split) with 2 / 4 / 8 rows sharing each weight chunk
RUN12_NAME = "fp8_gemv-h200-run12"
RUN12_POINTS = {("wo_a", 1): (2, 3, 4, 8), ("wo_b", 1): (2, 8)}
# --run13-sweep (run 13): persistent forms (GemvConfig.persistent_programs_per_sm: SMs x n programs looping over the
# (tile, K split) work items, the FP8 tile's work-item loop flattened into its K loop) beside the defaults, T=1
RUN13_NAME = "fp8_gemv-h200-run13"
RUN13_POINTS = {("wo_a", 1): (1, 2, 3, 4, 8), ("wo_b", 1): (1, 2, 8), ("wq_b", 1): (1, 2, 8)}

# --run15-sweep (run 15): wo_a T=1 at 2 / 4 / 8 rows (target <= 12 us) on the FP8 tile: ring stages, K split, warps,
# K blocks per iteration (2 / 4: with 1 stage the weight loads of a program's whole split issued at once, into
# registers), and lighter split-K sums (partials loaded in batches, or fp32 atomics into a zeroed tile); T=2 at 4 / 8
# rows (the same tile without PDL, 4 groups) for a few of them
RUN15_NAME = "fp8_gemv-h200-run15"
RUN15_POINTS = {("wo_a", 1): (2, 4, 8), ("wo_a", 2): (4, 8)}
# --run15b-sweep (run 15b): run 15's leads combined -- the fp32-atomic split-K sum, 4 warps, the one-shot 4-block
# program on 4 warps -- on the cp.async and TMA (fused-RoPE) forms, the fused RoPE timed at T=2 too
RUN15B_NAME = "fp8_gemv-h200-run15b"
# --run17-sweep (run 17): wo_a as the dense seam runs it (T=1, 1..8 rows, the inverse RoPE fused) and without the RoPE:
# the RoPE's cos / sin loaded once per program before the K loop (GemvConfig.rope_hoist, branch-free rotation) on the
# current forms and on the plain defaults; without the RoPE the FP8 tile with evict-first weight loads and 64-column
# tiles with long K splits (2 / 4); T=2 at 4 / 8 rows as a check
RUN17_NAME = "fp8_gemv-h200-run17"
RUN17_POINTS = {("wo_a", 1): (1, 2, 4, 8), ("wo_a", 2): (4, 8)}
# --run17b-sweep (run 17b): run 17's lead (1 row: the plain 64-column TMA tile with hoisted RoPE factors) again, and on
# the FP8 tile the split's rotated rope block loaded before the K loop (rp: GemvConfig.rope_preload) or the rope block
# known at compile time in the one-shot program (rs: GemvConfig.rope_static); same points
RUN17B_NAME = "fp8_gemv-h200-run17b"
# --run18-sweep (run 18): the fixed cost of small GEMVs at 1 row (and 2 / 8 rows on the small weights): the split-K
# sum loading 8 partials per step on the FMA / rows forms (sb8), and the rows form whose whole K split is one chunk
# loaded with its scales before the PDL wait (GemvConfig.one_chunk): without split-K (no partials, no ticket) on 8 / 16
# columns and 4 / 8 warps, and with the split choose_split picks (16 / 32 columns); plus the floor of a PDL chain of
# trivial kernels. Points in order of importance (the time budget may cut the tail)
RUN18_NAME = "fp8_gemv-h200-run18"
RUN18_POINTS = {("wqkv_a", 1): (1, 2, 8), ("shared_down", 1): (1, 2, 8), ("indexer_wq_b", 1): (1,),
                ("shared_gate_up", 1): (1, 2), ("wo_a", 1): (1,), ("wo_b", 1): (1,), ("wq_b", 1): (1,),
                ("wo_b", 8): (1,), ("shared_gate_up", 8): (1,), ("wq_b", 8): (1,)}
ONE_CHUNK_MAX_BYTES_PER_THREAD = 256  # raw FP8 weight a thread holds across the wait (64 registers)
# --run18b-sweep (run 18b): run 18's lead as a rule (fp8_gemv._one_chunk_config: weights <= 8 MiB at 1..2 rows) beside
# the default without it, and the other one-chunk tiles, at every distinct <= 8 MiB DSv4 shape (T = 1, 2, 4, 8); wo_a
# with the fused RoPE as the seam runs it at 1..2 rows
RUN18B_NAME = "fp8_gemv-h200-run18b"
# --run19-sweep (run 19): the 33.5 MB weights at T=1 (wo_a at 1..8 rows with the fused RoPE as the seam runs it, wo_b,
# wq_b): the one-shot FP8 program with its weight loaded before the PDL wait (GemvConfig.w_before_wait), 64-column and
# 8-warp variants; wo_a first (the issue's <= 12 us target)
RUN19_NAME = "fp8_gemv-h200-run19"
RUN19_POINTS = {("wo_a", 1): (2, 8, 4, 1), ("wo_b", 1): (8, 2, 1), ("wq_b", 1): (8, 1)}
# --run42-sweep (run 42): the 33.5 MB weights at T=1, 1 row (wo_a plain and with the fused RoPE as the seam runs it,
# wo_b, wq_b): the one-chunk rows form with its activation first (X_FIRST) split over K, each split one chunk of B
# blocks on N columns and W warps, beside the shipped forms (wq_b's is that form without a split since round 31)
RUN42_NAME = "fp8_gemv-h200-run42"
RUN42_POINTS = {("wo_a", 1): (1,), ("wo_b", 1): (1,), ("wq_b", 1): (1,)}
RUN42_TILES = ((16, 8, 4), (8, 16, 4), (16, 16, 8), (32, 8, 8), (8, 8, 4), (16, 4, 4), (32, 4, 4), (8, 32, 8))
# --run43-sweep (run 43, stop 43): the weights of at most 8 MiB (every DSv4 linear at T >= 4, the replicated and small
# ones at T = 1 / 2) at 4 and 8 rows, where default_config runs the 16-row bf16 tensor-core tile (no PDL above 4 MiB),
# against the one-chunk rows form at those rows (GemvConfig.one_chunk: measured at 1..2 rows only, runs 18 / 18b; the
# looping rows form lost at 4+ rows in run 3, before PDL and the one-chunk form), and the bf16 tile with PDL. T=4
# (the README's launch) first. Result: faster alone at 3..8 rows on small weights, slower inside the layers (layer
# variants runs 53 / 54): not shipped (fp8_gemv's comment at ONE_CHUNK_MAX_ROWS)
RUN43_NAME = "fp8_gemv-run43"
RUN43_ROWS = (4, 8)
RUN43_POINTS = {**{(name, 4): RUN43_ROWS for name in ("wo_a", "wo_b", "wq_b", "shared_gate_up", "shared_down",
                                                      "wqkv_a", "indexer_wq_b")},
                **{(name, 8): RUN43_ROWS for name in ("wo_a", "wo_b", "wq_b", "shared_gate_up", "shared_down")},
                ("shared_down", 2): RUN43_ROWS, ("shared_gate_up", 2): RUN43_ROWS}
RUN43_TILES = ((8, 8), (16, 8), (8, 4), (16, 4), (32, 4), (32, 8))  # (block_n, num_warps) of the one-chunk form
RUN18B_POINTS = {("wqkv_a", 1): (1, 2), ("shared_down", 1): (1, 2), ("indexer_wq_b", 1): (1, 2),
                 ("shared_gate_up", 8): (1, 2), ("wo_b", 8): (1, 2), ("wo_a", 8): (1, 2), ("wo_a", 4): (1, 2),
                 ("shared_gate_up", 4): (1, 2), ("shared_gate_up", 2): (1, 2), ("shared_down", 4): (1, 2),
                 ("shared_down", 8): (1, 2)}


def prepare() -> None:
    import upstream

    preamble = (
        "from __future__ import annotations\nimport torch\n"
        "# the sm_120 branch values of the globals _apply_wo_a_bf16_matmul reads (fast_path=False)\n"
        "_is_hip = False\n_is_cuda = True\n_is_gfx95_supported = False\n"
        "_wo_a_aiter_batched_gemm_enabled = False\n_wo_a_aiter_batched_gemm_disabled = False\n"
        "class _Platform:\n    is_blackwell = True\n    is_sm90 = False\n"
        "def get_platform():\n    return _Platform\n"
    )
    path = upstream.extract_functions("srt/models/deepseek_v4.py", {"_apply_wo_a_bf16_matmul",
                                      "_wo_a_bf16_bmm_token_major"}, preamble=preamble, out_name=UPSTREAM_FILE)
    print(f"wrote {path}")
    # upstream's per-token-group activation quantisation (the kernel its FP8 linear launches first);
    # extract_functions drops decorators, the device side wraps it in triton.jit
    path = upstream.extract_functions("kernels/ops/quantization/fp8_kernel.py", {"_per_token_group_quant_8bit"},
                                      preamble="import triton\nimport triton.language as tl\n",
                                      out_name=UPSTREAM_QUANT_FILE)
    print(f"wrote {path}")


def old_default_config(m: int, n: int, k: int, groups: int, g):
    """The launch form default_config picked before the rows form (benchmarks/fp8_gemv-h200.summary.md):
    1 row on the 1-row FMA form (32 cols, 2 K blocks per iteration), 2..16 rows on 16x32 tensor-core
    tiles, more on 32x64 tiles; split-K up to 4 programs per SM."""
    if m <= 1:
        bm, bn, dot, unroll = 1, 32, False, 2
    elif m <= 16:
        bm, bn, dot, unroll = 16, 32, True, 1
    else:
        bm, bn, dot, unroll = 32, 64, True, 1
    tiles = groups * math.ceil(n / bn) * math.ceil(m / bm)
    split = g.choose_split(tiles, math.ceil(k / g.FP8_BLOCK), 4 * g.sm_count())
    return g.GemvConfig(bm, bn, split, dot, k_unroll=unroll)


def rows_config(m: int, n: int, k: int, groups: int, g, block_n: int, unroll: int, warps: int = 4,
                programs_per_sm: int = 4, prefetch: bool = True, evict_first: bool = False, max_block_m: int = 8,
                x_broadcast: bool = False):
    rows = min(max_block_m, 1 << max(0, m - 1).bit_length())
    tiles = groups * math.ceil(n / block_n) * math.ceil(m / rows)
    split = g.choose_split(tiles, math.ceil(k / g.FP8_BLOCK), programs_per_sm * g.sm_count())
    return g.GemvConfig(rows, block_n, split, False, warps, 3, unroll, rows_form=True, prefetch=prefetch,
                        evict_first=evict_first, x_broadcast=x_broadcast)


def distinct_configs(labelled):
    """The (label, config) pairs with each config kept once, under its first label."""
    seen, unique = set(), []
    for label, cfg in labelled:
        if cfg not in seen:
            seen.add(cfg)
            unique.append((label, cfg))
    return unique


def one_chunk_fits(block_n: int, warps: int, k_columns: int) -> bool:
    """Whether a one-chunk program of ``block_n`` columns on ``warps`` warps, its chunk ``k_columns`` wide, holds at
    most ONE_CHUNK_MAX_BYTES_PER_THREAD weight bytes per thread (the tiles runs 18 / 18b / 43 swept)."""
    return block_n * k_columns // (32 * warps) <= ONE_CHUNK_MAX_BYTES_PER_THREAD


def candidates(m: int, n: int, k: int, groups: int, g):
    """(label, config) for one point: the previous default first, then rows-form variants, then the
    current default_config if it is none of those."""
    out = [("old_default", old_default_config(m, n, k, groups, g)),
           ("rows_n32_u2", rows_config(m, n, k, groups, g, 32, 2)),
           ("rows_n16_u4", rows_config(m, n, k, groups, g, 16, 4)),
           ("rows_n16_u4_pps8", rows_config(m, n, k, groups, g, 16, 4, programs_per_sm=8)),
           ("rows_n16_u8_w8", rows_config(m, n, k, groups, g, 16, 8, warps=8)),
           ("rows_n16_u4_ef", rows_config(m, n, k, groups, g, 16, 4, evict_first=True)),
           ("rows_n32_u2_nopf", rows_config(m, n, k, groups, g, 32, 2, prefetch=False)),
           ("rows_n32_u4_w8", rows_config(m, n, k, groups, g, 32, 4, warps=8)),
           ("rows4_n16_u4", rows_config(m, n, k, groups, g, 16, 4, max_block_m=4)),
           # added after run 3 (not in its sweep): activation loaded in the weight tile's layout
           ("rows_n32_u2_nopf_xb", rows_config(m, n, k, groups, g, 32, 2, prefetch=False, x_broadcast=True)),
           ("rows4_n32_u2_nopf_xb", rows_config(m, n, k, groups, g, 32, 2, prefetch=False, x_broadcast=True,
                                                max_block_m=4)),
           ("current_default", g.default_config(m, n, k, groups))]
    return distinct_configs(out)


def _sync(torch) -> None:
    try:
        torch.cuda.synchronize()
    except Exception as exc:  # a sticky CUDA error: later points will fail too, and say so
        print(f"synchronize failed: {exc}", flush=True)


def dot_config(m: int, n: int, k: int, groups: int, g, block_n: int = 32, unroll: int = 1, warps: int = 4,
               stages: int = 3, programs_per_sm: int = 4, swap: bool = False):
    tiles = groups * math.ceil(n / block_n) * math.ceil(m / 16)
    split = g.choose_split(tiles, math.ceil(k / g.FP8_BLOCK), programs_per_sm * g.sm_count())
    return g.GemvConfig(16, block_n, split, True, warps, stages, unroll, swap)


def dot_candidates(m: int, n: int, k: int, groups: int, g):
    """--dot-sweep: the 16-row tensor-core form with deeper pipelines / other tiles, for 3..16 rows."""
    out = [("old_default", old_default_config(m, n, k, groups, g)),
           ("dot_n32_st4", dot_config(m, n, k, groups, g, stages=4)),
           ("dot_n32_st6", dot_config(m, n, k, groups, g, stages=6)),
           ("dot_n64_st4", dot_config(m, n, k, groups, g, block_n=64, stages=4)),
           ("dot_n32_u2_st4", dot_config(m, n, k, groups, g, unroll=2, stages=4)),
           ("dot_n32_st4_w2", dot_config(m, n, k, groups, g, stages=4, warps=2)),
           ("dot_n32_st4_pps8", dot_config(m, n, k, groups, g, stages=4, programs_per_sm=8)),
           ("dotT_n64_st4", dot_config(m, n, k, groups, g, block_n=64, stages=4, swap=True)),
           ("current_default", g.default_config(m, n, k, groups))]
    return distinct_configs(out)


def run3_default_config(m: int, n: int, k: int, groups: int, g):
    """The launch form default_config picked after run 3 and before run 5 (fp8_gemv-h200-run3.summary.md),
    frozen here so run 5's 'old' column stays what it was: 1 row one-shot rows form for K of 4..8 blocks
    (8 warps whole K at 8 blocks and <= 2 programs per SM, else 16 cols x 4 blocks evict-first at <= 4 per
    SM), otherwise the 1-row FMA form; 2 rows on the rows form (32 cols, 2 blocks, no prefetch); 3..16 rows
    on 16x32 tensor-core tiles."""
    kb = math.ceil(k / g.FP8_BLOCK)
    sms = g.sm_count()
    if m == 1 and 4 <= kb <= 8:
        tiles = groups * math.ceil(n / 16)
        if kb == 8 and tiles <= 2 * sms:
            return g.GemvConfig(1, 16, 1, False, num_warps=8, k_unroll=kb, rows_form=True, prefetch=True)
        if tiles <= 4 * sms:
            return g.GemvConfig(1, 16, 1, False, k_unroll=4, rows_form=True, prefetch=True, evict_first=True)
    if m == 2:
        split = g.choose_split(groups * math.ceil(n / 32), kb, 4 * sms)
        return g.GemvConfig(2, 32, split, False, k_unroll=2, rows_form=True)
    return old_default_config(m, n, k, groups, g)


def xb_candidates(m: int, n: int, k: int, groups: int, g):
    """--xb-sweep: the run-3 default first, then the x_broadcast rows form (one tile of up to 8 rows) with
    fewer columns, other chunk lengths, prefetch, evict-first and other split-K targets; 4-row tiles at
    8 rows; the current default_config last if it is none of those."""
    def xb(block_n, unroll, **kw):
        kw.setdefault("prefetch", False)
        return rows_config(m, n, k, groups, g, block_n, unroll, x_broadcast=True, **kw)
    out = [("old_default", run3_default_config(m, n, k, groups, g)),
           ("xb_n32_u2", xb(32, 2)),
           ("xb_n16_u2", xb(16, 2)),
           ("xb_n16_u4", xb(16, 4)),
           ("xb_n32_u1", xb(32, 1)),
           ("xb_n32_u2_pf", xb(32, 2, prefetch=True)),
           ("xb_n16_u4_pf_ef", xb(16, 4, prefetch=True, evict_first=True)),
           ("xb_n32_u2_pps8", xb(32, 2, programs_per_sm=8)),
           ("xb_n32_u2_pps2", xb(32, 2, programs_per_sm=2))]
    if m >= 8:
        out.append(("xb4_n32_u2", xb(32, 2, max_block_m=4)))
    out.append(("current_default", g.default_config(m, n, k, groups)))
    return distinct_configs(out)


def q8_config(m: int, n: int, k: int, groups: int, g, block_n: int = 64, stages: int = 3, warps: int = 4,
              programs_per_sm: int = 4, join: bool = False, unroll: int = 1):
    """The FP8 tensor-core form: 8-row tiles (16 MMA columns) up to 8 rows, 16-row tiles above."""
    block_m = 8 if m <= 8 else 16
    tiles = groups * math.ceil(n / block_n) * math.ceil(m / block_m)
    split = g.choose_split(tiles, math.ceil(k / g.FP8_BLOCK), programs_per_sm * g.sm_count())
    return g.GemvConfig(block_m, block_n, split, True, warps, stages, unroll, fp8_mma=True, fp8_join=join)


def q8_candidates(m: int, n: int, k: int, groups: int, g):
    """--q8-sweep (run 6): the run-3/5 default first, then the FP8 tensor-core form with 32/64/128-column
    weight tiles, 3..6 pipeline stages, 4/8 warps and split-K targets of 2/4/8 programs per SM."""
    def q8(**kw):
        return q8_config(m, n, k, groups, g, **kw)
    out = [("old_default", run3_default_config(m, n, k, groups, g)),
           ("q8_n64_st3", q8()),
           ("q8_n64_st4", q8(stages=4)),
           ("q8_n64_st6", q8(stages=6)),
           ("q8_n64_st4_pps8", q8(stages=4, programs_per_sm=8)),
           ("q8_n64_st4_pps2", q8(stages=4, programs_per_sm=2)),
           ("q8_n128_st4", q8(block_n=128, stages=4)),
           ("q8_n128_st4_w8", q8(block_n=128, stages=4, warps=8)),
           ("q8_n128_st4_pps8", q8(block_n=128, stages=4, programs_per_sm=8)),
           ("q8_n32_st4", q8(block_n=32, stages=4)),
           ("current_default", g.default_config(m, n, k, groups))]
    return distinct_configs(out)


def q8j_candidates(m: int, n: int, k: int, groups: int, g):
    """--q8j-sweep (run 6b): the run-3/5 default and run 6's best FP8 tensor-core variant (q8_n64_st3), then the
    joined split (each activation row split once) with 2..4 stages (smaller shared memory, more programs per
    SM), 2 K blocks per iteration, 128-column tiles on 8 warps and a split-K target of 8 programs per SM."""
    def q8j(**kw):
        return q8_config(m, n, k, groups, g, join=True, **kw)
    out = [("old_default", run3_default_config(m, n, k, groups, g)),
           ("q8_n64_st3", q8_config(m, n, k, groups, g)),
           ("q8j_n64_st3", q8j()),
           ("q8j_n64_st2", q8j(stages=2)),
           ("q8j_n64_st4", q8j(stages=4)),
           ("q8j_n64_st2_pps8", q8j(stages=2, programs_per_sm=8)),
           ("q8j_n64_u2_st2", q8j(stages=2, unroll=2)),
           ("q8j_n64_u2_st3", q8j(unroll=2)),
           ("q8j_n128_w8_st2", q8j(block_n=128, warps=8, stages=2)),
           ("q8j_n128_w8_st3", q8j(block_n=128, warps=8)),
           ("current_default", g.default_config(m, n, k, groups))]
    return distinct_configs(out)


def chain_candidates(m: int, n: int, k: int, groups: int, g):
    """--chain-final: the run-3/5 default, the current default, and the chained FP8 tensor-core form
    (GemvConfig(fp8_chain=True): acc = dot(w, q^T, acc), weight scale folded into the activation, one
    power-of-two activation scale per row and split) on the current FP8 tile of the shape (its split, 3
    stages), joined (q8jc: hi/lo operand byte-wise through shared memory on sm_120a) and unjoined (q8c: each
    row loaded for both columns, the operand by ldmatrix, twice the split work)."""
    import dataclasses

    base = g._fp8_mma_config(max(m, 4), n, k, groups)
    if base is None:  # not a large weight: the 64-column tile and its split
        base = q8_config(m, n, k, groups, g, join=True)
    out = [("old_default", run3_default_config(m, n, k, groups, g)),
           ("current_default", g.default_config(m, n, k, groups)),
           ("q8jc", dataclasses.replace(base, fp8_chain=True)),
           ("q8c", dataclasses.replace(base, fp8_chain=True, fp8_join=False))]
    return distinct_configs(out)


def pdl_candidates(m: int, n: int, k: int, groups: int, g):
    """--pdl-sweep (run 8): the current default launch form without PDL ("old_default"), then the same form
    launched with programmatic dependent launch (GemvConfig(pdl=True): early launch_dependents, griddepcontrol.wait
    before the first activation load), with 0 / 4 / 16 K blocks of the program's weight prefetched into L2 before
    the wait; at 1 row also the rows form with its first weight chunk loaded into registers before the wait, and
    at 2 rows the default rows form with that prefetch."""
    import dataclasses

    cur = g.default_config(m, n, k, groups)
    base = g.launch_form(m, n, k, groups)  # the default before run 8 (no PDL)

    def pdl(cfg, blocks=0, **kw):
        return dataclasses.replace(cfg, pdl=True, pdl_l2_blocks=blocks, **kw)
    out = [("old_default", base), ("pdl", pdl(base)), ("pdl_l2p4", pdl(base, 4)), ("pdl_l2p16", pdl(base, 16))]
    if m == 1 and not base.rows_form:
        out.append(("rows1_pf_pdl_l2p16", pdl(rows_config(m, n, k, groups, g, 32, 2), 16)))
    if base.rows_form and not base.prefetch:
        out.append(("rows_pf_pdl_l2p16", pdl(base, 16, prefetch=True)))
    out.append(("current_default", cur))
    return distinct_configs(out)


def pdl2_candidates(m: int, n: int, k: int, groups: int, g):
    """--pdl2-sweep (run 9): the launch form without PDL (``launch_form``, the default before run 8) and the
    current default (run 8's PDL rules), then PDL with launch_dependents after the main loop (``pdl_late``: the
    current default's form, or the launch form with PDL where the default has none; on the tensor-core forms also
    with 4 K blocks prefetched into L2), and at 2 rows the rows form with its first weight chunk prefetched, without
    and with PDL."""
    import dataclasses

    base, cur = g.launch_form(m, n, k, groups), g.default_config(m, n, k, groups)
    out = [("old_default", base), ("current_default", cur),
           ("pdl_late", dataclasses.replace(cur if cur.pdl else base, pdl=True, pdl_late=True))]
    if base.use_dot:
        out.append(("pdl_late_l2p4", dataclasses.replace(base, pdl=True, pdl_late=True, pdl_l2_blocks=4)))
    if base.rows_form and not base.prefetch:
        out += [("rows_pf", dataclasses.replace(base, prefetch=True)),
                ("rows_pf_pdl", dataclasses.replace(base, prefetch=True, pdl=True)),
                ("rows_pf_pdl_l2p16", dataclasses.replace(base, prefetch=True, pdl=True, pdl_l2_blocks=16))]
    return distinct_configs(out)


def tma_candidates(m: int, n: int, k: int, groups: int, g):
    """--tma-sweep (run 11): the current default (PDL as shipped) first, then the same form with its weight tiles
    fetched by TMA (GemvConfig.w_tma: host descriptor, the K loop pipelining the copies through num_stages
    shared-memory buffers) with 3 (the form's own), 2 and 4 stages; on PDL forms with L2 prefetch also without the
    prefetch (TMA copies may make it redundant); on the 1-row FMA form also 64-column tiles and twice the K split.
    Forms whose weight tile is wider than a TMA box (the one-shot rows forms) have no TMA variant."""
    import dataclasses

    cur = g.default_config(m, n, k, groups)
    out = [("old_default", cur)]
    if cur.weight_tile_k <= g.TMA_MAX_BOX:
        tma = dataclasses.replace(cur, w_tma=True)
        out += [("tma", tma), ("tma_st2", dataclasses.replace(tma, num_stages=2)),
                ("tma_st4", dataclasses.replace(tma, num_stages=4))]
        if tma.pdl_l2_blocks:
            out.append(("tma_nol2", dataclasses.replace(tma, pdl_l2_blocks=0)))
        if m == 1 and not cur.use_dot and not cur.rows_form:  # FMA form: larger copies / more programs
            out += [("tma_n64", dataclasses.replace(tma, block_n=64)),
                    ("tma_split2x", dataclasses.replace(tma, split_k=2 * tma.split_k))]
    return distinct_configs(out)


def tma2_candidates(m: int, n: int, k: int, groups: int, g):
    """--tma2-sweep (run 11b): the current default first; on the 1-row FMA form the 64-column tile with plain loads
    (the same K split), by TMA with 3 / 2 / 4 stages and without the L2 prefetch, and a 128-column TMA tile with 2
    stages; on every other form the same form by TMA (3 stages)."""
    import dataclasses

    cur = g.default_config(m, n, k, groups)
    out = [("old_default", cur)]
    if cur.weight_tile_k > g.TMA_MAX_BOX:
        return out
    tma = dataclasses.replace(cur, w_tma=True)
    if m == 1 and not cur.use_dot and not cur.rows_form:
        n64 = dataclasses.replace(tma, block_n=64)
        out += [("fma_n64", dataclasses.replace(cur, block_n=64)), ("tma_n64", n64),
                ("tma_n64_st2", dataclasses.replace(n64, num_stages=2)),
                ("tma_n64_st4", dataclasses.replace(n64, num_stages=4)),
                ("tma_n64_nol2", dataclasses.replace(n64, pdl_l2_blocks=0)),
                ("tma_n128_st2", dataclasses.replace(tma, block_n=128, num_stages=2))]
    else:
        out.append(("tma", tma))
    return distinct_configs(out)


def run12_candidates(m: int, n: int, k: int, groups: int, g):
    """--run12-sweep (run 12): the current default first; at 2..8 rows on the 128-column FP8 tile: that tile by TMA
    (wo_a_config's fused-RoPE form) at its own K split and at 1/2 and 1/4 of it (fewer programs, each a longer TMA
    pipeline) with 3..6 stages and with 4 K blocks prefetched into L2 before the PDL wait, the same tile with plain
    cp.async at half the split, the 64-column FP8 tile by TMA; the 1-row default's 64-column FMA tile by TMA (its K
    split, 4 L2 blocks) with 2 rows in the FMA form, and the rows form (2 / 4 / 8 rows per program, 4 / 8 warps)."""
    import dataclasses

    replace = dataclasses.replace
    cur = g.default_config(m, n, k, groups)
    out = [("old_default", cur)]
    if not cur.fp8_mma:
        return out
    tma = replace(cur, w_tma=True)
    s = cur.split_k
    out += [("q8j_tma", tma),
            ("q8j_tma_st4", replace(tma, num_stages=4)),
            ("q8j_tma_l2p4", replace(tma, pdl_l2_blocks=4)),
            ("q8j_tma_s/2", replace(tma, split_k=max(1, s // 2))),
            ("q8j_tma_s/2_st4", replace(tma, split_k=max(1, s // 2), num_stages=4)),
            ("q8j_tma_s/2_st4_l2p4", replace(tma, split_k=max(1, s // 2), num_stages=4, pdl_l2_blocks=4)),
            ("q8j_tma_s/4_st4", replace(tma, split_k=max(1, s // 4), num_stages=4)),
            ("q8j_tma_s/4_st6", replace(tma, split_k=max(1, s // 4), num_stages=6)),
            ("q8j_s/2", replace(cur, split_k=max(1, s // 2))),
            ("q8j_n64_tma", replace(tma, block_n=64, num_warps=4))]
    one_row = g.default_config(1, n, k, groups)  # the 64-column FMA tile by TMA (PDL, 4 L2 blocks)
    if one_row.w_tma and not one_row.use_dot and not one_row.rows_form:
        if m == 2:
            out += [("fma2_n64_u1_tma", replace(one_row, block_m=2, k_unroll=1)),
                    ("fma2_n64_u2_w8_tma", replace(one_row, block_m=2, num_warps=8))]
        rows = 2 if m <= 2 else 4 if m <= 4 else 8
        rows_form = g.GemvConfig(rows, one_row.block_n, one_row.split_k, False, k_unroll=one_row.k_unroll,
                                 rows_form=True, pdl=True, pdl_l2_blocks=one_row.pdl_l2_blocks, w_tma=True)
        out += [(f"rows{rows}_n64_tma", rows_form), (f"rows{rows}_n64_w8_tma", replace(rows_form, num_warps=8))]
    return distinct_configs(out)


def run13_candidates(m: int, n: int, k: int, groups: int, g):
    """--run13-sweep (run 13): the current default first, then persistent forms of it (ppN: SMs x N programs, each
    looping over work items pid, pid + nprog, ...): on the FP8 tile with cp.async / by TMA, 1 / 2 / 4 programs per SM,
    twice the K split (shorter, more work items), 4 / 5 stages (a deeper ring); on the 1-row FMA tile 2 / 4 programs
    per SM, 64 columns by TMA, twice the split, 4 / 5 stages. Run 13 itself summed the split partials of the persistent
    forms with a branch-free masked load (so that the work-item loop could be flattened with split-K) and also timed the
    FP8 tile not flattened; run 13b (diagnostic knobs, since removed) found that sum 1.4-9x slower, so split-K
    persistent forms now sum as the other forms do and are not flattened (benchmarks/fp8_gemv-h200-run13-summary.md)."""
    import dataclasses

    replace = dataclasses.replace
    cur = g.default_config(m, n, k, groups)
    out = [("old_default", cur)]
    if cur.rows_form:
        return out

    def pp(cfg, programs, **kw):
        return replace(cfg, persistent_programs_per_sm=programs, **kw)

    tma = replace(cur, w_tma=True)
    s = cur.split_k
    if cur.fp8_mma:
        out += [("tma", tma), ("pp1", pp(cur, 1)), ("pp2", pp(cur, 2)),
                ("pp1_tma", pp(tma, 1)), ("pp2_tma", pp(tma, 2)), ("pp4_tma", pp(tma, 4)),
                ("pp1_tma_s2x", pp(tma, 1, split_k=2 * s)), ("pp2_tma_s2x", pp(tma, 2, split_k=2 * s)),
                ("pp1_tma_st4", pp(tma, 1, num_stages=4)), ("pp1_tma_st5", pp(tma, 1, num_stages=5)),
                ("pp2_tma_st4", pp(tma, 2, num_stages=4))]
    elif not cur.use_dot:
        n64 = tma if cur.w_tma else replace(tma, block_n=64)
        out += [("pp2", pp(cur, 2)), ("pp4", pp(cur, 4)),
                ("pp2_n64_tma", pp(n64, 2)), ("pp4_n64_tma", pp(n64, 4)), ("pp1_n64_tma", pp(n64, 1)),
                ("pp2_n64_tma_s2x", pp(n64, 2, split_k=2 * n64.split_k)),
                ("pp2_n64_tma_st4", pp(n64, 2, num_stages=4)), ("pp2_n64_tma_st5", pp(n64, 2, num_stages=5)),
                ("pp1_n64_tma_st5", pp(n64, 1, num_stages=5))]
    else:
        out += [("pp2", pp(cur, 2)), ("pp4", pp(cur, 4))]
    return distinct_configs(out)


def _wo_a_sweep_default(m: int, n: int, k: int, groups: int, g):
    """default_config's form, the base of the run-15 sweeps; at --smoke's reduced shapes the full wo_a shape's form
    (2 groups: T=1, else T=2), so the smoke run exercises the same candidates."""
    if groups * n * k < 1 << 20:
        return g.default_config(m, 1024, 4096, 8 if groups >= 2 else 4)
    return g.default_config(m, n, k, groups)


def run15_candidates(m: int, n: int, k: int, groups: int, g):
    """--run15-sweep (run 15): default_config's form first; on the FP8 tile: that tile by TMA (the fused-RoPE form
    before run 15), 4 / 5 stages, half / a quarter of the K split, 4 warps, 2 / 4 K blocks per iteration (uN; with 1
    stage no pipeline: a program's loads all issued up front), twice the split at 2 blocks, and the split-K sum with
    the partials loaded 4 / 8 at a time (sbN), also on the TMA and one-shot forms. At T=2 (no PDL, 4 groups) a subset.
    Runs 15 / 15b also timed the split partials added by fp32 atomics into a zeroed fp32 tile (``sa`` variants);
    run 15b measured wrong results from two of them (a race), so that option is removed and not timed here."""
    import dataclasses

    replace = dataclasses.replace
    cur = _wo_a_sweep_default(m, n, k, groups, g)
    out = [("old_default", cur)]
    if not cur.fp8_mma:
        return out
    s = cur.split_k
    tma = replace(cur, w_tma=True)
    one_shot = replace(cur, k_unroll=4, num_stages=1)
    subset = [("st4", replace(cur, num_stages=4)), ("s/2", replace(cur, split_k=max(1, s // 2))),
              ("sb8", replace(cur, split_sum_batch=8)),
              ("u4_st1", one_shot), ("u4_st1_sb8", replace(one_shot, split_sum_batch=8)),
              ("u2_st2", replace(cur, k_unroll=2, num_stages=2))]
    if not cur.pdl:  # T=2
        return distinct_configs(out + subset)
    out += [("tma", tma)] + subset
    out += [("st5", replace(cur, num_stages=5)), ("s/4", replace(cur, split_k=max(1, s // 4))),
            ("s/2_st4", replace(cur, split_k=max(1, s // 2), num_stages=4)),
            ("w4", replace(cur, num_warps=4)),
            ("sb4", replace(cur, split_sum_batch=4)),
            ("u4_st1_w4", replace(one_shot, num_warps=4)),
            ("u2_st1_s2x", replace(cur, k_unroll=2, num_stages=1, split_k=2 * s)),
            ("u2_st3", replace(cur, k_unroll=2, num_stages=3)),
            ("tma_sb8", replace(tma, split_sum_batch=8))]
    return distinct_configs(out)


def run15b_candidates(m: int, n: int, k: int, groups: int, g):
    """--run15b-sweep (run 15b): default_config's form first; run 15's leads and their combinations: the split-K sum
    with 8 partials per load step (sb8), 4 warps (w4), the one-shot program of 4 K blocks on 4 warps (u4_st1_w4; u2: 2
    blocks per iteration, 1 or 2 stages; s2x: twice the split), by TMA (the fused-RoPE form before run 15) on 8 and 4
    warps. Run 15b also timed the fp32-atomic split sums (``sa``, removed: see run15_candidates)."""
    import dataclasses

    replace = dataclasses.replace
    cur = _wo_a_sweep_default(m, n, k, groups, g)
    out = [("old_default", cur)]
    if not cur.fp8_mma:
        return out
    w4 = replace(cur, num_warps=4)
    one_shot = replace(w4, k_unroll=4, num_stages=1)
    out += [("w4", w4), ("u4_st1_w4", one_shot), ("u4_st1_w4_sb8", replace(one_shot, split_sum_batch=8))]
    if cur.pdl:  # T=1
        tma = replace(cur, w_tma=True)
        out += [("u2_st1_w4", replace(w4, k_unroll=2, num_stages=1)),
                ("u2_st2_w4", replace(w4, k_unroll=2, num_stages=2)),
                ("u2_st1_w4_s2x", replace(w4, k_unroll=2, num_stages=1, split_k=2 * cur.split_k)),
                ("tma", tma), ("tma_w4", replace(tma, num_warps=4))]
    return distinct_configs(out)


def run18_candidates(m: int, n: int, k: int, groups: int, g):
    """--run18-sweep (run 18): default_config's form first; wk_nN_wW = the rows form without split-K, N columns per
    program on W warps, its whole K one chunk loaded with the scales before the PDL wait (one_chunk; only where a thread
    holds at most 256 weight bytes); oc_nN_sS = the same with the K split choose_split picks for N-column tiles (S
    splits of one chunk each). Run 18 also timed the split-K sum loading 8 partials per step on the FMA / bf16-tile /
    rows forms (``sb8``, also on the oc variants); that option is removed from those forms, so not generated here."""
    cur = g.default_config(m, n, k, groups)
    out = [("old_default", cur)]
    k_blocks = math.ceil(k / g.FP8_BLOCK)
    rows = min(8, 1 << max(0, m - 1).bit_length())
    if k_blocks & (k_blocks - 1) == 0 and rows <= 2:  # a chunk of the whole K: a power-of-two width
        for block_n, warps in ((8, 8), (16, 8), (8, 4), (16, 4)):
            if one_chunk_fits(block_n, warps, k):
                out.append((f"wk_n{block_n}_w{warps}", g.one_chunk_form(rows, block_n, warps, k_blocks)))
        for block_n in (16, 32):
            tiles = groups * math.ceil(n / block_n) * math.ceil(m / rows)
            split = g.choose_split(tiles, k_blocks, g.PROGRAMS_PER_SM * g.sm_count())
            if split > 1 and block_n * k // split // 128 <= ONE_CHUNK_MAX_BYTES_PER_THREAD:
                out.append((f"oc_n{block_n}_s{split}",
                            g.GemvConfig(rows, block_n, split, False, k_unroll=k_blocks // split, rows_form=True,
                                         prefetch=True, one_chunk=True, pdl=True)))
    return distinct_configs(out)


POINT_IS_WO_A = [False]  # set by main() for the point being swept


@contextlib.contextmanager
def module_flag(module, name: str, value):
    """``module.<name> = value`` inside the ``with`` block, the value it had before restored after it (also on an
    exception); an unknown name raises AttributeError. E.g. fp8_gemv's USE_* rule switches for the defaults before a
    run (``with module_flag(g, "USE_ONE_CHUNK", False): g.default_config(...)``); they are part of the config cache's
    key, so the cached configs follow them."""
    previous = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, previous)


def run18b_candidates(m: int, n: int, k: int, groups: int, g):
    """--run18b-sweep (run 18b): old_default = default_config without the one-chunk rule (as before), current_default =
    with it; wk_nN_wW = the one-chunk rows form on N columns and W warps (whole K, no split-K); wo_a: old_seam / seam =
    wo_a_config with the fused RoPE without / with the rule (every variant is timed with the RoPE too). Run 18b also
    timed ``sb8`` (see run18_candidates), since removed, so not generated here. The rule's tiles changed after the run
    (K <= 512: 32 columns, K 1024: 16, as wk_n32_w4 / wk_n16_w4 measured), so current_default now repeats a wk row."""
    with module_flag(g, "USE_ONE_CHUNK", False):  # the defaults before run 18b
        old = g.default_config(m, n, k, groups)
    out = [("old_default", old), ("current_default", g.default_config(m, n, k, groups))]
    k_blocks = math.ceil(k / g.FP8_BLOCK)
    if m <= 2 and k_blocks & (k_blocks - 1) == 0:
        for block_n, warps in ((8, 8), (16, 8), (8, 4), (16, 4), (4, 8), (32, 4)):
            if (block_n == 4 and k < 2048) or (block_n == 32 and k > 1024):
                continue
            if one_chunk_fits(block_n, warps, k_blocks * g.FP8_BLOCK):
                out.append((f"wk_n{block_n}_w{warps}", g.one_chunk_form(m, block_n, warps, k_blocks)))
    if POINT_IS_WO_A[0]:
        with module_flag(g, "USE_ONE_CHUNK", False):
            old_seam = g.wo_a_config(m, n, k, groups, fused_rope=True)
        out += [("old_seam", old_seam), ("seam", g.wo_a_config(m, n, k, groups, fused_rope=True))]
    return distinct_configs(out)


def run19_candidates(m: int, n: int, k: int, groups: int, g):
    """--run19-sweep (run 19): the 33.5 MB weights at T=1. old_default = default_config's form (wo_a: wo_a_config's
    plain form), seam_default (wo_a) = wo_a_config with the fused RoPE (every wo_a variant is timed with the RoPE too);
    os = the one-shot FP8 program (4 warps, a split's 4 K blocks in one iteration, 8 partials per sum step, wo_a: the
    rope block preloaded); os_ww1 = that program with block 0's weight tile and scale loaded before the PDL wait
    (GemvConfig.w_before_wait). Run 19 also timed 2 / 4 blocks before the wait (ww2 / ww4, also on 8 warps), 64-column
    tiles and, on wq_b, a 64-column program over 8 blocks (os, ww2 / ww4 / ww8): all lost and were removed, so they are
    not generated here (their times: benchmarks/fp8_gemv-h200-run19-sweep.json). Since run 19 os_ww1 is the default
    (old_default then repeats it at 2..8 rows)."""
    import dataclasses

    replace = dataclasses.replace
    if POINT_IS_WO_A[0]:
        shape = _wo_a_full_shape(m, n, k, groups)
        out = [("old_default", g.wo_a_config(*shape, fused_rope=False)),
               ("seam_default", g.wo_a_config(*shape, fused_rope=True))]
        one_shot = g.wo_a_config(*_wo_a_full_shape(2, n, k, groups), fused_rope=True)  # the 2..8-row seam form
        one_shot = replace(one_shot, w_before_wait=0, max_registers=0)
    else:
        out = [("old_default", g.default_config(m, n, k, groups))]
        if groups * n * k < 1 << 20:  # --smoke's reduced shapes: the full shape's tile (K 1024: wq_b, else wo_b)
            n, k, groups = (32768, 1024, 1) if k <= 1024 else (4096, 8192, 1)
        wide = g._fp8_mma_config(8, n, k, groups)
        wide = replace(wide, pdl=True, num_warps=4, num_stages=1, split_sum_batch=8 if wide.split_k > 1 else 1)
        blocks = math.ceil(k / g.FP8_BLOCK) // wide.split_k
        if blocks != g.ONE_SHOT_BLOCKS:  # wq_b: the 8-block program was removed
            return distinct_configs(out)
        one_shot = replace(wide, k_unroll=blocks)
    out += [("os", one_shot), ("os_ww1", replace(one_shot, w_before_wait=1))]
    return distinct_configs(out)


def run42_candidates(m: int, n: int, k: int, groups: int, g):
    """--run42-sweep (run 42): old_default = default_config as shipped (wo_a: wo_a_config's plain form), seam_default
    (wo_a) = wo_a_config with the fused RoPE (every wo_a variant is timed with the RoPE too); beside_rule (not wo_a) =
    default_config's rule for a call beside other streams (wq_b: the persistent form); ocs_nN_bB_wW = the
    one-chunk rows form (activation first at one row) on N columns and W warps, K split into chunks of B blocks (one
    per split; the split-K partials summed by the last arriver)."""
    if POINT_IS_WO_A[0]:
        shape = _wo_a_full_shape(m, n, k, groups)
        out = [("old_default", g.wo_a_config(*shape, fused_rope=False)),
               ("seam_default", g.wo_a_config(*shape, fused_rope=True))]
    else:
        out = [("old_default", g.default_config(m, n, k, groups))]
        # the rule's form before the one-chunk tiles where a weight is over ONE_CHUNK_MAX_WEIGHT_BYTES (wq_b at T=1:
        # the persistent FMA form by TMA, shipped alone before round 31, beside the indexer's streams since)
        out.append(("beside_rule", g.pick_default_config(m, n, k, groups, g.sm_count(), g.rules(),
                                                         beside_other_streams=True)))
    k_blocks = math.ceil(k / g.FP8_BLOCK)
    for block_n, blocks, warps in RUN42_TILES:
        if blocks > k_blocks or k_blocks % blocks:
            continue
        cfg = g.GemvConfig(m, block_n, k_blocks // blocks, False, num_warps=warps, k_unroll=blocks, rows_form=True,
                           prefetch=True, one_chunk=True, pdl=True)
        out.append((f"ocs_n{block_n}_b{blocks}_w{warps}", cfg))
    return distinct_configs(out)


def run43_candidates(m: int, n: int, k: int, groups: int, g):
    """--run43-sweep (run 43): old_default = default_config as shipped (wo_a: wo_a_config's plain form, which the seam
    runs at T >= 2 from 3 rows); before_run43 = the rules without the one-chunk form (at 3+ rows: the form before run
    43's 4-row tiles); oc_nN_wW = the one-chunk rows form on all m rows (block_m = m), N columns, W warps, the
    whole K one chunk loaded with its scales before the PDL wait (only where a thread holds at most 256 weight bytes);
    oc4x2_nN_wW (8 rows) = that form on 4-row tiles (each weight chunk read twice, the second time mostly from L2);
    dot_pdl = the default's bf16 tensor-core tile with PDL (late trigger, 4 K blocks into L2 before the wait), as
    default_config launches it on weights of at most 4 MiB."""
    from dataclasses import replace

    if POINT_IS_WO_A[0]:
        out = [("old_default", g.wo_a_config(*_wo_a_full_shape(m, n, k, groups), fused_rope=False))]
    else:
        out = [("old_default", g.default_config(m, n, k, groups))]
    # the rule without the one-chunk form: at 3+ rows the form before run 43's 4-row tiles (run 43b timed them as the
    # default, commit 77b75f4; not shipped, so here it repeats old_default and is dropped as a duplicate)
    before = g.pick_default_config(m, n, k, groups, g.sm_count(), g.rules()._replace(one_chunk=False))
    out.append(("before_run43", before))
    k_blocks = math.ceil(k / g.FP8_BLOCK)
    if k_blocks & (k_blocks - 1) == 0:  # a chunk of the whole K: a power-of-two width
        for block_m, prefix in ((m, "oc"), (4, "oc4x2")) if m == 8 else ((m, "oc"),):
            for block_n, warps in RUN43_TILES:
                if one_chunk_fits(block_n, warps, k_blocks * g.FP8_BLOCK):
                    out.append((f"{prefix}_n{block_n}_w{warps}", g.one_chunk_form(block_m, block_n, warps, k_blocks)))
    dot = before
    if dot.use_dot and not dot.fp8_mma and not dot.pdl:
        out.append(("dot_pdl", replace(dot, pdl=True, pdl_late=True, pdl_l2_blocks=g.PDL_DOT_L2_BLOCKS)))
    return distinct_configs(out)


def pdl_floor(torch, timed, smoke: bool) -> dict:
    """us per call of a CUDA-graph chain of trivial Triton kernels (each program: PDL trigger, wait, one store), with
    and without PDL, at 1 / 132 / 528 programs of 4 warps: the launch + dependency floor of any kernel in the chain."""
    import triton
    import triton.language as tl

    from sglang_sm120.kernels.pdl import pdl_launch_dependents, pdl_wait

    # a jitted function resolves names in its module's globals (the interpreter too)
    globals().update(tl=tl, pdl_launch_dependents=pdl_launch_dependents, pdl_wait=pdl_wait)

    @triton.jit
    def _floor_kernel(y_ptr, PDL: tl.constexpr):
        pdl_launch_dependents(PDL)
        pdl_wait(PDL)
        tl.store(y_ptr + tl.program_id(0), 1.0)

    dev = "cpu" if smoke else "cuda"
    out = {}
    for programs in (1, 132, 528):
        ys = [torch.zeros(programs, device=dev) for _ in range(20)]
        for pdl in (False, True):
            use = pdl and not smoke
            us = timed([(lambda y=y: _floor_kernel[(programs,)](y, PDL=use, num_warps=4, launch_pdl=use))
                        for y in ys])
            out[f"{programs} programs, {'PDL' if pdl else 'no PDL'}"] = round(us, 3)
    return out


def _wo_a_full_shape(m: int, n: int, k: int, groups: int):
    """(m, n, k, groups) of wo_a; at --smoke's reduced shapes the full shape's (2 groups: T=1, else T=2), so that the
    smoke run picks the same forms."""
    if groups * n * k < 1 << 20:
        return m, 1024, 4096, 8 if groups >= 2 else 4
    return m, n, k, groups


def run17_candidates(m: int, n: int, k: int, groups: int, g):
    """--run17-sweep (run 17): wo_a_config's plain form first (old_default), then the seam's (wo_a_config with the
    fused RoPE); both and the FP8 tile's forms with the RoPE factors hoisted (rh: GemvConfig.rope_hoist); without the
    RoPE: the one-shot program at every row count, 64-column tiles on 4 warps with split 2 / 4 (16 / 8 K blocks per
    program) by TMA, early or late PDL trigger. T=2: the plain form with rh. Run 17 also timed evict-first weight loads
    on the FP8 tile (``ef``: 0.98-1.01x without the RoPE), since removed, so not generated here."""
    import dataclasses

    replace = dataclasses.replace
    shape = _wo_a_full_shape(m, n, k, groups)
    plain = g.wo_a_config(*shape, fused_rope=False)
    seam = g.wo_a_config(*shape, fused_rope=True)
    out = [("old_default", plain), ("plain_rh", replace(plain, rope_hoist=True))]
    if not plain.pdl:  # T=2 (no PDL at 4..8 rows): the check
        return distinct_configs(out)
    out += [("seam_default", seam), ("seam_rh", replace(seam, rope_hoist=True))]
    if seam.fp8_mma:
        base = g.default_config(*shape)  # the 8-warp 3-stage cp.async tile
        one_shot = replace(base, **g.WO_A_ONE_SHOT)
        n64 = replace(base, block_n=64, num_warps=4, w_tma=True)
        out += [("one_shot", one_shot), ("one_shot_rh", replace(one_shot, rope_hoist=True)),
                ("w8_rh", replace(base, rope_hoist=True)), ("w4_rh", replace(base, num_warps=4, rope_hoist=True)),
                ("tma_w8_rh", replace(base, w_tma=True, rope_hoist=True)),
                ("n64_s2_tma", replace(n64, split_k=2)), ("n64_s2_tma_late", replace(n64, split_k=2, pdl_late=True)),
                ("n64_s4_tma", replace(n64, split_k=4))]
    else:  # 1 row: the FMA tile
        out += [("plain_rh_st4", replace(plain, rope_hoist=True, num_stages=4))]
    return distinct_configs(out)


def run17b_candidates(m: int, n: int, k: int, groups: int, g):
    """--run17b-sweep (run 17b): as run 17, old_default = wo_a_config's plain form, seam_default = wo_a_config with
    the fused RoPE; 1 row: the plain form with hoisted RoPE factors (rh, run 17's lead) on 4 / 8 warps; FP8 tile: the
    one-shot program, the 4-warp TMA tile (the seam's) and the 8- / 4-warp cp.async tiles with the split's rotated rope
    block preloaded (rp), the TMA tile with rh (run 17); the one-shot
    with its 4 weight blocks prefetched into L2 before the PDL wait (l2p4) or the PDL trigger after its main loop
    (late). T=2: the plain form with rh / rp. Run 17b also timed the one-shot with its rope block known at compile
    time and rotated in the loop (``rs``: 19.3-20.4 us with the RoPE), since removed, so not generated here."""
    import dataclasses

    replace = dataclasses.replace
    shape = _wo_a_full_shape(m, n, k, groups)
    plain = g.wo_a_config(*shape, fused_rope=False)
    seam = g.wo_a_config(*shape, fused_rope=True)
    out = [("old_default", plain), ("plain_rh", replace(plain, rope_hoist=True))]
    if not plain.pdl:  # T=2
        return distinct_configs(out + [("plain_rp", replace(plain, rope_preload=True))])
    out += [("seam_default", seam)]
    if seam.fp8_mma:
        base = g.default_config(*shape)  # the 8-warp 3-stage cp.async tile
        one_shot = replace(base, **g.WO_A_ONE_SHOT)
        out = [("old_default", plain), ("seam_default", seam), ("seam_rh", replace(seam, rope_hoist=True)),
               ("seam_rp", replace(seam, rope_preload=True)),
               ("one_shot", one_shot), ("one_shot_rp", replace(one_shot, rope_preload=True)),
               ("w8_rp", replace(base, rope_preload=True)), ("w4_rp", replace(base, num_warps=4, rope_preload=True)),
               ("one_shot_l2p4", replace(one_shot, pdl_l2_blocks=4)),
               ("one_shot_rp_l2p4", replace(one_shot, pdl_l2_blocks=4, rope_preload=True)),
               ("one_shot_late", replace(one_shot, pdl_late=True))]
    else:  # 1 row
        w8 = replace(plain, num_warps=8)
        out += [("w8", w8), ("w8_rh", replace(w8, rope_hoist=True))]
    return distinct_configs(out)


def wo_pair_timing(g, torch, dsv4, timed, make_weights, m_values, with_tma: bool = False) -> dict:
    """wo_a then wo_b on its output (the attention output projection, each call reading the previous one's
    result), T=1, in one graph over distinct weight copies: both without PDL (launch_form) against both as
    default_config picks them."""
    groups, rank, hidden = dsv4.O_GROUPS, dsv4.O_LORA_RANK, dsv4.HIDDEN_SIZE
    copies = 4  # 4 x 67 MB > 4x the L2
    wo_a = make_weights(rank, hidden, groups, copies)
    wo_b = make_weights(hidden, groups * rank, None, copies)
    out = {}
    picks = [("launch_form (no PDL)", g.launch_form), ("default_config", g.default_config)]
    if with_tma:
        import dataclasses

        def tma_pick(*args):
            cfg = g.default_config(*args)
            return dataclasses.replace(cfg, w_tma=True) if cfg.weight_tile_k <= g.TMA_MAX_BOX else cfg
        picks = picks[1:] + [("default_config + TMA weights", tma_pick)]
    for m in m_values:
        o = torch.randn(m, groups, hidden, device="cuda").to(torch.bfloat16)
        for label, pick in picks:
            cfg_a, cfg_b = pick(m, rank, hidden, groups), pick(m, hidden, groups * rank)

            def pair(i, cfg_a=cfg_a, cfg_b=cfg_b):
                y = g.grouped_fp8_wo_a(o, *wo_a[i], config=cfg_a).reshape(m, groups * rank)
                return g.block_fp8_linear(y, *wo_b[i], config=cfg_b)
            out[f"M={m} {label} ({cfg_a.name} + {cfg_b.name})"] = round(
                timed([(lambda i=i: pair(i)) for i in range(copies)]), 3)
    return out


def pdl_chain_check(g, torch, dev: str, smoke: bool, tma: bool = False) -> dict:
    """Exactness of PDL where it matters: a chain in which every GEMV reads the previous one's output,
    captured in one CUDA graph with every launch PDL, against the same launch forms run eagerly without PDL
    (bit-identical expected: the arithmetic is the same; a read of the activation before the previous kernel
    finished, or a store over memory it still reads, would differ). Two chains: the square shared gate/up
    weight [4096, 4096] (1 row FMA, 2 rows rows form, 4 rows FP8 tensor cores, 16 rows bf16 tensor cores)
    and [4096, 1024] / [1024, 4096] alternating (1 row: the one-shot rows form, then split-K FMA); each with 0 / 16
    K blocks prefetched into L2 and with the late trigger. Three replays with fresh inputs each."""
    import dataclasses

    def weight(n, k, copies):
        scale = 2.0 ** round(math.log2(2 / math.sqrt(k)))  # keeps the activations O(1) along the chain
        ws = []
        for _ in range(copies):
            w = (torch.randn(n, k, device=dev) * 0.5).to(g.FP8_DTYPE)
            ws.append((w, torch.full((math.ceil(n / g.FP8_BLOCK), math.ceil(k / g.FP8_BLOCK)), scale, device=dev)))
        return ws
    big, small = (4096, 1024) if not smoke else (256, 128)
    chains = {"square": weight(big, big, 6), "alternating": [w for pair in zip(weight(big, small, 3),
                                                                              weight(small, big, 3)) for w in pair]}
    report = {}
    for name, ws in chains.items():
        for m in ((1, 2, 4, 16) if name == "square" else (1, 2)):
            for blocks, late in ((0, False), (16, False), (4, True)):
                cfgs = [g.launch_form(m, w.shape[0], w.shape[1]) for w, _ in ws]
                pdl_cfgs = [dataclasses.replace(c, pdl=True, pdl_l2_blocks=blocks, pdl_late=late) for c in cfgs]
                if tma:  # the graph's launches with their weights by TMA where the form allows (the eager side without)
                    pdl_cfgs = [dataclasses.replace(c, w_tma=c.weight_tile_k <= g.TMA_MAX_BOX) for c in pdl_cfgs]
                x_static = torch.zeros(m, ws[0][0].shape[1], device=dev, dtype=torch.bfloat16)

                def chain(configs):
                    y = x_static
                    for (w, s), c in zip(ws, configs):
                        y = g.block_fp8_linear(y, w, s, config=c)
                    return y
                key = f"{name} M={m} l2p{blocks}{' late' if late else ''} ({'/'.join(sorted({c.name for c in pdl_cfgs}))})"
                try:
                    chain(pdl_cfgs)  # JIT
                    graph = None
                    if not smoke:
                        stream = torch.cuda.Stream()
                        stream.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(stream):
                            chain(pdl_cfgs)
                        torch.cuda.current_stream().wait_stream(stream)
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            y_graph = chain(pdl_cfgs)
                    worst, equal = 0.0, True
                    for _ in range(3):
                        x_static.copy_(torch.randn(x_static.shape, device=dev).to(torch.bfloat16))
                        if graph is not None:
                            graph.replay()
                            got = y_graph.clone()
                        else:
                            got = chain(pdl_cfgs)
                        want = chain(cfgs)
                        equal = equal and bool(torch.equal(got, want))
                        worst = max(worst, float((got.float() - want.float()).abs().max()))
                    report[key] = {"bit_identical": equal, "max_abs_diff": worst,
                                   "output_rms": round(float(want.float().pow(2).mean().sqrt()), 4)}
                except Exception as exc:
                    report[key] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                    if smoke:
                        raise
                print(f"PDL chain {key}: {report[key]}", flush=True)
    return report


ROPE_LABELS = ("old_default", "rows_n32_u2", "rows_n16_u4", "current_default", "tma", "fma_n64", "tma_n64")


def main(out_dir: str, smoke: bool, dot_sweep: bool = False, xb_sweep: bool = False, q8_sweep: bool = False,
         q8j_sweep: bool = False, chain_final: bool = False, pdl_sweep: bool = False, pdl2_sweep: bool = False,
         tma_sweep: bool = False, tma2_sweep: bool = False, run12_sweep: bool = False,
         run13_sweep: bool = False, run15_sweep: bool = False, run15b_sweep: bool = False,
         run17_sweep: bool = False, run17b_sweep: bool = False, run18_sweep: bool = False,
         run18b_sweep: bool = False, run19_sweep: bool = False, run42_sweep: bool = False,
         run43_sweep: bool = False, name: str | None = None) -> None:
    import torch

    from sglang_sm120.kernels import dsv4
    from sglang_sm120.kernels import fp8_gemv as g
    from sglang_sm120.kernels.harness import devicebench as db

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cpu" if smoke else "cuda"
    t_start = time.time()
    budget_s = float(os.environ.get("FP8_GEMV_BUDGET_S", "150" if run19_sweep or run42_sweep or run43_sweep else "55" if chain_final else "175" if run18_sweep else "170" if run17_sweep or run17b_sweep else "150" if run13_sweep or run15_sweep or run15b_sweep else "110" if tma_sweep or tma2_sweep or run12_sweep else "150" if pdl_sweep else
                                    "140" if xb_sweep or q8_sweep or q8j_sweep else "235"))
    rows = (1, 3, 16) if smoke else ROWS
    run_name, pick = RUN_NAME, candidates
    if dot_sweep:
        rows, run_name, pick = (3, 16) if smoke else (4, 8, 16), DOT_RUN_NAME, dot_candidates
    tps = (2,) if smoke else TPS
    with_rope = not (xb_sweep or q8_sweep or q8j_sweep or chain_final or pdl_sweep)  # runs 5, 6: no fused-RoPE timing (the dense seam does not use it)
    if xb_sweep:
        rows, run_name, pick = (1, 2, 3, 8) if smoke else XB_ROWS, XB_RUN_NAME, xb_candidates
        tps = (2,) if smoke else XB_TPS
    if q8_sweep or q8j_sweep:
        rows, run_name, pick = ((1, 3, 11) if smoke else Q8_ROWS, Q8J_RUN_NAME if q8j_sweep else Q8_RUN_NAME,
                                q8j_candidates if q8j_sweep else q8_candidates)
        tps = (2,) if smoke else Q8_TPS
    if chain_final:
        rows, run_name, pick, tps = (1, 3, 8) if smoke else CHAIN_ROWS, CHAIN_RUN_NAME, chain_candidates, (1,)
    if pdl_sweep:
        rows, run_name, pick = (1, 2, 3, 16) if smoke else ROWS, PDL_RUN_NAME, pdl_candidates
    if pdl2_sweep:
        rows, run_name, pick = (1, 2, 3, 16) if smoke else ROWS, PDL2_RUN_NAME, pdl2_candidates
        pdl_sweep = True  # the same extras: chain exactness, plain op, mixed timings
    if tma_sweep:
        rows, run_name, pick, tps = (1, 2, 4, 8), TMA_RUN_NAME, tma_candidates, (1,)
    if tma2_sweep:
        rows, run_name, pick, tps = (1, 2, 3, 4, 8), TMA2_RUN_NAME, tma2_candidates, TPS
    if run12_sweep:
        rows, run_name, pick, tps = (2, 3, 4, 8), RUN12_NAME, run12_candidates, (1,)
    if run13_sweep:
        rows, run_name, pick, tps = (1, 2, 3, 4, 8), RUN13_NAME, run13_candidates, (1,)
    points13 = RUN13_POINTS
    if run15_sweep or run15b_sweep:
        rows, tps = (2, 4, 8), (1, 2)
        run_name, pick = (RUN15B_NAME, run15b_candidates) if run15b_sweep else (RUN15_NAME, run15_candidates)
        points13, run13_sweep = RUN15_POINTS, True  # run 13's point filter and fused-RoPE timing of every variant
    if run17_sweep or run17b_sweep:
        rows, tps = (1, 2, 4, 8), (1, 2)
        run_name, pick = (RUN17B_NAME, run17b_candidates) if run17b_sweep else (RUN17_NAME, run17_candidates)
        points13, run13_sweep, run17_sweep = RUN17_POINTS, True, True
    if run18_sweep:
        rows, tps, run_name, pick = (1, 2, 8), (1, 8), RUN18_NAME, run18_candidates
        points13, run13_sweep = RUN18_POINTS, True  # run 13's point filter; fused RoPE on every wo_a variant
    if run18b_sweep:
        rows, tps, run_name, pick = (1, 2), (1, 2, 4, 8), RUN18B_NAME, run18b_candidates
        points13, run13_sweep, run18_sweep = RUN18B_POINTS, True, True
    if run19_sweep:
        rows, tps, run_name, pick = (2, 8, 4, 1), (1,), RUN19_NAME, run19_candidates
        points13, run13_sweep, run18_sweep = RUN19_POINTS, True, True  # run 18's: no baselines, every variant's RoPE
    if run43_sweep:  # run 18's arrangement (no baselines) on run 43's points, T=4 first
        rows, tps, run_name, pick = RUN43_ROWS, (4, 8, 2), RUN43_NAME, run43_candidates
        points13, run13_sweep, run18_sweep = RUN43_POINTS, True, True
    if run42_sweep:  # run 19's arrangement on run 42's points and tiles
        rows, tps, run_name, pick = (1,), (1,), RUN42_NAME, run42_candidates
        points13, run13_sweep, run18_sweep, run19_sweep = RUN42_POINTS, True, True, True

    if name:
        run_name = name

    def timed(fns):
        """Median us per call; one graph makes one call per weight copy (every copy once per replay)."""
        return db.time_rotating_calls(fns, dry_run=smoke)

    copy_gbs = float("nan") if smoke else db.copy_bandwidth_gbs()
    print(f"eager copy bandwidth {copy_gbs:.1f} GB/s (read+write)", flush=True)
    upstream_wo_a = upstream_group_quant = None
    if not smoke and not run18_sweep:  # run 18: no upstream baselines (the budget goes to the variants)
        import triton
        import upstream as up

        upstream_wo_a = up.load(UPSTREAM_FILE)._apply_wo_a_bf16_matmul
        quant_kernel = triton.jit(up.load(UPSTREAM_QUANT_FILE)._per_token_group_quant_8bit)

        def upstream_group_quant(x):
            """Upstream's launch of _per_token_group_quant_8bit (fp8_kernel.py:292-329), row-major scales."""
            xq = torch.empty_like(x, dtype=g.FP8_DTYPE)
            xs = torch.empty(x.shape[0], x.shape[1] // g.FP8_BLOCK, device=x.device, dtype=torch.float32)
            quant_kernel[(x.numel() // g.FP8_BLOCK,)](x, xq, xs, g.FP8_BLOCK, g.FP8_BLOCK, 1e-10,
                                                      bit8_min=-g.FP8_MAX, bit8_max=g.FP8_MAX, BLOCK=g.FP8_BLOCK,
                                                      num_warps=1, num_stages=1)
            return xq, xs

    res = db.BenchResult(
        name=run_name,
        title=("Block-FP8 GEMV / grouped wo_a at DSv4-Flash decode shapes: previous default vs "
               + ("tensor-core form variants" if dot_sweep else "x_broadcast rows form" if xb_sweep
                  else "FP8 tensor-core form (split bf16 activation)" if q8_sweep or q8j_sweep
                  else "chained FP8 tensor-core form" if chain_final
                  else "programmatic dependent launch (PDL)" if pdl_sweep
                  else "weight tiles by TMA (PDL as shipped)" if tma_sweep or tma2_sweep
                  else "2..8-row forms at T=1 (PDL as shipped)" if run12_sweep
                  else "wo_a FP8 tile: ring, split, one-shot loads, split-K sums (PDL as shipped)"
                  if run15_sweep or run15b_sweep
                  else "wo_a with the fused inverse RoPE as the seam runs it: RoPE factors hoisted; plain-form variants"
                  if run17_sweep
                  else "<= 8 MiB weights at 4 / 8 rows: one-chunk rows form on 4- / 8-row tiles, bf16 tile with PDL"
                  if run43_sweep
                  else "small GEMVs: batched split-K sums, whole-split chunks loaded before the PDL wait"
                  if run18_sweep
                  else "persistent forms at T=1 (PDL as shipped)" if run13_sweep else "rows form")
               + " (CUDA-graph timed, weight copies rotated past L2)"),
        columns=["linear", "T", "N", "K", "M", "MB", "old_us", "old_form", "old_pct_copy", "best_us", "best_label",
                 "best_pct_copy", "cur_us", "cur_form", "cur_pct_copy", "bf16_us", "fp8_path_us", "einsum_us",
                 "old_rope_us", "cur_rope_us", "max_rel_err"])
    res.extra["copy bandwidth (GB/s, read+write, eager, this run)"] = round(copy_gbs, 1)
    res.extra["L2 rotation"] = (f"each graph calls every one of n distinct weight copies once, n*bytes >= "
                                f"{ROTATE_BYTES >> 20} MiB (min 20 calls)")
    sweep_log = []
    failures = {}
    numerics = {}
    if run18_sweep and not run19_sweep:
        res.extra["PDL chain floor (us per trivial kernel)"] = pdl_floor(torch, timed, smoke)
        print(res.extra["PDL chain floor (us per trivial kernel)"], flush=True)
    if pdl_sweep:
        from triton.backends.nvidia.compiler import CUDAOptions

        # an older Triton would drop launch_pdl silently (the instructions are then no-ops): say which it was
        res.extra["triton launch_pdl option"] = "launch_pdl" in CUDAOptions.__dataclass_fields__
        res.extra["PDL chain exactness (graph with PDL vs eager without)"] = pdl_chain_check(g, torch, dev, smoke)
        _sync(torch)
        bump = torch.zeros(8192, device=dev, dtype=torch.bfloat16)

        def plain_op():  # a small torch kernel launched without PDL (never triggers its dependents early)
            return bump.add_(1.0)
        res.extra["plain torch op alone (us, bump.add_ on 8192 bf16)"] = round(timed([plain_op]), 3)

    def pct(nbytes, us):
        return round(100 * nbytes / (us * 1e-6) / 1e9 / copy_gbs, 1) if copy_gbs == copy_gbs and us == us else float("nan")

    def tensorwise_fp8_mm(x, w):
        """torch's FP8 GEMM that worked at these M on the H200 (run2): tensorwise _scaled_mm, fast accum."""
        xq = x.to(g.FP8_DTYPE)
        one = torch.ones((), device=w.device)
        return lambda: torch._scaled_mm(xq, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                        use_fast_accum=True)

    def make_weights(n, k, groups, copies):
        shape = (n, k) if groups is None else (groups, n, k)
        base = (torch.randn(shape, device=dev) * 0.5).to(g.FP8_DTYPE)
        sshape = (*shape[:-2], math.ceil(n / g.FP8_BLOCK), math.ceil(k / g.FP8_BLOCK))
        scales = torch.exp2(torch.randint(-10, -5, sshape, device=dev).float())  # UE8M0-like
        return [(base.clone(), scales.clone()) for _ in range(copies)]

    if tma_sweep:
        from triton.backends.nvidia.compiler import CUDAOptions

        res.extra["triton launch_pdl option"] = "launch_pdl" in CUDAOptions.__dataclass_fields__
        res.extra["PDL chain exactness, weights by TMA (graph with PDL + TMA vs eager without either)"] = \
            pdl_chain_check(g, torch, dev, smoke, tma=True)
        _sync(torch)
        if not smoke:
            res.extra["wo_a -> wo_b dependent pair, T=1 (us per pair)"] = wo_pair_timing(
                g, torch, dsv4, timed, make_weights, (1, 2, 4, 8), with_tma=True)
            print(res.extra["wo_a -> wo_b dependent pair, T=1 (us per pair)"], flush=True)
    if pdl2_sweep and not smoke:
        res.extra["wo_a -> wo_b dependent pair, T=1 (us per pair)"] = wo_pair_timing(
            g, torch, dsv4, timed, make_weights, (1, 2, 4, 8))
        print(res.extra["wo_a -> wo_b dependent pair, T=1 (us per pair)"], flush=True)

    shapes = []
    for tp in tps:
        for name, (n, k) in dsv4.dense_linear_shapes(tp).items():
            if name in ("wqkv_a", "indexer_wq_b") and tp != tps[0] and not run18_sweep:
                continue  # replicated: the same at every T
            if ((chain_final and name not in CHAIN_LINEARS) or (tma_sweep and name not in TMA_ROWS)
                    or (tma2_sweep and (name, tp) not in TMA2_POINTS)
                    or (run12_sweep and (name, tp) not in RUN12_POINTS)
                    or (run13_sweep and (name, tp) not in points13)):
                continue
            if smoke:
                n, k = min(n, 256), min(k, 1024 if run15_sweep or run17_sweep or run18_sweep else 512)  # run 15: 8 K blocks, split-K at u4
            shapes.append((name, tp, n, k))

    if chain_final:  # the wo_a target first, in case the time budget cuts the run short
        shapes.sort(key=lambda shape: CHAIN_LINEARS.index(shape[0]))
    if tma_sweep:  # likewise: wo_a, the other 32 MiB weights, then the small ones
        shapes.sort(key=lambda shape: list(TMA_ROWS).index(shape[0]))
    if tma2_sweep:
        shapes.sort(key=lambda shape: list(TMA2_POINTS).index(shape[:2]))
    if run12_sweep:
        shapes.sort(key=lambda shape: list(RUN12_POINTS).index(shape[:2]))
    if run13_sweep:
        shapes.sort(key=lambda shape: list(points13).index(shape[:2]))
    for name, tp, n, k in shapes:
        if time.time() - t_start > budget_s:
            res.notes.append(f"stopped before {name} T={tp}: time budget {budget_s:.0f} s reached")
            break
        is_wo_a = name == "wo_a"
        groups = (dsv4.O_GROUPS // tp) if is_wo_a else None
        r = dsv4.O_LORA_RANK if is_wo_a else n
        if smoke and is_wo_a:
            groups, r = max(1, 8 // tp // 4), 128
        nbytes = (groups or 1) * r * k
        copies = 1 if smoke else max(2, math.ceil(ROTATE_BYTES / nbytes))
        weights = make_weights(r, k, groups, copies)
        dq = [g.dequantize_block_fp8(w, s, torch.bfloat16) for w, s in weights[:max(1, copies // 2 + 1)]]
        head, rope = (dsv4.HEAD_DIM, dsv4.ROPE_DIM) if not smoke else (128, 32)
        for m in rows:
            if time.time() - t_start > budget_s:
                break
            if ((tma_sweep and m not in TMA_ROWS[name]) or (tma2_sweep and m not in TMA2_POINTS[name, tp])
                    or (run12_sweep and m not in RUN12_POINTS[name, tp])
                    or (run13_sweep and m not in points13[name, tp])):
                continue
            point = f"{name} T={tp} M={m}"
            try:
                if is_wo_a:
                    x = torch.randn(m, groups, k, device=dev).to(torch.bfloat16)
                    positions = torch.randint(0, 4096, (m,), device=dev)
                    freqs = torch.randn(4096, rope, device=dev)
                    ref = g.reference_grouped_wo_a(x, *weights[0])
                    ref_rope = g.reference_grouped_wo_a(x, *weights[0], positions, freqs, head, rope)

                    def run(w, s, cfg, with_rope=False):
                        if with_rope:
                            return g.grouped_fp8_wo_a(x, w, s, positions=positions, freqs=freqs, head_dim=head,
                                                      rope_dim=rope, config=cfg)
                        return g.grouped_fp8_wo_a(x, w, s, config=cfg)
                else:
                    x = torch.randn(m, k, device=dev).to(torch.bfloat16)
                    ref = g.reference_block_fp8_linear(x, *weights[0])
                    ref_rope = None

                    def run(w, s, cfg, with_rope=False):
                        return g.block_fp8_linear(x, w, s, config=cfg)
            except Exception as exc:
                failures[point] = f"setup {type(exc).__name__}: {str(exc)[:200]}"
                continue
            times, rope_times, max_err = {}, {}, 0.0
            POINT_IS_WO_A[0] = is_wo_a  # run18b_candidates: the seam's forms
            cands = pick(m, r, k, groups or 1, g)
            for label, cfg in cands:
                try:
                    err = db.relative_error(run(*weights[0], cfg), ref)
                    if is_wo_a and with_rope:
                        err = max(err, db.relative_error(run(*weights[0], cfg, True), ref_rope))
                    max_err = max(max_err, err)
                    if smoke:
                        assert err < 1e-2, (point, label, err)
                    us = timed([(lambda w=w, s=s, c=cfg: run(w, s, c)) for w, s in weights])
                    times[label] = us
                    sweep_log.append({"linear": name, "T": tp, "M": m, "label": label, "config": cfg.name,
                                      "launch": effective_launch(cfg, k, g).name,
                                      "us": round(us, 3), "pct_copy": pct(nbytes, us), "rel_err": float(f"{err:.3g}")})
                    if run18b_sweep and cfg.one_chunk and cfg.block_m == 1:  # round 30: the order before X_FIRST
                        with module_flag(g, "ONE_CHUNK_X_FIRST", False):
                            sweep_log[-1]["x_first_off_us"] = round(
                                timed([(lambda w=w, s=s, c=cfg: run(w, s, c)) for w, s in weights]), 3)
                    if pdl_sweep and ((tp == 1 and m in PDL_MIXED_ROWS and label.startswith(("old_default", "pdl")))
                                      or (pdl2_sweep and m in PDL2_MIXED_ROWS)):
                        sweep_log[-1]["mixed_us"] = round(timed([(lambda w=w, s=s, c=cfg: (run(w, s, c), plain_op()))
                                                                 for w, s in weights]), 3)
                    if is_wo_a and with_rope and (label in ROPE_LABELS or run12_sweep or (run13_sweep and (tp == 1 or run15b_sweep or run17_sweep or run18b_sweep))):
                        rope_times[label] = timed([(lambda w=w, s=s, c=cfg: run(w, s, c, True)) for w, s in weights])
                        sweep_log[-1]["rope_us"] = round(rope_times[label], 3)
                except Exception as exc:
                    failures[f"{point} {label} {cfg.name}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    if smoke:
                        raise
                    _sync(torch)
            bf16_us = fp8_path_us = einsum_us = float("nan")
            try:
                if run18_sweep:
                    raise StopIteration  # no baselines
                if is_wo_a:
                    bf16_us = timed([(lambda w=w: torch.einsum("tgd,grd->tgr", x, w)) for w in dq])
                    if upstream_wo_a is not None:
                        einsum_us = timed([(lambda w=w: upstream_wo_a(x, w, is_decode=True)) for w in dq])
                else:
                    bf16_us = timed([(lambda w=w: torch.nn.functional.linear(x, w)) for w in dq])
                    if upstream_group_quant is not None and not chain_final:  # (run 7: GPU time for variants)
                        gemms = [tensorwise_fp8_mm(x, w) for w, _ in weights]
                        fp8_path_us = timed([(lambda f=f: (upstream_group_quant(x), f())) for f in gemms])
            except StopIteration:
                pass
            except Exception as exc:
                failures[f"{point} baselines"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                if not smoke:
                    _sync(torch)
            if not is_wo_a and m == 8 and tp == 1 and not smoke:
                q8_errs = [e["rel_err"] for e in sweep_log
                           if (e["linear"], e["T"], e["M"]) == (name, tp, m)
                           and (e["label"].startswith("q8") or e["config"].startswith("q8"))]
                numerics[name] = {
                    "worst_swept_variant": round(max_err, 6),
                    "worst_fp8_tensor_core_variant": max(q8_errs) if q8_errs else None,
                    "upstream_fp8_activation_emulated": round(db.relative_error(
                        g.reference_upstream_fp8_activation_linear(x, *weights[0]).to(torch.bfloat16), ref), 6),
                    "bf16_rounding_floor": round(db.relative_error(ref.to(torch.bfloat16), ref), 6),
                }
            labels = dict(cands)
            old_us = times.get("old_default", float("nan"))
            cur_label = next((lab for lab, c in cands if c == g.default_config(m, r, k, groups or 1)), "current_default")
            cur_us = times.get(cur_label, float("nan"))
            best_label = min(times, key=times.get) if times else "-"
            best_us = times.get(best_label, float("nan"))
            res.add(linear=name, T=tp, N=(groups or 1) * r, K=k, M=m, MB=round(nbytes / 1e6, 2),
                    old_us=old_us, old_form=labels["old_default"].name, old_pct_copy=pct(nbytes, old_us),
                    best_us=best_us, best_label=f"{best_label} ({labels[best_label].name})" if times else "-",
                    best_pct_copy=pct(nbytes, best_us), cur_us=cur_us, cur_form=labels[cur_label].name if cur_label in labels else "-",
                    cur_pct_copy=pct(nbytes, cur_us), bf16_us=bf16_us, fp8_path_us=fp8_path_us,
                    einsum_us=einsum_us, old_rope_us=rope_times.get("old_default", float("nan")),
                    cur_rope_us=rope_times.get(cur_label, float("nan")), max_rel_err=float(f"{max_err:.3g}"))
            errs = {e["label"]: e["rel_err"] for e in sweep_log if (e["linear"], e["T"], e["M"]) == (name, tp, m)}
            print(f"[{time.time() - t_start:5.0f}s] {point}: "
                  + ", ".join(f"{lab} {us:.2f} (err {errs.get(lab, float('nan')):.3g})" for lab, us in times.items())
                  + f" | bf16 {bf16_us:.2f} fp8path {fp8_path_us:.2f} einsum {einsum_us:.2f} err {max_err:.2g}",
                  flush=True)
        del weights, dq
        res.extra["numerics at M=8, T=1 (relative error vs exact fp32 product of bf16 x and dequantised W)"] = numerics
        res.extra["failures"] = failures
        res.write(out_dir)  # partial results survive a later failure
        with open(os.path.join(out_dir, f"{run_name}-sweep.json"), "w") as f:
            json.dump(sweep_log, f, indent=0)
        if not smoke:
            torch.cuda.empty_cache()

    res.notes += [
        "old_*: the launch form default_config picked before this run; cur_*: the form default_config picks "
        "with the code of this run; best_*: fastest swept variant (every variant in -sweep.json).",
        "*_pct_copy: FP8 weight bytes / time, over the eager copy bandwidth (read+write bytes) of this run.",
        "bf16_us: F.linear (einsum for wo_a) on the bf16-dequantised weight; einsum_us: upstream "
        "_apply_wo_a_bf16_matmul (extracted from the sglang 0.5.23 wheel) on the bf16 weight; fp8_path_us: "
        "upstream's _per_token_group_quant_8bit kernel + torch tensorwise FP8 _scaled_mm (the shape of upstream's "
        "sm_120 FP8-activation path, torch's GEMM standing in for CUTLASS).",
        "wo_a: N is groups x 1024; rope_us columns time the fused inverse RoPE; max_rel_err is the worst relative "
        "error against the float32 reference of every swept variant (plain and fused RoPE).",
    ]
    if chain_final:
        res.notes.append("run 7 variants: old_default, current_default (dropped where equal to old_default), q8jc "
                         "(chained, joined split) and q8c (chained, unjoined split) on the current FP8 tile of each "
                         "shape; each variant's time and relative error is in -sweep.json; fp8_path_us not timed.")
    if tma2_sweep:
        res.notes.append("run 11b variants: old_default = default_config as shipped; fma_n64 = the 1-row FMA form on "
                         "64-column tiles with plain loads (the default's K split); tma_n64* = that tile by TMA with "
                         "3 / 2 / 4 stages and without the L2 prefetch; tma_n128_st2 = 128 columns by TMA, 2 stages; "
                         "tma = the default form by TMA. wo_a rope_us: the fused inverse RoPE.")
    if run12_sweep:
        res.notes.append("run 12 variants (see run12_candidates): old_default = default_config as shipped; q8j_tma = "
                         "that FP8 tile by TMA (wo_a_config's fused-RoPE form); s/2, s/4 = half / a quarter of the "
                         "default's K split; stN = N stages; l2p4 = 4 K blocks prefetched into L2 before the PDL wait; "
                         "q8j_n64_tma = the 64-column FP8 tile on 4 warps by TMA; fma2_* = the 1-row default's "
                         "64-column FMA tile by TMA with 2 rows; rowsR_* = the rows form, R rows per program, on that "
                         "tile. wo_a rope_us: every variant with the fused inverse RoPE.")
    if run43_sweep:
        res.notes.append("run 43 variants (see run43_candidates): old_default = default_config as shipped (wo_a: "
                         "wo_a_config's plain form); before_run43 = the form before run 43's 4-row one-chunk tiles; "
                         "oc_nN_wW = the one-chunk rows form on all M rows, N columns, W "
                         "warps, no split-K, the whole K loaded with its scales before the PDL wait; oc4x2_* = that "
                         "form on 4-row tiles at 8 rows; dot_pdl = the default's bf16 tensor-core tile with PDL (late "
                         "trigger, 4 K blocks into L2 before the wait). No bf16 / upstream baselines.")
    if run42_sweep:
        res.notes.append("run 42 variants (see run42_candidates): old_default = default_config as shipped (wo_a: "
                         "wo_a_config's plain form); seam_default = wo_a_config with the fused RoPE; ocs_nN_bB_wW = "
                         "the one-chunk rows form (activation first) on N columns and W warps, K split into one chunk "
                         "of B blocks per split. wo_a rope_us: every variant with the fused inverse RoPE. No bf16 / "
                         "upstream baselines.")
    elif run19_sweep:
        res.notes.append("run 19 variants (see run19_candidates): old_default = default_config as shipped (wo_a: "
                         "wo_a_config's plain form); seam_default = wo_a_config with the fused RoPE; os = the one-shot "
                         "FP8 program (4 warps, the split's K blocks in one iteration, 8 partials per sum step; wo_a "
                         "with the RoPE: the rope block preloaded); wwN = its first N blocks' weight and scales loaded "
                         "before the PDL wait; n64 = 64-column tiles; w8 = 8 warps. wo_a rope_us: every variant with "
                         "the fused inverse RoPE. No bf16 / upstream baselines.")
    elif run18b_sweep:
        res.notes.append("run 18b variants (see run18b_candidates): old_default = default_config without the "
                         "one-chunk rule (USE_ONE_CHUNK = False, the defaults before this run); current_default = "
                         "with it; sb8 = old_default with 8 split partials per sum step; wk_nN_wW = rows form, no "
                         "split-K, N columns, W warps, the whole K one chunk loaded with its scales before the PDL "
                         "wait; old_seam / seam = wo_a_config with the fused RoPE without / with the rule. wo_a "
                         "rope_us: every variant with the fused inverse RoPE. No bf16 / upstream baselines.")
    elif run18_sweep and not run19_sweep:
        res.notes.append("run 18 variants (see run18_candidates): old_default = default_config as shipped; sb8 = the "
                         "split-K sum loading 8 partials per step; wk_nN_wW = rows form, no split-K, N columns, W "
                         "warps, the whole K one chunk loaded with its scales before the PDL wait (one_chunk); "
                         "oc_nN_sS = the same at K split S (one chunk per split, sb8). wo_a rope_us: every variant "
                         "with the fused inverse RoPE. No bf16 / upstream baselines in this run.")
    if run17b_sweep:
        res.notes.append("run 17b variants (see run17b_candidates): old_default = wo_a_config's plain form (no RoPE) "
                         "as shipped; seam_default = wo_a_config with the fused RoPE as shipped; rh = RoPE cos / sin "
                         "loaded once per program before the K loop (GemvConfig.rope_hoist); rp = the split's rotated "
                         "rope block loaded before the K loop and selected in it (rope_preload; the split is one "
                         "head); rs = the one-shot program's rope block known at compile time (removed after this run); w8 / w4 "
                         "= the 3-stage cp.async FP8 tile on 8 / 4 warps (1 row: the FMA tile on 8 warps); l2p4 = the "
                         "split's 4 weight blocks prefetched into L2 before the PDL wait; late = PDL trigger after the "
                         "main loop. rope_us: "
                         "every variant with the fused inverse RoPE.")
    elif run17_sweep:
        res.notes.append("run 17 variants (see run17_candidates): old_default = wo_a_config's plain form (no RoPE) as "
                         "shipped; seam_default = wo_a_config with the fused RoPE as shipped (the dense seam's T=1 "
                         "path); rh = the RoPE's cos / sin loaded once per program before the K loop, rotation "
                         "branch-free (GemvConfig.rope_hoist); one_shot = 4 warps, a split's 4 K blocks in one "
                         "unpipelined iteration, 8 partials per sum step; w8 / w4 = the 3-stage cp.async FP8 tile on "
                         "8 / 4 warps; tma = by TMA; ef = evict-first weight loads (removed after this run); n64_sN_tma = 64-column FP8 tile, 4 "
                         "warps, K split N, by TMA (late: PDL trigger after the main loop). rope_us: every variant "
                         "with the fused inverse RoPE (T=1 and T=2).")
    if run15b_sweep:
        res.notes.append("run 15b variants (see run15b_candidates): old_default = default_config as shipped; sb8 = "
                         "the last arriver loads 8 partials per step; w4 = 4 warps; uN = N 128-wide K blocks per loop "
                         "iteration, stN = N stages (st1: a program's weight loads issued at once into registers); "
                         "s2x = twice the K split; tma = by TMA (the fused-RoPE form before run 15). rope_us: every "
                         "variant with the fused inverse RoPE, T=1 and T=2.")
    elif run15_sweep:
        res.notes.append("run 15 variants (see run15_candidates): old_default = default_config as shipped; tma = that "
                         "FP8 tile by TMA (the fused-RoPE form before run 15); stN = N stages; s/2, s/4 = half / a "
                         "quarter of the K split, s2x twice; w4 = 4 warps; uN = N 128-wide K blocks per loop iteration "
                         "(st1: no pipeline, a program's weight loads issued at once into registers); sbN = the last "
                         "arriver loads N split partials per step. rope_us (T=1): every variant with the fused "
                         "inverse RoPE.")
    elif run13_sweep and not run18_sweep:
        res.notes.append("run 13 variants (see run13_candidates): old_default = default_config as shipped; tma = that "
                         "form by TMA; ppN = persistent (grid SMs x N programs, each looping over the (tile, K split) "
                         "work items pid, pid + nprog, ...; on the FP8 tile the work-item loop flattened into the K "
                         "loop); s2x = twice the K split; stN = N stages; nf = not flattened; n64 = 64 columns. wo_a "
                         "rope_us: every variant with the fused inverse RoPE.")
    if tma_sweep:
        res.notes.append("run 11 variants: old_default = default_config as shipped (PDL rules of run 9); tma = the same "
                         "form with its weight tiles fetched by TMA (host descriptor over [G, N, K], the K loop "
                         "pipelining the copies through num_stages shared-memory buffers), tma_st2 / tma_st4 with 2 / 4 "
                         "stages, tma_nol2 without the L2 prefetch before the PDL wait. The timing graph calls n "
                         "distinct weight copies back to back (each GEMV the previous one's PDL dependent).")
    if pdl2_sweep:
        res.notes.append("run 9 variants: old_default = launch_form (no PDL, the default before run 8); current_default "
                         "= default_config with run 8's PDL rules; pdl_late = PDL with launch_dependents after the main "
                         "loop; rows_pf* = 2-row rows form with the first weight chunk loaded before the loop (and the "
                         "wait), without / with PDL (l2p16: 16 K blocks prefetched into L2 before the wait). mixed_us "
                         "(M=1/2/8, every T): each GEMV followed by a plain torch kernel, per pair. The timing graph "
                         "calls n distinct weight copies back to back.")
    elif pdl_sweep:
        res.notes.append("run 8 variants: old_default = the current default_config launch form with PDL off; pdl* = "
                         "the same form launched with programmatic dependent launch (l2pN: N K blocks of each "
                         "program's weight prefetched into L2 before griddepcontrol.wait); every variant's time, "
                         "error and, at T=1 M=1/8, mixed_us (each GEMV followed by a plain torch kernel, per pair) "
                         "are in -sweep.json. The timing graph calls n distinct weight copies back to back, so with "
                         "PDL each GEMV overlaps the previous GEMV's drain.")
    json_path, md_path = res.write(out_dir)
    with open(os.path.join(out_dir, f"{run_name}-sweep.json"), "w") as f:
        json.dump(sweep_log, f, indent=0)
    print(f"wrote {json_path} {md_path} in {time.time() - t_start:.0f} s")


def effective_launch(cfg, k: int, g):
    """``cfg`` with split_k as ``_launch`` runs it (whole iterations per split, no empty splits)."""
    import dataclasses

    k_blocks = math.ceil(k / g.FP8_BLOCK)
    split = max(1, min(cfg.split_k, k_blocks))
    per_split = math.ceil(math.ceil(k_blocks / split) / cfg.k_unroll) * cfg.k_unroll
    return dataclasses.replace(cfg, split_k=math.ceil(k_blocks / per_split))


def summarize(bench_dir: str, run_name: str = RUN_NAME) -> str:
    """A run's per-shape table: the previous default against the form ``default_config`` picks now,
    both timed in that run's sweep (the new default must be one of the swept variants)."""
    from sglang_sm120.kernels import dsv4
    from sglang_sm120.kernels import fp8_gemv as g

    res = json.load(open(os.path.join(bench_dir, f"{run_name}.json")))
    sweep = json.load(open(os.path.join(bench_dir, f"{run_name}-sweep.json")))
    copy = res["extra"]["copy bandwidth (GB/s, read+write, eager, this run)"]
    by_point = {}
    for r in sweep:
        by_point.setdefault((r["linear"], r["T"], r["M"]), []).append(r)
    lines = [f"# Block-FP8 GEMV: previous vs new default launch forms ({res['env']['gpu']}, {res['env']['date']})", "",
             f"From `{run_name}.md` / `{run_name}-sweep.json` (one run: torch {res['env']['torch']}, triton "
             f"{res['env']['triton']}). Copy bandwidth measured eagerly in the same run: {copy} GB/s (read+write). "
             "Every call timed in a CUDA graph that calls each of n distinct weight copies once (n x bytes >= 200 MiB, "
             "4x the 50 MB L2), so every weight streams from HBM. %copy = FP8 weight bytes / time / copy bandwidth. "
             "quant+fp8: upstream's per-token-group quant kernel + torch tensorwise FP8 GEMM (the shape of upstream's "
             "sm_120 path); wo_a einsum: upstream `_apply_wo_a_bf16_matmul` on the bf16 weight.", "",
             "| linear | T | M | MB | old form | old us | old %copy | new form | new us | new %copy | new/old | "
             "quant+fp8 us | bf16 us | wo_a einsum us |", "|" + "---|" * 14]
    wo_a_rows = []
    for row in res["rows"]:
        key = (row["linear"], row["T"], row["M"])
        groups = dsv4.O_GROUPS // row["T"] if row["linear"] == "wo_a" else 1
        n, k = row["N"] // groups, row["K"]
        new = effective_launch(g.default_config(row["M"], n, k, groups), k, g)
        old_us = new_us = None
        for r in by_point.get(key, []):
            if r["label"] == "old_default":
                old_us = r["us"]
        cands = candidates(row["M"], n, k, groups, g)
        for label, cfg in cands:
            if effective_launch(cfg, k, g) == new:
                new_us = next((r["us"] for r in by_point.get(key, []) if r["label"] == label), None)
                break
        nbytes = groups * n * k

        def pc(us):
            return f"{100 * nbytes / (us * 1e-6) / 1e9 / copy:.1f}" if us else "-"

        def f2(v):
            return f"{v:.2f}" if isinstance(v, (int, float)) and v == v else "-"
        lines.append(f"| {row['linear']} | {row['T']} | {row['M']} | {nbytes / 1e6:.1f} | {row['old_form']} | "
                     f"{f2(old_us)} | {pc(old_us)} | {new.name if new_us else '(not swept)'} | {f2(new_us)} | "
                     f"{pc(new_us)} | {f2(new_us / old_us) if new_us and old_us else '-'} | {f2(row['fp8_path_us'])} | "
                     f"{f2(row['bf16_us'])} | {f2(row['einsum_us'])} |")
        if row["linear"] == "wo_a" and row["T"] == 1:
            wo_a_rows.append((row["M"], new_us, old_us))
    lines += ["", "wo_a at T=1 (33.5 MB FP8) against the issue's 12 us target: "
              + "; ".join(f"M={m}: {nu:.2f} us (was {ou:.2f})" for m, nu, ou in wo_a_rows if nu and ou) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", action="store_true", help="extract upstream baselines into .upstream/")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks"))
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter run at tiny shapes, no timing")
    parser.add_argument("--dot-sweep", action="store_true", help="sweep the tensor-core form at 4..16 rows instead")
    parser.add_argument("--xb-sweep", action="store_true",
                        help="run 5: x_broadcast rows variants vs the run-3 defaults, M 1..8, T 1 and 4")
    parser.add_argument("--q8-sweep", action="store_true",
                        help="run 6: FP8 tensor-core form (split activation) vs the run-3/5 defaults, M 1..16")
    parser.add_argument("--q8j-sweep", action="store_true",
                        help="run 6b: joined-split FP8 tensor-core variants vs the defaults and run 6's best")
    parser.add_argument("--chain-final", action="store_true",
                        help="run 7: chained FP8 MMAs vs the old and current defaults, wo_a / wq_b / wo_b T=1, M 1..8")
    parser.add_argument("--pdl-sweep", action="store_true",
                        help="run 8: the defaults with programmatic dependent launch on vs off, every shape, M 1..16")
    parser.add_argument("--pdl2-sweep", action="store_true",
                        help="run 9: run 8's PDL defaults vs no PDL, late trigger, 2-row prefetch, wo_a->wo_b pair")
    parser.add_argument("--tma-sweep", action="store_true",
                        help="run 11: the defaults with their weight tiles by TMA (2/3/4 stages), T=1 wo_a/wq_b/wo_b "
                             "M 1..8, shared_down/wqkv_a M 1/2/8, PDL+TMA chain exactness, wo_a->wo_b pair")
    parser.add_argument("--tma2-sweep", action="store_true",
                        help="run 11b: 64-column 1-row TMA tiles, the FP8 tile by TMA with fused RoPE on wo_a at every T")
    parser.add_argument("--run12-sweep", action="store_true",
                        help="run 12: 2..8-row forms (FP8 tile split/stages/TMA/L2, 64-column FMA and rows forms by "
                             "TMA) at wo_a T=1 M 2/3/4/8 and wo_b T=1 M 2/8")
    parser.add_argument("--run13-sweep", action="store_true",
                        help="run 13: persistent forms (1/2/4 programs per SM, split, stages, flatten, TMA) beside the "
                             "defaults at wo_a T=1 M 1/2/3/4/8, wo_b and wq_b T=1 M 1/2/8")
    parser.add_argument("--run15-sweep", action="store_true",
                        help="run 15: wo_a FP8 tile at T=1 M 2/4/8 (T=2 M 4/8 a subset): stages, K split, warps, "
                             "one-shot loads (K blocks per iteration), batched / atomic split-K sums")
    parser.add_argument("--run15b-sweep", action="store_true",
                        help="run 15b: run 15's leads combined (atomic split-K sum, 4 warps, one-shot 4-block program "
                             "on 4 warps, by TMA) at wo_a T=1 M 2/4/8 and T=2 M 4/8, fused RoPE at both")
    parser.add_argument("--run17-sweep", action="store_true",
                        help="run 17: wo_a T=1 M 1/2/4/8 as the seam runs it (fused RoPE) with the RoPE factors hoisted "
                             "out of the K loop, plain-form variants (evict-first, 64-column long splits); T=2 M 4/8")
    parser.add_argument("--run17b-sweep", action="store_true",
                        help="run 17b: run 17's 1-row lead again; the FP8 tile with the split's rotated rope block "
                             "preloaded / the one-shot's rope block static; same points")
    parser.add_argument("--run18-sweep", action="store_true",
                        help="run 18: small GEMVs at 1 row (2 / 8 on the small weights): batched split-K sums, the "
                             "rows form with a whole split loaded before the PDL wait, the PDL chain floor")
    parser.add_argument("--run18b-sweep", action="store_true",
                        help="run 18b: the one-chunk rule (weights <= 8 MiB, 1..2 rows) beside the old default and "
                             "other one-chunk tiles at every distinct <= 8 MiB DSv4 shape, T = 1/2/4/8")
    parser.add_argument("--run19-sweep", action="store_true",
                        help="run 19: the 33.5 MB weights at T=1 (wo_a M 1/2/4/8 with the fused RoPE, wo_b, wq_b): the "
                             "one-shot FP8 program with its weight loaded before the PDL wait")
    parser.add_argument("--run42-sweep", action="store_true",
                        help="run 42: the 33.5 MB weights at T=1, 1 row (wo_a with the fused RoPE, wo_b, wq_b): the "
                             "one-chunk rows form with its activation first, split over K")
    parser.add_argument("--run43-sweep", action="store_true",
                        help="run 43: the <= 8 MiB weights (T = 4 / 8, some T=2) at 4 / 8 rows: the one-chunk rows "
                             "form and the bf16 tile with PDL beside the default")
    parser.add_argument("--name", help="the result files' name (default: the sweep's run name)")
    parser.add_argument("--summarize", metavar="DIR", help="print the old-vs-new default table of the run in DIR")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize), end="")
        sys.exit(0)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()
    if args.prepare:
        prepare()
    else:
        main(args.out, args.smoke, args.dot_sweep, args.xb_sweep, args.q8_sweep, args.q8j_sweep, args.chain_final,
             args.pdl_sweep, args.pdl2_sweep, args.tma_sweep, args.tma2_sweep, args.run12_sweep, args.run13_sweep,
             args.run15_sweep, args.run15b_sweep, args.run17_sweep, args.run17b_sweep, args.run18_sweep,
             args.run18b_sweep, args.run19_sweep, args.run42_sweep, args.run43_sweep, args.name)
