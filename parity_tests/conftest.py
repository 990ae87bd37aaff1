"""Every test process runs on 8 emulated CPU devices, configured before anything starts JAX.

The twins are compared with XLA's fused multiply-adds off (shard_parity/mesh.py explains why);
tests that run the train CLIs in subprocesses get the same settings from the CLI's defaults.
Shared helpers live in parity_tests/helpers.py; this file holds only the fixtures.
"""

import jax
import pytest

from parity_tests.helpers import make_case
from shard_parity.mesh import configure_jax, make_mesh

# Importing JAX does not start its backend; the first computation does. None has run yet.
configure_jax(8)


@pytest.fixture(scope='session')
def mesh8():
    assert jax.device_count() == 8, 'conftest asks for 8 CPU devices before JAX starts'
    return make_mesh(8)


@pytest.fixture(scope='session', params=['mlp', 'transformer'])
def case(request):
    return make_case(request.param)


@pytest.fixture(scope='session')
def mnist_batches():
    return make_case('mlp').batches
