"""Every test process runs on 8 emulated CPU devices, configured before anything starts JAX.

The twins are compared with XLA's fused multiply-adds off (shard_parity/mesh.py explains why);
tests that run the train CLIs in subprocesses get the same settings from the CLI's defaults.
"""

import os

import numpy as np
import pytest

from shard_parity.mesh import configure_jax

configure_jax(8)  # must run before the first JAX computation in this process

import jax  # noqa: E402  (after configure_jax, on purpose)
from flax import nnx  # noqa: E402

from shard_parity import config as cfg  # noqa: E402
from shard_parity.mesh import make_mesh  # noqa: E402
from shard_parity.models import MLP  # noqa: E402
from shard_parity.step import create_state, make_optimizer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='session')
def mesh8():
    assert jax.device_count() == 8, 'conftest asks for 8 CPU devices before JAX starts'
    return make_mesh(8)


@pytest.fixture(scope='session')
def mnist_batches():
    """Real MNIST batches of 64 when the data is there, else the test says how to get it."""
    import datasets
    from datasets import batches, mnist

    train_images, train_labels = mnist.load(datasets.data_root())['train']
    return batches.ClassificationBatches(train_images, train_labels, 64, seed=0)


def fresh_state(seed=0, config=cfg.TrainConfig()):
    """(graphdef, tx, TrainState) of a newly initialised MLP: host-side numpy copies, so that a
    twin's donated step can never delete the arrays another twin or the reference still uses."""
    tx = make_optimizer(config)
    graphdef, state = create_state(MLP(cfg.MLPConfig(), rngs=nnx.Rngs(seed)), tx)
    return graphdef, tx, jax.tree.map(np.array, state)
