"""The ``attention`` seam: DeepSeek-V4 sparse MLA decode on ``sglang_sm120.kernels.sparse_mla_decode``.

SGLang 0.5.23 pieces (``shared/reference/dsv4-flash-in-sglang-0.5.23.md`` §2.1, §1.3):

* ``sglang.kernels.ops.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120(**kwargs)`` is what
  ``DeepseekV4AttnBackend._forward_attention`` calls on sm_120 (it imports the module attribute
  inside the function on every call, so a REPLACE hook is picked up). Our wrapper runs our kernel
  for every call it covers: the V4 584-byte KV layout for the main and the extra cache, bf16
  ``q [B, s_q, 1..64 heads, 512]``, int32 token-slot indices, ``head_dim_v`` 512, at most 65535 query
  rows. Anything else (for example the V4.1 528/288-byte formats, or 128 heads) goes to upstream's
  original with a one-time log line per reason. Upstream's FlashInfer path copies every referenced
  256-token SWA page into 64-token pages first and returns no LSE; ours reads the pages in place and
  returns the LSE like upstream's torch fallback.
* ``flashinfer_dsv4_decode_supports_num_heads(num_heads, num_tokens)`` decides in
  ``MQALayer._kernel_num_heads`` whether a TP>1 rank keeps its native head count (64/T) or pads
  ``q`` to 64 heads. Ours takes 1..64 heads natively, so the hook answers True for those and asks
  upstream's probe otherwise. Upstream's probe does *not* raise with the pinned FlashInfer 0.7.2:
  its ``_DECODE_DSV4_DISPATCH`` is a ``_DecodeDispatchEnvelope`` that iterates as ``(heads, topk)``
  pairs, so the probe answers {8, 16, 32, 64, 128} for <= 64 tokens (checked in the tests); the
  hook still guards the call, since a later FlashInfer may change that private object again.
  Note ``_kernel_num_heads`` only asks the probe while ``SGLANG_SM120_FLASHMLA_BACKEND`` is
  ``flashinfer`` (the default); with ``triton``/``torch`` SGLang pads to 64 heads and our kernel
  runs the padded heads.
"""

from __future__ import annotations

import logging

from .seams import REGISTRY, OnceLog, Seam, kernels_runnable, not_runnable_reason, reason_key

logger = logging.getLogger("sglang_sm120")

MODULE = "sglang.kernels.ops.attention.flash_mla_sm120"
TARGET = f"{MODULE}.flash_mla_with_kvcache_sm120"
PROBE_TARGET = f"{MODULE}.flashinfer_dsv4_decode_supports_num_heads"

_upstream: dict = {}  # the originals, captured before the hooks replace them
_log_once = OnceLog("attention")


def uncovered_reason(kwargs: dict) -> str | None:
    """Why our kernel does not take this call (None when it does). Cheap host-side checks on
    the formats; anything subtler is caught as the kernel's ValueError."""
    from .kernels.dsv4 import HEAD_DIM, KV_TOKEN_BYTES, SPARSE_MLA_MAX_HEADS

    if not REGISTRY.is_active("attention"):  # e.g. marked failed after a partial install
        return "seam not active"
    q = kwargs.get("q")
    if q is None or q.dim() != 4 or q.shape[-1] != HEAD_DIM:
        return f"q is not [B, s_q, H, {HEAD_DIM}]"
    if not kernels_runnable(q):
        return not_runnable_reason(q)
    if not 1 <= q.shape[2] <= SPARSE_MLA_MAX_HEADS:
        return f"{q.shape[2]} heads (ours takes 1..{SPARSE_MLA_MAX_HEADS})"
    for name in ("k_cache", "extra_k_cache"):
        cache = kwargs.get(name)
        if cache is not None and cache.shape[-1] != KV_TOKEN_BYTES:
            return f"{name} has {cache.shape[-1]} bytes per token (ours reads the V4 {KV_TOKEN_BYTES}-byte layout)"
    if kwargs.get("head_dim_v") != HEAD_DIM:
        return f"head_dim_v {kwargs.get('head_dim_v')}"
    return None


def _fallback(reason: str, kwargs: dict, level: int = logging.INFO):
    _log_once(f"fallback:{reason_key(reason)}", "upstream's flash_mla_with_kvcache_sm120 runs this call (%s); "
              "logged once per kind of reason", reason, level=level)
    return _upstream["decode"](**kwargs)


def flash_mla_with_kvcache_sm120(**kwargs):
    """Drop-in for SGLang's ``flash_mla_with_kvcache_sm120``: ``(out [B, s_q, H, 512] bf16,
    lse [B, H, s_q] fp32)`` from our kernel when it covers the call, upstream's result otherwise."""
    reason = uncovered_reason(kwargs)
    if reason is not None:
        return _fallback(reason, kwargs)
    from .kernels.sparse_mla_decode import sparse_mla_decode

    try:
        return sparse_mla_decode(
            kwargs["q"], kwargs["k_cache"], kwargs["indices"], kwargs.get("topk_length"), kwargs.get("attn_sink"),
            kwargs["head_dim_v"], kwargs.get("softmax_scale"), kwargs.get("extra_k_cache"),
            kwargs.get("extra_indices_in_kvcache"), kwargs.get("extra_topk_length"))
    except ValueError as exc:  # a layout the kernel refuses before launching anything
        return _fallback(str(exc), kwargs)
    except Exception as exc:  # a Triton compile or launch error (e.g. OutOfResources): keep the server running
        return _fallback(f"our kernel raised {type(exc).__name__}: {exc}", kwargs, level=logging.WARNING)


def supports_num_heads(num_heads: int, num_tokens: int) -> bool:
    """Replacement for ``flashinfer_dsv4_decode_supports_num_heads``: our kernel runs 1..64 heads
    at their native width for any token count; otherwise upstream's probe answers (fail-closed)."""
    from .kernels.dsv4 import SPARSE_MLA_MAX_HEADS

    if 1 <= num_heads <= SPARSE_MLA_MAX_HEADS:
        return True
    try:
        return bool(_upstream["probe"](num_heads, num_tokens))
    except Exception:  # FlashInfer's private dispatch tables change between releases
        return False


def install() -> None:
    from .hooks import install_hooks, resolve

    _upstream.setdefault("decode", getattr(resolve(TARGET), "__wrapped__", resolve(TARGET)))
    _upstream.setdefault("probe", getattr(resolve(PROBE_TARGET), "__wrapped__", resolve(PROBE_TARGET)))
    install_hooks([(TARGET, flash_mla_with_kvcache_sm120, "REPLACE"),
                   (PROBE_TARGET, supports_num_heads, "REPLACE")])


def make_seam() -> Seam:
    return Seam(
        name="attention",
        description=("DSv4 sparse MLA decode (flash_mla_with_kvcache_sm120) on sglang_sm120.kernels.sparse_mla_decode: "
                     "all heads on the MMA M dimension, SWA/C4/C128 pages read in place, sink and both caches in "
                     "one launch; native head counts 1..64 for TP>1 via the head-count probe. Calls it does not "
                     "cover go to upstream with a one-time log line."),
        targets=(TARGET, PROBE_TARGET),
        install=install,
    )
