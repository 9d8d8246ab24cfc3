"""``register()``: the ``sglang.srt.plugins`` entry point, run by SGLang's ``load_plugins()`` in
every SGLang process (launcher, scheduler/TP workers, DP controller, detokenizer).

It is idempotent, cheap when nothing applies, and never raises into SGLang: any failure is logged
and leaves SGLang's own code in place.
"""

from __future__ import annotations

import importlib
import logging

from .seams import REGISTRY, SEAM_NAMES, Seam, SeamState
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
    """Add every seam module's seam to the registry (no hooks are installed here). A seam module
    that cannot be imported becomes a failed seam with the reason, and the others go on."""
    known = {s.name for s in REGISTRY}
    for name in SEAM_NAMES:
        if name in known:
            continue
        try:
            seam = importlib.import_module(f"{__package__}.{name}").make_seam()
        except Exception as exc:
            logger.warning("sglang-sm120: seam module %s failed to load; SGLang's own path stays", name,
                           exc_info=True)
            seam = Seam(name, "(module failed to load)", (), install=_unavailable)
            seam.state, seam.reason = SeamState.FAILED, f"{type(exc).__name__}: {exc}"
        REGISTRY.add(seam)


def _unavailable() -> None:
    raise RuntimeError("seam module failed to load")


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
        build_registry()
        # The MoE backend name must parse in every process, whether or not the seam is active:
        # with the seam inactive the name still routes to upstream's MXFP4 path (sglang_sm120.moe).
        try:
            from .moe import register_backend_name

            register_backend_name()
        except Exception:
            logger.exception("sglang-sm120: could not register --moe-runner-backend sm120")
        REGISTRY.apply_all()
        REGISTRY.log_once()
    except Exception:  # never into SGLang
        logger.exception("sglang-sm120: register() failed; SGLang runs unchanged where hooks did not apply")
