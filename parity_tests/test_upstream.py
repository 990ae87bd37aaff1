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

RECORDED = {  # jax version -> {script: reproduced} (tools/upstream/README.md's table)
    '0.10.2': {
        'explicit_reshape_size1_axis': True,  # A: a size-1 'model' moved off the head
        'explicit_microbatch_rows_size1_axis': True,  # B: a size-1 row axis onto microbatches
        'explicit_vmap_scan_mesh_lost': False,  # C: jax 0.12's zeros_like without a mesh
        'explicit_gather_grad_mesh_lost': False,  # D: jax 0.12.1's gather gradient, the same
    },
    '0.12.0.1': {
        'explicit_reshape_size1_axis': True,
        'explicit_microbatch_rows_size1_axis': True,
        'explicit_vmap_scan_mesh_lost': True,
        'explicit_gather_grad_mesh_lost': False,
    },
    '0.12.1': {
        'explicit_reshape_size1_axis': True,
        'explicit_microbatch_rows_size1_axis': True,
        'explicit_vmap_scan_mesh_lost': True,
        'explicit_gather_grad_mesh_lost': True,
    },
}
SCRIPTS = sorted(RECORDED['0.10.2'])


@pytest.mark.parametrize('script', SCRIPTS)
def test_each_upstream_reproducer_behaves_as_recorded(script):
    if jax.__version__ not in RECORDED:  # a JAX this table has not seen: record it first
        pytest.skip(f'jax {jax.__version__}: not recorded in tools/upstream/README.md; run '
                    f'tools/upstream/{script}.py and add its verdict to RECORDED')  # fmt: skip
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, 'tools', 'upstream', f'{script}.py')],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith('REPRODUCED: ' if RECORDED[jax.__version__][script] else 'NOT REPRODUCED'), (
        f'jax {jax.__version__}: {last}'
    )
