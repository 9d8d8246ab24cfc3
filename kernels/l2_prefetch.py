"""L2 prefetch of weights a later kernel of the decode step will read, issued while the memory is idle.

At small batches a DSv4-Flash layer alternates between phases that stream weights (the FP8 GEMVs, the MoE)
and phases that barely touch memory (the sparse attention and the C4 indexer's top-k at B=1 read a few hundred
KB in ~10-20 us). A weight that follows such a phase (``wo_a`` after the attention) can be brought into L2
during it, so that its GEMV reads L2 instead of DRAM. :func:`l2_prefetch` does that with
``cp.async.bulk.prefetch.L2`` requests (TMA's bulk prefetch, sm_90 and sm_12x): one thread per program issues
``REQUESTS_PER_PROGRAM`` requests of ``CHUNK_BYTES`` each and the program exits; nothing waits for the data,
no register or shared memory holds it, and the result of every later kernel is unchanged (a prefetch is only a
hint to the cache). The launch has a fixed grid for a given tensor size and allocates nothing, so it can be
captured in a CUDA graph; it is meant to run on a side stream forked where the idle phase starts.

How much to prefetch is the caller's choice (:func:`plan`): a budget below the L2 size keeps the prefetched
lines from evicting each other before their reader runs (the H200 has 50 MiB of L2, the RTX PRO 6000 128 MiB,
the RTX 5090 96 MiB).

The specification (:func:`reference_requests`): the requests cover bytes ``[0, nbytes)`` of the tensor's
storage exactly, in ``CHUNK_BYTES`` pieces (the last shorter), where ``nbytes`` is the tensor's size rounded
down to a multiple of 16 (a bulk request's granularity; at most 15 trailing bytes are not prefetched, so no
request reaches past the tensor). Under the CPU interpreter, which cannot run PTX, the kernel's record mode
writes each program's requests instead of issuing them, and the tests compare those with the specification.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .harness.interpreter import has_capability, interpreter_enabled

CHUNK_BYTES = 64 * 1024  # bytes of one bulk prefetch request
REQUESTS_PER_PROGRAM = 4  # requests one program issues (a program per 256 KB spreads them over the SMs' TMA units)
ALIGN_BYTES = 16  # cp.async.bulk address and size granularity
MIN_CAPABILITY = 9  # cp.async.bulk.prefetch.L2: sm_90 and sm_12x
NUM_WARPS = 1  # only thread 0 issues; one warp is the smallest program


@triton.jit
def _issue_bulk_prefetch_l2(ptr, nbytes):
    """Thread 0 asks L2 for ``nbytes`` (a multiple of 16) from 16-byte aligned ``ptr``."""
    tl.inline_asm_elementwise(
        "{ .reg .pred pf_first; .reg .b32 pf_tid; mov.u32 pf_tid, %tid.x; setp.eq.u32 pf_first, pf_tid, 0; "
        "@pf_first cp.async.bulk.prefetch.L2.global [$1], $2; } // dummy $0",
        "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_kernel(ptr, nbytes, record_ptr, CHUNK: tl.constexpr, PER_PROGRAM: tl.constexpr,
                        RECORD: tl.constexpr):
    """Program p issues requests ``p * PER_PROGRAM + i`` (i < PER_PROGRAM) of bytes ``[r * CHUNK, min((r + 1) *
    CHUNK, nbytes))``; with RECORD it stores ``(start, size)`` of each at ``record_ptr[2r]`` instead."""
    first = tl.program_id(0).to(tl.int64) * PER_PROGRAM
    for i in tl.static_range(PER_PROGRAM):
        request = first + i
        start = request * CHUNK
        size = tl.minimum(nbytes - start, CHUNK)
        if size > 0:
            if RECORD:
                tl.store(record_ptr + 2 * request, start)
                tl.store(record_ptr + 2 * request + 1, size)
            else:
                _issue_bulk_prefetch_l2(ptr + start, size.to(tl.int32))


def prefetchable_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor`` a prefetch covers: its size rounded down to a multiple of ALIGN_BYTES."""
    return tensor.numel() * tensor.element_size() // ALIGN_BYTES * ALIGN_BYTES


def _request_count(nbytes: int) -> int:
    return -(-nbytes // CHUNK_BYTES)


def _grid(nbytes: int) -> tuple[int]:
    return (-(-_request_count(nbytes) // REQUESTS_PER_PROGRAM),)


def _check(name: str, tensor, device=None) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"l2_prefetch: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError(f"l2_prefetch: {name} must be contiguous (one byte range), got shape {tuple(tensor.shape)} "
                         f"with strides {tensor.stride()}")
    if tensor.numel() and tensor.data_ptr() % ALIGN_BYTES:
        raise ValueError(f"l2_prefetch: {name} must start at a {ALIGN_BYTES}-byte aligned address "
                         f"(cp.async.bulk), got data_ptr % {ALIGN_BYTES} = {tensor.data_ptr() % ALIGN_BYTES}")
    if device is not None and tensor.device != device:
        raise ValueError(f"l2_prefetch: {name} is on {tensor.device}, the others on {device}")


def plan(tensors, budget_bytes: int) -> list[tuple[torch.Tensor, int]]:
    """``(tensor, nbytes)`` to prefetch: the tensors in order, whole while the budget lasts, the first that does not
    fit as its leading ``nbytes`` (a multiple of ALIGN_BYTES), none after it."""
    if budget_bytes < 0:
        raise ValueError(f"l2_prefetch: budget_bytes must be >= 0, got {budget_bytes}")
    out, left = [], int(budget_bytes) // ALIGN_BYTES * ALIGN_BYTES
    for tensor in tensors:
        take = min(prefetchable_bytes(tensor), left)
        if take > 0:
            out.append((tensor, take))
        left -= take
        if left <= 0:
            break
    return out


def l2_budget_bytes(device: torch.device, fraction: float) -> int:
    """``fraction`` of the L2 size of CUDA ``device`` in bytes (0 where the device reports none)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"l2_prefetch: fraction must be in [0, 1], got {fraction}")
    return int(torch.cuda.get_device_properties(device).L2_cache_size * fraction)


def supported(device: torch.device) -> bool:
    """Whether bulk L2 prefetches can be issued on ``device`` (a CUDA GPU of compute capability 9.0 or newer)."""
    return device.type == "cuda" and not interpreter_enabled() and has_capability(device, MIN_CAPABILITY)


def l2_prefetch(*tensors: torch.Tensor, budget_bytes: int | None = None) -> int:
    """Ask L2 for the storage of ``tensors`` (in order; with ``budget_bytes``, as :func:`plan` cuts them) on the
    current stream; returns the bytes requested. One launch per tensor, no allocation, no host sync. Returns 0
    without launching where the device cannot prefetch (:func:`supported`: a CPU tensor, the interpreter, a GPU
    older than sm_90), since a prefetch changes no result."""
    device = None
    for i, tensor in enumerate(tensors):
        _check(f"tensors[{i}]", tensor, device)
        device = tensor.device
    if device is None or not supported(device):
        return 0
    pieces = plan(tensors, budget_bytes) if budget_bytes is not None else [(t, prefetchable_bytes(t))
                                                                            for t in tensors]
    total = 0
    for tensor, nbytes in pieces:
        if nbytes <= 0:
            continue
        _l2_prefetch_kernel[_grid(nbytes)](tensor, nbytes, tensor, CHUNK=CHUNK_BYTES, PER_PROGRAM=REQUESTS_PER_PROGRAM,
                                           RECORD=False, num_warps=NUM_WARPS)
        total += nbytes
    return total


def recorded_requests(tensor: torch.Tensor, nbytes: int | None = None) -> torch.Tensor:
    """The ``[requests, 2]`` int64 ``(start, size)`` the kernel issues for ``tensor`` (its leading ``nbytes``,
    default :func:`prefetchable_bytes`), from the kernel's record mode (the CPU tests' view of the kernel)."""
    _check("tensor", tensor)
    nbytes = prefetchable_bytes(tensor) if nbytes is None else nbytes
    if not 0 <= nbytes <= prefetchable_bytes(tensor) or nbytes % ALIGN_BYTES:
        raise ValueError(f"l2_prefetch: nbytes must be a multiple of {ALIGN_BYTES} in [0, "
                         f"{prefetchable_bytes(tensor)}], got {nbytes}")
    count = _request_count(nbytes)
    record = torch.full((count, 2), -1, dtype=torch.int64, device=tensor.device)
    if count:
        _l2_prefetch_kernel[_grid(nbytes)](tensor, nbytes, record, CHUNK=CHUNK_BYTES,
                                           PER_PROGRAM=REQUESTS_PER_PROGRAM, RECORD=True, num_warps=NUM_WARPS)
    return record


def reference_requests(nbytes: int) -> torch.Tensor:
    """The specification of the requests for ``nbytes`` bytes: ``(start, size)`` of consecutive CHUNK_BYTES pieces
    covering ``[0, nbytes)``, the last one shorter."""
    starts = torch.arange(0, nbytes, CHUNK_BYTES, dtype=torch.int64)
    sizes = torch.clamp(nbytes - starts, max=CHUNK_BYTES)
    return torch.stack([starts, sizes], dim=1) if nbytes else torch.empty((0, 2), dtype=torch.int64)


# SASS of cp.async.bulk.prefetch.L2 on sm_120a / sm_121a
PREFETCH_OPCODES = ("UBLKPF.L2",)


def aot_configs():
    from .harness.aot import AotConfig

    return [AotConfig(
        name="l2_prefetch", kernel=_l2_prefetch_kernel,
        signature={"ptr": "*u8", "nbytes": "i64", "record_ptr": "*i64", "CHUNK": "constexpr",
                   "PER_PROGRAM": "constexpr", "RECORD": "constexpr"},
        constexprs={"CHUNK": CHUNK_BYTES, "PER_PROGRAM": REQUESTS_PER_PROGRAM, "RECORD": False},
        num_warps=NUM_WARPS, expect_opcodes=PREFETCH_OPCODES, forbid_opcodes=("LDG", "STG"),
        note="bulk L2 prefetch requests only: no loads, no stores")]
