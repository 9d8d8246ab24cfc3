"""Bring upstream SGLang 0.5.23 code to the device machine, where SGLang itself cannot be installed.

The lent H200 runs torch 2.11 while SGLang 0.5.23 pins torch 2.14.1, so device scripts cannot import
``sglang``. Instead, on this machine (where the test environment has SGLang installed), each device
script's ``--prepare`` step calls :func:`copy_module` / :func:`extract_functions` to write the
upstream pieces it times as baselines into ``.upstream/`` (git-ignored, sent with ``carry``). The
upstream code is never committed; it is read from the installed wheel each time.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
UPSTREAM_DIR = REPO / ".upstream"
HEADER = "# Extracted from the installed sglang 0.5.23 wheel by tools/upstream.py; not part of sglang-sm120.\n"


def sglang_root() -> pathlib.Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed here; run this in the test environment (tools/dev.sh test)")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def copy_module(relpath: str, out_name: str) -> pathlib.Path:
    """Copy one self-contained upstream file (``relpath`` under the ``sglang`` package) verbatim."""
    src = sglang_root() / relpath
    UPSTREAM_DIR.mkdir(exist_ok=True)
    dst = UPSTREAM_DIR / out_name
    dst.write_text(HEADER + src.read_text())
    return dst


def extract_functions(relpath: str, names: set[str], constants: set[str] = frozenset(),
                      preamble: str = "", out_name: str = "") -> pathlib.Path:
    """Write the named top-level functions and constant assignments of an upstream file to
    ``.upstream/<out_name>``, after ``preamble`` (the imports they need)."""
    text = (sglang_root() / relpath).read_text()
    tree = ast.parse(text)
    parts, found = [HEADER, preamble], set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) in constants for t in node.targets):
            parts.append(ast.get_source_segment(text, node))
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) in constants:
            parts.append(ast.get_source_segment(text, node))
            found.add(node.target.id)
        elif isinstance(node, ast.FunctionDef) and node.name in names:
            parts.append(ast.get_source_segment(text, node))
            found.add(node.name)
    missing = (set(names) | set(constants)) - found
    if missing:
        raise SystemExit(f"{relpath}: upstream no longer defines {sorted(missing)}")
    UPSTREAM_DIR.mkdir(exist_ok=True)
    dst = UPSTREAM_DIR / (out_name or pathlib.Path(relpath).name)
    dst.write_text("\n\n".join(parts) + "\n")
    return dst


def load(out_name: str):
    """Import a file previously written to ``.upstream/`` (on the device machine)."""
    path = UPSTREAM_DIR / out_name
    if not path.exists():
        raise SystemExit(f"{path} is missing: run the device script's --prepare here and carry .upstream")
    spec = importlib.util.spec_from_file_location(f"upstream_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
