"""Claim: `--target` compiles every twin's train step for a TPU slice on this CPU-only machine
(libtpu's compiler, from shapes alone) and the report reads the TPU's program, which differs
from the CPU's: FSDP's gradients reduce-scattered and its weights gathered in bf16, some of them
asynchronously; dp's gradients one all-reduce; per-device memory falling under fsdp, against the
chip's HBM; the JSON and HTML name the target. Without libtpu (`pip install -e ".[tpu]"`) the
compiles skip, and --target says in one line what to install. One MLP compile is in the fast
tier; the rest are slow. (How the TPU's text is read: test_inspector_parsing.py.)"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from parity_tests.helpers import REPO, plan_of
from shard_parity.inspector import html
from shard_parity.inspector import target as targets
from shard_parity.mesh import make_mesh
from shard_parity.placement import mesh_axes
from shard_parity import config as cfg

needs_libtpu = pytest.mark.skipif(
    not targets.libtpu_installed(),
    reason='libtpu is not installed: pip install -e ".[tpu]" (CI installs it)',
)
# the MLP's parameters: 784x512 + 512 + 512x512 + 512 + 512x10 + 10, f32
MLP_GRADIENT_BYTES = (784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10) * 4


def report(strategy, target='tpu-v5e-8', model='mlp', batch_size=None, **fields):
    from shard_parity.inspector.twins import inspect

    devices = targets.devices(target)
    mesh = make_mesh(shape=(len(devices), 1), axes=mesh_axes(strategy), devices=devices)
    config = cfg.TRAIN_DEFAULTS[model]
    config = dataclasses.replace(config, batch_size=batch_size or config.batch_size)
    plan = plan_of(mesh, strategy)
    r = inspect(model, config, mesh, plan, cfg.TransformerConfig(**fields), target=target)
    return json.loads(json.dumps(r))


def kinds(ops, *, dtype=None):
    return sorted(
        (op['kind'], op['bytes']) for op in ops if dtype is None or dtype in op['dtypes']
    )


@needs_libtpu
def test_fsdp_on_a_tpu_reduce_scatters_gradients_and_gathers_weights_in_bf16():
    r = report('fsdp')
    assert (r['target'], r['device_kind'], r['hardware']) == ('tpu-v5e-8', 'TPU v5 lite', 'tpu-v5e-8')
    shards = (784 * 512 + 512 * 512) * 4 // 8  # each device's eighth of the two big weights
    for twin in ('auto', 'explicit', 'typed'):
        ops = r['programs'][twin]
        scattered = sum(b for k, b in kinds(ops) if k == 'reduce-scatter')
        # the gradients leave each device as its shard (784 rows pad to 832: 104 a device)...
        assert shards <= scattered <= shards * 832 // 784 + 512 * 10 * 4, (twin, kinds(ops))
        # ...and no all-reduce carries a whole weight's gradient, as XLA:CPU's auto/typed do
        assert all(b < 512 * 512 * 4 for k, b in kinds(ops) if k == 'all-reduce'), twin
        # the 512x512 weight gathered whole, in bf16 (f32 on the CPU), started asynchronously
        (gather,) = [op for op in ops if op['kind'] == 'all-gather' and op['shapes'] == [[512, 512]]]
        assert gather['dtypes'] == ['bf16'] and gather['async'] and gather['overlaps'], twin
        # per-device memory falls under fsdp on the TPU as on the CPU: a fraction of one device's
        m, one = r['memory'][twin], r['memory']['one_device']
        assert m['arguments'] < one['arguments'] / 4 and m['peak'] < one['peak'] / 2, (m, one)
        assert m['fits'] and m['hbm'] == int(15.75 * 2**30)
    # the target compiler's own FLOPs: a device's share of the one-device step
    flops = {n: p['target_cost']['flops'] for n, p in r['predicted'].items()}
    assert flops['auto'] < flops['one_device'] / 4
    page = html.render(r)
    assert '<b id=target>tpu-v5e-8</b>' in page and 'Memory per device on tpu-v5e-8' in page


@pytest.mark.slow
@pytest.mark.pinned  # compile only: CI's newest-JAX leg runs it too
@needs_libtpu
def test_dp_on_a_tpu_is_one_all_reduce_of_the_gradients():
    r = report('dp')
    for twin in ('auto', 'explicit', 'typed'):
        ops = r['programs'][twin]
        (reduce,) = [op for op in ops if op['kind'] == 'all-reduce' and op['bytes'] > 1000]
        # the gradients, and the loss and accuracy scalars summed with them
        assert MLP_GRADIENT_BYTES <= reduce['bytes'] <= MLP_GRADIENT_BYTES + 16, kinds(ops)
        assert not [op for op in ops if op['kind'] in ('reduce-scatter', 'all-gather')], twin
        # dp keeps the weights and both Adam moments whole on every device
        assert r['memory'][twin]['arguments'] > 3 * MLP_GRADIENT_BYTES, r['memory'][twin]


@pytest.mark.slow
@needs_libtpu
def test_a_v5p_slice_has_4_devices_and_a_named_mesh_compiles_there():
    r = report('fsdp', target='tpu-v5p-8')
    assert (r['mesh'], r['device_kind']) == ('4x1', 'TPU v5')
    # every collective over the 4 devices (a permute shifting the padded rows moves among 3)
    assert max(op['group_size'] for op in r['programs']['explicit']) == 4
    assert r['memory']['explicit']['hbm'] == int(95.74 * 2**30)
    from shard_parity.inspector.twins import inspect

    devices = targets.devices('tpu-v5e-8')
    mesh = make_mesh(shape=(2, 4), axes=('data', 'fsdp'), devices=devices)
    plan = plan_of(mesh, 'composed')
    named = inspect('mlp', cfg.TRAIN_DEFAULTS['mlp'], mesh, plan, target='tpu-v5e-8')
    assert set(named['programs']) == {'one_device', 'auto', 'explicit', 'typed'}
    assert {tuple(op['axes']) for op in named['programs']['explicit']} >= {('fsdp',)}


@pytest.mark.slow
@needs_libtpu
def test_a_transformers_layers_gather_once_per_layer_on_a_tpu():
    r = report('fsdp', model='transformer', batch_size=8, num_layers=3, **TINY_SHAPE)
    for twin in ('auto', 'explicit', 'typed'):
        trips = {op['trip_count'] for op in r['programs'][twin] if op['kind'] == 'all-gather'}
        assert 3 in trips, (twin, trips)  # read from the loop's condition, not known_trip_count


TINY_SHAPE = {'embed_dim': 64, 'num_heads': 4, 'num_kv_heads': 4, 'seq_len': 32}


def run_inspector(*flags, hide_libtpu=False):
    """`python -m inspector FLAGS`; `hide_libtpu`: as on a machine without the [tpu] extra."""
    hide = "import sys; sys.modules['libtpu'] = None; " if hide_libtpu else ''
    code = f"{hide}import sys; sys.argv = ['inspector', *sys.argv[1:]]; " + (
        'from shard_parity.inspector.cli import run; run()'
    )
    return subprocess.run(
        [sys.executable, '-c', code, *flags], cwd=REPO, capture_output=True, text=True,
        timeout=240, env=dict(os.environ, PYTHONPATH=REPO),
    )  # fmt: skip


@pytest.mark.slow
def test_without_libtpu_target_says_what_to_install():
    result = run_inspector('--target=tpu-v5e-8', hide_libtpu=True)
    assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    (line,) = [ln for ln in result.stderr.splitlines() if 'libtpu' in ln]
    assert 'pip install -e ".[tpu]"' in line and '--target=tpu-v5e-8' in line


@pytest.mark.slow
@needs_libtpu
def test_cli_writes_json_and_html_naming_the_target_and_keeps_libtpu_quiet(tmp_path):
    page = tmp_path / 'r.html'
    result = run_inspector('--target=tpu-v4-8', '--json', f'--html={page}')
    assert result.returncode == 0, result.stderr[-2000:]
    r = json.loads(result.stdout)
    assert (r['target'], r['mesh'], r['device_kind']) == ('tpu-v4-8', '4x1', 'TPU v4')
    assert '<b id=target>tpu-v4-8</b>' in page.read_text()
    # libtpu's start-up warnings about the TPU it cannot find stay off the screen
    assert 'TPU_ACCELERATOR_TYPE' not in result.stderr and 'InitGoogle' not in result.stderr
    too_big = run_inspector('--target=tpu-v5p-8', '--mesh=8x1')
    assert too_big.returncode == 2 and 'Traceback' not in too_big.stderr
    assert '--num_devices=8, but the target has 4 TPU devices: use 1..4' in too_big.stderr


@pytest.mark.slow
@needs_libtpu
def test_a_program_the_chips_hbm_cannot_hold_is_named_not_fitting():
    import jax
    import jax.numpy as jnp

    from shard_parity import inspector
    from shard_parity.inspector.program import analyse, compile_all

    (device,) = targets.devices('tpu-v5e-1')
    on = jax.sharding.SingleDeviceSharding(device)
    big = jax.ShapeDtypeStruct((2**21, 1024), jnp.float32, sharding=on)  # 8 GiB in, 16 GiB out
    small = jax.ShapeDtypeStruct((2**10, 1024), jnp.float32, sharding=on)
    step = jax.jit(lambda a: (a * 2, a + 1))
    with targets.uncached():
        compiled = compile_all([('big', step.lower(big)), ('small', step.lower(small))])
    chip = targets.get('tpu-v5e-1')
    refused = analyse(compiled['big'][0], None, chip.hardware, target=chip)['memory']
    assert not refused['fits'] and 'above the 15.75G of HBM available' in refused['reason']
    assert analyse(compiled['small'][0], None, chip.hardware, target=chip)['memory']['fits']
    with pytest.raises(targets.TargetError, match='the program does not fit tpu-v5e-1: needs'):
        inspector.inspect(step, big, target='tpu-v5e-1')


@pytest.mark.slow
@needs_libtpu
def test_the_memory_benchmarks_compile_for_a_target_and_say_so():
    from benchmarks import context, memory
    from shard_parity import explicit

    small = cfg.TransformerConfig(seq_len=32, num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=64)
    rows = [{'twin': 'explicit', 'strategy': s, 'layers': 2}
            | memory.one(explicit, s, small, 'tpu-v5e-8') for s in ('dp', 'fsdp')]  # fmt: skip
    dp, fsdp = rows
    assert fsdp['arguments'] < dp['arguments'] / 4 and fsdp['compiler_peak'] < dp['compiler_peak']
    table = '\n'.join(memory.markdown(rows, 'small', small))
    assert 'compiled for tpu-v5e-8' in table and 'TPU peak' in table
    (row,) = context.context([256], [], 1, target='tpu-v5e-8')
    assert row['target'] == 'tpu-v5e-8' and row['cp explicit_peak_bytes'] > 0
    assert 'compiled for tpu-v5e-8, nothing run' in '\n'.join(context.markdown([row]))
