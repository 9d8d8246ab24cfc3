"""``sglang-sm120 doctor`` on this GPU-less machine, and its verdict when the install is broken."""

import os
import re
import subprocess
import sys

import pytest

from sglang_sm120 import doctor, plugin
from sglang_sm120.pd.planner import PlanRequest, SideRequest, make_plan
from sglang_sm120.pd.topology import topology_from_dict
from sglang_sm120.seams import SEAM_NAMES


def test_doctor_command_on_a_machine_without_gpu():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SM120_")}
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "sglang-sm120"), "doctor"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "no CUDA device" in out
    assert "sglang: 0.5.23 (supported)" in out
    for seam in SEAM_NAMES:
        assert re.search(rf"^  {seam} +not applicable", out, re.M), seam
    assert "not applicable: needs an sm_12x GPU or SGLANG_SM120_FORCE=1" in out
    assert "--moe-runner-backend sm120" in out
    assert out.rstrip().endswith("usable: yes")


def test_doctor_reports_forced_and_disabled_seams(monkeypatch):
    monkeypatch.setenv("SGLANG_SM120_FORCE", "1")
    monkeypatch.setenv("SGLANG_SM120_DISABLE", "dense")
    lines = []
    assert doctor.run(out=lines.append) == 0
    text = "\n".join(lines)
    assert re.search(r"^  dense +disabled by env", text, re.M)
    assert re.search(r"^  attention +active: SGLANG_SM120_FORCE=1", text, re.M)
    # the names form one column, however long the longest seam name is
    starts = [re.match(r"  (\S+) +", line) for line in lines]
    columns = {m.end() for m in starts if m and m.group(1) in SEAM_NAMES}
    assert len(columns) == 1 and len([m for m in starts if m and m.group(1) in SEAM_NAMES]) == len(SEAM_NAMES)


def test_doctor_names_disable_entries_that_match_no_seam(monkeypatch):
    """A typo in SGLANG_SM120_DISABLE leaves the seam it meant on; the plugin's warning is kept out of doctor's
    output, so doctor says it in the Seams section."""
    monkeypatch.setenv("SGLANG_SM120_DISABLE", "atention,moe")
    monkeypatch.delenv("SGLANG_SM120_FORCE", raising=False)
    monkeypatch.setattr(doctor, "_pd_rows", lambda: [])
    lines = []
    assert doctor.run(out=lines.append) == 0
    text = "\n".join(lines)
    assert "note: SGLANG_SM120_DISABLE names no seam called atention (known: attention," in text
    assert re.search(r"^  moe +disabled by env", text, re.M)
    assert re.search(r"^  attention +not applicable", text, re.M)


@pytest.mark.parametrize("value,forced", [("yes", True), ("ON", True), ("0", False), ("ture", False), ("2", False)])
def test_doctor_says_how_it_reads_sglang_sm120_force(monkeypatch, value, forced):
    monkeypatch.setenv("SGLANG_SM120_FORCE", value)
    monkeypatch.setattr(doctor, "_pd_rows", lambda: [])
    lines = []
    assert doctor.run(out=lines.append) == 0
    text = "\n".join(lines)
    assert bool(re.search(r"^  attention +active: SGLANG_SM120_FORCE", text, re.M)) == forced
    odd = value not in ("yes", "ON", "0")
    assert (f"note: SGLANG_SM120_FORCE='{value}' is neither on" in text) == odd


def test_doctor_fails_on_unsupported_sglang(monkeypatch):
    monkeypatch.setattr(doctor, "installed_version", lambda dist: "0.4.0" if dist == "sglang" else "1.0")
    monkeypatch.setattr(plugin, "installed_version", lambda dist: "0.4.0")
    lines = []
    assert doctor.run(out=lines.append) == 1
    text = "\n".join(lines)
    assert "NOT USABLE" in text and "sglang==0.5.23" in text


@pytest.mark.parametrize("gpus,tp", [(0, 1), (1, 1), (2, 2), (3, 2), (4, 4), (8, 8), (16, 8)])
def test_suggested_tensor_parallel_size(gpus, tp):
    assert doctor.suggested_tp(gpus) == tp


@pytest.fixture
def pd_server_env(monkeypatch):
    """This shell as a planned decode server's: its environment (a server's argv doctor cannot see)."""
    topo = topology_from_dict({"hosts": [{"name": "box", "gpu_model": "RTX PRO 6000", "gpu_count": 8}]})
    plan = make_plan(PlanRequest(topo, "/m", SideRequest(None, (0, 1, 2, 3), 4), SideRequest(None, (4, 5, 6, 7), 4)))
    for key, value in plan.servers()[1].env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(doctor, "_pd_rows", lambda: [])  # the nixl probe is not what these tests are about
    return monkeypatch


def seams_section(lines):
    start = lines.index(next(line for line in lines if line.startswith("Seams")))
    return "\n".join(lines[start:lines.index("", start)])


def test_doctor_runs_the_disagg_checks_in_a_pd_server_environment(pd_server_env):
    lines = []
    assert doctor.run(out=lines.append) == 0
    seams = seams_section(lines)
    assert "SGLANG_SM120_PD_ROLE=decode" in seams and "decode-0" in seams
    assert re.search(r"^    checked: .*UCX_TLS", seams, re.M), seams
    # what doctor cannot check is named, with the reason
    assert re.search(r"^    skipped: KV-layout .*command line", seams, re.M), seams


def test_doctor_reports_the_disagg_seams_problems(pd_server_env):
    pd_server_env.setenv("UCX_TLS", "sm,cuda_copy")
    pd_server_env.setenv("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", "peer")
    lines = []
    assert doctor.run(out=lines.append) == 1
    seams = seams_section(lines)
    assert "problem: UCX_TLS=sm,cuda_copy has no transport with a peer-failure handler" in seams
    assert "problem: SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS='peer' is not a JSON object of strings" in seams
    verdict = "\n".join(lines[lines.index("NOT USABLE:"):])
    assert "UCX_TLS=sm,cuda_copy" in verdict


def test_doctor_checks_a_pd_server_environment_without_nixl(pd_server_env):
    import importlib.util

    find_spec = importlib.util.find_spec
    pd_server_env.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nixl" else find_spec(name, *a))
    lines = []
    assert doctor.run(out=lines.append) == 1
    assert "problem: nixl is not installed: pip install 'sglang-sm120[pd]'" in seams_section(lines)


def test_doctor_runs_no_disagg_checks_outside_a_pd_server(monkeypatch):
    monkeypatch.delenv("SGLANG_SM120_PD_ROLE", raising=False)
    monkeypatch.setattr(doctor, "_pd_rows", lambda: [])
    lines = []
    assert doctor.run(out=lines.append) == 0
    assert not any(line.startswith("    ") for line in seams_section(lines).splitlines())


def test_a_failed_nixl_loopback_makes_a_pd_server_environment_unusable(pd_server_env):
    from sglang_sm120.pd.cli import LOOPBACK_LABEL

    failed = [(f"{LOOPBACK_LABEL} (this environment: UCX, UCX_TLS=^tcp)", "FAILED: NIXL_ERR_BACKEND", False)]
    pd_server_env.setattr(doctor, "_pd_rows", lambda: failed)
    lines = []
    assert doctor.run(out=lines.append) == 1
    verdict = "\n".join(lines[lines.index("NOT USABLE:"):])
    assert f"{LOOPBACK_LABEL} (this environment: UCX, UCX_TLS=^tcp): FAILED: NIXL_ERR_BACKEND" in verdict
    # outside a PD server the same row is reported, not a verdict (PD may not be in use)
    pd_server_env.delenv("SGLANG_SM120_PD_ROLE")
    lines = []
    assert doctor.run(out=lines.append) == 0
    assert any("FAILED: NIXL_ERR_BACKEND  (!)" in line for line in lines)
