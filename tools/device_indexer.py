"""Lightning indexer on the device: full DSv4-Flash shapes checked against the float32 reference and
timed in CUDA graphs beside upstream's torch path (``fp8_paged_mqa_logits_torch_sm120`` + torch.topk),
with the copy bandwidth measured in the same run.

    python3 tools/device_indexer.py --prepare          # here: extract the upstream baseline
    python3 tools/device_indexer.py --out $OUT         # on the device (carry .upstream)
    TRITON_INTERPRET=1 python3 tools/device_indexer.py --smoke   # here: the script's logic, tiny shapes

Timing: each graph holds ``ROTATIONS`` calls, each over its own index-K pages (disjoint page
tables into one cache), after an L2 flush, so every call reads cold pages as consecutive C4 layers do.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _repo_imports import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

import torch  # noqa: E402

from sglang_sm120.kernels import indexer as ix  # noqa: E402
from sglang_sm120.kernels.dsv4 import C4_RATIO, INDEX_PAGE_BYTES, INDEX_PAGE_SIZE, INDEX_SCALE_OFFSET, INDEX_TOPK  # noqa: E402

UPSTREAM_FILE = "indexer_logits_torch.py"
SHAPES = [(b, ctx) for b in (1, 16, 64) for ctx in (8192, 65536, 262144)]
EXTRA_SHAPES = [(1, 1048576), (256, 8192)]  # the longest context and the largest batch, checked too
ROTATIONS = 8
# Select forms timed beside the shipped default (the ``default_plan`` row: whatever choose_plan picks
# per shape). Runs 1-4 timed the bitwise/radix-4 searches with 4096/8192 chunks and fused splits
# (fused slower everywhere, removed here). Run 5: the histogram select (``hist``: first digit
# counted by the logits kernel, a split pass, one program per row) and the untimed double-warp
# searches. Run 6: how the logits kernel counts the first digit: interleaved copies (as run 5),
# copy-major copies, per-program tl.histogram aggregation; run 6b: 8, 16 or 32 copy-major copies
# (8 copy-major shipped: benchmarks/indexer-h200-run6-summary.md; the others removed). Run 7: the
# passes after the logits (final program over 1024- or 4096-entry blocks, folded into the split
# launch, 2048- or 4096-entry split chunks); the folded form with 2048 / 1024 shipped
# (benchmarks/indexer-h200-run7-summary.md), the others removed. Run 8: the plan buckets, every
# shipped select form forced beside the default (--forms hist,bitwise,bitwise_2xw,chunk8k).
FORM_CATALOG = {
    "hist": ix.SelectForm(method="histogram"),
    "bitwise": ix.SelectForm(),
    "bitwise_2xw": ix.SelectForm(warps_mul=2),
    "chunk8k": ix.SelectForm(max_chunk=8192),
    # run 11: the histogram select from a page-max bound (no count per logit in the logits kernel)
    "hist_pmax": ix.SelectForm(method="histogram", threshold="page_max"),
    # run 14: the page-max overlap form (row-major logits grid of 2048 programs, the select waiting per row)
    "hist_pmax_ov2048": ix.SelectForm(method="histogram", threshold="page_max",
                                    overlap_programs=ix.PAGE_MAX_OVERLAP_PROGRAMS),
    # round 33: the page-max finish in registers (tl.histogram rounds) instead of the workspace's digit histograms
    "hist_pmax_reg": ix.SelectForm(method="histogram", threshold="page_max", finish="registers"),
    "hist_pmax_ov2048_reg": ix.SelectForm(method="histogram", threshold="page_max", finish="registers",
                                        overlap_programs=ix.PAGE_MAX_OVERLAP_PROGRAMS),
    "hist_pmax_lean": ix.SelectForm(method="histogram", threshold="page_max", finish="registers_lean"),
    "hist_pmax_ov2048_lean": ix.SelectForm(method="histogram", threshold="page_max", finish="registers_lean",
                                         overlap_programs=ix.PAGE_MAX_OVERLAP_PROGRAMS),
    # round 34: the overlap form's program count with the lean finish (run 13 timed 1024 / 4096 with the histograms)
    "hist_pmax_ov1024_lean": ix.SelectForm(method="histogram", threshold="page_max", finish="registers_lean",
                                         overlap_programs=1024),
    "hist_pmax_ov4096_lean": ix.SelectForm(method="histogram", threshold="page_max", finish="registers_lean",
                                         overlap_programs=4096),
}  # run 5a also timed a double-warp radix-4 search: no faster than the defaults; removed from the kernel
# runs 18 / 19 (round 27): the rank select (every pair of positions of a row compared; no search rounds), by positions
# per program and warps (_w4: 4 warps, else 8). Run 19 also timed a form listing the selection in position order (a
# ticket, the row's last program listing it: 2.3-12.6 us slower; in runs 19 and layer run 17 the rank_* rows are that
# form and rank_*_u the shipped one; commit 0ddefbb has it)
for rows in ix.RANK_ROWS:
    FORM_CATALOG[f"rank_r{rows}"] = ix.SelectForm(method="rank", rank_rows=rows, warps_mul=2)
    FORM_CATALOG[f"rank_r{rows}_w4"] = ix.SelectForm(method="rank", rank_rows=rows)
SELECT_FORMS = {"hist": FORM_CATALOG["hist"]}  # --forms replaces it
TOPK_ONLY_FORMS = ["hist"]  # top-k alone from a given logits row (the seam's unfused call); --no-topk-only drops it
FUSED_VARIANTS = {}  # (pages per split, select form of the merge); none timed since run 4
# Launch settings of kernels/indexer.py (module attributes) timed against each other in one run: every
# variant runs the default plan (and each --forms form) with these attributes set, then restores them.
# Run 9 timed on/off flags one at a time (variants pdl, one_shot, lean, pdl_lean: PDL, one-shot first-digit
# reduce, lean histogram select), which became the shape rules of kernels/indexer.py (the flags and
# variants are gone); run 9b timed those rules against run 8's launches and plan table (run8) and against
# the rules less one part (benchmarks/indexer-h200-run9-summary.md).
# Run 10 timed the histogram select's split programs claiming slots with one atomic per entry (shipped),
# 8 warps per select program (shipped up to 256 programs), PDL above B=16 (< 1 %) and a windowed
# first-digit count in the logits kernel (slower at long context; removed). Run 10b: the split chunk
# (1024 / 4096 entries) with the atomic split programs, the warp rule at its ends, and (the forced
# two_kernel_hist rows) the histogram select at B=32-128 x 64K (run 10: B=64 x 64K 67.8 us vs 72.7 for the
# 8192-entry search).
# Run 11 / 11b: the page-max threshold (form hist_pmax: per-page tl.max in run 11, where its select failed to
# compile; group maxima in 11b, shipped for B 5-64 at long rows), the count into 1 / 4 histogram copies (1 copy
# shipped for B 3-4 / 9-16 x 8193-16384), the page-max group count (pmax_keys1024: < 2 %).
VARIANT_CATALOG = {
    "no_pdl": dict(USE_PDL=False),
    "long_blocks": dict(HIST_LONG_REDUCE=0),  # the block reduce (not early exit) where the one-shot is not used
    "early_exit_all": dict(HIST_ONE_SHOT_MAX_PAGES=0),  # the early-exit reduce also where the one-shot is used
    "split1024": dict(HIST_SPLIT_MAX_CHUNK=1024),
    "split4096": dict(HIST_SPLIT_MAX_CHUNK=4096),
    "select_w4_all": dict(HIST_SELECT_8_WARPS_MAX_PROGRAMS=0),
    "select_w8_all": dict(HIST_SELECT_8_WARPS_MAX_PROGRAMS=1 << 20),
    "one_block_all": dict(HIST_ONE_BLOCK_MAX_PROGRAMS=1 << 20),  # the one-block finish at every program count
    # run 11, why counting costs: the logits kernel's first-digit count into 1 or 4 copies (8 shipped)
    "copies1": dict(HIST_COPIES=1),
    "copies4": dict(HIST_COPIES=4),
    # run 11b: group maxima per row of the page-max form (2048 shipped)
    "pmax_keys1024": dict(PAGE_MAX_KEYS=1024),
    "pmax_keys4096": dict(PAGE_MAX_KEYS=4096),
    # run 18: the rank select's positions per loop step (RANK_BLOCK_J, 2048 shipped)
    "rank_j1024": dict(RANK_BLOCK_J=1024),
    "rank_j4096": dict(RANK_BLOCK_J=4096),
    # run 12 (H200, 2026-12-03): the page-max select's parts; its round-20 candidates (the list loaded beside its
    # count, at most 512 split programs, the bound in the select) were level or slower and are removed
    "bound_bits0": dict(PAGE_MAX_BOUND_BITS=0),
    # run 13 (round 21) timed PAGE_MAX_OVERLAP (commit 92685f2: row-major logits grid, per-row ready flag, the select
    # launched with PDL waiting per row): 59.0 -> 60.6 us at B=16 x 256K, level at B=32, slower at B=64; removed.
    # Run 14 (round 21, commit 9b0d8c1's variants overlap / tpN / overlap_tpN: the overlap and the page-max form's
    # logits programs per launch): the overlap at 2048 programs shipped for B 17-32 x 32769-65536 positions
    # (SelectForm.overlap_programs; FORM_CATALOG["hist_pmax_ov2048"]), the rest level or slower and removed
}


class FixedSelectWarps:
    """A stand-in for ``ix._select_warps``: every search program on ``warps`` warps (run 17: where the B=1 x 8K
    select's ~8.5 us go; one warp has no cross-warp exchange and no barrier in its 32 counts)."""

    def __init__(self, warps):
        self.warps = warps

    def __call__(self, chunk, warps_mul=1):
        return self.warps

    def __repr__(self):
        return f"select programs on {self.warps} warps"


VARIANT_CATALOG.update({f"select_w{w}": dict(_select_warps=FixedSelectWarps(w)) for w in (1, 2, 4, 16)})
VARIANTS = ["shipped"]  # --variants replaces it; "shipped": the module's flags as committed
COLUMNS = ("B", "context", "c4_len", "index_k_MB", "variant", "us", "vs_upstream", "read_GBps", "pct_copy_bw",
           "logits_rel_err", "sel_violations", "exact_overlap", "note")


@contextlib.contextmanager
def use_variant(name):
    """Set kernels/indexer.py's launch flags to variant ``name`` for the calls (and graph captures) inside."""
    overrides = {} if name == "shipped" else VARIANT_CATALOG[name]
    saved = {attr: getattr(ix, attr) for attr in overrides}
    for attr, value in overrides.items():
        setattr(ix, attr, value)
    try:
        yield
    finally:
        for attr, value in saved.items():
            setattr(ix, attr, value)


def variant_name(base, variant):
    return base if variant == "shipped" else f"{base}[{variant}]"


def prepare() -> None:
    import upstream

    path = upstream.extract_functions(
        "srt/layers/attention/dsv4/indexer.py", {"fp8_paged_mqa_logits_torch_sm120"},
        preamble="import torch\nimport torch.nn.functional as F\nfrom typing import Any\n"
                 "FP8_DTYPE = torch.float8_e4m3fn\n",
        out_name=UPSTREAM_FILE)
    print("wrote", path)


def build(batch, c4_len, device, rotations, seed=0):
    """One cache holding ``rotations`` disjoint sets of pages; per rotation a page table, ragged
    lengths near ``c4_len`` (row 0 exactly c4_len)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    width = -(-c4_len // INDEX_PAGE_SIZE)
    n_pages = rotations * batch * width
    flat = torch.randint(0, 256, (n_pages, INDEX_PAGE_BYTES), dtype=torch.uint8, device=device, generator=gen)
    flat[:, :INDEX_SCALE_OFFSET] &= 0xBF  # e4m3 with |x| < 2: no NaN codes
    scales = torch.rand(n_pages, INDEX_PAGE_SIZE, device=device, generator=gen) + 0.5
    flat[:, INDEX_SCALE_OFFSET:] = scales.view(torch.uint8)
    kv = flat.view(n_pages, INDEX_PAGE_SIZE, 1, 132)
    q = (torch.randint(0, 256, (batch, 1, 64, 128), dtype=torch.uint8, device=device, generator=gen) & 0xBF
         ).view(ix.FP8)
    w = torch.randn(batch, 64, device=device, generator=gen) * 0.1
    perm = torch.randperm(n_pages, device=device, generator=gen).int()
    tables = [perm[r * batch * width:(r + 1) * batch * width].view(batch, width).contiguous() for r in range(rotations)]
    lens = c4_len - torch.randint(0, INDEX_PAGE_SIZE, (batch,), device=device, generator=gen).int()
    lens[0] = c4_len
    return q, kv, w, lens.int(), tables


def masked_scores(scores, lens):
    """``scores`` [B, width] with the positions at or past each row's length set to -inf."""
    width = scores.shape[1]
    return scores.masked_fill(torch.arange(width, device=scores.device)[None, :] >= lens[:, None].long(),
                              float("-inf"))


def selection_tolerance(masked):
    """[B, 1]: how far from the k-th value a score may lie and still count as tied (1e-4 of the row's largest
    |score|)."""
    return 1e-4 * masked.clamp(min=-1e30).abs().amax(dim=1, keepdim=True)


def check_selection(slots_raw, ref, lens, k=INDEX_TOPK):
    """(violations, overlap with the exact top-k): a violation is a selected position scoring below
    the exact k-th by more than rounding, an unselected one above it, or a wrong -1 padding."""
    batch, width = ref.shape
    counts = lens.long().clamp(max=width).clamp(max=k)
    j = torch.arange(k, device=ref.device)
    pad_bad = ((slots_raw >= 0) != (j[None, :] < counts[:, None])).sum().item()
    masked = masked_scores(ref, lens)
    top = torch.topk(masked, min(k, width), dim=1)
    kth = top.values[:, -1:]
    tol = selection_tolerance(masked)
    picked = torch.gather(masked, 1, slots_raw.long().clamp(min=0, max=width - 1))  # (a wrong selection may leave junk)
    valid = slots_raw >= 0
    below = (valid & (picked < kth - tol)).sum().item()
    above_all = (masked > kth + tol).sum(dim=1)
    above_picked = (valid & (picked > kth + tol)).sum(dim=1)
    missed = (above_all - above_picked).clamp(min=0).sum().item()
    exact = torch.zeros_like(masked, dtype=torch.bool).scatter_(1, top.indices, True) & torch.isfinite(masked)
    hit = torch.gather(exact, 1, slots_raw.long().clamp(min=0, max=width - 1)) & valid
    overlap = hit.sum().item() / max(int(valid.sum().item()), 1)
    return int(pad_bad + below + missed), round(overlap, 5)


def page_max_candidates(ref, lens, batch, c4_len, k=INDEX_TOPK):
    """(min, mean, max) over rows of the logits at or above the page-max bound (the top 16 key bits of the k-th
    largest group maximum, as the logits kernel's page-max form groups them), from the float32 reference."""
    programs = ix.choose_plan(batch, c4_len).select.overlap_programs  # the default plan's grid
    consts = ix.page_max_consts(batch, c4_len, programs)
    pps = ix.logits_pages_per_split(batch, c4_len, programs)
    splits = -(-(-(-c4_len // INDEX_PAGE_SIZE)) // pps)
    groups = consts["GROUPS"]
    padded = torch.nn.functional.pad(ref, (0, splits * pps * INDEX_PAGE_SIZE - c4_len), value=float("-inf"))
    group_max = padded.view(batch, splits, pps, INDEX_PAGE_SIZE).amax(2).view(batch, splits * groups, -1).amax(2)

    def signed(x):
        bits = (x + 0.0).contiguous().view(torch.int32).long()
        return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)

    if splits * groups < k:
        bound = torch.full((batch,), -2**31, dtype=torch.long, device=ref.device)
    else:
        kth = signed(group_max).sort(dim=1, descending=True).values[:, k - 1]
        bound = ((kth + 2**31) >> 16 << 16) - 2**31
    live = torch.arange(c4_len, device=ref.device)[None, :] < lens[:, None].long()
    counts = (live & (signed(ref) >= bound[:, None])).sum(1).float()
    return [int(counts.min()), round(float(counts.mean()), 1), int(counts.max())]


def timer(smoke, rotations):
    """Microseconds per call of ``fn``, which makes ``rotations`` calls (one per page table)."""
    if smoke:
        def wall(fn):
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e6 / rotations
        return wall
    from sglang_sm120.kernels.harness.devicebench import time_in_cuda_graph

    return lambda fn: time_in_cuda_graph(fn, calls_per_graph=1, replays=20) / rotations


def run_shape(result, batch, ctx, device, up_logits, timeit, copy_gbs, extra=False, rotations=ROTATIONS):
    started = time.perf_counter()
    c4_len = ctx // C4_RATIO
    q, kv, w, lens, tables = build(batch, c4_len, device, rotations)
    pages_read = torch.div(lens.long() + INDEX_PAGE_SIZE - 1, INDEX_PAGE_SIZE, rounding_mode="floor").sum().item()
    kbytes = pages_read * INDEX_PAGE_BYTES
    base = dict(B=batch, context=ctx, c4_len=c4_len, index_k_MB=round(kbytes / 1e6, 2))
    note = "extra shape" if extra else ""
    result.extra.setdefault("default_plan_form", {})[f"B={batch} ctx={ctx}"] = dataclasses.asdict(
        ix.choose_plan(batch, c4_len).select)

    # Correctness on the first rotation: float32 reference, both paths.
    pt = tables[0]
    ref = ix.reference_paged_mqa_logits(q, kv, w, lens, pt, c4_len)
    logits = ix.paged_mqa_logits(q, kv, w, lens, pt, c4_len)
    err = ix_relative_error(logits, ref)
    n_cand = page_max_candidates(ref, lens, batch, c4_len)
    result.extra.setdefault("page_max_candidates (per row: min/mean/max)", {})[f"B={batch} ctx={ctx}"] = n_cand
    checks = {}
    out = torch.empty(batch, INDEX_TOPK, dtype=torch.int32, device=device)
    raw = torch.empty_like(out)
    calls = {f"ours_topk_only_{name}": lambda o, r, f=SELECT_FORMS[name]: ix.topk_transform_paged(
        logits, lens, pt, o, INDEX_PAGE_SIZE, r, select=f) for name in TOPK_ONLY_FORMS if name in SELECT_FORMS}
    variant_of = {name: "shipped" for name in calls}
    for variant in VARIANTS:
        calls[variant_name("default_plan", variant)] = lambda o, r: ix.indexer_topk(q, kv, w, lens, pt, c4_len, o, r)
        with use_variant(variant):
            result.extra.setdefault("plan_by_variant", {})[f"B={batch} ctx={ctx} {variant}"] = str(
                ix.choose_plan(batch, c4_len).select)
        for name, form in SELECT_FORMS.items():  # the full indexer call (hist: histogram counted by the logits kernel)
            calls[variant_name(two_kernel_name(name), variant)] = lambda o, r, f=form: ix.indexer_topk(
                q, kv, w, lens, pt, c4_len, o, r, plan=ix.Plan("two_kernel", select=f))
        variant_of.update({name: variant for name in calls if name not in variant_of})
    for name, call in calls.items():
        try:
            raw.fill_(12345)
            with use_variant(variant_of[name]):
                for _ in range(2):  # twice: the workspace must be left clean by the first call
                    call(out, raw)
            checks[name] = check_selection(raw, ref, lens)
        except Exception as exc:
            traceback.print_exc()
            checks[name] = (f"failed: {type(exc).__name__}", "")
    for name, (split, form) in FUSED_VARIANTS.items():
        try:
            raw.fill_(12345)
            ix.fused_logits_topk(q, kv, w, lens, pt, c4_len, out, raw, split_pages=split, select=SELECT_FORMS[form])
            checks[name] = check_selection(raw, ref, lens)
        except Exception as exc:
            traceback.print_exc()
            checks[name] = (f"failed: {type(exc).__name__}", "")
    del logits

    def loop(call):
        def fn():
            for table in tables:
                call(table)
        return fn

    outs = torch.empty(batch, INDEX_TOPK, dtype=torch.int32, device=device)
    timings = {}
    if up_logits is not None:
        try:
            timings["upstream_logits"] = timeit(loop(lambda t: up_logits(q, kv, w, lens, t, None, c4_len, False)))
            up_scores = up_logits(q, kv, w, lens, tables[0], None, c4_len, False)
            timings["upstream_topk"] = timeit(loop(lambda t: torch.topk(up_scores, min(INDEX_TOPK, c4_len), dim=1)))
            del up_scores
        except Exception as exc:  # keep our numbers even if the baseline cannot run this shape
            note = (note + "; " if note else "") + f"upstream failed: {type(exc).__name__}: {str(exc)[:120]}"
            traceback.print_exc()
    logits_buf = torch.empty(batch, c4_len, dtype=torch.float32, device=device)
    ix.paged_mqa_logits(q, kv, w, lens, tables[0], c4_len, out=logits_buf)

    def timed(variant, fn):
        try:
            timings[variant] = timeit(fn)
        except Exception as exc:  # one variant failing keeps the others' numbers
            traceback.print_exc()
            errors[variant] = f"{type(exc).__name__}: {str(exc)[:120]}"

    errors = {}
    timed("ours_logits_only", loop(lambda t: ix.paged_mqa_logits(q, kv, w, lens, t, c4_len, out=logits_buf)))
    for variant in VARIANTS:
        with use_variant(variant):
            timed(variant_name("ours_logits_with_hist", variant), loop(lambda t: ix.paged_mqa_logits(
                q, kv, w, lens, t, c4_len, out=logits_buf, hist_workspace=ix.hist_workspace(batch, device))))
            ix.hist_workspace(batch, device).zero_()  # the logits-only calls leave the reduced counters behind
            if "hist_pmax" in SELECT_FORMS:  # the page-max form's logits kernel: page maxima and the bound, no count
                timed(variant_name("ours_logits_with_pmax", variant), loop(lambda t: ix.paged_mqa_logits(
                    q, kv, w, lens, t, c4_len, out=logits_buf, hist_workspace=ix.hist_workspace(batch, device),
                    page_max=True)))
                ix.hist_workspace(batch, device).zero_()
    timed("ours_topk_only_default", loop(lambda t: ix.topk_transform_paged(logits_buf, lens, t, outs, INDEX_PAGE_SIZE)))
    for name, form in SELECT_FORMS.items():
        if name in TOPK_ONLY_FORMS:
            timed(f"ours_topk_only_{name}", loop(lambda t, f=form: ix.topk_transform_paged(
                logits_buf, lens, t, outs, INDEX_PAGE_SIZE, select=f)))
    for variant in VARIANTS:
        with use_variant(variant):
            timed(variant_name("default_plan", variant), loop(lambda t: ix.indexer_topk(q, kv, w, lens, t, c4_len, outs)))
            for name, form in SELECT_FORMS.items():
                timed(variant_name(two_kernel_name(name), variant), loop(lambda t, f=form: ix.indexer_topk(
                    q, kv, w, lens, t, c4_len, outs, plan=ix.Plan("two_kernel", select=f))))
    for name, (split, form) in FUSED_VARIANTS.items():
        timed(name, loop(lambda t, s=split, f=SELECT_FORMS[form]: ix.fused_logits_topk(
            q, kv, w, lens, t, c4_len, outs, split_pages=s, select=f)))
    after = {}
    hist_forms = [variant_name(two_kernel_name(name), variant) for variant in VARIANTS
                  for name, form in SELECT_FORMS.items() if form.method == "histogram"]
    for name in hist_forms:  # after hundreds of timed calls the shared workspace must still be clean
        try:
            raw.fill_(12345)
            with use_variant(variant_of[name]):
                calls[name](out, raw)
            after[name] = check_selection(raw, ref, lens)[0]
        except Exception as exc:
            traceback.print_exc()
            after[name] = f"failed: {type(exc).__name__}"
    note = (note + "; " if note else "") + f"hist forms after timing, violations: {after}"
    up_total = timings.get("upstream_logits", 0) + timings.get("upstream_topk", 0) if up_logits else None
    for variant, us in timings.items():
        row = dict(base, variant=variant, us=round(us, 2), note=note)
        if variant.startswith(("two_kernel", "fused", "default_plan", "ours_logits")):
            gbs = kbytes / (us * 1e-6) / 1e9
            row.update(read_GBps=round(gbs, 1), pct_copy_bw=round(100 * gbs / copy_gbs, 1) if copy_gbs else "")
        if variant in checks:
            row.update(sel_violations=checks[variant][0], exact_overlap=checks[variant][1])
        if variant.startswith(("two_kernel", "fused", "default_plan")):
            if up_total:
                row["vs_upstream"] = round(up_total / us, 2)
        if variant == "ours_logits_only":
            row["logits_rel_err"] = f"{err:.2e}"
        result.add(**row)
    for variant, why in errors.items():
        result.add(**dict(base, variant=variant, note=f"failed: {why}"))
    ours = {v: t for v, t in timings.items() if v.startswith(("two_kernel", "fused", "default_plan"))
            and checks.get(v, (1,))[0] == 0}
    if ours:
        best = min(ours, key=ours.get)
        result.extra.setdefault("best_variant", {})[f"B={batch} ctx={ctx}"] = f"{best} {ours[best]:.1f} us"
    print(f"B={batch} ctx={ctx}: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items())
          + f" | err {err:.1e} | checks {checks} | after {after} | {time.perf_counter() - started:.1f} s", flush=True)
    del q, kv, w, tables, logits_buf, ref
    if device == "cuda":
        torch.cuda.empty_cache()


def two_kernel_name(form_name):
    return "two_kernel" if form_name == "r1" else f"two_kernel_{form_name}"


def ix_relative_error(actual, expected):
    finite = torch.isfinite(expected)
    if not torch.equal(finite, torch.isfinite(actual)):
        return float("inf")
    a, e = actual[finite].double(), expected[finite].double()
    return ((a - e).norm() / e.norm().clamp(min=1e-30)).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prepare", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--name", default="indexer-h200-run14", help="result file stem (run 4 was the select-form sweep)")
    parser.add_argument("--forms", default="hist", help=f"comma-separated select forms forced beside the default "
                        f"(two_kernel_<form> rows), from {sorted(FORM_CATALOG)}")
    parser.add_argument("--shapes", help="comma-separated BxCONTEXT (e.g. 1x65536,64x262144) instead of the full grid")
    parser.add_argument("--skip-upstream", action="store_true", help="time only ours (upstream timed in runs 1-5)")
    parser.add_argument("--no-topk-only", action="store_true", help="skip the top-k-alone timings")
    parser.add_argument("--topk-only", help="comma-separated --forms also timed alone on a given logits row "
                        "(ours_topk_only_<form> rows; default: hist)")
    parser.add_argument("--variants", default="shipped", help=f"comma-separated launch-flag variants timed "
                        f"(default_plan[<variant>] rows), from shipped, {sorted(VARIANT_CATALOG)}")
    args = parser.parse_args()
    unknown = [name for name in args.forms.split(",") if name not in FORM_CATALOG]
    if unknown:
        parser.error(f"unknown --forms {unknown}; choose from {sorted(FORM_CATALOG)}")
    unknown = [name for name in args.variants.split(",") if name != "shipped" and name not in VARIANT_CATALOG]
    if unknown:
        parser.error(f"unknown --variants {unknown}; choose from shipped, {sorted(VARIANT_CATALOG)}")
    VARIANTS[:] = args.variants.split(",")
    SELECT_FORMS.clear()
    SELECT_FORMS.update({name: FORM_CATALOG[name] for name in args.forms.split(",")})
    if args.topk_only:
        TOPK_ONLY_FORMS[:] = args.topk_only.split(",")
    if args.no_topk_only:
        TOPK_ONLY_FORMS[:] = []
    if args.prepare:
        prepare()
        return
    from sglang_sm120.kernels.harness.devicebench import BenchResult, copy_bandwidth_gbs

    device = "cpu" if args.smoke else "cuda"
    result = BenchResult(args.name, "Lightning indexer: logits + top-512 (ours vs upstream torch path)", COLUMNS)
    up_logits = None
    try:
        if args.skip_upstream:
            raise RuntimeError("skipped (--skip-upstream)")
        import upstream

        up_logits = upstream.load(UPSTREAM_FILE).fp8_paged_mqa_logits_torch_sm120
    except BaseException as exc:  # SystemExit when .upstream was not carried
        result.notes.append(f"upstream baseline unavailable: {exc}")
    copy_gbs = None if args.smoke else copy_bandwidth_gbs()
    result.extra["copy_bandwidth_GBps (read+write)"] = round(copy_gbs, 1) if copy_gbs else "n/a"
    result.extra["scaled_dot (block-scaled fp8 MMA)"] = ix.use_scaled_dot(device)
    result.extra["select_forms"] = {name: dataclasses.asdict(form) for name, form in SELECT_FORMS.items()}
    shipped = ("HIST_COPIES", "USE_PDL", "PDL_MAX_BATCH", "HIST_ONE_SHOT_MAX_PAGES", "HIST_LONG_REDUCE", "HIST_ONE_BLOCK_MAX_PROGRAMS",
               "HIST_SELECT_8_WARPS_MAX_PROGRAMS", "HIST_SPLIT_MAX_CHUNK", "HIST_SPLIT_SMALL_MAX_PROGRAMS", "PAGE_MAX_KEYS",
               "PAGE_MAX_OVERLAP_PROGRAMS")
    result.extra["variants"] = {
        name: ({attr: getattr(ix, attr) for attr in shipped} if name == "shipped" else
               {attr: ("modified plan table" if attr == "PLAN_TABLE" else repr(value) if callable(value) else value)
                for attr, value in VARIANT_CATALOG[name].items()})
        for name in VARIANTS}
    result.extra["pdl_supported (cc >= 9.0)"] = False if args.smoke else ix.pdl_supported(torch.device("cuda"))
    result.extra["fused_variants (split pages, select form)"] = FUSED_VARIANTS
    result.extra["default_plan"] = "ix.indexer_topk with choose_plan (the PLAN_TABLE this run started with)"
    result.extra["timing"] = (f"one CUDA graph of {ROTATIONS} calls, each over its own pages, replayed after an L2 "
                              f"flush; us = graph time / {ROTATIONS}; read_GBps = index-K bytes of the live pages / us")
    rotations = 2 if args.smoke else ROTATIONS
    timeit = timer(args.smoke, rotations)
    shapes = [(1, 2560), (2, 4400)] if args.smoke else SHAPES
    extra = [] if args.smoke else EXTRA_SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in item.split("x")) for item in args.shapes.split(",")]
        extra = []
    for i, (batch, ctx) in enumerate(shapes + extra):
        try:
            run_shape(result, batch, ctx, device, up_logits, timeit, copy_gbs, extra=i >= len(shapes),
                      rotations=rotations)
        except Exception as exc:
            traceback.print_exc()
            result.add(B=batch, context=ctx, variant="ERROR", note=f"{type(exc).__name__}: {str(exc)[:200]}")
        result.write(args.out)
    path = result.write(args.out)
    print(result.markdown())
    print("wrote", path)


if __name__ == "__main__":
    main()
