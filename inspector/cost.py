"""What a collective and a step would cost on named hardware: published link bandwidths and peak
FLOP rates, the ring formulas, a per-hop latency floor.

Per device, with n devices in the group and B the bytes of the whole (unsharded) array:
  all-gather, reduce-scatter   (n-1) hops,  B (n-1)/n over the link
  all-reduce                   2(n-1) hops, 2 B (n-1)/n (a reduce-scatter then an all-gather)
  all-to-all                   (n-1) hops,  B (n-1)/n (each device keeps 1/n of its own)
  collective-permute           1 hop,       B
time = hops x latency + bytes / (link bandwidth x achievable fraction). The achievable fraction
is stated per chip, not assumed to be 1: rings and NCCL never reach the datasheet's peak.
Compute: the program's FLOPs (per device) over the chip's dense peak for the dot dtype. The step
is reported as a band: [max(compute, comms), compute + comms] (perfect overlap .. none).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    link_gb_s: float  # per device, one direction, over the collective's ring (GB/s, 1e9)
    achievable: float  # fraction of link_gb_s that collectives reach in practice
    hop_us: float  # latency floor per ring step
    peak_tflops: dict  # dense peak per dot dtype
    sources: str  # where each figure comes from
    emulation: bool = False


HARDWARE = {
    'h100x8': Hardware(
        'h100x8: 8 x NVIDIA H100 SXM, NVLink 4 through NVSwitch',
        link_gb_s=450.0,  # NVLink 4: 900 GB/s per GPU, both directions together
        achievable=0.8,  # nccl-tests all_reduce_perf on DGX H100 reaches ~360 GB/s bus bandwidth
        hop_us=1.0,  # NCCL ring step: small all-reduces take ~10-20 us over 2(n-1) = 14 steps
        peak_tflops={'bf16': 989.4, 'f16': 989.4, 'f32': 494.7},  # f32 dots run as TF32
        sources='NVIDIA H100 Tensor Core GPU datasheet (SXM5: NVLink 900 GB/s, BF16 1,979 '
        'TFLOPS with sparsity = 989.4 dense, TF32 989 with sparsity = 494.7 dense); NCCL '
        'nccl-tests bus bandwidth on DGX H100 for the achievable fraction.',
    ),
    'h200x8': Hardware(
        'h200x8: 8 x NVIDIA H200 SXM, NVLink 4 through NVSwitch',
        link_gb_s=450.0,  # NVLink 4: 900 GB/s per GPU, both directions together
        achievable=0.8,  # as H100: the same NVLink and NVSwitch generation
        hop_us=1.0,
        peak_tflops={'bf16': 989.4, 'f16': 989.4, 'f32': 494.7},
        sources='NVIDIA H200 Tensor Core GPU datasheet (SXM: NVLink 900 GB/s, BF16 1,979 '
        'TFLOPS with sparsity, TF32 989 with sparsity; the dense figures are half).',
    ),
    'tpu-v5e-8': Hardware(
        'tpu-v5e-8: 8 TPU v5e chips, 2x4 ICI torus',
        link_gb_s=100.0,  # ICI 1,600 Gbps = 200 GB/s per chip over 4 links; a ring uses 2
        achievable=0.7,
        hop_us=1.0,
        peak_tflops={'bf16': 197.0, 'f16': 197.0, 'f32': 197.0},  # f32 dots: one bf16 pass
        sources='Google Cloud TPU v5e documentation (197 TFLOP/s bf16 per chip, inter-chip '
        'interconnect 1,600 Gbps per chip); f32 dots at JAX\'s default precision run as bf16.',
    ),
    'tpu-v5p-8': Hardware(
        'tpu-v5p-8: 4 TPU v5p chips, ICI 3D torus (Cloud names slices by TensorCores, 2 a chip)',
        link_gb_s=300.0,  # ICI 4,800 Gbps = 600 GB/s per chip over 6 links; a ring uses 2 + 1
        achievable=0.7,
        hop_us=1.0,
        peak_tflops={'bf16': 459.0, 'f16': 459.0, 'f32': 459.0},
        sources='Google Cloud TPU v5p documentation (459 TFLOP/s bf16 per chip, inter-chip '
        'interconnect 4,800 Gbps per chip).',
    ),
    'tpu-v4-8': Hardware(
        'tpu-v4-8: 4 TPU v4 chips, ICI 3D torus (Cloud names slices by TensorCores, 2 a chip)',
        link_gb_s=100.0,  # an assumption: Cloud's v4 page gives no per-chip ICI figure (below)
        achievable=0.7,
        hop_us=1.0,
        peak_tflops={'bf16': 275.0, 'f16': 275.0, 'f32': 275.0},
        sources='Google Cloud TPU v4 documentation (275 TFLOP/s bf16 per chip, 32 GiB HBM2); '
        'it states no inter-chip bandwidth per chip, so the link is priced at v5e\'s 50 GB/s '
        'per link, 2 links a ring: an assumption, not a datasheet figure.',
    ),
    'cpu': Hardware(
        'cpu: emulated devices of this machine (XLA:CPU, --cpu_devices)',
        link_gb_s=5.0,  # a memcpy between threads' buffers, shared by all emulated devices
        achievable=1.0,
        hop_us=20.0,  # XLA:CPU's rendezvous of the device threads per collective step
        peak_tflops={'bf16': 0.02, 'f16': 0.02, 'f32': 0.02},  # a share of 2 cores per device
        sources='emulation: a rough fit for a 2-core machine, not hardware; the measured step '
        'time is printed beside it.',
        emulation=True,
    ),
}


def wire(kind: str, nbytes: float, n: int) -> tuple[int, float]:
    """(ring steps, bytes each device sends) for one collective of `nbytes` result bytes."""
    if n <= 1:
        return 0, 0.0
    if kind == 'reduce-scatter':  # the result is 1/n of the array that is reduced
        return n - 1, nbytes * (n - 1)
    if kind == 'all-reduce':
        return 2 * (n - 1), 2 * nbytes * (n - 1) / n
    if kind == 'collective-permute':
        return 1, nbytes
    return n - 1, nbytes * (n - 1) / n  # all-gather (result: the whole array), all-to-all


def collective_us(kind: str, nbytes: float, n: int, hw: Hardware) -> float:
    hops, sent = wire(kind, nbytes, n)
    return hops * hw.hop_us + sent / (hw.link_gb_s * 1e9 * hw.achievable) * 1e6


def compute_us(flops: float, dtype: str, hw: Hardware) -> float:
    return flops / (hw.peak_tflops.get(dtype, hw.peak_tflops['f32']) * 1e12) * 1e6


def step_band(compute: float, comms: float) -> tuple[float, float]:
    """Full overlap of communication with compute .. none."""
    return max(compute, comms), compute + comms
