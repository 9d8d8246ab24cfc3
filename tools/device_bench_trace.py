#!/usr/bin/env python3
"""Where a bench layer's time goes: one layer graph of ``sglang-sm120 bench`` (on SGLang's decode streams, or on
one stream), replayed under the CUDA profiler, kernel by kernel (start, end, stream), with the critical path's
idle gaps. The bench itself gives only the whole layer and each stage in its own graph.

    python3 tools/device_bench_trace.py --out $OUT --kind c4 swa --batch 1 --tp 1     # on the device
    python3 tools/device_bench_trace.py --smoke                                       # here: builds, no GPU

Writes ``<name>.md`` (per layer: every kernel with its offset from the first kernel's start, its duration and
stream, and the busy/idle time of the whole span) and the raw kernel lists in ``<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

import torch  # noqa: E402

from sglang_sm120.bench import layer as L  # noqa: E402
from sglang_sm120.bench import model  # noqa: E402


HOST_PAUSE_S = 0.002  # host sleep around each traced replay
SPLIT_GAP_US = 500.0  # longer than any gap inside a layer graph, shorter than HOST_PAUSE_S


def kernels_of_one_replay(graph, flush, replays: int = 3) -> list[dict]:
    """The kernels of the last of ``replays`` graph replays (each after an L2 flush), from the profiler's trace."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        flush.zero_()
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            flush.zero_()
            torch.cuda.synchronize()
            time.sleep(HOST_PAUSE_S)  # a gap no layer has inside, so the replays split cleanly
            graph.replay()
            torch.cuda.synchronize()
            time.sleep(HOST_PAUSE_S)
    path = f"/tmp/trace-{os.getpid()}-{time.time_ns()}.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    os.remove(path)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    kernels.sort(key=lambda e: e["ts"])
    # the flush and each replay are separated by host pauses: the clusters split by gaps longer than SPLIT_GAP_US
    # are flush, replay, flush, replay, ...; the last cluster is the last replay
    clusters: list[list[dict]] = []
    end = None
    for e in kernels:
        if end is None or e["ts"] - end > SPLIT_GAP_US:
            clusters.append([])
        clusters[-1].append(e)
        end = max(end or 0.0, e["ts"] + e["dur"])
    last = clusters[-1] if clusters else []
    return [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"]), "stream": e["args"].get("stream")}
            for e in last]


def summarise(kernels: list[dict]) -> dict:
    if not kernels:
        return {"span_us": 0.0, "busy_us": 0.0, "kernels": []}
    t0 = kernels[0]["ts"]
    end = max(k["ts"] + k["dur"] for k in kernels)
    # busy = the union of kernel intervals (any stream); idle = span - busy
    busy, cur_s, cur_e = 0.0, None, None
    for k in kernels:
        s, e = k["ts"], k["ts"] + k["dur"]
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    rows = [{"name": k["name"][:90], "start_us": round(k["ts"] - t0, 2), "dur_us": round(k["dur"], 2),
             "stream": k["stream"]} for k in kernels]
    return {"span_us": round(end - t0, 2), "busy_us": round(busy, 2), "kernels": rows}


def layer_arguments(description: str, name: str, kinds, tps, smoke_help: str) -> argparse.ArgumentParser:
    """The arguments the layer tools share: where results go, which layers (kind, batch, T, context), --smoke."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    p.add_argument("--name", default=name)
    p.add_argument("--kind", nargs="+", default=list(kinds), choices=model.KINDS)
    p.add_argument("--batch", nargs="+", type=int, default=[1])
    p.add_argument("--tp", nargs="+", type=int, default=list(tps))
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--smoke", action="store_true", help=smoke_help)
    return p


def reduced_layers(kinds):
    """(kind, plugin stages' inputs) of one reduced-size layer per kind on the CPU, B=1: what --smoke builds."""
    dims = model.Dims.reduced()
    for kind in kinds:
        state_w = L.LayerState(model.build_weights(dims.rank(1), "cpu"), None)
        caches = model.build_caches(kind, dims, 1, 256, "cpu")
        yield kind, state_w, caches, torch.zeros(1, dims.hidden, dtype=torch.bfloat16)


def main() -> int:
    p = layer_arguments(__doc__, "bench-trace-h200", ("swa", "c4", "c128"), (1,),
                        "CPU: build the stages only (nothing is traced)")
    p.add_argument("--paths", nargs="+", default=[L.PLUGIN], choices=L.PATHS)
    p.add_argument("--streams", nargs="+", default=["sglang", "one"], choices=("sglang", "one"))
    args = p.parse_args()

    if args.smoke:
        for kind, state_w, caches, x in reduced_layers(args.kind):
            stages = L.build_stages(L.PLUGIN, kind, state_w, caches, x, {})
            print(kind, [(s.name, s.stream) for s in stages])
        print("smoke ok (nothing traced)")
        return 0

    from sglang_sm120.bench import upstream_ops
    from sglang_sm120.kernels.harness.devicebench import capture_graph, environment, l2_flush_buffer

    os.makedirs(args.out, exist_ok=True)
    ups = upstream_ops.load("files", os.path.join(os.path.dirname(HERE), ".upstream")) \
        if L.UPSTREAM in args.paths else None
    side = {name: torch.cuda.Stream() for name in L.SIDE_STREAMS}
    flush = l2_flush_buffer()
    results = {"env": environment(), "context": args.context, "layers": []}
    lines = [f"# Kernel timeline of bench layers ({results['env'].get('gpu')}, {results['env']['date']})", "",
             "One CUDA-graph replay of one layer (one call captured; the replay traced follows an L2 flush; "
             "offsets from the first kernel of the replay), from the CUDA profiler. busy = the union "
             "of kernel intervals over all streams; the rest of the span is idle (launch gaps, waits).", ""]
    dims = model.Dims.full()
    for tp in args.tp:
        state_w = L.LayerState(model.build_weights(dims.rank(tp), "cuda"), ups)
        for kind in args.kind:
            for b in args.batch:
                caches = model.build_caches(kind, dims, b, args.context, "cuda", seed=1)
                x = torch.randn(b, dims.hidden, device="cuda").to(torch.bfloat16)
                for path in args.paths:
                    st: dict = {}
                    stages = L.build_stages(path, kind, state_w, caches, x, st)
                    for stage in stages:
                        stage.fn()
                    for streams in args.streams:
                        use = side if streams == "sglang" else None
                        graph = capture_graph(lambda: L.run_layer(stages, use), warmup=1)
                        summary = summarise(kernels_of_one_replay(graph, flush))
                        del graph
                        entry = {"kind": kind, "T": tp, "B": b, "path": path, "streams": streams, **summary}
                        results["layers"].append(entry)
                        lines += [f"## {kind} T={tp} B={b} {path}, {streams} stream(s): span {summary['span_us']} "
                                  f"µs, busy {summary['busy_us']} µs", "",
                                  "| start µs | µs | stream | kernel |", "|---|---|---|---|"]
                        lines += [f"| {k['start_us']} | {k['dur_us']} | {k['stream']} | `{k['name']}` |"
                                  for k in summary["kernels"]]
                        lines.append("")
                        print(kind, tp, b, path, streams, summary["span_us"], summary["busy_us"],
                              len(summary["kernels"]), flush=True)
                del caches
        state_w = None
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
