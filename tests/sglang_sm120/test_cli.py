"""The ``sglang-sm120`` console script's commands and exit codes."""

import json

import pytest

from sglang_sm120 import cli


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in ("doctor", "aot-check", "pd"):
        assert command in out


def test_aot_check_unknown_filter_fails(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert cli.main(["aot-check", "--only", "no-such-kernel"]) == 2


@pytest.mark.parametrize("argv,message", [
    (["--arch", "75"], "--arch 75: the kernels need compute capability 90 or newer"),
    (["--arch", "120", "--arch", "80"], "--arch 80: the kernels need compute capability 90 or newer"),
    (["--json", "/nonexistent-dir/aot.json"], "--json /nonexistent-dir/aot.json: cannot write a file there"),
    (["--json", "/"], "--json /: cannot write a file there"),
])
def test_aot_check_refuses_what_cannot_work_before_compiling(monkeypatch, capsys, argv, message):
    """An arch without e4m3 / TMA / PDL failed every config one by one; an unwritable --json raised after every
    config had compiled. Both are refused first now."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert cli.main(["aot-check", "--only", "no-such-kernel", *argv]) == 2
    assert message in capsys.readouterr().err


def test_aot_check_refuses_under_the_interpreter(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert cli.main(["aot-check"]) == 2
    assert "TRITON_INTERPRET" in capsys.readouterr().err


def test_aot_check_reports_a_real_kernel_config(tmp_path, monkeypatch):
    """Run the command the way a user does (interpreter off) on one registered config."""
    import os
    import subprocess
    import sys

    from sglang_sm120.kernels.aot_registry import all_configs

    name = all_configs()[0].name
    report = tmp_path / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "sglang_sm120.cli", "aot-check", "--only", name, "--arch", "120",
                           "--json", str(report)], capture_output=True, text=True, env=env, timeout=900, cwd="/")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failed" in proc.stdout
    (row,) = [r for r in json.loads(report.read_text()) if r["config"] == name]
    assert row["arch"] == 120 and row["problems"] == [] and row["tensor_core_opcodes"]
