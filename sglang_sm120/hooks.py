"""Installing hooks through SGLang's public ``HookRegistry`` and proving they took.

``HookRegistry.apply_hooks`` logs and swallows a failure to patch a target, so a seam cannot tell
from it whether it is live. :func:`install_hooks` registers the seam's hooks, applies them, and
raises if any target was not patched, so the seam registry can mark the seam failed and say why
(SGLang's own function stays in place in that case, since nothing was replaced).
"""

from __future__ import annotations

import pkgutil
from typing import Callable, Sequence


def resolve(target: str):
    """The object at a dotted path (``module.attr`` or ``module.Class.attr``); raises if absent."""
    obj_path, _, attr = target.rpartition(".")
    owner = pkgutil.resolve_name(obj_path)
    if not hasattr(owner, attr):
        raise AttributeError(f"{obj_path} has no attribute {attr!r}")
    return getattr(owner, attr)


def install_hooks(hooks: Sequence[tuple[str, Callable, str]]) -> None:
    """Register and apply ``(target, hook, hook_type)`` triples; hook_type is a ``HookType`` name
    (``"REPLACE"``, ``"AROUND"``, ``"BEFORE"``, ``"AFTER"``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, _hook, _kind in hooks:
        resolve(target)  # fail before registering anything if a target moved
    for target, hook, kind in hooks:
        if target not in HookRegistry._patched:
            HookRegistry.register(target, hook, HookType[kind])
    HookRegistry.apply_hooks()
    unpatched = [t for t, _h, _k in hooks if t not in HookRegistry._patched]
    if unpatched:
        raise RuntimeError(f"SGLang's HookRegistry did not patch {unpatched}")
