"""DeepSeek-V4-Flash shapes and cache-layout constants: the one place they are written down.

Sources: the published Flash ``config.json`` and SGLang 0.5.23's DSv4 memory pool and kernels
(``srt/mem_cache/deepseek_v4_memory_pool.py``, ``kernels/ops/attention/flash_mla_sm120.py``,
``srt/layers/attention/dsv4/indexer.py``); see ``shared/reference/dsv4-flash-in-sglang-0.5.23.md``.
Everything else in the project imports these names instead of repeating the numbers.
"""

# --- model ------------------------------------------------------------------------------------
HIDDEN_SIZE = 4096
NUM_LAYERS = 43
NUM_HASH_LAYERS = 3  # layers 0..2 route by token-id hash
VOCAB_SIZE = 129280
NUM_HEADS = 64
HEAD_DIM = 512  # latent width of q/k/v per head (MQA: one shared latent KV row)
NOPE_DIM = 448  # FP8 part of a KV row
ROPE_DIM = 64  # bf16 part of a KV row
Q_LORA_RANK = 1024
KV_LORA_RANK = 512
O_GROUPS = 8
O_LORA_RANK = 1024
SOFTMAX_SCALE = HEAD_DIM ** -0.5
SLIDING_WINDOW = 128

# compress_ratios of the published config: 0 = SWA only, 4 = C4 (with indexer), 128 = C128
SWA_ONLY_LAYERS = (0, 1)
C4_RATIO = 4
C128_RATIO = 128


def layer_compress_ratio(layer_id: int) -> int:
    """0 for SWA-only layers 0-1, 4 for even layers 2..42, 128 for odd layers 3..41."""
    if layer_id in SWA_ONLY_LAYERS:
        return 0
    return C4_RATIO if layer_id % 2 == 0 else C128_RATIO


# --- routed / shared experts -------------------------------------------------------------------
NUM_EXPERTS = 256
TOP_K = 6
MOE_INTERMEDIATE_SIZE = 2048
ROUTED_SCALING_FACTOR = 1.5
SWIGLU_LIMIT = 10.0
MXFP4_GROUP = 32  # one E8M0 scale per 32 values along K
SHARED_EXPERT_INTERMEDIATE = 2048

# --- FP8 dense weights -------------------------------------------------------------------------
FP8_BLOCK = 128  # 128x128 block scales


def dense_linear_shapes(tp: int = 1) -> dict:
    """(out_features, in_features) of each FP8 block-scaled linear one rank holds at TP ``tp``.

    Column-parallel layers split the output, row-parallel ones the input; wqkv_a and the
    indexer's wq_b are replicated in SGLang 0.5.23 (ReplicatedLinear).
    """
    if tp not in SUPPORTED_TP:
        raise ValueError(f"tp must be one of {SUPPORTED_TP}, got {tp}")
    return {
        "wqkv_a": (Q_LORA_RANK + KV_LORA_RANK, HIDDEN_SIZE),
        "wq_b": (NUM_HEADS * HEAD_DIM // tp, Q_LORA_RANK),
        "wo_a": (O_GROUPS * O_LORA_RANK // tp, HIDDEN_SIZE),
        "wo_b": (HIDDEN_SIZE, O_GROUPS * O_LORA_RANK // tp),
        "indexer_wq_b": (INDEX_N_HEADS * INDEX_HEAD_DIM, Q_LORA_RANK),
        "shared_gate_up": (2 * SHARED_EXPERT_INTERMEDIATE // tp, HIDDEN_SIZE),
        "shared_down": (HIDDEN_SIZE, SHARED_EXPERT_INTERMEDIATE // tp),
    }


SUPPORTED_TP = (1, 2, 4, 8)

# --- KV cache, V4 layout (584 B per token) -----------------------------------------------------
KV_TILE = 64  # nope is quantised in tiles of 64 values, one UE8M0 scale each
KV_NUM_TILES = NOPE_DIM // KV_TILE  # 7
KV_DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576: fp8 nope then bf16 rope
KV_SCALE_BYTES = KV_NUM_TILES + 1  # 8: 7 UE8M0 bytes + 1 pad
KV_TOKEN_BYTES = KV_DATA_BYTES + KV_SCALE_BYTES  # 584
SWA_PAGE_SIZE = 256
C4_PAGE_SIZE = SWA_PAGE_SIZE // C4_RATIO  # 64
C128_PAGE_SIZE = SWA_PAGE_SIZE // C128_RATIO  # 2


def kv_page_bytes(page_size: int) -> int:
    """Bytes of one V4-layout page: data then scales, padded up to a multiple of 576."""
    raw = page_size * KV_TOKEN_BYTES
    return -(-raw // KV_DATA_BYTES) * KV_DATA_BYTES


# --- lightning indexer -------------------------------------------------------------------------
INDEX_N_HEADS = 64
INDEX_HEAD_DIM = 128
INDEX_TOPK = 512
INDEX_PAGE_SIZE = 64  # compressed tokens per indexer-K page
INDEX_TOKEN_BYTES = INDEX_HEAD_DIM + 4  # fp8 row + fp32 scale = 132
MAX_CONTEXT = 1048576

# --- sm_120 hardware ---------------------------------------------------------------------------
SM120_SMEM_LIMIT = 101376  # opt-in dynamic shared memory per block on sm_120/121 (99 KB)
SM120_ARCHS = (120, 121)

# --- sparse MLA decode (issue 3) ---------------------------------------------------------------
E8M0_BIAS = 127  # UE8M0 scale byte b encodes 2**(b - 127)
KV_GROUPS = KV_NUM_TILES + 1  # a KV row as 8 groups of 64: 7 FP8 nope tiles, then the bf16 rope
SPARSE_MLA_MAX_HEADS = NUM_HEADS  # query heads per rank our decode kernel takes (TP1: 64 ... TP8: 8)

# --- lightning indexer kernels (issue 5) -------------------------------------------------------
# Index-K page: INDEX_PAGE_SIZE rows of INDEX_HEAD_DIM fp8 bytes, then INDEX_PAGE_SIZE fp32 scales.
INDEX_PAGE_BYTES = INDEX_PAGE_SIZE * INDEX_TOKEN_BYTES  # 8448
INDEX_SCALE_OFFSET = INDEX_PAGE_SIZE * INDEX_HEAD_DIM  # 8192: byte offset of the scales in a page
INDEX_MAX_COMPRESSED_LEN = MAX_CONTEXT // C4_RATIO  # 262144 compressed positions at 1M context
INDEX_MAX_BATCH = 256  # SGLang's max_running_requests default for DSv4

# --- MXFP4 routed experts (issue 4: kernels/moe_mxfp4.py) -------------------------------------
MXFP4_E8M0_BIAS = 127  # E8M0 scale byte b means 2**(b - 127)

# --- decode-step benchmark (issue 8: sglang_sm120/bench) ----------------------------------------
# Compressor projections SGLang 0.5.23 keeps in bf16 (reference §1.3 B5/C1/C2): wkv_gate is
# [2 * coff * 512, hidden] with coff = 2 for C4 and 1 for C128; the indexer's compressor is
# [2 * 2 * 128, hidden]; weights_proj is [index heads, hidden].
COMPRESSOR_OUT = {C4_RATIO: 2 * 2 * KV_LORA_RANK, C128_RATIO: 2 * 1 * KV_LORA_RANK}
INDEX_COMPRESSOR_OUT = 2 * 2 * INDEX_HEAD_DIM
INDEX_WEIGHT_SCALE = INDEX_HEAD_DIM ** -0.5 * INDEX_N_HEADS ** -0.5  # folded into weights_proj's output
LAYER_KIND_RATIO = {"swa": 0, "c4": C4_RATIO, "c128": C128_RATIO}
LAYER_COUNTS = {kind: sum(layer_compress_ratio(i) == ratio for i in range(NUM_LAYERS))  # 2, 21, 20
                for kind, ratio in LAYER_KIND_RATIO.items()}

# --- bench common stages (issue 8 follow-up: kernels/bench_common.py) --------------------------
RMS_NORM_EPS = 1e-6  # rms_norm_eps of DeepSeek-V4-Flash's config (every RMSNorm of the layer)
SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus: above it softplus(x) = x
# the C4 indexer's query quantisation: floor of a (token, head) row's amax before / 448 (SGLang's fused JIT kernel,
# main_norm_rope.cuh: fmaxf(1e-4f, abs_max) / FP8_E4M3_MAX)
INDEX_Q_AMAX_FLOOR = 1e-4

# --- replicated bf16 projections at decode (kernels/bf16_gemv.py, the bf16_linear seam) ----------
# (N, K) of each bf16 linear the seam routes to the GEMV: both compressors' wkv_gate (fp32 out, SGLang's
# linear_bf16_fp32) and the indexer's weights_proj (bf16 out); replicated, so the same at every T
BF16_LINEAR_SHAPES = {
    "compressor_c4": (COMPRESSOR_OUT[C4_RATIO], HIDDEN_SIZE),
    "compressor_c128": (COMPRESSOR_OUT[C128_RATIO], HIDDEN_SIZE),
    "index_compressor": (INDEX_COMPRESSOR_OUT, HIDDEN_SIZE),
    "weights_proj": (INDEX_N_HEADS, HIDDEN_SIZE),
}
# the MoE router gate [256, 4096] bf16 -> fp32 logits: SGLang runs its JIT tiny_gemm_bf16 up to this many rows
# (srt/models/deepseek_common/utils.py:184-198), cuBLAS above; the bench stands the bf16 GEMV in for it in both paths
ROUTER_GATE_SHAPE = (NUM_EXPERTS, HIDDEN_SIZE)
ROUTER_TINY_GEMM_MAX_ROWS = 16
# SM counts of the sm_12x GPUs the plugin targets (tile choices that depend on the grid are compiled for each)
SM12X_SM_COUNTS = {"RTX PRO 6000 Blackwell": 188, "RTX 5090": 170}
# The AOT check also compiles what the launch rules pick on a GPU of any SM count up to this many: other sm_12x GPUs
# (the smaller RTX / RTX PRO Blackwell cards, DGX Spark's GB10 on sm_121) have fewer SMs, and below the H200's 132
# some rules pick forms that neither the two GPUs above nor the H200 launch
SM12X_AOT_MAX_SM_COUNT = 256
