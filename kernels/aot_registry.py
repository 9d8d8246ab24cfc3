"""Every kernel module whose shipped Triton configs the AOT check compiles for sm_120a/sm_121a.

Each listed module defines ``aot_configs() -> list[AotConfig]``; add a module here when it ships
a kernel. ``tools/aot_sm120.py``, ``sglang-sm120 aot-check`` and ``tests/kernels/test_aot_registry.py``
all read this one list.
"""

from __future__ import annotations

import importlib

from .harness.aot import AotConfig

KERNEL_MODULES: tuple[str, ...] = (
    "sparse_mla_decode",
    "moe_mxfp4",
    "moe_prefill",
    "indexer",
    "fp8_gemv",
    "bench_common",
    "bf16_gemv",
)


def all_configs(modules: tuple[str, ...] = KERNEL_MODULES) -> list[AotConfig]:
    configs: list[AotConfig] = []
    for name in modules:
        module = importlib.import_module(f"{__package__}.{name}")
        configs.extend(module.aot_configs())
    names = [c.name for c in configs]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"AOT config names must be unique; repeated: {sorted(duplicates)}")
    return configs
