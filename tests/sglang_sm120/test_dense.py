"""The ``dense`` seam against the installed SGLang 0.5.23 (no mocks of SGLang), on CPU under the
Triton interpreter:

* with the seam active (``SGLANG_SM120_FORCE=1``; SGLang's sm_120 setting of
  ``SGLANG_OPT_FP8_WO_A_GEMM=0`` emulated), SGLang's own ``MqaAttentionBase`` allocates ``wo_a`` in
  FP8 with block scales (no bf16 copy), SGLang's weight loader and ``_setup_fp8_wo_a_scales`` fill
  it, and SGLang's ``_apply_wo_a_bf16_matmul`` reaches the grouped FP8 kernel;
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


def build_attention(quant_config):
    import sglang.srt.models.deepseek_v4 as dsv4

    cfg = SimpleNamespace(hidden_size=256, num_attention_heads=HEADS, head_dim=HEAD_DIM, qk_rope_head_dim=32,
                          q_lora_rank=128, o_groups=GROUPS, o_lora_rank=RANK, num_key_value_heads=1,
                          compress_ratios=[0, 0], num_hidden_layers=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                          q_head_norm=True, model_type="deepseek_v4", rope_theta=10000, rope_scaling={},
                          compress_rope_theta=40000, window_size=128)
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
                dsv4.MqaAttentionBase.__init__, fu.dispatch_w8a8_block_fp8_linear)],
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
                       "wrapped": [False] * 4}
    else:
        assert got == {"state": "active", "upstream_fp8_wo_a_gemm": False, "keeps_fp8": True, "wrapped": [True] * 4}
