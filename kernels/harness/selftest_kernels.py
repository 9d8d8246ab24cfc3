"""Tiny kernels with known code generation, used to prove the AOT harness reads what it claims
(opcodes, shared memory, compile failures). Not shipped to SGLang; not in the kernel registry."""

import triton
import triton.language as tl

from .aot import AotConfig


@triton.jit
def tile_matmul(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
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


def _config(name, dtype, unit_scaled, tile, stages=2, **kw):
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": "*fp32", "K": "i32", "BM": "constexpr",
           "BN": "constexpr", "BK": "constexpr", "UNIT_SCALED_FP8": "constexpr"}
    bm, bn, bk = tile
    return AotConfig(name=name, kernel=tile_matmul, signature=sig,
                     constexprs={"BM": bm, "BN": bn, "BK": bk, "UNIT_SCALED_FP8": unit_scaled},
                     num_stages=stages, div16=("K",), **kw)


def aot_configs():
    return [
        _config("selftest/bf16_dot", "bf16", False, (64, 64, 64), expect_opcodes=("HMMA.16816.F32.BF16",)),
        _config("selftest/fp8_unit_scaled", "fp8e4nv", True, (64, 64, 128), expect_opcodes=("QMMA.SF",),
                archs=(120,)),
        _config("selftest/expects_missing_omma", "bf16", False, (64, 64, 64), expect_opcodes=("OMMA",),
                archs=(120,)),
        _config("selftest/smem_over_limit", "bf16", False, (256, 256, 64), stages=3, max_spill_bytes=10**6,
                archs=(120,)),
        AotConfig(name="selftest/bad_signature", kernel=tile_matmul, signature={"a_ptr": "*bf16"}, constexprs={},
                  archs=(120,)),
    ]
