"""Claim: the bisector names where two twins first disagree: the step, the phase, the first
layer that differs and the hint, for each mistake of the bug zoo (tools/zoo/); and it
finds nothing where the twins agree. It takes named meshes end to end: a composed mesh against
one device, by flags and as two train runs on different meshes."""

import dataclasses
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

from parity_tests.helpers import (
    CLI_MODELS,
    REPO,
    fresh_state,
    make_case,
    plan_of,
    read_metrics,
    run_cli,
    strategy_mesh,
)
from shard_parity import UsageError, auto, exit_status, explicit
from shard_parity import plan as plans
from shard_parity.mesh import make_mesh, mesh_for
from shard_parity.placement import mesh_axes, place_batch, place_state
from shard_parity.step import make_optimizer, one_device_loss_and_grads, one_device_train_step
from shard_parity.tools.bisect import divergence as D
from shard_parity.tools.bisect import leaves, runs

DATA_HINT = "the 'data' axis size: in B a sum where a mean belongs"
FSDP_HINT = "the 'fsdp' axis size: in B a sum where a mean belongs"
ZOO = {  # module: (strategy, mesh, reference, phase, layer, ratio, hint fragment)
    'dp_psum': ('dp', (8, 1), 'explicit', 'gradients', None, 8.0, DATA_HINT),
    'no_pcast': ('dp', (8, 1), 'explicit', 'gradients', None, 8.0, DATA_HINT),
    'scatter_no_div': ('fsdp', (8, 1), 'one_device', 'gradients', None, 8.0, FSDP_HINT),
    'replicated_batch': ('dp', (8, 1), 'auto', 'forward', 'layers.0', None, 'B has 8x the rows'),
    'dropout_key': (
        'dp',
        (8, 1),
        'tools.zoo.dropout',
        'forward',
        'layers.0',
        None,
        'only the rows of devices [1, 2, 3, 4, 5, 6, 7] differ',
    ),
}


def run(a, b, strategy, shape, model='mlp', steps=1):
    case = make_case(model)
    graphdef, tx, state = fresh_state(0, case)
    mesh = strategy_mesh(strategy, shape)
    sides = [D.load_side(name, plan_of(mesh, strategy), mesh) for name in (a, b)]
    return D.bisect(*sides, graphdef, case.loss_fn, tx, state, case.batches, steps)


@pytest.mark.slow
def test_the_zoo_names_the_expert_layer_of_all_to_alls_over_the_wrong_axis():
    """ep_swapped_axes (explicit/ep.py with its all_to_alls over 'data', on a 2x2 mesh): the
    first output to part is the first block's mixture-of-experts feed-forward, at step 0."""
    moe = dataclasses.replace(
        make_case('transformer').model_config, num_experts=4, experts_per_token=2
    )
    case = make_case('transformer', moe)
    graphdef, tx, state = fresh_state(0, case)
    mesh = make_mesh(shape=(2, 2), axes=mesh_axes('ep'))
    sides = [D.load_side(n, plan_of(mesh, 'ep'), mesh) for n in ('explicit', 'tools.zoo.ep_swapped_axes')]
    report = D.bisect(*sides, graphdef, case.loss_fn, tx, state, case.batches, 1)
    assert (report.step, report.phase, report.layer) == (0, 'forward', 'blocks.0.ffn')


def test_agreeing_twins_pass_and_a_bug_does_not():
    report = run('auto', 'explicit', 'dp', (8, 1), steps=2)
    assert not report.diverged and report.steps == 2
    assert report.compared == {'forward': 4, 'gradients': 6, 'update': 40}


@pytest.mark.parametrize('bug', ZOO)
def test_the_zoo(bug):
    strategy, shape, reference, phase, layer, ratio, hint = ZOO[bug]
    report = run(reference, f'tools.zoo.{bug}', strategy, shape)
    assert (report.step, report.phase, report.layer) == (0, phase, layer)
    assert report.ratio == pytest.approx(ratio, rel=1e-4) if ratio else report.ratio is None
    assert any(hint in h for h in report.hints), report.hints


def test_tp_pmean_names_the_attention_and_the_model_axis():
    report = run('auto', 'tools.zoo.tp_pmean', 'tp', (4, 2), model='transformer')
    assert (report.step, report.phase, report.layer) == (0, 'forward', 'blocks.0.attn')
    assert report.ratio == pytest.approx(0.5, rel=1e-4)
    assert "B is the other / 2, the 'model' axis size" in report.hints[0]


BROKEN = """from shard_parity.explicit.dp import loss_and_grads, train_step  # noqa: F401
import jax


def eval_step(graphdef, eval_fn, mesh):
    return jax.jit(lambda params, batch: jax.lax.psum(params, 'no_such_axis'))
"""


def test_a_side_that_fails_to_trace_is_named_with_its_line(tmp_path, monkeypatch):
    """A user module that fails to trace used to be a traceback and exit 1, the code of "they
    diverge"; it is now SideFailed (exit 3), naming the side, the file and the line."""
    (tmp_path / 'my_broken_dp.py').write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(D.SideFailed) as e:
        run('explicit', 'my_broken_dp', 'dp', (8, 1))
    assert str(e.value).startswith('B (my_broken_dp) fails to trace at '), e.value
    assert 'my_broken_dp.py:6: NameError: ' in str(e.value), e.value


@pytest.mark.slow
def test_cli_checks_its_input_as_the_train_cli_does_and_exits_2_or_3(tmp_path):
    """What the train CLI refuses was a JAX traceback and exit 1 ("they diverge")."""
    import os
    import subprocess
    import sys

    (tmp_path / 'my_broken_dp.py').write_text(BROKEN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, str(tmp_path)]))
    tiny = ['--model=transformer', '--seq_len=16', '--embed_dim=24', '--batch_size=8']
    cases = {
        ('--strategy=cp', '--mesh=2x4'): (2, '--strategy=cp splits sequences'),
        (*tiny, '--num_heads=3', '--strategy=tp', '--mesh=4x2'): (2, '--num_heads=3 is not'),
        (*tiny, '--seq_len=30', '--strategy=cp', '--mesh=2x4'): (2, '--seq_len=30 is not'),
        ('--twins=explicit,my_broken_dp',): (3, 'B (my_broken_dp) fails to trace at '),
        ('--model=mlp', '--twins=auto,explicit', '--reduce_dtype=bfloat16'): (2, (
            '--twins=auto,explicit: --reduce_dtype=bfloat16 in the auto twin: its partitioner '
            'reduces each gradient where it is formed, before any line of the twin can cast it; '
            'bisect --twins=one_device,explicit')),
    }
    for flags, (code, message) in cases.items():
        result = subprocess.run(
            [sys.executable, '-m', 'tools.bisect', '--cpu_devices=8', *flags],
            cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        lines = result.stderr.strip().splitlines()
        assert result.returncode == code and lines[-1].startswith('error: '), result.stderr[-2000:]
        assert message in lines[-1] and 'Traceback' not in result.stderr


def test_the_zoo_answers_to_its_old_name_too(mesh8):
    """--twins=explicit,parity_tests.zoo.no_pcast, the spelling from before the tools moved to
    tools/ (issue 31), names the same module."""
    names = ('parity_tests.zoo.no_pcast', 'tools.zoo.no_pcast')
    old, new = (D.load_side(name, plan_of(mesh8, 'dp'), mesh8) for name in names)
    assert old.module is new.module and old.name == 'parity_tests.zoo.no_pcast'


def test_a_copy_of_a_typed_file_runs_on_an_explicit_mesh(tmp_path, monkeypatch, mesh8):
    """A copy of typed/dp.py in a package of yours without AXIS_TYPE ran on an Auto mesh and
    failed to trace (reshard's "axis names that are of type Auto"): a module that calls reshard
    runs on an Explicit mesh, and a module's own AXIS_TYPE says which."""
    from jax.sharding import AxisType

    (tmp_path / 'mypkg').mkdir()
    (tmp_path / 'mypkg' / '__init__.py').write_text('')
    source = (pathlib.Path(REPO) / 'typed' / 'dp.py').read_text()
    (tmp_path / 'mypkg' / 'my_typed_dp.py').write_text(source)
    own = source + '\nfrom jax.sharding import AxisType\nAXIS_TYPE = AxisType.Auto\n'
    (tmp_path / 'mypkg' / 'my_auto_dp.py').write_text(own)
    monkeypatch.syspath_prepend(str(tmp_path))
    kinds = {name: set(D.load_side(name, plan_of(mesh8, 'dp'), mesh8).mesh.axis_types)
             for name in ('mypkg.my_typed_dp', 'mypkg.my_auto_dp', 'explicit')}  # fmt: skip
    assert kinds == {'mypkg.my_typed_dp': {AxisType.Explicit}, 'mypkg.my_auto_dp': {AxisType.Auto},
                     'explicit': {AxisType.Auto}}  # fmt: skip


def test_bad_twins_get_one_line(mesh8):
    with pytest.raises(UsageError, match="cannot import 'nosuch.module'"):
        D.load_side('nosuch.module', plan_of(mesh8, 'dp'), mesh8)
    with pytest.raises(UsageError, match=r'parity_tests.helpers has no loss_and_grads\(\)'):
        D.load_side('parity_tests.helpers', plan_of(mesh8, 'dp'), mesh8)


@pytest.mark.slow
def test_cli_reports_the_zoo_and_exits_1():
    import subprocess
    import sys

    flags = ['--model=mlp', '--steps=2', '--cpu_devices=8', '--json']
    result = subprocess.run(
        [
            sys.executable,
            '-m',
            'tools.bisect',
            *flags,
            '--twins=explicit,tools.zoo.no_pcast',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert (report['step'], report['phase'], report['ratio']) == (0, 'gradients', 8.0)


def fake_run(root, embed_dim=16, loss=2.0, **saved):
    """A workdir as the train CLI leaves it, without checkpoints."""
    root.mkdir()
    config = {
        'model': 'transformer',
        'model_config': {'embed_dim': embed_dim},
        'train': {'steps': 4, 'learning_rate': 1e-3},
        **saved,
    }
    (root / 'config.json').write_text(json.dumps(config))
    lines = [{'step': 1, 'train_loss': 2.5}, {'step': 2, 'train_loss': loss}]
    (root / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in lines))
    return str(root)


def test_run_directories_of_other_settings_or_without_checkpoints_are_refused(tmp_path):
    """Runs of other settings are a refused input (exit 2); runs that differ with no checkpoint
    to replay them from are an answer, they disagree (exit 1: docs/errors.md's codes)."""
    a = fake_run(tmp_path / 'a')
    with pytest.raises(UsageError, match='other settings: --embed_dim: A 16, B 32') as refused:
        runs.bisect_runs(a, fake_run(tmp_path / 'b', embed_dim=32), 'f32', None, None)
    assert exit_status(refused.value) == 2
    assert runs.bisect_runs(a, fake_run(tmp_path / 'c'), 'f32', None, None).step is None
    with pytest.raises(UsageError, match='share no checkpoint before it') as differ:
        runs.bisect_runs(a, fake_run(tmp_path / 'd', loss=2.1), 'f32', None, None)
    assert exit_status(differ.value) == 1


def test_runs_of_other_settings_are_told_what_to_run_instead(tmp_path):
    """The refusal of runs of other settings named no way forward (compare's names
    --allow_other_settings): it gives compare's command and the bisect command of their twins."""
    where = {'twin': 'auto', 'strategy': 'dp', 'mesh': {'data': 8, 'model': 1}}
    a = fake_run(tmp_path / 'a', **where)
    bf16 = {'embed_dim': 16, 'dtype': 'bfloat16'}
    b = fake_run(tmp_path / 'b', **{**where, 'twin': 'explicit', 'model_config': bf16})
    with pytest.raises(UsageError) as refused:
        runs.bisect_runs(a, b, 'f32', None, None)
    line = str(refused.value)
    assert '\n' not in line and 'other settings: --dtype: A float32, B bfloat16' in line
    assert f'python -m tools.compare {a} {b} --allow_other_settings' in line
    assert line.endswith("under B's settings: python -m tools.bisect --twins=auto,explicit "
                         '--model=transformer --mesh=data:8,model:1 --dtype=bfloat16'), line


def test_bitwise_identical_runs_are_said_to_be(tmp_path):
    """Two runs with the same numbers read 'agrees within bf16 round-off'."""
    from shard_parity.tools.bisect import report

    bf16 = {'model_config': {'embed_dim': 16, 'dtype': 'bfloat16'}}
    a, b = fake_run(tmp_path / 'a', **bf16), fake_run(tmp_path / 'b', **bf16)
    said = report.render(runs.bisect_runs(a, b, None, None, None))
    assert said == f'A={a} and B={b}: every figure both logged is bitwise identical.' + report.LOGS
    assert said.splitlines()[1].startswith('It could not see (no step replayed')  # what it did not
    c = fake_run(tmp_path / 'c', loss=2.0 + 1e-4, **bf16)  # within the band, not the same
    said = report.render(runs.bisect_runs(a, c, None, None, None))
    assert 'bitwise identical' not in said and 'agrees within bf16 round-off' in said, said


def test_run_directories_given_twice_or_garbled_are_one_line(tmp_path, capsys):
    """One run given twice used to be compared with itself; a garbled metrics or config line
    was a JSONDecodeError traceback."""
    a = fake_run(tmp_path / 'a')
    for twice in (a, f'{a}/', f'{tmp_path}/a/../a'):
        with pytest.raises(UsageError, match='are the same directory: give two different runs'):
            runs.bisect_runs(a, twice, 'f32', None, None)
    b = fake_run(tmp_path / 'b')
    log = tmp_path / 'b' / 'metrics.jsonl'
    log.write_text(log.read_text() + '{"step": 3, "train_lo\n\x00garbage\n{"step": 1e400}\n')
    assert runs.bisect_runs(a, b, 'f32', None, None).step is None  # the good lines agree
    assert capsys.readouterr().err == f'warning: skipped 3 torn or garbled line(s) of {log}\n'
    (tmp_path / 'b' / 'config.json').write_text('{"model": "transformer", "mod')
    with pytest.raises(UsageError, match='config.json is not a readable config.json'):
        runs.bisect_runs(a, b, 'f32', None, None)


def with_optimizer(state, tx):
    """`state`'s params (fresh copies), with `tx`'s initial optimizer state."""
    params = jax.tree.map(np.array, state.params)
    return state._replace(params=params, opt_state=tx.init(params))


def test_the_logged_gradient_norm_is_the_one_device_norm(mesh8):
    """--log_grad_norm: every twin's step reports the global norm of its reduced gradient, the
    one-device run's to round-off, so two runs' logs can be told apart by it; off, it is absent."""
    case = make_case('mlp')
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    _, grads = one_device_loss_and_grads(graphdef, case.loss_fn)(state.params, batch)
    want = float(optax.tree.norm(grads))
    tx = make_optimizer(dataclasses.replace(case.config, log_grad_norm=True))
    _, metrics = one_device_train_step(graphdef, case.loss_fn, tx)(with_optimizer(state, tx), batch)
    np.testing.assert_allclose(float(metrics['grad_norm']), want, rtol=1e-6)
    for twin, strategy in ((auto, 'fsdp'), (explicit, 'fsdp'), (explicit, 'dp')):
        mesh = strategy_mesh(strategy)
        step = twin.STRATEGIES[strategy].train_step(graphdef, case.loss_fn, tx, mesh, plan_of(mesh, strategy))
        placed = place_state(with_optimizer(state, tx), mesh, plan_of(mesh, strategy))
        _, m = step(placed, place_batch(batch, mesh, plan_of(mesh, strategy)))
        np.testing.assert_allclose(float(m['grad_norm']), want, rtol=1e-5)
    plain = make_optimizer(case.config)
    _, m = one_device_train_step(graphdef, case.loss_fn, plain)(with_optimizer(state, plain), batch)
    assert 'grad_norm' not in m and not np.isclose(want, 0)


def tool(*args, timeout=300):
    return subprocess.run([sys.executable, '-m', *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow  # the composed step compiled, then a CLI run: 10 s
def test_a_named_mesh_against_one_device_agrees_and_its_planted_mistake_is_named():
    """On data:2,fsdp:2,model:2, explicit/composed.py agrees with one device step after step.
    By the CLI, on data:2,fsdp:4, composed_no_data (no mean over 'data') parts from one device
    at step 0's gradients by 2x, 'data''s size: the hint names 'data', not 'fsdp' (4) nor both
    (8); the sum over both where a mean belongs would be 'data' x 'fsdp'."""
    case = make_case('transformer')
    graphdef, tx, state = fresh_state(0, case)
    mesh = mesh_for(plans.parse('data:2,fsdp:2,model:2', None, 8))
    sides = [D.load_side(name, plan_of(mesh, 'composed'), mesh) for name in ('one_device', 'explicit')]
    report = D.bisect(*sides, graphdef, case.loss_fn, tx, state, case.batches, 2)
    assert not report.diverged and report.steps == 2, report
    assert report.compared['gradients'] == len(jax.tree.leaves(state.params))
    assert report.compared['forward'] >= 4  # the layers' outputs were compared, not skipped

    shape = [f for f in CLI_MODELS['transformer'] if 'batch_size' not in f]
    flags = [*shape, '--batch_size=16', '--steps=1', '--cpu_devices=8', '--mesh=data:2,fsdp:4']
    result = tool('tools.bisect', *flags, '--twins=one_device,tools.zoo.composed_no_data')
    assert result.returncode == 1, result.stderr[-2000:]
    out = result.stdout
    assert 'diverge at step 0, phase gradients' in out and 'B/A = 2 everywhere' in out, out
    assert "B is 2x the other, the 'data' axis size: in B a sum where a mean belongs" in out
    assert "'fsdp'" not in out.split('hint:', 1)[1], out


def test_a_ratio_of_several_axes_is_named_by_their_product():
    """A gradient summed over 'data' and 'fsdp' on data:2,fsdp:2,model:2 is 4x: the hint names
    the two axes together; 2x names each (the bisector cannot tell them apart by the ratio)."""
    mesh = mesh_for(plans.parse('data:2,fsdp:2,model:2', None, 8))
    plan = plan_of(mesh, 'composed')
    a, b = D.Side('one_device', None, None, plan), D.Side('x', None, mesh, plan)
    four, two = (leaves.Leaf('w', 1.0, 1.0, ratio=r) for r in (4.0, 2.0))
    assert leaves.hints(four, a, b)[0].startswith(
        "B is 4x the other, the size of 'data' x 'fsdp': in B a sum where a mean belongs"
    )
    assert len(leaves.hints(four, a, b)) == 1
    named = [h.split(':')[0] for h in leaves.hints(two, a, b)]
    assert named == [
        "B is 2x the other, the 'data' axis size",
        "B is 2x the other, the 'fsdp' axis size",
        "A is the other / 2, the 'model' axis size",
    ]


@pytest.mark.slow  # two train runs, a compare, a bisect and a generate: 20 s
def test_runs_on_a_composed_mesh_and_on_one_device_compare_bisect_and_generate(tmp_path):
    """Two train runs on different named meshes, data:2,fsdp:2,model:2 and one device: compare
    names each run's mesh; the bisector restores each run's shared checkpoint onto its own mesh
    and replays both from there; generate reads the composed run's checkpoint."""
    composed, single = tmp_path / 'composed', tmp_path / 'single'
    flags = [*CLI_MODELS['transformer'], '--log_every=1', '--eval_every=2', '--save_initial']
    flags += ['--checkpoint_every=2', '--steps=4']
    for workdir, where in ((composed, ['--mesh=data:2,fsdp:2,model:2', '--cpu_devices=8']),
                           (single, ['--cpu_devices=1'])):  # fmt: skip
        result = run_cli('explicit', *flags, *where, f'--workdir={workdir}')
        assert result.returncode == 0, result.stderr[-2000:]

    compared = tool('tools.compare', composed, single)
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert compared.stdout.splitlines()[:2] == [
        f'A {composed}: explicit composed on data:2,fsdp:2,model:2',
        f'B {single}: explicit dp on data:1,model:1',
    ]

    lines = read_metrics(single)  # a difference planted at step 3: the replay starts at step 2
    for line in lines:
        if line['step'] == 3 and 'train_loss' in line:
            line['train_loss'] += 0.01
    (single / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in lines))
    bisected = tool('tools.bisect', composed, single, '--cpu_devices=8')
    assert bisected.returncode == 0, bisected.stderr[-2000:]
    verdict, limits = bisected.stdout.splitlines()  # every verdict says what it could not see
    assert verdict == (
        f'A={composed} (explicit composed data:2,fsdp:2,model:2) and '
        f'B={single} (explicit dp data:1,model:1) agree for 1 steps (f32).'
    )
    assert limits.startswith('It could not see (the detection limit, a relative change of one leaf')

    generated = run_cli('explicit', f'--workdir={composed}', '--max_new_bytes=8',
                        '--temperature=0', program='generate')  # fmt: skip
    assert generated.returncode == 0 and len(generated.stdout) >= 8, generated.stderr[-2000:]
