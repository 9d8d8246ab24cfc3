"""The ``moe`` seam: ``--moe-runner-backend sm120`` (and ``--speculative-moe-runner-backend sm120``).

SGLang pieces used (0.5.23, see ``shared/reference/dsv4-flash-in-sglang-0.5.23.md`` §3.2):

* the name: ``add_moe_runner_backend_choices`` (argparse choices of both ``--moe-runner-backend``
  and ``--speculative-moe-runner-backend``) and ``register_moe_runner_core`` (runtime name plus a
  :class:`~sglang.srt.layers.moe.moe_runner.base.DispatchMoeRunnerCore` that runs our kernels);
* the dispatch: an AROUND hook on ``Fp8Config.get_quant_method``. For a ``FusedMoE`` layer with
  DeepSeek-V4 FP4 experts while the resolved runner backend is ``sm120`` (the draft model's
  backend while SGLang builds the MTP layer) it returns :class:`Sm120Mxfp4MoEMethod` when the
  ``moe`` seam is active and the layer is covered; otherwise upstream's MXFP4 method, i.e. what
  ``flashinfer_mxfp4`` (the backend ``auto`` resolves to for DSv4) gives on this platform, with a
  one-time log line saying why. Every other call goes to the original untouched.

The name and the dispatch are installed by :func:`register_backend_name` in every SGLang process
(``plugin.register``), whether or not the seam is active, so the flag always parses and always
works. The seam's own install is that same idempotent call: the dispatch reads
``REGISTRY.is_active("moe")`` at call time.

The routed experts' kernels are ``sglang_sm120.kernels.moe_mxfp4``; the shared expert, the gate
and the router stay upstream's.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from .seams import REGISTRY, OnceLog, Seam, run_or_fall_back

logger = logging.getLogger("sglang_sm120")

BACKEND_NAME = "sm120"
DISPATCH_TARGET = "sglang.srt.layers.quantization.fp8.Fp8Config.get_quant_method"
UPSTREAM_BACKEND = "flashinfer_mxfp4"  # what `auto` resolves to for DSv4 FP4 experts on sm_90/100/120

_registered = False
_logged_reasons: set[str] = set()


# ---------------------------------------------------------------------------------------------
# name + dispatch
# ---------------------------------------------------------------------------------------------
def register_backend_name() -> None:
    """Make ``sm120`` a valid MoE runner backend (CLI and runtime) and install the dispatch.

    Idempotent; safe in every SGLang process.
    """
    global _registered
    if _registered:
        return
    from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES, add_moe_runner_backend_choices
    from sglang.srt.layers.moe.moe_runner import runner

    from .hooks import install_hooks

    if BACKEND_NAME not in MOE_RUNNER_BACKEND_CHOICES:
        add_moe_runner_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in runner._CUSTOM_RUNNER_CORE_FACTORIES:
        runner.register_moe_runner_core(BACKEND_NAME, _make_runner_core)
    install_hooks([(DISPATCH_TARGET, _get_quant_method_around, "AROUND")])
    _registered = True


_log_kernel_errors = OnceLog("moe")  # the forward's fallbacks, once per kind of error


def _log_once(reason: str) -> None:
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        logger.warning("sglang-sm120: --moe-runner-backend %s uses upstream's MXFP4 MoE method (%s) because %s",
                       BACKEND_NAME, UPSTREAM_BACKEND, reason)


def uncovered_reason(quant_config, layer) -> str | None:
    """Why this FP4-expert layer cannot run on the plugin's kernels (None when it can)."""
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend

    if not REGISTRY.is_active("moe"):
        try:
            seam = REGISTRY.get("moe")
            why = seam.status_line()
        except KeyError:
            why = "moe: not registered"
        return f"the moe seam is not active ({why})"
    if not getattr(quant_config, "is_dsv4_fp4_experts", False):
        return "the checkpoint's FP4 experts are not DeepSeek-V4's"
    if getattr(quant_config, "dequant_fp4_to_fp8", False):
        return "SGLANG_DSV4_FP4_DEQUANT=1 asks for FP8-dequantised experts"
    if getattr(layer, "moe_ep_size", 1) > 1:
        return f"expert parallelism is on (ep_size={layer.moe_ep_size}); the kernels hold all experts of a rank"
    a2a = get_moe_a2a_backend()
    if not a2a.is_none():
        return f"--moe-a2a-backend {a2a.value} is not covered"
    cfg = layer.moe_runner_config
    if cfg.gemm1_alpha is not None or cfg.gemm1_clamp_limit is not None:
        return "the layer's activation is not DSv4's clamped SwiGLU"
    if cfg.activation != "silu" or not cfg.is_gated or getattr(layer, "with_bias", False):
        return f"activation {cfg.activation!r} (gated={cfg.is_gated}, bias={layer.with_bias}) is not covered"
    if cfg.apply_router_weight_on_input or cfg.no_combine:
        return "apply_router_weight_on_input / no_combine are not covered"
    hidden, inter = layer.hidden_size, layer.intermediate_size_per_partition
    if hidden % 256 or not (inter % 256 == 0 or inter in (32, 64, 128)):
        return f"hidden {hidden} / per-rank intermediate {inter} are not multiples the kernels tile"
    if getattr(layer, "num_fused_shared_experts", 0):
        return "fused shared experts are not covered"
    return None


def _get_quant_method_around(original, quant_config, layer, prefix):
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    if not (isinstance(layer, FusedMoE) and getattr(quant_config, "is_fp4_experts", False)
            and get_moe_runner_backend().value == BACKEND_NAME):
        return original(quant_config, layer, prefix)
    from sglang.srt.layers.quantization.utils import is_layer_skipped

    if is_layer_skipped(prefix, quant_config.ignored_layers, fused_mapping=quant_config.packed_modules_mapping):
        return original(quant_config, layer, prefix)
    reason = uncovered_reason(quant_config, layer)
    if reason is None:
        from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod

        return Sm120Mxfp4MoEMethod(Fp8MoEMethod(quant_config), prefix=prefix)
    _log_once(reason)
    return upstream_quant_method(original, quant_config, layer, prefix)


dispatch_quant_method = _get_quant_method_around  # (original, quant_config, layer, prefix): patches/moe.diff


def upstream_quant_method(original, quant_config, layer, prefix):
    """Upstream's own choice for these experts: ``get_quant_method`` run as if the backend were
    ``flashinfer_mxfp4`` (``auto`` for the FP8-dequant mode). The method builds its own
    ``MoeRunner`` with its own backend, so the global ``sm120`` name does not reach it."""
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    from sglang.srt.runtime_context import get_flags

    backend = (MoeRunnerBackend.AUTO if getattr(quant_config, "dequant_fp4_to_fp8", False)
               else MoeRunnerBackend(UPSTREAM_BACKEND))
    with get_flags().moe.override(runner_backend=backend):
        return original(quant_config, layer, prefix)


# ---------------------------------------------------------------------------------------------
# runner core + quant method
# ---------------------------------------------------------------------------------------------
def _make_runner_core(config):
    from sglang.srt.layers.moe.moe_runner.base import DispatchMoeRunnerCore

    class Sm120Mxfp4RunnerCore(DispatchMoeRunnerCore):
        """Runs the routed experts from SGLang's standard dispatch output."""

        @property
        def runner_backend(self):
            from sglang.srt.layers.moe.utils import resolve_moe_runner_backend

            return resolve_moe_runner_backend(BACKEND_NAME)

        def run_from_dispatch(self, dispatch_output, quant_info, runner_config, hooks=None):
            from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput

            from .kernels import moe_mxfp4

            topk = dispatch_output.topk_output
            hidden_states = dispatch_output.hidden_states
            if dispatch_output.hidden_states_scale is not None:
                raise ValueError("sm120 MoE takes bf16 hidden states, got pre-quantised ones")
            x = hidden_states if hidden_states.dtype == torch.bfloat16 else hidden_states.to(torch.bfloat16)
            x = x.contiguous()
            weights = (quant_info.w13_weight, quant_info.w13_scale, quant_info.w2_weight, quant_info.w2_scale,
                       topk.topk_weights, topk.topk_ids)
            limit = float(runner_config.swiglu_limit or 0.0)
            # the weights are repacked for our kernels, so upstream's method cannot take a call they fail: a torch
            # path over the same repacked experts does (slow; logged once per kind of error)
            out = run_or_fall_back(
                _log_kernel_errors, "the sm120 MoE kernels",
                lambda: moe_mxfp4.moe_mxfp4_forward(x, *weights, swiglu_limit=limit,
                                                    wide_scales=quant_info.wide_scales),
                lambda: moe_mxfp4.moe_mxfp4_dequantised_forward(x, *weights, swiglu_limit=limit))
            return StandardCombineInput(hidden_states=out.to(hidden_states.dtype))

    return Sm120Mxfp4RunnerCore(config)


def _quant_info_class():
    from sglang.srt.layers.moe.moe_runner.base import MoeQuantInfo

    @dataclasses.dataclass
    class Sm120Mxfp4QuantInfo(MoeQuantInfo):
        w13_weight: torch.Tensor  # [E, 2I, H/2] int8, rows interleaved (gate_i, up_i)
        w13_scale: torch.Tensor  # [E, 2I, H/32] E8M0, same row order
        w2_weight: torch.Tensor  # [E, H, I/2] int8
        w2_scale: torch.Tensor  # [E, H, I/32] E8M0
        wide_scales: bool = False  # E8M0 bytes outside the pairs decode's exact range: the forward avoids it

    return Sm120Mxfp4QuantInfo


class Sm120Mxfp4MoEMethod:
    """DeepSeek-V4 MXFP4 routed experts on the plugin's Triton kernels (shaped like upstream's
    ``Mxfp4MarlinMoEMethod``): checkpoint tensors exactly as upstream creates them, w13 rows
    repacked in place after loading, ``apply`` returning SGLang's ``StandardCombineInput``."""

    fuse_routed_scaling_factor_in_topk = True  # top-k weights carry the 1.5 routed scale

    def __init__(self, fp8_method, prefix: str):
        self._fp8 = fp8_method
        self.prefix = prefix
        self.runner = None
        self.repack_report: dict | None = None
        self.wide_scales = False  # set at load time from the checkpoint's E8M0 bytes

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                       **extra_weight_attrs):
        # upstream's FP4-expert tensors (w13 [E,2I,H/2], w2 [E,H,I/2], E8M0 scales per 32), loaded
        # in the default [gate; up] row order; scales stay native E8M0 (one byte)
        self._fp8.create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                                 fp4_scale_dtype=torch.float8_e8m0fnu, **extra_weight_attrs)

    def create_moe_runner(self, layer, moe_runner_config):
        from sglang.srt.layers.moe.moe_runner import MoeRunner
        from sglang.srt.layers.moe.utils import resolve_moe_runner_backend

        self.moe_runner_config = moe_runner_config
        self.runner = MoeRunner(resolve_moe_runner_backend(BACKEND_NAME), moe_runner_config)

    def get_moe_runner_backend(self, layer):
        return self.runner.runner_backend

    def get_moe_routing_method_type(self, layer, requested_method):
        return requested_method

    def process_weights_after_loading(self, layer) -> None:
        # Upstream's Fp8MoEMethod post-load step only re-views FP4 weights as int8 on CUDA (its
        # other branches are ROCm/NPU/DeepGEMM/CPU-AMX), so it is not called here.
        from .kernels.moe_mxfp4 import PAIRS_EXACT_SCALE_BYTES, pairs_exact_for, repack_w13_, scale_byte_range

        if getattr(layer, "_mega_moe_weights_built", False):
            return
        tensors = [layer.w13_weight, layer.w13_weight_scale_inv, layer.w2_weight, layer.w2_weight_scale_inv]
        for t in tensors:
            if not t.data.is_contiguous():
                raise ValueError(f"{self.prefix}: sm120 MoE expects contiguous expert tensors")
        # the pairs decode and the prefill GEMM are exact only for E8M0 bytes in PAIRS_EXACT_SCALE_BYTES; a layer
        # whose scales reach outside runs the forms that apply the factor in float32 (slower from B = 16 on)
        byte_range = scale_byte_range(layer.w13_weight_scale_inv.data, layer.w2_weight_scale_inv.data)
        self.wide_scales = not pairs_exact_for(byte_range)
        if self.wide_scales:
            logger.warning("sglang-sm120: %s: the experts' E8M0 scale bytes span %d..%d, outside %d..%d where the "
                           "sm120 pairs decode and prefill GEMM are exact; this layer runs the GEMV and tl.dot forms "
                           "only (exact for every byte, slower from 16 tokens on)", self.prefix, *byte_range,
                           *PAIRS_EXACT_SCALE_BYTES)
        before = sum(t.data.untyped_storage().nbytes() for t in tensors)
        ptrs = [t.data.data_ptr() for t in tensors]
        cuda = layer.w13_weight.is_cuda
        allocated = torch.cuda.memory_allocated(layer.w13_weight.device) if cuda else None
        repack_w13_(layer.w13_weight.data, layer.w13_weight_scale_inv.data)
        after = sum(t.data.untyped_storage().nbytes() for t in tensors)
        self.repack_report = {
            "bytes_before": before, "bytes_after": after,
            "same_storage": ptrs == [t.data.data_ptr() for t in tensors],
            "scratch_bytes": layer.w13_weight[0].numel() * layer.w13_weight.element_size(),
            "cuda_allocated_delta": (torch.cuda.memory_allocated(layer.w13_weight.device) - allocated) if cuda else None,
        }
        layer._dsv4_mxfp4_backend = BACKEND_NAME
        logger.info("sglang-sm120: %s experts repacked in place for the sm120 MoE kernels: %.1f MB before, "
                    "%.1f MB after, one expert (%.1f MB) of scratch", self.prefix, before / 1e6, after / 1e6,
                    self.repack_report["scratch_bytes"] / 1e6)

    def apply(self, layer, dispatch_output):
        from sglang.srt.layers.moe.topk import TopKOutputChecker

        topk_output = dispatch_output.topk_output
        if not TopKOutputChecker.format_is_standard(topk_output):
            raise ValueError(f"sm120 MoE needs the standard top-k output, got {topk_output.format}")
        quant_info = _quant_info_class()(
            w13_weight=layer.w13_weight.data, w13_scale=layer.w13_weight_scale_inv.data,
            w2_weight=layer.w2_weight.data, w2_scale=layer.w2_weight_scale_inv.data, wide_scales=self.wide_scales)
        return self.runner.run(dispatch_output, quant_info)


# ---------------------------------------------------------------------------------------------
# seam
# ---------------------------------------------------------------------------------------------
def make_seam() -> Seam:
    return Seam(
        name="moe",
        description=("--moe-runner-backend sm120 (and --speculative-moe-runner-backend sm120): DeepSeek-V4 MXFP4 "
                     "routed experts on Triton kernels (sglang_sm120.kernels.moe_mxfp4) via an AROUND hook on "
                     "Fp8Config.get_quant_method. The name and the dispatch are installed in every process by "
                     "register_backend_name(); the dispatch reads this seam's state at call time, so install "
                     "only re-runs that idempotent registration. Inactive, or for layers the kernels do not "
                     "cover (EP, a2a, other activations), sm120 runs upstream's flashinfer_mxfp4 method."),
        targets=(DISPATCH_TARGET,),
        install=register_backend_name,
    )
