#!/usr/bin/env python3
"""Device A/B of the fused-RoPE ``grouped_fp8_wo_a``: this checkout's ``kernels/fp8_gemv.py`` against an earlier
version of the same file, in one run, at full DSv4-Flash shapes.

For a kernel change that should cost nothing (for example the range check on ``positions``), the two versions are
timed in turn (before, after, before, after, ...) in CUDA graphs that stream distinct weight copies from HBM, and
their outputs compared bit for bit on in-range positions. The after version is also run with one position past the
table and one below zero, and must give NaN rows there and the same bits elsewhere.

    git show <rev>:kernels/fp8_gemv.py > before_fp8_gemv.py
    python3 tools/device_wo_a_ab.py --before before_fp8_gemv.py --out $OUT      # on the device
    python3 tools/device_wo_a_ab.py --before before_fp8_gemv.py --smoke         # CPU interpreter, tiny shapes
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

ROWS = (1, 2, 4, 8, 16)
TPS = (1, 4)
ROUNDS = 3  # before/after alternations per point
ROTATE_BYTES = 200 * 2**20  # distinct weight copies per graph: > 4x the H200's 50 MB L2
MAX_POS = 65536


def load_before(path: str):
    """The earlier fp8_gemv.py as a module of the kernels package (its relative imports resolve there)."""
    spec = importlib.util.spec_from_file_location("sglang_sm120.kernels._fp8_gemv_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the earlier kernels/fp8_gemv.py")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks"))
    parser.add_argument("--name", default="wo_a_ab-h200-run1")
    parser.add_argument("--note", default="", help="what the two versions differ in (written to the result)")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter run at tiny shapes, no timing")
    parser.add_argument("--tp", type=int, action="append", help=f"tensor-parallel sizes (default {TPS})")
    args = parser.parse_args()

    import torch

    from sglang_sm120.kernels import dsv4
    from sglang_sm120.kernels import fp8_gemv as after
    from sglang_sm120.kernels.harness import devicebench as db

    if args.smoke:
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()  # the interpreter's bf16 tl.dot is wrong without it
    before = load_before(args.before)
    dev = "cpu" if args.smoke else "cuda"
    head, rope_dim = (dsv4.HEAD_DIM, dsv4.ROPE_DIM) if not args.smoke else (128, 32)
    rows, tps = ((1, 3), (4,)) if args.smoke else (ROWS, TPS)
    tps = tuple(args.tp) if args.tp else tps
    res = db.BenchResult(args.name, "wo_a with the fused inverse RoPE: earlier fp8_gemv.py vs this checkout's "
                         "(CUDA-graph timed, alternating)",
                         ["T", "G", "M", "MB", "before_us", "after_us", "after_vs_before", "before_runs", "after_runs",
                          "same_bits", "bad_rows_nan", "good_rows_same", "cfg"])
    if args.note:
        res.extra["change"] = args.note
    t0 = time.time()
    gen = torch.Generator(device=dev).manual_seed(0)
    angles = torch.rand(MAX_POS, rope_dim // 2, device=dev, generator=gen) * (2 * math.pi)
    freqs = torch.view_as_real(torch.polar(torch.ones_like(angles), angles)).flatten(1)
    for tp in tps:
        groups, r, d = dsv4.O_GROUPS // tp, dsv4.O_LORA_RANK, dsv4.dense_linear_shapes(tp)["wo_a"][1]
        if args.smoke:
            groups, r, d = 2, 128, 256
        nbytes = groups * r * d
        copies = 1 if args.smoke else max(2, math.ceil(ROTATE_BYTES / nbytes))
        base = (torch.randn(groups, r, d, device=dev, generator=gen) * 0.5).to(after.FP8_DTYPE)
        scales = torch.exp2(torch.randint(-10, -5, (groups, r // 128, d // 128), device=dev, generator=gen).float())
        weights = [(base.clone(), scales.clone()) for _ in range(copies)]
        for m in rows:
            o = torch.randn(m, groups, d, device=dev, generator=gen).to(torch.bfloat16)
            positions = torch.randint(0, MAX_POS, (m,), device=dev, generator=gen)

            def call(module, w, s, pos=positions):
                return module.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, head_dim=head, rope_dim=rope_dim)

            y_before, y_after = call(before, *weights[0]), call(after, *weights[0])
            same_bits = bool(torch.equal(y_before, y_after))
            bad = positions.clone()
            bad_rows = [0] if m == 1 else [0, m - 1]
            bad[0] = MAX_POS
            if m > 1:
                bad[m - 1] = -1
            y_bad = call(after, *weights[0], pos=bad)
            good = [i for i in range(m) if i not in bad_rows]
            bad_nan = bool(torch.isnan(y_bad[bad_rows]).all())
            good_same = bool(torch.equal(y_bad[good], y_after[good]))
            times = {"before": [], "after": []}
            for _ in range(1 if args.smoke else ROUNDS):
                for label, module in (("before", before), ("after", after)):
                    times[label].append(db.time_rotating_calls(
                        [(lambda w=w, s=s, mod=module: call(mod, w, s)) for w, s in weights], dry_run=args.smoke))
            med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
            res.add(T=tp, G=groups, M=m, MB=round(nbytes / 1e6, 2), before_us=med["before"], after_us=med["after"],
                    after_vs_before=round(med["after"] / med["before"], 4) if med["before"] == med["before"] else
                    float("nan"), before_runs=[round(t, 2) for t in times["before"]],
                    after_runs=[round(t, 2) for t in times["after"]], same_bits=same_bits, bad_rows_nan=bad_nan,
                    good_rows_same=good_same, cfg=after.wo_a_config(m, r, d, groups, True).name)
            print(f"[{time.time() - t0:4.0f}s] T={tp} M={m}: before {times['before']} after {times['after']} "
                  f"same_bits {same_bits} bad_nan {bad_nan} good_same {good_same}", flush=True)
            if args.smoke:
                assert same_bits and bad_nan and good_same
            res.write(args.out)
        del weights
    res.notes.append("before_us / after_us: medians of ROUNDS alternating timings, each a CUDA graph calling distinct "
                     "weight copies (>= 200 MiB in all) so every call streams its weight from HBM; same_bits: the two "
                     "versions' outputs equal on in-range positions; bad_rows_nan / good_rows_same: this checkout "
                     "with positions[0] = max_pos (and positions[-1] = -1 for M > 1) gives NaN rows there and the "
                     "same bits on the other rows.")
    print("wrote", res.write(args.out))


if __name__ == "__main__":
    main()
