"""Make ``sglang_sm120.kernels`` importable from a plain checkout (the device machine, where the
package is not pip-installed and SGLang is absent): the repo's ``kernels/`` folder is mapped to
``sglang_sm120.kernels`` exactly as the wheel installs it, never as a top-level ``kernels``."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

REPO = pathlib.Path(__file__).resolve().parent.parent


def ensure_kernels_importable() -> None:
    # already mapped by an earlier call (a tool importing another tool): the stub package has no __spec__
    if "sglang_sm120.kernels" in sys.modules or importlib.util.find_spec("sglang_sm120") is not None:
        return
    map_kernels(REPO)


def map_kernels(repo: pathlib.Path) -> None:
    """``repo``'s ``kernels/`` as ``sglang_sm120.kernels`` in this process, whatever is installed (a tool comparing
    another checkout's kernels, ``tools/aot_register_diff.py``, maps that checkout)."""
    package = types.ModuleType("sglang_sm120")
    package.__path__ = [str(repo / "sglang_sm120")]
    sys.modules["sglang_sm120"] = package
    spec = importlib.util.spec_from_file_location("sglang_sm120.kernels", repo / "kernels" / "__init__.py",
                                                  submodule_search_locations=[str(repo / "kernels")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["sglang_sm120.kernels"] = module
    spec.loader.exec_module(module)
    package.kernels = module
    if str(REPO / "tools") not in sys.path:
        sys.path.insert(0, str(REPO / "tools"))
