"""kernels/harness/occupancy.py: resident programs per SM and waves, against hand-worked cases."""

import pytest

from sglang_sm120.kernels.harness import occupancy as occ


@pytest.mark.parametrize("gpu, warps, registers, shared, expected", [
    # the MoE B=1 tiles on sm_120: 40992 + 1024 B of shared memory per program, 2 fit in 100 KiB (registers allow 4)
    (occ.RTX_PRO_6000, 4, 128, 40992, 2),
    (occ.RTX_5090, 4, 128, 40992, 2),
    (occ.RTX_PRO_6000, 4, 80, 21536, 4),  # 4 x 22560 B = 90240 B
    # the H200: 228 KiB would take 5; 140 registers round to 144, 4608 per warp, 14 warps -> 3 programs of 4 warps
    (occ.H200, 4, 140, 40992, 3),
    (occ.H200, 4, 128, 40992, 4),  # 4096 registers per warp, 16 warps -> 4 programs
    (occ.H200, 4, 72, 21536, 7),  # 2304 per warp -> 28 warps -> 7 (shared memory would allow 10)
    (occ.RTX_PRO_6000, 8, 32, 0, 6),  # 1536 threads / 256
    (occ.RTX_PRO_6000, 1, 16, 0, 24),  # the block limit, not the 48 warps
    (occ.H200, 1, 16, 0, 32),
    (occ.RTX_PRO_6000, 4, 255, 0, 2),  # 256 x 32 = 8192 per warp -> 8 warps
    (occ.RTX_PRO_6000, 4, 32, 101376, 1),  # the 99 KiB opt-in maximum + the 1 KiB reserve: exactly 100 KiB
    (occ.RTX_PRO_6000, 4, 32, 101377, 0),
])
def test_resident_programs_per_sm(gpu, warps, registers, shared, expected):
    assert occ.resident_programs_per_sm(gpu, warps, registers, shared) == expected


@pytest.mark.parametrize("args", [(0, 32, 0), (4, -1, 0), (4, 32, -1)])
def test_bad_arguments_are_named(args):
    with pytest.raises(ValueError, match="num_warps >= 1, registers >= 0, shared_bytes >= 0"):
        occ.resident_programs_per_sm(occ.RTX_PRO_6000, *args)


@pytest.mark.parametrize("gpu, programs, per_sm, full, last, ragged", [
    (occ.RTX_PRO_6000, 384, 2, 1, 8, True),  # 376 at once, then 8
    (occ.RTX_5090, 384, 2, 1, 44, True),
    (occ.RTX_PRO_6000, 376, 2, 1, 0, False),  # exactly one wave
    (occ.RTX_PRO_6000, 300, 2, 0, 300, False),  # under one wave
    (occ.RTX_PRO_6000, 376 + 95, 2, 1, 95, False),  # a last wave of more than a quarter of the slots
    (occ.RTX_PRO_6000, 376 + 94, 2, 1, 94, True),
    (occ.RTX_PRO_6000, 0, 2, 0, 0, False),
])
def test_waves(gpu, programs, per_sm, full, last, ragged):
    w = occ.waves(gpu, programs, per_sm)
    assert (w.slots, w.full_waves, w.last_wave_programs, w.ragged) == (gpu.sms * per_sm, full, last, ragged)
    assert w.waves == pytest.approx(programs / (gpu.sms * per_sm))


def test_no_resident_program_means_no_wave():
    w = occ.waves(occ.RTX_PRO_6000, 10, 0)
    assert w.slots == 0 and w.waves == float("inf") and not w.ragged
    with pytest.raises(ValueError, match="programs must be >= 0"):
        occ.waves(occ.RTX_PRO_6000, -1, 2)
