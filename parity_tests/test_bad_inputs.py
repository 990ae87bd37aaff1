"""Claim: every bad input and fault in the table of docs/errors.md ends with one clear line and a
non-zero exit, leaves earlier good files intact, and prints the message the table shows.

ROWS is the table (parity_tests/errors_table.py): (what goes wrong, the message fragment the
user sees, the test that shows it). The rows run here are CLI invocations (CLI_ROWS: each row's
command); the others point at the test file that owns them.
"""

import dataclasses
import errno
import importlib
import json
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from parity_tests.errors_table import ROWS
from parity_tests.helpers import REPO, TINY_TRANSFORMER, make_case, plan_of, run_cli
from shard_parity import UsageError, auto
from shard_parity.mesh import make_mesh
from shard_parity.runtime import checkpoint, tasks
from shard_parity.runtime.training import Outputs, run

TINY = ['--model=transformer', '--batch_size=16', '--cpu_devices=8']
PP = ['--strategy=pp', '--num_layers=4']
CLI_ROWS = {  # row -> (module, flags); {tmp} is a fresh folder
    'unknown flag': ('auto.train', ['--nosuchflag']),
    'zero or negative size': ('explicit.train', ['--batch_size=-8']),
    '--num_kv_heads not dividing --num_heads': ('auto.train', [*TINY, '--num_kv_heads=3']),
    '--embed_dim not divisible by --num_heads': ('auto.train', [*TINY, '--embed_dim=30']),
    'unknown --remat_policy': ('typed.train', [*TINY, '--remat_policy=some']),
    '--remat_policy with the MLP': ('explicit.train', ['--remat_policy=dots', '--cpu_devices=8']),
    '--seq_len beyond the text': ('explicit.train', [*TINY, '--seq_len=200000']),
    'warm-up as long as the schedule': ('auto.train', [*TINY, '--steps=50', '--warmup_steps=100']),
    'unwritable workdir': ('auto.train', ['--steps=1', f'--workdir={REPO}/setup.cfg/run']),
    'generating from an MLP checkpoint': ('auto.generate', ['--workdir={mlp}']),
    '--top_k outside 1..256': ('explicit.generate', ['--workdir={mlp}', '--top_k=0']),
    'unknown benchmark section': ('benchmarks.run', ['--sections=foo']),
    'incomplete multi-process settings': ('explicit.train', ['--num_processes=2']),
    'malformed --mesh': ('auto.train', ['--mesh=4by2']),
    '--mesh and --num_devices disagree': ('auto.train', ['--mesh=4x2', '--num_devices=4']),
    'heads not divisible by the model axis (tp)': (
        'explicit.train',
        [*TINY, '--strategy=tp', '--mesh=1x8'],
    ),
    '--seq_len not divisible by the sequence axis (cp)': (
        'explicit.train',
        [*TINY, '--strategy=cp', '--mesh=2x4', '--seq_len=30'],
    ),
    '--seq_len not divisible by 2 x the sequence axis (cp, zigzag layout)': (
        'typed.train',
        [*TINY, '--strategy=cp', '--mesh=2x4', '--seq_len=36'],
    ),
    '--strategy=cp with the MLP': (
        'auto.train',
        ['--strategy=cp', '--mesh=2x4', '--cpu_devices=8'],
    ),
    '--experts_per_token above --num_experts': (
        'auto.train',
        [*TINY, '--num_experts=4', '--experts_per_token=5'],
    ),
    '--num_experts not divisible by the expert axis (ep)': (
        'explicit.train',
        [*TINY, '--strategy=ep', '--mesh=2x4', '--num_experts=6'],
    ),
    '--capacity_factor of 0 or below with experts on': (
        'explicit.train',
        [*TINY, '--num_experts=4', '--capacity_factor=0'],
    ),
    '--num_experts under a strategy other than dp or ep': (
        'auto.train',
        [*TINY, '--strategy=pp', '--mesh=2x4', '--num_layers=4', '--num_experts=4'],
    ),
    '--num_layers not divisible by the stage axis (pp)': (
        'explicit.train',
        [*TINY, '--strategy=pp', '--mesh=2x4', '--num_layers=6'],
    ),
    '--batch_size not divisible into the microbatches (pp)': (
        'typed.train',
        [*TINY, '--strategy=pp', '--mesh=2x4', '--num_layers=4', '--batch_size=12'],
    ),
    '--strategy=pp with the MLP': (
        'auto.train',
        ['--strategy=pp', '--mesh=2x4', '--cpu_devices=8'],
    ),
    '--learning_rate nan or inf': ('explicit.train', ['--learning_rate=nan']),
    '--batch_size beyond the training split': ('auto.train', ['--batch_size=100000']),
    '--data_dir naming a file': ('auto.train', [f'--data_dir={REPO}/setup.cfg']),
    'inspector: --program not MODULE:FUNCTION': ('inspector', ['--program=mymod']),
    'inspector: --program module not importable': (
        'inspector',
        ['--program=nosuchmodule:build'],
    ),
    'inspector: unknown --hardware': ('inspector', ['--hardware=a100']),
    '--seed beyond 2**31 - 1': ('explicit.generate', ['--seed=99999999999999999999']),
    'a coordinator address nobody answers': (
        'auto.train',
        ['--coordinator_address=127.0.0.1:1', '--num_processes=2', '--process_id=1']
        + ['--heartbeat_timeout=2'],
    ),
    '--mesh with non-ASCII digits': ('auto.train', ['--mesh=²x1']),
    '--temperature nan or inf': ('auto.generate', ['--workdir={mlp}', '--temperature=nan']),
    'a named mesh whose sizes do not multiply to the device count': (
        'auto.train',
        ['--mesh=data:2,fsdp:2', '--cpu_devices=8'],
    ),
    'a named mesh with an unknown axis (the inspector)': (
        'inspector',
        ['--mesh=data:2,tensor:4', '--cpu_devices=8'],
    ),
    'a named mesh with an axis given twice (bisect: exit 2)': (
        'tools.bisect',
        ['--mesh=data:2,data:4', '--cpu_devices=8'],
    ),
    "heads not divisible by a named mesh's model axis": (
        'explicit.train',
        [*TINY, '--mesh=data:2,fsdp:2,model:2', '--num_heads=3', '--embed_dim=48'],
    ),
    "KV heads not divisible by a named mesh's model axis": (
        'typed.train',
        [*TINY, '--mesh=data:2,fsdp:2,model:2', '--num_kv_heads=1'],
    ),
    "layers not divisible by a named mesh's stage axis": (
        'auto.train',
        [*TINY, '--mesh=fsdp:2,model:2,stage:2', '--num_layers=3'],
    ),
    "experts not divisible by a named mesh's expert axis": (
        'explicit.train',
        [*TINY, '--mesh=data:2,expert:2,model:2', '--num_experts=3'],
    ),
    "the sequence not divisible by a named mesh's seq axis": (
        'typed.train',
        [*TINY, '--mesh=data:2,seq:2,model:2', '--seq_len=31'],
    ),
    "the batch not divisible by a named mesh's row axes": (
        'auto.train',
        [*TINY, '--mesh=data:2,fsdp:2,model:2', '--batch_size=6'],
    ),
    'the batch not splitting into the microbatches on a named mesh': (
        'explicit.train',
        [*TINY, '--mesh=data:2,fsdp:2,stage:2', '--num_layers=4', '--batch_size=8']
        + ['--microbatches=4'],
    ),
    'benchmarks: a --mesh that names no axes': (
        'benchmarks.run',
        ['--sections=strategies', '--mesh=4x2'],
    ),
    'inspector: unknown --target': ('inspector', ['--target=tpu-v9-8']),
    'inspector: --target with --hardware (a target is priced on its own hardware)': (
        'inspector',
        ['--target=tpu-v5e-8', '--hardware=h100x8'],
    ),
    'inspector: --target with --cpu_devices (a target compiles for its own devices)': (
        'inspector',
        ['--target=tpu-v5e-8', '--cpu_devices=4'],
    ),
    "inspector: --target=h200x8 before a GPU's target config is captured": (
        'inspector',
        ['--target=h200x8'],
    ),
    'inspector: --hosts not dividing the devices': (
        'inspector',
        ['--mesh=data:4,model:2', '--hosts=3', '--cpu_devices=8'],
    ),
    'inspector: a mesh whose inner axes do not fit in a host (--hosts)': (
        'inspector',
        ['--mesh=data:3,model:2', '--hosts=2', '--batch_size=12', '--cpu_devices=6'],
    ),
    '--pp_virtual without --pp_schedule=interleaved': (
        'explicit.train',
        [*TINY, *PP, '--mesh=4x2', '--pp_schedule=1f1b', '--pp_virtual=2'],
    ),
    'layers not divisible by the stage axis x --pp_virtual': (
        'explicit.train',
        [*TINY, *PP, '--mesh=4x2', '--pp_schedule=interleaved', '--pp_virtual=4'],
    ),
    'fewer microbatches than stages under 1f1b': (
        'explicit.train',
        [*TINY, *PP, '--mesh=2x4', '--pp_schedule=1f1b', '--microbatches=2'],
    ),
    'interleaved microbatches not a multiple of the stage axis': (
        'explicit.train',
        [*TINY, *PP, '--mesh=4x2', '--pp_schedule=interleaved', '--microbatches=3']
        + ['--batch_size=24'],
    ),
    '--pp_schedule other than gpipe on a mesh without a stage axis': (
        'explicit.train',
        [*TINY, '--strategy=dp', '--pp_schedule=1f1b'],
    ),
    '--pp_virtual=1 under --pp_schedule=interleaved': (
        'explicit.train',
        [*TINY, *PP, '--mesh=4x2', '--pp_schedule=interleaved', '--pp_virtual=1'],
    ),
    '--reduce_dtype=bfloat16 where nothing is reduced': (
        'explicit.train',
        [*TINY, '--num_layers=2', '--mesh=stage:2,model:4', '--reduce_dtype=bfloat16'],
    ),
    '--reduce_dtype=bfloat16 in auto or typed': (
        'typed.train', [*TINY, '--mesh=data:8', '--reduce_dtype=bfloat16']
    ),
    '--shard_optimizer_over_data without a data axis of 2 or more': (
        'explicit.train', ['--cpu_devices=8', '--mesh=fsdp:8', '--shard_optimizer_over_data']
    ),
    'layers not divisible by the stage axis x --pp_virtual on a named mesh': (
        'explicit.train',
        [*TINY, '--num_layers=6', '--mesh=fsdp:2,model:2,stage:2', '--pp_schedule=interleaved'],
    ),
    'interleaved microbatches not a multiple of the stage axis on a named mesh': (
        'explicit.train',
        [*TINY, '--num_layers=4', '--mesh=data:2,seq:2,stage:2', '--pp_schedule=interleaved',
         '--microbatches=3', '--batch_size=12'],
    ),  # fmt: skip
}
# The exit status of a bad input: 2 in every CLI here (a flag absl refuses too: runtime's
# parse_flags), as docs/errors.md says; 1 is a fault met while running.
BAD_INPUT = 2


def message(row):
    return next(m for what, m, _ in ROWS if what == row)


def test_every_row_has_a_test_and_is_in_the_docs():
    text = open(REPO + '/docs/errors.md').read()
    table = text[text.index('## Every bad input answered') :]
    assert len(ROWS) >= 20
    for what, msg, test in ROWS:
        cell = msg.replace('|', '\\|')  # Markdown tables escape the pipe
        assert f'`{cell}`' in table, f'docs/errors.md lacks the message of {what!r}: {msg}'
        module, name = test.split('.')
        assert hasattr(importlib.import_module(f'parity_tests.{module}'), name), test
    run_here = {what for what, _, test in ROWS if test == 'test_bad_inputs.test_cli_row'}
    assert run_here == set(CLI_ROWS)  # each row test_cli_row owns has its command, and no more


@pytest.fixture(scope='module')
def mlp_workdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp('mlp')
    result = run_cli('auto', '--steps=2', '--cpu_devices=8', f'--workdir={workdir}')
    assert result.returncode == 0, result.stderr[-2000:]
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize('row', CLI_ROWS)
def test_cli_row(row, mlp_workdir):
    module, flags = CLI_ROWS[row]
    flags = [f.format(mlp=mlp_workdir) for f in flags]
    result = subprocess.run(
        [sys.executable, '-m', module, *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == BAD_INPUT, result.stderr[-1500:]
    assert message(row) in result.stderr, result.stderr[-1500:]
    assert 'Traceback' not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len([line for line in lines if message(row) in line]) == 1


@pytest.mark.slow  # trains and saves: 17 s
def test_disk_full_while_saving_keeps_the_earlier_checkpoints(mesh8, tmp_path, monkeypatch):
    case = make_case('transformer')
    config = dataclasses.replace(case.config, steps=10, eval_every=5, batch_size=16)
    task = tasks.shakespeare_task(config, TINY_TRANSFORMER)
    real_save = checkpoint.ocp.CheckpointManager.save

    def save(self, step, *args, **kwargs):
        if step == 10:
            raise OSError(errno.ENOSPC, 'No space left on device')
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint.ocp.CheckpointManager, 'save', save)
    with pytest.raises(UsageError, match=re.escape(message('disk full while saving'))):
        run(auto, plan_of(mesh8, 'dp'), task, config, tmp_path, Outputs(checkpoint_every=5))
    monkeypatch.undo()
    _, _, state = checkpoint.restore(tmp_path, make_mesh(1))
    assert int(state.step) == 5
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(state.params))
    assert sorted(p.name for p in (tmp_path / 'checkpoints').iterdir()) == ['5']


@pytest.mark.slow
def test_the_mesh_is_checked_before_the_warm_up():
    """A short --steps with a bad pp setting names the pp setting, not the warm-up (issue 31:
    the warm-up check ran first and hid it). The check can fail: the warm-up alone is refused."""
    short = ['--steps=50', '--warmup_steps=100']
    both = run_cli('explicit', *TINY, '--strategy=pp', '--mesh=2x4', '--num_layers=6', *short)
    assert both.returncode == BAD_INPUT, both.stderr[-1500:]
    assert "--num_layers=6 is not divisible by the mesh's stage axis (4)" in both.stderr
    assert 'warmup_steps' not in both.stderr
    warm_up = run_cli('explicit', *TINY, '--strategy=pp', '--mesh=2x4', '--num_layers=4', *short)
    assert warm_up.returncode == BAD_INPUT and '--warmup_steps=100 must be below' in warm_up.stderr


# Hostile --mesh values: syntax (separators, sizes, names), sizes that do not multiply to the
# devices, and axes the model cannot split (the tiny transformer: 1 layer, 2 heads, dense)
HOSTILE_MESHES = [
    'data:2;model:4', 'data:2x4', 'data:', ':8', 'data:0', 'data:-8', 'data:+8', 'data:2,,model:4',
    'data:8,', ',data:8', 'data:8:1', 'data:²', 'data:٨', 'data:2.0,model:4', 'data:1e1',
    'tensor:8', 'data:2,data:4', 'data:3', 'data:16', 'data:99999999999999999999',
    'data:2,fsdp:2', 'expert:8', 'stage:8', 'model:8', '0x8', '4x2x1', 'x', ' ',
    'data:2,model:4,fsdp', 'data:8 model:1',
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize('twin', ['auto', 'explicit', 'typed'])
def test_hostile_meshes_are_refused_in_one_line_by_every_twin(twin, tmp_path):
    """Each hostile --mesh, in each twin's train CLI (typed builds an Explicit mesh, auto an
    Auto one): exit 2, one line, no traceback, nothing trained. They were tried on explicit
    only. One command per mesh, all in one process (parity_tests/refusals.py); a good mesh
    first shows that the driver sees a run that is not refused."""
    common = [*TINY, '--seq_len=16', '--num_layers=1', '--num_heads=2', '--embed_dim=16']
    common += ['--steps=1', f'--workdir={tmp_path}']
    command = [sys.executable, '-m', 'parity_tests.refusals', twin]
    for mesh in ['data:2,fsdp:2,model:2', *HOSTILE_MESHES]:
        command += ['--', *common, f'--mesh={mesh}']
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    good, *results = [json.loads(line) for line in done.stdout.splitlines()]
    assert good['status'] == 0 and '"final": true' in good['stdout'], good  # it trained
    assert len(results) == len(HOSTILE_MESHES)
    for mesh, r in zip(HOSTILE_MESHES, results, strict=True):
        lines = [line for line in r['stderr'].splitlines() if line.strip()]
        assert r['status'] == BAD_INPUT, (mesh, r)
        assert len(lines) == 1 and lines[0].startswith('error: '), (mesh, lines)
        assert r['stdout'] == '', (mesh, r['stdout'])
