"""Ahead-of-time compilation of Triton kernels for sm_120a / sm_121a on a machine with no GPU.

Why this exists: there is no sm_120 GPU to run on, so every claim about sm_120 code rests on what
Triton and ptxas generate for it. This module compiles a kernel config for a target arch the way
the JIT would (same divisibility hints), then reads back

* the SASS opcode histogram (tensor-core opcodes: HMMA, QMMA, OMMA, and their ``.SF`` block-scaled
  forms),
* Triton's dynamic shared memory request (Triton only checks it at launch, so we check it here
  against sm_120's 101376-byte opt-in limit),
* registers, spill stores/loads and stack from ``ptxas -v`` re-run on Triton's PTX,
* which global loads are 128-bit wide (``LDG.E.128``) and whether cp.async (``LDGSTS``) is used.

Kernels declare their shipped configs with :class:`AotConfig` in a module-level ``aot_configs()``;
``sglang_sm120.kernels.aot_registry`` lists those modules, and ``tools/aot_sm120.py`` /
``sglang-sm120 aot-check`` / ``tests/kernels/test_aot_registry.py`` run the whole registry.

Under ``TRITON_INTERPRET=1`` (the CPU tests) kernels are interpreter objects and cannot be
compiled: tests call :func:`run_isolated`, which compiles in a child process with it off.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import os
import re
import subprocess
import tempfile
import time
from typing import Callable, Mapping, Sequence

from ..dsv4 import SM120_ARCHS, SM120_SMEM_LIMIT

MIN_MAX_REGISTERS, MAX_REGISTERS = 24, 255  # ptxas' range for .maxnreg (a register cap per thread)

TENSOR_CORE_OPCODES = ("HMMA", "QMMA", "OMMA", "IMMA", "HGMMA", "QGMMA", "UTCHMMA", "UTCQMMA", "UTCOMMA")

_SASS_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")


@dataclasses.dataclass(frozen=True)
class AotConfig:
    """One shipped launch configuration of a Triton kernel.

    ``signature`` maps every kernel argument to Triton's type string (``"*bf16"``, ``"i32"``,
    ``"constexpr"`` ...); ``constexprs`` gives the constexpr values. ``div16`` names integer
    arguments the JIT will see as multiples of 16 (pointers get the hint automatically, as the
    JIT gives it to 16-byte-aligned tensors). ``expect_opcodes`` are SASS opcode prefixes that
    must each appear at least once (``"QMMA.SF"``, ``"HMMA.16816.F32.BF16"``); ``forbid_opcodes``
    must not appear.
    """

    name: str
    kernel: object
    signature: Mapping[str, str]
    constexprs: Mapping[str, object]
    num_warps: int = 4
    num_stages: int = 2
    div16: Sequence[str] = ()
    expect_opcodes: Sequence[str] = ()
    forbid_opcodes: Sequence[str] = ()
    max_spill_bytes: int = 0
    max_registers: int = 0  # ptxas register cap per thread (Triton's maxnreg option); 0: none
    archs: Sequence[int] = SM120_ARCHS
    note: str = ""


@dataclasses.dataclass
class AotReport:
    config: str
    arch: int
    ok: bool
    error: str = ""
    compile_s: float = 0.0
    ptx_target: str = ""
    shared_bytes: int = 0
    registers: int = -1
    spill_store_bytes: int = -1
    spill_load_bytes: int = -1
    stack_bytes: int = -1
    opcodes: dict = dataclasses.field(default_factory=dict)  # full opcode -> count

    def count(self, prefix: str) -> int:
        """Number of SASS instructions whose opcode is ``prefix`` or starts with ``prefix.``."""
        return sum(n for op, n in self.opcodes.items() if op == prefix or op.startswith(prefix + "."))

    @property
    def tensor_core_opcodes(self) -> dict:
        return {op: n for op, n in self.opcodes.items() if op.split(".")[0] in TENSOR_CORE_OPCODES}

    @property
    def wide_loads(self) -> int:
        """Global loads 16 bytes wide (LDG.E.128 / LDG.E.ENL2.256 ...) plus cp.async LDGSTS.128."""
        return sum(n for op, n in self.opcodes.items()
                   if op.startswith(("LDG", "LDGSTS")) and (".128" in op or ".256" in op))

    @property
    def narrow_loads(self) -> int:
        return sum(n for op, n in self.opcodes.items()
                   if op.startswith(("LDG", "LDGSTS")) and ".128" not in op and ".256" not in op)

    def problems(self, cfg: AotConfig) -> list[str]:
        """Every way this report falls short of what ``cfg`` promises; empty when it passes."""
        if not self.ok:
            return [f"compile failed: {self.error}"]
        out = []
        if self.shared_bytes > SM120_SMEM_LIMIT:
            out.append(f"shared memory {self.shared_bytes} B > sm_120 limit {SM120_SMEM_LIMIT} B")
        spills = max(self.spill_store_bytes, 0) + max(self.spill_load_bytes, 0)
        if self.spill_store_bytes < 0:
            out.append("ptxas -v gave no spill figures")
        elif spills > cfg.max_spill_bytes:
            out.append(f"spills {self.spill_store_bytes} B stored / {self.spill_load_bytes} B loaded"
                       f" > budget {cfg.max_spill_bytes} B")
        for op in cfg.expect_opcodes:
            if self.count(op) == 0:
                out.append(f"expected SASS opcode {op} not found (tensor-core ops: {self.tensor_core_opcodes})")
        for op in cfg.forbid_opcodes:
            if self.count(op):
                out.append(f"forbidden SASS opcode {op} found {self.count(op)}x")
        return out

    def summary(self) -> str:
        if not self.ok:
            return f"{self.config} sm_{self.arch}a: COMPILE FAILED: {self.error[:300]}"
        tc = ", ".join(f"{k}x{v}" for k, v in sorted(self.tensor_core_opcodes.items())) or "none"
        return (f"{self.config} sm_{self.arch}a: smem {self.shared_bytes}/{SM120_SMEM_LIMIT} B, "
                f"regs {self.registers}, spills {self.spill_store_bytes}/{self.spill_load_bytes} B, "
                f"16B loads {self.wide_loads} (narrower {self.narrow_loads}), MMA: {tc}")


def _triton_tool(name: str) -> str:
    from triton import knobs

    return getattr(knobs.nvidia, name).path


def _ptxas_path(arch: int) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(arch).path


def _run_tool(args: list[str], data: bytes | str, suffix: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel" + suffix)
        with open(path, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        return subprocess.run([*args, path], capture_output=True, text=True, cwd=tmp)


def sass_opcodes(cubin: bytes) -> collections.Counter:
    proc = _run_tool([_triton_tool("cuobjdump"), "-sass"], cubin, ".cubin")
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {proc.stderr.strip()}")
    ops = collections.Counter()
    for line in proc.stdout.splitlines():
        m = _SASS_INSTR.match(line)
        if m:
            ops[m.group(1)] += 1
    return ops


def ptxas_resources(ptx: str, arch: int) -> dict:
    """Registers, spills and stack from ``ptxas -v`` on Triton's PTX, with Triton's own flags."""
    from triton.backends.nvidia.compiler import sm_arch_from_capability

    proc = _run_tool([_ptxas_path(arch), "-v", "--regAllocOptLevel=2", f"--gpu-name={sm_arch_from_capability(arch)}",
                      "-o", "/dev/null"], ptx, ".ptx")
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed: {log.strip()[-1000:]}")
    found = {}
    for key, pattern in (("registers", r"Used (\d+) registers"), ("spill_store_bytes", r"(\d+) bytes spill stores"),
                         ("spill_load_bytes", r"(\d+) bytes spill loads"), ("stack_bytes", r"(\d+) bytes stack frame")):
        m = re.search(pattern, log)
        if m:
            found[key] = int(m.group(1))
    return found


def register_cap_option(max_registers: int) -> dict:
    """Triton's option for a ptxas register cap per thread (``maxnreg``, at launch or compile): none for 0."""
    return {"maxnreg": max_registers} if max_registers else {}


def check_register_cap(what: str, max_registers: int) -> None:
    """Refuse a register cap outside ptxas' range; ``what`` names it in the error (``"PairsConfig.max_registers"``)."""
    if max_registers and not MIN_MAX_REGISTERS <= max_registers <= MAX_REGISTERS:
        raise ValueError(f"{what} must be 0 (no cap) or in [{MIN_MAX_REGISTERS}, {MAX_REGISTERS}], got {max_registers}")


def compile_kernel(cfg: AotConfig, arch: int):
    """Triton's compiled kernel of ``cfg`` for ``cuda:arch`` (pointer and ``div16`` arguments 16-divisible, the
    config's warps, stages and register cap), Triton's own stdout swallowed (it prints the whole PTX when ptxas
    fails). The one compile path of the AOT check and of the tools that read the SASS themselves."""
    import triton
    from triton.backends.compiler import GPUTarget

    arg_names = list(cfg.kernel.arg_names)
    div16 = set(cfg.div16)
    attrs = {(arg_names.index(n),): [["tt.divisibility", 16]]
             for n, ty in cfg.signature.items() if ty.startswith("*") or n in div16}
    src = triton.compiler.ASTSource(fn=cfg.kernel, signature=dict(cfg.signature), constexprs=dict(cfg.constexprs),
                                    attrs=attrs)
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, **register_cap_option(cfg.max_registers)}
    with contextlib.redirect_stdout(io.StringIO()):
        return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def compile_config(cfg: AotConfig, arch: int) -> AotReport:
    """Compile ``cfg`` for ``cuda:arch`` and read back its code-generation report."""
    missing = [a for a in cfg.kernel.arg_names if a not in cfg.signature]
    if missing:
        return AotReport(cfg.name, arch, False, error=f"signature lacks arguments {missing}")
    t0 = time.time()
    try:
        compiled = compile_kernel(cfg, arch)
        ptx = compiled.asm["ptx"]
        report = AotReport(cfg.name, arch, True, compile_s=round(time.time() - t0, 2))
        m = re.search(r"^\.target\s+(\S+)", ptx, re.M)
        report.ptx_target = m.group(1) if m else ""
        report.shared_bytes = int(compiled.metadata.shared)
        report.opcodes = dict(sass_opcodes(compiled.asm["cubin"]))
        for key, value in ptxas_resources(ptx, arch).items():
            setattr(report, key, value)
        return report
    except Exception as exc:  # compile errors are results here, reported per config
        return AotReport(cfg.name, arch, False, error=f"{type(exc).__name__}: {str(exc).strip()[-2000:]}",
                         compile_s=round(time.time() - t0, 2))


def check_configs(configs: Sequence[AotConfig], archs: Sequence[int] | None = None,
                  log: Callable[[str], None] | None = None) -> list[tuple[AotConfig, AotReport, list[str]]]:
    results = []
    for cfg in configs:
        for arch in (archs or cfg.archs):
            report = compile_config(cfg, arch)
            problems = report.problems(cfg)
            if log:
                log(("ok    " if not problems else "FAIL  ") + report.summary()
                    + "".join(f"\n        - {p}" for p in problems))
            results.append((cfg, report, problems))
    return results


# Left out of the AOT children's environment, so a report does not depend on what the calling process imported:
# TRITON_INTERPRET (set by the CPU tests), and the ptxas redirects that importing SGLang sets as a side effect
# (FlashInfer's ``flashinfer.triton`` points TRITON_PTXAS_BLACKWELL_PATH at a system ptxas of CUDA >= 13 found on
# PATH; with it Triton emits older PTX and compiles with that ptxas). The children compile with Triton's bundled
# ptxas, as ``sglang-sm120 aot-check`` does unless the caller sets these variables itself.
ISOLATED_ENV_DROP = ("TRITON_INTERPRET", "TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH")


def run_isolated(modules: Sequence[str] | None = None, archs: Sequence[int] | None = None,
                 only: Sequence[str] = (), timeout: float = 3000,
                 workers: int | None = None) -> list[tuple[AotReport, list[str]]]:
    """Compile the registered configs of ``modules`` (names under ``sglang_sm120.kernels``; default:
    the whole registry) in fresh processes with the interpreter off, and return (report, problems).

    Needed because under ``TRITON_INTERPRET=1`` (as the CPU tests run) ``@triton.jit`` makes
    interpreter functions that cannot be compiled; the child processes import the kernels afresh, in the
    caller's environment less :data:`ISOLATED_ENV_DROP` (Triton's bundled ptxas, whatever was imported before).
    The configs are dealt out to ``workers`` children (default: one per usable CPU, at most 4) that
    compile at the same time, since one compile (Triton + ptxas) keeps one core busy.
    """
    import json
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if k not in ISOLATED_ENV_DROP}
    args = [sys.executable, "-m", __name__]
    if modules is not None:
        args += ["--modules", ",".join(modules)]
    for arch in archs or ():
        args += ["--arch", str(arch)]
    for sub in only:
        args += ["--only", sub]
    if workers is None:
        workers = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
    children = [subprocess.Popen(args + ["--shard", str(i), "--shards", str(workers)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env, cwd="/") for i in range(workers)]
    deadline = time.monotonic() + timeout
    rows = []
    try:
        for child in children:
            out, err = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if child.returncode != 0:
                raise RuntimeError(f"AOT worker failed:\n{err[-4000:]}")
            rows += json.loads(out.strip().splitlines()[-1])
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return [(AotReport(**row["report"]), row["problems"]) for row in rows]


def _worker(argv: Sequence[str] | None = None) -> None:
    import argparse
    import json

    from ..aot_registry import KERNEL_MODULES, all_configs

    parser = argparse.ArgumentParser()
    parser.add_argument("--modules")
    parser.add_argument("--arch", type=int, action="append")
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--shard", type=int, default=0, help="compile every shards-th config from this one")
    parser.add_argument("--shards", type=int, default=1)
    args = parser.parse_args(argv)
    modules = tuple(args.modules.split(",")) if args.modules else KERNEL_MODULES
    configs = [c for c in all_configs(modules) if not args.only or any(s in c.name for s in args.only)]
    configs = configs[args.shard::args.shards]
    rows = [{"report": dataclasses.asdict(r), "problems": p} for _c, r, p in check_configs(configs, args.arch)]
    print(json.dumps(rows))


if __name__ == "__main__":
    _worker()
