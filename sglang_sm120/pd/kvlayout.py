"""DSv4-Flash KV pools as the NIXL connector registers and addresses them, and its descriptors.

SGLang 0.5.23 (``srt/mem_cache/deepseek_v4_memory_pool.py``, V4 layout, separate-KV pools) hands
the NIXL connector two kinds of buffers:

- **KV data** (``get_contiguous_buf_infos``): per compressed layer, the compressed KV cache
  (V4 584-byte tokens, ``256 // ratio`` tokens per page, padded to a multiple of 576 bytes) and,
  on C4 layers, the indexer-K cache (64 tokens x 132 bytes per page); order [C4 KV, C4 indexer,
  C128 KV]. One item is one page; indices are full-page ids. Sent on the *prepared* path
  (``srt/disaggregation/nixl/conn.py`` ``_prep_equal_tp_dlist`` + ``make_prepped_xfer``).
- **SWA state** (``get_state_buf_infos``, ``StateType.SWA``): per layer, 256-token V4 pages of
  149760 bytes, indexed by SWA page ids. Sent on the *flat* path (``_send_kvcache_generic``:
  runs of consecutive pages merged by ``group_concurrent_contiguous``, one descriptor per run).
- **aux** (DRAM, ``send_aux``): one fixed-size item per request.

The builders below produce exactly the arrays those functions hand NIXL; the tests compare them
with SGLang's own helpers. Pure numpy: no torch, no SGLang, so the device script can use it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..kernels import dsv4


@dataclasses.dataclass(frozen=True)
class Region:
    """One registered buffer: ``num_slots`` items of ``item_len`` bytes."""

    name: str
    item_len: int
    num_slots: int

    @property
    def nbytes(self) -> int:
        return self.item_len * self.num_slots


@dataclasses.dataclass(frozen=True)
class Dsv4Pools:
    """The regions of one DSv4 server's KV pools (a subset of layers for tests)."""

    kv: tuple[Region, ...]  # prepared path, full-page ids
    swa: tuple[Region, ...]  # flat path, SWA page ids
    aux: tuple[Region, ...]  # DRAM, request slots

    @property
    def num_kv_slots(self) -> int:
        # upstream num_kv_slots(): every entry must expose the same count, so the shortest wins
        return min((r.num_slots for r in self.kv), default=0)

    def regions(self) -> tuple[Region, ...]:
        return self.kv + self.swa + self.aux

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.regions())


AUX_ITEM_BYTES = 64  # stand-in for the per-request metadata row (first token, logprobs...)


def dsv4_pools(layer_ids, num_full_pages: int, num_swa_pages: int, num_aux_slots: int = 4) -> Dsv4Pools:
    """The DSv4-Flash pools for ``layer_ids`` with ``num_full_pages`` 256-token pages of compressed
    caches and ``num_swa_pages`` SWA pages, ordered as SGLang registers them."""
    if num_full_pages < 1 or num_swa_pages < 1 or num_aux_slots < 1:
        raise ValueError(f"page/slot counts must be >= 1, got full={num_full_pages} swa={num_swa_pages} "
                         f"aux={num_aux_slots}")
    layer_ids = list(layer_ids)
    kv: list[Region] = []
    for ratio in (dsv4.C4_RATIO, dsv4.C128_RATIO):
        layers = [i for i in layer_ids if dsv4.layer_compress_ratio(i) == ratio]
        page_tokens = dsv4.SWA_PAGE_SIZE // ratio
        kv += [Region(f"c{ratio}_kv.L{i}", dsv4.kv_page_bytes(page_tokens), num_full_pages) for i in layers]
        if ratio == dsv4.C4_RATIO:
            kv += [Region(f"c4_indexer.L{i}", dsv4.INDEX_PAGE_SIZE * dsv4.INDEX_TOKEN_BYTES, num_full_pages)
                   for i in layers]
    swa = tuple(Region(f"swa.L{i}", dsv4.kv_page_bytes(dsv4.SWA_PAGE_SIZE), num_swa_pages) for i in layer_ids)
    aux = (Region("aux.metadata", AUX_ITEM_BYTES, num_aux_slots),)
    return Dsv4Pools(tuple(kv), swa, aux)


# --- descriptors, as srt/disaggregation/nixl/conn.py builds them ----------------------------------

def nixl_device_id(mem_kind: str, gpu_id: int) -> int:
    return gpu_id if mem_kind == "VRAM" else 0


def prepared_runs(bases, regions, num_slots: int, dev_id: int, xfer_lens=None) -> np.ndarray:
    """Nx5 uint64 (addr, len, dev_id, stride, count): one run per region, ``num_slots`` slots of
    ``xfer_len`` bytes ``item_len`` apart (``_prep_equal_tp_dlist`` + ``_pack_stride_descs``)."""
    if len(bases) != len(regions):
        raise ValueError(f"bases ({len(bases)}) and regions ({len(regions)}) differ in length")
    xfer_lens = xfer_lens or [r.item_len for r in regions]
    runs = []
    for base, region, xfer_len in zip(bases, regions, xfer_lens):
        if xfer_len > region.item_len:
            raise ValueError(f"xfer_len {xfer_len} exceeds item_len {region.item_len} of {region.name}")
        runs.append((base, xfer_len, dev_id, region.item_len, num_slots))
    return np.array(runs, dtype=np.uint64).reshape(-1, 5)


def expand_runs(runs: np.ndarray) -> np.ndarray:
    """Nx5 runs -> one (addr, len, dev_id) row per slot (``_expand_stride_descs``, for NIXL builds
    without strided descriptors)."""
    parts = []
    for addr, length, dev_id, stride, count in runs.tolist():
        out = np.empty((count, 3), dtype=np.uint64)
        out[:, 0] = addr + np.arange(count, dtype=np.uint64) * stride
        out[:, 1] = length
        out[:, 2] = dev_id
        parts.append(out)
    return np.concatenate(parts) if parts else np.empty((0, 3), dtype=np.uint64)


def prepared_indices(page_ids, num_regions: int, num_slots: int) -> np.ndarray:
    """Flat dlist indices of ``page_ids`` in every region (``repeat_indices_over_layers``)."""
    page_ids = np.asarray(page_ids, dtype=np.int32)
    offsets = np.arange(num_regions, dtype=np.int32) * num_slots
    return (offsets[:, None] + page_ids[None, :]).ravel().astype(np.int32)


def contiguous_runs(src_ids, dst_ids) -> tuple[list[list[int]], list[list[int]]]:
    """Split paired index lists where either side stops being consecutive
    (``group_concurrent_contiguous``)."""
    src_ids, dst_ids = np.asarray(src_ids), np.asarray(dst_ids)
    if src_ids.size == 0 or dst_ids.size == 0:
        return [], []
    if src_ids.size != dst_ids.size:
        raise ValueError(f"src and dst index lists differ in length: {src_ids.size} vs {dst_ids.size}")
    brk = np.where((np.diff(src_ids) != 1) | (np.diff(dst_ids) != 1))[0] + 1
    return [g.tolist() for g in np.split(src_ids, brk)], [g.tolist() for g in np.split(dst_ids, brk)]


def flat_descs(src_bases, dst_bases, item_lens, src_ids, dst_ids, src_dev: int, dst_dev: int):
    """(src Nx3, dst Nx3) uint64 for the flat path: per region, one descriptor per run of
    consecutive pages, regions in order (``_send_kvcache_generic``, MLA branch)."""
    src_groups, dst_groups = contiguous_runs(src_ids, dst_ids)
    if not src_groups:
        empty = np.empty((0, 3), dtype=np.uint64)
        return empty, empty
    src_starts = np.array([g[0] for g in src_groups], dtype=np.uint64)
    dst_starts = np.array([g[0] for g in dst_groups], dtype=np.uint64)
    lens = np.array([len(g) for g in src_groups], dtype=np.uint64)
    src_rows, dst_rows = [], []
    for sb, db, item_len in zip(src_bases, dst_bases, item_lens):
        item_len = np.uint64(item_len)
        src_rows.append(np.column_stack((np.uint64(sb) + src_starts * item_len, lens * item_len,
                                         np.full_like(lens, src_dev))))
        dst_rows.append(np.column_stack((np.uint64(db) + dst_starts * item_len, lens * item_len,
                                         np.full_like(lens, dst_dev))))
    return np.concatenate(src_rows), np.concatenate(dst_rows)


def aux_descs(src_bases, dst_bases, item_lens, src_slot: int, dst_slot: int):
    """(src, dst) lists of (addr, len, 0) for one request's aux rows (``send_aux``)."""
    src = [(b + n * src_slot, n, 0) for b, n in zip(src_bases, item_lens)]
    dst = [(b + n * dst_slot, n, 0) for b, n in zip(dst_bases, item_lens)]
    return src, dst
