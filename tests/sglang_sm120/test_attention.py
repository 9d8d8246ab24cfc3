"""The ``attention`` seam against the real installed SGLang 0.5.23: SGLang's own symbol reaches our
kernel when the seam is active (SGLANG_SM120_FORCE=1 on this CPU machine, kernel under the
interpreter) and upstream's code when it is disabled or a call is not covered. Each case runs in
a fresh process, as SGLang runs ``load_plugins()`` in each of its processes."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# A CPU call through SGLang's module attribute, as the DSv4 backend makes it (keyword arguments).
CALL = """
import json, logging, os, torch
logging.basicConfig(level=logging.INFO)
os.environ.setdefault("TRITON_INTERPRET", "1")
from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot
patch_bf16_dot()
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.kernels.ops.attention.flash_mla_sm120 as fm
from sglang_sm120.kernels import sparse_mla_decode as smd
from sglang_sm120.seams import REGISTRY

calls = []
real = smd.sparse_mla_decode
smd.sparse_mla_decode = lambda *a, **k: calls.append(1) or real(*a, **k)

def inputs(heads):
    gen = torch.Generator().manual_seed(heads)
    swa, _ = smd.random_v4_cache(2, 256, generator=gen)
    c4, _ = smd.random_v4_cache(2, 64, generator=gen)
    return dict(q=(torch.randn(2, 1, heads, 512, generator=gen) * 0.5).to(torch.bfloat16), k_cache=swa,
                head_dim_v=512, softmax_scale=512 ** -0.5,
                indices=torch.randint(0, 512, (2, 1, 16), generator=gen, dtype=torch.int32),
                topk_length=torch.tensor([16, 9], dtype=torch.int32), attn_sink=torch.randn(heads, generator=gen),
                extra_k_cache=c4, extra_indices_in_kvcache=torch.randint(0, 128, (2, 1, 16), generator=gen,
                                                                          dtype=torch.int32),
                extra_topk_length=torch.tensor([5, 16], dtype=torch.int32))

def upstream_torch(a):
    return fm._sm120_sparse_decode_fwd(a["q"], a["k_cache"], a["indices"], a["topk_length"], a["attn_sink"], 512,
                                      a["softmax_scale"], a["extra_k_cache"], a["extra_indices_in_kvcache"],
                                      a["extra_topk_length"])

def rel(x, y):
    return ((x.double() - y.double()).norm() / y.double().norm()).item()

report = {"state": REGISTRY.get("attention").state.value, "wrapped": hasattr(fm.flash_mla_with_kvcache_sm120,
                                                                               "__wrapped__")}
for heads in HEADS:
    a = inputs(heads)
    before = len(calls)
    out, lse = fm.flash_mla_with_kvcache_sm120(**a)
    ref_out, ref_lse = upstream_torch(a)
    report[str(heads)] = {"ours": len(calls) > before, "rel_err": rel(out, ref_out),
                          "lse": lse is not None and torch.allclose(lse, ref_lse, atol=1e-3)}
report["probe"] = {h: fm.flashinfer_dsv4_decode_supports_num_heads(h, 1) for h in (4, 8, 16, 32, 64, 128)}
print(json.dumps(report))
"""


def run_fresh(heads, **env) -> tuple[dict, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SM120_")}
    # upstream's default FlashInfer path needs an sm_120 GPU; its torch path runs here
    full.update(SGLANG_SM120_FLASHMLA_BACKEND="torch", TRITON_INTERPRET="1", **env)
    code = f"HEADS = {list(heads)!r}\n" + textwrap.dedent(CALL)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=600, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_active_seam_routes_covered_calls_to_our_kernel_and_the_rest_upstream():
    report, stderr = run_fresh((16, 128, 128), SGLANG_SM120_FORCE="1")
    assert report["state"] == "active" and report["wrapped"]
    assert report["16"]["ours"] and report["16"]["rel_err"] < 2e-2 and report["16"]["lse"]
    # 128 heads is past our kernel: upstream's (torch) path answers, logged once for both calls
    assert not report["128"]["ours"] and report["128"]["rel_err"] < 1e-6 and report["128"]["lse"]
    assert stderr.count("upstream's flash_mla_with_kvcache_sm120 runs this call") == 1
    # the head-count probe: native widths 1..64 for our kernel, upstream's answer beyond
    assert report["probe"] == {"4": True, "8": True, "16": True, "32": True, "64": True, "128": True}


def test_disabled_seam_leaves_sglang_untouched():
    report, _ = run_fresh((16,), SGLANG_SM120_FORCE="1", SGLANG_SM120_DISABLE="attention")
    assert report["state"] == "disabled by env" and not report["wrapped"]
    assert not report["16"]["ours"] and report["16"]["rel_err"] < 1e-6
    # upstream's own probe with the pinned FlashInfer 0.7.2: no 4-head kernel, the others supported
    assert report["probe"] == {"4": False, "8": True, "16": True, "32": True, "64": True, "128": True}


def test_upstream_probe_does_not_raise_with_pinned_flashinfer():
    """The reference notes suspected FlashInfer >= 0.7 broke the probe (TypeError on a
    non-iterable dispatch object); with 0.7.2 it iterates and answers, so no fix is needed."""
    flashinfer = pytest.importorskip("flashinfer")
    fm = pytest.importorskip("sglang.kernels.ops.attention.flash_mla_sm120")
    assert flashinfer.__version__ == "0.7.2"
    max_tokens, heads = fm._flashinfer_dsv4_decode_capabilities()
    assert max_tokens == 64 and heads == frozenset({8, 16, 32, 64, 128})
    assert fm.flashinfer_dsv4_decode_supports_num_heads(16, 1)
    assert not fm.flashinfer_dsv4_decode_supports_num_heads(16, 65)


def test_uncovered_reasons(monkeypatch):
    import torch

    from sglang_sm120 import attention
    from sglang_sm120.seams import REGISTRY

    q = torch.zeros(1, 1, 16, 512, dtype=torch.bfloat16)
    cache = torch.zeros(2, 64, 1, 584, dtype=torch.uint8)
    ok = dict(q=q, k_cache=cache, head_dim_v=512)
    monkeypatch.setattr(REGISTRY, "is_active", lambda name: False)  # e.g. marked failed after a partial install
    assert attention.uncovered_reason(ok) == "seam not active"
    monkeypatch.setattr(REGISTRY, "is_active", lambda name: name == "attention")
    monkeypatch.setattr(attention, "kernels_runnable", lambda t: False)
    assert "without a GPU" in attention.uncovered_reason(ok)
    monkeypatch.setattr(attention, "kernels_runnable", lambda t: True)
    assert attention.uncovered_reason(ok) is None
    assert "528" in attention.uncovered_reason({**ok, "k_cache": torch.zeros(2, 64, 1, 528, dtype=torch.uint8)})
    assert "288" in attention.uncovered_reason({**ok, "extra_k_cache": torch.zeros(2, 2, 1, 288, dtype=torch.uint8)})
    assert "128 heads" in attention.uncovered_reason({**ok, "q": torch.zeros(1, 1, 128, 512, dtype=torch.bfloat16)})
    assert "head_dim_v" in attention.uncovered_reason({**ok, "head_dim_v": 448})


def test_kernel_errors_fall_back_to_upstream_logged_once_per_kind(monkeypatch, caplog):
    """An error our kernel raises after the checks (a Triton compile or launch error such as OutOfResources) sends
    the call to upstream's function instead of into SGLang; a warning per kind of error, not per call."""
    import logging

    import torch

    from sglang_sm120 import attention
    from sglang_sm120.kernels import sparse_mla_decode as smd

    def out_of_resources(*args, **kwargs):
        raise RuntimeError(f"out of resources: shared memory {len(args) * 1000 + 120000} > 101376")

    calls = []
    monkeypatch.setattr(attention, "uncovered_reason", lambda kwargs: None)
    monkeypatch.setattr(smd, "sparse_mla_decode", out_of_resources)
    monkeypatch.setitem(attention._upstream, "decode", lambda **kwargs: calls.append(kwargs) or "upstream's result")
    kwargs = dict(q=torch.zeros(1), k_cache=torch.zeros(1), indices=torch.zeros(1), head_dim_v=512)
    with caplog.at_level(logging.INFO, logger="sglang_sm120"):
        assert attention.flash_mla_with_kvcache_sm120(**kwargs) == "upstream's result"
        assert attention.flash_mla_with_kvcache_sm120(**kwargs) == "upstream's result"
    assert len(calls) == 2 and calls[0] == kwargs
    raised = [r for r in caplog.records if "RuntimeError" in r.getMessage()]
    assert len(raised) == 1 and raised[0].levelno == logging.WARNING
