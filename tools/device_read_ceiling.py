#!/usr/bin/env python3
"""How fast can anything read a DSv4 weight's bytes once, on this GPU, in the project's timing harness?

Issue 6 asks each block-FP8 GEMV for >= 80 % of the copy bandwidth at one row, and issue 4 the MoE decode at B=1
for 2.8 TB/s. Both are measured against a 2 GiB eager copy. A weight of 6-34 MB is read in a few microseconds, so the
launch, the ramp of the first loads and the tail of the last wave are a large part of it. This script measures that
ceiling directly: a Triton kernel that does nothing but read the same number of bytes (16-byte loads, an XOR
reduction so the loads cannot be dropped, one word written per program), in several grid forms, timed exactly as
the GEMV tools time the GEMVs (``devicebench.time_rotating_calls``: one call per distinct copy, copies totalling
past the L2, in one CUDA graph). The shipped GEMV (``fp8_gemv.block_fp8_linear``, one row, its default config) runs
on the same byte counts in the same run, so both are read against one copy figure.

Nothing is shipped from this: it says how much of the gap to the targets any kernel could close.

    python3 tools/device_read_ceiling.py --out $OUT/r --name read_ceiling-h200-run1   # device, under a minute
    python3 tools/device_read_ceiling.py --smoke                                       # CPU interpreter
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ROTATE_BYTES = 256 * 2**20  # distinct copies per graph: past the H200's L2 several times over
WORD_BYTES = 16  # one int32x4 load per lane
# (programs per SM or 0 for one program per tile, words per program step, warps)
READ_FORMS = ((0, 1024, 4), (0, 2048, 4), (0, 4096, 8), (1, 2048, 8), (2, 2048, 8), (4, 1024, 4), (8, 1024, 4))
TPS = (1, 4)


@triton.jit
def _read_kernel(src_ptr, out_ptr, n_int32, STEP: tl.constexpr, PERSISTENT: tl.constexpr):
    """XOR of every int32 of ``src`` (a reduction that cannot overflow, so the interpreter checks it too); program p reads steps p, p + grid, ... (one step when not
    persistent). ``STEP`` int32 per step, 4 per lane: 16-byte loads."""
    pid = tl.program_id(0)
    offs = tl.arange(0, STEP)
    acc = tl.zeros([STEP], dtype=tl.int32)
    if PERSISTENT:
        grid = tl.num_programs(0)
        steps = tl.cdiv(n_int32, STEP)
        for s in range(pid, steps, grid):
            idx = s * STEP + offs
            acc ^= tl.load(src_ptr + idx, mask=idx < n_int32, other=0, cache_modifier=".cg")
    else:
        idx = pid * STEP + offs
        acc ^= tl.load(src_ptr + idx, mask=idx < n_int32, other=0, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))


def read_call(torch, src, out, form, sms):
    per_sm, step, warps = form
    n = src.numel()
    steps = triton.cdiv(n, step)
    programs = min(steps, per_sm * sms) if per_sm else steps

    def call():
        _read_kernel[(programs,)](src, out, n, STEP=step, PERSISTENT=bool(per_sm), num_warps=warps)
    return call, programs


def xor_all(torch, t) -> int:
    """XOR of every int32 of ``t``, on the host, by halving."""
    t = t.flatten().to(torch.int64).cpu()
    while t.numel() > 1:
        if t.numel() % 2:
            t = torch.cat([t, torch.zeros(1, dtype=t.dtype)])
        t = t[0::2] ^ t[1::2]
    return int(t[0]) if t.numel() else 0


def label(form) -> str:
    per_sm, step, warps = form
    return (f"persistent {per_sm}/SM" if per_sm else "one step per program") + f", {step * 4} B steps, {warps} warps"


def targets(dsv4):
    """(name, T, bytes, (N, K) or None) of every GEMV weight (fp8 bytes plus its fp32 block scales) and the MoE
    B=1 expert bytes (6 experts' gate/up and down, e2m1 plus E8M0)."""
    rows = []
    for tp in TPS:
        for name, (n, k) in dsv4.dense_linear_shapes(tp).items():
            scales = triton.cdiv(n, dsv4.FP8_BLOCK) * triton.cdiv(k, dsv4.FP8_BLOCK) * 4
            rows.append((name, tp, n * k + scales, (n, k)))
        inter = dsv4.MOE_INTERMEDIATE_SIZE // tp
        per_expert = (2 * inter * dsv4.HIDDEN_SIZE + dsv4.HIDDEN_SIZE * inter) * (1 + 2 / dsv4.MXFP4_GROUP) // 2
        rows.append(("moe_b1_experts", tp, int(dsv4.TOP_K * per_expert), None))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default="read_ceiling-h200-run1")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter at tiny sizes: checks the XORs only")
    args = parser.parse_args()
    t0 = time.time()

    import torch

    from sglang_sm120.kernels import dsv4, fp8_gemv
    from sglang_sm120.kernels.harness import devicebench as db

    if args.smoke:
        src = torch.randint(-2**31, 2**31 - 1, (5000,), dtype=torch.int32)
        for form in READ_FORMS:
            out = torch.full((64,), 7, dtype=torch.int32)
            call, programs = read_call(torch, src, out, form, sms=2)
            call()
            got, want = xor_all(torch, out[:programs]), xor_all(torch, src)
            assert got == want, (label(form), got, want)
        print("smoke: every read form XORs its whole input")
        return 0

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy_gbs = db.copy_bandwidth_gbs()
    res = db.BenchResult(args.name, "Read ceiling: a pure 16-byte streaming read of each DSv4 weight's bytes beside "
                         "the shipped one-row GEMV", ["target", "T", "MB", "path", "us", "GB/s", "pct_copy"])
    res.extra["copy GB/s (2 GiB eager copy, read + write)"] = round(copy_gbs, 1)
    res.notes.append("Each point: one call per distinct copy of the bytes (copies totalling >= 256 MiB), all in one "
                     "CUDA graph (devicebench.time_rotating_calls), as the GEMV tools time the GEMVs. 'read best' is "
                     "the fastest read form at that size; every form's time is in the JSON.")
    forms_json = {}
    print(f"copy {copy_gbs:.1f} GB/s, {sms} SMs", flush=True)
    for name, tp, nbytes, nk in targets(dsv4):
        copies = max(2, -(-ROTATE_BYTES // nbytes))
        n_int32 = nbytes // 4
        srcs = [torch.randint(-2**31, 2**31 - 1, (n_int32,), dtype=torch.int32, device="cuda") for _ in range(copies)]
        out = torch.empty(triton.cdiv(n_int32, 1024) + 8 * sms, dtype=torch.int32, device="cuda")
        times = {}
        for form in READ_FORMS:
            calls = [read_call(torch, s, out, form, sms)[0] for s in srcs]
            times[label(form)] = db.time_rotating_calls(calls)
        # the first copy's XOR, as a check that the kernel read everything
        call, programs = read_call(torch, srcs[0], out, READ_FORMS[0], sms)
        call()
        got, want = xor_all(torch, out[:programs]), xor_all(torch, srcs[0])
        if got != want:
            res.notes.append(f"FAILED: {name} T={tp} read XOR {got} != {want}")
        del srcs
        best = min(times, key=times.get)
        forms_json[f"{name} T={tp}"] = {k: round(v, 3) for k, v in times.items()}
        mb = nbytes / 1e6
        res.add(target=name, T=tp, MB=round(mb, 2), path=f"read best ({best})", us=round(times[best], 2),
                **{"GB/s": round(nbytes / times[best] / 1e3, 1)},
                pct_copy=round(100 * nbytes / times[best] / 1e3 / copy_gbs, 1))
        if nk is not None:
            n, k = nk
            wcopies = max(2, -(-ROTATE_BYTES // nbytes))
            weights = [(torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn),
                        torch.rand(triton.cdiv(n, 128), triton.cdiv(k, 128), device="cuda") + 0.5)
                       for _ in range(wcopies)]
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
            calls = [(lambda w=w, s=s: fp8_gemv.block_fp8_linear(x, w, s, out=y)) for w, s in weights]
            us = db.time_rotating_calls(calls)
            del weights
            res.add(target=name, T=tp, MB=round(mb, 2), path="shipped one-row GEMV", us=round(us, 2),
                    **{"GB/s": round(nbytes / us / 1e3, 1)}, pct_copy=round(100 * nbytes / us / 1e3 / copy_gbs, 1))
        torch.cuda.empty_cache()
        res.extra["every read form (us)"] = forms_json
        res.write(args.out)  # so far, in case the step's time limit ends the run
    res.finish(args.out, t0)
    return 1 if any(n.startswith("FAILED") for n in res.notes) else 0


if __name__ == "__main__":
    sys.exit(main())
