"""Claim: every twin's eval step gives the one-device run's per-example outputs, on every
strategy file and on a composed mesh, for both models. (The train CLIs evaluate with it; the
fuzzer found typed/'s fsdp and fsdp_tp eval steps and explicit/'s composed one on a mesh
without 'fsdp' failing after the plan was carried whole: these pin them.)"""

import jax
import numpy as np
import pytest
from flax import nnx

from parity_tests.helpers import TOL, assert_close, fresh_state, make_case
from shard_parity import auto, explicit, typed
from shard_parity import plan as plans
from shard_parity.mesh import mesh_for
from shard_parity.placement import place_batch, place_state
from shard_parity.runtime import tasks
from shard_parity.step import bind, strategy_file

TWINS = {'auto': auto, 'explicit': explicit, 'typed': typed}
EVAL = {'mlp': tasks.classification_eval, 'transformer': tasks.lm_eval}
MESHES = [  # (model, --mesh), the fast ones first: where the fuzzer found eval steps failing
    ('mlp', 'fsdp:8'),
    ('mlp', 'fsdp:4,model:2'),
    ('mlp', 'data:4,model:2'),  # composed below, a mesh without 'fsdp'
    ('mlp', 'data:8'),
    ('transformer', 'fsdp:8'),
    ('transformer', 'data:2,fsdp:2,model:2'),
]
FAST = {('mlp', 'fsdp:8'), ('mlp', 'fsdp:4,model:2'), ('mlp', 'data:4,model:2')}


@pytest.fixture(scope='module')
def one_device():
    cache = {}

    def get(model):
        if model not in cache:
            case = make_case(model)
            graphdef, _, state = fresh_state(case=case)
            batch = {k: v for k, v in case.batches.batch(0).items() if k != 'mask'}
            out = jax.jit(bind(graphdef, EVAL[model]))(state.params, batch)
            cache[model] = case, graphdef, state, batch, jax.device_get(out)
        return cache[model]

    return get


@pytest.mark.parametrize(
    'twin, model, text',
    [pytest.param(t, m, x, marks=[] if (m, x) in FAST else [pytest.mark.slow])
     for m, x in MESHES for t in TWINS],  # fmt: skip
    ids=[f'{t}-{m}-{x}' for m, x in MESHES for t in TWINS],
)
def test_the_eval_step_gives_the_one_device_outputs(twin, model, text, one_device):
    case, graphdef, state, batch, want = one_device(model)
    strategy = 'composed' if text == 'data:4,model:2' else None
    plan = plans.parse(text, strategy, 8)
    mesh = mesh_for(plan, TWINS[twin].AXIS_TYPE)
    evaluate = strategy_file(TWINS[twin], plan).eval_step(graphdef, EVAL[model], mesh, plan)
    placed = place_state(jax.tree.map(np.array, state), mesh, plan)
    got = jax.device_get(evaluate(placed.params, place_batch(batch, mesh, plan)))
    assert set(got) == set(want)
    for key in want:
        assert_close(np.asarray(got[key], np.float64), np.asarray(want[key], np.float64),
                     f'{twin} {text} {key}', **TOL)  # fmt: skip


def test_the_check_can_fail(one_device):
    """Another model's outputs are told apart: the comparison is not vacuous."""
    case, graphdef, state, batch, want = one_device('mlp')
    other = nnx.split(case.make_model(nnx.Rngs(1)))[1]
    got = jax.device_get(jax.jit(bind(graphdef, EVAL['mlp']))(other, batch))
    with pytest.raises(AssertionError):
        assert_close(got['loss'], want['loss'], 'another seed', **TOL)
