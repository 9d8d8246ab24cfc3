"""The upstream SGLang 0.5.23 path the bench times, built from SGLang's own code.

On sm_120 SGLang runs FlashInfer / CUTLASS / TileLang / JIT-CUDA kernels that do not run on other
GPUs (reference doc §5), so the bench times the *closest upstream path that runs on the GPU at
hand*, each piece named by what it stands for:

============  ==================================================================================
attention     ``flash_mla_sparse_decode_triton`` (SGLANG_SM120_FLASHMLA_BACKEND=triton)
indexer       ``fp8_paged_mqa_logits_torch_sm120`` (SGLANG_FP8_PAGED_MQA_LOGITS_TORCH) + ``torch.topk``
              and the page-table slot transform in torch (stands for TileLang logits + JIT top-k)
wo_a          ``_apply_wo_a_bf16_matmul`` on the bf16-dequantised weight (what sm_120 runs)
dense FP8     ``_per_token_group_quant_8bit`` + ``_w8a8_block_fp8_matmul`` (SGLang's Triton block-FP8
              path, default config; stands for the CUTLASS SM120 blockwise GEMM)
routed MoE    ``fused_moe_kernel`` (SGLang's Triton ``fused_experts``) on bf16-dequantised experts,
              upstream's tuned table for the GPU when one ships, else ``get_default_config``;
              alignment, clamped SwiGLU and the top-k sum in torch (they stand for sgl_kernel's
              ``moe_align_block_size``, ``silu_and_mul`` and ``moe_sum_reduce``)
============  ==================================================================================

Where the code comes from: with SGLang installed (the CPU test environment) it is imported from
SGLang; on the device, which has no SGLang, from the files ``tools/device_bench.py --prepare``
extracted into ``.upstream/`` (see ``UPSTREAM_FILES``). This module never imports SGLang at import
time.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from typing import Any, Callable

import torch

from ..kernels import dsv4

# .upstream/ file -> what it holds (written by tools/device_bench.py --prepare)
UPSTREAM_FILES = {
    "attention": "flash_mla_sm120_triton.py",  # whole module (torch + triton only)
    "indexer": "indexer_logits_torch.py",  # tools/device_indexer.py --prepare
    "wo_a": "dsv4_wo_a.py",  # tools/device_fp8_gemv.py --prepare
    "triton": "bench_triton_kernels.py",  # fused_moe_kernel, w8a8 block GEMM, group quant, moe config
}
# optional: upstream's tuned fused-MoE tables for this GPU ({"up/<I>": {M: cfg}, "down/<I>": ...}),
# written by tools/device_moe_mxfp4.py --prepare; without them upstream uses get_default_config
MOE_TABLES_FILE = "upstream_fused_moe_configs.json"

NAMES = {
    "attention": "SGLang flash_mla_sparse_decode_triton (SIMT Triton, grid B x H)",
    "indexer": "SGLang fp8_paged_mqa_logits_torch_sm120 + torch.topk",
    "wo_a": "SGLang _apply_wo_a_bf16_matmul (bf16 einsum on dequantised wo_a)",
    "dense": "SGLang Triton per_token_group_quant + w8a8_block_fp8_matmul (default config)",
    "moe": "SGLang Triton fused_moe_kernel on bf16-dequantised experts",
    "bf16_linear": "SGLang linear_bf16_fp32 (cuBLAS torch.mm, fp32 out) for the compressors, F.linear (cuBLAS, "
                   "bf16) for weights_proj",
}


@dataclasses.dataclass
class UpstreamOps:
    source: str
    sparse_decode: Callable
    attention_module: Any
    indexer_logits: Callable
    wo_a: Callable
    fused_moe_kernel: Any
    moe_default_config: Callable
    block_fp8_matmul_kernel: Any
    group_quant_kernel: Any
    moe_tables: dict = dataclasses.field(default_factory=dict)


# Upstream Triton kernels (and the MoE default-config function) the bench launches itself:
# relpath under the sglang package -> top-level names. Extracted with their decorators.
TRITON_SOURCES = {
    "kernels/ops/moe/fused_moe_triton_kernels.py": ("write_zeros_to_output", "fused_moe_kernel"),
    "kernels/ops/gemm/fp8_kernel.py": ("_w8a8_block_fp8_matmul",),
    "kernels/ops/quantization/fp8_kernel.py": ("_per_token_group_quant_8bit",),
    "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py": ("get_default_config",),
}
# what the extracted code reads from its modules' globals, as on a CUDA build outside a server
TRITON_PREAMBLE = """from __future__ import annotations
from typing import Dict, List, Optional
import torch
import triton
import triton.language as tl
_is_hip = False
class _Deterministic:
    enable_deterministic_inference = False
class _Exec:
    deterministic = _Deterministic
def get_exec():
    return _Exec
def _use_low_smem_fp8_default():
    return False
"""


def sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed here")
    return list(spec.submodule_search_locations)[0]


def triton_bundle_source() -> str:
    """The upstream Triton kernels of ``TRITON_SOURCES`` as one module's text (decorators kept)."""
    import ast

    parts = ["# Extracted from the installed sglang wheel by sglang_sm120.bench.upstream_ops; "
             "not part of sglang-sm120.\n", TRITON_PREAMBLE]
    root = sglang_root()
    for relpath, names in TRITON_SOURCES.items():
        with open(os.path.join(root, relpath)) as f:
            text = f.read()
        lines = text.splitlines()
        found = {}
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                start = min([node.lineno] + [dec.lineno for dec in node.decorator_list]) - 1
                found[node.name] = "\n".join(lines[start:node.end_lineno])
        missing = set(names) - set(found)
        if missing:
            raise ImportError(f"{relpath}: upstream no longer defines {sorted(missing)}")
        parts += [f"# --- from sglang/{relpath}"] + [found[n] for n in names]
    return "\n\n\n".join(parts) + "\n"


def write_triton_bundle(directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, UPSTREAM_FILES["triton"])
    with open(path, "w") as f:
        f.write(triton_bundle_source())
    return path


def _from_sglang() -> UpstreamOps:
    import tempfile

    from sglang.kernels.ops.attention import flash_mla_sm120_triton as attention
    from sglang.srt.layers.attention.dsv4.indexer import fp8_paged_mqa_logits_torch_sm120
    from sglang.srt.models.deepseek_v4 import _apply_wo_a_bf16_matmul

    # Triton needs the kernels' source on disk: the same extraction the device uses, to a temp dir
    kernels = _load_file(os.path.dirname(write_triton_bundle(tempfile.mkdtemp(prefix="sglang_sm120_bench_"))),
                         UPSTREAM_FILES["triton"])
    return UpstreamOps("sglang (installed)", attention.flash_mla_sparse_decode_triton, attention,
                       fp8_paged_mqa_logits_torch_sm120, _apply_wo_a_bf16_matmul, kernels.fused_moe_kernel,
                       kernels.get_default_config, kernels._w8a8_block_fp8_matmul,
                       kernels._per_token_group_quant_8bit)


def _load_file(directory: str, name: str):
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: run `python3 tools/device_bench.py --prepare` where SGLang "
                                f"is installed and carry .upstream")
    spec = importlib.util.spec_from_file_location(f"sglang_sm120_bench_upstream_{name[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _from_files(directory: str) -> UpstreamOps:
    attention = _load_file(directory, UPSTREAM_FILES["attention"])
    indexer = _load_file(directory, UPSTREAM_FILES["indexer"])
    wo_a = _load_file(directory, UPSTREAM_FILES["wo_a"])
    kernels = _load_file(directory, UPSTREAM_FILES["triton"])
    tables = {}
    if os.path.exists(os.path.join(directory, MOE_TABLES_FILE)):
        import json

        with open(os.path.join(directory, MOE_TABLES_FILE)) as f:
            tables = json.load(f)
    return UpstreamOps(f"files in {directory}", attention.flash_mla_sparse_decode_triton, attention,
                       indexer.fp8_paged_mqa_logits_torch_sm120, wo_a._apply_wo_a_bf16_matmul,
                       kernels.fused_moe_kernel, kernels.get_default_config, kernels._w8a8_block_fp8_matmul,
                       kernels._per_token_group_quant_8bit, tables)


def load(source: str = "auto", directory: str = ".upstream") -> UpstreamOps:
    """``source``: "sglang" (import it), "files" (``directory``), or "auto" (files if all are there)."""
    if source not in ("auto", "sglang", "files"):
        raise ValueError(f"source must be auto, sglang or files, got {source!r}")
    have_files = all(os.path.exists(os.path.join(directory, f)) for f in UPSTREAM_FILES.values())
    if source == "files" or (source == "auto" and have_files):
        ops = _from_files(directory)
    else:
        ops = _from_sglang()
    if os.environ.get("TRITON_INTERPRET") == "1":
        # the interpreter cannot benchmark autotune configs: keep upstream's first one
        kernel = ops.attention_module._tiled_sparse_decode_kernel
        if hasattr(kernel, "configs") and len(kernel.configs) > 1:
            kernel.configs = kernel.configs[:1]
    return ops


# ------------------------------------------------------------------------------------------------
# launchers: upstream's kernels called the way upstream's wrappers call them


FP8_MAX = 448.0
GROUP_QUANT_EPS = 1e-10
# _w8a8_block_fp8_matmul's default config in w8a8_block_fp8_matmul_triton (no tuned file on sm_120)
BLOCK_FP8_DEFAULT = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=dsv4.FP8_BLOCK, BLOCK_SIZE_K=dsv4.FP8_BLOCK, GROUP_SIZE_M=32,
                         num_warps=4, num_stages=3)


def block_fp8_linear(ops: UpstreamOps, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [M, K] bf16`` -> per-token-group(128) FP8 quant -> block-FP8 GEMM -> ``[M, N]`` bf16."""
    import triton

    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    group = dsv4.FP8_BLOCK
    xq = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    xs = torch.empty(m, k // group, dtype=torch.float32, device=x.device)
    ops.group_quant_kernel[(m * k // group,)](x, xq, xs, group, group, GROUP_QUANT_EPS, -FP8_MAX, FP8_MAX,
                                              BLOCK=group, num_warps=1, num_stages=1)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    cfg = BLOCK_FP8_DEFAULT
    grid = (triton.cdiv(m, cfg["BLOCK_SIZE_M"]) * triton.cdiv(n, cfg["BLOCK_SIZE_N"]),)
    ops.block_fp8_matmul_kernel[grid](
        xq, weight, out, xs, scale, m, n, k, group, group,
        xq.stride(-2), xq.stride(-1), weight.stride(1), weight.stride(0), out.stride(-2), out.stride(-1),
        xs.stride(-2), xs.stride(-1), scale.stride(1), scale.stride(0),
        needs_masking=bool(k % cfg["BLOCK_SIZE_K"]), **cfg)
    return out


def linear_bf16_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SGLang 0.5.23's default ``linear_bf16_fp32`` (sglang/kernels/ops/gemm/bf16_fp32.py,
    ``_linear_bf16_fp32_cublas``): cuBLAS bf16 x bf16 -> float32 on CUDA, a float32 matmul elsewhere."""
    if x.is_cuda and x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return torch.mm(x.float(), weight.float().t())


def align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int):
    """moe_align_block_size in torch, graph-capturable (fixed output sizes): routed rows sorted by
    expert with each expert padded to a multiple of ``block_m`` (pad id = number of rows), the
    expert of each block (-1 past the end) and the padded total ``[1]``."""
    flat = topk_ids.flatten().long()
    rows = flat.numel()
    capacity = -(-(rows + num_experts * (block_m - 1)) // block_m) * block_m
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    rank = torch.arange(rows, device=flat.device) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    dest = (padded_end - padded)[sorted_e] + rank
    sorted_ids = torch.full((capacity,), rows, dtype=torch.int32, device=flat.device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(0, capacity, block_m, device=flat.device)
    expert_of_block = torch.searchsorted(padded_end, block_start, right=True)
    total = padded_end[-1:]
    expert_ids = torch.where(block_start < total, expert_of_block.clamp(max=num_experts - 1), -1).to(torch.int32)
    return sorted_ids, expert_ids, total.to(torch.int32)


def _moe_gemm(ops, a, w, c, topk_weights, sorted_ids, expert_ids, total, rows, top_k, mul_weight, cfg):
    import triton
    import triton.language as tl

    meta = {key: cfg[key] for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}
    launch = {key: cfg[key] for key in ("num_warps", "num_stages") if key in cfg}
    grid = (triton.cdiv(sorted_ids.shape[0], meta["BLOCK_SIZE_M"]) * triton.cdiv(w.shape[1], meta["BLOCK_SIZE_N"]),)
    ops.fused_moe_kernel[grid](
        a, None, w, None, None, c, None, None, topk_weights, sorted_ids, expert_ids, total, None,
        w.shape[1], w.shape[2], sorted_ids.shape[0], rows,
        a.stride(0), a.stride(1), w.stride(0), w.stride(2), w.stride(1), 0, 0, c.stride(-2), c.stride(-1),
        0, 0, 0, 0, 0, 0, 0,
        MUL_ROUTED_WEIGHT=mul_weight, top_k=top_k, compute_type=tl.bfloat16, use_fp8_w8a8=False,
        use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
        even_Ks=w.shape[2] % meta["BLOCK_SIZE_K"] == 0, c_sorted=False, swap_ab=False, FUSE_ADD_TO_OUTPUT=False,
        MASK_OUTPUT=False, FUSE_SUM_ALL_REDUCE=False, ROUTER_TOPK=top_k, **meta, **launch)


def moe_config(ops: UpstreamOps, which: str, num_tokens: int, num_experts: int, inter: int, hidden: int,
               top_k: int) -> dict:
    """Upstream's choice (``try_get_optimal_moe_config``): the tuned table's nearest M when one ships
    for this GPU and width, else ``get_default_config`` (bf16)."""
    table = ops.moe_tables.get(f"{which}/{inter}")
    if table:
        return dict(table[min(table, key=lambda m: abs(int(m) - num_tokens))])
    return dict(ops.moe_default_config(num_tokens, num_experts, inter, hidden, top_k, None, False))


def fused_experts(ops: UpstreamOps, x, w13_bf16, w2_bf16, topk_weights, topk_ids,
                  swiglu_limit: float = dsv4.SWIGLU_LIMIT) -> torch.Tensor:
    """Upstream's Triton fused_experts on bf16 experts (w13 rows [gate; up]): ``[B, H]`` bf16."""
    batch, hidden = x.shape
    num_experts, two_i, _ = w13_bf16.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    rows = batch * top_k
    cfg1 = moe_config(ops, "up", batch, num_experts, inter, hidden, top_k)
    cfg2 = moe_config(ops, "down", batch, num_experts, inter, hidden, top_k) if ops.moe_tables else cfg1
    sorted_ids, expert_ids, total = align_block_size(topk_ids, cfg1["BLOCK_SIZE_M"], num_experts)
    gate_up = torch.empty(batch, top_k, two_i, dtype=torch.bfloat16, device=x.device)
    _moe_gemm(ops, x, w13_bf16, gate_up, topk_weights, sorted_ids, expert_ids, total, rows, top_k, False, cfg1)
    gate, up = gate_up.view(rows, two_i).float().chunk(2, dim=-1)
    act = (torch.nn.functional.silu(gate.clamp(max=swiglu_limit)) * up.clamp(-swiglu_limit, swiglu_limit))
    act = act.to(torch.bfloat16)
    if cfg2["BLOCK_SIZE_M"] != cfg1["BLOCK_SIZE_M"]:
        sorted_ids, expert_ids, total = align_block_size(topk_ids, cfg2["BLOCK_SIZE_M"], num_experts)
    down = torch.empty(batch, top_k, hidden, dtype=torch.bfloat16, device=x.device)
    _moe_gemm(ops, act, w2_bf16, down, topk_weights, sorted_ids, expert_ids, total, rows, 1, True, cfg2)
    return down.sum(dim=1, dtype=torch.float32).to(torch.bfloat16)


def indexer_topk(ops: UpstreamOps, q, index_k, weights, lengths, page_table, max_len: int, k: int):
    """Upstream torch logits, ``torch.topk``, then positions -> C4 pool slots (-1 where fewer
    than ``k`` positions are live): ``[B, k]`` int32."""
    logits = ops.indexer_logits(q, index_k, weights, lengths, page_table, None, max_len, False)
    top = torch.topk(logits, min(k, max_len), dim=1)
    pos = top.indices
    slots = page_table.long().gather(1, pos // dsv4.INDEX_PAGE_SIZE) * dsv4.INDEX_PAGE_SIZE + pos % dsv4.INDEX_PAGE_SIZE
    slots = torch.where(torch.isfinite(top.values), slots, -1).to(torch.int32)
    if slots.shape[1] < k:
        slots = torch.nn.functional.pad(slots, (0, k - slots.shape[1]), value=-1)
    return slots
