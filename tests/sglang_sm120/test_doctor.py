"""``sglang-sm120 doctor`` on this GPU-less machine, and its verdict when the install is broken."""

import os
import re
import subprocess
import sys

import pytest

from sglang_sm120 import doctor, plugin
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
