"""``register()``: the ``sglang.srt.plugins`` entry point, run by SGLang's ``load_plugins()`` in
every SGLang process (launcher, scheduler/TP workers, DP controller, detokenizer).

It is idempotent, cheap when nothing applies, and never raises into SGLang: any failure is logged
and leaves SGLang's own code in place.
"""

from __future__ import annotations

import importlib
import logging

from .seams import REGISTRY, SEAM_NAMES
from .versions import SUPPORTED_SGLANG, installed_version

logger = logging.getLogger("sglang_sm120")

_registered = False
refused_reason: str | None = None


def sglang_supported() -> tuple[bool, str]:
    version = installed_version("sglang")
    if version is None:
        return False, "sglang is not installed"
    if version not in SUPPORTED_SGLANG:
        return False, f"sglang {version} is not supported (supported: {', '.join(SUPPORTED_SGLANG)})"
    return True, f"sglang {version}"


def build_registry() -> None:
    """Add every seam module's seam to the registry (no hooks are installed here)."""
    for name in SEAM_NAMES:
        if name not in {s.name for s in REGISTRY}:
            module = importlib.import_module(f"{__package__}.{name}")
            REGISTRY.add(module.make_seam())


def register() -> None:
    global _registered, refused_reason
    if _registered:
        return
    _registered = True
    try:
        ok, why = sglang_supported()
        if not ok:
            refused_reason = why
            logger.warning("sglang-sm120: not hooking SGLang: %s; SGLang runs unchanged.", why)
            return
        # The MoE backend name must parse in every process, whether or not the seam is active:
        # with the seam inactive the name still routes to upstream's MXFP4 path (sglang_sm120.moe).
        from .moe import register_backend_name

        register_backend_name()
        build_registry()
        REGISTRY.apply_all()
        REGISTRY.log_once()
    except Exception:  # never into SGLang
        logger.exception("sglang-sm120: register() failed; SGLang runs unchanged where hooks did not apply")
