"""What the tests share: tiny models and their cases, tolerances, one-device and twin runners,
the CLI runner. Test modules import from here, never from each other."""

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from flax import nnx

from shard_parity.model.mlp import MLP
from shard_parity.placement import place_batch, place_state
from shard_parity.runtime import config as cfg
from shard_parity.runtime import tasks
from shard_parity.step import create_state, make_optimizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small versions of both models for tests that run the train CLIs as subprocesses.
CLI_MODELS = {
    'mlp': ['--model=mlp', '--batch_size=64'],
    'transformer': [
        '--model=transformer',
        '--seq_len=16',
        '--num_layers=1',
        '--num_heads=2',
        '--embed_dim=16',
        '--batch_size=16',
        '--warmup_steps=2',
    ],
}

TINY_TRANSFORMER = cfg.TransformerConfig(
    seq_len=16, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32
)
# 8 heads of 4 dims, width 32: up to 8 'model' devices get whole heads. One block: every layer
# kind, half the compile time (the tensor-parallel tests of test_mesh_parity.py and test_tp.py).
TP_TRANSFORMER = cfg.TransformerConfig(
    seq_len=16, num_layers=1, num_heads=8, num_kv_heads=8, embed_dim=32
)

# float32 round-off: one gradient or loss against another computed in another order.
TOL = dict(rtol=1e-5, atol=1e-6)

STEPS = 20
# Summing 2, 4 or 8 partial gradients rounds differently from one sum over the batch, and AdamW
# divides by sqrt(v), which turns last-bit differences in near-zero gradients into visible ones.
# Measured after 20 steps (jax 0.10.2, 8 emulated CPU devices) against the one-device run: MLP
# losses within 2.5e-7 relative and params within 1.4e-5 absolute; transformer within 2.9e-7 and
# 1.2e-7. With one device, exactly equal.
LOSS_TOL = dict(rtol=1e-5, atol=0)
PARAM_TOL = dict(rtol=1e-4, atol=5e-5)


class Case(NamedTuple):
    """One model as the parity tests see it: how to build it, its loss, and its batches."""

    name: str
    make_model: Callable  # rngs -> nnx.Module
    loss_fn: Callable
    batches: Any  # .batch(step) -> dict of host arrays
    config: cfg.TrainConfig


def make_case(name: str, model_config=TINY_TRANSFORMER) -> Case:
    import datasets
    from datasets import batches, mnist, shakespeare
    from shard_parity.model.transformer import Transformer

    root = datasets.data_root()
    if name == 'mlp':
        images, labels = mnist.load(root)['train']
        return Case(
            name,
            lambda rngs: MLP(cfg.MLPConfig(), rngs=rngs),
            tasks.classification_loss,
            batches.ClassificationBatches(images, labels, 64, seed=0),
            cfg.TrainConfig(),
        )
    train, _ = shakespeare.load(root)
    # nanoGPT's recipe, with warm-up and decay shortened to fit 20 test steps.
    config = dataclasses.replace(cfg.TRAIN_DEFAULTS['transformer'], steps=20, warmup_steps=5)
    return Case(
        name,
        lambda rngs: Transformer(model_config, rngs=rngs),
        tasks.lm_loss,
        batches.LanguageModelBatches(train, 16, model_config.seq_len, seed=0),
        config,
    )


def fresh_state(seed=0, case: Case | None = None):
    """(graphdef, tx, TrainState) of a newly initialised model (the MLP unless `case` says):
    host-side numpy copies, so that a twin's donated step can never delete the arrays that
    another twin or the one-device run still uses."""
    make_model = case.make_model if case else (lambda rngs: MLP(cfg.MLPConfig(), rngs=rngs))
    tx = make_optimizer(case.config if case else cfg.TrainConfig())
    graphdef, state = create_state(make_model(nnx.Rngs(seed)), tx)
    return graphdef, tx, jax.tree.map(np.array, state)


def assert_trees_close(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


def twin_loss_and_grads(twin, mesh, graphdef, loss_fn, state, batch, strategy='dp'):
    """(metrics, grads) of one `twin.STRATEGIES[strategy]` loss_and_grads call on `mesh`."""
    fn = twin.STRATEGIES[strategy].loss_and_grads(graphdef, loss_fn, mesh)
    placed = place_state(jax.tree.map(np.array, state), mesh, strategy)
    return fn(placed.params, place_batch(batch, mesh))


def train(step_fn, state, batches, place=lambda b: b):
    """STEPS steps of `step_fn`: (losses, final params as numpy)."""
    losses = []
    for i in range(STEPS):
        state, metrics = step_fn(state, place(batches.batch(i)))
        losses.append(float(metrics['loss']))
    return np.array(losses), [np.asarray(p) for p in jax.tree.leaves(state.params)]


def train_twin(twin, mesh, case, seed=0, strategy='dp'):
    graphdef, tx, state = fresh_state(seed, case)
    step_fn = twin.STRATEGIES[strategy].train_step(graphdef, case.loss_fn, tx, mesh)
    placed = place_state(state, mesh, strategy)
    return train(step_fn, placed, case.batches, lambda b: place_batch(b, mesh))


def device0_bytes(state):
    """Bytes of the state held by the first device: what FSDP divides."""
    d0 = jax.devices()[0]
    return sum(
        s.data.nbytes
        for x in jax.tree.leaves(state)
        for s in x.addressable_shards
        if s.device == d0
    )


def logits(graphdef, params, tokens, device=None):
    """The model's logits for `tokens`, as numpy. With `device`, the params are first copied to
    that one device, so that differently placed params run the very same program. They go
    through the host: copied device to device, an array of an Explicit mesh (typed/) keeps that
    mesh's sharding in its type (jax 0.10.2), and one device's program would then refuse it."""
    if device is not None:
        params = jax.device_put(jax.device_get(params), device)
    return np.asarray(jax.jit(lambda p, x: nnx.merge(graphdef, p)(x)[0])(params, tokens))


def save_checkpoint(workdir, state, case: Case, model_config=TINY_TRANSFORMER):
    """Saves `state` as the train CLI would, with the config that rebuilds it."""
    from shard_parity.runtime import checkpoint

    saved = {
        'model': case.name,
        'model_config': cfg.to_dict(model_config),
        'train': cfg.to_dict(case.config),
    }
    with checkpoint.manager(workdir) as mngr:
        checkpoint.save(mngr, state, saved)
        mngr.wait_until_finished()


def run_cli(twin, *flags, timeout=240, program='train'):
    """`python -m <twin>.<program> <flags>` in a subprocess, from the repository root."""
    return subprocess.run(
        [sys.executable, '-m', f'{twin}.{program}', *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,  # a deadlocked all-reduce aborts after 40 s; never wait forever
        env=dict(os.environ, PYTHONUNBUFFERED='1'),
    )


def read_metrics(workdir):
    return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


def inspect_collectives(model='mlp', strategy='dp', mesh=(8, 1), batch_size=None, **shape):
    """What `python -m parity_tests.collectives --json` prints, computed in this process: the
    collectives of each compiled train step. `shape`: TransformerConfig fields."""
    from inspector.twins import inspect
    from shard_parity.mesh import make_mesh
    from shard_parity.placement import mesh_axes

    config = cfg.TRAIN_DEFAULTS[model]
    if batch_size is not None:
        config = dataclasses.replace(config, batch_size=batch_size)
    model_config = cfg.TransformerConfig(**shape)
    report = inspect(
        model, config, make_mesh(shape=mesh, axes=mesh_axes(strategy)), strategy, model_config
    )
    return json.loads(json.dumps(report))  # as the CLI's JSON: tuples become lists
