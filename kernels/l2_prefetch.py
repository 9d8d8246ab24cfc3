"""Asking L2 for a weight's bytes ahead of the kernel that reads them.

``prefetch_rows_l2(weight, prefix_bytes)``: one launch that asks L2 for the first ``prefix_bytes`` of every row of a
2-D (or higher: the last dimension is the row) byte-addressable weight, one ``cp.async.bulk.prefetch.L2`` per row
(the copy engine of the issuing SM fetches them; no registers, nothing written). Meant for a side stream while the
main stream runs a kernel that reads little memory (the sparse attention decode at small batch), so that the next
weight-streaming kernel finds part of its weight in L2. A prefetch is a hint: the result is never wrong, only the
timing changes. CUDA-graph capturable (the grid depends on shapes only). On a GPU without the instruction (below
cc 9.0) or under the interpreter it launches nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .harness.interpreter import interpreter_enabled

BULK_PREFETCH_MIN_CAPABILITY = 9  # cp.async.bulk.prefetch.L2: sm_90 and sm_12x
PREFETCH_ALIGN = 16  # the instruction's address and size granularity
ROWS_PER_PROGRAM = 128  # one row per thread of a 4-warp program
PREFETCH_OPCODE = "UBLKPF.L2"  # its SASS on sm_90a / sm_120a


@triton.jit
def _prefetch_rows_kernel(ptr, rows, row_stride, prefix, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r = tl.minimum(r, rows - 1)  # a program's spare threads ask again for the last row
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; // dummy $0", "=r,l,r",
                              [ptr + r.to(tl.int64) * row_stride, prefix + r * 0], dtype=tl.int32, is_pure=False,
                              pack=1)


def _fail(name: str, expected: str, got) -> None:
    raise ValueError(f"prefetch_rows_l2: {name} must be {expected}, got {got}")


def prefetch_rows_l2(weight: torch.Tensor, prefix_bytes: int) -> None:
    """Ask L2 for the first ``prefix_bytes`` (a multiple of 16, at most the row's bytes) of every row of ``weight``
    (contiguous rows along its last dimension, 16-byte aligned)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2 or weight.stride(-1) != 1:
        _fail("weight", "a tensor of >= 2 dims with contiguous rows", type(weight).__name__ if not isinstance(
            weight, torch.Tensor) else f"shape {tuple(weight.shape)} strides {weight.stride()}")
    rows_view = weight.reshape(-1, weight.shape[-1])
    row_bytes = rows_view.shape[1] * weight.element_size()
    row_stride = rows_view.stride(0) * weight.element_size()
    if (not isinstance(prefix_bytes, int) or prefix_bytes <= 0 or prefix_bytes % PREFETCH_ALIGN
            or prefix_bytes > row_bytes):
        _fail("prefix_bytes", f"a positive multiple of {PREFETCH_ALIGN} up to the row's {row_bytes} bytes",
              prefix_bytes)
    if weight.data_ptr() % PREFETCH_ALIGN or row_stride % PREFETCH_ALIGN:
        _fail("weight", f"{PREFETCH_ALIGN}-byte aligned rows", f"address {weight.data_ptr()} row stride {row_stride}")
    rows = rows_view.shape[0]
    if rows == 0 or interpreter_enabled() or weight.device.type != "cuda":
        return
    if torch.cuda.get_device_capability(weight.device)[0] < BULK_PREFETCH_MIN_CAPABILITY:
        return
    _prefetch_rows_kernel[(triton.cdiv(rows, ROWS_PER_PROGRAM),)](
        rows_view.view(torch.uint8) if rows_view.element_size() == 1 else rows_view, rows, row_stride,
        prefix_bytes, BLOCK=ROWS_PER_PROGRAM, num_warps=4)
