"""Model FLOPs, the device's peak and MFU: what the train CLI's final line prints beside its
throughput (`utilisation`).

MFU (model FLOPs utilisation; PaLM, Chowdhery et al. 2022, appendix B) counts the model's own
FLOPs, not what the compiled program does. Per token, forward and backward:

    6 N + 12 L D T

N the parameters a token multiplies: all but the position embeddings (looked up, not
multiplied); the token embedding counts, as the head tied to it (its matmul); of MoE experts
only the K of E a token is routed to. L layers, D the embedding width, T the context. 12 L D T is
attention's scores and weighted sum, **counted in full** although causal attention needs only
half of them, as PaLM and nanoGPT's estimate_mfu count it. The MLP: 6 N per example.
Recomputation (the transformer rematerialises every block) is not model FLOPs; the compiled
program's own count (XLA's cost analysis: `hardware` FLOPs) is printed beside it. That counts
recomputation, a Pallas kernel only through its cost estimate, and the body of a loop that stays
a loop once, not once per trip (a lax.scan of 10 matmuls reads as 1 on XLA:CPU, jax 0.10.2): under
the scan over layers or the blockwise attention it can read below the model count.
"""

import statistics

import jax
from flax import nnx

# Dense (no sparsity) peak FLOP/s per chip, by a part of jax's device_kind and compute dtype.
# TPU v5e ('TPU v5 lite'): 197 TFLOP/s bf16, 394 TOP/s int8, cloud.google.com/tpu/docs/v5e.
# H100 SXM ('NVIDIA H100 80GB HBM3'): 989 TFLOP/s bf16 dense (1,979 with sparsity), NVIDIA's
# H100 Tensor Core GPU datasheet. A100 ('NVIDIA A100-SXM4-80GB', '...-PCIE-40GB', ...): 312
# TFLOP/s bf16 dense, NVIDIA's A100 datasheet. float32 has no row: on a TPU its dots at
# --matmul_precision=default are one bfloat16 pass, on a GPU TF32 or not, so no one peak fits.
PEAKS = {
    'TPU v5 lite': {'bfloat16': 197e12, 'int8': 394e12},
    'H100 80GB HBM3': {'bfloat16': 989e12},
    'A100': {'bfloat16': 312e12},
}


def peak(device, dtype: str) -> tuple[float | None, str]:
    """(peak FLOP/s of `device` in `dtype`, '') or (None, why there is none)."""
    if device.platform == 'cpu':
        return None, 'n/a on cpu'
    for kind, peaks in PEAKS.items():
        if kind in device.device_kind:
            if dtype in peaks:
                return peaks[dtype], ''
            return None, f'n/a: no {dtype} peak for {device.device_kind} (runtime/flops.py)'
    return None, f'n/a: no peak for {device.device_kind} (runtime/flops.py)'


def multiplied_params(task) -> int:
    """N: the parameters each example or token multiplies (see the module's docstring)."""
    cfg = task.model_config
    share = cfg.experts_per_token / cfg.num_experts if getattr(cfg, 'num_experts', 0) else 1
    model = nnx.eval_shape(lambda: task.make_model(nnx.Rngs(0)))
    n = 0.0
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
        name = jax.tree_util.keystr(path)
        if "['pos']" not in name:
            n += leaf.size * (share if "['experts']" in name else 1)
    return int(n)


def model_flops_per_unit(task) -> float:
    """Forward and backward FLOPs per example (the MLP) or per token (the transformer)."""
    n, cfg = multiplied_params(task), task.model_config
    if task.throughput_unit != 'tokens':
        return 6.0 * n
    return 6.0 * n + 12.0 * cfg.num_layers * cfg.embed_dim * cfg.seq_len


def per_unit(model: str, model_config=None) -> float:
    """model_flops_per_unit of the benchmarks' models ('mlp': per example, at MLPConfig();
    'transformer': per token, at `model_config`), without a task (no data is read)."""
    from types import SimpleNamespace

    from shard_parity import config as cfg
    from shard_parity.model.mlp import MLP
    from shard_parity.model.transformer import Transformer

    if model == 'mlp':
        mc, make, unit = cfg.MLPConfig(), MLP, 'examples'
    else:
        mc, make, unit = model_config or cfg.TransformerConfig(), Transformer, 'tokens'
    task = SimpleNamespace(model_config=mc, throughput_unit=unit,
                           make_model=lambda rngs: make(mc, rngs=rngs))  # fmt: skip
    return model_flops_per_unit(task)


def rates(flops_per_step: float, step_s: float, device, dtype: str, devices: int = 1) -> dict:
    """A benchmark row's figures for one candidate: achieved model TFLOP/s and MFU against the
    peak of `devices` like `device` in `dtype` (None where there is none: the CPU, float32)."""
    top, _ = peak(device, dtype)
    achieved = flops_per_step / step_s
    return {
        'model_tflops_per_sec': achieved / 1e12,
        'mfu': achieved / (top * devices) if top else None,
    }


def hardware_flops(step, *args) -> float | None:
    """The compiled step's FLOPs by XLA's cost analysis; None where it has none. A step that ran
    with these arguments is compiled already: this looks it up (no second compile)."""
    try:
        cost = step.lower(*args).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return float(cost['flops']) if cost and cost.get('flops', 0) > 0 else None
    except Exception:  # noqa: BLE001 (a step that is no jitted function, no analysis here)
        return None


def utilisation(task, laps: list[float], hardware: float | None, devices: int, device=None) -> dict:
    """The final line's figures: the median step time after compilation (over `laps`, each a
    step's seconds), achieved model TFLOP/s, MFU against the peak of the `devices` the mesh
    holds (in the model's compute dtype), and hardware TFLOP/s (`hardware`: one device's
    program, as XLA compiles each device's part, times `devices`)."""
    if not laps:
        return {}
    step_s = statistics.median(laps)
    model = model_flops_per_unit(task) * task.units_per_batch / step_s
    top, why = peak(device or jax.devices()[0], task.model_config.dtype)
    out = {
        'step_s_median': step_s,
        'steps_timed': len(laps),
        'model_tflops_per_sec': model / 1e12,
        'mfu': model / (top * devices) if top else why,
    }
    if top:
        out['peak_tflops'] = top * devices / 1e12
    if hardware:
        out['hardware_tflops_per_sec'] = hardware * devices / step_s / 1e12
    return out
