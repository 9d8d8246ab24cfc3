"""``--moe-runner-backend sm120`` against the real installed SGLang 0.5.23 (no mocks of SGLang).

* the flag (and ``--speculative-moe-runner-backend sm120``) parses through SGLang's own server
  argument parser, in the test process, after ``register_backend_name()``;
* ``Fp8Config.get_quant_method`` for a DeepSeek-V4 FP4-expert ``FusedMoE`` layer returns the
  plugin's method when the seam is active (``SGLANG_SM120_FORCE=1``) and upstream's MXFP4 method
  otherwise (seam inactive, EP, other backends), with the one-time log line;
* the quant method end to end through SGLang's ``FusedMoE``: SGLang's weight loader, its
  standard dispatcher/combine and ``forward``, on CPU under the Triton interpreter, against the
  float32 reference.
"""

import argparse
import logging
import os
from types import SimpleNamespace

import pytest
import torch

from sglang_sm120 import moe as sm120_moe
from sglang_sm120.kernels import moe_mxfp4
from sglang_sm120.kernels.dsv4 import MXFP4_GROUP, SWIGLU_LIMIT
from sglang_sm120.seams import SeamState

NUM_EXPERTS, HIDDEN, INTER, TOP_K = 8, 256, 128, 6  # I: Fp8MoEMethod checks divisibility by 128


@pytest.fixture
def registered():
    sm120_moe.register_backend_name()
    sm120_moe.register_backend_name()  # idempotent


@pytest.fixture
def seam(registered, install_seam):
    """The moe seam decided the way the plugin decides it, here in the test process."""
    yield install_seam(sm120_moe.make_seam())
    sm120_moe._logged_reasons.clear()


def server_parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)  # what prepare_server_args (launch_server / sglang serve) builds
    return parser


def test_flags_parse_through_sglangs_parser(registered):
    args = server_parser().parse_args(["--model-path", "deepseek-ai/DeepSeek-V4-Flash", "--moe-runner-backend",
                                       "sm120", "--speculative-moe-runner-backend", "sm120"])
    assert args.moe_runner_backend == "sm120"
    assert args.speculative_moe_runner_backend == "sm120"
    with pytest.raises(SystemExit):
        server_parser().parse_args(["--model-path", "x", "--moe-runner-backend", "sm121"])


def test_runtime_name_resolves(registered):
    from sglang.srt.layers.moe.moe_runner.runner import MoeRunner
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.utils import RegisteredMoeRunnerBackend, resolve_moe_runner_backend

    backend = resolve_moe_runner_backend("sm120")
    assert isinstance(backend, RegisteredMoeRunnerBackend) and backend.value == "sm120"
    runner = MoeRunner(backend, MoeRunnerConfig())
    assert runner.runner_core.runner_backend == backend and runner.fused_func is None


def test_speculative_backend_resolves_for_the_draft(registered):
    from sglang.srt.layers.moe.utils import (get_moe_runner_backend, resolve_moe_runner_backend,
                                             speculative_moe_backend_context)
    from sglang.srt.runtime_context import get_flags

    target = resolve_moe_runner_backend("flashinfer_mxfp4")
    with get_flags().moe.override(runner_backend=target,
                                  speculative_runner_backend=resolve_moe_runner_backend("sm120")):
        with speculative_moe_backend_context():  # how SGLang builds and runs the MTP draft
            assert get_moe_runner_backend().value == "sm120"
        assert get_moe_runner_backend() == target


def fp4_config():
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    cfg = Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128], is_fp4_experts=True)
    cfg.is_dsv4_fp4_experts = True  # what the model loader sets for DeepSeek-V4
    return cfg


def build_layer(backend="sm120", ep_size=1, quant_config=None):
    from sglang.srt.layers.moe import MoeA2ABackend
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.utils import resolve_moe_runner_backend
    from sglang.srt.runtime_context import get_context, get_flags, get_parallel

    with (get_context().override_server_args(model_path="dummy"),
          get_flags().moe.override(runner_backend=resolve_moe_runner_backend(backend), a2a_backend=MoeA2ABackend.NONE),
          get_parallel().override(moe_ep_size=ep_size, moe_ep_rank=0, moe_tp_size=1, moe_tp_rank=0, tp_size=ep_size,
                                  tp_rank=0, attn_tp_size=ep_size, attn_tp_rank=0)):
        return FusedMoE(num_experts=NUM_EXPERTS, hidden_size=HIDDEN, intermediate_size=INTER, layer_id=3, top_k=TOP_K,
                        quant_config=quant_config or fp4_config(), prefix="model.layers.3.mlp.experts",
                        params_dtype=torch.bfloat16, activation="silu", swiglu_limit=SWIGLU_LIMIT,
                        routed_scaling_factor=1.5)


def test_dispatch_reaches_plugin_method_when_forced(seam):
    state = seam({"SGLANG_SM120_FORCE": "1"})
    assert state.state is SeamState.ACTIVE
    layer = build_layer()
    assert isinstance(layer.quant_method, sm120_moe.Sm120Mxfp4MoEMethod)
    assert layer.runner_backend.value == "sm120"
    assert layer.should_fuse_routed_scaling_factor_in_topk  # routed 1.5 scale folded into top-k weights
    # upstream's checkpoint tensors, exactly
    shapes = {n: (tuple(p.shape), p.dtype) for n, p in layer.named_parameters()}
    assert shapes == {
        "w13_weight": ((NUM_EXPERTS, 2 * INTER, HIDDEN // 2), torch.int8),
        "w2_weight": ((NUM_EXPERTS, HIDDEN, INTER // 2), torch.int8),
        "w13_weight_scale_inv": ((NUM_EXPERTS, 2 * INTER, HIDDEN // MXFP4_GROUP), torch.float8_e8m0fnu),
        "w2_weight_scale_inv": ((NUM_EXPERTS, HIDDEN, INTER // MXFP4_GROUP), torch.float8_e8m0fnu),
    }


def upstream_choice(ep_size=1):
    """What SGLang picks on its own for this layer under ``flashinfer_mxfp4`` (what ``auto``
    resolves to for DSv4 FP4 experts); the hook passes other backends straight through."""
    return type(build_layer(backend=sm120_moe.UPSTREAM_BACKEND, ep_size=ep_size).quant_method)


def test_dispatch_goes_upstream_when_seam_inactive_and_logs_once(seam, caplog):
    state = seam({})  # no sm_12x GPU, not forced
    assert state.state is SeamState.NOT_APPLICABLE
    with caplog.at_level(logging.WARNING, logger="sglang_sm120"):
        first = build_layer()
        second = build_layer()
    assert type(first.quant_method) is type(second.quant_method) is upstream_choice()
    assert not isinstance(first.quant_method, sm120_moe.Sm120Mxfp4MoEMethod)
    assert first.runner_backend.value == "flashinfer_mxfp4"  # its own runner; the sm120 name does not leak
    lines = [r.getMessage() for r in caplog.records if "uses upstream's MXFP4" in r.getMessage()]
    assert len(lines) == 1 and "moe seam is not active" in lines[0]


def test_dispatch_on_sm120_platform_is_upstreams_flashinfer_cutlass_method(seam):
    """On an sm_120 platform upstream's flashinfer_mxfp4 method is the CUTLASS MXFP8xMXFP4 one; it
    needs FlashInfer, which this CPU machine lacks, so reaching its constructor is the proof."""
    from sglang.srt.runtime_context import override_platform

    seam({"SGLANG_SM120_DISABLE": "moe", "SGLANG_SM120_FORCE": "1"})
    with override_platform(is_sm120=True, is_sm90=False):
        with pytest.raises(RuntimeError, match="Mxfp4FlashinferCutlassMoEMethod requires FlashInfer"):
            build_layer()


def test_dispatch_goes_upstream_under_expert_parallelism(seam, caplog):
    seam({"SGLANG_SM120_FORCE": "1"})
    with caplog.at_level(logging.WARNING, logger="sglang_sm120"):
        layer = build_layer(ep_size=2)
    assert not isinstance(layer.quant_method, sm120_moe.Sm120Mxfp4MoEMethod)
    assert type(layer.quant_method) is upstream_choice(ep_size=2)
    assert any("expert parallelism" in r.getMessage() for r in caplog.records)


def test_other_backends_and_layers_untouched(seam):
    from sglang.srt.layers.quantization.mxfp4_marlin_moe import Mxfp4MarlinMoEMethod

    seam({"SGLANG_SM120_FORCE": "1"})
    assert isinstance(build_layer(backend="marlin").quant_method, Mxfp4MarlinMoEMethod)
    cfg = fp4_config()
    cfg.is_fp4_experts = False  # an FP8-expert checkpoint: upstream's Fp8MoEMethod
    from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod

    assert type(build_layer(quant_config=cfg).quant_method) is Fp8MoEMethod


def load_checkpoint(layer, experts):
    """Feed per-expert checkpoint shards through SGLang's own FusedMoE weight loader."""
    w13, s13, w2, s2 = experts
    for e in range(NUM_EXPERTS):
        for shard, rows in (("w1", slice(0, INTER)), ("w3", slice(INTER, 2 * INTER))):  # gate, up
            layer.weight_loader(layer.w13_weight, w13[e, rows], "experts.w13_weight", shard, e)
            layer.weight_loader(layer.w13_weight_scale_inv, s13[e, rows], "experts.w13_weight_scale_inv", shard, e)
        layer.weight_loader(layer.w2_weight, w2[e], "experts.w2_weight", "w2", e)
        layer.weight_loader(layer.w2_weight_scale_inv, s2[e], "experts.w2_weight_scale_inv", "w2", e)


def random_experts(seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randint(-128, 128, (NUM_EXPERTS, 2 * INTER, HIDDEN // 2), dtype=torch.int8, generator=g)
    s13 = torch.randint(119, 128, (NUM_EXPERTS, 2 * INTER, HIDDEN // 32), dtype=torch.uint8, generator=g)
    w2 = torch.randint(-128, 128, (NUM_EXPERTS, HIDDEN, INTER // 2), dtype=torch.int8, generator=g)
    s2 = torch.randint(119, 128, (NUM_EXPERTS, HIDDEN, INTER // 32), dtype=torch.uint8, generator=g)
    return w13, s13.view(torch.float8_e8m0fnu), w2, s2.view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("batch", [1, 5])
def test_end_to_end_through_fused_moe_matches_reference(seam, batch):
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.runtime_context import get_parallel

    seam({"SGLANG_SM120_FORCE": "1"})
    layer = build_layer()
    experts = random_experts()
    load_checkpoint(layer, experts)
    assert torch.equal(layer.w13_weight.data, experts[0])  # SGLang loaded [gate; up]
    layer.quant_method.process_weights_after_loading(layer)
    report = layer.quant_method.repack_report
    assert report["bytes_before"] == report["bytes_after"] and report["same_storage"]
    assert not layer.quant_method.wide_scales  # bytes 119..127: the pairs forms stay available
    assert torch.equal(layer.w13_weight.data[:, 1::2], experts[0][:, INTER:])  # interleaved in place

    g = torch.Generator().manual_seed(7)
    x = (torch.randn(batch, HIDDEN, generator=g) * 3).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=g)[:TOP_K] for _ in range(batch)]).to(torch.int32)
    weights = torch.rand(batch, TOP_K, generator=g) * 1.5
    topk = StandardTopKOutput(topk_weights=weights, topk_ids=ids, router_logits=torch.zeros(batch, NUM_EXPERTS))
    # a single-rank process group stand-in: the combine asks the TP group whether it spans ranks
    with get_parallel().override(tp_group=SimpleNamespace(world_size=1)):
        out = layer.forward(x, topk)
    ref = moe_mxfp4.reference_moe_mxfp4(x, *experts, weights, ids)
    assert out.shape == (batch, HIDDEN) and out.dtype == torch.bfloat16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2


def test_kernel_errors_fall_back_to_a_torch_forward_over_the_repacked_experts(seam, caplog, monkeypatch):
    """Our kernels raising in a forward (a Triton compile or launch error) do not reach SGLang: the layer's repacked
    experts run through the torch fallback, within bf16 rounding of the float32 reference, with one warning."""
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.runtime_context import get_parallel

    seam({"SGLANG_SM120_FORCE": "1"})
    layer = build_layer()
    experts = random_experts(seed=5)
    load_checkpoint(layer, experts)
    layer.quant_method.process_weights_after_loading(layer)

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory 120000 > 101376")

    monkeypatch.setattr(moe_mxfp4, "moe_mxfp4_forward", broken)
    monkeypatch.setattr(sm120_moe, "_log_kernel_errors", sm120_moe.OnceLog("moe"))
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(3, HIDDEN, generator=g) * 3).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=g)[:TOP_K] for _ in range(3)]).to(torch.int32)
    ids[2, 1] = ids[2, 0]  # a duplicate choice counts twice, as in the kernels
    weights = torch.rand(3, TOP_K, generator=g) * 1.5
    topk = StandardTopKOutput(topk_weights=weights, topk_ids=ids, router_logits=torch.zeros(3, NUM_EXPERTS))
    with caplog.at_level(logging.WARNING, logger="sglang_sm120"), \
            get_parallel().override(tp_group=SimpleNamespace(world_size=1)):
        out = layer.forward(x, topk)
        layer.forward(x, topk)
    ref = moe_mxfp4.reference_moe_mxfp4(x, *experts, weights, ids)
    assert out.shape == (3, HIDDEN) and out.dtype == torch.bfloat16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2
    warnings = [r for r in caplog.records if "the sm120 MoE kernels raised RuntimeError" in r.getMessage()]
    assert len(warnings) == 1


def test_scales_outside_the_pairs_range_log_and_keep_the_forward_exact(seam, caplog, monkeypatch):
    """E8M0 bytes the pairs decode cannot take exactly (here 200 and 10): one warning at load naming the layer and the
    range, and every forward of the layer asks the kernels for the forms exact at any byte."""
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.runtime_context import get_parallel

    seam({"SGLANG_SM120_FORCE": "1"})
    layer = build_layer()
    w13, s13, w2, s2 = random_experts(seed=3)
    s13, s2 = s13.view(torch.uint8).clone(), s2.view(torch.uint8).clone()
    s13[0, :, 0] = 200
    s2[1, 0, :] = 10
    experts = (w13, s13.view(torch.float8_e8m0fnu), w2, s2.view(torch.float8_e8m0fnu))
    load_checkpoint(layer, experts)
    with caplog.at_level(logging.WARNING, logger=sm120_moe.logger.name):
        layer.quant_method.process_weights_after_loading(layer)
    assert layer.quant_method.wide_scales
    assert [r for r in caplog.records if "span 10..200, outside 34..160" in r.getMessage()]
    seen = []
    forward = moe_mxfp4.moe_mxfp4_forward
    monkeypatch.setattr(moe_mxfp4, "moe_mxfp4_forward", lambda *a, **kw: seen.append(kw) or forward(*a, **kw))
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(2, HIDDEN, generator=g) * 3).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=g)[:TOP_K] for _ in range(2)]).to(torch.int32)
    ids[0, 0], ids[1, 0] = 0, 1  # the experts with the wide bytes
    weights = torch.rand(2, TOP_K, generator=g) * 1.5
    topk = StandardTopKOutput(topk_weights=weights, topk_ids=ids, router_logits=torch.zeros(2, NUM_EXPERTS))
    with get_parallel().override(tp_group=SimpleNamespace(world_size=1)):
        out = layer.forward(x, topk)
    assert seen and all(kw["wide_scales"] for kw in seen)
    ref = moe_mxfp4.reference_moe_mxfp4(x, *experts, weights, ids)
    assert torch.isfinite(out).all() and ((out.float() - ref).norm() / ref.norm()).item() < 2e-2


def test_seam_metadata():
    seam = sm120_moe.make_seam()
    assert seam.name == "moe" and seam.targets == (sm120_moe.DISPATCH_TARGET,)
    assert "register_backend_name" in seam.description
    assert os.environ.get("SGLANG_SM120_FORCE") is None  # tests decide activation explicitly


def test_mtp_draft_layer_built_under_speculative_backend_gets_plugin_method(seam):
    """Target on upstream's flashinfer_mxfp4, draft on --speculative-moe-runner-backend sm120: SGLang
    builds the draft inside speculative_moe_backend_context(), and its FP4 experts get our method."""
    from sglang.srt.layers.moe.utils import resolve_moe_runner_backend, speculative_moe_backend_context
    from sglang.srt.runtime_context import get_flags

    seam({"SGLANG_SM120_FORCE": "1"})
    with get_flags().moe.override(speculative_runner_backend=resolve_moe_runner_backend("sm120")):
        target = build_layer(backend=sm120_moe.UPSTREAM_BACKEND)
        with speculative_moe_backend_context():
            from sglang.srt.layers.moe.utils import get_moe_runner_backend

            draft = build_layer(backend=get_moe_runner_backend().value)
    assert not isinstance(target.quant_method, sm120_moe.Sm120Mxfp4MoEMethod)
    assert isinstance(draft.quant_method, sm120_moe.Sm120Mxfp4MoEMethod)
    assert draft.runner_backend.value == "sm120"
