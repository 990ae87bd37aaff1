"""Claim: a strategy is a name for a mesh, and every CLI takes named meshes. --strategy=fsdp_tp
--mesh=4x2 is --mesh=fsdp:4,model:2: the same plan, the same compiled step, the same 20 losses
bit for bit and the same config.json. A run saved before named meshes (fsdp's axis then called
'data' in its config.json and its checkpoints) still compares, bisects, generates and resumes.
The inspector takes a named mesh as the strategy it names. With several processes, each loads
one contiguous block of the batch's rows, under (data, fsdp) rows too."""

import json
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from parity_tests.helpers import (
    CLI_MODELS,
    REPO,
    fresh_state,
    inspect_collectives,
    make_case,
    plan_of,
    read_metrics,
    run_cli,
)
from shard_parity import UsageError, explicit, typed
from shard_parity import plan as plans
from shard_parity.mesh import local_rows, mesh_for
from shard_parity.placement import place_batch, place_state, rows
from shard_parity.runtime.integrity import CHECKSUMS, write_checksums

# --strategy=S --mesh=AxB -> the named mesh it is (shard_parity/plan.py's STRATEGY_AXES)
NAMES = {
    ('fsdp_tp', '4x2'): 'fsdp:4,model:2',
    ('tp', '4x2'): 'data:4,model:2',
    ('cp', '2x4'): 'data:2,seq:4',
    ('pp', '2x4'): 'data:2,stage:4',
    ('ep', '2x4'): 'data:2,expert:4',
}


@pytest.mark.parametrize('strategy, axb', NAMES, ids=[s for s, _ in NAMES])
def test_a_strategy_and_its_axb_mesh_are_a_named_mesh(strategy, axb):
    named = NAMES[strategy, axb]
    experts = strategy == 'ep'
    plan = plans.parse(axb, strategy, 8, experts)
    assert plan != plans.parse('4x2', 'dp', 8)  # plans can differ
    assert plan == plans.parse(named, None, 8, experts)
    assert plan.text() == named and plan.strategy == strategy


def compiled_text(twin, mesh_text, strategy=None):
    """The compiled train step's HLO text of the MLP, as the train CLI builds it, less the
    source locations it records (the stack that called this function among them)."""
    plan = plans.parse(mesh_text, strategy, 8)
    mesh = mesh_for(plan, twin.AXIS_TYPE)
    case = make_case('mlp')
    graphdef, tx, state = fresh_state(case=case)
    step = twin.STRATEGIES[plan.strategy].train_step(graphdef, case.loss_fn, tx, mesh, plan)
    batch = place_batch(case.batches.batch(0), mesh, plan)
    text = step.lower(place_state(state, mesh, plan), batch).compile().as_text()
    text = re.sub(r'(?ms)^(FileNames|FunctionNames|FileLocations|StackFrames)$.*?^$', '', text)
    return re.sub(r', metadata=\{[^}]*\}', '', text)


@pytest.mark.parametrize('twin', [explicit, typed], ids=['explicit', 'typed'])
def test_fsdp_tp_on_4x2_compiles_what_fsdp4_model2_compiles(twin):
    legacy = compiled_text(twin, '4x2', 'fsdp_tp')
    assert legacy != compiled_text(twin, '4x2', 'tp')  # another mesh: another program
    assert legacy == compiled_text(twin, 'fsdp:4,model:2')


@pytest.mark.slow  # two 20-step runs of the train CLI: 25 s
def test_the_cli_runs_fsdp_tp_on_4x2_as_fsdp4_model2(tmp_path):
    """The same 20 losses bit for bit, and the same config.json (its mesh {"fsdp": 4, ...})."""
    flags = [*CLI_MODELS['mlp'], '--steps=20', '--log_every=1', '--eval_every=10']
    runs = {'legacy': ['--strategy=fsdp_tp', '--mesh=4x2'], 'named': ['--mesh=fsdp:4,model:2']}
    for name, mesh in runs.items():
        result = run_cli('explicit', *flags, *mesh, f'--workdir={tmp_path / name}')
        assert result.returncode == 0, result.stderr[-2000:]
    figures = lambda n: [(m['step'], m.get('train_loss'), m.get('eval_loss'))  # noqa: E731
                         for m in read_metrics(tmp_path / n)]  # fmt: skip
    assert len(figures('named')) >= 22 and figures('legacy') == figures('named')
    saved = [json.loads((tmp_path / n / 'config.json').read_text()) for n in runs]
    assert saved[0] == saved[1]
    assert saved[0]['strategy'] == 'fsdp_tp' and saved[0]['mesh'] == {'fsdp': 4, 'model': 2}


@pytest.mark.slow  # the inspector's four compiles, twice: 8 s
def test_the_inspector_takes_a_named_mesh_as_the_strategy_it_names():
    """`python -m inspector --mesh=fsdp:4,model:2` reports what --strategy=fsdp_tp --mesh=4x2
    reports (the twins' collectives, their bytes and lines), and another mesh another report."""
    run = lambda *mesh: command('inspector', '--json', '--cpu_devices=8', *mesh)  # noqa: E731
    named, legacy = run('--mesh=fsdp:4,model:2'), run('--strategy=fsdp_tp', '--mesh=4x2')
    assert named.returncode == legacy.returncode == 0, named.stderr[-2000:] + legacy.stderr[-2000:]
    assert json.loads(named.stdout) == json.loads(legacy.stdout)
    assert json.loads(named.stdout) == inspect_collectives('mlp', 'fsdp_tp', (4, 2))
    assert json.loads(named.stdout) != inspect_collectives('mlp', 'tp', (4, 2))


def as_saved_before_named_meshes(workdir):
    """Rewrites a --strategy=fsdp --mesh=8x1 run as the release before named meshes wrote it:
    fsdp's axis called 'data' in config.json, in each checkpoint's config and in the shardings
    Orbax recorded (each checkpoint's checksums written again, as they were at its save); and,
    as it did not yet, without segments in the configs or the averaging window beside them."""
    old = {'data': 8, 'model': 1}

    def as_then(saved):
        return {**{k: v for k, v in saved.items() if k != 'segments'}, 'mesh': old}

    saved = json.loads((workdir / 'config.json').read_text())
    assert saved['strategy'] == 'fsdp' and saved['mesh'] == {'fsdp': 8, 'model': 1}
    (workdir / 'config.json').write_text(json.dumps(as_then(saved), indent=2))
    for step in (workdir / 'checkpoints').iterdir():
        config = step / 'config' / 'metadata'
        config.write_text(json.dumps(as_then(json.loads(config.read_text()))))
        shutil.rmtree(step / 'window', ignore_errors=True)  # (step 0 keeps none)
        sharding = step / 'state' / '_sharding'
        sharding.write_text(sharding.read_text().replace('\\"fsdp\\"', '\\"data\\"'))
        (step / CHECKSUMS).unlink()
        write_checksums(step)
    assert '"fsdp"' not in (workdir / 'checkpoints' / '2' / 'state' / '_sharding').read_text()


def command(*args, timeout=240):
    return subprocess.run([sys.executable, '-m', *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow  # four train runs, a bisect, a generate: about 30 s
@pytest.mark.exhaustive  # the suite's time (2026-12-05)
def test_a_run_saved_before_named_meshes_compares_bisects_generates_and_resumes(tmp_path):
    old, new = tmp_path / 'old', tmp_path / 'new'
    flags = [*CLI_MODELS['transformer'], '--log_every=1', '--eval_every=2', '--save_initial']
    flags += ['--checkpoint_every=2', '--steps=4', '--cpu_devices=8']
    for workdir, mesh in ((old, ['--strategy=fsdp', '--mesh=8x1']),
                          (new, ['--mesh=data:2,fsdp:2,model:2'])):  # fmt: skip
        result = run_cli('explicit', *flags, *mesh, f'--workdir={workdir}')
        assert result.returncode == 0, result.stderr[-2000:]
    as_saved_before_named_meshes(old)

    compared = command('tools.compare', old, new)  # two runs on two meshes are comparable
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert f'A {old}: explicit fsdp on fsdp:8,model:1' in compared.stdout
    assert f'B {new}: explicit composed on data:2,fsdp:2,model:2' in compared.stdout

    # The bisector replays from the shared checkpoint before the first logged difference: one
    # is planted at step 3, so it restores step 2 of each run onto each run's own mesh.
    lines = read_metrics(new)
    for line in lines:
        if line['step'] == 3 and 'train_loss' in line:
            line['train_loss'] += 0.01
    (new / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in lines))
    bisected = command('tools.bisect', old, new, '--cpu_devices=8')
    assert bisected.returncode == 0, bisected.stderr[-2000:]
    assert '(explicit fsdp fsdp:8,model:1)' in bisected.stdout, bisected.stdout
    assert 'agree for 1 steps' in bisected.stdout

    generated = run_cli('explicit', f'--workdir={old}', '--max_new_bytes=8', '--temperature=0',
                        program='generate')  # fmt: skip
    assert generated.returncode == 0 and len(generated.stdout) >= 8, generated.stderr[-2000:]

    resumed = tmp_path / 'resumed'
    shutil.copytree(old, resumed)
    for workdir, mesh in ((old, ['--strategy=fsdp', '--mesh=8x1']),  # the command it ran
                          (resumed, ['--mesh=data:2,fsdp:4'])):  # or another mesh  # fmt: skip
        more = [f for f in flags if f != '--steps=4'] + ['--steps=6']
        result = run_cli('explicit', *more, *mesh, f'--workdir={workdir}')
        assert result.returncode == 0, result.stderr[-2000:]
        assert 'resuming from' in result.stderr and read_metrics(workdir)[-1]['step'] == 6
    assert json.loads((old / 'config.json').read_text())['mesh'] == {'fsdp': 8, 'model': 1}
    # its history: the old config is one segment, the same plan under today's name for it
    segments = [json.loads((w / 'config.json').read_text())['segments'] for w in (old, resumed)]
    assert [[s['from_step'] for s in seg] for seg in segments] == [[0], [0, 4]]


MESHES = ['data:8', 'data:2,fsdp:2,model:2', 'fsdp:2,data:2,model:2', 'data:2,model:2,fsdp:2',
          'model:2,data:2,fsdp:2', 'data:2,expert:2,model:2', 'data:2,seq:2,model:2']  # fmt: skip


@pytest.mark.parametrize('text', MESHES)
@pytest.mark.parametrize('processes', [2, 4])
def test_each_process_loads_one_contiguous_block_of_rows(text, processes):
    """Each process (its devices, consecutive as jax.devices() lists them) loads one block of
    the rows, and together the blocks are exactly what each device holds."""
    mesh = mesh_for(plans.parse(text, 'composed', 8))
    layout, batch = rows(plan_of(mesh)), 32
    held = jax.sharding.NamedSharding(mesh, layout).devices_indices_map((batch,))
    per = 8 // processes
    for p in range(processes):
        mine = jax.devices()[p * per : (p + 1) * per]
        block = local_rows(mesh, batch, layout, mine)
        wanted = set().union(*(set(range(batch)[held[d][0]]) for d in mine))
        assert set(range(batch)[block]) == wanted, (p, block, sorted(wanted))


def test_a_process_whose_rows_are_not_one_block_is_refused():
    mesh = mesh_for(plans.parse('data:8', None, 8))
    every_other = jax.devices()[::2]  # rows 0-3, 8-11, ...: a process can load only one block
    with pytest.raises(UsageError, match='not one block'):
        local_rows(mesh, 32, rows(plan_of(mesh)), every_other)
    assert local_rows(mesh, 32, rows(plan_of(mesh)), jax.devices()[:4]) == slice(0, 16)


def test_the_rows_are_split_as_the_row_axes_say():
    """rows() names the row axes in mesh order: a device's block is its mixed-radix index."""
    mesh = mesh_for(plans.parse('data:2,fsdp:2,model:2', None, 8))
    assert rows(plan_of(mesh)) == jax.sharding.PartitionSpec(('data', 'fsdp'))
    x = np.arange(8)
    placed = jax.device_put(x, jax.sharding.NamedSharding(mesh, rows(plan_of(mesh))))
    for shard in placed.addressable_shards:
        d, f, _ = (int(i) for i in np.argwhere(mesh.devices == shard.device)[0])
        np.testing.assert_array_equal(
            np.asarray(shard.data), x[2 * (2 * d + f) : 2 * (2 * d + f) + 2]
        )


REFUSED = {  # (--mesh, --strategy, options) -> the fragment of the one line that refuses it
    'a semicolon': (('data:2;model:4', None, {}), "--mesh=data:2;model:4: 'data:2;model:4' "
                    'is not name:size; expected name:size pairs separated by commas'),
    'AxB inside a name': (('data:2x4', None, {}), "'data:2x4' is not name:size; expected"),
    'composed without a mesh': ((None, 'composed', {}), 'and no --mesh was given'),
    'experts on a dense model': (('expert:8', None, {}), 'the expert axis of --mesh=expert:8 '
                                 'splits the experts of a mixture-of-experts transformer'),
    'a schedule without stages': ((None, 'dp', {'schedule': '1f1b'}), '--pp_schedule=1f1b '
                                  'orders the microbatches of a pipeline, and --strategy=dp has '
                                  'no stage axis'),
}  # fmt: skip


@pytest.mark.parametrize('given, fragment', REFUSED.values(), ids=REFUSED)
def test_a_mesh_is_refused_naming_what_the_user_gave(given, fragment):
    """Each refusal names the flags as given (never `--mesh=None`, nor a --strategy the user
    did not give), and a malformed --mesh the syntax it expects."""
    from shard_parity import checks
    from shard_parity.config import TransformerConfig

    text, strategy, options = given
    with pytest.raises(UsageError) as e:
        checks.check(plans.parse(text, strategy, 8, **options), TransformerConfig(), 16)
    assert fragment in str(e.value), e.value
    assert 'None' not in str(e.value)


def test_one_number_is_that_many_devices_on_the_first_axis_and_no_flag_is_named_unasked():
    """--mesh=8 was refused for dp where 8x1 ran; on one device the precision's refusal named
    --strategy=dp, which the user never typed."""
    from shard_parity import checks

    for strategy in ('dp', 'fsdp', 'tp'):
        assert plans.parse('8', strategy, 8) == plans.parse('8x1', strategy, 8)
    with pytest.raises(UsageError, match=r'--mesh=8x: expected .* \(or one, 8: 8x1\)'):
        plans.parse('8x', 'dp', 8)
    one = plans.parse(None, None, 1, precision=plans.Precision(reduce='bfloat16'))
    with pytest.raises(UsageError) as e:
        checks.check_precision(one)
    assert str(e.value).startswith('--reduce_dtype=bfloat16 on one device: nothing is reduced')


def test_a_mesh_is_read_in_any_order_any_case_with_spaces():
    """The order of the axes is kept (it lays the devices out); case and spaces are not."""
    assert plans.parse(' Data:2 , FSDP:4', None, 8) == plans.parse('data:2,fsdp:4', None, 8)
    assert plans.parse('fsdp:4,data:2', None, 8).names == ('fsdp', 'data')
    assert plans.parse('fsdp:4,data:2', None, 8) != plans.parse('data:2,fsdp:4', None, 8)
