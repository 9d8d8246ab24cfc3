"""Installing hooks through SGLang's public ``HookRegistry`` and proving they took.

``HookRegistry.apply_hooks`` logs and swallows a failure to patch a target, so a seam cannot tell
from it whether it is live. :func:`install_hooks` registers the seam's hooks, applies them, and
raises if any target was not patched, so the seam registry can mark the seam failed and say why
(SGLang's own function stays in place in that case, since nothing was replaced).

It applies the seam's own targets only. ``apply_hooks()`` would patch every target registered so far,
including other plugins' (loaded before this one), and a target once patched takes no later hook: a
plugin loaded after sglang-sm120 could then no longer hook what an earlier plugin hooked. SGLang's
``load_plugins()`` applies everyone else's targets itself once every plugin has registered. Our own
targets are patched early, so ``apply_hooks()`` would skip a hook another plugin registers on one of them
later; an AFTER hook on ``apply_hooks`` (:func:`apply_late_hooks`) applies those on top of ours.
"""

from __future__ import annotations

import logging
import pkgutil
from typing import Callable, Sequence

logger = logging.getLogger("sglang_sm120")

APPLY_HOOKS_TARGET = "sglang.srt.plugins.hook_registry.HookRegistry.apply_hooks"
# (the registry's hook table, one of our targets) -> how many of its registered hooks the patch there holds
_applied: dict[tuple[int, str], int] = {}
_late_step_installed = False


def apply_late_hooks(result, *args, **kwargs):
    """AFTER ``HookRegistry.apply_hooks()``: hooks another plugin registered on one of our targets after we patched
    it (``apply_hooks`` skips a patched target) are applied on top of the patch there, in the order registered."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    for (table, target), count in list(_applied.items()):
        hooks = HookRegistry._hooks.get(target, ()) if table == id(HookRegistry._hooks) else ()
        if len(hooks) <= count:
            continue
        try:
            HookRegistry._apply_target(target, list(hooks[count:]))
            _applied[(table, target)] = len(hooks)
            logger.info("sglang-sm120: %d hook(s) registered on %s after sglang-sm120's were applied on top of it",
                        len(hooks) - count, target)
        except Exception:
            logger.exception("sglang-sm120: the hooks registered on %s after sglang-sm120's could not be applied",
                             target)
    return result


def _install_late_step(HookRegistry, HookType) -> None:
    """Once per process: :func:`apply_late_hooks` after every ``apply_hooks()`` (load_plugins' final one)."""
    global _late_step_installed
    if _late_step_installed:
        return
    HookRegistry.register(APPLY_HOOKS_TARGET, apply_late_hooks, HookType.AFTER)
    HookRegistry._apply_target(APPLY_HOOKS_TARGET, [h for h in HookRegistry._hooks[APPLY_HOOKS_TARGET]
                                                    if h[1] is apply_late_hooks])
    HookRegistry._patched.add(APPLY_HOOKS_TARGET)
    _late_step_installed = True


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
        _applied[(id(HookRegistry._hooks), target)] = len(target_hooks)
    unpatched = [t for t, _h, _k in hooks if t not in HookRegistry._patched]
    if unpatched:
        raise RuntimeError(f"SGLang's HookRegistry did not patch {unpatched}")
    try:
        _install_late_step(HookRegistry, HookType)
    except Exception:  # our hooks are live; only later plugins' hooks on our targets would stay unapplied
        logger.warning("sglang-sm120: could not hook HookRegistry.apply_hooks; a plugin loaded later that hooks one of "
                       "sglang-sm120's targets will not be applied there", exc_info=True)
