"""A real NIXL transfer between two processes on this machine (DRAM, loopback), configured with the
planner's UCX settings; every byte of the decode side's DSv4 pools is checked. Plus the fault test:
the decode process is SIGKILLed mid-run and the prefill side must report it within its timeout.

Needs the ``pd`` extra (``pip install 'sglang-sm120[pd]'`` -> nixl==1.5.1). The RDMA plans
(``rc``) cannot run here: this machine has no RDMA device.
"""

import subprocess
import sys

import pytest

from sglang_sm120.pd.nixl_check import EXIT_TRANSFER_FAILED, TransferSpec, run_pair, settings_from_plan
from sglang_sm120.pd.planner import PlanRequest, SideRequest, make_plan
from sglang_sm120.pd.topology import topology_from_dict

pytest.importorskip("nixl", reason="the pd extra (nixl==1.5.1) is part of the test install")

WALL_S = 90.0


def planned(kind: str) -> dict:
    """The NIXL/UCX settings the planner chooses for ``kind`` of deployment."""
    if kind == "two-boxes-tcp":
        # the transfer runs over loopback ("lo"); the addresses only name the boxes in URLs, and two hosts
        # at one address are refused
        hosts = [{"name": n, "address": a, "gpu_model": "RTX PRO 6000", "gpu_count": 1,
                  "nics": [{"name": "lo", "kind": "tcp"}]} for n, a in (("a", "192.0.2.1"), ("b", "192.0.2.2"))]
        req = PlanRequest(topology_from_dict({"hosts": hosts}), "/m", SideRequest("a", (0,), 1),
                          SideRequest("b", (0,), 1), model_weights_gib=1)
    else:
        model = {"one-box-p2p": "RTX PRO 6000", "one-box-no-p2p": "RTX 5090"}[kind]
        topo = topology_from_dict({"hosts": [{"name": "box", "gpu_model": model, "gpu_count": 2}]})
        req = PlanRequest(topo, "/m", SideRequest(None, (0,), 1), SideRequest(None, (1,), 1), model_weights_gib=1)
    return settings_from_plan(make_plan(req))


@pytest.mark.parametrize("kind,tls", [("one-box-p2p", "cuda_ipc,cuda_copy,tcp,sm"),
                                      ("one-box-no-p2p", "cuda_copy,tcp,sm"),
                                      ("two-boxes-tcp", "tcp,cuda_copy")])
def test_dsv4_pools_arrive_byte_exact(kind, tls):
    settings = planned(kind)
    assert settings["env"]["UCX_TLS"] == tls
    spec = TransferSpec(**settings)
    out = run_pair(spec, wall_timeout_s=WALL_S)
    assert out["hung"] == []
    assert out["prefill_exitcode"] == 0, out["prefill"]
    assert out["prefill"]["event"] == "sent"
    result = out["decode"]
    assert result["ok"], result
    assert result["mismatched"] == {}
    assert result["requests"] == spec.requests
    assert result["bytes_checked"] == spec.pools().nbytes  # every byte of every decode buffer


def test_a_misplaced_page_is_caught():
    spec = TransferSpec(**planned("one-box-p2p"), sabotage="wrong_page", requests=2)
    out = run_pair(spec, wall_timeout_s=WALL_S)
    result = out["decode"]
    assert out["prefill_exitcode"] == 0 and not result["ok"]
    # the page went to the wrong slot of every prepared-path region; SWA and aux are untouched
    pools = spec.pools()
    assert set(result["mismatched"]) == {r.name for r in pools.kv}
    assert all(n > 0 for n in result["mismatched"].values())


def test_receiver_killed_mid_run_is_reported_within_the_timeout():
    spec = TransferSpec(**planned("one-box-p2p"), kill_receiver_after=2, timeout_s=10.0, fault_run_s=30.0)
    out = run_pair(spec, wall_timeout_s=WALL_S)
    assert out["hung"] == []
    assert out["progress"] >= 2
    assert out["prefill_exitcode"] == EXIT_TRANSFER_FAILED, out["prefill"]
    assert out["prefill"]["event"] == "failed"
    assert out["prefill"]["reason"]  # NIXL's own words: remote disconnect / ERR / not DONE
    assert out["elapsed_after_kill"] is not None and out["elapsed_after_kill"] < spec.timeout_s + 5


PROBE = """
import os, sys
os.environ["UCX_TLS"] = sys.argv[1]
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("probe", nixl_agent_config(backends=[]))
try:
    agent.create_backend("UCX", {"ucx_error_handling_mode": "peer"})
except Exception as exc:
    print("FAILED", type(exc).__name__)
else:
    print("STARTED")
"""


@pytest.mark.parametrize("tls,outcome", [("sm", "FAILED"), ("tcp,sm", "STARTED")])
def test_shared_memory_alone_cannot_start_nixl_ucx_with_peer_error_handling(tls, outcome):
    # why the planner lists tcp beside sm on one box, and why the disagg seam checks UCX_TLS
    out = subprocess.run([sys.executable, "-c", PROBE, tls], capture_output=True, text=True, timeout=60)
    assert outcome in out.stdout, out.stdout + out.stderr
