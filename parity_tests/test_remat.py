"""Claim: --remat_policy changes what a train step keeps for its backward, not what it computes.
Under every policy (none, full, dots, dots_no_batch, and unset) the loss and every gradient leaf
equal `full`'s on one device and on data:2,fsdp:2,model:2 in each twin, where another seed's
differ (float32: TOL; which are bitwise on XLA:CPU is docs/remat.md's); the compiled step's temp
memory (XLA:CPU's memory_analysis(), deterministic) orders none >= dots >= dots_no_batch >= full,
none well above full, on one device, under fsdp and in both pipeline schedules, so every path
honours the policy, and unset it is each path's old policy; a config.json from before the field
builds the same model and resumes under any policy. benchmarks/remat.py's fit search, compiled
from shapes for a TPU v5e chip (--target=tpu-v5e-1, libtpu), finds the exact largest batch
within a budget and takes the TPU compiler's refusal of a batch its HBM cannot hold."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from parity_tests.helpers import (
    TINY_TRANSFORMER,
    TOL,
    assert_trees_close,
    fresh_state,
    make_case,
    mesh_of,
    plan_of,
)
from shard_parity import auto, explicit, memory, typed
from shard_parity import config as cfg
from shard_parity import plan as plans
from shard_parity.devices import libtpu_installed
from shard_parity.mesh import mesh_for
from shard_parity.model.transformer import REMAT_POLICIES, Transformer
from shard_parity.placement import place_batch, place_state, rows
from shard_parity.runtime import saved, tasks
from shard_parity.step import make_optimizer, one_device_loss_and_grads, strategy_file

POLICIES = [None, *REMAT_POLICIES]  # None: unset, each path as before the flag
TWINS = {'auto': auto, 'explicit': explicit, 'typed': typed}
COMPOSED = 'data:2,fsdp:2,model:2'
# one fast case per twin, each another policy; the rest in the slow tier
FAST = {('auto', 'dots'), ('explicit', 'dots_no_batch'), ('typed', 'none')}
GRID = [(t, p) for t in TWINS for p in REMAT_POLICIES if p != 'full']
CASES = [pytest.param(*c, marks=[] if c in FAST else [pytest.mark.slow]) for c in GRID]


@pytest.fixture(scope='module')
def one_device():
    """(policy, seed) -> (case, graphdef, state, metrics, grads) of the one-device step, each
    computed once."""
    cache = {}

    def get(policy, seed=0):
        if (policy, seed) not in cache:
            case = make_case(
                'transformer', dataclasses.replace(TINY_TRANSFORMER, remat_policy=policy)
            )
            graphdef, _, state = fresh_state(seed, case)
            fn = one_device_loss_and_grads(graphdef, case.loss_fn)
            cache[policy, seed] = (case, graphdef, state, *fn(state.params, case.batches.batch(0)))
        return cache[policy, seed]

    return get


def test_another_seed_gives_other_gradients(one_device):
    """The comparison can fail: `full` from seed 1's parameters is far outside TOL of seed 0's."""
    *_, grads = one_device('full')
    *_, other = one_device('full', seed=1)
    with pytest.raises(AssertionError):
        assert_trees_close(other, grads, **TOL)


@pytest.mark.parametrize('policy', [p for p in POLICIES if p != 'full'], ids=str)
def test_each_policy_gives_fulls_loss_and_gradients_on_one_device(policy, one_device):
    *_, want_metrics, want_grads = one_device('full')
    *_, metrics, grads = one_device(policy)
    assert_trees_close(metrics, want_metrics, **TOL)
    assert_trees_close(grads, want_grads, **TOL)


@pytest.mark.parametrize('name, policy', CASES, ids=[f'{t}-{p}' for t, p in GRID])
def test_each_policy_gives_fulls_loss_and_gradients_on_a_composed_mesh(name, policy, one_device):
    """data:2,fsdp:2,model:2 in each twin (its composed.py) against the one-device `full` run."""
    *_, want_metrics, want_grads = one_device('full')
    case, graphdef, state, _, _ = one_device(policy)
    twin = TWINS[name]
    mesh = mesh_of(COMPOSED, twin)
    plan = plan_of(mesh, 'composed')
    fn = twin.composed.loss_and_grads(graphdef, case.loss_fn, mesh, plan)
    placed = place_state(jax.tree.map(np.array, state), mesh, plan)
    metrics, grads = fn(placed.params, place_batch(case.batches.batch(0), mesh, plan))
    assert_trees_close(metrics, want_metrics, **TOL)
    assert_trees_close(grads, want_grads, **TOL)


# 4 layers of width 64, 32 positions, batch 16: activations well above the state
MEMORY = cfg.TransformerConfig(seq_len=32, num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=64)
PATHS = {  # name -> (plan, the policy unset means there)
    'one device': (plans.parse(None, 'dp', 1), 'none'),
    'fsdp': (plans.parse(None, 'fsdp', 8), 'full'),
    'gpipe': (plans.parse('data:4,stage:2', None, 8, microbatches=2), 'none'),
    '1f1b': (plans.parse('data:4,stage:2', None, 8, microbatches=2, schedule='1f1b'), 'none'),
}


def temp(plan, policy) -> float:
    """MiB of XLA temporaries in auto's compiled train step of MEMORY under `policy`."""
    mc = dataclasses.replace(MEMORY, remat_policy=policy)
    mesh = mesh_for(plan, auto.AXIS_TYPE)
    sharding = NamedSharding(mesh, rows(plan))
    batch = {k: jax.ShapeDtypeStruct((16, mc.seq_len), jnp.int32, sharding=sharding) for k in 'xy'}
    compiled = memory.compiled_step(
        strategy_file(auto, plan), lambda r: Transformer(mc, rngs=r), tasks.lm_loss,
        make_optimizer(cfg.TrainConfig()), mesh, plan, batch,
    )  # fmt: skip
    return memory.measured(compiled)['temp']


@pytest.mark.parametrize(
    'path', [pytest.param(p, marks=[] if p == 'one device' else [pytest.mark.slow]) for p in PATHS]
)
def test_temp_memory_orders_none_dots_dots_no_batch_full(path):
    """Measured (MiB): one device 15.3 >= 9.8 >= 8.0 >= 5.2; fsdp 3.1, 1.5, 1.3, 0.9; gpipe
    4.6, 3.0, 1.7, 1.7; 1f1b 3.6, 2.8, 2.6, 2.2. Unset is the path's old policy to the byte
    (fsdp: full; the unrolled layers and the pipelines: none)."""
    plan, old = PATHS[path]
    t = {p: temp(plan, p) for p in POLICIES}
    assert t['none'] >= t['dots'] >= t['dots_no_batch'] >= t['full'], t
    assert t['none'] > 1.5 * t['full'], t  # the ordering is not a tie
    assert t[None] == t[old], t


def test_a_config_json_without_the_field_builds_and_resumes_under_any_policy():
    """A checkpoint's config.json written before --remat_policy (no key): the model it builds
    is unset (each path as before); a run asking any policy resumes it,
    while another shape is still refused (the check can fail)."""
    old = {'model': 'transformer', 'model_config': cfg.to_dict(TINY_TRANSFORMER)}
    old['model_config'].pop('remat_policy')
    old['train'] = cfg.to_dict(cfg.TRAIN_DEFAULTS['transformer'])
    model = saved.build_model(old, nnx.Rngs(0))
    assert model.cfg.remat_policy is None
    for policy in POLICIES:
        asked = dataclasses.replace(TINY_TRANSFORMER, remat_policy=policy)
        saved.check_compatible(old, {**old, 'model_config': cfg.to_dict(asked)})
    wider = dataclasses.replace(TINY_TRANSFORMER, embed_dim=64)
    with pytest.raises(Exception, match='--embed_dim: checkpoint 32, requested 64'):
        saved.check_compatible(old, {**old, 'model_config': cfg.to_dict(wider)})


def test_an_unknown_policy_in_a_config_is_refused():
    with pytest.raises(Exception, match='--remat_policy=some is not one of none, full, dots'):
        dataclasses.replace(TINY_TRANSFORMER, remat_policy='some')


@pytest.mark.slow  # 5.5 minutes on 2 shared cores: 5 or so compiles for the TPU
@pytest.mark.exhaustive  # the README's suite is at 25 of its 30 minutes: the opt-in tier runs it
@pytest.mark.skipif(
    not libtpu_installed(), reason='libtpu is not installed: pip install -e ".[tpu]"'
)
def test_the_fit_search_compiled_for_a_tpu_from_shapes_brackets_the_largest_batch():
    """benchmarks.remat --target=tpu-v5e-1's search (the TPU compiler on this host): with a
    budget halfway between none's bytes (the TPU compiler's peak) at batches 16 and 32, the
    largest batch that fits is exact, its bytes within the budget and the next batch's above; a
    batch no chip holds is the compiler's own refusal, naming the v5e's 15.75G of HBM."""
    from benchmarks import remat
    from shard_parity.inspector import target as targets

    devices = targets.devices('tpu-v5e-1')
    plan = plans.parse(None, 'dp', 1)
    with targets.uncached():
        first = {b: remat.compile_or_refusal(remat.lowered('none', MEMORY, b, plan, devices),
                                             tpu=True)[1] for b in (16, 32)}  # fmt: skip
        budget = (first[16]['bytes'] + first[32]['bytes']) / 2
        found = remat.fit(MEMORY, budget, [16, 32], 16, 0, 1, math.inf, {'none': 'none'},
                          lambda _: None, None, devices)['none']  # fmt: skip
        huge = remat.compile_or_refusal(remat.lowered('full', MEMORY, 2**21, plan, devices))
    assert found['compiles'][16] == first[16] and found['compiles'][32] == first[32]
    assert found['exact'] and 16 < found['largest_fitting'] < 32, found
    fits, over = (found['compiles'][found[k]] for k in ('largest_fitting', 'smallest_not'))
    assert fits['bytes'] <= budget < over['bytes'], (fits, over, budget)
    assert fits['bytes'] == fits['compiler_peak'] * memory.MiB  # on a TPU: the compiler's peak
    assert huge[0] is None and 'of HBM available' in huge[1]['does_not_fit'], huge[1]
    assert '15.75G' in huge[1]['does_not_fit'], huge[1]


def test_the_fit_search_halves_where_the_line_would_walk_a_batch_at_a_time():
    """benchmarks.remat's next batches: the line through the two largest measured, while it
    lands strictly between the largest that fits and the smallest that does not; the batch
    halfway once it does not (a TPU compiler squeezing a step near its HBM bends the line:
    GPT-2-small, none, 39 -> 40 rows added 4.7 MiB, where 32 -> 39 added 320 a row, and the
    line then walked down from 392 one refused batch at a time); none once exact."""
    from benchmarks.remat import largest, next_batches

    seen = {16: {'bytes': 7.0}, 32: {'bytes': 13.0}, 39: {'bytes': 15.0}, 40: {'bytes': 15.01}}
    assert next_batches(seen, 16.0) == [139, 140]  # the line, no refusal yet
    seen[139] = {'does_not_fit': 'needs 30G'}
    assert next_batches(seen, 16.0) == [89]  # the line says 139 again: halfway instead
    seen |= {89: {'does_not_fit': 'x'}, 64: {'bytes': 15.9}, 65: {'bytes': 16.1}}
    assert next_batches(seen, 16.0) == [] and largest(seen, 16.0)['largest_fitting'] == 64
