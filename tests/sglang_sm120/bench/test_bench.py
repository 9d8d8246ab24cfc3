"""`sglang-sm120 bench`: the CPU mode end to end (reduced layers under the interpreter, both paths
against the float32 references), and the report's tables/JSON on a timed result."""

import copy
import json

import pytest
import torch

from sglang_sm120.bench import layer as L
from sglang_sm120.bench import model, projection, report, runner, upstream_ops
from sglang_sm120.kernels import dsv4

REPLACED = {"dense", "attention", "indexer", "wo_a", "moe", "bf16_linear"}
COMMON_CHECKED = {"input_norm", "q_norm", "q_head_norm", "post_attention_norm", "router_topk", "shared_act", "combine",
                  "indexer_q_quant"}


@pytest.fixture(scope="module")
def cpu_results():
    runner.interpreter_ready()
    cfg = runner.BenchConfig(device="cpu", dims=model.Dims.reduced(), batches=(2,), tps=(1, 2), contexts=(1024,),
                             check="all", upstream_source="sglang")
    return runner.run(cfg, log=lambda *a: None)


def test_cpu_mode_both_paths_match_the_reference(cpu_results):
    assert cpu_results["mode"] == "cpu-interpreter" and not cpu_results["timed"]
    assert cpu_results["checks_failed"] == []
    rows = cpu_results["layers"]
    assert {(r["kind"], r["T"], r["path"]) for r in rows} == {
        (k, t, p) for k in model.KINDS for t in (1, 2) for p in L.PATHS}
    for r in rows:
        replaced = {s["name"] for s in r["stages"] if s["component"] in REPLACED}
        # every replaced stage was checked, and so was every fused common stage (bench_common kernels)
        common = COMMON_CHECKED & {s["name"] for s in r["stages"]}
        assert common >= COMMON_CHECKED - {"indexer_q_quant"} and ("indexer_q_quant" in common) == (r["kind"] == "c4")
        assert set(r["checks"]) == replaced | common, (r["kind"], r["path"])
        assert all(c["ok"] for c in r["checks"].values())
        assert all(s["us"] is None for s in r["stages"]) and r["layer_us"] is None  # nothing timed
        if r["kind"] == "c4":
            assert r["checks"]["indexer"]["overlap"] >= runner.MIN_TOPK_OVERLAP
        # both paths ran the same stages, and the ones neither replaces are shared code
        assert [s["name"] for s in r["stages"]][-1] == "combine"
    by_kind = {(r["kind"], r["T"], r["path"]): [s["name"] for s in r["stages"]] for r in rows}
    for k in model.KINDS:
        assert by_kind[(k, 1, L.PLUGIN)] == by_kind[(k, 1, L.UPSTREAM)]
    assert "indexer" in by_kind[("c4", 1, L.PLUGIN)] and "indexer" not in by_kind[("c128", 1, L.PLUGIN)]
    assert "compressor_wkv_gate" not in by_kind[("swa", 1, L.PLUGIN)]


def test_cpu_report_says_nothing_was_timed(cpu_results, tmp_path):
    paths = report.write(copy.deepcopy(cpu_results), str(tmp_path), "bench-cpu")
    md = open(paths["md"]).read()
    assert "Nothing was timed" in md and "png" not in paths
    data = json.load(open(paths["json"]))
    for key in ("env", "dims", "layers", "checks_failed", "paths", "upstream_source", "steps", "projection",
                "common_pdl"):
        assert key in data
    # the bench's default: the shared stand-ins are PDL kernels like SGLang's (a no-op on the CPU)
    assert data["common_pdl"] is True
    assert report.PDL_NOTE in md and "PDL kernels like SGLang's" in data["paths"][L.PLUGIN]["common"]
    assert data["env"]["torch"] and data["env"]["triton"] and data["env"]["date"]
    assert data["projection"] == [] and all("plugin_step_us" not in s for s in data["steps"])


def _as_timed(results):
    """The CPU results with synthetic times filled in (what a GPU run records), to test the report."""
    res = copy.deepcopy(results)
    res.update(timed=True, mode="gpu", copy_bandwidth_gbs=4000.0)
    res["grid"]["B"] = [1]  # relabelled so that the B=1 targets apply
    for r in res["layers"] + res["lm_head"]:
        r["B"] = 1
    for r in res["layers"]:
        speed = 2000e9 if r["path"] == L.PLUGIN else 400e9
        for s in r["stages"]:
            s["us"] = s["bytes"] / speed * 1e6 + 1.0
            s["pct_copy_bw"] = runner._pct(s["bytes"], s["us"], 4000.0)
        r["layer_us"] = sum(s["us"] for s in r["stages"])
        r["layer_us_one_stream"] = 1.25 * r["layer_us"]
        r["pct_copy_bw"] = runner._pct(r["layer_bytes"], r["layer_us"], 4000.0)
        r["components_us"] = runner._components(r["stages"])
    for r in res["layers"]:
        if r["path"] == L.PLUGIN:
            up = next(u for u in res["layers"] if u["path"] == L.UPSTREAM and
                      (u["kind"], u["T"], u["context"], u["B"]) == (r["kind"], r["T"], r["context"], r["B"]))
            r["speedup"] = up["layer_us"] / r["layer_us"]
    for h in res["lm_head"]:
        h["us"] = h["bytes"] / 2000e9 * 1e6
    return res


def test_report_says_when_the_layers_ran_on_one_stream(cpu_results, tmp_path):
    res = copy.deepcopy(cpu_results)
    assert res["layer_streams"] == runner.LAYER_STREAMS_SGLANG  # the default: SGLang's decode streams
    res["layer_streams"] = runner.LAYER_STREAMS_ONE
    md = open(report.write(res, str(tmp_path), "bench-one")["md"]).read()
    assert report.STREAMS_ONE_NOTE in md and report.STREAMS_NOTE not in md
    del res["layer_streams"]  # results of runs before the streams: no claim either way
    md = open(report.write(res, str(tmp_path), "bench-old")["md"]).read()
    assert report.STREAMS_ONE_NOTE not in md and report.STREAMS_NOTE not in md


def test_report_says_when_pdl_was_off(cpu_results, tmp_path):
    res = copy.deepcopy(cpu_results)
    res["common_pdl"] = False
    md = open(report.write(res, str(tmp_path), "bench-pdl-off")["md"]).read()
    assert report.PDL_OFF_NOTE in md and report.PDL_NOTE not in md
    del res["common_pdl"]  # results of runs before the flag: no claim either way
    md = open(report.write(res, str(tmp_path), "bench-old")["md"]).read()
    assert report.PDL_OFF_NOTE not in md and report.PDL_NOTE not in md


def test_step_time_and_projection_arithmetic(cpu_results):
    res = _as_timed(cpu_results)
    steps = report.step_rows(res)
    assert len(steps) == 2  # T = 1, 2 at one context and batch
    for s in steps:
        layers = {(r["kind"], r["path"]): r for r in res["layers"] if r["T"] == s["T"]}
        head = next(h for h in res["lm_head"] if h["T"] == s["T"])
        for path in L.PATHS:
            want = sum(dsv4.LAYER_COUNTS[k] * layers[(k, path)]["layer_us"] for k in model.KINDS) + head["us"]
            assert s[f"{path}_step_us"] == pytest.approx(want)
        assert s["speedup"] == pytest.approx(s["upstream_step_us"] / s["plugin_step_us"])
        for path in L.PATHS:  # the same step with every layer on one stream, beside it
            want = sum(dsv4.LAYER_COUNTS[k] * layers[(k, path)]["layer_us_one_stream"] for k in model.KINDS) + head["us"]
            assert s[f"{path}_step_us_one_stream"] == pytest.approx(want)
        assert s["speedup_one_stream"] == pytest.approx(s["upstream_step_us_one_stream"] / s["plugin_step_us_one_stream"])
    proj = report.projection_rows(res, allreduce_us=None)
    assert {p["gpu"] for p in proj} == set(projection.SM120_GPUS)
    for p in proj:
        assert p["allreduce_included"] == (p["T"] == 1)
        # every layer kind and the lm_head are terms of the model, with their measured efficiency
        assert [t["kind"] for t in p["terms"]] == [*model.KINDS, "lm_head"]
    with_ar = report.projection_rows(res, allreduce_us=12.5)
    t2 = [p for p in with_ar if p["T"] == 2]
    assert t2 and all(p["allreduce_us_total"] == pytest.approx(dsv4.NUM_LAYERS * projection.ALLREDUCES_PER_LAYER * 12.5)
                      for p in t2)


def test_timed_table_and_json_carry_every_field(cpu_results, tmp_path):
    res = _as_timed(cpu_results)
    paths = report.write(res, str(tmp_path), "bench-fake", allreduce_us=None)
    md = open(paths["md"]).read()
    for needle in ("## Decode step", "plugin ms", "upstream ms", "speed-up", "% copy BW", "MB read", "layer µs",
                   "dense µs", "attention µs", "indexer µs", "wo_a µs", "moe µs", "## SWA layer", "## C4 layer",
                   "## C128 layer", "a MODEL, not a measurement", "t_step", "all-reduce term is excluded",
                   "RTX PRO 6000", "RTX 5090", "Copy bandwidth measured in this run", "## Issue targets",
                   "one-stream µs", "one stream: plugin ms", report.STREAMS_NOTE):
        assert needle in md, needle
    data = json.load(open(paths["json"]))
    assert data["copy_bandwidth_gbs"] == 4000.0 and data["env"]["date"]
    stage = data["layers"][0]["stages"][0]
    assert {"name", "component", "bytes", "us", "pct_copy_bw"} <= set(stage)
    row = next(r for r in data["layers"] if r["path"] == L.PLUGIN)
    assert {"layer_us", "layer_us_one_stream", "layer_bytes", "pct_copy_bw", "speedup", "components_us",
            "checks"} <= set(row)
    step = data["steps"][0]
    assert {"plugin_step_us", "upstream_step_us", "speedup", "plugin_bytes", "lm_head_us", "plugin_step_us_one_stream",
            "upstream_step_us_one_stream", "speedup_one_stream"} <= set(step)
    assert data["layer_streams"] == runner.LAYER_STREAMS_SGLANG
    assert data["projection_model"]["allreduce"].startswith("excluded")
    assert "png" in paths or any(n.startswith("plot:") for n in data["notes"])


def test_align_block_size_sorts_rows_into_single_expert_blocks():
    torch.manual_seed(0)
    ids = torch.randint(0, 8, (5, 3), dtype=torch.int32)
    block = 4
    sorted_ids, expert_ids, total = upstream_ops.align_block_size(ids, block, 8)
    flat = ids.flatten()
    n = int(total)
    assert n % block == 0 and sorted(sorted_ids[:n][sorted_ids[:n] < flat.numel()].tolist()) == list(range(15))
    assert (sorted_ids[n:] == flat.numel()).all()
    for b in range(n // block):
        rows = sorted_ids[b * block:(b + 1) * block]
        rows = rows[rows < flat.numel()].long()
        assert (flat[rows] == expert_ids[b]).all()
    assert (expert_ids[n // block:] == -1).all()


def test_triton_bundle_keeps_the_jit_decorators():
    src = upstream_ops.triton_bundle_source()
    for name in ("fused_moe_kernel", "write_zeros_to_output", "_w8a8_block_fp8_matmul", "_per_token_group_quant_8bit"):
        assert f"@triton.jit\ndef {name}(" in src, name
    assert "def get_default_config(" in src


def test_cli_wires_the_bench_subcommand():
    from sglang_sm120.cli import build_parser

    args = build_parser().parse_args(["bench", "--device", "cpu", "-b", "1", "-b", "4", "--allreduce-us", "9"])
    assert args.func.__name__ == "run_bench" and args.batch == [1, 4] and args.allreduce_us == 9.0


@pytest.mark.parametrize("argv,message", [
    (["-b", "0"], "--batch 0: a batch size is at least 1"),
    (["-b", "1", "-b", "-2"], "--batch -2: a batch size is at least 1"),
    (["--tp", "3"], "--tp 3: the reduced CPU layers (4 heads in 2 wo_a groups) shard over T in [1, 2]"),
    (["--tp", "8"], "--tp 8: the reduced CPU layers (4 heads in 2 wo_a groups) shard over T in [1, 2]"),
    (["--context", "-1"], "--context -1: a context length is at least 0 tokens"),
    (["--replays", "0"], "--replays 0: at least one replay per timing"),
    (["--time-budget-s", "0"], "--time-budget-s 0.0: a budget is a positive number of seconds"),
    (["--allreduce-us", "-5"], "--allreduce-us must be a time in microseconds (>= 0), got -5.0"),
    (["--allreduce-us", "nan"], "--allreduce-us must be a time in microseconds (>= 0), got nan"),
])
def test_cli_refuses_a_grid_that_cannot_run(argv, message, capsys, tmp_path):
    """Exit 2 with the flag and the reason before any layer is built (these were tracebacks or an ERROR row)."""
    from sglang_sm120.cli import main

    assert main(["bench", "--device", "cpu", "--kind", "swa", "--out", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing was run or written


def test_the_full_sizes_shard_over_every_supported_tp():
    from types import SimpleNamespace

    from sglang_sm120.bench.cli import grid_problems

    cfg = runner.BenchConfig(device="cuda", dims=model.Dims.full(), batches=(1, 64), tps=dsv4.SUPPORTED_TP,
                             contexts=(0, 8192))
    assert grid_problems(cfg, SimpleNamespace(replays=7, time_budget_s=None)) == []


def test_rank_shards_and_rejects_indivisible_tp():
    full = model.Dims.full()
    for tp in dsv4.SUPPORTED_TP:
        ours = full.rank(tp).dense_shapes()
        theirs = dsv4.dense_linear_shapes(tp)
        for name in ours:
            assert ours[name] == theirs[name], (name, tp)
        assert full.rank(tp).groups * full.rank(tp).group_width == theirs["wo_a"][0] // dsv4.O_LORA_RANK * 4096
    with pytest.raises(ValueError, match="T=3"):
        model.Dims.reduced().rank(3)


def test_weights_per_rank_shrink_with_tp():
    full = model.Dims.full()
    t1 = model.weight_bytes_per_rank(full, 1)
    assert 130 * 2**30 < t1 < 160 * 2**30  # DSv4-Flash in its checkpoint formats
    for tp in (2, 4, 8):
        # everything but wqkv_a, the indexer, compressors and the router is split T ways
        assert t1 / tp < model.weight_bytes_per_rank(full, tp) < 1.1 * t1 / tp


class _RecordingState(dict):
    """The stages' state dict, recording which stage read and wrote each key."""

    def __init__(self):
        super().__init__()
        self.stage = None
        self.reads: dict[str, set] = {}
        self.writer: dict[str, str] = {}

    def __getitem__(self, key):
        if self.stage is not None:
            self.reads.setdefault(self.stage, set()).add(key)
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        if self.stage is not None:
            self.writer[key] = self.stage
        super().__setitem__(key, value)


def _streams(stages):
    return {s.name: s.stream for s in stages}


@pytest.mark.parametrize("kind", model.KINDS)
def test_streams_order_every_read_after_its_write(kind):
    """On SGLang's decode streams every stage still runs after the stages whose outputs it reads (a wait or the
    same stream), so the multi-stream layer computes what the one-stream layer does."""
    runner.interpreter_ready()
    dims = model.Dims.reduced()
    state_w = L.LayerState(model.build_weights(dims.rank(1), "cpu"), None)
    caches = model.build_caches(kind, dims, 2, 1024, "cpu")
    x = torch.randn(2, dims.hidden).to(torch.bfloat16)
    st = _RecordingState()
    stages = L.build_stages(L.PLUGIN, kind, state_w, caches, x, st)
    for stage in stages:
        st.stage = stage.name
        stage.fn()
    st.stage = None
    assert torch.isfinite(st["out"].float()).all()
    checked = 0
    for stage in stages:
        before = L._happens_before(stages, stage.name)
        for key in st.reads.get(stage.name, ()):
            writer = st.writer.get(key)
            if writer is not None and writer != stage.name:
                assert writer in before, (stage.name, key, writer)
                checked += 1
    assert checked >= 10
    streams = _streams(stages)
    assert streams["shared_gate_up"] == streams["shared_down"] == L.STREAM_SHARED_EXPERT
    assert streams["routed_experts"] == streams["combine"] == L.MAIN
    if kind != "swa":
        assert streams["compressor_wkv_gate"] == L.STREAM_COMPRESSOR
        assert "compressor_wkv_gate" in L._happens_before(stages, "attention")
    if kind == "c4":  # the indexer writes the attention's extra indices in the caches, not in the state dict
        assert streams["indexer"] == streams["indexer_compressor"] == L.STREAM_INDEXER
        assert streams["weights_proj"] == L.STREAM_INDEX_WEIGHTS
        assert streams["indexer_wq_b"] == streams["indexer_q_quant"] == L.STREAM_INDEX_Q
        assert "indexer" in L._happens_before(stages, "attention")
        # overlapped as in SGLang: neither the query projection nor the indexer waits for the other
        assert "indexer" not in L._happens_before(stages, "wq_b")
        assert "wq_b" not in L._happens_before(stages, "indexer")
    # the shared expert overlaps the router and the routed experts
    assert "routed_experts" not in L._happens_before(stages, "shared_down")
    assert "shared_down" not in L._happens_before(stages, "routed_experts")


def test_attention_prepare_stays_on_one_stream_above_sglangs_batch_limit():
    dims = model.Dims.reduced()
    batch = L.ATTENTION_MULTI_STREAM_MAX_BATCH + 1
    state_w = L.LayerState(model.build_weights(dims.rank(1), "cpu"), None)
    caches = model.build_caches("c4", dims, batch, 256, "cpu")
    x = torch.zeros(batch, dims.hidden, dtype=torch.bfloat16)
    streams = _streams(L.build_stages(L.PLUGIN, "c4", state_w, caches, x, {}))
    side = {name for name, s in streams.items() if s != L.MAIN}
    assert side == {"shared_gate_up", "shared_act", "shared_down"}  # the MoE's dual stream has no limit


def _stage(name, stream=L.MAIN, waits=()):
    return L.Stage(name, "common", lambda: None, 0, None, stream, tuple(waits))


@pytest.mark.parametrize("stages, match", [
    ([_stage("a"), _stage("b", "nowhere", ("a",))], "unknown stream"),
    ([_stage("a"), _stage("b", L.STREAM_COMPRESSOR, ("c",)), _stage("c")], "not an earlier stage"),
    ([_stage("a"), _stage("b", L.MAIN, ("a",))], "on its own stream"),
    ([_stage("a"), _stage("b", L.STREAM_COMPRESSOR)], "without waiting"),
    ([_stage("a"), _stage("b", L.STREAM_COMPRESSOR, ("a",)), _stage("c")], "never joined"),
])
def test_check_schedule_rejects_schedules_that_cannot_run(stages, match):
    with pytest.raises(ValueError, match=match):
        L.check_schedule(stages)
    L.check_schedule([_stage("a"), _stage("b", L.STREAM_COMPRESSOR, ("a",)), _stage("c", L.MAIN, ("b",))])


def test_run_layer_without_streams_runs_the_stages_in_order():
    order = []
    stages = [L.Stage(n, "common", (lambda n=n: order.append(n)), 0) for n in "abc"]
    L.run_layer(stages)
    assert order == ["a", "b", "c"]


def test_run_layer_refuses_a_side_stream_that_is_the_capturing_stream(monkeypatch):
    """torch hands streams out round-robin from a small pool, so a side stream can be the capturing stream: the
    layer must refuse to be captured rather than time its side stages in line."""
    current = object()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    ran = []
    stages = [L.Stage("a", "common", lambda: ran.append("a"), 0),
              L.Stage("b", "common", lambda: ran.append("b"), 0, None, L.STREAM_SHARED_EXPERT, ("a",)),
              L.Stage("c", "common", lambda: ran.append("c"), 0, None, L.MAIN, ("b",))]
    with pytest.raises(RuntimeError, match="'shared_expert' is the capturing stream"):
        L.run_layer(stages, {L.STREAM_SHARED_EXPERT: current})
    assert ran == []  # refused before any stage ran


@pytest.mark.parametrize("streams_out, ok", [(1.0, True), (1.5, False)])
def test_streams_check_compares_the_layer_on_streams_with_one_stream(monkeypatch, streams_out, ok):
    """GPU runs check the layer's output on SGLang's streams against the one-stream layer (here with a stand-in
    for run_layer: the one-stream run writes ones, the streams run ``streams_out``)."""
    state = {}

    def fake_run_layer(stages, side_streams=None):
        state["out"] = torch.full((2, 8), 1.0 if side_streams is None else streams_out)
    monkeypatch.setattr(L, "run_layer", fake_run_layer)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    result = runner._streams_check([], state, {"shared_expert": object()})
    assert result["ok"] is ok and result["tol"] == runner.STREAMS_TOLERANCE
    assert (result["rel_err"] == 0.0) == ok
