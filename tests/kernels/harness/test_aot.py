"""The AOT harness itself: it must see the opcodes, shared memory and spills it claims to see."""

import pytest
import triton
import triton.language as tl

from sglang_sm120.kernels.dsv4 import SM120_SMEM_LIMIT
from sglang_sm120.kernels.harness.aot import AotConfig, compile_config


@triton.jit
def _tile_matmul(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 UNIT_SCALED_FP8: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + rn[:, None] * K + (k + rk)[None, :])
        if UNIT_SCALED_FP8:
            ones_a = tl.full((BM, BK // 32), 127, tl.uint8)
            ones_b = tl.full((BN, BK // 32), 127, tl.uint8)
            acc = tl.dot_scaled(a, ones_a, "e4m3", b.T, ones_b, "e4m3", acc)
        else:
            acc = tl.dot(a, b.T, acc)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


def _config(dtype, unit_scaled, tile, stages=2, **kw):
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": "*fp32", "K": "i32", "BM": "constexpr",
           "BN": "constexpr", "BK": "constexpr", "UNIT_SCALED_FP8": "constexpr"}
    bm, bn, bk = tile
    return AotConfig(name=f"selftest_{dtype}_{bm}x{bn}x{bk}", kernel=_tile_matmul, signature=sig,
                     constexprs={"BM": bm, "BN": bn, "BK": bk, "UNIT_SCALED_FP8": unit_scaled},
                     num_stages=stages, div16=("K",), **kw)


@pytest.mark.parametrize("arch", [120, 121])
def test_bf16_dot_uses_hmma(arch):
    cfg = _config("bf16", False, (64, 64, 64), expect_opcodes=("HMMA.16816.F32.BF16",))
    report = compile_config(cfg, arch)
    assert report.ok, report.error
    assert report.ptx_target == f"sm_{arch}a"
    assert report.problems(cfg) == []
    assert report.registers > 0 and report.spill_store_bytes == 0
    assert report.wide_loads > 0  # 16-byte-aligned pointers give 128-bit loads


def test_unit_scaled_fp8_uses_block_scaled_qmma():
    cfg = _config("fp8e4nv", True, (64, 64, 128), expect_opcodes=("QMMA.SF",))
    report = compile_config(cfg, 120)
    assert report.problems(cfg) == []
    assert report.count("QMMA.SF") > 0


def test_missing_opcode_is_reported():
    cfg = _config("bf16", False, (64, 64, 64), expect_opcodes=("OMMA",))
    problems = compile_config(cfg, 120).problems(cfg)
    assert any("OMMA" in p for p in problems)


def test_shared_memory_over_limit_is_reported():
    cfg = _config("bf16", False, (256, 256, 64), stages=3, max_spill_bytes=10**6)
    report = compile_config(cfg, 120)
    assert report.ok and report.shared_bytes > SM120_SMEM_LIMIT
    assert any("shared memory" in p for p in report.problems(cfg))


def test_compile_failure_is_a_report_not_an_exception():
    cfg = AotConfig(name="bad", kernel=_tile_matmul, signature={"a_ptr": "*bf16"}, constexprs={})
    report = compile_config(cfg, 120)
    assert not report.ok and "signature lacks" in report.error
