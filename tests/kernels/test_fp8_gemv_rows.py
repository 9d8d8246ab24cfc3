"""The rows launch form of the block-FP8 GEMV (``GemvConfig(rows_form=True)``: up to 8 rows share each
dequantised weight chunk on CUDA cores) against the float32 reference, under the CPU interpreter at
reduced shapes: every block_m (1, 2, 4, 8), split-K on and off, prefetch and evict-first, row counts
0..16 (row tiles), each DSv4 linear's shape family, grouped wo_a with and without the fused inverse
RoPE; outputs poisoned before every call."""

import pytest
import torch

from sglang_sm120.kernels import fp8_gemv as g

from ..conftest import DEVICE
from .test_fp8_gemv import HEAD, OUTPUT_TOL, ROPE, poisoned, random_weight, rel_err, rope_inputs


def rows(block_m, block_n=32, split=1, unroll=2, warps=4, prefetch=True, evict_first=False, x_broadcast=False):
    return g.GemvConfig(block_m, block_n, split, False, warps, 3, unroll, rows_form=True, prefetch=prefetch,
                        evict_first=evict_first, x_broadcast=x_broadcast)


FORMS = [rows(1), rows(1, 16, 3, unroll=4, evict_first=True), rows(2, 32, 4, prefetch=False),
         rows(4, 16, 2, unroll=4), rows(4, 32, 1, unroll=1, warps=8), rows(8, 16, 3, unroll=4),
         rows(8, 32, 1, unroll=8, warps=8, evict_first=True),
         # activation broadcast over the tile's columns (experimental: no default uses it yet)
         rows(2, 32, 3, prefetch=False, x_broadcast=True), rows(8, 16, 2, unroll=4, x_broadcast=True)]


# 1-row forms tile the rows like the others: 3 rows show it (16 one-row tiles only cost interpreter time)
CASES = [(cfg, m) for cfg in FORMS for m in (1, 2, 3, 8, 16) if cfg.block_m > 1 or m <= 3]


@pytest.mark.parametrize("cfg,m", CASES, ids=lambda v: v.name if isinstance(v, g.GemvConfig) else f"m{v}")
def test_rows_forms_match_reference(cfg, m):
    gen = torch.Generator().manual_seed(13 * m + cfg.block_n + cfg.split_k + cfg.block_m)
    n, k = 160, 1024  # 8 K blocks: splits 2/3 are ragged, N ragged against every BLOCK_N
    w, s = random_weight(n, k, gen=gen)  # arbitrary (not power-of-two) scales: the fold is exact in fp32
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    for _ in range(2):  # the second call checks the split-K counters were left at zero
        out = poisoned((m, n))
        y = g.block_fp8_linear(x, w, s, out=out, config=cfg)
        assert y is out and torch.isfinite(y).all()
        assert rel_err(y, ref) < OUTPUT_TOL
    if cfg.split_k > 1:
        assert all(int(c.abs().sum()) == 0 for c in g._counter_cache.values())


# (N, K) per linear at a reduced scale keeping each one's aspect: wqkv_a short-and-deep, wq_b and the
# indexer's wq_b wide-and-shallow, wo_b / shared down deep, shared gate/up square; ragged variants too
FAMILIES = {"wqkv_a": (192, 512), "wq_b": (512, 128), "wo_b": (128, 1024), "indexer_wq_b": (256, 128),
            "shared_gate_up": (256, 256), "shared_down": (128, 384), "ragged": (200, 320)}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("m", [0, 1, 2, 3, 8, 16])
def test_shape_families_default_and_rows_form(family, m):
    n, k = FAMILIES[family]
    gen = torch.Generator().manual_seed(hash(family) % 1000 + m)
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    tiles_m = min(8, 1 << max(0, m - 1).bit_length())
    # the default (rows form at 1-2 rows where measured faster) at every M, an explicit 16-column split
    # rows form at 3 and 16 rows (row tiles, padded rows)
    for cfg in (None, rows(tiles_m, 16, 2, unroll=2)) if m in (3, 16) else (None,):
        out = poisoned((m, n))
        y = g.block_fp8_linear(x, w, s, out=out, config=cfg)
        assert y is out
        if m:
            assert torch.isfinite(y).all() and rel_err(y, ref) < OUTPUT_TOL


@pytest.mark.parametrize("cfg", [rows(1, 16, 1, unroll=4, evict_first=True), rows(2, 32, 4, prefetch=False),
                                 rows(8, 16, 2, unroll=4), rows(4, 32, 2, prefetch=False, x_broadcast=True)],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("b", [1, 3, 16])
def test_wo_a_rows_forms(cfg, rope, b):
    gen = torch.Generator().manual_seed(b + 10 * rope + cfg.block_m)
    groups, r, d = 2, 128, 512  # 4 heads of 128 per group
    w, s = random_weight(r, d, groups=groups, gen=gen)
    heads = torch.randn(b, groups * d + 64, generator=gen).to(torch.bfloat16).to(DEVICE)
    o = heads[:, :groups * d].view(b, groups, d)  # token stride > G*D, as a sliced attention output
    kw = {}
    if rope:
        pos, freqs, _ = rope_inputs(b, gen)
        kw = dict(positions=pos.int(), freqs=freqs, head_dim=HEAD, rope_dim=ROPE)
    out = poisoned((b, groups, r))
    y = g.grouped_fp8_wo_a(o, w, s, out=out, config=cfg, **kw)
    assert y is out and torch.isfinite(y).all()
    ref = g.reference_grouped_wo_a(o, w, s, kw.get("positions"), kw.get("freqs"), HEAD, ROPE)
    assert rel_err(y, ref) < OUTPUT_TOL


def test_rows_form_config_is_validated():
    with pytest.raises(ValueError, match="config: rows form needs"):
        rows(3)
    with pytest.raises(ValueError, match="config: rows form needs"):
        g.GemvConfig(8, 32, 1, True, rows_form=True)
    with pytest.raises(ValueError, match="x_broadcast need the rows form"):
        g.GemvConfig(1, 32, 1, False, x_broadcast=True)
    assert rows(8).name.startswith("rows_m8_n32_u2_s1") and rows(8, evict_first=True).name.endswith("_pf_ef")


def test_default_config_picks_rows_forms_where_measured(monkeypatch):
    """From the H200 run (benchmarks/fp8_gemv-h200-run3.summary.md): 2 rows on the rows form at every
    shape below 32 MiB (run 6b moved 2 rows of the 32 MiB weights to the FP8 tensor-core form); 1 row on
    the one-shot rows form for K of 4..8 blocks and few column tiles; 3..16 rows stay on tensor cores;
    larger-K single rows stay on the FMA form. (Without the one-chunk rule of runs 18 / 18b, which puts weights of
    at most 8 MiB at 1..2 rows on the rows form too: test_fp8_gemv_one_chunk.py.)"""
    monkeypatch.setattr(g, "USE_ONE_CHUNK", False)
    for n, k in [(1536, 4096), (16384, 1024), (4096, 4096), (4096, 256)]:
        cfg = g.launch_form(2, n, k)
        assert cfg.rows_form and cfg.block_m == 2 and not cfg.prefetch
        # with PDL (run 9): the first weight chunk is loaded before the wait on weights of at most 4 MiB
        assert g.default_config(2, n, k).prefetch == (n * k <= g.PDL_TWO_ROW_PREFETCH_MAX_WEIGHT_BYTES)
    assert g.default_config(2, 32768, 1024).fp8_mma
    one_shot = g.default_config(1, 4096, 1024)
    assert one_shot.rows_form and one_shot.k_unroll == 8 and one_shot.split_k == 1 and one_shot.num_warps == 8
    assert g.default_config(1, 8192, 1024).evict_first and g.default_config(1, 4096, 512).k_unroll == 4
    for n, k in [(32768, 1024), (1536, 4096), (4096, 256), (4096, 2048)]:
        assert not g.default_config(1, n, k).rows_form and not g.default_config(1, n, k).use_dot
    for m in (3, 4, 8, 16):
        assert g.default_config(m, 4096, 4096).use_dot


# SM counts around the rules' thresholds (splits change at 64 / 128 SMs), the H200's and the listed sm_12x GPUs'
SM_COUNTS_TO_CHECK = (1, 16, 30, 48, 63, 64, 70, 84, 110, 127, 128, 132, 170, 188, 256)


@pytest.mark.parametrize("sms", SM_COUNTS_TO_CHECK)
def test_every_default_form_has_an_aot_config(sms):
    """Each launch form default_config picks for DSv4's seven linears (T = 1, 2, 4, 8; 1..16 rows; the split-K
    variant as compiled), with PDL and without (launch_form, USE_PDL = False), on a GPU of ``sms`` SMs, is compiled
    by the AOT check (aot_forms), so the registry checks what runs on any sm_12x GPU, not only the listed ones."""
    import dataclasses

    from sglang_sm120.kernels import dsv4

    compiled = set(g.aot_forms())
    for tp in dsv4.SUPPORTED_TP:
        for name, (n, k) in dsv4.dense_linear_shapes(tp).items():
            groups = dsv4.O_GROUPS // tp if name == "wo_a" else 1
            n = dsv4.O_LORA_RANK if name == "wo_a" else n
            for m in range(1, 17):
                for cfg in (g.default_config(m, n, k, groups, sms=sms), g.launch_form(m, n, k, groups, sms=sms)):
                    form = dataclasses.replace(cfg, split_k=1 if cfg.split_k == 1 else 4)
                    assert (form, False) in compiled, (name, tp, m, cfg.name)
                if name == "wo_a":  # the fused inverse RoPE forms
                    cfg = g.wo_a_config(m, n, k, groups, fused_rope=True, sms=sms)
                    form = dataclasses.replace(cfg, split_k=1 if cfg.split_k == 1 else 4)
                    assert (form, True) in compiled, (name, tp, m, cfg.name)


def test_aot_forms_add_only_what_the_listed_forms_lack_and_list_these_first():
    forms = g.aot_forms()
    assert forms[:len(g.SHIPPED_FORMS)] == tuple(dict.fromkeys(g.SHIPPED_FORMS))
    assert len(set(forms)) == len(forms)
    assert all(f not in g.SHIPPED_FORMS for f in forms[len(g.SHIPPED_FORMS):])


def test_the_fused_rope_rows_form_always_splits_k():
    """The looping rows form with the fused RoPE spills on sm_120a / sm_121a without a K split (128 registers + 8
    bytes, aot-check); a GPU of fewer than 64 SMs (GB10 at T=2, 2 rows) would otherwise pick it unsplit. (The
    one-chunk rows form, T=8, has its whole K in one program and no such spill.)"""
    from sglang_sm120.kernels import dsv4

    split_where_it_would_not = 0
    for sms in range(1, dsv4.SM12X_AOT_MAX_SM_COUNT + 1):
        for tp in dsv4.SUPPORTED_TP:
            d = dsv4.dense_linear_shapes(tp)["wo_a"][1]
            for m in range(1, 17):
                args = (m, dsv4.O_LORA_RANK, d, dsv4.O_GROUPS // tp)
                cfg = g.wo_a_config(*args, fused_rope=True, sms=sms)
                assert not (cfg.rows_form and not cfg.one_chunk and cfg.split_k == 1), (sms, tp, m, cfg.name)
                rule_form = g._pick_wo_a_form(*args, True, sms, g.rules())
                split_where_it_would_not += rule_form.split_k == 1 and cfg.split_k == 2
    assert split_where_it_would_not > 0  # the rule does pick the unsplit form somewhere (below 64 SMs)
