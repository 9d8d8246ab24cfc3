#!/usr/bin/env python3
"""SASS instructions in the inner K loop of the MXFP4 decode GEMMs, per weight-upcast variant (AOT, no GPU).

    .venv/bin/python tools/moe_mxfp4_sass_loop.py [--arch 90 --arch 120] [--upcast split_bf16 ...]
    .venv/bin/python tools/moe_mxfp4_sass_loop.py --pairs [--arch 120]   # the pairs decode's AOT configs
    .venv/bin/python tools/moe_mxfp4_sass_loop.py --pairs-tma [--arch 90]  # run 18: the TMA swap-AB tiles, sub_k forms
    .venv/bin/python tools/moe_mxfp4_sass_loop.py --gemv-f16 [--arch 90]   # run 19: the shipped fp16 TMA GEMV tiles
    .venv/bin/python tools/moe_mxfp4_sass_loop.py --pairs-rows [--arch 90]  # run 20: the tiles by routed rows (block_m 8)
    .venv/bin/python tools/moe_mxfp4_sass_loop.py --prefill [--arch 120]    # stop 40: prefill pair order vs byte planes

Compiles ``_gate_up_kernel`` / ``_down_kernel`` at the decode tiles with each ``moe_mxfp4.UPCASTS``
variant (same divisibility hints as the JIT), finds the innermost backward branch whose body holds the
tensor-core MMA (the K loop), and prints its instruction count, per weight byte of one K step (packed
bytes + E8M0 scale bytes of the program's tile), and its opcode histogram. One loop iteration is one
``BLOCK_K`` step of one warp, so lower is fewer issue slots per streamed byte.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import typing

from sglang_sm120.kernels import moe_mxfp4 as moe
from sglang_sm120.kernels.harness import aot

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)(.*)$")
TILES = {"gate_up": moe.GemmConfig(16, 32, 128, 4, 3), "down": moe.GemmConfig(16, 64, 128, 4, 3)}  # T=1 decode


def sass_lines(cfg: aot.AotConfig, arch: int):
    compiled = aot.compile_kernel(cfg, arch)  # as the AOT check compiles it (register cap included)
    proc = aot._run_tool([aot._triton_tool("cuobjdump"), "-sass"], compiled.asm["cubin"], ".cubin")
    rows = []
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return rows, compiled


def mma_loop(rows, marks=("HMMA", "HGMMA")):
    """The innermost backward branch's body holding one of the opcodes ``marks`` (the K loop)."""
    loops = []
    for addr, op, rest in rows:
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < addr:
            body = [r for r in rows if int(target.group(1), 16) <= r[0] <= addr]
            if any(o.startswith(marks) for _, o, _ in body):
                loops.append(body)
    return min(loops, key=len) if loops else []


class LoopReport(typing.NamedTuple):
    rows: list  # the kernel's SASS rows (sass_lines)
    compiled: object  # Triton's compiled kernel
    body: list  # the K loop's rows (mma_loop)
    hist: collections.Counter  # the K loop's opcodes by base name
    res: dict  # ptxas registers / spills (empty unless asked)


def loop_report(cfg: aot.AotConfig, arch: int, marks=("HMMA", "HGMMA"), resources: bool = True) -> LoopReport:
    """Compile ``cfg`` for ``arch`` and take its K loop (the innermost loop holding one of ``marks``) apart: the one
    step every mode of this tool starts from."""
    rows, compiled = sass_lines(cfg, arch)
    body = mma_loop(rows, marks)
    hist = collections.Counter(op.split(".")[0] for _, op, _ in body)
    res = aot.ptxas_resources(compiled.asm["ptx"], arch) if resources else {}
    return LoopReport(rows, compiled, body, hist, res)


def config(kind: str, upcast: str, tile: moe.GemmConfig) -> aot.AotConfig:
    constexprs = {"BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n, "BLOCK_K": tile.block_k, "ACT_MXFP8": False,
                  "DOT_SCALED": upcast == "dot_scaled", "SPLIT_NIBBLES": moe._SPLIT_NIBBLES.get(upcast, 0), "SPLIT_K": 1, "TOP_K": moe.TOP_K}
    constexprs["ZERO_OUT" if kind == "gate_up" else "ATOMIC_OUT"] = False
    if kind == "gate_up":
        kernel, sig = moe._gate_up_kernel, moe._gate_up_sig(False)
    else:
        kernel, sig = moe._down_kernel, moe._down_sig(False)
    return aot.AotConfig(f"{kind}_{upcast}", kernel, sig, constexprs, tile.num_warps, tile.num_stages,
                         ("hidden", "inter"))


def pairs_loops(archs) -> None:
    """The pairs decode's AOT configs (every shipped and selectable form): K-loop instructions per weight
    byte of a K step and the opcode histogram (round 9: the scale on the pair words removes the half-swap PRMTs)."""
    for cfg in moe.aot_configs():
        if "_pairs_" not in cfg.name:
            continue
        rows_w = 2 * cfg.constexprs["BLOCK_N"] if cfg.kernel is moe._gate_up_pairs_kernel else cfg.constexprs["BLOCK_N"]
        block_k = cfg.constexprs["BLOCK_K"]
        step_bytes = rows_w * block_k // 2 + rows_w * block_k // moe.MXFP4_GROUP
        for arch in archs:
            rows, compiled, body, hist, _ = loop_report(cfg, arch, resources=False)
            print(json.dumps({"config": cfg.name, "arch": arch, "loop_instructions": len(body),
                              "per_weight_byte": round(len(body) / step_bytes, 4), "kernel_total": len(rows),
                              "smem": compiled.metadata.shared, "top": hist.most_common(10)}), flush=True)


def _pairs_tma_aot_config(kind: str, cfg: moe.PairsConfig) -> tuple[int, aot.AotConfig]:
    """(weight rows of one program, the AotConfig) of a TMA-fed swap-AB pairs tile (PairsConfig with tma_ring): the
    gate/up launch (natural-order SwiGLU rows off) or the down launch, as the registry builds them."""
    kernel = moe._gate_up_pairs_tma_kernel if kind == "gate_up" else moe._down_pairs_tma_kernel
    rows_w = 2 * cfg.block_n if kind == "gate_up" else cfg.block_n
    constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                  "MUL_PAIRS": cfg.mul_pairs, "SCALE_BF16": 3, "RING": cfg.tma_ring, "SUB_K": cfg.mma_k(cfg.block_k)}
    if kind == "gate_up":
        constexprs.update(TOP_K=moe.TOP_K, NATURAL_ACT=False)
    return rows_w, aot.AotConfig(f"{kind}_{cfg.label()}", kernel,
                                 moe._pairs_tma_sig(kind, rows_w, cfg.block_k, cfg.mma_k(cfg.block_k)), constexprs,
                                 cfg.num_warps, cfg.tma_ring, ("hidden", "inter"))


def pairs_tma_loops(archs) -> None:
    """Run 18: the TMA-fed swap-AB tiles (PAIRS_TMA_TILES) with a K step as 1 / 2 / 4 MMAs (sub_k), 3 stages, 64 gate/up
    rows on 4 warps, 32 down rows on 2 warps: registers, spills, shared memory, K-loop instructions per weight word
    of a program's K step (int32 words: 8 values) per thread (the loop runs once per warp, so the count per word per
    thread is loop instructions x warps / words of the step)."""
    import dataclasses

    gu, dn = moe.PAIRS_TMA_TILES
    forms = [(gu, dn)]
    for k in (256, 128):
        forms.append((dataclasses.replace(gu, sub_k=k), dataclasses.replace(dn, sub_k=k)))
    forms.append((dataclasses.replace(gu, sub_k=128, block_n=32, num_warps=4),
                  dataclasses.replace(dn, sub_k=128, block_n=32, num_warps=2)))
    for pair in forms:
        for kind, cfg in zip(("gate_up", "down"), pair):
            rows_w, aot_cfg = _pairs_tma_aot_config(kind, cfg)
            words = rows_w * cfg.block_k // 8
            for arch in archs:
                rows, compiled, body, hist, res = loop_report(aot_cfg, arch)
                print(json.dumps({"config": aot_cfg.name, "arch": arch, "regs": res.get("registers"),
                                  "spills": res.get("spill_store_bytes"), "smem": compiled.metadata.shared,
                                  "loop_instructions": len(body),
                                  "per_word_per_thread": round(len(body) * cfg.num_warps * 32 / words / 32, 3),
                                  "top": hist.most_common(14)}), flush=True)


def pairs_rows_loops(archs) -> None:
    """Run 20: the tiles of PAIRS_TMA_ROWS_WHERE (8 routed rows per pass, 64 weight rows on 2 warps) beside the 16-row
    tiles they replaced and the shipped gate/up tile at 8 rows: registers, spills, shared memory, HMMAs in the kernel,
    and the K-loop body (the innermost loop holding an MMA: one 512-wide K step of one warp without sub_k; with sub_k
    the body found is a part of the step, so compare those by registers and device time)."""
    import dataclasses

    gu, dn = moe.PAIRS_TMA_TILES
    old_down = dataclasses.replace(dn, block_n=32, num_warps=2, sub_k=128)  # the run-18 down tile
    forms = [("gate_up", gu), ("gate_up", dataclasses.replace(gu, block_m=8)), ("down", old_down)]
    forms += [(kind, cfg) for tiles in dict.fromkeys(t for *_, t in moe.PAIRS_TMA_ROWS_WHERE)
              for kind, cfg in zip(("gate_up", "down"), tiles)]
    for kind, cfg in dict.fromkeys(forms):
        _, aot_cfg = _pairs_tma_aot_config(kind, cfg)
        for arch in archs:
            rows, compiled, body, hist, res = loop_report(aot_cfg, arch)
            print(json.dumps({"config": aot_cfg.name, "arch": arch, "regs": res.get("registers"),
                              "spills": res.get("spill_store_bytes"), "smem": compiled.metadata.shared,
                              "kernel_hmma": sum(op.startswith("HMMA") for _, op, _ in rows),
                              "loop_instructions": len(body), "loop_hmma": hist.get("HMMA", 0),
                              "top": hist.most_common(8)}), flush=True)


H200_SMS, H200_CLOCK_HZ, SCHEDULERS_PER_SM = 132, 1.98e9, 4
# (T, B) -> programs of the shipped grid (gate/up: active experts x I / block_n; down: experts x H / block_n, or the
# persistent grid's work items) are derived below from the shapes: B = 1 touches 6 experts, one routed row each
GEMV_F16_CASES = ((1, 1), (1, 8), (4, 1))


def gemv_f16_loops(archs) -> None:
    """Run 19: the shipped fp16 TMA GEMV tiles (GEMV_TMA_F16_WHERE) at GEMV_F16_CASES: registers, shared memory, K-loop
    SASS instructions (the innermost loop holding HFMA2; one iteration = one 512-wide K step of one warp) per weight word
    per thread, the opcode histogram, and the issue floor of the launch on the H200 at T=1: loop instructions x warps x
    K steps x routed rows x programs / (SMs x 4 schedulers x 1.98 GHz), i.e. the time if every scheduler issued one
    loop instruction every cycle (no stalls, nothing outside the loop). Round 26 (the pairs built per byte, the only
    fp16 decode since): T=1 B=1 gate/up 27.7 -> 23.7 loop instructions per word on sm_90a (commit 0dfc461 had both
    forms, ``--f16-bytes on|off``)."""
    from sglang_sm120.kernels.dsv4 import HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, TOP_K

    for tp, batch in GEMV_F16_CASES:
        inter = MOE_INTERMEDIATE_SIZE // tp
        gu, dn = moe.gemv_configs(batch * TOP_K, inter)
        experts = min(batch * TOP_K, moe.NUM_EXPERTS)  # distinct experts at most; B = 1: exactly 6
        for kind, cfg in (("gate_up", gu), ("down", dn)):
            name = f"moe_mxfp4_{kind}_gemvtma_{cfg.label()}"
            aot_cfg = next(c for c in moe.aot_configs() if c.name == name)
            rows_w = 2 * cfg.block_n if kind == "gate_up" else cfg.block_n
            k_len = HIDDEN_SIZE if kind == "gate_up" else inter
            programs = experts * (inter if kind == "gate_up" else HIDDEN_SIZE) // cfg.block_n
            rows_per_program = batch * TOP_K / experts  # routed rows each program passes over its block
            words = rows_w * cfg.block_k // 8
            for arch in archs:
                rows, compiled, body, hist, res = loop_report(aot_cfg, arch, ("HFMA2",))
                warp_instr = len(body) * cfg.num_warps * (k_len // cfg.block_k) * rows_per_program * programs
                print(json.dumps({"T": tp, "B": batch, "config": name, "arch": arch, "regs": res.get("registers"),
                                  "spills": res.get("spill_store_bytes"), "smem": compiled.metadata.shared,
                                  "loop_instructions": len(body),
                                  "per_word_per_thread": round(len(body) * cfg.num_warps * 32 / words, 3),
                                  "programs": programs,
                                  "h200_issue_floor_us": round(warp_instr / (H200_SMS * SCHEDULERS_PER_SM
                                                                             * H200_CLOCK_HZ) * 1e6, 2),
                                  "top": hist.most_common(14)}), flush=True)


def prefill_loops(archs) -> None:
    """Stop 40: the prefill grouped GEMM's shipped 128-row tiles (pair order) beside the byte-plane candidates
    (moe_prefill.BYTE_PLANE_CANDIDATES): registers, spills, shared memory and the K loop (the innermost loop holding
    an MMA: one BLOCK_K step of one warp), its instructions scaled to 128 K values, its MMAs and its shared-memory
    stores (the pair order's dequantised tile goes through shared memory on its way to the MMA operand)."""
    from sglang_sm120.kernels import moe_prefill as mp

    tiles = [("gate_up", mp.DEFAULT_GATE_UP), ("down", mp.DEFAULT_DOWN)]
    tiles += [(kind, cfg) for kind, cfgs in mp.BYTE_PLANE_CANDIDATES.items() for cfg in cfgs]
    for kind, cfg in tiles:
        aot_cfg = mp.aot_config(kind, cfg)
        for arch in archs:
            rows, compiled, body, hist, res = loop_report(aot_cfg, arch)
            print(json.dumps({"config": aot_cfg.name, "arch": arch, "regs": res.get("registers"),
                              "spills": res.get("spill_store_bytes"), "smem": compiled.metadata.shared,
                              "loop_instructions_per_128k": round(len(body) * 128 / cfg.block_k),
                              "loop_mma_per_128k": round((hist.get("HMMA", 0) + hist.get("HGMMA", 0)) * 128
                                                         / cfg.block_k),
                              "loop_sts_per_128k": round(hist.get("STS", 0) * 128 / cfg.block_k),
                              "top": hist.most_common(8)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", type=int, action="append")
    parser.add_argument("--upcast", action="append", choices=moe.UPCASTS)
    parser.add_argument("--pairs", action="store_true", help="the pairs decode's AOT configs instead")
    parser.add_argument("--pairs-tma", action="store_true", help="run 18: the TMA swap-AB tiles and their sub_k forms")
    parser.add_argument("--gemv-f16", action="store_true", help="run 19: the shipped fp16 TMA GEMV tiles, issue floors")
    parser.add_argument("--pairs-rows", action="store_true", help="run 20: the PAIRS_TMA_ROWS_WHERE tiles (8 rows per pass)")
    parser.add_argument("--prefill", action="store_true",
                        help="stop 40: the prefill's shipped 128-row tiles beside the byte-plane candidates")
    args = parser.parse_args()
    if args.prefill:
        prefill_loops(args.arch or (90, 120))
        return
    if args.pairs_rows:
        pairs_rows_loops(args.arch or (90, 120))
        return
    if args.gemv_f16:
        gemv_f16_loops(args.arch or (90, 120))
        return
    if args.pairs_tma:
        pairs_tma_loops(args.arch or (90, 120))
        return
    if args.pairs:
        pairs_loops(args.arch or (90, 120))
        return
    for kind, tile in TILES.items():
        rows_w = 2 * tile.block_n if kind == "gate_up" else tile.block_n
        step_bytes = rows_w * tile.block_k // 2 + rows_w * tile.block_k // moe.MXFP4_GROUP
        for upcast in args.upcast or moe.UPCASTS:
            for arch in args.arch or (90, 120):
                rows, compiled, body, hist, _ = loop_report(config(kind, upcast, tile), arch, resources=False)
                print(json.dumps({"kernel": kind, "upcast": upcast, "arch": arch, "loop_instructions": len(body),
                                  "per_weight_byte": round(len(body) / step_bytes, 4), "kernel_total": len(rows),
                                  "smem": compiled.metadata.shared, "top": hist.most_common(10)}), flush=True)


if __name__ == "__main__":
    main()
