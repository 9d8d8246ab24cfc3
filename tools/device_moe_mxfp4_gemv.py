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
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

import torch  # noqa: E402

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
    for tp in tps:
        inter = base_inter // tp
        layers = [make_layer(num_experts, hidden, inter, device, seed=100 * tp + c) for c in range(copies)]
        ckpt = [t.clone() for t in layers[0]]
        for layer in layers:
            moe.repack_w13_(layer[0], layer[1])
        for batch in batches:
            x, weights, ids = make_routing(batch, num_experts, hidden, device, seed=batch + tp)
            touched = moe.touched_expert_bytes(ids, hidden, inter, num_experts)
            ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
            rows = batch * TOP_K
            old = f"tl.dot {moe.default_upcast(rows, inter)}, split {moe.default_split_k(rows, inter)} (old default)"
            variants = [(old, {})] + [(label, {"upcast": "gemv", "configs": cfgs}) for label, cfgs in GEMV_VARIANTS]
            gu, dn = moe.gemv_configs(rows, inter)
            variants.append((f"gemv default tiles n{gu.block_n}k{gu.block_k}w{gu.num_warps} / n{dn.block_n}k{dn.block_k}"
                             f"w{dn.num_warps}{' two' if gu.two_rows else ''}", {"upcast": "gemv"}))
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
        del layers, ckpt
        if device == "cuda":
            torch.cuda.empty_cache()
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
