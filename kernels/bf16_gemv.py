"""bf16 GEMV for DSv4-Flash's replicated bf16 projections at decode: ``y = (x @ W^T) [* scale]``.

DSv4-Flash keeps a few projections in bf16 and replicates them on every tensor-parallel rank: the
compressor's ``wkv_gate`` ([2048, 4096] on C4 layers, [1024, 4096] on C128), the indexer compressor's
([512, 4096]) and the indexer's ``weights_proj`` ([64, 4096]). SGLang 0.5.23 runs the compressors through
``linear_bf16_fp32`` (cuBLAS ``torch.mm(x, W.t(), out_dtype=float32)``) and ``weights_proj`` through
``F.linear`` (cuBLAS, bf16 out), tile GEMMs sized for many rows. At a few rows the weight is all there
is to read, so this kernel streams each weight row once with 16-byte loads, multiplies on CUDA cores in
float32 and writes float32 or bf16 -- one launch, no workspace, CUDA-graph capturable.

Each program owns ``block_n`` weight rows and every activation row (``block_m`` >= M); it walks K in
``block_k`` steps. The product of one step, ``[block_m, block_n, block_k]`` float32, is kept at most
``PRODUCT_ELEMENTS_PER_THREAD`` per thread (the tile choice in :func:`default_config`).

The float32 reference :func:`reference_bf16_linear` is the specification: the exact product of the bf16
inputs accumulated in float32 (cuBLAS accumulates in float32 too; the summation order differs).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from .pdl import pdl_launch_dependents, pdl_supported, pdl_wait

# Rows a call may have: the CUDA-core form does block_m FMAs per weight value, so past a few rows a
# tensor-core GEMM (upstream's cuBLAS) is the better tool; the seam sends larger batches there. At 16 rows
# the per-thread product budget would also leave each thread less than one 16-byte weight load per step.
MAX_ROWS = 8
ROW_BLOCKS = (1, 2, 4, 8)
# float32 products of one K step held per thread (block_m * block_n * block_k / threads)
PRODUCT_ELEMENTS_PER_THREAD = 64
# the one-row form at 64 (1 x 4 x 2048 on 4 warps) stops at 128 registers with 8 bytes of spills on sm_120a
ONE_ROW_PRODUCT_ELEMENTS_PER_THREAD = 32
# ... so one-row tiles of 4+ weight rows run on 8 warps: the 2048-wide K step then fits (72 registers), where
# a 1024 step on 4 warps lost 6.13 -> 9.08 us on [2048, 4096] (H200 run 3)
ONE_ROW_WIDE_MIN_BLOCK_N = 4
ONE_ROW_WIDE_WARPS = 8
MAX_BLOCK_K = 2048
LOAD_ELEMENTS = 8  # bf16 values in one 16-byte load
NUM_WARPS = 4
# programs per SM the tile choice aims for on widths MEASURED_BLOCK_N does not list
PROGRAMS_PER_SM = 6
DEFAULT_SM_COUNT = 132
OUT_DTYPES = (torch.float32, torch.bfloat16)
USE_PDL = True
# One-row calls (not beside other streams: default_config) whose whole K fits one step of the one-row budget
# (ONE_ROW_PRODUCT_ELEMENTS_PER_THREAD, K up to W_BEFORE_WAIT_MAX_K) load their weight rows before the PDL wait, as
# SGLang's tiny_gemm_bf16 does for the router gate (sglang/kernels/jit/csrc/gemm/tiny_gemm.cuh: the weight tile into
# registers before PDLWaitPrimary): the weight is a constant of the model, so its DRAM round trip overlaps the previous
# kernel's tail and only the activation's load follows the wait. Alone at one row 1.12-1.68x (H200 bf16_gemv run 6).
# False: every call waits before its first load (the form before).
USE_W_BEFORE_WAIT = True
W_BEFORE_WAIT_MAX_K = 4096


@dataclasses.dataclass(frozen=True)
class Bf16GemvConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = NUM_WARPS
    num_stages: int = 2
    pdl: bool = False
    # one row, the whole K in one step (block_k >= K): the weight rows loaded before the PDL wait (USE_W_BEFORE_WAIT;
    # without PDL the same one-step program, which the interpreter runs)
    w_before_wait: bool = False

    def __post_init__(self):
        if self.w_before_wait and self.block_m != 1:
            raise ValueError(f"w_before_wait needs block_m 1; got {self}")

    @property
    def name(self) -> str:
        return (f"bf16gemv_m{self.block_m}_n{self.block_n}_k{self.block_k}_w{self.num_warps}_st{self.num_stages}"
                + ("_pdl" if self.pdl else "") + ("_wbw" if self.w_before_wait else ""))


@triton.jit
def _bf16_gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, scale,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      HAS_SCALE: tl.constexpr, OUT_BF16: tl.constexpr, PDL: tl.constexpr,
                      W_BEFORE_WAIT: tl.constexpr = False):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_mask = rn < N
    m_mask = rm < M
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]
    if W_BEFORE_WAIT:  # one row, K in one step (the launch checks block_k >= K): straight-line, weight first
        tl.static_assert(BLOCK_M == 1)
        k_mask = rk < K
        # the weight is read once per call: keep it from evicting the activations and the next layer's data
        w = tl.load(w_rows, mask=n_mask[:, None] & k_mask[None, :], other=0.0, eviction_policy="evict_first")
        pdl_wait(PDL)  # the activations may be the previous kernel's output
        x = tl.load(x_rows, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        part2 = w.to(tl.float32) * x.to(tl.float32)
    else:
        # the activations may be the previous kernel's output: wait before the first load (PDL)
        pdl_wait(PDL)
        # elementwise partial sums across the K loop, reduced over K once at the end: a reduction per step would
        # cost cross-thread shuffles and a barrier every step (H200 run 1: 5x slower at 8 rows)
        if BLOCK_M == 1:  # a 2-D product: the 3-D form's broadcast costs one-row calls spills on sm_120a
            part2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        else:
            part3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = (k0 + rk) < K
            # the weight is read once per call: keep it from evicting the activations and the next layer's data
            w = tl.load(w_rows + k0, mask=n_mask[:, None] & k_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(x_rows + k0, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            if BLOCK_M == 1:
                part2 += w.to(tl.float32) * x.to(tl.float32)
            else:
                part3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    pdl_launch_dependents(PDL)
    if BLOCK_M == 1:
        acc = tl.sum(part2, axis=1)[None, :]
    else:
        acc = tl.sum(part3, axis=2)
    if HAS_SCALE:
        acc = acc * scale
    y_ptrs = y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    y_mask = m_mask[:, None] & n_mask[None, :]
    if OUT_BF16:
        tl.store(y_ptrs, acc.to(tl.bfloat16), mask=y_mask)
    else:
        tl.store(y_ptrs, acc, mask=y_mask)


def _row_block(m: int) -> int:
    for block in ROW_BLOCKS:
        if m <= block:
            return block
    raise ValueError(f"x has {m} rows; the bf16 GEMV takes at most {MAX_ROWS}")


def sm_count(device: torch.device | None = None) -> int:
    if device is not None and device.type == "cuda":
        return _device_facts(device.index if device.index is not None else torch.cuda.current_device())[0]
    return DEFAULT_SM_COUNT


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[int, bool]:
    """(SM count, PDL support) of CUDA device ``index``, asked once: decode calls this every step."""
    device = torch.device("cuda", index)
    return torch.cuda.get_device_properties(device).multi_processor_count, pdl_supported(device)


def _launch_with_pdl(device: torch.device) -> bool:
    if not USE_PDL or device.type != "cuda":
        return False
    return _device_facts(device.index if device.index is not None else torch.cuda.current_device())[1]


# weight rows per program measured fastest on the H200 (run 2, benchmarks/bf16_gemv-h200-run2-summary.md) for
# DSv4-Flash's widths, by row block: with more rows a program reads the activations once per block_n weight
# rows, so wider blocks win from 2 rows; at one row the [1024] and [512] widths want the most programs
MEASURED_BLOCK_N = {
    2048: {1: 4, 2: 4, 4: 4, 8: 4},
    1024: {1: 1, 2: 2, 4: 2, 8: 2},
    512: {1: 1, 2: 1, 4: 2, 8: 2},
    64: {1: 1, 2: 1, 4: 1, 8: 1},
}


# share_sms (a call that other streams' kernels run beside): fewer, wider programs, measured in the layer rather than
# alone. SGLang's captured decode runs the C4 compressor's [2048, 4096] on a side stream beside wqkv_a / wq_b, where
# the 512 programs of its one-row tile hold the SM slots the query projections' kernels need when they launch (layer
# variants runs 24 / 25, benchmarks/bench-variants-h200-summary.md: on 32 rows per program C4 T=4 B=1 81.62 -> 79.38 us,
# 1.028x; T=1 B=1 and B=2 level; 64 rows 0.69-0.77x). Alone the wider tile is the slower one (the bench's one-stream C4
# layer at T=1 B=1: 148.7 -> 157.5 us), so only sharing callers take it.
SHARING_BLOCK_N = {2048: {1: 32}}


def tile(block_m: int, block_n: int, k: int, pdl: bool = False, w_before_wait: bool = True) -> Bf16GemvConfig:
    """``block_m`` x ``block_n`` with the longest K step that keeps the per-thread product within budget and
    gives every thread at least one 16-byte weight load per step; with PDL (and ``w_before_wait``), one row whose whole
    K fits that budget (up to W_BEFORE_WAIT_MAX_K) in one step, its weight loaded before the wait
    (USE_W_BEFORE_WAIT)."""
    num_warps = ONE_ROW_WIDE_WARPS if block_m == 1 and block_n >= ONE_ROW_WIDE_MIN_BLOCK_N else NUM_WARPS
    threads = 32 * num_warps
    budget = (ONE_ROW_PRODUCT_ELEMENTS_PER_THREAD if block_m == 1 else PRODUCT_ELEMENTS_PER_THREAD) * threads
    min_block_k = LOAD_ELEMENTS * threads // block_n
    whole_k = triton.next_power_of_2(k)
    if (USE_W_BEFORE_WAIT and w_before_wait and pdl and block_m == 1 and whole_k <= W_BEFORE_WAIT_MAX_K
            and block_n * whole_k <= budget):
        return Bf16GemvConfig(1, block_n, max(min_block_k, whole_k), num_warps=num_warps, pdl=True,
                              w_before_wait=True)
    block_k = max(min_block_k, min(MAX_BLOCK_K, whole_k, budget // (block_m * block_n)))
    return Bf16GemvConfig(block_m, block_n, block_k, num_warps=num_warps, pdl=pdl)


def default_config(m: int, n: int, k: int, sms: int = DEFAULT_SM_COUNT, pdl: bool = False,
                   share_sms: bool = False) -> Bf16GemvConfig:
    """The tile for ``m`` rows of ``[n, k]``: the measured weight rows per program for DSv4-Flash's widths (with
    ``share_sms``, where other streams run beside the call, :data:`SHARING_BLOCK_N` first), elsewhere as many (1..8)
    as keep at least ``PROGRAMS_PER_SM`` programs per SM; then the longest K step that keeps the per-thread product
    within budget."""
    block_m = _row_block(m)
    block_n = SHARING_BLOCK_N.get(n, {}).get(block_m) if share_sms else None
    if block_n is None:
        block_n = MEASURED_BLOCK_N.get(n, {}).get(block_m)
    if block_n is None:
        block_n = 8
        while block_n > 1 and triton.cdiv(n, block_n) < PROGRAMS_PER_SM * sms:
            block_n //= 2
    # a call beside other streams' kernels (the compressors in SGLang's multi-stream prepare) starts its stream after
    # an event, with no PDL predecessor whose tail its weight load could overlap: it keeps the looping tile (H200
    # layer variants runs 40 / 41, T=1 B=1, the router gate alone with the weight first against every one-row call:
    # C4 1.014 / 1.011x, C128 1.011 / 1.004x)
    return tile(block_m, block_n, k, pdl, w_before_wait=not share_sms)


def _unit_stride_in_last_dim(t: torch.Tensor) -> bool:
    """Whether ``t`` [rows, cols] is contiguous along its last dim as the kernel reads it; the stride of a dim of size
    1, or of a tensor without rows, is never used (torch may report anything there, e.g. 0 for ``1.0 * x[0, 1]``)."""
    return t.stride(1) == 1 or t.shape[1] <= 1 or t.shape[0] == 0


def _check(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype, out: torch.Tensor | None) -> None:
    if weight.dim() != 2 or weight.dtype != torch.bfloat16:
        raise ValueError(f"weight must be a 2-D bf16 tensor [N, K], got {tuple(weight.shape)} {weight.dtype}")
    n, k = weight.shape
    if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] != k:
        raise ValueError(f"x must be a bf16 tensor [M, {k}] (weight is [{n}, {k}]), got {tuple(x.shape)} {x.dtype}")
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"x has {x.shape[0]} rows; the bf16 GEMV takes at most {MAX_ROWS}")
    if not (_unit_stride_in_last_dim(weight) and _unit_stride_in_last_dim(x)):
        raise ValueError("x and weight must be contiguous along K (stride 1 in their last dimension)")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device}, weight on {weight.device}")
    if out is not None:
        if tuple(out.shape) != (x.shape[0], n) or out.dtype != out_dtype or not _unit_stride_in_last_dim(out) \
                or out.device != x.device:
            raise ValueError(f"out must be a {out_dtype} tensor [{x.shape[0]}, {n}] contiguous along N on "
                             f"{x.device}, got {tuple(out.shape)} {out.dtype}")


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype = torch.float32,
                scale: float | None = None, out: torch.Tensor | None = None,
                config: Bf16GemvConfig | None = None, share_sms: bool = False) -> torch.Tensor:
    """``x [M, K] bf16 @ weight [N, K]^T bf16`` (times ``scale`` if given) as ``out_dtype`` ``[M, N]``,
    M <= ``MAX_ROWS`` (0 allowed); the sum in float32, rounded once to ``out_dtype``. ``share_sms``: kernels on
    other streams run beside this call (the tile of :func:`default_config`; the result is the same)."""
    _check(x, weight, out_dtype, out)
    m, k = x.shape
    n = weight.shape[0]
    y = out if out is not None else torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_()
    cfg = config or default_config(m, n, k, sm_count(x.device), pdl=_launch_with_pdl(x.device), share_sms=share_sms)
    if cfg.block_m < m:
        raise ValueError(f"config {cfg.name} holds {cfg.block_m} rows, x has {m}")
    if cfg.w_before_wait and cfg.block_k < k:
        raise ValueError(f"config {cfg.name} loads its weight in one step of {cfg.block_k}; K is {k}")
    extra = {"launch_pdl": True} if cfg.pdl else {}
    _bf16_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0), 1.0 if scale is None else float(scale),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, HAS_SCALE=scale is not None,
        OUT_BF16=out_dtype == torch.bfloat16, PDL=cfg.pdl, W_BEFORE_WAIT=cfg.w_before_wait, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **extra)
    return y


def reference_bf16_linear(x: torch.Tensor, weight: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """The specification, in float32: the exact products of the bf16 values summed in float32."""
    y = x.float() @ weight.float().t()
    return y if scale is None else y * scale


def shipped_configs() -> list[Bf16GemvConfig]:
    """Every tile :func:`default_config` picks for DSv4-Flash's bf16 projections at 1..MAX_ROWS rows on a GPU of
    any SM count up to ``SM12X_AOT_MAX_SM_COUNT`` (the sm_12x GPUs and the H200 the device runs included), with PDL
    as those GPUs launch it, alone and sharing the SMs; also the router gate's, which the bench runs in both paths
    in place of SGLang's tiny_gemm_bf16."""
    from .dsv4 import BF16_LINEAR_SHAPES, ROUTER_GATE_SHAPE, SM12X_AOT_MAX_SM_COUNT

    configs = {}
    for n, k in (*BF16_LINEAR_SHAPES.values(), ROUTER_GATE_SHAPE):
        for m in ROW_BLOCKS:
            for sms in range(1, SM12X_AOT_MAX_SM_COUNT + 1):
                for share_sms in (False, True):
                    cfg = default_config(m, n, k, sms, pdl=True, share_sms=share_sms)
                    configs[cfg.name] = cfg
    return list(configs.values())


def aot_configs():
    from .harness.aot import AotConfig
    from .pdl import PDL_OPCODES

    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                 "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32", "scale": "fp32",
                 "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "HAS_SCALE": "constexpr",
                 "OUT_BF16": "constexpr", "PDL": "constexpr", "W_BEFORE_WAIT": "constexpr"}
    out = []
    for cfg in shipped_configs():
        for out_bf16 in (False, True):  # compressors (fp32) and weights_proj (bf16)
            out.append(AotConfig(
                name=cfg.name + ("_obf16" if out_bf16 else "_of32"), kernel=_bf16_gemv_kernel,
                signature={**signature, "y_ptr": "*bf16" if out_bf16 else "*fp32"},
                constexprs={"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                            "HAS_SCALE": False, "OUT_BF16": out_bf16, "PDL": cfg.pdl,
                            "W_BEFORE_WAIT": cfg.w_before_wait},
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, div16=("N", "K", "stride_xm", "stride_wn",
                                                                          "stride_ym"),
                # CUDA cores only (FFMA, or FMUL + FADD where ptxas keeps them apart); the weight streamed in
                # 16-byte loads with the evict-first hint
                expect_opcodes=("LDG.E.EF.128", *PDL_OPCODES), forbid_opcodes=("HMMA",)))
    return out
