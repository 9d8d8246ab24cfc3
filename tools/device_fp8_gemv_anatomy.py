#!/usr/bin/env python3
"""Anatomy of the grouped wo_a FP8 GEMV at T=1 on the H200: where the time of one call goes (research only).

wo_a at T=1 is ``[8 groups x 1024, 4096]`` e4m3 (33.5 MB) with 128x128 block scales. At M = 2..8 rows it runs the
128-column FP8 tensor-core tile (``q8j_m8_n128_u1_s8_w8_st3_pdl``: 8 tiles x split 8 x 8 groups = 512 programs of
8 warps, 4 K blocks of 16 KiB each, 3-stage pipeline, PDL). This script times, with the kernel's own grid and split:

1. the shipped kernel (``grouped_fp8_wo_a`` with ``default_config``: weight by cp.async) and the same tile by TMA
   (``w_tma=True``, the seam's form with the fused RoPE), both checked against the float32 reference;
2. ``replica``: the FP8 tile rewritten here with the project's jitted helpers and a TMA ring (``MODE_FULL``;
   checked against the reference too), then variants of it that keep the grid, tile, split, ring and epilogue:
   * ``loads_w``: only the weight's TMA copies, each tile reduced by an int32 sum of its raw words;
   * ``loads_wxs``: the weight, the activation and the scales loaded, reduced by integer sums (no split, no MMA);
   * ``math_l2``: the full math on weight tiles all programs share (group 0, tile 0, K blocks 0..3: 64 KiB that
     stays in L2), so TMA issue and latency remain but not HBM bandwidth;
   * ``math_reg``: the full math on a constant weight tile (no weight load at all);
   * ``epilogue``: no K loop, only PDL, the split partial store and the last-arriver sum (the fixed cost);
   * ``loads_w`` with 4 / 6 stages, with 256-column tiles (2x rows per program, half the programs), and with half
     the split (2x the K per program);
3. ``stream``: a plain read of the same 33.5 MB with the same 512 programs of 8 warps (no TMA ring), each program's
   64 KiB loaded at once (``oneshot``) or 16 KiB at a time (``loop``);
4. the 1-row FMA form (``fma_m1_n64_u2_s2_w4_st3_pdl_l2p4_tma``, 256 programs): shipped, loads-only with its grid
   and 64x256 TMA tiles, and ``math_l1``: the shipped kernel with plain loads on a weight view of stride 0 (every
   program reads the same 4 KiB row);
plus the eager copy bandwidth of the same run.

Every call is timed in a CUDA graph of calls over distinct weight copies (>= 200 MiB, 4x the L2), each call the
previous one's PDL dependent as in the shipped harness (``devicebench.time_rotating_calls``). ``--smoke`` runs the
same logic under TRITON_INTERPRET=1 at tiny shapes on the CPU (checks only, no timing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from sglang_sm120.kernels import fp8_gemv as g  # noqa: E402
from sglang_sm120.kernels.fp8_gemv import (  # noqa: E402
    _pdl_launch_dependents, _pdl_wait, _split_activation_joined, _sum_split_partials,
)
from sglang_sm120.kernels.harness import devicebench as db  # noqa: E402

RUN_NAME = "fp8_gemv-h200-run14-anatomy"
ROTATE_BYTES = 200 * 2**20
# kernel modes (constexpr: a jitted function reads only constexpr globals)
MODE_FULL, MODE_LOADS_W, MODE_LOADS_WXS = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
MODE_MATH_L2, MODE_MATH_REG, MODE_EPILOGUE = tl.constexpr(3), tl.constexpr(4), tl.constexpr(5)
MODE_NAMES = {0: "replica_full", 1: "loads_w", 2: "loads_wxs", 3: "math_l2", 4: "math_reg", 5: "epilogue"}


@triton.jit
def _anatomy_kernel(x_ptr, s_ptr, y_ptr, partial_ptr, counter_ptr, w_desc,
                    M, N, K, stride_xm, stride_xg, stride_sg, stride_sn, stride_ym, stride_yg,
                    tiles_per_split, num_splits,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILE_K: tl.constexpr, MODE: tl.constexpr,
                    STAGES: tl.constexpr, PDL: tl.constexpr):
    """One program of the FP8 tile (_fp8mma_item, JOIN, no RoPE, weight by TMA through STAGES buffers) or of a
    variant of it (MODE): rows [pid_m*BLOCK_M, +BLOCK_M) x cols [pid_n*BLOCK_N, +BLOCK_N) of group pid_g over weight
    tiles [pid_k*tiles_per_split, +tiles_per_split) of TILE_K columns. The loads-only modes read the weight as int32
    words (w_desc over the int32 view, box [1, BLOCK_N, TILE_K / 4]); every mode ends in the shipped epilogue."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_g = tl.program_id(2)
    _pdl_launch_dependents(PDL)
    _pdl_wait(PDL)
    tiles_per_group = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_m = pid // n_tiles
    pid_n = pid % n_tiles
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, TILE_K)
    x_valid = rm < M
    x_rows = x_ptr + pid_g * stride_xg + rm[:, None] * stride_xm
    s_row = s_ptr + pid_g * stride_sg + (pid_n * BLOCK_N // 128) * stride_sn
    k_tiles = tl.cdiv(K, TILE_K)
    t_begin = pid_k * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, k_tiles)
    k_stop = tl.minimum(t_end * TILE_K, K)
    WORDS: tl.constexpr = TILE_K // 4
    acc = tl.zeros((BLOCK_N, 2 * BLOCK_M), tl.float32)
    acc_words = tl.zeros((BLOCK_N,), tl.int32)
    if MODE != MODE_EPILOGUE:
        for t in tl.range(t_begin, t_end, num_stages=STAGES):
            k = t * TILE_K + rk
            k_mask = k < k_stop
            if MODE == MODE_LOADS_W or MODE == MODE_LOADS_WXS:
                w_words = tl.reshape(w_desc.load([pid_g, pid_n * BLOCK_N, t * WORDS]), (BLOCK_N, WORDS))
                acc_words += tl.sum(w_words, axis=1)
                if MODE == MODE_LOADS_WXS:
                    x = tl.load(x_rows + k[None, :], mask=x_valid[:, None] & k_mask[None, :], other=0.0)
                    w_scale = tl.load(s_row + t, mask=t < t_end, other=0.0)
                    x_words = tl.sum(tl.sum(x.to(tl.int16, bitcast=True).to(tl.int32), axis=1), axis=0)
                    acc_words += x_words + w_scale.to(tl.int32, bitcast=True)
            else:
                if MODE == MODE_FULL:
                    w = tl.reshape(w_desc.load([pid_g, pid_n * BLOCK_N, t * TILE_K]), (BLOCK_N, TILE_K))
                elif MODE == MODE_MATH_L2:
                    w = tl.reshape(w_desc.load([0, 0, (t % 4) * TILE_K]), (BLOCK_N, TILE_K))  # 4 shared K blocks
                else:  # MODE_MATH_REG
                    w = tl.full((BLOCK_N, TILE_K), 0.5, tl.float32).to(tl.float8e4nv)
                x = tl.load(x_rows + k[None, :], mask=x_valid[:, None] & k_mask[None, :], other=0.0)
                w_scale = tl.load(s_row + t, mask=t < t_end, other=0.0)
                q, x_scale = _split_activation_joined(x.to(tl.float32))
                acc += tl.dot(w, tl.trans(q)) * (x_scale * w_scale)[None, :]
    if MODE == MODE_LOADS_W or MODE == MODE_LOADS_WXS or MODE == MODE_EPILOGUE:
        out = tl.zeros((BLOCK_M, BLOCK_N), tl.float32) + acc_words.to(tl.float32)[None, :]
    else:
        out = tl.trans(tl.sum(tl.reshape(acc, (BLOCK_N, 2, BLOCK_M)), axis=1))
    y_ptrs = y_ptr + pid_g * stride_yg + rm[:, None] * stride_ym + rn[None, :]
    y_mask = (rm < M)[:, None] & (rn < N)[None, :]
    part_base = partial_ptr + (pid_g * num_splits).to(tl.int64) * M * N
    tile_part = rm[:, None] * N + rn[None, :]
    tl.store(part_base + pid_k.to(tl.int64) * M * N + tile_part, out, mask=y_mask)
    _sum_split_partials(part_base, M * N, tile_part, y_ptrs, y_mask, counter_ptr, pid_g * tiles_per_group + pid,
                        num_splits, BLOCK_M, BLOCK_N)


@triton.jit
def _stream_read_kernel(src_ptr, sink_ptr, WORDS_PER_PROGRAM: tl.constexpr, CHUNK: tl.constexpr,
                        ONESHOT: tl.constexpr, PDL: tl.constexpr):
    """Program p xors the int32 words [p * WORDS_PER_PROGRAM, +WORDS_PER_PROGRAM) in CHUNK-word loads: all at once
    (ONESHOT, unrolled, every load in flight) or one chunk per loop iteration (no pipelining)."""
    pid = tl.program_id(0)
    _pdl_launch_dependents(PDL)
    _pdl_wait(PDL)
    base = src_ptr + pid.to(tl.int64) * WORDS_PER_PROGRAM
    acc = tl.zeros((CHUNK,), tl.int32)
    if ONESHOT:
        for i in tl.static_range(WORDS_PER_PROGRAM // CHUNK):
            acc ^= tl.load(base + i * CHUNK + tl.arange(0, CHUNK))
    else:
        for i in tl.range(0, WORDS_PER_PROGRAM // CHUNK, num_stages=1):
            acc ^= tl.load(base + i * CHUNK + tl.arange(0, CHUNK))
    tl.store(sink_ptr + pid, tl.xor_sum(acc, axis=0))


def split_of(cfg, k):
    """(tiles per split, split) as _launch computes them, in weight tiles of cfg.weight_tile_k columns."""
    k_blocks = triton.cdiv(k, g.FP8_BLOCK)
    split = max(1, min(cfg.split_k, k_blocks))
    per_split = triton.cdiv(triton.cdiv(k_blocks, split), cfg.k_unroll) * cfg.k_unroll
    split = triton.cdiv(k_blocks, per_split)
    blocks_per_tile = cfg.weight_tile_k // g.FP8_BLOCK
    return per_split // blocks_per_tile, split


def anatomy_call(o, w3, s3, out, *, block_m, block_n, tile_k, per_split_tiles, split, mode, stages, warps, pdl):
    """A closure launching _anatomy_kernel on one weight copy (its own partial buffer and split counters)."""
    m, groups, k = o.shape
    n = w3.shape[1]
    mode = int(getattr(mode, "value", mode))  # host side: the plain int of a mode constant
    words = mode in (MODE_LOADS_W.value, MODE_LOADS_WXS.value)
    if words:
        desc = TensorDescriptor.from_tensor(w3.view(torch.int32), [1, block_n, tile_k // 4])
    else:
        desc = TensorDescriptor.from_tensor(w3, [1, block_n, tile_k])
    n_tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    partial = torch.empty((groups, split, m, n), dtype=torch.float32, device=o.device)
    counters = torch.zeros(groups * n_tiles, dtype=torch.int32, device=o.device)
    grid = (n_tiles, split, groups)

    def call():
        _anatomy_kernel[grid](o, s3, out, partial, counters, desc, m, n, k, o.stride(0), o.stride(1),
                              s3.stride(0), s3.stride(1), out.stride(0), out.stride(1), per_split_tiles, split,
                              BLOCK_M=block_m, BLOCK_N=block_n, TILE_K=tile_k, MODE=mode, STAGES=stages, PDL=pdl,
                              num_warps=warps, num_stages=stages, launch_pdl=pdl)
        return out
    return call


def stream_call(w3, sink, programs, warps, oneshot, pdl):
    words = w3.view(torch.int32).reshape(-1)
    per_program = words.numel() // programs
    chunk = 4096  # 16 KiB: one FP8 weight tile

    def call():
        _stream_read_kernel[(programs,)](words, sink, WORDS_PER_PROGRAM=per_program, CHUNK=chunk, ONESHOT=oneshot,
                                         PDL=pdl, num_warps=warps, launch_pdl=pdl)
        return sink
    return call


def main(out_dir: str, smoke: bool) -> None:
    from sglang_sm120.kernels import dsv4

    t0 = time.time()
    budget_s = float(os.environ.get("ANATOMY_BUDGET_S", "170"))  # variants past it are skipped, not run
    dev = "cpu" if smoke else "cuda"
    pdl = g.pdl_supported(torch.device(dev))
    groups, rank, hidden = dsv4.O_GROUPS, dsv4.O_LORA_RANK, dsv4.HIDDEN_SIZE
    if smoke:
        groups, rank, hidden = 2, 256, 1024
    env = db.environment()
    copy_gbs = float("nan") if smoke else db.copy_bandwidth_gbs()
    print(f"eager copy bandwidth {copy_gbs:.1f} GB/s (read+write)", flush=True)
    weight_bytes = groups * rank * hidden
    copies = 1 if smoke else max(1, math.ceil(ROTATE_BYTES / weight_bytes))
    torch.manual_seed(0)
    base = (torch.randn(groups, rank, hidden, device=dev) * 0.5).to(g.FP8_DTYPE)
    scales = torch.exp2(torch.randint(-10, -5, (groups, rank // 128, hidden // 128), device=dev).float())
    weights = [(base.clone(), scales.clone()) for _ in range(copies)]
    forms, results, checks, failures = {}, [], {}, {}
    os.makedirs(out_dir, exist_ok=True)

    def write_report():
        report = dict(name=RUN_NAME, env=env, copy_bandwidth_gbs=round(copy_gbs, 1), weight_bytes=weight_bytes,
                      shapes=dict(groups=groups, rank=rank, hidden=hidden), default_forms=forms, checks=checks,
                      results=results, failures=failures, wall_s=round(time.time() - t0, 1))
        with open(os.path.join(out_dir, f"{RUN_NAME}.json"), "w") as f:
            json.dump(report, f, indent=1)
        lines = [f"# {RUN_NAME}", "", f"{env}", "", f"copy bandwidth {copy_gbs:.1f} GB/s (eager, read+write)", "",
                 "| variant | M | us | weight GB/s | % copy | note |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['label']} | {r['M']} | {r['us']} | {r['weight_GBps']} | {r['pct_copy']} | {r['note']} |"
                  for r in results]
        lines += ["", f"checks (relative error vs float32 reference): {checks}", f"failures: {failures}"]
        with open(os.path.join(out_dir, f"{RUN_NAME}.md"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def record(label, m, us, nbytes, note=""):
        gbs = nbytes / (us * 1e-6) / 1e9 if us == us else float("nan")
        row = dict(label=label, M=m, us=round(us, 3), weight_GBps=round(gbs, 1),
                   pct_copy=round(100 * gbs / copy_gbs, 1) if copy_gbs == copy_gbs and gbs == gbs else float("nan"),
                   note=note)
        results.append(row)
        print(f"{label:44s} M={m} {row['us']:8.3f} us  {row['weight_GBps']:7.1f} GB/s  {row['pct_copy']}% copy  "
              f"{note}", flush=True)

    def attempt(label, m, make_fns, nbytes=weight_bytes, note=""):
        key = f"{label} M={m}"
        if time.time() - t0 > budget_s:
            failures[key] = "skipped: past the script's time budget"
            print(f"SKIPPED {key}", flush=True)
            return
        try:
            record(label, m, db.time_rotating_calls(make_fns(), dry_run=smoke), nbytes, note)
        except Exception as exc:  # keep the other variants' numbers
            failures[key] = f"{type(exc).__name__}: {exc}"[:400]
            print(f"FAILED {key}: {failures[key]}", flush=True)
        write_report()

    def stride0_weight():
        """A [G, N, K] view of one K-long row (strides 0, 0, 1): every program reads the same 4 KiB."""
        row = torch.randn(hidden, device=dev).to(g.FP8_DTYPE)
        return row.as_strided((groups, rank, hidden), (0, 0, 1))

    for m in ((8,) if smoke else (8, 1)):
        o = torch.randn(m, groups, hidden, device=dev).to(torch.bfloat16)
        ref = g.reference_grouped_wo_a(o, base, scales)
        cfg = g.default_config(m, rank, hidden, groups)
        if smoke:  # the tiny weight would get another form: the full-shape M=8 form at a smaller split
            cfg = g.GemvConfig(8, 128, 2, True, 8, 3, fp8_mma=True, fp8_join=True, pdl=True)
        outs = [torch.full((m, groups, rank), float("nan"), dtype=torch.bfloat16, device=dev) for _ in weights]
        forms[m] = cfg.name
        print(f"M={m}: default_config {cfg.name}", flush=True)

        def check(label, fn):
            try:
                for t in outs:
                    t.fill_(float("nan"))
                checks[f"{label} M={m}"] = err = db.relative_error(fn().float(), ref)
                print(f"check {label} M={m}: rel err {err:.6f}", flush=True)
            except Exception as exc:
                failures[f"check {label} M={m}"] = f"{type(exc).__name__}: {exc}"[:400]
                print(f"FAILED check {label} M={m}: {exc}", flush=True)

        shipped = [lambda i=i, c=cfg: g.grouped_fp8_wo_a(o, *weights[i], out=outs[i], config=c) for i in range(copies)]
        check(f"shipped {cfg.name}", shipped[0])
        attempt(f"shipped {cfg.name}", m, lambda: shipped)
        per_split, split = split_of(cfg, hidden)
        if m == 8:
            common = dict(block_m=cfg.block_m, block_n=cfg.block_n, tile_k=128, per_split_tiles=per_split,
                          split=split, warps=cfg.num_warps, pdl=pdl)

            def variant(mode, stages=cfg.num_stages, **over):
                kw = {**common, **over}
                return [anatomy_call(o, *weights[i], outs[i], mode=mode, stages=stages, **kw) for i in range(copies)]
            check("replica_full", variant(0)[0])
            grid_note = f"grid {cfg.block_n}-col x split {split} x {groups} groups, {cfg.num_stages} TMA stages"
            for mode in range(6):
                attempt(MODE_NAMES[mode], m, lambda mode=mode: variant(mode), note=grid_note)
            programs = (groups * rank // cfg.block_n) * split
            sink = torch.empty(programs, dtype=torch.int32, device=dev)
            stream_note = f"{programs} programs x {weight_bytes // programs} B, {cfg.num_warps} warps"
            attempt("stream oneshot", m, lambda: [stream_call(w, sink, programs, cfg.num_warps, True, pdl)
                                                  for w, _ in weights], note=stream_note)
            tma_cfg = g.dataclasses.replace(cfg, w_tma=True)
            shipped_tma = [lambda i=i: g.grouped_fp8_wo_a(o, *weights[i], out=outs[i], config=tma_cfg)
                           for i in range(copies)]
            check(f"shipped {tma_cfg.name}", shipped_tma[0])
            attempt(f"shipped {tma_cfg.name}", m, lambda: shipped_tma)
            w0, y0 = stride0_weight(), outs[0]
            attempt(f"shipped math_l2 (stride-0 weight) {cfg.name}", m,
                    lambda: [lambda: g._launch(o, w0, scales, y0, m, rank, hidden, groups, cfg)],
                    note="the shipped cp.async kernel; every program reads the same 4 KiB row")
            for stages in (4, 6):
                attempt(f"loads_w {stages} stages", m, lambda s=stages: variant(1, stages=s))
            attempt("loads_w 256-col tiles", m, lambda: variant(1, block_n=256), note=f"half the programs, split {split}")
            attempt("full 256-col tiles", m, lambda: variant(0, block_n=256),
                    note=f"half the programs, split {split} (timing only: one scale per 256 rows)")
            h_tiles, h_split = split_of(dataclasses_replace(cfg, split_k=max(1, cfg.split_k // 2)), hidden)
            attempt("loads_w half split", m, lambda: variant(1, per_split_tiles=h_tiles, split=h_split),
                    note=f"split {h_split}, {h_tiles} tiles per program")
            attempt("stream loop", m, lambda: [stream_call(w, sink, programs, cfg.num_warps, False, pdl)
                                               for w, _ in weights], note=stream_note + ", 16 KiB per iteration")
        else:  # the 1-row FMA form: loads-only with its grid and tile, math with a stride-0 (L1-resident) weight
            def fma_loads(stages=cfg.num_stages):
                return [anatomy_call(o, *weights[i], outs[i], block_m=1, block_n=cfg.block_n,
                                     tile_k=cfg.weight_tile_k, per_split_tiles=per_split, split=split,
                                     mode=1, stages=stages, warps=cfg.num_warps, pdl=pdl)
                        for i in range(copies)]
            attempt("fma loads_w", m, fma_loads,
                    note=f"{cfg.block_n}x{cfg.weight_tile_k} TMA tiles, split {split}, {cfg.num_stages} stages")
            plain = g.dataclasses.replace(cfg, w_tma=False)
            w0, y0 = stride0_weight(), outs[0]
            attempt("fma math_l1 (shipped kernel, plain loads, stride-0 weight)", m,
                    lambda: [lambda: g._launch(o, w0, scales, y0, m, rank, hidden, groups, plain)],
                    note="every program reads the same 4 KiB row")
            w_plain = [lambda i=i: g.grouped_fp8_wo_a(o, *weights[i], out=outs[i], config=plain)
                       for i in range(copies)]
            attempt(f"shipped with plain loads {plain.name}", m, lambda: w_plain)
            attempt("fma loads_w 4 stages", m, lambda: fma_loads(4))
    write_report()
    print(f"done in {time.time() - t0:.1f} s; failures: {len(failures)}", flush=True)


def dataclasses_replace(cfg, **kw):
    return g.dataclasses.replace(cfg, **kw)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, checks only")
    args = ap.parse_args()
    main(args.out, args.smoke)
