"""Sparse MLA decode on the device (run 7): full DSv4-Flash shapes checked against the float32
reference and timed in CUDA graphs, the shipped default beside split-K candidates (bf16 partial
accumulators, wider combine programs) in the cells of the issue's targets (C4 8K,
H=64, s_q=1, B=1/16/64) and cells that guard the other defaults (C128 8K B=64, 32 rows, H=32,
H=16, C4 64K), and upstream's Triton kernel (``flash_mla_sparse_decode_triton``) in the C4 8K
B=64 cell, in the same run (run 6 and earlier: see git history of this file).

    python3 tools/device_sparse_mla_decode.py --prepare          # here: copy/extract upstream baselines
    python3 tools/device_sparse_mla_decode.py --out $OUT         # on the device (carry .upstream)
    TRITON_INTERPRET=1 python3 tools/device_sparse_mla_decode.py --smoke   # here: the logic at tiny shapes

Inputs are laid out as SGLang 0.5.23 hands them over: one SWA cache of 256-token pages with a
128-slot window per row, plus a C4 cache (64-token pages, 512 top-k slots) or a C128 cache (2-token
pages, every compressed block of the context). Caches are large (hundreds of MB) and every call
inside a graph uses its own rows, so KV reads come from HBM as in consecutive layers. Earlier runs
(run 1, run 3: see git history of this file) also timed upstream's torch fallback and 64K contexts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

import torch  # noqa: E402

from sglang_sm120.kernels import sparse_mla_decode as smd  # noqa: E402
from sglang_sm120.kernels.dsv4 import (C4_PAGE_SIZE, C128_PAGE_SIZE, C128_RATIO, C4_RATIO, HEAD_DIM,  # noqa: E402
                                       INDEX_TOPK, KV_TOKEN_BYTES, SLIDING_WINDOW, SOFTMAX_SCALE, SWA_PAGE_SIZE)

UPSTREAM_TRITON = "flash_mla_sm120_triton.py"
UPSTREAM_TORCH = "flash_mla_sm120_torch.py"
ROTATIONS = 8  # calls per graph, each over its own rows of the caches
COLUMNS = ("layer", "context", "B", "H", "s_q", "candidates", "variant", "us", "vs_upstream_triton", "TFLOPs",
           "pct_bf16_mm", "KV_GBps", "rel_err", "lse_max_abs_err", "note")


# Run 7: the shipped default (since run 6 the 64-head form carries L2_PREFETCH) beside the split-K
# traffic candidates, in the cells of the targets (C4 8K, H=64, s_q=1: B=1, 16, 64) and
# cells that keep other defaults honest:
# * "bf16p": PARTIAL_BF16 (split-K partial accumulators stored in bf16: at C4 B=64 the 2 x 64 rows
#   x 64 heads x 512 fp32 partials are 16.8 MB written and read again; (max, sum) stay fp32),
# * "cols128": COMBINE_COLS=128 (combine programs of 16 heads x up to 128 columns while the
#   [splits, 16, cols] block stays <= 512 values: 4x fewer combine programs at 2-4 splits).
# Run 7 also timed the 64-head form without L2_PREFETCH ("bh64 run5", 0.97-0.99x); that loop and run 6's
# LAZY_RESCALE (0.73x in the 64-head form) were removed from the kernel (git history of this file).
_BASE = dict(BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1)
_BH64 = dict(_BASE, BLOCK_H=64, BLOCK_N=16, PREFETCH_KV=False, L2_PREFETCH=True)
_BH32 = dict(_BASE, BLOCK_H=32)
_BH32_MID = dict(_BASE, BLOCK_H=32, PREFETCH_KV=False, MID_PREFETCH=True)
_BH16 = dict(_BASE, BLOCK_H=16)
_BF16P = dict(PARTIAL_BF16=True)
_COLS = dict(COMBINE_COLS=128)
CANDIDATES = {
    "bh64 bf16p": dict(_BH64, **_BF16P), "bh64 cols128": dict(_BH64, **_COLS),
    "bh64 bf16p cols128": dict(_BH64, **_BF16P, **_COLS),
    "bh32 bf16p": dict(_BH32, **_BF16P), "bh32 bf16p cols128": dict(_BH32, **_BF16P, **_COLS),
    "bh32 midpf bf16p cols128": dict(_BH32_MID, **_BF16P, **_COLS),
    "bh16 bf16p": dict(_BH16, **_BF16P), "bh16 bf16p cols128": dict(_BH16, **_BF16P, **_COLS),
}
SPLIT_NEIGHBOURS = ()  # forms whose neighbouring split counts are timed in the target cell
RUN_NAME = "sparse_mla_decode-h200-run7"
_T64 = ("bh64 bf16p", "bh64 cols128", "bh64 bf16p cols128")
# (layer, context, B, H, s_q, candidate names), in priority order
GRID = [
    ("C4", 8192, 64, 64, 1, _T64),
    ("C4", 8192, 16, 64, 1, ("bh32 bf16p", "bh32 bf16p cols128")),
    ("C4", 8192, 1, 64, 1, ("bh16 bf16p", "bh16 bf16p cols128")),
    ("C128", 8192, 64, 64, 1, ("bh32 midpf bf16p cols128",)),
    ("C4", 8192, 32, 64, 1, _T64),
    ("C4", 8192, 64, 32, 1, ("bh32 bf16p", "bh32 bf16p cols128")),
    ("C4", 8192, 16, 16, 1, ("bh16 bf16p", "bh16 bf16p cols128")),
    ("C4", 65536, 64, 64, 1, _T64),
    ("C4", 8192, 32, 64, 2, _T64),
]
SMOKE_GRID = [("C4", 512, 2, 64, 1, ("bh64 cols128", "bh64 bf16p cols128", "bh32 bf16p cols128")),
              ("C128", 512, 1, 16, 2, ("bh16 bf16p cols128",))]
BUDGET_S = 105.0  # no new shape starts after this (timeout_s is 150)
# --full-grid: the device grid with the shipped defaults, upstream Triton and torch fallback in every cell
FULL_GRID = [(layer, context, batch, heads, s_q, ()) for layer in ("C4", "C128") for context in (8192, 65536)
             for heads in (64, 16) for s_q in (1, 2) for batch in (1, 4, 16, 64)]
FULL_GRID_BUDGET_S = 400.0


def prepare() -> None:
    import upstream

    print("wrote", upstream.copy_module("kernels/ops/attention/flash_mla_sm120_triton.py", UPSTREAM_TRITON))
    print("wrote", upstream.extract_functions(
        "kernels/ops/attention/flash_mla_sm120.py", {"_gather_and_dequant", "_sm120_sparse_decode_fwd"},
        constants={"_NOPE_DIM", "_ROPE_DIM", "_NOPE_ROPE_STRIDE", "_TILE_SIZE", "_NUM_TILES", "_SCALE_STRIDE", "_D"},
        preamble="import torch\n", out_name=UPSTREAM_TORCH))


class Caches:
    """One SWA cache and one extra cache per layer kind, big enough that the rows of every
    rotation are distinct pages."""

    def __init__(self, device, swa_pages, c4_pages, c128_pages, seed=0):
        gen = torch.Generator(device=device).manual_seed(seed)
        self.gen = gen
        self.device = device
        self.swa, _ = smd.random_v4_cache(swa_pages, SWA_PAGE_SIZE, device, generator=gen)
        self.extra = {"C4": smd.random_v4_cache(c4_pages, C4_PAGE_SIZE, device, generator=gen)[0],
                      "C128": smd.random_v4_cache(c128_pages, C128_PAGE_SIZE, device, generator=gen)[0]}

    def inputs(self, layer, context, batch, s_q, heads):
        """Seam arguments for one call: SWA window (contiguous recent slots), C4 top-512 (random
        distinct compressed slots of the row's context) or C128 (every compressed block)."""
        dev, gen = self.device, self.gen
        rows = batch * s_q
        swa_slots = self.swa.shape[0] * SWA_PAGE_SIZE
        start = torch.randint(0, swa_slots - SLIDING_WINDOW, (rows, 1), device=dev, generator=gen)
        swa = (start + torch.arange(SLIDING_WINDOW, device=dev)).int().view(batch, s_q, SLIDING_WINDOW)
        extra_cache = self.extra[layer]
        n_extra = extra_cache.shape[0] * extra_cache.shape[1]
        if layer == "C4":
            comp = context // C4_RATIO
            base = torch.randint(0, n_extra - comp, (rows, 1), device=dev, generator=gen)
            k = min(INDEX_TOPK, comp)
            pick = torch.rand(rows, comp, device=dev, generator=gen).argsort(dim=1)[:, :k]
            x_idx = (base + pick).int().view(batch, s_q, k)
        else:
            comp = context // C128_RATIO
            base = torch.randint(0, n_extra - comp, (rows, 1), device=dev, generator=gen)
            x_idx = (base + torch.arange(comp, device=dev)).int().view(batch, s_q, comp)
        q = (torch.randn(batch, s_q, heads, HEAD_DIM, device=dev, generator=gen) * 0.5).to(torch.bfloat16)
        return dict(q=q, k_cache=self.swa, indices=swa,
                    topk_length=torch.full((batch,), SLIDING_WINDOW, dtype=torch.int32, device=dev),
                    attn_sink=torch.randn(heads, device=dev, generator=gen), head_dim_v=HEAD_DIM,
                    softmax_scale=SOFTMAX_SCALE, extra_k_cache=extra_cache, extra_indices=x_idx,
                    extra_topk_length=torch.full((batch,), x_idx.shape[-1], dtype=torch.int32, device=dev))


def rel_err(actual, expected) -> float:
    a, e = actual.double(), expected.double()
    return ((a - e).norm() / e.norm().clamp_min(1e-30)).item()


def graph_time(make_call, rotations, calls_per_graph=None, replays=20):
    """Median µs per call; ``make_call(i)`` returns the i-th call (each over its own inputs)."""
    from sglang_sm120.kernels.harness.devicebench import time_in_cuda_graph

    calls = [make_call(i) for i in range(rotations)]
    state = {"i": 0}

    def step():
        calls[state["i"] % rotations]()
        state["i"] += 1

    return time_in_cuda_graph(step, calls_per_graph=calls_per_graph or rotations, replays=replays)


def forms_for(heads, rows, candidates, names, target_cell, tiles_of, device):
    """(label, launch_config or None, num_splits or None) to time in one cell: the shipped default
    first, then the named candidates with the split rule; in the target cell also the rule's
    neighbouring split counts of SPLIT_NEIGHBOURS."""
    forms = [("default", None, None)]
    default_cfg = smd.launch_config_for(heads, rows, candidates)
    for name in names:
        cfg = CANDIDATES[name]
        if smd.padded_heads(heads) % cfg["BLOCK_H"] or cfg == default_cfg:
            continue
        forms.append((name, cfg, None))
        if target_cell and name in SPLIT_NEIGHBOURS:
            units = rows * (smd.padded_heads(heads) // cfg["BLOCK_H"])
            tiles = tiles_of(cfg)
            rule, _ = smd.choose_splits(units, tiles, device)
            counts = sorted({-(-tiles // -(-tiles // s)) for s in range(1, min(tiles, smd.MAX_SPLITS) + 1)})
            at = counts.index(rule)
            for s in counts[max(at - 1, 0):at + 2]:
                if s != rule and units * s <= 3 * smd._program_target(device):
                    forms.append((f"{name} splits={s}", cfg, s))
    return forms


def run(out_dir: str, smoke: bool, defaults_only: bool = False, full_grid: bool = False) -> None:
    from sglang_sm120.kernels.harness.devicebench import (BenchResult, bf16_matmul_tflops, copy_bandwidth_gbs,
                                                          environment)

    t0 = time.time()
    device = "cpu" if smoke else "cuda"
    if full_grid:
        result = BenchResult("sparse_mla_decode-h200-run9-grid", "Sparse MLA decode (DSv4-Flash): the shipped defaults "
                             "over the issue's grid beside upstream SGLang 0.5.23's Triton kernel and torch fallback",
                             COLUMNS)
    elif defaults_only:  # confirmation of the shipped defaults through the default call path
        result = BenchResult("sparse_mla_decode-h200-run8-defaults", "Sparse MLA decode (DSv4-Flash): the shipped defaults, upstream "
                             "SGLang 0.5.23 Triton (C4 8K B=64)", COLUMNS)
    else:
        result = BenchResult(RUN_NAME, "Sparse MLA decode (DSv4-Flash): bf16 split-K partials and wider combine "
                             "programs; default vs candidates, upstream SGLang 0.5.23 Triton (C4 8K B=64)", COLUMNS)
    up_triton = up_torch = None
    try:
        import upstream

        if not smoke:
            up_triton = upstream.load(UPSTREAM_TRITON)
        if full_grid:
            up_torch = upstream.load(UPSTREAM_TORCH)
    except SystemExit as exc:
        result.notes.append(f"upstream baseline missing: {exc}")
    mm = None
    if not smoke:
        bw = copy_bandwidth_gbs()
        mm = bf16_matmul_tflops()
        result.extra.update(copy_bandwidth_GBps=round(bw), bf16_matmul_TFLOPs=round(mm, 1))
        print(f"copy {bw:.0f} GB/s, bf16 mm {mm:.1f} TFLOP/s", flush=True)
    if smoke:
        caches = Caches(device, 8, 64, 2048)
        grid, rotations = SMOKE_GRID, 2
    else:
        caches = Caches(device, 4096, 16384, 262144)
        grid, rotations = GRID, ROTATIONS
    if defaults_only:
        grid = [cell[:-1] + ((),) for cell in grid]
    budget_s = BUDGET_S
    if full_grid:
        grid, budget_s = (FULL_GRID if not smoke else [c[:-1] + ((),) for c in SMOKE_GRID]), FULL_GRID_BUDGET_S
    result.extra.update(rotations_per_graph=rotations, SMs=smd._program_target(device),
                        default_launch_configs=str(smd.LAUNCH_CONFIGS),
                        default_large_batch_configs=str(smd.LARGE_BATCH_CONFIGS),
                        default_few_candidates_configs=str(getattr(smd, "FEW_CANDIDATES_CONFIGS", None)),
                        default_small_batch_configs=str(smd.SMALL_BATCH_CONFIGS), candidates=str(CANDIDATES))

    skipped = []
    best = {}
    for layer, context, batch, heads, s_q, names in grid:
        if time.time() - t0 > budget_s:
            skipped.append(f"{layer}@{context} B={batch} H={heads} s_q={s_q}")
            continue
        try:
            best[(f"{layer}@{context}", batch, heads, s_q)] = measure(
                result, caches, layer, context, batch, heads, s_q, names, rotations, smoke, up_triton, mm,
                every_cell=full_grid, up_torch=up_torch)
        except Exception as exc:  # one failing shape must not lose the others
            traceback.print_exc()
            result.notes.append(f"{layer}@{context} B={batch} H={heads} s_q={s_q}: {type(exc).__name__}: {exc}")
        result.write(out_dir)
    if skipped:
        result.notes.append(f"not measured (time budget {budget_s:.0f} s reached): {'; '.join(skipped)}")
    result.extra["fastest_by_cell"] = {f"{k[0]} B={k[1]} H={k[2]} s_q={k[3]}": v for k, v in best.items()}
    result.notes.append("TFLOPs counts QK and PV (4*H*512 FLOP per candidate and query row); KV_GBps counts 584 B per "
                        "candidate row read once per query row. 'default' = the launch config and split rule shipped "
                        "before this run (launch_config_for + choose_splits); other rows pass launch_config (and "
                        "num_splits where named; otherwise the split rule). "
                        + ("Upstream Triton (graph of 2 calls, 5 replays) and torch fallback (2 calls, 3 replays) in "
                           "every cell (upstream Triton on the B * s_q rows as s_q = 1, as SGLang flattens MTP tokens); "
                           "vs_upstream_triton = upstream Triton time / this row's time." if full_grid else
                           "Upstream Triton only in the C4 8K H=64 B=64 s_q=1 cell."))
    result.env = environment()
    print(result.markdown())
    print("wrote", result.write(out_dir), f"in {time.time() - t0:.0f} s")


def measure(result, caches, layer, context, batch, heads, s_q, names, rotations, smoke, up_triton, mm,
            every_cell=False, up_torch=None):
    calls = [caches.inputs(layer, context, batch, s_q, heads) for _ in range(rotations)]
    a = calls[0]
    topk, x_topk = a["indices"].shape[-1], a["extra_indices"].shape[-1]
    cands = topk + x_topk
    rows = batch * s_q
    flops = 4.0 * heads * HEAD_DIM * cands * rows
    kv_bytes = cands * rows * KV_TOKEN_BYTES
    base = dict(layer=layer, context=context, B=batch, H=heads, s_q=s_q, candidates=cands)
    ref_out, ref_lse = smd.reference_sparse_mla_decode(**a)
    target_cell = layer == "C4" and context == 8192 and heads == 64 and batch == 64 and s_q == 1

    t_up = None
    if up_torch is not None:
        def torch_call(i):
            c = calls[i]
            return lambda: up_torch._sm120_sparse_decode_fwd(
                c["q"], c["k_cache"], c["indices"], c["topk_length"], c["attn_sink"], HEAD_DIM, SOFTMAX_SCALE,
                c["extra_k_cache"], c["extra_indices"], c["extra_topk_length"])

        try:
            torch_out = torch_call(0)()[0]
            t_torch = None if smoke else graph_time(torch_call, rotations, calls_per_graph=2, replays=3)
            result.add(**base, variant="upstream torch fallback", us=t_torch or "",
                       TFLOPs=flops / t_torch / 1e6 if t_torch else "",
                       pct_bf16_mm=100 * flops / t_torch / 1e6 / mm if t_torch and mm else "",
                       KV_GBps=kv_bytes / t_torch / 1e3 if t_torch else "", rel_err=rel_err(torch_out, ref_out),
                       lse_max_abs_err="")
        except Exception as exc:
            traceback.print_exc()
            result.notes.append(f"upstream torch {layer} B={batch}: {type(exc).__name__}: {exc}")
    if up_triton is not None and (target_cell or every_cell):
        # upstream's Triton kernel takes one query per row (SGLang flattens MTP tokens): B * s_q rows of s_q = 1
        flat = [(c["q"].reshape(rows, 1, heads, HEAD_DIM), c["k_cache"], c["indices"].reshape(rows, 1, -1),
                 c["topk_length"].repeat_interleave(s_q), c["attn_sink"], HEAD_DIM, SOFTMAX_SCALE, c["extra_k_cache"],
                 c["extra_indices"].reshape(rows, 1, -1), c["extra_topk_length"].repeat_interleave(s_q))
                for c in calls]

        def upstream_call(i):
            return lambda: up_triton.flash_mla_sparse_decode_triton(*flat[i])

        try:
            up_out = upstream_call(0)()[0].reshape(ref_out.shape)  # autotune outside the graph
            t_up = graph_time(upstream_call, rotations, calls_per_graph=2, replays=5)
            result.add(**base, variant="upstream triton", us=t_up, vs_upstream_triton=1.0,
                       TFLOPs=flops / t_up / 1e6, pct_bf16_mm=100 * flops / t_up / 1e6 / mm if mm else "",
                       KV_GBps=kv_bytes / t_up / 1e3, rel_err=rel_err(up_out, ref_out), lse_max_abs_err="")
        except Exception as exc:
            traceback.print_exc()
            result.notes.append(f"upstream triton {layer} B={batch}: {type(exc).__name__}: {exc}")

    def tiles_of(cfg):
        return -(-topk // cfg["BLOCK_N"]) + -(-x_topk // cfg["BLOCK_N"])

    times = {}
    for label, cfg, splits in forms_for(heads, rows, cands, names, target_cell, tiles_of, "cpu" if smoke else "cuda"):
        try:
            out, lse = smd.sparse_mla_decode(**a, num_splits=splits, launch_config=cfg)
            err = rel_err(out, ref_out)
            lse_err = (lse - ref_lse).abs().max().item()
            t = None
            if not smoke:
                t = graph_time(lambda i: (lambda c=calls[i]: smd.sparse_mla_decode(
                    **c, num_splits=splits, launch_config=cfg)), rotations)
            ok = err < 2e-2 and lse_err < 1e-3
            if ok:
                times[label] = t or 0.0
            note = "" if ok else "ERROR TOO HIGH"
            if label != "default" and t and times.get("default"):
                note = (note + " " if note else "") + f"{times['default'] / t:.3f}x vs default"
            result.add(**base, variant=label, us=t if t else "", rel_err=err, lse_max_abs_err=lse_err, note=note,
                       vs_upstream_triton=t_up / t if t_up and t else "", TFLOPs=flops / t / 1e6 if t else "",
                       pct_bf16_mm=100 * flops / t / 1e6 / mm if t and mm else "",
                       KV_GBps=kv_bytes / t / 1e3 if t else "")
            print(f"{layer}@{context} B={batch} H={heads} s_q={s_q} {label}: {t} us, rel err {err:.2e}, "
                  f"lse {lse_err:.1e}", flush=True)
        except Exception as exc:
            traceback.print_exc()
            result.notes.append(f"{layer} B={batch} H={heads} s_q={s_q} {label}: {type(exc).__name__}: {exc}")
    fastest = min(times, key=times.get) if times else None
    return f"{fastest} ({times[fastest]:.2f} us; default {times.get('default', float('nan')):.2f} us)" if fastest \
        else "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", action="store_true", help="extract upstream baselines into .upstream/")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter, no timing")
    parser.add_argument("--out", default=os.environ.get("OUT", ".device-out"))
    parser.add_argument("--defaults-only", action="store_true", help="time only the shipped defaults (and upstream)")
    parser.add_argument("--full-grid", action="store_true",
                        help="the issue's grid (C4/C128, 8K/64K, B 1/4/16/64, H 64/16, s_q 1/2): shipped defaults "
                             "beside upstream's Triton kernel and torch fallback in every cell")
    args = parser.parse_args()
    if args.prepare:
        prepare()
        return
    if args.smoke:
        from sglang_sm120.kernels.harness.interpreter import interpreter_enabled, patch_bf16_dot

        if not interpreter_enabled():
            raise SystemExit("--smoke needs TRITON_INTERPRET=1")
        patch_bf16_dot()
    run(args.out, args.smoke, args.defaults_only, args.full_grid)


if __name__ == "__main__":
    main()
