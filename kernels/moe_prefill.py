"""MXFP4 MoE prefill (thousands of routed rows) as a grouped GEMM pair on tensor cores (issue 4's prefill target).

Same semantics as :func:`moe_mxfp4.reference_moe_mxfp4` and the same weights as the decode (the repacked layout of
:func:`moe_mxfp4.repack_w13_`: w13 rows interleaved ``gate_0, up_0, gate_1, ...``; no second copy, no per-call
dequantised copy). One forward (:func:`moe_mxfp4_prefill_forward`) is

1. routing (:func:`moe_mxfp4.route`: torch sort above 2048 rows) and x copied once as bf16 times 2**32 in the pair
   order (``_x_pairs_kernel``, exact);
2. ``_prefill_gate_up_kernel``: grid (block of BLOCK_N intermediate columns, touched expert slot), the column block
   varying fastest so the programs that run together share an expert's activation rows in L2. Each program loops
   over its expert's sorted routed rows BLOCK_M at a time; each pass multiplies them with the 2*BLOCK_N
   interleaved gate/up weight rows on tensor cores (fp32 accumulate) and stores the clamped SwiGLU, bf16 times
   2**32 in the pair order, at the rows' *sorted positions* (so the down launch reads contiguous rows);
3. ``_prefill_down_kernel``: grid (block of BLOCK_N hidden columns, slot), the down projection of the sorted
   SwiGLU rows times each row's routing weight into fp32 ``y [B*top_k, H]`` at the routed row;
4. ``moe_mxfp4.launch_topk_sum``: each token's top-k rows summed into the bf16 output.

Weight upcast: the decode's exact register upcast on int32 weight words (:func:`moe_mxfp4._pairs_tile_scaled`:
nibble pairs placed as bf16 bits, the E8M0 factor multiplied onto the pair words by ``mul.rn.bf16x2``) as the A
operand (weights the MMA's M side, swap-AB) of a plain bf16 ``tl.dot`` against the pair-ordered activations.
Exact for E8M0 bytes 34..160 (inf above 160; below 34 the factor leaves bf16's normal range), far outside
checkpoint scales. On sm_90a Triton emits wgmma (HGMMA) for it, on sm_120a HMMA.16816.F32.BF16.

H200 run 1b (``benchmarks/moe_prefill-h200-run1-summary.md``; 4096 tokens, top-6, 256 experts, H = 4096): the
shipped tiles 5236 us at T = 1 (I = 2048; 236 TFLOP/s, 30.6 % of the bf16 matmul rate) vs 8769 us for
``moe_mxfp4_forward``'s tl.dot_scaled prefill (1.67x), 1721 us at T = 4 (I = 512; 180 TFLOP/s) vs 2627 us (1.53x);
relative error 1.79e-3 against the float32 reference, as the old path's. Measured and lost (removed): Triton's
``tl.dot_scaled`` upcast with the activations or the weights as the M side (gate/up 1.29x / 2.34x slower at T = 1,
down 1.08-1.22x / 1.58x), the grid with the expert slot fastest (2-9 %), nibble pairs placed by one multiply (< 1 %,
noise), 4 stages, 64-row blocks at 4096 tokens. Below that the row block follows the routed rows (32 up to 1024
tokens, 64 up to 2048; :data:`PREFILL_ROW_TILES`, H200 runs 3 / 4: 1.31-1.81x over the 128-row tiles there).
:func:`prefill_default` says where this path is the faster one (:data:`PREFILL_DEFAULT_WHERE`). On compute capability
9 only, the 128- and 64-row tiles take ptxas register caps (:data:`WARPGROUP_MMA_REGISTER_CAPS`; more programs per
SM, 1.07-1.10x on the H100 at T = 1, 2, 4 and 8; on the H200 4805 / 1553 us at T = 1 / 4 against 5213 / 1719 uncapped
in run 26b, and no other tile of H200 prefill run 13 beats them); on sm_120a the same caps spill, so sm_12x runs the
uncapped tiles.

Byte planes (``PrefillConfig(planes=True)``, not a default; :data:`BYTE_PLANE_CANDIDATES`): the pair order joins
values of a word, a layout change that Triton makes through shared memory (the dequantised tile is stored and loaded
back in the MMA operand layout). On byte planes each 32-value group's 16 weight bytes give two MMA operands of K = 16
(the low nibbles are the group's even values, the high nibbles its odd ones) by elementwise int16 work only, so Triton
loads the bytes straight into the operand layout; x and the SwiGLU rows are stored in the matching order (within each
group the even values, then the odd ones). Same values bit for bit as the pair order's tiles; the sums differ only in
float32 order.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .dsv4 import HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, MXFP4_GROUP, SUPPORTED_TP, SWIGLU_LIMIT, TOP_K
from .harness.aot import SM120_ARCHS, AotConfig, check_register_cap, register_cap_option
from .harness.interpreter import cuda_capability_major, interpreter_enabled
from .moe_mxfp4 import (
    DECODE_MAX_ROWS,
    PAIRS_ACT_SCALE,
    PAIRS_ACT_SHIFT,
    _pairs_pointers,
    _pairs_position,
    _pairs_tile_scaled,
    _slot_expert_rows,
    _swiglu,
    _validate,
    launch_topk_sum,
    route,
    scale_bytes,
)

X_PAIRS_BLOCK = 4096  # x values one program of the pair-order copy writes
PLANES_BLOCK_K = (32, 64, 128)  # K steps of the byte-plane tile: 1, 2 or 4 groups of 32 (_grouped_tile_planes)


@dataclasses.dataclass(frozen=True)
class PrefillConfig:
    """One launch's tile: ``block_m`` routed rows per pass over an expert's sorted rows (the MMA's N side),
    ``block_n`` output columns per program (gate/up: SwiGLU columns, i.e. 2*block_n interleaved weight rows; the
    MMA's M side), ``block_k`` K values per step (a multiple of 32), warps and pipeline stages; ``max_registers``
    caps ptxas' registers per thread (Triton's ``maxnreg``; 0: no cap) so that more programs fit on an SM.
    ``planes``: the byte-plane weight operand (:func:`_grouped_tile_planes`) instead of the pair order's joined
    tile."""
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    max_registers: int = 0
    planes: bool = False

    def label(self) -> str:
        cap = f"r{self.max_registers}" if self.max_registers else ""
        planes = "p" if self.planes else ""
        return f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}s{self.num_stages}{cap}{planes}"

    def launch_options(self) -> dict:
        """The launch keywords of this tile (warps, stages, the register cap)."""
        return {"num_warps": self.num_warps, "num_stages": self.num_stages,
                **register_cap_option(self.max_registers)}

    def fitted(self, n_total: int, k_total: int) -> "PrefillConfig":
        """The tile clipped to a launch whose output has ``n_total`` columns and whose K is ``k_total``."""
        return dataclasses.replace(self, block_n=min(self.block_n, n_total), block_k=min(self.block_k, k_total))


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _x_pairs_kernel(x_ptr, x_pairs_ptr, numel, BLOCK: tl.constexpr, PLANES: tl.constexpr = False):
    """x [B, H] bf16 -> bf16 times 2**32 at the pair positions (exact), what the gate/up launch reads; PLANES: at the
    byte-plane positions (:func:`_planes_position`), what the byte-plane gate/up reads."""
    k = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = k < numel
    x = tl.load(x_ptr + k, mask=ok, other=0.0).to(tl.float32)
    position = _planes_position(k) if PLANES else _pairs_position(k)
    tl.store(x_pairs_ptr + position, (x * PAIRS_ACT_SCALE).to(tl.bfloat16), mask=ok)


@triton.jit
def _planes_position(k):
    """Index of value ``k`` of a row in the byte-plane order: within each 32-value group, the even values (the low
    nibbles of the group's 16 bytes) first, then the odd ones (the high nibbles)."""
    r = k % 32
    return k - r + 16 * (r % 2) + r // 2


@triton.jit
def _e2m1_bits_scaled(bits, factor, EMULATE: tl.constexpr):
    """int16 bf16 bit patterns of e2m1 values times 2**-126 -> bf16 times ``factor`` ([R, 1] bf16 powers of two,
    the E8M0 factor over 2**(PAIRS_ACT_SHIFT - 126)): exact while the product is a normal bf16 (E8M0 bytes
    34..160, as the pair forms). EMULATE: the product in float32 by bits (the CPU interpreter's bf16 arithmetic
    is wrong; the product is exact either way)."""
    if EMULATE:
        wide = ((bits.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
        f = ((factor.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
        return ((wide * f).to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return bits.to(tl.bfloat16, bitcast=True) * factor


@triton.jit
def _plane_factor(scale_bytes):
    """E8M0 bytes [R] -> bf16 [R, 1]: the factor over 2**(PAIRS_ACT_SHIFT - 126), in int16 arithmetic only (a
    widening or narrowing step between the loads and the MMA operand would make Triton convert the operand
    through shared memory); 255 (inf) where the exponent passes 255, as the pair forms' clamp."""
    exponent = (scale_bytes.to(tl.int16) & 0xFF) + (127 - 1 - PAIRS_ACT_SHIFT)
    exponent = (exponent | -(exponent >> 8)) & 0xFF
    return (exponent << 7).to(tl.bfloat16, bitcast=True)[:, None]


@triton.jit
def _plane_group(acc_t, q_ptrs, factor, a_ptrs, a_ok, EMULATE: tl.constexpr):
    """One 32-value group: the rows' 16 weight bytes at ``q_ptrs`` [R, 16] as the low-nibble (even values) and
    high-nibble (odd values) operands of K = 16, times the group's ``factor`` [R, 1] (:func:`_plane_factor`),
    against the activations at ``a_ptrs`` [BLOCK_M, 16] (even) and 16 further (odd)."""
    q = tl.load(q_ptrs).to(tl.int16)
    low = _e2m1_bits_scaled(((q & 0x8) << 12) | ((q & 0x7) << 6), factor, EMULATE)
    high = _e2m1_bits_scaled(((q & 0x80) << 8) | ((q & 0x70) << 2), factor, EMULATE)
    acc_t = tl.dot(low, tl.trans(tl.load(a_ptrs, mask=a_ok, other=0.0)), acc_t)
    return tl.dot(high, tl.trans(tl.load(a_ptrs + 16, mask=a_ok, other=0.0)), acc_t)


@triton.jit
def _grouped_tile_planes(a_ptrs, a_ok, w_ptr, s_ptr, expert, w_rows, rows_per_expert, k_total, ROWS: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EMULATE: tl.constexpr):
    """:func:`_grouped_tile` on byte planes: per 32-value group, the row's 16 weight bytes (``w_ptr`` int8
    [E, rows_per_expert, k_total/2]) give two operands of K = 16 by elementwise integer work only -- the low
    nibbles (the even values) and the high nibbles (the odd ones) as bf16 bits, times the group's E8M0 factor --
    against the group's 16 + 16 activations in the byte-plane order (``a_ptrs`` [BLOCK_M, 16] at group 0). With
    nothing but elementwise operations between the loaded bytes and the MMA, Triton loads the bytes straight into
    the MMA operand layout: no shared-memory round trip of the dequantised tile (the pair order joins values).
    BLOCK_K is 32, 64 or 128 (1, 2 or 4 groups a step); at 128 a row's E8M0 bytes of the step are 4 contiguous
    bytes, which Triton's pipeline fetches by cp.async with the weights (at 32 / 64 they are loaded in the step, a
    global round trip in each: for short K only)."""
    rows = (expert * rows_per_expert + w_rows.to(tl.int64))
    w_ptrs = w_ptr + rows[:, None] * (k_total // 2) + tl.arange(0, 16)[None, :]
    s_ptrs = s_ptr + rows * (k_total // 32)
    acc_t = tl.zeros([ROWS, BLOCK_M], dtype=tl.float32)
    groups: tl.constexpr = BLOCK_K // 32
    s_tile = s_ptrs[:, None] + tl.arange(0, BLOCK_K // 32)[None, :]
    for k0 in range(0, k_total, BLOCK_K):
        step_scales = tl.load(s_tile + k0 // 32)  # [ROWS, groups]: 4 bytes a row at BLOCK_K 128, cp.async's least
        if groups == 1:
            acc_t = _plane_group(acc_t, w_ptrs + k0 // 2, _plane_factor(tl.reshape(step_scales, [ROWS])),
                                 a_ptrs + k0, a_ok, EMULATE)
        elif groups == 2:
            s0, s1 = tl.split(step_scales)
            acc_t = _plane_group(acc_t, w_ptrs + k0 // 2, _plane_factor(s0), a_ptrs + k0, a_ok, EMULATE)
            acc_t = _plane_group(acc_t, w_ptrs + k0 // 2 + 16, _plane_factor(s1), a_ptrs + k0 + 32, a_ok, EMULATE)
        else:
            even, odd = tl.split(tl.reshape(step_scales, [ROWS, 2, 2]))  # groups (0, 2) and (1, 3)
            s0, s2 = tl.split(even)
            s1, s3 = tl.split(odd)
            acc_t = _plane_group(acc_t, w_ptrs + k0 // 2, _plane_factor(s0), a_ptrs + k0, a_ok, EMULATE)
            acc_t = _plane_group(acc_t, w_ptrs + k0 // 2 + 16, _plane_factor(s1), a_ptrs + k0 + 32, a_ok, EMULATE)
            acc_t = _plane_group(acc_t, w_ptrs + k0 // 2 + 32, _plane_factor(s2), a_ptrs + k0 + 64, a_ok, EMULATE)
            acc_t = _plane_group(acc_t, w_ptrs + k0 // 2 + 48, _plane_factor(s3), a_ptrs + k0 + 96, a_ok, EMULATE)
    return tl.trans(acc_t)


@triton.jit
def _grouped_tile(a_ptrs, a_ok, w_ptr, s_ptr, expert, w_rows, rows_per_expert, k_total, ROWS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EMULATE: tl.constexpr):
    """float32 [BLOCK_M, ROWS]: pair-ordered rows times 2**32 (``a_ptrs`` [BLOCK_M, BLOCK_K] at step 0, masked by
    ``a_ok``) times weight rows ``w_rows`` of ``expert`` (int32 words [E, rows_per_expert, k_total/8], E8M0 bytes
    [E, rows_per_expert, k_total/32]) over K = ``k_total``. The weight tile is the dequantised values over 2**32,
    so the products need no rescale. EMULATE: the pair-word scaling in float32 (the interpreter runs no PTX)."""
    w_ptrs, s_ptrs = _pairs_pointers(w_ptr, s_ptr, expert, w_rows, rows_per_expert, k_total, BLOCK_K)
    acc_t = tl.zeros([ROWS, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, k_total, BLOCK_K):
        w = _pairs_tile_scaled(tl.load(w_ptrs + k0 // 8), tl.load(s_ptrs + k0 // 32), ROWS, BLOCK_K, False, EMULATE)
        a = tl.load(a_ptrs + k0, mask=a_ok, other=0.0)
        acc_t = tl.dot(w, tl.trans(a), acc_t)
    return tl.trans(acc_t)


@triton.jit
def _prefill_gate_up_kernel(x_ptr, w13_ptr, w13_scale_ptr, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                            num_active_ptr, act_ptr, hidden, inter, swiglu_limit, TOP_K: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            EMULATE: tl.constexpr, PLANES: tl.constexpr = False,
                            ACT_PLANES: tl.constexpr = False):
    """Program (block of BLOCK_N intermediate columns, slot): its expert's routed rows BLOCK_M at a time against
    the 2*BLOCK_N interleaved gate/up rows, then the clamped SwiGLU into ``act [B*top_k, I]`` at the rows' sorted
    positions, bf16 times 2**32 in the pair order. ``x_ptr``: the pair-ordered copy of x times 2**32;
    ``w13_ptr``: the repacked weights as int32 words [E, 2I, H/8]. PLANES: the byte-plane tile
    (:func:`_grouped_tile_planes`, x in the byte-plane order); ACT_PLANES: the SwiGLU rows stored in the byte-plane
    order (for a byte-plane down launch)."""
    n_tile = tl.program_id(0)
    slot = tl.program_id(1)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    w_rows = n_tile * (2 * BLOCK_N) + tl.arange(0, 2 * BLOCK_N)
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    kx = tl.arange(0, 16 if PLANES else BLOCK_K)
    for m0 in range(row_begin, row_end, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        m_ok = m < row_end
        tokens = (tl.load(sorted_rows_ptr + m, mask=m_ok, other=0) // TOP_K).to(tl.int64)
        if PLANES:
            acc = _grouped_tile_planes(x_ptr + tokens[:, None] * hidden + kx[None, :], m_ok[:, None],
                                       w13_ptr.to(tl.pointer_type(tl.int8)), w13_scale_ptr, expert, w_rows,
                                       2 * inter, hidden, 2 * BLOCK_N, BLOCK_M, BLOCK_K, EMULATE)
        else:
            acc = _grouped_tile(x_ptr + tokens[:, None] * hidden + kx[None, :], m_ok[:, None], w13_ptr,
                                w13_scale_ptr, expert, w_rows, 2 * inter, hidden, 2 * BLOCK_N, BLOCK_M, BLOCK_K,
                                EMULATE)
        if ACT_PLANES:
            act_cols = _planes_position(cols)
        else:
            act_cols = _pairs_position(cols)
        gate, up = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
        act = _swiglu(gate, up, swiglu_limit).to(tl.bfloat16).to(tl.float32) * PAIRS_ACT_SCALE  # exact
        tl.store(act_ptr + m.to(tl.int64)[:, None] * inter + act_cols[None, :], act.to(tl.bfloat16),
                 mask=m_ok[:, None])


@triton.jit
def _prefill_down_kernel(act_ptr, w2_ptr, w2_scale_ptr, topk_weights_ptr, sorted_rows_ptr, expert_start_ptr,
                         active_experts_ptr, num_active_ptr, y_ptr, hidden, inter, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EMULATE: tl.constexpr,
                         PLANES: tl.constexpr = False):
    """Program (block of BLOCK_N hidden columns, slot): the expert's sorted SwiGLU rows BLOCK_M at a time times the
    down weights (int32 words [E, H, I/8]) and each row's routing weight, into fp32 ``y [B*top_k, H]`` at the
    routed row. PLANES: the byte-plane tile (the SwiGLU rows stored in that order by the gate/up launch)."""
    n_tile = tl.program_id(0)
    slot = tl.program_id(1)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    kx = tl.arange(0, 16 if PLANES else BLOCK_K)
    for m0 in range(row_begin, row_end, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        m_ok = m < row_end
        if PLANES:
            acc = _grouped_tile_planes(act_ptr + m.to(tl.int64)[:, None] * inter + kx[None, :], m_ok[:, None],
                                       w2_ptr.to(tl.pointer_type(tl.int8)), w2_scale_ptr, expert, n, hidden, inter,
                                       BLOCK_N, BLOCK_M, BLOCK_K, EMULATE)
        else:
            acc = _grouped_tile(act_ptr + m.to(tl.int64)[:, None] * inter + kx[None, :], m_ok[:, None], w2_ptr,
                                w2_scale_ptr, expert, n, hidden, inter, BLOCK_N, BLOCK_M, BLOCK_K, EMULATE)
        rows = tl.load(sorted_rows_ptr + m, mask=m_ok, other=0).to(tl.int64)
        weight = tl.load(topk_weights_ptr + rows, mask=m_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows[:, None] * hidden + n[None, :], acc * weight[:, None], mask=m_ok[:, None])


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------
# The 128-row tiles, from H200 run 1b (benchmarks/moe_prefill-h200-run1b.md; whole forwards, the other launch's
# tile fixed): gate/up m128n64k64w8s3 (4 stages 5313 vs 5279 us at T=1; m64n64k64w4s3 6241), down m128n64k64w4s3
# (5236 vs 5279 us for m128n128k64w8s3 at T=1, 1721 vs 1853 at T=4; m64n128k64w4s3 5639 / 1839, 4 stages 5353 / 1922).
DEFAULT_GATE_UP = PrefillConfig(128, 64, 64, 8, 3)
DEFAULT_DOWN = PrefillConfig(128, 64, 64, 4, 3)
SMALL_ROWS_TILE = PrefillConfig(32, 64, 64, 4, 3)
MEDIUM_ROWS_TILE = PrefillConfig(64, 64, 64, 4, 3)

# (most routed rows, gate/up tile, down tile), first match; above the last, DEFAULT_GATE_UP / DEFAULT_DOWN. Every
# program streams its expert's weights once per row block, so the row block should fit the rows an expert gets
# (routed rows / 256 experts on average): H200 run 3 (benchmarks/moe_prefill-h200-run3-summary.md), whole forwards in
# us at T = 1 / 4: 512 tokens (~12 rows per expert) m32 pair 2503 / 756 vs the 128-row pair 4508 / 1356; 1024 tokens
# (~24) m32 pair 2748 / 899 vs 4673 / 1446 (m64 gate/up 3757 / 1212, m64 down 4148 / 1265, each beside a 128-row
# partner); 2048 tokens (~48) m64 pair 3480 / 1139 vs 4893 / 1548 (m32 gate/up 4594 / 1465, m32 down 3989 / 1207,
# each beside m64); 4096 tokens (~96) the 128-row pair 5224 / 1719 (m64 gate/up 6229 / 1942, m64 down 5698 / 1836).
# Between those points (run 5, 1536 / 3072 tokens) the rule's tile won too: m64 3329 / 1072 vs m32 4328 / 1308, 128-row
# 5066 / 1635 vs m64 5819 / 1859.
PREFILL_ROW_TILES: tuple[tuple[int, PrefillConfig, PrefillConfig], ...] = (
    (1024 * TOP_K, SMALL_ROWS_TILE, SMALL_ROWS_TILE),
    (2048 * TOP_K, MEDIUM_ROWS_TILE, MEDIUM_ROWS_TILE),
)

# ptxas register caps (PrefillConfig.max_registers) of shipped tiles on compute capability 9 only
# (:func:`register_caps_measured`), keyed by (launch, tile): more programs per SM, no spills on sm_90a, where Triton
# feeds wgmma. 128-row class: gate/up 186 registers (one 8-warp program per SM) -> 128 (two); down 180 (two 4-warp
# programs) -> 164 at a cap of 168 (three). 64-row class: gate/up 218 (two) -> 162 at 168 (three); down 110 (four) ->
# 96 (five). H100 run 10 (benchmarks/moe_prefill-h100-run10-summary.md), whole forwards, uncapped vs capped pair, us:
# 4096 tokens 5274 vs 4852 (T = 1), 1765 vs 1623 (T = 4); 2048 tokens 3498 vs 3255, 1179 vs 1067; T = 2 / 8 (runs 10d /
# 10e) 4096 tokens 2924 vs 2694, 1201 vs 1108; 2048 tokens 2002 vs 1855, 793.6 vs 725.5 (1.075-1.105x everywhere). Not
# capped: the 32-row class (its down tile at 80 registers, six programs instead of five: 2786 vs 2754 us at 1024 tokens,
# T = 1; its gate/up tile spills at any cap that fits a fifth). On sm_120a these caps spill (128-row gate/up 788 bytes,
# down 196; 64-row gate/up 280, down 232), so sm_12x keeps the uncapped tiles. On the H200 (prefill run 12, stop 42;
# benchmarks/moe_mxfp4-h200-run34-summary.md) the 128-row pair capped 4805 / 1553 us at T = 1 / 4 (gate/up capped alone
# 5052 / 1655, down alone 4981 / 1612); run 13 found no other tile that beats it with the caps.
REGISTER_CAPS_MEASURED_CAPABILITY = 9
WARPGROUP_MMA_REGISTER_CAPS: dict[tuple[str, PrefillConfig], int] = {
    ("gate_up", DEFAULT_GATE_UP): 128,
    ("down", DEFAULT_DOWN): 168,
    ("gate_up", MEDIUM_ROWS_TILE): 168,
    ("down", MEDIUM_ROWS_TILE): 96,
}

# Byte-plane tiles (PrefillConfig.planes) for the 128-row class, not a default anywhere: no sm_12x GPU has timed them.
# On an H100 (run 9, benchmarks/moe_prefill-h100-run9-summary.md) they were 0.73-0.82x of the shipped tiles, as their
# sm_90a code predicts (below); sm_120 runs other code. AOT, Triton 3.8, no spills
# (`tools/moe_mxfp4_sass_loop.py --prefill`; K-loop SASS instructions of one warp per 128 K values). sm_120a: gate/up
# m128n64k128w8s2p 41472 B, 167 registers, 713 instructions for 128 HMMAs with 2 shared-memory stores, against the
# shipped m128n64k64w8s3's 65536 B, 226 registers, 922 instructions (232 MOVs a 64-K step) with 8 stores;
# m128n64k128w8s3p 82432 B / 173 / 726; down m128n128k128w8s2p 41472 B / 199 / 712 against the shipped m128n64k64w4s3's
# 45056 / 238 / 992. Not offered: tiles with 32 or 64 weight rows on 8 warps (m128n32 gate/up, m128n64 down), which
# decode each operand fragment in more warps (1709-1727 instructions for 64 HMMAs). On sm_90a the byte planes cost
# more than the pair order feeding wgmma through shared memory (gate/up 576 against 424), so the H200 may show a loss
# that says nothing about sm_120's mma.sync path. m128n64k128w8s2r128p (stop 41): the s2p gate/up tile capped at 128
# registers compiles on sm_120a to 126 registers, no spills, 714 instructions per 128 K values, so two 8-warp programs
# fit an SM (2 x 41472 B of shared memory) where the shipped tile (226 registers) and the uncapped s2p (167) fit one.
BYTE_PLANE_CANDIDATES: dict[str, tuple[PrefillConfig, ...]] = {
    "gate_up": (PrefillConfig(128, 64, 128, 8, 2, planes=True), PrefillConfig(128, 64, 128, 8, 3, planes=True),
                PrefillConfig(128, 64, 128, 8, 2, planes=True, max_registers=128)),
    "down": (PrefillConfig(128, 128, 128, 8, 2, planes=True),),
}

# (per-rank I, fewest routed rows) where this forward replaces moe_mxfp4_forward's tl.dot_scaled prefill: every row
# count above the decode's (DECODE_MAX_ROWS). H200 run 2 (benchmarks/moe_prefill-h200-run2-summary.md), whole forwards
# at 1024 / 2048 / 4096 tokens x top-6 with the 128-row tiles, new vs old us: I = 2048 (T=1) 4675 vs 6486, 4898 vs 6884,
# 5242 vs 8819; I = 1024 (T=2) 2516 vs 3409, 2668 vs 3648, 2872 vs 4729; I = 512 (T=4) 1441 vs 1879, 1548 vs 1999, 1715
# vs 2635; I = 256 (T=8) 905 vs 1114, 990 vs 1202, 1131 vs 1601 (1.21-1.68x); run 4 (moe_prefill-h200-run3-summary.md)
# with PREFILL_ROW_TILES at 512 / 1024 / 2048 tokens at every T: 1.58-2.47x over the old path; run 6
# (moe_prefill-h200-run6-summary.md) at 384 / 448 tokens (2304 / 2688 rows), T = 1 / 4: 2468 vs 6118, 2485 vs 6151,
# 743 vs 1758, 749 vs 1761 us (2.35-2.48x).
PREFILL_DEFAULT_WHERE: tuple[tuple[int, int], ...] = tuple((MOE_INTERMEDIATE_SIZE // tp, DECODE_MAX_ROWS + 1)
                                                           for tp in SUPPORTED_TP)


def prefill_default(num_rows: int, inter: int) -> bool:
    """Whether the H200 measured :func:`moe_mxfp4_prefill_forward` faster than ``moe_mxfp4_forward``'s prefill
    path at ``num_rows`` routed rows and per-rank intermediate size ``inter`` (:data:`PREFILL_DEFAULT_WHERE`:
    those I from the measured row count up)."""
    if num_rows <= DECODE_MAX_ROWS:
        return False
    return any(inter == where_inter and num_rows >= min_rows for where_inter, min_rows in PREFILL_DEFAULT_WHERE)


def register_caps_measured(device=None) -> bool:
    """Whether ``device`` is a GPU of the compute capability the register caps of :data:`WARPGROUP_MMA_REGISTER_CAPS`
    were timed on (9.x: H100 / H200, warpgroup MMA). No device, the CPU or any other GPU (sm_12x, where the same caps
    spill): False. The sm_12x dispatch check (tools/device_sm120_dispatch.py) answers this query as sm_12x does."""
    return cuda_capability_major(device) == REGISTER_CAPS_MEASURED_CAPABILITY


def prefill_configs(num_rows: int, inter: int, device=None) -> tuple[PrefillConfig, PrefillConfig]:
    """The (gate/up, down) tiles the forward uses when not told: the row block by routed rows
    (:data:`PREFILL_ROW_TILES`), the same at every per-rank I (clipped to it by the forward); on a GPU where the
    register caps were measured (:func:`register_caps_measured`) with the caps of
    :data:`WARPGROUP_MMA_REGISTER_CAPS` (at every T)."""
    tiles = (DEFAULT_GATE_UP, DEFAULT_DOWN)
    for max_rows, gate_up, down in PREFILL_ROW_TILES:
        if num_rows <= max_rows:
            tiles = (gate_up, down)
            break
    if not register_caps_measured(device):
        return tiles
    return tuple(dataclasses.replace(cfg, max_registers=WARPGROUP_MMA_REGISTER_CAPS.get((kind, cfg), 0))
                 for kind, cfg in zip(("gate_up", "down"), tiles))


def _check_config(name: str, cfg, n_total: int, k_total: int) -> PrefillConfig:
    if not isinstance(cfg, PrefillConfig):
        raise ValueError(f"{name} must be a PrefillConfig, got {type(cfg).__name__}")
    cfg = cfg.fitted(n_total, k_total)
    pow2 = all(v > 0 and v & (v - 1) == 0 for v in (cfg.block_m, cfg.block_n, cfg.block_k))
    if not pow2 or cfg.block_m < 16 or cfg.block_n < 16 or cfg.block_k < MXFP4_GROUP:
        raise ValueError(f"{name}: block_m/block_n/block_k must be powers of two >= 16/16/32, got {cfg}")
    if n_total % cfg.block_n or k_total % cfg.block_k:
        raise ValueError(f"{name}: block_n {cfg.block_n} must divide {n_total} and block_k {cfg.block_k} must "
                         f"divide K = {k_total}")
    if cfg.planes and cfg.block_k not in PLANES_BLOCK_K:
        raise ValueError(f"{name}: the byte-plane tile takes block_k in {PLANES_BLOCK_K}, got {cfg.block_k}")
    check_register_cap(f"{name}: max_registers", cfg.max_registers)
    return cfg


def moe_mxfp4_prefill_forward(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                              w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                              swiglu_limit: float = SWIGLU_LIMIT, out: torch.Tensor | None = None,
                              config: tuple[PrefillConfig, PrefillConfig] | None = None) -> torch.Tensor:
    """Routed-expert MoE on repacked MXFP4 weights (:func:`moe_mxfp4.repack_w13_`) as a grouped GEMM pair: bf16
    ``[B, H]``, the contract of ``moe_mxfp4_forward`` (``topk_weights`` carry any routed scaling; ids outside
    ``[0, E)`` contribute nothing). ``config``: (gate/up, down) :class:`PrefillConfig`, default
    :func:`prefill_configs`. Any number of routed rows works; it is meant for more than DECODE_MAX_ROWS."""
    batch, hidden, num_experts, inter = _validate(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids)
    top_k = topk_ids.shape[1]
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != torch.bfloat16 or not out.is_contiguous() or out.device != x.device:
        raise ValueError(f"out must be contiguous bf16 {tuple(x.shape)} on {x.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    if config is None:
        config = prefill_configs(batch * top_k, inter, x.device)
    if not isinstance(config, (tuple, list)) or len(config) != 2:
        raise ValueError(f"config must be a (gate_up, down) pair of PrefillConfig, got {config!r}")
    gu = _check_config("config[0] (gate/up)", config[0], inter, hidden)
    dn = _check_config("config[1] (down)", config[1], hidden, inter)
    num_rows = batch * top_k
    if num_rows == 0:
        return out.zero_()  # top_k = 0: no expert, the sum over none (B = 0: nothing to write)
    device = x.device
    ids = topk_ids.contiguous()
    weights = topk_weights.contiguous()
    sorted_rows, expert_start, active_experts, num_active = route(ids, num_experts)
    slots = min(num_rows, num_experts)
    emulate = interpreter_enabled()
    x_pairs = torch.empty_like(x)  # in the pair or the byte-plane order, as the gate/up tile reads it
    _x_pairs_kernel[(triton.cdiv(x.numel(), X_PAIRS_BLOCK),)](x, x_pairs, x.numel(), BLOCK=X_PAIRS_BLOCK,
                                                              PLANES=gu.planes, num_warps=4)
    act = torch.empty(num_rows, inter, dtype=torch.bfloat16, device=device)  # at sorted positions
    y = torch.empty(num_rows, hidden, dtype=torch.float32, device=device)  # at routed rows
    _prefill_gate_up_kernel[(inter // gu.block_n, slots)](
        x_pairs, w13.view(torch.int32), scale_bytes(w13_scale), sorted_rows, expert_start, active_experts, num_active,
        act, hidden, inter, float(swiglu_limit), TOP_K=top_k, BLOCK_M=gu.block_m, BLOCK_N=gu.block_n,
        BLOCK_K=gu.block_k, EMULATE=emulate, PLANES=gu.planes, ACT_PLANES=dn.planes, **gu.launch_options())
    _prefill_down_kernel[(hidden // dn.block_n, slots)](
        act, w2.view(torch.int32), scale_bytes(w2_scale), weights, sorted_rows, expert_start, active_experts,
        num_active, y, hidden, inter, BLOCK_M=dn.block_m, BLOCK_N=dn.block_n, BLOCK_K=dn.block_k, EMULATE=emulate,
        PLANES=dn.planes, **dn.launch_options())
    launch_topk_sum(y, ids, out, num_experts)
    return out


# ---------------------------------------------------------------------------------------------
# AOT (sm_120a / sm_121a)
# ---------------------------------------------------------------------------------------------
_COMMON_SIG = {"sorted_rows_ptr": "*i32", "expert_start_ptr": "*i32", "active_experts_ptr": "*i32",
               "num_active_ptr": "*i32", "hidden": "i32", "inter": "i32", "BLOCK_M": "constexpr",
               "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "EMULATE": "constexpr", "PLANES": "constexpr"}
_GATE_UP_SIG = {"x_ptr": "*bf16", "w13_ptr": "*i32", "w13_scale_ptr": "*u8", "act_ptr": "*bf16", "swiglu_limit": "fp32",
                "TOP_K": "constexpr", "ACT_PLANES": "constexpr", **_COMMON_SIG}
_DOWN_SIG = {"act_ptr": "*bf16", "w2_ptr": "*i32", "w2_scale_ptr": "*u8", "topk_weights_ptr": "*fp32",
             "y_ptr": "*fp32", **_COMMON_SIG}


def aot_config(kind: str, cfg: PrefillConfig, note: str = "", warpgroup_mma: bool = False) -> AotConfig:
    """The AotConfig of one launch, ``kind`` "gate_up" or "down" (a byte-plane gate/up stores its SwiGLU rows in
    the byte-plane order, as beside a byte-plane down). ``warpgroup_mma``: a tile shipped for compute capability 9
    only (:data:`WARPGROUP_MMA_REGISTER_CAPS`), compiled for sm_90a and expected to use wgmma there."""
    constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "EMULATE": False,
                  "PLANES": cfg.planes}
    if kind == "gate_up":
        kernel, sig = _prefill_gate_up_kernel, _GATE_UP_SIG
        constexprs.update(TOP_K=TOP_K, ACT_PLANES=cfg.planes)
    else:
        kernel, sig = _prefill_down_kernel, _DOWN_SIG
    return AotConfig(name=f"moe_prefill_{kind}_{cfg.label()}", kernel=kernel, signature=sig, constexprs=constexprs,
                     num_warps=cfg.num_warps, num_stages=cfg.num_stages, max_registers=cfg.max_registers,
                     div16=("hidden", "inter"),
                     expect_opcodes=("HGMMA",) if warpgroup_mma else ("HMMA.16816.F32.BF16",),
                     archs=(REGISTER_CAPS_MEASURED_CAPABILITY * 10,) if warpgroup_mma else SM120_ARCHS, note=note)


def aot_configs() -> list[AotConfig]:
    """The shipped (gate/up, down) tiles of every row class of :data:`PREFILL_ROW_TILES` at every per-rank I of
    SUPPORTED_TP (clipped as the forward clips them), then the byte-plane candidates (:data:`BYTE_PLANE_CANDIDATES`,
    none a default yet), which must compile within sm_120's limits before a device run times them, then the
    register-capped tiles of compute capability 9 (:data:`WARPGROUP_MMA_REGISTER_CAPS`), checked for sm_90a only."""
    row_classes = [max_rows for max_rows, _, _ in PREFILL_ROW_TILES] + [PREFILL_ROW_TILES[-1][0] + 1]
    configs, seen = [], set()
    for tp in SUPPORTED_TP:
        inter = MOE_INTERMEDIATE_SIZE // tp
        for num_rows in row_classes:
            gu, dn = prefill_configs(num_rows, inter)
            for kind, cfg in (("gate_up", gu.fitted(inter, HIDDEN_SIZE)), ("down", dn.fitted(HIDDEN_SIZE, inter))):
                if (kind, cfg) not in seen:
                    seen.add((kind, cfg))
                    configs.append(aot_config(kind, cfg))
    for kind, cfgs in BYTE_PLANE_CANDIDATES.items():
        configs.extend(aot_config(kind, cfg, note="byte-plane candidate, not a default") for cfg in cfgs)
    for (kind, cfg), cap in WARPGROUP_MMA_REGISTER_CAPS.items():
        for tp in SUPPORTED_TP:
            inter = MOE_INTERMEDIATE_SIZE // tp
            capped = dataclasses.replace(cfg, max_registers=cap)
            capped = capped.fitted(inter, HIDDEN_SIZE) if kind == "gate_up" else capped.fitted(HIDDEN_SIZE, inter)
            if (kind, capped) not in seen:
                seen.add((kind, capped))
                configs.append(aot_config(kind, capped, note="compute capability 9 only (spills on sm_120a)",
                                          warpgroup_mma=True))
    return configs
