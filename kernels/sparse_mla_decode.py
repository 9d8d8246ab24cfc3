"""Sparse MLA decode attention for DeepSeek-V4-Flash: one tensor-core Triton kernel for sm_120.

Contract: SGLang 0.5.23's seam ``flash_mla_with_kvcache_sm120`` (see
``shared/reference/dsv4-flash-in-sglang-0.5.23.md`` §2.1) with the semantics of upstream's torch
fallback ``_sm120_sparse_decode_fwd``. For each query row ``(b, s)`` the candidates are the main
cache's token slots ``indices[b, s, :topk_length[b]]`` followed by the optional extra cache's
``extra_indices[b, s, :extra_topk_length[b]]``; a slot that is -1 *or outside its cache* is not a
candidate (and is never read). With ``z = softmax_scale * q . kv`` over the 512-wide latent row:

* ``lse = logsumexp(z)`` over the candidates (without the sink; -inf when there are none),
* ``out = sum(exp(z - logaddexp(lse, sink)) * kv)`` (the sink only adds to the denominator),
* a row with no candidate ("lonely") gets ``out = 0`` and ``lse = -inf``, sink or not.

The KV row is the V4 layout (584 B/token, ``kernels/dsv4.py``): 448 FP8-e4m3 nope values in 7
tiles of 64, each with a UE8M0 scale byte in the page's scale section, then 64 bf16 rope values.
Every page size (SWA 256, C4 64, C128 2) is read in place through the cache view's page stride.

Design (why it looks like this; numbers from ``aot_configs()`` on sm_120a and from
``benchmarks/sparse_mla_decode-h200.md``):

* **MQA on the M dimension.** All heads of a head block share one latent KV row, so a program
  holds them (padded to 16 rows for ``tl.dot``) as the M dimension of both products:
  ``S = Q[BH,512] @ KV[BN,512]^T`` and ``O += P[BH,BN] @ KV[BN,512]``, both ``HMMA.16816.F32.BF16``
  on sm_120. The 512-wide row is handled as four 128-column chunks: with one 512-wide operand
  Triton keeps the whole Q fragment (128 registers per thread) live and spills.
* **bf16 dequant, not FP8 QK.** Each gathered tile is dequantised once in registers (FP8 x 2^e is
  exact in bf16) and the same bf16 tile feeds both products, so QK is exact against the reference
  (bf16 products, fp32 sums); only P is rounded to bf16 (relative error ~1.7e-3 at full shapes).
  An FP8/MXFP8 QK would save one bf16 copy of the tile in shared memory but quantise ``q`` and the
  rope to 3 mantissa bits; the bf16 path fits once the tile is 16-32 candidates, so it was kept.
* **Head blocks, KV gathered once per head block.** Shared memory is q (BH x 1 KB) plus one
  bf16 copy of the KV tile (Triton shares it between the two products through a transposed view).
  Below 64 query rows H=64 runs as two programs of 32 heads that gather the same rows (the second
  read mostly hits L2): 67584 B, 217 registers on sm_120a. From 32 rows on, when a row has many
  candidates (``LARGE_BATCH_CONFIGS``, C4 layers and long C128 contexts) it runs one 64-head
  program per row with 16-candidate tiles and no register prefetch (98304 B, 224 registers, no
  spills), which gathers and dequantises each row once. On the H200 that took C4 B=64 from 83.5 to
  74.3 us and C4 at 32 rows from 48.1 to 44.2 us (there as warpgroup MMAs; sm_12x compiles it to 1.9x the
  instructions of the 32-head form for the same work and keeps the latter, :func:`large_batch_form_measured`),
  but was slower at B <= 16 and in C128 at 8K
  (192 candidates), where from 64 rows the 32-head program with the mid-loop KV prefetch runs
  instead (``FEW_CANDIDATES_CONFIGS``; ``benchmarks/sparse_mla_decode-h200-run3.md``, ``-run5-summary.md``).
  H=32 runs one 32-head block, H=16 and H=8 one 16-head block. At very few query rows
  (``SMALL_BATCH_CONFIGS``: one row at H=64, up to two at H=32) H=64/H=32 run as four/two
  16-head programs per row instead (185 registers, 50176 B on sm_120a): the extra gathers mostly
  hit L2 and the row spreads over twice the SMs (H200 run 4: C4 H=64 B=1 12.7 -> 10.9 us).
* **Dequant in the tile's own layout.** The seven UE8M0 bytes of a candidate are packed into one
  int64, so choosing a group's scale is a per-row shift. Loading them as a
  ``[BLOCK_N, 8]`` tile and reducing across lanes made Triton run the whole dequant one element per
  thread, behind a layout conversion of every raw FP8 chunk. The sm_90 main loop went from 1198 to
  1019 instructions, and the 32-head program from 242 to 217 registers on sm_120a. This is also what
  lets the 64-head program fit. The tile form was removed (record:
  ``benchmarks/sparse_mla_decode-h200-run3-summary.md``).
* **Gathers overlap the MMAs.** One loop walks the row's live tiles, main cache first, then the
  extra cache (both read in place through their own page size and page stride); slots are loaded
  two tiles ahead and the raw KV (FP8 nope, bf16 rope, UE8M0 bytes) one tile ahead, in
  registers. With the combine kernel below this took C4, H=64, B=1 from 57.6 to 17.9 us on the
  H200 (``benchmarks/sparse_mla_decode-h200-run1.md`` has the first version).
  ``MID_PREFETCH`` issues the next tile's raw KV after the current tile's QK product instead, so
  the raw registers of two tiles are never live together (the 32-head form at >= 64 rows with few
  candidates; in the 64-head form it was 5% slower than no prefetch at C4 B=64, H200 run 5).
  The 64-head form (no register prefetch) instead asks L2 for the next tile's 128-byte lines with
  ``prefetch.global.L2`` (``L2_PREFETCH``: one instruction per thread, no data registers), slots
  two tiles ahead: 1.008-1.035x on the H200 over no prefetch (runs 6, 7), slower in the 32-head
  forms. Every launch config names one of these three tile loops.
* **Early loads at one query row** (``EARLY_LOADS``, round 29): the query, the sink and the first tile's slots are
  issued before the row's lengths arrive, the slots read as if the row were full and then masked by the lengths (or
  read again where a main list shorter by a tile or more moves the extra cache's tiles), so the first KV gather
  waits for one round trip where it waited for two (sm_90a / sm_120a SASS). Layers 1.002-1.022x at B=1 (H200
  variants run 28), 0.985x for SWA at B=8, hence one row only. Loading the combine's partials, stats and sink
  together was no faster and was removed.
* **Lazy rescale was measured and removed**: 0.73x in the 64-head form, 0.97-1.00x in the others
  (``benchmarks/sparse_mla_decode-h200-run6-summary.md``).
* **Split-K over candidates.** The grid is ``(head_blocks * splits, B * s_q)``; split ``j`` takes
  a contiguous run of the row's live tiles, so B=1 spreads over the GPU. Splits write (acc, max,
  sum) partials (acc in bf16 where ``PARTIAL_BF16``: at C4 B=64 the fp32 partials were 16.8 MB
  written and read back; H200 run 7: 1.03-1.07x at H=64 for one more bf16 rounding, relative
  error 1.7e-3 -> 2.4e-3) and one small combine kernel (all splits of a 16-head block loaded in
  one round trip) merges them, applies the sink and writes ``out`` and ``lse``. A first version
  merged in the last-arriving split (atomic ticket): that single program's serial L2 reads cost
  ~20-30 us at B=1, more than the launch it saved. With one split there is no scratch and no
  second launch; the sink and both caches are always inside the main kernel. The split count
  (``choose_splits``) counts waves: one program fills an SM, so a count whose programs spill into
  a second wave costs a wave more of tiles. In the H200 sweep it picked the fastest timed count in
  every cell. The older rule, ceil(SMs / units), ran B=16 in two waves (51.8 us, now 29.5 us).
* **Graph capture.** Launch geometry and scratch depend only on shapes and the SM count.
* **Programmatic dependent launch** (``USE_PDL``, sm_90+): both launches wait before their first load
  and then let the next launch in, so the decode starts behind the query's norm, the combine behind
  the decode, and wo_a (which loads its first weight block before its own wait) behind the combine.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .dsv4 import (E8M0_BIAS, HEAD_DIM, KV_DATA_BYTES, KV_GROUPS, KV_NUM_TILES, KV_SCALE_BYTES, KV_TILE,
                   KV_TOKEN_BYTES, NOPE_DIM, ROPE_DIM, SPARSE_MLA_MAX_HEADS, kv_page_bytes)
from .harness.aot import AotConfig
from .harness.interpreter import cuda_capability_major, interpreter_enabled
from .pdl import PDL_OPCODES, pdl_launch_dependents, pdl_supported, pdl_wait

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# Launch configuration by padded head count (8 -> 16): heads per program (BLOCK_H; a padded count
# above it runs as several head blocks), candidates per tile, tile loop (KV prefetch in registers),
# warps, pipeline stages. Chosen from the H200 sweep in
# benchmarks/sparse_mla_decode-h200-run3.md among configs that fit sm_120a/sm_121a without spills
# (aot_configs()). H=32 (timed in run 4): the 32-head program stays the default from 3 rows on; the
# 4-warp forms that fit sm_120a (16 heads x 16 candidates; 32 heads x 16 without prefetch) were
# never the fastest form of a run-4 cell.
# Two independent QK accumulation chains measured no gain (H200 run 3,
# benchmarks/sparse_mla_decode-h200-run3-summary.md) and were removed.
# PARTIAL_BF16 (split-K partial accumulators in bf16, half the partial traffic) at H=64: H200 run 7
# (benchmarks/sparse_mla_decode-h200-run7-summary.md) C4 B=16 29.39 -> 28.34 us; at H=32 (B=64) and
# H=16 (B=16) it was within 1%, so those stay fp32.
LAUNCH_CONFIGS = {
    64: dict(BLOCK_H=32, BLOCK_N=32, PREFETCH_KV=True, PARTIAL_BF16=True, num_warps=8, num_stages=1),
    32: dict(BLOCK_H=32, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1),
    16: dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1),
}
# From this many query rows (B * s_q) on, H=64 runs one 64-head program per row (KV gathered and
# dequantised once, 16-candidate tiles, no register prefetch: 224 registers, 98304 B on sm_120a),
# when a row has at least LARGE_BATCH_MIN_CANDIDATES candidate slots (topk + extra topk: shapes
# only). H200 run 3: C4 B=64 83.5 (2 x 32 heads) -> 74.3 us, slower at B <= 16. H200 run 5
# (benchmarks/sparse_mla_decode-h200-run5-summary.md): at 32 rows with 640 candidates (C4 at 8K and
# 64K, C128 at 64K; B=32 s_q=1 and B=16 s_q=2) 1.09x faster than two 32-head programs (48.1 ->
# 44.2 us), but with 192 candidates (C128 at 8K) 0.92x at 32 rows and 0.87-0.89x at 64 rows.
# L2_PREFETCH (H200 run 6, benchmarks/sparse_mla_decode-h200-run6-summary.md): the next tile's
# lines requested from L2 while this tile computes, 1.008-1.035x in every cell of this form (C4 8K
# B=64: 74.13 -> 72.50 us); 228 registers, 98304 B on sm_120a. A lazy rescale was 0.73x here.
# PARTIAL_BF16 (H200 run 7): 1.034-1.067x in every cell of this form (C4 B=32 44.00 -> 41.24 us).
_BH64_LARGE = dict(BLOCK_H=64, BLOCK_N=16, PREFETCH_KV=False, L2_PREFETCH=True, PARTIAL_BF16=True, num_warps=8,
                   num_stages=1)
LARGE_BATCH_CONFIGS = {64: (32, _BH64_LARGE)}
# The 64-head form is chosen only where it was measured as compiled there: on sm_90 Triton runs its products as
# warpgroup MMAs (HGMMA; K loop 963 SASS instructions a tile on sm_90a against 995 for the 32-head form's tile of the
# same head x candidate count). sm_120 has no warpgroup MMA: its HMMA form spreads 64 heads over 8 warps with MMAs
# repeated across warps (160 HMMAs a tile where the 32-head form takes 96) and 733 register moves a tile, 1943
# instructions against the 32-head form's 1022 (sm_120a, Triton 3.8; `tools/sm90_vs_sm120_mma.py`), i.e. 1.9x the issued
# instructions for the same work, where the 32-head form compiles to the same HMMA code on both (1022 / 995). So
# GPUs without warpgroup MMA keep the forms whose code the H200 timed (:func:`large_batch_form_measured`).
LARGE_BATCH_MEASURED_CAPABILITY = 9  # compute capability major of the GPUs the 64-head form was measured on (H200)
# From this many rows on, the same form's combine programs take 128 columns (COMBINE_COLS) when a
# row has two splits (64-66 rows; more rows split otherwise): H200 run 7 at 64 rows (256 combine
# programs) C4 8K B=64 69.85 -> 68.30 us, C4 64K 70.12 -> 68.52, B=32 s_q=2 69.86 -> 67.95; at 32
# rows with 4 splits (128 programs) it was 0.84x, so more splits keep the default widths.
WIDE_COMBINE_CONFIGS = {64: (64, dict(_BH64_LARGE, COMBINE_COLS=128))}
# Measured crossover lies between 192 (slower) and 640 (faster) candidates per row; 384 (C128 at
# 32K context) is not measured.
LARGE_BATCH_MIN_CANDIDATES = 384
# Rows with fewer candidates than that, from this many rows on: two 32-head programs per row with
# the next tile's raw KV issued between the tile's QK and PV products (MID_PREFETCH; 216 registers,
# 67584 B on sm_120a). H200 run 5, C128 at 8K B=64: 28.5 us against 31.9 (64-head form) and 29.2
# (32-head form with the full register prefetch); at 32 rows it was 0.98-1.00x of the latter.
FEW_CANDIDATES_CONFIGS = {
    64: (64, dict(BLOCK_H=32, BLOCK_N=32, PREFETCH_KV=False, MID_PREFETCH=True, num_warps=8, num_stages=1)),
}
# Up to this many query rows (B * s_q), a head count runs 16-head programs instead: each of the
# H/16 programs of a row gathers the row's KV tiles again (mostly from L2), but a program does
# half of a 32-head program's MMA work per tile, so few rows spread over twice as many SMs. H200 run 4 (benchmarks/sparse_mla_decode-h200-run4-summary.md), C4 and C128 at 8K:
# faster in every measured cell up to these row counts (C4 H=64 B=1: 12.7 -> 10.9 us); at H=64,
# 2 rows C4 was 6% slower, so the cut is at 1 row there (4 rows was faster again but is not
# shipped without the 2-3 row cases).
_BLOCK16 = dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1)
# At one query row the decode issues the query, the sink and the first tile's slots before the lengths arrive
# (EARLY_LOADS), so the first KV gather waits for one round trip where it waited for two in a row. H200 variants run 28
# (benchmarks/bench-variants-h200-run28.md, the layer on SGLang's streams against the same kernels without it): B=1
# SWA / C128 / C4 1.016 / 1.007 / 1.002x at T=1 and 1.022 / 1.000 / 1.003x at T=4; B=2 SWA 1.008 / 1.016x; but B=8
# SWA at T=1 0.985x, and level or within 0.3 % at B = 8..64 elsewhere, so only one row takes it.
_BLOCK16_ONE_ROW = dict(_BLOCK16, EARLY_LOADS=True)
SMALL_BATCH_CONFIGS: dict[int, tuple[int, dict]] = {64: (1, _BLOCK16_ONE_ROW), 32: (2, _BLOCK16),
                                                    16: (1, _BLOCK16_ONE_ROW)}
MIN_HEADS = 16  # tl.dot needs M >= 16: H = 8 runs padded to 16 rows
TILE_LOOPS = ("PREFETCH_KV", "MID_PREFETCH", "L2_PREFETCH")  # a launch config sets exactly one
MAX_SPLITS = 32  # bounds the combine's registers (all splits of a block are loaded at once)
COMBINE_SUB_H, COMBINE_WARPS = 16, 4  # combine block: 16 heads x COLS columns per program
COMBINE_BLOCK_VALUES = 512  # splits x columns per combine program (x 16 heads over 128 threads: 64 fp32 each)
WIDE_COMBINE_MAX_SPLITS = 2  # a config's COMBINE_COLS applies up to this many splits (measured at 2)
# Split-count cost model (choose_splits), in units of one tile's time: a program's fixed cost (q,
# slots, epilogue) per wave, and split-K's partial stores + combine launch once.
PROGRAM_OVERHEAD_TILES = 1.0
SPLIT_OVERHEAD_TILES = 0.5
# Programmatic dependent launch (kernels/pdl.py) on sm_90+: the decode launch may start while the kernel before it
# (SGLang's query norm / RoPE) drains, the combine while the decode drains, and the kernel after the attention (wo_a,
# whose one-shot form loads its first weight block before its wait) while the attention drains. Every program waits
# before its first load (q, slots, lengths and caches may all come from kernels earlier in the step) and then lets the
# next launch in: in a multi-wave grid the dependents can only start once the last wave runs.
USE_PDL = True
CPU_PROGRAMS = 8  # "SM count" used to pick splits under the CPU interpreter


def padded_heads(num_heads: int) -> int:
    return max(MIN_HEADS, triton.next_power_of_2(num_heads))


@triton.jit
def _tile_source(u, main_live, idx_row, x_row, n_live, x_live, HAS_EXTRA: tl.constexpr):
    """Which cache live tile ``u`` of a query row reads: (is_main, slot row pointer, first
    candidate, candidates live in that cache). Main-cache tiles come first, then extra-cache ones."""
    if HAS_EXTRA:
        is_main = u < main_live
        start = tl.where(is_main, u, u - main_live)
        row_ptr = tl.where(is_main, idx_row, x_row)
        live = tl.where(is_main, n_live, x_live)
    else:
        is_main = u >= 0
        start = u
        row_ptr = idx_row
        live = n_live
    return is_main, row_ptr, start, live


@triton.jit
def _slot_places(u, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N: tl.constexpr, HAS_EXTRA: tl.constexpr):
    """Where live tile ``u``'s slots are read from (pointers) and which of them count (within the row's candidates
    and before ``u_end``)."""
    is_main, row_ptr, start, live = _tile_source(u, main_live, idx_row, x_row, n_live, x_live, HAS_EXTRA)
    offs = start * BLOCK_N + tl.arange(0, BLOCK_N)
    return row_ptr + offs, (offs < live) & (u < u_end)


@triton.jit
def _load_slots(u, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N: tl.constexpr, HAS_EXTRA: tl.constexpr):
    """Token slots of live tile ``u`` (-1 past the row's candidates or past ``u_end``)."""
    ptrs, ok = _slot_places(u, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N, HAS_EXTRA)
    return tl.load(ptrs, mask=ok, other=-1)


@triton.jit
def _mask_slots(u, u_end, main_live, idx_row, x_row, n_live, x_live, slots, BLOCK_N: tl.constexpr,
                HAS_EXTRA: tl.constexpr):
    """``slots`` of live tile ``u``, read with the bounds of a full row, set to -1 where :func:`_load_slots` would
    mask them. Valid only where the tile reads the same cache and candidates as in a full row (the same
    ``main_live``)."""
    _, ok = _slot_places(u, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N, HAS_EXTRA)
    return tl.where(ok, slots, -1)


@triton.jit
def _load_q(q_row, head_ok, CHUNK: tl.constexpr):
    """The query rows of a head block as four CHUNK-wide column chunks (bf16)."""
    cols = tl.arange(0, CHUNK)
    q0 = tl.load(q_row + cols[None, :], mask=head_ok[:, None], other=0.0)
    q1 = tl.load(q_row + CHUNK + cols[None, :], mask=head_ok[:, None], other=0.0)
    q2 = tl.load(q_row + 2 * CHUNK + cols[None, :], mask=head_ok[:, None], other=0.0)
    q3 = tl.load(q_row + 3 * CHUNK + cols[None, :], mask=head_ok[:, None], other=0.0)
    return q0, q1, q2, q3


@triton.jit
def _tile_rows(u, slots, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride, n_slots,
               x_nope_ptr, x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots,
               DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr, HAS_EXTRA: tl.constexpr):
    """Where live tile ``u``'s candidates lie: (valid, nope, rope and scale base pointers of their
    cache, byte offset of each row's data, byte offset of each row's scale bytes)."""
    if HAS_EXTRA:
        is_main = u < main_live
        nope_p = tl.where(is_main, nope_ptr, x_nope_ptr)
        rope_p = tl.where(is_main, rope_ptr, x_rope_ptr)
        scale_p = tl.where(is_main, scale_ptr, x_scale_ptr)
        p_size = tl.where(is_main, page_size, x_page_size)
        p_stride = tl.where(is_main, page_stride, x_page_stride)
        limit = tl.where(is_main, n_slots, x_n_slots)
    else:
        nope_p, rope_p, scale_p = nope_ptr, rope_ptr, scale_ptr
        p_size, p_stride, limit = page_size, page_stride, n_slots
    valid = (slots >= 0) & (slots < limit)
    slot64 = tl.where(valid, slots, 0).to(tl.int64)
    page = slot64 // p_size
    in_page = slot64 - page * p_size
    data = page * p_stride + in_page * DATA_BYTES
    scale_at = page * p_stride + p_size * DATA_BYTES + in_page * SCALE_BYTES
    return valid, nope_p, rope_p, scale_p, data, scale_at


@triton.jit
def _prefetch_tile_l2(u, slots, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride, n_slots,
                      x_nope_ptr, x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots,
                      BLOCK_N: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr,
                      HAS_EXTRA: tl.constexpr, EMIT: tl.constexpr):
    """Ask L2 for every 128-byte line of live tile ``u`` (data row and scale bytes) without waiting
    for it and without registers for the data (``prefetch.global.L2``): the gather of the tile one
    iteration later then hits L2 instead of paying DRAM latency with the SM idle. Invalid slots
    are not touched. EMIT=False (the CPU interpreter, which has no inline asm) issues nothing;
    a prefetch has no effect on results."""
    if EMIT:
        valid, nope_p, rope_p, scale_p, data, scale_at = _tile_rows(
            u, slots, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride, n_slots, x_nope_ptr,
            x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots, DATA_BYTES, SCALE_BYTES, HAS_EXTRA)
        k = tl.arange(0, 8)
        # lines at data + 0, 128, ..., 512 and the row's last byte (576-byte rows straddle 5-6
        # lines), then the scale bytes; column 7 is unused
        offs = tl.where(k < 5, k * 128, DATA_BYTES - 1)
        base = nope_p.to(tl.pointer_type(tl.uint8), bitcast=True)
        s_base = scale_p.to(tl.pointer_type(tl.uint8), bitcast=True)
        ptrs = tl.where(k[None, :] == 6, s_base + scale_at[:, None], base + data[:, None] + offs[None, :])
        on = valid[:, None] & (k < 7)[None, :]
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, on.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _load_tile(u, slots, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride, n_slots,
               x_nope_ptr, x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots,
               BLOCK_N: tl.constexpr, TILE: tl.constexpr, NOPE_TILES: tl.constexpr, NOPE: tl.constexpr,
               DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr, HAS_EXTRA: tl.constexpr):
    """Issue the raw loads of one tile (FP8 nope in four 128-byte chunks, bf16 rope, UE8M0 scale
    bytes packed into one int64 per candidate) straight from the paged cache; out-of-range and -1
    slots are masked, never read."""
    valid, nope_p, rope_p, scale_p, data, scale_at = _tile_rows(
        u, slots, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride, n_slots, x_nope_ptr,
        x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots, DATA_BYTES, SCALE_BYTES, HAS_EXTRA)
    cols = tl.arange(0, 2 * TILE)
    first = cols < TILE
    row = nope_p + data[:, None] + cols[None, :]
    n0 = tl.load(row, mask=valid[:, None], other=0.0)
    n1 = tl.load(row + 2 * TILE, mask=valid[:, None], other=0.0)
    n2 = tl.load(row + 4 * TILE, mask=valid[:, None], other=0.0)
    n3 = tl.load(row + 6 * TILE, mask=valid[:, None] & first[None, :], other=0.0)  # group 6; 7 is the rope
    # the rope lands in columns 64..127 of the last chunk (lanes 0..63 are masked, never loaded)
    rope = tl.load(rope_p + ((data + NOPE) // 2)[:, None] + (cols - TILE)[None, :],
                   mask=valid[:, None] & (cols >= TILE)[None, :], other=0.0)
    scale_row = scale_p + scale_at
    # the 7 bytes packed into one int64 per candidate: the dequant stays in the tile's layout (a
    # [BLOCK_N, 8] tile of bytes measured more instructions and registers: H200 run 3)
    scales = tl.zeros((BLOCK_N,), tl.int64)
    for grp in tl.static_range(NOPE_TILES):
        byte = tl.load(scale_row + grp, mask=valid, other=0)
        scales = scales | (byte.to(tl.int64) << (8 * grp))
    return valid, n0, n1, n2, n3, rope, scales


@triton.jit
def _dequant(nope, scales, rope, C: tl.constexpr, TILE: tl.constexpr, NOPE_TILES: tl.constexpr):
    """Chunk C (columns 128 C .. 128 C + 127) of the tile in bf16, exactly: FP8 groups 2C, 2C+1
    times 2 ** (scale byte - 127); the last chunk's second group is the rope. The scale bytes
    arrive packed per candidate ([BLOCK_N] int64), so picking a group's byte is a per-row shift
    instead of a cross-lane reduction over a [BLOCK_N, 8] tile (whose layout Triton then also
    imposed on the whole dequant, one element per thread at a time)."""
    first = tl.arange(0, 2 * TILE) < TILE
    lo = ((scales >> (16 * C)) & 0xFF).to(tl.int32)
    if 2 * C + 1 < NOPE_TILES:
        hi = ((scales >> (16 * C + 8)) & 0xFF).to(tl.int32)
        byte = tl.where(first[None, :], lo[:, None], hi[:, None])
        kv = nope.to(tl.float32) * (byte << 23).to(tl.float32, bitcast=True)
    else:
        scale = (lo << 23).to(tl.float32, bitcast=True)
        kv = tl.where(first[None, :], nope.to(tl.float32) * scale[:, None], rope.to(tl.float32))
    return kv.to(tl.bfloat16)


@triton.jit
def _scores(q0, q1, q2, q3, valid, n0, n1, n2, n3, rope, scales, qk_scale, TILE: tl.constexpr,
            NOPE_TILES: tl.constexpr):
    """Dequantise one raw tile and compute all heads' base-2 logits against it: ``(s, kv0..kv3)``.
    The 512-wide row is four 128-column chunks so each MMA operand fragment stays small."""
    kv0 = _dequant(n0, scales, rope, 0, TILE, NOPE_TILES)
    kv1 = _dequant(n1, scales, rope, 1, TILE, NOPE_TILES)
    kv2 = _dequant(n2, scales, rope, 2, TILE, NOPE_TILES)
    kv3 = _dequant(n3, scales, rope, 3, TILE, NOPE_TILES)
    s = tl.dot(q0, tl.trans(kv0))
    s = tl.dot(q1, tl.trans(kv1), s)
    s = tl.dot(q2, tl.trans(kv2), s)
    s = tl.dot(q3, tl.trans(kv3), s)
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    return s, kv0, kv1, kv2, kv3


@triton.jit
def _fold(s, kv0, kv1, kv2, kv3, m_i, l_i, acc0, acc1, acc2, acc3):
    """Fold one tile's logits ``s`` (base 2, -inf where invalid) and its bf16 KV into all heads'
    running (max, sum, acc); the accumulator is rescaled every tile (a lazy rescale that skipped
    it was 0.73x on the H200: benchmarks/sparse_mla_decode-h200-run6-summary.md)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    pb = p.to(tl.bfloat16)
    acc0 = tl.dot(pb, kv0, acc0 * alpha[:, None])
    acc1 = tl.dot(pb, kv1, acc1 * alpha[:, None])
    acc2 = tl.dot(pb, kv2, acc2 * alpha[:, None])
    acc3 = tl.dot(pb, kv3, acc3 * alpha[:, None])
    return m_new, l_i, acc0, acc1, acc2, acc3


@triton.jit
def _attend(q0, q1, q2, q3, m_i, l_i, acc0, acc1, acc2, acc3, valid, n0, n1, n2, n3, rope, scales, qk_scale,
            TILE: tl.constexpr, NOPE_TILES: tl.constexpr):
    """Fold one raw tile into all heads' running (max, sum, acc), logits in base 2."""
    s, kv0, kv1, kv2, kv3 = _scores(q0, q1, q2, q3, valid, n0, n1, n2, n3, rope, scales, qk_scale, TILE,
                                    NOPE_TILES)
    return _fold(s, kv0, kv1, kv2, kv3, m_i, l_i, acc0, acc1, acc2, acc3)


@triton.jit
def _store_chunk(ptr, value, heads, row_stride, mask, CHUNK: tl.constexpr, C: tl.constexpr):
    cols = C * CHUNK + tl.arange(0, CHUNK)
    tl.store(ptr + heads[:, None] * row_stride + cols[None, :], value, mask=mask[:, None])


@triton.jit
def _load_sink(sink_ptr, heads, head_ok, HAS_SINK: tl.constexpr):
    """The heads' sink logits (fp32; -inf for padded heads and without a sink)."""
    if HAS_SINK:
        return tl.load(sink_ptr + heads, mask=head_ok, other=float("-inf")).to(tl.float32)
    return tl.full(heads.shape, float("-inf"), tl.float32)


@triton.jit
def _finish_stats(m_i, l_i, sink, HAS_SINK: tl.constexpr):
    """(output scale, natural-log LSE without the sink) from the base-2 running max and sum.
    The sink (``_load_sink``) only adds exp(sink) to the softmax denominator; a row with no candidate gets
    scale 0 and LSE -inf, sink or not."""
    has = l_i > 0.0
    m_use = tl.where(has, m_i, 0.0)
    denom = l_i
    if HAS_SINK:
        denom = denom + tl.exp2(sink * 1.4426950408889634 - m_use)
    scale = tl.where(has, 1.0 / tl.where(has, denom, 1.0), 0.0)
    lse = tl.where(has, (m_use + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    return scale, lse


@triton.jit
def sparse_mla_decode_kernel(
        q_ptr, out_ptr, lse_ptr, sink_ptr,
        nope_ptr, rope_ptr, scale_ptr, idx_ptr, len_ptr,
        x_nope_ptr, x_rope_ptr, x_scale_ptr, x_idx_ptr, x_len_ptr,
        part_acc_ptr, part_ml_ptr,
        s_q, num_heads, q_stride_b, q_stride_s, q_stride_h,
        topk, idx_stride_b, idx_stride_s, page_size, page_stride, n_slots,
        x_topk, x_idx_stride_b, x_idx_stride_s, x_page_size, x_page_stride, x_n_slots,
        tiles_per_split, num_splits, qk_scale,
        BLOCK_H: tl.constexpr, HEAD_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEN: tl.constexpr,
        HAS_EXTRA: tl.constexpr, HAS_X_LEN: tl.constexpr, HAS_SINK: tl.constexpr, SPLIT_K: tl.constexpr,
        PREFETCH_KV: tl.constexpr, MID_PREFETCH: tl.constexpr, EMIT_ASM: tl.constexpr, D: tl.constexpr,
        TILE: tl.constexpr, NOPE_TILES: tl.constexpr, NOPE: tl.constexpr,
        DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr, PDL: tl.constexpr = False,
        EARLY_LOADS: tl.constexpr = False):
    """Grid ``(HEAD_BLOCKS * splits, B * s_q)``; see the module docstring. Split ``j`` of a query
    row takes live tiles ``[j * tiles_per_split, (j + 1) * tiles_per_split)`` of the row's
    candidate list (main cache, then extra cache), prefetching slots two tiles and KV one tile
    ahead (in registers: PREFETCH_KV, MID_PREFETCH; else in L2) so the gathers overlap the
    tensor-core work. PDL (:data:`USE_PDL`): wait, then let the next launch in, before any load."""
    CHUNK: tl.constexpr = 2 * TILE
    pdl_wait(PDL)
    pdl_launch_dependents(PDL)
    head_block = tl.program_id(0) % HEAD_BLOCKS
    split = tl.program_id(0) // HEAD_BLOCKS
    row = tl.program_id(1)
    b = row // s_q
    sq = row - b * s_q

    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads
    q_row = q_ptr + b * q_stride_b + sq * q_stride_s + heads[:, None] * q_stride_h
    idx_row = idx_ptr + b * idx_stride_b + sq * idx_stride_s
    x_row = idx_row
    full_main = tl.cdiv(topk, BLOCK_N)
    full_tiles = full_main
    if HAS_EXTRA:
        x_row = x_idx_ptr + b * x_idx_stride_b + sq * x_idx_stride_s
        full_tiles += tl.cdiv(x_topk, BLOCK_N)
    u_lo = split * tiles_per_split
    if EARLY_LOADS:
        # The loads that need nothing but the program's coordinates go out together, before any of them is used: the
        # query, the sink, and the first tile's slots read as if the row's lengths were its top-k sizes (a full row,
        # the steady decode state); then the lengths. The first KV gather so waits for one round trip (lengths and
        # slots at once) instead of two in a row.
        q0, q1, q2, q3 = _load_q(q_row, head_ok, CHUNK)
        sink = _load_sink(sink_ptr, heads, head_ok, HAS_SINK and not SPLIT_K)
        slots = _load_slots(u_lo, tl.minimum(u_lo + tiles_per_split, full_tiles), full_main, idx_row, x_row, topk,
                            x_topk, BLOCK_N, HAS_EXTRA)

    n_live = topk
    if HAS_LEN:
        n_live = tl.minimum(n_live, tl.load(len_ptr + b))
    main_live = tl.cdiv(n_live, BLOCK_N)
    live_tiles = main_live
    x_live = 0
    if HAS_EXTRA:
        x_live = x_topk
        if HAS_X_LEN:
            x_live = tl.minimum(x_live, tl.load(x_len_ptr + b))
        live_tiles += tl.cdiv(x_live, BLOCK_N)
    u_end = tl.minimum(u_lo + tiles_per_split, live_tiles)
    if not EARLY_LOADS:
        slots = _load_slots(u_lo, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N, HAS_EXTRA)
    elif HAS_LEN or HAS_X_LEN:
        if main_live == full_main:  # tile u_lo reads the cache and candidates it was read from: mask past the lengths
            slots = _mask_slots(u_lo, u_end, main_live, idx_row, x_row, n_live, x_live, slots, BLOCK_N, HAS_EXTRA)
        else:  # a main list shorter than its top-k moves the extra cache's tiles: read them again
            slots = _load_slots(u_lo, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N, HAS_EXTRA)

    if PREFETCH_KV or MID_PREFETCH:  # KV of tile u_lo now, slots of tile u_lo + 1
        valid, n0, n1, n2, n3, rope, scales = _load_tile(
            u_lo, slots, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride, n_slots, x_nope_ptr,
            x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots, BLOCK_N, TILE, NOPE_TILES, NOPE,
            DATA_BYTES, SCALE_BYTES, HAS_EXTRA)
        slots = _load_slots(u_lo + 1, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N, HAS_EXTRA)
    if not EARLY_LOADS:
        q0, q1, q2, q3 = _load_q(q_row, head_ok, CHUNK)
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc0 = tl.zeros((BLOCK_H, CHUNK), tl.float32)
    acc1 = tl.zeros((BLOCK_H, CHUNK), tl.float32)
    acc2 = tl.zeros((BLOCK_H, CHUNK), tl.float32)
    acc3 = tl.zeros((BLOCK_H, CHUNK), tl.float32)

    if PREFETCH_KV:  # KV one tile ahead and slots two tiles ahead, in registers
        for u in range(u_lo, u_end):
            c_valid, c0, c1, c2, c3, c_rope, c_scales = valid, n0, n1, n2, n3, rope, scales
            valid, n0, n1, n2, n3, rope, scales = _load_tile(
                u + 1, slots, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride, n_slots, x_nope_ptr,
                x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots, BLOCK_N, TILE, NOPE_TILES, NOPE,
                DATA_BYTES, SCALE_BYTES, HAS_EXTRA)
            slots = _load_slots(u + 2, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N, HAS_EXTRA)
            m_i, l_i, acc0, acc1, acc2, acc3 = _attend(q0, q1, q2, q3, m_i, l_i, acc0, acc1, acc2, acc3, c_valid,
                                                       c0, c1, c2, c3, c_rope, c_scales, qk_scale, TILE, NOPE_TILES)
    elif MID_PREFETCH:  # the next tile's raw KV is issued between this tile's QK and its PV product
        for u in range(u_lo, u_end):
            s, kv0, kv1, kv2, kv3 = _scores(q0, q1, q2, q3, valid, n0, n1, n2, n3, rope, scales, qk_scale, TILE,
                                            NOPE_TILES)
            valid, n0, n1, n2, n3, rope, scales = _load_tile(
                u + 1, slots, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride, n_slots, x_nope_ptr,
                x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots, BLOCK_N, TILE, NOPE_TILES, NOPE,
                DATA_BYTES, SCALE_BYTES, HAS_EXTRA)
            slots = _load_slots(u + 2, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N, HAS_EXTRA)
            m_i, l_i, acc0, acc1, acc2, acc3 = _fold(s, kv0, kv1, kv2, kv3, m_i, l_i, acc0, acc1, acc2, acc3)
    else:  # L2_PREFETCH: slots two tiles ahead; the next tile's lines asked of L2, not of registers
        # (a loop with no prefetch at all was 1.008-1.035x slower in the 64-head form, H200 runs 6
        # and 7: benchmarks/sparse_mla_decode-h200-run7-summary.md; removed)
        slots_next = _load_slots(u_lo + 1, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N, HAS_EXTRA)
        for u in range(u_lo, u_end):
            c_valid, c0, c1, c2, c3, c_rope, c_scales = _load_tile(
                u, slots, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride, n_slots, x_nope_ptr,
                x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots, BLOCK_N, TILE, NOPE_TILES, NOPE,
                DATA_BYTES, SCALE_BYTES, HAS_EXTRA)
            _prefetch_tile_l2(u + 1, slots_next, main_live, nope_ptr, rope_ptr, scale_ptr, page_size, page_stride,
                              n_slots, x_nope_ptr, x_rope_ptr, x_scale_ptr, x_page_size, x_page_stride, x_n_slots,
                              BLOCK_N, DATA_BYTES, SCALE_BYTES, HAS_EXTRA, EMIT_ASM)
            slots = slots_next
            slots_next = _load_slots(u + 2, u_end, main_live, idx_row, x_row, n_live, x_live, BLOCK_N, HAS_EXTRA)
            m_i, l_i, acc0, acc1, acc2, acc3 = _attend(q0, q1, q2, q3, m_i, l_i, acc0, acc1, acc2, acc3, c_valid,
                                                       c0, c1, c2, c3, c_rope, c_scales, qk_scale, TILE, NOPE_TILES)

    if SPLIT_K:  # publish (acc, max, sum); sparse_mla_combine_kernel merges the splits
        unit = row * HEAD_BLOCKS + head_block
        local = tl.arange(0, BLOCK_H)
        everyone = local >= 0
        mine = part_acc_ptr + (unit * num_splits + split) * BLOCK_H * D
        part_ty = part_acc_ptr.dtype.element_ty  # fp32, or bf16 (PARTIAL_BF16: half the traffic)
        _store_chunk(mine, acc0.to(part_ty), local, D, everyone, CHUNK, 0)
        _store_chunk(mine, acc1.to(part_ty), local, D, everyone, CHUNK, 1)
        _store_chunk(mine, acc2.to(part_ty), local, D, everyone, CHUNK, 2)
        _store_chunk(mine, acc3.to(part_ty), local, D, everyone, CHUNK, 3)
        stats = part_ml_ptr + (unit * num_splits + split) * 2 * BLOCK_H
        tl.store(stats + local, m_i)
        tl.store(stats + BLOCK_H + local, l_i)
    else:
        if not EARLY_LOADS:
            sink = _load_sink(sink_ptr, heads, head_ok, HAS_SINK)
        scale, lse = _finish_stats(m_i, l_i, sink, HAS_SINK)
        out_row = out_ptr + row * num_heads * D
        _store_chunk(out_row, (acc0 * scale[:, None]).to(tl.bfloat16), heads, D, head_ok, CHUNK, 0)
        _store_chunk(out_row, (acc1 * scale[:, None]).to(tl.bfloat16), heads, D, head_ok, CHUNK, 1)
        _store_chunk(out_row, (acc2 * scale[:, None]).to(tl.bfloat16), heads, D, head_ok, CHUNK, 2)
        _store_chunk(out_row, (acc3 * scale[:, None]).to(tl.bfloat16), heads, D, head_ok, CHUNK, 3)
        tl.store(lse_ptr + row * num_heads + heads, lse, mask=head_ok)


@triton.jit
def sparse_mla_combine_kernel(part_acc_ptr, part_ml_ptr, out_ptr, lse_ptr, sink_ptr, num_heads, num_splits,
                              BLOCK_H: tl.constexpr, HEAD_BLOCKS: tl.constexpr, SUB_H: tl.constexpr,
                              COLS: tl.constexpr, SPLITS: tl.constexpr, D: tl.constexpr, HAS_SINK: tl.constexpr,
                              PDL: tl.constexpr = False):
    """Merge the splits of one (query row, head block): grid ``(units, BLOCK_H / SUB_H, D / COLS)``,
    each program one [SUB_H, COLS] block, all splits loaded at once (one round trip to L2). PDL as the
    decode kernel's."""
    pdl_wait(PDL)
    pdl_launch_dependents(PDL)
    unit = tl.program_id(0)
    local = tl.program_id(1) * SUB_H + tl.arange(0, SUB_H)
    c0 = tl.program_id(2) * COLS
    row = unit // HEAD_BLOCKS
    heads = (unit % HEAD_BLOCKS) * BLOCK_H + local
    head_ok = heads < num_heads
    j = tl.arange(0, SPLITS)
    j_ok = j < num_splits
    # (Loading the partials, stats and sink before any is used, volatile so that ptxas keeps that order, was no faster
    # at one row and 0.99x at B = 32 in the layer: H200 variants run 28, COMBINE_ONE_TRIP; removed.)
    stats = part_ml_ptr + ((unit * num_splits + j) * 2 * BLOCK_H)[:, None] + local[None, :]
    m_j = tl.load(stats, mask=j_ok[:, None], other=float("-inf"))
    l_j = tl.load(stats + BLOCK_H, mask=j_ok[:, None], other=0.0)
    m = tl.max(m_j, 0)
    w = tl.exp2(m_j - tl.where(m == float("-inf"), 0.0, m)[None, :])
    w = tl.where(j_ok[:, None], w, 0.0)
    l_sum = tl.sum(l_j * w, 0)
    cols = c0 + tl.arange(0, COLS)
    part = part_acc_ptr + ((unit * num_splits + j) * BLOCK_H * D)[:, None, None] + (local * D)[None, :, None] \
        + cols[None, None, :]
    acc = tl.sum(tl.load(part, mask=j_ok[:, None, None], other=0.0).to(tl.float32) * w[:, :, None], 0)
    scale, lse = _finish_stats(m, l_sum, _load_sink(sink_ptr, heads, head_ok, HAS_SINK), HAS_SINK)
    tl.store(out_ptr + (row * num_heads + heads)[:, None] * D + cols[None, :], (acc * scale[:, None]).to(tl.bfloat16),
             mask=head_ok[:, None])
    tl.store(lse_ptr + row * num_heads + heads, lse, mask=head_ok & (c0 == 0))


# --------------------------------------------------------------------------------------------------
# host side


def _fail(name: str, expected: str, got) -> None:
    raise ValueError(f"{name}: expected {expected}, got {got}")


def _describe(t) -> str:
    return "None" if t is None else f"{type(t).__name__} {tuple(t.shape)} {t.dtype} on {t.device}"


def _check_cache(name: str, cache, device) -> None:
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4 or cache.shape[2] != 1 \
            or cache.shape[3] != KV_TOKEN_BYTES or cache.dtype not in (torch.uint8, torch.float8_e4m3fn):
        _fail(name, f"[pages, page_size, 1, {KV_TOKEN_BYTES}] uint8/float8_e4m3fn (V4 layout)", _describe(cache))
    if cache.device != device:
        _fail(name, f"a tensor on {device} (q's device)", _describe(cache))
    if cache.stride(3) != 1 or cache.stride(1) % 2 or cache.stride(0) % 2 or cache.data_ptr() % 2:
        _fail(name, "a view with unit byte stride and even page/row strides", f"strides {cache.stride()}")
    if cache.shape[1] > 1 and cache.stride(1) != KV_TOKEN_BYTES:  # a page's bytes are addressed from its start
        _fail(name, f"a page's rows {KV_TOKEN_BYTES} bytes apart (row stride {KV_TOKEN_BYTES})",
              f"row stride {cache.stride(1)}")
    if cache.shape[0] > 1 and cache.stride(0) < cache.shape[1] * KV_TOKEN_BYTES:
        _fail(name, f"page stride >= page_size * {KV_TOKEN_BYTES} bytes", f"page stride {cache.stride(0)}")


def _check_indices(name: str, idx, batch: int, s_q: int, device) -> None:
    if not isinstance(idx, torch.Tensor) or idx.dim() != 3 or tuple(idx.shape[:2]) != (batch, s_q) \
            or idx.dtype != torch.int32:
        _fail(name, f"[{batch}, {s_q}, topk] int32 token slots (-1 = invalid)", _describe(idx))
    if idx.device != device:
        _fail(name, f"a tensor on {device} (q's device)", _describe(idx))
    if idx.shape[2] and idx.stride(2) != 1:
        _fail(name, "unit stride along topk", f"strides {idx.stride()}")


def _check_lengths(name: str, lengths, batch: int, device) -> None:
    if lengths is None:
        return
    if not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != (batch,) or lengths.dtype != torch.int32:
        _fail(name, f"None or [{batch}] int32", _describe(lengths))
    if lengths.device != device:
        _fail(name, f"a tensor on {device} (q's device)", _describe(lengths))
    if batch > 1 and lengths.stride(0) != 1:  # the kernel reads lengths[b] at b
        _fail(name, "unit stride", f"stride {lengths.stride(0)}")


def _new_buffer(shape, dtype, device) -> torch.Tensor:
    """Every output and scratch buffer comes from here (tests poison them with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _cache_views(cache):
    raw = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    return raw.view(torch.float8_e4m3fn), raw.view(torch.bfloat16), raw


@functools.lru_cache(maxsize=None)
def _program_target(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    return CPU_PROGRAMS


def large_batch_form_measured(device=None) -> bool:
    """Whether ``device`` compiles the 64-head large-batch form as the H200 that timed it did (warpgroup MMAs: compute
    capability 9.x; see :data:`LARGE_BATCH_MEASURED_CAPABILITY`). No device, or the CPU interpreter: True (the table
    as measured). The sm_12x dispatch check (tools/device_sm120_dispatch.py) answers this query as sm_12x does."""
    major = cuda_capability_major(device)
    return major is None or major == LARGE_BATCH_MEASURED_CAPABILITY


def launch_config_for(num_heads: int, rows: int, candidates: int | None = None, device=None) -> dict:
    """The default launch configuration for ``num_heads`` heads, ``rows`` query rows (B * s_q) and
    ``candidates`` slots per row (topk + extra topk; None: as many as a C4 layer) on ``device`` (None: the table as
    the H200 measured it; a GPU without warpgroup MMA, sm_12x among them, keeps the 32-head form where the H200 took
    the 64-head one: :func:`large_batch_form_measured`)."""
    heads = padded_heads(num_heads)
    small = SMALL_BATCH_CONFIGS.get(heads)
    if small is not None and rows <= small[0]:
        return small[1]
    large = LARGE_BATCH_CONFIGS.get(heads)
    if large is not None and rows >= large[0]:
        if candidates is None or candidates >= LARGE_BATCH_MIN_CANDIDATES:
            if large_batch_form_measured(device):
                wide = WIDE_COMBINE_CONFIGS.get(heads)
                return wide[1] if wide is not None and rows >= wide[0] else large[1]
            return LAUNCH_CONFIGS[heads]
        few = FEW_CANDIDATES_CONFIGS.get(heads)
        if few is not None and rows >= few[0]:
            return few[1]
    return LAUNCH_CONFIGS[heads]


def _combine_width(cfg: dict, splits: int) -> int:
    """Columns per combine program for launch config ``cfg`` at ``splits`` splits."""
    wide = cfg.get("COMBINE_COLS", 32) if splits <= WIDE_COMBINE_MAX_SPLITS else 32
    return combine_cols(splits, wide)


def combine_cols(splits: int, widest: int = 32) -> int:
    """Columns per combine program (at most ``widest``): narrower for many splits so the
    [splits, 16, cols] block stays in registers (at most COMBINE_BLOCK_VALUES values)."""
    return max(16, min(widest, COMBINE_BLOCK_VALUES // triton.next_power_of_2(splits)))


def choose_splits(units: int, total_tiles: int, device, max_splits: int = MAX_SPLITS) -> tuple[int, int]:
    """(splits, tiles per split) for ``units`` (query row, head block) pairs, from shapes and the
    SM count only, so a CUDA graph replays the same launch.

    One decode program fills an SM (registers), so the time is about (waves of programs) x (tiles
    per program + a program's fixed cost), plus a fixed cost for the partials and the combine
    launch when split: pick the split count that minimises that (fewest splits on ties). A split count that spills into a
    second wave of programs is what made B=16 and B=64 slow under the earlier "ceil(SMs / units)"
    rule (``benchmarks/sparse_mla_decode-h200.md``)."""
    target = _program_target(str(device))
    total_tiles = max(total_tiles, 1)
    best = None
    for splits in range(1, min(total_tiles, max_splits) + 1):
        per = -(-total_tiles // splits)
        if -(-total_tiles // per) != splits:  # same tiles per program as a smaller split count
            continue
        waves = -(-(units * splits) // target)
        cost = waves * (per + PROGRAM_OVERHEAD_TILES) + (SPLIT_OVERHEAD_TILES if splits > 1 else 0.0)
        if best is None or cost < best[0]:
            best = (cost, splits, per)
    return best[1], best[2]


def sparse_mla_decode(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
                      extra_k_cache=None, extra_indices=None, extra_topk_length=None, *, num_splits=None,
                      launch_config=None):
    """Sparse MLA decode over V4-layout paged caches. Returns ``(out [B, s_q, H, 512] bf16,
    lse [B, H, s_q] fp32)`` with the semantics of upstream's ``_sm120_sparse_decode_fwd``.

    ``num_splits`` overrides the split-K count and ``launch_config`` (a dict like the values of
    ``LAUNCH_CONFIGS``) the launch configuration (tests, tuning); by default both follow the
    shapes and the GPU's SM count.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.dtype != torch.bfloat16 or q.shape[-1] != HEAD_DIM:
        _fail("q", f"[B, s_q, H, {HEAD_DIM}] bfloat16", _describe(q))
    batch, s_q, num_heads, _ = q.shape
    device = q.device
    if not 1 <= num_heads <= SPARSE_MLA_MAX_HEADS or s_q < 1:
        _fail("q", f"[B, s_q >= 1, 1..{SPARSE_MLA_MAX_HEADS} heads, {HEAD_DIM}]", _describe(q))
    if batch * s_q > MAX_ROWS:
        _fail("q", f"at most {MAX_ROWS} query rows (B * s_q)", _describe(q))
    if q.stride(-1) != 1:
        q = q.contiguous()
    if head_dim_v != HEAD_DIM:
        _fail("head_dim_v", str(HEAD_DIM), head_dim_v)
    if softmax_scale is None:
        softmax_scale = HEAD_DIM ** -0.5
    _check_cache("k_cache", k_cache, device)
    _check_indices("indices", indices, batch, s_q, device)
    _check_lengths("topk_length", topk_length, batch, device)
    if attn_sink is not None:
        if not isinstance(attn_sink, torch.Tensor) or tuple(attn_sink.shape) != (num_heads,) \
                or attn_sink.dtype != torch.float32 or attn_sink.device != device:
            _fail("attn_sink", f"None or [{num_heads}] float32 on {device}", _describe(attn_sink))
        if num_heads > 1 and attn_sink.stride(0) != 1:  # the kernel reads sink[h] at h
            _fail("attn_sink", "unit stride", f"stride {attn_sink.stride(0)}")
    has_extra = extra_k_cache is not None
    if has_extra != (extra_indices is not None):
        _fail("extra_indices", "a tensor exactly when extra_k_cache is given", _describe(extra_indices))
    if has_extra:
        _check_cache("extra_k_cache", extra_k_cache, device)
        _check_indices("extra_indices", extra_indices, batch, s_q, device)
        _check_lengths("extra_topk_length", extra_topk_length, batch, device)
    elif extra_topk_length is not None:
        _fail("extra_topk_length", "None without an extra cache", _describe(extra_topk_length))

    out = _new_buffer((batch, s_q, num_heads, HEAD_DIM), torch.bfloat16, device)
    lse = _new_buffer((batch, s_q, num_heads), torch.float32, device)
    rows = batch * s_q
    if rows == 0:
        return out, lse.permute(0, 2, 1)

    topk = indices.shape[2]
    x_topk = extra_indices.shape[2] if has_extra else 0
    cfg = launch_config_for(num_heads, rows, topk + x_topk, device) if launch_config is None else launch_config
    if padded_heads(num_heads) % cfg["BLOCK_H"]:
        _fail("launch_config", f"BLOCK_H dividing {padded_heads(num_heads)}", cfg)
    if sum(bool(cfg.get(loop, False)) for loop in TILE_LOOPS) != 1:
        _fail("launch_config", f"exactly one tile loop of {TILE_LOOPS} set", cfg)
    block_h, block_n = cfg["BLOCK_H"], cfg["BLOCK_N"]
    head_blocks = padded_heads(num_heads) // block_h
    units = rows * head_blocks
    total_tiles = max(-(-topk // block_n) + -(-x_topk // block_n), 1)
    if num_splits is None:
        splits, per = choose_splits(units, total_tiles, device)
    else:
        if not 1 <= num_splits <= min(total_tiles, MAX_SPLITS):
            _fail("num_splits", f"1..{min(total_tiles, MAX_SPLITS)}", num_splits)
        per = -(-total_tiles // num_splits)
        splits = -(-total_tiles // per)
    if splits > 1:
        # bf16 partial accumulators (PARTIAL_BF16) halve the split-K traffic; (max, sum) stay fp32
        part_acc = _new_buffer((units, splits, block_h, HEAD_DIM),
                               torch.bfloat16 if cfg.get("PARTIAL_BF16", False) else torch.float32, device)
        part_ml = _new_buffer((units, splits, 2, block_h), torch.float32, device)
    else:  # one split: no scratch, the pointers are never dereferenced
        part_acc = part_ml = lse

    nope, rope, scale = _cache_views(k_cache)
    if has_extra:
        x_nope, x_rope, x_scale = _cache_views(extra_k_cache)
        x_geometry = (extra_k_cache.shape[1], extra_k_cache.stride(0),
                      extra_k_cache.shape[0] * extra_k_cache.shape[1])
        x_idx = extra_indices
    else:
        x_nope, x_rope, x_scale, x_idx = nope, rope, scale, indices
        x_geometry = (1, 0, 0)

    use_pdl = USE_PDL and pdl_supported(device)
    sparse_mla_decode_kernel[(head_blocks * splits, rows)](
        q, out, lse, attn_sink if attn_sink is not None else lse,
        nope, rope, scale, indices, topk_length if topk_length is not None else indices,
        x_nope, x_rope, x_scale, x_idx, extra_topk_length if extra_topk_length is not None else indices,
        part_acc, part_ml,
        s_q, num_heads, q.stride(0), q.stride(1), q.stride(2),
        topk, indices.stride(0), indices.stride(1), k_cache.shape[1], k_cache.stride(0),
        k_cache.shape[0] * k_cache.shape[1],
        x_topk, x_idx.stride(0), x_idx.stride(1), *x_geometry,
        per, splits, float(softmax_scale) * LOG2E,
        BLOCK_H=block_h, HEAD_BLOCKS=head_blocks, BLOCK_N=block_n, HAS_LEN=topk_length is not None,
        HAS_EXTRA=has_extra, HAS_X_LEN=extra_topk_length is not None, HAS_SINK=attn_sink is not None,
        SPLIT_K=splits > 1, PREFETCH_KV=cfg.get("PREFETCH_KV", False), MID_PREFETCH=cfg.get("MID_PREFETCH", False),
        EMIT_ASM=not interpreter_enabled(), **_LAYOUT, PDL=use_pdl, EARLY_LOADS=cfg.get("EARLY_LOADS", False),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=use_pdl)
    if splits > 1:
        cols = _combine_width(cfg, splits)
        sparse_mla_combine_kernel[(units, block_h // COMBINE_SUB_H, HEAD_DIM // cols)](
            part_acc, part_ml, out, lse, attn_sink if attn_sink is not None else lse, num_heads, splits,
            BLOCK_H=block_h, HEAD_BLOCKS=head_blocks, SUB_H=COMBINE_SUB_H, COLS=cols,
            SPLITS=triton.next_power_of_2(splits), D=HEAD_DIM, HAS_SINK=attn_sink is not None, PDL=use_pdl,
            num_warps=COMBINE_WARPS, launch_pdl=use_pdl)
    return out, lse.permute(0, 2, 1)


MAX_ROWS = 65535  # grid axis 1 carries the query rows
_LAYOUT = dict(D=HEAD_DIM, TILE=KV_TILE, NOPE_TILES=KV_NUM_TILES, NOPE=NOPE_DIM, DATA_BYTES=KV_DATA_BYTES,
               SCALE_BYTES=KV_SCALE_BYTES)
# The kernel reads a row as four 128-column chunks of two 64-groups; the rope is the 8th group.
assert ROPE_DIM == KV_TILE and KV_GROUPS * KV_TILE == HEAD_DIM and KV_GROUPS % 2 == 0


# --------------------------------------------------------------------------------------------------
# float32 reference (the specification)


def dequantize_rows(cache, slots):
    """KV rows ``[..., 512]`` fp32 of the V4-layout ``cache`` at valid token ``slots`` (any shape)."""
    raw = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    pages, page_size = raw.shape[0], raw.shape[1]
    flat = raw.as_strided(((pages - 1) * raw.stride(0) + page_size * KV_TOKEN_BYTES,), (1,))
    slots = slots.long()
    page, in_page = slots // page_size, slots % page_size
    data = page * raw.stride(0) + in_page * KV_DATA_BYTES
    nope_bytes = flat[data[..., None] + torch.arange(NOPE_DIM, device=raw.device)]
    rope_bytes = flat[data[..., None] + NOPE_DIM + torch.arange(2 * ROPE_DIM, device=raw.device)]
    scale_at = page * raw.stride(0) + page_size * KV_DATA_BYTES + in_page * KV_SCALE_BYTES
    scale_bytes = flat[scale_at[..., None] + torch.arange(KV_NUM_TILES, device=raw.device)]
    nope = nope_bytes.view(torch.float8_e4m3fn).float().unflatten(-1, (KV_NUM_TILES, KV_TILE))
    nope = nope * torch.exp2(scale_bytes.float() - E8M0_BIAS)[..., None]
    rope = rope_bytes.contiguous().view(torch.bfloat16).float()
    return torch.cat([nope.flatten(-2), rope], dim=-1)


def _candidates(cache, idx, lengths):
    """(kv [B, s_q, T, 512] fp32 with invalid rows zeroed, valid [B, s_q, T] bool)."""
    n_slots = cache.shape[0] * cache.shape[1]
    pos = torch.arange(idx.shape[-1], device=idx.device)
    valid = (idx >= 0) & (idx < n_slots)
    if lengths is not None:
        valid &= pos.view(1, 1, -1) < lengths.view(-1, 1, 1)
    kv = dequantize_rows(cache, torch.where(valid, idx, 0))
    return kv.masked_fill(~valid[..., None], 0.0), valid


def reference_sparse_mla_decode(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
                                extra_k_cache=None, extra_indices=None, extra_topk_length=None):
    """Float32 specification: ``(out [B, s_q, H, 512] fp32, lse [B, H, s_q] fp32)``."""
    kv, valid = _candidates(k_cache, indices, topk_length)
    if extra_k_cache is not None:
        x_kv, x_valid = _candidates(extra_k_cache, extra_indices, extra_topk_length)
        kv, valid = torch.cat([kv, x_kv], dim=2), torch.cat([valid, x_valid], dim=2)
    scale = HEAD_DIM ** -0.5 if softmax_scale is None else softmax_scale
    z = torch.einsum("bshd,bstd->bsht", q.float(), kv) * scale
    z = z.masked_fill(~valid[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(z, dim=-1)  # [B, s_q, H]
    lonely = torch.isneginf(lse)
    norm = lse if attn_sink is None else torch.logaddexp(lse, attn_sink.float().view(1, 1, -1))
    weights = torch.exp(z - torch.where(lonely, 0.0, norm)[..., None])
    weights = weights.masked_fill(lonely[..., None], 0.0)
    out = torch.einsum("bsht,bstd->bshd", weights, kv[..., :head_dim_v])
    return out, lse.permute(0, 2, 1)


def random_v4_cache(num_pages: int, page_size: int, device="cpu", spare_pages: int = 0, generator=None):
    """A V4-layout cache view ``[num_pages, page_size, 1, 584]`` uint8 over a page buffer padded
    as SGLang pads it, with random FP8 nope (|x| up to ~8), bf16 rope and UE8M0 scales 2^-9..2^2.
    ``spare_pages`` more pages follow in the buffer, outside the view, filled with FP8 NaNs and
    scale byte 255: a kernel that reads past the view produces NaN. Returns ``(view, buffer)``."""
    page_bytes = kv_page_bytes(page_size)
    total = num_pages + spare_pages
    buf = torch.full((total, page_bytes), 0xFF, dtype=torch.uint8, device=device)
    data = buf[:num_pages, :page_size * KV_DATA_BYTES].view(num_pages, page_size, KV_DATA_BYTES)
    nope = torch.randn(num_pages, page_size, NOPE_DIM, generator=generator, device=device) * 2
    data[..., :NOPE_DIM] = nope.to(torch.float8_e4m3fn).view(torch.uint8)
    rope = torch.randn(num_pages, page_size, ROPE_DIM, generator=generator, device=device)
    data[..., NOPE_DIM:] = rope.to(torch.bfloat16).view(torch.uint8)
    scales = buf[:num_pages, page_size * KV_DATA_BYTES:page_size * (KV_DATA_BYTES + KV_SCALE_BYTES)]
    scales[:] = torch.randint(E8M0_BIAS - 9, E8M0_BIAS + 3, scales.shape, generator=generator, device=device,
                              dtype=torch.int32).to(torch.uint8)
    view = buf[:num_pages, :page_size * KV_TOKEN_BYTES].view(num_pages, page_size, 1, KV_TOKEN_BYTES)
    return view, buf


# --------------------------------------------------------------------------------------------------
# AOT configs (every shipped launch config, compiled for sm_120a / sm_121a by the registry test)


def _partial_type(cfg: dict) -> str:
    return "*bf16" if cfg.get("PARTIAL_BF16", False) else "*fp32"


def _signature(cfg: dict) -> dict:
    sig = {}
    for name in sparse_mla_decode_kernel.arg_names:
        sig[name] = "i32"
    pointers = {"q_ptr": "*bf16", "out_ptr": "*bf16", "lse_ptr": "*fp32", "sink_ptr": "*fp32",
                "nope_ptr": "*fp8e4nv", "rope_ptr": "*bf16", "scale_ptr": "*u8", "idx_ptr": "*i32",
                "len_ptr": "*i32", "x_nope_ptr": "*fp8e4nv", "x_rope_ptr": "*bf16", "x_scale_ptr": "*u8",
                "x_idx_ptr": "*i32", "x_len_ptr": "*i32", "part_acc_ptr": _partial_type(cfg), "part_ml_ptr": "*fp32"}
    sig.update(pointers)
    sig["qk_scale"] = "fp32"
    for name in ("BLOCK_H", "HEAD_BLOCKS", "BLOCK_N", "HAS_LEN", "HAS_EXTRA", "HAS_X_LEN", "HAS_SINK", "SPLIT_K",
                 "PREFETCH_KV", "MID_PREFETCH", "EMIT_ASM", "PDL", "EARLY_LOADS", *_LAYOUT):
        sig[name] = "constexpr"
    return sig


# Integer arguments the JIT sees as multiples of 16 at DSv4 shapes (strides of q/indices, page strides).
_DIV16 = ("q_stride_b", "q_stride_s", "q_stride_h", "idx_stride_b", "idx_stride_s", "page_stride",
          "x_idx_stride_b", "x_idx_stride_s", "x_page_stride", "topk", "x_topk", "n_slots", "x_n_slots")


def _shipped_configs():
    """(name suffix, padded heads, config) for every default launch configuration."""
    out = [(f"h{heads}", heads, cfg) for heads, cfg in LAUNCH_CONFIGS.items()]
    out += [(f"h{heads}_rows{rows}", heads, cfg) for heads, (rows, cfg) in LARGE_BATCH_CONFIGS.items()]
    out += [(f"h{heads}_rows{rows}_wide_combine", heads, cfg) for heads, (rows, cfg) in WIDE_COMBINE_CONFIGS.items()]
    out += [(f"h{heads}_rows{rows}_few_candidates", heads, cfg)
            for heads, (rows, cfg) in FEW_CANDIDATES_CONFIGS.items()]
    out += [(f"h{heads}_upto{rows}rows", heads, cfg) for heads, (rows, cfg) in SMALL_BATCH_CONFIGS.items()]
    return out


def aot_configs() -> list[AotConfig]:
    configs = []
    seen = []
    for suffix, heads, cfg in _shipped_configs():
        kernel_cfg = (heads, {k: v for k, v in cfg.items() if k != "COMBINE_COLS"})  # the combine's width only
        if kernel_cfg in seen:
            continue
        seen.append(kernel_cfg)
        # every feature on, split into partials; and the same unsplit (the program finishes and stores its rows
        # itself), which is not the lighter variant: up to 31 registers more in a one-off scan of all 24 feature
        # subsets of each config on sm_120a (2026-12-05: none spilled, at most 236 registers)
        for split_k, variant, what in ((True, "", "split-K partials"), (False, "_unsplit", "no split")):
            constexprs = dict(BLOCK_H=cfg["BLOCK_H"], HEAD_BLOCKS=heads // cfg["BLOCK_H"], BLOCK_N=cfg["BLOCK_N"],
                              HAS_LEN=True, HAS_EXTRA=True, HAS_X_LEN=True, HAS_SINK=True, SPLIT_K=split_k,
                              PREFETCH_KV=cfg.get("PREFETCH_KV", False), MID_PREFETCH=cfg.get("MID_PREFETCH", False),
                              EMIT_ASM=True, PDL=USE_PDL, EARLY_LOADS=cfg.get("EARLY_LOADS", False), **_LAYOUT)
            configs.append(AotConfig(
                name=f"sparse_mla_decode_{suffix}{variant}", kernel=sparse_mla_decode_kernel,
                signature=_signature(cfg), constexprs=constexprs, num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"], div16=_DIV16,
                expect_opcodes=("HMMA.16816.F32.BF16", *(PDL_OPCODES if USE_PDL else ())),
                note=f"H={'8/16' if heads == 16 else heads}: {cfg['BLOCK_H']} heads x {cfg['BLOCK_N']} candidates "
                     f"per tile, both caches, sink, {what}"))
    for suffix, heads, cfg in _shipped_configs():
        widest = {}  # the most splits of each column width this config's combine can take
        for splits in range(2, MAX_SPLITS + 1):
            widest[_combine_width(cfg, splits)] = splits
        for cols, splits in sorted(widest.items()):
            key = (_partial_type(cfg), cfg["BLOCK_H"], heads, cols, triton.next_power_of_2(splits))
            if key in seen:  # the same combine as an earlier config's
                continue
            seen.append(key)
            configs.append(AotConfig(
                name=f"sparse_mla_combine_{suffix}_s{splits}", kernel=sparse_mla_combine_kernel,
                signature={"part_acc_ptr": _partial_type(cfg), "part_ml_ptr": "*fp32", "out_ptr": "*bf16",
                           "lse_ptr": "*fp32",
                           "sink_ptr": "*fp32", "num_heads": "i32", "num_splits": "i32", "BLOCK_H": "constexpr",
                           "HEAD_BLOCKS": "constexpr", "SUB_H": "constexpr", "COLS": "constexpr",
                           "SPLITS": "constexpr", "D": "constexpr", "HAS_SINK": "constexpr", "PDL": "constexpr"},
                constexprs=dict(BLOCK_H=cfg["BLOCK_H"], HEAD_BLOCKS=heads // cfg["BLOCK_H"], SUB_H=COMBINE_SUB_H,
                                COLS=cols, SPLITS=triton.next_power_of_2(splits), D=HEAD_DIM, HAS_SINK=True,
                                PDL=USE_PDL),
                num_warps=COMBINE_WARPS, num_stages=1, div16=("num_heads",),
                expect_opcodes=PDL_OPCODES if USE_PDL else (),
                note=f"split-K merge + sink + LSE, up to {splits} splits (no tensor cores: a reduction)"))
    return configs
