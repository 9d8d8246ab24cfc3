"""The persistent forms of the block-FP8 GEMV (``GemvConfig(persistent_programs_per_sm=n)``: a grid of SMs x n
programs, each looping over the (tile, K split) work items), under the CPU interpreter at reduced shapes with a
2-SM grid, so programs take several work items and the item count is not a multiple of the grid: every form against
the float32 reference and bit for bit against the same form with one program per item, the grouped wo_a kernel with
the fused inverse RoPE, and where default_config ships it. The device script (``--run13-sweep``) checks them at
full shapes."""

import dataclasses

import pytest
import torch

from sglang_sm120.kernels import fp8_gemv as g

from .test_fp8_gemv import OUTPUT_TOL, check_ragged_grouped_wo_a, poisoned, random_weight, rel_err


def persistent(cfg, programs=2):
    return dataclasses.replace(cfg, persistent_programs_per_sm=programs)


FMA_PDL = dict(pdl=True, pdl_l2_blocks=4)
PERSISTENT_FORMS = [
    # as shipped (wq_b T=1, 1 row): 64-column FMA tiles by TMA, no split (the flattened loop)
    persistent(g.GemvConfig(1, 64, 1, False, k_unroll=2, w_tma=True, **FMA_PDL)),
    persistent(g.GemvConfig(1, 32, 3, False, k_unroll=2, **FMA_PDL), 1),  # split-K, the last split shorter
    persistent(g.GemvConfig(1, 64, 2, False, k_unroll=2, w_tma=True, num_stages=4, **FMA_PDL), 3),
    persistent(g.GemvConfig(16, 32, 2, True, pdl=True, pdl_late=True)),  # 16-row bf16 tensor cores
    persistent(g.GemvConfig(8, 128, 3, True, 8, 3, fp8_mma=True, fp8_join=True, pdl=True, w_tma=True), 1),
    persistent(g.GemvConfig(8, 64, 1, True, 4, 3, fp8_mma=True, fp8_join=True)),  # FP8 tile, flattened
]

# N ragged against every tile; K ragged against the 128-wide scale blocks but a multiple of 16 (a TMA stride)
N, K = 328, 1040
GRID_SMS = 2  # the SM count the CPU launch assumes, so that every program loops over several work items


@pytest.fixture
def two_sms(monkeypatch):
    monkeypatch.setattr(g, "DEFAULT_SM_COUNT", GRID_SMS)


@pytest.mark.parametrize("cfg", PERSISTENT_FORMS, ids=lambda c: c.name)
@pytest.mark.parametrize("m", [1, 3, 9])
def test_persistent_forms_match_reference_and_one_program_per_item(two_sms, cfg, m):
    gen = torch.Generator().manual_seed(41 * m + cfg.block_n + cfg.split_k)
    w, s = random_weight(N, K, gen=gen)
    x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
    ref = g.reference_block_fp8_linear(x, w, s)
    per_item = g.block_fp8_linear(x, w, s, config=dataclasses.replace(cfg, persistent_programs_per_sm=0))
    k_blocks, unroll = -(-K // g.FP8_BLOCK), 1 if cfg.fp8_mma else cfg.k_unroll
    per_split = -(-(-(-k_blocks // cfg.split_k)) // unroll) * unroll  # as _launch sizes the splits
    items = -(-m // cfg.block_m) * -(-N // cfg.block_n) * -(-k_blocks // per_split)
    assert items > GRID_SMS * cfg.persistent_programs_per_sm  # every program loops (most cases: ragged last round)
    for _ in range(2):  # the second call checks the split-K counters were left at zero
        y = g.block_fp8_linear(x, w, s, out=poisoned((m, N)), config=cfg)
        assert torch.isfinite(y).all()
        assert rel_err(y, ref) < OUTPUT_TOL, cfg.name
        # the same tiles and arithmetic; the surplus K blocks of a fixed-length loop add exact zeros
        assert torch.equal(y, per_item), cfg.name
    if cfg.split_k > 1:
        assert all(int(c.abs().sum()) == 0 for c in g._counter_cache.values())


@pytest.mark.parametrize("cfg", [PERSISTENT_FORMS[0], PERSISTENT_FORMS[4]], ids=lambda c: c.name)
@pytest.mark.parametrize("rope", [False, True])
def test_grouped_wo_a_persistent(two_sms, cfg, rope):
    """Work items span the groups (group index from the item, not the grid); a ragged R against the tiles and a
    strided ``o``."""
    check_ragged_grouped_wo_a(cfg, rope, seed=43 + rope, groups=3)


def test_no_rows_and_fewer_items_than_programs(two_sms):
    """M = 0 launches nothing; one work item on a grid of 4 programs runs once (the grid is capped at the items)."""
    cfg = PERSISTENT_FORMS[0]
    w, s = random_weight(64, 256, gen=torch.Generator().manual_seed(47))
    out = poisoned((0, 64))
    assert g.block_fp8_linear(torch.empty(0, 256, dtype=torch.bfloat16), w, s, out=out, config=cfg) is out
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(53)).to(torch.bfloat16)
    y = g.block_fp8_linear(x, w, s, out=poisoned((1, 64)), config=cfg)
    assert rel_err(y, g.reference_block_fp8_linear(x, w, s)) < OUTPUT_TOL


def test_persistent_config_validation_name_and_aot():
    cfg = PERSISTENT_FORMS[0]
    assert cfg.name == "fma_m1_n64_u2_s1_w4_st3_pdl_l2p4_tma_pp2"
    for bad in (dict(persistent_programs_per_sm=-1),):
        with pytest.raises(ValueError, match="persistent"):
            dataclasses.replace(cfg, **bad)
    with pytest.raises(ValueError, match="persistent"):
        g.GemvConfig(2, 32, 1, False, k_unroll=2, rows_form=True, persistent_programs_per_sm=2)
    with pytest.raises(ValueError, match="persistent"):
        g.GemvConfig(8, 128, 1, True, 8, 3, fp8_mma=True, fp8_chain=True, persistent_programs_per_sm=1)
    aot = g.aot_config(cfg)
    assert aot.name == "fp8_gemv_" + cfg.name and aot.constexprs["PERSISTENT"] and aot.constexprs["FLATTEN"]
    assert g.TMA_LOAD_OPCODE in aot.expect_opcodes
    split = g.aot_config(PERSISTENT_FORMS[1])
    assert split.constexprs["PERSISTENT"] and not split.constexprs["FLATTEN"]  # the split-sum loop: not flattened
    plain = g.aot_config(dataclasses.replace(cfg, persistent_programs_per_sm=0))
    assert not plain.constexprs["PERSISTENT"] and not plain.constexprs["FLATTEN"]
    assert any(c == cfg for c, _ in g.SHIPPED_FORMS)


def test_default_config_persistent_where_measured_faster(monkeypatch):
    """H200 runs 13 / 13b (benchmarks/fp8_gemv-h200-run13-summary.md): 1 row of wq_b at T=1 ([32768, 1024], 32 MiB,
    no K split) on 64-column TMA tiles, 2 programs per SM, where the call shares the SMs with other streams (the rule
    beside_other_streams; alone the one-chunk tile of variants run 37 replaces it) or ONE_CHUNK_X_FIRST is off;
    nowhere else."""
    for cfg in (g.pick_default_config(1, 32768, 1024, 1, 132, g.rules(), beside_other_streams=True),
                g.pick_default_config(1, 32768, 1024, 1, 132, g.rules()._replace(x_first=False))):
        assert cfg.persistent_programs_per_sm == 2 and cfg.w_tma and cfg.block_n == 64 and cfg.split_k == 1
        assert cfg.pdl and cfg.pdl_l2_blocks == g.PDL_FMA_L2_BLOCKS and not cfg.use_dot
    alone = g.default_config(1, 32768, 1024)
    assert alone == g.one_chunk_form(1, 16, 4, 1024 // g.FP8_BLOCK) and g.one_chunk_x_first(alone)
    for m, n, k, groups in ((1, 1024, 4096, 8), (1, 4096, 8192, 1), (1, 16384, 1024, 1), (1, 4096, 4096, 1),
                            (1, 32768, 1024, 1), (2, 32768, 1024, 1), (8, 32768, 1024, 1), (2, 1024, 4096, 8),
                            (16, 32768, 1024, 1)):
        assert not g.default_config(m, n, k, groups).persistent_programs_per_sm, (m, n, k, groups)
    monkeypatch.setattr(g, "USE_TMA", False)
    assert not g.pick_default_config(1, 32768, 1024, 1, 132, g.rules(), True).persistent_programs_per_sm


def test_sharing_config_and_share_sms(two_sms):
    """block_fp8_linear(share_sms=True) (the main wq_b beside SGLang's indexer streams): the persistent form on
    SHARED_PERSISTENT_PROGRAMS_PER_SM programs per SM, every other form unchanged; the same outputs bit for bit."""
    shipped = g.pick_default_config(1, 32768, 1024, 1, 132, g.rules(), beside_other_streams=True)
    shared = g.sharing_config(shipped)
    assert shared.persistent_programs_per_sm == g.SHARED_PERSISTENT_PROGRAMS_PER_SM < shipped.persistent_programs_per_sm
    assert dataclasses.replace(shared, persistent_programs_per_sm=shipped.persistent_programs_per_sm) == shipped
    assert any(c == shared for c, _ in g.SHIPPED_FORMS)  # compiled by the AOT check
    for m, n, k, groups in ((1, 4096, 8192, 1), (8, 32768, 1024, 1), (1, 1536, 4096, 1), (2, 1024, 4096, 8)):
        cfg = g.default_config(m, n, k, groups)
        assert g.sharing_config(cfg) is cfg, (m, n, k, groups)
        assert g.sharing_default_config(m, n, k, groups) == cfg, (m, n, k, groups)
    gen = torch.Generator().manual_seed(7)
    w, s = random_weight(N, K, gen=gen)
    x = torch.randn(1, K, generator=gen).to(torch.bfloat16)
    form = PERSISTENT_FORMS[0]
    alone = g.block_fp8_linear(x, w, s, config=form)
    beside = g.block_fp8_linear(x, w, s, out=poisoned((1, N)), config=form, share_sms=True)
    assert torch.equal(beside, alone)
    assert rel_err(beside, g.reference_block_fp8_linear(x, w, s)) < OUTPUT_TOL
    launched = []
    original = g._launch
    try:
        g._launch = lambda *args: launched.append(args[-1]) or original(*args)
        g.block_fp8_linear(x, w, s, config=form, share_sms=True)
    finally:
        g._launch = original
    assert launched[0].persistent_programs_per_sm == g.SHARED_PERSISTENT_PROGRAMS_PER_SM


# the main wq_b's geometry at reduced size: K of 8 blocks (one chunk), N ragged against the 16-column tile
LARGE_ONE_CHUNK_N, LARGE_ONE_CHUNK_K = 328, 1024


@pytest.fixture
def large_one_chunk_tile(two_sms, monkeypatch):
    """[LARGE_ONE_CHUNK_N, LARGE_ONE_CHUNK_K] made a weight over ONE_CHUNK_MAX_WEIGHT_BYTES with a one-row X_FIRST
    one-chunk tile, as the main wq_b at T=1, and large enough for the persistent form by TMA (the rule beside)."""
    n, k = LARGE_ONE_CHUNK_N, LARGE_ONE_CHUNK_K
    monkeypatch.setattr(g, "ONE_CHUNK_MAX_WEIGHT_BYTES", n * k - 1)
    monkeypatch.setattr(g, "PERSISTENT_FMA_MIN_WEIGHT_BYTES", n * k)
    monkeypatch.setattr(g, "ONE_CHUNK_X_FIRST_ONE_ROW_TILES", {**g.ONE_CHUNK_X_FIRST_ONE_ROW_TILES, (n, k): (16, 4)})
    g.clear_caches()
    yield n, k
    g.clear_caches()


def test_large_one_chunk_alone_persistent_beside(large_one_chunk_tile):
    """A weight over ONE_CHUNK_MAX_WEIGHT_BYTES with a one-row X_FIRST tile (the main wq_b at T=1, variants run 37):
    alone the one-chunk form, beside other streams (block_fp8_linear(share_sms=True) without a config) the persistent
    form on SHARED_PERSISTENT_PROGRAMS_PER_SM programs per SM; 2 rows and grouped weights as before; both launches
    give the reference's answer into a poisoned output."""
    n, k = large_one_chunk_tile
    alone = g.default_config(1, n, k)
    assert alone.one_chunk and alone.block_n == 16 and g.one_chunk_x_first(alone)
    beside = g.sharing_default_config(1, n, k)
    assert not beside.one_chunk and beside.persistent_programs_per_sm == g.SHARED_PERSISTENT_PROGRAMS_PER_SM
    assert beside == g.sharing_config(g.pick_default_config(1, n, k, 1, GRID_SMS, g.rules(), True))
    for m, groups in ((2, 1), (1, 2)):  # no one-chunk tile: sharing_config of default_config's form
        cfg = g.default_config(m, n, k, groups)
        assert not cfg.one_chunk and g.sharing_default_config(m, n, k, groups) == g.sharing_config(cfg), (m, groups)
    gen = torch.Generator().manual_seed(11)
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    ref = g.reference_block_fp8_linear(x, w, s)
    launched = []
    original = g._launch
    try:
        g._launch = lambda *args: launched.append(args[-1]) or original(*args)
        y_alone = g.block_fp8_linear(x, w, s, out=poisoned((1, n)))
        y_beside = g.block_fp8_linear(x, w, s, out=poisoned((1, n)), share_sms=True)
    finally:
        g._launch = original
    assert launched == [alone, beside]
    assert rel_err(y_alone, ref) < OUTPUT_TOL and rel_err(y_beside, ref) < OUTPUT_TOL


@pytest.mark.parametrize("swap_ab", [False, True])
def test_persistent_dot_form_reads_no_scale_past_the_row(two_sms, swap_ab):
    """The bf16 tensor-core tile on a persistent grid runs a fixed number of K blocks per split; the last split's
    surplus block lies past the scale row. Its scale must not be read: with the scales a view whose next floats are
    inf, a read gave 0 * inf = NaN in the last rows' columns (other rows read the next row's first scale)."""
    gen = torch.Generator().manual_seed(57 + swap_ab)
    n, k = 256, 5 * g.FP8_BLOCK  # 5 K blocks in splits of 3 + 2: one surplus block
    w, s = random_weight(n, k, gen=gen)
    padded = torch.full((s.numel() + 8,), float("inf"))
    padded[:s.numel()] = s.reshape(-1)
    s_view = padded[:s.numel()].view(s.shape)
    x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
    cfg = persistent(g.GemvConfig(16, 32, 2, True, swap_ab=swap_ab), 1)
    y = g.block_fp8_linear(x, w, s_view, out=poisoned((3, n)), config=cfg)
    assert torch.isfinite(y).all()
    assert rel_err(y, g.reference_block_fp8_linear(x, w, s)) < OUTPUT_TOL
