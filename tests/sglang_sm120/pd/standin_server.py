"""A stand-in for ``python -m sglang.launch_server`` / ``python -m sglang_router.launch_router`` in the
launcher tests: serves ``/health`` on ``--host`` (default 127.0.0.1) ``--port`` as SGLang would, starts a grandchild process in its
own process group (to prove the launcher leaves no orphans), and records what happens as JSON lines
in ``$STANDIN_LOG``. Its name comes from ``SGLANG_SM120_PD_NAME`` (set by the planner).

Behaviour switches (environment):
- ``STANDIN_HEALTH_DELAY``: seconds before /health answers 200 (503 until then);
- ``STANDIN_DIE=name:after_s:code``: that process exits with ``code`` ``after_s`` seconds after start;
- ``STANDIN_IGNORE_TERM=name``: that process ignores SIGTERM (the launcher must SIGKILL it).
``-c CODE ...`` runs CODE like a Python interpreter would (the launcher's install check).
"""

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

NAME = os.environ.get("SGLANG_SM120_PD_NAME", "?")
LOG = os.environ.get("STANDIN_LOG")
STARTED = time.monotonic()


def record(event, **extra):
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"name": NAME, "event": event, "pid": os.getpid(), "t": time.time(), **extra}) + "\n")


def arg(argv, flag, default=None):
    return argv[argv.index(flag) + 1] if flag in argv else default


def healthy(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except Exception:
        return False


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready = time.monotonic() - STARTED >= float(os.environ.get("STANDIN_HEALTH_DELAY", "0"))
        self.send_response(200 if self.path == "/health" and ready else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


def main(argv):
    if argv[:1] == ["-c"]:
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        return 0
    module = arg(argv, "-m")
    host, port = arg(argv, "--host", "127.0.0.1"), int(arg(argv, "--port"))
    extra = {}
    if module == "sglang_router.launch_router":
        urls = [argv[i + 1] for i, a in enumerate(argv) if a in ("--prefill", "--decode")]
        extra["servers_healthy_at_start"] = all(healthy(u + "/health") for u in urls)
        extra["urls"] = urls
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    record("start", module=module, port=port, grandchild=grandchild.pid, **extra)

    def on_term(signum, frame):
        record("term", signal=signum)
        print(f"{NAME}: got signal {signum}, exiting", flush=True)
        grandchild.terminate()
        os._exit(0)

    if os.environ.get("STANDIN_IGNORE_TERM") == NAME:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
    server = http.server.ThreadingHTTPServer((host, port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"{NAME}: {module} listening on {host}:{port}", flush=True)
    die = os.environ.get("STANDIN_DIE", "")
    if die.startswith(NAME + ":"):
        _, after, code = die.split(":")
        time.sleep(float(after))
        print(f"{NAME}: dying with code {code}", flush=True)
        record("die", code=int(code))
        os._exit(int(code))
    while True:
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
