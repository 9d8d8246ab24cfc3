"""Layer-time A/B of `sglang-sm120 bench` runs with PDL variants (used for benchmarks/bench-pdl-h200-*).

    python3 tools/bench_pdl_ab.py DIR     # DIR holds bench-pdl-<variant>-<round>.json

Prints, per (kind, T, B, path), each variant's median layer µs over the rounds and its ratio to the
first variant (the baseline, e.g. coff-aoff: no PDL on the shared kernels nor on attention), plus
each file's copy bandwidth and failed checks."""

import glob
import json
import os
import re
import statistics
import sys


def main(folder: str) -> None:
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "bench-pdl-*.json"))):
        variant = re.sub(r"-\d+$", "", os.path.basename(path)[len("bench-pdl-"):-len(".json")])
        data = json.load(open(path))
        runs.setdefault(variant, []).append(data)
        print(f"{os.path.basename(path)}: copy {data['copy_bandwidth_gbs']:.0f} GB/s, common_pdl "
              f"{data.get('common_pdl')}, attention_pdl {data.get('attention_pdl')}, checks failed "
              f"{len(data['checks_failed'])}, errors {len(data.get('errors', []))}")
    variants = sorted(runs, key=lambda v: (v != "coff-aoff", v))
    layer_us = {}
    for v in variants:
        for data in runs[v]:
            for r in data["layers"]:
                key = (r["kind"], r["T"], r["B"], r["path"])
                layer_us.setdefault(key, {}).setdefault(v, []).append(r["layer_us"])
    print("kind T B path | " + " | ".join(f"{v} us (ratio)" for v in variants) + " | rounds")
    for key in sorted(layer_us, key=lambda k: (k[3], k[0], k[1], k[2])):
        base = statistics.median(layer_us[key][variants[0]])
        cells = []
        for v in variants:
            med = statistics.median(layer_us[key][v])
            cells.append(f"{med:.2f} ({med / base:.4f})")
        spread = max(max(x) / min(x) - 1 for x in layer_us[key].values())
        print(" ".join(map(str, key)) + " | " + " | ".join(cells) + f" | max spread {100 * spread:.2f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
