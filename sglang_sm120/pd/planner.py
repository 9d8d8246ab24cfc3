"""The PD planner: a topology and a prefill/decode split in, exact commands and NIXL/UCX settings out.

Every setting the plan adds carries a one-line reason. A plan that cannot work is refused with a
:class:`PlanError` naming the problem: GPUs that do not exist or are used twice, port clashes,
a server whose weights do not fit, or prefill and decode settings that would give the two sides
different KV layouts (prefill writes the pages that decode reads, so the layouts must agree).
User server flags are checked as SGLang's own parser reads them (abbreviations, aliases, ``--x=1``).

Sources for the transport choices (cited in the reasons):
- UCX FAQ (openucx/ucx docs/source/faq.md, "Which transports does UCX use?", "Working with GPU"):
  UCX_TLS aliases ``sm`` (shared memory), ``rc`` (reliable connected, with UD for bootstrap),
  ``tcp``, ``cuda_copy``/``cuda_ipc``; GPU memory needs the cuda transports listed; zero-copy
  RDMA from GPU memory needs a peer-memory driver or dma-buf, else UCX pipelines through host
  memory with cuda_copy; ``UCX_NET_DEVICES`` restricts UCX to the named devices.
- UCX source ``src/uct/cuda/cuda_ipc/cuda_ipc_md.c`` (``uct_cuda_ipc_is_peer_accessible``):
  cuda_ipc maps a peer process's GPU buffer only when the two GPUs can access each other (P2P).
- SGLang 0.5.23 ``srt/disaggregation/nixl/conn.py``: backend from
  ``SGLANG_DISAGGREGATION_NIXL_BACKEND`` (default UCX) with JSON string params from
  ``SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS``; a non-empty ``UCX_NET_DEVICES`` wins over
  ``--disaggregation-ib-device``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import shlex
import sys

from ..disagg import nixl_settings_problems
from ..kernels import dsv4
from .topology import Host, Topology, TopologyError

# --- what the plan owns -------------------------------------------------------------------------

PLANNER_OWNED_ARGS = ("--model-path", "--model", "--tp", "--tp-size", "--tensor-parallel-size", "--base-gpu-id",
                      "--host", "--port", "--disaggregation-mode", "--disaggregation-bootstrap-port",
                      "--disaggregation-transfer-backend", "--disaggregation-ib-device")

# Flags that would run a server on more GPUs (or nodes) than the plan gave it; allowed only at SGLang's default.
FOOTPRINT_ARGS = {"--pp-size": "1", "--pipeline-parallel-size": "1", "--dp-size": "1", "--data-parallel-size": "1",
                  "--gpu-id-step": "1", "--nnodes": "1"}
# SGLang reads server args from this YAML file (CLI > file > defaults); the planner reads it here with SGLang's own
# merger and writes its keys into the commands as flags (expand_config_file), where they are checked like any other.
CONFIG_ARG = "--config"

# Server flags and env vars that decide the bytes of the KV pools prefill writes and decode reads.
LAYOUT_ARGS = ("--kv-cache-dtype", "--page-size", "--enable-deepseek-v4-fp4-indexer", "--dsv4-attn-backend",
               "--speculative-algorithm")
LAYOUT_ENV = ("SGLANG_DSV4_KV_LAYOUT", "SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "SGLANG_DSV4_UNIFIED_KV_FP8",
              "SGLANG_DSV4_COMPRESS_STATE_DTYPE", "SGLANG_OPT_SM120_DIRECT_SWA_KV", "SGLANG_SM120_DISABLE",
              "SGLANG_SM120_FORCE", "SGLANG_DISAGGREGATION_NIXL_BACKEND", "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS",
              "UCX_TLS")

# the remaining layout env keys, set to SGLang's / the plugin's defaults unless the user sets them
# (SGLANG_DSV4_COMPRESS_STATE_DTYPE: the dtype of the compressor state SGLang 0.5.23 hands NIXL as DSv4 request state)
PINNED_DEFAULTS = {"SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "auto", "SGLANG_DSV4_UNIFIED_KV_FP8": "0",
                   "SGLANG_DSV4_COMPRESS_STATE_DTYPE": "float32", "SGLANG_SM120_DISABLE": "", "SGLANG_SM120_FORCE": ""}

# every flag the planner checks by name; a user flag is resolved to one of these before the checks
CHECKED_ARGS = (*PLANNER_OWNED_ARGS, *FOOTPRINT_ARGS, CONFIG_ARG, *LAYOUT_ARGS)

ENV_ROLE = "SGLANG_SM120_PD_ROLE"
ENV_NAME = "SGLANG_SM120_PD_NAME"
ENV_LAYOUT = "SGLANG_SM120_PD_LAYOUT"  # fingerprint of the layout settings; the disagg seam re-checks it

LOOPBACK = "127.0.0.1"  # where a one-host plan's processes listen and are reached

# --- memory fit ---------------------------------------------------------------------------------

# SGLang sizes its static pool (weights + KV) as a fraction of GPU memory; 0.88 is what it picks for
# large-memory GPUs, the rest is activations and CUDA graphs.
MEM_FRACTION_STATIC = 0.88
# Below this much KV pool per GPU a server holds too few tokens to be worth running.
MIN_KV_GIB_PER_GPU = 4.0


def dsv4_flash_weight_bytes() -> tuple[int, int]:
    """(bytes split across TP ranks, bytes every rank holds) of DSv4-Flash as SGLang 0.5.23 loads it on
    sm_120: MXFP4 routed experts, FP8 dense linears with 128x128 fp32 block scales, wo_a dequantised
    to bf16, bf16 compressors and embeddings. An estimate from the shapes in ``kernels/dsv4.py``."""
    h, n_layers = dsv4.HIDDEN_SIZE, dsv4.NUM_LAYERS
    e, inter, g = dsv4.NUM_EXPERTS, dsv4.MOE_INTERMEDIATE_SIZE, dsv4.MXFP4_GROUP
    expert = 2 * inter * h // 2 + h * inter // 2 + 2 * inter * h // g + h * inter // g  # w13, w2 + E8M0 scales
    split = replicated = 0
    for name, (out_f, in_f) in dsv4.dense_linear_shapes(1).items():
        nbytes = out_f * in_f * (2 if name == "wo_a" else 1)
        nbytes += 4 * -(-out_f // dsv4.FP8_BLOCK) * -(-in_f // dsv4.FP8_BLOCK)
        if name in ("wqkv_a", "indexer_wq_b"):  # ReplicatedLinear in SGLang 0.5.23
            replicated += n_layers * nbytes
        else:
            split += n_layers * nbytes
    split += n_layers * e * expert
    split += 2 * dsv4.VOCAB_SIZE * h * 2  # embed_tokens + lm_head, bf16, vocab-parallel
    n_c4 = sum(dsv4.layer_compress_ratio(i) == dsv4.C4_RATIO for i in range(n_layers))
    n_c128 = sum(dsv4.layer_compress_ratio(i) == dsv4.C128_RATIO for i in range(n_layers))
    # bf16 compressor (kv + gate) weights: C4 layers 2*head_dim wide + the indexer's, C128 head_dim wide
    replicated += n_c4 * (2 * 2 * dsv4.HEAD_DIM * h * 2 + 2 * 2 * dsv4.INDEX_HEAD_DIM * h * 2)
    replicated += n_c128 * (2 * dsv4.HEAD_DIM * h * 2)
    replicated += n_layers * dsv4.NUM_EXPERTS * h * 2  # router gate, bf16
    return split, replicated


def weight_gib_per_gpu(tp: int, model_weights_gib: float | None = None) -> float:
    if model_weights_gib is not None:
        if not (math.isfinite(model_weights_gib) and model_weights_gib > 0):
            raise PlanError(f"--model-weights-gib must be a positive finite number, got {model_weights_gib!r}")
        return model_weights_gib / tp
    split, replicated = dsv4_flash_weight_bytes()
    return (split / tp + replicated) / 2**30


class PlanError(ValueError):
    """A plan request that cannot work, with the reason."""


@dataclasses.dataclass(frozen=True)
class SideRequest:
    host: str | None
    gpus: tuple[int, ...]
    tp: int


@dataclasses.dataclass
class PlanRequest:
    topology: Topology
    model_path: str
    prefill: SideRequest
    decode: SideRequest
    http_port: int = 30000
    bootstrap_port: int = 8998
    router_port: int = 8000
    router_host: str | None = None  # defaults to the first prefill host
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    prefill_env: dict[str, str] = dataclasses.field(default_factory=dict)
    decode_env: dict[str, str] = dataclasses.field(default_factory=dict)
    server_args: tuple[str, ...] = ()
    prefill_args: tuple[str, ...] = ()
    decode_args: tuple[str, ...] = ()
    model_weights_gib: float | None = None
    python: str = "python3"


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    value: str
    reason: str
    applies_to: str = "prefill+decode"  # or "prefill", "decode", "router", or a host name


@dataclasses.dataclass
class PlannedProcess:
    name: str  # prefill-0, decode-1, router
    role: str  # prefill | decode | router
    host: str
    address: str
    argv: list[str]
    env: dict[str, str]
    port: int
    gpus: tuple[int, ...] = ()
    bootstrap_port: int | None = None

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address and not self.address.startswith("[") else self.address
        return f"http://{host}:{self.port}"  # an IPv6 address is bracketed in a URL (RFC 3986)

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    def shell_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(url=self.url, health_url=self.health_url, command=self.shell_line(), gpus=list(self.gpus))
        return d


@dataclasses.dataclass
class Plan:
    processes: list[PlannedProcess]
    settings: list[Setting]
    notes: list[str]
    layout_fingerprint: str

    def servers(self) -> list[PlannedProcess]:
        return [p for p in self.processes if p.role != "router"]

    def router(self) -> PlannedProcess:
        return next(p for p in self.processes if p.role == "router")

    def to_dict(self) -> dict:
        return {"processes": [p.to_dict() for p in self.processes],
                "settings": [dataclasses.asdict(s) for s in self.settings],
                "notes": list(self.notes), "layout_fingerprint": self.layout_fingerprint}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = []
        for p in self.processes:
            where = f"host {p.host}" + (f", GPUs {','.join(map(str, p.gpus))}" if p.gpus else "")
            lines.append(f"# {p.name} ({where}) -> {p.url}")
            lines.append(p.shell_line())
            lines.append("")
        lines.append("# settings")
        for s in self.settings:
            lines.append(f"#   {s.name}={s.value}   [{s.applies_to}]")
            lines.append(f"#       why: {s.reason}")
        for note in self.notes:
            lines.append(f"# note: {note}")
        return "\n".join(lines)


# --- parsing helpers ----------------------------------------------------------------------------

def parse_gpu_list(text: str, what: str) -> tuple[int, ...]:
    """'0-3', '4,5,6,7', '0-1,4' -> GPU indices (ordered, as written)."""
    gpus: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise PlanError(f"{what}: range {part!r} runs backwards")
                gpus.extend(range(lo, hi + 1))
            else:
                gpus.append(int(part))
    except ValueError:
        raise PlanError(f"{what}: expected GPU indices like '0-3' or '4,5,6,7', got {text!r}") from None
    if not gpus:
        raise PlanError(f"{what}: no GPUs given")
    return tuple(gpus)


def parse_env_pairs(pairs, what: str) -> dict[str, str]:
    env = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "").isalnum():
            raise PlanError(f"{what}: expected NAME=VALUE, got {pair!r}")
        env[key] = value
    return env


@functools.lru_cache(maxsize=None)
def sglang_server_parser() -> argparse.ArgumentParser | None:
    """SGLang's server argument parser (``ServerArgs.add_cli_args``), or None where SGLang cannot be imported here."""
    try:
        # SGLang's own parser decides what a flag means; its import must not print into `pd plan --json`
        with contextlib.redirect_stdout(sys.stderr):
            from sglang.srt.server_args import ServerArgs

            parser = argparse.ArgumentParser()
            ServerArgs.add_cli_args(parser)
    except Exception:  # not installed or broken: the caller falls back to refusing abbreviations
        return None
    return parser


@functools.lru_cache(maxsize=None)
def sglang_server_options() -> dict[str, tuple[str, ...]] | None:
    """Each long option of SGLang's server parser -> every long spelling of its action (aliases such as
    --tp-size / --tensor-parallel-size), or None where SGLang cannot be imported here."""
    parser = sglang_server_parser()
    if parser is None:
        return None
    return {option: tuple(o for o in action.option_strings if o.startswith("--"))
            for action in parser._actions for option in action.option_strings if option.startswith("--")}


def resolve_flag(flag: str, what: str = "server argument") -> str:
    """The option SGLang's parser reads ``flag`` as (it accepts unambiguous prefixes, allow_abbrev), spelled
    as CHECKED_ARGS spells it, so abbreviations and aliases meet the owned/placement/layout checks."""
    options = sglang_server_options()
    if options is None:
        if flag in CHECKED_ARGS:
            return flag
        meant = [a for a in CHECKED_ARGS if a.startswith(flag)]
        if meant:
            raise PlanError(f"{what} {flag} abbreviates {', '.join(meant)}; SGLang is not importable here, so the "
                            "planner cannot tell which option SGLang would read: write the full flag name")
        return flag
    if flag in options:
        spellings = options[flag]
    else:
        candidates = sorted(o for o in options if o.startswith(flag))
        if not candidates:
            return flag  # not an SGLang option: SGLang refuses it at start-up
        if len({options[c] for c in candidates}) > 1:
            raise PlanError(f"{what} {flag} is ambiguous: SGLang's parser could read it as {', '.join(candidates)}; "
                            "write the full flag name")
        spellings = options[candidates[0]]
    return next((s for s in spellings if s in CHECKED_ARGS), spellings[0])


def _server_flags(args: tuple[str, ...], what: str = "server argument") -> list[tuple[str, str, str]]:
    """(as written, as SGLang reads it, value) for each flag in a server argument list: '--x 1', '--x=1' and
    bare '--flag' (value 'true')."""
    found = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and arg != "--":  # a bare '--' ends argparse's options; it names no flag
            name, eq, value = arg.partition("=")
            if not eq:
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    value = args[i + 1]
                    i += 1
                else:
                    value = "true"
            found.append((name, resolve_flag(name, what), value))
        i += 1
    return found


def expand_config_file(args: tuple[str, ...], what: str = "server argument") -> tuple[tuple[str, ...], str | None]:
    """``args`` with its ``--config FILE`` replaced by the flags SGLang's own merger makes of the file
    (``ConfigArgumentMerger``: the file's keys first, so the command line still wins), and a note saying so; ``args``
    unchanged and None without one. The plan's commands then carry the settings themselves, checked like any other
    flag, rather than a path each host would read from its own copy of the file."""
    configs = [(written, value) for written, flag, value in _server_flags(args, what) if flag == CONFIG_ARG]
    if not configs:
        return args, None
    if len(configs) > 1:
        raise PlanError(f"{what} gives {CONFIG_ARG} {len(configs)} times; SGLang reads one config file")
    written, path = configs[0]
    if CONFIG_ARG not in args:  # an abbreviation, or --config=FILE: SGLang merges only the exact '--config FILE'
        raise PlanError(f"{what} sets {written}{'=' if written == CONFIG_ARG else ' '}{path}, which SGLang parses but "
                        f"never reads (it merges a config file only when written as '{CONFIG_ARG} FILE'); write "
                        f"'{CONFIG_ARG} {path}'")
    parser = sglang_server_parser()
    if parser is None:
        raise PlanError(f"{what} sets {CONFIG_ARG} {path}, but SGLang is not importable here, so the planner cannot "
                        "read the file as SGLang would; plan where SGLang is installed, or pass the settings with "
                        "--server-arg / --prefill-arg / --decode-arg")
    try:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        merged = tuple(ConfigArgumentMerger(parser).merge_config_with_args(list(args)))
    except Exception as exc:  # missing file, not YAML, not a mapping, an option a config file cannot set
        raise PlanError(f"{what} {CONFIG_ARG} {path}: SGLang's config reader refuses it: {exc}") from None
    from_file = merged[:len(merged) - (len(args) - 2)]  # the merger puts the file's flags first
    return merged, (f"{what} {CONFIG_ARG} {path} was read here with SGLang's config reader; its keys are written into "
                    f"the commands as {len(_server_flags(from_file, what))} flag(s) before the command line's own "
                    "(which still win), so the hosts need no copy of the file")


def _flag_values(args: tuple[str, ...], what: str = "server argument") -> dict[str, str]:
    """Each flag's value under the name SGLang reads it as (the last one wins, as in argparse)."""
    return {flag: value for _written, flag, value in _server_flags(args, what)}


def layout_fingerprint(env: dict[str, str], args: tuple[str, ...]) -> str:
    """A short hash of the layout-deciding settings: equal on both sides iff they agree."""
    flags = _flag_values(args)
    key = {"env": {k: env.get(k, "") for k in LAYOUT_ENV}, "args": {a: flags.get(a, "") for a in LAYOUT_ARGS}}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


# --- the transport decision ---------------------------------------------------------------------

UCX_FAQ = "UCX FAQ (openucx/ucx docs/source/faq.md)"
# Measured here (tests/sglang_sm120/pd/test_nixl_transfer.py): NIXL's UCX backend with peer error
# handling fails to start with UCX_TLS=sm alone ("sysv/memory - no peer failure handler").
TCP_FOR_PEER_ERRORS = ("tcp (loopback) is listed because UCX's shared-memory transports have no peer-failure handler, "
                       "and NIXL's endpoints need one for wire-up, active messages and keepalive; sm adds CMA "
                       "zero-copy for the DRAM aux buffers")


def choose_transport(topology: Topology, prefill_hosts: dict[str, set[int]],
                     decode_hosts: dict[str, set[int]]) -> tuple[list[Setting], list[str]]:
    """UCX settings for the prefill->decode KV path. Returns (settings, notes)."""
    settings: list[Setting] = []
    notes: list[str] = []
    same_box = set(prefill_hosts) == set(decode_hosts) and len(prefill_hosts) == 1
    if same_box:
        host = topology.host(next(iter(prefill_hosts)))
        pairs = [(p, d) for p in prefill_hosts[host.name] for d in decode_hosts[host.name]]
        missing = [(p, d) for p, d in pairs if not (host.p2p[p][d] and host.p2p[d][p])]
        if not missing:
            settings.append(Setting(
                "UCX_TLS", "cuda_ipc,cuda_copy,tcp,sm",
                "one box with PCIe P2P between every prefill and decode GPU: cuda_ipc copies VRAM into the peer "
                "process's VRAM directly (ucx cuda_ipc_md.c maps a peer buffer only when P2P is possible); "
                f"cuda_copy lets UCX handle GPU memory ({UCX_FAQ}); {TCP_FOR_PEER_ERRORS}"))
        else:
            p, d = missing[0]
            settings.append(Setting(
                "UCX_TLS", "cuda_copy,tcp,sm",
                f"no PCIe P2P between GPU {p} (prefill) and GPU {d} (decode)"
                f"{f' and {len(missing) - 1} more pairs' if len(missing) > 1 else ''}: cuda_ipc could not map "
                "the peer's VRAM, so UCX pipelines through host memory, cuda_copy (GPU<->host) plus sm "
                f"(host<->host shared memory) ({UCX_FAQ}: GPU memory without a direct path is copied via host); "
                + TCP_FOR_PEER_ERRORS))
            notes.append(f"{host.gpu_model.name} on host {host.name} has no P2P between the prefill and decode GPUs: "
                         "KV moves GPU->host->GPU, bounded by PCIe host bandwidth; expect slower transfers than a P2P box")
        return settings, notes

    hosts = [topology.host(n) for n in sorted(set(prefill_hosts) | set(decode_hosts))]
    rdma_everywhere = all(h.rdma_nics() for h in hosts)
    if rdma_everywhere:
        gdr = all(h.gpu_model.gpudirect_rdma and any(n.gpudirect for n in h.rdma_nics()) for h in hosts)
        if gdr:
            reason = ("RDMA NICs with GPUDirect on every host: rc (reliable connected, UD for bootstrap) moves VRAM "
                      f"zero-copy NIC<->GPU; cuda_copy is required for GPU memory ({UCX_FAQ})")
        else:
            lacking = next(h for h in hosts if not (h.gpu_model.gpudirect_rdma
                                                   and any(n.gpudirect for n in h.rdma_nics())))
            why = (f"{lacking.gpu_model.name} has no GPUDirect RDMA" if not lacking.gpu_model.gpudirect_rdma
                   else f"no NIC on {lacking.name} is marked gpudirect (nvidia_peermem or dma-buf)")
            reason = (f"RDMA NICs on every host but {why}: rc carries the bytes, staged through host memory by "
                      f"cuda_copy ({UCX_FAQ}: zero-copy GPU RDMA needs a peer-memory driver or dma-buf)")
            notes.append(f"{why}: each KV page crosses host memory on both ends; enable GPUDirect for zero-copy")
        settings.append(Setting("UCX_TLS", "rc,cuda_copy", reason))
        for h in hosts:
            nic = next((n for n in h.rdma_nics() if n.gpudirect), h.rdma_nics()[0])
            settings.append(Setting("UCX_NET_DEVICES", f"{nic.name}:1",
                                    f"pins UCX to the RDMA port {nic.name}:1 on {h.name}, so it never falls back to "
                                    f"a TCP interface ({UCX_FAQ}: UCX_NET_DEVICES=mlx5_2:1)", applies_to=h.name))
        return settings, notes

    without = [h.name for h in hosts if not h.rdma_nics()]
    for h in hosts:
        if not h.tcp_nics():
            raise PlanError(f"host {h.name} has neither an RDMA NIC nor a TCP interface in the topology; "
                            "add one under 'nics' so the KV transfer has a path between the boxes")
    settings.append(Setting(
        "UCX_TLS", "tcp,cuda_copy",
        f"no RDMA NIC on {', '.join(without)}: TCP sockets carry the KV, cuda_copy stages GPU memory through "
        f"host buffers ({UCX_FAQ}: Ethernet-only machines use TCP between nodes)"))
    for h in hosts:
        nic = h.tcp_nics()[0]
        settings.append(Setting("UCX_NET_DEVICES", nic.name,
                                f"pins UCX's TCP transport to {nic.name} on {h.name} instead of every interface "
                                f"({UCX_FAQ}: UCX_NET_DEVICES=eth2)", applies_to=h.name))
    notes.append("TCP between boxes: each request's KV (~584 B/token/layer) crosses the Ethernet link; "
                 "an RDMA NIC removes the socket copies")
    return settings, notes


# --- the plan -----------------------------------------------------------------------------------

def _check_side(side: SideRequest, role: str, host: Host, model_weights_gib: float | None) -> None:
    dupes = sorted({g for g in side.gpus if side.gpus.count(g) > 1})
    if dupes:
        raise PlanError(f"{role} GPUs list GPU {', '.join(map(str, dupes))} more than once")
    outside = [g for g in side.gpus if not 0 <= g < host.gpu_count]
    if outside:
        raise PlanError(f"{role} asks for GPU {', '.join(map(str, outside))} but host {host.name} has "
                        f"{host.gpu_count} GPUs (0-{host.gpu_count - 1})")
    if side.tp not in dsv4.SUPPORTED_TP:
        raise PlanError(f"--{role}-tp {side.tp}: DSv4-Flash runs at TP {', '.join(map(str, dsv4.SUPPORTED_TP))} "
                        f"(its {dsv4.O_GROUPS} output groups split evenly)")
    if len(side.gpus) % side.tp:
        raise PlanError(f"{role} has {len(side.gpus)} GPUs, not a multiple of --{role}-tp {side.tp}")
    for k in range(0, len(side.gpus), side.tp):
        group = side.gpus[k:k + side.tp]
        if list(group) != list(range(group[0], group[0] + side.tp)):
            raise PlanError(f"{role} server {k // side.tp} would run on GPUs {','.join(map(str, group))}: SGLang "
                            f"places a TP-{side.tp} server on --base-gpu-id and the next {side.tp - 1}, so each "
                            "server's GPUs must be consecutive")
    need = weight_gib_per_gpu(side.tp, model_weights_gib)
    usable = host.gpu_model.memory_gib * MEM_FRACTION_STATIC - MIN_KV_GIB_PER_GPU
    if need > usable:
        raise PlanError(f"{role}: a TP-{side.tp} server on {host.gpu_model.name} ({host.gpu_model.memory_gib:g} GiB) "
                        f"needs ~{need:.1f} GiB of weights per GPU but has ~{usable:.1f} GiB after SGLang's "
                        f"{MEM_FRACTION_STATIC:.0%} static fraction and a {MIN_KV_GIB_PER_GPU:g} GiB KV minimum; "
                        "use a larger TP (or --model-weights-gib for a smaller checkpoint)")


def _check_owned_args(args: tuple[str, ...], what: str) -> None:
    for written, flag, value in _server_flags(args, what):
        named = written if written == flag else f"{written} (SGLang reads it as {flag})"
        if flag in PLANNER_OWNED_ARGS:
            raise PlanError(f"{what} sets {named}, which the planner owns (use --model-path, --prefill-tp/--decode-tp, "
                            "--prefill-gpus/--decode-gpus and the port options)")
        if flag in FOOTPRINT_ARGS and value != FOOTPRINT_ARGS[flag]:
            raise PlanError(f"{what} sets {named} {value}, which would run a server on more GPUs or nodes than the "
                            "plan assigned it; the plan owns GPU placement (use --prefill-gpus/--decode-gpus and "
                            "--prefill-tp/--decode-tp)")
        if flag == CONFIG_ARG:  # expand_config_file leaves none; a second one inside the file would be ignored
            raise PlanError(f"{what} sets {named} inside a config file; SGLang reads only the command line's")


def _check_port(port: int, what: str) -> None:
    if not 1024 <= port <= 65535:
        raise PlanError(f"{what} {port} is outside 1024-65535")


def make_plan(req: PlanRequest) -> Plan:
    try:
        prefill_host = req.topology.host(req.prefill.host)
        decode_host = req.topology.host(req.decode.host)
        router_host = req.topology.host(req.router_host or prefill_host.name)
    except TopologyError as exc:
        raise PlanError(str(exc)) from None
    if not req.model_path:
        raise PlanError("--model-path is required")
    _check_side(req.prefill, "prefill", prefill_host, req.model_weights_gib)
    _check_side(req.decode, "decode", decode_host, req.model_weights_gib)
    if prefill_host.name == decode_host.name:
        both = sorted(set(req.prefill.gpus) & set(req.decode.gpus))
        if both:
            raise PlanError(f"GPU {', '.join(map(str, both))} on host {prefill_host.name} is in both the prefill "
                            "and the decode set; the two sides need their own GPUs")
    config_notes = []
    expanded = {}
    for field, what in (("server_args", "--server-arg"), ("prefill_args", "--prefill-arg"),
                        ("decode_args", "--decode-arg")):
        expanded[field], note = expand_config_file(tuple(getattr(req, field)), what)
        if note:
            config_notes.append(note)
    req = dataclasses.replace(req, **expanded)
    for args, what in ((req.server_args, "--server-arg"), (req.prefill_args, "--prefill-arg"),
                       (req.decode_args, "--decode-arg")):
        _check_owned_args(args, what)
    for port, what in ((req.http_port, "--http-port"), (req.bootstrap_port, "--bootstrap-port"),
                       (req.router_port, "--router-port")):
        _check_port(port, what)

    multi_host = len({prefill_host.name, decode_host.name, router_host.name}) > 1
    # One host: every process listens on loopback and is reached there (health checks, router targets, the bootstrap
    # host the router hands decode), whatever address the topology gives the host: nothing has to leave the box, and
    # the servers' unauthenticated APIs stay off the network. Across hosts: every interface, reached at each host's
    # address. Either way a process is reachable at the URL the plan gives for it.
    bind = "0.0.0.0" if multi_host else LOOPBACK

    def reached_at(host: Host) -> str:
        return host.address if multi_host else LOOPBACK

    # settings shared by both sides; a user value for a planned key wins only if it is the same on both
    prefill_hosts = {prefill_host.name: set(req.prefill.gpus)}
    decode_hosts = {decode_host.name: set(req.decode.gpus)}
    transport, notes = choose_transport(req.topology, prefill_hosts, decode_hosts)
    notes = config_notes + notes
    settings = [
        Setting("--disaggregation-transfer-backend", "nixl",
                "SGLang's NIXL connector moves the KV pages; it is the backend this plugin tests (DSv4 state types "
                "SWA/SWA_RING/DSV4_REQUEST_STATE are supported there)"),
        Setting("SGLANG_DISAGGREGATION_NIXL_BACKEND", "UCX",
                "the UCX plugin ships in the nixl wheel and covers P2P, shared-memory, RDMA and TCP paths"),
        Setting("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", '{"ucx_error_handling_mode": "peer"}',
                "peer error handling: a dead peer fails the transfer with an error instead of hanging the sender "
                "(the fault test kills the receiver mid-transfer under this setting)"),
        *transport,
        Setting("SGLANG_DSV4_KV_LAYOUT", "v4",
                "the 584-byte V4 layout is the only one sm_120 attention reads; pinned so both sides build the "
                "same pools"),
        Setting("SGLANG_OPT_SM120_DIRECT_SWA_KV", "0",
                "pd_kv_layout() does not encode the physical SWA page size, so a mismatch would not be caught by "
                "SGLang's handshake; pinned off on both sides"),
    ]
    pinned_reason = ("pinned to its default in both commands, so a value inherited from one machine's shell cannot "
                     "give the two sides different KV layouts or plugin kernels")
    settings += [Setting(k, v, pinned_reason) for k, v in PINNED_DEFAULTS.items()]
    common_env = {s.name: s.value for s in settings if s.name.isupper() and s.applies_to == "prefill+decode"}
    for key, value in req.env.items():
        if key in common_env and key not in PINNED_DEFAULTS and value != common_env[key]:
            notes.append(f"--env {key}={value} overrides the planned {common_env[key]}")
        common_env[key] = value
    side_env = {"prefill": {**common_env, **req.prefill_env}, "decode": {**common_env, **req.decode_env}}
    user_env_keys = {"prefill": set(req.env) | set(req.prefill_env), "decode": set(req.env) | set(req.decode_env)}
    side_args = {"prefill": tuple(req.server_args) + tuple(req.prefill_args),
                 "decode": tuple(req.server_args) + tuple(req.decode_args)}

    # NIXL/UCX settings the disagg seam would report as broken in every server are refused now, in its words
    side_host = {"prefill": prefill_host, "decode": decode_host}
    broken = {role: nixl_settings_problems(side_env[role], rdma_available=bool(side_host[role].rdma_nics()),
                                           where=f"host {side_host[role].name}") for role in ("prefill", "decode")}
    if any(broken.values()):
        whose = " and ".join(role for role, problems in broken.items() if problems)
        raise PlanError(f"the {whose} servers' NIXL/UCX settings would not work: "
                        + "; ".join(dict.fromkeys(p for problems in broken.values() for p in problems)))

    # the two sides must agree on everything that decides the KV bytes
    disagreements = []
    for key in LAYOUT_ENV:
        pv, dv = side_env["prefill"].get(key), side_env["decode"].get(key)
        if pv != dv:
            disagreements.append(f"env {key}: prefill={pv if pv is not None else '(unset)'} "
                                 f"decode={dv if dv is not None else '(unset)'}")
    pflags, dflags = _flag_values(side_args["prefill"]), _flag_values(side_args["decode"])
    for flag in LAYOUT_ARGS:
        if pflags.get(flag) != dflags.get(flag):
            disagreements.append(f"{flag}: prefill={pflags.get(flag, '(default)')} decode={dflags.get(flag, '(default)')}")
    if disagreements:
        raise PlanError("prefill and decode would build different KV layouts (prefill writes the pages decode reads): "
                        + "; ".join(disagreements) + ". Set these the same on both sides (--env / --server-arg)")
    fingerprint = layout_fingerprint(side_env["prefill"], side_args["prefill"])

    processes: list[PlannedProcess] = []
    used_ports: dict[tuple[str, int], str] = {}

    def claim(host: Host, port: int, what: str) -> None:
        if (host.name, port) in used_ports:
            raise PlanError(f"port clash on host {host.name}: {what} and {used_ports[(host.name, port)]} both use "
                            f"port {port}; choose other --http-port / --bootstrap-port / --router-port")
        _check_port(port, what)
        used_ports[(host.name, port)] = what

    http_next = {h.name: req.http_port for h in req.topology.hosts}
    boot_next = req.bootstrap_port
    for role, side, host in (("prefill", req.prefill, prefill_host), ("decode", req.decode, decode_host)):
        for k in range(len(side.gpus) // side.tp):
            name = f"{role}-{k}"
            gpus = side.gpus[k * side.tp:(k + 1) * side.tp]
            port = http_next[host.name]
            http_next[host.name] += 1
            claim(host, port, f"{name} http")
            argv = [req.python, "-m", "sglang.launch_server", "--model-path", req.model_path, "--trust-remote-code",
                    "--tp", str(side.tp), "--base-gpu-id", str(gpus[0]), "--host", bind, "--port", str(port),
                    "--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]
            bootstrap = None
            if role == "prefill":
                bootstrap = boot_next
                boot_next += 1
                claim(host, bootstrap, f"{name} bootstrap")
                argv += ["--disaggregation-bootstrap-port", str(bootstrap)]
            argv += list(side_args[role])
            env = {k: v for k, v in side_env[role].items()}
            for s in transport:
                if s.applies_to != host.name:
                    continue
                if s.name in user_env_keys[role]:  # the user's value (e.g. another NIC) wins, said once per server
                    notes.append(f"{name} on host {host.name} keeps {s.name}={env[s.name]} from --env/--{role}-env; "
                                 f"the plan's {s.value} was not applied")
                else:
                    env[s.name] = s.value
            env.update({ENV_ROLE: role, ENV_NAME: name, ENV_LAYOUT: fingerprint})
            processes.append(PlannedProcess(name, role, host.name, reached_at(host), argv, env, port, gpus,
                                            bootstrap))
    claim(router_host, req.router_port, "router")
    router_argv = [req.python, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for p in processes:
        if p.role == "prefill":
            router_argv += ["--prefill", p.url, str(p.bootstrap_port)]
    for p in processes:
        if p.role == "decode":
            router_argv += ["--decode", p.url]
    router_argv += ["--host", bind, "--port", str(req.router_port)]
    processes.append(PlannedProcess("router", "router", router_host.name, reached_at(router_host), router_argv,
                                    {ENV_ROLE: "router", ENV_NAME: "router"}, req.router_port))
    settings.append(Setting(ENV_LAYOUT, fingerprint, "hash of the KV-layout settings; the plugin's disagg seam "
                            "re-computes it in each server process and marks itself failed, with an error in the log, if the "
                            "process's settings drifted from the plan"))
    if multi_host:
        notes.append("servers bind 0.0.0.0 because the router and the peer box reach them by address; "
                     "run each host's commands there (pd launch --local-host NAME)")
    else:
        note = f"one host: every process binds {LOOPBACK} and is reached there; the router answers on this machine only"
        if prefill_host.address != LOOPBACK:
            note += f"; host {prefill_host.name}'s address {prefill_host.address} is for plans spanning hosts"
        notes.append(note)
    return Plan(processes, settings, notes, fingerprint)
