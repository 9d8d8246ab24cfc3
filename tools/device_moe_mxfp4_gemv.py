#!/usr/bin/env python3
"""Device run (round 3): fewer instructions per weight value in the CUDA-core GEMV MoE decode, H200.
``--pairs`` (round 4): the tensor-core pairs decode (``upcast="pairs"``) beside the defaults.

    python3 tools/device_moe_mxfp4_gemv.py --out $OUT        # device (no carry: no upstream code)
    python3 tools/device_moe_mxfp4_gemv.py --smoke --out DIR  # CPU interpreter, tiny shapes: the logic
    python3 tools/device_moe_mxfp4_gemv.py --pairs [--smoke] --out $OUT

Round 8 (commit c48aa5d, ``--ring``; benchmarks/moe_mxfp4-h200-run6-summary.md): the GEMV's K loop as a
``tl.range`` of 2-4 stages (cp.async ring) and the E8M0 scales as int32 words were slower at every T = 1 / 4,
B = 1..16 (0.30-0.98x); their candidates were removed with the kernel options.

Round 8b (``--tma``, not run yet): the GEMV with weights, scales and activations of each K step fetched by
TMA descriptors through a ring of 2-4 stages (``GemvConfig(tma_ring=)``; one thread issues each copy, so no
per-thread 4-byte copies of the activations as in the cp.async ring), beside the shipped default and the
GEMV default tiles at T = 1 / 4, B = 1, 2, 4, 8, 16.

Round 11 (``--persistent``): the TMA GEMV as a persistent grid (``GemvConfig(persistent_programs_per_sm=)``)
beside the TMA GEMV default at T = 1, B = 1..16 and T = 4, B = 1..8 (launch by launch at B = 1).

Round 15 (``--swap-ab``, issue 4): swap-AB on tensor cores fed by TMA (``PairsConfig(tma_ring=)``: the pairs
decode's MMA -- weights the M side, up to 16 routed rows the N side, the E8M0 factor on the pair words -- with the
weight words and scale bytes by TMA through the TMA GEMV's ring, on its small tiles, K steps of 512) beside the
shipped default and the pairs default tiles at T = 1 / 4, B = 1, 2, 4, 8, 16, 32, 64, launch by launch everywhere.
Run 15c (``--swap-ab3``): the mixed forward (swap-AB gate/up + TMA GEMV down) and more swap-AB tiles, B = 1..4, 8.

Round 16 (``--f16``, issue 4): the TMA GEMV's fp16 pair decode (``GemvConfig(f16=True)``: fp16 pair words built from
the e2m1 nibbles, packed fma.rn.f16x2 with the activations prepared once per call as scaled fp16 pairs) at the shipped
GEMV tiles (down persistent where the default is), the same tiles in bf16 and, at T=4, the fp16 decode with the plain
down launch, beside the shipped default at T = 1 / 4, B = 1, 2, 4, 8; launch by launch at B = 1.

Run 16b (``--f16b``): the fp16 TMA GEMV on 1x / 2x / 4x-row tiles (gate/up 8 / 16 / 32 columns, down 16 / 32 / 64
rows, the down launch persistent at T=4) beside the default at T = 1 / 2 / 4, B = 1-6, 8, 12, 16, 32, 64, and the bf16
decode on the 2x tiles at T = 1 / 4, B = 1 / 8 (T = 8 cannot run the TMA GEMV: K = 256 < 512).

Run 17 (``--pdl``, issue 4): programmatic dependent launch on the fp16 TMA GEMV forward's four launches
(``GemvConfig(pdl=True)``: triggers right after each program's wait; ``pdl_l2``: the down programs prefetch their
weight block into L2 before the wait; ``pdl_late``: triggers after the last store) beside the same forward without
PDL, T = 1 / 2 / 4 x B = 1, 2, 4, 8, 16, 32, 64 (B = 64: the pairs default beside the fp16 GEMV's 2x-row tiles with and
without PDL). Each forward is checked against the float32 reference, then timed as a chain of 12 forwards in one CUDA
graph (each launch the PDL dependent of the one before, forward after forward, weights rotating over 3 layer copies),
the variants interleaved over ``PDL_ROUNDS`` rounds; a captured chain of 12 forwards into separate outputs must give
every output bit for bit as the forward without PDL does (``chain_equal``). Run 17b (``--pdl --shipped``): the
default forward as shipped after run 17 (``moe_mxfp4_forward`` without tiles) beside the previous default (the same
tiles without PDL) at every B where ``GEMV_PDL_WHERE`` ships PDL, the B between run 17's measured ones included (run
17b itself timed T=1 B = 1..4, T=2 B = 1..8, T=4 B = 1..16; T=4 B = 15 was taken out after it).

Runs 30 / 30b (``--bytes --down-l2 MODES``, round 32): the gate/up programs asking L2 for their expert's down weights
(``GemvConfig.down_l2``), 0.85-0.97x; the option and the flag went with it (commit fafadec has both).

Round 32 (``--bytes --w0-early``, runs 31 / 31b): the shipped tiles beside the same tiles with ``early_tables`` and
the down launch's first K step (weight words, E8M0 bytes) loaded before its PDL wait or not (``GemvConfig.w0_early``:
by TMA with a 3- or 2-stage ring after it, or by per-thread loads); shipped at T=1 B=1 by TMA with 2 stages.

Run 29 (``--bytes --early-tables-flip``): the shipped tiles beside the same tiles with ``GemvConfig.early_tables`` the
other way (on at T=1 B=1 since round 29, off elsewhere).

Run 26 (``--bytes``, issue 4 / issue 8): the fp16 TMA GEMV forward as shipped beside the same tiles with its weight
pairs built per byte and placed by a byte permute (then ``GemvConfig(f16_bytes=True)``, 11 instead of 15 integer
instructions per weight word; the only fp16 decode since, so the mode now times the shipped forward alone), T = 1 / 2
/ 4 at every B of ``BYTES_BATCHES`` where that GEMV is the default; timed and checked as run 17 (chains of PDL
forwards, interleaved rounds; each PDL chain against its own form without PDL).

Run 18 (``--run18``, issue 4 at B >= 64): the pairs decode at T = 1 / 4, B = 256 / 64 / 128, every variant launch by
launch (where the time goes: gate/up and down alone, their bytes): the default (TMA swap-AB tiles up to B = 64, the
cp.async tiles above), the TMA swap-AB tiles above B = 64 (never measured there), and the TMA tiles with a K step of 512
as 2 or 4 MMAs (``PairsConfig(sub_k=)``: the 512-wide MMA's dequantised operand alone is 128 registers per thread, run
15b's kernels 180-186 registers, so few resident warps), at 2 / 3 stages, and on 64 gate/up rows (4 warps) or 32 down
rows (2 warps).

Run 18b (``--run18b``): run 18's gain was the down launch on 32 rows / 2 warps (with sub_k 128; its gate/up with sub_k
was slower than without): the TMA gate/up tile as shipped with that down tile at sub_k 512 / 256 / 128, beside the
default and run 18's best forward, T = 1 / 4, B = 256 / 64 / 128 / 48, launch by launch.

Round 7: ``--breakdown default,LABEL`` times the named variants launch by launch at every B (default: every
variant at B = 1); ``--only`` takes comma-separated label parts.

Round 4 (``--pairs``): T in (1, 4), B in (1, 8, 32, 64); per (T, B) the shipped default, then the pairs
decode (int32 weight words -> bf16 pairs with a few integer ops per two values, bf16 MMA with the weights
as the M side and up to 16 routed rows as N, E8M0 scale per 32-group on the MMA result, activations
pre-ordered by the routing launch; cp.async-pipelined weight loads) at several tiles. Same reference
check, graphs, rotation and launch-by-launch breakdown (B = 1) as round 3.

Full DeepSeek-V4-Flash expert shapes (256 experts, H = 4096, I = 2048/T) for T in (1, 4) and B in
(1, 8, 64), top-6 routing as SGLang's (distinct experts per token, weights with the 1.5 routed scale
folded in). Per (T, B): the shipped default at the time of the run, then the ``x_f32`` GEMV form
(``moe_mxfp4.GemvConfig(x_f32=True)``: activations converted once per row to float32 in the word-pair
order by the routing launch / the gate/up epilogue, nibble pairs placed by one multiply; sm_120a SASS
4.3 vs 5.7 instructions per weight value) at the round-2 tiles and a few neighbours. Every variant is
checked against the float32 reference (``reference_moe_mxfp4``) before it is timed in CUDA graphs
(weights rotating over 3 layer copies); bandwidth is over the bytes of the experts touched (weights +
E8M0 scales) beside the copy bandwidth measured eagerly in the same run. At B = 1 every GEMV variant is
also timed launch by launch (route, gate/up, down, top-k sum; each alone in its own CUDA graph, same
rotation). One variant failing does not lose the others: its error is a note. Results are written
after every (T, B).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    import os

    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# device_moe_mxfp4 makes sglang_sm120.kernels importable (ensure_kernels_importable) on import
from device_moe_mxfp4 import cycling, make_layer, make_routing, timer  # noqa: E402

import torch  # noqa: E402

from sglang_sm120.kernels import moe_mxfp4 as moe  # noqa: E402
from sglang_sm120.kernels.dsv4 import HIDDEN_SIZE, MOE_INTERMEDIATE_SIZE, NUM_EXPERTS, SWIGLU_LIMIT, TOP_K  # noqa: E402

G = moe.GemvConfig
# (gate/up, down) GEMV tiles; the round-2 defaults are G(8, 512, 4) / G(16, 512, 4), at T=4 B=1 G(4, 512, 4) /
# G(8, 512, 4); every candidate below is the x_f32 form
GEMV_CANDIDATES = [
    (G(8, 512, 4, x_f32=True), G(16, 512, 4, x_f32=True)),
    (G(4, 512, 4, x_f32=True), G(8, 512, 4, x_f32=True)),
    (G(4, 512, 4, x_f32=True), G(16, 512, 4, x_f32=True)),
    (G(8, 512, 8, x_f32=True), G(16, 512, 8, x_f32=True)),
    (G(16, 512, 4, x_f32=True), G(32, 512, 4, x_f32=True)),
]
SMOKE_CANDIDATES = [(G(8, 128, 4, x_f32=True), G(16, 128, 4, x_f32=True)),
                    (G(4, 64, 4, x_f32=True), G(8, 32, 4, x_f32=True))]
DEADLINE_S = 105  # later cases are skipped (the device limit of this run is 150 s)
P = moe.PairsConfig
PAIRS_CANDIDATES = [
    (P(32, 128, 4), P(64, 128, 4)),
    (P(32, 128, 4, mul_pairs=True), P(64, 128, 4, mul_pairs=True)),
    (P(32, 256, 4, mul_pairs=True), P(64, 256, 4, mul_pairs=True)),
    (P(16, 128, 4, mul_pairs=True), P(32, 128, 4, mul_pairs=True)),
    (P(64, 128, 8, mul_pairs=True), P(128, 128, 8, mul_pairs=True)),
    (P(64, 128, 4, mul_pairs=True), P(128, 128, 4, mul_pairs=True)),
    (P(32, 128, 4, 4, mul_pairs=True), P(64, 128, 4, 4, mul_pairs=True)),
    (P(32, 128, 4, 2, mul_pairs=True), P(64, 128, 4, 2, mul_pairs=True)),
]
# after run 2 (not yet run): the E8M0 scale on the pair words in packed bf16, one MMA per K step
PAIRS_CANDIDATES += [
    (P(32, 128, 4, mul_pairs=True, scale_bf16=True), P(64, 128, 4, mul_pairs=True, scale_bf16=True)),
    (P(32, 256, 4, mul_pairs=True, scale_bf16=True), P(64, 256, 4, mul_pairs=True, scale_bf16=True)),
    (P(64, 128, 4, mul_pairs=True, scale_bf16=True), P(128, 128, 4, mul_pairs=True, scale_bf16=True)),
]
# round 7 (benchmarks/moe_mxfp4-h200-run5c.md: both slower than the default at T = 1 / 4, B = 16 / 64): the
# default pairs form at 8 warps on twice the rows, and at 2 stages
PAIRS_CANDIDATES += [
    (P(64, 128, 8, mul_pairs=True, scale_bf16=True), P(128, 128, 8, mul_pairs=True, scale_bf16=True)),
    (P(32, 128, 4, 2, mul_pairs=True, scale_bf16=True), P(64, 128, 4, 2, mul_pairs=True, scale_bf16=True)),
]
PAIRS_SMOKE_CANDIDATES = [(P(16, 64, 4), P(32, 32, 4)), (P(16, 64, 4, mul_pairs=True), P(32, 32, 4, mul_pairs=True)),
                          (P(16, 64, 4, scale_bf16=True), P(32, 32, 4, scale_bf16=True))]
PAIRS_DEADLINE_S = 140  # the device limit of the round-4 run is 200 s
# round 8b (--tma): the TMA GEMV at 2-4 stages and three tiles (T=4: the down launch's K of 512 is one step)
TMA_CANDIDATES = [
    (G(8, 512, 4, tma_ring=2), G(16, 512, 4, tma_ring=2)),
    (G(8, 512, 4, tma_ring=3), G(16, 512, 4, tma_ring=3)),
    (G(8, 512, 4, tma_ring=4), G(16, 512, 4, tma_ring=4)),
    (G(16, 512, 4, tma_ring=3), G(32, 512, 4, tma_ring=3)),
    (G(4, 512, 4, tma_ring=3), G(8, 512, 4, tma_ring=3)),
]
TMA_DEADLINE_S = 120  # for a 180 s device limit (one case with compiles takes up to ~30 s)
# round 9 (--words; H200 runs 10/10b/10c, benchmarks/moe_mxfp4-h200-run10-summary.md: the default tiles won 1.016-1.046x
# everywhere but T=4 B=9 and are the default; 4 stages equal, 2 stages and the half / double tiles slower; every GEMV
# candidate below slower at B = 1 / 8): the pairs decode with the E8M0 factor multiplied onto the int32 pair words by PTX
# mul.rn.bf16x2 (PairsConfig(scale_on_words=True): no half-swap PRMTs around the packed multiply; sm_120a K loop
# 312 vs 338 SASS instructions, sm_90a 317 vs 358) at the default tiles, 2 / 4 stages and half / double tiles,
# beside the shipped default (and the pairs default tiles where the TMA GEMV is the default: T=1 B=16)
WORDS_CANDIDATES = [
    (P(32, 128, 4, mul_pairs=True, scale_bf16=True), P(64, 128, 4, mul_pairs=True, scale_bf16=True)),
    (P(32, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True),
     P(64, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True)),
    (P(32, 128, 4, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True),
     P(64, 128, 4, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True)),
    (P(32, 128, 4, 2, mul_pairs=True, scale_bf16=True, scale_on_words=True),
     P(64, 128, 4, 2, mul_pairs=True, scale_bf16=True, scale_on_words=True)),
    (P(16, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True),
     P(32, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True)),
    (P(64, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True),
     P(128, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True)),
]
# and (brief item 3, B = 1 / 8) the TMA GEMV with K steps of 1024 (twice the bytes in flight per program) at 2 / 3
# stages and 4 / 8 warps, and 8 warps on twice the rows at K steps of 512, beside the TMA GEMV default
WORDS_GEMV_CANDIDATES = [
    (G(8, 1024, 4, tma_ring=3), G(16, 1024, 4, tma_ring=3)),
    (G(8, 1024, 4, tma_ring=2), G(16, 1024, 4, tma_ring=2)),
    (G(8, 1024, 8, tma_ring=3), G(16, 1024, 8, tma_ring=3)),
    (G(16, 512, 8, tma_ring=3), G(32, 512, 8, tma_ring=3)),
]
WORDS_GEMV_MAX_BATCH = 8
WORDS_SMOKE_CANDIDATES = [(P(16, 64, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True),
                           P(32, 32, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True))]
WORDS_DEADLINE_S = 165  # for a 220 s device limit
# round 11 (--persistent, issue 4): the TMA GEMV as a persistent grid (min(work items, SMs x P) programs, each looping
# over (routed row, column block) work items with the ring kept full across them; GemvConfig(persistent_programs_per_sm=P))
# at P = 2 / 4 / 6 / 8 (3 stages, item and K loops flattened into one tl.range), 4 stages at P = 4, and the nested
# loops (K loop alone the ring) at P = 4, beside the TMA GEMV default (one program per (expert, column block))


# (run 11 also timed the nested loops -- the K loop alone the ring -- at P = 4: 0.87-0.99x; that form was removed)


def _persistent(per_sm, ring=3):
    return tuple(G(n, 512, 4, tma_ring=ring, persistent_programs_per_sm=per_sm) for n in (8, 16))


PERSISTENT_CANDIDATES = [_persistent(2), _persistent(4), _persistent(6), _persistent(8), _persistent(4, ring=4)]
PERSISTENT_MAX_BATCH = {1: 16, 4: 8}  # per T: where the TMA GEMV is the default
PERSISTENT_DEADLINE_S = 170  # for a 240 s device limit
# run 11b (--persistent2): after run 11 (persistent in both launches slower at T=1 everywhere, 0.74-0.94x; at T=4 B=1
# the down launch 7.0 vs 7.4 us but gate/up 10.6 vs 10.3; T=4 B=4 1.07-1.10x at P = 4-8, B=8 1.03x at P = 8) the
# down launch alone persistent (gate/up the TMA default), and both at P = 6 / 8 / 12, launch by launch at every
# point, T=4 at every B up to 8, T=1 / 2 at a few


def _down_persistent(per_sm):
    return G(8, 512, 4, tma_ring=3), _persistent(per_sm)[1]


PERSISTENT2_CANDIDATES = [_persistent(6), _persistent(8), _persistent(12), _down_persistent(6), _down_persistent(8),
                          _down_persistent(12)]
PERSISTENT2_BATCHES = {1: (1, 2, 4, 8, 16), 2: (1, 4, 16), 4: (1, 2, 3, 4, 5, 6, 7, 8)}


# round 15 (--swap-ab): gate/up 8 / 16 columns (16 / 32 weight rows: mma.sync on sm_90 and sm_120; 64 rows would be
# wgmma on the H200 with 151 KB of shared memory), down 16 / 32 rows, 3 / 2 stages, the factor on the pair words
# (wd) or on the bf16 values (h), 4 / 8 warps


def _swap_ab(gu_n, dn_n, ring=3, warps=4, on_words=True, dn_warps=None):
    return tuple(P(n, 512, w, mul_pairs=True, scale_bf16=True, scale_on_words=on_words, tma_ring=ring)
                 for n, w in ((gu_n, warps), (dn_n, warps if dn_warps is None else dn_warps)))


SWAP_AB_CANDIDATES = [_swap_ab(8, 16), _swap_ab(8, 16, ring=2), _swap_ab(16, 32), _swap_ab(8, 16, warps=8),
                      _swap_ab(8, 16, on_words=False),
                      (P(32, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True),
                       P(64, 128, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True))]  # the pairs default tiles
# run 15b (--swap-ab2): run 15 was 0.20-0.86x, its time linear in warps per 16 weight rows (gate/up T=1 B=1: 16 rows
# over 4 warps 74.6 us, 32 rows over 4 warps 40.6, 16 rows over 8 warps 140.7): Triton's mma.sync layout puts a
# 16-row M tile on each warp, so with more warps than 16-row tiles every warp dequantises the same weights again.
# One warp per 16 rows: gate/up 16 rows / 1 warp, 32 rows / 2 warps, down 16 / 1 and 32 / 2, 3 and 2 stages
SWAP_AB2_CANDIDATES = [_swap_ab(8, 16, warps=1), _swap_ab(8, 16, warps=1, ring=2),
                       _swap_ab(16, 16, warps=2, dn_warps=1),
                       _swap_ab(16, 32, warps=2), _swap_ab(16, 16, warps=2, ring=2, dn_warps=1),
                       _swap_ab(8, 16, warps=1, ring=4), _swap_ab(16, 32)]
SWAP_AB_DEADLINE_S = 175  # for a 240 s device limit
# run 15c (--swap-ab3): run 15b's swap-AB gate/up beat the TMA GEMV's at T=1 B = 1 / 2 (26.61 / 48.71 vs 28.07 /
# 51.45 us) but its down lost (19.46 / 33.75 vs 16.89 / 28.84): the mixed forward -- swap-AB gate/up writing
# natural-order bf16 SwiGLU rows (NATURAL_ACT), then the TMA GEMV down (3 stages; at T=4 B <= 8 the default down is
# persistent, P = 8) -- and the swap-AB tiles not yet tried: gate/up 64 rows on 4 warps, down 32 rows on 2 warps with
# K steps of 1024, down 64 rows on 4 warps; T = 1 / 4, B = 1, 2, 3, 4, 8
_SWAP_AB_GU = {n: P(n, 512, w, mul_pairs=True, scale_bf16=True, scale_on_words=True, tma_ring=2)
               for n, w in ((8, 1), (16, 2), (32, 4))}


def _swap_ab_down(n, k, w):
    return P(n, k, w, mul_pairs=True, scale_bf16=True, scale_on_words=True, tma_ring=2)


SWAP_AB3_CANDIDATES = [(_SWAP_AB_GU[16], G(16, 512, 4, tma_ring=3)),
                       (_SWAP_AB_GU[16], G(16, 512, 4, tma_ring=3, persistent_programs_per_sm=8)),
                       (_SWAP_AB_GU[8], G(16, 512, 4, tma_ring=3)),
                       moe.PAIRS_TMA_TILES,
                       (_SWAP_AB_GU[32], _swap_ab_down(16, 512, 1)),
                       (_SWAP_AB_GU[16], _swap_ab_down(32, 1024, 2)),
                       (_SWAP_AB_GU[16], _swap_ab_down(64, 512, 4))]


# run 18 (--run18): the TMA swap-AB tiles (PAIRS_TMA_TILES: gate/up 32 rows on 2 warps, down 16 rows on 1 warp, 2
# stages), as they are and with a K step as 2 / 4 MMAs (sub_k 256 / 128), 3 stages, 64 gate/up rows on 4 warps, 32 down
# rows on 2 warps, 16 gate/up rows on 1 warp; B = 256 first (the cp.async tiles are its default), then B = 64 and 128
RUN18_BATCHES = (256, 64, 128)
RUN18_DEADLINE_S = 185  # for a 240 s device limit


def run18_candidates():
    import dataclasses

    gu, dn = moe.PAIRS_TMA_TILES

    def sub(cfg, sub_k, **kw):
        return dataclasses.replace(cfg, sub_k=sub_k, **kw)

    return [moe.PAIRS_TMA_TILES, (sub(gu, 256), sub(dn, 256)), (sub(gu, 128), sub(dn, 128)),
            (sub(gu, 128, tma_ring=3), sub(dn, 128, tma_ring=3)),
            (sub(gu, 128, block_n=32, num_warps=4), sub(dn, 128)),
            (sub(gu, 128), sub(dn, 128, block_n=32, num_warps=2)),
            (sub(gu, 128, block_n=8, num_warps=1), sub(dn, 128))]


RUN18B_BATCHES = (256, 64, 128, 48)
RUN18B_DEADLINE_S = 140  # for a 180 s device limit


def run18b_candidates():
    import dataclasses

    gu, dn = moe.PAIRS_TMA_TILES
    wide_down = dataclasses.replace(dn, block_n=32, num_warps=2)
    return [moe.PAIRS_TMA_TILES, (gu, wide_down), (gu, dataclasses.replace(wide_down, sub_k=256)),
            (gu, dataclasses.replace(wide_down, sub_k=128)),
            (dataclasses.replace(gu, sub_k=128), dataclasses.replace(wide_down, sub_k=128))]


# run 20 (--run20, issue 4 at B = 64 / 256): where the TMA pairs decode's K loop spends its issue slots (sm_90a, per warp
# and 512-wide K step: gate/up 1044 instructions for 2 HMMA per weight word, 32 LDS.128 + ~100 IMAD.MOV of activations
# for 64 HMMAs; 168 registers, 6 programs per SM) -- 8 routed rows per MMA pass instead of 16 (block_m 8: one m16n8k16
# per 16 values of K, half the activation loads, gate/up 905 instructions and 128 registers; an expert with more than 8
# rows takes another pass over its weights), 32 weight rows per warp (the activations of an MMA reused by two M tiles,
# sub_k 128 / 256 to hold the registers), 64 gate/up rows on 2 warps; every launch also timed alone
RUN20_BATCHES = (64, 256, 128, 48, 32)
RUN20_DEADLINE_S = 170  # for a 220 s device limit


def run20_candidates():
    import dataclasses

    gu, dn = moe.PAIRS_TMA_WIDE_DOWN_TILES  # the default at B = 48..256 (gate/up 32 rows / 2 warps, down 32 / 2, c128)

    def tile(cfg, **kw):
        return dataclasses.replace(cfg, **kw)

    return [(tile(gu, block_m=8), tile(dn, block_m=8)),
            (tile(gu, block_m=8, num_warps=1, sub_k=128), tile(dn, block_m=8, num_warps=1)),
            (tile(gu, block_m=8, block_n=32, sub_k=128), tile(dn, block_m=8, block_n=64)),
            (tile(gu, num_warps=1, sub_k=128), tile(dn, num_warps=1)),
            (tile(gu, block_m=8, num_warps=1, sub_k=256), tile(dn, block_m=8, sub_k=0))]


# run 20b (--run20b): run 20 (benchmarks/moe_mxfp4-h200-run20-summary.md) had 8 routed rows per pass 1.20-1.34x faster
# than the defaults at T = 1 / 4, B = 32..128 (64 gate/up rows on 2 warps with a 64-row down tile the fastest), but the
# m8 gate/up slower at B = 256 (two passes over most experts' weights) where the m8 down still won; the forward of each
# launch choice, B = 8..256 (the fp16 GEMV's range included), every launch also timed alone
RUN20B_BATCHES = (256, 64, 128, 32, 16, 24, 40, 8)
RUN20B_DEADLINE_S = 125  # for a 170 s device limit


def run20b_candidates():
    import dataclasses

    gu, dn = moe.PAIRS_TMA_WIDE_DOWN_TILES
    gu64_m8 = dataclasses.replace(gu, block_m=8, block_n=32, sub_k=128)  # 64 gate/up rows on 2 warps
    dn64_m8 = dataclasses.replace(dn, block_m=8, block_n=64)
    return [(gu64_m8, dn64_m8), (gu, dn64_m8), (dataclasses.replace(gu, block_m=8), dn64_m8),
            (dataclasses.replace(gu, block_n=32, sub_k=128), dn64_m8),
            (gu64_m8, dataclasses.replace(dn, block_m=8, num_warps=1)), (gu, dataclasses.replace(dn, block_n=64)),
            (dataclasses.replace(gu64_m8, sub_k=256), dn64_m8), (dataclasses.replace(gu, block_m=8, sub_k=256), dn64_m8)]


# run 21 (--run21, prepared in round 20, run in round 21: benchmarks/moe_mxfp4-h200-run21-summary.md): the
# PAIRS_TMA_ROWS_WHERE tiles where run 20b did not measure them --
# B = 9..15 (the fp16 GEMV's), 129..255 (they take the B = 128 tiles), 257..341 (up to 2048 routed rows: split_bf16 /
# regs then) -- each tile pair of the table at every point (three at the time of the run, four since), launch by launch
RUN21_BATCHES = (12, 15, 192, 224, 300, 341)
RUN21_DEADLINE_S = 125  # for a 170 s device limit


def run21_candidates():
    return list(dict.fromkeys(t for *_, t in moe.PAIRS_TMA_ROWS_WHERE))


F16_DEADLINE_S = 230  # for a 300 s device limit
F16_EXTRA_ROWS = (TOP_K, 8 * TOP_K)  # B = 1 and 8: two more fp16 tilings


def f16_candidates(rows, inter):
    """Round 16: the shipped GEMV tiles at (rows, inter) in bf16 and in the fp16 pair decode, and (where the shipped
    down launch is persistent) the fp16 decode with the one-program-per-block down launch."""
    import dataclasses

    tiles = moe.gemv_configs(rows, inter, f16=False)  # the bf16 tiles shipped at the time of run 16
    f16 = tuple(dataclasses.replace(c, f16=True) for c in tiles)
    out = [tiles, f16]
    if tiles[1].persistent_programs_per_sm:
        out.append((f16[0], dataclasses.replace(f16[1], persistent_programs_per_sm=0)))
    if rows in F16_EXTRA_ROWS:  # the fp16 decode at 2 stages, and on twice the rows per program
        out.append(tuple(dataclasses.replace(c, tma_ring=2) for c in f16))
        out.append(tuple(dataclasses.replace(c, block_n=2 * c.block_n) for c in f16))
    return out


F16B_DEADLINE_S = 250  # for a 330 s device limit
F16B_BATCHES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64)
F16B_TPS = (1, 2, 4)  # T = 8 (I = 256) cannot run the TMA GEMV: its down launch needs K >= 512
F16B_BF16_CASES = ((1, 1), (1, 8), (4, 1), (4, 8))  # (T, B): the bf16 decode on the 2x-row tiles as well


def f16b_candidates(tp, batch, inter):
    """Run 16b: the fp16 TMA GEMV on the shipped tiles (gate/up 8 columns, down 16 rows), 2x rows (16 / 32) and 4x
    rows (32 / 64), the down launch persistent (P = 8) at I = 512 as GEMV_TMA_F16_WHERE ships it there; at
    F16B_BF16_CASES the bf16 decode on the 2x-row tiles too (how much of the gain is the tile, how much fp16)."""
    per_sm = 8 if inter == MOE_INTERMEDIATE_SIZE // 4 else 0

    def tiles(gu_n, f16):
        return (G(gu_n, 512, 4, tma_ring=moe.GEMV_TMA_RING, f16=f16),
                G(2 * gu_n, 512, 4, tma_ring=moe.GEMV_TMA_RING, f16=f16, persistent_programs_per_sm=per_sm))

    out = [tiles(8, True), tiles(16, True), tiles(32, True)]
    if (tp, batch) in F16B_BF16_CASES:
        out.append(tiles(16, False))
    return out


PDL_TPS = (1, 2, 4)
PDL_BATCHES = (1, 2, 4, 8, 16, 32, 64)
PDL_ROUNDS = 2
# run 26 (--bytes): every B of the decode range where the fp16 TMA GEMV is the default, at T = 1 / 2 / 4
BYTES_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def chain_matches(forward_into, layers, plain, x, chain_len, device) -> bool:
    """Whether ``chain_len`` forwards over the rotating ``layers`` (``forward_into(layer, out)``), captured as one CUDA
    graph where the GPU allows (compiled and warmed up outside the capture, outputs NaN-poisoned before the replay),
    leave each output bit for bit equal to ``plain[i % copies]``, the same tiles launched one at a time."""
    copies = len(layers)
    outs = [torch.empty_like(x) for _ in range(chain_len)]
    calls = [lambda i=i: forward_into(layers[i % copies], outs[i]) for i in range(chain_len)]
    if device == "cuda":
        for call in calls:
            call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        del graph
    else:
        for call in calls:
            call()
    return all(torch.equal(out, plain[i % copies]) for i, out in enumerate(outs))
PDL_CHAIN = 12  # forwards per timed graph (time_in_cuda_graph in timer()) and in the chain check
PDL_DEADLINE_S = 215  # for a 280 s device limit


def pdl_shipped_variants(rows, inter):
    """Run 17b: the previous default (the shipped fp16 tiles without PDL), then the forward as shipped (no tiles given)."""
    import dataclasses

    tiles = moe.gemv_configs(rows, inter)
    plain = tuple(dataclasses.replace(c, pdl=False, pdl_late=False, pdl_l2=False) for c in tiles)
    return [(f"{label(plain)} (previous default)", {"upcast": moe.GEMV, "configs": plain}),
            (f"{label(tiles)} (shipped default)", {})], plain


def pdl_variants(rows, inter):
    """Run 17: (label, forward keywords) -- the default, then on the fp16 TMA GEMV tiles (the default's where it is the
    fp16 GEMV, else the 2x-row tiles, the down launch persistent at I = 512, shown without PDL first) PDL with early
    triggers, with the down launch's L2 prefetch, and with late triggers and the prefetch."""
    import dataclasses

    up = moe.default_upcast(rows, inter)
    out = [("default", {"upcast": up} if up in (moe.GEMV, moe.PAIRS) else {})]
    if moe.gemv_f16_default(rows, inter):
        tiles = moe.gemv_configs(rows, inter)
    else:
        per_sm = 8 if inter == MOE_INTERMEDIATE_SIZE // 4 else 0
        tiles = (G(16, 512, 4, tma_ring=moe.GEMV_TMA_RING, f16=True),
                 G(32, 512, 4, tma_ring=moe.GEMV_TMA_RING, f16=True, persistent_programs_per_sm=per_sm))
        out.append((label(tiles), {"upcast": moe.GEMV, "configs": tiles}))
    shipped = {moe.GEMV: moe.gemv_configs, moe.PAIRS: moe.pairs_configs}.get(up)
    out[0] = (f"{label(shipped(rows, inter)) if shipped else up} (default)", out[0][1])
    for late, l2 in ((False, False), (False, True), (True, True)):
        cfgs = (dataclasses.replace(tiles[0], pdl=True, pdl_late=late),
                dataclasses.replace(tiles[1], pdl=True, pdl_late=late, pdl_l2=l2))
        out.append((label(cfgs), {"upcast": moe.GEMV, "configs": cfgs}))
    return out, tiles


def tiles_spec(spec: str) -> tuple[int, int, int, bool]:
    """``GU/DN[rR][l2]`` (run 28): gate/up columns and down rows per program, the ring depth of both launches (0: as
    shipped), the down launch's L2 prefetch before its PDL wait."""
    match = re.fullmatch(r"(\d+)/(\d+)(?:r(\d+))?(l2)?", spec)
    if not match:
        raise ValueError(f"--tiles entries are GU/DN[rR][l2], got {spec!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0), bool(match.group(4))


def bytes_variants(rows, inter, down_per_sm=(), tiles_n=(), flip_early_tables=False, w0_early=False):
    """Run 26 (--bytes): the shipped fp16 TMA GEMV tiles (run 26 timed them beside the round-16 pair form, commit
    0dfc461's ``GemvConfig(f16_bytes=False)``, since removed: the byte-built pairs are the only fp16 decode now; run 22
    timed 4-stage rings at B = 1..8, 0.97-0.98x at T=1 B=1). Run 26c (``--down-per-sm``): the down launch as a
    persistent grid of P programs per SM (its work items' K loops flattened into one ring, so a program's next item
    streams while it finishes one) on the shipped down tile and on half its rows, where it is not persistent already
    (round 11 timed that grid with the bf16 decode of the time: a win at T=4 B <= 8 only)."""
    import dataclasses

    tiles = moe.gemv_configs(rows, inter)
    out = [(f"{label(tiles)} (shipped default)", {"upcast": moe.GEMV, "configs": tiles})]
    if flip_early_tables:  # run 29 (--early-tables-flip): the same tiles with GemvConfig.early_tables the other way
        flipped = tuple(dataclasses.replace(c, early_tables=not c.early_tables) for c in tiles)
        out.append((label(flipped), {"upcast": moe.GEMV, "configs": flipped}))
    if w0_early and not tiles[1].persistent_programs_per_sm:  # round 32 (--w0-early): the down's first K step early
        for form, ring, regs in (("", moe.GEMV_TMA_RING, 0), ("", moe.GEMV_TMA_RING, 80), ("", 2, 0), ("tma", 3, 0),
                                 ("tma", 2, 0), ("plain", moe.GEMV_TMA_RING, 0)):
            cfgs = (dataclasses.replace(tiles[0], early_tables=True),
                    dataclasses.replace(tiles[1], early_tables=True, w0_early=form, tma_ring=ring,
                                        max_registers=regs))
            if cfgs != tiles:
                out.append((label(cfgs), {"upcast": moe.GEMV, "configs": cfgs}))
    gate_up, down = tiles
    for gu_n, dn_n, ring, l2 in tiles_n:  # run 28: other columns / rows per program per launch, the rest as shipped
        ring = ring or gate_up.tma_ring
        cfgs = (dataclasses.replace(gate_up, block_n=gu_n, tma_ring=ring),
                dataclasses.replace(down, block_n=dn_n, tma_ring=ring, pdl_l2=down.pdl and (l2 or down.pdl_l2)))
        if cfgs != tiles:
            out.append((label(cfgs), {"upcast": moe.GEMV, "configs": cfgs}))
    if not down.persistent_programs_per_sm:
        for per_sm in down_per_sm:
            for block_n in dict.fromkeys((down.block_n, down.block_n // 2)):
                cfgs = (gate_up, dataclasses.replace(down, block_n=block_n, persistent_programs_per_sm=per_sm))
                out.append((label(cfgs), {"upcast": moe.GEMV, "configs": cfgs}))
    return out, tiles


def pdl_comparison(args) -> None:
    """Run 17 (--pdl), run 17b (--pdl --shipped), run 26 (--bytes): see the module docstring."""
    import dataclasses

    from sglang_sm120.kernels.harness.devicebench import BenchResult, copy_bandwidth_gbs, relative_error

    if args.smoke:  # TMA needs K >= 512; I = 512 at T = 1 runs the persistent down launch of the I = 512 tiles too
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()
        device, num_experts, hidden, tps, batches, copies, base_inter = "cpu", 8, 512, (1,), (1, 3), 2, 512
        moe.CPU_SM_COUNT = 5
    else:
        device, num_experts, hidden, tps, batches, copies, base_inter = (
            "cuda", NUM_EXPERTS, HIDDEN_SIZE, PDL_TPS, PDL_BATCHES, 3, MOE_INTERMEDIATE_SIZE)
    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
    if args.tps:
        tps = tuple(int(t) for t in args.tps.split(","))
    if args.shipped and not args.batches:  # every B where PDL ships (smoke: I = 512 at T = 1)
        batches = None
    if args.bytes and not args.batches and not args.smoke:
        batches = BYTES_BATCHES
    down_per_sm = tuple(int(p) for p in args.down_per_sm.split(",")) if args.down_per_sm else ()
    tiles_n = tuple(tiles_spec(spec) for spec in args.tiles.split(",") if spec)
    chain_len = 2 if args.smoke else PDL_CHAIN  # a forward takes seconds under the interpreter
    run = timer(args.smoke)
    t_start = time.time()
    copy_gbs = 0.0 if args.smoke else copy_bandwidth_gbs()
    name = args.name or ("moe_mxfp4-h200-run26" if args.bytes else
                         "moe_mxfp4-h200-run17b" if args.shipped else "moe_mxfp4-h200-run17")
    run_label = re.search(r"run\w+$", name)  # the title names this file's run, not the run that added the mode
    result = BenchResult(
        name=name,
        title=(f"sm120 MoE decode, {run_label.group(0).replace('run', 'run ') if run_label else name}: "
               "the shipped fp16 TMA GEMV forward (pairs built by bytes)"
               + (", persistent down launches" if args.down_per_sm else "")
               + (", other tiles per launch (run 28)" if args.tiles else "")
               + (", the down launch's first K step before its PDL wait or not (round 32)" if args.w0_early else "")
               + ", H200" if args.bytes else
               "sm120 MoE decode, run 17b: the shipped PDL defaults of the fp16 TMA GEMV forward vs the previous ones, H200"
               if args.shipped else
               "sm120 MoE decode, run 17: programmatic dependent launch on the fp16 TMA GEMV forward, H200"),
        columns=["T", "B", "variant", "us", "us_rounds", "touched_MB", "GB/s", "%copy", "rel_err", "chain_equal",
                 "vs_default"])
    result.extra.update({"copy bandwidth (GB/s, read+write, eager)": round(copy_gbs, 1),
                         "launches per forward": moe.LAUNCHES_PER_FORWARD,
                         "PDL active on this device": moe.pdl_supported(torch.device(device))})
    for tp in tps:
        inter = base_inter // tp
        layers = [make_layer(num_experts, hidden, inter, device, seed=100 * tp + c) for c in range(copies)]
        ckpt = [t.clone() for t in layers[0]]
        for layer in layers:
            moe.repack_w13_(layer[0], layer[1])
        inter_batches = batches or tuple(moe.GEMV_PDL_WHERE.get(inter, ((), False))[0])
        for batch in inter_batches:
            if time.time() - t_start > PDL_DEADLINE_S:
                result.notes.append(f"T={tp} B={batch}: skipped, past {PDL_DEADLINE_S} s into the run")
                continue
            x, weights, ids = make_routing(batch, num_experts, hidden, device, seed=batch + tp)
            touched = moe.touched_expert_bytes(ids, hidden, inter, num_experts)
            ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
            rows = batch * TOP_K
            if args.bytes and not moe.gemv_f16_default(rows, inter):
                continue
            variants, tiles = (bytes_variants(rows, inter, down_per_sm, tiles_n, args.early_tables_flip, args.w0_early)
                               if args.bytes else
                               pdl_shipped_variants(rows, inter) if args.shipped else pdl_variants(rows, inter))

            def forward(layer, kw, out=None):
                return moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT, out=out, **kw)

            def without_pdl(cfgs):
                return tuple(dataclasses.replace(c, pdl=False, pdl_late=False, pdl_l2=False) for c in cfgs)

            def plain_outputs(cfgs):
                # each layer's output of these tiles without PDL, launch after launch (the bits PDL must keep)
                no_pdl = without_pdl(cfgs)
                outs = []
                for layer in layers:
                    outs.append(forward(layer, {"upcast": moe.GEMV, "configs": no_pdl}).clone())
                    if device == "cuda":
                        torch.cuda.synchronize()
                return outs

            plain = plain_outputs(tiles)
            errs, chain, times, ok = {}, {}, {}, []
            for name, kw in variants:
                try:
                    errs[name] = relative_error(forward(layers[0], kw), ref)
                    cfgs = kw.get("configs") or moe.gemv_configs(rows, inter)
                    if cfgs[0].pdl:
                        # other tiles or pair forms sum in another order: each chain against its own plain forward
                        chain[name] = chain_matches(lambda layer, out, kw=kw: forward(layer, kw, out), layers,
                                                    plain if without_pdl(cfgs) == without_pdl(tiles)
                                                    else plain_outputs(cfgs), x, chain_len, device)
                    ok.append((name, kw))
                except Exception as exc:  # one broken variant must not lose the run
                    result.notes.append(f"T={tp} B={batch} {name}: {type(exc).__name__}: {str(exc)[:300]}")
                    print("FAILED", tp, batch, name, exc, flush=True)
            for _ in range(PDL_ROUNDS):  # interleaved: every variant once per round
                for name, kw in ok:
                    times.setdefault(name, []).append(run(cycling(lambda layer, kw=kw: forward(layer, kw), layers)))
            default_us = sum(times[variants[0][0]]) / PDL_ROUNDS if variants[0][0] in times else float("nan")
            for name, _ in ok:
                us = sum(times[name]) / PDL_ROUNDS
                gbs = touched / (us * 1e-6) / 1e9
                result.add(T=tp, B=batch, variant=name, us=us, us_rounds=" / ".join(f"{t:.2f}" for t in times[name]),
                           touched_MB=touched / 1e6, rel_err=errs[name], chain_equal=chain.get(name, ""),
                           **{"GB/s": gbs, "%copy": 100 * gbs / copy_gbs if copy_gbs else 0.0,
                              "vs_default": default_us / us})
                print(f"T={tp} B={batch} {name}: {us:.2f} us ({times[name]}), err {errs[name]:.2e}, "
                      f"chain {chain.get(name, '-')}", flush=True)
            result.extra["wall seconds"] = round(time.time() - t_start, 1)
            result.write(args.out)  # partial results survive a timeout
        del layers, ckpt
        if device == "cuda":
            torch.cuda.empty_cache()
    result.notes.append(f"us = mean over {PDL_ROUNDS} interleaved rounds (us_rounds: each round's median of 15 replays of "
                        f"a CUDA graph of {PDL_CHAIN} forwards, weights rotating over {copies} layer copies); "
                        "vs_default = default us / this us (> 1: faster); touched_MB = distinct experts x (w13 + w2 + "
                        "E8M0 scales)")
    result.notes.append("labels: GemvConfig as in earlier runs, then pdl = the four launches with programmatic dependent "
                        "launch, each program's trigger right after its wait (late: after its last store), l2 = each "
                        "down program's weight block (and E8M0 bytes) prefetched into L2 by cp.async.bulk.prefetch "
                        "before its wait; chain_equal = a captured chain of 12 PDL forwards into separate outputs "
                        "gives each output bit for bit as the same tiles without PDL")
    result.finish(args.out, t_start)


# run 19 (--run19, issue 4 / issue 8 at B = 1..8): where the fp16 TMA GEMV forward's time goes (each launch alone, the
# chain of forwards without one launch, the bytes each launch moves) and candidates: the top-k sum folded into the down
# launch (GemvConfig.fold_sum: 3 launches; 0.83-0.99x, removed with its kernel code, commit e66809f); at B = 1 8 warps
# per program (gate/up or both), 2 ring stages, K steps of 1024 (0.59-0.94x, timed with the fold); PDL where it is not
# shipped (T=1 B = 8 / 16: 1.014 / 1.003x). Without the fold option the mode now times the shipped tiles, 8 warps, K
# 1024, 2 stages and PDL as they are.
RUN19_CASES = ((1, 1), (4, 1), (1, 8), (4, 8), (1, 2), (1, 4), (4, 2), (4, 4), (4, 16), (2, 1), (1, 16))
RUN19_ANATOMY = ((1, 1), (4, 1), (1, 8))  # (T, B) with the launch-by-launch anatomy
# run 19b (--run19b): each gate/up program asks L2 for a weight block before its PDL wait (GemvConfig.pdl_l2 on the
# gate/up config), at every B where PDL is shipped (T=1 B=1..4, T=2 B=1..8, T=4 B=1..16), at T=1 also with the down
# launch's prefetch; anatomy at T=1 / 4 B=1. It was 0.89-0.98x everywhere but T=4 B=1 (1.015x) and was removed (code
# in commit ce653e6); the mode now times the shipped forward and its anatomy alone.
RUN19B_CASES = ((1, 1), (1, 2), (1, 3), (1, 4), (4, 1), (4, 2), (4, 4), (4, 8), (4, 16), (4, 3), (4, 6), (4, 12),
                (4, 5), (4, 7), (4, 9), (4, 10), (4, 11), (4, 13), (4, 14), (2, 1), (2, 2), (2, 4), (2, 8), (2, 3),
                (2, 5), (2, 6), (2, 7))  # grouped by T (layers are built once per T), most telling first
RUN19B_ANATOMY = ((1, 1), (4, 1))
RUN19_DEADLINE_S = 175  # for a 240 s device limit
RUN19B_DEADLINE_S = 120  # for a 180 s device limit
# run 22 (--run22, prepared in round 22, not run: the device gate was not met; docs/moe.md "Round 22"): K splits of the
# fp16 TMA GEMV forward (down / gate/up), 4-stage rings and 2x-row tiles at B = 1, T = 1 / 4 / 2, B = 1..8. The kernel
# option, its tests and the mode are in commits 1300571 and e659609 (removed untimed in the commit after them).
# run 23 (--run23, prepared in round 23, not run: two refused starts at 12:24 / 12:37 UTC, then the device budget under the
# brief's 800 s gate; docs/moe.md "Round 23"): the fp16 TMA GEMV forward without its routing + x launch
# (GemvConfig.direct, 3 launches) beside the shipped forward at T = 1 / 4 / 2, B = 1 / 2. The option, its tests, AOT
# configs and the mode are in commit d2e3a8c (removed untimed in the commit after it; git revert of that commit puts
# them back).
RUN19_ROUNDS = 2


def run19_variants(rows, inter, full, run19b=False):
    """(label, (gate/up, down) GemvConfig) of run 19 at (rows, inter): the shipped tiles first; with ``full`` (T=1 / 4
    at B = 1) the tile candidates; PDL where it is not shipped. ``run19b``: the shipped tiles alone (run 19b's gate/up
    L2 prefetch is gone)."""
    import dataclasses

    def both(tiles, **kw):
        return tuple(dataclasses.replace(c, **kw) for c in tiles)

    shipped = moe.gemv_configs(rows, inter)
    out = [("shipped", shipped)]
    if run19b:
        return out
    if not shipped[0].pdl:  # PDL where it is not shipped (T=1 B=8, B=16)
        out.append(("pdl", both(shipped, pdl=True)))
    if full:
        w8 = both(shipped, num_warps=8)
        out += [("gu w8", (w8[0], shipped[1])), ("w8", w8), ("k1024", both(shipped, block_k=1024)),
                ("ring2", both(shipped, tma_ring=2))]
    return out


def launch_bytes(batch, ids, hidden, inter, num_experts):
    """Bytes each launch of the fp16 GEMV forward must move: route (x read, fp16 pairs + unscale written), gate/up
    (touched experts' w13 words + E8M0 bytes, x pairs, fp16 SwiGLU rows), down (w2 + E8M0, SwiGLU rows, fp32 y rows),
    top-k sum (y rows, bf16 out)."""
    experts = int(torch.unique(ids[(ids >= 0) & (ids < num_experts)]).numel())
    rows = ids.numel()
    return {"route": batch * hidden * 4 + batch * 4,
            "gate_up": experts * 2 * inter * (hidden // 2 + hidden // 32) + batch * hidden * 2 + rows * inter * 2,
            "down": experts * hidden * (inter // 2 + inter // 32) + rows * inter * 2 + rows * hidden * 4,
            "topk_sum": rows * hidden * 4 + batch * hidden * 2}


def run19(args) -> None:
    """Run 19 (--run19): see RUN19_* above. Every variant is checked against the float32 reference; a captured chain
    of 12 of its forwards into separate outputs must give each output bit for bit as the same tiles without PDL and
    without the fold, launched eagerly (chain_equal); timing: CUDA graphs of 12 forwards (weights over 3 layer
    copies), the variants interleaved over RUN19_ROUNDS rounds. Anatomy (RUN19_ANATOMY, the shipped tiles and the
    fold): each launch alone in its own graph of 12, and the graph of 12 forwards without one launch."""
    import dataclasses

    from sglang_sm120.kernels.harness.devicebench import BenchResult, copy_bandwidth_gbs, relative_error

    if args.smoke:  # TMA needs K >= 512: I = 512 at "T=1" (its tiles: the T=4 ones), tiny expert count
        device, num_experts, hidden, copies, base_inter = "cpu", 8, 512, 2, 512
        cases, anatomy_cases = ((1, 1),), ((1, 1),)
        moe.CPU_SM_COUNT = 5
    else:
        device, num_experts, hidden, copies, base_inter = "cuda", NUM_EXPERTS, HIDDEN_SIZE, 3, MOE_INTERMEDIATE_SIZE
        cases, anatomy_cases = (RUN19B_CASES, RUN19B_ANATOMY) if args.run19b else (RUN19_CASES, RUN19_ANATOMY)
    if args.batches:
        cases = tuple((tp, int(b)) for tp in sorted({t for t, _ in cases}) for b in args.batches.split(","))
    chain_len = 2 if args.smoke else PDL_CHAIN
    deadline = RUN19B_DEADLINE_S if args.run19b else RUN19_DEADLINE_S
    run = timer(args.smoke)
    t_start = time.time()
    copy_gbs = 0.0 if args.smoke else copy_bandwidth_gbs()
    result = BenchResult(
        name=args.name or ("moe_mxfp4-h200-run19b" if args.run19b else "moe_mxfp4-h200-run19"),
        title=("sm120 MoE decode, run 19b: the gate/up launch's L2 prefetch before its PDL wait, T=1/2/4, H200"
               if args.run19b else "sm120 MoE decode, run 19: the fp16 TMA GEMV forward launch by launch, the top-k sum "
               "folded into the down launch, tile candidates, T=1/2/4 B=1..16, H200"),
        columns=["T", "B", "variant", "part", "us", "us_rounds", "MB", "GB/s", "%copy", "rel_err", "chain_equal",
                 "vs_shipped", "tiles"])
    result.extra.update({"copy bandwidth (GB/s, read+write, eager)": round(copy_gbs, 1),
                         "PDL active on this device": moe.pdl_supported(torch.device(device))})
    layer_cache = {}
    for tp, batch in cases:
        if time.time() - t_start > deadline and not args.smoke:
            result.notes.append(f"T={tp} B={batch}: skipped, past {deadline} s into the run")
            continue
        inter = base_inter // tp
        if tp not in layer_cache:
            layer_cache.clear()
            if device == "cuda":
                torch.cuda.empty_cache()
            layers = [make_layer(num_experts, hidden, inter, device, seed=100 * tp + c) for c in range(copies)]
            ckpt = [t.clone() for t in layers[0]]
            for layer in layers:
                moe.repack_w13_(layer[0], layer[1])
            layer_cache[tp] = layers, ckpt
        layers, ckpt = layer_cache[tp]
        x, weights, ids = make_routing(batch, num_experts, hidden, device, seed=batch + tp)
        touched = moe.touched_expert_bytes(ids, hidden, inter, num_experts)
        ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
        rows = batch * TOP_K
        if not moe.gemv_f16_default(rows, inter):
            result.notes.append(f"T={tp} B={batch}: not an fp16 GEMV point, skipped")
            continue
        full = (tp, batch) in ((1, 1), (4, 1))
        variants = run19_variants(rows, inter, full, args.run19b)

        def forward(layer, tiles, out=None):
            return moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT, out=out, upcast=moe.GEMV,
                                         configs=tiles)

        errs, chain, times, ok = {}, {}, {}, []
        for name, tiles in variants:
            try:
                errs[name] = relative_error(forward(layers[0], tiles), ref)
                bare = tuple(dataclasses.replace(c, pdl=False, pdl_l2=False) for c in tiles)
                plain = []
                for layer in layers:
                    plain.append(forward(layer, bare).clone())
                if device == "cuda":
                    torch.cuda.synchronize()
                chain[name] = chain_matches(lambda layer, out, tiles=tiles: forward(layer, tiles, out), layers, plain,
                                            x, chain_len, device)
                ok.append((name, tiles))
            except Exception as exc:  # one broken variant must not lose the run
                result.notes.append(f"T={tp} B={batch} {name}: {type(exc).__name__}: {str(exc)[:300]}")
                print("FAILED", tp, batch, name, exc, flush=True)
        for _ in range(RUN19_ROUNDS):  # interleaved: every variant once per round
            for name, tiles in ok:
                times.setdefault(name, []).append(
                    run(cycling(lambda layer, tiles=tiles: forward(layer, tiles), layers)))
        shipped_us = sum(times["shipped"]) / RUN19_ROUNDS if "shipped" in times else float("nan")
        for name, tiles in ok:
            us = sum(times[name]) / RUN19_ROUNDS
            gbs = touched / (us * 1e-6) / 1e9
            result.add(T=tp, B=batch, variant=name, part="forward", us=us,
                       us_rounds=" / ".join(f"{t:.2f}" for t in times[name]), MB=touched / 1e6, rel_err=errs[name],
                       chain_equal=chain[name], vs_shipped=shipped_us / us, tiles=label(tiles),
                       **{"GB/s": gbs, "%copy": 100 * gbs / copy_gbs if copy_gbs else 0.0})
            print(f"T={tp} B={batch} {name} [{label(tiles)}]: {us:.2f} us ({times[name]}), {shipped_us / us:.3f}x, "
                  f"err {errs[name]:.2e}, chain {chain[name]}", flush=True)
        if (tp, batch) in anatomy_cases and (time.time() - t_start <= deadline or args.smoke):
            sizes = launch_bytes(batch, ids, hidden, inter, num_experts)
            for name, tiles in ok:
                if name not in ("shipped", "fold", "gu l2"):
                    continue
                outs = [torch.empty_like(x) for _ in layers]
                launches = [dict(moe.gemv_launches(x, *layer, weights, ids, o, SWIGLU_LIMIT, tiles))
                            for layer, o in zip(layers, outs)]
                parts = [("alone " + p, [p]) for p in moe.GEMV_LAUNCH_NAMES]
                parts += [("chain without " + p, [q for q in moe.GEMV_LAUNCH_NAMES if q != p])
                          for p in moe.GEMV_LAUNCH_NAMES]
                parts.append(("chain of all four", list(moe.GEMV_LAUNCH_NAMES)))
                for part, steps in parts:
                    us = run(cycling(lambda ls, steps=steps: [ls[p]() for p in steps], launches))
                    nbytes = sizes[steps[0]] if len(steps) == 1 else float("nan")
                    gbs = nbytes / (us * 1e-6) / 1e9
                    result.add(T=tp, B=batch, variant=name, part=part, us=us, MB=nbytes / 1e6, tiles=label(tiles),
                               **{"GB/s": gbs, "%copy": 100 * gbs / copy_gbs if copy_gbs else 0.0})
                    print(f"T={tp} B={batch} {name} {part}: {us:.2f} us, {gbs:.0f} GB/s", flush=True)
        result.extra["wall seconds"] = round(time.time() - t_start, 1)
        result.write(args.out)  # partial results survive a timeout
    result.notes.append(f"forward rows: us = mean over {RUN19_ROUNDS} interleaved rounds (us_rounds: each round's median "
                        f"of 15 replays of a CUDA graph of {PDL_CHAIN} forwards, weights over {copies} layer copies); "
                        "vs_shipped = shipped us / this us; MB = touched experts' weights + E8M0 bytes (forward) or "
                        "the bytes the launch moves (alone rows); chain_equal: a captured chain of 12 forwards gives "
                        "each output bit for bit as the same tiles launched eagerly without PDL (and without the "
                        "fold, run 19)")
    result.notes.append("anatomy rows (part): 'alone X' = launch X alone, 12 per graph (with its PDL attribute where "
                        "the tiles have it, so consecutive copies overlap as in the chain); 'chain without X' = 12 "
                        "forwards of the other launches; labels as in run 17, fs = the top-k sum folded into the down "
                        "launch (GemvConfig.fold_sum, run 19); l2 on the gate/up label (run 19b) = each gate/up "
                        "program's L2 prefetch before its wait")
    result.finish(args.out, t_start)


def label(cfgs) -> str:
    kind = "pairs" if isinstance(cfgs[0], moe.PairsConfig) else "gemv"
    return f"{kind} {cfgs[0].label()} / {cfgs[1].label()}"


def launches_of(kw):
    """The per-launch builder of a variant's form, or None (tensor-core GEMM path: no breakdown)."""
    if kw.get("upcast") == moe.PAIRS:
        return moe.pairs_launches
    return moe.gemv_launches if kw.get("upcast") == moe.GEMV else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    from sglang_sm120.kernels.harness.devicebench import BenchResult, copy_bandwidth_gbs, relative_error

    parser.add_argument("--pairs", action="store_true")
    parser.add_argument("--tma", action="store_true", help="round 8b: TMA GEMV candidates (device only: K >= 512)")
    parser.add_argument("--words", action="store_true", help="round 9: pairs decode with the scale on the pair words")
    parser.add_argument("--persistent", action="store_true",
                        help="round 11: persistent TMA GEMV candidates (device only: K >= 512)")
    parser.add_argument("--persistent2", action="store_true",
                        help="run 11b: persistent down launch alone / both at P = 6-12, launch by launch everywhere")
    parser.add_argument("--swap-ab", action="store_true",
                        help="round 15: swap-AB tensor-core decode with TMA-fed weights (device only: K >= 512)")
    parser.add_argument("--swap-ab2", action="store_true",
                        help="run 15b: swap-AB with one warp per 16 weight rows (no replicated dequant)")
    parser.add_argument("--swap-ab3", action="store_true",
                        help="run 15c: swap-AB gate/up + TMA GEMV down (mixed), more swap-AB tiles, T=1/4 B=1..4, 8")
    parser.add_argument("--f16", action="store_true",
                        help="round 16: the TMA GEMV's fp16 pair decode, T=1/4 B=1, 2, 4, 8 (device only: K >= 512)")
    parser.add_argument("--f16b", action="store_true",
                        help="run 16b: the fp16 TMA GEMV on 1x / 2x / 4x-row tiles, T=1/2/4 B=1..64 (device only: K >= 512)")
    parser.add_argument("--pdl", action="store_true",
                        help="run 17: PDL on the fp16 TMA GEMV forward vs without, T=1/2/4 B=1..64")
    parser.add_argument("--run18", action="store_true",
                        help="run 18: the pairs decode at B = 64 / 128 / 256 launch by launch, TMA tiles with sub_k")
    parser.add_argument("--run21", action="store_true",
                        help="run 21: the PAIRS_TMA_ROWS_WHERE tiles at B = 12 / 15 / 192 / 224 / 300 / 341")
    parser.add_argument("--run20b", action="store_true",
                        help="run 20b: the forward of run 20's launch choices at B = 8..256")
    parser.add_argument("--run20", action="store_true",
                        help="run 20: the pairs decode at B = 32..256 launch by launch, 8 routed rows per MMA pass, "
                             "32 weight rows per warp")
    parser.add_argument("--run18b", action="store_true",
                        help="run 18b: the TMA gate/up with the down launch on 32 rows / 2 warps, sub_k 512 / 256 / 128")
    parser.add_argument("--bytes", action="store_true",
                        help="run 26: the shipped fp16 TMA GEMV forward (with --down-per-sm, run 26c: persistent downs)")
    parser.add_argument("--down-per-sm", default="", help="with --bytes (run 26c): the down launch persistent at these "
                        "programs per SM, comma-separated")
    parser.add_argument("--tiles", default="", help="with --bytes (run 28): comma-separated GU/DN[rR][l2]: the gate/up "
                        "launch's columns and the down launch's rows per program, both launches' ring depth R, the "
                        "down launch's L2 prefetch (e.g. 32/32,16/64r4,32/32l2), each timed beside the shipped tiles")
    parser.add_argument("--w0-early", action="store_true", help="with --bytes (round 32): beside the shipped tiles, "
                        "the same with early_tables and the down launch's first K step loaded before its PDL wait or "
                        "not, by TMA (3 / 2 ring stages) or per-thread loads")
    parser.add_argument("--early-tables-flip", action="store_true",
                        help="with --bytes (run 29): each shipped tile pair also with GemvConfig.early_tables flipped")
    parser.add_argument("--shipped", action="store_true",
                        help="with --pdl (run 17b): the shipped PDL defaults vs the previous defaults")
    parser.add_argument("--gemv-max-batch", type=int, default=WORDS_GEMV_MAX_BATCH,
                        help="--words: GEMV candidates up to this B, pairs candidates above it")
    parser.add_argument("--breakdown", default="", help="comma-separated variant labels (or 'default') timed "
                        "launch by launch at every B (default: B = 1 only, every variant)")
    parser.add_argument("--only", default=None,
                        help="keep only candidates whose label contains one of these comma-separated texts")
    parser.add_argument("--name", default=None, help="result name (default: the round's name)")
    parser.add_argument("--batches", default=None, help="comma-separated B values (default: the round's)")
    parser.add_argument("--tps", default=None, help="comma-separated tensor-parallel sizes T (default: 1,4)")
    parser.add_argument("--run19", action="store_true",
                        help="run 19: the fp16 GEMV forward launch by launch, tile candidates")
    parser.add_argument("--run19b", action="store_true",
                        help="run 19b: the gate/up launch's L2 prefetch before its PDL wait, every B where PDL ships")
    args = parser.parse_args()
    if args.run19 or args.run19b:
        run19(args)
        return
    if args.pdl or args.bytes:
        pdl_comparison(args)
        return
    if args.persistent2:
        args.persistent = True
    if args.swap_ab2 or args.swap_ab3:
        args.swap_ab = True
    breakdown = [b for b in args.breakdown.split(",") if b]
    gemv_max_batch = args.gemv_max_batch
    if args.smoke:
        from sglang_sm120.kernels.harness.interpreter import patch_bf16_dot

        patch_bf16_dot()
        device, num_experts, hidden, tps, batches, copies, base_inter = "cpu", 8, 256, (1, 4), (1, 3), 2, 256
        candidates = PAIRS_SMOKE_CANDIDATES if args.pairs else SMOKE_CANDIDATES
        if args.words:
            candidates, batches = WORDS_SMOKE_CANDIDATES, (3, 16)
            gemv_max_batch = 3  # the smoke's pairs candidates run at B = 16 only
        if args.tma:  # TMA needs K >= 512
            hidden, base_inter, tps, batches = 512, 512, (1,), (1,)
            candidates = [(G(128, 512, 4, tma_ring=2), G(256, 512, 4, tma_ring=2))]
        if args.persistent:  # TMA needs K >= 512; 2 column blocks x 6 rows = 12 items on a 10-program grid
            hidden, base_inter, tps, batches = 512, 512, (1,), (1, 3)
            candidates = [(G(256, 512, 4, tma_ring=2, persistent_programs_per_sm=2),) * 2,
                          (G(256, 512, 4, tma_ring=2), G(256, 512, 4, tma_ring=2, persistent_programs_per_sm=2))]
            moe.CPU_SM_COUNT = 5
        if args.swap_ab:  # TMA needs K >= 512; B = 3 with 8 experts: several rows per expert in one MMA pass
            hidden, base_inter, tps, batches = 512, 512, (1,), (1, 3)
            candidates = [_swap_ab(128, 256, ring=2), _swap_ab(256, 512, ring=3, on_words=False)]
            if args.swap_ab3:  # the mixed forward, plain and persistent GEMV down (12 items on a 10-program grid)
                gu = P(128, 512, 4, mul_pairs=True, scale_bf16=True, scale_on_words=True, tma_ring=2)
                candidates = [(gu, G(256, 512, 4, tma_ring=2)),
                              (gu, G(256, 512, 4, tma_ring=2, persistent_programs_per_sm=2))]
                moe.CPU_SM_COUNT = 5
        if args.f16:  # TMA needs K >= 512; fp16 and bf16 at the same tiles, the down launch persistent or not
            hidden, base_inter, tps, batches = 512, 512, (1,), (1, 3)
            tiles = (G(128, 512, 4, tma_ring=2), G(256, 512, 4, tma_ring=2, persistent_programs_per_sm=2))
            candidates = [tiles, tuple(G(**{**c.__dict__, "f16": True}) for c in tiles),
                          (G(128, 512, 4, tma_ring=2, f16=True), G(256, 512, 4, tma_ring=2, f16=True))]
            moe.CPU_SM_COUNT = 5
        if args.f16b:  # TMA needs K >= 512; I = 512 = the T=4 shape: the persistent down launch on 5 programs
            hidden, base_inter, tps, batches, candidates = 512, 512, (1,), (1, 3), None
            moe.CPU_SM_COUNT = 5
        if args.run20b or args.run21:
            args.run20 = True
        if args.run20:  # TMA needs K >= 512; block_m 8 (B = 16 on 8 experts: two passes) and sub_k on reduced tiles
            hidden, base_inter, tps, batches = 512, 512, (1,), (3, 16)
            form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True, "tma_ring": 2}
            candidates = [tuple(P(n, 512, 4, block_m=8, sub_k=k, **form) for n in (128, 256)) for k in (0, 128)]
        if args.run18 or args.run18b:  # TMA needs K >= 512; the run's sub_k forms on reduced tiles
            hidden, base_inter, tps, batches = 512, 512, (1,), (3,)
            form = {"mul_pairs": True, "scale_bf16": True, "scale_on_words": True, "tma_ring": 2}
            candidates = [tuple(P(n, 512, 4, sub_k=k, **form) for n in (128, 256)) for k in (0, 128, 256)]
    else:
        device, num_experts, hidden, tps, copies, base_inter = (
            "cuda", NUM_EXPERTS, HIDDEN_SIZE, (1, 4), 3, MOE_INTERMEDIATE_SIZE)
        batches = (1, 8, 32, 64) if args.pairs else (1, 8, 64)
        candidates = PAIRS_CANDIDATES if args.pairs else GEMV_CANDIDATES
        if args.tma:
            batches, candidates = (1, 2, 4, 8, 16), TMA_CANDIDATES
        if args.words:
            batches, candidates = (1, 8, 16, 32, 64, 256), WORDS_CANDIDATES + WORDS_GEMV_CANDIDATES
        if args.persistent:
            batches, candidates = (1, 2, 4, 8, 16), PERSISTENT_CANDIDATES
        if args.persistent2:
            tps, batches, candidates = (1, 2, 4), tuple(range(1, 17)), PERSISTENT2_CANDIDATES
        if args.swap_ab:
            batches, candidates = (1, 2, 4, 8, 16, 32, 64), SWAP_AB2_CANDIDATES if args.swap_ab2 else SWAP_AB_CANDIDATES
            if args.swap_ab3:
                batches, candidates = (1, 2, 3, 4, 8), SWAP_AB3_CANDIDATES
        if args.f16:
            batches, candidates = (1, 2, 4, 8), None  # per case: f16_candidates
        if args.f16b:
            tps, batches, candidates = F16B_TPS, F16B_BATCHES, None  # per case: f16b_candidates
        if args.run18:
            batches, candidates = RUN18_BATCHES, run18_candidates()
        if args.run18b:
            batches, candidates = RUN18B_BATCHES, run18b_candidates()
        if args.run21:
            args.run20 = True
            batches, candidates = RUN21_BATCHES, run21_candidates()
        elif args.run20b:
            args.run20 = True
            batches, candidates = RUN20B_BATCHES, run20b_candidates()
        elif args.run20:
            batches, candidates = RUN20_BATCHES, run20_candidates()
    if args.only and candidates is not None:
        candidates = [c for c in candidates if any(part in label(c) for part in args.only.split(","))]
    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
    if args.tps:
        tps = tuple(int(t) for t in args.tps.split(","))
    if args.run20:
        args.run18 = True  # the run-18 form, labels, breakdown (run 20's own deadline and name below)
    if args.run18b:
        args.run18 = True  # the run-18 form, labels, breakdown
    if args.words or args.swap_ab or args.run18:
        args.pairs = True  # the pairs form, labels and notes
    deadline = (RUN21_DEADLINE_S if args.run21 else RUN20B_DEADLINE_S if args.run20b else RUN20_DEADLINE_S if args.run20 else RUN18B_DEADLINE_S if args.run18b else RUN18_DEADLINE_S if args.run18 else F16B_DEADLINE_S if args.f16b else F16_DEADLINE_S if args.f16 else SWAP_AB_DEADLINE_S if args.swap_ab else WORDS_DEADLINE_S if args.words else PAIRS_DEADLINE_S if args.pairs
                else PERSISTENT_DEADLINE_S if args.persistent else TMA_DEADLINE_S if args.tma else DEADLINE_S)
    run = timer(args.smoke)
    t_start = time.time()
    copy_gbs = 0.0 if args.smoke else copy_bandwidth_gbs()
    result = BenchResult(
        name=args.name or ("moe_mxfp4-h200-run21" if args.run21 else "moe_mxfp4-h200-run20b" if args.run20b else "moe_mxfp4-h200-run20" if args.run20 else "moe_mxfp4-h200-run18b" if args.run18b else "moe_mxfp4-h200-run18" if args.run18 else "moe_mxfp4-h200-run16b" if args.f16b else "moe_mxfp4-h200-run16" if args.f16 else "moe_mxfp4-h200-run15c" if args.swap_ab3 else "moe_mxfp4-h200-run15b" if args.swap_ab2 else "moe_mxfp4-h200-run15" if args.swap_ab else "moe_mxfp4-h200-run11" if args.persistent else "moe_mxfp4-h200-run10" if args.words else "moe_mxfp4-h200-run2" if args.pairs else
                           "moe_mxfp4-h200-run7" if args.tma else "moe_mxfp4-h200-gemv3"),
        title=("sm120 MoE decode, run 21: the PAIRS_TMA_ROWS_WHERE tiles at B = 12..341 where run 20b did not "
               "measure them, DSv4-Flash shapes, H200" if args.run21 else
               "sm120 MoE decode, run 20b: the forward of run 20's launch choices (8 routed rows per pass, 64-row "
               "tiles), B = 8..256, DSv4-Flash shapes, H200" if args.run20b else
               "sm120 MoE decode, run 20: the TMA pairs decode at B = 32..256 launch by launch, 8 routed rows per "
               "MMA pass, 32 weight rows per warp, DSv4-Flash shapes, H200" if args.run20 else
               "sm120 MoE decode, run 18b: the TMA gate/up with the down launch on 32 rows / 2 warps, sub_k 512 / 256 / "
               "128, DSv4-Flash shapes, H200" if args.run18b else
               "sm120 MoE decode, run 18: the pairs decode at B = 64 / 128 / 256 launch by launch, TMA tiles with a K "
               "step as 2 / 4 MMAs, DSv4-Flash shapes, H200" if args.run18 else
               "sm120 MoE decode, run 16b: the fp16 TMA GEMV on 1x / 2x / 4x-row tiles, T=1/2/4 B=1..64, H200"
               if args.f16b else "sm120 MoE decode, round 16: the TMA GEMV's fp16 pair decode (packed HFMA2), DSv4-Flash shapes, H200"
               if args.f16 else "sm120 MoE decode, round 15: swap-AB on tensor cores with TMA-fed weights, DSv4-Flash shapes, H200"
               if args.swap_ab else "sm120 MoE decode, round 11: persistent TMA GEMV, DSv4-Flash shapes, H200" if args.persistent else
               "sm120 MoE decode, round 9: pairs decode with the E8M0 scale on the int32 pair words, DSv4-Flash shapes, H200"
               if args.words else
               "sm120 MoE decode, round 8b: CUDA-core GEMV with its operands fetched by TMA, DSv4-Flash shapes, H200"
               if args.tma else
               "sm120 MoE decode, round 4: tensor-core pairs decode vs the defaults, DSv4-Flash shapes, H200"
               if args.pairs else
               "sm120 MoE decode, round 3: fewer instructions per weight value in the CUDA-core GEMV, DSv4-Flash shapes, H200"),
        columns=["T", "B", "variant", "us", "touched_MB", "GB/s", "%copy", "rel_err", "vs_default",
                 "route_us", "gate_up_us", "down_us", "topk_sum_us"])
    result.extra.update({"copy bandwidth (GB/s, read+write, eager)": round(copy_gbs, 1),
                         "launches per forward": moe.LAUNCHES_PER_FORWARD})
    all_layers = {}
    for tp in tps:
        inter = base_inter // tp
        layers = [make_layer(num_experts, hidden, inter, device, seed=100 * tp + c) for c in range(copies)]
        ckpt = [t.clone() for t in layers[0]]
        for layer in layers:
            moe.repack_w13_(layer[0], layer[1])
        all_layers[tp] = layers, ckpt
    cases = [(tp, b) for b in batches for tp in tps]  # B = 1 first (the breakdown), the largest batch last
    if args.persistent2 and not args.smoke:
        cases = [(tp, b) for tp, b in cases if b in PERSISTENT2_BATCHES[tp]]
    elif args.persistent and not args.smoke:  # only where the TMA GEMV is the default
        cases = [(tp, b) for tp, b in cases if b <= PERSISTENT_MAX_BATCH.get(tp, 0)]
    for tp, batch in cases:
        inter = base_inter // tp
        layers, ckpt = all_layers[tp]
        if time.time() - t_start > deadline:
            result.notes.append(f"T={tp} B={batch}: skipped, past {deadline} s into the run")
            continue
        x, weights, ids = make_routing(batch, num_experts, hidden, device, seed=batch + tp)
        touched = moe.touched_expert_bytes(ids, hidden, inter, num_experts)
        ref = moe.reference_moe_mxfp4(x, *ckpt, weights, ids)
        rows = batch * TOP_K
        up = moe.default_upcast(rows, inter)
        if up == moe.GEMV:
            old = f"{label(moe.gemv_configs(rows, inter))} (default)"
        elif up == moe.PAIRS:
            old = f"{label(moe.pairs_configs(rows, inter))} (default)"
        else:
            old = f"tl.dot {up}, split {moe.default_split_k(rows, inter)} (default)"
        form = moe.PAIRS if args.pairs else moe.GEMV
        variants = [(old, {"upcast": up} if up in (moe.GEMV, moe.PAIRS) else {})]
        default_tiles = {moe.GEMV: moe.gemv_configs, moe.PAIRS: moe.pairs_configs}.get(up)
        gemv_default = moe.gemv_configs(rows, inter)
        if args.tma and up != moe.GEMV:  # the pairs default from B = 8 / 9: the GEMV default tiles as well
            variants.append((label(gemv_default), {"upcast": moe.GEMV, "configs": gemv_default}))
        if args.words:  # pairs candidates from B = 16, GEMV candidates up to B = 8
            candidates_here = [c for c in candidates
                               if isinstance(c[0], moe.PairsConfig) == (batch > gemv_max_batch)]
        elif candidates is None:  # --f16 on the device / --f16b: per (T, B)
            candidates_here = f16b_candidates(tp, batch, inter) if args.f16b else f16_candidates(rows, inter)
            if args.only:
                candidates_here = [c for c in candidates_here if any(part in label(c) for part in args.only.split(","))]
        else:
            candidates_here = candidates
        variants += [(label(c), {"upcast": moe.PAIRS if isinstance(c[0], moe.PairsConfig) else moe.GEMV,
                                 "configs": c})
                     for c in candidates_here if default_tiles is None or c != default_tiles(rows, inter)]
        times = {}
        for name, kw in variants:
            def per_layer(layer, kw=kw):
                return moe.moe_mxfp4_forward(x, *layer, weights, ids, SWIGLU_LIMIT, **kw)
            parts = {}
            try:
                err = relative_error(per_layer(layers[0]), ref)
                us = run(cycling(per_layer, layers))
                build = launches_of(kw)
                wanted = (name in breakdown or ("default" in breakdown and name == old)) if breakdown else batch == 1
                wanted = wanted or args.persistent2 or args.swap_ab or args.run18
                if wanted and build is not None:  # launch-by-launch breakdown of the GEMV / pairs forms
                    outs = [torch.empty_like(x) for _ in layers]
                    launches = [build(x, *layer, weights, ids, o, SWIGLU_LIMIT, kw.get("configs"))
                                for layer, o in zip(layers, outs)]
                    for launch in launches[0]:
                        launch[1]()
                    err_parts = relative_error(outs[0], ref)
                    if abs(err_parts - err) > 1e-6:
                        raise RuntimeError(f"launches alone give rel_err {err_parts} vs forward {err}")
                    for i, part in enumerate(moe.GEMV_LAUNCH_NAMES):
                        parts[f"{part}_us"] = run(cycling(lambda ls, i=i: ls[i][1](), launches))
            except Exception as exc:  # one broken variant must not lose the run
                result.notes.append(f"T={tp} B={batch} {name}: {type(exc).__name__}: {str(exc)[:300]}")
                print("FAILED", tp, batch, name, exc, flush=True)
                continue
            times[name] = us
            gbs = touched / (us * 1e-6) / 1e9
            result.add(T=tp, B=batch, variant=name, us=us, touched_MB=touched / 1e6, rel_err=err,
                       **{"GB/s": gbs, "%copy": 100 * gbs / copy_gbs if copy_gbs else 0.0,
                          "vs_default": times[old] / us if old in times else float("nan")},
                       **{k: parts.get(k, float("nan")) for k in ("route_us", "gate_up_us", "down_us", "topk_sum_us")})
            print(f"T={tp} B={batch} {name}: {us:.1f} us, {gbs:.0f} GB/s, err {err:.2e} {parts}", flush=True)
        result.extra["wall seconds"] = round(time.time() - t_start, 1)
        result.write(args.out)  # partial results survive a timeout
    result.notes.append("vs_default = time of the default at the time of the run / time of this row (> 1: faster); "
                        "touched_MB = distinct experts x (w13 + w2 + E8M0 scales); weights rotate over "
                        f"{copies} layer copies; CUDA graphs of 12 calls, median of 15 replays")
    if args.pairs:
        result.notes.append("pairs labels: gate/up / down PairsConfig as n<block_n>k<block_k>w<warps>s<num_stages>, "
                            "mul = nibble pairs placed by one multiply, h = E8M0 factor on the pair values in packed "
                            "bf16, wd = the factor on the int32 pair words by PTX mul.rn.bf16x2 (round 9); "
                            "16 routed rows per MMA pass (m<M>: M rows, run 20); tma<R> (round 15) = swap-AB fed by TMA: weight words and "
                            "scale bytes through a ring of R stages, activations by plain loads; c<S> (run 18) = a K "
                            "step as MMAs of S values (words by TMA in blocks of S); a pairs gate/up with "
                            "a GEMV down label (e.g. n16k512w4tma3) = run 15c's mixed forward: swap-AB gate/up "
                            "writing natural-order bf16 SwiGLU rows, then the TMA GEMV down launch")
    result.notes.append("gemv labels: gate/up / down GemvConfig as n<block_n>k<block_k>w<warps>, s<K splits>, "
                        "p = register prefetch of the next K step, st<num_stages> (none: Triton's default 3), f = x_f32 "
                        "(activations as float32 in the word-pair order, multiply-placed nibble pairs), tma<stages> = "
                        "weights, scales and activations by TMA through a ring of that many stages, pers<P> = "
                        "persistent grid of min(work items, SMs x P) programs (item and K loops flattened into one "
                        "ring; run 11's 'nest': nested, the K loop the ring, since removed); h (after tma<stages>, round 16) = the "
                        "fp16 pair decode (packed fma.rn.f16x2, activations as scaled fp16 pairs); "
                        "*_us columns: each launch alone in its own CUDA graph (B = 1 only; --persistent2: everywhere)")
    result.finish(args.out, t_start)


if __name__ == "__main__":
    main()
