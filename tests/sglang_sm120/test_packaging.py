"""The wheel: kernels installed as sglang_sm120.kernels (never a top-level ``kernels``), the entry
point and console script declared, and the SGLang pin in step with sglang_sm120.versions."""

import pathlib
import subprocess
import sys
import tomllib
import zipfile

import pytest

from sglang_sm120.versions import SUPPORTED_SGLANG

REPO = pathlib.Path(__file__).resolve().parents[2]


def _pyproject():
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_sglang_pin_matches_supported_versions():
    deps = _pyproject()["project"]["dependencies"]
    assert f"sglang=={SUPPORTED_SGLANG[-1]}" in deps


def test_every_kernel_package_is_listed():
    """setuptools only installs listed packages: a new kernels/ subfolder must be added."""
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {"sglang_sm120.kernels" + (("." + ".".join(p.parent.relative_to(REPO / "kernels").parts))
                                          if p.parent != REPO / "kernels" else "")
               for p in (REPO / "kernels").rglob("__init__.py")}
    on_disk |= {"sglang_sm120" + (("." + ".".join(p.parent.relative_to(REPO / "sglang_sm120").parts))
                                  if p.parent != REPO / "sglang_sm120" else "")
                for p in (REPO / "sglang_sm120").rglob("__init__.py")}
    assert on_disk <= listed, f"packages missing from pyproject: {sorted(on_disk - listed)}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(REPO)], check=True,
                   capture_output=True, timeout=900)
    (path,) = out.glob("sglang_sm120-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_contains_kernels_under_the_package(wheel):
    names = set(wheel.namelist())
    for source in (REPO / "kernels").rglob("*.py"):
        installed = "sglang_sm120/kernels/" + source.relative_to(REPO / "kernels").as_posix()
        assert installed in names, f"{installed} missing from the wheel"
    assert not any(n.startswith("kernels/") for n in names), "a top-level kernels package would clash with SGLang's"


def test_wheel_declares_entry_point_and_script(wheel):
    (ep_file,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(ep_file).decode()
    assert "[sglang.srt.plugins]\nsm120 = sglang_sm120.plugin:register" in text
    assert "sglang-sm120 = sglang_sm120.cli:main" in text
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    assert f"Requires-Dist: sglang=={SUPPORTED_SGLANG[-1]}" in wheel.read(meta).decode()
