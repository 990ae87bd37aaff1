"""The same runs in float64 (helpers.X64_TOL's error model): jax.enable_x64 for the run alone,
and the one-device run's float32 and float64 trajectories, computed once per test process.
Test modules import from here and helpers.py, never from each other."""

import dataclasses

import jax
import numpy as np
from flax import nnx

from parity_tests.helpers import Case, fresh_state, plan_of, train
from shard_parity import config as cfg
from shard_parity.model.mlp import MLP
from shard_parity.placement import place_batch, place_state
from shard_parity.step import TrainState, make_optimizer, one_device_train_step, strategy_file


class Wide:
    """A case's batches with every float32 array as float64 (the MLP's images)."""

    def __init__(self, batches):
        self.batches = batches

    def batch(self, i):
        wide = lambda x: x.astype(np.float64) if x.dtype == np.float32 else x  # noqa: E731
        return jax.tree.map(wide, self.batches.batch(i))


def x64_state(case: Case, seed=0):
    """(graphdef, tx, TrainState) as `fresh_state`, with float64 parameters and optimizer state
    and float64 compute (and gradients). Call it under jax.enable_x64(True)."""
    wide = dict(dtype='float64', reduce_dtype='float64')
    if case.model_config is not None:
        from shard_parity.model.transformer import Transformer

        model_config = dataclasses.replace(case.model_config, **wide)
        make_model = lambda rngs: Transformer(model_config, rngs=rngs)  # noqa: E731
    else:
        make_model = lambda rngs: MLP(cfg.MLPConfig(**wide), rngs=rngs)  # noqa: E731
    graphdef, params = nnx.split(make_model(nnx.Rngs(seed)))
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    tx = make_optimizer(case.config)
    state = TrainState(np.zeros((), np.int32), params, jax.tree.map(np.array, tx.init(params)))
    return graphdef, tx, state


def one_device_x64(case: Case, seed=0):
    """STEPS one-device steps in float64: (losses, params)."""
    with jax.enable_x64(True):
        graphdef, tx, state = x64_state(case, seed)
        step = one_device_train_step(graphdef, case.loss_fn, tx)
        return train(step, state, Wide(case.batches))


_ONE_DEVICE_RUNS: dict = {}


def one_device_runs(case: Case, seed=0):
    """The one-device run's STEPS steps in float32 and in float64, ((losses, params), (losses,
    params)), computed once per test process for each case: test_training_parity, test_fsdp,
    test_cp and test_mesh_parity all compare against them. The key holds everything the
    one-device run depends on; a test that patches the model itself must not use this."""
    from shard_parity.model import attention

    key = case.name, case.model_config, seed, attention.KEY_BLOCK
    if key not in _ONE_DEVICE_RUNS:
        graphdef, tx, state = fresh_state(seed, case)
        float32 = train(one_device_train_step(graphdef, case.loss_fn, tx), state, case.batches)
        _ONE_DEVICE_RUNS[key] = float32, one_device_x64(case, seed)
    return _ONE_DEVICE_RUNS[key]


def train_twin_x64(twin, mesh, case, seed=0, strategy='dp', **options):
    """`train_twin` in float64: (losses, params)."""
    with jax.enable_x64(True):
        graphdef, tx, state = x64_state(case, seed)
        plan = plan_of(mesh, strategy, **options).in_float64()
        step = strategy_file(twin, plan).train_step(graphdef, case.loss_fn, tx, mesh, plan)
        placed = place_state(state, mesh, plan)
        return train(step, placed, Wide(case.batches), lambda b: place_batch(b, mesh, plan))
