"""Occupancy and wave arithmetic for a launch on a GPU we cannot run on (sm_120), from AOT facts.

There is no sm_120 GPU here, so how a shipped grid fills an RTX PRO 6000 or RTX 5090 can only be derived: the
registers and shared memory of a config come from its AOT compile (:mod:`.aot`), the per-SM limits from the
architecture's published traits, and the rest is the occupancy calculator's arithmetic. The result is a model, not
a measurement: it says how many programs of a config can be resident per SM and whether a grid ends in a partly
filled last wave (a grid of 384 programs on 188 SMs x 2 resident programs runs 376 at once, then 8 alone).

Limits used (what CCCL's ``arch_traits`` and the CUDA programming guide give; the sm_120 ones are quoted in
``shared/reference/triton-on-sm120.md``): per SM 65536 registers, allocated per warp in units of 256; shared memory
per SM 100 KiB on sm_120 / 228 KiB on sm_90, of which 1 KiB is reserved per resident block; at most 1536 threads
and 24 blocks per SM on sm_120, 2048 and 32 on sm_90.
"""

from __future__ import annotations

import dataclasses
import math

REGISTER_ALLOCATION_UNIT = 256  # registers are allocated per warp in units of this many
REGISTERS_PER_THREAD_UNIT = 8  # ... after rounding the per-thread count up to a multiple of this
WARP_SIZE = 32


@dataclasses.dataclass(frozen=True)
class GpuLimits:
    name: str
    sms: int
    shared_per_sm: int
    shared_reserved_per_block: int
    registers_per_sm: int
    threads_per_sm: int
    blocks_per_sm: int


RTX_PRO_6000 = GpuLimits("RTX PRO 6000 Blackwell (sm_120, 188 SMs)", 188, 100 * 1024, 1024, 65536, 1536, 24)
RTX_5090 = GpuLimits("RTX 5090 (sm_120, 170 SMs)", 170, 100 * 1024, 1024, 65536, 1536, 24)
H200 = GpuLimits("H200 (sm_90, 132 SMs)", 132, 228 * 1024, 1024, 65536, 2048, 32)
SM120_GPUS = (RTX_PRO_6000, RTX_5090)


def resident_programs_per_sm(gpu: GpuLimits, num_warps: int, registers: int, shared_bytes: int) -> int:
    """Programs of a kernel (``num_warps`` warps, ``registers`` per thread, ``shared_bytes`` of dynamic shared
    memory per program) that fit on one SM of ``gpu`` at once: the least of the thread, block, register and shared
    memory bounds."""
    if num_warps < 1 or registers < 0 or shared_bytes < 0:
        raise ValueError(f"occupancy: need num_warps >= 1, registers >= 0, shared_bytes >= 0; got {num_warps}, "
                         f"{registers}, {shared_bytes}")
    by_threads = gpu.threads_per_sm // (num_warps * WARP_SIZE)
    per_thread = math.ceil(max(registers, 1) / REGISTERS_PER_THREAD_UNIT) * REGISTERS_PER_THREAD_UNIT
    per_warp = math.ceil(per_thread * WARP_SIZE / REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    by_registers = (gpu.registers_per_sm // per_warp) // num_warps
    by_shared = gpu.shared_per_sm // (shared_bytes + gpu.shared_reserved_per_block)
    return max(0, min(by_threads, gpu.blocks_per_sm, by_registers, by_shared))


@dataclasses.dataclass(frozen=True)
class Waves:
    programs: int
    per_sm: int
    slots: int  # programs resident at once on the whole GPU
    full_waves: int
    last_wave_programs: int  # programs of a partly filled last wave (0: the grid ends on a full wave)

    @property
    def waves(self) -> float:
        return self.programs / self.slots if self.slots else math.inf

    @property
    def ragged(self) -> bool:
        """A last wave that uses at most a quarter of the slots after at least one full wave: its programs run with
        most of the GPU idle, for about one program's time."""
        return self.full_waves >= 1 and 0 < self.last_wave_programs <= self.slots // 4


def waves(gpu: GpuLimits, programs: int, per_sm: int) -> Waves:
    """How ``programs`` equal programs, ``per_sm`` of which fit on an SM, fill ``gpu``."""
    if programs < 0:
        raise ValueError(f"occupancy: programs must be >= 0, got {programs}")
    slots = gpu.sms * per_sm
    if slots == 0:
        return Waves(programs, per_sm, 0, 0, programs)
    return Waves(programs, per_sm, slots, programs // slots, programs % slots)
