"""MXFP4 routed experts of DeepSeek-V4-Flash in Triton: the ``sm120`` MoE runner's kernels.

Checkpoint layout (SGLang 0.5.23 ``Fp8MoEMethod.create_weights`` with FP4 experts; see
``shared/reference/dsv4-flash-in-sglang-0.5.23.md`` §1.1):

* ``w13 [E, 2I, H/2]`` int8: two e2m1 values per byte along K=H, element ``2j`` in the low nibble
  and ``2j+1`` in the high nibble; rows ``[0, I)`` are the gate projection (w1) and ``[I, 2I)``
  the up projection (w3), the order SGLang's loader writes when the quant method does not ask for
  ``load_up_proj_weight_first``;
* ``w13_scale [E, 2I, H/32]`` E8M0 (one byte, value ``2**(byte-127)``) per 32 values along K;
* ``w2 [E, H, I/2]`` and ``w2_scale [E, H, I/32]`` likewise for the down projection (K=I).

After loading, :func:`repack_w13_` permutes the w13 rows (and their scales) in place to
``gate_0, up_0, gate_1, up_1, ...`` so one contiguous tile holds both halves of the SwiGLU for a
block of intermediate columns; nothing else is copied. :func:`unpack_w13_` is its inverse.

One forward (:func:`moe_mxfp4_forward`) is four launches (:data:`LAUNCHES_PER_FORWARD`), all CUDA-graph capturable (no host
sync, scratch sized by shapes only):

1. ``_route_kernel`` (one program): sorts the ``B*top_k`` routed rows by expert (stable), and
   lists the experts actually touched;
2. ``_gate_up_kernel``: grid (touched expert slot, block of I). Each program streams its expert's
   gate+up weight tile once, upcasts e2m1 x E8M0 to bf16 (exact) -- one of :data:`UPCASTS`,
   :func:`default_upcast` picks per shape from the H200 numbers (below) --
   multiplies all rows routed to that expert on tensor cores (bf16 MMA, fp32 accumulate) and applies
   the clamped SwiGLU, ``silu(min(g, limit)) * clamp(u, -limit, limit)``; writes bf16 activations;
3. ``_down_kernel``: grid (touched expert slot, block of H): down projection the same way, times
   the routing weight, fp32 rows;
4. ``_topk_sum_kernel``: sums each token's top-k rows into the bf16 output.

CUDA-core GEMV decode (``upcast="gemv"``, :data:`GEMV_DEFAULT_WHERE`): launches 2 and 3 become
``_gate_up_gemv_kernel`` / ``_down_gemv_kernel`` (grid: touched expert slot, block of output columns),
which use no tensor core: each program streams its weight rows as int32 words in 16-byte loads, turns
nibble pairs into exact float32 values with a few bit operations, multiplies them with one routed row's
activations broadcast along the rows, reduces along K inside each thread and applies the E8M0 scale once
per 32-value group (:func:`_gemv_group_sums`); same row order, clamped SwiGLU, routing weight and top-k
sum, still four launches. It re-streams the block once per routed row (optionally two rows per pass,
``GemvConfig.two_rows``), so it wins only at few rows per expert: on the H200 1.34x / 1.26x over the tl.dot
decode at I = 2048 (T=1), B = 1 / 8, and 1.62x / 1.83x / 1.08x at I = 512 (T=4), B = 1 / 8 / 64, and loses
at I = 2048, B >= 64 and at B = 256 (``benchmarks/moe_mxfp4-h200-gemv.md``); it is the default exactly at
those measured wins. Optional forms (``GemvConfig``): ``split_k`` (gate/up fp32
partials + ticket; down partial outputs that the top-k sum adds, still four launches) and ``prefetch``
(next K step loaded before this step's arithmetic); both measured slower in round 2 and are not defaults
(``benchmarks/moe_mxfp4-h200-gemv2.md``, which also breaks B = 1 down by launch: :func:`gemv_launches`).
``x_f32`` (round 3): the routing launch also writes x as float32 times 2**32 in the word-pair order and
the gate/up epilogue writes the SwiGLU rows so, and the nibble pairs are placed by one multiply -- 4.3
instead of 5.7 sm_120a SASS instructions per weight value (gate/up n8k512w4) -- still four launches; on
the H200 1.05x at I = 512, B = 1 (the default there, :data:`GEMV_X_F32_WHERE`) but slower at I = 2048
(at best 4 % at B = 1; ``benchmarks/moe_mxfp4-h200-gemv3.md``). ``tma_ring`` (round 8b): each K step's
weight words, scale bytes and activation words arrive by TMA (host ``TensorDescriptor``s) through a ring of
shared-memory stages (``_gate_up_gemv_tma_kernel`` / ``_down_gemv_tma_kernel``, one routed row per pass, K
steps of 512); with 3 stages 1.09-1.29x faster on the H200 at T = 1 / 4, B = 1..16 / 1..8 and the GEMV default
there, and at T = 2, B = 1..16 (1.13-1.49x over the pairs decode) (:data:`GEMV_TMA_WHERE`,
``benchmarks/moe_mxfp4-h200-run7-tma-summary.md``, ``-run8-tma-t2.md``).

Tensor-core pairs decode (``upcast="pairs"``, round 4, :data:`PAIRS_DEFAULT_WHERE`): launches 1-3 become
``_route_pairs_kernel`` (routing + x as bf16 times 2**32 in the *pair order*), ``_gate_up_pairs_kernel`` and
``_down_pairs_kernel`` (grid: touched expert slot, block of output columns). Each int32 weight word becomes
four bf16 pairs (nibbles j and j+4, exact values times 2**-126) with a few integer instructions per two
values, and goes into a bf16 MMA with the weights as the M side and up to 16 routed rows as N (one weight
pass per 16 routed rows of an expert); the E8M0 scale multiplies each 32-group's MMA result (FFMA), the
weight loads are cp.async-pipelined. sm_120a SASS: 6.4 instructions per weight value in the gate/up loop
(n32k128w4, mul pairs; split_bf16 8.4 at the same tile, the GEMV 5.7 but one pass per routed row). On the
H200 it reached ~1.0 TB/s at B >= 32 and was the fastest only at I = 512 (T=4), B = 64 (666.5 vs 769.5 us);
slower elsewhere -- at B <= 8 too few programs and a barrier per 32-group, at I = 2048 slower than
split_bf16 (``benchmarks/moe_mxfp4-h200-run2.md``). ``PairsConfig(scale_bf16=True)`` (round 5, the
pairs default) multiplies the pair words by the E8M0 factor in packed bf16 instead, so a K step is one
MMA (sm_120a: 5.3 instead of 6.4 instructions per value, 16-byte weight loads; sm_90a: wgmma); exact for
E8M0 bytes 34..160 (inf above 160; below 34, i.e. scales under 2**-93, the factor leaves the normal bf16
range and the products lose bits -- both far outside checkpoint scales; the seam checks each layer's bytes at load
and passes ``wide_scales`` to keep such a layer off these forms, :data:`PAIRS_EXACT_SCALE_BYTES`). On the H200 it
is 1.2-1.9x faster than the previous defaults from B = 16 to 256 at T = 1 and 4 and from B = 1 to 64 at T = 2 and 8,
1.04-1.29x at B = 9..15 (T = 1 and 4) and 1-2 % at B = 8 (T = 1), and the default there
(:data:`PAIRS_DEFAULT_WHERE`; ``benchmarks/moe_mxfp4-h200-run3.md``, ``run4a/b.md``, ``run5.md``, ``run5b.md``).
Round 7 (``run5.md``): the E8M0 scales as cp.async-pipelined int32 words, with the factor on the pair words
in registers or in inline PTX, were 1.3x / 3.5-4.3x slower; 8 warps on twice the rows and 2 stages 6-15 %
slower (``run5c.md``). ``PairsConfig(tma_ring=)`` (round 15, swap-AB fed by TMA): the weight words and scale bytes
of each K step arrive by TMA through a ring (``_gate_up_pairs_tma_kernel`` / ``_down_pairs_tma_kernel``), on 16-32
weight rows per program with one warp per 16 rows (more warps than 16-row MMA tiles repeat the dequantisation);
1.09-1.30x at T = 1, B = 4..64 and 1.16-1.20x at T = 4, B = 16..64 on the H200 and the default there
(:data:`PAIRS_TMA_WHERE`, ``benchmarks/moe_mxfp4-h200-run15-summary.md``). The mixed forward (run 15c: a TMA
``PairsConfig`` gate/up and a TMA ``GemvConfig`` down): the swap-AB gate/up launch stores natural-order bf16 SwiGLU
rows (``NATURAL_ACT``) for the TMA GEMV down launch; 1.02-1.14x at T = 1, B = 2 / 5 / 6 and T = 4, B = 4 / 5 / 6 / 8
and the default there (:data:`PAIRS_GEMV_DOWN_WHERE`, ``benchmarks/moe_mxfp4-h200-run15c-summary.md``).
``GemvConfig(f16=True)`` (round 16, the TMA GEMV's fp16 pair decode): fp16 pair words from the nibbles and packed
``fma.rn.f16x2`` against activations prepared once per call as scaled fp16 pairs (:func:`_f16_word_dot`); 1.03-1.36x
on the H200 at T = 1, B = 1 / 2 / 4 / 8 and T = 4, B = 1 / 2 / 8 and the default there, taking some of those points
from the mixed forward and swap-AB (:data:`GEMV_TMA_F16_WHERE`, ``benchmarks/moe_mxfp4-h200-run16-summary.md``).
Run 16b: on twice (at three points 4x) the rows per program it is the default at T = 1 / 2 / 4, B = 1..32, 1.08-1.57x
over the defaults it replaced (``benchmarks/moe_mxfp4-h200-run16b-summary.md``).
Run 17 (``GemvConfig(pdl=True)``): the fp16 TMA GEMV forward's four launches with programmatic dependent launch (each
program waits before its first read of an earlier launch's output and its first store, and triggers its dependents
right after; ``pdl_l2``: each down program prefetches its weight block into L2 before its wait, its expert known from
the completed routing); in chains of forwards 1.02-1.17x on the H200 at T = 1 B <= 4, T = 2 B <= 8 (with the prefetch)
and T = 4 B <= 16 but 15 (with the prefetch) and the default there (:data:`GEMV_PDL_WHERE`,
``benchmarks/moe_mxfp4-h200-run17-summary.md``).
Run 18 (``PairsConfig(sub_k=)``: a TMA K step of 512 as 2 or 4 MMAs): the swap-AB forward with its down launch on 32
rows / 2 warps and MMAs of 128 was the default at T = 1 / 4, B = 48..256 (1.035-1.304x on the H200;
``benchmarks/moe_mxfp4-h200-run18-summary.md``). Runs 20 / 20b (``PairsConfig(block_m=8)``: 8 routed rows per MMA pass,
64 weight rows per 2-warp program): at T = 1 / 4, B = 16..256 the tiles of :data:`PAIRS_TMA_ROWS_WHERE`, 1.05-1.49x
over the defaults they replaced (the fp16 GEMV at B = 16..32; T=1 B=64 1089.6 -> 878.4 us;
``benchmarks/moe_mxfp4-h200-run20-summary.md``). Run 21: the same decode at T=1 B = 12..15 and, with 16 routed rows per
pass in both launches, past B = 256 up to :data:`PAIRS_MAX_ROWS` (640 tokens) at T = 1 / 4, where the tl.dot decode and
the grouped GEMM ran (1.17-2.59x; ``benchmarks/moe_mxfp4-h200-run21-summary.md``). Stop 42: on compute capability 9
only, the T=4 8-row down tile capped at 128 registers (:data:`PAIRS_REGISTER_CAPS`; 8 instead of 7 programs per SM,
1.023-1.032x at B = 16..256; ``benchmarks/moe_pairs_caps-h200-run1-summary.md``).

Split-K decode (``split_k``, :func:`default_split_k`): the same four launches with the K loops cut
into splits, for more independent programs at small B. Gate/up programs (slot, n block, split) write
fp32 partials to a shape-sized scratch; the last of a (slot, n block)'s splits to take its ticket (an
int32 counter kept per device and left zeroed) sums them and applies the SwiGLU. Down programs
(slot, n block, split) atomically add their weighted rows into a fp32 ``[B, H]`` that the gate/up
programs zeroed (this is the top-k sum), and launch 4 becomes the bf16 cast. On the H200 split (2, 2)
was up to 18 % faster than the unsplit path at I = 512 (T=4), B = 1 (39.7 vs 46.9 us) and 2-5 % at
I = 2048, B = 8 and 64, but slower at I = 2048, B = 1 and at I = 512, B = 8 and 64
(``benchmarks/moe_mxfp4-h200-splitk.md``); it is the default exactly at those measured wins
(:data:`SPLIT_K_DEFAULT_WHERE`), the unsplit path everywhere else. The latency is not mainly a
too-small grid: even split 2-4x the decode stays at 10-31 % of the copy bandwidth.

The same kernels serve decode (``BLOCK_M`` 16: every weight byte read once per step) and prefill
(``BLOCK_M`` 128/64: a grouped GEMM, weights re-read from L2 per row block). Routing: one Triton
program up to ``ROUTE_TRITON_MAX_ROWS`` routed rows, a torch sort beyond (prefill); the pairs decode's routing launch
sorts up to ``PAIRS_MAX_ROWS`` in one program.
Weight upcast (``upcast``, :data:`UPCASTS`): ``split_bf16`` -- :func:`_dequant_nibble_tiles` builds the
low nibbles (even k) and high nibbles (odd k) as two bf16 tiles with a few integer ops and two packed
bf16 multiplies per pair of values and multiplies them with the even and odd activation columns, so
the weights are never interleaved -- is the default for decode at I = 2048 (T=1): on the H200 it was
12-18 % faster than ``tl.dot_scaled`` at B = 1, 8, 64 (``benchmarks/moe_mxfp4-h200-dequant.md``; 482
vs 555 SASS instructions per K step of the sm_90 decode gate/up loop, 535 vs 490 on sm_120 where
Triton's own upcast is leaner). At I = 512 (T=4) it was 5 % faster at B=1 but 7 % slower than the
register dequantisation at B = 8, 64, so smaller I keep the earlier choice (:func:`use_dot_scaled`:
``tl.dot_scaled`` at I >= 1024 and for prefill, ``regs`` below); T=2 and T=8 are not measured.
Edge semantics: an E8M0 byte 0 gives 0 instead of upstream's 2**-127 on the ``tl.dot_scaled`` path
(Triton 3.8, triton#11737) -- no checkpoint scale is that small; the split-nibble upcasts give
upstream's float32 values for every byte (2**-127 for byte 0, inf/NaN for 255). ``ACT_MXFP8`` selects the
alternative prefill GEMM that was compared against bf16 activations: activations quantised to
MXFP8 (e4m3 + E8M0 per 32) by :func:`quantize_mxfp8`, weights widened e2m1 -> e4m3 (exact) in
registers, and ``tl.dot_scaled`` (native ``QMMA.SF`` on sm_120). See ``benchmarks/moe_mxfp4-h200.md``
for why the shipped path is bf16.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import triton
import triton.language as tl

from .dsv4 import (
    HIDDEN_SIZE,
    MOE_INTERMEDIATE_SIZE,
    MXFP4_E8M0_BIAS,
    MXFP4_GROUP,
    NUM_EXPERTS,
    SUPPORTED_TP,
    SWIGLU_LIMIT,
    TOP_K,
)
from .harness.aot import TENSOR_CORE_OPCODES, AotConfig, check_register_cap, register_cap_option
from .harness.interpreter import cuda_capability_major, has_capability, interpreter_enabled
from .pdl import PDL_OPCODES, pdl_launch_dependents, pdl_supported, pdl_wait

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude codes 0..7; bit 3 is the sign
E4M3_MAX = 448.0
E2M1_UNBIAS: tl.constexpr = tl.constexpr(2.0 ** 126)  # bits e2m1 << 22 (fp32) / << 6 (bf16) are e2m1 * 2**-126
# SPLIT_NIBBLES values of the GEMM kernels (0: the weight upcast is tl.dot_scaled or the interleaving
# register dequantisation, per DOT_SCALED)
SCALE_MATH_F32 = 1
SCALE_MATH_BF16 = 2
ZERO_BLOCK: tl.constexpr = tl.constexpr(1024)  # floats one gate/up program zeroes per step (split-K down output)


# ---------------------------------------------------------------------------------------------
# float32 references (the specification)
# ---------------------------------------------------------------------------------------------
def reference_dequant_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``[..., N, K/2]`` packed e2m1 + ``[..., N, K/32]`` E8M0 -> float32 ``[..., N, K]``.

    Same arithmetic as SGLang's ``fp8_utils.dequant_mxfp4`` / ``MXFP4QuantizeUtil.dequantize``:
    low nibble is the even element, value ``sign * E2M1[mag] * exp2(byte - 127)`` in float32.
    """
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    return _dequant_mxfp4(packed, scale, lambda mag: table[mag.long()])


def _dequant_mxfp4(packed: torch.Tensor, scale: torch.Tensor, magnitudes) -> torch.Tensor:
    """The MXFP4 dequantisation around ``magnitudes`` (e2m1 magnitude codes 0..7 -> their float32 values): nibbles
    split low (even element) then high, bit 3 the sign, times ``exp2(byte - 127)`` per 32 along K."""
    codes = packed.view(torch.uint8)
    nibbles = torch.stack((codes & 0x0F, codes >> 4), dim=-1).flatten(-2)  # [..., N, K]
    sign = 1.0 - 2.0 * ((nibbles & 0x8) >> 3).to(torch.float32)
    values = sign * magnitudes(nibbles & 0x7)
    factor = torch.exp2(scale_bytes(scale).to(torch.float32) - MXFP4_E8M0_BIAS)
    values = values.unflatten(-1, (-1, MXFP4_GROUP)) * factor.unsqueeze(-1)
    return values.flatten(-2)


def scale_bytes(scale: torch.Tensor) -> torch.Tensor:
    """The E8M0 bytes of a scale tensor stored as ``float8_e8m0fnu`` or ``uint8``."""
    if scale.dtype == torch.uint8:
        return scale
    if scale.dtype == getattr(torch, "float8_e8m0fnu", None):
        return scale.view(torch.uint8)
    raise ValueError(f"scale must be float8_e8m0fnu or uint8 E8M0 bytes, got {scale.dtype}")


def reference_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """DSv4's clamped SwiGLU as SGLang applies it (``swiglu_limit_func``)."""
    if limit > 0:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return torch.nn.functional.silu(gate) * up


def reference_moe_mxfp4(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                        swiglu_limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """float32 ``[B, H]``: ``sum_k w[t,k] * W2[e] @ swiglu(W13[e] @ x[t])`` with ``e = ids[t,k]``.

    Weights in the checkpoint layout (w13 rows ``[gate; up]``); ids outside ``[0, E)`` add nothing.
    """
    batch, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    out = torch.zeros(batch, hidden, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(topk_ids).tolist():
        if not 0 <= e < num_experts:
            continue
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        gate_up = xf[tok] @ reference_dequant_mxfp4(w13[e], w13_scale[e]).T
        act = reference_swiglu(gate_up[:, :inter], gate_up[:, inter:], swiglu_limit)
        down = act @ reference_dequant_mxfp4(w2[e], w2_scale[e]).T
        out.index_add_(0, tok, down * topk_weights[tok, slot].float().unsqueeze(1))
    return out


def dequant_mxfp4_in_graph(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32,
                           byte_values: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`reference_dequant_mxfp4`'s values, bit for bit (``dtype`` bfloat16: its float32 values rounded to bf16,
    also bit for bit), from device arithmetic alone (no value table copied from the host), so that it can run inside
    CUDA-graph capture. A 256-entry table of each packed byte's two values is built on the device
    (:func:`e2m1_byte_values`) and gathered once per byte, then the E8M0 factor applied per 32: a few passes over the
    weight instead of one per arithmetic step (H200 fallbacks run 1: about 1.2-1.5 ms per T=1 expert with the
    per-nibble arithmetic). ``byte_values``: that
    table (:func:`e2m1_byte_values`) when the caller dequantises many weights in a row."""
    codes = packed.view(torch.uint8)
    table = (e2m1_byte_values(codes.device) if byte_values is None else byte_values).to(dtype)  # exact in bf16
    values = table.index_select(0, codes.reshape(-1).to(torch.int32)).reshape(*codes.shape[:-1], 2 * codes.shape[-1])
    # a power of two (or inf at byte 255) is exact in bf16 too; torch multiplies bf16 in float32 and rounds once, as
    # the float32 product's cast to bf16 does
    factor = torch.exp2(scale_bytes(scale).to(torch.float32) - MXFP4_E8M0_BIAS).to(dtype)
    return (values.unflatten(-1, (-1, MXFP4_GROUP)) * factor.unsqueeze(-1)).flatten(-2)


def e2m1_byte_values(device) -> torch.Tensor:
    """float32 ``[256, 2]``: the e2m1 values of a packed byte's low (even element) and high nibble, by
    :func:`_dequant_mxfp4` on every byte at scale 1 with the magnitudes computed on the device (capturable)."""
    every_byte = torch.arange(256, dtype=torch.uint8, device=device).reshape(1, 256)
    unit_scale = torch.full((1, 2 * 256 // MXFP4_GROUP), MXFP4_E8M0_BIAS, dtype=torch.uint8, device=device)
    return _dequant_mxfp4(every_byte, unit_scale, _e2m1_magnitudes).reshape(256, 2)


def _e2m1_magnitudes(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 magnitude codes 0..7 -> float32 by arithmetic: ``m / 2`` below 2 (subnormal), ``2^(m/2 - 1) * (1 + (m & 1) /
    2)`` from 2 on."""
    mag = codes.to(torch.float32)
    exponent = torch.floor(mag * 0.5)
    mantissa = mag - 2.0 * exponent  # 0 or 1
    return torch.where(mag < 2.0, 0.5 * mag, torch.exp2(exponent - 1.0) * (1.0 + 0.5 * mantissa))


def moe_mxfp4_dequantised_forward(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                                  w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                                  swiglu_limit: float = SWIGLU_LIMIT, all_experts: bool | None = None) -> torch.Tensor:
    """bf16 ``[B, H]``: the routed experts in torch on the *repacked* weights (w13 rows interleaved ``(gate_i, up_i)``,
    as :func:`repack_w13_` leaves them), one expert at a time on a transient bf16 copy of its weights, bf16 matmuls,
    the clamped SwiGLU and the routing weights in float32. The sm120 MoE seam's path when its kernels raise: slow, but
    it keeps the server answering, with no second copy of the layer's weights. Ids outside ``[0, E)`` add nothing.
    Outside CUDA-graph capture it runs only the experts some row chose (``torch.unique``: a host sync); while
    capturing (or ``all_experts``), every expert over every row with the non-chosen rows weighted 0 (no sync, the
    same result)."""
    batch, hidden = x.shape
    num_experts = w13.shape[0]
    out = torch.zeros(batch, hidden, dtype=torch.float32, device=x.device)
    if batch == 0:
        return out.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    ids = topk_ids.long()
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing() if all_experts is None else all_experts
    experts = range(num_experts) if capturing else [e for e in torch.unique(ids).tolist() if 0 <= e < num_experts]
    byte_values = e2m1_byte_values(x.device).to(torch.bfloat16)  # once per call, not per weight
    for e in experts:
        routed = ids == e  # [B, K]
        if capturing:
            rows, row_weight = slice(None), (topk_weights.float() * routed).sum(1)
        else:
            rows = routed.any(1).nonzero().squeeze(1)
            row_weight = (topk_weights.float()[rows] * routed[rows]).sum(1)
        gate_up = (xb[rows] @ dequant_mxfp4_in_graph(w13[e], w13_scale[e], torch.bfloat16, byte_values).T).float()
        act = reference_swiglu(gate_up[:, 0::2], gate_up[:, 1::2], swiglu_limit).to(torch.bfloat16)
        down = (act @ dequant_mxfp4_in_graph(w2[e], w2_scale[e], torch.bfloat16, byte_values).T).float()
        if capturing:
            out += down * row_weight.unsqueeze(1)
        else:
            out.index_add_(0, rows, down * row_weight.unsqueeze(1))
    return out.to(torch.bfloat16)


def quantize_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16/fp32 ``[B, K]`` -> e4m3 ``[B, K]`` + E8M0 bytes ``[B, K/32]`` (one scale per 32).

    The scale is the smallest power of two that keeps the group's absmax within e4m3's 448
    (``ceil(log2(amax / 448))``); torch's cast rounds to nearest even. Used by the MXFP8-activation
    GEMM variant and, in float32, as its reference.
    """
    groups = x.float().unflatten(-1, (-1, MXFP4_GROUP))
    amax = groups.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -126)
    exponent = torch.ceil(torch.log2(amax / E4M3_MAX)).clamp(-MXFP4_E8M0_BIAS, MXFP4_E8M0_BIAS)
    q = (groups / torch.exp2(exponent)).to(torch.float8_e4m3fn)
    return q.flatten(-2), (exponent.squeeze(-1) + MXFP4_E8M0_BIAS).to(torch.uint8)


def reference_moe_mxfp8_act(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                            swiglu_limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """float32 reference of the MXFP8-activation variant: both GEMM inputs quantised to MXFP8."""
    xq, xs = quantize_mxfp8(x)
    x_deq = (xq.float().unflatten(-1, (-1, MXFP4_GROUP))
             * torch.exp2(xs.float() - MXFP4_E8M0_BIAS).unsqueeze(-1)).flatten(-2)
    batch, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    out = torch.zeros(batch, hidden, dtype=torch.float32, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        if not 0 <= e < num_experts:
            continue
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        gate_up = x_deq[tok] @ reference_dequant_mxfp4(w13[e], w13_scale[e]).T
        act = reference_swiglu(gate_up[:, :inter], gate_up[:, inter:], swiglu_limit)
        aq, as_ = quantize_mxfp8(act)
        act = (aq.float().unflatten(-1, (-1, MXFP4_GROUP))
               * torch.exp2(as_.float() - MXFP4_E8M0_BIAS).unsqueeze(-1)).flatten(-2)
        down = act @ reference_dequant_mxfp4(w2[e], w2_scale[e]).T
        out.index_add_(0, tok, down * topk_weights[tok, slot].float().unsqueeze(1))
    return out


# ---------------------------------------------------------------------------------------------
# weight repacking (in place, one expert of scratch)
# ---------------------------------------------------------------------------------------------
def _permute_rows_(tensor: torch.Tensor, interleave: bool) -> None:
    """Per expert: ``[gate; up]`` rows <-> ``gate_0, up_0, gate_1, up_1, ...``, in place."""
    num_experts, two_i = tensor.shape[:2]
    inter = two_i // 2
    for e in range(num_experts):
        expert = tensor[e]
        staged = expert.clone()  # one expert of scratch; the layer's tensor is rewritten in place
        if interleave:
            expert.view(inter, 2, -1).copy_(staged.view(2, inter, -1).transpose(0, 1))
        else:
            expert.view(2, inter, -1).copy_(staged.view(inter, 2, -1).transpose(0, 1))


def repack_w13_(w13: torch.Tensor, w13_scale: torch.Tensor) -> None:
    """Checkpoint ``[gate; up]`` rows -> interleaved ``(gate_i, up_i)`` rows, weights and scales."""
    _check_w13_pair(w13, w13_scale)
    _permute_rows_(w13, interleave=True)
    _permute_rows_(w13_scale, interleave=True)


def unpack_w13_(w13: torch.Tensor, w13_scale: torch.Tensor) -> None:
    """Inverse of :func:`repack_w13_`."""
    _check_w13_pair(w13, w13_scale)
    _permute_rows_(w13, interleave=False)
    _permute_rows_(w13_scale, interleave=False)


def _check_w13_pair(w13, w13_scale):
    if w13.dim() != 3 or w13.shape[1] % 2 or not w13.is_contiguous():
        raise ValueError(f"w13 must be a contiguous [E, 2I, H/2] tensor, got {tuple(w13.shape)}")
    if w13_scale.shape[:2] != w13.shape[:2] or not w13_scale.is_contiguous():
        raise ValueError(f"w13_scale must be contiguous [E, 2I, H/32] = {tuple(w13.shape[:2])} + (H/32,), "
                         f"got {tuple(w13_scale.shape)}")


# ---------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr):
    """The expert of active slot ``slot`` and its range ``[row_begin, row_end)`` in the sorted routed rows
    (the caller has checked the slot is below the active count)."""
    expert = tl.load(active_experts_ptr + slot).to(tl.int64)
    return expert, tl.load(expert_start_ptr + expert), tl.load(expert_start_ptr + expert + 1)


@triton.jit
def _slot_work(slot, num_active_ptr, active_experts_ptr, expert_start_ptr, sorted_rows_ptr, NUM_EXPERTS: tl.constexpr,
               CG: tl.constexpr):
    """(active, expert, row_begin, row_end, first routed row) of expert slot ``slot`` with the active count and the
    slot's expert loaded together (one round trip where :func:`_slot_expert_rows` after the count check takes two):
    past the active count the slot's entry is stale, so its expert is clamped into [0, E) to keep the loads after it
    in bounds, and the caller returns on ``active`` False. CG: loads through L2 only (``.cg``), for loads issued
    before a PDL wait."""
    mod: tl.constexpr = ".cg" if CG else ""
    active = slot < tl.load(num_active_ptr, cache_modifier=mod)
    expert = tl.load(active_experts_ptr + slot, cache_modifier=mod)
    expert = tl.where(active & (expert >= 0) & (expert < NUM_EXPERTS), expert, 0).to(tl.int64)
    row_begin = tl.load(expert_start_ptr + expert, cache_modifier=mod)
    row_end = tl.load(expert_start_ptr + expert + 1, cache_modifier=mod)
    # an inactive slot's expert_start entries may be stale (_route_small writes only the active experts')
    first_row = tl.load(sorted_rows_ptr + row_begin, mask=active & (row_begin < row_end), other=0,
                        cache_modifier=mod)
    return active, expert, row_begin, row_end, first_row


@triton.jit
def _route_kernel(topk_ids_ptr, num_rows, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                  num_active_ptr, NUM_EXPERTS: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                  NUM_BINS: tl.constexpr):
    """Counting sort of the routed rows by expert; ids outside [0, E) go to a bin past E."""
    rows = tl.arange(0, BLOCK_ROWS)
    ids = tl.load(topk_ids_ptr + rows, mask=rows < num_rows, other=NUM_EXPERTS).to(tl.int32)
    ids = tl.where((ids >= 0) & (ids < NUM_EXPERTS), ids, NUM_EXPERTS)
    # (expert, row) keys sort stably by expert; the row index rides in the low bits
    keys = tl.sort(ids * BLOCK_ROWS + rows)
    tl.store(sorted_rows_ptr + rows, keys % BLOCK_ROWS, mask=rows < num_rows)
    counts = tl.histogram(ids, NUM_BINS)
    bins = tl.arange(0, NUM_BINS)
    ends = tl.cumsum(counts, 0)
    tl.store(expert_start_ptr + bins + 1, ends, mask=bins < NUM_EXPERTS)
    tl.store(expert_start_ptr + bins, ends - counts, mask=bins == 0)
    active = (counts > 0) & (bins < NUM_EXPERTS)
    slot = tl.cumsum(active.to(tl.int32), 0) - 1
    tl.store(active_experts_ptr + slot, bins, mask=active)
    tl.store(num_active_ptr, tl.sum(active.to(tl.int32), 0))


@triton.jit
def _route_small(topk_ids_ptr, num_rows, sorted_rows_ptr, expert_start_ptr, active_experts_ptr, num_active_ptr,
                 NUM_EXPERTS: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """:func:`_route_kernel` for a few rows (round 29, :data:`ROUTE_SMALL_MAX_ROWS`) by pairwise comparisons instead
    of a histogram and two scans over E + 1 bins: the same sorted rows, active experts and count, but
    ``expert_start`` written only at each active expert e (its start and e + 1, its end) -- enough for the per-slot
    GEMV launches, which read nothing else of it (an inactive slot's program returns before using its rows)."""
    rows = tl.arange(0, BLOCK_ROWS)
    ids = tl.load(topk_ids_ptr + rows, mask=rows < num_rows, other=NUM_EXPERTS).to(tl.int32)
    ids = tl.where((ids >= 0) & (ids < NUM_EXPERTS), ids, NUM_EXPERTS)
    keys = tl.sort(ids * BLOCK_ROWS + rows)
    tl.store(sorted_rows_ptr + rows, keys % BLOCK_ROWS, mask=rows < num_rows)
    mine, other = ids[:, None], ids[None, :]
    smaller = tl.sum((other < mine).to(tl.int32), 1)  # rows before this id's expert in the sorted order
    same = tl.sum((other == mine).to(tl.int32), 1)
    earlier_same = tl.sum(((other == mine) & (rows[None, :] < rows[:, None])).to(tl.int32), 1)
    lead = (earlier_same == 0) & (ids < NUM_EXPERTS)  # one row per active expert
    slot = tl.sum(((other < mine) & lead[None, :]).to(tl.int32), 1)  # active experts with a smaller id
    tl.store(expert_start_ptr + ids, smaller, mask=lead)
    tl.store(expert_start_ptr + ids + 1, smaller + same, mask=lead)
    tl.store(active_experts_ptr + slot, ids, mask=lead)
    tl.store(num_active_ptr, tl.sum(lead.to(tl.int32), 0))


@triton.jit
def _e2m1_to_f32(nibble):
    """e2m1 code (int32, 0..15) -> float32 value, by building the float's bits."""
    mag = nibble & 7
    bits = tl.where(mag >= 2, (mag + 252) << 22, mag * 0x3F000000) | ((nibble & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_to_e4m3_bits(nibble):
    """e2m1 code -> the e4m3 byte of the same value (exact: every e2m1 value is an e4m3 value)."""
    mag = nibble & 7
    return tl.where(mag >= 2, (mag + 12) << 2, mag * 48) | ((nibble & 8) << 4)


@triton.jit
def _dequant_tile(packed_ptrs, scale_ptrs, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Load ``[ROWS, BLOCK_K/2]`` packed bytes + ``[ROWS, BLOCK_K/32]`` E8M0 -> bf16 ``[ROWS, BLOCK_K]``."""
    codes = tl.load(packed_ptrs).to(tl.int32) & 0xFF
    scale_bits = (tl.load(scale_ptrs).to(tl.int32) & 0xFF) << 23
    scale = scale_bits.to(tl.float32, bitcast=True)
    lo = tl.reshape(_e2m1_to_f32(codes & 0xF), [ROWS, BLOCK_K // 32, 16]) * scale[:, :, None]
    hi = tl.reshape(_e2m1_to_f32(codes >> 4), [ROWS, BLOCK_K // 32, 16]) * scale[:, :, None]
    lo = tl.reshape(lo, [ROWS, BLOCK_K // 2])
    hi = tl.reshape(hi, [ROWS, BLOCK_K // 2])
    return tl.reshape(tl.join(lo, hi), [ROWS, BLOCK_K]).to(tl.bfloat16)


@triton.jit
def _e8m0_to_f32(scale_bytes):
    """E8M0 byte -> float32 ``2**(byte-127)``, upstream's ``exp2(byte - 127)`` exactly: byte 0 is the
    float32 subnormal ``2**-127`` and byte 255 is inf (so a zero code gives NaN, as upstream)."""
    s = scale_bytes.to(tl.int32) & 0xFF
    return tl.where(s == 0, 0x00400000, s << 23).to(tl.float32, bitcast=True)


@triton.jit
def _dequant_nibble_tiles(packed_ptrs, scale_ptrs, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                          SCALE_MATH: tl.constexpr):
    """Load ``[ROWS, BLOCK_K/2]`` packed bytes + ``[ROWS, BLOCK_K/32]`` E8M0 -> two bf16
    ``[ROWS, BLOCK_K/2]`` tiles, the low nibbles (even k) and the high nibbles (odd k), holding exactly
    upstream's dequantised values. The caller multiplies them with the even and odd activation
    columns, so the weights are never interleaved (no ``tl.join``/``tl.reshape`` shuffles).

    A nibble ``s e1 e0 m`` placed at bf16 bits ``s`` -> 15, ``e1 e0 m`` -> 8..6 (float32: 31, 24..22)
    is exactly ``e2m1 * 2**-126``: the 0.5 code is the subnormal ``2**-127``. Two shifts and two masks
    per value, then ``* 2**126`` gives the exact e2m1 value and ``* 2**(byte-127)`` the exact
    dequantised one (two multiplies, because ``2**(byte-1)`` overflows for bytes above 128); every
    product is exact, so the arithmetic's precision does not matter. ``SCALE_MATH``
    :data:`SCALE_MATH_BF16`: both multiplies in packed bf16 (``HMUL2``, two values per instruction;
    relies on bf16 subnormal inputs being kept, as PTX ``mul.bf16x2`` does -- checked on the device by
    :func:`dequant_nibbles`); :data:`SCALE_MATH_F32`: in float32 (``FMUL``; Triton does not flush
    fp32 subnormals), then one conversion to bf16. The CPU interpreter cannot do bf16 arithmetic
    (triton#10945), so there the bf16 variant runs the float32 arithmetic: same values, by exactness."""
    codes = tl.load(packed_ptrs).to(tl.int32)
    factor = tl.reshape(_e8m0_to_f32(tl.load(scale_ptrs)), [ROWS, BLOCK_K // 32, 1])
    if SCALE_MATH == 2:
        factor = factor.to(tl.bfloat16)
        unbias = tl.full([1, 1], E2M1_UNBIAS, tl.float32).to(tl.bfloat16)
        lo = (((codes << 12) & 0x8000) | ((codes << 6) & 0x01C0)).to(tl.int16).to(tl.bfloat16, bitcast=True) * unbias
        hi = (((codes << 8) & 0x8000) | ((codes << 2) & 0x01C0)).to(tl.int16).to(tl.bfloat16, bitcast=True) * unbias
    else:
        lo = ((codes << 28) & -0x80000000) | ((codes << 22) & 0x01C00000)
        hi = ((codes << 24) & -0x80000000) | ((codes << 18) & 0x01C00000)
        lo = lo.to(tl.float32, bitcast=True) * E2M1_UNBIAS
        hi = hi.to(tl.float32, bitcast=True) * E2M1_UNBIAS
    lo = tl.reshape(tl.reshape(lo, [ROWS, BLOCK_K // 32, 16]) * factor, [ROWS, BLOCK_K // 2])
    hi = tl.reshape(tl.reshape(hi, [ROWS, BLOCK_K // 32, 16]) * factor, [ROWS, BLOCK_K // 2])
    if SCALE_MATH != 2:
        # exact values: the bf16 is the float32's top half (the interpreter's fp32->bf16 cast would
        # lose the 2**-128 subnormals of E8M0 byte 0)
        lo = (lo.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        hi = (hi.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return lo, hi


@triton.jit
def _dequant_nibbles_kernel(packed_ptr, scale_ptr, out_ptr, K: tl.constexpr, ROWS: tl.constexpr,
                            SCALE_MATH: tl.constexpr):
    """Test/probe kernel: ``[N, K/2]`` packed + ``[N, K/32]`` E8M0 -> float32 ``[N, K]`` through
    :func:`_dequant_nibble_tiles` (so its exactness is checked on the hardware that runs it)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    kb = tl.arange(0, K // 2)
    ks = tl.arange(0, K // 32)
    lo, hi = _dequant_nibble_tiles(packed_ptr + r[:, None] * (K // 2) + kb[None, :],
                                   scale_ptr + r[:, None] * (K // 32) + ks[None, :], ROWS, K, SCALE_MATH)
    out = out_ptr + r[:, None] * K + 2 * kb[None, :]
    # widen by bits (exact; the interpreter's bf16->fp32 cast drops subnormals)
    tl.store(out, ((lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True))
    tl.store(out + 1, ((hi.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True))


@triton.jit
def _e4m3_tile(packed_ptrs, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Load ``[ROWS, BLOCK_K/2]`` packed e2m1 -> e4m3 ``[ROWS, BLOCK_K]`` (the E8M0 scale stays apart)."""
    codes = tl.load(packed_ptrs).to(tl.int32) & 0xFF
    lo = _e2m1_to_e4m3_bits(codes & 0xF)
    hi = _e2m1_to_e4m3_bits(codes >> 4)
    both = tl.reshape(tl.join(lo, hi), [ROWS, BLOCK_K]).to(tl.uint8)
    return both.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _gate_up_kernel(x_ptr, x_scale_ptr, w13_ptr, w13_scale_ptr, sorted_rows_ptr, expert_start_ptr,
                    active_experts_ptr, num_active_ptr, act_ptr, act_scale_ptr, partial_ptr, ticket_ptr,
                    zero_ptr, zero_numel, zero_chunk, num_rows, hidden, inter,
                    swiglu_limit, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, ACT_MXFP8: tl.constexpr, DOT_SCALED: tl.constexpr,
                    SPLIT_NIBBLES: tl.constexpr, SPLIT_K: tl.constexpr, ZERO_OUT: tl.constexpr):
    """SPLIT_K > 1: program (slot, n block, split) accumulates K range ``split`` into fp32
    ``partial [SPLIT_K, num_rows, 2I]`` (gate columns, then up); the last of the SPLIT_K programs of a (slot, n block) to take
    its ticket sums the partials, applies the SwiGLU and puts the ticket back to 0. ZERO_OUT: every
    program first zeroes ``zero_chunk`` floats of ``zero_ptr`` (the down kernel's atomic output)."""
    slot = tl.program_id(0)
    if ZERO_OUT:
        lin = (slot * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)
        z_begin = lin.to(tl.int64) * zero_chunk
        z_end = tl.minimum(z_begin + zero_chunk, zero_numel)
        for z0 in range(z_begin, z_end, ZERO_BLOCK):
            zo = z0 + tl.arange(0, ZERO_BLOCK)
            tl.store(zero_ptr + zo, tl.zeros([ZERO_BLOCK], tl.float32), mask=zo < z_end)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    # interleaved rows: 2n is gate column n, 2n+1 is up column n
    w_rows = tl.program_id(1) * (2 * BLOCK_N) + tl.arange(0, 2 * BLOCK_N)
    w_base = w13_ptr + expert * (2 * inter) * (hidden // 2) + w_rows[:, None] * (hidden // 2)
    s_base = w13_scale_ptr + expert * (2 * inter) * (hidden // 32) + w_rows[:, None] * (hidden // 32)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    # this split's K range: the pointers start there, the loop counts from 0 (as unsplit)
    k_begin = tl.multiple_of(tl.program_id(2) * (hidden // SPLIT_K), BLOCK_K)  # host checks the split divides
    x_ptr += k_begin
    x_scale_ptr += k_begin // 32
    w_base += k_begin // 2
    s_base += k_begin // 32
    kb = tl.arange(0, BLOCK_K // 2)
    ks = tl.arange(0, BLOCK_K // 32)
    kx = tl.arange(0, BLOCK_K)
    for m0 in range(row_begin, row_end, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        m_ok = m < row_end
        rows = tl.load(sorted_rows_ptr + m, mask=m_ok, other=0)
        tokens = (rows // TOP_K).to(tl.int64)
        acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
        acc_t = tl.zeros([2 * BLOCK_N, BLOCK_M], dtype=tl.float32)
        # stepping over H (not H/SPLIT_K) keeps the loop bound the unsplit one: with H/4 the sm_120
        # compile of the regs upcast spilled
        for k_split in range(0, hidden, BLOCK_K * SPLIT_K):
            k0 = k_split // SPLIT_K
            if ACT_MXFP8:
                xq = tl.load(x_ptr + tokens[:, None] * hidden + k0 + kx[None, :], mask=m_ok[:, None], other=0.0)
                xs = tl.load(x_scale_ptr + tokens[:, None] * (hidden // 32) + k0 // 32 + ks[None, :],
                             mask=m_ok[:, None], other=0)
                wq = _e4m3_tile(w_base + k0 // 2 + kb[None, :], 2 * BLOCK_N, BLOCK_K)
                ws = tl.load(s_base + k0 // 32 + ks[None, :])
                acc = tl.dot_scaled(xq, xs, "e4m3", tl.trans(wq), ws, "e4m3", acc)
            elif SPLIT_NIBBLES:
                xt = tl.load(x_ptr + tokens[:, None] * hidden + k0 + kx[None, :], mask=m_ok[:, None], other=0.0)
                x_even, x_odd = tl.split(tl.reshape(xt, [BLOCK_M, BLOCK_K // 2, 2]))
                w_even, w_odd = _dequant_nibble_tiles(w_base + k0 // 2 + kb[None, :], s_base + k0 // 32 + ks[None, :],
                                                      2 * BLOCK_N, BLOCK_K, SPLIT_NIBBLES)
                # weights as the MMA's A operand (built in registers), activations as B: acc^T
                acc_t = tl.dot(w_even, tl.trans(x_even), acc_t)
                acc_t = tl.dot(w_odd, tl.trans(x_odd), acc_t)
            elif DOT_SCALED:
                # Triton upcasts e2m1 x E8M0 to bf16 in the MMA operand layout (packed bytes in smem)
                xt = tl.load(x_ptr + tokens[:, None] * hidden + k0 + kx[None, :], mask=m_ok[:, None], other=0.0)
                wb = tl.load(w_base + k0 // 2 + kb[None, :])
                ws = tl.load(s_base + k0 // 32 + ks[None, :])
                acc = tl.dot_scaled(xt, None, "bf16", wb.T, ws, "e2m1", acc)
            else:
                xt = tl.load(x_ptr + tokens[:, None] * hidden + k0 + kx[None, :], mask=m_ok[:, None], other=0.0)
                w = _dequant_tile(w_base + k0 // 2 + kb[None, :], s_base + k0 // 32 + ks[None, :],
                                  2 * BLOCK_N, BLOCK_K)
                acc = tl.dot(xt, tl.trans(w), acc)
        if SPLIT_NIBBLES:
            acc = tl.trans(acc_t)
        gate, up = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
        if SPLIT_K == 1:
            _swiglu_store(gate, up, rows, m_ok, cols, act_ptr, act_scale_ptr, inter, swiglu_limit,
                          BLOCK_M, BLOCK_N, ACT_MXFP8)
        else:  # partial rows are [gate I | up I]
            p_at = partial_ptr + (tl.program_id(2) * num_rows + rows.to(tl.int64))[:, None] * (2 * inter) + cols[None, :]
            tl.store(p_at, gate, mask=m_ok[:, None])
            tl.store(p_at + inter, up, mask=m_ok[:, None])
    if SPLIT_K > 1:
        tl.debug_barrier()  # every thread's partial stores precede the (release) ticket
        ticket_at = ticket_ptr + slot * tl.num_programs(1) + tl.program_id(1)
        if tl.atomic_add(ticket_at, 1, sem="acq_rel") == SPLIT_K - 1:
            for m0 in range(row_begin, row_end, BLOCK_M):
                m = m0 + tl.arange(0, BLOCK_M)
                m_ok = m < row_end
                rows = tl.load(sorted_rows_ptr + m, mask=m_ok, other=0)
                gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for s in range(SPLIT_K):
                    p_at = partial_ptr + (s * num_rows + rows.to(tl.int64))[:, None] * (2 * inter) + cols[None, :]
                    gate += tl.load(p_at, mask=m_ok[:, None], other=0.0, cache_modifier=".cg")
                    up += tl.load(p_at + inter, mask=m_ok[:, None], other=0.0, cache_modifier=".cg")
                _swiglu_store(gate, up, rows, m_ok, cols, act_ptr, act_scale_ptr, inter, swiglu_limit,
                              BLOCK_M, BLOCK_N, ACT_MXFP8)
            tl.store(ticket_at, 0)  # left zeroed for the next launch (and graph replay)


@triton.jit
def _swiglu(gate, up, swiglu_limit):
    """The clamped SwiGLU (``swiglu_limit <= 0``: no clamp), as ``reference_swiglu``."""
    if swiglu_limit > 0:
        gate = tl.minimum(gate, swiglu_limit)
        up = tl.minimum(tl.maximum(up, -swiglu_limit), swiglu_limit)
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _swiglu_store(gate, up, rows, m_ok, cols, act_ptr, act_scale_ptr, inter, swiglu_limit,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT_MXFP8: tl.constexpr):
    """fp32 gate and up accumulators -> clamped SwiGLU activations of ``rows``."""
    act = _swiglu(gate, up, swiglu_limit)
    out_off = rows.to(tl.int64)[:, None] * inter + cols[None, :]
    if ACT_MXFP8:
        # one E8M0 scale per 32 columns, so the down GEMM reads MXFP8 too
        groups = tl.reshape(act, [BLOCK_M, BLOCK_N // 32, 32])
        amax = tl.maximum(tl.max(tl.abs(groups), 2), 1.1754943508222875e-38)
        exponent = tl.math.ceil(tl.math.log2(amax / 448.0))
        q = tl.reshape(groups / tl.math.exp2(exponent)[:, :, None], [BLOCK_M, BLOCK_N])
        tl.store(act_ptr + out_off, q.to(tl.float8e4nv), mask=m_ok[:, None])
        sc = tl.program_id(1) * (BLOCK_N // 32) + tl.arange(0, BLOCK_N // 32)
        tl.store(act_scale_ptr + rows.to(tl.int64)[:, None] * (inter // 32) + sc[None, :],
                 (exponent + 127).to(tl.uint8), mask=m_ok[:, None])
    else:
        tl.store(act_ptr + out_off, act.to(tl.bfloat16), mask=m_ok[:, None])


@triton.jit
def _down_kernel(act_ptr, act_scale_ptr, w2_ptr, w2_scale_ptr, topk_weights_ptr, sorted_rows_ptr,
                 expert_start_ptr, active_experts_ptr, num_active_ptr, y_ptr, hidden, inter,
                 TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 ACT_MXFP8: tl.constexpr, DOT_SCALED: tl.constexpr, SPLIT_NIBBLES: tl.constexpr,
                 SPLIT_K: tl.constexpr, ATOMIC_OUT: tl.constexpr):
    """ATOMIC_OUT: ``y`` is the zeroed fp32 per-token output ``[B, H]`` and each program (slot, n block,
    split of K into SPLIT_K ranges) atomically adds its weighted rows into its tokens (the top-k sum);
    otherwise ``y`` is fp32 per routed row ``[B*top_k, H]``, written once."""
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_base = w2_ptr + expert * hidden * (inter // 2) + n[:, None] * (inter // 2)
    s_base = w2_scale_ptr + expert * hidden * (inter // 32) + n[:, None] * (inter // 32)
    k_begin = tl.multiple_of(tl.program_id(2) * (inter // SPLIT_K), BLOCK_K)
    act_k_ptr = act_ptr + k_begin
    act_scale_k_ptr = act_scale_ptr + k_begin // 32
    w_base += k_begin // 2
    s_base += k_begin // 32
    kb = tl.arange(0, BLOCK_K // 2)
    ks = tl.arange(0, BLOCK_K // 32)
    kx = tl.arange(0, BLOCK_K)
    for m0 in range(row_begin, row_end, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        m_ok = m < row_end
        rows = tl.load(sorted_rows_ptr + m, mask=m_ok, other=0).to(tl.int64)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_t = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for k_split in range(0, inter, BLOCK_K * SPLIT_K):  # loop bound as unsplit (see the gate/up loop)
            k0 = k_split // SPLIT_K
            if ACT_MXFP8:
                aq = tl.load(act_k_ptr + rows[:, None] * inter + k0 + kx[None, :], mask=m_ok[:, None], other=0.0)
                as_ = tl.load(act_scale_k_ptr + rows[:, None] * (inter // 32) + k0 // 32 + ks[None, :],
                              mask=m_ok[:, None], other=0)
                wq = _e4m3_tile(w_base + k0 // 2 + kb[None, :], BLOCK_N, BLOCK_K)
                ws = tl.load(s_base + k0 // 32 + ks[None, :])
                acc = tl.dot_scaled(aq, as_, "e4m3", tl.trans(wq), ws, "e4m3", acc)
            elif SPLIT_NIBBLES:
                a = tl.load(act_k_ptr + rows[:, None] * inter + k0 + kx[None, :], mask=m_ok[:, None], other=0.0)
                a_even, a_odd = tl.split(tl.reshape(a, [BLOCK_M, BLOCK_K // 2, 2]))
                w_even, w_odd = _dequant_nibble_tiles(w_base + k0 // 2 + kb[None, :], s_base + k0 // 32 + ks[None, :],
                                                      BLOCK_N, BLOCK_K, SPLIT_NIBBLES)
                acc_t = tl.dot(w_even, tl.trans(a_even), acc_t)
                acc_t = tl.dot(w_odd, tl.trans(a_odd), acc_t)
            elif DOT_SCALED:
                a = tl.load(act_k_ptr + rows[:, None] * inter + k0 + kx[None, :], mask=m_ok[:, None], other=0.0)
                wb = tl.load(w_base + k0 // 2 + kb[None, :])
                ws = tl.load(s_base + k0 // 32 + ks[None, :])
                acc = tl.dot_scaled(a, None, "bf16", wb.T, ws, "e2m1", acc)
            else:
                a = tl.load(act_k_ptr + rows[:, None] * inter + k0 + kx[None, :], mask=m_ok[:, None], other=0.0)
                w = _dequant_tile(w_base + k0 // 2 + kb[None, :], s_base + k0 // 32 + ks[None, :],
                                  BLOCK_N, BLOCK_K)
                acc = tl.dot(a, tl.trans(w), acc)
        if SPLIT_NIBBLES:
            acc = tl.trans(acc_t)
        weight = tl.load(topk_weights_ptr + rows, mask=m_ok, other=0.0).to(tl.float32)
        if ATOMIC_OUT:
            tl.atomic_add(y_ptr + (rows // TOP_K)[:, None] * hidden + n[None, :], acc * weight[:, None],
                          mask=m_ok[:, None], sem="relaxed")
        else:
            tl.store(y_ptr + rows[:, None] * hidden + n[None, :], acc * weight[:, None], mask=m_ok[:, None])


# ---------------------------------------------------------------------------------------------
# CUDA-core weight-streaming GEMV decode (few routed rows per expert)
# ---------------------------------------------------------------------------------------------
# The packed weights are read as int32 words (8 e2m1 values, k = 8w .. 8w+7, nibble j at bits 4j..4j+3)
# in [rows, K/32 groups, 4 words] tiles (16-byte loads), dequantised on CUDA cores and reduced along K
# inside each thread; no tensor core, no shared-memory staging of the weights.
#
# Bits: shifting a word so that nibbles j and j+4 sit at bits 12..15 and 28..31, ``(t & 0x80008000) |
# ((t >> 6) & 0x01C001C0)`` is a bf16 pair holding both values times 2**-126 (the 0.5 code is the
# subnormal 2**-127, see _dequant_nibble_tiles); ``<< 16`` and ``& 0xFFFF0000`` widen each half to the
# exact float32. Those weights are tiny, so the activations are pre-scaled by 2**GEMV_ACT_SHIFT (exact;
# keeps every product w*x normal for |w*x| >= 2**-GEMV_ACT_SHIFT, and finite for |x| < 2**(128 -
# GEMV_ACT_SHIFT)); the E8M0 scale and the remaining 2**(126 - GEMV_ACT_SHIFT) multiply each 32-value
# group's partial sum once, not each value.
GEMV_ACT_SHIFT: tl.constexpr = tl.constexpr(32)
GEMV_ACT_SCALE: tl.constexpr = tl.constexpr(2.0 ** 32)
GEMV_GROUP_UNBIAS: tl.constexpr = tl.constexpr(2.0 ** (126 - 32))
SIGN_PAIR_MASK: tl.constexpr = tl.constexpr(-0x7FFF8000)  # 0x80008000 as int32
HIGH_HALF_MASK: tl.constexpr = tl.constexpr(-0x10000)  # 0xFFFF0000 as int32
PAIR_BITS_MASK: tl.constexpr = tl.constexpr(-0x7E3F7E40)  # 0x81C081C0 as int32: both signs and magnitudes


@triton.jit
def _e2m1_pair(q, SHIFT: tl.constexpr, MUL_PAIRS: tl.constexpr = False):
    """Nibbles j and j+4 of each int32 word ``q`` (``SHIFT`` = 12 - 4j) -> two float32 tiles, the
    values times 2**-126 (exact, including the signs and the 0.5 subnormal). MUL_PAIRS (the x_f32
    form): one multiply places both copies of the two nibbles, ``n * (2**12 + 2**6)`` -- the sign
    copy at bits 15/31, the magnitude copy at 6..8/22..24, no overlapping bits so no carries -- and one
    mask keeps them: 3 instructions per pair instead of 4 (two shifts, two masks)."""
    if MUL_PAIRS:
        if SHIFT >= 8:  # j = 0, 1
            n = q & (0x000F000F << (12 - SHIFT))
            pair = (n * (0x1040 >> (12 - SHIFT))) & PAIR_BITS_MASK
        else:  # j = 2, 3: the same on the word shifted down a byte (the mask drops the sign fill)
            n = (q >> 8) & (0x000F000F << (4 - SHIFT))
            pair = (n * (0x1040 >> (4 - SHIFT))) & PAIR_BITS_MASK
    else:
        t = q << SHIFT
        pair = (t & SIGN_PAIR_MASK) | ((t >> 6) & 0x01C001C0)
    return (pair << 16).to(tl.float32, bitcast=True), (pair & HIGH_HALF_MASK).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_pair(xp):
    """int32 holding bf16 (even k, odd k) -> the two float32 values times 2**GEMV_ACT_SHIFT."""
    even = (xp << 16).to(tl.float32, bitcast=True) * GEMV_ACT_SCALE
    odd = (xp & HIGH_HALF_MASK).to(tl.float32, bitcast=True) * GEMV_ACT_SCALE
    return even, odd


@triton.jit
def _gemv_group_sums(q, x_pairs_ptr, X_F32: tl.constexpr):
    """``q`` [R, G, 4] weight words against one activation row -> [R, G] per-group partial dots
    (unscaled). ``x_pairs_ptr`` [1, G, 4]: pointers to the int32 bf16 pairs of each word's first k, or
    (X_F32) to the word's first value in the word-pair float32 layout (:func:`gemv_x_f32_order`: the 8
    values of word w of a group sit 4 floats apart, so each nibble position j is one 16-byte load of
    the group's 4 words and no conversion remains in the loop)."""
    if X_F32:
        x0 = tl.load(x_pairs_ptr)
        x1 = tl.load(x_pairs_ptr + 4)
        x2 = tl.load(x_pairs_ptr + 8)
        x3 = tl.load(x_pairs_ptr + 12)
        x4 = tl.load(x_pairs_ptr + 16)
        x5 = tl.load(x_pairs_ptr + 20)
        x6 = tl.load(x_pairs_ptr + 24)
        x7 = tl.load(x_pairs_ptr + 28)
    else:
        x0, x1 = _bf16_pair(tl.load(x_pairs_ptr))
        x2, x3 = _bf16_pair(tl.load(x_pairs_ptr + 1))
        x4, x5 = _bf16_pair(tl.load(x_pairs_ptr + 2))
        x6, x7 = _bf16_pair(tl.load(x_pairs_ptr + 3))
    return _gemv_group_dot(q, x0, x1, x2, x3, x4, x5, x6, x7, X_F32)


@triton.jit
def _gemv_group_dot(q, x0, x1, x2, x3, x4, x5, x6, x7, X_F32: tl.constexpr):
    """``q`` [R, G, 4] weight words against the activations ``x<j>`` [1, G, 4] of nibble j of each word
    (float32 times 2**GEMV_ACT_SHIFT) -> [R, G] per-group partial dots (unscaled); X_F32: the nibble
    pairs placed by one multiply (:func:`_e2m1_pair`)."""
    # one multiply, then a chain of fused multiply-adds
    w0, w4 = _e2m1_pair(q, 12, X_F32)
    acc = w0 * x0
    acc = tl.fma(w4, x4, acc)
    w1, w5 = _e2m1_pair(q, 8, X_F32)
    acc = tl.fma(w1, x1, acc)
    acc = tl.fma(w5, x5, acc)
    w2, w6 = _e2m1_pair(q, 4, X_F32)
    acc = tl.fma(w2, x2, acc)
    acc = tl.fma(w6, x6, acc)
    w3, w7 = _e2m1_pair(q, 0, X_F32)
    acc = tl.fma(w3, x3, acc)
    acc = tl.fma(w7, x7, acc)
    return tl.sum(acc, 2)


@triton.jit
def _gemv_rows(w_ptrs, s_ptrs, x0_ptrs, x1_ptrs, k_len, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
               TWO_ROWS: tl.constexpr, PREFETCH: tl.constexpr, X_F32: tl.constexpr):
    """Stream one [R, K] weight block (``w_ptrs`` [R, G, 4] int32 words, ``s_ptrs`` [R, G] E8M0 bytes)
    and dot it with one or (TWO_ROWS) two activation rows, dequantising each tile once: float32 [R] each.
    PREFETCH: the next K step's words and scales are loaded before this step's arithmetic (twice the
    bytes in flight per thread); the last step re-reads the first tile (cached) instead of masking,
    which keeps the loads 16 bytes wide."""
    acc0 = tl.zeros([ROWS, BLOCK_K // 32], dtype=tl.float32)
    acc1 = tl.zeros([ROWS, BLOCK_K // 32], dtype=tl.float32)
    if PREFETCH:
        q = tl.load(w_ptrs)
        s = tl.load(s_ptrs)
    for k0 in range(0, k_len, BLOCK_K):
        if PREFETCH:
            k_next = (k0 + BLOCK_K) % k_len
            q_next = tl.load(w_ptrs + k_next // 8)
            s_next = tl.load(s_ptrs + k_next // 32)
        else:
            q = tl.load(w_ptrs + k0 // 8)
            s = tl.load(s_ptrs + k0 // 32)
        factor = _e8m0_to_f32(s)
        x_step = k0 if X_F32 else k0 // 2  # floats or bf16 pairs
        acc0 += (_gemv_group_sums(q, x0_ptrs + x_step, X_F32) * GEMV_GROUP_UNBIAS) * factor
        if TWO_ROWS:
            acc1 += (_gemv_group_sums(q, x1_ptrs + x_step, X_F32) * GEMV_GROUP_UNBIAS) * factor
        if PREFETCH:
            q = q_next
            s = s_next
    return tl.sum(acc0, 1), tl.sum(acc1, 1)


@triton.jit
def _gemv_rows_tma(w_desc, s_desc, x_desc, w_row, x_row, k_begin, k_len, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                   RING: tl.constexpr):
    """:func:`_gemv_rows` (one activation row) with every operand of a K step fetched by TMA: the weight
    words [ROWS, BLOCK_K/8] int32 from row ``w_row`` of ``w_desc``, their E8M0 bytes [ROWS, BLOCK_K/32] from
    ``s_desc``, the activation's bf16 pairs [1, BLOCK_K/2] from row ``x_row`` of ``x_desc``. The K loop
    is a ``tl.range`` of RING stages, so RING - 1 steps are in flight per program, each a few TMA copies
    that one thread issues (no per-thread 4-byte copies of the broadcast activations)."""
    acc = tl.zeros([ROWS, BLOCK_K // 32], dtype=tl.float32)
    w_row = w_row.to(tl.int32)  # descriptor coordinates are 32-bit
    x_row = x_row.to(tl.int32)
    for k0 in tl.range(k_begin, k_begin + k_len, BLOCK_K, num_stages=RING):
        acc += _gemv_tma_step(w_desc, s_desc, x_desc, w_row, x_row, k0, ROWS, BLOCK_K)
    return tl.sum(acc, 1)


@triton.jit
def _gemv_tma_step(w_desc, s_desc, x_desc, w_row, x_row, k0, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """One K step of :func:`_gemv_rows_tma`: [ROWS, BLOCK_K/32] scaled per-group partial dots."""
    q = tl.reshape(w_desc.load([w_row, k0 // 8]), [ROWS, BLOCK_K // 32, 4])
    s = s_desc.load([w_row, k0 // 32])
    # the 4 bf16 pairs of each weight word: [1, G, 4 words, 4 pairs] -> pair j as [1, G, 4]
    xw = tl.reshape(x_desc.load([x_row, k0 // 2]), [1, BLOCK_K // 32, 4, 2, 2])
    x_even, x_odd = tl.split(xw)  # pairs 0, 2 / 1, 3
    p0, p2 = tl.split(x_even)
    p1, p3 = tl.split(x_odd)
    x0, x1 = _bf16_pair(p0)
    x2, x3 = _bf16_pair(p1)
    x4, x5 = _bf16_pair(p2)
    x6, x7 = _bf16_pair(p3)
    return (_gemv_group_dot(q, x0, x1, x2, x3, x4, x5, x6, x7, False) * GEMV_GROUP_UNBIAS) * _e8m0_to_f32(s)


# fp16 pair decode (GemvConfig.f16, round 16): an e2m1 value placed with its sign at fp16 bit 15 and its 3 other bits
# at bits 9..11 is the fp16 value times 2**-14 (the e2m1 exponent lands in the fp16 exponent's low bits, the 0.5 code
# is the fp16 subnormal 2**-15: exact), so each weight word gives 4 fp16 pair words (:func:`_e2m1_f16_byte_pairs`).
# Each pair multiplies the activation's matching fp16 pair (:func:`_f16_position`) by one packed ``fma.rn.f16x2``, so
# no pair is split into two float32: a word's 4 packed FMAs leave two fp16 sums of 4 products, converted to float32
# once per word. The activations are fp16 times a power of two that keeps them below 2**15
# (x: per row, from its max |x|; the SwiGLU rows: from the clamp), so no product or sum can overflow (a 4-product
# sum is at most 4 * 6 * 2**-14 * 2**15 = 48).
F16_GROUP_UNBIAS: tl.constexpr = tl.constexpr(2.0 ** 14)  # e2m1 placed as fp16 bits is the value times 2**-14
F16_ACT_MAX_LOG2 = 15  # prepared activations stay below 2**15 (fp16 max 65504)
# a row's shift from the float32 exponent field e of its max |x| (< 2**(e - 126)): 2**(e - 126 + shift) = 2**15
F16_X_SHIFT_BIAS: tl.constexpr = tl.constexpr(126 + F16_ACT_MAX_LOG2)


# The pairs are built per byte (round 26): such an fp16 value has a zero low byte and the high byte ``s000mmm0``; for
# the low nibble of every byte of a word that byte is ``((q << 4) & 0x80808080) | ((q << 1) & 0x0E0E0E0E)``, for the
# high nibble ``(q & 0x80808080) | ((q >> 3) & 0x0E0E0E0E)``, and one byte permute (``prmt`` with a zero source)
# places two such bytes as the high bytes of an fp16 pair: 11 integer instructions per weight word, where round 16's
# two shifts and two masks per pair took 15 (H200 run 26: 1.000x at T=1 B=1, 1.011-1.139x at every other T = 1/2/4,
# B <= 32; that form is in commit 0dfc461, GemvConfig(f16_bytes=False)). Pairs (low, high half): values (0, 2),
# (4, 6), (1, 3), (5, 7) of the word (:func:`_f16_position`).
LOW_NIBBLE_SIGNS: tl.constexpr = tl.constexpr(-0x7F7F7F80)  # 0x80808080 as int32
NIBBLE_MAGNITUDES: tl.constexpr = tl.constexpr(0x0E0E0E0E)
LOW_HALF_HIGH_BYTE: tl.constexpr = tl.constexpr(0xFF00)
HIGH_HALF_HIGH_BYTE: tl.constexpr = tl.constexpr(-0x1000000)  # 0xFF000000 as int32


@triton.jit
def _e2m1_f16_byte_pairs(q, EMULATE: tl.constexpr):
    """The four fp16 pair words of each int32 word ``q`` (values (0, 2), (4, 6), (1, 3), (5, 7) of the
    word as (low, high) halves, times 2**-14, exact). EMULATE: the same bits by shifts and masks (the interpreter
    runs no inline PTX)."""
    if EMULATE:
        low = ((q << 4) & LOW_NIBBLE_SIGNS) | ((q << 1) & NIBBLE_MAGNITUDES)
        high = (q & LOW_NIBBLE_SIGNS) | ((q >> 3) & NIBBLE_MAGNITUDES)
        # bytes 0 and 1 (2 and 3) of low / high as the high bytes of the two halves
        w0 = ((low << 8) & LOW_HALF_HIGH_BYTE) | ((low << 16) & HIGH_HALF_HIGH_BYTE)
        w1 = ((low >> 8) & LOW_HALF_HIGH_BYTE) | (low & HIGH_HALF_HIGH_BYTE)
        w2 = ((high << 8) & LOW_HALF_HIGH_BYTE) | ((high << 16) & HIGH_HALF_HIGH_BYTE)
        w3 = ((high >> 8) & LOW_HALF_HIGH_BYTE) | (high & HIGH_HALF_HIGH_BYTE)
        return w0, w1, w2, w3
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, u, lo, hi; "
            "shl.b32 t, $4, 4; and.b32 t, t, 0x80808080; shl.b32 u, $4, 1; and.b32 u, u, 0x0E0E0E0E; "
            "or.b32 lo, t, u; "
            "shr.u32 u, $4, 3; and.b32 u, u, 0x0E0E0E0E; and.b32 t, $4, 0x80808080; or.b32 hi, t, u; "
            "prmt.b32 $0, lo, 0, 0x1404; prmt.b32 $1, lo, 0, 0x3424; "
            "prmt.b32 $2, hi, 0, 0x1404; prmt.b32 $3, hi, 0, 0x3424; }",
            "=r,=r,=r,=r,r", [q], dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _f16_half(p, HIGH: tl.constexpr):
    """The low or high fp16 half of int32 words ``p`` as float32 (exact)."""
    bits = (p >> 16) if HIGH else (p & 0xFFFF)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _round_f16(v):
    return v.to(tl.float16).to(tl.float32)


@triton.jit
def _f16_word_dot(q, f0, f1, f2, f3, EMULATE: tl.constexpr):
    """``q`` [R, G, 4] weight words against the activation's fp16 pair words ``f<j>`` [1, G, 4] (pair j of word w in
    the :func:`_f16_position` order) -> float32 [R, G, 4]: each word's 8 products times 2**-14, summed as two fp16
    partial sums of 4 (one packed multiply and 3 packed FMAs) and one float32 add. EMULATE: the same fp16
    roundings in float32 (the CPU interpreter runs no inline PTX; fp16 a*b is exact in float32, so only the
    add rounds twice)."""
    w0, w1, w2, w3 = _e2m1_f16_byte_pairs(q, EMULATE)
    if EMULATE:
        lo = _round_f16(_f16_half(w0, False) * _f16_half(f0, False))
        hi = _round_f16(_f16_half(w0, True) * _f16_half(f0, True))
        lo = _round_f16(_f16_half(w1, False) * _f16_half(f1, False) + lo)
        hi = _round_f16(_f16_half(w1, True) * _f16_half(f1, True) + hi)
        lo = _round_f16(_f16_half(w2, False) * _f16_half(f2, False) + lo)
        hi = _round_f16(_f16_half(w2, True) * _f16_half(f2, True) + hi)
        lo = _round_f16(_f16_half(w3, False) * _f16_half(f3, False) + lo)
        hi = _round_f16(_f16_half(w3, True) * _f16_half(f3, True) + hi)
        return lo + hi
    else:
        f0 = tl.broadcast_to(f0, q.shape)
        f1 = tl.broadcast_to(f1, q.shape)
        f2 = tl.broadcast_to(f2, q.shape)
        f3 = tl.broadcast_to(f3, q.shape)
        acc = tl.inline_asm_elementwise("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [w0, f0], dtype=tl.int32,
                                        is_pure=True, pack=1)
        acc = tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [w1, f1, acc],
                                        dtype=tl.int32, is_pure=True, pack=1)
        acc = tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [w2, f2, acc],
                                        dtype=tl.int32, is_pure=True, pack=1)
        acc = tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [w3, f3, acc],
                                        dtype=tl.int32, is_pure=True, pack=1)
        total = tl.inline_asm_elementwise(
            "{ .reg .f16 lo16, hi16; .reg .f32 lo32, hi32, sum32; mov.b32 {lo16, hi16}, $1; "
            "cvt.f32.f16 lo32, lo16; cvt.f32.f16 hi32, hi16; add.f32 sum32, lo32, hi32; mov.b32 $0, sum32; }",
            "=r,r", [acc], dtype=tl.int32, is_pure=True, pack=1)
        return total.to(tl.float32, bitcast=True)


@triton.jit
def _gemv_tma_f16_step(w_desc, s_desc, x_desc, w_row, x_row, k0, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                       EMULATE: tl.constexpr):
    """:func:`_gemv_tma_step` on the fp16 pair decode (:func:`_f16_word_dot`): ``x_desc`` over the activation's
    fp16 pair words in the :func:`_f16_position` order; [ROWS, BLOCK_K/32] scaled per-group partial dots (times
    the activation row's power of two)."""
    q = tl.reshape(w_desc.load([w_row, k0 // 8]), [ROWS, BLOCK_K // 32, 4])
    s = s_desc.load([w_row, k0 // 32])
    return _gemv_tma_f16_words_dots(q, s, x_desc, x_row, k0, BLOCK_K, EMULATE)


@triton.jit
def _gemv_tma_f16_step_w0(w_desc, s_desc, x_desc, w_row, x_row, k0, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                          EMULATE: tl.constexpr):
    """:func:`_gemv_tma_f16_step` with the weight words reshaped after the scale load: the K loop of the down launch
    with the early first step (``W0_EARLY``), in the order it was timed in (H200 runs 31 / 49-51 and benches 45 /
    46). The order changes the SASS and register count of every launch that takes it (sm_90a, the device's Triton
    3.6: the T=1 B=2..32 down tile 80 -> 91 registers, 5 instead of 6 programs per SM), so the other launches keep
    the order of :func:`_gemv_tma_f16_step`."""
    q = w_desc.load([w_row, k0 // 8])
    s = s_desc.load([w_row, k0 // 32])
    return _gemv_tma_f16_dots(q, s, x_desc, x_row, k0, ROWS, BLOCK_K, EMULATE)


@triton.jit
def _gemv_tma_f16_dots(q, s, x_desc, x_row, k0, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, EMULATE: tl.constexpr):
    """The arithmetic of :func:`_gemv_tma_f16_step` on a K step's weight words ``q`` [ROWS, BLOCK_K/8] and E8M0
    bytes ``s`` [ROWS, BLOCK_K/32] already loaded (the activation words loaded here)."""
    return _gemv_tma_f16_words_dots(tl.reshape(q, [ROWS, BLOCK_K // 32, 4]), s, x_desc, x_row, k0, BLOCK_K, EMULATE)


@triton.jit
def _gemv_tma_f16_words_dots(q, s, x_desc, x_row, k0, BLOCK_K: tl.constexpr, EMULATE: tl.constexpr):
    """:func:`_gemv_tma_f16_dots` on the weight words already as [ROWS, BLOCK_K/32, 4]."""
    # the 4 fp16 pair words of each weight word: [1, G, 4 words, 4 pairs] -> pair j as [1, G, 4]
    xw = tl.reshape(x_desc.load([x_row, k0 // 2]), [1, BLOCK_K // 32, 4, 2, 2])
    x_even, x_odd = tl.split(xw)  # pairs 0, 2 / 1, 3
    f0, f2 = tl.split(x_even)
    f1, f3 = tl.split(x_odd)
    dots = tl.sum(_f16_word_dot(q, f0, f1, f2, f3, EMULATE), 2)
    return (dots * F16_GROUP_UNBIAS) * _e8m0_to_f32(s)


@triton.jit
def _f16_position(k):
    """Index of value ``k`` of a row in the fp16 pair order: within each 8 values (one weight word), values (0, 2),
    (4, 6), (1, 3), (5, 7) are pair words 0..3 (low, high half; :func:`_e2m1_f16_byte_pairs`)."""
    return (k // 8) * 8 + (k % 2) * 4 + (k % 8) // 2


@triton.jit
def _f16_act_store(act_ptr, row, cols, gate, up, swiglu_limit, act_scale, inter, mask):
    """The clamped SwiGLU of one routed row's columns times ``act_scale`` as fp16 in the pair order (what the
    fp16 down GEMV reads; the host picks ``act_scale`` so the clamped values stay below 2**15)."""
    act = _swiglu(gate, up, swiglu_limit) * act_scale
    tl.store(act_ptr + row.to(tl.int64) * inter + _f16_position(cols), act.to(tl.float16), mask=mask)


@triton.jit
def _bulk_prefetch_l2(ptr, nbytes):
    """Thread 0 of the program asks L2 for ``nbytes`` (a multiple of 16) from 16-byte aligned ``ptr`` with one
    ``cp.async.bulk.prefetch.L2`` (the copy engine fetches them; no registers, nothing to wait for)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred pf_first; .reg .b32 pf_tid; mov.u32 pf_tid, %tid.x; setp.eq.u32 pf_first, pf_tid, 0; "
        "@pf_first cp.async.bulk.prefetch.L2.global [$1], $2; } // dummy $0",
        "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_down_block_l2(w2_ptr, w2_scale_ptr, w_row, inter, BLOCK_N: tl.constexpr):
    """L2 prefetch of the down weight block of BLOCK_N rows from row ``w_row`` of the experts' w2 [E*H, I/2] bytes
    and their E8M0 bytes [E*H, I/32] (both blocks contiguous: whole rows)."""
    _bulk_prefetch_l2(w2_ptr + w_row * (inter // 2), BLOCK_N * (inter // 2))
    _bulk_prefetch_l2(w2_scale_ptr + w_row * (inter // 32), BLOCK_N * (inter // 32))


@triton.jit
def _route_x_f16_kernel(topk_ids_ptr, num_rows, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                        num_active_ptr, x_ptr, x16_ptr, x_unscale_ptr, hidden, NUM_EXPERTS: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK_H: tl.constexpr,
                        ROUTE: tl.constexpr, PDL: tl.constexpr = False, PDL_LATE: tl.constexpr = False,
                        SMALL_ROUTE: tl.constexpr = False):
    """Launch 1 of the fp16 TMA GEMV: program 0 routes (``_route_kernel``; not with ROUTE False, when the torch
    sort of :func:`route` did), program ``1 + b`` writes row b of the bf16 activations ``x [B, H]`` times 2**S_b
    as fp16 in the pair order (exact) and ``2**-S_b`` to ``x_unscale [B]``: S_b = 141 - (the float32 exponent
    field of the row's max |x|), so the row's values stay below 2**15 whatever their size (clamped to +-100:
    an all-zero row). PDL (:data:`GemvConfig.pdl`): ids and x come from the kernels before the MoE, so every program
    waits first."""
    pid = tl.program_id(0)
    pdl_wait(PDL)
    pdl_launch_dependents(PDL and not PDL_LATE)
    if ROUTE and pid == 0:
        if SMALL_ROUTE:
            _route_small(topk_ids_ptr, num_rows, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                         num_active_ptr, NUM_EXPERTS, BLOCK_ROWS)
        else:
            _route_kernel(topk_ids_ptr, num_rows, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                          num_active_ptr, NUM_EXPERTS, BLOCK_ROWS, NUM_BINS)
    else:
        row = (pid - (1 if ROUTE else 0)).to(tl.int64)
        k = tl.arange(0, BLOCK_H)
        ok = k < hidden
        x = tl.load(x_ptr + row * hidden + k, mask=ok, other=0.0).to(tl.float32)
        exponent = tl.max(tl.abs(x), 0).to(tl.int32, bitcast=True) >> 23
        shift = tl.minimum(tl.maximum(0 - exponent + F16_X_SHIFT_BIAS, -100), 100)
        scale = ((shift + 127) << 23).to(tl.float32, bitcast=True)
        tl.store(x16_ptr + row * hidden + _f16_position(k), (x * scale).to(tl.float16), mask=ok)
        tl.store(x_unscale_ptr + row, ((127 - shift) << 23).to(tl.float32, bitcast=True))
    pdl_launch_dependents(PDL and PDL_LATE)


@triton.jit
def _gate_up_gemv_tma_f16_kernel(x_desc, w13_desc, w13_scale_desc, x_unscale_ptr, sorted_rows_ptr, expert_start_ptr,
                                 active_experts_ptr, num_active_ptr, act_ptr, hidden, inter, swiglu_limit, act_scale,
                                 TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 RING: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr = False,
                                 PDL_LATE: tl.constexpr = False, EARLY_TABLES: tl.constexpr = False,
                                 NUM_EXPERTS: tl.constexpr = 256):
    """:func:`_gate_up_gemv_tma_kernel` on the fp16 pair decode: ``x_desc`` over the prepared fp16 pair words
    [B, H/2] (:func:`_route_x_f16_kernel`), each row's sums times its ``x_unscale``; the SwiGLU rows stored by
    :func:`_f16_act_store` (fp16 [B*top_k, I] in the pair order, times ``act_scale``). PDL: the trigger comes
    after the wait in every program, so once the down launch starts, the routing launch has completed (the down
    launch reads its routing before its own wait). EARLY_TABLES (:attr:`GemvConfig.early_tables`): the slot's
    routing read by :func:`_slot_work` (the active count and the slot's expert in one round trip)."""
    slot = tl.program_id(0)
    pdl_wait(PDL)
    pdl_launch_dependents(PDL and not PDL_LATE)
    if EARLY_TABLES:
        active, expert, row_begin, row_end, row = _slot_work(slot, num_active_ptr, active_experts_ptr,
                                                             expert_start_ptr, sorted_rows_ptr, NUM_EXPERTS, False)
        if not active:
            return
    else:
        if slot >= tl.load(num_active_ptr):
            return
        expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    w_row = (expert * (2 * inter) + tl.program_id(1) * (2 * BLOCK_N)).to(tl.int32)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    for m in range(row_begin, row_end):
        if EARLY_TABLES:  # this row loaded before the loop, the next one now
            next_row = tl.load(sorted_rows_ptr + m + 1, mask=m + 1 < row_end, other=0)
        else:
            row = tl.load(sorted_rows_ptr + m)
        acc = tl.zeros([2 * BLOCK_N, BLOCK_K // 32], dtype=tl.float32)
        x_row = (row // TOP_K).to(tl.int32)
        for k0 in tl.range(0, hidden, BLOCK_K, num_stages=RING):
            acc += _gemv_tma_f16_step(w13_desc, w13_scale_desc, x_desc, w_row, x_row, k0, 2 * BLOCK_N, BLOCK_K,
                                      EMULATE)
        out = tl.sum(acc, 1) * tl.load(x_unscale_ptr + row // TOP_K)
        gate, up = tl.split(tl.reshape(out, [BLOCK_N, 2]))
        _f16_act_store(act_ptr, row, cols, gate, up, swiglu_limit, act_scale, inter, cols >= 0)
        if EARLY_TABLES:
            row = next_row
    pdl_launch_dependents(PDL and PDL_LATE)


@triton.jit
def _down_gemv_tma_f16_kernel(act_desc, w2_desc, w2_scale_desc, topk_weights_ptr, sorted_rows_ptr, expert_start_ptr,
                              active_experts_ptr, num_active_ptr, y_ptr, hidden, inter, act_unscale, w2_ptr,
                              w2_scale_ptr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RING: tl.constexpr,
                              EMULATE: tl.constexpr, PDL: tl.constexpr = False, PDL_LATE: tl.constexpr = False,
                              L2_PREFETCH: tl.constexpr = False, EARLY_TABLES: tl.constexpr = False,
                              NUM_EXPERTS: tl.constexpr = 256, W0_EARLY: tl.constexpr = False,
                              W0_PLAIN: tl.constexpr = False):
    """:func:`_down_gemv_tma_kernel` on the fp16 pair decode: ``act_desc`` over the fp16 SwiGLU pair words
    [B*top_k, I/2] of :func:`_f16_act_store`, the sums times ``act_unscale`` (1 / its ``act_scale``).
    L2_PREFETCH (with PDL): before the wait, the program asks L2 for its weight block (``w2_ptr`` / ``w2_scale_ptr``:
    the same bytes as the descriptors), whose expert the routing launch (complete by then) names. EARLY_TABLES
    (:attr:`GemvConfig.early_tables`): the slot's routing (:func:`_slot_work`) read before the wait for the same
    reason, so that after it the program's first loads are its weights and SwiGLU row. W0_EARLY (with EARLY_TABLES,
    :attr:`GemvConfig.w0_early`): the first K step's weight words and E8M0 bytes loaded before the wait too (the
    weights do not depend on the launches before), used by the slot's first routed row."""
    slot = tl.program_id(0)
    if EARLY_TABLES:
        active, expert, row_begin, row_end, row = _slot_work(slot, num_active_ptr, active_experts_ptr,
                                                             expert_start_ptr, sorted_rows_ptr, NUM_EXPERTS, True)
        if W0_EARLY:
            if W0_PLAIN:  # per-thread loads into registers: no shared-memory buffer beside the ring's
                w0_rows = (expert * hidden + tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
                q0 = tl.load(w2_ptr.to(tl.pointer_type(tl.int32)) + w0_rows[:, None] * (inter // 8)
                             + tl.arange(0, BLOCK_K // 8)[None, :])
                s0 = tl.load(w2_scale_ptr + w0_rows[:, None] * (inter // 32) + tl.arange(0, BLOCK_K // 32)[None, :])
            else:
                w0_row = (expert * hidden + tl.program_id(1) * BLOCK_N).to(tl.int32)
                q0 = w2_desc.load([w0_row, 0])
                s0 = w2_scale_desc.load([w0_row, 0])
        if L2_PREFETCH:
            if active:
                _prefetch_down_block_l2(w2_ptr, w2_scale_ptr, expert * hidden + tl.program_id(1) * BLOCK_N, inter,
                                        BLOCK_N)
    elif L2_PREFETCH:
        if slot < tl.load(num_active_ptr, cache_modifier=".cg"):
            expert = tl.load(active_experts_ptr + slot, cache_modifier=".cg").to(tl.int64)
            _prefetch_down_block_l2(w2_ptr, w2_scale_ptr, expert * hidden + tl.program_id(1) * BLOCK_N, inter,
                                    BLOCK_N)
    pdl_wait(PDL)
    pdl_launch_dependents(PDL and not PDL_LATE)
    if EARLY_TABLES:
        if not active:
            return
    else:
        if slot >= tl.load(num_active_ptr):
            return
        expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    w_row = (expert * hidden + tl.program_id(1) * BLOCK_N).to(tl.int32)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    for m in range(row_begin, row_end):
        if EARLY_TABLES:  # this row loaded before the loop, the next one now
            next_row = tl.load(sorted_rows_ptr + m + 1, mask=m + 1 < row_end, other=0)
        else:
            row = tl.load(sorted_rows_ptr + m)
        acc = tl.zeros([BLOCK_N, BLOCK_K // 32], dtype=tl.float32)
        k_start = 0
        if W0_EARLY and EARLY_TABLES:
            if m == row_begin:
                acc += _gemv_tma_f16_dots(q0, s0, act_desc, row.to(tl.int32), 0, BLOCK_N, BLOCK_K, EMULATE)
                k_start = BLOCK_K
        for k0 in tl.range(k_start, inter, BLOCK_K, num_stages=RING):
            if W0_EARLY and EARLY_TABLES:
                acc += _gemv_tma_f16_step_w0(w2_desc, w2_scale_desc, act_desc, w_row, row.to(tl.int32), k0, BLOCK_N,
                                             BLOCK_K, EMULATE)
            else:
                acc += _gemv_tma_f16_step(w2_desc, w2_scale_desc, act_desc, w_row, row.to(tl.int32), k0, BLOCK_N,
                                          BLOCK_K, EMULATE)
        tl.store(y_ptr + row.to(tl.int64) * hidden + n,
                 tl.sum(acc, 1) * (act_unscale * tl.load(topk_weights_ptr + row).to(tl.float32)))
        if EARLY_TABLES:
            row = next_row
    pdl_launch_dependents(PDL and PDL_LATE)


@triton.jit
def _down_gemv_tma_persistent_f16_kernel(act_desc, w2_desc, w2_scale_desc, topk_weights_ptr, topk_ids_ptr,
                                         sorted_rows_ptr, y_ptr, num_rows, num_experts, hidden, inter, act_unscale,
                                         w2_ptr, w2_scale_ptr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                         RING: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr = False,
                                         PDL_LATE: tl.constexpr = False, L2_PREFETCH: tl.constexpr = False):
    """:func:`_down_gemv_tma_persistent_kernel` on the fp16 pair decode (as :func:`_down_gemv_tma_f16_kernel`;
    L2_PREFETCH: the program's first work item's weight block)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    items = num_rows * (hidden // BLOCK_N)
    if L2_PREFETCH:
        if pid < items:
            row = tl.load(sorted_rows_ptr + pid % num_rows, cache_modifier=".cg")
            expert = tl.load(topk_ids_ptr + row, cache_modifier=".cg")
            expert = tl.where((expert >= 0) & (expert < num_experts), expert, 0).to(tl.int64)
            _prefetch_down_block_l2(w2_ptr, w2_scale_ptr, expert * hidden + (pid // num_rows) * BLOCK_N, inter,
                                    BLOCK_N)
    pdl_wait(PDL)
    pdl_launch_dependents(PDL and not PDL_LATE)
    for t in tl.range(pid, items, nprog, flatten=True, num_stages=RING):
        block, row, expert, valid = _persistent_item(t, num_rows, sorted_rows_ptr, topk_ids_ptr, num_experts)
        w_row = expert * hidden + block * BLOCK_N
        acc = tl.zeros([BLOCK_N, BLOCK_K // 32], dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            acc += _gemv_tma_f16_step(w2_desc, w2_scale_desc, act_desc, w_row, row, k0, BLOCK_N, BLOCK_K, EMULATE)
        n = block * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(y_ptr + row.to(tl.int64) * hidden + n,
                 tl.sum(acc, 1) * (act_unscale * tl.load(topk_weights_ptr + row).to(tl.float32)),
                 mask=(n >= 0) & valid)
    pdl_launch_dependents(PDL and PDL_LATE)


@triton.jit
def _persistent_item(t, num_rows, sorted_rows_ptr, topk_ids_ptr, num_experts):
    """Work item ``t`` of a persistent TMA GEMV -> (column block, routed row, its expert, whether the id is one);
    the sorted rows vary fastest, so the rows of one expert (adjacent after the sort) read the same weight
    block at about the same time. An invalid id computes on expert 0 and stores nothing."""
    row = tl.load(sorted_rows_ptr + t % num_rows)
    expert = tl.load(topk_ids_ptr + row)  # the routed rows are the flat [B, top_k] ids
    valid = (expert >= 0) & (expert < num_experts)
    return t // num_rows, row, tl.where(valid, expert, 0).to(tl.int32), valid


@triton.jit
def _gate_up_gemv_tma_persistent_kernel(x_desc, w13_desc, w13_scale_desc, topk_ids_ptr, sorted_rows_ptr, act_ptr,
                                        num_rows, num_experts, hidden, inter, swiglu_limit, TOP_K: tl.constexpr,
                                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RING: tl.constexpr):
    """:func:`_gate_up_gemv_tma_kernel` as a persistent grid: each program takes the work items (routed row,
    block of BLOCK_N columns) ``pid, pid + nprog, ...`` of the ``num_rows * inter / BLOCK_N`` (a count from
    shapes only), the item and K loops flattened into one ``tl.range`` of RING stages, so the next item's
    first K steps are fetched while this one finishes instead of the ring filling once per short program."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    items = num_rows * (inter // BLOCK_N)
    for t in tl.range(pid, items, nprog, flatten=True, num_stages=RING):
        block, row, expert, valid = _persistent_item(t, num_rows, sorted_rows_ptr, topk_ids_ptr, num_experts)
        w_row = expert * (2 * inter) + block * (2 * BLOCK_N)
        acc = tl.zeros([2 * BLOCK_N, BLOCK_K // 32], dtype=tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            acc += _gemv_tma_step(w13_desc, w13_scale_desc, x_desc, w_row, row // TOP_K, k0, 2 * BLOCK_N, BLOCK_K)
        gate, up = tl.split(tl.reshape(tl.sum(acc, 1), [BLOCK_N, 2]))
        cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
        _store_act(act_ptr, row, cols, gate, up, swiglu_limit, inter, (cols >= 0) & valid, False)


@triton.jit
def _down_gemv_tma_persistent_kernel(act_desc, w2_desc, w2_scale_desc, topk_weights_ptr, topk_ids_ptr, sorted_rows_ptr,
                                     y_ptr, num_rows, num_experts, hidden, inter, BLOCK_N: tl.constexpr,
                                     BLOCK_K: tl.constexpr, RING: tl.constexpr):
    """:func:`_down_gemv_tma_kernel` as a persistent grid over the ``num_rows * hidden / BLOCK_N`` work items
    (routed row, block of BLOCK_N hidden columns), as :func:`_gate_up_gemv_tma_persistent_kernel`. At I = 512
    (T=4) a work item is one K step, so the flattened ring overlaps whole items."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    items = num_rows * (hidden // BLOCK_N)
    for t in tl.range(pid, items, nprog, flatten=True, num_stages=RING):
        block, row, expert, valid = _persistent_item(t, num_rows, sorted_rows_ptr, topk_ids_ptr, num_experts)
        w_row = expert * hidden + block * BLOCK_N
        acc = tl.zeros([BLOCK_N, BLOCK_K // 32], dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            acc += _gemv_tma_step(w2_desc, w2_scale_desc, act_desc, w_row, row, k0, BLOCK_N, BLOCK_K)
        n = block * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(y_ptr + row.to(tl.int64) * hidden + n,
                 tl.sum(acc, 1) * tl.load(topk_weights_ptr + row).to(tl.float32), mask=(n >= 0) & valid)


@triton.jit
def _gemv_tile_offsets(ROWS: tl.constexpr, BLOCK_K: tl.constexpr, X_F32: tl.constexpr):
    """[ROWS, G, 4] word offsets within a row block's K step, [1, G, 4] activation offsets of each
    word's first k (bf16 pairs, or X_F32 floats in the word-pair order), [G] group index (G = BLOCK_K / 32)."""
    g = tl.arange(0, BLOCK_K // 32)
    word = g[:, None] * 4 + tl.arange(0, 4)[None, :]
    if X_F32:
        x_offs = g[:, None] * 32 + tl.arange(0, 4)[None, :]
    else:
        x_offs = 4 * word
    return word[None, :, :], x_offs[None, :, :], g


@triton.jit
def _gemv_weight_pointers(w_ptr, scale_ptr, expert, rows, rows_per_expert, k_total, k_begin, words, g):
    """Pointers of a GEMV program's weight words [R, G, 4] (int32, [E, rows_per_expert, k_total/8]) and
    E8M0 scales [R, G] ([E, rows_per_expert, k_total/32]) at the start of its K range ``k_begin``.
    k_total and k_begin are multiples of 32 (validated), so every row's words start 16-byte aligned and
    the word loads can be 16 bytes wide."""
    w_row_words = tl.multiple_of(rows * (k_total // 8) + k_begin // 8, 4)
    w_ptrs = w_ptr + expert * rows_per_expert * (k_total // 8) + w_row_words[:, None, None] + words
    s_ptrs = (scale_ptr + expert * rows_per_expert * (k_total // 32) + rows[:, None] * (k_total // 32)
              + k_begin // 32 + g[None, :])
    return w_ptrs, s_ptrs


@triton.jit
def _x_f32_position(k):
    """Index of value ``k`` of a row in the word-pair float32 layout: within each 32-value group, value
    ``8w + j`` (nibble j of word w) goes to ``4j + w``."""
    return (k // 32) * 32 + (k % 8) * 4 + (k % 32) // 8


@triton.jit
def _store_act(act_ptr, row, cols, gate, up, swiglu_limit, inter, mask, X_F32: tl.constexpr):
    """The clamped SwiGLU of one routed row's columns: bf16 [B*top_k, I], or (X_F32) the bf16-rounded
    value times 2**GEMV_ACT_SHIFT as float32 in the word-pair order -- what the down GEMV reads."""
    act = _swiglu(gate, up, swiglu_limit).to(tl.bfloat16)
    if X_F32:
        tl.store(act_ptr + row.to(tl.int64) * inter + _x_f32_position(cols), act.to(tl.float32) * GEMV_ACT_SCALE,
                 mask=mask)
    else:
        tl.store(act_ptr + row.to(tl.int64) * inter + cols, act, mask=mask)


@triton.jit
def _route_x_f32_kernel(topk_ids_ptr, num_rows, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                        num_active_ptr, x_ptr, x_f32_ptr, x_numel, NUM_EXPERTS: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK_X: tl.constexpr,
                        ROUTE: tl.constexpr):
    """Launch 1 of the X_F32 GEMV: program 0 routes (``_route_kernel``; not with ROUTE False, when the
    torch sort of :func:`route` did), the others write the bf16 activations ``x [B, H]`` as float32
    times 2**GEMV_ACT_SHIFT in the word-pair order (exact), so the gate/up GEMV loads them without
    converting (still one launch)."""
    pid = tl.program_id(0)
    if ROUTE and pid == 0:
        _route_kernel(topk_ids_ptr, num_rows, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                      num_active_ptr, NUM_EXPERTS, BLOCK_ROWS, NUM_BINS)
    else:
        k = (pid - (1 if ROUTE else 0)).to(tl.int64) * BLOCK_X + tl.arange(0, BLOCK_X)
        ok = k < x_numel
        x = tl.load(x_ptr + k, mask=ok, other=0.0).to(tl.float32)
        tl.store(x_f32_ptr + _x_f32_position(k), x * GEMV_ACT_SCALE, mask=ok)


@triton.jit
def _gate_up_gemv_kernel(x_ptr, w13_ptr, w13_scale_ptr, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                         num_active_ptr, act_ptr, partial_ptr, ticket_ptr, num_rows, hidden, inter, swiglu_limit,
                         TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TWO_ROWS: tl.constexpr,
                         SPLIT_K: tl.constexpr, PREFETCH: tl.constexpr, X_F32: tl.constexpr = False):
    """Program (touched expert slot, block of BLOCK_N intermediate columns, K split): the 2*BLOCK_N
    interleaved gate/up rows of its expert against each routed row of that expert (two at a time with
    TWO_ROWS), then the clamped SwiGLU. ``x_ptr``: the bf16 activations as int32 pairs [B, H/2];
    ``w13_ptr``: the repacked weights as int32 words [E, 2I, H/8]. SPLIT_K > 1: each split writes its
    fp32 sums to ``partial [SPLIT_K, num_rows, 2I]`` (interleaved as the weight rows); the last split of
    a (slot, n block) to take its ticket sums them, applies the SwiGLU and puts the ticket back to 0.
    X_F32: ``x_ptr`` is float32 [B, H] and ``act_ptr`` float32 [B*top_k, I], both times 2**GEMV_ACT_SHIFT in
    the word-pair order (:func:`_store_act`)."""
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    w_rows = tl.program_id(1) * (2 * BLOCK_N) + tl.arange(0, 2 * BLOCK_N)
    words, pairs, g = _gemv_tile_offsets(2 * BLOCK_N, BLOCK_K, X_F32)
    x_row_len = hidden if X_F32 else hidden // 2
    k_len = hidden // SPLIT_K  # the host checks BLOCK_K divides it
    k_begin = tl.program_id(2) * k_len
    w_ptrs, s_ptrs = _gemv_weight_pointers(w13_ptr, w13_scale_ptr, expert, w_rows, 2 * inter, hidden, k_begin,
                                           words, g)
    pairs += k_begin if X_F32 else k_begin // 2
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    step = 2 if TWO_ROWS else 1
    for m in range(row_begin, row_end, step):
        row0 = tl.load(sorted_rows_ptr + m)
        has_second = m + 1 < row_end
        row1 = tl.load(sorted_rows_ptr + m + 1, mask=has_second, other=row0)
        x0 = x_ptr + (row0 // TOP_K).to(tl.int64) * x_row_len + pairs
        x1 = x_ptr + (row1 // TOP_K).to(tl.int64) * x_row_len + pairs
        out0, out1 = _gemv_rows(w_ptrs, s_ptrs, x0, x1, k_len, 2 * BLOCK_N, BLOCK_K, TWO_ROWS, PREFETCH, X_F32)
        if SPLIT_K == 1:
            gate, up = tl.split(tl.reshape(out0, [BLOCK_N, 2]))
            _store_act(act_ptr, row0, cols, gate, up, swiglu_limit, inter, cols >= 0, X_F32)
            if TWO_ROWS:
                gate, up = tl.split(tl.reshape(out1, [BLOCK_N, 2]))
                _store_act(act_ptr, row1, cols, gate, up, swiglu_limit, inter, (cols >= 0) & has_second, X_F32)
        else:
            p_split = partial_ptr + tl.program_id(2).to(tl.int64) * num_rows * (2 * inter) + w_rows
            tl.store(p_split + row0.to(tl.int64) * (2 * inter), out0)
            if TWO_ROWS:
                tl.store(p_split + row1.to(tl.int64) * (2 * inter), out1, mask=(w_rows >= 0) & has_second)
    if SPLIT_K > 1:
        tl.debug_barrier()  # every thread's partial stores precede the (release) ticket
        ticket_at = ticket_ptr + slot * tl.num_programs(1) + tl.program_id(1)
        if tl.atomic_add(ticket_at, 1, sem="acq_rel") == SPLIT_K - 1:
            for m in range(row_begin, row_end):
                row = tl.load(sorted_rows_ptr + m).to(tl.int64)
                acc = tl.zeros([2 * BLOCK_N], dtype=tl.float32)
                for split in range(SPLIT_K):
                    acc += tl.load(partial_ptr + (split * num_rows + row) * (2 * inter) + w_rows,
                                   cache_modifier=".cg")
                gate, up = tl.split(tl.reshape(acc, [BLOCK_N, 2]))
                _store_act(act_ptr, row, cols, gate, up, swiglu_limit, inter, cols >= 0, X_F32)
            tl.store(ticket_at, 0)  # left zeroed for the next launch (and graph replay)


@triton.jit
def _gate_up_gemv_tma_kernel(x_desc, w13_desc, w13_scale_desc, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                             num_active_ptr, act_ptr, hidden, inter, swiglu_limit, TOP_K: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RING: tl.constexpr):
    """:func:`_gate_up_gemv_kernel` (one routed row per pass, no K split) with the operands fetched by TMA
    (:func:`_gemv_rows_tma`): ``x_desc`` over the bf16 activations as int32 pairs [B, H/2], ``w13_desc``
    over the repacked words [E*2I, H/8], ``w13_scale_desc`` over the E8M0 bytes [E*2I, H/32]."""
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    w_row = expert * (2 * inter) + tl.program_id(1) * (2 * BLOCK_N)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    for m in range(row_begin, row_end):
        row = tl.load(sorted_rows_ptr + m)
        out = _gemv_rows_tma(w13_desc, w13_scale_desc, x_desc, w_row, row // TOP_K, 0, hidden, 2 * BLOCK_N, BLOCK_K,
                             RING)
        gate, up = tl.split(tl.reshape(out, [BLOCK_N, 2]))
        _store_act(act_ptr, row, cols, gate, up, swiglu_limit, inter, cols >= 0, False)


@triton.jit
def _down_gemv_tma_kernel(act_desc, w2_desc, w2_scale_desc, topk_weights_ptr, sorted_rows_ptr, expert_start_ptr,
                          active_experts_ptr, num_active_ptr, y_ptr, hidden, inter, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, RING: tl.constexpr):
    """:func:`_down_gemv_kernel` (one routed row per pass, no K split) with the operands fetched by TMA:
    ``act_desc`` over the bf16 SwiGLU rows as int32 pairs [B*top_k, I/2], ``w2_desc`` over the words
    [E*H, I/8], ``w2_scale_desc`` over the E8M0 bytes [E*H, I/32]."""
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    w_row = expert * hidden + tl.program_id(1) * BLOCK_N
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    for m in range(row_begin, row_end):
        row = tl.load(sorted_rows_ptr + m)
        out = _gemv_rows_tma(w2_desc, w2_scale_desc, act_desc, w_row, row, 0, inter, BLOCK_N, BLOCK_K, RING)
        tl.store(y_ptr + row.to(tl.int64) * hidden + n, out * tl.load(topk_weights_ptr + row).to(tl.float32))


@triton.jit
def _down_gemv_kernel(act_ptr, w2_ptr, w2_scale_ptr, topk_weights_ptr, sorted_rows_ptr, expert_start_ptr,
                      active_experts_ptr, num_active_ptr, y_ptr, num_rows, hidden, inter, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, TWO_ROWS: tl.constexpr, SPLIT_K: tl.constexpr,
                      PREFETCH: tl.constexpr, X_F32: tl.constexpr = False):
    """Program (touched expert slot, block of BLOCK_N hidden columns, K split): the down projection of
    each routed row of its expert over K range ``split``, times its routing weight, into fp32
    ``y [SPLIT_K, B*top_k, H]`` (the top-k sum adds the splits). ``act_ptr``: the bf16 SwiGLU rows as
    int32 pairs [B*top_k, I/2] (X_F32: float32 [B*top_k, I] from :func:`_store_act`); ``w2_ptr``: int32
    words [E, H, I/8]."""
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    words, pairs, g = _gemv_tile_offsets(BLOCK_N, BLOCK_K, X_F32)
    act_row_len = inter if X_F32 else inter // 2
    k_len = inter // SPLIT_K  # the host checks BLOCK_K divides it
    k_begin = tl.program_id(2) * k_len
    w_ptrs, s_ptrs = _gemv_weight_pointers(w2_ptr, w2_scale_ptr, expert, n, hidden, inter, k_begin, words, g)
    pairs += k_begin if X_F32 else k_begin // 2
    y_split = y_ptr + tl.program_id(2).to(tl.int64) * num_rows * hidden + n
    step = 2 if TWO_ROWS else 1
    for m in range(row_begin, row_end, step):
        row0 = tl.load(sorted_rows_ptr + m).to(tl.int64)
        has_second = m + 1 < row_end
        row1 = tl.load(sorted_rows_ptr + m + 1, mask=has_second, other=row0).to(tl.int64)
        out0, out1 = _gemv_rows(w_ptrs, s_ptrs, act_ptr + row0 * act_row_len + pairs,
                                act_ptr + row1 * act_row_len + pairs, k_len, BLOCK_N, BLOCK_K, TWO_ROWS, PREFETCH,
                                X_F32)
        tl.store(y_split + row0 * hidden, out0 * tl.load(topk_weights_ptr + row0).to(tl.float32))
        if TWO_ROWS:
            tl.store(y_split + row1 * hidden, out1 * tl.load(topk_weights_ptr + row1).to(tl.float32),
                     mask=(n >= 0) & has_second)


# ---------------------------------------------------------------------------------------------
# tensor-core pair-word decode (``upcast="pairs"``)
# ---------------------------------------------------------------------------------------------
# Each int32 weight word (8 e2m1 values) becomes four bf16 *pairs* with two shifts and one LOP3 per pair
# (nibbles j and j + 4, the same bits as the GEMV's ``_e2m1_pair``: both values times 2**-126), i.e. two
# values per 32-bit operation, and the pairs go straight into a bf16 MMA with the weights as the M side
# (rows x 32) and the routed rows as the N side -- no per-value scale multiply: the E8M0 scale multiplies
# each 32-value group's MMA result (one FFMA per accumulator element per group), the 2**126 unbias and the
# activations' 2**PAIRS_ACT_SHIFT pre-scale once in the epilogue. The MMA's K order is the pair order
# (:func:`_pairs_position`), so the activations are stored in that order (bf16 times 2**PAIRS_ACT_SHIFT,
# exact) by the routing launch (x) and the gate/up epilogue (SwiGLU rows); still four launches.
PAIRS_ACT_SHIFT: tl.constexpr = tl.constexpr(32)
PAIRS_ACT_SCALE: tl.constexpr = tl.constexpr(2.0 ** 32)
PAIRS_UNBIAS: tl.constexpr = tl.constexpr(2.0 ** (126 - 32))


@triton.jit
def _pairs_position(k):
    """Index of value ``k`` of a row in the pair order: within each 32-value group, value ``8w + j + 4h``
    (nibble ``j + 4h`` of word w, j < 4) sits at ``8w + 4 (j % 2) + 2 (j // 2) + h`` -- the order in which
    :func:`_pairs_tile` lays the group's 32 weights out."""
    j = k % 4
    return (k // 8) * 8 + 4 * (j % 2) + 2 * (j // 2) + (k // 4) % 2


@triton.jit
def _pair_bits(q, SHIFT: tl.constexpr, MUL_PAIRS: tl.constexpr):
    """int32 words -> int32 holding the bf16 pair (nibble j low, nibble j + 4 high), ``SHIFT`` = 12 - 4j:
    by two shifts and two masks, or (MUL_PAIRS) one mask, one multiply and one mask (``_e2m1_pair``)."""
    if MUL_PAIRS:
        if SHIFT >= 8:  # j = 0, 1
            pair = ((q & (0x000F000F << (12 - SHIFT))) * (0x1040 >> (12 - SHIFT))) & PAIR_BITS_MASK
        else:  # j = 2, 3: on the word shifted down a byte (the mask drops the sign fill)
            pair = (((q >> 8) & (0x000F000F << (4 - SHIFT))) * (0x1040 >> (4 - SHIFT))) & PAIR_BITS_MASK
    else:
        t = q << SHIFT
        pair = (t & SIGN_PAIR_MASK) | ((t >> 6) & 0x01C001C0)
    return pair


@triton.jit
def _pair_halves(p):
    """int32 bf16 pairs [R, 4, 2, 2] -> int16 [R, 4, 2, 2, 2] (low half first)."""
    return tl.join(p.to(tl.int16), (p >> 16).to(tl.int16))


@triton.jit
def _pairs_tile(q, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, MUL_PAIRS: tl.constexpr):
    """[ROWS, BLOCK_K/8] int32 words (BLOCK_K/32 whole groups) -> bf16 [ROWS, BLOCK_K] in the pair order
    (groups one after the other, as :func:`_pairs_position`), the values times 2**-126 (exact; the 0.5
    code is the bf16 subnormal 2**-127)."""
    first = tl.join(_pair_bits(q, 12, MUL_PAIRS), _pair_bits(q, 8, MUL_PAIRS))  # j = 0, 1
    second = tl.join(_pair_bits(q, 4, MUL_PAIRS), _pair_bits(q, 0, MUL_PAIRS))  # j = 2, 3
    both = _pair_halves(tl.join(first, second))  # [ROWS, w, j % 2, j // 2, h]
    return tl.reshape(both, [ROWS, BLOCK_K]).to(tl.bfloat16, bitcast=True)


@triton.jit
def _scale_pairs_bf16(w, s, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_BF16: tl.constexpr):
    """bf16 pair tile [ROWS, BLOCK_K] (values times 2**-126) times its E8M0 bytes [ROWS, BLOCK_K/32] as
    2**(byte - 127 + 126 - PAIRS_ACT_SHIFT) in bf16 (packed HMUL2): the dequantised value over
    2**PAIRS_ACT_SHIFT, exact while the product is a normal bf16 (bytes 34..160; bytes above 160 give inf).
    SCALE_BF16 == 2: the same products in float32 by bits (the CPU interpreter's bf16 arithmetic and
    bf16 <-> fp32 casts are wrong; these products are exact either way)."""
    exponent = tl.minimum((s.to(tl.int32) & 0xFF) + (127 - 1 - PAIRS_ACT_SHIFT), 255)
    w3 = tl.reshape(w, [ROWS, BLOCK_K // 32, 32])
    if SCALE_BF16 == 2:
        factor = (exponent << 23).to(tl.float32, bitcast=True)
        wide = ((w3.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
        prod = wide * factor[:, :, None]
        w3 = (prod.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        factor = (exponent << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
        w3 = w3 * factor[:, :, None]
    return tl.reshape(w3, [ROWS, BLOCK_K])


@triton.jit
def _scale_pair_words(p, factor, EMULATE: tl.constexpr):
    """int32 bf16 pair words ``p`` times ``factor`` (int32: the same bf16 power of two in both halves),
    one PTX ``mul.rn.bf16x2`` per word, so the words go on to the MMA operand without being split into
    bf16 values first (no half swaps around a packed multiply). The products are exact while normal
    (E8M0 bytes 34..160, as :func:`_scale_pairs_bf16`). EMULATE: the same products in float32 by bits
    (the CPU interpreter runs no inline PTX)."""
    if EMULATE:
        f = (factor << 16).to(tl.float32, bitcast=True)
        lo = ((p << 16).to(tl.float32, bitcast=True) * f).to(tl.int32, bitcast=True)
        hi = ((p & HIGH_HALF_MASK).to(tl.float32, bitcast=True) * f).to(tl.int32, bitcast=True)
        return ((lo >> 16) & 0xFFFF) | (hi & HIGH_HALF_MASK)
    else:
        return tl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [p, factor], dtype=tl.int32,
                                         is_pure=True, pack=1)


@triton.jit
def _pairs_tile_scaled(q, s, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, MUL_PAIRS: tl.constexpr,
                       EMULATE: tl.constexpr):
    """:func:`_pairs_tile` with the E8M0 bytes ``s`` [ROWS, BLOCK_K/32] applied to
    the int32 pair words (:func:`_scale_pair_words`): bf16 [ROWS, BLOCK_K] in the pair order, the
    dequantised values over 2**PAIRS_ACT_SHIFT."""
    exponent = tl.minimum((s.to(tl.int32) & 0xFF) + (127 - 1 - PAIRS_ACT_SHIFT), 255)
    factor = tl.reshape((exponent << 7) * 0x10001, [ROWS, BLOCK_K // 32, 1])  # one per 32-group, both halves
    q3 = tl.reshape(q, [ROWS, BLOCK_K // 32, 4])
    first = tl.join(_scale_pair_words(_pair_bits(q3, 12, MUL_PAIRS), factor, EMULATE),
                    _scale_pair_words(_pair_bits(q3, 8, MUL_PAIRS), factor, EMULATE))
    second = tl.join(_scale_pair_words(_pair_bits(q3, 4, MUL_PAIRS), factor, EMULATE),
                     _scale_pair_words(_pair_bits(q3, 0, MUL_PAIRS), factor, EMULATE))
    both = _pair_halves(tl.join(first, second))
    return tl.reshape(both, [ROWS, BLOCK_K]).to(tl.bfloat16, bitcast=True)


@triton.jit
def _pairs_rows_bf16(w_ptrs, s_ptrs, a_ptrs, a_ok, k_len, ROWS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_K: tl.constexpr, MUL_PAIRS: tl.constexpr, SCALE_BF16: tl.constexpr):
    """:func:`_pairs_rows` with the E8M0 scale applied to the pair words (:func:`_scale_pairs_bf16`), so a
    whole K step is one MMA (one shared-memory round trip of the tile, no per-group FFMA). ``w_ptrs``
    [ROWS, BLOCK_K/8] words, ``s_ptrs`` [ROWS, BLOCK_K/32], ``a_ptrs`` [BLOCK_M, BLOCK_K] of step 0. Same
    result scale as :func:`_pairs_rows` (times 2**(-126 + PAIRS_ACT_SHIFT))."""
    acc = tl.zeros([ROWS, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        if SCALE_BF16 >= 3:  # the scale on the int32 pair words (3: PTX, 4: emulated)
            w = _pairs_tile_scaled(tl.load(w_ptrs + k0 // 8), tl.load(s_ptrs + k0 // 32), ROWS, BLOCK_K,
                                   MUL_PAIRS, SCALE_BF16 == 4)
        else:
            w = _pairs_tile(tl.load(w_ptrs + k0 // 8), ROWS, BLOCK_K, MUL_PAIRS)
            w = _scale_pairs_bf16(w, tl.load(s_ptrs + k0 // 32), ROWS, BLOCK_K, SCALE_BF16)
        a = tl.load(a_ptrs + k0, mask=a_ok, other=0.0)
        acc = tl.dot(w, tl.trans(a), acc)
    return acc * (1.0 / PAIRS_UNBIAS)


@triton.jit
def _pairs_rows(w_ptrs, s_ptrs, a_ptrs, a_ok, k_len, ROWS: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_K: tl.constexpr, MUL_PAIRS: tl.constexpr):
    """``w_ptrs`` [ROWS, 4] int32 words, ``s_ptrs`` [ROWS, 1] E8M0 bytes, ``a_ptrs`` [BLOCK_M, 32] pair-ordered
    activations (times 2**PAIRS_ACT_SHIFT) of group 0 -> float32 [ROWS, BLOCK_M] dot products times
    2**(-126 + PAIRS_ACT_SHIFT) (the epilogue multiplies PAIRS_UNBIAS)."""
    acc = tl.zeros([ROWS, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        for gi in tl.static_range(BLOCK_K // 32):
            g = k0 // 32 + gi
            w = _pairs_tile(tl.load(w_ptrs + g * 4), ROWS, 32, MUL_PAIRS)
            factor = _e8m0_to_f32(tl.load(s_ptrs + g))
            a = tl.load(a_ptrs + g * 32, mask=a_ok, other=0.0)
            acc += tl.dot(w, tl.trans(a)) * factor
    return acc


@triton.jit
def _pairs_pointers(w_ptr, scale_ptr, expert, rows, rows_per_expert, k_total, STEP: tl.constexpr):
    """Step-0 pointers of a pairs program that takes STEP values of K at a time: weight words [R, STEP/8]
    (int32, [E, rows_per_expert, k_total/8]; 16-byte aligned since k_total is a multiple of 32) and E8M0
    scales [R, STEP/32] ([E, rows_per_expert, k_total/32])."""
    row_words = tl.multiple_of(rows * (k_total // 8), 4)
    expert_words = tl.multiple_of(expert * rows_per_expert * (k_total // 8), 4)
    w_ptrs = w_ptr + expert_words + row_words[:, None] + tl.arange(0, STEP // 8)[None, :]
    s_ptrs = (scale_ptr + expert * rows_per_expert * (k_total // 32) + rows[:, None] * (k_total // 32)
              + tl.arange(0, STEP // 32)[None, :])
    return w_ptrs, s_ptrs


@triton.jit
def _route_pairs_kernel(topk_ids_ptr, num_rows, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                        num_active_ptr, x_ptr, x_pairs_ptr, x_numel, NUM_EXPERTS: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK_X: tl.constexpr):
    """Launch 1 of the pairs decode: program 0 routes (``_route_kernel``), the others write the bf16
    activations ``x [B, H]`` times 2**PAIRS_ACT_SHIFT in the pair order (exact)."""
    pid = tl.program_id(0)
    if pid == 0:
        _route_kernel(topk_ids_ptr, num_rows, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                      num_active_ptr, NUM_EXPERTS, BLOCK_ROWS, NUM_BINS)
    else:
        k = (pid - 1).to(tl.int64) * BLOCK_X + tl.arange(0, BLOCK_X)
        ok = k < x_numel
        x = tl.load(x_ptr + k, mask=ok, other=0.0).to(tl.float32)
        tl.store(x_pairs_ptr + _pairs_position(k), (x * PAIRS_ACT_SCALE).to(tl.bfloat16), mask=ok)


@triton.jit
def _pairs_routed_rows(sorted_rows_ptr, m0, row_end, BLOCK_M: tl.constexpr):
    """The next BLOCK_M of an expert's sorted routed rows from ``m0`` (which of them are below ``row_end``)."""
    m = m0 + tl.arange(0, BLOCK_M)
    m_ok = m < row_end
    return tl.load(sorted_rows_ptr + m, mask=m_ok, other=0), m_ok


@triton.jit
def _store_pairs_act(act_ptr, acc, rows, m_ok, cols, inter, swiglu_limit, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, NATURAL_ACT: tl.constexpr = False):
    """Gate/up epilogue of the pairs decode: ``acc`` [2*BLOCK_N interleaved gate/up rows, BLOCK_M routed rows]
    -> the clamped SwiGLU, stored bf16 times 2**PAIRS_ACT_SHIFT at the pair positions of ``cols``; NATURAL_ACT:
    plain bf16 at ``cols`` (what the TMA GEMV down launch reads: the mixed forward)."""
    gate, up = tl.split(tl.reshape(tl.trans(acc * PAIRS_UNBIAS), [BLOCK_M, BLOCK_N, 2]))
    if NATURAL_ACT:
        tl.store(act_ptr + rows.to(tl.int64)[:, None] * inter + cols[None, :],
                 _swiglu(gate, up, swiglu_limit).to(tl.bfloat16), mask=m_ok[:, None])
    else:
        act = _swiglu(gate, up, swiglu_limit).to(tl.bfloat16).to(tl.float32) * PAIRS_ACT_SCALE
        tl.store(act_ptr + rows.to(tl.int64)[:, None] * inter + _pairs_position(cols)[None, :],
                 act.to(tl.bfloat16), mask=m_ok[:, None])


@triton.jit
def _store_pairs_down(y_ptr, acc, rows, m_ok, n, topk_weights_ptr, hidden):
    """Down epilogue of the pairs decode: ``acc`` [hidden columns ``n``, routed ``rows``] times each row's
    routing weight into fp32 ``y [B*top_k, H]``."""
    weight = tl.load(topk_weights_ptr + rows, mask=m_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows[None, :] * hidden + n[:, None], acc * PAIRS_UNBIAS * weight[None, :], mask=m_ok[None, :])


@triton.jit
def _gate_up_pairs_kernel(x_ptr, w13_ptr, w13_scale_ptr, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                          num_active_ptr, act_ptr, hidden, inter, swiglu_limit, TOP_K: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          MUL_PAIRS: tl.constexpr, SCALE_BF16: tl.constexpr = 0):
    """Program (touched expert slot, block of BLOCK_N intermediate columns): the 2*BLOCK_N interleaved
    gate/up rows of its expert against up to BLOCK_M of its routed rows per pass, then the clamped SwiGLU,
    stored bf16 times 2**PAIRS_ACT_SHIFT in the pair order. ``x_ptr``: pair-ordered x [B, H] from
    ``_route_pairs_kernel``; ``w13_ptr``: the repacked weights as int32 words [E, 2I, H/8]."""
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    w_rows = tl.program_id(1) * (2 * BLOCK_N) + tl.arange(0, 2 * BLOCK_N)
    STEP: tl.constexpr = BLOCK_K if SCALE_BF16 else 32  # K values per load: a K step, or one group
    w_ptrs, s_ptrs = _pairs_pointers(w13_ptr, w13_scale_ptr, expert, w_rows, 2 * inter, hidden, STEP)
    kg = tl.arange(0, STEP)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    for m0 in range(row_begin, row_end, BLOCK_M):
        rows, m_ok = _pairs_routed_rows(sorted_rows_ptr, m0, row_end, BLOCK_M)
        a_ptrs = x_ptr + (rows // TOP_K).to(tl.int64)[:, None] * hidden + kg[None, :]
        if SCALE_BF16:
            acc = _pairs_rows_bf16(w_ptrs, s_ptrs, a_ptrs, m_ok[:, None], hidden, 2 * BLOCK_N, BLOCK_M, BLOCK_K,
                                   MUL_PAIRS, SCALE_BF16)
        else:
            acc = _pairs_rows(w_ptrs, s_ptrs, a_ptrs, m_ok[:, None], hidden, 2 * BLOCK_N, BLOCK_M, BLOCK_K,
                              MUL_PAIRS)
        _store_pairs_act(act_ptr, acc, rows, m_ok, cols, inter, swiglu_limit, BLOCK_M, BLOCK_N)


@triton.jit
def _down_pairs_kernel(act_ptr, w2_ptr, w2_scale_ptr, topk_weights_ptr, sorted_rows_ptr, expert_start_ptr,
                       active_experts_ptr, num_active_ptr, y_ptr, hidden, inter, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MUL_PAIRS: tl.constexpr,
                       SCALE_BF16: tl.constexpr = 0):
    """Program (touched expert slot, block of BLOCK_N hidden columns): the down projection of up to
    BLOCK_M routed rows per pass (pair-ordered SwiGLU rows from the gate/up launch), times the routing
    weight, into fp32 ``y [B*top_k, H]``; ``w2_ptr``: int32 words [E, H, I/8]."""
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    STEP: tl.constexpr = BLOCK_K if SCALE_BF16 else 32  # K values per load: a K step, or one group
    w_ptrs, s_ptrs = _pairs_pointers(w2_ptr, w2_scale_ptr, expert, n, hidden, inter, STEP)
    kg = tl.arange(0, STEP)
    for m0 in range(row_begin, row_end, BLOCK_M):
        rows, m_ok = _pairs_routed_rows(sorted_rows_ptr, m0, row_end, BLOCK_M)
        rows = rows.to(tl.int64)
        a_ptrs = act_ptr + rows[:, None] * inter + kg[None, :]
        if SCALE_BF16:
            acc = _pairs_rows_bf16(w_ptrs, s_ptrs, a_ptrs, m_ok[:, None], inter, BLOCK_N, BLOCK_M, BLOCK_K,
                                   MUL_PAIRS, SCALE_BF16)
        else:
            acc = _pairs_rows(w_ptrs, s_ptrs, a_ptrs, m_ok[:, None], inter, BLOCK_N, BLOCK_M, BLOCK_K, MUL_PAIRS)
        _store_pairs_down(y_ptr, acc, rows, m_ok, n, topk_weights_ptr, hidden)


# Swap-AB on tensor cores fed by TMA (round 15, issue 4): the pairs decode's MMA (weights the M side, up to BLOCK_M
# routed rows of the expert the N side, the E8M0 factor on the pair words) with the weight words and scale bytes of
# each K step fetched by TMA through a ring of RING shared-memory stages and the TMA GEMV's grid (16-64 weight rows
# per program, K steps of 512) -- so the MMA does the multiply-adds the GEMV spends two FP32 instructions per pair on.
@triton.jit
def _column_halves(t, ROWS: tl.constexpr, N: tl.constexpr):
    """[ROWS, N] -> its first N/2 columns and its last N/2 columns (register reshapes, no memory)."""
    return tl.split(tl.permute(tl.reshape(t, [ROWS, 2, N // 2]), [0, 2, 1]))


@triton.jit
def _pairs_sub_step(w_desc, w_row, kw, s, a_ptrs, a_ok, acc, ROWS: tl.constexpr, SUB_K: tl.constexpr,
                    MUL_PAIRS: tl.constexpr, SCALE_BF16: tl.constexpr):
    """One MMA of SUB_K values of K: the weight words [ROWS, SUB_K/8] at word column ``kw`` of ``w_desc`` (TMA), their
    E8M0 bytes ``s`` [ROWS, SUB_K/32], the activations at ``a_ptrs`` [BLOCK_M, SUB_K] -> ``acc`` + W A^T."""
    q = w_desc.load([w_row, kw])
    if SCALE_BF16 >= 3:  # the scale on the int32 pair words (3: PTX, 4: emulated)
        w = _pairs_tile_scaled(q, s, ROWS, SUB_K, MUL_PAIRS, SCALE_BF16 == 4)
    else:
        w = _scale_pairs_bf16(_pairs_tile(q, ROWS, SUB_K, MUL_PAIRS), s, ROWS, SUB_K, SCALE_BF16)
    a = tl.load(a_ptrs, mask=a_ok, other=0.0)
    return tl.dot(w, tl.trans(a), acc)


@triton.jit
def _pairs_rows_tma(w_desc, s_desc, w_row, a_ptrs, a_ok, k_len, ROWS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_K: tl.constexpr, MUL_PAIRS: tl.constexpr, SCALE_BF16: tl.constexpr, RING: tl.constexpr,
                    SUB_K: tl.constexpr):
    """:func:`_pairs_rows_bf16` with the weight words (int32, row ``w_row`` of ``w_desc``, blocks [ROWS, SUB_K/8]) and
    their E8M0 bytes [ROWS, BLOCK_K/32] (``s_desc``) fetched by TMA through a ``tl.range`` of RING stages; the
    pair-ordered activations ``a_ptrs`` [BLOCK_M, SUB_K] of step 0 by plain (masked) loads. A K step of BLOCK_K is
    BLOCK_K / SUB_K (1, 2 or 4) MMAs of SUB_K (round 18): the dequantised operand of a 512-wide MMA alone is 128
    registers per thread, so smaller MMAs hold fewer registers (more resident warps); the scale bytes stay one TMA
    block of 16 bytes per row (TMA's smallest). Same result scale."""
    CHUNKS: tl.constexpr = BLOCK_K // SUB_K
    G: tl.constexpr = SUB_K // 32  # scale bytes per row of one MMA
    acc = tl.zeros([ROWS, BLOCK_M], dtype=tl.float32)
    w_row = w_row.to(tl.int32)  # descriptor coordinates are 32-bit
    for k0 in tl.range(0, k_len, BLOCK_K, num_stages=RING):
        s = s_desc.load([w_row, k0 // 32])
        kw = k0 // 8
        if CHUNKS == 1:
            acc = _pairs_sub_step(w_desc, w_row, kw, s, a_ptrs + k0, a_ok, acc, ROWS, SUB_K, MUL_PAIRS, SCALE_BF16)
        elif CHUNKS == 2:
            s0, s1 = _column_halves(s, ROWS, 2 * G)
            acc = _pairs_sub_step(w_desc, w_row, kw, s0, a_ptrs + k0, a_ok, acc, ROWS, SUB_K, MUL_PAIRS, SCALE_BF16)
            acc = _pairs_sub_step(w_desc, w_row, kw + SUB_K // 8, s1, a_ptrs + (k0 + SUB_K), a_ok, acc, ROWS, SUB_K,
                                  MUL_PAIRS, SCALE_BF16)
        else:
            tl.static_assert(CHUNKS == 4, "BLOCK_K / SUB_K must be 1, 2 or 4")
            h0, h1 = _column_halves(s, ROWS, 4 * G)
            s0, s1 = _column_halves(h0, ROWS, 2 * G)
            s2, s3 = _column_halves(h1, ROWS, 2 * G)
            acc = _pairs_sub_step(w_desc, w_row, kw, s0, a_ptrs + k0, a_ok, acc, ROWS, SUB_K, MUL_PAIRS, SCALE_BF16)
            acc = _pairs_sub_step(w_desc, w_row, kw + SUB_K // 8, s1, a_ptrs + (k0 + SUB_K), a_ok, acc, ROWS, SUB_K,
                                  MUL_PAIRS, SCALE_BF16)
            acc = _pairs_sub_step(w_desc, w_row, kw + 2 * (SUB_K // 8), s2, a_ptrs + (k0 + 2 * SUB_K), a_ok, acc, ROWS,
                                  SUB_K, MUL_PAIRS, SCALE_BF16)
            acc = _pairs_sub_step(w_desc, w_row, kw + 3 * (SUB_K // 8), s3, a_ptrs + (k0 + 3 * SUB_K), a_ok, acc, ROWS,
                                  SUB_K, MUL_PAIRS, SCALE_BF16)
    return acc * (1.0 / PAIRS_UNBIAS)


@triton.jit
def _gate_up_pairs_tma_kernel(x_ptr, w13_desc, w13_scale_desc, sorted_rows_ptr, expert_start_ptr, active_experts_ptr,
                              num_active_ptr, act_ptr, hidden, inter, swiglu_limit, TOP_K: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              MUL_PAIRS: tl.constexpr, SCALE_BF16: tl.constexpr, RING: tl.constexpr,
                              NATURAL_ACT: tl.constexpr = False, SUB_K: tl.constexpr = 0):
    """:func:`_gate_up_pairs_kernel` with the weights by TMA (:func:`_pairs_rows_tma`): ``w13_desc`` over the
    repacked words [E*2I, H/8], ``w13_scale_desc`` over the E8M0 bytes [E*2I, H/32]. NATURAL_ACT: the SwiGLU rows
    as plain bf16 in natural order, for the TMA GEMV down launch (:func:`_store_pairs_act`). SUB_K: K values per MMA
    (0: BLOCK_K), ``w13_desc`` blocks of [2*BLOCK_N, SUB_K/8] words."""
    MMA_K: tl.constexpr = BLOCK_K if SUB_K == 0 else SUB_K
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    w_row = expert * (2 * inter) + tl.program_id(1) * (2 * BLOCK_N)
    kg = tl.arange(0, MMA_K)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    for m0 in range(row_begin, row_end, BLOCK_M):
        rows, m_ok = _pairs_routed_rows(sorted_rows_ptr, m0, row_end, BLOCK_M)
        a_ptrs = x_ptr + (rows // TOP_K).to(tl.int64)[:, None] * hidden + kg[None, :]
        acc = _pairs_rows_tma(w13_desc, w13_scale_desc, w_row, a_ptrs, m_ok[:, None], hidden, 2 * BLOCK_N, BLOCK_M,
                              BLOCK_K, MUL_PAIRS, SCALE_BF16, RING, MMA_K)
        _store_pairs_act(act_ptr, acc, rows, m_ok, cols, inter, swiglu_limit, BLOCK_M, BLOCK_N, NATURAL_ACT)


@triton.jit
def _down_pairs_tma_kernel(act_ptr, w2_desc, w2_scale_desc, topk_weights_ptr, sorted_rows_ptr, expert_start_ptr,
                           active_experts_ptr, num_active_ptr, y_ptr, hidden, inter, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MUL_PAIRS: tl.constexpr,
                           SCALE_BF16: tl.constexpr, RING: tl.constexpr, SUB_K: tl.constexpr = 0):
    """:func:`_down_pairs_kernel` with the weights by TMA: ``w2_desc`` over the words [E*H, I/8] (blocks of
    [BLOCK_N, SUB_K/8]), ``w2_scale_desc`` over the E8M0 bytes [E*H, I/32]. SUB_K: K values per MMA (0: BLOCK_K)."""
    MMA_K: tl.constexpr = BLOCK_K if SUB_K == 0 else SUB_K
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    w_row = expert * hidden + tl.program_id(1) * BLOCK_N
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    kg = tl.arange(0, MMA_K)
    for m0 in range(row_begin, row_end, BLOCK_M):
        rows, m_ok = _pairs_routed_rows(sorted_rows_ptr, m0, row_end, BLOCK_M)
        rows = rows.to(tl.int64)
        a_ptrs = act_ptr + rows[:, None] * inter + kg[None, :]
        acc = _pairs_rows_tma(w2_desc, w2_scale_desc, w_row, a_ptrs, m_ok[:, None], inter, BLOCK_N, BLOCK_M,
                              BLOCK_K, MUL_PAIRS, SCALE_BF16, RING, MMA_K)
        _store_pairs_down(y_ptr, acc, rows, m_ok, n, topk_weights_ptr, hidden)


@triton.jit
def _to_bf16_kernel(src_ptr, dst_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < numel).to(tl.bfloat16), mask=offs < numel)


@triton.jit
def _topk_sum_kernel(y_ptr, topk_ids_ptr, out_ptr, hidden, split_stride, NUM_EXPERTS: tl.constexpr,
                     TOP_K: tl.constexpr, BLOCK_H: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr = False,
                     PDL_LATE: tl.constexpr = False, EARLY_TABLES: tl.constexpr = False):
    """out[token] = sum over its top-k rows (and SPLITS K splits ``split_stride`` floats apart) of y. EARLY_TABLES:
    every row loaded with the ids (the rows of invalid ids, never written, dropped by a select rather than a mask),
    one round trip instead of two in a row."""
    pdl_wait(PDL)
    pdl_launch_dependents(PDL and not PDL_LATE)
    token = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        e = tl.load(topk_ids_ptr + token * TOP_K + k)
        valid = (e >= 0) & (e < NUM_EXPERTS)  # rows of invalid ids were never written
        for split in tl.static_range(SPLITS):
            if EARLY_TABLES:
                part = tl.load(y_ptr + split * split_stride + (token * TOP_K + k) * hidden + h, mask=h < hidden,
                               other=0.0)
                acc += tl.where(valid, part, 0.0)
            else:
                acc += tl.load(y_ptr + split * split_stride + (token * TOP_K + k) * hidden + h,
                               mask=valid & (h < hidden), other=0.0)
    tl.store(out_ptr + token * hidden + h, acc.to(tl.bfloat16), mask=h < hidden)
    pdl_launch_dependents(PDL and PDL_LATE)


def launch_topk_sum(y, ids, out, num_experts: int, split_stride: int = 0, splits: int = 1, pdl_args=None,
                    early_tables: bool = False) -> None:
    """The last launch of every decode forward: each token's top-k rows of ``y`` (``splits`` K splits
    ``split_stride`` floats apart) summed into the bf16 ``out``."""
    batch, hidden = out.shape
    _topk_sum_kernel[(batch, triton.cdiv(hidden, TOPK_SUM_BLOCK))](
        y, ids, out, hidden, split_stride, NUM_EXPERTS=num_experts, TOP_K=ids.shape[1], BLOCK_H=TOPK_SUM_BLOCK,
        SPLITS=splits, EARLY_TABLES=early_tables, num_warps=4, **(pdl_args or {}))


# ---------------------------------------------------------------------------------------------
# launch configuration
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# How the bf16-activation GEMMs upcast the weights, chosen from the H200 run in benchmarks/moe_mxfp4-h200.md:
# tl.dot_scaled (Triton's layout-aware e2m1 upcast) was 13-17 % faster at I = 2048 (T=1) and for prefill,
# the explicit register dequantisation 3-9 % faster for decode at I = 512 (T=4).
DOT_SCALED_MIN_INTER = 1024


def use_dot_scaled(num_rows: int, inter: int) -> bool:
    return num_rows > DECODE_MAX_ROWS or inter >= DOT_SCALED_MIN_INTER


# How the bf16-activation GEMMs turn e2m1 x E8M0 weights into bf16 MMA operands:
#   "dot_scaled": tl.dot_scaled (Triton's upcast, through shared memory);
#   "regs":       _dequant_tile, float32 per value then tl.join/tl.reshape into k order;
#   "split_f32" / "split_bf16": _dequant_nibble_tiles, low and high nibbles as two tiles multiplied
#                 with the even and odd activation columns (no interleaving), scale in bf16 (HMUL2);
#                 the e2m1 unbias multiply in float32 (FMUL) or packed bf16 (HMUL2).
UPCASTS = ("dot_scaled", "regs", "split_f32", "split_bf16")
# No tensor core: the CUDA-core weight-streaming GEMV (_gate_up_gemv_kernel / _down_gemv_kernel), one
# or two routed rows per pass over a weight block. ``upcast`` takes it beside the GEMM upcasts.
GEMV = "gemv"
# Tensor cores on int32 weight words turned into bf16 pairs (_gate_up_pairs_kernel / _down_pairs_kernel),
# E8M0 scale per 32-group on the MMA result, activations pre-ordered by the routing launch.
PAIRS = "pairs"
# The prefill grouped GEMM pair of kernels/moe_prefill.py (register pair-word upcast, weights as the MMA's M side,
# row blocks of 32-128 by routed rows); default where :func:`moe_prefill.prefill_default` says the H200 measured it
# faster.
PREFILL = "prefill"
FORWARD_UPCASTS = UPCASTS + (GEMV, PAIRS, PREFILL)
_SPLIT_NIBBLES = {"split_f32": SCALE_MATH_F32, "split_bf16": SCALE_MATH_BF16}


def _split_nibbles(upcast: str) -> int:
    """SPLIT_NIBBLES constexpr for ``upcast``; bf16 arithmetic runs as float32 in the CPU interpreter."""
    math = _SPLIT_NIBBLES.get(upcast, 0)
    return SCALE_MATH_F32 if math == SCALE_MATH_BF16 and interpreter_enabled() else math


SPLIT_NIBBLES_MIN_INTER = 2048  # decode at I = 2048: split_bf16 12-18 % faster than tl.dot_scaled (H200)


# Where the CUDA-core GEMV is the default decode: (per-rank I, fewest and most routed rows) at which it
# beat the tl.dot decode on the H200 (benchmarks/moe_mxfp4-h200-gemv.md, tiles of gemv_configs):
# I = 2048 (T=1) at B = 1 and 8 (62.7 vs 84.0 us, 368 vs 466 us), I = 512 (T=4) at B = 1, 8, 64 (29.3 vs
# 47.3, 115 vs 211, 750 vs 809 us). It was slower at I = 2048, B = 64 (2681 vs 1979 us) and at B = 256
# (3.7x / 2.6x slower: one weight pass per routed row); T = 2 and T = 8 are not measured. The pairs decode
# (PAIRS_DEFAULT_WHERE, checked first) has since taken I = 512 from B = 9. At I = 2048 the TMA form of the
# GEMV (GEMV_TMA_WHERE) beat the pairs decode at B = 8 and 16 (round 8b), and at I = 1024 (T=2) at B = 1..16
# (run 8), so the GEMV runs there up to B = 16.
GEMV_DEFAULT_WHERE = ((MOE_INTERMEDIATE_SIZE, TOP_K, 16 * TOP_K), (MOE_INTERMEDIATE_SIZE // 2, TOP_K, 16 * TOP_K),
                      (MOE_INTERMEDIATE_SIZE // 4, TOP_K, 64 * TOP_K))


# Where the tensor-core pairs decode is the default (tiles of :func:`pairs_configs`; measured in the scale_bf16 form,
# the scale on the pair words since round 9: PAIRS_SCALE_ON_WORDS_MIN_ROWS),
# from H200 runs of pairs n32k128w4s3mulh / n64k128w4s3mulh beside the defaults of the time
# (benchmarks/moe_mxfp4-h200-run3.md, run4a.md, run4b.md, run5.md, run5b.md; every point reference-checked):
# I = 2048 (T=1): faster at B = 9 / 10 / 11 / 12 / 13 / 14 / 15 (382.9 vs 482.3, 451.2 vs 574.6, 495.8 vs
#   636.4, 497.4 vs 634.9, 578.5 vs 734.4, 565.5 vs 728.4, 613.1 vs 786.7 us against tl.dot split_bf16) and
#   B = 16 / 32 / 64 / 128 / 256 (641.6 vs 817.1, 1066 vs 1372, 1543 vs 1973, 1950 vs 2559, 2054 vs 2667 us);
#   B = 8 by 1-2 % in three runs against the GEMV (370.6 vs 374.4, 367.8 vs 374.8, 367.5 vs 374.6 us);
#   B = 1 slower (65.0 vs 63.8 us); since round 8b the TMA GEMV is faster up to B = 16 (GEMV_TMA_WHERE), so
#   the pairs decode starts at B = 17 there;
# I = 512 (T=4): faster at B = 9 / 10 / 11 / 12 / 13 / 14 / 15 (120.2 vs 132.5, 137.2 vs 143.1, 137.3 vs
#   156.7, 150.3 vs 168.7, 153.0 vs 182.3, 176.5 vs 191.4, 186.8 vs 202.6 us against the GEMV) and B = 16 /
#   32 / 64 / 128 / 256 (185.9 vs 217.3, 305 vs 412, 428 vs 672, 537 vs 1005, 590 vs 1071 us); B = 1 and 8
#   slower than the GEMV (B = 8: 120.1 vs 118.0 us);
# I = 1024 (T=2) and I = 256 (T=8): faster at every measured B = 1 / 8 / 16 / 32 / 64 (T=2: 47.3 vs 64.0,
#   193.7 vs 291.4, 354.8 vs 542.6, 582.1 vs 902.1, 766.7 vs 1189.9 us; T=8: 32.9 vs 36.7, 68.9 vs 111.9,
#   121.0 vs 192.5, 180.9 vs 304.7, 259.1 vs 461.2 us against dot_scaled / regs); at T=2 the TMA GEMV has since
#   beaten it at B = 1..16 (run 8), so there the pairs decode starts at B = 17.
# Unmeasured: B > 64 at T = 2 and 8 keep the earlier choice; B = 17..255 between measured wins take the
# pairs form. (inter, min routed rows, max routed rows):
PAIRS_DEFAULT_WHERE = ((MOE_INTERMEDIATE_SIZE, 16 * TOP_K + 1, 256 * TOP_K),
                       (MOE_INTERMEDIATE_SIZE // 2, 16 * TOP_K + 1, 64 * TOP_K),
                       (MOE_INTERMEDIATE_SIZE // 4, 9 * TOP_K, 256 * TOP_K),
                       (MOE_INTERMEDIATE_SIZE // 8, TOP_K, 64 * TOP_K))


# E8M0 bytes for which the pairs decode (the E8M0 factor multiplied onto the bf16 pair words) and the prefill GEMM
# (the same pair words) are exact: above 160 the products overflow bf16 (inf), below 34 they leave its normal range.
# Checkpoint scales lie far inside (DSv4-Flash's experts: bytes around 110-130); the GEMV forms and the split-nibble /
# tl.dot upcasts apply the factor in float32 and are exact for every byte.
PAIRS_EXACT_SCALE_BYTES = (34, 160)


def scale_byte_range(*scales: torch.Tensor) -> tuple[int, int]:
    """(smallest, largest) E8M0 byte over ``scales`` (float8_e8m0fnu or uint8): a reduction and one host sync, for
    load time."""
    lows, highs = zip(*(torch.aminmax(scale_bytes(s).reshape(-1)) for s in scales if s.numel()))
    return int(torch.stack(lows).min()), int(torch.stack(highs).max())


def pairs_exact_for(byte_range: tuple[int, int]) -> bool:
    """Whether E8M0 bytes in ``byte_range`` (:func:`scale_byte_range`) keep the pairs decode and the prefill exact."""
    return PAIRS_EXACT_SCALE_BYTES[0] <= byte_range[0] and byte_range[1] <= PAIRS_EXACT_SCALE_BYTES[1]


def default_upcast(num_rows: int, inter: int, tma: bool = True, pairs: bool = True) -> str:
    """The decode/prefill variant :func:`moe_mxfp4_forward` runs when not told: the tensor-core pairs
    decode and the CUDA-core GEMV where the H200 measured them faster (:data:`PAIRS_TMA_WHERE` where ``tma``
    says the operands allow its TMA-fed form, :data:`PAIRS_DEFAULT_WHERE`, :data:`GEMV_DEFAULT_WHERE`), else
    :func:`default_gemm_upcast`; first the TMA pairs decode where ``tma`` and :data:`PAIRS_TMA_ROWS_WHERE` say, then
    the fp16 TMA GEMV where ``tma`` and :data:`GEMV_TMA_F16_WHERE` say; above DECODE_MAX_ROWS the prefill grouped
    GEMM where :func:`moe_prefill.prefill_default` says, except where the TMA pairs decode's table reaches (up to
    :data:`PAIRS_MAX_ROWS`). ``pairs`` False (scales outside :data:`PAIRS_EXACT_SCALE_BYTES`): never the pairs
    decode nor the prefill GEMM; the GEMV where it is a default, else :func:`default_gemm_upcast`."""
    if not pairs:
        gemv = (tma and gemv_f16_default(num_rows, inter)) or any(
            inter == where_inter and lo <= num_rows <= hi for where_inter, lo, hi in GEMV_DEFAULT_WHERE)
        return GEMV if gemv else default_gemm_upcast(num_rows, inter)
    if num_rows > DECODE_MAX_ROWS and not (tma and pairs_rows_tiles(num_rows, inter)):
        from .moe_prefill import prefill_default  # moe_prefill builds on this module, so it is imported at call time
        if prefill_default(num_rows, inter):
            return PREFILL
    if tma and pairs_rows_tiles(num_rows, inter):  # run 20b: from B = 16, before the fp16 GEMV's B <= 32
        return PAIRS
    if tma and gemv_f16_default(num_rows, inter):
        return GEMV
    if tma and pairs_tma_default(num_rows, inter):
        return PAIRS
    for where_inter, min_rows, max_rows in PAIRS_DEFAULT_WHERE:
        if inter == where_inter and min_rows <= num_rows <= max_rows:
            return PAIRS
    for where_inter, min_rows, max_rows in GEMV_DEFAULT_WHERE:
        if inter == where_inter and min_rows <= num_rows <= max_rows:
            return GEMV
    return default_gemm_upcast(num_rows, inter)


def default_gemm_upcast(num_rows: int, inter: int) -> str:
    """The weight upcast of the tensor-core (tl.dot) path for this shape."""
    if num_rows <= DECODE_MAX_ROWS and inter >= SPLIT_NIBBLES_MIN_INTER:
        return "split_bf16"
    return "dot_scaled" if use_dot_scaled(num_rows, inter) else "regs"


DECODE_MAX_ROWS = 2048  # routed rows (B * top_k) up to which the decode (16-row) tiles are used
# Up to this many routed rows (B <= 2) the fp16 GEMV's routing runs by pairwise comparisons (_route_small) instead of a
# histogram and two scans over E + 1 bins. H200 variants run 31 (benchmarks/bench-variants-h200-run31.md, the layer on
# SGLang's streams, 50 rounds, against the counting sort): T=4 B = 1 / 2 1.014-1.019x / 1.008-1.019x, T=1 B=1 SWA /
# C4 / C128 1.006 / 1.002 / 0.994x, B=2 1.006-1.008x. Larger batches are not measured and keep the counting sort.
ROUTE_SMALL_MAX_ROWS = 16
TOPK_SUM_BLOCK = 1024
ROUTE_TRITON_MAX_ROWS = 2048  # one routing program sorts up to this many rows; torch sorts more


def _check_gemm_tiles(gu_cfg, dn_cfg, hidden: int, inter: int) -> None:
    """The tl.dot path's tiles must divide their launch's N and K: its grids take N // block_n programs and its K
    loops step by block_k with unmasked offsets (a tile over N would leave outputs unwritten, one over K read past
    the rows)."""
    for name, cfg, n, k in (("gate/up", gu_cfg, inter, hidden), ("down", dn_cfg, hidden, inter)):
        if not isinstance(cfg, GemmConfig) or n % cfg.block_n or k % cfg.block_k:
            raise ValueError(f"configs: the {name} tile {cfg!r} must be a GemmConfig whose block_n divides N={n} and "
                             f"block_k divides K={k} (H={hidden}, I={inter})")


def gate_up_config(num_rows: int, inter: int, act_mxfp8: bool = False) -> GemmConfig:
    if act_mxfp8:
        return GemmConfig(64, min(64, inter), 128, 8, 3)
    if num_rows > DECODE_MAX_ROWS:
        return GemmConfig(128, min(64, inter), 64, 8, 3)
    # weight streaming: small N blocks keep enough programs busy even at I = 2048/8
    if inter >= 1024:
        return GemmConfig(16, 32, 128, 4, 3)
    return GemmConfig(16, 16, 256, 4, 3)


def down_config(num_rows: int, inter: int, act_mxfp8: bool = False) -> GemmConfig:
    if act_mxfp8:
        return GemmConfig(64, 128, min(128, inter), 8, 3)
    if num_rows > DECODE_MAX_ROWS:
        return GemmConfig(64, 128, min(64, inter), 8, 3)
    return GemmConfig(16, 64, min(128, inter), 4, 3)


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """CUDA-core GEMV tile: ``block_n`` output columns per program (gate/up: intermediate columns, i.e.
    2*block_n interleaved weight rows), ``block_k`` K values per step (a multiple of 32, clipped to K),
    ``two_rows``: two routed rows per pass over the weight block (each tile dequantised once);
    ``split_k``: programs per K range (gate/up: fp32 partials + ticket, down: partial outputs the top-k
    sum adds); ``prefetch``: the next K step loaded before this step's arithmetic; ``num_stages``: the
    launch's Triton pipelining depth (None: Triton's default, as the round-1 run launched); ``x_f32``
    (both configs of a forward alike): the activations reach both GEMVs as float32 in the word-pair
    order, converted once per row (x by the routing launch, the SwiGLU rows by the gate/up epilogue)
    instead of per thread in the inner loop (round 3: fewer instructions per weight value); ``tma_ring``
    (> 0, both configs of a forward alike): weights, scales and activations of each K step fetched by
    TMA through a ring of that many stages (:func:`_gemv_rows_tma`; one routed row per pass, no K
    split, block_k >= 512 so a row's scale bytes of a step are the 16 bytes TMA needs);
    ``persistent_programs_per_sm`` (> 0, with ``tma_ring``; per launch): the TMA kernel as a persistent
    grid of min(work items, SMs x this) programs looping over (routed row, column block) work items, item
    and K loops flattened into one ring (:func:`_gate_up_gemv_tma_persistent_kernel`); ``f16`` (with
    ``tma_ring``, both configs alike, round 16; persistent for the down launch only): the fp16 pair decode
    (:func:`_f16_word_dot`: packed fp16 FMAs on the weight words, the activations prepared once per call as
    scaled fp16 pairs) where the SwiGLU clamp bounds the activations (:func:`f16_act_shift`; else the bf16
    decode runs). ``pdl`` (with ``f16``, both configs alike, run 17): the forward's four launches carry programmatic
    dependent launch where the device has it (:func:`pdl_supported`; the rules in ``kernels/pdl.py``): each program
    waits before its first read of an earlier launch's output and before its first store, and triggers its
    dependents right after that wait (``pdl_late``, both alike: after its last store instead); ``pdl_l2`` (the down
    config, with ``pdl``): each down program asks L2 for its weight block before its wait (its expert is known:
    the routing launch completed before any gate/up program passed its wait, and those trigger only after it);
    ``early_tables`` (with ``f16``, both configs alike, round 29): the per-slot gate/up and down launches read the
    active count and the slot's expert in one round trip (the down launch its whole routing before its PDL wait, as
    ``pdl_l2``), and the top-k sum loads each token's rows with its ids. ``w0_early`` (the down config, with
    ``early_tables``, not persistent; :data:`W0_EARLY_FORMS`): each down program loads its first K step's weight words
    and E8M0 bytes before its PDL wait, by TMA (``"tma"``) or by per-thread loads (``"plain"``)."""
    block_n: int
    block_k: int
    num_warps: int
    two_rows: bool = False
    split_k: int = 1
    prefetch: bool = False
    num_stages: int | None = None
    x_f32: bool = False
    tma_ring: int = 0
    persistent_programs_per_sm: int = 0
    f16: bool = False
    pdl: bool = False
    pdl_late: bool = False
    pdl_l2: bool = False
    early_tables: bool = False
    w0_early: str = ""
    max_registers: int = 0

    def label(self) -> str:
        tag = f"n{self.block_n}k{self.block_k}w{self.num_warps}" + ("f" if self.x_f32 else "")
        tag += f"tma{self.tma_ring}" if self.tma_ring else ""
        tag += "h" if self.f16 else ""
        tag += ("pdl" + ("late" if self.pdl_late else "") + ("l2" if self.pdl_l2 else "")) if self.pdl else ""
        tag += "et" if self.early_tables else ""
        tag += f"w0{self.w0_early[0]}" if self.w0_early else ""
        tag += f"r{self.max_registers}" if self.max_registers else ""
        if self.persistent_programs_per_sm:
            tag += f"pers{self.persistent_programs_per_sm}"
        tag += "x2" if self.two_rows else ""
        tag += f"s{self.split_k}" if self.split_k > 1 else ""
        tag += "p" if self.prefetch else ""
        return tag + (f"st{self.num_stages}" if self.num_stages is not None else "")

    def launch_options(self) -> dict:
        return ({"num_warps": self.num_warps} | ({} if self.num_stages is None else {"num_stages": self.num_stages})
                | register_cap_option(self.max_registers))


# Round 2 (benchmarks/moe_mxfp4-h200-gemv2.md): at I = 512 (T=4), B = 1 the smaller tiles -- gate/up 4
# columns (8 weight rows), down 8 rows -- measured 27.7 vs 29.5 us (1.06x); at B = 8, 64 and at I = 2048
# they were 2-7 % slower, so only one routed row per expert (num_rows <= TOP_K) takes them.
GEMV_SMALL_TILES_WHERE = ((MOE_INTERMEDIATE_SIZE // 4, TOP_K),)  # (per-rank I, most routed rows)
# Round 3 (benchmarks/moe_mxfp4-h200-gemv3.md): the x_f32 form (4.3-4.9 instead of 5.7-7.2 sm_120a SASS
# instructions per weight value) at those small tiles measured 26.7 vs 28.1 us at I = 512, B = 1 (1.05x;
# gate/up 12.5 vs 13.6, down 8.3 vs 8.8 us alone); at I = 2048 every x_f32 tiling was slower (best: 4 % at
# B = 1, 1.5 % at B = 8; more registers, fewer resident warps) and at I = 512, B = 8 / 64 it was within
# 0.4 / 1.5 %, so only here.
GEMV_X_F32_WHERE = GEMV_SMALL_TILES_WHERE
# Round 8 (benchmarks/moe_mxfp4-h200-run6-summary.md, code in commit c48aa5d): the K loop as a tl.range of
# 2-4 stages (Triton then streams weights *and* activation words through a cp.async shared-memory ring)
# was 0.45-0.73x, the E8M0 scales as int32 words 0.82-0.98x, both 0.30-0.53x at T = 1 / 4, B = 1..16.


# Round 8b (benchmarks/moe_mxfp4-h200-run7-tma.md, H200 2026-12-01, every point reference-checked): the GEMV
# with weights, scales and activations fetched by TMA through a 3-stage shared-memory ring (gate/up 8 columns,
# down 16 rows, K steps of 512) beside the defaults of the time: I = 2048 (T=1) B = 1 / 2 / 4 / 8 / 16 in
# 49.6 / 85.2 / 164.0 / 304.3 / 588.8 us against 64.0 / 108.3 / 203.9 (GEMV) / 370.1 / 642.0 (pairs)
# (1.09-1.29x); I = 512 (T=4) B = 1 / 2 / 4 / 8 in 22.9 / 33.1 / 60.5 / 99.1 us against 26.9 / 40.4 / 72.9 /
# 118.3 (GEMV; 1.17-1.22x), B = 16 184.6 against the pairs decode's 184.2 us (equal: the pairs form stays).
# 2 and 4 stages and 16-column gate/up tiles were slower or equal, 4-column tiles 0.64-0.86x. Run 8
# (benchmarks/moe_mxfp4-h200-run8-tma-t2.md): I = 1024 (T=2) B = 1 / 2 / 4 / 8 / 16 in 31.85 / 51.05 / 88.1 / 169.3 /
# 316.4 us against the pairs decode's 47.54 / 66.67 / 116.6 / 193.2 / 357.4 (1.13-1.49x), slower at B = 32 (614.9 vs
# 580.0). Run 9 (benchmarks/moe_mxfp4-h200-run9-between.md), the TMA GEMV default against the pairs decode in between:
# T=1 B = 3 / 6 / 10 / 12 / 14 119.3 / 224.8 / 373.7 / 447.1 / 514.2 vs 168.5 / 306.8 / 448.9 / 499.2 / 561.3 us,
# T=2 75.8 / 132.2 / 204.6 / 241.9 / 281.5 vs 100.9 / 147.7 / 245.3 / 278.8 / 305.4 us, T=4 B = 3 / 6 43.5 / 81.8 vs
# 63.4 / 83.5 us. T = 8 (I = 256) cannot run it (K steps of 512).
# (per-rank I, most routed rows):
GEMV_TMA_WHERE = ((MOE_INTERMEDIATE_SIZE, 16 * TOP_K), (MOE_INTERMEDIATE_SIZE // 2, 16 * TOP_K),
                  (MOE_INTERMEDIATE_SIZE // 4, 8 * TOP_K))
GEMV_TMA_RING = 3
W0_EARLY_FORMS = ("tma", "plain")  # GemvConfig.w0_early: how the down launch's first K step is loaded early
# Round 11 (benchmarks/moe_mxfp4-h200-run11-summary.md, H200 runs 11 / 11b, every point reference-checked): the TMA
# GEMV as a persistent grid (min(work items, SMs x P) programs looping over (routed row, column block) items, item and
# K loops flattened into one ring). Both launches persistent: slower at T=1 (0.74-0.96x) and T=2 (0.94-0.98x); at
# I = 512 (T=4) the down launch alone persistent at P = 8 (its work item is one K step, so the ring overlaps items)
# was faster at every B = 1..8: 22.27 / 32.06 / 41.29 / 57.28 / 64.72 / 76.87 / 80.49 / 93.05 us against
# 22.92 / 33.01 / 43.22 / 60.13 / 68.75 / 81.79 / 85.39 / 99.66 (1.029-1.071x); at T=1 / 2 it was 0.98-1.02x.
# (per-rank I, most routed rows, programs per SM):
GEMV_TMA_PERSISTENT_DOWN_WHERE = ((MOE_INTERMEDIATE_SIZE // 4, 8 * TOP_K, 8),)
GEMV_TMA_MIN_CAPABILITY = 9  # TMA (cp.async.bulk.tensor): sm_90 and sm_12x
# The TMA-fed decode forms (GEMV and pairs) step K by 512 on both launches (a row's E8M0 bytes of a step are the 16
# bytes a TMA box needs), so they need H >= 512 and I >= 512 (DSv4: H = 4096; I = 2048 / T, the TMA tables list
# I >= 512 only); below, the launchers take the tiles without TMA (tma_tables_usable)
TMA_DECODE_MIN_K = 512
# Round 16 (benchmarks/moe_mxfp4-h200-run16-summary.md, H200 run 16, every point reference-checked, rel_err 1.80-1.90e-3
# against the bf16 decode's 1.77-1.86e-3): the fp16 pair decode (GemvConfig.f16) beside the defaults, kept where the
# whole forward was >= 2 % faster. On twice the rows per program (gate/up 16 columns, down 32 rows; the fp16 decode
# needs 48-52 registers against 68-94): I = 2048 (T=1) B = 1 / 8 in 39.90 / 200.1 us against 49.50 (TMA GEMV) / 272.6
# (swap-AB), I = 512 (T=4, down persistent, P = 8) B = 1 / 8 in 20.75 / 67.88 against 22.27 (TMA GEMV) / 86.95
# (mixed); at the shipped tiles (only these measured there): T=1 B = 2 / 4 80.19 / 144.9 against 82.98 (mixed) /
# 151.0 (swap-AB), T=4 B = 2 29.02 against 31.84 (TMA GEMV). Not: T=4 B = 4 (0.94x against the mixed forward); at
# the shipped tiles T=1 B = 1 was 0.978x. Other B were not measured there; run 16b's table below replaces it.
# Run 16b (benchmarks/moe_mxfp4-h200-run16b-summary.md, one H200 run, all 129 rows reference-checked, rel_err
# 1.77-1.90e-3): the fp16 decode on 1x / 2x / 4x-row tiles at T = 1 / 2 / 4, B = 1-6, 8, 12, 16, 32, 64. The 2x-row
# tiles won at every B <= 32 (1.08-1.57x against the defaults of the time, e.g. T=1 B=16 377.6 us against 475.2 swap-AB,
# T=2 B=8 115.6 against 169.4, T=4 B=12 94.0 against 147.5); the bf16 decode on the same tiles was 0.66-0.84x of the
# fp16 one (T=1 B=1 49.46 vs 39.84 us): the tile pays only with the fp16 decode's fewer registers. 4x rows (gate/up 32
# columns, down 64 rows; 128 registers on sm_120a, no spills) where they beat 2x by >= 2 %: T=1 B=1 37.71 against
# 39.84, T=2 B=2 39.18 against 40.61, T=4 B=16 116.99 against 119.97. Not at B = 64 (0.80-0.99x of the pairs
# forward). Unmeasured B between two measured ones whose default both became the fp16 GEMV take it too (B = 7, 9-11,
# 13-15, 17-31, on the 2x-row tiles); B = 33-63 keep theirs. T = 8 (I = 256) cannot run the TMA GEMV (K >= 512).
# Run 26 (benchmarks/moe_mxfp4-h200-run26-summary.md): the pairs built per byte (:func:`_e2m1_f16_byte_pairs`) on the
# same tiles, 1.000x at T=1 B=1 and 1.011-1.139x at every other measured T = 1 / 2 / 4, B <= 32; the only fp16 decode
# since (the tiles unchanged).
_F16_2X = (GemvConfig(16, 512, 4, tma_ring=GEMV_TMA_RING, f16=True),
           GemvConfig(32, 512, 4, tma_ring=GEMV_TMA_RING, f16=True))
_F16_4X = (GemvConfig(32, 512, 4, tma_ring=GEMV_TMA_RING, f16=True),
           GemvConfig(64, 512, 4, tma_ring=GEMV_TMA_RING, f16=True))
# Run 28c (benchmarks/moe_mxfp4-h200-run28-summary.md): at T=1 B=1 the 4x gate/up tile with the 2x down tile (32
# rows: 768 programs of 4 K steps at 69 / 76 registers on sm_90a / sm_120a, where the 64-row tile's 384 programs held
# 128 / 120) 33.76 against 35.14 us for the 4x pair (1.041x); in the layer (variants run 22) 1.005-1.011x. Tiles of 16
# or 64 gate/up columns or 128 down rows beside it were slower or level.
_F16_4X_GATE_UP_2X_DOWN = (_F16_4X[0], _F16_2X[1])
F16_MAX_BATCH = 32  # the largest B (per rank) at which the fp16 TMA GEMV is the default


def _persistent_down(tiles):
    return tiles[0], dataclasses.replace(tiles[1], persistent_programs_per_sm=8)


# (per-rank I, B) -> tiles where the 4x-row tiles are the default (at T=1 B=1 the gate/up tile only, run 28c); the
# 2x-row ones at every other B <= F16_MAX_BATCH
_F16_4X_AT = {(MOE_INTERMEDIATE_SIZE, 1): _F16_4X_GATE_UP_2X_DOWN, (MOE_INTERMEDIATE_SIZE // 2, 2): _F16_4X,
              (MOE_INTERMEDIATE_SIZE // 4, 16): _persistent_down(_F16_4X)}
_F16_2X_AT = {MOE_INTERMEDIATE_SIZE: _F16_2X, MOE_INTERMEDIATE_SIZE // 2: _F16_2X,
              MOE_INTERMEDIATE_SIZE // 4: _persistent_down(_F16_2X)}  # the down launch persistent (P = 8) at I = 512
# Run 17 (benchmarks/moe_mxfp4-h200-run17-summary.md, one H200 run, every forward reference-checked and a captured chain
# of 12 PDL forwards bit-identical to the forward without PDL): the fp16 TMA GEMV forward with programmatic dependent
# launch (GemvConfig.pdl) beside the same tiles without it, timed as chains of 12 forwards in one CUDA graph (each
# launch the PDL dependent of the one before), two interleaved rounds. Triggers right after each program's wait
# against the default: T=1 B = 1 / 2 / 4 / 8 / 16 / 32 1.075 / 1.041 / 1.023 / 1.019 / 1.010 / 0.990x (37.85 -> 35.22
# us at B = 1); with the down launch's L2 prefetch (pdl_l2) T=2 B = 1 / 2 / 4 / 8 / 16 / 32 1.123 / 1.090 / 1.039 /
# 1.022 / 1.010 / 0.994x (26.22 -> 23.36 us), T=4 1.176 / 1.136 / 1.072 / 1.047 / 1.021 / 0.990x (20.86 -> 17.74 us);
# the prefetch at T=1 1.074 / 1.008 / 1.021 / 1.010 / 1.004 / 0.955x; triggers after the last store (pdl_late, with
# the prefetch) 0.97-1.03x everywhere. Run 17b timed the resulting table (the best form per I up to the largest B with
# >= 2 %) as shipped at every B in it against the forward without PDL: T=1 B = 1..4 1.078 / 1.038 / 1.030 / 1.022x,
# T=2 B = 1..8 1.117-1.021x, T=4 B = 1..16 1.167-1.021x except B = 15 (1.019x, below the bar like T=1 B = 8: both
# launch without PDL). (per-rank I) -> (the B with PDL, pdl_l2):
GEMV_PDL_WHERE = {MOE_INTERMEDIATE_SIZE: (range(1, 5), False), MOE_INTERMEDIATE_SIZE // 2: (range(1, 9), True),
                  MOE_INTERMEDIATE_SIZE // 4: ((*range(1, 15), 16), True)}


def _with_pdl(tiles, inter, batch):
    """``tiles`` with the PDL form :data:`GEMV_PDL_WHERE` ships at (per-rank I, B), else as they are."""
    batches, l2 = GEMV_PDL_WHERE.get(inter, ((), False))
    if batch not in batches:
        return tiles
    return dataclasses.replace(tiles[0], pdl=True), dataclasses.replace(tiles[1], pdl=True, pdl_l2=l2)


# (per-rank I, B) where the tiles take early_tables (round 29: the slots' routing in fewer round trips, the down
# launch's before its PDL wait, the top-k sum's rows with its ids). H200 variants run 29
# (benchmarks/bench-variants-h200-run29.md, the layer on SGLang's streams, 50 rounds) against the same tiles without
# it: T=1 B=1 SWA / C4 / C128 1.013 / 1.008 / 1.007x; but T=1 B=2 0.994-0.996x, B=8 0.980-0.984x, and T=4 B = 1 / 2 / 8
# level or up to 0.5 % slower. The forward alone (run 29, benchmarks/moe_mxfp4-h200-run29.md, chains of 12 PDL
# forwards): T=1 B=1 33.77 -> 32.29 us (2.48 TB/s), T=2 B=2 35.72 -> 34.47 (1.036x; the bench has no T=2 layer);
# T=1 B=2 1.006x, T=2 B=1 0.974x, T=4 B = 1 / 2 1.013 / 0.989x.
EARLY_TABLES_AT = {(MOE_INTERMEDIATE_SIZE, 1), (MOE_INTERMEDIATE_SIZE // 2, 2)}


def _with_early_tables(tiles, inter, batch):
    if (inter, batch) not in EARLY_TABLES_AT:
        return tiles
    return tuple(dataclasses.replace(c, early_tables=True) for c in tiles)


# (per-rank I, B) where the down launch loads its first K step before its PDL wait (GemvConfig.w0_early, round 32), by
# TMA, with a 2-stage ring after it. The down programs at T=1 B=1 start under the gate/up launch's tail (PDL) and, with
# early_tables, know their expert before the wait; the weights depend on nothing earlier. H200 (one run each, every
# forward reference-checked, PDL chains bit-identical): the forward alone (chains of 12) 33.69 -> 31.25 us with the
# 3-stage ring (moe_mxfp4-h200-run31.md), 33.74 -> 31.31 with the 2-stage one (run31b); the layer on SGLang's streams
# (variants runs 49 / 50, 40 / 60 rounds) SWA / C4 / C128 1.029 / 1.015 / 1.023x and 1.021 / 1.023 / 1.029x with 3
# stages, 1.020 / 1.018 / 1.022x with 2. The 2-stage ring ships: level with 3 on the H200 within the runs' spread, and
# on sm_120a it takes 78 registers and 20504 B of shared memory where the form before took 88 / 21536 and the early
# form with 3 stages 80 / 30240 (its buffer beside the ring), so it keeps the down launch's programs per SM on sm_120.
# Most of the H200's gain is occupancy: the form before compiles to 95 registers there (sm_90a, Triton 3.6: 5 programs
# per SM, 1.16 waves), the shipped one to 79 (6 per SM, one wave); the form before capped at 80 registers was level
# with it in the layer (run 51), 1.5 % slower alone. Per-thread loads for the early step ("plain": 94 registers) lost
# (0.92-0.99x alone). Elsewhere not taken: T=1 B = 2 / 4 / 8 0.92-1.02x alone (with early_tables, which those B do not
# ship), T=2 B = 1 / 2 / 4 / 8 0.93-1.007x.
W0_EARLY_AT = {(MOE_INTERMEDIATE_SIZE, 1): 2}  # (per-rank I, B) -> the down launch's ring depth after the early step


def _with_w0_early(tiles, inter, batch):
    ring = W0_EARLY_AT.get((inter, batch))
    if ring is None:
        return tiles
    return tiles[0], dataclasses.replace(tiles[1], w0_early="tma", tma_ring=ring)


# (per-rank I, routed rows) -> (gate/up, down)
GEMV_TMA_F16_WHERE = {(inter, batch * TOP_K): _with_w0_early(_with_early_tables(
    _with_pdl(_F16_4X_AT.get((inter, batch), tiles), inter, batch), inter, batch), inter, batch)
                      for inter, tiles in _F16_2X_AT.items() for batch in range(1, F16_MAX_BATCH + 1)}


def gemv_f16_default(num_rows: int, inter: int) -> bool:
    """Whether the fp16 pair decode of the TMA GEMV is the default at this shape (:data:`GEMV_TMA_F16_WHERE`; the
    operands must allow TMA as well)."""
    return (inter, num_rows) in GEMV_TMA_F16_WHERE


def f16_act_shift(swiglu_limit: float) -> int | None:
    """Power of two by which the fp16 GEMV scales the SwiGLU rows (fp16, :func:`_f16_act_store`): the clamp bounds
    ``|silu(min(g, L)) * clamp(u, -L, L)| < L * max(L, 1)``, so the largest shift keeping that bound at or below
    2**F16_ACT_MAX_LOG2 (capped at 100). None where no clamp bounds them (``L <= 0``) or the shift would be negative
    (L > 181): the forward then runs the bf16 decode."""
    if not swiglu_limit > 0:
        return None
    shift = math.floor(F16_ACT_MAX_LOG2 - math.log2(swiglu_limit * max(swiglu_limit, 1.0)))
    return min(shift, 100) if shift >= 0 else None


def gemv_tma_usable(*tensors: torch.Tensor) -> bool:
    """Whether the TMA GEMV can run on these operands: a GPU with TMA (or the CPU interpreter) and
    16-byte aligned base addresses (a TMA descriptor's requirement; the row strides of DSv4's shapes are)."""
    if any(t.data_ptr() % 16 for t in tensors):
        return False
    return has_capability(tensors[0].device, GEMV_TMA_MIN_CAPABILITY)


def tma_tables_usable(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                      w2_scale: torch.Tensor) -> bool:
    """Whether the launchers may take the TMA tiles their tables list for (rows, I): the operands allow TMA and both
    launches' K (H for gate/up, I for down) reach :data:`TMA_DECODE_MIN_K`, the K step of those tiles (the tables are
    keyed by I and rows only, so at a smaller H they would name tiles that cannot run)."""
    return (min(x.shape[-1], 2 * w2.shape[-1]) >= TMA_DECODE_MIN_K
            and gemv_tma_usable(x, w13, w13_scale, w2, w2_scale))


def gemv_configs(num_rows: int, inter: int, tma: bool = True, f16: bool = True) -> tuple[GemvConfig, GemvConfig]:
    """(gate/up, down) GEMV tiles: the fastest of the H200 runs at every measured (T, B). Where
    :data:`GEMV_TMA_WHERE` says (and ``tma``: the operands allow it, :func:`gemv_tma_usable`) the TMA
    ring form, its down launch on a persistent grid where :data:`GEMV_TMA_PERSISTENT_DOWN_WHERE` says; else
    gate/up 8 columns = 16 weight rows, down 16 rows, K steps of 512, 4 warps, one
    routed row per pass (the two-row passes were 8-40 % slower even at B = 64,
    benchmarks/moe_mxfp4-h200-gemv.md), halved N tiles where :data:`GEMV_SMALL_TILES_WHERE` says
    (benchmarks/moe_mxfp4-h200-gemv2.md; register prefetch, K splits, longer K steps and num_stages 1
    were slower or equal everywhere else), in the ``x_f32`` form where :data:`GEMV_X_F32_WHERE` says
    (benchmarks/moe_mxfp4-h200-gemv3.md). With ``tma`` and ``f16``, the fp16 pair decode's tiles where
    :data:`GEMV_TMA_F16_WHERE` lists the shape (``f16`` False: the bf16 decode's, as the mixed forward takes)."""
    if tma and f16 and gemv_f16_default(num_rows, inter):
        return GEMV_TMA_F16_WHERE[(inter, num_rows)]
    if tma and any(inter == i and num_rows <= rows for i, rows in GEMV_TMA_WHERE):
        per_sm = next((p for i, rows, p in GEMV_TMA_PERSISTENT_DOWN_WHERE if inter == i and num_rows <= rows), 0)
        return (GemvConfig(8, 512, 4, tma_ring=GEMV_TMA_RING),
                GemvConfig(16, 512, 4, tma_ring=GEMV_TMA_RING, persistent_programs_per_sm=per_sm))
    if any(inter == i and num_rows <= rows for i, rows in GEMV_SMALL_TILES_WHERE):
        x_f32 = any(inter == i and num_rows <= rows for i, rows in GEMV_X_F32_WHERE)
        return GemvConfig(4, 512, 4, x_f32=x_f32), GemvConfig(8, min(512, inter), 4, x_f32=x_f32)
    return GemvConfig(8, 512, 4), GemvConfig(16, min(512, inter), 4)


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------
def route(topk_ids: torch.Tensor, num_experts: int):
    """Routed rows sorted by expert (stable), expert row offsets ``[E+1]``, touched experts in
    order, and their count ``[1]`` -- all int32, no host sync. One Triton program up to
    ``ROUTE_TRITON_MAX_ROWS`` rows (decode), torch sort beyond (prefill)."""
    num_rows = topk_ids.numel()
    device = topk_ids.device
    if num_rows <= ROUTE_TRITON_MAX_ROWS:
        sorted_rows = torch.empty(num_rows, dtype=torch.int32, device=device)
        expert_start = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
        active_experts = torch.empty(num_experts, dtype=torch.int32, device=device)
        num_active = torch.empty(1, dtype=torch.int32, device=device)
        _route_kernel[(1,)](topk_ids, num_rows, sorted_rows, expert_start, active_experts, num_active,
                            NUM_EXPERTS=num_experts, BLOCK_ROWS=triton.next_power_of_2(max(num_rows, 16)),
                            NUM_BINS=triton.next_power_of_2(num_experts + 1), num_warps=4)
        return sorted_rows, expert_start, active_experts, num_active
    flat = topk_ids.flatten().long()
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    sorted_rows = torch.argsort(key, stable=True).to(torch.int32)
    counts = torch.zeros(num_experts + 1, dtype=torch.int32, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key, dtype=torch.int32))
    expert_start = torch.zeros(num_experts + 1, dtype=torch.int32, device=device)
    expert_start[1:] = torch.cumsum(counts[:num_experts], 0)
    active = counts[:num_experts] > 0
    active_experts = torch.argsort((~active).to(torch.int8), stable=True).to(torch.int32)
    num_active = active.sum(dtype=torch.int32).reshape(1)
    return sorted_rows, expert_start, active_experts, num_active


def _validate(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids):
    if x.dim() != 2 or x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError(f"x must be contiguous bf16 [B, H], got {x.dtype} {tuple(x.shape)}")
    batch, hidden = x.shape
    if w13.dim() != 3 or w13.dtype not in (torch.int8, torch.uint8) or not w13.is_contiguous():
        raise ValueError(f"w13 must be contiguous int8/uint8 [E, 2I, H/2], got {w13.dtype} {tuple(w13.shape)}")
    num_experts, two_i, half_h = w13.shape
    inter = two_i // 2
    if half_h * 2 != hidden or two_i % 2:
        raise ValueError(f"w13 must be [E, 2I, H/2] with H={hidden}, got {tuple(w13.shape)}")
    if hidden % 256 or not (inter % 256 == 0 or inter in (32, 64, 128)):
        raise ValueError(f"H must be a multiple of 256 and I a multiple of 256 or 32/64/128 "
                         f"(got H={hidden}, I={inter})")
    for name, t, shape in (("w13_scale", w13_scale, (num_experts, two_i, hidden // MXFP4_GROUP)),
                           ("w2", w2, (num_experts, hidden, inter // 2)),
                           ("w2_scale", w2_scale, (num_experts, hidden, inter // MXFP4_GROUP))):
        if tuple(t.shape) != shape or not t.is_contiguous() or t.device != x.device:
            raise ValueError(f"{name} must be contiguous {shape} on {x.device}, got {tuple(t.shape)} on {t.device}")
    scale_bytes(w13_scale), scale_bytes(w2_scale)
    if w2.dtype not in (torch.int8, torch.uint8):
        raise ValueError(f"w2 must be int8/uint8 packed e2m1, got {w2.dtype}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != batch or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32/int64 [B={batch}, top_k], got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape) or not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights must be float [B, top_k] = {tuple(topk_ids.shape)}, "
                         f"got {topk_weights.dtype} {tuple(topk_weights.shape)}")
    for name, t in (("w13", w13), ("w2", w2), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != x.device:
            raise ValueError(f"{name} must be on {x.device}, got {t.device}")
    return batch, hidden, num_experts, inter


def moe_mxfp4_forward(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                      w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                      swiglu_limit: float = SWIGLU_LIMIT, out: torch.Tensor | None = None,
                      act_mxfp8: bool = False,
                      configs: tuple[GemmConfig, GemmConfig] | None = None,
                      dot_scaled: bool | None = None, upcast: str | None = None,
                      split_k: str | tuple[int, int] | None = None, wide_scales: bool = False) -> torch.Tensor:
    """Routed-expert MoE on repacked MXFP4 weights (see :func:`repack_w13_`): bf16 ``[B, H]``.

    ``topk_weights`` already carry any routed scaling; ids outside ``[0, E)`` contribute nothing.
    ``act_mxfp8`` runs the MXFP8-activation GEMM variant instead of bf16 activations; ``configs``
    overrides the (gate/up, down) tiles (device tuning); ``dot_scaled`` picks how bf16-activation
    GEMMs upcast the weights (``tl.dot_scaled`` vs the explicit register dequantisation); ``upcast``
    (one of :data:`FORWARD_UPCASTS`, overrides ``dot_scaled``) picks among all variants, ``"gemv"``
    being the CUDA-core GEMV decode (``configs``: two :class:`GemvConfig`), ``"pairs"`` the tensor-core
    pairs decode (``configs``: two :class:`PairsConfig`; without ``upcast`` the tiles' type picks the form) and
    ``"prefill"`` the grouped GEMM pair of kernels/moe_prefill.py (``configs``: two ``PrefillConfig``), default
    :func:`default_upcast` (which yields to the tl.dot path when GemmConfig tiles, ``split_k`` or
    ``act_mxfp8`` are given). ``split_k`` (bf16 activations, decode tiles): ``"off"``, ``"auto"``
    (:func:`split_k_choice` from the shapes and the SM count) or explicit ``(gate_up, down)`` splits of
    the K loops; default :func:`default_split_k`. ``wide_scales`` (the experts' E8M0 bytes reach outside
    :data:`PAIRS_EXACT_SCALE_BYTES`, :func:`scale_byte_range`): the default never picks the pairs decode or the
    prefill GEMM, whose bf16 products would overflow there.
    """
    batch, hidden, num_experts, inter = _validate(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids)
    top_k = topk_ids.shape[1]
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != torch.bfloat16 or not out.is_contiguous() or out.device != x.device:
        raise ValueError(f"out must be contiguous bf16 {tuple(x.shape)} on {x.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    num_rows = batch * top_k
    if num_rows == 0:
        return out.zero_()  # top_k = 0: no expert, the sum over none (B = 0: nothing to write)
    if upcast is None:
        tma = gemv_tma_usable(x, w13, w13_scale, w2, w2_scale) and pair_words_mul_usable(x.device)
        upcast = (default_upcast(num_rows, inter, tma, pairs=not wide_scales) if dot_scaled is None
                  else ("dot_scaled" if dot_scaled else "regs"))
        if dot_scaled is None and configs and isinstance(configs[0], (GemvConfig, PairsConfig)):  # tiles name the form
            upcast = GEMV if isinstance(configs[0], GemvConfig) else PAIRS
        gemm_args = act_mxfp8 or split_k not in (None, "off") or (configs and isinstance(configs[0], GemmConfig))
        if upcast in (GEMV, PAIRS, PREFILL) and gemm_args:  # arguments of the tensor-core GEMM path select it
            upcast = default_gemm_upcast(num_rows, inter)
    if upcast not in FORWARD_UPCASTS:
        raise ValueError(f"upcast must be one of {FORWARD_UPCASTS}, got {upcast!r}")
    if upcast == PREFILL:
        if act_mxfp8 or split_k not in (None, "off"):
            raise ValueError(f"upcast='prefill' takes bf16 activations and no split_k, got act_mxfp8={act_mxfp8}, "
                             f"split_k={split_k!r}")
        from .moe_prefill import moe_mxfp4_prefill_forward  # imported at call time: it builds on this module
        return moe_mxfp4_prefill_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, swiglu_limit,
                                         out=out, config=configs)
    if upcast == PAIRS:
        if act_mxfp8 or split_k not in (None, "off"):
            raise ValueError(f"upcast='pairs' takes bf16 activations and no split_k, got act_mxfp8={act_mxfp8}, "
                             f"split_k={split_k!r}")
        for name, launch in pairs_launches(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, out,
                                           swiglu_limit, configs):
            launch()
        return out
    if upcast == GEMV:
        if act_mxfp8 or split_k not in (None, "off"):
            raise ValueError(f"upcast='gemv' takes bf16 activations and no split_k, got act_mxfp8={act_mxfp8}, "
                             f"split_k={split_k!r}")
        return _gemv_forward(x, w13, w13_scale, w2, w2_scale, weights_=topk_weights, ids_=topk_ids, out=out,
                             swiglu_limit=swiglu_limit, configs=configs)
    dot_scaled = upcast == "dot_scaled"
    split_nibbles = _split_nibbles(upcast)
    device = x.device
    ids = topk_ids.contiguous()
    weights = topk_weights.contiguous()
    sorted_rows, expert_start, active_experts, num_active = route(ids, num_experts)
    slots = min(num_rows, num_experts)
    w13_s, w2_s = scale_bytes(w13_scale), scale_bytes(w2_scale)
    w13, w2 = w13.view(torch.uint8), w2.view(torch.uint8)  # tl.dot_scaled takes e2m1 pairs as uint8
    if act_mxfp8:
        x_in, x_scale = quantize_mxfp8(x)
        act = torch.empty(num_rows, inter, dtype=torch.float8_e4m3fn, device=device)
        act_scale = torch.empty(num_rows, inter // MXFP4_GROUP, dtype=torch.uint8, device=device)
    else:
        x_in, x_scale = x, x
        act = torch.empty(num_rows, inter, dtype=torch.bfloat16, device=device)
        act_scale = act
    gu_cfg = configs[0] if configs else gate_up_config(num_rows, inter, act_mxfp8)
    dn_cfg = configs[1] if configs else down_config(num_rows, inter, act_mxfp8)
    _check_gemm_tiles(gu_cfg, dn_cfg, hidden, inter)
    gu_split, dn_split = _resolve_split_k(split_k, num_rows, hidden, inter, act_mxfp8, gu_cfg, dn_cfg, device)
    if gu_split * dn_split > 1:
        upcast = split_k_upcast(upcast)
        dot_scaled, split_nibbles = upcast == "dot_scaled", _split_nibbles(upcast)
    gu_grid = (slots, inter // gu_cfg.block_n, gu_split)
    if gu_split > 1:
        partial = torch.empty(gu_split, num_rows, 2 * inter, dtype=torch.float32, device=device)
        tickets = _tickets(device, slots * gu_grid[1])
    else:
        partial = tickets = act  # unused
    atomic_out = dn_split > 1
    if atomic_out:
        y = torch.empty(batch, hidden, dtype=torch.float32, device=device)  # zeroed by the gate/up programs
        zero_chunk = triton.cdiv(triton.cdiv(y.numel(), gu_grid[0] * gu_grid[1] * gu_grid[2]), 1024) * 1024
    else:
        y = torch.empty(num_rows, hidden, dtype=torch.float32, device=device)
        zero_chunk = 0
    _gate_up_kernel[gu_grid](
        x_in, x_scale, w13, w13_s, sorted_rows, expert_start, active_experts, num_active, act, act_scale,
        partial, tickets, y, y.numel(), zero_chunk, num_rows, hidden, inter, float(swiglu_limit),
        TOP_K=top_k, BLOCK_M=gu_cfg.block_m, BLOCK_N=gu_cfg.block_n, BLOCK_K=gu_cfg.block_k, ACT_MXFP8=act_mxfp8,
        DOT_SCALED=dot_scaled, SPLIT_NIBBLES=split_nibbles, SPLIT_K=gu_split, ZERO_OUT=atomic_out,
        num_warps=gu_cfg.num_warps, num_stages=gu_cfg.num_stages)
    _down_kernel[(slots, hidden // dn_cfg.block_n, dn_split)](
        act, act_scale, w2, w2_s, weights, sorted_rows, expert_start, active_experts, num_active, y,
        hidden, inter, TOP_K=top_k, BLOCK_M=dn_cfg.block_m, BLOCK_N=dn_cfg.block_n, BLOCK_K=dn_cfg.block_k,
        ACT_MXFP8=act_mxfp8, DOT_SCALED=dot_scaled, SPLIT_NIBBLES=split_nibbles, SPLIT_K=dn_split,
        ATOMIC_OUT=atomic_out, num_warps=dn_cfg.num_warps, num_stages=dn_cfg.num_stages)
    if atomic_out:
        _to_bf16_kernel[(triton.cdiv(y.numel(), TOPK_SUM_BLOCK),)](y, out, y.numel(), BLOCK=TOPK_SUM_BLOCK,
                                                                    num_warps=4)
    else:
        launch_topk_sum(y, ids, out, num_experts)
    return out


# ---------------------------------------------------------------------------------------------
# split-K decode
# ---------------------------------------------------------------------------------------------
SPLIT_K_TARGET_WAVES = 4  # programs per SM the split-K choice aims for (latency hiding of the weight stream)
SPLIT_K_MAX = 8
# Where the split-K decode is the default: (per-rank I, fewest and most routed rows) at which split
# (gate/up 2, down 2) beat the unsplit decode on the H200 (benchmarks/moe_mxfp4-h200-splitk.md):
# I = 2048 at B = 8 and 64 (+4.8 %, +2.4 %), I = 512 at B = 1 (+18 %). It was slower at I = 2048 B = 1
# (-1.5 to -7 %) and at I = 512 B = 8, 64 (-9 to -38 %); T = 2, T = 8 and other B are not measured, so
# they keep the unsplit path. The SM-count choice ("auto") was not the best split where it split.
SPLIT_K_DEFAULT_SPLITS = (2, 2)
# The H200 run also measured (2, 2) 18 % faster at I = 512, B = 1, but with the ``regs`` upcast, whose
# split gate/up tile spilled 4 B of registers on sm_120a in the full registry AOT run; that shape
# stays unsplit until the split-nibble upcast is measured there.
SPLIT_K_DEFAULT_WHERE = ((MOE_INTERMEDIATE_SIZE, 8 * TOP_K, 64 * TOP_K),)


def split_k_upcast(upcast: str) -> str:
    """The upcast a split-K launch uses: ``regs`` becomes the equally exact ``split_f32``, because the
    ``regs`` split gate/up tile spilled registers on sm_120a (see SPLIT_K_DEFAULT_WHERE)."""
    return "split_f32" if upcast == "regs" else upcast


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_SM_COUNT
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


CPU_SM_COUNT = 132
AOT_SM_COUNT = 188  # RTX PRO 6000 Blackwell (sm_120); the 5090's 170 gives the same splits  # the interpreter has no SMs; the H200's count keeps the choice deterministic in tests


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _one_split(programs: int, k_steps: int, sm_count: int) -> int:
    split = 1
    while (programs * split < SPLIT_K_TARGET_WAVES * sm_count and split * 2 <= min(k_steps, SPLIT_K_MAX)):
        split *= 2
    return split


def split_k_choice(num_rows: int, hidden: int, inter: int, sm_count: int) -> tuple[int, int]:
    """(gate/up, down) K splits: the smallest power of two that puts ``SPLIT_K_TARGET_WAVES`` programs
    per SM on the GPU (counting ``min(B*top_k, E)`` expert slots), at most ``SPLIT_K_MAX`` and the K
    loop's step count. Shapes and the SM count only, so the launch is graph-capturable."""
    if num_rows > DECODE_MAX_ROWS:
        return 1, 1
    slots = min(num_rows, NUM_EXPERTS)
    gu, dn = gate_up_config(num_rows, inter), down_config(num_rows, inter)
    return (_one_split(slots * (inter // gu.block_n), hidden // gu.block_k, sm_count),
            _one_split(slots * (hidden // dn.block_n), inter // dn.block_k, sm_count))


def default_split_k(num_rows: int, inter: int) -> str | tuple[int, int]:
    for where_inter, min_rows, max_rows in SPLIT_K_DEFAULT_WHERE:
        if inter == where_inter and min_rows <= num_rows <= max_rows:
            return SPLIT_K_DEFAULT_SPLITS
    return "off"


def _resolve_split_k(split_k, num_rows, hidden, inter, act_mxfp8, gu_cfg, dn_cfg, device) -> tuple[int, int]:
    if split_k is None:
        split_k = default_split_k(num_rows, inter)
        if (split_k != "off" and num_rows <= DECODE_MAX_ROWS and hidden % (split_k[0] * gu_cfg.block_k) == 0
                and inter % (split_k[1] * dn_cfg.block_k) == 0):
            return split_k
        split_k = "off"  # the default never raises: other tiles (``configs``) or shapes run unsplit
    if split_k == "off" or act_mxfp8:
        return 1, 1
    if split_k == "auto":
        return split_k_choice(num_rows, hidden, inter, _sm_count(device))
    if (not isinstance(split_k, tuple) or len(split_k) != 2
            or any(not isinstance(v, int) or v < 1 or v & (v - 1) for v in split_k)
            or hidden % (split_k[0] * gu_cfg.block_k) or inter % (split_k[1] * dn_cfg.block_k)):
        raise ValueError(f"split_k must be 'off', 'auto' or (gate_up, down) powers of two dividing the K loops "
                         f"(H/{gu_cfg.block_k}={hidden // gu_cfg.block_k}, I/{dn_cfg.block_k}="
                         f"{inter // dn_cfg.block_k} steps), got {split_k!r}")
    return split_k


_TICKETS: dict = {}


def _tickets(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 ticket counters, one per (expert slot, n block), kept per device and left zeroed by
    the kernel; allocated once at the largest size (E slots x the most n blocks) on first use."""
    key = (device.type, device.index)
    buf = _TICKETS.get(key)
    if buf is None or buf.numel() < count:
        buf = torch.zeros(max(count, NUM_EXPERTS * TICKETS_PER_EXPERT), dtype=torch.int32, device=device)
        _TICKETS[key] = buf
    return buf


TICKETS_PER_EXPERT = MOE_INTERMEDIATE_SIZE // 16  # n blocks of gate/up at the smallest BLOCK_N


LAUNCHES_PER_FORWARD = 4


def _gemv_forward(x, w13, w13_scale, w2, w2_scale, weights_, ids_, out, swiglu_limit, configs):
    """The four launches with the CUDA-core GEMV in place of the two GEMMs (routing and top-k sum as ever)."""
    for _, launch in gemv_launches(x, w13, w13_scale, w2, w2_scale, weights_, ids_, out, swiglu_limit, configs):
        launch()
    return out


GEMV_LAUNCH_NAMES = ("route", "gate_up", "down", "topk_sum")
GEMV_X_BLOCK = 1024  # activations one program of the x_f32 routing launch converts


def _expert_weight_descriptors(w13, w13_scale, w2, w2_scale, hidden, inter, gate_up_rows, gate_up_k, down_rows,
                               down_k, gate_up_word_k=None, down_word_k=None):
    """TMA descriptors over the experts' int32 weight words and E8M0 bytes, a block being one program's K step (the
    words' blocks ``*_word_k`` wide where given: the pairs decode's ``sub_k``): (w13 words [E*2I, H/8], w13 bytes
    [E*2I, H/32], w2 words [E*H, I/8], w2 bytes [E*H, I/32])."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    gate_up_word_k, down_word_k = gate_up_word_k or gate_up_k, down_word_k or down_k
    return (TensorDescriptor.from_tensor(w13.view(torch.int32).view(-1, hidden // 8),
                                         [gate_up_rows, gate_up_word_k // 8]),
            TensorDescriptor.from_tensor(scale_bytes(w13_scale).view(-1, hidden // 32),
                                         [gate_up_rows, gate_up_k // 32]),
            TensorDescriptor.from_tensor(w2.view(torch.int32).view(-1, inter // 8), [down_rows, down_word_k // 8]),
            TensorDescriptor.from_tensor(scale_bytes(w2_scale).view(-1, inter // 32), [down_rows, down_k // 32]))


def _gemv_tma_down_launch(act, w2_desc, w2_s_desc, weights, ids, sorted_rows, expert_start, active_experts,
                          num_active, y, num_rows, num_experts, hidden, inter, slots, dn_cfg, dn_k, device,
                          act_unscale=None, w2_bytes=None, w2_scale_bytes=None, pdl_args=None):
    """The TMA GEMV's down launch over the bf16 SwiGLU rows ``act`` [B*top_k, I] (natural order) into ``y``, as a
    callable: on a persistent grid where ``dn_cfg`` asks for one, else one program per (expert slot, column
    block). Shared by the GEMV forward and the mixed pairs forward. ``act_unscale`` (not None): ``act`` holds the
    fp16 pair words of :func:`_f16_act_store` times 1 / act_unscale, read by the fp16 pair decode; then ``w2_bytes`` /
    ``w2_scale_bytes`` (the descriptors' tensors, for the L2 prefetch) and ``pdl_args`` (the fp16 kernels' PDL
    constexprs and ``launch_pdl``) are given too."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    act_desc = TensorDescriptor.from_tensor(act.view(torch.int32), [1, dn_k // 2])
    per_sm = dn_cfg.persistent_programs_per_sm
    if per_sm:
        # the program count from shapes and the device only, so a captured graph replays it
        grid = (min(num_rows * (hidden // dn_cfg.block_n), _sm_count(device) * per_sm),)

        def persistent_down():
            if act_unscale is not None:
                _down_gemv_tma_persistent_f16_kernel[grid](
                    act_desc, w2_desc, w2_s_desc, weights, ids, sorted_rows, y, num_rows, num_experts, hidden, inter,
                    act_unscale, w2_bytes, w2_scale_bytes, BLOCK_N=dn_cfg.block_n, BLOCK_K=dn_k, RING=dn_cfg.tma_ring,
                    EMULATE=interpreter_enabled(), **pdl_args, **dn_cfg.launch_options())
                return
            _down_gemv_tma_persistent_kernel[grid](
                act_desc, w2_desc, w2_s_desc, weights, ids, sorted_rows, y, num_rows, num_experts, hidden, inter,
                BLOCK_N=dn_cfg.block_n, BLOCK_K=dn_k, RING=dn_cfg.tma_ring, **dn_cfg.launch_options())
        return persistent_down

    def slot_down():
        if act_unscale is not None:
            _down_gemv_tma_f16_kernel[(slots, hidden // dn_cfg.block_n)](
                act_desc, w2_desc, w2_s_desc, weights, sorted_rows, expert_start, active_experts, num_active, y,
                hidden, inter, act_unscale, w2_bytes, w2_scale_bytes, BLOCK_N=dn_cfg.block_n, BLOCK_K=dn_k,
                RING=dn_cfg.tma_ring, EMULATE=interpreter_enabled(), NUM_EXPERTS=num_experts, **pdl_args,
                **dn_cfg.launch_options())
            return
        _down_gemv_tma_kernel[(slots, hidden // dn_cfg.block_n)](
            act_desc, w2_desc, w2_s_desc, weights, sorted_rows, expert_start, active_experts, num_active, y,
            hidden, inter, BLOCK_N=dn_cfg.block_n, BLOCK_K=dn_k, RING=dn_cfg.tma_ring, **dn_cfg.launch_options())
    return slot_down


def gemv_launches(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, out, swiglu_limit=SWIGLU_LIMIT,
                  configs=None) -> list:
    """The GEMV forward as its four launches ``[(name, fn)]`` (:data:`GEMV_LAUNCH_NAMES`) over buffers
    allocated here: run in order they are :func:`moe_mxfp4_forward` with ``upcast="gemv"`` into ``out``;
    the device tool also times each alone (per-launch breakdown). Inputs as validated by the forward."""
    batch, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    num_rows = batch * top_k
    ids = topk_ids.contiguous()
    weights = topk_weights.contiguous()
    gu_cfg, dn_cfg = configs if configs else gemv_configs(
        num_rows, inter, tma=tma_tables_usable(x, w13, w13_scale, w2, w2_scale))
    if not (isinstance(gu_cfg, GemvConfig) and isinstance(dn_cfg, GemvConfig)):
        raise ValueError(f"configs for upcast='gemv' must be two GemvConfig, got {configs!r}")
    gu_k, dn_k = min(gu_cfg.block_k, hidden // gu_cfg.split_k), min(dn_cfg.block_k, inter // dn_cfg.split_k)
    if (inter % gu_cfg.block_n or hidden % dn_cfg.block_n or gu_k % 32 or dn_k % 32 or gu_cfg.split_k < 1
            or dn_cfg.split_k < 1 or hidden % (gu_k * gu_cfg.split_k) or inter % (dn_k * dn_cfg.split_k)):
        raise ValueError(f"GEMV tiles {configs!r} do not divide H={hidden}, I={inter} (K splits x block_k)")
    if gu_cfg.x_f32 != dn_cfg.x_f32:
        raise ValueError(f"GEMV configs must agree on x_f32 (one activation layout per forward), got {configs!r}")
    x_f32 = gu_cfg.x_f32
    tma_ring = gu_cfg.tma_ring
    if tma_ring and (dn_cfg.tma_ring < 1 or x_f32 or gu_k < 512 or dn_k < 512
                     or any(c.two_rows or c.prefetch or c.split_k > 1 for c in (gu_cfg, dn_cfg))):
        raise ValueError(f"GEMV tma_ring needs both configs with a ring (each its own depth), block_k >= 512 "
                         f"(K >= 512), one row per pass, "
                         f"no K split, no prefetch, no x_f32; got {configs!r} at H={hidden}, I={inter}")
    gu_persistent, dn_persistent = gu_cfg.persistent_programs_per_sm, dn_cfg.persistent_programs_per_sm
    if (gu_persistent or dn_persistent) and (not tma_ring or min(gu_persistent, dn_persistent) < 0):
        raise ValueError(f"GEMV persistent_programs_per_sm needs tma_ring (either launch may take it, >= 0), "
                         f"got {configs!r}")
    if (gu_cfg.f16 or dn_cfg.f16) and (gu_cfg.f16 != dn_cfg.f16 or not tma_ring or gu_persistent):
        raise ValueError(f"GEMV f16 needs both configs alike, tma_ring and no persistent gate/up, got {configs!r}")
    act_shift = f16_act_shift(swiglu_limit) if gu_cfg.f16 else None
    f16 = act_shift is not None  # where the clamp does not bound the SwiGLU rows, the bf16 decode runs
    if (gu_cfg.pdl != dn_cfg.pdl or gu_cfg.pdl_late != dn_cfg.pdl_late or gu_cfg.pdl_l2
            or ((gu_cfg.pdl or dn_cfg.pdl) and not gu_cfg.f16)
            or ((dn_cfg.pdl_late or dn_cfg.pdl_l2) and not dn_cfg.pdl)):
        raise ValueError(f"GEMV pdl needs f16, both configs alike in pdl and pdl_late (which need pdl), pdl_l2 on the "
                         f"down config only (with pdl); got {configs!r}")
    if gu_cfg.early_tables != dn_cfg.early_tables or (gu_cfg.early_tables and not gu_cfg.f16):
        raise ValueError(f"GEMV early_tables needs f16 and both configs alike; got {configs!r}")
    if gu_cfg.w0_early or (dn_cfg.w0_early and (not dn_cfg.early_tables or dn_cfg.persistent_programs_per_sm
                                                or dn_cfg.w0_early not in W0_EARLY_FORMS)):
        raise ValueError(f"GEMV w0_early ({'/'.join(W0_EARLY_FORMS)}) is for the down config, with early_tables, not "
                         f"persistent; got {configs!r}")
    device = x.device
    # the instructions need griddepcontrol (cc >= 9, not the interpreter); the bf16 decode (no clamp) launches without
    pdl = gu_cfg.pdl and f16 and pdl_supported(device)
    pdl_args = dict(PDL=pdl, PDL_LATE=pdl and gu_cfg.pdl_late, launch_pdl=pdl)
    early_tables = f16 and gu_cfg.early_tables
    route_kernel = num_rows <= ROUTE_TRITON_MAX_ROWS
    if x_f32 or f16:
        if x_f32:
            x_in = torch.empty(batch, hidden, dtype=torch.float32, device=device)
        else:  # the activations as scaled fp16 pairs, and each row's 2**-shift
            x_in = torch.empty(batch, hidden, dtype=torch.float16, device=device)
            x_unscale = torch.empty(batch, dtype=torch.float32, device=device)
        if route_kernel:
            sorted_rows = torch.empty(num_rows, dtype=torch.int32, device=device)
            expert_start = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
            active_experts = torch.empty(num_experts, dtype=torch.int32, device=device)
            num_active = torch.empty(1, dtype=torch.int32, device=device)
        else:
            sorted_rows, expert_start, active_experts, num_active = route(ids, num_experts)
    else:
        x_in = x.view(torch.int32)
        sorted_rows, expert_start, active_experts, num_active = route(ids, num_experts)  # launch 1, run now
    slots = min(num_rows, num_experts)
    act_dtype = torch.float32 if x_f32 else (torch.float16 if f16 else torch.bfloat16)
    act = torch.empty(num_rows, inter, dtype=act_dtype, device=device)
    y = torch.empty(dn_cfg.split_k, num_rows, hidden, dtype=torch.float32, device=device)
    gu_grid = (slots, inter // gu_cfg.block_n, gu_cfg.split_k)
    if gu_cfg.split_k > 1:
        partial = torch.empty(gu_cfg.split_k, num_rows, 2 * inter, dtype=torch.float32, device=device)
        tickets = _tickets(device, slots * gu_grid[1])
    else:
        partial, tickets = y, num_active  # unused

    if tma_ring:  # host-side descriptors: kernel parameters, so a captured graph replays them as they are
        from triton.tools.tensor_descriptor import TensorDescriptor

        w13_desc, w13_s_desc, w2_desc, w2_s_desc = _expert_weight_descriptors(
            w13, w13_scale, w2, w2_scale, hidden, inter, 2 * gu_cfg.block_n, gu_k, dn_cfg.block_n, dn_k)
        x_desc = TensorDescriptor.from_tensor((x_in if f16 else x).view(torch.int32), [1, gu_k // 2])
        down_tma = _gemv_tma_down_launch(act, w2_desc, w2_s_desc, weights, ids, sorted_rows, expert_start,
                                         active_experts, num_active, y, num_rows, num_experts, hidden, inter, slots,
                                         dn_cfg, dn_k, device, act_unscale=2.0 ** -act_shift if f16 else None,
                                         w2_bytes=w2, w2_scale_bytes=scale_bytes(w2_scale),
                                         pdl_args=dict(pdl_args, L2_PREFETCH=pdl and dn_cfg.pdl_l2,
                                                       **({} if dn_cfg.persistent_programs_per_sm
                                                          else {"EARLY_TABLES": early_tables,
                                                                "W0_EARLY": early_tables and bool(dn_cfg.w0_early),
                                                                "W0_PLAIN": dn_cfg.w0_early == "plain"})))

    # persistent grid: the program count from shapes and the device only, so a captured graph replays it
    gu_persistent_grid = (min(num_rows * (inter // gu_cfg.block_n), _sm_count(device) * gu_persistent),)

    def gate_up():
        if gu_persistent:
            _gate_up_gemv_tma_persistent_kernel[gu_persistent_grid](
                x_desc, w13_desc, w13_s_desc, ids, sorted_rows, act, num_rows, num_experts, hidden, inter,
                float(swiglu_limit), TOP_K=top_k, BLOCK_N=gu_cfg.block_n, BLOCK_K=gu_k, RING=tma_ring,
                **gu_cfg.launch_options())
            return
        if f16:
            _gate_up_gemv_tma_f16_kernel[gu_grid](
                x_desc, w13_desc, w13_s_desc, x_unscale, sorted_rows, expert_start, active_experts, num_active, act,
                hidden, inter, float(swiglu_limit), 2.0 ** act_shift, TOP_K=top_k, BLOCK_N=gu_cfg.block_n,
                BLOCK_K=gu_k, RING=tma_ring, EMULATE=interpreter_enabled(), EARLY_TABLES=early_tables,
                NUM_EXPERTS=num_experts, **pdl_args, **gu_cfg.launch_options())
            return
        if tma_ring:
            _gate_up_gemv_tma_kernel[gu_grid](
                x_desc, w13_desc, w13_s_desc, sorted_rows, expert_start, active_experts, num_active, act, hidden,
                inter, float(swiglu_limit), TOP_K=top_k, BLOCK_N=gu_cfg.block_n, BLOCK_K=gu_k, RING=tma_ring,
                **gu_cfg.launch_options())
            return
        _gate_up_gemv_kernel[gu_grid](
            x_in, w13.view(torch.int32), scale_bytes(w13_scale), sorted_rows, expert_start,
            active_experts, num_active, act, partial, tickets, num_rows, hidden, inter, float(swiglu_limit),
            TOP_K=top_k, BLOCK_N=gu_cfg.block_n, BLOCK_K=gu_k, TWO_ROWS=gu_cfg.two_rows, SPLIT_K=gu_cfg.split_k,
            PREFETCH=gu_cfg.prefetch, X_F32=x_f32, **gu_cfg.launch_options())

    def down():
        if tma_ring:
            down_tma()
            return
        _down_gemv_kernel[(slots, hidden // dn_cfg.block_n, dn_cfg.split_k)](
            act if x_f32 else act.view(torch.int32), w2.view(torch.int32), scale_bytes(w2_scale), weights,
            sorted_rows, expert_start, active_experts, num_active, y, num_rows, hidden, inter,
            BLOCK_N=dn_cfg.block_n, BLOCK_K=dn_k, TWO_ROWS=dn_cfg.two_rows, SPLIT_K=dn_cfg.split_k,
            PREFETCH=dn_cfg.prefetch, X_F32=x_f32, **dn_cfg.launch_options())

    def topk_sum():
        launch_topk_sum(y, ids, out, num_experts, num_rows * hidden, dn_cfg.split_k, pdl_args, early_tables)

    def route_x_f32():  # routing (unless the torch sort did it) and x -> float32 word-pair order, one launch
        _route_x_f32_kernel[(int(route_kernel) + triton.cdiv(x.numel(), GEMV_X_BLOCK),)](
            ids, num_rows, sorted_rows, expert_start, active_experts, num_active, x, x_in, x.numel(),
            NUM_EXPERTS=num_experts, BLOCK_ROWS=triton.next_power_of_2(max(num_rows, 16)),
            NUM_BINS=triton.next_power_of_2(num_experts + 1), BLOCK_X=GEMV_X_BLOCK, ROUTE=route_kernel,
            num_warps=4)

    def route_x_f16():  # routing (unless the torch sort did it) and x -> scaled fp16 pairs, one launch
        _route_x_f16_kernel[(int(route_kernel) + batch,)](
            ids, num_rows, sorted_rows, expert_start, active_experts, num_active, x, x_in, x_unscale, hidden,
            NUM_EXPERTS=num_experts, BLOCK_ROWS=triton.next_power_of_2(max(num_rows, 16)),
            NUM_BINS=triton.next_power_of_2(num_experts + 1), BLOCK_H=triton.next_power_of_2(hidden),
            ROUTE=route_kernel, SMALL_ROUTE=num_rows <= ROUTE_SMALL_MAX_ROWS, num_warps=4, **pdl_args)

    route_x = route_x_f32 if x_f32 else (route_x_f16 if f16 else None)
    if route_x:
        route_x()
    pending = [True]  # the routing above is this forward's first launch

    def route_step():  # later calls re-run the routing kernel into the same buffers (per-launch timing)
        if route_x and not pending[0]:
            route_x()
        elif pending[0]:
            pending[0] = False
        elif num_rows <= ROUTE_TRITON_MAX_ROWS:  # beyond, the torch sort above is reused (same ids)
            _route_kernel[(1,)](ids, num_rows, sorted_rows, expert_start, active_experts, num_active,
                                NUM_EXPERTS=num_experts, BLOCK_ROWS=triton.next_power_of_2(max(num_rows, 16)),
                                NUM_BINS=triton.next_power_of_2(num_experts + 1), num_warps=4)

    return list(zip(GEMV_LAUNCH_NAMES, (route_step, gate_up, down, topk_sum)))


@dataclasses.dataclass(frozen=True)
class PairsConfig:
    """Tile of the tensor-core pairs decode: ``block_n`` output columns per program (gate/up: intermediate
    columns, i.e. 2*block_n weight rows, the MMA's M side), ``block_k`` K values per loop step (a multiple
    of 32: one MMA + scale FFMA per 32-group), ``block_m`` routed rows per pass (the MMA's N side: 8, 16, 32 or
    64; 8 is one m16n8k16 MMA per 16 values of K, half the activation loads of 16),
    ``mul_pairs``: nibble pairs placed by a multiply (3 instead of 4 integer instructions per pair);
    ``scale_bf16``: the E8M0 scale multiplies the pair words in packed bf16 (one MMA per K step instead
    of one per 32-group plus an FFMA; exact for E8M0 bytes 34..160, inf above 160); ``scale_on_words`` (round 9,
    one MMA per K step as ``scale_bf16``): the same factor multiplied onto the int32 pair words by PTX
    ``mul.rn.bf16x2`` before they are split into bf16 values (:func:`_pairs_tile_scaled`: no half swaps around
    the packed multiply, one scale byte per thread and group instead of a shared-memory shuffle of the scales);
    ``tma_ring`` (> 0, round 15, both configs of a forward alike; needs ``scale_bf16`` and block_k >= 512, so a
    row's scale bytes of a step are the 16 bytes TMA needs): swap-AB fed by TMA -- the weight words and E8M0
    bytes of each K step arrive by TMA through a ring of that many stages (:func:`_pairs_rows_tma`; the
    activations by plain loads), on the TMA GEMV's small tiles (``num_stages`` is then unused); ``sub_k`` (with
    ``tma_ring``, round 18; 0 = block_k): K values per MMA within a K step (block_k / sub_k of 1, 2 or 4, sub_k >= 128),
    the weight words fetched by TMA in blocks of sub_k (the scale bytes still one block of the whole step);
    ``max_registers`` (> 0): ptxas' register cap for the launch (``maxnreg``; more programs per SM where registers
    hold them to fewer than shared memory allows)."""
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 3
    block_m: int = 16
    mul_pairs: bool = False
    scale_bf16: bool = False
    scale_on_words: bool = False
    tma_ring: int = 0
    sub_k: int = 0
    max_registers: int = 0

    def __post_init__(self):
        check_register_cap("PairsConfig.max_registers", self.max_registers)

    def label(self) -> str:
        stages = f"tma{self.tma_ring}" if self.tma_ring else f"s{self.num_stages}"
        return (f"n{self.block_n}k{self.block_k}w{self.num_warps}{stages}"
                + (f"m{self.block_m}" if self.block_m != 16 else "") + ("mul" if self.mul_pairs else "")
                + ("h" if self.scale_bf16 else "") + ("wd" if self.scale_on_words else "")
                + (f"c{self.sub_k}" if self.sub_k else "") + (f"r{self.max_registers}" if self.max_registers else ""))

    def mma_k(self, block_k: int) -> int:
        """K values per MMA at the launch's K step ``block_k`` (``sub_k``, or the whole step)."""
        return min(self.sub_k, block_k) if self.sub_k else block_k

    def scale_bf16_constexpr(self) -> int:
        """SCALE_BF16 of the launch: 1 (packed bf16 multiply) or, under the CPU interpreter, 2 (the same
        exact products in float32 by bits); with ``scale_on_words`` 3 (PTX on the pair words) or, under the
        interpreter (no inline PTX), 4 (the same products by bits); 0 without either."""
        if self.scale_on_words:
            return 4 if interpreter_enabled() else 3
        if not self.scale_bf16:
            return 0
        return 2 if interpreter_enabled() else 1


PAIRS_X_BLOCK = 1024  # activations one program of the pairs routing launch reorders


# Round 9 (benchmarks/moe_mxfp4-h200-run10-summary.md, H200 runs 10/10b/10c, every point reference-checked): the
# E8M0 factor on the int32 pair words (PairsConfig.scale_on_words) at the default tiles beside the pairs default:
# faster at T=1 B = 17 / 24 / 32 / 64 / 256 (669.5 / 881.2 / 1031.7 / 1489.2 / 1974.6 vs 687.5 / 907.7 / 1058.6 /
# 1536.2 / 2043.1 us), T=2 B = 17 / 32 / 64 (352.9 / 562.2 / 740.5 vs 358.5 / 580.6 / 764.1), T=4 B = 12 / 16 / 17 /
# 24 / 32 / 64 / 256 (145.7 / 179.5 / 195.2 / 245.6 / 298.0 / 412.6 / 568.4 vs 149.6 / 184.3 / 200.9 / 252.4 / 305.1 /
# 425.6 / 591.0), T=8 B = 1 / 8 / 16 / 17 / 32 / 64 (31.6 / 67.1 / 118.2 / 122.4 / 177.4 / 253.5 vs 33.1 / 68.8 /
# 120.9 / 125.2 / 181.6 / 259.5); slower at T=4 B = 9 (123.3 vs 119.9 us), B = 10 / 11 not measured, so at
# I = 512 it starts at B = 12. (per-rank I, fewest routed rows) where it does not start at the first row:
PAIRS_SCALE_ON_WORDS_MIN_ROWS = {MOE_INTERMEDIATE_SIZE // 4: 12 * TOP_K}
PAIR_WORDS_MUL_MIN_CAPABILITY = 9  # PTX mul.rn.bf16x2 (PairsConfig.scale_on_words): sm_90 and sm_12x
# Round 15 (benchmarks/moe_mxfp4-h200-run15-summary.md, H200 runs 15 / 15b, every point reference-checked): swap-AB
# fed by TMA (PairsConfig(tma_ring=)) with one warp per 16 weight rows -- gate/up 16 columns (32 rows) on 2 warps,
# down 16 rows on 1 warp, 2 stages, the factor on the pair words -- beside the defaults: I = 2048 (T=1) B = 4 / 8 / 16
# in 150.3 / 272.1 / 476.7 us against the TMA GEMV's 163.3 / 303.3 / 587.8 and B = 32 / 64 in 797.6 / 1150 against
# the pairs decode's 1029 / 1493 (1.09-1.30x); B = 1 / 2 slower (51.15 / 87.44 vs 49.54 / 85.31). I = 512 (T=4)
# B = 16 / 32 / 64 in 149.8 / 252.5 / 355.9 against the pairs decode's 179.5 / 299.4 / 414.0 (1.16-1.20x); B = 4
# 53.54 vs 57.24 but B = 8 94.93 vs 92.53 and B = 1 / 2 0.79-0.84x (the TMA GEMV stays there). More warps than
# 16-row tiles replicate the dequantisation (each warp's mma.sync M tile is the whole 16 rows): 4 warps on 16 rows
# were 0.37-0.49x. B between measured wins take it, B = 3, 65.. and I = 1024 / 256 are not measured.
# (per-rank I, fewest routed rows, most routed rows):
# Run 18b extends it to B = 256 (the run-18 tiles below; above B = 64 the cp.async tiles had run).
PAIRS_TMA_WHERE = ((MOE_INTERMEDIATE_SIZE, 4 * TOP_K, 256 * TOP_K), (MOE_INTERMEDIATE_SIZE // 4, 16 * TOP_K, 256 * TOP_K))
PAIRS_TMA_TILES = (PairsConfig(16, 512, 2, mul_pairs=True, scale_bf16=True, scale_on_words=True, tma_ring=2),
                   PairsConfig(16, 512, 1, mul_pairs=True, scale_bf16=True, scale_on_words=True, tma_ring=2))
# Runs 18 / 18b (benchmarks/moe_mxfp4-h200-run18-summary.md) had shipped the gate/up tile above with a down launch on 32
# rows / 2 warps and MMAs of 128 (sub_k) at B = 48..256; runs 20 / 20b (benchmarks/moe_mxfp4-h200-run20-summary.md,
# every variant reference-checked, every launch also timed alone) replace it with tiles chosen by the routed rows per
# expert.
# 8 routed rows per MMA pass (block_m 8: one m16n8k16 per 16 values of K, half the activation loads; sm_90a gate/up K
# step 905 instead of 1044 instructions, 128 instead of 168 registers) and 32 weight rows per warp (gate/up 64 rows,
# down 64 rows, on 2 warps, MMAs of 128): run 20b against the defaults of the time, T=1 (I = 2048) B = 16 / 24 / 32 /
# 40 / 64 / 128 in 339.8 / 499.8 / 568.5 / 730.2 / 878.4 / 1139.2 us vs 375.6 / 548.6 / 731.1 (the fp16 GEMV) / 946.6 /
# 1089.6 / 1398.1 (1.10-1.30x; run 20: B = 32 / 48 / 64 / 128 1.25-1.31x, B = 64 819.1 vs 1075 us = 75.8 % of copy);
# T=4 (I = 512) with MMAs of 256 in the gate/up launch (faster there than 128 at B = 24..128 by 1.8-4.8 %, equal at
# B = 16) B = 16 / 24 / 32 / 40 / 64 / 128 in 108.3 / 143.3 / 171.6 / 190.9 / 239.9 / 305.1 vs 113.5 / 169.4 / 214.9 /
# 284.2 / 325.9 / 405.3 (1.05-1.49x). At B = 256 (6 routed rows per expert on average: a second pass over the weights
# of every expert with more than 8) the 64-row gate/up tile keeps 16 rows per pass, the down launch 8: T=1 1383.8 vs
# 1514.9 us, T=4 406.7 vs 452.5 (1.095x / 1.113x; the 8-row gate/up 1410.8 / 410.6 here, 1465.8 / 420.3 in run 20).
# B = 8 keeps the fp16 GEMV (0.90-1.00x), B = 9..15 are not measured and keep it; B = 129..255 are not measured and take
# the B = 128 tiles; I = 1024 / 256 not measured. (per-rank I, fewest routed rows, most routed rows, tiles):
_PAIRS_M8 = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True, "tma_ring": 2}
PAIRS_TMA_ROWS8_TILES = (PairsConfig(32, 512, 2, block_m=8, sub_k=128, **_PAIRS_M8),
                         PairsConfig(64, 512, 2, block_m=8, sub_k=128, **_PAIRS_M8))
PAIRS_TMA_ROWS8_K256_TILES = (PairsConfig(32, 512, 2, block_m=8, sub_k=256, **_PAIRS_M8), PAIRS_TMA_ROWS8_TILES[1])
PAIRS_TMA_ROWS16_GATE_UP_TILES = (PairsConfig(32, 512, 2, sub_k=128, **_PAIRS_M8), PAIRS_TMA_ROWS8_TILES[1])
# Round 21 (benchmarks/moe_mxfp4-h200-run21-summary.md, H200 run 21, two scripts in one call, every row checked):
# - T=1 B = 12 / 15 (the fp16 GEMV's until then): the 8-row tiles with 256-wide gate/up MMAs 270.2 / 330.3 vs 289.7 /
#   354.3 us (1.072x / 1.073x; B = 13 / 14 between them take it, B = 9..11 are not measured and keep the GEMV); at T=4
#   B = 12 / 15 they were 1.010x / 0.97x, the GEMV stays.
# - B = 192 / 224 (the B = 128 tiles) and B = 256 unchanged: the other tile pairs 0.94-1.017x there.
# - Past B = 256 up to PAIRS_MAX_ROWS (640 tokens) the pairs decode replaces the tl.dot decode (up to 2048 routed rows)
#   and the grouped GEMM of kernels/moe_prefill.py (above), with the 64-row gate/up and a 64-row down tile both 16
#   routed rows per pass (an expert gets 7-15 rows on average there): T=1 300 / 341 / 384 / 512 / 640 tokens 1292.1 /
#   1338.1 / 1412.4 / 1649.3 / 1942.8 us against 2713.3 / 2787.3 (split_bf16) / 2484.7 / 2569.9 / 2530.0 (grouped
#   GEMM), T=4 415.6 / 420.8 / 503.2 / 559.7 / 661.2 against 1075.7 / 1087.0 (regs) / 753.6 / 760.2 / 771.6 (1.17-2.59x);
#   with the B = 256 tiles' 8-row down launch 1.01-1.12x slower. At 768 tokens (4608 rows) the pairs decode was 1.03x at
#   T=1 (2499.0 vs 2575.0) but 0.90x at T=4 (890.3 vs 805.5), so the grouped GEMM keeps it; 3841..4607 not measured.
PAIRS_MAX_ROWS = 640 * TOP_K  # routed rows up to which the pairs decode runs (its routing sorts them in one program)
PAIRS_TMA_ROWS16_TILES = (PAIRS_TMA_ROWS16_GATE_UP_TILES[0], PairsConfig(64, 512, 2, sub_k=128, **_PAIRS_M8))
PAIRS_TMA_ROWS_WHERE = ((MOE_INTERMEDIATE_SIZE, 12 * TOP_K, 15 * TOP_K, PAIRS_TMA_ROWS8_K256_TILES),
                        (MOE_INTERMEDIATE_SIZE, 16 * TOP_K, 255 * TOP_K, PAIRS_TMA_ROWS8_TILES),
                        (MOE_INTERMEDIATE_SIZE, 255 * TOP_K + 1, 256 * TOP_K, PAIRS_TMA_ROWS16_GATE_UP_TILES),
                        (MOE_INTERMEDIATE_SIZE, 256 * TOP_K + 1, PAIRS_MAX_ROWS, PAIRS_TMA_ROWS16_TILES),
                        (MOE_INTERMEDIATE_SIZE // 4, 16 * TOP_K, 255 * TOP_K, PAIRS_TMA_ROWS8_K256_TILES),
                        (MOE_INTERMEDIATE_SIZE // 4, 255 * TOP_K + 1, 256 * TOP_K, PAIRS_TMA_ROWS16_GATE_UP_TILES),
                        (MOE_INTERMEDIATE_SIZE // 4, 256 * TOP_K + 1, PAIRS_MAX_ROWS, PAIRS_TMA_ROWS16_TILES))


def pairs_rows_tiles(num_rows: int, inter: int):
    """The TMA pairs tiles :data:`PAIRS_TMA_ROWS_WHERE` names at (routed rows, per-rank I), or None."""
    return next((tiles for i, lo, hi, tiles in PAIRS_TMA_ROWS_WHERE if inter == i and lo <= num_rows <= hi), None)


# ptxas register caps (PairsConfig.max_registers) of TMA pairs tiles on compute capability 9 only
# (:func:`pairs_register_caps_measured`), keyed by (per-rank I, tile). H200 stop 42
# (benchmarks/moe_pairs_caps-h200-run1-summary.md; whole forwards, 2 interleaved rounds, every one checked): the 8-row
# down tile takes 141 registers on sm_90a under the device's Triton 3.6 (7 programs of 2 warps per SM, where its
# 25672 B of shared memory allow 8) and 125 capped at 128 (8, no spills): at T=4 (I = 512, one K step per program)
# B = 16 / 32 / 64 / 128 / 256 in 104.9 / 166.3 / 231.6 / 293.0 / 392.5 us against 107.8 / 171.3 / 239.1 / 301.9 /
# 401.5 (1.023-1.032x); at T=1 (I = 2048, four K steps) it lost (0.959-0.999x) and is not capped. The T=4 gate/up
# tile with MMAs of 256 capped at 144 (160 -> 144 registers, 6 -> 7 programs) was level (0.997-1.002x). On sm_120a
# these tiles are held by shared memory (3 programs of 25.7 KB in 100 KB), so sm_12x runs them uncapped.
PAIRS_REGISTER_CAPS_MEASURED_CAPABILITY = 9
PAIRS_REGISTER_CAPS: dict[tuple[int, PairsConfig], int] = {(MOE_INTERMEDIATE_SIZE // 4, PAIRS_TMA_ROWS8_TILES[1]): 128}


def pairs_register_caps_measured(device=None) -> bool:
    """Whether ``device`` is a GPU of the compute capability :data:`PAIRS_REGISTER_CAPS` were timed on (9.x: H100 /
    H200). No device, the CPU or any other GPU (sm_12x, where shared memory holds these tiles): False. The sm_12x
    dispatch check (tools/device_sm120_dispatch.py) answers this query as sm_12x does."""
    return cuda_capability_major(device) == PAIRS_REGISTER_CAPS_MEASURED_CAPABILITY


def _with_pairs_register_caps(tiles, inter: int, device):
    """``tiles`` with the caps :data:`PAIRS_REGISTER_CAPS` gives them at ``inter``, where they were measured."""
    if not pairs_register_caps_measured(device):
        return tiles
    return tuple(dataclasses.replace(cfg, max_registers=PAIRS_REGISTER_CAPS[(inter, cfg)])
                 if isinstance(cfg, PairsConfig) and (inter, cfg) in PAIRS_REGISTER_CAPS else cfg for cfg in tiles)


# Run 15c (benchmarks/moe_mxfp4-h200-run15c-summary.md, H200 runs 15c / 15c2, every point reference-checked): the mixed
# forward -- the swap-AB gate/up launch (PAIRS_TMA_TILES[0]) writing natural-order bf16 SwiGLU rows (NATURAL_ACT),
# then the TMA GEMV down launch of gemv_configs (3 stages; persistent, P = 8, at I = 512) -- beside the defaults,
# kept where it was >= 2 % faster in every run that measured it: I = 2048 (T=1) B = 2 83.21 / 83.10 vs 85.41 / 85.04 us
# (TMA GEMV), B = 5 / 6 185.5 / 219.8 vs 190.4 / 224.4 (swap-AB); I = 512 (T=4) B = 4 50.14 / 50.12 vs 57.02 / 57.02,
# B = 5 / 6 63.35 / 72.63 vs 64.67 / 76.70, B = 8 87.25 / 87.35 vs 92.49 / 92.54 (TMA GEMV). Not: T=1 B = 1 (1.021x /
# 1.018x), 3 (1.018x twice), 4 / 7 / 8 (0.98-0.99x); T=4 B = 1..3 (0.84-0.92x), 7 (0.972x).
# (per-rank I, fewest routed rows, most routed rows):
PAIRS_GEMV_DOWN_WHERE = ((MOE_INTERMEDIATE_SIZE, 2 * TOP_K, 2 * TOP_K), (MOE_INTERMEDIATE_SIZE, 5 * TOP_K, 6 * TOP_K),
                         (MOE_INTERMEDIATE_SIZE // 4, 4 * TOP_K, 6 * TOP_K),
                         (MOE_INTERMEDIATE_SIZE // 4, 8 * TOP_K, 8 * TOP_K))


def pairs_gemv_down_default(num_rows: int, inter: int) -> bool:
    """Whether the mixed forward (swap-AB gate/up, TMA GEMV down) is the default (:data:`PAIRS_GEMV_DOWN_WHERE`)."""
    return any(inter == i and lo <= num_rows <= hi for i, lo, hi in PAIRS_GEMV_DOWN_WHERE)


def pairs_tma_default(num_rows: int, inter: int) -> bool:
    """Whether the TMA-fed swap-AB pairs decode is the default at this shape (:data:`PAIRS_TMA_WHERE`, and the mixed
    forward's :data:`PAIRS_GEMV_DOWN_WHERE`)."""
    return (any(inter == i and lo <= num_rows <= hi for i, lo, hi in PAIRS_TMA_WHERE)
            or pairs_gemv_down_default(num_rows, inter))


def pairs_configs(num_rows: int, inter: int, words_mul: bool = True,
                  tma: bool = True, device=None) -> tuple[PairsConfig, PairsConfig | GemvConfig]:
    """(gate/up, down) tiles of the pairs decode: the TMA-fed swap-AB tiles :data:`PAIRS_TMA_TILES` where
    :data:`PAIRS_TMA_WHERE` says (the tiles of :data:`PAIRS_TMA_ROWS_WHERE` where it names the shape), ``tma`` says the
    operands allow TMA (:func:`gemv_tma_usable`) and ``words_mul``
    the GPU has the packed bf16 multiply (under the same conditions, where :data:`PAIRS_GEMV_DOWN_WHERE` says, the
    mixed forward: the swap-AB gate/up tile and the TMA GEMV down tile of :func:`gemv_configs`); else the fastest
    of the H200 round-4 and round-5 runs at every measured (T, B) (gate/up 32 columns = 64 weight rows, down 64
    rows, K steps of 128, 4 warps, 3 stages, nibble pairs by multiply, E8M0 factor in packed bf16;
    benchmarks/moe_mxfp4-h200-run2.md, run3.md), the factor on the int32 pair words where round 9 measured that
    faster (:data:`PAIRS_SCALE_ON_WORDS_MIN_ROWS`) and ``words_mul`` says the GPU has the packed bf16 multiply it
    needs (:func:`pair_words_mul_usable`). On ``device`` of the compute capability where they were measured, the
    register caps of :data:`PAIRS_REGISTER_CAPS`."""
    if tma and words_mul and pairs_gemv_down_default(num_rows, inter):
        return PAIRS_TMA_TILES[0], gemv_configs(num_rows, inter, f16=False)[1]
    if tma and words_mul and pairs_rows_tiles(num_rows, inter):
        return _with_pairs_register_caps(pairs_rows_tiles(num_rows, inter), inter, device)
    if tma and words_mul and pairs_tma_default(num_rows, inter):
        return PAIRS_TMA_TILES
    on_words = words_mul and num_rows >= PAIRS_SCALE_ON_WORDS_MIN_ROWS.get(inter, 0)
    return (PairsConfig(32, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=on_words),
            PairsConfig(64, min(128, inter), 4, mul_pairs=True, scale_bf16=True, scale_on_words=on_words))


def pair_words_mul_usable(device: torch.device) -> bool:
    """Whether ``scale_on_words`` can run on ``device``: PTX ``mul.rn.bf16x2`` needs sm_90 or newer (sm_12x
    has it); the CPU interpreter runs its emulation."""
    return has_capability(device, PAIR_WORDS_MUL_MIN_CAPABILITY)


def pairs_launches(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, out, swiglu_limit=SWIGLU_LIMIT,
                   configs=None) -> list:
    """The pairs forward as its four launches ``[(name, fn)]`` (:data:`GEMV_LAUNCH_NAMES`): routing + x in
    the pair order, gate/up, down, top-k sum, over buffers sized by the shapes only (graph-capturable).
    Inputs as validated by :func:`moe_mxfp4_forward`; up to ``PAIRS_MAX_ROWS`` routed rows."""
    batch, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    num_rows = batch * top_k
    if num_rows > PAIRS_MAX_ROWS:
        raise ValueError(f"upcast='pairs' is a decode form: at most {PAIRS_MAX_ROWS} routed rows "
                         f"(B*top_k), got {num_rows}")
    gu_cfg, dn_cfg = configs if configs else pairs_configs(num_rows, inter, pair_words_mul_usable(x.device),
                                                           tma=tma_tables_usable(x, w13, w13_scale, w2, w2_scale),
                                                           device=x.device)
    # the mixed forward: the swap-AB gate/up launch, then the TMA GEMV down launch on natural-order SwiGLU rows
    gemv_down = isinstance(gu_cfg, PairsConfig) and isinstance(dn_cfg, GemvConfig)
    if not (isinstance(gu_cfg, PairsConfig) and (isinstance(dn_cfg, PairsConfig) or gemv_down)):
        raise ValueError(f"configs for upcast='pairs' must be two PairsConfig (or a TMA PairsConfig and a TMA "
                         f"GemvConfig), got {configs!r}")
    gu_k, dn_k = min(gu_cfg.block_k, hidden), min(dn_cfg.block_k, inter)
    dn_mma = dn_cfg.block_n  # the weight side of the down MMA (the GEMV down has none: its block_n)
    if (inter % gu_cfg.block_n or hidden % dn_cfg.block_n or gu_k % 32 or dn_k % 32 or hidden % gu_k
            or inter % dn_k or min(2 * gu_cfg.block_n, dn_mma) < 16
            or any(c.block_m not in (8, 16, 32, 64) for c in (gu_cfg, dn_cfg) if isinstance(c, PairsConfig))):
        raise ValueError(f"pairs tiles {configs!r} do not fit H={hidden}, I={inter} (block_k a multiple of 32 "
                         f"dividing K, block_n dividing the outputs, weight side >= 16, block_m 8 / 16 / 32 / 64)")
    tma_ring = gu_cfg.tma_ring
    if gemv_down:
        if (tma_ring <= 0 or dn_cfg.tma_ring <= 0 or min(gu_k, dn_k) < 512 or not gu_cfg.scale_bf16 or dn_cfg.x_f32
                or dn_cfg.two_rows or dn_cfg.prefetch or dn_cfg.split_k > 1 or dn_cfg.persistent_programs_per_sm < 0
                or dn_cfg.f16):
            raise ValueError(f"pairs gate/up with a GEMV down needs tma_ring > 0 in both, block_k >= 512 (K >= 512), "
                             f"scale_bf16, and a plain one-row GEMV down (no x_f32 / f16 / two_rows / prefetch / K "
                             f"split); "
                             f"got {configs!r} at H={hidden}, I={inter}")
    elif (gu_cfg.tma_ring or dn_cfg.tma_ring) and (dn_cfg.tma_ring != tma_ring or tma_ring < 0
                                                   or min(gu_k, dn_k) < 512
                                                   or not (gu_cfg.scale_bf16 and dn_cfg.scale_bf16)):
        raise ValueError(f"pairs tma_ring needs both configs alike (> 0), block_k >= 512 (K >= 512) and scale_bf16; "
                         f"got {configs!r} at H={hidden}, I={inter}")
    gu_mma_k = gu_cfg.mma_k(gu_k)
    dn_mma_k = dn_k if gemv_down else dn_cfg.mma_k(dn_k)
    if (gu_cfg.sub_k or (dn_cfg.sub_k if not gemv_down else 0)) and (
            not tma_ring or gu_mma_k < 128 or dn_mma_k < 128 or gu_k // gu_mma_k not in (1, 2, 4)
            or dn_k // dn_mma_k not in (1, 2, 4) or gu_k % gu_mma_k or dn_k % dn_mma_k):
        raise ValueError(f"pairs sub_k needs tma_ring and block_k / sub_k of 1, 2 or 4 with sub_k >= 128; "
                         f"got {configs!r} at H={hidden}, I={inter}")
    device = x.device
    ids = topk_ids.contiguous()
    weights = topk_weights.contiguous()
    sorted_rows = torch.empty(num_rows, dtype=torch.int32, device=device)
    expert_start = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
    active_experts = torch.empty(num_experts, dtype=torch.int32, device=device)
    num_active = torch.empty(1, dtype=torch.int32, device=device)
    x_pairs = torch.empty(batch, hidden, dtype=torch.bfloat16, device=device)
    act = torch.empty(num_rows, inter, dtype=torch.bfloat16, device=device)
    y = torch.empty(num_rows, hidden, dtype=torch.float32, device=device)
    slots = min(num_rows, num_experts)
    if tma_ring:  # host-side descriptors: kernel parameters, so a captured graph replays them as they are
        w13_desc, w13_s_desc, w2_desc, w2_s_desc = _expert_weight_descriptors(
            w13, w13_scale, w2, w2_scale, hidden, inter, 2 * gu_cfg.block_n, gu_k, dn_cfg.block_n, dn_k,
            gate_up_word_k=gu_mma_k, down_word_k=dn_mma_k)
        if gemv_down:
            down_gemv = _gemv_tma_down_launch(act, w2_desc, w2_s_desc, weights, ids, sorted_rows, expert_start,
                                              active_experts, num_active, y, num_rows, num_experts, hidden, inter,
                                              slots, dn_cfg, dn_k, device)

    def route_step():
        _route_pairs_kernel[(1 + triton.cdiv(x.numel(), PAIRS_X_BLOCK),)](
            ids, num_rows, sorted_rows, expert_start, active_experts, num_active, x, x_pairs, x.numel(),
            NUM_EXPERTS=num_experts, BLOCK_ROWS=triton.next_power_of_2(max(num_rows, 16)),
            NUM_BINS=triton.next_power_of_2(num_experts + 1), BLOCK_X=PAIRS_X_BLOCK, num_warps=4)

    def gate_up():
        if tma_ring:
            _gate_up_pairs_tma_kernel[(slots, inter // gu_cfg.block_n)](
                x_pairs, w13_desc, w13_s_desc, sorted_rows, expert_start, active_experts, num_active, act, hidden,
                inter, float(swiglu_limit), TOP_K=top_k, BLOCK_M=gu_cfg.block_m, BLOCK_N=gu_cfg.block_n,
                BLOCK_K=gu_k, MUL_PAIRS=gu_cfg.mul_pairs, SCALE_BF16=gu_cfg.scale_bf16_constexpr(), RING=tma_ring,
                NATURAL_ACT=gemv_down, SUB_K=gu_mma_k, num_warps=gu_cfg.num_warps,
                **register_cap_option(gu_cfg.max_registers))
            return
        _gate_up_pairs_kernel[(slots, inter // gu_cfg.block_n)](
            x_pairs, w13.view(torch.int32), scale_bytes(w13_scale), sorted_rows, expert_start, active_experts,
            num_active, act, hidden, inter, float(swiglu_limit), TOP_K=top_k, BLOCK_M=gu_cfg.block_m,
            BLOCK_N=gu_cfg.block_n, BLOCK_K=gu_k, MUL_PAIRS=gu_cfg.mul_pairs,
            SCALE_BF16=gu_cfg.scale_bf16_constexpr(), num_warps=gu_cfg.num_warps, num_stages=gu_cfg.num_stages,
            **register_cap_option(gu_cfg.max_registers))

    def down():
        if gemv_down:
            down_gemv()
            return
        if tma_ring:
            _down_pairs_tma_kernel[(slots, hidden // dn_cfg.block_n)](
                act, w2_desc, w2_s_desc, weights, sorted_rows, expert_start, active_experts, num_active, y, hidden,
                inter, BLOCK_M=dn_cfg.block_m, BLOCK_N=dn_cfg.block_n, BLOCK_K=dn_k, MUL_PAIRS=dn_cfg.mul_pairs,
                SCALE_BF16=dn_cfg.scale_bf16_constexpr(), RING=tma_ring, SUB_K=dn_mma_k, num_warps=dn_cfg.num_warps,
                **register_cap_option(dn_cfg.max_registers))
            return
        _down_pairs_kernel[(slots, hidden // dn_cfg.block_n)](
            act, w2.view(torch.int32), scale_bytes(w2_scale), weights, sorted_rows, expert_start, active_experts,
            num_active, y, hidden, inter, BLOCK_M=dn_cfg.block_m, BLOCK_N=dn_cfg.block_n, BLOCK_K=dn_k,
            MUL_PAIRS=dn_cfg.mul_pairs, SCALE_BF16=dn_cfg.scale_bf16_constexpr(), num_warps=dn_cfg.num_warps,
            num_stages=dn_cfg.num_stages, **register_cap_option(dn_cfg.max_registers))

    def topk_sum():
        launch_topk_sum(y, ids, out, num_experts)

    return list(zip(GEMV_LAUNCH_NAMES, (route_step, gate_up, down, topk_sum)))


def dequant_nibbles(packed: torch.Tensor, scale: torch.Tensor, upcast: str = "split_bf16") -> torch.Tensor:
    """``[N, K/2]`` packed e2m1 + ``[N, K/32]`` E8M0 -> float32 ``[N, K]`` through the split-nibble
    upcast the GEMMs use (``upcast`` "split_f32" or "split_bf16"): its values must equal
    :func:`reference_dequant_mxfp4` bit for bit (tests; the device tool checks it on the GPU).
    N a multiple of 16, K a power of two >= 32."""
    if upcast not in _SPLIT_NIBBLES:
        raise ValueError(f"upcast must be one of {tuple(_SPLIT_NIBBLES)}, got {upcast!r}")
    rows, half_k = packed.shape
    k = 2 * half_k
    if rows % 16 or k < 32 or k & (k - 1) or tuple(scale.shape) != (rows, k // MXFP4_GROUP):
        raise ValueError(f"packed must be [N, K/2] with N % 16 == 0 and K a power of two >= 32, scale "
                         f"[N, K/32]; got {tuple(packed.shape)} and {tuple(scale.shape)}")
    out = torch.empty(rows, k, dtype=torch.float32, device=packed.device)
    _dequant_nibbles_kernel[(rows // 16,)](packed.contiguous().view(torch.uint8), scale_bytes(scale).contiguous(),
                                           out, K=k, ROWS=16, SCALE_MATH=_split_nibbles(upcast), num_warps=4)
    return out


def touched_expert_bytes(topk_ids: torch.Tensor, hidden: int, inter: int, num_experts: int) -> int:
    """Bytes of weights + E8M0 scales of the distinct experts a step reads (host helper)."""
    ids = topk_ids[(topk_ids >= 0) & (topk_ids < num_experts)]
    distinct = int(torch.unique(ids).numel())
    per_expert = 2 * inter * hidden // 2 + 2 * inter * hidden // MXFP4_GROUP
    per_expert += hidden * inter // 2 + hidden * inter // MXFP4_GROUP
    return distinct * per_expert


# ---------------------------------------------------------------------------------------------
# AOT configs (sm_120a / sm_121a)
# ---------------------------------------------------------------------------------------------
def _gate_up_sig(act_mxfp8):
    x_t = "*fp8e4nv" if act_mxfp8 else "*bf16"
    return {"x_ptr": x_t, "x_scale_ptr": "*u8" if act_mxfp8 else "*bf16", "w13_ptr": "*u8",
            "w13_scale_ptr": "*u8", "sorted_rows_ptr": "*i32", "expert_start_ptr": "*i32",
            "active_experts_ptr": "*i32", "num_active_ptr": "*i32",
            "act_ptr": x_t, "act_scale_ptr": "*u8" if act_mxfp8 else "*bf16", "partial_ptr": "*fp32",
            "ticket_ptr": "*i32", "zero_ptr": "*fp32", "zero_numel": "i32", "zero_chunk": "i32", "num_rows": "i32",
            "hidden": "i32", "inter": "i32",
            "swiglu_limit": "fp32", "TOP_K": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
            "BLOCK_K": "constexpr", "ACT_MXFP8": "constexpr", "DOT_SCALED": "constexpr",
            "SPLIT_NIBBLES": "constexpr", "SPLIT_K": "constexpr", "ZERO_OUT": "constexpr"}


def _down_sig(act_mxfp8):
    a_t = "*fp8e4nv" if act_mxfp8 else "*bf16"
    return {"act_ptr": a_t, "act_scale_ptr": "*u8" if act_mxfp8 else "*bf16", "w2_ptr": "*u8",
            "w2_scale_ptr": "*u8", "topk_weights_ptr": "*fp32", "sorted_rows_ptr": "*i32",
            "expert_start_ptr": "*i32", "active_experts_ptr": "*i32", "num_active_ptr": "*i32",
            "y_ptr": "*fp32", "hidden": "i32", "inter": "i32", "TOP_K": "constexpr", "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "ACT_MXFP8": "constexpr", "DOT_SCALED": "constexpr",
            "SPLIT_NIBBLES": "constexpr", "SPLIT_K": "constexpr", "ATOMIC_OUT": "constexpr"}




def _gate_up_gemv_sig(x_f32=False):
    return {"x_ptr": "*fp32" if x_f32 else "*i32", "w13_ptr": "*i32", "w13_scale_ptr": "*u8",
            "sorted_rows_ptr": "*i32", "expert_start_ptr": "*i32", "active_experts_ptr": "*i32",
            "num_active_ptr": "*i32", "act_ptr": "*fp32" if x_f32 else "*bf16",
            "partial_ptr": "*fp32", "ticket_ptr": "*i32", "num_rows": "i32", "hidden": "i32", "inter": "i32",
            "swiglu_limit": "fp32", "TOP_K": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
            "TWO_ROWS": "constexpr", "SPLIT_K": "constexpr", "PREFETCH": "constexpr", "X_F32": "constexpr"}


def _down_gemv_sig(x_f32=False):
    return {"act_ptr": "*fp32" if x_f32 else "*i32", "w2_ptr": "*i32", "w2_scale_ptr": "*u8", "topk_weights_ptr": "*fp32",
            "sorted_rows_ptr": "*i32", "expert_start_ptr": "*i32", "active_experts_ptr": "*i32",
            "num_active_ptr": "*i32", "y_ptr": "*fp32", "num_rows": "i32", "hidden": "i32", "inter": "i32",
            "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "TWO_ROWS": "constexpr", "SPLIT_K": "constexpr",
            "PREFETCH": "constexpr", "X_F32": "constexpr"}


def _gemv_tma_sig(kind, rows, block_k):
    """Signature of the TMA GEMV kernels: descriptors typed by their block (weights [rows, block_k/8] int32,
    scales [rows, block_k/32] bytes, one activation row's [1, block_k/2] bf16 pairs)."""
    descs = {"w": f"tensordesc<i32[{rows}, {block_k // 8}]>", "s": f"tensordesc<u8[{rows}, {block_k // 32}]>",
             "x": f"tensordesc<i32[1, {block_k // 2}]>"}
    routing = {"sorted_rows_ptr": "*i32", "expert_start_ptr": "*i32", "active_experts_ptr": "*i32",
               "num_active_ptr": "*i32"}
    if kind == "gate_up":
        return {"x_desc": descs["x"], "w13_desc": descs["w"], "w13_scale_desc": descs["s"], **routing,
                "act_ptr": "*bf16", "hidden": "i32", "inter": "i32", "swiglu_limit": "fp32", "TOP_K": "constexpr",
                "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "RING": "constexpr"}
    return {"act_desc": descs["x"], "w2_desc": descs["w"], "w2_scale_desc": descs["s"], "topk_weights_ptr": "*fp32",
            **routing, "y_ptr": "*fp32", "hidden": "i32", "inter": "i32", "BLOCK_N": "constexpr",
            "BLOCK_K": "constexpr", "RING": "constexpr"}


def _gemv_tma_persistent_sig(kind, rows, block_k):
    """Signature of the persistent TMA GEMV kernels (descriptors as :func:`_gemv_tma_sig`)."""
    tma = _gemv_tma_sig(kind, rows, block_k)
    descs = {k: v for k, v in tma.items() if k.endswith("_desc")}
    shapes = {"num_rows": "i32", "num_experts": "i32", "hidden": "i32", "inter": "i32"}
    if kind == "gate_up":
        return {**descs, "topk_ids_ptr": "*i32", "sorted_rows_ptr": "*i32", "act_ptr": "*bf16", **shapes,
                "swiglu_limit": "fp32", "TOP_K": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                "RING": "constexpr"}
    return {**descs, "topk_weights_ptr": "*fp32", "topk_ids_ptr": "*i32", "sorted_rows_ptr": "*i32", "y_ptr": "*fp32",
            **shapes, "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "RING": "constexpr"}


def _gemv_tma_f16_sig(kind, rows, block_k, persistent=False):
    """Signature of the fp16 pair decode's TMA GEMV kernels: as the bf16 ones (:func:`_gemv_tma_sig`,
    :func:`_gemv_tma_persistent_sig`) with the activation scales (gate/up: each x row's ``x_unscale`` and the
    SwiGLU rows' ``act_scale``, fp16 rows; down: ``act_unscale``), EMULATE and the PDL constexprs."""
    pdl = {"PDL": "constexpr", "PDL_LATE": "constexpr"}
    if persistent:
        sig = _gemv_tma_persistent_sig(kind, rows, block_k)
        return {**{k: v for k, v in sig.items() if k not in ("BLOCK_N", "BLOCK_K", "RING")}, "act_unscale": "fp32",
                "w2_ptr": "*i8", "w2_scale_ptr": "*u8", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                "RING": "constexpr", "EMULATE": "constexpr", **pdl, "L2_PREFETCH": "constexpr"}
    sig = _gemv_tma_sig(kind, rows, block_k)
    if kind == "gate_up":
        head = {k: sig[k] for k in ("x_desc", "w13_desc", "w13_scale_desc")}
        rest = {k: v for k, v in sig.items() if k not in head and k not in ("TOP_K", "BLOCK_N", "BLOCK_K", "RING")}
        return {**head, "x_unscale_ptr": "*fp32", **rest, "act_ptr": "*fp16", "act_scale": "fp32",
                "TOP_K": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "RING": "constexpr",
                "EMULATE": "constexpr", **pdl, "EARLY_TABLES": "constexpr", "NUM_EXPERTS": "constexpr"}
    rest = {k: v for k, v in sig.items() if k not in ("BLOCK_N", "BLOCK_K", "RING")}
    return {**rest, "act_unscale": "fp32", "w2_ptr": "*i8", "w2_scale_ptr": "*u8", "BLOCK_N": "constexpr",
            "BLOCK_K": "constexpr", "RING": "constexpr", "EMULATE": "constexpr", **pdl, "L2_PREFETCH": "constexpr",
            "EARLY_TABLES": "constexpr", "NUM_EXPERTS": "constexpr", "W0_EARLY": "constexpr", "W0_PLAIN": "constexpr"}


def _gate_up_pairs_sig():
    return {"x_ptr": "*bf16", "w13_ptr": "*i32", "w13_scale_ptr": "*u8", "sorted_rows_ptr": "*i32",
            "expert_start_ptr": "*i32", "active_experts_ptr": "*i32", "num_active_ptr": "*i32", "act_ptr": "*bf16",
            "hidden": "i32", "inter": "i32", "swiglu_limit": "fp32", "TOP_K": "constexpr", "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "MUL_PAIRS": "constexpr", "SCALE_BF16": "constexpr"}


def _down_pairs_sig():
    return {"act_ptr": "*bf16", "w2_ptr": "*i32", "w2_scale_ptr": "*u8", "topk_weights_ptr": "*fp32",
            "sorted_rows_ptr": "*i32", "expert_start_ptr": "*i32", "active_experts_ptr": "*i32",
            "num_active_ptr": "*i32", "y_ptr": "*fp32", "hidden": "i32", "inter": "i32", "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "MUL_PAIRS": "constexpr", "SCALE_BF16": "constexpr"}


def _pairs_tma_sig(kind, rows, block_k, mma_k=None):
    """Signature of the TMA-fed swap-AB pairs kernels: descriptors typed by their block (weight words
    [rows, mma_k/8] int32, scale bytes [rows, block_k/32]; ``mma_k`` defaults to ``block_k``)."""
    w, s = f"tensordesc<i32[{rows}, {(mma_k or block_k) // 8}]>", f"tensordesc<u8[{rows}, {block_k // 32}]>"
    tiles = {"BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "MUL_PAIRS": "constexpr",
             "SCALE_BF16": "constexpr", "RING": "constexpr"}
    if kind == "gate_up":
        sig = _gate_up_pairs_sig()
        return {"x_ptr": sig["x_ptr"], "w13_desc": w, "w13_scale_desc": s,
                **{k: v for k, v in sig.items() if k not in ("x_ptr", "w13_ptr", "w13_scale_ptr")}, **tiles,
                "NATURAL_ACT": "constexpr", "SUB_K": "constexpr"}
    sig = _down_pairs_sig()
    return {"act_ptr": sig["act_ptr"], "w2_desc": w, "w2_scale_desc": s,
            **{k: v for k, v in sig.items() if k not in ("act_ptr", "w2_ptr", "w2_scale_ptr")}, **tiles,
            "SUB_K": "constexpr"}


# pairs tiles compiled beside pairs_configs (the device run's candidates)
PAIRS_AOT_EXTRA = ((PairsConfig(32, 128, 4), PairsConfig(64, 128, 4)),
                   (PairsConfig(32, 128, 4, mul_pairs=True), PairsConfig(64, 128, 4, mul_pairs=True)),
                   (PairsConfig(32, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True),
                    PairsConfig(64, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True)))


# GEMV forms compiled beside the defaults (selectable through ``configs``, measured slower on the H200 in
# round 2 but kept compiling): a K split of both launches and the register prefetch
GEMV_AOT_EXTRA = (GemvConfig(8, 512, 4, split_k=2), GemvConfig(8, 512, 4, prefetch=True))
# the TMA GEMV as gemv_configs ships it (the default where GEMV_TMA_WHERE says)
GEMV_TMA_AOT = (GemvConfig(8, 512, 4, tma_ring=GEMV_TMA_RING), GemvConfig(16, 512, 4, tma_ring=GEMV_TMA_RING))
# the persistent down launch as gemv_configs ships it (GEMV_TMA_PERSISTENT_DOWN_WHERE; the program count is a
# launch choice, not compiled in)
GEMV_TMA_PERSISTENT_DOWN_AOT = GemvConfig(16, 512, 4, tma_ring=GEMV_TMA_RING, persistent_programs_per_sm=8)
# the fp16 pair decode at the same tiles (GemvConfig.f16)
GEMV_TMA_F16_AOT = tuple(dataclasses.replace(c, f16=True) for c in GEMV_TMA_AOT)
GEMV_TMA_F16_PERSISTENT_DOWN_AOT = dataclasses.replace(GEMV_TMA_PERSISTENT_DOWN_AOT, f16=True)
# every fp16 tile GEMV_TMA_F16_WHERE ships: (kind, config)
GEMV_TMA_F16_SHIPPED_AOT = sorted({("gate_up", gu) for gu, _ in GEMV_TMA_F16_WHERE.values()}
                                  | {("down", dn) for _, dn in GEMV_TMA_F16_WHERE.values()}, key=lambda kc: (kc[0], kc[1].label()))


def _aot_pdl(cfg) -> dict:
    """PDL constexprs of the AOT config of GemvConfig ``cfg``."""
    return {"PDL": cfg.pdl, "PDL_LATE": cfg.pdl and cfg.pdl_late}


def aot_configs() -> list[AotConfig]:
    configs = []
    seen = set()
    shapes = [(rows, MOE_INTERMEDIATE_SIZE // tp) for tp in SUPPORTED_TP for rows in (TOP_K, DECODE_MAX_ROWS + 1)]
    tags = {"dot_scaled": "ds", "regs": "regs", "split_f32": "splitf32", "split_bf16": "splitbf16"}
    for upcast in UPCASTS:
        for rows, inter in shapes:
            phase = "decode" if rows <= DECODE_MAX_ROWS else "prefill"
            shipped = upcast == default_gemm_upcast(rows, inter)
            if phase == "prefill" and not shipped:
                continue  # the alternatives are only measured at decode sizes
            for kind, pick, kernel, sig in (("gate_up", gate_up_config, _gate_up_kernel, _gate_up_sig),
                                            ("down", down_config, _down_kernel, _down_sig)):
                cfg = pick(rows, inter)
                if (kind, cfg, upcast) in seen:
                    continue
                seen.add((kind, cfg, upcast))
                constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                              "ACT_MXFP8": False, "DOT_SCALED": upcast == "dot_scaled",
                              "SPLIT_NIBBLES": _SPLIT_NIBBLES.get(upcast, 0), "TOP_K": TOP_K, "SPLIT_K": 1}
                constexprs["ZERO_OUT" if kind == "gate_up" else "ATOMIC_OUT"] = False
                configs.append(AotConfig(
                    name=f"moe_mxfp4_{kind}_{phase}_{tags[upcast]}_m{cfg.block_m}n{cfg.block_n}k{cfg.block_k}",
                    kernel=kernel, signature=sig(False), constexprs=constexprs, num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages, div16=("hidden", "inter"), expect_opcodes=("HMMA.16816.F32.BF16",)))
    for kind, pick, kernel, sig in (("gate_up", gate_up_config, _gate_up_kernel, _gate_up_sig),
                                    ("down", down_config, _down_kernel, _down_sig)):
        cfg = pick(DECODE_MAX_ROWS + 1, MOE_INTERMEDIATE_SIZE, True)
        constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                      "ACT_MXFP8": True, "DOT_SCALED": False, "SPLIT_NIBBLES": 0, "TOP_K": TOP_K, "SPLIT_K": 1}
        constexprs["ZERO_OUT" if kind == "gate_up" else "ATOMIC_OUT"] = False
        configs.append(AotConfig(
            name=f"moe_mxfp4_{kind}_prefill_mxfp8", kernel=kernel, signature=sig(True), constexprs=constexprs,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, div16=("hidden", "inter"),
            expect_opcodes=("QMMA.SF",), note="compared alternative (MXFP8 activations), not dispatched"))
    # split-K decode: the defaults (default_split_k) and, at B=1, the "auto" choice of an sm_120 part:
    # partials + ticket in gate/up, atomic top-k sum in down, the bf16 cast
    candidates = []
    for tp in SUPPORTED_TP:
        inter = MOE_INTERMEDIATE_SIZE // tp
        candidates.append((TOP_K, inter, split_k_choice(TOP_K, HIDDEN_SIZE, inter, AOT_SM_COUNT)))
        for where_inter, min_rows, max_rows in SPLIT_K_DEFAULT_WHERE:
            if where_inter == inter:
                candidates.append((max_rows, inter, default_split_k(max_rows, inter)))
    for rows, inter, splits in candidates:
        upcast = split_k_upcast(default_gemm_upcast(rows, inter))
        for kind, pick, kernel, sig, split in (("gate_up", gate_up_config, _gate_up_kernel, _gate_up_sig, splits[0]),
                                               ("down", down_config, _down_kernel, _down_sig, splits[1])):
            cfg = pick(rows, inter)
            if split == 1 or (kind, cfg, upcast, split) in seen:
                continue
            seen.add((kind, cfg, upcast, split))
            constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                          "ACT_MXFP8": False, "DOT_SCALED": upcast == "dot_scaled",
                          "SPLIT_NIBBLES": _SPLIT_NIBBLES.get(upcast, 0), "TOP_K": TOP_K, "SPLIT_K": split}
            constexprs["ZERO_OUT" if kind == "gate_up" else "ATOMIC_OUT"] = True
            configs.append(AotConfig(
                name=f"moe_mxfp4_{kind}_decode_{tags[upcast]}_m{cfg.block_m}n{cfg.block_n}k{cfg.block_k}_splitk{split}",
                kernel=kernel, signature=sig(False), constexprs=constexprs, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages, div16=("hidden", "inter"), expect_opcodes=("HMMA.16816.F32.BF16",)))
    # CUDA-core GEMV decode at every per-rank I: the default tiles (one routed row per weight pass), their
    # two-row form and GEMV_AOT_EXTRA (selectable through ``configs``); no tensor-core opcode, the weights
    # stream in 16-byte loads (tests/kernels/test_moe_mxfp4_aot.py asserts those)
    for tp in SUPPORTED_TP:
        inter = MOE_INTERMEDIATE_SIZE // tp
        gu, dn = gemv_configs(TOP_K, inter, tma=False)  # the plain kernels (TMA forms below)
        gu_more, dn_more = gemv_configs(TOP_K + 1, inter, tma=False)
        forms = [(gu, dn), (gu_more, dn_more),
                 (dataclasses.replace(gu_more, two_rows=True), dataclasses.replace(dn_more, two_rows=True))]
        forms += [(extra, extra) for extra in GEMV_AOT_EXTRA]
        forms += [(dataclasses.replace(a, x_f32=True), dataclasses.replace(b, x_f32=True))
                  for a, b in ((gu, dn), (gu_more, dn_more))]
        for gu_form, dn_form in forms:
            for kind, kernel, sig, cfg, k_len in (("gate_up", _gate_up_gemv_kernel, _gate_up_gemv_sig(gu_form.x_f32),
                                                   gu_form, HIDDEN_SIZE),
                                                  ("down", _down_gemv_kernel, _down_gemv_sig(dn_form.x_f32), dn_form,
                                                   inter)):
                block_k = min(cfg.block_k, k_len // cfg.split_k)
                if (k_len // cfg.split_k) % block_k or (kind == "gate_up" and inter % cfg.block_n):
                    continue
                cfg = dataclasses.replace(cfg, block_k=block_k)
                if (kind, GEMV, cfg) in seen:
                    continue
                seen.add((kind, GEMV, cfg))
                constexprs = {"BLOCK_N": cfg.block_n, "BLOCK_K": block_k, "TWO_ROWS": cfg.two_rows,
                              "SPLIT_K": cfg.split_k, "PREFETCH": cfg.prefetch, "X_F32": cfg.x_f32}
                if kind == "gate_up":
                    constexprs["TOP_K"] = TOP_K
                shipped = (gu_form, dn_form) in ((gu, dn), (gu_more, dn_more)) or gu_form.x_f32
                configs.append(AotConfig(
                    name=f"moe_mxfp4_{kind}_gemv_{cfg.label()}", kernel=kernel, signature=sig, constexprs=constexprs,
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages or 1, div16=("hidden", "inter"),
                    forbid_opcodes=TENSOR_CORE_OPCODES,
                    note="CUDA-core GEMV decode" + ("" if shipped else " (selectable, not a default)")))
    # TMA GEMV (T = 1, 2 and 4: K >= 512 on both launches; the same kernels at each)
    for kind, kernel, cfg in (("gate_up", _gate_up_gemv_tma_kernel, GEMV_TMA_AOT[0]),
                              ("down", _down_gemv_tma_kernel, GEMV_TMA_AOT[1])):
        rows = 2 * cfg.block_n if kind == "gate_up" else cfg.block_n
        constexprs = {"BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "RING": cfg.tma_ring}
        if kind == "gate_up":
            constexprs["TOP_K"] = TOP_K
        configs.append(AotConfig(
            name=f"moe_mxfp4_{kind}_gemvtma_{cfg.label()}", kernel=kernel,
            signature=_gemv_tma_sig(kind, rows, cfg.block_k), constexprs=constexprs, num_warps=cfg.num_warps,
            num_stages=cfg.tma_ring, div16=("hidden", "inter"), expect_opcodes=("UTMALDG",),
            forbid_opcodes=TENSOR_CORE_OPCODES, note="CUDA-core GEMV decode, operands by TMA (the default at T=1/2 B<=16, T=4 B<=8)"))
    # persistent TMA GEMV down launch (the default at T=4 B<=8)
    cfg = GEMV_TMA_PERSISTENT_DOWN_AOT
    configs.append(AotConfig(
        name=f"moe_mxfp4_down_gemvtma_{cfg.label()}", kernel=_down_gemv_tma_persistent_kernel,
        signature=_gemv_tma_persistent_sig("down", cfg.block_n, cfg.block_k),
        constexprs={"BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "RING": cfg.tma_ring}, num_warps=cfg.num_warps,
        num_stages=cfg.tma_ring, div16=("hidden", "inter"), expect_opcodes=("UTMALDG",),
        forbid_opcodes=TENSOR_CORE_OPCODES,
        note="CUDA-core GEMV decode, operands by TMA, persistent grid (the down launch at T=4 B<=8)"))
    # the fp16 pair decode of the TMA GEMV (GemvConfig.f16): its routing + x preparation launch (at B <= 16 and at the
    # largest B of GEMV_TMA_F16_WHERE: BLOCK_ROWS 128 / 256), HFMA2 on the weights
    for block_rows, pdl, small in ((triton.next_power_of_2(16 * TOP_K), False, False),
                                   (triton.next_power_of_2(F16_MAX_BATCH * TOP_K), False, False),
                                   (triton.next_power_of_2(16 * TOP_K), True, False),
                                   (ROUTE_SMALL_MAX_ROWS, True, True)):  # B <= 2: the pairwise routing
        configs.append(AotConfig(
            name="moe_mxfp4_route_x_f16" + ("" if block_rows == 128 else f"_r{block_rows}") + ("_pdl" if pdl else "")
            + ("_small" if small else ""),
            kernel=_route_x_f16_kernel,
            signature={"topk_ids_ptr": "*i32", "num_rows": "i32", "sorted_rows_ptr": "*i32", "expert_start_ptr": "*i32",
                       "active_experts_ptr": "*i32", "num_active_ptr": "*i32", "x_ptr": "*bf16", "x16_ptr": "*fp16",
                       "x_unscale_ptr": "*fp32", "hidden": "i32", "NUM_EXPERTS": "constexpr", "BLOCK_ROWS": "constexpr",
                       "NUM_BINS": "constexpr", "BLOCK_H": "constexpr", "ROUTE": "constexpr", "PDL": "constexpr",
                       "PDL_LATE": "constexpr", "SMALL_ROUTE": "constexpr"},
            constexprs={"NUM_EXPERTS": NUM_EXPERTS, "BLOCK_ROWS": block_rows,
                        "NUM_BINS": triton.next_power_of_2(NUM_EXPERTS + 1), "BLOCK_H": HIDDEN_SIZE, "ROUTE": True,
                        "PDL": pdl, "PDL_LATE": False, "SMALL_ROUTE": small},
            num_warps=4, div16=("hidden",), expect_opcodes=PDL_OPCODES if pdl else (),
            note="routing + x as scaled fp16 pairs (the fp16 TMA GEMV's first launch)" + (", PDL" if pdl else "")))
    f16_forms = {("gate_up", GEMV_TMA_F16_AOT[0]), ("down", GEMV_TMA_F16_AOT[1]), ("down", GEMV_TMA_F16_PERSISTENT_DOWN_AOT)}
    f16_forms |= set(GEMV_TMA_F16_SHIPPED_AOT)
    for kind, cfg in sorted(f16_forms, key=lambda kc: (kc[0], kc[1].label())):
        persistent = cfg.persistent_programs_per_sm > 0
        kernel = (_gate_up_gemv_tma_f16_kernel if kind == "gate_up" else
                  _down_gemv_tma_persistent_f16_kernel if persistent else _down_gemv_tma_f16_kernel)
        rows = 2 * cfg.block_n if kind == "gate_up" else cfg.block_n
        constexprs = {"BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "RING": cfg.tma_ring, "EMULATE": False,
                      **_aot_pdl(cfg)}
        if not persistent:
            constexprs.update(EARLY_TABLES=cfg.early_tables, NUM_EXPERTS=NUM_EXPERTS)
        if kind == "gate_up":
            constexprs["TOP_K"] = TOP_K
        else:
            constexprs["L2_PREFETCH"] = cfg.pdl_l2
            if not persistent:
                constexprs.update(W0_EARLY=bool(cfg.w0_early), W0_PLAIN=cfg.w0_early == "plain")
        configs.append(AotConfig(
            name=f"moe_mxfp4_{kind}_gemvtma_{cfg.label()}", kernel=kernel,
            signature=_gemv_tma_f16_sig(kind, rows, cfg.block_k, persistent), constexprs=constexprs,
            num_warps=cfg.num_warps, num_stages=cfg.tma_ring, div16=("hidden", "inter"),
            expect_opcodes=("UTMALDG", "HFMA2", "PRMT") + (PDL_OPCODES if cfg.pdl else ()),
            forbid_opcodes=TENSOR_CORE_OPCODES,
            note="CUDA-core GEMV, fp16 pair decode (pairs by bytes), operands by TMA (the default where "
                 "GEMV_TMA_F16_WHERE says)"))
    # tensor-core pairs decode at every per-rank I (selectable through upcast="pairs")
    for tp in SUPPORTED_TP:
        inter = MOE_INTERMEDIATE_SIZE // tp
        # both ends of the cp.async tiles' range (the TMA tiles below)
        shipped = (pairs_configs(TOP_K, inter, tma=False), pairs_configs(DECODE_MAX_ROWS, inter, tma=False))
        shipped_pairs = [dataclasses.replace(c, block_k=min(c.block_k, k))
                         for pair in shipped for c, k in zip(pair, (HIDDEN_SIZE, inter))]
        for gu_cfg, dn_cfg in shipped + PAIRS_AOT_EXTRA:
            for kind, kernel, sig, cfg, k_len in (("gate_up", _gate_up_pairs_kernel, _gate_up_pairs_sig(), gu_cfg,
                                                   HIDDEN_SIZE),
                                                  ("down", _down_pairs_kernel, _down_pairs_sig(), dn_cfg, inter)):
                block_k = min(cfg.block_k, k_len)
                if kind == "gate_up" and inter % cfg.block_n:
                    continue
                cfg = dataclasses.replace(cfg, block_k=block_k)
                if (kind, PAIRS, cfg) in seen:
                    continue
                seen.add((kind, PAIRS, cfg))
                constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": block_k,
                              "MUL_PAIRS": cfg.mul_pairs,
                              "SCALE_BF16": 3 if cfg.scale_on_words else int(cfg.scale_bf16)}
                if kind == "gate_up":
                    constexprs["TOP_K"] = TOP_K
                configs.append(AotConfig(
                    name=f"moe_mxfp4_{kind}_pairs_{cfg.label()}",
                    kernel=kernel, signature=sig, constexprs=constexprs, num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages, div16=("hidden", "inter"), expect_opcodes=("HMMA.16816.F32.BF16",),
                    note="tensor-core pairs decode" + ("" if cfg in shipped_pairs else " (selectable, not a default)")))
    # TMA-fed swap-AB pairs decode (the default where PAIRS_TMA_WHERE says; one config serves every I), and its
    # gate/up launch with natural-order SwiGLU rows for the TMA GEMV down launch (PAIRS_GEMV_DOWN_WHERE)
    rows_tiles = {cfg: kind for tiles in {t for *_, t in PAIRS_TMA_ROWS_WHERE}
                  for kind, cfg in zip(("gate_up", "down"), tiles)}
    for kind, kernel, cfg, natural in (("gate_up", _gate_up_pairs_tma_kernel, PAIRS_TMA_TILES[0], False),
                                       ("down", _down_pairs_tma_kernel, PAIRS_TMA_TILES[1], False),
                                       ("gate_up", _gate_up_pairs_tma_kernel, PAIRS_TMA_TILES[0], True),
                                       *((kind, _gate_up_pairs_tma_kernel if kind == "gate_up"
                                          else _down_pairs_tma_kernel, cfg, False)
                                         for cfg, kind in sorted(rows_tiles.items(), key=lambda t: t[0].label()))):
        constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                      "MUL_PAIRS": cfg.mul_pairs, "SCALE_BF16": 3, "RING": cfg.tma_ring, "SUB_K": cfg.mma_k(cfg.block_k)}
        if kind == "gate_up":
            constexprs["TOP_K"] = TOP_K
            constexprs["NATURAL_ACT"] = natural
        configs.append(AotConfig(
            name=f"moe_mxfp4_{kind}_pairs_{cfg.label()}" + ("_natural" if natural else ""), kernel=kernel,
            signature=_pairs_tma_sig(kind, 2 * cfg.block_n if kind == "gate_up" else cfg.block_n, cfg.block_k,
                                     cfg.mma_k(cfg.block_k)),
            constexprs=constexprs, num_warps=cfg.num_warps, num_stages=cfg.tma_ring, div16=("hidden", "inter"),
            expect_opcodes=("HMMA.16816.F32.BF16", "UTMALDG"),
            note=("swap-AB gate/up, natural-order SwiGLU rows for the TMA GEMV down (the default at T=1 B=2, 5..6, "
                  "T=4 B=4..6, 8)" if natural else
                  f"swap-AB {kind}, {cfg.block_m} routed rows per pass, 32 weight rows per warp, MMAs of {cfg.sub_k} "
                  "(the tiles of PAIRS_TMA_ROWS_WHERE: T=1 B=12..640, T=4 B=16..640)" if cfg in rows_tiles else
                  "swap-AB pairs decode, weights by TMA (pairs_configs' tiles at T=1 B=4..15, where the fp16 TMA GEMV "
                  "is the default)")))
    # the register caps of compute capability 9 (PAIRS_REGISTER_CAPS): compiled for sm_90a only, where they ship
    for (inter, cfg), cap in PAIRS_REGISTER_CAPS.items():
        base = next(c for c in configs if c.name in (f"moe_mxfp4_gate_up_pairs_{cfg.label()}",
                                                      f"moe_mxfp4_down_pairs_{cfg.label()}"))
        capped = dataclasses.replace(cfg, max_registers=cap)
        configs.append(dataclasses.replace(
            base, name=base.name.replace(cfg.label(), capped.label()), max_registers=cap,
            archs=(PAIRS_REGISTER_CAPS_MEASURED_CAPABILITY * 10,),
            note=f"{base.note}; capped at {cap} registers at I = {inter} on compute capability "
                 f"{PAIRS_REGISTER_CAPS_MEASURED_CAPABILITY} only (PAIRS_REGISTER_CAPS)"))
    configs.append(AotConfig(
        name="moe_mxfp4_route_pairs", kernel=_route_pairs_kernel,
        signature={"topk_ids_ptr": "*i32", "num_rows": "i32", "sorted_rows_ptr": "*i32",
                   "expert_start_ptr": "*i32", "active_experts_ptr": "*i32", "num_active_ptr": "*i32",
                   "x_ptr": "*bf16", "x_pairs_ptr": "*bf16", "x_numel": "i32", "NUM_EXPERTS": "constexpr",
                   "BLOCK_ROWS": "constexpr", "NUM_BINS": "constexpr", "BLOCK_X": "constexpr"},
        constexprs={"NUM_EXPERTS": NUM_EXPERTS, "BLOCK_ROWS": 512, "NUM_BINS": 512, "BLOCK_X": PAIRS_X_BLOCK},
        num_warps=4, div16=("x_numel",), note="routing + x -> bf16 pair order (pairs decode)"))
    block_rows = triton.next_power_of_2(PAIRS_MAX_ROWS)  # the pairs decode's largest one-program sort
    configs.append(dataclasses.replace(
        configs[-1], name=f"moe_mxfp4_route_pairs{block_rows}", constexprs={**configs[-1].constexprs,
                                                                               "BLOCK_ROWS": block_rows},
        note=f"routing + x -> bf16 pair order (pairs decode up to PAIRS_MAX_ROWS = {PAIRS_MAX_ROWS} routed rows)"))
    configs.append(AotConfig(
        name="moe_mxfp4_route_x_f32", kernel=_route_x_f32_kernel,
        signature={"topk_ids_ptr": "*i32", "num_rows": "i32", "sorted_rows_ptr": "*i32",
                   "expert_start_ptr": "*i32", "active_experts_ptr": "*i32", "num_active_ptr": "*i32",
                   "x_ptr": "*bf16", "x_f32_ptr": "*fp32", "x_numel": "i32", "NUM_EXPERTS": "constexpr",
                   "BLOCK_ROWS": "constexpr", "NUM_BINS": "constexpr", "BLOCK_X": "constexpr", "ROUTE": "constexpr"},
        constexprs={"NUM_EXPERTS": NUM_EXPERTS, "BLOCK_ROWS": 512, "NUM_BINS": 512, "BLOCK_X": GEMV_X_BLOCK,
                    "ROUTE": True},
        num_warps=4, div16=("x_numel",), note="routing + x -> float32 word-pair order (x_f32 GEMV)"))
    configs.append(AotConfig(
        name="moe_mxfp4_to_bf16", kernel=_to_bf16_kernel,
        signature={"src_ptr": "*fp32", "dst_ptr": "*bf16", "numel": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": TOPK_SUM_BLOCK}, num_warps=4))
    configs.append(AotConfig(
        name="moe_mxfp4_route", kernel=_route_kernel,
        signature={"topk_ids_ptr": "*i32", "num_rows": "i32", "sorted_rows_ptr": "*i32",
                   "expert_start_ptr": "*i32", "active_experts_ptr": "*i32", "num_active_ptr": "*i32",
                   "NUM_EXPERTS": "constexpr", "BLOCK_ROWS": "constexpr", "NUM_BINS": "constexpr"},
        constexprs={"NUM_EXPERTS": NUM_EXPERTS, "BLOCK_ROWS": 2048, "NUM_BINS": 512}, num_warps=4))
    for splits, name, div16, note, pdl, early in (
            (1, "moe_mxfp4_topk_sum", ("hidden",), "", False, False),
            (1, "moe_mxfp4_topk_sum_pdl", ("hidden",), "top-k sum of the fp16 TMA GEMV with PDL (GEMV_PDL_WHERE)",
             True, False),
            (1, "moe_mxfp4_topk_sum_pdl_et", ("hidden",),
             "top-k sum of the fp16 TMA GEMV with PDL and early_tables (EARLY_TABLES_AT)", True, True),
            (2, "moe_mxfp4_topk_sum_splits2", ("hidden", "split_stride"), "top-k sum of a GEMV down with 2 K splits",
             False, False)):
        configs.append(AotConfig(
            name=name, kernel=_topk_sum_kernel,
            signature={"y_ptr": "*fp32", "topk_ids_ptr": "*i32", "out_ptr": "*bf16", "hidden": "i32",
                       "split_stride": "i32", "NUM_EXPERTS": "constexpr", "TOP_K": "constexpr",
                       "BLOCK_H": "constexpr", "SPLITS": "constexpr", "PDL": "constexpr", "PDL_LATE": "constexpr",
                       "EARLY_TABLES": "constexpr"},
            constexprs={"NUM_EXPERTS": NUM_EXPERTS, "TOP_K": TOP_K, "BLOCK_H": TOPK_SUM_BLOCK, "SPLITS": splits,
                        "PDL": pdl, "PDL_LATE": False, "EARLY_TABLES": early},
            num_warps=4, div16=div16, note=note, expect_opcodes=PDL_OPCODES if pdl else ()))
    return configs


__all__ = [
    "FORWARD_UPCASTS", "GEMV", "GEMV_DEFAULT_WHERE", "PAIRS", "PAIRS_DEFAULT_WHERE", "PREFILL", "PairsConfig",
    "pairs_configs",
    "pairs_launches", "GEMV_X_F32_WHERE", "GEMV_LAUNCH_NAMES", "GemvConfig", "gemv_launches", "LAUNCHES_PER_FORWARD", "UPCASTS", "aot_configs",
    "PAIRS_EXACT_SCALE_BYTES", "pairs_exact_for", "scale_byte_range",
    "default_gemm_upcast", "default_upcast", "gemv_configs", "dequant_nibbles", "moe_mxfp4_forward", "quantize_mxfp8",
    "reference_dequant_mxfp4", "reference_moe_mxfp4", "reference_moe_mxfp8_act", "reference_swiglu",
    "repack_w13_", "route", "scale_bytes", "touched_expert_bytes", "unpack_w13_", "use_dot_scaled",
]
