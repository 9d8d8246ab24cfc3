"""The bench's fused common-stage kernels (RMSNorm, router, clamped SwiGLU, combine, the indexer's query quantisation) against their
float32 references under the CPU interpreter: fresh random inputs, NaN-poisoned outputs, B = 0, 1
and odd row counts, strided rows, router ties, and input validation."""

import pytest
import torch

from sglang_sm120.kernels import bench_common as bc
from sglang_sm120.kernels import moe_mxfp4, pdl
from sglang_sm120.kernels.dsv4 import ROUTED_SCALING_FACTOR, SWIGLU_LIMIT

from ..conftest import DEVICE

BF16_TOL = 2 ** -8  # one bf16 rounding of the fp32 result


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def poisoned(*shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def randn(*shape, gen, scale=1.0, dtype=torch.bfloat16):
    return (scale * torch.randn(*shape, generator=gen)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("rows", [0, 1, 5])
@pytest.mark.parametrize("width", [64, 96, 512])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("weight", [False, True])
def test_rms_norm(rows, width, residual, weight):
    gen = torch.Generator().manual_seed(rows * 1000 + width + 10 * residual + weight)
    x = randn(rows, width, gen=gen, scale=3.0)
    r = randn(rows, width, gen=gen) if residual else None
    w = (1 + 0.1 * torch.randn(width, generator=gen)).to(torch.bfloat16).to(DEVICE) if weight else None
    out = poisoned(rows, width)
    got = bc.rms_norm(x, w, r, out=out)
    assert got is out and got.dtype == torch.bfloat16 and got.shape == (rows, width)
    ref = bc.reference_rms_norm(x, w, r)
    assert not got.isnan().any()
    if rows:
        assert rel_err(got, ref) < BF16_TOL
        # each element is the reference rounded once to bf16 (up to fp32 summation order)
        torch.testing.assert_close(got.float(), ref.to(torch.bfloat16).float(), rtol=2 ** -7, atol=1e-6)


def test_rms_norm_strided_rows_and_heads():
    """q_norm reads a column slice of qkv (row stride > width); the per-head norm a [B*H, D] view."""
    gen = torch.Generator().manual_seed(7)
    qkv = randn(3, 160, gen=gen)
    w = (1 + 0.1 * torch.randn(96, generator=gen)).to(torch.bfloat16).to(DEVICE)
    got = bc.rms_norm(qkv[:, :96], w)
    assert rel_err(got, bc.reference_rms_norm(qkv[:, :96], w)) < BF16_TOL
    heads = randn(2, 1, 4, 64, gen=gen)
    got = bc.rms_norm(heads.view(-1, 64)).view(2, 1, 4, 64)
    ref = bc.reference_rms_norm(heads.view(-1, 64)).view(2, 1, 4, 64)
    assert rel_err(got, ref) < BF16_TOL


def test_rms_norm_validation():
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="x"):
        bc.rms_norm(x.float())
    with pytest.raises(ValueError, match="x"):
        bc.rms_norm(x.t())  # last dim not contiguous
    with pytest.raises(ValueError, match="weight"):
        bc.rms_norm(x, torch.ones(32, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match="residual"):
        bc.rms_norm(x, None, torch.zeros(3, 64, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match="out"):
        bc.rms_norm(x, out=torch.empty(2, 64, device=DEVICE))


@pytest.mark.parametrize("rows", [0, 1, 7])
@pytest.mark.parametrize("experts,top_k", [(16, 6), (256, 6), (40, 1)])
def test_route(rows, experts, top_k):
    gen = torch.Generator().manual_seed(rows * 100 + experts + top_k)
    # a wide logit range exercises every softplus branch (x > 20, tiny exp(x), the log1p form)
    logits = (8 * torch.randn(rows, experts, generator=gen)).to(DEVICE)
    if rows:
        logits[0, :3] = torch.tensor([-40.0, 25.0, -90.0])
    bias = (0.05 * torch.randn(experts, generator=gen)).to(DEVICE)
    ids, w = poisoned(rows, top_k, dtype=torch.float32).to(torch.int32), poisoned(rows, top_k, dtype=torch.float32)
    ids.fill_(-12345)
    got_ids, got_w = bc.route(logits, bias, top_k, ROUTED_SCALING_FACTOR, out_ids=ids, out_weights=w)
    assert got_ids is ids and got_w is w
    ref_ids, ref_w = bc.reference_route(logits, bias, top_k, ROUTED_SCALING_FACTOR)
    assert torch.equal(got_ids.long(), ref_ids)
    torch.testing.assert_close(got_w, ref_w, rtol=1e-5, atol=1e-6)
    if rows:
        torch.testing.assert_close(got_w.sum(-1), torch.full((rows,), ROUTED_SCALING_FACTOR, device=DEVICE))


def test_route_ties_lower_index_first():
    """Equal biased scores: the lower expert index is taken first (a stable descending sort)."""
    experts, top_k = 32, 6
    logits = torch.zeros(3, experts, device=DEVICE)
    logits[1, [3, 9, 20, 30]] = 2.0  # four tied winners, then ties among the rest
    logits[2] = torch.arange(experts, device=DEVICE).remainder(4).float()  # ties across the whole row
    bias = torch.zeros(experts, device=DEVICE)
    ids, w = bc.route(logits, bias, top_k, 1.0)
    assert ids[0].tolist() == [0, 1, 2, 3, 4, 5]
    assert ids[1].tolist() == [3, 9, 20, 30, 0, 1]
    assert ids[2].tolist() == [3, 7, 11, 15, 19, 23]
    assert torch.equal(ids.long(), bc.reference_route(logits, bias, top_k, 1.0)[0])
    torch.testing.assert_close(w[0], torch.full((top_k,), 1.0 / top_k, device=DEVICE))


def test_route_matches_torch_topk_without_ties():
    gen = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(4, 64, generator=gen).to(DEVICE), (0.1 * torch.randn(64, generator=gen)).to(DEVICE)
    ids, _ = bc.route(logits, bias, 6, ROUTED_SCALING_FACTOR)
    scores = torch.sqrt(torch.nn.functional.softplus(logits))
    assert torch.equal(ids.long(), torch.topk(scores + bias, 6, dim=-1).indices)


def test_route_bf16_logits():
    """The gate GEMM's bf16 output is routed as its exact fp32 value (no cast launch needed)."""
    gen = torch.Generator().manual_seed(11)
    logits = randn(5, 48, gen=gen, scale=4.0)
    bias = (0.05 * torch.randn(48, generator=gen)).to(DEVICE)
    ids, w = bc.route(logits, bias, 6, ROUTED_SCALING_FACTOR)
    ref_ids, ref_w = bc.route(logits.float(), bias, 6, ROUTED_SCALING_FACTOR)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=0)


def test_route_validation():
    logits, bias = torch.zeros(2, 16, device=DEVICE), torch.zeros(16, device=DEVICE)
    with pytest.raises(ValueError, match="logits"):
        bc.route(logits.half(), bias, 6, 1.0)
    with pytest.raises(ValueError, match="bias"):
        bc.route(logits, torch.zeros(8, device=DEVICE), 6, 1.0)
    with pytest.raises(ValueError, match="top_k"):
        bc.route(logits, bias, 17, 1.0)
    with pytest.raises(ValueError, match="out_ids"):
        bc.route(logits, bias, 6, 1.0, out_ids=torch.zeros(2, 6, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("rows", [0, 1, 6])
@pytest.mark.parametrize("inter", [64, 1500])
@pytest.mark.parametrize("limit", [SWIGLU_LIMIT, 0.0])
def test_swiglu(rows, inter, limit):
    gen = torch.Generator().manual_seed(rows + inter)
    gate_up = randn(rows, 2 * inter, gen=gen, scale=8.0)  # well past the clamp
    out = poisoned(rows, inter)
    got = bc.swiglu(gate_up, limit, out=out)
    assert got is out and not got.isnan().any()
    ref = bc.reference_swiglu(gate_up, limit)
    gate, up = gate_up.float().chunk(2, dim=-1)
    torch.testing.assert_close(ref, moe_mxfp4.reference_swiglu(gate, up, limit))  # the same specification
    if rows:
        torch.testing.assert_close(got.float(), ref, rtol=2 ** -7, atol=1e-5)


def test_swiglu_validation():
    with pytest.raises(ValueError, match="gate_up"):
        bc.swiglu(torch.zeros(2, 7, dtype=torch.bfloat16, device=DEVICE), SWIGLU_LIMIT)
    with pytest.raises(ValueError, match="gate_up"):
        bc.swiglu(torch.zeros(2, 8, device=DEVICE), SWIGLU_LIMIT)


@pytest.mark.parametrize("rows", [0, 1, 3])
@pytest.mark.parametrize("width", [256, 1100])
def test_combine(rows, width):
    gen = torch.Generator().manual_seed(rows * 7 + width)
    x, a, b, c = (randn(rows, width, gen=gen, scale=s) for s in (4.0, 1.0, 0.5, 0.25))
    out = poisoned(rows, width)
    got = bc.combine(x, a, b, c, out=out)
    assert got is out and not got.isnan().any()
    if rows:
        torch.testing.assert_close(got.float(), bc.reference_combine(x, a, b, c), rtol=2 ** -7, atol=1e-5)


def test_combine_validation():
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="^c:"):
        bc.combine(x, x, x, torch.zeros(2, 32, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match="^b:"):
        bc.combine(x, x, x.float(), x)


@pytest.mark.parametrize("capability, expected", [((8, 0), False), ((9, 0), True), ((12, 0), True)])
def test_pdl_only_on_gpus_with_griddepcontrol(monkeypatch, capability, expected):
    assert not bc.launch_with_pdl(torch.device("cpu"), True)
    monkeypatch.setattr(pdl, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    pdl.clear_cache()  # the capability is cached per device index; each parameter fakes another GPU
    assert bc.launch_with_pdl(torch.device("cuda", 0), True) is expected
    assert bc.launch_with_pdl(torch.device("cuda", 0), False) is False
    assert not bc.launch_with_pdl(torch.device("cpu"), True)
    pdl.clear_cache()  # no faked capability outlives the test


class _LaunchRecorder:
    """Stands in for a jitted kernel: records the keyword arguments of each ``kernel[grid](...)`` launch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(kwargs)


def _launcher(kernel):
    """A call of the public function that launches ``kernel`` once, passing on the ``pdl`` keyword if given."""
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=DEVICE)
    logits, bias = torch.zeros(2, 16, device=DEVICE), torch.zeros(16, device=DEVICE)
    return {"_rms_norm_kernel": lambda **pdl: bc.rms_norm(x, x[0], residual=x, **pdl),
            "_route_kernel": lambda **pdl: bc.route(logits, bias, 6, 1.0, **pdl),
            "_swiglu_kernel": lambda **pdl: bc.swiglu(x, SWIGLU_LIMIT, **pdl),
            "_combine_kernel": lambda **pdl: bc.combine(x, x, x, x, **pdl),
            "_index_q_quant_kernel": lambda **pdl: bc.index_q_quant(x.view(2, 4, 16), x[:, :4], 1.0, **pdl)}[kernel]


@pytest.mark.parametrize("kernel", ["_rms_norm_kernel", "_route_kernel", "_swiglu_kernel", "_combine_kernel",
                                    "_index_q_quant_kernel"])
@pytest.mark.parametrize("supported", [False, True])
def test_pdl_flag_reaches_the_launch(monkeypatch, kernel, supported):
    """The PDL decision reaches both the launch attribute and the kernel's wait/trigger (constexpr PDL):
    on by default where the device supports it, off when asked or where it does not."""
    recorder = _LaunchRecorder()
    monkeypatch.setattr(bc, kernel, recorder)
    monkeypatch.setattr(bc, "pdl_supported", lambda device: supported)
    launch = _launcher(kernel)
    launch()  # the default
    launch(pdl=False)
    assert [(k["PDL"], k["launch_pdl"]) for k in recorder.launches] == [(supported, supported), (False, False)]


@pytest.mark.parametrize("rows", [0, 1, 3])
@pytest.mark.parametrize("heads, dim", [(64, 128), (5, 48)])
def test_index_q_quant(rows, heads, dim):
    gen = torch.Generator().manual_seed(rows * 31 + heads + dim)
    q = randn(rows, heads, dim, gen=gen, scale=4.0)
    if rows:
        q[0, 0] = 0.0  # an all-zero row: the amax floor keeps the scale finite
    weights = randn(rows, heads, gen=gen)
    q_fp8, w_out = bc.index_q_quant(q, weights, 0.125)
    assert q_fp8.shape == (rows, heads, dim) and q_fp8.dtype == torch.float8_e4m3fn
    assert w_out.shape == (rows, heads) and w_out.dtype == torch.float32
    if not rows:
        return
    scaled, scale, w_ref = bc.reference_index_q_quant(q, weights, 0.125)
    # e4m3 of q / scale, nearest-even, exactly; the weights carry the per-row scale
    assert torch.equal(q_fp8.float(), scaled.to(torch.float8_e4m3fn).float())
    torch.testing.assert_close(w_out, w_ref, rtol=1e-6, atol=0)
    assert q_fp8.float().abs().amax() <= 448.0 and (q_fp8[0, 0].float() == 0).all()
    assert scale[0, 0] == pytest.approx(bc.INDEX_Q_AMAX_FLOOR / 448.0)
    # the quantised query times its scale stays within e4m3's rounding of q
    torch.testing.assert_close(q_fp8.float() * scale[..., None], q.float(), rtol=2 ** -4, atol=scale.max().item())


def test_index_q_quant_validation():
    q = torch.zeros(2, 4, 8, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="^q:"):
        bc.index_q_quant(q.float(), torch.zeros(2, 4, dtype=torch.bfloat16, device=DEVICE), 1.0)
    with pytest.raises(ValueError, match="^weights:"):
        bc.index_q_quant(q, torch.zeros(2, 5, dtype=torch.bfloat16, device=DEVICE), 1.0)


def test_index_q_quant_rounds_like_torch_across_e4m3s_range():
    """Every magnitude e4m3 has, subnormals and the carry into the next binade included, rounds as torch's
    fp32 -> float8_e4m3fn cast does (nearest-even)."""
    grid = torch.tensor([0.0, 2 ** -10, 2 ** -9, 1.5 * 2 ** -9, 2.5 * 2 ** -9, 7.69 * 2 ** -9, 7.5 * 2 ** -9,
                         15.5 * 2 ** -10, 1.0, 1.0625, 1.1875, 15.5, 240.0, 247.9, 300.0, 447.0])
    row = torch.cat([grid, -grid, torch.linspace(-448, 448, 128 - 2 * grid.numel() - 1), torch.tensor([448.0])])
    q = row.to(torch.bfloat16).view(1, 1, -1).to(DEVICE)
    q_fp8, _ = bc.index_q_quant(q, torch.ones(1, 1, dtype=torch.bfloat16, device=DEVICE), 1.0)
    scaled, _, _ = bc.reference_index_q_quant(q, torch.ones(1, 1, dtype=torch.bfloat16), 1.0)
    assert torch.equal(q_fp8.float().cpu(), scaled.to(torch.float8_e4m3fn).float())
