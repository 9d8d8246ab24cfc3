#!/usr/bin/env python3
"""Layer-schedule experiments for issue 8: one bench layer (plugin path, SGLang's decode streams) timed as the
bench times it (``time_in_cuda_graph`` of two layer calls per graph, L2 flushed before each replay) under named
variants of how the main query projection runs and how the side streams are created, each beside the shipped
layer in the same run, optionally with a kernel trace of each.

Why: in the C4 layer at T=1 B=1 the indexer's wq_b (a separate 8192 x 1024 GEMV on the indexer's query stream)
starts only as the main wq_b's persistent programs leave the SMs (benchmarks/bench-trace-h200-run2.md; the main
wq_b's programs hold 234 registers x 128 threads, two per SM, which fills the register file), and the attention
waits ~17 us for the indexer chain. The variants test what the plugin itself could change:

- ``wqb_pp1`` / ``wqb_pp0``: the main wq_b's FP8 GEMV (T=1: [32768, 1024]) with one persistent program per SM /
  not persistent (one program per 64-row block), leaving room for the indexer's programs;
- ``wqb_rows``: the main wq_b on the 16-row FMA form the indexer's wq_b uses (100 registers);
- ``prio``: the indexer's three side streams (its compressor + logits/top-k, weights_proj, query) created with the
  highest stream priority, the others at the default (a plugin could create SGLang's alt streams so);
- ``prio_wqb_pp0``: both;
- ``attn_no_pdl``: the sparse MLA decode and combine launched without programmatic dependent launch (as before
  they had it), to measure what PDL on the attention saves inside the layer;
- ``wqkva_n{N}w{W}``: wqkv_a's 1-row one-chunk rows GEMV ([1536, 4096] at every T) on N columns per program and W
  warps (run 8, against 8 columns on 8 warps, 192 programs on 132 SMs; 4 on 8 warps shipped since);
- ``iwqb_n8`` / ``iwqb_n32`` / ``iwqb_oc``: the indexer's wq_b ([8192, 1024], T=1 only: at T >= 4 the main wq_b has its
  shape) at 1 row on 8 or 32 columns per program (shipped: 16, 512 programs, its K in two chunks), or in one chunk;
- ``sd_n16`` / ``sd_n32`` / ``sd_nopdl`` / ``sd_pdl``: the shared expert's down projection at 1 row on 16 or 32
  columns per program (shipped: 8, 512 programs) or without / with PDL (``sd_pdl``: at T=4 as before
  ``fp8_gemv.ONE_ROW_WITHOUT_PDL``), so that fewer of its programs hold SM slots beside the routed gate/up;
- ``drop_route`` / ``drop_qquant`` / ``drop_route_qquant``: upper bounds, not forms the plugin could ship as they
  are: the layer without the router's top-k launch and / or the indexer's query quantisation launch (their outputs
  kept from the warm-up call), i.e. the most that fusing them into the next launch could save;
- ``attn_s{N}``: the sparse MLA decode at B=1 on N splits (at most one per tile; shipped: one tile per split, C4 20,
  SWA / C128 4 at 8K), ``attn_bf16p``: with bf16 partial accumulators at B=1 (half the split-K traffic);
- (run 15's ``moe_bytes``, the routed experts' fp16 GEMV with its pairs built per byte, is the shipped form since
  and was taken out of the tool; commit 0dfc461 has it);
- ``ix_rank_r{N}[w4]``: the indexer's top-512 by the rank select (``SelectForm(method="rank")``, N positions per
  program, 8 warps or ``w4`` 4) at up to 8192 compressed positions and any batch, instead of the plan table's form
  there (runs 16 / 17; in run 17 the ``ix_rank_r*`` rows list the selection in position order, a form since removed,
  and ``ix_rank_r8u`` is today's ``ix_rank_r8``); ``ix_nopdl``: the indexer's launches without PDL (run 19 also timed
  ``ix_late``, the rank select's trigger after its stores: flag ``RANK_PDL_LATE`` of commit 724fe88, since removed);
- ``no_share``: the C4 layer's main wq_b without its SM-sharing form (``fp8_gemv.sharing_config`` a no-op: the
  persistent GEMV on 2 programs per SM, as before the dense seam gave C4 layers the sharing form);
- ``moe_gu{G}_dn{D}[_r{R}][_l2]`` (runs 22-24): the routed experts' fp16 GEMV at B=1 on G gate/up columns and D
  down rows per program, rings of R stages, the down launch's L2 prefetch (run 20 / 21's ``moe_ts*``, the down
  launch token by token, went with its kernel: commits 79a25b8 / d002fa4);
- ``comp_n{X}`` / ``icomp_n{Y}`` (runs 24 / 25): the compressors' bf16 GEMV at one row on X rows per program for the
  attention compressor ([2048], X/2 for C128's [1024]) and Y for the indexer's ([512]), set in
  ``bf16_gemv.MEASURED_BLOCK_N`` and, where it lists the width, ``bf16_gemv.SHARING_BLOCK_N`` (since round 28 the
  C4 compressor on SGLang's streams takes 32 rows per program: ``comp_n4`` is the tile before).

- ``attn_base`` (variants run 27): the sparse MLA decode and combine kernels of another copy of
  ``kernels/sparse_mla_decode.py`` (``--baseline-attention FILE``, e.g. ``git show 8abcc26:kernels/sparse_mla_decode.py``:
  the kernels before their loads were issued together), launched by today's host code (the kernels' parameters must
  be the same); ``attn_e{E}`` (variants run 28): the launch configs' ``EARLY_LOADS`` set to E in every config, at
  every batch (shipped: on at one query row only; run 28's ``attn_e{E}c{C}`` also set the combine's
  ``COMBINE_ONE_TRIP``, a form removed after it: commit 87b73a8 has it).

- (variants run 32's ``moe_pf*``, the routed experts' top-k sum asking L2 for the next layer's first weights, went
  with ``moe_mxfp4_forward(l2_prefetch=)``: commit 7d01e52 has both);
- ``oc_x0`` (variants run 33): the one-row one-chunk FP8 GEMVs (wqkv_a at every T, the small weights at T >= 2)
  with their activation loaded after the weight's conversion, the order before ``fp8_gemv.ONE_CHUNK_X_FIRST``;
- (variants runs 46 / 47's ``moe_dl2_*``, the gate/up programs asking L2 for the down weights, went with
  ``GemvConfig.down_l2``: commit fafadec has both; run 48's ``l2woa*``, a side-stream launch asking L2 for wo_a's
  weight during the attention, went with ``kernels/l2_prefetch.py``: commit 614d8ed has both);
- ``moe_w0_off`` / ``moe_w0_r3`` / ``moe_w0_plain`` (round 32): at T=1 B=1 the routed experts' down launch as before
  round 32 (no early step, 3-stage ring), with its first K step loaded before its PDL wait by TMA and a 3-stage ring
  after it, or by per-thread loads (shipped: by TMA, 2 stages; runs 49 / 50 named those variants ``moe_w0`` /
  ``moe_w0_r2`` / ``moe_w0_plain`` and timed them against the form before as ``shipped``); ``moe_w0_off_r80`` /
  ``moe_w0_off_s2``: the form before capped at 80 registers (``GemvConfig.max_registers``: 6 programs per SM on the
  H200, as the early forms) / on a 2-stage ring;
- ``moe_pairs_cap0`` (stop 42): the routed experts' TMA pairs decode without ``moe_mxfp4.PAIRS_REGISTER_CAPS`` (the
  T=4 8-row down tile uncapped, as before stop 42; the caps apply on compute capability 9 only);
- ``oc2_off`` (stop 43): the FP8 GEMVs at 2 rows without the one-chunk form (``fp8_gemv.ONE_CHUNK_MAX_ROWS`` = 1:
  the forms before runs 18 / 18b there), which was measured alone, not in the layers (the bench's grid has no B=2);
  ``oc2_small``: at 2 rows only on weights of at most 4 MiB (``fp8_gemv.ONE_CHUNK_TWO_ROWS_MAX_WEIGHT_BYTES``; variants
  run 56, the shipped rule since, so now the same forms as ``shipped``); ``oc2_before``: at 2 rows on weights of at
  most 8 MiB, the rule before variants run 56;
- ``wqb_pers`` (variants run 39): the main wq_b at T=1, 1 row, on the persistent FMA form by TMA (2 programs per SM)
  it ran on before the one-chunk tile of ``fp8_gemv.ONE_CHUNK_X_FIRST_ONE_ROW_TILES`` (the C4 layer's call beside the
  indexer keeps its sharing form either way); ``bf16_wbw0``: the one-row bf16 GEMVs (the router gate, weights_proj,
  the compressors where one K step holds them) waiting before their weight load, as before
  ``bf16_gemv.USE_W_BEFORE_WAIT``; ``bf16_gate_wait`` / ``bf16_gate_only``: only the router gate waiting before its
  weight load / only the router gate loading it before the wait (variants run 40); ``bf16_wbw_all``: the calls beside
  other streams (the compressors on SGLang's side streams) with the weight before the wait too, as in commit 54aca5a
  (variants run 43); ``bf16_wbw0_sd_pdl``: ``bf16_wbw0`` and ``sd_pdl`` together (the forms before round 31 at T=4);
- ``--trace-calls 2`` traces a graph of two layer calls, as the timed graph holds: the second call shows the layer
  behind another layer rather than behind the graph's start.

Each variant's layer graph is captured once; the graphs are then replayed in interleaved rounds (every variant
once per round, an L2 flush before each replay) and each variant's figure is the median over all its replays, so
that clock and thermal drift during the run falls on every variant alike.

    python3 tools/device_bench_layer_variants.py --out $OUT                   # on the device
    python3 tools/device_bench_layer_variants.py --smoke                      # here: variants build, no GPU
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

import torch  # noqa: E402

from device_bench_trace import kernels_of_one_replay, layer_arguments, reduced_layers, summarise  # noqa: E402
from sglang_sm120.bench import layer as L  # noqa: E402
from sglang_sm120.bench import model  # noqa: E402
from sglang_sm120.kernels import bf16_gemv, dsv4, fp8_gemv, moe_mxfp4, sparse_mla_decode  # noqa: E402
from sglang_sm120.kernels import indexer as ix  # noqa: E402

VARIANTS = ("shipped", "wqb_pp1", "wqb_pp0", "wqb_rows", "prio", "prio_wqb_pp0", "attn_no_pdl", "no_share", "wqkva_n4w4",
            "wqkva_n4w8", "wqkva_n16w8", "wqkva_n8w4", "wqkva_n8w8", "iwqb_n8", "iwqb_n32", "iwqb_oc", "sd_n16", "sd_n32",
            "sd_nopdl", "drop_route", "drop_qquant", "drop_route_qquant", "attn_s1", "attn_s2", "attn_s5", "attn_s10",
            "attn_bf16p", "ix_rank_r4", "ix_rank_r8", "ix_rank_r16", "ix_rank_r32", "ix_rank_r16w4", "ix_nopdl",
            "moe_gu16_dn32", "moe_gu32_dn32", "moe_gu16_dn64", "moe_gu64_dn64", "moe_gu32_dn128", "moe_gu32_dn64",
            "moe_gu32_dn16", "moe_gu32_dn32_r2", "moe_gu32_dn32_r4", "moe_gu32_dn32_l2", "comp_n8", "comp_n16",
            "comp_n32", "comp_n64", "comp_n4", "icomp_n4", "icomp_n8", "comp_n16_icomp_n8", "sgu_n64", "sgu_s2",
            "sgu_p1", "attn_base", "attn_e0", "attn_e1", "moe_et", "moe_et0", "moe_sr0", "oc_x0",
            "iwqb_oc_n8w4", "iwqb_oc_n8w8", "iwqb_oc_n32w8", "oc_sgu_n8w8", "oc_sgu_n16w8", "oc_wqb_n8w4",
            "oc_wqb_n16w4", "wqb_pers", "bf16_wbw0", "bf16_gate_wait", "bf16_gate_only", "sd_pdl", "bf16_wbw_all",
            "bf16_wbw0_sd_pdl", "moe_w0_off", "moe_w0_off_r80", "moe_w0_off_s2", "moe_w0_r3", "moe_w0_plain",
            "moe_pairs_cap0", "oc2_off", "oc2_small", "oc2_before")
# oc2_* (stop 43): the fp8_gemv one-chunk rule constants each variant sets
ONE_CHUNK_RULE_VARIANTS = {"oc2_off": {"ONE_CHUNK_MAX_ROWS": 1},
                           "oc2_small": {"ONE_CHUNK_TWO_ROWS_MAX_WEIGHT_BYTES": 4 << 20},
                           "oc2_before": {"ONE_CHUNK_TWO_ROWS_MAX_WEIGHT_BYTES": 8 << 20}}
# upper bounds: the stages a variant leaves out of the captured layer (their outputs stay in place from the warm-up
# call, so the layer's output is unchanged): what fusing them into a neighbouring launch could save at most
DROPPED_STAGES = {"drop_route": ("router_topk",), "drop_qquant": ("indexer_q_quant",),
                  "drop_route_qquant": ("router_topk", "indexer_q_quant")}
INDEXER_STREAMS = (L.STREAM_INDEXER, L.STREAM_INDEX_WEIGHTS, L.STREAM_INDEX_Q)
LAYER_CALLS = 2  # layer calls per captured graph, as the bench times a layer


def main_wq_b_shape(tp: int) -> tuple[int, int]:
    return dsv4.dense_linear_shapes(tp)["wq_b"]


def one_row_override(shape: tuple[int, int], change):
    """A replacement for fp8_gemv.default_config that changes only the 1-row config of one ungrouped [N, K] weight:
    ``change(cfg, m, groups, sms)`` gives the config to use instead of the shipped ``cfg``."""
    original = fp8_gemv.default_config

    def config(m, n, k, groups=1, sms=None):
        cfg = original(m, n, k, groups, sms)
        if (n, k) != shape or groups != 1 or m != 1:
            return cfg
        return change(cfg, m, groups, sms)
    return config


def wqkv_a_override(variant: str, tp: int):
    """wqkv_a's 1-row config on the variant's columns per program and warps (None: no change)."""
    if not variant.startswith("wqkva_"):
        return None
    block_n, warps = (int(v) for v in variant[len("wqkva_n"):].split("w"))
    return one_row_override(dsv4.dense_linear_shapes(tp)["wqkv_a"],
                            lambda cfg, *_: dataclasses.replace(cfg, block_n=block_n, num_warps=warps))


def shared_down_override(variant: str, tp: int):
    """The shared expert's down projection ([4096, 2048 / T]) at 1 row on fewer, wider programs (``sd_n{N}``: N columns
    per program; shipped at T=1: 8, 512 programs) or launched without PDL (``sd_nopdl``: its programs take no SM slot
    before the SwiGLU has finished) or with it (``sd_pdl``: at T=4 as before fp8_gemv.ONE_ROW_WITHOUT_PDL). At B=1 it runs beside the routed experts' gate/up, which is on the critical path;
    None: no change."""
    if variant == "bf16_wbw0_sd_pdl":  # with bf16_wbw0's switch (set in applied): both forms before round 31
        variant = "sd_pdl"
    if not variant.startswith("sd_"):
        return None
    tile = ({"sd_nopdl": dict(pdl=False), "sd_pdl": dict(pdl=True)}.get(variant)
            or dict(block_n=int(variant[len("sd_n"):])))
    return one_row_override(dsv4.dense_linear_shapes(tp)["shared_down"], lambda cfg, *_: dataclasses.replace(cfg, **tile))


def shared_gate_up_override(variant: str, tp: int):
    """The shared expert's gate/up ([4096, 4096] at T=1) at 1 row on fewer programs (``sgu_n64``: 64 columns per
    program, ``sgu_s2``: K in 2 splits instead of 4, ``sgu_p1``: persistent on one program per SM; shipped: 32
    columns, 4 splits, 512 programs): it runs on a side stream beside the router's chain of one-program kernels
    (round 28, after the compressor's case); None: no change (T=1 only)."""
    if not variant.startswith("sgu_") or tp != 1:
        return None
    tile = {"sgu_n64": dict(block_n=64), "sgu_s2": dict(split_k=2),
            "sgu_p1": dict(persistent_programs_per_sm=1)}[variant]
    return one_row_override(dsv4.dense_linear_shapes(tp)["shared_gate_up"],
                            lambda cfg, *_: dataclasses.replace(cfg, **tile))


def indexer_wq_b_override(variant: str, tp: int):
    """The indexer's wq_b at 1 row on the variant's tile (None: no change; T=1 only, except ``iwqb_oc*``: its shape
    [8192, 1024] in one chunk at every T, which at T=4 is the main wq_b's; ``iwqb_oc_n{N}w{W}``: on N columns and W
    warps)."""
    if not variant.startswith("iwqb_") or (tp != 1 and not variant.startswith("iwqb_oc")):
        return None
    n, k = dsv4.dense_linear_shapes(1)["indexer_wq_b"]
    if variant.startswith("iwqb_oc"):
        tile = dict(k_unroll=k // fp8_gemv.FP8_BLOCK, one_chunk=True, evict_first=False)
        if variant != "iwqb_oc":
            block_n, warps = (int(v) for v in variant[len("iwqb_oc_n"):].split("w"))
            tile.update(block_n=block_n, num_warps=warps)
    else:
        tile = dict(block_n=int(variant[len("iwqb_n"):]))
    return one_row_override((n, k), lambda cfg, *_: dataclasses.replace(cfg, **tile))


def wq_b_override(variant: str, tp: int):
    """The main wq_b's 1-row config (None: no change). At T >= 4 the main wq_b has the indexer's wq_b shape, so the
    override applies at T=1/2 only."""
    if variant not in ("wqb_pp1", "wqb_pp0", "wqb_rows", "prio_wqb_pp0"):  # by name: "iwqb_*" is the indexer's
        return None
    shape = main_wq_b_shape(tp)
    index_shape = dsv4.dense_linear_shapes(tp)["indexer_wq_b"]
    if shape == index_shape:
        return None
    original = fp8_gemv.default_config

    def change(cfg, m, groups, sms):
        if variant.endswith("wqb_pp1"):
            return dataclasses.replace(cfg, persistent_programs_per_sm=1)
        if variant.endswith("wqb_pp0"):
            return dataclasses.replace(cfg, persistent_programs_per_sm=0)
        if variant.endswith("wqb_rows"):
            return original(m, *index_shape, groups, sms)
        raise ValueError(variant)
    return one_row_override(shape, change)


def persistent_wq_b_override(variant: str, tp: int):
    """``wqb_pers``: the main wq_b at T=1, 1 row, on the rule's form beside other streams before sharing_config
    (the persistent FMA form on 2 programs per SM, shipped before variants run 39); None: no change."""
    if variant != "wqb_pers" or tp != 1:
        return None
    n, k = main_wq_b_shape(tp)
    return one_row_override((n, k), lambda cfg, m, groups, sms: fp8_gemv.pick_default_config(
        m, n, k, groups, fp8_gemv.sm_count() if sms is None else sms, fp8_gemv.rules(), beside_other_streams=True))


@contextlib.contextmanager
def bf16_w_before_wait_where(variant: str):
    """``bf16_gate_wait`` / ``bf16_gate_only``: bf16_gemv.default_config with w_before_wait taken off the router
    gate's one-row config / off every other width's; ``bf16_wbw_all``: put on every one-row call the budget allows
    (no change for other variants)."""
    if variant not in ("bf16_gate_wait", "bf16_gate_only", "bf16_wbw_all"):
        yield
        return
    original = bf16_gemv.default_config
    gate_n = dsv4.ROUTER_GATE_SHAPE[0]

    def config(m, n, k, *args, **kwargs):
        if variant == "bf16_wbw_all":
            cfg = original(m, n, k, *args, **kwargs)
            return bf16_gemv.tile(cfg.block_m, cfg.block_n, k, cfg.pdl)
        cfg = original(m, n, k, *args, **kwargs)
        keep = (n == gate_n) == (variant == "bf16_gate_only")
        if cfg.w_before_wait and not keep:
            return _waiting(original, m, n, k, *args, **kwargs)
        return cfg
    bf16_gemv.default_config = config
    try:
        yield
    finally:
        bf16_gemv.default_config = original


def _waiting(original, *args, **kwargs):
    """``original``'s config with bf16_gemv.USE_W_BEFORE_WAIT off (the looping tile before)."""
    saved = bf16_gemv.USE_W_BEFORE_WAIT
    bf16_gemv.USE_W_BEFORE_WAIT = False
    try:
        return original(*args, **kwargs)
    finally:
        bf16_gemv.USE_W_BEFORE_WAIT = saved


def one_chunk_override(variant: str, tp: int):
    """``oc_{sgu,wqb}_n{N}w{W}`` (variants run 37): the shared expert's gate/up ([4096, 4096] at T=1) or the main wq_b
    ([32768, 1024] at T=1) at 1 row on the one-chunk rows form with its activation first (N columns, W warps; the
    one-chunk rule stops at 8 MiB, measured without that order in run 18); None: no change (T=1 only)."""
    if not variant.startswith(("oc_sgu_", "oc_wqb_")) or tp != 1:
        return None
    name = "shared_gate_up" if variant.startswith("oc_sgu_") else "wq_b"
    n, k = dsv4.dense_linear_shapes(tp)[name]
    block_n, warps = (int(v) for v in variant.split("_n")[1].split("w"))
    tile = fp8_gemv.one_chunk_form(1, block_n, warps, k // fp8_gemv.FP8_BLOCK)
    return one_row_override((n, k), lambda *_: tile)


BASELINE_ATTENTION_MODULE = "sglang_sm120.kernels._baseline_sparse_mla_decode"
baseline_attention_file: str | None = None  # --baseline-attention


def baseline_attention_kernels() -> dict:
    """The decode and combine kernels of ``baseline_attention_file``, loaded as a module of the kernels package (its
    relative imports resolve there)."""
    import importlib.util

    if baseline_attention_file is None:
        raise SystemExit("the attn_base variant needs --baseline-attention FILE")
    module = sys.modules.get(BASELINE_ATTENTION_MODULE)
    if module is None:
        spec = importlib.util.spec_from_file_location(BASELINE_ATTENTION_MODULE, baseline_attention_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[BASELINE_ATTENTION_MODULE] = module
        spec.loader.exec_module(module)
    return {name: getattr(module, name) for name in ("sparse_mla_decode_kernel", "sparse_mla_combine_kernel")}


def attention_overrides(variant: str) -> dict:
    """Module attributes of sparse_mla_decode the ``attn_*`` variants replace (empty: no change)."""
    if variant == "attn_base":
        return baseline_attention_kernels()
    flags = re.fullmatch(r"attn_e([01])", variant)
    if flags:  # the same flag in every launch config, whatever the batch
        early = bool(int(flags.group(1)))
        smd = sparse_mla_decode

        def flagged(cfg):
            return dict(cfg, EARLY_LOADS=early)
        return {"LAUNCH_CONFIGS": {h: flagged(c) for h, c in smd.LAUNCH_CONFIGS.items()},
                **{name: {h: (rows, flagged(c)) for h, (rows, c) in getattr(smd, name).items()}
                   for name in ("SMALL_BATCH_CONFIGS", "LARGE_BATCH_CONFIGS", "WIDE_COMBINE_CONFIGS",
                                "FEW_CANDIDATES_CONFIGS")}}
    if variant.startswith("attn_s"):
        splits = int(variant[len("attn_s"):])
        original = sparse_mla_decode.choose_splits

        def choose(units, total_tiles, device, max_splits=sparse_mla_decode.MAX_SPLITS):
            if units > 4:  # B > 1 at H=64 on 16-head blocks
                return original(units, total_tiles, device, max_splits)
            per = -(-max(total_tiles, 1) // min(splits, max(total_tiles, 1)))
            return -(-max(total_tiles, 1) // per), per
        return {"choose_splits": choose}
    if variant == "attn_bf16p":
        rows, cfg = sparse_mla_decode.SMALL_BATCH_CONFIGS[64]
        return {"SMALL_BATCH_CONFIGS": {**sparse_mla_decode.SMALL_BATCH_CONFIGS,
                                        64: (rows, dict(cfg, PARTIAL_BF16=True))}}
    return {}


def moe_tiles_where(variant: str):
    """The ``moe_gu{G}_dn{D}[_r{R}][_l2]`` variants (run 28): at B=1 the routed experts' fp16 GEMV on G gate/up columns
    and D down rows per program, rings of R stages, the down launch's L2 prefetch before its PDL wait (the rest of the
    shipped tiles kept), as a replacement of
    :data:`moe_mxfp4.GEMV_TMA_F16_WHERE`; ``moe_et`` / ``moe_et0`` (variants run 29): every entry with / without
    ``GemvConfig.early_tables``; None for other variants (``moe_sr0``, run 31: the routing launch's counting sort at
    B <= 2 instead of round 29's pairwise routing, ``moe_mxfp4.ROUTE_SMALL_MAX_ROWS`` 0, is set in ``applied``)."""
    if variant in ("moe_et", "moe_et0"):
        return {key: tuple(dataclasses.replace(c, early_tables=variant == "moe_et") for c in tiles)
                for key, tiles in moe_mxfp4.GEMV_TMA_F16_WHERE.items()}
    if variant.startswith("moe_w0_"):  # round 32: the down's first K step before its wait
        forms = {"moe_w0_off": ("", moe_mxfp4.GEMV_TMA_RING, 0), "moe_w0_off_r80": ("", moe_mxfp4.GEMV_TMA_RING, 80),
                 "moe_w0_off_s2": ("", 2, 0), "moe_w0_r3": ("tma", 3, 0),
                 "moe_w0_plain": ("plain", moe_mxfp4.GEMV_TMA_RING, 0)}
        form, ring, regs = forms[variant]
        where = {}
        for key, (gate_up, down) in moe_mxfp4.GEMV_TMA_F16_WHERE.items():
            if key == (dsv4.MOE_INTERMEDIATE_SIZE, dsv4.TOP_K):
                down = dataclasses.replace(down, w0_early=form, tma_ring=ring, max_registers=regs)
            where[key] = (gate_up, down)
        return where
    match = re.fullmatch(r"moe_gu(\d+)_dn(\d+)(?:_r(\d+))?(_l2)?", variant)
    if not match:
        return None
    gu_n, dn_n, ring, l2 = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0), bool(match.group(4))
    where = dict(moe_mxfp4.GEMV_TMA_F16_WHERE)
    for (inter, rows), (gate_up, down) in moe_mxfp4.GEMV_TMA_F16_WHERE.items():
        if rows == dsv4.TOP_K and inter % gu_n == 0:
            ring_of = ring or gate_up.tma_ring
            where[(inter, rows)] = (dataclasses.replace(gate_up, block_n=gu_n, tma_ring=ring_of),
                                    dataclasses.replace(down, block_n=dn_n, tma_ring=ring_of,
                                                        pdl_l2=down.pdl and (l2 or down.pdl_l2)))
    return where


def compressor_block_n(variant: str) -> dict:
    """The ``comp_n{X}`` / ``icomp_n{Y}`` variants (run 28): at one row the compressors' bf16 GEMV on X weight rows per
    program for the attention compressor ([2048, 4096] at C4; X/2 for C128's [1024, 4096]: the same program count) and
    Y for the indexer compressor ([512, 4096]), so that these side-stream launches hold fewer SM slots beside the
    query projections. Returns {width: block_n} to set in :data:`bf16_gemv.MEASURED_BLOCK_N` at one row."""
    widths = {}
    for kind, value in re.findall(r"(icomp|comp)_n(\d+)", variant):
        if kind == "comp":
            widths[2048], widths[1024] = int(value), max(int(value) // 2, 1)
        else:
            widths[512] = int(value)
    return widths


def drop_stages(stages: list, names: tuple) -> list:
    """``stages`` without ``names``; a stage that waited for a dropped one waits for what the dropped one came after
    on its stream (or for what it waited for, if it was its stream's first)."""
    kept = []
    replaced: dict[str, tuple] = {}
    for i, stage in enumerate(stages):
        waits = tuple(w for dep in stage.waits for w in replaced.get(dep, (dep,)))
        if stage.name in names:
            before = [s.name for s in stages[:i] if s.stream == stage.stream and s.name not in names]
            replaced[stage.name] = (before[-1],) if before else waits
            continue
        kept.append(dataclasses.replace(stage, waits=tuple(dict.fromkeys(waits))))
    L.check_schedule(kept)
    return kept


@contextlib.contextmanager
def applied(variant: str, tp: int):
    override = (wq_b_override(variant, tp) or wqkv_a_override(variant, tp) or indexer_wq_b_override(variant, tp)
                or shared_down_override(variant, tp) or shared_gate_up_override(variant, tp)
                or one_chunk_override(variant, tp) or persistent_wq_b_override(variant, tp))
    original, attention_pdl, sharing = fp8_gemv.default_config, sparse_mla_decode.USE_PDL, fp8_gemv.sharing_config
    if override is not None:
        fp8_gemv.default_config = override
    if variant == "attn_no_pdl":
        sparse_mla_decode.USE_PDL = False
    if variant == "no_share":
        fp8_gemv.sharing_config = lambda cfg: cfg
    attention = attention_overrides(variant)
    attention_saved = {name: getattr(sparse_mla_decode, name) for name in attention}
    moe_where, moe_saved = moe_tiles_where(variant), moe_mxfp4.GEMV_TMA_F16_WHERE
    if moe_where is not None:
        moe_mxfp4.GEMV_TMA_F16_WHERE = moe_where
    comp_widths = compressor_block_n(variant)
    comp_saved = {width: dict(bf16_gemv.MEASURED_BLOCK_N[width]) for width in comp_widths}
    sharing_saved = {width: dict(rows) for width, rows in bf16_gemv.SHARING_BLOCK_N.items()}
    for width, block_n in comp_widths.items():
        bf16_gemv.MEASURED_BLOCK_N[width][1] = block_n
        if 1 in bf16_gemv.SHARING_BLOCK_N.get(width, {}):  # the tile beside the query projections too
            bf16_gemv.SHARING_BLOCK_N[width][1] = block_n
    x_first = fp8_gemv.ONE_CHUNK_X_FIRST
    fp8_gemv.ONE_CHUNK_X_FIRST = x_first and variant != "oc_x0"
    bf16_w_first = bf16_gemv.USE_W_BEFORE_WAIT
    bf16_gemv.USE_W_BEFORE_WAIT = bf16_w_first and variant not in ("bf16_wbw0", "bf16_wbw0_sd_pdl")
    pairs_caps = moe_mxfp4.PAIRS_REGISTER_CAPS
    if variant == "moe_pairs_cap0":
        moe_mxfp4.PAIRS_REGISTER_CAPS = {}
    # rule constants, not in the config cache's key: the caches are cleared around the variant
    rule_constants = ONE_CHUNK_RULE_VARIANTS.get(variant, {})
    rule_saved = {name: getattr(fp8_gemv, name) for name in rule_constants}
    for name, value in rule_constants.items():
        setattr(fp8_gemv, name, value)
    if rule_constants:
        fp8_gemv.clear_caches()
    route_small = moe_mxfp4.ROUTE_SMALL_MAX_ROWS
    if variant == "moe_sr0":  # run 31: the routing's counting sort at every row count (before round 29's pairwise)
        moe_mxfp4.ROUTE_SMALL_MAX_ROWS = 0
    bf16_where = bf16_w_before_wait_where(variant)
    bf16_where.__enter__()
    plan_table, ix_pdl = ix.PLAN_TABLE, ix.USE_PDL
    ix.USE_PDL = ix_pdl and variant != "ix_nopdl"
    if variant.startswith("ix_rank_r"):
        spec = variant[len("ix_rank_r"):]
        rank = ix.SelectForm(method="rank", rank_rows=int(spec.replace("w4", "")), warps_mul=1 if "w4" in spec else 2)
        ix.PLAN_TABLE = ((dsv4.INDEX_MAX_BATCH, 8192, ix.Plan("two_kernel", select=rank)),) + plan_table
    for name, value in attention.items():
        setattr(sparse_mla_decode, name, value)
    try:
        yield (override is not None or "prio" in variant or variant in ("attn_no_pdl", "no_share")
               or bool(attention) or variant in DROPPED_STAGES or ix.PLAN_TABLE is not plan_table
               or variant == "ix_nopdl" or moe_where is not None or bool(comp_widths)
               or variant in ("moe_sr0", "oc_x0", "bf16_wbw0", "bf16_gate_wait", "bf16_gate_only", "bf16_wbw_all",
                              "moe_pairs_cap0") or bool(rule_constants))
    finally:
        moe_mxfp4.PAIRS_REGISTER_CAPS = pairs_caps
        for name, value in rule_saved.items():
            setattr(fp8_gemv, name, value)
        if rule_saved:
            fp8_gemv.clear_caches()
        bf16_where.__exit__(None, None, None)
        fp8_gemv.ONE_CHUNK_X_FIRST = x_first
        bf16_gemv.USE_W_BEFORE_WAIT = bf16_w_first
        moe_mxfp4.ROUTE_SMALL_MAX_ROWS = route_small
        for width, saved in comp_saved.items():
            bf16_gemv.MEASURED_BLOCK_N[width] = saved
        for width, saved in sharing_saved.items():
            bf16_gemv.SHARING_BLOCK_N[width] = saved
        moe_mxfp4.GEMV_TMA_F16_WHERE = moe_saved
        ix.PLAN_TABLE, ix.USE_PDL = plan_table, ix_pdl
        fp8_gemv.default_config, sparse_mla_decode.USE_PDL = original, attention_pdl
        fp8_gemv.sharing_config = sharing
        for name, value in attention_saved.items():
            setattr(sparse_mla_decode, name, value)


def make_side_streams() -> dict:
    """The two sets of SGLang's side streams the variants use, made once (torch hands streams out round-robin from a
    pool of 32 per priority: streams made per variant would come round to the capturing stream, and a layer with a
    side stream equal to it runs in line): ``default`` all at the default priority, ``prio`` with the indexer's at the
    highest priority."""
    least, greatest = torch.cuda.Stream.priority_range()
    high = min(least, greatest)  # CUDA: a lower number is a higher priority
    capture = torch.cuda.graphs.graph.default_capture_stream
    default = {name: torch.cuda.Stream() for name in L.SIDE_STREAMS}
    prio = {name: torch.cuda.Stream(priority=high) if name in INDEXER_STREAMS else default[name]
            for name in L.SIDE_STREAMS}
    streams = list(default.values()) + list(prio.values())
    if capture is None or any(s == capture for s in streams) or torch.cuda.current_stream() in streams:
        raise RuntimeError("side streams collide with the capture stream (or it is not made yet)")
    return {"default": default, "prio": prio}


def main() -> int:
    p = layer_arguments(__doc__, "bench-variants-h200", ("c4", "c128", "swa"), (1, 4),
                        "CPU: build every variant's stages, run them once")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--rounds", type=int, default=40, help="interleaved rounds (one replay of each variant per round)")
    p.add_argument("--trace", nargs="*", default=[], help="variants to trace (kernel timeline of one replay)")
    p.add_argument("--trace-calls", type=int, default=1, help="layer calls in a traced graph (the timed graph has "
                   f"{LAYER_CALLS})")
    p.add_argument("--baseline-attention", default=None,
                   help="a copy of kernels/sparse_mla_decode.py whose kernels the attn_base variant launches")
    args = p.parse_args()
    global baseline_attention_file
    baseline_attention_file = args.baseline_attention

    if args.smoke:
        for kind, state_w, caches, x in reduced_layers(args.kind):
            for variant in args.variants:
                with applied(variant, 1):
                    stages = L.build_stages(L.PLUGIN, kind, state_w, caches, x, {})
                    L.run_layer(stages)
                    if variant in DROPPED_STAGES:
                        L.run_layer(drop_stages(stages, DROPPED_STAGES[variant]))
                print(kind, variant, "ok")
        print("smoke ok (nothing timed)")
        return 0

    from sglang_sm120.kernels.harness.devicebench import capture_graph, environment, l2_flush_buffer, replay_us

    os.makedirs(args.out, exist_ok=True)
    flush = l2_flush_buffer()
    results = {"env": environment(), "context": args.context, "priority_range": torch.cuda.Stream.priority_range(),
               "points": []}
    capture_graph(lambda: None, warmup=0)  # makes torch's default capture stream before the side streams
    stream_sets = make_side_streams()
    dims = model.Dims.full()
    lines = [f"# Layer-schedule variants ({results['env'].get('gpu')}, {results['env']['date']})", "",
             f"`python3 tools/device_bench_layer_variants.py` (plugin path, SGLang's streams, context {args.context}; "
             f"median of {args.rounds} interleaved replays of a {LAYER_CALLS}-layer-call graph per variant, each "
             "after an L2 flush, per layer call)", "",
             "| kind | T | B | variant | layer µs | vs shipped | applies |", "|---|---|---|---|---|---|---|"]
    for tp in args.tp:
        state_w = L.LayerState(model.build_weights(dims.rank(tp), "cuda"), None)
        for kind in args.kind:
            for b in args.batch:
                caches = model.build_caches(kind, dims, b, args.context, "cuda", seed=1)
                x = torch.randn(b, dims.hidden, device="cuda").to(torch.bfloat16)
                ref_out = None
                graphs, keep = {}, []
                for variant in args.variants:
                    with applied(variant, tp) as applies:
                        side = stream_sets["prio" if "prio" in variant else "default"]
                        st: dict = {}
                        stages = L.build_stages(L.PLUGIN, kind, state_w, caches, x, st)
                        L.run_layer(stages, side)
                        if variant in DROPPED_STAGES:
                            kept = drop_stages(stages, DROPPED_STAGES[variant])
                            applies = len(kept) < len(stages)
                            stages = kept
                            L.run_layer(stages, side)
                        torch.cuda.synchronize()
                        out = st["out"].clone()
                        same = ref_out is None or torch.equal(out, ref_out)
                        ref_out = out if ref_out is None else ref_out
                        run = (lambda stages=stages, side=side: L.run_layer(stages, side))
                        graphs[variant] = capture_graph(run, calls=LAYER_CALLS, warmup=1)
                        point = {"kind": kind, "T": tp, "B": b, "variant": variant, "applies": applies,
                                 "same_output_as_shipped": same}
                        if variant in args.trace:
                            traced_graph = capture_graph(run, calls=args.trace_calls, warmup=1)
                            point["trace"] = summarise(kernels_of_one_replay(traced_graph, flush))
                            del traced_graph
                        keep.append((stages, side, st))  # the graphs read these buffers
                    results["points"].append(point)
                samples = {variant: [] for variant in args.variants}
                for _ in range(args.rounds):
                    for variant in args.variants:
                        samples[variant].append(replay_us(graphs[variant], flush, LAYER_CALLS))
                del graphs
                shipped_us = statistics.median(samples["shipped"]) if "shipped" in samples else None
                for point in results["points"][-len(args.variants):]:
                    us = statistics.median(samples[point["variant"]])
                    point["layer_us"] = round(us, 2)
                    point["layer_us_samples"] = [round(v, 2) for v in samples[point["variant"]]]
                    ratio = f"{shipped_us / us:.3f}x" if shipped_us else "-"
                    lines.append(f"| {kind} | {tp} | {b} | {point['variant']} | {us:.2f} | {ratio} | "
                                 f"{'yes' if point['applies'] else 'no (same as shipped)'} |")
                    print(lines[-1], "" if point["same_output_as_shipped"] else "OUTPUT DIFFERS", flush=True)
    traced = [pt for pt in results["points"] if "trace" in pt]
    for pt in traced:
        tr = pt["trace"]
        lines += ["", f"## {pt['kind']} T={pt['T']} B={pt['B']} {pt['variant']} ({args.trace_calls} layer call(s) "
                  f"traced): span {tr['span_us']} µs, "
                  f"busy {tr['busy_us']} µs", "", "| start µs | µs | stream | kernel |", "|---|---|---|---|"]
        lines += [f"| {k['start_us']} | {k['dur_us']} | {k['stream']} | `{k['name']}` |" for k in tr["kernels"]]
    with open(os.path.join(args.out, args.name + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, args.name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
