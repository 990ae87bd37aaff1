"""Every test process runs on 8 emulated CPU devices, configured before anything starts JAX.

The twins are compared with XLA's fused multiply-adds off (shard_parity/mesh.py explains why);
tests that run the train CLIs in subprocesses get the same settings from the CLI's defaults.
"""

import dataclasses
import os
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
import pytest
from flax import nnx

from shard_parity import config as cfg
from shard_parity import tasks
from shard_parity.mesh import configure_jax, make_mesh
from shard_parity.models import MLP
from shard_parity.step import create_state, make_optimizer
from shard_parity.transformer import Transformer

# Importing JAX does not start its backend; the first computation does. None has run yet.
configure_jax(8)

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


@pytest.fixture(scope='session')
def mesh8():
    assert jax.device_count() == 8, 'conftest asks for 8 CPU devices before JAX starts'
    return make_mesh(8)


TINY_TRANSFORMER = cfg.TransformerConfig(
    seq_len=16, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32
)


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


@pytest.fixture(scope='session', params=['mlp', 'transformer'])
def case(request):
    return make_case(request.param)


@pytest.fixture(scope='session')
def mnist_batches():
    return make_case('mlp').batches


def fresh_state(seed=0, case: Case | None = None):
    """(graphdef, tx, TrainState) of a newly initialised model (the MLP unless `case` says):
    host-side numpy copies, so that a twin's donated step can never delete the arrays that
    another twin or the reference still uses."""
    make_model = case.make_model if case else (lambda rngs: MLP(cfg.MLPConfig(), rngs=rngs))
    tx = make_optimizer(case.config if case else cfg.TrainConfig())
    graphdef, state = create_state(make_model(nnx.Rngs(seed)), tx)
    return graphdef, tx, jax.tree.map(np.array, state)


def logits(graphdef, params, tokens, device=None):
    """The model's logits for `tokens`, as numpy. With `device`, the params are first copied to
    that one device, so that differently placed params run the very same program."""
    if device is not None:
        params = jax.device_put(params, device)
    return np.asarray(jax.jit(lambda p, x: nnx.merge(graphdef, p)(x)[0])(params, tokens))


def save_checkpoint(workdir, state, case: Case, model_config=TINY_TRANSFORMER):
    """Saves `state` as the train CLI would, with the config that rebuilds it."""
    from shard_parity import checkpoint

    saved = {
        'model': case.name,
        'model_config': cfg.to_dict(model_config),
        'train': cfg.to_dict(case.config),
    }
    with checkpoint.manager(workdir) as mngr:
        checkpoint.save(mngr, state, saved)
        mngr.wait_until_finished()
