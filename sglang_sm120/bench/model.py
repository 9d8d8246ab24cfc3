"""One DeepSeek-V4-Flash decoder layer of each kind with random weights in the checkpoint formats.

Everything here is plain torch (no Triton, no SGLang): the dimensions (full, or reduced for the
CPU interpreter), the per-rank shards of tensor parallelism T, the weights (FP8 e4m3 with 128x128
block scales for the dense linears, MXFP4 with E8M0 scales for the routed experts, bf16 where the
checkpoint keeps bf16) and the KV caches in the 584-byte V4 layout at a chosen context.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..kernels import dsv4

FP8 = torch.float8_e4m3fn
KINDS = ("swa", "c4", "c128")


@dataclasses.dataclass(frozen=True)
class Dims:
    """Model dimensions. ``full()`` is DSv4-Flash; ``reduced()`` keeps every layout the kernels
    fix (512-wide latent rows, 584-byte KV rows, 64 x 128 indexer heads, SWA window 128, page
    sizes) and shrinks the rest so the CPU interpreter finishes in minutes."""

    hidden: int
    heads: int
    q_lora: int
    o_groups: int
    o_rank: int
    experts: int
    top_k: int
    moe_inter: int
    shared_inter: int
    index_topk: int
    vocab: int
    head_dim: int = dsv4.HEAD_DIM
    kv_lora: int = dsv4.KV_LORA_RANK
    index_heads: int = dsv4.INDEX_N_HEADS
    index_head_dim: int = dsv4.INDEX_HEAD_DIM
    window: int = dsv4.SLIDING_WINDOW

    @classmethod
    def full(cls) -> "Dims":
        return cls(hidden=dsv4.HIDDEN_SIZE, heads=dsv4.NUM_HEADS, q_lora=dsv4.Q_LORA_RANK, o_groups=dsv4.O_GROUPS,
                   o_rank=dsv4.O_LORA_RANK, experts=dsv4.NUM_EXPERTS, top_k=dsv4.TOP_K,
                   moe_inter=dsv4.MOE_INTERMEDIATE_SIZE, shared_inter=dsv4.SHARED_EXPERT_INTERMEDIATE,
                   index_topk=dsv4.INDEX_TOPK, vocab=dsv4.VOCAB_SIZE)

    @classmethod
    def reduced(cls) -> "Dims":
        # 4 heads in 2 groups (2 heads per wo_a group), 16 experts of width 128, top-64 indexer; every
        # FP8 linear keeps K a multiple of 128 at T <= 2 (upstream's group quant needs whole groups)
        return cls(hidden=256, heads=4, q_lora=128, o_groups=2, o_rank=128, experts=16, top_k=dsv4.TOP_K,
                   moe_inter=128, shared_inter=256, index_topk=64, vocab=1024)

    @property
    def is_full(self) -> bool:
        return self == Dims.full()

    def rank(self, tp: int) -> "RankDims":
        for name, value in (("heads", self.heads), ("o_groups", self.o_groups), ("moe_inter", self.moe_inter),
                            ("shared_inter", self.shared_inter), ("vocab", self.vocab)):
            if value % tp:
                raise ValueError(f"T={tp} does not divide {name}={value}")
        return RankDims(self, tp)


@dataclasses.dataclass(frozen=True)
class RankDims:
    """What one rank of T holds: heads, wo_a groups, expert and shared-expert widths and the
    vocabulary are split; wqkv_a, the indexer, compressors and the router are replicated."""

    dims: Dims
    tp: int

    @property
    def heads(self) -> int:
        return self.dims.heads // self.tp

    @property
    def groups(self) -> int:
        return self.dims.o_groups // self.tp

    @property
    def group_width(self) -> int:  # D of wo_a: heads per group x 512
        return self.dims.heads // self.dims.o_groups * self.dims.head_dim

    @property
    def moe_inter(self) -> int:
        return self.dims.moe_inter // self.tp

    @property
    def shared_inter(self) -> int:
        return self.dims.shared_inter // self.tp

    @property
    def vocab(self) -> int:
        return self.dims.vocab // self.tp

    def dense_shapes(self) -> dict:
        """(out, in) of each FP8 block-scaled linear on this rank (``dsv4.dense_linear_shapes`` at full size)."""
        d = self.dims
        return {
            "wqkv_a": (d.q_lora + d.kv_lora, d.hidden),
            "wq_b": (self.heads * d.head_dim, d.q_lora),
            "wo_b": (d.hidden, self.groups * d.o_rank),
            "indexer_wq_b": (d.index_heads * d.index_head_dim, d.q_lora),
            "shared_gate_up": (2 * self.shared_inter, d.hidden),
            "shared_down": (d.hidden, self.shared_inter),
        }


# ------------------------------------------------------------------------------------------------
# random weights in the checkpoint formats


def _gen(device, seed):
    return torch.Generator(device=device).manual_seed(seed)


def fp8_block_weight(n: int, k: int, device, gen, groups: int | None = None):
    """e4m3 weight ``[(G,) n, k]`` with power-of-two 128x128 block scales (as UE8M0-style
    checkpoints have), sized so that ``x @ W.T`` of a unit-RMS ``x`` has RMS about 0.3."""
    shape = (n, k) if groups is None else (groups, n, k)
    w = (torch.randn(shape, device=device, generator=gen) * 2).clamp(-448, 448).to(FP8)
    sshape = (*shape[:-2], math.ceil(n / dsv4.FP8_BLOCK), math.ceil(k / dsv4.FP8_BLOCK))
    base = -round(math.log2(math.sqrt(k))) - 3
    s = torch.exp2(torch.randint(base - 1, base + 1, sshape, device=device, generator=gen).float())
    return w, s


def mxfp4_experts(experts: int, n: int, k: int, device, gen):
    """Packed e2m1 ``[E, n, k/2]`` (uint8, two values a byte) and E8M0 scale bytes ``[E, n, k/32]``."""
    packed = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, device=device, generator=gen)
    exp = dsv4.MXFP4_E8M0_BIAS - round(math.log2(math.sqrt(k))) - 3
    scale = torch.randint(exp - 1, exp + 1, (experts, n, k // dsv4.MXFP4_GROUP), dtype=torch.uint8, device=device,
                          generator=gen)
    return packed, scale


def bf16_weight(n: int, k: int, device, gen):
    return (torch.randn(n, k, device=device, generator=gen) * k ** -0.5).to(torch.bfloat16)


@dataclasses.dataclass
class Weights:
    """One rank's weights of a decoder layer (the dense part is the same for every layer kind;
    the compressors and the indexer are what C4/C128 layers add)."""

    rank: RankDims
    dense: dict  # name -> (e4m3 weight, fp32 block scales)
    wo_a: tuple  # (e4m3 [G, R, D], fp32 [G, R/128, D/128])
    norms: dict  # name -> bf16 weight
    gate: torch.Tensor  # router [E, hidden] bf16
    gate_bias: torch.Tensor  # e_score_correction_bias [E] fp32
    attn_sink: torch.Tensor  # [heads] fp32
    compressor: dict  # kind -> bf16 wkv_gate
    index_compressor: torch.Tensor
    weights_proj: torch.Tensor
    w13: torch.Tensor  # checkpoint layout [E, 2I, H/2]: rows [gate; up]
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    lm_head: torch.Tensor  # [vocab / T, hidden] bf16


def build_weights(rank: RankDims, device, seed: int = 0) -> Weights:
    d = rank.dims
    gen = _gen(device, seed)
    dense = {name: fp8_block_weight(n, k, device, gen) for name, (n, k) in rank.dense_shapes().items()}
    wo_a = fp8_block_weight(d.o_rank, rank.group_width, device, gen, groups=rank.groups)
    w13, w13_scale = mxfp4_experts(d.experts, 2 * rank.moe_inter, d.hidden, device, gen)
    w2, w2_scale = mxfp4_experts(d.experts, d.hidden, rank.moe_inter, device, gen)
    return Weights(
        rank=rank, dense=dense, wo_a=wo_a,
        norms={"attn": 1 + 0.1 * torch.randn(d.hidden, device=device, generator=gen).to(torch.bfloat16),
               "q": 1 + 0.1 * torch.randn(d.q_lora, device=device, generator=gen).to(torch.bfloat16),
               "ffn": 1 + 0.1 * torch.randn(d.hidden, device=device, generator=gen).to(torch.bfloat16)},
        gate=bf16_weight(d.experts, d.hidden, device, gen),
        gate_bias=0.01 * torch.randn(d.experts, device=device, generator=gen),
        attn_sink=torch.randn(rank.heads, device=device, generator=gen),
        compressor={kind: bf16_weight(dsv4.COMPRESSOR_OUT[dsv4.LAYER_KIND_RATIO[kind]], d.hidden, device, gen)
                    for kind in ("c4", "c128")},
        index_compressor=bf16_weight(dsv4.INDEX_COMPRESSOR_OUT, d.hidden, device, gen),
        weights_proj=bf16_weight(d.index_heads, d.hidden, device, gen),
        w13=w13, w13_scale=w13_scale, w2=w2, w2_scale=w2_scale,
        lm_head=bf16_weight(rank.vocab, d.hidden, device, gen))


# ------------------------------------------------------------------------------------------------
# KV caches at a context length (V4 layout, 584 bytes per token, one page table per request)


def _v4_cache(pages: int, page_size: int, device, gen):
    """``[pages, page_size, 1, 584]`` uint8 view of padded V4 pages with valid random rows: FP8
    nope without NaN codes, bf16 rope ~ N(0, 1), UE8M0 scales near 2^0."""
    page_bytes = dsv4.kv_page_bytes(page_size)
    flat = torch.randint(0, 256, (pages, page_bytes), dtype=torch.uint8, device=device, generator=gen)
    data = flat[:, :page_size * dsv4.KV_DATA_BYTES].view(pages, page_size, dsv4.KV_DATA_BYTES)
    data[..., :dsv4.NOPE_DIM] &= 0xBF  # |x| < 2 and no NaN code
    rope = torch.randn(pages, page_size, dsv4.ROPE_DIM, device=device, generator=gen).to(torch.bfloat16)
    data[..., dsv4.NOPE_DIM:] = rope.view(torch.uint8).view(pages, page_size, 2 * dsv4.ROPE_DIM)
    scales = flat[:, page_size * dsv4.KV_DATA_BYTES:page_size * dsv4.KV_TOKEN_BYTES]
    scales.copy_(torch.randint(dsv4.E8M0_BIAS - 2, dsv4.E8M0_BIAS + 1, scales.shape, dtype=torch.uint8,
                               device=device, generator=gen))
    return torch.as_strided(flat, (pages, page_size, 1, dsv4.KV_TOKEN_BYTES),
                            (page_bytes, dsv4.KV_TOKEN_BYTES, dsv4.KV_TOKEN_BYTES, 1))


def _page_table(batch: int, pages_each: int, device, gen):
    perm = torch.randperm(batch * pages_each, device=device, generator=gen).to(torch.int32)
    return perm.view(batch, pages_each).contiguous()


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclasses.dataclass
class Caches:
    """What a decode step at ``context`` reads: the SWA window rows, and for C4 the compressed
    KV pool plus the indexer's K cache (sharing one page table, as SGLang's pools do), for C128
    the compressed pool with every block of each request listed."""

    kind: str
    batch: int
    context: int
    swa: torch.Tensor
    swa_indices: torch.Tensor  # [B, 1, 128] int32 token slots
    swa_lengths: torch.Tensor  # [B] int32
    extra: torch.Tensor | None = None
    extra_indices: torch.Tensor | None = None  # C128: [B, 1, ceil(len/64)*64]; C4: written by the indexer
    extra_lengths: torch.Tensor | None = None
    index_k: torch.Tensor | None = None  # [pages, 64, 1, 132] uint8
    page_table: torch.Tensor | None = None  # [B, pages] int32 (C4 KV pool and index-K pages)
    index_lengths: torch.Tensor | None = None  # C4: [B] int32 compressed lengths the indexer scores
    compressed_len: int = 0

    def kv_rows_read(self, index_topk: int) -> int:
        """KV rows (584 bytes each) attention must read: the live window plus the extra cache's
        candidates (C4: the top-k, C128: every block)."""
        rows = int(self.swa_lengths.sum())
        if self.kind == "c4":
            rows += self.batch * min(index_topk, self.compressed_len)
        elif self.kind == "c128":
            rows += self.batch * self.compressed_len
        return rows

    def index_k_bytes(self) -> int:
        if self.kind != "c4":
            return 0
        return self.batch * -(-self.compressed_len // dsv4.INDEX_PAGE_SIZE) * dsv4.INDEX_PAGE_BYTES


def build_caches(kind: str, dims: Dims, batch: int, context: int, device, seed: int = 1) -> Caches:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    gen = _gen(device, seed)
    window = min(dims.window, context)
    # each request's window in its own SWA page, at a random rotation (slots are page*256 + offset)
    swa = _v4_cache(batch, dsv4.SWA_PAGE_SIZE, device, gen)
    offsets = torch.randint(0, dsv4.SWA_PAGE_SIZE, (batch, 1), device=device, generator=gen)
    rows = (offsets + torch.arange(dims.window, device=device)) % dsv4.SWA_PAGE_SIZE
    slots = torch.arange(batch, device=device)[:, None] * dsv4.SWA_PAGE_SIZE + rows
    live = torch.arange(dims.window, device=device)[None, :] < window
    swa_indices = torch.where(live, slots, -1).to(torch.int32).view(batch, 1, dims.window).contiguous()
    caches = Caches(kind, batch, context, swa, swa_indices,
                    torch.full((batch,), window, dtype=torch.int32, device=device))
    if kind == "c4":
        n = context // dsv4.C4_RATIO
        pages_each = max(1, -(-n // dsv4.C4_PAGE_SIZE))
        caches.compressed_len = n
        caches.page_table = _page_table(batch, pages_each, device, gen)
        caches.extra = _v4_cache(batch * pages_each, dsv4.C4_PAGE_SIZE, device, gen)
        caches.index_k = _index_k_cache(batch * pages_each, device, gen)
        caches.index_lengths = torch.full((batch,), n, dtype=torch.int32, device=device)
        caches.extra_indices = torch.full((batch, 1, dims.index_topk), -1, dtype=torch.int32, device=device)
        caches.extra_lengths = torch.full((batch,), min(n, dims.index_topk), dtype=torch.int32, device=device)
    elif kind == "c128":
        n = context // dsv4.C128_RATIO
        pages_each = max(1, -(-n // dsv4.C128_PAGE_SIZE))
        caches.compressed_len = n
        table = _page_table(batch, pages_each, device, gen).long()
        pos = torch.arange(_round_up(max(n, 1), 64), device=device)
        slots = table.gather(1, (pos // dsv4.C128_PAGE_SIZE).clamp(max=pages_each - 1).expand(batch, -1))
        slots = slots * dsv4.C128_PAGE_SIZE + pos % dsv4.C128_PAGE_SIZE
        caches.extra = _v4_cache(batch * pages_each, dsv4.C128_PAGE_SIZE, device, gen)
        caches.extra_indices = torch.where(pos < n, slots, -1).to(torch.int32).unsqueeze(1).contiguous()
        caches.extra_lengths = torch.full((batch,), n, dtype=torch.int32, device=device)
    return caches


def _index_k_cache(pages: int, device, gen):
    """Index-K pages ``[pages, 64, 1, 132]``: 64 rows of 128 fp8 bytes, then 64 fp32 scales."""
    flat = torch.randint(0, 256, (pages, dsv4.INDEX_PAGE_BYTES), dtype=torch.uint8, device=device, generator=gen)
    flat[:, :dsv4.INDEX_SCALE_OFFSET] &= 0xBF
    scales = torch.rand(pages, dsv4.INDEX_PAGE_SIZE, device=device, generator=gen) + 0.5
    flat[:, dsv4.INDEX_SCALE_OFFSET:] = scales.view(torch.uint8)
    return flat.view(pages, dsv4.INDEX_PAGE_SIZE, 1, dsv4.INDEX_TOKEN_BYTES)


# ------------------------------------------------------------------------------------------------
# bytes each piece must read (per rank, the checkpoint formats: FP8 + block scales, MXFP4 + E8M0)


def fp8_linear_bytes(n: int, k: int, rows: int, groups: int = 1) -> int:
    weight = groups * (n * k + math.ceil(n / dsv4.FP8_BLOCK) * math.ceil(k / dsv4.FP8_BLOCK) * 4)
    return weight + groups * rows * (k + n) * 2  # bf16 activations in and out


def bf16_linear_bytes(n: int, k: int, rows: int) -> int:
    return n * k * 2 + rows * k * 2 + rows * n * 4


def weight_bytes_per_rank(dims: Dims, tp: int) -> int:
    """Checkpoint-format weight bytes one rank of T holds for the whole model (43 layers, the
    embedding and the lm_head; KV caches and activations not included)."""
    rank = dims.rank(tp)
    shapes = rank.dense_shapes()
    counts = dsv4.LAYER_COUNTS
    fp8 = lambda n, k: fp8_linear_bytes(n, k, 0)  # noqa: E731
    per_expert = (2 * rank.moe_inter * dims.hidden // 2 + 2 * rank.moe_inter * dims.hidden // dsv4.MXFP4_GROUP
                  + dims.hidden * rank.moe_inter // 2 + dims.hidden * rank.moe_inter // dsv4.MXFP4_GROUP)
    every = (sum(fp8(*shapes[n]) for n in ("wqkv_a", "wq_b", "wo_b", "shared_gate_up", "shared_down"))
             + fp8_linear_bytes(dims.o_rank, rank.group_width, 0, groups=rank.groups)
             + dims.experts * per_expert + dims.experts * dims.hidden * 2)
    c4 = (fp8(*shapes["indexer_wq_b"]) + 2 * dims.hidden * (dsv4.COMPRESSOR_OUT[dsv4.C4_RATIO]
          + dsv4.INDEX_COMPRESSOR_OUT + dims.index_heads))
    c128 = 2 * dims.hidden * dsv4.COMPRESSOR_OUT[dsv4.C128_RATIO]
    total_layers = sum(counts.values())
    return (total_layers * every + counts["c4"] * c4 + counts["c128"] * c128
            + 2 * rank.vocab * dims.hidden * 2)  # embedding + lm_head, both vocab-parallel
