"""Turn the bench's results into the 43-layer step table, the sm_120 projection, markdown, JSON and a plot."""

from __future__ import annotations

import json
import os

from ..kernels import dsv4
from . import layer as L
from . import projection as P

TITLE = "DeepSeek-V4-Flash decode step: sglang-sm120 plugin vs the upstream SGLang 0.5.23 path"
TARGET_BW_RATIO = 1.5  # issue 8: each layer kind at B=1 within 1.5x of its bytes over the copy bandwidth
TARGET_SPEEDUP = 5.0  # issue 8: plugin >= 5x upstream per step at B=1 and B=64


def _layer(results, kind, tp, ctx, b, path):
    for row in results["layers"]:
        if (row["kind"], row["T"], row["context"], row["B"], row["path"]) == (kind, tp, ctx, b, path):
            return row
    return None


def _lm_head(results, tp, b):
    for row in results["lm_head"]:
        if (row["T"], row["B"]) == (tp, b):
            return row
    return None


def step_rows(results) -> list[dict]:
    """The full step per (T, context, B): sum over kinds of count x measured layer time, plus the
    lm_head ([vocab/T, hidden] bf16, the same code in both paths); only where every kind was run."""
    rows = []
    grid = results["grid"]
    counts = results["layer_counts"]
    for tp in grid["T"]:
        for ctx in grid["context"]:
            for b in grid["B"]:
                head = _lm_head(results, tp, b)
                row = {"T": tp, "context": ctx, "B": b, "lm_head_us": head and head["us"],
                       "lm_head_bytes": head and head["bytes"]}
                complete = head is not None
                for path in results["paths"]:
                    layers = [_layer(results, kind, tp, ctx, b, path) for kind in counts]
                    if head is None or any(x is None or (results["timed"] and x["layer_us"] is None)
                                           for x in layers) or (results["timed"] and head["us"] is None):
                        complete = False
                        continue
                    nbytes = sum(counts[x["kind"]] * x["layer_bytes"] for x in layers) + head["bytes"]
                    row[f"{path}_bytes"] = nbytes
                    if results["timed"]:
                        us = _step_us(layers, counts, head, "layer_us")
                        row[f"{path}_step_us"] = us
                        if all(x.get("layer_us_one_stream") for x in layers):
                            row[f"{path}_step_us_one_stream"] = _step_us(layers, counts, head, "layer_us_one_stream")
                        row[f"{path}_pct_copy_bw"] = 100 * nbytes / (us * 1e-6) / (results["copy_bandwidth_gbs"] * 1e9)
                        row[f"{path}_tokens_per_s_per_seq"] = 1e6 / us
                if not complete:
                    continue
                if results["timed"] and f"{L.UPSTREAM}_step_us" in row and f"{L.PLUGIN}_step_us" in row:
                    row["speedup"] = row[f"{L.UPSTREAM}_step_us"] / row[f"{L.PLUGIN}_step_us"]
                one = [row.get(f"{path}_step_us_one_stream") for path in (L.UPSTREAM, L.PLUGIN)]
                if all(one):
                    row["speedup_one_stream"] = one[0] / one[1]
                rows.append(row)
    return rows


def _step_us(layers, counts, head, key: str) -> float:
    """Sum over the layer kinds of count x the layer's ``key`` time, plus the lm_head's."""
    return sum(counts[x["kind"]] * x[key] for x in layers) + head["us"]


def projection_rows(results, allreduce_us: float | None) -> list[dict]:
    """The plugin path's step projected to each sm_120 GPU by ``projection.project_step_us``."""
    if not results["timed"]:
        return []
    out = []
    counts = results["layer_counts"]
    copy_gbs = results["copy_bandwidth_gbs"]
    for step in step_rows(results):
        tp, ctx, b = step["T"], step["context"], step["B"]
        layers = [_layer(results, kind, tp, ctx, b, L.PLUGIN) for kind in counts]
        measured = [P.LayerMeasurement(x["kind"], counts[x["kind"]], x["layer_bytes"], x["layer_us"], copy_gbs)
                    for x in layers]
        measured.append(P.LayerMeasurement("lm_head", 1, step["lm_head_bytes"], step["lm_head_us"], copy_gbs))
        weights_gib = None
        if results["full_size"]:
            from .model import Dims, weight_bytes_per_rank

            weights_gib = weight_bytes_per_rank(Dims.full(), tp) / 2**30
        for gpu, spec in P.SM120_GPUS.items():
            p = P.project_step_us(measured, spec["bandwidth_gbs"], tp, allreduce_us)
            fits = None if weights_gib is None else weights_gib < spec["memory_gib"]
            out.append({"gpu": gpu, "T": tp, "context": ctx, "B": b, **p, "weights_per_rank_gib": weights_gib,
                        "weights_fit": fits})
    return out


def target_checks(results, steps) -> list[dict]:
    """The issue's H200 targets, each marked met or not (B=1 bandwidth ratio; 5x at B=1 and B=64)."""
    if not results["timed"]:
        return []
    out = []
    copy = results["copy_bandwidth_gbs"] * 1e9
    for row in results["layers"]:
        if row["path"] == L.PLUGIN and row["B"] == 1 and row["layer_us"]:
            floor_us = row["layer_bytes"] / copy * 1e6
            ratio = row["layer_us"] / floor_us
            out.append({"target": f"{row['kind']} layer at B=1 within {TARGET_BW_RATIO}x of bytes/copy BW",
                        "T": row["T"], "context": row["context"], "value": round(ratio, 2),
                        "met": ratio <= TARGET_BW_RATIO})
    for step in steps:
        if step["B"] in (1, 64) and "speedup" in step:
            out.append({"target": f"plugin >= {TARGET_SPEEDUP:g}x upstream per step at B={step['B']}", "T": step["T"],
                        "context": step["context"], "value": round(step["speedup"], 2),
                        "met": step["speedup"] >= TARGET_SPEEDUP})
    return out


def _f(x, nd=1):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


# Why the shared stand-ins are PDL kernels (the sources are SGLang 0.5.23's and its FlashInfer's)
PDL_NOTE = ("The shared Triton stand-ins (norms, router top-k, shared-expert SwiGLU, combine) launch with programmatic "
            "dependent launch (`griddepcontrol.wait` before reading the previous kernel's output, "
            "`launch_dependents` after their stores) on GPUs that have it (cc >= 9.0, sm_120 included), as SGLang's "
            "own kernels for those stages do: sgl_kernel's rmsnorm / fused_add_rmsnorm call FlashInfer's norm with "
            "`enable_pdl=is_arch_support_pdl()` (sgl_kernel/elementwise.py, utils.py; the wait and trigger are in "
            "flashinfer/include/flashinfer/norm.cuh), and SGLang's JIT silu_and_mul_clamp takes the same flag "
            "(sglang/kernels/ops/activation/silu_and_mul_clamp.py). The replaced components run as each path "
            "launches them: the plugin's FP8 GEMVs with PDL where their defaults say so, upstream's kernels as "
            "SGLang 0.5.23 launches them.")
STREAMS_NOTE = ("Layer and step times run each layer on the streams SGLang 0.5.23's CUDA-graph decode forks on CUDA "
                "GPUs (sm_120 included; `SGLANG_OPT_USE_MULTI_STREAM_OVERLAP`, on by default): the attention "
                "compressor and the C4 indexer (its compressor, weights_proj, query, logits and top-k, on their "
                "own streams) beside wqkv_a / wq_b up to 128 rows (DeepseekV4Attention._forward_prepare_multi_stream, "
                "srt/models/deepseek_v4.py:1891-1953; indexer.py:530-574), and the shared expert beside the router "
                "and the routed experts (DeepseekV2MoE.forward_normal_dual_stream, srt/models/deepseek_v2.py:"
                "1128-1260). Both paths run the same schedule (sglang_sm120/bench/layer.py); the layer tables also "
                "give each layer with every stage on one stream ('one-stream µs').")
STREAMS_ONE_NOTE = ("Layer and step times in this run put every stage of a layer on one stream (`--layer-streams one`); "
                    "SGLang's CUDA-graph decode overlaps the compressor, the indexer and the shared expert on side "
                    "streams.")
PDL_OFF_NOTE = ("The shared Triton stand-ins were launched WITHOUT programmatic dependent launch in this run "
                "(`--common-pdl off`); SGLang launches its own kernels for those stages with it on sm_90+.")


def markdown(results, steps, projections, targets, allreduce_us) -> str:
    env = results["env"]
    timed = results["timed"]
    lines = [f"# {TITLE}", ""]
    lines.append(f"{env.get('gpu')} (cc {env.get('capability', '-')}), torch {env['torch']}, triton {env['triton']}, "
                 f"CUDA {env.get('cuda')}, {env['date']}. Mode: {results['mode']}; "
                 f"{'full DSv4-Flash sizes' if results['full_size'] else 'reduced sizes'}.")
    lines.append("")
    if not timed:
        lines += ["**Nothing was timed.** No GPU: the layers ran at reduced sizes under the Triton CPU interpreter "
                  "and both paths were checked against the float32 references (table below).", ""]
    else:
        lines += [f"Copy bandwidth measured in this run (device-to-device, read + write counted): "
                  f"**{results['copy_bandwidth_gbs']:.0f} GB/s**. All times are medians of CUDA-graph replays "
                  f"after an L2 flush; a layer is one graph of all its stages, on SGLang's decode streams unless "
                  f"said otherwise below (the layer µs and step figures), a "
                  f"stage its own one-call graph (the per-component µs, which therefore each carry one graph launch "
                  f"and sum to more than the layer). 'common' is the code both paths share (fused Triton norms, "
                  f"router, SwiGLU of the shared expert, combine and the indexer's query quantisation; the router gate on the "
                  f"bf16 GEMV up to 8 rows, for SGLang's JIT tiny_gemm_bf16, cuBLAS above). Bytes: what each "
                  f"piece must read in the checkpoint formats (FP8 + block scales, MXFP4 + E8M0, KV rows touched), the same figure for "
                  f"both paths; upstream actually reads more (bf16 wo_a and experts).", ""]
    lines += ["## What each path runs", "", "| component | plugin | upstream |", "|---|---|---|"]
    names = {path: {**{c: L.COMPONENT_NAMES[c][path] for c in L.COMPONENTS}, **results.get("paths", {}).get(path, {})}
             for path in L.PATHS}
    for comp in L.COMPONENTS:
        lines.append(f"| {comp} | {names[L.PLUGIN][comp]} | {names[L.UPSTREAM][comp]} |")
    if results.get("common_pdl") is not None:  # results of runs before the flag do not say
        lines += ["", PDL_NOTE if results["common_pdl"] else PDL_OFF_NOTE]
    if results.get("layer_streams") is not None:  # nor of runs before the streams
        lines += ["", STREAMS_NOTE if results["layer_streams"] == "sglang" else STREAMS_ONE_NOTE]
    lines += ["", f"Upstream code source: {results['upstream_source']}. Not modelled in either path: mHC boundaries, "
              "RoPE, KV/compressor cache writes, the TP all-reduce (see the projection for the latter).", ""]
    if timed and steps:
        counts = results["layer_counts"]
        lines += [f"## Decode step: {counts['swa']} SWA + {counts['c4']} C4 + {counts['c128']} C128 layers + "
                  f"lm_head [{dsv4.VOCAB_SIZE}/T, {dsv4.HIDDEN_SIZE}] bf16, one rank of T", "",
                  "| T | context | B | plugin ms | upstream ms | speed-up | plugin GB read | plugin % copy BW "
                  "| plugin tok/s/seq | one stream: plugin ms | upstream ms | speed-up |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]

        def ms(x):
            return _f(x / 1e3, 2) if x else "-"
        for s in steps:
            lines.append(f"| {s['T']} | {s['context']} | {s['B']} | {ms(s.get('plugin_step_us'))} | "
                         f"{ms(s.get('upstream_step_us'))} | {_f(s.get('speedup'), 2)} | "
                         f"{_f(s.get('plugin_bytes', 0) / 1e9, 2)} | {_f(s.get('plugin_pct_copy_bw'))} | "
                         f"{_f(s.get('plugin_tokens_per_s_per_seq'))} | {ms(s.get('plugin_step_us_one_stream'))} | "
                         f"{ms(s.get('upstream_step_us_one_stream'))} | {_f(s.get('speedup_one_stream'), 2)} |")
        lines.append("")
    comps = list(L.COMPONENTS)
    for kind in results["grid"]["kinds"]:
        rows = [r for r in results["layers"] if r["kind"] == kind]
        if not rows:
            continue
        lines += [f"## {kind.upper()} layer", ""]
        if timed:
            head = ["T", "context", "B", "path"] + [f"{c} µs" for c in comps] + ["layer µs", "one-stream µs", "MB read",
                                                                                 "% copy BW", "speed-up"]
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for r in rows:
                cu = r["components_us"] or {}
                cells = [r["T"], r["context"], r["B"], r["path"]] + [_f(cu.get(c)) for c in comps] + [
                    _f(r["layer_us"]), _f(r.get("layer_us_one_stream")), _f(r["layer_bytes"] / 1e6),
                    _f(r["pct_copy_bw"]), _f(r.get("speedup"), 2)]
                lines.append("| " + " | ".join(str(c) for c in cells) + " |")
            lines.append("")
        checked = [r for r in rows if r["checks"]]
        if checked:
            names = [s["name"] for s in checked[0]["stages"] if any(s["name"] in r["checks"] for r in checked)]
            lines += [f"Checks against the float32 reference ({kind}): relative error (indexer: fraction of the "
                      "exact top-k selected); ✗ = over tolerance", "",
                      "| T | context | B | path | " + " | ".join(names) + " |", "|" + "---|" * (4 + len(names))]
            for r in checked:
                cells = []
                for n in names:
                    c = r["checks"].get(n)
                    if c is None:
                        cells.append("-")
                    else:
                        v = c.get("rel_err", c.get("overlap"))
                        cells.append(f"{v:.2e}" + ("" if c["ok"] else " ✗"))
                lines.append(f"| {r['T']} | {r['context']} | {r['B']} | {r['path']} | " + " | ".join(cells) + " |")
            lines.append("")
    if targets:
        lines += ["## Issue targets on this GPU", "", "| target | T | context | value | met |", "|---|---|---|---|---|"]
        for t in targets:
            lines.append(f"| {t['target']} | {t['T']} | {t['context']} | {t['value']} | {'yes' if t['met'] else 'NO'} |")
        lines.append("")
    if projections:
        lines += ["## Projection to sm_120 GPUs — a MODEL, not a measurement", "",
                  "    t_step = sum_kinds count * bytes_per_rank / (BW_gpu * efficiency)"
                  "  +  lm_head term  +  [T>1] n_layers * 2 * t_allreduce",
                  "",
                  "efficiency = the plugin layer's bytes / time / copy bandwidth, measured above on "
                  f"{env.get('gpu')}; BW_gpu = specified bandwidth "
                  + ", ".join(f"{g} {v['bandwidth_gbs']:.0f} GB/s" for g, v in P.SM120_GPUS.items())
                  + " (projection.py cites the source). Assumes the sm_120 kernels reach the same fraction of their "
                  "GPU's bandwidth and that copy bandwidth equals the specification. "
                  + (f"All-reduce: {allreduce_us} µs each, from --allreduce-us." if allreduce_us is not None else
                     "**The all-reduce term is excluded for T > 1** (no measured value given: pass --allreduce-us)."),
                  "", "The last column compares the checkpoint-format weights one rank holds (43 layers, embedding, "
                  "lm_head; no KV cache) with the card's memory: a configuration whose weights do not fit cannot run.",
                  "", "| GPU | T | context | B | projected step ms | tok/s/seq | all-reduce included "
                  "| weights/rank GiB (fit) |", "|---|---|---|---|---|---|---|---|"]
        for p in projections:
            fit = "-" if p["weights_fit"] is None else (
                f"{p['weights_per_rank_gib']:.0f} ({'fits' if p['weights_fit'] else 'DOES NOT FIT'})")
            lines.append(f"| {p['gpu']} | {p['T']} | {p['context']} | {p['B']} | {p['step_us'] / 1e3:.2f} | "
                         f"{p['tokens_per_s_per_sequence']:.1f} | {'yes' if p['allreduce_included'] else 'NO'} "
                         f"| {fit} |")
        lines.append("")
    failed = results["checks_failed"]
    lines += ["## Summary", "",
              f"- checks: {'all passed' if not failed else f'{len(failed)} FAILED'} "
              f"({sum(len(r['checks']) for r in results['layers'])} stage checks)"]
    if not timed:
        lines.append("- nothing was timed (no GPU)")
    for err in results.get("errors", []):
        lines.append(f"- ERROR at {err['kind']} T={err['T']} context={err['context']} B={err['B']}: {err['error']}")
    for row in results["layers"]:
        for st in row["stages"]:
            if "error" in st:
                lines.append(f"- timing error, {row['kind']} T={row['T']} ctx={row['context']} B={row['B']} "
                             f"{row['path']} {st['name']}: {st['error']}")
    for note in results["notes"]:
        lines.append(f"- {note}")
    lines.append(f"- elapsed: {results.get('elapsed_s')} s")
    return "\n".join(lines) + "\n"


def plot(results, path: str) -> str | None:
    """Layer time against B for both paths, one panel per layer kind; None (and why) if it cannot."""
    if not results["timed"]:
        return "nothing was timed, so there is nothing to plot"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: plot skipped (pip install matplotlib)"
    kinds = results["grid"]["kinds"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4), squeeze=False)
    styles = {L.PLUGIN: "-", L.UPSTREAM: "--"}
    for ax, kind in zip(axes[0], kinds):
        for which in results["paths"]:
            for tp in results["grid"]["T"]:
                for ctx in results["grid"]["context"]:
                    pts = sorted((r["B"], r["layer_us"]) for r in results["layers"]
                                 if (r["kind"], r["path"], r["T"], r["context"]) == (kind, which, tp, ctx)
                                 and r["layer_us"])
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[which], marker="o",
                                label=f"{which} T={tp} ctx={ctx // 1024}K")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch B")
        ax.set_ylabel("layer time (µs)")
        ax.set_title(f"{kind.upper()} layer")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"DSv4-Flash decode layer, plugin vs upstream path — {results['env'].get('gpu')}, "
                 f"{results['env']['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def finalize(results, allreduce_us: float | None) -> dict:
    steps = step_rows(results)
    projections = projection_rows(results, allreduce_us)
    targets = target_checks(results, steps)
    results.update(steps=steps, projection=projections, targets=targets, allreduce_us=allreduce_us,
                   projection_model={"formula": P.__doc__.strip(), "gpus": P.SM120_GPUS,
                                     "allreduces_per_layer": P.ALLREDUCES_PER_LAYER,
                                     "allreduce_us": allreduce_us,
                                     "allreduce": "from --allreduce-us" if allreduce_us is not None
                                     else "excluded for T > 1 (no measured value given)"})
    return results


def write(results, out_dir: str, name: str, allreduce_us: float | None = None, with_plot: bool = True) -> dict:
    """Write ``<name>.json``, ``<name>.md`` and (GPU runs) ``<name>.png``; returns their paths.
    ``with_plot=False`` writes the partial results while the grid is still running."""
    finalize(results, allreduce_us)
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, f"{name}.json"), "md": os.path.join(out_dir, f"{name}.md")}
    png = os.path.join(out_dir, f"{name}.png")
    why = plot(results, png) if with_plot else "partial results: the plot is drawn at the end"
    if why is None:
        paths["png"] = png
    elif with_plot:
        results["notes"].append(f"plot: {why}")
    with open(paths["md"], "w") as f:
        f.write(markdown(results, results["steps"], results["projection"], results["targets"], allreduce_us))
    with open(paths["json"], "w") as f:
        json.dump(results, f, indent=1, default=str)
    return paths
