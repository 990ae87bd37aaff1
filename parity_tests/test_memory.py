"""Claim: FSDP holds 1/n of the model plus about one layer, in every twin: each added layer adds
at most a quarter of its own float32 weights to the compiled step's temporary memory (its
gradient shard, 1/n of it, and its input), where gathering the whole model up front adds all of
it. Read from XLA's memory_analysis() per device: compile only, nothing runs. The compiled
program shows why: the layers' all-gathers sit inside the scan's loop bodies, run once per
layer (the forward's, and the backward's re-gather beside the reduce-scatter). Beside it,
ZeRO-1 (--shard_optimizer_over_data) holds 1/n of AdamW's moments: the step's peak drops by
(1 - 1/n) of the optimizer state.
"""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from shard_parity import auto, explicit, memory, typed
from shard_parity import plan as plans
from shard_parity.mesh import make_mesh
from shard_parity.model.transformer import Transformer
from parity_tests.helpers import mesh_of, plan_of, strategy_mesh
from shard_parity.placement import mesh_axes, rows
from shard_parity import config as cfg
from shard_parity.runtime.tasks import lm_loss
from shard_parity.step import make_optimizer, strategy_file

TWINS = {'auto': auto, 'explicit': explicit, 'typed': typed}
SLOW = pytest.mark.slow
SMALL = cfg.TransformerConfig(seq_len=8, num_layers=1, num_heads=4, num_kv_heads=4, embed_dim=128)
# The issue's configuration: 101M parameters, one layer 48 MiB of float32.
ISSUE = cfg.TransformerConfig(seq_len=32, num_layers=8, num_heads=8, num_kv_heads=8, embed_dim=1024)


def step_memory(twin, strategy, model_config, layers, shape=(8, 1), batch_size=8,
                precision=None):  # fmt: skip
    """(measured MiB, compiled) of `twin`'s `strategy` train step at `layers` layers (under
    `precision`, a plan.Precision: its compute dtype the model's too)."""
    mesh = make_mesh(shape=shape, axes=mesh_axes(strategy), axis_type=TWINS[twin].AXIS_TYPE)
    dtype = {'dtype': precision.compute} if precision else {}
    mc = cfg.TransformerConfig(**{**cfg.to_dict(model_config), 'num_layers': layers, **dtype})
    plan = plan_of(mesh, strategy, **({'precision': precision} if precision else {}))
    sharding = NamedSharding(mesh, rows(plan))
    batch = {
        k: jax.ShapeDtypeStruct((batch_size, mc.seq_len), jnp.int32, sharding=sharding)
        for k in ('x', 'y')
    }
    compiled = memory.compiled_step(
        TWINS[twin].STRATEGIES[strategy],
        lambda rngs: Transformer(mc, rngs=rngs),
        lm_loss,
        make_optimizer(cfg.TrainConfig()),
        mesh,
        plan,
        batch,
    )
    return memory.measured(compiled), compiled


def loops(hlo: str) -> list[tuple[int, str]]:
    """(trip count, body text) of every while loop of an optimized HLO program."""
    bodies = dict(re.findall(r'^(?:ENTRY )?%(\S+) .*?\{\n(.*?)^\}', hlo, re.MULTILINE | re.DOTALL))
    found = re.findall(r' while\(.*?body=%([^,\s]+).*?known_trip_count":\{"n":"(\d+)"', hlo)
    return [(int(n), bodies[body]) for body, n in found]


def slope(twin, strategy, model_config, low, high, **kw):
    (a, _), (b, compiled) = (
        step_memory(twin, strategy, model_config, n, **kw) for n in (low, high)
    )
    return (b['temp'] - a['temp']) / (high - low), b, compiled


def layer_loops(compiled) -> list[tuple[int, int]]:
    """(trip count, all-gathers in the body) of each loop of `compiled` that all-gathers."""
    found = loops(compiled.as_text())
    return [(n, body.count('all-gather(')) for n, body in found if 'all-gather(' in body]


# Every twin and both strategies in the full suite; explicit fsdp (two compiles) in the fast tier.
CASES = [
    pytest.param(twin, strategy, marks=[] if (twin, strategy) == ('explicit', 'fsdp') else SLOW)
    for strategy in ('fsdp', 'fsdp_tp')
    for twin in TWINS
]


@pytest.mark.parametrize('twin, strategy', CASES)
def test_fsdp_temp_grows_by_a_fraction_of_a_layer(twin, strategy):
    shape = (8, 1) if strategy == 'fsdp' else (4, 2)
    layer = memory.expected(SMALL, plan_of(strategy_mesh(strategy, shape), strategy), 8)['layer']
    per_layer, _, compiled = slope(twin, strategy, SMALL, 1, 2, shape=shape)
    assert per_layer <= layer / 4, f'{twin}: {per_layer:.3f} MiB per layer, one layer {layer:.3f}'
    # the layer's all-gathers inside the forward's loop and the backward's, 2 trips each
    assert [n for n, _ in layer_loops(compiled)] == [2, 2], layer_loops(compiled)


@pytest.mark.slow
def test_gathering_everything_up_front_grows_by_a_whole_layer():
    """The measure can tell: dp holds the whole gradient, as FSDP did when it gathered all."""
    layer = memory.expected(SMALL, plan_of(strategy_mesh('dp'), 'dp'), 8)['layer']
    per_layer, _, _ = slope('auto', 'dp', SMALL, 1, 2)
    assert per_layer >= layer


@pytest.mark.slow
@pytest.mark.parametrize('twin', TWINS)
def test_the_issue_configuration_holds_about_one_layer(twin):
    """The issue's figures: 8 layers of width 1024, --strategy=fsdp --mesh=8x1, global batch 8:
    temp at most 200 MiB at 8 layers (the whole model is 385 MiB), and a quarter layer per
    added layer (measured: explicit and typed 6.1 MiB, auto 10.1; one layer is 48 MiB)."""
    layer = memory.expected(ISSUE, plan_of(strategy_mesh('fsdp'), 'fsdp'), 8)['layer']
    per_layer, at_8, _ = slope(twin, 'fsdp', ISSUE, 4, 8)
    assert per_layer <= layer / 4 and at_8['temp'] <= 200, (per_layer, at_8)


@pytest.mark.slow  # four compiles: ~4 s
def test_on_the_cpu_bf16_gathers_hold_float32s_memory():
    """Issue 41, item 6: fsdp's gathers move bf16 under --dtype=bfloat16 (half the bytes:
    test_dtype_audit), but XLA:CPU carries a bf16 all-gather in f32 (float-normalization-bf16),
    so the gathered layer takes float32's room here and the formula's float32 `layer` is what
    this CPU holds: per added layer the same temp in both precisions (the issue's 101M
    configuration: 6.126 MiB, a quarter layer or less), and at 8 layers within 2%."""
    f32, bf16 = (
        slope('explicit', 'fsdp', ISSUE, 4, 8, precision=plans.Precision(compute=dtype))
        for dtype in ('float32', 'bfloat16')
    )
    layer = memory.expected(ISSUE, plan_of(strategy_mesh('fsdp'), 'fsdp'), 8)['layer']
    assert f32[0] == bf16[0] <= layer / 4, (f32[0], bf16[0], layer)
    assert abs(bf16[1]['temp'] - f32[1]['temp']) <= 0.02 * f32[1]['temp'], (f32[1], bf16[1])


# ZeRO-1 (docs/zero1.md): AdamW's moments over 'data', the params whole. The transformer's
# 2 layers of width 256 (6.3 MiB of float32 params, 12.6 MiB of moments) on data:8.
ZERO1 = cfg.TransformerConfig(seq_len=32, num_layers=2, num_heads=8, num_kv_heads=8, embed_dim=256)


def zero1_memory(twin, zero1: bool):
    """(measured MiB, each device's state in MiB) of `twin`'s step for --mesh=data:8, with
    --shard_optimizer_over_data or without (dp.py)."""
    mesh = mesh_of('data:8', TWINS[twin])
    plan = plans.parse('data:8', None, 8, zero1=zero1)
    make_model, tx = (lambda rngs: Transformer(ZERO1, rngs=rngs)), make_optimizer(cfg.TrainConfig())
    sharding = NamedSharding(mesh, rows(plan))
    batch = {k: jax.ShapeDtypeStruct((8, 32), jnp.int32, sharding=sharding) for k in ('x', 'y')}
    module = strategy_file(TWINS[twin], plan)
    compiled = memory.compiled_step(module, make_model, lm_loss, tx, mesh, plan, batch)
    _, state = memory.abstract_state(make_model, tx, mesh, plan)
    return memory.measured(compiled), memory.state_bytes(state, mesh, plan) / memory.MiB


@pytest.mark.parametrize('twin', [pytest.param('auto'), pytest.param('explicit', marks=SLOW),
                                  pytest.param('typed', marks=SLOW)])  # fmt: skip
def test_zero1_peak_drops_by_the_moments_share(twin):
    """Beside FSDP's 1/n of everything, ZeRO-1 splits only the moments: each device's state
    drops by (1 - 1/n) of AdamW's state (all of this model's arrays split over 8), and so does
    the compiled step's peak, not only its memory at rest: within 5% in auto and typed (measured
    0.25% and 0%). explicit's peak drops by more (measured 1.31x): its temp falls too, by 3.4 of
    its 12.6 MiB, as the all-gather's shard_map lets XLA reuse a buffer the others keep."""
    (base, base_state), (zero, zero_state) = zero1_memory(twin, False), zero1_memory(twin, True)
    params = nnx.state(nnx.eval_shape(lambda: Transformer(ZERO1, rngs=nnx.Rngs(0))))
    moments = 2 * sum(x.size * 4 for x in jax.tree.leaves(params)) / memory.MiB  # mu, nu: f32
    want = (1 - 1 / 8) * moments
    assert abs((base_state - zero_state) - want) <= 1e-6 * want, (base_state, zero_state, want)
    assert abs((base['arguments'] - zero['arguments']) - want) <= 0.01 * want, (base, zero)
    drop = base['peak'] - zero['peak']
    if twin == 'explicit':
        assert drop >= 0.95 * want, (drop, want)
    else:
        assert abs(drop - want) <= 0.05 * want, (drop, want)
