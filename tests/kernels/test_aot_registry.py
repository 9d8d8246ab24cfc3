"""Every shipped Triton config compiles for sm_120a and sm_121a (or, a config shipped for compute capability 9 only,
for sm_90a) with the tensor-core opcodes it declares, at most 101376 bytes of shared memory and no register spills."""

import pytest

from sglang_sm120.kernels.aot_registry import KERNEL_MODULES, all_configs
from sglang_sm120.kernels.harness.aot import run_isolated

CASES = [(cfg.name, arch) for cfg in all_configs() for arch in cfg.archs]


@pytest.fixture(scope="module")
def reports():
    """All configs compiled once, in a child process with the interpreter off."""
    return {(r.config, r.arch): (r, p) for r, p in run_isolated()}


def test_registry_lists_kernels():
    assert KERNEL_MODULES, "no kernel module is registered for the AOT check"
    assert CASES


@pytest.mark.parametrize("name,arch", CASES, ids=[f"{n}-sm{a}" for n, a in CASES])
def test_config_compiles_for_sm12x(reports, name, arch):
    report, problems = reports[(name, arch)]
    assert problems == [], report.summary()
    assert report.ptx_target == f"sm_{arch}a"
