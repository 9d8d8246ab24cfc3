"""Installing hooks through SGLang's public ``HookRegistry`` and proving they took.

``HookRegistry.apply_hooks`` logs and swallows a failure to patch a target, so a seam cannot tell
from it whether it is live. :func:`install_hooks` registers the seam's hooks, applies them, and
raises if any target was not patched, so the seam registry can mark the seam failed and say why
(SGLang's own function stays in place in that case, since nothing was replaced).

It applies the seam's own targets only. ``apply_hooks()`` would patch every target registered so far,
including other plugins' (loaded before this one), and a target once patched takes no later hook: a
plugin loaded after sglang-sm120 could then no longer hook what an earlier plugin hooked. SGLang's
``load_plugins()`` applies everyone else's targets itself once every plugin has registered.
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

    def registered(target, hook) -> bool:
        return any(entry[1] is hook for entry in HookRegistry._hooks.get(target, ()))

    for target, _hook, _kind in hooks:
        resolve(target)  # fail before registering anything if a target moved
    # A target another apply_hooks() already patched without our hook cannot take it any more (apply_hooks skips
    # patched targets): refuse before registering anything, so the seam is marked failed instead of active
    taken = [t for t, h, _k in hooks if t in HookRegistry._patched and not registered(t, h)]
    if taken:
        raise RuntimeError(f"{taken} already patched by an earlier HookRegistry.apply_hooks() without sglang-sm120's "
                           f"hook (another plugin?); what is there stays")
    for target, hook, kind in hooks:
        if not registered(target, hook):  # install again: ours is registered (and patched) already
            HookRegistry.register(target, hook, HookType[kind])
    ours = {t: HookRegistry._hooks[t] for t, _h, _k in hooks if t not in HookRegistry._patched}
    # apply_hooks()'s own order (class replacements first) and per-target step, on our targets alone
    for target, target_hooks in sorted(ours.items(), key=HookRegistry._target_sort_key):
        try:
            HookRegistry._apply_target(target, target_hooks)
        except Exception as exc:
            raise RuntimeError(f"SGLang's HookRegistry could not patch {target}: {type(exc).__name__}: {exc}") from exc
        HookRegistry._patched.add(target)
    unpatched = [t for t, _h, _k in hooks if t not in HookRegistry._patched]
    if unpatched:
        raise RuntimeError(f"SGLang's HookRegistry did not patch {unpatched}")
