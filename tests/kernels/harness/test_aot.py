"""The AOT harness itself: it must see the opcodes, shared memory and spills it claims to see."""

import pathlib

import pytest

from sglang_sm120.kernels.dsv4 import SM120_SMEM_LIMIT
from sglang_sm120.kernels.harness.aot import ISOLATED_ENV_DROP, run_isolated


@pytest.fixture(scope="module")
def reports():
    return {(r.config, r.arch): (r, p) for r, p in run_isolated(["harness.selftest_kernels"])}


@pytest.mark.parametrize("arch", [120, 121])
def test_bf16_dot_uses_hmma(reports, arch):
    report, problems = reports[("selftest/bf16_dot", arch)]
    assert report.ok, report.error
    assert problems == []
    assert report.ptx_target == f"sm_{arch}a"
    assert report.count("HMMA.16816.F32.BF16") > 0
    assert report.registers > 0 and report.spill_store_bytes == 0
    assert report.wide_loads > 0  # 16-byte-aligned pointers give 128-bit loads


def test_unit_scaled_fp8_uses_block_scaled_qmma(reports):
    report, problems = reports[("selftest/fp8_unit_scaled", 120)]
    assert problems == [] and report.count("QMMA.SF") > 0


def test_missing_opcode_is_reported(reports):
    _report, problems = reports[("selftest/expects_missing_omma", 120)]
    assert any("OMMA" in p for p in problems)


def test_shared_memory_over_limit_is_reported(reports):
    report, problems = reports[("selftest/smem_over_limit", 120)]
    assert report.ok and report.shared_bytes > SM120_SMEM_LIMIT
    assert any("shared memory" in p for p in problems)


def test_compile_failure_is_a_report_not_an_exception(reports):
    report, problems = reports[("selftest/bad_signature", 120)]
    assert not report.ok and "signature lacks" in report.error
    assert problems and problems[0].startswith("compile failed")


@pytest.mark.parametrize("workers", [1, 3])
def test_configs_dealt_to_workers_all_come_back_once(reports, workers):
    """However many child processes share the compiles, each (config, arch) is reported exactly once, alike."""
    rows = run_isolated(["harness.selftest_kernels"], workers=workers)
    keys = [(r.config, r.arch) for r, _p in rows]
    assert len(keys) == len(set(keys)) and set(keys) == set(reports)
    for r, p in rows:
        assert p == reports[(r.config, r.arch)][1] and r.ok == reports[(r.config, r.arch)][0].ok


def test_children_ignore_ptxas_redirects_of_the_caller(reports, monkeypatch, tmp_path):
    """Importing SGLang (as the seam tests do) lets FlashInfer point TRITON_PTXAS_BLACKWELL_PATH at a system ptxas;
    the AOT children must not inherit that (nor TRITON_PTXAS_PATH). Both point here at a working ptxas wrapper that
    leaves a mark when run: the children never run it, and their reports are those of Triton's bundled ptxas."""
    import triton.backends.nvidia

    bundled = pathlib.Path(triton.backends.nvidia.__file__).parent / "bin"
    mark = tmp_path / "wrapper-ran"
    for name in ("ptxas", "ptxas-blackwell"):
        wrapper = tmp_path / name
        wrapper.write_text(f"#!/bin/sh\ntouch {mark}\nexec {bundled / name} \"$@\"\n")
        wrapper.chmod(0o755)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(tmp_path / "ptxas"))
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(tmp_path / "ptxas-blackwell"))
    rows = run_isolated(["harness.selftest_kernels"], archs=[120], only=["bf16_dot"])
    assert rows and not mark.exists()
    for report, problems in rows:
        expected_report, expected_problems = reports[(report.config, report.arch)]
        assert report.ok and problems == expected_problems
        assert (report.registers, report.opcodes) == (expected_report.registers, expected_report.opcodes)
