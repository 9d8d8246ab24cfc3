"""The ``disagg`` seam: checks, in each PD server process, the settings both sides must share.

There is no SGLang function to replace for PD: SGLang's own NIXL connector moves the KV, and it
already refuses peers whose ``pd_kv_layout()`` differs. What it cannot see is a drift in the
settings that ``pd_kv_layout()`` does not encode (``SGLANG_OPT_SM120_DIRECT_SWA_KV``, the plugin's
own switches, the NIXL/UCX environment). So this seam hooks nothing (``targets=()``): its install
validates the environment of a server started from a ``sglang-sm120 pd`` plan and logs it.

It applies only where ``SGLANG_SM120_PD_ROLE`` is set (the planner sets it on every server). In
such a process install:
- recomputes the layout fingerprint from this process's environment and command line and compares
  it with ``SGLANG_SM120_PD_LAYOUT`` (what the plan computed for both sides);
- checks that ``SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS`` is a JSON object of strings (SGLang
  only finds out when the KV manager starts) and that ``nixl`` is importable;
- checks that an explicit ``UCX_TLS`` lists a transport with a peer-failure handler (tcp, ib and
  the rc, ud and dc families, by any of UCX's names for them): NIXL's UCX backend does not start
  with shared memory alone (measured, see ``tests/sglang_sm120/pd/test_nixl_transfer.py``); and that
  an exclusion list (``UCX_TLS=^...``) does not exclude tcp on a machine without an RDMA NIC, where tcp
  is the only such transport (measured the same way: ``^tcp`` fails there, ``^sm,cma`` works). Other
  exclusion lists depend on the machine's transports: ``sglang-sm120 doctor`` tries this environment's
  settings with a NIXL loopback transfer.
A failed check raises, which the seam registry records as ``failed`` with the reason and logs; the
plugin never stops SGLang, so the log line is the signal.

The planner refuses a plan whose NIXL/UCX settings fail :func:`nixl_settings_problems`, and
``sglang-sm120 doctor`` runs :func:`environment_problems` in a PD server's environment: one check,
three places.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys

from .seams import Seam

logger = logging.getLogger("sglang_sm120")

# UCX_TLS names whose transports carry NIXL's UCX wire-up and active messages with peer error handling, as
# families, so that UCX's aliases and device-specific names count: tcp, ib (rc_verbs, ud_verbs, rc_mlx5, ud_mlx5,
# dc_mlx5), all, and every name of the rc, ud and dc families (rc, rc_x, rc_v, rc_mlx5, rc_verbs, ud_x, ud_mlx5,
# dc_x, dc_mlx5, ...). The alias table is UCX's own (openucx/ucx src/ucp/core/ucp_context.c, ucp_tl_aliases, read
# there; the UCX FAQ's "transports and aliases" list, from memory, agrees). Shared memory (sm, shm, mm, posix, sysv,
# xpmem, cma, knem), self and the GPU transports (cuda, cuda_copy, cuda_ipc, gdr_copy) have no such handler.
PEER_FAILURE_TL_NAMES = ("tcp", "ib", "all")
PEER_FAILURE_TL_FAMILIES = ("rc", "ud", "dc")


def has_peer_failure_handler(entry: str) -> bool:
    """Whether one ``UCX_TLS`` entry names a transport (or alias) with a peer-failure handler."""
    # UCX reads '\rc_mlx5' as that exact transport, not an alias, and 'ud_mlx5:aux' as one "for auxiliary wireup
    # purposes only" that carries none of the endpoints' lanes (ucp_context.c, ucp_config_is_tl_name_present and
    # ucp_tls_array_is_present)
    name, _, suffix = entry.strip().removeprefix("\\").partition(":")
    if suffix:
        return False
    return name in PEER_FAILURE_TL_NAMES or name.split("_")[0] in PEER_FAILURE_TL_FAMILIES


def pd_server_role(environ=None) -> str | None:
    """'prefill' or 'decode' when ``environ`` is a PD server's from a plan, else None."""
    from .pd.planner import ENV_ROLE

    environ = os.environ if environ is None else environ
    role = environ.get(ENV_ROLE)
    return role if role in ("prefill", "decode") else None


def _applies() -> str | None:
    from .pd.planner import ENV_ROLE

    role = os.environ.get(ENV_ROLE)
    if not role:
        return f"not a PD server started from a `sglang-sm120 pd` plan ({ENV_ROLE} unset)"
    if pd_server_role() is None:
        return f"{ENV_ROLE}={role} is not a prefill or decode server"
    return None


def rdma_nic_present() -> bool:
    """Whether this machine shows an RDMA device (``/sys/class/infiniband``)."""
    from .pd.topology import detect_nics

    return any(nic.kind == "rdma" for nic in detect_nics())


ENV_NIXL_BACKEND = "SGLANG_DISAGGREGATION_NIXL_BACKEND"
ENV_NIXL_BACKEND_PARAMS = "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS"


def nixl_backend(environ) -> str:
    """The NIXL backend SGLang's connector creates (``SGLANG_DISAGGREGATION_NIXL_BACKEND``, default UCX)."""
    return environ.get(ENV_NIXL_BACKEND, "UCX")


def nixl_backend_params(environ) -> dict[str, str]:
    """``SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS`` as SGLang's NIXL connector reads it (default ``{}``); ValueError,
    with the reason, for a value it would refuse (not a JSON object of strings)."""
    raw = environ.get(ENV_NIXL_BACKEND_PARAMS, "{}")
    try:
        params = json.loads(raw)
        if not isinstance(params, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
            raise ValueError("not an object of string values")
    except ValueError as exc:
        raise ValueError(f"{ENV_NIXL_BACKEND_PARAMS}={raw!r} is not a JSON object of strings ({exc})") from None
    return params


def nixl_settings_problems(environ, rdma_available: bool | None = None, where: str = "this machine") -> list[str]:
    """Why NIXL's UCX backend would not start with the NIXL/UCX settings in ``environ`` (empty when it would).
    The seam checks a running server with it; the planner refuses a plan with it. ``rdma_available``: whether
    ``where`` has an RDMA NIC (None: unknown), which decides what an exclusion list leaves."""
    problems = []
    try:
        nixl_backend_params(environ)
    except ValueError as exc:
        problems.append(f"{exc}; SGLang's NIXL connector would refuse it at start-up")
    tls = environ.get("UCX_TLS", "")
    if "UCX_TLS" in environ and not tls.strip():
        problems.append("UCX_TLS is set but empty, which UCX refuses (\"The TLs list is empty\"); unset it for UCX's "
                        "default transports")
    elif tls.startswith("^"):  # excludes transports: what is left depends on the machine's transports
        excluded = {entry.strip().removeprefix("\\") for entry in tls[1:].split(",")}
        # without an RDMA NIC the rc/ud/dc/ib families do not exist, so tcp is the one transport with a handler
        if "all" in excluded:
            problems.append(f"UCX_TLS={tls} excludes every transport; NIXL's UCX backend cannot create its endpoints")
        elif "tcp" in excluded and rdma_available is False:
            problems.append(f"UCX_TLS={tls} excludes tcp and {where} has no RDMA NIC, so no transport with a "
                            "peer-failure handler is left; NIXL's UCX backend cannot create its endpoints")
    elif tls:
        if not any(has_peer_failure_handler(t) for t in tls.split(",")):
            problems.append(f"UCX_TLS={tls} has no transport with a peer-failure handler (tcp, ib, rc*, ud*, dc*); "
                            "NIXL's UCX backend cannot create its endpoints with shared memory or GPU copies alone")
    return problems


def environment_problems(environ) -> list[str]:
    """The checks that need only the environment (all but the KV-layout comparison, which needs the server's
    command line): what ``sglang-sm120 doctor`` can check outside a server."""
    from .pd.planner import ENV_LAYOUT

    problems = []
    if not environ.get(ENV_LAYOUT):
        problems.append(f"{ENV_LAYOUT} is unset, so this server's KV-layout settings cannot be compared with its peer's")
    problems += nixl_settings_problems(environ, rdma_available=rdma_nic_present())
    if importlib.util.find_spec("nixl") is None:
        problems.append("nixl is not installed: pip install 'sglang-sm120[pd]'")
    return problems


def check_pd_environment(environ=None, argv=None) -> list[str]:
    """Problems with this PD server's settings (empty when all is well)."""
    from .pd.planner import (ENV_LAYOUT, LAYOUT_ARGS, LAYOUT_ENV, PlanError, _flag_values, expand_config_file,
                             layout_fingerprint)

    environ = os.environ if environ is None else environ
    argv = sys.argv[1:] if argv is None else argv
    problems = []
    try:  # a server started by hand with --config FILE: the file's keys, as SGLang merges them on this host
        argv, _note = expand_config_file(tuple(argv), "this server's command line")
    except PlanError as exc:
        problems.append(str(exc))
    planned = environ.get(ENV_LAYOUT)
    actual = layout_fingerprint(dict(environ), tuple(argv))
    if planned and planned != actual:
        flags = _flag_values(tuple(argv))
        current = [f"{k}={environ.get(k, '(unset)')}" for k in LAYOUT_ENV]
        current += [f"{a}={flags[a]}" for a in LAYOUT_ARGS if a in flags]
        problems.append(f"KV-layout settings drifted from the plan (fingerprint {actual}, planned {planned}); this "
                        f"process has {', '.join(current)}; re-run `sglang-sm120 pd plan` and start both sides from it")
    return problems + environment_problems(environ)


def _install() -> None:
    from .pd.planner import ENV_NAME, ENV_ROLE

    problems = check_pd_environment()
    if problems:
        for p in problems:
            logger.error("sglang-sm120 disagg: %s", p)
        raise RuntimeError("; ".join(problems))
    logger.info("sglang-sm120 disagg: %s %s: KV-layout settings match the plan; NIXL backend %s, UCX_TLS=%s, "
                "UCX_NET_DEVICES=%s", os.environ.get(ENV_ROLE), os.environ.get(ENV_NAME, ""),
                nixl_backend(os.environ), os.environ.get("UCX_TLS", "(UCX default)"),
                os.environ.get("UCX_NET_DEVICES", "(UCX default)"))


def make_seam() -> Seam:
    return Seam(
        name="disagg",
        description="PD servers from a `sglang-sm120 pd` plan: validates that this process's KV-layout and "
                    "NIXL/UCX settings match the plan (no SGLang function is replaced)",
        targets=(),
        install=_install,
        applies=_applies,
    )
