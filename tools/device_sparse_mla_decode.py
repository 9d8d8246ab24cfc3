"""Sparse MLA decode on the device: full DSv4-Flash shapes checked against the float32 reference and
timed in CUDA graphs beside upstream's Triton kernel (``flash_mla_sparse_decode_triton``) and its
torch fallback (``_sm120_sparse_decode_fwd``), in the same run.

    python3 tools/device_sparse_mla_decode.py --prepare          # here: copy/extract upstream baselines
    python3 tools/device_sparse_mla_decode.py --out $OUT         # on the device (carry .upstream)
    TRITON_INTERPRET=1 python3 tools/device_sparse_mla_decode.py --smoke   # here: the logic at tiny shapes

Inputs are laid out as SGLang 0.5.23 hands them over: one SWA cache of 256-token pages with a
128-slot window per row, plus a C4 cache (64-token pages, 512 top-k slots) or a C128 cache (2-token
pages, every compressed block of the context). Caches are large (about 600 MB each) and every call
inside a graph uses its own rows, so KV reads come from HBM as in consecutive layers. Upstream's
torch fallback synchronises with the host (boolean indexing), so it is timed with CUDA events
outside a graph and only for the H=64, s_q=1 rows.
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
LAYERS = [("C4", 8192), ("C128", 8192), ("C128", 65536)]
BATCHES = (1, 4, 16, 64)
HEADS = (64, 16)
S_QS = (1, 2)
ROTATIONS = 8  # calls per graph, each over its own rows of the caches
COLUMNS = ("layer", "context", "B", "H", "s_q", "candidates", "variant", "us", "vs_upstream_triton", "TFLOPs",
           "pct_bf16_mm", "KV_GBps", "rel_err", "lse_max_abs_err", "note")


# Launch forms compared in the sweep ("old" is the default shipped before this run).
VARIANTS = {
    64: {"old bh32": dict(BLOCK_H=32, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1),
         "bh32 rowscale": dict(BLOCK_H=32, BLOCK_N=32, PREFETCH_KV=True, ROW_SCALES=True, num_warps=8, num_stages=1),
         "bh32 rowscale qk2": dict(BLOCK_H=32, BLOCK_N=32, PREFETCH_KV=True, ROW_SCALES=True, QK_CHAINS=2,
                                   num_warps=8, num_stages=1),
         "bh64 bn16 rowscale prefetch": dict(BLOCK_H=64, BLOCK_N=16, PREFETCH_KV=True, ROW_SCALES=True, num_warps=8,
                                             num_stages=1),
         "bh64 bn16 rowscale": dict(BLOCK_H=64, BLOCK_N=16, PREFETCH_KV=False, ROW_SCALES=True, num_warps=8,
                                    num_stages=1)},
    16: {"old bh16": dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, num_warps=8, num_stages=1),
         "bh16 rowscale": dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, ROW_SCALES=True, num_warps=8, num_stages=1),
         "bh16 rowscale qk2": dict(BLOCK_H=16, BLOCK_N=32, PREFETCH_KV=True, ROW_SCALES=True, QK_CHAINS=2,
                                   num_warps=8, num_stages=1)},
}
OLD_MAX_SPLITS = 16
SWEEP_BUDGET_S = 110.0  # the sweep stops starting new variants after this
GRID_BUDGET_S = 255.0  # the grid stops starting new shapes after this (timeout_s is 300)


def old_rule_splits(units, total_tiles, sms):
    """The split rule shipped before this run: ceil(SMs / units), at most 16."""
    if units >= sms or total_tiles <= 1:
        return 1
    splits = min(-(-sms // units), total_tiles, OLD_MAX_SPLITS)
    per = -(-total_tiles // splits)
    return -(-total_tiles // per)


def geometry(cfg, heads, rows, cands_main, cands_extra):
    head_blocks = smd.padded_heads(heads) // cfg["BLOCK_H"]
    tiles = -(-cands_main // cfg["BLOCK_N"]) + -(-cands_extra // cfg["BLOCK_N"])
    return rows * head_blocks, tiles


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


def event_time(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def run(out_dir: str, smoke: bool) -> None:
    from sglang_sm120.kernels.harness.devicebench import (BenchResult, bf16_matmul_tflops, copy_bandwidth_gbs,
                                                          environment)

    t0 = time.time()
    device = "cpu" if smoke else "cuda"
    result = BenchResult("sparse_mla_decode-h200-run3",
                         "Sparse MLA decode (DSv4-Flash): launch-form sweep, old vs new default, upstream SGLang 0.5.23",
                         COLUMNS)
    up_triton = up_torch = None
    try:
        import upstream

        up_torch = upstream.load(UPSTREAM_TORCH)
        if not smoke:
            up_triton = upstream.load(UPSTREAM_TRITON)
    except SystemExit as exc:
        result.notes.append(f"upstream baselines missing: {exc}")
    mm = None
    if not smoke:
        bw = copy_bandwidth_gbs()
        mm = bf16_matmul_tflops()
        result.extra.update(copy_bandwidth_GBps=round(bw), bf16_matmul_TFLOPs=round(mm, 1))
        print(f"copy {bw:.0f} GB/s, bf16 mm {mm:.1f} TFLOP/s", flush=True)
    if smoke:
        caches = Caches(device, 8, 64, 2048)
        layers, batches, heads_list, s_qs, rotations = [("C4", 1024), ("C128", 2048)], (1, 2), (16,), (1, 2), 2
        sweep_batches = (1, 2)
    else:
        caches = Caches(device, 4096, 16384, 524288)
        layers, batches, heads_list, s_qs, rotations = LAYERS, BATCHES, HEADS, S_QS, ROTATIONS
        sweep_batches = BATCHES
    sms = smd._program_target(device)
    result.extra.update(rotations_per_graph=rotations, SMs=sms, old_launch_configs=str(smd.LAUNCH_CONFIGS),
                        variants=str(VARIANTS), split_model=dict(PROGRAM_OVERHEAD_TILES=smd.PROGRAM_OVERHEAD_TILES,
                                                                 SPLIT_OVERHEAD_TILES=smd.SPLIT_OVERHEAD_TILES,
                                                                 MAX_SPLITS=smd.MAX_SPLITS))

    chosen = {}
    for heads in heads_list:
        try:
            chosen[heads] = sweep(result, caches, heads, sweep_batches, rotations, mm, sms, smoke, t0)
        except Exception as exc:
            traceback.print_exc()
            result.notes.append(f"sweep H={heads} failed: {type(exc).__name__}: {exc}")
            chosen[heads] = {b: next(iter(VARIANTS[heads])) for b in sweep_batches}
        result.write(out_dir)
    result.extra["new_default_by_batch"] = {str(h): {str(b): v for b, v in c.items()} for h, c in chosen.items()}
    print("chosen", chosen, flush=True)

    # the targets first (C4, H=64, s_q=1), then the rest of the grid
    grid = [(lay, b, h, s) for lay in layers for h in heads_list for s in s_qs for b in batches]
    grid.sort(key=lambda g: (g[0][0] != "C4", g[2] != max(heads_list), g[3] != 1))
    skipped = []
    for (layer, context), batch, heads, s_q in grid:
        if time.time() - t0 > GRID_BUDGET_S:
            skipped.append(f"{layer}@{context} B={batch} H={heads} s_q={s_q}")
            continue
        try:
            measure(result, caches, layer, context, batch, heads, s_q, rotations, smoke, up_triton, up_torch, mm,
                    chosen[heads], sms)
        except Exception as exc:  # one failing shape must not lose the others
            traceback.print_exc()
            result.notes.append(f"{layer}@{context} B={batch} H={heads} s_q={s_q}: {type(exc).__name__}: {exc}")
        result.write(out_dir)
    if skipped:
        result.notes.append(f"not measured (time budget {GRID_BUDGET_S:.0f} s reached): {'; '.join(skipped)}")
    result.notes.append("TFLOPs counts QK and PV (4*H*512 FLOP per candidate and query row); KV_GBps counts 584 B per "
                        "candidate row read once per query row; upstream Triton at s_q=2 runs the B*s_q rows as "
                        "s_q=1 (its kernel takes one query per row, as SGLang flattens MTP tokens).")
    result.notes.append("'old default' = launch config and split rule shipped before this run (split count passed "
                        "explicitly); 'new' = the variant the sweep picked for that batch size with the library's "
                        "new split rule (num_splits=None).")
    result.env = environment()
    print(result.markdown())
    print("wrote", result.write(out_dir), f"in {time.time() - t0:.0f} s")


def _new_variant(chosen, rows):
    keys = sorted(chosen)
    fit = [b for b in keys if b <= rows]
    return chosen[fit[-1] if fit else keys[0]]


def sweep(result, caches, heads, batches, rotations, mm, sms, smoke, t0):
    """C4 layer at 8K, s_q=1: every launch form of VARIANTS[heads] at each batch size with the new
    split rule, the old rule and the split counts around them. Returns {B: fastest form under the
    new rule}."""
    per_batch = {}
    for batch in batches:
        calls = [caches.inputs("C4", 8192, batch, 1, heads) for _ in range(rotations)]
        ref_out, ref_lse = smd.reference_sparse_mla_decode(**calls[0])
        per_batch[batch] = (calls, ref_out, ref_lse)
    best = {b: (float("inf"), None) for b in batches}
    for name, cfg in VARIANTS[heads].items():
        if time.time() - t0 > SWEEP_BUDGET_S:
            result.notes.append(f"sweep H={heads}: {name} not measured (sweep budget {SWEEP_BUDGET_S:.0f} s)")
            continue
        for batch in batches:
            calls, ref_out, ref_lse = per_batch[batch]
            cands = calls[0]["indices"].shape[-1] + calls[0]["extra_indices"].shape[-1]
            flops = 4.0 * heads * HEAD_DIM * cands * batch
            units, tiles = geometry(cfg, heads, batch, calls[0]["indices"].shape[-1],
                                    calls[0]["extra_indices"].shape[-1])
            rule, _ = smd.choose_splits(units, tiles, "cuda" if not smoke else "cpu")
            old = old_rule_splits(units, tiles, sms)
            options = {None: f"new rule ({rule})", old: f"old rule ({old})"} if old != rule else {None: f"both rules ({rule})"}
            for extra in (1, 2, 3, 4, 5, 8, 10, 14, 20, 32):
                per = -(-tiles // extra)
                eff = -(-tiles // per)
                if eff != extra or extra in (rule, old) or extra > min(tiles, smd.MAX_SPLITS):
                    continue
                if units * extra > 2 * sms or units * extra * 4 < sms and extra < tiles:
                    continue  # more than two waves, or a quarter of the SMs idle: not worth timing
                options[extra] = str(extra)
            for splits, label in options.items():
                try:
                    out, lse = smd.sparse_mla_decode(**calls[0], num_splits=splits, launch_config=cfg)
                    err = rel_err(out, ref_out)
                    lse_err = (lse - ref_lse).abs().max().item()
                    t = None
                    if not smoke:
                        t = graph_time(lambda i: (lambda c=calls[i]: smd.sparse_mla_decode(
                            **c, num_splits=splits, launch_config=cfg)), rotations)
                    result.add(layer="C4", context=8192, B=batch, H=heads, s_q=1, candidates=cands,
                               variant=f"sweep {name} splits={label}", us=t if t else "",
                               TFLOPs=flops / t / 1e6 if t else "", pct_bf16_mm=100 * flops / t / 1e6 / mm if t else "",
                               rel_err=err, lse_max_abs_err=lse_err, note="" if err < 2e-2 else "REL ERR TOO HIGH")
                    print(f"sweep H={heads} B={batch} {name} splits={label}: {t} us, rel err {err:.2e}", flush=True)
                    if splits is None and err < 2e-2:
                        score = t if t else 0.0
                        if score < best[batch][0]:
                            best[batch] = (score, name)
                except Exception as exc:
                    traceback.print_exc()
                    result.notes.append(f"sweep H={heads} B={batch} {name} splits={label}: "
                                        f"{type(exc).__name__}: {exc}")
    return {b: (best[b][1] or next(iter(VARIANTS[heads]))) for b in batches}


def measure(result, caches, layer, context, batch, heads, s_q, rotations, smoke, up_triton, up_torch, mm, chosen,
            sms):
    calls = [caches.inputs(layer, context, batch, s_q, heads) for _ in range(rotations)]
    a = calls[0]
    cands = a["indices"].shape[-1] + a["extra_indices"].shape[-1]
    rows = batch * s_q
    flops = 4.0 * heads * HEAD_DIM * cands * rows
    kv_bytes = cands * rows * KV_TOKEN_BYTES
    base = dict(layer=layer, context=context, B=batch, H=heads, s_q=s_q, candidates=cands)
    ref_out, ref_lse = smd.reference_sparse_mla_decode(**a)

    t_up = None
    if up_triton is not None:
        def upstream_call(i):
            c = calls[i]
            q = c["q"].reshape(rows, 1, heads, HEAD_DIM)
            idx = c["indices"].reshape(rows, 1, -1)
            x_idx = c["extra_indices"].reshape(rows, 1, -1)
            lens = c["topk_length"].repeat_interleave(s_q)
            x_lens = c["extra_topk_length"].repeat_interleave(s_q)
            return lambda: up_triton.flash_mla_sparse_decode_triton(
                q, c["k_cache"], idx, lens, c["attn_sink"], HEAD_DIM, SOFTMAX_SCALE, c["extra_k_cache"], x_idx, x_lens)

        upstream_call(0)()  # autotune outside the graph
        t_up = graph_time(upstream_call, rotations, calls_per_graph=2, replays=5)
        up_err = rel_err(up_triton.flash_mla_sparse_decode_triton(
            a["q"].reshape(rows, 1, heads, HEAD_DIM), a["k_cache"], a["indices"].reshape(rows, 1, -1),
            a["topk_length"].repeat_interleave(s_q), a["attn_sink"], HEAD_DIM, SOFTMAX_SCALE, a["extra_k_cache"],
            a["extra_indices"].reshape(rows, 1, -1), a["extra_topk_length"].repeat_interleave(s_q))[0],
            ref_out.reshape(rows, 1, heads, HEAD_DIM))
        result.add(**base, variant="upstream triton", us=t_up, vs_upstream_triton=1.0,
                   TFLOPs=flops / t_up / 1e6, pct_bf16_mm=100 * flops / t_up / 1e6 / mm if mm else "",
                   KV_GBps=kv_bytes / t_up / 1e3, rel_err=up_err, lse_max_abs_err="")

    old_cfg = VARIANTS[heads][next(iter(VARIANTS[heads]))]
    units, tiles = geometry(old_cfg, heads, rows, a["indices"].shape[-1], a["extra_indices"].shape[-1])
    new_name = _new_variant(chosen, rows)
    forms = [("old default", old_cfg, old_rule_splits(units, tiles, sms)),
             (f"new ({new_name}, new split rule)", VARIANTS[heads][new_name], None)]
    times, outs = {}, {}
    for label, cfg, splits in forms:
        out, lse = smd.sparse_mla_decode(**a, num_splits=splits, launch_config=cfg)
        outs[label] = out
        err = rel_err(out, ref_out)
        lse_err = (lse - ref_lse).abs().max().item()
        t = None
        if not smoke:
            t = graph_time(lambda i: (lambda c=calls[i]: smd.sparse_mla_decode(
                **c, num_splits=splits, launch_config=cfg)), rotations)
        times[label] = t
        note = "" if err < 2e-2 else "REL ERR TOO HIGH"
        if label != "old default" and t and times.get("old default"):
            note = (note + " " if note else "") + f"{times['old default'] / t:.2f}x vs old"
        result.add(**base, variant=label, us=t if t else "", rel_err=err, lse_max_abs_err=lse_err, note=note,
                   vs_upstream_triton=t_up / t if t_up and t else "", TFLOPs=flops / t / 1e6 if t else "",
                   pct_bf16_mm=100 * flops / t / 1e6 / mm if t and mm else "",
                   KV_GBps=kv_bytes / t / 1e3 if t else "")

    if up_torch is not None and (smoke or (heads == 64 and s_q == 1)):
        fallback = lambda: up_torch._sm120_sparse_decode_fwd(  # noqa: E731
            a["q"], a["k_cache"], a["indices"], a["topk_length"], a["attn_sink"], HEAD_DIM, SOFTMAX_SCALE,
            a["extra_k_cache"], a["extra_indices"], a["extra_topk_length"])
        f_out, f_lse = fallback()
        t_torch = None if smoke else event_time(fallback)
        result.add(**base, variant="upstream torch (events, not graphed)", us=t_torch or "",
                   vs_upstream_triton=t_up / t_torch if t_up and t_torch else "",
                   rel_err=rel_err(f_out, ref_out), lse_max_abs_err=(f_lse - ref_lse).abs().max().item(),
                   note="ours (old) vs it: rel err %.2e" % rel_err(outs["old default"], f_out))
    print(f"{layer}@{context} B={batch} H={heads} s_q={s_q}: {times} us, upstream triton {t_up} us", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", action="store_true", help="extract upstream baselines into .upstream/")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter, no timing")
    parser.add_argument("--out", default=os.environ.get("OUT", ".device-out"))
    args = parser.parse_args()
    if args.prepare:
        prepare()
        return
    if args.smoke:
        from sglang_sm120.kernels.harness.interpreter import interpreter_enabled, patch_bf16_dot

        if not interpreter_enabled():
            raise SystemExit("--smoke needs TRITON_INTERPRET=1")
        patch_bf16_dot()
    run(args.out, args.smoke)


if __name__ == "__main__":
    main()
