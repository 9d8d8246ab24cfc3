"""The one-shot FP8 tensor-core program with block 0's weight loaded before the PDL wait (``GemvConfig.w_before_wait``,
``_fp8mma_one_shot_item``) against the float32 reference under the CPU interpreter at reduced shapes: 1..8 rows (and
rows past M in the 8-row tile), ragged N and K (a short last split), split-K and no split; bit for bit against the
one-shot loop it replaces (same arithmetic in the same order); grouped wo_a with the fused inverse RoPE (the rope block
preloaded, factors hoisted, branch form); a register cap (``max_registers``) changes nothing in the result; outputs
poisoned before every call, each call twice (split-K counters reset). Also the rules that pick it (default_config /
wo_a_config, H200 runs 19 / 20), the one-wave register bound, its validation, name and AOT registration."""

import dataclasses

import pytest
import torch

from sglang_sm120.kernels import fp8_gemv as g

from ..conftest import DEVICE
from .test_fp8_gemv import OUTPUT_TOL, check_ragged_grouped_wo_a, poisoned, random_weight, rel_err, rope_freqs


def one_shot(block_n=64, split=2, warps=4, pre=1, sum_batch=8, pdl=True, cap=0):
    return g.GemvConfig(8, block_n, split, True, warps, 1, g.ONE_SHOT_BLOCKS.value, fp8_mma=True, fp8_join=True,
                        pdl=pdl, split_sum_batch=sum_batch if split > 1 else 1, w_before_wait=pre, max_registers=cap)


# (config, N, K): K 1000 = 7.8 blocks, split 2 of 4 blocks (the last split's tail masked); K 512 without a split; split
# 4 of 4 blocks (wo_b's geometry at 16 blocks); N 200 / 136 / 72 against 64 / 128 columns (the last tile ragged)
CASES = [(one_shot(), 200, 1000), (one_shot(block_n=128), 200, 1000), (one_shot(split=1), 72, 512),
         (one_shot(split=4, sum_batch=4), 136, 2048), (one_shot(pdl=False), 200, 1000), (one_shot(cap=128), 200, 1000)]


@pytest.mark.parametrize("cfg,n,k", CASES, ids=lambda v: v.name if isinstance(v, g.GemvConfig) else str(v))
@pytest.mark.parametrize("m", [1, 3, 8])
def test_w_before_wait_matches_reference_and_loop_form(cfg, n, k, m):
    gen = torch.Generator().manual_seed(7 * m + n + k)
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen)
    x[:, ::37] *= 50  # outlier channels: per-row activation scales differ across blocks
    x = x.to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    loop_form = g.block_fp8_linear(x, w, s, config=dataclasses.replace(cfg, w_before_wait=0, max_registers=0))
    for _ in range(2):
        out = poisoned((m, n))
        y = g.block_fp8_linear(x, w, s, out=out, config=cfg)
        assert y is out and torch.isfinite(y).all()
        assert rel_err(y, ref) < OUTPUT_TOL, cfg.name
        assert torch.equal(y, loop_form), cfg.name
    if cfg.split_k > 1:
        assert all(int(c.abs().sum()) == 0 for c in g._counter_cache.values())


def test_w_before_wait_zero_rows():
    w, s = random_weight(64, 512)
    y = g.block_fp8_linear(torch.zeros(0, 512, dtype=torch.bfloat16, device=DEVICE), w, s, config=one_shot(split=1))
    assert y.shape == (0, 64)
    x = torch.zeros(2, 512, dtype=torch.bfloat16, device=DEVICE)  # amax 0: zeros, not NaN
    assert torch.equal(g.block_fp8_linear(x, w, s, config=one_shot(split=1)),
                       torch.zeros(2, 64, dtype=torch.bfloat16, device=DEVICE))


# (head, rope): every split (4 blocks) one head (the rope block preloaded, rotated just before the last block), two
# heads (the factors hoisted), or rope dims in two blocks of a head (the branch form)
ROPE_CASES = [(512, 64), (256, 64), (512, 192)]


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("cap", [0, 128])
@pytest.mark.parametrize("head,rope", ROPE_CASES)
def test_w_before_wait_wo_a_rope(head, rope, cap, pairs):
    """grouped wo_a with the fused inverse RoPE: within OUTPUT_TOL of the reference and bit for bit the one-shot loop's
    result without the wait-split (ragged R, strided o, rows past M masked); rope_pairs (the rope block rotated from its
    own pairs; where the rope block is not preloaded it changes nothing) the same arithmetic."""
    gen = torch.Generator().manual_seed(head + rope + cap)
    b, groups, r, d = 3, 2, 160, 1024
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d + 64, generator=gen).to(torch.bfloat16).to(DEVICE)[..., :d]
    pos = torch.randint(0, 64, (b,), generator=gen).to(DEVICE)
    freqs = rope_freqs(rope, gen)
    kw = dict(positions=pos, freqs=freqs, head_dim=head, rope_dim=rope)
    cfg = dataclasses.replace(one_shot(block_n=128, cap=cap), rope_preload=True, rope_pairs=pairs)
    y = g.grouped_fp8_wo_a(o, w, s, out=poisoned((b, groups, r)), config=cfg, **kw)
    ref = g.reference_grouped_wo_a(o, w, s, pos, freqs, head, rope)
    assert torch.isfinite(y).all() and rel_err(y, ref) < OUTPUT_TOL
    loop_form = dataclasses.replace(cfg, w_before_wait=0, max_registers=0, rope_pairs=False)
    assert torch.equal(y, g.grouped_fp8_wo_a(o, w, s, config=loop_form, **kw))


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("rope", [False, True])
def test_w_before_wait_wo_a_ragged(rope, pairs):
    check_ragged_grouped_wo_a(dataclasses.replace(one_shot(block_n=128, cap=128), rope_preload=True, rope_pairs=pairs),
                              rope, seed=71 + rope, groups=2)


def test_w_before_wait_validation_and_name():
    assert one_shot().name.endswith("_sb8_ww1") and one_shot(cap=128).name.endswith("_sb8_ww1_r128")
    for bad in (dict(w_before_wait=2), dict(w_before_wait=-1), dict(num_stages=3), dict(k_unroll=2),
                dict(k_unroll=8), dict(w_tma=True), dict(fp8_chain=True), dict(persistent_programs_per_sm=2)):
        with pytest.raises(ValueError, match="w_before_wait"):
            dataclasses.replace(one_shot(), **bad)
    with pytest.raises(ValueError, match="w_before_wait"):
        g.GemvConfig(1, 32, 2, False, k_unroll=4, w_before_wait=1)
    pairs = dataclasses.replace(one_shot(), rope_preload=True, rope_pairs=True)
    assert pairs.name.endswith("_rp_ww1_pairs")
    for bad in (dict(w_before_wait=0), dict(rope_preload=False)):
        with pytest.raises(ValueError, match="rope_pairs"):
            dataclasses.replace(pairs, **bad)
    for bad_cap in (-8, 8, 256):
        with pytest.raises(ValueError, match="max_registers"):
            one_shot(cap=bad_cap)


@pytest.mark.parametrize("sms", [132, 170, 188])
def test_defaults_where_runs_19_to_21_measured_faster(monkeypatch, sms):
    """T=1, 2..8 rows: wo_a (8 groups, split 8) and wo_b ([4096, 8192], split 16) on the one-shot program with block
    0 before the wait; wo_a with the fused RoPE at 1..8 rows the same program (2-row tile at 1 row) with the rope block
    preloaded and rotated from its own pairs, no register cap; 1 row without the RoPE, wq_b and T >= 2 unchanged;
    USE_WO_A_ROPE_PAIRS = False / USE_W_BEFORE_WAIT = False restore the forms before runs 21 / 19."""
    monkeypatch.setattr(g, "sm_count", lambda device_index=None: sms)
    for m in range(1, 9):
        seam = g.wo_a_config(m, 1024, 4096, 8, fused_rope=True)
        plain2 = g.default_config(max(m, 2), 1024, 4096, 8)
        assert seam == dataclasses.replace(plain2, rope_preload=True, rope_pairs=True)
        assert seam.w_before_wait == 1 and not seam.max_registers
        for groups in (4, 2, 1):  # T >= 2: no PDL on the wide tile, no one-shot
            assert not g.wo_a_config(m, 1024, 4096, groups, fused_rope=True).w_before_wait
            assert not g.wo_a_config(m, 1024, 4096, groups, fused_rope=False).w_before_wait
        if m == 1:
            continue
        wo_b = g.default_config(m, 4096, 8192)
        assert wo_b.w_before_wait == 1 and wo_b.k_unroll == 4 and wo_b.split_k == 16 and wo_b.num_warps == 4
        assert wo_b.num_stages == 1 and wo_b.split_sum_batch == 8 and wo_b.pdl and not wo_b.max_registers
        plain = g.wo_a_config(m, 1024, 4096, 8, fused_rope=False)
        assert plain == g.default_config(m, 1024, 4096, 8) and plain.w_before_wait == 1 and plain.split_k == 8
        assert not g.default_config(m, 32768, 1024).w_before_wait  # wq_b: its 8-block program lost
    assert not g.wo_a_config(1, 1024, 4096, 8, fused_rope=False).w_before_wait  # 1 row, no RoPE: the FMA tile
    assert not g.default_config(1, 4096, 8192).w_before_wait
    monkeypatch.setattr(g, "USE_WO_A_ROPE_PAIRS", False)
    assert not g.wo_a_config(1, 1024, 4096, 8, fused_rope=True).w_before_wait  # run 17b's FMA tile at 1 row
    before21 = g.wo_a_config(4, 1024, 4096, 8, fused_rope=True)
    assert before21.rope_preload and before21.w_before_wait == 1 and not before21.rope_pairs
    monkeypatch.setattr(g, "USE_W_BEFORE_WAIT", False)
    assert g.default_config(8, 4096, 8192).num_stages == 3 and not g.default_config(8, 4096, 8192).w_before_wait
    seam = g.wo_a_config(8, 1024, 4096, 8, fused_rope=True)
    assert seam.rope_preload and not seam.w_before_wait and not seam.max_registers


def test_aot_registers_the_run_21_forms():
    names = {c.name: c for c in g.aot_configs()}
    plain = one_shot(block_n=128, split=4)  # split_k matters to the compile only as 1 vs > 1
    assert g.aot_config(plain).name in names
    # the fused-RoPE forms, with and without rope pairs, uncapped: the AOT check allows no spills
    for pairs in (True, False):
        rope = g.aot_config(dataclasses.replace(plain, rope_preload=True, rope_pairs=pairs), True)
        assert rope.name in names and names[rope.name].max_spill_bytes == 0
    assert not any(c.max_registers for c in names.values())
    assert not any("_ww2" in n or "_ww4" in n or "_ww8" in n for n in names)
    assert g.wo_a_config(8, 1024, 4096, 8, True).rope_pairs
