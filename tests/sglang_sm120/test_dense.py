"""The ``dense`` seam against the installed SGLang 0.5.23 (no mocks of SGLang), on CPU under the
Triton interpreter:

* with the seam active (``SGLANG_SM120_FORCE=1``; SGLang's sm_120 setting of
  ``SGLANG_OPT_FP8_WO_A_GEMM=0`` emulated), SGLang's own ``MqaAttentionBase`` allocates ``wo_a`` in
  FP8 with block scales (no bf16 copy), SGLang's weight loader and ``_setup_fp8_wo_a_scales`` fill
  it, and SGLang's ``_apply_wo_a_bf16_matmul`` reaches the grouped FP8 kernel;
* SGLang's ``MQALayer``, built with the seam and run through its own ``forward`` (q/kv preparation,
  the attention backend and wo_b stubbed; ``fused_rope_inplace``, a CUDA JIT kernel, replaced by a
  counting CPU version), takes the fused inverse-RoPE branch: no RoPE launch where the RoPE is folded
  into the FP8 kernel, one where it is not (other rows, > 32 rows, kill switch); every output against
  the float32 reference with the same positions and freqs;
* SGLang's ``Fp8LinearMethod`` (through a ``ReplicatedLinear``) sends 1..16-row bf16 activations to
  the GEMV and larger row counts to upstream's linear;
* in a fresh process, the plugin's ``register()`` with the kill switch leaves every target as
  upstream wrote it (bf16 wo_a), and without it installs the hooks.
"""

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from sglang_sm120 import dense
from sglang_sm120.kernels import fp8_gemv
from sglang_sm120.seams import SeamState

from ..kernels.test_fp8_gemv import random_weight, rel_err

GROUPS, RANK, HEADS, HEAD_DIM = 2, 128, 4, 256  # reduced DSv4 attention: D = HEADS*HEAD_DIM/GROUPS = 512
ROPE_DIM = 32


@pytest.fixture
def seam(install_seam, monkeypatch):
    """The dense seam decided the way the plugin decides it, in this process, with SGLang's
    sm_120 default of no upstream FP8 wo_a GEMM."""
    import sglang.srt.models.deepseek_v4 as dsv4

    monkeypatch.setattr(dsv4, "_FP8_WO_A_GEMM", False)
    return install_seam(dense.make_seam())


def fp8_config():
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    return Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128])


def parallel_overrides():
    from sglang.srt.runtime_context import get_context, get_parallel

    return (get_context().override_server_args(model_path="dummy"),
            get_parallel().override(tp_size=1, tp_rank=0, attn_tp_size=1, attn_tp_rank=0))


def attention_config():
    """A reduced DeepSeek-V4 attention config (GROUPS x RANK o-LoRA, HEADS heads of HEAD_DIM)."""
    return SimpleNamespace(hidden_size=256, num_attention_heads=HEADS, head_dim=HEAD_DIM, qk_rope_head_dim=ROPE_DIM,
                           q_lora_rank=128, o_groups=GROUPS, o_lora_rank=RANK, num_key_value_heads=1,
                           compress_ratios=[0, 0], num_hidden_layers=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                           q_head_norm=True, model_type="deepseek_v4", rope_theta=10000, rope_scaling={},
                           compress_rope_theta=40000, window_size=128)


def build_attention(quant_config):
    import sglang.srt.models.deepseek_v4 as dsv4

    cfg = attention_config()
    ctx, par = parallel_overrides()
    with ctx, par:
        return dsv4.MqaAttentionBase(cfg, 0, quant_config, "model.layers.0.self_attn")


def test_wo_a_stays_fp8_and_reaches_grouped_kernel(seam):
    import sglang.srt.models.deepseek_v4 as dsv4

    assert seam({"SGLANG_SM120_FORCE": "1"}).state is SeamState.ACTIVE
    assert dsv4.wo_a_fp8_gemm_enabled(fp8_config())  # what DeepseekV4ForCausalLM stores: load keeps FP8
    layer = build_attention(fp8_config())
    wo_a = layer.wo_a
    d = HEADS * HEAD_DIM // GROUPS
    assert wo_a.weight.dtype == torch.float8_e4m3fn and tuple(wo_a.weight.shape) == (GROUPS * RANK, d)
    assert not any(p.dtype == torch.bfloat16 for p in wo_a.parameters())  # no bf16 copy anywhere
    assert wo_a.weight.untyped_storage().nbytes() == GROUPS * RANK * d  # half of upstream's bf16 weight
    assert layer.wo_a_fp8 is False and layer.sm120_fp8_wo_a  # forward takes _apply_wo_a_bf16_matmul

    # the checkpoint's FP8 tensors through SGLang's weight loaders, then its post-load scale layout
    w, s = random_weight(RANK, d, groups=GROUPS, gen=torch.Generator().manual_seed(0))
    wo_a.weight.weight_loader(wo_a.weight, w.reshape(GROUPS * RANK, d))
    wo_a.weight_scale_inv.weight_loader(wo_a.weight_scale_inv, s.reshape(GROUPS * RANK // 128, d // 128))
    model = SimpleNamespace(model=SimpleNamespace(layers=[SimpleNamespace(self_attn=layer)], start_layer=0,
                                                  end_layer=1))
    dsv4.DeepseekV4ForCausalLM._setup_fp8_wo_a_scales(model, is_nextn=False)
    assert tuple(wo_a.weight_scale_inv.shape) == (GROUPS, RANK // 128, d // 128)

    o = torch.randn(3, GROUPS, d, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    view = wo_a.weight.view(GROUPS, RANK, -1)  # exactly what MQALayer.forward passes
    with torch.inference_mode():
        y = dsv4._apply_wo_a_bf16_matmul(o, view, is_decode=True)
    assert y.shape == (3, GROUPS, RANK) and y.dtype == torch.bfloat16
    assert rel_err(y, fp8_gemv.reference_grouped_wo_a(o, w, s)) < 6e-3
    # a view of .data (not of the Parameter) still finds the scales
    assert torch.equal(dense.wo_a_scale(wo_a.weight.data.view(GROUPS, RANK, -1)), wo_a.weight_scale_inv.data)


def test_bf16_wo_a_and_inactive_seam_stay_upstream(seam):
    import sglang.srt.models.deepseek_v4 as dsv4

    seam({"SGLANG_SM120_FORCE": "1"})
    layer = build_attention(None)  # unquantised checkpoint: upstream's bf16 wo_a and einsum
    assert layer.wo_a.weight.dtype == torch.bfloat16 and not getattr(layer, "sm120_fp8_wo_a", False)
    o = torch.randn(2, GROUPS, 512).to(torch.bfloat16)
    w = torch.randn(GROUPS, RANK, 512).to(torch.bfloat16)
    assert torch.equal(dsv4._apply_wo_a_bf16_matmul(o, w, is_decode=True), torch.einsum("tgd,grd->tgr", o, w))

    assert seam({"SGLANG_SM120_FORCE": "1", "SGLANG_SM120_DISABLE": "dense"}).state is SeamState.DISABLED_BY_ENV
    assert not dsv4.wo_a_fp8_gemm_enabled(fp8_config())  # upstream's answer on sm_120
    layer = build_attention(fp8_config())
    assert layer.wo_a.weight.dtype == torch.bfloat16  # upstream dequantises wo_a at load


# --- inverse RoPE folded into wo_a: SGLang's MQALayer, built and run through its forward ---------------


def build_mqa_layer(quant_config, monkeypatch):
    """SGLang's ``MQALayer`` at the reduced shapes (SWA layer, no compressor). Its q/k RoPE module
    (``get_rope_wrapper``) is not used by the branch under test and needs a GPU kernel to build."""
    import sglang.srt.models.deepseek_v4 as dsv4

    monkeypatch.setattr(dsv4, "get_rope_wrapper", lambda **kwargs: None)
    cfg = attention_config()
    ctx, par = parallel_overrides()
    with ctx, par:
        return dsv4.MQALayer(cfg, 0, quant_config, "model.layers.0.self_attn")


def load_fp8_wo_a(layer, seed=0):
    """The checkpoint's FP8 wo_a through SGLang's weight loaders and post-load scale layout."""
    import sglang.srt.models.deepseek_v4 as dsv4

    d = HEADS * HEAD_DIM // GROUPS
    w, s = random_weight(RANK, d, groups=GROUPS, gen=torch.Generator().manual_seed(seed))
    layer.wo_a.weight.weight_loader(layer.wo_a.weight, w.reshape(GROUPS * RANK, d))
    layer.wo_a.weight_scale_inv.weight_loader(layer.wo_a.weight_scale_inv, s.reshape(GROUPS * RANK // 128, d // 128))
    model = SimpleNamespace(model=SimpleNamespace(layers=[SimpleNamespace(self_attn=layer)], start_layer=0,
                                                  end_layer=1))
    dsv4.DeepseekV4ForCausalLM._setup_fp8_wo_a_scales(model, is_nextn=False)
    return w, s


def torch_fused_rope_inplace(calls):
    """A CPU ``fused_rope_inplace`` (upstream's is a CUDA JIT kernel) with upstream's semantics:
    ``q *= freqs_cis[positions]`` (conjugated when inverse) on interleaved (re, im) pairs, in fp32,
    written back in q's dtype; each call is recorded."""
    def fused_rope_inplace(q, k, freqs_cis, positions, inverse=False):
        calls.append((tuple(q.shape), inverse))
        f = freqs_cis[positions.long()]
        f = f.conj() if inverse else f
        rotated = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2).contiguous()) * f[:, None, :]
        q.copy_(torch.view_as_real(rotated).flatten(-2).to(q.dtype))
    return fused_rope_inplace


def run_forward_tail(layer, attention_out, positions, monkeypatch):
    """``MQALayer.forward`` with the parts before the attention output (q/kv preparation, the attention
    backend) and wo_b stubbed: returns what reaches wo_b and the inverse-RoPE launches it made. The
    branch under test (inverse RoPE, fused or not, then wo_a) is SGLang's code as installed."""
    import sglang.srt.models.deepseek_v4 as dsv4

    rope_calls, backend_calls = [], []
    monkeypatch.setattr(dsv4, "fused_rope_inplace", torch_fused_rope_inplace(rope_calls))
    backend = SimpleNamespace(forward=lambda **kw: backend_calls.append(kw) or attention_out.clone())
    monkeypatch.setattr(dsv4, "get_attn_backend", lambda: backend)
    rows = attention_out.shape[0]
    monkeypatch.setattr(layer, "_forward_prepare", lambda *a, **k: (torch.zeros(rows, HEADS, HEAD_DIM), None),
                        raising=False)
    monkeypatch.setattr(layer, "_project_wo_b", lambda o, defer_all_reduce=False: o, raising=False)
    mode = SimpleNamespace(is_decode=lambda: True, is_target_verify=lambda: False, is_extend=lambda: False,
                           is_extend_without_speculative=lambda: False, is_decode_or_idle=lambda: True,
                           is_extend_or_draft_extend_or_mixed=lambda: False)
    with torch.inference_mode():
        out = layer.forward(torch.zeros(rows, 256, dtype=torch.bfloat16), positions,
                            SimpleNamespace(forward_mode=mode))
    assert len(backend_calls) == 1
    return out, rope_calls


def attention_output(rows, seed):
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(rows, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    return o, torch.randint(0, 4096, (rows,), generator=gen)


def freqs_of(layer):
    return torch.view_as_real(layer.freqs_cis).flatten(1)


@pytest.mark.parametrize("rows", [1, 2, 5, 32, 33])
def test_inverse_rope_folded_into_fp8_wo_a(seam, monkeypatch, rows):
    """GROUPS=2: up to 2 rows the RoPE is inside the FP8 kernel (no RoPE launch); 3..32 rows take the fused
    branch with upstream's RoPE launch inside the hook; over 32 rows upstream's separate RoPE + our wo_a.
    Every output against the float32 reference with the same positions and freqs."""
    import sglang.srt.models.deepseek_v4 as dsv4

    seam({"SGLANG_SM120_FORCE": "1"})
    layer = build_mqa_layer(fp8_config(), monkeypatch)
    assert layer.sm120_fp8_wo_a and layer.use_fused_wo_a is True
    w, s = load_fp8_wo_a(layer)
    fused_calls, matmul_calls = [], []
    real_fused, real_matmul = fp8_gemv.grouped_fp8_wo_a, dsv4._apply_wo_a_bf16_matmul
    monkeypatch.setattr(fp8_gemv, "grouped_fp8_wo_a",
                        lambda *a, **k: fused_calls.append("positions" in k) or real_fused(*a, **k))
    monkeypatch.setattr(dsv4, "_apply_wo_a_bf16_matmul", lambda *a, **k: matmul_calls.append(1) or real_matmul(*a, **k))
    o, positions = attention_output(rows, seed=rows)
    y, rope_calls = run_forward_tail(layer, o, positions, monkeypatch)

    d = HEADS * HEAD_DIM // GROUPS
    ref = fp8_gemv.reference_grouped_wo_a(o.view(rows, GROUPS, d), w, s, positions, freqs_of(layer), HEAD_DIM,
                                          ROPE_DIM)
    assert y.dtype == torch.bfloat16 and y.reshape(rows, GROUPS, RANK).shape == ref.shape
    assert rel_err(y.reshape(rows, GROUPS, RANK), ref) < 6e-3
    fused_in_kernel = (GROUPS, rows) in dense.FUSED_ROPE_WHERE
    assert fused_calls == [fused_in_kernel]  # one wo_a launch, with the RoPE folded in or not
    assert len(rope_calls) == (0 if fused_in_kernel else 1) and all(inv for _shape, inv in rope_calls)
    assert len(matmul_calls) == (1 if rows > dsv4._FUSED_WO_A_MAX_TOKENS else 0)
    if rope_calls:
        assert rope_calls[0][0] == (rows, HEADS, ROPE_DIM)  # upstream's o[..., -64:] of every head


def test_fused_and_separate_rope_paths_agree(seam, monkeypatch):
    """At the same rows the folded RoPE and upstream's RoPE launch + our wo_a agree within bf16 rounding."""
    seam({"SGLANG_SM120_FORCE": "1"})
    layer = build_mqa_layer(fp8_config(), monkeypatch)
    w, s = load_fp8_wo_a(layer, seed=3)
    o, positions = attention_output(2, seed=4)
    fused, rope_calls = run_forward_tail(layer, o, positions, monkeypatch)
    assert not rope_calls
    monkeypatch.setattr(dense, "FUSED_ROPE_WHERE", frozenset())
    separate, rope_calls = run_forward_tail(layer, o, positions, monkeypatch)
    assert len(rope_calls) == 1
    assert rel_err(fused.float(), separate.float()) < 6e-3


def test_fused_rope_not_enabled_where_unmeasured_or_inexact(seam, monkeypatch):
    import sglang.srt.models.deepseek_v4 as dsv4

    seam({"SGLANG_SM120_FORCE": "1"})
    monkeypatch.setattr(dense, "FUSED_ROPE_GROUPS", frozenset({8}))  # a group count without a measured win
    layer = build_mqa_layer(fp8_config(), monkeypatch)
    assert layer.sm120_fp8_wo_a and layer.use_fused_wo_a is False
    w, s = load_fp8_wo_a(layer, seed=5)
    o, positions = attention_output(1, seed=6)
    y, rope_calls = run_forward_tail(layer, o, positions, monkeypatch)  # upstream's RoPE launch, then our wo_a
    assert len(rope_calls) == 1
    ref = fp8_gemv.reference_grouped_wo_a(o.view(1, GROUPS, -1), w, s, positions, freqs_of(layer), HEAD_DIM, ROPE_DIM)
    assert rel_err(y.reshape(ref.shape), ref) < 6e-3

    # wo_b that may consume FlashInfer MXFP8: the fused branch would ask wo_a for that format
    monkeypatch.setattr(dense, "FUSED_ROPE_GROUPS", frozenset({GROUPS}))
    layer.wo_b.quant_method.mxfp8_dense_backend = dsv4.Mxfp8DenseGemmBackend.FLASHINFER_CUTEDSL
    assert dense.enable_fused_rope_wo_a(layer) is False and layer.use_fused_wo_a is False
    layer.wo_b.quant_method.mxfp8_dense_backend = None
    assert dense.enable_fused_rope_wo_a(layer) is True and layer.use_fused_wo_a is True
    view = layer.wo_a.weight.view(GROUPS, RANK, -1)
    with pytest.raises(NotImplementedError, match="MXFP8"):
        dsv4.fused_rope_wo_a_bf16(o.view(1, GROUPS, -1), view, freqs_of(layer), positions, out_mxfp8=True)


def test_kill_switch_keeps_upstreams_separate_rope(seam, monkeypatch):
    import sglang.srt.models.deepseek_v4 as dsv4

    seam({"SGLANG_SM120_FORCE": "1", "SGLANG_SM120_DISABLE": "dense"})
    layer = build_mqa_layer(fp8_config(), monkeypatch)
    assert layer.wo_a.weight.dtype == torch.bfloat16 and layer.use_fused_wo_a is False
    assert not getattr(layer, "sm120_fp8_wo_a", False)
    w = torch.randn(GROUPS * RANK, HEADS * HEAD_DIM // GROUPS, generator=torch.Generator().manual_seed(7))
    layer.wo_a.weight.data.copy_(w.to(torch.bfloat16))
    o, positions = attention_output(2, seed=8)
    y, rope_calls = run_forward_tail(layer, o, positions, monkeypatch)
    assert len(rope_calls) == 1  # upstream's separate inverse RoPE, then its bf16 einsum
    rotated = o.clone()
    torch_fused_rope_inplace([])(rotated[..., -ROPE_DIM:], None, layer.freqs_cis, positions, inverse=True)
    expected = torch.einsum("tgd,grd->tgr", rotated.view(2, GROUPS, -1), layer.wo_a.weight.view(GROUPS, RANK, -1))
    assert torch.equal(y, expected)
    # upstream's fused function itself is what the module name points to, unwrapped or passing through
    bf16_w = layer.wo_a.weight.view(GROUPS, RANK, -1)
    seen = []
    monkeypatch.setattr(dense, "_kernels", lambda: seen.append(1))
    try:
        dsv4.fused_rope_wo_a_bf16(o.view(2, GROUPS, -1), bf16_w, freqs_of(layer), positions, out_mxfp8=False)
    except Exception:  # upstream's CUDA JIT kernel cannot run here; the point is that ours was not reached
        pass
    assert not seen


def build_linear(n, k):
    from sglang.srt.layers.linear import ReplicatedLinear

    ctx, par = parallel_overrides()
    with ctx, par:
        return ReplicatedLinear(k, n, bias=False, quant_config=fp8_config(), params_dtype=torch.bfloat16,
                                prefix="model.layers.0.self_attn.wqkv_a")


@pytest.mark.parametrize("rows", [1, 2, 5, 16])
def test_fp8_linear_small_rows_reach_gemv(seam, rows):
    seam({"SGLANG_SM120_FORCE": "1"})
    n, k = 384, 512
    layer = build_linear(n, k)
    linear = layer.quant_method.w8a8_block_fp8_linear
    assert isinstance(linear, dense.SmallRowFp8Linear) and linear.max_rows == dense.DEFAULT_MAX_ROWS
    w, s = random_weight(n, k, gen=torch.Generator().manual_seed(rows))
    layer.weight.weight_loader(layer.weight, w)
    layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s)
    upstream_calls = []
    linear.upstream = lambda **kw: upstream_calls.append(kw)  # must not be reached
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.inference_mode():
        y, _ = layer(x)
    assert not upstream_calls
    assert y.shape == (rows, n) and rel_err(y, fp8_gemv.reference_block_fp8_linear(x, w, s)) < 6e-3


def test_wq_b_beside_the_indexer_shares_the_sms_while_capturing(seam, monkeypatch):
    """A layer whose indexer SGLang runs on side streams (alt_streams set) marks its wq_b's GEMV; the GEMV asks for
    the SM-sharing form only while a CUDA graph is captured (SGLang forks the streams only then). A layer without an
    indexer or without side streams, or a wq_b on upstream's linear, is left as it is; MQALayer's init runs the rule."""
    from types import SimpleNamespace

    seam({"SGLANG_SM120_FORCE": "1"})
    n, k = 256, 256
    wq_b = build_linear(n, k)
    linear = wq_b.quant_method.w8a8_block_fp8_linear
    assert isinstance(linear, dense.SmallRowFp8Linear) and linear.share_sms is False
    for indexer, streams in ((None, [object()] * 5), (object(), None)):
        layer = SimpleNamespace(indexer=indexer, alt_streams=streams, wq_b=wq_b)
        assert dense.share_wq_b_sms_with_indexer(layer) is False and linear.share_sms is False
    upstream_only = SimpleNamespace(quant_method=SimpleNamespace(w8a8_block_fp8_linear=lambda **kw: None))
    assert not dense.share_wq_b_sms_with_indexer(SimpleNamespace(indexer=object(), alt_streams=[1], wq_b=upstream_only))
    assert dense.share_wq_b_sms_with_indexer(SimpleNamespace(indexer=object(), alt_streams=[object()], wq_b=wq_b))
    assert linear.share_sms is True

    w, s = random_weight(n, k, gen=torch.Generator().manual_seed(3))
    wq_b.weight.weight_loader(wq_b.weight, w)
    wq_b.weight_scale_inv.weight_loader(wq_b.weight_scale_inv, s)
    calls = []
    kernels = dense._kernels()
    record = lambda x, weight, scale, share_sms=False: calls.append(share_sms) or kernels.block_fp8_linear(  # noqa: E731
        x, weight, scale, share_sms=share_sms)
    monkeypatch.setattr(dense, "_kernels", lambda: SimpleNamespace(block_fp8_linear=record))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    for capturing in (False, True):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda c=capturing: c)
        with torch.inference_mode():
            y, _ = wq_b(x)
        assert rel_err(y, fp8_gemv.reference_block_fp8_linear(x, w, s)) < 6e-3
    assert calls == [False, True]

    swa = build_mqa_layer(fp8_config(), monkeypatch)  # no indexer: MQALayer's init leaves its wq_b alone
    assert swa.wq_b.quant_method.w8a8_block_fp8_linear.share_sms is False


def test_fp8_linear_large_rows_and_prequantised_go_upstream(seam):
    seam({"SGLANG_SM120_FORCE": "1"})
    n, k = 256, 256
    layer = build_linear(n, k)
    linear = layer.quant_method.w8a8_block_fp8_linear
    calls = []
    linear.upstream = lambda **kw: calls.append(kw) or torch.zeros(kw["input"].shape[0], n, dtype=torch.bfloat16)
    x = torch.randn(dense.DEFAULT_MAX_ROWS + 1, k).to(torch.bfloat16)
    layer(x)
    assert len(calls) == 1 and calls[0]["input"] is x and calls[0]["input_scale"] is None
    q = (torch.randn(2, k).to(torch.float8_e4m3fn), torch.ones(2, k // 128))
    layer(q)  # a pre-quantised (fp8, scale) activation keeps upstream's kernel
    assert len(calls) == 2 and calls[1]["input_scale"] is q[1]
    seam({"SGLANG_SM120_FORCE": "1", "SGLANG_SM120_DISABLE": "dense"})
    layer(x[:1])  # seam off at call time: upstream even for one row
    assert len(calls) == 3


def test_max_rows_env(monkeypatch):
    monkeypatch.setenv(dense.ENV_MAX_ROWS, "8")
    assert dense.max_rows() == 8
    monkeypatch.setenv(dense.ENV_MAX_ROWS, "x")
    assert dense.max_rows() == dense.DEFAULT_MAX_ROWS


@pytest.mark.parametrize("value, expected", [(None, True), ("1", True), ("0", False), ("off", False),
                                             ("maybe", True)])
def test_pdl_env_reaches_the_gemv_defaults(seam, monkeypatch, value, expected):
    monkeypatch.setattr(fp8_gemv, "USE_PDL", not expected)  # the build below must set it either way
    if value is None:
        monkeypatch.delenv(dense.ENV_PDL, raising=False)
    else:
        monkeypatch.setenv(dense.ENV_PDL, value)
    seam({"SGLANG_SM120_FORCE": "1"})
    build_linear(256, 512)
    assert fp8_gemv.USE_PDL is expected
    m, n, k = 1, 1536, 4096  # one row: every default there is launched with PDL when it is on
    assert fp8_gemv.default_config(m, n, k).pdl is expected
    assert (fp8_gemv.default_config(m, n, k) == fp8_gemv.launch_form(m, n, k)) is not expected


def test_memory_saved_per_layer_at_full_shapes():
    from sglang_sm120.kernels.dsv4 import FP8_BLOCK, dense_linear_shapes

    for tp in (1, 2, 4, 8):
        n, k = dense_linear_shapes(tp)["wo_a"]
        fp8 = n * k + 4 * (n // FP8_BLOCK) * (k // FP8_BLOCK)
        saved = 2 * n * k - fp8
        assert saved == 33_546_240 // tp  # 33.5 MB per layer at T=1 (bf16 67.1 MB -> FP8 33.6 MB + 8 KB scales)


SUBPROCESS = """
import json, torch
import sglang_sm120.plugin as plugin
plugin.register()
from sglang_sm120.seams import REGISTRY
import sglang.srt.models.deepseek_v4 as dsv4
import sglang.srt.layers.quantization.fp8_utils as fu
from sglang.srt.layers.quantization.fp8 import Fp8Config
qc = Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128])
print(json.dumps({
    "state": REGISTRY.get("dense").state.value,
    "upstream_fp8_wo_a_gemm": dsv4._FP8_WO_A_GEMM,
    "keeps_fp8": dsv4.wo_a_fp8_gemm_enabled(qc),
    "wrapped": [hasattr(f, "__wrapped__") for f in (dsv4.wo_a_fp8_gemm_enabled, dsv4._apply_wo_a_bf16_matmul,
                dsv4.MqaAttentionBase.__init__, dsv4.MQALayer.__init__, dsv4.fused_rope_wo_a_bf16,
                fu.dispatch_w8a8_block_fp8_linear)],
}))
"""


@pytest.mark.parametrize("disable", [False, True])
def test_plugin_register_in_fresh_process(disable):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SM120_")}
    env.update(SGLANG_SM120_FORCE="1", SGLANG_OPT_FP8_WO_A_GEMM="0", TRITON_INTERPRET="1")
    if disable:
        env["SGLANG_SM120_DISABLE"] = "dense"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SUBPROCESS)], capture_output=True, text=True,
                          env=env, timeout=600, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["upstream_fp8_wo_a_gemm"] is False
    if disable:
        assert got == {"state": "disabled by env", "upstream_fp8_wo_a_gemm": False, "keeps_fp8": False,
                       "wrapped": [False] * 6}
    else:
        assert got == {"state": "active", "upstream_fp8_wo_a_gemm": False, "keeps_fp8": True, "wrapped": [True] * 6}


def test_fp8_linear_kernel_errors_fall_back_to_upstream(seam, monkeypatch):
    """The GEMV raising after the checks (a Triton compile or launch error) sends the call to upstream's linear
    with every argument it came with, instead of raising into SGLang."""
    seam({"SGLANG_SM120_FORCE": "1"})
    n, k = 384, 512
    linear = build_linear(n, k).quant_method.w8a8_block_fp8_linear
    assert isinstance(linear, dense.SmallRowFp8Linear)

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory 120000 > 101376")

    monkeypatch.setattr(fp8_gemv, "block_fp8_linear", broken)
    upstream_calls = []
    linear.upstream = lambda **kw: upstream_calls.append(kw) or "upstream's result"
    w, s = random_weight(n, k, gen=torch.Generator().manual_seed(3))
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    assert linear(x, w, [128, 128], s) == "upstream's result"
    assert len(upstream_calls) == 1 and upstream_calls[0]["input"] is x and upstream_calls[0]["weight_scale"] is s


@pytest.mark.parametrize("rows", [2, 5])
def test_wo_a_kernel_errors_fall_back_to_a_dequantised_einsum(seam, monkeypatch, caplog, rows):
    """The grouped FP8 kernel raising on an adopted wo_a (a Triton compile or launch error) does not reach SGLang:
    the call takes upstream's computation on a transient bf16 copy of the weight (the seam keeps no bf16 copy), with
    the inverse RoPE where the kernel would have folded it, and says so once as a warning. Rows 2: the RoPE folded
    into the kernel; rows 5: upstream's RoPE launch, then the kernel."""
    import sglang.srt.models.deepseek_v4 as dsv4

    seam({"SGLANG_SM120_FORCE": "1"})
    layer = build_mqa_layer(fp8_config(), monkeypatch)
    w, s = load_fp8_wo_a(layer, seed=7)
    calls = []

    def broken(*args, **kwargs):
        calls.append("positions" in kwargs)
        raise RuntimeError("out of resources: shared memory 120000 > 101376")

    monkeypatch.setattr(fp8_gemv, "grouped_fp8_wo_a", broken)
    monkeypatch.setattr(dense, "_log_once", dense.OnceLog("dense"))
    o, positions = attention_output(rows, seed=8)
    with caplog.at_level("WARNING", logger="sglang_sm120"):
        y, rope_calls = run_forward_tail(layer, o, positions, monkeypatch)
        run_forward_tail(layer, o, positions, monkeypatch)
    d = HEADS * HEAD_DIM // GROUPS
    ref = fp8_gemv.reference_grouped_wo_a(o.view(rows, GROUPS, d), w, s, positions, freqs_of(layer), HEAD_DIM,
                                          ROPE_DIM)
    assert rel_err(y.reshape(rows, GROUPS, RANK), ref) < 6e-3
    fused_in_kernel = (GROUPS, rows) in dense.FUSED_ROPE_WHERE
    assert calls == [fused_in_kernel] * 2 and len(rope_calls) == (0 if fused_in_kernel else 1)
    warnings = [r for r in caplog.records if "the grouped FP8 wo_a raised RuntimeError" in r.getMessage()]
    assert len(warnings) == 1 and "SGLang's path runs the call" in warnings[0].getMessage()
    # upstream's own wo_a entry (the > 32-row path's _apply_wo_a_bf16_matmul) falls back the same way
    o3 = torch.randn(3, GROUPS, d, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    with torch.inference_mode():
        y3 = dsv4._apply_wo_a_bf16_matmul(o3, layer.wo_a.weight.view(GROUPS, RANK, -1), is_decode=True)
    assert rel_err(y3, fp8_gemv.reference_grouped_wo_a(o3, w, s)) < 6e-3
