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
- ``prio_wqb_pp0``: both.

    python3 tools/device_bench_layer_variants.py --out $OUT                   # on the device
    python3 tools/device_bench_layer_variants.py --smoke                      # here: variants build, no GPU
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

import torch  # noqa: E402

from sglang_sm120.bench import layer as L  # noqa: E402
from sglang_sm120.bench import model  # noqa: E402
from sglang_sm120.kernels import dsv4, fp8_gemv  # noqa: E402

VARIANTS = ("shipped", "wqb_pp1", "wqb_pp0", "wqb_rows", "prio", "prio_wqb_pp0")
INDEXER_STREAMS = (L.STREAM_INDEXER, L.STREAM_INDEX_WEIGHTS, L.STREAM_INDEX_Q)


def main_wq_b_shape(tp: int) -> tuple[int, int]:
    return dsv4.dense_linear_shapes(tp)["wq_b"]


def wq_b_override(variant: str, tp: int):
    """A replacement for fp8_gemv.default_config that changes only the main wq_b's config (None: no change).
    At T >= 4 the main wq_b has the indexer's wq_b shape, so the override applies at T=1/2 only."""
    if "wqb" not in variant:
        return None
    n, k = main_wq_b_shape(tp)
    if (n, k) == dsv4.dense_linear_shapes(tp)["indexer_wq_b"]:
        return None
    original = fp8_gemv.default_config

    def config(m, n_, k_, groups=1, sms=None):
        cfg = original(m, n_, k_, groups, sms)
        if (n_, k_) != (n, k) or groups != 1 or m != 1:
            return cfg
        if variant.endswith("wqb_pp1"):
            return dataclasses.replace(cfg, persistent_programs_per_sm=1)
        if variant.endswith("wqb_pp0"):
            return dataclasses.replace(cfg, persistent_programs_per_sm=0)
        if variant.endswith("wqb_rows"):
            return original(m, *dsv4.dense_linear_shapes(tp)["indexer_wq_b"], groups, sms)
        raise ValueError(variant)
    return config


@contextlib.contextmanager
def applied(variant: str, tp: int):
    override = wq_b_override(variant, tp)
    original = fp8_gemv.default_config
    if override is not None:
        fp8_gemv.default_config = override
    try:
        yield override is not None or "prio" in variant
    finally:
        fp8_gemv.default_config = original


def side_streams(variant: str) -> dict:
    """SGLang's side streams for the bench's run_layer; with ``prio`` the indexer's at the highest priority."""
    least, greatest = torch.cuda.Stream.priority_range()
    high = min(least, greatest)  # CUDA: a lower number is a higher priority
    return {name: torch.cuda.Stream(priority=high if ("prio" in variant and name in INDEXER_STREAMS) else 0)
            for name in L.SIDE_STREAMS}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    p.add_argument("--name", default="bench-variants-h200")
    p.add_argument("--kind", nargs="+", default=["c4", "c128", "swa"], choices=model.KINDS)
    p.add_argument("--batch", nargs="+", type=int, default=[1])
    p.add_argument("--tp", nargs="+", type=int, default=[1, 4])
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--replays", type=int, default=60)
    p.add_argument("--trace", nargs="*", default=[], help="variants to trace (kernel timeline of one replay)")
    p.add_argument("--smoke", action="store_true", help="CPU: build every variant's stages, run them once")
    args = p.parse_args()

    if args.smoke:
        dims = model.Dims.reduced()
        for kind in args.kind:
            state_w = L.LayerState(model.build_weights(dims.rank(1), "cpu"), None)
            caches = model.build_caches(kind, dims, 1, 256, "cpu")
            for variant in args.variants:
                with applied(variant, 1):
                    st: dict = {}
                    stages = L.build_stages(L.PLUGIN, kind, state_w, caches,
                                            torch.zeros(1, dims.hidden, dtype=torch.bfloat16), st)
                    L.run_layer(stages)
                print(kind, variant, "ok")
        print("smoke ok (nothing timed)")
        return 0

    from device_bench_trace import kernels_of_one_replay, summarise
    from sglang_sm120.kernels.harness.devicebench import capture_graph, environment, time_in_cuda_graph

    os.makedirs(args.out, exist_ok=True)
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    results = {"env": environment(), "context": args.context, "priority_range": torch.cuda.Stream.priority_range(),
               "points": []}
    dims = model.Dims.full()
    lines = [f"# Layer-schedule variants ({results['env'].get('gpu')}, {results['env']['date']})", "",
             f"`python3 tools/device_bench_layer_variants.py` (plugin path, SGLang's streams, context {args.context}; "
             f"median of {args.replays} replays of a 2-layer-call graph after an L2 flush, per layer call)", "",
             "| kind | T | B | variant | layer µs | vs shipped | applies |", "|---|---|---|---|---|---|---|"]
    for tp in args.tp:
        state_w = L.LayerState(model.build_weights(dims.rank(tp), "cuda"), None)
        for kind in args.kind:
            for b in args.batch:
                caches = model.build_caches(kind, dims, b, args.context, "cuda", seed=1)
                x = torch.randn(b, dims.hidden, device="cuda").to(torch.bfloat16)
                ref_out = None
                shipped_us = None
                for variant in args.variants:
                    with applied(variant, tp) as applies:
                        side = side_streams(variant)
                        st: dict = {}
                        stages = L.build_stages(L.PLUGIN, kind, state_w, caches, x, st)
                        L.run_layer(stages, side)
                        torch.cuda.synchronize()
                        out = st["out"].clone()
                        same = ref_out is None or torch.equal(out, ref_out)
                        ref_out = out if ref_out is None else ref_out
                        us = time_in_cuda_graph(lambda: L.run_layer(stages, side), calls_per_graph=2,
                                                replays=args.replays, warmup=1)
                        point = {"kind": kind, "T": tp, "B": b, "variant": variant, "layer_us": round(us, 2),
                                 "applies": applies, "same_output_as_shipped": same}
                        if variant in args.trace:
                            graph = capture_graph(lambda: L.run_layer(stages, side), warmup=1)
                            point["trace"] = summarise(kernels_of_one_replay(graph, flush))
                            del graph
                    if variant == "shipped":
                        shipped_us = us
                    ratio = f"{shipped_us / us:.3f}x" if shipped_us else "-"
                    results["points"].append(point)
                    lines.append(f"| {kind} | {tp} | {b} | {variant} | {us:.2f} | {ratio} | "
                                 f"{'yes' if applies else 'no (same as shipped)'} |")
                    print(lines[-1], "" if same else "OUTPUT DIFFERS", flush=True)
    traced = [pt for pt in results["points"] if "trace" in pt]
    for pt in traced:
        tr = pt["trace"]
        lines += ["", f"## {pt['kind']} T={pt['T']} B={pt['B']} {pt['variant']}: span {tr['span_us']} µs, "
                  f"busy {tr['busy_us']} µs", "", "| start µs | µs | stream | kernel |", "|---|---|---|---|"]
        lines += [f"| {k['start_us']} | {k['dur_us']} | {k['stream']} | `{k['name']}` |" for k in tr["kernels"]]
    with open(os.path.join(args.out, args.name + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, args.name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
