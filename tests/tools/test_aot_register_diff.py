"""tools/aot_register_diff.py: its plumbing (a worktree of the other commit, one process per tree, the report) on a
filter that matches no config, so nothing compiles; and its refusal of arches the kernels cannot target."""

import os
import subprocess
import sys

import pytest

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "aot_register_diff.py")
REPO = os.path.join(os.path.dirname(__file__), "..", "..")


def _git_checkout():
    return subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _git_checkout(), reason="needs the git checkout the tool compares against")
def test_reports_no_difference_on_an_empty_selection_and_leaves_no_worktree():
    before = subprocess.run(["git", "-C", REPO, "worktree", "list"], capture_output=True, text=True).stdout
    out = subprocess.run([sys.executable, TOOL, "--before", "HEAD", "--only", "no-config-is-named-this"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "0 of 0 (config, arch) pairs differ" in out.stdout
    after = subprocess.run(["git", "-C", REPO, "worktree", "list"], capture_output=True, text=True).stdout
    assert after == before


def test_refuses_an_arch_below_90():
    out = subprocess.run([sys.executable, TOOL, "--before", "HEAD", "--arch", "80"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 2 and "--arch" in out.stderr
