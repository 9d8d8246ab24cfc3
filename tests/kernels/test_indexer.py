"""Lightning indexer kernels under the interpreter at reduced sizes: logits against the float32
reference and upstream's torch implementation, top-k against the reference and upstream's torch
top-k, the fused path against both; edge cases (B=0, lengths 0, < 512, not a multiple of 64,
ragged, longer than the logits width, pages in random order)."""

import dataclasses
import random

import pytest
import torch

from sglang_sm120.kernels import indexer as ix
from sglang_sm120.kernels.dsv4 import INDEX_PAGE_BYTES, INDEX_PAGE_SIZE, INDEX_SCALE_OFFSET, INDEX_TOPK

FP8 = torch.float8_e4m3fn


def make_inputs(lens, max_seq_len, extra_pages=3, seed=0, pt_width=None):
    """Random fp8 q/K, positive fp32 scales, signed head weights; every row's pages are distinct
    and in random order inside a shared cache."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(lens)
    width = pt_width if pt_width is not None else -(-max_seq_len // INDEX_PAGE_SIZE)
    n_pages = max(1, batch * width // 2 + width + extra_pages)
    q = (torch.randn(batch, 1, 64, 128, generator=gen) * 0.7).to(FP8)
    flat = torch.empty(n_pages, INDEX_PAGE_BYTES, dtype=torch.uint8)
    flat[:, :INDEX_SCALE_OFFSET] = torch.randn(n_pages, INDEX_SCALE_OFFSET, generator=gen).to(FP8).view(torch.uint8)
    flat[:, INDEX_SCALE_OFFSET:] = (torch.rand(n_pages, INDEX_PAGE_SIZE, generator=gen) + 0.25).view(torch.uint8)
    kv = flat.view(n_pages, INDEX_PAGE_SIZE, 1, 132)
    weights = torch.randn(batch, 64, generator=gen) * 0.1
    table = torch.stack([torch.randperm(n_pages, generator=gen)[:width] for _ in range(batch)]) if batch else \
        torch.zeros(0, width, dtype=torch.long)
    return q, kv, weights, torch.tensor(lens, dtype=torch.int32), table.to(torch.int32)


def upstream_indexer():
    return pytest.importorskip("sglang.srt.layers.attention.dsv4.indexer")


def slots_to_positions(slots, page_table):
    """Invert ``page_table[b, i // 64] * 64 + i % 64`` (pages are distinct within a row)."""
    out = torch.full(slots.shape, -1, dtype=torch.long)
    for b in range(slots.shape[0]):
        where = {int(p): j for j, p in enumerate(page_table[b].tolist())}
        for j, s in enumerate(slots[b].tolist()):
            if s >= 0:
                out[b, j] = where[s // INDEX_PAGE_SIZE] * INDEX_PAGE_SIZE + s % INDEX_PAGE_SIZE
    return out


def assert_selection_matches(slots, ref_logits, lens, page_table, k=INDEX_TOPK, rel_tol=0.0):
    """``slots`` hold a valid top-k of ``ref_logits``: -1 exactly past min(len, k), rows of at most
    k positions in order, longer rows a set whose members differ from the exact top-k only where
    scores tie within ``rel_tol`` of the k-th largest."""
    positions = slots_to_positions(slots, page_table)
    width = ref_logits.shape[1]
    for b in range(slots.shape[0]):
        n = min(max(int(lens[b]), 0), width, page_table.shape[1] * INDEX_PAGE_SIZE)
        got = positions[b]
        count = min(n, k)
        assert (got[count:] == -1).all() and (slots[b, count:] == -1).all(), f"row {b}: -1 padding"
        assert (got[:count] >= 0).all(), f"row {b}: missing selections"
        if n <= k:
            assert torch.equal(got[:count], torch.arange(count)), f"row {b}: short rows list 0..len-1"
            continue
        chosen = got[:count]
        assert len(set(chosen.tolist())) == count, f"row {b}: repeated positions"
        assert (chosen < n).all(), f"row {b}: position past the length"
        row = ref_logits[b, :n].double()
        kth = torch.topk(row, k).values[-1]
        tol = rel_tol * max(abs(float(kth)), 1e-6)
        exact = set(torch.topk(row, k).indices.tolist())
        for pos in set(chosen.tolist()) - exact:
            assert row[pos] >= kth - tol, f"row {b}: picked {pos} ({row[pos]}) below the k-th {kth}"
        for pos in exact - set(chosen.tolist()):
            assert row[pos] <= kth + tol, f"row {b}: missed {pos} ({row[pos]}) above the k-th {kth}"


LOGITS_CASES = [
    # (lens, max_seq_len)
    ([1], 64),
    ([0, 5, 64, 130], 200),  # zero, short, exactly one page, not a multiple of 64; width not either
    ([700, 257, 1000], 1000),
    ([900, 3000], 640),  # lengths past the logits width are clipped to it
]


@pytest.mark.parametrize("scaled_dot", [False, True], ids=["dot", "dot_scaled"])
@pytest.mark.parametrize("lens,max_seq_len", LOGITS_CASES)
def test_logits_match_reference_and_upstream(lens, max_seq_len, scaled_dot):
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=len(lens) + max_seq_len)
    out = torch.full((len(lens), max_seq_len), float("nan"))
    ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, scaled_dot=scaled_dot, out=out)
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    assert not out.isnan().any()
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    finite = torch.isfinite(ref)
    torch.testing.assert_close(out[finite], ref[finite], rtol=1e-5, atol=1e-4)
    # Upstream's torch path (bf16 bmm: per-head dot products rounded to bf16).
    upstream = upstream_indexer().fp8_paged_mqa_logits_torch_sm120(q, kv, w, l, pt, None, max_seq_len, False)
    assert torch.equal(torch.isneginf(out), torch.isneginf(upstream))
    scale = ref[finite].abs().max()
    assert (out[finite] - upstream[finite]).abs().max() <= 2e-2 * scale


def test_logits_batch_zero_and_width_zero():
    q, kv, w, l, pt = make_inputs([], 128)
    assert ix.paged_mqa_logits(q, kv, w, l, pt, 128).shape == (0, 128)
    for plan in (ix.Plan("two_kernel"), ix.Plan("fused", 8)):
        assert ix.indexer_topk(q, kv, w, l, pt, 128, torch.empty(0, INDEX_TOPK, dtype=torch.int32), plan=plan).shape == (0, 512)
    q, kv, w, l, pt = make_inputs([0, 0], 700)  # every length 0: every slot -1, both paths
    for plan in (ix.Plan("two_kernel"), ix.Plan("fused", 8)):
        out = torch.full((2, INDEX_TOPK), 12345, dtype=torch.int32)
        ix.indexer_topk(q, kv, w, l, pt, 700, out, plan=plan)
        assert (out == -1).all()
    q, kv, w, l, pt = make_inputs([3], 64)
    assert ix.paged_mqa_logits(q, kv, w, l, pt, 0).shape == (1, 0)


@pytest.mark.parametrize("lens,width", [
    ([0, 1, 511, 512, 513], 600),
    ([4500, 9000, 100], 9000),  # two merge levels (chunks of 4096)
    ([2000, 1500], 2048),
    ([20000, 7000], 20000),  # two levels of chunks of 4096, then the final merge
])
def test_topk_transform_matches_reference_and_upstream(lens, width):
    gen = torch.Generator().manual_seed(width)
    batch = len(lens)
    scores = torch.randn(batch, width, generator=gen)
    scores[:, ::7] = scores[:, 3:4]  # many exact ties
    pt_width = -(-width // INDEX_PAGE_SIZE)
    table = torch.stack([torch.randperm(4 * pt_width, generator=gen)[:pt_width] for _ in range(batch)]).int()
    l = torch.tensor(lens, dtype=torch.int32)
    out = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    raw = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    ix.topk_transform_paged(scores, l, table, out, INDEX_PAGE_SIZE, raw)
    masked = scores.masked_fill(torch.arange(width)[None, :] >= l[:, None], float("-inf"))
    expected = ix.reference_topk_positions(masked, l)
    if ix.choose_plan(batch, width).scores_select.method == "rank":  # it lists longer rows best first
        assert torch.equal(out, ix.positions_to_slots(raw.long(), table))
        long_rows = torch.tensor(lens) > INDEX_TOPK
        raw[long_rows] = raw[long_rows].sort(dim=1).values  # (no -1 in rows longer than k)
        out = ix.positions_to_slots(raw.long(), table)
    assert torch.equal(raw, expected.int())  # exact, ties to the lowest position
    assert torch.equal(out, ix.positions_to_slots(expected, table))
    # Upstream's torch top-k: same rows for short lengths, same sets elsewhere (ties aside).
    up = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    upstream_indexer().topk_transform_pytorch_vectorized(scores, l, table, up, INDEX_PAGE_SIZE)
    for b, n in enumerate(lens):
        if n <= INDEX_TOPK:
            assert torch.equal(out[b], up[b])
        else:
            ours, theirs = set(out[b].tolist()), set(up[b].tolist())
            kth = torch.topk(masked[b], INDEX_TOPK).values[-1]
            differ = {int(s) for s in ours ^ theirs}
            pos = slots_to_positions(torch.tensor([sorted(differ)]), table[b:b + 1])[0]
            assert all(masked[b, p] == kth for p in pos.tolist()), "sets differ beyond ties"


SELECT_FORMS = {
    "bitwise": ix.SelectForm(),
    "bitwise_c8k": ix.SelectForm(max_chunk=8192),
    "bitwise_2x_warps": ix.SelectForm(warps_mul=2),
}


def _extreme_scores(batch, width, gen):
    """Rows that stress the order-preserving keys: ties, signed zeros, huge and tiny magnitudes,
    infinities, one row of a single repeated value."""
    scores = torch.randn(batch, width, generator=gen) * torch.logspace(-30, 30, width)[torch.randperm(width, generator=gen)]
    scores[:, ::5] = 0.0
    scores[:, 1::5] = -0.0
    scores[:, ::11] = scores[:, 7:8]
    scores[0, ::97] = float("inf")
    scores[0, 3::89] = float("-inf")
    scores[-1] = 2.5
    return scores


@pytest.mark.parametrize("form", list(SELECT_FORMS), ids=list(SELECT_FORMS))
@pytest.mark.parametrize("lens,width", [
    ([0, 1, 512, 513, 600], 600),
    ([9000, 4500, 8193], 9000),  # 8192-entry chunks: two groups, then the final merge
    ([20000, 700], 20000),  # 4096: five groups, a level, the final; 8192: three groups, the final
])
def test_select_forms_match_reference(form, lens, width):
    gen = torch.Generator().manual_seed(width + len(form))
    batch = len(lens)
    scores = _extreme_scores(batch, width, gen)
    pt_width = -(-width // INDEX_PAGE_SIZE)
    table = torch.stack([torch.randperm(3 * pt_width, generator=gen)[:pt_width] for _ in range(batch)]).int()
    l = torch.tensor(lens, dtype=torch.int32)
    out = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    raw = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    ix.topk_transform_paged(scores, l, table, out, INDEX_PAGE_SIZE, raw, select=SELECT_FORMS[form])
    masked = scores.masked_fill(torch.arange(width)[None, :] >= l[:, None], float("-inf"))
    expected = ix.reference_topk_positions(masked, l)
    assert torch.equal(raw, expected.int())  # exact, ties to the lowest position, ascending
    assert torch.equal(out, ix.positions_to_slots(expected, table))


def _rank_order(scores, lens, k=INDEX_TOPK):
    """The rank select's listing: rows of at most k positions 0..len-1 in order, longer rows their k best best
    first (equal scores, signed zeros included, by position)."""
    out = torch.full((scores.shape[0], k), -1, dtype=torch.long)
    for b in range(scores.shape[0]):
        n = int(min(max(int(lens[b]), 0), scores.shape[1]))
        row = scores[b, :n].double().tolist()
        order = list(range(n)) if n <= k else sorted(range(n), key=lambda i: (-row[i], i))[:k]
        out[b, :len(order)] = torch.tensor(order, dtype=torch.long)
    return out


RANK_CASES = [
    # (lens, width, rank_rows, warps_mul, positions per loop step or None)
    ([0, 1, 511, 512, 513, 600], 600, 8, 2, None),  # empty, short, exactly K, K + 1, ragged
    ([1100, 700, 1033, 1050], 1100, 4, 1, None),  # ragged rows not a multiple of the block
    ([1100, 1, 1100, 1024], 1100, 16, 2, 256),  # five loop steps, ties across step boundaries
    ([900, 2000, 1000, 999], 1000, 32, 1, 128),  # a length past the row width is clipped to it
]


@pytest.mark.parametrize("lens,width,rows,warps_mul,block_j", RANK_CASES)
@pytest.mark.parametrize("make", ["extreme", "tied"])
def test_rank_select_matches_reference(lens, width, rows, warps_mul, block_j, make, monkeypatch):
    """Every selected position is the reference's (ties to the lowest position), listed best first (short rows
    in position order); -1 padding over poisoned outputs; slot ids through a shuffled page table."""
    if block_j is not None:
        monkeypatch.setattr(ix, "RANK_BLOCK_J", block_j)
    gen = torch.Generator().manual_seed(width + rows)
    batch = len(lens)
    scores = _extreme_scores(batch, width, gen) if make == "extreme" else _tied_scores(batch, width, gen)
    pt_width = -(-width // INDEX_PAGE_SIZE)
    table = torch.stack([torch.randperm(3 * pt_width, generator=gen)[:pt_width] for _ in range(batch)]).int()
    l = torch.tensor(lens, dtype=torch.int32)
    out = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    raw = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    form = ix.SelectForm(method="rank", rank_rows=rows, warps_mul=warps_mul)
    ix.topk_transform_paged(scores, l, table, out, INDEX_PAGE_SIZE, raw, select=form)
    clipped = l.clamp(max=width)
    masked = scores.masked_fill(torch.arange(width)[None, :] >= clipped[:, None], float("-inf"))
    assert torch.equal(raw.long(), _rank_order(scores, clipped))
    expected = ix.reference_topk_positions(masked, clipped)  # the same set as the search forms (they list it ascending)
    chosen = torch.where(raw >= 0, raw.long(), torch.full_like(raw.long(), 1 << 40)).sort(dim=1).values
    assert torch.equal(torch.where(chosen == 1 << 40, -1, chosen), expected)
    assert torch.equal(out, ix.positions_to_slots(raw.long(), table))
    # without raw positions: the same slot ids
    alone = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    ix.topk_transform_paged(scores, l, table, alone, INDEX_PAGE_SIZE, select=form)
    assert torch.equal(alone, out)


def test_rank_select_nan_keys_and_small_k():
    """NaN scores rank above every number (the NaN of bits 0x7FFFFFFF ties with 0x7FFFFFFE: the lower position
    first); -inf inside the length still ranks below every number; k = 64 at a short page table."""
    width = 300
    scores = torch.randn(2, width, generator=torch.Generator().manual_seed(3))
    bits = scores.view(torch.int32)
    bits[0, 250] = 0x7FFFFFFF
    bits[0, 40] = 0x7FFFFFFE
    bits[0, 100] = 0x7FC00000
    scores[0, 5] = float("-inf")
    scores[1, :] = float("-inf")
    l = torch.tensor([300, 200], dtype=torch.int32)
    table = torch.arange(10).view(2, 5).int()  # 5 pages: 320 positions
    out = torch.full((2, 64), 12345, dtype=torch.int32)
    raw = torch.full((2, 64), 12345, dtype=torch.int32)
    ix.topk_transform_paged(scores, l, table, out, INDEX_PAGE_SIZE, raw,
                            select=ix.SelectForm(method="rank", rank_rows=16))
    assert raw[0, :3].tolist() == [40, 250, 100]
    finite = scores[0].clone()
    finite[[40, 100, 250]] = float("-inf")
    assert raw[0, 3:].tolist() == _rank_order(finite[None], torch.tensor([300]), k=61)[0].tolist()
    assert 5 not in raw[0].tolist()
    assert raw[1].tolist() == list(range(64))  # all -inf: the lowest positions, in order
    assert torch.equal(out, ix.positions_to_slots(raw.long(), table))


def test_rank_select_plan_through_indexer_topk():
    """A two-kernel plan with the rank select picks the reference's set from the logits kernel's row."""
    lens, max_seq_len = [1500, 0, 700, 513], 1500
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=27)
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    out = torch.full((len(lens), INDEX_TOPK), 12345, dtype=torch.int32)
    plan = ix.Plan("two_kernel", select=ix.SelectForm(method="rank", rank_rows=32, warps_mul=2))
    ix.indexer_topk(q, kv, w, l, pt, max_seq_len, out, plan=plan)
    assert_selection_matches(out, ref, l, pt, rel_tol=1e-5)


def test_default_select_forms_and_fused_merge_forms_agree():
    """Every plan's select form, and the fused path's merge under each form, pick the reference set."""
    lens, max_seq_len = [2500, 1999, 0], 2560
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=11)
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    expected = ix.positions_to_slots(ix.reference_topk_positions(ref, l), pt)
    for plan in {p for _, _, p in ix.PLAN_TABLE}:
        out = torch.full((3, INDEX_TOPK), 12345, dtype=torch.int32)
        ix.indexer_topk(q, kv, w, l, pt, max_seq_len, out, plan=plan)
        assert_selection_matches(out, ref, l, pt, rel_tol=1e-5)
        assert torch.equal(out[2], expected[2])
    for form in SELECT_FORMS.values():
        out = torch.full((3, INDEX_TOPK), 12345, dtype=torch.int32)
        ix.fused_logits_topk(q, kv, w, l, pt, max_seq_len, out, split_pages=8, select=form)
        assert_selection_matches(out, ref, l, pt, rel_tol=1e-5)


HISTOGRAM = ix.SelectForm(method="histogram")


# (HIST_ONE_SHOT_MAX_PAGES, HIST_LONG_REDUCE, HIST_ONE_BLOCK_MAX_PROGRAMS): the launch forms the shipped rules
# pick at larger shapes, forced at the interpreter's (whose defaults give the one-shot reduce in the logits
# kernel, the early-exit reduce in the scores-histogram kernel and the one-block finish).
LAUNCH_FORMS = {
    "blocks_reduce_blocks_finish": (0, 0, 0),
    "early_exit_reduce_blocks_finish": (0, 2, 0),
}


def force_launch_forms(monkeypatch, name):
    one_shot_max_pages, long_reduce, one_block_max_programs = LAUNCH_FORMS[name]
    monkeypatch.setattr(ix, "HIST_ONE_SHOT_MAX_PAGES", one_shot_max_pages)
    monkeypatch.setattr(ix, "HIST_LONG_REDUCE", long_reduce)
    monkeypatch.setattr(ix, "HIST_ONE_BLOCK_MAX_PROGRAMS", one_block_max_programs)


def assert_histogram_selection(raw, out, scores, lens, table, k=INDEX_TOPK):
    """The histogram select's contract: rows of at most k positions in order and -1 padded; longer
    rows k distinct positions below the length (in no fixed order) whose scores, sorted, equal the
    exact top-k's (so the set is exact up to which of several equal scores is taken)."""
    width = scores.shape[1]
    masked = scores.masked_fill(torch.arange(width)[None, :] >= lens[:, None], float("-inf"))
    expected = ix.reference_topk_positions(masked, lens, k)
    assert torch.equal(out, ix.positions_to_slots(raw.long(), table))
    for b in range(scores.shape[0]):
        n = min(max(int(lens[b]), 0), width)
        if n <= k:
            assert torch.equal(raw[b], expected[b].int()), f"row {b}: short rows list 0..len-1, then -1"
            continue
        got = raw[b].long()
        assert len(set(got.tolist())) == k and (got >= 0).all() and (got < n).all(), f"row {b}: bad positions"
        ours, exact = masked[b, got].sort().values, masked[b, expected[b]].sort().values
        assert torch.equal(ours, exact), f"row {b}: {(ours != exact).sum()} scores differ from the exact top-k"


def _tied_scores(batch, width, gen):
    """Rows whose K-th score is shared by more entries than the candidate list holds (the row is
    rescanned), all -inf rows, and rows with a few distinct values."""
    scores = torch.randn(batch, width, generator=gen)
    scores[0] = 1.5  # one value: every entry in one bin at every digit
    scores[1] = float("-inf")
    scores[2] = torch.randint(0, 3, (width,), generator=gen).float()  # three values, ~width/3 of each
    scores[3, ::2] = -0.0
    scores[3, 1::2] = 0.0
    return scores


def _clustered_scores(batch, width, gen):
    """Rows whose threshold bin (first digit) holds 1024-4096 distinct entries: the candidate list
    holds them all and the finishing program reads it in several blocks; row 1 has 2500 of them
    equal (the K-th score tied within the list)."""
    scores = -1.0 - torch.rand(batch, width, generator=gen)  # far below the cluster, another bin
    for b in range(batch):
        n = 1100 + 900 * b  # 1100, 2000, 2900, ... entries in [1.0, 1.2): one first-digit bin
        where = torch.randperm(width, generator=gen)[:n]
        scores[b, where] = 1.0 + 0.2 * torch.rand(n, generator=gen)
    scores[1, torch.randperm(width, generator=gen)[:2500]] = 1.125
    return scores


def test_clustered_rows_keep_the_threshold_bin_in_one_first_digit_bin():
    """The clustered rows' construction: all cluster entries share one first-digit bin."""
    scores = _clustered_scores(3, 6000, torch.Generator().manual_seed(0))
    key = scores.view(torch.int32)  # positive floats: the raw bits order them
    cluster = scores >= 1.0
    assert (cluster.sum(dim=1) > ix.HIST_FINAL_BLOCK).all() and (cluster.sum(dim=1) <= ix.HIST_CAP).all()
    assert len(set((key[cluster] >> 21).tolist())) == 1


@pytest.mark.parametrize("lens,width,make", [
    ([0, 1, 511, 512, 513, 600], 600, "extreme"),
    ([6000, 5999, 4800], 6000, "clustered"),  # 1100-4096 threshold-bin candidates: several blocks
    ([9000, 4500, 8193, 700], 9000, "extreme"),  # several split programs per row; ragged
    ([20000, 19999, 13000, 6001], 20000, "randn"),
    ([9000, 9000, 8999, 8000], 9000, "tied"),  # more than HIST_CAP entries at the K-th score
    ([5000, 4097, 4500, 4200], 5000, "tied"),
])
def test_histogram_select_matches_reference(lens, width, make):
    gen = torch.Generator().manual_seed(width + len(lens))
    batch = len(lens)
    scores = {"extreme": _extreme_scores, "tied": _tied_scores, "clustered": _clustered_scores,
              "randn": lambda b, w, g: torch.randn(b, w, generator=g)}[make](batch, width, gen)
    pt_width = -(-width // INDEX_PAGE_SIZE)
    table = torch.stack([torch.randperm(3 * pt_width, generator=gen)[:pt_width] for _ in range(batch)]).int()
    l = torch.tensor(lens, dtype=torch.int32)
    out = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    raw = torch.full((batch, INDEX_TOPK), 12345, dtype=torch.int32)
    ix.topk_transform_paged(scores, l, table, out, INDEX_PAGE_SIZE, raw, select=HISTOGRAM)
    assert_histogram_selection(raw, out, scores, l, table)


def test_histogram_select_small_k_and_against_upstream():
    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(3, 3000, generator=gen)
    table = torch.stack([torch.randperm(100, generator=gen)[:47] for _ in range(3)]).int()
    l = torch.tensor([3000, 40, 2999], dtype=torch.int32)
    out = torch.full((3, 64), 12345, dtype=torch.int32)
    raw = torch.full((3, 64), 12345, dtype=torch.int32)
    ix.topk_transform_paged(scores, l, table, out, INDEX_PAGE_SIZE, raw, select=HISTOGRAM)
    assert_histogram_selection(raw, out, scores, l, table, k=64)
    up = torch.full((3, INDEX_TOPK), 12345, dtype=torch.int32)
    upstream_indexer().topk_transform_pytorch_vectorized(scores, l, table, up, INDEX_PAGE_SIZE)
    ours = torch.full_like(up, 12345)
    ix.topk_transform_paged(scores, l, table, ours, INDEX_PAGE_SIZE, select=HISTOGRAM)
    assert torch.equal(ours[1], up[1])  # 40 positions: in order, -1 after
    for b in (0, 2):  # distinct random scores: the same set
        assert set(ours[b].tolist()) == set(up[b].tolist())


@pytest.mark.parametrize("lens,max_seq_len", [
    ([2500, 1999, 0, 300, 2560], 2560),
    ([4100, 4160, 513, 64], 4160),  # many split programs per row: every histogram copy used
])
def test_histogram_plan_matches_reference_and_search(lens, max_seq_len):
    """The full indexer call with the histogram select: the logits kernel counts the first digit.
    Every call leaves the shared workspace zeroed, so a second call (other inputs) is exact too."""
    plan = ix.Plan("two_kernel", select=HISTOGRAM)
    for seed in (max_seq_len + 1, max_seq_len + 2):
        q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=seed)
        ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
        out = torch.full((len(lens), INDEX_TOPK), 12345, dtype=torch.int32)
        raw = torch.full_like(out, 12345)
        ix.indexer_topk(q, kv, w, l, pt, max_seq_len, out, raw, plan=plan)
        assert_selection_matches(out, ref, l, pt, rel_tol=1e-5)
        assert torch.equal(ix.positions_to_slots(raw.long(), pt), out)
        search = torch.full_like(out, 12345)
        ix.indexer_topk(q, kv, w, l, pt, max_seq_len, search, plan=ix.Plan("two_kernel"))
        # Same kernel arithmetic, distinct scores: the same set as the bitwise search.
        assert [sorted(r) for r in out.tolist()] == [sorted(r) for r in search.tolist()]
    assert (ix.hist_workspace(len(lens), "cpu") == 0).all()


@pytest.mark.parametrize("forms", list(LAUNCH_FORMS))
@pytest.mark.parametrize("case", ["extreme", "clustered", "tied", "plan"])
def test_histogram_launch_forms_match_reference(case, forms, monkeypatch):
    """Every first-digit reduce and both histogram-select finishes (one register block or blocks),
    forced where the shipped rules would not pick them at these shapes: short rows,
    a threshold bin of several finishing blocks, an overflowing one, the full indexer call twice."""
    force_launch_forms(monkeypatch, forms)
    if case == "plan":
        test_histogram_plan_matches_reference_and_search([4100, 4160, 513, 64], 4160)
        return
    lens, width = {"extreme": ([0, 1, 511, 512, 513, 600], 600), "clustered": ([6000, 5999, 4800], 6000),
                   "tied": ([9000, 9000, 8999, 8000], 9000)}[case]
    test_histogram_select_matches_reference(lens, width, case)


def test_launch_rules(monkeypatch):
    """PDL at B <= PDL_MAX_BATCH with the histogram select or the double-warp search only, and never
    where the device has no PDL (the CPU); the one-shot reduce up to HIST_ONE_SHOT_MAX_PAGES pages per logits program;
    the one-block finish up to HIST_ONE_BLOCK_MAX_PROGRAMS programs, 8 warps up to
    HIST_SELECT_8_WARPS_MAX_PROGRAMS."""
    assert not ix.launch_pdl(torch.device("cpu"), 1, ix.SelectForm())
    monkeypatch.setattr(ix, "pdl_supported", lambda device: True)
    assert ix.launch_pdl("cpu", ix.PDL_MAX_BATCH, ix.SelectForm(warps_mul=2))
    assert ix.launch_pdl("cpu", 1, HISTOGRAM)
    assert not ix.launch_pdl("cpu", ix.PDL_MAX_BATCH + 1, ix.SelectForm())
    assert not ix.launch_pdl("cpu", 1, ix.SelectForm(max_chunk=8192))
    assert not ix.launch_pdl("cpu", 1, ix.SelectForm())
    monkeypatch.setattr(ix, "USE_PDL", False)
    assert not ix.launch_pdl("cpu", 1, HISTOGRAM)
    assert ix.hist_reduce_mode(ix.HIST_ONE_SHOT_MAX_PAGES) == ix.REDUCE_ONE_SHOT
    assert ix.hist_reduce_mode(ix.HIST_ONE_SHOT_MAX_PAGES + 1) == ix.HIST_LONG_REDUCE
    assert ix.hist_one_block(ix.HIST_ONE_BLOCK_MAX_PROGRAMS)
    assert not ix.hist_one_block(ix.HIST_ONE_BLOCK_MAX_PROGRAMS + 1)
    assert ix.hist_select_warps(ix.HIST_SELECT_8_WARPS_MAX_PROGRAMS, 2048) == 8
    assert ix.hist_select_warps(ix.HIST_SELECT_8_WARPS_MAX_PROGRAMS + 1, 2048) == 4
    small = ix.HIST_SPLIT_SMALL_MAX_PROGRAMS  # 1024-entry split programs where 2048-entry ones number <= small
    assert ix.hist_split_chunk(1, small * 2048) == 1024 and ix.hist_split_chunk(small, 2048) == 1024
    assert ix.hist_split_chunk(1, small * 2048 + 1) == 2048 and ix.hist_split_chunk(small + 1, 4096) == 2048
    assert ix.hist_split_chunk(64, 600) == 1024  # short rows: the smallest chunk covering them


def test_histogram_plan_with_equal_logits_and_edge_batches():
    """Identical index-K rows and scales give every position the same logit: the candidate list
    overflows and the final program rescans the row; B=0 and all-zero lengths."""
    lens, max_seq_len = [5000, 4200], 5000
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=3)
    flat = kv.view(kv.shape[0], -1)  # per page: 64 rows of 128 fp8 bytes, then 64 fp32 scales
    flat[:, :INDEX_SCALE_OFFSET] = flat[0, :128].repeat(INDEX_PAGE_SIZE)
    flat[:, INDEX_SCALE_OFFSET:] = torch.full((INDEX_PAGE_SIZE,), 0.75).view(torch.uint8)
    plan = ix.Plan("two_kernel", select=HISTOGRAM)
    out = torch.full((2, INDEX_TOPK), 12345, dtype=torch.int32)
    raw = torch.full_like(out, 12345)
    ix.indexer_topk(q, kv, w, l, pt, max_seq_len, out, raw, plan=plan)
    logits = ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    assert (logits[0] == logits[0, 0]).all()  # one value over the whole row
    assert_histogram_selection(raw, out, logits, l, pt)
    q, kv, w, l, pt = make_inputs([], 128)
    assert ix.indexer_topk(q, kv, w, l, pt, 128, torch.empty(0, INDEX_TOPK, dtype=torch.int32), plan=plan).shape == (0, 512)
    q, kv, w, l, pt = make_inputs([0, 0], 700)
    out = torch.full((2, INDEX_TOPK), 12345, dtype=torch.int32)
    ix.indexer_topk(q, kv, w, l, pt, 700, out, plan=plan)
    assert (out == -1).all()
    out.fill_(12345)
    ix.indexer_topk(q, kv, w, l, pt, 0, out, plan=plan)
    assert (out == -1).all()


@pytest.mark.parametrize("forms", ["shipped", *LAUNCH_FORMS])
@pytest.mark.parametrize("k", [512, 64])
def test_logits_first_digit_threshold(k, forms, monkeypatch):
    """The logits kernel's histogram, reduced by each row's last program (each reduce form): the bin
    of the k-th largest key and the count above it, the first digit's copies zeroed again. Lengths
    not a multiple of 64 leave dead positions in a row's last page (not counted)."""
    if forms != "shipped":
        force_launch_forms(monkeypatch, forms)
    lens, max_seq_len = [700, 0, 1000, 64, 513], 1000
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=21 + k)
    workspace = torch.zeros(len(lens), ix.WS_WIDTH, dtype=torch.int32)
    logits = ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, hist_workspace=workspace, hist_k=k)
    bits = logits.view(torch.int32)
    key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long() + 2**31  # unsigned order
    first_digit = key >> (32 - ix.HIST_DIGITS[0])
    for b, n in enumerate(lens):
        assert workspace[b, 2] == 0, "the last program resets the arrival count"
        if n <= k:
            continue
        kth_digit = first_digit[b, :n].sort(descending=True).values[k - 1]
        assert workspace[b, 3] == kth_digit
        assert workspace[b, 4] == (first_digit[b, :n] > kth_digit).sum()
    assert (workspace[:, ix.WS_H1:] == 0).all()
    with pytest.raises(ValueError, match="hist_workspace"):
        ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, hist_workspace=workspace[:, :100])


@pytest.mark.parametrize("kwargs,match", [
    (dict(method="sort"), "method"),
    (dict(max_chunk=1024), "max_chunk"),
    (dict(max_chunk=16384), "max_chunk"),
    (dict(warps_mul=4), "warps_mul"),
    (dict(threshold="page_max"), "threshold"),
    (dict(method="histogram", threshold="sample"), "threshold"),
    (dict(method="histogram", copies=3), "copies"),
    (dict(method="histogram", copies=16), "copies"),
    (dict(method="histogram", threshold="page_max", copies=1), "copies"),
    (dict(copies=1), "copies"),
    (dict(method="histogram", overlap_programs=2048), "overlap_programs"),
    (dict(method="rank", rank_rows=3), "rank_rows"),
    (dict(method="rank", rank_rows=64), "rank_rows"),
])
def test_bad_select_form_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ix.SelectForm(**kwargs)


# (batch, compressed positions, select form): the H200 runs 6-9 decisions (benchmarks/indexer-h200-run8-summary.md,
# -run9-summary.md), the page-max buckets of run 11b, the overlap form's of run 14 and the rank select's of run 19.
PLAN_BUCKETS = [
    (1, 8192, "bitwise"), (1, 2048, "rank_r8"), (1, 600, "rank_r8"), (2, 2048, "rank_r16_w4"),
    (3, 2048, "bitwise_2xw"), (1, 4096, "rank_r16_w4"), (2, 4096, "rank_r16_w4"), (2, 4097, "bitwise"),
    (1, 8193, "histogram"), (2, 8193, "histogram"), (1, 16384, "histogram"), (3, 16384, "hist1"),
    (4, 8192, "bitwise"), (3, 8193, "hist1"), (4, 16384, "hist1"), (4, 16385, "histogram"), (4, 40000, "histogram"),
    (1, 65536, "histogram"), (8, 32768, "page_max"), (5, 16385, "page_max"), (16, 32768, "page_max"),
    (32, 32768, "page_max"), (17, 16385, "page_max"), (8, 65536, "page_max"), (16, 65536, "page_max"),
    (9, 32769, "page_max"), (17, 65536, "page_max_overlap"), (32, 32769, "page_max_overlap"),
    (33, 65536, "page_max_overlap_lean"), (64, 16385, "page_max_overlap_lean"), (64, 65536, "page_max_overlap_lean"),
    (65, 65536, "histogram"),
    (65, 16385, "histogram"), (128, 32768, "histogram"), (8, 16384, "bitwise_2xw"), (9, 8193, "hist1"),
    (16, 8192, "bitwise_2xw"), (16, 16384, "hist1"), (17, 16384, "page_max"), (32, 8193, "page_max"),
    (32, 8192, "bitwise_2xw"), (17, 4096, "bitwise_2xw"), (64, 16384, "page_max"), (33, 8193, "page_max"),
    (65, 16384, "histogram"), (256, 16384, "histogram"), (64, 8192, "chunk8k"), (256, 2049, "chunk8k"),
    (256, 2048, "bitwise_2xw"), (1, 262144, "bitwise"),
]
FORMS_BY_NAME = {"bitwise": ix.SelectForm(), "bitwise_2xw": ix.SelectForm(warps_mul=2),
                 "chunk8k": ix.SelectForm(max_chunk=8192), "histogram": ix.SelectForm(method="histogram"),
                 "hist1": ix.SelectForm(method="histogram", copies=1),
                 "page_max": ix.SelectForm(method="histogram", threshold="page_max"),
                 "page_max_overlap": ix.SelectForm(method="histogram", threshold="page_max",
                                                   overlap_programs=ix.PAGE_MAX_OVERLAP_PROGRAMS),
                 "page_max_overlap_lean": ix.SelectForm(method="histogram", threshold="page_max",
                                                        overlap_programs=ix.PAGE_MAX_OVERLAP_PROGRAMS,
                                                        finish="registers_lean"),
                 "rank_r8": ix.SelectForm(method="rank", rank_rows=8, warps_mul=2),
                 "rank_r16_w4": ix.SelectForm(method="rank", rank_rows=16)}


@pytest.mark.parametrize("batch,length,form", PLAN_BUCKETS)
def test_plan_buckets(batch, length, form):
    plan = ix.choose_plan(batch, length)
    assert plan.path == "two_kernel" and plan.select == FORMS_BY_NAME[form]
    if plan.select.method == "histogram":  # a logits row from elsewhere keeps the bucket's earlier search form
        if batch <= 4:
            expected = ix.SelectForm()
        elif 8 < batch <= 32 and length <= 16384:
            expected = ix.SelectForm(warps_mul=2)
        else:
            expected = ix.SelectForm(max_chunk=8192)
        assert plan.scores_select == expected
    else:
        assert plan.scores_select == plan.select


@pytest.mark.parametrize("form", [HISTOGRAM, ix.SelectForm(method="rank")], ids=["histogram", "rank"])
def test_fused_rejects_histogram_and_rank(form):
    q, kv, w, l, pt = make_inputs([100], 128)
    with pytest.raises(ValueError, match="search form"):
        ix.fused_logits_topk(q, kv, w, l, pt, 128, torch.empty(1, 512, dtype=torch.int32), select=form)


def test_select_argument_must_be_a_select_form():
    scores, l, pt = torch.randn(2, 128), torch.tensor([5, 6], dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="select must be a SelectForm"):
        ix.topk_transform_paged(scores, l, pt, torch.empty(2, 512, dtype=torch.int32), INDEX_PAGE_SIZE, select=2)


def test_topk_small_k_and_edge_rows():
    scores = torch.randn(3, 300)
    table = torch.arange(15).view(3, 5).int()
    l = torch.tensor([0, 17, 300], dtype=torch.int32)
    out = torch.full((3, 64), 99, dtype=torch.int32)
    ix.topk_transform_paged(scores, l, table, out, INDEX_PAGE_SIZE)
    assert (out[0] == -1).all()
    assert torch.equal(out[1, :17], ix.positions_to_slots(torch.arange(17)[None], table[1:2])[0])
    assert (out[1, 17:] == -1).all()
    expected = ix.reference_topk_positions(scores[2:3], l[2:3], k=64)
    assert torch.equal(out[2:3], ix.positions_to_slots(expected, table[2:3]))
    empty = torch.empty(0, 64, dtype=torch.int32)
    ix.topk_transform_paged(torch.empty(0, 300), l[:0], table[:0], empty, INDEX_PAGE_SIZE)


FUSED_CASES = [
    # (lens, max_seq_len, split_pages)
    ([0, 40, 512, 513], 600, 8),
    ([3000, 700, 1], 3072, 8),  # 6 splits of 512 -> final merge of 3072 candidates
    ([2500, 1999], 2560, 32),  # splits of 2048 reduce to 512 in registers
    ([4100, 100], 4160, 64),
]


@pytest.mark.parametrize("lens,max_seq_len,split_pages", FUSED_CASES)
def test_fused_matches_reference_and_two_kernel(lens, max_seq_len, split_pages):
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=split_pages + max_seq_len)
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    fused = torch.full((len(lens), INDEX_TOPK), 12345, dtype=torch.int32)
    raw = torch.full((len(lens), INDEX_TOPK), 12345, dtype=torch.int32)
    ix.fused_logits_topk(q, kv, w, l, pt, max_seq_len, fused, raw, split_pages=split_pages)
    assert_selection_matches(fused, ref, l, pt, rel_tol=1e-5)
    assert torch.equal(ix.positions_to_slots(raw.long(), pt), fused)
    two = torch.full_like(fused, 12345)
    ix.indexer_topk(q, kv, w, l, pt, max_seq_len, two, plan=ix.Plan("two_kernel"))
    assert_selection_matches(two, ref, l, pt, rel_tol=1e-5)
    # Both paths score with the same kernel arithmetic, so they pick the same set.
    assert [sorted(r) for r in fused.tolist()] == [sorted(r) for r in two.tolist()]


def test_fused_against_upstream_torch_logits_and_topk():
    lens, max_seq_len = [1800, 333], 1920
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=7)
    mod = upstream_indexer()
    logits = mod.fp8_paged_mqa_logits_torch_sm120(q, kv, w, l, pt, None, max_seq_len, False)
    up = torch.empty(2, INDEX_TOPK, dtype=torch.int32)
    mod.topk_transform_pytorch_vectorized(logits, l, pt, up, INDEX_PAGE_SIZE)
    ours = torch.full_like(up, 12345)
    ix.fused_logits_topk(q, kv, w, l, pt, max_seq_len, ours, split_pages=16)
    assert torch.equal(ours[1], up[1])  # 333 <= 512: in order
    # Upstream rounds each head's dot product to bf16: sets agree up to near-ties at the threshold.
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    kth = torch.topk(ref[0, :1800], INDEX_TOPK).values[-1]
    differ = set(ours[0].tolist()) ^ set(up[0].tolist())
    pos = slots_to_positions(torch.tensor([sorted(differ)]), pt[:1])[0] if differ else torch.empty(0, dtype=torch.long)
    assert all(abs(ref[0, p] - kth) <= 2e-2 * ref[0].abs().max() for p in pos.tolist())
    assert len(differ) <= 0.05 * INDEX_TOPK


def test_plan_table_covers_every_shape():
    for batch in (1, 16, 64, 256):
        for length in (1, 2048, 65536, ix.INDEX_MAX_COMPRESSED_LEN):
            plan = ix.choose_plan(batch, length)
            assert plan.path in ("fused", "two_kernel")
            assert isinstance(plan.select, ix.SelectForm)
            if plan.path == "fused":
                assert plan.split_pages in ix.FUSED_SPLIT_PAGES


@pytest.mark.parametrize("scaled_dot", [False, True], ids=["dot", "dot_scaled"])
def test_page_ids_outside_the_cache_read_the_nearest_page(scaled_dot):
    """Live page ids below 0 or at / past the cache's page count read the clamped page (as the reference does),
    never memory outside the cache: the logits kernel in its plain and page-max forms and the fused split kernel
    agree with the reference."""
    lens, max_seq_len = [700, 333, 129], 768
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=31)
    n_pages = kv.shape[0]
    pt[0, 1], pt[0, 5], pt[1, 0], pt[1, 3], pt[2, 2] = -1, n_pages, -(2**31), n_pages + 12345, 2**31 - 1
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    clamped = pt.clamp(0, n_pages - 1)
    assert torch.equal(ref, ix.reference_paged_mqa_logits(q, kv, w, l, clamped, max_seq_len))
    finite = torch.isfinite(ref)
    out = torch.full((len(lens), max_seq_len), float("nan"))
    ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, scaled_dot=scaled_dot, out=out)
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    torch.testing.assert_close(out[finite], ref[finite], rtol=1e-5, atol=1e-4)
    ws = torch.zeros(len(lens), ix.WS_WIDTH, dtype=torch.int32)  # not the shared one: no select zeroes it after
    pm = torch.full_like(out, float("nan"))
    ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, scaled_dot=scaled_dot, out=pm, hist_workspace=ws,
                        page_max=True)
    torch.testing.assert_close(pm[finite], ref[finite], rtol=1e-5, atol=1e-4)
    fused = torch.full((len(lens), INDEX_TOPK), 12345, dtype=torch.int32)
    ix.fused_logits_topk(q, kv, w, l, clamped, max_seq_len, fused, split_pages=8, scaled_dot=scaled_dot)
    raw = torch.full_like(fused, 12345)
    ix.fused_logits_topk(q, kv, w, l, pt, max_seq_len, torch.empty_like(fused), raw, split_pages=8,
                         scaled_dot=scaled_dot)
    assert torch.equal(ix.positions_to_slots(raw.long(), clamped), fused)  # the same positions chosen


def test_empty_cache_with_live_rows_raises():
    q, kv, w, l, pt = make_inputs([10, 20], 128)
    with pytest.raises(ValueError, match="kv must hold at least one page"):
        ix.paged_mqa_logits(q, kv[:0], w, l, pt, 128)
    assert ix.paged_mqa_logits(q, kv[:0], w, l, pt, 0).shape == (2, 0)  # nothing to read: allowed


@pytest.mark.parametrize("bad,match", [
    (lambda a: a.update(q=a["q"].float()), "q must be"),
    (lambda a: a.update(kv=a["kv"][:, :, :, :128]), "kv must be"),
    (lambda a: a.update(weights=a["weights"][:, :32]), "weights must be"),
    (lambda a: a.update(lens=a["lens"].long()), "lens must be"),
    (lambda a: a.update(page_table=a["page_table"].long()), "page_table must be"),
    (lambda a: a.update(max_seq_len=-1), "max_seq_len must be"),
])
def test_bad_logits_input_raises(bad, match):
    q, kv, w, l, pt = make_inputs([10, 20], 128)
    args = dict(q=q, kv=kv, weights=w, lens=l, page_table=pt, max_seq_len=128)
    bad(args)
    with pytest.raises(ValueError, match=match):
        ix.paged_mqa_logits(**args)


def test_bad_topk_input_raises():
    scores, l, pt = torch.randn(2, 128), torch.tensor([5, 6], dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="out_page_indices"):
        ix.topk_transform_paged(scores, l, pt, torch.empty(2, 500, dtype=torch.int32), INDEX_PAGE_SIZE)
    with pytest.raises(ValueError, match="page_size"):
        ix.topk_transform_paged(scores, l, pt, torch.empty(2, 512, dtype=torch.int32), 32)
    with pytest.raises(ValueError, match="seq_lens"):
        ix.topk_transform_paged(scores, l.long(), pt, torch.empty(2, 512, dtype=torch.int32), INDEX_PAGE_SIZE)
    with pytest.raises(ValueError, match="scores"):
        ix.topk_transform_paged(scores.double(), l, pt, torch.empty(2, 512, dtype=torch.int32), INDEX_PAGE_SIZE)


ARCH_PROBE = """
import dataclasses, json
from sglang_sm120.kernels import indexer as ix
from sglang_sm120.kernels.harness.aot import compile_config
shipped = next(c for c in ix.aot_configs() if c.name == "indexer_logits")
plain = dataclasses.replace(shipped, constexprs=dict(shipped.constexprs, USE_SCALED_DOT=False),
                            expect_opcodes=(), forbid_opcodes=())
out = {}
for key, cfg, arch in (("scaled120", shipped, 120), ("plain120", plain, 120), ("plain90", plain, 90)):
    r = compile_config(cfg, arch)
    out[key] = dict(problems=r.problems(cfg), sf=r.count("QMMA.SF"), qmma=r.count("QMMA.16832"),
                    qgmma=r.count("QGMMA"), smem=r.shared_bytes, regs=r.registers, summary=r.summary())
print(json.dumps(out))
"""


def test_sm120_uses_full_rate_block_scaled_fp8_mma():
    """The arch choice, checked in the generated code: on sm_120 the plain fp8 dot is the half-rate
    QMMA.16832 and dot_scaled with unit scales the full-rate QMMA.SF (same registers and shared
    memory); on sm_90 the plain dot is the wgmma QGMMA, which is why sm_90 keeps it."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    proc = subprocess.run([sys.executable, "-c", ARCH_PROBE], capture_output=True, text=True, env=env, cwd="/",
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["scaled120"]["problems"] == [], r["scaled120"]["summary"]
    assert r["scaled120"]["sf"] > 0 and r["scaled120"]["qmma"] == 0
    assert r["plain120"]["qmma"] > 0 and r["plain120"]["sf"] == 0, r["plain120"]["summary"]
    assert (r["plain120"]["smem"], r["plain120"]["regs"]) == (r["scaled120"]["smem"], r["scaled120"]["regs"])
    assert r["plain90"]["qgmma"] > 0, r["plain90"]["summary"]



PAGE_MAX = ix.SelectForm(method="histogram", threshold="page_max")


@pytest.mark.parametrize("finish", ix.HIST_FINISHES)
@pytest.mark.parametrize("k", [512, 64])  # 64: rows of at least k pages, a real bound
@pytest.mark.parametrize("lens,max_seq_len", [
    ([2500, 1999, 0, 300, 2560], 2560),  # fewer pages than K: the bound is the lowest key (list overflows)
    ([4100, 4160, 513, 64, 512], 4160),
])
def test_page_max_plan_matches_reference_and_search(lens, max_seq_len, k, finish):
    """The full indexer call with the page-max threshold: the logits kernel stores page maxima instead of
    counting, the select keeps the logits at or above the bound and finishes from their digit histograms
    (or, finish "registers", in registers up to a block). Twice with other inputs: the workspace is left zeroed."""
    plan = ix.Plan("two_kernel", select=dataclasses.replace(PAGE_MAX, finish=finish))
    for seed in (max_seq_len + 5, max_seq_len + 6):
        q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=seed)
        ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
        out = torch.full((len(lens), k), 12345, dtype=torch.int32)
        raw = torch.full_like(out, 12345)
        ix.indexer_topk(q, kv, w, l, pt, max_seq_len, out, raw, plan=plan)
        assert_selection_matches(out, ref, l, pt, k=k, rel_tol=1e-5)
        assert torch.equal(ix.positions_to_slots(raw.long(), pt), out)
        search = torch.full_like(out, 12345)
        ix.indexer_topk(q, kv, w, l, pt, max_seq_len, search, plan=ix.Plan("two_kernel"))
        assert [sorted(r) for r in out.tolist()] == [sorted(r) for r in search.tolist()]
        assert (ix.hist_workspace(len(lens), "cpu") == 0).all()


def _signed_keys(values):
    bits = values.contiguous().view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()


def _key_prefix16(key):
    return ((key + 2**31) >> 16 << 16) - 2**31


@pytest.mark.parametrize("k", [512, 64, 4096])
def test_logits_page_max_bound(k):
    """The logits kernel's page-max form: each program's elementwise maximum over its pages, as GROUPS
    group maxima; the bound stored is the top 16 key bits of the row's k-th largest group maximum (the
    lowest key with fewer than k groups: 4096), so at most the row's k-th largest logit; the group maxima
    are zeroed again."""
    lens, max_seq_len = [4100, 0, 4160, 64, 700], 4160
    batch = len(lens)
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=40 + k)
    workspace = torch.zeros(batch, ix.WS_WIDTH, dtype=torch.int32)
    logits = ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, hist_workspace=workspace, hist_k=k, page_max=True)
    consts = ix.page_max_consts(batch, max_seq_len)
    pps = ix.logits_pages_per_split(batch, max_seq_len)
    splits = -(-(-(-max_seq_len // INDEX_PAGE_SIZE)) // pps)
    groups = consts["GROUPS"]
    padded = torch.nn.functional.pad(logits, (0, splits * pps * INDEX_PAGE_SIZE - max_seq_len), value=float("-inf"))
    per_program = padded.view(batch, splits, pps, INDEX_PAGE_SIZE).amax(2)  # the elementwise max over pages
    group_max = per_program.view(batch, splits * groups, INDEX_PAGE_SIZE // groups).amax(2)
    assert splits * groups >= 512 and splits * groups < 4096
    for b, n in enumerate(lens):
        assert workspace[b, 2] == 0, "the last program resets the arrival count"
        bound = int(workspace[b, 3])
        if k > splits * groups:
            assert bound == -2**31
            continue
        kth_group = _signed_keys(group_max[b]).sort(descending=True).values[k - 1].item()
        assert bound == _key_prefix16(kth_group)
        if n > k:
            assert bound <= kth_group <= _signed_keys(logits[b, :n]).sort(descending=True).values[k - 1].item()
    assert (workspace[:, ix.WS_H1:] == 0).all()


def finish_kwargs(finish):
    """hist_select's keywords for a SelectForm ``finish``."""
    return dict(reg_finish=finish != "histograms", reg_lean=finish == "registers_lean")


@pytest.mark.parametrize("finish", ix.HIST_FINISHES)
def test_page_max_select_with_ties_clusters_and_overflow(finish):
    """The page-max select from a given bound (any key at or below the K-th largest score): ~700
    candidates (one block), 2900 with 2500 equal scores at the K-th (several blocks), 1500 sharing one
    first digit, every score equal (more than HIST_CAP candidates: the row is rescanned), the lowest bound.
    The page-max finish takes one register block when the list fits HIST_FINAL_BLOCK, else blocks, whatever
    HIST_ONE_BLOCK_MAX_PROGRAMS says (hist_select passes ONE_BLOCK for it). With the finish in registers only the
    first row's list fits it; the others take the histogram finish (which, lean, counts the first digit itself)."""
    _page_max_select_cases(finish)


def _page_max_select_cases(finish="histograms"):
    gen = torch.Generator().manual_seed(77)
    width = 6000
    scores = torch.randn(5, width, generator=gen)
    scores[1, torch.randperm(width, generator=gen)[:2500]] = 1.125
    scores[1, torch.randperm(width, generator=gen)[:300]] = 3.0
    scores[2] = 1.0 + 0.2 * torch.rand(width, generator=gen)  # one first-digit bin
    scores[3] = 1.5
    lens = torch.tensor([6000, 5999, 5800, 4097, 5000], dtype=torch.int32)
    n_cand = [700, 2900, 1500, 1, None]  # the bound: the n-th largest score (None: the lowest key)
    pt_width = -(-width // INDEX_PAGE_SIZE)
    table = torch.stack([torch.randperm(3 * pt_width, generator=gen)[:pt_width] for _ in range(5)]).int()
    workspace = ix.hist_workspace(5, "cpu")
    for b, n in enumerate(n_cand):
        bits = scores[b, :int(lens[b])].sort(descending=True).values[n - 1].view(torch.int32) if n else None
        workspace[b, 3] = int(torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)) if n else -2**31
    out = torch.full((5, INDEX_TOPK), 12345, dtype=torch.int32)
    raw = torch.full_like(out, 12345)
    ix.hist_select(scores, lens, table, out, raw, workspace, page_max=True, **finish_kwargs(finish))
    assert_histogram_selection(raw, out, scores, lens, table)
    assert (workspace == 0).all()


@pytest.mark.parametrize("lean", [False, True])
@pytest.mark.parametrize("k", [512, 64])
def test_page_max_finish_in_registers_extreme_keys(k, lean):
    """The finish in registers (candidate lists of at most HIST_FINAL_BLOCK entries) on keys that stress its
    digit rounds: random scores; 600 equal scores at the K-th; 1000 scores one ulp apart; +inf, +0.0 and -0.0
    (equal keys) above a bound at zero; a row of K + 1 positions (every position a candidate); every list as
    many candidates as the bound lets through, into outputs with a guard after each row."""
    gen = torch.Generator().manual_seed(93 + k)
    width, batch = 3000, 5
    scores = torch.randn(batch, width, generator=gen)
    scores[1] = torch.rand(width, generator=gen) + 1.0
    scores[1, torch.randperm(width, generator=gen)[:600]] = 2.0
    one_ulp_apart = (torch.tensor(1.0).view(torch.int32) + torch.arange(1000, dtype=torch.int32)).view(torch.float32)
    scores[2] = torch.rand(width, generator=gen) * 0.5
    scores[2, torch.randperm(width, generator=gen)[:1000]] = one_ulp_apart[torch.randperm(1000, generator=gen)]
    scores[3] = -1.0
    zeros = torch.randperm(width, generator=gen)[:800]
    scores[3, zeros] = torch.where(torch.rand(800, generator=gen) < 0.5, 0.0, -0.0)
    scores[3, zeros[:5]] = float("inf")
    lens = torch.tensor([width, width - 7, width, 2999, k + 1], dtype=torch.int32)
    bounds = [scores[0].sort(descending=True).values[699], 2.0, 1.0, 0.0, None]
    pt_width = -(-width // INDEX_PAGE_SIZE)
    table = torch.stack([torch.randperm(2 * pt_width, generator=gen)[:pt_width] for _ in range(batch)]).int()
    workspace = ix.hist_workspace(batch, "cpu")
    for b, bound in enumerate(bounds):
        bits = torch.tensor([float(bound)]).view(torch.int32) if bound is not None else None
        workspace[b, ix.WS_THR1.value] = int(torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)) if bound is not None \
            else -2**31
    guarded_out, guarded_raw = (torch.full((batch, 2 * k), 12345, dtype=torch.int32) for _ in range(2))
    out, raw = guarded_out[:, :k], guarded_raw[:, :k]
    ix.hist_select(scores, lens, table, out, raw, workspace, page_max=True, reg_finish=True, reg_lean=lean)
    assert (guarded_out[:, k:] == 12345).all() and (guarded_raw[:, k:] == 12345).all()
    assert_histogram_selection(raw, out, scores, lens, table, k=k)
    assert (workspace == 0).all()


@pytest.mark.parametrize("finish", ix.HIST_FINISHES)
@pytest.mark.parametrize("below", [1500, 7500])
def test_page_max_overflow_with_logits_below_the_bound_in_its_bin(below, finish):
    """More than HIST_CAP candidates (the row is rescanned) and many logits just below the bound that share
    the K-th score's first digit (1.51 under 1.55: same sign, exponent and top two mantissa bits). The rescan
    counts those too; with 7500 of them the second digit's threshold was once taken from the candidates' count
    alone and the finish wrote thousands of slots past the row's k (caught here by a guard after the row)."""
    gen = torch.Generator().manual_seed(91)
    width = 4500 + below
    scores = torch.full((1, width), 1.51)
    scores[0, torch.randperm(width, generator=gen)[:4500]] = 1.55
    lens = torch.tensor([width], dtype=torch.int32)
    pt_width = -(-width // INDEX_PAGE_SIZE)
    table = torch.randperm(2 * pt_width, generator=gen)[:pt_width].int()[None]
    workspace = ix.hist_workspace(1, "cpu")
    workspace[0, ix.WS_THR1.value] = int(torch.tensor([1.55]).view(torch.int32))  # the bound: the K-th score itself
    guarded_out, guarded_raw = (torch.full((1, 16 * INDEX_TOPK), 12345, dtype=torch.int32) for _ in range(2))
    out, raw = guarded_out[:, :INDEX_TOPK], guarded_raw[:, :INDEX_TOPK]
    ix.hist_select(scores, lens, table, out, raw, workspace, page_max=True, **finish_kwargs(finish))
    assert (guarded_out[:, INDEX_TOPK:] == 12345).all() and (guarded_raw[:, INDEX_TOPK:] == 12345).all()
    assert_histogram_selection(raw, out, scores, lens, table)
    assert (workspace == 0).all()


@pytest.mark.parametrize("k", [512, 64])
def test_histogram_one_copy_plan_and_threshold(k):
    """The count into one histogram copy (SelectForm copies=1, the B 3-4 / 9-16 x 8193-16384 buckets): the
    logits kernel's threshold bin as with 8 copies, the full indexer call exact, the workspace left zeroed."""
    lens, max_seq_len = [4100, 4160, 513, 64, 0], 4160
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=60 + k)
    eight, one = (torch.zeros(len(lens), ix.WS_WIDTH, dtype=torch.int32) for _ in range(2))
    ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, hist_workspace=eight, hist_k=k)
    ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, hist_workspace=one, hist_k=k, hist_copies=1)
    assert torch.equal(eight[:, :16], one[:, :16]) and (one[:, ix.WS_H1:] == 0).all()
    with pytest.raises(ValueError, match="hist_copies"):
        ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, hist_workspace=one, hist_copies=16)
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    out = torch.full((len(lens), k), 12345, dtype=torch.int32)
    ix.indexer_topk(q, kv, w, l, pt, max_seq_len, out, plan=ix.Plan("two_kernel", select=FORMS_BY_NAME["hist1"]))
    assert_selection_matches(out, ref, l, pt, k=k, rel_tol=1e-5)
    assert (ix.hist_workspace(len(lens), "cpu") == 0).all()


@pytest.mark.parametrize("k", [512, 64])
@pytest.mark.parametrize("lens,max_seq_len", [
    ([2500, 1999, 0, 300, 2560], 2560),  # fewer groups than K: every logit a candidate, the list overflows
    ([4100, 4160, 513, 64, 512, 1], 4160),  # ragged, not multiples of 64, at / around K, one position
])
@pytest.mark.parametrize("programs", [ix.LOGITS_TARGET_PROGRAMS, 64])
def test_page_max_overlap(lens, max_seq_len, k, programs):
    """The page-max overlap form (SelectForm.overlap_programs, H200 run 14): the logits grid row-major with the
    per-row ready flag, the select waiting for its row's flag: the same logits as the default grid, the selection
    exact against the reference and the same set as the page-max launch of the default grid (pages in random
    order), ties included; every flag and counter of the workspace zero again after each call, so calls can follow
    one another. ``programs``: the overlap form's logits programs (64 here: several pages per program, fewer group
    maxima per program; the default grid keeps its own)."""
    if programs < ix.LOGITS_TARGET_PROGRAMS:
        assert ix.logits_pages_per_split(len(lens), max_seq_len, programs) > 1
        assert ix.logits_pages_per_split(len(lens), max_seq_len) == 1  # the other forms keep their programs
    plan = ix.Plan("two_kernel", select=PAGE_MAX)
    overlap_plan = ix.Plan("two_kernel", select=dataclasses.replace(PAGE_MAX, overlap_programs=programs))
    for seed in (max_seq_len + 11, max_seq_len + 12):
        q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=seed)
        if seed % 2:  # ties: a run of equal index-K rows (equal logits) in every row's first pages
            kv[:, 8:40] = kv[:, 8:9]
        ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
        shipped = torch.full((len(lens), k), 12345, dtype=torch.int32)
        ix.indexer_topk(q, kv, w, l, pt, max_seq_len, shipped, plan=plan)
        out = torch.full_like(shipped, 12345)
        raw = torch.full_like(out, 12345)
        ix.indexer_topk(q, kv, w, l, pt, max_seq_len, out, raw, plan=overlap_plan)
        assert_selection_matches(out, ref, l, pt, k=k, rel_tol=1e-5)
        assert torch.equal(ix.positions_to_slots(raw.long(), pt), out)
        assert [sorted(r) for r in out.tolist()] == [sorted(r) for r in shipped.tolist()]
        assert (ix.hist_workspace(len(lens), "cpu") == 0).all()
    workspace = torch.zeros(len(lens), ix.WS_WIDTH, dtype=torch.int32)
    logits = ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, hist_workspace=workspace, hist_k=k, page_max=True,
                                 overlap_programs=programs)
    plain = ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    assert torch.equal(logits, plain)
    assert (workspace[:, ix.WS_READY.value] == 1).all() and (workspace[:, ix.WS_DONE.value] == 0).all()


def test_one_or_two_short_rows_take_the_rank_select():
    """Runs 19 / 20: one or two rows up to 4096 compressed positions (16K context) take the rank select (8 rows per
    program, 8 warps, for one row of up to 2048; else 16 rows, 4 warps); a logits row from elsewhere too (the rank
    select reads the scores row); three rows at 2048 keep the double-warp search, longer rows their buckets."""
    for batch, positions, rows, warps_mul in ((1, 1, 8, 2), (1, 2048, 8, 2), (2, 2048, 16, 1), (1, 2049, 16, 1),
                                              (1, 4096, 16, 1), (2, 4096, 16, 1)):
        plan = ix.choose_plan(batch, positions)
        assert plan.select == ix.SelectForm(method="rank", rank_rows=rows, warps_mul=warps_mul)
        assert plan.scores_select == plan.select and plan.path == "two_kernel"
        assert ix.launch_pdl("cpu", batch, plan.select) is False  # no PDL on the CPU
    assert ix.choose_plan(3, 2048).select == ix.SelectForm(warps_mul=2)
    assert ix.choose_plan(1, 8193).select.method == "histogram"
    assert ix.choose_plan(1, 4097).select == ix.SelectForm() == ix.choose_plan(2, 4097).select


def test_page_max_overlap_dispatch():
    """Run 14: the overlap form with PAGE_MAX_OVERLAP_PROGRAMS logits programs in the page-max bucket it won
    (B 17-32 x 32769-65536 positions); runs 21 / 22: with the lean register finish at B 33-64 x 16385-65536; run 22:
    B 17-32 x 16385-32768 on the page max without the overlap. B <= 16 keeps the default grid, shorter rows their
    forms. overlap_programs belongs to the page-max threshold alone."""
    ov = ix.PAGE_MAX_OVERLAP_PROGRAMS
    for batch, positions, finish in ((17, 32769, "histograms"), (32, 65536, "histograms"), (24, 40000, "histograms"),
                                     (33, 16385, "registers_lean"), (40, 40000, "registers_lean"),
                                     (64, 65536, "registers_lean")):
        form = ix.choose_plan(batch, positions).select
        assert (form.threshold, form.overlap_programs, form.finish) == ("page_max", ov, finish)
        assert ix.choose_plan(batch, positions).scores_select.method == "search"
        assert ix.page_max_consts(batch, positions, ov)["ROW_MAJOR"]
        assert ix.page_max_consts(batch, positions, ov)["NPM"] <= ix.PAGE_MAX_KEYS
    for batch, positions in ((16, 65536), (9, 40000), (17, 16385), (32, 32768)):
        form = ix.choose_plan(batch, positions).select
        assert (form.threshold, form.overlap_programs, form.finish) == ("page_max", 0, "histograms")
    for batch, positions in ((32, 32768), (32, 16384), (1, 65536), (128, 65536)):
        assert ix.choose_plan(batch, positions).select.overlap_programs == 0
    assert not ix.page_max_consts(32, 65536)["ROW_MAJOR"]
    assert ix.logits_pages_per_split(32, 65536, ov) * 2 == ix.logits_pages_per_split(32, 65536)
    for bad in (dict(overlap_programs=ov), dict(method="histogram", overlap_programs=ov),
                dict(method="histogram", threshold="page_max", overlap_programs=-1)):
        with pytest.raises(ValueError, match="overlap_programs"):
            ix.SelectForm(**bad)


def random_select_form(r: random.Random) -> ix.SelectForm:
    method = r.choice(["search", "histogram", "histogram", "rank"])
    if method == "search":
        return ix.SelectForm(warps_mul=r.choice([1, 2]))
    if method == "rank":
        return ix.SelectForm(method="rank", rank_rows=r.choice([4, 8, 16, 32]), warps_mul=r.choice([1, 2]))
    if r.random() < 0.4:
        return ix.SelectForm(method="histogram", copies=r.choice([None, 1, 2]))
    return ix.SelectForm(method="histogram", threshold="page_max", finish=r.choice(ix.HIST_FINISHES),
                         overlap_programs=r.choice([0, 0, 8, 32]))


@pytest.mark.parametrize("seed", range(24))
def test_random_calls_select_the_reference_top_k(seed):
    """A sweep of random valid calls: batch, logits width, lengths (0, 1, past the width, ragged), k, and the path
    (default plan, two kernels with a random select form, fused with a random split) against the reference."""
    r = random.Random(seed)
    batch = r.choice([1, 2, 3, 5])
    max_seq_len = r.choice([1, 63, 64, 65, 300, 512, 513, 1000, 2100])
    lens = [r.choice([0, 1, r.randint(0, max_seq_len), max_seq_len, max_seq_len + r.randint(1, 100)])
            for _ in range(batch)]
    k = r.choice([512, 512, 64, 256])
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=seed)
    form = random_select_form(r)
    plan = r.choice([None, ix.Plan("two_kernel", select=form),
                     ix.Plan("fused", r.choice([8, 16, 32, 64]),
                             select=form if form.method == "search" else ix.SelectForm())])
    out = torch.full((batch, k), 12345, dtype=torch.int32)
    ix.indexer_topk(q, kv, w, l, pt, max_seq_len, out, plan=plan)
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    assert_selection_matches(out, ref, lens, pt, k=k, rel_tol=1e-4)


@pytest.mark.parametrize("seed", range(16))
def test_random_page_tables_match_reference_logits(seed):
    """Logits over page tables narrower or wider than the width needs, with an id outside the cache now and then
    (clamped into it, as the reference reads it), both dot forms."""
    r = random.Random(seed)
    batch, max_seq_len = r.choice([1, 2, 4]), r.choice([1, 64, 100, 640, 1500])
    lens = [r.choice([0, r.randint(0, max_seq_len + 200), max_seq_len]) for _ in range(batch)]
    need = -(-max_seq_len // INDEX_PAGE_SIZE)
    q, kv, w, l, pt = make_inputs(lens, max_seq_len, seed=seed, pt_width=r.choice([need, max(1, need - 2), need + 3]))
    if r.random() < 0.5:
        pt.view(-1)[r.randrange(pt.numel())] = r.choice([-1, kv.shape[0], kv.shape[0] + 7, -(2 ** 31)])
    out = torch.full((batch, max_seq_len), float("nan"))
    ix.paged_mqa_logits(q, kv, w, l, pt, max_seq_len, scaled_dot=r.choice([None, False, True]), out=out)
    ref = ix.reference_paged_mqa_logits(q, kv, w, l, pt, max_seq_len)
    assert not out.isnan().any() and torch.equal(torch.isneginf(out), torch.isneginf(ref))
    finite = torch.isfinite(ref)
    torch.testing.assert_close(out[finite], ref[finite], rtol=1e-5, atol=1e-4)
