#!/usr/bin/env python3
"""Device check and timing, block-FP8 GEMV run 22 (issue 6): wo_a with the fused inverse RoPE at T=1, the shipped seam
form beside the candidate GemvConfig.rope_before_wait (the position load and the (cos, sin) pair gather issued before
the PDL wait), interleaved in the same run.

Points: wo_a T=1 (G=8, R 1024, D 4096, 32 MiB), M = 8 / 4 / 2 / 1 (8 first: furthest from the 12 us target). T >= 2
is not timed: the seam's form there is not the one-shot program with rope pairs, so the flag does not apply.

Variants per point (labels):

* ``plain``: wo_a_config without the RoPE (what the RoPE costs on top, for reference);
* ``seam``: wo_a_config with the fused RoPE (the shipped ``_rp_ww1_pairs`` one-shot program; 1 row on the 2-row tile);
* ``rbw``: the same config with ``rope_before_wait=True`` (name suffix ``_rbw``).

``seam`` and ``rbw`` run in two position modes: ``warm`` (one positions / freqs tensor for every call, as runs 20 / 21
timed it: only a graph's first call finds them cold after the L2 flush) and ``cold`` (each rotating weight copy with
its own positions and freqs copy, so that every call's position and (cos, sin) loads miss L2, the latency chain the
candidate moves before the wait).

Every variant is checked against the float32 reference (relative error) and ``rbw`` against ``seam`` (bit for bit
under the interpreter; on the device the column says whether it is). Timing: one CUDA graph per variant (>= 20
calls over rotating weight copies, > 4x the H200's L2, as ``devicebench.time_rotating_calls``), then ROUNDS rounds
that replay every variant's graph once after an L2 flush, the order rotated per round; the median per variant over the
rounds. Each variant's registers / spills on the device (Triton's compiled kernel) are recorded.

``--smoke`` runs the logic on the CPU under the Triton interpreter (set here if unset) at reduced shapes, no timing.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time

if "--smoke" in sys.argv:  # before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

from device_fp8_gemv_run20 import compiled_resources  # noqa: E402

RUN_NAME = "fp8_gemv-h200-run22"
ROWS = (8, 4, 2, 1)
ROTATE_BYTES = 200 * 2**20  # distinct weight copies per graph: > 4x the H200's 50 MB L2
CALLS_PER_GRAPH = 21  # 3 passes over the 7 weight copies of 32 MiB
ROUNDS = 40
MAX_POS = 4096
MAX_REL_ERR = 1e-2


def variants(g, m: int, r: int, d: int, groups: int):
    """[(label, config, mode, cold)]: mode 'plain' / 'rope'; cold: per-copy positions and freqs."""
    seam = g.wo_a_config(m, r, d, groups, True)
    if not seam.rope_pairs:
        raise RuntimeError(f"wo_a_config({m}, {r}, {d}, {groups}, fused_rope=True) = {seam.name}: not the rope-pairs "
                           f"one-shot program the candidate modifies")
    rbw = dataclasses.replace(seam, rope_before_wait=True)
    return [("plain", g.wo_a_config(m, r, d, groups, False), "plain", False),
            ("seam_warm", seam, "rope", False), ("rbw_warm", rbw, "rope", False),
            ("seam_cold", seam, "rope", True), ("rbw_cold", rbw, "rope", True)]


def main(out_dir: str | None, smoke: bool) -> None:
    import torch

    from sglang_sm120.kernels import dsv4
    from sglang_sm120.kernels import fp8_gemv as g
    from sglang_sm120.kernels.harness import devicebench as db
    from sglang_sm120.kernels.harness.interpreter import interpreter_enabled, patch_bf16_dot

    if smoke and not interpreter_enabled():
        raise SystemExit("--smoke needs TRITON_INTERPRET=1 (set before Triton is imported)")
    if interpreter_enabled():
        patch_bf16_dot()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cpu" if smoke else "cuda"
    t_start = time.time()
    budget_s = float(os.environ.get("FP8_GEMV_BUDGET_S", "90"))
    head, rope_dim = dsv4.HEAD_DIM, dsv4.ROPE_DIM

    copy_gbs = float("nan") if smoke else db.copy_bandwidth_gbs()
    print(f"eager copy bandwidth {copy_gbs:.1f} GB/s (read+write)", flush=True)
    res = db.BenchResult(
        name=RUN_NAME,
        title=("Block-FP8 GEMV run 22: wo_a + fused inverse RoPE at T=1, the seam form beside rope_before_wait "
               "(positions and cos / sin pairs loaded before the PDL wait), interleaved CUDA-graph replays, weight "
               "copies rotated past L2"),
        columns=["T", "M", "label", "config", "us", "us_min", "vs_seam", "pct_copy", "rel_err", "equal_seam", "regs",
                 "spills"])
    res.extra["copy bandwidth (GB/s, read+write, eager, this run)"] = round(copy_gbs, 1)
    failures = {}
    gen = torch.Generator(device=dev).manual_seed(0)
    angles = torch.rand(MAX_POS, rope_dim // 2, device=dev, generator=gen) * (2 * math.pi)
    freqs = torch.view_as_real(torch.polar(torch.ones_like(angles), angles)).flatten(1).contiguous()

    r, k = dsv4.O_LORA_RANK, dsv4.HIDDEN_SIZE
    groups = dsv4.O_GROUPS  # T=1
    full = (r, k, groups)
    if smoke:  # reduced shapes (2 groups, 2 splits of one head each); the configs are the full shape's
        r, k, groups = 128, 2 * head, 2
    nbytes = groups * r * k
    copies = 1 if smoke else max(2, math.ceil(ROTATE_BYTES / nbytes))
    base = (torch.randn(groups, r, k, device=dev, generator=gen) * 0.5).to(g.FP8_DTYPE)
    scales = torch.exp2(torch.randint(-10, -5, (groups, r // 128, k // 128), device=dev, generator=gen).float())
    weights = [(base.clone(), scales.clone()) for _ in range(copies)]
    freq_copies = [freqs.clone() for _ in range(copies)]

    def pct(us):
        return round(100 * nbytes / (us * 1e-6) / 1e9 / copy_gbs, 1) if copy_gbs == copy_gbs and us == us else None

    for m in ROWS:
        if time.time() - t_start > budget_s:
            res.notes.append(f"stopped before M={m}: time budget {budget_s:.0f} s reached")
            break
        point = f"wo_a T=1 M={m}"
        x = torch.randn(m, groups, k, device=dev, generator=gen).to(torch.bfloat16)
        positions = torch.randint(0, MAX_POS, (m,), device=dev, generator=gen)
        positions[0] = MAX_POS - 1  # the table's last row among them
        pos_copies = [positions.clone() for _ in range(copies)]
        ref = g.reference_grouped_wo_a(x, *weights[0])
        ref_rope = g.reference_grouped_wo_a(x, *weights[0], positions, freqs, head, rope_dim)

        def call(i, cfg, mode, cold):
            w, s = weights[i]
            if mode == "plain":
                return g.grouped_fp8_wo_a(x, w, s, config=cfg)
            pos, fr = (pos_copies[i], freq_copies[i]) if cold else (positions, freqs)
            return g.grouped_fp8_wo_a(x, w, s, positions=pos, freqs=fr, head_dim=head, rope_dim=rope_dim, config=cfg)

        graphs, line, seam_out = {}, [], None
        for label, cfg, mode, cold in variants(g, m, *full):
            try:
                before = compiled_resources(g)
                y = call(0, cfg, mode, cold)
                new_res = [v for key, v in compiled_resources(g).items() if key not in before]
                err = db.relative_error(y, ref_rope if mode == "rope" else ref)
                equal = None
                if label == "seam_warm":
                    seam_out = y.clone()
                elif label.startswith("rbw") and seam_out is not None:
                    equal = bool(torch.equal(y, seam_out))
                if err > MAX_REL_ERR:
                    failures[f"{point} {label}"] = f"rel_err {err:.3g}"
                if smoke:
                    assert err < MAX_REL_ERR, (point, label, err)
                    assert equal is not False, (point, label, "differs from the seam form under the interpreter")
                row = dict(T=1, M=m, label=label, config=cfg.name, rel_err=float(f"{err:.3g}"), equal_seam=equal,
                           regs=new_res[0][0] if len(new_res) == 1 else None,
                           spills=new_res[0][1] if len(new_res) == 1 else None)
                fns = [(lambda i=i, c=cfg, md=mode, cd=cold: call(i, c, md, cd)) for i in range(copies)]
                for fn in fns:  # every copy once (split-K counters, JIT)
                    fn()
                if not smoke:
                    turn = [0]

                    def rotating(fns=fns, turn=turn):
                        fn = fns[turn[0] % len(fns)]
                        turn[0] += 1
                        return fn()
                    graphs[label] = db.capture_graph(rotating, calls=max(CALLS_PER_GRAPH, len(fns)), warmup=1)
                res.add(**row)
            except Exception as exc:
                failures[f"{point} {label}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(f"{point} {label} failed: {failures[f'{point} {label}']}", flush=True)
                if smoke:
                    raise
                try:
                    torch.cuda.synchronize()
                except Exception:
                    pass
        samples = {label: [] for label in graphs}
        if graphs:
            flush = db.l2_flush_buffer()
            labels = list(graphs)
            for rnd in range(ROUNDS):  # interleaved: every variant once per round, the order rotated
                for j in range(len(labels)):
                    label = labels[(rnd + j) % len(labels)]
                    samples[label].append(db.replay_us(graphs[label], flush, max(CALLS_PER_GRAPH, copies)))
            del flush
        rows = [row for row in res.rows if row["M"] == m]
        med = {label: statistics.median(v) for label, v in samples.items()}
        for row in rows:
            us = med.get(row["label"], float("nan"))
            seam_us = med.get(row["label"].replace("rbw", "seam"), float("nan"))
            row.update(us=round(us, 3) if us == us else None,
                       us_min=round(min(samples[row["label"]]), 3) if samples.get(row["label"]) else None,
                       vs_seam=round(us / seam_us, 4) if row["label"].startswith("rbw") and us == us and
                       seam_us == seam_us else None, pct_copy=pct(us))
            line.append(f"{row['label']} {us:.2f} (err {row['rel_err']:.3g}, regs {row['regs']})")
        print(f"[{time.time() - t_start:5.0f}s] {point}: " + ", ".join(line), flush=True)
        del graphs
        res.extra["failures"] = failures
        res.write(out_dir)  # partial results survive a later failure
        if not smoke:
            torch.cuda.empty_cache()
    res.extra["failures"] = failures
    res.notes += [
        "plain: wo_a_config without the RoPE; seam: wo_a_config with the fused RoPE (the shipped one-shot program, "
        "block 0's weight before the PDL wait, the rope block rotated from its own pairs); rbw: the same with "
        "GemvConfig.rope_before_wait (the position load and the (cos, sin) pair gather before the wait). vs_seam: rbw / "
        "seam in the same position mode. A default changes only where rbw is faster at every M beyond the noise.",
        "warm: one positions / freqs tensor for every call of the graph; cold: each weight copy has its own, so every "
        "call's position / cos / sin loads miss L2.",
        f"us: median over {ROUNDS} interleaved rounds of one replay per variant (after a 256 MiB L2 flush), per call "
        f"of a graph of {CALLS_PER_GRAPH} calls over {copies} rotating weight copies; us_min: the fastest round.",
        "pct_copy: FP8 weight bytes / time over this run's eager copy bandwidth (read+write). regs / spills: the "
        "compiled kernel of the variant's first call (None where that call compiled nothing new). equal_seam: rbw's "
        "output bit for bit seam's.",
    ]
    db.BenchResult.finish(res, out_dir, t_start)
    if failures:
        print("FAILURES:", failures, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter run at reduced shapes, no timing")
    args = parser.parse_args()
    main(args.out, args.smoke)
