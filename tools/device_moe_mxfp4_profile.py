#!/usr/bin/env python3
"""Device run: where the MoE decode kernels wait, from CUPTI PC sampling through Triton's proton (H200).

    python3 tools/device_moe_mxfp4_profile.py --out $OUT        # device (no carry)

The decode kernels stream at 1.3-1.7 TB/s whatever the tile (rounds 1-7), and neither more bytes in flight
nor fewer instructions per value moved that much; this run samples the warps' program counters while the
shipped kernels run at full DeepSeek-V4-Flash shapes (256 experts, H = 4096, top-6) and sums the samples per
kernel by stall reason (long scoreboard = waiting for global/local memory, barrier, math pipe throttle,
not selected / selected = ready to issue, ...), plus the 12 most sampled source lines of each kernel. Also
the registers, spills and shared memory of every compiled kernel (they set how many warps an SM holds).

Cases: the pairs decode (T=1 B=64, T=4 B=64, T=1 B=16) and the CUDA-core GEMV (T=1 B=1, B=8), each warmed
up (compiled) outside the sampling session, then a few forwards inside it. Writes moe_mxfp4-profile.json
and the raw proton trees pc_<case>.hatchet. First device call (round 7): the resources came back (pairs
gate/up 108 / down 110 registers, 24576 B shared memory, 4 warps; GEMV 63 registers), the sampling summary
failed on string metrics (fixed since, not yet re-run).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from device_moe_mxfp4 import make_layer, make_routing  # noqa: E402  (makes sglang_sm120.kernels importable)

import torch  # noqa: E402

from sglang_sm120.kernels import moe_mxfp4 as moe  # noqa: E402
from sglang_sm120.kernels.dsv4 import HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, NUM_EXPERTS, SWIGLU_LIMIT  # noqa: E402

CASES = [("pairs_T1_B64", 1, 64), ("pairs_T4_B64", 4, 64), ("pairs_T1_B16", 1, 16), ("gemv_T1_B1", 1, 1),
         ("gemv_T1_B8", 1, 8)]
FORWARDS = 6


def subtree_sums(node) -> dict:
    """Numeric metrics summed over a hatchet node and all its descendants."""
    sums = dict(numeric(node.get("metrics")))
    for child in node.get("children") or []:
        for key, value in subtree_sums(child).items():
            sums[key] = sums.get(key, 0) + value
    return sums


def numeric(metrics) -> dict:
    """The numeric entries of a hatchet metrics dict (PC sampling nodes also carry strings)."""
    return {k: v for k, v in (metrics or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def leaves(node, path=()):
    name = (node.get("frame") or {}).get("name", "?")
    children = node.get("children") or []
    if not children:
        yield path + (name,), numeric(node.get("metrics"))
    for child in children:
        yield from leaves(child, path + (name,))


def summarise(tree) -> dict:
    roots = tree if isinstance(tree, list) else [tree]
    kernels = {}
    for root in roots:
        for kernel in root.get("children") or []:
            name = (kernel.get("frame") or {}).get("name", "?")
            sums = subtree_sums(kernel)
            samples = sums.get("num_samples", 0) or 1
            reasons = {k: round(v / samples, 4) for k, v in sorted(sums.items(), key=lambda kv: -kv[1])
                       if k.startswith("stalled_") and v}
            lines = sorted(((m.get("num_samples", 0), "/".join(p[1:])[-160:], m) for p, m in leaves(kernel)),
                           key=lambda t: -t[0])[:12]
            top = [{"samples": s, "where": where,
                    "reasons": {k: v for k, v in sorted(m.items(), key=lambda kv: -kv[1])
                                if k.startswith("stalled_") and v}}
                   for s, where, m in lines if s]
            entry = kernels.setdefault(name, {"num_samples": 0, "share": {}, "top_lines": []})
            entry["num_samples"] += sums.get("num_samples", 0)
            entry["share"] = reasons
            entry["top_lines"] = top
    return kernels


def compiled_resources() -> list:
    """Registers / spills / shared memory of every compiled variant of the MoE kernels (best effort)."""
    out = []
    for name in ("_gate_up_pairs_kernel", "_down_pairs_kernel", "_gate_up_gemv_kernel", "_down_gemv_kernel",
                 "_route_pairs_kernel", "_topk_sum_kernel"):
        fn = getattr(moe, name)
        for caches in getattr(fn, "device_caches", {}).values():
            cache = caches[0] if isinstance(caches, tuple) else caches
            for kernel in getattr(cache, "values", lambda: [])():
                try:
                    kernel._init_handles()
                    out.append({"kernel": name, "regs": kernel.n_regs, "spills": kernel.n_spills,
                                "shared": kernel.metadata.shared, "num_warps": kernel.metadata.num_warps,
                                "num_stages": kernel.metadata.num_stages})
                except Exception as exc:  # resources are a side note; never lose the samples for them
                    out.append({"kernel": name, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    import triton.profiler as proton

    t_start = time.time()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": {},
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    import triton

    result["triton"] = triton.__version__
    layers = {}
    for name, tp, batch in CASES:
        inter = MOE_INTERMEDIATE_SIZE // tp
        if tp not in layers:
            layers[tp] = [make_layer(NUM_EXPERTS, HIDDEN_SIZE, inter, "cuda", seed=10 * tp + c) for c in range(2)]
            for layer in layers[tp]:
                moe.repack_w13_(layer[0], layer[1])
        x, weights, ids = make_routing(batch, NUM_EXPERTS, HIDDEN_SIZE, "cuda", seed=batch + tp)
        upcast = "pairs" if name.startswith("pairs") else "gemv"

        def forward(layer):
            return moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT, upcast=upcast)
        for layer in layers[tp]:
            forward(layer)
        torch.cuda.synchronize()
        path = out_dir / f"pc_{name}"
        try:
            proton.start(str(path), backend="cupti", mode="pcsampling")
            for i in range(FORWARDS):
                forward(layers[tp][i % 2])
            torch.cuda.synchronize()
            proton.finalize()
            tree = json.loads(pathlib.Path(f"{path}.hatchet").read_text())
            result["cases"][name] = summarise(tree)
        except Exception as exc:  # one failing case must not lose the others
            result["cases"][name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        print(name, json.dumps(result["cases"][name])[:1500], flush=True)
    result["resources"] = compiled_resources()
    result["wall seconds"] = round(time.time() - t_start, 1)
    (out_dir / "moe_mxfp4-profile.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["resources"]))  # the raw pc_*.hatchet files stay in --out (5 files) beside it


if __name__ == "__main__":
    main()
