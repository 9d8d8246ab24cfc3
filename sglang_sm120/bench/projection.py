"""A *model* of DSv4-Flash decode-step time on sm_120 GPUs, from bytes and measured efficiency.

Nothing here is a measurement on an sm_120 GPU. The model is

    t_step = sum over layers of  bytes_per_rank(layer) / (BW_gpu * efficiency(layer))
             + n_layers * allreduces_per_layer * t_allreduce          (only when T > 1)
             + lm_head_bytes_per_rank / (BW_gpu * efficiency(lm_head))

where ``BW_gpu`` is the GPU's specified memory bandwidth, ``efficiency`` is the fraction of the
*copy* bandwidth that the same kernels reached on the benchmark GPU in the same run (so it assumes
the sm_120 GPU's kernels reach the same fraction of its own copy bandwidth, and that its copy
bandwidth equals the specification: both are assumptions, printed with the result), and
``t_allreduce`` is either given on the command line or left out (and the output says so).
"""

from __future__ import annotations

import dataclasses

# Specified memory bandwidth (GB/s). Both cards use a 512-bit GDDR7 bus at 28 Gbps:
# 512 / 8 * 28 = 1792 GB/s. Source: NVIDIA's published specifications, as compared in
# hardware-corner.net, "RTX 5090 vs RTX Pro 6000 spec comparison" (2025-03-21).
SM120_GPUS = {
    "RTX PRO 6000 Blackwell": {"bandwidth_gbs": 1792.0, "memory_gib": 96},
    "RTX 5090": {"bandwidth_gbs": 1792.0, "memory_gib": 32},
}

ALLREDUCES_PER_LAYER = 2  # attention output and MoE output are reduced at each mHC boundary


@dataclasses.dataclass
class LayerMeasurement:
    kind: str  # "swa", "c4", "c128", "lm_head"
    count: int  # how many such layers a step runs
    bytes_per_rank: float
    measured_us: float
    copy_bandwidth_gbs: float  # measured in the same run

    @property
    def efficiency(self) -> float:
        """Fraction of the measured copy bandwidth this layer's kernels reached."""
        return (self.bytes_per_rank / (self.measured_us * 1e-6)) / (self.copy_bandwidth_gbs * 1e9)


def project_step_us(layers: list[LayerMeasurement], gpu_bandwidth_gbs: float, tp: int,
                    allreduce_us: float | None) -> dict:
    """Projected decode-step time (µs) on a GPU of ``gpu_bandwidth_gbs``, with every input shown."""
    if gpu_bandwidth_gbs <= 0:
        raise ValueError("gpu_bandwidth_gbs must be positive")
    terms = []
    total = 0.0
    for layer in layers:
        t = layer.bytes_per_rank / (gpu_bandwidth_gbs * 1e9 * layer.efficiency) * 1e6
        terms.append({"kind": layer.kind, "count": layer.count, "bytes_per_rank": layer.bytes_per_rank,
                      "efficiency": layer.efficiency, "us_each": t})
        total += t * layer.count
    decoder_layers = sum(layer.count for layer in layers if layer.kind != "lm_head")
    allreduce_total = None
    if tp > 1 and allreduce_us is not None:
        allreduce_total = decoder_layers * ALLREDUCES_PER_LAYER * allreduce_us
        total += allreduce_total
    return {
        "step_us": total,
        "tokens_per_s_per_sequence": 1e6 / total if total else float("inf"),
        "terms": terms,
        "allreduce_us_total": allreduce_total,
        "allreduce_included": tp == 1 or allreduce_us is not None,
        "formula": "sum_layers count*bytes/(BW*eff) + [T>1] n_layers*2*t_allreduce",
        "gpu_bandwidth_gbs": gpu_bandwidth_gbs,
        "tp": tp,
    }
