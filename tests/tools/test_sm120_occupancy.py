"""tools/sm120_occupancy.py: the launches it models and the grid arithmetic (no compile: facts are given)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import sm120_occupancy as tool  # noqa: E402

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
