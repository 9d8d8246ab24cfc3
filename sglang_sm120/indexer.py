"""The ``indexer`` seam: DSv4-Flash's C4 lightning indexer (FP8 paged MQA logits + top-512) on our
Triton kernels (``sglang_sm120.kernels.indexer``).

Hooks (SGLang 0.5.23, ``srt/layers/attention/dsv4/indexer.py:855-998``):

* the logits functions the C4 indexer picks on sm_120 -- ``tilelang_fp8_paged_mqa_logits`` (default)
  and ``fp8_paged_mqa_logits_torch_sm120`` -- AROUND: same contract, our logits kernel;
* ``topk_transform_paged`` (imported by the indexer module at import; HookRegistry rebinds that
  name too) AROUND: our chunked select + merge;
* ``C4IndexerBackendMixin.forward_c4_indexer`` AROUND: marks the call as one whose logits go
  straight into ``topk_transform_paged`` (default top-k backend, FP8 indexer). Inside it, for shapes
  where :func:`~sglang_sm120.kernels.indexer.choose_plan` picks the fused path or the histogram
  select, the logits hook returns a zero-byte placeholder and the top-k hook runs that plan (the
  fused kernel never writes the logits row; the histogram select needs the logits kernel to count
  its first histogram).

Anything not covered (FP4 indexer, other head/page sizes, s_q > 1, k > 1024, a CPU tensor outside
the interpreter, ...) goes to SGLang's own function, with one log line per reason.

MTP target-verify steps are covered: SGLang's C4 indexer scores every draft token as its own query
row, with its own compressed length and a copy of its request's page-table row (``q =
q_indexer.unsqueeze(1)`` at indexer.py:848, ``query_rows`` at :882), so the logits function always
sees s_q = 1 there; the s_q > 1 fallback only guards other callers.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import os

import torch

from .hooks import install_hooks, resolve
from .seams import REGISTRY, OnceLog, Seam, kernels_runnable, not_runnable_reason, reason_key, run_or_fall_back

logger = logging.getLogger("sglang_sm120")

TILELANG_LOGITS = "sglang.kernels.ops.attention.dsa.tilelang_kernel.tilelang_fp8_paged_mqa_logits"
TORCH_LOGITS = "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120"
TOPK = "sglang.kernels.ops.attention.dsv4.topk.topk_transform_paged"
FORWARD_C4 = "sglang.srt.layers.attention.dsv4.indexer.C4IndexerBackendMixin.forward_c4_indexer"
TARGETS = (TILELANG_LOGITS, TORCH_LOGITS, TOPK, FORWARD_C4)

ENV_PATH = "SGLANG_SM120_INDEXER_PATH"  # auto (decision table) | fused | two_kernel

_fusable = contextvars.ContextVar("sglang_sm120_indexer_fusable", default=False)
_log_once = OnceLog("indexer")


@dataclasses.dataclass
class _Deferred:
    """Logits owed to the next top-k call: the placeholder handed to SGLang and the inputs."""

    placeholder: torch.Tensor
    args: tuple
    plan: object  # kernels.indexer.Plan the top-k call runs
    upstream_logits: object  # () -> SGLang's logits for these inputs (its function, as the call came in)


_pending: _Deferred | None = None


def _kernels():
    from .kernels import indexer

    return indexer


def logits_uncovered(q, kv, weights, seq_lens, page_table, max_seq_len, clean_logits) -> str | None:
    """Why our logits kernel cannot serve this call (None when it can)."""
    ix = _kernels()
    if not isinstance(q, torch.Tensor):
        return "FP4 indexer query (q is a tuple)"
    if not REGISTRY.is_active("indexer"):
        return "seam not active"
    if clean_logits:
        return "clean_logits=True"
    if q.dim() == 4 and q.shape[1] != 1:
        return f"s_q={q.shape[1]} (only 1 is covered)"
    if not kernels_runnable(q):
        return not_runnable_reason(q)
    if seq_lens.dim() == 2 and seq_lens.shape[1] == 1:
        seq_lens = seq_lens[:, 0]
    try:
        ix.validate_logits_inputs(q, kv, weights, seq_lens, page_table, int(max_seq_len))
    except ValueError as exc:
        return str(exc)
    return None


def topk_uncovered(scores, seq_lens, page_tables, out, page_size, raw) -> str | None:
    if not REGISTRY.is_active("indexer"):
        return "seam not active"
    if not isinstance(scores, torch.Tensor):
        return "scores is not a tensor"
    if not kernels_runnable(scores):
        return not_runnable_reason(scores)
    try:
        _kernels().validate_topk_inputs(scores, seq_lens, page_tables, out, page_size, raw)
    except ValueError as exc:
        return str(exc)
    return None


def _path_override() -> str:
    value = os.environ.get(ENV_PATH, "auto").strip().lower()
    if value not in ("auto", "fused", "two_kernel"):
        _log_once(f"bad-env:{value}", "%s=%r is not auto, fused or two_kernel; using auto", ENV_PATH, value,
                  level=logging.WARNING)
    return value if value in ("fused", "two_kernel") else "auto"


def _deferred_plan(batch: int, max_seq_len: int):
    """The plan whose logits are better produced by the top-k call itself (the fused path, or the
    histogram select whose first histogram the logits kernel counts), else None."""
    ix = _kernels()
    override = _path_override()
    if override == "two_kernel":
        return None
    plan = ix.choose_plan(batch, max_seq_len)
    if override == "fused":
        return plan if plan.path == "fused" else ix.Plan("fused", ix.FUSED_SPLIT_PAGES[1])
    return plan if plan.path == "fused" or plan.select.method == "histogram" else None


def logits_hook(original, q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                clean_logits=True):
    global _pending
    why = logits_uncovered(q_fp8, kvcache_fp8, weight, seq_lens, page_table, max_seq_len, clean_logits)
    if why is not None:
        _log_once(f"logits:{reason_key(why)}", "SGLang's logits function kept for this call: %s", why)
        return original(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                        clean_logits)
    upstream_args = (q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len, clean_logits)

    def upstream_logits():
        return original(*upstream_args)

    if seq_lens.dim() == 2:
        seq_lens = seq_lens[:, 0]
    max_seq_len = int(max_seq_len)
    args = (q_fp8, kvcache_fp8, weight, seq_lens, page_table, max_seq_len)
    plan = _deferred_plan(q_fp8.shape[0], max_seq_len) if _fusable.get() else None
    if plan is not None:
        # Zero bytes: the scores are produced by the top-k call that follows (fused: as candidates
        # only; histogram select: the logits kernel with its histogram, then the select).
        placeholder = torch.full((1, 1), float("-inf"), device=q_fp8.device).expand(q_fp8.shape[0], max_seq_len)
        _pending = _Deferred(placeholder, args, plan, upstream_logits)
        if plan.path == "fused":
            _log_once("fused", "fused logits+top-k path in use (first shape B=%d, len=%d, %d pages/split)",
                      q_fp8.shape[0], max_seq_len, plan.split_pages)
        else:
            _log_once("histogram", "logits kernel with histogram select in use (first shape B=%d, len=%d)",
                      q_fp8.shape[0], max_seq_len)
        return placeholder
    _log_once("two_kernel", "Triton logits kernel in use (first shape B=%d, len=%d)", q_fp8.shape[0], max_seq_len)
    return run_or_fall_back(_log_once, "the logits kernel", lambda: _kernels().paged_mqa_logits(*args),
                            upstream_logits)


def topk_hook(original, scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None):
    global _pending
    ix = _kernels()
    deferred = None
    if _pending is not None and scores is _pending.placeholder:
        deferred, _pending = _pending, None
    if deferred is not None:
        shape_only = torch.empty(out_page_indices.shape[0], 0, device=scores.device)
        why = topk_uncovered(shape_only, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
        if why is None:
            def ours():
                ix.indexer_topk(*deferred.args, out_page_indices, out_raw_indices, plan=deferred.plan)

            def upstream():  # SGLang's logits and top-k for the same call
                original(deferred.upstream_logits(), seq_lens, page_tables, out_page_indices, page_size,
                         out_raw_indices)

            run_or_fall_back(_log_once, "the fused logits + top-k", ours, upstream)
            return None
        # The top-k call is not ours after all: materialise the logits for SGLang's top-k.
        _log_once(f"topk:{reason_key(why)}", "SGLang's top-k kept for this call: %s", why)
        scores = run_or_fall_back(_log_once, "the logits kernel", lambda: ix.paged_mqa_logits(*deferred.args),
                                  deferred.upstream_logits)
        return original(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
    why = topk_uncovered(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
    if why is not None:
        _log_once(f"topk:{reason_key(why)}", "SGLang's top-k kept for this call: %s", why)
        return original(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
    _log_once("topk", "Triton top-k in use")

    def ours():
        ix.topk_transform_paged(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)

    def upstream():
        original(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)

    run_or_fall_back(_log_once, "the top-k kernel", ours, upstream)
    return None


def fusable_call(backend, c4_indexer) -> bool:
    """Whether this forward_c4_indexer call hands the logits straight to ``topk_transform_paged``."""
    topk_backend = getattr(backend, "dsa_topk_backend", None)
    if topk_backend is None or getattr(c4_indexer, "use_fp4_indexer", True):
        return False
    if getattr(backend, "debug_use_external_c4_sparse_indices", False):
        return False
    return not (topk_backend.is_torch() or topk_backend.is_flashinfer() or topk_backend.should_use_topk_v2())


def forward_c4_indexer_hook(original, self, *args, **kwargs):
    c4_indexer = kwargs.get("c4_indexer", args[2] if len(args) > 2 else None)
    token = _fusable.set(fusable_call(self, c4_indexer))
    try:
        return original(self, *args, **kwargs)
    finally:
        _fusable.reset(token)


def route(logits_fn, topk_fn, backend, c4_indexer):
    """Entry point of ``patches/indexer.diff`` (for a patched SGLang source tree instead of runtime
    hooks): SGLang's chosen logits and ``topk_transform_paged`` functions, wrapped exactly like the
    hooks (the originals serve uncovered calls); returned unchanged when the seam is not active."""
    if not REGISTRY.is_active("indexer"):
        return logits_fn, topk_fn
    fusable = fusable_call(backend, c4_indexer)

    def logits(*args, **kwargs):
        token = _fusable.set(fusable)
        try:
            return logits_hook(logits_fn, *args, **kwargs)
        finally:
            _fusable.reset(token)

    def topk(*args, **kwargs):
        return topk_hook(topk_fn, *args, **kwargs)

    return logits, topk


# (target, hook, required): the TileLang module needs tilelang importable; without it SGLang cannot
# pick that function either, so the seam goes on without that hook.
HOOKS = (
    (TILELANG_LOGITS, logits_hook, False),
    (TORCH_LOGITS, logits_hook, True),
    (TOPK, topk_hook, True),
    (FORWARD_C4, forward_c4_indexer_hook, True),
)


def install() -> None:
    hooks = []
    for target, hook, required in HOOKS:
        try:
            resolve(target)
        except Exception as exc:
            if required:
                raise
            logger.info("sglang-sm120 indexer: %s not hooked (%s: %s)", target, type(exc).__name__, exc)
            continue
        hooks.append((target, hook, "AROUND"))
    install_hooks(hooks)


def make_seam() -> Seam:
    return Seam(
        name="indexer",
        description="C4 lightning indexer: FP8 paged MQA logits + top-512 in Triton (fused per shape)",
        targets=TARGETS,
        install=install,
    )
