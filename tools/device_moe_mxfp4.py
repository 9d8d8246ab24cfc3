#!/usr/bin/env python3
"""Device run for the sm120 MoE runner (issue 4): full DeepSeek-V4-Flash expert shapes on the H200.

    python3 tools/device_moe_mxfp4.py --prepare          # here: upstream's Triton fused-MoE kernel -> .upstream/
    python3 tools/device_moe_mxfp4.py --out $OUT [--sweep] # device (carry .upstream)
    python3 tools/device_moe_mxfp4.py --smoke             # CPU interpreter, tiny shapes: the script's logic
    python3 tools/device_moe_mxfp4.py --variants --out $OUT [--smoke]  # weight-upcast variants only (no carry)
    python3 tools/device_moe_mxfp4.py --variants --splitk --out $OUT [--smoke]  # split-K decode vs unsplit

For T in (1, 4) (per-rank I = 2048/T), 256 experts, H = 4096, top-6 routing (distinct random experts
per token, weights with the 1.5 routed scale folded in):

* correctness: ours against the float32 reference (``reference_moe_mxfp4``, which dequantises
  exactly as upstream's ``dequant_mxfp4``), relative error, at B = 1, 64 and prefill;
* timing with CUDA graphs, in the same run: ours; a torch dequantise-and-matmul path (each routed
  row's expert gathered, dequantised to bf16 and multiplied; graph-capturable); upstream SGLang's
  Triton ``fused_moe_kernel`` (extracted from the wheel by --prepare) on the same experts dequantised
  to bf16, with a torch alignment/SwiGLU/sum around it (upstream's alignment is a CUDA op that
  cannot be brought here). B in {1, 8, 64, 256}, and prefill of 4096 tokens (ours bf16, ours
  MXFP8-activation variant, upstream Triton bf16);
* bandwidth over the bytes of the experts actually touched (weights + E8M0 scales), beside the
  copy bandwidth and the bf16 matmul rate measured in this run;
* weight repacking: device memory before/after and peak during (the repack is in place).

Our weights rotate over several copies of the layer (consecutive layers do not share L2).

``--variants``: the quick comparison of the decode weight upcasts (``moe_mxfp4.UPCASTS``) at
B in {1, 8, 64} x T in {1, 4}, each checked against the float32 reference and timed in CUDA graphs
beside the copy bandwidth of the same run; first, the split-nibble dequantisation is checked bit for
bit against the reference on the GPU over every byte and every E8M0 scale byte.

``--variants --splitk``: the same shapes with the default upcast, unsplit (``split_k="off"``)
against the split-K decode (``"auto"``, :func:`moe_mxfp4.split_k_choice` from the SM count, and fixed
(gate/up, down) splits), each checked against the reference; the ticket counters must be zero after.
"""

from __future__ import annotations

import argparse
import json
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

from sglang_sm120.kernels import moe_mxfp4 as moe  # noqa: E402
from sglang_sm120.kernels.dsv4 import (  # noqa: E402
    HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, MXFP4_GROUP, NUM_EXPERTS, ROUTED_SCALING_FACTOR, SWIGLU_LIMIT, TOP_K)

UPSTREAM_KERNEL = "upstream_fused_moe.py"
UPSTREAM_CONFIGS = "upstream_fused_moe_configs.json"
CONFIG_DIR = "srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0"
CONFIG_NAMES = {"up": "E=256,N={n},device_name=NVIDIA_H200.json", "down": "E=256,N={n},device_name=NVIDIA_H200_down.json"}


# ---------------------------------------------------------------------------------------------
# --prepare (here, where SGLang is installed)
# ---------------------------------------------------------------------------------------------
def prepare() -> None:
    import upstream

    upstream.extract_functions("kernels/ops/moe/fused_moe_triton_kernels.py", {"fused_moe_kernel", "write_zeros_to_output"},
                               preamble="import torch\nimport triton\nimport triton.language as tl\n",
                               out_name=UPSTREAM_KERNEL)
    configs = {}
    root = upstream.sglang_root() / CONFIG_DIR
    for tp in (1, 4):
        inter = MOE_INTERMEDIATE_SIZE // tp
        for kind, pattern in CONFIG_NAMES.items():
            path = root / pattern.format(n=inter)
            if path.exists():  # upstream's tuned H200 bf16 tables (only I=512 ships one)
                configs[f"{kind}/{inter}"] = json.loads(path.read_text())
    (upstream.UPSTREAM_DIR / UPSTREAM_CONFIGS).write_text(json.dumps(configs, indent=1))
    print("wrote", upstream.UPSTREAM_DIR / UPSTREAM_KERNEL, "and tuned configs for", sorted(configs))


# ---------------------------------------------------------------------------------------------
# upstream Triton fused MoE on bf16 experts (kernel: upstream's; glue: ours, graph-capturable)
# ---------------------------------------------------------------------------------------------
def upstream_config(tables: dict, kind: str, inter: int, num_tokens: int, num_experts: int) -> dict:
    """Upstream's choice (``try_get_optimal_moe_config``): nearest tuned M, else the bf16 default."""
    table = tables.get(f"{kind}/{inter}")
    if table:
        return dict(table[min(table, key=lambda m: abs(int(m) - num_tokens))])
    if num_tokens <= num_experts:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}


def align_rows(topk_ids: torch.Tensor, block_m: int, num_experts: int):
    """moe_align_block_size in torch (same outputs, sync-free): rows sorted by expert, each expert
    padded to ``block_m`` with the sentinel ``numel``; one expert id per block."""
    flat = topk_ids.flatten().long()
    numel = flat.numel()
    max_padded = numel + num_experts * (block_m - 1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    start = torch.cumsum(counts, 0) - counts
    sorted_e = flat[order]
    rank = torch.arange(numel, device=flat.device) - start[sorted_e]
    sorted_ids = torch.full((max_padded,), numel, dtype=torch.int32, device=flat.device)
    sorted_ids.scatter_(0, padded_start[sorted_e] + rank, order.to(torch.int32))
    blocks = torch.arange(max_padded // block_m, device=flat.device) * block_m
    expert_ids = torch.searchsorted(padded_end, blocks, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1).to(torch.int32)
    return sorted_ids, expert_ids, padded_end[-1:].to(torch.int32)


def upstream_gemm(kernel_mod, a, w, c, topk_weights, sorted_ids, expert_ids, post_padded, top_k, mul_weight, cfg):
    import triton
    import triton.language as tl

    num_valid = topk_weights.numel()
    n, k = w.shape[1], w.shape[2]
    meta = {key: cfg[key] for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}
    grid = (triton.cdiv(sorted_ids.numel(), meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)
    kernel_mod.fused_moe_kernel[grid](
        a, None, w, None, None, c, None, None, topk_weights, sorted_ids, expert_ids, post_padded, None,
        n, k, sorted_ids.numel(), num_valid,
        a.stride(0), a.stride(1), w.stride(0), w.stride(2), w.stride(1), 0, 0, c.stride(0), c.stride(1),
        0, 0, 0, 0, 0, group_n=0, group_k=0, **meta, MUL_ROUTED_WEIGHT=mul_weight, top_k=top_k,
        compute_type=tl.bfloat16, use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False,
        per_channel_quant=False, even_Ks=k % meta["BLOCK_SIZE_K"] == 0, c_sorted=False, swap_ab=False,
        FUSE_ADD_TO_OUTPUT=False, MASK_OUTPUT=False, FUSE_SUM_ALL_REDUCE=False, ROUTER_TOPK=top_k,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3))


def upstream_fused_experts(kernel_mod, tables, x, w13_bf16, w2_bf16, topk_weights, topk_ids, limit):
    """fused_experts' structure: align, GEMM1 (gate;up), clamped SwiGLU, GEMM2 x weight, top-k sum."""
    num_tokens, top_k = topk_ids.shape
    num_experts, two_i, _ = w13_bf16.shape
    inter = two_i // 2
    cfg1 = upstream_config(tables, "up", inter, num_tokens, num_experts)
    cfg2 = upstream_config(tables, "down", inter, num_tokens, num_experts)
    weights = topk_weights.float().flatten()
    sorted_ids, expert_ids, post_padded = align_rows(topk_ids, cfg1["BLOCK_SIZE_M"], num_experts)
    gate_up = torch.empty(num_tokens * top_k, two_i, dtype=torch.bfloat16, device=x.device)
    upstream_gemm(kernel_mod, x, w13_bf16, gate_up, weights, sorted_ids, expert_ids, post_padded, top_k, False, cfg1)
    act = moe.reference_swiglu(gate_up[:, :inter].float(), gate_up[:, inter:].float(), limit).to(torch.bfloat16)
    if cfg2["BLOCK_SIZE_M"] != cfg1["BLOCK_SIZE_M"]:
        sorted_ids, expert_ids, post_padded = align_rows(topk_ids, cfg2["BLOCK_SIZE_M"], num_experts)
    down = torch.empty(num_tokens * top_k, w2_bf16.shape[1], dtype=torch.bfloat16, device=x.device)
    upstream_gemm(kernel_mod, act, w2_bf16, down, weights, sorted_ids, expert_ids, post_padded, 1, True, cfg2)
    return down.view(num_tokens, top_k, -1).sum(1)


# ---------------------------------------------------------------------------------------------
# torch dequantise-and-matmul path (graph-capturable: routed rows in fixed chunks)
# ---------------------------------------------------------------------------------------------
def torch_dequant_bf16(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    codes = packed.view(torch.uint8).to(torch.int32)
    nib = torch.stack((codes & 0xF, codes >> 4), dim=-1).flatten(-2)
    mag = nib & 7
    bits = torch.where(mag >= 2, (mag + 252) << 22, mag * 0x3F000000) | ((nib & 8) << 28)
    values = bits.view(torch.float32).unflatten(-1, (-1, MXFP4_GROUP))
    factor = (moe.scale_bytes(scale).to(torch.int32) << 23).view(torch.float32)
    return (values * factor.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)


def torch_moe(x, w13, s13, w2, s2, topk_weights, topk_ids, limit, chunk=8):
    """Checkpoint layout ([gate; up] rows). Each routed row's expert is gathered and dequantised."""
    num_tokens, top_k = topk_ids.shape
    inter = w13.shape[1] // 2
    flat = topk_ids.flatten().long()
    tokens = torch.arange(num_tokens * top_k, device=x.device) // top_k
    weights = topk_weights.flatten().float()
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    for r0 in range(0, flat.numel(), chunk):
        e = flat[r0:r0 + chunk]
        t = tokens[r0:r0 + chunk]
        xw = x[t].unsqueeze(1)
        gate_up = torch.bmm(xw, torch_dequant_bf16(w13[e], s13[e]).transpose(1, 2)).float().squeeze(1)
        act = moe.reference_swiglu(gate_up[:, :inter], gate_up[:, inter:], limit).to(torch.bfloat16)
        down = torch.bmm(act.unsqueeze(1), torch_dequant_bf16(w2[e], s2[e]).transpose(1, 2)).float().squeeze(1)
        out.index_add_(0, t, down * weights[r0:r0 + chunk].unsqueeze(1))
    return out.to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
def make_layer(num_experts, hidden, inter, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    w13 = torch.randint(-128, 128, (num_experts, 2 * inter, hidden // 2), dtype=torch.int8, device=device, generator=g)
    s13 = torch.randint(118, 126, (num_experts, 2 * inter, hidden // MXFP4_GROUP), dtype=torch.uint8, device=device,
                        generator=g)
    w2 = torch.randint(-128, 128, (num_experts, hidden, inter // 2), dtype=torch.int8, device=device, generator=g)
    s2 = torch.randint(118, 126, (num_experts, hidden, inter // MXFP4_GROUP), dtype=torch.uint8, device=device,
                       generator=g)
    return [w13, s13.view(torch.float8_e8m0fnu), w2, s2.view(torch.float8_e8m0fnu)]


def make_routing(batch, num_experts, hidden, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    scores = torch.rand(batch, num_experts, device=device, generator=g)
    weights, ids = scores.topk(TOP_K, dim=1)
    weights = weights / weights.sum(1, keepdim=True) * ROUTED_SCALING_FACTOR
    x = (torch.randn(batch, hidden, device=device, generator=g) * 2).to(torch.bfloat16)
    return x, weights.float(), ids.to(torch.int32)


def dequant_all_bf16(packed, scale, chunk=16):
    out = torch.empty(*packed.shape[:2], packed.shape[2] * 2, dtype=torch.bfloat16, device=packed.device)
    for e0 in range(0, packed.shape[0], chunk):
        out[e0:e0 + chunk] = torch_dequant_bf16(packed[e0:e0 + chunk], scale[e0:e0 + chunk])
    return out


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
def timer(smoke):
    from sglang_sm120.kernels.harness.devicebench import time_in_cuda_graph

    def run(fn, heavy=False):  # microseconds per call
        if smoke:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
        if heavy:
            return time_in_cuda_graph(fn, calls_per_graph=1, replays=3, warmup=1)
        return time_in_cuda_graph(fn, calls_per_graph=12, replays=15)
    return run


def cycling(fn_per_copy, copies):
    state = [0]

    def call():
        fn_per_copy(copies[state[0] % len(copies)])
        state[0] += 1
    return call


DECODE_SWEEP = {
    "gate_up": [moe.GemmConfig(16, 32, 128, 4, 3), moe.GemmConfig(16, 64, 128, 4, 3), moe.GemmConfig(16, 32, 256, 4, 3),
                moe.GemmConfig(16, 16, 256, 4, 3), moe.GemmConfig(16, 64, 256, 4, 3)],
    "down": [moe.GemmConfig(16, 64, 128, 4, 3), moe.GemmConfig(16, 32, 256, 4, 3), moe.GemmConfig(16, 64, 256, 4, 3),
             moe.GemmConfig(16, 128, 128, 4, 3)],
}
SWEEP_DEADLINE_S = 140  # the sweep is skipped past this many seconds into the run (240 s device limit)
PREFILL_SWEEP = {
    "gate_up": [moe.GemmConfig(64, 64, 128, 8, 3), moe.GemmConfig(64, 64, 64, 4, 3), moe.GemmConfig(128, 64, 64, 8, 3),
                moe.GemmConfig(64, 128, 64, 8, 3)],
    "down": [moe.GemmConfig(64, 128, 64, 8, 3), moe.GemmConfig(64, 64, 128, 4, 3), moe.GemmConfig(128, 128, 64, 8, 3)],
}


VARIANT_BATCHES = (1, 8, 64)


SPLITK_REQUESTS = ("off", "auto", (2, 2), (4, 2), (8, 4))


def splitk_variants(batch, hidden, inter, sm_count):
    """(label, split_k argument) per distinct resolved split, fixed requests clipped to the K loops."""
    rows = batch * TOP_K
    gu, dn = moe.gate_up_config(rows, inter), moe.down_config(rows, inter)
    out, seen = [], set()
    for req in SPLITK_REQUESTS:
        if req == "off":
            resolved = (1, 1)
        elif req == "auto":
            resolved = moe.split_k_choice(rows, hidden, inter, sm_count)
        else:
            resolved = (min(req[0], hidden // gu.block_k), min(req[1], inter // dn.block_k))
        if resolved in seen:
            continue
        seen.add(resolved)
        label = f"{req if isinstance(req, str) else 'fixed'} {resolved[0]}x{resolved[1]}"
        out.append((label, "off" if resolved == (1, 1) else resolved))
    return out


def variant_comparison(args) -> None:
    from sglang_sm120.kernels.harness.devicebench import BenchResult, copy_bandwidth_gbs, relative_error

    if args.smoke:
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()
        device, num_experts, hidden, tps, copies, base_inter = "cpu", 8, 256, (2, 4), 2, 256
        if args.splitk:  # enough K steps to split both loops
            hidden, tps = 1024, (1, 4)
    else:
        device, num_experts, hidden, tps, copies, base_inter = "cuda", NUM_EXPERTS, HIDDEN_SIZE, (1, 4), 3, MOE_INTERMEDIATE_SIZE
    run = timer(args.smoke)
    t_start = time.time()
    copy_gbs = 0.0 if args.smoke else copy_bandwidth_gbs()
    if args.splitk:
        result = BenchResult(
            name="moe_mxfp4-h200-splitk",
            title="sm120 MoE decode: split-K (gate/up partials + ticket, down atomics) vs unsplit, DSv4-Flash shapes, H200",
            columns=["T", "B", "upcast", "us", "touched_MB", "GB/s", "%copy", "rel_err", "vs_default"])
        sm_count = moe._sm_count(torch.device(device))
        result.extra["SM count"] = sm_count
    else:
        result = BenchResult(
            name="moe_mxfp4-h200-dequant",
            title="sm120 MoE decode: e2m1 x E8M0 -> bf16 weight-upcast variants, DSv4-Flash shapes, H200",
            columns=["T", "B", "upcast", "us", "touched_MB", "GB/s", "%copy", "rel_err", "vs_default"])
    result.extra.update({"copy bandwidth (GB/s, read+write)": round(copy_gbs, 1),
                         "launches per forward": moe.LAUNCHES_PER_FORWARD})
    # the split-nibble dequantisation on this GPU, bit for bit: every byte under every scale byte
    rows = torch.arange(256, device=device)
    packed = (torch.arange(256, device=device)[None, :] + 37 * rows[:, None]).remainder(256).to(torch.uint8)
    scale = rows[:, None].repeat(1, 512 // MXFP4_GROUP).to(torch.uint8)
    # reference on the CPU: CUDA's exp2(-127) is not exactly 2**-127 (run of 2026-11-30)
    ref_deq = moe.reference_dequant_mxfp4(packed.cpu(), scale.cpu())
    for upcast in () if args.splitk else ("split_f32", "split_bf16"):
        got = moe.dequant_nibbles(packed, scale, upcast).cpu()
        same = (got == ref_deq) | (got.isnan() & ref_deq.isnan())
        result.extra[f"{upcast} dequant bit-exact (65536 bytes x 256 scales)"] = bool(same.all())
        if not bool(same.all()):
            bad = (~same).nonzero()[:4].tolist()
            result.notes.append(f"{upcast} dequant mismatches: {int((~same).sum())}, e.g. (row=scale byte, k) {bad}: "
                                f"{[float(got[i, j]) for i, j in bad]} vs {[float(ref_deq[i, j]) for i, j in bad]}")
    for tp in tps:
        inter = base_inter // tp
        layers = [make_layer(num_experts, hidden, inter, device, seed=100 * tp + c) for c in range(copies)]
        ckpt = [t.clone() for t in layers[0]]
        for layer in layers:
            moe.repack_w13_(layer[0], layer[1])
        for batch in VARIANT_BATCHES:
            x, weights, ids = make_routing(batch, num_experts, hidden, device, seed=batch + tp)
            touched = moe.touched_expert_bytes(ids, hidden, inter, num_experts)
            ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
            default = moe.default_gemm_upcast(batch * TOP_K, inter)  # the tl.dot default (the GEMV has its own run)
            times, rows_out = {}, []
            if args.splitk:
                variants = [(f"{default} {label}", default, sk)
                            for label, sk in splitk_variants(batch, hidden, inter, sm_count)]
                default_split = moe.default_split_k(batch * TOP_K, inter)
                default_label = next((lab for lab, _, sk in variants if sk == default_split
                                      or (default_split == "auto" and lab.split()[1] == "auto")), variants[0][0])
            else:
                variants = [(upcast, upcast, None) for upcast in moe.UPCASTS]
                default_label = default
            for label, upcast, split_k in variants:
                def per_layer(layer, upcast=upcast, split_k=split_k):
                    return moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT, upcast=upcast,
                                                 split_k=split_k)
                try:
                    err = relative_error(per_layer(layers[0]), ref)
                    times[label] = us = run(cycling(per_layer, layers))
                except Exception as exc:  # one broken variant must not lose the run
                    result.notes.append(f"T={tp} B={batch} {label}: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                gbs = touched / (us * 1e-6) / 1e9
                rows_out.append(dict(T=tp, B=batch, upcast=label + (" (default)" if label == default_label else ""), us=us,
                                     touched_MB=touched / 1e6, rel_err=err,
                                     **{"GB/s": gbs, "%copy": 100 * gbs / copy_gbs if copy_gbs else 0.0}))
            for row in rows_out:
                result.add(**row, vs_default=times[default_label] / row["us"] if default_label in times else float("nan"))
        del layers, ckpt
        if device == "cuda":
            torch.cuda.empty_cache()
        result.extra["wall seconds"] = round(time.time() - t_start, 1)
        result.write(args.out)  # partial results survive a timeout
    result.notes.append("upcast: dot_scaled = tl.dot_scaled; regs = float32 per value then tl.join/tl.reshape into k "
                        "order; split_f32 / split_bf16 = low and high nibbles as two tiles against the even/odd "
                        "activation columns, unbias + E8M0 scale multiplies in float32 / packed bf16 (HMUL2)")
    result.notes.append("vs_default = time of the shipped default for that shape / time of this row (> 1: faster); "
                        "touched_MB = distinct experts x (w13 + w2 + E8M0 scales); weights rotate over "
                        f"{copies} layer copies")
    if args.splitk:
        tickets = [int(t.abs().sum()) for t in moe._TICKETS.values()]
        result.extra["ticket counters zero after the run"] = all(t == 0 for t in tickets)
        result.notes.append("split-K: gate/up programs (expert slot, n block, K split) write fp32 partials, the last "
                            "to take a ticket per (slot, n block) sums them and applies the SwiGLU; down programs "
                            "(slot, n block, K split) atomically add weighted rows into a zeroed fp32 [B, H] (the "
                            "top-k sum), then one cast to bf16. 'auto' = split_k_choice from the SM count; labels "
                            "give the resolved (gate/up)x(down) splits; 'off 1x1' is the unsplit path")
    result.finish(args.out, t_start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prepare", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="also time alternative tile configs")
    parser.add_argument("--variants", action="store_true", help="only compare the decode weight upcasts")
    parser.add_argument("--splitk", action="store_true", help="with --variants: split-K decode vs unsplit")
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default=None,
                        help="result file name (default moe_mxfp4-<card>, e.g. -h200; give a run number so that a "
                             "copy into benchmarks/ does not overwrite an earlier run)")
    args = parser.parse_args()
    if args.prepare:
        prepare()
        return
    if args.variants:
        variant_comparison(args)
        return
    from sglang_sm120.kernels.harness.devicebench import (
        BenchResult, bf16_matmul_tflops, copy_bandwidth_gbs, gpu_tag, relative_error)
    import upstream

    if args.smoke:
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()
        device, num_experts, hidden, tps, batches, prefill_tokens, copies = "cpu", 8, 256, (2, 4), (1, 8), 90, 2
        base_inter = 256
    else:
        device, num_experts, hidden, tps, batches, prefill_tokens, copies = (
            "cuda", NUM_EXPERTS, HIDDEN_SIZE, (1, 4), (1, 8, 64, 256), 4096, 3)
        base_inter = MOE_INTERMEDIATE_SIZE
    kernel_mod = upstream.load(UPSTREAM_KERNEL)
    import triton

    for name in ("write_zeros_to_output", "fused_moe_kernel"):  # extract_functions keeps no decorators
        if not isinstance(getattr(kernel_mod, name), triton.runtime.JITFunction):
            setattr(kernel_mod, name, triton.jit(getattr(kernel_mod, name)))
    tables = json.loads((upstream.UPSTREAM_DIR / UPSTREAM_CONFIGS).read_text())
    run = timer(args.smoke)
    t_start = time.time()

    copy_gbs = 0.0 if args.smoke else copy_bandwidth_gbs()
    mm_tflops = 0.0 if args.smoke else bf16_matmul_tflops()
    result = BenchResult(
        name=args.name or f"moe_mxfp4-{gpu_tag()}",
        title="sm120 MoE runner (MXFP4 routed experts, DSv4-Flash shapes) vs torch and upstream Triton, "
              + gpu_tag().upper(),
        columns=["case", "T", "B", "path", "us", "touched_MB", "GB/s", "%copy", "TFLOP/s", "%bf16mm", "rel_err"])
    result.extra.update({"copy bandwidth (GB/s, read+write)": round(copy_gbs, 1),
                         "bf16 matmul (TFLOP/s, 8192^3)": round(mm_tflops, 1),
                         "launches per forward (ours)": moe.LAUNCHES_PER_FORWARD})
    sweep_log = []

    for tp in tps:
        inter = base_inter // tp
        layers = [make_layer(num_experts, hidden, inter, device, seed=100 * tp + c) for c in range(copies)]
        ckpt = [t.clone() for t in layers[0]]  # checkpoint layout, for the reference and torch path
        w13_bf16 = dequant_all_bf16(ckpt[0], ckpt[1])
        w2_bf16 = dequant_all_bf16(ckpt[2], ckpt[3])
        # in-place repack: device memory before/after and the peak in between
        if device == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        for layer in layers:
            moe.repack_w13_(layer[0], layer[1])
        if device == "cuda":
            torch.cuda.synchronize()
            after, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
            result.notes.append(f"T={tp}: {copies} layers ({sum(t.numel() * t.element_size() for t in layers[0]) * copies / 1e9:.2f} GB "
                              f"of experts) repacked in place: allocated {before / 1e9:.3f} GB before, {after / 1e9:.3f} GB "
                              f"after, peak +{(peak - before) / 1e6:.1f} MB (one expert's w13 + scales)")

        def ours_fn(x, w, ids, **kw):
            return lambda layer: moe.moe_mxfp4_forward(x, layer[0], layer[1], layer[2], layer[3], w, ids, SWIGLU_LIMIT, **kw)

        for batch in batches:
            x, weights, ids = make_routing(batch, num_experts, hidden, device, seed=batch + tp)
            touched = moe.touched_expert_bytes(ids, hidden, inter, num_experts)
            ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
            fns = {
                # the forward as the seam runs it: default_upcast picks the decode (fp16 / bf16 TMA GEMV, pairs, ...)
                "ours (default)": (lambda: moe.moe_mxfp4_forward(x, *layers[0], weights, ids),
                                   cycling(ours_fn(x, weights, ids), layers), False),
                "ours, tl.dot_scaled GEMM": (lambda: moe.moe_mxfp4_forward(x, *layers[0], weights, ids, dot_scaled=True),
                         cycling(ours_fn(x, weights, ids, dot_scaled=True), layers), False),
                "ours, register dequant": (lambda: moe.moe_mxfp4_forward(x, *layers[0], weights, ids, dot_scaled=False),
                                           cycling(ours_fn(x, weights, ids, dot_scaled=False), layers), False),
                "torch": (lambda: torch_moe(x, *ckpt, weights, ids, SWIGLU_LIMIT), None, batch >= 64),
                "upstream": (lambda: upstream_fused_experts(kernel_mod, tables, x, w13_bf16, w2_bf16, weights, ids,
                                                            SWIGLU_LIMIT), None, False),
            }
            for path, (fn, timed_fn, heavy) in fns.items():
                try:
                    err = relative_error(fn(), ref)
                    us = run(timed_fn or fn, heavy=heavy)
                except Exception as exc:  # one broken baseline must not lose the run
                    result.notes.append(f"T={tp} B={batch} {path}: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                gbs = touched / (us * 1e-6) / 1e9
                result.add(case="decode", T=tp, B=batch, path=path if path != "upstream" else "upstream triton (bf16 experts)",
                           us=us, touched_MB=touched / 1e6, **{"GB/s": gbs, "%copy": 100 * gbs / copy_gbs if copy_gbs else 0.0},
                           rel_err=err)
            if args.sweep and batch in (1, 64, 256) and tp == tps[0] and time.time() - t_start < SWEEP_DEADLINE_S:
                base_gu = moe.gate_up_config(batch * TOP_K, inter)
                base_dn = moe.down_config(batch * TOP_K, inter)
                for kind, cands in DECODE_SWEEP.items():
                    for cand in cands:
                        if kind == "gate_up" and (inter % cand.block_n):
                            continue
                        if kind == "down" and (inter % cand.block_k or inter < cand.block_k):
                            continue
                        cfgs = (cand, base_dn) if kind == "gate_up" else (base_gu, cand)
                        try:
                            us = run(cycling(ours_fn(x, weights, ids, configs=cfgs), layers))
                            err = relative_error(moe.moe_mxfp4_forward(x, *layers[0], weights, ids, configs=cfgs), ref)
                        except Exception as exc:  # a config that does not fit this GPU
                            us, err = float("nan"), f"{type(exc).__name__}"
                        sweep_log.append({"T": tp, "B": batch, "kind": kind, "cfg": cand.__dict__, "us": us, "err": err,
                                          "GB/s": touched / (us * 1e-6) / 1e9 if us == us else None})

        # prefill
        x, weights, ids = make_routing(prefill_tokens, num_experts, hidden, device, seed=7 + tp)
        flops = 2 * prefill_tokens * TOP_K * (2 * inter * hidden + hidden * inter)
        ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
        ref8 = moe.reference_moe_mxfp8_act(x, *ckpt, weights, ids)
        prefill_paths = {
            # the forward as the seam runs it: above DECODE_MAX_ROWS, kernels/moe_prefill.py where prefill_default says
            "ours (default)": (ours_fn(x, weights, ids), ref),
            "ours bf16 (HMMA)": (ours_fn(x, weights, ids, dot_scaled=True), ref),
            "ours bf16, register dequant": (ours_fn(x, weights, ids, dot_scaled=False), ref),
            "ours MXFP8 act (QMMA.SF on sm_120)": (ours_fn(x, weights, ids, act_mxfp8=True), ref),
        }
        prefill_paths["upstream triton (bf16 experts)"] = (
            lambda _layer: upstream_fused_experts(kernel_mod, tables, x, w13_bf16, w2_bf16, weights, ids, SWIGLU_LIMIT), ref)
        for name, (fn, _) in prefill_paths.items():
            try:
                out = fn(layers[0])
                us = run(cycling(fn, layers[:1]))
            except Exception as exc:
                result.notes.append(f"T={tp} prefill {name}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            tflops = flops / (us * 1e-6) / 1e12
            result.add(case="prefill", T=tp, B=prefill_tokens, path=name, us=us, rel_err=relative_error(out, ref),
                       **{"TFLOP/s": tflops, "%bf16mm": 100 * tflops / mm_tflops if mm_tflops else 0.0})
            if "MXFP8" in name:
                result.notes.append(f"T={tp} prefill MXFP8 variant vs its own MXFP8 reference: rel err "
                                    f"{relative_error(out, ref8):.3g}; MXFP8 reference vs float32 reference: "
                                    f"{relative_error(ref8, ref):.3g}")
        if args.sweep and tp == tps[0] and time.time() - t_start < SWEEP_DEADLINE_S:
            base = (moe.gate_up_config(prefill_tokens * TOP_K, inter), moe.down_config(prefill_tokens * TOP_K, inter))
            for kind, cands in PREFILL_SWEEP.items():
                for cand in cands:
                    if (kind == "gate_up" and inter % cand.block_n) or (kind == "down" and inter % cand.block_k):
                        continue
                    cfgs = (cand, base[1]) if kind == "gate_up" else (base[0], cand)
                    try:
                        us = run(cycling(ours_fn(x, weights, ids, configs=cfgs), layers[:1]))
                    except Exception as exc:
                        us = float("nan")
                    sweep_log.append({"T": tp, "B": prefill_tokens, "kind": "prefill_" + kind, "cfg": cand.__dict__,
                                      "us": us, "TFLOP/s": flops / (us * 1e-6) / 1e12 if us == us else None})
        del layers, ckpt, w13_bf16, w2_bf16
        if device == "cuda":
            torch.cuda.empty_cache()
        result.extra["wall seconds"] = round(time.time() - t_start, 1)
        result.extra["sweep"] = json.dumps(sweep_log)
        result.write(args.out)  # partial results survive a timeout

    result.notes.append("ours (default) = the forward as the seam runs it (the decode kernels by routed rows, the grouped "
                        "GEMM of kernels/moe_prefill.py above them); 'tl.dot_scaled GEMM' / 'bf16 (HMMA)' and "
                        "'register dequant' = moe_mxfp4_forward's tl.dot path with the weights upcast by tl.dot_scaled "
                        "/ by the explicit e2m1 x E8M0 -> bf16 dequantisation (the paths before the decode kernels "
                        "and the grouped GEMM)")
    result.notes.append("touched_MB: distinct experts of the step x (w13 + w2 + E8M0 scales) in the MXFP4 checkpoint layout; "
                        "GB/s = touched bytes / time for every path (upstream reads bf16 experts, 4x those bytes)")
    result.notes.append("upstream triton = SGLang 0.5.23 fused_moe_kernel (extracted) with upstream's tile choice (tuned "
                        f"H200 tables where shipped: {sorted(tables)}), torch alignment/SwiGLU/top-k sum around it")
    if sweep_log:
        result.extra["sweep"] = json.dumps(sweep_log)
    result.finish(args.out, t_start)


if __name__ == "__main__":
    main()
