"""The block-FP8 GEMV with its weight tiles fetched by TMA (``GemvConfig(w_tma=True)``), under the CPU
interpreter at reduced shapes: every launch form against the float32 reference and bit for bit against the
same form with plain weight loads, the grouped wo_a kernel, and the plain fallback where no descriptor can be
made. On the GPU the device script (``--tma-sweep``) checks the TMA forms at full shapes and inside a CUDA graph
of PDL launches."""

import dataclasses

import pytest
import torch

from sglang_sm120.kernels import fp8_gemv as g

from .test_fp8_gemv import (HEAD, OUTPUT_TOL, ROPE, check_ragged_grouped_wo_a, fresh_caches,  # noqa: F401 (fixture)
                             poisoned, random_weight, rel_err, rope_inputs)


def tma(cfg, **kw):
    return dataclasses.replace(cfg, w_tma=True, **kw)


def q8(block_n=64, split=1, warps=4, **kw):
    return g.GemvConfig(8, block_n, split, True, warps, 3, fp8_mma=True, fp8_join=True, **kw)


TMA_FORMS = [
    tma(g.GemvConfig(1, 32, 1, False, k_unroll=2)),  # 1-row FMA form
    tma(g.GemvConfig(1, 32, 3, False, k_unroll=2, pdl=True, pdl_l2_blocks=4)),  # as shipped at 1 row, split-K
    tma(g.GemvConfig(1, 32, 2, False, k_unroll=2), num_stages=4),
    tma(g.GemvConfig(16, 32, 2, True, pdl=True, pdl_late=True, pdl_l2_blocks=4)),  # 16-row bf16 tensor cores
    tma(g.GemvConfig(2, 32, 1, False, k_unroll=2, rows_form=True)),  # rows form
    tma(g.GemvConfig(2, 32, 3, False, k_unroll=2, rows_form=True, prefetch=True, pdl=True, pdl_l2_blocks=16)),
    tma(g.GemvConfig(4, 32, 2, False, k_unroll=1, rows_form=True, evict_first=True)),
    tma(q8()),  # FP8 tensor cores, 64 columns
    tma(q8(128, 3, 8, pdl=True)),  # as shipped on wo_a / wo_b at 2..8 rows, split-K
    tma(q8(split=2), num_stages=2),
]

# N ragged against every tile; K ragged against the 128-wide scale blocks but a multiple of 16 (a TMA stride)
N, K = 200, 1040


@pytest.mark.parametrize("cfg", TMA_FORMS, ids=lambda c: c.name)
@pytest.mark.parametrize("m", [1, 2, 5])
def test_tma_forms_match_reference_and_non_tma_form(cfg, m):
    if cfg.rows_form and m > cfg.block_m and cfg.block_m == 1:
        m = 3
    gen = torch.Generator().manual_seed(31 * m + cfg.block_n + cfg.split_k)
    w, s = random_weight(N, K, gen=gen)
    x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
    assert g.weight_tma_usable(w.unsqueeze(0))
    ref = g.reference_block_fp8_linear(x, w, s)
    plain = g.block_fp8_linear(x, w, s, config=dataclasses.replace(cfg, w_tma=False))
    for _ in range(2):  # the second call checks the split-K counters were left at zero
        y = g.block_fp8_linear(x, w, s, out=poisoned((m, N)), config=cfg)
        assert torch.isfinite(y).all()
        assert rel_err(y, ref) < OUTPUT_TOL, cfg.name
        assert torch.equal(y, plain), cfg.name  # the same tiles, the same arithmetic
    if cfg.split_k > 1:
        assert all(int(c.abs().sum()) == 0 for c in g._counter_cache.values())


@pytest.mark.parametrize("cfg", [tma(g.GemvConfig(1, 32, 4, False, k_unroll=2, pdl=True, pdl_l2_blocks=4)),
                                 tma(q8(128, 4, 8, pdl=True)),
                                 tma(g.GemvConfig(2, 32, 4, False, k_unroll=2, rows_form=True, pdl=True,
                                                  pdl_late=True))], ids=lambda c: c.name)
@pytest.mark.parametrize("rope", [False, True])
def test_wo_a_tma_forms(cfg, rope):
    """Groups of a ragged row count (R = 160 against 128-column tiles): the 3-D descriptor zero-fills the rows
    past R instead of reading the next group's; a strided ``o`` (a slice of a wider buffer)."""
    check_ragged_grouped_wo_a(cfg, rope, seed=37 + rope, groups=2)


def _no_descriptor(*args):
    raise AssertionError("a TMA descriptor was built where none can be used")


@pytest.mark.parametrize("case", ["misaligned_base", "k_stride_not_16_bytes"])
def test_fallback_where_no_descriptor_can_be_made(monkeypatch, case):
    gen = torch.Generator().manual_seed(41)
    if case == "misaligned_base":  # the weight starts 8 bytes into its storage
        n, k = 96, 512
        w_full, s = random_weight(n, k + 8, gen=gen)
        w = w_full.flatten()[8:8 + n * k].view(n, k)
        s = s[:, :k // 128].contiguous()
    else:  # K = 1000: row stride 1000 bytes
        n, k = 96, 1000
        w, s = random_weight(n, k, gen=gen)
    assert not g.weight_tma_usable(w.unsqueeze(0))
    monkeypatch.setattr(g, "_weight_descriptor", _no_descriptor)
    x = torch.randn(2, k, generator=gen).to(torch.bfloat16)
    for cfg in (tma(g.GemvConfig(1, 32, 2, False, k_unroll=2)), tma(q8(split=2))):
        y = g.block_fp8_linear(x, w, s, out=poisoned((2, n)), config=cfg)
        assert rel_err(y, g.reference_block_fp8_linear(x, w, s)) < OUTPUT_TOL


@pytest.mark.parametrize("capability, expected", [((8, 0), False), ((9, 0), True), ((12, 0), True)])
def test_tma_only_on_gpus_with_the_copy_engine(monkeypatch, fresh_caches, capability, expected):
    w = torch.zeros(1, 128, 256, dtype=g.FP8_DTYPE)
    assert g.weight_tma_usable(w) is g.interpreter_enabled()  # on the CPU: only under the interpreter

    class FakeCuda:  # a 16-byte aligned tensor on a "cuda" device of the given capability
        device = torch.device("cuda", 0)

        def __init__(self):
            self.stride = w.stride

        def data_ptr(self):
            return 4096

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert g.weight_tma_usable(FakeCuda()) is expected


def test_tma_config_validation_name_and_aot():
    cfg = tma(g.GemvConfig(1, 32, 1, False, k_unroll=2, pdl=True, pdl_l2_blocks=4))
    assert cfg.name.endswith("_pdl_l2p4_tma") and cfg.weight_tile_k == 256
    assert tma(q8(128)).weight_tile_k == 128  # one 128-block per load, whatever the unroll
    with pytest.raises(ValueError, match="w_tma"):  # the one-shot rows form's 1024-wide tile: wider than a box
        tma(g.GemvConfig(1, 16, 1, False, num_warps=8, k_unroll=8, rows_form=True, prefetch=True))
    aot = g.aot_config(cfg)
    assert aot.name.endswith("_tma") and aot.constexprs["W_TMA"] == cfg.num_stages
    assert aot.signature["w_desc"] == "tensordesc<fp8e4nv[1, 32, 256]>"
    assert g.TMA_LOAD_OPCODE in aot.expect_opcodes and "LDG.E.128" not in aot.expect_opcodes
    assert set(g.PDL_OPCODES) <= set(aot.expect_opcodes)
    plain = g.aot_config(dataclasses.replace(cfg, w_tma=False))
    assert plain.constexprs["W_TMA"] == 0 and plain.signature["w_desc"] == "*fp8e4nv"
    assert "LDG.E.128" in plain.expect_opcodes and g.TMA_LOAD_OPCODE not in plain.expect_opcodes


def test_default_config_tma_where_measured_faster(monkeypatch):
    """H200 runs 11 / 11b (benchmarks/fp8_gemv-h200-run11-tma-summary.md): 1 row on 64-column FMA tiles by TMA for
    wo_a / wo_b at T=1 (32 MiB, K >= 4096) at the 32-column form's K split; nowhere else without the fused RoPE."""
    for n, k, groups in ((1024, 4096, 8), (4096, 8192, 1)):
        cfg = g.default_config(1, n, k, groups)
        plain = g.launch_form(1, n, k, groups)
        assert cfg.w_tma and cfg.block_n == 64 and plain.block_n == 32 and cfg.split_k == plain.split_k
        assert cfg.pdl and cfg.pdl_l2_blocks == g.PDL_FMA_L2_BLOCKS and cfg.num_stages == 3
    for n, k, groups in ((4096, 4096, 1), (4096, 2048, 1), (1536, 4096, 1), (1024, 4096, 4)):
        assert not g.default_config(1, n, k, groups).w_tma  # the 16 MiB and smaller weights
    # wq_b T=1 (K = 1024): by TMA only in the persistent form of runs 13 / 13b beside other streams (alone: the
    # one-chunk rows form, test_fp8_gemv_persistent.py)
    assert g.sharing_default_config(1, 32768, 1024).w_tma and not g.default_config(1, 32768, 1024).w_tma
    for m in (2, 4, 8, 16):
        assert not g.default_config(m, 1024, 4096, 8).w_tma and not g.default_config(m, 4096, 8192).w_tma
    monkeypatch.setattr(g, "USE_TMA", False)
    assert g.default_config(1, 1024, 4096, 8).block_n == 32 and not g.default_config(1, 1024, 4096, 8).w_tma


def test_wo_a_config_with_fused_rope_where_measured_faster(monkeypatch):
    """With the fused inverse RoPE: 1 row at T=1 on default_config's 64-column FMA tile by TMA with the RoPE factors
    hoisted (runs 17 / 17b), at T = 2 / 4 on 64-column FMA tiles with plain loads (not T=8); 2..8 rows at T=1 on the
    one-shot FP8 tile with the rope block preloaded (run 17b), 3..8 rows at T=2 on default_config's FP8 tile with it;
    without it, at T=1 the one-shot FP8 tile at 2..4 rows (runs 15 / 15b), else default_config. (Without the one-chunk
    rule of runs 18 / 18b: test_fp8_gemv_one_chunk.py; the one-shot program with block 0 before the PDL wait of runs
    19 / 20, which replaces the T=1 2..8-row forms: test_fp8_gemv_w_before_wait.py.)"""
    monkeypatch.setattr(g, "USE_ONE_CHUNK", False)
    monkeypatch.setattr(g, "USE_W_BEFORE_WAIT", False)
    cfg = g.wo_a_config(1, 1024, 4096, 8, fused_rope=True)
    assert cfg == dataclasses.replace(g.default_config(1, 1024, 4096, 8), rope_hoist=True) and cfg.w_tma
    for groups in (4, 2):
        cfg = g.wo_a_config(1, 1024, 4096, groups, fused_rope=True)
        assert cfg.block_n == 64 and not cfg.w_tma and not cfg.use_dot and not cfg.rope_hoist
        assert cfg.split_k == g.default_config(1, 1024, 4096, groups).split_k
    assert g.wo_a_config(1, 1024, 4096, 1, fused_rope=True) == g.default_config(1, 1024, 4096, 1)
    for m in range(2, 9):
        default = g.default_config(m, 1024, 4096, 8)
        one_shot = dataclasses.replace(default, num_warps=4, k_unroll=4, num_stages=1, split_sum_batch=8)
        assert default.split_k == 8 and default.fp8_mma  # 32 K blocks: one iteration of 4 per program, one head
        assert g.wo_a_config(m, 1024, 4096, 8, fused_rope=True) == dataclasses.replace(one_shot, rope_preload=True)
        plain = g.wo_a_config(m, 1024, 4096, 8, fused_rope=False)
        assert plain == (one_shot if m <= 4 else default)
        t2 = g.default_config(m, 1024, 4096, 4)
        assert g.wo_a_config(m, 1024, 4096, 4, fused_rope=False) == t2
        assert g.wo_a_config(m, 1024, 4096, 4, fused_rope=True) == (
            dataclasses.replace(t2, rope_preload=True) if t2.fp8_mma else t2)
        assert t2.fp8_mma == (m >= 3) and not (t2.fp8_mma and t2.pdl)
    assert g.wo_a_config(1, 1024, 4096, 8, fused_rope=False) == g.default_config(1, 1024, 4096, 8)
    monkeypatch.setattr(g, "USE_TMA", False)  # the one-shot / preload forms load the weight without TMA
    assert g.wo_a_config(1, 1024, 4096, 8, fused_rope=True) == g.default_config(1, 1024, 4096, 8)
    assert g.wo_a_config(2, 1024, 4096, 8, fused_rope=True).rope_preload


def test_grouped_wo_a_picks_wo_a_config(monkeypatch):
    """grouped_fp8_wo_a launches wo_a_config's form: with positions/freqs the fused-RoPE choice."""
    launched = []
    monkeypatch.setattr(g, "_launch", lambda *args, **kw: launched.append(args[8]))
    monkeypatch.setattr(g, "wo_a_config", lambda b, r, d, groups, fused_rope: g.GemvConfig(
        1, 64 if fused_rope else 32, 1, False))
    gen = torch.Generator().manual_seed(43)
    w, s = random_weight(128, 512, groups=2, gen=gen)
    o = torch.randn(1, 2, 512, generator=gen).to(torch.bfloat16)
    pos, freqs, _ = rope_inputs(1, gen)
    g.grouped_fp8_wo_a(o, w, s)
    g.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, head_dim=HEAD, rope_dim=ROPE)
    assert [c.block_n for c in launched] == [32, 64]
