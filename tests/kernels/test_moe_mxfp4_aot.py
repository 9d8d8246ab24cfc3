"""The CUDA-core GEMV decode of the MXFP4 MoE on sm_120a / sm_121a: no tensor-core instruction (the
registry test only checks that none is forbidden-and-present), and every thread's share of a weight
tile arrives in 16-byte loads, as the int32-word layout promises."""

import pytest

from sglang_sm120.kernels import moe_mxfp4 as moe
from sglang_sm120.kernels.harness.aot import TENSOR_CORE_OPCODES, run_isolated

GEMV = {c.name: c for c in moe.aot_configs() if "_gemv_" in c.name}


@pytest.fixture(scope="module")
def reports():
    """The GEMV configs compiled once per arch, in a child process with the interpreter off."""
    return {(r.config, r.arch): (r, p) for r, p in run_isolated(["moe_mxfp4"], archs=[120, 121], only=["_gemv_"])}


@pytest.mark.parametrize("arch", [120, 121])
@pytest.mark.parametrize("name", sorted(GEMV))
def test_gemv_streams_weights_in_16_byte_loads_without_tensor_cores(reports, name, arch):
    cfg = GEMV[name]
    report, problems = reports[(name, arch)]
    assert problems == [], report.summary()
    assert not report.tensor_core_opcodes and all(report.count(op) == 0 for op in TENSOR_CORE_OPCODES)
    rows = cfg.constexprs["BLOCK_N"] * (2 if cfg.kernel is moe._gate_up_gemv_kernel else 1)
    words_per_thread = rows * cfg.constexprs["BLOCK_K"] // 8 // (32 * cfg.num_warps)
    assert report.wide_loads >= words_per_thread // 4, report.summary()  # 4 int32 words per 16-byte load
    assert report.count("LDL") == 0 and report.count("STL") == 0
    assert report.shared_bytes <= 101376


F16 = {c.name: c for c in moe.aot_configs() if "_gemvtma_" in c.name and c.constexprs.get("EMULATE") is False}


@pytest.fixture(scope="module")
def f16_reports():
    """The fp16 pair decode's TMA GEMV configs compiled once per arch, interpreter off."""
    return {(r.config, r.arch): (r, p) for r, p in run_isolated(["moe_mxfp4"], archs=[120, 121], only=sorted(F16))}


@pytest.mark.parametrize("arch", [120, 121])
@pytest.mark.parametrize("name", sorted(F16))
def test_gemv_f16_decode_runs_every_weight_word_through_packed_fp16_math(f16_reports, name, arch):
    """Each weight word a thread holds per K step takes its 4 packed fp16 products (HMUL2 + 3 HFMA2, not split into
    float32 FMAs), its 4 pairs placed by byte permutes (PRMT, round 26) and one fp16x2 -> float32 conversion, with no
    spills."""
    cfg = F16[name]
    report, problems = f16_reports[(name, arch)]
    assert problems == [], report.summary()
    rows = cfg.constexprs["BLOCK_N"] * (2 if cfg.kernel is moe._gate_up_gemv_tma_f16_kernel else 1)
    words_per_thread = rows * cfg.constexprs["BLOCK_K"] // 8 // (32 * cfg.num_warps)
    assert report.count("HFMA2") + report.count("HMUL2") >= 4 * words_per_thread, report.summary()
    assert report.count("HADD2.F32") >= words_per_thread, report.summary()
    assert report.count("PRMT") >= 4 * words_per_thread, report.summary()  # each pair placed by one byte permute
    assert report.count("LDL") == 0 and report.count("STL") == 0
    assert report.shared_bytes <= 101376


PAIRS_TMA_DOWN = {c.name: c for c in moe.aot_configs() if c.kernel is moe._down_pairs_tma_kernel}


@pytest.fixture(scope="module")
def pairs_tma_reports():
    """The TMA swap-AB down tiles (whole K steps, and run 20's tile in MMAs of 128) compiled once per arch."""
    return {(r.config, r.arch): (r, p)
            for r, p in run_isolated(["moe_mxfp4"], archs=[120, 121], only=["_down_pairs_n16k512", "_down_pairs_n64k512"])}


@pytest.mark.parametrize("arch", [120, 121])
def test_pairs_tma_sub_k_down_tile_holds_fewer_registers(pairs_tma_reports, arch):
    """Run 20's down tile (64 rows on 2 warps, 8 routed rows per pass, a K step of 512 as 4 MMAs of 128) compiles to
    mma.sync fed by TMA without spills, and its per-thread registers are below the whole-step 16-row tile's (the
    512-wide MMA operand alone is 128 registers per thread)."""
    whole_cfg, sub_cfg = moe.PAIRS_TMA_TILES[1], moe.PAIRS_TMA_ROWS8_TILES[1]
    assert set(PAIRS_TMA_DOWN) >= {f"moe_mxfp4_down_pairs_{c.label()}" for c in (whole_cfg, sub_cfg)}
    whole, whole_problems = pairs_tma_reports[(f"moe_mxfp4_down_pairs_{whole_cfg.label()}", arch)]
    sub, sub_problems = pairs_tma_reports[(f"moe_mxfp4_down_pairs_{sub_cfg.label()}", arch)]
    assert whole_problems == [] and sub_problems == [], sub.summary()
    for report in (whole, sub):
        assert report.count("HMMA.16816.F32.BF16") > 0 and report.count("UTMALDG") > 0, report.summary()
        assert report.count("LDL") == 0 and report.count("STL") == 0 and report.shared_bytes <= 101376
    assert sub.registers < whole.registers, (sub.summary(), whole.summary())
