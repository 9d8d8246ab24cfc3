#!/usr/bin/env python3
"""Device run (stop 42): ptxas register caps on the MoE decode's TMA pairs tiles, full DSv4-Flash shapes.

    python3 tools/device_moe_pairs_caps.py --out $OUT [--name N] [--batches 16 64 256] [--t 1 4]   # device

Where the TMA pairs decode is the default (T = 1 / 4, B = 16..256: moe_mxfp4.PAIRS_TMA_ROWS_WHERE), its 2-warp
programs are held on sm_90a by registers to fewer per SM than their shared memory allows (Triton 3.8, sm_90a: the
8-row down tile 140 registers, 7 programs of 25672 B where shared memory holds 8; the T=4 gate/up tile with MMAs of
256 157 registers, 6 programs where 8 fit). Capped (down 128 -> 121 registers, gate/up 144), neither spills there.
This run times, per (T, B), the forward as the seam runs it and the same forward with the down tile capped, the
gate/up tile capped (where its tile is the 256-wide one) and both, in two interleaved rounds; every forward checked
against the float32 reference (``reference_moe_mxfp4``), timed like tools/device_moe_mxfp4.py's grid (CUDA graphs
of 12 calls over 3 layer copies, so each call reads other weights than the previous two). It also compiles the four
tiles for sm_90a with the device's Triton and lists their registers and spills (what the wave arithmetic needs).
On sm_120a the same tiles are held by shared memory (3 programs of 25.7 KB in 100 KB), so a cap adds nothing there.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import device_moe_mxfp4 as dm  # noqa: E402  (makes sglang_sm120.kernels importable)
import torch  # noqa: E402

from sglang_sm120.kernels import moe_mxfp4 as moe  # noqa: E402
from sglang_sm120.kernels.dsv4 import HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, NUM_EXPERTS, SWIGLU_LIMIT, TOP_K  # noqa: E402

DOWN_CAP = 128  # the 8-row down tile: 140 -> 121 registers on sm_90a (Triton 3.8), no spills
GATE_UP_256_CAP = 144  # the gate/up tile with MMAs of 256 (T=4): 157 -> 144, no spills (136 spills 8 B)
COPIES = 3
ROUNDS = 2


def variants(tiles):
    """(label, tiles) of the run at one shape: the shipped tiles, then each cap that applies, then both."""
    gu, dn = tiles
    out = [("shipped", tiles), (f"down r{DOWN_CAP}", (gu, dataclasses.replace(dn, max_registers=DOWN_CAP)))]
    if gu.sub_k == 256:
        capped_gu = dataclasses.replace(gu, max_registers=GATE_UP_256_CAP)
        out.append((f"gate/up r{GATE_UP_256_CAP}", (capped_gu, dn)))
        out.append(("both", (capped_gu, dataclasses.replace(dn, max_registers=DOWN_CAP))))
    return out


def register_report(result) -> None:
    """Registers / spills / shared memory of the shipped and capped tiles on sm_90a, with this machine's Triton."""
    try:
        from sglang_sm120.kernels import aot_registry
        from sglang_sm120.kernels.harness import aot

        by_label = {}
        for cfg in aot_registry.all_configs(("moe_mxfp4",)):
            if "pairs_n" in cfg.name and "tma2m8" in cfg.name and not cfg.max_registers:  # each uncapped tile, then capped
                by_label[cfg.name] = cfg
        for name, cfg in sorted(by_label.items()):
            caps = [0, DOWN_CAP] if "down" in name else [0, GATE_UP_256_CAP]
            for cap in caps:
                r = aot.compile_config(dataclasses.replace(cfg, max_registers=cap, archs=(90,)), 90)
                result.notes.append(f"sm_90a {name} cap {cap or '-'}: registers {r.registers}, spills "
                                    f"{r.spill_store_bytes} B, shared {r.shared_bytes} B (ok {r.ok}{' ' + r.error[:80] if r.error else ''})")
    except Exception as exc:  # the timings matter more than this list
        result.notes.append(f"register report failed: {type(exc).__name__}: {str(exc)[:200]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default=None, help="result file stem (default moe_pairs_caps-<card>)")
    parser.add_argument("--batches", type=int, nargs="*", default=[16, 32, 64, 128, 256])
    parser.add_argument("--t", type=int, nargs="*", default=[1, 4])
    args = parser.parse_args()
    from sglang_sm120.kernels.harness.devicebench import BenchResult, copy_bandwidth_gbs, gpu_tag, relative_error

    t_start = time.time()
    run = dm.timer(False)
    copy_gbs = copy_bandwidth_gbs()
    card = gpu_tag()
    result = BenchResult(name=args.name or f"moe_pairs_caps-{card}",
                         title=f"MoE decode: register caps on the TMA pairs tiles, {card.upper()}",
                         columns=["T", "B", "variant", "gate_up", "down", "us_round1", "us_round2", "us", "%copy",
                                  "vs_shipped", "rel_err"])
    result.extra["copy bandwidth (GB/s, read+write)"] = round(copy_gbs, 1)
    register_report(result)
    for tp in args.t:
        inter = MOE_INTERMEDIATE_SIZE // tp
        layers = [dm.make_layer(NUM_EXPERTS, HIDDEN_SIZE, inter, "cuda", seed=100 * tp + c) for c in range(COPIES)]
        ckpt = [t.clone() for t in layers[0]]
        for layer in layers:
            moe.repack_w13_(layer[0], layer[1])
        for batch in args.batches:
            rows = batch * TOP_K
            tiles = moe.pairs_rows_tiles(rows, inter)
            if tiles is None or moe.default_upcast(rows, inter) != moe.PAIRS:
                result.notes.append(f"T={tp} B={batch}: not a TMA pairs shape, skipped")
                continue
            x, weights, ids = dm.make_routing(batch, NUM_EXPERTS, HIDDEN_SIZE, "cuda", seed=batch + tp)
            touched = moe.touched_expert_bytes(ids, HIDDEN_SIZE, inter, NUM_EXPERTS)
            ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
            runs = variants(tiles)
            times = {label: [] for label, _ in runs}
            errs = {}
            for label, cfgs in runs:
                kw = {} if label == "shipped" else {"upcast": "pairs", "configs": cfgs}
                errs[label] = relative_error(moe.moe_mxfp4_forward(x, *layers[0], weights, ids, SWIGLU_LIMIT, **kw),
                                             ref)
            for _ in range(ROUNDS):
                for label, cfgs in runs:
                    kw = {} if label == "shipped" else {"upcast": "pairs", "configs": cfgs}
                    times[label].append(run(dm.cycling(
                        lambda layer, kw=kw: moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT, **kw),
                        layers)))
            base = statistics.median(times["shipped"])
            for label, cfgs in runs:
                us = statistics.median(times[label])
                result.add(T=tp, B=batch, variant=label, gate_up=cfgs[0].label(), down=cfgs[1].label(),
                           us_round1=times[label][0], us_round2=times[label][-1], us=us,
                           rel_err=errs[label], vs_shipped=base / us,
                           **{"%copy": 100 * touched / (us * 1e-6) / 1e9 / copy_gbs})
                print(f"T={tp} B={batch} {label}: {times[label]} us, err {errs[label]:.3g} "
                      f"[{time.time() - t_start:.0f} s]", flush=True)
            result.extra["wall seconds"] = round(time.time() - t_start, 1)
            result.write(args.out)  # partial results survive a timeout
        del layers, ckpt
        torch.cuda.empty_cache()
    result.notes.append("us: the median of the rounds (each a CUDA graph of 12 forwards over 3 layer copies, the median "
                        "of 15 replays); vs_shipped: the shipped tiles' us over this row's, same (T, B)")
    result.finish(args.out, t_start)


if __name__ == "__main__":
    main()
