#!/usr/bin/env python3
"""Device check and timing: DSv4 ``wo_a`` with the inverse RoPE as its own launch vs fused into the FP8 kernel.

Upstream (SGLang 0.5.23, ``MQALayer.forward``) rotates the last 64 dims of every 512-wide head of the
attention output back in place (``fused_rope_inplace(o[..., -64:], inverse=True)``) and then runs
``wo_a``. The dense seam can instead hand ``positions`` / ``freqs`` to
:func:`~sglang_sm120.kernels.fp8_gemv.grouped_fp8_wo_a`, which rotates the activation in registers.
For T in (1, 4) and M in (1, 2, 4, 8, 16, 32) rows, each variant captured in one CUDA graph:

* ``sep_token_us`` / ``sep_flat_us``: (a) a standalone inverse-RoPE launch, then ``grouped_fp8_wo_a``
  without RoPE. ``fused_rope_inplace`` is a CUDA JIT kernel of SGLang's that cannot run here (no
  SGLang on the device), so the stand-ins are upstream's own Triton inverse RoPE
  (``kernels/ops/attention/dsv4/rope.py: apply_rotary_emb_triton``, what ``fused_rope_inplace``
  runs on ROCm/XPU), extracted by ``--prepare``: its per-token kernel and its batched flat kernel.
* ``fused_us``: (b) ``grouped_fp8_wo_a(o, w, s, positions=, freqs=)``, one launch.
* ``einsum_us``: upstream's sm_120 path for reference: the Triton inverse RoPE (flat), then
  upstream's ``_apply_wo_a_bf16_matmul`` (bf16 einsum) on the bf16 dequantised weight.

Every variant's output is checked against the float32 reference ``reference_grouped_wo_a`` with the
same positions/freqs (relative error). Weight copies are rotated past L2 as in device_fp8_gemv.py.
``--smoke`` runs the logic on the CPU under the Triton interpreter at tiny shapes (no timing).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

UPSTREAM_ROPE_FILE = "dsv4_rope.py"
UPSTREAM_WO_A_FILE = "dsv4_wo_a.py"  # written by device_fp8_gemv.prepare (the same extraction)
RUN_NAME = "wo_a_rope-h200-run1"
ROWS = (1, 2, 4, 8, 16, 32)
TPS = (1, 4)
ROTATE_BYTES = 200 * 2**20  # distinct weight copies per graph: > 4x the H200's 50 MB L2
MAX_POS = 65536
MAX_REL_ERR = 1e-2


def prepare() -> None:
    import device_fp8_gemv
    import upstream

    device_fp8_gemv.prepare()
    path = upstream.copy_module("kernels/ops/attention/dsv4/rope.py", UPSTREAM_ROPE_FILE)
    print(f"wrote {path}")


def torch_inverse_rope_inplace(x, freqs_cis, positions, inverse=True):
    """CPU stand-in for the smoke run (the interpreter cannot run upstream's strided Triton RoPE
    reliably in bf16): the same rotation as fp8_gemv's reference, written back in place."""
    import torch

    assert inverse
    f = torch.view_as_real(freqs_cis)[positions.long()].float()  # [B, rope/2, 2]
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    c, s = f[:, None, :, 0], f[:, None, :, 1]
    re, im = pairs[..., 0], pairs[..., 1]
    x.copy_(torch.stack((re * c + im * s, im * c - re * s), dim=-1).reshape(x.shape).to(x.dtype))
    return x


def main(out_dir: str, smoke: bool, tps=TPS, rows=ROWS, run_name: str = RUN_NAME) -> None:
    import torch

    from sglang_sm120.kernels import dsv4
    from sglang_sm120.kernels import fp8_gemv as g
    from sglang_sm120.kernels.harness import devicebench as db

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cpu" if smoke else "cuda"
    t_start = time.time()
    budget_s = float(os.environ.get("WO_A_ROPE_BUDGET_S", "85"))
    head, rope_dim = (dsv4.HEAD_DIM, dsv4.ROPE_DIM) if not smoke else (128, 32)
    if smoke:
        rows, tps = (1, 3), (4,)

    if smoke:
        rope_token = rope_flat = torch_inverse_rope_inplace
        upstream_wo_a = None
    else:
        import upstream as up

        rope_mod = up.load(UPSTREAM_ROPE_FILE)

        def rope_token(x, freqs_cis, positions, inverse=True):
            rope_mod.set_batched_rope(False)
            return rope_mod.apply_rotary_emb_triton(x, freqs_cis, positions=positions, inverse=inverse)

        def rope_flat(x, freqs_cis, positions, inverse=True):
            rope_mod.set_batched_rope(True)
            return rope_mod.apply_rotary_emb_triton(x, freqs_cis, positions=positions, inverse=inverse)

        upstream_wo_a = up.load(UPSTREAM_WO_A_FILE)._apply_wo_a_bf16_matmul

    def timed(fns):
        return db.time_rotating_calls(fns, dry_run=smoke)

    copy_gbs = float("nan") if smoke else db.copy_bandwidth_gbs()
    print(f"eager copy bandwidth {copy_gbs:.1f} GB/s (read+write)", flush=True)
    res = db.BenchResult(
        name=run_name,
        title="DSv4 wo_a: standalone inverse RoPE + FP8 grouped kernel vs the RoPE fused into it (CUDA-graph timed)",
        columns=["T", "G", "M", "MB", "sep_token_us", "sep_flat_us", "fused_us", "fused_vs_best_sep",
                 "gemv_only_us", "rope_flat_only_us", "einsum_us", "cfg", "max_rel_err", "rope_standin_err"])
    res.extra["copy bandwidth (GB/s, read+write, eager, this run)"] = round(copy_gbs, 1)
    failures = {}
    gen = torch.Generator(device=dev).manual_seed(0)
    angles = torch.rand(MAX_POS, rope_dim // 2, device=dev, generator=gen) * (2 * math.pi)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # unit phases, as precompute_freqs_cis makes
    freqs = torch.view_as_real(freqs_cis).flatten(1)  # what MQALayer.forward hands fused_rope_wo_a_bf16

    for tp in tps:
        groups, r, d = dsv4.O_GROUPS // tp, dsv4.O_LORA_RANK, dsv4.dense_linear_shapes(tp)["wo_a"][1]
        if smoke:
            groups, r, d = 2, 128, 256
        heads = groups * d // head
        nbytes = groups * r * d
        copies = 1 if smoke else max(2, math.ceil(ROTATE_BYTES / nbytes))
        base = (torch.randn(groups, r, d, device=dev, generator=gen) * 0.5).to(g.FP8_DTYPE)
        scales = torch.exp2(torch.randint(-10, -5, (groups, r // 128, d // 128), device=dev, generator=gen).float())
        weights = [(base.clone(), scales.clone()) for _ in range(copies)]
        dq = [g.dequantize_block_fp8(w, s, torch.bfloat16) for w, s in weights[:max(1, copies // 2 + 1)]]
        for m in rows:
            if time.time() - t_start > budget_s:
                res.notes.append(f"stopped before T={tp} M={m}: time budget {budget_s:.0f} s reached")
                break
            point = f"T={tp} M={m}"
            try:
                o_attn = torch.randn(m, heads, head, device=dev, generator=gen).to(torch.bfloat16)  # attention output
                positions = torch.randint(0, MAX_POS, (m,), device=dev, generator=gen)
                ref = g.reference_grouped_wo_a(o_attn.view(m, groups, d), *weights[0], positions, freqs, head,
                                               rope_dim)
                work = o_attn.clone()  # the separate path rotates this buffer in place, as upstream does

                def separate(w, s, rope):
                    rope(work[..., -rope_dim:], freqs_cis, positions, inverse=True)
                    return g.grouped_fp8_wo_a(work.view(m, groups, d), w, s)

                def fused(w, s):
                    return g.grouped_fp8_wo_a(o_attn.view(m, groups, d), w, s, positions=positions, freqs=freqs,
                                              head_dim=head, rope_dim=rope_dim)

                errs = {}
                # the stand-in RoPE itself against the kernel module's bf16 reference rotation
                work.copy_(o_attn)
                rope_flat(work[..., -rope_dim:], freqs_cis, positions, inverse=True)
                rotated = g._inverse_rope_bf16(o_attn.view(m, groups, d), positions, freqs, head, rope_dim)
                rope_err = db.relative_error(work.view(m, groups, d), rotated)
                for label, rope in (("sep_token", rope_token), ("sep_flat", rope_flat)):
                    work.copy_(o_attn)
                    errs[label] = db.relative_error(separate(*weights[0], rope), ref)
                errs["fused"] = db.relative_error(fused(*weights[0]), ref)
                if upstream_wo_a is not None:
                    work.copy_(o_attn)
                    rope_flat(work[..., -rope_dim:], freqs_cis, positions, inverse=True)
                    errs["einsum"] = db.relative_error(upstream_wo_a(work.view(m, groups, d), dq[0], is_decode=True),
                                                       ref)
                max_err = max(errs.values())
                if max_err > MAX_REL_ERR or rope_err > 1e-2:
                    failures[point] = f"reference check: {errs} rope {rope_err:.3g}"
                if smoke:
                    assert max_err < MAX_REL_ERR and rope_err < 1e-6, (point, errs, rope_err)

                times = {
                    "sep_token": timed([(lambda w=w, s=s: separate(w, s, rope_token)) for w, s in weights]),
                    "sep_flat": timed([(lambda w=w, s=s: separate(w, s, rope_flat)) for w, s in weights]),
                    "fused": timed([(lambda w=w, s=s: fused(w, s)) for w, s in weights]),
                    "gemv_only": timed([(lambda w=w, s=s: g.grouped_fp8_wo_a(work.view(m, groups, d), w, s))
                                        for w, s in weights]),
                    "rope_flat_only": timed([lambda: rope_flat(work[..., -rope_dim:], freqs_cis, positions)]),
                }
                einsum_us = float("nan")
                if upstream_wo_a is not None:
                    def upstream_path(w):
                        rope_flat(work[..., -rope_dim:], freqs_cis, positions, inverse=True)
                        return upstream_wo_a(work.view(m, groups, d), w, is_decode=True)
                    einsum_us = timed([(lambda w=w: upstream_path(w)) for w in dq])
                best_sep = min(times["sep_token"], times["sep_flat"])
                cfg = g.default_config(m, r, d, groups=groups)
                res.add(T=tp, G=groups, M=m, MB=round(nbytes / 1e6, 2), sep_token_us=times["sep_token"],
                        sep_flat_us=times["sep_flat"], fused_us=times["fused"],
                        fused_vs_best_sep=round(times["fused"] / best_sep, 3) if best_sep == best_sep else float("nan"),
                        gemv_only_us=times["gemv_only"], rope_flat_only_us=times["rope_flat_only"],
                        einsum_us=einsum_us, cfg=cfg.name, max_rel_err=float(f"{max_err:.3g}"),
                        rope_standin_err=float(f"{rope_err:.3g}"))
                print(f"[{time.time() - t_start:5.0f}s] {point}: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items())
                      + f" einsum {einsum_us:.2f} | errs " + ", ".join(f"{k} {v:.2g}" for k, v in errs.items())
                      + f" rope {rope_err:.2g}", flush=True)
            except Exception as exc:
                failures[point] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(f"{point} failed: {failures[point]}", flush=True)
                if smoke:
                    raise
            res.extra["failures"] = failures
            res.write(out_dir)  # partial results survive a later failure or the time limit
        del weights, dq
    res.notes += [
        "sep_*_us: (a) upstream's Triton inverse RoPE (per-token kernel / batched flat kernel; stand-ins for the "
        "CUDA JIT fused_rope_inplace, which needs SGLang) on o[..., -64:] in place, then grouped_fp8_wo_a without "
        "RoPE, both in one graph; fused_us: (b) grouped_fp8_wo_a with positions/freqs (one launch); "
        "fused_vs_best_sep = fused_us / min(sep_token_us, sep_flat_us).",
        "gemv_only_us: grouped_fp8_wo_a without RoPE alone; rope_flat_only_us: the flat RoPE alone (one activation, "
        "not rotated past L2); einsum_us: the flat RoPE then upstream's _apply_wo_a_bf16_matmul (bf16 einsum) on the "
        "dequantised weight (upstream's sm_120 path).",
        "max_rel_err: worst relative error of sep_token, sep_flat, fused and einsum against the float32 reference "
        "reference_grouped_wo_a(o, w, s, positions, freqs); rope_standin_err: the flat Triton RoPE against "
        "fp8_gemv._inverse_rope_bf16.",
        "Weights: each graph calls n distinct copies (n * bytes >= 200 MiB) once each, so every call streams its "
        "weight from HBM; MB is one copy's FP8 bytes.",
    ]
    json_path, md_path = res.write(out_dir)
    print(f"wrote {json_path} {md_path} in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", action="store_true", help="extract upstream baselines into .upstream/")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks"))
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter run at tiny shapes, no timing")
    parser.add_argument("--tps", default=",".join(map(str, TPS)), help="attention TP sizes, comma-separated")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts M, comma-separated")
    parser.add_argument("--name", default=RUN_NAME, help="result file name (no extension)")
    args = parser.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()
    if args.prepare:
        prepare()
    else:
        main(args.out, args.smoke, tuple(int(v) for v in args.tps.split(",")),
             tuple(int(v) for v in args.rows.split(",")), args.name)
