"""NIXL VRAM transfer of DSv4-Flash KV pools from GPU 0 (prefill process) to GPU 1 (decode process).

For each UCX configuration the planner produces (this box as it is; the same box treated as
having no P2P, as an RTX 5090 box would be; two boxes over TCP, here over loopback), runs
``sglang_sm120.pd.nixl_check.run_pair`` with all 43 layers' compressed KV, indexer and SWA pools in
VRAM: every byte of the decode side's pools is checked, then the requests are repeated and timed
(post -> every handle DONE). Beside it: a plain torch copy of the same number of bytes from
cuda:0 to cuda:1. Writes a BenchResult (nixl_transfer-<gpu>x2) to --out.

    python3 tools/device_nixl_transfer.py --out $OUT       # device (nixl-cu13 wheels carried in .whl/)
    python3 tools/device_nixl_transfer.py --smoke --out /tmp/x   # here: DRAM, few layers, logic only
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

from sglang_sm120.pd.nixl_check import TransferSpec, run_pair, settings_from_plan  # noqa: E402
from sglang_sm120.pd.planner import PlanRequest, SideRequest, make_plan  # noqa: E402
from sglang_sm120.pd.topology import Nic, Topology, detect_local, host_from_fields  # noqa: E402


def plans(smoke: bool):
    """(label, plan) for each configuration to run."""
    if smoke:
        local = Topology((host_from_fields("box", "127.0.0.1", "H200", 2, "all"),))
    else:
        local, why = detect_local()
        if local is None:
            raise SystemExit(f"no topology: {why}")
    host = local.hosts[0]
    no_p2p = Topology((host_from_fields(host.name, "127.0.0.1", host.gpu_model.name, host.gpu_count, "none",
                                        gpu_memory_gib=host.gpu_model.memory_gib),))
    two_boxes = Topology(tuple(host_from_fields(n, "127.0.0.1", host.gpu_model.name, host.gpu_count, "none",
                                                [Nic("lo", "tcp")], gpu_memory_gib=host.gpu_model.memory_gib)
                               for n in ("boxA", "boxB")))
    # weights do not matter for the transport choice; 1 GiB keeps the memory check out of the way
    out = []
    for label, topo, p_host, d_host in (
            (f"one box, P2P as detected ({'yes' if host.p2p[0][1] else 'no'})", local, host.name, host.name),
            ("one box, no P2P (RTX 5090-like)", no_p2p, host.name, host.name),
            ("two boxes, TCP (loopback stands in for the link)", two_boxes, "boxA", "boxB")):
        req = PlanRequest(topo, "<model>", SideRequest(p_host, (0,), 1),
                          SideRequest(d_host, (1,) if p_host == d_host else (0,), 1), model_weights_gib=1.0)
        out.append((label, make_plan(req)))
    return out


def torch_copy_gbs(nbytes: int, repeats: int = 20) -> float:
    import torch

    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        times.append(time.perf_counter() - t0)
    assert torch.equal(dst.cpu(), src.cpu()), "torch cross-device copy corrupted bytes"
    return nbytes / statistics.median(times) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks"))
    ap.add_argument("--smoke", action="store_true", help="DRAM, 6 layers: check the logic on a CPU machine")
    args = ap.parse_args()
    for key in ("NCCL_NVLS_ENABLE",):  # the lent multi-GPU machines keep NVLink multicast off
        os.environ.setdefault(key, "0")
    from sglang_sm120.kernels.harness.devicebench import BenchResult

    if args.smoke:
        geometry = dict(layer_ids=tuple(range(6)), num_full_pages=24, num_swa_pages=12, requests=4,
                        pages_per_request=5, swa_pages_per_request=2, mem_kind="DRAM", timed_repeats=1)
    else:
        # all 43 layers; 32 full pages per request = an 8K-token prompt's compressed caches
        geometry = dict(layer_ids=tuple(range(43)), num_full_pages=160, num_swa_pages=16, requests=4,
                        pages_per_request=32, swa_pages_per_request=2, mem_kind="VRAM", src_gpu=0, dst_gpu=1,
                        prefill_num_threads=8, timed_repeats=3, timeout_s=60.0)
    result = BenchResult("nixl_transfer-h200x2" if not args.smoke else "nixl_transfer-smoke",
                         "NIXL (UCX) transfer of DSv4-Flash KV pools, GPU0 -> GPU1, two processes",
                         ["config", "UCX_TLS", "bytes_checked", "mismatched_bytes", "request_MB", "median_ms",
                          "median_GBps", "min_GBps", "torch_copy_GBps"])
    ok = True
    copy_gbs = None
    for label, plan in plans(args.smoke):
        nixl = settings_from_plan(plan)
        spec = TransferSpec(**geometry, **nixl)
        t0 = time.time()
        out = run_pair(spec, wall_timeout_s=150)
        print(f"{label}: {time.time() - t0:.1f} s; prefill={out['prefill']}; decode={out['decode']}; "
              f"hung={out['hung']}", flush=True)
        dec = out["decode"] or {}
        timings = (out["prefill"] or {}).get("timings") or []
        good = bool(dec.get("ok")) and out["prefill_exitcode"] == 0 and not out["hung"]
        ok &= good
        row = {"config": label, "UCX_TLS": nixl["env"].get("UCX_TLS", ""),
               "bytes_checked": dec.get("bytes_checked", 0),
               "mismatched_bytes": sum((dec.get("mismatched") or {}).values()) if good else "FAILED"}
        if timings:
            nbytes = timings[0][1]
            secs = [t for t, _ in timings]
            row.update(request_MB=nbytes / 1e6, median_ms=statistics.median(secs) * 1e3,
                       median_GBps=nbytes / statistics.median(secs) / 1e9, min_GBps=nbytes / max(secs) / 1e9)
            if not args.smoke and copy_gbs is None:
                copy_gbs = torch_copy_gbs(nbytes)
            row["torch_copy_GBps"] = copy_gbs if copy_gbs is not None else "-"
        result.add(**row)
    result.extra.update(layers=len(geometry["layer_ids"]), pages_per_request=geometry["pages_per_request"],
                        swa_pages_per_request=geometry["swa_pages_per_request"],
                        timed_requests=geometry["requests"] * geometry["timed_repeats"])
    result.notes += [
        f"Each request: the compressed KV (C4, C128) and indexer pages of {geometry['pages_per_request']} full "
        f"(256-token) pages on the prepared path, {geometry['swa_pages_per_request']} SWA pages per layer on the "
        "flat path, one aux row in DRAM; descriptors as SGLang 0.5.23's NIXL connector builds them; decode "
        "pages scattered; prefill agent with 8 threads as SGLang configures it.",
        "GB/s = request bytes / (post -> all handles DONE), decimal GB; torch_copy = one contiguous "
        "cuda:0 -> cuda:1 tensor copy of the same byte count (bytes moved, not read+write).",
        "Correctness: every byte of every decode-side buffer compared with the expected content "
        "(written pages = source pages, the rest still poison).",
    ]
    json_path, md_path = result.write(args.out)
    print(open(md_path).read())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
