"""The one-chunk rows form of the block-FP8 GEMV (``GemvConfig(one_chunk=True)``: a program's whole K split is one
chunk whose weight and scales are loaded before the PDL wait) against the float32 reference under the CPU interpreter
at reduced shapes: 1..2-row tiles over 1..5 rows, ragged N and K, split-K with one chunk per split, grouped wo_a with
and without the fused inverse RoPE; outputs poisoned before every call, each call twice (split-K counters reset).
Also the rule that picks it (default_config / wo_a_config, H200 runs 18 / 18b) and its AOT registration."""

import dataclasses

import pytest
import torch

from sglang_sm120.kernels import fp8_gemv as g

from ..conftest import DEVICE
from .test_fp8_gemv import OUTPUT_TOL, check_ragged_grouped_wo_a, poisoned, random_weight, rel_err


def one_chunk(block_m, block_n, k_blocks, split=1, warps=4, pdl=True):
    return g.GemvConfig(block_m, block_n, split, False, num_warps=warps, k_unroll=k_blocks, rows_form=True,
                        prefetch=True, one_chunk=True, pdl=pdl)


# (config, N, K): the whole K one chunk (no split: K rounded up to a power-of-two number of blocks, the tail masked);
# one chunk per split (split 2 / 3 of 8 blocks: the last split of 3 is short, so its chunk is masked); the chunk too
# short for the split (k_unroll < the split's blocks: the prefetching loop runs, one_chunk does not apply)
CASES = [(one_chunk(1, 8, 8, warps=8), 160, 1024), (one_chunk(1, 4, 8, warps=8), 150, 1024),  # 4 columns: wqkv_a
         (one_chunk(1, 8, 8), 136, 1024),  # 8 columns on 4 warps: [8192, 1024] with X_FIRST
         (one_chunk(1, 16, 2), 200, 200), (one_chunk(2, 16, 4), 96, 512),
         (one_chunk(1, 32, 4, split=2), 160, 1024), (one_chunk(2, 16, 4, split=2, pdl=False), 160, 1024),
         (one_chunk(1, 16, 4, split=3), 72, 1024), (one_chunk(1, 16, 2, split=2), 160, 1024)]


@pytest.mark.parametrize("cfg,n,k", CASES, ids=lambda v: v.name if isinstance(v, g.GemvConfig) else str(v))
@pytest.mark.parametrize("m", [1, 2, 5])
def test_one_chunk_forms_match_reference(cfg, n, k, m):
    gen = torch.Generator().manual_seed(17 * m + n + k + cfg.split_k)
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    ref = g.reference_block_fp8_linear(x, w, s)
    for _ in range(2):
        out = poisoned((m, n))
        y = g.block_fp8_linear(x, w, s, out=out, config=cfg)
        assert y is out and torch.isfinite(y).all()
        assert rel_err(y, ref) < OUTPUT_TOL


class _RowsLaunches:
    """Stands in for the rows kernel's ``[grid]`` and records each launch's X_FIRST, then runs the real launch."""

    def __init__(self, kernel):
        self.kernel, self.x_first = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.x_first.append(kw["X_FIRST"])
            return self.kernel[grid](*args, **kw)
        return launch


@pytest.mark.parametrize("cfg,n,k", CASES, ids=lambda v: v.name if isinstance(v, g.GemvConfig) else str(v))
@pytest.mark.parametrize("m", [1, 3])
def test_activation_first_same_bits(monkeypatch, cfg, n, k, m):
    """ONE_CHUNK_X_FIRST: one-row one-chunk launches (and only they) load the activation before converting the
    weight; the sums are the same operations, so the output is the same bit for bit with the order before."""
    gen = torch.Generator().manual_seed(3 * m + n + k + cfg.split_k)
    w, s = random_weight(n, k, gen=gen)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    launches = _RowsLaunches(g._block_fp8_gemv_rows_kernel)
    monkeypatch.setattr(g, "_block_fp8_gemv_rows_kernel", launches)
    outs = {}
    for x_first in (True, False):
        monkeypatch.setattr(g, "ONE_CHUNK_X_FIRST", x_first)
        outs[x_first] = g.block_fp8_linear(x, w, s, out=poisoned((m, n)), config=cfg)
    one_chunk_launch = cfg.split_k * cfg.k_unroll >= (k + g.FP8_BLOCK - 1) // g.FP8_BLOCK  # each split one chunk
    assert launches.x_first == [cfg.block_m == 1 and one_chunk_launch, False]
    assert torch.equal(outs[True], outs[False])
    assert rel_err(outs[True], g.reference_block_fp8_linear(x, w, s)) < OUTPUT_TOL


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("cfg", [one_chunk(1, 16, 4), one_chunk(2, 8, 4, warps=8)], ids=lambda c: c.name)
def test_wo_a_one_chunk(cfg, rope):
    check_ragged_grouped_wo_a(cfg, rope, seed=5 + rope, groups=2)


def test_one_chunk_rule(monkeypatch):
    """Runs 18 / 18b: weights of at most 8 MiB at 1 row and (layer variants run 56) at most 4 MiB at 2 rows take the
    one-chunk form (tile by K), except [8192, 1024] at 1 row without X_FIRST (the two-chunk one-shot rows form stays)
    and wo_a with the fused RoPE at 8 MiB (T=4); USE_ONE_CHUNK = False restores the forms before."""
    expected = {(1536, 4096): (8, 8), (4096, 2048): (8, 4), (4096, 1024): (16, 4), (512, 4096): (8, 8),
                (2048, 4096): (8, 8), (4096, 512): (32, 4), (4096, 256): (32, 4)}
    for (n, k), (block_n, warps) in expected.items():
        for m in (1, 2):
            # wqkv_a at 1 row: ONE_CHUNK_ONE_ROW_TILES (layer variants run 8)
            tile = (4, 8) if m == 1 and (n, k) == (1536, 4096) else (block_n, warps)
            cfg = g.default_config(m, n, k)
            if m == 2 and n * k > g.ONE_CHUNK_TWO_ROWS_MAX_WEIGHT_BYTES:
                assert not cfg.one_chunk and cfg == g.pick_default_config(
                    2, n, k, 1, g.sm_count(), g.rules()._replace(one_chunk=False)), (n, k)
                continue
            pdl = not (m == 1 and (n, k) in g.ONE_ROW_WITHOUT_PDL)  # the shared expert's down at T=4, 1 row
            assert cfg == one_chunk(m, tile[0], k // 128, warps=tile[1], pdl=pdl), (n, k, m)
    assert g.ONE_CHUNK_TWO_ROWS_MAX_WEIGHT_BYTES == 4 << 20
    assert not g.default_config(2, 8192, 1024).one_chunk  # 8 MiB: over the 2-row limit
    # [8192, 1024] at 1 row: one chunk on 8 columns / 4 warps with X_FIRST (variants run 35), two chunks without it
    assert g.default_config(1, 8192, 1024) == one_chunk(1, 8, 8)
    monkeypatch.setattr(g, "ONE_CHUNK_X_FIRST", False)
    two_chunks = g.default_config(1, 8192, 1024)
    assert two_chunks.rows_form and two_chunks.k_unroll == 4 and not two_chunks.one_chunk
    monkeypatch.setattr(g, "ONE_CHUNK_X_FIRST", True)
    assert g.default_config(1, 1024, 4096, groups=2).one_chunk  # wo_a T=4: 8 MiB over its groups, 1 row
    assert not g.default_config(2, 1024, 4096, groups=2).one_chunk  # ... 2 rows: over the 2-row limit
    for m in (1, 2):
        assert not g.wo_a_config(m, 1024, 4096, 2, fused_rope=True).one_chunk  # never with the fused RoPE at 8 MiB
        assert g.wo_a_config(m, 1024, 4096, 2, fused_rope=False).one_chunk == (m == 1)
        assert g.wo_a_config(m, 1024, 4096, 1, fused_rope=True) == one_chunk(m, 8, 32, warps=8)  # T=8, 4 MiB
    for m, n, k, groups in ((3, 1536, 4096, 1), (1, 4096, 4096, 1), (1, 1024, 4096, 8), (2, 16384, 1024, 1),
                            (1, 1024, 4096, 4)):
        assert not g.default_config(m, n, k, groups).one_chunk, (m, n, k, groups)
    assert not g.default_config(1, 1536, 3968).one_chunk  # 31 K blocks: no power-of-two chunk
    seam_t4 = [g.wo_a_config(m, 1024, 4096, 2, fused_rope=True) for m in (1, 2)]
    monkeypatch.setattr(g, "USE_ONE_CHUNK", False)
    assert not g.default_config(1, 1536, 4096).one_chunk
    assert seam_t4 == [g.wo_a_config(m, 1024, 4096, 2, fused_rope=True) for m in (1, 2)]  # as before the rule


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_two_row_weight_limit(monkeypatch, tp):
    """Layer variants run 56: at 2 rows every DSv4 linear of at most ONE_CHUNK_TWO_ROWS_MAX_WEIGHT_BYTES (4 MiB, over
    wo_a's groups) takes the one-chunk form and every larger one the form without it; at 1 row the 8 MiB limit stays;
    setting the limit to 8 MiB (caches cleared) gives the one-chunk form to every weight of at most 8 MiB again."""
    from sglang_sm120.kernels import dsv4

    def forms():
        out = {}
        for name, (n, k) in dsv4.dense_linear_shapes(tp).items():
            groups = dsv4.O_GROUPS // tp if name == "wo_a" else 1
            rows = dsv4.O_LORA_RANK if name == "wo_a" else n
            out[name] = (groups * rows * k, g.default_config(2, rows, k, groups), g.default_config(1, rows, k, groups))
        return out

    for name, (weight, two_rows, one_row) in forms().items():
        assert two_rows.one_chunk == (weight <= 4 << 20), (name, weight, two_rows.name)
        if weight <= 8 << 20:
            assert one_row.one_chunk, (name, one_row.name)
    monkeypatch.setattr(g, "ONE_CHUNK_TWO_ROWS_MAX_WEIGHT_BYTES", 8 << 20)
    g.clear_caches()
    try:
        for name, (weight, two_rows, _) in forms().items():
            assert two_rows.one_chunk == (weight <= 8 << 20), (name, weight, two_rows.name)
    finally:
        monkeypatch.undo()
        g.clear_caches()


def test_one_row_without_pdl(monkeypatch):
    """ONE_ROW_WITHOUT_PDL (variants run 40): the shared expert's down at T=4 ([4096, 512]) at 1 row launches its
    one-chunk form without PDL; 2 rows, grouped calls and every other DSv4 shape keep PDL; the form computes the
    reference and is in the AOT registry; without the one-chunk rule the form before stays as it was."""
    from sglang_sm120.kernels import dsv4

    n, k = dsv4.dense_linear_shapes(4)["shared_down"]
    assert g.ONE_ROW_WITHOUT_PDL == {(n, k)}
    cfg = g.default_config(1, n, k)
    assert cfg == one_chunk(1, 32, k // 128, pdl=False) and cfg in {c for c, _ in g.SHIPPED_FORMS}
    assert g.default_config(2, n, k).pdl and g.default_config(1, n, k, groups=2).pdl
    for tp in dsv4.SUPPORTED_TP:
        for name, (rows, cols) in dsv4.dense_linear_shapes(tp).items():
            if name != "wo_a" and (rows, cols) != (n, k):
                assert g.default_config(1, rows, cols).pdl, (tp, name)
    gen = torch.Generator().manual_seed(40)
    small_n, small_k = 96, 512  # the same form at a reduced N
    w, s = random_weight(small_n, small_k, gen=gen)
    x = torch.randn(1, small_k, generator=gen).to(torch.bfloat16).to(DEVICE)
    y = g.block_fp8_linear(x, w, s, out=poisoned((1, small_n)), config=cfg)
    assert rel_err(y, g.reference_block_fp8_linear(x, w, s)) < OUTPUT_TOL
    monkeypatch.setattr(g, "USE_ONE_CHUNK", False)
    assert g.default_config(1, n, k).pdl


def test_one_chunk_aot_forms_registered():
    """Every one-chunk form the rule picks for a DSv4 dense shape is in the AOT registry."""
    from sglang_sm120.kernels import dsv4

    shipped = {cfg for cfg, _rope in g.SHIPPED_FORMS}
    for tp in dsv4.SUPPORTED_TP:
        for name, (n, k) in dsv4.dense_linear_shapes(tp).items():
            groups = dsv4.O_GROUPS // tp if name == "wo_a" else 1
            rows = dsv4.O_LORA_RANK if name == "wo_a" else n
            for m in (1, 2):
                cfg = g.default_config(m, rows, k, groups)
                if cfg.one_chunk:
                    assert dataclasses.replace(cfg, split_k=1) in shipped, (name, tp, m, cfg.name)
