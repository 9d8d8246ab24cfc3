"""``register()`` against the real installed SGLang 0.5.23, each case in a fresh process (as SGLang
runs it in each of its processes)."""

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

from sglang_sm120.seams import SEAM_NAMES


def run_in_fresh_process(code: str, **env) -> dict:
    """Run ``code`` in a new interpreter, then print the plugin's status as one JSON line."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SM120_")}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code) + STATUS], capture_output=True, text=True,
                          env=full_env, timeout=600, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "_stderr": proc.stderr}


STATUS = """
import json
from sglang_sm120.seams import REGISTRY
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES
import sglang_sm120.plugin as plugin
print(json.dumps({"registered": plugin._registered, "refused": plugin.refused_reason,
                  "seams": {s.name: [s.state.value if s.state else None, s.reason] for s in REGISTRY},
                  "hooked": sorted(HookRegistry._patched),
                  "moe_choice": "sm120" in MOE_RUNNER_BACKEND_CHOICES}))
"""


def test_entry_point_is_declared():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="sglang.srt.plugins")}
    assert eps.get("sm120") == "sglang_sm120.plugin:register"


def test_load_plugins_runs_register():
    out = run_in_fresh_process("from sglang.srt.plugins import load_plugins\nload_plugins()\n")
    assert out["registered"] and out["refused"] is None
    assert set(out["seams"]) == set(SEAM_NAMES)
    assert out["moe_choice"]


def test_cpu_machine_leaves_every_seam_inactive_and_logs_status_once():
    out = run_in_fresh_process("""
        import logging, sglang_sm120.plugin as p
        logging.basicConfig(level=logging.INFO)
        p.register(); p.register()
    """)
    for name, (state, reason) in out["seams"].items():
        assert state == "not applicable", (name, state, reason)
        assert "no CUDA device" in reason
    assert out["_stderr"].count("sglang-sm120 seams") == 1


# The disagg seam applies only inside a PD server started from a `sglang-sm120 pd` plan.
KERNEL_SEAMS = tuple(n for n in SEAM_NAMES if n != "disagg")


def test_force_activates_every_kernel_seam_on_cpu():
    out = run_in_fresh_process("import sglang_sm120.plugin as p\np.register()\n", SGLANG_SM120_FORCE="1")
    for name in KERNEL_SEAMS:
        state, reason = out["seams"][name]
        assert state == "active", (name, state, reason)
        assert "SGLANG_SM120_FORCE=1" in reason
    state, reason = out["seams"]["disagg"]
    assert state == "not applicable" and "SGLANG_SM120_PD_ROLE" in reason
    assert out["moe_choice"]


@pytest.mark.parametrize("disable", ["attention", "moe,indexer", "all"])
def test_kill_switch(disable):
    out = run_in_fresh_process("import sglang_sm120.plugin as p\np.register()\n", SGLANG_SM120_FORCE="1",
                               SGLANG_SM120_DISABLE=disable)
    off = set(SEAM_NAMES) if disable == "all" else set(disable.split(","))
    for name, (state, _reason) in out["seams"].items():
        expected = "disabled by env" if name in off else ("active" if name in KERNEL_SEAMS else "not applicable")
        assert state == expected, name


def test_register_is_idempotent():
    out = run_in_fresh_process("""
        import sglang_sm120.plugin as p
        from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES
        p.register(); p.register()
        assert MOE_RUNNER_BACKEND_CHOICES.count("sm120") == 1
    """, SGLANG_SM120_FORCE="1")
    assert out["registered"]


def test_unsupported_sglang_version_leaves_sglang_untouched():
    out = run_in_fresh_process("""
        import logging, sglang_sm120.versions as v, sglang_sm120.plugin as p
        logging.basicConfig(level=logging.INFO)
        p.installed_version = lambda dist: "0.5.22" if dist == "sglang" else v.installed_version(dist)
        p.register()
    """, SGLANG_SM120_FORCE="1")
    assert "0.5.22 is not supported" in out["refused"]
    assert out["seams"] == {} and out["hooked"] == [] and not out["moe_choice"]
    assert out["_stderr"].count("not hooking SGLang") == 1


def test_register_never_raises_into_sglang():
    out = run_in_fresh_process("""
        import sglang_sm120.plugin as p
        def explode():
            raise RuntimeError("boom")
        p.build_registry = explode
        p.register()
    """, SGLANG_SM120_FORCE="1")
    assert out["registered"]
    assert "register() failed" in out["_stderr"]
