"""Issue 6 candidate ``GemvConfig.rope_before_wait``: wo_a's fused-RoPE one-shot program (block 0's weight before the PDL
wait, the rope block preloaded and rotated from its own pairs) with the position load and the (cos, sin) pair gather
also issued before the wait. Under the CPU interpreter at reduced wo_a shapes: the float32 reference and bit for bit
the shipped seam form at 1, 2, 4, 8 rows (ragged positions, the table's first and last rows), ragged R / strided o,
a split of two heads (where the flag changes nothing); the flag reaches the kernel (config name, constexpr, AOT
registration) and is no default."""

import dataclasses

import pytest
import torch

from sglang_sm120.kernels import dsv4
from sglang_sm120.kernels import fp8_gemv as g

from ..conftest import DEVICE
from .test_fp8_gemv import OUTPUT_TOL, check_ragged_grouped_wo_a, poisoned, random_weight, rel_err, rope_freqs

HEAD, ROPE = dsv4.HEAD_DIM, dsv4.ROPE_DIM
FULL = (dsv4.O_LORA_RANK, dsv4.HIDDEN_SIZE, dsv4.O_GROUPS)  # wo_a at T=1: R, D, G
MAX_POS = 64


def seam_config(m: int) -> g.GemvConfig:
    """The shipped seam form at T=1 (wo_a_config with the fused RoPE, full shape; the interpreter runs it at reduced
    shapes)."""
    return g.wo_a_config(m, *FULL, fused_rope=True, sms=g.DEFAULT_SM_COUNT)


def candidate(m: int) -> g.GemvConfig:
    return dataclasses.replace(seam_config(m), rope_before_wait=True)


def ragged_positions(b: int, gen: torch.Generator) -> torch.Tensor:
    """Random positions with the freqs table's first and last rows among them."""
    pos = torch.randint(0, MAX_POS, (b,), generator=gen)
    pos[0] = MAX_POS - 1
    if b > 1:
        pos[-1] = 0
    return pos.to(DEVICE)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_rope_before_wait_matches_reference_and_seam_form(m):
    """2 groups, R 128, D = 2 heads (a split of 4 blocks per head, as wo_a at split 8): within OUTPUT_TOL of the float32
    reference and bit for bit the shipped form (same loads, same arithmetic; only the issue point moves)."""
    gen = torch.Generator().manual_seed(100 + m)
    groups, r, d = 2, 128, 2 * HEAD
    w, s = random_weight(r, d, groups=groups, gen=gen, pow2=True)
    o = torch.randn(m, groups, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    pos = ragged_positions(m, gen)
    freqs = rope_freqs(ROPE, gen, MAX_POS)
    kw = dict(positions=pos, freqs=freqs, head_dim=HEAD, rope_dim=ROPE)
    cfg = candidate(m)
    assert cfg.w_before_wait and cfg.rope_preload and cfg.rope_pairs and cfg.split_k > 1
    ref = g.reference_grouped_wo_a(o, w, s, pos, freqs, HEAD, ROPE)
    shipped = g.grouped_fp8_wo_a(o, w, s, config=seam_config(m), **kw)
    for _ in range(2):  # split-K counters reset by the first call
        y = g.grouped_fp8_wo_a(o, w, s, out=poisoned((m, groups, r)), config=cfg, **kw)
        assert torch.isfinite(y).all() and rel_err(y, ref) < OUTPUT_TOL
        assert torch.equal(y, shipped)
    assert all(int(c.abs().sum()) == 0 for c in g._counter_cache.values())


def test_rope_before_wait_ragged_and_strided():
    check_ragged_grouped_wo_a(candidate(3), rope=True, seed=91, groups=2)


@pytest.mark.parametrize("head,rope", [(512, 64), (256, 64)])
def test_rope_before_wait_one_shot_forms(head, rope):
    """The one-shot test form (64 / 128-column tiles, split 2, ragged R 160, rows past M): the rope block preloaded
    (head 512) and the factors hoisted (head 256, two heads per split: the flag changes nothing) equal the shipped
    rope_pairs program."""
    gen = torch.Generator().manual_seed(head + rope)
    b, groups, r, d = 3, 2, 160, 1024
    w, s = random_weight(r, d, groups=groups, gen=gen)
    o = torch.randn(b, groups, d + 64, generator=gen).to(torch.bfloat16).to(DEVICE)[..., :d]
    pos = ragged_positions(b, gen)
    freqs = rope_freqs(rope, gen, MAX_POS)
    kw = dict(positions=pos, freqs=freqs, head_dim=head, rope_dim=rope)
    shipped = g.GemvConfig(8, 128, 2, True, 4, 1, g.ONE_SHOT_BLOCKS.value, fp8_mma=True, fp8_join=True, pdl=True,
                           split_sum_batch=8, w_before_wait=1, rope_preload=True, rope_pairs=True)
    y = g.grouped_fp8_wo_a(o, w, s, out=poisoned((b, groups, r)),
                           config=dataclasses.replace(shipped, rope_before_wait=True), **kw)
    ref = g.reference_grouped_wo_a(o, w, s, pos, freqs, head, rope)
    assert torch.isfinite(y).all() and rel_err(y, ref) < OUTPUT_TOL
    assert torch.equal(y, g.grouped_fp8_wo_a(o, w, s, config=shipped, **kw))


class _RecordingKernel:
    """Stands in for _block_fp8_gemv_fp8mma_kernel: records each launch's keyword arguments, runs nothing."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(kwargs)


def test_rope_before_wait_reaches_the_kernel(monkeypatch):
    """The flag is part of the config name (the AOT registry and the device tools tell the forms apart by it), needs
    rope_pairs, is passed to the launch as the ROPE_BEFORE_WAIT constexpr, and is no default."""
    cfg = candidate(8)
    assert cfg.name == seam_config(8).name + "_rbw"
    with pytest.raises(ValueError, match="rope_before_wait"):
        dataclasses.replace(cfg, rope_pairs=False)
    for m in range(1, 9):
        assert not seam_config(m).rope_before_wait
    rec = _RecordingKernel()
    monkeypatch.setattr(g, "_block_fp8_gemv_fp8mma_kernel", rec)
    o = torch.zeros(2, 2, 2 * HEAD, dtype=torch.bfloat16, device=DEVICE)
    w, s = random_weight(128, 2 * HEAD, groups=2)
    freqs = torch.zeros(MAX_POS, ROPE, device=DEVICE)
    pos = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    for c in (seam_config(2), cfg):
        g.grouped_fp8_wo_a(o, w, s, positions=pos, freqs=freqs, config=c)
    assert [k["ROPE_BEFORE_WAIT"] for k in rec.launches] == [False, True]
    assert all(k["ROPE_PAIRS"] and k["W_BEFORE_WAIT"] == 1 and k["ROPE_HOIST"] == g.ROPE_PRELOAD
               for k in rec.launches)


def test_rope_before_wait_aot_registered():
    """The candidate's 8-row tile (T=1, 1..8 rows) is compiled by the AOT check as its own config, no spills allowed,
    beside the shipped _rp_ww1_pairs form."""
    names = {c.name: c for c in g.aot_configs()}
    registered_split = g.CANDIDATE_FORMS[0][0].split_k  # the compile depends on the split only as 1 vs > 1
    shipped = g.aot_config(dataclasses.replace(seam_config(8), split_k=registered_split), True)
    cand = g.aot_config(dataclasses.replace(candidate(8), split_k=registered_split), True)
    assert shipped.name in names and cand.name in names and cand.name != shipped.name
    assert names[cand.name].constexprs["ROPE_BEFORE_WAIT"] is True
    assert names[shipped.name].constexprs["ROPE_BEFORE_WAIT"] is False
    assert names[cand.name].max_spill_bytes == 0 and not names[cand.name].max_registers
