"""The sm_120 projection's arithmetic (a model, not a measurement)."""

import pytest

from sglang_sm120.bench.projection import ALLREDUCES_PER_LAYER, SM120_GPUS, LayerMeasurement, project_step_us


def _layers():
    # one C4 layer of 100 MB read in 40 µs on a GPU whose copy bandwidth measured 4000 GB/s:
    # 2500 GB/s achieved = 62.5 % of copy
    return [LayerMeasurement("c4", 21, 100e6, 40.0, 4000.0), LayerMeasurement("lm_head", 1, 1e9, 400.0, 4000.0)]


def test_efficiency_is_fraction_of_measured_copy_bandwidth():
    assert _layers()[0].efficiency == pytest.approx(0.625)


def test_single_gpu_projection():
    p = project_step_us(_layers(), 1792.0, tp=1, allreduce_us=None)
    c4_each = 100e6 / (1792e9 * 0.625) * 1e6
    head = 1e9 / (1792e9 * 0.625) * 1e6
    assert p["terms"][0]["us_each"] == pytest.approx(c4_each)
    assert p["step_us"] == pytest.approx(21 * c4_each + head)
    assert p["allreduce_included"] and p["allreduce_us_total"] is None
    assert p["tokens_per_s_per_sequence"] == pytest.approx(1e6 / p["step_us"])


def test_tensor_parallel_adds_allreduce_only_when_given():
    without = project_step_us(_layers(), 1792.0, tp=4, allreduce_us=None)
    assert not without["allreduce_included"]
    with_ar = project_step_us(_layers(), 1792.0, tp=4, allreduce_us=10.0)
    assert with_ar["allreduce_us_total"] == pytest.approx(21 * ALLREDUCES_PER_LAYER * 10.0)
    assert with_ar["step_us"] == pytest.approx(without["step_us"] + 21 * ALLREDUCES_PER_LAYER * 10.0)


def test_published_bandwidths():
    assert SM120_GPUS["RTX PRO 6000 Blackwell"]["bandwidth_gbs"] == 1792.0
    assert SM120_GPUS["RTX 5090"]["bandwidth_gbs"] == 1792.0


def test_rejects_nonpositive_bandwidth():
    with pytest.raises(ValueError, match="gpu_bandwidth_gbs"):
        project_step_us(_layers(), 0.0, tp=1, allreduce_us=None)
