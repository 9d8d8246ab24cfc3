"""Support for running the kernels under Triton's CPU interpreter (``TRITON_INTERPRET=1``).

Triton 3.8's interpreter keeps bf16 tensors as raw uint16 and its ``create_dot`` multiplies those
bit patterns (triton#11584), so any ``tl.dot`` with a bf16 operand returns garbage on the CPU.
:func:`patch_bf16_dot` works around exactly that: it decodes bf16 operands to fp32 before the
interpreter's matmul, which is what the GPU's bf16 MMA computes (exact products, fp32 sums).
It changes nothing on a GPU and nothing outside the interpreter.

Other interpreter bugs it does not fix (so kernels and tests avoid them): bf16 elementwise
arithmetic without a cast (triton#10945; kernels cast loaded bf16 to fp32 first), fp32->bf16 stores
truncate instead of rounding to nearest even, fp32->fp8 casts mishandle the rounding carry and
saturation (tests compare such outputs with tolerance), and an E8M0 scale byte 0 decodes as 0.
"""

from __future__ import annotations

import os

_PATCHED = False
unpatched_create_dot = None  # the interpreter's own create_dot, kept for the test that shows the bug


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def cuda_capability_major(device=None) -> int | None:
    """The compute capability major of the CUDA GPU ``device`` (a torch.device or its string); None without a device
    or on the CPU. The kernels' launch choices keyed by GPU generation ask this."""
    if device is None:
        return None
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)[0]


def has_capability(device, min_major: int) -> bool:
    """Whether kernels on ``device`` may use a feature of compute capability ``min_major``.x and newer
    (TMA, packed bf16 PTX): a CUDA device's own capability; on the CPU, whether the interpreter runs
    (it emulates such paths)."""
    if device.type != "cuda":
        return interpreter_enabled()
    import torch

    return torch.cuda.get_device_capability(device)[0] >= min_major


def patch_bf16_dot() -> bool:
    """Install the bf16 ``tl.dot`` fix in Triton's interpreter; idempotent. Returns True if active."""
    global _PATCHED, unpatched_create_dot
    if _PATCHED:
        return True
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = unpatched_create_dot = interpreter.InterpreterBuilder.create_dot

    def as_fp32(handle):
        if getattr(handle.dtype, "scalar", handle.dtype) == tl.bfloat16:
            bits = handle.data.astype(np.uint32) << 16  # bf16 is the top half of an fp32
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return handle

    def create_dot(self, a, b, d, *args, **kwargs):
        return original(self, as_fp32(a), as_fp32(b), d, *args, **kwargs)

    interpreter.InterpreterBuilder.create_dot = create_dot
    _PATCHED = True
    return True
