"""MXFP4 routed-expert kernels against the float32 reference, under the CPU interpreter.

Reduced shapes: 8 experts, H=256, per-rank I = 256/T for T in (1, 2, 4, 8) (the full model's
2048/T scaled down 8x). Weights are random bytes (every e2m1 code), scales random E8M0 bytes
around 2**0; the activations are large enough that the SwiGLU clamp (limit 10) is active.
"""

import contextlib
import dataclasses
import random

import pytest
import torch
import triton
import triton.language as tl

from sglang_sm120.kernels import moe_mxfp4 as moe
from sglang_sm120.kernels import moe_prefill
from sglang_sm120.kernels.dsv4 import MOE_INTERMEDIATE_SIZE, MXFP4_GROUP, SUPPORTED_TP, SWIGLU_LIMIT
from sglang_sm120.kernels.harness.interpreter import interpreter_enabled

DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"

NUM_EXPERTS = 8
HIDDEN = 256
INTERS = [256 // tp for tp in SUPPORTED_TP]
TOP_K = 6


@contextlib.contextmanager
def poisoned_scratch(int_value=None):
    """Inside: torch.empty fills floating-point tensors with NaN, so every scratch buffer a forward
    allocates (atomic outputs, split-K partials) must be written by the kernels, not be zero by luck;
    with ``int_value`` integer tensors (the routing tables) are filled with it too."""
    real_empty = torch.empty

    def poisoned_empty(*args, **kw):
        t = real_empty(*args, **kw)
        if t.is_floating_point():
            return t.fill_(float("nan"))
        return t.fill_(int_value) if int_value is not None and t.dtype != torch.bool else t

    torch.empty = poisoned_empty
    try:
        yield
    finally:
        torch.empty = real_empty


def make_experts(inter, num_experts=NUM_EXPERTS, hidden=HIDDEN, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randint(-128, 128, (num_experts, 2 * inter, hidden // 2), dtype=torch.int8, generator=g)
    s13 = torch.randint(119, 128, (num_experts, 2 * inter, hidden // MXFP4_GROUP), dtype=torch.uint8, generator=g)
    w2 = torch.randint(-128, 128, (num_experts, hidden, inter // 2), dtype=torch.int8, generator=g)
    s2 = torch.randint(119, 128, (num_experts, hidden, inter // MXFP4_GROUP), dtype=torch.uint8, generator=g)
    return [t.to(DEVICE) for t in (w13, s13.view(torch.float8_e8m0fnu), w2, s2.view(torch.float8_e8m0fnu))]


def make_routing(batch, pattern, num_experts=NUM_EXPERTS, seed=1):
    g = torch.Generator().manual_seed(seed)
    if pattern == "random":  # distinct experts per token, like SGLang's top-k
        ids = torch.stack([torch.randperm(num_experts, generator=g)[:TOP_K] for _ in range(batch)]) \
            if batch else torch.empty(0, TOP_K, dtype=torch.int64)
    elif pattern == "skewed":  # every token hits expert 3, the rest from two experts
        ids = torch.randint(5, 7, (batch, TOP_K), generator=g)
        ids[:, 0] = 3
    elif pattern == "duplicate":  # the same expert several times within a token
        ids = torch.randint(0, num_experts, (batch, 1), generator=g).repeat(1, TOP_K)
        ids[:, -1] = (ids[:, -1] + 1) % num_experts
    elif pattern == "invalid":  # -1 / out-of-range ids (padding) contribute nothing
        ids = torch.randint(0, num_experts, (batch, TOP_K), generator=g)
        ids[::2, 1] = -1
        ids[:, 4] = num_experts + 2
    elif pattern == "all_invalid":
        ids = torch.full((batch, TOP_K), -1)
    else:
        raise ValueError(pattern)
    weights = torch.rand(batch, TOP_K, generator=g) * 1.5
    return weights.to(DEVICE), ids.to(torch.int32).to(DEVICE)


def make_x(batch, hidden=HIDDEN, seed=2, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, hidden, generator=g) * scale).to(torch.bfloat16).to(DEVICE)


def repacked(w13, s13):
    w13r, s13r = w13.clone(), s13.clone()
    moe.repack_w13_(w13r, s13r)
    return w13r, s13r


# split-K under test: the reduced H=256 needs smaller K tiles than the decode defaults to split at all
SPLIT_TILES = (moe.GemmConfig(16, 16, 64, 4, 2), moe.GemmConfig(16, 64, 32, 4, 2))


def split_kwargs(inter):
    """forward kwargs of the split-K decode: gate/up K in 4 splits, down in 2 (1 where I/32 is 1 step)."""
    return {"split_k": (4, min(2, inter // 32)), "configs": SPLIT_TILES}


def run(x, experts, weights, ids, **kw):
    w13, s13, w2, s2 = experts
    w13r, s13r = repacked(w13, s13)
    out = torch.full_like(x, float("nan"))
    result = moe.moe_mxfp4_forward(x, w13r, s13r, w2, s2, weights, ids, out=out, **kw)
    assert result is out
    return out


def assert_launches_repeat_the_forward(launches, out, ref):
    """The launches of one forward, run in order, give the reference; run again on a poisoned ``out``
    they give the same bits (no state left behind: tickets, scratch)."""
    for _, launch in launches:
        launch()
    first = out.clone()
    assert rel(first, ref) < 2e-2
    out.fill_(float("nan"))
    for _, launch in launches:
        launch()
    assert torch.equal(out, first)


def rel(a, b):
    return ((a.float() - b).norm() / b.norm().clamp(min=1e-30)).item()


# --- the reference is upstream's dequantisation, bit for bit -------------------------------------
def test_reference_dequant_matches_upstream_dequant_mxfp4():
    from sglang.srt.layers.quantization.fp8_utils import dequant_mxfp4

    g = torch.Generator().manual_seed(3)
    packed = torch.randint(0, 256, (2, 5, 4 * 16), dtype=torch.uint8, generator=g)
    scales = torch.arange(256, dtype=torch.uint8)[:40].reshape(2, 5, 4)  # includes 0 (2**-127)
    scales = torch.cat([scales, torch.arange(216, 256, dtype=torch.uint8).reshape(2, 5, 4)], dim=1)
    packed = torch.cat([packed, packed], dim=1)  # rows with the huge scales up to 255 (inf)
    ours = moe.reference_dequant_mxfp4(packed, scales)
    theirs = dequant_mxfp4(packed.view(2, 10, 4, 16), scales, torch.float32)
    assert torch.equal(ours.isnan(), theirs.isnan())
    keep = ~ours.isnan()
    assert torch.equal(ours[keep], theirs[keep])


def test_reference_dequant_takes_e8m0_or_uint8_scales():
    packed = torch.tensor([[0x21, 0xF9] * 16], dtype=torch.uint8)
    scale = torch.tensor([[128]], dtype=torch.uint8)
    got = moe.reference_dequant_mxfp4(packed, scale)
    assert got[0, :4].tolist() == [1.0, 2.0, -1.0, -12.0]
    assert torch.equal(got, moe.reference_dequant_mxfp4(packed, scale.view(torch.float8_e8m0fnu)))
    with pytest.raises(ValueError, match="scale"):
        moe.reference_dequant_mxfp4(packed, scale.float())


# --- weight repacking -----------------------------------------------------------------------------
@pytest.mark.parametrize("inter", INTERS)
def test_repack_round_trips_in_place(inter):
    w13, s13, _, _ = make_experts(inter)
    w13r, s13r = w13.clone(), s13.clone()
    ptrs = (w13r.data_ptr(), s13r.data_ptr())
    moe.repack_w13_(w13r, s13r)
    assert (w13r.data_ptr(), s13r.data_ptr()) == ptrs  # no second copy of the layer
    assert torch.equal(w13r[:, 0::2], w13[:, :inter]) and torch.equal(w13r[:, 1::2], w13[:, inter:])
    assert torch.equal(s13r.view(torch.uint8)[:, 1::2], s13.view(torch.uint8)[:, inter:])
    moe.unpack_w13_(w13r, s13r)
    assert torch.equal(w13r, w13) and torch.equal(s13r.view(torch.uint8), s13.view(torch.uint8))


# --- decode / prefill forward ---------------------------------------------------------------------
# (upcast, split-K decode): the defaults, the split-nibble upcast, the split-K variant and the CUDA-core GEMV
VARIANTS = [(None, False), ("split_bf16", False), (None, True), ("gemv", False)]
VARIANT_IDS = ["default", "split_bf16", "splitk", "gemv"]

# GEMV tiles for B=64 under the interpreter (its time grows with programs x routed rows): one program
# per expert and projection up to I=64, two-row passes
GEMV_BIG_TILES = (moe.GemvConfig(64, 256, 4, True), moe.GemvConfig(HIDDEN, 256, 4, True))


def variant_kwargs(upcast, split, batch, inter):
    if split:
        return split_kwargs(inter)
    if upcast == "gemv" and batch > 1:  # the default tiles run at B=1 (and in the routing patterns)
        return {"upcast": "gemv", "configs": (moe.GemvConfig(min(64, inter), 256, 4, True), GEMV_BIG_TILES[1])}
    return {"upcast": upcast}


# the split-K and GEMV variants at B=64 only at the smaller I (the interpreter's time; the routing
# patterns below run them at B=64 too)
FORWARD_CASES = [pytest.param(batch, inter, upcast, split, id=f"{batch}-{inter}-{vid}")
                 for batch in (0, 1, 3, 64) for inter in INTERS for (upcast, split), vid in zip(VARIANTS, VARIANT_IDS)
                 if not ((split or upcast == "gemv") and batch == 64 and inter > 64)]


@pytest.mark.parametrize("batch,inter,upcast,split", FORWARD_CASES)
def test_forward_matches_reference(inter, batch, upcast, split):
    experts = make_experts(inter)
    weights, ids = make_routing(batch, "random")
    x = make_x(batch)
    out = run(x, experts, weights, ids, **variant_kwargs(upcast, split, batch, inter))
    assert out.shape == (batch, HIDDEN) and out.dtype == torch.bfloat16
    if batch == 0:
        return
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    assert torch.isfinite(out).all()
    assert rel(out, ref) < 2e-2  # bf16 activations and intermediates (interpreter truncates to bf16)


def test_clamp_is_active_and_matters():
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(3, "random")
    x = make_x(3, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    unclamped = moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0)
    assert rel(unclamped, ref) > 0.1  # the test inputs do exercise the clamp
    out = run(x, experts, weights, ids)
    assert rel(out, ref) < 2e-2
    out_unclamped = run(x, experts, weights, ids, swiglu_limit=0.0)
    assert rel(out_unclamped, unclamped) < 2e-2


@pytest.mark.parametrize("upcast,split", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("pattern", ["skewed", "duplicate", "invalid", "all_invalid"])
@pytest.mark.parametrize("batch", [1, 64])
def test_forward_routing_patterns(pattern, batch, upcast, split):
    inter = 64 if split else 32  # I=64: the down K loop has two steps to split
    experts = make_experts(inter)
    weights, ids = make_routing(batch, pattern)
    x = make_x(batch)
    out = run(x, experts, weights, ids, **variant_kwargs(upcast, split, batch, inter))
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    if pattern == "all_invalid":
        assert torch.equal(out, torch.zeros_like(out))
    else:
        assert rel(out, ref) < 2e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_graph_dequant_equals_the_reference_bit_for_bit(dtype):
    """The fallback's dequantisation (device arithmetic only, capturable) against the reference's table lookup, over
    every byte of packed e2m1 and every E8M0 scale byte (bf16: the reference's float32 values rounded to bf16)."""
    packed = torch.arange(256, dtype=torch.uint8).view(torch.int8).reshape(1, 16, 16).to(DEVICE)  # 256 codes, K=32
    for scale_byte in [*range(0, 255, 7), 1, 126, 127, 128, 253, 254, 255]:
        scale = torch.full((1, 16, 1), scale_byte, dtype=torch.uint8, device=DEVICE)
        ref = moe.reference_dequant_mxfp4(packed, scale).to(dtype)
        got = moe.dequant_mxfp4_in_graph(packed, scale, dtype)
        assert got.dtype == dtype and got.shape == ref.shape
        assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                           ref.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)), scale_byte


def test_in_graph_dequant_keeps_leading_dims_and_the_e8m0_dtype():
    """Expert-batched ``[E, N, K/2]`` inputs with ``float8_e8m0fnu`` scales, as the seam holds them."""
    gen = torch.Generator().manual_seed(5)
    packed = torch.randint(0, 256, (3, 4, 64), dtype=torch.uint8, generator=gen).to(DEVICE)
    scale = torch.randint(110, 140, (3, 4, 4), dtype=torch.uint8, generator=gen).to(DEVICE)
    ref = moe.reference_dequant_mxfp4(packed, scale)
    got = moe.dequant_mxfp4_in_graph(packed, scale.view(torch.float8_e8m0fnu))
    assert got.shape == (3, 4, 128) and torch.equal(got.view(torch.int32), ref.view(torch.int32))
    empty = moe.dequant_mxfp4_in_graph(packed[:, :0], scale[:, :0], torch.bfloat16)  # no rows: a [3, 0, 128] result
    assert empty.shape == (3, 0, 128) and empty.dtype == torch.bfloat16


@pytest.mark.parametrize("all_experts", [False, True], ids=["chosen_experts", "every_expert"])
@pytest.mark.parametrize("pattern,batch", [("random", 0), ("random", 1), ("random", 3), ("skewed", 5),
                                           ("duplicate", 4), ("invalid", 4), ("all_invalid", 2)])
def test_dequantised_forward_on_repacked_weights_matches_reference(pattern, batch, all_experts):
    """The seam's fallback when the kernels raise: on the repacked (interleaved) w13, both its forms (the experts
    some row chose, and every expert with zero weights: the form used while capturing a CUDA graph) against the
    checkpoint-layout reference; duplicate choices count twice, invalid ids add nothing."""
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(batch, pattern)
    x = make_x(batch)
    w13, s13, w2, s2 = experts
    w13r, s13r = repacked(w13, s13)
    out = moe.moe_mxfp4_dequantised_forward(x, w13r, s13r, w2, s2, weights, ids, all_experts=all_experts)
    assert out.shape == (batch, HIDDEN) and out.dtype == torch.bfloat16
    if batch == 0:
        return
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    if pattern == "all_invalid":
        assert torch.equal(out, torch.zeros_like(out))
    else:
        assert torch.isfinite(out).all() and rel(out, ref) < 2e-2


def test_prefill_grouped_gemm_matches_reference():
    inter = 64
    batch = moe.DECODE_MAX_ROWS // TOP_K + 13  # past the decode tiles: 128-row grouped GEMM
    experts = make_experts(inter)
    weights, ids = make_routing(batch, "random")
    ids[:40] = torch.tensor([1, 1, 2, 3, 4, 5], dtype=ids.dtype)  # skew the load
    x = make_x(batch)
    assert moe.gate_up_config(batch * TOP_K, inter).block_m > 16  # grouped-GEMM tiles
    out = run(x, experts, weights, ids)
    assert rel(out, moe.reference_moe_mxfp4(x, *experts, weights, ids)) < 2e-2


def test_mxfp8_activation_variant_and_why_bf16_ships():
    """The QMMA.SF alternative matches its own MXFP8 reference, and is less accurate than bf16."""
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(40, "random")
    x = make_x(40)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    ref_mxfp8 = moe.reference_moe_mxfp8_act(x, *experts, weights, ids)
    out_mxfp8 = run(x, experts, weights, ids, act_mxfp8=True)
    out_bf16 = run(x, experts, weights, ids)
    # the interpreter's fp32->e4m3 cast drops rounding carries, hence the looser bound
    assert rel(out_mxfp8, ref_mxfp8) < 3e-2
    assert rel(out_bf16, ref) < 2e-2
    assert rel(ref_mxfp8, ref) > 3 * rel(out_bf16, ref)


def test_quantize_mxfp8_bounds():
    x = make_x(4, scale=300.0).float()
    q, s = moe.quantize_mxfp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (4, HIDDEN // MXFP4_GROUP)
    deq = (q.float().unflatten(-1, (-1, 32)) * torch.exp2(s.float() - 127).unsqueeze(-1)).flatten(-2)
    assert torch.isfinite(deq).all()
    assert ((deq - x).abs() <= x.abs() * 2 ** -4 + 1e-30).all()


# --- validation -----------------------------------------------------------------------------------
def test_validation_names_the_argument():
    inter = 32
    w13, s13, w2, s2 = make_experts(inter)
    weights, ids = make_routing(2, "random")
    x = make_x(2)
    with pytest.raises(ValueError, match="x must"):
        moe.moe_mxfp4_forward(x.float(), w13, s13, w2, s2, weights, ids)
    with pytest.raises(ValueError, match="w13 must"):
        moe.moe_mxfp4_forward(x, w13[:, :, :-1], s13, w2, s2, weights, ids)
    with pytest.raises(ValueError, match="w2 must"):
        moe.moe_mxfp4_forward(x, w13, s13, w2[:, :-1], s2, weights, ids)
    with pytest.raises(ValueError, match="w2_scale"):
        moe.moe_mxfp4_forward(x, w13, s13, w2, s2.view(torch.uint8)[:, :-1], weights, ids)
    with pytest.raises(ValueError, match="scale must be"):
        moe.moe_mxfp4_forward(x, w13, s13.view(torch.uint8).float(), w2, s2, weights, ids)
    with pytest.raises(ValueError, match="topk_ids"):
        moe.moe_mxfp4_forward(x, w13, s13, w2, s2, weights, ids[:1])
    with pytest.raises(ValueError, match="topk_weights"):
        moe.moe_mxfp4_forward(x, w13, s13, w2, s2, weights[:, :2], ids)
    with pytest.raises(ValueError, match="out must"):
        moe.moe_mxfp4_forward(x, w13, s13, w2, s2, weights, ids, out=torch.empty(2, HIDDEN))
    with pytest.raises(ValueError, match="w13 must"):
        moe.repack_w13_(w13[:, :3], s13)


def test_bad_tiles_and_out_device_are_refused():
    """The tl.dot path's tiles must divide N and K (a tile over N left outputs unwritten, one over K read past the
    rows), and ``out`` must be on x's device."""
    inter = 32
    w13, s13, w2, s2 = make_experts(inter)
    weights, ids = make_routing(3, "random")
    x = make_x(3)
    good = moe.GemmConfig(16, 16, 64, 4, 2)
    for bad in ((moe.GemmConfig(16, 64, 128, 4, 3), good), (moe.GemmConfig(16, 16, 512, 4, 3), good),
                (good, moe.GemmConfig(16, 64, 128, 4, 3)), (good, moe.GemmConfig(16, 512, 32, 4, 3))):
        with pytest.raises(ValueError, match="configs: the (gate/up|down) tile"):
            moe.moe_mxfp4_forward(x, w13, s13, w2, s2, weights, ids, configs=bad, upcast="regs")
    with pytest.raises(ValueError, match="out must"):
        moe.moe_mxfp4_forward(x, w13, s13, w2, s2, weights, ids,
                              out=torch.empty(3, HIDDEN, dtype=torch.bfloat16, device="meta"))


def test_top_k_zero_gives_zeros():
    """No expert per token (top_k = 0): the sum over none, written (the output was once left as it was)."""
    w13, s13, w2, s2 = make_experts(32)
    x = make_x(3)
    out = torch.full_like(x, float("nan"))
    empty_ids, empty_weights = torch.empty(3, 0, dtype=torch.int32), torch.empty(3, 0)
    assert moe.moe_mxfp4_forward(x, w13, s13, w2, s2, empty_weights, empty_ids, out=out) is out
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(moe.moe_mxfp4_forward(x, w13, s13, w2, s2, empty_weights, empty_ids), torch.zeros_like(x))


def test_default_below_the_tma_k_step_takes_the_forms_without_tma():
    """H = 256 at a per-rank I the TMA tables list (512): the TMA forms step K by 512, so the default must not pick
    them (it once raised from inside the GEMV launcher); it runs a form without TMA and matches the reference."""
    assert not moe.tma_tables_usable(make_x(1), *make_experts(512))
    experts = make_experts(512)
    weights, ids = make_routing(1, "random")
    x = make_x(1)
    assert rel(run(x, experts, weights, ids), moe.reference_moe_mxfp4(x, *experts, weights, ids)) < 2e-2


def test_touched_expert_bytes_counts_distinct_valid_experts():
    ids = torch.tensor([[0, 1, 1], [1, -1, 2]])
    per_expert = 2 * 64 * 256 // 2 + 2 * 64 * 256 // 32 + 256 * 64 // 2 + 256 * 64 // 32
    assert moe.touched_expert_bytes(ids, 256, 64, 8) == 3 * per_expert
    assert SWIGLU_LIMIT == 10.0


@pytest.mark.parametrize("pattern", ["random", "skewed", "invalid"])
def test_route_kernel_and_torch_route_agree(monkeypatch, pattern):
    _, ids = make_routing(37, pattern)
    ids[3, 2] = 0
    triton_out = [t.clone() for t in moe.route(ids, NUM_EXPERTS)]
    monkeypatch.setattr(moe, "ROUTE_TRITON_MAX_ROWS", 0)
    torch_out = moe.route(ids, NUM_EXPERTS)
    flat = ids.flatten().long()
    valid = (flat >= 0) & (flat < NUM_EXPERTS)
    num_valid = int(valid.sum())
    n_active = int(torch_out[3])
    assert int(triton_out[3]) == n_active == len(torch.unique(flat[valid]))
    assert torch.equal(triton_out[0][:num_valid], torch_out[0][:num_valid])
    assert torch.equal(triton_out[1], torch_out[1])
    assert torch.equal(triton_out[2][:n_active], torch_out[2][:n_active])
    # stable order: rows of one expert keep their original order
    expected = torch.argsort(torch.where(valid, flat, NUM_EXPERTS), stable=True)[:num_valid]
    assert torch.equal(torch_out[0][:num_valid].long(), expected)


def test_forward_with_torch_route(monkeypatch):
    monkeypatch.setattr(moe, "ROUTE_TRITON_MAX_ROWS", 0)
    experts = make_experts(64)
    weights, ids = make_routing(5, "invalid")
    x = make_x(5)
    assert rel(run(x, experts, weights, ids), moe.reference_moe_mxfp4(x, *experts, weights, ids)) < 2e-2


@pytest.mark.parametrize("inter", INTERS)
def test_every_weight_upcast_matches_reference(inter):
    """tl.dot_scaled, the interleaving register dequantisation and both split-nibble variants agree
    with the reference; an unknown variant is refused."""
    experts = make_experts(inter)
    weights, ids = make_routing(3, "random")
    x = make_x(3)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    for upcast in moe.UPCASTS:
        assert rel(run(x, experts, weights, ids, upcast=upcast), ref) < 2e-2, upcast
    for dot_scaled in (True, False):  # the older switch still selects the first two
        assert rel(run(x, experts, weights, ids, dot_scaled=dot_scaled), ref) < 2e-2
    with pytest.raises(ValueError, match="upcast must be one of"):
        run(x, experts, weights, ids, upcast="lut")


@pytest.mark.parametrize("upcast", ["split_f32", "split_bf16"])
def test_split_nibble_dequant_is_bit_exact(upcast):
    """Every byte (both nibbles, every e2m1 code and sign) under every E8M0 byte 0..255 dequantises
    to exactly upstream's float32 value: 2**-127 for byte 0, inf (NaN for a zero code) for 255."""
    rows = torch.arange(256, dtype=torch.uint8)
    packed = (torch.arange(256, dtype=torch.int64)[None, :] + 37 * rows.long()[:, None]).remainder(256)
    packed = packed.to(torch.uint8).to(DEVICE)  # [256, 256]: each row holds every byte once
    scale = rows[:, None].repeat(1, 512 // MXFP4_GROUP).to(DEVICE)  # row r: E8M0 byte r
    ref = moe.reference_dequant_mxfp4(packed, scale)
    got = moe.dequant_nibbles(packed, scale.view(torch.float8_e8m0fnu), upcast)
    assert torch.equal(got.isnan(), ref.isnan())
    keep = ~ref.isnan()
    assert torch.equal(got[keep], ref[keep])
    assert ref[0].abs().min() == 0 and (ref[0][ref[0] != 0].abs().min() == 2.0 ** -128)  # byte 0 covered
    assert ref[255].isinf().any() and ref[255].isnan().any()  # byte 255 covered
    with pytest.raises(ValueError, match="upcast"):
        moe.dequant_nibbles(packed, scale, "regs")


def test_default_upcast_follows_the_h200_numbers():
    """Where the H200 measured them faster: the (TMA) CUDA-core GEMV at B <= 16 (I = 1024), B <= 3 (I = 2048;
    B <= 16 without TMA) and B <= 8 (I = 512), the pairs decode above it up to B = 256 (I = 2048, 512) / 64
    (I = 1024) -- its TMA-fed swap-AB form at B = 4..64 (I = 2048) -- and at B = 1..64 for I = 256; split_bf16
    for the rest of the decode at I = 2048; the earlier choices elsewhere."""
    full_i = 2048
    for inter, tma in ((full_i, False), (full_i // 2, True), (full_i // 2, False)):
        assert all(moe.default_upcast(b * TOP_K, inter, tma) == "gemv" for b in (1, 3, 7, 8, 12, 16))
        assert moe.default_upcast(16 * TOP_K + 1, inter, tma) == "pairs"
    # the fp16 TMA GEMV at B = 1..32 for I = 2048 / 1024 / 512 (round 16, run 16b); from B = 16 the pairs decode's
    # PAIRS_TMA_ROWS_WHERE tiles at I = 2048 / 512 (run 20b), at I = 2048 from B = 12 (run 21)
    assert all(moe.default_upcast(b * TOP_K, full_i // tp) == ("pairs" if b >= {1: 12, 4: 16}.get(tp, 33) else "gemv")
               for b in range(1, 33) for tp in (1, 2, 4))
    assert moe.default_gemm_upcast(TOP_K, full_i) == "split_bf16"
    # round 21: the TMA pairs decode up to PAIRS_MAX_ROWS (640 tokens) at I = 2048 / 512, the grouped GEMM beyond
    assert moe.PAIRS_MAX_ROWS == 640 * TOP_K
    for rows in (257 * TOP_K, moe.DECODE_MAX_ROWS, moe.DECODE_MAX_ROWS + 1, moe.PAIRS_MAX_ROWS):
        assert moe.default_upcast(rows, full_i) == moe.default_upcast(rows, full_i // 4) == "pairs"
    assert moe.default_upcast(moe.PAIRS_MAX_ROWS + 1, full_i) == "prefill"  # moe_prefill's grouped GEMM
    # without TMA the tl.dot decode up to DECODE_MAX_ROWS, then the grouped GEMM (a3a1cca)
    assert moe.default_upcast(moe.DECODE_MAX_ROWS, full_i, tma=False) == "split_bf16"
    assert moe.default_upcast(moe.DECODE_MAX_ROWS, full_i // 4, tma=False) == "regs"
    assert moe.default_upcast(moe.DECODE_MAX_ROWS + 1, full_i, tma=False) == "prefill"
    assert moe.default_upcast(TOP_K, full_i // 4) == moe.default_upcast(7 * TOP_K, full_i // 4) == "gemv"
    assert moe.default_upcast(9 * TOP_K - 1, full_i // 4) == "gemv"
    assert all(moe.default_upcast(b * TOP_K, full_i) == "pairs" for b in (33, 64, 128, 256))
    assert all(moe.default_upcast(b * TOP_K, full_i // 4) == "pairs" for b in (33, 64, 128, 256))
    assert all(moe.default_upcast(b * TOP_K, full_i // 4, tma=False) == "pairs" for b in (9, 12, 15, 16, 32))
    assert all(moe.default_upcast(b * TOP_K, full_i // 2) == "pairs" for b in (33, 64))
    assert all(moe.default_upcast(b * TOP_K, full_i // 8) == "pairs" for b in (1, 8, 16, 32, 64))
    assert moe.default_upcast(65 * TOP_K, full_i // 2) == "dot_scaled"  # T=2 beyond B=64: not measured
    assert moe.default_upcast(65 * TOP_K, full_i // 8) == "regs"  # T=8 beyond B=64: not measured
    assert set(moe.default_upcast(r, full_i // tp) for r in (TOP_K, 4096) for tp in SUPPORTED_TP) <= set(
        moe.FORWARD_UPCASTS)
    assert all(moe.default_gemm_upcast(r, full_i // tp) in moe.UPCASTS for r in (TOP_K, 4096) for tp in SUPPORTED_TP)


def test_prefill_dispatch():
    """Above DECODE_MAX_ROWS the default forward takes kernels/moe_prefill.py's grouped GEMM where the H200 measured
    it faster (moe_prefill.PREFILL_DEFAULT_WHERE); upcast='prefill' selects it at any size, bit-identical to calling
    it directly, and it refuses the GEMM path's arguments."""
    for where_inter, rows in moe_prefill.PREFILL_DEFAULT_WHERE:
        assert moe.default_upcast(rows, where_inter, tma=False) == moe.PREFILL
        assert moe.default_upcast(rows - 1, where_inter, tma=False) != moe.PREFILL
        # round 21: where the TMA pairs decode's table reaches past DECODE_MAX_ROWS (I = 2048 / 512), it hands over
        # to the grouped GEMM after PAIRS_MAX_ROWS
        first = moe.PAIRS_MAX_ROWS + 1 if moe.pairs_rows_tiles(rows, where_inter) else rows
        assert moe.default_upcast(first, where_inter) == moe.PREFILL
        assert moe.default_upcast(first - 1, where_inter) != moe.PREFILL
    measured = {where_inter for where_inter, _ in moe_prefill.PREFILL_DEFAULT_WHERE}
    for tp in SUPPORTED_TP:
        inter = MOE_INTERMEDIATE_SIZE // tp
        assert (moe.default_upcast(4096 * TOP_K, inter) == moe.PREFILL) == (inter in measured)
        assert moe.default_upcast(moe.DECODE_MAX_ROWS, inter) != moe.PREFILL
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(5, "invalid")
    x = make_x(5, scale=4.0)
    out = run(x, experts, weights, ids, upcast=moe.PREFILL)
    direct = moe_prefill.moe_mxfp4_prefill_forward(x, *repacked(*experts[:2]), *experts[2:], weights, ids)
    assert torch.equal(out, direct)
    assert rel(out, moe.reference_moe_mxfp4(x, *experts, weights, ids)) < 2e-2
    for bad in ({"split_k": (2, 2)}, {"act_mxfp8": True}):
        with pytest.raises(ValueError, match="upcast='prefill'"):
            run(x, experts, weights, ids, upcast=moe.PREFILL, **bad)


# --- split-K decode --------------------------------------------------------------------------------
def test_split_k_clamp_tickets_and_scratch():
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(3, "duplicate")
    x = make_x(3, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    unclamped = moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0)
    assert rel(unclamped, ref) > 0.1
    with poisoned_scratch():
        for split_k in [(4, 2), (2, 1), (1, 2), "auto"]:
            kw = {"split_k": split_k, "configs": SPLIT_TILES}
            assert rel(run(x, experts, weights, ids, **kw), ref) < 2e-2, split_k
            assert rel(run(x, experts, weights, ids, swiglu_limit=0.0, **kw), unclamped) < 2e-2, split_k
    assert all(int(t.abs().sum()) == 0 for t in moe._TICKETS.values())  # tickets left zeroed


def test_split_k_rejects_bad_splits():
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(1, "random")
    x = make_x(1)
    for bad in [(3, 1), (8, 1), (1, 4), (0, 1), "on", (2,)]:
        with pytest.raises(ValueError, match="split_k"):
            run(x, experts, weights, ids, split_k=bad, configs=SPLIT_TILES)


def test_split_k_choice_and_default_follow_shapes_and_the_h200_numbers():
    full_i = moe.MOE_INTERMEDIATE_SIZE
    hidden = 4096
    # fewer programs than SPLIT_K_TARGET_WAVES per SM -> split, never past the K loop or SPLIT_K_MAX
    gu, dn = moe.split_k_choice(TOP_K, hidden, full_i // 4, 132)
    assert gu > 1 and dn > 1 and gu <= moe.SPLIT_K_MAX and dn <= full_i // 4 // moe.down_config(TOP_K, full_i // 4).block_k
    assert moe.split_k_choice(64 * TOP_K, hidden, full_i, 132) == (1, 1)
    assert moe.split_k_choice(moe.DECODE_MAX_ROWS + 1, hidden, full_i, 132) == (1, 1)
    assert moe.split_k_choice(TOP_K, hidden, full_i, 10_000) == (moe.SPLIT_K_MAX, moe.SPLIT_K_MAX)
    # default: only where the H200 run measured split-K faster
    assert moe.default_split_k(TOP_K, full_i // 4) == "off"  # regs split tile spilled on sm_120a
    assert moe.split_k_upcast("regs") == "split_f32" and moe.split_k_upcast("split_bf16") == "split_bf16"
    assert moe.default_split_k(8 * TOP_K, full_i) == moe.SPLIT_K_DEFAULT_SPLITS
    assert moe.default_split_k(64 * TOP_K, full_i) == moe.SPLIT_K_DEFAULT_SPLITS
    assert moe.default_split_k(TOP_K, full_i) == "off"
    assert moe.default_split_k(8 * TOP_K, full_i // 4) == "off"
    assert moe.default_split_k(256 * TOP_K, full_i) == "off"
    assert moe.default_split_k(TOP_K, full_i // 8) == "off"


# --- CUDA-core GEMV decode -------------------------------------------------------------------------
# GEMV forms: (gate/up block_k, GemvConfig options); block_k 64 gives the prefetch two K steps per split
GEMV_FORMS = {
    "one_row": (128, {}),
    "two_rows": (128, {"two_rows": True}),
    "prefetch": (64, {"prefetch": True}),
    "split_k": (128, {"split_k": 2}),
    "split_k_two_rows_prefetch": (64, {"split_k": 2, "two_rows": True, "prefetch": True}),
    "x_f32": (128, {"x_f32": True}),
    "x_f32_two_rows": (128, {"x_f32": True, "two_rows": True}),
    "x_f32_split_k_prefetch": (64, {"x_f32": True, "split_k": 2, "prefetch": True}),
}


@pytest.mark.parametrize("form", sorted(GEMV_FORMS))
def test_gemv_forms_clamp_and_poisoned_scratch(form):
    """One- and two-row passes (odd and even row counts per expert), register prefetch and K splits
    (gate/up partials + ticket, down partial outputs), the clamp on and off, with every scratch tensor
    NaN-poisoned: each activation, partial and output row the GEMV reads must be written first."""
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(5, "duplicate")  # 5 rows of the token's expert + 1 of the next: odd and even counts
    x = make_x(5, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    unclamped = moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0)
    assert rel(unclamped, ref) > 0.1
    gu_k, opts = GEMV_FORMS[form]
    cfgs = (moe.GemvConfig(inter, gu_k, 4, **opts), moe.GemvConfig(HIDDEN, 32, 2, **opts))
    with poisoned_scratch():
        assert rel(run(x, experts, weights, ids, upcast="gemv", configs=cfgs), ref) < 2e-2
        assert rel(run(x, experts, weights, ids, upcast="gemv", configs=cfgs, swiglu_limit=0.0), unclamped) < 2e-2
    if opts.get("split_k", 1) > 1:  # the last split of every (slot, n block) put its ticket back
        assert int(moe._tickets(x.device, 1).count_nonzero()) == 0


# TMA GEMV (tma_ring): K steps of 512 (a row's scale bytes of a step are TMA's 16-byte minimum), so H = I = 512
TMA_HIDDEN = 512


@pytest.mark.parametrize("ring,batch,pattern", [(ring, batch, pattern) for ring in (1, 3)
                                                for batch, pattern in ((0, "random"), (1, "random"), (3, "duplicate"),
                                                                       (64, "skewed"))
                                                if batch < 64 or ring == 3])  # B = 64: ~60 s under the interpreter
def test_gemv_tma_ring(ring, batch, pattern):
    """Weights, scales and activations fetched by TMA descriptors (one and three stages) against the
    reference with the clamp active and every scratch tensor NaN-poisoned; bit-identical to the plain
    GEMV at the same tiles (the same products in the same order)."""
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=batch + 11)
    weights, ids = make_routing(batch, pattern)
    x = make_x(batch, hidden=TMA_HIDDEN, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    if batch:
        assert rel(moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0), ref) > 0.1
    # two column blocks per expert; at B = 64 whole-expert blocks (interpreter time grows with programs x rows)
    gu_n, dn_n = (inter // 2, TMA_HIDDEN // 2) if batch < 64 else (inter, TMA_HIDDEN)
    cfgs = (moe.GemvConfig(gu_n, 512, 4, tma_ring=ring), moe.GemvConfig(dn_n, 512, 4, tma_ring=ring))
    with poisoned_scratch():
        out = run(x, experts, weights, ids, upcast="gemv", configs=cfgs)
    assert torch.isfinite(out).all() and rel(out, ref) < 2e-2
    plain = run(x, experts, weights, ids, upcast="gemv",
                configs=(moe.GemvConfig(gu_n, 512, 4), moe.GemvConfig(dn_n, 512, 4)))
    assert torch.equal(out, plain)


@pytest.mark.parametrize("per_sm,batch,pattern,seed,launches", [
    (1, 0, "random", 0, "both"), (1, 1, "random", 1, "both"), (2, 3, "duplicate", 2, "both"), (1, 3, "skewed", 3, "both"),
    (1, 4, "invalid", 4, "both"), (2, 1, "random", 6, "down"), (1, 3, "duplicate", 7, "down"),
    (2, 4, "invalid", 8, "gate_up")])
def test_gemv_tma_persistent(monkeypatch, per_sm, batch, pattern, seed, launches):
    """The persistent TMA GEMV (programs looping over (routed row, column block) work items) on a grid of
    5 x per_sm programs, so most programs take several items and the item count is no multiple of the grid,
    in both launches or one: against the reference with the clamp active and every scratch tensor NaN-poisoned,
    and bit-identical to the one-program-per-block TMA GEMV at the same tiles (the same products in the same
    order)."""
    monkeypatch.setattr(moe, "CPU_SM_COUNT", 5)
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=seed + 40)
    weights, ids = make_routing(batch, pattern, seed=seed + 50)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=seed + 60, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    if batch:
        assert rel(moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0), ref) > 0.1
        items = batch * TOP_K * 2  # two column blocks per launch
        assert items % (5 * per_sm) and items > 5 * per_sm
    gu_n, dn_n = inter // 2, TMA_HIDDEN // 2
    gu_per_sm, dn_per_sm = (per_sm if launches in (kind, "both") else 0 for kind in ("gate_up", "down"))
    cfgs = (moe.GemvConfig(gu_n, 512, 4, tma_ring=3, persistent_programs_per_sm=gu_per_sm),
            moe.GemvConfig(dn_n, 512, 4, tma_ring=3, persistent_programs_per_sm=dn_per_sm))
    with poisoned_scratch():
        out = run(x, experts, weights, ids, upcast="gemv", configs=cfgs)
    assert torch.isfinite(out).all() and (rel(out, ref) < 2e-2 if batch else out.numel() == 0)
    per_block = run(x, experts, weights, ids, upcast="gemv",
                    configs=(moe.GemvConfig(gu_n, 512, 4, tma_ring=3), moe.GemvConfig(dn_n, 512, 4, tma_ring=3)))
    assert torch.equal(out, per_block)


# fp16 pair decode of the TMA GEMV (GemvConfig.f16): packed fp16 FMAs on the weight words, activations as scaled fp16
@pytest.mark.parametrize("batch,pattern,persistent_down,x_scale,seed", [
    (0, "random", 0, 4.0, 0), (1, "random", 0, 4.0, 1), (3, "duplicate", 0, 4.0, 2), (3, "random", 1, 4.0, 3),
    (2, "invalid", 1, 4.0, 4), (1, "random", 0, 3.0e5, 5), (3, "duplicate", 0, 1.0e-3, 6)])
def test_gemv_tma_f16(monkeypatch, batch, pattern, persistent_down, x_scale, seed):
    """The fp16 pair decode (one and several programs per weight block, the down launch persistent or not) against
    the reference with the clamp active (x at 4: most gate values beyond the limit) and every scratch tensor
    NaN-poisoned; x at 3e5 (beyond fp16's 65504: each row's power of two brings it below 2**15) and at 1e-3 (fp16
    subnormals without it): within the bf16 TMA decode's error plus fp16's (2**-11 per sum of 4 products)."""
    monkeypatch.setattr(moe, "CPU_SM_COUNT", 5)
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=seed + 70)
    weights, ids = make_routing(batch, pattern, seed=seed + 80)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=seed + 90, scale=x_scale)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    if batch and x_scale > 1:
        assert rel(moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0), ref) > 0.1
    gu_n, dn_n = inter // 2, TMA_HIDDEN // 2
    bf16 = (moe.GemvConfig(gu_n, 512, 4, tma_ring=3),
            moe.GemvConfig(dn_n, 512, 4, tma_ring=3, persistent_programs_per_sm=persistent_down))
    f16 = tuple(dataclasses.replace(c, f16=True) for c in bf16)
    with poisoned_scratch():
        out = run(x, experts, weights, ids, upcast="gemv", configs=f16)
    if not batch:
        assert out.numel() == 0
        return
    bf16_err = rel(run(x, experts, weights, ids, upcast="gemv", configs=bf16), ref)
    f16_err = rel(out, ref)
    assert torch.isfinite(out).all() and f16_err < bf16_err + 4e-3 and f16_err < 2e-2
    assert not torch.equal(out, run(x, experts, weights, ids, upcast="gemv", configs=bf16))  # the fp16 path ran


@triton.jit
def _byte_pairs_probe(q_ptr, out_ptr, N: tl.constexpr, EMULATE: tl.constexpr):
    k = tl.arange(0, N)
    w0, w1, w2, w3 = moe._e2m1_f16_byte_pairs(tl.load(q_ptr + k), EMULATE)
    tl.store(out_ptr + 4 * k, w0)
    tl.store(out_ptr + 4 * k + 1, w1)
    tl.store(out_ptr + 4 * k + 2, w2)
    tl.store(out_ptr + 4 * k + 3, w3)


def _e2m1_value(nibble: int) -> float:
    magnitude = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)[nibble & 7]
    return -magnitude if nibble & 8 else magnitude


def test_e2m1_f16_byte_pairs_every_nibble_in_every_place():
    """The fp16 decode's pair words (under the interpreter its shift-and-mask twin, on a GPU the inline PTX) against fp16
    bits built from the e2m1 values: pair j of a word holds values (0, 2), (4, 6), (1, 3), (5, 7) times 2**-14 as
    (low, high) halves, for words that put each of the 16 codes in each of the 8 places (signed zero included), and
    random words; the activation order puts the matching values in pair j."""
    device = "cpu" if interpreter_enabled() else "cuda"
    codes = [sum(((c + 3 * place) % 16) << (4 * place) for place in range(8)) for c in range(16)]
    words = torch.tensor(codes, dtype=torch.int64)
    words = torch.cat([words, torch.randint(0, 2 ** 32, (48,), generator=torch.Generator().manual_seed(3))])
    q = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    out = torch.empty(q.numel() * 4, dtype=torch.int32, device=device)
    _byte_pairs_probe[(1,)](q.to(device), out, N=q.numel(), EMULATE=interpreter_enabled())
    got = out.view(-1, 4).cpu()
    places = ((0, 2), (4, 6), (1, 3), (5, 7))
    for i, word in enumerate(words.tolist()):
        for j, (lo, hi) in enumerate(places):
            halves = torch.tensor([_e2m1_value((word >> (4 * lo)) & 15), _e2m1_value((word >> (4 * hi)) & 15)],
                                  dtype=torch.float32) * 2.0 ** -14
            expected = halves.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
            assert int(got[i, j]) & 0xFFFF == int(expected[0]) and (int(got[i, j]) >> 16) & 0xFFFF == int(expected[1])
    # the activation order: value k of a word sits at slot 2j (low) or 2j + 1 (high) of its pair j
    slots = [2 * j + h for k in range(8) for j, pair in enumerate(places) for h, v in enumerate(pair) if v == k]
    assert slots == [(k % 2) * 4 + k // 2 for k in range(8)]


# runs 17 / 17b: per-rank I -> (the B with the PDL forward, whether its down launch prefetches its weights into L2)
PDL_DEFAULT_AT = {2048: ((1, 2, 3, 4), False), 1024: (tuple(range(1, 9)), True), 512: ((*range(1, 15), 16), True)}


def test_gemv_f16_default_follows_the_h200_numbers():
    """Runs 16 / 16b: the fp16 TMA GEMV is the default at B = 1..32 for I = 2048 / 1024 / 512 (T = 1 / 2 / 4) where
    the operands allow TMA: on twice the rows per program (gate/up 16 columns, down 32 rows), on 4x rows (32 / 64)
    at T=2 B=2 and T=4 B=16, at T=1 B=1 the 4x gate/up tile with the 2x down tile (run 28c), the down launch
    persistent (P = 8) at T=4; not at B > 32 (B = 64 slower), not at T = 8 (K = 256 < 512), not between multiples of
    top_k; early_tables at T=1 B=1 and T=2 B=2 (round 29); at T=1 B=1 the down launch's first K step before its wait
    with a 2-stage ring (round 32); every shipped tile in the AOT registry with HFMA2."""
    f16 = dict(tma_ring=3, f16=True)
    rows2 = (moe.GemvConfig(16, 512, 4, **f16), moe.GemvConfig(32, 512, 4, **f16))
    rows4 = (moe.GemvConfig(32, 512, 4, **f16), moe.GemvConfig(64, 512, 4, **f16))
    four = {(2048, 1), (1024, 2), (512, 16)}
    names = {c.name: c for c in moe.aot_configs()}
    assert "moe_mxfp4_route_x_f16" in names and "moe_mxfp4_route_x_f16_r256" in names  # BLOCK_ROWS 128 / 256
    for name in ("moe_mxfp4_route_x_f16_pdl", "moe_mxfp4_topk_sum_pdl", "moe_mxfp4_topk_sum_pdl_et"):  # other launches
        assert names[name].constexprs["PDL"] and set(moe.PDL_OPCODES) <= set(names[name].expect_opcodes)
    for inter in (2048, 1024, 512):
        for batch in (1, 2, 3, 7, 9, 16, 17, 31, 32):
            rows = batch * TOP_K
            gu, dn = rows4 if (inter, batch) in four else rows2
            if (inter, batch) == (2048, 1):  # run 28c
                dn = rows2[1]
            if inter == 512:
                dn = dataclasses.replace(dn, persistent_programs_per_sm=8)
            if batch in PDL_DEFAULT_AT[inter][0]:  # run 17
                gu = dataclasses.replace(gu, pdl=True)
                dn = dataclasses.replace(dn, pdl=True, pdl_l2=PDL_DEFAULT_AT[inter][1])
            if (inter, batch) in ((2048, 1), (1024, 2)):  # round 29
                gu, dn = (dataclasses.replace(c, early_tables=True) for c in (gu, dn))
            if (inter, batch) == (2048, 1):  # round 32: the down's first K step before its wait, a 2-stage ring
                dn = dataclasses.replace(dn, w0_early="tma", tma_ring=2)
            assert moe.gemv_configs(rows, inter) == (gu, dn)
            assert moe.default_upcast(rows, inter) == ("pairs" if inter != 1024 and batch >= 16 else "gemv")  # run 20b
            assert not moe.gemv_configs(rows, inter, tma=False)[0].f16
            assert not moe.gemv_configs(rows, inter, f16=False)[0].f16
            for kind, cfg in (("gate_up", gu), ("down", dn)):
                assert "HFMA2" in names[f"moe_mxfp4_{kind}_gemvtma_{cfg.label()}"].expect_opcodes
    for inter, batch in ((2048, 33), (2048, 64), (1024, 64), (512, 33), (512, 64), (256, 1), (256, 8)):
        assert not moe.gemv_f16_default(batch * TOP_K, inter)
        assert not moe.gemv_configs(batch * TOP_K, inter)[0].f16
    assert not moe.gemv_f16_default(TOP_K + 1, 2048)
    assert moe.default_upcast(64 * TOP_K, 2048) == "pairs"


@pytest.mark.parametrize("limit", [0.0, -1.0, 200.0])
def test_gemv_tma_f16_runs_the_bf16_decode_where_the_clamp_does_not_bound(limit):
    """No clamp (limit <= 0) or one too wide for fp16 SwiGLU rows (L * L > 2**15): the f16 configs run the bf16
    decode, bit for bit."""
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN, seed=5)
    weights, ids = make_routing(2, "random", seed=6)
    x = make_x(2, hidden=TMA_HIDDEN, seed=7)
    bf16 = (moe.GemvConfig(TMA_HIDDEN // 2, 512, 4, tma_ring=3), moe.GemvConfig(TMA_HIDDEN // 2, 512, 4, tma_ring=3))
    f16 = tuple(dataclasses.replace(c, f16=True) for c in bf16)
    out = run(x, experts, weights, ids, upcast="gemv", configs=f16, swiglu_limit=limit)
    assert torch.equal(out, run(x, experts, weights, ids, upcast="gemv", configs=bf16, swiglu_limit=limit))


@pytest.mark.parametrize("limit,shift", [(SWIGLU_LIMIT, 8), (1.0, 15), (0.25, 17), (181.0, 0), (1e-30, 100),
                                         (182.0, None), (0.0, None), (float("nan"), None)])
def test_f16_act_shift_keeps_the_clamped_swiglu_below_2_to_15(limit, shift):
    assert moe.f16_act_shift(limit) == shift
    if shift is not None and shift < 100:  # the largest such shift: one more would pass 2**15
        bound = limit * max(limit, 1.0)
        assert bound * 2.0 ** shift <= 2.0 ** 15 < bound * 2.0 ** (shift + 1)


def _gemv_tiles_refused(gu, dn, match):
    """The GEMV forward on tiles ``gu`` / ``dn`` (GemvConfig keyword dicts) raises a ValueError matching ``match``."""
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(1, "random")
    with pytest.raises(ValueError, match=match):
        run(make_x(1, hidden=TMA_HIDDEN), experts, weights, ids, upcast="gemv",
            configs=(moe.GemvConfig(**gu), moe.GemvConfig(**dn)))


@pytest.mark.parametrize("bad", ["no_tma", "mixed", "persistent_gate_up"])
def test_gemv_tma_f16_arguments(bad):
    gu = dict(block_n=64, block_k=512, num_warps=4, tma_ring=2, f16=True)
    dn = dict(gu)
    if bad == "no_tma":
        gu["tma_ring"] = dn["tma_ring"] = 0
    elif bad == "mixed":
        dn["f16"] = False
    else:
        gu["persistent_programs_per_sm"] = 2
    _gemv_tiles_refused(gu, dn, "f16")

# programmatic dependent launch of the fp16 TMA GEMV forward (GemvConfig.pdl, run 17)
def _f16_tiles(persistent_down, **pdl):
    down_pdl = dict(pdl)
    gate_up_pdl = {k: v for k, v in pdl.items() if k != "pdl_l2"}
    return (moe.GemvConfig(TMA_HIDDEN // 2, 512, 4, tma_ring=3, f16=True, **gate_up_pdl),
            moe.GemvConfig(TMA_HIDDEN // 2, 512, 4, tma_ring=3, f16=True, persistent_programs_per_sm=persistent_down,
                           **down_pdl))


@pytest.mark.parametrize("batch,pattern,persistent_down,late,l2", [
    (1, "random", 0, False, True), (3, "duplicate", 0, True, True), (3, "random", 1, False, True),
    (2, "invalid", 1, True, False), (0, "random", 0, False, True)])
def test_gemv_tma_f16_pdl_forward(monkeypatch, batch, pattern, persistent_down, late, l2):
    """The PDL configs reorder each program (the wait first, the down launch's routing reads and prefetch before it):
    without griddepcontrol (here the interpreter) they compute the same bits as the fp16 forward without PDL, every
    scratch tensor NaN-poisoned, one and several programs per weight block, invalid ids included."""
    monkeypatch.setattr(moe, "CPU_SM_COUNT", 5)
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN, seed=batch + 40)
    weights, ids = make_routing(batch, pattern, seed=batch + 41)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=batch + 42, scale=4.0)
    with poisoned_scratch():
        out = run(x, experts, weights, ids, configs=_f16_tiles(persistent_down, pdl=True, pdl_late=late, pdl_l2=l2))
    if not batch:
        assert out.numel() == 0
        return
    assert torch.equal(out, run(x, experts, weights, ids, configs=_f16_tiles(persistent_down)))
    assert rel(out, moe.reference_moe_mxfp4(x, *experts, weights, ids)) < 2e-2


@pytest.mark.parametrize("batch,pattern,persistent_down,pdl", [
    (1, "random", 0, True), (1, "random", 0, False), (3, "duplicate", 0, True), (2, "invalid", 0, True),
    (3, "random", 1, True), (0, "random", 0, True)])
def test_gemv_tma_f16_early_tables(monkeypatch, batch, pattern, persistent_down, pdl):
    """GemvConfig.early_tables reorders loads only (the slot's routing in fewer round trips, the down launch's before
    its wait, the top-k sum's rows with its ids): the same bits as the forward without it, every scratch tensor
    NaN-poisoned (so a stale slot past the active count, or an invalid id's unwritten row, shows), duplicate and
    invalid ids, one and several programs per weight block, the persistent down launch (which keeps its own order)."""
    monkeypatch.setattr(moe, "CPU_SM_COUNT", 5)
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN, seed=batch + 50)
    weights, ids = make_routing(batch, pattern, seed=batch + 51)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=batch + 52, scale=4.0)
    tiles = _f16_tiles(persistent_down, pdl=pdl)
    early = tuple(dataclasses.replace(c, early_tables=True) for c in tiles)
    assert all("et" in c.label() for c in early)
    _same_bits_in_poisoned_scratch(x, experts, weights, ids, early, tiles)


def _same_bits_in_poisoned_scratch(x, experts, weights, ids, configs, baseline):
    """The forward on ``configs`` with its scratch poisoned (NaN floats, integers at 2**30: a stale slot's expert far
    out of range) gives exactly the forward on ``baseline`` (scratch NaN-poisoned), within 2e-2 of the reference;
    at B=0 an empty output."""
    with poisoned_scratch(int_value=2**30):
        out = run(x, experts, weights, ids, configs=configs)
    if not x.shape[0]:
        assert out.numel() == 0
        return
    with poisoned_scratch():
        assert torch.equal(out, run(x, experts, weights, ids, configs=baseline))
    assert rel(out, moe.reference_moe_mxfp4(x, *experts, weights, ids)) < 2e-2


@pytest.mark.parametrize("batch,pattern,inter,pdl,form", [
    (1, "random", TMA_HIDDEN, True, "tma"), (1, "random", 2 * TMA_HIDDEN, True, "tma"),
    (1, "random", 2 * TMA_HIDDEN, True, "plain"), (3, "duplicate", 2 * TMA_HIDDEN, True, "tma"),
    (3, "duplicate", 2 * TMA_HIDDEN, True, "plain"), (2, "invalid", 2 * TMA_HIDDEN, False, "tma"),
    (0, "random", TMA_HIDDEN, True, "tma")])
def test_gemv_tma_f16_w0_early(monkeypatch, batch, pattern, inter, pdl, form):
    """GemvConfig.w0_early loads the down launch's first K step before its wait and uses it for the slot's first
    routed row (later rows of the slot load it again), by TMA or per-thread loads: the same bits as early_tables alone,
    scratch NaN-poisoned and a stale slot's expert far out of range, one K step (the whole K early) and two, duplicate
    and invalid ids."""
    monkeypatch.setattr(moe, "CPU_SM_COUNT", 5)
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=batch + 60)
    weights, ids = make_routing(batch, pattern, seed=batch + 61)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=batch + 62, scale=4.0)
    early = tuple(dataclasses.replace(c, early_tables=True) for c in _f16_tiles(0, pdl=pdl))
    w0 = (early[0], dataclasses.replace(early[1], w0_early=form))
    assert f"w0{form[0]}" in w0[1].label()
    _same_bits_in_poisoned_scratch(x, experts, weights, ids, w0, early)


@pytest.mark.parametrize("bad", ["gate_up", "no_early_tables", "persistent", "unknown_form"])
def test_gemv_w0_early_arguments(bad):
    gu = dict(block_n=64, block_k=512, num_warps=4, tma_ring=2, f16=True, early_tables=True)
    dn = dict(gu, w0_early="tma")
    if bad == "gate_up":
        gu["w0_early"] = "tma"
    elif bad == "unknown_form":
        dn["w0_early"] = "ldg"
    elif bad == "no_early_tables":
        gu["early_tables"] = dn["early_tables"] = False
    else:
        dn["persistent_programs_per_sm"] = 2
    _gemv_tiles_refused(gu, dn, "w0_early")


def test_gemv_w0_early_reaches_the_down_launch(monkeypatch):
    launches = _record_f16_launches(monkeypatch)
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(2, "random")
    for form in ("tma", "plain", ""):
        launches.clear()
        gu, dn = (dataclasses.replace(c, early_tables=True) for c in _f16_tiles(0, pdl=True))
        run(make_x(2, hidden=TMA_HIDDEN), experts, weights, ids, configs=(gu, dataclasses.replace(dn, w0_early=form)))
        assert [(kw["W0_EARLY"], kw["W0_PLAIN"]) for name, kw in launches if name == "_down_gemv_tma_f16_kernel"] == [
            (bool(form), form == "plain")]


def test_gemv_max_registers_reaches_its_launch(monkeypatch):
    """GemvConfig.max_registers (a control in the round-32 runs): the launch's maxnreg, that launch only."""
    launches = _record_f16_launches(monkeypatch)
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(1, "random")
    gu, dn = _f16_tiles(0)
    run(make_x(1, hidden=TMA_HIDDEN), experts, weights, ids, configs=(gu, dataclasses.replace(dn, max_registers=80)))
    assert [kw.get("maxnreg") for _, kw in launches] == [None, None, 80, None]
    assert dataclasses.replace(dn, max_registers=80).label().endswith("r80")


def test_gemv_early_tables_reach_their_launches(monkeypatch):
    launches = _record_f16_launches(monkeypatch)
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(2, "random")
    for early in (True, False):
        launches.clear()
        tiles = tuple(dataclasses.replace(c, early_tables=early) for c in _f16_tiles(0, pdl=True))
        run(make_x(2, hidden=TMA_HIDDEN), experts, weights, ids, configs=tiles)
        assert {name: kw["EARLY_TABLES"] for name, kw in launches if name != "_route_x_f16_kernel"} == {
            "_gate_up_gemv_tma_f16_kernel": early, "_down_gemv_tma_f16_kernel": early, "_topk_sum_kernel": early}


@pytest.mark.parametrize("bad", ["gate_up_only", "down_only", "no_f16"])
def test_gemv_early_tables_arguments(bad):
    gu = dict(block_n=64, block_k=512, num_warps=4, tma_ring=2, f16=True, early_tables=True)
    dn = dict(gu)
    if bad == "gate_up_only":
        dn["early_tables"] = False
    elif bad == "down_only":
        gu["early_tables"] = False
    else:
        gu["f16"] = dn["f16"] = False
    _gemv_tiles_refused(gu, dn, "early_tables")


class _LaunchRecorder:
    """Stands in for a jitted kernel: records the keyword arguments of each ``kernel[grid](...)`` launch."""

    def __init__(self, name, launches):
        self.name, self.launches = name, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.name, kwargs))


F16_KERNELS = ("_route_x_f16_kernel", "_gate_up_gemv_tma_f16_kernel", "_down_gemv_tma_f16_kernel",
               "_down_gemv_tma_persistent_f16_kernel", "_topk_sum_kernel")


def _record_f16_launches(monkeypatch) -> list:
    """The fp16 GEMV forward's kernels replaced by recorders (5 programs per "SM"): the (name, kwargs) launched."""
    launches = []
    for name in F16_KERNELS:
        monkeypatch.setattr(moe, name, _LaunchRecorder(name, launches))
    monkeypatch.setattr(moe, "CPU_SM_COUNT", 5)
    return launches


@pytest.mark.parametrize("supported", [False, True])
@pytest.mark.parametrize("persistent_down,late,l2", [(0, False, False), (0, False, True), (1, True, True)])
def test_gemv_pdl_reaches_every_launch(monkeypatch, supported, persistent_down, late, l2):
    """Where the device has griddepcontrol, all four launches of a PDL config carry the launch attribute and the
    kernels' PDL / PDL_LATE constexprs (the down launch its L2_PREFETCH); elsewhere, and without pdl, none does."""
    launches = _record_f16_launches(monkeypatch)
    monkeypatch.setattr(moe, "pdl_supported", lambda device: supported)
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(2, "random")
    x = make_x(2, hidden=TMA_HIDDEN)
    for pdl in (True, False):
        launches.clear()
        tiles = _f16_tiles(persistent_down, pdl=True, pdl_late=late, pdl_l2=l2) if pdl else _f16_tiles(persistent_down)
        run(x, experts, weights, ids, configs=tiles)
        down = "_down_gemv_tma_persistent_f16_kernel" if persistent_down else "_down_gemv_tma_f16_kernel"
        assert [name for name, _ in launches] == ["_route_x_f16_kernel", "_gate_up_gemv_tma_f16_kernel", down,
                                                  "_topk_sum_kernel"]
        on = pdl and supported
        for name, kw in launches:
            assert (kw["launch_pdl"], kw["PDL"], kw["PDL_LATE"]) == (on, on, on and late), name
        assert launches[2][1]["L2_PREFETCH"] == (on and l2)


@pytest.mark.parametrize("bad", ["no_f16", "gate_up_only", "late_down_only", "l2_on_gate_up", "l2_without_pdl",
                                 "late_without_pdl"])
def test_gemv_pdl_arguments(bad):
    gu = dict(block_n=64, block_k=512, num_warps=4, tma_ring=2, f16=True, pdl=True)
    dn = dict(gu)
    if bad == "no_f16":
        gu["f16"] = dn["f16"] = False
    elif bad == "gate_up_only":
        dn["pdl"] = False
    elif bad == "late_down_only":
        dn["pdl_late"] = True
    elif bad == "l2_on_gate_up":
        gu["pdl_l2"] = True
    elif bad == "l2_without_pdl":
        gu["pdl"] = dn["pdl"] = False
        dn["pdl_l2"] = True
    else:
        gu["pdl"] = dn["pdl"] = False
        gu["pdl_late"] = dn["pdl_late"] = True
    _gemv_tiles_refused(gu, dn, "pdl")


def test_gemv_pdl_default_follows_the_h200_numbers():
    """Runs 17 / 17b: the fp16 TMA GEMV forward launches with PDL (triggers after the waits) by default at T=1 B <= 4,
    with the down launch's L2 prefetch at T=2 B <= 8 and T=4 B <= 16 but 15 (>= 2 % faster there); not beyond (T=1
    B = 8: 1.9 %) nor at T=4 B = 15 (1.9 %), never the late triggers; every shipped PDL tile in the AOT registry with
    PREEXIT / ACQBULK."""
    names = {c.name: c for c in moe.aot_configs()}
    for inter, (at, l2) in PDL_DEFAULT_AT.items():
        for batch in range(1, moe.F16_MAX_BATCH + 1):
            gu, dn = moe.gemv_configs(batch * TOP_K, inter)
            assert gu.pdl == dn.pdl == (batch in at) and dn.pdl_l2 == (l2 and batch in at)
            assert not (gu.pdl_late or dn.pdl_late or gu.pdl_l2)
            for kind, cfg in (("gate_up", gu), ("down", dn)):
                aot = names[f"moe_mxfp4_{kind}_gemvtma_{cfg.label()}"]
                assert aot.constexprs["PDL"] == cfg.pdl and (set(moe.PDL_OPCODES) <= set(aot.expect_opcodes)) == cfg.pdl
                assert kind == "gate_up" or aot.constexprs["L2_PREFETCH"] == cfg.pdl_l2
    assert [moe.gemv_configs(b * TOP_K, 2048)[0].pdl for b in (4, 5, 8)] == [True, False, False]
    assert [moe.gemv_configs(b * TOP_K, 512)[0].pdl for b in (14, 15, 16, 17)] == [True, False, True, False]


@pytest.mark.parametrize("bad", ["no_tma", "no_tma_down_only", "negative", "negative_gate_up"])
def test_gemv_tma_persistent_arguments(bad):
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(1, "random")
    gu = dict(block_n=64, block_k=512, num_warps=4, tma_ring=2, persistent_programs_per_sm=2)
    dn = dict(gu)
    if bad == "no_tma":
        gu["tma_ring"] = dn["tma_ring"] = 0
    elif bad == "no_tma_down_only":
        gu["tma_ring"] = dn["tma_ring"] = gu["persistent_programs_per_sm"] = 0
    elif bad == "negative":
        gu["persistent_programs_per_sm"] = dn["persistent_programs_per_sm"] = -1
    else:
        gu["persistent_programs_per_sm"] = -1
    with pytest.raises(ValueError, match="persistent_programs_per_sm"):
        run(make_x(1, hidden=TMA_HIDDEN), experts, weights, ids, upcast="gemv",
            configs=(moe.GemvConfig(**gu), moe.GemvConfig(**dn)))


@pytest.mark.parametrize("bad", ["block_k", "two_rows", "split_k", "x_f32", "mixed"])
def test_gemv_tma_ring_arguments(bad):
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(1, "random")
    gu = dict(block_n=64, block_k=512, num_warps=4, tma_ring=2)
    dn = dict(block_n=64, block_k=512, num_warps=4, tma_ring=2)
    if bad == "block_k":
        gu["block_k"] = dn["block_k"] = 256
    elif bad == "mixed":
        dn["tma_ring"] = 0
    else:
        gu[bad] = dn[bad] = 2 if bad == "split_k" else True
    with pytest.raises(ValueError, match="tma_ring"):
        run(make_x(1, hidden=TMA_HIDDEN), experts, weights, ids, upcast="gemv",
            configs=(moe.GemvConfig(**gu), moe.GemvConfig(**dn)))


def test_gemv_launches_alone_and_repeated_give_the_forward():
    """gemv_launches: the four launches in order are the forward; run again (routing re-run into the
    same buffers), they give it again -- what the device tool's per-launch timing relies on."""
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(3, "skewed")
    x = make_x(3)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    w13r, s13r = repacked(*experts[:2])
    out = torch.full_like(x, float("nan"))
    cfgs = (moe.GemvConfig(16, 128, 4, split_k=2), moe.GemvConfig(64, 32, 2, split_k=2))
    launches = moe.gemv_launches(x, w13r, s13r, *experts[2:], weights, ids, out, configs=cfgs)
    assert [name for name, _ in launches] == list(moe.GEMV_LAUNCH_NAMES) and len(launches) == moe.LAUNCHES_PER_FORWARD
    assert_launches_repeat_the_forward(launches, out, ref)
    with pytest.raises(ValueError, match="GEMV tiles"):  # 3 splits do not divide H = 256
        run(x, experts, weights, ids, upcast="gemv", configs=(moe.GemvConfig(16, 64, 4, split_k=3), cfgs[1]))


def extreme_scale_case():
    """Two experts whose gate/up weights hold every byte (both nibbles, all signs and codes) under E8M0 bytes
    from 2**-127 (byte 0) up to 2**20, two tokens routed to both; returns (experts, x, weights, ids, ref) with
    the reference unclamped (the gate/up products span far more than the clamp window)."""
    inter, hidden, batch = 32, 256, 2
    g = torch.Generator().manual_seed(5)
    w13 = (torch.arange(2 * inter * hidden // 2) % 256).to(torch.uint8).reshape(1, 2 * inter, hidden // 2)
    w13 = w13.view(torch.int8).repeat(2, 1, 1)
    s13 = torch.randint(0, 148, (2, 2 * inter, hidden // MXFP4_GROUP), dtype=torch.uint8, generator=g)
    s13[0, :, 0] = 0  # the 2**-127 subnormal scale
    w2 = torch.randint(-128, 128, (2, hidden, inter // 2), dtype=torch.int8, generator=g)
    s2 = torch.randint(118, 124, (2, hidden, inter // MXFP4_GROUP), dtype=torch.uint8, generator=g)
    experts = [t.to(DEVICE) for t in (w13, s13.view(torch.float8_e8m0fnu), w2, s2.view(torch.float8_e8m0fnu))]
    x = make_x(batch, scale=1e-3)
    ids = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32, device=DEVICE)
    weights = torch.ones(batch, 2, device=DEVICE)
    return experts, x, weights, ids, moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0)


@pytest.mark.parametrize("x_f32", [False, True], ids=["bf16_pairs", "x_f32"])
def test_gemv_dequantises_every_code_under_extreme_scales(x_f32):
    """Every byte of the weights (both nibbles, all signs and codes) under E8M0 bytes from 2**-127 up to
    2**20: the GEMV's bit trick and per-group scaling give the reference's products, with the activations
    converted in the loop or (x_f32) once per row into the float32 word-pair order."""
    experts, x, weights, ids, ref = extreme_scale_case()
    out = run(x, experts, weights, ids, upcast="gemv", swiglu_limit=0.0,
              configs=(moe.GemvConfig(16, 256, 4, x_f32=x_f32), moe.GemvConfig(32, 32, 4, x_f32=x_f32)))
    assert torch.isfinite(ref).all() and torch.isfinite(out).all() and rel(out, ref) < 2e-2


def launch_case(inter, batch):
    """Experts of intermediate size ``inter`` and ``batch`` skew-routed tokens for the launch-by-launch tests:
    (experts, weights, ids, x, reference, repacked w13, its scales, a NaN-poisoned output)."""
    experts = make_experts(inter)
    weights, ids = make_routing(batch, "skewed")
    x = make_x(batch)
    w13r, s13r = repacked(*experts[:2])
    return (experts, weights, ids, x, moe.reference_moe_mxfp4(x, *experts, weights, ids), w13r, s13r,
            torch.full_like(x, float("nan")))


def test_gemv_x_f32_layout_and_launches():
    """x_f32: the routing launch writes x * 2**GEMV_ACT_SHIFT in the word-pair order (value 8w + j of each
    32-group at 4j + w, exact), the four launches repeated give the forward again, and mixed layouts
    are refused."""
    inter, batch = 64, 3
    experts, weights, ids, x, ref, w13r, s13r, out = launch_case(inter, batch)
    cfgs = (moe.GemvConfig(16, 128, 4, x_f32=True), moe.GemvConfig(64, 32, 2, x_f32=True))
    launches = moe.gemv_launches(x, w13r, s13r, *experts[2:], weights, ids, out, configs=cfgs)
    assert len(launches) == moe.LAUNCHES_PER_FORWARD
    assert_launches_repeat_the_forward(launches, out, ref)
    k = torch.arange(HIDDEN)
    position = (k // 32) * 32 + (k % 8) * 4 + (k % 32) // 8
    assert sorted(position.tolist()) == list(range(HIDDEN))
    expected = torch.empty(batch, HIDDEN)
    expected[:, position] = x.float().cpu() * 2.0 ** 32
    x_f32 = torch.full((batch, HIDDEN), float("nan"), device=DEVICE)
    unused = torch.empty(1, dtype=torch.int32, device=DEVICE)  # the routing half does not run (ROUTE False)
    moe._route_x_f32_kernel[(triton.cdiv(x.numel(), 128),)](
        ids, 0, unused, unused, unused, unused, x, x_f32, x.numel(), NUM_EXPERTS=NUM_EXPERTS, BLOCK_ROWS=16,
        NUM_BINS=16, BLOCK_X=128, ROUTE=False)
    assert torch.equal(x_f32.cpu(), expected)
    with pytest.raises(ValueError, match="x_f32"):
        run(x, experts, weights, ids, upcast="gemv", configs=(cfgs[0], moe.GemvConfig(64, 32, 2)))


def test_gemv_default_dispatch_and_tensor_core_arguments(monkeypatch):
    """Where GEMV_DEFAULT_WHERE names the shape, the default runs the GEMV; explicit tensor-core
    arguments (GemmConfig tiles, split_k, MXFP8 activations) run the tl.dot path instead."""
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(2, "random")
    x = make_x(2)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    monkeypatch.setattr(moe, "GEMV_DEFAULT_WHERE", ((inter, TOP_K, 2 * TOP_K),))
    calls = []
    real = moe._gemv_forward
    monkeypatch.setattr(moe, "_gemv_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    assert moe.default_upcast(2 * TOP_K, inter) == "gemv"
    assert rel(run(x, experts, weights, ids), ref) < 2e-2 and len(calls) == 1
    assert rel(run(x, experts, weights, ids, configs=SPLIT_TILES), ref) < 2e-2
    assert rel(run(x, experts, weights, ids, split_k="off", configs=SPLIT_TILES), ref) < 2e-2
    assert len(calls) == 1
    with pytest.raises(ValueError, match="gemv"):
        run(x, experts, weights, ids, upcast="gemv", split_k=(2, 1))
    with pytest.raises(ValueError, match="gemv"):
        run(x, experts, weights, ids, upcast="gemv", act_mxfp8=True)
    with pytest.raises(ValueError, match="GemvConfig"):
        run(x, experts, weights, ids, upcast="gemv", configs=SPLIT_TILES)
    with pytest.raises(ValueError, match="GEMV tiles"):
        run(x, experts, weights, ids, upcast="gemv", configs=(moe.GemvConfig(48, 256, 4), moe.GemvConfig(16, 32, 4)))


def test_gemv_tiles_only_where_measured():
    """Round 8b / run 8: the TMA ring at T=1/2 up to B=16 and T=4 up to B=8, run 11: at T=4 its down launch on a
    persistent grid of 8 programs per SM; without TMA (or elsewhere) round 2's halved N tiles at I = 512 with one
    routed row per expert, round 1's tiles otherwise."""
    full_i = 2048
    tma = (moe.GemvConfig(8, 512, 4, tma_ring=3), moe.GemvConfig(16, 512, 4, tma_ring=3))
    tma_persistent_down = (tma[0], moe.GemvConfig(16, 512, 4, tma_ring=3, persistent_programs_per_sm=8))
    plain = (moe.GemvConfig(8, 512, 4), moe.GemvConfig(16, 512, 4))
    for rows in (TOP_K, 8 * TOP_K, 16 * TOP_K):  # f16=False: the bf16 decode's tiles (round 16's fp16 ones aside)
        assert moe.gemv_configs(rows, full_i, f16=False) == tma == moe.gemv_configs(rows, full_i // 2, f16=False)
    assert moe.gemv_configs(3 * TOP_K, full_i, f16=False) == moe.gemv_configs(16 * TOP_K, full_i, f16=False) == tma
    for rows in (TOP_K, 3 * TOP_K, 8 * TOP_K):
        assert moe.gemv_configs(rows, full_i // 4, f16=False) == tma_persistent_down
    assert moe.gemv_configs(3 * TOP_K, full_i // 4, f16=False) == tma_persistent_down
    assert moe.gemv_configs(8 * TOP_K + 1, full_i // 4) == plain
    assert not moe.gemv_configs(TOP_K, full_i // 8)[0].tma_ring  # K = 256 < 512 at T=8
    assert moe.gemv_configs(TOP_K, full_i // 4, tma=False) == (moe.GemvConfig(4, 512, 4, x_f32=True),
                                                                moe.GemvConfig(8, 512, 4, x_f32=True))  # round 3
    assert moe.gemv_configs(TOP_K + 1, full_i // 4, tma=False) == plain
    assert moe.gemv_configs(TOP_K, full_i, tma=False) == plain
    # the decode form per batch: the GEMV wherever its TMA form won, the pairs decode above
    # (at I = 2048 the TMA-fed swap-AB pairs decode takes B = 4..16 from the TMA GEMV: round 15's test)
    assert moe.default_upcast(16 * TOP_K, full_i, tma=False) == "gemv"
    assert moe.default_upcast(16 * TOP_K + 1, full_i, tma=False) == "pairs"
    assert moe.default_upcast(8 * TOP_K, full_i // 4, tma=False) == "gemv"
    assert moe.default_upcast(9 * TOP_K, full_i // 4, tma=False) == "pairs"
    assert moe.default_upcast(16 * TOP_K, full_i // 2) == "gemv"
    assert moe.default_upcast(16 * TOP_K + 1, full_i // 2) == "pairs"
    assert moe.default_upcast(TOP_K, full_i // 8) == "pairs"


def test_gemv_tma_needs_16_byte_aligned_operands():
    base = torch.zeros(64, dtype=torch.uint8, device=DEVICE)
    assert moe.gemv_tma_usable(base[:32], base[16:48])  # on the CPU only under the interpreter, as here
    assert not moe.gemv_tma_usable(base[:32], base[8:40])


@pytest.mark.parametrize("aligned,persistent_down,f16", [(True, False, False), (True, True, False),
                                                       (False, True, False), (True, True, True), (False, True, True)])
def test_gemv_default_takes_tma_where_listed(monkeypatch, aligned, persistent_down, f16):
    """The default forward runs the TMA kernels where GEMV_TMA_WHERE lists the shape and the operands
    allow TMA (the down launch on the persistent grid where GEMV_TMA_PERSISTENT_DOWN_WHERE lists it; the fp16 pair
    decode's kernels where GEMV_TMA_F16_WHERE lists it), the plain GEMV kernels otherwise; each matches the
    reference."""
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=5)
    weights, ids = make_routing(1, "random")
    x = make_x(1, hidden=TMA_HIDDEN, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    monkeypatch.setattr(moe, "GEMV_TMA_WHERE", ((inter, TOP_K),))
    monkeypatch.setattr(moe, "GEMV_DEFAULT_WHERE", ((inter, TOP_K, TOP_K),))
    monkeypatch.setattr(moe, "PAIRS_DEFAULT_WHERE", ())
    monkeypatch.setattr(moe, "GEMV_TMA_PERSISTENT_DOWN_WHERE", ((inter, TOP_K, 8),) if persistent_down else ())
    f16_tiles = (moe.GemvConfig(inter // 2, 512, 4, tma_ring=3, f16=True),
                 moe.GemvConfig(TMA_HIDDEN // 2, 512, 4, tma_ring=3, f16=True, persistent_programs_per_sm=8))
    monkeypatch.setattr(moe, "GEMV_TMA_F16_WHERE", {(inter, TOP_K): f16_tiles} if f16 else {})
    if not aligned:
        monkeypatch.setattr(moe, "gemv_tma_usable", lambda *tensors: False)
    launched = []
    for name in ("_gate_up_gemv_tma_kernel", "_down_gemv_tma_kernel", "_down_gemv_tma_persistent_kernel",
                 "_gate_up_gemv_kernel", "_down_gemv_kernel", "_gate_up_gemv_tma_f16_kernel",
                 "_down_gemv_tma_persistent_f16_kernel"):
        kernel = getattr(moe, name)
        monkeypatch.setattr(moe, name, _LaunchSpy(kernel, name, launched))
    with poisoned_scratch():
        out = run(x, experts, weights, ids)
    assert rel(out, ref) < 2e-2
    tma = ["_gate_up_gemv_tma_kernel", "_down_gemv_tma_persistent_kernel" if persistent_down else "_down_gemv_tma_kernel"]
    if f16:
        tma = ["_gate_up_gemv_tma_f16_kernel", "_down_gemv_tma_persistent_f16_kernel"]
    assert launched == (tma if aligned else ["_gate_up_gemv_kernel", "_down_gemv_kernel"])


class _LaunchSpy:
    """Stands in for a Triton kernel: records the name of each launch, then launches the kernel."""

    def __init__(self, kernel, name, launched):
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return self.kernel[grid]


def test_gemv_aot_configs_forbid_tensor_cores():
    gemv = [c for c in moe.aot_configs() if "_gemv_" in c.name]
    # default tiles (one row per pass) and their two-row form at every per-rank I
    assert {c.constexprs["TWO_ROWS"] for c in gemv} == {False, True}
    for tp in SUPPORTED_TP:
        gu, dn = moe.gemv_configs(TOP_K, 2048 // tp, tma=False)
        assert any(c.kernel is moe._gate_up_gemv_kernel and c.constexprs["BLOCK_N"] == gu.block_n for c in gemv)
        assert any(c.kernel is moe._down_gemv_kernel and c.constexprs["BLOCK_N"] == dn.block_n for c in gemv)
        assert any(c.kernel is moe._down_gemv_kernel and c.constexprs["BLOCK_K"] == min(dn.block_k, 2048 // tp)
                   for c in gemv)
    assert all("HMMA" in c.forbid_opcodes and "QMMA" in c.forbid_opcodes and not c.expect_opcodes for c in gemv)
    # the x_f32 default (T=4, B=1) compiles with float32 activation pointers, beside its routing launch
    x_f32 = [c for c in gemv if c.constexprs["X_F32"]]
    gu, dn = moe.gemv_configs(TOP_K, 2048 // 4, tma=False)
    assert gu.x_f32 and dn.x_f32
    assert any(c.kernel is moe._gate_up_gemv_kernel and c.constexprs["BLOCK_N"] == gu.block_n
               and c.signature["x_ptr"] == c.signature["act_ptr"] == "*fp32" for c in x_f32)
    assert any(c.kernel is moe._down_gemv_kernel and c.constexprs["BLOCK_N"] == dn.block_n
               and c.signature["act_ptr"] == "*fp32" for c in x_f32)
    assert any(c.kernel is moe._route_x_f32_kernel for c in moe.aot_configs())


# --- tensor-core pairs decode ----------------------------------------------------------------------
# reduced tiles: gate/up 16 columns (32 weight rows), down 32 rows, K steps of 64 (two 32-groups)
PAIRS_TILES = (moe.PairsConfig(16, 64, 4), moe.PairsConfig(32, 64, 4))


def pairs_tiles(inter, mul_pairs=False, block_m=16, scale_bf16=False, scale_on_words=False):
    return tuple(moe.PairsConfig(min(c.block_n, inter) if i == 0 else c.block_n, c.block_k, c.num_warps,
                                 mul_pairs=mul_pairs, block_m=block_m, scale_bf16=scale_bf16,
                                 scale_on_words=scale_on_words)
                 for i, c in enumerate(PAIRS_TILES))


# (mul_pairs, scale_bf16, scale_on_words): shift- or multiply-placed pairs, scale per group on the MMA result,
# on the pair values in bf16 (one MMA per K step) or on the int32 pair words before the split (round 9)
PAIRS_FORMS = {"shift_pairs": (False, False, False), "mul_pairs": (True, False, False),
               "scale_bf16": (True, True, False), "scale_words": (True, True, True)}


@pytest.mark.parametrize("form", sorted(PAIRS_FORMS))
@pytest.mark.parametrize("batch,inter", [(0, 64), (1, 256), (1, 128), (3, 64), (3, 32), (64, 32)])
def test_pairs_forward_matches_reference(batch, inter, form):
    """Every per-rank I (reduced), B in 0/1/3/64 (more routed rows per expert than one 16-row pass at
    B = 64 with 8 experts), every pairs form, NaN-poisoned output."""
    experts = make_experts(inter)
    weights, ids = make_routing(batch, "random")
    x = make_x(batch)
    mul_pairs, scale_bf16, on_words = PAIRS_FORMS[form]
    out = run(x, experts, weights, ids, upcast="pairs",
              configs=pairs_tiles(inter, mul_pairs, scale_bf16=scale_bf16, scale_on_words=on_words))
    assert out.shape == (batch, HIDDEN) and out.dtype == torch.bfloat16
    if batch:
        assert rel(out, moe.reference_moe_mxfp4(x, *experts, weights, ids)) < 2e-2


@pytest.mark.parametrize("on_words", [False, True], ids=["default_forms", "scale_words"])
@pytest.mark.parametrize("pattern", ["skewed", "duplicate", "invalid", "all_invalid"])
def test_pairs_routing_patterns_clamp_and_poisoned_scratch(pattern, on_words):
    """Skewed and duplicate experts, invalid ids, the clamp on and off, every scratch tensor NaN-poisoned
    (each activation and output row the launches read must be written first)."""
    inter = 32
    experts = make_experts(inter)
    weights, ids = make_routing(5, pattern)
    x = make_x(5, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    unclamped = moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0)
    words = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True} if on_words else {}
    with poisoned_scratch():
        out = run(x, experts, weights, ids, upcast="pairs", configs=pairs_tiles(inter, block_m=32, **words))
        out_unclamped = run(x, experts, weights, ids, upcast="pairs", configs=pairs_tiles(inter, **words),
                            swiglu_limit=0.0)
    if pattern == "all_invalid":
        assert torch.equal(out, torch.zeros_like(out))
        return
    assert rel(unclamped, ref) > 0.1  # the clamp is active
    assert rel(out, ref) < 2e-2 and rel(out_unclamped, unclamped) < 2e-2


@pytest.mark.parametrize("form", sorted(PAIRS_FORMS))
def test_pairs_dequantise_every_code_under_extreme_scales(form):
    """Every byte of the weights (both nibbles, all signs and codes, the 0.5 code as the bf16 subnormal
    2**-127) under E8M0 bytes from 2**-127 up to 2**20: the pair bits and the per-group scale on the MMA
    result (or, scale_bf16, on the pair words: exact from byte 34 up, the groups below add under 2**-93
    of the rest) give the reference's products."""
    mul_pairs, scale_bf16, on_words = PAIRS_FORMS[form]
    experts, x, weights, ids, ref = extreme_scale_case()
    form_kw = {"mul_pairs": mul_pairs, "scale_bf16": scale_bf16, "scale_on_words": on_words}
    out = run(x, experts, weights, ids, upcast="pairs", swiglu_limit=0.0,
              configs=(moe.PairsConfig(32, 256, 4, **form_kw), moe.PairsConfig(32, 32, 4, **form_kw)))
    assert torch.isfinite(ref).all() and torch.isfinite(out).all() and rel(out, ref) < 2e-2


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_pairs_scale_on_words_is_bit_identical_to_scale_bf16(batch):
    """The round-9 form (scale on the int32 pair words, emulated by bits under the interpreter) gives
    exactly the scale_bf16 form's output: same products, same MMA operand, same order."""
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(batch, "skewed")
    x = make_x(batch, scale=4.0)
    base = run(x, experts, weights, ids, upcast="pairs", configs=pairs_tiles(inter, True, scale_bf16=True))
    words = run(x, experts, weights, ids, upcast="pairs",
                configs=pairs_tiles(inter, True, scale_bf16=True, scale_on_words=True))
    assert torch.equal(words, base)
    assert moe.PairsConfig(32, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True).label().endswith("hwd")


def test_pairs_layout_launches_and_validation():
    """The routing launch writes x * 2**PAIRS_ACT_SHIFT in the pair order (exact, a permutation within each
    8 values), the four launches repeated give the forward again, and bad arguments are refused."""
    inter, batch = 64, 3
    experts, weights, ids, x, ref, w13r, s13r, out = launch_case(inter, batch)
    launches = moe.pairs_launches(x, w13r, s13r, *experts[2:], weights, ids, out, configs=pairs_tiles(inter))
    assert [name for name, _ in launches] == list(moe.GEMV_LAUNCH_NAMES) and len(launches) == moe.LAUNCHES_PER_FORWARD
    assert_launches_repeat_the_forward(launches, out, ref)
    # nibble j + 4h of word w (value 8w + j + 4h) at 8w + 4 (j % 2) + 2 (j // 2) + h
    k = torch.arange(HIDDEN)
    j, h = k % 4, (k // 4) % 2
    position = (k // 8) * 8 + 4 * (j % 2) + 2 * (j // 2) + h
    assert sorted(position.tolist()) == list(range(HIDDEN))
    expected = torch.empty(batch, HIDDEN)
    expected[:, position] = x.float().cpu() * 2.0 ** 32
    x_pairs = torch.full((batch, HIDDEN), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    routing = [torch.empty(n, dtype=torch.int32, device=DEVICE) for n in (batch * TOP_K, NUM_EXPERTS + 1, NUM_EXPERTS, 1)]
    moe._route_pairs_kernel[(1 + triton.cdiv(x.numel(), 128),)](
        ids, batch * TOP_K, *routing, x, x_pairs, x.numel(), NUM_EXPERTS=NUM_EXPERTS, BLOCK_ROWS=32,
        NUM_BINS=16, BLOCK_X=128)
    assert torch.equal(x_pairs.float().cpu(), expected)
    assert int(routing[3]) == len(torch.unique(ids))
    with pytest.raises(ValueError, match="PairsConfig"):
        run(x, experts, weights, ids, upcast="pairs", configs=SPLIT_TILES)
    with pytest.raises(ValueError, match="pairs tiles"):
        run(x, experts, weights, ids, upcast="pairs", configs=(moe.PairsConfig(16, 48, 4), PAIRS_TILES[1]))
    with pytest.raises(ValueError, match="pairs tiles"):  # the down MMA's M side below 16
        run(x, experts, weights, ids, upcast="pairs", configs=(PAIRS_TILES[0], moe.PairsConfig(8, 64, 4)))
    with pytest.raises(ValueError, match="pairs"):
        run(x, experts, weights, ids, upcast="pairs", split_k=(2, 1))
    with pytest.raises(ValueError, match="pairs"):
        run(x, experts, weights, ids, upcast="pairs", act_mxfp8=True)
    many = moe.PAIRS_MAX_ROWS // TOP_K + 1
    big_w, big_ids = make_routing(many, "random")
    with pytest.raises(ValueError, match="decode form"):
        run(make_x(many), experts, big_w, big_ids, upcast="pairs")


def test_pairs_default_dispatch(monkeypatch):
    """Where PAIRS_DEFAULT_WHERE names the shape the default forward runs the pairs launches at
    pairs_configs' tiles; PairsConfig tiles select the form; tensor-core GEMM arguments the GEMM path."""
    inter = 64
    experts = make_experts(inter)
    weights, ids = make_routing(2, "random")
    x = make_x(2)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    monkeypatch.setattr(moe, "PAIRS_DEFAULT_WHERE", ((inter, 2 * TOP_K, 2 * TOP_K),))
    monkeypatch.setattr(moe, "pairs_configs",
                        lambda rows, i, words_mul=True, tma=True, device=None: pairs_tiles(i, mul_pairs=True))
    calls = []
    real = moe.pairs_launches
    monkeypatch.setattr(moe, "pairs_launches", lambda *a, **kw: calls.append(a[-1]) or real(*a, **kw))
    assert moe.default_upcast(2 * TOP_K, inter) == "pairs" and moe.default_upcast(TOP_K, inter) != "pairs"
    assert rel(run(x, experts, weights, ids), ref) < 2e-2 and calls == [None]
    assert rel(run(x, experts, weights, ids, configs=SPLIT_TILES), ref) < 2e-2 and len(calls) == 1
    assert rel(run(x[:1], experts, weights[:1], ids[:1], configs=pairs_tiles(inter)), ref[:1]) < 2e-2
    assert len(calls) == 2


def test_pairs_scale_on_words_default_follows_the_h200_numbers():
    """Round 9 (runs 10/10b/10c): the factor on the pair words is the default wherever the pairs decode is,
    except at I = 512 (T=4) below B = 12 (slower at B = 9, B = 10 / 11 not measured)."""
    for tp in SUPPORTED_TP:
        inter = 2048 // tp
        for batch in (1, 8, 9, 11, 12, 16, 17, 64, 256):
            gu, dn = moe.pairs_configs(batch * TOP_K, inter, tma=False)  # round 15's TMA tiles: their own test
            expected = not (tp == 4 and batch < 12)
            assert gu.scale_on_words == dn.scale_on_words == expected, (tp, batch)
            assert gu == moe.PairsConfig(32, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=expected)
            assert dn.block_n == 64 and dn.mul_pairs and dn.scale_bf16
            flag = gu.scale_bf16_constexpr()
            assert flag == (4 if expected else 2)  # the interpreter's emulations of 3 / 1


def test_pairs_scale_on_words_only_where_the_gpu_has_the_packed_multiply(monkeypatch):
    """PTX mul.rn.bf16x2 needs sm_90+: below it the default pairs tiles keep the bf16-scale form; the CPU
    interpreter runs the emulation."""
    gu, dn = moe.pairs_configs(64 * TOP_K, 2048, words_mul=False)
    assert not gu.scale_on_words and not dn.scale_on_words and gu.scale_bf16 and dn.scale_bf16
    assert moe.pair_words_mul_usable(torch.device("cpu")) == moe.interpreter_enabled()
    for major, usable in ((8, False), (9, True), (12, True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, m=major: (m, 0))
        assert moe.pair_words_mul_usable(torch.device("cuda", 0)) is usable


def test_pairs_aot_configs_expect_tensor_cores():
    """The shipped tiles (the round-5 winner, mul pairs with the bf16 scale, on the pair words since round 9)
    compile for every per-rank I, both forms where both are defaults."""
    assert {inter for inter, _, _ in moe.PAIRS_DEFAULT_WHERE} == {2048 // tp for tp in SUPPORTED_TP}
    pairs = [c for c in moe.aot_configs() if "_pairs_" in c.name]
    for tp in SUPPORTED_TP:
        for rows in (TOP_K, moe.DECODE_MAX_ROWS):
            gu, dn = moe.pairs_configs(rows, 2048 // tp, tma=False)  # the TMA tiles: test_pairs_tma_default_...
            flag = 3 if gu.scale_on_words else 1
            assert any(c.kernel is moe._gate_up_pairs_kernel and c.constexprs["BLOCK_N"] == gu.block_n
                       and c.constexprs["SCALE_BF16"] == flag and "selectable" not in c.note for c in pairs)
            assert any(c.kernel is moe._down_pairs_kernel and c.constexprs["BLOCK_K"] == min(dn.block_k, 2048 // tp)
                       and c.constexprs["SCALE_BF16"] == flag and "selectable" not in c.note for c in pairs)
    assert all(c.expect_opcodes == ("HMMA.16816.F32.BF16",) + (("UTMALDG",) if "tma" in c.name else ()) for c in pairs)
    assert any(c.kernel is moe._route_pairs_kernel for c in moe.aot_configs())
    # round 21: the routing of the pairs decode up to PAIRS_MAX_ROWS sorts in one 4096-row program
    assert any(c.kernel is moe._route_pairs_kernel and c.constexprs["BLOCK_ROWS"] >= moe.PAIRS_MAX_ROWS
               for c in moe.aot_configs())


# --- swap-AB fed by TMA (PairsConfig(tma_ring=)): K steps of 512, so H = I = 512 as the TMA GEMV's tests ------------
@pytest.mark.parametrize("ring,batch,pattern,on_words", [
    (3, 0, "random", True), (3, 1, "random", True), (3, 3, "duplicate", True), (1, 3, "skewed", False),
    (3, 4, "invalid", True), (2, 1, "duplicate", False)])
def test_pairs_tma_swap_ab(ring, batch, pattern, on_words):
    """Weights and E8M0 bytes by TMA through a ring of one to three stages, the MMA with the weights as M and
    up to 16 routed rows as N (duplicate experts: several rows per pass), against the reference with the clamp
    active and every scratch tensor NaN-poisoned; bit-identical to the cp.async pairs decode at the same tiles
    (the same MMA operands, K steps and order)."""
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=batch + 70)
    weights, ids = make_routing(batch, pattern, seed=batch + 71)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=batch + 72, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    if batch:
        assert rel(moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0), ref) > 0.1
    form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": on_words}
    tiles = ((inter // 2, TMA_HIDDEN // 2) if batch < 4 else (inter, TMA_HIDDEN))  # interpreter time
    cfgs = tuple(moe.PairsConfig(n, 512, 4, tma_ring=ring, **form) for n in tiles)
    with poisoned_scratch():
        out = run(x, experts, weights, ids, upcast="pairs", configs=cfgs)
    assert out.shape == (batch, TMA_HIDDEN) and torch.isfinite(out).all()
    if batch:
        assert rel(out, ref) < 2e-2
    plain = run(x, experts, weights, ids, upcast="pairs", configs=tuple(moe.PairsConfig(n, 512, 4, **form)
                                                                        for n in tiles))
    assert torch.equal(out, plain)
    assert cfgs[0].label() == f"n{tiles[0]}k512w4tma{ring}mulh" + ("wd" if on_words else "")


@pytest.mark.parametrize("tiles,batch,pattern", [("ROWS8", 2, "duplicate"), ("ROWS8_K256", 3, "skewed"),
                                                  ("ROWS16_GATE_UP", 1, "random"), ("ROWS16", 7, "skewed")])
def test_pairs_tma_rows_default_forward(monkeypatch, tiles, batch, pattern):
    """The default forward where PAIRS_TMA_ROWS_WHERE names the shape runs its tiles as they are (64 gate/up rows and
    64 down rows on 2 warps, MMAs of 128 / 256, 8 routed rows per pass; the B = 256 tiles 16 per gate/up pass) at
    H = I = 512, against the reference with every scratch tensor NaN-poisoned; skewed routing gives an expert more
    than 8 rows (several 8-row passes over its weights; at B = 7 one expert with 20 rows: two 16-row passes of run 21's
    tiles past B = 256)."""
    inter = TMA_HIDDEN
    cfgs = getattr(moe, f"PAIRS_TMA_{tiles}_TILES")
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=95 + batch)
    weights, ids = make_routing(batch, pattern, seed=96 + batch)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=97 + batch, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    monkeypatch.setattr(moe, "PAIRS_TMA_ROWS_WHERE", ((inter, batch * TOP_K, batch * TOP_K, cfgs),))
    assert moe.pairs_configs(batch * TOP_K, inter) == cfgs and moe.default_upcast(batch * TOP_K, inter) == "pairs"
    assert moe.pairs_configs(batch * TOP_K, inter, tma=False) != cfgs
    used = []
    real = moe._down_pairs_tma_kernel
    monkeypatch.setattr(moe, "_down_pairs_tma_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: used.append(grid) or real[grid]})())
    with poisoned_scratch():
        out = run(x, experts, weights, ids)
    assert torch.isfinite(out).all() and rel(out, ref) < 2e-2
    assert len(used) == 1 and used[0][1] == TMA_HIDDEN // 64


@pytest.mark.parametrize("batch,pattern,sub_k", [(0, "random", 128), (1, "random", 0), (3, "skewed", 128),
                                                 (4, "invalid", 256), (3, "duplicate", 0)])
def test_pairs_tma_eight_rows_per_pass(batch, pattern, sub_k):
    """Run 20: 8 routed rows per MMA pass (block_m 8, one m16n8k16 per 16 values of K) gives the products of 16 rows
    per pass, an expert with more than 8 rows taking several passes (skewed / duplicate routing), -1 and out-of-range
    ids contributing nothing; against the reference and the 16-row tiles, every scratch tensor NaN-poisoned."""
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=batch + 60)
    weights, ids = make_routing(batch, pattern, seed=batch + 61)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=batch + 62, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True, "tma_ring": 2, "sub_k": sub_k}
    tiles = (inter // 4, TMA_HIDDEN // 4)
    rows8 = tuple(moe.PairsConfig(n, 512, 4, block_m=8, **form) for n in tiles)
    rows16 = tuple(moe.PairsConfig(n, 512, 4, **form) for n in tiles)
    with poisoned_scratch():
        out = run(x, experts, weights, ids, upcast="pairs", configs=rows8)
    assert out.shape == (batch, TMA_HIDDEN) and torch.isfinite(out).all()
    if batch:
        assert rel(out, ref) < 2e-2
        assert rel(out, run(x, experts, weights, ids, upcast="pairs", configs=rows16)) < 1e-2
    assert rows8[0].label() == f"n{tiles[0]}k512w4tma2m8mulhwd" + (f"c{sub_k}" if sub_k else "")


@pytest.mark.parametrize("tma_ring", [2, 0])
def test_pairs_register_cap_reaches_the_launch(monkeypatch, tma_ring):
    """PairsConfig.max_registers: the cap goes to both launches as ``maxnreg`` (and into the label); it changes
    nothing else, so the forward is bit-identical to the uncapped tiles'. A cap outside ptxas' range is refused."""
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=81)
    weights, ids = make_routing(3, "skewed", seed=82)
    x = make_x(3, hidden=TMA_HIDDEN, seed=83, scale=4.0)
    form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True, "tma_ring": tma_ring, "block_m": 8}
    plain = tuple(moe.PairsConfig(n, 512, 2, **form) for n in (inter // 4, TMA_HIDDEN // 4))
    capped = (dataclasses.replace(plain[0], max_registers=144), dataclasses.replace(plain[1], max_registers=128))
    options = []
    suffix = "_tma_kernel" if tma_ring else "_kernel"
    for name in ("_gate_up_pairs" + suffix, "_down_pairs" + suffix):
        real = getattr(moe, name)

        def launcher(grid, real=real):
            def launch(*args, **kwargs):
                options.append(kwargs.get("maxnreg"))
                return real[grid](*args, **kwargs)
            return launch
        monkeypatch.setattr(moe, name, type("Spy", (), {"__getitem__": lambda self, grid, f=launcher: f(grid)})())
    with poisoned_scratch():
        out = run(x, experts, weights, ids, upcast="pairs", configs=capped)
    assert options == [144, 128]
    options.clear()
    assert torch.equal(out, run(x, experts, weights, ids, upcast="pairs", configs=plain))
    assert options == [None, None]
    assert rel(out, moe.reference_moe_mxfp4(x, *experts, weights, ids)) < 2e-2
    assert capped[0].label() == plain[0].label() + "r144" and capped[1].label().endswith("r128")
    with pytest.raises(ValueError, match="PairsConfig.max_registers"):
        dataclasses.replace(plain[0], max_registers=16)


@pytest.mark.parametrize("major,capped", [(9, True), (12, False), (8, False), (10, False)])
def test_pairs_register_caps_only_where_measured(monkeypatch, major, capped):
    """The T=4 8-row down tile of the TMA pairs decode takes a register cap of 128 on compute capability 9 only (timed
    there, stop 42), at every B where that tile runs (16..256); T=1 (where the cap lost), the gate/up tiles, the
    shapes past B = 256, other devices, the CPU and no device keep the uncapped tiles. The AOT registry compiles the
    capped tile for sm_90a only."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    gpu = torch.device("cuda", 0)
    assert moe.pairs_register_caps_measured(gpu) is capped
    for tp in SUPPORTED_TP:
        inter = MOE_INTERMEDIATE_SIZE // tp
        for batch in (1, 8, 16, 64, 128, 255, 256, 300):
            rows = batch * TOP_K
            plain = moe.pairs_configs(rows, inter)
            tiles = moe.pairs_configs(rows, inter, device=gpu)
            expect = 128 if (capped and inter == MOE_INTERMEDIATE_SIZE // 4 and 16 <= batch <= 256) else 0
            assert [getattr(cfg, "max_registers", 0) for cfg in tiles] == [0, expect], (tp, batch)
            assert tuple(dataclasses.replace(cfg, max_registers=0) if isinstance(cfg, moe.PairsConfig) else cfg
                         for cfg in tiles) == plain
    for device in (None, "cpu", torch.device("cpu")):
        assert not moe.pairs_register_caps_measured(device)
        assert moe.pairs_configs(64 * TOP_K, MOE_INTERMEDIATE_SIZE // 4, device=device)[1].max_registers == 0
    capped_aot = [c for c in moe.aot_configs() if c.max_registers and "pairs" in c.name]
    assert [c.name for c in capped_aot] == ["moe_mxfp4_down_pairs_n64k512w2tma2m8mulhwdc128r128"]
    assert capped_aot[0].archs == (90,) and "HMMA.16816.F32.BF16" in capped_aot[0].expect_opcodes


def test_pairs_forward_asks_for_its_input_device(monkeypatch):
    """The pairs forward picks its tiles for the device its input is on (the register caps depend on it)."""
    seen = []
    choose = moe.pairs_configs
    monkeypatch.setattr(moe, "pairs_configs", lambda *a, **kw: seen.append(kw.get("device")) or choose(*a, **kw))
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=84)
    weights, ids = make_routing(2, "random", seed=85)
    x = make_x(2, hidden=TMA_HIDDEN, seed=86)
    run(x, experts, weights, ids, upcast="pairs")
    assert seen == [x.device]


@pytest.mark.parametrize("block_m", [4, 24])
def test_pairs_block_m_arguments(block_m):
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(1, "random")
    form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True, "tma_ring": 2, "block_m": block_m}
    with pytest.raises(ValueError, match="block_m"):
        run(make_x(1, hidden=TMA_HIDDEN), experts, weights, ids, upcast="pairs",
            configs=(moe.PairsConfig(64, 512, 4, **form), moe.PairsConfig(128, 512, 4, **form)))


@pytest.mark.parametrize("sub_k,batch,pattern,on_words", [
    (128, 3, "duplicate", True), (256, 1, "random", True), (128, 4, "invalid", False), (256, 0, "random", True)])
def test_pairs_tma_sub_k(sub_k, batch, pattern, on_words):
    """Round 18: a K step of 512 as 2 or 4 MMAs (PairsConfig(sub_k=)): the weight words by TMA in blocks of sub_k,
    the step's 16 scale bytes per row split in registers, each MMA with its own activations -- the same products
    as one MMA of 512 (summed in another order), against the reference with every scratch tensor NaN-poisoned."""
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=batch + 80)
    weights, ids = make_routing(batch, pattern, seed=batch + 81)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=batch + 82, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": on_words, "tma_ring": 2}
    tiles = (inter // 4, TMA_HIDDEN // 4)
    whole = tuple(moe.PairsConfig(n, 512, 4, **form) for n in tiles)
    cfgs = tuple(moe.PairsConfig(n, 512, 4, sub_k=sub_k, **form) for n in tiles)
    with poisoned_scratch():
        out = run(x, experts, weights, ids, upcast="pairs", configs=cfgs)
    assert out.shape == (batch, TMA_HIDDEN) and torch.isfinite(out).all()
    if batch:
        assert rel(out, ref) < 2e-2
        assert rel(out, run(x, experts, weights, ids, upcast="pairs", configs=whole)) < 1e-2
    assert cfgs[1].label() == f"n{tiles[1]}k512w4tma2mulh" + ("wd" if on_words else "") + f"c{sub_k}"
    assert cfgs[0].mma_k(512) == sub_k and whole[0].mma_k(512) == 512


@pytest.mark.parametrize("sub_k", [64, 96, 384])
def test_pairs_tma_sub_k_arguments(sub_k):
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(1, "random")
    form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True, "tma_ring": 2, "sub_k": sub_k}
    with pytest.raises(ValueError, match="sub_k"):
        run(make_x(1, hidden=TMA_HIDDEN), experts, weights, ids, upcast="pairs",
            configs=(moe.PairsConfig(64, 512, 4, **form), moe.PairsConfig(128, 512, 4, **form)))
    with pytest.raises(ValueError, match="sub_k"):  # sub_k needs the TMA form
        run(make_x(1, hidden=TMA_HIDDEN), experts, weights, ids, upcast="pairs",
            configs=(moe.PairsConfig(64, 512, 4, sub_k=128), moe.PairsConfig(128, 512, 4, sub_k=128)))


@pytest.mark.parametrize("bad", ["block_k", "mixed", "negative", "no_scale_bf16"])
def test_pairs_tma_arguments(bad):
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(1, "random")
    gu = dict(block_n=64, block_k=512, num_warps=4, tma_ring=2, mul_pairs=True, scale_bf16=True)
    dn = dict(gu)
    if bad == "block_k":
        gu["block_k"] = dn["block_k"] = 256
    elif bad == "mixed":
        dn["tma_ring"] = 0
    elif bad == "negative":
        gu["tma_ring"] = dn["tma_ring"] = -1
    else:
        gu["scale_bf16"] = dn["scale_bf16"] = False
    with pytest.raises(ValueError, match="tma_ring"):
        run(make_x(1, hidden=TMA_HIDDEN), experts, weights, ids, upcast="pairs",
            configs=(moe.PairsConfig(**gu), moe.PairsConfig(**dn)))


def test_pairs_decode_above_decode_max_rows(monkeypatch):
    """Round 21: where PAIRS_TMA_ROWS_WHERE names a shape past DECODE_MAX_ROWS (up to PAIRS_MAX_ROWS, 640 tokens) the
    default forward runs the pairs decode there instead of the grouped GEMM, its routing sorting every row in one
    4096-row program; skewed routing (one expert with hundreds of rows: many passes) and invalid ids, every scratch
    tensor NaN-poisoned, against the reference. Without TMA, or above PAIRS_MAX_ROWS, not the pairs decode."""
    inter = 64
    tiles = pairs_tiles(inter, mul_pairs=True, block_m=64)
    monkeypatch.setattr(moe, "PAIRS_TMA_ROWS_WHERE", ((inter, moe.DECODE_MAX_ROWS + 1, moe.PAIRS_MAX_ROWS, tiles),))
    batch = moe.DECODE_MAX_ROWS // TOP_K + 1
    assert triton.next_power_of_2(batch * TOP_K) == triton.next_power_of_2(moe.PAIRS_MAX_ROWS) == 4096
    assert moe.default_upcast(batch * TOP_K, inter) == moe.default_upcast(moe.PAIRS_MAX_ROWS, inter) == "pairs"
    assert moe.default_upcast(batch * TOP_K, inter, tma=False) != "pairs"
    assert moe.default_upcast(moe.PAIRS_MAX_ROWS + 1, inter) != "pairs"
    experts = make_experts(inter, seed=31)
    weights, ids = make_routing(batch, "invalid", seed=32)
    ids[:400, 0] = 3
    x = make_x(batch, seed=33, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    calls = []
    real = moe.pairs_launches
    monkeypatch.setattr(moe, "pairs_launches", lambda *a, **kw: calls.append(a[-1]) or real(*a, **kw))
    with poisoned_scratch():
        out = run(x, experts, weights, ids)
    assert calls == [None] and torch.isfinite(out).all() and rel(out, ref) < 2e-2


def test_pairs_tma_default_follows_the_h200_numbers():
    """Round 15 (runs 15 / 15b): the TMA-fed swap-AB tiles (gate/up 32 rows on 2 warps, down 16 rows on 1 warp, 2
    stages, factor on the pair words) are the pairs tiles at I = 2048 from B = 4 and at I = 512 from B = 16, where the
    operands allow TMA and the GPU has the packed multiply; runs 20 / 20b: from B = 16 to 256 the tiles chosen by routed
    rows (PAIRS_TMA_ROWS_WHERE: 64 gate/up and 64 down rows on 2 warps with 8 routed rows per pass, MMAs of 128 / at
    I = 512 256 in the gate/up launch; at B = 256 the gate/up launch 16 rows per pass), before the fp16 GEMV; run 21:
    at I = 2048 B = 12..15 the 8-row tiles with gate/up MMAs of 256, past B = 256 up to PAIRS_MAX_ROWS both launches
    16 rows per pass; elsewhere the cp.async tiles; every kernel in the AOT registry (HMMA + UTMALDG)."""
    tma_tiles = moe.PAIRS_TMA_TILES
    rows8, rows8_k256, rows16_gu, rows16 = (moe.PAIRS_TMA_ROWS8_TILES, moe.PAIRS_TMA_ROWS8_K256_TILES,
                                            moe.PAIRS_TMA_ROWS16_GATE_UP_TILES, moe.PAIRS_TMA_ROWS16_TILES)
    form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True, "tma_ring": 2}
    assert tma_tiles[0] == moe.PairsConfig(16, 512, 2, **form) and tma_tiles[1] == moe.PairsConfig(16, 512, 1, **form)
    down = moe.PairsConfig(64, 512, 2, block_m=8, sub_k=128, **form)
    down16 = moe.PairsConfig(64, 512, 2, sub_k=128, **form)
    assert rows8 == (moe.PairsConfig(32, 512, 2, block_m=8, sub_k=128, **form), down)
    assert rows8_k256 == (moe.PairsConfig(32, 512, 2, block_m=8, sub_k=256, **form), down)
    assert rows16_gu == (moe.PairsConfig(32, 512, 2, sub_k=128, **form), down)
    assert rows16 == (rows16_gu[0], down16)
    ours = (tma_tiles, rows8, rows8_k256, rows16_gu, rows16)
    for inter, first, rows_first, small in ((2048, 4, 12, rows8), (512, 16, 16, rows8_k256)):
        for batch in (first, 11, 12, 15, 16, 17, 32, 47, 48, 64, 65, 128, 255, 256, 257, 341, 342, 512, 640):
            if batch < first:
                continue
            expected = (rows16 if batch > 256 else rows16_gu if batch == 256 else small if batch >= 16
                        else rows8_k256 if batch >= rows_first else tma_tiles)
            assert moe.pairs_configs(batch * TOP_K, inter) == expected
            assert moe.pairs_rows_tiles(batch * TOP_K, inter) == (expected if batch >= rows_first else None)
            # round 16 / run 16b: the fp16 TMA GEMV took B <= 32 at I = 2048 and 512; run 20b: B >= 16 back; run 21:
            # B >= 12 at I = 2048
            assert moe.default_upcast(batch * TOP_K, inter) == ("gemv" if batch < rows_first else "pairs")
            for cfgs in (moe.pairs_configs(batch * TOP_K, inter, tma=False),
                         moe.pairs_configs(batch * TOP_K, inter, words_mul=False)):
                assert not cfgs[0].tma_ring and not cfgs[1].tma_ring
        for rows in (first * TOP_K - 1, moe.PAIRS_MAX_ROWS + 1):
            assert moe.pairs_configs(rows, inter) not in ours
        assert moe.pairs_rows_tiles(moe.PAIRS_MAX_ROWS, inter) == rows16
        assert moe.pairs_rows_tiles(moe.PAIRS_MAX_ROWS + 1, inter) is None
    for inter in (1024, 256):
        assert all(moe.pairs_configs(b * TOP_K, inter) not in ours for b in (1, 4, 12, 16, 64, 256))
        assert all(moe.pairs_rows_tiles(b * TOP_K, inter) is None for b in (12, 16, 64, 256, 300))
    assert moe.default_upcast(4 * TOP_K, 2048, tma=False) == moe.default_upcast(12 * TOP_K, 2048, tma=False) == "gemv"
    assert moe.default_upcast(11 * TOP_K, 2048) == moe.default_upcast(15 * TOP_K, 512) == "gemv"
    names = {c.name: c for c in moe.aot_configs()}
    for kind, kernel, cfg in (("gate_up", moe._gate_up_pairs_tma_kernel, tma_tiles[0]),
                              ("down", moe._down_pairs_tma_kernel, tma_tiles[1]),
                              *(("gate_up", moe._gate_up_pairs_tma_kernel, t[0]) for t in (rows8, rows8_k256, rows16)),
                              ("down", moe._down_pairs_tma_kernel, down), ("down", moe._down_pairs_tma_kernel, down16)):
        aot = names[f"moe_mxfp4_{kind}_pairs_{cfg.label()}"]
        assert aot.kernel is kernel and aot.num_warps == cfg.num_warps and aot.constexprs["RING"] == 2
        assert aot.constexprs["SUB_K"] == (cfg.sub_k or 512) and aot.constexprs["BLOCK_M"] == cfg.block_m
        assert aot.constexprs["SCALE_BF16"] == 3 and aot.expect_opcodes == ("HMMA.16816.F32.BF16", "UTMALDG")


def test_pairs_tma_default_forward(monkeypatch):
    """The default forward at a shape PAIRS_TMA_WHERE names runs the TMA-fed pairs launches (reduced tiles), and
    not where the operands do not allow TMA (gemv_tma_usable False: then the shape's earlier default)."""
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=90)
    weights, ids = make_routing(2, "skewed", seed=91)
    x = make_x(2, hidden=TMA_HIDDEN, seed=92)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True}
    tma_tiles = (moe.PairsConfig(inter, 512, 2, tma_ring=2, **form),
                 moe.PairsConfig(TMA_HIDDEN, 512, 1, tma_ring=2, **form))
    monkeypatch.setattr(moe, "PAIRS_TMA_WHERE", ((inter, 2 * TOP_K, 2 * TOP_K),))
    monkeypatch.setattr(moe, "PAIRS_TMA_TILES", tma_tiles)
    monkeypatch.setattr(moe, "GEMV_TMA_F16_WHERE", {})  # I = 512 B = 2 is the fp16 TMA GEMV's since round 16
    used = []
    real = moe._gate_up_pairs_tma_kernel
    monkeypatch.setattr(moe, "_gate_up_pairs_tma_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: used.append(grid) or real[grid]})())
    assert moe.default_upcast(2 * TOP_K, inter) == "pairs" and moe.default_upcast(TOP_K, inter) != "pairs"
    with poisoned_scratch():
        out = run(x, experts, weights, ids)
    assert rel(out, ref) < 2e-2 and len(used) == 1
    assert moe.pairs_configs(2 * TOP_K, inter, tma=False) != tma_tiles
    monkeypatch.setattr(moe, "gemv_tma_usable", lambda *tensors: False)
    assert rel(run(x, experts, weights, ids), ref) < 2e-2 and len(used) == 1


# --- run 15c: the mixed forward, swap-AB gate/up (natural-order SwiGLU rows) + the TMA GEMV down launch -------------
@pytest.mark.parametrize("batch,pattern,per_sm", [(0, "random", 0), (1, "random", 0), (3, "duplicate", 2)])
def test_pairs_gemv_down_mixed(monkeypatch, batch, pattern, per_sm):
    """The swap-AB gate/up launch writing plain bf16 SwiGLU rows in natural order, read by the TMA GEMV down launch
    (one program per column block, or a persistent grid smaller than its work items), against the reference with the
    clamp active and every scratch tensor NaN-poisoned (B = 3 with duplicate experts: several rows per MMA pass)."""
    monkeypatch.setattr(moe, "CPU_SM_COUNT", 1)  # persistent: 2 programs for 36 (routed row, column block) items
    inter = TMA_HIDDEN
    experts = make_experts(inter, hidden=TMA_HIDDEN, seed=batch + 110)
    weights, ids = make_routing(batch, pattern, seed=batch + 111)
    x = make_x(batch, hidden=TMA_HIDDEN, seed=batch + 112, scale=4.0)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    if batch:
        assert rel(moe.reference_moe_mxfp4(x, *experts, weights, ids, swiglu_limit=0.0), ref) > 0.1
    cfgs = (moe.PairsConfig(inter // 2, 512, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True, tma_ring=2),
            moe.GemvConfig(TMA_HIDDEN // 2, 512, 4, tma_ring=3, persistent_programs_per_sm=per_sm))
    with poisoned_scratch():
        out = run(x, experts, weights, ids, configs=cfgs)  # the tiles' types pick the pairs launches
    assert out.shape == (batch, TMA_HIDDEN) and torch.isfinite(out).all()
    if batch:
        assert rel(out, ref) < 2e-2


@pytest.mark.parametrize("bad", ["x_f32", "f16", "no_tma", "pairs_no_tma", "split_k"])
def test_pairs_gemv_down_arguments(bad):
    experts = make_experts(TMA_HIDDEN, hidden=TMA_HIDDEN)
    weights, ids = make_routing(1, "random")
    gu = dict(block_n=256, block_k=512, num_warps=4, tma_ring=2, mul_pairs=True, scale_bf16=True)
    dn = dict(block_n=256, block_k=512, num_warps=4, tma_ring=3)
    if bad in ("x_f32", "f16"):  # the swap-AB gate/up writes bf16 SwiGLU rows
        dn[bad] = True
    elif bad == "no_tma":
        dn["tma_ring"] = 0
    elif bad == "pairs_no_tma":
        gu["tma_ring"] = 0
    else:
        dn["split_k"] = 2
    with pytest.raises(ValueError, match="GEMV down"):
        run(make_x(1, hidden=TMA_HIDDEN), experts, weights, ids, upcast="pairs",
            configs=(moe.PairsConfig(**gu), moe.GemvConfig(**dn)))


def test_pairs_gemv_down_default_follows_the_h200_numbers():
    """Runs 15c / 15c2: the mixed forward is the pairs form at T=1 B = 2, 5, 6 and T=4 B = 4, 5, 6, 8 (>= 2 % faster in
    every run that measured it; since runs 16 / 16b the fp16 TMA GEMV is the default there), with the swap-AB gate/up
    tile and gemv_configs' TMA down tile (persistent at T=4),
    where the operands allow TMA and the GPU has the packed multiply; its gate/up kernel is in the AOT registry."""
    gate_up = moe.PAIRS_TMA_TILES[0]
    for inter, batches, others in ((2048, (2, 5, 6), (1, 3, 4, 7, 8, 16)), (512, (4, 5, 6, 8), (1, 2, 3, 7, 9, 16))):
        for batch in batches:
            rows = batch * TOP_K
            gu, dn = moe.pairs_configs(rows, inter)
            assert gu == gate_up and dn == moe.gemv_configs(rows, inter, f16=False)[1]
            assert dn == moe.GemvConfig(16, 512, 4, tma_ring=3, persistent_programs_per_sm=8 if inter == 512 else 0)
            assert moe.default_upcast(rows, inter) == "gemv" and moe.gemv_configs(rows, inter)[0].f16  # runs 16 / 16b
            assert isinstance(moe.pairs_configs(rows, inter, tma=False)[1], moe.PairsConfig)
            assert isinstance(moe.pairs_configs(rows, inter, words_mul=False)[1], moe.PairsConfig)
            assert moe.default_upcast(rows, inter, tma=False) == "gemv"
        for batch in others:
            assert isinstance(moe.pairs_configs(batch * TOP_K, inter)[1], moe.PairsConfig)
            assert not moe.pairs_gemv_down_default(batch * TOP_K, inter)
    assert moe.default_upcast(TOP_K, 2048) == moe.default_upcast(7 * TOP_K, 512) == "gemv"
    names = {c.name: c for c in moe.aot_configs()}
    aot = names[f"moe_mxfp4_gate_up_pairs_{gate_up.label()}_natural"]
    assert aot.kernel is moe._gate_up_pairs_tma_kernel and aot.constexprs["NATURAL_ACT"] is True
    assert not names[f"moe_mxfp4_gate_up_pairs_{gate_up.label()}"].constexprs["NATURAL_ACT"]
    assert aot.expect_opcodes == ("HMMA.16816.F32.BF16", "UTMALDG") and aot.num_warps == gate_up.num_warps


# E8M0 bytes outside the pairs decode's exact range (PAIRS_EXACT_SCALE_BYTES): the load-time check and the forward's
# choice without the pairs forms
def test_scale_byte_range_and_the_pairs_exact_range():
    lo, hi = moe.PAIRS_EXACT_SCALE_BYTES
    inside = torch.tensor([lo, 127, hi], dtype=torch.uint8)
    assert moe.scale_byte_range(inside.view(torch.float8_e8m0fnu), torch.tensor([120], dtype=torch.uint8)) == (lo, hi)
    assert moe.pairs_exact_for((lo, hi))
    assert not moe.pairs_exact_for((lo - 1, hi)) and not moe.pairs_exact_for((lo, hi + 1))
    extremes = torch.tensor([255, 0], dtype=torch.uint8)
    assert moe.scale_byte_range(extremes, torch.empty(0, dtype=torch.uint8)) == (0, 255)


@pytest.mark.parametrize("inter", [MOE_INTERMEDIATE_SIZE // tp for tp in SUPPORTED_TP])
@pytest.mark.parametrize("tma", [True, False])
def test_wide_scales_never_pick_the_pairs_forms(inter, tma):
    picked = set()
    for rows in [*range(TOP_K, 64 * TOP_K + 1, TOP_K), 1000, 2048, 2049, 3072, 4096 * TOP_K]:
        upcast = moe.default_upcast(rows, inter, tma, pairs=False)
        assert upcast not in (moe.PAIRS, moe.PREFILL), (rows, inter, upcast)
        picked.add(moe.default_upcast(rows, inter, tma))
        if moe.default_upcast(rows, inter, tma) == moe.GEMV:  # where the GEMV is the default it stays
            assert upcast == moe.GEMV
    assert picked & {moe.PAIRS, moe.PREFILL}  # the normal defaults do use them on this grid


def test_wide_scales_forward_is_exact_where_the_pairs_decode_is_not():
    """Scale bytes 170 (w13) and 20 (w2): the pairs decode, asked for, is far off (its bf16 factor overflows / leaves
    the normal range); the forward with ``wide_scales`` agrees with the float32 reference."""
    inter, hidden, batch = 512, TMA_HIDDEN, 9
    experts = make_experts(inter, hidden=hidden, seed=21)
    s13 = experts[1].view(torch.uint8).clone()
    s13[:, :, :2] = 170
    s2 = experts[3].view(torch.uint8).clone()
    s2[:, :5, :] = 20
    experts[1], experts[3] = s13.view(torch.float8_e8m0fnu), s2.view(torch.float8_e8m0fnu)
    assert not moe.pairs_exact_for(moe.scale_byte_range(experts[1], experts[3]))
    weights, ids = make_routing(batch, "random", seed=22)
    x = make_x(batch, hidden=hidden, seed=23)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    assert rel(run(x, experts, weights, ids, upcast="pairs"), ref) > 0.5
    with poisoned_scratch():
        out = run(x, experts, weights, ids, wide_scales=True)
    assert torch.isfinite(out).all() and rel(out, ref) < 2e-2


@pytest.mark.parametrize("ids", [[[3, 200, 17, 5, 99, 0]], [[3, 3, 17, 300, -1, 17]], [[-1] * 6],
                                 [[255, 254, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]], [[7] * 6, [7] * 6], []])
def test_small_routing_matches_the_counting_sort_where_the_gemv_reads_it(ids):
    """Round 29: up to ROUTE_SMALL_MAX_ROWS routed rows the fp16 GEMV's routing compares rows pairwise; its sorted
    rows, active experts and count equal the counting sort's, and expert_start at every active expert e and e + 1 (the
    only entries the per-slot launches read); the entries it does not write keep their poison."""
    ids = torch.tensor(ids, dtype=torch.int32).view(-1, TOP_K)
    rows = ids.numel()
    assert rows <= moe.ROUTE_SMALL_MAX_ROWS
    poison = -7

    def tables(small):
        out = [torch.full((size,), poison, dtype=torch.int32) for size in (max(rows, 1), NUM_EXPERTS + 1, NUM_EXPERTS, 1)]
        x = torch.zeros(max(len(ids), 1), TMA_HIDDEN, dtype=torch.bfloat16)
        moe._route_x_f16_kernel[(1,)](
            ids.to(DEVICE), rows, *[t.to(DEVICE) for t in out], x.to(DEVICE), x.to(torch.float16).to(DEVICE),
            torch.zeros(x.shape[0], device=DEVICE), TMA_HIDDEN, NUM_EXPERTS=NUM_EXPERTS, BLOCK_ROWS=16,
            NUM_BINS=triton.next_power_of_2(NUM_EXPERTS + 1), BLOCK_H=TMA_HIDDEN, ROUTE=True, SMALL_ROUTE=small)
        return out

    sorted_rows, start, active, count = tables(True)
    ref_rows, ref_start, ref_active, ref_count = tables(False)
    n = int(ref_count)
    assert int(count) == n and torch.equal(active[:n], ref_active[:n])
    assert torch.equal(sorted_rows[:rows], ref_rows[:rows])
    for e in active[:n].tolist():
        assert start[e] == ref_start[e] and start[e + 1] == ref_start[e + 1]
    untouched = torch.ones(NUM_EXPERTS + 1, dtype=torch.bool)
    for e in active[:n].tolist():
        untouched[e] = untouched[e + 1] = False
    assert (start[untouched] == poison).all() and (active[n:] == poison).all()


@pytest.mark.parametrize("seed", range(16))
def test_random_calls_match_reference(seed):
    """A sweep of random valid forwards: expert counts, H, every per-rank I form (32..512), batch 0..64, top_k 1..8
    with ids outside [0, E) now and then, activation scales that do and do not reach the clamp, and the variant by
    default or forced (every upcast of FORWARD_UPCASTS), scratch poisoned."""
    r = random.Random(seed)
    num_experts, hidden, inter = r.choice([1, 2, 5, 8, 12]), r.choice([256, 512]), r.choice([32, 64, 128, 256, 512])
    batch, top_k = r.choice([0, 1, 2, 3, 7, 17, 40, 64]), r.randint(1, 8)
    upcast = r.choice([None, None, None, *moe.FORWARD_UPCASTS])
    experts = make_experts(inter, num_experts=num_experts, hidden=hidden, seed=seed)
    g = torch.Generator().manual_seed(seed)
    low = -1 if r.random() < 0.5 else 0
    ids = torch.randint(low, num_experts + (2 if low else 0), (batch, top_k), generator=g).to(torch.int32).to(DEVICE)
    weights = (torch.rand(batch, top_k, generator=g) * 1.5).to(DEVICE)
    x = (torch.randn(batch, hidden, generator=g) * r.choice([0.5, 2, 8])).to(torch.bfloat16).to(DEVICE)
    ref = moe.reference_moe_mxfp4(x, *experts, weights, ids)
    with poisoned_scratch():
        out = run(x, experts, weights, ids, upcast=upcast)
    assert torch.isfinite(out).all()
    if ref.norm() > 0:
        assert rel(out, ref) < 2e-2
    else:
        assert (out == 0).all()
