"""The seam registry: each place where the plugin swaps an SGLang kernel is a named unit.

A seam has hook targets (dotted SGLang paths), an activation rule (an sm_12x GPU is visible, or
``SGLANG_SM120_FORCE=1``), a kill switch (``SGLANG_SM120_DISABLE=<name>[,<name>...]|all``) and,
once decided, a status: active, disabled by env, not applicable, or failed with a reason. The
status of every seam is logged once per process. A seam whose installation raises is marked
failed and SGLang keeps its own path: the plugin never raises into SGLang.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import os
import re
from typing import Callable

logger = logging.getLogger("sglang_sm120")

ENV_DISABLE = "SGLANG_SM120_DISABLE"
ENV_FORCE = "SGLANG_SM120_FORCE"

SEAM_NAMES = ("attention", "indexer", "moe", "dense", "bf16_linear", "disagg")


class SeamState(str, enum.Enum):
    ACTIVE = "active"
    DISABLED_BY_ENV = "disabled by env"
    NOT_APPLICABLE = "not applicable"
    FAILED = "failed"


@dataclasses.dataclass
class Seam:
    """One replaceable SGLang seam.

    ``install`` applies the hooks and returns nothing; it may raise, which marks the seam failed.
    ``applies`` may add a seam-specific precondition and returns a reason string when the seam
    does not apply (None when it does).
    """

    name: str
    description: str
    targets: tuple[str, ...]
    install: Callable[[], None]
    applies: Callable[[], str | None] | None = None
    state: SeamState | None = None
    reason: str = ""

    def status_line(self) -> str:
        state = self.state.value if self.state else "undecided"
        return f"{self.name}: {state}" + (f" ({self.reason})" if self.reason else "")


_warned_disable_values: set[str] = set()


def _disable_entries(environ) -> set[str]:
    return {n.strip().lower() for n in environ.get(ENV_DISABLE, "").split(",") if n.strip()}


def unknown_disabled_names(environ=os.environ) -> list[str]:
    """Entries of ``SGLANG_SM120_DISABLE`` that name no seam (a typo leaves the seam it meant on)."""
    return sorted(_disable_entries(environ) - set(SEAM_NAMES) - {"all"})


def disabled_names(environ=os.environ) -> set[str]:
    """Names switched off by ``SGLANG_SM120_DISABLE``; ``all`` means every seam."""
    raw = environ.get(ENV_DISABLE, "")
    names = _disable_entries(environ)
    if "all" in names:
        return set(SEAM_NAMES)
    unknown = unknown_disabled_names(environ)
    if unknown and raw not in _warned_disable_values:  # asked once per seam: warn once per value
        _warned_disable_values.add(raw)
        logger.warning("sglang-sm120: %s names unknown seams %s (known: %s, all)", ENV_DISABLE, unknown,
                       ", ".join(SEAM_NAMES))
    return names & set(SEAM_NAMES)


FORCE_ON = ("1", "true", "yes", "on")
FORCE_OFF = ("", "0", "false", "no", "off")
_warned_force_values: set[str] = set()


def _force_value(raw: str) -> tuple[bool, bool]:
    """(on, unrecognised) for a value of ``SGLANG_SM120_FORCE``; an unrecognised value is taken as off."""
    value = raw.strip().lower()
    return value in FORCE_ON, value not in FORCE_ON + FORCE_OFF


def unrecognised_force_value(environ=os.environ) -> str | None:
    """``SGLANG_SM120_FORCE``'s value when it is neither on nor off (taken as off), else None."""
    raw = environ.get(ENV_FORCE, "")
    return raw if _force_value(raw)[1] else None


def forced(environ=os.environ) -> bool:
    raw = environ.get(ENV_FORCE, "")  # read once: this runs on every eager kernel call
    on, unrecognised = _force_value(raw)
    if unrecognised and raw not in _warned_force_values:  # asked once per seam: warn once per value
        _warned_force_values.add(raw)
        logger.warning("sglang-sm120: %s=%r is neither on (%s) nor off (%s); taken as off", ENV_FORCE, raw,
                       ", ".join(FORCE_ON), ", ".join(v for v in FORCE_OFF if v))
    return on


def visible_sm12x() -> tuple[bool, str]:
    """Whether a CUDA device of compute capability 12.x is visible, and what was found."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False, "no CUDA device"
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    except Exception as exc:  # a broken driver must not break SGLang's start
        return False, f"CUDA query failed: {exc}"
    found = ", ".join(f"sm_{ma}{mi}" for ma, mi in caps)
    return any(ma == 12 for ma, _ in caps), found


def activation(seam: Seam, environ=os.environ, gpu: tuple[bool, str] | None = None) -> tuple[SeamState, str]:
    """Decide, without installing anything, whether ``seam`` should be active and why."""
    if seam.name in disabled_names(environ):
        return SeamState.DISABLED_BY_ENV, f"{ENV_DISABLE}={environ.get(ENV_DISABLE, '')}"
    is_sm12x, found = gpu if gpu is not None else visible_sm12x()
    if forced(environ):
        rule = f"{ENV_FORCE}=1"
    elif is_sm12x:
        rule = f"sm_12x GPU ({found})"
    else:
        return SeamState.NOT_APPLICABLE, f"needs an sm_12x GPU or {ENV_FORCE}=1; found {found}"
    if seam.applies is not None:
        why_not = seam.applies()
        if why_not:
            return SeamState.NOT_APPLICABLE, why_not
    return SeamState.ACTIVE, rule


class SeamRegistry:
    def __init__(self) -> None:
        self._seams: dict[str, Seam] = {}
        self._logged = False

    def add(self, seam: Seam) -> Seam:
        if seam.name not in SEAM_NAMES:
            raise ValueError(f"unknown seam {seam.name!r}; known: {SEAM_NAMES}")
        self._seams[seam.name] = seam
        return seam

    def get(self, name: str) -> Seam:
        return self._seams[name]

    def __iter__(self):
        return iter(self._seams.values())

    def is_active(self, name: str) -> bool:
        seam = self._seams.get(name)
        return seam is not None and seam.state is SeamState.ACTIVE

    def apply_all(self, environ=os.environ, gpu: tuple[bool, str] | None = None) -> None:
        """Decide and install every undecided seam; failures are recorded, never raised."""
        gpu = gpu if gpu is not None else visible_sm12x()
        for seam in self._seams.values():
            if seam.state is not None:
                continue
            state, reason = activation(seam, environ, gpu)
            if state is SeamState.ACTIVE:
                try:
                    seam.install()
                except Exception as exc:  # leave upstream intact, say why
                    state, reason = SeamState.FAILED, f"{type(exc).__name__}: {exc}"
                    logger.warning("sglang-sm120: seam %s could not be installed, SGLang's own path stays: %s",
                                   seam.name, reason, exc_info=True)
            seam.state, seam.reason = state, reason

    def log_once(self) -> None:
        if self._logged:
            return
        self._logged = True
        logger.info("sglang-sm120 seams [pid %d]: %s", os.getpid(), "; ".join(s.status_line() for s in self))

    def reset(self) -> None:
        """Forget every decision (tests)."""
        for seam in self._seams.values():
            seam.state, seam.reason = None, ""
        self._logged = False
        cuda_device_takes_kernels.cache_clear()


REGISTRY = SeamRegistry()


class OnceLog:
    """A seam's call-time log lines, each key logged once per process (a decision taken on every forward must
    not flood the log)."""

    def __init__(self, seam_name: str) -> None:
        self.prefix = f"sglang-sm120 {seam_name}: "
        self.seen: set[str] = set()

    def __call__(self, key: str, message: str, *args, level: int = logging.INFO) -> None:
        if key not in self.seen:
            self.seen.add(key)
            logger.log(level, self.prefix + message, *args)


def reason_key(reason: str) -> str:
    """A fallback reason with its numbers (shapes, lengths, batch sizes) blanked: the key under which it is logged
    once, so that one kind of reason is not logged again for every shape it meets."""
    return re.sub(r"\d+", "#", reason)


def run_or_fall_back(log: OnceLog, what: str, ours, upstream):
    """``ours()``, or ``upstream()`` when ours raises (a Triton compile or launch error such as OutOfResources, a
    refusal the checks before it missed): the server keeps SGLang's path for that call, and the failure is logged
    as a warning once per kind of error, with its message."""
    try:
        return ours()
    except Exception as exc:
        log(f"{what}:raised:{type(exc).__name__}:{reason_key(str(exc))[:200]}",
            "%s raised %s (%s); SGLang's path runs the call (logged once per kind of error)", what,
            type(exc).__name__, exc, level=logging.WARNING)
        return upstream()


def kernels_runnable(t) -> bool:
    """Whether the plugin's Triton kernels take a call on ``t``: a tensor on an sm_12x GPU (on any CUDA GPU with
    ``SGLANG_SM120_FORCE=1``), or any tensor under the CPU interpreter (the seam tests). The seams activate when any
    visible GPU is sm_12x; on a machine that also has other GPUs, the processes on those keep SGLang's path per call."""
    if t.is_cuda:
        return cuda_device_takes_kernels(t.device.index)
    from .kernels.harness.interpreter import interpreter_enabled

    return interpreter_enabled()


@functools.lru_cache(maxsize=None)
def cuda_device_takes_kernels(index: int | None) -> bool:
    """Whether calls on CUDA device ``index`` go to our kernels: it is sm_12x, or ``SGLANG_SM120_FORCE=1``. Cached per
    device (the hooks ask on every call); :meth:`SeamRegistry.reset` forgets it."""
    if forced():
        return True
    import torch

    return torch.cuda.get_device_capability(index)[0] == 12


def not_runnable_reason(t) -> str:
    """Why :func:`kernels_runnable` said no for ``t``, for the seams' once-per-reason log lines."""
    if t.is_cuda:
        return f"{t.device} is not an sm_12x GPU (and {ENV_FORCE} is not set)"
    return f"{t.device} tensors without a GPU or the Triton interpreter"
