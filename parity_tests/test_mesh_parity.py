"""Claim: on a 2-D mesh (AxB: data x model, fsdp x model for fsdp and fsdp_tp), every strategy
(dp, fsdp, tp, fsdp_tp) in every twin gives the one-device run's loss and gradients (float32),
and 20 AdamW steps track it (the same steps in float64, every loss and parameter: helpers.py's
error model), for the MLP and the transformer (8 heads, so that 8 model devices get one each).
dp and fsdp on the 1-D 8x1 mesh are in test_gradient_parity, test_training_parity, test_fsdp."""

import dataclasses

import jax
import numpy as np
import pytest

from parity_tests.helpers import (
    TOL,
    TP_TRANSFORMER,
    X64_TOL,
    assert_close,
    assert_params_close,
    assert_trees_close,
    fresh_state,
    make_case,
    strategy_mesh,
    twin_loss_and_grads,
)
from parity_tests.wide import one_device_runs, train_twin_x64
from shard_parity import auto, explicit, typed
from shard_parity.mesh import MODEL, make_mesh
from shard_parity.model import attention
from shard_parity import config as cfg
from shard_parity.step import one_device_loss_and_grads

# TP_TRANSFORMER (helpers.py): 8 query and 8 key/value heads, split over up to 8 'model'
# devices. GQA (2 key/value heads per 8 query heads) runs on the 4x2 mesh below.
GQA_TRANSFORMER = cfg.TransformerConfig(
    seq_len=16, num_layers=1, num_heads=8, num_kv_heads=2, embed_dim=32
)
# Blockwise ("fused") attention, whose loop carries must vary over the right mesh axes inside
# shard_map; the tests cut its key blocks to 8, so that 16 positions take two blocks.
FUSED_TRANSFORMER = dataclasses.replace(TP_TRANSFORMER, attention='fused')
GRID = [
    ('dp', (4, 2)),
    ('dp', (2, 4)),
    ('fsdp', (4, 2)),
    ('fsdp', (2, 4)),
    ('tp', (8, 1)),
    ('tp', (4, 2)),
    ('tp', (2, 4)),
    ('tp', (1, 8)),
    ('fsdp_tp', (8, 1)),
    ('fsdp_tp', (4, 2)),
    ('fsdp_tp', (2, 4)),
]
TWINS = {'auto': auto, 'explicit': explicit, 'typed': typed}
SLOW = pytest.mark.slow
EXHAUSTIVE = pytest.mark.exhaustive  # 20 steps on the rest of the grid: its one step is checked


CASES = [(model, s, shape) for model in ('mlp', 'transformer') for s, shape in GRID] + [
    ('gqa', 'tp', (4, 2)),  # 2 key/value heads: one per model device
    ('gqa', 'fsdp_tp', (4, 2)),
    ('fused', 'tp', (2, 4)),  # both axes: 2-way data, heads split 4 ways
]
# The fast tier (-m "not slow") keeps one mesh with both axes split per strategy that splits
# layers or state, for both models, and fused attention (dp is test_gradient_parity's and
# test_training_parity's); the rest of the grid runs in the full suite.
FAST = {(m, 'tp', (4, 2)) for m in ('mlp', 'transformer')}
FAST |= {(m, s, (2, 4)) for m in ('mlp', 'transformer') for s in ('fsdp', 'fsdp_tp')}
FAST |= {('fused', 'tp', (2, 4))}  # GQA under tp: the full suite (test_cp trains GQA fast)
PARAMS = [
    pytest.param(*c, id=f'{c[0]}-{c[1]}-{c[2][0]}x{c[2][1]}', marks=[] if c in FAST else [SLOW])
    for c in CASES
]


@pytest.fixture(scope='module')
def one_device():
    """model -> (case, one-device metrics, gradients, 20-step float64 run), computed once each."""
    cache = {}

    def get(model):
        if model not in cache:
            config = {
                'transformer': TP_TRANSFORMER,
                'gqa': GQA_TRANSFORMER,
                'fused': FUSED_TRANSFORMER,
            }.get(model)
            case = make_case('mlp') if model == 'mlp' else make_case('transformer', config)
            graphdef, _, state = fresh_state(case=case)
            batch = case.batches.batch(0)
            metrics, grads = one_device_loss_and_grads(graphdef, case.loss_fn)(state.params, batch)
            cache[model] = case, metrics, grads, one_device_runs(case)[1]
        return cache[model]

    return get


@pytest.mark.parametrize('model', ['mlp', 'transformer'])
def test_averaging_instead_of_summing_the_partials_is_caught(model, one_device, monkeypatch):
    """The comparison can fail: a pmean where explicit/tp.py sums the row-parallel partial
    sums (a plausible slip: it is the right collective for gradients) changes the loss."""
    case, want_metrics, _, _ = one_device(model)
    graphdef, _, state = fresh_state(case=case)
    monkeypatch.setattr(explicit.tp, 'sum_partials', lambda y: jax.lax.pmean(y, MODEL))
    mesh, batch = make_mesh(shape=(4, 2)), case.batches.batch(0)
    metrics, _ = twin_loss_and_grads(explicit, mesh, graphdef, case.loss_fn, state, batch, 'tp')
    assert not np.allclose(metrics['loss'], want_metrics['loss'], **TOL)


def test_forgetting_the_psum_is_refused_by_shard_map(one_device, monkeypatch):
    """Left unsummed, the partial sums vary over 'model', and shard_map's varying-axes check
    refuses a loss declared the same on every device (out_specs P())."""
    case, _, _, _ = one_device('mlp')
    graphdef, _, state = fresh_state(case=case)
    monkeypatch.setattr(explicit.tp, 'sum_partials', lambda y: y)  # no psum at all
    mesh, batch = make_mesh(shape=(4, 2)), case.batches.batch(0)
    with pytest.raises(ValueError, match='varying over {model}'):
        twin_loss_and_grads(explicit, mesh, graphdef, case.loss_fn, state, batch, 'tp')


# typed's 25 cases take about 5 minutes on 2 cores: the slow tier (test_typed.py keeps a few fast).
@pytest.mark.parametrize('name', ['auto', 'explicit', pytest.param('typed', marks=SLOW)])
@pytest.mark.parametrize('model, strategy, shape', PARAMS)
def test_strategy_matches_the_one_device_run(name, model, strategy, shape, one_device, monkeypatch):
    """One step in float32: the loss and every gradient leaf."""
    monkeypatch.setattr(attention, 'KEY_BLOCK', 8)  # two blocks of keys for 'fused'
    case, want_metrics, want_grads, _ = one_device(model)
    twin = TWINS[name]
    mesh = strategy_mesh(strategy, shape, twin)
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    metrics, grads = twin_loss_and_grads(twin, mesh, graphdef, case.loss_fn, state, batch, strategy)
    assert_close(metrics['loss'], want_metrics['loss'], 'loss', **TOL)
    assert_trees_close(grads, want_grads, **TOL)


# 20 steps cost a second compile of each case, so the fast tier trains the reference twin alone
# (explicit: every collective written out) on its meshes; auto and typed train in the full suite,
# and test_training_parity trains auto fast (dp on 8).
TRAIN_PARAMS = [
    pytest.param(
        name,
        *c,
        id=f'{name}-{c[0]}-{c[1]}-{c[2][0]}x{c[2][1]}',
        marks=[] if c in FAST and name == 'explicit' else [SLOW] if c in FAST else [SLOW, EXHAUSTIVE],
    )
    for name in TWINS
    for c in CASES
]


@pytest.mark.parametrize('name, model, strategy, shape', TRAIN_PARAMS)
def test_strategy_trains_like_the_one_device_run(
    name, model, strategy, shape, one_device, monkeypatch
):
    """20 AdamW steps in float64: every loss and parameter (helpers.py's error model)."""
    monkeypatch.setattr(attention, 'KEY_BLOCK', 8)
    case, _, _, (want_losses, want_params) = one_device(model)
    twin = TWINS[name]
    mesh = strategy_mesh(strategy, shape, twin)
    losses, params = train_twin_x64(twin, mesh, case, strategy=strategy)
    assert_close(losses, want_losses, 'float64 losses', **X64_TOL)
    assert_params_close(params, want_params, **X64_TOL)
