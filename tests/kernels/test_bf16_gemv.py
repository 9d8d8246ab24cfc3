"""kernels/bf16_gemv.py under the CPU interpreter against its float32 reference: fresh random inputs,
NaN-poisoned outputs, M = 0 / 1 / odd / the largest row block, K and N off the tile, strided activation
rows, both output dtypes, the fused scale, input validation, the tile rule, and the AOT registration."""

import random

import pytest
import torch

from sglang_sm120.kernels import bf16_gemv as g
from sglang_sm120.kernels.dsv4 import BF16_LINEAR_SHAPES, SM12X_SM_COUNTS

from ..conftest import DEVICE

# float32 out: only the summation order differs from the reference; bf16 out: one rounding on top
F32_TOL = 1e-5
BF16_TOL = 2 ** -8


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def randn(*shape, gen, scale=1.0):
    return (scale * torch.randn(*shape, generator=gen)).to(torch.bfloat16).to(DEVICE)


# reduced shapes: a multiple of every tile, N and K off the tile, one weight row, a short K
SHAPES = [(64, 512), (40, 200), (1, 96), (130, 64), (24, 1040)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [0, 1, 3, g.MAX_ROWS])
@pytest.mark.parametrize("out_dtype", g.OUT_DTYPES)
def test_matches_reference(n, k, rows, out_dtype):
    gen = torch.Generator().manual_seed(n * 7919 + k * 31 + rows + (out_dtype == torch.bfloat16))
    x, w = randn(rows, k, gen=gen, scale=2.0), randn(n, k, gen=gen, scale=0.05)
    out = torch.full((rows, n), float("nan"), dtype=out_dtype, device=DEVICE)
    got = g.bf16_linear(x, w, out_dtype=out_dtype, out=out)
    assert got is out and got.shape == (rows, n) and got.dtype == out_dtype
    if rows == 0:
        return
    assert torch.isfinite(got).all(), "an output element was never written"
    tol = F32_TOL if out_dtype == torch.float32 else BF16_TOL
    assert rel_err(got, g.reference_bf16_linear(x, w)) < tol


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_scale_and_strided_rows(rows):
    gen = torch.Generator().manual_seed(rows)
    n, k = 64, 256
    wide = randn(rows, 3 * k, gen=gen)
    x = wide[:, k:2 * k]  # rows 3k apart, contiguous along K
    w = randn(n, k, gen=gen, scale=0.1)
    scale = 0.0883883
    got = g.bf16_linear(x, w, out_dtype=torch.bfloat16, scale=scale)
    ref = g.reference_bf16_linear(x, w, scale)
    assert rel_err(got, ref) < BF16_TOL
    # the scale is applied in float32 before the single rounding to bf16: each element within one bf16 ulp of
    # the float32 value (the interpreter's float32 -> bf16 conversion truncates, so not half an ulp here)
    assert ((got.float() - ref).abs() <= ref.abs() * 2 ** -7).all()


def test_every_config_computes_the_same():
    """Every shipped tile computes the reference (the tile rule only picks among them)."""
    gen = torch.Generator().manual_seed(5)
    n, k = 48, 2048
    for cfg in g.shipped_configs():
        rows = cfg.block_m
        x, w = randn(rows, k, gen=gen), randn(n, k, gen=gen, scale=0.05)
        got = g.bf16_linear(x, w, config=dataclass_without_pdl(cfg))
        assert rel_err(got, g.reference_bf16_linear(x, w)) < F32_TOL, cfg.name


def dataclass_without_pdl(cfg):
    import dataclasses

    return dataclasses.replace(cfg, pdl=False)  # the interpreter has no launch attributes


def test_zero_k_gives_zeros():
    x = torch.empty(2, 0, dtype=torch.bfloat16, device=DEVICE)
    w = torch.empty(8, 0, dtype=torch.bfloat16, device=DEVICE)
    assert torch.equal(g.bf16_linear(x, w), torch.zeros(2, 8, device=DEVICE))


@pytest.mark.parametrize("case,match", [
    ("w_dtype", "weight must be a 2-D bf16"),
    ("w_dim", "weight must be a 2-D bf16"),
    ("x_dtype", "x must be a bf16 tensor"),
    ("x_k", "x must be a bf16 tensor"),
    ("rows", "at most"),
    ("w_stride", "contiguous along K"),
    ("out_dtype", "out_dtype must be one of"),
    ("out_shape", "out must be a"),
])
def test_bad_input_is_named(case, match):
    gen = torch.Generator().manual_seed(0)
    x, w = randn(2, 64, gen=gen), randn(16, 64, gen=gen)
    kwargs = {}
    if case == "w_dtype":
        w = w.float()
    elif case == "w_dim":
        w = w.view(2, 8, 64)
    elif case == "x_dtype":
        x = x.half()
    elif case == "x_k":
        x = randn(2, 32, gen=gen)
    elif case == "rows":
        x = randn(g.MAX_ROWS + 1, 64, gen=gen)
    elif case == "w_stride":
        w = randn(64, 16, gen=gen).t()
    elif case == "out_dtype":
        kwargs["out_dtype"] = torch.float16
    elif case == "out_shape":
        kwargs["out"] = torch.empty(2, 15, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        g.bf16_linear(x, w, **kwargs)


def test_config_too_small_for_the_rows_is_refused():
    gen = torch.Generator().manual_seed(1)
    x, w = randn(3, 64, gen=gen), randn(8, 64, gen=gen)
    with pytest.raises(ValueError, match="holds 2 rows"):
        g.bf16_linear(x, w, config=g.Bf16GemvConfig(block_m=2, block_n=1, block_k=64))


@pytest.mark.parametrize("name", sorted(BF16_LINEAR_SHAPES))
@pytest.mark.parametrize("rows", range(1, g.MAX_ROWS + 1))
@pytest.mark.parametrize("sms", sorted({*SM12X_SM_COUNTS.values(), g.DEFAULT_SM_COUNT}))
def test_tile_rule(name, rows, sms):
    n, k = BF16_LINEAR_SHAPES[name]
    cfg = g.default_config(rows, n, k, sms)
    threads = 32 * cfg.num_warps
    assert cfg.num_warps == (g.ONE_ROW_WIDE_WARPS if cfg.block_m == 1 and cfg.block_n >= g.ONE_ROW_WIDE_MIN_BLOCK_N
                             else g.NUM_WARPS)
    assert cfg.block_m >= rows and cfg.block_m in g.ROW_BLOCKS
    assert cfg.block_n * cfg.block_k >= g.LOAD_ELEMENTS * threads, "less than one 16-byte load per thread"
    per_thread = g.ONE_ROW_PRODUCT_ELEMENTS_PER_THREAD if cfg.block_m == 1 else g.PRODUCT_ELEMENTS_PER_THREAD
    assert cfg.block_m * cfg.block_n * cfg.block_k <= per_thread * threads
    assert cfg.block_n == g.MEASURED_BLOCK_N[n][cfg.block_m], "DSv4's widths take the measured tile"
    # the AOT check compiles what a PDL GPU launches
    assert g.default_config(rows, n, k, sms, pdl=True).name in {c.name for c in g.shipped_configs()}


@pytest.mark.parametrize("n", [96, 3000, 40960])
@pytest.mark.parametrize("sms", [132, 188])
def test_tile_rule_elsewhere_keeps_programs_per_sm(n, sms):
    cfg = g.default_config(1, n, 4096, sms)
    assert -(-n // cfg.block_n) >= g.PROGRAMS_PER_SM * sms or cfg.block_n == 1
    assert cfg.block_n == 1 or -(-n // (cfg.block_n // 2)) >= g.PROGRAMS_PER_SM * sms or cfg.block_n == 8


@pytest.mark.parametrize("sms", sorted({*SM12X_SM_COUNTS.values(), g.DEFAULT_SM_COUNT}))
def test_sharing_tile_where_listed(sms):
    """share_sms: the wider tile of SHARING_BLOCK_N where it lists the width and row block (the C4 compressor at one
    row), the call-alone tile everywhere else (at one row without the weight before the wait); both in the AOT
    registry."""
    names = {c.name for c in g.shipped_configs()}
    assert g.SHARING_BLOCK_N, "nothing to share"
    for name, (n, k) in BF16_LINEAR_SHAPES.items():
        for rows in range(1, g.MAX_ROWS + 1):
            alone = g.default_config(rows, n, k, sms, pdl=True)
            shared = g.default_config(rows, n, k, sms, pdl=True, share_sms=True)
            listed = g.SHARING_BLOCK_N.get(n, {}).get(alone.block_m)
            assert shared.block_n == (listed if listed is not None else alone.block_n), (name, rows)
            # beside other streams a one-row call keeps the looping tile (no weight before the wait)
            looping = g.tile(alone.block_m, alone.block_n, k, True, w_before_wait=False)
            assert shared == alone or listed is not None or (alone.w_before_wait and shared == looping)
            assert {alone.name, shared.name} <= names


def test_sharing_tile_computes_the_same_product():
    """The sharing tile of the [2048, K] compressor at one row against the tile alone and the reference (K reduced)."""
    gen = torch.Generator().manual_seed(5)
    n = next(iter(g.SHARING_BLOCK_N))
    x, w = randn(1, 256, gen=gen), randn(n, 256, gen=gen)
    shared = g.bf16_linear(x, w, share_sms=True)
    alone = g.bf16_linear(x, w)
    assert g.default_config(1, n, 256, share_sms=True).block_n != g.default_config(1, n, 256).block_n
    ref = g.reference_bf16_linear(x, w)
    assert torch.allclose(shared, ref, rtol=1e-5, atol=1e-5) and torch.allclose(alone, ref, rtol=1e-5, atol=1e-5)


def test_aot_configs_cover_the_shipped_tiles():
    names = {c.name for c in g.aot_configs()}
    for cfg in g.shipped_configs():
        assert {cfg.name + "_of32", cfg.name + "_obf16"} <= names
    for aot in g.aot_configs():
        assert "LDG.E.EF.128" in aot.expect_opcodes and "HMMA" in aot.forbid_opcodes


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("out_dtype", g.OUT_DTYPES)
def test_weight_before_wait_one_step(n, k, out_dtype):
    """The one-row one-step form (w_before_wait: the weight rows loaded before the PDL wait, as SGLang's
    tiny_gemm_bf16 does) against the reference into a NaN-poisoned output, and against the looping tile; a K
    longer than its step is refused by name."""
    gen = torch.Generator().manual_seed(n * 31 + k)
    x, w = randn(1, k, gen=gen, scale=2.0), randn(n, k, gen=gen, scale=0.05)
    block_k = max(g.LOAD_ELEMENTS * 32 * g.NUM_WARPS, 1 << (k - 1).bit_length())
    one_step = g.Bf16GemvConfig(1, 1, block_k, w_before_wait=True)
    out = torch.full((1, n), float("nan"), dtype=out_dtype, device=DEVICE)
    got = g.bf16_linear(x, w, out_dtype=out_dtype, out=out, config=one_step)
    assert got is out and torch.isfinite(got).all()
    # bf16 out: one rounding, which the interpreter's float32 -> bf16 conversion does by truncation (up to one ulp)
    tol = F32_TOL if out_dtype == torch.float32 else 2 * BF16_TOL
    assert rel_err(got, g.reference_bf16_linear(x, w)) < tol
    looped = g.bf16_linear(x, w, out_dtype=out_dtype, config=g.Bf16GemvConfig(1, 1, g.LOAD_ELEMENTS * 32 * 4))
    assert rel_err(got, looped) < tol
    short_step = (1 << (k - 1).bit_length()) // 2  # the power of two below K
    with pytest.raises(ValueError, match=f"one step of {short_step}; K is {k}"):
        g.bf16_linear(x, w, config=g.Bf16GemvConfig(1, 1, short_step, w_before_wait=True))
    with pytest.raises(ValueError, match="w_before_wait needs block_m 1"):
        g.Bf16GemvConfig(2, 1, block_k, w_before_wait=True)


@pytest.mark.parametrize("sms", sorted({*SM12X_SM_COUNTS.values(), g.DEFAULT_SM_COUNT}))
def test_weight_before_wait_rule(sms, monkeypatch):
    """With PDL, a one-row call not beside other streams whose whole K fits the one-row product budget in one step
    (up to W_BEFORE_WAIT_MAX_K) takes w_before_wait: the router gate, weights_proj and the indexer / C128
    compressors alone at K 4096; the C4 compressor's 4-row tile (over the budget), calls beside other streams
    (share_sms: the looping tile as before), more rows, no PDL, K past the limit and the switch off do not."""
    from sglang_sm120.kernels.dsv4 import ROUTER_GATE_SHAPE

    for n, k in (*BF16_LINEAR_SHAPES.values(), ROUTER_GATE_SHAPE):
        for rows in range(1, g.MAX_ROWS + 1):
            cfg = g.default_config(rows, n, k, sms, pdl=True)
            threads = 32 * cfg.num_warps
            fits = cfg.block_m == 1 and cfg.block_n * k <= g.ONE_ROW_PRODUCT_ELEMENTS_PER_THREAD * threads
            assert cfg.w_before_wait == fits, (n, k, rows)
            if fits:
                assert cfg.block_k >= k and cfg.pdl
            assert not g.default_config(rows, n, k, sms).w_before_wait  # no PDL
            beside = g.default_config(rows, n, k, sms, pdl=True, share_sms=True)
            assert not beside.w_before_wait and beside.block_k <= g.MAX_BLOCK_K, (n, k, rows)
    assert g.default_config(1, 256, 4096, sms, pdl=True).w_before_wait  # the router gate
    assert not g.default_config(1, 2048, 4096, sms, pdl=True).w_before_wait  # 4 rows x 4096 over the budget
    assert not g.default_config(1, 64, 2 * g.W_BEFORE_WAIT_MAX_K, sms, pdl=True).w_before_wait
    monkeypatch.setattr(g, "USE_W_BEFORE_WAIT", False)
    assert not g.default_config(1, 256, 4096, sms, pdl=True).w_before_wait


def test_strides_of_size_one_dims_and_empty_inputs_are_not_refused():
    """torch reports arbitrary strides for a dim of size 1 (``1.0 * x`` of a [0, 1] tensor has stride (1, 0)); the
    kernel never uses them, so such inputs run (they were refused as not contiguous along K)."""
    gen = torch.Generator().manual_seed(5)
    w = randn(3, 1, gen=gen)
    empty = 1.0 * torch.randn(0, 1, generator=gen).to(torch.bfloat16).to(DEVICE)
    assert empty.stride(1) != 1
    assert g.bf16_linear(empty, w).shape == (0, 3)
    x = randn(2, 1, gen=gen)
    x_odd = torch.empty_strided((2, 1), (1, 7), dtype=torch.bfloat16, device=DEVICE).copy_(x)
    assert x_odd.stride(1) != 1
    assert rel_err(g.bf16_linear(x_odd, w), g.reference_bf16_linear(x, w)) < F32_TOL
    with pytest.raises(ValueError, match="contiguous along K"):  # a real stride along K is still refused
        g.bf16_linear(randn(2, 8, gen=gen)[:, ::2], randn(3, 4, gen=gen))

@pytest.mark.parametrize("seed", range(24))
def test_random_shapes_match_reference(seed):
    """A sweep of random valid calls: rows 0..MAX_ROWS, N and K off every tile (K from 0 to past one weight step),
    both output dtypes, with and without the fused scale."""
    r = random.Random(seed)
    m, n = r.randint(0, g.MAX_ROWS), r.choice([1, 3, 16, 64, 65, 100, 512, 1000])
    k = r.choice([0, 1, 7, 64, 100, 512, 1024, 2047, 4096, 5000])
    out_dtype, scale = r.choice([torch.float32, torch.bfloat16]), r.choice([None, 0.125, 3.0])
    gen = torch.Generator().manual_seed(seed)
    x, w = randn(m, k, gen=gen), randn(n, k, gen=gen)
    y = g.bf16_linear(x, w, out_dtype, scale=scale, out=torch.full((m, n), float("nan"), dtype=out_dtype,
                                                                     device=DEVICE))
    assert y.shape == (m, n) and y.dtype == out_dtype and torch.isfinite(y).all()
    if y.numel() and k:
        assert rel_err(y, g.reference_bf16_linear(x, w, scale)) < (F32_TOL if out_dtype == torch.float32 else BF16_TOL)
    elif y.numel():
        assert (y == 0).all()  # K = 0: the empty sum
