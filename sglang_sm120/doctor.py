"""``sglang-sm120 doctor``: is this install usable, what would the plugin do here, and how to serve.

Works without a GPU. Exit code 0 when the install is usable (supported SGLang, torch and Triton
import), non-zero with the reason when it is not. A machine without an sm_12x GPU is usable (the
kernels can be checked there) but the seams stay inactive unless ``SGLANG_SM120_FORCE=1``. In a PD
server's environment (``SGLANG_SM120_PD_ROLE`` from a plan) it also runs the ``disagg`` seam's checks
that need only the environment; their problems make the verdict not usable. With nixl installed it runs a NIXL
loopback transfer with this environment's settings; a failure is a row of the report, and in a PD server's
environment a problem too.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Callable

from .seams import (ENV_DISABLE, ENV_FORCE, FORCE_OFF, FORCE_ON, SEAM_NAMES, REGISTRY, SeamState, activation,
                    unknown_disabled_names, unrecognised_force_value, visible_sm12x)
from .versions import (SUPPORTED_NIXL, SUPPORTED_SGLANG, TESTED_TORCH, TESTED_TRITON, installed_version)

MODEL = "deepseek-ai/DeepSeek-V4-Flash"


def gpu_inventory() -> list[dict]:
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        gpus = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": props.name, "capability": (props.major, props.minor),
                         "memory_gib": props.total_memory / 2**30})
        return gpus
    except Exception:
        return []


def p2p_matrix(count: int) -> list[list[bool]] | None:
    if count < 2:
        return None
    import torch

    return [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(count)] for i in range(count)]


def suggested_tp(gpu_count: int) -> int:
    """The largest tensor-parallel size DSv4-Flash's head/expert split allows on these GPUs."""
    from .kernels.dsv4 import SUPPORTED_TP

    fitting = [t for t in SUPPORTED_TP if t <= max(gpu_count, 1)]
    return max(fitting)


def launch_command(tp: int) -> str:
    return (f"python -m sglang.launch_server --model-path {MODEL} --tp {tp} --moe-runner-backend sm120"
            f"  # with MTP add: --speculative-moe-runner-backend sm120")


def _version_line(name: str, dist: str, supported: tuple[str, ...] | None) -> tuple[str, str, bool]:
    version = installed_version(dist)
    if version is None:
        return name, "not installed", False
    if supported is None:
        return name, version, True
    ok = version in supported
    return name, f"{version} ({'supported' if ok else 'untested; tested: ' + ', '.join(supported)})", ok


def seam_decisions(gpu: tuple[bool, str]) -> list[tuple[str, str, str]]:
    """(seam, state, reason) for every seam, as ``register()`` would decide in this environment."""
    from .plugin import build_registry, sglang_supported

    ok, why = sglang_supported()
    if not ok:
        return [(name, "not hooked", why) for name in SEAM_NAMES]
    build_registry()
    rows = []
    for seam in REGISTRY:
        if seam.state is SeamState.FAILED:
            rows.append((seam.name, seam.state.value, seam.reason))
            continue
        state, reason = activation(seam, os.environ, gpu)
        rows.append((seam.name, state.value, reason))
    return rows


def disagg_environment_check(environ=os.environ) -> tuple[list[str], list[str]]:
    """(lines, problems) of the disagg seam's checks when ``environ`` is a PD server's from a plan; nothing otherwise.
    doctor sees this environment but no server's command line, so the check that needs one is skipped, and said so."""
    from . import disagg
    from .pd.planner import ENV_LAYOUT, ENV_NAME, ENV_ROLE, LAYOUT_ARGS

    role = disagg.pd_server_role(environ)
    if role is None:
        return [], []
    problems = disagg.environment_problems(environ)
    lines = [f"PD server environment ({ENV_ROLE}={role}, {ENV_NAME}={environ.get(ENV_NAME, '')}): the disagg "
             "seam's checks",
             f"checked: {ENV_LAYOUT} set, SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS, UCX_TLS, nixl installed"
             + ("" if problems else ": ok")]
    lines += [f"problem: {p}" for p in problems]
    lines.append(f"skipped: KV-layout drift from the plan: {ENV_LAYOUT} hashes this environment together with the "
                 f"server's command line ({', '.join(LAYOUT_ARGS)}), which doctor cannot see; each server's disagg "
                 "seam compares it when it starts")
    return lines, problems


def run(out: Callable[[str], None] = print) -> int:
    # doctor reports seam failures itself; keep the plugin's tracebacks out of its output
    plugin_logger = logging.getLogger("sglang_sm120")
    saved_level = plugin_logger.level
    plugin_logger.setLevel(logging.ERROR)
    try:
        return _report(out)
    finally:
        plugin_logger.setLevel(saved_level)


def _report(out: Callable[[str], None]) -> int:
    problems = []
    out("sglang-sm120 doctor")
    out("")
    out("GPUs")
    gpus = gpu_inventory()
    if not gpus:
        out("  no CUDA device")
    for g in gpus:
        ma, mi = g["capability"]
        kind = "sm_12x: the plugin's target" if ma == 12 else "not sm_12x"
        out(f"  cuda:{g['index']} {g['name']}  sm_{ma}{mi} ({kind})  {g['memory_gib']:.0f} GiB")
    matrix = p2p_matrix(len(gpus))
    if matrix:
        out("  peer-to-peer access (row -> column):")
        for i, row in enumerate(matrix):
            out(f"    {i}: " + " ".join("Y" if x else "." for x in row))

    out("")
    out("Versions")
    for name, dist, supported in (("sglang", "sglang", SUPPORTED_SGLANG), ("torch", "torch", TESTED_TORCH),
                                  ("triton", "triton", TESTED_TRITON), ("nixl (optional, PD)", "nixl", SUPPORTED_NIXL),
                                  ("sglang-sm120", "sglang-sm120", None)):
        label, value, ok = _version_line(name, dist, supported)
        out(f"  {label}: {value}")
        if not ok and name == "sglang":
            problems.append(f"sglang: {value}; install sglang=={SUPPORTED_SGLANG[-1]}")
    for module in ("torch", "triton"):
        try:
            __import__(module)
        except Exception as exc:
            problems.append(f"{module} does not import: {exc}")

    out("")
    out(f"Seams ({ENV_FORCE}={os.environ.get(ENV_FORCE, '')!s}, {ENV_DISABLE}={os.environ.get(ENV_DISABLE, '')!s})")
    odd_force = unrecognised_force_value(os.environ)
    if odd_force is not None:
        out(f"  note: {ENV_FORCE}={odd_force!r} is neither on ({', '.join(FORCE_ON)}) nor off "
            f"({', '.join(v for v in FORCE_OFF if v)}); taken as off")
    unknown = unknown_disabled_names(os.environ)
    if unknown:  # the plugin logs this as a warning, which doctor keeps out of its output: say it here
        out(f"  note: {ENV_DISABLE} names no seam called {', '.join(unknown)} (known: {', '.join(SEAM_NAMES)}, all); "
            "those entries switch nothing off")
    gpu = visible_sm12x()
    try:
        decisions = seam_decisions(gpu)
        width = max((len(name) for name, _state, _reason in decisions), default=0)
        for name, state, reason in decisions:
            out(f"  {name:{width}s} {state}: {reason}")
            if state == SeamState.FAILED.value:
                problems.append(f"seam {name} failed: {reason}")
    except Exception as exc:
        problems.append(f"seam registry failed: {type(exc).__name__}: {exc}")
    try:
        pd_lines, pd_problems = disagg_environment_check()
    except Exception as exc:  # a report, never a crash
        pd_lines, pd_problems = [], [f"checks failed: {type(exc).__name__}: {exc}"]
    for line in pd_lines:
        out(f"    {line}")
    problems += [f"disagg (PD server environment): {p}" for p in pd_problems]

    pd_rows = _pd_rows()
    if pd_rows:
        out("")
        out("Prefill/decode disaggregation")
        for label, value, ok in pd_rows:
            out(f"  {label}: {value}" + ("" if ok else "  (!)"))
    problems += [f"disagg (PD server environment): {p}" for p in loopback_problems(pd_rows, os.environ)]

    out("")
    sm12x = [g for g in gpus if g["capability"][0] == 12]
    tp = suggested_tp(len(sm12x) or len(gpus))
    out("Serve with")
    out(f"  {launch_command(tp)}")
    if not sm12x:
        out(f"  (no sm_12x GPU here: the seams stay inactive and SGLang runs its own kernels unless {ENV_FORCE}=1)")

    out("")
    if problems:
        out("NOT USABLE:")
        for p in problems:
            out(f"  - {p}")
        return 1
    out("usable: yes")
    return 0


def loopback_problems(pd_rows, environ) -> list[str]:
    """In a PD server's environment, a NIXL loopback that failed with its settings is a problem: that server's KV
    transfers would fail the same way. Elsewhere it is a row of the report only (PD may not be in use)."""
    from . import disagg

    if not pd_rows or disagg.pd_server_role(environ) is None:
        return []
    from .pd.cli import LOOPBACK_LABEL  # imports: pd_rows came from it

    return [f"{label}: {value}" for label, value, ok in pd_rows if label.startswith(LOOPBACK_LABEL) and not ok]


def _pd_rows() -> list[tuple[str, str, bool]]:
    try:
        from .pd.cli import doctor_pd_report
    except ImportError:
        return []
    try:
        return doctor_pd_report()
    except Exception as exc:
        return [("PD report", f"failed: {type(exc).__name__}: {exc}", False)]


if __name__ == "__main__":
    sys.exit(run())
