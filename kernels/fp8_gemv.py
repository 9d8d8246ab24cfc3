"""Block-FP8 GEMV / skinny GEMM for decode: bf16 activations times FP8 (e4m3) weights with 128x128
block scales, and the grouped DeepSeek-V4 ``wo_a`` projection with an optional fused inverse RoPE.

Why: at decode a DSv4-Flash step reads mostly dense FP8 weights. SGLang 0.5.23 on sm_120 runs every
block-FP8 linear as a per-token-group activation quantisation kernel plus a CUTLASS tile GEMM, and
dequantises ``wo_a`` to bf16 at load (twice the bytes). Here the weight is read once in FP8 with
16-byte loads, dequantised in registers, and multiplied by the bf16 activation in fp32 (no
activation quantisation, so the result is closer to the bf16 model than upstream's FP8-activation
path). Small N is split along K so that one row still fills the GPU; the split partials are summed
by the last CTA of each tile (a self-resetting per-weight counter), so a call is one launch.

Launch forms (``GemvConfig``; ``default_config`` picks one from the H200 runs in ``benchmarks/``):
the 1-row FMA form and the 16/32-row tensor-core form of ``_block_fp8_gemv_kernel``, and the rows
form ``_block_fp8_gemv_rows_kernel`` (1, 2, 4 or 8 rows share each dequantised weight chunk on CUDA
cores), used at 2 rows and, one-shot (a program's whole K in flight), at 1 row for short K; and the FP8
tensor-core form ``_block_fp8_gemv_fp8mma_kernel`` (the e4m3 weight fed to e4m3 MMAs as loaded, each bf16
activation row split exactly into two e4m3 terms in registers), used at 2..8 rows on large weights. Most
default forms launch with programmatic dependent launch (``GemvConfig.pdl``): a program starts while the
previous kernel drains, reads only the (constant) weight before ``griddepcontrol.wait``, and so assumes the
weight is not written by the kernel just before it in the stream (see ``_with_pdl``). Any form whose weight tile
is at most 256 K columns can fetch it by TMA instead (``GemvConfig.w_tma``: a host-built descriptor, the K loop
pipelining the copies); the defaults do so where the H200 measured it faster (``default_config``, ``wo_a_config``).
The FMA and tensor-core forms also run persistent (``GemvConfig.persistent_programs_per_sm``: SMs x n programs
looping over the (tile, K split) work items; without split-K the work-item loop is flattened into the K loop), the
default for one row of wq_b at T=1 only (H200 runs 13 / 13b).

Layout (what SGLang hands over):

* ``x``: ``[..., K]`` bf16, last dim contiguous; ``weight``: ``[N, K]`` float8_e4m3fn row-major;
  ``weight_scale``: ``[ceil(N/128), ceil(K/128)]`` fp32 (``layer.weight_scale_inv``);
  ``y = x @ dequant(weight).T`` in bf16.
* ``wo_a``: ``o [B, G, D]`` bf16 (G = 8/T groups, D = 4096 = 8 heads x 512), ``weight [G, R, D]``
  (R = 1024) e4m3, ``scale [G, R/128, D/128]`` fp32 -> ``[B, G, R]`` bf16. With ``positions`` and
  ``freqs`` the inverse RoPE that upstream applies in place to the last 64 dims of every 512-wide head
  (``fused_rope_inplace(o[..., -64:], inverse=True)``, interleaved (re, im) pairs) is applied to the
  activation in registers, rounded to bf16 as upstream's in-place write is.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .dsv4 import (FP8_BLOCK, HEAD_DIM, HIDDEN_SIZE, INDEX_HEAD_DIM, INDEX_N_HEADS, KV_LORA_RANK, NUM_HEADS,
                   Q_LORA_RANK, ROPE_DIM, SHARED_EXPERT_INTERMEDIATE)
from .harness.aot import AotConfig, check_register_cap, register_cap_option
from .harness.interpreter import has_capability, interpreter_enabled
from .pdl import PDL_MIN_CAPABILITY, PDL_OPCODES, capability_major
from .pdl import clear_cache as _clear_capability_cache
from .pdl import pdl_launch_dependents as _pdl_launch_dependents
from .pdl import pdl_wait as _pdl_wait

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# Rows one launch of the grouped wo_a kernel takes; more rows (prefill) go through a bf16
# dequantised einsum, which is compute-bound anyway (see grouped_fp8_wo_a).
WO_A_MAX_KERNEL_ROWS = 64
# Counters of split-K tiles live per weight; a tile count above this means a config error.
_MAX_COUNTERS = 1 << 16


# ----------------------------------------------------------------------------------------------
# kernel
# ----------------------------------------------------------------------------------------------


@triton.jit
def _load_activation(row_ptr, freq_row, k, mask, k_first, INV_ROPE: tl.constexpr, HEAD: tl.constexpr,
                     ROPE: tl.constexpr, WIDTH: tl.constexpr):
    """bf16 activation at ``row_ptr + k`` (any broadcastable shapes). With INV_ROPE, when this
    WIDTH-wide slice starting at ``k_first`` reaches into the last ROPE dims of a HEAD-wide head,
    those dims get upstream's inverse rotation of interleaved (re, im) pairs: re' = re*c + im*s,
    im' = im*c - re*s (the partner of element k is k ^ 1), rounded to bf16 as upstream's in-place
    write is. Slices without rope dims (most of them) take the plain load only."""
    x = tl.load(row_ptr + k, mask=mask, other=0.0)
    if INV_ROPE:
        if (k_first % HEAD) + WIDTH > HEAD - ROPE:
            r = (k % HEAD) - (HEAD - ROPE)
            is_rope = r >= 0
            rope_mask = mask & is_rope
            partner = tl.load(row_ptr + (k ^ 1), mask=rope_mask, other=0.0).to(tl.float32)
            pair = tl.where(is_rope, r // 2, 0)
            cos = tl.load(freq_row + 2 * pair, mask=rope_mask, other=1.0)
            sin = tl.load(freq_row + 2 * pair + 1, mask=rope_mask, other=0.0)
            sign = tl.where((k % 2) == 0, 1.0, -1.0)
            xf = x.to(tl.float32)
            x = tl.where(rope_mask, xf * cos + sign * partner * sin, xf).to(tl.bfloat16)
    return x


# ROPE_HOIST values (fused inverse RoPE): 0 the branch per chunk (_load_activation), 1 the factors hoisted
# (_rope_chunk_factors), 2 (FP8 tensor-core form, GemvConfig.rope_preload) the split's rotated rope block preloaded
ROPE_FACTORS_HOISTED = tl.constexpr(1)
ROPE_PRELOAD = tl.constexpr(2)


def rope_preloadable(k_blocks_per_split: int, k: int, head: int, rope: int) -> bool:
    """Whether every K split of a [.., k] weight is exactly one head whose rope dims all lie in its last 128-block
    (GemvConfig.rope_preload): DSv4 wo_a at K split 8 (4096 = 8 heads of 512, 64 rope dims)."""
    return (k_blocks_per_split * FP8_BLOCK == head and k % head == 0 and head % FP8_BLOCK == 0
            and rope <= FP8_BLOCK)


def rope_mode(cfg, inv_rope: bool, width: int, k_blocks_per_split: int, k: int, head: int, rope: int) -> int:
    """The ROPE_HOIST value a launch of ``cfg`` runs (0 where its hoisting does not apply to the geometry)."""
    if not inv_rope:
        return 0
    if cfg.rope_preload and rope_preloadable(k_blocks_per_split, k, head, rope):
        return ROPE_PRELOAD.value
    if (cfg.rope_hoist or cfg.rope_preload) and rope_hoistable(width, head, rope):
        return ROPE_FACTORS_HOISTED.value
    return 0


def rope_hoistable(width: int, head: int, rope: int) -> bool:
    """Whether the inverse RoPE's factors can be loaded once per program (GemvConfig.rope_hoist) for activation chunks
    ``width`` wide that start at multiples of ``width``: every chunk holds whole heads, or (chunks inside a head) only
    the head's last chunk holds rope dims. Then each column's position in its head is the same in every rope-bearing
    chunk, so its cos / sin are too."""
    return width % head == 0 or (head % width == 0 and rope <= width)


@triton.jit
def _freqs_row(freqs_ptr, pos, stride_freq, n_positions, freqs_poison_ptr):
    """The inverse RoPE's freqs row of ``pos`` (a scalar or a tensor of positions). A position outside
    [0, n_positions) reads the NaN row at ``freqs_poison_ptr`` instead: its output row comes out NaN rather than
    from memory past the table (the kernels cannot raise without a host sync)."""
    return tl.where(_position_in_table(pos, n_positions), freqs_ptr + pos.to(tl.int64) * stride_freq,
                    freqs_poison_ptr)


@triton.jit
def _position_in_table(pos, n_positions):
    return (pos >= 0) & (pos < n_positions)


@triton.jit
def _freqs_row_clamped(freqs_ptr, pos, stride_freq, n_positions):
    """The freqs row of ``pos`` clamped into [0, n_positions): no read past the table, for the forms that make an
    out-of-table row NaN at their store (_fp8mma_store) instead of through a NaN freqs row. Cheaper in registers than
    _freqs_row's select between two pointers (the one-shot program at 128 registers on sm_90a needs it)."""
    return freqs_ptr + tl.minimum(tl.maximum(pos, 0), n_positions - 1).to(tl.int64) * stride_freq


@triton.jit
def _rope_chunk_factors(freq_row, rk, valid, HEAD: tl.constexpr, ROPE: tl.constexpr, WIDTH: tl.constexpr):
    """GemvConfig.rope_hoist: the inverse RoPE's per-column factors of a rope-bearing WIDTH-wide chunk (see
    rope_hoistable), loaded once per program before the K loop so that no chunk waits on the position -> freqs
    gather: (cos, the sin with the rotation's sign of each column's pair slot, the rope-column mask). ``freq_row``:
    the row's freqs pointer (scalar or [R, 1]); ``rk``: chunk columns ([WIDTH] or [1, WIDTH]); ``valid``: rows."""
    tl.static_assert(WIDTH % HEAD == 0 or (HEAD % WIDTH == 0 and ROPE <= WIDTH))
    if WIDTH >= HEAD:
        in_head = rk % HEAD
    else:  # the head's last chunk
        in_head = rk + (HEAD - WIDTH)
    r = in_head - (HEAD - ROPE)
    is_rope = r >= 0
    pair = tl.where(is_rope, r // 2, 0)
    load_mask = valid & is_rope
    cos = tl.load(freq_row + 2 * pair, mask=load_mask, other=1.0)
    sin = tl.load(freq_row + 2 * pair + 1, mask=load_mask, other=0.0)
    # re' = re*c + im*s, im' = im*c - re*s: the partner's term carries +s on even columns, -s on odd ones (a chunk
    # starts at an even column)
    return cos, tl.where((rk % 2) == 0, sin, -sin), is_rope


@triton.jit
def _load_activation_hoisted(row_ptr, k, mask, k_first, cos, signed_sin, is_rope, HEAD: tl.constexpr,
                             WIDTH: tl.constexpr):
    """_load_activation with the inverse RoPE's factors from _rope_chunk_factors: no branch; the partner load is
    predicated off outside rope columns of rope-bearing chunks, and the rotation is a select. The same arithmetic
    and bf16 rounding as _load_activation."""
    x = tl.load(row_ptr + k, mask=mask, other=0.0)
    if WIDTH >= HEAD:
        rope_mask = mask & is_rope
    else:
        rope_mask = mask & is_rope & ((k_first % HEAD) == HEAD - WIDTH)
    partner = tl.load(row_ptr + (k ^ 1), mask=rope_mask, other=0.0).to(tl.float32)
    return _rotate_rope_pairs(x, partner, cos, signed_sin, rope_mask)


@triton.jit
def _rotate_rope_pairs(x, partner, cos, signed_sin, rope_mask):
    """bf16 ``x`` with its rope columns (``rope_mask``) rotated against their fp32 pair ``partner``: x*c + p*(+-s),
    rounded to bf16 as upstream's in-place write is."""
    xf = x.to(tl.float32)
    return tl.where(rope_mask, xf * cos + partner * signed_sin, xf).to(tl.bfloat16)


# Row counts and split sizes vary call to call: no 1 / multiple-of-16 specialisation (one compile).
@triton.jit
def _sum_split_partials(part_base, split_stride, tile_part, y_ptrs, y_mask, counter_ptr, tile, num_splits,
                        ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BATCH: tl.constexpr = 1):
    """K-split epilogue, after this program stored its fp32 partial: the last of the tile's split programs to
    take a ticket sums the partials ([splits] x split_stride apart) and stores the bf16 tile, then zeroes the
    ticket counter for the next call (graph replays). BATCH > 1 loads that many partials per step, all in
    flight at once (one L2 round trip per step instead of per partial), summed in the same order."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
    if arrived == num_splits - 1:
        total = tl.zeros((ROWS, BLOCK_N), tl.float32)
        for s0 in range(0, num_splits, BATCH):
            for u in tl.static_range(BATCH):
                total += tl.load(part_base + (s0 + u) * split_stride + tile_part, mask=y_mask & (s0 + u < num_splits),
                                 other=0.0, cache_modifier=".cg")
        tl.store(y_ptrs, total.to(tl.bfloat16), mask=y_mask)
        tl.atomic_xchg(counter_ptr + tile, 0)


@triton.jit
def _work_item(item, tiles_per_group, num_splits):
    """Persistent forms: work item -> (tile within its group, K split, group); the K split varies fastest, so the
    programs running at once cover every split of a few tiles and their last arrivers finish those tiles early."""
    pid_k = item % num_splits
    rest = item // num_splits
    return rest % tiles_per_group, pid_k, rest // tiles_per_group


@triton.jit
def _prefetch_item_l2(w_ptr, stride_wg, stride_wn, N, K, tile, pid_k, pid_g, k_blocks_per_split,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCKS: tl.constexpr):
    """_prefetch_weight_l2 for the work item (tile, pid_k, pid_g)."""
    if BLOCKS > 0:
        rn = (tile % tl.cdiv(N, BLOCK_N)) * BLOCK_N + tl.arange(0, BLOCK_N)
        kb_begin = pid_k * k_blocks_per_split
        kb_end = tl.minimum(kb_begin + k_blocks_per_split, tl.cdiv(K, BLOCK_K))
        _prefetch_weight_l2(w_ptr + pid_g * stride_wg + rn[:, None] * stride_wn, rn, N, stride_wn, kb_begin, kb_end,
                            BLOCK_K, BLOCKS)


# Programmatic dependent launch (GemvConfig.pdl): the launch carries the programmatic-serialisation
# attribute, so this kernel's programs may start while the previous kernel in the stream drains. The
# weight and its scales are constants of the model: they may be read before the wait; the activation
# (written by the previous kernel) and every store (the output / split partials may reuse memory the
# previous kernel still reads) come after it. Both instructions are no-ops without the attribute
# (_pdl_launch_dependents / _pdl_wait: kernels/pdl.py).


@triton.jit
def _prefetch_weight_l2(w_rows, rn, N, stride_wn, kb_begin, kb_end, BLOCK_K: tl.constexpr,
                        BLOCKS: tl.constexpr):
    """Before the wait: ask L2 for the first BLOCKS K blocks of this program's weight rows (one
    ``prefetch.global.L2`` per row and 128-byte block), so the weight stream starts while the previous
    kernel drains. Rows past N and blocks past the split re-request a valid line of the tile."""
    if BLOCKS > 0:
        kb = tl.minimum(kb_begin + tl.arange(0, BLOCKS), kb_end - 1)
        row_shift = (tl.minimum(rn, N - 1) - rn) * stride_wn  # 0 for rows inside the weight
        ptrs = w_rows + row_shift[:, None] + (kb * BLOCK_K)[None, :]
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // dummy $0", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _program_start(w_ptr, stride_wg, stride_wn, N, K, tiles_per_group, num_splits, k_blocks_per_split,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, L2_PREFETCH_BLOCKS: tl.constexpr, PDL: tl.constexpr,
                   PDL_LATE_TRIGGER: tl.constexpr, PERSISTENT: tl.constexpr, WAIT: tl.constexpr = True):
    """A program's first work item (tile, K split, group): its grid position, or (PERSISTENT) work item pid. Issues
    the early PDL trigger and the L2 prefetch of that item's weight, then the PDL wait: once per program, before its
    first activation load (not WAIT: the caller waits itself, after loading its weight)."""
    if PERSISTENT:
        tile, pid_k, pid_g = _work_item(tl.program_id(0), tiles_per_group, num_splits)
    else:
        tile, pid_k, pid_g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _pdl_launch_dependents(PDL and not PDL_LATE_TRIGGER)
    _prefetch_item_l2(w_ptr, stride_wg, stride_wn, N, K, tile, pid_k, pid_g, k_blocks_per_split, BLOCK_N, BLOCK_K,
                      L2_PREFETCH_BLOCKS)
    _pdl_wait(PDL and WAIT)
    return tile, pid_k, pid_g


@triton.jit
def _weight_tile(w_desc, w_tile_ptrs, mask, pid_g, n0, k0, W_TMA: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr):
    """FP8 weight tile [BN, BK] at rows n0.., columns k0.. of group pid_g. W_TMA: one TMA copy through the
    host-built 3-D descriptor ``w_desc`` over [G, N, K] (box [1, BN, BK]); rows past N and columns past K
    arrive as zeros, so no mask is needed (a program's K range never ends inside the weight except at K).
    Otherwise a masked 16-byte-per-thread load of ``w_tile_ptrs``."""
    if W_TMA:
        w = tl.reshape(w_desc.load([pid_g, n0, k0]), (BN, BK))
    else:
        w = tl.load(w_tile_ptrs, mask=mask, other=0.0)
    return w


@triton.jit(do_not_specialize=["M", "k_blocks_per_split", "num_splits", "num_groups"])
def _block_fp8_gemv_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr, freqs_poison_ptr, n_positions, w_desc,
    M, N, K,
    stride_xm, stride_xg,
    stride_wg, stride_wn,
    stride_sg, stride_sn,
    stride_ym, stride_yg,
    stride_freq,
    k_blocks_per_split, num_splits, num_groups,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_UNROLL: tl.constexpr,
    IS_SPLIT: tl.constexpr, USE_DOT: tl.constexpr, SWAP_AB: tl.constexpr,
    INV_ROPE: tl.constexpr, HEAD: tl.constexpr, ROPE: tl.constexpr,
    PDL: tl.constexpr = False, L2_PREFETCH_BLOCKS: tl.constexpr = 0,
    PDL_LATE_TRIGGER: tl.constexpr = False, W_TMA: tl.constexpr = 0,
    PERSISTENT: tl.constexpr = False, FLATTEN: tl.constexpr = False, ROPE_HOIST: tl.constexpr = 0,
):
    """One program: rows [pid_m*BLOCK_M, +BLOCK_M) x cols [pid_n*BLOCK_N, +BLOCK_N) of group pid_g,
    over K blocks [pid_k*k_blocks_per_split, +k_blocks_per_split), K_UNROLL blocks per iteration.
    BLOCK_K is the scale block and BLOCK_N divides it, so a tile has one weight scale per K block.

    USE_DOT: rows padded to BLOCK_M (>= 16) on tensor cores, the weight converted e4m3 -> bf16
    (exact); with K_UNROLL == 1 each block's fp32 partial product is scaled (exact for any scale),
    with K_UNROLL > 1 the scale is folded into the bf16 activation (exact for power-of-two scales,
    as DSv4's UE8M0 checkpoints have; one extra bf16 rounding otherwise). SWAP_AB puts the weight
    in the MMA's A operand. Otherwise (BLOCK_M 1 or 2) CUDA-core FMAs with the scale folded into
    the fp32 activation (exact), each row its own accumulator so the activation loads straight
    into the broadcast layout."""
    tiles_per_group = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    tile, pid_k, pid_g = _program_start(w_ptr, stride_wg, stride_wn, N, K, tiles_per_group, num_splits,
                                        k_blocks_per_split, BLOCK_N, BLOCK_K, L2_PREFETCH_BLOCKS, PDL,
                                        PDL_LATE_TRIGGER, PERSISTENT)
    if PERSISTENT:
        # grid = SMs x programs per SM; each program loops over work items pid, pid + nprog, ...; FLATTEN (no
        # split-K: the looping split-sum epilogue would be a second inner loop) fuses this loop with the K loop so
        # the weight pipeline stays full from one item into the next
        num_items = tiles_per_group * num_splits * num_groups
        for item in tl.range(tl.program_id(0), num_items, tl.num_programs(0), flatten=FLATTEN,
                             num_stages=W_TMA if W_TMA else None):
            tile, pid_k, pid_g = _work_item(item, tiles_per_group, num_splits)
            _gemv_item(x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr,
                       freqs_poison_ptr, n_positions, w_desc, M, N, K,
                       stride_xm, stride_xg, stride_wg, stride_wn, stride_sg, stride_sn, stride_ym, stride_yg,
                       stride_freq, k_blocks_per_split, num_splits, tiles_per_group, tile, pid_k, pid_g,
                       BLOCK_M, BLOCK_N, BLOCK_K, K_UNROLL, IS_SPLIT, USE_DOT, SWAP_AB, INV_ROPE, HEAD, ROPE,
                       PDL, PDL_LATE_TRIGGER, W_TMA, PERSISTENT, ROPE_HOIST)
    else:
        _gemv_item(x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr,
                   freqs_poison_ptr, n_positions, w_desc, M, N, K,
                   stride_xm, stride_xg, stride_wg, stride_wn, stride_sg, stride_sn, stride_ym, stride_yg,
                   stride_freq, k_blocks_per_split, num_splits, tiles_per_group, tile, pid_k, pid_g,
                   BLOCK_M, BLOCK_N, BLOCK_K, K_UNROLL, IS_SPLIT, USE_DOT, SWAP_AB, INV_ROPE, HEAD, ROPE,
                   PDL, PDL_LATE_TRIGGER, W_TMA, PERSISTENT, ROPE_HOIST)


@triton.jit
def _gemv_item(x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr,
               freqs_poison_ptr, n_positions, w_desc, M, N, K,
               stride_xm, stride_xg, stride_wg, stride_wn, stride_sg, stride_sn, stride_ym, stride_yg,
               stride_freq, k_blocks_per_split, num_splits, tiles_per_group, pid, pid_k, pid_g,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_UNROLL: tl.constexpr,
               IS_SPLIT: tl.constexpr, USE_DOT: tl.constexpr, SWAP_AB: tl.constexpr, INV_ROPE: tl.constexpr,
               HEAD: tl.constexpr, ROPE: tl.constexpr, PDL: tl.constexpr, PDL_LATE_TRIGGER: tl.constexpr,
               W_TMA: tl.constexpr, PERSISTENT: tl.constexpr, ROPE_HOIST: tl.constexpr):
    """One work item of _block_fp8_gemv_kernel: tile ``pid`` (rows-major over column tiles) of group pid_g, K split
    pid_k; after the PDL wait. ROPE_HOIST (with INV_ROPE): the inverse RoPE's factors loaded once, before the K loop
    (_rope_chunk_factors)."""
    tl.static_assert(BLOCK_K % BLOCK_N == 0)
    tl.static_assert(USE_DOT or BLOCK_M <= 2)
    BLOCK_KI: tl.constexpr = BLOCK_K * K_UNROLL
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_m = pid // n_tiles
    pid_n = pid % n_tiles

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_KI)
    m_mask = rm < M
    n_mask = rn < N

    x_base = x_ptr + pid_g * stride_xg
    w_rows = w_ptr + pid_g * stride_wg + rn[:, None] * stride_wn  # [BN, 1]
    s_row = s_ptr + pid_g * stride_sg + (pid_n * BLOCK_N // BLOCK_K) * stride_sn

    k_blocks = tl.cdiv(K, BLOCK_K)
    kb_begin = pid_k * k_blocks_per_split
    kb_end = tl.minimum(kb_begin + k_blocks_per_split, k_blocks)
    k_stop = tl.minimum(kb_end * BLOCK_K, K)
    # persistent: a K loop of a fixed trip count (the last split's surplus blocks masked), so that Triton can flatten
    # it into the work-item loop (it fuses only inner loops whose bounds do not vary with the outer loop)
    if PERSISTENT:
        loop_begin = 0
        loop_end = k_blocks_per_split
        kb_shift = kb_begin
    else:
        loop_begin = kb_begin
        loop_end = kb_end
        kb_shift = 0

    if USE_DOT:
        x_rows = x_base + rm[:, None] * stride_xm  # [BM, 1]
        freq_rows = freqs_ptr
        if INV_ROPE:
            pos = tl.load(pos_ptr + rm, mask=m_mask, other=0)
            freq_rows = _freqs_row(freqs_ptr, pos[:, None], stride_freq, n_positions, freqs_poison_ptr)
            if ROPE_HOIST:
                cos, signed_sin, is_rope = _rope_chunk_factors(freq_rows, rk[None, :], m_mask[:, None], HEAD, ROPE,
                                                               BLOCK_KI)
        if SWAP_AB:
            acc_t = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for kb_it in tl.range(loop_begin, loop_end, K_UNROLL, num_stages=W_TMA if W_TMA else None):
            kb = kb_it + kb_shift
            k = kb * BLOCK_K + rk
            k_mask = k < k_stop
            w = _weight_tile(w_desc, w_rows + k[None, :], n_mask[:, None] & k_mask[None, :], pid_g,
                             pid_n * BLOCK_N, kb * BLOCK_K, W_TMA, BLOCK_N, BLOCK_KI)
            if INV_ROPE and ROPE_HOIST:
                x = _load_activation_hoisted(x_rows, k[None, :], m_mask[:, None] & k_mask[None, :], kb * BLOCK_K,
                                             cos, signed_sin, is_rope, HEAD, BLOCK_KI)
            else:
                x = _load_activation(x_rows, freq_rows, k[None, :], m_mask[:, None] & k_mask[None, :],
                                     kb * BLOCK_K, INV_ROPE, HEAD, ROPE, BLOCK_KI)
            if K_UNROLL == 1:
                if PERSISTENT:  # the last split's surplus blocks lie past the row: their scale must not be read
                    scale = tl.load(s_row + kb, mask=kb < kb_end, other=0.0)
                else:
                    scale = tl.load(s_row + kb)
                if SWAP_AB:
                    acc_t += tl.dot(w.to(tl.bfloat16), tl.trans(x)) * scale
                else:
                    acc += tl.dot(x, tl.trans(w.to(tl.bfloat16))) * scale  # e4m3 -> bf16 is exact
            else:
                s_cols = tl.load(s_row + k // BLOCK_K, mask=k_mask, other=0.0)
                xs = (x.to(tl.float32) * s_cols[None, :]).to(tl.bfloat16)
                if SWAP_AB:
                    acc_t += tl.dot(w.to(tl.bfloat16), tl.trans(xs))
                else:
                    acc += tl.dot(xs, tl.trans(w.to(tl.bfloat16)))
        if SWAP_AB:
            acc = tl.trans(acc_t)
    else:
        row0 = pid_m * BLOCK_M
        row1 = row0 + 1
        freq0 = freqs_ptr
        freq1 = freqs_ptr
        if INV_ROPE:
            freq0 = _freqs_row(freqs_ptr, tl.load(pos_ptr + row0), stride_freq, n_positions, freqs_poison_ptr)
            if BLOCK_M == 2:
                pos1 = tl.load(pos_ptr + row1, mask=row1 < M, other=0)
                freq1 = _freqs_row(freqs_ptr, pos1, stride_freq, n_positions, freqs_poison_ptr)
            if ROPE_HOIST:
                cos0, signed_sin0, is_rope = _rope_chunk_factors(freq0, rk, row0 < M, HEAD, ROPE, BLOCK_KI)
                if BLOCK_M == 2:
                    cos1, signed_sin1, is_rope = _rope_chunk_factors(freq1, rk, row1 < M, HEAD, ROPE, BLOCK_KI)
        acc0 = tl.zeros((BLOCK_N, BLOCK_KI), tl.float32)
        acc1 = tl.zeros((BLOCK_N, BLOCK_KI), tl.float32)
        for kb_it in tl.range(loop_begin, loop_end, K_UNROLL, num_stages=W_TMA if W_TMA else None):
            kb = kb_it + kb_shift
            k = kb * BLOCK_K + rk
            k_mask = k < k_stop
            w = _weight_tile(w_desc, w_rows + k[None, :], n_mask[:, None] & k_mask[None, :], pid_g,
                             pid_n * BLOCK_N, kb * BLOCK_K, W_TMA, BLOCK_N, BLOCK_KI).to(tl.float32)
            s_cols = tl.load(s_row + k // BLOCK_K, mask=k_mask, other=0.0)
            if INV_ROPE and ROPE_HOIST:
                x0 = _load_activation_hoisted(x_base + row0 * stride_xm, k, k_mask, kb * BLOCK_K, cos0, signed_sin0,
                                              is_rope, HEAD, BLOCK_KI)
            else:
                x0 = _load_activation(x_base + row0 * stride_xm, freq0, k, k_mask, kb * BLOCK_K, INV_ROPE, HEAD,
                                      ROPE, BLOCK_KI)
            acc0 += w * (x0.to(tl.float32) * s_cols)[None, :]
            if BLOCK_M == 2:
                if INV_ROPE and ROPE_HOIST:
                    x1 = _load_activation_hoisted(x_base + row1 * stride_xm, k, k_mask & (row1 < M), kb * BLOCK_K,
                                                  cos1, signed_sin1, is_rope, HEAD, BLOCK_KI)
                else:
                    x1 = _load_activation(x_base + row1 * stride_xm, freq1, k, k_mask & (row1 < M), kb * BLOCK_K,
                                          INV_ROPE, HEAD, ROPE, BLOCK_KI)
                acc1 += w * (x1.to(tl.float32) * s_cols)[None, :]
        acc = tl.sum(acc0, axis=1)[None, :]
        if BLOCK_M == 2:
            acc = tl.where((rm == row0)[:, None], acc, tl.sum(acc1, axis=1)[None, :])

    _pdl_launch_dependents(PDL and PDL_LATE_TRIGGER)  # after the main loop: the epilogue overlaps the next launch
    y_ptrs = y_ptr + pid_g * stride_yg + rm[:, None] * stride_ym + rn[None, :]
    y_mask = m_mask[:, None] & n_mask[None, :]
    if not IS_SPLIT:
        tl.store(y_ptrs, acc.to(tl.bfloat16), mask=y_mask)
    else:
        # partials [G, num_splits, M, N] fp32; the last program of this tile to arrive sums them
        part_base = partial_ptr + (pid_g * num_splits).to(tl.int64) * M * N
        tile_part = rm[:, None] * N + rn[None, :]
        tl.store(part_base + pid_k.to(tl.int64) * M * N + tile_part, acc, mask=y_mask)
        _sum_split_partials(part_base, M * N, tile_part, y_ptrs, y_mask, counter_ptr, pid_g * tiles_per_group + pid,
                            num_splits, BLOCK_M, BLOCK_N)


@triton.jit
def _load_weight(w_desc, ptrs, mask, pid_g, n0, k0, EVICT_FIRST: tl.constexpr, W_TMA: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr):
    """FP8 weight tile [BN, BK]; EVICT_FIRST marks it first out of L2 (each byte is read once per call);
    W_TMA fetches it by TMA instead (_weight_tile)."""
    if W_TMA:
        w = _weight_tile(w_desc, ptrs, mask, pid_g, n0, k0, W_TMA, BN, BK)
    elif EVICT_FIRST:
        w = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    else:
        w = tl.load(ptrs, mask=mask, other=0.0)
    return w


@triton.jit
def _row_partial(w, s_cols, x_base, row, M, stride_xm, pos_ptr, freqs_ptr,
                 freqs_poison_ptr, n_positions, stride_freq, k, k_mask, k_first,
                 INV_ROPE: tl.constexpr, HEAD: tl.constexpr, ROPE: tl.constexpr, WIDTH: tl.constexpr,
                 X_BROADCAST: tl.constexpr):
    """Row ``row``'s contribution of one K chunk: sum_k w[n, k] * (x[row, k] * scale(k)) in fp32, [BLOCK_N].
    A row past M loads zeros (contributes nothing). The scale is folded into the fp32 activation, shared
    by every column of the tile; its position is read only when the chunk reaches rope dims. With
    X_BROADCAST, ``k`` / ``k_mask`` / ``s_cols`` come as [BLOCK_N, WIDTH] broadcasts (column offset 0), so
    the activation is loaded straight into the weight tile's register layout (no shared-memory layout
    conversion per row; the compiler loads each distinct address once per thread)."""
    x = _row_activation(x_base, row, M, stride_xm, pos_ptr, freqs_ptr,
                        freqs_poison_ptr, n_positions, stride_freq, k, k_mask, k_first, INV_ROPE,
                        HEAD, ROPE, WIDTH)
    return _row_dot(w, x, s_cols, X_BROADCAST)


@triton.jit
def _chunk_columns(k, k_mask, s_cols, rn, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr, X_BROADCAST: tl.constexpr):
    """The activation's columns, their mask and the chunk's scales as :func:`_row_partial` takes them: with
    X_BROADCAST column offset 0 everywhere (the same addresses for every column, in the weight's layout)."""
    if X_BROADCAST:
        return (k[None, :] + (rn * 0)[:, None], k_mask[None, :],
                tl.broadcast_to(s_cols[None, :], (BLOCK_N, WIDTH)))  # one conversion per chunk
    return k, k_mask, s_cols


@triton.jit
def _row_activation(x_base, row, M, stride_xm, pos_ptr, freqs_ptr,
                    freqs_poison_ptr, n_positions, stride_freq, k, k_mask, k_first,
                    INV_ROPE: tl.constexpr, HEAD: tl.constexpr, ROPE: tl.constexpr, WIDTH: tl.constexpr):
    """The bf16 activation of row ``row`` (zeros past M) over ``k`` for :func:`_row_partial`."""
    valid = row < M
    freq_row = freqs_ptr
    if INV_ROPE:
        if (k_first % HEAD) + WIDTH > HEAD - ROPE:
            pos = tl.load(pos_ptr + row, mask=valid, other=0)
            freq_row = _freqs_row(freqs_ptr, pos, stride_freq, n_positions, freqs_poison_ptr)
    return _load_activation(x_base + row * stride_xm, freq_row, k, k_mask & valid, k_first, INV_ROPE, HEAD, ROPE,
                            WIDTH)


@triton.jit
def _row_dot(w, x, s_cols, X_BROADCAST: tl.constexpr):
    """sum_k w[n, k] * (x[k] * scale(k)) in fp32 for :func:`_row_partial`."""
    xs = x.to(tl.float32) * s_cols
    if X_BROADCAST:  # k, s_cols already [BLOCK_N, WIDTH] in the weight tile's layout
        part = tl.sum(w * xs, axis=1)
    else:
        part = tl.sum(w * xs[None, :], axis=1)
    return part


@triton.jit
def _store_row(acc, row, M, y_row_ptr, part_row_ptr, rn, n_mask, IS_SPLIT: tl.constexpr):
    mask = n_mask & (row < M)
    if IS_SPLIT:
        tl.store(part_row_ptr + rn, acc, mask=mask)
    else:
        tl.store(y_row_ptr + rn, acc.to(tl.bfloat16), mask=mask)


# Rows form: up to 8 rows share each dequantised weight tile in registers (CUDA-core FMAs).
@triton.jit(do_not_specialize=["M", "k_blocks_per_split", "num_splits"])
def _block_fp8_gemv_rows_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr, freqs_poison_ptr, n_positions, w_desc,
    M, N, K,
    stride_xm, stride_xg,
    stride_wg, stride_wn,
    stride_sg, stride_sn,
    stride_ym, stride_yg,
    stride_freq,
    k_blocks_per_split, num_splits,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_UNROLL: tl.constexpr,
    IS_SPLIT: tl.constexpr, PREFETCH: tl.constexpr, EVICT_FIRST: tl.constexpr, X_BROADCAST: tl.constexpr,
    INV_ROPE: tl.constexpr, HEAD: tl.constexpr, ROPE: tl.constexpr,
    PDL: tl.constexpr = False, L2_PREFETCH_BLOCKS: tl.constexpr = 0,
    PDL_LATE_TRIGGER: tl.constexpr = False, W_TMA: tl.constexpr = 0,
    ONE_CHUNK: tl.constexpr = False, X_FIRST: tl.constexpr = False,
):
    """One program: rows [pid_m*ROWS, +ROWS) x cols [pid_n*BLOCK_N, +BLOCK_N) of group pid_g over K blocks
    [pid_k*k_blocks_per_split, +k_blocks_per_split), BLOCK_K*K_UNROLL columns per iteration.

    Each weight chunk is loaded once (16-byte loads), converted to fp32 once, and multiplied by every
    row's scaled activation; each row keeps a [BLOCK_N] fp32 accumulator (reduced along K every
    iteration, so registers do not grow with ROWS x chunk). PREFETCH issues the next chunk's weight
    load before this chunk's arithmetic (two chunks in flight per program). Row tiles of one column
    tile are adjacent program ids, so when M > ROWS the re-read of a weight tile comes from L2.

    ONE_CHUNK (with PREFETCH; the launch guarantees a split of exactly K_UNROLL blocks): the loop runs once, on the
    chunk whose weight and scales were loaded before the PDL wait (GemvConfig.one_chunk), and loads no next chunk.
    X_FIRST (ONE_CHUNK, one row): the chunk in straight-line code with the activation's load issued before the weight
    is converted, so that its round trip overlaps the weight's (in the loop Triton hoists the conversion, which waits
    for the weight, above the activation's load, and the two round trips ran one after the other: sm_90a SASS)."""
    tl.static_assert(BLOCK_K % BLOCK_N == 0)
    tl.static_assert(PREFETCH or not ONE_CHUNK)
    tl.static_assert(ONE_CHUNK or not X_FIRST)
    tl.static_assert(ROWS == 1 or not X_FIRST)
    tl.static_assert(ROWS == 1 or ROWS == 2 or ROWS == 4 or ROWS == 8)
    BLOCK_KI: tl.constexpr = BLOCK_K * K_UNROLL
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_g = tl.program_id(2)
    m_tiles = tl.cdiv(M, ROWS)
    pid_m = pid % m_tiles
    pid_n = pid // m_tiles

    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_KI)
    n_mask = rn < N
    row0 = pid_m * ROWS
    x_base = x_ptr + pid_g * stride_xg
    w_rows = w_ptr + pid_g * stride_wg + rn[:, None] * stride_wn  # [BN, 1]
    s_row = s_ptr + pid_g * stride_sg + (pid_n * BLOCK_N // BLOCK_K) * stride_sn

    k_blocks = tl.cdiv(K, BLOCK_K)
    kb_begin = pid_k * k_blocks_per_split
    kb_end = tl.minimum(kb_begin + k_blocks_per_split, k_blocks)
    k_stop = tl.minimum(kb_end * BLOCK_K, K)

    _pdl_launch_dependents(PDL and not PDL_LATE_TRIGGER)
    _prefetch_weight_l2(w_rows, rn, N, stride_wn, kb_begin, kb_end, BLOCK_K, L2_PREFETCH_BLOCKS)

    acc0 = tl.zeros((BLOCK_N,), tl.float32)
    acc1 = tl.zeros((BLOCK_N,), tl.float32)
    acc2 = tl.zeros((BLOCK_N,), tl.float32)
    acc3 = tl.zeros((BLOCK_N,), tl.float32)
    acc4 = tl.zeros((BLOCK_N,), tl.float32)
    acc5 = tl.zeros((BLOCK_N,), tl.float32)
    acc6 = tl.zeros((BLOCK_N,), tl.float32)
    acc7 = tl.zeros((BLOCK_N,), tl.float32)
    if PREFETCH:
        k_next = kb_begin * BLOCK_K + rk
        w_next = _load_weight(w_desc, w_rows + k_next[None, :], n_mask[:, None] & (k_next < k_stop)[None, :], pid_g,
                              pid_n * BLOCK_N, kb_begin * BLOCK_K, EVICT_FIRST, W_TMA, BLOCK_N, BLOCK_KI)
        if ONE_CHUNK:  # the split's only chunk: its scales are constants too, loaded before the wait
            s_first = tl.load(s_row + k_next // BLOCK_K, mask=k_next < k_stop, other=0.0)
    _pdl_wait(PDL)  # after the first weight chunk's load is issued (PREFETCH): it is in flight while waiting
    if X_FIRST:  # the one chunk in straight-line code (in the loop below Triton hoists the conversion above the loads)
        k = kb_begin * BLOCK_K + rk
        k_x, kx_mask, s_cols = _chunk_columns(k, k < k_stop, s_first, rn, BLOCK_N, BLOCK_KI, X_BROADCAST)
        x0 = _row_activation(x_base, row0, M, stride_xm, pos_ptr, freqs_ptr,
                             freqs_poison_ptr, n_positions, stride_freq, k_x, kx_mask,
                             kb_begin * BLOCK_K, INV_ROPE, HEAD, ROPE, BLOCK_KI)
        acc0 += _row_dot(w_next.to(tl.float32), x0, s_cols, X_BROADCAST)
    for kb in tl.range(kb_end if X_FIRST else kb_begin, kb_end, K_UNROLL, num_stages=W_TMA if W_TMA else None):
        k = kb * BLOCK_K + rk
        k_mask = k < k_stop
        if PREFETCH:
            w_raw = w_next
            if not ONE_CHUNK:
                k_next = k + BLOCK_KI
                w_next = _load_weight(w_desc, w_rows + k_next[None, :], n_mask[:, None] & (k_next < k_stop)[None, :],
                                      pid_g, pid_n * BLOCK_N, kb * BLOCK_K + BLOCK_KI, EVICT_FIRST, W_TMA, BLOCK_N,
                                      BLOCK_KI)
        else:
            w_raw = _load_weight(w_desc, w_rows + k[None, :], n_mask[:, None] & k_mask[None, :], pid_g,
                                 pid_n * BLOCK_N, kb * BLOCK_K, EVICT_FIRST, W_TMA, BLOCK_N, BLOCK_KI)
        w = w_raw.to(tl.float32)
        if ONE_CHUNK:
            s_cols = s_first
        else:
            s_cols = tl.load(s_row + k // BLOCK_K, mask=k_mask, other=0.0)
        k_x, kx_mask, s_cols = _chunk_columns(k, k_mask, s_cols, rn, BLOCK_N, BLOCK_KI, X_BROADCAST)
        k_first = kb * BLOCK_K
        acc0 += _row_partial(w, s_cols, x_base, row0, M, stride_xm, pos_ptr, freqs_ptr,
                             freqs_poison_ptr, n_positions, stride_freq, k_x, kx_mask,
                             k_first, INV_ROPE, HEAD, ROPE, BLOCK_KI, X_BROADCAST)
        if ROWS > 1:
            acc1 += _row_partial(w, s_cols, x_base, row0 + 1, M, stride_xm, pos_ptr, freqs_ptr,
                                 freqs_poison_ptr, n_positions, stride_freq, k_x,
                                 kx_mask, k_first, INV_ROPE, HEAD, ROPE, BLOCK_KI, X_BROADCAST)
        if ROWS > 2:
            acc2 += _row_partial(w, s_cols, x_base, row0 + 2, M, stride_xm, pos_ptr, freqs_ptr,
                                 freqs_poison_ptr, n_positions, stride_freq, k_x,
                                 kx_mask, k_first, INV_ROPE, HEAD, ROPE, BLOCK_KI, X_BROADCAST)
        if ROWS > 3:
            acc3 += _row_partial(w, s_cols, x_base, row0 + 3, M, stride_xm, pos_ptr, freqs_ptr,
                                 freqs_poison_ptr, n_positions, stride_freq, k_x,
                                 kx_mask, k_first, INV_ROPE, HEAD, ROPE, BLOCK_KI, X_BROADCAST)
        if ROWS > 4:
            acc4 += _row_partial(w, s_cols, x_base, row0 + 4, M, stride_xm, pos_ptr, freqs_ptr,
                                 freqs_poison_ptr, n_positions, stride_freq, k_x,
                                 kx_mask, k_first, INV_ROPE, HEAD, ROPE, BLOCK_KI, X_BROADCAST)
        if ROWS > 5:
            acc5 += _row_partial(w, s_cols, x_base, row0 + 5, M, stride_xm, pos_ptr, freqs_ptr,
                                 freqs_poison_ptr, n_positions, stride_freq, k_x,
                                 kx_mask, k_first, INV_ROPE, HEAD, ROPE, BLOCK_KI, X_BROADCAST)
        if ROWS > 6:
            acc6 += _row_partial(w, s_cols, x_base, row0 + 6, M, stride_xm, pos_ptr, freqs_ptr,
                                 freqs_poison_ptr, n_positions, stride_freq, k_x,
                                 kx_mask, k_first, INV_ROPE, HEAD, ROPE, BLOCK_KI, X_BROADCAST)
        if ROWS > 7:
            acc7 += _row_partial(w, s_cols, x_base, row0 + 7, M, stride_xm, pos_ptr, freqs_ptr,
                                 freqs_poison_ptr, n_positions, stride_freq, k_x,
                                 kx_mask, k_first, INV_ROPE, HEAD, ROPE, BLOCK_KI, X_BROADCAST)

    _pdl_launch_dependents(PDL and PDL_LATE_TRIGGER)  # after the main loop: the epilogue overlaps the next launch
    y_base = y_ptr + pid_g * stride_yg
    # partials [G, num_splits, M, N] fp32
    part_g = partial_ptr + (pid_g * num_splits).to(tl.int64) * M * N
    part_base = part_g + pid_k.to(tl.int64) * M * N
    _store_row(acc0, row0, M, y_base + row0 * stride_ym, part_base + row0 * N, rn, n_mask, IS_SPLIT)
    if ROWS > 1:
        _store_row(acc1, row0 + 1, M, y_base + (row0 + 1) * stride_ym, part_base + (row0 + 1) * N, rn, n_mask,
                   IS_SPLIT)
    if ROWS > 2:
        _store_row(acc2, row0 + 2, M, y_base + (row0 + 2) * stride_ym, part_base + (row0 + 2) * N, rn, n_mask,
                   IS_SPLIT)
    if ROWS > 3:
        _store_row(acc3, row0 + 3, M, y_base + (row0 + 3) * stride_ym, part_base + (row0 + 3) * N, rn, n_mask,
                   IS_SPLIT)
    if ROWS > 4:
        _store_row(acc4, row0 + 4, M, y_base + (row0 + 4) * stride_ym, part_base + (row0 + 4) * N, rn, n_mask,
                   IS_SPLIT)
    if ROWS > 5:
        _store_row(acc5, row0 + 5, M, y_base + (row0 + 5) * stride_ym, part_base + (row0 + 5) * N, rn, n_mask,
                   IS_SPLIT)
    if ROWS > 6:
        _store_row(acc6, row0 + 6, M, y_base + (row0 + 6) * stride_ym, part_base + (row0 + 6) * N, rn, n_mask,
                   IS_SPLIT)
    if ROWS > 7:
        _store_row(acc7, row0 + 7, M, y_base + (row0 + 7) * stride_ym, part_base + (row0 + 7) * N, rn, n_mask,
                   IS_SPLIT)
    if IS_SPLIT:
        rm = row0 + tl.arange(0, ROWS)
        _sum_split_partials(part_g, M * N, rm[:, None] * N + rn[None, :],
                            y_base + rm[:, None] * stride_ym + rn[None, :], (rm < M)[:, None] & n_mask[None, :],
                            counter_ptr, pid_g * tl.num_programs(0) + pid, num_splits, ROWS, BLOCK_N)


# FP8 tensor-core form: the weight goes to the MMA as e4m3 with no dequantisation; each bf16
# activation row is split per 128-wide K block into two e4m3 terms in registers.
_E4M3_MAX = tl.constexpr(448.0)
_LO_FACTOR = tl.constexpr(16.0)  # lo carries the residual times 16 (4 more significant bits)


@triton.jit
def _round_to_e4m3_grid(v):
    """fp32 ``v`` rounded to nearest-even on 3 mantissa bits in integer arithmetic, so a later cast to
    e4m3 is exact for normal values (the interpreter's fp32 -> e4m3 cast drops the rounding carry into
    the exponent; the GPU's rounds, and gets the same result)."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _to_e4m3(v):
    """fp32 ``v`` (|v| <= 448) -> e4m3, rounded to nearest-even."""
    return _round_to_e4m3_grid(v).to(tl.float8e4nv)


@triton.jit
def _pow2_activation_scale(x):
    """Per row of fp32 ``x [R, BLOCK_K]``: the power of two at or above amax / 448 (amax 0 -> a tiny
    power of two, all zeros), so that x / s is exact and within e4m3's range."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-30)
    s_bits = (amax / _E4M3_MAX).to(tl.int32, bitcast=True)
    return ((s_bits + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)  # 2^ceil(log2(amax / 448))


@triton.jit
def _split_activation_joined(x):
    """The split of _split_activation_e4m3 on BLOCK_M distinct rows (no duplicated loads or arithmetic):
    fp32 ``x [BM, BLOCK_K]`` -> (e4m3 q [2*BM, BLOCK_K], fp32 column scale [2*BM]), rows 0..BM-1 hi,
    rows BM..2*BM-1 lo, both joined before one exact cast."""
    s = _pow2_activation_scale(x)
    q = _split_scaled_joined(x * (1.0 / s)[:, None])
    return q, _hi_lo_column_scale(s)


@triton.jit
def _split_scaled_joined(v):
    """fp32 ``v [BM, BLOCK_K]`` (|v| <= 448) -> e4m3 ``[2*BM, BLOCK_K]``: rows 0..BM-1 hi = e4m3(v), rows
    BM..2*BM-1 lo = e4m3((v - hi) * 16), joined before one exact cast."""
    BM: tl.constexpr = v.shape[0]
    BK: tl.constexpr = v.shape[1]
    hi = _to_e4m3(v).to(tl.float32)
    lo = _round_to_e4m3_grid((v - hi) * _LO_FACTOR)
    return tl.reshape(tl.permute(tl.join(hi, lo), (2, 0, 1)), (2 * BM, BK)).to(tl.float8e4nv)


@triton.jit
def _hi_lo_column_scale(s):
    """Per-row scale ``s [BM]`` -> the [2*BM] MMA column scales of the joined split: s (hi), s / 16 (lo)."""
    BM: tl.constexpr = s.shape[0]
    return tl.reshape(tl.permute(tl.join(s, s / _LO_FACTOR), (1, 0)), (2 * BM,))


# Chained form: 128-wide K blocks per step of the pre-pass that bounds each row's scaled activation.
_CHAIN_PREPASS_BLOCKS = tl.constexpr(4)


@triton.jit
def _chain_row_scale(x_rows, x_valid, s_row, kb_begin, kb_end, k_stop, INV_ROPE: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """Per activation row of the split: the power of two S at or above max_kb(amax|x[row, block kb]| *
    w_scale[kb]) / 448 (x 2 with the fused inverse RoPE: a rotated pair element is at most sqrt(2) times
    the larger input, plus bf16 rounding), so x * w_scale / S stays within e4m3's range on every block
    of the split. The rows and the scales are small and L2-resident."""
    BM: tl.constexpr = x_rows.shape[0]
    rk = tl.arange(0, BLOCK_K)
    bound = tl.zeros((BM,), tl.float32)
    for kb0 in range(kb_begin, kb_end, _CHAIN_PREPASS_BLOCKS):
        # independent [BM, BLOCK_K] loads (all in flight at once), each in the main loop's own tile shape so
        # the row scale's layout is the one the main loop's activation tile already has (a wider load here
        # made the compiler move the main loop to the pre-pass's layout: duplicated work, 2x registers)
        for u in tl.static_range(_CHAIN_PREPASS_BLOCKS):
            kb = kb0 + u
            k = kb * BLOCK_K + rk
            ws = tl.abs(tl.load(s_row + kb, mask=kb < kb_end, other=0.0))
            xa = tl.abs(tl.load(x_rows + k[None, :], mask=x_valid[:, None] & (k < k_stop)[None, :],
                                other=0.0).to(tl.float32))
            bound = tl.maximum(bound, tl.max(xa, axis=1) * ws)
    if INV_ROPE:
        bound = bound * 2.0
    s_bits = (tl.maximum(bound, 1e-30) / _E4M3_MAX).to(tl.int32, bitcast=True)
    return ((s_bits + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)


@triton.jit
def _split_activation_e4m3(x, is_lo):
    """Rows of fp32 ``x [R, BLOCK_K]`` -> (e4m3 q, fp32 column scale [R]) with x ~= scale * q, where a
    row with ``is_lo`` holds the residual term: per row, s = the power of two at or above amax / 448
    (amax 0 -> tiny s, all zeros), hi = e4m3(x / s), lo = e4m3((x / s - hi) * 16), x = s * (hi + lo / 16).
    x / s is exact (power-of-two s) and for bf16 x the residual of a 4-bit hi is a small integer times a
    power of two, so hi + lo / 16 reproduces x exactly down to s * 2^-13 (e4m3 subnormals)."""
    s = _pow2_activation_scale(x)
    v = x * (1.0 / s)[:, None]
    hi = _to_e4m3(v).to(tl.float32)
    q = _to_e4m3(tl.where(is_lo[:, None], (v - hi) * _LO_FACTOR, v))
    return q, tl.where(is_lo, s / _LO_FACTOR, s)


@triton.jit(do_not_specialize=["M", "k_blocks_per_split", "num_splits", "num_groups"])
def _block_fp8_gemv_fp8mma_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr, freqs_poison_ptr, n_positions, w_desc,
    M, N, K,
    stride_xm, stride_xg,
    stride_wg, stride_wn,
    stride_sg, stride_sn,
    stride_ym, stride_yg,
    stride_freq,
    k_blocks_per_split, num_splits, num_groups,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_UNROLL: tl.constexpr,
    JOIN: tl.constexpr, IS_SPLIT: tl.constexpr, INV_ROPE: tl.constexpr, HEAD: tl.constexpr, ROPE: tl.constexpr,
    CHAIN: tl.constexpr = False, PDL: tl.constexpr = False, L2_PREFETCH_BLOCKS: tl.constexpr = 0,
    PDL_LATE_TRIGGER: tl.constexpr = False, W_TMA: tl.constexpr = 0,
    PERSISTENT: tl.constexpr = False, FLATTEN: tl.constexpr = False,
    SPLIT_SUM_BATCH: tl.constexpr = 1, ROPE_HOIST: tl.constexpr = 0, W_BEFORE_WAIT: tl.constexpr = 0,
    INLINE_PTX: tl.constexpr = True, ROPE_PAIRS: tl.constexpr = False,
):
    """One program: rows [pid_m*BLOCK_M, +BLOCK_M) x cols [pid_n*BLOCK_N, +BLOCK_N) of group pid_g over
    K blocks [pid_k*k_blocks_per_split, +k_blocks_per_split), one 128-wide block per iteration.

    W_BEFORE_WAIT (GemvConfig.w_before_wait; the launch guarantees a split of exactly K_UNROLL = ONE_SHOT_BLOCKS
    blocks): the one-shot program of _fp8mma_one_shot_item, block 0's weight tile and scale loaded before the PDL
    wait.

    The FP8 weight tile is the MMA's M side, as loaded (no conversion); the N side is 2*BLOCK_M columns:
    column j < BLOCK_M holds row j's hi term, column BLOCK_M + j its lo term (both e4m3, split in
    registers by _split_activation_e4m3). Each block's fp32 product is scaled per column by
    weight scale x activation scale, so hi and lo columns accumulate separately and are added once at
    the end. On sm_90 this is wgmma e4m3, on sm_120 mma.sync e4m3 (QMMA): the weight bytes never pass
    through CUDA-core conversions. JOIN loads and splits the BLOCK_M distinct rows once and joins hi and
    lo into the 2*BLOCK_M columns (half the activation work of loading each row for both halves);
    K_UNROLL 128-wide blocks per loop iteration (more weight bytes per pipeline stage).

    CHAIN: the MMAs chain, ``acc = dot(w, q^T, acc)``, with no per-block scaling between them
    (a per-column scale on each fresh product makes every MMA complete before the next can start). The
    tile's weight scale of block kb (BLOCK_N <= 128 rows lie in one scale block) is folded into the fp32
    activation, x' = x * w_scale[kb], and x' is split with ONE power-of-two scale S per row and K split,
    chosen by a pre-pass (_chain_row_scale): hi = e4m3(x'/S), lo = e4m3((x'/S - hi) * 16); the hi and lo
    columns get S and S / 16 once after the loop. For power-of-two weight scales (DSv4's UE8M0) the split
    is exact as in the unchained form down to S * 2^-13 (e4m3 subnormals), now with S from the split's
    largest |x'| rather than the block's; otherwise x * w_scale adds one fp32 rounding and hi + lo keeps
    8 significant bits of it. With JOIN the joined hi/lo operand reaches the MMA through shared memory
    byte by byte on sm_120a (STS.U8 / LDS.U8); without JOIN (each row loaded for both its columns) the
    operand keeps the load's K-contiguous layout and moves by ldmatrix (LDSM), at twice the split work."""
    tl.static_assert(not (PERSISTENT and CHAIN))  # the chain pre-pass is a second loop inside the work-item loop
    tl.static_assert(not W_BEFORE_WAIT or not (PERSISTENT or CHAIN or W_TMA))
    tiles_per_group = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    tile, pid_k, pid_g = _program_start(w_ptr, stride_wg, stride_wn, N, K, tiles_per_group, num_splits,
                                        k_blocks_per_split, BLOCK_N, BLOCK_K, L2_PREFETCH_BLOCKS, PDL,
                                        PDL_LATE_TRIGGER, PERSISTENT, not W_BEFORE_WAIT)
    if W_BEFORE_WAIT:
        tl.static_assert(K_UNROLL == ONE_SHOT_BLOCKS and JOIN and not CHAIN)
        _fp8mma_one_shot_item(x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr,
                              n_positions, M, N, K,
                              stride_xm, stride_xg, stride_wg, stride_wn, stride_sg, stride_sn, stride_ym, stride_yg,
                              stride_freq, k_blocks_per_split, num_splits, tiles_per_group, tile, pid_k, pid_g,
                              BLOCK_M, BLOCK_N, BLOCK_K, IS_SPLIT, INV_ROPE, HEAD, ROPE, PDL,
                              PDL_LATE_TRIGGER, SPLIT_SUM_BATCH, ROPE_HOIST, INLINE_PTX, ROPE_PAIRS)
    elif PERSISTENT:
        num_items = tiles_per_group * num_splits * num_groups
        for item in tl.range(tl.program_id(0), num_items, tl.num_programs(0), flatten=FLATTEN,
                             num_stages=W_TMA if W_TMA else None):
            tile, pid_k, pid_g = _work_item(item, tiles_per_group, num_splits)
            _fp8mma_item(x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr,
                         n_positions, w_desc, M, N, K,
                         stride_xm, stride_xg, stride_wg, stride_wn, stride_sg, stride_sn, stride_ym, stride_yg,
                         stride_freq, k_blocks_per_split, num_splits, tiles_per_group, tile, pid_k, pid_g,
                         BLOCK_M, BLOCK_N, BLOCK_K, K_UNROLL, JOIN, IS_SPLIT, INV_ROPE, HEAD, ROPE, CHAIN, PDL,
                         PDL_LATE_TRIGGER, W_TMA, PERSISTENT, SPLIT_SUM_BATCH, ROPE_HOIST)
    else:
        _fp8mma_item(x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr,
                     n_positions, w_desc, M, N, K,
                     stride_xm, stride_xg, stride_wg, stride_wn, stride_sg, stride_sn, stride_ym, stride_yg,
                     stride_freq, k_blocks_per_split, num_splits, tiles_per_group, tile, pid_k, pid_g,
                     BLOCK_M, BLOCK_N, BLOCK_K, K_UNROLL, JOIN, IS_SPLIT, INV_ROPE, HEAD, ROPE, CHAIN, PDL,
                     PDL_LATE_TRIGGER, W_TMA, PERSISTENT, SPLIT_SUM_BATCH, ROPE_HOIST)


@triton.jit
def _fp8mma_item(x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr,
                 n_positions, w_desc, M, N, K,
                 stride_xm, stride_xg, stride_wg, stride_wn, stride_sg, stride_sn, stride_ym, stride_yg,
                 stride_freq, k_blocks_per_split, num_splits, tiles_per_group, pid, pid_k, pid_g,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_UNROLL: tl.constexpr,
                 JOIN: tl.constexpr, IS_SPLIT: tl.constexpr, INV_ROPE: tl.constexpr, HEAD: tl.constexpr,
                 ROPE: tl.constexpr, CHAIN: tl.constexpr, PDL: tl.constexpr, PDL_LATE_TRIGGER: tl.constexpr,
                 W_TMA: tl.constexpr, PERSISTENT: tl.constexpr, SPLIT_SUM_BATCH: tl.constexpr,
                 ROPE_HOIST: tl.constexpr):
    """One work item of _block_fp8_gemv_fp8mma_kernel (tile ``pid`` of group pid_g, K split pid_k), after the PDL
    wait. With split-K the last arriver sums the partials, SPLIT_SUM_BATCH of them loaded per step. ROPE_HOIST (with
    INV_ROPE): the inverse RoPE's factors loaded once, before the K loop (_rope_chunk_factors); ROPE_PRELOAD: the split
    is one head, whose rotated last block is loaded before the loop and selected in it (no rope work in the loop)."""
    tl.static_assert(BLOCK_K % BLOCK_N == 0)
    TWO_M: tl.constexpr = 2 * BLOCK_M
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_m = pid // n_tiles
    pid_n = pid % n_tiles

    col = tl.arange(0, TWO_M)
    is_lo = col >= BLOCK_M
    rm_col = pid_m * BLOCK_M + (col % BLOCK_M)  # the activation row behind each MMA column
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_mask = rn < N

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if JOIN:  # activation rows as they are
        x_row_ids = rm
    else:  # activation row behind each MMA column
        x_row_ids = rm_col
    x_valid = x_row_ids < M
    x_rows = x_ptr + pid_g * stride_xg + x_row_ids[:, None] * stride_xm
    w_rows = w_ptr + pid_g * stride_wg + rn[:, None] * stride_wn  # [BN, 1]
    s_row = s_ptr + pid_g * stride_sg + (pid_n * BLOCK_N // BLOCK_K) * stride_sn
    k_blocks = tl.cdiv(K, BLOCK_K)
    kb_begin = pid_k * k_blocks_per_split
    kb_end = tl.minimum(kb_begin + k_blocks_per_split, k_blocks)
    k_stop = tl.minimum(kb_end * BLOCK_K, K)

    freq_rows = freqs_ptr
    row_in_table = x_valid
    if INV_ROPE:
        pos = tl.load(pos_ptr + x_row_ids, mask=x_valid, other=0)
        # clamped, not through the NaN row: a NaN rotation would not survive the e4m3 split anyway (the clamps and
        # the amax drop NaN on the GPU); the store makes an out-of-table row NaN (row_in_table)
        freq_rows = _freqs_row_clamped(freqs_ptr, pos[:, None], stride_freq, n_positions)
        if JOIN:  # the activation rows are the output rows
            row_in_table = _position_in_table(pos, n_positions)
        else:
            row_in_table = _position_in_table(tl.load(pos_ptr + rm, mask=rm < M, other=0), n_positions)
        if ROPE_HOIST:
            cos, signed_sin, is_rope = _rope_chunk_factors(freq_rows, rk[None, :], x_valid[:, None], HEAD, ROPE,
                                                           BLOCK_K)
        if ROPE_HOIST == ROPE_PRELOAD:  # the split is one head: its last block is the only one with rope dims
            k_rope = (kb_end - 1) * BLOCK_K + rk
            x_rope = _load_activation_hoisted(x_rows, k_rope[None, :], x_valid[:, None] & (k_rope < k_stop)[None, :],
                                              (kb_end - 1) * BLOCK_K, cos, signed_sin, is_rope, HEAD, BLOCK_K)

    if CHAIN:
        row_scale = _chain_row_scale(x_rows, x_valid, s_row, kb_begin, kb_end, k_stop, INV_ROPE, BLOCK_K)
        inv_row_scale = 1.0 / row_scale  # exact: a power of two
    # persistent: a K loop of a fixed trip count (the last split's surplus blocks masked), so that Triton can flatten
    # it into the work-item loop (it fuses only inner loops whose bounds do not vary with the outer loop)
    if PERSISTENT:
        loop_begin = 0
        loop_end = k_blocks_per_split
        kb_shift = kb_begin
    else:
        loop_begin = kb_begin
        loop_end = kb_end
        kb_shift = 0
    acc = tl.zeros((BLOCK_N, TWO_M), tl.float32)
    for kb_it in tl.range(loop_begin, loop_end, K_UNROLL, num_stages=W_TMA if W_TMA else None):
        for u in tl.static_range(K_UNROLL):
            kb = kb_it + kb_shift + u
            k = kb * BLOCK_K + rk
            k_mask = k < k_stop  # past the split: zero weight and activation, zero scale
            w = _weight_tile(w_desc, w_rows + k[None, :], n_mask[:, None] & k_mask[None, :], pid_g,
                             pid_n * BLOCK_N, kb * BLOCK_K, W_TMA, BLOCK_N, BLOCK_K)
            if INV_ROPE and ROPE_HOIST == ROPE_PRELOAD:
                x = tl.load(x_rows + k[None, :], mask=x_valid[:, None] & k_mask[None, :], other=0.0)
                x = tl.where(kb == kb_end - 1, x_rope, x)
            elif INV_ROPE and ROPE_HOIST:
                x = _load_activation_hoisted(x_rows, k[None, :], x_valid[:, None] & k_mask[None, :], kb * BLOCK_K,
                                             cos, signed_sin, is_rope, HEAD, BLOCK_K)
            else:
                x = _load_activation(x_rows, freq_rows, k[None, :], x_valid[:, None] & k_mask[None, :],
                                     kb * BLOCK_K, INV_ROPE, HEAD, ROPE, BLOCK_K)
            w_scale = tl.load(s_row + kb, mask=kb < kb_end, other=0.0)
            if CHAIN:
                v = x.to(tl.float32) * (w_scale * inv_row_scale)[:, None]
                # the pre-pass bound holds up to fp32 rounding of amax * w_scale / 448: clamp to e4m3's range
                v = tl.minimum(tl.maximum(v, -_E4M3_MAX), _E4M3_MAX)
                if JOIN:
                    acc = tl.dot(w, tl.trans(_split_scaled_joined(v)), acc)
                else:  # each row loaded for its hi and its lo column: the operand keeps the load's layout
                    hi = _to_e4m3(v).to(tl.float32)
                    q = _to_e4m3(tl.where(is_lo[:, None], (v - hi) * _LO_FACTOR, v))
                    acc = tl.dot(w, tl.trans(q), acc)
            else:
                if JOIN:
                    q, x_scale = _split_activation_joined(x.to(tl.float32))
                else:
                    q, x_scale = _split_activation_e4m3(x.to(tl.float32), is_lo)
                acc += tl.dot(w, tl.trans(q)) * (x_scale * w_scale)[None, :]
    _pdl_launch_dependents(PDL and PDL_LATE_TRIGGER)  # after the main loop: the epilogue overlaps the next launch
    if CHAIN:
        if JOIN:
            acc = acc * _hi_lo_column_scale(row_scale)[None, :]
        else:
            acc = acc * tl.where(is_lo, row_scale / _LO_FACTOR, row_scale)[None, :]
    _fp8mma_store(acc, rm, rn, n_mask, M, N, y_ptr, stride_ym, stride_yg, partial_ptr, counter_ptr, pid, pid_k, pid_g,
                  num_splits, tiles_per_group, BLOCK_M, BLOCK_N, IS_SPLIT, SPLIT_SUM_BATCH, row_in_table, INV_ROPE)


@triton.jit
def _fp8mma_store(acc, rm, rn, n_mask, M, N, y_ptr, stride_ym, stride_yg, partial_ptr, counter_ptr, pid, pid_k, pid_g,
                  num_splits, tiles_per_group, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_SPLIT: tl.constexpr,
                  SPLIT_SUM_BATCH: tl.constexpr, row_in_table, INV_ROPE: tl.constexpr):
    """The FP8 tensor-core form's epilogue: hi + lo columns of ``acc [BN, 2*BM]`` added per row, then the bf16 tile
    stored, or (split-K) the fp32 partial stored and the tile's last arriver summing the partials. INV_ROPE: a row
    whose position lies outside the freqs table (``row_in_table [BM]`` False) is stored as NaN (the FP8 forms gather
    such a row's freqs at the position clamped into the table: a NaN rotation would not survive the e4m3 split, whose
    clamps and amax drop NaN on the GPU)."""
    # hi + lo per row: [BN, 2, BM] summed over the middle axis, then rows first
    out = tl.trans(tl.sum(tl.reshape(acc, (BLOCK_N, 2, BLOCK_M)), axis=1))  # [BM, BN]
    if INV_ROPE:
        out = tl.where(row_in_table[:, None], out, float("nan"))

    y_ptrs = y_ptr + pid_g * stride_yg + rm[:, None] * stride_ym + rn[None, :]
    y_mask = (rm < M)[:, None] & n_mask[None, :]
    if not IS_SPLIT:
        tl.store(y_ptrs, out.to(tl.bfloat16), mask=y_mask)
    else:
        # partials [G, num_splits, M, N] fp32; the last program of this tile to arrive sums them
        part_base = partial_ptr + (pid_g * num_splits).to(tl.int64) * M * N
        tile_part = rm[:, None] * N + rn[None, :]
        tl.store(part_base + pid_k.to(tl.int64) * M * N + tile_part, out, mask=y_mask)
        _sum_split_partials(part_base, M * N, tile_part, y_ptrs, y_mask, counter_ptr, pid_g * tiles_per_group + pid,
                            num_splits, BLOCK_M, BLOCK_N, SPLIT_SUM_BATCH)


# One-shot FP8 tensor-core program with block 0's weight loaded before the PDL wait (GemvConfig.w_before_wait): a split
# of ONE_SHOT_BLOCKS 128-blocks; each block's activation rows its own variable (Triton has no indexing into a register
# tensor), selected per unrolled block at compile time. Runs 19 / 20: 2 or 4 blocks before the wait, wq_b's 8-block
# split and 64-column tiles lost; they and the untimed 1- / 2-block splits were removed.
ONE_SHOT_BLOCKS = tl.constexpr(4)


@triton.jit
def _one_shot_weight(w_rows, s_row, kb, kb_end, k_stop, rk, n_mask, BLOCK_K: tl.constexpr):
    """Block ``kb``'s FP8 weight tile [BN, BLOCK_K] (16-byte loads into registers) and its weight scale; past the
    split: zeros."""
    k = kb * BLOCK_K + rk
    w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & (k < k_stop)[None, :], other=0.0)
    return w, tl.load(s_row + kb, mask=kb < kb_end, other=0.0)


@triton.jit
def _one_shot_x(x_rows, freq_rows, kb, k_stop, x_valid, rk, cos, signed_sin, is_rope, INV_ROPE: tl.constexpr,
                ROPE_HOIST: tl.constexpr, HEAD: tl.constexpr, ROPE: tl.constexpr, BLOCK_K: tl.constexpr):
    """Block ``kb``'s activation rows [BM, BLOCK_K] bf16; the inverse RoPE applied as ROPE_HOIST says, except
    ROPE_PRELOAD, whose rope block (the split's last) the caller rotates (_rotate_rope_pairs)."""
    k = kb * BLOCK_K + rk
    mask = x_valid[:, None] & (k < k_stop)[None, :]
    if INV_ROPE and ROPE_HOIST == ROPE_FACTORS_HOISTED:
        x = _load_activation_hoisted(x_rows, k[None, :], mask, kb * BLOCK_K, cos, signed_sin, is_rope, HEAD, BLOCK_K)
    else:
        x = _load_activation(x_rows, freq_rows, k[None, :], mask, kb * BLOCK_K, INV_ROPE and ROPE_HOIST == 0, HEAD,
                             ROPE, BLOCK_K)
    return x


@triton.jit
def _register_barrier(w, INLINE_PTX: tl.constexpr):
    """``w`` (e4m3) as is, through an opaque move the compiler keeps in program order: the weight tile's copy into the
    MMA operand's shared-memory buffer stays at its own block (one buffer reused by every block, not one per block
    made right after the loads before the PDL wait). ptxas folds the moves. INLINE_PTX False: the CPU interpreter."""
    if not INLINE_PTX:
        return w
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w], dtype=tl.float8e4nv, is_pure=False, pack=4)


@triton.jit
def _one_shot_block(acc, w, w_scale, x, u: tl.constexpr, partner, cos, signed_sin, rope_mask,
                    LAST_ROTATED: tl.constexpr, INLINE_PTX: tl.constexpr):
    """acc + one 128-block's FP8 MMA: activation rows ``x`` split into joined hi / lo e4m3 columns, the product
    scaled per column. LAST_ROTATED: the last block is the split's rope block, rotated here from its preloaded
    ``partner`` and factors (its loads were issued blocks earlier). Block 0 (loaded before the PDL wait) passes its
    weight through _register_barrier."""
    if LAST_ROTATED and u == ONE_SHOT_BLOCKS - 1:
        x = _rotate_rope_pairs(x, partner, cos, signed_sin, rope_mask)
    if u == 0:
        w = _register_barrier(w, INLINE_PTX)
    q, x_scale = _split_activation_joined(x.to(tl.float32))
    return acc + tl.dot(w, tl.trans(q)) * (x_scale * w_scale)[None, :]


@triton.jit
def _rope_pair_factors(freq_rows, valid, ROPE: tl.constexpr, BLOCK_K: tl.constexpr):
    """GemvConfig.rope_pairs: the inverse RoPE's (cos, sin) per (re, im) pair of the split's rope block, [BM, BLOCK_K/2]
    (the head's last ROPE dims are the block's last ROPE / 2 pairs; other pairs: cos 1, sin 0)."""
    pair = tl.arange(0, BLOCK_K // 2)
    r = pair - (BLOCK_K - ROPE) // 2
    is_rope = r >= 0
    mask = valid[:, None] & is_rope[None, :]
    r = tl.where(is_rope, r, 0)
    cos = tl.load(freq_rows + 2 * r[None, :], mask=mask, other=1.0)
    sin = tl.load(freq_rows + 2 * r[None, :] + 1, mask=mask, other=0.0)
    return cos, sin


@triton.jit
def _rotate_rope_block_pairs(x, cos, sin, valid, ROPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """bf16 rope block ``x`` [BM, BLOCK_K] with its last ROPE columns rotated as _rotate_rope_pairs does (re' = re*c +
    im*s, im' = im*c + re*(-s), rounded to bf16), each (re, im) pair taken from the block itself in registers (no
    partner load)."""
    re, im = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_M, BLOCK_K // 2, 2)))
    is_rope = tl.arange(0, BLOCK_K // 2) >= (BLOCK_K - ROPE) // 2
    mask = valid[:, None] & is_rope[None, :]
    re2 = tl.where(mask, re * cos + im * sin, re)
    im2 = tl.where(mask, im * cos + re * (-sin), im)
    return tl.reshape(tl.join(re2, im2), (BLOCK_M, BLOCK_K)).to(tl.bfloat16)


@triton.jit
def _fp8mma_one_shot_item(x_ptr, w_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, pos_ptr, freqs_ptr,
                          n_positions, M, N, K,
                          stride_xm, stride_xg, stride_wg, stride_wn, stride_sg, stride_sn, stride_ym, stride_yg,
                          stride_freq, k_blocks_per_split, num_splits, tiles_per_group, pid, pid_k, pid_g,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          IS_SPLIT: tl.constexpr, INV_ROPE: tl.constexpr, HEAD: tl.constexpr,
                          ROPE: tl.constexpr, PDL: tl.constexpr, PDL_LATE_TRIGGER: tl.constexpr,
                          SPLIT_SUM_BATCH: tl.constexpr, ROPE_HOIST: tl.constexpr, INLINE_PTX: tl.constexpr,
                          ROPE_PAIRS: tl.constexpr):
    """_fp8mma_item's joined, unchained form as one program per split of ONE_SHOT_BLOCKS blocks, block 0's weight tile
    and scale (constants of the model) loaded into registers before the PDL wait: with PDL the weight stream starts
    while the previous kernel drains. After the wait: the activation loads of every block, then per block in order its
    weight load and its MMA. ROPE_PRELOAD: the split is one head, its last block the rope block; the position -> cos /
    sin gather is issued after block 0's MMA and the rotation done just before the last, off the other blocks' path."""
    tl.static_assert(BLOCK_K % BLOCK_N == 0)
    TWO_M: tl.constexpr = 2 * BLOCK_M
    LAST_ROTATED: tl.constexpr = INV_ROPE and ROPE_HOIST == ROPE_PRELOAD
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_m = pid // n_tiles
    pid_n = pid % n_tiles
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_mask = rn < N
    x_valid = rm < M
    x_rows = x_ptr + pid_g * stride_xg + rm[:, None] * stride_xm
    w_rows = w_ptr + pid_g * stride_wg + rn[:, None] * stride_wn  # [BN, 1]
    s_row = s_ptr + pid_g * stride_sg + (pid_n * BLOCK_N // BLOCK_K) * stride_sn
    kb0 = pid_k * k_blocks_per_split
    kb_end = tl.minimum(kb0 + k_blocks_per_split, tl.cdiv(K, BLOCK_K))
    k_stop = tl.minimum(kb_end * BLOCK_K, K)

    w0, ws0 = _one_shot_weight(w_rows, s_row, kb0, kb_end, k_stop, rk, n_mask, BLOCK_K)
    _pdl_wait(PDL)  # block 0's weight loads are in flight while the previous kernel drains

    freq_rows = freqs_ptr
    cos = tl.full((BLOCK_M, BLOCK_K), 1.0, tl.float32)
    signed_sin = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
    is_rope = rk[None, :] < 0
    rope_mask = x_valid[:, None] & is_rope
    partner = signed_sin
    if INV_ROPE:
        pos = tl.load(pos_ptr + rm, mask=x_valid, other=0)
        freq_rows = _freqs_row_clamped(freqs_ptr, pos[:, None], stride_freq, n_positions)
        if ROPE_HOIST == ROPE_FACTORS_HOISTED:
            cos, signed_sin, is_rope = _rope_chunk_factors(freq_rows, rk[None, :], x_valid[:, None], HEAD, ROPE,
                                                           BLOCK_K)
    x0 = _one_shot_x(x_rows, freq_rows, kb0, k_stop, x_valid, rk, cos, signed_sin, is_rope, INV_ROPE, ROPE_HOIST,
                     HEAD, ROPE, BLOCK_K)
    x1 = _one_shot_x(x_rows, freq_rows, kb0 + 1, k_stop, x_valid, rk, cos, signed_sin, is_rope, INV_ROPE, ROPE_HOIST,
                     HEAD, ROPE, BLOCK_K)
    x2 = _one_shot_x(x_rows, freq_rows, kb0 + 2, k_stop, x_valid, rk, cos, signed_sin, is_rope, INV_ROPE, ROPE_HOIST,
                     HEAD, ROPE, BLOCK_K)
    x3 = _one_shot_x(x_rows, freq_rows, kb0 + 3, k_stop, x_valid, rk, cos, signed_sin, is_rope, INV_ROPE, ROPE_HOIST,
                     HEAD, ROPE, BLOCK_K)
    if LAST_ROTATED and not ROPE_PAIRS:  # the rope block's pair partners: in flight with the other activation loads
        k_last = (kb_end - 1) * BLOCK_K + rk
        is_rope = rk >= BLOCK_K - ROPE  # the head's last ROPE dims (rope_preloadable)
        rope_mask = x_valid[:, None] & (is_rope & (k_last < k_stop))[None, :]
        partner = tl.load(x_rows + (k_last ^ 1)[None, :], mask=rope_mask, other=0.0).to(tl.float32)

    acc = tl.zeros((BLOCK_N, TWO_M), tl.float32)
    acc = _one_shot_block(acc, w0, ws0, x0, 0, partner, cos, signed_sin, rope_mask, LAST_ROTATED, INLINE_PTX)
    if LAST_ROTATED:  # the cos / sin gather, once the position has arrived; rotated at the last block
        if ROPE_PAIRS:
            pair_cos, pair_sin = _rope_pair_factors(freq_rows, x_valid, ROPE, BLOCK_K)
        else:
            cos, signed_sin, _ = _rope_chunk_factors(freq_rows, rk[None, :], x_valid[:, None], HEAD, ROPE, BLOCK_K)
    for u in tl.static_range(1, ONE_SHOT_BLOCKS):  # blocks 1..3: weight load, then MMA, in block order
        w, ws = _one_shot_weight(w_rows, s_row, kb0 + u, kb_end, k_stop, rk, n_mask, BLOCK_K)
        if u == 1:
            x = x1
        elif u == 2:
            x = x2
        else:
            x = x3
            if LAST_ROTATED and ROPE_PAIRS:  # after the last block's weight loads are issued
                x = _rotate_rope_block_pairs(x, pair_cos, pair_sin, x_valid, ROPE, BLOCK_M, BLOCK_K)
        acc = _one_shot_block(acc, w, ws, x, u, partner, cos, signed_sin, rope_mask, LAST_ROTATED and not ROPE_PAIRS,
                              INLINE_PTX)
    _pdl_launch_dependents(PDL and PDL_LATE_TRIGGER)
    row_in_table = x_valid
    if INV_ROPE:  # the positions again (L1), not kept live across the blocks: registers (see _freqs_row_clamped)
        row_in_table = _position_in_table(tl.load(pos_ptr + rm, mask=x_valid, other=0), n_positions)
    _fp8mma_store(acc, rm, rn, n_mask, M, N, y_ptr, stride_ym, stride_yg, partial_ptr, counter_ptr, pid, pid_k, pid_g,
                  num_splits, tiles_per_group, BLOCK_M, BLOCK_N, IS_SPLIT, SPLIT_SUM_BATCH, row_in_table, INV_ROPE)


# ----------------------------------------------------------------------------------------------
# launch configuration
# ----------------------------------------------------------------------------------------------


ROWS_FORM_BLOCK_M = (1, 2, 4, 8)
FP8_MMA_BLOCK_M = (8, 16)


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    block_m: int
    block_n: int
    split_k: int
    use_dot: bool
    num_warps: int = 4
    num_stages: int = 3
    k_unroll: int = 1  # 128-wide K blocks per loop iteration
    swap_ab: bool = False  # dot form: the weight is the MMA's A operand
    # rows form (_block_fp8_gemv_rows_kernel): block_m in (1, 2, 4, 8) rows share each dequantised
    # weight chunk on CUDA cores; use_dot must be False
    rows_form: bool = False
    prefetch: bool = False  # rows form: next chunk's weight load issued before this chunk's FMAs
    evict_first: bool = False  # rows form: weight loads marked evict-first in L2
    # rows form: activation loaded through a broadcast over the tile's columns, in the weight tile's
    # register layout (no per-row shared-memory conversion). Timed in H200 run 5
    # (benchmarks/fp8_gemv-h200-run5.summary.md): slower than the defaults on 47 of 48 points
    # (geomean 1.10x / 1.18x / 1.62x / 2.52x at 1 / 2 / 4 / 8 rows), so no default uses it.
    x_broadcast: bool = False
    # FP8 tensor-core form (_block_fp8_gemv_fp8mma_kernel): the e4m3 weight is the MMA's M side as
    # loaded, each activation row split in registers into two e4m3 terms (hi, lo); block_m in (8, 16)
    # rows make 16 / 32 MMA columns; use_dot must be True; k_unroll 128-wide blocks per loop iteration, each its
    # own MMA
    fp8_mma: bool = False
    fp8_join: bool = False  # fp8_mma: split each activation row once, hi and lo joined into the MMA columns
    # fp8_mma: chained MMAs (acc = dot(w, q^T, acc)), the weight scale folded into the activation, one
    # power-of-two activation scale per row and K split (pre-pass); joined or not; candidate, no default uses it
    fp8_chain: bool = False
    # programmatic dependent launch (any form): launched with the programmatic-serialisation attribute, each
    # program lets the next kernel launch at once and waits for the previous one only before its first
    # activation load (the rows form with prefetch issues its first weight chunk's load before the wait)
    pdl: bool = False
    pdl_l2_blocks: int = 0  # pdl: K blocks of the program's weight rows prefetched into L2 before the wait
    pdl_late: bool = False  # pdl: launch_dependents after the main loop instead of at the program's start
    # weight tiles fetched by TMA (a host-built descriptor over [G, N, K], box [1, block_n, tile K]) instead of
    # per-thread 16-byte loads / cp.async; the kernel's K loop pipelines the copies through num_stages
    # shared-memory buffers. Where a descriptor cannot be made (weight_tma_usable) the plain load runs.
    w_tma: bool = False
    # persistent form (not the rows form, not fp8_chain): a grid of SMs x this many programs, each looping over the
    # (tile, K split) work items pid, pid + nprog, ... with its K loop inside; without split-K the work-item loop is
    # flattened into the K loop (tl.range(flatten=True)) so the weight pipeline runs on from one item into the next.
    # 0: one program per work item. H200 runs 13 / 13b: see default_config.
    persistent_programs_per_sm: int = 0
    # FP8 tensor-core form, split-K epilogue: the last arriver loads this many partials per step (all in flight at
    # once) instead of one, summed in the same order (the same result). On the FMA / bf16-tile / rows forms (H200 run
    # 18 / 18b, since removed there) it was 0.94-1.04x, less than the one-chunk form won: no default would use it
    split_sum_batch: int = 1
    # rows form with prefetch: where a program's K split is one chunk (k_unroll blocks), its weight and scales are
    # loaded before the PDL wait and no next chunk is loaded (a longer split runs the prefetching loop as before)
    one_chunk: bool = False
    # fused inverse RoPE (not the rows form): each row's cos / sin loaded once per program before the K loop
    # (_rope_chunk_factors) and the rotation applied branch-free, where rope_hoistable holds for the chunk width;
    # elsewhere (and without RoPE) the form is unchanged
    rope_hoist: bool = False
    # FP8 tensor-core form with the fused inverse RoPE where every K split is one head (rope_preloadable): the split's
    # rotated rope block is loaded before the K loop and selected in it; elsewhere as rope_hoist
    rope_preload: bool = False
    # FP8 tensor-core one-shot program (joined, unchained, 1 stage, plain loads, not persistent, k_unroll
    # ONE_SHOT_BLOCKS): 1 = where a launch's K split is exactly k_unroll blocks, block 0's weight tile and scale are
    # loaded into registers before the PDL wait, the others in block order after it (_fp8mma_one_shot_item); 0: off;
    # elsewhere the form is unchanged (runs 19 / 20: more blocks before the wait lost)
    w_before_wait: int = 0
    # with rope_preload on the one-shot program (w_before_wait): the rope block rotated from its own (re, im) pairs in
    # registers (no partner load), cos / sin gathered per pair (half the factors); wo_a_config's fused-RoPE form at T=1
    # since run 21
    rope_pairs: bool = False
    # ptxas register cap per thread (Triton's maxnreg; 0: none): a program that fits the cap keeps one more program per
    # SM where its natural count would not (sm_90a: 128 registers x 4 warps = 4 programs per SM); ptxas spills what
    # does not fit to local memory
    max_registers: int = 0

    def __post_init__(self):
        if (self.rows_form and (self.use_dot or self.block_m not in ROWS_FORM_BLOCK_M or self.rope_hoist)) or (
                not self.rows_form and (self.prefetch or self.evict_first or self.x_broadcast)):
            raise ValueError(f"config: rows form needs use_dot=False and block_m in {ROWS_FORM_BLOCK_M} and has no "
                             f"rope_hoist; prefetch, evict_first and x_broadcast need the rows form; got {self}")
        if (self.fp8_mma and (not self.use_dot or self.rows_form or self.swap_ab
                              or self.block_m not in FP8_MMA_BLOCK_M or self.block_n < 16)) or (
                self.fp8_join and not self.fp8_mma) or (self.fp8_chain and not self.fp8_mma):
            raise ValueError(f"config: fp8_mma needs use_dot=True, no rows form / swap_ab, block_m in "
                             f"{FP8_MMA_BLOCK_M} and block_n >= 16; fp8_join needs fp8_mma; fp8_chain needs fp8_mma; "
                             f"got {self}")
        if self.pdl_l2_blocks < 0 or ((self.pdl_l2_blocks or self.pdl_late) and not self.pdl) or (
                self.pdl_l2_blocks & (self.pdl_l2_blocks - 1)):
            raise ValueError(f"config: pdl_l2_blocks (a power of two or 0) and pdl_late need pdl; got {self}")
        if self.w_tma and self.weight_tile_k > TMA_MAX_BOX:
            raise ValueError(f"config: w_tma needs a weight tile of at most {TMA_MAX_BOX} K columns (a TMA box "
                             f"dimension), got {self.weight_tile_k} ({self})")
        if self.persistent_programs_per_sm < 0 or (self.persistent_programs_per_sm and (
                self.rows_form or self.fp8_chain)):
            raise ValueError(f"config: persistent_programs_per_sm >= 0, and the persistent form excludes the rows "
                             f"form and fp8_chain; got {self}")
        if self.rope_preload and not self.fp8_mma:
            raise ValueError(f"config: rope_preload needs fp8_mma; got {self}")
        if self.split_sum_batch < 1 or (self.split_sum_batch > 1 and not self.fp8_mma):
            raise ValueError(f"config: split_sum_batch >= 1, and above 1 needs fp8_mma; got {self}")
        if self.one_chunk and not (self.rows_form and self.prefetch):
            raise ValueError(f"config: one_chunk needs the rows form with prefetch; got {self}")
        one_shot_fp8 = (self.fp8_mma and self.fp8_join and not self.fp8_chain and self.num_stages == 1
                        and not self.w_tma and not self.persistent_programs_per_sm
                        and self.k_unroll == ONE_SHOT_BLOCKS.value)
        if self.w_before_wait not in (0, 1) or (self.w_before_wait and not one_shot_fp8):
            raise ValueError(f"config: w_before_wait (0 or 1) needs the joined, unchained fp8_mma form with "
                             f"num_stages=1, no w_tma, not persistent, k_unroll {ONE_SHOT_BLOCKS.value}; got {self}")
        if self.rope_pairs and not (self.w_before_wait and self.rope_preload):
            raise ValueError(f"config: rope_pairs needs w_before_wait and rope_preload; got {self}")
        check_register_cap(f"config {self}: max_registers", self.max_registers)

    @property
    def weight_tile_k(self) -> int:
        """K columns of one weight tile load (the FP8 tensor-core form loads one 128-block at a time)."""
        return FP8_BLOCK if self.fp8_mma else FP8_BLOCK * self.k_unroll

    @property
    def name(self) -> str:
        if self.rows_form:
            kind = "rows"
        elif self.fp8_mma:
            kind = ("q8j" if self.fp8_join else "q8") + ("c" if self.fp8_chain else "")
        else:
            kind = ("dotT" if self.swap_ab else "dot") if self.use_dot else "fma"
        extra = ("_pf" if self.prefetch else "") + ("_ef" if self.evict_first else "") + ("_xb" if self.x_broadcast else "")
        extra += ("_pdl" if self.pdl else "") + (f"_l2p{self.pdl_l2_blocks}" if self.pdl_l2_blocks else "")
        extra += ("_late" if self.pdl_late else "") + ("_tma" if self.w_tma else "")
        if self.persistent_programs_per_sm:
            extra += f"_pp{self.persistent_programs_per_sm}"
        extra += (f"_sb{self.split_sum_batch}" if self.split_sum_batch > 1 else "") + ("_oc" if self.one_chunk else "")
        extra += ("_rh" if self.rope_hoist else "") + ("_rp" if self.rope_preload else "")
        extra += f"_ww{self.w_before_wait}" if self.w_before_wait else ""
        extra += ("_pairs" if self.rope_pairs else "") + (f"_r{self.max_registers}" if self.max_registers else "")
        return (f"{kind}_m{self.block_m}_n{self.block_n}_u{self.k_unroll}_s{self.split_k}_w{self.num_warps}"
                f"_st{self.num_stages}{extra}")


# Launch forms chosen from the H200 sweep (benchmarks/fp8_gemv-h200.md, -sweep.json; geometric
# mean over the seven linears at T = 1, 2, 4, 8): one row runs on CUDA-core FMAs two 128-blocks per
# iteration; 2 to 16 rows on tensor cores with 16-row, 32-column tiles; more rows with 32x64 tiles.
# Run 3 (fp8_gemv-h200-run3.summary.md) moved 2 rows and short-K single rows to the rows form (below);
# run 4 (fp8_gemv-h200-run4-dot.md: 3-6 stages, 64-col tiles, 2 warps, swapped operands) found no
# better tensor-core form for 4..16 rows (best variant geomean 1.01x). Run 5
# (fp8_gemv-h200-run5.summary.md: x_broadcast rows variants at 1..8 rows, T = 1 and 4) changed nothing.
FMA_MAX_ROWS = 1
FMA_BLOCK_N, FMA_K_UNROLL = 32, 2
DOT_BLOCK_N = 32
WIDE_BLOCK_M, WIDE_BLOCK_N = 32, 64
# Rows form (benchmarks/fp8_gemv-h200-run3.md, H200, weight copies rotated past L2): at 2 rows it
# beat the 16-row tensor-core tile on all 22 linear/T shapes (geomean 0.94x the time) with 32
# columns, 2 K blocks per iteration and no prefetch; at 4+ rows it lost everywhere (CUDA-core FMAs
# per row: instruction-bound), so 3..16 rows stay on the tensor-core form.
ROWS_FORM_ROWS = 2
ROWS_FORM_BLOCK_N, ROWS_FORM_K_UNROLL = 32, 2
# One-shot rows form at 1 row (same run): for K of 4..8 blocks and at most 4 (8-warp variant: 2)
# programs per SM of 16 columns, each program loads its whole K at once; 0.84-0.93x the FMA form's
# time on every such DSv4 shape ([4096|8192, 1024], [4096, 512]); larger N or K keep the FMA form.
ONE_SHOT_BLOCK_N = 16
ONE_SHOT_MIN_K_BLOCKS, ONE_SHOT_MAX_K_BLOCKS = 4, 8
ONE_SHOT_WIDE_PROGRAMS_PER_SM = 2
# FP8 tensor-core form with the joined activation split (GemvConfig(fp8_mma=True, fp8_join=True)), from the
# H200 runs 6 / 6b (benchmarks/fp8_gemv-h200-run6b.summary.md): faster than the forms above only on large
# weights at 2..8 rows; 0.82-0.91x the time at 3..8 rows on every weight of >= 16 MiB with K >= 4096
# (128 columns, 8 warps) and on wq_b at T=1 (32 MiB, K = 1024; 64 columns, 4 warps); 0.90-0.92x at 2 rows
# on the >= 32 MiB weights only (0.97-0.98x at 16 MiB: the rows form stays there). 1 row and 9+ rows (16-row
# tiles) were slower everywhere; so were smaller weights (e.g. wq_b at T=2, 16 MiB, K = 1024: 0.99-1.07x).
FP8_MMA_BLOCK_ROWS = 8  # activation rows per tile: 16 MMA columns (hi, lo)
FP8_MMA_MAX_ROWS = 8
FP8_MMA_MIN_WEIGHT_BYTES = 16 << 20  # 3..8 rows
FP8_MMA_TWO_ROW_MIN_WEIGHT_BYTES = 32 << 20  # 2 rows
FP8_MMA_WIDE_MIN_K = 4096  # K from which the 128-column 8-warp tile runs; below it, 32 MiB and 64 columns
# H200 run 10 (benchmarks/fp8_gemv-h200-run10-wide.summary.md), wo_a / wo_b at T=1 with PDL: 2 / 4 stages (1.04x /
# 1.28x the time), half the K split (1.10x), the hi/lo operand built by a broadcast instead of a join (1.19x) and
# wide-K tiles (several 128-blocks per MMA, 1.18-2.0x) all lost to this tile; that code is in commit 08ba7e9.
FP8_MMA_WIDE = dict(block_n=128, num_warps=8, num_stages=3)
FP8_MMA_NARROW = dict(block_n=64, num_warps=4, num_stages=3)
# Programs wanted per SM for full memory bandwidth; split-K raises small-N launches to this.
PROGRAMS_PER_SM = 4
# A split keeps at least this many 128-wide K blocks so its partial store stays small.
MIN_K_BLOCKS_PER_SPLIT = 4
# SM count assumed when no GPU is visible (interpreter, AOT): the H200's.
DEFAULT_SM_COUNT = 132
# TMA (GemvConfig.w_tma): a box dimension is at most 256 elements; sm_90 and sm_12x have the copy engine.
TMA_MAX_BOX = 256
TMA_MIN_CAPABILITY = 9


def weight_tma_usable(w3: torch.Tensor) -> bool:
    """Whether a TMA descriptor can be made over the weight ``w3 [G, N, K]`` (e4m3): a GPU with TMA (or the
    CPU interpreter), a 16-byte aligned base, contiguous K and 16-byte multiples as the other strides."""
    if w3.data_ptr() % 16 or w3.stride(-1) != 1 or any(st % 16 for st in w3.stride()[:-1]):
        return False
    if w3.device.type != "cuda":
        return has_capability(w3.device, TMA_MIN_CAPABILITY)  # the interpreter emulates TMA
    return capability_major(w3.device) >= TMA_MIN_CAPABILITY


def _weight_descriptor(w3: torch.Tensor, cfg: GemvConfig):
    """Host-side TMA descriptor over ``w3 [G, N, K]``, box [1, block_n, tile K]: a plain kernel parameter
    (the launcher encodes the tensor map from it; no device work, so graph capture records it as is)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(w3, [1, cfg.block_n, cfg.weight_tile_k])


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` can be launched with programmatic dependent launch."""
    if device.type != "cuda" or interpreter_enabled():
        return False
    return capability_major(device) >= PDL_MIN_CAPABILITY


def sm_count(device_index: int | None = None) -> int:
    """SM count of CUDA device ``device_index`` (None: the current device); DEFAULT_SM_COUNT without a GPU."""
    if not _cuda_available():
        return DEFAULT_SM_COUNT
    return _device_sm_count(torch.cuda.current_device() if device_index is None else device_index)


# A device's facts asked once per process (eager decode and prefill launch the GEMVs every step: the properties and
# capability queries were host time on every call). Keyed by device index, so a process that switches its current
# device gets each device's own answer.
@functools.lru_cache(maxsize=None)
def _cuda_available() -> bool:
    return torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def _device_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def clear_caches() -> None:
    """Forget the cached device facts and configs (tests that fake a device; a caller that changes a rule constant
    other than the USE_* switches, which are part of the config cache's key)."""
    for cached in (_cuda_available, _device_sm_count, _cached_default_config, _cached_wo_a_config):
        cached.cache_clear()
    _clear_capability_cache()  # the capability cache is kernels/pdl.py's, shared with the other kernels


def _cdiv(a: int, b: int) -> int:
    """Ceiling division on the host (triton.cdiv is a ConstexprFunction in Triton 3.8: about 2 us per call)."""
    return -(-a // b)


def choose_split(tiles: int, k_blocks: int, target_programs: int) -> int:
    """Largest power-of-two K split that keeps tiles*split <= target_programs and every split at
    least MIN_K_BLOCKS_PER_SPLIT blocks long."""
    split = 1
    while tiles * split * 2 <= target_programs and k_blocks // (split * 2) >= MIN_K_BLOCKS_PER_SPLIT:
        split *= 2
    return split


def _fp8_mma_config(m: int, n: int, k: int, groups: int, sms: int) -> GemvConfig | None:
    """The FP8 tensor-core form where the H200 runs measured it faster (see FP8_MMA_* above), else None."""
    weight_bytes = groups * n * k
    min_bytes = FP8_MMA_TWO_ROW_MIN_WEIGHT_BYTES if m == 2 else FP8_MMA_MIN_WEIGHT_BYTES
    if not 2 <= m <= FP8_MMA_MAX_ROWS or weight_bytes < min_bytes:
        return None
    if k >= FP8_MMA_WIDE_MIN_K:
        tile = FP8_MMA_WIDE
    elif weight_bytes >= FP8_MMA_TWO_ROW_MIN_WEIGHT_BYTES:
        tile = FP8_MMA_NARROW
    else:
        return None
    tiles = groups * _cdiv(n, tile["block_n"])
    split = choose_split(tiles, _cdiv(k, FP8_BLOCK), PROGRAMS_PER_SM * sms)
    return GemvConfig(FP8_MMA_BLOCK_ROWS, tile["block_n"], split, True, tile["num_warps"], tile["num_stages"],
                      fp8_mma=True, fp8_join=True)


# Programmatic dependent launch (GemvConfig.pdl), from H200 runs 8 and 9 (benchmarks/fp8_gemv-h200-run9-pdl.summary.md),
# GEMVs back to back in one CUDA graph (each the previous one's dependent), against the same form without PDL:
# * 1 row: launch_dependents at the program's start ("early"); the FMA form with 4 K blocks prefetched into L2
#   before the wait (0.70-0.92x the time), the one-shot rows forms without (0.64-0.80x);
# * 2 rows, rows form: on weights of at most 4 MiB the first weight chunk loaded before the wait, early trigger,
#   16 K blocks into L2 (0.80-0.91x); above, launch_dependents after the main loop ("late", 0.93-0.98x);
# * the 128-column FP8 tensor-core tile on weights of at least 32 MiB (wo_a, wo_b at T=1, 2..8 rows): early
#   (0.93-0.94x);
# * the 16-row bf16 tensor-core tile on weights of at most 4 MiB (3..16 rows): late, 4 K blocks into L2 (0.83-0.93x).
# Early triggers on the bf16 and 64-column FP8 tiles were up to 1.4x slower (run 8: the next kernels' waiting
# programs fill the SMs). After a kernel that never triggers its dependents (a plain torch op, run 9's mixed_us)
# every PDL form costs time: +0.08-0.49 us at 1 row, +0.13-0.28 us on the FP8 tile, +0.20-0.29 us (late) and
# +0.48-0.99 us (prefetching) at 2 rows, +0.23-0.56 us on the bf16 tile; the forms kept are those whose
# back-to-back gain is about as large or larger (all but shared_down T=8 at 2 rows: -0.53 against +0.99 us). Left out although faster back to back, because the mixed cost
# was larger than the gain: the bf16 tile late with L2 prefetch from 4 to 16 MiB (0.97-0.98x, +0.6-1.0 us mixed),
# late alone on wq_b's K = 1024 tiles at T=1/2 (0.97-0.98x, +0.2-0.25 us). USE_PDL = False makes default_config
# return launch_form.
USE_PDL = True
USE_TMA = True  # False: default_config / wo_a_config as before runs 11 / 11b (no TMA, no 64-column 1-row tiles)
PDL_FMA_L2_BLOCKS = 4
PDL_FP8_MMA_MIN_WEIGHT_BYTES = 32 << 20
PDL_TWO_ROW_PREFETCH_MAX_WEIGHT_BYTES = 4 << 20
PDL_TWO_ROW_PREFETCH_L2_BLOCKS = 16
PDL_DOT_MAX_WEIGHT_BYTES = 4 << 20
PDL_DOT_L2_BLOCKS = 4
PDL_MAX_ROWS = 16


def _with_pdl(cfg: GemvConfig, m: int, weight_bytes: int) -> GemvConfig:
    """``cfg`` launched with PDL where runs 8 and 9 measured that faster (see above), else ``cfg``."""
    replace = dataclasses.replace
    if m == 1 and not cfg.use_dot:
        return replace(cfg, pdl=True, pdl_l2_blocks=0 if cfg.rows_form else PDL_FMA_L2_BLOCKS)
    if m == 2 and cfg.rows_form:
        if weight_bytes <= PDL_TWO_ROW_PREFETCH_MAX_WEIGHT_BYTES:
            return replace(cfg, prefetch=True, pdl=True, pdl_l2_blocks=PDL_TWO_ROW_PREFETCH_L2_BLOCKS)
        return replace(cfg, pdl=True, pdl_late=True)
    if not cfg.use_dot or m > PDL_MAX_ROWS:
        return cfg
    if cfg.fp8_mma and cfg.block_n == FP8_MMA_WIDE["block_n"]:
        return replace(cfg, pdl=True) if weight_bytes >= PDL_FP8_MMA_MIN_WEIGHT_BYTES else cfg
    if not cfg.fp8_mma and weight_bytes <= PDL_DOT_MAX_WEIGHT_BYTES:
        return replace(cfg, pdl=True, pdl_late=True, pdl_l2_blocks=PDL_DOT_L2_BLOCKS)
    return cfg


# Weight tiles by TMA (GemvConfig.w_tma), from H200 runs 11 / 11b (benchmarks/fp8_gemv-h200-run11-tma-summary.md),
# each beside the default of the time in the same graph-timed harness:
# * 1 row on the 32 MiB weights with K >= 4096 (wo_a, wo_b at T=1): the FMA form on 64-column tiles by TMA, at the
#   32-column default's K split (half the programs): 0.955-0.958x the time in both runs (wo_a 11.46 vs 11.96 us).
#   The same tile lost on wq_b T=1 (K = 1024: 1.06x) and on every smaller weight (1.02-1.17x); the 32-column tile
#   by TMA lost everywhere (1.34-1.47x), and so did 64 columns with plain loads at these shapes (1.09x).
# * The FP8 tensor-core tile, the rows form and the 16-row bf16 tile by TMA: equal (0.99-1.01x) or slower; not used
#   without the fused RoPE.
# * wo_a with the fused inverse RoPE (wo_a_config): see there.
TMA_FMA_MIN_WEIGHT_BYTES = 32 << 20
TMA_FMA_MIN_K = 4096
TMA_FMA_BLOCK_N = 64
# Persistent forms (GemvConfig.persistent_programs_per_sm), H200 runs 13 / 13b
# (benchmarks/fp8_gemv-h200-run13-summary.md), each beside the default in the same graph-timed harness:
# * 1 row on a 32 MiB weight with K < 4096 and no K split (wq_b at T=1, [32768, 1024]): the 64-column FMA tile by
#   TMA on 2 programs per SM, its work-item loop flattened into the K loop: 10.84 / 10.87 us against 11.27 / 11.24
#   (0.962 / 0.967x in runs 13 / 13b). Not flattened it was 11.92 us, on 3 / 4 programs per SM 11.70 / 12.45.
# * With split-K (wo_a / wo_b T=1 at 1..8 rows, 1 / 2 / 4 programs per SM, 3-5 stages, by TMA or cp.async) every
#   persistent form lost: 1.06-2.3x with the split partials summed as in the other forms (a loop and a branch in the
#   epilogue, which keep the work-item loop from being flattened), 1.4-9.1x with a branch-free masked sum that let
#   it flatten (removed). wq_b at 2 / 8 rows (FP8 tile, no split): 1.03-4.9x.
PERSISTENT_FMA_MIN_WEIGHT_BYTES = 32 << 20
PERSISTENT_FMA_PROGRAMS_PER_SM = 2
# block_fp8_linear(share_sms=True): a GEMV another stream runs work beside (SGLang's C4 layers: the indexer's wq_b,
# query quantisation and logits on side streams while the main wq_b runs) keeps its persistent form on this many
# programs per SM. Two programs of 234 registers x 128 threads fill an SM's register file, so the indexer's kernels
# start only as they leave. H200 layer variants (benchmarks/bench-variants-h200-summary.md), T=1 B=1 C4 layer: run 5
# 125.57 vs 130.01 us (and 125.22 vs 130.30 in run 2); not persistent (130.86) or the rows form (131.90) lose (run 7).
# Alone the form is slower (C128 / SWA layers 0.948x / 0.983x in run 4), so only callers that share the SMs ask for it.
SHARED_PERSISTENT_PROGRAMS_PER_SM = 1
# Small weights at 1..2 rows, H200 runs 18 / 18b (benchmarks/fp8_gemv-h200-run18-summary.md): most of a small GEMV's
# time is fixed (a PDL chain of trivial kernels costs 1.1-1.45 us per call; the split-K partial store, ticket and
# last-arriver sum come on top). The rows form without split-K, each program's whole K one chunk whose weight and
# scales are loaded before the PDL wait (GemvConfig.one_chunk), leaves the activation load, the FMAs, one in-program
# reduction and the store after the wait. Tile by K: about 128 weight bytes per thread (64 at K = 256). Run 18b, every
# distinct DSv4 shape of <= 8 MiB at 1 / 2 rows against the default before it: 0.46-0.95x (wqkv_a 5.04 -> 4.64 us,
# shared_down T=1 5.15 -> 4.88, [512, 4096] 4.24 -> 1.95, [4096, 1024] 3.02 -> 2.48); except [8192, 1024] at 1 row,
# where the one-shot rows form that loads its K in two chunks stays (4.44 against 4.80 us), and wo_a with the fused
# RoPE at T=4 (wo_a_config). 16 MiB and more lost (run 18: shared_gate_up T=1 7.43 -> 9.81 us, 33.5 MiB 1.5-2x).
ONE_CHUNK_MAX_WEIGHT_BYTES = 8 << 20
# Measured and not shipped (stop 43, commit 77b75f4 has the rule): the one-chunk form on 4-row tiles at 3..8 rows.
# Alone, in a chain of the same GEMV, it was 0.74-0.96x the time at 3..4 rows on weights of <= 4 MiB and 0.88-0.98x
# at 5..8 rows on <= 2 MiB (H100 runs 43 / 43b, benchmarks/fp8_gemv-h100-run43.md); inside the bench's layers, where
# other streams run beside these GEMVs, the layers were slower with it: T=4 B=4 0.971-0.979x, T=8 B=4 0.89-0.91x
# (H100 layer variants runs 53 / 54, benchmarks/stop43-h100-summary.md). Its programs hold up to 255 registers.
ONE_CHUNK_MAX_ROWS = 2
# At 2 rows the one-chunk form takes weights of at most 4 MiB, not 8: runs 18 / 18b chose it from GEMVs alone, and
# inside the bench's layers (B=2, SGLang's streams) the 4-8 MiB weights' one-chunk programs (213-252 registers on
# sm_90a, their weight loaded before the PDL wait) cost the layer more than they save. H100 layer variants run 56
# (stop 43, benchmarks/stop43-h100-summary.md): with the limit at 4 MiB the SWA / C4 / C128 layers were 1.007 / 1.008 /
# 1.020x faster at T=1, 1.021 / 1.030 / 0.999x at T=4 and 1.011 / 1.010 / 1.001x at T=8 (the <= 4 MiB weights, most
# of T=8's, keep the form: without it at all the T=8 layers were 0.93-0.97x, runs 55 / 56); run 57 against the 8 MiB
# limit again: 1.003-1.031x at T = 1 / 4 / 8.
ONE_CHUNK_TWO_ROWS_MAX_WEIGHT_BYTES = 4 << 20
ONE_CHUNK_TILES = ((4096, 8, 8), (2048, 8, 4), (1024, 16, 4), (0, 32, 4))  # (from K, block_n, num_warps)
USE_ONE_CHUNK = True  # False: default_config as before runs 18 / 18b
# One-row one-chunk programs issue their activation load before converting the weight chunk they loaded before the
# PDL wait (the rows kernel's X_FIRST): in the loop form Triton hoisted the conversion, which waits for the weight,
# above the activation's load, so the two round trips ran one after the other (sm_90a / sm_120a SASS of wqkv_a's
# 1-row program). H200 layer variants run 33 (benchmarks/bench-variants-h200-summary.md): T=1 B=1 SWA / C4 / C128
# 1.016 / 1.000 / 1.016x, T=4 B=1 1.057-1.070x; wqkv_a in the layer 4.35-5.06 instead of 5.89-6.43 us. Two rows keep
# the loop form (X_FIRST spilled 20 B on sm_120a there). Also a rule switch (ONE_CHUNK_X_FIRST_ONE_ROW_TILES below);
# False: the forms and the order before.
ONE_CHUNK_X_FIRST = True


def one_chunk_x_first(cfg: GemvConfig) -> bool:
    """Whether the one-chunk program ``cfg`` launches with X_FIRST (ONE_CHUNK_X_FIRST, one row)."""
    return ONE_CHUNK_X_FIRST and cfg.one_chunk and cfg.block_m == 1


# wqkv_a ([Q_LORA_RANK + KV_LORA_RANK, HIDDEN_SIZE], the same at every T) at 1 row: 4 columns per program on 8 warps,
# 384 programs instead of 192 on the H200's 132 SMs. H200 layer variants run 8 (2026-12-03 15:45 UTC,
# benchmarks/bench-variants-h200-summary.md): SWA / C128 / C4 layers at T=1 and T=4, B=1, 1.004-1.013x faster; 4 columns
# on 4 warps 0.997-1.010x, 16 columns on 8 warps or 8 on 4 warps slower (0.974-0.996x). Other one-chunk shapes keep
# ONE_CHUNK_TILES (unmeasured in the layer).
ONE_CHUNK_ONE_ROW_TILES = {(Q_LORA_RANK + KV_LORA_RANK, HIDDEN_SIZE): (4, 8)}
# With X_FIRST (ONE_CHUNK_X_FIRST) the one-chunk form also takes [8192, 1024] at 1 row (the indexer's wq_b at T=1,
# the main wq_b at T=4), where the two-chunk rows form was faster before (run 18b), on 8 columns and 4 warps. H200
# layer variants run 35 (benchmarks/bench-variants-h200-summary.md), against the two-chunk form: C4 T=1 B=1 1.031x;
# T=4 B=1 SWA / C4 / C128 1.016 / 1.017 / 1.014x (16 columns on 4 warps: 1.032x at T=1, 1.006-1.008x at T=4).
# The main wq_b at T=1 ([32768, 1024], 33.5 MB, over ONE_CHUNK_MAX_WEIGHT_BYTES) on 16 columns and 4 warps: layer
# variants run 37 against the persistent FMA form by TMA, SWA / C128 T=1 B=1 1.014 / 1.016x (runs 39 / 41 / 43 with it
# shipped: 1.010-1.014x); in the C4 layer, where the call shares the SMs with the indexer's streams, 0.983x, so there
# (block_fp8_linear(share_sms=True), sharing_default_config) the persistent form stays. Alone, in a chain of the same
# GEMV, the persistent form is the faster one (run 42b: 10.86 against 11.71 us).
ONE_CHUNK_X_FIRST_ONE_ROW_TILES = {(INDEX_N_HEADS * INDEX_HEAD_DIM, Q_LORA_RANK): (8, 4),
                                   (NUM_HEADS * HEAD_DIM, Q_LORA_RANK): (16, 4)}


# One-row calls launched without PDL: the shared expert's down projection at T=4 ([4096, 512], a shape no other DSv4
# linear has at any T), which SGLang's decode runs on the shared expert's stream beside the router's chain. With the
# router gate's weight loaded before its PDL wait (bf16_gemv.USE_W_BEFORE_WAIT) that chain got shorter, the routed
# experts' gate/up came to run beside this GEMV (14.9 instead of 9.4 us in run 40's trace) and the T=4 B=1 layers lost
# 1.5-2.9 %. Launched without PDL (its programs take no SM slot before the SwiGLU has finished), the T=4 B=1 layers
# were 1.031-1.049x (H200 variants run 40), 1.05-1.08x (run 41) and 1.035-1.041x (run 43) faster than with it; why is
# not established (in run 43's trace the routed gate/up still took 14.7 us beside it). T=1, another shape: level.
ONE_ROW_WITHOUT_PDL = frozenset({(HIDDEN_SIZE, SHARED_EXPERT_INTERMEDIATE // 4)})


def one_chunk_form(block_m: int, block_n: int, num_warps: int, k_blocks: int) -> GemvConfig:
    """The one-chunk rows form (GemvConfig.one_chunk, with PDL) on ``block_m`` rows x ``block_n`` columns, a whole
    K of ``k_blocks`` blocks per program (no K split)."""
    return GemvConfig(block_m, block_n, 1, False, num_warps=num_warps, k_unroll=k_blocks, rows_form=True,
                      prefetch=True, one_chunk=True, pdl=True)


def _one_chunk_config(m: int, n: int, k: int, groups: int, form: GemvConfig, x_first: bool,
                      beside_other_streams: bool = False) -> GemvConfig | None:
    """The one-chunk rows form where runs 18 / 18b (and, with ``x_first``, variants runs 35 / 37) measured it faster
    (see ONE_CHUNK_* above), else None; ``form``: launch_form's pick for the same call. ``beside_other_streams``: the
    call shares the SMs with other streams' work, where weights over ONE_CHUNK_MAX_WEIGHT_BYTES keep their form."""
    k_blocks = _cdiv(k, FP8_BLOCK)
    x_first_tile = ONE_CHUNK_X_FIRST_ONE_ROW_TILES.get((n, k)) if x_first and m == 1 and groups == 1 else None
    large = groups * n * k > ONE_CHUNK_MAX_WEIGHT_BYTES
    if large and (x_first_tile is None or beside_other_streams):
        return None
    if (m > ONE_CHUNK_MAX_ROWS or k_blocks & (k_blocks - 1)
            or (m == 2 and groups * n * k > ONE_CHUNK_TWO_ROWS_MAX_WEIGHT_BYTES)
            or (m == 1 and form.rows_form and form.k_unroll < k_blocks and x_first_tile is None)):
        return None
    block_n, warps = next((bn, w) for min_k, bn, w in ONE_CHUNK_TILES if k >= min_k)
    if m == 1 and groups == 1:
        block_n, warps = x_first_tile or ONE_CHUNK_ONE_ROW_TILES.get((n, k), (block_n, warps))
    return one_chunk_form(m, block_n, warps, k_blocks)


class Rules(NamedTuple):
    """The module's rule switches (USE_PDL, USE_TMA, USE_ONE_CHUNK, USE_W_BEFORE_WAIT, USE_WO_A_ROPE_PAIRS,
    ONE_CHUNK_X_FIRST) as one value: part of the config cache's key, so that setting a switch (the seam's PDL setting,
    the device tools' forms before a run) takes effect on the next call."""
    pdl: bool
    tma: bool
    one_chunk: bool
    w_before_wait: bool
    wo_a_rope_pairs: bool
    x_first: bool


def rules() -> Rules:
    return Rules(USE_PDL, USE_TMA, USE_ONE_CHUNK, USE_W_BEFORE_WAIT, USE_WO_A_ROPE_PAIRS, ONE_CHUNK_X_FIRST)


# Configs cached per (shape, SM count, rules): default_config / wo_a_config are pure functions of those, and eager
# decode and prefill ask for one on every call (on the 2-core development CPU 13-43 us per call before the cache,
# 0.5-1 us with it). The bound only keeps a caller with unboundedly many row counts from growing it without end.
CONFIG_CACHE_SIZE = 4096


def default_config(m: int, n: int, k: int, groups: int = 1, sms: int | None = None) -> GemvConfig:
    """The launch configuration for ``m`` rows of an ``[n, k]`` weight (``groups`` of them) on ``sms`` SMs (None: the
    current device's, sm_count()), under the module's rules (USE_*); cached."""
    return _cached_default_config(m, n, k, groups, sm_count() if sms is None else sms, rules())


def pick_default_config(m: int, n: int, k: int, groups: int, sms: int, rule: Rules,
                        beside_other_streams: bool = False) -> GemvConfig:
    """default_config (``beside_other_streams``: sharing_default_config's rule, before sharing_config) without the
    cache."""
    return _default_config(m, n, k, groups, sms, rule, rule.one_chunk, beside_other_streams)


_cached_default_config = functools.lru_cache(maxsize=CONFIG_CACHE_SIZE)(pick_default_config)


def sharing_default_config(m: int, n: int, k: int, groups: int = 1, sms: int | None = None) -> GemvConfig:
    """The launch configuration for a call that shares the SMs with other streams' work (block_fp8_linear(share_sms=
    True)): default_config's, except that a weight over ONE_CHUNK_MAX_WEIGHT_BYTES keeps the rule's form before the
    one-chunk tiles (the main wq_b at T=1: the persistent form, variants run 37), then sharing_config."""
    cfg = default_config(m, n, k, groups, sms)
    if _beside_streams_keeps_its_form(cfg, groups * n * k):
        cfg = _cached_default_config(m, n, k, groups, sm_count() if sms is None else sms, rules(), True)
    return sharing_config(cfg)


def _beside_streams_keeps_its_form(cfg: GemvConfig, weight_bytes: int) -> bool:
    """Whether a call beside other streams takes the rule's form before the one-chunk tiles instead of ``cfg``."""
    return cfg.one_chunk and weight_bytes > ONE_CHUNK_MAX_WEIGHT_BYTES


def _default_config(m: int, n: int, k: int, groups: int, sms: int, rule: Rules, one_chunk_rule: bool,
                    beside_other_streams: bool = False) -> GemvConfig:
    form = _launch_form(m, n, k, groups, sms)
    if not rule.pdl:
        return form
    one_chunk = (_one_chunk_config(m, n, k, groups, form, rule.x_first, beside_other_streams) if one_chunk_rule
                 else None)
    if one_chunk is not None:
        return _launch_pdl(one_chunk, m, n, k, groups)
    cfg = _with_pdl(form, m, groups * n * k)
    if (rule.tma and m == 1 and not cfg.use_dot and not cfg.rows_form and k >= TMA_FMA_MIN_K
            and groups * n * k >= TMA_FMA_MIN_WEIGHT_BYTES):
        cfg = dataclasses.replace(cfg, block_n=TMA_FMA_BLOCK_N, w_tma=True)
    elif (rule.tma and m == 1 and not cfg.use_dot and not cfg.rows_form and cfg.split_k == 1
          and groups * n * k >= PERSISTENT_FMA_MIN_WEIGHT_BYTES):
        cfg = dataclasses.replace(cfg, block_n=TMA_FMA_BLOCK_N, w_tma=True,
                                  persistent_programs_per_sm=PERSISTENT_FMA_PROGRAMS_PER_SM)
    elif rule.w_before_wait and _one_shot_split(cfg, k):
        cfg = dataclasses.replace(cfg, w_before_wait=ONE_SHOT_W_BEFORE_WAIT, **WO_A_ONE_SHOT)
    return cfg


def _launch_pdl(cfg: GemvConfig, m: int, n: int, k: int, groups: int) -> GemvConfig:
    """``cfg`` launched without PDL where ONE_ROW_WITHOUT_PDL lists the one-row shape."""
    if m == 1 and groups == 1 and (n, k) in ONE_ROW_WITHOUT_PDL and cfg.pdl:
        return dataclasses.replace(cfg, pdl=False, pdl_l2_blocks=0, pdl_late=False)
    return cfg


def _one_shot_split(cfg: GemvConfig, k: int) -> bool:
    """Whether ``cfg`` is the 128-column FP8 tile with PDL at a K split of WO_A_ONE_SHOT_K_BLOCKS blocks, where the
    one-shot program (WO_A_ONE_SHOT) was measured (wo_a / wo_b at T=1, 2..8 rows)."""
    return (cfg.fp8_mma and cfg.pdl and cfg.block_n == FP8_MMA_WIDE["block_n"] and cfg.split_k > 1
            and _cdiv(k, FP8_BLOCK) == WO_A_ONE_SHOT_K_BLOCKS * cfg.split_k)


# wo_a with the fused inverse RoPE (grouped_fp8_wo_a with positions), H200 runs 11 / 11b, against default_config's
# form with the same fused RoPE:
# * 1 row, weights of 8 MiB and more (T = 1 / 2 / 4): the FMA form on 64-column tiles with plain loads at the same K
#   split, 13.45 / 8.12 / 5.70 us against 17.91 / 11.24 / 7.40 (0.75 / 0.72 / 0.77x; the 32-column tile spends
#   6 us on the RoPE at T=1, the 64-column one 0.4 us). By TMA it was slower (20.87 us at T=1). T=8 (4 MiB): 5.16
#   against 4.76 us, so the default stays.
# * 2..8 rows on the 128-column FP8 tile with PDL (T=1): the same tile by TMA, 15.73 / 15.76 / 15.91 / 16.39 us
#   at 2 / 3 / 4 / 8 rows against 19.65 / 19.73 / 19.90 / 20.55 (0.80x; run 11 alike at 2 and 8 rows). 5..7 rows
#   run the same 8-row tile and grid (not timed). Without the RoPE the TMA tile is equal (13.65 vs 13.67 us).
#   At T=2 (the same tile without PDL) it was equal with the RoPE too (0.99-1.00x): not used there.
WO_A_ROPE_FMA_MIN_WEIGHT_BYTES = 8 << 20
# wo_a at T=1, 2..8 rows on the 128-column FP8 tile with PDL (32 MiB), H200 runs 15 / 15b
# (benchmarks/fp8_gemv-h200-run15-summary.md), each beside the default in the same graph-timed harness:
# * with the fused inverse RoPE: the tile by TMA on 4 warps instead of 8, 15.12 / 15.37 / 16.23 us at 2 / 4 / 8 rows
#   against 16.14 / 16.29 / 16.76 by TMA on 8 warps (0.937 / 0.943 / 0.968x, run 15b);
# * without it, at 2..4 rows: one iteration per program (its 4 K blocks loaded at once into registers, no pipeline)
#   on 4 warps, the last arriver loading all 8 split partials in one step: 12.88 / 13.04 us at 2 / 4 rows against
#   13.54 / 13.60 (0.951 / 0.959x, run 15b; without the batched sum 0.972-0.978x in runs 15 and 15b). At 8 rows it
#   was 0.982x (13.57 vs 13.82 us): under the 2 % bar, so 5..8 rows keep default_config's form.
WO_A_ROPE_FP8_MMA_WARPS = 4
# wo_a with the fused inverse RoPE, H200 runs 17 / 17b (benchmarks/fp8_gemv-h200-run17-summary.md), each beside the
# forms above in the same graph-timed harness (copy 4246.2 / 4129.1 GB/s):
# * the RoPE cost was latency, not arithmetic: a rope block's activation, partner and cos / sin loads (cos / sin after
#   the position load) ran inside the K loop, where nothing else hides them. Hoisting the cos / sin out of the loop
#   (GemvConfig.rope_hoist) and, where a K split is one head (wo_a at split 8), rotating the split's rope block before
#   the loop (rope_preload) take them off the loop's path;
# * 1 row, T=1: the plain form (64-column FMA tile by TMA) with hoisted factors, 12.39 / 12.39 us against 13.39 / 13.42
#   for the 64-column tile with plain loads (0.925 / 0.923x; by TMA without hoisting 19.61 / 20.48);
# * 2..8 rows, T=1: the one-shot program of the plain form (WO_A_ONE_SHOT) with the rope block preloaded, 13.55 / 13.80
#   / 14.68 us at 2 / 4 / 8 rows against 15.09 / 15.27 / 16.12 for the 4-warp TMA tile (run 17b: 0.898 / 0.904 /
#   0.911x); the one-shot with hoisted factors only was 19.1-20.6 us, the TMA tile with them 14.7-16.1. 3 and 5..7 rows
#   run the same 8-row tile and grid (not timed);
# * T=2 (the 8-warp FP8 tile without PDL, 3..8 rows): the rope block preloaded, 11.54 / 11.79 us at 4 / 8 rows against
#   11.85 / 12.19 (0.974 / 0.967x). The dense seam fuses the RoPE at T=2 only at 1..2 rows (rows / FMA forms).
WO_A_ONE_SHOT_MAX_ROWS = 4  # run 15b's plain one-shot (before run 19; USE_W_BEFORE_WAIT = False)
WO_A_ONE_SHOT_K_BLOCKS = ONE_SHOT_BLOCKS.value  # K blocks per split where the one-shot was measured (K 4096, split 8)
WO_A_ONE_SHOT = dict(num_warps=4, k_unroll=WO_A_ONE_SHOT_K_BLOCKS, num_stages=1, split_sum_batch=8)
# The one-shot program with its first block's weight tile and scale loaded before the PDL wait
# (GemvConfig.w_before_wait = 1), H200 run 19 (benchmarks/fp8_gemv-h200-run19-summary.md, copy 4139.6 GB/s, T=1),
# each beside the default of the time in the same graph-timed harness: without the RoPE, wo_a (split 8) 11.60 / 11.80
# / 12.44 us at 2 / 4 / 8 rows against 12.84 / 13.00 / 13.82, wo_b (split 16) 11.96 / 12.93 at 2 / 8 rows against
# 14.01 / 14.20 (0.85-0.91x); 3 and 5..7 rows run the same tile and grid (not timed). At 1 row the FMA tile stays
# (wo_a 11.38 against 11.53, under the 2 % bar; wo_b 11.84 against 11.63). 2 and 4 blocks before the wait lost by
# 3-4.5 us (sm_90a: 149-217 registers, under 4 programs per SM: 512 programs take two waves), as did 64-column tiles
# (1024 programs) and 8 warps; wq_b's 64-column program over 8 blocks lost at every count (14.56-16.18 us against
# 10.92 / 13.54 at 1 / 8 rows).
USE_W_BEFORE_WAIT = True  # False: default_config / wo_a_config as before run 19
ONE_SHOT_W_BEFORE_WAIT = 1
# With the fused RoPE, H200 runs 19 / 20 / 21 (benchmarks/fp8_gemv-h200-run20-summary.md, -run21-summary.md, T=1):
# that program with the rope block preloaded took 144 registers on sm_90a (Triton 3.6), two waves of 512 programs,
# 16.82 / 17.19 / 17.45 us at 2 / 4 / 8 rows (run 20; 12.95 / 13.39 / 14.05 when capped at 128 registers, with
# spills). With the rope block rotated from its own (re, im) pairs (GemvConfig.rope_pairs: no partner load, 128
# registers on sm_90a and 140 on sm_120a uncapped, no spills) it is the default at 1..8 rows: run 21 (copy 4209.5 GB/s)
# 11.78 / 11.99 / 12.41 / 12.88 us at 1 / 2 / 4 / 8 rows against the defaults before it, 12.40 (the FMA tile, RoPE
# factors hoisted) / 12.89 / 13.38 / 13.97 (the capped program): 0.92-0.95x. At 1 row the one-shot tile of 2 rows runs.
WO_A_ROPE_W_BEFORE_WAIT = 1
USE_WO_A_ROPE_PAIRS = True  # False: the forms before run 21 (the FMA tile at 1 row; 2..8 rows uncapped, no pairs)


def _wo_a_one_shot(cfg: GemvConfig, d: int) -> bool:
    """Whether ``cfg`` is the 128-column FP8 tile with PDL whose K splits are one-shot blocks of wo_a's K ``d``."""
    wide_pdl_tile = cfg.fp8_mma and cfg.pdl and cfg.block_n == FP8_MMA_WIDE["block_n"]
    return wide_pdl_tile and cfg.split_k > 1 and _cdiv(d, FP8_BLOCK) == WO_A_ONE_SHOT_K_BLOCKS * cfg.split_k


def wo_a_config(b: int, r: int, d: int, groups: int, fused_rope: bool, sms: int | None = None) -> GemvConfig:
    """The launch configuration of grouped_fp8_wo_a: default_config's, or the forms measured faster for wo_a
    (above): with the fused inverse RoPE, and on the 128-column FP8 tile at T=1. ``sms``, rules, cache: as
    default_config."""
    return _cached_wo_a_config(b, r, d, groups, fused_rope, sm_count() if sms is None else sms, rules())


def pick_wo_a_config(b: int, r: int, d: int, groups: int, fused_rope: bool, sms: int, rule: Rules) -> GemvConfig:
    """wo_a_config without the cache."""
    cfg = _pick_wo_a_form(b, r, d, groups, fused_rope, sms, rule)
    k_steps = _cdiv(d, FP8_BLOCK * cfg.k_unroll)
    if fused_rope and cfg.rows_form and not cfg.one_chunk and cfg.split_k == 1 and k_steps > 1:
        # The rows form with the fused RoPE and no K split spills on sm_120a / sm_121a (128 registers and 8 bytes;
        # split, the same tile takes 127 and none). Only a GPU of fewer than 64 SMs gets it (DGX Spark's GB10 at T=2,
        # 2 rows): it runs the split form, which 64-127 SMs pick anyway, at 2 splits.
        cfg = dataclasses.replace(cfg, split_k=2)
    return cfg


def _pick_wo_a_form(b: int, r: int, d: int, groups: int, fused_rope: bool, sms: int, rule: Rules) -> GemvConfig:
    cfg = pick_default_config(b, r, d, groups, sms, rule)
    if fused_rope and cfg.one_chunk and groups * r * d >= WO_A_ROPE_FMA_MIN_WEIGHT_BYTES:
        # run 18b, T=4 (8 MiB): the one-chunk form's RoPE (the branch form over the whole K) made it 6.43 / 9.16 us at
        # 1 / 2 rows against 5.67 / 8.02 for the forms before; at T=8 (4 MiB) it won with the RoPE too (3.29 / 4.67
        # against 4.70 / 6.12)
        cfg = _default_config(b, r, d, groups, sms, rule, one_chunk_rule=False)
    wide_pdl_tile = cfg.fp8_mma and cfg.pdl and cfg.block_n == FP8_MMA_WIDE["block_n"]
    one_shot = _wo_a_one_shot(cfg, d)
    if fused_rope and b == 1 and rule.wo_a_rope_pairs and rule.w_before_wait:
        # run 21: at 1 row too, the 2-row one-shot tile with rope pairs
        two_rows = pick_default_config(2, r, d, groups, sms, rule)
        if _wo_a_one_shot(two_rows, d):
            cfg, wide_pdl_tile, one_shot = two_rows, True, True
    if not fused_rope:
        if one_shot and not rule.w_before_wait and b <= WO_A_ONE_SHOT_MAX_ROWS:  # run 15b's one-shot, before run 19
            return dataclasses.replace(cfg, **WO_A_ONE_SHOT)
        return cfg  # run 19: default_config's one-shot program with its first block before the wait
    # runs 17 / 17b: the one-shot program (2..8 rows) and the FP8 tile without PDL (T=2) with the rope block preloaded
    if one_shot:
        pre = WO_A_ROPE_W_BEFORE_WAIT if rule.w_before_wait else 0
        return dataclasses.replace(cfg, rope_preload=True, w_before_wait=pre,
                                   rope_pairs=bool(pre) and rule.wo_a_rope_pairs, **WO_A_ONE_SHOT)
    if cfg.fp8_mma and not cfg.pdl:
        return dataclasses.replace(cfg, rope_preload=True)
    if not rule.tma:
        return cfg
    weight_bytes = groups * r * d
    if b == 1 and not cfg.use_dot and not cfg.rows_form and weight_bytes >= WO_A_ROPE_FMA_MIN_WEIGHT_BYTES:
        if cfg.w_tma:  # T=1: default_config's 64-column tile by TMA, the RoPE factors hoisted (runs 17 / 17b)
            return dataclasses.replace(cfg, rope_hoist=True)
        return dataclasses.replace(cfg, block_n=TMA_FMA_BLOCK_N, w_tma=False)
    if wide_pdl_tile:
        return dataclasses.replace(cfg, w_tma=True, num_warps=WO_A_ROPE_FP8_MMA_WARPS)
    return cfg


_cached_wo_a_config = functools.lru_cache(maxsize=CONFIG_CACHE_SIZE)(pick_wo_a_config)


def launch_form(m: int, n: int, k: int, groups: int = 1, sms: int | None = None) -> GemvConfig:
    """default_config without programmatic dependent launch (the launch form before H200 run 8)."""
    return _launch_form(m, n, k, groups, sm_count() if sms is None else sms)


def _launch_form(m: int, n: int, k: int, groups: int, sms: int) -> GemvConfig:
    k_blocks = _cdiv(k, FP8_BLOCK)
    fp8_mma = _fp8_mma_config(m, n, k, groups, sms)
    if fp8_mma is not None:
        return fp8_mma
    if m == 1 and ONE_SHOT_MIN_K_BLOCKS <= k_blocks <= ONE_SHOT_MAX_K_BLOCKS:
        # few, short rows of weight (DSv4's K = 512 / 1024 linears at N <= 8192): one program per
        # 16 columns with its whole K in flight at once beats the looping FMA form
        tiles = groups * _cdiv(n, ONE_SHOT_BLOCK_N)
        if k_blocks == ONE_SHOT_MAX_K_BLOCKS and tiles <= ONE_SHOT_WIDE_PROGRAMS_PER_SM * sms:
            return GemvConfig(1, ONE_SHOT_BLOCK_N, 1, False, num_warps=8, k_unroll=k_blocks, rows_form=True,
                              prefetch=True)
        if tiles <= PROGRAMS_PER_SM * sms:
            return GemvConfig(1, ONE_SHOT_BLOCK_N, 1, False, k_unroll=ONE_SHOT_MIN_K_BLOCKS, rows_form=True,
                              prefetch=True, evict_first=True)
    if m == ROWS_FORM_ROWS:
        tiles = groups * _cdiv(n, ROWS_FORM_BLOCK_N)
        split = choose_split(tiles, k_blocks, PROGRAMS_PER_SM * sms)
        return GemvConfig(ROWS_FORM_ROWS, ROWS_FORM_BLOCK_N, split, False, k_unroll=ROWS_FORM_K_UNROLL,
                          rows_form=True)
    unroll = 1
    if m <= FMA_MAX_ROWS:
        block_m, block_n, use_dot, unroll = 1, FMA_BLOCK_N, False, FMA_K_UNROLL
    elif m <= 16:
        block_m, block_n, use_dot = 16, DOT_BLOCK_N, True
    else:
        block_m, block_n, use_dot = WIDE_BLOCK_M, WIDE_BLOCK_N, True
    tiles = groups * _cdiv(n, block_n) * _cdiv(m, block_m)
    split = choose_split(tiles, _cdiv(k, FP8_BLOCK), PROGRAMS_PER_SM * sms)
    return GemvConfig(block_m, block_n, split, use_dot, k_unroll=unroll)


# ----------------------------------------------------------------------------------------------
# validation and launch
# ----------------------------------------------------------------------------------------------


def _check(cond: bool, name: str, expected: str, got) -> None:
    """ValueError unless ``cond``; a tensor ``got`` is described (_describe) only then: building the descriptions of
    every argument on every call was host time for nothing."""
    if not cond:
        raise ValueError(f"{name}: expected {expected}, got {_describe(got) if isinstance(got, torch.Tensor) else got}")


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)} {t.dtype} on {t.device} strides {t.stride()}"


_counter_cache: dict = {}


def _split_counters(weight: torch.Tensor, tiles: int) -> torch.Tensor:
    """Zeroed int32 counters owned by one weight (one launch site), so split-K launches of different
    weights on different streams never share a counter. The kernel leaves them at zero."""
    key = (weight.device, weight.untyped_storage().data_ptr(), weight.data_ptr())
    buf = _counter_cache.get(key)
    if buf is None or buf.numel() < tiles:
        if tiles > _MAX_COUNTERS:
            raise ValueError(f"split-K tile count {tiles} exceeds {_MAX_COUNTERS}")
        buf = torch.zeros(max(tiles, 256), dtype=torch.int32, device=weight.device)
        _counter_cache[key] = buf
    return buf


_freqs_poison_cache: dict = {}


def _freqs_poison_row(freqs: torch.Tensor) -> torch.Tensor:
    """A NaN row as wide as a freqs row, read by the fused inverse RoPE in place of the row of a position outside
    the table (_freqs_row). One per device and width, allocated on first use (before graph capture, as the
    counters are)."""
    key = (freqs.device, freqs.shape[1])
    row = _freqs_poison_cache.get(key)
    if row is None:
        row = torch.full((freqs.shape[1],), float("nan"), dtype=torch.float32, device=freqs.device)
        _freqs_poison_cache[key] = row
    return row


def launch_grid(m: int, n: int, k: int, groups: int, cfg: GemvConfig, sms: int) -> tuple[tuple, int, int]:
    """(grid, K splits, K blocks per split) of ``cfg`` on [m, K] x [groups, n, k] on a GPU of ``sms`` SMs (only a
    persistent grid depends on it): whole iterations per split and no empty split; a persistent grid at most one
    program per work item. From the shapes only (graph-capturable)."""
    m_tiles = _cdiv(m, cfg.block_m)
    n_tiles = _cdiv(n, cfg.block_n)
    k_blocks = _cdiv(k, FP8_BLOCK)
    split = max(1, min(cfg.split_k, k_blocks))
    per_split = _cdiv(_cdiv(k_blocks, split), cfg.k_unroll) * cfg.k_unroll
    split = _cdiv(k_blocks, per_split)
    if cfg.persistent_programs_per_sm:  # never the rows form (GemvConfig rejects it)
        return (min(m_tiles * n_tiles * split * groups, sms * cfg.persistent_programs_per_sm),), split, per_split
    return (m_tiles * n_tiles, split, groups), split, per_split


def _launch(x3, w3, s3, y3, m, n, k, groups, cfg, positions=None, freqs=None, head_dim=HEAD_DIM,
            rope_dim=ROPE_DIM):
    """x3 [M, G, K] view, w3 [G, N, K], s3 [G, N/128, K/128], y3 [M, G, N]; all strided views."""
    m_tiles = _cdiv(m, cfg.block_m)
    n_tiles = _cdiv(n, cfg.block_n)
    sms = (sm_count(x3.device.index) if cfg.persistent_programs_per_sm and x3.device.type == "cuda"
           else DEFAULT_SM_COUNT)
    grid, split, per_split = launch_grid(m, n, k, groups, cfg, sms)
    persistent_args = {}
    if cfg.persistent_programs_per_sm:
        persistent_args = dict(PERSISTENT=True, FLATTEN=split == 1)
    if split > 1:
        partial = torch.empty((groups, split, m, n), dtype=torch.float32, device=x3.device)
        counters = _split_counters(w3, groups * m_tiles * n_tiles)
    else:
        partial = counters = y3  # unused
    inv_rope = positions is not None
    pos = positions if inv_rope else y3
    # the interpreter has no inline PTX (the PDL instructions), and GPUs before sm_90 have no griddepcontrol:
    # the same program order runs without them
    pdl = cfg.pdl and pdl_supported(x3.device)
    launch_args = dict(PDL=pdl, L2_PREFETCH_BLOCKS=cfg.pdl_l2_blocks if pdl else 0, PDL_LATE_TRIGGER=cfg.pdl_late,
                       launch_pdl=pdl)
    fr = freqs if inv_rope else y3
    poison = _freqs_poison_row(freqs) if inv_rope else y3
    n_positions = freqs.shape[0] if inv_rope else 0
    w_tma = cfg.w_tma and weight_tma_usable(w3)  # otherwise the same form with plain weight loads
    w_desc = _weight_descriptor(w3, cfg) if w_tma else w3
    # W_TMA: 0 (plain loads) or the number of shared-memory buffers the K loop pipelines the TMA copies through
    launch_args["W_TMA"] = cfg.num_stages if w_tma else 0
    launch_args.update(register_cap_option(cfg.max_registers))
    if cfg.rows_form:
        one_chunk = cfg.one_chunk and per_split == cfg.k_unroll
        _block_fp8_gemv_rows_kernel[grid](
            x3, w3, s3, y3, partial, counters, pos, fr, poison, n_positions, w_desc,
            m, n, k,
            x3.stride(0), x3.stride(1),
            w3.stride(0), w3.stride(1),
            s3.stride(0), s3.stride(1),
            y3.stride(0), y3.stride(1),
            fr.stride(0) if inv_rope else 0,
            per_split, split,
            ROWS=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=FP8_BLOCK, K_UNROLL=cfg.k_unroll,
            IS_SPLIT=split > 1, PREFETCH=cfg.prefetch, EVICT_FIRST=cfg.evict_first, X_BROADCAST=cfg.x_broadcast,
            INV_ROPE=inv_rope, HEAD=head_dim, ROPE=rope_dim, ONE_CHUNK=one_chunk,
            X_FIRST=one_chunk and one_chunk_x_first(cfg), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            **launch_args,
        )
        return
    if cfg.fp8_mma:
        _block_fp8_gemv_fp8mma_kernel[grid](
            x3, w3, s3, y3, partial, counters, pos, fr, poison, n_positions, w_desc,
            m, n, k,
            x3.stride(0), x3.stride(1),
            w3.stride(0), w3.stride(1),
            s3.stride(0), s3.stride(1),
            y3.stride(0), y3.stride(1),
            fr.stride(0) if inv_rope else 0,
            per_split, split, groups,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=FP8_BLOCK, K_UNROLL=cfg.k_unroll,
            JOIN=cfg.fp8_join, IS_SPLIT=split > 1, CHAIN=cfg.fp8_chain,
            SPLIT_SUM_BATCH=cfg.split_sum_batch,
            ROPE_HOIST=rope_mode(cfg, inv_rope, FP8_BLOCK, per_split, k, head_dim, rope_dim),
            INV_ROPE=inv_rope, HEAD=head_dim, ROPE=rope_dim,
            W_BEFORE_WAIT=cfg.w_before_wait if per_split == cfg.k_unroll else 0, INLINE_PTX=not interpreter_enabled(),
            ROPE_PAIRS=cfg.rope_pairs,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_args, **persistent_args,
        )
        return
    _block_fp8_gemv_kernel[grid](
        x3, w3, s3, y3, partial, counters, pos, fr, poison, n_positions, w_desc,
        m, n, k,
        x3.stride(0), x3.stride(1),
        w3.stride(0), w3.stride(1),
        s3.stride(0), s3.stride(1),
        y3.stride(0), y3.stride(1),
        fr.stride(0) if inv_rope else 0,
        per_split, split, groups,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=FP8_BLOCK, K_UNROLL=cfg.k_unroll,
        IS_SPLIT=split > 1, USE_DOT=cfg.use_dot, SWAP_AB=cfg.swap_ab,
        INV_ROPE=inv_rope, HEAD=head_dim, ROPE=rope_dim,
        ROPE_HOIST=rope_mode(cfg, inv_rope, FP8_BLOCK * cfg.k_unroll, per_split, k, head_dim, rope_dim),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_args, **persistent_args,
    )


def _check_weight(weight, weight_scale, groups: int | None):
    _check(weight.dtype == FP8_DTYPE, "weight", "dtype torch.float8_e4m3fn", weight.dtype)
    ndim = 2 if groups is None else 3
    _check(weight.dim() == ndim and weight.stride(-1) == 1, "weight",
           f"a {ndim}-D tensor with contiguous last dim", weight)
    n, k = weight.shape[-2:]
    scale_shape = (*weight.shape[:-2], _cdiv(n, FP8_BLOCK), _cdiv(k, FP8_BLOCK))
    _check(weight_scale.dtype == torch.float32, "weight_scale", "dtype torch.float32", weight_scale.dtype)
    _check(tuple(weight_scale.shape) == scale_shape and weight_scale.stride(-1) == 1, "weight_scale",
           f"shape {scale_shape} (one scale per {FP8_BLOCK}x{FP8_BLOCK} block) with contiguous last dim",
           weight_scale)
    _check(weight_scale.device == weight.device, "weight_scale", f"device {weight.device}", weight_scale.device)


@functools.lru_cache(maxsize=None)
def sharing_config(cfg: GemvConfig) -> GemvConfig:
    """``cfg`` for a GEMV that shares the SMs with work on other streams: a persistent form on at most
    :data:`SHARED_PERSISTENT_PROGRAMS_PER_SM` programs per SM; any other form unchanged."""
    if cfg.persistent_programs_per_sm > SHARED_PERSISTENT_PROGRAMS_PER_SM:
        return dataclasses.replace(cfg, persistent_programs_per_sm=SHARED_PERSISTENT_PROGRAMS_PER_SM)
    return cfg


def block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *,
                     out: torch.Tensor | None = None, config: GemvConfig | None = None,
                     share_sms: bool = False) -> torch.Tensor:
    """``x [..., K] bf16 @ dequant(weight [N, K] e4m3, weight_scale [N/128, K/128] fp32).T`` -> bf16.
    ``share_sms``: other streams run work beside this call (:func:`sharing_config`)."""
    _check(isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16, "x", "a torch.bfloat16 tensor",
           getattr(x, "dtype", type(x)))
    _check_weight(weight, weight_scale, None)
    n, k = weight.shape
    _check(x.dim() >= 1 and x.shape[-1] == k, "x", f"last dim {k} (weight in_features)", x)
    _check(x.device == weight.device, "x", f"device {weight.device}", x.device)
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out_shape = (*x.shape[:-1], n)
    if out is None:
        out = torch.empty(out_shape, dtype=torch.bfloat16, device=x.device)
    else:
        _check(tuple(out.shape) == out_shape and out.dtype == torch.bfloat16 and out.is_contiguous()
               and out.device == x.device, "out", f"contiguous bf16 of shape {out_shape} on {x.device}",
               out)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if config is not None:
        cfg = sharing_config(config) if share_sms else config
    else:
        cfg = sharing_default_config(m, n, k) if share_sms else default_config(m, n, k)
    y2 = out.view(m, n)
    _launch(x2.unsqueeze(1), weight.unsqueeze(0), weight_scale.unsqueeze(0), y2.unsqueeze(1), m, n, k, 1, cfg)
    return out


def grouped_fp8_wo_a(o: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *,
                     positions: torch.Tensor | None = None, freqs: torch.Tensor | None = None,
                     head_dim: int = HEAD_DIM, rope_dim: int = ROPE_DIM, out: torch.Tensor | None = None,
                     config: GemvConfig | None = None) -> torch.Tensor:
    """DeepSeek-V4 grouped o-LoRA A: ``o [B, G, D] x weight [G, R, D] -> [B, G, R]`` bf16.

    ``weight_scale`` is ``[G, R/128, D/128]`` fp32. With ``positions [B]`` (int32/int64) and
    ``freqs [max_pos, rope_dim]`` fp32 (``view_as_real(freqs_cis).flatten(1)``: cos, sin interleaved)
    the inverse RoPE of the last ``rope_dim`` dims of every ``head_dim``-wide head of ``o`` is fused; a position
    outside ``[0, max_pos)`` gives a NaN output row (checking it on the host would need a sync).
    """
    _check(isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16, "o", "a torch.bfloat16 tensor",
           getattr(o, "dtype", type(o)))
    _check_weight(weight, weight_scale, groups=True)
    g, r, d = weight.shape
    _check(o.dim() == 3 and tuple(o.shape[1:]) == (g, d) and o.stride(-1) == 1, "o",
           f"[B, {g}, {d}] with contiguous last dim", o)
    _check(o.device == weight.device, "o", f"device {weight.device}", o.device)
    b = o.shape[0]
    if (positions is None) != (freqs is None):
        raise ValueError("positions and freqs: expected both (fused inverse RoPE) or neither")
    if positions is not None:
        _check(positions.dim() == 1 and positions.shape[0] == b and positions.dtype in (torch.int32, torch.int64)
               and positions.device == o.device, "positions", f"[{b}] int32/int64 on {o.device}", positions)
        _check(freqs.dim() == 2 and freqs.shape[0] > 0 and freqs.shape[1] == rope_dim and freqs.dtype == torch.float32
               and freqs.stride(1) == 1 and freqs.device == o.device, "freqs",
               f"[max_pos, {rope_dim}] fp32 (cos, sin interleaved) on {o.device}", freqs)
        _check(rope_dim % 2 == 0 and 0 < rope_dim <= head_dim and d % head_dim == 0, "head_dim/rope_dim",
               f"even rope_dim <= head_dim dividing D={d}", (head_dim, rope_dim))
    if out is None:
        out = torch.empty((b, g, r), dtype=torch.bfloat16, device=o.device)
    else:
        _check(tuple(out.shape) == (b, g, r) and out.dtype == torch.bfloat16 and out.stride(-1) == 1
               and out.device == o.device, "out", f"bf16 [{b}, {g}, {r}] on {o.device}", out)
    if b == 0 or r == 0:
        return out
    if b > WO_A_MAX_KERNEL_ROWS and config is None:  # prefill-sized: compute-bound, tensor cores via torch
        return wo_a_dequantised_einsum(o, weight, weight_scale, positions=positions, freqs=freqs, head_dim=head_dim,
                                       rope_dim=rope_dim, out=out)
    cfg = config or wo_a_config(b, r, d, g, fused_rope=positions is not None)
    _launch(o, weight, weight_scale, out, b, r, d, g, cfg, positions, freqs, head_dim, rope_dim)
    return out


def wo_a_dequantised_einsum(o: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *,
                            positions: torch.Tensor | None = None, freqs: torch.Tensor | None = None,
                            head_dim: int = HEAD_DIM, rope_dim: int = ROPE_DIM,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`grouped_fp8_wo_a`'s result the way upstream computes wo_a on sm_120: the bf16 inverse RoPE, then a bf16
    ``einsum("tgd,grd->tgr")`` on a transient bf16 copy of the weight (twice the FP8 weight's bytes, freed after the
    call). Its prefill-sized path, and the dense seam's path when the kernel raises. Inputs as grouped_fp8_wo_a
    checks them."""
    if positions is not None:
        o = _inverse_rope_bf16(o, positions, freqs, head_dim, rope_dim)
    y = torch.einsum("tgd,grd->tgr", o, dequantize_block_fp8(weight, weight_scale, torch.bfloat16))
    if out is None:  # contiguous [B, G, R], as the kernel's output (einsum may hand back a permuted layout)
        out = torch.empty(y.shape, dtype=torch.bfloat16, device=y.device)
    return out.copy_(y)


# ----------------------------------------------------------------------------------------------
# float32 references (the specification)
# ----------------------------------------------------------------------------------------------


def dequantize_block_fp8(weight: torch.Tensor, weight_scale: torch.Tensor,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``weight[..., n, k] * weight_scale[..., n // 128, k // 128]`` in ``dtype`` (upstream's
    ``_dequant_fp8`` / ``block_quant_dequant`` semantics, computed in fp32 then cast)."""
    n, k = weight.shape[-2:]
    s = weight_scale.float().repeat_interleave(FP8_BLOCK, -2).repeat_interleave(FP8_BLOCK, -1)[..., :n, :k]
    return (weight.float() * s).to(dtype)


def reference_block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """fp32 ``x @ dequant(weight).T`` with the bf16 activation taken exactly."""
    return x.float() @ dequantize_block_fp8(weight, weight_scale).T


def _inverse_rope_bf16(o: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, head_dim: int,
                       rope_dim: int) -> torch.Tensor:
    """Upstream's in-place inverse RoPE on ``o``'s last ``rope_dim`` dims of every head, out of place:
    fp32 rotation by conj(freqs_cis[pos]) of interleaved (re, im) pairs, rounded to bf16."""
    b, g, d = o.shape
    n_heads = g * d // head_dim  # named, not -1: a reshape of B = 0 rows cannot infer it
    heads = o.reshape(b, n_heads, head_dim).float()
    rope = heads[..., head_dim - rope_dim:].reshape(b, n_heads, rope_dim // 2, 2)
    # a position outside the table rotates by NaN (as the kernels do, _freqs_row): its row comes out NaN, with no
    # out-of-bounds gather and no host sync
    pos = positions.long()
    in_range = (pos >= 0) & (pos < freqs.shape[0])
    f = freqs[pos.clamp(0, max(freqs.shape[0] - 1, 0))].float()
    f = torch.where(in_range[:, None], f, torch.full_like(f, float("nan"))).reshape(b, 1, rope_dim // 2, 2)
    c, s = f[..., 0], f[..., 1]
    re, im = rope[..., 0], rope[..., 1]
    rotated = torch.stack((re * c + im * s, im * c - re * s), dim=-1).reshape(b, n_heads, rope_dim)
    heads[..., head_dim - rope_dim:] = rotated
    return heads.to(torch.bfloat16).reshape(b, g, d)


def reference_grouped_wo_a(o: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                           positions: torch.Tensor | None = None, freqs: torch.Tensor | None = None,
                           head_dim: int = HEAD_DIM, rope_dim: int = ROPE_DIM) -> torch.Tensor:
    """fp32 ``einsum("tgd,grd->tgr")`` on the dequantised weight (after the bf16 inverse RoPE)."""
    if positions is not None:
        o = _inverse_rope_bf16(o, positions, freqs, head_dim, rope_dim)
    return torch.einsum("tgd,grd->tgr", o.float(), dequantize_block_fp8(weight, weight_scale))


def reference_upstream_fp8_activation_linear(x: torch.Tensor, weight: torch.Tensor,
                                             weight_scale: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    """What SGLang 0.5.23's block-FP8 linear computes on sm_120, emulated in fp32: per-token-group(128)
    activation quantisation (``_per_token_group_quant_8bit``: scale = max(amax, eps) / 448, q =
    clamp(x / scale) rounded to e4m3) then a block GEMM that scales each 128-K partial product by
    ``x_scale[m, kb] * w_scale[nb, kb]`` (CUTLASS ``fp8_blockwise_scaled_mm``)."""
    m_shape, k = x.shape[:-1], x.shape[-1]
    xf = x.reshape(-1, k).float()
    kb = _cdiv(k, FP8_BLOCK)
    pad = kb * FP8_BLOCK - k
    groups = torch.nn.functional.pad(xf, (0, pad)).reshape(-1, kb, FP8_BLOCK)
    x_scale = groups.abs().amax(-1, keepdim=True).clamp_min(eps) / FP8_MAX
    q = (groups * (1.0 / x_scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float()
    x_dq = (q * x_scale).reshape(-1, kb * FP8_BLOCK)[:, :k]
    return (x_dq @ dequantize_block_fp8(weight, weight_scale).T).reshape(*m_shape, weight.shape[0])


# ----------------------------------------------------------------------------------------------
# AOT configs
# ----------------------------------------------------------------------------------------------

# (GemvConfig, inv_rope): every form default_config can pick (split_k only matters as 1 vs > 1 for
# code generation) plus the fused-RoPE wo_a forms.
_FMA_PDL = dict(pdl=True, pdl_l2_blocks=PDL_FMA_L2_BLOCKS)
_LATE = dict(pdl=True, pdl_late=True)
_TWO_ROW_PF = dict(pdl=True, pdl_l2_blocks=PDL_TWO_ROW_PREFETCH_L2_BLOCKS)
_DOT_LATE_L2 = dict(pdl=True, pdl_late=True, pdl_l2_blocks=PDL_DOT_L2_BLOCKS)
_LAUNCH_FORMS = (  # launch_form's choices (default_config with USE_PDL = False, and where no PDL rule applies)
    (GemvConfig(1, 32, 1, False, k_unroll=2), False),
    (GemvConfig(1, 32, 4, False, k_unroll=2), False),
    (GemvConfig(16, 32, 1, True), False),
    (GemvConfig(16, 32, 4, True), False),
    (GemvConfig(32, 64, 1, True), False),
    (GemvConfig(32, 64, 4, True), False),
    (GemvConfig(1, 32, 4, False, k_unroll=2), True),
    (GemvConfig(16, 32, 4, True), True),
    # rows form: 2 rows (split-K off / on, fused RoPE), and the 1-row one-shot forms
    (GemvConfig(2, 32, 1, False, k_unroll=2, rows_form=True), False),
    (GemvConfig(2, 32, 4, False, k_unroll=2, rows_form=True), False),
    (GemvConfig(2, 32, 4, False, k_unroll=2, rows_form=True), True),
    (GemvConfig(1, 16, 1, False, k_unroll=4, rows_form=True, prefetch=True, evict_first=True), False),
    (GemvConfig(1, 16, 1, False, num_warps=8, k_unroll=8, rows_form=True, prefetch=True), False),
    # FP8 tensor-core form, joined activation split: 128 columns on 8 warps (split-K off / on, fused RoPE)
    # and 64 columns on 4 warps (split-K off / on)
    (GemvConfig(8, 128, 1, True, 8, 3, fp8_mma=True, fp8_join=True), False),
    (GemvConfig(8, 128, 4, True, 8, 3, fp8_mma=True, fp8_join=True), False),
    (GemvConfig(8, 128, 4, True, 8, 3, fp8_mma=True, fp8_join=True), True),
    (GemvConfig(8, 64, 1, True, 4, 3, fp8_mma=True, fp8_join=True), False),
    (GemvConfig(8, 64, 4, True, 4, 3, fp8_mma=True, fp8_join=True), False),
)
_PDL_FORMS = (  # the PDL forms _with_pdl picks (runs 8/9)
    # 1 row: FMA form (4 L2 blocks; split-K off / on, fused RoPE), one-shot rows forms
    (GemvConfig(1, 32, 1, False, k_unroll=2, **_FMA_PDL), False),
    (GemvConfig(1, 32, 4, False, k_unroll=2, **_FMA_PDL), False),
    (GemvConfig(1, 32, 4, False, k_unroll=2, **_FMA_PDL), True),
    (GemvConfig(1, 16, 1, False, k_unroll=4, rows_form=True, prefetch=True, evict_first=True, pdl=True), False),
    (GemvConfig(1, 16, 1, False, num_warps=8, k_unroll=8, rows_form=True, prefetch=True, pdl=True), False),
    # 2 rows: late trigger; first chunk prefetched with 16 L2 blocks (split-K off / on, fused RoPE)
    (GemvConfig(2, 32, 1, False, k_unroll=2, rows_form=True, **_LATE), False),
    (GemvConfig(2, 32, 4, False, k_unroll=2, rows_form=True, **_LATE), False),
    (GemvConfig(2, 32, 4, False, k_unroll=2, rows_form=True, **_LATE), True),
    (GemvConfig(2, 32, 1, False, k_unroll=2, rows_form=True, prefetch=True, **_TWO_ROW_PF), False),
    (GemvConfig(2, 32, 4, False, k_unroll=2, rows_form=True, prefetch=True, **_TWO_ROW_PF), False),
    (GemvConfig(2, 32, 4, False, k_unroll=2, rows_form=True, prefetch=True, **_TWO_ROW_PF), True),
    # 16-row bf16 tiles: late with 4 L2 blocks (split-K off / on, fused RoPE)
    (GemvConfig(16, 32, 1, True, **_DOT_LATE_L2), False),
    (GemvConfig(16, 32, 4, True, **_DOT_LATE_L2), False),
    (GemvConfig(16, 32, 4, True, **_DOT_LATE_L2), True),
    # 128-column FP8 tile: early (split-K off / on, fused RoPE)
    (GemvConfig(8, 128, 1, True, 8, 3, fp8_mma=True, fp8_join=True, pdl=True), False),
    (GemvConfig(8, 128, 4, True, 8, 3, fp8_mma=True, fp8_join=True, pdl=True), False),
    (GemvConfig(8, 128, 4, True, 8, 3, fp8_mma=True, fp8_join=True, pdl=True), True),
)
_TMA_FORMS = (  # runs 11 / 11b: default_config's and wo_a_config's TMA and 64-column forms
    # 1 row, wo_a / wo_b at T=1: 64-column FMA tiles by TMA (split-K)
    (GemvConfig(1, TMA_FMA_BLOCK_N, 4, False, k_unroll=2, w_tma=True, **_FMA_PDL), False),
    # wo_a with the fused inverse RoPE: 1 row on 64-column FMA tiles (plain loads), 2..8 rows on the FP8 tile by TMA
    (GemvConfig(1, TMA_FMA_BLOCK_N, 4, False, k_unroll=2, **_FMA_PDL), True),
    (GemvConfig(8, 128, 4, True, WO_A_ROPE_FP8_MMA_WARPS, 3, fp8_mma=True, fp8_join=True, pdl=True, w_tma=True),
     True),
    # runs 13 / 13b: 1 row, wq_b at T=1 (no K split): 64-column FMA tiles by TMA, persistent on 2 programs per SM;
    # beside the indexer's streams (block_fp8_linear(share_sms=True)) on 1 (the same kernel, a smaller grid)
    (GemvConfig(1, TMA_FMA_BLOCK_N, 1, False, k_unroll=2, w_tma=True,
                persistent_programs_per_sm=PERSISTENT_FMA_PROGRAMS_PER_SM, **_FMA_PDL), False),
    (GemvConfig(1, TMA_FMA_BLOCK_N, 1, False, k_unroll=2, w_tma=True,
                persistent_programs_per_sm=SHARED_PERSISTENT_PROGRAMS_PER_SM, **_FMA_PDL), False),
)
_WO_A_FORMS = (  # runs 15 / 15b: wo_a_config's one-shot FP8 tile at T=1, 2..4 rows without the fused RoPE (split-K)
    (GemvConfig(8, 128, 4, True, fp8_mma=True, fp8_join=True, pdl=True, **WO_A_ONE_SHOT), False),
    # runs 17 / 17b, with the fused RoPE: T=1 1 row, the 64-column FMA tile by TMA with hoisted RoPE factors; T=1 2..8
    # rows, the one-shot tile with the rope block preloaded; T=2 3..8 rows, the 8-warp FP8 tile with it (no PDL)
    (GemvConfig(1, TMA_FMA_BLOCK_N, 4, False, k_unroll=2, w_tma=True, rope_hoist=True, **_FMA_PDL), True),
    (GemvConfig(8, 128, 4, True, fp8_mma=True, fp8_join=True, pdl=True, rope_preload=True, **WO_A_ONE_SHOT), True),
    (GemvConfig(8, 128, 4, True, 8, 3, fp8_mma=True, fp8_join=True, rope_preload=True), True),
)
# runs 18 / 18b: the one-chunk rows forms _one_chunk_config picks for the DSv4 shapes of <= 8 MiB at 1 / 2 rows
# (K 4096 / 2048 / 1024 / 512 / 256), the fused inverse RoPE on wo_a at T=8 (K 4096)
_ONE_CHUNK_FORMS = tuple(dict.fromkeys((  # (the main wq_b's one-row tile is also K 1024's: listed once)
    *((one_chunk_form(m, block_n, warps, k // FP8_BLOCK), rope)
      for m in (1, 2)
      for k, block_n, warps, ropes in ((4096, 8, 8, (False, True)), (2048, 8, 4, (False,)), (1024, 16, 4, (False,)),
                                       (512, 32, 4, (False,)), (256, 32, 4, (False,)))
      for rope in ropes),
    # wqkv_a, [8192, 1024] and the main wq_b at 1 row (ONE_CHUNK_ONE_ROW_TILES, ONE_CHUNK_X_FIRST_ONE_ROW_TILES)
    *((one_chunk_form(1, block_n, warps, k // FP8_BLOCK), False)
      for (_n, k), (block_n, warps) in (*ONE_CHUNK_ONE_ROW_TILES.items(), *ONE_CHUNK_X_FIRST_ONE_ROW_TILES.items())),
    # the shared expert's down at T=4 without PDL (ONE_ROW_WITHOUT_PDL: the rule applies it)
    *((pick_default_config(1, n, k, 1, DEFAULT_SM_COUNT, rules()), False) for n, k in sorted(ONE_ROW_WITHOUT_PDL)))))
SHIPPED_FORMS = _LAUNCH_FORMS + _PDL_FORMS + _TMA_FORMS + _WO_A_FORMS + _ONE_CHUNK_FORMS
# run 19 / 20 / 21: the one-shot program with block 0's weight before the PDL wait, default_config's form for wo_a /
# wo_b at T=1, 2..8 rows (split 8 / 16 compile the same); with the fused RoPE (rope block preloaded, rotated from its
# own pairs) wo_a_config's at 1..8 rows; the same without pairs as USE_WO_A_ROPE_PAIRS = False runs it
_W_BEFORE_WAIT_ONE_SHOT = GemvConfig(FP8_MMA_BLOCK_ROWS, FP8_MMA_WIDE["block_n"], 4, True, pdl=True, fp8_mma=True,
                                     fp8_join=True, w_before_wait=1, **WO_A_ONE_SHOT)
_W_BEFORE_WAIT_FORMS = ((_W_BEFORE_WAIT_ONE_SHOT, False),
                        (dataclasses.replace(_W_BEFORE_WAIT_ONE_SHOT, rope_preload=True, rope_pairs=True), True),
                        (dataclasses.replace(_W_BEFORE_WAIT_ONE_SHOT, rope_preload=True), True))
SHIPPED_FORMS += _W_BEFORE_WAIT_FORMS


def compiled_form(cfg: GemvConfig) -> GemvConfig:
    """``cfg`` as the AOT check compiles it: every K split > 1 compiles the same (IS_SPLIT), listed as split 4."""
    return dataclasses.replace(cfg, split_k=1 if cfg.split_k == 1 else 4)


def picked_forms(sms: int) -> set:
    """Every (form, fused RoPE) the launch rules pick for DSv4-Flash's seven linears on a GPU of ``sms`` SMs: T in
    SUPPORTED_TP, 1..16 rows, alone and beside other streams (sharing_default_config), with PDL and without (the
    seam's PDL switch), wo_a also with the fused inverse RoPE; as compiled."""
    from .dsv4 import O_GROUPS, O_LORA_RANK, SUPPORTED_TP, dense_linear_shapes

    forms = set()
    for rule in (rules()._replace(pdl=True), rules()._replace(pdl=False)):
        for tp in SUPPORTED_TP:
            for name, (n, k) in dense_linear_shapes(tp).items():
                groups = O_GROUPS // tp if name == "wo_a" else 1
                n = O_LORA_RANK if name == "wo_a" else n
                for m in range(1, 17):
                    alone = pick_default_config(m, n, k, groups, sms, rule)
                    beside = (pick_default_config(m, n, k, groups, sms, rule, True)
                              if _beside_streams_keeps_its_form(alone, groups * n * k) else alone)
                    # sharing_config's cache keeps the first object it saw per config: the scan must not seed it
                    forms.update((compiled_form(cfg), False) for cfg in (alone, sharing_config.__wrapped__(beside)))
                    if name == "wo_a":
                        forms.add((compiled_form(pick_wo_a_config(m, n, k, groups, True, sms, rule)), True))
    return forms


@functools.lru_cache(maxsize=None)
def aot_forms() -> tuple:
    """SHIPPED_FORMS (the forms the H200 runs measured, listed by hand) and after them every other form the rules pick
    on a GPU of up to SM12X_AOT_MAX_SM_COUNT SMs (below the H200's 132 some rules pick forms no measured GPU
    launches, e.g. one-row TMA tiles without a K split): the AOT check compiles all of them."""
    from .dsv4 import SM12X_AOT_MAX_SM_COUNT

    forms = dict.fromkeys(SHIPPED_FORMS)
    for sms in range(1, SM12X_AOT_MAX_SM_COUNT + 1):
        forms.update(dict.fromkeys(sorted(picked_forms(sms) - forms.keys(), key=lambda f: (f[0].name, f[1]))))
    return tuple(forms)


def aot_configs() -> list[AotConfig]:
    return [aot_config(cfg, rope) for cfg, rope in aot_forms()]


_AOT_SIGNATURE = {
    "x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "y_ptr": "*bf16", "partial_ptr": "*fp32",
    "counter_ptr": "*i32", "pos_ptr": "*i64", "freqs_ptr": "*fp32",
    "freqs_poison_ptr": "*fp32", "n_positions": "i32", "w_desc": "*fp8e4nv",
    "M": "i32", "N": "i32", "K": "i32",
    "stride_xm": "i32", "stride_xg": "i32", "stride_wg": "i32", "stride_wn": "i32",
    "stride_sg": "i32", "stride_sn": "i32", "stride_ym": "i32", "stride_yg": "i32",
    "stride_freq": "i32", "k_blocks_per_split": "i32", "num_splits": "i32", "num_groups": "i32",
    "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "K_UNROLL": "constexpr",
    "IS_SPLIT": "constexpr", "USE_DOT": "constexpr", "SWAP_AB": "constexpr", "INV_ROPE": "constexpr",
    "HEAD": "constexpr", "ROPE": "constexpr", "PDL": "constexpr", "L2_PREFETCH_BLOCKS": "constexpr",
    "PDL_LATE_TRIGGER": "constexpr", "W_TMA": "constexpr", "PERSISTENT": "constexpr", "FLATTEN": "constexpr",
    "ROPE_HOIST": "constexpr",
}
_AOT_ROWS_SIGNATURE = {  # the rows kernel has no persistent form (no num_groups)
    **{key: v for key, v in _AOT_SIGNATURE.items() if v != "constexpr" and key != "num_groups"},
    **{key: "constexpr" for key in ("ROWS", "BLOCK_N", "BLOCK_K", "K_UNROLL", "IS_SPLIT", "PREFETCH", "EVICT_FIRST",
                                    "X_BROADCAST", "INV_ROPE", "HEAD", "ROPE", "PDL", "L2_PREFETCH_BLOCKS",
                                    "PDL_LATE_TRIGGER", "W_TMA", "ONE_CHUNK", "X_FIRST")},
}

_AOT_FP8MMA_SIGNATURE = {
    **{key: v for key, v in _AOT_SIGNATURE.items() if v != "constexpr"},
    **{key: "constexpr" for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "K_UNROLL", "JOIN", "IS_SPLIT", "INV_ROPE",
                                    "HEAD", "ROPE", "CHAIN", "PDL", "L2_PREFETCH_BLOCKS",
                                    "PDL_LATE_TRIGGER", "W_TMA", "PERSISTENT", "FLATTEN", "SPLIT_SUM_BATCH",
                                    "ROPE_HOIST", "W_BEFORE_WAIT", "INLINE_PTX", "ROPE_PAIRS")},
}


# SASS of prefetch.global.L2 on sm_120a / sm_121a (PDL_OPCODES, from kernels/pdl.py: the griddepcontrol pair)
L2_PREFETCH_OPCODE = "CCTL.E.PF2"


# SASS of a TMA tensor copy (cp.async.bulk.tensor) on sm_120a / sm_121a
TMA_LOAD_OPCODE = "UTMALDG"


def aot_config(cfg: GemvConfig, rope: bool = False) -> AotConfig:
    """The AotConfig of one launch form (split_k only matters as 1 vs > 1)."""
    cfg_aot = _aot_config_of_form(dataclasses.replace(cfg, w_tma=False), rope)
    pdl_opcodes = (PDL_OPCODES if cfg.pdl else ()) + ((L2_PREFETCH_OPCODE,) if cfg.pdl_l2_blocks else ())
    expect = (*cfg_aot.expect_opcodes, *pdl_opcodes)
    if cfg.w_tma:  # the weight by TMA copies instead of the plain form's 16-byte loads / cp.async
        expect = (*(op for op in expect if not op.startswith(("LDG.", "LDGSTS."))), TMA_LOAD_OPCODE)
        cfg_aot = dataclasses.replace(
            cfg_aot, name=cfg_aot.name.replace(dataclasses.replace(cfg, w_tma=False).name, cfg.name, 1),
            signature={**cfg_aot.signature, "w_desc": f"tensordesc<fp8e4nv[1, {cfg.block_n}, {cfg.weight_tile_k}]>"},
            constexprs={**cfg_aot.constexprs, "W_TMA": cfg.num_stages})
    return dataclasses.replace(cfg_aot, expect_opcodes=expect)


def _aot_config_of_form(cfg: GemvConfig, rope: bool) -> AotConfig:
    name = f"fp8_gemv_{cfg.name}" + ("_invrope" if rope else "")
    common = {"BLOCK_N": cfg.block_n, "BLOCK_K": FP8_BLOCK, "K_UNROLL": cfg.k_unroll, "IS_SPLIT": cfg.split_k > 1,
              "INV_ROPE": rope, "HEAD": HEAD_DIM, "ROPE": ROPE_DIM, "PDL": cfg.pdl,
              "L2_PREFETCH_BLOCKS": cfg.pdl_l2_blocks, "PDL_LATE_TRIGGER": cfg.pdl_late, "W_TMA": 0}
    persistent = {"PERSISTENT": cfg.persistent_programs_per_sm > 0,
                  "FLATTEN": cfg.persistent_programs_per_sm > 0 and cfg.split_k == 1}
    if cfg.rows_form:
        return AotConfig(
            name=name, kernel=_block_fp8_gemv_rows_kernel, signature=_AOT_ROWS_SIGNATURE,
            constexprs={"ROWS": cfg.block_m, "PREFETCH": cfg.prefetch, "EVICT_FIRST": cfg.evict_first,
                        "X_BROADCAST": cfg.x_broadcast, "ONE_CHUNK": cfg.one_chunk,
                        "X_FIRST": one_chunk_x_first(cfg), **common},
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            div16=("N", "K", "stride_xm", "stride_xg", "stride_wg", "stride_wn", "stride_ym", "stride_yg",
                   "stride_freq"),
            # the FP8 weight moves straight into registers in 16-byte loads (.EF: evict-first)
            expect_opcodes=("FFMA", "LDG.E.EF.128" if cfg.evict_first else "LDG.E.128"),
        )
    if cfg.fp8_mma:
        return AotConfig(
            name=name, kernel=_block_fp8_gemv_fp8mma_kernel, signature=_AOT_FP8MMA_SIGNATURE,
            constexprs={"BLOCK_M": cfg.block_m, "JOIN": cfg.fp8_join, "CHAIN": cfg.fp8_chain, **common,
                        **persistent, "SPLIT_SUM_BATCH": cfg.split_sum_batch, "W_BEFORE_WAIT": cfg.w_before_wait,
                        "INLINE_PTX": True, "ROPE_PAIRS": cfg.rope_pairs,
                        # the wo_a geometry: K split 8 of 4096 (4 blocks, one head, per split)
                        "ROPE_HOIST": rope_mode(cfg, rope, FP8_BLOCK, HEAD_DIM // FP8_BLOCK, 8 * HEAD_DIM, HEAD_DIM,
                                                ROPE_DIM)},
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            div16=("N", "K", "stride_xm", "stride_xg", "stride_wg", "stride_wn", "stride_ym", "stride_yg",
                   "stride_freq"),
            # e4m3 x e4m3 on tensor cores (mma.sync m16n8k32 on sm_12x); the weight by 16-byte cp.async, or with one
            # stage (no pipeline) by 16-byte loads into registers
            expect_opcodes=("QMMA.16832.F32.E4M3.E4M3", "LDGSTS.E.BYPASS.128" if cfg.num_stages > 1 else "LDG.E.128"),
            forbid_opcodes=("HMMA.16816.F32.BF16",),
            max_registers=cfg.max_registers,
        )
    return AotConfig(
        name=name, kernel=_block_fp8_gemv_kernel, signature=_AOT_SIGNATURE,
        constexprs={"BLOCK_M": cfg.block_m, "USE_DOT": cfg.use_dot, "SWAP_AB": cfg.swap_ab, **common, **persistent,
                    "ROPE_HOIST": rope_mode(cfg, rope, FP8_BLOCK * cfg.k_unroll, HEAD_DIM // FP8_BLOCK, 8 * HEAD_DIM,
                                            HEAD_DIM, ROPE_DIM)},
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        # the JIT sees these as multiples of 16 for DSv4's shapes (K, N multiples of 128)
        div16=("N", "K", "stride_xm", "stride_xg", "stride_wg", "stride_wn", "stride_ym", "stride_yg",
               "stride_freq"),
        # the FP8 weight moves in 16-byte loads: cp.async into shared memory for the tensor-core
        # form, straight into registers for the FMA form
        expect_opcodes=(("HMMA.16816.F32.BF16", "LDGSTS.E.BYPASS.128") if cfg.use_dot
                        else ("FFMA", "LDG.E.128")),
    )
