"""Every diff in patches/ (the plugin's runtime hooks, for users who keep a patched SGLang fork)
is listed in the manifest and applies cleanly to the installed SGLang 0.5.23."""

import json
import pathlib
import shutil
import subprocess

import pytest
import sglang

from sglang_sm120.seams import SEAM_NAMES
from sglang_sm120.versions import SUPPORTED_SGLANG, installed_version

PATCHES = pathlib.Path(__file__).resolve().parents[2] / "patches"
MANIFEST = json.loads((PATCHES / "MANIFEST.json").read_text())
SITE_PACKAGES = pathlib.Path(sglang.__file__).resolve().parents[1]
ENTRIES = MANIFEST["patches"]


def test_manifest_matches_the_pinned_sglang():
    assert MANIFEST["sglang_version"] in SUPPORTED_SGLANG
    assert installed_version("sglang") == MANIFEST["sglang_version"]


def test_every_diff_is_in_the_manifest_and_vice_versa():
    on_disk = {p.name for p in PATCHES.glob("*.diff")}
    listed = {e["file"] for e in ENTRIES}
    assert on_disk == listed
    for entry in ENTRIES:
        assert entry["seam"] in SEAM_NAMES
        assert entry["targets"] and entry["description"]


def _touched_files(diff_text: str) -> list[str]:
    return [line[len("+++ b/"):].split("\t")[0] for line in diff_text.splitlines() if line.startswith("+++ b/")]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_patch_applies_cleanly(entry, tmp_path):
    diff = (PATCHES / entry["file"]).read_text()
    touched = _touched_files(diff)
    assert touched, "a patch must touch at least one file"
    for rel in touched:  # patch a copy: the installed SGLang stays as it is
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SITE_PACKAGES / rel, tmp_path / rel)
    proc = subprocess.run(["patch", f"-p{MANIFEST['strip']}", "--forward", "--batch", "-d", str(tmp_path), "-i",
                           str(PATCHES / entry["file"])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "offset" not in proc.stdout and "fuzz" not in proc.stdout, proc.stdout
    for rel in touched:
        if rel.endswith(".py"):
            compile((tmp_path / rel).read_text(), rel, "exec")


def test_every_seam_that_hooks_sglang_has_a_patch():
    """Fork users get the same change as plugin users: each seam with hook targets ships a diff."""
    from sglang_sm120.plugin import build_registry
    from sglang_sm120.seams import REGISTRY

    build_registry()
    hooking = {seam.name for seam in REGISTRY if seam.targets}
    assert hooking, "no seam declares hook targets"
    assert hooking <= {e["seam"] for e in ENTRIES}
