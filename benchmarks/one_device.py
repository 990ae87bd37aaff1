"""Sections 3, 4 and 5 of `python -m benchmarks.run`: the model on one device, no parallelism
(attention's latency and memory, generation with and without the KV cache, the nanoGPT
configuration against PyTorch's step and the machine's matmul peak). The parallel sections
(the twins, the device sweep, the strategies) are in benchmarks/sections.py.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.sections import NANOGPT, runner, setup
from benchmarks.timing import interleaved
from shard_parity import explicit
from shard_parity.model import attention
from shard_parity.model.transformer import Transformer
from shard_parity.runtime import flops, generate
from shard_parity.step import one_device_train_step


def attention_sweep(lengths, rounds: int, dtype=jnp.float32) -> list[dict]:
    """3. naive vs fused attention, forward and backward of one layer: latency and XLA's
    compiled temporary memory (memory_analysis), where naive's T x T scores show up; model
    TFLOP/s and MFU by 12 B H D T^2 (the forward's two matmuls and the backward's four, the
    causal half counted in full, as runtime/flops.py counts attention)."""
    rows = []
    for t in lengths:
        k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(key, (1, t, 4, 32), dtype) for key in (k1, k2, k3))
        fns, temp = {}, {}
        for name in ('naive', 'fused'):
            f = jax.jit(
                jax.grad(
                    lambda q, k, v, f=attention.ATTENTION[name]: f(q, k, v).sum(), argnums=(0, 1, 2)
                )
            )
            compiled = f.lower(q, k, v).compile()
            temp[name] = compiled.memory_analysis().temp_size_in_bytes
            fns[name] = lambda c=compiled: jax.block_until_ready(c(q, k, v))
        med = interleaved(fns, rounds, warmup=1)
        model = 12 * q.shape[0] * q.shape[2] * q.shape[3] * t * t  # QK^T and PV: 4 BHDT^2, x3
        kind = jnp.dtype(dtype).name
        rates = {n: flops.rates(model, med[n], jax.devices()[0], kind) for n in fns}
        rows.append(
            {
                'seq_len': t,
                **{f'{n}_ms': 1e3 * med[n] for n in fns},
                **{f'{n}_temp_bytes': temp[n] for n in fns},
                'model_flops': model,
                **{f'{n}_{k}': v for n in fns for k, v in rates[n].items()},
            }
        )
    return rows


def generation(lengths, rounds: int, model_config=NANOGPT) -> list[dict]:
    """4. Bytes/s of the padded path vs the KV-cache path."""
    graphdef, params = nnx.split(Transformer(model_config, rngs=nnx.Rngs(0)))
    gen = generate.Generator(graphdef, params)
    rows = []
    for n in lengths:
        fns = {
            'padded': lambda: gen.generate(b'ROMEO:', n),
            'kv_cache': lambda: gen.generate(b'ROMEO:', n, kv_cache=True),
        }
        med = interleaved(fns, rounds, warmup=1)
        rows.append({'new_bytes': n, **{f'{k}_bytes_per_sec': n / med[k] for k in fns}})
    return rows


def matmul_peak(dtype=jnp.float32, rounds=7) -> float:
    """FLOP/s of one large matmul in the model's compute dtype on one device: the machine's
    practical peak. 1024 x 1024 on the CPU; 8192 x 8192 on a GPU, which a smaller one leaves
    partly idle."""
    n = 1024 if jax.devices()[0].platform == 'cpu' else 8192
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    f = jax.jit(lambda a: a @ a)
    med = interleaved({'mm': lambda: jax.block_until_ready(f(a))}, rounds)
    return 2 * n**3 / med['mm']


def nanogpt(rounds: int, model_config=NANOGPT, batch_size=12) -> dict:
    """5. The transformer at nanoGPT's CPU configuration on one device: tokens/s, the share of
    the backward pass, and achieved FLOP/s against the measured matmul peak."""
    graphdef, tx, state, loss, batch, units = setup('transformer', batch_size, model_config)
    step = one_device_train_step(graphdef, loss, tx)
    xla_flops = step.lower(state, batch).compile().cost_analysis()['flops']
    fwd = jax.jit(lambda p, b: loss(nnx.merge(graphdef, p), b)[0])
    train = runner(None, 1, 'transformer', batch_size, steps=10, model_config=model_config)
    forward = lambda: [jax.block_until_ready(fwd(state.params, batch)) for _ in range(10)]  # noqa: E731
    candidates = {'train': train, 'forward': forward}
    if jax.device_count() >= 2 and jax.devices()[0].platform == 'cpu':
        # Small matmuls on one XLA:CPU device barely use a second core; nanoGPT's PyTorch used
        # both. The same step data-parallel over 2 emulated devices (explicit twin): one per core.
        candidates['two_devices'] = runner(
            explicit, 2, 'transformer', batch_size, steps=10, model_config=model_config
        )
    med = interleaved(candidates, rounds)
    step_s, fwd_s = med['train'] / 10, med['forward'] / 10
    t = model_config.seq_len
    # 6N + 12LDT a token (runtime/flops.py; nanoGPT's estimate_mfu, position embeddings left out)
    analytic = units * flops.per_unit('transformer', model_config)
    peak = matmul_peak(model_config.compute_dtype)
    two = {}  # only where a second CPU device ran the step too
    if 'two_devices' in med:
        two_s = med['two_devices'] / 10
        two = {'two_devices_step_ms': 1e3 * two_s, 'two_devices_tokens_per_sec': units / two_s}
    return {
        **two,
        'batch': batch_size,
        'seq_len': t,
        'step_ms': 1e3 * step_s,
        'tokens_per_sec': units / step_s,
        'forward_ms': 1e3 * fwd_s,
        'step_over_forward': step_s / fwd_s,
        'xla_flops_per_step': xla_flops,
        'analytic_flops_per_step': analytic,
        'achieved_flops_per_sec': analytic / step_s,
        'matmul_peak_flops_per_sec': peak,
        'fraction_of_peak': analytic / step_s / peak,
        **flops.rates(analytic, step_s, jax.devices()[0], model_config.dtype),
        'hardware_tflops_per_sec': xla_flops / step_s / 1e12,
    }
