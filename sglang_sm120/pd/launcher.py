"""Run a PD plan's processes on this host: servers first, router once every server is healthy.

- Each child runs in its own session/process group, so teardown reaches the processes SGLang
  spawns under it (schedulers, detokenizer) and nothing is orphaned.
- Every output line is streamed with a ``[name]`` prefix.
- Health: ``GET <url>/health`` must answer 200 within ``health_timeout_s``.
- SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to every child group; after ``grace_s`` the
  stragglers get SIGKILL. The launcher then exits 128+signal. An unexpected error in the launcher itself
  stops every child the same way before it propagates.
- If any child exits, the others are stopped the same way and the launcher exits 1 with a line
  naming the one that died and its exit status.
"""

from __future__ import annotations

import dataclasses
import http.client
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


@dataclasses.dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    health_url: str | None = None


class _Child:
    def __init__(self, spec: ProcessSpec, proc: subprocess.Popen, pump: threading.Thread):
        self.spec, self.proc, self.pump = spec, proc, pump

    @property
    def name(self) -> str:
        return self.spec.name


def _healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, http.client.HTTPException, ValueError):
        return False  # ValueError / InvalidURL: an address urllib cannot use is never healthy (the timeout says so)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Launcher:
    def __init__(self, servers: list[ProcessSpec], router: ProcessSpec | None = None, *,
                 health_timeout_s: float = 1800.0, grace_s: float = 15.0, poll_s: float = 0.25, out=None):
        self.servers, self.router = list(servers), router
        for name, value in (("health_timeout_s", health_timeout_s), ("grace_s", grace_s), ("poll_s", poll_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        self.health_timeout_s, self.grace_s, self.poll_s = health_timeout_s, grace_s, poll_s
        self.out = out or sys.stdout
        self.children: list[_Child] = []
        self._lock = threading.Lock()
        self._signal: int | None = None

    # --- output ---------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        with self._lock:
            self.out.write(f"[pd launch] {line}\n")
            self.out.flush()

    def _pump(self, name: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._lock:
                self.out.write(f"[{name}] {line}\n")
                self.out.flush()
        stream.close()

    # --- process control ------------------------------------------------------------------------
    def _start(self, spec: ProcessSpec) -> _Child:
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(spec.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        pump = threading.Thread(target=self._pump, args=(spec.name, proc.stdout), daemon=True)
        pump.start()
        child = _Child(spec, proc, pump)
        self.children.append(child)
        self.say(f"started {spec.name} (pid {proc.pid})")
        return child

    def _signal_group(self, child: _Child, sig: int) -> None:
        try:
            os.killpg(child.proc.pid, sig)  # the group outlives its leader while members remain
        except (ProcessLookupError, PermissionError):
            pass

    def _group_alive(self, child: _Child) -> bool:
        try:
            os.killpg(child.proc.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def teardown(self, sig: int = signal.SIGTERM) -> None:
        """Signal every child group (router first, servers in reverse start order), wait
        ``grace_s``, SIGKILL what is left, reap everything."""
        for child in reversed(self.children):
            self._signal_group(child, sig)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(self._group_alive(c) for c in self.children):
            for c in self.children:
                c.proc.poll()
            time.sleep(0.05)
        for child in self.children:
            if self._group_alive(child):
                self.say(f"{child.name} did not stop within {self.grace_s:g} s; sending SIGKILL")
                self._signal_group(child, signal.SIGKILL)
        for child in self.children:
            try:
                child.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            child.pump.join(timeout=5)

    def _on_signal(self, signum, _frame) -> None:
        self._signal = signum

    def _dead_child(self) -> _Child | None:
        for child in self.children:
            if child.proc.poll() is not None:
                return child
        return None

    def _wait_healthy(self, specs: list[ProcessSpec]) -> str | None:
        """None once every spec's health URL answers 200; otherwise why not."""
        pending = [s for s in specs if s.health_url]
        announced: set[str] = set()
        deadline = time.monotonic() + self.health_timeout_s
        while pending:
            if self._signal is not None:
                return "signal"
            dead = self._dead_child()
            if dead is not None:
                return "dead"
            pending = [s for s in pending if not _healthy(s.health_url)]
            for s in specs:
                if s.health_url and s not in pending and s.name not in announced:
                    self.say(f"{s.name} is healthy ({s.health_url})")
                    announced.add(s.name)
            if not pending:
                break
            if time.monotonic() > deadline:
                return f"{', '.join(s.name for s in pending)} not healthy after {self.health_timeout_s:g} s"
            time.sleep(self.poll_s)
        return None

    # --- the run --------------------------------------------------------------------------------
    def run(self) -> int:
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            # SIGHUP too: the children run in their own sessions, so a closing terminal reaches only the launcher
            for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
                if sig is not None:
                    handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            return self._run()
        except BaseException as exc:  # a bug or an unexpected error here must not leave the servers running
            self.say(f"launcher error ({type(exc).__name__}: {exc}); stopping every process")
            self.teardown(signal.SIGTERM)
            raise
        finally:
            for sig, old in handlers.items():
                signal.signal(sig, old)

    def _finish_on_problem(self, problem: str) -> int:
        if problem == "signal":
            name = signal.Signals(self._signal).name
            self.say(f"received {name}; forwarding it to every process")
            self.teardown(self._signal)
            self.say("all processes stopped")
            return 128 + self._signal
        if problem == "dead":
            dead = self._dead_child()
            self.say(f"{dead.name} (pid {dead.proc.pid}) {_describe_exit(dead.proc.returncode)}; stopping the others")
            self.teardown(signal.SIGTERM)
            self.say(f"all processes stopped; failed: {dead.name}")
            return 1
        self.say(problem + "; stopping everything")
        self.teardown(signal.SIGTERM)
        return 1

    def _run(self) -> int:
        try:
            for spec in self.servers:
                self._start(spec)
        except OSError as exc:
            self.say(f"could not start {spec.name}: {exc}")
            self.teardown()
            return 1
        problem = self._wait_healthy(self.servers)
        if problem:
            return self._finish_on_problem(problem)
        if self.router is not None:
            try:
                self._start(self.router)
            except OSError as exc:
                self.say(f"could not start {self.router.name}: {exc}")
                self.teardown()
                return 1
            problem = self._wait_healthy([self.router])
            if problem:
                return self._finish_on_problem(problem)
        self.say("all processes are up" + (f"; send requests to {self.router.health_url.rsplit('/', 1)[0]}"
                                           if self.router and self.router.health_url else ""))
        while True:
            if self._signal is not None:
                return self._finish_on_problem("signal")
            if self._dead_child() is not None:
                return self._finish_on_problem("dead")
            time.sleep(self.poll_s)


def launch(servers: list[ProcessSpec], router: ProcessSpec | None = None, **kwargs) -> int:
    return Launcher(servers, router, **kwargs).run()
