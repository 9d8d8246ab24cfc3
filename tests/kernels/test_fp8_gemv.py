"""Block-FP8 GEMV / skinny GEMM and the grouped wo_a kernel against their float32 references, under
the CPU interpreter at reduced shapes (every launch form: FMA rows 1-2, tensor-core rows 16/32,
split-K on and off, fused inverse RoPE)."""

import dataclasses
import math
import random

import pytest
import torch
import triton
import triton.language as tl

from sglang_sm120.kernels import fp8_gemv as g
from sglang_sm120.kernels.dsv4 import FP8_BLOCK

from ..conftest import DEVICE

# bf16 output rounding is the only error left against the fp32 reference (2^-9 relative)
OUTPUT_TOL = 6e-3


def block_quantize(w: torch.Tensor, pow2: bool = False):
    """A bf16/fp32 weight -> (e4m3 weight, fp32 128x128 block scales), as checkpoints store it;
    ``pow2`` rounds the scales up to powers of two (UE8M0, as DSv4-Flash's checkpoint has)."""
    n, k = w.shape[-2:]
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    padded = torch.nn.functional.pad(w.float(), (0, kb * FP8_BLOCK - k, 0, nb * FP8_BLOCK - n))
    blocks = padded.reshape(*w.shape[:-2], nb, FP8_BLOCK, kb, FP8_BLOCK)
    scale = blocks.abs().amax(dim=(-3, -1)).clamp_min(1e-12) / g.FP8_MAX
    if pow2:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[..., :, None, :, None]).clamp(-g.FP8_MAX, g.FP8_MAX).reshape(padded.shape)
    return q[..., :n, :k].to(g.FP8_DTYPE).contiguous(), scale.contiguous()


def random_weight(n, k, groups=None, gen=None, pow2=False):
    shape = (n, k) if groups is None else (groups, n, k)
    w = torch.randn(shape, generator=gen) * 0.02
    wq, s = block_quantize(w, pow2)
    return wq.to(DEVICE), s.to(DEVICE)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def poisoned(shape):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=DEVICE)


@pytest.fixture
def fresh_caches():
    """fp8_gemv's device facts and configs cached by none before and after the test (a test that fakes a device's
    answers; they must not reach another test)."""
    g.clear_caches()
    yield
    g.clear_caches()


# --- block_fp8_linear ----------------------------------------------------------------------------

SHAPES = [(256, 512), (200, 320), (128, 200)]  # (N, K): aligned, ragged N and K, K not a multiple of 16


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 16])
def test_linear_matches_reference(m, n, k):
    gen = torch.Generator().manual_seed(1000 * m + n + k)
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    out = poisoned((m, n))
    y = g.block_fp8_linear(x, w, s, out=out)
    assert y is out and torch.isfinite(y).all()
    assert rel_err(y, g.reference_block_fp8_linear(x, w, s)) < OUTPUT_TOL


FORMS = [g.GemvConfig(1, 32, 1, False), g.GemvConfig(1, 32, 4, False), g.GemvConfig(2, 32, 3, False),
         g.GemvConfig(1, 16, 2, False, k_unroll=4), g.GemvConfig(2, 32, 1, False, k_unroll=2),
         g.GemvConfig(16, 64, 1, True), g.GemvConfig(16, 64, 4, True), g.GemvConfig(32, 64, 2, True),
         g.GemvConfig(16, 32, 2, True), g.GemvConfig(16, 64, 3, True, k_unroll=2),
         g.GemvConfig(16, 64, 2, True, swap_ab=True), g.GemvConfig(16, 32, 1, True, k_unroll=4, swap_ab=True)]


@pytest.mark.parametrize("cfg", FORMS, ids=lambda c: c.name)
@pytest.mark.parametrize("m", [1, 2, 7])
def test_every_launch_form(cfg, m):
    if not cfg.use_dot and m > cfg.block_m:
        m = cfg.block_m if cfg.block_m > 1 else 3  # FMA rows tile the grid too
    gen = torch.Generator().manual_seed(7 * m + cfg.block_n + cfg.split_k)
    n, k = 160, 1024  # 8 K blocks: split-K 3/4 gives ragged splits, N ragged against every BLOCK_N
    folds_scale_into_bf16 = cfg.use_dot and cfg.k_unroll > 1  # exact for power-of-two scales only
    w, s = random_weight(n, k, gen=gen, pow2=folds_scale_into_bf16)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    for _ in range(2):  # the second call checks the split-K counters were left at zero
        y = g.block_fp8_linear(x, w, s, out=poisoned((m, n)), config=cfg)
        assert torch.isfinite(y).all()
        assert rel_err(y, ref) < OUTPUT_TOL
    if cfg.split_k > 1:
        assert all(int(c.abs().sum()) == 0 for c in g._counter_cache.values())


def test_folded_scale_forms_with_arbitrary_scales_stay_close():
    """With non-power-of-two scales the unrolled dot form rounds x*scale to bf16 once more: still
    well inside the error of upstream's FP8-activation path."""
    gen = torch.Generator().manual_seed(9)
    w, s = random_weight(160, 1024, gen=gen)
    x = torch.randn(5, 1024, generator=gen).to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    y = g.block_fp8_linear(x, w, s, config=g.GemvConfig(16, 64, 2, True, k_unroll=2))
    assert rel_err(y, ref) < 2 * OUTPUT_TOL
    assert rel_err(y, ref) < rel_err(g.reference_upstream_fp8_activation_linear(x, w, s), ref) / 2


def test_leading_dims_strided_rows_and_empty():
    gen = torch.Generator().manual_seed(3)
    w, s = random_weight(128, 256, gen=gen)
    wide = torch.randn(2, 3, 384, generator=gen).to(torch.bfloat16).to(DEVICE)
    x = wide[..., 64:320]  # rows strided by 384
    y = g.block_fp8_linear(x, w, s)
    assert y.shape == (2, 3, 128)
    assert rel_err(y, g.reference_block_fp8_linear(x, w, s)) < OUTPUT_TOL
    empty = g.block_fp8_linear(torch.empty(0, 256, dtype=torch.bfloat16, device=DEVICE), w, s)
    assert empty.shape == (0, 128)


def test_default_config_rows_and_split(monkeypatch):
    monkeypatch.setattr(g, "USE_ONE_CHUNK", False)  # the forms before runs 18 / 18b (test_fp8_gemv_one_chunk.py)
    assert not g.default_config(1, 1536, 4096).use_dot
    assert g.default_config(8, 4096, 4096).use_dot
    assert g.default_config(1, 1536, 4096).split_k > 1  # 48 tiles: split K to fill the GPU
    big = g.default_config(1, 32768, 1024)
    assert big.split_k == 1
    for m in range(1, 33):
        cfg = g.default_config(m, 4096, 4096)
        assert cfg.block_m >= m or cfg.use_dot


# --- numerics against upstream's FP8-activation path --------------------------------------------


@pytest.mark.parametrize("m", [1, 4, 16])
def test_closer_to_bf16_reference_than_upstream_fp8_activation(m):
    """Upstream quantises the activation per 128-group to e4m3 before the block GEMM; we keep it in
    bf16. Against the exact product of the bf16 activation and the dequantised weight, our error is
    bf16 output rounding only, upstream's adds the activation quantisation error."""
    gen = torch.Generator().manual_seed(m)
    n, k = 256, 1024
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen)
    x[:, ::97] *= 20  # DSv4 activations have outlier channels
    x = x.to(torch.bfloat16).to(DEVICE)
    exact = g.reference_block_fp8_linear(x, w, s)
    bf16_floor = rel_err(exact.to(torch.bfloat16), exact)  # rounding the exact result to bf16
    ours = rel_err(g.block_fp8_linear(x, w, s), exact)
    upstream = rel_err(g.reference_upstream_fp8_activation_linear(x, w, s).to(torch.bfloat16), exact)
    # the interpreter truncates fp32 -> bf16 (twice the round-to-nearest error); a GPU rounds
    assert ours < 2.2 * bf16_floor, (ours, bf16_floor)
    assert upstream > 5 * bf16_floor and upstream > 2 * ours, (ours, upstream, bf16_floor)


def test_upstream_emulation_quantises_per_token_group():
    gen = torch.Generator().manual_seed(5)
    w, s = random_weight(128, 256, gen=gen)
    x = torch.randn(3, 256, generator=gen).to(torch.bfloat16)
    # an activation that is exactly e4m3-representable at scale 1 round-trips unchanged
    exact_x = torch.tensor([448.0, -448.0, 1.0, 0.5] * 64).to(torch.bfloat16).reshape(1, 256)
    assert torch.allclose(g.reference_upstream_fp8_activation_linear(exact_x, w, s),
                          g.reference_block_fp8_linear(exact_x, w, s), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(g.reference_upstream_fp8_activation_linear(x, w, s),
                              g.reference_block_fp8_linear(x, w, s), rtol=1e-4, atol=1e-4)


# --- grouped wo_a -------------------------------------------------------------------------------

HEAD, ROPE = 128, 32  # reduced head width / rope dims (full: 512 / 64)


def rope_inputs(b, gen, max_pos=64):
    positions = torch.randint(0, max_pos, (b,), generator=gen, dtype=torch.int64)
    angles = torch.rand(max_pos, ROPE // 2, generator=gen) * 6.3
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    return positions.to(DEVICE), torch.view_as_real(freqs_cis).flatten(1).contiguous().to(DEVICE), freqs_cis


def rope_kwargs(b, gen, rope: bool) -> dict:
    """grouped_fp8_wo_a's fused inverse-RoPE keyword arguments for ``b`` rows (random positions), or none."""
    if not rope:
        return {}
    pos, freqs, _ = rope_inputs(b, gen)
    return dict(positions=pos, freqs=freqs, head_dim=HEAD, rope_dim=ROPE)



def check_ragged_grouped_wo_a(cfg, rope: bool, seed: int, groups: int) -> None:
    """grouped_fp8_wo_a with ``cfg`` on a ragged R (160 against 64/128-column tiles), a strided ``o`` (a slice of a
    wider buffer) and, with ``rope``, the fused inverse RoPE: finite and within OUTPUT_TOL of the float32 reference."""
    gen = torch.Generator().manual_seed(seed)
    b, r, d = 3, 160, 512
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d + 64, generator=gen).to(torch.bfloat16)[..., :d]
    kwargs = rope_kwargs(b, gen, rope)
    y = g.grouped_fp8_wo_a(o, w, s, out=poisoned((b, groups, r)), config=cfg, **kwargs)
    ref = g.reference_grouped_wo_a(o, w, s, kwargs.get("positions"), kwargs.get("freqs"), HEAD, ROPE)
    assert torch.isfinite(y).all() and rel_err(y, ref) < OUTPUT_TOL

@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("b", [1, 2, 3, 8, 16])
def test_wo_a_matches_reference(b, rope):
    gen = torch.Generator().manual_seed(b + 100 * rope)
    groups, r, d = 2, 256, 512  # 4 heads of 128 per group
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    kw = rope_kwargs(b, gen, rope)
    out = poisoned((b, groups, r))
    y = g.grouped_fp8_wo_a(o, w, s, out=out, **kw)
    assert y is out and torch.isfinite(y).all()
    ref = g.reference_grouped_wo_a(o, w, s, kw.get("positions"), kw.get("freqs"), HEAD, ROPE)
    assert rel_err(y, ref) < OUTPUT_TOL
    if rope:  # the rotation matters: without it the result is far off
        assert rel_err(g.reference_grouped_wo_a(o, w, s), ref) > 10 * OUTPUT_TOL


@pytest.mark.parametrize("cfg", [g.GemvConfig(1, 32, 4, False), g.GemvConfig(2, 32, 2, False),
                                 g.GemvConfig(1, 32, 1, False, k_unroll=2), g.GemvConfig(16, 64, 4, True),
                                 g.GemvConfig(16, 64, 2, True, k_unroll=2, swap_ab=True)], ids=lambda c: c.name)
def test_wo_a_forms_with_rope_and_strided_o(cfg):
    gen = torch.Generator().manual_seed(11)
    b, groups, r, d = 3, 2, 128, 512
    w, s = random_weight(r, d, groups=groups, gen=gen, pow2=cfg.use_dot and cfg.k_unroll > 1)
    heads = torch.randn(b, groups * d + 64, generator=gen).to(torch.bfloat16).to(DEVICE)
    o = heads[:, :groups * d].view(b, groups, d)  # token stride > G*D, as a sliced attention output
    pos, freqs, _ = rope_inputs(b, gen)
    y = g.grouped_fp8_wo_a(o, w, s, positions=pos.int(), freqs=freqs, head_dim=HEAD, rope_dim=ROPE,
                           out=poisoned((b, groups, r)), config=cfg)
    ref = g.reference_grouped_wo_a(o, w, s, pos, freqs, HEAD, ROPE)
    assert rel_err(y, ref) < OUTPUT_TOL


def test_inverse_rope_reference_is_conjugate_rotation():
    """The reference's rotation equals multiplying interleaved (re, im) pairs by conj(freqs_cis[pos])
    (upstream fused_rope_inplace(..., inverse=True)) and leaves the non-rope dims alone."""
    gen = torch.Generator().manual_seed(2)
    b, groups, d = 4, 2, 256
    o = torch.randn(b, groups, d, generator=gen).to(torch.bfloat16)
    pos, freqs, freqs_cis = rope_inputs(b, gen)
    got = g._inverse_rope_bf16(o, pos, freqs, HEAD, ROPE).reshape(b, -1, HEAD)
    heads = o.reshape(b, -1, HEAD)
    rope = torch.view_as_complex(heads[..., -ROPE:].float().reshape(b, -1, ROPE // 2, 2).contiguous())
    want = torch.view_as_real(rope * freqs_cis[pos].conj()[:, None]).reshape(b, -1, ROPE).to(torch.bfloat16)
    assert torch.equal(got[..., :-ROPE], heads[..., :-ROPE])
    assert torch.allclose(got[..., -ROPE:].float(), want.float(), atol=1e-2, rtol=1e-2)


def test_wo_a_prefill_rows_and_zero_rows():
    gen = torch.Generator().manual_seed(4)
    groups, r, d = 2, 128, 256
    w, s = random_weight(r, d, groups=groups, gen=gen)
    b = g.WO_A_MAX_KERNEL_ROWS + 1
    o = torch.randn(b, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    pos, freqs, _ = rope_inputs(b, gen)
    y = g.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, head_dim=HEAD, rope_dim=ROPE)
    assert rel_err(y, g.reference_grouped_wo_a(o, w, s, pos, freqs, HEAD, ROPE)) < OUTPUT_TOL
    assert g.grouped_fp8_wo_a(o[:0], w, s).shape == (0, groups, r)


ROPE_FORMS = sorted({cfg for cfg, rope in g.aot_forms() if rope}, key=lambda c: c.name)


@pytest.mark.parametrize("cfg", [None, *ROPE_FORMS], ids=lambda c: "default" if c is None else c.name)
def test_wo_a_positions_outside_the_table_give_nan_rows(cfg):
    """A position below 0 or at / past the freqs table's end reads no memory outside the table (a NaN row instead)
    and gives that token an all-NaN output; the other tokens are unaffected. Every shipped fused-RoPE form, the
    default plan, and the prefill path's reference rotation agree."""
    gen = torch.Generator().manual_seed(61)
    b, groups, r, d, max_pos = 5, 2, 160, 512, 48
    w, s = random_weight(r, d, groups=groups, gen=gen, pow2=True)
    o = torch.randn(b, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    pos, freqs, _ = rope_inputs(b, gen, max_pos=max_pos)
    pos[1], pos[3] = -1, max_pos  # just outside either end
    if cfg is None:
        pos = pos.int()  # int32 positions: -1 stays negative
    out = torch.full((b, groups, r), 7.0, dtype=torch.bfloat16, device=DEVICE)  # finite: a NaN must be written
    y = g.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, head_dim=HEAD, rope_dim=ROPE, out=out, config=cfg)
    bad = torch.tensor([False, True, False, True, False])
    assert torch.isnan(y[bad]).all()
    ref = g.reference_grouped_wo_a(o, w, s, pos, freqs, HEAD, ROPE)
    assert torch.isnan(ref[bad]).all() and torch.isfinite(ref[~bad]).all()
    assert torch.isfinite(y[~bad]).all() and rel_err(y[~bad], ref[~bad]) < OUTPUT_TOL


SMALL_GPU_FORMS = g.aot_forms()[len(dict.fromkeys(g.SHIPPED_FORMS)):]


@pytest.mark.parametrize("cfg, rope", SMALL_GPU_FORMS, ids=lambda v: v.name if isinstance(v, g.GemvConfig) else str(v))
def test_forms_only_smaller_gpus_pick_match_the_reference(cfg, rope):
    """The forms the rules pick only on GPUs of fewer SMs than any measured one (aot_forms beyond SHIPPED_FORMS): wo_a
    at a reduced grouped shape, with the fused inverse RoPE where the form has it, against the float32 reference."""
    gen = torch.Generator().manual_seed(67)
    b, groups, r, d = min(cfg.block_m, 3), 2, 128, 512
    w, s = random_weight(r, d, groups=groups, gen=gen, pow2=True)
    o = torch.randn(b, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    pos, freqs, _ = rope_inputs(b, gen) if rope else (None, None, None)
    out = torch.full((b, groups, r), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    y = g.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, head_dim=HEAD, rope_dim=ROPE, out=out, config=cfg)
    ref = g.reference_grouped_wo_a(o, w, s, pos, freqs, HEAD, ROPE)
    assert torch.isfinite(y).all() and rel_err(y, ref) < OUTPUT_TOL


@pytest.mark.parametrize("rope", [False, True])
def test_wo_a_dequantised_einsum_matches_the_kernel_contract(rope):
    """The dense seam's fallback (and the prefill path): a fresh contiguous [B, G, R] bf16 within bf16 rounding of the
    reference, or written into ``out``."""
    gen = torch.Generator().manual_seed(63)
    b, groups, r, d = 3, 2, 128, 256
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    kw = rope_kwargs(b, gen, rope)
    y = g.wo_a_dequantised_einsum(o, w, s, **kw)
    assert y.shape == (b, groups, r) and y.dtype == torch.bfloat16 and y.is_contiguous()
    ref = g.reference_grouped_wo_a(o, w, s, kw.get("positions"), kw.get("freqs"), HEAD, ROPE)
    assert rel_err(y, ref) < OUTPUT_TOL
    out = poisoned((b, groups, r))
    assert g.wo_a_dequantised_einsum(o, w, s, out=out, **kw) is out and torch.equal(out, y)


def test_wo_a_zero_rows_with_rope_on_every_path():
    """B = 0 with the inverse RoPE: the kernel entry, the seam's fallback einsum and the reference each give an empty
    [0, G, R] (the bf16 rotation once reshaped with an inferred head count, which 0 rows cannot give)."""
    gen = torch.Generator().manual_seed(64)
    groups, r, d = 2, 128, 256
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(0, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    kw = rope_kwargs(0, gen, True)
    for y in (g.grouped_fp8_wo_a(o, w, s, **kw), g.wo_a_dequantised_einsum(o, w, s, **kw),
              g.reference_grouped_wo_a(o, w, s, kw["positions"], kw["freqs"], HEAD, ROPE)):
        assert y.shape == (0, groups, r)


def test_wo_a_prefill_positions_outside_the_table_give_nan_rows():
    gen = torch.Generator().manual_seed(62)
    groups, r, d = 2, 128, 256
    b = g.WO_A_MAX_KERNEL_ROWS + 1
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    pos, freqs, _ = rope_inputs(b, gen)
    pos[0], pos[-1] = freqs.shape[0] + 5, -7
    y = g.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, head_dim=HEAD, rope_dim=ROPE)
    assert torch.isnan(y[[0, -1]]).all() and torch.isfinite(y[1:-1]).all()


# --- validation ---------------------------------------------------------------------------------


def test_bad_inputs_raise_value_errors():
    w, s = random_weight(128, 256)
    x = torch.randn(2, 256).to(torch.bfloat16)
    with pytest.raises(ValueError, match="x: expected a torch.bfloat16"):
        g.block_fp8_linear(x.float(), w, s)
    with pytest.raises(ValueError, match="weight: expected dtype torch.float8_e4m3fn"):
        g.block_fp8_linear(x, w.float(), s)
    with pytest.raises(ValueError, match=r"weight_scale: expected shape \(1, 2\)"):
        g.block_fp8_linear(x, w, s[:, :1])
    with pytest.raises(ValueError, match="weight_scale: expected dtype torch.float32"):
        g.block_fp8_linear(x, w, s.to(torch.bfloat16))
    with pytest.raises(ValueError, match="x: expected last dim 256"):
        g.block_fp8_linear(x[:, :128], w, s)
    with pytest.raises(ValueError, match="x: expected device"):
        g.block_fp8_linear(x.to("meta"), w, s)
    with pytest.raises(ValueError, match="out: expected contiguous bf16"):
        g.block_fp8_linear(x, w, s, out=torch.empty(2, 127, dtype=torch.bfloat16))
    w3, s3 = random_weight(128, 256, groups=2)
    o = torch.randn(1, 2, 256).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"o: expected \[B, 2, 256\]"):
        g.grouped_fp8_wo_a(o[:, :1], w3, s3)
    with pytest.raises(ValueError, match="positions and freqs"):
        g.grouped_fp8_wo_a(o, w3, s3, positions=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="positions: expected"):
        g.grouped_fp8_wo_a(o, w3, s3, positions=torch.zeros(2, dtype=torch.int64),
                           freqs=torch.zeros(4, 64), head_dim=128, rope_dim=64)
    with pytest.raises(ValueError, match="freqs: expected"):
        g.grouped_fp8_wo_a(o, w3, s3, positions=torch.zeros(1, dtype=torch.int64),
                           freqs=torch.zeros(4, 32), head_dim=128, rope_dim=64)
    with pytest.raises(ValueError, match="freqs: expected"):  # an empty table: no position is valid
        g.grouped_fp8_wo_a(o, w3, s3, positions=torch.zeros(1, dtype=torch.int64),
                           freqs=torch.zeros(0, 64), head_dim=128, rope_dim=64)


# --- FP8 tensor-core form (activation split into two e4m3 terms) -------------------------------


def q8(block_m=8, block_n=64, split=1, join=True, unroll=1, warps=4):
    return g.GemvConfig(block_m, block_n, split, True, warps, 3, unroll, fp8_mma=True, fp8_join=join)


Q8_FORMS = [q8(), q8(split=3), q8(block_n=32, split=2, unroll=2), q8(16, split=4), q8(join=False, split=2),
            q8(16, 128, 1, join=False, warps=8)]


def check_linear_twice(x, w, s, cfg):
    """block_fp8_linear at ``cfg`` into a poisoned output matches the reference, twice: the second call
    checks the split-K counters were left at zero."""
    ref = g.reference_block_fp8_linear(x, w, s)
    for _ in range(2):
        y = g.block_fp8_linear(x, w, s, out=poisoned((x.shape[0], w.shape[0])), config=cfg)
        assert torch.isfinite(y).all()
        assert rel_err(y, ref) < OUTPUT_TOL, cfg.name
    if cfg.split_k > 1:
        assert all(int(c.abs().sum()) == 0 for c in g._counter_cache.values())


@pytest.mark.parametrize("cfg", Q8_FORMS, ids=lambda c: c.name)
@pytest.mark.parametrize("m", [1, 5, 11])
def test_fp8_mma_forms_match_reference(cfg, m):
    gen = torch.Generator().manual_seed(17 * m + cfg.block_n + cfg.split_k)
    n, k = 200, 1000  # N ragged against every tile, K ragged against the 128-wide scale blocks
    w, s = random_weight(n, k, gen=gen)  # arbitrary scales: each block's product is scaled in fp32
    x = torch.randn(m, k, generator=gen)
    x[:, ::37] *= 50  # outlier channels: each 128-group gets its own activation scale
    x = x.to(torch.bfloat16).to(DEVICE)
    check_linear_twice(x, w, s, cfg)


# split-K sums loading several partials per step (split_sum_batch), also on the one-shot program (all of a split's
# K blocks in one iteration, 1 stage: no pipeline) that wo_a_config ships at T=1, 2..4 rows
SPLIT_SUM_FORMS = [dataclasses.replace(q8(split=3), split_sum_batch=2),  # 3 partials: the second step half masked
                   dataclasses.replace(q8(split=5), split_sum_batch=8),  # fewer partials than the batch
                   dataclasses.replace(q8(block_n=128, split=2, warps=4, unroll=4), num_stages=1, split_sum_batch=8),
                   dataclasses.replace(q8(block_n=128, split=3, warps=8, unroll=2), num_stages=1, split_sum_batch=4)]


@pytest.mark.parametrize("cfg", SPLIT_SUM_FORMS, ids=lambda c: c.name)
@pytest.mark.parametrize("m", [1, 5, 8])
def test_fp8_mma_batched_split_sum(cfg, m):
    """Against the reference (twice: the counters reset) and bit for bit against the same form summing one partial
    per step, which adds in the same order. K of 7.8 blocks: the one-shot forms' last split is shorter (masked)."""
    gen = torch.Generator().manual_seed(31 * m + cfg.split_k + cfg.split_sum_batch)
    n, k = 200, 1000
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen)
    x[:, ::37] *= 50
    x = x.to(torch.bfloat16).to(DEVICE)
    check_linear_twice(x, w, s, cfg)
    one_by_one = g.block_fp8_linear(x, w, s, config=dataclasses.replace(cfg, split_sum_batch=1))
    assert torch.equal(g.block_fp8_linear(x, w, s, out=poisoned((m, n)), config=cfg), one_by_one)


@pytest.mark.parametrize("rope", [False, True])
def test_wo_a_one_shot_form(rope):
    """wo_a_config's one-shot form on wo_a: ragged R, strided o, with and without the fused RoPE; no rows."""
    cfg = dataclasses.replace(q8(block_n=128, split=2), pdl=True, **g.WO_A_ONE_SHOT)
    check_ragged_grouped_wo_a(cfg, rope, seed=53 + rope, groups=2)
    w, s = random_weight(128, 512, groups=2)
    y = g.grouped_fp8_wo_a(torch.zeros(0, 2, 512, dtype=torch.bfloat16, device=DEVICE), w, s, config=cfg)
    assert y.shape == (0, 2, 128)


# --- inverse RoPE factors hoisted out of the K loop (GemvConfig.rope_hoist) ---------------------------------------

def rope_freqs(rope_dim, gen, max_pos=64):
    angles = torch.rand(max_pos, rope_dim // 2, generator=gen) * 6.3
    return torch.view_as_real(torch.polar(torch.ones_like(angles), angles)).flatten(1).contiguous().to(DEVICE)


ROPE_HOIST_FORMS = [
    g.GemvConfig(1, 64, 2, False, k_unroll=2),  # FMA, 256-wide chunks
    g.GemvConfig(2, 32, 1, False),  # FMA, 2 rows, 128-wide chunks
    g.GemvConfig(16, 64, 2, True),  # bf16 tensor-core tile
    q8(block_n=128, split=2, warps=4),  # FP8 tile (the fused-RoPE default's form, plain loads)
    q8(block_n=128, split=2, join=False),
    dataclasses.replace(q8(block_n=128, split=2), pdl=True, **g.WO_A_ONE_SHOT),  # one-shot
    # the split's rotated rope block preloaded where a split is one head (head 256 at split 2 / head 512 one-shot)
    dataclasses.replace(q8(block_n=128, split=2, warps=4), rope_preload=True),
    dataclasses.replace(q8(block_n=128, split=2, warps=4), rope_preload=True, w_tma=True),
    dataclasses.replace(q8(block_n=128, split=2), pdl=True, rope_preload=True, **g.WO_A_ONE_SHOT),
]
# (head, rope): a chunk is one head (128-wide chunks), two heads (256-wide), half a head (rope in its last
# chunk), or rope dims in more than one chunk of a head (not hoistable: the branch form runs)
ROPE_GEOMETRIES = [(128, 32), (256, 64), (512, 128), (512, 192)]


@pytest.mark.parametrize("head,rope", ROPE_GEOMETRIES)
@pytest.mark.parametrize("cfg", ROPE_HOIST_FORMS, ids=lambda c: c.name)
def test_wo_a_rope_hoist_matches_branch_form(cfg, head, rope):
    """The hoisted factors (and the preloaded rope block) give the branch form's result bit for bit (same arithmetic,
    the partner's sign moved onto the sin) and stay within OUTPUT_TOL of the reference: ragged R, strided o, rows past
    M masked."""
    gen = torch.Generator().manual_seed(head + rope + cfg.block_m)
    b, groups, r, d = 3, 2, 160, 512
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d + 64, generator=gen).to(torch.bfloat16).to(DEVICE)[..., :d]
    pos = torch.randint(0, 64, (b,), generator=gen).to(DEVICE)
    freqs = rope_freqs(rope, gen)
    kw = dict(positions=pos, freqs=freqs, head_dim=head, rope_dim=rope)
    hoisted = cfg if cfg.rope_preload else dataclasses.replace(cfg, rope_hoist=True)
    y = g.grouped_fp8_wo_a(o, w, s, out=poisoned((b, groups, r)), config=hoisted, **kw)
    ref = g.reference_grouped_wo_a(o, w, s, pos, freqs, head, rope)
    assert torch.isfinite(y).all() and rel_err(y, ref) < OUTPUT_TOL
    branch = dataclasses.replace(cfg, rope_preload=False)
    assert torch.equal(y, g.grouped_fp8_wo_a(o, w, s, config=branch, **kw))
    assert rel_err(g.reference_grouped_wo_a(o, w, s), ref) > 10 * OUTPUT_TOL  # the rotation matters


def test_rope_hoistable_geometry():
    assert g.rope_hoistable(128, 512, 64) and g.rope_hoistable(256, 512, 64) and g.rope_hoistable(512, 512, 64)
    assert g.rope_hoistable(1024, 512, 64) and g.rope_hoistable(128, 128, 32)
    assert not g.rope_hoistable(128, 512, 192)  # rope dims in two chunks of a head
    assert not g.rope_hoistable(384, 512, 64)  # chunks straddle heads


def test_rope_mode_per_geometry():
    """Which RoPE form a launch runs: preload only where every split is one head with its rope dims in its last
    block (wo_a at split 8: 4 blocks of 128 per 512-wide head), hoisted factors where rope_hoistable, else the branch."""
    pre = dataclasses.replace(q8(block_n=128, split=8, warps=4), rope_preload=True)
    rh = dataclasses.replace(q8(block_n=128, split=8, warps=4), rope_hoist=True)
    assert g.rope_mode(pre, True, 128, 4, 4096, 512, 64) == 2
    assert g.rope_mode(pre, True, 128, 8, 4096, 512, 64) == 1  # two heads per split
    assert g.rope_mode(pre, True, 128, 4, 4096, 512, 192) == 0  # rope dims in two blocks
    assert g.rope_mode(rh, True, 128, 4, 4096, 512, 64) == 1
    assert g.rope_mode(rh, False, 128, 4, 4096, 512, 64) == 0
    assert g.rope_mode(q8(block_n=128, split=8), True, 128, 4, 4096, 512, 64) == 0
    with pytest.raises(ValueError, match="rope_preload needs fp8_mma"):
        g.GemvConfig(1, 64, 2, False, k_unroll=2, rope_preload=True)


def test_rope_hoist_config():
    with pytest.raises(ValueError, match="no rope_hoist"):
        g.GemvConfig(2, 32, 1, False, rows_form=True, rope_hoist=True)
    cfg = dataclasses.replace(q8(block_n=128, split=2), pdl=True, rope_preload=True, **g.WO_A_ONE_SHOT)
    assert cfg.name.endswith("_pdl_sb8_rp") and dataclasses.replace(cfg, rope_hoist=True).name.endswith("_sb8_rh_rp")

def test_split_sum_batch_validation():
    with pytest.raises(ValueError, match="split_sum_batch >= 1"):
        dataclasses.replace(q8(split=2), split_sum_batch=0)
    with pytest.raises(ValueError, match="above 1 needs fp8_mma"):
        g.GemvConfig(16, 32, 2, True, split_sum_batch=2)
    assert dataclasses.replace(q8(split=2), split_sum_batch=8).name.endswith("_sb8")


def test_one_chunk_validation():
    with pytest.raises(ValueError, match="one_chunk needs the rows form with prefetch"):
        g.GemvConfig(1, 32, 1, False, k_unroll=2, one_chunk=True)
    with pytest.raises(ValueError, match="one_chunk needs the rows form with prefetch"):
        g.GemvConfig(1, 16, 1, False, k_unroll=4, rows_form=True, one_chunk=True)
    cfg = g.GemvConfig(1, 16, 1, False, k_unroll=8, rows_form=True, prefetch=True, one_chunk=True)
    assert cfg.name.endswith("_pf_oc")


@pytest.mark.parametrize("form", ["q8j", "q8jc_split2"])
def test_fp8_mma_zero_rows_and_huge_values(form):
    """A zero activation row (amax 0) gives zeros, not NaN; values near bf16's top are split without
    overflow (the FP8 tensor-core form and its chained variant with K splits)."""
    gen = torch.Generator().manual_seed(21)
    w, s = random_weight(128, 512, gen=gen)
    x = torch.randn(3, 512, generator=gen)
    x[0] = 0.0
    x[2, :128] *= 1e30
    x = x.to(torch.bfloat16).to(DEVICE)
    config = q8() if form == "q8j" else q8c(split=2)
    y = g.block_fp8_linear(x, w, s, out=poisoned((3, 128)), config=config)
    ref = g.reference_block_fp8_linear(x, w, s)
    assert torch.equal(y[0].float(), torch.zeros(128))
    assert torch.isfinite(y).all()
    assert rel_err(y[1], ref[1]) < OUTPUT_TOL
    assert rel_err(y[2].float() * 1e-29, ref[2] * 1e-29) < OUTPUT_TOL  # norms of 1e29 values overflow fp32


def test_fp8_mma_bad_configs():
    """fp8_join / fp8_chain without fp8_mma and 1-row tiles are rejected; the chained form is no default."""
    with pytest.raises(ValueError, match="fp8_join needs fp8_mma"):
        g.GemvConfig(8, 64, 1, True, fp8_join=True)
    with pytest.raises(ValueError, match="fp8_mma needs"):
        g.GemvConfig(1, 64, 1, True, fp8_mma=True)
    with pytest.raises(ValueError, match="fp8_chain needs fp8_mma"):
        g.GemvConfig(8, 64, 1, True, fp8_chain=True)
    assert q8c().name.startswith("q8jc_") and q8c(join=False).name.startswith("q8c_")
    assert not g.default_config(4, 1024, 4096, groups=8).fp8_chain


@triton.jit
def _split_probe_kernel(x_ptr, q_ptr, s_ptr, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    r = tl.arange(0, ROWS)
    c = tl.arange(0, WIDTH)
    x = tl.load(x_ptr + r[:, None] * WIDTH + c[None, :]).to(tl.float32)
    q, scale = g._split_activation_joined(x)
    r2 = tl.arange(0, 2 * ROWS)
    tl.store(q_ptr + r2[:, None] * WIDTH + c[None, :], q)
    tl.store(s_ptr + r2, scale)


def test_activation_split_is_exact_for_bf16():
    """x = s * (hi + lo / 16) with power-of-two s holds exactly for bf16 x (normal range of e4m3), so the
    FP8 tensor-core form multiplies the bf16 activation itself, not an FP8 rounding of it."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(8, FP8_BLOCK, generator=gen) * torch.logspace(-3, 3, 8)[:, None]
    x[1, :5] = torch.tensor([31.75, -255.0, 447.0, 1e-3, 0.0])  # rounding carries into the exponent
    x[7] = 0.0
    x = x.to(torch.bfloat16).to(DEVICE)
    q = torch.empty(16, FP8_BLOCK, dtype=g.FP8_DTYPE, device=DEVICE)
    scale = torch.empty(16, dtype=torch.float32, device=DEVICE)
    _split_probe_kernel[(1,)](x, q, scale, ROWS=8, WIDTH=FP8_BLOCK)
    hi, lo = q[:8].float() * scale[:8, None], q[8:].float() * scale[8:, None]
    assert torch.equal(scale[8:], scale[:8] / 16)
    assert torch.all(torch.log2(scale).frac() == 0)  # powers of two
    recon = hi + lo
    rows_ok = x.float().abs().amax(1) > 0
    # exact except in e4m3's subnormal range (|x| < 2^-6 s): there within s * 2^-13
    err = (recon - x.float()).abs()
    assert torch.all(err <= scale[:8, None] * 2.0 ** -13)
    assert torch.equal(recon[1, :3], x[1, :3].float())
    assert torch.equal(recon[~rows_ok], torch.zeros_like(recon[~rows_ok]))


def test_default_config_fp8_mma_where_measured_faster():
    """The H200 runs 6/6b put 2..8 rows of large weights on the FP8 tensor-core form, nothing else."""
    wo_a = g.default_config(4, 1024, 4096, groups=8)  # T=1, 32 MiB
    assert wo_a.fp8_mma and wo_a.fp8_join and wo_a.block_n == 128 and wo_a.split_k > 1
    assert g.default_config(2, 1024, 4096, groups=8).fp8_mma
    assert g.default_config(8, 32768, 1024).fp8_mma and g.default_config(8, 32768, 1024).block_n == 64
    assert g.default_config(4, 4096, 4096).fp8_mma  # 16 MiB, K = 4096
    assert not g.default_config(2, 4096, 4096).fp8_mma  # 2 rows need 32 MiB
    assert not g.default_config(4, 16384, 1024).fp8_mma  # 16 MiB at K = 1024
    assert not g.default_config(1, 1024, 4096, groups=8).fp8_mma
    assert not g.default_config(9, 1024, 4096, groups=8).fp8_mma
    assert not g.default_config(8, 1536, 4096).fp8_mma


@pytest.mark.parametrize("cfg", [q8(split=2), q8(16, 128, 3, join=False, warps=8)], ids=lambda c: c.name)
def test_wo_a_fp8_mma_with_rope_and_strided_o(cfg):
    gen = torch.Generator().manual_seed(12)
    b, groups, r, d = 3, 2, 128, 512
    w, s = random_weight(r, d, groups=groups, gen=gen)
    heads = torch.randn(b, groups * d + 64, generator=gen).to(torch.bfloat16).to(DEVICE)
    o = heads[:, :groups * d].view(b, groups, d)
    pos, freqs, _ = rope_inputs(b, gen)
    y = g.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, head_dim=HEAD, rope_dim=ROPE,
                           out=poisoned((b, groups, r)), config=cfg)
    assert rel_err(y, g.reference_grouped_wo_a(o, w, s, pos, freqs, HEAD, ROPE)) < OUTPUT_TOL


# --- chained FP8 tensor-core form (weight scale folded into the activation, one scale per split) ----


def q8c(block_m=8, block_n=64, split=1, unroll=1, warps=4, join=True):
    return g.GemvConfig(block_m, block_n, split, True, warps, 3, unroll, fp8_mma=True, fp8_join=join,
                        fp8_chain=True)


Q8C_FORMS = [q8c(), q8c(split=3), q8c(block_n=32, split=2, unroll=2), q8c(16, 128, 2, warps=8),
             q8c(join=False), q8c(block_n=128, split=3, warps=8, join=False)]


@pytest.mark.parametrize("cfg", Q8C_FORMS, ids=lambda c: c.name)
@pytest.mark.parametrize("m", [1, 2, 5, 8, 16])
def test_fp8_chain_forms_match_reference(cfg, m):
    """Random weights with arbitrary (not power-of-two) block scales, outlier channels, ragged N and K,
    split-K on and off; the error stays at bf16 output rounding, like the unchained form's."""
    gen = torch.Generator().manual_seed(31 * m + cfg.block_n + cfg.split_k)
    n, k = 200, 1000
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen)
    x[:, ::37] *= 50
    x = x.to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    unchained = g.block_fp8_linear(x, w, s, config=q8(cfg.block_m, cfg.block_n, cfg.split_k, join=cfg.fp8_join,
                                                      unroll=cfg.k_unroll, warps=cfg.num_warps))
    for _ in range(2):  # the second call checks the split-K counters were left at zero
        y = g.block_fp8_linear(x, w, s, out=poisoned((m, n)), config=cfg)
        assert torch.isfinite(y).all()
        assert rel_err(y, ref) < OUTPUT_TOL, cfg.name
        # as close to the fp32 reference as the unchained form (both at bf16 output rounding)
        assert rel_err(y, ref) <= rel_err(unchained, ref) * 1.25 + 1e-4
    if cfg.split_k > 1:
        assert all(int(c.abs().sum()) == 0 for c in g._counter_cache.values())


@pytest.mark.parametrize("join", [True, False])
def test_fp8_chain_power_of_two_scales_match_unchained_closely(join):
    """With DSv4's power-of-two (UE8M0) weight scales, x * w_scale / S is exact, so the chained form
    multiplies the same bf16 activation as the unchained form: both differ only in fp32 summation
    order (and bf16 output rounding)."""
    gen = torch.Generator().manual_seed(5)
    w, s = random_weight(256, 1024, gen=gen, pow2=True)
    x = torch.randn(8, 1024, generator=gen).to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    y = g.block_fp8_linear(x, w, s, config=q8c(split=2, join=join))
    y0 = g.block_fp8_linear(x, w, s, config=q8(split=2, join=join))
    assert rel_err(y, ref) < OUTPUT_TOL
    assert (y.float() - y0.float()).abs().max() <= 2 * 2.0 ** -8 * ref.abs().max()


@pytest.mark.parametrize("join", [True, False])
def test_fp8_chain_wide_dynamic_range_row(join):
    """One scale S per row and K split: where one element sets S (|x * w_scale| at the split's top) and the
    rest of the row lies 2^d below it, the rest is split with an absolute floor of S * 2^-14 per element
    (e4m3 subnormals), so its relative error grows with d. Adversarial rows: the top element meets a zero
    weight column (it sets S but contributes nothing). Measured under the interpreter: d = 0 / 8 / 12 / 16
    / 20 -> 0.0033 / 0.0027 / 0.0039 / 0.011 / 0.25 (the unchained form, one scale per 128-block: 0.0027 -
    0.0036 on every row)."""
    gen = torch.Generator().manual_seed(9)
    k = 4 * FP8_BLOCK
    w_dense = torch.randn(128, k, generator=gen) * 0.02
    w_dense[:, 0] = 0.0
    wq, s = block_quantize(w_dense, pow2=True)
    w, s = wq.to(DEVICE), s.to(DEVICE)
    ranges = (0, 8, 12, 16, 20)
    x = torch.randn(len(ranges), k, generator=gen)
    x[:, :FP8_BLOCK] = 0.0
    x[:, 0] = 2.0 ** 12
    for i, d in enumerate(ranges):
        x[i, FP8_BLOCK:] *= 2.0 ** (12 - d)
    x = x.to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    chained = g.block_fp8_linear(x, w, s, out=poisoned(ref.shape), config=q8c(join=join))
    unchained = g.block_fp8_linear(x, w, s, config=q8())
    err = [rel_err(chained[i], ref[i]) for i in range(len(ranges))]
    assert all(rel_err(unchained[i], ref[i]) < OUTPUT_TOL for i in range(len(ranges)))
    assert err[0] < OUTPUT_TOL and err[1] < OUTPUT_TOL and err[2] < OUTPUT_TOL  # up to 2^12 below the top
    assert OUTPUT_TOL < err[3] < 0.03 and 0.05 < err[4] < 1.0  # 2^16: ~1 %, 2^20: the floor dominates
    # the floor bound per row: ||y - ref|| <= ||S * 2^-14 * sum_k |w_q[n, k]||| + the output-rounding tolerance
    row_scale = torch.exp2(torch.ceil(torch.log2(2.0 ** 12 * s[:, 0].amax() / g.FP8_MAX)))
    floor = (row_scale * 2.0 ** -14 * w.float().abs().sum(-1)).norm()
    assert torch.all((chained.float() - ref).norm(dim=-1) <= floor + OUTPUT_TOL * ref.norm(dim=-1))


@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("rope", [False, True])
def test_wo_a_fp8_chain(rope, join):
    gen = torch.Generator().manual_seed(13)
    b, groups, r, d = 3, 2, 128, 512
    w, s = random_weight(r, d, groups=groups, gen=gen)
    heads = torch.randn(b, groups * d + 64, generator=gen).to(torch.bfloat16).to(DEVICE)
    o = heads[:, :groups * d].view(b, groups, d)
    pos, freqs = (rope_inputs(b, gen)[:2]) if rope else (None, None)
    kw = dict(head_dim=HEAD, rope_dim=ROPE) if rope else {}
    y = g.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, out=poisoned((b, groups, r)),
                           config=q8c(split=2, join=join), **kw)
    assert rel_err(y, g.reference_grouped_wo_a(o, w, s, pos, freqs, **kw)) < OUTPUT_TOL


# --- programmatic dependent launch (GemvConfig.pdl) -----------------------------------------------
# The interpreter has no inline PTX: it runs the PDL forms' program order (weight prefetch first, activation
# and stores after the wait point) without the PDL instructions. On the GPU the device script checks a chain
# of dependent GEMVs, each launched with PDL in one CUDA graph, bit for bit against eager launches without it;
# the AOT configs check that the instructions are in the SASS.


def with_pdl(cfg, blocks=16):
    return dataclasses.replace(cfg, pdl=True, pdl_l2_blocks=blocks)


PDL_FORMS = [with_pdl(g.GemvConfig(1, 32, 3, False, k_unroll=2)),
             with_pdl(g.GemvConfig(1, 16, 1, False, num_warps=8, k_unroll=8, rows_form=True, prefetch=True), 4),
             with_pdl(g.GemvConfig(2, 32, 2, False, k_unroll=2, rows_form=True), 0),
             with_pdl(g.GemvConfig(8, 16, 3, False, k_unroll=4, rows_form=True, prefetch=True, evict_first=True)),
             with_pdl(g.GemvConfig(16, 32, 2, True)),
             with_pdl(q8(split=3)), with_pdl(q8(block_n=128, warps=8), 4),
             # launch_dependents after the main loop
             dataclasses.replace(with_pdl(g.GemvConfig(16, 32, 2, True), 4), pdl_late=True),
             dataclasses.replace(with_pdl(q8(split=2), 0), pdl_late=True),
             dataclasses.replace(with_pdl(g.GemvConfig(2, 32, 3, False, k_unroll=2, rows_form=True, prefetch=True)),
                                 pdl_late=True)]


@pytest.mark.parametrize("cfg", PDL_FORMS, ids=lambda c: c.name)
@pytest.mark.parametrize("m", [1, 2, 5])
def test_pdl_forms_match_reference(cfg, m):
    gen = torch.Generator().manual_seed(23 * m + cfg.block_n + cfg.split_k)
    n, k = 200, 1000  # ragged N and K: the L2 prefetch addresses clamp to the tile's last row / the split's block
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    check_linear_twice(x, w, s, cfg)


@pytest.mark.parametrize("cfg", [with_pdl(g.GemvConfig(1, 32, 4, False, k_unroll=2)), with_pdl(q8(split=2), 4)],
                         ids=lambda c: c.name)
def test_wo_a_pdl_with_rope(cfg):
    gen = torch.Generator().manual_seed(29)
    b, groups, r, d = 2, 2, 128, 512
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    pos, freqs, _ = rope_inputs(b, gen)
    y = g.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, head_dim=HEAD, rope_dim=ROPE,
                           out=poisoned((b, groups, r)), config=cfg)
    assert rel_err(y, g.reference_grouped_wo_a(o, w, s, pos, freqs, HEAD, ROPE)) < OUTPUT_TOL


@pytest.mark.parametrize("capability, expected", [((8, 0), False), ((9, 0), True), ((12, 0), True)])
def test_pdl_only_on_gpus_with_griddepcontrol(monkeypatch, fresh_caches, capability, expected):
    assert not g.pdl_supported(torch.device("cpu"))
    monkeypatch.setattr(g, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert g.pdl_supported(torch.device("cuda", 0)) is expected


def test_pdl_config_validation_and_name():
    cfg = with_pdl(g.GemvConfig(1, 32, 1, False, k_unroll=2))
    assert cfg.name.endswith("_pdl_l2p16")
    assert with_pdl(cfg, 0).name.endswith("_pdl")
    assert dataclasses.replace(cfg, pdl_late=True).name.endswith("_pdl_l2p16_late")
    for bad in (dict(pdl_l2_blocks=4), dict(pdl=True, pdl_l2_blocks=3), dict(pdl=True, pdl_l2_blocks=-2),
                dict(pdl_late=True)):
        with pytest.raises(ValueError, match="pdl_l2_blocks"):
            g.GemvConfig(1, 32, 1, False, **bad)
    aot = g.aot_config(cfg)
    assert set(g.PDL_OPCODES) <= set(aot.expect_opcodes) and g.L2_PREFETCH_OPCODE in aot.expect_opcodes
    assert not set(g.PDL_OPCODES) & set(g.aot_config(dataclasses.replace(cfg, pdl=False, pdl_l2_blocks=0))
                                        .expect_opcodes)


def test_default_config_pdl_where_measured_faster(monkeypatch):
    """H200 runs 8/9 (benchmarks/fp8_gemv-h200-run9-pdl.summary.md): PDL at 1 row (the FMA form with 4 K blocks
    prefetched into L2, the one-shot rows forms without), on the 128-column FP8 tile of 32 MiB weights, late at 2
    rows (prefetching below 4 MiB), late on the smaller tensor-core tiles; USE_PDL = False turns it off. (Without the
    one-chunk rule of runs 18 / 18b, which launches with PDL too: test_fp8_gemv_one_chunk.py.)"""
    monkeypatch.setattr(g, "USE_ONE_CHUNK", False)
    fma = g.default_config(1, 1536, 4096)
    assert fma.pdl and fma.pdl_l2_blocks == g.PDL_FMA_L2_BLOCKS and not fma.use_dot and not fma.rows_form
    one_shot = g.default_config(1, 4096, 1024)
    assert one_shot.rows_form and one_shot.pdl and one_shot.pdl_l2_blocks == 0
    for m in (2, 4, 8):
        wo_a = g.default_config(m, 1024, 4096, groups=8)  # T=1, 32 MiB
        assert wo_a.fp8_mma and wo_a.block_n == 128 and wo_a.pdl and not wo_a.pdl_late and not wo_a.pdl_l2_blocks
        assert not g.default_config(m, 32768, 1024).pdl  # 64-column FP8 tile
    for m in (4, 8):
        assert not g.default_config(m, 1024, 4096, groups=4).pdl  # T=2, 16 MiB FP8 tile
    two_rows = g.default_config(2, 4096, 4096)  # 16 MiB
    assert two_rows.rows_form and two_rows.pdl_late and not two_rows.prefetch
    small = g.default_config(2, 4096, 1024)  # 4 MiB
    assert small.prefetch and small.pdl and not small.pdl_late and small.pdl_l2_blocks == 16
    for m in (3, 8, 16):
        dot = g.default_config(m, 4096, 1024)  # 4 MiB: late, L2 prefetch
        assert dot.use_dot and dot.pdl_late and dot.pdl_l2_blocks == g.PDL_DOT_L2_BLOCKS
        assert not g.default_config(m, 1536, 4096).pdl  # wqkv_a, 6 MiB
        assert not g.default_config(m, 16384, 1024).pdl  # wq_b T=2, 16 MiB
    assert not g.default_config(16, 4096, 8192).pdl  # wo_b T=1, 16 rows
    assert not g.default_config(17, 1024, 1024).pdl  # 32-row tiles: not measured
    assert g.launch_form(1, 1536, 4096) == dataclasses.replace(fma, pdl=False, pdl_l2_blocks=0)
    monkeypatch.setattr(g, "USE_PDL", False)
    assert g.default_config(1, 1536, 4096) == g.launch_form(1, 1536, 4096)


@pytest.mark.parametrize("seed", range(24))
def test_random_shapes_match_reference(seed):
    """A sweep of random valid calls of block_fp8_linear: ragged N and K (not multiples of the 128 block), leading
    shapes from empty to 3-D, row counts across the GEMV / skinny-GEMM forms."""
    r = random.Random(seed)
    n = r.choice([1, 5, 64, 127, 128, 129, 256, 300, 512, 640])
    k = r.choice([1, 16, 100, 128, 129, 256, 384, 500, 1024, 1100])
    lead = r.choice([(), (0,), (1,), (2,), (3,), (5,), (8,), (9,), (16,), (17,), (2, 3)])
    gen = torch.Generator().manual_seed(seed)
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(*lead, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    y = g.block_fp8_linear(x, w, s)
    assert y.shape == (*lead, n) and y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    if y.numel():
        assert rel_err(y, g.reference_block_fp8_linear(x.reshape(-1, k), w, s).reshape(*lead, n)) < OUTPUT_TOL


@pytest.mark.parametrize("seed", range(24))
def test_random_wo_a_calls_match_reference(seed):
    """A sweep of random valid grouped_fp8_wo_a calls: group counts, ragged R, head and rope widths, row counts from
    0 to past the kernel's limit, and the inverse RoPE with positions outside a short table (NaN rows there)."""
    r = random.Random(seed)
    groups, rows_r, head = r.choice([1, 2, 3, 8]), r.choice([1, 64, 128, 200, 256]), r.choice([64, 128, 256])
    rope_dim, d = min(r.choice([2, 16, 32, 64]), head), head * r.choice([1, 2, 4])
    b = r.choice([0, 1, 2, 3, 4, 5, 8, 9, 16, 20])
    gen = torch.Generator().manual_seed(seed)
    w, s = random_weight(rows_r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    kw = {}
    if r.random() < 0.7:
        table = r.choice([1, 5, 100])
        angles = torch.rand(table, rope_dim // 2, generator=gen) * 2 * math.pi
        freqs = torch.view_as_real(torch.polar(torch.ones_like(angles), angles)).flatten(1)
        kw = dict(positions=torch.randint(-2, table + 2, (b,), generator=gen).to(DEVICE), freqs=freqs.to(DEVICE),
                  head_dim=head, rope_dim=rope_dim)
    y = g.grouped_fp8_wo_a(o, w, s, **kw)
    ref = g.reference_grouped_wo_a(o, w, s, **kw)
    assert y.shape == (b, groups, rows_r)
    bad = torch.isnan(ref)
    assert torch.equal(torch.isnan(y), bad)
    if (~bad).any():  # a handful of outputs: one bf16 rounding step weighs more than in a long row
        assert rel_err(y[~bad], ref[~bad]) < (OUTPUT_TOL if (~bad).sum() >= 64 else 2e-2)


@pytest.mark.parametrize("m, n, k, groups, cfg, sms, grid, split, per_split", [
    # the one-shot wo_a form at T=1: 8 column tiles x 8 splits of 4 blocks x 8 groups
    (1, 1024, 4096, 8, g.GemvConfig(8, 128, 8, True, k_unroll=4), 132, (8, 8, 8), 8, 4),
    # 7 splits asked of 32 blocks: 5 blocks each, rounded up to whole iterations of k_unroll 2 -> 6 blocks per split,
    # 6 splits (no empty split); 2 row tiles x 8 column tiles
    (3, 256, 4096, 1, g.GemvConfig(2, 32, 7, False, k_unroll=2, rows_form=True), 132, (16, 6, 1), 6, 6),
    # more splits than K blocks: one block each
    (16, 64, 256, 1, g.GemvConfig(16, 32, 8, True), 132, (2, 2, 1), 2, 1),
    # persistent: min(work items, SMs x programs per SM), one dimension
    (2, 4096, 4096, 1, g.GemvConfig(16, 32, 1, True, persistent_programs_per_sm=2), 132, (128,), 1, 32),
    (2, 4096, 4096, 1, g.GemvConfig(16, 32, 1, True, persistent_programs_per_sm=2), 32, (64,), 1, 32),
])
def test_launch_grid(m, n, k, groups, cfg, sms, grid, split, per_split):
    assert g.launch_grid(m, n, k, groups, cfg, sms) == (grid, split, per_split)
