"""The JAX behaviours this project works around (tools/upstream/, issue 43, item 7: a minimal
reproducer for each fuzzer find that was JAX's, beside the upstream search and the work-round
in the twins) still behave as recorded on this JAX: a script that stops reproducing means the
work-round may go, and its README row is stale."""

import os
import subprocess
import sys

import jax
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAX_0_11 = tuple(int(p) for p in jax.__version__.split('.')[:2]) >= (0, 11)

SCRIPTS = {  # script: reproduced on this jax (tools/upstream/README.md's table)
    'explicit_reshape_size1_axis': True,  # A: a size-1 'model' moved off the head
    'explicit_microbatch_rows_size1_axis': True,  # B: a size-1 row axis onto the microbatches
    'explicit_vmap_scan_mesh_lost': JAX_0_11,  # C: jax 0.12's zeros_like without a mesh
}


@pytest.mark.parametrize('script', sorted(SCRIPTS))
def test_each_upstream_reproducer_behaves_as_recorded(script):
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, 'tools', 'upstream', f'{script}.py')],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith('REPRODUCED: ' if SCRIPTS[script] else 'NOT REPRODUCED'), (
        f'jax {jax.__version__}: {last}'
    )
