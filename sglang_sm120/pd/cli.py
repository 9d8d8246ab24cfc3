"""``sglang-sm120 pd plan|launch`` and the PD rows of ``sglang-sm120 doctor``.

``add_pd_parser(subparsers)`` adds the ``pd`` command to the main CLI (``sglang_sm120/cli.py``);
``python -m sglang_sm120.pd.cli pd plan ...`` runs the same thing standalone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys

from .planner import Plan, PlanError, PlanRequest, SideRequest, make_plan, parse_env_pairs, parse_gpu_list
from .topology import Topology, TopologyError, detect_local, host_from_fields, load_topology, parse_nic

INSTALL_HINT = "pip install 'sglang-sm120[pd]'  (installs nixl==1.5.1 and sglang-router)"
# what each process needs importable: servers run SGLang's NIXL connector, the router is its own package
NEEDED = {"server": ("sglang", "nixl"), "router": ("sglang_router",)}


def _add_plan_options(p: argparse.ArgumentParser, launching: bool) -> None:
    p.add_argument("--model-path", required=True, help="DSv4-Flash checkpoint (path or hub id) for every server")
    topo = p.add_argument_group("topology (default: detect this machine)")
    topo.add_argument("--topology", help="JSON file describing hosts, GPUs, P2P matrix and NICs (see docs/pd.md)")
    topo.add_argument("--gpu-model", help="one-host topology from flags: GPU model, e.g. 'RTX PRO 6000', 'RTX 5090'")
    topo.add_argument("--gpu-count", type=int, help="one-host topology: number of GPUs")
    topo.add_argument("--gpu-memory-gib", type=float, help="one-host topology: memory per GPU (default: model table)")
    topo.add_argument("--p2p", default="model",
                      help="one-host topology: 'all', 'none', 'model' (default: what the model supports) or rows "
                           "of 0/1 like '0111;1011;1101;1110'")
    topo.add_argument("--nic", action="append", default=[],
                      help="one-host topology: NAME:rdma, NAME:rdma:gpudirect or NAME:tcp (repeatable)")
    split = p.add_argument_group("prefill/decode split")
    split.add_argument("--split", help="P+D GPUs on one host, e.g. 4+4 (prefill 0..P-1, decode P..P+D-1)")
    split.add_argument("--prefill-gpus", help="prefill GPU indices, e.g. 0-3")
    split.add_argument("--decode-gpus", help="decode GPU indices, e.g. 4-7")
    split.add_argument("--prefill-host", help="host (topology name) of the prefill servers")
    split.add_argument("--decode-host", help="host (topology name) of the decode servers")
    split.add_argument("--router-host", help="host of the router (default: the prefill host)")
    split.add_argument("--prefill-tp", type=int, help="TP size of each prefill server (default: all prefill GPUs)")
    split.add_argument("--decode-tp", type=int, help="TP size of each decode server (default: all decode GPUs)")
    ports = p.add_argument_group("ports")
    ports.add_argument("--http-port", type=int, default=30000, help="first server HTTP port on each host (+1 per server)")
    ports.add_argument("--bootstrap-port", type=int, default=8998, help="first prefill bootstrap port (+1 per server)")
    ports.add_argument("--router-port", type=int, default=8000)
    extra = p.add_argument_group("extra settings (layout-deciding ones must agree between the sides)")
    extra.add_argument("--env", action="append", default=[], help="NAME=VALUE for every server (repeatable)")
    extra.add_argument("--prefill-env", action="append", default=[], help="NAME=VALUE for prefill servers")
    extra.add_argument("--decode-env", action="append", default=[], help="NAME=VALUE for decode servers")
    extra.add_argument("--server-arg", action="append", default=[],
                       help="extra sglang.launch_server arguments for every server, shell-quoted (repeatable)")
    extra.add_argument("--prefill-arg", action="append", default=[], help="extra arguments for prefill servers")
    extra.add_argument("--decode-arg", action="append", default=[], help="extra arguments for decode servers")
    extra.add_argument("--model-weights-gib", type=float,
                       help="checkpoint size for the memory check (default: DSv4-Flash estimate)")
    p.add_argument("--python", default=sys.executable if launching else "python3",
                   help="interpreter in the server and router commands (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def add_pd_parser(subparsers) -> argparse.ArgumentParser:
    pd = subparsers.add_parser("pd", help="prefill-decode disaggregation over NIXL: plan and launch")
    pd_sub = pd.add_subparsers(dest="pd_command", required=True)
    plan = pd_sub.add_parser("plan", help="print the server and router commands with NIXL/UCX settings and reasons")
    _add_plan_options(plan, launching=False)
    plan.set_defaults(func=plan_command)
    launch = pd_sub.add_parser("launch", help="start the planned processes here, wait for health, stream logs")
    _add_plan_options(launch, launching=True)
    launch.add_argument("--local-host", help="multi-host plans: start only this host's processes")
    launch.add_argument("--health-timeout", type=float, default=1800.0, help="seconds to wait for /health")
    launch.add_argument("--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL at teardown")
    launch.set_defaults(func=launch_command)
    return pd


# --- building the request -------------------------------------------------------------------------

def _topology(args) -> Topology:
    if args.topology:
        if args.gpu_model or args.gpu_count:
            raise TopologyError("give either --topology FILE or --gpu-model/--gpu-count, not both")
        return load_topology(args.topology)
    if args.gpu_model or args.gpu_count:
        if not (args.gpu_model and args.gpu_count):
            raise TopologyError("--gpu-model and --gpu-count go together")
        nics = [parse_nic(n) for n in args.nic]
        return Topology((host_from_fields("local", "127.0.0.1", args.gpu_model, args.gpu_count, args.p2p, nics,
                                          args.gpu_memory_gib, where="--gpu-model/--gpu-count"),))
    topology, why = detect_local()
    if topology is None:
        raise TopologyError(f"cannot detect a topology here ({why}); describe one with --topology FILE or "
                            "--gpu-model/--gpu-count")
    return topology


def _split_args(values, what: str) -> tuple[str, ...]:
    out: list[str] = []
    for v in values:
        try:
            out += shlex.split(v)
        except ValueError as exc:
            raise PlanError(f"{what} {v!r}: {exc}") from None
    return tuple(out)


def build_request(args) -> PlanRequest:
    topology = _topology(args)
    prefill_host = topology.host(args.prefill_host) if args.prefill_host or len(topology.hosts) == 1 else None
    decode_host = topology.host(args.decode_host) if args.decode_host or len(topology.hosts) == 1 else None
    if prefill_host is None or decode_host is None:
        raise PlanError(f"the topology has {len(topology.hosts)} hosts; name them with --prefill-host and --decode-host")
    if args.split:
        if args.prefill_gpus or args.decode_gpus:
            raise PlanError("give either --split or --prefill-gpus/--decode-gpus, not both")
        m = re.fullmatch(r"\s*(\d+)\s*\+\s*(\d+)\s*", args.split)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise PlanError(f"--split expects P+D with P, D >= 1, e.g. 4+4; got {args.split!r}")
        n_p, n_d = int(m.group(1)), int(m.group(2))
        if prefill_host.name == decode_host.name:
            prefill_gpus, decode_gpus = tuple(range(n_p)), tuple(range(n_p, n_p + n_d))
        else:
            prefill_gpus, decode_gpus = tuple(range(n_p)), tuple(range(n_d))
    elif args.prefill_gpus and args.decode_gpus:
        prefill_gpus = parse_gpu_list(args.prefill_gpus, "--prefill-gpus")
        decode_gpus = parse_gpu_list(args.decode_gpus, "--decode-gpus")
    elif prefill_host.name == decode_host.name:
        if args.prefill_gpus or args.decode_gpus:
            raise PlanError("give both --prefill-gpus and --decode-gpus (or --split)")
        half = prefill_host.gpu_count // 2
        if half < 1:
            raise PlanError(f"host {prefill_host.name} has {prefill_host.gpu_count} GPU; PD needs at least two")
        prefill_gpus, decode_gpus = tuple(range(half)), tuple(range(half, 2 * half))
    else:
        prefill_gpus = (parse_gpu_list(args.prefill_gpus, "--prefill-gpus") if args.prefill_gpus
                        else tuple(range(prefill_host.gpu_count)))
        decode_gpus = (parse_gpu_list(args.decode_gpus, "--decode-gpus") if args.decode_gpus
                       else tuple(range(decode_host.gpu_count)))
    return PlanRequest(
        topology=topology, model_path=args.model_path,
        prefill=SideRequest(prefill_host.name, prefill_gpus,
                            len(prefill_gpus) if args.prefill_tp is None else args.prefill_tp),
        decode=SideRequest(decode_host.name, decode_gpus, len(decode_gpus) if args.decode_tp is None else args.decode_tp),
        http_port=args.http_port, bootstrap_port=args.bootstrap_port, router_port=args.router_port,
        router_host=args.router_host,
        env=parse_env_pairs(args.env, "--env"), prefill_env=parse_env_pairs(args.prefill_env, "--prefill-env"),
        decode_env=parse_env_pairs(args.decode_env, "--decode-env"),
        server_args=_split_args(args.server_arg, "--server-arg"),
        prefill_args=_split_args(args.prefill_arg, "--prefill-arg"),
        decode_args=_split_args(args.decode_arg, "--decode-arg"),
        model_weights_gib=args.model_weights_gib, python=args.python)


def _plan_or_error(args) -> tuple[Plan | None, int]:
    try:
        return make_plan(build_request(args)), 0
    except (PlanError, TopologyError) as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(exc)}))
        else:
            print(f"pd: cannot plan: {exc}", file=sys.stderr)
        return None, 2


# --- install checks -------------------------------------------------------------------------------

def missing_modules(python: str, modules) -> list[str]:
    """Modules ``python`` cannot import-find (checked in this process when it is this interpreter)."""
    modules = list(modules)
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return [m for m in modules if importlib.util.find_spec(m) is None]
    code = ("import importlib.util, sys; print(','.join(m for m in sys.argv[1:] "
            "if importlib.util.find_spec(m) is None))")
    try:
        out = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"(could not run {python}: {exc})"]
    if out.returncode != 0:
        return [f"(could not run {python}: exit {out.returncode})"]
    return [m for m in out.stdout.strip().split(",") if m]


# --- commands -------------------------------------------------------------------------------------

def plan_command(args) -> int:
    plan, code = _plan_or_error(args)
    if plan is None:
        return code
    missing = [m for m in ("nixl", "sglang_router") if importlib.util.find_spec(m) is None]
    if missing:
        plan.notes.append(f"{', '.join(missing)} not installed here; on every PD machine run: {INSTALL_HINT}")
    print(plan.to_json() if args.json else plan.to_text())
    return 0


def launch_command(args) -> int:
    from .launcher import ProcessSpec, launch

    for flag, value in (("--health-timeout", args.health_timeout), ("--grace", args.grace)):
        if not (math.isfinite(value) and value >= 0):
            print(f"pd launch: {flag} must be a finite number of seconds >= 0, got {value!r}", file=sys.stderr)
            return 2
    plan, code = _plan_or_error(args)
    if plan is None:
        return code
    hosts = {p.host for p in plan.processes}
    local = args.local_host
    if local is None and len(hosts) > 1:
        print(f"pd launch: the plan spans hosts {', '.join(sorted(hosts))}; run it on each with --local-host NAME",
              file=sys.stderr)
        return 2
    if local is not None and local not in hosts:
        print(f"pd launch: --local-host {local!r} runs nothing in this plan (hosts: {', '.join(sorted(hosts))})",
              file=sys.stderr)
        return 2
    mine = [p for p in plan.processes if local is None or p.host == local]
    needed = sorted({m for p in mine for m in NEEDED["router" if p.role == "router" else "server"]})
    missing = missing_modules(args.python, needed)
    if missing:
        print(f"pd launch: {args.python} cannot import {', '.join(missing)}. Install the PD extras: {INSTALL_HINT}",
              file=sys.stderr)
        return 2
    if not args.json:
        print(plan.to_text())
    specs = [ProcessSpec(p.name, p.argv, p.env, p.health_url) for p in mine if p.role != "router"]
    router = next((ProcessSpec(p.name, p.argv, p.env, p.health_url) for p in mine if p.role == "router"), None)
    return launch(specs, router, health_timeout_s=args.health_timeout, grace_s=args.grace)


# --- doctor ---------------------------------------------------------------------------------------

_UCX_PROBE = r"""
import os, sys
os.environ["UCX_TLS"] = "sm120_probe_no_such_transport"
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("sm120-doctor", nixl_agent_config(backends=[]))
print("PLUGINS=" + ",".join(agent.get_plugin_list()), flush=True)
try:
    agent.create_backend("UCX", {})
except Exception:
    pass
"""


def _ucx_probe(timeout: float = 60.0) -> tuple[list[str] | None, list[str] | None, str]:
    """(NIXL plugins, UCX transports UCX itself lists as available, error). UCX names the available
    transports when asked for one that does not exist, which is the probe."""
    try:
        out = subprocess.run([sys.executable, "-c", _UCX_PROBE], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, None, f"probe failed: {exc}"
    text = out.stdout + out.stderr
    plugins = next((line[len("PLUGINS="):].split(",") for line in out.stdout.splitlines()
                    if line.startswith("PLUGINS=")), None)
    m = re.search(r"please use one or more of: ([\w, ]+)", text)
    transports = [t.strip() for t in m.group(1).split(",")] if m else None
    err = "" if plugins is not None else (text.strip().splitlines() or ["no output"])[-1]
    return plugins, transports, err


LOOPBACK_LABEL = "NIXL loopback"


def _nixl_loopback(timeout: float = 90.0) -> tuple[bool, str]:
    """(ok, detail) of ``nixl_check.loopback`` with this environment, run in a child whose output is kept out of the
    report; on failure the detail ends with UCX's own error line, which names the cause."""
    try:
        out = subprocess.run([sys.executable, "-m", "sglang_sm120.pd.nixl_check", "--loopback"], capture_output=True,
                             text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"not finished: {exc}"
    text = out.stdout + out.stderr
    line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("LOOPBACK=")), None)
    if line is None:
        return False, (text.strip().splitlines() or [f"exit code {out.returncode}, no output"])[-1]
    result = json.loads(line[len("LOOPBACK="):])
    detail = result["detail"]
    ucx = re.search(r"UCX\s+ERROR\s+(.+)", text)
    if not result["ok"] and ucx:
        detail += f" (UCX: {ucx.group(1).strip()})"
    return result["ok"], detail


def doctor_pd_report() -> list[tuple[str, str, bool]]:
    from ..disagg import nixl_backend
    from ..versions import SUPPORTED_NIXL, installed_version
    from .topology import detect_nics

    rows: list[tuple[str, str, bool]] = []
    nixl_version = installed_version("nixl")
    if nixl_version is None:
        rows.append(("nixl", f"not installed: {INSTALL_HINT}", False))
    else:
        rows.append(("nixl", nixl_version + ("" if nixl_version in SUPPORTED_NIXL else
                                             f" (tested: {', '.join(SUPPORTED_NIXL)})"),
                     nixl_version in SUPPORTED_NIXL))
        plugins, transports, err = _ucx_probe()
        if plugins is None:
            rows.append(("NIXL backends", f"nixl does not load: {err}", False))
        else:
            rows.append(("NIXL backends", ", ".join(plugins), "UCX" in plugins))
            rows.append(("UCX transports", ", ".join(transports) if transports else "(UCX did not list them)",
                         bool(transports)))
            backend = nixl_backend(os.environ)
            if backend in plugins:
                ok, detail = _nixl_loopback()
                label = (f"{LOOPBACK_LABEL} (this environment: {backend}, "
                         f"UCX_TLS={os.environ.get('UCX_TLS', '(UCX default)')})")
                rows.append((label, ("ok: " if ok else "FAILED: ") + detail, ok))
    router_version = installed_version("sglang-router")
    rows.append(("sglang-router", router_version or f"not installed: {INSTALL_HINT}", router_version is not None))
    nics = detect_nics()
    rdma = [n for n in nics if n.kind == "rdma"]
    rows.append(("RDMA NICs", ", ".join(f"{n.name}{' (GPUDirect: nvidia_peermem)' if n.gpudirect else ''}"
                                        for n in rdma) or "none (TCP between boxes)", True))
    topology, why = detect_local()
    if topology is None:
        rows.append(("P2P matrix", why, True))
        rows.append(("planner here", "nothing to plan without GPUs; `sglang-sm120 pd plan --topology FILE` plans "
                                     "for another machine", True))
        return rows
    host = topology.hosts[0]
    matrix = " ".join("".join("1" if v else "0" for v in row) for row in host.p2p)
    rows.append(("P2P matrix", f"{host.gpu_count}x {host.gpu_model.name}: {matrix}", True))
    if host.gpu_count < 2:
        rows.append(("planner here", "one GPU: PD needs a prefill and a decode GPU set", True))
        return rows
    half = host.gpu_count // 2
    from ..kernels.dsv4 import SUPPORTED_TP

    tp = max(t for t in SUPPORTED_TP if half % t == 0)
    req = PlanRequest(topology, "<model>", SideRequest(host.name, tuple(range(half)), tp),
                      SideRequest(host.name, tuple(range(half, 2 * half)), tp))
    try:
        plan = make_plan(req)
    except PlanError as exc:
        rows.append(("planner here", f"{half}+{half} split refused: {exc}", False))
        return rows
    chosen = "; ".join(f"{s.name}={s.value}" for s in plan.settings if s.name.startswith("UCX_"))
    rows.append(("planner here", f"{half}+{half} split, TP{tp} servers: {chosen}", True))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_sm120.pd.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    add_pd_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
