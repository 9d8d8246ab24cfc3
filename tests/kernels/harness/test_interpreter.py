"""The CPU interpreter workaround: bf16 ``tl.dot`` is computed on the values, not the bit patterns."""

import pytest
import torch
import triton
import triton.language as tl

from sglang_sm120.kernels.harness import interpreter

pytestmark = pytest.mark.skipif(not interpreter.interpreter_enabled(), reason="only meaningful under TRITON_INTERPRET=1")


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))


@triton.jit
def _cast_then_scale_kernel(x_ptr, y_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r).to(tl.float32)  # the pattern kernels use: bf16 arithmetic is done in fp32
    tl.store(y_ptr + r, x * 3.0 + 1.0)


def test_bf16_dot_matches_fp32_matmul_of_the_bf16_values():
    assert interpreter.patch_bf16_dot()
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=gen).to(torch.bfloat16)
    b = torch.randn(16, 16, generator=gen).to(torch.bfloat16)
    c = torch.full((16, 16), float("nan"))
    _dot_kernel[(1,)](a, b, c, 16)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-5)


def test_unpatched_interpreter_multiplies_bit_patterns():
    """Documents the bug being worked around (triton#11584): without the patch the result is garbage."""
    from triton.runtime.interpreter import InterpreterBuilder

    interpreter.patch_bf16_dot()
    patched, original = InterpreterBuilder.create_dot, interpreter.unpatched_create_dot
    a = torch.ones(16, 16, dtype=torch.bfloat16)
    c = torch.empty(16, 16)
    InterpreterBuilder.create_dot = original
    try:
        _dot_kernel[(1,)](a, a, c, 16)
    finally:
        InterpreterBuilder.create_dot = patched
    assert not torch.allclose(c, torch.full_like(c, 16.0))


def test_bf16_loads_cast_to_fp32_are_exact():
    x = torch.randn(64).to(torch.bfloat16)
    y = torch.empty(64)
    _cast_then_scale_kernel[(1,)](x, y, 64)
    torch.testing.assert_close(y, x.float() * 3 + 1)
