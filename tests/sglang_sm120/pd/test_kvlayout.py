"""The DSv4 pool geometry and NIXL descriptors equal what SGLang 0.5.23's own code produces.

Upstream functions are called (never copied): ``repeat_indices_over_layers``,
``NixlKVManager._pack_stride_descs / _expand_stride_descs / _prep_equal_tp_dlist /
_send_kvcache_generic / send_aux`` (methods called on a stand-in ``self`` whose NIXL agent records
the arrays it is handed), ``group_concurrent_contiguous``, ``KVLayout.V4.page_bytes``.
"""

import types

import numpy as np
import pytest

from sglang_sm120.kernels import dsv4
from sglang_sm120.pd import kvlayout

conn = pytest.importorskip("sglang.srt.disaggregation.nixl.conn", reason="SGLang 0.5.23 is a test dependency")
from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout  # noqa: E402
from sglang.srt.disaggregation.common.utils import group_concurrent_contiguous  # noqa: E402
from sglang.srt.mem_cache.deepseek_v4_memory_pool import get_dsv4_indexer_bytes_per_token  # noqa: E402

Manager = conn.NixlKVManager


class RecordingAgent:
    """What the connector's methods call on ``self.agent``; keeps the descriptor arrays."""

    def __init__(self):
        self.descs, self.prepped = [], []

    def get_xfer_descs(self, descs, mem_kind):
        self.descs.append((np.asarray(descs, dtype=np.uint64).reshape(-1, 3), mem_kind))
        return len(self.descs) - 1

    def initialize_xfer(self, op, src, dst, peer):
        assert op == "WRITE"
        return ("xfer", src, dst, peer)

    def transfer(self, handle):
        return "PROC"


def stand_in_self(**attrs):
    fake = types.SimpleNamespace(agent=RecordingAgent(), prep_handles={}, is_mla_backend=True, pp_size=1,
                                 kv_args=types.SimpleNamespace(gpu_id=3, kv_data_ptrs=[]), **attrs)
    fake._post_xfer = lambda handle, msg: None
    fake._pack_stride_descs = Manager._pack_stride_descs
    fake._prep_xfer_dlist = lambda peer, descs, mem_kind: (peer, descs, mem_kind)
    return fake


POOLS = kvlayout.dsv4_pools(range(dsv4.NUM_LAYERS), num_full_pages=40, num_swa_pages=9)


def test_region_geometry_matches_sglang():
    assert KVLayout.V4.page_bytes(dsv4.SWA_PAGE_SIZE) == dsv4.kv_page_bytes(dsv4.SWA_PAGE_SIZE) == 149760
    for ratio in (dsv4.C4_RATIO, dsv4.C128_RATIO):
        assert KVLayout.V4.page_bytes(256 // ratio) == dsv4.kv_page_bytes(256 // ratio)
    assert get_dsv4_indexer_bytes_per_token(dsv4.INDEX_HEAD_DIM, False) == dsv4.INDEX_TOKEN_BYTES
    names = [r.name for r in POOLS.kv]
    # SGLang's registration order: [C4 KV, C4 indexer, C128 KV]
    c4 = [i for i in range(dsv4.NUM_LAYERS) if dsv4.layer_compress_ratio(i) == 4]
    c128 = [i for i in range(dsv4.NUM_LAYERS) if dsv4.layer_compress_ratio(i) == 128]
    assert names == [f"c4_kv.L{i}" for i in c4] + [f"c4_indexer.L{i}" for i in c4] + [f"c128_kv.L{i}" for i in c128]
    assert len(c4) == 21 and len(c128) == 20 and len(POOLS.swa) == dsv4.NUM_LAYERS
    assert {r.item_len for r in POOLS.kv} == {37440, 64 * 132, 1728}


@pytest.mark.parametrize("mem_kind,gpu", [("VRAM", 3), ("DRAM", 0)])
@pytest.mark.parametrize("xfer_shorter", [False, True])
def test_prepared_runs_equal_upstream(mem_kind, gpu, xfer_shorter):
    rng = np.random.default_rng(0)
    bases = (rng.integers(1, 2**40, len(POOLS.kv)) * 256).tolist()
    lens = [r.item_len for r in POOLS.kv]
    xfer = [n - 64 for n in lens] if xfer_shorter else None
    peer, upstream, kind = Manager._prep_equal_tp_dlist(
        stand_in_self(), "peer", bases, lens, [r.nbytes for r in POOLS.kv], gpu, num_slots=POOLS.num_kv_slots,
        mem_kind=mem_kind, kv_xfer_lens=xfer)
    ours = kvlayout.prepared_runs(bases, POOLS.kv, POOLS.num_kv_slots, kvlayout.nixl_device_id(mem_kind, gpu), xfer)
    assert (peer, kind) == ("peer", mem_kind)
    assert ours.dtype == upstream.dtype == np.uint64
    np.testing.assert_array_equal(ours, upstream)
    np.testing.assert_array_equal(kvlayout.expand_runs(ours), Manager._expand_stride_descs(upstream))
    assert conn.num_kv_slots([r.nbytes for r in POOLS.kv], lens) == POOLS.num_kv_slots


def test_prepared_indices_equal_upstream():
    pages = np.array([17, 3, 30, 4, 5], dtype=np.int32)
    np.testing.assert_array_equal(kvlayout.prepared_indices(pages, len(POOLS.kv), POOLS.num_kv_slots),
                                  conn.repeat_indices_over_layers(pages, len(POOLS.kv), POOLS.num_kv_slots))


@pytest.mark.parametrize("src,dst", [
    ([0, 1, 2, 3], [7, 8, 9, 10]),  # one run
    ([0, 1, 2, 3], [7, 2, 9, 10]),  # decode pages scattered
    ([5], [0]),
    ([], []),
    ([3, 4, 9, 10, 11], [20, 21, 22, 23, 1]),
])
def test_contiguous_runs_equal_upstream(src, dst):
    s, d = np.array(src, dtype=np.int32), np.array(dst, dtype=np.int32)
    assert kvlayout.contiguous_runs(s, d) == group_concurrent_contiguous(s, d)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flat_swa_descs_equal_upstream(seed):
    rng = np.random.default_rng(seed)
    n = len(POOLS.swa)
    src_bases = (rng.integers(1, 2**40, n) * 256).tolist()
    dst_bases = (rng.integers(1, 2**40, n) * 256).tolist()
    lens = [r.item_len for r in POOLS.swa]
    src_ids = np.sort(rng.choice(POOLS.swa[0].num_slots, 3, replace=False)).astype(np.int32)
    dst_ids = rng.choice(POOLS.swa[0].num_slots, 3, replace=False).astype(np.int32)
    fake = stand_in_self()
    Manager._send_kvcache_generic(
        fake, "peer", src_bases, dst_bases, lens, src_ids, dst_ids, dst_gpu_id=5, state_type=conn.StateType.SWA,
        src_mem_kind="VRAM", dst_mem_kind="VRAM", src_layer_ids=list(range(n)), dst_layer_ids=list(range(n)),
        dst_item_lens=lens)
    (up_src, kind_s), (up_dst, kind_d) = fake.agent.descs
    ours_src, ours_dst = kvlayout.flat_descs(src_bases, dst_bases, lens, src_ids, dst_ids, 3, 5)
    assert kind_s == kind_d == "VRAM"
    np.testing.assert_array_equal(ours_src, up_src)
    np.testing.assert_array_equal(ours_dst, up_dst)


def test_aux_descs_equal_upstream():
    fake = stand_in_self()
    fake.kv_args.aux_data_ptrs = [4096, 65536]
    fake.kv_args.aux_item_lens = [64, 8]
    Manager.send_aux(fake, "peer", 2, [1 << 20, 1 << 21], 5)
    (up_src, _), (up_dst, _) = fake.agent.descs
    src, dst = kvlayout.aux_descs([4096, 65536], [1 << 20, 1 << 21], [64, 8], 2, 5)
    np.testing.assert_array_equal(np.array(src, dtype=np.uint64), up_src)
    np.testing.assert_array_equal(np.array(dst, dtype=np.uint64), up_dst)


@pytest.mark.parametrize("kw", [dict(num_full_pages=0, num_swa_pages=1), dict(num_full_pages=1, num_swa_pages=0)])
def test_pool_sizes_must_be_positive(kw):
    with pytest.raises(ValueError, match="page/slot counts must be >= 1"):
        kvlayout.dsv4_pools([2, 3], **kw)


def test_prepared_runs_reject_mismatched_inputs():
    with pytest.raises(ValueError, match="differ in length"):
        kvlayout.prepared_runs([1], POOLS.kv, 4, 0)
    with pytest.raises(ValueError, match="exceeds item_len"):
        kvlayout.prepared_runs([1], POOLS.kv[:1], 4, 0, [POOLS.kv[0].item_len + 1])
