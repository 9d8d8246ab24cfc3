"""Lightning indexer for DeepSeek-V4-Flash decode: FP8 paged MQA logits and top-512 selection.

Contract (SGLang 0.5.23, ``fp8_paged_mqa_logits_torch_sm120`` / ``tilelang_fp8_paged_mqa_logits``
and ``topk_transform_paged``):

* ``q`` ``[B, 1, 64, 128]`` float8_e4m3fn; ``kv`` ``[pages, 64, 1, 132]`` uint8, page-major: 64 rows
  of 128 fp8 bytes, then 64 fp32 scales; ``weights`` ``[B, 64]`` fp32; ``lens`` ``[B]`` int32
  (compressed lengths); ``page_table`` ``[B, max_pages]`` int32.
* logits ``[B, max_seq_len]`` fp32: ``scale[t] * sum_h relu(q[h] . k[t]) * w[h]``, ``-inf`` past each
  length.
* top-k: ``out[b, j]`` = ``page_table[b, i // 64] * 64 + i % 64`` for the ``K`` (512) selected
  positions ``i``, ``-1`` past ``min(length, K)``. Rows of at most ``K`` positions list them in order
  (as upstream does); longer rows list the selection in ascending position order with the search
  forms, best first with the rank select, in no fixed order with the histogram select (slots are
  claimed with atomics; upstream's order is unspecified). Among equal scores at the threshold the
  search forms and the rank select take the lowest positions; the histogram select takes any of them
  (the selected scores are the same).

Two paths, both graph-capturable (grids and scratch depend on shapes only):

* two-kernel: :func:`paged_mqa_logits` writes the logits row, then :func:`topk_transform_paged` selects
  per chunk of the row and merges the chunks' candidates (a small tree of :func:`_select_kernel`).
* fused: :func:`_fused_split_kernel` computes the logits of a split of ``R_PAGES`` pages in registers
  and writes only that split's top-``K`` candidates; the same merge finishes. The full logits row is
  never written. :data:`PLAN_TABLE` records which path the H200 benchmark chose per shape.

Tensor cores: on sm_120 a plain fp8 ``tl.dot`` becomes ``QMMA.16832`` which runs at half the 8-bit
rate, while ``tl.dot_scaled(..e4m3.., ..e4m3..)`` with unit (127) E8M0 scales becomes the full-rate
``QMMA.SF.16832...E8`` with identical numerics; on sm_90 ``dot_scaled`` is emulated (bf16 HGMMA plus
conversions), so the plain fp8 dot (``QGMMA``) is used there. :func:`use_scaled_dot` picks by arch.

Selection: scores map to order-preserving int32 keys; a 32-step bitwise search finds the K-th
largest key of a block held in registers, and cumulative sums compact the winners. The histogram
select (:func:`hist_select`) instead counts the keys' top 11 bits per row inside the logits kernel,
sends everything above the K-th key's bin out in one split pass whose last program per row
finishes the row from two more digit histograms. Its page-max form (H200 run 11b) has the logits
kernel keep each program's elementwise maximum over its pages instead of counting (no atomic per
logit); the row's last logits program turns the group maxima into a bound at or below the K-th logit,
the split pass keeps the ~1 % of logits at or above it and the last program finishes from their digit
histograms. :class:`SelectForm` (search, histogram or rank, largest chunk, warps, threshold, copies) is
chosen per shape in :data:`PLAN_TABLE`. At one or two short rows the rank select (:func:`rank_select`)
replaces the search: every pair of a row's positions is compared in one launch and each of the K best
writes its slot id at its rank, so no search round depends on another.

Launches (H200 run 9, :data:`USE_PDL`): the two-kernel path launches with programmatic dependent launch
at B <= 16 with the histogram select, the rank select or the double-warp search (:func:`launch_pdl`). Every kernel waits
(``griddepcontrol.wait``) before its first load: the logits kernel's inputs (q and the weights, lengths,
page table, index-K cache) may all be written by the kernels just before it, and the later launches of
the chain read only the previous launch's output, so there is no independent prologue to overlap (no
later launch reads the index-K cache); what PDL saves is each launch's start-up behind the previous
kernel's tail.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .dsv4 import (
    INDEX_HEAD_DIM,
    INDEX_MAX_BATCH,
    INDEX_MAX_COMPRESSED_LEN,
    INDEX_N_HEADS,
    INDEX_PAGE_BYTES,
    INDEX_PAGE_SIZE,
    INDEX_SCALE_OFFSET,
    INDEX_TOKEN_BYTES,
    INDEX_TOPK,
)
from .harness.aot import AotConfig, register_cap_option
from .pdl import PDL_OPCODES, pdl_launch_dependents, pdl_supported, pdl_wait

FP8 = torch.float8_e4m3fn
E8M0_ONE = 127  # E8M0 exponent byte of 1.0: unit block scales for the full-rate sm_120 fp8 MMA
MX_BLOCK = 32  # values per E8M0 scale along K in tl.dot_scaled
PAGE_WORDS = INDEX_PAGE_BYTES // 4  # 2112 fp32 words per index-K page
SCALE_WORD_OFFSET = INDEX_SCALE_OFFSET // 4  # 2048

MAX_TOPK = 1024
SELECT_CHUNKS = (512, 1024, 2048, 4096, 8192)  # positions one select program holds in registers
SELECT_MAX_CHUNK = 4096  # largest chunk by default (8192: fewer merge levels, 16 warps)
SELECT_MAX_WARPS = 16
RANK_ROWS = (4, 8, 16, 32)  # positions one rank-select program ranks (SelectForm.rank_rows)
RANK_BLOCK_J = 2048  # positions a rank-select program compares against per loop step
FUSED_SPLIT_PAGES = (8, 16, 32, 64)  # pages one fused program scores and reduces to K candidates
LOGITS_TARGET_PROGRAMS = 1024  # two-kernel path: split rows so that about this many programs run
# The page-max overlap form's logits programs per launch (SelectForm.overlap_programs; H200 run 14): several waves
# (1024 programs are about one), so that in its row-major grid rows finish one after another
PAGE_MAX_OVERLAP_PROGRAMS = 2048
LOGITS_NUM_WARPS, LOGITS_NUM_STAGES = 4, 3
# Histogram select: the order-preserving key in three digits (11 + 11 + 10 bits). Workspace row
# (int32; zero between calls: each call leaves it zeroed): counters, the second and third digits'
# histograms, then the first digit's histogram in HIST_COPIES copies. The logits kernel counts
# each logit with one relaxed atomic into copy ``position % HIST_COPIES`` of its bin; the logits
# fill only a few dozen bins, so updates to one address serialise at L2. The copies lie copy-major
# (copy * 2048 + bin: each copy its own cache lines and L2 slices). H200 run 6
# (benchmarks/indexer-h200-run6-summary.md): 8 copy-major copies beat the earlier interleaved ones
# (bin * 8 + copy, one 32-byte sector per bin) at all 7 long-context shapes (B=64 x 256K 232.8 vs
# 262.0 us, B=1 x 1M 65.7 vs 81.4); summing each program's bins first with ``tl.histogram`` (2048
# bins) and adding only the non-empty ones was 2-18x slower; 16 or 32 copies (run 6b) were slower
# except at B=1 x 1M (the last program's reduction reads every copy).
HIST_DIGITS = (11, 11, 10)
HIST_COPIES = 8
WS_ABOVE = tl.constexpr(0)  # entries the split pass sent out
WS_TIE = tl.constexpr(1)  # entries in the first digit's threshold bin
WS_DONE = tl.constexpr(2)  # counting programs finished (the last one reduces the first digit)
WS_THR1 = tl.constexpr(3)  # the first digit's threshold bin
WS_ABOVE1 = tl.constexpr(4)  # entries in the bins above it
WS_SPLIT_DONE = tl.constexpr(5)  # split programs finished (folded form: the last one finishes the row)
WS_READY = tl.constexpr(6)  # page-max overlap form: the row's bound and logits are ready (set by the logits kernel)
HIST_REDUCE_BLOCK = tl.constexpr(256)  # first-digit bins the reducing program sums at a time
# How the last counting program of a row reduces the first digit's copies (_finish_first_digit)
REDUCE_BLOCKS = tl.constexpr(0)
REDUCE_ONE_SHOT = tl.constexpr(1)
REDUCE_EARLY_EXIT = tl.constexpr(2)
_REDUCE_NAMES = {0: "blocks", 1: "one_shot", 2: "early_exit"}
WS_H2 = 16
WS_H3 = WS_H2 + (1 << HIST_DIGITS[1])
WS_H1 = WS_H3 + (1 << HIST_DIGITS[2])  # the counters and H2/H3 lie below: the final program zeroes them
WS_WIDTH = WS_H1 + (1 << HIST_DIGITS[0]) * HIST_COPIES
# The page-max threshold (SelectForm threshold="page_max") uses the first digit's region instead of counting
# into it: the candidates' first-digit histogram in copy 0 (zeroed with the counters by the finishing program),
# the logits kernel's group maxima (signed-order keys, at most PAGE_MAX_KEYS per row) from copy 1 on (zeroed as
# they are read by the row's last logits program).
WS_CAND_H1 = tl.constexpr(WS_H1)
WS_PMAX = WS_H1 + (1 << HIST_DIGITS[0])
PAGE_MAX_CLEAN = WS_PMAX  # what the page-max form's finishing program zeroes (counters, H2, H3, copy 0)
PAGE_MAX_BOUND_BITS = 16  # bits of the page-max bound (sign, exponent, 7 mantissa bits: within 1/128 below)
PAGE_MAX_KEYS = 2048  # group maxima per row at most (the last logits program's block; sm_120a 118 registers at 4096)
# The page-max overlap form (SelectForm.overlap_programs): the logits grid runs row-major (all programs of row 0
# first, ...) with about PAGE_MAX_OVERLAP_PROGRAMS programs, so rows finish one after another instead of all at the
# end; the row's last logits program publishes a ready flag after its bound; the select launches with PDL (at every
# batch) and each of its programs waits for its own row's flag instead of the whole logits launch, so only the
# last rows' select (and the bound) is exposed. H200 run 14: B=32 x 256K 101.8 -> 98.3 us (shipped for B 17-32 x
# 32769-65536 positions); at B=16 x 256K 58.9 -> 59.2, B=64 x 256K 182.8 -> 180.3 (1.4 %, not shipped); the same
# launch at 1024 programs (one wave, run 13) or 4096 was level or slower.
# The page-max select's finish in registers (SelectForm finish="registers"): key digits per tl.histogram round
# (8: 256 bins, 4 rounds; tl.histogram's per-thread work grows with the bins a lane owns, so 2048-bin rounds cost
# far more, as they did in the logits kernel in run 6)
REG_FINISH_DIGIT_BITS = 8
# Its select launches are capped at the histogram finish's registers on sm_90a under Triton 3.6 (the H200's; 128 at
# 4 warps, 80 at 8), so that the split programs, which share the kernel with the finish, keep their programs per SM
# (uncapped there: 161-168 / 99-103). The caps do not bind on sm_120a / sm_121a under Triton 3.8 (77-120).
REG_FINISH_MAX_REGISTERS = {4: 128, 8: 80}
HIST_CAP = 4096  # threshold-bin candidates kept per row; more (heavy ties) rescans the row
HIST_CHUNKS = (1024, 2048, 4096)  # entries per counting program (a given scores row)
# The select after the first digit (H200 run 7, benchmarks/indexer-h200-run7-summary.md): split
# programs of at most 2048 entries (4 warps; 4096-entry programs of 8 warps were slower), the last
# per row finishing it over 1024-entry blocks of the threshold bin.
HIST_SPLIT_MAX_CHUNK = 2048
# Split programs of 1024 entries where 2048-entry ones would number at most this many (H200 run 10b: B=1 x
# 256K 19.95 -> 19.33 us, B=1 x 64K 13.96 -> 13.39, B=4 x 64K 19.83 -> 19.23, B=16 x 64K 32.74 -> 32.01 at
# 8-128 programs; B=8 x 256K 43.90 / 43.89 at 256; B=10 x 256K 49.92 -> 52.99 and B=16-64 x 256K 3-6 %
# slower above). 4096-entry programs were level at B=16-64 x 256K and slower below.
HIST_SPLIT_SMALL_MAX_PROGRAMS = 128
HIST_FINAL_BLOCK = 1024
assert HIST_FINAL_BLOCK <= HIST_CAP  # the finish in registers loads a whole block of the candidate list
# Launch options by shape, from H200 runs 9 / 9b (benchmarks/indexer-h200-run9-summary.md); module-level so
# that tools/device_indexer.py can time other settings beside them in one run. Run 9b, us, the shipped
# rules against each with one part undone (PDL off; block reduce instead of early exit; not lean):
#
#   B   context  shipped  no PDL  blocks  not lean    B   context  shipped  no PDL  blocks  not lean
#   1   8K       11.9     13.0    11.9    11.9        1   256K     22.1     23.4    22.1    24.1
#   16  8K       13.6     14.7    13.6    13.6        16  256K     75.3     76.0    79.1    78.7
#   1   64K      16.0     17.2    16.0    17.7        32  256K     131.9    131.2   135.1   131.6
#   16  64K      34.2     34.7    34.1    37.1        64  256K     216.5    216.5   219.1   216.3
#   4   64K      22.2*    23.1*   22.4*   24.4*       10  256K     56.8     57.8    59.7    55.0
#   10  64K      29.3     30.0    29.2    31.4        8   256K     46.3     47.4    49.5    49.3
#   (* the histogram select forced; the bitwise search at B=4 x 64K: 30.2 without PDL, 31.6 with)
#
# PDL lost with the plain and 8192-entry searches (run 9: B=64 8K 19.0 -> 22.1, B=64 64K 72.9 -> 78.8,
# B=16 256K 82.1 -> 88.4; run 9b: B=4 64K bitwise 30.2 -> 31.6) and is off there and above B=16. The
# one-shot reduce costs the sm_90 logits kernel 31 registers (65 -> 96: 7 -> 5 programs per SM); run 9:
# logits + count at B=1 8K 12.2 -> 6.5 us, B=16 64K 26.7 -> 23.8 (4 pages per program), but B=64 64K
# 58.8 -> 65.3, B=64 256K 172.3 -> 219.3 (16 and 64 pages); the early-exit reduce has the block reduce's
# registers (run 9b, logits + count: B=64 256K 173.7 -> 169.6, B=16 256K 61.3 -> 58.1). The lean select
# lost at B=10 x 256K (56.8 vs 55.0) and won at the other eight shapes where it runs.
#
# H200 run 10 (benchmarks/indexer-h200-run10-summary.md, us): the split programs claiming one slot per
# entry with an atomic (no prefix sums; _hist_split_part) against run 9's lean / run-7 split programs,
# with 4 or 8 warps per select program (logits + top-512, the default plan; * the histogram forced):
#
#   B   context  run 9   atomic, 4 warps  atomic, 8 warps    B   context  run 9   atomic 4w  atomic 8w
#   16  256K     76.8    69.2             71.3               1   64K      16.3    14.4       13.9
#   32  256K     132.1   122.7            123.2              16  64K      34.0    33.5       32.7
#   64  256K     216.1   197.3            198.3              8   256K     46.0    44.3       43.7
#   1   256K     22.1    20.3             20.0               64  64K      74.6*   67.8*      69.8*
#
# so the atomic split programs replace both earlier forms, with 8 warps where the select runs at most
# HIST_SELECT_8_WARPS_MAX_PROGRAMS programs (between 128 at B=16 x 64K, 2.4 % faster, and 512 at
# B=16 x 256K, 3.0 % slower). Also run 10, not shipped: the logits kernel counting into a per-program
# register window of 16/32 first-digit bins (one atomic per bin instead of per logit) was slower wherever
# programs hold many pages (logits + count B=64 x 256K 168.8 -> 226.5 / 274.7, B=16 x 256K 59.1 -> 64.0;
# sm_90 ptxas 80 registers vs 65) and won only at B=1 x 64K (7.3 -> 6.4); PDL above B=16 gained < 1 %
# (B=64 x 256K 216.1 -> 214.1, B=32 132.1 -> 131.1).
# - PDL (programmatic dependent launch) on the two-kernel path's launches (logits, select levels,
#   histogram select; each waits before its first load) at B <= PDL_MAX_BATCH unless the select is the
#   8192-entry search (launch_pdl).
# - The logits kernel's first-digit reduce (_finish_first_digit): one-shot where its programs hold at
#   most HIST_ONE_SHOT_MAX_PAGES pages, else HIST_LONG_REDUCE.
# - The histogram select's one-block finish (_hist_select_kernel) where it runs at most
#   HIST_ONE_BLOCK_MAX_PROGRAMS programs (run 9's lean rule; the split programs' slot atomics replaced the
#   rest of the lean form in run 10), 8 warps per program up to HIST_SELECT_8_WARPS_MAX_PROGRAMS.
USE_PDL = True
PDL_MAX_BATCH = 16
HIST_ONE_SHOT_MAX_PAGES = 4
HIST_LONG_REDUCE = 2  # REDUCE_EARLY_EXIT
HIST_ONE_BLOCK_MAX_PROGRAMS = 512
HIST_SELECT_8_WARPS_MAX_PROGRAMS = 256


def use_scaled_dot(device: torch.device | str | None = None) -> bool:
    """True on sm_12x (block-scaled fp8 MMA at full rate), False elsewhere (sm_90: emulated)."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] == 12


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _page_logits(q_t, w, kv_fp8_ptr, kv_f32_ptr, page, n_cache_pages, D: tl.constexpr, H: tl.constexpr,
                 PAGE: tl.constexpr, PAGE_BYTES: tl.constexpr, PAGE_WORDS: tl.constexpr,
                 SCALE_WORDS: tl.constexpr, USE_SCALED_DOT: tl.constexpr):
    """[PAGE] logits of one index-K page: sum_h relu(k . q_h) * w_h, times each row's fp32 scale. A page id outside
    the cache's ``n_cache_pages`` reads the nearest page (clamped, as the reference does), never past the cache."""
    tok = tl.arange(0, PAGE)
    d = tl.arange(0, D)
    page64 = tl.minimum(tl.maximum(page, 0), n_cache_pages - 1).to(tl.int64)
    # Whole rows of a page exist even past a row's length; the caller masks those scores.
    k = tl.load(kv_fp8_ptr + page64 * PAGE_BYTES + tok[:, None] * D + d[None, :])
    scale = tl.load(kv_f32_ptr + page64 * PAGE_WORDS + SCALE_WORDS + tok)
    if USE_SCALED_DOT:
        unit_k = tl.full((PAGE, D // 32), 127, tl.uint8)
        unit_q = tl.full((H, D // 32), 127, tl.uint8)
        s = tl.dot_scaled(k, unit_k, "e4m3", q_t, unit_q, "e4m3")
    else:
        s = tl.dot(k, q_t)
    s = tl.maximum(s, 0.0) * w[None, :]
    return tl.sum(s, axis=1) * scale


@triton.jit
def _load_query(q_ptr, w_ptr, b64, stride_qb, stride_wb, D: tl.constexpr, H: tl.constexpr):
    d = tl.arange(0, D)
    h = tl.arange(0, H)
    q_t = tl.load(q_ptr + b64 * stride_qb + h[None, :] * D + d[:, None])  # [D, H]: K-major B operand
    w = tl.load(w_ptr + b64 * stride_wb + h)
    return q_t, w


@triton.jit
def _row_length(lens_ptr, b, max_seq_len, pt_width, PAGE: tl.constexpr):
    """Positions of row b that exist: its length clipped to the logits width and the page table."""
    length = tl.load(lens_ptr + b)
    length = tl.minimum(tl.minimum(length, max_seq_len), pt_width * PAGE)
    return tl.maximum(length, 0)


@triton.jit
def _logits_kernel(q_ptr, kv_fp8_ptr, kv_f32_ptr, w_ptr, lens_ptr, pt_ptr, out_ptr, ws_ptr,
                   max_seq_len, pt_width, n_cache_pages, pages_per_split, stride_qb, stride_wb, stride_ptb, stride_ob,
                   stride_wsb,
                   D: tl.constexpr, H: tl.constexpr, PAGE: tl.constexpr, PAGE_BYTES: tl.constexpr,
                   PAGE_WORDS: tl.constexpr, SCALE_WORDS: tl.constexpr, USE_SCALED_DOT: tl.constexpr,
                   HIST_BITS: tl.constexpr = 0, R: tl.constexpr = 1, K: tl.constexpr = 1, WS_H1: tl.constexpr = 0,
                   PDL: tl.constexpr = False, REDUCE: tl.constexpr = 0, PAGE_MAX: tl.constexpr = False,
                   WS_PMAX_C: tl.constexpr = 0, NPM: tl.constexpr = 1, GROUPS: tl.constexpr = 1,
                   BOUND_BITS: tl.constexpr = 16, ROW_MAJOR: tl.constexpr = False, READY: tl.constexpr = False):
    """Grid (B, splits): each program writes the logits of ``pages_per_split`` pages of one row.
    HIST_BITS > 0 also counts each live logit into its row's first-digit histogram in the
    workspace ``ws_ptr`` (see :func:`_count_first_digit`); the row's last program reduces it.
    PAGE_MAX (with HIST_BITS > 0) instead keeps the elementwise maximum of its pages' logits (the
    largest per page row, no atomics per logit) and stores it as GROUPS group maxima; the row's last
    program turns the row's group maxima into a bound at or below its K-th largest logit
    (:func:`_finish_page_max_bound`). ROW_MAJOR: grid (splits, B) instead, so that the programs of row 0
    start first, then those of row 1, ... (a row's programs run together and rows finish one after another);
    READY (page-max form): the row's last program also publishes that the row's bound and logits are ready
    (WS_READY, release), for the select launched beside it (:func:`hist_select` overlap).
    PDL: every input (q and the weights from the projection just before, lengths, page table,
    index-K cache) may be written by earlier kernels, so the wait comes before any load."""
    if ROW_MAJOR:
        b = tl.program_id(1)
        split = tl.program_id(0)
        n_splits = tl.num_programs(0)
    else:
        b = tl.program_id(0)
        split = tl.program_id(1)
        n_splits = tl.num_programs(1)
    b64 = b.to(tl.int64)
    pdl_wait(PDL)
    pdl_launch_dependents(PDL)
    length = _row_length(lens_ptr, b, max_seq_len, pt_width, PAGE)
    q_t, w = _load_query(q_ptr, w_ptr, b64, stride_qb, stride_wb, D, H)
    tok = tl.arange(0, PAGE)
    out_row = out_ptr + b64 * stride_ob
    p_begin = split * pages_per_split
    p_end = tl.minimum(p_begin + pages_per_split, tl.cdiv(max_seq_len, PAGE))
    p_live = tl.minimum(p_end, tl.cdiv(length, PAGE))
    run_max = tl.full((PAGE,), float("-inf"), tl.float32)  # PAGE_MAX: the largest logit per page row
    for p in range(p_begin, p_live):
        page = tl.load(pt_ptr + b64 * stride_ptb + p)
        vals = _page_logits(q_t, w, kv_fp8_ptr, kv_f32_ptr, page, n_cache_pages, D, H, PAGE, PAGE_BYTES, PAGE_WORDS,
                            SCALE_WORDS, USE_SCALED_DOT)
        pos = p * PAGE + tok
        live_vals = tl.where(pos < length, vals, float("-inf"))
        tl.store(out_row + pos, live_vals, mask=pos < max_seq_len)
        if HIST_BITS > 0:
            if PAGE_MAX:
                run_max = tl.maximum(run_max, live_vals)  # elementwise: no cross-thread work in the loop
            else:
                _count_first_digit(ws_ptr + b64 * stride_wsb, vals, pos, pos < length, HIST_BITS, R, WS_H1)
    for p in range(tl.maximum(p_live, p_begin), p_end):
        pos = p * PAGE + tok
        tl.store(out_row + pos, tl.full((PAGE,), float("-inf"), tl.float32), mask=pos < max_seq_len)
    if HIST_BITS > 0:
        if PAGE_MAX:
            # GROUPS disjoint groups of this program's logits (page rows PAGE // GROUPS apart), their maxima
            group_max = tl.max(tl.reshape(run_max, (GROUPS, PAGE // GROUPS)), axis=1)
            tl.store(ws_ptr + b64 * stride_wsb + WS_PMAX_C + split * GROUPS + tl.arange(0, GROUPS),
                     _signed_key(group_max))
            _finish_page_max_bound(ws_ptr + b64 * stride_wsb, n_splits, K, WS_PMAX_C, NPM, GROUPS, BOUND_BITS, READY)
        else:
            _finish_first_digit(ws_ptr + b64 * stride_wsb, length, K, HIST_BITS, R, WS_H1, REDUCE)


@triton.jit
def _order_key(vals):
    """fp32 -> int32 bits whose unsigned order is the float order (-0.0 and +0.0 equal)."""
    bits = (vals + 0.0).to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # signed int order == float order
    return key ^ tl.full((), -2147483648, tl.int32)


@triton.jit
def _signed_key(vals):
    """fp32 -> int32 whose signed order is the float order (-0.0 and +0.0 equal)."""
    bits = (vals + 0.0).to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _key_prefix_bound(key, valid, need, BITS: tl.constexpr):
    """The largest signed key ``t`` whose low ``32 - BITS`` bits are zero with at least ``need`` of
    ``key[valid]`` at or above it: the K-th largest key's top BITS bits (so ``t`` <= it), or the lowest
    key when fewer than ``need`` are valid. BITS block-wide counts (the bitwise search's first rounds).
    Counting 4 or 16 candidate prefixes per round ([keys, 4] / [keys, 16] compares, one reduction) was
    tried in round 20 and dropped untimed: the logits kernel's registers went 71 -> 109 (sm_90a) and spilled."""
    sign = tl.full((), -2147483648, tl.int32)
    thr_u = tl.full((), 0, tl.int32)  # in unsigned order (u = key ^ sign)
    for i in tl.static_range(BITS):
        cand_u = thr_u | (tl.full((), 1, tl.int32) << (31 - i))
        count = tl.sum((valid & (key >= (cand_u ^ sign))).to(tl.int32), axis=0)
        thr_u = tl.where(count >= need, cand_u, thr_u)
    return thr_u ^ sign


@triton.jit
def _finish_page_max_bound(ws_row, n_splits, K: tl.constexpr, WS_PMAX_C: tl.constexpr, NPM: tl.constexpr,
                           GROUPS: tl.constexpr, BOUND_BITS: tl.constexpr, READY: tl.constexpr = False):
    """Called by every logits program of a row at its end (PAGE_MAX form); the last one to finish
    reads the row's group maxima (GROUPS per program; zeroing them for the next call) and stores in
    WS_THR1 a signed key at or below the K-th largest of them. K disjoint groups hold a logit at or
    above it, so it is at or below the row's K-th largest logit too: the select need only look at the
    logits at or above it (about 1 % of a row of random scores with 1024-4096 groups). Groups past the
    row's length hold -inf; fewer than K groups: the lowest key (every logit is a candidate). READY: then
    sets WS_READY (release: the row's logits, stored by every program before its arrival, and the bound are
    visible to whoever reads the flag with acquire)."""
    tl.debug_barrier()  # all of this program's group maxima stored before its arrival is published
    arrived = tl.atomic_add(ws_row + WS_DONE, 1, sem="acq_rel")
    if arrived == n_splits - 1:
        idx = tl.arange(0, NPM)
        live = idx < n_splits * GROUPS
        key = tl.load(ws_row + WS_PMAX_C + idx, mask=live, other=0, cache_modifier=".cg")
        tl.store(ws_row + WS_PMAX_C + idx, tl.zeros((NPM,), tl.int32), mask=live)
        tl.store(ws_row + WS_THR1, _key_prefix_bound(key, live, K, BOUND_BITS))
        tl.store(ws_row + WS_DONE, 0)  # every program has arrived: ready for the next call
        if READY:
            tl.debug_barrier()  # the bound and the zeroing performed before the flag
            tl.atomic_xchg(ws_row + WS_READY, 1, sem="release")


@triton.jit
def _key_bits(key_u, skip: tl.constexpr, n: tl.constexpr):
    """Bits [32 - skip - n, 32 - skip) of an unsigned-order key, as a non-negative int32."""
    return (key_u >> (32 - skip - n)) & ((1 << n) - 1)


@triton.jit
def _count_first_digit(ws_row, vals, pos, valid, B1: tl.constexpr, R: tl.constexpr, WS_H1: tl.constexpr):
    """Count each valid value into copy ``pos % R`` of its first-digit bin (relaxed atomics; the
    copies lie copy-major, a whole histogram apart)."""
    bins = _key_bits(_order_key(vals), 0, B1)
    tl.atomic_add(ws_row + WS_H1 + (pos % R) * (1 << B1) + bins, tl.full(vals.shape, 1, tl.int32), mask=valid,
                  sem="relaxed")


@triton.jit
def _finish_first_digit(ws_row, length, K: tl.constexpr, B1: tl.constexpr, R: tl.constexpr,
                        WS_H1: tl.constexpr, REDUCE: tl.constexpr = 0):
    """Called by every counting program of a row at its end; the last one to finish sums the R
    copies of the first-digit histogram (zeroing them for the next call), and stores the bin of
    the K-th largest key and how many keys lie above that bin. How (:data:`REDUCE_BLOCKS` ...):
    in 256-bin blocks from the top, each block's loads one L2 round trip after the previous block's
    (its zeroing stores lie between); the same with the loads of the blocks below the threshold's
    masked off (they only need zeroing: round trips only down to the threshold's block); or all R
    copies of all bins loaded before any is used (one round trip, but about 30 more registers on
    sm_90, which cost the page loop occupancy when it is long)."""
    tl.debug_barrier()  # all of this program's counts performed before its arrival is published
    arrived = tl.atomic_add(ws_row + WS_DONE, 1, sem="acq_rel")
    if REDUCE == REDUCE_ONE_SHOT and arrived == tl.num_programs(1) - 1:
        NBINS: tl.constexpr = 1 << B1
        bins = tl.arange(0, NBINS)
        hist = tl.zeros((NBINS,), tl.int32)
        for c in tl.static_range(R):
            hist += tl.load(ws_row + WS_H1 + c * NBINS + bins, cache_modifier=".cg")
        for c in tl.static_range(R):
            tl.store(ws_row + WS_H1 + c * NBINS + bins, tl.zeros((NBINS,), tl.int32))
        thr, above = _threshold_bin(hist, tl.sum(hist, axis=0), K, NBINS)
        tl.store(ws_row + WS_THR1, thr)
        tl.store(ws_row + WS_ABOVE1, tl.where(thr < 0, 0, above))
        tl.store(ws_row + WS_DONE, 0)  # every program has arrived: ready for the next call
    if REDUCE != REDUCE_ONE_SHOT and arrived == tl.num_programs(1) - 1:
        BLOCK: tl.constexpr = HIST_REDUCE_BLOCK
        bins = tl.arange(0, BLOCK)
        copies = tl.arange(0, R)
        running = tl.full((), 0, tl.int32)  # keys in the bins above the current block
        thr = tl.full((), -1, tl.int32)
        above = tl.full((), 0, tl.int32)
        for i in tl.static_range((1 << B1) // BLOCK):
            base = ((1 << B1) // BLOCK - 1 - i) * BLOCK  # from the top block down
            ptrs = ws_row + WS_H1 + copies[None, :] * (1 << B1) + (base + bins)[:, None]
            if REDUCE == REDUCE_EARLY_EXIT:
                hist = tl.sum(tl.load(ptrs, mask=thr < 0, other=0, cache_modifier=".cg"), axis=1)
            else:
                hist = tl.sum(tl.load(ptrs, cache_modifier=".cg"), axis=1)
            tl.store(ptrs, tl.zeros((BLOCK, R), tl.int32))
            at_or_above = running + tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
            hits = tl.sum((at_or_above >= K).to(tl.int32), axis=0)
            first = (thr < 0) & (hits > 0)
            thr = tl.where(first, base + hits - 1, thr)
            above = tl.where(first, running + tl.sum(tl.where(bins > hits - 1, hist, 0), axis=0), above)
            running += tl.sum(hist, axis=0)
        tl.store(ws_row + WS_THR1, thr)
        tl.store(ws_row + WS_ABOVE1, above)
        tl.store(ws_row + WS_DONE, 0)  # every program has arrived: ready for the next call


@triton.jit
def _kth_key_bitwise(key, valid, k_eff):
    """The k_eff-th largest signed key of ``key[valid]``, built bit by bit from the top (32
    block-wide counts)."""
    sign = tl.full((), -2147483648, tl.int32)
    thr_u = tl.full((), 0, tl.int32)  # in unsigned order (u = key ^ sign)
    for i in tl.static_range(32):
        cand_u = thr_u | (tl.full((), 1, tl.int32) << (31 - i))
        count = tl.sum((valid & (key >= (cand_u ^ sign))).to(tl.int32), axis=0)
        thr_u = tl.where(count >= k_eff, cand_u, thr_u)
    return thr_u ^ sign


@triton.jit
def _select(vals, valid, K: tl.constexpr, N: tl.constexpr):
    """Pick the K largest of ``vals[valid]`` (all valid ones if fewer). Returns (selected mask,
    output slot of each selected element in block order, number selected).

    The K-th largest key comes from 32 block-wide counts (bitwise search). The search costs
    per-thread instructions more than block-wide reductions: fewer, heavier rounds (4-bin radix
    rounds, removed; 16-bin histograms; 256-bin ``tl.histogram`` in run 2) measured slower on the
    H200 (benchmarks/indexer-h200-run4-summary.md, -run5-summary.md, -run2-radix.md)."""
    n_valid = tl.sum(valid.to(tl.int32), axis=0)
    k_eff = tl.minimum(n_valid, K)
    if N <= K:
        sel = valid
    else:
        bits = (vals + 0.0).to(tl.int32, bitcast=True)  # -0.0 -> +0.0: equal scores, equal keys
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # signed int order == float order
        thr = _kth_key_bitwise(key, valid, k_eff)
        above = valid & (key > thr)
        tie = valid & (key == thr)
        n_above = tl.sum(above.to(tl.int32), axis=0)
        tie_rank = tl.cumsum(tie.to(tl.int32), axis=0) - 1
        sel = above | (tie & (tie_rank < k_eff - n_above))
    slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    return sel, slot, k_eff


@triton.jit
def _store_candidates(out_val_ptr, out_pos_ptr, vals, pos, sel, slot, k_eff, K_OUT: tl.constexpr):
    tl.store(out_val_ptr + slot, vals, mask=sel)
    tl.store(out_pos_ptr + slot, pos, mask=sel)
    j = tl.arange(0, K_OUT)
    tl.store(out_val_ptr + j, tl.full((K_OUT,), float("-inf"), tl.float32), mask=j >= k_eff)
    tl.store(out_pos_ptr + j, tl.full((K_OUT,), -1, tl.int32), mask=j >= k_eff)


@triton.jit
def _fused_split_kernel(q_ptr, kv_fp8_ptr, kv_f32_ptr, w_ptr, lens_ptr, pt_ptr, cand_val_ptr, cand_pos_ptr,
                        max_seq_len, pt_width, n_cache_pages, stride_qb, stride_wb, stride_ptb, stride_cb,
                        D: tl.constexpr, H: tl.constexpr, PAGE: tl.constexpr, PAGE_BYTES: tl.constexpr,
                        PAGE_WORDS: tl.constexpr, SCALE_WORDS: tl.constexpr, R_PAGES: tl.constexpr,
                        K: tl.constexpr, CB: tl.constexpr, USE_SCALED_DOT: tl.constexpr):
    """Grid (B, splits): score R_PAGES pages of one row in registers and write their top-K
    (value, position) candidates; the logits never leave the program."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    b64 = b.to(tl.int64)
    length = _row_length(lens_ptr, b, max_seq_len, pt_width, PAGE)
    q_t, w = _load_query(q_ptr, w_ptr, b64, stride_qb, stride_wb, D, H)
    rows = tl.arange(0, R_PAGES)
    tok = tl.arange(0, PAGE)
    p_begin = split * R_PAGES
    n_live = tl.minimum(tl.maximum(tl.cdiv(length, PAGE) - p_begin, 0), R_PAGES)
    tile = tl.full((R_PAGES, PAGE), float("-inf"), tl.float32)
    for i in range(n_live):
        page = tl.load(pt_ptr + b64 * stride_ptb + p_begin + i)
        vals = _page_logits(q_t, w, kv_fp8_ptr, kv_f32_ptr, page, n_cache_pages, D, H, PAGE, PAGE_BYTES, PAGE_WORDS,
                            SCALE_WORDS, USE_SCALED_DOT)
        tile = tl.where(rows[:, None] == i, vals[None, :], tile)
    pos = (p_begin + rows)[:, None] * PAGE + tok[None, :]
    valid = pos < length
    vals = tl.reshape(tile, (R_PAGES * PAGE,))
    pos = tl.reshape(pos, (R_PAGES * PAGE,))
    valid = tl.reshape(valid, (R_PAGES * PAGE,))
    sel, slot, k_eff = _select(vals, valid, K, R_PAGES * PAGE)
    base = b64 * stride_cb + split * CB
    _store_candidates(cand_val_ptr + base, cand_pos_ptr + base, vals, pos, sel, slot, k_eff, CB)


@triton.jit
def _select_kernel(in_val_ptr, in_pos_ptr, lens_ptr, pt_ptr, out_val_ptr, out_pos_ptr, out_raw_ptr,
                   n_in, pt_width, stride_inb, stride_outb, stride_ptb, stride_rawb,
                   CHUNK: tl.constexpr, K: tl.constexpr, PAGE: tl.constexpr, IMPLICIT_POS: tl.constexpr,
                   FINAL: tl.constexpr, HAS_RAW: tl.constexpr, PDL: tl.constexpr = False):
    """Grid (B, groups): the top-K of CHUNK consecutive entries of a row.

    Input is a logits row (IMPLICIT_POS: position = column, valid below the row's length) or
    candidate (value, position) pairs (position -1 = empty). A non-final level writes K candidates
    per group; the final level (one group) writes cache slot ids (and raw positions if HAS_RAW).
    """
    b = tl.program_id(0)
    g = tl.program_id(1)
    b64 = b.to(tl.int64)
    pdl_wait(PDL)  # the input row is the previous launch's output
    pdl_launch_dependents(PDL)
    idx = g * CHUNK + tl.arange(0, CHUNK)
    inside = idx < n_in
    vals = tl.load(in_val_ptr + b64 * stride_inb + idx, mask=inside, other=float("-inf"))
    if IMPLICIT_POS:
        length = _row_length(lens_ptr, b, n_in, pt_width, PAGE)
        pos = idx
        valid = idx < length
    else:
        pos = tl.load(in_pos_ptr + b64 * stride_inb + idx, mask=inside, other=-1)
        valid = inside & (pos >= 0)
    sel, slot, k_eff = _select(vals, valid, K, CHUNK)
    if FINAL:
        page = tl.load(pt_ptr + b64 * stride_ptb + pos // PAGE, mask=sel, other=0)
        j = tl.arange(0, K)
        out_row = out_pos_ptr + b64 * stride_outb
        tl.store(out_row + slot, page * PAGE + pos % PAGE, mask=sel)
        tl.store(out_row + j, tl.full((K,), -1, tl.int32), mask=j >= k_eff)
        if HAS_RAW:
            raw_row = out_raw_ptr + b64 * stride_rawb
            tl.store(raw_row + slot, pos, mask=sel)
            tl.store(raw_row + j, tl.full((K,), -1, tl.int32), mask=j >= k_eff)
    else:
        base = b64 * stride_outb + g * K
        _store_candidates(out_val_ptr + base, out_pos_ptr + base, vals, pos, sel, slot, k_eff, K)


# Rank select (round 27): at short rows and few rows the bitwise search's 32 dependent block-wide counts (~8.5 us at
# B=1 x 2048 positions, H200 runs 16 / 17) cost more than counting every pair. Each program takes RANK_ROWS positions
# of one row and counts, for each, the positions ahead of it in the order (score, then lower position first); a
# position whose count is below K writes its slot id straight at that rank, so there is no search, no cumulative sum
# and no merge: B x width^2 compares in one launch.
RANK_KEY_MAX: tl.constexpr = tl.constexpr(0x7FFFFFFE)  # keys are capped here so that key + 1 cannot overflow
RANK_KEY_NONE: tl.constexpr = tl.constexpr(-2147483648)  # key of a position past the row's length: behind all


@triton.jit
def _rank_key(vals):
    """:func:`_signed_key` capped at RANK_KEY_MAX (only the NaN of bit pattern 0x7FFFFFFF moves: it ties with
    0x7FFFFFFE)."""
    return tl.minimum(_signed_key(vals), RANK_KEY_MAX)


@triton.jit
def _rank_select_kernel(scores_ptr, lens_ptr, pt_ptr, out_ptr, raw_ptr, n_in, pt_width, stride_sb, stride_ptb,
                        stride_outb, stride_rawb, K: tl.constexpr, PAGE: tl.constexpr, ROWS: tl.constexpr,
                        BLOCK_J: tl.constexpr, HAS_RAW: tl.constexpr, PDL: tl.constexpr = False):
    """Grid (B, cdiv(width, ROWS)): the rank of each of ROWS consecutive positions of a scores row (how many
    positions of the row come before it: higher score, or equal score at a lower position), and for the K
    best the slot id written at ``out[b, rank]``: longer rows list the selection best first. Rows of at most K
    positions list them in position order (as the search forms and upstream do). Program 0 writes the -1
    padding past min(length, K)."""
    b = tl.program_id(0)
    g = tl.program_id(1)
    b64 = b.to(tl.int64)
    pdl_wait(PDL)  # the scores row is the previous launch's output
    pdl_launch_dependents(PDL)
    length = _row_length(lens_ptr, b, n_in, pt_width, PAGE)
    k_eff = tl.minimum(length, K)
    out_row = out_ptr + b64 * stride_outb
    raw_row = raw_ptr + b64 * stride_rawb
    if g == 0:
        pad = tl.arange(0, K)
        tl.store(out_row + pad, tl.full((K,), -1, tl.int32), mask=pad >= k_eff)
        if HAS_RAW:
            tl.store(raw_row + pad, tl.full((K,), -1, tl.int32), mask=pad >= k_eff)
    i0 = g * ROWS
    if i0 < length:
        row = scores_ptr + b64 * stride_sb
        i = i0 + tl.arange(0, ROWS)
        live = i < length
        rank = i  # a row of at most K positions: each one at its own position
        if length > K:
            ki = _rank_key(tl.load(row + i, mask=live, other=0.0))
            ahead = tl.zeros([ROWS], dtype=tl.int32)
            for j0 in range(0, length, BLOCK_J):
                j = j0 + tl.arange(0, BLOCK_J)
                inside = j < length
                kj = tl.where(inside, _rank_key(tl.load(row + j, mask=inside, other=0.0)), RANK_KEY_NONE)
                # a position before the block wins a tie: kj >= ki, i.e. kj + 1 > ki (no overflow: RANK_KEY_MAX)
                kj = kj + (j < i0).to(tl.int32)
                ahead += tl.sum((kj[None, :] > ki[:, None]).to(tl.int32), axis=1)
            # ties inside the block: the lower position wins (the loop counted only strictly higher scores there);
            # the block's keys are loaded again rather than moved into the other operand's layout (an L1 hit)
            jb = i0 + tl.arange(0, ROWS)
            kb = tl.where(jb < length, _rank_key(tl.load(row + jb, mask=jb < length, other=0.0)), RANK_KEY_NONE)
            ahead += tl.sum(((kb[None, :] == ki[:, None]) & (jb[None, :] < i[:, None])).to(tl.int32), axis=1)
            rank = ahead
        sel = live & (rank < k_eff)
        page = tl.load(pt_ptr + b64 * stride_ptb + i // PAGE, mask=sel, other=0)
        tl.store(out_row + rank, page * PAGE + i % PAGE, mask=sel)
        if HAS_RAW:
            tl.store(raw_row + rank, i, mask=sel)


@triton.jit
def _threshold_bin(hist, total, need, NBINS: tl.constexpr):
    """From a histogram of ``total`` keys (bin order = key order): the bin holding the ``need``-th
    largest key (1 <= need <= total) and how many keys lie in the bins above it."""
    at_or_above = total - tl.cumsum(hist, axis=0) + hist  # non-increasing in the bin index
    thr = tl.sum((at_or_above >= need).to(tl.int32), axis=0) - 1
    above = tl.sum(tl.where(tl.arange(0, NBINS) > thr, hist, 0), axis=0)
    return thr, above


@triton.jit
def _store_slots(out_row, raw_row, pt_row, pos, slot, sel, PAGE: tl.constexpr, HAS_RAW: tl.constexpr):
    page = tl.load(pt_row + pos // PAGE, mask=sel, other=0)
    tl.store(out_row + slot, page * PAGE + pos % PAGE, mask=sel)
    if HAS_RAW:
        tl.store(raw_row + slot, pos, mask=sel)


@triton.jit
def _score_hist_kernel(scores_ptr, lens_ptr, ws_ptr, n_in, pt_width, stride_sb, stride_wsb,
                       CHUNK: tl.constexpr, PAGE: tl.constexpr, K: tl.constexpr, B1: tl.constexpr,
                       R: tl.constexpr, WS_H1: tl.constexpr, PDL: tl.constexpr = False,
                       REDUCE: tl.constexpr = 0):
    """Grid (B, groups): the first-digit histogram of a given scores row (the logits kernel builds
    it in passing when it computes the scores itself)."""
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    pdl_wait(PDL)
    pdl_launch_dependents(PDL)
    length = _row_length(lens_ptr, b, n_in, pt_width, PAGE)
    idx = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    valid = idx < length
    vals = tl.load(scores_ptr + b64 * stride_sb + idx, mask=valid, other=float("-inf"))
    ws_row = ws_ptr + b64 * stride_wsb
    _count_first_digit(ws_row, vals, idx, valid, B1, R, WS_H1)
    _finish_first_digit(ws_row, length, K, B1, R, WS_H1, REDUCE)


@triton.jit
def _hist_split_part(vals, thr1, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr, b64, g, length,
                     stride_ptb, stride_wsb, stride_cb, stride_outb, stride_rawb,
                     CHUNK: tl.constexpr, PAGE: tl.constexpr, CAP: tl.constexpr, HAS_RAW: tl.constexpr,
                     B1: tl.constexpr, B2: tl.constexpr, WS_H2: tl.constexpr):
    """One split program's share of a row longer than K (scores and the first digit's threshold bin
    loaded beside the row length): every entry of a bin above the threshold goes straight to the
    output, the threshold bin's entries to the row's candidate list (first CAP kept) and into its
    second-digit histogram. Each such entry (about 1 % of a long row) claims its slot with an atomic
    of its own on the row's counter of its kind, rather than the program taking a block of slots with
    prefix sums over all its entries: no scans, fewer registers (H200 run 10,
    benchmarks/indexer-h200-run10-summary.md: B=64 x 256K 216.1 -> 197.3 us, B=16 x 256K 76.8 -> 69.2)."""
    ws_row = ws_ptr + b64 * stride_wsb
    idx = g * CHUNK + tl.arange(0, CHUNK)
    valid = idx < length
    key_u = _order_key(vals)
    digit1 = _key_bits(key_u, 0, B1)
    above = valid & (digit1 > thr1)
    tie = valid & (digit1 == thr1)
    # WS_TIE == WS_ABOVE + 1: one atomic per entry, on the counter of its kind
    slot = tl.atomic_add(ws_row + WS_ABOVE + tie.to(tl.int32), tl.full((CHUNK,), 1, tl.int32), mask=above | tie,
                         sem="relaxed")
    _store_slots(out_ptr + b64 * stride_outb, raw_ptr + b64 * stride_rawb, pt_ptr + b64 * stride_ptb, idx, slot,
                 above, PAGE, HAS_RAW)
    keep = tie & (slot < CAP)
    tl.store(cand_val_ptr + b64 * stride_cb + slot, vals, mask=keep)
    tl.store(cand_pos_ptr + b64 * stride_cb + slot, idx, mask=keep)
    tl.atomic_add(ws_row + WS_H2 + _key_bits(key_u, B1, B2), tl.full((CHUNK,), 1, tl.int32), mask=tie,
                  sem="relaxed")


@triton.jit
def _hist_select_kernel(scores_ptr, lens_ptr, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr,
                        n_in, pt_width, stride_sb, stride_ptb, stride_wsb, stride_cb, stride_outb, stride_rawb,
                        CHUNK: tl.constexpr, K: tl.constexpr, PAGE: tl.constexpr, CAP: tl.constexpr,
                        HAS_RAW: tl.constexpr, B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr,
                        WS_H2: tl.constexpr, WS_H3: tl.constexpr, WS_CLEAN: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr = False, ONE_BLOCK: tl.constexpr = False, PAGE_MAX: tl.constexpr = False,
                        SPIN: tl.constexpr = False, REG_FINISH: tl.constexpr = False,
                        REG_DIGIT_BITS: tl.constexpr = REG_FINISH_DIGIT_BITS, REG_LEAN: tl.constexpr = False):
    """Grid (B, groups): the histogram select after the first digit, in one launch. The split
    programs of a long row (:func:`_hist_split_part`) count their arrivals; the last to arrive
    finishes the row (:func:`_hist_finish_row`), so no launch of one program per row follows (H200
    run 7: B=64 x 256K 219.5 vs 233.0 us). A row of at most K positions is finished by its first
    program alone. The split programs load their scores and the threshold bin beside the row length
    (H200 run 9b). ONE_BLOCK: a threshold bin of at most BLOCK entries is finished from one register
    block (:func:`_hist_finish_one_block`). PAGE_MAX: WS_THR1 holds the logits kernel's page-max bound
    instead of a first-digit bin (:func:`_bound_split_part`, :func:`_bound_finish_row`).
    SPIN (page-max overlap form; grid (groups, B), row-major like the logits launch it follows): no
    ``griddepcontrol.wait``; each program that works on a row waits for that row's WS_READY (acquire), set by
    the row's last logits program, so a row's select runs while later rows' logits are still computed. With
    PDL this launch's programs start only once every logits program has started (and passed its own wait), so
    the logits programs a spinning program waits for are all resident: no deadlock. The finishing program
    zeroes the flag with the rest of the row's counters. REG_FINISH (page-max form): a candidate list of at most
    BLOCK entries is finished in registers (:func:`_bound_finish_row_in_registers`); REG_LEAN with it: the split
    programs do not count the candidates' first digit (only a longer list's finish needs it, and counts it)."""
    if SPIN:
        b = tl.program_id(1)
        g = tl.program_id(0)
    else:
        b = tl.program_id(0)
        g = tl.program_id(1)
    b64 = b.to(tl.int64)
    pdl_wait(PDL and not SPIN)  # the scores and the first-digit threshold come from the logits launch just before
    pdl_launch_dependents(PDL)
    length = _row_length(lens_ptr, b, n_in, pt_width, PAGE)
    if SPIN:  # only programs that work on the row: the flag is zeroed once they all have
        if ((length > K) & (g * CHUNK < length)) | ((length <= K) & (g == 0)):
            ready = tl.atomic_add(ws_ptr + b64 * stride_wsb + WS_READY, 0, sem="acquire")
            while ready == 0:
                ready = tl.atomic_add(ws_ptr + b64 * stride_wsb + WS_READY, 0, sem="acquire")
    idx = g * CHUNK + tl.arange(0, CHUNK)
    vals = tl.load(scores_ptr + b64 * stride_sb + idx, mask=idx < n_in, other=float("-inf"))
    thr1 = tl.load(ws_ptr + b64 * stride_wsb + WS_THR1)
    if (length > K) & (g * CHUNK < length):
        if PAGE_MAX:
            _bound_split_part(vals, thr1, ws_ptr, cand_val_ptr, cand_pos_ptr, b64, g, length, stride_wsb, stride_cb,
                              CHUNK, CAP, B1, not (REG_FINISH and REG_LEAN))
        else:
            _hist_split_part(vals, thr1, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr, b64, g, length,
                             stride_ptb, stride_wsb, stride_cb, stride_outb, stride_rawb, CHUNK, PAGE, CAP, HAS_RAW,
                             B1, B2, WS_H2)
        tl.debug_barrier()  # all of this program's stores and counts performed before its arrival
        arrived = tl.atomic_add(ws_ptr + b64 * stride_wsb + WS_SPLIT_DONE, 1, sem="acq_rel")
        if arrived == tl.cdiv(length, CHUNK) - 1:
            if PAGE_MAX and REG_FINISH:
                _bound_finish_row_in_registers(scores_ptr, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr,
                                               b64, length, stride_sb, stride_ptb, stride_wsb, stride_cb, stride_outb,
                                               stride_rawb, K, PAGE, CAP, HAS_RAW, B1, B2, B3, WS_H2, WS_H3, WS_CLEAN,
                                               BLOCK, REG_DIGIT_BITS, REG_LEAN, ONE_BLOCK)
            elif PAGE_MAX:
                _bound_finish_row(scores_ptr, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr, b64,
                                  length, stride_sb, stride_ptb, stride_wsb, stride_cb, stride_outb, stride_rawb,
                                  K, PAGE, CAP, HAS_RAW, B1, B2, B3, WS_H2, WS_H3, WS_CLEAN, BLOCK, ONE_BLOCK)
            else:
                _hist_finish_row(scores_ptr, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr, b64,
                                 length, stride_sb, stride_ptb, stride_wsb, stride_cb, stride_outb, stride_rawb,
                                 K, PAGE, CAP, HAS_RAW, B1, B2, B3, WS_H2, WS_H3, WS_CLEAN, BLOCK, ONE_BLOCK)
    if (length <= K) & (g == 0):  # after the long-row branch: the scores loaded early are dead here
        _hist_short_row(pt_ptr, ws_ptr, out_ptr, raw_ptr, b64, length, stride_ptb, stride_wsb, stride_outb,
                        stride_rawb, K, PAGE, HAS_RAW, WS_CLEAN)


@triton.jit
def _bound_split_part(vals, bound, ws_ptr, cand_val_ptr, cand_pos_ptr, b64, g, length, stride_wsb, stride_cb,
                      CHUNK: tl.constexpr, CAP: tl.constexpr, B1: tl.constexpr, COUNT_H1: tl.constexpr = True):
    """One split program's share of a row longer than K, page-max form: every entry at or above the
    row's bound (at most the K-th largest logit) claims a slot in the row's candidate list (first CAP
    kept) with an atomic of its own and is counted into the candidates' first-digit histogram. Nothing
    goes out yet: which candidates are in the top K is known only once all are counted. Not COUNT_H1 (the lean
    finish in registers): no first-digit count; a finish that needs it counts it itself."""
    ws_row = ws_ptr + b64 * stride_wsb
    idx = g * CHUNK + tl.arange(0, CHUNK)
    cand = (idx < length) & (_signed_key(vals) >= bound)
    slot = tl.atomic_add(ws_row + WS_TIE + tl.zeros((CHUNK,), tl.int32), tl.full((CHUNK,), 1, tl.int32), mask=cand,
                         sem="relaxed")
    keep = cand & (slot < CAP)
    tl.store(cand_val_ptr + b64 * stride_cb + slot, vals, mask=keep)
    tl.store(cand_pos_ptr + b64 * stride_cb + slot, idx, mask=keep)
    if COUNT_H1:
        tl.atomic_add(ws_row + WS_CAND_H1 + _key_bits(_order_key(vals), 0, B1), tl.full((CHUNK,), 1, tl.int32),
                      mask=cand, sem="relaxed")


@triton.jit
def _top_in_registers(key_u, live, need, DIGIT_BITS: tl.constexpr):
    """A mask of the ``need`` largest of ``key_u[live]`` (unsigned-order keys; 1 <= need <= their count),
    equal keys at the ``need``-th taken in block order: 32 // DIGIT_BITS rounds, each a histogram of the live
    keys' next digit in registers (``tl.histogram``), its threshold bin, the keys above it taken and those in it
    kept live. No workspace, atomics or memory round trip."""
    NBINS: tl.constexpr = 1 << DIGIT_BITS
    bins = tl.arange(0, NBINS)
    take = tl.zeros(key_u.shape, tl.int1)
    n_live = tl.sum(live.to(tl.int32), axis=0)
    for r in tl.static_range(32 // DIGIT_BITS):
        digit = _key_bits(key_u, r * DIGIT_BITS, DIGIT_BITS)
        hist = tl.histogram(digit, NBINS, mask=live)
        thr, n_above = _threshold_bin(hist, n_live, need, NBINS)
        take = take | (live & (digit > thr))
        live = live & (digit == thr)
        n_live = tl.sum(tl.where(bins == thr, hist, 0), axis=0)
        need = need - n_above
    equal_rank = tl.cumsum(live.to(tl.int32), axis=0) - 1
    return take | (live & (equal_rank < need))


@triton.jit
def _bound_finish_row_in_registers(scores_ptr, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr, b64,
                                   length, stride_sb, stride_ptb, stride_wsb, stride_cb, stride_outb, stride_rawb,
                                   K: tl.constexpr, PAGE: tl.constexpr, CAP: tl.constexpr, HAS_RAW: tl.constexpr,
                                   B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr, WS_H2: tl.constexpr,
                                   WS_H3: tl.constexpr, WS_CLEAN: tl.constexpr, BLOCK: tl.constexpr,
                                   DIGIT_BITS: tl.constexpr, LEAN: tl.constexpr, ONE_BLOCK: tl.constexpr = False):
    """:func:`_bound_finish_row` with a candidate list of at most BLOCK entries held in one register block and
    its top K found there (:func:`_top_in_registers`, 8-bit digits) instead of through the workspace's digit
    histograms: the list is loaded beside its count (entries past the count are masked off after), so the
    finish costs the list's round trip, the page-table gather and the stores. A longer list (or an overflowed
    one) takes :func:`_bound_finish_row`, whose first-digit histogram the split programs count (LEAN: this
    program counts it first, from the list or, overflowed, from the row's logits at or above the bound)."""
    ws_row = ws_ptr + b64 * stride_wsb
    idx = tl.arange(0, BLOCK)
    n_cand = tl.load(ws_row + WS_TIE, cache_modifier=".cg")
    vals = tl.load(cand_val_ptr + b64 * stride_cb + idx, cache_modifier=".cg")  # BLOCK <= CAP: in the list
    pos = tl.load(cand_pos_ptr + b64 * stride_cb + idx, cache_modifier=".cg")
    if n_cand <= BLOCK:
        take = _top_in_registers(_order_key(vals), idx < n_cand, K, DIGIT_BITS)
        _store_slots(out_ptr + b64 * stride_outb, raw_ptr + b64 * stride_rawb, pt_ptr + b64 * stride_ptb, pos,
                     tl.cumsum(take.to(tl.int32), axis=0) - 1, take, PAGE, HAS_RAW)
        _clean_row_workspace(ws_row, WS_CLEAN)
    else:
        if LEAN:
            bound = tl.load(ws_row + WS_THR1)
            from_row = n_cand > CAP
            n_src = tl.where(from_row, length, n_cand)
            for start in range(0, n_src, BLOCK):
                src = start + idx
                inside = src < n_src
                src_vals, _src_pos = _hist_source(scores_ptr + b64 * stride_sb, cand_val_ptr + b64 * stride_cb,
                                                  cand_pos_ptr + b64 * stride_cb, src, inside, from_row)
                tl.atomic_add(ws_row + WS_CAND_H1 + _key_bits(_order_key(src_vals), 0, B1),
                              tl.full((BLOCK,), 1, tl.int32), mask=inside & (_signed_key(src_vals) >= bound),
                              sem="relaxed")
            tl.debug_barrier()  # the counts performed before _bound_finish_row reads them back
        _bound_finish_row(scores_ptr, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr, b64, length,
                          stride_sb, stride_ptb, stride_wsb, stride_cb, stride_outb, stride_rawb, K, PAGE, CAP,
                          HAS_RAW, B1, B2, B3, WS_H2, WS_H3, WS_CLEAN, BLOCK, ONE_BLOCK)


@triton.jit
def _bound_finish_row(scores_ptr, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr, b64, length,
                      stride_sb, stride_ptb, stride_wsb, stride_cb, stride_outb, stride_rawb,
                      K: tl.constexpr, PAGE: tl.constexpr, CAP: tl.constexpr, HAS_RAW: tl.constexpr,
                      B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr, WS_H2: tl.constexpr,
                      WS_H3: tl.constexpr, WS_CLEAN: tl.constexpr, BLOCK: tl.constexpr,
                      ONE_BLOCK: tl.constexpr = False):
    """The rest of one row's top-K, page-max form: the candidates' first-digit histogram gives the
    K-th key's first digit (every logit at or above it is a candidate, so it is the row's); candidates
    with a higher first digit go out, those with the threshold's first digit are counted by their second
    digit, then :func:`_hist_finish_blocks` finishes as in the counting form. An overflowed list (more
    than CAP candidates) is replaced by the whole row, filtered by the first digit alone."""
    out_row = out_ptr + b64 * stride_outb
    raw_row = raw_ptr + b64 * stride_rawb
    pt_row = pt_ptr + b64 * stride_ptb
    ws_row = ws_ptr + b64 * stride_wsb
    cand_val_row = cand_val_ptr + b64 * stride_cb
    cand_pos_row = cand_pos_ptr + b64 * stride_cb
    n_cand = tl.load(ws_row + WS_TIE, cache_modifier=".cg")
    bins1 = tl.arange(0, 1 << B1)
    hist1 = tl.load(ws_row + WS_CAND_H1 + bins1, cache_modifier=".cg")
    thr1, n_above1 = _threshold_bin(hist1, n_cand, K, 1 << B1)
    n_tie1 = tl.sum(tl.where(bins1 == thr1, hist1, 0), axis=0)
    from_row = n_cand > CAP
    n_src = tl.where(from_row, length, n_cand)
    scores_row = scores_ptr + b64 * stride_sb
    bins2 = tl.arange(0, 1 << B2)
    one_block = n_src <= BLOCK
    if not ONE_BLOCK:
        one_block = n_src < 0  # never
    if one_block:
        # one register block: read once, three digit rounds, one store of every taken entry
        idx = tl.arange(0, BLOCK)
        inside = idx < n_src
        vals, pos = _hist_source(scores_row, cand_val_row, cand_pos_row, idx, inside, from_row)
        key_u = _order_key(vals)
        digit1 = _key_bits(key_u, 0, B1)
        digit2 = _key_bits(key_u, B1, B2)
        digit3 = _key_bits(key_u, B1 + B2, B3)
        tie1 = inside & (digit1 == thr1)
        tl.atomic_add(ws_row + WS_H2 + digit2, tl.full((BLOCK,), 1, tl.int32), mask=tie1, sem="relaxed")
        tl.debug_barrier()  # this program's counts, performed at L2, before it reads them back
        hist2 = tl.load(ws_row + WS_H2 + bins2, cache_modifier=".cg")
        thr2, n_above2 = _threshold_bin(hist2, n_tie1, K - n_above1, 1 << B2)
        n_tie2 = tl.sum(tl.where(bins2 == thr2, hist2, 0), axis=0)
        tie2 = tie1 & (digit2 == thr2)
        tl.atomic_add(ws_row + WS_H3 + digit3, tl.full((BLOCK,), 1, tl.int32), mask=tie2, sem="relaxed")
        tl.debug_barrier()
        need3 = K - n_above1 - n_above2
        thr3, n_above3 = _threshold_bin(tl.load(ws_row + WS_H3 + tl.arange(0, 1 << B3), cache_modifier=".cg"),
                                        n_tie2, need3, 1 << B3)
        equal = tie2 & (digit3 == thr3)
        equal_rank = tl.cumsum(equal.to(tl.int32), axis=0) - 1
        take = inside & ((digit1 > thr1) | (tie1 & (digit2 > thr2)) | (tie2 & (digit3 > thr3))
                         | (equal & (equal_rank < need3 - n_above3)))
        _store_slots(out_row, raw_row, pt_row, pos, tl.cumsum(take.to(tl.int32), axis=0) - 1, take, PAGE, HAS_RAW)
    else:
        written = tl.full((), 0, tl.int32)
        for start in range(0, n_src, BLOCK):
            idx = start + tl.arange(0, BLOCK)
            inside = idx < n_src
            vals, pos = _hist_source(scores_row, cand_val_row, cand_pos_row, idx, inside, from_row)
            key_u = _order_key(vals)
            digit1 = _key_bits(key_u, 0, B1)
            take = inside & (digit1 > thr1)
            _store_slots(out_row, raw_row, pt_row, pos, written + tl.cumsum(take.to(tl.int32), axis=0) - 1, take,
                         PAGE, HAS_RAW)
            written += tl.sum(take.to(tl.int32), axis=0)
            tl.atomic_add(ws_row + WS_H2 + _key_bits(key_u, B1, B2), tl.full((BLOCK,), 1, tl.int32),
                          mask=inside & (digit1 == thr1), sem="relaxed")
        tl.debug_barrier()  # this program's counts, performed at L2, before it reads them back
        hist2 = tl.load(ws_row + WS_H2 + bins2, cache_modifier=".cg")
        # From the row (overflow) the threshold bin also holds the logits below the bound that share its first
        # digit, which the candidates' count n_tie1 leaves out: the second digit's total is what was counted.
        thr2, n_above2 = _threshold_bin(hist2, tl.sum(hist2, axis=0), K - n_above1, 1 << B2)
        n_tie2 = tl.sum(tl.where(bins2 == thr2, hist2, 0), axis=0)
        _hist_finish_blocks(scores_row, cand_val_row, cand_pos_row, ws_row, out_row, raw_row, pt_row, n_src,
                            from_row, thr1, thr2, n_above1, n_above2, n_tie2, K, PAGE, HAS_RAW, B1, B2, B3,
                            WS_H3, BLOCK)
    _clean_row_workspace(ws_row, WS_CLEAN)


@triton.jit
def _hist_source(scores_row, cand_val_row, cand_pos_row, idx, inside, from_row):
    """One block of the threshold bin's entries: the candidate list, or the whole row (overflow).
    The list was written by other programs of the same launch: its loads bypass L1."""
    vals = tl.load(tl.where(from_row, scores_row + idx, cand_val_row + idx), mask=inside, other=float("-inf"),
                   cache_modifier=".cg")
    pos = tl.where(from_row, idx, tl.load(cand_pos_row + idx, mask=inside & (from_row == 0), other=0,
                                          cache_modifier=".cg"))
    return vals, pos


@triton.jit
def _hist_finish_row(scores_ptr, pt_ptr, ws_ptr, cand_val_ptr, cand_pos_ptr, out_ptr, raw_ptr, b64, length,
                     stride_sb, stride_ptb, stride_wsb, stride_cb, stride_outb, stride_rawb,
                     K: tl.constexpr, PAGE: tl.constexpr, CAP: tl.constexpr, HAS_RAW: tl.constexpr,
                     B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr, WS_H2: tl.constexpr,
                     WS_H3: tl.constexpr, WS_CLEAN: tl.constexpr, BLOCK: tl.constexpr,
                     ONE_BLOCK: tl.constexpr = False):
    """The rest of one row's top-K (a row longer than K; :func:`_hist_short_row` lists shorter ones):
    from the second-digit histogram, the threshold bin's entries with a higher second digit go
    out; the third (last) digit of those with the threshold's second digit is counted here, then
    the exact K-th key is known and equal keys are taken in list order. Both passes hold BLOCK
    entries at a time (1024: the threshold bin holds a few hundred entries at DSv4 shapes; 4096
    was slower in H200 run 7). If the candidate list overflowed (more than CAP entries in the
    threshold bin: heavy ties) the same two passes run over the whole row instead, so the result
    stays exact at a bounded cost. At the end the row's workspace below ``WS_CLEAN`` is zeroed:
    the workspace needs no memset per call."""
    out_row = out_ptr + b64 * stride_outb
    raw_row = raw_ptr + b64 * stride_rawb
    pt_row = pt_ptr + b64 * stride_ptb
    ws_row = ws_ptr + b64 * stride_wsb
    thr1 = tl.load(ws_row + WS_THR1)
    n_above1 = tl.load(ws_row + WS_ABOVE1)
    n_tie = tl.load(ws_row + WS_TIE, cache_modifier=".cg")  # counted by the split programs
    hist2 = tl.load(ws_row + WS_H2 + tl.arange(0, 1 << B2), cache_modifier=".cg")
    thr2, n_above2 = _threshold_bin(hist2, n_tie, K - n_above1, 1 << B2)
    n_tie2 = tl.sum(tl.where(tl.arange(0, 1 << B2) == thr2, hist2, 0), axis=0)
    from_row = n_tie > CAP
    n_src = tl.where(from_row, length, n_tie)
    scores_row = scores_ptr + b64 * stride_sb
    cand_val_row = cand_val_ptr + b64 * stride_cb
    cand_pos_row = cand_pos_ptr + b64 * stride_cb
    if ONE_BLOCK:
        if n_src <= BLOCK:
            _hist_finish_one_block(cand_val_row, cand_pos_row, ws_row, out_row, raw_row, pt_row, n_tie, thr2,
                                   n_above1, n_above2, n_tie2, K, PAGE, HAS_RAW, B1, B2, B3, WS_H3, BLOCK)
        else:
            _hist_finish_blocks(scores_row, cand_val_row, cand_pos_row, ws_row, out_row, raw_row, pt_row, n_src,
                                from_row, thr1, thr2, n_above1, n_above2, n_tie2, K, PAGE, HAS_RAW, B1, B2, B3,
                                WS_H3, BLOCK)
    else:
        _hist_finish_blocks(scores_row, cand_val_row, cand_pos_row, ws_row, out_row, raw_row, pt_row, n_src,
                            from_row, thr1, thr2, n_above1, n_above2, n_tie2, K, PAGE, HAS_RAW, B1, B2, B3,
                            WS_H3, BLOCK)
    _clean_row_workspace(ws_ptr + b64 * stride_wsb, WS_CLEAN)


@triton.jit
def _hist_short_row(pt_ptr, ws_ptr, out_ptr, raw_ptr, b64, length, stride_ptb, stride_wsb, stride_outb, stride_rawb,
                    K: tl.constexpr, PAGE: tl.constexpr, HAS_RAW: tl.constexpr, WS_CLEAN: tl.constexpr):
    """A row of at most K positions: all of them, in order, then -1."""
    out_row = out_ptr + b64 * stride_outb
    raw_row = raw_ptr + b64 * stride_rawb
    j = tl.arange(0, K)
    _store_slots(out_row, raw_row, pt_ptr + b64 * stride_ptb, j, j, j < length, PAGE, HAS_RAW)
    tl.store(out_row + j, tl.full((K,), -1, tl.int32), mask=j >= length)
    if HAS_RAW:
        tl.store(raw_row + j, tl.full((K,), -1, tl.int32), mask=j >= length)
    _clean_row_workspace(ws_ptr + b64 * stride_wsb, WS_CLEAN)


@triton.jit
def _clean_row_workspace(ws_row, WS_CLEAN: tl.constexpr):
    """Leave the row's counters and second/third-digit histograms zero for the next call (the first
    digit's copies were zeroed when they were reduced)."""
    tl.debug_barrier()
    for off in tl.static_range(0, WS_CLEAN, 1024):
        i = off + tl.arange(0, 1024)
        tl.store(ws_row + i, tl.zeros((1024,), tl.int32), mask=i < WS_CLEAN)


@triton.jit
def _hist_finish_one_block(cand_val_row, cand_pos_row, ws_row, out_row, raw_row, pt_row, n_tie, thr2, n_above1,
                           n_above2, n_tie2, K: tl.constexpr, PAGE: tl.constexpr, HAS_RAW: tl.constexpr,
                           B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr, WS_H3: tl.constexpr,
                           BLOCK: tl.constexpr):
    """:func:`_hist_finish_blocks` for a candidate list of at most BLOCK entries: read once and kept
    in registers, the page-table gather issued before the third digit is counted (its round trip
    overlaps the count's), one store of every taken entry."""
    idx = tl.arange(0, BLOCK)
    inside = idx < n_tie
    vals = tl.load(cand_val_row + idx, mask=inside, other=float("-inf"), cache_modifier=".cg")
    pos = tl.load(cand_pos_row + idx, mask=inside, other=0, cache_modifier=".cg")
    key_u = _order_key(vals)
    digit2 = _key_bits(key_u, B1, B2)
    digit3 = _key_bits(key_u, B1 + B2, B3)
    tie2 = inside & (digit2 == thr2)
    tl.atomic_add(ws_row + WS_H3 + digit3, tl.full((BLOCK,), 1, tl.int32), mask=tie2, sem="relaxed")
    tl.debug_barrier()  # this program's counts, performed at L2, before it reads them back
    need3 = K - n_above1 - n_above2
    thr3, n_above3 = _threshold_bin(tl.load(ws_row + WS_H3 + tl.arange(0, 1 << B3), cache_modifier=".cg"),
                                    n_tie2, need3, 1 << B3)
    equal = tie2 & (digit3 == thr3)
    equal_rank = tl.cumsum(equal.to(tl.int32), axis=0) - 1
    take = inside & ((digit2 > thr2) | (tie2 & (digit3 > thr3)) | (equal & (equal_rank < need3 - n_above3)))
    _store_slots(out_row, raw_row, pt_row, pos, n_above1 + tl.cumsum(take.to(tl.int32), axis=0) - 1, take, PAGE,
                 HAS_RAW)


@triton.jit
def _hist_finish_blocks(scores_row, cand_val_row, cand_pos_row, ws_row, out_row, raw_row, pt_row, n_src, from_row,
                        thr1, thr2, n_above1, n_above2, n_tie2, K: tl.constexpr, PAGE: tl.constexpr,
                        HAS_RAW: tl.constexpr, B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr,
                        WS_H3: tl.constexpr, BLOCK: tl.constexpr):
    """The threshold bin's entries (candidate list, or the whole row when it overflowed) in blocks
    of BLOCK: those above the second digit's threshold out, the third digit of those at it counted,
    then a second pass takes the rest by the third digit (equal keys in list order)."""
    written = n_above1
    for start in range(0, n_src, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        inside = idx < n_src
        vals, pos = _hist_source(scores_row, cand_val_row, cand_pos_row, idx, inside, from_row)
        key_u = _order_key(vals)
        in_bin = inside & (_key_bits(key_u, 0, B1) == thr1)
        digit2 = _key_bits(key_u, B1, B2)
        take = in_bin & (digit2 > thr2)
        _store_slots(out_row, raw_row, pt_row, pos, written + tl.cumsum(take.to(tl.int32), axis=0) - 1, take,
                     PAGE, HAS_RAW)
        written += tl.sum(take.to(tl.int32), axis=0)
        tl.atomic_add(ws_row + WS_H3 + _key_bits(key_u, B1 + B2, B3), tl.full((BLOCK,), 1, tl.int32),
                      mask=in_bin & (digit2 == thr2), sem="relaxed")
    tl.debug_barrier()  # this program's counts, performed at L2, before it reads them back
    need3 = K - n_above1 - n_above2
    thr3, n_above3 = _threshold_bin(tl.load(ws_row + WS_H3 + tl.arange(0, 1 << B3), cache_modifier=".cg"),
                                    n_tie2, need3, 1 << B3)
    n_equal = need3 - n_above3  # entries with exactly the K-th key still to take
    equal_seen = tl.full((), 0, tl.int32)
    for start in range(0, n_src, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        inside = idx < n_src
        vals, pos = _hist_source(scores_row, cand_val_row, cand_pos_row, idx, inside, from_row)
        key_u = _order_key(vals)
        in_tie2 = inside & (_key_bits(key_u, 0, B1) == thr1) & (_key_bits(key_u, B1, B2) == thr2)
        digit3 = _key_bits(key_u, B1 + B2, B3)
        equal = in_tie2 & (digit3 == thr3)
        equal_rank = equal_seen + tl.cumsum(equal.to(tl.int32), axis=0) - 1
        take = in_tie2 & ((digit3 > thr3) | (equal & (equal_rank < n_equal)))
        _store_slots(out_row, raw_row, pt_row, pos, written + tl.cumsum(take.to(tl.int32), axis=0) - 1, take,
                     PAGE, HAS_RAW)
        written += tl.sum(take.to(tl.int32), axis=0)
        equal_seen += tl.sum(equal.to(tl.int32), axis=0)


# --------------------------------------------------------------------------------------------
# Float32 references (the specification)
# --------------------------------------------------------------------------------------------


def reference_paged_mqa_logits(q, kv, weights, lens, page_table, max_seq_len):
    """float32 logits ``[B, max_seq_len]``: exact fp32 products of the fp8 values, ReLU, weighted
    head sum, times the row's fp32 scale; ``-inf`` at and past each row's length. A page id outside the cache
    reads the nearest page (clamped into ``[0, pages)``; upstream's torch path wraps negative ids and faults past
    the end), as the kernels do."""
    batch = q.shape[0]
    page = kv.shape[1]
    flat = kv.reshape(kv.shape[0], -1)
    n_pages = -(-max_seq_len // page)
    table = page_table[:, :n_pages].long().clamp(min=0, max=kv.shape[0] - 1)
    if table.shape[1] < n_pages:
        table = torch.nn.functional.pad(table, (0, n_pages - table.shape[1]))
    gathered = flat[table]  # [B, n_pages, page_bytes]
    k = gathered[..., :page * INDEX_HEAD_DIM].contiguous().view(FP8).float()
    k = k.view(batch, n_pages * page, INDEX_HEAD_DIM)
    scale = gathered[..., page * INDEX_HEAD_DIM:].contiguous().view(torch.float32).view(batch, n_pages * page)
    scores = torch.bmm(k, q[:, 0].float().transpose(1, 2)).relu()  # [B, T, H]
    logits = (scores * weights.float()[:, None, :]).sum(-1) * scale
    logits = logits[:, :max_seq_len]
    width = min(max_seq_len, page_table.shape[1] * page)
    positions = torch.arange(max_seq_len, device=q.device)
    limit = lens.long().clamp(min=0, max=width)
    return logits.masked_fill(positions[None, :] >= limit[:, None], float("-inf"))


def reference_topk_positions(logits, lens, k=INDEX_TOPK):
    """Selected positions ``[B, k]`` (int64, -1 padded) by the contract: rows of at most k valid
    positions list 0..len-1 in order; longer rows the k best (ties to the lowest position),
    ascending."""
    batch, width = logits.shape
    out = torch.full((batch, k), -1, dtype=torch.long, device=logits.device)
    for b in range(batch):
        n = int(min(max(int(lens[b]), 0), width))
        if n <= k:
            out[b, :n] = torch.arange(n, device=logits.device)
            continue
        row = logits[b, :n].double()
        order = sorted(range(n), key=lambda i: (-row[i].item(), i))[:k]
        out[b] = torch.tensor(sorted(order), device=logits.device)
    return out


def positions_to_slots(positions, page_table, page_size=INDEX_PAGE_SIZE):
    """Cache slot ids ``page_table[b, i // page] * page + i % page`` (int32), -1 stays -1."""
    safe = positions.clamp(min=0)
    pages = torch.gather(page_table.long(), 1, safe // page_size)
    slots = pages * page_size + safe % page_size
    return torch.where(positions >= 0, slots, torch.full_like(slots, -1)).to(torch.int32)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _check(name, tensor, shape, dtype, device=None):
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {shape} {dtype}, got {type(tensor).__name__}")
    ok_shape = len(tensor.shape) == len(shape) and all(e is None or e == s for e, s in zip(shape, tensor.shape))
    if not ok_shape or tensor.dtype != dtype or (device is not None and tensor.device != device):
        want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise ValueError(f"{name} must be {want} {dtype} on {device or 'the same device'}; got "
                         f"{list(tensor.shape)} {tensor.dtype} on {tensor.device}")


def validate_logits_inputs(q, kv, weights, lens, page_table, max_seq_len):
    _check("q", q, (None, 1, INDEX_N_HEADS, INDEX_HEAD_DIM), FP8)
    batch, device = q.shape[0], q.device
    _check("kv", kv, (None, INDEX_PAGE_SIZE, 1, INDEX_TOKEN_BYTES), torch.uint8, device)
    if kv.shape[0] and (kv.stride(0) != INDEX_PAGE_BYTES or kv.stride(1) != INDEX_TOKEN_BYTES
                        or kv.stride(3) != 1):
        raise ValueError(f"kv must be page-major contiguous (strides ({INDEX_PAGE_BYTES}, "
                         f"{INDEX_TOKEN_BYTES}, *, 1)); got {kv.stride()}")
    _check("weights", weights, (batch, INDEX_N_HEADS), torch.float32, device)
    _check("lens", lens, (batch,), torch.int32, device)
    _check("page_table", page_table, (batch, None), torch.int32, device)
    if not isinstance(max_seq_len, int) or max_seq_len < 0 or max_seq_len > INDEX_MAX_COMPRESSED_LEN:
        raise ValueError(f"max_seq_len must be an int in [0, {INDEX_MAX_COMPRESSED_LEN}], got {max_seq_len!r}")
    if q.stride(3) != 1 or q.stride(2) != INDEX_HEAD_DIM:
        raise ValueError(f"q must have contiguous heads x dims (strides (*, *, 128, 1)), got {q.stride()}")
    if weights.stride(1) != 1 or page_table.stride(1) != 1:
        raise ValueError("weights and page_table need a contiguous last dimension")
    if kv.shape[0] == 0 and batch and max_seq_len:
        raise ValueError("kv must hold at least one page (an empty cache has nothing a page id can name)")


def validate_topk_inputs(scores, lens, page_table, out, page_size, raw=None):
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be [B, width] float32, got "
                         f"{getattr(scores, 'shape', None)} {getattr(scores, 'dtype', None)}")
    batch, device = scores.shape[0], scores.device
    if scores.shape[1] and scores.stride(1) != 1:
        raise ValueError("scores needs a contiguous last dimension")
    _check("seq_lens", lens, (batch,), torch.int32, device)
    _check("page_table", page_table, (batch, None), torch.int32, device)
    _check("out_page_indices", out, (batch, None), torch.int32, device)
    k = out.shape[1]
    if k < 1 or k > MAX_TOPK or k & (k - 1) or not out.is_contiguous():
        raise ValueError(f"out_page_indices must be contiguous [B, k] with k a power of two <= {MAX_TOPK}, "
                         f"got {list(out.shape)}")
    if page_size != INDEX_PAGE_SIZE:
        raise ValueError(f"page_size must be {INDEX_PAGE_SIZE}, got {page_size}")
    if page_table.shape[1] and page_table.stride(1) != 1:
        raise ValueError("page_table needs a contiguous last dimension")
    if raw is not None:
        _check("out_raw_indices", raw, (batch, k), torch.int32, device)
        if not raw.is_contiguous():
            raise ValueError("out_raw_indices must be contiguous")


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def launch_pdl(device, batch: int, form: "SelectForm") -> bool:
    """Whether a two-kernel-path launch of ``batch`` rows whose select is ``form`` uses programmatic
    dependent launch on ``device`` (see :data:`PDL_MAX_BATCH`): the histogram select and the
    double-warp search, where H200 run 9 measured PDL faster, and the rank select (timed with it, runs 18 / 19)."""
    pdl_form = form.method in ("histogram", "rank") or form.warps_mul == 2
    return USE_PDL and batch <= PDL_MAX_BATCH and pdl_form and pdl_supported(torch.device(device))


def hist_reduce_mode(pages_per_split: int) -> int:
    """How the logits kernel's last program per row reduces the first digit (see :data:`USE_PDL`)."""
    return int(REDUCE_ONE_SHOT) if pages_per_split <= HIST_ONE_SHOT_MAX_PAGES else HIST_LONG_REDUCE


def hist_split_chunk(batch: int, width: int) -> int:
    """Entries per split program of the histogram select (see :data:`HIST_SPLIT_SMALL_MAX_PROGRAMS`)."""
    chunk = hist_chunk(width, HIST_SPLIT_MAX_CHUNK)
    if chunk > HIST_CHUNKS[0] and batch * _cdiv(width, chunk) <= HIST_SPLIT_SMALL_MAX_PROGRAMS:
        return HIST_CHUNKS[0]
    return chunk


def hist_one_block(programs: int) -> bool:
    return programs <= HIST_ONE_BLOCK_MAX_PROGRAMS


def hist_select_warps(programs: int, chunk: int) -> int:
    """Warps of the histogram select's programs: 8 up to HIST_SELECT_8_WARPS_MAX_PROGRAMS programs,
    else one per 512 entries (at least 4: 4 for the 2048-entry split)."""
    if programs <= HIST_SELECT_8_WARPS_MAX_PROGRAMS:
        return max(8, _hist_num_warps(chunk))
    return _hist_num_warps(max(chunk, HIST_FINAL_BLOCK))


def _kv_views(kv):
    flat = kv.view(kv.shape[0], INDEX_PAGE_BYTES) if kv.shape[0] else kv.reshape(0, INDEX_PAGE_BYTES)
    return flat.view(FP8), flat.view(torch.float32)


def _page_consts():
    return dict(D=INDEX_HEAD_DIM, H=INDEX_N_HEADS, PAGE=INDEX_PAGE_SIZE, PAGE_BYTES=INDEX_PAGE_BYTES,
                PAGE_WORDS=PAGE_WORDS, SCALE_WORDS=SCALE_WORD_OFFSET)


def logits_pages_per_split(batch: int, max_seq_len: int, programs: int = 0) -> int:
    """Pages per program of the logits kernel: enough programs to fill the GPU, shapes only (about ``programs``
    where set: the page-max overlap form's :attr:`SelectForm.overlap_programs`)."""
    pages = max(1, -(-max_seq_len // INDEX_PAGE_SIZE))
    return max(1, -(-pages * max(batch, 1) // (programs or LOGITS_TARGET_PROGRAMS)))


def paged_mqa_logits(q, kv, weights, lens, page_table, max_seq_len, *, scaled_dot=None, out=None,
                     hist_workspace=None, hist_k=INDEX_TOPK, page_max=False, hist_copies=None, overlap_programs=0):
    """FP8 paged MQA logits ``[B, max_seq_len]`` fp32 (``-inf`` past each length). With
    ``hist_workspace`` (:func:`hist_workspace`) it also counts the first-digit histogram and
    stores the bin of each row's ``hist_k``-th largest logit, where :func:`hist_select` starts; with
    ``page_max`` too, instead a bound at or below that logit from the page maxima (no counting);
    ``hist_copies`` copies of the histogram (None: :data:`HIST_COPIES`); ``overlap_programs`` (page-max form,
    :attr:`SelectForm.overlap_programs`): the row-major grid of about that many programs and the per-row ready
    flag of the overlap form, with PDL where supported; only for :func:`hist_select` ``overlap=True`` right after
    it (it zeroes the flags)."""
    validate_logits_inputs(q, kv, weights, lens, page_table, max_seq_len)
    if hist_workspace is not None:
        _check("hist_workspace", hist_workspace, (q.shape[0], WS_WIDTH), torch.int32, q.device)
    _ensure_hist_workspace(q.device)
    batch = q.shape[0]
    if out is None:
        out = torch.empty(batch, max_seq_len, dtype=torch.float32, device=q.device)
    elif out.shape != (batch, max_seq_len) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"out must be [{batch}, {max_seq_len}] float32 with a contiguous last dim")
    if batch == 0 or max_seq_len == 0:
        return out
    scaled = use_scaled_dot(q.device) if scaled_dot is None else scaled_dot
    kv_fp8, kv_f32 = _kv_views(kv)
    overlap_programs = overlap_programs if page_max and hist_workspace is not None else 0
    pps = logits_pages_per_split(batch, max_seq_len, overlap_programs)
    splits = -(-_cdiv(max_seq_len, INDEX_PAGE_SIZE) // pps)
    ws = hist_workspace if hist_workspace is not None else out
    if hist_copies is not None and hist_copies not in (1, 2, 4, 8) or (hist_copies or 0) > HIST_COPIES:
        raise ValueError(f"hist_copies must be None or a power of two <= {HIST_COPIES}, got {hist_copies!r}")
    hist = dict(HIST_BITS=HIST_DIGITS[0], R=hist_copies or HIST_COPIES, K=hist_k, WS_H1=WS_H1,
                REDUCE=hist_reduce_mode(pps)) if hist_workspace is not None else {}
    overlap = overlap_programs > 0
    if hist and page_max:
        hist.update(page_max_consts(batch, max_seq_len, overlap_programs))
    pdl = launch_pdl(q.device, batch, choose_plan(batch, max_seq_len).select)
    if overlap:
        pdl = USE_PDL and pdl_supported(q.device)
    _logits_kernel[(splits, batch) if overlap else (batch, splits)](
        q, kv_fp8, kv_f32, weights, lens, page_table, out, ws, max_seq_len, page_table.shape[1], kv.shape[0], pps,
        q.stride(0), weights.stride(0), page_table.stride(0), out.stride(0), ws.stride(0), **_page_consts(),
        USE_SCALED_DOT=scaled, **hist, PDL=pdl, num_warps=LOGITS_NUM_WARPS, num_stages=LOGITS_NUM_STAGES,
        launch_pdl=pdl)
    return out


# (B, positions) whose page-max logits kernel the AOT check compiles
PAGE_MAX_AOT_SHAPES = ((1, 65536), (16, 65536), (32, 32768), (64, 65536))
# the overlap form's buckets (B 17-32 x 32769-65536; B 33-64 x 16385-65536 with the lean register finish)
PAGE_MAX_OVERLAP_AOT_SHAPES = ((32, 65536), (64, 65536))


def page_max_consts(batch: int, max_seq_len: int, overlap_programs: int = 0) -> dict:
    """The logits kernel's page-max form: group maxima per program (the most, up to one per page row,
    with at most PAGE_MAX_KEYS per row), where they lie in the workspace, and the block the row's last
    program reads them in; ``overlap_programs`` > 0: the overlap form's programs, row-major grid, ready flag."""
    pages_per_split = logits_pages_per_split(batch, max_seq_len, overlap_programs)
    splits = _cdiv(max(1, _cdiv(max_seq_len, INDEX_PAGE_SIZE)), pages_per_split)
    if splits > PAGE_MAX_KEYS:
        raise ValueError(f"page-max form: {splits} logits programs per row, at most PAGE_MAX_KEYS = {PAGE_MAX_KEYS}")
    groups = min(INDEX_PAGE_SIZE, 1 << max(0, (PAGE_MAX_KEYS // splits).bit_length() - 1))
    return dict(PAGE_MAX=True, WS_PMAX_C=WS_PMAX, NPM=triton.next_power_of_2(splits * groups), GROUPS=groups,
                BOUND_BITS=PAGE_MAX_BOUND_BITS, ROW_MAJOR=overlap_programs > 0, READY=overlap_programs > 0)


_NO_PAGE_MAX = dict(PAGE_MAX=False, WS_PMAX_C=0, NPM=1, GROUPS=1, BOUND_BITS=PAGE_MAX_BOUND_BITS, ROW_MAJOR=False,
                    READY=False)


_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def _ensure_hist_workspace(device) -> None:
    """Create the histogram workspace on the first eager call of any indexer entry point, whatever
    that shape's plan, so that a shape first met inside a CUDA graph capture finds it."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        hist_workspace(0, device)


def hist_workspace(batch: int, device) -> torch.Tensor:
    """Rows ``[:batch]`` of the device's histogram-select workspace (``[INDEX_MAX_BATCH, WS_WIDTH]``
    int32, allocated zeroed once; every call leaves its rows zeroed, so no memset per call). Calls
    that use it must not overlap: one stream, as SGLang's decode runs the C4 layers one by one."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if batch > INDEX_MAX_BATCH:
        raise ValueError(f"batch must be <= {INDEX_MAX_BATCH} for the histogram select, got {batch}")
    ws = _WORKSPACES.get(device)
    if ws is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Allocated inside a capture it would live in the graph's pool and be zeroed only by
            # replays; SGLang runs every captured batch eagerly first, which allocates it here.
            raise RuntimeError("the histogram-select workspace must be created by an eager call before "
                               "CUDA graph capture (call hist_workspace(batch, device) once)")
        ws = _WORKSPACES[device] = torch.zeros(INDEX_MAX_BATCH, WS_WIDTH, dtype=torch.int32, device=device)
    return ws[:batch]


def hist_chunk(n: int, max_chunk: int = HIST_CHUNKS[-1]) -> int:
    return next((c for c in HIST_CHUNKS if c >= min(n, max_chunk)), HIST_CHUNKS[-1])


def _hist_num_warps(entries: int) -> int:
    return max(4, entries // 512)


def _hist_digit_consts():
    b1, b2, b3 = HIST_DIGITS
    return dict(B1=b1, B2=b2, WS_H2=WS_H2)


def _hist_select_consts(k, has_raw, chunk, one_block=False, page_max=False, spin=False):
    return dict(CHUNK=chunk, K=k, PAGE=INDEX_PAGE_SIZE, CAP=HIST_CAP, HAS_RAW=has_raw, B3=HIST_DIGITS[2],
                WS_H3=WS_H3, WS_CLEAN=PAGE_MAX_CLEAN if page_max else WS_H1, BLOCK=HIST_FINAL_BLOCK,
                ONE_BLOCK=one_block, PAGE_MAX=page_max, SPIN=spin, **_hist_digit_consts())


def hist_select(scores, lens, page_table, out, raw, workspace, *, page_max=False, overlap=False, reg_finish=False,
                reg_lean=False):
    """Top-``out.shape[1]`` of each scores row from the first-digit histogram already counted in
    ``workspace`` (by the logits kernel or :func:`_score_hist_kernel`): one launch whose split
    programs send each row's entries above the K-th key's bin out, and whose last program per row
    finishes it. Long rows list their selection in no fixed order (slots are claimed with atomics);
    the set is exact, ties at the K-th score going to entries in list order. ``overlap`` (page-max form,
    right after :func:`paged_mqa_logits` with ``overlap=True``): grid (groups, B), launched with PDL where
    supported, each program waiting for its row's ready flag instead of the whole logits launch. ``reg_finish``
    (page-max form): a row's candidate list of at most HIST_FINAL_BLOCK entries is finished in registers;
    ``reg_lean`` with it: the split programs skip the first-digit count."""
    batch, width = scores.shape
    overlap = page_max and overlap
    reg_finish = page_max and reg_finish
    chunk = hist_split_chunk(batch, width)
    cand_val = torch.empty(batch, HIST_CAP, dtype=torch.float32, device=scores.device)
    cand_pos = torch.empty(batch, HIST_CAP, dtype=torch.int32, device=scores.device)
    raw_arg = raw if raw is not None else out
    pdl = launch_pdl(scores.device, batch, _HISTOGRAM)
    if overlap:
        pdl = USE_PDL and pdl_supported(scores.device)
    programs = batch * _cdiv(width, chunk)
    warps = hist_select_warps(programs, chunk)
    groups = _cdiv(width, chunk)
    _hist_select_kernel[(groups, batch) if overlap else (batch, groups)](
        scores, lens, page_table, workspace, cand_val, cand_pos, out, raw_arg, width, page_table.shape[1],
        scores.stride(0), page_table.stride(0), workspace.stride(0), cand_val.stride(0), out.stride(0),
        raw_arg.stride(0), **_hist_select_consts(out.shape[1], raw is not None, chunk,
                                                 page_max or hist_one_block(programs), page_max, overlap),
        REG_FINISH=reg_finish, REG_DIGIT_BITS=REG_FINISH_DIGIT_BITS, REG_LEAN=reg_finish and reg_lean, PDL=pdl,
        num_warps=warps, num_stages=1, launch_pdl=pdl,
        **register_cap_option(REG_FINISH_MAX_REGISTERS[warps] if reg_finish else 0))
    return out


def _hist_topk_from_scores(scores, lens, page_table, out, raw):
    workspace = hist_workspace(scores.shape[0], scores.device)
    chunk = hist_chunk(scores.shape[1])
    pdl = launch_pdl(scores.device, scores.shape[0], _HISTOGRAM)
    _score_hist_kernel[(scores.shape[0], _cdiv(scores.shape[1], chunk))](
        scores, lens, workspace, scores.shape[1], page_table.shape[1], scores.stride(0), workspace.stride(0),
        CHUNK=chunk, PAGE=INDEX_PAGE_SIZE, K=out.shape[1], B1=HIST_DIGITS[0], R=HIST_COPIES, WS_H1=WS_H1,
        PDL=pdl, REDUCE=hist_reduce_mode(chunk // INDEX_PAGE_SIZE), num_warps=_hist_num_warps(chunk), num_stages=1,
        launch_pdl=pdl)
    return hist_select(scores, lens, page_table, out, raw, workspace)


def select_chunk(n: int, k: int, max_chunk: int = SELECT_MAX_CHUNK) -> int:
    """Entries one select program holds: the smallest shipped chunk up to ``max_chunk`` covering n (at
    least 2k for intermediate levels so that the merge tree shrinks), else ``max_chunk``."""
    for chunk in SELECT_CHUNKS:
        if chunk >= max(n, k) or chunk >= max_chunk:
            return chunk
    return SELECT_CHUNKS[-1]


def _select_warps(chunk: int, warps_mul: int = 1) -> int:
    """Warps of a select program over ``chunk`` entries: 16 entries a thread from 2048 up, or
    ``warps_mul`` times as many warps (at most 16: 32 warps cap ptxas at 64 registers and spill).
    Half the warps measured 2.6x slower on the H200 (run 4): the search is bound by per-thread work."""
    return min(SELECT_MAX_WARPS, max(4, chunk // 512) * warps_mul)


def _merge(vals, pos, lens, page_table, out, raw, implicit, form):
    """Reduce candidate rows ``vals``/``pos`` ``[B, n]`` (or a logits row when ``implicit``) to the
    final slot ids in ``out`` through levels of :func:`_select_kernel`."""
    batch, k = out.shape
    n = vals.shape[1]
    pdl = launch_pdl(vals.device, batch, form)
    while True:
        chunk = select_chunk(n, k, form.max_chunk)
        groups = -(-n // chunk)
        final = groups == 1
        if final:
            dst_val, dst_pos = out, out
        else:
            dst_val = torch.empty(batch, groups * k, dtype=torch.float32, device=vals.device)
            dst_pos = torch.empty(batch, groups * k, dtype=torch.int32, device=vals.device)
        _select_kernel[(batch, groups)](
            vals, vals if pos is None else pos, lens, page_table, dst_val, dst_pos,
            raw if raw is not None else out, n, page_table.shape[1], vals.stride(0), dst_pos.stride(0),
            page_table.stride(0), raw.stride(0) if raw is not None else 0,
            CHUNK=chunk, K=k, PAGE=INDEX_PAGE_SIZE, IMPLICIT_POS=implicit and pos is None, FINAL=final,
            HAS_RAW=raw is not None, PDL=pdl, num_warps=_select_warps(chunk, form.warps_mul),
            num_stages=1, launch_pdl=pdl)
        if final:
            return out
        vals, pos, n = dst_val, dst_pos, groups * k


def rank_warps(form: "SelectForm") -> int:
    return 4 * form.warps_mul


def rank_select(scores, lens, page_table, out, raw, form):
    """Top-``out.shape[1]`` of each scores row by rank (:func:`_rank_select_kernel`): one launch of
    ``B * cdiv(width, form.rank_rows)`` programs, each comparing its positions with the whole row."""
    batch, width = scores.shape
    pdl = launch_pdl(scores.device, batch, form)
    raw_arg = raw if raw is not None else out
    _rank_select_kernel[(batch, _cdiv(width, form.rank_rows))](
        scores, lens, page_table, out, raw_arg, width, page_table.shape[1], scores.stride(0), page_table.stride(0),
        out.stride(0), raw_arg.stride(0), K=out.shape[1], PAGE=INDEX_PAGE_SIZE, ROWS=form.rank_rows,
        BLOCK_J=RANK_BLOCK_J, HAS_RAW=raw is not None, PDL=pdl, num_warps=rank_warps(form), num_stages=1,
        launch_pdl=pdl)
    return out


def topk_transform_paged(scores, lens, page_table, out, page_size=INDEX_PAGE_SIZE, raw=None, *, select=None):
    """``topk_transform_paged`` contract: top-``out.shape[1]`` positions of each scores row (below its
    length) as cache slot ids in ``out`` (-1 padded); optionally the raw positions in ``raw``.
    ``select`` (a :class:`SelectForm`) defaults to :func:`choose_plan`'s for the shape."""
    validate_topk_inputs(scores, lens, page_table, out, page_size, raw)
    _ensure_hist_workspace(scores.device)
    form = _select_form(scores.shape[0], scores.shape[1], select)
    if scores.shape[0] == 0:
        return out
    if scores.shape[1] == 0:
        out.fill_(-1)
        if raw is not None:
            raw.fill_(-1)
        return out
    if form.method == "histogram":
        return _hist_topk_from_scores(scores, lens, page_table, out, raw)
    if form.method == "rank":
        return rank_select(scores, lens, page_table, out, raw, form)
    return _merge(scores, None, lens, page_table, out, raw, implicit=True, form=form)


SELECT_WARPS_MULS = (1, 2)
SELECT_METHODS = ("search", "histogram", "rank")
HIST_THRESHOLDS = ("count", "page_max")
HIST_FINISHES = ("histograms", "registers", "registers_lean")


@dataclasses.dataclass(frozen=True)
class SelectForm:
    """How the select programs search (32-step bitwise search; 16 radix-4 rounds were slower where a
    row spans several programs and lost to ``warps_mul`` 2 elsewhere: H200 runs 4 and 5a, see
    :data:`PLAN_TABLE`; removed): ``max_chunk`` is the largest chunk one program holds (8192: 16
    warps, one merge level fewer on long rows); ``warps_mul`` 2 doubles the warps of programs below
    8192 entries (half the entries per thread). ``method`` "histogram" replaces the
    search: the logits kernel counts a per-row histogram of each key's top 11 bits, one split pass
    sends the entries above the K-th key's bin out and keeps that bin's entries, its last program
    per row finishes from two more digit histograms (:func:`hist_select`); the search fields do not apply.
    ``method`` "rank" ranks every position of a row against the whole row in one launch
    (:func:`rank_select`: ``rank_rows`` positions per program on 4 * ``warps_mul`` warps)."""
    max_chunk: int = SELECT_MAX_CHUNK
    warps_mul: int = 1
    method: str = "search"
    # histogram: where the split pass's threshold comes from. "count": the logits kernel counts every logit
    # into the first-digit histogram; "page_max": each logits program keeps the elementwise max over its
    # pages and stores group maxima, from which the row's last program derives a bound at or below the K-th
    # largest logit (no atomic per logit).
    threshold: str = "count"
    # "count": copies of the first-digit histogram the logits kernel counts into (None: HIST_COPIES)
    copies: int | None = None
    # "page_max": > 0 runs the overlap form (PAGE_MAX_OVERLAP_PROGRAMS): about this many logits programs in a
    # row-major grid, each row's select programs waiting for that row's ready flag instead of the whole launch
    overlap_programs: int = 0
    # "rank" (:func:`rank_select`): positions each program ranks; its warps are 4 * warps_mul
    rank_rows: int = 8
    # "page_max": how the finishing program selects from the row's candidate list. "histograms": by three digit
    # histograms in the workspace (L2 atomics, a round trip each); "registers": a list of at most HIST_FINAL_BLOCK
    # entries in one register block by tl.histogram rounds (:func:`_top_in_registers`); "registers_lean": the
    # same, and the split programs do not count the candidates' first digit (a longer list's finish counts it)
    finish: str = "histograms"

    def __post_init__(self):
        if self.method not in SELECT_METHODS:
            raise ValueError(f"method must be one of {SELECT_METHODS}, got {self.method!r}")
        if self.threshold not in HIST_THRESHOLDS or (self.threshold != "count" and self.method != "histogram"):
            raise ValueError(f"threshold must be one of {HIST_THRESHOLDS} ('page_max' only with method "
                             f"'histogram'), got {self.threshold!r}")
        if self.copies is not None and (self.copies not in (1, 2, 4, 8) or self.copies > HIST_COPIES
                                        or self.method != "histogram" or self.threshold != "count"):
            raise ValueError(f"copies must be None or a power of two <= {HIST_COPIES} (histogram select, "
                             f"threshold 'count'), got {self.copies!r}")
        if self.overlap_programs and (self.overlap_programs < 0 or self.threshold != "page_max"):
            raise ValueError(f"overlap_programs must be 0, or > 0 with threshold 'page_max', "
                             f"got {self.overlap_programs!r}")
        if self.max_chunk not in SELECT_CHUNKS or self.max_chunk < 2 * MAX_TOPK:
            raise ValueError(f"max_chunk must be one of {SELECT_CHUNKS} and >= {2 * MAX_TOPK}, got {self.max_chunk!r}")
        if self.warps_mul not in SELECT_WARPS_MULS:
            raise ValueError(f"warps_mul must be one of {SELECT_WARPS_MULS}, got {self.warps_mul!r}")
        if self.finish not in HIST_FINISHES or (self.finish != "histograms" and self.threshold != "page_max"):
            raise ValueError(f"finish must be one of {HIST_FINISHES} (the registers forms only with threshold "
                             f"'page_max'), got {self.finish!r}")
        if self.rank_rows not in RANK_ROWS:
            raise ValueError(f"rank_rows must be one of {RANK_ROWS}, got {self.rank_rows!r}")


@dataclasses.dataclass(frozen=True)
class Plan:
    path: str  # "fused" | "two_kernel"
    split_pages: int = 0  # fused: pages per split program
    select: SelectForm = SelectForm()
    # The search form for a logits row computed elsewhere (topk_transform_paged without a select):
    # a histogram select needs the logits kernel's histogram, and counting it in a pass of its own
    # measured slower than the search (H200 run 5b). None: ``select``.
    unfused_select: SelectForm | None = None

    @property
    def scores_select(self) -> SelectForm:
        return self.unfused_select or self.select


def _select_form(batch, width, select):
    if select is None:
        return choose_plan(batch, width).scores_select
    if not isinstance(select, SelectForm):
        raise ValueError(f"select must be a SelectForm, got {type(select).__name__}")
    return select


# Decision table, per (batch, compressed length) bucket: the first row whose limits cover the shape
# wins. Path: the two-kernel path won every shape in runs 1-4 (writing the fp32 logits row costs ~3 %
# of the index-K bytes, less than the in-kernel selection costs the bandwidth-bound fused split; the
# fused path stays selectable, SGLANG_SM120_INDEXER_PATH=fused, for measuring it on sm_120).
# Select form, from H200 run 4 (benchmarks/indexer-h200-run4.md, us per call, logits + top-512):
#
#   B   context  bitwise 4096  radix-4 (2 bits)  bitwise 8192    B   context  bitwise 4096  bitwise 8192
#   1   8K       13.58         13.18             13.61           64  8K       19.77         19.64
#   16  8K       15.32         14.86             15.26           64  64K      80.19         74.11
#   1   64K      27.33         33.59             33.07           1   256K     40.24         42.14
#   16  64K      37.97         47.17             43.33           16  256K     91.04         82.61
#   1   1M       55.74         74.50             68.08           64  256K     273.2         255.0
#
# Radix-4 won (run 4) only where one program holds the whole row (2048 entries) at B <= 16; the
# double-warp bitwise search beats it there (run 5a, below), so the radix-4 search was removed.
# 8192-entry chunks (one merge level fewer) win with many rows of 16K-64K positions. Batch limits
# sit between the measured batches (1, 16, 64); larger batches take the B=64 choice; 1M context
# (B=1 measured) keeps the bitwise 4096 form.
#
# Histogram select, H200 run 5b (benchmarks/indexer-h200-run5b.md, logits + top-512, us):
#
#   B   context  default  histogram    B   context  default  histogram
#   1   8K       13.20    27.32        16  256K     82.30    95.43
#   16  8K       14.92    30.17        64  8K       19.66    38.20
#   1   64K      27.33    31.05        64  64K      72.97    84.88
#   16  64K      37.99    44.07        64  256K     256.9    247.4  <- 3.7 % faster
#   1   256K     40.24    39.40        1   1M       56.22    81.31
#   256 8K       35.63    72.84
#
# It wins clearly only at B=64 x 256K (many long rows), so B > 32 with 16K-64K positions takes it
# (the seam then defers the logits to the top-k call, whose logits kernel counts the histogram);
# B=1 x 256K (0.8 us, 2 %) kept the search until run 6 (below). A logits row from elsewhere keeps
# the 8192-chunk search there (histogram counted in a pass of its own: 135.1 vs 97.8 us top-k alone).
#
# Twice the warps per select program (bitwise search, H200 run 5a, benchmarks/indexer-h200-run5a.md;
# the old defaults moved by at most 0.2 % at 8K and 0.6 % at B=16 x 64K between runs 5a and 5b):
#
#   B   context  default           2x warps     B   context  default          2x warps
#   1   8K       13.22 (radix-4)   12.94        1   64K      27.24 (bitwise)  27.43
#   16  8K       14.93 (radix-4)   14.71        16  64K      38.23 (bitwise)  37.62
#   64  8K       19.66 (bitwise)   18.94        64  64K      74.29 (8192)     79.75
#   256 8K       35.59 (bitwise)   35.38        (256K, 1M: slower by 2-12 %)
#
# so 8K context and B=16 x 64K take it.
#
# Copy-major histogram copies (H200 runs 6 / 6b, benchmarks/indexer-h200-run6-summary.md, us; the
# old default and the interleaved copies timed in run 6 next to the copy-major form):
#
#   B   context  old default          interleaved  copy-major (6 / 6b)
#   64  256K     262.3 (interleaved)  262.0        232.8 / 234.3   <- 11 % faster
#   1   256K     40.26 (bitwise)      39.86        36.08 / 36.0    <- 10 % faster
#   16  256K     82.22 (8192)         99.23        85.23 / 86.5
#   1   1M       54.96 (bitwise)      81.37        65.74 / 65.5
#   64  64K      73.30 (8192)         85.22        84.66 / 84.7
#   16  64K      37.66 (2x warps)     45.60        45.09 / 44.5
#   1   64K      27.31 (bitwise)      31.34        30.43 / 30.3
#
# so B <= 4 above 32768 positions (between the measured 16384 and 65536) takes the histogram too.
#
# The passes after the logits (H200 run 7, benchmarks/indexer-h200-run7-summary.md, us): the split
# pass's last program per row finishes it over 1024-entry blocks, split programs of 2048 entries
# (shipped), against the run-6 histogram select (split programs of 4096, then one program per row
# over 4096-entry blocks) and the search defaults:
#
#   B   context  default           run-6 hist  final 1024  folded 4096/4096  folded 4096/1024  shipped
#   64  256K     232.9 (hist)      233.0       229.3       244.0             235.5             219.5
#   1   256K     36.0 (hist)       36.1        31.9        38.3              31.3              30.8
#   16  256K     82.7 (8192)       85.9        82.0        91.1              81.5              82.2
#   64  64K      73.2 (8192)       84.6        80.5        89.8              80.4              80.6
#   1   1M       55.5 (bitwise)    65.4        61.6        70.2              61.1              60.4
#   16  64K      37.7 (2x warps)   44.8        40.4        47.1              39.7              39.0
#
# The buckets stayed: the search still won at B=64 x 64K, B=1 x 1M and B=16 x 64K; at B=16 x 256K
# the histogram forms were within 1.5 % of it (81.5-82.2 vs 82.7), not enough to move B=5-32.
#
# The buckets against run 7's histogram select (H200 run 8, benchmarks/indexer-h200-run8-summary.md,
# us; every shipped search form forced beside the default in the same run):
#
#   B   context  positions  default          histogram  bitwise  2x warps  8192
#   1   16K      4096       16.4 (bitwise)   23.5       16.4     17.6      16.4
#   1   32K      8192       24.1 (bitwise)   24.0       24.1     25.3      25.1
#   1   64K      16384      27.4 (bitwise)   24.3       27.4     27.6      33.1   <- 11 % faster
#   2   64K      16384      28.3 (bitwise)   25.9       28.4     28.5      34.1   <- 8 % faster
#   4   64K      16384      30.0 (bitwise)   30.0       30.0     30.2      35.8
#   1   128K     32768      31.6 (bitwise)   26.1       31.6     33.0      37.1   <- 17 % faster
#   4   128K     32768      35.8 (bitwise)   30.9       35.8     37.2      41.2   <- 14 % faster
#   8   128K     32768      47.6 (8192)      39.2       41.6     42.2      47.6   <- 18 % faster
#   16  128K     32768      59.1 (8192)      51.4       52.5     52.1      59.3   <- 13 % faster
#   32  128K     32768      78.3 (8192)      81.0       83.3     84.0      78.2
#   8   256K     65536      63.6 (8192)      53.8       59.2     59.7      63.5   <- 15 % faster
#   16  256K     65536      82.3 (8192)      81.2       90.3     91.7      82.2   (1.3 %: stays)
#   32  256K     65536      140.6 (8192)     129.0      151.6    155.2     140.6  <- 8 % faster
#   16  64K      16384      37.7 (2x warps)  39.1       37.9     37.7      43.8
#   64  32K      8192       45.2 (8192)      54.5       45.4     45.8      45.1
#   64  64K      16384      73.4 (8192)      80.2       79.4     79.2      73.2
#
# (B=2 / 4 at 16K-32K context as B=1: the histogram 7 us slower at 4096 positions, level at 8192.)
# So the histogram select takes B <= 2 above 8192 positions, B <= 4 above 16384, B <= 16 at
# 16385-32768, B <= 8 up to 65536 and B > 16 at 32769-65536; each limit sits between a timed size
# where it won by >= 8 % and one where it did not win by 2 %. A logits row computed elsewhere keeps the
# search form the bucket had (its top-k alone was not re-timed).
#
# With run 9's launches (PDL, first-digit reduce, lean select: see USE_PDL) the histogram select takes
# three more buckets (H200 run 9b, us, the default as of run 8 with its launches, 'run8', against today's):
#
#   B   context  positions  run8 default      shipped (histogram)
#   4   64K      16384      30.2 (bitwise)    22.2   <- 26 % faster   (B 3-4 x 8193-16384)
#   10  64K      16384      33.9 (2x warps)   29.3   <- 14 % faster   (B 9-16 x 8193-16384)
#   16  64K      16384      37.7 (2x warps)   34.2   <- 9 % faster
#   10  256K     65536      68.0 (8192)       56.8   <- 16 % faster   (B 9-16 x 32769-65536)
#   16  256K     65536      82.7 (8192)       75.3   <- 9 % faster
#
# B 5-8 x 8193-16384 (not timed) keeps the double-warp search; a logits row from elsewhere keeps each
# bucket's search form.
#
# With run 10's atomic split programs the histogram select also takes B > 16 x 8193-16384 (H200 runs
# 10 / 10b, us, the forced histogram row against the default of the time in the same run):
#
#   B    context  positions  default                  histogram
#   32   64K      16384      47.5 (2x warps, 10b)     44.6   <- 6.1 % faster   (B 17-32 x 8193-16384)
#   64   64K      16384      72.7 / 73.2 (8192)       67.8 / 67.5   <- 6.7 / 7.9 % faster   (B > 32)
#   128  64K      16384      130.6 (8192, 10b)        115.8  <- 11.3 % faster
#
# The lower limit 8193 sits between 16384 and 8192 positions, where run 8 timed the histogram select
# slower at B=64 (54.5 vs 45.2 us, before runs 9-10); B=256 (not timed) follows B=64 and 128.
#
# H200 run 11b (benchmarks/indexer-h200-run11-summary.md, us, every row reference-checked, same run): the
# page-max threshold (no count per logit; the one-block finish at every program count) and the count into
# one histogram copy (the one-shot reduce reads 1 copy instead of 8: fewer registers) against the defaults:
#
#   B   context  positions  default (count, 8 copies)  count, 1 copy  page max
#   4   64K      16384      19.50                      17.58          20.83     <- 1 copy  (B 3-4 x 8193-16384)
#   16  64K      16384      32.23                      26.58          28.23     <- 1 copy  (B 9-16 x 8193-16384)
#   32  64K      16384      44.73                      43.04          40.64     <- page max (B 17-32 x 8193-16384)
#   64  64K      16384      67.69                      65.59          63.17     <- page max (B 33-64 x 8193-16384)
#   16  128K     32768      43.02                      44.49          38.93     <- page max (B 5-16 x 16385-32768)
#   8   256K     65536      44.05                      45.78          37.85     <- page max (B 5-8 x 32769-65536)
#   10  256K     65536      50.19                      52.48          44.75     <- page max (B 9-16 x 32769-65536)
#   16  256K     65536      68.92                      70.36          58.96     <- page max
#   32  256K     65536      120.44                     125.56         102.12    <- page max (B 17-64 x 32769-65536,
#                                                                                  B 33-64 x 16385-32768)
#   64  256K     65536      197.86                     195.78         182.63    <- page max
#   1   256K     65536      19.35                      22.82          20.88
#   1   64K      16384      13.46                      13.90          15.61
#
# B > 64 keeps the count (not timed; the page-max bound needs K group maxima per row: at B=256 x 256K the
# logits programs hold 256 pages and a row has 256 groups, so every logit would be a candidate).
#
# H200 run 14 (benchmarks/indexer-h200-run14-summary.md, us, same run, 0 violations): the page-max overlap form
# (row-major logits grid, per-row ready flag, the select waiting per row) at 1024 (one wave) / 2048 / 4096 logits
# programs against the shipped page max (1024 programs, default grid):
#
#   B   context  positions  page max  overlap 1024  overlap 2048  overlap 4096
#   16  256K     65536      58.9      60.6          59.2          62.0
#   32  256K     65536      101.8     101.8         98.3          100.7    <- overlap 2048 (B 17-32 x 32769-65536)
#   64  256K     65536      182.8     185.1         180.3         182.8    (1.4 %: below the 2 % bar, not shipped)
_BITWISE = SelectForm()
_BITWISE_2XW = SelectForm(warps_mul=2)
_CHUNK8K = SelectForm(max_chunk=8192)
_HISTOGRAM = SelectForm(method="histogram")
_HIST_UNFUSED_BITWISE = Plan("two_kernel", select=_HISTOGRAM, unfused_select=_BITWISE)
_HIST_UNFUSED_BITWISE_2XW = Plan("two_kernel", select=_HISTOGRAM, unfused_select=_BITWISE_2XW)
_HIST_UNFUSED_CHUNK8K = Plan("two_kernel", select=_HISTOGRAM, unfused_select=_CHUNK8K)
_HIST1 = SelectForm(method="histogram", copies=1)
_PAGE_MAX = SelectForm(method="histogram", threshold="page_max")
_PAGE_MAX_UNFUSED_2XW = Plan("two_kernel", select=_PAGE_MAX, unfused_select=_BITWISE_2XW)
_PAGE_MAX_UNFUSED_CHUNK8K = Plan("two_kernel", select=_PAGE_MAX, unfused_select=_CHUNK8K)
_PAGE_MAX_OVERLAP = SelectForm(method="histogram", threshold="page_max", overlap_programs=PAGE_MAX_OVERLAP_PROGRAMS)
#
# H200 runs 21 / 22 (benchmarks/indexer-h200-run21.md, -run22.md, us, logits + top-512, 0 violations): the overlap form
# with the lean register finish (a row's candidate list finished in registers, the split programs without their
# first-digit atomics) against the defaults of the time:
#
#   B   context  positions  default               overlap 2048  overlap 2048 + lean
#   64  256K     65536      183.5 / 184.0 (pmax)  180.8 / 181.6 173.6 / 175.0  <- 1.057x / 1.051x
#   48  256K     65536      144.5 (pmax)          140.8         135.8          <- 1.064x
#   40  256K     65536      124.0 (pmax)          119.9         116.5          <- 1.065x
#   64  128K     32768      104.8 (pmax)          102.3         99.3           <- 1.055x
#   64  96K      24576      86.1 (pmax)           81.4          81.2           <- 1.060x
#   32  256K     65536      98.2 / 98.9 (overlap) -             96.4 / 97.3    (1.018x / 1.016x: under the 2 % bar)
#   24  256K     65536      78.2 (overlap)        -             78.7
#
# Without the overlap the register finish lost everywhere (1-18 %, run 21). Run 22 also found B=32 x 128K (32768
# positions) on the chunked search at 78.0 us against 61.8 with the page max its neighbours take (1.26x): that bucket
# now takes the page max too. Run 23 (indexer-h200-run23.md, the new defaults against the forms they replaced):
#
#   B   context  positions  new default          replaced             overlap 2048
#   36  256K     65536      105.9 (overlap+lean) 113.1 (pmax)         108.1
#   64  256K     65536      173.5 (overlap+lean) 182.8 (pmax)         180.7
#   64  80K      20480      71.8 (overlap+lean)  76.0 (pmax)          71.2
#   33  128K     32768      63.3 (overlap+lean)  62.8 (pmax)          62.7   (the bucket's corner: level)
#   64  64K+4    16385      64.6 (overlap+lean)  64.3 (pmax)          64.0   (level)
#   32  128K     32768      61.6 (pmax)          78.4 (chunked search)
#   24  128K     32768      51.8 (pmax)          68.4 (chunked search)
#   20  96K      24576      39.2 (pmax)          58.3 (chunked search)
_PAGE_MAX_OVERLAP_LEAN = dataclasses.replace(_PAGE_MAX_OVERLAP, finish="registers_lean")
#
# H200 runs 18 / 19 (benchmarks/indexer-h200-run19-summary.md, us, same run, 0 violations): the rank select (every
# pair of a row's positions compared in one launch, the selection listed best first) against the defaults of the
# time, logits + top-512:
#
#   B   context  positions  default          rank 8 rows, 8 warps  rank 16 rows, 4 warps
#   1   8K       2048       11.88 (2x warps) 6.53  <- 1.82x        6.86
#   2   8K       2048       11.92 (2x warps) 8.35                  7.68  <- 1.55x
#   4   8K       2048       12.16 (2x warps) 11.34                 10.38    (layer run 17: slower in the C4 layer)
#   1   16K      4096       12.03 (hist)     10.48                 9.92  <- 1.21x
#   2   16K      4096       16.58 (bitwise)  17.29                 15.32 <- 1.08x
#   1   32K      8192       23.90 (bitwise)  26.15                 22.88 <- 1.04x
#
# (run 18: B = 8 / 16 / 32 x 8K 15.45 / 25.78 / 45.55 at best against 12.6 / 13.6 / 16.4: the pairs grow with B x
# positions^2). Run 20 (the shipped table): 1 x 32K 23.57 (rank) vs 23.44 us (2x-warp search), so one row above 4096
# positions keeps the search; 1 x 8K 6.59, 2 x 8K 7.77, 1 x 16K 9.86, 2 x 16K 14.86 us. In the C4 layer at 8K
# (bench-variants-h200-run17, median of 30 replays): T=1 B=1 125.74 -> 122.35 us, T=4 B=1 87.94 -> 82.55, T=1 B=2
# 162.37 -> 160.71, T=4 B=2 110.77 -> 107.65 (8 rows, 8 warps); B=4 slower.
_RANK_R8 = SelectForm(method="rank", rank_rows=8, warps_mul=2)
_RANK_R16_W4 = SelectForm(method="rank", rank_rows=16)
PLAN_TABLE: tuple[tuple[int, int, Plan], ...] = (
    (1, 2048, Plan("two_kernel", select=_RANK_R8)),
    (2, 2048, Plan("two_kernel", select=_RANK_R16_W4)),
    (INDEX_MAX_BATCH, 2048, Plan("two_kernel", select=_BITWISE_2XW)),
    (2, 4096, Plan("two_kernel", select=_RANK_R16_W4)),  # run 15's histogram (1 x 16K 13.41 us) before run 19
    (2, 8192, Plan("two_kernel", select=_BITWISE)),
    (2, 65536, _HIST_UNFUSED_BITWISE),
    (4, 8192, Plan("two_kernel", select=_BITWISE)),
    (4, 16384, Plan("two_kernel", select=_HIST1, unfused_select=_BITWISE)),
    (4, 65536, _HIST_UNFUSED_BITWISE),
    (8, 16384, Plan("two_kernel", select=_BITWISE_2XW)),
    (16, 8192, Plan("two_kernel", select=_BITWISE_2XW)),
    (16, 16384, Plan("two_kernel", select=_HIST1, unfused_select=_BITWISE_2XW)),
    (32, 8192, Plan("two_kernel", select=_BITWISE_2XW)),
    (32, 16384, _PAGE_MAX_UNFUSED_2XW),
    (INDEX_MAX_BATCH, 8192, Plan("two_kernel", select=_CHUNK8K)),
    (64, 16384, _PAGE_MAX_UNFUSED_CHUNK8K),
    (INDEX_MAX_BATCH, 16384, _HIST_UNFUSED_CHUNK8K),
    (16, 32768, _PAGE_MAX_UNFUSED_CHUNK8K),
    (8, 65536, _PAGE_MAX_UNFUSED_CHUNK8K),
    (32, 32768, _PAGE_MAX_UNFUSED_CHUNK8K),  # run 22 (the chunked search before)
    (16, 65536, _PAGE_MAX_UNFUSED_CHUNK8K),
    (32, 65536, Plan("two_kernel", select=_PAGE_MAX_OVERLAP, unfused_select=_CHUNK8K)),  # run 14
    (64, 65536, Plan("two_kernel", select=_PAGE_MAX_OVERLAP_LEAN, unfused_select=_CHUNK8K)),  # runs 21 / 22
    (INDEX_MAX_BATCH, 65536, _HIST_UNFUSED_CHUNK8K),
    (INDEX_MAX_BATCH, INDEX_MAX_COMPRESSED_LEN, Plan("two_kernel", select=_BITWISE)),
)


def choose_plan(batch: int, max_seq_len: int) -> Plan:
    for max_batch, max_len, plan in PLAN_TABLE:
        if batch <= max_batch and max_seq_len <= max_len:
            return plan
    return PLAN_TABLE[-1][2]


def fused_logits_topk(q, kv, weights, lens, page_table, max_seq_len, out, raw=None, *, split_pages=16,
                      scaled_dot=None, select=None):
    """Top-k slot ids straight from q and the index-K cache; only per-split candidates hit memory."""
    validate_logits_inputs(q, kv, weights, lens, page_table, max_seq_len)
    form = _select_form(q.shape[0], max_seq_len, select)
    if select is None and form.method == "rank":
        form = _BITWISE  # the shape's select ranks a logits row; the split candidates are merged by the search
    if form.method != "search":
        raise ValueError("select must be a search form for the fused path (its merge has no histogram)")
    if split_pages not in FUSED_SPLIT_PAGES:
        raise ValueError(f"split_pages must be one of {FUSED_SPLIT_PAGES}, got {split_pages}")
    batch = q.shape[0]
    _check("out", out, (batch, None), torch.int32, q.device)
    k = out.shape[1]
    if k < 1 or k > MAX_TOPK or k & (k - 1) or not out.is_contiguous():
        raise ValueError(f"out must be contiguous [B, k], k a power of two <= {MAX_TOPK}; got {list(out.shape)}")
    if raw is not None:
        _check("raw", raw, (batch, k), torch.int32, q.device)
    if batch == 0:
        return out
    if max_seq_len == 0:
        out.fill_(-1)
        if raw is not None:
            raw.fill_(-1)
        return out
    scaled = use_scaled_dot(q.device) if scaled_dot is None else scaled_dot
    kv_fp8, kv_f32 = _kv_views(kv)
    pages = -(-max_seq_len // INDEX_PAGE_SIZE)
    splits = -(-pages // split_pages)
    block = min(k, split_pages * INDEX_PAGE_SIZE)
    cand_val = torch.empty(batch, splits * block, dtype=torch.float32, device=q.device)
    cand_pos = torch.empty(batch, splits * block, dtype=torch.int32, device=q.device)
    _fused_split_kernel[(batch, splits)](
        q, kv_fp8, kv_f32, weights, lens, page_table, cand_val, cand_pos, max_seq_len, page_table.shape[1],
        kv.shape[0], q.stride(0), weights.stride(0), page_table.stride(0), cand_val.stride(0), **_page_consts(),
        R_PAGES=split_pages, K=k, CB=block, USE_SCALED_DOT=scaled,
        num_warps=fused_num_warps(split_pages), num_stages=LOGITS_NUM_STAGES)
    return _merge(cand_val, cand_pos, lens, page_table, out, raw, implicit=False, form=form)


def fused_num_warps(split_pages: int) -> int:
    return 4 if split_pages <= 16 else 8


def indexer_topk(q, kv, weights, lens, page_table, max_seq_len, out, raw=None, *, plan=None, scaled_dot=None):
    """Logits plus top-k by the plan for this shape (:data:`PLAN_TABLE`); returns ``out``."""
    plan = plan or choose_plan(q.shape[0], max_seq_len)
    _ensure_hist_workspace(q.device)
    if plan.path == "fused":
        return fused_logits_topk(q, kv, weights, lens, page_table, max_seq_len, out, raw,
                                 split_pages=plan.split_pages, scaled_dot=scaled_dot, select=plan.select)
    if plan.select.method == "histogram":
        validate_topk_inputs(torch.empty(q.shape[0], 0, device=q.device), lens, page_table, out, INDEX_PAGE_SIZE, raw)
        if q.shape[0] == 0:
            return out
        if max_seq_len == 0:
            out.fill_(-1)
            if raw is not None:
                raw.fill_(-1)
            return out
        workspace = hist_workspace(q.shape[0], q.device)
        page_max = plan.select.threshold == "page_max"
        programs = plan.select.overlap_programs if page_max else 0
        logits = paged_mqa_logits(q, kv, weights, lens, page_table, max_seq_len, scaled_dot=scaled_dot,
                                  hist_workspace=workspace, hist_k=out.shape[1], page_max=page_max,
                                  hist_copies=plan.select.copies, overlap_programs=programs)
        finish = plan.select.finish
        return hist_select(logits, lens, page_table, out, raw, workspace, page_max=page_max, overlap=programs > 0,
                           reg_finish=finish != "histograms", reg_lean=finish == "registers_lean")
    logits = paged_mqa_logits(q, kv, weights, lens, page_table, max_seq_len, scaled_dot=scaled_dot)
    return topk_transform_paged(logits, lens, page_table, out, INDEX_PAGE_SIZE, raw, select=plan.select)


# --------------------------------------------------------------------------------------------
# AOT configs
# --------------------------------------------------------------------------------------------

_LOGITS_SIG = {
    "q_ptr": "*fp8e4nv", "kv_fp8_ptr": "*fp8e4nv", "kv_f32_ptr": "*fp32", "w_ptr": "*fp32", "lens_ptr": "*i32",
    "pt_ptr": "*i32", "out_ptr": "*fp32", "ws_ptr": "*i32", "max_seq_len": "i32", "pt_width": "i32",
    "n_cache_pages": "i32", "pages_per_split": "i32", "stride_qb": "i32", "stride_wb": "i32", "stride_ptb": "i32",
    "stride_ob": "i32",
    "stride_wsb": "i32",
}
_FUSED_SIG = {
    "q_ptr": "*fp8e4nv", "kv_fp8_ptr": "*fp8e4nv", "kv_f32_ptr": "*fp32", "w_ptr": "*fp32", "lens_ptr": "*i32",
    "pt_ptr": "*i32", "cand_val_ptr": "*fp32", "cand_pos_ptr": "*i32", "max_seq_len": "i32", "pt_width": "i32",
    "n_cache_pages": "i32", "stride_qb": "i32", "stride_wb": "i32", "stride_ptb": "i32", "stride_cb": "i32",
}
_SELECT_SIG = {
    "in_val_ptr": "*fp32", "in_pos_ptr": "*i32", "lens_ptr": "*i32", "pt_ptr": "*i32", "out_val_ptr": "*fp32",
    "out_pos_ptr": "*i32", "out_raw_ptr": "*i32", "n_in": "i32", "pt_width": "i32", "stride_inb": "i32",
    "stride_outb": "i32", "stride_ptb": "i32", "stride_rawb": "i32",
}
_RANK_SIG = {
    "scores_ptr": "*fp32", "lens_ptr": "*i32", "pt_ptr": "*i32", "out_ptr": "*i32", "raw_ptr": "*i32", "n_in": "i32",
    "pt_width": "i32", "stride_sb": "i32", "stride_ptb": "i32", "stride_outb": "i32", "stride_rawb": "i32",
}
_HIST_SIG = {
    "scores_ptr": "*fp32", "lens_ptr": "*i32", "pt_ptr": "*i32", "ws_ptr": "*i32", "cand_val_ptr": "*fp32",
    "cand_pos_ptr": "*i32", "out_ptr": "*i32", "raw_ptr": "*i32", "n_in": "i32", "pt_width": "i32",
    "stride_sb": "i32", "stride_ptb": "i32", "stride_wsb": "i32", "stride_cb": "i32", "stride_outb": "i32",
    "stride_rawb": "i32",
}
_SCORE_HIST_SIG = {
    "scores_ptr": "*fp32", "lens_ptr": "*i32", "ws_ptr": "*i32", "n_in": "i32", "pt_width": "i32",
    "stride_sb": "i32", "stride_wsb": "i32",
}
_PAGE_CONST_NAMES = ("D", "H", "PAGE", "PAGE_BYTES", "PAGE_WORDS", "SCALE_WORDS")


def _sig(base, constexprs):
    sig = dict(base)
    sig.update({name: "constexpr" for name in constexprs})
    return sig


def _pdl_settings():
    """(PDL flag, name suffix, opcodes it must compile to) for each launch form that ships."""
    forms = [(False, "", ())]
    if USE_PDL:
        forms.append((True, "_pdl", PDL_OPCODES))
    return forms


def aot_configs() -> list[AotConfig]:
    """Every shipped config, as sm_120 runs it: the block-scaled fp8 MMA (QMMA.SF) for the product;
    the plain fp8 dot (QMMA without .SF) must not appear; the two-kernel path's launches with and
    without PDL (griddepcontrol: PREEXIT + ACQBULK; see :func:`launch_pdl`), the first-digit reduce
    and the histogram select in each form :func:`hist_reduce_mode` / :func:`hist_one_block` /
    :func:`hist_select_warps` pick."""
    configs = []
    page = _page_consts()
    no_hist = dict(HIST_BITS=0, R=1, K=1, WS_H1=0, REDUCE=0, **_NO_PAGE_MAX)  # the defaults: no histogram code
    logits_forms = [("indexer_logits", no_hist)]
    for mode in sorted({int(REDUCE_ONE_SHOT), HIST_LONG_REDUCE}):
        logits_forms.append((f"indexer_logits_hist_{_REDUCE_NAMES[mode]}",
                             dict(HIST_BITS=HIST_DIGITS[0], R=HIST_COPIES, K=INDEX_TOPK, WS_H1=WS_H1, REDUCE=mode,
                                  **_NO_PAGE_MAX)))
    logits_forms.append(("indexer_logits_hist_one_shot_r1",  # HIST1 buckets: one copy, one-shot reduce
                         dict(HIST_BITS=HIST_DIGITS[0], R=1, K=INDEX_TOPK, WS_H1=WS_H1, REDUCE=int(REDUCE_ONE_SHOT),
                              **_NO_PAGE_MAX)))
    for batch, positions in PAGE_MAX_AOT_SHAPES:  # the page-max form: group maxima per program, the row's block
        c = dict(HIST_BITS=HIST_DIGITS[0], R=HIST_COPIES, K=INDEX_TOPK, WS_H1=WS_H1, REDUCE=0,
                 **page_max_consts(batch, positions))
        logits_forms.append((f"indexer_logits_page_max_g{c['GROUPS']}_k{c['NPM']}", c))
    for batch, positions in PAGE_MAX_OVERLAP_AOT_SHAPES:  # the overlap form: row-major grid, the ready flag
        c = dict(HIST_BITS=HIST_DIGITS[0], R=HIST_COPIES, K=INDEX_TOPK, WS_H1=WS_H1, REDUCE=0,
                 **page_max_consts(batch, positions, PAGE_MAX_OVERLAP_PROGRAMS))
        logits_forms.append((f"indexer_logits_page_max_overlap_g{c['GROUPS']}_k{c['NPM']}", c))
    for pdl, suffix, pdl_ops in _pdl_settings():
        for name, extra in logits_forms:
            c = dict(page, USE_SCALED_DOT=True, **extra, PDL=pdl)
            configs.append(AotConfig(
                name + suffix, _logits_kernel, _sig(_LOGITS_SIG, c), c, num_warps=LOGITS_NUM_WARPS,
                num_stages=LOGITS_NUM_STAGES, div16=("stride_qb", "stride_ob", "stride_wsb"),
                expect_opcodes=("QMMA.SF", *pdl_ops), forbid_opcodes=("QMMA.16832",)))
        digits = _hist_digit_consts()
        for chunk in HIST_CHUNKS:
            c = dict(CHUNK=chunk, PAGE=INDEX_PAGE_SIZE, K=INDEX_TOPK, B1=digits["B1"], R=HIST_COPIES, WS_H1=WS_H1,
                     REDUCE=hist_reduce_mode(chunk // INDEX_PAGE_SIZE), PDL=pdl)
            configs.append(AotConfig(
                f"indexer_score_hist_c{chunk}{suffix}", _score_hist_kernel, _sig(_SCORE_HIST_SIG, c), c,
                num_warps=_hist_num_warps(chunk), num_stages=1, div16=("stride_sb", "stride_wsb"),
                expect_opcodes=pdl_ops))
        for chunk in sorted({hist_chunk(n, HIST_SPLIT_MAX_CHUNK) for n in HIST_CHUNKS}):
            # (one-block finish, warps) as hist_one_block / hist_select_warps pick them by program count
            forms = {(hist_one_block(n), hist_select_warps(n, chunk))
                     for n in (1, HIST_SELECT_8_WARPS_MAX_PROGRAMS + 1, HIST_ONE_BLOCK_MAX_PROGRAMS + 1)}
            for one_block, warps in sorted(forms):
                for page_max, spin, reg, lean in ((False, False, False, False), (True, False, False, False),
                                                  (True, True, False, False), (True, False, True, False),
                                                  (True, True, True, False), (True, False, True, True),
                                                  (True, True, True, True)):
                    if page_max and not one_block:
                        continue  # the page-max form always finishes from one register block when it can
                    c = dict(_hist_select_consts(INDEX_TOPK, False, chunk, one_block, page_max, spin), PDL=pdl,
                             REG_FINISH=reg, REG_DIGIT_BITS=REG_FINISH_DIGIT_BITS, REG_LEAN=lean)
                    # SPIN (the overlap form) waits on its row's flag instead of griddepcontrol.wait (ACQBULK)
                    ops = tuple(op for op in pdl_ops if op != "ACQBULK") if spin else pdl_ops
                    configs.append(AotConfig(
                        f"indexer_hist_select{'_page_max' if page_max else ''}{'_spin' if spin else ''}"
                        f"{'_reg' if reg else ''}{'_lean' if lean else ''}_c{chunk}"
                        f"{'_one_block' if one_block else ''}_w{warps}{suffix}",
                        _hist_select_kernel, _sig(_HIST_SIG, c), c, num_warps=warps, num_stages=1,
                        div16=("stride_sb", "stride_wsb", "stride_cb"), expect_opcodes=ops,
                        forbid_opcodes=("ACQBULK",) if spin else (),
                        max_registers=REG_FINISH_MAX_REGISTERS[warps] if reg else 0))
        for chunk in SELECT_CHUNKS:
            # with PDL: only the double-warp search's programs (launch_pdl), up to 4096 entries
            muls = [2] if pdl else SELECT_WARPS_MULS
            if pdl and chunk > SELECT_MAX_CHUNK:
                continue
            warps = sorted({_select_warps(chunk, mul) for mul in muls})
            for implicit, final in ((True, True), (True, False), (False, False), (False, True)):
                c = dict(CHUNK=chunk, K=INDEX_TOPK, PAGE=INDEX_PAGE_SIZE, IMPLICIT_POS=implicit, FINAL=final,
                         HAS_RAW=False, PDL=pdl)
                name = f"indexer_select_c{chunk}_{'logits' if implicit else 'cand'}_{'final' if final else 'level'}"
                for w in warps:
                    configs.append(AotConfig(
                        name + ("" if w == _select_warps(chunk) else f"_w{w}") + suffix, _select_kernel,
                        _sig(_SELECT_SIG, c), c, num_warps=w, num_stages=1, div16=("stride_inb", "stride_outb"),
                        expect_opcodes=pdl_ops))
        rank_forms = sorted({plan.select for _, _, plan in PLAN_TABLE if plan.select.method == "rank"},
                            key=lambda f: (f.rank_rows, f.warps_mul))
        for form in rank_forms:  # with PDL at B <= PDL_MAX_BATCH (every rank bucket), without where unsupported
            for has_raw in (False, True):
                c = dict(K=INDEX_TOPK, PAGE=INDEX_PAGE_SIZE, ROWS=form.rank_rows, BLOCK_J=RANK_BLOCK_J,
                         HAS_RAW=has_raw, PDL=pdl)
                configs.append(AotConfig(
                    f"indexer_rank_select_r{form.rank_rows}_w{rank_warps(form)}{'_raw' if has_raw else ''}{suffix}",
                    _rank_select_kernel, _sig(_RANK_SIG, c), c, num_warps=rank_warps(form), num_stages=1,
                    div16=("stride_sb", "stride_outb"), expect_opcodes=pdl_ops))
    for r in FUSED_SPLIT_PAGES:
        c = dict(page, R_PAGES=r, K=INDEX_TOPK, CB=min(INDEX_TOPK, r * INDEX_PAGE_SIZE), USE_SCALED_DOT=True)
        configs.append(AotConfig(
            f"indexer_fused_r{r}", _fused_split_kernel, _sig(_FUSED_SIG, c), c, num_warps=fused_num_warps(r),
            num_stages=LOGITS_NUM_STAGES, div16=("stride_qb", "stride_cb"),
            expect_opcodes=("QMMA.SF",), forbid_opcodes=("QMMA.16832",)))
    return configs
