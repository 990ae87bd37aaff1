"""`--attention=fused` on a TPU is Pallas' splash attention (shard_parity/model/splash.py).

CI has no TPU: the kernel's own code path runs here in Pallas' interpret mode
(SHARD_PARITY_SPLASH=interpret), at small shapes, against naive in float32: forward and
gradients, MHA, GQA and MQA, on one device and inside each twin's way of sharding (jit over an
Auto mesh, jax.shard_map, an Explicit mesh). With libtpu installed, the three twins' train steps
compiled for tpu-v5e-8 carry the kernel's custom calls and no all-gather (the kernel runs inside
a shard_map over the rows and heads: a Mosaic kernel is never partitioned by XLA)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity import config as cfg
from shard_parity import plan as plans
from shard_parity.devices import libtpu_installed
from shard_parity.model import attention, splash

SLOW = pytest.mark.slow
needs_libtpu = pytest.mark.skipif(
    not libtpu_installed(),
    reason='libtpu is not installed: pip install -e ".[tpu]" (CI installs it)',
)
HEADS = {'mha': 4, 'gqa': 2, 'mqa': pytest.param(1, marks=SLOW)}  # key/value heads of 4
ROUND_OFF = {'rtol': 2e-5, 'atol': 2e-5}  # float32: the kernel's order of sums against naive's


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv('SHARD_PARITY_SPLASH', 'interpret')


def operands(t=256, kv_heads=4, b=1, h=4, d=32, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    shapes = [(b, t, h, d), (b, t, kv_heads, d), (b, t, kv_heads, d), (b, t, h, d)]
    return [jax.random.normal(key, shape) for key, shape in zip(ks, shapes)]


def forward_and_grads(fn, q, k, v, g):
    out, back = jax.vjp(fn, q, k, v)
    return (out, *back(g))


def assert_close(got, want):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, **ROUND_OFF)


@pytest.mark.parametrize('kv_heads', HEADS.values(), ids=HEADS)
def test_splash_equals_naive_forward_and_gradients(kv_heads, interpret):
    """T=256 in two blocks of 128 (one above the diagonal skipped, one masked, one whole)."""
    q, k, v, g = operands(kv_heads=kv_heads)
    splash.BLOCK, block = 128, splash.BLOCK
    try:
        got = jax.jit(lambda *a: forward_and_grads(splash.splash, *a))(q, k, v, g)
    finally:
        splash.BLOCK = block
    want = forward_and_grads(attention.naive, q, k, v, g)
    # the two can differ: a key one place later (not causal by one) moves every output
    shifted = forward_and_grads(attention.naive, q, jnp.roll(k, 1, axis=1), v, g)
    assert np.abs(shifted[0] - want[0]).max() > 100 * ROUND_OFF['atol']
    assert_close(got, want)


def test_fused_takes_splash_on_a_tpu_and_says_when_it_cannot(interpret, monkeypatch):
    """fused: splash where it runs (counted), blockwise with one line where it does not (a
    sequence not a multiple of 128, generation's KV cache), and off a TPU, as before."""
    calls, lines = [], []
    monkeypatch.setattr(splash, 'splash', lambda *a: calls.append(1) or splash.local(*a))
    monkeypatch.setattr(attention.logging, 'warning', lambda f, *a: lines.append(f % a))
    monkeypatch.setattr(attention, '_warned', set())
    q, k, v, _ = operands(t=128)
    np.testing.assert_allclose(attention.fused(q, k, v), attention.naive(q, k, v), **ROUND_OFF)
    assert calls == [1] and lines == []
    q, k, v, _ = operands(t=96)
    np.testing.assert_allclose(attention.fused(q, k, v), attention.naive(q, k, v), **ROUND_OFF)
    assert calls == [1]
    expected = (
        '--attention=fused: splash attention does not take a sequence length of 96 (not a '
        'multiple of 128); blockwise attention instead'
    )
    assert lines == [expected]
    q, k, v, _ = operands(t=128)
    attention.fused(q[:, :8], k, v, offset=8, valid=16)
    assert calls == [1] and 'splash attention does not take a KV cache' in lines[-1]
    monkeypatch.delenv('SHARD_PARITY_SPLASH')
    assert attention.implementation(jnp.float32) is None  # this CPU: no kernel
    assert lines[-1] == (
        '--attention=fused: no attention kernel on the cpu platform; blockwise attention instead'
    )


def remat(fn):
    """fn as FSDP's layers run it: under jax.checkpoint, in a scan (JAX traces it again)."""

    def layer(qkv, _):
        q, k, v = qkv
        return (fn(q, k, v), k, v), None

    layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable)
    return lambda q, k, v: jax.lax.scan(layer, (q, k, v), length=1)[0][0]


@pytest.mark.parametrize(
    'axis_type', ['auto', 'explicit', 'explicit_remat', 'typed', 'typed_one_device']
)
def test_splash_in_each_twins_sharding_equals_naive(axis_type, interpret):
    """On a data x model mesh (4 x 2), GQA: jit over an Auto mesh and an Explicit one (the
    kernel under its own shard_map), and inside the explicit twin's shard_map (the kernel on
    each device's rows and heads as they are); forward and gradients equal naive's. And an
    Explicit mesh of one device (typed/ on one chip: its size-1 axes still need the shard_map,
    or the kernel's vmap finds no mesh for the 'data' its types name)."""
    q, k, v, g = operands(t=128, kv_heads=2, b=4)
    spec = P('data', None, 'model', None)
    types = (AxisType.Explicit,) * 2 if 'typed' in axis_type else (AxisType.Auto,) * 2
    shape = (1, 1) if 'one_device' in axis_type else (4, 2)
    mesh = jax.make_mesh(shape, ('data', 'model'), axis_types=types,
                         devices=jax.devices()[:shape[0] * shape[1]])  # fmt: skip
    if axis_type.startswith('explicit'):
        fn = remat(splash.splash) if axis_type == 'explicit_remat' else splash.splash
        fn = jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    else:
        fn = splash.splash
    args = [jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v, g)]
    got = jax.jit(lambda *a: forward_and_grads(fn, *a))(*args)
    assert_close(got, forward_and_grads(attention.naive, q, k, v, g))


def test_a_split_sequence_keeps_blockwise(interpret):
    """Context parallelism's 'seq' axis splits what the kernel needs whole: plan says so."""
    q, k, _, _ = operands(t=128, b=4)
    mesh = jax.make_mesh((4, 2), ('data', 'seq'), axis_types=(AxisType.Auto,) * 2)
    q, k = (jax.device_put(x, NamedSharding(mesh, P('data', 'seq'))) for x in (q, k))
    reason = []
    jax.jit(lambda q, k: reason.append(splash.plan(q, k)[0]) or q)(q, k)
    assert reason == ["the mesh axis 'seq', which splits what the kernel needs whole"]


ALL_GATHER = re.compile(r'\ball-gather(-start)?\(')
SHAPE = re.compile(r'\w+\[([\d,]*)\]')


def activation_gathers(text: str, t: int = 128) -> list[str]:
    """The all-gathers whose result has 3 or more dimensions, one of them the sequence length:
    q, k, v or the attention's output (the weights are [layers, in, out] or 2-D, none of them
    128 long here)."""
    found = []
    for line in filter(ALL_GATHER.search, text.splitlines()):
        result = line.split('=', 1)[1].split('all-gather')[0] if '=' in line else ''
        dims = [[int(n) for n in m.split(',') if n] for m in SHAPE.findall(result)]
        if any(len(d) >= 3 and t in d for d in dims):
            found.append(line.strip())
    return found


def compiled_texts(mesh_text: str) -> dict:
    """{twin: compiled HLO text} of the three twins' train steps for tpu-v5e-8, the transformer
    at T=128 (one layer, GQA: 4 query heads, 2 key/value heads) in bf16, --attention=fused."""
    from shard_parity.inspector import target as targets
    from shard_parity.inspector import twins
    from shard_parity.inspector.program import compile_all
    from shard_parity.mesh import mesh_for

    devices = targets.devices('tpu-v5e-8')
    plan = plans.parse(mesh_text, None, 8, precision=plans.Precision(compute='bfloat16'))
    model = cfg.TransformerConfig(seq_len=128, num_layers=1, num_heads=4, num_kv_heads=2,
                                  embed_dim=64, attention='fused', dtype='bfloat16')  # fmt: skip
    config = dataclasses.replace(cfg.TRAIN_DEFAULTS['transformer'], batch_size=16)
    mesh = mesh_for(plan, AxisType.Auto, devices=devices)
    _, steps = twins.lowered_steps('transformer', config, mesh, plan, model, devices[0])
    out = compile_all((name, lowered) for name, (lowered, *_) in steps if name != 'one_device')
    return {name: compiled.as_text() for name, (compiled, *_) in out.items()}


@SLOW
@needs_libtpu
@pytest.mark.parametrize('mesh_text', ['data:8', 'data:4,model:2'])
def test_on_a_tpu_the_kernel_runs_on_each_devices_shards(mesh_text):
    """Compiled for tpu-v5e-8, every twin's step holds the kernel's three custom calls (the
    forward, dq, dk/dv) and no all-gather: the rows (and on data x model the heads) stay split
    through attention. Unwrapped, the kernel does not compile at all: Mosaic kernels cannot be
    partitioned automatically (jax 0.10.2), which is why splash.py wraps it in a shard_map."""
    texts = compiled_texts(mesh_text)
    assert sorted(texts) == ['auto', 'explicit', 'typed']
    for twin, text in texts.items():
        assert text.count('custom_call_target="tpu_custom_call"') >= 3, twin
        gathers = [line for line in text.splitlines() if ALL_GATHER.search(line)]
        assert gathers == [], (twin, gathers[:3])


@SLOW
@needs_libtpu
def test_under_fsdp_only_weights_are_gathered():
    """The check above can fail: fsdp:8 all-gathers its weights in every twin (the layers under
    jax.checkpoint in a scan: explicit/'s kernel traced again), and still none of q, k, v."""
    texts = compiled_texts('fsdp:8')
    for twin, text in texts.items():
        assert text.count('custom_call_target="tpu_custom_call"') >= 3, twin
        assert ALL_GATHER.search(text), twin
        assert activation_gathers(text) == [], twin
    assert activation_gathers('x = bf16[16,128,4,16]{3,2,1,0} all-gather(y), dimensions={0}')
