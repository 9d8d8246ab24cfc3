"""The seam registry's activation rules, kill switch and failure handling (no SGLang needed)."""

import sys

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


def test_unknown_disable_names_warned_once_per_value(caplog):
    from sglang_sm120 import seams

    seams._warned_disable_values.clear()
    env = {"SGLANG_SM120_DISABLE": "moe,flashmla"}
    with caplog.at_level("WARNING", logger="sglang_sm120"):
        for _ in range(6):  # asked once per seam
            assert seams.disabled_names(env) == {"moe"}
    assert caplog.text.count("unknown seams") == 1


def test_unrecognised_force_values_are_off_and_warned_once_per_value(caplog):
    from sglang_sm120 import seams

    seams._warned_force_values.clear()
    with caplog.at_level("WARNING", logger="sglang_sm120"):
        for _ in range(6):  # asked once per seam
            assert not seams.forced({"SGLANG_SM120_FORCE": "ture"})
        assert seams.forced({"SGLANG_SM120_FORCE": " Yes "}) and not seams.forced({"SGLANG_SM120_FORCE": "off"})
    assert caplog.text.count("is neither on") == 1 and "'ture'" in caplog.text


def test_reason_key_blanks_numbers():
    from sglang_sm120.seams import reason_key

    assert reason_key("max_seq_len must be <= 262144, got 262145") == reason_key("max_seq_len must be <= 262144, got 9")
    assert reason_key("s_q=2 (only 1 is covered)") != reason_key("clean_logits=True")


def test_run_or_fall_back_logs_each_kind_of_error_once(caplog):
    from sglang_sm120.seams import OnceLog, run_or_fall_back

    log = OnceLog("test")

    def raising(size):
        def ours():
            raise RuntimeError(f"out of resources: shared memory {size} > 101376")
        return ours

    with caplog.at_level("INFO", logger="sglang_sm120"):
        assert run_or_fall_back(log, "k", lambda: "ours", lambda: "upstream") == "ours"
        assert [run_or_fall_back(log, "k", raising(n), lambda: "upstream") for n in (120000, 130000)] == \
            ["upstream", "upstream"]
        assert run_or_fall_back(log, "k", lambda: [][1], lambda: "upstream") == "upstream"
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]  # RuntimeError once, IndexError once


def test_install_hooks_refuses_a_target_patched_without_ours_and_is_idempotent(monkeypatch):
    """A target another HookRegistry.apply_hooks() already patched cannot take our hook any more: install_hooks
    raises (the seam is marked failed) and registers nothing; our own earlier install is left as it is."""
    import collections
    import types

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_sm120.hooks import install_hooks

    monkeypatch.setattr(HookRegistry, "_hooks", collections.defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    module = types.ModuleType("sm120_hook_target")
    module.fn = lambda x: x + 1
    module.other = lambda x: x * 2
    monkeypatch.setitem(sys.modules, "sm120_hook_target", module)

    def ours(original, x):
        return original(x) + 100

    def theirs(original, x):
        return original(x) - 1

    HookRegistry.register("sm120_hook_target.fn", theirs, HookType.AROUND)
    HookRegistry.apply_hooks()
    with pytest.raises(RuntimeError, match="already patched"):
        install_hooks([("sm120_hook_target.other", ours, "AROUND"), ("sm120_hook_target.fn", ours, "AROUND")])
    assert "sm120_hook_target.other" not in HookRegistry._hooks and module.fn(1) == 1
    install_hooks([("sm120_hook_target.other", ours, "AROUND")])
    install_hooks([("sm120_hook_target.other", ours, "AROUND")])  # again: no second wrapper
    assert module.other(1) == 102 and len(HookRegistry._hooks["sm120_hook_target.other"]) == 1


def test_install_hooks_applies_only_its_own_targets(monkeypatch):
    """Installing a seam patches the seam's targets only: another plugin's target registered before it stays
    unpatched, so a plugin loaded later can still hook it, and SGLang's final apply_hooks() applies both plugins'
    hooks there (with apply_hooks() called at install, the later plugin's hook was silently dropped)."""
    import collections
    import types

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_sm120.hooks import install_hooks

    monkeypatch.setattr(HookRegistry, "_hooks", collections.defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    module = types.ModuleType("sm120_hook_target2")
    module.shared = lambda x: x
    module.ours = lambda x: x
    monkeypatch.setitem(sys.modules, "sm120_hook_target2", module)

    def earlier_plugin(original, x):
        return original(x) + 1

    def later_plugin(original, x):
        return original(x) + 10

    def ours(original, x):
        return original(x) + 100

    HookRegistry.register("sm120_hook_target2.shared", earlier_plugin, HookType.AROUND)
    install_hooks([("sm120_hook_target2.ours", ours, "AROUND")])
    assert module.ours(0) == 100  # live at once: the seam knows it took
    assert "sm120_hook_target2.shared" not in HookRegistry._patched and module.shared(0) == 0
    HookRegistry.register("sm120_hook_target2.shared", later_plugin, HookType.AROUND)
    HookRegistry.apply_hooks()  # what load_plugins() does after every plugin has registered
    assert module.shared(0) == 11 and module.ours(0) == 100  # both plugins' hooks; ours not wrapped twice


def test_a_later_plugins_hook_on_our_target_is_applied_on_top(monkeypatch):
    """A plugin loaded after ours that hooks one of our (already patched) targets: SGLang's apply_hooks() skips a
    patched target, so our AFTER step on apply_hooks applies that hook on top of ours, once."""
    import collections
    import types

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_sm120.hooks import install_hooks

    monkeypatch.setattr(HookRegistry, "_hooks", collections.defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    module = types.ModuleType("sm120_hook_target4")
    module.ours = lambda x: x
    monkeypatch.setitem(sys.modules, "sm120_hook_target4", module)

    def ours(original, x):
        return original(x) + 100

    def later_plugin(original, x):
        return original(x) * 2

    install_hooks([("sm120_hook_target4.ours", ours, "AROUND")])
    HookRegistry.register("sm120_hook_target4.ours", later_plugin, HookType.AROUND)
    assert module.ours(1) == 101  # registered, not yet applied
    HookRegistry.apply_hooks()
    assert module.ours(1) == 202  # theirs around ours
    HookRegistry.apply_hooks()  # again: nothing applied twice
    assert module.ours(1) == 202


def test_install_hooks_raises_when_a_target_cannot_be_patched(monkeypatch):
    """A target SGLang's HookRegistry refuses (here: an AROUND hook on a class) makes the install raise with the
    target and the reason, so the seam is marked failed; the class stays as it was."""
    import collections
    import types

    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_sm120.hooks import install_hooks

    monkeypatch.setattr(HookRegistry, "_hooks", collections.defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    module = types.ModuleType("sm120_hook_target3")

    class Target:
        pass

    module.Target = Target
    monkeypatch.setitem(sys.modules, "sm120_hook_target3", module)
    with pytest.raises(RuntimeError, match=r"could not patch sm120_hook_target3.Target: TypeError"):
        install_hooks([("sm120_hook_target3.Target", lambda original, *a: original(*a), "AROUND")])
    assert module.Target is Target and "sm120_hook_target3.Target" not in HookRegistry._patched


@pytest.mark.parametrize("capability,force,expected", [((12, 0), "", True), ((12, 1), "", True), ((9, 0), "", False),
                                                       ((8, 9), "", False), ((9, 0), "1", True)])
def test_kernels_take_calls_only_on_sm12x_devices_unless_forced(monkeypatch, capability, force, expected):
    """On a machine mixing GPUs the seams are active (some GPU is sm_12x), but a call on a tensor of another GPU keeps
    SGLang's path, with the reason; SGLANG_SM120_FORCE=1 sends every CUDA device's calls to our kernels. The answer is
    cached per device and forgotten by the registry's reset."""
    import types

    import torch

    from sglang_sm120 import seams

    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or capability)
    monkeypatch.setenv(seams.ENV_FORCE, force)
    seams.REGISTRY.reset()
    tensor = types.SimpleNamespace(is_cuda=True, device=types.SimpleNamespace(index=3))
    assert seams.kernels_runnable(tensor) is expected
    assert seams.kernels_runnable(tensor) is expected
    assert asked == ([] if force else [3])  # once per device
    if not expected:
        assert "is not an sm_12x GPU" in seams.not_runnable_reason(tensor)
    seams.REGISTRY.reset()
    monkeypatch.setenv(seams.ENV_FORCE, "1")
    assert seams.kernels_runnable(tensor) is True
    seams.REGISTRY.reset()
