"""tools/sm120_occupancy.py: the launches it models and the grid arithmetic (no compile: facts are given)."""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import sm120_occupancy as tool  # noqa: E402

from sglang_sm120.kernels import fp8_gemv as fp8  # noqa: E402
from sglang_sm120.kernels import moe_mxfp4 as moe  # noqa: E402
from sglang_sm120.kernels.harness import occupancy as occ  # noqa: E402


def test_launches_are_the_fp16_gemv_defaults():
    launches = tool.default_launches([1, 2, 4, 8], [1, 2, 16, 64])
    for launch in launches:
        inter = 2048 // launch.tp
        assert moe.gemv_f16_default(launch.batch * 6, inter)
        expected = dict(zip(("gate_up", "down"), moe.gemv_configs(launch.batch * 6, inter)))[launch.kind]
        assert launch.config == expected
    assert {(la.tp, la.batch) for la in launches} == {(tp, b) for tp in (1, 2, 4) for b in (1, 2, 16)}  # T=8: no TMA
    names = {cfg.name for cfg in moe.aot_configs()}
    assert {la.aot_name for la in launches} <= names  # each modelled launch is a shipped AOT config


@pytest.mark.parametrize("tp, batch, kind, gpu, programs", [
    (1, 1, "gate_up", occ.RTX_PRO_6000, 6 * 2048 // 32),  # 6 experts x 64 column blocks of 32
    (1, 1, "down", occ.RTX_PRO_6000, 6 * 4096 // 32),  # the 2x down tile at T=1 B=1 (MoE run 28c)
    (4, 1, "down", occ.RTX_PRO_6000, 6 * 4096 // 32),  # persistent: 768 items < 188 x 8
    (4, 2, "down", occ.RTX_PRO_6000, 188 * 8),  # persistent: 1536 items, the grid caps at SMs x 8
    (4, 2, "down", occ.H200, 132 * 8),
])
def test_programs(tp, batch, kind, gpu, programs):
    launch = next(la for la in tool.default_launches([tp], [batch]) if la.kind == kind)
    assert launch.programs(gpu) == programs


def test_rows_flag_the_t1_b1_partial_wave_on_sm120():
    launches = tool.default_launches([1], [1])
    facts = {(la.aot_name, arch): (128, 40992) for la in launches for arch in (90, 120)}
    rows = tool.rows_for(launches, facts)
    assert len(rows) == 2 * len(tool.GPUS)
    by_gpu = {(r["launch"], r["gpu"]): r for r in rows}
    pro = by_gpu[("gate_up", occ.RTX_PRO_6000.name)]
    assert (pro["per_sm"], pro["slots"], pro["programs"], pro["last_wave"], pro["ragged"]) == (2, 376, 384, 8, True)
    h200 = by_gpu[("gate_up", occ.H200.name)]
    assert (h200["per_sm"], h200["ragged"]) == (4, False)
    text = tool.markdown(rows)
    assert "not a measurement" in text and "376 at once, then 8" in text


# --dense: the block-FP8 GEMV's launches


def test_dense_launches_are_the_rules_choices_per_gpu():
    launches = tool.dense_launches([1, 4], [1, 2, 8])
    # seven linears per T and rows, and wo_a with the RoPE where the seam fuses it: 8 groups (T=1) at 1 / 2 / 8 rows,
    # 2 groups (T=4) at 1 / 2 rows
    assert len(launches) == len(tool.GPUS) * (2 * 3 * 7 + 3 + 2)
    assert {(la.groups, la.rows) for la in launches if la.rope} <= tool.FUSED_ROPE_WHERE
    for la in launches:
        if la.rope:
            assert la.config == fp8.wo_a_config(la.rows, la.n, la.k, la.groups, True, sms=la.gpu.sms)
        else:
            assert la.config == fp8.default_config(la.rows, la.n, la.k, la.groups, sms=la.gpu.sms)
    names = {cfg.name for cfg in fp8.aot_configs()}
    assert {la.aot_name for la in launches} <= names  # each modelled launch is a compiled AOT config


@pytest.mark.parametrize("gpu", tool.GPUS, ids=lambda g: str(g.sms))
def test_dense_programs_are_the_launch_grid(gpu):
    """wo_a with the fused RoPE at T=1, 1 row: 8 groups x 8 column tiles of 128 x 8 K splits of 4 blocks (the one-shot
    program on every listed GPU); the persistent forms cap at SMs x programs per SM."""
    la = next(la for la in tool.dense_launches([1], [1], gpus=[gpu]) if la.rope)
    assert la.config.w_before_wait and la.programs() == 8 * 8 * 8
    for la in tool.dense_launches([1, 4], [1, 2, 8], gpus=[gpu]):
        items = math.prod(fp8.launch_grid(la.rows, la.n, la.k, la.groups, la.config, 10**6)[0])
        if la.config.persistent_programs_per_sm:
            assert la.programs() == min(items, gpu.sms * la.config.persistent_programs_per_sm)
        else:
            assert la.programs() == items


def test_dense_rows_flag_a_grid_two_programs_past_the_slots():
    """512 one-shot programs with 3 resident per SM: one wave on 188 SMs (564 slots), 510 then 2 on 170; the H200 at 4
    per SM (528 slots) one wave: the RTX 5090 row is listed as needing more waves than the H200's."""
    launches = [la for la in tool.dense_launches([1], [1]) if la.rope]
    facts = {(la.aot_name, arch): (146 if arch == 120 else 127, 18432) for la in launches for arch in (90, 120)}
    rows = tool.dense_rows_for(launches, facts)
    by_gpu = {r["gpu"]: r for r in rows}
    pro = by_gpu[occ.RTX_PRO_6000.name]
    assert (pro["slots"], pro["full_waves"], tool._launch_waves(pro)) == (564, 0, 1)
    r5090 = by_gpu[occ.RTX_5090.name]
    assert (r5090["per_sm"], r5090["slots"], r5090["programs"], r5090["last_wave"], r5090["ragged"]) == (
        3, 510, 512, 2, True)
    assert (by_gpu[occ.H200.name]["per_sm"], tool._launch_waves(by_gpu[occ.H200.name])) == (4, 1)
    assert tool._launch_waves(r5090) == 2
    text = tool.dense_markdown(rows)
    assert "not a measurement" in text and "more waves than the H200's: 1" in text
    assert "510 at once, then 2" in text
