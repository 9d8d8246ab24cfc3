"""Every shipped Triton config compiles for sm_120a and sm_121a with the tensor-core opcodes it
declares, at most 101376 bytes of shared memory and no register spills."""

import pytest

from sglang_sm120.kernels.aot_registry import KERNEL_MODULES, all_configs
from sglang_sm120.kernels.harness.aot import compile_config

CASES = [(cfg, arch) for cfg in all_configs() for arch in cfg.archs]


def test_registry_lists_kernels():
    assert KERNEL_MODULES, "no kernel module is registered for the AOT check"
    assert CASES


@pytest.mark.parametrize("cfg,arch", CASES, ids=[f"{c.name}-sm{a}" for c, a in CASES])
def test_config_compiles_for_sm12x(cfg, arch):
    report = compile_config(cfg, arch)
    assert report.problems(cfg) == [], report.summary()
    assert report.ptx_target == f"sm_{arch}a"
