#!/usr/bin/env python3
"""The launch choices an sm_12x GPU makes, run at full DSv4-Flash sizes on the device and checked.

No sm_120 GPU exists here. The AOT check shows that the sm_120a / sm_121a code compiles (opcodes, shared memory,
spills); the device runs the kernels at full sizes, but with the device's own choices: split counts, grids and
tiles picked for its SM count (the H200's 132), and the plain fp8 dot in the indexer. The choices an RTX PRO 6000
(188 SMs) or RTX 5090 (170) makes, and the indexer's block-scaled fp8 dot that sm_12x takes, would otherwise run
at full sizes nowhere. This tool makes every kernel module decide as on an sm_12x GPU (:func:`sm12x_dispatch`) and
runs the plugin path of ``sglang-sm120 bench`` with every stage checked against its float32 reference.

What it cannot show: sm_120's own instructions. On sm_90 Triton lowers the block-scaled dot to upcasts and a bf16
MMA, so the indexer check covers its indexing, scales and masking, not sm_120's QMMA.SF; the occupancy and timing of
sm_120 are not modelled. The bench times every stage as it goes: those are the device's times of sm_12x choices, for
neither GPU, so the summary lists the checks only (the JSON keeps what the bench recorded).

    python3 tools/device_sm120_dispatch.py --out $OUT [--sms 188 --sms 170] [-b 1 -b 64] [--tp 1] [--context 8192]
    python3 tools/device_sm120_dispatch.py --smoke            # CPU: reduced sizes under the interpreter
"""

from __future__ import annotations

import argparse
import contextlib
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

# (module, attribute, what it answers): every place a kernel module asks what GPU it is on. Each is looked up by
# its module-level name at call time (nothing imports them by name), so replacing the attribute reaches every caller.
DISPATCH_QUERIES = (
    ("bf16_gemv", "sm_count", "SM count (tiles, K splits, shared-SM rule)"),
    ("fp8_gemv", "sm_count", "SM count (launch forms, K splits, waves)"),
    ("moe_mxfp4", "_sm_count", "SM count (K splits, persistent grids)"),
    ("sparse_mla_decode", "_program_target", "programs to fill the GPU (KV splits)"),
    ("sparse_mla_decode", "large_batch_form_measured", "the 64-head large-batch form (False on sm_12x)"),
    ("moe_prefill", "register_caps_measured", "the prefill tiles' register caps (False on sm_12x)"),
    ("moe_mxfp4", "pairs_register_caps_measured", "the TMA pairs tiles' register caps (False on sm_12x)"),
    ("indexer", "use_scaled_dot", "block-scaled fp8 dot (True on sm_12x)"),
)


def sm12x_answers(sms: int) -> dict:
    """What each query of :data:`DISPATCH_QUERIES` answers on an sm_12x GPU of ``sms`` SMs."""
    return {
        ("bf16_gemv", "sm_count"): lambda device=None: sms,
        ("fp8_gemv", "sm_count"): lambda device_index=None: sms,
        ("moe_mxfp4", "_sm_count"): lambda device: sms,
        ("sparse_mla_decode", "_program_target"): lambda device: sms,
        ("sparse_mla_decode", "large_batch_form_measured"): lambda device=None: False,
        ("moe_prefill", "register_caps_measured"): lambda device=None: False,
        ("moe_mxfp4", "pairs_register_caps_measured"): lambda device=None: False,
        ("indexer", "use_scaled_dot"): lambda device=None: True,
    }


@contextlib.contextmanager
def sm12x_dispatch(sms: int):
    """Inside: every kernel module chooses its launches as on an sm_12x GPU with ``sms`` SMs; restored on exit."""
    import importlib

    if sms < 1:
        raise ValueError(f"sms must be a positive SM count, got {sms}")
    answers = sm12x_answers(sms)
    saved = []
    try:
        for module_name, attr, _ in DISPATCH_QUERIES:
            module = importlib.import_module(f"sglang_sm120.kernels.{module_name}")
            saved.append((module, attr, getattr(module, attr)))  # AttributeError: the query was renamed
            setattr(module, attr, answers[(module_name, attr)])
        yield
    finally:
        for module, attr, original in reversed(saved):
            setattr(module, attr, original)


def check_rows(results: dict) -> list[dict]:
    """One row per (kind, T, context, B, stage) the bench checked: its error (or top-k overlap), tolerance, ok."""
    rows = []
    for point in results["layers"]:
        for stage, check in point.get("checks", {}).items():
            rows.append(dict(kind=point["kind"], T=point["T"], context=point["context"], B=point["B"],
                             path=point["path"], stage=stage, ok=bool(check["ok"]),
                             value=check.get("rel_err", check.get("overlap")),
                             measure="rel_err" if "rel_err" in check else "top-k overlap", tol=check["tol"]))
    return rows


def summary_markdown(runs: list[dict], env: dict, argv: list[str]) -> str:
    """The checks of each SM count's run as a table per stage (worst value over the grid), failures listed."""
    lines = ["# sm_12x launch choices at full DSv4-Flash sizes, checked on the device", "",
             f"{env.get('gpu', '?')} (cc {env.get('capability', '?')}), torch {env.get('torch', '?')}, triton "
             f"{env.get('triton', '?')}, CUDA {env.get('cuda', '?')}, {env.get('date', '?')}.", "",
             "Every kernel module chose its launches as on an sm_12x GPU of the SM count named (`tools/"
             "device_sm120_dispatch.py`: split counts, grids, tiles and the indexer's block-scaled fp8 dot, which "
             "sm_90 lowers to upcasts and a bf16 MMA). Only correctness is reported: the bench's times of these "
             "choices on this GPU stand for no sm_12x GPU and are not summarised.", "",
             f"Command: `{' '.join(argv)}`", ""]
    for run in runs:
        if run["results"] is None:
            lines += [f"## {run['sms']} SMs ({run['gpu_name']}): no grid point finished", ""]
            continue
        rows = check_rows(run["results"])
        failed = [r for r in rows if not r["ok"]]
        grid = run["results"]["grid"]
        lines += [f"## {run['sms']} SMs ({run['gpu_name']}): {len(rows) - len(failed)}/{len(rows)} checks pass, "
                  f"{run['seconds']:.0f} s", "",
                  f"Grid: B {grid['B']}, T {grid['T']}, context {grid['context']}, kinds {grid['kinds']}; errors: "
                  f"{run['results'].get('errors') or 'none'}; skipped: {run['results'].get('skipped') or 'none'}.",
                  "", "| stage | measure | points | worst | tolerance | failed |", "|---|---|---|---|---|---|"]
        by_stage: dict = {}
        for r in rows:
            by_stage.setdefault((r["stage"], r["measure"]), []).append(r)
        for (stage, measure), group in by_stage.items():
            values = [r["value"] for r in group]
            worst = min(values) if measure == "top-k overlap" else max(values)
            lines.append(f"| {stage} | {measure} | {len(group)} | {worst:.4g} | {group[0]['tol']} | "
                         f"{sum(not r['ok'] for r in group)} |")
        if failed:
            lines += ["", "Failed:", ""] + [f"- {r['kind']} T={r['T']} ctx={r['context']} B={r['B']} {r['stage']}: "
                                            f"{r['measure']} {r['value']:.4g} (tolerance {r['tol']})" for r in failed]
        lines.append("")
    return "\n".join(lines)


def gpu_name_for(sms: int) -> str:
    from sglang_sm120.kernels.dsv4 import SM12X_SM_COUNTS

    names = [name for name, count in SM12X_SM_COUNTS.items() if count == sms]
    return " / ".join(names) if names else "no listed sm_12x GPU"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "sm120-dispatch-results"))
    parser.add_argument("--name", default=None, help="file stem (default: sm120_dispatch-h200, or -cpu with --smoke)")
    parser.add_argument("--sms", type=int, action="append", help="sm_12x SM counts (default: every listed GPU's)")
    parser.add_argument("--batch", "-b", type=int, action="append")
    parser.add_argument("--tp", type=int, action="append")
    parser.add_argument("--context", type=int, action="append")
    parser.add_argument("--time-budget-s", type=float, default=None,
                        help="per SM count: start no grid point after this many seconds (the rest listed as skipped)")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter at the bench's reduced sizes")
    args = parser.parse_args(argv)

    from sglang_sm120.bench import layer as L
    from sglang_sm120.bench import runner
    from sglang_sm120.kernels.dsv4 import SM12X_SM_COUNTS
    from sglang_sm120.kernels.harness.devicebench import environment

    runner.interpreter_ready()
    if args.smoke:
        cfg = runner.default_cpu_config()
        cfg.batches, cfg.tps = (1,), (1,)
    else:
        import torch

        if not torch.cuda.is_available():
            print("device_sm120_dispatch: no CUDA device (use --smoke on the CPU)", file=sys.stderr)
            return 2
        cfg = runner.BenchConfig(device="cuda", batches=(1, 8, 64), tps=(1, 4), contexts=(8192, 65536))
    cfg.paths, cfg.check, cfg.replays = (L.PLUGIN,), "all", 1
    cfg.batches = tuple(args.batch) if args.batch else cfg.batches
    cfg.tps = tuple(args.tp) if args.tp else cfg.tps
    cfg.contexts = tuple(args.context) if args.context else cfg.contexts
    cfg.time_budget_s = args.time_budget_s
    sm_counts = args.sms or sorted(set(SM12X_SM_COUNTS.values()), reverse=True)

    args.name = args.name or ("sm120_dispatch-cpu" if args.smoke else "sm120_dispatch-h200")
    os.makedirs(args.out, exist_ok=True)
    command = ["python3", "tools/device_sm120_dispatch.py", *argv]

    def write(runs) -> str:  # after every grid point: a run cut short by its time limit still leaves its checks
        with open(os.path.join(args.out, args.name + ".json"), "w") as f:
            json.dump(dict(tool="tools/device_sm120_dispatch.py", argv=argv, runs=runs), f, indent=1, default=str)
        text = summary_markdown(runs, environment(), command)
        with open(os.path.join(args.out, args.name + ".md"), "w") as f:
            f.write(text)
        return text

    runs = []
    for sms in sm_counts:
        run = dict(sms=sms, gpu_name=gpu_name_for(sms), seconds=0.0, results=None)
        runs.append(run)
        start = time.time()

        def on_point(results, run=run, start=start):
            run.update(results=results, seconds=time.time() - start)
            write(runs)
        with sm12x_dispatch(sms):
            run["results"] = runner.run(cfg, on_point=on_point)
        run["seconds"] = time.time() - start
    print(write(runs))
    finished = [run["results"] for run in runs if run["results"] is not None]
    failed = sum(not r["ok"] for results in finished for r in check_rows(results))
    errors = sum(len(results.get("errors") or []) for results in finished)
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
