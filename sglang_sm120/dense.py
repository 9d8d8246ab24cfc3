"""The ``dense`` seam: DSv4-Flash's dense FP8 projections at decode on ``sglang_sm120.kernels.fp8_gemv``.

Hooks (SGLang 0.5.23):

* ``srt/models/deepseek_v4.py: wo_a_fp8_gemm_enabled`` AROUND: also True for an FP8 128x128
  block-quantised checkpoint. Upstream decides with it (``MqaAttentionBase.__init__`` :1065-1147 and
  ``DeepseekV4ForCausalLM.__init__`` :4674) whether ``wo_a`` is allocated in FP8 with block scales
  and whether ``load_weights`` (:5267-5271) dequantises the checkpoint's ``wo_a`` to bf16 while
  streaming it. True keeps the checkpoint's FP8 weight and scales; the bf16 copy is never made.
  ``post_load_weights`` then lays the scales out as ``[G, R/128, D/128]`` fp32 (:5002-5058).
* ``MqaAttentionBase.__init__`` AROUND: for a layer whose ``wo_a`` is FP8 because of the hook above,
  clears ``self.wo_a_fp8`` again, so ``forward`` (:3032-3053) takes the
  ``_apply_wo_a_bf16_matmul(o, self.wo_a.weight.view(G, R, -1), ...)`` branch instead of the
  activation-quantising DeepGEMM ``fp8_einsum`` branch (:3000-3024, which needs an sm_120 DeepGEMM
  build), and records the scale parameter on the weight.
* ``_apply_wo_a_bf16_matmul`` (:502-604) AROUND: an FP8 ``wo_a`` goes to
  :func:`~sglang_sm120.kernels.fp8_gemv.grouped_fp8_wo_a`; a bf16 one to upstream.
* ``MQALayer.__init__`` AROUND: for such a layer, sets ``use_fused_wo_a`` (upstream sets it only for
  V4.1 with a bf16 ``wo_a`` on sm_100, :1533-1542) where its local group count has a measured win in
  ``FUSED_ROPE_WHERE``, so that ``forward`` (:2933-2976) skips its standalone
  ``fused_rope_inplace(o[..., -64:], inverse=True)`` at 1..32 rows and calls ``fused_rope_wo_a_bf16``
  instead. Not where wo_b may consume FlashInfer-swizzled MXFP8 (``use_flashinfer_mxfp8_wo_b``, decided
  after load; its backend ``mxfp8_dense_backend`` is known at build): the fused branch would then ask for
  that output format (logged once). Over 32 rows upstream keeps the separate RoPE and the hook above.
* ``fused_rope_wo_a_bf16`` (``kernels/ops/attention/dsv4/wo_a.py``, imported into deepseek_v4) AROUND:
  for an adopted FP8 ``wo_a``, ``grouped_fp8_wo_a(o, w, scale, positions=, freqs=)`` (the inverse RoPE
  applied to the activation in registers, one launch) at the (groups, rows) of ``FUSED_ROPE_WHERE``, else
  upstream's ``fused_rope_inplace`` then the kernel without RoPE (the launches of the unfused branch);
  returns ``(y [T, G*R],)`` as upstream's does. A bf16 ``wo_a`` goes to upstream's function.
* ``srt/layers/quantization/fp8_utils.py: dispatch_w8a8_block_fp8_linear`` (:704-750) AROUND: the
  block-FP8 linear ``Fp8LinearMethod`` keeps (CUTLASS on sm_120) is wrapped so that calls with a
  bf16 activation of 1..``SGLANG_SM120_DENSE_MAX_ROWS`` rows (default 16) and 128x128 fp32 scales
  run :func:`~sglang_sm120.kernels.fp8_gemv.block_fp8_linear` (no activation quantisation);
  larger row counts, pre-quantised activations and anything else keep upstream's linear. Runners
  whose load-time processing rewrites the scales (DeepGEMM, aiter) are not wrapped.

If upstream's own FP8 ``wo_a`` GEMM was opted into (``SGLANG_OPT_FP8_WO_A_GEMM=1`` with an sm_120
DeepGEMM build), ``wo_a`` stays entirely upstream's. Every hook checks at call time that the seam
is active, so a seam that is not active changes nothing even where hooks were installed.
"""

from __future__ import annotations

import os
import weakref

import torch

from .hooks import install_hooks
from .seams import REGISTRY, OnceLog, Seam, kernels_runnable, run_or_fall_back

DSV4 = "sglang.srt.models.deepseek_v4"
WO_A_ENABLED = f"{DSV4}.wo_a_fp8_gemm_enabled"
MQA_INIT = f"{DSV4}.MqaAttentionBase.__init__"
MQA_LAYER_INIT = f"{DSV4}.MQALayer.__init__"
WO_A_MATMUL = f"{DSV4}._apply_wo_a_bf16_matmul"
FUSED_ROPE_WO_A = f"{DSV4}.fused_rope_wo_a_bf16"
FP8_DISPATCH = "sglang.srt.layers.quantization.fp8_utils.dispatch_w8a8_block_fp8_linear"
TARGETS = (WO_A_ENABLED, MQA_INIT, MQA_LAYER_INIT, WO_A_MATMUL, FUSED_ROPE_WO_A, FP8_DISPATCH)

ENV_MAX_ROWS = "SGLANG_SM120_DENSE_MAX_ROWS"
# Rows up to which the block-FP8 linear runs our GEMV. On the H200 (benchmarks/fp8_gemv-h200.md) ours
# beats upstream's quant-kernel + FP8 GEMM shape at one row on every linear and is within -12 %..+7 %
# of it per layer at 2..16 rows (with 15x lower error); at 32 rows it is 20-40 % slower.
DEFAULT_MAX_ROWS = 16
ENV_PDL = "SGLANG_SM120_DENSE_PDL"
# programmatic dependent launch of the GEMV (kernels.fp8_gemv.USE_PDL): on by default where the H200 measured it
# faster (benchmarks/fp8_gemv-h200-run9-pdl.summary.md); "0" turns it off, e.g. to rule it out when debugging

# (local wo_a groups, rows) where the H200 measured grouped_fp8_wo_a with the inverse RoPE fused faster than
# a standalone RoPE launch followed by the kernel without it (benchmarks/wo_a_rope-h200-run3.md, with the fp8_gemv
# defaults of runs 11/11b: G=8 M=1 13.40 vs 14.82 us, M=2/3/4/8 0.95-0.96x; G=4 M=1 8.13 vs 10.90, M=2 0.97x;
# G=2 M=1/2 0.65/0.86x; G=1 M=1/2 0.63/0.71x). G=8 rows 5-7 were not timed: they run the same tile and grid as
# 4 and 8. Slower (or equal) at G=4 from 3 rows and at G<=2 from 3 rows. Elsewhere the fused branch still runs
# upstream's own RoPE launch, then the kernel without RoPE.
FUSED_ROPE_WHERE = frozenset({(8, m) for m in range(1, 9)} | {(4, 1), (4, 2), (2, 1), (2, 2), (1, 1), (1, 2)})
FUSED_ROPE_GROUPS = frozenset(g for g, _rows in FUSED_ROPE_WHERE)

# attributes the seam puts on an FP8 wo_a weight Parameter
SCALE_ATTR = "sm120_wo_a_scale"
ROPE_DIMS_ATTR = "sm120_wo_a_rope_dims"  # (head_dim, rope_dim) of the layer, for the fused inverse RoPE
FP8 = torch.float8_e4m3fn
BLOCK = [128, 128]

_log_once = OnceLog("dense")
# every FP8 wo_a weight Parameter the seam adopted, to find the scales of a view not made from it
_adopted: "weakref.WeakSet[torch.Tensor]" = weakref.WeakSet()


def _kernels():
    from .kernels import fp8_gemv

    return fp8_gemv


def active() -> bool:
    return REGISTRY.is_active("dense")


def max_rows() -> int:
    raw = os.environ.get(ENV_MAX_ROWS, "").strip()
    try:
        return int(raw) if raw else DEFAULT_MAX_ROWS
    except ValueError:
        _log_once("bad-env", "%s=%r is not an integer; using %d", ENV_MAX_ROWS, raw, DEFAULT_MAX_ROWS)
        return DEFAULT_MAX_ROWS


def pdl_enabled() -> bool:
    raw = os.environ.get(ENV_PDL, "").strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    _log_once("bad-pdl-env", "%s=%r is not 0 or 1; programmatic dependent launch stays on", ENV_PDL, raw)
    return True


def _apply_pdl_setting() -> None:
    """Called where the seam first routes work to the GEMV (model build), before any kernel runs."""
    enabled = pdl_enabled()
    _kernels().USE_PDL = enabled
    if not enabled:
        _log_once("pdl-off", "programmatic dependent launch of the FP8 GEMV turned off by %s", ENV_PDL)


def _upstream_fp8_wo_a_opted_in() -> bool:
    """Whether upstream runs its own FP8 wo_a GEMM (DeepGEMM fp8_einsum) in this process."""
    import sglang.srt.models.deepseek_v4 as dsv4

    return bool(dsv4._FP8_WO_A_GEMM)


# --- wo_a ------------------------------------------------------------------------------------------


def keeps_wo_a_fp8(quant_config) -> bool:
    """True when the seam keeps ``wo_a`` in the checkpoint's FP8 128x128 block format."""
    if not active() or _upstream_fp8_wo_a_opted_in():
        return False
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    return isinstance(quant_config, Fp8Config) and list(quant_config.weight_block_size or []) == BLOCK


def wo_a_fp8_gemm_enabled_hook(original, quant_config):
    return original(quant_config) or keeps_wo_a_fp8(quant_config)


def adopt_fp8_wo_a(layer) -> bool:
    """After upstream built ``layer`` with an FP8 ``wo_a``: route its forward to the bf16-matmul
    branch (which reaches :func:`wo_a_matmul`) and remember the scale parameter on the weight."""
    wo_a = getattr(layer, "wo_a", None)
    weight = getattr(wo_a, "weight", None)
    if (not getattr(layer, "wo_a_fp8", False) or not active() or _upstream_fp8_wo_a_opted_in()
            or weight is None or weight.dtype != FP8 or not hasattr(wo_a, "weight_scale_inv")):
        return False
    _apply_pdl_setting()
    setattr(weight, SCALE_ATTR, wo_a.weight_scale_inv)  # the Parameter: post_load_weights replaces its .data
    _adopted.add(weight)
    layer.wo_a_fp8 = False
    layer.sm120_fp8_wo_a = True
    _log_once("wo_a", "wo_a kept in FP8 (%s, %.1f MB instead of %.1f MB bf16 per layer)", tuple(weight.shape),
              weight.numel() / 1e6, 2 * weight.numel() / 1e6)
    return True


def mqa_init_hook(original, self, *args, **kwargs):
    original(self, *args, **kwargs)
    adopt_fp8_wo_a(self)


def wo_a_scale(wo_a: torch.Tensor) -> torch.Tensor:
    """The ``[G, R/128, D/128]`` fp32 scales of an FP8 ``wo_a`` view ``[G, R, D]`` of the layer's weight."""
    adopted = _adopted_param(wo_a)  # e.g. a view of weight.data: the adopted weight with the same memory
    param = None if adopted is None else getattr(adopted, SCALE_ATTR)
    if param is None:
        raise RuntimeError("sglang-sm120 dense: FP8 wo_a without recorded block scales (was the layer built "
                           "with the dense seam active?)")
    g, r, d = wo_a.shape
    return param.data.view(g, -(-r // 128), -(-d // 128))


def grouped_wo_a_or_fall_back(o: torch.Tensor, wo_a: torch.Tensor, **rope) -> torch.Tensor:
    """The grouped FP8 kernel on an adopted ``wo_a`` (``rope``: its ``positions`` / ``freqs`` / ``head_dim`` /
    ``rope_dim`` for the fused inverse RoPE). When the kernel raises (a Triton compile or launch error), the call
    takes upstream's computation instead, a bf16 einsum on a transient bf16 copy of the weight (the seam keeps no
    bf16 copy to hand back), logged once per kind of error."""
    k, scale = _kernels(), wo_a_scale(wo_a)
    return run_or_fall_back(_log_once, "the grouped FP8 wo_a", lambda: k.grouped_fp8_wo_a(o, wo_a, scale, **rope),
                            lambda: k.wo_a_dequantised_einsum(o, wo_a, scale, **rope))


def wo_a_fp8_matmul(o: torch.Tensor, wo_a: torch.Tensor) -> torch.Tensor:
    """``o [T, G, D] bf16 x wo_a [G, R, D] e4m3 -> [T, G, R] bf16`` on the grouped FP8 kernel."""
    return grouped_wo_a_or_fall_back(o, wo_a)


def _adopted_param(wo_a: torch.Tensor):
    """The adopted FP8 wo_a weight Parameter ``wo_a`` is a view of, or None."""
    base = wo_a if wo_a._base is None else wo_a._base
    if getattr(base, SCALE_ATTR, None) is not None:
        return base
    return next((w for w in _adopted if w.data_ptr() == wo_a.data_ptr()), None)


def enable_fused_rope_wo_a(layer) -> bool:
    """After ``MQALayer.__init__``: let ``forward`` take upstream's fused inverse-RoPE + wo_a branch
    (``fused_rope_wo_a_bf16``, routed to :func:`fused_rope_wo_a_hook`) for a layer whose FP8 ``wo_a``
    the seam adopted, where the group count has a measured win (``FUSED_ROPE_WHERE``) and the result
    can be exact: not when wo_b may take FlashInfer-swizzled MXFP8 (``use_flashinfer_mxfp8_wo_b``; the
    fused branch would then ask for that format, which the grouped kernel does not produce)."""
    if not getattr(layer, "sm120_fp8_wo_a", False) or not active():
        return False
    import sglang.srt.models.deepseek_v4 as dsv4

    if dsv4._is_hip or dsv4._is_npu:  # their inverse RoPE runs elsewhere (attention kernel, NPU branch)
        return False
    if layer.n_local_groups not in FUSED_ROPE_GROUPS:
        return False
    # use_flashinfer_mxfp8_wo_b is a cached property decided after wo_b loads; its backend is known now
    backend = getattr(getattr(layer.wo_b, "quant_method", None), "mxfp8_dense_backend", None)
    if backend is not None and backend == dsv4.Mxfp8DenseGemmBackend.FLASHINFER_CUTEDSL:
        _log_once("rope-mxfp8", "inverse RoPE stays a separate launch before wo_a: wo_b may consume FlashInfer "
                  "MXFP8 (%s), which the fused branch would have to produce", backend)
        return False
    weight = layer.wo_a.weight
    setattr(weight, ROPE_DIMS_ATTR, (layer.head_dim, layer.qk_rope_head_dim))
    layer.use_fused_wo_a = True
    _log_once("rope", "inverse RoPE folded into the FP8 wo_a kernel at (groups, rows) %s; other rows keep "
              "upstream's RoPE launch", sorted(FUSED_ROPE_WHERE))
    return True


def share_wq_b_sms_with_indexer(layer) -> bool:
    """After ``MQALayer.__init__``: a layer whose indexer SGLang runs on side streams beside the main ``wq_b``
    (``alt_streams`` set: CUDA-graph decode with ``SGLANG_OPT_USE_MULTI_STREAM_OVERLAP``) gets that ``wq_b``'s GEMV
    in its SM-sharing form while a graph is captured (``kernels.fp8_gemv.sharing_config``)."""
    if getattr(layer, "indexer", None) is None or getattr(layer, "alt_streams", None) is None:
        return False
    linear = getattr(getattr(getattr(layer, "wq_b", None), "quant_method", None), "w8a8_block_fp8_linear", None)
    if not isinstance(linear, SmallRowFp8Linear):
        return False
    linear.share_sms = True
    _log_once("share-sms", "wq_b of layers with an indexer on side streams runs its GEMV leaving SMs to the indexer "
              "while CUDA graphs are captured")
    return True


def mqa_layer_init_hook(original, self, *args, **kwargs):
    original(self, *args, **kwargs)
    enable_fused_rope_wo_a(self)
    share_wq_b_sms_with_indexer(self)


def fused_rope_wo_a_hook(original, x, weight, freqs_cis, positions, *args, **kwargs):
    """Upstream's ``fused_rope_wo_a_bf16(x [T, G, D], weight [G, R, D], freqs [P, rope] fp32, positions)``
    -> ``(y [T, G*R],)``, for an adopted FP8 ``wo_a``: the inverse RoPE fused into the grouped FP8 kernel
    where that measured faster, else upstream's in-place ``fused_rope_inplace`` then the kernel without
    it (what the unfused branch runs). Anything else goes to upstream's function."""
    if weight.dtype != FP8 or not active():
        return original(x, weight, freqs_cis, positions, *args, **kwargs)
    rope_dims = getattr(_adopted_param(weight), ROPE_DIMS_ATTR, None)
    if rope_dims is None:  # only enable_fused_rope_wo_a sends an FP8 wo_a down this branch
        raise RuntimeError("sglang-sm120 dense: FP8 wo_a on the fused inverse-RoPE branch of a layer the seam "
                           "did not enable it for")
    out_mxfp8 = kwargs.get("out_mxfp8", args[0] if args else True)
    if out_mxfp8:  # enable_fused_rope_wo_a keeps such layers off this branch
        raise NotImplementedError("sglang-sm120 dense: fused inverse RoPE + FP8 wo_a with MXFP8 output")
    head_dim, rope_dim = rope_dims
    rows, groups = x.shape[0], weight.shape[0]
    if (groups, rows) in FUSED_ROPE_WHERE:
        y = grouped_wo_a_or_fall_back(x, weight, positions=positions, freqs=freqs_cis, head_dim=head_dim,
                                      rope_dim=rope_dim)
    else:
        import sglang.srt.models.deepseek_v4 as dsv4

        heads = x.view(rows, -1, head_dim)  # upstream's o [T, H, head_dim], rotated in place as it does
        dsv4.fused_rope_inplace(heads[..., -rope_dim:], None, torch.view_as_complex(freqs_cis.view(
            freqs_cis.shape[0], -1, 2)), positions=positions, inverse=True)
        y = grouped_wo_a_or_fall_back(x, weight)
    return (y.view(rows, -1),)


def wo_a_matmul_hook(original, o, wo_a, *args, **kwargs):
    if wo_a.dtype != FP8 or not active():
        return original(o, wo_a, *args, **kwargs)
    unsupported = [k for k in ("fuse_mxfp8_quant", "fp8_grid", "emit_fp8") if kwargs.get(k)]
    if unsupported:  # FlashInfer-MXFP8 wo_b / ROCm routes; not taken by DSv4 on sm_120
        raise NotImplementedError(f"sglang-sm120 dense: FP8 wo_a with {unsupported}")
    return wo_a_fp8_matmul(o, wo_a)


# --- block-FP8 linear ------------------------------------------------------------------------------


class SmallRowFp8Linear:
    """SGLang's block-FP8 linear with bf16 activations of 1..max_rows rows sent to our GEMV."""

    def __init__(self, upstream, rows: int):
        self.upstream = upstream
        self.max_rows = rows
        self.share_sms = False  # share_wq_b_sms_with_indexer
        self.__name__ = f"sm120_small_row({getattr(upstream, '__name__', upstream)})"

    def covers(self, x, weight, block_size, weight_scale, input_scale, bias, extra) -> bool:
        if input_scale is not None or extra or not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
            return False
        if not active() or list(block_size or []) != BLOCK or weight.dtype != FP8 or weight.dim() != 2:
            return False
        n, k = weight.shape
        if x.dim() == 0 or x.shape[-1] != k or weight_scale.dtype != torch.float32:
            return False
        if tuple(weight_scale.shape) != (-(-n // 128), -(-k // 128)) or weight_scale.stride(-1) != 1:
            return False
        rows = x.numel() // k if k else 0
        if not 1 <= rows <= self.max_rows:
            return False
        if bias is not None and (bias.dtype != torch.bfloat16 or bias.shape[-1] != n):
            return False
        return kernels_runnable(x) and weight.stride(-1) == 1 and x.stride(-1) == 1

    def __call__(self, input, weight, block_size, weight_scale, input_scale=None, bias=None, **extra):
        def upstream():
            return self.upstream(input=input, weight=weight, block_size=block_size, weight_scale=weight_scale,
                                 input_scale=input_scale, bias=bias, **extra)

        if not self.covers(input, weight, block_size, weight_scale, input_scale, bias, extra):
            return upstream()
        # the indexer's side streams run beside it only in captured decode (SGLang's enable_multi_stream)
        share = self.share_sms and torch.cuda.is_current_stream_capturing()

        def ours():
            y = _kernels().block_fp8_linear(input, weight, weight_scale, share_sms=share)
            return y if bias is None else y.add_(bias)

        return run_or_fall_back(_log_once, "the block-FP8 GEMV", ours, upstream)


def _wraps_safely(linear) -> bool:
    """Upstream runners whose weight processing keeps plain [N/128, K/128] fp32 scales."""
    from sglang.srt.layers.quantization import fp8_utils

    fn = getattr(linear, "func", linear)
    rewrites = {getattr(fp8_utils, name, None) for name in (
        "deepgemm_w8a8_block_fp8_linear_with_fallback", "aiter_w8a8_block_fp8_linear",
        "flashinfer_deepgemm_w8a8_block_fp8_linear_with_fallback")}
    return fn not in rewrites


def dispatch_hook(original, *args, **kwargs):
    linear = original(*args, **kwargs)
    block = kwargs.get("weight_block_size", args[0] if args else None)
    if not active() or list(block or []) != BLOCK or not _wraps_safely(linear):
        return linear
    _apply_pdl_setting()
    _log_once("linear", "block-FP8 linears with 1..%d bf16 rows run the Triton GEMV; more rows stay on %s",
              max_rows(), getattr(linear, "__name__", linear))
    return SmallRowFp8Linear(linear, max_rows())


# --- seam --------------------------------------------------------------------------------------------


def install() -> None:
    install_hooks([
        (WO_A_ENABLED, wo_a_fp8_gemm_enabled_hook, "AROUND"),
        (MQA_INIT, mqa_init_hook, "AROUND"),
        (MQA_LAYER_INIT, mqa_layer_init_hook, "AROUND"),
        (WO_A_MATMUL, wo_a_matmul_hook, "AROUND"),
        (FUSED_ROPE_WO_A, fused_rope_wo_a_hook, "AROUND"),
        (FP8_DISPATCH, dispatch_hook, "AROUND"),
    ])


def make_seam() -> Seam:
    return Seam(
        name="dense",
        description="dense FP8 projections: wo_a kept in FP8 on a grouped kernel, block-FP8 GEMV for small M",
        targets=TARGETS,
        install=install,
    )
