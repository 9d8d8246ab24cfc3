"""The one-shot FP8 tensor-core program with its weight loaded before the PDL wait (``GemvConfig.w_before_wait``,
``_fp8mma_one_shot_item``) against the float32 reference under the CPU interpreter at reduced shapes: 1..8 rows (and
rows past M in the 8-row tile), ragged N and K (a short last split), split-K and no split, 1 / 2 / 4 / 8 blocks per
program, every count of blocks before the wait; bit for bit against the one-shot loop it replaces (same arithmetic in
the same order); grouped wo_a with the fused inverse RoPE (the rope block preloaded, factors hoisted, branch form);
outputs poisoned before every call, each call twice (split-K counters reset). Also its validation and name."""

import dataclasses

import pytest
import torch

from sglang_sm120.kernels import fp8_gemv as g

from ..conftest import DEVICE
from .test_fp8_gemv import OUTPUT_TOL, check_ragged_grouped_wo_a, poisoned, random_weight, rel_err, rope_freqs


def one_shot(block_n=64, split=2, unroll=4, warps=4, pre=0, sum_batch=8, pdl=True):
    return g.GemvConfig(8, block_n, split, True, warps, 1, unroll, fp8_mma=True, fp8_join=True, pdl=pdl,
                        split_sum_batch=sum_batch if split > 1 else 1, w_before_wait=pre)


# (config, N, K): K 1000 = 7.8 blocks; split 2 of 4 blocks (the last split's tail masked), split 4 of 2, no split with
# 8 blocks (wq_b's geometry), 1 block per program; N 200 against 64 / 128 columns (the last tile ragged)
CASES = [(one_shot(pre=4), 200, 1000), (one_shot(pre=1), 200, 1000), (one_shot(pre=2, block_n=128), 200, 1000),
         (one_shot(split=4, unroll=2, pre=2, sum_batch=4), 136, 1000), (one_shot(split=1, unroll=8, pre=8), 200, 1024),
         (one_shot(split=1, unroll=8, pre=2), 72, 1000), (one_shot(split=8, unroll=1, pre=1), 200, 1000),
         (one_shot(pre=8, pdl=False), 200, 1000)]


@pytest.mark.parametrize("cfg,n,k", CASES, ids=lambda v: v.name if isinstance(v, g.GemvConfig) else str(v))
@pytest.mark.parametrize("m", [1, 3, 8])
def test_w_before_wait_matches_reference_and_loop_form(cfg, n, k, m):
    gen = torch.Generator().manual_seed(7 * m + n + k + cfg.w_before_wait)
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen)
    x[:, ::37] *= 50  # outlier channels: per-row activation scales differ across blocks
    x = x.to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    loop_form = g.block_fp8_linear(x, w, s, config=dataclasses.replace(cfg, w_before_wait=0))
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
    y = g.block_fp8_linear(torch.zeros(0, 512, dtype=torch.bfloat16, device=DEVICE), w, s, config=one_shot(pre=4))
    assert y.shape == (0, 64)
    x = torch.zeros(2, 512, dtype=torch.bfloat16, device=DEVICE)  # amax 0: zeros, not NaN
    assert torch.equal(g.block_fp8_linear(x, w, s, config=one_shot(pre=2)), torch.zeros(2, 64, dtype=torch.bfloat16,
                                                                                         device=DEVICE))


# (head, rope, split): the split is one head (the rope block preloaded, rotated just before the last block), two heads
# per split (the factors hoisted), or rope dims in two blocks of a head (the branch form)
ROPE_CASES = [(512, 64, 2), (256, 64, 4), (512, 192, 2)]


@pytest.mark.parametrize("pre", [1, 2, 4])
@pytest.mark.parametrize("head,rope,split", ROPE_CASES)
def test_w_before_wait_wo_a_rope(head, rope, split, pre):
    """grouped wo_a with the fused inverse RoPE: within OUTPUT_TOL of the reference and bit for bit the shipped
    one-shot loop's result (ragged R, strided o, rows past M masked)."""
    gen = torch.Generator().manual_seed(head + rope + pre)
    b, groups, r, d = 3, 2, 160, 1024
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d + 64, generator=gen).to(torch.bfloat16).to(DEVICE)[..., :d]
    pos = torch.randint(0, 64, (b,), generator=gen).to(DEVICE)
    freqs = rope_freqs(rope, gen)
    kw = dict(positions=pos, freqs=freqs, head_dim=head, rope_dim=rope)
    unroll = 8 // split
    cfg = dataclasses.replace(one_shot(block_n=128, split=split, unroll=unroll, pre=pre), rope_preload=True)
    y = g.grouped_fp8_wo_a(o, w, s, out=poisoned((b, groups, r)), config=cfg, **kw)
    ref = g.reference_grouped_wo_a(o, w, s, pos, freqs, head, rope)
    assert torch.isfinite(y).all() and rel_err(y, ref) < OUTPUT_TOL
    assert torch.equal(y, g.grouped_fp8_wo_a(o, w, s, config=dataclasses.replace(cfg, w_before_wait=0), **kw))


@pytest.mark.parametrize("rope", [False, True])
def test_w_before_wait_wo_a_ragged(rope):
    check_ragged_grouped_wo_a(dataclasses.replace(one_shot(block_n=128, pre=4), rope_preload=True), rope, seed=71 + rope,
                              groups=2)


def test_w_before_wait_validation_and_name():
    assert one_shot(pre=2).name.endswith("_sb8_ww2")
    for bad in (dict(w_before_wait=3), dict(w_before_wait=-1), dict(num_stages=3, w_before_wait=1),
                dict(k_unroll=3, w_before_wait=1), dict(w_tma=True, w_before_wait=1),
                dict(fp8_chain=True, w_before_wait=1), dict(persistent_programs_per_sm=2, w_before_wait=1)):
        with pytest.raises(ValueError, match="w_before_wait"):
            dataclasses.replace(one_shot(), **bad)
    with pytest.raises(ValueError, match="w_before_wait"):
        g.GemvConfig(1, 32, 2, False, k_unroll=2, w_before_wait=1)
