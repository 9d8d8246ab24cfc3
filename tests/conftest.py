"""Test-wide setup: kernels run under Triton's CPU interpreter when no GPU is present.

TRITON_INTERPRET must be set before any @triton.jit function is created, so it is set here, before
test modules import the kernels. The interpreter's bf16 ``tl.dot`` bug is patched (see
``sglang_sm120.kernels.harness.interpreter``).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sglang_sm120.kernels.harness.interpreter import interpreter_enabled, patch_bf16_dot  # noqa: E402

if interpreter_enabled():
    patch_bf16_dot()

DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"
