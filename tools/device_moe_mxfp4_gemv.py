#!/usr/bin/env python3
"""Device run: the CUDA-core GEMV decode (``upcast="gemv"``) against the tl.dot decode default, H200.

    python3 tools/device_moe_mxfp4_gemv.py --out $OUT        # device (no carry: no upstream code)
    python3 tools/device_moe_mxfp4_gemv.py --smoke --out DIR  # CPU interpreter, tiny shapes: the logic

Full DeepSeek-V4-Flash expert shapes (256 experts, H = 4096, I = 2048/T) for T in (1, 4) and B in
(1, 8, 64, 256), top-6 routing as SGLang's (distinct experts per token, weights with the 1.5 routed
scale folded in). Per (T, B): the shipped default at the time of the run (tl.dot path, its upcast and
split-K), then the GEMV with several tiles (``moe_mxfp4.GemvConfig``: gate/up and down block_n,
block_k, warps, one or two routed rows per weight pass). Every variant is checked against the float32
reference (``reference_moe_mxfp4``) before it is timed in CUDA graphs (weights rotating over 3 layer
copies); bandwidth is over the bytes of the experts touched (weights + E8M0 scales) beside the copy
bandwidth measured eagerly in the same run. One variant failing does not lose the others: its error
is a note. Results are written after every (T, B).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    import os

    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# device_moe_mxfp4 makes sglang_sm120.kernels importable (ensure_kernels_importable) on import
from device_moe_mxfp4 import cycling, make_layer, make_routing, timer  # noqa: E402


from sglang_sm120.kernels import moe_mxfp4 as moe  # noqa: E402
from sglang_sm120.kernels.dsv4 import HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, NUM_EXPERTS, SWIGLU_LIMIT, TOP_K  # noqa: E402

G = moe.GemvConfig
# (label, (gate/up, down) GEMV tiles); "two" variants dequantise each weight tile once for two rows
GEMV_VARIANTS = [
    ("gemv n16k512w4 / n32k512w4", (G(16, 512, 4), G(32, 512, 4))),
    ("gemv n8k512w4 / n16k512w4", (G(8, 512, 4), G(16, 512, 4))),
    ("gemv n16k1024w8 / n32k1024w8", (G(16, 1024, 8), G(32, 1024, 8))),
    ("gemv n32k256w4 / n64k256w4", (G(32, 256, 4), G(64, 256, 4))),
    ("gemv n8k256w2 / n16k256w2", (G(8, 256, 2), G(16, 256, 2))),
    ("gemv n16k512w4 / n32k512w4 two", (G(16, 512, 4, True), G(32, 512, 4, True))),
    ("gemv n8k512w4 / n16k512w4 two", (G(8, 512, 4, True), G(16, 512, 4, True))),
]

LARGE_BATCH_VARIANTS = ("gemv n16k512w4 / n32k512w4", "gemv n16k512w4 / n32k512w4 two", "gemv n8k512w4 / n16k512w4 two")
DEADLINE_S = 170  # later cases are skipped (the device limit of this run is 200 s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from sglang_sm120.kernels.harness.devicebench import BenchResult, copy_bandwidth_gbs, relative_error

    if args.smoke:
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()
        device, num_experts, hidden, tps, batches, copies, base_inter = "cpu", 8, 256, (1, 4), (1, 3), 2, 256
    else:
        device, num_experts, hidden, tps, batches, copies, base_inter = (
            "cuda", NUM_EXPERTS, HIDDEN_SIZE, (1, 4), (1, 8, 64, 256), 3, MOE_INTERMEDIATE_SIZE)
    run = timer(args.smoke)
    t_start = time.time()
    copy_gbs = 0.0 if args.smoke else copy_bandwidth_gbs()
    result = BenchResult(
        name="moe_mxfp4-h200-gemv",
        title="sm120 MoE decode: CUDA-core GEMV vs the tl.dot decode, DSv4-Flash shapes, H200",
        columns=["T", "B", "variant", "us", "touched_MB", "GB/s", "%copy", "rel_err", "vs_old_default"])
    result.extra.update({"copy bandwidth (GB/s, read+write, eager)": round(copy_gbs, 1),
                         "launches per forward": moe.LAUNCHES_PER_FORWARD})
    all_layers = {}
    for tp in tps:
        inter = base_inter // tp
        layers = [make_layer(num_experts, hidden, inter, device, seed=100 * tp + c) for c in range(copies)]
        ckpt = [t.clone() for t in layers[0]]
        for layer in layers:
            moe.repack_w13_(layer[0], layer[1])
        all_layers[tp] = layers, ckpt
    # the largest batch last, so a timeout loses the least
    cases = [(tp, b) for tp in tps for b in batches[:-1]]
    cases += [(tp, batches[-1]) for tp in tps]
    for tp, batch in cases:
        inter = base_inter // tp
        layers, ckpt = all_layers[tp]
        if time.time() - t_start > DEADLINE_S:
            result.notes.append(f"T={tp} B={batch}: skipped, past {DEADLINE_S} s into the run")
            continue
        x, weights, ids = make_routing(batch, num_experts, hidden, device, seed=batch + tp)
        touched = moe.touched_expert_bytes(ids, hidden, inter, num_experts)
        ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
        rows = batch * TOP_K
        old = f"tl.dot {moe.default_upcast(rows, inter)}, split {moe.default_split_k(rows, inter)} (old default)"
        gemvs = GEMV_VARIANTS if batch <= 64 else [v for v in GEMV_VARIANTS if v[0] in LARGE_BATCH_VARIANTS]
        variants = [(old, {})] + [(label, {"upcast": "gemv", "configs": cfgs}) for label, cfgs in gemvs]
        times = {}
        for label, kw in variants:
            def per_layer(layer, kw=kw):
                return moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT, **kw)
            try:
                err = relative_error(per_layer(layers[0]), ref)
                us = run(cycling(per_layer, layers))
            except Exception as exc:  # one broken variant must not lose the run
                result.notes.append(f"T={tp} B={batch} {label}: {type(exc).__name__}: {str(exc)[:300]}")
                print("FAILED", tp, batch, label, exc, flush=True)
                continue
            times[label] = us
            gbs = touched / (us * 1e-6) / 1e9
            result.add(T=tp, B=batch, variant=label, us=us, touched_MB=touched / 1e6, rel_err=err,
                       **{"GB/s": gbs, "%copy": 100 * gbs / copy_gbs if copy_gbs else 0.0,
                          "vs_old_default": times[old] / us if old in times else float("nan")})
            print(f"T={tp} B={batch} {label}: {us:.1f} us, {gbs:.0f} GB/s, err {err:.2e}", flush=True)
        result.extra["wall seconds"] = round(time.time() - t_start, 1)
        result.write(args.out)  # partial results survive a timeout
    result.notes.append("vs_old_default = time of the tl.dot default at the time of the run / time of this row (> 1: "
                        "faster); touched_MB = distinct experts x (w13 + w2 + E8M0 scales); weights rotate over "
                        f"{copies} layer copies; CUDA graphs of 12 calls, median of 15 replays")
    result.notes.append("gemv labels: gate/up / down GemvConfig as n<block_n>k<block_k>w<warps>; 'two' = two routed "
                        "rows per pass over a weight tile (tile dequantised once), else one row per pass")
    result.extra["wall seconds"] = round(time.time() - t_start, 1)
    paths = result.write(args.out)
    print(result.markdown())
    print("wrote", paths)


if __name__ == "__main__":
    main()
