"""tools/device_sm120_dispatch.py: inside ``sm12x_dispatch`` every kernel module chooses its launches as on an sm_12x
GPU (its SM count, the indexer's block-scaled dot), outside it nothing is left changed, every raw GPU query in the
kernels goes through a patched function, and the summary reports every check the bench made."""

import ast
import os
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import device_sm120_dispatch as tool  # noqa: E402

from sglang_sm120.kernels import (bf16_gemv, dsv4, fp8_gemv, indexer, moe_mxfp4,  # noqa: E402
                                  moe_prefill, sparse_mla_decode)

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "kernels"
MODULES = {"bf16_gemv": bf16_gemv, "fp8_gemv": fp8_gemv, "indexer": indexer, "moe_mxfp4": moe_mxfp4,
           "moe_prefill": moe_prefill, "sparse_mla_decode": sparse_mla_decode}


@pytest.mark.parametrize("sms", sorted(set(dsv4.SM12X_SM_COUNTS.values())))
def test_inside_every_query_answers_as_sm12x_and_the_choices_follow(sms):
    cpu = torch.device("cpu")
    with tool.sm12x_dispatch(sms):
        assert bf16_gemv.sm_count(cpu) == sms
        assert fp8_gemv.sm_count() == sms
        assert moe_mxfp4._sm_count(cpu) == sms
        assert sparse_mla_decode._program_target("cpu") == sms
        assert sparse_mla_decode.large_batch_form_measured(cpu) is False
        rows, _large = sparse_mla_decode.LARGE_BATCH_CONFIGS[64]
        assert sparse_mla_decode.launch_config_for(64, rows, None, cpu) is sparse_mla_decode.LAUNCH_CONFIGS[64]
        assert indexer.use_scaled_dot(cpu) is True
        # the modules' own choosers see the count: the same choice as passing it explicitly
        for m in (1, 8):
            assert fp8_gemv.default_config(m, 4096, 8192) == fp8_gemv.default_config(m, 4096, 8192, sms=sms)
        assert (sparse_mla_decode.choose_splits(64, 16, cpu)
                == _choose_splits_with_target(sms, 64, 16))
        assert moe_mxfp4._resolve_split_k("auto", 8, 4096, 1024, False, None, None, cpu) == \
            moe_mxfp4.split_k_choice(8, 4096, 1024, sms)


def test_capability_queries_answer_as_sm12x_on_an_sm90_gpu(monkeypatch):
    """On a capability-9 GPU (the H200 that runs the check) the capability queries answer as sm_12x inside, and as
    that GPU again after."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    gpu = torch.device("cuda", 0)
    assert moe_prefill.register_caps_measured(gpu) is True
    assert moe_mxfp4.pairs_register_caps_measured(gpu) is True
    assert sparse_mla_decode.large_batch_form_measured(gpu) is True
    with tool.sm12x_dispatch(188):
        assert moe_prefill.register_caps_measured(gpu) is False
        assert all(cfg.max_registers == 0 for cfg in moe_prefill.prefill_configs(4096 * 6, 2048, gpu))
        assert moe_mxfp4.pairs_register_caps_measured(gpu) is False
        assert all(cfg.max_registers == 0 for cfg in moe_mxfp4.pairs_configs(64 * 6, 512, device=gpu))
        assert sparse_mla_decode.large_batch_form_measured(gpu) is False
    assert moe_prefill.register_caps_measured(gpu) is True
    assert moe_mxfp4.pairs_register_caps_measured(gpu) is True
    assert moe_mxfp4.pairs_configs(64 * 6, 512, device=gpu)[1].max_registers == 128
    assert sparse_mla_decode.large_batch_form_measured(gpu) is True


def _choose_splits_with_target(target, units, tiles):
    original = sparse_mla_decode._program_target
    sparse_mla_decode._program_target = lambda device: target
    try:
        return sparse_mla_decode.choose_splits(units, tiles, torch.device("cpu"))
    finally:
        sparse_mla_decode._program_target = original


def test_outside_nothing_is_changed_even_after_an_error():
    before = {(name, attr): getattr(MODULES[name], attr) for name, attr, _ in tool.DISPATCH_QUERIES}
    with pytest.raises(RuntimeError, match="inside"):
        with tool.sm12x_dispatch(188):
            assert indexer.use_scaled_dot(torch.device("cpu")) is True
            raise RuntimeError("inside")
    after = {(name, attr): getattr(MODULES[name], attr) for name, attr, _ in tool.DISPATCH_QUERIES}
    assert after == before
    assert indexer.use_scaled_dot(torch.device("cpu")) is False  # the CPU's own answer again
    assert sparse_mla_decode.large_batch_form_measured(torch.device("cpu")) is True


def test_a_non_positive_sm_count_is_refused():
    with pytest.raises(ValueError, match="sms"):
        with tool.sm12x_dispatch(0):
            pass


# Helpers that ask the GPU on their callers' behalf: a call to one counts as asking the GPU, so each caller must be
# covered in its own right.
GPU_QUERY_HELPERS = {("interpreter", "cuda_capability_major")}


def _functions_asking_the_gpu(path):
    """Names of the functions in ``path`` whose own body asks torch for the SM count or the compute capability, or
    calls a helper of GPU_QUERY_HELPERS."""
    tree = ast.parse(path.read_text())
    asks = {"multi_processor_count", "get_device_capability"} | {name for _, name in GPU_QUERY_HELPERS}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if names & asks:
                found.add(node.name)
    return found


def test_every_sm_count_or_arch_query_in_the_kernels_is_covered():
    """A kernel module that starts asking the GPU something new must be added to DISPATCH_QUERIES (or listed here as
    answering the same on sm_90 and sm_12x), else the tool would run the H200's choice and call it sm_12x's."""
    patched = {(name, attr) for name, attr, _ in tool.DISPATCH_QUERIES}
    # the raw query -> the patched function every caller goes through
    reached_through = {
        ("bf16_gemv", "_device_facts"): ("bf16_gemv", "sm_count"),
        ("fp8_gemv", "_device_sm_count"): ("fp8_gemv", "sm_count"),
        ("moe_mxfp4", "_cuda_sm_count"): ("moe_mxfp4", "_sm_count"),
        ("sparse_mla_decode", "_program_target"): ("sparse_mla_decode", "_program_target"),
        ("sparse_mla_decode", "large_batch_form_measured"): ("sparse_mla_decode", "large_batch_form_measured"),
        ("moe_prefill", "register_caps_measured"): ("moe_prefill", "register_caps_measured"),
        ("moe_mxfp4", "pairs_register_caps_measured"): ("moe_mxfp4", "pairs_register_caps_measured"),
        ("indexer", "use_scaled_dot"): ("indexer", "use_scaled_dot"),
    }
    # capability >= 9 (PDL, TMA): true on the H200 and on sm_12x alike
    same_on_both = {("pdl", "_capability_major"), ("interpreter", "has_capability"), ("devicebench", "environment")}
    seen = set()
    for path in [*KERNELS.glob("*.py"), *KERNELS.glob("harness/*.py")]:
        for fn in _functions_asking_the_gpu(path):
            key = (path.stem, fn)
            seen.add(key)
            assert key in reached_through or key in same_on_both or key in GPU_QUERY_HELPERS, \
                f"{path.name}: {fn} asks the GPU, not covered"
    assert set(reached_through) <= seen  # the map names functions that exist
    assert GPU_QUERY_HELPERS <= seen
    assert set(reached_through.values()) == patched


def _results(checks_by_point):
    layers = [dict(kind=k, T=1, context=1024, B=b, path="plugin", checks=c) for (k, b), c in checks_by_point.items()]
    return dict(layers=layers, grid=dict(B=[1, 3], T=[1], context=[1024], kinds=["swa"]), errors=[], skipped=[])


def test_summary_lists_every_check_its_worst_value_and_each_failure():
    results = _results({
        ("swa", 1): {"wo_a": dict(rel_err=0.001, tol=0.02, ok=True),
                     "indexer": dict(overlap=0.99, tol="overlap >= 0.95", ok=True)},
        ("swa", 3): {"wo_a": dict(rel_err=0.05, tol=0.02, ok=False),
                     "indexer": dict(overlap=0.97, tol="overlap >= 0.95", ok=True)},
    })
    rows = tool.check_rows(results)
    assert len(rows) == 4 and sum(not r["ok"] for r in rows) == 1
    text = tool.summary_markdown([dict(sms=188, gpu_name="RTX PRO 6000 Blackwell", seconds=1.0, results=results)],
                                 {"gpu": "NVIDIA H200"}, ["x"])
    assert "3/4 checks pass" in text
    assert "| wo_a | rel_err | 2 | 0.05 | 0.02 | 1 |" in text
    assert "| indexer | top-k overlap | 2 | 0.97 |" in text  # the worst overlap is the smallest
    assert "swa T=1 ctx=1024 B=3 wo_a: rel_err 0.05" in text
    assert "stand for no sm_12x GPU" in text


def test_gpu_names_come_from_the_shapes_module():
    for name, count in dsv4.SM12X_SM_COUNTS.items():
        assert name in tool.gpu_name_for(count)
    assert tool.gpu_name_for(7) == "no listed sm_12x GPU"


def test_a_run_with_no_finished_point_is_named_not_dropped():
    text = tool.summary_markdown([dict(sms=170, gpu_name="RTX 5090", seconds=0.0, results=None)], {}, ["x"])
    assert "170 SMs (RTX 5090): no grid point finished" in text


@pytest.fixture
def interpreter_bench(monkeypatch):
    """The bench's reduced CPU layers at B=1, T=1, plugin path only (the tool's --smoke grid, one SM count)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernels run under the Triton interpreter only here")
    from sglang_sm120.bench import layer as L
    from sglang_sm120.bench import runner

    runner.interpreter_ready()
    cfg = runner.default_cpu_config()
    cfg.batches, cfg.tps, cfg.paths = (1,), (1,), (L.PLUGIN,)
    return runner, cfg


def test_the_plugin_path_passes_every_check_with_sm12x_choices(interpreter_bench):
    """End to end at reduced sizes: every stage of the three layer kinds, launched as an RTX PRO 6000 would launch
    them (the indexer through its block-scaled dot), agrees with its float32 reference."""
    runner, cfg = interpreter_bench
    asked = []
    with tool.sm12x_dispatch(188):
        sm12x_answer = indexer.use_scaled_dot

        def counting(device=None):
            asked.append(device)
            return sm12x_answer(device)
        indexer.use_scaled_dot = counting  # restored by the context with the rest
        results = runner.run(cfg, log=lambda *a: None)
    rows = tool.check_rows(results)
    assert not results["errors"] and not results["checks_failed"]
    assert rows and all(r["ok"] for r in rows)
    assert {r["stage"] for r in rows} >= {"attention", "wo_a", "routed_experts", "indexer"}
    assert asked  # the indexer stage chose its dot through the patched query
    assert indexer.use_scaled_dot(torch.device("cpu")) is False
