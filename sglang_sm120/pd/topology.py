"""The machines a PD deployment runs on: hosts, their GPUs, the GPU peer-to-peer matrix, NICs.

A topology comes from a JSON file (any machine can plan for any other), from flags describing
one host, or from detection on this machine (``detect_local``). Every input is validated here
and a bad one raises :class:`TopologyError` with a message naming the field.

File format::

    {"hosts": [
      {"name": "box0", "address": "10.0.0.1", "gpu_model": "RTX PRO 6000", "gpu_count": 8,
       "p2p": "all",                       # or "none", or an NxN matrix of 0/1
       "nics": [{"name": "mlx5_0", "kind": "rdma", "gpudirect": true},
                {"name": "eth0", "kind": "tcp"}],
       "gpu_memory_gib": 95.6}             # optional: overrides the model table
    ]}
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import pathlib
import socket


class TopologyError(ValueError):
    """A topology description that cannot be used, with the reason."""


@dataclasses.dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gib: float
    # PCIe peer-to-peer between two cards of this model in one box: NVIDIA enables it on the
    # professional RTX PRO line and disables it on GeForce cards (RTX 5090) in the driver.
    pcie_p2p: bool
    # GPUDirect RDMA (a NIC reading/writing VRAM directly) is supported on professional and data
    # center GPUs, not on GeForce.
    gpudirect_rdma: bool
    arch: str


# Memory is what the CUDA driver reports (total_memory), in GiB.
GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("RTX PRO 6000", 95.6, pcie_p2p=True, gpudirect_rdma=True, arch="sm_120"),
        GpuModel("RTX 5090", 31.4, pcie_p2p=False, gpudirect_rdma=False, arch="sm_120"),
        GpuModel("H200", 139.8, pcie_p2p=True, gpudirect_rdma=True, arch="sm_90"),
    )
}


def find_gpu_model(name: str) -> GpuModel | None:
    """The table entry whose name appears in ``name`` (e.g. 'NVIDIA RTX PRO 6000 Blackwell
    Workstation Edition' matches 'RTX PRO 6000'), or None."""
    folded = " ".join(name.upper().split())
    for model in GPU_MODELS.values():
        if model.name.upper() in folded:
            return model
    return None


@dataclasses.dataclass(frozen=True)
class Nic:
    name: str
    kind: str  # "rdma" (InfiniBand / RoCE HCA, e.g. mlx5_0) or "tcp" (an Ethernet interface)
    gpudirect: bool = False  # the host can register VRAM with this NIC (nvidia_peermem or dma-buf)

    def __post_init__(self):
        if self.kind not in ("rdma", "tcp"):
            raise TopologyError(f"nic {self.name!r}: kind must be 'rdma' or 'tcp', got {self.kind!r}")
        if not self.name or any(c in self.name for c in " ,:"):
            raise TopologyError(f"nic name {self.name!r} must be a device name without spaces, commas or ports")


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    address: str  # where the other hosts and the router reach this host's servers
    gpu_model: GpuModel
    gpu_count: int
    p2p: tuple[tuple[bool, ...], ...]  # p2p[i][j]: GPU i can access GPU j's memory directly
    nics: tuple[Nic, ...] = ()

    def __post_init__(self):
        if self.gpu_count < 1:
            raise TopologyError(f"host {self.name!r}: gpu_count must be >= 1, got {self.gpu_count}")
        n = self.gpu_count
        if len(self.p2p) != n or any(len(row) != n for row in self.p2p):
            raise TopologyError(f"host {self.name!r}: p2p matrix must be {n}x{n} for {n} GPUs, got "
                                f"{len(self.p2p)}x{len(self.p2p[0]) if self.p2p else 0}")

    def rdma_nics(self) -> list[Nic]:
        return [nic for nic in self.nics if nic.kind == "rdma"]

    def tcp_nics(self) -> list[Nic]:
        return [nic for nic in self.nics if nic.kind == "tcp"]


@dataclasses.dataclass(frozen=True)
class Topology:
    hosts: tuple[Host, ...]

    def __post_init__(self):
        if not self.hosts:
            raise TopologyError("a topology needs at least one host")
        names = [h.name for h in self.hosts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise TopologyError(f"host names must be unique; repeated: {', '.join(dupes)}")
        seen: dict[str, Host] = {}
        for h in self.hosts:
            # two hosts at one address would put two hosts' servers, ports counted per host, on one machine
            key = _machine_key(h.address)
            first = seen.setdefault(key, h)
            if first is not h:
                both = first.address if h.address == first.address else f"{first.address} / {h.address}"
                why = ("two hosts cannot both be this machine (127.0.0.1 is the default when a host has no 'address')"
                       if key == "loopback" else "two hosts cannot be one machine")
                raise TopologyError(f"hosts {first.name} and {h.name} both have address {both}: {why}; give each "
                                    "host the address the others reach it at")

    def host(self, name: str | None) -> Host:
        if name is None:
            if len(self.hosts) == 1:
                return self.hosts[0]
            raise TopologyError(f"the topology has {len(self.hosts)} hosts ({', '.join(h.name for h in self.hosts)}); "
                                "name one with --prefill-host / --decode-host")
        for h in self.hosts:
            if h.name == name:
                return h
        raise TopologyError(f"unknown host {name!r}; the topology has {', '.join(h.name for h in self.hosts)}")

    def to_dict(self) -> dict:
        return {"hosts": [{
            "name": h.name, "address": h.address, "gpu_model": h.gpu_model.name, "gpu_count": h.gpu_count,
            "gpu_memory_gib": h.gpu_model.memory_gib,
            "p2p": [[int(x) for x in row] for row in h.p2p],
            "nics": [dataclasses.asdict(nic) for nic in h.nics],
        } for h in self.hosts]}


def _machine_key(address: str) -> str:
    """Equal for two addresses of one machine as far as the text shows: every loopback address is this machine."""
    text = address.strip().strip("[]").lower()
    if text == "localhost":
        return "loopback"
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text  # a host name
    return "loopback" if ip.is_loopback else str(ip)


def p2p_matrix(spec, n: int, where: str) -> tuple[tuple[bool, ...], ...]:
    """``"all"`` (every pair has P2P), ``"none"``, ``"model"`` (resolved by the caller), or an NxN
    list of 0/1 (also as a string of rows separated by ';' or '/', e.g. '0110;1001;...')."""
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text in ("all", "none"):
            return tuple(tuple(text == "all" or i == j for j in range(n)) for i in range(n))
        rows = [r for r in text.replace("/", ";").split(";") if r.strip()]
        try:
            spec = [[int(c) for c in r.replace(",", "").replace(" ", "")] for r in rows]
        except ValueError:
            raise TopologyError(f"{where}: p2p must be 'all', 'none' or rows of 0/1 like '01;10', got {spec!r}") from None
    if not isinstance(spec, (list, tuple)) or len(spec) != n or any(
            not isinstance(r, (list, tuple)) or len(r) != n for r in spec):
        raise TopologyError(f"{where}: p2p matrix must be {n}x{n} (one row per GPU), got {spec!r}")
    if any(v not in (0, 1, True, False) for r in spec for v in r):
        raise TopologyError(f"{where}: p2p entries must be 0 or 1")
    return tuple(tuple(bool(v) or i == j for j, v in enumerate(r)) for i, r in enumerate(spec))


def _nic_from_dict(d, where: str) -> Nic:
    if not isinstance(d, dict) or "name" not in d or "kind" not in d:
        raise TopologyError(f"{where}: each nic needs 'name' and 'kind', got {d!r}")
    unknown = set(d) - {"name", "kind", "gpudirect"}
    if unknown:
        raise TopologyError(f"{where}: unknown nic fields {sorted(unknown)}")
    gpudirect = d.get("gpudirect", False)
    if not isinstance(gpudirect, bool):  # bool("false") is True
        raise TopologyError(f"{where}: gpudirect must be true or false, got {gpudirect!r}")
    return Nic(str(d["name"]), str(d["kind"]), gpudirect)


def parse_nic(text: str) -> Nic:
    """``NAME:rdma``, ``NAME:rdma:gpudirect`` or ``NAME:tcp`` (the --nic flag)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "gpudirect"):
        raise TopologyError(f"--nic {text!r}: expected NAME:rdma, NAME:rdma:gpudirect or NAME:tcp")
    return Nic(parts[0], parts[1], len(parts) == 3)


def _gib(value, where: str) -> float:
    try:
        gib = float(value)
    except (TypeError, ValueError):
        raise TopologyError(f"{where}: gpu_memory_gib must be a number, got {value!r}") from None
    if not (math.isfinite(gib) and gib > 0):
        raise TopologyError(f"{where}: gpu_memory_gib must be a positive finite number, got {value!r}")
    return gib


def host_from_fields(name: str, address: str, gpu_model: str, gpu_count, p2p="model", nics=(),
                     gpu_memory_gib=None, where: str | None = None) -> Host:
    where = where or f"host {name!r}"
    if not isinstance(gpu_count, int) or isinstance(gpu_count, bool):
        raise TopologyError(f"{where}: gpu_count must be an integer, got {gpu_count!r}")
    model = find_gpu_model(gpu_model)
    if model is None:
        if gpu_memory_gib is None:
            raise TopologyError(f"{where}: unknown GPU model {gpu_model!r} (known: {', '.join(GPU_MODELS)}); "
                                "give gpu_memory_gib and an explicit p2p matrix for other models")
        model = GpuModel(gpu_model, _gib(gpu_memory_gib, where), pcie_p2p=False, gpudirect_rdma=False, arch="unknown")
        if p2p == "model":
            raise TopologyError(f"{where}: unknown GPU model {gpu_model!r} needs an explicit p2p ('all', 'none' or a matrix)")
    elif gpu_memory_gib is not None:
        model = dataclasses.replace(model, memory_gib=_gib(gpu_memory_gib, where))
    if not model.memory_gib > 0:  # NaN too
        raise TopologyError(f"{where}: gpu_memory_gib must be positive")
    if p2p == "model":
        p2p = "all" if model.pcie_p2p else "none"
    return Host(name, address, model, gpu_count, p2p_matrix(p2p, max(gpu_count, 0), where) if gpu_count > 0 else (),
                tuple(nics))


def topology_from_dict(data) -> Topology:
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), list):
        raise TopologyError("a topology file is a JSON object with a 'hosts' list")
    hosts = []
    for i, h in enumerate(data["hosts"]):
        where = f"hosts[{i}]"
        if not isinstance(h, dict):
            raise TopologyError(f"{where}: expected an object")
        unknown = set(h) - {"name", "address", "gpu_model", "gpu_count", "p2p", "nics", "gpu_memory_gib"}
        if unknown:
            raise TopologyError(f"{where}: unknown fields {sorted(unknown)}")
        for key in ("gpu_model", "gpu_count"):
            if key not in h:
                raise TopologyError(f"{where}: missing '{key}'")
        name = str(h.get("name", f"host{i}"))
        nics = [_nic_from_dict(n, f"{where}.nics[{j}]") for j, n in enumerate(h.get("nics", []))]
        hosts.append(host_from_fields(name, str(h.get("address", "127.0.0.1")), str(h["gpu_model"]), h["gpu_count"],
                                      h.get("p2p", "model"), nics, h.get("gpu_memory_gib"), where=f"{where} ({name})"))
    return Topology(tuple(hosts))


def load_topology(path: str | os.PathLike) -> Topology:
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except FileNotFoundError:
        raise TopologyError(f"topology file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise TopologyError(f"topology file {path} is not valid JSON: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, not UTF-8 text
        raise TopologyError(f"topology file {path} cannot be read: {type(exc).__name__}: {exc}") from None
    return topology_from_dict(data)


# --- detection on this machine --------------------------------------------------------------------

_VIRTUAL_NET_PREFIXES = ("lo", "docker", "veth", "br-", "virbr", "ifb", "tun", "tap", "cni", "flannel", "cali")


def detect_nics(sys_root: str = "/sys") -> list[Nic]:
    """RDMA devices from /sys/class/infiniband and physical-looking interfaces from /sys/class/net.
    GPUDirect RDMA is assumed possible when the nvidia_peermem module is loaded; dma-buf support
    cannot be seen from sysfs, so a host that relies on it should say so in a topology file."""
    root = pathlib.Path(sys_root)
    peermem = (root / "module" / "nvidia_peermem").exists()
    nics = []
    ib = root / "class" / "infiniband"
    if ib.is_dir():
        nics += [Nic(p.name, "rdma", peermem) for p in sorted(ib.iterdir())]
    net = root / "class" / "net"
    if net.is_dir():
        nics += [Nic(p.name, "tcp") for p in sorted(net.iterdir()) if not p.name.startswith(_VIRTUAL_NET_PREFIXES)]
    return nics


def detect_local() -> tuple[Topology | None, str]:
    """This machine as a one-host topology, or None and the reason (no CUDA, unknown model...)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None, "no CUDA GPU is visible here"
        n = torch.cuda.device_count()
        names = {torch.cuda.get_device_name(i) for i in range(n)}
        if len(names) != 1:
            return None, f"mixed GPU models {sorted(names)}; describe the topology in a file"
        name = names.pop()
        memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
        p2p = [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)]
    except Exception as exc:  # a broken driver is a reason, not a crash
        return None, f"CUDA query failed: {exc}"
    model = find_gpu_model(name)
    label = model.name if model else name
    host = host_from_fields(socket.gethostname() or "local", "127.0.0.1", label, n, p2p, detect_nics(),
                            gpu_memory_gib=round(memory_gib, 1))
    return Topology((host,)), f"detected {n}x {name}"
