#!/usr/bin/env python3
"""How the MoE decode's fp16 TMA GEMV launches fill an RTX PRO 6000 / RTX 5090 (sm_120), and the H200 for
comparison: a MODEL from AOT facts, not a measurement (there is no sm_120 GPU here).

For every (T, B) at which the fp16 TMA GEMV is the default (``moe_mxfp4.GEMV_TMA_F16_WHERE``), each launch's shipped
config is compiled ahead of time (registers and shared memory for sm_120a, and for sm_90a for the H200 rows), the
resident programs per SM follow from the per-SM limits (``kernels/harness/occupancy.py``), and the grid the launcher
would use gives the waves. The number of programs that do work depends on how many distinct experts the batch routes
to; the model takes the upper bound, every routed row on its own expert (exact at B=1, whose top-6 are distinct).
A "ragged" launch ends in a last wave of at most a quarter of the slots after a full one: those programs run with most
of the GPU idle for about one program's time (e.g. 384 programs with 2 resident per SM on 188 SMs: 376, then 8).

    python3 tools/sm120_occupancy.py --out docs/sm120-occupancy-moe.md    # compiles the configs (~15 s on 2 cores)
    python3 tools/sm120_occupancy.py --batches 1 2 --tp 1 2               # a subset, to stdout

``--dense``: the same model for the dense FP8 GEMV (``fp8_gemv``) on DSv4-Flash's seven linears, wo_a also with the
fused inverse RoPE where the seam fuses it (``sglang_sm120.dense.FUSED_ROPE_WHERE``; elsewhere it runs wo_a without),
at T = 1 / 2 / 4 / 8 and 1 / 2 / 4 / 8 / 16 rows. Its launch rules pick per SM
count, so each GPU's rows carry the form its own SM count picks (alone on the GPU; beside other streams some linears
take other forms, not modelled); the grid is the launcher's (``fp8_gemv.launch_grid``).

    python3 tools/sm120_occupancy.py --dense --out docs/sm120-occupancy-dense.md    # ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

from sglang_sm120.kernels import fp8_gemv  # noqa: E402
from sglang_sm120.kernels import moe_mxfp4 as moe  # noqa: E402
from sglang_sm120.kernels.dsv4 import (  # noqa: E402
    HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, NUM_EXPERTS, O_GROUPS, O_LORA_RANK, SUPPORTED_TP, TOP_K, dense_linear_shapes)
from sglang_sm120.kernels.harness import occupancy as occ  # noqa: E402
from sglang_sm120.dense import FUSED_ROPE_WHERE  # noqa: E402

GPUS = (*occ.SM120_GPUS, occ.H200)
ARCH_OF = {occ.RTX_PRO_6000: 120, occ.RTX_5090: 120, occ.H200: 90}


@dataclasses.dataclass(frozen=True)
class Launch:
    tp: int
    batch: int
    kind: str  # "gate_up" or "down"
    config: moe.GemvConfig

    @property
    def aot_name(self) -> str:  # the name moe_mxfp4.aot_configs gives this config
        return f"moe_mxfp4_{self.kind}_gemvtma_{self.config.label()}"

    def programs(self, gpu: occ.GpuLimits) -> int:
        """Programs that do work: one per (expert slot, column block), every routed row on its own expert (the upper
        bound); a persistent grid: the launcher's min(work items, SMs x programs per SM)."""
        rows = self.batch * TOP_K
        columns = (MOE_INTERMEDIATE_SIZE // self.tp if self.kind == "gate_up" else HIDDEN_SIZE) // self.config.block_n
        if self.config.persistent_programs_per_sm:
            return min(rows * columns, gpu.sms * self.config.persistent_programs_per_sm)
        return min(rows, NUM_EXPERTS) * columns


def default_launches(tps, batches) -> list[Launch]:
    """The gate/up and down launches of the fp16 TMA GEMV where it is the default, at the given T and B."""
    out = []
    for tp in tps:
        inter = MOE_INTERMEDIATE_SIZE // tp
        for batch in batches:
            if not moe.gemv_f16_default(batch * TOP_K, inter):
                continue
            gate_up, down = moe.gemv_configs(batch * TOP_K, inter)
            out += [Launch(tp, batch, "gate_up", gate_up), Launch(tp, batch, "down", down)]
    return out


def rows_for(launches, facts: dict) -> list[dict]:
    """One row per (launch, GPU): ``facts[(aot name, arch)] = (registers, shared bytes)``."""
    rows = []
    for launch in launches:
        for gpu in GPUS:
            registers, shared = facts[(launch.aot_name, ARCH_OF[gpu])]
            per_sm = occ.resident_programs_per_sm(gpu, launch.config.num_warps, registers, shared)
            w = occ.waves(gpu, launch.programs(gpu), per_sm)
            rows.append({"T": launch.tp, "B": launch.batch, "launch": launch.kind, "tile": launch.config.label(),
                         "gpu": gpu.name, "registers": registers, "shared": shared, "per_sm": per_sm,
                         "slots": w.slots, "programs": w.programs, "waves": round(w.waves, 2),
                         "last_wave": w.last_wave_programs, "ragged": w.ragged,
                         # a persistent grid sized for more resident programs per SM than fit: not all resident
                         "persistent_over": launch.config.persistent_programs_per_sm > per_sm})
    return rows


def compile_facts(launches, module=moe) -> dict:
    """``{(aot name, arch): (registers, shared bytes)}`` for the launches' configs, compiled ahead of time from
    ``module``'s AOT registry (``moe_mxfp4`` or ``fp8_gemv``); a launch whose config is not registered stops here."""
    from sglang_sm120.kernels.harness.aot import run_isolated

    module_name = module.__name__.rsplit(".", 1)[-1]
    names = sorted({launch.aot_name for launch in launches})
    shipped = {cfg.name for cfg in module.aot_configs()}
    missing = [n for n in names if n not in shipped]
    if missing:
        raise SystemExit(f"not among {module_name}.aot_configs(): {missing}")
    facts = {}
    for report, _problems in run_isolated(modules=(module_name,), archs=sorted(set(ARCH_OF.values())), only=names):
        if report.config in names:
            facts[(report.config, report.arch)] = (report.registers, report.shared_bytes)
    return facts


def markdown(rows) -> str:
    lines = ["# MoE decode (fp16 TMA GEMV) occupancy on sm_120: a model from AOT facts, not a measurement", "",
             "`python3 tools/sm120_occupancy.py`. Registers and shared memory from Triton's AOT compile (sm_120a for "
             "the RTX rows, sm_90a for the H200's), resident programs per SM from the per-SM limits "
             "(`kernels/harness/occupancy.py`: 100 KiB shared memory per SM on sm_120 with 1 KiB reserved per "
             "program, 228 KiB on sm_90, 65536 registers, 1536 / 2048 threads), programs from the launcher's grid with "
             "every routed row on its own expert (exact at B=1). Nothing here was run on an sm_120 GPU.", "",
             "| T | B | launch | tile | GPU | regs | smem B | per SM | slots | programs | waves | last wave | ragged |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['T']} | {r['B']} | {r['launch']} | `{r['tile']}` | {r['gpu']} | {r['registers']} | "
                     f"{r['shared']} | {r['per_sm']} | {r['slots']} | {r['programs']} | {r['waves']} | "
                     f"{r['last_wave']} | {'**yes**' if r['ragged'] else 'no'} |")
    ragged = [r for r in rows if r["ragged"]]
    lines += ["", f"Ragged launches: {len(ragged)} of {len(rows)}."]
    lines += [f"- T={r['T']} B={r['B']} {r['launch']} on {r['gpu']}: {r['programs']} programs, {r['per_sm']} per SM "
              f"({r['shared']} B of shared memory, {r['registers']} registers): {r['slots']} at once, then "
              f"{r['last_wave']}." for r in ragged]
    over = [r for r in rows if r["persistent_over"]]
    lines += ["", f"Persistent grids sized for more programs per SM than fit: {len(over)} of {len(rows)}."]
    lines += [f"- T={r['T']} B={r['B']} {r['launch']} (`{r['tile']}`) on {r['gpu']}: {r['per_sm']} fit per SM." for r in over]
    lines += ["", "What a ragged launch costs depends on how fast its last programs run with the GPU nearly to "
              "themselves, which this model does not know: at most about one program's time (a launch of 1.02 waves "
              "could take up to twice its one-wave time if every program took as long alone as in a full wave; "
              "bandwidth-bound programs run faster alone, so the cost is smaller)."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# --dense: the block-FP8 GEMV's launches
# ---------------------------------------------------------------------------------------------
DENSE_ROWS = (1, 2, 4, 8, 16)


@dataclasses.dataclass(frozen=True)
class DenseLaunch:
    gpu: occ.GpuLimits
    tp: int
    rows: int
    linear: str  # dsv4.dense_linear_shapes' name; "wo_a + RoPE": the seam's call with the fused inverse RoPE
    config: fp8_gemv.GemvConfig
    n: int
    k: int
    groups: int

    @property
    def rope(self) -> bool:
        return self.linear == "wo_a + RoPE"

    @property
    def aot_name(self) -> str:  # the name fp8_gemv.aot_configs gives the compiled form of this config
        return fp8_gemv.aot_config(fp8_gemv.compiled_form(self.config), self.rope).name

    def programs(self) -> int:
        grid, _split, _per_split = fp8_gemv.launch_grid(self.rows, self.n, self.k, self.groups, self.config,
                                                        self.gpu.sms)
        return math.prod(grid)


def dense_launches(tps, rows, gpus=GPUS) -> list[DenseLaunch]:
    """Every (GPU, T, linear, rows) launch of the dense FP8 GEMV with the form the launch rules pick for that GPU's SM
    count (``default_config``; wo_a also ``wo_a_config`` with the fused RoPE at the seam's FUSED_ROPE_WHERE)."""
    out = []
    for gpu in gpus:
        for tp in tps:
            for name, (n, k) in dense_linear_shapes(tp).items():
                groups = O_GROUPS // tp if name == "wo_a" else 1
                n = O_LORA_RANK if name == "wo_a" else n
                for m in rows:
                    out.append(DenseLaunch(gpu, tp, m, name, fp8_gemv.default_config(m, n, k, groups, sms=gpu.sms),
                                           n, k, groups))
                    if name == "wo_a" and (groups, m) in FUSED_ROPE_WHERE:
                        out.append(DenseLaunch(gpu, tp, m, "wo_a + RoPE",
                                               fp8_gemv.wo_a_config(m, n, k, groups, True, sms=gpu.sms), n, k, groups))
    return out


def dense_rows_for(launches, facts: dict) -> list[dict]:
    """One row per launch: ``facts[(aot name, arch)] = (registers, shared bytes)``."""
    rows = []
    for launch in launches:
        registers, shared = facts[(launch.aot_name, ARCH_OF[launch.gpu])]
        per_sm = occ.resident_programs_per_sm(launch.gpu, launch.config.num_warps, registers, shared)
        w = occ.waves(launch.gpu, launch.programs(), per_sm)
        rows.append({"T": launch.tp, "rows": launch.rows, "linear": launch.linear, "form": launch.config.name,
                     "gpu": launch.gpu.name, "registers": registers, "shared": shared, "per_sm": per_sm,
                     "slots": w.slots, "programs": w.programs, "waves": round(w.waves, 2),
                     "full_waves": w.full_waves, "last_wave": w.last_wave_programs, "ragged": w.ragged})
    return rows


def _launch_waves(r) -> int:
    """Waves of a launch, the partly filled last one counted."""
    return r["full_waves"] + (1 if r["last_wave"] else 0)


def dense_markdown(rows, triton_version: str = "") -> str:
    h200 = {(r["T"], r["rows"], r["linear"]): r for r in rows if r["gpu"] == occ.H200.name}
    lines = ["# Dense FP8 GEMV occupancy on sm_120: a model from AOT facts, not a measurement", "",
             "`python3 tools/sm120_occupancy.py --dense`. Each GPU's form is the one the launch rules pick for its SM "
             "count (alone on the GPU); registers and shared memory from Triton's AOT compile (sm_120a for the RTX "
             f"rows, sm_90a for the H200's; Triton {triton_version or 'of this environment'}: register counts move "
             "with the Triton version, and the H200 runs used the device's Triton, whose counts for some forms "
             "differ from these); resident programs per SM from the per-SM limits "
             "(`kernels/harness/occupancy.py`); the grid is the launcher's (`fp8_gemv.launch_grid`). The launch rules "
             "were measured on the H200's 132 SMs only. Nothing here was run on an sm_120 GPU.", "",
             f"{len(rows)} launches (T {sorted({r['T'] for r in rows})}, rows {sorted({r['rows'] for r in rows})}, "
             f"{len({r['linear'] for r in rows})} linears, {len({r['gpu'] for r in rows})} GPUs).", "",
             "## sm_12x launches that need more than one wave", "",
             "Waves count a partly filled last wave as one. 'H200' is the same (T, rows, linear) on the H200 with "
             "its own form: where the sm_12x GPU needs more waves than the H200 did, the H200's timing of the rule "
             "says less about it.", "",
             "| T | rows | linear | GPU | form | regs | smem B | per SM | programs | slots | waves | last wave | "
             "H200 waves |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    multi = [r for r in rows if r["gpu"] != occ.H200.name and _launch_waves(r) > 1]
    for r in multi:
        ref = h200.get((r["T"], r["rows"], r["linear"]))
        ref_text = f"{_launch_waves(ref)} ({ref['programs']} on {ref['slots']})" if ref else "-"
        lines.append(f"| {r['T']} | {r['rows']} | {r['linear']} | {r['gpu']} | `{r['form']}` | {r['registers']} | "
                     f"{r['shared']} | {r['per_sm']} | {r['programs']} | {r['slots']} | {r['waves']} | "
                     f"{r['last_wave']}{' (ragged)' if r['ragged'] else ''} | {ref_text} |")
    more = [r for r in multi if (ref := h200.get((r["T"], r["rows"], r["linear"]))) and
            _launch_waves(r) > _launch_waves(ref)]
    lines += ["", f"sm_12x launches of more than one wave: {len(multi)}; of these, more waves than the H200's: "
              f"{len(more)}."]
    lines += [f"- T={r['T']} {r['linear']} at {r['rows']} rows on {r['gpu']}: {r['programs']} programs, "
              f"{r['per_sm']} per SM ({r['registers']} registers): {r['slots']} at once, then {r['last_wave']} "
              f"(H200: {h200[(r['T'], r['rows'], r['linear'])]['programs']} programs on "
              f"{h200[(r['T'], r['rows'], r['linear'])]['slots']} slots)." for r in more]
    lines += ["", "A last wave of a few programs runs with most of the GPU idle for about one program's time; for the "
              "one-shot FP8 programs (wo_a / wo_b, one program's life is most of the launch) that can approach the "
              "launch's own time. What it costs on the GPU is not known here."]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dense", action="store_true", help="the dense FP8 GEMV's launches instead of the MoE decode's")
    p.add_argument("--tp", nargs="+", type=int, help="default: 1 2 4 (MoE; T = 8 cannot run the TMA GEMV), every "
                   "supported T with --dense")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--rows", nargs="+", type=int, default=list(DENSE_ROWS), help="--dense: rows per launch")
    p.add_argument("--out", help="markdown file (default: stdout)")
    args = p.parse_args()
    if args.dense:
        launches = dense_launches(args.tp or list(SUPPORTED_TP), args.rows)
        import triton

        text = dense_markdown(dense_rows_for(launches, compile_facts(launches, fp8_gemv)), triton.__version__)
    else:
        launches = default_launches(args.tp or [1, 2, 4], args.batches)
        text = markdown(rows_for(launches, compile_facts(launches)))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
