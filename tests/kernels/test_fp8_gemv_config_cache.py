"""The launch rules cached (default_config / wo_a_config keyed by shape, SM count and the USE_* switches) and the device
facts asked once per device (sm_count, pdl_supported, weight_tma_usable): the cached choice is the uncached rule's
(pick_default_config / pick_wo_a_config) over every DSv4 dense shape at every supported TP, 1..16 and 64 rows, three
SM counts and every combination of switches; a switch set between calls and another SM count each get their own
answer; a device is asked once however often the rules run. No kernel runs here."""

import itertools
import types

import pytest
import torch

from sglang_sm120.kernels import dsv4
from sglang_sm120.kernels import fp8_gemv as g

from .test_fp8_gemv import fresh_caches  # noqa: F401 (fixture)

SWITCHES = ("USE_PDL", "USE_TMA", "USE_ONE_CHUNK", "USE_W_BEFORE_WAIT", "USE_WO_A_ROPE_PAIRS", "ONE_CHUNK_X_FIRST")
SM_COUNTS = (132, 170, 188)  # H200, RTX 5090, RTX PRO 6000
ROWS = (*range(1, 17), g.WO_A_MAX_KERNEL_ROWS)
LINEAR_SHAPES = sorted({shape for tp in dsv4.SUPPORTED_TP for name, shape in dsv4.dense_linear_shapes(tp).items()
                        if name != "wo_a"})
# grouped wo_a [G, R, D] per rank at each TP: G = 8 / TP groups of R = 1024 rows over D = 8 heads x 512
WO_A_SHAPES = tuple((dsv4.O_GROUPS // tp, dsv4.O_LORA_RANK, dsv4.NUM_HEADS * dsv4.HEAD_DIM // dsv4.O_GROUPS)
                    for tp in dsv4.SUPPORTED_TP)
WO_B = dsv4.dense_linear_shapes(1)["wo_b"]


def test_rules_are_the_switches(monkeypatch):
    for combo in itertools.product((True, False), repeat=len(SWITCHES)):
        for name, value in zip(SWITCHES, combo):
            monkeypatch.setattr(g, name, value)
        assert g.rules() == g.Rules(*combo)


@pytest.mark.parametrize("sms", SM_COUNTS)
def test_cached_choice_is_the_rules_choice_over_the_shipped_shapes(monkeypatch, fresh_caches, sms):
    monkeypatch.setattr(g, "sm_count", lambda device_index=None: sms)
    for combo in itertools.product((True, False), repeat=len(SWITCHES)):
        for name, value in zip(SWITCHES, combo):
            monkeypatch.setattr(g, name, value)
        rule = g.Rules(*combo)
        for m in ROWS:
            for n, k in LINEAR_SHAPES:
                cfg = g.default_config(m, n, k)
                assert cfg == g.pick_default_config(m, n, k, 1, sms, rule), (combo, m, n, k)
                assert g.default_config(m, n, k, sms=sms) is cfg  # the cached object
            for groups, r, d in WO_A_SHAPES:
                for fused_rope in (False, True):
                    cfg = g.wo_a_config(m, r, d, groups, fused_rope)
                    assert cfg == g.pick_wo_a_config(m, r, d, groups, fused_rope, sms, rule), (combo, m, groups)
                    assert g.wo_a_config(m, r, d, groups, fused_rope, sms=sms) is cfg


def test_a_switch_or_an_sm_count_gets_its_own_answer(monkeypatch, fresh_caches):
    monkeypatch.setattr(g, "sm_count", lambda device_index=None: 132)
    two_rows = g.default_config(2, *WO_B)
    assert two_rows.w_before_wait
    monkeypatch.setattr(g, "USE_W_BEFORE_WAIT", False)  # as the device tools set it for the forms before run 19
    assert not g.default_config(2, *WO_B).w_before_wait
    monkeypatch.setattr(g, "USE_W_BEFORE_WAIT", True)
    assert g.default_config(2, *WO_B) is two_rows
    # the K split follows the SM count (PROGRAMS_PER_SM programs per SM): wo_b at 1 row, wo_a's one-shot split
    h200, few = g.default_config(1, *WO_B), g.default_config(1, *WO_B, sms=2)
    assert few.split_k < h200.split_k and few == g.pick_default_config(1, *WO_B, 1, 2, g.rules())
    assert g.default_config(1, *WO_B, sms=132) is h200
    monkeypatch.setattr(g, "sm_count", lambda device_index=None: 2)
    assert g.default_config(1, *WO_B) is few
    groups, r, d = WO_A_SHAPES[0]
    assert g.wo_a_config(1, r, d, groups, True) != g.wo_a_config(1, r, d, groups, True, sms=132)


def test_device_facts_asked_once_per_device(monkeypatch, fresh_caches):
    asked = {"available": 0, "properties": [], "capability": []}
    counts = {0: 170, 1: 188}

    def available():
        asked["available"] += 1
        return True

    def properties(index):
        asked["properties"].append(index)
        return types.SimpleNamespace(multi_processor_count=counts[index])

    def capability(index=None):
        asked["capability"].append(index)
        return (12, 0)

    class FakeCuda:  # a 16-byte aligned weight on device 1
        device = torch.device("cuda", 1)

        def stride(self, dim=None):
            return (128 * 256, 256, 1) if dim is None else (128 * 256, 256, 1)[dim]

        def data_ptr(self):
            return 4096

    monkeypatch.setattr(torch.cuda, "is_available", available)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(g, "interpreter_enabled", lambda: False)
    for _ in range(3):
        assert g.sm_count() == g.sm_count(0) == 170 and g.sm_count(1) == 188
        assert g.pdl_supported(torch.device("cuda")) and g.pdl_supported(torch.device("cuda", 1))
        assert g.weight_tma_usable(FakeCuda())
        assert g.default_config(1, *WO_B) == g.pick_default_config(1, *WO_B, 1, 170, g.rules())
    assert asked == {"available": 1, "properties": [0, 1], "capability": [0, 1]}
