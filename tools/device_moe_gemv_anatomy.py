#!/usr/bin/env python3
"""Anatomy of the MoE TMA GEMV at T=1, B=1 (session 14, issue 4): where its time goes, H200.

    python3 tools/device_moe_gemv_anatomy.py --out $OUT        # device (no carry: no upstream code)
    python3 tools/device_moe_gemv_anatomy.py --smoke --out DIR  # CPU interpreter, tiny shapes: the logic

Research only: nothing here is shipped. For each launch of the shipped TMA GEMV forward (gate/up
``_gate_up_gemv_tma_kernel``, then down ``_down_gemv_tma_kernel``) the script times, on the shipped grid
(active slots x column blocks, one program per 16 weight rows, K steps of 512, 4 warps), variants of one
generic kernel defined here:

- ``shipped``: the library's launch itself (``gemv_launches``), the forward checked against the float32 reference;
- ``replica``: the same K loop (``_gemv_rows_tma``, 3-stage TMA ring) in this script's kernel, checked against a
  float32 dequant-and-matmul of the touched expert rows -- the base the variants below differ from;
- ``empty``: the same grid, the slot lookup and the output store, no K loop -> launch + grid cost;
- ``loads rN`` / ``loads rows32``: the same TMA loads through an N-stage ring, the math replaced by an xor of
  the raw words into the accumulator (what keeps the loads alive) -> the memory path of this structure;
- ``math L2``: the full math on TMA loads of the same 16 rows of the expert for every program (L2-resident);
- ``math regs``: the full math on operands loaded once (xor-ed with the K offset each step so nothing is
  hoisted) -> the instruction ceiling with no memory traffic in the loop;
- ``stream k512`` / ``stream whole``: a plain ``tl.load`` read of the same bytes by the same programs (no TMA,
  no ring; K steps of 512, or the program's whole block in one load), xor-accumulated.

Every variant is timed like the per-launch breakdown of tools/device_moe_mxfp4_gemv.py: CUDA graphs of 12
calls rotating over 3 layer copies (each call reads other weights than the previous two), an L2 flush
before each replay, median of 15 replays. GB/s are over the bytes the shipped launch must read (weights +
E8M0 scales of the touched experts + activations), beside the copy bandwidth of the same run. Each compiled
variant's registers, spills, shared memory and PTX counts (TMA copies, mbarrier waits, shared loads) are
recorded so the structures can be compared.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    import os

    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# device_moe_mxfp4 makes sglang_sm120.kernels importable (ensure_kernels_importable) on import
from device_moe_mxfp4 import cycling, make_layer, make_routing, timer  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from sglang_sm120.kernels import moe_mxfp4 as moe  # noqa: E402
from sglang_sm120.kernels.dsv4 import HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, NUM_EXPERTS, SWIGLU_LIMIT, TOP_K  # noqa: E402
from sglang_sm120.kernels.moe_mxfp4 import (  # noqa: E402
    GEMV_ACT_SCALE, GEMV_GROUP_UNBIAS, _bf16_pair, _e8m0_to_f32, _gemv_group_dot, _gemv_group_sums, _gemv_rows_tma,
    _slot_expert_rows)

MODE_FULL, MODE_EMPTY, MODE_LOADS, MODE_MATH_L2, MODE_MATH_REGS, MODE_STREAM, MODE_F32X, MODE_MATH_REGS_F32X = range(8)
# the same modes as constexprs for the kernel (Triton kernels read only constexpr globals)
K_FULL: tl.constexpr = tl.constexpr(MODE_FULL)
K_LOADS: tl.constexpr = tl.constexpr(MODE_LOADS)
K_MATH_L2: tl.constexpr = tl.constexpr(MODE_MATH_L2)
K_MATH_REGS: tl.constexpr = tl.constexpr(MODE_MATH_REGS)
K_STREAM: tl.constexpr = tl.constexpr(MODE_STREAM)
K_F32X: tl.constexpr = tl.constexpr(MODE_F32X)
K_MATH_REGS_F32X: tl.constexpr = tl.constexpr(MODE_MATH_REGS_F32X)
DEADLINE_S = 150  # later variants are skipped (a 200 s device limit)


@triton.jit
def _step_math(q_words, s, xw_words, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """The arithmetic of moe_mxfp4._gemv_tma_step on operands already in registers."""
    q = tl.reshape(q_words, [ROWS, BLOCK_K // 32, 4])
    xw = tl.reshape(xw_words, [1, BLOCK_K // 32, 4, 2, 2])
    x_even, x_odd = tl.split(xw)
    p0, p2 = tl.split(x_even)
    p1, p3 = tl.split(x_odd)
    x0, x1 = _bf16_pair(p0)
    x2, x3 = _bf16_pair(p1)
    x4, x5 = _bf16_pair(p2)
    x6, x7 = _bf16_pair(p3)
    return (_gemv_group_dot(q, x0, x1, x2, x3, x4, x5, x6, x7, False) * GEMV_GROUP_UNBIAS) * _e8m0_to_f32(s)


@triton.jit
def _loads_rows_tma(w_desc, s_desc, x_desc, w_row, x_row, k_len, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                    RING: tl.constexpr):
    """The TMA ring of _gemv_rows_tma with the math replaced by an xor of the raw words."""
    acc = tl.zeros([ROWS, BLOCK_K // 8], dtype=tl.int32)
    acc_s = tl.zeros([ROWS, BLOCK_K // 32], dtype=tl.int32)
    acc_x = tl.zeros([1, BLOCK_K // 2], dtype=tl.int32)
    w_row = w_row.to(tl.int32)
    x_row = x_row.to(tl.int32)
    for k0 in tl.range(0, k_len, BLOCK_K, num_stages=RING):
        acc ^= w_desc.load([w_row, k0 // 8])
        acc_s ^= s_desc.load([w_row, k0 // 32]).to(tl.int32)
        acc_x ^= x_desc.load([x_row, k0 // 2])
    return (tl.xor_sum(acc, 1) ^ tl.xor_sum(acc_s, 1) ^ tl.xor_sum(acc_x, 1)).to(tl.float32)


@triton.jit
def _math_regs_rows(w_desc, s_desc, x_desc, w_row, x_row, k_len, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """The full math of every K step on the first step's operands, loaded once; each step xors the K
    offset into them so the compiler cannot hoist the arithmetic out of the loop."""
    w_row = w_row.to(tl.int32)
    x_row = x_row.to(tl.int32)
    q = w_desc.load([w_row, 0])
    s = s_desc.load([w_row, 0]).to(tl.int32)
    xw = x_desc.load([x_row, 0])
    acc = tl.zeros([ROWS, BLOCK_K // 32], dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        acc += _step_math(q ^ k0, s ^ (k0 // BLOCK_K), xw ^ k0, ROWS, BLOCK_K)
    return tl.sum(acc, 1)


@triton.jit
def _x_f32_pointers(xf_ptr, x_row, k_len, BLOCK_K: tl.constexpr):
    """[1, G, 4] pointers to each weight word's first value in a float32 word-pair-order row (moe_mxfp4's
    x_f32 layout: value 8w + j of a 32-group at 4j + w); value j of the word is 4j floats further."""
    g = tl.arange(0, BLOCK_K // 32)
    offs = g[:, None] * 32 + tl.arange(0, 4)[None, :]
    return xf_ptr + x_row.to(tl.int64) * k_len + offs[None, :, :]


@triton.jit
def _gemv_rows_tma_f32x(w_desc, s_desc, xf_ptr, w_row, x_row, k_len, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                        RING: tl.constexpr):
    """_gemv_rows_tma with the activations as float32 in the word-pair order (plain loads, cached) and the
    nibble pairs placed by one multiply (moe_mxfp4's x_f32 decode); weights and scales by the TMA ring."""
    acc = tl.zeros([ROWS, BLOCK_K // 32], dtype=tl.float32)
    x_ptrs = _x_f32_pointers(xf_ptr, x_row, k_len, BLOCK_K)
    w_row = w_row.to(tl.int32)
    for k0 in tl.range(0, k_len, BLOCK_K, num_stages=RING):
        q = tl.reshape(w_desc.load([w_row, k0 // 8]), [ROWS, BLOCK_K // 32, 4])
        s = s_desc.load([w_row, k0 // 32])
        acc += (_gemv_group_sums(q, x_ptrs + k0, True) * GEMV_GROUP_UNBIAS) * _e8m0_to_f32(s)
    return tl.sum(acc, 1)


@triton.jit
def _math_regs_rows_f32x(w_desc, s_desc, xf_ptr, w_row, x_row, k_len, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """_math_regs_rows for the x_f32 decode: the first step's words, scales and activations loaded once."""
    w_row = w_row.to(tl.int32)
    q = w_desc.load([w_row, 0])
    s = s_desc.load([w_row, 0]).to(tl.int32)
    x_ptrs = _x_f32_pointers(xf_ptr, x_row, k_len, BLOCK_K)
    x0 = tl.load(x_ptrs)
    x1 = tl.load(x_ptrs + 4)
    x2 = tl.load(x_ptrs + 8)
    x3 = tl.load(x_ptrs + 12)
    x4 = tl.load(x_ptrs + 16)
    x5 = tl.load(x_ptrs + 20)
    x6 = tl.load(x_ptrs + 24)
    x7 = tl.load(x_ptrs + 28)
    acc = tl.zeros([ROWS, BLOCK_K // 32], dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        qk = tl.reshape(q ^ k0, [ROWS, BLOCK_K // 32, 4])
        acc += ((_gemv_group_dot(qk, x0, x1, x2, x3, x4, x5, x6, x7, True) * GEMV_GROUP_UNBIAS)
                * _e8m0_to_f32(s ^ (k0 // BLOCK_K)))
    return tl.sum(acc, 1)


@triton.jit
def _stream_rows(w_ptr, s_ptr, x_ptr, w_row, x_row, k_len, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Plain tl.load of the same bytes (weights, scales, activations), xor-accumulated; no TMA, no ring."""
    rows = w_row + tl.arange(0, ROWS).to(tl.int64)
    words = tl.arange(0, BLOCK_K // 8)
    groups = tl.arange(0, BLOCK_K // 32)
    halves = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros([ROWS, BLOCK_K // 8], dtype=tl.int32)
    acc_s = tl.zeros([ROWS, BLOCK_K // 32], dtype=tl.int32)
    acc_x = tl.zeros([BLOCK_K // 2], dtype=tl.int32)
    for k0 in range(0, k_len, BLOCK_K):
        acc ^= tl.load(w_ptr + rows[:, None] * (k_len // 8) + k0 // 8 + words[None, :])
        acc_s ^= tl.load(s_ptr + rows[:, None] * (k_len // 32) + k0 // 32 + groups[None, :]).to(tl.int32)
        acc_x ^= tl.load(x_ptr + x_row * (k_len // 2) + k0 // 2 + halves)
    return (tl.xor_sum(acc, 1) ^ tl.xor_sum(acc_s, 1) ^ tl.xor_sum(acc_x, 0)).to(tl.float32)


@triton.jit
def _anatomy_kernel(w_desc, s_desc, x_desc, w_ptr, s_ptr, x_ptr, xf_ptr, sorted_rows_ptr, expert_start_ptr,
                    active_experts_ptr, num_active_ptr, y_ptr, rows_per_expert, k_len, X_ROW_DIV: tl.constexpr,
                    ROWS: tl.constexpr, BLOCK_K: tl.constexpr, RING: tl.constexpr, MODE: tl.constexpr):
    """The shipped TMA GEMV launches' grid and slot walk (one program per ROWS weight rows of an active
    expert, its routed rows one per pass) around the K loop that MODE picks; y [rows, rows_per_expert] fp32."""
    slot = tl.program_id(0)
    if slot >= tl.load(num_active_ptr):
        return
    expert, row_begin, row_end = _slot_expert_rows(slot, active_experts_ptr, expert_start_ptr)
    if MODE == K_MATH_L2:  # every program of the slot reads its expert's first rows: L2-resident
        w_row = expert * rows_per_expert
    else:
        w_row = expert * rows_per_expert + tl.program_id(1) * ROWS
    cols = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    for m in range(row_begin, row_end):
        row = tl.load(sorted_rows_ptr + m)
        x_row = row // X_ROW_DIV
        if MODE == K_FULL or MODE == K_MATH_L2:
            out = _gemv_rows_tma(w_desc, s_desc, x_desc, w_row, x_row, 0, k_len, ROWS, BLOCK_K, RING)
        elif MODE == K_LOADS:
            out = _loads_rows_tma(w_desc, s_desc, x_desc, w_row, x_row, k_len, ROWS, BLOCK_K, RING)
        elif MODE == K_MATH_REGS:
            out = _math_regs_rows(w_desc, s_desc, x_desc, w_row, x_row, k_len, ROWS, BLOCK_K)
        elif MODE == K_F32X:
            out = _gemv_rows_tma_f32x(w_desc, s_desc, xf_ptr, w_row, x_row, k_len, ROWS, BLOCK_K, RING)
        elif MODE == K_MATH_REGS_F32X:
            out = _math_regs_rows_f32x(w_desc, s_desc, xf_ptr, w_row, x_row, k_len, ROWS, BLOCK_K)
        elif MODE == K_STREAM:
            out = _stream_rows(w_ptr, s_ptr, x_ptr, w_row, x_row, k_len, ROWS, BLOCK_K)
        else:
            out = tl.zeros([ROWS], dtype=tl.float32) + row.to(tl.float32)
        tl.store(y_ptr + row.to(tl.int64) * rows_per_expert + cols, out)


# (label, MODE, rows per program, K step (0: the whole K), ring stages, num_stages of the launch, warps)
VARIANTS = [
    ("replica r3", MODE_FULL, 16, 512, 3, None, 4),
    ("empty", MODE_EMPTY, 16, 512, 3, None, 4),
    ("loads r3", MODE_LOADS, 16, 512, 3, None, 4),
    ("math regs", MODE_MATH_REGS, 16, 512, 1, 1, 4),
    ("math L2 r3", MODE_MATH_L2, 16, 512, 3, None, 4),
    ("stream k512", MODE_STREAM, 16, 512, 1, 1, 4),
    ("stream whole", MODE_STREAM, 16, 0, 1, 1, 4),
    ("loads r2", MODE_LOADS, 16, 512, 2, None, 4),
    ("loads r4", MODE_LOADS, 16, 512, 4, None, 4),
    ("loads r6", MODE_LOADS, 16, 512, 6, None, 4),
    ("loads rows32 r3", MODE_LOADS, 32, 512, 3, None, 4),
    ("replica rows32 r3", MODE_FULL, 32, 512, 3, None, 4),
    ("replica r4", MODE_FULL, 16, 512, 4, None, 4),
    # run 2 (after run 1: math regs / math L2 within 5 % of the replica, loads alone 0.62-0.71x of it): the x_f32
    # decode (fewer instructions per value) on the same ring, its register-operand ceiling, the ceilings at 8
    # warps (issue-bound math does not speed up with more warps), the replica at 2 stages and 8 warps
    ("f32x r3", MODE_F32X, 16, 512, 3, None, 4),
    ("f32x r2", MODE_F32X, 16, 512, 2, None, 4),
    ("math regs f32x", MODE_MATH_REGS_F32X, 16, 512, 1, 1, 4),
    ("math regs w8", MODE_MATH_REGS, 16, 512, 1, 1, 8),
    ("math regs f32x w8", MODE_MATH_REGS_F32X, 16, 512, 1, 1, 8),
    ("replica r2", MODE_FULL, 16, 512, 2, None, 4),
    ("replica r3 w8", MODE_FULL, 16, 512, 3, None, 8),
    ("f32x r3 w8", MODE_F32X, 16, 512, 3, None, 8),
    ("loads rows32 r2", MODE_LOADS, 32, 512, 2, None, 4),
]
SMOKE_BLOCK_K = 512  # the scale blocks' 16 bytes (a TMA minimum)


def kernel_stats(compiled) -> dict:
    """Registers, spills, shared memory and a few PTX counts of a compiled variant (empty under the interpreter)."""
    try:
        ptx = compiled.asm.get("ptx", "")
        return {"regs": compiled.n_regs, "spills": compiled.n_spills, "smem_B": compiled.metadata.shared,
                "ptx_tma": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
                "ptx_mbar_wait": len(re.findall(r"mbarrier\.try_wait", ptx)),
                "ptx_ld_shared": len(re.findall(r"ld\.shared", ptx)),
                "ptx_ld_global": len(re.findall(r"ld\.global", ptx))} | sass_counts(compiled)
    except Exception as exc:  # the interpreter returns no compiled kernel
        return {"stats_error": type(exc).__name__}


SASS_INT_OPS = ("LOP3", "SHF", "IMAD", "IADD3", "PRMT", "LEA", "SHL", "SHR", "ISETP", "SEL", "I2F", "F2I")


def sass_counts(compiled) -> dict:
    """Static SASS instruction counts of the whole kernel (the unrolled K step dominates): all, FP32 FFMA/FMUL/FADD,
    integer / logic / select ops, shared loads. Triton's ``asm["sass"]`` (cuobjdump, reformatted by
    triton.tools.disasm) has one ``<control bits>\\t<instruction>`` line per instruction. (Run 12b parsed it as raw
    cuobjdump output, matched nothing and recorded zeros.)"""
    try:
        sass = compiled.asm["sass"]
    except Exception as exc:
        return {"sass_error": f"{type(exc).__name__}: {str(exc)[:80]}"}
    ops = []
    for line in sass.splitlines():
        words = line.split("\t", 1)[1].split() if "\t" in line else []
        if words and words[0].startswith("@"):  # predicate
            words = words[1:]
        if words:
            ops.append(words[0].split(".")[0])
    return {"sass": len(ops), "sass_fp32": sum(op in ("FFMA", "FMUL", "FADD") for op in ops),
            "sass_int": sum(op in SASS_INT_OPS for op in ops), "sass_lds": sum(op == "LDS" for op in ops)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--launches", default="gate_up,down")
    parser.add_argument("--name", default="moe_mxfp4-h200-run12-anatomy", help="result name")
    parser.add_argument("--only", default=None, help="comma-separated variant labels to run (default: all)")
    args = parser.parse_args()
    from sglang_sm120.kernels.harness.devicebench import BenchResult, copy_bandwidth_gbs, relative_error

    if args.smoke:
        # TMA: 16-byte scale row strides need K >= 512, so the smoke runs the gate/up launch only (K = H) on 4 column blocks
        device, num_experts, hidden, inter, copies = "cpu", 8, 512, 32, 1
        args.launches = "gate_up"
    else:
        device, num_experts, hidden, inter, copies = "cuda", NUM_EXPERTS, HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, 3
    run = timer(args.smoke)
    t_start = time.time()
    copy_gbs = 0.0 if args.smoke else copy_bandwidth_gbs()
    result = BenchResult(
        name=args.name,
        title="MoE TMA GEMV anatomy at T=1, B=1 (gate/up and down launches): bytes vs math, DSv4-Flash shapes, H200",
        columns=["launch", "variant", "us", "GB/s", "%copy", "rel_err", "regs", "spills", "smem_B", "ptx_tma",
                 "ptx_mbar_wait", "ptx_ld_shared", "ptx_ld_global", "sass", "sass_fp32", "sass_int", "sass_lds", "warps",
                 "programs"])
    result.extra.update({"copy bandwidth (GB/s, read+write, eager)": round(copy_gbs, 1)})
    if not args.smoke:
        result.extra["SMs"] = torch.cuda.get_device_properties(0).multi_processor_count

    layers = [make_layer(num_experts, hidden, inter, device, seed=100 + c) for c in range(copies)]
    ckpt = [t.clone() for t in layers[0]]
    for layer in layers:
        moe.repack_w13_(layer[0], layer[1])
    x, weights, ids = make_routing(1, num_experts, hidden, device, seed=2)
    num_rows = ids.numel()
    sorted_rows, expert_start, active_experts, num_active = moe.route(ids, num_experts)
    slots = min(num_rows, num_experts)
    experts = ids.flatten().long()
    act = (torch.randn(num_rows, inter, device=device) * 0.5).to(torch.bfloat16)  # the down launch's input
    from triton.tools.tensor_descriptor import TensorDescriptor

    # per launch: (weights int32 [E*rows, K/8], scales uint8 [E*rows, K/32], activations int32 [n, K/2],
    # rows per expert, K, activation row divisor, the float32 reference of its output [num_rows, rows per expert])
    def launch_operands(name, layer):
        if name == "gate_up":
            return (layer[0].view(torch.int32).view(-1, hidden // 8), moe.scale_bytes(layer[1]).view(-1, hidden // 32),
                    x.view(torch.int32), 2 * inter, hidden, TOP_K)
        return (layer[2].view(torch.int32).view(-1, inter // 8), moe.scale_bytes(layer[3]).view(-1, inter // 32),
                act.view(torch.int32), hidden, inter, 1)

    def reference(name):
        w_packed, w_scale = (layers[0][0], layers[0][1]) if name == "gate_up" else (layers[0][2], layers[0][3])
        rows_x = x[torch.arange(num_rows, device=device) // TOP_K] if name == "gate_up" else act
        out = torch.empty(num_rows, w_packed.shape[1], dtype=torch.float32, device=device)
        for r in range(num_rows):
            dense = moe.reference_dequant_mxfp4(w_packed[experts[r]], w_scale[experts[r]])
            out[r] = dense @ rows_x[r].float()
        return out

    def x_f32_order(rows_bf16):
        """bf16 rows -> float32 times 2**GEMV_ACT_SHIFT in moe_mxfp4's word-pair order (value k of a row at
        (k // 32) * 32 + (k % 8) * 4 + (k % 32) // 8), what its x_f32 GEMV reads."""
        k = torch.arange(rows_bf16.shape[1], device=device)
        out = torch.empty(rows_bf16.shape, dtype=torch.float32, device=device)
        out[:, (k // 32) * 32 + (k % 8) * 4 + (k % 32) // 8] = rows_bf16.float() * GEMV_ACT_SCALE.value
        return out

    # the shipped forward, checked as tools/device_moe_mxfp4_gemv.py checks it (B = 1: the TMA GEMV default)
    shipped = None
    if not args.smoke:
        ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
        outs = [torch.empty_like(x) for _ in layers]
        shipped = [dict(moe.gemv_launches(x, *layer, weights, ids, o, SWIGLU_LIMIT)) for layer, o in zip(layers, outs)]
        for step in moe.GEMV_LAUNCH_NAMES:
            shipped[0][step]()
        result.extra["shipped forward rel_err vs reference_moe_mxfp4"] = relative_error(outs[0], ref)
        result.extra["shipped configs"] = str(moe.gemv_configs(num_rows, inter))
    del ckpt

    for name in args.launches.split(","):
        w, s, xs, rows_per_expert, k_len, x_div = launch_operands(name, layers[0])
        read_bytes = (slots * rows_per_expert * (k_len // 2 + k_len // 32)
                      + (1 if name == "gate_up" else num_rows) * k_len * 2)
        ref_out = reference(name)
        xf = x_f32_order(x if name == "gate_up" else act)
        result.extra[f"{name}: bytes read per call (touched weights + scales + activations)"] = read_bytes

        def record(variant, us, err=float("nan"), stats=None, programs=0):
            gbs = read_bytes / (us * 1e-6) / 1e9 if us == us and us > 0 else float("nan")
            row = {"launch": name, "variant": variant, "us": us, "GB/s": gbs,
                   "%copy": 100 * gbs / copy_gbs if copy_gbs else 0.0, "rel_err": err, "programs": programs}
            row.update({k: v for k, v in (stats or {}).items() if k in result.columns})
            result.add(**row)
            if stats and "sass_error" in stats:
                result.notes.append(f"{name} {variant}: SASS counts unavailable ({stats['sass_error']})")
            print(f"{name} {variant}: {us:.2f} us, {gbs:.0f} GB/s, err {err:.2e} {stats}", flush=True)

        if shipped is not None:
            us = run(cycling(lambda launches: launches[name](), shipped))
            record("shipped", us)
        for label, mode, rows, block_k, ring, num_stages, warps in VARIANTS:
            if args.only and label not in args.only.split(","):
                continue
            if time.time() - t_start > DEADLINE_S:
                result.notes.append(f"{name} {label}: skipped, past {DEADLINE_S} s into the run")
                continue
            if args.smoke:
                block_k = min(block_k, SMOKE_BLOCK_K)
            step = block_k or k_len
            try:
                y = torch.full((num_rows, rows_per_expert), float("nan"), dtype=torch.float32, device=device)
                per_copy = []
                for layer in layers:
                    w, s, xs, *_ = launch_operands(name, layer)
                    descs = (TensorDescriptor.from_tensor(w, [rows, step // 8]),
                             TensorDescriptor.from_tensor(s, [rows, step // 32]),
                             TensorDescriptor.from_tensor(xs, [1, step // 2]))
                    per_copy.append((descs, w, s, xs))
                grid = (slots, rows_per_expert // rows)
                options = {"num_warps": warps} | ({} if num_stages is None else {"num_stages": num_stages})
                compiled = []

                def launch(operands, grid=grid, rows=rows, step=step, ring=ring, mode=mode, options=options):
                    descs, w, s, xs = operands
                    compiled.append(_anatomy_kernel[grid](
                        *descs, w, s, xs, xf, sorted_rows, expert_start, active_experts, num_active, y, rows_per_expert,
                        k_len, X_ROW_DIV=x_div, ROWS=rows, BLOCK_K=step, RING=ring, MODE=mode, **options))
                launch(per_copy[0])
                checked = mode in (MODE_FULL, MODE_F32X)
                err = relative_error(y, ref_out) if checked else float("nan")
                if not checked and not bool(torch.isfinite(y).all()):
                    raise RuntimeError("output rows left unwritten (NaN)")
                us = run(cycling(launch, per_copy))
                record(label, us, err, kernel_stats(compiled[0]) | {"warps": warps}, grid[0] * grid[1])
            except Exception as exc:  # one broken variant must not lose the run
                result.notes.append(f"{name} {label}: {type(exc).__name__}: {str(exc)[:300]}")
                print("FAILED", name, label, exc, flush=True)
            result.extra["wall seconds"] = round(time.time() - t_start, 1)
            result.write(args.out)  # partial results survive a timeout
    result.notes.append("each variant alone in CUDA graphs of 12 calls over 3 layer copies (weights and descriptors "
                        "rotate), L2 flushed before each replay, median of 15 replays; GB/s over the bytes the "
                        "shipped launch reads; rel_err: the replica's gate/up (pre-SwiGLU) / down (pre-routing-weight) "
                        "rows against a float32 dequant @ activations; regs..ptx_*: the compiled variant (sm_90a)")
    result.finish(args.out, t_start)


if __name__ == "__main__":
    main()
