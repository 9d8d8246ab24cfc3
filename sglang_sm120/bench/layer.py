"""One decoder layer's decode step as a list of stages, for the plugin path or the upstream path.

A stage reads and writes tensors in a shared state dict, so the same list runs as one layer (all
stages in order, one CUDA graph) or stage by stage (each in its own graph, for the per-kernel
times). Stages the plugin does not replace (norms, the router gate GEMM and top-k, the indexer's
query quantisation, the shared expert's activation, the combine) are the *same code* in both paths,
so the difference between the paths is the plugin's. The elementwise ones run as one fused Triton
launch each (``kernels/bench_common.py``), standing in for the fused JIT kernels SGLang runs there,
and the router gate runs on the bf16 GEMV up to 8 rows, standing in for SGLang's JIT tiny_gemm_bf16,
so that the step's absolute time is not inflated by unfused torch or by cuBLAS's split-K pair. Like SGLang's
kernels for these stages on sm_90+ (sm_120 included), they launch with programmatic dependent launch
by default (``common_pdl``; see kernels/bench_common.py for the SGLang/FlashInfer sources).

Each stage also names the stream SGLang 0.5.23 runs it on in CUDA-graph decode and the stages of other
streams it waits for, so that a layer can run as SGLang forks it (``run_layer`` with streams) or on one
stream. SGLang on CUDA (sm_120 included) overlaps, with ``SGLANG_OPT_USE_MULTI_STREAM_OVERLAP`` on (its
default): the compressor and the C4 indexer with the query projections in the attention's prepare, at up
to ``ATTENTION_MULTI_STREAM_MAX_BATCH`` rows (``DeepseekV4Attention._forward_prepare_multi_stream``,
srt/models/deepseek_v4.py:1891-1953, and ``_multi_stream_bs_limit`` at :1447; inside the indexer the
weights projection and the indexer's query on two more streams, srt/layers/attention/dsv4/indexer.py:530-574),
and the shared expert with the router and the routed experts at any batch size
(``DeepseekV2MoE.forward_normal_dual_stream``, srt/models/deepseek_v2.py:1096-1111, 1128-1260; the MoE's
alt stream comes from deepseek_v4.py:3143-3160). Both paths run the same schedule.

Not modelled (the same in both paths on a real server, and not runnable here): the mHC boundary
kernels (TileLang), RoPE and the KV/compressor cache writes (JIT CUDA), and the TP all-reduce.
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Callable

import torch

from ..kernels import dsv4
from . import model, upstream_ops

PLUGIN, UPSTREAM = "plugin", "upstream"

# The streams of SGLang's CUDA-graph decode step (module docstring). MAIN is the capturing stream.
MAIN = "main"
STREAM_COMPRESSOR = "compressor"  # stream_compressor: the attention compressor's wkv_gate
STREAM_INDEXER = "indexer"  # stream_indexer: the indexer compressor, then the logits + top-k
STREAM_INDEX_WEIGHTS = "index_weights"  # the indexer's stream_weights: weights_proj
STREAM_INDEX_Q = "index_q"  # the indexer's stream_q: its wq_b and the fused query quantisation
STREAM_SHARED_EXPERT = "shared_expert"  # the MoE's alt stream: the shared expert
SIDE_STREAMS = (STREAM_COMPRESSOR, STREAM_INDEXER, STREAM_INDEX_WEIGHTS, STREAM_INDEX_Q, STREAM_SHARED_EXPERT)
# SGLang forks the attention's prepare over streams up to this many rows on Blackwell (sm_10x..sm_12x) GPUs,
# the ones this bench stands for (deepseek_v4.py:1447; 64 on others); the MoE's dual stream has no limit.
ATTENTION_MULTI_STREAM_MAX_BATCH = 128


def common_name(pdl: bool = True) -> str:
    """What the shared 'common' component runs, with or without PDL on its Triton stand-ins."""
    launch = "PDL kernels like SGLang's" if pdl else "launched without PDL"
    return (f"Triton fused norms/router/SwiGLU/combine/indexer query quantisation ({launch}) + the router gate on the "
            "bf16 GEMV up to 8 rows (for SGLang's JIT tiny_gemm_bf16), cuBLAS fp32-out above (same code in both paths), "
            "standing in for SGLang's fused JIT kernels")


COMMON_NAME = common_name()
PATHS = (PLUGIN, UPSTREAM)
# what each replaced component is, per path (printed with the results)
COMPONENT_NAMES = {
    "dense": {PLUGIN: "block_fp8_linear (FP8 GEMV, bf16 activations)", UPSTREAM: upstream_ops.NAMES["dense"]},
    "attention": {PLUGIN: "sparse_mla_decode (tensor-core Triton, split-K)", UPSTREAM: upstream_ops.NAMES["attention"]},
    "indexer": {PLUGIN: "indexer_topk (FP8 paged logits + Triton top-k)", UPSTREAM: upstream_ops.NAMES["indexer"]},
    "wo_a": {PLUGIN: "grouped_fp8_wo_a (FP8 weight)", UPSTREAM: upstream_ops.NAMES["wo_a"]},
    "moe": {PLUGIN: "moe_mxfp4_forward (MXFP4 experts)", UPSTREAM: upstream_ops.NAMES["moe"]},
    "bf16_linear": {PLUGIN: "bf16_gemv (Triton, CUDA cores) where the bf16_linear seam takes the call (compressors "
                            "<= 4 rows, weights_proj <= 8), else upstream's call",
                    UPSTREAM: upstream_ops.NAMES["bf16_linear"]},
    "common": {PLUGIN: COMMON_NAME, UPSTREAM: COMMON_NAME},
}
COMPONENTS = tuple(COMPONENT_NAMES)


@dataclasses.dataclass
class Stage:
    name: str
    component: str  # one of COMPONENTS
    fn: Callable[[], None]
    bytes: int  # what it must read (and write), checkpoint formats, this rank
    check: Callable[[], dict] | None = None  # against the float32 reference, after a full run
    stream: str = MAIN  # where SGLang's multi-stream decode runs it (MAIN or one of SIDE_STREAMS)
    waits: tuple = ()  # names of earlier stages on other streams it waits for (SGLang's events / stream joins)


def check_schedule(stages: list[Stage]) -> None:
    """Raise ValueError unless the stream schedule can run (and be captured): every wait names an earlier stage
    on another stream, every side stream starts by waiting for something (its fork from the capture), and MAIN
    waits, directly or through later stages, for every side stream's last stage (the joins)."""
    seen: dict[str, Stage] = {}
    last_on: dict[str, str] = {}
    for stage in stages:
        if stage.stream != MAIN and stage.stream not in SIDE_STREAMS:
            raise ValueError(f"stage {stage.name!r}: unknown stream {stage.stream!r}")
        for dep in stage.waits:
            if dep not in seen:
                raise ValueError(f"stage {stage.name!r} waits for {dep!r}, which is not an earlier stage")
            if seen[dep].stream == stage.stream:
                raise ValueError(f"stage {stage.name!r} waits for {dep!r} on its own stream")
        if stage.stream != MAIN and stage.stream not in last_on and not stage.waits:
            raise ValueError(f"stage {stage.name!r} starts stream {stage.stream!r} without waiting for anything")
        seen[stage.name] = stage
        last_on[stage.stream] = stage.name
    joined = _happens_before(stages, stages[-1].name) if stages else set()
    for stream, name in last_on.items():
        if stream != MAIN and name not in joined:
            raise ValueError(f"stream {stream!r} is never joined: the last stage ({name!r}) is not waited for")


def _happens_before(stages: list[Stage], name: str) -> set[str]:
    """The stages ordered before ``name`` by the schedule: earlier on its stream, or waited for (transitively)."""
    index = {s.name: i for i, s in enumerate(stages)}
    before: set[str] = set()
    todo = [name]
    while todo:
        cur = stages[index[todo.pop()]]
        preds = [s.name for s in stages[:index[cur.name]] if s.stream == cur.stream] + list(cur.waits)
        for p in preds:
            if p not in before:
                before.add(p)
                todo.append(p)
    return before


_on_side_streams = contextvars.ContextVar("sglang_sm120_bench_side_streams", default=False)


def on_side_streams() -> bool:
    """Whether the layer now running runs its stages on their streams (SGLang's multi-stream decode), not in line."""
    return _on_side_streams.get()


def run_layer(stages: list[Stage], side_streams: dict | None = None) -> None:
    """One layer: every stage in order on the current stream (``side_streams`` None), or with each stage on its
    stream (a dict of SIDE_STREAMS name -> torch.cuda.Stream), the waits as events and the side streams joined
    into the current stream at the end, so that back-to-back calls (and a CUDA graph of them) stay ordered."""
    if side_streams is None:
        for stage in stages:
            stage.fn()
        return
    main = torch.cuda.current_stream()
    if torch.cuda.is_current_stream_capturing():
        for name in {stage.stream for stage in stages} - {MAIN}:
            if side_streams[name] == main:
                # torch hands streams out round-robin from a small pool: a side stream that is the capturing stream
                # would run its stages in line in the graph, timed on fewer streams than the layer names (an eager
                # warm-up on such a stream only serialises, with the same results)
                raise RuntimeError(f"side stream {name!r} is the capturing stream; create the side streams apart "
                                   "from the capture stream")
    events: dict[str, torch.cuda.Event] = {}
    used = []
    token = _on_side_streams.set(True)
    try:
        for stage in stages:
            stream = main if stage.stream == MAIN else side_streams[stage.stream]
            if stream is not main and stage.stream not in used:
                used.append(stage.stream)
            for dep in stage.waits:
                stream.wait_event(events[dep])
            with torch.cuda.stream(stream):
                stage.fn()
            events[stage.name] = torch.cuda.Event()
            events[stage.name].record(stream)
    finally:
        _on_side_streams.reset(token)
    for name in used:
        main.wait_stream(side_streams[name])


def _relerr(actual, expected) -> float:
    a, e = actual.double(), expected.double()
    return ((a - e).norm() / e.norm().clamp_min(1e-30)).item()


class LayerState:
    """Weights prepared for both paths (the plugin repacks w13 in place; upstream gets bf16
    dequantised copies of the experts and of wo_a, as SGLang on sm_120 holds them)."""

    def __init__(self, weights: model.Weights, upstream: upstream_ops.UpstreamOps | None):
        from ..kernels import fp8_gemv, moe_mxfp4

        self.w = weights
        self.upstream = upstream
        self.w13_plugin = weights.w13.clone()
        self.w13_scale_plugin = weights.w13_scale.clone()
        moe_mxfp4.repack_w13_(self.w13_plugin, self.w13_scale_plugin)
        if upstream is not None:
            self.wo_a_bf16 = fp8_gemv.dequantize_block_fp8(*weights.wo_a, torch.bfloat16)
            self.w13_bf16 = _dequant_experts(weights.w13, weights.w13_scale)
            self.w2_bf16 = _dequant_experts(weights.w2, weights.w2_scale)


def _dequant_experts(packed, scale):
    from ..kernels import moe_mxfp4

    out = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2, dtype=torch.bfloat16, device=packed.device)
    for e in range(packed.shape[0]):  # one expert at a time: fp32 scratch stays small
        out[e] = moe_mxfp4.reference_dequant_mxfp4(packed[e], scale[e]).to(torch.bfloat16)
    return out


def build_stages(path: str, kind: str, layer: LayerState, caches: model.Caches, x: torch.Tensor,
                 state: dict, common_pdl: bool = True) -> list[Stage]:
    """The decode step of one ``kind`` layer on ``x [B, hidden]`` as stages of ``path``; ``common_pdl``: the
    shared bench_common kernels launch with PDL where the GPU has it (both paths alike)."""
    from .. import bf16_linear as bf16_seam
    from ..kernels import bench_common, bf16_gemv, fp8_gemv, indexer, moe_mxfp4, sparse_mla_decode

    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    w, rank = layer.w, layer.w.rank
    d = rank.dims
    ups = layer.upstream
    if path == UPSTREAM and ups is None:
        raise ValueError("the upstream path needs upstream ops (upstream_ops.load())")
    batch = x.shape[0]
    st = state
    st["x"] = x
    stages: list[Stage] = []

    def add(name, component, fn, nbytes, check=None, stream=MAIN, waits=()):
        stages.append(Stage(name, component, fn, int(nbytes), check, stream, tuple(waits)))

    # SGLang forks the attention's prepare only up to a batch limit; the shared expert always
    prepare_streams = batch <= ATTENTION_MULTI_STREAM_MAX_BATCH

    def side(stream):
        return stream if prepare_streams else MAIN

    def waits_on(stream, *deps):  # no waits where everything runs on MAIN
        return deps if stream != MAIN else ()

    def dense(name, src, dst, view=None, stream=MAIN, waits=(), share_sms=False):
        weight, scale = w.dense[name]
        n, k = weight.shape

        def fn():
            a = st[src] if view is None else view(st[src])
            if path == PLUGIN:
                st[dst] = fp8_gemv.block_fp8_linear(a, weight, scale, share_sms=share_sms)
            else:
                st[dst] = upstream_ops.block_fp8_linear(ups, a, weight, scale)

        def check():
            a = st[src] if view is None else view(st[src])
            exact = _relerr(st[dst], fp8_gemv.reference_block_fp8_linear(a, weight, scale))
            if path == PLUGIN:
                return {"rel_err": exact}
            # upstream quantises activations to FP8 per 128-group: its float32 specification is
            # that quantisation followed by the exact block GEMM; the error vs exact is reported too
            spec = fp8_gemv.reference_upstream_fp8_activation_linear(a, weight, scale)
            return {"rel_err": _relerr(st[dst], spec), "rel_err_vs_exact": exact}
        add(name, "dense", fn, model.fp8_linear_bytes(n, k, batch), check, stream, waits)

    # SGLang's router gate: its JIT tiny_gemm_bf16 (one PDL kernel, fp32 logits) at <= 16 rows, cuBLAS above; not
    # replaced by the plugin. Both paths run the bf16 GEMV in its place where it takes the rows (<= 8), else cuBLAS.
    gate_tiny = 1 <= batch <= min(dsv4.ROUTER_TINY_GEMM_MAX_ROWS, bf16_gemv.MAX_ROWS)

    def router_gate(src, dst):
        def fn():
            if gate_tiny:
                st[dst] = bf16_gemv.bf16_linear(st[src], w.gate, out_dtype=torch.float32)
            else:
                st[dst] = upstream_ops.linear_bf16_fp32(st[src], w.gate)
        add("router_gate", "common", fn, model.bf16_linear_bytes(w.gate.shape[0], w.gate.shape[1], batch))

    def bf16_proj(name, weight, src, dst, max_rows, index_weights=False, stream=MAIN, waits=()):
        """A projection of the bf16_linear seam: the compressors' wkv_gate (SGLang's linear_bf16_fp32, float32 out)
        or, with ``index_weights``, weights_proj (``F.linear``, bf16 out: SGLang's compute_weights(skip_scale=True),
        whose scale the indexer's fused query kernel applies)."""
        out_dtype = torch.bfloat16 if index_weights else torch.float32
        ours = path == PLUGIN and 1 <= batch <= max_rows

        def fn():
            x = st[src]
            if ours:
                # as the seam: a compressor in SGLang's multi-stream prepare runs beside the query projections;
                # in line (one stream) it keeps the tile of a call alone
                share = not index_weights and stream != MAIN and on_side_streams()
                st[dst] = bf16_gemv.bf16_linear(x, weight, out_dtype=out_dtype, share_sms=share)
            elif index_weights:
                st[dst] = torch.nn.functional.linear(x, weight)
            else:
                st[dst] = upstream_ops.linear_bf16_fp32(x, weight)

        def check():
            return {"rel_err": _relerr(st[dst], bf16_gemv.reference_bf16_linear(st[src], weight))}
        add(name, "bf16_linear", fn, model.bf16_linear_bytes(weight.shape[0], weight.shape[1], batch), check, stream,
            waits)

    act_bytes = batch * d.hidden * 2 * 2

    def input_norm():
        st["h"] = bench_common.rms_norm(st["x"], w.norms["attn"], pdl=common_pdl)

    def check_input_norm():
        return {"rel_err": _relerr(st["h"], bench_common.reference_rms_norm(st["x"], w.norms["attn"]))}
    add("input_norm", "common", input_norm, act_bytes, check_input_norm)
    dense("wqkv_a", "h", "qkv")

    def q_norm():
        st["q_lora"] = bench_common.rms_norm(st["qkv"][:, :d.q_lora], w.norms["q"], pdl=common_pdl)

    def check_q_norm():
        return {"rel_err": _relerr(st["q_lora"], bench_common.reference_rms_norm(st["qkv"][:, :d.q_lora],
                                                                                 w.norms["q"]))}
    add("q_norm", "common", q_norm, batch * d.q_lora * 4, check_q_norm)

    # SGLang forks its side streams before wqkv_a: the compressors need only the normed input
    if kind in ("c4", "c128"):
        s_comp = side(STREAM_COMPRESSOR)
        bf16_proj("compressor_wkv_gate", w.compressor[kind], "h", "kv_score", bf16_seam.COMPRESSOR_MAX_ROWS,
                  stream=s_comp, waits=waits_on(s_comp, "input_norm"))

    if kind == "c4":
        s_idx, s_iw, s_iq = side(STREAM_INDEXER), side(STREAM_INDEX_WEIGHTS), side(STREAM_INDEX_Q)
        bf16_proj("indexer_compressor", w.index_compressor, "h", "index_score", bf16_seam.COMPRESSOR_MAX_ROWS,
                  stream=s_idx, waits=waits_on(s_idx, "input_norm"))
        bf16_proj("weights_proj", w.weights_proj, "h", "index_w_proj", bf16_seam.WEIGHTS_PROJ_MAX_ROWS,
                  index_weights=True, stream=s_iw, waits=waits_on(s_iw, "input_norm"))
        # the indexer's query waits for q_lora (main) and for the weights (they are folded into its fused kernel)
        dense("indexer_wq_b", "q_lora", "index_q", stream=s_iq, waits=waits_on(s_iq, "q_norm", "weights_proj"))
        index_q_view = lambda: st["index_q"].view(batch, d.index_heads, d.index_head_dim)  # noqa: E731

        def index_q_quant():  # SGLang's fused JIT query kernel (RoPE and Hadamard not modelled): one launch
            q_fp8, st["index_w"] = bench_common.index_q_quant(index_q_view(), st["index_w_proj"],
                                                              dsv4.INDEX_WEIGHT_SCALE, pdl=common_pdl)
            st["index_q_fp8"] = q_fp8.view(batch, 1, d.index_heads, d.index_head_dim)

        def check_index_q_quant():
            scaled, _, weights = bench_common.reference_index_q_quant(index_q_view(), st["index_w_proj"],
                                                                      dsv4.INDEX_WEIGHT_SCALE)
            q_ref = scaled.to(torch.float8_e4m3fn).float().view(st["index_q_fp8"].shape)
            return {"rel_err": max(_relerr(st["index_q_fp8"].float(), q_ref), _relerr(st["index_w"], weights))}
        add("indexer_q_quant", "common", index_q_quant,
            batch * d.index_heads * (d.index_head_dim * 3 + 2 + 4), check_index_q_quant, stream=s_iq)
        n_c = caches.compressed_len
        k = d.index_topk

        def select():
            if path == PLUGIN:
                out = caches.extra_indices.view(batch, k)
                indexer.indexer_topk(st["index_q_fp8"], caches.index_k, st["index_w"], _lens(caches), caches.page_table,
                                     n_c, out)
            else:
                slots = upstream_ops.indexer_topk(ups, st["index_q_fp8"], caches.index_k, st["index_w"], _lens(caches),
                                                  caches.page_table, n_c, k)
                caches.extra_indices.view(batch, k).copy_(slots)

        def check_select():
            ref = indexer.reference_paged_mqa_logits(st["index_q_fp8"], caches.index_k, st["index_w"], _lens(caches),
                                                     caches.page_table, n_c)
            return selection_check(caches.extra_indices.view(batch, k), ref, caches.page_table, k)
        add("indexer", "indexer", select, caches.index_k_bytes() + batch * (d.index_heads * (d.index_head_dim + 4)),
            check_select, stream=s_idx, waits=waits_on(s_idx, "indexer_q_quant"))

    # the plugin's dense seam gives wq_b the SM-sharing GEMV form where the indexer runs beside it (captured decode)
    dense("wq_b", "q_lora", "q_raw", share_sms=kind == "c4" and prepare_streams)

    def q_head_norm():  # per-head RMSNorm without weight (RoPE not modelled)
        heads = bench_common.rms_norm(st["q_raw"].reshape(batch * rank.heads, d.head_dim), pdl=common_pdl)
        st["q"] = heads.view(batch, 1, rank.heads, d.head_dim)

    def check_q_head_norm():
        ref = bench_common.reference_rms_norm(st["q_raw"].reshape(batch * rank.heads, d.head_dim))
        return {"rel_err": _relerr(st["q"].reshape(ref.shape), ref)}
    add("q_head_norm", "common", q_head_norm, batch * rank.heads * d.head_dim * 4, check_q_head_norm)

    attn_args = lambda: (st["q"], caches.swa, caches.swa_indices, caches.swa_lengths, w.attn_sink,  # noqa: E731
                         d.head_dim, d.head_dim ** -0.5, caches.extra, caches.extra_indices, caches.extra_lengths)

    def attention():
        if path == PLUGIN:
            st["o"] = sparse_mla_decode.sparse_mla_decode(*attn_args())[0]
        else:
            st["o"] = ups.sparse_decode(*attn_args())[0]

    def check_attention():
        ref = sparse_mla_decode.reference_sparse_mla_decode(*attn_args())[0]
        return {"rel_err": _relerr(st["o"], ref)}
    attn_bytes = caches.kv_rows_read(d.index_topk) * dsv4.KV_TOKEN_BYTES + batch * rank.heads * d.head_dim * 4
    # the prepare's joins: the attention waits for every stream forked for it
    joins = [name for name, stream in (("compressor_wkv_gate", STREAM_COMPRESSOR), ("indexer", STREAM_INDEXER))
             if any(s.name == name and s.stream == stream for s in stages)]
    add("attention", "attention", attention, attn_bytes, check_attention, waits=joins)

    wo_a_w, wo_a_s = w.wo_a
    o_view = lambda: st["o"].reshape(batch, rank.groups, rank.group_width)  # noqa: E731

    def wo_a():
        if path == PLUGIN:
            st["oa"] = fp8_gemv.grouped_fp8_wo_a(o_view(), wo_a_w, wo_a_s)
        else:
            st["oa"] = ups.wo_a(o_view(), layer.wo_a_bf16, is_decode=True)

    def check_wo_a():
        return {"rel_err": _relerr(st["oa"], fp8_gemv.reference_grouped_wo_a(o_view(), wo_a_w, wo_a_s))}
    add("wo_a", "wo_a", wo_a, model.fp8_linear_bytes(d.o_rank, rank.group_width, batch, groups=rank.groups),
        check_wo_a)
    dense("wo_b", "oa", "attn_out", view=lambda t: t.reshape(batch, rank.groups * d.o_rank))

    def post_norm():  # residual add + RMSNorm (the mHC boundary is not modelled)
        st["h2"] = bench_common.rms_norm(st["attn_out"], w.norms["ffn"], residual=st["x"], pdl=common_pdl)

    def check_post_norm():
        ref = bench_common.reference_rms_norm(st["attn_out"], w.norms["ffn"], residual=st["x"])
        return {"rel_err": _relerr(st["h2"], ref)}
    add("post_attention_norm", "common", post_norm, act_bytes * 2, check_post_norm)
    router_gate("h2", "router_logits")

    def router_topk():
        # sqrtsoftplus + bias top-k + renormalise x routed scale, on the gate GEMM's bf16 logits
        st["topk_ids"], st["topk_weights"] = bench_common.route(st["router_logits"], w.gate_bias, d.top_k,
                                                                dsv4.ROUTED_SCALING_FACTOR, pdl=common_pdl)
    def check_router():
        return router_check(st["topk_ids"], st["topk_weights"], st["router_logits"], w.gate_bias, d.top_k)
    add("router_topk", "common", router_topk, batch * d.experts * 2 + d.experts * 4 + batch * d.top_k * 8,
        check_router)

    def routed():
        args = (st["topk_weights"], st["topk_ids"])
        if path == PLUGIN:
            st["routed"] = moe_mxfp4.moe_mxfp4_forward(st["h2"], layer.w13_plugin, layer.w13_scale_plugin, w.w2,
                                                       w.w2_scale, *args)
        else:
            st["routed"] = upstream_ops.fused_experts(ups, st["h2"], layer.w13_bf16, layer.w2_bf16, *args)

    def check_routed():
        ref = moe_mxfp4.reference_moe_mxfp4(st["h2"], w.w13, w.w13_scale, w.w2, w.w2_scale, st["topk_weights"],
                                            st["topk_ids"])
        return {"rel_err": _relerr(st["routed"], ref)}
    stage_index = len(stages)
    add("routed_experts", "moe", routed, 0, check_routed)  # bytes depend on the routing: set by moe_bytes()

    # the shared expert on the MoE's alt stream, forked after the post-attention norm (SGLang issues it after the
    # routed experts; the graph's order is the events')
    dense("shared_gate_up", "h2", "shared_gu", stream=STREAM_SHARED_EXPERT, waits=("post_attention_norm",))

    def shared_act():
        st["shared_act"] = bench_common.swiglu(st["shared_gu"], dsv4.SWIGLU_LIMIT, pdl=common_pdl)

    def check_shared_act():
        return {"rel_err": _relerr(st["shared_act"], bench_common.reference_swiglu(st["shared_gu"],
                                                                                   dsv4.SWIGLU_LIMIT))}
    add("shared_act", "common", shared_act, batch * rank.shared_inter * 6, check_shared_act,
        stream=STREAM_SHARED_EXPERT)
    dense("shared_down", "shared_act", "shared_out", stream=STREAM_SHARED_EXPERT)

    def combine():
        st["out"] = bench_common.combine(st["x"], st["attn_out"], st["routed"], st["shared_out"], pdl=common_pdl)

    def check_combine():
        ref = bench_common.reference_combine(st["x"], st["attn_out"], st["routed"], st["shared_out"])
        return {"rel_err": _relerr(st["out"], ref)}
    add("combine", "common", combine, act_bytes * 3, check_combine, waits=("shared_down",))
    st["_moe_stage"] = stage_index
    check_schedule(stages)
    return stages


def _lens(caches: model.Caches) -> torch.Tensor:
    return caches.index_lengths  # built with the caches: SGLang's metadata holds them before the step


def router_check(ids, weights, logits, bias, top_k: int) -> dict:
    """The router's weights against the float32 specification at the ids it chose (``rel_err``),
    and whether those ids are a top-k of the float32 biased scores: ``selection_violations`` counts
    picks scoring below the exact k-th beyond rounding (any violation fails the check);
    ``ids_differ_rows`` counts rows whose ids differ from the stable-sort reference (near-ties)."""
    from ..kernels import bench_common

    scores = torch.sqrt(torch.nn.functional.softplus(logits.float(), threshold=dsv4.SOFTPLUS_THRESHOLD))
    biased = scores + bias.float()
    picked = scores.gather(1, ids.long())
    expected = picked / picked.sum(-1, keepdim=True) * dsv4.ROUTED_SCALING_FACTOR
    kth = torch.topk(biased, top_k, dim=-1).values[:, -1:]
    violations = int((biased.gather(1, ids.long()) < kth - 1e-5 * kth.abs().clamp_min(1.0)).sum())
    ref_ids, _ = bench_common.reference_route(logits, bias, top_k, dsv4.ROUTED_SCALING_FACTOR)
    differ = int((ref_ids != ids.long()).any(-1).sum())
    err = _relerr(weights, expected) if weights.numel() else 0.0
    return {"rel_err": max(err, 1.0 if violations else 0.0), "selection_violations": violations,
            "ids_differ_rows": differ}


def moe_bytes(state: dict, rank: model.RankDims) -> int:
    """Bytes of the distinct experts this step's routing touches (MXFP4 + E8M0) plus activations."""
    from ..kernels import moe_mxfp4

    d = rank.dims
    ids = state["topk_ids"]
    weight = moe_mxfp4.touched_expert_bytes(ids, d.hidden, rank.moe_inter, d.experts)
    return weight + ids.shape[0] * d.hidden * 4


def selection_check(slots: torch.Tensor, ref_logits: torch.Tensor, page_table: torch.Tensor, k: int) -> dict:
    """Whether ``slots [B, k]`` are a top-k of the float32 reference logits: ``violations`` counts
    selected positions scoring below the exact k-th (beyond rounding), missed ones above it, and
    wrong -1 padding; ``overlap`` is the fraction of the exact top-k selected."""
    batch, width = ref_logits.shape
    page = dsv4.INDEX_PAGE_SIZE
    # slots -> positions through the page table
    inv = torch.full((int(page_table.max()) + 1,), -1, dtype=torch.long, device=slots.device)
    inv[page_table.long().flatten()] = torch.arange(page_table.numel(), device=slots.device) % page_table.shape[1]
    s = slots.long()
    pos = torch.where(s >= 0, inv[(s.clamp(min=0) // page)] * page + s.clamp(min=0) % page, -1)
    live = torch.isfinite(ref_logits).sum(1)
    want = live.clamp(max=k)
    valid = pos >= 0
    pad_bad = int((valid.sum(1) != want).sum())
    kk = min(k, width)
    top = torch.topk(ref_logits, kk, dim=1)
    kth = top.values[:, -1:]
    finite_max = ref_logits.masked_fill(~torch.isfinite(ref_logits), 0).abs().amax(1, keepdim=True)
    tol = 1e-4 * finite_max
    picked = ref_logits.gather(1, pos.clamp(min=0))
    below = int((valid & (picked < kth - tol)).sum())
    above_all = (ref_logits > kth + tol).sum(1)
    above_picked = (valid & (picked > kth + tol)).sum(1)
    missed = int((above_all - above_picked).clamp(min=0).sum())
    exact = torch.zeros_like(ref_logits, dtype=torch.bool).scatter_(1, top.indices, True) & torch.isfinite(ref_logits)
    overlap = float((exact.gather(1, pos.clamp(min=0)) & valid).sum()) / max(int(valid.sum()), 1)
    return {"violations": pad_bad + below + missed, "overlap": round(overlap, 5)}
