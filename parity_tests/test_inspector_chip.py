"""The inspector on a TPU host (issue 53, item 5): there it compiles for the chip it runs on and
prices it on that chip's cost model with its memory, as `--target` does elsewhere
(inspector/target.py's here()); and the compiler's predictions pinned: the one-device step and
the twins' one-device programs compiled from shapes here for `--target=tpu-v5e-1`, against the
figures recorded in benchmarks/results/tpu/inspector_chip.json (record_inspector.py): those of the
same compile from shapes, and, once benchmarks/results/tpu/inspector.sh has run on a chip, those
the inspector printed on the chip itself. A libtpu that moves any of them fails the slow test,
naming the figure."""

import dataclasses
import importlib.metadata
import json
import pathlib
import subprocess
import sys

import jax
import pytest

from parity_tests.helpers import REPO, plan_of
from shard_parity import config as cfg
from shard_parity.devices import libtpu_installed
from shard_parity.inspector import measured
from shard_parity.inspector import target as targets
from shard_parity.mesh import make_mesh

RECORD = pathlib.Path(REPO) / 'benchmarks/results/tpu/inspector_chip.json'


def test_off_a_tpu_there_is_no_chip_here():
    assert jax.devices()[0].platform == 'cpu' and targets.here() is None


def test_a_chip_here_is_compiled_for_priced_and_held_against_its_memory():
    """The plumbing of a TPU host's default, on the CPU: a Target marked `here` takes this
    process's own devices (no topology, no compile-only devices), prices the programs on its
    cost model (tpu-v5e-8's entry, not the h100x8 default) and reports each program's memory,
    saying it was compiled on the host."""
    from shard_parity.inspector.twins import inspect

    chip = dataclasses.replace(targets.TARGETS['tpu-v5e-1'], here=True)
    devices = targets.devices(chip)
    assert devices == tuple(jax.devices())
    mesh = make_mesh(shape=(1, 1), axes=('data', 'model'), devices=devices[:1])
    config = dataclasses.replace(cfg.TRAIN_DEFAULTS['mlp'], batch_size=8)
    r = inspect('mlp', config, mesh, plan_of(mesh, 'dp'), target=chip)
    assert r['hardware'] == 'tpu-v5e-8' and r['target'] == 'tpu-v5e-1' and r['target_here']
    assert set(r['memory']) == {'one_device', 'auto', 'explicit', 'typed'}
    assert all(m['arguments'] > 0 and m['hbm'] == chip.hbm_bytes for m in r['memory'].values())
    from shard_parity.inspector.render import compiled_for

    assert compiled_for(r) == 'compiled on this TPU v5 lite host (tpu-v5e-1)'
    figures = measured.figures(r)
    assert figures['one_device']['collectives'] == [] and 'measured' not in figures['one_device']
    moved = {'one_device': dict(figures['one_device'], temp=figures['one_device']['temp'] + 1)}
    assert measured.disagreements(moved, {'one_device': figures['one_device']}) == [
        f"one_device temp: {figures['one_device']['temp'] + 1} on the chip, "
        f"{figures['one_device']['temp']} from shapes"
    ]


def test_measure_memory_is_refused_off_a_chip_and_beside_a_target():
    for flags, says in (
        ([], "--measure_memory reads the device's memory_stats(), which cpu devices do not keep"),
        (['--target=tpu-v5e-1'], '--measure_memory runs the one-device train step on this '
         'machine; --target=tpu-v5e-1 does not: drop one of them'),
    ):  # fmt: skip
        result = subprocess.run(
            [sys.executable, '-m', 'inspector', '--model=mlp', '--measure_memory', *flags],
            cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith(f'error: {says}')


def recorded():
    return json.loads(RECORD.read_text())


# the 6-layer step compiles from shapes in minutes (44 on a loaded 2-core VM): the opt-in tier
HEAVY = {'six_layers_bf16'}
CONFIGS = [
    pytest.param(c, marks=[pytest.mark.exhaustive] if c in HEAVY else [])
    for c in json.loads(RECORD.read_text())['configs']
]


@pytest.mark.slow
@pytest.mark.skipif(not libtpu_installed(), reason='libtpu is not installed: pip install .[tpu]')
@pytest.mark.parametrize('config', CONFIGS)
def test_from_shapes_the_compiler_predicts_the_chips_own_compile(config):
    """Compiled here for tpu-v5e-1 from shapes, every program's argument, output, aliased, temp
    and peak bytes and its collectives are the recorded prediction's (with the libtpu named in
    the record), and, where the chip's own compile is recorded, the chip's but for the
    differences the record lists (`expected_disagreements`, explained in docs/inspector.md)."""
    record = recorded()
    entry = record['configs'][config]
    result = subprocess.run(
        [sys.executable, '-m', 'inspector', *entry['flags'].split(), '--strategy=dp',
         '--target=tpu-v5e-1', '--json'],
        cwd=REPO, capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    shapes = measured.figures(json.loads(result.stdout))
    moved = measured.disagreements(entry['shapes'], shapes)  # 'on the chip': the recorded side
    assert not moved, (
        f"recorded from shapes with libtpu {record['machine']['shapes']['libtpu']}, now "
        f"{importlib.metadata.version('libtpu')}: {moved}; re-record (record_inspector.py)"
    )
    if entry['chip'] is None:  # inspector.sh has not run on a chip yet (docs/inspector.md)
        return
    chip = {n: {k: v for k, v in p.items() if k != 'measured'} for n, p in entry['chip'].items()}
    assert measured.disagreements(chip, shapes) == entry['expected_disagreements']
