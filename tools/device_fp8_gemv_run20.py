#!/usr/bin/env python3
"""Device check and timing, block-FP8 GEMV run 20: run 19's defaults beside the ones before them, and wo_a with the
fused inverse RoPE as the seam runs it, with register-capped candidates of the one-shot program.

Points (T=1 first, wo_a M=8 first: the issue's hardest point), every variant reference-checked (float32 reference,
relative error) and CUDA-graph timed over rotating weight copies (``devicebench.time_rotating_calls``, as in runs 9-19):

* wo_a T=1, M = 8 / 2 / 4 / 1: ``old`` / ``new`` = wo_a_config without the RoPE before run 19 (USE_W_BEFORE_WAIT
  False) / now; ``seam_old`` / ``seam_new`` = wo_a_config with the fused RoPE (the seam's form at G=8); with the RoPE:
  ``ww1`` (the one-shot with block 0's weight before the PDL wait, the rope block preloaded: run 19's 144-register
  program), ``ww1_r128`` (the same with ptxas capped at 128 registers: 4 programs per SM on the H200; since run 20
  ``seam_new``); ``sep_new`` = upstream's Triton inverse RoPE (flat kernel, the stand-in of
  device_wo_a_rope.py) then the kernel without RoPE (the seam's unfused branch, for FUSED_ROPE_WHERE);
* wo_b T=1, M = 8 / 2 / 1: ``old`` / ``new`` default_config;
* wq_b T=1, M = 8 / 1 and T=4 (wo_a with and without the RoPE, wo_b, wq_b at M = 1 / 2 / 4 / 8): the defaults
  (unchanged by run 19: timed once where old == new).

Run 20 also timed blocks 0..1 before the wait capped at 128 registers (``ww2_r128``, wo_a with and without the RoPE,
wo_b): it lost to ww1 everywhere and was removed (``fp8_gemv-h200-run20.md``).

``--run21`` (prepared in round 21, not run): wo_a with the fused RoPE at T=1, M = 8 / 2 / 4 / 1 only, the default
beside GemvConfig.rope_pairs (the rope block rotated from its own pairs in registers), uncapped and capped.

Each variant's registers / spills on the device (Triton's compiled kernel) are recorded. ``--smoke`` runs the logic
on the CPU under the Triton interpreter at reduced shapes (no timing; the RoPE stand-in is the torch rotation).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402
from device_fp8_gemv import module_flag  # noqa: E402

ensure_kernels_importable()

RUN_NAME = "fp8_gemv-h200-run20"
UPSTREAM_ROPE_FILE = "dsv4_rope.py"  # written by device_wo_a_rope.py --prepare
ROTATE_BYTES = 200 * 2**20  # distinct weight copies per graph: > 4x the H200's 50 MB L2
MAX_POS = 4096
MAX_REL_ERR = 1e-2
REGISTER_CAP = 128  # sm_90a: 65536 registers / (4 programs x 128 threads)
POINTS = (("wo_a", 1, (8, 2, 4, 1)), ("wo_b", 1, (8, 2, 1)), ("wq_b", 1, (8, 1)),
          ("wo_a", 4, (1, 2, 4, 8)), ("wo_b", 4, (1, 2, 8)), ("wq_b", 4, (1, 8)))
# --run21 (prepared in round 21, not run): wo_a + fused RoPE at T=1 only, GemvConfig.rope_pairs beside the default
RUN21_NAME = "fp8_gemv-h200-run21"
RUN21_POINTS = (("wo_a", 1, (8, 2, 4, 1)),)


def run21_variants(g, name: str, tp: int, m: int, n: int, k: int, groups: int):
    """--run21: ``new`` = wo_a_config's plain form, ``seam`` = wo_a_config with the fused RoPE (since run 20 at 2..8
    rows the one-shot with block 0 before the wait and the rope block preloaded, capped at the one-wave register
    count); ``pairs`` = that program with the rope block rotated from its own (re, im) pairs (GemvConfig.rope_pairs:
    no partner load, cos / sin per pair; sm_90a Triton 3.6: 128 registers uncapped, no spills), uncapped and with the
    seam's cap (1 row: the 2-row seam form's)."""
    replace = dataclasses.replace
    seam = g.wo_a_config(m, n, k, groups, True)
    seam2 = g.wo_a_config(2, n, k, groups, True)
    out = [("new", g.wo_a_config(m, n, k, groups, False), "plain"), ("seam", seam, "rope")]
    if seam2.w_before_wait:
        pairs = replace(seam2, rope_pairs=True, max_registers=0)
        out += [("pairs", pairs, "rope"), ("pairs_cap", replace(pairs, max_registers=seam2.max_registers), "rope")]
    return _distinct(out)


def _distinct(out):
    seen, unique = {}, []
    for label, cfg, mode in out:  # one timing per distinct (config, mode); later labels alias the first
        if (cfg, mode) in seen:
            seen[cfg, mode][0].append(label)
            continue
        entry = ([label], cfg, mode)
        seen[cfg, mode] = entry
        unique.append(entry)
    return unique


def variants(g, name: str, tp: int, m: int, n: int, k: int, groups: int):
    """[(label, config, mode)], mode 'plain' / 'rope' (fused) / 'sep' (standalone RoPE, then the plain kernel)."""
    replace = dataclasses.replace
    out = []
    if name == "wo_a":
        with module_flag(g, "USE_W_BEFORE_WAIT", False):  # the defaults before run 19
            old, seam_old = g.wo_a_config(m, n, k, groups, False), g.wo_a_config(m, n, k, groups, True)
        out += [("old", old, "plain"), ("new", g.wo_a_config(m, n, k, groups, False), "plain"),
                ("seam_old", seam_old, "rope"), ("seam_new", g.wo_a_config(m, n, k, groups, True), "rope")]
        if tp == 1:
            seam2 = g.wo_a_config(2, n, k, groups, True)  # the one-shot seam form (2..8 rows)
            if seam2.k_unroll == g.ONE_SHOT_BLOCKS:
                ww1 = replace(seam2, w_before_wait=1, max_registers=0)
                out += [("ww1", ww1, "rope"), ("ww1_r128", replace(ww1, max_registers=REGISTER_CAP), "rope")]
            out.append(("sep_new", g.wo_a_config(m, n, k, groups, False), "sep"))
    else:
        with module_flag(g, "USE_W_BEFORE_WAIT", False):
            old = g.default_config(m, n, k, groups)
        out += [("old", old, "plain"), ("new", g.default_config(m, n, k, groups), "plain")]
    return _distinct(out)


def compiled_resources(g):
    """{kernel cache key repr: (n_regs, n_spills)} of every compiled fp8_gemv kernel so far (empty if this Triton
    keeps its caches elsewhere)."""
    found = {}
    for kern in (g._block_fp8_gemv_fp8mma_kernel, g._block_fp8_gemv_kernel, g._block_fp8_gemv_rows_kernel):
        try:
            for cache in kern.device_caches.values():
                for key, ck in cache[0].items():
                    found[(kern.fn.__name__, repr(key))] = (getattr(ck, "n_regs", None), getattr(ck, "n_spills", None))
        except Exception:
            pass
    return found


def main(out_dir: str | None, smoke: bool, run21: bool = False) -> None:
    import torch

    from sglang_sm120.kernels import dsv4
    from sglang_sm120.kernels import fp8_gemv as g
    from sglang_sm120.kernels.harness import devicebench as db

    torch.backends.cuda.matmul.allow_tf32 = False
    if smoke:  # the interpreter's bf16 tl.dot is wrong unless patched (as tests/conftest.py does)
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()
    dev = "cpu" if smoke else "cuda"
    t_start = time.time()
    budget_s = float(os.environ.get("FP8_GEMV_BUDGET_S", "140"))
    head, rope_dim = dsv4.HEAD_DIM, dsv4.ROPE_DIM

    if not smoke:
        import upstream as up

        rope_mod = up.load(UPSTREAM_ROPE_FILE)
        rope_mod.set_batched_rope(True)

    def rotate_inplace(work, positions):
        """The seam's unfused branch's RoPE launch on the attention output [M, heads, head], in place."""
        if smoke:  # the interpreter: the kernel module's bf16 reference rotation
            m = work.shape[0]
            work.copy_(g._inverse_rope_bf16(work.view(m, 1, -1), positions, freqs, head, rope_dim).view_as(work))
            return
        rope_mod.apply_rotary_emb_triton(work[..., -rope_dim:], freqs_cis, positions=positions, inverse=True)

    def timed(fns):
        return db.time_rotating_calls(fns, dry_run=smoke)

    copy_gbs = float("nan") if smoke else db.copy_bandwidth_gbs()
    print(f"eager copy bandwidth {copy_gbs:.1f} GB/s (read+write)", flush=True)
    res = db.BenchResult(
        name=RUN21_NAME if run21 else RUN_NAME,
        title=(("Block-FP8 GEMV run 21: wo_a with the fused RoPE, the rope block rotated from its own pairs "
                "(rope_pairs) beside the default" if run21 else
                "Block-FP8 GEMV run 20: run 19's defaults (one-shot program, first block before the PDL wait) beside "
                "the ones before; wo_a with the fused RoPE, register-capped one-shot candidates")
               + " (CUDA-graph timed, weight copies rotated past L2)"),
        columns=["linear", "T", "M", "mode", "labels", "config", "us", "pct_copy", "rel_err", "regs", "spills"])
    res.extra["copy bandwidth (GB/s, read+write, eager, this run)"] = round(copy_gbs, 1)
    failures = {}
    gen = torch.Generator(device=dev).manual_seed(0)
    angles = torch.rand(MAX_POS, rope_dim // 2, device=dev, generator=gen) * (2 * math.pi)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    freqs = torch.view_as_real(freqs_cis).flatten(1)  # what MQALayer.forward hands fused_rope_wo_a_bf16

    def pct(nbytes, us):
        return round(100 * nbytes / (us * 1e-6) / 1e9 / copy_gbs, 1) if copy_gbs == copy_gbs and us == us else None

    # every point, T=4 included: the garbage the T=4 bf16 tile (dot_m16_n32, 4..8 rows) once returned here was the
    # interpreter's unpatched bf16 tl.dot, not the kernel
    pick = run21_variants if run21 else variants
    for name, tp, rows in (RUN21_POINTS if run21 else POINTS):
        n, k = dsv4.dense_linear_shapes(tp)[name]
        is_wo_a = name == "wo_a"
        groups = dsv4.O_GROUPS // tp if is_wo_a else 1
        r = dsv4.O_LORA_RANK if is_wo_a else n
        full = (r, k, groups)
        if smoke:  # reduced shapes; the configs are the full shape's
            r, k, groups = (128, 2 * head, 2) if is_wo_a else (256, 1024, 1)  # wo_a: 2 splits of one head
        nbytes = groups * r * k
        copies = 1 if smoke else max(2, math.ceil(ROTATE_BYTES / nbytes))
        base = (torch.randn(groups, r, k, device=dev, generator=gen) * 0.5).to(g.FP8_DTYPE)
        scales = torch.exp2(torch.randint(-10, -5, (groups, r // 128, k // 128), device=dev, generator=gen).float())
        if not is_wo_a:
            base, scales = base[0], scales[0]
        weights = [(base.clone(), scales.clone()) for _ in range(copies)]
        for m in rows:
            if time.time() - t_start > budget_s:
                res.notes.append(f"stopped before {name} T={tp} M={m}: time budget {budget_s:.0f} s reached")
                break
            point = f"{name} T={tp} M={m}"
            if is_wo_a:
                o_attn = torch.randn(m, groups * k // head, head, device=dev, generator=gen).to(torch.bfloat16)
                x = o_attn.view(m, groups, k)
                positions = torch.randint(0, MAX_POS, (m,), device=dev, generator=gen)
                ref = g.reference_grouped_wo_a(x, *weights[0])
                ref_rope = g.reference_grouped_wo_a(x, *weights[0], positions, freqs, head, rope_dim)
                work = o_attn.clone()
            else:
                x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
                ref = g.reference_block_fp8_linear(x, *weights[0])

            def run(w, s, cfg, mode):
                if not is_wo_a:
                    return g.block_fp8_linear(x, w, s, config=cfg)
                if mode == "rope":
                    return g.grouped_fp8_wo_a(x, w, s, positions=positions, freqs=freqs, head_dim=head,
                                              rope_dim=rope_dim, config=cfg)
                if mode == "sep":
                    rotate_inplace(work, positions)
                    return g.grouped_fp8_wo_a(work.view(m, groups, k), w, s, config=cfg)
                return g.grouped_fp8_wo_a(x, w, s, config=cfg)

            line = []
            for labels, cfg, mode in pick(g, name, tp, m, *full):
                try:
                    before = compiled_resources(g)
                    if mode == "sep":
                        work.copy_(o_attn)
                    err = db.relative_error(run(*weights[0], cfg, mode), ref_rope if mode != "plain" and is_wo_a
                                            else ref)
                    if err > MAX_REL_ERR:
                        failures[f"{point} {labels[0]}"] = f"rel_err {err:.3g}"
                    if smoke:
                        assert err < MAX_REL_ERR, (point, labels, err)
                    new_res = [v for key, v in compiled_resources(g).items() if key not in before]
                    regs = new_res[0][0] if len(new_res) == 1 else None
                    spills = new_res[0][1] if len(new_res) == 1 else None
                    # mode sep: the graph replays the in-place rotation of the same buffer (timed, checked once above)
                    us = timed([(lambda w=w, s=s, c=cfg: run(w, s, c, mode)) for w, s in weights])
                    res.add(linear=name, T=tp, M=m, mode=mode, labels="/".join(labels), config=cfg.name,
                            us=round(us, 3) if us == us else None, pct_copy=pct(nbytes, us),
                            rel_err=float(f"{err:.3g}"), regs=regs, spills=spills)
                    line.append(f"{'/'.join(labels)}[{mode}] {us:.2f} (err {err:.3g}, regs {regs})")
                except Exception as exc:
                    failures[f"{point} {labels[0]} {mode}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    print(f"{point} {labels} {mode} failed: {failures[f'{point} {labels[0]} {mode}']}", flush=True)
                    if smoke:
                        raise
                    try:
                        torch.cuda.synchronize()
                    except Exception:
                        pass
            print(f"[{time.time() - t_start:5.0f}s] {point}: " + ", ".join(line), flush=True)
        del weights
        res.extra["failures"] = failures
        res.write(out_dir)  # partial results survive a later failure
        if not smoke:
            torch.cuda.empty_cache()
    res.extra["failures"] = failures
    if run21:
        res.notes.append("run 21 variants (run21_variants): new = wo_a_config without the RoPE; seam = with it (the "
                         "default); pairs / pairs_cap = the seam's one-shot with GemvConfig.rope_pairs, uncapped / "
                         "at the seam's register cap. A default changes only where pairs is >= 2 % faster.")
    res.notes += [
        "old: the form default_config / wo_a_config picked before run 19's defaults (USE_W_BEFORE_WAIT = False); new: "
        "the form they pick in this code; seam_*: wo_a_config with the fused inverse RoPE (the seam's call at G=8, "
        "and at G=2 for 1..2 rows); labels joined by / are one config timed once.",
        "ww1: the one-shot FP8 program (4 warps, the split's 4 K blocks in one iteration, 8 partials per sum step) "
        "with block 0's weight and scale loaded before the PDL wait, the rope block preloaded (run 19's); _r128: ptxas "
        "capped at 128 registers per thread (GemvConfig.max_registers: 4 programs per SM on the H200, one wave of 512 "
        "programs); ww2: blocks 0..1 before the wait (removed after run 20).",
        "sep_new (mode sep): upstream's Triton inverse RoPE (flat kernel, the stand-in of device_wo_a_rope.py for "
        "fused_rope_inplace) on the attention output in place, then the kernel without RoPE (new default): the seam's "
        "unfused branch. Its timing graph rotates the same buffer on every call (time, not checked after the first).",
        "pct_copy: FP8 weight bytes / time over this run's eager copy bandwidth (read+write). regs / spills: the "
        "compiled kernel of the variant's first call (None where that call compiled nothing new or several kernels).",
    ]
    db.BenchResult.finish(res, out_dir, t_start)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter run at reduced shapes, no timing")
    parser.add_argument("--run21", action="store_true",
                        help="run 21 (prepared): wo_a + fused RoPE at T=1, GemvConfig.rope_pairs beside the default")
    args = parser.parse_args()
    main(args.out, args.smoke, args.run21)
