"""The ``indexer`` seam against the installed SGLang 0.5.23, each case in a fresh process: with
SGLANG_SM120_FORCE=1 SGLang's own names reach our kernels (under the CPU interpreter), the fused
hand-off works through the C4 indexer's call sequence, the kill switch leaves upstream in place,
and an uncovered call goes to upstream with one log line."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SETUP = """
import json, logging, torch
logging.basicConfig(level=logging.INFO)
import sglang_sm120.plugin as plugin
plugin.register()
from sglang_sm120.seams import REGISTRY
import sglang.kernels.ops.attention.dsa.tilelang_kernel as tk
import sglang.srt.layers.attention.dsv4.indexer as up
from sglang_sm120.kernels import indexer as ix
FP8 = torch.float8_e4m3fn

def inputs(lens, max_seq_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = len(lens); width = -(-max_seq_len // 64); n_pages = B * width + 2
    q = (torch.randn(B, 1, 64, 128, generator=g) * 0.7).to(FP8)
    flat = torch.empty(n_pages, 8448, dtype=torch.uint8)
    flat[:, :8192] = torch.randn(n_pages, 8192, generator=g).to(FP8).view(torch.uint8)
    flat[:, 8192:] = (torch.rand(n_pages, 64, generator=g) + 0.25).view(torch.uint8)
    w = torch.randn(B, 64, generator=g) * 0.1
    pt = torch.randperm(n_pages, generator=g)[:B * width].view(B, width).int()
    return q, flat.view(n_pages, 64, 1, 132), w, torch.tensor(lens, dtype=torch.int32), pt
"""


def run(code: str, interpret: bool = True, **env) -> dict:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SM120_") and k != "TRITON_INTERPRET"}
    if interpret:
        full_env["TRITON_INTERPRET"] = "1"
    full_env.update(env)
    script = textwrap.dedent(SETUP) + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=full_env,
                          timeout=600, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "_stderr": proc.stderr}


ROUTING = """
    q, kv, w, l, pt = inputs([0, 100, 700], 768)
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, 768)
    res = {"active": REGISTRY.is_active("indexer")}
    for name, fn in (("tilelang", tk.tilelang_fp8_paged_mqa_logits),
                     ("torch_sm120", up.fp8_paged_mqa_logits_torch_sm120)):
        logits = fn(q, kv, w, l, pt, None, 768, False)
        finite = torch.isfinite(ref)
        res[name] = bool(torch.equal(torch.isinf(logits), torch.isinf(ref))
                         and torch.allclose(logits[finite], ref[finite], rtol=1e-5, atol=1e-4))
    # The indexer module's own binding (imported at its import) is rebound too; upstream's
    # top-k is a CUDA JIT kernel, so a CPU result at all means ours ran.
    out = torch.full((3, 512), 12345, dtype=torch.int32)
    up.topk_transform_paged(ref, l, pt, out, 64, None)
    expected = ix.positions_to_slots(ix.reference_topk_positions(ref, l), pt)
    res["topk"] = bool(torch.equal(out, expected))
    results["routing"] = res
"""

FUSED_CALL_SEQUENCE = """
    # The C4 indexer's call sequence (indexer.py:1083-1099, 948-998): the logits function chosen at
    # call time from the tilelang module, then topk_transform_paged from the indexer module.
    class TopKBackend:
        def is_torch(self): return False
        def is_flashinfer(self): return False
        def should_use_topk_v2(self): return False
    class Backend:
        dsa_topk_backend = TopKBackend()
        debug_use_external_c4_sparse_indices = False
    class C4:
        use_fp4_indexer = False

    def fake_forward(self, x, q_lora, c4_indexer, forward_batch, **kw):
        from sglang.kernels.ops.attention.dsa.tilelang_kernel import tilelang_fp8_paged_mqa_logits as fn
        logits = fn(q, kv, w, l, pt, None, 1536, False)
        self.logits_bytes = logits.untyped_storage().nbytes()
        up.topk_transform_paged(logits, l, pt, self.out, 64, self.raw)

    from sglang_sm120.indexer import forward_c4_indexer_hook
    q, kv, w, l, pt = inputs([1500, 300], 1536, seed=3)
    b = Backend()
    b.out = torch.full((2, 512), 12345, dtype=torch.int32)
    b.raw = torch.full((2, 512), 12345, dtype=torch.int32)
    forward_c4_indexer_hook(fake_forward, b, None, None, C4(), None)
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, 1536)
    two = torch.empty_like(b.out)
    ix.indexer_topk(q, kv, w, l, pt, 1536, two, plan=ix.Plan("two_kernel"))
    results[os.environ["SGLANG_SM120_INDEXER_PATH"]] = ({"logits_bytes": b.logits_bytes,
                      "same_as_two_kernel": [sorted(r) for r in b.out.tolist()] == [sorted(r) for r in two.tolist()],
                      "raw_consistent": bool(torch.equal(ix.positions_to_slots(b.raw.long(), pt), b.out)),
                      "short_row_in_order": b.out[1, :300].tolist() == ix.positions_to_slots(torch.arange(300)[None], pt[1:2])[0].tolist()})
"""


PATCH_ROUTE = """
    # patches/indexer.diff calls route() with SGLang's own functions at the same point.
    from sglang_sm120.indexer import route
    os.environ["SGLANG_SM120_INDEXER_PATH"] = "fused"
    fn, topk_fn = route(up.fp8_paged_mqa_logits_torch_sm120.__wrapped__, up.topk_transform_paged.__wrapped__,
                        Backend(), C4())
    logits = fn(q, kv, w, l, pt, None, 1536, False)
    routed = torch.full((2, 512), 12345, dtype=torch.int32)
    topk_fn(logits, l, pt, routed, 64, None)
    results["route"] = {"logits_bytes": logits.untyped_storage().nbytes(),
                        "same": [sorted(r) for r in routed.tolist()] == [sorted(r) for r in two.tolist()]}
"""

MTP_VERIFY_ROWS = """
    # A target-verify (MTP) step: SGLang's C4 indexer gives each draft token of a request its own
    # query row with its own compressed length and a copy of the request's page-table row
    # (indexer.py:848 ``q = q_indexer.unsqueeze(1)``, :882 ``query_rows``), so the seam sees s_q = 1
    # and these rows take our kernels like any decode batch.
    import inspect
    call_site = inspect.getsource(up)
    q, kv, w, l, pt = inputs([300, 1100], 1152, seed=5)
    per_request = 3
    rows = torch.arange(2).repeat_interleave(per_request)
    lens = torch.tensor([298, 299, 300, 1099, 1100, 1100], dtype=torch.int32)
    qv = (torch.randn(6, 1, 64, 128, generator=torch.Generator().manual_seed(9)) * 0.7).to(FP8)
    wv = torch.randn(6, 64, generator=torch.Generator().manual_seed(10)) * 0.1
    ptv = pt[rows].contiguous()
    logits = up.fp8_paged_mqa_logits_torch_sm120(qv, kv, wv, lens, ptv, None, 1152, False)
    ref = ix.reference_paged_mqa_logits(qv, kv, wv, lens, ptv, 1152)
    finite = torch.isfinite(ref)
    out = torch.full((6, 512), 12345, dtype=torch.int32)
    up.topk_transform_paged(ref, lens, ptv, out, 64, None)
    expected = ix.positions_to_slots(ix.reference_topk_positions(ref, lens), ptv)
    results["mtp_rows"] = {
        "call_site_one_row_per_token": "q = q_indexer.unsqueeze(1)" in call_site
                                       and "query_rows = q_indexer[0].shape[0] if use_fp4_indexer else q_indexer.shape[0]" in call_site,
        "logits": bool(torch.equal(torch.isinf(logits), torch.isinf(ref))
                       and torch.allclose(logits[finite], ref[finite], rtol=1e-5, atol=1e-4)),
        "topk": bool(torch.equal(out, expected)),
        "padding": [int((r == -1).sum()) for r in out],
    }
"""


# The histogram select defers the logits like the fused path (its logits kernel counts the
# histogram); the plan table picks it only on long rows (PLAN_TABLE), so this shape forces it.
HISTOGRAM_PLAN = """
    default_choose_plan = ix.choose_plan
    ix.choose_plan = lambda batch, n: ix.Plan("two_kernel", select=ix.SelectForm(method="histogram"),
                                              unfused_select=ix.SelectForm())
"""
RESTORE_PLAN = """
    ix.choose_plan = default_choose_plan
"""

FORCED = ("import os\nresults = {}\n" + textwrap.dedent(ROUTING)
          + "".join(f"os.environ['SGLANG_SM120_INDEXER_PATH'] = '{path}'\n" + textwrap.dedent(FUSED_CALL_SEQUENCE)
                    for path in ("fused", "two_kernel"))
          + "os.environ['SGLANG_SM120_INDEXER_PATH'] = 'auto'\n" + textwrap.dedent(HISTOGRAM_PLAN)
          + textwrap.dedent(FUSED_CALL_SEQUENCE) + textwrap.dedent(RESTORE_PLAN)
          + textwrap.dedent(PATCH_ROUTE) + textwrap.dedent(MTP_VERIFY_ROWS)
          + "print(json.dumps(results))\n")


@pytest.fixture(scope="module")
def forced():
    """One forced-on process (importing SGLang costs seconds) running every hooked-path check."""
    return run(FORCED, SGLANG_SM120_FORCE="1")


def test_forced_seam_routes_sglang_names_to_our_kernels(forced):
    assert forced["routing"] == {"active": True, "tilelang": True, "torch_sm120": True, "topk": True}
    assert "Triton logits kernel in use" in forced["_stderr"]


def test_fused_path_hands_off_from_logits_to_topk_without_writing_logits(forced):
    out = forced["fused"]
    assert out["logits_bytes"] == 4  # the placeholder: one float, expanded
    assert out["same_as_two_kernel"] and out["raw_consistent"] and out["short_row_in_order"]
    assert "fused logits+top-k path in use" in forced["_stderr"]


def test_two_kernel_path_through_the_same_sequence(forced):
    out = forced["two_kernel"]
    assert out["logits_bytes"] == 2 * 1536 * 4
    assert out["same_as_two_kernel"] and out["raw_consistent"] and out["short_row_in_order"]


def test_histogram_plan_defers_the_logits_to_the_topk_call(forced):
    out = forced["auto"]
    assert out["logits_bytes"] == 4  # the placeholder: the top-k call runs the logits kernel with its histogram
    assert out["same_as_two_kernel"] and out["raw_consistent"] and out["short_row_in_order"]
    assert "logits kernel with histogram select in use" in forced["_stderr"]


def test_patch_entry_point_routes_like_the_hooks(forced):
    assert forced["route"] == {"logits_bytes": 4, "same": True}


def test_kill_switch_leaves_upstream_functions():
    out = run("""
        q, kv, w, l, pt = inputs([100, 700], 768)
        before = up.fp8_paged_mqa_logits_torch_sm120
        logits = before(q, kv, w, l, pt, None, 768, False)
        print(json.dumps({"active": REGISTRY.is_active("indexer"),
                          "wrapped": [hasattr(f, "__wrapped__") for f in (tk.tilelang_fp8_paged_mqa_logits,
                                      up.fp8_paged_mqa_logits_torch_sm120, up.topk_transform_paged)],
                          "upstream_module": up.fp8_paged_mqa_logits_torch_sm120.__module__,
                          "shape": list(logits.shape)}))
    """, SGLANG_SM120_FORCE="1", SGLANG_SM120_DISABLE="indexer")
    assert not out["active"] and out["wrapped"] == [False, False, False]
    assert out["shape"] == [2, 768]


def test_uncovered_call_goes_upstream_with_one_log_line():
    # No GPU and no interpreter: our kernels cannot run, SGLang's torch path serves both calls.
    out = run("""
        q, kv, w, l, pt = inputs([100, 700], 768)
        a = up.fp8_paged_mqa_logits_torch_sm120(q, kv, w, l, pt, None, 768, False)
        b = up.fp8_paged_mqa_logits_torch_sm120(q, kv, w, l, pt, None, 768, False)
        from sglang_sm120.indexer import logits_uncovered
        fp4 = logits_uncovered((q, w), kv, w, l, pt, 768, False)
        print(json.dumps({"wrapped": hasattr(up.fp8_paged_mqa_logits_torch_sm120, "__wrapped__"),
                          "same": bool(torch.equal(a, b)), "fp4": fp4}))
    """, interpret=False, SGLANG_SM120_FORCE="1")
    assert out["wrapped"] and out["same"]
    assert "FP4" in out["fp4"]
    assert out["_stderr"].count("SGLang's logits function kept for this call") == 1


def test_mtp_verify_rows_reach_our_kernels_as_single_query_rows(forced):
    # s_q > 1 never reaches the seam in SGLang 0.5.23: verify steps arrive as one row per draft token.
    out = forced["mtp_rows"]
    assert out["call_site_one_row_per_token"]
    assert out["logits"] and out["topk"]
    assert out["padding"] == [512 - 298, 512 - 299, 512 - 300, 0, 0, 0]


def test_kernel_errors_fall_back_to_sglangs_functions(monkeypatch):
    """Our kernels raising after the checks (a Triton compile or launch error) hand the call to SGLang's functions
    instead of into SGLang: the logits kernel, the top-k kernel, and the deferred (fused / histogram) top-k call,
    whose fallback runs SGLang's logits function as the logits call came in, then SGLang's top-k."""
    import torch

    from sglang_sm120 import indexer as seam
    from sglang_sm120.kernels import indexer as ix

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory 120000 > 101376")

    for name in ("paged_mqa_logits", "topk_transform_paged", "indexer_topk"):
        monkeypatch.setattr(ix, name, broken)
    monkeypatch.setattr(seam, "logits_uncovered", lambda *args: None)
    monkeypatch.setattr(seam, "topk_uncovered", lambda *args: None)
    calls = []

    def sglang_logits(*args):
        calls.append(("logits", args))
        return torch.zeros(2, 768)

    def sglang_topk(scores, *args):
        calls.append(("topk", scores))

    q, kv, w = torch.zeros(2, 1, 64, 128), torch.zeros(4, 64, 1, 132), torch.zeros(2, 64)
    lens, pt, out = torch.tensor([100, 700], dtype=torch.int32), torch.zeros(2, 12, dtype=torch.int32), \
        torch.zeros(2, 512, dtype=torch.int32)
    logits = seam.logits_hook(sglang_logits, q, kv, w, lens, pt, "metadata", 768, False)
    assert calls[-1][0] == "logits" and calls[-1][1][5] == "metadata" and logits is not None
    seam.topk_hook(sglang_topk, logits, lens, pt, out, 64, None)
    assert calls[-1] == ("topk", logits)

    calls.clear()
    monkeypatch.setattr(seam, "_deferred_plan", lambda batch, n: ix.Plan("fused", ix.FUSED_SPLIT_PAGES[1]))
    token = seam._fusable.set(True)
    try:
        placeholder = seam.logits_hook(sglang_logits, q, kv, w, lens, pt, "metadata", 768, False)
        assert calls == []  # deferred to the top-k call
        seam.topk_hook(sglang_topk, placeholder, lens, pt, out, 64, None)
    finally:
        seam._fusable.reset(token)
    assert [c[0] for c in calls] == ["logits", "topk"] and calls[0][1] == (q, kv, w, lens, pt, "metadata", 768, False)
    assert seam._pending is None
