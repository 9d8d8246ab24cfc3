"""The ``disagg`` seam: no SGLang function is replaced; in a PD server started from a plan it checks that
the process's KV-layout and NIXL/UCX settings match the plan, and fails (logged) when they drifted."""

import logging
import os
import sys

import pytest

from sglang_sm120 import disagg
from sglang_sm120.pd.planner import ENV_LAYOUT, ENV_ROLE, PlanRequest, SideRequest, make_plan
from sglang_sm120.pd.topology import topology_from_dict
from sglang_sm120.seams import SeamRegistry, SeamState


@pytest.fixture
def planned_decode():
    topo = topology_from_dict({"hosts": [{"name": "box", "gpu_model": "RTX PRO 6000", "gpu_count": 8}]})
    req = PlanRequest(topo, "/m", SideRequest(None, (0, 1, 2, 3), 4), SideRequest(None, (4, 5, 6, 7), 4),
                      server_args=("--kv-cache-dtype", "fp8_e4m3"))
    proc = make_plan(req).servers()[1]
    assert proc.role == "decode"
    return dict(proc.env), proc.argv[3:]  # what the server process sees: its env and sys.argv[1:]


def test_seam_shape():
    seam = disagg.make_seam()
    assert seam.name == "disagg" and seam.targets == ()
    assert "no SGLang function is replaced" in seam.description


def test_applies_only_to_planned_prefill_and_decode_servers(monkeypatch):
    monkeypatch.delenv(ENV_ROLE, raising=False)
    assert "SGLANG_SM120_PD_ROLE unset" in disagg._applies()
    monkeypatch.setenv(ENV_ROLE, "router")
    assert "not a prefill or decode server" in disagg._applies()
    for role in ("prefill", "decode"):
        monkeypatch.setenv(ENV_ROLE, role)
        assert disagg._applies() is None


def test_planned_settings_pass(planned_decode):
    env, argv = planned_decode
    assert disagg.check_pd_environment(env, argv) == []


def test_a_config_file_on_a_server_started_by_hand_is_read(planned_decode, tmp_path):
    """A server started by hand with --config FILE: the file's layout flags count, as SGLang merges them."""
    env, argv = planned_decode
    argv = [a for a in argv]
    at = argv.index("--kv-cache-dtype")
    del argv[at:at + 2]
    same, other = tmp_path / "same.yaml", tmp_path / "other.yaml"
    same.write_text("kv-cache-dtype: fp8_e4m3\n")
    other.write_text("kv-cache-dtype: bf16\n")
    assert disagg.check_pd_environment(env, [*argv, "--config", str(same)]) == []
    (problem,) = disagg.check_pd_environment(env, [*argv, "--config", str(other)])
    assert "drifted from the plan" in problem and "--kv-cache-dtype=bf16" in problem
    problems = disagg.check_pd_environment(env, [*argv, "--config", str(tmp_path / "missing.yaml")])
    assert any("Config file not found" in p for p in problems)


@pytest.mark.parametrize("change,message", [
    ({"SGLANG_OPT_SM120_DIRECT_SWA_KV": "1"}, "SGLANG_OPT_SM120_DIRECT_SWA_KV=1"),
    ({"SGLANG_SM120_DISABLE": "attention"}, "SGLANG_SM120_DISABLE=attention"),
    ({"UCX_TLS": "tcp,cuda_copy"}, "UCX_TLS=tcp,cuda_copy"),
    ({"SGLANG_DSV4_COMPRESS_STATE_DTYPE": "bf16"}, "SGLANG_DSV4_COMPRESS_STATE_DTYPE=bf16"),
])
def test_drifted_env_is_reported_with_the_current_values(planned_decode, change, message):
    env, argv = planned_decode
    problems = disagg.check_pd_environment({**env, **change}, argv)
    assert len(problems) == 1 and "drifted from the plan" in problems[0] and message in problems[0]


def test_drifted_server_args_are_reported(planned_decode):
    env, argv = planned_decode
    argv = [a if a != "fp8_e4m3" else "bf16" for a in argv]
    (problem,) = disagg.check_pd_environment(env, argv)
    assert "--kv-cache-dtype=bf16" in problem


@pytest.mark.parametrize("extra", [["--kv-cache-dt", "bf16"], ["--kv-cache-dt=bf16"]])
def test_an_abbreviated_layout_flag_added_to_a_server_is_seen(planned_decode, extra):
    # SGLang's parser reads --kv-cache-dt as --kv-cache-dtype, and the last one wins
    env, argv = planned_decode
    (problem,) = disagg.check_pd_environment(env, [*argv, *extra])
    assert "drifted from the plan" in problem and "--kv-cache-dtype=bf16" in problem
    assert disagg.check_pd_environment(env, [*argv, "--kv-cache-dt", "fp8_e4m3"]) == []


@pytest.mark.parametrize("change,message", [
    ({ENV_LAYOUT: ""}, "SGLANG_SM120_PD_LAYOUT is unset"),
    ({"SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": '{"num_threads": 8}'}, "not a JSON object of strings"),
    ({"SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": "not json"}, "not a JSON object of strings"),
    ({"UCX_TLS": "sm,cuda_copy"}, "no transport with a peer-failure handler"),
])
def test_bad_nixl_environment_is_reported(planned_decode, change, message):
    env, argv = planned_decode
    problems = disagg.check_pd_environment({**env, **change}, argv)
    assert any(message in p for p in problems), problems


def test_registry_marks_the_seam_active_or_failed(planned_decode, monkeypatch, caplog):
    env, argv = planned_decode
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", ["launch_server", *argv])
    forced = {**os.environ, "SGLANG_SM120_FORCE": "1"}
    registry = SeamRegistry()
    seam = registry.add(disagg.make_seam())
    registry.apply_all(environ=forced, gpu=(False, "no CUDA device"))
    assert seam.state is SeamState.ACTIVE, seam.reason

    monkeypatch.setenv("SGLANG_OPT_SM120_DIRECT_SWA_KV", "1")
    registry.reset()
    with caplog.at_level(logging.ERROR, logger="sglang_sm120"):
        registry.apply_all(environ=forced, gpu=(False, "no CUDA device"))
    assert seam.state is SeamState.FAILED and "drifted from the plan" in seam.reason
    assert any("drifted from the plan" in r.getMessage() for r in caplog.records)

    monkeypatch.delenv(ENV_ROLE)
    registry.reset()
    registry.apply_all(environ=forced, gpu=(False, "no CUDA device"))
    assert seam.state is SeamState.NOT_APPLICABLE


# UCX_TLS entries as UCX reads them (openucx/ucx src/ucp/core/ucp_context.c, ucp_tl_aliases): device-specific
# transport names, aliases, a leading '\' (that exact transport, not an alias) and ':aux' (wire-up only)
@pytest.mark.parametrize("tls", ["rc_mlx5", "rc_verbs", "dc_mlx5", "ud_mlx5", "ud_verbs", "ib", "rc_x", "dc_x", "ud_x",
                                 "rc_v", "ud_v", "rc", "ud", "dc", "tcp", "all", "sm,rc_mlx5,cuda_copy",
                                 "cuda_copy, tcp", "\\rc_mlx5,cuda_copy", "^sm"])
def test_ucx_transports_with_a_peer_failure_handler_pass(planned_decode, tls):
    env, argv = planned_decode
    problems = disagg.check_pd_environment({**env, "UCX_TLS": tls}, argv)
    assert not any("peer-failure" in p for p in problems), problems


@pytest.mark.parametrize("tls", ["sm", "shm", "posix,sysv,xpmem,cma,knem", "self", "cuda", "cuda_copy,cuda_ipc",
                                 "gdr_copy", "sm,cuda_copy", "sm,ud_mlx5:aux,cuda_copy", "rcache,udp,dcx"])
def test_ucx_transports_without_a_peer_failure_handler_are_reported(planned_decode, tls):
    env, argv = planned_decode
    problems = disagg.check_pd_environment({**env, "UCX_TLS": tls}, argv)
    assert any(f"UCX_TLS={tls} has no transport with a peer-failure handler" in p for p in problems), problems


@pytest.mark.parametrize("rdma", [False, True])
@pytest.mark.parametrize("tls,leaves_a_handler_without_rdma", [("^tcp", False), ("^sm,tcp,cma", False),
                                                               ("^all", None), ("^sm", True), ("^cuda_ipc,sm", True)])
def test_an_exclusion_list_is_judged_by_this_machines_nics(planned_decode, monkeypatch, rdma, tls,
                                                          leaves_a_handler_without_rdma):
    """``UCX_TLS=^...``: what is left depends on the machine; without an RDMA NIC tcp is the only transport with a
    peer-failure handler, so excluding it is reported; with one, the rc/ud/dc family may be left ('^all' never)."""
    env, argv = planned_decode
    monkeypatch.setattr(disagg, "rdma_nic_present", lambda: rdma)
    problems = disagg.check_pd_environment({**env, "UCX_TLS": tls}, argv)
    if tls == "^all":
        assert any("UCX_TLS=^all excludes every transport" in p for p in problems), problems
        return
    reported = any(f"UCX_TLS={tls} excludes tcp and this machine has no RDMA NIC" in p for p in problems)
    assert reported == (not rdma and not leaves_a_handler_without_rdma), problems


def test_an_empty_ucx_tls_is_reported(planned_decode):
    """UCX refuses an empty transport list ("The TLs list is empty", seen by the doctor's NIXL loopback)."""
    env, argv = planned_decode
    problems = disagg.check_pd_environment({**env, "UCX_TLS": " "}, argv)
    assert any("UCX_TLS is set but empty" in p for p in problems), problems
