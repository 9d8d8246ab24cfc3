"""``sglang-sm120 bench``: the DSv4-Flash decode-step benchmark (plugin vs upstream path).

With a GPU: full-size layers, every stage and layer timed in CUDA graphs beside the upstream path,
the 43-layer step, a plot, and the sm_120 projection. Without one: reduced sizes under the Triton
interpreter, both paths checked against the float32 references, nothing timed.
"""

from __future__ import annotations

import os
import re
import sys

GPU_GRID = dict(batches=(1, 8, 32, 64), tps=(1, 4), contexts=(8192, 65536))


def add_bench_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="DSv4-Flash decode-step benchmark: plugin kernels vs the upstream SGLang path",
        description=__doc__)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda: full sizes, timed; cpu: reduced sizes under the Triton interpreter, checks only "
                        "(auto: cuda when a GPU is visible)")
    p.add_argument("--batch", "-b", type=int, action="append", help="batch sizes B (repeatable)")
    p.add_argument("--tp", type=int, action="append", help="tensor-parallel sizes T, one rank timed (repeatable)")
    p.add_argument("--context", type=int, action="append", help="context lengths in tokens (repeatable)")
    p.add_argument("--kind", action="append", choices=("swa", "c4", "c128"), help="layer kinds (default: all)")
    p.add_argument("--check", choices=("all", "corners", "none"), default=None,
                   help="where to check against the float32 references (GPU default: corners = smallest "
                        "context at the smallest and largest B; CPU: all)")
    p.add_argument("--common-pdl", choices=("on", "off"), default="on",
                   help="launch the shared norm/router/SwiGLU/combine kernels of both paths with programmatic "
                        "dependent launch where the GPU has it (cc >= 9.0), as SGLang's own kernels for those "
                        "stages are launched (default on; off for an A/B)")
    p.add_argument("--layer-streams", choices=("sglang", "one"), default="sglang",
                   help="sglang: a layer's time (and the step's) on the streams SGLang's CUDA-graph decode forks "
                        "(compressor and indexer beside the query projections, the shared expert beside the routed "
                        "experts; both paths alike); one: every stage on one stream. The one-stream layer time is "
                        "reported beside it either way")
    p.add_argument("--replays", type=int, default=7, help="CUDA-graph replays per timing (median)")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="stop starting new grid points after this many seconds (the rest are listed as skipped)")
    p.add_argument("--allreduce-us", type=float, default=None,
                   help="measured time of one [B, 4096] bf16 all-reduce at your T, for the sm_120 projection; "
                        "without it the projection excludes all-reduce for T > 1 and says so")
    p.add_argument("--upstream", choices=("auto", "sglang", "files"), default="auto",
                   help="where the upstream code comes from: the installed SGLang, or files extracted by "
                        "tools/device_bench.py --prepare (auto: files when present)")
    p.add_argument("--upstream-dir", default=".upstream")
    p.add_argument("--out", default="bench-results", help="folder for <name>.json/.md/.png")
    p.add_argument("--name", default=None, help="file name stem (default: bench-<gpu> or bench-cpu)")
    p.add_argument("--from-json", default=None,
                   help="re-render the tables, plot and projection from a results JSON of an earlier run "
                        "(e.g. with a measured --allreduce-us); runs nothing")
    p.set_defaults(func=run_bench)


def grid_problems(cfg, args) -> list[str]:
    """What in the requested grid cannot run, each naming its flag (empty when all can)."""
    from ..kernels.dsv4 import SUPPORTED_TP

    def shards(tp: int) -> bool:
        try:
            cfg.dims.rank(tp)
        except ValueError:
            return False
        return True

    problems = [f"--batch {b}: a batch size is at least 1" for b in cfg.batches if b < 1]
    usable = [tp for tp in SUPPORTED_TP if shards(tp)]
    sizes = "the full DSv4-Flash sizes" if cfg.dims.is_full else \
        f"the reduced CPU layers ({cfg.dims.heads} heads in {cfg.dims.o_groups} wo_a groups)"
    problems += [f"--tp {tp}: {sizes} shard over T in {usable}" for tp in cfg.tps if tp not in usable]
    problems += [f"--context {c}: a context length is at least 0 tokens" for c in cfg.contexts if c < 0]
    if args.replays < 1:
        problems.append(f"--replays {args.replays}: at least one replay per timing")
    if args.time_budget_s is not None and not args.time_budget_s > 0:
        problems.append(f"--time-budget-s {args.time_budget_s}: a budget is a positive number of seconds")
    return problems


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def run_bench(args) -> int:
    if args.allreduce_us is not None and not args.allreduce_us >= 0:
        print(f"bench: --allreduce-us must be a time in microseconds (>= 0), got {args.allreduce_us}", file=sys.stderr)
        return 2
    if args.from_json:
        import json

        from . import report

        with open(args.from_json) as f:
            results = json.load(f)
        results["notes"] = [n for n in results["notes"] if not n.startswith(("plot:", "rendered from"))]
        results["notes"].append(f"rendered from {os.path.basename(args.from_json)} by `sglang-sm120 bench "
                                f"--from-json` (the numbers are that run's)")
        name = args.name or os.path.splitext(os.path.basename(args.from_json))[0]
        paths = report.write(results, args.out, name, args.allreduce_us)
        _print_summary(results)
        print("re-rendered from", args.from_json, "->", ", ".join(paths.values()))
        return 0

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    if device == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            if any(m.startswith("sglang_sm120.kernels.") and m.split(".")[-1] in
                   ("sparse_mla_decode", "indexer", "moe_mxfp4", "fp8_gemv") for m in sys.modules):
                print("bench: kernels were imported before TRITON_INTERPRET=1 could be set; "
                      "run `TRITON_INTERPRET=1 sglang-sm120 bench --device cpu`", file=sys.stderr)
                return 2
            os.environ["TRITON_INTERPRET"] = "1"
        print("bench: no GPU in use -> reduced DSv4-Flash sizes under the Triton CPU interpreter; both paths are "
              "checked against the float32 references. NOTHING IS TIMED.", flush=True)

    from . import report, runner

    runner.interpreter_ready()
    if device == "cpu":
        cfg = runner.default_cpu_config()
    else:
        cfg = runner.BenchConfig(device="cuda", **GPU_GRID)
    if args.batch:
        cfg.batches = tuple(args.batch)
    if args.tp:
        cfg.tps = tuple(args.tp)
    if args.context:
        cfg.contexts = tuple(args.context)
    if args.kind:
        cfg.kinds = tuple(args.kind)
    if args.check:
        cfg.check = args.check
    cfg.replays = args.replays
    cfg.common_pdl = args.common_pdl == "on"
    cfg.layer_streams = args.layer_streams == "sglang"
    cfg.time_budget_s = args.time_budget_s
    cfg.upstream_source = args.upstream
    cfg.upstream_dir = args.upstream_dir
    problems = grid_problems(cfg, args)
    if problems:  # before any layer is built: a clear refusal instead of a traceback mid-run
        print("bench: " + "; ".join(problems), file=sys.stderr)
        return 2

    from ..kernels.harness.devicebench import environment

    name = args.name or ("bench-cpu" if device == "cpu" else f"bench-{_slug(environment().get('gpu', ''))}")

    def partial(results):  # a run cut short still leaves its numbers
        report.write(results, args.out, name, args.allreduce_us, with_plot=False)

    results = runner.run(cfg, on_point=partial if device != "cpu" else None)
    paths = report.write(results, args.out, name, args.allreduce_us)
    _print_summary(results)
    print("wrote " + ", ".join(paths.values()))
    return 1 if results["checks_failed"] or results.get("errors") else 0


def _print_summary(results) -> None:
    failed = results["checks_failed"]
    n_checks = sum(len(r["checks"]) for r in results["layers"])
    if results["timed"]:
        print(f"\n{results['env'].get('gpu')}: copy bandwidth {results['copy_bandwidth_gbs']:.0f} GB/s")
        for s in results["steps"]:
            print(f"  T={s['T']} ctx={s['context']} B={s['B']}: plugin {s.get('plugin_step_us', 0) / 1e3:.2f} ms/step, "
                  f"upstream {s.get('upstream_step_us', 0) / 1e3:.2f} ms/step, speed-up {s.get('speedup', 0):.2f}x")
    else:
        print("\nNOTHING WAS TIMED (no GPU): reduced sizes under the Triton interpreter.")
    print(f"checks against the float32 references: {n_checks - len(failed)} passed, {len(failed)} failed")
    for err in results.get("errors", []):
        print("  ERROR:", {k: v for k, v in err.items() if k != "traceback"})
    for f in failed:
        print("  FAILED:", f)
    for note in results["notes"]:
        print("note:", note)
