"""The seam registry's activation rules, kill switch and failure handling (no SGLang needed)."""

import pytest

from sglang_sm120.seams import (SEAM_NAMES, Seam, SeamRegistry, SeamState, activation, disabled_names, forced)

NO_GPU = (False, "no CUDA device")
SM120 = (True, "sm_120")
SM90 = (False, "sm_90")


def _seam(name="attention", install=lambda: None, applies=None):
    return Seam(name, "test seam", ("sglang.some.target",), install, applies)


@pytest.mark.parametrize("raw,expected", [
    ("", set()),
    ("attention", {"attention"}),
    ("attention, MoE ,dense", {"attention", "moe", "dense"}),
    ("all", set(SEAM_NAMES)),
    ("moe,all", set(SEAM_NAMES)),
    ("nonsense", set()),
])
def test_disabled_names(raw, expected):
    assert disabled_names({"SGLANG_SM120_DISABLE": raw}) == expected


@pytest.mark.parametrize("raw,expected", [("1", True), ("true", True), ("0", False), ("", False)])
def test_forced(raw, expected):
    assert forced({"SGLANG_SM120_FORCE": raw}) is expected


@pytest.mark.parametrize("env,gpu,state", [
    ({}, NO_GPU, SeamState.NOT_APPLICABLE),
    ({}, SM90, SeamState.NOT_APPLICABLE),
    ({}, SM120, SeamState.ACTIVE),
    ({"SGLANG_SM120_FORCE": "1"}, NO_GPU, SeamState.ACTIVE),
    ({"SGLANG_SM120_FORCE": "1", "SGLANG_SM120_DISABLE": "attention"}, SM120, SeamState.DISABLED_BY_ENV),
    ({"SGLANG_SM120_DISABLE": "all"}, SM120, SeamState.DISABLED_BY_ENV),
    ({"SGLANG_SM120_DISABLE": "moe"}, SM120, SeamState.ACTIVE),
])
def test_activation_rule(env, gpu, state):
    got, reason = activation(_seam(), env, gpu)
    assert got is state
    assert reason


def test_seam_precondition_makes_it_not_applicable():
    seam = _seam(applies=lambda: "needs something this process lacks")
    assert activation(seam, {}, SM120) == (SeamState.NOT_APPLICABLE, "needs something this process lacks")


def test_failed_install_is_recorded_not_raised(caplog):
    def broken():
        raise RuntimeError("target moved")

    registry = SeamRegistry()
    registry.add(_seam("attention", install=broken))
    registry.add(_seam("moe"))
    registry.apply_all(environ={}, gpu=SM120)
    assert registry.get("attention").state is SeamState.FAILED
    assert "target moved" in registry.get("attention").reason
    assert registry.is_active("moe") and not registry.is_active("attention")
    assert "SGLang's own path stays" in caplog.text


def test_install_runs_once_and_status_logs_once(caplog):
    calls = []
    registry = SeamRegistry()
    registry.add(_seam(install=lambda: calls.append(1)))
    registry.apply_all(environ={}, gpu=SM120)
    registry.apply_all(environ={}, gpu=SM120)
    assert calls == [1]
    caplog.set_level("INFO", logger="sglang_sm120")
    registry.log_once()
    registry.log_once()
    assert caplog.text.count("sglang-sm120 seams") == 1


def test_unknown_seam_name_rejected():
    with pytest.raises(ValueError, match="unknown seam"):
        SeamRegistry().add(_seam("flashmla"))
