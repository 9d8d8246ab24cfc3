"""Both products of the sparse MLA decode kernel run on tensor cores on sm_120a: the registry
test only asks for *an* HMMA, this one counts enough for QK and PV of every tile."""

import pytest

from sglang_sm120.kernels import sparse_mla_decode as smd
from sglang_sm120.kernels.harness.aot import run_isolated

DECODE = {c.name: c for c in smd.aot_configs() if c.kernel is smd.sparse_mla_decode_kernel}


@pytest.fixture(scope="module")
def reports():
    """The decode configs compiled once for sm_120a, in a child process with the interpreter off."""
    return {r.config: (r, p) for r, p in run_isolated(["sparse_mla_decode"], archs=[120], only=["sparse_mla_decode_h"])}


@pytest.mark.parametrize("name", sorted(DECODE))
def test_qk_and_pv_both_use_hmma(reports, name):
    cfg = DECODE[name]
    report, problems = reports[name]
    assert problems == [], report.summary()
    bh, bn = cfg.constexprs["BLOCK_H"], cfg.constexprs["BLOCK_N"]
    # m16n8k16 instructions per warp for one product of one tile; a product left on CUDA cores
    # would leave fewer than two products' worth
    per_product = bh * bn * smd.HEAD_DIM // (16 * 8 * 16) // cfg.num_warps
    assert report.count("HMMA.16816.F32.BF16") >= 2 * per_product, report.summary()
    assert report.count("LDL") == 0 and report.count("STL") == 0  # no local-memory spills
