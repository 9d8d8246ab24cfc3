"""MoE prefill grouped GEMM (kernels/moe_prefill.py) against the float32 reference, under the CPU interpreter.

Reduced shapes: few experts, H = 256, per-rank I = 256/T for every T of SUPPORTED_TP (the model's 2048/T scaled
down 8x), small tiles so experts span several row blocks (ragged tails). Weights are random bytes (every e2m1
code), scales random E8M0 bytes around 2**0; activations large enough that the SwiGLU clamp is active.
"""

import dataclasses

import pytest
import torch
import triton

from sglang_sm120.kernels import moe_mxfp4 as moe
from sglang_sm120.kernels import moe_prefill as mp
from sglang_sm120.kernels.dsv4 import HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, MXFP4_GROUP, SUPPORTED_TP, SWIGLU_LIMIT
from sglang_sm120.kernels.harness.interpreter import interpreter_enabled

DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"
NUM_EXPERTS = 6
HIDDEN = 256
TOP_K = 4
INTERS = [256 // tp for tp in SUPPORTED_TP]
P = mp.PrefillConfig
# the interpreter's bf16 rounding (truncation) gives ~7e-3 for the old path and this one alike
TOLERANCE = 1.5e-2


def poison_empty(monkeypatch):
    """torch.empty fills floating-point tensors with NaN: every scratch buffer must be written by the kernels."""
    real_empty = torch.empty

    def poisoned(*args, **kw):
        t = real_empty(*args, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)


def make_layer(inter, num_experts=NUM_EXPERTS, hidden=HIDDEN, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randint(-128, 128, (num_experts, 2 * inter, hidden // 2), dtype=torch.int8, generator=g)
    s13 = torch.randint(119, 128, (num_experts, 2 * inter, hidden // MXFP4_GROUP), dtype=torch.uint8, generator=g)
    w2 = torch.randint(-128, 128, (num_experts, hidden, inter // 2), dtype=torch.int8, generator=g)
    s2 = torch.randint(119, 128, (num_experts, hidden, inter // MXFP4_GROUP), dtype=torch.uint8, generator=g)
    ckpt = [t.to(DEVICE) for t in (w13, s13.view(torch.float8_e8m0fnu), w2, s2.view(torch.float8_e8m0fnu))]
    layer = [t.clone() for t in ckpt]
    moe.repack_w13_(layer[0], layer[1])
    return ckpt, layer


def make_routing(batch, pattern, num_experts=NUM_EXPERTS, seed=1):
    g = torch.Generator().manual_seed(seed)
    if pattern == "random":  # distinct experts per token; the last expert gets no rows
        ids = torch.stack([torch.randperm(num_experts - 1, generator=g)[:TOP_K] for _ in range(batch)]) \
            if batch else torch.empty(0, TOP_K, dtype=torch.int64)
    elif pattern == "skewed":  # every token hits expert 2, the rest two experts
        ids = torch.randint(4, 6, (batch, TOP_K), generator=g)
        ids[:, 0] = 2
    elif pattern == "invalid":  # -1 / out-of-range ids (padding) contribute nothing
        ids = torch.randint(0, num_experts, (batch, TOP_K), generator=g)
        ids[::2, 1] = -1
        ids[:, 3] = num_experts + 2
    elif pattern == "all_invalid":
        ids = torch.full((batch, TOP_K), -1)
    else:
        raise ValueError(pattern)
    weights = torch.rand(batch, TOP_K, generator=g) * 1.5
    x = (torch.randn(batch, HIDDEN, generator=g) * 2).to(torch.bfloat16)
    return x.to(DEVICE), weights.to(DEVICE), ids.to(torch.int32).to(DEVICE)


def relative_error(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def run_and_check(inter, batch, pattern, config, monkeypatch, limit=SWIGLU_LIMIT, seed=0):
    ckpt, layer = make_layer(inter, seed=seed)
    x, weights, ids = make_routing(batch, pattern, seed=seed + 1)
    ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids, swiglu_limit=limit)
    poison_empty(monkeypatch)
    out = torch.full_like(x, float("nan"))
    got = mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, limit, out=out, config=config)
    assert got is out
    assert torch.isfinite(out.float()).all()
    return out, ref, ckpt, x, ids


SMALL = (P(16, 32, 64, 4, 2), P(16, 64, 32, 4, 2))


@pytest.mark.parametrize("inter", INTERS)
@pytest.mark.parametrize("pattern", ["random", "skewed"])
def test_every_inter(inter, pattern, monkeypatch):
    out, ref, *_ = run_and_check(inter, 13, pattern, SMALL, monkeypatch)
    assert relative_error(out, ref) < TOLERANCE


@pytest.mark.parametrize("config", [
    SMALL, (P(32, 16, 32, 4, 3), P(64, 32, 64, 4, 2)), (mp.SMALL_ROWS_TILE,) * 2, (mp.MEDIUM_ROWS_TILE,) * 2],
                         ids=["small", "other", "shipped_32_rows", "shipped_64_rows"])
def test_invalid_ids_and_clamp(config, monkeypatch):
    ckpt, layer = make_layer(64, seed=3)
    x, weights, ids = make_routing(9, "invalid", seed=4)
    # the clamp is active: some gate / up pre-activations exceed the limit
    valid = ids[(ids >= 0) & (ids < NUM_EXPERTS)].unique()
    gate_up = x.float() @ moe.reference_dequant_mxfp4(ckpt[0][valid[0]], ckpt[1][valid[0]]).T
    assert gate_up.abs().max() > SWIGLU_LIMIT
    out, ref, *_ = run_and_check(64, 9, "invalid", config, monkeypatch, seed=3)
    assert relative_error(out, ref) < TOLERANCE


def test_no_clamp(monkeypatch):
    out, ref, *_ = run_and_check(32, 7, "random", SMALL, monkeypatch, limit=0.0)
    assert relative_error(out, ref) < TOLERANCE


def test_all_invalid_gives_zeros(monkeypatch):
    out, ref, *_ = run_and_check(32, 5, "all_invalid", SMALL, monkeypatch)
    assert torch.equal(out.float(), torch.zeros_like(ref))


def test_top_k_zero_gives_zeros():
    """No expert per token: the sum over none, written (the output was once left as it was)."""
    _ckpt, layer = make_layer(32)
    x, _weights, _ids = make_routing(3, "random")
    out = torch.full_like(x, float("nan"))
    mp.moe_mxfp4_prefill_forward(x, *layer, torch.empty(3, 0, device=DEVICE),
                                 torch.empty(3, 0, dtype=torch.int32, device=DEVICE), out=out, config=SMALL)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("batch", [0, 1])
def test_tiny_batches(batch, monkeypatch):
    ckpt, layer = make_layer(32)
    x, weights, ids = make_routing(batch, "random")
    out = mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, config=SMALL)
    assert out.shape == x.shape
    if batch:
        assert relative_error(out, moe.reference_moe_mxfp4(x, *ckpt, weights, ids)) < TOLERANCE


def test_prefill_sizes_torch_routing(monkeypatch):
    """More than DECODE_MAX_ROWS routed rows (routing by torch sort), the shipped tiles for that many rows (64-row
    blocks) clipped to a small I, experts spanning several row blocks."""
    batch = moe.DECODE_MAX_ROWS // TOP_K + 20
    out, ref, *_ = run_and_check(32, batch, "skewed", None, monkeypatch)
    assert batch * TOP_K > moe.DECODE_MAX_ROWS
    assert relative_error(out, ref) < TOLERANCE


def test_same_as_old_path():
    """At the same shapes the old tl.dot_scaled path and the new forward agree closely."""
    ckpt, layer = make_layer(64, seed=5)
    x, weights, ids = make_routing(10, "random", seed=6)
    old = moe.moe_mxfp4_forward(x, *layer, weights, ids, upcast="dot_scaled")
    new = mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, config=SMALL)
    assert relative_error(new, old.float()) < 1e-2


PLANES = (P(16, 32, 128, 4, 2, planes=True), P(16, 64, 64, 4, 2, planes=True))


@pytest.mark.parametrize("inter", INTERS)
@pytest.mark.parametrize("pattern", ["random", "skewed"])
def test_byte_planes_every_inter(inter, pattern, monkeypatch):
    """Both launches on byte planes (x and the SwiGLU rows in the byte-plane order), K steps of 128 / 64 clipped to
    the per-rank I where it is shorter (one or two groups a step)."""
    out, ref, *_ = run_and_check(inter, 13, pattern, PLANES, monkeypatch)
    assert relative_error(out, ref) < TOLERANCE


@pytest.mark.parametrize("config", [
    (PLANES[0], SMALL[1]), (SMALL[0], PLANES[1]),
    (P(32, 16, 32, 4, 3, planes=True), P(16, 32, 128, 4, 2, planes=True))],
    ids=["planes_gate_up_only", "planes_down_only", "one_group_steps"])
def test_byte_planes_beside_pair_order_and_clamp(config, monkeypatch):
    """Either launch alone on byte planes (the gate/up stores the SwiGLU rows in the order the down reads), invalid
    ids, the clamp active; the same output as the pair-order tiles up to float32 summation order."""
    out, ref, ckpt, x, ids = run_and_check(64, 9, "invalid", config, monkeypatch, seed=3)
    assert relative_error(out, ref) < TOLERANCE
    _ckpt, layer = make_layer(64, seed=3)
    _x, weights, _ids = make_routing(9, "invalid", seed=4)
    pairs = mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids,
                                         config=tuple(dataclasses.replace(c, planes=False) for c in config))
    assert relative_error(out, pairs.float()) < 1e-3


def test_x_planes_copy_keeps_each_value_in_its_group():
    """The byte-plane copy of x: within each 32-value group the even values first, then the odd ones, each times
    2**32 (exact); a ragged last block of the copy is masked."""
    x = (torch.arange(3 * 160, dtype=torch.float32) % 251 - 125).to(torch.bfloat16).reshape(3, 160).to(DEVICE)
    out = torch.full_like(x, float("nan"))
    mp._x_pairs_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128, PLANES=True)
    k = torch.arange(160)
    position = k - k % 32 + 16 * (k % 2) + (k % 32) // 2
    expected = torch.empty_like(x)
    expected[:, position] = (x.float() * 2.0 ** 32).to(torch.bfloat16)
    assert torch.equal(out, expected)
    assert position[:4].tolist() == [0, 16, 1, 17] and sorted(position.tolist()) == list(range(160))


def test_register_cap_is_a_launch_option_only():
    """A tile with max_registers runs the same kernel (the cap goes to ptxas as maxnreg): the same output bits,
    and the cap shows in the label."""
    ckpt, layer = make_layer(64, seed=7)
    x, weights, ids = make_routing(11, "skewed", seed=8)
    capped = tuple(dataclasses.replace(cfg, max_registers=128) for cfg in SMALL)
    assert [cfg.label() for cfg in capped] == ["m16n32k64w4s2r128", "m16n64k32w4s2r128"]
    assert capped[0].launch_options() == {"num_warps": 4, "num_stages": 2, "maxnreg": 128}
    assert SMALL[0].launch_options() == {"num_warps": 4, "num_stages": 2}
    plain = mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, config=SMALL)
    got = mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, config=capped)
    assert torch.equal(got, plain)
    assert relative_error(got, moe.reference_moe_mxfp4(x, *ckpt, weights, ids)) < TOLERANCE


@pytest.mark.parametrize("cap", [-1, 16, 23, 256])
def test_register_cap_out_of_ptxas_range_is_refused(cap):
    _ckpt, layer = make_layer(32)
    x, weights, ids = make_routing(4, "random")
    bad = (dataclasses.replace(SMALL[0], max_registers=cap), SMALL[1])
    with pytest.raises(ValueError, match=r"config\[0\] \(gate/up\): max_registers must be 0"):
        mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, config=bad)


def test_bad_inputs():
    ckpt, layer = make_layer(32)
    x, weights, ids = make_routing(4, "random")
    with pytest.raises(ValueError, match="config must be"):
        mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, config=SMALL[0])
    with pytest.raises(ValueError, match="PrefillConfig"):
        mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, config=(moe.GemmConfig(16, 16, 64, 4, 2),) * 2)
    with pytest.raises(ValueError, match="powers of two"):
        mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, config=(P(24, 32, 64, 4, 2),) * 2)
    _, layer512 = make_layer(512)
    with pytest.raises(ValueError, match=r"config\[1\] \(down\): the byte-plane tile takes block_k in"):
        mp.moe_mxfp4_prefill_forward(x, *layer512, weights, ids, config=(SMALL[0], P(16, 32, 256, 4, 2, planes=True)))
    _, layer768 = make_layer(768)
    with pytest.raises(ValueError, match="must divide"):  # 512 columns do not tile I = 768
        mp.moe_mxfp4_prefill_forward(x, *layer768, weights, ids, config=(P(16, 512, 64, 4, 2), SMALL[1]))
    with pytest.raises(ValueError, match="out must be"):
        mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids, out=torch.empty(4, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="x must be"):
        mp.moe_mxfp4_prefill_forward(x.float(), *layer, weights, ids)
    with pytest.raises(ValueError, match="topk_ids"):
        mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids[:, :2].float())
    with pytest.raises(ValueError, match="w2 must be"):
        mp.moe_mxfp4_prefill_forward(x, layer[0], layer[1], layer[2][:, :, :4], layer[3], weights, ids)


def test_prefill_default_only_where_measured():
    for tp in SUPPORTED_TP:
        inter = MOE_INTERMEDIATE_SIZE // tp
        assert not mp.prefill_default(moe.DECODE_MAX_ROWS, inter)
        measured = [rows for where_inter, rows in mp.PREFILL_DEFAULT_WHERE if where_inter == inter]
        assert mp.prefill_default(4096 * 6, inter) == any(4096 * 6 >= rows for rows in measured)
    for where_inter, rows in mp.PREFILL_DEFAULT_WHERE:
        assert rows > moe.DECODE_MAX_ROWS
        assert mp.prefill_default(rows, where_inter)


@pytest.mark.parametrize("tokens,block_m", [(512, 32), (1024, 32), (1025, 64), (2048, 64), (2049, 128), (4096, 128)])
def test_row_block_follows_routed_rows(tokens, block_m):
    """The default tiles' row block by routed rows (PREFILL_ROW_TILES: 32 up to 1024 tokens x top-6, 64 up to 2048,
    128 above), the same at every per-rank I; both launches of a class share it."""
    for tp in SUPPORTED_TP:
        gu, dn = mp.prefill_configs(tokens * 6, MOE_INTERMEDIATE_SIZE // tp)
        assert (gu.block_m, dn.block_m) == (block_m, block_m)


@pytest.mark.parametrize("major,capped", [(9, True), (12, False), (8, False), (10, False)])
def test_register_caps_only_where_measured(monkeypatch, major, capped):
    """The 128- and 64-row tiles take ptxas register caps on compute capability 9 only (timed there; on sm_120a they
    spill), at every T; the 32-row class and every other device keep the uncapped tiles, and no device or the CPU
    too."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    gpu = torch.device("cuda", 0)
    assert mp.register_caps_measured(gpu) is capped
    for tp in SUPPORTED_TP:
        inter = MOE_INTERMEDIATE_SIZE // tp
        for tokens, caps in ((4096, (128, 168)), (2048, (168, 96)), (1024, (0, 0)), (512, (0, 0))):
            gu, dn = mp.prefill_configs(tokens * 6, inter, gpu)
            assert (gu.max_registers, dn.max_registers) == (caps if capped else (0, 0))
            uncapped = mp.prefill_configs(tokens * 6, inter)
            assert (dataclasses.replace(gu, max_registers=0), dataclasses.replace(dn, max_registers=0)) == uncapped
            assert all(cfg.max_registers == 0 for cfg in uncapped)
    for device in (None, "cpu", torch.device("cpu")):
        assert not mp.register_caps_measured(device)
        assert mp.prefill_configs(4096 * 6, 2048, device) == (mp.DEFAULT_GATE_UP, mp.DEFAULT_DOWN)


def test_forward_asks_for_its_input_device(monkeypatch):
    seen = []
    choose = mp.prefill_configs
    monkeypatch.setattr(mp, "prefill_configs", lambda *a: seen.append(a) or choose(*a))
    _ckpt, layer = make_layer(32)
    x, weights, ids = make_routing(4, "random")
    mp.moe_mxfp4_prefill_forward(x, *layer, weights, ids)
    assert seen == [(4 * ids.shape[1], 32, x.device)]


def test_aot_configs_cover_every_tp():
    configs = mp.aot_configs()
    names = [c.name for c in configs]
    assert len(names) == len(set(names)) and configs
    for cfg in configs:
        if cfg.max_registers and not cfg.constexprs["PLANES"]:  # capability-9 caps: wgmma, checked for sm_90a only
            assert cfg.archs == (90,) and cfg.expect_opcodes == ("HGMMA",)
        else:
            assert "HMMA.16816.F32.BF16" in cfg.expect_opcodes and 120 in cfg.archs
    for (kind, cfg), cap in mp.WARPGROUP_MMA_REGISTER_CAPS.items():
        assert f"moe_prefill_{kind}_{dataclasses.replace(cfg, max_registers=cap).label()}" in names
    for tp in SUPPORTED_TP:
        inter = MOE_INTERMEDIATE_SIZE // tp
        for tokens in (512, 2048, 4096):
            gu, dn = mp.prefill_configs(tokens * 6, inter)
            gu, dn = gu.fitted(inter, HIDDEN_SIZE), dn.fitted(HIDDEN_SIZE, inter)
            assert inter % gu.block_n == 0
            assert inter % dn.block_k == 0
            assert f"moe_prefill_gate_up_{gu.label()}" in names and f"moe_prefill_down_{dn.label()}" in names
