"""shard_parity/runtime/flops.py: the model FLOPs the final line's MFU counts (PaLM's 6N + 12LDT
per token, the MLP's 6N per example), the peaks table and what the final line says without one."""

import types

import pytest

from shard_parity.model.transformer import TransformerConfig
from shard_parity.runtime import flops


def task(model_config=None, unit='tokens', units=12 * 64):
    model_config = model_config or TransformerConfig()
    from shard_parity.model.mlp import MLP
    from shard_parity.model.transformer import Transformer

    make = Transformer if unit == 'tokens' else MLP
    return types.SimpleNamespace(
        model_config=model_config,
        make_model=lambda rngs: make(model_config, rngs=rngs),
        throughput_unit=unit,
        units_per_batch=units,
    )


def device(platform, kind):
    return types.SimpleNamespace(platform=platform, device_kind=kind)


def test_the_transformer_counts_6n_and_attention_in_full():
    """nanoGPT's default: N is every parameter but the position embeddings (the tied head
    counts once), and 12 L D T for attention, causal or not."""
    c = TransformerConfig()
    per_layer = 12 * c.embed_dim**2 + 2 * c.embed_dim  # q, kv, out, the MLP; two norm scales
    n = c.num_layers * per_layer + c.vocab_size * c.embed_dim + c.embed_dim  # + the final norm
    assert flops.multiplied_params(task(c)) == n
    assert flops.model_flops_per_unit(task(c)) == 6 * n + 12 * 4 * 128 * 64


def test_experts_count_only_the_share_a_token_is_routed_to():
    dense = TransformerConfig()
    moe = TransformerConfig(num_experts=4, experts_per_token=2)
    extra = flops.multiplied_params(task(moe)) - flops.multiplied_params(task(dense))
    router = moe.num_layers * moe.embed_dim * 4
    assert extra == router + moe.num_layers * 8 * moe.embed_dim**2  # 2 of 4 experts' 4 C^2 each


def test_the_mlp_counts_6n_per_example():
    from shard_parity.model.mlp import MLPConfig

    n = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert flops.model_flops_per_unit(task(MLPConfig(), 'examples', 128)) == 6 * n


@pytest.mark.parametrize(
    'dev, dtype, want',
    [
        (device('tpu', 'TPU v5 lite'), 'bfloat16', 197e12),
        (device('tpu', 'TPU v5 lite'), 'int8', 394e12),
        (device('gpu', 'NVIDIA H100 80GB HBM3'), 'bfloat16', 989e12),
        (device('gpu', 'NVIDIA A100-SXM4-80GB'), 'bfloat16', 312e12),
        (device('cpu', 'cpu'), 'bfloat16', 'n/a on cpu'),
        (device('tpu', 'TPU v5 lite'), 'float32', 'n/a: no float32 peak for TPU v5 lite'),
        (device('tpu', 'TPU v4'), 'bfloat16', 'n/a: no peak for TPU v4'),
    ],
)
def test_peaks_by_device_kind_and_dtype(dev, dtype, want):
    top, why = flops.peak(dev, dtype)
    assert (top == want) if isinstance(want, float) else (top is None and why.startswith(want))


def test_mfu_is_model_flops_at_the_median_step_over_the_devices_peak():
    t = task(TransformerConfig(dtype='bfloat16'))
    laps = [0.010, 0.001, 0.002, 0.002, 9.0]  # the median, 2 ms, ignores the outliers
    per_step = flops.model_flops_per_unit(t) * 12 * 64
    out = flops.utilisation(t, laps, 3 * per_step, 2, device('tpu', 'TPU v5 lite'))
    assert out['step_s_median'] == 0.002 and out['steps_timed'] == 5
    assert out['model_tflops_per_sec'] == pytest.approx(per_step / 0.002 / 1e12)
    assert out['mfu'] == pytest.approx(per_step / 0.002 / (2 * 197e12))
    assert out['peak_tflops'] == 2 * 197
    assert out['hardware_tflops_per_sec'] == pytest.approx(3 * out['model_tflops_per_sec'] * 2)
    on_cpu = flops.utilisation(t, laps, None, 1, device('cpu', 'cpu'))
    assert on_cpu['mfu'] == 'n/a on cpu' and 'peak_tflops' not in on_cpu
    assert 'hardware_tflops_per_sec' not in on_cpu and flops.utilisation(t, [], None, 1) == {}
