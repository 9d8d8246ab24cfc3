"""Fused Triton kernels for the decode-step stages the plugin does not replace (RMSNorm with an
optional fused residual add, the DSv4 router, the shared expert's clamped SwiGLU, the residual
combine).

Why: ``sglang-sm120 bench`` runs these stages with the same code in both paths. As unfused torch
(5-6 launches per RMSNorm, ~8 per router) they cost about as much as the plugin's kernels at B=1,
whereas SGLang runs them as a handful of fused JIT kernels. One launch per stage here keeps the
bench's absolute step times representative. They are not seams: SGLang keeps its own kernels.

Semantics (each ``reference_*`` is the float32 specification):

* ``rms_norm(x, weight, residual)``: ``h = x (+ residual)`` in fp32, ``h * rsqrt(mean(h^2) + eps)``
  (``* weight``), rounded to bf16 once. ``x``/``residual`` ``[M, N]`` bf16 (last dim contiguous,
  any row stride), ``weight [N]`` bf16 or None.
* ``route(logits, bias, top_k, scale)``: DSv4's noaux_tc router with sqrtsoftplus scoring:
  ``s = sqrt(softplus(logits))``; ids = the ``top_k`` largest ``s + bias`` (ties: the lower expert
  index first, i.e. a stable descending sort; ``torch.topk`` leaves ties unspecified); weights
  ``s[ids] / sum(s[ids]) * scale``. ``logits [M, E]`` fp32 or bf16 (the gate GEMM's output),
  ``bias [E]`` fp32 -> ids ``[M, k]`` int32 in descending order of ``s + bias``, weights ``[M, k]``
  fp32. One program per token. Inputs are assumed finite (NaN logits are not handled).
* ``swiglu(gate_up, limit)``: ``gate_up [M, 2I]`` bf16 = ``[gate | up]``;
  ``silu(min(gate, limit)) * clamp(up, -limit, limit)`` -> ``[M, I]`` bf16.
* ``combine(x, a, b, c)``: ``x + a + b + c`` in fp32, rounded once to bf16 (``[M, N]`` bf16 each).
* ``index_q_quant(q, weights, weight_scale)``: the C4 indexer's query quantisation as SGLang's fused JIT kernel
  (``fused_q_indexer_rope_hadamard_quant``, sglang/kernels/jit/csrc/deepseek_v4/main_norm_rope.cuh) does it, less
  the RoPE and the Hadamard rotation, which the bench does not model: per (token, head) row of ``q [M, H, D]``
  bf16, ``scale = max(amax, INDEX_Q_AMAX_FLOOR) / 448``, ``q_fp8 = e4m3(q / scale)`` (nearest-even) and
  ``weights_out = weights * weight_scale * scale`` fp32 (``weights [M, H]`` bf16, the weights projection).

All are CUDA-graph capturable (outputs sized by shapes only, no host syncs).

Programmatic dependent launch: on GPUs that have it (compute capability >= 9.0, ``pdl.pdl_supported``)
every kernel launches with ``launch_pdl=True`` unless the caller passes ``pdl=False``, because the fused
kernels SGLang runs for these stages are PDL kernels there (sm_90+, sm_120 included): sgl_kernel's
rmsnorm / fused_add_rmsnorm call FlashInfer's norm with ``enable_pdl=is_arch_support_pdl()``
(sgl_kernel/elementwise.py, utils.py), and SGLang's JIT silu_and_mul_clamp takes the same flag
(sglang/kernels/ops/activation/silu_and_mul_clamp.py). As FlashInfer's norm kernels do
(flashinfer/include/flashinfer/norm.cuh: ``griddepcontrol.wait`` at the start, ``launch_dependents``
after the stores), each kernel here waits before it reads the previous kernel's output or stores, and
lets its dependents launch after its stores. The norm weight and the router bias are read before the
wait: they are model constants, never written by the kernel just before (callers that write them in
the same stream must pass ``pdl=False``). The outputs are the same bit for bit either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dsv4 import (HEAD_DIM, HIDDEN_SIZE, INDEX_HEAD_DIM, INDEX_N_HEADS, INDEX_Q_AMAX_FLOOR, NUM_EXPERTS, Q_LORA_RANK,
                   RMS_NORM_EPS, SOFTPLUS_THRESHOLD, TOP_K)
from .fp8_gemv import FP8_MAX
from .harness.aot import AotConfig
from .pdl import PDL_OPCODES, pdl_launch_dependents, pdl_supported, pdl_wait

# elements per program of the elementwise kernels (SwiGLU, combine): 16-byte bf16 accesses
ELEMENTWISE_BLOCK = 1024
ELEMENTWISE_WARPS = 4
INDEX_Q_QUANT_WARPS = 8  # one program per token: 64 heads x 128 dims, 32 values per thread


def _check(cond: bool, name: str, expected: str, got) -> None:
    if not cond:
        raise ValueError(f"{name}: expected {expected}, got {got}")


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{tuple(t.shape)} {t.dtype} on {t.device} strides {t.stride()}"


def _check_rows(t, name: str, dtype: torch.dtype, device=None, shape=None) -> None:
    _check(isinstance(t, torch.Tensor) and t.dim() == 2 and t.dtype == dtype
           and (t.shape[1] <= 1 or t.stride(1) == 1) and (device is None or t.device == device)
           and (shape is None or tuple(t.shape) == tuple(shape)),
           name, f"a 2-D {dtype} tensor{'' if shape is None else f' of shape {tuple(shape)}'}"
           f"{'' if device is None else f' on {device}'} with a contiguous last dim", _describe(t))


def _bf16_out(out, shape, device) -> torch.Tensor:
    """``out`` checked as a bf16 ``shape`` tensor on ``device``, or a new one when it is None."""
    if out is None:
        return torch.empty(shape, dtype=torch.bfloat16, device=device)
    _check_rows(out, "out", torch.bfloat16, device, shape)
    return out


def launch_with_pdl(device: torch.device, pdl: bool) -> bool:
    """Whether a launch on ``device`` uses programmatic dependent launch: asked for (``pdl``) and supported
    there (a CUDA device of compute capability >= 9.0; never on the CPU or under the interpreter)."""
    return bool(pdl) and pdl_supported(device)


def _norm_warps(block_n: int) -> int:
    # 8 bf16 (16 bytes) per thread and access for widths up to 2048, at most 8 warps
    return max(1, min(8, block_n // 256))


# --- RMSNorm ----------------------------------------------------------------------------------

@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, N, stride_xm, stride_rm, stride_ym, eps,
                     BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                     PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < N
    if HAS_WEIGHT:  # a model constant: read before the PDL wait, while the previous kernel drains
        weight = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    h = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        h += tl.load(r_ptr + row * stride_rm + offs, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / N + eps)
    y = h * inv
    if HAS_WEIGHT:
        y = y * weight
    tl.store(y_ptr + row * stride_ym + offs, y.to(tl.bfloat16), mask=mask)
    pdl_launch_dependents(PDL)


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                       eps: float = RMS_NORM_EPS) -> torch.Tensor:
    """float32 ``[M, N]``: RMSNorm of ``x (+ residual)`` (``* weight``), before the bf16 rounding."""
    h = x.float() if residual is None else x.float() + residual.float()
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, residual: torch.Tensor | None = None,
             eps: float = RMS_NORM_EPS, out: torch.Tensor | None = None, pdl: bool = True) -> torch.Tensor:
    """bf16 ``[M, N]`` RMSNorm of ``x`` (plus ``residual``, added in fp32), one launch (PDL where supported
    unless ``pdl=False``)."""
    _check_rows(x, "x", torch.bfloat16)
    m, n = x.shape
    _check(n > 0, "x", "a non-empty last dim", _describe(x))
    if residual is not None:
        _check_rows(residual, "residual", torch.bfloat16, x.device, (m, n))
    if weight is not None:
        _check(isinstance(weight, torch.Tensor) and weight.shape == (n,) and weight.dtype == torch.bfloat16
               and weight.device == x.device and weight.is_contiguous(),
               "weight", f"a contiguous ({n},) bfloat16 tensor on {x.device}", _describe(weight))
    out = _bf16_out(out, (m, n), x.device)
    if m == 0:
        return out
    block_n = triton.next_power_of_2(n)
    dummy = x
    use_pdl = launch_with_pdl(x.device, pdl)
    _rms_norm_kernel[(m,)](x, residual if residual is not None else dummy, weight if weight is not None else dummy,
                           out, n, x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
                           float(eps), BLOCK_N=block_n, HAS_RESIDUAL=residual is not None,
                           HAS_WEIGHT=weight is not None, PDL=use_pdl, num_warps=_norm_warps(block_n),
                           launch_pdl=use_pdl)
    return out


# --- router -----------------------------------------------------------------------------------

@triton.jit
def _softplus(x, THRESHOLD: tl.constexpr):
    # log1p(u) without log1p: log(1 + u) * u / ((1 + u) - 1) is accurate to a few ulp (Goldberg)
    # (exp of the clamped x and a safe denominator keep the untaken branches finite)
    u = tl.exp(tl.minimum(x, THRESHOLD))
    v = 1.0 + u
    log1p = tl.where(v == 1.0, u, tl.log(v) * (u / tl.where(v == 1.0, 1.0, v - 1.0)))
    return tl.where(x > THRESHOLD, x, log1p)


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, ids_ptr, w_ptr, E, stride_lm, stride_im, stride_wm, scale,
                  TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, THRESHOLD: tl.constexpr,
                  PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < E
    bias = tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # a model constant: before the wait
    pdl_wait(PDL)
    logits = tl.load(logits_ptr + row * stride_lm + offs, mask=mask, other=0.0).to(tl.float32)
    scores = tl.sqrt(_softplus(logits, THRESHOLD))
    biased = scores + bias
    biased = tl.where(mask, biased, float("-inf"))
    taken = offs < 0  # all False
    slot = tl.arange(0, BLOCK_K)
    picked_ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    picked_scores = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        best = tl.max(tl.where(taken, float("-inf"), biased), axis=0)
        # the lowest not-yet-taken index holding the maximum: deterministic ties
        idx = tl.min(tl.where((biased == best) & ~taken & mask, offs, BLOCK_E), axis=0)
        hit = offs == idx
        taken = taken | hit
        picked_ids = tl.where(slot == k, idx, picked_ids)
        picked_scores = tl.where(slot == k, tl.sum(tl.where(hit, scores, 0.0), axis=0), picked_scores)
    total = tl.sum(picked_scores, axis=0)  # unused slots hold 0
    keep = slot < TOP_K
    tl.store(ids_ptr + row * stride_im + slot, picked_ids, mask=keep)
    tl.store(w_ptr + row * stride_wm + slot, picked_scores / total * scale, mask=keep)
    pdl_launch_dependents(PDL)


def reference_route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scale: float):
    """(ids ``[M, k]`` int64, weights ``[M, k]`` float32): sqrtsoftplus scores, top-k of score + bias
    by a stable descending sort (ties: lower index first), renormalised and scaled."""
    scores = torch.sqrt(torch.nn.functional.softplus(logits.float(), threshold=SOFTPLUS_THRESHOLD))
    order = torch.sort(scores + bias.float(), dim=-1, descending=True, stable=True).indices
    ids = order[:, :top_k]
    w = scores.gather(1, ids)
    return ids, w / w.sum(-1, keepdim=True) * scale


def route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scale: float,
          out_ids: torch.Tensor | None = None, out_weights: torch.Tensor | None = None, pdl: bool = True):
    """(ids ``[M, top_k]`` int32, weights ``[M, top_k]`` float32), one launch (see module doc; PDL where
    supported unless ``pdl=False``)."""
    _check(isinstance(logits, torch.Tensor) and logits.dtype in (torch.float32, torch.bfloat16),
           "logits", "a float32 or bfloat16 tensor", _describe(logits))
    _check_rows(logits, "logits", logits.dtype)
    m, e = logits.shape
    _check(isinstance(bias, torch.Tensor) and bias.shape == (e,) and bias.dtype == torch.float32
           and bias.device == logits.device and bias.is_contiguous(),
           "bias", f"a contiguous ({e},) float32 tensor on {logits.device}", _describe(bias))
    _check(isinstance(top_k, int) and 0 < top_k <= e, "top_k", f"an int in [1, {e}]", top_k)
    if out_ids is None:
        out_ids = torch.empty(m, top_k, dtype=torch.int32, device=logits.device)
    else:
        _check_rows(out_ids, "out_ids", torch.int32, logits.device, (m, top_k))
    if out_weights is None:
        out_weights = torch.empty(m, top_k, dtype=torch.float32, device=logits.device)
    else:
        _check_rows(out_weights, "out_weights", torch.float32, logits.device, (m, top_k))
    if m == 0:
        return out_ids, out_weights
    block_e = triton.next_power_of_2(e)
    use_pdl = launch_with_pdl(logits.device, pdl)
    _route_kernel[(m,)](logits, bias, out_ids, out_weights, e, logits.stride(0), out_ids.stride(0),
                        out_weights.stride(0), float(scale), TOP_K=top_k, BLOCK_K=triton.next_power_of_2(top_k),
                        BLOCK_E=block_e,
                        THRESHOLD=SOFTPLUS_THRESHOLD, PDL=use_pdl, num_warps=4, launch_pdl=use_pdl)
    return out_ids, out_weights


# --- SwiGLU and combine -----------------------------------------------------------------------

@triton.jit
def _swiglu_kernel(gu_ptr, y_ptr, I, stride_gm, stride_ym, limit, BLOCK: tl.constexpr, HAS_LIMIT: tl.constexpr,
                   PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    pdl_wait(PDL)
    gate = tl.load(gu_ptr + row * stride_gm + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride_gm + I + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_LIMIT:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(y_ptr + row * stride_ym + offs, y.to(tl.bfloat16), mask=mask)
    pdl_launch_dependents(PDL)


def reference_swiglu(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """float32 ``[M, I]``: the clamped SwiGLU of ``[gate | up]`` (SGLang's swiglu_limit_func)."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    if limit > 0:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return torch.nn.functional.silu(gate) * up


def swiglu(gate_up: torch.Tensor, limit: float, out: torch.Tensor | None = None, pdl: bool = True) -> torch.Tensor:
    """bf16 ``[M, I]`` clamped SwiGLU of ``gate_up [M, 2I]`` bf16 (``limit <= 0``: no clamp), one launch (PDL
    where supported unless ``pdl=False``)."""
    _check_rows(gate_up, "gate_up", torch.bfloat16)
    m, two_i = gate_up.shape
    _check(two_i > 0 and two_i % 2 == 0, "gate_up", "an even, non-zero last dim [gate | up]", _describe(gate_up))
    inter = two_i // 2
    out = _bf16_out(out, (m, inter), gate_up.device)
    if m == 0:
        return out
    use_pdl = launch_with_pdl(gate_up.device, pdl)
    _swiglu_kernel[(m, triton.cdiv(inter, ELEMENTWISE_BLOCK))](
        gate_up, out, inter, gate_up.stride(0), out.stride(0), float(limit), BLOCK=ELEMENTWISE_BLOCK,
        HAS_LIMIT=limit > 0, PDL=use_pdl, num_warps=ELEMENTWISE_WARPS, launch_pdl=use_pdl)
    return out


@triton.jit
def _combine_kernel(x_ptr, a_ptr, b_ptr, c_ptr, y_ptr, N, stride_xm, stride_am, stride_bm, stride_cm, stride_ym,
                    BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    pdl_wait(PDL)
    y = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    y += tl.load(a_ptr + row * stride_am + offs, mask=mask, other=0.0).to(tl.float32)
    y += tl.load(b_ptr + row * stride_bm + offs, mask=mask, other=0.0).to(tl.float32)
    y += tl.load(c_ptr + row * stride_cm + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + offs, y.to(tl.bfloat16), mask=mask)
    pdl_launch_dependents(PDL)


def reference_combine(x, a, b, c) -> torch.Tensor:
    """float32 ``x + a + b + c`` (summed left to right in fp32)."""
    return x.float() + a.float() + b.float() + c.float()


def combine(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
            out: torch.Tensor | None = None, pdl: bool = True) -> torch.Tensor:
    """bf16 ``x + a + b + c`` (residual + attention + routed + shared expert), one launch (PDL where
    supported unless ``pdl=False``)."""
    _check_rows(x, "x", torch.bfloat16)
    m, n = x.shape
    for name, t in (("a", a), ("b", b), ("c", c)):
        _check_rows(t, name, torch.bfloat16, x.device, (m, n))
    out = _bf16_out(out, (m, n), x.device)
    if m == 0 or n == 0:
        return out
    use_pdl = launch_with_pdl(x.device, pdl)
    _combine_kernel[(m, triton.cdiv(n, ELEMENTWISE_BLOCK))](
        x, a, b, c, out, n, x.stride(0), a.stride(0), b.stride(0), c.stride(0), out.stride(0),
        BLOCK=ELEMENTWISE_BLOCK, PDL=use_pdl, num_warps=ELEMENTWISE_WARPS, launch_pdl=use_pdl)
    return out


# --- the C4 indexer's query quantisation ------------------------------------------------------

E4M3_MIN_NORMAL_EXP = tl.constexpr(-6)  # e4m3: normals from 2^-6, below that subnormals in steps of 2^-9
E4M3_MANTISSA_BITS = tl.constexpr(3)
ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: x + it - it rounds fp32 |x| < 2^22 to an integer, nearest-even


@triton.jit
def _e4m3_rtne(v):
    """fp32 ``v`` (|v| <= 448) -> e4m3 rounded to nearest-even, subnormals included: the value is first rounded on
    e4m3's grid in fp32 (its quantum a power of two, so the scaling is exact), then cast exactly (the interpreter's
    own fp32 -> e4m3 cast drops the rounding carry)."""
    exp = (v.to(tl.int32, bitcast=True) >> 23) & 0xFF
    quantum_exp = tl.maximum(exp, 127 + E4M3_MIN_NORMAL_EXP) - E4M3_MANTISSA_BITS
    quantum = (quantum_exp << 23).to(tl.float32, bitcast=True)
    return (((v / quantum) + ROUND_MAGIC) - ROUND_MAGIC) * quantum


@triton.jit
def _index_q_quant_kernel(q_ptr, w_ptr, qo_ptr, wo_ptr, H, D, stride_qm, stride_qh, stride_wm, stride_qom,
                          stride_qoh, stride_wom, weight_scale, amax_floor, BLOCK_H: tl.constexpr,
                          BLOCK_D: tl.constexpr, FP8_MAX: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    h_mask = heads < H
    mask = h_mask[:, None] & (dims[None, :] < D)
    pdl_wait(PDL)
    q = tl.load(q_ptr + row * stride_qm + heads[:, None] * stride_qh + dims[None, :], mask=mask,
                other=0.0).to(tl.float32)
    w = tl.load(w_ptr + row * stride_wm + heads, mask=h_mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(q), axis=1), amax_floor) / FP8_MAX
    q8 = _e4m3_rtne(q * (1.0 / scale)[:, None]).to(tl.float8e4nv)
    tl.store(qo_ptr + row * stride_qom + heads[:, None] * stride_qoh + dims[None, :], q8, mask=mask)
    tl.store(wo_ptr + row * stride_wom + heads, w * weight_scale * scale, mask=h_mask)
    pdl_launch_dependents(PDL)


def reference_index_q_quant(q: torch.Tensor, weights: torch.Tensor, weight_scale: float):
    """float32 specification: (``q / scale`` before the e4m3 rounding ``[M, H, D]``, the per-row ``scale [M, H]``,
    ``weights_out [M, H]``)."""
    qf = q.float()
    scale = qf.abs().amax(-1).clamp_min(INDEX_Q_AMAX_FLOOR) / FP8_MAX
    return qf * (1.0 / scale)[..., None], scale, weights.float() * weight_scale * scale


def index_q_quant(q: torch.Tensor, weights: torch.Tensor, weight_scale: float, pdl: bool = True):
    """(``q_fp8 [M, H, D]`` e4m3, ``weights_out [M, H]`` fp32) from the indexer's query ``q [M, H, D]`` bf16 and the
    weights projection ``weights [M, H]`` bf16, one launch (PDL where supported unless ``pdl=False``)."""
    _check(isinstance(q, torch.Tensor) and q.dim() == 3 and q.dtype == torch.bfloat16 and q.stride(2) == 1,
           "q", "a 3-D [M, H, D] bfloat16 tensor with a contiguous last dim", _describe(q))
    m, h, d = q.shape
    _check(h > 0 and d > 0, "q", "non-empty heads and head dim", _describe(q))
    _check_rows(weights, "weights", torch.bfloat16, q.device, (m, h))
    q_fp8 = torch.empty((m, h, d), dtype=torch.float8_e4m3fn, device=q.device)
    weights_out = torch.empty((m, h), dtype=torch.float32, device=q.device)
    if m == 0:
        return q_fp8, weights_out
    use_pdl = launch_with_pdl(q.device, pdl)
    _index_q_quant_kernel[(m,)](
        q, weights, q_fp8, weights_out, h, d, q.stride(0), q.stride(1), weights.stride(0), q_fp8.stride(0),
        q_fp8.stride(1), weights_out.stride(0), float(weight_scale), float(INDEX_Q_AMAX_FLOOR),
        BLOCK_H=triton.next_power_of_2(h), BLOCK_D=triton.next_power_of_2(d), FP8_MAX=FP8_MAX, PDL=use_pdl,
        num_warps=INDEX_Q_QUANT_WARPS, launch_pdl=use_pdl)
    return q_fp8, weights_out


# --- AOT --------------------------------------------------------------------------------------

def aot_configs() -> list[AotConfig]:
    """The configs the bench launches on sm_120 (a PDL GPU: every one with PDL, so the griddepcontrol pair,
    PREEXIT and ACQBULK, must be in the SASS)."""
    configs = []
    norm_sig = {"x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "N": "i32",
                "stride_xm": "i32", "stride_rm": "i32", "stride_ym": "i32", "eps": "fp32",
                "BLOCK_N": "constexpr", "HAS_RESIDUAL": "constexpr", "HAS_WEIGHT": "constexpr", "PDL": "constexpr"}
    # (width, residual, weight) as the bench launches them: input / post-attention / q / per-head q norms
    for n, residual, weight in ((HIDDEN_SIZE, False, True), (HIDDEN_SIZE, True, True), (Q_LORA_RANK, False, True),
                                (HEAD_DIM, False, False)):
        block_n = triton.next_power_of_2(n)
        configs.append(AotConfig(
            name=f"rms_norm_{n}{'_residual' if residual else ''}{'' if weight else '_noweight'}",
            kernel=_rms_norm_kernel, signature=norm_sig,
            constexprs={"BLOCK_N": block_n, "HAS_RESIDUAL": residual, "HAS_WEIGHT": weight, "PDL": True},
            num_warps=_norm_warps(block_n), num_stages=1,
            div16=("N", "stride_xm", "stride_rm", "stride_ym"), expect_opcodes=PDL_OPCODES))
    for logits_type in ("fp32", "bf16"):
        configs.append(AotConfig(
            name=f"route_sqrtsoftplus_{NUM_EXPERTS}_top{TOP_K}_{logits_type}", kernel=_route_kernel,
            signature={"logits_ptr": f"*{logits_type}", "bias_ptr": "*fp32", "ids_ptr": "*i32", "w_ptr": "*fp32",
                       "E": "i32", "stride_lm": "i32", "stride_im": "i32", "stride_wm": "i32", "scale": "fp32",
                       "TOP_K": "constexpr", "BLOCK_K": "constexpr", "BLOCK_E": "constexpr", "THRESHOLD": "constexpr",
                       "PDL": "constexpr"},
            constexprs={"TOP_K": TOP_K, "BLOCK_K": triton.next_power_of_2(TOP_K),
                        "BLOCK_E": triton.next_power_of_2(NUM_EXPERTS), "THRESHOLD": SOFTPLUS_THRESHOLD, "PDL": True},
            num_warps=4, num_stages=1, div16=("E", "stride_lm"), expect_opcodes=PDL_OPCODES))
    configs.append(AotConfig(
        name="swiglu_clamped", kernel=_swiglu_kernel,
        signature={"gu_ptr": "*bf16", "y_ptr": "*bf16", "I": "i32", "stride_gm": "i32", "stride_ym": "i32",
                   "limit": "fp32", "BLOCK": "constexpr", "HAS_LIMIT": "constexpr", "PDL": "constexpr"},
        constexprs={"BLOCK": ELEMENTWISE_BLOCK, "HAS_LIMIT": True, "PDL": True}, num_warps=ELEMENTWISE_WARPS,
        num_stages=1, div16=("I", "stride_gm", "stride_ym"), expect_opcodes=PDL_OPCODES))
    configs.append(AotConfig(
        name="combine4", kernel=_combine_kernel,
        signature={"x_ptr": "*bf16", "a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "y_ptr": "*bf16",
                   "N": "i32", "stride_xm": "i32", "stride_am": "i32", "stride_bm": "i32", "stride_cm": "i32",
                   "stride_ym": "i32", "BLOCK": "constexpr", "PDL": "constexpr"},
        constexprs={"BLOCK": ELEMENTWISE_BLOCK, "PDL": True}, num_warps=ELEMENTWISE_WARPS, num_stages=1,
        div16=("N", "stride_xm", "stride_am", "stride_bm", "stride_cm", "stride_ym"), expect_opcodes=PDL_OPCODES))
    configs.append(AotConfig(
        name=f"index_q_quant_{INDEX_N_HEADS}x{INDEX_HEAD_DIM}", kernel=_index_q_quant_kernel,
        signature={"q_ptr": "*bf16", "w_ptr": "*bf16", "qo_ptr": "*fp8e4nv", "wo_ptr": "*fp32", "H": "i32", "D": "i32",
                   "stride_qm": "i32", "stride_qh": "i32", "stride_wm": "i32", "stride_qom": "i32",
                   "stride_qoh": "i32", "stride_wom": "i32", "weight_scale": "fp32", "amax_floor": "fp32",
                   "BLOCK_H": "constexpr", "BLOCK_D": "constexpr", "FP8_MAX": "constexpr", "PDL": "constexpr"},
        constexprs={"BLOCK_H": INDEX_N_HEADS, "BLOCK_D": INDEX_HEAD_DIM, "FP8_MAX": FP8_MAX, "PDL": True},
        num_warps=INDEX_Q_QUANT_WARPS, num_stages=1,
        div16=("H", "D", "stride_qm", "stride_qh", "stride_wm", "stride_qom", "stride_qoh", "stride_wom"),
        expect_opcodes=PDL_OPCODES))
    return configs
