"""Claim: `python -m auto.train` and `python -m explicit.train` run long on 8 emulated devices
without the CPU all-reduce deadlock, keep the metrics.jsonl contract, agree line for line, and
answer bad input with one clear line and a non-zero exit; every CLI and tool answers --help, the
tools by their old names too."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import jax
import pytest

from parity_tests.helpers import REPO, read_metrics, run_cli
from shard_parity import UsageError
from shard_parity.devices import configure_jax


@pytest.fixture(scope='module')
def long_runs(tmp_path_factory):
    """300 steps of each twin on 8 devices: long enough to have hit the deadlock."""
    out = {}
    for twin in ('auto', 'explicit'):
        workdir = tmp_path_factory.mktemp(twin)
        flags = ['--steps=300', '--cpu_devices=8', '--log_every=25', '--eval_every=100']
        result = run_cli(twin, *flags, f'--workdir={workdir}')
        assert result.returncode == 0, result.stderr[-3000:]
        out[twin] = workdir
    return out


@pytest.mark.slow
@pytest.mark.parametrize('twin', ['auto', 'explicit'])
def test_long_run_keeps_the_output_contract(twin, long_runs):
    workdir = long_runs[twin]
    lines = read_metrics(workdir)
    assert all('step' in line for line in lines)
    train = [line for line in lines if 'train_loss' in line]
    evals = [line for line in lines if 'eval_loss' in line and not line.get('final')]
    assert [line['step'] for line in train] == list(range(25, 301, 25))
    assert [line['step'] for line in evals] == [100, 200, 300]
    assert train[-1]['train_loss'] < 0.5 * train[0]['train_loss']
    final = lines[-1]
    assert final['final'] is True and final['step'] == 300 and final['examples_per_sec'] > 0
    assert final['eval_accuracy'] == evals[-1]['eval_accuracy'] > 0.9
    assert (workdir / 'confusion_matrix.txt').read_text().startswith('rows: true digit')
    assert len((workdir / 'wrong_predictions.txt').read_text().splitlines()) > 1
    assert json.loads((workdir / 'config.json').read_text())['devices'] == 8
    for name in ('config.json', 'metrics.jsonl', 'confusion_matrix.txt', 'wrong_predictions.txt'):
        path = workdir / name  # readable by the team, and whole lines
        assert path.stat().st_mode & 0o777 == 0o644 and path.read_text().endswith('\n'), name


@pytest.mark.slow
def test_twins_log_identical_losses(long_runs):
    drop = ('examples_per_sec',)
    a, e = (
        [{k: v for k, v in line.items() if k not in drop} for line in read_metrics(w)]
        for w in (long_runs['auto'], long_runs['explicit'])
    )
    assert a == e


@pytest.mark.slow
@pytest.mark.parametrize(
    'flags, message',
    [
        (['--batch_size=100'], '--batch_size=100 is not divisible by the 8 devices'),
        (['--num_devices=9'], '--num_devices=9, but this process has 8 CPU devices'),
        (['--model=resnet'], 'flag --model=resnet: value should be one of'),
        (['--steps=0'], 'flag --steps=0: 0 is not a positive integer'),
        (['--cpu_devices=0'], 'flag --cpu_devices=0: 0 is not a positive integer'),
        (['stray'], "unexpected arguments ['stray']"),
    ],
)
def test_bad_flags_get_one_clear_line(flags, message):
    result = run_cli('explicit', '--cpu_devices=8', *flags, timeout=60)
    assert result.returncode == 2  # a bad input, ours or a flag absl refuses
    assert message in result.stderr
    assert 'Traceback' not in result.stderr


@pytest.mark.slow
def test_missing_data_says_where_to_put_it(tmp_path):
    result = run_cli('auto', f'--data_dir={tmp_path}', '--nodownload', '--steps=1', timeout=60)
    assert result.returncode != 0
    assert f'{tmp_path}/mnist/train-images-idx3-ubyte.gz is missing' in result.stderr
    assert 'Traceback' not in result.stderr


@pytest.mark.slow
def test_corrupt_data_names_the_file(tmp_path):
    (tmp_path / 'mnist').mkdir()
    for name in ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'):
        (tmp_path / 'mnist' / name).write_bytes(b'\x1f\x8b\x08\x00 truncated')
    result = run_cli('auto', f'--data_dir={tmp_path}', '--nodownload', '--steps=1', timeout=60)
    assert result.returncode != 0
    assert 'train-images-idx3-ubyte.gz is not a readable gzip file' in result.stderr
    assert 'Traceback' not in result.stderr


def test_cpu_devices_after_jax_started_is_refused():
    jax.devices()  # JAX is running in this process (conftest asked for 8 devices first)
    with pytest.raises(UsageError, match='--cpu_devices=4 came too late.*8 devices'):
        configure_jax(4)


TINY = [
    '--model=transformer',
    '--seq_len=16',
    '--num_layers=1',
    '--num_heads=2',
    '--num_kv_heads=1',
    '--embed_dim=16',
    '--batch_size=16',
    '--steps=20',
    '--warmup_steps=2',
    '--log_every=5',
    '--eval_every=10',
    '--cpu_devices=8',
]


@pytest.mark.slow
@pytest.mark.parametrize('twin', ['auto', 'explicit'])
def test_transformer_cli_trains_and_saves_a_checkpoint(twin, tmp_path):
    result = run_cli(twin, *TINY, f'--workdir={tmp_path}')
    assert result.returncode == 0, result.stderr[-3000:]
    lines = read_metrics(tmp_path)
    final = lines[-1]
    assert final['final'] and final['step'] == 20 and final['tokens_per_sec'] > 0
    assert final['eval_perplexity'] == pytest.approx(2.718281828 ** final['eval_loss'])
    printed = json.loads(result.stdout.strip().splitlines()[-1])  # + what varies run to run
    assert printed == {**final, **{k: printed[k] for k in printed.keys() - final.keys()}}
    # steps 2 to 19 end in the loop, step 10's lap spans its evaluation: 17 steps timed
    assert printed['mfu'] == 'n/a on cpu' and printed['steps_timed'] == 17
    assert printed['model_tflops_per_sec'] > 0 and printed['step_s_median'] > 0
    assert lines[0]['train_loss'] > lines[-3]['train_loss']  # first vs last train line
    assert (tmp_path / 'checkpoints' / '20').is_dir()
    saved = json.loads((tmp_path / 'config.json').read_text())
    assert saved['model_config']['num_kv_heads'] == 1


@pytest.mark.slow
def test_the_transformer_defaults_run_on_8_emulated_devices(tmp_path):
    """`explicit.train --model=transformer` alone failed without an accelerator: nanoGPT's batch
    of 12 does not split over the 8 emulated CPU devices. It now trains on 6, saying so."""
    result = run_cli('explicit', '--model=transformer', '--steps=1', f'--workdir={tmp_path}')
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        'warning: the default --batch_size=12 does not split over 8 devices: training on 6'
        in result.stderr
    )
    saved = json.loads((tmp_path / 'config.json').read_text())
    assert (saved['devices'], saved['train']['batch_size']) == (6, 12)


@pytest.mark.slow
def test_each_train_cli_offers_exactly_its_twins_strategies(tmp_path):
    """typed.train --help offered --strategy=cp, which crashed with KeyError: 'cp' after writing
    config.json and an empty log. Each CLI now offers its twin's STRATEGIES and refuses the
    others at flag parsing, in one line, before anything is written."""
    import importlib

    from shard_parity.placement import STRATEGIES

    for name in ('auto', 'explicit', 'typed'):
        offered = list(importlib.import_module(f'shard_parity.{name}').STRATEGIES)
        help_text = subprocess.run(
            [sys.executable, '-m', f'{name}.train', '--help'], cwd=REPO, capture_output=True,
            text=True, check=False,
        ).stdout  # fmt: skip
        assert f'--strategy: <{"|".join(offered)}>:' in help_text, name
        for strategy in [s for s in STRATEGIES if s not in offered] + ['nosuch']:
            workdir = tmp_path / f'{name}_{strategy}'
            result = run_cli(name, f'--strategy={strategy}', f'--workdir={workdir}')
            assert result.returncode == 2 and not workdir.exists(), result.stderr[-2000:]
            first = result.stderr.strip().splitlines()[0]
            assert first.startswith('error: flag ') and first.endswith(
                f'flag --strategy={strategy}: value should be one of <{"|".join(offered)}> '
                '(--help lists the flags)'
            ), result.stderr


@pytest.mark.slow
def test_settings_that_change_nothing_warn_once(tmp_path):
    flags = ['--model=mlp', '--num_layers=2', '--seq_len=8', '--strategy=tp', '--steps=2']
    result = run_cli('explicit', *flags, '--cpu_devices=8', f'--workdir={tmp_path}', timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    for message in (
        "--strategy=tp on a mesh whose 'model' axis is 1 splits nothing over it: it runs as dp",
        '--seq_len, --num_layers only shape the transformer: --model=mlp ignores them',
    ):
        assert len([line for line in lines if message in line]) == 1, result.stderr[-2000:]
        assert any(line.startswith(f'warning: {message}') for line in lines)  # not absl's format


@pytest.mark.slow
@pytest.mark.parametrize(
    'module, own',
    [
        ('auto.train', 'min(100, steps // 10)'),
        ('explicit.train', '--checkpoint_every'),
        ('typed.train', '--[no]save_initial'),
        ('auto.generate', '--[no]kv_cache'),
        ('explicit.generate', '--max_new_bytes'),
        ('inspector', '--strategy'),
        ('tools.bisect', '--num_layers'),  # the train CLI's flags it reads, too
        ('benchmarks.run', '--sections'),
    ],
)
def test_help_lists_each_clis_own_flags(module, own):
    result = subprocess.run(
        [sys.executable, '-m', module, '--help'],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert own in result.stdout and 'Try --helpfull' in result.stdout
    assert '--xla_' not in result.stdout  # only its own flags: --helpfull has the rest


TOOLS = {  # each tool's command: its old name, and a flag of its own that its --help lists
    'tools.compare': ('parity_tests.compare', '--max_loss_gap'),
    'tools.launch': ('parity_tests.launch', '--grace_seconds'),
    'tools.bisect': ('parity_tests.bisect', '--twins'),
    'tools.margins': ('parity_tests.margins', '--margins'),  # pytest's --help, with the suite's
    'inspector': ('parity_tests.collectives', '--hardware'),
}


def test_each_old_tool_name_runs_the_new_one():
    """The tools moved out of parity_tests/ (issue 31); their old modules stay, as aliases."""
    for new, (old, _) in TOOLS.items():
        alias = pathlib.Path(REPO, *old.split('.')).with_suffix('.py').read_text()
        assert f"runpy.run_module('shard_parity.{new}', run_name='__main__'" in alias, old
        assert f'`python -m {new}`' in alias.split('\n')[0], old  # its docstring says so
        assert importlib.util.find_spec(f'shard_parity.{new}') is not None, new


@pytest.mark.slow
@pytest.mark.parametrize('module', [*TOOLS, *(old for old, _ in TOOLS.values())])
def test_each_tool_answers_help_by_its_name_and_its_old_one(module):
    new = next(new for new, (old, _) in TOOLS.items() if module in (new, old))
    result = subprocess.run(
        [sys.executable, '-m', module, '--help'], cwd=REPO, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert TOOLS[new][1] in result.stdout, result.stdout[-2000:]


def test_fused_attention_under_a_ring_says_it_is_ignored(caplog):
    """explicit/cp.py runs its own ring attention: --attention=fused changes nothing there (auto/
    cp.py lets XLA split the model's own attention, fused included: no warning)."""
    import dataclasses

    from parity_tests.helpers import TINY_TRANSFORMER, plan_of
    from shard_parity import auto, explicit, typed
    from shard_parity.mesh import make_mesh
    from shard_parity.placement import mesh_axes
    from shard_parity.runtime.training import warn_unused_attention

    fused = dataclasses.replace(TINY_TRANSFORMER, attention='fused')
    plan = plan_of(make_mesh(shape=(2, 4), axes=mesh_axes('cp')), 'cp')
    with caplog.at_level('WARNING'):
        warn_unused_attention(auto, plan, fused)
        assert 'is ignored' not in caplog.text
        warn_unused_attention(explicit, plan, fused)
    assert "--attention=fused is ignored: this twin's cp.py runs its own ring" in caplog.text
    caplog.clear()
    with caplog.at_level('WARNING'):
        warn_unused_attention(typed, plan, fused)  # typed's ring too
    assert 'is ignored' in caplog.text


@pytest.mark.parametrize(
    'text, options, saved',
    [
        ('data:2,seq:4', {'layout': 'contiguous'}, {'cp_layout': 'contiguous'}),
        ('data:2,stage:4', {'microbatches': 2}, {'microbatches': 2}),
        ('data:2,seq:2,stage:2', {'layout': 'contiguous', 'microbatches': 2},
         {'cp_layout': 'contiguous', 'microbatches': 2}),
        ('data:8', {'layout': 'contiguous', 'microbatches': 2}, {}),
    ],
)  # fmt: skip
def test_the_loop_gives_each_step_the_plan_config_json_records(text, options, saved):
    """--cp_layout and --microbatches are the plan's: config.json records each only where an
    axis takes it ('seq', 'stage'), reads back the same plan, and the loop hands the plan whole
    to the file the plan chooses, for its train and eval steps."""
    import types

    from shard_parity import plan as plans
    from shard_parity.runtime.loop import Loop

    plan = plans.parse(text, None, 8, **options)
    recorded = plan.to_config()
    assert {k: recorded[k] for k in ('cp_layout', 'microbatches') if k in recorded} == saved
    assert plans.from_config(recorded) == plan.canonical()
    if not saved:  # options no axis takes change nothing: the same step
        assert plan != plans.parse(text, None, 8) and plan.canonical() == plans.parse(text, None, 8)
    seen = []
    parallel = types.SimpleNamespace(
        train_step=lambda *args: seen.append(('train', args[-1])),
        eval_step=lambda *args: seen.append(('eval', args[-1])),
    )
    twin = types.SimpleNamespace(NAME='twin', STRATEGIES={plan.strategy: parallel})
    task = types.SimpleNamespace(loss_fn=None, eval_fn=None)
    Loop(twin, plan, task, None, None, None, None, None, None, recorded)
    assert seen == [('train', plan), ('eval', plan)]
