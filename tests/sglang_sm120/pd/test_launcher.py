"""The PD launcher end to end with stand-in servers (``standin_server.py``) on loopback: start order,
health waiting, log prefixes, teardown when a child dies and on SIGTERM, no orphans, and a non-zero
exit that names the process that died."""

import io
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from sglang_sm120.pd.launcher import Launcher, ProcessSpec

HERE = pathlib.Path(__file__).resolve().parent
STANDIN = HERE / "standin_server.py"


def free_port_block(n: int) -> int:
    """A base port with ``n`` consecutive free ports on 127.0.0.1."""
    for _ in range(200):
        base = random.randrange(20000, 40000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port block")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is not running
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def events(log: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def assert_nothing_left(log: pathlib.Path, timeout: float = 5.0):
    pids = [e["pid"] for e in events(log) if e["event"] == "start"]
    pids += [e["grandchild"] for e in events(log) if e["event"] == "start"]
    assert pids
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []


@pytest.fixture
def fake_python(tmp_path):
    """An 'interpreter' for the planned commands that runs the stand-in instead of SGLang."""
    path = tmp_path / "python-standin"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDIN} \"$@\"\n")
    path.chmod(0o755)
    return path


ONE_BOX_FLAGS = ("--gpu-model", "RTX PRO 6000", "--gpu-count", "2")


def launch_cli(fake_python, tmp_path, env_extra, *extra_args, where=ONE_BOX_FLAGS):
    base = free_port_block(4)
    log = tmp_path / "events.jsonl"
    env = {**os.environ, "STANDIN_LOG": str(log), **env_extra}
    cmd = [sys.executable, "-m", "sglang_sm120.pd.cli", "pd", "launch", "--model-path", "/models/dsv4",
           *where, "--split", "1+1", "--model-weights-gib", "1",
           "--python", str(fake_python), "--http-port", str(base), "--bootstrap-port", str(base + 2),
           "--router-port", str(base + 3), "--health-timeout", "60", "--grace", "3", *extra_args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    return proc, lines, reader, log, base


def wait_for(lines, text, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line for line in list(lines)):
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not seen in:\n" + "".join(lines))


def test_cli_launch_starts_in_order_and_names_the_child_that_died(fake_python, tmp_path):
    proc, lines, reader, log, base = launch_cli(fake_python, tmp_path, {"STANDIN_HEALTH_DELAY": "0.5",
                                                                        "STANDIN_DIE": "decode-0:3:7"})
    try:
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    out = "".join(lines)
    assert code == 1, out
    assert "decode-0 (pid" in out and "exited with code 7; stopping the others" in out
    assert "all processes stopped; failed: decode-0" in out
    # each child's output is prefixed with its name
    assert f"[prefill-0] prefill-0: sglang.launch_server listening on 127.0.0.1:{base}" in out
    assert f"[decode-0] decode-0: sglang.launch_server listening on 127.0.0.1:{base + 1}" in out
    assert f"[router] router: sglang_router.launch_router listening on 127.0.0.1:{base + 3}" in out
    assert "[decode-0] decode-0: dying with code 7" in out
    # start order: both servers, then the router, which found them healthy
    starts = [e for e in events(log) if e["event"] == "start"]
    assert [e["name"] for e in starts][-1] == "router"
    assert {e["name"] for e in starts[:2]} == {"prefill-0", "decode-0"}
    router = starts[-1]
    assert router["servers_healthy_at_start"] is True
    assert router["urls"] == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
    assert out.index("prefill-0 is healthy") < out.index("started router")
    assert out.index("decode-0 is healthy") < out.index("started router")
    # the survivors were asked to stop, and nothing is left
    assert {e["name"] for e in events(log) if e["event"] == "term"} == {"prefill-0", "router"}
    assert_nothing_left(log)


def test_cli_launch_forwards_sigterm_and_leaves_no_orphans(fake_python, tmp_path):
    proc, lines, reader, log, _ = launch_cli(fake_python, tmp_path, {})
    try:
        wait_for(lines, "all processes are up")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    out = "".join(lines)
    assert code == 128 + signal.SIGTERM, out
    assert "received SIGTERM; forwarding it to every process" in out
    assert {e["name"] for e in events(log) if e["event"] == "term"} == {"prefill-0", "decode-0", "router"}
    assert_nothing_left(log)


def test_a_one_host_plan_is_reached_where_it_binds(fake_python, tmp_path):
    # the file names the host by an address that is not this machine's loopback (192.0.2.1, a documentation
    # address); the servers bound 127.0.0.1 while the health checks and the router went to 192.0.2.1
    topology = tmp_path / "box.json"
    topology.write_text(json.dumps({"hosts": [{"name": "box", "address": "192.0.2.1", "gpu_model": "RTX PRO 6000",
                                               "gpu_count": 2}]}))
    proc, lines, reader, log, base = launch_cli(fake_python, tmp_path, {}, "--health-timeout", "15",
                                                where=("--topology", str(topology)))
    try:
        wait_for(lines, "all processes are up", timeout=30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    reader.join(5)
    router = next(e for e in events(log) if e["event"] == "start" and e["name"] == "router")
    assert router["servers_healthy_at_start"] is True
    assert router["urls"] == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
    assert_nothing_left(log)


def test_launch_refuses_without_the_pd_packages(tmp_path):
    bare = tmp_path / "bare-python"
    # an interpreter that can import none of sglang / nixl / sglang_router
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    out = subprocess.run([sys.executable, "-m", "sglang_sm120.pd.cli", "pd", "launch", "--model-path", "/m",
                          "--gpu-model", "RTX PRO 6000", "--gpu-count", "2", "--model-weights-gib", "1",
                          "--python", str(bare)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "cannot import nixl, sglang, sglang_router" in out.stderr
    assert "pip install 'sglang-sm120[pd]'" in out.stderr


def standin(name, port, **env):
    return ProcessSpec(name, [sys.executable, str(STANDIN), "-m", "sglang.launch_server", "--port", str(port)],
                       {"SGLANG_SM120_PD_NAME": name, **env}, f"http://127.0.0.1:{port}/health")


def test_a_child_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path, monkeypatch):
    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    monkeypatch.setenv("STANDIN_IGNORE_TERM", "stubborn")
    monkeypatch.setenv("STANDIN_DIE", "quitter:1:0")
    port = free_port_block(2)
    out = io.StringIO()
    launcher = Launcher([standin("stubborn", port), standin("quitter", port + 1)], None, health_timeout_s=30,
                        grace_s=1.0, out=out)
    started = time.monotonic()
    code = launcher.run()
    text = out.getvalue()
    assert code == 1
    assert "quitter (pid" in text and "exited with code 0" in text
    assert "stubborn did not stop within 1 s; sending SIGKILL" in text
    assert time.monotonic() - started < 20
    assert_nothing_left(log)


def test_health_timeout_stops_everything(tmp_path, monkeypatch):
    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    monkeypatch.setenv("STANDIN_HEALTH_DELAY", "300")
    port = free_port_block(1)
    out = io.StringIO()
    code = Launcher([standin("slow", port)], standin("router", port + 1), health_timeout_s=1.5, grace_s=2,
                    out=out).run()
    text = out.getvalue()
    assert code == 1
    assert "slow not healthy after 1.5 s; stopping everything" in text
    assert "started router" not in text  # the router waits for the servers
    assert_nothing_left(log)


def test_a_command_that_cannot_start_is_reported(tmp_path):
    out = io.StringIO()
    code = Launcher([ProcessSpec("ghost", [str(tmp_path / "no-such-binary")])], None, out=out).run()
    assert code == 1 and "could not start ghost" in out.getvalue()


def test_an_unexpected_launcher_error_stops_every_child_before_it_propagates(tmp_path, monkeypatch):
    """A bug or an unforeseen exception inside the launcher (here: the health check) must not leave the servers
    it started running: every child is stopped, then the error propagates."""
    from sglang_sm120.pd import launcher as launcher_module

    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    port = free_port_block(2)

    def broken_health_check(url, timeout=2.0):
        deadline = time.monotonic() + 20  # once both stand-ins are up, so that there is something to leave behind
        while time.monotonic() < deadline and sum(e["event"] == "start" for e in events(log)) < 2:
            time.sleep(0.05)
        raise RuntimeError("unforeseen")

    monkeypatch.setattr(launcher_module, "_healthy", broken_health_check)
    out = io.StringIO()
    with pytest.raises(RuntimeError, match="unforeseen"):
        Launcher([standin("a", port), standin("b", port + 1)], None, health_timeout_s=30, grace_s=2, out=out).run()
    assert "launcher error (RuntimeError: unforeseen); stopping every process" in out.getvalue()
    assert_nothing_left(log)


def test_sighup_is_forwarded_like_sigterm():
    """The children run in their own sessions: a closing terminal (SIGHUP) reaches only the launcher, which must
    stop them as it does on SIGTERM."""
    launcher = Launcher([], None)
    previous = signal.getsignal(signal.SIGHUP)
    seen = {}

    def run_and_look():
        seen["handler"] = signal.getsignal(signal.SIGHUP)
        return 0

    launcher._run = run_and_look
    assert launcher.run() == 0
    assert seen["handler"] == launcher._on_signal and signal.getsignal(signal.SIGHUP) == previous


@pytest.mark.parametrize("bad", [dict(health_timeout_s=float("nan")), dict(grace_s=-1.0), dict(poll_s=float("inf"))])
def test_launcher_timings_must_be_finite_and_non_negative(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Launcher([], None, **bad)


def test_an_unusable_health_url_is_unhealthy_not_an_exception():
    from sglang_sm120.pd.launcher import _healthy

    assert _healthy("http://box a:30000/health") is False
    assert _healthy("http://[fd00::1:30000/health") is False
