"""Programmatic dependent launch (PDL) helpers shared by the kernels that launch with it.

A kernel launched with ``launch_pdl=True`` carries the programmatic-serialisation attribute: its programs
may start while the previous kernel in the stream drains (once every program of that kernel has executed
``griddepcontrol.launch_dependents`` or exited). Such a kernel must execute ``griddepcontrol.wait`` before
it reads anything the previous kernel wrote and before its own stores (its outputs may reuse memory the
previous kernel still reads). Both instructions are no-ops in a kernel launched without the attribute, so
a PDL kernel after a kernel that never triggers simply starts when that kernel completes.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .harness.interpreter import interpreter_enabled

PDL_MIN_CAPABILITY = 9  # griddepcontrol (programmatic dependent launch): sm_90 and sm_12x

# SASS of griddepcontrol.launch_dependents and griddepcontrol.wait on sm_120a / sm_121a
PDL_OPCODES = ("PREEXIT", "ACQBULK")


@triton.jit
def pdl_launch_dependents(PDL: tl.constexpr):
    """Let the next kernel's programs launch once every program of this one has started (a hint: the next
    kernel still waits for this one to complete before it reads what this one writes)."""
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait until the previous kernel has completed and its writes are visible. The memory clobber keeps
    the compiler from moving any load or store across it."""
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r,~{memory}", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` can be launched with programmatic dependent launch (a CUDA device of
    compute capability 9.0 or newer; never under the CPU interpreter, which has no launch attributes). The kernels ask
    on every launch, so a device's capability is queried once per process (:func:`capability_major`)."""
    if device.type != "cuda" or interpreter_enabled():
        return False
    return capability_major(device) >= PDL_MIN_CAPABILITY


def capability_major(device: torch.device) -> int:
    """Major compute capability of CUDA ``device`` (no index: the current device), queried once per device index
    and process; :func:`clear_cache` forgets the answers."""
    return _capability_major(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def clear_cache() -> None:
    """Forget the cached capabilities (tests that fake a device)."""
    _capability_major.cache_clear()
