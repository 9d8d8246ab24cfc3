#!/usr/bin/env python3
"""Where the H200's timings stand for different code than sm_120 runs (AOT, no GPU).

Every timing here comes from an H200 (sm_90a). For most kernels Triton emits the same tensor-core instructions
there as on sm_120a (mma.sync: HMMA / QMMA), so an H200 timing measures the sm_120 instruction stream on another
memory system. Where Triton takes sm_90's warpgroup MMA instead (HGMMA / QGMMA), the H200 timed code that sm_120
never runs. This tool compiles AOT configs for both arches and lists, per config: the tensor-core opcode families
of each, and the K loop (the innermost loop holding an MMA: one tile of one warp) as instructions, MMAs and
register moves, with the sm_120a / sm_90a instruction ratio.

    .venv/bin/python tools/sm90_vs_sm120_mma.py [--only sparse_mla_decode] [--module sparse_mla_decode ...]
        [--json out.json]

Stop 40 (Triton 3.8): in sparse_mla_decode every form but the 64-head large-batch one compiles to the same HMMA
loop on both (e.g. h64: 995 / 1022 instructions a tile); the 64-head form is HGMMA on sm_90a (963) and HMMA with
733 register moves on sm_120a (1943), which is why sm_12x no longer takes it (sparse_mla_decode.large_batch_form_measured).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from moe_mxfp4_sass_loop import mma_loop, sass_lines  # noqa: E402

WARPGROUP_MMA = ("HGMMA", "QGMMA", "IGMMA")
THREAD_MMA = ("HMMA", "QMMA", "IMMA", "OMMA")


def mma_families(rows) -> list[str]:
    """The tensor-core opcode families (HGMMA, HMMA, QMMA, ...) in a kernel's SASS rows, sorted."""
    return sorted({op.split(".")[0] for _, op, _ in rows if op.split(".")[0] in WARPGROUP_MMA + THREAD_MMA})


def loop_facts(rows) -> dict:
    """Instructions, MMAs and MOVs of the K loop (:func:`mma_loop`), zeros where the kernel has no MMA loop."""
    body = mma_loop(rows, WARPGROUP_MMA + THREAD_MMA)
    ops = collections.Counter(op.split(".")[0] for _, op, _ in body)
    return {"loop_instructions": len(body), "loop_mma": sum(ops[k] for k in WARPGROUP_MMA + THREAD_MMA),
            "loop_mov": ops.get("MOV", 0)}


def compare(configs, archs=(90, 120)) -> list[dict]:
    """One record per config with an MMA: per arch its families and loop facts, and the loop ratio last / first."""
    out = []
    for cfg in configs:
        per_arch = {}
        for arch in archs:
            rows, _compiled = sass_lines(cfg, arch)
            per_arch[arch] = {"families": mma_families(rows), **loop_facts(rows)}
        if not any(v["families"] for v in per_arch.values()):
            continue
        first, last = per_arch[archs[0]], per_arch[archs[-1]]
        ratio = (last["loop_instructions"] / first["loop_instructions"]) if first["loop_instructions"] else None
        out.append({"config": cfg.name, **{f"sm{a}": v for a, v in per_arch.items()},
                    "different_mma": set(first["families"]) != set(last["families"]),
                    "loop_ratio": round(ratio, 2) if ratio else None})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--module", action="append", help="kernel modules (default: every module of the registry)")
    parser.add_argument("--only", action="append", help="configs whose name contains this")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from sglang_sm120.kernels.aot_registry import KERNEL_MODULES

    records = []
    for name in args.module or KERNEL_MODULES:
        module = importlib.import_module(f"sglang_sm120.kernels.{name}")
        configs = [c for c in module.aot_configs() if not args.only or any(s in c.name for s in args.only)]
        for rec in compare(configs):
            records.append(rec)
            a, b = rec["sm90"], rec["sm120"]
            flag = "DIFFERENT MMA" if rec["different_mma"] else ""
            print(f"{rec['config'][:64]:64s} sm_90a {'/'.join(a['families']):13s} {a['loop_instructions']:5d} "
                  f"({a['loop_mma']} mma, {a['loop_mov']} mov)  sm_120a {'/'.join(b['families']):13s} "
                  f"{b['loop_instructions']:5d} ({b['loop_mma']} mma, {b['loop_mov']} mov)  x{rec['loop_ratio']} {flag}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
