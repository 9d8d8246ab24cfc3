"""The ``bf16_linear`` seam against the installed SGLang 0.5.23 (no mocks of SGLang's code), on CPU under
the Triton interpreter:

* with the seam active, SGLang's own ``Compressor._compute_wkv_gate`` reaches the bf16 GEMV at
  1..COMPRESSOR_MAX_ROWS rows (float32 out, as ``linear_bf16_fp32`` returns) and upstream's
  ``linear_bf16_fp32`` above; SGLang's ``C4Indexer.compute_weights`` with a real unquantised
  ``ReplicatedLinear`` reaches it at 1..WEIGHTS_PROJ_MAX_ROWS rows (bf16 out, the scale applied or skipped);
* every result against the float32 reference, and equal in dtype and shape to upstream's;
* with the kill switch, or calls the GEMV does not take (more rows, a non-bf16 weight, an opted-in
  upstream GEMM algorithm), upstream's own code runs.
"""

from types import SimpleNamespace

import pytest
import torch

from sglang_sm120 import bf16_linear as seam_module
from sglang_sm120.kernels import bf16_gemv
from sglang_sm120.seams import SeamState

HIDDEN, GATE_OUT, HEADS = 256, 64, 16  # reduced: K of 256, a [64, 256] wkv_gate, 16 index heads


@pytest.fixture
def seam(install_seam):
    return install_seam(seam_module.make_seam())


@pytest.fixture
def gemv_calls(monkeypatch):
    class Calls(list):  # (x shape, out dtype) per call; ``shares``: each call's share_sms
        shares: list

    calls = Calls()
    calls.shares = []
    real = bf16_gemv.bf16_linear

    def counting(x, weight, **kwargs):
        calls.append((tuple(x.shape), kwargs.get("out_dtype")))
        calls.shares.append(kwargs.get("share_sms", False))
        return real(x, weight, **kwargs)
    monkeypatch.setattr(bf16_gemv, "bf16_linear", counting)
    return calls


def randn(*shape, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen)).to(torch.bfloat16)


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def compressor_gate(x, weight):
    """SGLang's Compressor._compute_wkv_gate (as installed, hooks included) on a compressor whose wkv_gate
    holds ``weight``."""
    from sglang.srt.layers.attention.dsv4.compressor import Compressor

    return Compressor._compute_wkv_gate(SimpleNamespace(wkv_gate=SimpleNamespace(weight=weight)), x)


@pytest.mark.parametrize("rows", list(range(1, seam_module.COMPRESSOR_MAX_ROWS + 1)) + [
    seam_module.COMPRESSOR_MAX_ROWS + 1, 16])
def test_compressor_gate_reaches_the_gemv(seam, gemv_calls, rows):
    s = seam({"SGLANG_SM120_FORCE": "1"})
    assert s.state is SeamState.ACTIVE, s.reason
    x, w = randn(rows, HIDDEN, seed=rows), randn(GATE_OUT, HIDDEN, seed=100, scale=0.05)
    y = compressor_gate(x, w)
    ours = rows <= seam_module.COMPRESSOR_MAX_ROWS
    assert gemv_calls == ([((rows, HIDDEN), torch.float32)] if ours else [])
    assert y.dtype == torch.float32 and y.shape == (rows, GATE_OUT)  # linear_bf16_fp32's contract
    assert rel_err(y, x.float() @ w.float().t()) < 1e-5


def test_compressor_in_the_multi_stream_prepare_shares_the_sms(seam, gemv_calls):
    """Inside the seam's hook around SGLang's MQALayer._forward_prepare_multi_stream (registered through the
    HookRegistry; upstream's body, which needs a live model, stood in for) the compressor's wkv_gate asks the GEMV
    for its SM-sharing tile; before and after it, and after the prepare raised, it does not."""
    seam({"SGLANG_SM120_FORCE": "1"})
    x, w = randn(1, HIDDEN, seed=3), randn(GATE_OUT, HIDDEN, seed=4, scale=0.05)
    seen = []

    def fake_layer_prepare(self, *args, **kwargs):  # stands in for upstream's body, which needs a live model
        seen.append(compressor_gate(x, w))
        if kwargs.get("fail"):
            raise RuntimeError("prepare failed")
        return "q"
    compressor_gate(x, w)
    assert seam_module.prepare_multi_stream_hook(fake_layer_prepare, None) == "q"
    with pytest.raises(RuntimeError, match="prepare failed"):
        seam_module.prepare_multi_stream_hook(fake_layer_prepare, None, fail=True)
    compressor_gate(x, w)
    assert gemv_calls.shares == [False, True, True, False]
    # at this reduced width no sharing tile is listed: the same tile, the same bits
    assert torch.equal(seen[0], compressor_gate(x, w))
    # SGLang's MQALayer method is patched with this hook (AROUND) through the public HookRegistry
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    assert seam_module.PREPARE_MULTI_STREAM in HookRegistry._patched
    assert (HookType.AROUND, seam_module.prepare_multi_stream_hook) in [
        (kind, hook) for kind, hook, _src in HookRegistry._hooks[seam_module.PREPARE_MULTI_STREAM]]


def test_kill_switch_keeps_upstreams_compressor_gate(seam, gemv_calls):
    s = seam({"SGLANG_SM120_FORCE": "1", "SGLANG_SM120_DISABLE": "bf16_linear"})
    assert s.state is SeamState.DISABLED_BY_ENV
    x, w = randn(2, HIDDEN, seed=1), randn(GATE_OUT, HIDDEN, seed=2)
    y = compressor_gate(x, w)
    assert gemv_calls == [] and y.dtype == torch.float32


def test_opted_in_upstream_gemm_algorithm_is_respected(seam, gemv_calls, monkeypatch):
    from sglang.kernels.ops.gemm import bf16_fp32

    seam({"SGLANG_SM120_FORCE": "1"})
    monkeypatch.setattr(bf16_fp32, "_linear_bf16_fp32_algo", "deep_gemm")
    compressor_gate(randn(1, HIDDEN, seed=1), randn(GATE_OUT, HIDDEN, seed=2).float())  # fp32 weight: upstream
    assert gemv_calls == []
    # a bf16 weight with deep_gemm opted in: upstream's branch (which needs DeepGEMM, absent here)
    with pytest.raises(Exception):
        compressor_gate(randn(1, HIDDEN, seed=1), randn(GATE_OUT, HIDDEN, seed=2))
    assert gemv_calls == []


def test_non_bf16_weight_stays_upstream(seam, gemv_calls):
    seam({"SGLANG_SM120_FORCE": "1"})
    x, w = randn(2, HIDDEN, seed=1), randn(GATE_OUT, HIDDEN, seed=2).float()
    y = compressor_gate(x, w)
    assert gemv_calls == [] and y.dtype == torch.float32


def c4_indexer_with_weights_proj(weight):
    """SGLang's C4Indexer.compute_weights bound to an object holding a real unquantised ReplicatedLinear."""
    from sglang.srt.layers.attention.dsv4.indexer import C4Indexer
    from sglang.srt.layers.linear import ReplicatedLinear

    from .test_dense import parallel_overrides

    ctx, par = parallel_overrides()
    with ctx, par:
        proj = ReplicatedLinear(HIDDEN, HEADS, bias=False, quant_config=None, params_dtype=torch.bfloat16,
                                prefix="weights_proj")
    proj.weight.data.copy_(weight)
    holder = SimpleNamespace(weights_proj=proj, weight_scale=0.125)
    return lambda x, skip_scale: C4Indexer.compute_weights(holder, x, skip_scale=skip_scale)


@pytest.mark.parametrize("rows", [1, 3, seam_module.WEIGHTS_PROJ_MAX_ROWS, seam_module.WEIGHTS_PROJ_MAX_ROWS + 1])
@pytest.mark.parametrize("skip_scale", [True, False])
def test_weights_proj_reaches_the_gemv(seam, gemv_calls, rows, skip_scale):
    seam({"SGLANG_SM120_FORCE": "1"})
    w = randn(HEADS, HIDDEN, seed=7, scale=0.05)
    compute = c4_indexer_with_weights_proj(w)
    x = randn(rows, HIDDEN, seed=rows)
    y = compute(x, skip_scale)
    ours = rows <= seam_module.WEIGHTS_PROJ_MAX_ROWS
    assert gemv_calls == ([((rows, HIDDEN), torch.bfloat16)] if ours else [])
    assert y.dtype == torch.bfloat16 and y.shape == (rows, HEADS)  # as upstream's compute_weights returns
    ref = (x.float() @ w.float().t()) * (1.0 if skip_scale else 0.125)
    assert rel_err(y, ref) < 2 ** -7


def test_kill_switch_keeps_upstreams_weights_proj(seam, gemv_calls):
    seam({"SGLANG_SM120_FORCE": "1", "SGLANG_SM120_DISABLE": "all"})
    w = randn(HEADS, HIDDEN, seed=7, scale=0.05)
    y = c4_indexer_with_weights_proj(w)(randn(2, HIDDEN, seed=2), True)
    assert gemv_calls == [] and y.dtype == torch.bfloat16


def test_covers_names_what_it_refuses():
    x, w = randn(2, HIDDEN, seed=1), randn(GATE_OUT, HIDDEN, seed=2)
    assert seam_module.covers(x, w, 4)
    assert not seam_module.covers(x, w, 1)  # too many rows
    assert not seam_module.covers(x.float(), w, 4)
    assert not seam_module.covers(x[:, :HIDDEN // 2], w, 4)  # K mismatch
    assert not seam_module.covers(x, w.t().contiguous().t(), 4)  # weight not contiguous along K
    assert not seam_module.covers(x.view(1, 2, HIDDEN), w, 4)  # 3-D activations
    assert not seam_module.covers(x[:0], w, 4)  # no rows: upstream
    assert not seam_module.covers(x, None, 4)


def test_kernel_errors_fall_back_to_upstream(seam, monkeypatch):
    """The GEMV raising after the checks (a Triton compile or launch error) leaves the call to upstream's function
    instead of raising into SGLang."""
    s = seam({"SGLANG_SM120_FORCE": "1"})
    assert s.state is SeamState.ACTIVE, s.reason

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory 120000 > 101376")

    monkeypatch.setattr(bf16_gemv, "bf16_linear", broken)
    x, w = randn(2, HIDDEN, seed=7), randn(GATE_OUT, HIDDEN, seed=8, scale=0.05)
    y = compressor_gate(x, w)
    assert y.dtype == torch.float32 and rel_err(y, x.float() @ w.float().t()) < 1e-5
