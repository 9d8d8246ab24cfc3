"""Sparse MLA decode kernel under the interpreter (or on a GPU) against its float32 reference and
against upstream SGLang's own torch fallback ``_sm120_sparse_decode_fwd``."""

import math
import random

import pytest
import torch

from sglang_sm120.kernels import sparse_mla_decode as smd
from sglang_sm120.kernels.dsv4 import C4_PAGE_SIZE, C128_PAGE_SIZE, HEAD_DIM, SWA_PAGE_SIZE

from ..conftest import DEVICE

SCALE = HEAD_DIM ** -0.5
OUT_TOL = 2e-2  # bf16 P and bf16 output rounding (the interpreter truncates instead of rounding)
LSE_TOL = 1e-3


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Outputs and split-K scratch start as NaN, so anything the kernel fails to write shows."""
    def nan_buffer(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(smd, "_new_buffer", nan_buffer)


def _slots(gen, shape, n_slots, invalid_fraction=0.2, out_of_range=True):
    """Token slots in [0, n_slots), with -1 and (optionally) out-of-range slots mixed in."""
    slots = torch.randint(0, n_slots, shape, generator=gen, dtype=torch.int32)
    roll = torch.rand(shape, generator=gen)
    slots[roll < invalid_fraction] = -1
    if out_of_range:
        slots[(roll >= invalid_fraction) & (roll < invalid_fraction + 0.05)] = n_slots + 3
    return slots


def _case(seed, batch, s_q, heads, page_size, topk, extra_page_size=None, extra_topk=0, sink=True,
          lengths="ragged", out_of_range=True):
    gen = torch.Generator().manual_seed(seed)
    pages = max(2, -(-3 * topk // page_size))
    cache, _ = smd.random_v4_cache(pages, page_size, spare_pages=2, generator=gen)
    q = (torch.randn(batch, s_q, heads, HEAD_DIM, generator=gen) * 0.5).to(torch.bfloat16)
    args = dict(q=q, k_cache=cache, indices=_slots(gen, (batch, s_q, topk), pages * page_size,
                                                    out_of_range=out_of_range),
                topk_length=None, attn_sink=torch.randn(heads, generator=gen) if sink else None,
                head_dim_v=HEAD_DIM, softmax_scale=SCALE)
    if lengths == "ragged":
        args["topk_length"] = torch.randint(0, topk + 1, (batch,), generator=gen, dtype=torch.int32)
    elif lengths == "full":
        args["topk_length"] = torch.full((batch,), topk, dtype=torch.int32)
    if extra_page_size is not None:
        x_pages = max(2, -(-3 * extra_topk // extra_page_size))
        x_cache, _ = smd.random_v4_cache(x_pages, extra_page_size, spare_pages=2, generator=gen)
        args.update(extra_k_cache=x_cache,
                    extra_indices=_slots(gen, (batch, s_q, extra_topk), x_pages * extra_page_size,
                                         out_of_range=out_of_range),
                    extra_topk_length=torch.randint(0, extra_topk + 1, (batch,), generator=gen, dtype=torch.int32)
                    if lengths == "ragged" else None)
    return {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def _check(args, num_splits=None, launch_config=None):
    out, lse = smd.sparse_mla_decode(**args, num_splits=num_splits, launch_config=launch_config)
    ref_out, ref_lse = smd.reference_sparse_mla_decode(**args)
    b, s_q, h, _ = args["q"].shape
    assert out.shape == (b, s_q, h, HEAD_DIM) and out.dtype == torch.bfloat16
    assert lse.shape == (b, h, s_q) and lse.dtype == torch.float32
    assert torch.isfinite(out).all()
    lonely = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), lonely)
    torch.testing.assert_close(lse[~lonely], ref_lse[~lonely], atol=LSE_TOL, rtol=LSE_TOL)
    assert (out.permute(0, 2, 1, 3)[lonely] == 0).all()  # lonely rows give zeros, sink or not
    err = (out.double() - ref_out.double()).norm() / ref_out.double().norm().clamp_min(1e-30)
    assert err < OUT_TOL, f"relative error {err:.3e}"
    return out, lse


# page sizes: SWA main cache (256) with a C4 (64) or C128 (2) extra cache, and each alone
@pytest.mark.parametrize("page_size,topk,extra_page_size,extra_topk", [
    (SWA_PAGE_SIZE, 48, C4_PAGE_SIZE, 80),
    (SWA_PAGE_SIZE, 32, C128_PAGE_SIZE, 40),
    (C4_PAGE_SIZE, 40, None, 0),
    (C128_PAGE_SIZE, 24, None, 0),
])
@pytest.mark.parametrize("heads", [64, 32, 16, 8])
def test_page_sizes_and_head_counts(page_size, topk, extra_page_size, extra_topk, heads):
    _check(_case(heads + page_size, 2, 1, heads, page_size, topk, extra_page_size, extra_topk))


@pytest.mark.parametrize("s_q", [2, 3, 4])
@pytest.mark.parametrize("sink", [True, False])
def test_mtp_query_rows_and_sink(s_q, sink):
    _check(_case(10 * s_q + sink, 2, s_q, 16, SWA_PAGE_SIZE, 32, C4_PAGE_SIZE, 40, sink=sink))


@pytest.mark.parametrize("num_splits", [1, 2, 3, "max"])
@pytest.mark.parametrize("heads", [64, 16])
def test_split_k_combine_matches_one_split(num_splits, heads):
    args = _case(7, 1, 1, heads, SWA_PAGE_SIZE, 64, C4_PAGE_SIZE, 64, lengths="full")
    tiles = -(-64 // smd.LAUNCH_CONFIGS[smd.padded_heads(heads)]["BLOCK_N"]) * 2
    _check(args, num_splits=min(tiles, smd.MAX_SPLITS) if num_splits == "max" else num_splits)


@pytest.mark.parametrize("lengths", ["none", "full", "ragged"])
def test_lengths(lengths):
    _check(_case(3, 3, 1, 8, C4_PAGE_SIZE, 40, C128_PAGE_SIZE, 24, lengths=lengths))


@pytest.mark.parametrize("num_splits", [None, 1, "max"])
@pytest.mark.parametrize("heads", [64, 16])
@pytest.mark.parametrize("early_loads", [True, False])
def test_first_tile_slots_read_before_the_lengths(num_splits, heads, early_loads):
    """EARLY_LOADS: a program reads its first tile's slots as if the row were full, then masks them by the row's
    lengths, or reads them again where a main list shorter by a tile or more moves the extra cache's tiles. One row per case: full,
    shorter within the last tile, shorter by exactly one tile, by more, one candidate, none; the slots past each length
    are valid ones, so a missed mask shows in the output."""
    block_n = smd.LAUNCH_CONFIGS[smd.padded_heads(heads)]["BLOCK_N"]
    topk, extra_topk = 3 * block_n + 16, 2 * block_n
    main_lengths = [topk, topk - 5, topk - block_n, 2 * block_n, 2 * block_n - 1, 1, 0]
    args = _case(17, len(main_lengths), 1, heads, C4_PAGE_SIZE, topk, SWA_PAGE_SIZE, extra_topk, lengths="full",
                 out_of_range=False)
    gen = torch.Generator().manual_seed(18)
    args["indices"] = torch.randint(0, args["k_cache"].shape[0] * C4_PAGE_SIZE, args["indices"].shape, generator=gen,
                                    dtype=torch.int32).to(DEVICE)
    args["topk_length"] = torch.tensor(main_lengths, dtype=torch.int32, device=DEVICE)
    args["extra_topk_length"] = torch.tensor([extra_topk, extra_topk - 3, block_n, extra_topk, 5, extra_topk, 0],
                                             dtype=torch.int32, device=DEVICE)
    tiles = -(-topk // block_n) + -(-extra_topk // block_n)
    cfg = dict(smd.LAUNCH_CONFIGS[smd.padded_heads(heads)], EARLY_LOADS=early_loads)
    out, lse = _check(args, num_splits=min(tiles, smd.MAX_SPLITS) if num_splits == "max" else num_splits,
                      launch_config=cfg)
    assert torch.isneginf(lse[-1]).all() and torch.isfinite(lse[:-1]).all()


@pytest.mark.parametrize("sink", [True, False])
def test_all_invalid_and_zero_length_rows_are_lonely(sink):
    args = _case(5, 3, 2, 16, SWA_PAGE_SIZE, 32, C4_PAGE_SIZE, 32, sink=sink, lengths="full")
    args["indices"][0] = -1  # row 0: every slot invalid in both caches
    args["extra_indices"][0] = -1
    args["topk_length"][1] = 0  # row 1: zero lengths
    args["extra_topk_length"] = torch.tensor([32, 0, 32], dtype=torch.int32, device=DEVICE)
    out, lse = _check(args, num_splits=2)
    assert (out[:2] == 0).all() and torch.isneginf(lse[:2]).all()
    assert torch.isfinite(lse[2]).all()


def test_out_of_range_slots_are_never_read():
    # slots past the view point into spare pages full of FP8 NaNs: reading one would give NaN
    args = _case(11, 2, 1, 16, C4_PAGE_SIZE, 32, C128_PAGE_SIZE, 16, lengths="full", out_of_range=False)
    n_slots = args["k_cache"].shape[0] * args["k_cache"].shape[1]
    args["indices"][:, :, ::3] = n_slots + torch.arange(0, args["indices"][:, :, ::3].numel(),
                                                        device=DEVICE).view_as(args["indices"][:, :, ::3]) % 64
    x_slots = args["extra_k_cache"].shape[0] * args["extra_k_cache"].shape[1]
    args["extra_indices"][:, :, 1::2] = x_slots
    out, _ = _check(args)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("batch", [0, 1])
def test_batch_zero_and_one(batch):
    args = _case(13, batch, 1, 32, SWA_PAGE_SIZE, 16, C4_PAGE_SIZE, 16)
    if batch == 0:
        out, lse = smd.sparse_mla_decode(**args)
        assert out.shape == (0, 1, 32, HEAD_DIM) and lse.shape == (0, 32, 1)
    else:
        _check(args)


def test_fp8_typed_cache_view_and_strided_q():
    args = _case(17, 2, 1, 16, SWA_PAGE_SIZE, 24, C4_PAGE_SIZE, 24)
    args["k_cache"] = args["k_cache"].view(torch.float8_e4m3fn)  # SGLang hands either dtype
    wide = torch.zeros(2, 1, 20, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    wide[:, :, 2:18] = args["q"]
    args["q"] = wide[:, :, 2:18]  # a head slice of a padded q, as the backend passes it
    _check(args)


# --- against upstream's own torch fallback (installed SGLang) ---------------------------------

@pytest.mark.parametrize("heads,s_q,extra", [(64, 1, "c4"), (16, 2, "c128"), (8, 1, None)])
@pytest.mark.parametrize("sink", [True, False])
def test_matches_upstream_torch_fallback(heads, s_q, extra, sink):
    fallback = pytest.importorskip("sglang.kernels.ops.attention.flash_mla_sm120")._sm120_sparse_decode_fwd
    page, topk = {"c4": (C4_PAGE_SIZE, 48), "c128": (C128_PAGE_SIZE, 32), None: (None, 0)}[extra]
    # upstream indexes out-of-range slots (an IndexError), so stay in range here
    args = _case(heads + s_q + sink, 2, s_q, heads, SWA_PAGE_SIZE, 64, page, topk, sink=sink, out_of_range=False)
    args["indices"][1, :, :5] = -1
    up_out, up_lse = fallback(args["q"], args["k_cache"], args["indices"], args["topk_length"], args["attn_sink"],
                              HEAD_DIM, SCALE, args.get("extra_k_cache"), args.get("extra_indices"),
                              args.get("extra_topk_length"))
    out, lse = smd.sparse_mla_decode(**args, num_splits=2)
    assert lse.shape == up_lse.shape and out.shape == up_out.shape
    lonely = torch.isneginf(up_lse)
    assert torch.equal(torch.isneginf(lse), lonely)
    torch.testing.assert_close(lse[~lonely], up_lse[~lonely], atol=LSE_TOL, rtol=LSE_TOL)
    err = (out.double() - up_out.double()).norm() / up_out.double().norm()
    assert err < OUT_TOL


def test_reference_matches_upstream_torch_fallback_exactly():
    fallback = pytest.importorskip("sglang.kernels.ops.attention.flash_mla_sm120")._sm120_sparse_decode_fwd
    args = _case(23, 2, 2, 8, SWA_PAGE_SIZE, 40, C4_PAGE_SIZE, 40, out_of_range=False)
    up_out, up_lse = fallback(*(args[k] for k in ("q", "k_cache", "indices", "topk_length", "attn_sink")), HEAD_DIM,
                              SCALE, args["extra_k_cache"], args["extra_indices"], args["extra_topk_length"])
    ref_out, ref_lse = smd.reference_sparse_mla_decode(**args)
    torch.testing.assert_close(ref_lse, up_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref_out.to(torch.bfloat16), up_out, atol=1e-2, rtol=1e-2)


# --- validation ----------------------------------------------------------------------------

def _bad(args, **changes):
    return {**args, **changes}


@pytest.mark.parametrize("change,name", [
    (lambda a: _bad(a, q=a["q"].float()), "q"),
    (lambda a: _bad(a, q=a["q"][..., :256]), "q"),
    (lambda a: _bad(a, q=torch.zeros(2, 1, 65, HEAD_DIM, dtype=torch.bfloat16)), "q"),
    (lambda a: _bad(a, k_cache=a["k_cache"][..., :528]), "k_cache"),
    (lambda a: _bad(a, k_cache=a["k_cache"].view(torch.int8)), "k_cache"),
    (lambda a: _bad(a, k_cache=torch.zeros(2, 64, 1, 584, dtype=torch.uint8, device="meta")), "k_cache"),
    # rows further apart than a token's bytes (a column slice of a wider buffer): the kernel addresses a page's
    # bytes from its start, so such a view would read other bytes
    (lambda a: _bad(a, k_cache=torch.cat([a["k_cache"], a["k_cache"]], dim=3)[..., :584]), "k_cache"),
    (lambda a: _bad(a, extra_k_cache=torch.cat([a["extra_k_cache"], a["extra_k_cache"]], dim=3)[..., :584]),
     "extra_k_cache"),
    (lambda a: _bad(a, indices=a["indices"].long()), "indices"),
    (lambda a: _bad(a, indices=a["indices"][:, 0]), "indices"),
    (lambda a: _bad(a, topk_length=a["topk_length"][:1]), "topk_length"),
    (lambda a: _bad(a, attn_sink=a["attn_sink"].to(torch.bfloat16)), "attn_sink"),
    (lambda a: _bad(a, head_dim_v=448), "head_dim_v"),
    (lambda a: _bad(a, extra_indices=None), "extra_indices"),
    (lambda a: _bad(a, extra_indices=a["extra_indices"][:1]), "extra_indices"),
    (lambda a: _bad(a, extra_topk_length=a["extra_topk_length"].float()), "extra_topk_length"),
    # strided 1-D views: the kernel reads element b (h) at offset b (h)
    (lambda a: _bad(a, topk_length=a["topk_length"].repeat_interleave(2)[::2]), "topk_length"),
    (lambda a: _bad(a, extra_topk_length=a["extra_topk_length"].repeat_interleave(2)[::2]), "extra_topk_length"),
    (lambda a: _bad(a, attn_sink=a["attn_sink"].repeat_interleave(2)[::2]), "attn_sink"),
])
def test_bad_input_raises_value_error_naming_the_argument(change, name):
    args = _case(29, 2, 1, 16, SWA_PAGE_SIZE, 16, C4_PAGE_SIZE, 16)
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        smd.sparse_mla_decode(**change(args))


def test_split_count_depends_on_shapes_only():
    assert smd.choose_splits(1, 40, "cpu") == (8, 5)  # 8 "SMs" under the interpreter
    assert smd.choose_splits(8, 40, "cpu") == (1, 40)
    assert smd.choose_splits(1, 1, "cpu") == (1, 1)
    splits, per = smd.choose_splits(3, 7, "cpu")
    assert splits * per >= 7 and (splits - 1) * per < 7
    assert math.isclose(smd.LOG2E * smd.LN2, 1.0)


# The launch forms the defaults select (each default is asserted equal to one of them below), in
# each tile loop; measured-losing forms were removed (records under benchmarks/).
LAUNCH_FORMS = {
    "bh16": (8, dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1)),
    # 16-head blocks at H=64 and H=32: four / two programs per query row gather the same KV rows
    "bh16_at_h64": (64, dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1)),
    "bh16_at_h32": (32, dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1)),
    # one query row (variants run 28): the decode's query, sink and first slots issued before the lengths arrive
    "bh16_at_h64_one_row": (64, dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1,
                                     EARLY_LOADS=True)),
    "bh16_at_h16_one_row": (16, dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1,
                                     EARLY_LOADS=True)),
    # the next tile's raw KV issued between the current tile's QK and PV products (run 5)
    "bh32_mid_prefetch": (64, dict(BLOCK_H=32, BLOCK_N=32, PREFETCH_KV=False, MID_PREFETCH=True, num_warps=8,
                                   num_stages=1)),
    # run 6/7: the L2 prefetch of the next tile's lines (a no-op here: the interpreter has no
    # inline asm, so these check the loop that carries the slots further), bf16 split-K partial
    # accumulators and wider combine programs
    "bh64_bn16_l2_prefetch_bf16_partials": (64, dict(BLOCK_H=64, BLOCK_N=16, PREFETCH_KV=False, L2_PREFETCH=True,
                                                     PARTIAL_BF16=True, num_warps=8, num_stages=1)),
    "bh64_bn16_l2_prefetch_bf16_partials_cols128": (64, dict(BLOCK_H=64, BLOCK_N=16, PREFETCH_KV=False,
                                                             L2_PREFETCH=True, PARTIAL_BF16=True, num_warps=8,
                                                             num_stages=1, COMBINE_COLS=128)),
    "bh32_bf16_partials": (64, dict(BLOCK_H=32, BLOCK_N=32, PREFETCH_KV=True, PARTIAL_BF16=True, num_warps=8,
                                    num_stages=1)),
}


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("form", sorted(LAUNCH_FORMS))
def test_launch_forms(form, num_splits):
    heads, cfg = LAUNCH_FORMS[form]
    args = _case(41, 2, 2, heads, SWA_PAGE_SIZE, 40, C4_PAGE_SIZE, 40)
    _check(args, num_splits=num_splits, launch_config=cfg)


@pytest.mark.parametrize("widest,partial_bf16", [(32, False), (128, True)])
def test_more_than_sixteen_splits_use_the_narrow_combine(widest, partial_bf16):
    cfg = dict(LAUNCH_FORMS["bh16"][1], BLOCK_N=16, COMBINE_COLS=widest, PARTIAL_BF16=partial_bf16)
    args = _case(43, 1, 1, 16, C4_PAGE_SIZE, 160, C128_PAGE_SIZE, 160, lengths="full")
    assert smd.combine_cols(20) < smd.combine_cols(16)
    assert smd.combine_cols(20, widest) == 16 and smd.combine_cols(2, widest) == widest
    _check(args, num_splits=20, launch_config=cfg)


def test_wide_combine_at_two_splits_only():
    heads, cfg = LAUNCH_FORMS["bh64_bn16_l2_prefetch_bf16_partials_cols128"]
    assert smd._combine_width(cfg, 2) == 128 and smd._combine_width(cfg, 3) == smd.combine_cols(3)
    _check(_case(55, 2, 1, heads, SWA_PAGE_SIZE, 48, C4_PAGE_SIZE, 64), num_splits=2, launch_config=cfg)


def test_launch_config_must_divide_the_heads():
    args = _case(45, 1, 1, 16, SWA_PAGE_SIZE, 16)
    with pytest.raises(ValueError, match=r"^launch_config: expected BLOCK_H"):
        smd.sparse_mla_decode(**args, launch_config=LAUNCH_FORMS["bh64_bn16_l2_prefetch_bf16_partials"][1])


@pytest.mark.parametrize("loops", [(), ("PREFETCH_KV", "L2_PREFETCH"), ("PREFETCH_KV", "MID_PREFETCH")])
def test_launch_config_must_name_one_tile_loop(loops):
    args = _case(45, 1, 1, 16, SWA_PAGE_SIZE, 16)
    cfg = dict(LAUNCH_FORMS["bh16"][1], PREFETCH_KV=False)
    cfg.update({loop: True for loop in loops})
    with pytest.raises(ValueError, match=r"^launch_config: expected exactly one tile loop"):
        smd.sparse_mla_decode(**args, launch_config=cfg)


class _LaunchRecorder:
    """Stands in for a jitted kernel: records the keyword arguments of each ``kernel[grid](...)`` launch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(kwargs)


@pytest.mark.parametrize("use_pdl", [True, False])
@pytest.mark.parametrize("supported", [True, False])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_pdl_decision_reaches_both_launches(monkeypatch, use_pdl, supported, num_splits):
    """Programmatic dependent launch: the decode launch (and the combine when split) carry the launch attribute and
    the kernels' wait / trigger (constexpr PDL) together, on where the device supports it unless USE_PDL is off."""
    decode, combine = _LaunchRecorder(), _LaunchRecorder()
    monkeypatch.setattr(smd, "sparse_mla_decode_kernel", decode)
    monkeypatch.setattr(smd, "sparse_mla_combine_kernel", combine)
    monkeypatch.setattr(smd, "pdl_supported", lambda device: supported)
    monkeypatch.setattr(smd, "USE_PDL", use_pdl)
    smd.sparse_mla_decode(**_case(5, 1, 1, 64, SWA_PAGE_SIZE, 128), num_splits=num_splits)
    expected = use_pdl and supported
    launches = decode.launches + combine.launches
    assert len(decode.launches) == 1 and len(combine.launches) == (num_splits > 1)
    assert [(k["PDL"], k["launch_pdl"]) for k in launches] == [(expected, expected)] * len(launches)


def test_split_rule_avoids_a_second_wave():
    # 8 "SMs" under the interpreter: 3 units x 3 splits would need two waves of programs
    assert smd.choose_splits(3, 12, "cpu") == (2, 6)
    assert smd.choose_splits(2, 20, "cpu") == (4, 5)
    assert smd.choose_splits(2, 20, "cpu", max_splits=2) == (2, 10)


def test_default_launch_config_by_heads_and_rows():
    rows, large = smd.LARGE_BATCH_CONFIGS[64]
    assert smd.launch_config_for(64, rows - 1) is smd.LAUNCH_CONFIGS[64]
    assert smd.launch_config_for(64, rows) is large and large["BLOCK_H"] == 64
    assert smd.launch_config_for(8, 4 * rows) is smd.LAUNCH_CONFIGS[16]
    # the large-batch form is one of the launch forms checked above against the reference
    assert large == LAUNCH_FORMS["bh64_bn16_l2_prefetch_bf16_partials"][1]
    assert smd.LAUNCH_CONFIGS[64] == LAUNCH_FORMS["bh32_bf16_partials"][1]
    # from more rows on, the same kernel with wider combine programs
    wide_rows, wide = smd.WIDE_COMBINE_CONFIGS[64]
    assert wide_rows > rows
    assert smd.launch_config_for(64, wide_rows - 1) is large and smd.launch_config_for(64, wide_rows) is wide
    assert wide == LAUNCH_FORMS["bh64_bn16_l2_prefetch_bf16_partials_cols128"][1]


def test_default_launch_config_by_candidates_per_row():
    rows, large = smd.LARGE_BATCH_CONFIGS[64]
    few_rows, few = smd.FEW_CANDIDATES_CONFIGS[64]
    many = smd.LARGE_BATCH_MIN_CANDIDATES
    assert smd.launch_config_for(64, rows, many) is large
    assert smd.launch_config_for(64, rows, None) is large  # unknown: as many as a C4 layer
    # rows with few candidates keep two 32-head programs, with the mid-loop prefetch from few_rows on
    assert few_rows > rows
    assert smd.launch_config_for(64, rows, many - 1) is smd.LAUNCH_CONFIGS[64]
    assert smd.launch_config_for(64, few_rows - 1, many - 1) is smd.LAUNCH_CONFIGS[64]
    assert smd.launch_config_for(64, few_rows, many - 1) is few and few["BLOCK_H"] == 32
    assert smd.launch_config_for(32, 4 * few_rows, 1) is smd.LAUNCH_CONFIGS[32]
    assert few == LAUNCH_FORMS["bh32_mid_prefetch"][1]  # checked against the reference above


@pytest.mark.parametrize("major,takes_large", [(9, True), (12, False), (8, False), (10, False)])
def test_large_batch_form_only_where_measured(monkeypatch, major, takes_large):
    """The 64-head large-batch form is taken where it compiles as on the H200 that timed it (warpgroup MMA, compute
    capability 9.x); elsewhere (sm_12x, where the same form is 1.9x the instructions) the 32-head form stays. Rows
    with few candidates take their own form either way; no device (or the CPU) keeps the table as measured."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    rows, large = smd.LARGE_BATCH_CONFIGS[64]
    wide_rows, wide = smd.WIDE_COMBINE_CONFIGS[64]
    few_rows, few = smd.FEW_CANDIDATES_CONFIGS[64]
    many = smd.LARGE_BATCH_MIN_CANDIDATES
    gpu = torch.device("cuda", 0)
    assert smd.large_batch_form_measured(gpu) is takes_large
    assert smd.launch_config_for(64, rows, many, gpu) is (large if takes_large else smd.LAUNCH_CONFIGS[64])
    assert smd.launch_config_for(64, wide_rows, None, gpu) is (wide if takes_large else smd.LAUNCH_CONFIGS[64])
    assert smd.launch_config_for(64, few_rows, many - 1, gpu) is few
    assert smd.launch_config_for(64, rows - 1, many, gpu) is smd.LAUNCH_CONFIGS[64]
    assert smd.launch_config_for(64, 1, many, gpu) is smd.SMALL_BATCH_CONFIGS[64][1]
    for device in (None, "cpu", torch.device("cpu")):
        assert smd.large_batch_form_measured(device)
        assert smd.launch_config_for(64, rows, many, device) is large


def test_default_path_counts_both_caches_candidates(monkeypatch):
    seen = []
    choose = smd.launch_config_for
    monkeypatch.setattr(smd, "launch_config_for", lambda *a: seen.append(a) or choose(*a))
    _check(_case(49, 2, 1, 32, SWA_PAGE_SIZE, 24, C128_PAGE_SIZE, 40))
    _check(_case(51, 2, 1, 16, C4_PAGE_SIZE, 40))
    assert [a[:3] for a in seen] == [(32, 2, 24 + 40), (16, 2, 40)]
    # the query's device decides the form
    assert all(torch.device(a[3]).type == torch.device(DEVICE).type for a in seen)


@pytest.mark.parametrize("heads", [64, 32, 16])
def test_few_rows_run_sixteen_head_programs(heads):
    rows, small = smd.SMALL_BATCH_CONFIGS[heads]
    assert smd.launch_config_for(heads, rows) is small and small["BLOCK_H"] == 16
    if heads > 16:
        assert smd.launch_config_for(heads, rows + 1)["BLOCK_H"] > 16
    assert small == LAUNCH_FORMS[f"bh16_at_h{heads}" + ("_one_row" if rows == 1 else "")][1]
    # the early loads only where one row was measured faster with them
    assert all(not cfg.get("EARLY_LOADS")
               for cfg in [smd.launch_config_for(h, r) for h in (64, 32, 16) for r in (2, 3, 8, 64)])
    # the default path (no launch_config) at that row count: H/16 programs per row, split-K combine
    args = _case(47, rows, 1, heads, SWA_PAGE_SIZE, 40, C4_PAGE_SIZE, 40)
    _check(args)


@pytest.mark.parametrize("seed", range(24))
def test_random_shapes_match_reference(seed):
    """A sweep of random valid calls (page sizes beyond DSv4's, any head count, top-k widths not a multiple of the
    tile, ragged / full / absent lengths, an optional extra cache and sink, forced split counts) against the
    reference, each with -1 and out-of-range slots mixed in."""
    r = random.Random(seed)
    page_size, topk = r.choice([2, 4, 64, 128, 256]), r.randint(1, 200)
    extra_page_size = r.choice([None, 2, 64, 256])
    extra_topk = r.randint(0, 150) if extra_page_size else 0
    heads, batch, s_q = r.choice([1, 3, 8, 16, 24, 32, 48, 64]), r.randint(0, 4), r.randint(1, 3)
    args = _case(seed + 1000, batch, s_q, heads, page_size, topk, extra_page_size, extra_topk,
                 sink=r.random() < 0.5, lengths=r.choice(["ragged", "full", None]))
    num_splits = None
    if r.random() < 0.4 and batch:
        block_n = smd.launch_config_for(heads, batch * s_q, topk + extra_topk)["BLOCK_N"]
        tiles = max(-(-topk // block_n) + -(-extra_topk // block_n), 1)
        num_splits = r.randint(1, min(tiles, smd.MAX_SPLITS))
    _check(args, num_splits=num_splits)
