"""The ``bf16_linear`` seam: DSv4-Flash's replicated bf16 projections at decode on
``sglang_sm120.kernels.bf16_gemv``.

SGLang 0.5.23 keeps three projections of each compressed layer in bf16 and runs them as cuBLAS GEMMs,
however few the rows: the compressor's and the indexer compressor's ``wkv_gate`` ([2048 | 1024, 4096] and
[512, 4096]) through ``linear_bf16_fp32`` (``torch.mm(x, W.t(), out_dtype=float32)``), and the indexer's
``weights_proj`` ([64, 4096], an unquantised ``ReplicatedLinear``, bf16 out). At a few rows the GEMV is
1.3-2.6x faster on the H200 (benchmarks/bf16_gemv-h200-run2-summary.md).

Hooks (SGLang 0.5.23):

* ``srt/layers/attention/dsv4/compressor.py: Compressor._compute_wkv_gate`` (:160-173) AROUND: a bf16
  ``wkv_gate`` weight and bf16 activations of 1..``COMPRESSOR_MAX_ROWS`` rows run
  ``bf16_linear(x, W)`` with float32 out (the contract of ``linear_bf16_fp32``: the product of the bf16
  values accumulated and returned in float32). Upstream keeps everything else: more rows, ROCm's aiter
  GEMM, GGUF weights, and an opt-in ``SGLANG_OPT_BF16_FP32_GEMM_ALGO`` other than cuBLAS.
* ``srt/layers/attention/dsv4/indexer.py: C4Indexer.compute_weights`` (:1246-1250) AROUND: an unquantised
  bf16 ``weights_proj`` without bias at 1..``WEIGHTS_PROJ_MAX_ROWS`` rows runs ``bf16_linear`` with bf16
  out, the weight scale (when not skipped) applied in float32 before the one rounding; anything else
  (the expert-pack quantised form, more rows) stays upstream's.

* ``srt/models/deepseek_v4.py: MQALayer._forward_prepare_multi_stream`` (:1891-1953) AROUND: only marks
  the call, so that the compressor's ``wkv_gate`` inside it, which runs on a side stream beside ``wqkv_a`` /
  ``wq_b`` (SGLang's multi-stream decode), takes the GEMV's SM-sharing tile (``bf16_gemv.SHARING_BLOCK_N``:
  fewer, wider programs); the call itself is upstream's, unchanged.

Both answer with upstream's dtypes and shapes, so the callers are unchanged. Each hook checks at call time
that the seam is active, so installed hooks of an inactive seam change nothing.
"""

from __future__ import annotations


import contextvars

import torch

from .hooks import install_hooks
from .seams import REGISTRY, OnceLog, Seam, kernels_runnable, run_or_fall_back

COMPRESSOR_GATE = "sglang.srt.layers.attention.dsv4.compressor.Compressor._compute_wkv_gate"
INDEXER_WEIGHTS = "sglang.srt.layers.attention.dsv4.indexer.C4Indexer.compute_weights"
PREPARE_MULTI_STREAM = "sglang.srt.models.deepseek_v4.MQALayer._forward_prepare_multi_stream"
TARGETS = (COMPRESSOR_GATE, INDEXER_WEIGHTS, PREPARE_MULTI_STREAM)

# True while MQALayer._forward_prepare_multi_stream runs: its compressor shares the SMs with the query projections
_beside_query_projections = contextvars.ContextVar("sglang_sm120_bf16_beside_query", default=False)

# Rows up to which the GEMV runs, from H200 run 2 (benchmarks/bf16_gemv-h200-run2-summary.md): the compressors
# at 4 rows 1.05x ([2048]) .. 1.46x ([512]) over cuBLAS and slower at 8; weights_proj 1.52x at 8 rows.
COMPRESSOR_MAX_ROWS = 4
WEIGHTS_PROJ_MAX_ROWS = 8

_log_once = OnceLog("bf16_linear")


def _kernels():
    from .kernels import bf16_gemv

    return bf16_gemv


def active() -> bool:
    return REGISTRY.is_active("bf16_linear")


def covers(x: torch.Tensor, weight, max_rows: int) -> bool:
    """Whether ``x @ weight.T`` is a call the GEMV takes: bf16 2-D operands contiguous along K on one device,
    1..``max_rows`` rows."""
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.bfloat16 or weight.dim() != 2:
        return False
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2:
        return False
    if x.shape[1] != weight.shape[1] or not 1 <= x.shape[0] <= min(max_rows, _kernels().MAX_ROWS):
        return False
    return x.device == weight.device and x.stride(1) == 1 and weight.stride(1) == 1 and kernels_runnable(x)


def _upstream_gemm_is_cublas() -> bool:
    """False when the user opted into another bf16 x bf16 -> fp32 GEMM (HPC-Ops / DeepGEMM)."""
    from sglang.kernels.ops.gemm import bf16_fp32

    return getattr(bf16_fp32, "_linear_bf16_fp32_algo", "cublas") == "cublas"


def compute_wkv_gate_hook(original, self, x, *args, **kwargs):
    weight = getattr(getattr(self, "wkv_gate", None), "weight", None)
    if active() and not args and not kwargs and covers(x, weight, COMPRESSOR_MAX_ROWS) \
            and _upstream_gemm_is_cublas() and not _uses_aiter():
        _log_once("compressor", "compressor wkv_gate at 1..%d rows runs the Triton bf16 GEMV (fp32 out); more "
                  "rows stay on linear_bf16_fp32", COMPRESSOR_MAX_ROWS)
        share = _beside_query_projections.get()
        return run_or_fall_back(_log_once, "the bf16 GEMV (compressor)",
                                lambda: _kernels().bf16_linear(x, weight, out_dtype=torch.float32, share_sms=share),
                                lambda: original(self, x))
    return original(self, x, *args, **kwargs)


def prepare_multi_stream_hook(original, self, *args, **kwargs):
    """Upstream's multi-stream prepare, unchanged, with the compressor calls inside it marked as sharing the SMs
    (they run on a side stream beside wqkv_a / wq_b). The mark is host-side: under capture it picks the tile the
    graph records."""
    token = _beside_query_projections.set(True)
    try:
        return original(self, *args, **kwargs)
    finally:
        _beside_query_projections.reset(token)


def _uses_aiter() -> bool:
    from sglang.srt.layers.attention.dsv4 import compressor

    return bool(getattr(compressor, "_use_aiter", False))


def _unquantised(linear) -> bool:
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    return isinstance(getattr(linear, "quant_method", None), UnquantizedLinearMethod) \
        and getattr(linear, "bias", None) is None


def compute_weights_hook(original, self, x, skip_scale=False):
    proj = getattr(self, "weights_proj", None)
    weight = getattr(proj, "weight", None)
    if active() and proj is not None and covers(x, weight, WEIGHTS_PROJ_MAX_ROWS) and _unquantised(proj):
        _log_once("weights_proj", "indexer weights_proj at 1..%d rows runs the Triton bf16 GEMV; more rows stay "
                  "on its ReplicatedLinear", WEIGHTS_PROJ_MAX_ROWS)
        scale = None if skip_scale else float(self.weight_scale)
        return run_or_fall_back(_log_once, "the bf16 GEMV (weights_proj)",
                                lambda: _kernels().bf16_linear(x, weight, out_dtype=torch.bfloat16, scale=scale),
                                lambda: original(self, x, skip_scale=skip_scale))
    return original(self, x, skip_scale=skip_scale)


def install() -> None:
    install_hooks([(COMPRESSOR_GATE, compute_wkv_gate_hook, "AROUND"),
                   (INDEXER_WEIGHTS, compute_weights_hook, "AROUND"),
                   (PREPARE_MULTI_STREAM, prepare_multi_stream_hook, "AROUND")])


def make_seam() -> Seam:
    return Seam(
        name="bf16_linear",
        description="replicated bf16 projections (compressor wkv_gate, indexer weights_proj) on a Triton GEMV "
                    "at few rows",
        targets=TARGETS,
        install=install,
    )
